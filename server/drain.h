// Graceful shutdown that does not cut off a stream still being delivered.
//
// The probe: with --shutdown-deadline 60, a client reading a 425 MB stream slowly got UNAVAILABLE
// "Connection reset by peer" after 404 MB, and the server exited at 20 s. Cause: a handler
// returns once its last message and status are handed to the kernel; grpc::Server::Shutdown has
// already sent GOAWAY, so gRPC closes the connection as soon as its last stream ends. The
// connection's send queue still held megabytes the client had not received, and the client
// kept sending WINDOW_UPDATE frames as it read: close(2) on a socket with unread incoming data
// sends a TCP RST (RFC 2525), which discards both the server's unsent bytes and what the
// client's kernel had not yet handed to gRPC, and fails the stream. The exit itself was on time
// (the calls had ended); what was lost was their tail.
//
// The fix: drain before gRPC's Shutdown. Health turns NOT_SERVING; dequantd waits (bounded by the
// shutdown deadline) until no call of dequant.v1.DequantService is in flight, then until the
// send queue of every accepted connection on the gRPC port is empty (SIOCOUTQ: everything sent
// was acknowledged by the client), and only then calls Shutdown, which sends GOAWAY and closes.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>

#include <grpcpp/support/server_interceptor.h>

namespace dequantd {

// Counts the calls of dequant.v1.DequantService in flight (health checks and reflection, whose
// Watch streams never end, are not counted). Thread-safe.
class CallTracker {
 public:
  int64_t in_flight() const { return in_flight_.load(); }
  // A server interceptor factory counting calls into this tracker, which must outlive the server.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeInterceptorFactory();

 private:
  friend class CallTrackerInterceptor;
  std::atomic<int64_t> in_flight_{0};
};

// Whether every accepted TCP connection of this process on local port `port` has an empty send
// queue (SIOCOUTQ 0: all bytes written were acknowledged by the peer). Linux; reads /proc/self/fd.
bool SendQueuesEmpty(int port);

// Waits, until `deadline` at the latest, for `tracker` to have no call in flight and then for
// SendQueuesEmpty(port). Returns whether it had to wait for either (something was in progress).
bool WaitForDrain(const CallTracker& tracker, int port,
                  std::chrono::steady_clock::time_point deadline);

}  // namespace dequantd
