// TokenSet: parsing the --auth-tokens file and constant-time lookup (see token_set.h).
#include "server/auth/token_set.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dequantd::auth {

absl::string_view RoleName(Role role) { return role == Role::kAdmin ? "admin" : "reader"; }

TokenSet::Digest TokenSet::Hash(absl::string_view token) {
  Digest digest;
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest.data());
  return digest;
}

absl::StatusOr<TokenSet> TokenSet::Parse(absl::string_view contents) {
  TokenSet set;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(contents, '\n')) {
    ++line_number;
    const auto invalid = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_number, ": ", why));
    };
    line = line.substr(0, std::min(line.find('#'), line.size()));
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 2) {
      return invalid(absl::StrCat("expected \"ROLE TOKEN\", got ", fields.size(), " field(s)"));
    }
    Role role;
    if (fields[0] == "reader") {
      role = Role::kReader;
    } else if (fields[0] == "admin") {
      role = Role::kAdmin;
    } else {
      // A role is not a secret, but a token pasted in its place would be: name its length only.
      return invalid(absl::StrCat("unknown role (", fields[0].size(),
                                  " characters); expected reader or admin"));
    }
    const absl::string_view token = fields[1];
    if (token.size() < kMinTokenLength || token.size() > kMaxTokenLength) {
      return invalid(absl::StrCat("the token has ", token.size(), " characters; expected ",
                                  kMinTokenLength, "..", kMaxTokenLength));
    }
    if (!std::all_of(token.begin(), token.end(), [](char c) { return c > ' ' && c < 127; })) {
      return invalid("the token has a character that is not printable ASCII");
    }
    Entry entry{Hash(token), role};
    if (std::any_of(set.entries_.begin(), set.entries_.end(),
                    [&](const Entry& e) { return e.digest == entry.digest; })) {
      return invalid("the same token appears on an earlier line");
    }
    set.entries_.push_back(entry);
  }
  if (set.entries_.empty()) return absl::InvalidArgumentError("the file holds no token");
  return set;
}

std::optional<Role> TokenSet::Find(absl::string_view token) const {
  const Digest digest = Hash(token);
  std::optional<Role> found;
  for (const Entry& entry : entries_) {
    // Every entry is compared; the branch depends only on whether this entry matched.
    if (CRYPTO_memcmp(entry.digest.data(), digest.data(), digest.size()) == 0) found = entry.role;
  }
  return found;
}

}  // namespace dequantd::auth
