// The bearer tokens dequantd accepts (--auth-tokens FILE) and the role each one has.
//
// File format (UTF-8 text), one token per line:
//   ROLE TOKEN        ROLE: reader | admin; TOKEN: 16..4096 printable ASCII characters, no space
//   # comment         '#' starts a comment (whole line, or after the token); blank lines ignored
// Tokens are kept only as SHA-256 digests and compared in constant time (CRYPTO_memcmp over
// every entry, no early exit); no method here logs or returns a token.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace dequantd::auth {

// What a token may call (see method_roles.h). admin includes everything reader may call.
enum class Role { kReader, kAdmin };

// "reader" / "admin".
absl::string_view RoleName(Role role);

// Shortest and longest token accepted, characters. 16 is the floor against guessable tokens.
inline constexpr size_t kMinTokenLength = 16;
inline constexpr size_t kMaxTokenLength = 4096;

// An immutable set of (token digest, role). Thread-safe (const after Parse).
class TokenSet {
 public:
  // Parses the file's text. Errors: INVALID_ARGUMENT naming the line number and what is wrong
  // (unknown role, missing token, token too short/long or with a non-printable character, the
  // same token twice, no token at all); the message never contains a token.
  static absl::StatusOr<TokenSet> Parse(absl::string_view contents);

  // The role of `token`, or nullopt when it is not in the set. Constant time in the token's
  // content (it is hashed, then compared with every entry).
  std::optional<Role> Find(absl::string_view token) const;

  size_t size() const { return entries_.size(); }

 private:
  using Digest = std::array<uint8_t, 32>;  // SHA-256
  struct Entry {
    Digest digest;
    Role role;
  };
  static Digest Hash(absl::string_view token);

  std::vector<Entry> entries_;
};

}  // namespace dequantd::auth
