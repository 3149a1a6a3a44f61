// Tests for the gRPC result sink's messages (server/rpc/grpc_result_sink.h): a chunk sent with a
// keepalive (ChunkSink::WriteShared) parses back to the same DequantizeResponse as the copied
// form, references the caller's bytes instead of copying them, and holds the keepalive exactly
// until the last ByteBuffer or slice referencing it is gone; GrpcResultSink sends it that way
// through its writer, and copies when there is no keepalive.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include "dequant/v1/dequant.pb.h"
#include "gtest/gtest.h"
#include "server/metrics/metrics.h"
#include "server/rpc/grpc_result_sink.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;

std::vector<uint8_t> Pattern(size_t size) {
  std::vector<uint8_t> data(size);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 13 + 5);
  return data;
}

// Parses a copy of `buffer` (Deserialize consumes its argument).
v1::DequantizeResponse Parse(const grpc::ByteBuffer& buffer) {
  grpc::ByteBuffer copy(buffer);
  v1::DequantizeResponse parsed;
  EXPECT_TRUE(grpc::SerializationTraits<v1::DequantizeResponse>::Deserialize(&copy, &parsed).ok());
  return parsed;
}

// The first byte of the message's last slice (where the data is when it is not copied).
const uint8_t* LastSliceStart(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  return slices.empty() ? nullptr : slices.back().begin();
}

TEST(EncodeSharedChunkMessageTest, ParsesBackToTheSameResponseAsTheCopiedForm) {
  const std::vector<uint8_t> data = Pattern(300000);
  for (int64_t offset :
       {int64_t{0}, int64_t{1}, int64_t{127}, int64_t{128}, (int64_t{1} << 40) + 5}) {
    for (size_t size : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, data.size()}) {
      const absl::Span<const uint8_t> bytes(data.data(), size);
      const grpc::ByteBuffer shared =
          EncodeSharedChunkMessage(offset, bytes, std::make_shared<int>(0));
      const v1::DequantizeResponse parsed = Parse(shared);
      EXPECT_FALSE(parsed.has_header());
      EXPECT_EQ(parsed.offset(), offset);
      ASSERT_EQ(parsed.data().size(), size);
      EXPECT_EQ(parsed.data(), std::string(data.begin(), data.begin() + size));
      EXPECT_EQ(parsed.SerializeAsString(),
                Parse(EncodeChunkMessage(offset, bytes)).SerializeAsString());
      EXPECT_EQ(shared.Length(), EncodeChunkMessage(offset, bytes).Length());
      if (size > 0) {
        EXPECT_EQ(LastSliceStart(shared), data.data()) << "the data was copied";
      }
    }
  }
}

TEST(EncodeSharedChunkMessageTest, KeepaliveGoesWithTheLastReferenceNotBefore) {
  const std::vector<uint8_t> data = Pattern(4096);
  auto keepalive = std::make_shared<int>(7);
  const std::weak_ptr<int> watch = keepalive;
  auto message = std::make_unique<grpc::ByteBuffer>(
      EncodeSharedChunkMessage(42, absl::MakeConstSpan(data), std::move(keepalive)));
  EXPECT_FALSE(watch.expired());                             // the message holds the only reference
  auto copy = std::make_unique<grpc::ByteBuffer>(*message);  // as gRPC's send op copies it
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(copy->Dump(&slices).ok());  // as the transport holds slices of it
  message.reset();
  EXPECT_FALSE(watch.expired());
  copy.reset();
  EXPECT_FALSE(watch.expired());
  grpc::Slice last = slices.back();  // a slice's own copy
  slices.clear();
  EXPECT_FALSE(watch.expired());
  EXPECT_EQ(last.begin(), data.data());
  last = grpc::Slice();
  EXPECT_TRUE(watch.expired());
}

// Keeps every message written, as gRPC holds messages it has not sent yet.
class HoldingWriter final : public grpc::internal::WriterInterface<grpc::ByteBuffer> {
 public:
  bool Write(const grpc::ByteBuffer& message, grpc::WriteOptions) override {
    messages.push_back(message);
    return true;
  }
  std::vector<grpc::ByteBuffer> messages;
};

TEST(GrpcResultSinkTest, WriteSharedSendsTheBytesInPlaceAndHoldsTheKeepaliveUntilReleased) {
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create("", "test");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  grpc::ServerContext context;  // not bound to a call: IsCancelled() is false
  HoldingWriter writer;
  const QuantShape shape{.K = 64, .N = 32, .group_size = 64, .scale_dtype = DType::kF16};
  GrpcResultSink sink(&context, &writer, {ResultLayer{.tensor = "", .shape = shape}},
                      /*per_layer=*/false, DType::kF16, "cpu", metrics->get());
  ASSERT_TRUE(sink.Begin("test kernel").ok());
  ASSERT_EQ(writer.messages.size(), 1u);
  EXPECT_TRUE(Parse(writer.messages[0]).has_header());

  const std::vector<uint8_t> data = Pattern(shape.output_bytes(DType::kF16));  // 4096 bytes
  auto keepalive = std::make_shared<std::vector<uint8_t>>(data);
  const std::weak_ptr<std::vector<uint8_t>> watch = keepalive;
  const absl::Span<const uint8_t> first(keepalive->data(), 1024);
  const absl::Span<const uint8_t> second(keepalive->data() + 1024, 3072);
  ASSERT_TRUE(sink.WriteShared(0, first, keepalive).ok());
  ASSERT_TRUE(sink.WriteShared(1024, second, std::move(keepalive)).ok());
  ASSERT_EQ(writer.messages.size(), 3u);
  EXPECT_FALSE(watch.expired());  // the writer (gRPC) still holds both messages
  EXPECT_EQ(LastSliceStart(writer.messages[1]), first.data());
  EXPECT_EQ(LastSliceStart(writer.messages[2]), second.data());
  std::string received;
  for (size_t i = 1; i < 3; ++i) {
    const v1::DequantizeResponse parsed = Parse(writer.messages[i]);
    EXPECT_EQ(parsed.offset(), static_cast<int64_t>(received.size()));
    received += parsed.data();
  }
  EXPECT_EQ(received, std::string(data.begin(), data.end()));
  writer.messages.pop_back();
  EXPECT_FALSE(watch.expired());
  writer.messages.pop_back();  // gRPC released the last message referencing the bytes
  EXPECT_TRUE(watch.expired());

  // Without a keepalive the bytes are copied: the message does not point at them.
  const std::vector<uint8_t> copied = Pattern(512);
  ASSERT_TRUE(sink.WriteShared(0, absl::MakeConstSpan(copied), nullptr).ok());
  ASSERT_TRUE(sink.Write(512, absl::MakeConstSpan(copied)).ok());
  ASSERT_EQ(writer.messages.size(), 3u);
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_NE(LastSliceStart(writer.messages[i]), copied.data());
    EXPECT_EQ(Parse(writer.messages[i]).data(), std::string(copied.begin(), copied.end()));
  }
}

}  // namespace
}  // namespace dequantd
