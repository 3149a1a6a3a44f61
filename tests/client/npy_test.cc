// formats/npy: the preamble byte for byte against NumPy 2.4's np.save output, streamed writes
// (round trip, atomicity, wrong byte counts) and the reader's checks.
#include "formats/npy.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/test_dir.h"

namespace dequantd::npy {
namespace {

namespace fs = std::filesystem;

using client_test::TempPath;

std::vector<std::string> FilesIn(const std::string& path) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path())) {
    out.push_back(e.path().filename().string());
  }
  return out;
}

// What np.save(f, np.zeros((3, 4), '<f2')) writes before the data (NumPy 2.4.6): magic, v1.0,
// HEADER_LEN 0x76 = 118, the dict, spaces, '\n'; 128 bytes in all.
std::string NumpyPreamble(const std::string& dict) {
  std::string s("\x93NUMPY\x01\x00\x76\x00", 10);
  s += dict;
  s.append(127 - s.size(), ' ');
  s += '\n';
  return s;
}

TEST(NpyPreambleTest, MatchesNumpyForF2ShapeThreeByFour) {
  absl::StatusOr<std::string> p = EncodePreamble("<f2", {3, 4});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, NumpyPreamble("{'descr': '<f2', 'fortran_order': False, 'shape': (3, 4), }"));
  EXPECT_EQ(p->size(), 128u);
}

TEST(NpyPreambleTest, MatchesNumpyForU2AndOneDimensionalF4) {
  EXPECT_EQ(*EncodePreamble("<u2", {1536, 576}),
            NumpyPreamble("{'descr': '<u2', 'fortran_order': False, 'shape': (1536, 576), }"));
  EXPECT_EQ(*EncodePreamble("<f4", {5}),
            NumpyPreamble("{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }"));
}

TEST(NpyPreambleTest, DataStartsAtMultipleOf64ForLongShapes) {
  absl::StatusOr<std::string> p = EncodePreamble("<f4", {123456789012, 1, 2, 3, 4, 5, 6, 7});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->size() % 64, 0u);
  EXPECT_EQ(p->back(), '\n');
}

TEST(NpyPreambleTest, RejectsUnknownDescrAndNegativeDim) {
  EXPECT_EQ(EncodePreamble("<c8", {2}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodePreamble("<f2", {2, -1}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NpyWriterTest, StreamedChunksRoundTrip) {
  const std::string path = TempPath("npy_round_trip/round_trip.npy");
  std::vector<uint8_t> data(2 * 3 * 8 * 4);  // (6, 8) fp32
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + 1);
  absl::StatusOr<std::unique_ptr<NpyWriter>> w = NpyWriter::Create(path, "<f4", {6, 8});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_FALSE(fs::exists(path)) << "visible before Finish";
  // Uneven chunks, one of them splitting an element.
  for (const auto& [begin, end] : {std::pair{0, 1}, std::pair{1, 64}, std::pair{64, 192}}) {
    ASSERT_TRUE((*w)->Append(absl::MakeConstSpan(data).subspan(begin, end - begin)).ok());
  }
  EXPECT_EQ((*w)->bytes_written(), 192);
  ASSERT_TRUE((*w)->Finish().ok());
  absl::StatusOr<Array> a = ReadFile(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->header.descr, "<f4");
  EXPECT_FALSE(a->header.fortran_order);
  EXPECT_THAT(a->header.shape, ::testing::ElementsAre(6, 8));
  EXPECT_EQ(a->header.data_offset, 128);
  EXPECT_EQ(a->data, data);
  EXPECT_THAT(FilesIn(path), ::testing::ElementsAre("round_trip.npy"));  // no temporary left
}

TEST(NpyWriterTest, TooFewBytesIsDataLossAndLeavesNoFile) {
  const std::string path = TempPath("short.npy");
  absl::StatusOr<std::unique_ptr<NpyWriter>> w = NpyWriter::Create(path, "<f2", {2, 8});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Append(std::vector<uint8_t>(30)).ok());
  EXPECT_EQ((*w)->Finish().code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ((*w)->Finish().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(NpyWriterTest, TooManyBytesIsOutOfRange) {
  const std::string path = TempPath("long.npy");
  absl::StatusOr<std::unique_ptr<NpyWriter>> w = NpyWriter::Create(path, "<u2", {1, 8});
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->Append(std::vector<uint8_t>(18)).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*w)->Append(std::vector<uint8_t>(2)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(fs::exists(path));
}

TEST(NpyWriterTest, DestroyedBeforeFinishRemovesTemporaryFile) {
  const std::string path = TempPath("npy_abandoned/x.npy");
  {
    absl::StatusOr<std::unique_ptr<NpyWriter>> w = NpyWriter::Create(path, "<u2", {4, 8});
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Append(std::vector<uint8_t>(10)).ok());
  }
  EXPECT_THAT(FilesIn(path), ::testing::IsEmpty());
}

TEST(NpyWriterTest, MissingDirectoryIsNotFound) {
  EXPECT_EQ(NpyWriter::Create("/nonexistent-dir-for-test/x.npy", "<f2", {1, 8}).status().code(),
            absl::StatusCode::kNotFound);
}

std::vector<uint8_t> Bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

TEST(NpyReaderTest, ParsesDoubleQuotesFortranOrderAndVersionTwo) {
  std::string v2("\x93NUMPY\x02\x00", 8);
  const std::string dict = "{\"descr\": \"<i4\", \"shape\": (2,), \"fortran_order\": True}\n";
  v2 += std::string{static_cast<char>(dict.size()), 0, 0, 0} + dict + std::string(8, '\x01');
  absl::StatusOr<Header> h = ParseHeader(Bytes(v2));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->descr, "<i4");
  EXPECT_TRUE(h->fortran_order);
  EXPECT_THAT(h->shape, ::testing::ElementsAre(2));
  EXPECT_EQ(h->data_offset, static_cast<int64_t>(12 + dict.size()));
}

TEST(NpyReaderTest, RejectsBadMagicShortDataAndTrailingBytes) {
  const std::string good = *EncodePreamble("<f2", {2, 8}) + std::string(32, '\0');
  EXPECT_TRUE(ParseHeader(Bytes(good)).ok());
  std::string bad_magic = good;
  bad_magic[1] = 'M';
  EXPECT_EQ(ParseHeader(Bytes(bad_magic)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseHeader(Bytes(good.substr(0, good.size() - 1))).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseHeader(Bytes(good + "x")).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseHeader(Bytes(good.substr(0, 9))).status().code(), absl::StatusCode::kDataLoss);
}

TEST(NpyReaderTest, RejectsMissingOrMalformedFieldsNamingThem) {
  auto parse = [](const std::string& dict) {
    std::string s("\x93NUMPY\x01\x00", 8);
    s += std::string{static_cast<char>(dict.size()), 0} + dict;
    return ParseHeader(Bytes(s)).status();
  };
  EXPECT_THAT(parse("{'descr': '<f2', 'fortran_order': False}").message(),
              ::testing::HasSubstr("'shape'"));
  EXPECT_THAT(parse("{'descr': '<f2', 'fortran_order': maybe, 'shape': ()}").message(),
              ::testing::HasSubstr("'fortran_order'"));
  EXPECT_THAT(parse("{'descr': '>f2', 'fortran_order': False, 'shape': ()}").message(),
              ::testing::HasSubstr("'descr'"));
  EXPECT_THAT(parse("{'descr': '<f2', 'fortran_order': False, 'shape': (1, x)}").message(),
              ::testing::HasSubstr("'shape'"));
}

}  // namespace
}  // namespace dequantd::npy
