// Inline packed input from a safetensors file (see packed_input.h).
#include "client/packed_input.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "formats/safetensors.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;

// The entry and bytes of a 2-D tensor `name` in `file`.
absl::StatusOr<const safetensors::TensorEntry*> Find2D(const safetensors::MappedFile& file,
                                                       const std::string& name) {
  const auto it = file.header().tensors.find(name);
  if (it == file.header().tensors.end()) {
    return absl::NotFoundError(absl::StrCat(file.path(), ": no tensor '", name, "'"));
  }
  if (it->second.shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": tensor '", name, "' has ",
                                                   it->second.shape.size(), " dims, expected 2"));
  }
  return &it->second;
}

absl::Status CopyBytes(const safetensors::MappedFile& file, const std::string& name,
                       std::string* out) {
  absl::StatusOr<absl::Span<const uint8_t>> bytes = file.TensorBytes(name);
  if (!bytes.ok()) return bytes.status();
  out->assign(reinterpret_cast<const char*>(bytes->data()), bytes->size());
  return absl::OkStatus();
}

// OK when the packed tensor `entry` (qweight or qzeros: eight 4-bit values per 32-bit word) is
// I32 or U32; otherwise INVALID_ARGUMENT naming the tensor and its dtype.
absl::Status CheckPackedDType(const std::string& path, const std::string& name,
                              const safetensors::TensorEntry& entry) {
  if (entry.dtype == "I32" || entry.dtype == "U32") return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "' has dtype ",
                                                 entry.dtype, ", expected I32 (or U32)"));
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
  absl::StatusOr<const safetensors::TensorEntry*> qweight_entry = Find2D(**file, qweight);
  if (!qweight_entry.ok()) return qweight_entry.status();
  absl::StatusOr<const safetensors::TensorEntry*> qzeros_entry = Find2D(**file, qzeros);
  if (!qzeros_entry.ok()) return qzeros_entry.status();
  absl::StatusOr<const safetensors::TensorEntry*> scales_entry = Find2D(**file, scales);
  if (!scales_entry.ok()) return scales_entry.status();
  if (absl::Status s = CheckPackedDType(path, qweight, **qweight_entry); !s.ok()) return s;
  if (absl::Status s = CheckPackedDType(path, qzeros, **qzeros_entry); !s.ok()) return s;

  v1::InlinePackedTensor out;
  const std::string& scale_dtype = (*scales_entry)->dtype;
  if (scale_dtype == "F16") {
    out.set_scale_dtype(v1::DTYPE_FP16);
  } else if (scale_dtype == "BF16") {
    out.set_scale_dtype(v1::DTYPE_BF16);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", scales, "' has dtype ",
                                                   scale_dtype, ", expected F16 or BF16"));
  }
  const int64_t K = (*qweight_entry)->shape[0];
  const int64_t N = (*scales_entry)->shape[1];
  const int64_t groups = (*scales_entry)->shape[0];
  if (group_size == 0) {
    if (groups <= 0 || K % groups != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": cannot derive group_size: '", scales, "' has ", groups,
                       " rows, which do not divide K = ", K, "; pass --group-size"));
    }
    group_size = K / groups;
  }
  out.set_in_features(K);
  out.set_out_features(N);
  out.set_group_size(group_size);
  absl::Status status = CopyBytes(**file, qweight, out.mutable_qweight());
  if (status.ok()) status = CopyBytes(**file, qzeros, out.mutable_qzeros());
  if (status.ok()) status = CopyBytes(**file, scales, out.mutable_scales());
  if (!status.ok()) return status;
  return out;
}

}  // namespace dequantd
