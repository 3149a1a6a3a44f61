#include "measure/table.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace dequantd::bench {
namespace {

std::string Micros(double seconds) { return absl::StrFormat("%.2f", seconds * 1e6); }
std::string Gbps(double bytes_per_second) {
  return absl::StrFormat("%.1f", bytes_per_second / 1e9);
}
std::string Percent(double fraction) { return absl::StrFormat("%.1f", fraction * 100); }

std::vector<std::string> Cells(const BenchmarkRow& r) {
  const bool thr = r.throughput_seconds > 0;
  return {r.variant,
          // An AWQ row reads "KxN gG", as before formats; others name their layout first.
          absl::StrCat(r.layout.empty() || r.layout == "awq_gemm" ? "" : r.layout + " ", r.K, "x",
                       r.N, " g", r.group_size),
          std::string(DTypeName(r.output_dtype)), Micros(r.latency.median),
          absl::StrCat(Micros(r.latency.mean), " ± ", Micros(r.latency.std)),
          thr ? Micros(r.throughput_seconds) : "-", Gbps(r.bytes_per_second),
          Percent(r.fraction_of_peak), thr ? Gbps(r.throughput_bytes_per_second) : "-",
          thr ? Percent(r.throughput_fraction_of_peak) : "-", r.latency.divergent ? "yes" : "no",
          r.correct ? "yes" : "NO", r.launch_config.empty() ? "-" : r.launch_config};
}

}  // namespace

std::string FormatTable(const BenchmarkResult& result, const TableHeader& header, bool markdown) {
  const std::vector<std::string> titles = {
      "variant",       "shape",    "dtype",      "latency med us", "latency mean ± std us",
      "thr us/launch", "lat GB/s", "lat % peak", "thr GB/s",       "thr % peak",
      "divergent",     "correct",  "config"};
  std::string out;
  const std::string bullet = markdown ? "- " : "";
  absl::StrAppend(&out, bullet, "device: ", result.device, " (backend ", result.backend, ")\n");
  if (!header.date.empty()) absl::StrAppend(&out, bullet, "date: ", header.date, "\n");
  if (!header.commit.empty()) absl::StrAppend(&out, bullet, "commit: ", header.commit, "\n");
  absl::StrAppend(&out, bullet, "peak copy rate: ", Gbps(result.peak_copy_bytes_per_second),
                  " GB/s (bytes read + written)\n");
  if (!result.note.empty()) absl::StrAppend(&out, bullet, "note: ", result.note, "\n");
  out += "\n";

  std::vector<std::vector<std::string>> table = {titles};
  for (const BenchmarkRow& r : result.rows) table.push_back(Cells(r));
  if (markdown) {
    absl::StrAppend(&out, "| ", absl::StrJoin(titles, " | "), " |\n|");
    for (size_t i = 0; i < titles.size(); ++i) out += i < 3 || i >= 10 ? " --- |" : " ---: |";
    out += "\n";
    for (size_t row = 1; row < table.size(); ++row) {
      absl::StrAppend(&out, "| ", absl::StrJoin(table[row], " | "), " |\n");
    }
    return out;
  }
  std::vector<size_t> width(titles.size(), 0);
  for (const auto& row : table) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  for (const auto& row : table) {
    for (size_t i = 0; i < row.size(); ++i) {
      const size_t pad = width[i] - row[i].size();
      if (i < 3 || i >= 10) {
        absl::StrAppend(&out, row[i], std::string(pad, ' '));
      } else {
        absl::StrAppend(&out, std::string(pad, ' '), row[i]);
      }
      out += i + 1 < row.size() ? "  " : "\n";
    }
  }
  return out;
}

}  // namespace dequantd::bench
