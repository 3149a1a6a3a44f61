// Inline packed input from a safetensors file (see packed_input.h).
#include "client/packed_input.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "formats/quant_tensors.h"
#include "formats/safetensors.h"
#include "kernels/awq_format.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;

// The header entry of tensor `name` in `file`, or NOT_FOUND.
absl::StatusOr<formats::QuantTensorRef> Find(const safetensors::MappedFile& file,
                                             const std::string& name) {
  const auto it = file.header().tensors.find(name);
  if (it == file.header().tensors.end()) {
    return absl::NotFoundError(absl::StrCat(file.path(), ": no tensor '", name, "'"));
  }
  return formats::QuantTensorRef{.file = file.path(), .entry = &it->second};
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
                                                        int64_t group_size, Format format) {
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> file =
      safetensors::MappedFile::Open(path);
  if (!file.ok()) return file.status();
  const FormatRow& row = FormatRowOf(format);
  std::vector<std::string> names;
  std::vector<formats::QuantTensorRef> refs;
  for (int r = 0; r < row.role_count; ++r) {
    names.push_back(prefix + std::string(row.roles[static_cast<size_t>(r)]));
    absl::StatusOr<formats::QuantTensorRef> ref = Find(**file, names.back());
    if (!ref.ok()) return ref.status();
    refs.push_back(*ref);
  }
  const absl::string_view layer = absl::StripSuffix(
      prefix, absl::string_view(row.role_separator.data(), row.role_separator.size()));
  absl::StatusOr<QuantShape> shape =
      formats::QuantShapeFromTensors(format, layer, refs, {.packed_u32 = true});
  if (!shape.ok()) return shape.status();

  v1::InlinePackedTensor out;
  out.set_scale_dtype(shape->scale_dtype == DType::kBF16  ? v1::DTYPE_BF16
                      : shape->scale_dtype == DType::kF32 ? v1::DTYPE_FP32   // fp8 rows, ct fp32
                      : shape->scale_dtype == DType::kU8  ? v1::DTYPE_UINT8  // mxfp4's E8M0
                                                          : v1::DTYPE_FP16);
  if (shape->experts != 1) out.set_experts(shape->experts);
  out.set_in_features(shape->K);
  out.set_out_features(shape->N);
  out.set_group_size(group_size == 0 ? shape->group_size : group_size);
  if (format == Format::kAwqGemm) {  // AWQ in fields 5-7, which servers before issue 21 read
    absl::Status status = CopyBytes(**file, names[awq::kQweight], out.mutable_qweight());
    if (status.ok()) status = CopyBytes(**file, names[awq::kQzeros], out.mutable_qzeros());
    if (status.ok()) status = CopyBytes(**file, names[awq::kScales], out.mutable_scales());
    if (!status.ok()) return status;
    return out;
  }
  out.set_format(std::string(row.name));
  for (int r = 0; r < row.role_count; ++r) {
    v1::RoleBytes* t = out.add_tensors();
    t->set_role(std::string(row.roles[static_cast<size_t>(r)]));
    if (absl::Status s = CopyBytes(**file, names[static_cast<size_t>(r)], t->mutable_data());
        !s.ok())
      return s;
  }
  return out;
}

}  // namespace dequantd
