// Why a listening address cannot be served. gRPC's ServerBuilder only reports that a port failed
// to bind; after it fails, the server binds the same address itself to name the reason.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace dequantd {

// `listen` is HOST:PORT ("127.0.0.1:50051", "[::1]:0", "localhost:8080") or unix:PATH. Returns
// the reason a socket cannot listen there (strerror text, e.g. "Address already in use" or, for
// unix:, "No such file or directory" for a missing directory), "cannot resolve HOST: ..." for an
// unknown host name, or "" when a bind and listen succeed now (the failure was gRPC's own). A
// unix: probe never touches an existing path (an existing non-socket is reported as such).
std::string WhyCannotListen(absl::string_view listen);

// For unix:PATH where PATH is a socket that accepts a connection now (another server listens
// there): "PATH is in use by a running server". "" for anything else (no file, a stale socket,
// or not a unix: address): gRPC would unlink and rebind the path.
std::string UnixSocketInUse(absl::string_view listen);

}  // namespace dequantd
