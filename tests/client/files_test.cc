// dequantctl's file handling: output files by extension, inline input from safetensors, and the
// benchmark request parser and table.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "client/commands.h"
#include "client/output_file.h"
#include "client/packed_input.h"
#include "client/table.h"
#include "formats/npy.h"
#include "formats/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/test_dir.h"

namespace dequantd {
namespace {

namespace fs = std::filesystem;

using client_test::TempPath;

template <typename T>
absl::Span<const uint8_t> Bytes(const std::vector<T>& v) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T));
}

v1::DequantizeHeader Header(int64_t K, int64_t N, v1::DType dtype, int64_t element_bytes) {
  v1::DequantizeHeader h;
  h.add_shape(K);
  h.add_shape(N);
  h.set_dtype(dtype);
  h.set_total_bytes(K * N * element_bytes);
  return h;
}

std::vector<uint8_t> Pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 13 + 5);
  return v;
}

// Writes `data` through an OutputFile in two chunks.
void WriteThrough(OutputFile& file, const v1::DequantizeHeader& h,
                  const std::vector<uint8_t>& data) {
  ASSERT_TRUE(file.Begin(h).ok());
  ASSERT_TRUE(file.Write(absl::MakeConstSpan(data).subspan(0, 7)).ok());
  ASSERT_TRUE(file.Write(absl::MakeConstSpan(data).subspan(7)).ok());
  ASSERT_TRUE(file.Finish().ok());
}

TEST(OutputFileTest, NpyBf16IsRawU2) {
  const std::string path = TempPath("out.npy");
  const std::vector<uint8_t> data = Pattern(3 * 8 * 2);
  std::unique_ptr<OutputFile> file = OutputFile::ForPath(path, "ignored");
  EXPECT_STREQ(file->kind(), "npy");
  WriteThrough(*file, Header(3, 8, v1::DTYPE_BF16, 2), data);
  absl::StatusOr<npy::Array> a = npy::ReadFile(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->header.descr, "<u2");
  EXPECT_THAT(a->header.shape, ::testing::ElementsAre(3, 8));
  EXPECT_EQ(a->data, data);
}

TEST(OutputFileTest, SafetensorsHoldsOneNamedTensor) {
  const std::string path = TempPath("out.safetensors");
  const std::vector<uint8_t> data = Pattern(2 * 8 * 4);
  std::unique_ptr<OutputFile> file = OutputFile::ForPath(path, "model.layers.0.mlp.up_proj");
  EXPECT_STREQ(file->kind(), "safetensors");
  WriteThrough(*file, Header(2, 8, v1::DTYPE_FP32, 4), data);
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> f = safetensors::MappedFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ((*f)->header().tensors.size(), 1u);
  const safetensors::TensorEntry& e = (*f)->header().tensors.at("model.layers.0.mlp.up_proj");
  EXPECT_EQ(e.dtype, "F32");
  EXPECT_THAT(e.shape, ::testing::ElementsAre(2, 8));
  const absl::Span<const uint8_t> got = *(*f)->TensorBytes(e.name);
  EXPECT_EQ(std::vector<uint8_t>(got.begin(), got.end()), data);
}

TEST(OutputFileTest, OtherExtensionsAreRawBytes) {
  const std::string path = TempPath("out.bin");
  const std::vector<uint8_t> data = Pattern(4 * 8 * 2);
  std::unique_ptr<OutputFile> file = OutputFile::ForPath(path, "x");
  EXPECT_STREQ(file->kind(), "raw");
  WriteThrough(*file, Header(4, 8, v1::DTYPE_FP16, 2), data);
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, data);
}

TEST(OutputFileTest, IncompleteResultIsDataLossAndNothingAppears) {
  for (const std::string name : {"short.npy", "short.safetensors", "short.raw"}) {
    SCOPED_TRACE(name);
    const std::string path = TempPath(name);
    std::unique_ptr<OutputFile> file = OutputFile::ForPath(path, "t");
    ASSERT_TRUE(file->Begin(Header(1, 8, v1::DTYPE_FP16, 2)).ok());
    ASSERT_TRUE(file->Write(Pattern(10)).ok());
    EXPECT_EQ(file->Finish().code(), absl::StatusCode::kDataLoss);
    file.reset();
    EXPECT_FALSE(fs::exists(path));
  }
}

TEST(OutputFileTest, Int32OutputIsRefusedForNpyAndSafetensors) {
  EXPECT_EQ(
      OutputFile::ForPath(TempPath("i.npy"), "t")->Begin(Header(1, 8, v1::DTYPE_INT32, 4)).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OutputFile::ForPath(TempPath("i.safetensors"), "t")
                ->Begin(Header(1, 8, v1::DTYPE_INT32, 4))
                .code(),
            absl::StatusCode::kInvalidArgument);
}

class PackedInputTest : public ::testing::Test {
 protected:
  // K=128, N=16, G=32: qweight (128, 2), qzeros (4, 2), scales (4, 16).
  // `packed_dtype`: the dtype written for qweight and qzeros (the bytes are the same).
  void Write(const std::string& path, const std::string& scale_dtype, int64_t scale_rows,
             const std::string& packed_dtype = "I32") {
    const int64_t packed_cols = 8 / safetensors::DTypeBytes(packed_dtype);  // 2 words a row
    WriteShapes(path, packed_dtype, {128, packed_cols}, {4, packed_cols}, scale_dtype,
                {scale_rows, 16});
  }
  // The same bytes under any shapes and dtypes (the element counts must fit the bytes).
  void WriteShapes(const std::string& path, const std::string& packed_dtype,
                   std::vector<int64_t> qweight_shape, std::vector<int64_t> qzeros_shape,
                   const std::string& scale_dtype, std::vector<int64_t> scales_shape,
                   const std::string& qzeros_dtype = "") {
    qweight_.assign(128 * 2, 0);
    for (size_t i = 0; i < qweight_.size(); ++i)
      qweight_[i] = static_cast<int32_t>(i * 2654435761u);
    qzeros_.assign(4 * 2, 0x12345678);
    scales_.assign(scales_shape[0] * scales_shape[1] * safetensors::DTypeBytes(scale_dtype), 0x3C);
    ASSERT_TRUE(safetensors::WriteFile(
                    path, {{"m.l.qweight", packed_dtype, qweight_shape, Bytes(qweight_)},
                           {"m.l.qzeros", qzeros_dtype.empty() ? packed_dtype : qzeros_dtype,
                            qzeros_shape, Bytes(qzeros_)},
                           {"m.l.scales", scale_dtype, scales_shape, Bytes(scales_)}})
                    .ok());
  }
  std::vector<int32_t> qweight_, qzeros_;
  std::vector<uint8_t> scales_;
};

TEST_F(PackedInputTest, ShapesAndBytesComeFromTheFile) {
  const std::string path = TempPath("packed.safetensors");
  Write(path, "BF16", 4);
  absl::StatusOr<v1::InlinePackedTensor> t = LoadInlinePacked(path, "m.l.");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->in_features(), 128);
  EXPECT_EQ(t->out_features(), 16);
  EXPECT_EQ(t->group_size(), 32);  // 128 / 4 scale rows
  EXPECT_EQ(t->scale_dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(t->qweight(), std::string(reinterpret_cast<const char*>(qweight_.data()), 1024));
  EXPECT_EQ(t->qzeros().size(), 32u);
  EXPECT_EQ(t->scales().size(), 128u);
  // An explicit group size must be the file's: one that agrees is sent, one that does not is
  // refused here naming both (the server would see only wrong byte counts).
  EXPECT_EQ(LoadInlinePacked(path, "m.l.", 32)->group_size(), 32);
  const absl::Status other = LoadInlinePacked(path, "m.l.", 64).status();
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(other.message()),
            path +
                ": group size 64 disagrees with layer 'm.l' (format awq_gemm), whose tensors give "
                "group_size 32 for K = 128 (leave the group size out: it comes from the file)");
}

// A compressed-tensors float-quantized layer (weight E4M3 (2, 4), channel weight_scale (2, 1)
// fp32): sent by role under its format's name, with the fp32 scale dtype named as such.
TEST(PackedInputFp8Test, CompressedTensorsFp8ByRoleWithFp32Scales) {
  const std::string path = TempPath("ct_fp8.safetensors");
  const std::vector<uint8_t> weight = {0x38, 0x40, 0x44, 0x80, 0xB8, 0x3C, 0x7E, 0x01};
  const float scale[2] = {0.5f, 2.0f};
  ASSERT_TRUE(
      safetensors::WriteFile(
          path, {{"m.l.weight", "F8_E4M3", {2, 4}, weight},
                 {"m.l.weight_scale",
                  "F32",
                  {2, 1},
                  absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(scale), sizeof scale)}})
          .ok());
  absl::StatusOr<v1::InlinePackedTensor> t =
      LoadInlinePacked(path, "m.l.", 0, Format::kCompressedTensorsFp8);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->format(), "compressed_tensors_fp8");
  EXPECT_EQ(t->in_features(), 4);
  EXPECT_EQ(t->out_features(), 2);
  EXPECT_EQ(t->group_size(), 4);  // channel: one scale column of K
  EXPECT_EQ(t->scale_dtype(), v1::DTYPE_FP32);
  ASSERT_EQ(t->tensors_size(), 2);
  EXPECT_EQ(t->tensors(0).role(), "weight");
  EXPECT_EQ(t->tensors(0).data(), std::string(weight.begin(), weight.end()));
  EXPECT_EQ(t->tensors(1).role(), "weight_scale");
  EXPECT_EQ(t->tensors(1).data().size(), 8u);
}

// A compressed-tensors int layer, symmetric and without weight_g_idx (K = 32, N = 4, 4 bits):
// the two optional roles are left out of the request, which says the same (the server's flags).
// With one scale for the whole layer (strategy tensor) the request cannot say how the scale is
// shared: UNIMPLEMENTED naming the role and both sizes.
TEST(PackedInputCompressedTensorsTest, OptionalRolesAreLeftOutAndATensorScaleIsRefused) {
  const std::vector<int32_t> packed(4 * 4, 0x12345678);
  const std::vector<uint16_t> scale_channel(4, 0x3C00);  // (N, 1) fp16 1.0
  const std::vector<uint16_t> scale_one(1, 0x3C00);      // (1) fp16
  const std::vector<int64_t> dense = {4, 32};
  const auto write = [&](const std::string& path, std::vector<int64_t> scale_shape,
                         const std::vector<uint16_t>& scale) {
    ASSERT_TRUE(
        safetensors::WriteFile(path, {{"m.l.weight_packed", "I32", {4, 4}, Bytes(packed)},
                                      {"m.l.weight_scale", "F16", scale_shape, Bytes(scale)},
                                      {"m.l.weight_shape", "I64", {2}, Bytes(dense)}})
            .ok());
  };
  const std::string channel = TempPath("ct_channel.safetensors");
  write(channel, {4, 1}, scale_channel);
  absl::StatusOr<v1::InlinePackedTensor> t =
      LoadInlinePacked(channel, "m.l.", 0, Format::kCompressedTensors);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->format(), "compressed_tensors");
  EXPECT_EQ(t->in_features(), 32);
  EXPECT_EQ(t->out_features(), 4);
  EXPECT_EQ(t->group_size(), 32);  // channel: G = K
  ASSERT_EQ(t->tensors_size(), 3);
  EXPECT_EQ(t->tensors(0).role(), "weight_packed");
  EXPECT_EQ(t->tensors(1).role(), "weight_scale");
  EXPECT_EQ(t->tensors(2).role(), "weight_shape");

  const std::string one = TempPath("ct_tensor.safetensors");
  write(one, {1}, scale_one);
  const absl::Status s = LoadInlinePacked(one, "m.l.", 0, Format::kCompressedTensors).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(s.message(), one +
                             ": layer 'm.l' (format compressed_tensors) cannot be sent inline: its "
                             "weight_scale holds (1, 1) fp16, and an inline request of its shape "
                             "carries (4, 1) fp16 (the request cannot say how its scales are "
                             "shared); serve its checkpoint and use --tensor");
}

// compressed_tensors_fp8 strategy tensor (one scale, read off its dims without a config): R = N
// rows per scale goes in scale_block_rows, G = K.
TEST(PackedInputFp8Test, TensorStrategySendsScaleBlockRows) {
  const std::string path = TempPath("ct_fp8_tensor.safetensors");
  const std::vector<uint8_t> weight(4 * 8, 0x38);
  const std::vector<float> scale = {0.5f};
  ASSERT_TRUE(safetensors::WriteFile(path, {{"m.l.weight", "F8_E4M3", {4, 8}, weight},
                                            {"m.l.weight_scale", "F32", {1}, Bytes(scale)}})
                  .ok());
  absl::StatusOr<v1::InlinePackedTensor> t =
      LoadInlinePacked(path, "m.l.", 0, Format::kCompressedTensorsFp8);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->scale_block_rows(), 4);
  EXPECT_EQ(t->group_size(), 8);
  EXPECT_EQ(t->tensors(1).data().size(), 4u);
}

// The declaration of --packed: <name>.config.json beside the file first, then config.json, and
// --format only when neither is there (or when it agrees).
TEST(PackedDeclarationTest, ConfigBesideTheFileThenFormatThenAwq) {
  const fs::path dir = fs::path(TempPath("declaration"));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string packed = (dir / "layer.safetensors").string();
  absl::StatusOr<PackedDeclaration> d = FindPackedDeclaration(packed, "", "");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->format, Format::kAwqGemm);
  EXPECT_FALSE(d->config.has_value());
  d = FindPackedDeclaration(packed, "", "MXFP4");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->format, Format::kMxfp4);
  std::ofstream(dir / "config.json") << R"({"quantization_config":{"quant_method":"mxfp4"}})";
  d = FindPackedDeclaration(packed, "", "");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->format, Format::kMxfp4);
  EXPECT_EQ(d->config_path, (dir / "config.json").string());
  std::ofstream(dir / "layer.config.json")
      << R"({"quantization_config":{"quant_method":"awq","bits":4,"group_size":128}})";
  d = FindPackedDeclaration(packed, "", "");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->format, Format::kAwqGemm);
  EXPECT_EQ(d->config_path, (dir / "layer.config.json").string());
  ASSERT_TRUE(d->config.has_value());
  EXPECT_EQ(d->config->group_size, 128);
  // The server's own message for a config it refuses.
  std::ofstream(dir / "layer.config.json") << R"({"quantization_config":{"quant_method":"hqq"}})";
  const absl::Status s = FindPackedDeclaration(packed, "", "").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), (dir / "layer.config.json").string() +
                             ": quantization_config field 'quant_method' is 'hqq', only 'awq', "
                             "'gptq', 'compressed-tensors', 'fp8', 'mxfp4' are served");
  // A config found beside the file without a quantization_config (an unquantized model's) is
  // no declaration: the next candidate, then --format, then AWQ.
  std::ofstream(dir / "layer.config.json") << R"({"architectures":["LlamaForCausalLM"]})";
  d = FindPackedDeclaration(packed, "", "");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->format, Format::kMxfp4);
  EXPECT_EQ(d->config_path, (dir / "config.json").string());
  std::ofstream(dir / "config.json") << R"({"model_type":"llama"})";
  d = FindPackedDeclaration(packed, "", "");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->format, Format::kAwqGemm);
  EXPECT_FALSE(d->config.has_value());
  d = FindPackedDeclaration(packed, "", "gptq");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->format, Format::kGptq);
  fs::remove_all(dir);
}

TEST_F(PackedInputTest, Errors) {
  const std::string path = TempPath("packed_bad.safetensors");
  Write(path, "F32", 4);
  EXPECT_EQ(LoadInlinePacked(path, "m.l.").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadInlinePacked(path, "other.").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadInlinePacked(TempPath("none.safetensors"), "m.l.").status().code(),
            absl::StatusCode::kNotFound);
  const std::string uneven = TempPath("packed_uneven.safetensors");
  Write(uneven, "F16", 3);              // 3 scale rows do not divide K = 128
  for (int64_t group_size : {0, 32}) {  // an explicit group size does not mend the file
    absl::Status s = LoadInlinePacked(uneven, "m.l.", group_size).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(s.message()),
              uneven +
                  ": tensor 'm.l.scales' (layer 'm.l'): field 'shape' has 3 rows, "
                  "which do not divide K = 128 into whole groups (G = K / scales "
                  "rows)");
  }
}

// K=128, N=16, G=32 stored transposed: the byte counts still match, the shapes do not.
TEST_F(PackedInputTest, TransposedQzerosIsInvalidArgumentNamingQzerosShape) {
  const std::string path = TempPath("packed_qzeros_t.safetensors");
  WriteShapes(path, "I32", {128, 2}, {2, 4}, "F16", {4, 16});  // qzeros (N/8, K/G)
  absl::Status s = LoadInlinePacked(path, "m.l.").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(s.message()),
            path +
                ": tensor 'm.l.qzeros' (layer 'm.l'): field 'shape' is (2, 4), want "
                "(4, 2) = (K/G, N/8)");
}

TEST_F(PackedInputTest, TransposedScalesIsInvalidArgumentNamingScalesShape) {
  const std::string path = TempPath("packed_scales_t.safetensors");
  WriteShapes(path, "I32", {128, 2}, {4, 2}, "F16", {16, 4});  // scales (N, K/G)
  absl::Status s = LoadInlinePacked(path, "m.l.").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(s.message()),
            path +
                ": tensor 'm.l.scales' (layer 'm.l'): field 'shape' is (16, 4), want "
                "N = 8 * qweight columns = 16 columns");
}

TEST_F(PackedInputTest, F32QzerosIsInvalidArgumentNamingQzerosDType) {
  const std::string path = TempPath("packed_qzeros_f32.safetensors");
  WriteShapes(path, "I32", {128, 2}, {4, 2}, "F16", {4, 16}, "F32");
  absl::Status s = LoadInlinePacked(path, "m.l.").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            path + ": tensor 'm.l.qzeros' (layer 'm.l'): field 'dtype' is F32, want I32 or U32");
}

TEST_F(PackedInputTest, PackedTensorsMustBe32BitIntegers) {
  const std::string path = TempPath("packed_dtype.safetensors");
  Write(path, "F16", 4, "U32");
  EXPECT_TRUE(LoadInlinePacked(path, "m.l.").ok());
  for (const char* dtype : {"F32", "I16", "F16"}) {
    Write(path, "F16", 4, dtype);  // the same bytes: (128, 2) F32, (128, 4) I16 or F16
    absl::Status s = LoadInlinePacked(path, "m.l.").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << dtype;
    EXPECT_THAT(std::string(s.message()),
                ::testing::HasSubstr("tensor 'm.l.qweight' (layer 'm.l'): field 'dtype' is " +
                                     std::string(dtype) + ", want I32 or U32"));
  }
}

TEST(BenchmarkRequestTest, ParsesShapesDTypesAndCounts) {
  BenchmarkOptions o;
  o.shapes = "4096x4096, 576x1536";
  o.dtype = "fp16,bf16";
  o.group_size = 64;
  o.trials = 3;
  o.runs = 7;
  o.variants = "v1,v2";
  absl::StatusOr<v1::BenchmarkRequest> r = MakeBenchmarkRequest(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->shapes_size(), 2);
  EXPECT_EQ(r->shapes(1).in_features(), 576);
  EXPECT_EQ(r->shapes(1).out_features(), 1536);
  EXPECT_THAT(r->output_dtypes(), ::testing::ElementsAre(v1::DTYPE_FP16, v1::DTYPE_BF16));
  EXPECT_THAT(r->variants(), ::testing::ElementsAre("v1", "v2"));
  EXPECT_EQ(r->group_size(), 64);
  EXPECT_EQ(r->trials(), 3);
  EXPECT_EQ(r->runs(), 7);
  for (const std::string bad : {"4096", "4096x", "x8", "0x8", "12x-8", "axb", "1x2x3"}) {
    o.shapes = bad;
    EXPECT_EQ(MakeBenchmarkRequest(o).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// An empty entry would leave a list empty and run the server's default instead: refused, naming
// the flag.
TEST(BenchmarkRequestTest, AnEmptyListEntryIsInvalidArgumentNamingTheFlag) {
  BenchmarkOptions o;
  o.shapes = ",";
  absl::Status s = MakeBenchmarkRequest(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "--shapes \",\" has an empty entry (a list is comma-separated)");
  o.shapes = "64x64";
  o.tensors = "a, ,b";
  s = MakeBenchmarkRequest(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "--tensors \"a, ,b\" has an empty entry (a list is comma-separated)");
  o.tensors = " a , b ";  // spaces around entries are trimmed
  absl::StatusOr<v1::BenchmarkRequest> r = MakeBenchmarkRequest(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->tensors(), ::testing::ElementsAre("a", "b"));
}

TEST(TableTest, PadsColumnsAndAlignsNumbersRight) {
  Table t({"name", "K"}, {false, true});
  t.AddRow({"a", "576"});
  t.AddRow({"longer", "8"});
  std::ostringstream out;
  t.Print(out);
  EXPECT_EQ(out.str(), "name      K\na       576\nlonger    8\n");
}

}  // namespace
}  // namespace dequantd
