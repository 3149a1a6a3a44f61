// Inline packed input from a safetensors file (see packed_input.h).
#include "client/packed_input.h"

#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "formats/quant_config.h"
#include "formats/quant_tensors.h"
#include "formats/safetensors.h"
#include "kernels/awq_format.h"
#include "kernels/gptq_format.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;
namespace fs = std::filesystem;

absl::string_view View(std::string_view s) { return absl::string_view(s.data(), s.size()); }

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

bool IsRegularFile(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// "'awq_gemm', 'gptq', ...": every FormatName, for messages.
std::string KnownFormats() {
  std::string out;
  for (const FormatRow& row : FormatRows())
    absl::StrAppend(&out, out.empty() ? "" : ", ", "'", View(row.name), "'");
  return out;
}

}  // namespace

absl::StatusOr<Format> ParseFormatFlag(const std::string& format_name) {
  Format f = Format::kAwqGemm;
  if (!ParseFormat(format_name, &f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--format '", format_name, "' is not known; known: ", KnownFormats()));
  }
  return f;
}

absl::StatusOr<PackedDeclaration> FindPackedDeclaration(const std::string& packed_path,
                                                        const std::string& config_path,
                                                        const std::string& format_name) {
  PackedDeclaration out;
  std::optional<Format> named;
  if (!format_name.empty()) {
    absl::StatusOr<Format> f = ParseFormatFlag(format_name);
    if (!f.ok()) return f.status();
    named = *f;
  }
  fs::path config = config_path;
  if (config.empty()) {
    const fs::path packed(packed_path);
    std::string stem = packed.filename().string();
    if (absl::EndsWith(stem, ".safetensors")) stem.resize(stem.size() - 12);
    for (const fs::path& candidate :
         {packed.parent_path() / (stem + ".config.json"), packed.parent_path() / "config.json"}) {
      if (!IsRegularFile(candidate)) continue;
      // A config found beside the file declares the format only when it has a
      // quantization_config (an unquantized model's config.json is no declaration).
      absl::StatusOr<nlohmann::json> object = formats::ReadJsonObject(candidate);
      if (object.ok() && !object->contains("quantization_config")) continue;
      config = candidate;
      break;
    }
  } else if (!IsRegularFile(config)) {
    return absl::NotFoundError(absl::StrCat("--config ", config.string(), ": not found"));
  }
  if (config.empty()) {
    out.format = named.value_or(Format::kAwqGemm);
    return out;
  }
  absl::StatusOr<QuantizationConfig> parsed = formats::ParseQuantizationConfig(config);
  if (!parsed.ok()) return parsed.status();
  if (named.has_value() && *named != parsed->format) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--format ", View(FormatName(*named)), " disagrees with ", config.string(),
        ", whose quantization_config declares format ", View(FormatName(parsed->format)),
        " (quant_method '", parsed->quant_method, "'); leave out --format or give --config"));
  }
  out.format = parsed->format;
  out.config = *std::move(parsed);
  out.config_path = config.string();
  return out;
}

absl::StatusOr<v1::InlinePackedTensor> LoadInlinePacked(const std::string& path,
                                                        const std::string& prefix,
                                                        int64_t group_size, Format format,
                                                        const QuantizationConfig* config) {
  const FormatRow& row = FormatRowOf(format);
  if (format == Format::kGptq && config == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     ": format gptq needs the checkpoint's quantization_config (--config, or a "
                     "config.json beside the file): its checkpoint_format (zeros stored minus one "
                     "or not) and bits are not in the tensors"));
  }
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> file =
      safetensors::MappedFile::Open(path);
  if (!file.ok()) return file.status();
  std::vector<std::string> names;
  std::vector<formats::QuantTensorRef> refs;
  for (int r = 0; r < row.role_count; ++r) {
    names.push_back(prefix + std::string(row.roles[static_cast<size_t>(r)]));
    absl::StatusOr<formats::QuantTensorRef> ref = Find(**file, names.back());
    if (!ref.ok() && (row.optional_roles >> r & 1u) != 0) {
      refs.push_back({.file = (*file)->path(), .entry = nullptr});  // an absent optional role
      continue;
    }
    if (!ref.ok()) return ref.status();
    refs.push_back(*ref);
  }
  const absl::string_view layer = absl::StripSuffix(prefix, View(row.role_separator));
  absl::StatusOr<QuantShape> shape =
      formats::QuantShapeFromTensors(format, layer, refs, {.packed_u32 = true, .config = config});
  if (!shape.ok()) return shape.status();
  if (group_size != 0 && group_size != shape->group_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": group size ", group_size, " disagrees with layer '", layer,
                     "' (format ", View(row.name), "), whose tensors",
                     config != nullptr ? " and config" : "", " give group_size ", shape->group_size,
                     " for K = ", shape->K, " (leave the group size out: it comes from the file)"));
  }
  // The shape the server makes of the request (server/rpc/request.cc): these fields, the flags of
  // the optional roles left out and GPTQ's checkpoint_format. A layer whose stored tensors need
  // more (compressed-tensors' strategy tensor: one int scale) would be read with other tensor
  // sizes: it cannot be sent inline, and is refused here naming the role.
  QuantShape sent = *shape;
  uint32_t absent_roles = 0;
  for (int r = 0; r < row.role_count; ++r)
    if (RoleAbsent(*shape, r)) absent_roles |= 1u << r;
  sent.format_flags = AbsentRoleFlags(format, absent_roles);
  if (format == Format::kGptq) sent.format_flags |= shape->format_flags & gptq::kZerosV1;
  for (int r = 0; r < row.role_count; ++r) {
    const TensorSpec stored = TensorSpecOf(*shape, r);
    const TensorSpec read = TensorSpecOf(sent, r);
    if (stored.dtype == read.dtype && stored.rows == read.rows && stored.cols == read.cols)
      continue;
    return absl::UnimplementedError(absl::StrCat(
        path, ": layer '", layer, "' (format ", View(row.name), ") cannot be sent inline: its ",
        View(stored.role), " holds (", stored.rows, ", ", stored.cols, ") ",
        View(DTypeName(stored.dtype)), ", and an inline request of its shape carries (", read.rows,
        ", ", read.cols, ") ", View(DTypeName(read.dtype)),
        " (the request cannot say how its scales are shared); serve its checkpoint and use "
        "--tensor"));
  }

  v1::InlinePackedTensor out;
  out.set_scale_dtype(shape->scale_dtype == DType::kBF16  ? v1::DTYPE_BF16
                      : shape->scale_dtype == DType::kF32 ? v1::DTYPE_FP32   // fp8 rows, ct fp32
                      : shape->scale_dtype == DType::kU8  ? v1::DTYPE_UINT8  // mxfp4's E8M0
                                                          : v1::DTYPE_FP16);
  if (shape->experts != 1) out.set_experts(shape->experts);
  out.set_in_features(shape->K);
  out.set_out_features(shape->N);
  out.set_group_size(shape->group_size);
  if (format == Format::kAwqGemm) {  // AWQ in fields 5-7, which servers before issue 21 read
    absl::Status status = CopyBytes(**file, names[awq::kQweight], out.mutable_qweight());
    if (status.ok()) status = CopyBytes(**file, names[awq::kQzeros], out.mutable_qzeros());
    if (status.ok()) status = CopyBytes(**file, names[awq::kScales], out.mutable_scales());
    if (!status.ok()) return status;
    return out;
  }
  out.set_format(std::string(row.name));
  if (shape->bits != 4) out.set_bits(shape->bits);
  if (shape->scale_block_rows > 1) out.set_scale_block_rows(shape->scale_block_rows);
  if (format == Format::kGptq) {
    out.set_checkpoint_format((shape->format_flags & gptq::kZerosV1) != 0 ? "gptq" : "gptq_v2");
  }
  for (int r = 0; r < row.role_count; ++r) {
    if (RoleAbsent(*shape, r)) continue;  // an optional role the layer does not store: left out
    v1::RoleBytes* t = out.add_tensors();
    t->set_role(std::string(row.roles[static_cast<size_t>(r)]));
    if (absl::Status s = CopyBytes(**file, names[static_cast<size_t>(r)], t->mutable_data());
        !s.ok())
      return s;
  }
  return out;
}

}  // namespace dequantd
