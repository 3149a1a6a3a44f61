// MXFP4 (gpt-oss) against transformers' own convert_moe_packed_tensors: every case of
// tests/data/formats/mxfp4/ (made by tools/format_vectors/make_vectors.py with transformers 5.23.0;
// docs/formats/mxfp4.md) is opened as a checkpoint (its config.json and its safetensors file as
// model.safetensors: detection from quant_method "mxfp4", layers from the <prefix>_blocks /
// <prefix>_scales tensors, the expert axis from their shapes), and both MoE projections are
// dequantized by the CPU reference and the CPU path into fp16, bf16 and fp32, in the format's own
// orientation ([E, in, out], compared bit for bit with expected.<proj>.<dtype>) and in NK ([E, out,
// in], compared with its per-expert transpose). Also the refusals, inline requests by role, a
// served checkpoint end to end on the CPU backend (list, info, Dequantize, DequantizeLayers, a byte
// range, ReadTensor of a bias), and (GPU only) the CUDA backend on every case.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "formats/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_dequant_internal.h"
#include "kernels/dequant.h"
#include "kernels/mxfp4_format.h"
#include "server/backend/backend.h"
#include "server/model/checkpoint.h"
#include "server/rpc/request.h"
#if DEQUANTD_HAVE_CUDA
#include "server/backend/cuda/cuda_backend.h"
#endif
#include "tests/server/cpu_test_server.h"
#include "tests/server/format_vectors.h"

namespace dequantd {
namespace {

namespace fs = std::filesystem;
namespace v1 = ::dequant::v1;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::MakeCheckpoint;
using testing::ReadText;
using testing::TensorOf;

constexpr char kExperts[] = "model.layers.0.mlp.experts";
constexpr char kGateUp[] = "model.layers.0.mlp.experts.gate_up_proj";
constexpr char kDown[] = "model.layers.0.mlp.experts.down_proj";
constexpr int64_t kE = 2;
constexpr int64_t kHidden = 64;        // H
constexpr int64_t kIntermediate = 32;  // I

fs::path VectorDir() { return testing::VectorDir("mxfp4"); }
std::string CaseConfig(const std::string& name) {
  return ReadText(VectorDir() / (name + ".config.json"));
}
fs::path CaseFile(const std::string& name) { return VectorDir() / (name + ".safetensors"); }

struct Projection {
  const char* layer;
  const char* proj;  // expected.<proj>.<dtype>
  int64_t K;         // in
  int64_t N;         // out
};
// gate_up_proj: in = H, out = 2I; down_proj: in = I, out = H.
constexpr Projection kProjections[] = {{kGateUp, "gate_up_proj", kHidden, 2 * kIntermediate},
                                       {kDown, "down_proj", kIntermediate, kHidden}};

constexpr const char* kCases[] = {"mxfp4_gptoss_e2", "mxfp4_edge_exponents_e2"};
constexpr DType kOutDtypes[] = {DType::kF16, DType::kBF16, DType::kF32};

std::string ExpectedName(const Projection& p, DType out) {
  return std::string("expected.") + p.proj + "." + std::string(DTypeName(out));
}

// [E, K, N] -> [E, N, K]: each expert's (K, N) transposed.
std::vector<uint8_t> PerExpertTranspose(const std::vector<uint8_t>& kn, int64_t E, int64_t K,
                                        int64_t N, int64_t elem) {
  std::vector<uint8_t> nk;
  const size_t per = static_cast<size_t>(K * N * elem);
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<uint8_t> one(kn.begin() + static_cast<ptrdiff_t>(e * per),
                                   kn.begin() + static_cast<ptrdiff_t>((e + 1) * per));
    const std::vector<uint8_t> t = testing::TransposeNk(one, K, N, elem);  // (K, N) -> (N, K)
    nk.insert(nk.end(), t.begin(), t.end());
  }
  return nk;
}

class Mxfp4VectorsTest : public ::testing::TestWithParam<const char*> {};

// Every CPU path, both orientations, every output dtype, both projections, against transformers'.
TEST_P(Mxfp4VectorsTest, CheckpointDequantizesBitExactToTransformers) {
  const std::string name = GetParam();
  const fs::path dir = MakeCheckpoint(CaseConfig(name), CaseFile(name));
  ASSERT_FALSE(dir.empty());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->config().format, Format::kMxfp4);
  ASSERT_EQ((*ckpt)->layers().size(), 2u);
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> vectors =
      safetensors::MappedFile::Open(CaseFile(name).string());
  ASSERT_TRUE(vectors.ok()) << vectors.status();
  for (const Projection& p : kProjections) {
    SCOPED_TRACE(p.proj);
    const QuantizedLayer* layer = (*ckpt)->Find(p.layer);
    ASSERT_NE(layer, nullptr);
    EXPECT_EQ(layer->view.shape, mxfp4::MakeShape(p.K, p.N, kE));  // KN: the format's own
    EXPECT_EQ((*ckpt)->StoredTensorName(layer->index, mxfp4::kBlocks),
              std::string(p.layer) + "_blocks");
    for (DType out : kOutDtypes) {
      SCOPED_TRACE(std::string(DTypeName(out)));
      const int64_t elem = DTypeSize(out);
      const std::vector<uint8_t> expected = TensorOf(**vectors, ExpectedName(p, out));
      ASSERT_EQ(static_cast<int64_t>(expected.size()), kE * p.K * p.N * elem);
      const std::vector<uint8_t> expected_nk = PerExpertTranspose(expected, kE, p.K, p.N, elem);
      for (Orientation o : {Orientation::kKN, Orientation::kNK}) {
        SCOPED_TRACE(std::string(OrientationName(o)));
        QuantView view = layer->view;
        view.shape.orientation = o;
        const std::vector<uint8_t>& want = o == Orientation::kKN ? expected : expected_nk;
        const int64_t rows = view.shape.result_rows();
        const int64_t row_bytes = view.shape.result_cols() * elem;
        std::vector<uint8_t> got(want.size(), 0xA5);
        ASSERT_TRUE(DequantizeReference(view, out, 0, rows, got.data()).ok());
        EXPECT_TRUE(got == want) << "reference";
        for (int threads : {1, 3}) {
          const cpu::CpuDequantOptions options{.threads = threads, .min_elements_per_thread = 1};
          std::vector<uint8_t> fast(want.size(), 0xA5);
          ASSERT_TRUE(cpu::DequantizeCpuWithOptions(view, out, 0, rows, fast.data(), options).ok());
          EXPECT_TRUE(fast == want) << "cpu, threads " << threads;
          // Rows [rows/2 - 5, rows/2 + 7): inside a block, across the expert boundary.
          const int64_t begin = rows / 2 - 5;
          const int64_t end = rows / 2 + 7;
          std::vector<uint8_t> part(static_cast<size_t>((end - begin) * row_bytes), 0xA5);
          ASSERT_TRUE(
              cpu::DequantizeCpuWithOptions(view, out, begin, end, part.data(), options).ok());
          EXPECT_EQ(0, std::memcmp(part.data(), want.data() + begin * row_bytes, part.size()));
        }
      }
    }
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Cases, Mxfp4VectorsTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

// The edge case holds what it is for: fp16 infinities (scales >= 143) and zeros from underflow
// where bf16 keeps a nonzero value, so the comparisons above cover fp16's overflow and underflow.
TEST(Mxfp4FormatTest, EdgeVectorsHoldOverflowAndUnderflow) {
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> f =
      safetensors::MappedFile::Open(CaseFile("mxfp4_edge_exponents_e2").string());
  ASSERT_TRUE(f.ok());
  const std::vector<uint8_t> fp16 = TensorOf(**f, "expected.gate_up_proj.fp16");
  const std::vector<uint8_t> bf16 = TensorOf(**f, "expected.gate_up_proj.bf16");
  ASSERT_EQ(fp16.size(), bf16.size());
  int infs = 0;
  int flushed = 0;
  for (size_t i = 0; i < fp16.size(); i += 2) {
    const uint16_t h = static_cast<uint16_t>(fp16[i] | fp16[i + 1] << 8);
    const uint16_t b = static_cast<uint16_t>(bf16[i] | bf16[i + 1] << 8);
    infs += (h & 0x7FFF) == 0x7C00;
    flushed += (h & 0x7FFF) == 0 && (b & 0x7FFF) != 0;
  }
  EXPECT_GT(infs, 0);
  EXPECT_GT(flushed, 0);
}

// ---- Refusals ----------------------------------------------------------------------------------

constexpr char kCase[] = "mxfp4_gptoss_e2";

struct EditableTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// A checkpoint of kCase's model tensors (not the expected results) after `edit`.
fs::path EditedCheckpoint(const std::function<void(std::vector<EditableTensor>&)>& edit) {
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> src =
      safetensors::MappedFile::Open(CaseFile(kCase).string());
  EXPECT_TRUE(src.ok()) << src.status();
  if (!src.ok()) return {};
  std::vector<EditableTensor> tensors;
  for (const auto& [tensor, entry] : (*src)->header().tensors) {
    if (tensor.rfind(kExperts, 0) != 0) continue;
    tensors.push_back({tensor, entry.dtype, entry.shape, TensorOf(**src, tensor)});
  }
  edit(tensors);
  std::vector<safetensors::TensorToWrite> out;
  for (const EditableTensor& t : tensors) out.push_back({t.name, t.dtype, t.shape, t.bytes});
  const fs::path dir = testing::MakeConfigDir(CaseConfig(kCase));
  if (dir.empty()) return dir;
  EXPECT_TRUE(safetensors::WriteFile((dir / "model.safetensors").string(), out).ok());
  return dir;
}

EditableTensor* Find(std::vector<EditableTensor>& tensors, const std::string& name) {
  for (EditableTensor& t : tensors)
    if (t.name == name) return &t;
  ADD_FAILURE() << name << " not in the case";
  static EditableTensor none;
  return &none;
}

absl::Status OpenStatus(const fs::path& dir) {
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  fs::remove_all(dir);
  return ckpt.status();
}

TEST(Mxfp4CheckpointTest, ScalesThatDoNotCoverTheBlocksAreInvalidArgument) {
  const absl::Status s = OpenStatus(EditedCheckpoint([](std::vector<EditableTensor>& t) {
    EditableTensor* scales = Find(t, std::string(kDown) + "_scales");
    scales->shape = {2, 32, 2};  // 64 rows of one block stored as 32 rows of two
  }));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("tensor 'model.layers.0.mlp.experts.down_proj_scales' (layer "
                        "'model.layers.0.mlp.experts.down_proj'): field 'shape' is (2, 32, 2), "
                        "want (E, N, K/32) = (2, 64, 1) for blocks (2, 64, 1, 16)"));
}

TEST(Mxfp4CheckpointTest, BlocksNotOfBytesAreInvalidArgument) {
  const absl::Status s = OpenStatus(EditedCheckpoint([](std::vector<EditableTensor>& t) {
    EditableTensor* blocks = Find(t, std::string(kGateUp) + "_blocks");
    blocks->dtype = "I8";
  }));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("tensor 'model.layers.0.mlp.experts.gate_up_proj_blocks' (layer "
                        "'model.layers.0.mlp.experts.gate_up_proj'): field 'dtype' is I8, want "
                        "U8"));
}

TEST(Mxfp4CheckpointTest, BlocksWithoutScalesAreFailedPrecondition) {
  const absl::Status s = OpenStatus(EditedCheckpoint([](std::vector<EditableTensor>& t) {
    std::erase_if(
        t, [](const EditableTensor& e) { return e.name == std::string(kGateUp) + "_scales"; });
  }));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr(": tensor 'model.layers.0.mlp.experts.gate_up_proj_blocks' (layer "
                        "'model.layers.0.mlp.experts.gate_up_proj', format mxfp4): the layer has "
                        "no scales tensor: 'model.layers.0.mlp.experts.gate_up_proj_scales' is "
                        "missing"));
}

TEST(Mxfp4CheckpointTest, BlocksOfHalfBlocksAreInvalidArgument) {
  const absl::Status s = OpenStatus(EditedCheckpoint([](std::vector<EditableTensor>& t) {
    EditableTensor* blocks = Find(t, std::string(kDown) + "_blocks");
    blocks->shape = {2, 64, 2, 8};
  }));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("down_proj_blocks' (layer "
                                     "'model.layers.0.mlp.experts.down_proj'): field 'shape' is "
                                     "(2, 64, 2, 8), want a last dim of 16 bytes (32 E2M1 "
                                     "values)"));
}

// ---- Inline requests ---------------------------------------------------------------------------

v1::InlinePackedTensor InlineOf(const safetensors::MappedFile& file, const Projection& p) {
  v1::InlinePackedTensor packed;
  packed.set_format("mxfp4");
  packed.set_in_features(p.K);
  packed.set_out_features(p.N);
  packed.set_group_size(32);
  packed.set_scale_dtype(v1::DTYPE_UINT8);
  packed.set_experts(kE);
  for (const char* role : {"blocks", "scales"}) {
    const std::vector<uint8_t> bytes = TensorOf(file, std::string(p.layer) + "_" + role);
    v1::RoleBytes* t = packed.add_tensors();
    t->set_role(role);
    t->set_data(std::string(bytes.begin(), bytes.end()));
  }
  return packed;
}

TEST(Mxfp4InlineTest, ByRoleWithExpertsDequantizesToTheVectors) {
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> file =
      safetensors::MappedFile::Open(CaseFile(kCase).string());
  ASSERT_TRUE(file.ok());
  const Projection& p = kProjections[0];
  const v1::InlinePackedTensor packed = InlineOf(**file, p);  // the view points into its bytes
  absl::StatusOr<InlineTensor> tensor = InlineTensor::FromProto(packed, 1 << 30);
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_EQ(tensor->view().shape, mxfp4::MakeShape(p.K, p.N, kE));
  const std::vector<uint8_t> expected = TensorOf(**file, ExpectedName(p, DType::kBF16));
  std::vector<uint8_t> got(expected.size());
  ASSERT_TRUE(DequantizeCpu(tensor->view(), DType::kBF16, 0, kE * p.K, got.data()).ok());
  EXPECT_TRUE(got == expected);
}

TEST(Mxfp4InlineTest, WrongBytesAndScaleDtypeAreInvalidArgument) {
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> file =
      safetensors::MappedFile::Open(CaseFile(kCase).string());
  ASSERT_TRUE(file.ok());
  v1::InlinePackedTensor packed = InlineOf(**file, kProjections[1]);
  packed.set_experts(1);  // the bytes are two experts'
  absl::StatusOr<InlineTensor> tensor = InlineTensor::FromProto(packed, 1 << 30);
  EXPECT_EQ(tensor.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tensor.status().message(),
              HasSubstr("packed.blocks has 2048 bytes, expected 1024 (64 * 16 * 1 (uint8))"));
  packed = InlineOf(**file, kProjections[1]);
  packed.set_scale_dtype(v1::DTYPE_UNSPECIFIED);
  tensor = InlineTensor::FromProto(packed, 1 << 30);
  EXPECT_EQ(tensor.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tensor.status().message(),
              HasSubstr("packed: scales dtype must be uint8 (E8M0) for mxfp4, got fp16"));
  // Formats without an expert axis refuse experts.
  v1::InlinePackedTensor awq;
  awq.set_in_features(128);
  awq.set_out_features(8);
  awq.set_group_size(128);
  awq.set_experts(2);
  awq.set_qweight(std::string(128 * 4, '\0'));
  awq.set_qzeros(std::string(4, '\0'));
  awq.set_scales(std::string(8 * 2, '\0'));
  tensor = InlineTensor::FromProto(awq, 1 << 30);
  EXPECT_EQ(tensor.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tensor.status().message(),
              HasSubstr("packed: experts must be 1 for awq_gemm, got 2"));
}

// ---- Served end to end (CPU backend) -----------------------------------------------------------

// The case served on the CPU backend: ListTensors names both projections (format mxfp4, KN,
// experts 2, in/out features, the stored blocks and scales as U8) and lists the biases and the
// expected tensors as raw tensors; GetServerInfo counts two layers; DequantizeLayers with no
// orientation delivers transformers' [E, in, out] bytes with an [E, K, N] header; Dequantize with
// ORIENTATION_NK delivers [E, out, in]; a byte range starting in expert 1 is that slice; ReadTensor
// serves a bias's bytes as stored; the Benchmark RPC times the loaded layer as mxfp4.
TEST(Mxfp4ServedTest, ListInfoDequantizeLayersRangesAndRawTensors) {
  const fs::path dir = MakeCheckpoint(CaseConfig(kCase), CaseFile(kCase));
  ASSERT_FALSE(dir.empty());
  ServerOptions options;
  options.model_dir = dir.string();
  absl::StatusOr<testing::CpuTestServer> server = testing::StartCpuTestServer(options);
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> vectors =
      safetensors::MappedFile::Open(CaseFile(kCase).string());
  ASSERT_TRUE(vectors.ok());

  grpc::ClientContext list_context;
  v1::ListTensorsResponse list;
  ASSERT_TRUE(server->stub->ListTensors(&list_context, {}, &list).ok());
  ASSERT_EQ(list.tensors_size(), 2);
  const v1::QuantizedTensorInfo& down = list.tensors(0);  // sorted by name
  EXPECT_EQ(down.name(), kDown);
  EXPECT_EQ(down.format(), "mxfp4");
  EXPECT_EQ(down.orientation(), v1::ORIENTATION_KN);
  EXPECT_EQ(down.experts(), kE);
  EXPECT_EQ(down.in_features(), kIntermediate);
  EXPECT_EQ(down.out_features(), kHidden);
  EXPECT_EQ(down.group_size(), 32);
  EXPECT_EQ(down.scale_dtype(), v1::DTYPE_UINT8);
  EXPECT_EQ(down.packed_bytes(), kE * kHidden * (16 + 1));
  ASSERT_EQ(down.stored_tensors_size(), 2);
  EXPECT_EQ(down.stored_tensors(0).role(), "blocks");
  EXPECT_EQ(down.stored_tensors(0).dtype(), v1::DTYPE_UINT8);
  EXPECT_THAT(down.stored_tensors(0).shape(), ElementsAre(kE * kHidden, 16));  // (E*N, K/2)
  EXPECT_EQ(down.stored_tensors(1).role(), "scales");
  EXPECT_THAT(down.stored_tensors(1).shape(), ElementsAre(kE * kHidden, 1));
  EXPECT_EQ(list.tensors(1).name(), kGateUp);
  std::vector<std::string> raw;
  for (const v1::RawTensorInfo& t : list.other_tensors()) raw.push_back(t.name());
  EXPECT_THAT(
      raw, ::testing::IsSupersetOf({std::string(kDown) + "_bias", std::string(kGateUp) + "_bias"}));
  EXPECT_THAT(raw, ::testing::Not(::testing::Contains(std::string(kDown) + "_blocks")));

  grpc::ClientContext info_context;
  v1::GetServerInfoResponse server_info;
  ASSERT_TRUE(server->stub->GetServerInfo(&info_context, {}, &server_info).ok());
  EXPECT_EQ(server_info.tensor_count(), 2);

  v1::DequantizeLayersRequest layers;
  layers.add_tensors(kGateUp);
  layers.set_output_dtype(v1::DTYPE_BF16);
  grpc::ClientContext layers_context;
  auto layers_reader = server->stub->DequantizeLayers(&layers_context, layers);
  testing::ReadStream all = testing::ReadAll(layers_reader);
  ASSERT_TRUE(all.status.ok()) << all.status.error_message();
  EXPECT_EQ(all.header.orientation(), v1::ORIENTATION_KN);
  EXPECT_THAT(all.header.shape(), ElementsAre(kE, kHidden, 2 * kIntermediate));
  EXPECT_EQ(all.header.total_bytes(), kE * kHidden * 2 * kIntermediate * 2);
  EXPECT_TRUE(all.bytes == TensorOf(**vectors, "expected.gate_up_proj.bf16"));

  const std::vector<uint8_t> fp32 = TensorOf(**vectors, "expected.down_proj.fp32");
  v1::DequantizeRequest one;
  one.set_tensor(kDown);
  one.set_output_dtype(v1::DTYPE_FP32);
  one.set_orientation(v1::ORIENTATION_NK);
  grpc::ClientContext one_context;
  auto one_reader = server->stub->Dequantize(&one_context, one);
  testing::ReadStream nk = testing::ReadAll(one_reader);
  ASSERT_TRUE(nk.status.ok()) << nk.status.error_message();
  EXPECT_EQ(nk.header.orientation(), v1::ORIENTATION_NK);
  EXPECT_THAT(nk.header.shape(), ElementsAre(kE, kHidden, kIntermediate));
  EXPECT_TRUE(nk.bytes == PerExpertTranspose(fp32, kE, kIntermediate, kHidden, 4));

  // Bytes [offset, offset + length) of the default (KN) result: from inside expert 0's last row
  // into expert 1.
  const int64_t offset = (kIntermediate - 1) * kHidden * 4 + 40;
  const int64_t length = 3 * kHidden * 4;
  v1::DequantizeRequest range;
  range.set_tensor(kDown);
  range.set_output_dtype(v1::DTYPE_FP32);
  range.set_offset(offset);
  range.set_length(length);
  grpc::ClientContext range_context;
  auto range_reader = server->stub->Dequantize(&range_context, range);
  testing::ReadStream part = testing::ReadAll(range_reader);
  ASSERT_TRUE(part.status.ok()) << part.status.error_message();
  EXPECT_TRUE(part.bytes ==
              std::vector<uint8_t>(fp32.begin() + offset, fp32.begin() + offset + length));

  v1::ReadTensorRequest read;
  read.set_name(std::string(kDown) + "_bias");
  grpc::ClientContext read_context;
  auto read_reader = server->stub->ReadTensor(&read_context, read);
  v1::ReadTensorResponse response;
  std::vector<uint8_t> bias;
  while (read_reader->Read(&response))
    bias.insert(bias.end(), response.data().begin(), response.data().end());
  ASSERT_TRUE(read_reader->Finish().ok());
  EXPECT_TRUE(bias == TensorOf(**vectors, std::string(kDown) + "_bias"));

  // The Benchmark RPC times a loaded layer in its own format (random inputs of its shape).
  v1::BenchmarkRequest bench;
  bench.add_tensors(kDown);
  bench.set_trials(1);
  bench.set_runs(1);
  grpc::ClientContext bench_context;
  v1::BenchmarkResponse timed;
  const grpc::Status bench_status = server->stub->Benchmark(&bench_context, bench, &timed);
  ASSERT_TRUE(bench_status.ok()) << bench_status.error_message();
  ASSERT_GT(timed.rows_size(), 0);
  for (const v1::BenchmarkRow& row : timed.rows()) {
    EXPECT_EQ(row.format(), "mxfp4");
    EXPECT_EQ(row.experts(), kE);
    EXPECT_EQ(row.in_features(), kIntermediate);
    EXPECT_TRUE(row.correct()) << row.variant();
  }
  server->server.reset();
  fs::remove_all(dir);
}

#if DEQUANTD_HAVE_CUDA
// Every case on the CUDA backend (resident layers), with each variant (v4_vec16, the configured
// default: (E, N, K) by 16-byte blocks, (E, K, N) by transpose tiles; v1_per_element): both
// projections in both orientations give transformers' bytes (or their per-expert transpose), for
// fp16, bf16 and fp32. GPU only.
TEST_P(Mxfp4VectorsTest, CudaBackendDequantizesBitExactToTransformers) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string name = GetParam();
  const fs::path dir = MakeCheckpoint(CaseConfig(name), CaseFile(name));
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> vectors =
      safetensors::MappedFile::Open(CaseFile(name).string());
  ASSERT_TRUE(vectors.ok());
  for (cuda::KernelVariant variant :
       {cuda::KernelVariant::kV4Vec16, cuda::KernelVariant::kV1PerElement}) {
    SCOPED_TRACE(std::string(cuda::VariantName(variant)));
    CudaBackendOptions backend_options;
    backend_options.variant = variant;
    absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend(backend_options);
    ASSERT_TRUE(backend.ok()) << backend.status();
    ASSERT_TRUE((*backend)->Prepare(**ckpt).ok());
    for (const Projection& p : kProjections) {
      const QuantizedLayer* layer = (*ckpt)->Find(p.layer);
      ASSERT_NE(layer, nullptr);
      for (DType out : kOutDtypes) {
        SCOPED_TRACE(std::string(p.proj) + " " + std::string(DTypeName(out)));
        const std::vector<uint8_t> kn = TensorOf(**vectors, ExpectedName(p, out));
        DequantSource source;
        source.layer = layer;
        source.orientation = Orientation::kKN;
        testing::BytesSink sink;
        ASSERT_TRUE((*backend)->Dequantize(source, out, 1 << 20, sink).ok());
        EXPECT_THAT(sink.kernel, HasSubstr(std::string(cuda::VariantName(variant))));
        EXPECT_TRUE(sink.bytes == kn);
        source.orientation = Orientation::kNK;
        testing::BytesSink nk_sink;
        ASSERT_TRUE((*backend)->Dequantize(source, out, 1 << 20, nk_sink).ok());
        EXPECT_TRUE(nk_sink.bytes == PerExpertTranspose(kn, kE, p.K, p.N, DTypeSize(out)));
      }
    }
    backend->reset();
  }
  fs::remove_all(dir);
}
#endif  // DEQUANTD_HAVE_CUDA

}  // namespace
}  // namespace dequantd
