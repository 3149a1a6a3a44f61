// IsSameHostPeer (see peer.h).
#include "server/regions/peer.h"

#include <arpa/inet.h>

#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"

namespace dequantd::regions {

bool IsSameHostPeer(absl::string_view peer) {
  if (absl::StartsWith(peer, "unix:") || absl::StartsWith(peer, "unix-abstract:")) return true;
  absl::string_view rest = peer;
  if (absl::ConsumePrefix(&rest, "ipv4:")) {
    const size_t colon = rest.rfind(':');
    if (colon == absl::string_view::npos) return false;
    const std::string host(rest.substr(0, colon));
    in_addr addr{};
    return inet_pton(AF_INET, host.c_str(), &addr) == 1 &&
           (ntohl(addr.s_addr) >> 24) == 127;  // 127.0.0.0/8
  }
  if (absl::ConsumePrefix(&rest, "ipv6:[")) {
    const size_t close = rest.find(']');
    if (close == absl::string_view::npos) return false;
    const std::string host(rest.substr(0, close));
    in6_addr addr{};
    if (inet_pton(AF_INET6, host.c_str(), &addr) != 1) return false;
    if (IN6_IS_ADDR_LOOPBACK(&addr)) return true;
    return IN6_IS_ADDR_V4MAPPED(&addr) && addr.s6_addr[12] == 127;
  }
  return false;
}

}  // namespace dequantd::regions
