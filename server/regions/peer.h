// Which gRPC peers are on the same host as the server: only they may register regions (a region
// makes the server write into memory, which only a local process can share with it).
#pragma once

#include "absl/strings/string_view.h"

namespace dequantd::regions {

// True for a Unix-domain-socket peer ("unix:...", "unix-abstract:...") and a loopback one
// ("ipv4:127.x.y.z:PORT", "ipv6:[::1]:PORT", "ipv6:[::ffff:127.x.y.z]:PORT"), as
// grpc::ServerContext::peer() spells them; false for anything else (other addresses, malformed).
bool IsSameHostPeer(absl::string_view peer);

}  // namespace dequantd::regions
