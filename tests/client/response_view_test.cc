// ResponseView: DequantizeResponse messages parsed from their wire bytes, cut into slices at every
// position, give what protobuf's own parse gives, with the data as views (no copy).
#include "client/response_view.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;

// `wire` as a ByteBuffer of slices cut at `cuts` (ascending positions inside wire).
grpc::ByteBuffer Buffer(const std::string& wire, const std::vector<size_t>& cuts) {
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (size_t cut : cuts) {
    slices.emplace_back(wire.data() + at, cut - at);
    at = cut;
  }
  slices.emplace_back(wire.data() + at, wire.size() - at);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Joined(const ResponseView& view) {
  std::string data;
  for (absl::Span<const uint8_t> piece : view.data()) {
    data.append(reinterpret_cast<const char*>(piece.data()), piece.size());
  }
  return data;
}

TEST(ResponseViewTest, ChunkCutAnywhereGivesOffsetAndData) {
  v1::DequantizeResponse message;
  message.set_offset(int64_t{3} << 40);  // a 6-byte varint
  std::string data(300, '\0');           // a 2-byte length
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  message.set_data(data);
  const std::string wire = message.SerializeAsString();
  for (size_t a = 0; a <= wire.size(); ++a) {
    for (size_t b : {a, std::min(wire.size(), a + 1), std::min(wire.size(), a + 150)}) {
      grpc::ByteBuffer buffer = Buffer(wire, {a, b});
      ResponseView view;
      ASSERT_TRUE(view.Parse(buffer).ok()) << a << "," << b;
      EXPECT_FALSE(view.has_header());
      EXPECT_EQ(view.offset(), int64_t{3} << 40);
      EXPECT_EQ(view.data_bytes(), 300);
      EXPECT_EQ(Joined(view), data) << a << "," << b;
    }
  }
}

TEST(ResponseViewTest, HeaderAndDataInOneMessage) {
  v1::DequantizeResponse message;
  message.mutable_header()->add_shape(2);
  message.mutable_header()->add_shape(8);
  message.mutable_header()->set_dtype(v1::DTYPE_FP32);
  message.mutable_header()->set_total_bytes(64);
  message.mutable_header()->set_tensor("model.layers.0.mlp.up_proj");
  message.set_data("abc");
  const std::string wire = message.SerializeAsString();
  for (size_t cut = 0; cut <= wire.size(); ++cut) {
    grpc::ByteBuffer buffer = Buffer(wire, {cut});
    ResponseView view;
    ASSERT_TRUE(view.Parse(buffer).ok()) << cut;
    ASSERT_TRUE(view.has_header());
    EXPECT_EQ(view.header().SerializeAsString(), message.header().SerializeAsString());
    EXPECT_EQ(view.offset(), 0);
    EXPECT_EQ(Joined(view), "abc");
  }
}

TEST(ResponseViewTest, EmptyMessageAndUnknownFields) {
  grpc::ByteBuffer empty = Buffer("", {});
  ResponseView view;
  ASSERT_TRUE(view.Parse(empty).ok());
  EXPECT_FALSE(view.has_header());
  EXPECT_EQ(view.data_bytes(), 0);
  EXPECT_TRUE(view.data().empty());
  // Field 9 varint 5, field 10 fixed64, field 11 fixed32, then offset 7: the unknown ones skipped.
  const std::string wire = std::string("\x48\x05", 2) + std::string("\x51", 1) +
                           std::string(8, '\x01') + std::string("\x5d", 1) +
                           std::string(4, '\x02') + std::string("\x10\x07", 2);
  grpc::ByteBuffer buffer = Buffer(wire, {3});
  ASSERT_TRUE(view.Parse(buffer).ok());
  EXPECT_EQ(view.offset(), 7);
}

TEST(ResponseViewTest, TruncatedOrMalformedIsDataLoss) {
  v1::DequantizeResponse message;
  message.set_offset(5);
  message.set_data(std::string(20, 'x'));
  const std::string wire = message.SerializeAsString();
  for (size_t size = 1; size < wire.size(); ++size) {  // every proper prefix but the offset's end
    if (size == 2) continue;                           // "offset 5" alone is a whole message
    grpc::ByteBuffer buffer = Buffer(wire.substr(0, size), {});
    ResponseView view;
    const absl::Status status = view.Parse(buffer);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << size;
    EXPECT_NE(std::string(status.message()).find("response message: "), std::string::npos);
  }
  grpc::ByteBuffer group = Buffer(std::string("\x0b", 1), {});  // field 1, wire type 3 (group)
  ResponseView view;
  EXPECT_EQ(view.Parse(group).code(), absl::StatusCode::kDataLoss);
  grpc::ByteBuffer bad_header = Buffer(std::string("\x0a\x02\xff\xff", 4), {});
  EXPECT_EQ(view.Parse(bad_header).code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace dequantd
