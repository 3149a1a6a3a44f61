// MetricsHttpServer (see metrics_http.h).
#include "server/metrics/metrics_http.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CivetServer.h>
#include <civetweb.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace dequantd {
namespace {

// The Prometheus text exposition format, version 0.0.4.
constexpr char kTextFormat[] = "text/plain; version=0.0.4; charset=utf-8";
constexpr std::string_view kIndex = "dequantd: Prometheus metrics at /metrics\n";

// Why `listen` (HOST:PORT, IPv6 as [ADDR]:PORT) cannot be bound, found by binding a TCP socket
// to it the way civetweb does (SO_REUSEADDR): strerror of bind's errno ("Address already in
// use"), of a failed socket(2), or getaddrinfo's text. Empty when the probe binds (the failure
// was something else).
std::string ProbeBindError(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return "";
  std::string host = listen.substr(0, colon);
  const std::string port = listen.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* addresses = nullptr;
  if (const int err = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &addresses); err != 0) {
    return ::gai_strerror(err);
  }
  std::string error;
  const int fd = ::socket(addresses->ai_family, addresses->ai_socktype, addresses->ai_protocol);
  if (fd < 0) {
    error = std::strerror(errno);
  } else {
    const int on = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (::bind(fd, addresses->ai_addr, addresses->ai_addrlen) != 0) error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(addresses);
  return error;
}

// Writes a 200 response of type `content_type` carrying `body`.
void SendOk(mg_connection* conn, const char* content_type, std::string_view body) {
  mg_send_http_ok(conn, content_type, static_cast<long long>(body.size()));
  mg_write(conn, body.data(), body.size());
}

// civetweb reports through this callback; returning 1 keeps it from printing to stderr (a library
// does not log; Start returns the reason as a Status).
int DiscardLogMessage(const mg_connection* /*conn*/, const char* /*message*/) { return 1; }

}  // namespace

class MetricsHttpServer::Handler final : public CivetHandler {
 public:
  explicit Handler(std::shared_ptr<prometheus::Collectable> collectable)
      : collectable_(std::move(collectable)) {}

  bool handleGet(CivetServer* /*server*/, mg_connection* conn) override {
    const mg_request_info* request = mg_get_request_info(conn);
    const std::string_view uri = request->local_uri != nullptr ? request->local_uri : "";
    if (uri == "/metrics") {
      SendOk(conn, kTextFormat, prometheus::TextSerializer().Serialize(collectable_->Collect()));
    } else if (uri == "/") {
      SendOk(conn, "text/plain; charset=utf-8", kIndex);
    } else {
      mg_send_http_error(conn, 404, "Not found: dequantd serves /metrics\n");
    }
    return true;
  }

 private:
  const std::shared_ptr<prometheus::Collectable> collectable_;
};

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, std::shared_ptr<prometheus::Collectable> collectable) {
  auto http = std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer());
  http->handler_ = std::make_unique<Handler>(std::move(collectable));
  CivetCallbacks callbacks;
  callbacks.log_message = DiscardLogMessage;
  try {
    http->server_ = std::make_unique<CivetServer>(
        std::vector<std::string>{"listening_ports", listen, "num_threads", "2"}, &callbacks);
  } catch (const CivetException& e) {
    // civetweb's own text ("null context when constructing CivetServer...") gives no reason.
    const std::string reason = ProbeBindError(listen);
    return absl::UnavailableError(reason.empty() ? e.what() : reason);
  }
  // "**" matches every URI; the handler routes by path.
  http->server_->addHandler("**", http->handler_.get());
  const std::vector<int> ports = http->server_->getListeningPorts();
  http->port_ = ports.empty() ? 0 : ports.front();
  http->host_ = listen.substr(0, listen.rfind(':'));
  return http;
}

namespace {

// Connects to `port` on the loopback (or `host` when it names one address) and closes at once:
// wakes civetweb's master thread out of its poll(2).
void PokeListener(const std::string& host, int port) {
  std::string target = host;
  if (target.size() >= 2 && target.front() == '[' && target.back() == ']') {
    target = target.substr(1, target.size() - 2);
  }
  if (target.empty() || target == "0.0.0.0") target = "127.0.0.1";
  if (target == "::") target = "::1";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* addresses = nullptr;
  if (::getaddrinfo(target.c_str(), std::to_string(port).c_str(), &hints, &addresses) != 0) return;
  const int fd =
      ::socket(addresses->ai_family, addresses->ai_socktype | SOCK_CLOEXEC, addresses->ai_protocol);
  if (fd >= 0) {
    ::connect(fd, addresses->ai_addr, addresses->ai_addrlen);
    ::close(fd);
  }
  ::freeaddrinfo(addresses);
}

}  // namespace

MetricsHttpServer::~MetricsHttpServer() {
  if (server_ == nullptr) return;
  // civetweb 1.15's master thread polls its listening sockets with a fixed 2 s timeout
  // (SOCKET_TIMEOUT_QUANTUM) and only then sees the stop flag, so mg_stop took about 2 s, and a
  // dequantd restarted within that time found the port still bound ("Address already in use").
  // A connection to the listener wakes the poll: poke it until the stop has finished.
  std::atomic<bool> stopped{false};
  std::thread waker([this, &stopped] {
    while (!stopped.load()) {
      PokeListener(host_, port_);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  server_->close();  // mg_stop: joins civetweb's threads and closes the listening socket
  stopped = true;
  waker.join();
}

}  // namespace dequantd
