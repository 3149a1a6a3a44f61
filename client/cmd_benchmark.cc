// `dequantctl benchmark` (see commands.h).
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/commands.h"
#include "client/table.h"

namespace dequantd {
namespace {

// "a, b" -> {"a", "b"} (each entry's spaces trimmed); "" -> {} (the flag's default). An empty entry
// ("a,,b", ",", " ") is INVALID_ARGUMENT naming `flag`: it would otherwise leave the list empty
// and the server would run its default instead of what was asked for.
absl::StatusOr<std::vector<std::string>> SplitList(const std::string& text, const char* flag) {
  std::vector<std::string> items;
  if (text.empty()) return items;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    item = absl::StripAsciiWhitespace(item);
    if (item.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " \"", text, "\" has an empty entry (a list is comma-separated)"));
    }
    items.emplace_back(item);
  }
  return items;
}

// "KxN" with positive integers.
absl::StatusOr<v1::BenchmarkShape> ParseShape(const std::string& text) {
  const std::vector<std::string> parts = absl::StrSplit(text, 'x');
  int64_t K = 0, N = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &K) || !absl::SimpleAtoi(parts[1], &N) ||
      K <= 0 || N <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shapes: expected KxN with positive integers, got '", text, "'"));
  }
  v1::BenchmarkShape shape;
  shape.set_in_features(K);
  shape.set_out_features(N);
  return shape;
}

std::string Micros(double seconds) { return Fixed(seconds * 1e6, 1); }

}  // namespace

absl::StatusOr<v1::BenchmarkRequest> MakeBenchmarkRequest(const BenchmarkOptions& options) {
  v1::BenchmarkRequest request;
  absl::StatusOr<std::vector<std::string>> shapes = SplitList(options.shapes, "--shapes");
  absl::StatusOr<std::vector<std::string>> tensors = SplitList(options.tensors, "--tensors");
  absl::StatusOr<std::vector<std::string>> variants = SplitList(options.variants, "--variants");
  absl::StatusOr<std::vector<std::string>> dtypes = SplitList(options.dtype, "--dtype");
  for (const auto* list : {&shapes, &tensors, &variants, &dtypes}) {
    if (!list->ok()) return list->status();
  }
  for (const std::string& s : *shapes) {
    absl::StatusOr<v1::BenchmarkShape> shape = ParseShape(s);
    if (!shape.ok()) return shape.status();
    *request.add_shapes() = *shape;
  }
  for (const std::string& t : *tensors) request.add_tensors(t);
  for (const std::string& v : *variants) request.add_variants(v);
  for (const std::string& d : *dtypes) {
    absl::StatusOr<v1::DType> dtype = ParseOutputDType(d);
    if (!dtype.ok()) return dtype.status();
    request.add_output_dtypes(*dtype);
  }
  if (options.group_size < 0 || options.trials < 0 || options.runs < 0) {
    return absl::InvalidArgumentError("--group-size, --trials and --runs must be >= 0");
  }
  request.set_group_size(options.group_size);
  request.set_trials(options.trials);
  request.set_runs(options.runs);
  request.set_hardware_counters(options.hardware_counters);
  return request;
}

absl::Status RunBenchmark(DequantClient& client, const v1::BenchmarkRequest& request,
                          std::ostream& out) {
  absl::StatusOr<v1::BenchmarkResponse> response = client.Benchmark(request);
  if (!response.ok()) return response.status();
  out << "device: " << response->device() << ", peak copy "
      << Fixed(response->peak_copy_bytes_per_second() / 1e9, 1) << " GB/s (read + written)\n";
  Table table({"variant", "format", "K", "N", "G", "dtype", "MB moved", "median us", "mean us",
               "std us", "min us", "max us", "graph us", "GB/s", "% peak", "graph % peak",
               "correct", "launch", "counters"},
              {false, false, true, true, true, false, true, true, true, true, true, true, true,
               true, true, true, false, false, false});
  for (const v1::BenchmarkRow& r : response->rows()) {
    std::vector<std::string> counters;
    for (const auto& [name, value] : r.counters())
      counters.push_back(absl::StrCat(name, "=", value));
    // The timed layer's format ("-" from a server that predates BenchmarkRow.format), with its
    // expert count when it stacks several matrices (K and N are one matrix's).
    const std::string format =
        r.format().empty()
            ? "-"
            : absl::StrCat(r.format(),
                           r.experts() > 1 ? absl::StrCat(" E=", r.experts()) : std::string());
    table.AddRow(
        {r.variant(), format, absl::StrCat(r.in_features()), absl::StrCat(r.out_features()),
         absl::StrCat(r.group_size()), OutputDTypeName(r.output_dtype()),
         Fixed(static_cast<double>(r.bytes_moved()) / 1e6, 2),
         Micros(r.median_seconds()) + (r.divergent() ? "*" : ""), Micros(r.mean_seconds()),
         Micros(r.std_seconds()), Micros(r.min_seconds()), Micros(r.max_seconds()),
         r.throughput_seconds() > 0 ? Micros(r.throughput_seconds()) : "-",
         Fixed(r.bytes_per_second() / 1e9, 1), Fixed(100 * r.fraction_of_peak(), 1),
         r.throughput_seconds() > 0 ? Fixed(100 * r.throughput_fraction_of_peak(), 1) : "-",
         r.correct() ? "yes" : "NO", r.launch_config(), absl::StrJoin(counters, " ")});
  }
  table.Print(out);
  const auto& rows = response->rows();
  if (std::any_of(rows.begin(), rows.end(),
                  [](const v1::BenchmarkRow& r) { return r.divergent(); })) {
    out << "* median and mean differ by more than 15%\n";
  }
  if (!response->note().empty()) out << "note: " << response->note() << '\n';
  return absl::OkStatus();
}

}  // namespace dequantd
