// QuotedName: a user-supplied name (a tensor name from a request) as error messages quote it,
// cut to a bounded length. gRPC sends a status message in the response's trailing metadata,
// whose size is limited (8 KiB by default on the client): a message quoting a 20 KB name in full
// would reach the client as RESOURCE_EXHAUSTED "received initial metadata size exceeds limit"
// instead of the server's status.
#pragma once

#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dequantd {

// Longest part of a name quoted in an error message, in bytes.
inline constexpr size_t kMaxQuotedNameBytes = 200;

// The bytes of `part` as an error message may show them: an ASCII control character (0x00-0x1F,
// 0x7F), a double quote or a backslash as a C escape (\xNN, \", \\), every other byte as it is
// (so a UTF-8 name reads as itself), so that a name cannot end the quotes early or reach a
// terminal or a log line as a control sequence (ESC colour codes, a newline, NUL).
inline std::string EscapedNamePart(absl::string_view part) {
  std::string out;
  out.reserve(part.size());
  for (const char c : part) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (byte < 0x20 || byte == 0x7F) {
      constexpr char kHex[] = "0123456789abcdef";
      out.append({'\\', 'x', kHex[byte >> 4], kHex[byte & 0xF]});
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// `name` in double quotes, escaped (EscapedNamePart): "name". A name longer than
// kMaxQuotedNameBytes keeps its first bytes up to that limit (up to 3 fewer when the cut would
// split a UTF-8 character), then `..." (N bytes)` with N the whole name's size: at most
// 4 x kMaxQuotedNameBytes + 35 bytes in all (every kept byte escaped). Thread-safe (pure
// function).
inline std::string QuotedName(absl::string_view name) {
  if (name.size() <= kMaxQuotedNameBytes) return absl::StrCat("\"", EscapedNamePart(name), "\"");
  size_t cut = kMaxQuotedNameBytes;
  // Back up over UTF-8 continuation bytes (10xxxxxx), at most 3 (a UTF-8 character has at most
  // 4 bytes), so that the cut does not split a character of a valid UTF-8 name.
  while (cut > kMaxQuotedNameBytes - 3 && (static_cast<unsigned char>(name[cut]) & 0xC0) == 0x80) {
    --cut;
  }
  return absl::StrCat("\"", EscapedNamePart(name.substr(0, cut)), "...\" (", name.size(),
                      " bytes)");
}

}  // namespace dequantd
