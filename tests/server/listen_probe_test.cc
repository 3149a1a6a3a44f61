// WhyCannotListen: the reason a listening address fails, found by binding it the way gRPC would.

#include "server/listen_probe.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dequantd {
namespace {

using ::testing::StartsWith;

// A TCP socket listening on 127.0.0.1 at an ephemeral port, closed on destruction.
class Listener {
 public:
  Listener() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(fd_, 1), 0);
    socklen_t len = sizeof addr;
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
  }
  ~Listener() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

TEST(ListenProbeTest, APortInUseIsNamed) {
  Listener busy;
  EXPECT_EQ(WhyCannotListen("127.0.0.1:" + std::to_string(busy.port())), "Address already in use");
}

TEST(ListenProbeTest, AFreePortAndPortZeroHaveNoReason) {
  EXPECT_EQ(WhyCannotListen("127.0.0.1:0"), "");
  int free_port = 0;
  {
    Listener probe;
    free_port = probe.port();
  }
  EXPECT_EQ(WhyCannotListen("127.0.0.1:" + std::to_string(free_port)), "");
}

TEST(ListenProbeTest, AnAddressOfNoLocalInterfaceIsNamed) {
  // 192.0.2.0/24 is TEST-NET-1 (RFC 5737): never an address of this host.
  EXPECT_EQ(WhyCannotListen("192.0.2.1:0"), "Cannot assign requested address");
}

TEST(ListenProbeTest, AnUnknownHostIsNamed) {
  EXPECT_THAT(WhyCannotListen("no-such-host.invalid:50051"),
              StartsWith("cannot resolve no-such-host.invalid: "));
}

TEST(ListenProbeTest, UnixSocketReasons) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("listen_probe_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  EXPECT_EQ(WhyCannotListen("unix:" + (dir / "missing" / "dq.sock").string()),
            "No such file or directory");
  const std::string file = (dir / "plain").string();
  std::ofstream(file) << "x";
  EXPECT_EQ(WhyCannotListen("unix:" + file), file + " exists and is not a socket");
  EXPECT_TRUE(std::filesystem::exists(file));  // never removed
  EXPECT_EQ(WhyCannotListen("unix:" + (dir / "dq.sock").string()), "");
  EXPECT_FALSE(std::filesystem::exists(dir / "dq.sock"));  // the probe's own socket is removed
  EXPECT_EQ(WhyCannotListen("unix:/" + std::string(200, 'x')),
            "path is 201 bytes, a Unix socket path holds at most 107");
  std::filesystem::remove_all(dir);
}

TEST(ListenProbeTest, ALiveUnixSocketIsInUseAStaleOneIsNot) {
  const std::string path =
      ::testing::TempDir() + "/listen_probe_live_" + std::to_string(::getpid()) + ".sock";
  ::unlink(path.c_str());
  EXPECT_EQ(UnixSocketInUse("unix:" + path), "");  // no file
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  EXPECT_EQ(UnixSocketInUse("unix:" + path),
            path + " is in use by a running server (a connection to it succeeded)");
  EXPECT_EQ(UnixSocketInUse("127.0.0.1:0"), "");  // TCP is not its business
  ::close(fd);  // the file stays: a stale socket, which gRPC may replace
  EXPECT_EQ(UnixSocketInUse("unix:" + path), "");
  ::unlink(path.c_str());
}

}  // namespace
}  // namespace dequantd
