// Inline packed input from a safetensors file (see packed_input.h).
#include "client/packed_input.h"

#include <memory>
#include "absl/strings/string_view.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "formats/awq_tensors.h"
#include "formats/safetensors.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;

// The header entry of tensor `name` in `file`, or NOT_FOUND.
absl::StatusOr<formats::AwqTensorRef> Find(const safetensors::MappedFile& file,
                                           const std::string& name) {
  const auto it = file.header().tensors.find(name);
  if (it == file.header().tensors.end()) {
    return absl::NotFoundError(absl::StrCat(file.path(), ": no tensor '", name, "'"));
  }
  return formats::AwqTensorRef{.file = file.path(), .entry = &it->second};
}

absl::Status CopyBytes(const safetensors::MappedFile& file, const std::string& name,
                       std::string* out) {
  absl::StatusOr<absl::Span<const uint8_t>> bytes = file.TensorBytes(name);
  if (!bytes.ok()) return bytes.status();
  out->assign(reinterpret_cast<const char*>(bytes->data()), bytes->size());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::InlinePackedTensor> LoadInlinePacked(const std::string& path,
                                                        const std::string& prefix,
                                                        int64_t group_size) {
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> file =
      safetensors::MappedFile::Open(path);
  if (!file.ok()) return file.status();
  const std::string qweight = prefix + "qweight";
  const std::string qzeros = prefix + "qzeros";
  const std::string scales = prefix + "scales";
  absl::StatusOr<formats::AwqTensorRef> qweight_ref = Find(**file, qweight);
  if (!qweight_ref.ok()) return qweight_ref.status();
  absl::StatusOr<formats::AwqTensorRef> qzeros_ref = Find(**file, qzeros);
  if (!qzeros_ref.ok()) return qzeros_ref.status();
  absl::StatusOr<formats::AwqTensorRef> scales_ref = Find(**file, scales);
  if (!scales_ref.ok()) return scales_ref.status();
  const absl::string_view layer = absl::StripSuffix(prefix, ".");
  absl::StatusOr<AwqShape> shape = formats::AwqShapeFromTensors(layer, *qweight_ref, *qzeros_ref,
                                                                *scales_ref, {.packed_u32 = true});
  if (!shape.ok()) return shape.status();

  v1::InlinePackedTensor out;
  out.set_scale_dtype(shape->scale_dtype == DType::kBF16 ? v1::DTYPE_BF16 : v1::DTYPE_FP16);
  out.set_in_features(shape->K);
  out.set_out_features(shape->N);
  out.set_group_size(group_size == 0 ? shape->group_size : group_size);
  absl::Status status = CopyBytes(**file, qweight, out.mutable_qweight());
  if (status.ok()) status = CopyBytes(**file, qzeros, out.mutable_qzeros());
  if (status.ok()) status = CopyBytes(**file, scales, out.mutable_scales());
  if (!status.ok()) return status;
  return out;
}

}  // namespace dequantd
