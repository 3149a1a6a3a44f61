// The dequantd process core: loads a checkpoint, picks a backend, serves dequant.v1 over gRPC
// and /metrics over HTTP. main.cc parses flags into ServerOptions and calls Start; integration
// tests start it in-process on 127.0.0.1 with port 0.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/auth/security_options.h"
#include "server/rpc/transport_limits.h"

namespace dequantd {

// The dequantd version, e.g. "0.1.0" (CMake's PROJECT_VERSION).
extern const char kDequantdVersion[];

// The largest max_request_bytes accepted: gRPC's message size limit is an int, and the receive
// limit (GrpcReceiveLimitBytes) adds room for the request's other fields. 2020174185 bytes is
// about 1.88 GiB; Start refuses more with INVALID_ARGUMENT naming max_request_bytes.
inline constexpr int64_t kMaxRequestBytesLimit = 2020174185;

// The gRPC receive limit set for `max_request_bytes`: max_request_bytes + max_request_bytes / 16
// + 1 MiB, so that an oversized inline request reaches the service's own check and gets its
// precise RESOURCE_EXHAUSTED message; saturates at INT_MAX (negative input counts as 0).
int GrpcReceiveLimitBytes(int64_t max_request_bytes);

// The largest max_concurrent_streams accepted.
inline constexpr int kMaxConcurrentStreamsLimit = 100000;
// Largest --load-threads accepted.
inline constexpr int kMaxLoadThreads = 256;
// Smallest --load-staging-bytes accepted: two 1 MiB buffers for one reader thread.
inline constexpr int64_t kMinLoadStagingBytes = int64_t{2} << 20;

struct ServerOptions {
  std::string model_dir;  // checkpoint directory; empty = no model loaded
  // gRPC address: HOST:PORT (port 0 picks a free port), or unix:PATH for a Unix domain socket
  // (same-host clients; see docs/architecture.md for the socket file's permissions).
  std::string listen = "127.0.0.1:50051";
  std::string metrics_listen = "127.0.0.1:9464";  // /metrics address; empty disables it
  std::string backend = "auto";  // "auto" (cuda if a GPU is present), "cpu", "cuda"
  int cpu_threads = 0;           // CPU backend threads; 0 = hardware concurrency
  // Several GPUs (docs/architecture.md "Several GPUs"): the CUDA devices that serve, "all" or a
  // comma list of ordinals (e.g. "0,2"; a repeat adds a worker on the same GPU); not "all" with
  // the cpu backend is INVALID_ARGUMENT.
  std::string devices = "all";
  std::string placement = "auto";  // auto, replicated or split: which GPU holds which layers
  // The packed bytes each GPU worker keeps resident (--device-memory-limit; docs/architecture.md
  // "Models larger than the GPU"); 0 = no limit (what fits beside the working reserve). Layers
  // past it are served from host copies, staged per call. >= 0; more than a GPU's memory is
  // INVALID_ARGUMENT at start; non-zero with the cpu backend is INVALID_ARGUMENT.
  int64_t device_memory_limit_bytes = 0;
  // Loading (issue 22; docs/architecture.md "Loading"): reader threads (0 = min(16, hardware
  // threads); 1..kMaxLoadThreads) and the pinned staging the CUDA upload holds meanwhile
  // (kMinLoadStagingBytes.. half of the host's available memory).
  int load_threads = 0;
  int64_t load_staging_bytes = int64_t{256} << 20;
  // ReadTensor into a device region (issue 23; docs/architecture.md "ReadTensor into a device
  // region"): pinned staging per GPU, kept from the first such call, read by load_threads
  // threads; 0 = none (one thread reads and copies each 16 MiB piece in, as before), else
  // kMinLoadStagingBytes.. half of the host's available memory. CUDA backend only.
  int64_t read_staging_bytes = int64_t{64} << 20;
  // Stored tensors read into a device region also kept in that GPU's memory, up to this many
  // bytes per GPU (first come; later calls copy them device to device); 0 = none (the default:
  // see docs/architecture.md for why). >= 0; non-zero needs read_staging_bytes > 0 and the CUDA
  // backend (else INVALID_ARGUMENT). Not counted in --device-memory-limit.
  int64_t resident_stored_bytes = 0;
  // Set (by main's signal watcher) when a shutdown signal arrives during the load: Start stops
  // reading and returns CANCELLED. May be null.
  const std::atomic<bool>* cancel_load = nullptr;
  // Failure injection for tests (DEQUANTD_INJECT_DEVICE_FAILURE,
  // server/backend/failure_injection.h).
  std::string inject_device_failures;
  int64_t max_request_bytes = int64_t{256} << 20;  // inline packed bytes accepted per request;
                                                   // 1..kMaxRequestBytesLimit
  int64_t max_output_bytes = int64_t{16} << 30;    // largest result of one tensor (bytes)
  int64_t default_chunk_bytes = int64_t{1} << 20;  // streamed payload per message
  std::string tune_cache;                          // autotune cache file; empty = default location
  bool pretune = false;  // tune every layer of the model at start-up; CUDA: also build the
                         // whole model's grouped fp16 plan (DequantizeLayers)
  double shutdown_deadline_seconds = 5.0;  // what main passes to Shutdown on SIGINT/SIGTERM;
                                           // 0..86400 (NaN refused)
  auth::SecurityOptions security;  // TLS, tokens, reflection, health-only port (README Security)
  // Most Dequantize + DequantizeLayers streams served at once; past it RESOURCE_EXHAUSTED.
  // 0..kMaxConcurrentStreamsLimit; 0 = no limit.
  int max_concurrent_streams = 0;
  // Shared-memory regions (issue 9; docs/architecture.md "Shared-memory regions").
  std::string shared_memory = "off";   // off, host, cuda or all: the region kinds clients may
                                       // register (off by default: see the docs)
  int shared_memory_max_regions = 64;  // regions at once, 0..100000
  int64_t shared_memory_max_bytes = int64_t{64} << 30;  // their total bytes, >= 0
  double shared_memory_idle_release_seconds = 0;        // release unused regions after this long,
                                                        // seconds, 0..31536000; 0 = never
  // Abuse limits (docs/hardening.md).
  TransportLimits transport;                  // compression, gRPC memory/thread quota, streams
  double stall_timeout_seconds = 60.0;        // cancel a result write blocked this long; 0 = never;
                                              // 0..86400
  double malloc_trim_interval_seconds = 2.0;  // how often freed heap memory is given back to
                                              // the OS (server/memory_trim.h); 0 = never; 0..3600
};

class DequantServer {
 public:
  // Loads the model, initializes the backend (uploads the model to the GPUs), starts gRPC (with
  // health checking, reflection unless security.reflection is off, TLS and tokens as
  // configured) and metrics. Errors: server/auth/server_security.h's (INVALID_ARGUMENT naming
  // the --tls-* / --auth-tokens flag and file), the checkpoint's (NOT_FOUND,
  // INVALID_ARGUMENT, DATA_LOSS), INVALID_ARGUMENT naming the option (bad option, e.g. backend
  // "gpu", max_request_bytes above kMaxRequestBytesLimit, shutdown_deadline_seconds NaN or out
  // of 0..86400, metrics_listen equal to listen), FAILED_PRECONDITION (backend "cuda" without a
  // GPU), UNAVAILABLE (cannot bind), the backend's.
  static absl::StatusOr<std::unique_ptr<DequantServer>> Start(const ServerOptions& options);
  virtual ~DequantServer() = default;

  virtual int port() const = 0;                  // bound gRPC port (1 for a unix: socket)
  virtual int metrics_port() const = 0;          // bound metrics port, 0 if disabled
  virtual int health_port() const = 0;           // bound --health-listen port, 0 if none
  virtual std::string backend_name() const = 0;  // "cuda" or "cpu"
  // The device(s) computing, for logs: e.g. "NVIDIA H200 (sm_90)", "2 x NVIDIA H200 (sm_90)",
  // or the CPU model name with its thread count.
  virtual std::string device_description() const = 0;
  virtual int layer_count() const = 0;  // quantized layers of the loaded model; 0 without one
  // Stops accepting calls, finishes in-flight ones (cancelling those still running after
  // `deadline_seconds`), stops /metrics. Idempotent; thread-safe. The destructor calls it.
  virtual void Shutdown(double deadline_seconds = 5.0) = 0;
  // Blocks until Shutdown has finished.
  virtual void Wait() = 0;
};

}  // namespace dequantd
