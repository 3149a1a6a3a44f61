// dequantd_bench: runs the benchmark method (measure/benchmark.h) and prints the table.
//
//   dequantd_bench [--shapes [Ex]KxN,...] [--group-size 128] [--dtypes fp16,bf16,fp32]
//                  [--formats awq_gemm,gptq,...] [--orientation kn|nk]
//                  [--variants v1_per_element,...] [--trials 5] [--runs 20] [--markdown]
//                  [--backend auto|cpu|cuda] [--device 0] [--seed S] [--commit SHA]
//                  [--peak-copy-mib MiB] [--tune-cache PATH] [--hardware-counters]
//     --formats: every shape in each format, with the parameters of the checkpoints people run
//     (measure/benchmark.h PresetShape; default awq_gemm); --orientation: the result's layout
//     (default: each format's own).
//   dequantd_bench --grouped MODEL [--dtypes fp16] [--runs R] [--device D] [--seed S]
//                  [--peak-copy-mib MiB]
//     (CUDA builds: every layer of MODEL, e.g. qwen2.5-1.5b, in one grouped launch;
//     measure/grouped.h)
//
// Exit status: 0 when every row is correct, 1 when a variant's output differed from the CPU
// reference, 2 on a usage or run error.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "build_commit.h"
#include "measure/benchmark.h"
#if defined(DEQUANTD_HAVE_CUDA)
#include "measure/grouped.h"
#endif
#include "formats/tune_store.h"
#include "kernels/autotune.h"
#include "kernels/format_registry.h"
#include "measure/table.h"

namespace {

using dequantd::DType;
using dequantd::bench::BenchmarkRequest;
using dequantd::bench::BenchmarkShape;

constexpr const char* kUsage =
    "usage: dequantd_bench [--shapes [Ex]KxN,...] [--group-size G] [--dtypes fp16,bf16,fp32]\n"
    "                      [--formats awq_gemm,gptq,compressed_tensors,...] [--orientation kn|nk]\n"
    "                      [--variants NAME,...] [--trials T] [--runs R] [--markdown]\n"
    "                      [--backend auto|cpu|cuda] [--device D] [--seed S] [--commit SHA]\n"
    "                      [--peak-copy-mib MiB] [--tune-cache PATH] [--hardware-counters]\n"
    "       dequantd_bench --grouped qwen2.5-1.5b [--dtypes fp16] [--runs R] [--device D]\n"
    "                      [--seed S] [--peak-copy-mib MiB]\n";

int Fail(const std::string& message) {
  std::fprintf(stderr, "dequantd_bench: %s\n%s", message.c_str(), kUsage);
  return 2;
}

// "KxN" or, for a format with an expert axis (mxfp4), "ExKxN" (E experts of K x N).
bool ParseShapes(absl::string_view text, std::vector<BenchmarkShape>* shapes) {
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> dims = absl::StrSplit(item, 'x');
    BenchmarkShape s;
    if (dims.size() == 3) {
      if (!absl::SimpleAtoi(dims[0], &s.experts) || s.experts < 1) return false;
      dims.erase(dims.begin());
    }
    if (dims.size() != 2 || !absl::SimpleAtoi(dims[0], &s.K) || !absl::SimpleAtoi(dims[1], &s.N)) {
      return false;
    }
    shapes->push_back(s);
  }
  return !shapes->empty();
}

std::string UtcNow() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

// --grouped MODEL: the grouped benchmark (CUDA builds only). Uses the request's first output
// dtype, runs, device, seed and peak copy size.
int RunGrouped(const std::string& model, const BenchmarkRequest& request) {
#if defined(DEQUANTD_HAVE_CUDA)
  dequantd::bench::GroupedBenchRequest g;
  g.model = model;
  if (!request.output_dtypes.empty()) g.out_dtype = request.output_dtypes.front();
  if (request.runs > 0) g.runs = request.runs;
  g.device = request.device;
  if (request.seed != 0) g.seed = request.seed;
  if (request.peak_copy_bytes > 0) g.peak_copy_bytes = request.peak_copy_bytes;
  absl::StatusOr<dequantd::bench::GroupedBenchResult> result =
      dequantd::bench::RunGroupedBenchmark(g);
  if (!result.ok()) {
    std::fprintf(stderr, "dequantd_bench: %s\n", result.status().ToString().c_str());
    return 2;
  }
  std::fputs(dequantd::bench::FormatGroupedResult(*result).c_str(), stdout);
  for (const auto& row : result->rows) {
    if (!row.correct) return 1;
  }
  return 0;
#else
  (void)request;
  return Fail("--grouped " + model + " needs a CUDA build");
#endif
}

// --hardware-counters: one line per row that has them (after the table).
void PrintCounters(const dequantd::bench::BenchmarkResult& result, bool markdown) {
  for (const dequantd::bench::BenchmarkRow& row : result.rows) {
    if (row.counters.empty()) continue;
    std::string line =
        absl::StrCat(markdown ? "- " : "", "counters ", row.variant, " ", row.K, "x", row.N, " ",
                     std::string(dequantd::DTypeName(row.output_dtype)), ":");
    for (const auto& [name, value] : row.counters) {
      absl::StrAppend(&line, " ", name, "=", absl::StrFormat("%.6g", value));
    }
    std::printf("%s\n", line.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  BenchmarkRequest request;
  bool markdown = false;
  std::string commit = DEQUANTD_BUILD_COMMIT;
  std::string tune_cache;
  std::string grouped_model;
  std::vector<dequantd::Format> formats;
  std::optional<dequantd::Orientation> orientation;
  std::vector<absl::string_view> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    const absl::string_view flag = args[i];
    if (flag == "--markdown") {
      markdown = true;
      continue;
    }
    if (flag == "--hardware-counters") {
      request.hardware_counters = true;
      continue;
    }
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    static constexpr absl::string_view kValued[] = {
        "--shapes",        "--group-size", "--dtypes",  "--variants", "--trials",
        "--runs",          "--backend",    "--device",  "--seed",     "--commit",
        "--peak-copy-mib", "--tune-cache", "--grouped", "--formats",  "--orientation"};
    if (std::find(std::begin(kValued), std::end(kValued), flag) == std::end(kValued)) {
      return Fail(std::string("unknown flag ") + std::string(flag));
    }
    if (i + 1 >= args.size()) return Fail(std::string("missing value for ") + std::string(flag));
    const absl::string_view value = args[++i];
    bool ok = true;
    if (flag == "--shapes") {
      ok = ParseShapes(value, &request.shapes);
    } else if (flag == "--group-size") {
      ok = absl::SimpleAtoi(value, &request.group_size);
    } else if (flag == "--dtypes") {
      for (absl::string_view d : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        DType t;
        ok = ok && dequantd::ParseDType(std::string(d), &t);
        if (ok) request.output_dtypes.push_back(t);
      }
    } else if (flag == "--variants") {
      for (absl::string_view v : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        request.variants.emplace_back(v);
      }
    } else if (flag == "--trials") {
      ok = absl::SimpleAtoi(value, &request.trials) && request.trials > 0;
    } else if (flag == "--runs") {
      ok = absl::SimpleAtoi(value, &request.runs) && request.runs > 0;
    } else if (flag == "--backend") {
      using dequantd::bench::Backend;
      if (value == "auto") {
        request.backend = Backend::kAuto;
      } else if (value == "cpu") {
        request.backend = Backend::kCpu;
      } else if (value == "cuda") {
        request.backend = Backend::kCuda;
      } else {
        ok = false;
      }
    } else if (flag == "--device") {
      ok = absl::SimpleAtoi(value, &request.device);
    } else if (flag == "--seed") {
      ok = absl::SimpleAtoi(value, &request.seed);
    } else if (flag == "--commit") {
      commit = std::string(value);
    } else if (flag == "--peak-copy-mib") {
      int64_t mib = 0;
      ok = absl::SimpleAtoi(value, &mib) && mib > 0;
      request.peak_copy_bytes = mib << 20;
    } else if (flag == "--tune-cache") {
      tune_cache = std::string(value);
    } else if (flag == "--grouped") {
      grouped_model = std::string(value);
    } else if (flag == "--formats") {
      for (absl::string_view f : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        dequantd::Format format;
        ok = ok && dequantd::ParseFormat(std::string_view(f.data(), f.size()), &format);
        if (ok) formats.push_back(format);
      }
    } else if (flag == "--orientation") {
      dequantd::Orientation o;
      ok = dequantd::ParseOrientation(std::string_view(value.data(), value.size()), &o);
      if (ok) orientation = o;
    }
    if (!ok)
      return Fail(std::string("bad value for ") + std::string(flag) + ": " + std::string(value));
  }
  if (!grouped_model.empty()) return RunGrouped(grouped_model, request);
  if (request.shapes.empty()) request.shapes = dequantd::bench::DefaultShapes();
  if (formats.empty()) formats = {dequantd::Format::kAwqGemm};
  std::vector<BenchmarkShape> shapes;  // each format's shapes in turn
  for (dequantd::Format format : formats) {
    const std::string name(dequantd::FormatName(format));
    for (const BenchmarkShape& s : request.shapes) {
      // A flag the format's preset cannot honour is an error, never silently replaced.
      if (s.experts != 1 && !dequantd::FormatRowOf(format).stacked_experts) {
        return Fail(absl::StrCat("--shapes ", s.experts, "x", s.K, "x", s.N, ": ", name,
                                 " has no expert axis (ExKxN is for mxfp4)"));
      }
      shapes.push_back(
          dequantd::bench::PresetShape(format, s.K, s.N, request.group_size, s.experts));
      if (request.group_size != 0 && shapes.back().group_size != request.group_size) {
        return Fail(absl::StrCat("--group-size ", request.group_size, ": ", name,
                                 " has a fixed group size of ", shapes.back().group_size));
      }
      if (orientation) shapes.back().orientation = orientation;
    }
  }
  request.shapes = std::move(shapes);

  std::unique_ptr<dequantd::TuneStore> store;
  if (!tune_cache.empty()) store = std::make_unique<dequantd::formats::TuneFile>(tune_cache);
  dequantd::Autotuner tuner(std::move(store));
  if (!tuner.load_warning().ok()) {
    std::fprintf(stderr, "dequantd_bench: warning: %s\n",
                 std::string(tuner.load_warning().message()).c_str());
  }
  request.autotuner = &tuner;
  absl::StatusOr<dequantd::bench::BenchmarkResult> result = dequantd::bench::RunBenchmark(request);
  if (!result.ok()) {
    std::fprintf(stderr, "dequantd_bench: %s\n", result.status().ToString().c_str());
    return 2;
  }
  const std::string table = dequantd::bench::FormatTable(*result, {UtcNow(), commit}, markdown);
  std::fputs(table.c_str(), stdout);
  PrintCounters(*result, markdown);
  for (const auto& row : result->rows) {
    if (!row.correct) return 1;
  }
  return 0;
}
