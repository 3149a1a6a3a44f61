// The drain before gRPC's Shutdown (server/drain.h): SendQueuesEmpty on a real loopback TCP
// connection, and WaitForDrain's bound.
#include "server/drain.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace dequantd {
namespace {

// A loopback listener, a client connected to it and the accepted socket; closes all three.
struct Connection {
  int listener = -1, client = -1, accepted = -1, port = 0;
  Connection() {
    listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0) return;
    ::listen(listener, 1);
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
    client = ::socket(AF_INET, SOCK_STREAM, 0);
    // A small receive buffer, so that the server's writes stay queued on its side.
    int small = 4096;
    ::setsockopt(client, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    if (::connect(client, reinterpret_cast<sockaddr*>(&addr), len) != 0) return;
    accepted = ::accept(listener, nullptr, nullptr);
  }
  ~Connection() {
    for (int fd : {listener, client, accepted}) {
      if (fd >= 0) ::close(fd);
    }
  }
};

TEST(DrainTest, SendQueueOfAnAcceptedConnectionIsSeenUntilThePeerReadsIt) {
  Connection c;
  ASSERT_GE(c.accepted, 0);
  EXPECT_TRUE(SendQueuesEmpty(c.port));
  // 1 MiB written by the "server" side, not yet read by the client: unacknowledged bytes remain.
  const std::string data(1 << 20, 'x');
  ASSERT_EQ(::send(c.accepted, data.data(), 64 << 10, MSG_DONTWAIT), 64 << 10);
  EXPECT_FALSE(SendQueuesEmpty(c.port));
  // Another port's connections are not looked at.
  EXPECT_TRUE(SendQueuesEmpty(c.port == 65535 ? 1 : c.port + 1));
  // The client reads everything: the queue empties.
  char buf[4096];
  int64_t read = 0;
  while (read < (64 << 10)) {
    const ssize_t n = ::recv(c.client, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    read += n;
  }
  bool empty = false;
  for (int i = 0; i < 200 && !empty; ++i) {  // the last ACK may take a moment
    empty = SendQueuesEmpty(c.port);
    if (!empty) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(empty);
}

TEST(DrainTest, WaitForDrainGivesUpAtTheDeadlineAndSaysItWaited) {
  Connection c;
  ASSERT_GE(c.accepted, 0);
  CallTracker tracker;
  // Nothing in flight, nothing queued: no wait.
  EXPECT_FALSE(WaitForDrain(tracker, c.port, std::chrono::steady_clock::now()));
  const std::string data(64 << 10, 'x');
  ASSERT_EQ(::send(c.accepted, data.data(), data.size(), MSG_DONTWAIT),
            static_cast<ssize_t>(data.size()));
  // Bytes queued and never read: WaitForDrain returns (true) once the deadline has passed.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  EXPECT_TRUE(WaitForDrain(tracker, c.port, deadline));
  EXPECT_GE(std::chrono::steady_clock::now(), deadline);
}

}  // namespace
}  // namespace dequantd
