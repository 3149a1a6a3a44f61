// Grouped dequantization: many AWQ layers in ONE kernel launch (issue 3, part 5). Host types
// only; compiled only when DEQUANTD_HAVE_CUDA.
//
// (K, N) results: every item (layer) is cut into v4_vec16 work units (rows_per_thread rows x one
// packed word, two threads per word for fp32 output; see dequant_kernels.cuh), units into blocks.
// (N, K) results: every item's blocks are the (N, K) tile kernel's (AwqNkTileBlock: 64 result rows
// x 512 bytes of K per block, one tile each, 256 threads). Either way the items' blocks are laid
// end to end in one grid; a block finds its item through a small bucket table (first item of
// every 2^bucket_shift blocks) and runs that kernel's decode, so small layers stop paying one
// launch each. Items may differ in K, N, group_size and scale dtype; the output dtype and the
// orientation are one per call. Results are bit-exact to DequantizeReference (kernels/dequant.h).
//
// Two entry points:
//   * GroupedPlan: validates the items, computes the layout and uploads the descriptor table
//     once; Launch() then costs one kernel launch and no host-to-device copy (server start-up or
//     a whole-model pass builds it once and launches it as often as it likes);
//   * LaunchGroupedDequantize: a one-shot plan (the table is uploaded on the stream, then freed
//     on the stream after the launch).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/dequant.h"

namespace dequantd::cuda {

// One layer of a grouped call. `in` holds device pointers (qweight and qzeros 4-byte aligned,
// scales 16-byte aligned); `out` is a device pointer to K * N elements of the call's output
// dtype, 16-byte aligned (cudaMalloc's 256-byte alignment satisfies all of these). Outputs must
// not overlap each other or any input.
struct GroupedItem {
  QuantView in;
  void* out = nullptr;
};

// Launch parameters of a grouped call. Defaults: the best or within 0.5 points of the best of a
// 60-candidate sweep (block 64-512 x rows 1-16 x units 1-4) on the H200 for a Qwen2.5-1.5B-shaped
// model (196 layers), fp16, bf16 and fp32 output alike (kernels/cuda/NOTES.md). block_size,
// rows_per_thread and units_per_thread shape (K, N) launches only (they are still checked);
// (N, K) launches have the tile kernel's fixed blocks, the one-layer kernel's tuned default.
struct GroupedOptions {
  int block_size = 256;  // threads per block: a multiple of 32 in [32, 512]
  // Rows per work unit: 1, 2, 4, 8 or 16. An item whose group_size this does not divide uses
  // one row per unit (the kernel carries both paths).
  int rows_per_thread = 8;
  // Work units per thread (1, 2 or 4), block_size apart inside the item; the next unit's loads
  // are issued before the current unit's stores.
  int units_per_thread = 1;
  // Programmatic dependent launch, as v4 (dequant_cuda.h): the kernel waits for the preceding
  // grid before touching memory, and lets the next grid on the stream launch early.
  bool programmatic_launch = true;

  bool operator==(const GroupedOptions&) const = default;
};

// A slab of one item: whole groups whose unit count is below 2^31 (32-bit index arithmetic, as
// v4's launcher splits a layer), dequantized by blocks [block_begin, block_end) of the grid. An
// (N, K) item is one segment: rows [0, K), rows_per_thread 1, units = its tiles, one block each.
struct GroupedSegment {
  int64_t item = 0;         // index into the item list
  int64_t row_begin = 0;    // first row of K (a multiple of group_size)
  int64_t row_end = 0;      // one past the last row
  int rows_per_thread = 1;  // the options' value, or 1 when it does not divide group_size
  int64_t units = 0;        // (rows / rows_per_thread) * (N / 8) * (2 for fp32 output, else 1)
  int64_t block_begin = 0;  // first block of the grid
  int64_t block_end = 0;    // block_begin + ceil(units / (block_size * units_per_thread))
};

// Where every block of a grouped launch works (host side; tested on the CPU).
struct GroupedLayout {
  std::vector<GroupedSegment> segments;  // in item order, items' rows in order
  int64_t total_blocks = 0;              // grid size (< 2^31)
  int bucket_shift = 0;                  // blocks per bucket: 2^bucket_shift
  // bucket_first[j]: index of the segment holding block j << bucket_shift.
  std::vector<uint32_t> bucket_first;
  int64_t bytes_moved = 0;  // sum of the items' QuantShape::bytes_moved(out_dtype)
  Orientation orientation = Orientation::kKN;  // every item's result layout
};

// Whether the grouped launch implements `shape`: awq_gemm, either orientation. Other formats are
// refused by PlanGroupedLayout (INVALID_ARGUMENT naming the item) and are launched one layer at a
// time (LaunchDequantize).
bool GroupedImplements(const QuantShape& shape);

// Checks the items and the options and computes the layout; touches no memory behind the
// pointers (no device needed). INVALID_ARGUMENT naming the item ("item 3: N must be ...") for a
// shape ValidateShape refuses, a null or misaligned pointer, an orientation other than item 0's,
// or a group of 2^31 units or more;
// INVALID_ARGUMENT for bad options or a grid of 2^31 blocks or more. An empty list gives an
// empty layout. Thread-safe.
absl::StatusOr<GroupedLayout> PlanGroupedLayout(absl::Span<const GroupedItem> items,
                                                DType out_dtype, const GroupedOptions& options);

// The layout plus its descriptor table on the device, reusable for any number of launches.
// Movable, not copyable. Launch is thread-safe (it only reads the plan); the items' buffers must
// stay valid while a launch runs. The destructor frees the table without synchronizing anything
// (stream-ordered, on the device current at Create): every stream that launched the plan must
// have been synchronized (or have finished those launches) before it runs.
class GroupedPlan {
 public:
  // PlanGroupedLayout's errors; INTERNAL / RESOURCE_EXHAUSTED for CUDA failures. The table
  // (about 128 bytes per segment + 4 per bucket) comes from the current device's stream-ordered
  // pool and is uploaded on `stream`, asynchronously; Launch on any stream first waits for that
  // upload (cudaStreamWaitEvent), so Create never blocks the host. An empty list allocates
  // nothing.
  static absl::StatusOr<GroupedPlan> Create(absl::Span<const GroupedItem> items, DType out_dtype,
                                            const GroupedOptions& options = {},
                                            cudaStream_t stream = nullptr);

  GroupedPlan(GroupedPlan&&) noexcept;
  GroupedPlan& operator=(GroupedPlan&&) noexcept;
  ~GroupedPlan();

  // Enqueues the one kernel launch on `stream` (nothing for an empty list). INTERNAL with the
  // CUDA error on a launch failure; errors during execution surface on the stream.
  absl::Status Launch(cudaStream_t stream) const;

  const GroupedLayout& layout() const { return layout_; }
  DType out_dtype() const { return out_dtype_; }
  const GroupedOptions& options() const { return options_; }

 private:
  GroupedPlan() = default;
  struct DeviceTable;  // the uploaded descriptors (grouped_dequant.cu)

  GroupedLayout layout_;
  DType out_dtype_ = DType::kF16;
  GroupedOptions options_;
  std::unique_ptr<DeviceTable> table_;
};

// Dequantizes every item in one kernel launch on `stream`: the table is uploaded with
// cudaMallocAsync + cudaMemcpyAsync (pageable) on the stream and freed with cudaFreeAsync after
// the launch (the host copy may be released at return). Errors as GroupedPlan::Create and Launch.
// Asynchronous; thread-safe; not for stream capture (use a plan there). Per call it pays the
// layout, the allocation and the upload: 120-350 us more than a plan's Launch for 196 layers on
// the H200 (kernels/cuda/NOTES.md), so repeated calls should build a GroupedPlan once.
absl::Status LaunchGroupedDequantize(absl::Span<const GroupedItem> items, DType out_dtype,
                                     cudaStream_t stream, const GroupedOptions& options = {});

}  // namespace dequantd::cuda
