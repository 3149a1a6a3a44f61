#include "server/listen_probe.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace dequantd {
namespace {

// Closes the descriptor on every path.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string Errno(int error) { return std::strerror(error); }

std::string ProbeUnix(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    // gRPC unlinks a stale socket before binding; anything else in the way is the reason.
    return S_ISSOCK(st.st_mode) ? "" : absl::StrCat(path, " exists and is not a socket");
  }
  sockaddr_un addr{};
  if (path.size() >= sizeof addr.sun_path) {
    return absl::StrCat("path is ", path.size(), " bytes, a Unix socket path holds at most ",
                        sizeof addr.sun_path - 1);
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return Errno(errno);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    return Errno(errno);
  }
  ::unlink(path.c_str());  // only the socket this probe just made
  return "";
}

std::string ProbeTcp(absl::string_view listen) {
  const size_t colon = listen.rfind(':');
  if (colon == absl::string_view::npos) return "not HOST:PORT";
  std::string host(listen.substr(0, colon));
  const std::string port(listen.substr(colon + 1));
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc =
          ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return absl::StrCat("cannot resolve ", host, ": ", ::gai_strerror(rc));
  }
  std::string reason;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.get() < 0) {
      reason = Errno(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as gRPC does
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), 1) != 0) {
      reason = Errno(errno);
      continue;
    }
    reason.clear();  // this address can be served now
    break;
  }
  ::freeaddrinfo(found);
  return reason;
}

}  // namespace

std::string UnixSocketInUse(absl::string_view listen) {
  if (!absl::ConsumePrefix(&listen, "unix:")) return "";
  const std::string path(listen);
  struct stat st {};
  sockaddr_un addr{};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode) ||
      path.size() >= sizeof addr.sun_path) {
    return "";
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return "";
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) return "";
  return absl::StrCat(path, " is in use by a running server (a connection to it succeeded)");
}

std::string WhyCannotListen(absl::string_view listen) {
  if (absl::ConsumePrefix(&listen, "unix:")) return ProbeUnix(std::string(listen));
  return ProbeTcp(listen);
}

}  // namespace dequantd
