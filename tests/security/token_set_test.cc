// TokenSet: the --auth-tokens file format and constant-time lookup (server/auth/token_set.h).
#include "server/auth/token_set.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dequantd::auth {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kReaderToken[] = "reader-token-0123456789";
constexpr char kAdminToken[] = "admin-token-abcdefghijkl";

TEST(TokenSetTest, ParsesRolesCommentsAndBlankLines) {
  absl::StatusOr<TokenSet> set = TokenSet::Parse(
      "# dequantd tokens\n"
      "\n"
      "reader reader-token-0123456789\n"
      "  admin\tadmin-token-abcdefghijkl   # the operator\n");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->size(), 2u);
  EXPECT_EQ(set->Find(kReaderToken), Role::kReader);
  EXPECT_EQ(set->Find(kAdminToken), Role::kAdmin);
  EXPECT_EQ(set->Find("reader-token-012345678"), std::nullopt);    // a prefix
  EXPECT_EQ(set->Find("reader-token-01234567890"), std::nullopt);  // longer
  EXPECT_EQ(set->Find(""), std::nullopt);
}

struct BadFile {
  const char* contents;
  const char* message;  // expected in the error
};

class TokenSetErrorTest : public ::testing::TestWithParam<BadFile> {};

TEST_P(TokenSetErrorTest, NamesTheLineAndNeverTheToken) {
  absl::StatusOr<TokenSet> set = TokenSet::Parse(GetParam().contents);
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(set.status().message()), HasSubstr(GetParam().message));
  EXPECT_THAT(std::string(set.status().message()), Not(HasSubstr("secret")));
}

INSTANTIATE_TEST_SUITE_P(
    Files, TokenSetErrorTest,
    ::testing::Values(
        BadFile{"", "the file holds no token"},
        BadFile{"# only a comment\n\n", "the file holds no token"},
        BadFile{"reader secret-token-0123456789\nroot secret-token-9876543210\n",
                "line 2: unknown role (4 characters); expected reader or admin"},
        BadFile{"secret-token-0123456789\n", "line 1: expected \"ROLE TOKEN\", got 1 field(s)"},
        BadFile{"admin secret-0123456789 extra\n", "line 1: expected \"ROLE TOKEN\", got 3"},
        BadFile{"reader secret-short\n", "line 1: the token has 12 characters; expected 16..4096"},
        BadFile{"reader secret-token-\x01-0123456789\n", "not printable ASCII"},
        BadFile{"reader secret-token-0123456789\n\nadmin secret-token-0123456789\n",
                "line 3: the same token appears on an earlier line"}));

TEST(TokenSetTest, LongestTokenAcceptedAndOneMoreRefused) {
  const std::string longest(kMaxTokenLength, 'x');
  absl::StatusOr<TokenSet> ok = TokenSet::Parse("admin " + longest);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->Find(longest), Role::kAdmin);
  EXPECT_FALSE(TokenSet::Parse("admin " + longest + "x").ok());
}

TEST(TokenSetTest, RoleNames) {
  EXPECT_EQ(RoleName(Role::kReader), "reader");
  EXPECT_EQ(RoleName(Role::kAdmin), "admin");
}

}  // namespace
}  // namespace dequantd::auth
