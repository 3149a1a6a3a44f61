// Parsing and validating the fields of a dequant.v1 DequantizeRequest into kernel types, before
// any work. Each error is INVALID_ARGUMENT (or RESOURCE_EXHAUSTED for a size limit) with a
// message naming the request field, e.g. "packed.qweight has 100 bytes, expected 128 ...".
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dequant/v1/dequant.pb.h"
#include "kernels/dequant.h"

namespace dequantd {

// Payload bytes per response message: requested 0 -> `default_bytes`; a positive request is
// clamped to [kMinChunkBytes, kMaxChunkBytes]; a negative one is INVALID_ARGUMENT naming
// "chunk_bytes". kMaxChunkBytes is 4 MiB - 4 KiB (4190208, a multiple of 4096 and so of every
// element size): a DequantizeResponse carrying it plus its offset and field tags stays within
// 4 MiB, the default receive limit of gRPC clients (a 4 MiB payload would be 4194309 bytes).
inline constexpr int64_t kMinChunkBytes = int64_t{64} << 10;
inline constexpr int64_t kMaxChunkBytes = (int64_t{4} << 20) - (int64_t{4} << 10);
absl::StatusOr<int64_t> EffectiveChunkBytes(int64_t requested, int64_t default_bytes);

// A validated byte range of a result: bytes [offset, offset + length) of the row-major result.
struct ResultRange {
  int64_t offset = 0;  // bytes, a multiple of the element size, < the result's size
  int64_t length = 0;  // bytes, >= 1, a multiple of the element size
};

// The range a DequantizeRequest asks for (its `offset` and `length` fields, in bytes) of a result
// of `total_bytes` bytes whose elements are `element_bytes` long: offset 0 and length 0 = the whole
// result, length 0 = to the end. INVALID_ARGUMENT naming "offset" or "length": negative, not a
// multiple of element_bytes, offset >= total_bytes, offset + length > total_bytes.
absl::StatusOr<ResultRange> RequestedRange(int64_t offset, int64_t length, int64_t total_bytes,
                                           int64_t element_bytes);

// output_dtype: UNSPECIFIED -> fp16; FP16, BF16, FP32 accepted; anything else (INT32, unknown
// numbers) -> INVALID_ARGUMENT naming "output_dtype".
absl::StatusOr<DType> OutputDTypeFromProto(dequant::v1::DType dtype);

// orientation: UNSPECIFIED -> `format`'s own (FormatRow::default_orientation); KN, NK accepted;
// unknown numbers -> INVALID_ARGUMENT naming "orientation".
absl::StatusOr<Orientation> OrientationFromProto(dequant::v1::Orientation orientation,
                                                 Format format);
// Kernel orientation -> wire orientation (KN or NK).
dequant::v1::Orientation OrientationToProto(Orientation orientation);

// Kernel dtype -> wire dtype.
dequant::v1::DType DTypeToProto(DType dtype);

// What the one reply of a call into a region carries (docs/architecture.md "Shared-memory
// regions", "The reply").
enum class RegionReplyKind {
  kHeader,        // Dequantize: `header`, its one result's
  kLayerHeaders,  // DequantizeLayers, REGION_REPLY_HEADERS (the default): `layer_headers`
  kSummary,       // DequantizeLayers, REGION_REPLY_SUMMARY: `region_summary` alone
};

// DequantizeLayersRequest.region_reply for a request that has (`has_output_region`) an output
// region or not: UNSPECIFIED and HEADERS -> kLayerHeaders, SUMMARY -> kSummary; without an
// output region only UNSPECIFIED is accepted (the value is then meaningless: streamed results
// carry their headers). INVALID_ARGUMENT naming "region_reply" otherwise (an unknown number, or a
// value set on a streamed call).
absl::StatusOr<RegionReplyKind> RegionReplyFromProto(dequant::v1::RegionReply reply,
                                                     bool has_output_region);

// The inline packed tensors of a request as a QuantView. The view points into the
// request's bytes when they are 4-byte aligned, otherwise into aligned copies owned here: the
// InlinePackedTensor must outlive this object. Movable (the view stays valid).
class InlineTensor {
 public:
  // Checks, in order: "packed.format" names a format (empty = awq_gemm); the tensors come either
  // by role in "packed.tensors" (each role of the format once, an optional role at most once;
  // no other role) or, for AWQ, in
  // packed.qweight/qzeros/scales, not both; total bytes of the tensors <= `max_request_bytes`
  // (RESOURCE_EXHAUSTED naming "max_request_bytes"); scale_dtype UNSPECIFIED (-> fp16), FP16 or
  // BF16 ("packed.scale_dtype"); the shape (K = in_features, N = out_features, G = group_size
  // with -1 meaning K) through ValidateShape ("packed: " + its message naming K, N or
  // group_size); the byte length of each role ("packed.qweight has 100 bytes, expected 128")
  // against the shape exactly (an optional role given no bytes is not stored:
  // FormatRow::absent_role_flags; "packed.scale_block_rows" only for compressed_tensors_fp8). All
  // errors INVALID_ARGUMENT otherwise.
  static absl::StatusOr<InlineTensor> FromProto(const dequant::v1::InlinePackedTensor& packed,
                                                int64_t max_request_bytes);
  // FromProto after the tensors were found: `parts` holds each role's bytes in role order (the
  // message's format and shape fields are used, its bytes fields ignored); the bytes must
  // outlive this object.
  static absl::StatusOr<InlineTensor> FromParts(const dequant::v1::InlinePackedTensor& shape,
                                                absl::Span<const std::string_view> parts,
                                                int64_t max_request_bytes);

  const QuantView& view() const { return view_; }
  bool copied() const { return !storage_.empty(); }  // bytes were realigned into storage

 private:
  InlineTensor() = default;
  QuantView view_;
  std::vector<int32_t> storage_;  // the parts in role order, when the request was misaligned
};

}  // namespace dequantd
