// Grouped dequantization (grouped_dequant.h): the layout on the host, the descriptor table, and
// the two kernels that run, for every item, v4_vec16's tile decode ((K, N) results) or the (N, K)
// tile kernel's block (dequant_kernels.cuh).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dequant_kernels.cuh"
#include "kernels/cuda/grouped_dequant.h"
#include "kernels/cuda/launch_helpers.cuh"

namespace dequantd::cuda {
namespace {

constexpr int64_t kMaxUnits = (int64_t{1} << 31) - 1;   // per segment: 32-bit unit indices
constexpr int64_t kMaxBlocks = (int64_t{1} << 31) - 1;  // gridDim.x limit
constexpr int kMinBucketShift = 5;                      // 32 blocks per bucket at least
constexpr int64_t kMaxBuckets = int64_t{1} << 16;       // grows the bucket before the table

int64_t LanesPerWord(DType out) { return out == DType::kF32 ? 2 : 1; }  // kVec16LanesPerWord

bool AlignedTo(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

absl::Status CheckOptions(const GroupedOptions& o) {
  if (o.block_size < 32 || o.block_size > kV4MaxBlockSize || o.block_size % 32 != 0)
    return absl::InvalidArgumentError(absl::StrCat("block_size must be a multiple of 32 in [32, ",
                                                   kV4MaxBlockSize, "], got ", o.block_size));
  const int r = o.rows_per_thread;
  if (r != 1 && r != 2 && r != 4 && r != 8 && r != 16)
    return absl::InvalidArgumentError(
        absl::StrCat("rows_per_thread must be 1, 2, 4, 8 or 16, got ", r));
  const int t = o.units_per_thread;
  if (t != 1 && t != 2 && t != 4)
    return absl::InvalidArgumentError(absl::StrCat("units_per_thread must be 1, 2 or 4, got ", t));
  return absl::OkStatus();
}

}  // namespace

bool GroupedImplements(const QuantShape& shape) { return shape.format == Format::kAwqGemm; }

namespace {

absl::Status CheckItem(const GroupedItem& item, DType out_dtype) {
  if (absl::Status st = ValidateShape(item.in.shape, out_dtype); !st.ok()) return st;
  if (item.in.shape.format != Format::kAwqGemm)
    return absl::FailedPreconditionError(
        "the grouped launch implements the awq_gemm format only (other formats launch per layer)");
  const int32_t* qweight = awq::Qweight(item.in);
  const int32_t* qzeros = awq::Qzeros(item.in);
  const void* scales = awq::Scales(item.in);
  if (qweight == nullptr || qzeros == nullptr || scales == nullptr || item.out == nullptr)
    return absl::InvalidArgumentError("qweight, qzeros, scales and out must be non-null");
  if (!AlignedTo(qweight, 4) || !AlignedTo(qzeros, 4))
    return absl::InvalidArgumentError("qweight and qzeros must be 4-byte aligned");
  if (!AlignedTo(scales, 16) || !AlignedTo(item.out, 16))
    return absl::InvalidArgumentError("scales and out must be 16-byte aligned");
  return absl::OkStatus();
}

// ---- Device side --------------------------------------------------------------------------------

// One segment as the kernel reads it: v4's parameters for the slab (pointers offset to its first
// row/group, kWords = 1) and the blocks that work on it.
struct SegmentDesc {
  Vec16Params v;           // (N, K) items: v.p alone, the whole layer's
  int64_t nk_tiles_k = 0;  // (N, K) items: tiles along K, AwqNkTileBlock's `segments`
  uint32_t block_begin = 0;
  uint32_t block_end = 0;
  uint32_t rows_per_thread = 1;  // the kernel's kRows, or 1
  DType scale_dtype = DType::kF16;
};
static_assert(std::is_trivially_copyable_v<SegmentDesc>);

// Units [first, end) at a stride of `stride`, one v4 tile each; the next tile's loads are issued
// before the current tile's stores.
template <DType kScale, DType kOut, int kRows>
__device__ __forceinline__ void DequantUnits(const Vec16Params& v, uint32_t u, uint32_t end,
                                             uint32_t stride) {
  using Policy = Vec16DefaultPolicy;
  if (u >= end) return;
  Vec16Tile<1, kRows> tile;
  LoadVec16Tile<kOut, 1, kRows, Policy>(v, u, tile);
  while (true) {
    const uint32_t next = u + stride;  // < 2^32: u < 2^31 and stride <= 512
    const bool more = next < end;
    Vec16Tile<1, kRows> next_tile;
    if (more) LoadVec16Tile<kOut, 1, kRows, Policy>(v, next, next_tile);
    StoreVec16Tile<kScale, kOut, 1, kRows, Policy>(v, tile);
    if (!more) break;
    tile = next_tile;
    u = next;
  }
}

template <DType kScale, DType kOut, int kRows>
__device__ __forceinline__ void DequantSegmentBlock(const Vec16Params& v, bool wide_rows,
                                                    uint32_t u, uint32_t end, uint32_t stride) {
  if constexpr (kRows == 1) {
    DequantUnits<kScale, kOut, 1>(v, u, end, stride);
  } else if (wide_rows) {
    DequantUnits<kScale, kOut, kRows>(v, u, end, stride);
  } else {
    DequantUnits<kScale, kOut, 1>(v, u, end, stride);
  }
}

// The segment whose [block_begin, block_end) holds block b: bucket_first gives the segment of the
// bucket's first block, and a short forward scan the rest (segments of fewer blocks than a bucket
// are the only reason to step). Uniform across the block. Both grouped kernels start here, after
// the programmatic-launch handshake.
__device__ __forceinline__ const SegmentDesc& SegmentOfBlock(
    const SegmentDesc* __restrict__ segments, const uint32_t* __restrict__ bucket_first,
    int bucket_shift, uint32_t b) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  uint32_t i = __ldg(bucket_first + (b >> bucket_shift));
  while (b >= __ldg(&segments[i].block_end)) ++i;
  return segments[i];
}

// Block b runs v4's units of its segment. All branches are uniform across the block.
template <DType kOut, int kRows>
__global__ void __launch_bounds__(kV4MaxBlockSize)
    GroupedVec16Kernel(const SegmentDesc* __restrict__ segments,
                       const uint32_t* __restrict__ bucket_first, int bucket_shift,
                       uint32_t units_per_thread) {
  const uint32_t b = blockIdx.x;
  const SegmentDesc& s = SegmentOfBlock(segments, bucket_first, bucket_shift, b);
  const Vec16Params v = s.v;
  const uint32_t units_per_block = blockDim.x * units_per_thread;
  const uint32_t first = (b - s.block_begin) * units_per_block;  // < units < 2^31
  const uint32_t end = min(v.units, first + units_per_block);
  const uint32_t u = first + threadIdx.x;
  const bool wide_rows = s.rows_per_thread == kRows;
  if (s.scale_dtype == DType::kF16) {
    DequantSegmentBlock<DType::kF16, kOut, kRows>(v, wide_rows, u, end, blockDim.x);
  } else {
    DequantSegmentBlock<DType::kBF16, kOut, kRows>(v, wide_rows, u, end, blockDim.x);
  }
}

// The (N, K) twin: block b runs AwqNkTileBlock (one tile per block) on its item's layer. Four
// blocks per SM, as the one-layer kernel gets (64 registers, no spill; NOTES.md).
template <DType kOut>
__global__ void __launch_bounds__(kAwqNkBlock, 4)
    GroupedAwqNkKernel(const SegmentDesc* __restrict__ segments,
                       const uint32_t* __restrict__ bucket_first, int bucket_shift,
                       uint32_t /*units_per_thread*/) {
  const uint32_t b = blockIdx.x;
  const SegmentDesc& s = SegmentOfBlock(segments, bucket_first, bucket_shift, b);
  const DequantParams& p = s.v.p;  // read where used (L1), not held in registers
  const int64_t block = b - s.block_begin;
  __shared__ AwqNkSharedTile tile;  // one for both scale dtypes
  if (s.scale_dtype == DType::kF16) {
    AwqNkTileBlock<DType::kF16, kOut>(p, s.nk_tiles_k, 1, block, tile);
  } else {
    AwqNkTileBlock<DType::kBF16, kOut>(p, s.nk_tiles_k, 1, block, tile);
  }
}

using GroupedKernel = void (*)(const SegmentDesc*, const uint32_t*, int, uint32_t);

template <DType kOut>
GroupedKernel KernelForRows(int rows) {
  switch (rows) {
    case 1:
      return GroupedVec16Kernel<kOut, 1>;
    case 2:
      return GroupedVec16Kernel<kOut, 2>;
    case 4:
      return GroupedVec16Kernel<kOut, 4>;
    case 8:
      return GroupedVec16Kernel<kOut, 8>;
    default:
      return GroupedVec16Kernel<kOut, 16>;
  }
}

GroupedKernel KernelFor(DType out, int rows, Orientation orientation) {
  if (orientation == Orientation::kNK) {
    switch (out) {
      case DType::kF16:
        return GroupedAwqNkKernel<DType::kF16>;
      case DType::kBF16:
        return GroupedAwqNkKernel<DType::kBF16>;
      default:
        return GroupedAwqNkKernel<DType::kF32>;
    }
  }
  switch (out) {
    case DType::kF16:
      return KernelForRows<DType::kF16>(rows);
    case DType::kBF16:
      return KernelForRows<DType::kBF16>(rows);
    default:
      return KernelForRows<DType::kF32>(rows);
  }
}

// ---- Host side ----------------------------------------------------------------------------------

std::vector<SegmentDesc> MakeDescriptors(absl::Span<const GroupedItem> items,
                                         const GroupedLayout& layout, DType out_dtype) {
  const int64_t lanes = LanesPerWord(out_dtype);
  std::vector<SegmentDesc> descs;
  descs.reserve(layout.segments.size());
  for (const GroupedSegment& seg : layout.segments) {
    const QuantView& in = items[seg.item].in;
    const QuantShape& shape = in.shape;
    const int64_t words_per_row = shape.N / awq::kPackFactor;
    const int64_t g0 = seg.row_begin / shape.group_size;
    SegmentDesc d{};
    DequantParams& p = d.v.p;
    d.block_begin = static_cast<uint32_t>(seg.block_begin);
    d.block_end = static_cast<uint32_t>(seg.block_end);
    d.scale_dtype = shape.scale_dtype;
    if (layout.orientation == Orientation::kNK) {  // the whole layer, as LaunchAwqNkTiles
      p.qweight = reinterpret_cast<const uint32_t*>(awq::Qweight(in));
      p.qzeros = reinterpret_cast<const uint32_t*>(awq::Qzeros(in));
      p.scales = awq::Scales(in);
      p.out = items[seg.item].out;
      p.K = shape.K;
      p.N = shape.N;
      p.words_per_row = words_per_row;
      p.group_size = shape.group_size;
      p.nk = true;
      d.nk_tiles_k = AwqNkTilesAlongK(shape.K, out_dtype);
      d.rows_per_thread = 1;
      descs.push_back(d);
      continue;
    }
    p.qweight = reinterpret_cast<const uint32_t*>(awq::Qweight(in)) + seg.row_begin * words_per_row;
    p.qzeros = reinterpret_cast<const uint32_t*>(awq::Qzeros(in)) + g0 * words_per_row;
    p.scales = static_cast<const uint16_t*>(awq::Scales(in)) + g0 * shape.N;
    p.out =
        static_cast<char*>(items[seg.item].out) + seg.row_begin * shape.N * DTypeSize(out_dtype);
    p.K = seg.row_end - seg.row_begin;
    p.N = shape.N;
    p.words_per_row = words_per_row;
    p.group_size = shape.group_size;
    d.v.units = static_cast<uint32_t>(seg.units);
    d.v.chunks_per_row = static_cast<uint32_t>(words_per_row);  // kWords = 1
    d.v.by_chunks = FastDivmod::Make(static_cast<uint32_t>(words_per_row * lanes));
    d.v.by_row_blocks =
        FastDivmod::Make(static_cast<uint32_t>(shape.group_size / seg.rows_per_thread));
    d.rows_per_thread = static_cast<uint32_t>(seg.rows_per_thread);
    descs.push_back(d);
  }
  return descs;
}

// The table's bytes: descriptors, then the bucket table (16-byte aligned).
struct HostTable {
  std::vector<uint8_t> bytes;
  size_t buckets_at = 0;
};

HostTable MakeHostTable(absl::Span<const GroupedItem> items, const GroupedLayout& layout,
                        DType out_dtype) {
  const std::vector<SegmentDesc> descs = MakeDescriptors(items, layout, out_dtype);
  HostTable t;
  const size_t descs_bytes = descs.size() * sizeof(SegmentDesc);
  t.buckets_at = (descs_bytes + 15) / 16 * 16;
  t.bytes.resize(t.buckets_at + layout.bucket_first.size() * sizeof(uint32_t));
  std::memcpy(t.bytes.data(), descs.data(), descs_bytes);
  std::memcpy(t.bytes.data() + t.buckets_at, layout.bucket_first.data(),
              layout.bucket_first.size() * sizeof(uint32_t));
  return t;
}

absl::Status LaunchKernel(const GroupedLayout& layout, DType out_dtype,
                          const GroupedOptions& options, const void* table, size_t buckets_at,
                          cudaStream_t stream) {
  if (layout.total_blocks == 0) return absl::OkStatus();
  const auto* base = static_cast<const uint8_t*>(table);
  const bool nk = layout.orientation == Orientation::kNK;
  DEQUANTD_CUDA_RETURN_IF_ERROR(LaunchProgrammatic(
      KernelFor(out_dtype, options.rows_per_thread, layout.orientation), layout.total_blocks,
      nk ? kAwqNkBlock : options.block_size, options.programmatic_launch, stream,
      reinterpret_cast<const SegmentDesc*>(base),
      reinterpret_cast<const uint32_t*>(base + buckets_at), layout.bucket_shift,
      static_cast<uint32_t>(options.units_per_thread)));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GroupedLayout> PlanGroupedLayout(absl::Span<const GroupedItem> items,
                                                DType out_dtype, const GroupedOptions& options) {
  if (absl::Status st = CheckOptions(options); !st.ok()) return st;
  const int64_t lanes = LanesPerWord(out_dtype);
  const int64_t units_per_block = int64_t{options.block_size} * options.units_per_thread;
  GroupedLayout layout;
  if (!items.empty()) layout.orientation = items[0].in.shape.orientation;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto item_error = [i](const absl::Status& st) {
      return absl::InvalidArgumentError(absl::StrCat("item ", i, ": ", st.message()));
    };
    if (absl::Status st = CheckItem(items[i], out_dtype); !st.ok()) return item_error(st);
    const QuantShape& shape = items[i].in.shape;
    if (shape.orientation != layout.orientation) {
      return item_error(absl::InvalidArgumentError(
          absl::StrCat("orientation ", std::string(OrientationName(shape.orientation)),
                       " differs from item 0's ", std::string(OrientationName(layout.orientation)),
                       " (one grouped launch writes one orientation)")));
    }
    if (layout.orientation == Orientation::kNK) {
      // One segment, one block per tile.
      const int64_t tiles =
          AwqNkBands(shape.N / awq::kPackFactor) * AwqNkTilesAlongK(shape.K, out_dtype);
      GroupedSegment seg;
      seg.item = static_cast<int64_t>(i);
      seg.row_begin = 0;
      seg.row_end = shape.K;
      seg.rows_per_thread = 1;
      seg.units = tiles;
      seg.block_begin = layout.total_blocks;
      seg.block_end = seg.block_begin + tiles;
      layout.total_blocks = seg.block_end;
      if (layout.total_blocks > kMaxBlocks)
        return absl::InvalidArgumentError("the items need 2^31 blocks or more ((N, K) tiles)");
      layout.segments.push_back(seg);
      layout.bytes_moved += shape.bytes_moved(out_dtype);
      continue;
    }
    const int rows = shape.group_size % options.rows_per_thread == 0 ? options.rows_per_thread : 1;
    const int64_t units_per_group = shape.group_size / rows * (shape.N / awq::kPackFactor) * lanes;
    if (units_per_group > kMaxUnits)
      return item_error(absl::InvalidArgumentError(
          absl::StrCat("group_size * N / 8 / rows_per_thread, x2 for fp32 output, must be below "
                       "2^31, got ",
                       units_per_group)));
    const int64_t groups_per_segment = kMaxUnits / units_per_group;
    for (int64_t g0 = 0; g0 < shape.groups(); g0 += groups_per_segment) {
      const int64_t groups = std::min(groups_per_segment, shape.groups() - g0);
      GroupedSegment seg;
      seg.item = static_cast<int64_t>(i);
      seg.row_begin = g0 * shape.group_size;
      seg.row_end = seg.row_begin + groups * shape.group_size;
      seg.rows_per_thread = rows;
      seg.units = groups * units_per_group;
      seg.block_begin = layout.total_blocks;
      seg.block_end = seg.block_begin + (seg.units + units_per_block - 1) / units_per_block;
      layout.total_blocks = seg.block_end;
      if (layout.total_blocks > kMaxBlocks)
        return absl::InvalidArgumentError(absl::StrCat(
            "the items need 2^31 blocks or more (block_size * units_per_thread = ", units_per_block,
            ")"));
      layout.segments.push_back(seg);
    }
    layout.bytes_moved += shape.bytes_moved(out_dtype);
  }
  layout.bucket_shift = kMinBucketShift;
  while (((layout.total_blocks - 1) >> layout.bucket_shift) + 1 > kMaxBuckets)
    ++layout.bucket_shift;
  const int64_t buckets =
      layout.total_blocks == 0 ? 0 : ((layout.total_blocks - 1) >> layout.bucket_shift) + 1;
  layout.bucket_first.reserve(static_cast<size_t>(buckets));
  size_t seg = 0;
  for (int64_t j = 0; j < buckets; ++j) {
    const int64_t block = j << layout.bucket_shift;
    while (block >= layout.segments[seg].block_end) ++seg;
    layout.bucket_first.push_back(static_cast<uint32_t>(seg));
  }
  return layout;
}

struct GroupedPlan::DeviceTable {
  void* memory = nullptr;          // from the device's stream-ordered pool
  cudaEvent_t uploaded = nullptr;  // recorded after the upload, on the stream Create used
  int device = 0;
  size_t buckets_at = 0;
  ~DeviceTable() {
    if (memory == nullptr && uploaded == nullptr) return;
    // Freed without synchronizing anything (unlike cudaFree, which waits for the whole device):
    // the holder has synchronized every stream that launched the plan (the class's contract).
    int current = 0;
    cudaGetDevice(&current);
    if (current != device) cudaSetDevice(device);
    if (uploaded != nullptr) cudaEventDestroy(uploaded);
    if (memory != nullptr) cudaFreeAsync(memory, cudaStreamPerThread);
    if (current != device) cudaSetDevice(current);
  }
};

GroupedPlan::GroupedPlan(GroupedPlan&&) noexcept = default;
GroupedPlan& GroupedPlan::operator=(GroupedPlan&&) noexcept = default;
GroupedPlan::~GroupedPlan() = default;

absl::StatusOr<GroupedPlan> GroupedPlan::Create(absl::Span<const GroupedItem> items,
                                                DType out_dtype, const GroupedOptions& options,
                                                cudaStream_t stream) {
  absl::StatusOr<GroupedLayout> layout = PlanGroupedLayout(items, out_dtype, options);
  if (!layout.ok()) return layout.status();
  GroupedPlan plan;
  plan.out_dtype_ = out_dtype;
  plan.options_ = options;
  plan.table_ = std::make_unique<DeviceTable>();
  if (layout->total_blocks > 0) {
    DeviceTable& table = *plan.table_;
    const HostTable host = MakeHostTable(items, *layout, out_dtype);
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetDevice(&table.device));
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&table.memory, host.bytes.size(), stream));
    // Pageable source: cudaMemcpyAsync returns once the bytes are staged, so `host` may go.
    absl::Status st = CudaStatus(cudaMemcpyAsync(table.memory, host.bytes.data(), host.bytes.size(),
                                                 cudaMemcpyHostToDevice, stream),
                                 "cudaMemcpyAsync(table)", __FILE__, __LINE__);
    if (st.ok()) {
      st.Update(CudaStatus(cudaEventCreateWithFlags(&table.uploaded, cudaEventDisableTiming),
                           "cudaEventCreateWithFlags", __FILE__, __LINE__));
    }
    if (st.ok()) {
      st.Update(CudaStatus(cudaEventRecord(table.uploaded, stream), "cudaEventRecord(uploaded)",
                           __FILE__, __LINE__));
    }
    if (!st.ok()) {
      cudaFreeAsync(table.memory, stream);  // after whatever of the upload was enqueued
      table.memory = nullptr;
      return st;
    }
    table.buckets_at = host.buckets_at;
  }
  plan.layout_ = *std::move(layout);
  return plan;
}

absl::Status GroupedPlan::Launch(cudaStream_t stream) const {
  if (table_ == nullptr) return absl::FailedPreconditionError("moved-from GroupedPlan");
  if (table_->uploaded != nullptr) {
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, table_->uploaded, 0));
  }
  return LaunchKernel(layout_, out_dtype_, options_, table_->memory, table_->buckets_at, stream);
}

absl::Status LaunchGroupedDequantize(absl::Span<const GroupedItem> items, DType out_dtype,
                                     cudaStream_t stream, const GroupedOptions& options) {
  absl::StatusOr<GroupedLayout> layout = PlanGroupedLayout(items, out_dtype, options);
  if (!layout.ok()) return layout.status();
  if (layout->total_blocks == 0) return absl::OkStatus();
  const HostTable host = MakeHostTable(items, *layout, out_dtype);
  void* table = nullptr;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&table, host.bytes.size(), stream));
  // Pageable source: cudaMemcpyAsync returns once the bytes are staged, so `host` may go.
  absl::Status st = CudaStatus(
      cudaMemcpyAsync(table, host.bytes.data(), host.bytes.size(), cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync(table)", __FILE__, __LINE__);
  if (st.ok()) st.Update(LaunchKernel(*layout, out_dtype, options, table, host.buckets_at, stream));
  st.Update(CudaStatus(cudaFreeAsync(table, stream), "cudaFreeAsync(table)", __FILE__, __LINE__));
  return st;
}

}  // namespace dequantd::cuda
