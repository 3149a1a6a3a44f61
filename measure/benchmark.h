// The benchmark method of issue 3 (part 1), as a library: a request in, a table of rows out. The
// same code serves `dequantd_bench` and the server's Benchmark RPC; the structs mirror
// proto/dequant/v1/dequant.proto's BenchmarkRequest / BenchmarkRow / BenchmarkResponse without
// depending on protobuf (the server converts).
//
// Method, per (shape, output dtype):
//   - fresh random inputs (measure/packed_inputs.h: full-range packed words, finite non-zero
//     scales); on the GPU replicated over enough buffer sets that one rotation covers at least
//     4x the L2 size (and at least 2 sets), so no launch reads what the previous one left in L2;
//   - warm-up, then `trials` trials of `runs` runs; every run times each variant once, in a
//     freshly shuffled order;
//   - latency: one launch between two events (CPU: std::chrono::steady_clock around one call);
//   - throughput (GPU only): a CUDA graph of back-to-back launches over the rotating buffer sets,
//     one graph launch per trial, time per launch;
//   - a "copy" row: a device-to-device cudaMemcpyAsync (CPU: threaded memcpy) of the same bytes
//     (bytes read + written), timed both ways;
//   - after every trial each variant's output is compared bit for bit with DequantizeReference
//     (all rows for small outputs, else the first, the last and random rows);
//   - bytes moved = the stored tensors (AWQ: qweight + qzeros + scales; mxfp4: blocks + scales)
//     + output bytes (QuantShape::bytes_moved); the yardstick is the peak copy rate measured at
//     the start of the run.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/quant_tensor.h"
#include "measure/stats.h"

namespace dequantd {
class Autotuner;
}

namespace dequantd::bench {

// One layer shape to time with random packed inputs, in any format (AWQ GEMM unless set).
struct BenchmarkShape {
  int64_t K = 0;                    // in_features
  int64_t N = 0;                    // out_features
  int64_t group_size = 0;           // 0: BenchmarkRequest::group_size
  DType scale_dtype = DType::kF16;  // the format's scale dtype (AWQ: fp16 or bf16)
  // The format and its parameters, as QuantShape's fields of the same names.
  Format format = Format::kAwqGemm;
  int bits = 4;
  uint32_t format_flags = 0;
  int64_t scale_block_rows = 0;
  int64_t experts = 1;  // matrices stacked (mxfp4's E); 1 for the others
  std::optional<Orientation> orientation = std::nullopt;  // nullopt: the format's own
};

// The QuantShape `s` describes (group_size as given; the format's orientation when unset).
QuantShape ToQuantShape(const BenchmarkShape& s);
// The BenchmarkShape of a layer's shape (e.g. a loaded layer's: its format, bits, flags and
// orientation kept).
BenchmarkShape FromQuantShape(const QuantShape& shape);

enum class Backend {
  kAuto,  // CUDA when this build has it and a device is present, else CPU
  kCpu,   // variants "cpu_reference", "cpu_threads"
  kCuda,  // kernel variants (cuda::VariantName), FAILED_PRECONDITION without a device
};

struct BenchmarkRequest {
  // At least one. The proto's `tensors` (layers of a loaded model) are passed here by the server
  // as their shapes (with group_size and scale dtype); the inputs are random either way.
  std::vector<BenchmarkShape> shapes;
  int64_t group_size = 0;             // for shapes with group_size 0; 0 = 128
  std::vector<std::string> variants;  // empty = every variant of the backend; "copy" is
                                      // always added
  std::vector<DType> output_dtypes;   // empty = {fp16}
  int trials = 0;                     // 0 = 5; at most 1000
  int runs = 0;                       // runs per trial; 0 = 20; at most 10000
  bool hardware_counters = false;     // CUDA with CUPTI: BenchmarkRow::counters of each kernel
                                      // variant (one extra, replayed launch after timing); else
                                      // or on failure, the note says why they are missing

  // Not on the wire:
  Backend backend = Backend::kAuto;
  int device = 0;               // CUDA device ordinal
  uint64_t seed = 0;            // input and order randomness; 0 = from random_device
  int64_t peak_copy_bytes = 0;  // size of the peak-rate copy; 0 = 1 GiB (GPU), 256 MiB
                                // (CPU)
  int64_t full_check_max_elements = int64_t{1} << 24;  // larger outputs are checked on rows
  int sampled_rows = 8;  // random rows checked per trial, besides first and last
  int cpu_threads = 0;   // cpu_threads variant: 0 = hardware concurrency
  // The most host memory one (shape, output dtype) may hold (measure/memory_budget.h counts it:
  // inputs, reference, outputs, copy buffers), checked for every shape before anything is
  // allocated; 0 = half of the host's MemAvailable. The CUDA backend also checks each shape's
  // device buffers against cudaMemGetInfo's free memory.
  int64_t host_memory_limit_bytes = 0;
  Autotuner* autotuner = nullptr;  // CUDA: source of tuned launch configs (not owned);
                                   // null = a memory-only tuner for this call
  // Polled between timed calls, output checks, shapes and dtypes (so within one call of the
  // slowest variant), and during setup: between large allocations and every 4 MiB of random
  // input generation; when it returns true the benchmark stops and returns CANCELLED "benchmark
  // cancelled". Called on the benchmarking thread; must be cheap. Empty = never cancelled.
  std::function<bool()> cancelled;
};

// One (variant, shape, output dtype) result. Times in seconds.
struct BenchmarkRow {
  std::string variant;  // e.g. "v4_vec16", "copy", "cpu_threads"
  Format format = Format::kAwqGemm;
  int64_t experts = 1;  // matrices stacked (mxfp4's E)
  std::string layout;   // FormatLabel of the layer: "awq_gemm", "gptq/f1", "mxfp4/e32", ...
  Orientation orientation = Orientation::kKN;  // the timed result's layout
  int64_t K = 0;
  int64_t N = 0;
  int64_t group_size = 0;
  DType output_dtype = DType::kF16;
  int64_t bytes_moved = 0;  // bytes the variant must read + write per call
  SampleStats latency;      // over trials x runs single-launch samples
  double throughput_seconds =
      0;                        // per launch, back to back (median over trials); 0 if not measured
  double bytes_per_second = 0;  // bytes_moved / latency.median
  double fraction_of_peak = 0;  // bytes_per_second / peak_copy_bytes_per_second
  double throughput_bytes_per_second = 0;  // bytes_moved / throughput_seconds; 0 if not measured
  double throughput_fraction_of_peak = 0;  // throughput_bytes_per_second / peak
  bool correct = false;  // every trial matched the CPU reference (copy rows: true, not checked)
  std::string launch_config;  // e.g. "block=256,words=4,rows=2"; "" when not applicable
  // Hardware counters of one launch (measure/hw_counters.h names: percentages 0..100, bytes),
  // when requested and available; empty for copy rows and on the CPU.
  std::map<std::string, double> counters;
};

struct BenchmarkResult {
  std::string backend;                    // "cuda" or "cpu"
  std::string device;                     // e.g. "NVIDIA H200 (sm_90, 132 SMs, L2 60 MiB)"
  double peak_copy_bytes_per_second = 0;  // measured copy, bytes read + written per second;
                                          // CPU: memcpy split over the cpu_threads threads
  std::vector<BenchmarkRow> rows;         // shapes x dtypes x (variants..., copy), in that order
  std::string note;  // e.g. why hardware counters are missing, autotuner warnings
};

// Runs the method on the requested backend. Errors: INVALID_ARGUMENT for a bad request (no
// shapes, a shape ValidateShape refuses, unknown variant or dtype, trials/runs out of range);
// FAILED_PRECONDITION for Backend::kCuda without a device or CUDA build; RESOURCE_EXHAUSTED
// before allocating when a shape needs more host memory than host_memory_limit_bytes allows (or,
// on CUDA, more device memory than is free), naming the shape, the bytes needed and available;
// INTERNAL or RESOURCE_EXHAUSTED for CUDA errors; CANCELLED "benchmark cancelled" once
// request.cancelled returns true. Blocking; not to be called concurrently on one GPU if the numbers
// are to mean anything (thread-safe otherwise).
absl::StatusOr<BenchmarkResult> RunBenchmark(const BenchmarkRequest& request);

// A K x N layer of `format` with the parameters of the checkpoints people run (docs/formats/):
// awq_gemm: group_size (0 = 128), fp16 scales; gptq: 4 bits, group_size, act-order g_idx,
// asymmetric zeros stored minus one (checkpoint_format "gptq"), fp16 scales; compressed_tensors:
// int4 symmetric, group_size, bf16 scales (RedHatAI w4a16); fp8_block: 128 x 128 blocks, fp32
// scales (DeepSeek-V3); compressed_tensors_fp8: per-channel bf16 scales (FP8-dynamic); mxfp4:
// `experts` stacked K x N matrices, E8M0 scales per 32 (gpt-oss). The result in the format's own
// orientation.
BenchmarkShape PresetShape(Format format, int64_t K, int64_t N, int64_t group_size,
                           int64_t experts = 1);

// The nine shapes of issue 3: Qwen2.5-1.5B, Llama-3-8B, Llama-3-70B (K x N).
std::vector<BenchmarkShape> DefaultShapes();

}  // namespace dequantd::bench
