// LayersSafetensorsFile: the dequantize-layers --out file laid out first and written in place, in
// any order from several threads, reads back (safetensors::MappedFile) with every byte in place.
#include "client/layers_file.h"

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "formats/safetensors.h"
#include "gtest/gtest.h"
#include "tests/client/test_dir.h"

namespace dequantd {
namespace {

using client_test::TempPath;

v1::DequantizeHeader HeaderOf(const std::string& name, int64_t K, int64_t N, v1::DType dtype) {
  v1::DequantizeHeader h;
  h.set_tensor(name);
  h.add_shape(K);
  h.add_shape(N);
  h.set_dtype(dtype);
  h.set_total_bytes(K * N * OutputDTypeBytes(dtype));
  return h;
}

std::vector<uint8_t> Pattern(size_t bytes, uint8_t seed) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(i * 31 + seed);
  return v;
}

TEST(LayersSafetensorsFileTest, ThreeLayersWrittenBackwardsFromTwoThreadsReadBack) {
  const std::string path = TempPath("layers_in_place.safetensors");
  const std::vector<LayersSafetensorsFile::Layer> layers = {
      {"b.q", 4, 8}, {"a.k", 2, 16}, {"c", 3, 4}};
  absl::StatusOr<std::unique_ptr<LayersSafetensorsFile>> file =
      LayersSafetensorsFile::Create(path, layers, v1::DTYPE_FP32);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->in_place());
  EXPECT_FALSE(std::filesystem::exists(path));  // a temporary file until Finish
  std::vector<std::vector<uint8_t>> data;
  for (size_t i = 0; i < layers.size(); ++i) {
    data.push_back(Pattern(static_cast<size_t>(layers[i].K * layers[i].N * 4), uint8_t(i + 1)));
  }
  // Layer order from the headers; each layer's second half first, on another thread.
  std::vector<std::thread> threads;
  for (size_t i = layers.size(); i-- > 0;) {
    absl::StatusOr<size_t> index =
        (*file)->Begin(HeaderOf(layers[i].name, layers[i].K, layers[i].N, v1::DTYPE_FP32));
    ASSERT_TRUE(index.ok()) << index.status();
    ASSERT_EQ(*index, i);
    const size_t half = data[i].size() / 2;
    threads.emplace_back([&, i, half] {
      EXPECT_TRUE(
          (*file)
              ->WriteAt(i, static_cast<int64_t>(half), absl::MakeConstSpan(data[i]).subspan(half))
              .ok());
    });
    EXPECT_TRUE((*file)->WriteAt(i, 0, absl::MakeConstSpan(data[i]).first(half)).ok());
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE((*file)->Finish().ok());
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> read =
      safetensors::MappedFile::Open(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ((*read)->header().tensors.size(), 3u);
  for (size_t i = 0; i < layers.size(); ++i) {
    const safetensors::TensorEntry& e = (*read)->header().tensors.at(layers[i].name);
    EXPECT_EQ(e.dtype, "F32");
    EXPECT_EQ(e.shape, (std::vector<int64_t>{layers[i].K, layers[i].N}));
    absl::StatusOr<absl::Span<const uint8_t>> bytes = (*read)->TensorBytes(layers[i].name);
    ASSERT_TRUE(bytes.ok());
    EXPECT_EQ(std::vector<uint8_t>(bytes->begin(), bytes->end()), data[i]) << layers[i].name;
  }
  // Laid out in the given order, as safetensors::WriteFile lays them out.
  EXPECT_LT((*read)->header().tensors.at("b.q").data_begin,
            (*read)->header().tensors.at("a.k").data_begin);
}

// An mxfp4 layer of 2 experts is one (E, K, N) tensor: its header must say (2, 4, 8).
TEST(LayersSafetensorsFileTest, StackedExpertsAreOneThreeDimTensor) {
  const std::string path = TempPath("layers_experts.safetensors");
  absl::StatusOr<std::unique_ptr<LayersSafetensorsFile>> file =
      LayersSafetensorsFile::Create(path, {{"experts.down_proj", 4, 8, 2}}, v1::DTYPE_BF16);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->Begin(HeaderOf("experts.down_proj", 4, 8, v1::DTYPE_BF16)).status().code(),
            absl::StatusCode::kDataLoss);  // (K, N) only: not the stacked result
  v1::DequantizeHeader stacked = HeaderOf("experts.down_proj", 2, 4, v1::DTYPE_BF16);
  stacked.add_shape(8);
  stacked.set_total_bytes(2 * 4 * 8 * 2);
  absl::StatusOr<size_t> index = (*file)->Begin(stacked);
  ASSERT_TRUE(index.ok()) << index.status();
  const std::vector<uint8_t> data = Pattern(2 * 4 * 8 * 2, 7);
  ASSERT_TRUE((*file)->WriteAt(*index, 0, data).ok());
  ASSERT_TRUE((*file)->Finish().ok());
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> read =
      safetensors::MappedFile::Open(path);
  ASSERT_TRUE(read.ok()) << read.status();
  const safetensors::TensorEntry& e = (*read)->header().tensors.at("experts.down_proj");
  EXPECT_EQ(e.shape, (std::vector<int64_t>{2, 4, 8}));
  absl::StatusOr<absl::Span<const uint8_t>> bytes = (*read)->TensorBytes("experts.down_proj");
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(std::vector<uint8_t>(bytes->begin(), bytes->end()), data);
}

TEST(LayersSafetensorsFileTest, WrongLayerShapeOrMissingBytesIsDataLoss) {
  const std::string path = TempPath("layers_wrong.safetensors");
  absl::StatusOr<std::unique_ptr<LayersSafetensorsFile>> file =
      LayersSafetensorsFile::Create(path, {{"x", 2, 8}}, v1::DTYPE_FP16);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->Begin(HeaderOf("y", 2, 8, v1::DTYPE_FP16)).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ((*file)->Begin(HeaderOf("x", 2, 16, v1::DTYPE_FP16)).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ((*file)->Begin(HeaderOf("x", 2, 8, v1::DTYPE_FP32)).status().code(),
            absl::StatusCode::kDataLoss);
  const std::vector<uint8_t> bytes(32, 1);
  EXPECT_EQ((*file)->WriteAt(0, 1, bytes).code(), absl::StatusCode::kOutOfRange);  // 33 > 32
  ASSERT_TRUE((*file)->WriteAt(0, 0, absl::MakeConstSpan(bytes).first(16)).ok());
  const absl::Status finish = (*file)->Finish();
  EXPECT_EQ(finish.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(finish.message()).find("16 of 32"), std::string::npos) << finish;
}

TEST(LayersSafetensorsFileTest, RepeatedNameOrBadDtypeIsInvalidArgument) {
  EXPECT_EQ(LayersSafetensorsFile::Create(TempPath("rep.safetensors"), {{"x", 1, 8}, {"x", 1, 8}},
                                          v1::DTYPE_FP16)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      LayersSafetensorsFile::Create(TempPath("int.safetensors"), {{"x", 1, 8}}, v1::DTYPE_INT32)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(LayersSafetensorsFileTest, DevNullIsWrittenInOrderOnly) {
  absl::StatusOr<std::unique_ptr<LayersSafetensorsFile>> file =
      LayersSafetensorsFile::Create("/dev/null", {{"x", 1, 8}, {"y", 1, 8}}, v1::DTYPE_FP16);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_FALSE((*file)->in_place());
  const std::vector<uint8_t> bytes(16, 2);
  EXPECT_EQ((*file)->WriteAt(1, 0, bytes).code(), absl::StatusCode::kDataLoss);  // y before x
  ASSERT_TRUE((*file)->WriteAt(0, 0, bytes).ok());
  ASSERT_TRUE((*file)->WriteAt(1, 0, bytes).ok());
  EXPECT_TRUE((*file)->Finish().ok());
}

}  // namespace
}  // namespace dequantd
