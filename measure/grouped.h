// The grouped benchmark (issue 3, part 5): every linear layer of a model dequantized in ONE
// grouped launch (kernels/cuda/grouped_dequant.h), timed against a device-to-device copy of the
// same byte count and against one v4_vec16 launch per layer. CUDA builds only (grouped.cu).
//
// Method: random packed inputs per layer (measure/packed_inputs.h), replicated over `copies` sets
// of device buffers (the model's traffic is far larger than the L2, so each call reads from
// DRAM); warm-up; `runs` runs, each timing every variant once in a freshly shuffled order,
// rotating over the copies; latency = CUDA events around one call; the yardstick is the peak copy
// rate of a >= 1 GiB cudaMemcpyAsync measured in the same run. Every timed variant's output is
// then checked against DequantizeReference (all rows of small layers, sampled rows of the others)
// after a sentinel fill. A sweep times every GroupedOptions candidate first.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/dequant.h"
#include "measure/stats.h"

namespace dequantd::bench {

// A model's linear layers, in order (random weights; only the shapes come from the model).
struct ModelLayers {
  std::string name;
  std::string description;  // e.g. "28 layers x 7 projections"
  std::vector<QuantShape> layers;
};

// "qwen2.5-1.5b": 28 x {q 1536x1536, k 1536x256, v 1536x256, o 1536x1536, gate 1536x8960,
// up 1536x8960, down 8960x1536} (K x N), group 128, fp16 scales (196 layers).
// INVALID_ARGUMENT listing the known names for any other name.
absl::StatusOr<ModelLayers> ModelByName(std::string_view name);

struct GroupedBenchRequest {
  std::string model = "qwen2.5-1.5b";
  DType out_dtype = DType::kF16;
  int runs = 30;        // timed calls per variant
  int sweep_runs = 10;  // timed calls per candidate of the sweep
  int copies = 2;       // device copies of the model's buffers, rotated
  int device = 0;       // CUDA device ordinal
  uint64_t seed = 1;    // input and order randomness
  int64_t peak_copy_bytes = int64_t{1} << 30;
};

// One timed variant. Times in seconds.
struct GroupedBenchRow {
  std::string variant;   // "grouped_plan", "grouped_oneshot", "v4_per_layer_stream",
                         // "v4_per_layer_graph", "copy", "sweep"
  std::string config;    // launch options, e.g. "block=128,rows=4,units=1,pdl=1"
  int64_t launches = 0;  // kernel launches per call
  int64_t bytes_moved = 0;
  SampleStats latency;
  double fraction_of_peak = 0;  // bytes_moved / latency.median / peak
  bool checked = false;         // output compared with the reference
  bool correct = false;         // every compared element matched (true for unchecked rows)
};

struct GroupedBenchResult {
  std::string device;  // e.g. "NVIDIA H200 (sm_90, 132 SMs, L2 60 MiB)"
  std::string model;   // name and description
  DType out_dtype = DType::kF16;
  int64_t layers = 0;
  int copies = 0;
  double peak_copy_bytes_per_second = 0;
  std::vector<GroupedBenchRow> sweep;  // every candidate, in sweep order
  std::vector<GroupedBenchRow> rows;   // the comparison
};

// Runs the method above on device request.device. INVALID_ARGUMENT for an unknown model or bad
// counts; FAILED_PRECONDITION without a device; INTERNAL / RESOURCE_EXHAUSTED for CUDA errors.
// Blocking; uses about copies x (packed + output bytes) of device memory.
absl::StatusOr<GroupedBenchResult> RunGroupedBenchmark(const GroupedBenchRequest& request);

// Plain-text report: header (model, device, peak), the sweep, then the comparison table.
// GB = 1e9 bytes.
std::string FormatGroupedResult(const GroupedBenchResult& result);

}  // namespace dequantd::bench
