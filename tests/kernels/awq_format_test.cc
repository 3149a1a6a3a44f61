// The AWQ nibble order, pinned with hand-worked words (kernels/awq_format.h).
#include "kernels/awq_format.h"

#include <array>
#include <cstdint>

#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"

namespace dequantd {
namespace {

// Column 8c + i sits in nibble kNibble[i] (AutoAWQ order_map inverted by hand).
constexpr std::array<int, 8> kNibble = {0, 4, 1, 5, 2, 6, 3, 7};

TEST(AwqFormatTest, OrderTablesMatchAutoAwq) {
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(awq::kNibbleOfColumn[i], kNibble[i]) << i;
    EXPECT_EQ(awq::kColumnOfNibble[i], testing::kOrderMap[i]) << i;
  }
}

TEST(AwqFormatTest, NibbleForColumnEveryPositionEveryValue) {
  for (int i = 0; i < 8; ++i) {
    for (uint32_t v = 0; v < 16; ++v) {
      const uint32_t word = v << (4 * kNibble[i]);
      for (int j = 0; j < 8; ++j) {
        EXPECT_EQ(awq::NibbleForColumn(word, j), j == i ? v : 0u)
            << "column " << i << " value " << v << " read at column " << j;
      }
    }
  }
}

TEST(AwqFormatTest, NegativeWords) {
  // 0xF0000000: only nibble 7 set, which holds column 7.
  for (int j = 0; j < 7; ++j) EXPECT_EQ(awq::NibbleForColumn(0xF0000000u, j), 0u) << j;
  EXPECT_EQ(awq::NibbleForColumn(0xF0000000u, 7), 15u);
  // 0x87654321: nibbles 0..7 hold 1..8; nibble j is column order_map[j] = [0,2,4,6,1,3,5,7], so
  // columns 0..7 read nibbles [0,4,1,5,2,6,3,7] = values [1,5,2,6,3,7,4,8].
  constexpr std::array<uint32_t, 8> kColumns = {1, 5, 2, 6, 3, 7, 4, 8};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(awq::NibbleForColumn(0x87654321u, j), kColumns[j]) << j;
  // 0x80000001: column 0 = 1, column 7 = 8.
  EXPECT_EQ(awq::NibbleForColumn(0x80000001u, 0), 1u);
  EXPECT_EQ(awq::NibbleForColumn(0x80000001u, 7), 8u);
  // 0xFFFFFFFF: every column 15.
  for (int j = 0; j < 8; ++j) EXPECT_EQ(awq::NibbleForColumn(0xFFFFFFFFu, j), 15u) << j;
}

TEST(AwqFormatTest, PackColumnsIsTheInverse) {
  EXPECT_EQ(testing::PackColumns({1, 5, 2, 6, 3, 7, 4, 8}), 0x87654321u);
  EXPECT_EQ(testing::PackColumns({0, 0, 0, 0, 0, 0, 0, 15}), 0xF0000000u);
  EXPECT_EQ(testing::PackColumns({0, 9, 0, 0, 0, 0, 0, 0}), 0x00090000u);  // column 1: nibble 4
}

}  // namespace
}  // namespace dequantd
