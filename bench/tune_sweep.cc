// dequantd_tune_sweep: how well and how repeatably the autotuner chooses (issue 13). For every
// shape, output dtype and objective it
//   1. sweeps all v4 candidates with the long reference measurement (the benchmark's graph
//      method: ~5 ms CUDA graphs of launches over buffer sets rotated past 4 x L2, median of
//      --reference-rounds interleaved rounds; latency objective: launches serialized),
//   2. runs --tunings independent tunings (a fresh memory-only Autotuner each, the default
//      TuneOptions the server uses) and times each,
// and prints one Markdown row: the best candidate, each tuning's choice and how far its reference
// time is from the best, and the spread of the choices' reference times.
//
//   dequantd_tune_sweep [--shapes [Ex]KxN,...] [--dtypes fp16,bf16] [--objectives
//   latency,throughput]
//                       [--tunings 3] [--reference-rounds 11] [--group-size 128] [--device 0]
//                       [--variant v4_vec16] [--format awq_gemm] [--orientation kn|nk]
//     --format: the layers' format, each shape with the parameters of the checkpoints people run
//     (measure/benchmark.h PresetShape, as dequantd_bench --formats); ExKxN for mxfp4's experts.
//     --orientation: the result's layout (default: the format's own).
//     After each row, a line lists every candidate's reference time.
//
// Where cuda::IsTunable is false (v4 on small layers) the tunings return DefaultConfig untimed;
// the reference sweep still times every candidate, so the row shows how far that default is from
// the best.
//
// Exit status: 0 when every row met both targets (choice within 1% of the best, choices within
// 1% of each other), 1 when a row missed one, 2 on an error.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/autotune.h"
#include "kernels/cuda/autotune_cuda.h"
#include "kernels/format_registry.h"
#include "measure/benchmark.h"

namespace dequantd::bench {
namespace {

using cuda::LaunchConfig;

struct Options {
  std::vector<BenchmarkShape> shapes = DefaultShapes();
  std::vector<DType> dtypes = {DType::kF16, DType::kBF16};
  std::vector<TuneObjective> objectives = {TuneObjective::kLatency, TuneObjective::kThroughput};
  int tunings = 3;
  int reference_rounds = 11;
  int64_t group_size = 128;
  int device = 0;
  cuda::KernelVariant variant = cuda::KernelVariant::kV4Vec16;
  Format format = Format::kAwqGemm;
  std::optional<Orientation> orientation;  // unset: the format's own
};

bool ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    bool ok = true;
    if (flag == "--shapes") {
      o->shapes.clear();
      for (absl::string_view item : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        std::vector<absl::string_view> ekn = absl::StrSplit(item, 'x');
        BenchmarkShape s;
        const size_t k = ekn.size() == 3 ? 1 : 0;
        ok = ok && (ekn.size() == 2 || ekn.size() == 3) &&
             (k == 0 || absl::SimpleAtoi(ekn[0], &s.experts)) && absl::SimpleAtoi(ekn[k], &s.K) &&
             absl::SimpleAtoi(ekn[k + 1], &s.N);
        o->shapes.push_back(s);
      }
    } else if (flag == "--dtypes") {
      o->dtypes.clear();
      for (absl::string_view item : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        DType t;
        ok = ok && ParseDType(std::string(item), &t);
        o->dtypes.push_back(t);
      }
    } else if (flag == "--objectives") {
      o->objectives.clear();
      for (absl::string_view item : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        TuneObjective t;
        ok = ok && ParseTuneObjective(std::string(item), &t);
        o->objectives.push_back(t);
      }
    } else if (flag == "--tunings") {
      ok = absl::SimpleAtoi(value, &o->tunings) && o->tunings >= 1;
    } else if (flag == "--reference-rounds") {
      ok = absl::SimpleAtoi(value, &o->reference_rounds) && o->reference_rounds >= 1;
    } else if (flag == "--group-size") {
      ok = absl::SimpleAtoi(value, &o->group_size);
    } else if (flag == "--device") {
      ok = absl::SimpleAtoi(value, &o->device);
    } else if (flag == "--variant") {
      ok = cuda::ParseVariant(value, &o->variant);
    } else if (flag == "--format") {
      ok = ParseFormat(value, &o->format);
    } else if (flag == "--orientation") {
      Orientation orientation;
      ok = ParseOrientation(value, &orientation);
      if (ok) o->orientation = orientation;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "dequantd_tune_sweep: bad flag or value: %s %s\n", flag.c_str(),
                   value.c_str());
      return false;
    }
  }
  return argc % 2 == 1;
}

// "128,1,2": block, words, rows.
std::string Short(const LaunchConfig& c) {
  return absl::StrCat(c.block_size, ",", c.words_per_thread, ",", c.rows_per_thread);
}

// One row of the table. Times in seconds per launch (reference medians).
struct Row {
  std::string text;
  std::string candidates;  // "cfg us, ..." in candidate order
  bool met = false;
};

absl::StatusOr<Row> SweepOne(const Options& o, const TuneDevice& device, const QuantShape& shape,
                             DType out, TuneObjective objective) {
  const std::vector<LaunchConfig> candidates = cuda::CandidateConfigs(o.variant, shape, out);
  cuda::TuneOptions reference;
  reference.rounds = o.reference_rounds;
  reference.sample_seconds = 5e-3;  // the benchmark's graph length (measure/benchmark_cuda.cu)
  reference.max_launches_per_sample = 2000;
  absl::StatusOr<std::vector<CandidateSamples>> swept =
      cuda::MeasureCandidates(o.variant, shape, out, objective, candidates, reference);
  if (!swept.ok()) return swept.status();
  std::vector<double> medians;
  for (const CandidateSamples& c : *swept) medians.push_back(Median(c.seconds));
  const size_t best =
      static_cast<size_t>(std::min_element(medians.begin(), medians.end()) - medians.begin());
  const auto reference_of = [&](const LaunchConfig& c) {
    return medians[static_cast<size_t>(std::find(candidates.begin(), candidates.end(), c) -
                                       candidates.begin())];
  };

  std::vector<std::string> choices;
  std::vector<double> chosen_times;
  std::vector<double> wall_ms;
  for (int t = 0; t < o.tunings; ++t) {
    Autotuner fresh;  // a fresh (memory-only) cache per tuning
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<LaunchConfig> c =
        cuda::GetOrTuneLaunchConfig(fresh, device, o.variant, shape, out, objective);
    wall_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
    if (!c.ok()) return c.status();
    choices.push_back(Short(*c));
    chosen_times.push_back(reference_of(*c));
  }
  const double worst = *std::max_element(chosen_times.begin(), chosen_times.end());
  const double fastest = *std::min_element(chosen_times.begin(), chosen_times.end());
  const double off_best = 100.0 * (worst / medians[best] - 1);
  const double spread = 100.0 * (worst / fastest - 1);
  std::vector<std::string> off;
  for (double t : chosen_times)
    off.push_back(absl::StrFormat("%+.2f%%", 100.0 * (t / medians[best] - 1)));
  std::sort(wall_ms.begin(), wall_ms.end());
  Row row;
  row.met = off_best <= 1.0 && spread <= 1.0;
  std::vector<std::string> each;
  for (size_t i = 0; i < candidates.size(); ++i) {
    each.push_back(absl::StrFormat("%s %.2f", Short(candidates[i]), medians[i] * 1e6));
  }
  row.candidates = absl::StrJoin(each, ", ");
  row.text = absl::StrFormat(
      "| %s %dx%d | %s | %s | %zu | %s | %.2f | %s | %s | %.2f%% | %.0f-%.0f | %s |",
      FormatLabel(shape), shape.K, shape.N, std::string(DTypeName(out)),
      std::string(TuneObjectiveName(objective)), candidates.size(), Short(candidates[best]),
      medians[best] * 1e6, absl::StrJoin(choices, " / "), absl::StrJoin(off, " / "), spread,
      wall_ms.front(), wall_ms.back(), row.met ? "yes" : "NO");
  return row;
}

int Run(const Options& o) {
  if (cudaSetDevice(o.device) != cudaSuccess) {
    std::fprintf(stderr, "dequantd_tune_sweep: no CUDA device %d\n", o.device);
    return 2;
  }
  absl::StatusOr<TuneDevice> device = cuda::ReadTuneDevice(o.device);
  if (!device.ok()) {
    std::fprintf(stderr, "dequantd_tune_sweep: %s\n", device.status().ToString().c_str());
    return 2;
  }
  std::printf(
      "device: %s (sm_%d); %s, %s (group %lld where it has one; its preset's scales); "
      "reference: %d rounds of ~5 ms graphs; tunings: default TuneOptions (5 rounds of ~1 ms "
      "graphs)\n\n",
      device->name.c_str(), device->compute_capability,
      std::string(cuda::VariantName(o.variant)).c_str(), std::string(FormatName(o.format)).c_str(),
      static_cast<long long>(o.group_size), o.reference_rounds);
  std::printf(
      "| shape | out | objective | candidates | best (ref) | best us/launch | tuner's "
      "choices | choices vs best | spread of choices | tuning wall ms | met |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  std::fflush(stdout);
  bool all_met = true;
  for (TuneObjective objective : o.objectives) {  // the served objective (latency) first
    for (const BenchmarkShape& s : o.shapes) {
      QuantShape shape = ToQuantShape(PresetShape(o.format, s.K, s.N, o.group_size, s.experts));
      if (o.orientation) shape.orientation = *o.orientation;
      for (DType out : o.dtypes) {
        absl::StatusOr<Row> row = SweepOne(o, *device, shape, out, objective);
        if (!row.ok()) {
          std::fprintf(stderr, "dequantd_tune_sweep: %lldx%lld: %s\n", static_cast<long long>(s.K),
                       static_cast<long long>(s.N), row.status().ToString().c_str());
          return 2;
        }
        all_met = all_met && row->met;
        std::printf("%s\n", row->text.c_str());
        std::printf("candidates (block,words,rows us): %s\n", row->candidates.c_str());
        std::fflush(stdout);
      }
    }
  }
  return all_met ? 0 : 1;
}

}  // namespace
}  // namespace dequantd::bench

int main(int argc, char** argv) {
  dequantd::bench::Options options;
  if (!dequantd::bench::ParseArgs(argc, argv, &options)) {
    std::fprintf(stderr,
                 "usage: dequantd_tune_sweep [--shapes KxN,...] [--dtypes fp16,bf16] "
                 "[--objectives latency,throughput] [--tunings 3] [--reference-rounds 11] "
                 "[--group-size 128] [--device 0] [--variant v4_vec16] [--format awq_gemm] "
                 "[--orientation kn|nk]\n");
    return 2;
  }
  return dequantd::bench::Run(options);
}
