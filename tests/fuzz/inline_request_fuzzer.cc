// Fuzzes the inline request path: the input is a serialized dequant.v1.DequantizeRequest (as
// gRPC would hand it to the handler); when it parses, InlineTensor::FromProto validates it
// (with a 1 MiB limit, like a small --max-request-bytes), and an accepted request is dequantized
// by the CPU path and the reference, which must agree bit for bit.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/dequant.h"
#include "server/rpc/request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dequantd;
  dequant::v1::DequantizeRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<DType> out = OutputDTypeFromProto(request.output_dtype());
  if (!out.ok()) return 0;
  absl::StatusOr<InlineTensor> tensor = InlineTensor::FromProto(request.packed(), int64_t{1} << 20);
  if (!tensor.ok()) return 0;
  const QuantShape& shape = tensor->view().shape;
  if (!ValidateShape(shape, *out).ok()) std::abort();  // FromProto accepted a bad shape
  const size_t bytes = static_cast<size_t>(shape.output_bytes(*out));
  if (bytes > (size_t{16} << 20)) return 0;  // keep each run fast
  std::vector<uint8_t> fast(bytes), reference(bytes);
  const int64_t rows = shape.result_rows();  // every row of the result (E * K or E * N)
  if (!DequantizeCpu(tensor->view(), *out, 0, rows, fast.data(), 2).ok()) std::abort();
  if (!DequantizeReference(tensor->view(), *out, 0, rows, reference.data()).ok()) std::abort();
  if (std::memcmp(fast.data(), reference.data(), bytes) != 0) std::abort();
  return 0;
}
