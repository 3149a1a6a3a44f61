// Tests for formats/safetensors: exact bytes of a hand-built file, round trips through the
// memory map, and the status code of each kind of corrupt input.
#include "formats/safetensors.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dequantd::safetensors {
namespace {

using ::testing::HasSubstr;

std::string MakeTempDir() {
  std::string templ = ::testing::TempDir() + "/formats_test.XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) return "";
  return templ;
}

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// A file: 8-byte little-endian `header_len` (the JSON length unless overridden), JSON, data.
std::vector<uint8_t> MakeFile(const std::string& json, size_t data_bytes,
                              uint64_t header_len = UINT64_MAX) {
  if (header_len == UINT64_MAX) header_len = json.size();
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(header_len >> (8 * i));
  out.insert(out.end(), json.begin(), json.end());
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<uint8_t>(i * 7 + 1));
  return out;
}

absl::StatusCode ParseCode(const std::vector<uint8_t>& file) {
  return ParseHeader(absl::MakeConstSpan(file)).status().code();
}

TEST(SafetensorsDTypeTest, SizesOfKnownAndUnknownDTypes) {
  EXPECT_EQ(DTypeBytes("F16"), 2);
  EXPECT_EQ(DTypeBytes("BF16"), 2);
  EXPECT_EQ(DTypeBytes("F32"), 4);
  EXPECT_EQ(DTypeBytes("I32"), 4);
  EXPECT_EQ(DTypeBytes("I8"), 1);
  EXPECT_EQ(DTypeBytes("F64"), 8);
  EXPECT_EQ(DTypeBytes("f16"), 0);
  EXPECT_EQ(DTypeBytes("Q4"), 0);
}

// The exact bytes of a one-tensor file, built by hand: the header JSON (keys sorted), padded
// with spaces to a multiple of 8, its length as u64 little-endian, then the data.
TEST(SafetensorsWriteTest, ExactBytesOfOneInt32Tensor) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  const std::vector<uint8_t> data = {0x04, 0x03, 0x02, 0x01};  // int32 0x01020304
  ASSERT_TRUE(
      WriteFile(dir + "/a.safetensors", {{"a", "I32", {1}, absl::MakeConstSpan(data)}}).ok());

  const std::string json = R"({"a":{"data_offsets":[0,4],"dtype":"I32","shape":[1]}})";
  ASSERT_EQ(json.size(), 54u);
  std::vector<uint8_t> want = {56, 0, 0, 0, 0, 0, 0, 0};
  want.insert(want.end(), json.begin(), json.end());
  want.push_back(' ');
  want.push_back(' ');
  want.insert(want.end(), data.begin(), data.end());
  EXPECT_EQ(ReadAll(dir + "/a.safetensors"), want);
}

// PlanFile lays out the same file as WriteFile: the header bytes, each tensor's offset in the
// file and the file's size (the one-tensor file above: 64 header bytes, then 4 data bytes).
TEST(SafetensorsWriteTest, PlanFileMatchesTheWrittenLayout) {
  absl::StatusOr<FileLayout> one = PlanFile({{"a", "I32", {1}}});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->header.size(), 64u);
  EXPECT_EQ(one->header.substr(8, 54), R"({"a":{"data_offsets":[0,4],"dtype":"I32","shape":[1]}})");
  EXPECT_EQ(one->data_offsets, (std::vector<int64_t>{64}));
  EXPECT_EQ(one->tensor_bytes, (std::vector<int64_t>{4}));
  EXPECT_EQ(one->file_bytes, 68);
  absl::StatusOr<FileLayout> two = PlanFile({{"z", "F16", {3, 5}}, {"b", "F32", {2}}});
  ASSERT_TRUE(two.ok());
  const int64_t header = static_cast<int64_t>(two->header.size());
  EXPECT_EQ(header % 8, 0);
  EXPECT_EQ(two->data_offsets, (std::vector<int64_t>{header, header + 30}));  // given order
  EXPECT_EQ(two->file_bytes, header + 38);
  EXPECT_EQ(PlanFile({{"x", "Q4", {1}}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanFile({{"x", "F16", {1}}, {"x", "F16", {1}}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanFile({{"x", "F16", {-1}}}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsWriteTest, RoundTripThroughMappedFile) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  std::vector<int32_t> qweight(6 * 2);
  for (size_t i = 0; i < qweight.size(); ++i)
    qweight[i] = static_cast<int32_t>(0x9E3779B9u * (i + 1));
  std::vector<uint16_t> scales = {0x3C00, 0xBC00, 0x0001, 0x7BFF, 0x3555};  // 5 halves: odd size
  std::vector<uint8_t> empty;
  auto bytes = [](const auto& v) {
    return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(v[0]));
  };
  const std::string path = dir + "/m.safetensors";
  ASSERT_TRUE(WriteFile(path,
                        {{"layer.scales", "F16", {5}, bytes(scales)},
                         {"layer.qweight", "I32", {6, 2}, bytes(qweight)},
                         {"empty", "F32", {0, 3}, absl::MakeConstSpan(empty)}},
                        {{"format", "pt"}})
                  .ok());

  absl::StatusOr<std::unique_ptr<MappedFile>> file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const Header& h = (*file)->header();
  EXPECT_EQ(h.data_start % 8, 0);
  EXPECT_EQ(h.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(h.tensors.size(), 3u);
  const TensorEntry& q = h.tensors.at("layer.qweight");
  EXPECT_EQ(q.dtype, "I32");
  EXPECT_EQ(q.shape, (std::vector<int64_t>{6, 2}));
  EXPECT_EQ(q.data_begin, 10);  // after the 5 halves, in the order given
  EXPECT_EQ(q.data_end, 10 + 48);
  EXPECT_EQ(h.tensors.at("empty").shape, (std::vector<int64_t>{0, 3}));

  absl::StatusOr<absl::Span<const uint8_t>> qb = (*file)->TensorBytes("layer.qweight");
  ASSERT_TRUE(qb.ok());
  EXPECT_EQ(std::vector<uint8_t>(qb->begin(), qb->end()),
            std::vector<uint8_t>(bytes(qweight).begin(), bytes(qweight).end()));
  absl::StatusOr<absl::Span<const uint8_t>> sb = (*file)->TensorBytes("layer.scales");
  ASSERT_TRUE(sb.ok());
  EXPECT_EQ(std::vector<uint8_t>(sb->begin(), sb->end()),
            std::vector<uint8_t>(bytes(scales).begin(), bytes(scales).end()));
  EXPECT_EQ((*file)->TensorBytes("empty")->size(), 0u);
  EXPECT_EQ((*file)->TensorBytes("nope").status().code(), absl::StatusCode::kNotFound);

  // Parsing the same bytes from memory gives the same header.
  const std::vector<uint8_t> raw = ReadAll(path);
  absl::StatusOr<Header> parsed = ParseHeader(absl::MakeConstSpan(raw));
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->data_start, h.data_start);
  EXPECT_EQ(static_cast<int64_t>(raw.size()), h.data_start + 10 + 48);
}

TEST(SafetensorsWriteTest, OverwritesAtomicallyAndLeavesNoTemporaryFile) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  const std::vector<uint8_t> a = {1, 2}, b = {3, 4, 5, 6};
  ASSERT_TRUE(WriteFile(dir + "/x.safetensors", {{"t", "U8", {2}, absl::MakeConstSpan(a)}}).ok());
  ASSERT_TRUE(WriteFile(dir + "/x.safetensors", {{"t", "U8", {4}, absl::MakeConstSpan(b)}}).ok());
  absl::StatusOr<std::unique_ptr<MappedFile>> file = MappedFile::Open(dir + "/x.safetensors");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->TensorBytes("t")->size(), 4u);
  EXPECT_EQ(::rmdir(dir.c_str()), -1);  // not empty: holds x.safetensors
  ASSERT_EQ(::unlink((dir + "/x.safetensors").c_str()), 0);
  EXPECT_EQ(::rmdir(dir.c_str()), 0);  // now empty: no temporary file was left behind
}

TEST(SafetensorsWriteTest, RejectsBadTensors) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  const std::vector<uint8_t> six(6);
  absl::Status s =
      WriteFile(dir + "/bad.safetensors", {{"t", "F32", {2}, absl::MakeConstSpan(six)}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'t'"));
  EXPECT_EQ(
      WriteFile(dir + "/bad.safetensors", {{"t", "X9", {6}, absl::MakeConstSpan(six)}}).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      WriteFile(dir + "/bad.safetensors", {{"t", "U8", {-6}, absl::MakeConstSpan(six)}}).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteFile(dir + "/bad.safetensors", {{"t", "U8", {6}, absl::MakeConstSpan(six)},
                                                 {"t", "U8", {6}, absl::MakeConstSpan(six)}})
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(::access((dir + "/bad.safetensors").c_str(), F_OK), -1);
  EXPECT_EQ(WriteFile(dir + "/no/such/dir/x.safetensors", {}).code(), absl::StatusCode::kNotFound);
}

constexpr char kGoodJson[] = R"({"w":{"dtype":"F16","shape":[2,3],"data_offsets":[0,12]}})";

TEST(SafetensorsParseTest, AcceptsWellFormedHandBuiltFile) {
  const std::vector<uint8_t> file = MakeFile(kGoodJson, 12);
  absl::StatusOr<Header> h = ParseHeader(absl::MakeConstSpan(file));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->data_start, 8 + static_cast<int64_t>(std::strlen(kGoodJson)));
  EXPECT_EQ(h->tensors.at("w").data_end, 12);
}

TEST(SafetensorsParseTest, FileShorterThanLengthPrefixIsDataLoss) {
  EXPECT_EQ(ParseCode({1, 0, 0}), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseCode({}), absl::StatusCode::kDataLoss);
}

TEST(SafetensorsParseTest, HeaderLengthPastEndOfFileIsDataLoss) {
  const std::vector<uint8_t> file = MakeFile(kGoodJson, 12, std::strlen(kGoodJson) + 13);
  absl::StatusOr<Header> h = ParseHeader(absl::MakeConstSpan(file));
  EXPECT_EQ(h.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(h.status().message()), HasSubstr("header length"));
}

TEST(SafetensorsParseTest, AbsurdHeaderLengthIsInvalidArgument) {
  EXPECT_EQ(ParseCode(MakeFile(kGoodJson, 12, uint64_t{1} << 63)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseCode(MakeFile(kGoodJson, 12, UINT64_MAX - 1)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseCode(MakeFile(kGoodJson, 12, kMaxHeaderBytes + 1)),
            absl::StatusCode::kInvalidArgument);
  // Another kind of file (a .npy's magic read as the length) is told as such.
  absl::StatusOr<Header> h =
      ParseHeader(absl::MakeConstSpan(MakeFile(kGoodJson, 12, 0x0159504D554E93ull)));
  EXPECT_THAT(std::string(h.status().message()), HasSubstr("not a safetensors file?"));
}

TEST(SafetensorsParseTest, OffsetsPastEndOfDataIsDataLoss) {
  // Header says 12 bytes of data, the file holds 11: a truncated file.
  absl::StatusOr<Header> h = ParseHeader(absl::MakeConstSpan(MakeFile(kGoodJson, 11)));
  EXPECT_EQ(h.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(h.status().message()), HasSubstr("'w'"));
  EXPECT_THAT(std::string(h.status().message()), HasSubstr("data_offsets"));
}

TEST(SafetensorsParseTest, BadJsonIsInvalidArgument) {
  EXPECT_EQ(ParseCode(MakeFile(R"({"w":{"dtype":"F16",)", 0)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseCode(MakeFile("[1,2]", 0)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseCode(MakeFile(R"({"w":5})", 0)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseCode(MakeFile(std::string("{\"w\"\0:1}", 8), 0)),
            absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsParseTest, UnknownDTypeIsInvalidArgumentNamingField) {
  absl::StatusOr<Header> h = ParseHeader(absl::MakeConstSpan(
      MakeFile(R"({"w":{"dtype":"Q4_0","shape":[2,3],"data_offsets":[0,12]}})", 12)));
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(h.status().message()), HasSubstr("'dtype'"));
  EXPECT_THAT(std::string(h.status().message()), HasSubstr("Q4_0"));
  EXPECT_EQ(ParseCode(MakeFile(R"({"w":{"shape":[2,3],"data_offsets":[0,12]}})", 12)),
            absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsParseTest, SizeMismatchIsInvalidArgument) {
  // F16 (2, 3) needs 12 bytes; the offsets give 10.
  absl::StatusOr<Header> h = ParseHeader(absl::MakeConstSpan(
      MakeFile(R"({"w":{"dtype":"F16","shape":[2,3],"data_offsets":[0,10]}})", 12)));
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(h.status().message()), HasSubstr("need 12"));
}

TEST(SafetensorsParseTest, NegativeOrNonIntegerDimsAreInvalidArgument) {
  absl::StatusOr<Header> h = ParseHeader(absl::MakeConstSpan(
      MakeFile(R"({"w":{"dtype":"F16","shape":[-2,-3],"data_offsets":[0,12]}})", 12)));
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(h.status().message()), HasSubstr("negative"));
  EXPECT_EQ(ParseCode(MakeFile(R"({"w":{"dtype":"F16","shape":[2.5],"data_offsets":[0,5]}})", 12)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseCode(MakeFile(R"({"w":{"dtype":"F16","shape":"2","data_offsets":[0,4]}})", 12)),
            absl::StatusCode::kInvalidArgument);
  // Dims whose product overflows int64.
  EXPECT_EQ(
      ParseCode(MakeFile(
          R"({"w":{"dtype":"F16","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 12)),
      absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsParseTest, BadOffsetsAreInvalidArgument) {
  EXPECT_EQ(ParseCode(MakeFile(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[4,2]}})", 12)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseCode(MakeFile(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[-2,0]}})", 12)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseCode(MakeFile(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0]}})", 12)),
            absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsParseTest, MetadataMustHoldStrings) {
  absl::StatusOr<Header> ok =
      ParseHeader(absl::MakeConstSpan(MakeFile(R"({"__metadata__":{"a":"b"}})", 0)));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->metadata.at("a"), "b");
  EXPECT_TRUE(ok->tensors.empty());
  EXPECT_EQ(ParseCode(MakeFile(R"({"__metadata__":{"a":1}})", 0)),
            absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsParseTest, OverlappingTensorsAreInvalidArgumentNamingBoth) {
  // "s" lies inside "q"'s bytes [0, 8): a reader would serve q's bytes as s.
  absl::StatusOr<Header> h = ParseHeader(
      absl::MakeConstSpan(MakeFile(R"({"q":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
                                   R"("s":{"dtype":"F16","shape":[2],"data_offsets":[4,8]}})",
                                   12)));
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(h.status().message(),
            "tensor 's': field 'data_offsets' [4, 8) overlaps tensor 'q' [0, 8)");
  // A range overlapping an earlier, longer one that is not its direct predecessor.
  EXPECT_EQ(ParseCode(MakeFile(R"({"a":{"dtype":"U8","shape":[10],"data_offsets":[0,10]},)"
                               R"("b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},)"
                               R"("c":{"dtype":"U8","shape":[1],"data_offsets":[5,6]}})",
                               12)),
            absl::StatusCode::kInvalidArgument);
  // Adjacent ranges and empty tensors sharing an offset are fine.
  absl::StatusOr<Header> ok = ParseHeader(
      absl::MakeConstSpan(MakeFile(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                   R"("e":{"dtype":"U8","shape":[0],"data_offsets":[2,2]},)"
                                   R"("b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
                                   12)));
  EXPECT_TRUE(ok.ok()) << ok.status();
}

TEST(SafetensorsParseTest, DuplicateKeysAreInvalidArgumentNamingTheKey) {
  // nlohmann::json keeps the last of two equal keys; the file is ambiguous and is refused.
  absl::StatusOr<Header> h = ParseHeader(
      absl::MakeConstSpan(MakeFile(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                   R"("w":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                                   12)));
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(h.status().message(), "header: key 'w' appears twice in one object");
  // A repeated field inside one entry.
  h = ParseHeader(absl::MakeConstSpan(MakeFile(
      R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4],"data_offsets":[4,8]}})", 12)));
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(h.status().message()), HasSubstr("'data_offsets' appears twice"));
  // Equal keys in different objects are fine.
  EXPECT_TRUE(ParseHeader(absl::MakeConstSpan(
                              MakeFile(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                       R"("__metadata__":{"dtype":"x"}})",
                                       12)))
                  .ok());
}

TEST(SafetensorsMappedFileTest, MissingFileIsNotFound) {
  EXPECT_EQ(MappedFile::Open("/nonexistent/dir/x.safetensors").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SafetensorsMappedFileTest, TruncatedFileIsDataLossNamingThePath) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  const std::string path = dir + "/trunc.safetensors";
  WriteBytes(path, MakeFile(kGoodJson, 6));
  absl::StatusOr<std::unique_ptr<MappedFile>> file = MappedFile::Open(path);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(file.status().message()), HasSubstr(path));

  WriteBytes(path, {});
  EXPECT_EQ(MappedFile::Open(path).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(MappedFile::Open(dir).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dequantd::safetensors
