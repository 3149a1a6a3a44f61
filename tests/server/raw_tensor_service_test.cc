// Tests for issue 10's service side: ListTensors' other_tensors, GetServerInfo's
// model_config_json and the ReadTensor stream, against a real DequantServer (CPU backend,
// 127.0.0.1, ephemeral port) serving a checkpoint written here with known raw tensors: the bytes
// come back exactly as written, in consecutive chunks, and every bad request gets its exact code
// with the field named.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <filesystem>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "dequant/v1/dequant.grpc.pb.h"
#include "formats/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/model/checkpoint.h"
#include "server/model/raw_tensor.h"
#include "server/server.h"
#include "tests/regions/shm_file.h"
#include "tests/server/cpu_test_server.h"
#include "tests/server/test_layer.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kConfig[] =
    R"({"model_type":"llama","hidden_size":8,"quantization_config":{"quant_method":"awq",)"
    R"("bits":4,"group_size":128,"zero_point":true,"version":"gemm"}})";

struct Owned {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (uint8_t& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

template <typename T>
std::vector<uint8_t> AsBytes(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// The whole stream of one ReadTensor call.
struct ReadResult {
  grpc::Status status;
  int headers = 0;
  bool header_first = false;
  v1::RawTensorInfo header;
  std::vector<int64_t> chunk_sizes;
  bool offsets_consecutive = true;
  std::vector<uint8_t> bytes;
};

class RawTensorServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = ::testing::TempDir() + "/raw_tensor_test.XXXXXX";
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    std::ofstream(dir_ + "/config.json", std::ios::binary) << kConfig;
    const QuantShape shape{.K = 128, .N = 16, .group_size = 128, .scale_dtype = DType::kF16};
    const testing::PackedLayer layer = testing::RandomPackedLayer(shape, 3);
    tensors_ = {
        {"model.layers.0.mlp.down_proj.qweight", "I32", {128, 2}, AsBytes(layer.qweight)},
        {"model.layers.0.mlp.down_proj.qzeros", "I32", {1, 2}, AsBytes(layer.qzeros)},
        {"model.layers.0.mlp.down_proj.scales", "F16", {1, 16}, AsBytes(layer.scales)},
        {"model.embed_tokens.weight", "F16", {100, 400}, RandomBytes(100 * 400 * 2, 1)},
        {"model.norm.weight", "F32", {16}, RandomBytes(16 * 4, 2)},
        {"lm_head.bias", "BF16", {16}, RandomBytes(16 * 2, 4)},
        {"position_ids", "I64", {3}, AsBytes(std::vector<int64_t>{7, -1, 1LL << 40})},
        {"empty", "F16", {0, 4}, {}},
    };
    std::vector<safetensors::TensorToWrite> views;
    for (const Owned& t : tensors_) {
      views.push_back({t.name, t.dtype, t.shape, absl::MakeConstSpan(t.bytes)});
    }
    ASSERT_TRUE(safetensors::WriteFile(dir_ + "/model.safetensors", views).ok());
  }
  // The server read the files at start and closed them: the directory can go.
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  void Start(bool with_model = true, const std::string& shared_memory = "off") {
    ServerOptions options;
    options.model_dir = with_model ? dir_ : "";
    options.shared_memory = shared_memory;
    absl::StatusOr<testing::CpuTestServer> started = testing::StartCpuTestServer(options);
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = std::move(started->server);
    stub_ = std::move(started->stub);
  }

  ReadResult Read(const std::string& name, int64_t chunk_bytes = 0) {
    v1::ReadTensorRequest request;
    request.set_name(name);
    request.set_chunk_bytes(chunk_bytes);
    grpc::ClientContext context;
    auto reader = stub_->ReadTensor(&context, request);
    ReadResult r;
    v1::ReadTensorResponse message;
    int index = 0;
    while (reader->Read(&message)) {
      if (message.has_header()) {
        if (index == 0) r.header_first = true;
        ++r.headers;
        r.header = message.header();
      }
      if (!message.data().empty()) {
        if (message.offset() != static_cast<int64_t>(r.bytes.size())) r.offsets_consecutive = false;
        r.chunk_sizes.push_back(static_cast<int64_t>(message.data().size()));
        r.bytes.insert(r.bytes.end(), message.data().begin(), message.data().end());
      }
      ++index;
    }
    r.status = reader->Finish();
    return r;
  }

  const Owned& Named(const std::string& name) const {
    for (const Owned& t : tensors_)
      if (t.name == name) return t;
    ADD_FAILURE() << name;
    return tensors_[0];
  }

  std::string dir_;
  std::vector<Owned> tensors_;
  std::unique_ptr<DequantServer> server_;
  std::unique_ptr<v1::DequantService::Stub> stub_;
};

TEST_F(RawTensorServiceTest, ListsOtherTensorsSortedWithDtypeShapeAndBytes) {
  Start();
  grpc::ClientContext context;
  v1::ListTensorsResponse list;
  ASSERT_TRUE(stub_->ListTensors(&context, {}, &list).ok());
  ASSERT_EQ(list.tensors_size(), 1);
  EXPECT_EQ(list.tensors(0).name(), "model.layers.0.mlp.down_proj");
  std::vector<std::string> names;
  for (const v1::RawTensorInfo& info : list.other_tensors()) {
    names.push_back(info.name());
    const Owned& t = Named(info.name());
    EXPECT_EQ(info.dtype(), t.dtype) << t.name;
    EXPECT_EQ(std::vector<int64_t>(info.shape().begin(), info.shape().end()), t.shape) << t.name;
    EXPECT_EQ(info.bytes(), static_cast<int64_t>(t.bytes.size())) << t.name;
  }
  // The layer's qweight/qzeros/scales are not "other" tensors.
  EXPECT_THAT(names, ElementsAre("empty", "lm_head.bias", "model.embed_tokens.weight",
                                 "model.norm.weight", "position_ids"));
}

TEST_F(RawTensorServiceTest, ServerInfoCarriesConfigJsonVerbatim) {
  Start();
  grpc::ClientContext context;
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(stub_->GetServerInfo(&context, {}, &info).ok());
  EXPECT_EQ(info.model_config_json(), kConfig);
}

TEST_F(RawTensorServiceTest, StreamsEveryTensorExactlyAsStored) {
  Start();
  for (const char* name :
       {"model.embed_tokens.weight", "model.norm.weight", "lm_head.bias", "position_ids"}) {
    const Owned& t = Named(name);
    const ReadResult r = Read(name);
    ASSERT_TRUE(r.status.ok()) << name << ": " << r.status.error_message();
    EXPECT_TRUE(r.header_first) << name;
    EXPECT_EQ(r.headers, 1) << name;
    EXPECT_EQ(r.header.name(), name);
    EXPECT_EQ(r.header.dtype(), t.dtype);
    EXPECT_EQ(r.header.bytes(), static_cast<int64_t>(t.bytes.size()));
    EXPECT_TRUE(r.offsets_consecutive) << name;
    EXPECT_EQ(r.bytes, t.bytes) << name;
  }
  // I64 values survive unchanged (little-endian on the wire).
  const ReadResult ids = Read("position_ids");
  int64_t values[3];
  ASSERT_EQ(ids.bytes.size(), sizeof values);
  std::memcpy(values, ids.bytes.data(), sizeof values);
  EXPECT_THAT(values, ElementsAre(7, -1, int64_t{1} << 40));
}

TEST_F(RawTensorServiceTest, ChunksAreChunkBytesLongClampedToTheMinimum) {
  Start();
  // 80000 bytes with chunk_bytes 1000, clamped up to 64 KiB: 65536 + 14464.
  const ReadResult r = Read("model.embed_tokens.weight", 1000);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_THAT(r.chunk_sizes, ElementsAre(65536, 80000 - 65536));
  EXPECT_EQ(r.bytes, Named("model.embed_tokens.weight").bytes);
}

TEST_F(RawTensorServiceTest, EmptyTensorSendsOnlyTheHeader) {
  Start();
  const ReadResult r = Read("empty");
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.headers, 1);
  EXPECT_THAT(std::vector<int64_t>(r.header.shape().begin(), r.header.shape().end()),
              ElementsAre(0, 4));
  EXPECT_EQ(r.header.bytes(), 0);
  EXPECT_TRUE(r.bytes.empty());
}

TEST_F(RawTensorServiceTest, BadRequestsGetExactCodesNamingTheField) {
  Start();
  ReadResult r = Read("no.such.tensor");
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(r.status.error_message(), HasSubstr("name \"no.such.tensor\""));
  EXPECT_EQ(r.headers, 0);

  r = Read("model.layers.0.mlp.down_proj");
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(r.status.error_message(), HasSubstr("quantized layer, use Dequantize"));

  r = Read("model.layers.0.mlp.down_proj.qweight");  // a layer's part is not served raw
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::NOT_FOUND);

  r = Read("");
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(r.status.error_message(), HasSubstr("name"));

  r = Read("model.norm.weight", -1);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(r.status.error_message(), HasSubstr("chunk_bytes"));

  // Still serving.
  EXPECT_TRUE(Read("model.norm.weight").status.ok());
}

TEST_F(RawTensorServiceTest, NoModelIsFailedPrecondition) {
  Start(/*with_model=*/false);
  const ReadResult r = Read("model.norm.weight");
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  grpc::ClientContext context;
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(stub_->GetServerInfo(&context, {}, &info).ok());
  EXPECT_EQ(info.model_config_json(), "");
}

TEST_F(RawTensorServiceTest, TruncatedOrReplacedFileIsDataLossNotOtherBytes) {
  Start();
  const std::string path = dir_ + "/model.safetensors";
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  ASSERT_EQ(::truncate(path.c_str(), st.st_size - 100), 0);  // cuts the last tensor written
  ReadResult r = Read("position_ids");
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(r.status.error_message(), HasSubstr("truncated"));

  // Replaced by another file (a new inode) of the same name.
  std::ifstream in(path, std::ios::binary);
  std::stringstream copy;
  copy << in.rdbuf();
  ASSERT_EQ(::unlink(path.c_str()), 0);
  std::ofstream(path, std::ios::binary) << copy.str() << std::string(1000, '\0');
  r = Read("model.norm.weight");
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(r.status.error_message(), HasSubstr("replaced"));
}

// The index itself, for a sharded checkpoint: each raw tensor points into its own shard, and
// ReadRawTensor hands its bytes over in pieces of piece_bytes with consecutive offsets.
TEST_F(RawTensorServiceTest, ShardedCheckpointIndexesEachTensorInItsShard) {
  const std::string sharded = dir_ + "/sharded";
  ASSERT_EQ(::mkdir(sharded.c_str(), 0755), 0);
  std::ofstream(sharded + "/config.json", std::ios::binary) << kConfig;
  auto write = [&](const std::string& file, const std::vector<std::string>& names) {
    std::vector<safetensors::TensorToWrite> views;
    for (const std::string& n : names) {
      const Owned& t = Named(n);
      views.push_back({t.name, t.dtype, t.shape, absl::MakeConstSpan(t.bytes)});
    }
    ASSERT_TRUE(safetensors::WriteFile(sharded + "/" + file, views).ok());
  };
  write("a.safetensors", {"model.layers.0.mlp.down_proj.qweight", "model.norm.weight"});
  write("b.safetensors", {"model.layers.0.mlp.down_proj.qzeros",
                          "model.layers.0.mlp.down_proj.scales", "position_ids"});
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(sharded);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const std::vector<RawTensor>& raw = (*ckpt)->raw_tensors();
  ASSERT_EQ(raw.size(), 2u);
  EXPECT_EQ(raw[0].name, "model.norm.weight");
  EXPECT_THAT(raw[0].file, ::testing::EndsWith("/a.safetensors"));
  EXPECT_EQ(raw[1].name, "position_ids");
  EXPECT_THAT(raw[1].file, ::testing::EndsWith("/b.safetensors"));
  EXPECT_EQ((*ckpt)->FindRawTensor("model.layers.0.mlp.down_proj.qweight"), nullptr);
  for (const RawTensor& t : raw) {
    std::vector<uint8_t> bytes;
    std::vector<int64_t> offsets;
    ASSERT_TRUE(
        ReadRawTensor(t, /*piece_bytes=*/10, [&](int64_t offset, absl::Span<const uint8_t> piece) {
          offsets.push_back(offset);
          bytes.insert(bytes.end(), piece.begin(), piece.end());
          return absl::OkStatus();
        }).ok());
    EXPECT_EQ(bytes, Named(t.name).bytes) << t.name;
    for (size_t i = 0; i < offsets.size(); ++i)
      EXPECT_EQ(offsets[i], 10 * static_cast<int64_t>(i)) << t.name;
  }
  // The consumer's error stops the read and comes back unchanged.
  EXPECT_EQ(
      ReadRawTensor(raw[0], 10,
                    [](int64_t, absl::Span<const uint8_t>) { return absl::CancelledError("stop"); })
          .code(),
      absl::StatusCode::kCancelled);
}

// Issue 23: the parallel read of ReadTensor into a device region (ReadRawTensorChunks, the part
// that needs no GPU): every chunk read once, by at most `threads` threads, each into the place
// the destination gave; the bytes exactly as stored; the consumer's error comes back unchanged.
TEST_F(RawTensorServiceTest, ChunkedReadOnFourThreadsGivesEveryByteOnceAsStored) {
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const RawTensor* embed = (*ckpt)->FindRawTensor("model.embed_tokens.weight");  // 80000 bytes
  ASSERT_NE(embed, nullptr);
  constexpr int64_t kChunk = 4096;
  std::vector<uint8_t> out(static_cast<size_t>(embed->bytes), 0);
  std::mutex mu;
  std::vector<int64_t> offsets;
  std::set<int> threads;
  const absl::Status s = ReadRawTensorChunks(
      *embed, /*threads=*/4, kChunk,
      [&](int, const ReadChunk& c) -> absl::StatusOr<uint8_t*> {
        return out.data() + c.tensor_offset;
      },
      [&](int thread, const ReadChunk& c, uint8_t* data) {
        std::lock_guard<std::mutex> lock(mu);
        EXPECT_EQ(data, out.data() + c.tensor_offset);
        EXPECT_LE(c.bytes, kChunk);
        offsets.push_back(c.tensor_offset);
        threads.insert(thread);
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(out == Named(embed->name).bytes);
  std::sort(offsets.begin(), offsets.end());
  ASSERT_EQ(offsets.size(), static_cast<size_t>((embed->bytes + kChunk - 1) / kChunk));
  for (size_t i = 0; i < offsets.size(); ++i)
    EXPECT_EQ(offsets[i], kChunk * static_cast<int64_t>(i));
  EXPECT_LE(threads.size(), 4u);
  EXPECT_GE(*threads.begin(), 0);
  EXPECT_LT(*threads.rbegin(), 4);

  const absl::Status stopped = ReadRawTensorChunks(
      *embed, 4, kChunk,
      [&](int, const ReadChunk& c) -> absl::StatusOr<uint8_t*> {
        return out.data() + c.tensor_offset;
      },
      [](int, const ReadChunk&, uint8_t*) { return absl::CancelledError("stop"); });
  EXPECT_EQ(stopped.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(stopped.message(), "stop");
}

// The chunked read keeps ReadRawTensor's codes: a truncated or replaced file is DATA_LOSS naming
// what happened (ShardReader's ABORTED for a replaced file is not what ReadTensor says), a file
// gone is NOT_FOUND.
TEST_F(RawTensorServiceTest, ChunkedReadOfATruncatedReplacedOrMissingFileHasReadTensorsCodes) {
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const RawTensor embed = *(*ckpt)->FindRawTensor("model.embed_tokens.weight");
  std::vector<uint8_t> out(static_cast<size_t>(embed.bytes));
  auto read = [&] {
    return ReadRawTensorChunks(
        embed, 3, 4096,
        [&](int, const ReadChunk& c) -> absl::StatusOr<uint8_t*> {
          return out.data() + c.tensor_offset;
        },
        [](int, const ReadChunk&, uint8_t*) { return absl::OkStatus(); });
  };
  const std::string path = dir_ + "/model.safetensors";
  std::ifstream in(path, std::ios::binary);
  std::stringstream copy;
  copy << in.rdbuf();
  ASSERT_EQ(::truncate(path.c_str(), embed.file_offset + embed.bytes - 1), 0);
  absl::Status s = read();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("truncated"));

  ASSERT_EQ(::unlink(path.c_str()), 0);
  s = read();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;

  std::ofstream(path, std::ios::binary) << copy.str();  // the same bytes in a new inode
  s = read();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("replaced"));
}

// A file rewritten in place at the same size (the same inode, which a file deleted and written
// again can also get) is seen by its modification time: DATA_LOSS before any byte is read. An
// error of the caller's own callbacks comes back as it was returned, ABORTED too (ShardReader's
// ABORTED for another file is what becomes DATA_LOSS).
TEST_F(RawTensorServiceTest, ChunkedReadSeesARewriteInPlaceAndKeepsTheCallersErrors) {
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const RawTensor embed = *(*ckpt)->FindRawTensor("model.embed_tokens.weight");
  ASSERT_NE(embed.mtime_ns, 0);
  std::vector<uint8_t> out(static_cast<size_t>(embed.bytes));
  auto read = [&](absl::Status from_consume) {
    return ReadRawTensorChunks(
        embed, 3, 4096,
        [&](int, const ReadChunk& c) -> absl::StatusOr<uint8_t*> {
          return out.data() + c.tensor_offset;
        },
        [&](int, const ReadChunk&, uint8_t*) { return from_consume; });
  };
  absl::Status s = read(absl::AbortedError("the region went away"));
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_EQ(s.message(), "the region went away");
  ASSERT_TRUE(read(absl::OkStatus()).ok());

  const std::string path = dir_ + "/model.safetensors";
  {
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(embed.file_offset);
    f.put('\x5a');  // one byte of the tensor, the size unchanged
  }
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  ASSERT_EQ(st.st_ino, embed.inode);
  // A modification time certainly not the indexed one (the clock may not have moved yet).
  const timespec times[2] = {{.tv_sec = 0, .tv_nsec = UTIME_OMIT},
                             {.tv_sec = embed.mtime_ns / 1'000'000'000 + 7, .tv_nsec = 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  s = read(absl::OkStatus());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("rewritten"));
  EXPECT_THAT(s.message(), HasSubstr("model.embed_tokens.weight"));
}

// Issue 23: ReadTensor into a registered region. The stored bytes land at the region offset (the
// bytes around them untouched), the reply is one message (header, region, region_offset) and no
// data, and each bad region request gets its exact code naming output_region.
TEST_F(RawTensorServiceTest, ReadsIntoARegionAsOneReplyWithTheStoredBytes) {
  Start(/*with_model=*/true, "host");
  const Owned& embed = Named("model.embed_tokens.weight");  // 80000 bytes
  const int64_t kOffset = 4096, kSize = 96 * 1024;
  testing::ShmFile shm("read_tensor", kSize);
  ASSERT_TRUE(shm.ok());
  {
    grpc::ClientContext context;
    v1::RegisterSystemSharedMemoryRequest reg;
    reg.set_name("raw");
    reg.set_key(shm.key());
    reg.set_byte_size(kSize);
    v1::RegisterSystemSharedMemoryResponse response;
    const grpc::Status s = stub_->RegisterSystemSharedMemory(&context, reg, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  auto read_into = [&](const std::string& name, const std::string& region, int64_t offset,
                       std::vector<v1::ReadTensorResponse>* messages, int64_t expected_bytes = 0) {
    v1::ReadTensorRequest request;
    request.set_name(name);
    request.mutable_output_region()->set_name(region);
    request.mutable_output_region()->set_offset(offset);
    request.mutable_output_region()->set_expected_bytes(expected_bytes);
    grpc::ClientContext context;
    auto reader = stub_->ReadTensor(&context, request);
    v1::ReadTensorResponse message;
    while (reader->Read(&message)) messages->push_back(message);
    return reader->Finish();
  };
  std::vector<v1::ReadTensorResponse> messages;
  const auto embed_bytes = static_cast<int64_t>(embed.bytes.size());
  const grpc::Status ok = read_into(embed.name, "raw", kOffset, &messages, embed_bytes);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages[0].header().name(), embed.name);
  EXPECT_EQ(messages[0].header().bytes(), embed_bytes);
  EXPECT_EQ(messages[0].region(), "raw");
  EXPECT_EQ(messages[0].region_offset(), kOffset);
  EXPECT_TRUE(messages[0].data().empty());
  const std::string in_region = shm.Read(kOffset, static_cast<int64_t>(embed.bytes.size()));
  EXPECT_TRUE(std::vector<uint8_t>(in_region.begin(), in_region.end()) == embed.bytes);
  EXPECT_EQ(shm.Read(0, kOffset), std::string(kOffset, '\0'));  // nothing before it written
  const int64_t after = kOffset + static_cast<int64_t>(embed.bytes.size());
  EXPECT_EQ(shm.Read(after, kSize - after), std::string(kSize - after, '\0'));

  struct Bad {
    std::string name, region;
    int64_t offset;
    grpc::StatusCode code;
    std::string says;
    int64_t expected_bytes = 0;
  };
  const Bad bad[] = {
      {embed.name, "nope", 0, grpc::StatusCode::NOT_FOUND, "nope"},
      {embed.name, "raw", 8, grpc::StatusCode::INVALID_ARGUMENT, "multiple of 16"},
      {embed.name, "raw", 32 * 1024, grpc::StatusCode::INVALID_ARGUMENT, "run past its end"},
      {"model.layers.0.mlp.down_proj", "raw", 0, grpc::StatusCode::NOT_FOUND, "quantized layer"},
      // A stale listing's size (the server restarted on another model): refused before writing.
      {embed.name, "raw", 0, grpc::StatusCode::FAILED_PRECONDITION,
       absl::StrCat("output_region.expected_bytes = ", embed_bytes - 2, ", but the results are ",
                    embed_bytes, " bytes"),
       embed_bytes - 2},
      {embed.name, "raw", 0, grpc::StatusCode::INVALID_ARGUMENT,
       "output_region.expected_bytes must be >= 0", -1},
      // The caller's total is checked before the fit: a stale listing is named as such.
      {embed.name, "raw", 32 * 1024, grpc::StatusCode::FAILED_PRECONDITION,
       "the client's listing does not describe this server's model", embed_bytes + 16},
      {embed.name, "raw", 8, grpc::StatusCode::INVALID_ARGUMENT,
       "output_region.expected_bytes must be >= 0", -1},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.says);
    messages.clear();
    const grpc::Status s = read_into(b.name, b.region, b.offset, &messages, b.expected_bytes);
    EXPECT_EQ(s.error_code(), b.code) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(b.says));
    EXPECT_TRUE(messages.empty());
  }
  EXPECT_EQ(shm.Read(0, kOffset), std::string(kOffset, '\0'));  // the refused calls wrote nothing
}

TEST_F(RawTensorServiceTest, ReadIntoARegionWithRegionsOffIsFailedPrecondition) {
  Start();  // --shared-memory=off
  v1::ReadTensorRequest request;
  request.set_name("model.norm.weight");
  request.mutable_output_region()->set_name("raw");
  grpc::ClientContext context;
  auto reader = stub_->ReadTensor(&context, request);
  v1::ReadTensorResponse message;
  EXPECT_FALSE(reader->Read(&message));
  const grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("output_region"));
}

}  // namespace
}  // namespace dequantd
