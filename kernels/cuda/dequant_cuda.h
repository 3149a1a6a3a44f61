// Host API of the CUDA dequantization kernels, for every format. Host types only (no device code
// here); compiled only when DEQUANTD_HAVE_CUDA. Each call dispatches to the format's kernels (its
// registry row, kernels/cuda/format_kernels.h). Every variant a format implements writes exactly
// the bits of DequantizeReference (kernels/dequant.h) for every shape and output dtype that
// ValidateShape accepts.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cuda/launch_config.h"  // LaunchConfig
#include "kernels/dequant.h"

namespace dequantd::cuda {

enum class KernelVariant : int {
  kV1PerElement = 1,    // one thread per output element (baseline)
  kV2PerWord = 2,       // one thread per packed qweight word, fixed 256-thread blocks
  kV3PerWordBlock = 3,  // v2 with the block size as a run-time parameter
  kV4Vec16 = 4,         // the fast kernel: coalesced 16-byte stores (and scale loads), Lop3Unpack +
                        // packed half math, several words and rows per thread
};

// "v1_per_element", "v2_per_word", "v3_per_word_block", "v4_vec16".
std::string_view VariantName(KernelVariant v);
bool ParseVariant(std::string_view name, KernelVariant* out);
std::vector<KernelVariant> AllVariants();
// The variants `format` implements (empty without CUDA kernels), fastest last.
std::vector<KernelVariant> VariantsOf(Format format);

// v4's limits: blocks of at most kV4MaxBlockSize threads (so a thread may use 128 registers), and
// tiles of words_per_thread * rows_per_thread <= kV4MaxTileWords words (larger tiles spill).
inline constexpr int kV4MaxBlockSize = 512;
inline constexpr int kV4MaxTileWords = 16;

// The configuration used when nothing is tuned (the default LaunchConfig for a variant the
// format does not implement).
LaunchConfig DefaultConfig(KernelVariant v, const QuantShape& shape, DType out_dtype);
// The configurations the autotuner sweeps for (v, shape, out_dtype); DefaultConfig is among them.
std::vector<LaunchConfig> CandidateConfigs(KernelVariant v, const QuantShape& shape,
                                           DType out_dtype);

// Whether the autotuner times (v, shape, out_dtype)'s candidates; when false, DefaultConfig is
// launched without a tuning (the rule-based default). False for a variant with one candidate, and
// for v4 on small layers (LayerSize::kSmall: fewer than 4M outputs, e.g. 1536x1536), where
// launches take a few microseconds and candidates differ by tens of nanoseconds: less than a tuning
// separates reliably (on the H200 one tuning in three chose a configuration 1.2% slower than
// DefaultConfig there, which was the best of the 15 candidates by the benchmark's method for
// fp16 and bf16, latency and throughput: docs/performance.md, issue 13). ValidateShape must
// accept the shape.
bool IsTunable(KernelVariant v, const QuantShape& shape, DType out_dtype);

// ValidateShape plus the variant's own limits on `config` (INVALID_ARGUMENT naming the field;
// also for a variant the shape's format does not implement).
absl::Status CanImplement(KernelVariant v, const LaunchConfig& config, const QuantShape& shape,
                          DType out_dtype);

// Enqueues the dequantization of `in` (device pointers; AWQ: 4-byte aligned qweight/qzeros, 2-byte
// aligned scales) into `out` (device pointer, K * N elements of out_dtype, 16-byte aligned) on
// `stream`. v4 also needs 16-byte aligned scales (cudaMalloc's 256-byte alignment satisfies all
// of these).
// Calls CanImplement first; INVALID_ARGUMENT for a null or misaligned pointer; INTERNAL with the
// CUDA error on a launch failure. Asynchronous: errors during execution surface on the stream.
// Thread-safe (no shared state); launches on one stream are ordered. v4 may use programmatic
// dependent launch: it waits for the preceding kernel before touching memory and lets the next
// kernel on the stream launch early (that kernel must wait likewise if it reads v4's output).
absl::Status LaunchDequantize(KernelVariant v, const LaunchConfig& config, const QuantView& in,
                              DType out_dtype, void* out, cudaStream_t stream);

}  // namespace dequantd::cuda
