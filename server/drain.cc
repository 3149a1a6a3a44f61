// Drain before shutdown (see drain.h).
#include "server/drain.h"

#include <dirent.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cstdlib>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace dequantd {

class CallTrackerInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit CallTrackerInterceptor(CallTracker* tracker) : tracker_(tracker) {
    tracker_->in_flight_.fetch_add(1);
  }
  ~CallTrackerInterceptor() override { tracker_->in_flight_.fetch_sub(1); }
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    methods->Proceed();
  }

 private:
  CallTracker* const tracker_;
};

namespace {

class CallTrackerFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallTrackerFactory(CallTracker* tracker) : tracker_(tracker) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    const absl::string_view method = info->method() != nullptr ? info->method() : "";
    if (!absl::StartsWith(method, "/dequant.v1.DequantService/")) return nullptr;
    return new CallTrackerInterceptor(tracker_);
  }

 private:
  CallTracker* const tracker_;
};

// The local TCP port of socket `fd`, or -1 (not an IPv4/IPv6 socket, or a listener).
int AcceptedSocketPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  int port = -1;
  if (addr.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  } else {
    return -1;
  }
  int listening = 0;
  socklen_t optlen = sizeof listening;
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &optlen) != 0 || listening != 0) {
    return -1;
  }
  return port;
}

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
CallTracker::MakeInterceptorFactory() {
  return std::make_unique<CallTrackerFactory>(this);
}

bool SendQueuesEmpty(int port) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return true;  // nothing to observe: do not hold the shutdown
  bool empty = true;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const int fd = std::atoi(e->d_name);
    if (fd == ::dirfd(dir) || AcceptedSocketPort(fd) != port) continue;
    int unacknowledged = 0;
    if (::ioctl(fd, SIOCOUTQ, &unacknowledged) == 0 && unacknowledged > 0) {
      empty = false;
      break;
    }
  }
  ::closedir(dir);
  return empty;
}

bool WaitForDrain(const CallTracker& tracker, int port,
                  std::chrono::steady_clock::time_point deadline) {
  constexpr auto kPoll = std::chrono::milliseconds(20);
  bool waited = false;
  while (tracker.in_flight() > 0 && std::chrono::steady_clock::now() < deadline) {
    waited = true;
    std::this_thread::sleep_for(kPoll);
  }
  while (!SendQueuesEmpty(port) && std::chrono::steady_clock::now() < deadline) {
    waited = true;
    std::this_thread::sleep_for(kPoll);
  }
  return waited;
}

}  // namespace dequantd
