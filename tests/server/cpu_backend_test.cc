// Tests for the CPU backend and ChunkWriter: the (K, N) result assembled from the streamed
// chunks equals DequantizeReference byte for byte, chunks are consecutive and exactly
// chunk_bytes long (boundaries inside rows), and a sink error stops the work; streamed chunks are
// lent with a keepalive (no copy) and their row blocks are reused only once the sink let them go;
// ChunkWriter forwards the keepalive for chunks cut straight from a piece.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backend/backend.h"
#include "server/backend/chunk_writer.h"
#include "tests/server/holding_sink.h"
#include "tests/server/test_layer.h"

namespace dequantd {
namespace {

using ::dequantd::testing::HoldingSink;
using ::dequantd::testing::RandomPackedLayer;
using ::dequantd::testing::ReferenceBytes;

// Records everything a backend streams, checking the ChunkSink contract as it goes.
class RecordingSink : public ChunkSink {
 public:
  // Fails the call that would receive chunk number `fail_at` (0-based) with CANCELLED.
  explicit RecordingSink(int fail_at = -1) : fail_at_(fail_at) {}

  absl::Status Begin(const std::string& kernel) override {
    ++begins;
    kernel_ = kernel;
    if (!bytes.empty()) writes_before_begin = true;
    return absl::OkStatus();
  }
  absl::Status Write(int64_t offset, absl::Span<const uint8_t> data) override {
    if (begins == 0) writes_before_begin = true;
    if (offset != static_cast<int64_t>(bytes.size())) gaps = true;
    if (static_cast<int>(chunk_sizes.size()) == fail_at_) {
      return absl::CancelledError("client went away");
    }
    chunk_sizes.push_back(static_cast<int64_t>(data.size()));
    bytes.insert(bytes.end(), data.begin(), data.end());
    return absl::OkStatus();
  }

  int begins = 0;
  bool writes_before_begin = false;
  bool gaps = false;
  std::vector<int64_t> chunk_sizes;
  std::vector<uint8_t> bytes;
  std::string kernel_;

 private:
  int fail_at_;
};

// Every chunk is exactly chunk_bytes except the last, which is 1..chunk_bytes.
void ExpectChunking(const std::vector<int64_t>& sizes, int64_t chunk_bytes, int64_t total) {
  ASSERT_FALSE(sizes.empty());
  const int64_t expected_chunks = (total + chunk_bytes - 1) / chunk_bytes;
  ASSERT_EQ(static_cast<int64_t>(sizes.size()), expected_chunks);
  for (size_t i = 0; i + 1 < sizes.size(); ++i) EXPECT_EQ(sizes[i], chunk_bytes) << "chunk " << i;
  EXPECT_EQ(sizes.back(), total - (expected_chunks - 1) * chunk_bytes);
}

struct ChunkCase {
  QuantShape shape;
  DType out_dtype;
  int64_t chunk_bytes;
};

std::string CaseName(const ::testing::TestParamInfo<ChunkCase>& info) {
  const ChunkCase& c = info.param;
  return "K" + std::to_string(c.shape.K) + "_N" + std::to_string(c.shape.N) + "_G" +
         std::to_string(c.shape.group_size) + "_" + std::string(DTypeName(c.shape.scale_dtype)) +
         "_to_" + std::string(DTypeName(c.out_dtype)) + "_chunk" + std::to_string(c.chunk_bytes);
}

class CpuBackendChunkTest : public ::testing::TestWithParam<ChunkCase> {};

TEST_P(CpuBackendChunkTest, AssembledChunksEqualReference) {
  const ChunkCase& c = GetParam();
  const testing::PackedLayer layer = RandomPackedLayer(c.shape, 7);
  const std::vector<uint8_t> expected = ReferenceBytes(layer, c.out_dtype);
  ASSERT_EQ(static_cast<int64_t>(expected.size()), c.shape.output_bytes(c.out_dtype));

  std::unique_ptr<Backend> backend = MakeCpuBackend(2);
  RecordingSink sink;
  DequantSource source;
  source.host = layer.view();
  ASSERT_TRUE(backend->Dequantize(source, c.out_dtype, c.chunk_bytes, sink).ok());

  EXPECT_EQ(sink.begins, 1);
  EXPECT_EQ(sink.kernel_, "cpu threads=2");
  EXPECT_FALSE(sink.writes_before_begin);
  EXPECT_FALSE(sink.gaps);
  ExpectChunking(sink.chunk_sizes, c.chunk_bytes, static_cast<int64_t>(expected.size()));
  EXPECT_TRUE(sink.bytes == expected) << "assembled result differs from DequantizeReference";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CpuBackendChunkTest,
    ::testing::Values(
        // Rows of 24 * 2 = 48 bytes; 100-byte chunks split rows; one block.
        ChunkCase{{.K = 64, .N = 24, .group_size = 32}, DType::kF16, 100},
        // Chunk larger than the whole result: one chunk.
        ChunkCase{{.K = 64, .N = 24, .group_size = 64}, DType::kBF16, 1 << 20},
        // 1-byte chunks: every byte its own chunk.
        ChunkCase{{.K = 8, .N = 8, .group_size = 8}, DType::kF32, 1},
        // 2048 rows of 264 * 4 = 1056 bytes (2.06 MiB): several 1 MiB row blocks, 100000-byte
        // chunks cross rows and blocks.
        ChunkCase{{.K = 2048, .N = 264, .group_size = 128}, DType::kF32, 100000},
        // bf16 scales, G = K, chunk equal to a row (boundaries on rows) and several blocks.
        ChunkCase{{.K = 1024, .N = 1440, .group_size = 1024, .scale_dtype = DType::kBF16},
                  DType::kF16,
                  2880},
        // 64 KiB chunks (the service's minimum) over several blocks, fp16 out.
        ChunkCase{{.K = 1536, .N = 576, .group_size = 64}, DType::kF16, 64 << 10}),
    CaseName);

TEST(CpuBackendTest, SinkErrorStopsTheWork) {
  const testing::PackedLayer layer = RandomPackedLayer({.K = 2048, .N = 264, .group_size = 128}, 3);
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  RecordingSink sink(/*fail_at=*/3);
  DequantSource source;
  source.host = layer.view();
  const absl::Status status = backend->Dequantize(source, DType::kF32, 1000, sink);
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(sink.chunk_sizes.size(), 3u);  // nothing after the failed write
}

TEST(CpuBackendTest, BadShapeIsRefusedBeforeBegin) {
  testing::PackedLayer layer = RandomPackedLayer({.K = 64, .N = 16, .group_size = 32}, 4);
  layer.shape.N = 12;
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  RecordingSink sink;
  DequantSource source;
  source.host = layer.view();
  const absl::Status status = backend->Dequantize(source, DType::kF16, 100, sink);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("N must be"));
  EXPECT_EQ(sink.begins, 0);
}

TEST(CpuBackendTest, InfoNamesCpuAndThreads) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(3);
  const BackendInfo info = backend->Info();
  EXPECT_EQ(info.name, "cpu");
  EXPECT_EQ(info.cpu_threads, 3);
  ASSERT_EQ(info.devices.size(), 1u);
  EXPECT_FALSE(info.devices[0].name.empty());
}

BackendOptions Kind(const std::string& kind) {
  BackendOptions options;
  options.kind = kind;
  options.cpu_threads = 1;
  return options;
}

TEST(CreateBackendTest, CpuAutoAndBadKinds) {
  absl::StatusOr<std::unique_ptr<Backend>> cpu = CreateBackend(Kind("cpu"));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->Info().name, "cpu");

  absl::StatusOr<std::unique_ptr<Backend>> bad = CreateBackend(Kind("gpu"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("\"gpu\""));
}

TEST(CreateBackendTest, CudaWithoutGpuIsFailedPrecondition) {
#if DEQUANTD_HAVE_CUDA
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is present";
#endif
  absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateBackend(Kind("cuda"));
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::unique_ptr<Backend>> automatic = CreateBackend(Kind("auto"));
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ((*automatic)->Info().name, "cpu");
}

// ChunkWriter alone: pieces of uneven sizes in, exact chunks out, same bytes.
TEST(ChunkWriterTest, UnevenPiecesBecomeExactChunks) {
  std::vector<uint8_t> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + 3);
  RecordingSink sink;
  ChunkWriter writer(64, sink);
  size_t pos = 0;
  for (size_t piece : {1u, 63u, 64u, 200u, 5u, 0u, 300u, 367u}) {
    ASSERT_TRUE(writer.Append(absl::MakeConstSpan(data.data() + pos, piece)).ok());
    pos += piece;
  }
  ASSERT_EQ(pos, data.size());
  ASSERT_TRUE(writer.Finish().ok());
  EXPECT_EQ(writer.bytes_written(), 1000);
  EXPECT_FALSE(sink.gaps);
  ExpectChunking(sink.chunk_sizes, 64, 1000);
  EXPECT_TRUE(sink.bytes == data);
}

// ChunkWriter with keepalives: chunks cut straight from a piece go to WriteShared with that
// piece's keepalive and point into it; chunks assembled across pieces go to Write (a copy);
// AppendLast sends a last short chunk from the piece too.
TEST(ChunkWriterTest, ChunksCutFromAPieceCarryItsKeepaliveAssembledOnesAreCopied) {
  struct Seen {
    int64_t offset;
    int64_t size;
    const uint8_t* data;
    std::shared_ptr<const void> keepalive;  // null: Write
  };
  class Recorder final : public ChunkSink {
   public:
    absl::Status Begin(const std::string&) override { return absl::OkStatus(); }
    absl::Status Write(int64_t offset, absl::Span<const uint8_t> data) override {
      seen.push_back({offset, static_cast<int64_t>(data.size()), data.data(), nullptr});
      return absl::OkStatus();
    }
    absl::Status WriteShared(int64_t offset, absl::Span<const uint8_t> data,
                             std::shared_ptr<const void> keepalive) override {
      seen.push_back(
          {offset, static_cast<int64_t>(data.size()), data.data(), std::move(keepalive)});
      return absl::OkStatus();
    }
    std::vector<Seen> seen;
  };
  std::vector<uint8_t> data(500);
  auto k1 = std::make_shared<int>(1);
  auto k2 = std::make_shared<int>(2);
  auto k3 = std::make_shared<int>(3);
  Recorder sink;
  ChunkWriter writer(64, sink, /*first_offset=*/1000);
  ASSERT_TRUE(writer.Append(absl::MakeConstSpan(data.data(), 200), k1).ok());  // 3 chunks + 8
  ASSERT_TRUE(writer.Append(absl::MakeConstSpan(data.data() + 200, 200), k2).ok());
  ASSERT_TRUE(writer.AppendLast(absl::MakeConstSpan(data.data() + 400, 30), k3).ok());
  ASSERT_EQ(sink.seen.size(), 7u);
  const std::vector<std::pair<int64_t, std::shared_ptr<int>>> expected = {
      {1000, k1},      {1064, k1}, {1128, k1},  // straight from piece 1
      {1192, nullptr},                          // 8 bytes of piece 1 + 56 of piece 2, assembled
      {1256, k2},      {1320, k2},              // straight from piece 2 (ends 16 bytes short)
      {1384, nullptr}};                         // 16 + 30 bytes assembled: the last, short chunk
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(sink.seen[i].offset, expected[i].first);
    EXPECT_EQ(sink.seen[i].size, i + 1 < expected.size() ? 64 : 46);
    EXPECT_EQ(sink.seen[i].keepalive, expected[i].second);
    if (expected[i].second != nullptr) {
      EXPECT_EQ(sink.seen[i].data, data.data() + (expected[i].first - 1000));
    }
  }
  // Nothing pending: AppendLast's short chunk is cut from the piece, with its keepalive.
  Recorder last;
  ChunkWriter whole(64, last);
  ASSERT_TRUE(whole.AppendLast(absl::MakeConstSpan(data.data(), 100), k3).ok());
  ASSERT_EQ(last.seen.size(), 2u);
  EXPECT_EQ(last.seen[1].offset, 64);
  EXPECT_EQ(last.seen[1].size, 36);
  EXPECT_EQ(last.seen[1].data, data.data() + 64);
  EXPECT_EQ(last.seen[1].keepalive, k3);
}

// The CPU backend lends its row blocks: every chunk comes through WriteShared (no copy), and a
// block is computed into again only once the sink let go of it. The sink lags by 40 chunks of
// 64 KiB (2.5 of the 1 MiB windows; a call has 8 blocks) over an 11-window result whose window
// boundaries fall inside rows (2560-byte rows): every byte is the reference's when released.
TEST(CpuBackendTest, StreamedChunksAreLentAndBlocksWaitForTheirRelease) {
  const QuantShape shape{.K = 4096, .N = 1280, .group_size = 128, .scale_dtype = DType::kF16};
  const testing::PackedLayer layer = RandomPackedLayer(shape, 41);
  const std::vector<uint8_t> reference = ReferenceBytes(layer, DType::kF16);
  const int64_t total = static_cast<int64_t>(reference.size());  // 10485760
  std::unique_ptr<Backend> backend = MakeCpuBackend(2);
  DequantSource source;
  source.host = layer.view();
  for (const ChunkSink::Range range :
       {ChunkSink::Range{}, ChunkSink::Range{.offset = 4098, .length = total - 4098 - 6000}}) {
    const int64_t length = range.length < 0 ? total - range.offset : range.length;
    SCOPED_TRACE(::testing::Message() << "offset=" << range.offset << " length=" << length);
    HoldingSink sink(/*hold=*/40, total, range);
    ASSERT_TRUE(backend->Dequantize(source, DType::kF16, 64 << 10, sink).ok());
    sink.Release();
    EXPECT_FALSE(sink.gaps);
    EXPECT_FALSE(sink.null_keepalives);
    EXPECT_EQ(sink.copied_writes, 0);
    ExpectChunking(sink.chunk_sizes, 64 << 10, length);
    EXPECT_TRUE(std::equal(sink.bytes.begin() + range.offset,
                           sink.bytes.begin() + range.offset + length,
                           reference.begin() + range.offset));
  }
}

}  // namespace
}  // namespace dequantd
