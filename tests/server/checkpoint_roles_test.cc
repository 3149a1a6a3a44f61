// The checkpoint store's one rule on roles, for every format of the registry: a tensor named
// <prefix><sep><role> for a role of the format belongs to layer <prefix>, and a layer lacking a
// required role (its anchor included) is FAILED_PRECONDITION naming the file, a tensor of the
// layer and the role missing. Each format's checkpoint is one vector case of tests/data/formats
// (AWQ: written here) holding a complete layer (model.layers.1.*) and, beside it, one tensor of
// each other role on its own (model.layers.0.*); roles that unquantized tensors are also called
// (FormatRow::plain_name_roles, the FP8 formats' `.weight`) stay plain tensors.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "formats/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/format_registry.h"
#include "server/model/checkpoint.h"
#include "tests/server/format_vectors.h"

namespace dequantd {
namespace {

namespace fs = std::filesystem;
using testing::MakeConfigDir;
using testing::ReadText;
using testing::VectorDir;

struct Tensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// One case of a format: its config.json text and its layer's tensors by role name (`layer` is
// the prefix without the separator).
struct FormatCase {
  std::string config;
  std::string layer;
  std::map<std::string, Tensor> by_role;
};

// AWQ: K = 128, N = 16, G = 128 (zero bytes: the rule looks at names, the shapes must fit).
FormatCase AwqCase() {
  FormatCase c;
  c.config = R"({"quantization_config":{"quant_method":"awq","bits":4,"group_size":128,)"
             R"("zero_point":true,"version":"gemm"}})";
  c.layer = "model.layers.0.mlp.down_proj";
  c.by_role["qweight"] = {"I32", {128, 2}, std::vector<uint8_t>(128 * 2 * 4)};
  c.by_role["qzeros"] = {"I32", {1, 2}, std::vector<uint8_t>(2 * 4)};
  c.by_role["scales"] = {"F16", {1, 16}, std::vector<uint8_t>(16 * 2)};
  return c;
}

// The layer of vector case `name` of tests/data/formats/<dir>: every tensor <layer><sep><role>.
FormatCase VectorCase(const FormatRow& row, const char* dir, const std::string& name,
                      const std::string& layer) {
  FormatCase c;
  c.config = ReadText(VectorDir(dir) / (name + ".config.json"));
  c.layer = layer;
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> file =
      safetensors::MappedFile::Open((VectorDir(dir) / (name + ".safetensors")).string());
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return c;
  for (int r = 0; r < row.role_count; ++r) {
    const std::string role(row.roles[static_cast<size_t>(r)]);
    const std::string tensor = absl::StrCat(layer, std::string(row.role_separator), role);
    const auto it = (*file)->header().tensors.find(tensor);
    if (it == (*file)->header().tensors.end()) continue;
    c.by_role[role] = {it->second.dtype, it->second.shape, testing::TensorOf(**file, tensor)};
  }
  return c;
}

FormatCase CaseOf(const FormatRow& row) {
  switch (row.format) {
    case Format::kAwqGemm:
      return AwqCase();
    case Format::kGptq:
      return VectorCase(row, "gptq", "gptq_4bit_g64_asym_v2", "model.layers.0.mlp.down_proj");
    case Format::kCompressedTensors:  // every role stored, weight_zero_point and g_idx included
      return VectorCase(row, "compressed_tensors", "ct_int4_g32_asym_actorder_bf16",
                        "model.layers.0.mlp.down_proj");
    case Format::kFp8Block:
      return VectorCase(row, "fp8_block", "fp8_block_scalef32_136x144",
                        "model.layers.0.mlp.down_proj");
    case Format::kCompressedTensorsFp8:
      return VectorCase(row, "compressed_tensors", "ct_fp8_channel_bf16",
                        "model.layers.0.mlp.down_proj");
    case Format::kMxfp4:
      return VectorCase(row, "mxfp4", "mxfp4_gptoss_e2", "model.layers.0.mlp.experts.gate_up_proj");
  }
  ADD_FAILURE() << "no case for format " << row.name;
  return {};
}

// A checkpoint of `c`'s config holding its complete layer renamed to model.layers.1.* and, of
// layer model.layers.0.*, only the tensor of role `alone`.
fs::path CheckpointWith(const FormatRow& row, const FormatCase& c, const std::string& alone) {
  const fs::path dir = MakeConfigDir(c.config);
  if (dir.empty()) return dir;
  std::string complete = c.layer;
  complete.replace(complete.find("layers.0."), 9, "layers.1.");
  const std::string sep(row.role_separator);
  std::vector<safetensors::TensorToWrite> out;
  for (const auto& [role, t] : c.by_role) {
    out.push_back({absl::StrCat(complete, sep, role), t.dtype, t.shape, t.bytes});
    if (role == alone) out.push_back({absl::StrCat(c.layer, sep, role), t.dtype, t.shape, t.bytes});
  }
  EXPECT_TRUE(safetensors::WriteFile((dir / "model.safetensors").string(), out).ok());
  return dir;
}

TEST(CheckpointRolesTest, TensorOfARoleWhoseLayerHasNoAnchorIsFailedPreconditionInEveryFormat) {
  for (const FormatRow& row : FormatRows()) {
    const FormatCase c = CaseOf(row);
    const std::string anchor(row.roles[static_cast<size_t>(row.anchor_role)]);
    const std::string sep(row.role_separator);
    ASSERT_EQ(c.by_role.size(), static_cast<size_t>(row.role_count)) << row.name;
    int orphans_checked = 0;
    for (int r = 0; r < row.role_count; ++r) {
      const std::string role(row.roles[static_cast<size_t>(r)]);
      if (r == row.anchor_role) continue;
      SCOPED_TRACE(absl::StrCat(std::string(row.name), " ", role));
      const fs::path dir = CheckpointWith(row, c, role);
      absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
      const std::string tensor = absl::StrCat(c.layer, sep, role);
      if ((row.plain_name_roles >> r & 1u) != 0) {
        // An unquantized tensor's name: a plain tensor beside the complete layer.
        ASSERT_TRUE(ckpt.ok()) << ckpt.status();
        EXPECT_EQ((*ckpt)->layers().size(), 1u);
        EXPECT_NE((*ckpt)->FindRawTensor(tensor), nullptr);
      } else {
        EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_EQ(
            ckpt.status().message(),
            absl::StrCat((dir / "model.safetensors").string(), ": tensor '", tensor, "' (layer '",
                         c.layer, "', format ", std::string(row.name), "): the layer has no ",
                         anchor, " tensor: '", c.layer, sep, anchor, "' is missing"));
        ++orphans_checked;
      }
      fs::remove_all(dir);
    }
    // Every role but the anchor and the plain names marks a layer: the FP8 formats have none
    // (their only other role is the plain `.weight`); AWQ and GPTQ keep `.scales` plain.
    int plain = 0;
    for (int r = 0; r < row.role_count; ++r) plain += (row.plain_name_roles >> r & 1u) != 0;
    const bool fp8 = row.format == Format::kFp8Block || row.format == Format::kCompressedTensorsFp8;
    const bool scales_plain = row.format == Format::kAwqGemm || row.format == Format::kGptq;
    EXPECT_EQ(plain, fp8 || scales_plain ? 1 : 0) << row.name;
    EXPECT_EQ(orphans_checked, row.role_count - 1 - plain) << row.name;
  }
}

// AutoAWQ's ScaledActivation (Falcon, MPT, BLOOM) saves `<act>.scales` (1-D fp16) beside the
// quantized layers: a plain tensor, served as stored, and the checkpoint loads.
TEST(CheckpointRolesTest, AwqActivationScalesArePlainTensors) {
  const FormatRow& row = FormatRowOf(Format::kAwqGemm);
  const FormatCase c = CaseOf(row);
  const fs::path dir = MakeConfigDir(c.config);
  ASSERT_FALSE(dir.empty());
  std::vector<safetensors::TensorToWrite> out;
  for (const auto& [role, t] : c.by_role) {
    out.push_back({absl::StrCat(c.layer, ".", role), t.dtype, t.shape, t.bytes});
  }
  const std::vector<uint8_t> act(2 * 64, 0x3C);  // 64 fp16 values of 1.0039...
  out.push_back({"transformer.h.0.mlp.act.scales", "F16", {64}, act});
  ASSERT_TRUE(safetensors::WriteFile((dir / "model.safetensors").string(), out).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->layers().size(), 1u);
  const RawTensor* raw = (*ckpt)->FindRawTensor("transformer.h.0.mlp.act.scales");
  ASSERT_NE(raw, nullptr);
  EXPECT_EQ(raw->shape, std::vector<int64_t>{64});
  fs::remove_all(dir);
}

// MXFP4 (the case of the issue): <prefix>_scales without <prefix>_blocks beside a complete
// checkpoint of both projections is refused, not served as a plain tensor.
TEST(CheckpointRolesTest, Mxfp4ScalesWithoutBlocksIsFailedPrecondition) {
  const fs::path dir = MakeConfigDir(ReadText(VectorDir("mxfp4") / "mxfp4_gptoss_e2.config.json"));
  ASSERT_FALSE(dir.empty());
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> file =
      safetensors::MappedFile::Open((VectorDir("mxfp4") / "mxfp4_gptoss_e2.safetensors").string());
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::vector<uint8_t>> keep;
  std::vector<safetensors::TensorToWrite> out;
  for (const auto& [name, entry] : (*file)->header().tensors) {
    if (absl::StartsWith(name, "expected.")) continue;
    keep.push_back(testing::TensorOf(**file, name));
    out.push_back({name, entry.dtype, entry.shape, keep.back()});
    if (name == "model.layers.0.mlp.experts.down_proj_scales") {
      keep.push_back(testing::TensorOf(**file, name));
      out.push_back(
          {"model.layers.0.mlp.experts.up_proj_scales", entry.dtype, entry.shape, keep.back()});
    }
  }
  ASSERT_TRUE(safetensors::WriteFile((dir / "model.safetensors").string(), out).ok());
  const absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ckpt.status().message(),
            (dir / "model.safetensors").string() +
                ": tensor 'model.layers.0.mlp.experts.up_proj_scales' (layer "
                "'model.layers.0.mlp.experts.up_proj', format mxfp4): the layer has no blocks "
                "tensor: 'model.layers.0.mlp.experts.up_proj_blocks' is missing");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dequantd
