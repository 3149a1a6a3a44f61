// Tests for server/model/checkpoint: tiny AWQ checkpoint directories written with
// safetensors::WriteFile into a temporary directory, opened and checked field by field, and each
// kind of bad checkpoint refused with its exact status code and a message naming the tensor.
#include "server/model/checkpoint.h"
#include "kernels/awq_format.h"

#include <stdlib.h>
#include <unistd.h>
#include <filesystem>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "formats/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dequantd {
namespace {

using ::testing::HasSubstr;

constexpr char kAwqConfig[] =
    R"({"architectures":["LlamaForCausalLM"],"quantization_config":{"quant_method":"awq",)"
    R"("bits":4,"group_size":128,"zero_point":true,"version":"gemm"}})";

std::string MakeTempDir() {
  std::string templ = ::testing::TempDir() + "/checkpoint_test.XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) return "";
  return templ;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// One tensor's bytes kept alive for WriteFile.
struct OwnedTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Random bytes; for F16/BF16 every element is a finite normal value.
std::vector<uint8_t> RandomBytes(const std::string& dtype, int64_t elements, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t width = safetensors::DTypeBytes(dtype);
  std::vector<uint8_t> out(static_cast<size_t>(elements * width));
  for (int64_t i = 0; i < elements; ++i) {
    uint32_t v = rng();
    if (dtype == "F16") v = 0x2000u + v % 0x1C00u;   // about 2^-7 .. 1
    if (dtype == "BF16") v = 0x3C00u + v % 0x0300u;  // about 2^-7 .. 1
    std::memcpy(out.data() + i * width, &v, static_cast<size_t>(width));
  }
  return out;
}

// qweight (K, N/8) I32, qzeros (rows, qzeros_cols) I32, scales (rows, scales_cols).
std::vector<OwnedTensor> Layer(const std::string& prefix, int64_t K, int64_t N, int64_t rows,
                               const std::string& scale_dtype = "F16", int64_t scales_cols = -1,
                               int64_t qzeros_cols = -1) {
  if (scales_cols < 0) scales_cols = N;
  if (qzeros_cols < 0) qzeros_cols = N / 8;
  const uint32_t seed = static_cast<uint32_t>(std::hash<std::string>{}(prefix));
  return {{prefix + ".qweight", "I32", {K, N / 8}, RandomBytes("I32", K * N / 8, seed)},
          {prefix + ".qzeros",
           "I32",
           {rows, qzeros_cols},
           RandomBytes("I32", rows * qzeros_cols, seed + 1)},
          {prefix + ".scales",
           scale_dtype,
           {rows, scales_cols},
           RandomBytes(scale_dtype, rows * scales_cols, seed + 2)}};
}

void Append(std::vector<OwnedTensor>* to, std::vector<OwnedTensor> more) {
  for (OwnedTensor& t : more) to->push_back(std::move(t));
}

absl::Status Write(const std::string& path, const std::vector<OwnedTensor>& tensors) {
  std::vector<safetensors::TensorToWrite> views;
  for (const OwnedTensor& t : tensors) {
    views.push_back({t.name, t.dtype, t.shape, absl::MakeConstSpan(t.bytes)});
  }
  return safetensors::WriteFile(path, views);
}

const OwnedTensor& Named(const std::vector<OwnedTensor>& tensors, const std::string& name) {
  for (const OwnedTensor& t : tensors)
    if (t.name == name) return t;
  static const OwnedTensor kNone;
  return kNone;
}

// The view's bytes equal what was written, in the Checkpoint's 64-byte-aligned copy.
void ExpectSameBytes(const void* view, const OwnedTensor& t) {
  ASSERT_NE(view, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(view) % 64, 0u) << t.name;
  EXPECT_EQ(std::memcmp(view, t.bytes.data(), t.bytes.size()), 0) << t.name;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    ASSERT_FALSE(dir_.empty());
    WriteText(dir_ + "/config.json", kAwqConfig);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  absl::StatusCode OpenCode() { return Checkpoint::Open(dir_).status().code(); }
  std::string OpenMessage() { return std::string(Checkpoint::Open(dir_).status().message()); }
  std::string dir_;
};

TEST_F(CheckpointTest, OpensSingleFileWithTwoGroupSizes) {
  std::vector<OwnedTensor> t;
  Append(&t, Layer("model.layers.0.self_attn.q_proj", 256, 64, 2));  // G = 128
  Append(&t, Layer("model.layers.0.mlp.down_proj", 576, 16, 9));     // G = 64
  t.push_back({"model.embed_tokens.weight", "F16", {4, 8}, RandomBytes("F16", 32, 7)});
  ASSERT_TRUE(Write(dir_ + "/model.safetensors", t).ok());

  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const Checkpoint& c = **ckpt;
  EXPECT_EQ(c.config().quant_method, "awq");
  EXPECT_EQ(c.config().bits, 4);
  EXPECT_EQ(c.config().group_size, 128);
  EXPECT_TRUE(c.config().zero_point);
  EXPECT_EQ(c.config().version, "gemm");
  ASSERT_EQ(c.layers().size(), 2u);
  // Sorted by name; the embedding is not a layer.
  EXPECT_EQ(c.layers()[0].name, "model.layers.0.mlp.down_proj");
  EXPECT_EQ(c.layers()[1].name, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(c.layers()[0].index, 0);  // each layer knows its position
  EXPECT_EQ(c.layers()[1].index, 1);

  const QuantizedLayer* q = c.Find("model.layers.0.self_attn.q_proj");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->view.shape.K, 256);
  EXPECT_EQ(q->view.shape.N, 64);
  EXPECT_EQ(q->view.shape.group_size, 128);
  EXPECT_EQ(q->view.shape.scale_dtype, DType::kF16);
  EXPECT_EQ(q->file, dir_ + "/model.safetensors");
  ExpectSameBytes(awq::Qweight(q->view), Named(t, "model.layers.0.self_attn.q_proj.qweight"));
  ExpectSameBytes(awq::Qzeros(q->view), Named(t, "model.layers.0.self_attn.q_proj.qzeros"));
  ExpectSameBytes(awq::Scales(q->view), Named(t, "model.layers.0.self_attn.q_proj.scales"));

  const QuantizedLayer* d = c.Find("model.layers.0.mlp.down_proj");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->view.shape.K, 576);
  EXPECT_EQ(d->view.shape.N, 16);
  EXPECT_EQ(d->view.shape.group_size, 64);
  ExpectSameBytes(awq::Qweight(d->view), Named(t, "model.layers.0.mlp.down_proj.qweight"));

  EXPECT_EQ(c.Find("model.layers.0.mlp"), nullptr);
  EXPECT_EQ(c.Find("model.embed_tokens"), nullptr);
  EXPECT_EQ(c.Find("model.layers.0.self_attn.q_proj.qweight"), nullptr);
}

// LayerPositions: a checkpoint's own layer by its index; a copy with a stale or missing index, or
// whose index names another layer, by its name; an unknown name nowhere.
TEST(LayerPositionsTest, FindsByIndexWhenTheNameMatchesElseByName) {
  const auto layer = [](std::string name, int64_t index) {
    QuantizedLayer l;
    l.name = std::move(name);
    l.index = index;
    return l;
  };
  const std::vector<QuantizedLayer> layers = {layer("a", 0), layer("b", 1), layer("c", 2)};
  LayerPositions positions;
  positions.Assign(layers);
  EXPECT_EQ(positions.size(), 3);
  for (const QuantizedLayer& l : layers) EXPECT_EQ(positions.Find(l), l.index);
  EXPECT_EQ(positions.Find(layer("c", 0)), 2);   // a renumbered copy
  EXPECT_EQ(positions.Find(layer("b", -1)), 1);  // not a checkpoint's
  EXPECT_EQ(positions.Find(layer("a", 7)), 0);   // past the end
  EXPECT_EQ(positions.Find(layer("d", 1)), std::nullopt);
  positions.Assign({});
  EXPECT_EQ(positions.Find(layers[0]), std::nullopt);
}

TEST_F(CheckpointTest, ShardedWithIndexAcrossFiles) {
  std::vector<OwnedTensor> layer = Layer("model.layers.1.mlp.up_proj", 128, 24, 1, "BF16");
  // qweight in shard 1, qzeros and scales in shard 2.
  ASSERT_TRUE(Write(dir_ + "/model-00001-of-00002.safetensors", {layer[0]}).ok());
  ASSERT_TRUE(Write(dir_ + "/model-00002-of-00002.safetensors", {layer[1], layer[2]}).ok());
  // A stray file not in the index is not opened, even though it is corrupt.
  WriteText(dir_ + "/stray.safetensors", "garbage");
  WriteText(dir_ + "/model.safetensors.index.json",
            R"({"metadata":{"total_size":1},"weight_map":{)"
            R"("model.layers.1.mlp.up_proj.qweight":"model-00001-of-00002.safetensors",)"
            R"("model.layers.1.mlp.up_proj.qzeros":"model-00002-of-00002.safetensors",)"
            R"("model.layers.1.mlp.up_proj.scales":"model-00002-of-00002.safetensors"}})");

  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_EQ((*ckpt)->layers().size(), 1u);
  const QuantizedLayer& l = (*ckpt)->layers()[0];
  EXPECT_EQ(l.view.shape.K, 128);
  EXPECT_EQ(l.view.shape.N, 24);
  EXPECT_EQ(l.view.shape.group_size, 128);
  EXPECT_EQ(l.view.shape.scale_dtype, DType::kBF16);
  EXPECT_EQ(l.file, dir_ + "/model-00001-of-00002.safetensors");
  ExpectSameBytes(awq::Qweight(l.view), layer[0]);
  ExpectSameBytes(awq::Qzeros(l.view), layer[1]);
  ExpectSameBytes(awq::Scales(l.view), layer[2]);
}

TEST_F(CheckpointTest, IndexNamingMissingShardIsNotFound) {
  WriteText(dir_ + "/model.safetensors.index.json",
            R"({"weight_map":{"a.qweight":"model-00001-of-00001.safetensors"}})");
  EXPECT_EQ(OpenCode(), absl::StatusCode::kNotFound);
  EXPECT_THAT(OpenMessage(), HasSubstr("model-00001-of-00001.safetensors' not found (named in "
                                       "model.safetensors.index.json)"));
}

TEST_F(CheckpointTest, IndexPuttingTensorInWrongShardIsInvalidArgument) {
  std::vector<OwnedTensor> layer = Layer("p", 64, 8, 1);
  ASSERT_TRUE(Write(dir_ + "/a.safetensors", layer).ok());
  ASSERT_TRUE(Write(dir_ + "/b.safetensors", {{"other", "U8", {1}, {1}}}).ok());
  WriteText(dir_ + "/model.safetensors.index.json",
            R"({"weight_map":{"p.qweight":"b.safetensors","p.qzeros":"a.safetensors"}})");
  EXPECT_EQ(OpenCode(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(OpenMessage(), HasSubstr("p.qweight"));
}

TEST_F(CheckpointTest, WithoutIndexOpensEverySafetensorsFile) {
  std::vector<OwnedTensor> layer = Layer("x.o_proj", 64, 8, 1);
  ASSERT_TRUE(Write(dir_ + "/part-a.safetensors", {layer[0], layer[2]}).ok());
  ASSERT_TRUE(Write(dir_ + "/part-b.safetensors", {layer[1]}).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_NE((*ckpt)->Find("x.o_proj"), nullptr);
  EXPECT_EQ((*ckpt)->Find("x.o_proj")->view.shape.group_size, 64);
}

TEST_F(CheckpointTest, TensorInTwoShardsIsInvalidArgument) {
  std::vector<OwnedTensor> layer = Layer("x", 64, 8, 1);
  ASSERT_TRUE(Write(dir_ + "/a.safetensors", layer).ok());
  ASSERT_TRUE(Write(dir_ + "/b.safetensors", {layer[1]}).ok());
  EXPECT_EQ(OpenCode(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(OpenMessage(), HasSubstr("x.qzeros"));
}

TEST_F(CheckpointTest, MisalignedTensorsAreCopiedToAlignedStorage) {
  std::vector<OwnedTensor> t = {{"pad", "U8", {3}, {1, 2, 3}}};  // shifts every later offset by 3
  Append(&t, Layer("m.k_proj", 128, 32, 2));
  ASSERT_TRUE(Write(dir_ + "/model.safetensors", t).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const QuantizedLayer* l = (*ckpt)->Find("m.k_proj");
  ASSERT_NE(l, nullptr);
  ExpectSameBytes(awq::Qweight(l->view), t[1]);
  ExpectSameBytes(awq::Qzeros(l->view), t[2]);
  ExpectSameBytes(awq::Scales(l->view), t[3]);
}

// Every layer of `ckpt` holds the bytes in `t` and dequantizes (fp16, reference path) to the same
// bits as a view over `t` itself.
void ExpectLayersMatch(const Checkpoint& ckpt, const std::vector<OwnedTensor>& t,
                       const std::vector<std::string>& prefixes) {
  ASSERT_EQ(ckpt.layers().size(), prefixes.size());
  for (const std::string& prefix : prefixes) {
    const QuantizedLayer* l = ckpt.Find(prefix);
    ASSERT_NE(l, nullptr) << prefix;
    const OwnedTensor& qweight = Named(t, prefix + ".qweight");
    const OwnedTensor& qzeros = Named(t, prefix + ".qzeros");
    const OwnedTensor& scales = Named(t, prefix + ".scales");
    ExpectSameBytes(awq::Qweight(l->view), qweight);
    ExpectSameBytes(awq::Qzeros(l->view), qzeros);
    ExpectSameBytes(awq::Scales(l->view), scales);
    QuantView written = l->view;
    written.tensors[awq::kQweight] = reinterpret_cast<const int32_t*>(qweight.bytes.data());
    written.tensors[awq::kQzeros] = reinterpret_cast<const int32_t*>(qzeros.bytes.data());
    written.tensors[awq::kScales] = scales.bytes.data();
    const size_t out_bytes = static_cast<size_t>(l->view.shape.output_bytes(DType::kF16));
    std::vector<uint8_t> got(out_bytes), want(out_bytes, 0xAB);
    const int64_t K = l->view.shape.K;
    ASSERT_TRUE(DequantizeReference(l->view, DType::kF16, 0, K, got.data()).ok()) << prefix;
    ASSERT_TRUE(DequantizeReference(written, DType::kF16, 0, K, want.data()).ok()) << prefix;
    EXPECT_EQ(got, want) << prefix;
  }
}

// The store owns its copies: truncating the file (a memory map would SIGBUS), rewriting it in
// place or deleting it after Open changes nothing a reader sees.
TEST_F(CheckpointTest, LayersSurviveTruncateRewriteAndDeleteOfTheFile) {
  const std::vector<std::string> prefixes = {"model.layers.0.mlp.down_proj",
                                             "model.layers.0.self_attn.q_proj"};
  std::vector<OwnedTensor> t = Layer(prefixes[0], 576, 64, 9);  // 4-byte aligned in the file
  Append(&t, Layer(prefixes[1], 256, 128, 2, "BF16"));
  const std::string path = dir_ + "/model.safetensors";
  ASSERT_TRUE(Write(path, t).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();

  ASSERT_EQ(::truncate(path.c_str(), 1000), 0);
  ExpectLayersMatch(**ckpt, t, prefixes);
  ASSERT_EQ(::truncate(path.c_str(), 0), 0);
  ExpectLayersMatch(**ckpt, t, prefixes);
  WriteText(path, std::string(100000, '\xEE'));  // the same inode, other bytes
  ExpectLayersMatch(**ckpt, t, prefixes);
  ASSERT_EQ(::unlink(path.c_str()), 0);
  ExpectLayersMatch(**ckpt, t, prefixes);
}

// After the CUDA backend's upload the server frees the host copies: names and shapes stay, the
// data pointers become null, and the freed bytes are the packed sizes (hand-computed).
TEST_F(CheckpointTest, ReleaseHostCopiesKeepsShapesAndNullsTheData) {
  std::vector<OwnedTensor> t = Layer("a", 576, 64, 9);
  Append(&t, Layer("b", 256, 128, 2, "BF16"));
  ASSERT_TRUE(Write(dir_ + "/model.safetensors", t).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  // a: qweight 576 x 8 x 4 = 18432, qzeros 9 x 8 x 4 = 288, scales 9 x 64 x 2 = 1152;
  // b: qweight 256 x 16 x 4 = 16384, qzeros 2 x 16 x 4 = 128, scales 2 x 128 x 2 = 512.
  EXPECT_EQ((*ckpt)->ReleaseHostCopies(), 18432 + 288 + 1152 + 16384 + 128 + 512);
  ASSERT_EQ((*ckpt)->layers().size(), 2u);
  const QuantizedLayer* b = (*ckpt)->Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->view.shape.K, 256);
  EXPECT_EQ(b->view.shape.N, 128);
  EXPECT_EQ(b->view.shape.group_size, 128);
  EXPECT_EQ(b->view.shape.scale_dtype, DType::kBF16);
  for (const QuantizedLayer& l : (*ckpt)->layers()) {
    EXPECT_EQ(awq::Qweight(l.view), nullptr);
    EXPECT_EQ(awq::Qzeros(l.view), nullptr);
    EXPECT_EQ(awq::Scales(l.view), nullptr);
  }
  EXPECT_EQ((*ckpt)->ReleaseHostCopies(), 0);  // already released
}

// Issue 22: opened without copies, a layer has null views and its stored ranges name the shard
// and the bytes of each tensor in the file; ReadHostCopies reads only the layers asked for (the
// bytes read are the stored sizes, hand-computed), and again the rest.
TEST_F(CheckpointTest, IndexOnlyOpenThenReadHostCopiesOfTheSelectedLayers) {
  std::vector<OwnedTensor> t = Layer("a", 576, 64, 9);
  Append(&t, Layer("b", 256, 128, 2, "BF16"));
  const std::string path = dir_ + "/model.safetensors";
  ASSERT_TRUE(Write(path, t).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt =
      Checkpoint::Open(dir_, CheckpointLoad{.host_copies = false});
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  Checkpoint& c = **ckpt;
  ASSERT_EQ(c.shards().size(), 1u);
  EXPECT_EQ(c.shards()[0].path, path);
  EXPECT_EQ(c.shards()[0].size, static_cast<int64_t>(std::filesystem::file_size(path)));
  std::ifstream in(path, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), {});
  const char* roles[] = {"qweight", "qzeros", "scales"};
  for (const QuantizedLayer& l : c.layers()) {
    EXPECT_FALSE(c.has_host_copy(static_cast<size_t>(l.index)));
    for (int r = 0; r < 3; ++r) {
      SCOPED_TRACE(l.name + "." + roles[r]);
      EXPECT_EQ(l.view.tensors[r], nullptr);
      const StoredRange& range = l.stored[r];
      const OwnedTensor& want = Named(t, l.name + "." + roles[r]);
      EXPECT_EQ(range.shard, 0);
      ASSERT_EQ(range.bytes, static_cast<int64_t>(want.bytes.size()));
      ASSERT_LE(range.offset + range.bytes, static_cast<int64_t>(file.size()));
      EXPECT_EQ(std::memcmp(file.data() + range.offset, want.bytes.data(), want.bytes.size()), 0);
    }
  }
  // a: 18432 + 288 + 1152; b: 16384 + 128 + 512.
  absl::StatusOr<int64_t> read = c.ReadHostCopies({true, false}, /*threads=*/2);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, 18432 + 288 + 1152);
  EXPECT_TRUE(c.has_host_copy(0));
  EXPECT_FALSE(c.has_host_copy(1));
  ExpectSameBytes(awq::Qweight(c.layers()[0].view), Named(t, "a.qweight"));
  ExpectSameBytes(awq::Qzeros(c.layers()[0].view), Named(t, "a.qzeros"));
  ExpectSameBytes(awq::Scales(c.layers()[0].view), Named(t, "a.scales"));
  EXPECT_EQ(awq::Qweight(c.layers()[1].view), nullptr);
  read = c.ReadHostCopies();  // the rest: only b is read
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, 16384 + 128 + 512);
  ExpectSameBytes(awq::Scales(c.layers()[1].view), Named(t, "b.scales"));
  EXPECT_EQ(c.ReadHostCopies().value_or(-1), 0);  // nothing left to read
}

// Issue 22: a shard truncated between Open and the read is DATA_LOSS naming the file and the
// tensor that is cut; nothing is read into the layers.
TEST_F(CheckpointTest, ShardTruncatedBeforeTheReadIsDataLossNamingFileAndTensor) {
  std::vector<OwnedTensor> t = Layer("a", 576, 64, 9);
  const std::string path = dir_ + "/model.safetensors";
  ASSERT_TRUE(Write(path, t).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt =
      Checkpoint::Open(dir_, CheckpointLoad{.host_copies = false});
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const StoredRange qweight = (*ckpt)->layers()[0].stored[0];
  ASSERT_EQ(::truncate(path.c_str(), qweight.offset + 100), 0);  // inside a.qweight
  absl::StatusOr<int64_t> read = (*ckpt)->ReadHostCopies({}, /*threads=*/1);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_THAT(read.status().message(), HasSubstr(path));
  EXPECT_THAT(read.status().message(), HasSubstr("'a.qweight'"));
  EXPECT_THAT(read.status().message(), HasSubstr("truncated while loading"));
  EXPECT_FALSE((*ckpt)->has_host_copy(0));
  EXPECT_EQ(awq::Qweight((*ckpt)->layers()[0].view), nullptr);
}

// Issue 22: a shard that grew (rewritten in place, larger) is DATA_LOSS naming it; one replaced
// by another file of the same name is ABORTED; a set cancel flag is CANCELLED.
TEST_F(CheckpointTest, ShardGrownReplacedOrLoadCancelledIsRefused) {
  const std::string path = dir_ + "/model.safetensors";
  ASSERT_TRUE(Write(path, Layer("a", 576, 64, 9)).ok());
  const CheckpointLoad index_only{.host_copies = false};
  absl::StatusOr<std::unique_ptr<Checkpoint>> grown = Checkpoint::Open(dir_, index_only);
  ASSERT_TRUE(grown.ok()) << grown.status();
  std::ofstream(path, std::ios::binary | std::ios::app) << std::string(4096, 'x');
  absl::StatusOr<int64_t> read = (*grown)->ReadHostCopies();
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_THAT(read.status().message(), HasSubstr(path));
  EXPECT_THAT(read.status().message(), HasSubstr("changed size during the load"));

  absl::StatusOr<std::unique_ptr<Checkpoint>> replaced = Checkpoint::Open(dir_, index_only);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  ASSERT_TRUE(Write(dir_ + "/other", Layer("a", 576, 64, 9)).ok());
  ASSERT_EQ(::rename((dir_ + "/other").c_str(), path.c_str()), 0);
  read = (*replaced)->ReadHostCopies();
  EXPECT_EQ(read.status().code(), absl::StatusCode::kAborted) << read.status();
  EXPECT_THAT(read.status().message(), HasSubstr("was replaced"));

  absl::StatusOr<std::unique_ptr<Checkpoint>> cancelled = Checkpoint::Open(dir_, index_only);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  const std::atomic<bool> cancel{true};
  read = (*cancelled)->ReadHostCopies({}, 1, &cancel);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kCancelled) << read.status();
  EXPECT_FALSE((*cancelled)->has_host_copy(0));
}

TEST(ShardReaderTest, AppendChunksCutsARangeIntoChunksOfAtMostTheSize) {
  std::vector<ReadChunk> chunks;
  AppendChunks(/*shard=*/2, /*file_offset=*/100, /*bytes=*/10, /*layer=*/7, /*role=*/1,
               /*max_chunk_bytes=*/4, &chunks);
  AppendChunks(0, 0, 0, 8, 0, 4, &chunks);  // an empty tensor: no chunk
  ASSERT_EQ(chunks.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(chunks[i].shard, 2);
    EXPECT_EQ(chunks[i].layer, 7);
    EXPECT_EQ(chunks[i].role, 1);
    EXPECT_EQ(chunks[i].file_offset, 100 + 4 * static_cast<int64_t>(i));
    EXPECT_EQ(chunks[i].tensor_offset, 4 * static_cast<int64_t>(i));
  }
  EXPECT_EQ(chunks[0].bytes, 4);
  EXPECT_EQ(chunks[2].bytes, 2);
}

TEST_F(CheckpointTest, GroupSizeMinusOneMeansOneGroup) {
  WriteText(dir_ + "/config.json",
            R"({"quantization_config":{"quant_method":"AWQ","bits":4,"group_size":-1,)"
            R"("zero_point":true,"version":"GEMM"}})");
  ASSERT_TRUE(Write(dir_ + "/model.safetensors", Layer("l", 192, 16, 1)).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->config().group_size, -1);
  EXPECT_EQ((*ckpt)->Find("l")->view.shape.group_size, 192);
}

TEST_F(CheckpointTest, MissingVersionAndZeroPointDefaultToGemmAndTrue) {
  WriteText(dir_ + "/config.json",
            R"({"quantization_config":{"quant_method":"awq","bits":4,"group_size":64}})");
  ASSERT_TRUE(Write(dir_ + "/model.safetensors", Layer("l", 64, 8, 1)).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->config().version, "gemm");
  EXPECT_TRUE((*ckpt)->config().zero_point);
}

TEST_F(CheckpointTest, MissingQzerosIsFailedPreconditionNamingTheTensorAndRole) {
  std::vector<OwnedTensor> layer = Layer("model.layers.0.mlp.up_proj", 128, 16, 1);
  ASSERT_TRUE(Write(dir_ + "/model.safetensors", {layer[0], layer[2]}).ok());
  EXPECT_EQ(OpenCode(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(OpenMessage(), dir_ +
                               "/model.safetensors: tensor 'model.layers.0.mlp.up_proj.qweight' "
                               "(layer 'model.layers.0.mlp.up_proj', format awq_gemm): the layer "
                               "has no qzeros tensor: 'model.layers.0.mlp.up_proj.qzeros' is "
                               "missing");
}

// ".qweight": a layer named "" would be listed but could not be asked for by name or written to a
// file: refused at load, naming the tensor.
TEST_F(CheckpointTest, ALayerWithAnEmptyNameIsFailedPrecondition) {
  std::vector<OwnedTensor> tensors = Layer("model.layers.0.mlp.up_proj", 128, 16, 1);
  for (OwnedTensor& t : Layer("", 128, 16, 1)) tensors.push_back(std::move(t));
  ASSERT_TRUE(Write(dir_ + "/model.safetensors", tensors).ok());
  EXPECT_EQ(OpenCode(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(OpenMessage(), dir_ +
                               "/model.safetensors: tensor '.qweight' (format awq_gemm) is a "
                               "layer with an empty name: a layer's tensors are <layer>.qweight "
                               "with a non-empty <layer>");
}

TEST_F(CheckpointTest, WrongScalesColumnsIsInvalidArgument) {
  ASSERT_TRUE(Write(dir_ + "/model.safetensors", Layer("l", 128, 16, 1, "F16", 24)).ok());
  EXPECT_EQ(OpenCode(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(OpenMessage(), HasSubstr("'l.scales'"));
  EXPECT_THAT(OpenMessage(), HasSubstr("'shape'"));
  EXPECT_THAT(OpenMessage(), HasSubstr("model.safetensors"));
}

TEST_F(CheckpointTest, GroupsNotDividingKIsInvalidArgument) {
  // K = 256 with 3 scale rows: G would be 85.33.
  ASSERT_TRUE(Write(dir_ + "/model.safetensors", Layer("l", 256, 16, 3)).ok());
  EXPECT_EQ(OpenCode(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(OpenMessage(), HasSubstr("do not divide K = 256"));
}

TEST_F(CheckpointTest, WrongQzerosShapeIsInvalidArgument) {
  ASSERT_TRUE(Write(dir_ + "/model.safetensors", Layer("l", 256, 16, 2, "F16", 16, 4)).ok());
  EXPECT_EQ(OpenCode(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(OpenMessage(), HasSubstr("'l.qzeros'"));
}

TEST_F(CheckpointTest, WrongDTypesAreInvalidArgument) {
  std::vector<OwnedTensor> layer = Layer("l", 64, 8, 1, "F32");
  ASSERT_TRUE(Write(dir_ + "/model.safetensors", layer).ok());
  EXPECT_EQ(OpenCode(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(OpenMessage(), HasSubstr("'dtype' is F32, want F16 or BF16"));

  layer = Layer("l", 64, 8, 1);
  layer[0].dtype = "U32";
  ASSERT_TRUE(Write(dir_ + "/model.safetensors", layer).ok());
  EXPECT_EQ(OpenCode(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(OpenMessage(), HasSubstr("'l.qweight'"));
}

TEST_F(CheckpointTest, EmptyKFailsValidateShape) {
  ASSERT_TRUE(Write(dir_ + "/model.safetensors", Layer("l", 0, 8, 1)).ok());
  EXPECT_EQ(OpenCode(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(OpenMessage(), HasSubstr("'l'"));
}

TEST_F(CheckpointTest, NoQuantizedLayerIsInvalidArgument) {
  ASSERT_TRUE(Write(dir_ + "/model.safetensors", {{"w", "F16", {1}, {0, 0}}}).ok());
  EXPECT_EQ(OpenCode(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CheckpointTest, TruncatedShardIsDataLossNamingTheFile) {
  ASSERT_TRUE(Write(dir_ + "/model.safetensors", Layer("l", 64, 8, 1)).ok());
  std::ifstream in(dir_ + "/model.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  WriteText(dir_ + "/model.safetensors", bytes.substr(0, bytes.size() - 4));
  EXPECT_EQ(OpenCode(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(OpenMessage(), HasSubstr(dir_ + "/model.safetensors"));
  EXPECT_THAT(OpenMessage(), HasSubstr("'l.scales'"));
}

TEST_F(CheckpointTest, NonAwqConfigsAreInvalidArgument) {
  ASSERT_TRUE(Write(dir_ + "/model.safetensors", Layer("l", 64, 8, 1)).ok());
  for (const char* qc : {
           R"({"quant_method":"compressed-tensors","format":"pack-quantized"})",
           R"({"quant_method":"gptq","bits":4,"group_size":128,"checkpoint_format":"marlin"})",
           R"({"quant_method":"awq","bits":8,"group_size":128})",
           R"({"quant_method":"awq","bits":4,"group_size":128,"version":"gemv"})",
           R"({"quant_method":"awq","bits":4,"group_size":128,"zero_point":false})",
           R"({"quant_method":"awq","bits":4,"group_size":0})",
           R"({"quant_method":"awq","group_size":128})",
       }) {
    WriteText(dir_ + "/config.json", std::string(R"({"quantization_config":)") + qc + "}");
    EXPECT_EQ(OpenCode(), absl::StatusCode::kInvalidArgument) << qc;
  }
  WriteText(dir_ + "/config.json", R"({"model_type":"llama"})");
  EXPECT_EQ(OpenCode(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(OpenMessage(), HasSubstr("quantization_config"));
  WriteText(dir_ + "/config.json", "{not json");
  EXPECT_EQ(OpenCode(), absl::StatusCode::kInvalidArgument);
}

// A *.safetensors that is not a regular file (a FIFO, a directory) is named, not passed over with
// "no *.safetensors files" (found by a new-user review).
TEST_F(CheckpointTest, ASafetensorsThatIsNotARegularFileIsNamed) {
  ASSERT_TRUE(std::filesystem::create_directory(dir_ + "/model.safetensors"));
  EXPECT_EQ(OpenCode(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(OpenMessage(),
              HasSubstr(": no *.safetensors files; model.safetensors is not a regular file"));
}

// quant_method that is there but not a string is named as such, not as missing.
TEST_F(CheckpointTest, QuantMethodOfTheWrongTypeIsNamed) {
  ASSERT_TRUE(Write(dir_ + "/model.safetensors", Layer("l", 64, 8, 1)).ok());
  WriteText(dir_ + "/config.json",
            R"({"quantization_config":{"quant_method":5,"bits":4,"group_size":64}})");
  EXPECT_EQ(OpenCode(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(OpenMessage(), HasSubstr("quantization_config field 'quant_method' is not a string"));
  WriteText(dir_ + "/config.json", R"({"quantization_config":{"bits":4,"group_size":64}})");
  EXPECT_EQ(OpenCode(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(OpenMessage(), HasSubstr("quantization_config field 'quant_method' is missing"));
}

// Every number is read exactly: 4294967300 (= 2^32 + 4) used to be narrowed to int and read as 4,
// and 4.0 or "4" used to be reported as "missing".
TEST_F(CheckpointTest, ConfigNumbersAreReadExactlyAndWrongTypesAreNamed) {
  ASSERT_TRUE(Write(dir_ + "/model.safetensors", Layer("l", 64, 8, 1)).ok());
  const std::string config = dir_ + "/config.json";
  const struct {
    const char* qc;
    std::string message;
  } cases[] = {
      {R"("bits":4294967300,"group_size":64)",
       "quantization_config field 'bits' is 4294967300, only 4 is served"},
      {R"("bits":4.0,"group_size":64)",
       "quantization_config field 'bits' must be an integer, got 4.0"},
      {R"("bits":"4","group_size":64)",
       "quantization_config field 'bits' must be an integer, got the string \"4\""},
      {R"("w_bit":null,"group_size":64)",
       "quantization_config field 'w_bit' must be an integer, got null"},
      {R"("bits":-4294967292,"group_size":64)",
       "quantization_config field 'bits' is -4294967292, only 4 is served"},
      {R"("bits":18446744073709551620,"group_size":64)",
       "quantization_config field 'bits' must be an integer, got 1.8446744073709552e+19"},
      {R"("bits":9223372036854775812,"group_size":64)",
       "quantization_config field 'bits' is 9223372036854775812, outside "
       "-9223372036854775808..9223372036854775807"},
      {R"("bits":4,"group_size":64.0)",
       "quantization_config field 'group_size' must be an integer, got 64.0"},
      {R"("bits":4,"q_group_size":"64")",
       "quantization_config field 'q_group_size' must be an integer, got the string \"64\""},
      {R"("bits":4,"group_size":[64])",
       "quantization_config field 'group_size' must be an integer, got array"},
      {R"("bits":4,"group_size":-4294967297)",
       "quantization_config field 'group_size' is -4294967297, want -1 or positive"},
      {R"("bits":4,"bits":8,"group_size":64)", "key 'bits' appears twice in one object"},
  };
  for (const auto& c : cases) {
    WriteText(config,
              std::string(R"({"quantization_config":{"quant_method":"awq",)") + c.qc + "}}");
    EXPECT_EQ(OpenCode(), absl::StatusCode::kInvalidArgument) << c.qc;
    EXPECT_EQ(OpenMessage(), config + ": " + c.message) << c.qc;
  }
  // The same numbers written exactly are accepted.
  WriteText(config,
            R"({"quantization_config":{"quant_method":"awq","w_bit":4,"q_group_size":64}})");
  absl::StatusOr<std::unique_ptr<Checkpoint>> ok = Checkpoint::Open(dir_);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->config().bits, 4);
  EXPECT_EQ((*ok)->config().group_size, 64);
}

TEST_F(CheckpointTest, RegularFileIsInvalidArgumentNotADirectory) {
  absl::Status s = Checkpoint::Open(dir_ + "/config.json").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "checkpoint '" + dir_ + "/config.json' is not a directory");
}

TEST_F(CheckpointTest, MissingDirConfigOrShardsIsNotFound) {
  EXPECT_EQ(Checkpoint::Open(dir_ + "/nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(OpenCode(), absl::StatusCode::kNotFound);  // config.json but no *.safetensors
  ASSERT_EQ(::unlink((dir_ + "/config.json").c_str()), 0);
  EXPECT_EQ(OpenCode(), absl::StatusCode::kNotFound);
  EXPECT_THAT(OpenMessage(), HasSubstr("config.json"));
}

// A config.json that is a directory is named as such, not as missing (new-user review).
TEST_F(CheckpointTest, AConfigJsonThatIsADirectoryIsNotARegularFile) {
  ASSERT_EQ(::unlink((dir_ + "/config.json").c_str()), 0);
  ASSERT_TRUE(std::filesystem::create_directory(dir_ + "/config.json"));
  EXPECT_EQ(OpenCode(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(OpenMessage(), HasSubstr("config.json: not a regular file"));
}

// The bundled model (scripts/make-model.sh), when DEQUANTD_MODEL_DIR points at it: every layer
// of SmolLM2-135M is found with its shape, and the C++ reference reproduces, byte for byte, the
// fp16 result the Python tool computed independently (REF/expected.<layer>.fp16.safetensors).
TEST(BundledModelTest, OpensAndMatchesPythonExpectedOutput) {
  const char* dir = std::getenv("DEQUANTD_MODEL_DIR");
  if (dir == nullptr || *dir == '\0') GTEST_SKIP() << "DEQUANTD_MODEL_DIR is not set";
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->layers().size(), 30u * 7u);
  struct Want {
    const char* layer;
    int64_t K, N, G;
  };
  for (const Want& w : {Want{"model.layers.0.self_attn.q_proj", 576, 576, 64},
                        Want{"model.layers.0.mlp.down_proj", 1536, 576, 128},
                        Want{"model.layers.29.self_attn.k_proj", 576, 192, 64},
                        Want{"model.layers.17.mlp.gate_proj", 576, 1536, 64}}) {
    const QuantizedLayer* l = (*ckpt)->Find(w.layer);
    ASSERT_NE(l, nullptr) << w.layer;
    EXPECT_EQ(l->view.shape.K, w.K) << w.layer;
    EXPECT_EQ(l->view.shape.N, w.N) << w.layer;
    EXPECT_EQ(l->view.shape.group_size, w.G) << w.layer;
    EXPECT_EQ(l->view.shape.scale_dtype, DType::kF16) << w.layer;
  }
  for (const std::string layer :
       {"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj"}) {
    const std::string path =
        std::string(dir) + "-reference/expected." + layer + ".fp16.safetensors";
    absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> expected =
        safetensors::MappedFile::Open(path);
    ASSERT_TRUE(expected.ok()) << expected.status();
    absl::StatusOr<absl::Span<const uint8_t>> want = (*expected)->TensorBytes(layer + ".weight");
    ASSERT_TRUE(want.ok()) << want.status();
    const QuantizedLayer* l = (*ckpt)->Find(layer);
    ASSERT_NE(l, nullptr);
    std::vector<uint8_t> got(static_cast<size_t>(l->view.shape.output_bytes(DType::kF16)));
    ASSERT_TRUE(DequantizeReference(l->view, DType::kF16, 0, l->view.shape.K, got.data()).ok());
    ASSERT_EQ(got.size(), want->size()) << layer;
    EXPECT_EQ(std::memcmp(got.data(), want->data(), got.size()), 0) << layer;
  }
}

}  // namespace
}  // namespace dequantd
