// DequantServer::Start and the running server (see server.h).
#include "server/server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <future>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "formats/tune_store.h"
#include "kernels/autotune.h"
#include "measure/memory_budget.h"
#include "server/auth/server_security.h"
#include "server/backend/backend.h"
#include "server/backend/device_placement.h"
#include "server/backend/failure_injection.h"
#include "server/backend/pretune.h"
#include "server/drain.h"
#include "server/listen_probe.h"
#include "server/memory_trim.h"
#include "server/metrics/metrics.h"
#include "server/model/checkpoint.h"
#include "server/model/startup_timeline.h"
#include "server/rpc/benchmark_service.h"
#include "server/rpc/grpc_log.h"
#include "server/rpc/protobuf_errors.h"
#include "server/rpc/region_service.h"
#include "server/rpc/service.h"
#include "server/rpc/stall_watchdog.h"
#include "server/rpc/transport_limits.h"
#include "spdlog/spdlog.h"
#if DEQUANTD_HAVE_CUDA
#include "server/backend/cuda/cuda_autotune.h"
#include "server/backend/cuda/device_context.h"
#include "server/backend/cuda/staged_tensor_copier.h"
#endif

namespace dequantd {

const char kDequantdVersion[] = DEQUANTD_VERSION;

namespace {
constexpr int64_t kReceiveHeadroomBytes = int64_t{1} << 20;
}  // namespace

// The largest max_request_bytes is the one whose receive limit is exactly INT_MAX.
static_assert(kMaxRequestBytesLimit + kMaxRequestBytesLimit / 16 + kReceiveHeadroomBytes ==
              INT_MAX);

int GrpcReceiveLimitBytes(int64_t max_request_bytes) {
  // Saturating: values beyond INT_MAX give INT_MAX before any sum can overflow.
  if (max_request_bytes > INT_MAX) return INT_MAX;
  const int64_t bytes = std::max<int64_t>(0, max_request_bytes);
  return static_cast<int>(std::min<int64_t>(bytes + bytes / 16 + kReceiveHeadroomBytes, INT_MAX));
}

namespace {

// The backend options for `options` (the autotuner's provider is set by Start).
BackendOptions MakeBackendOptions(const ServerOptions& options) {
  BackendOptions backend;
  backend.kind = options.backend;
  backend.cpu_threads = options.cpu_threads;
  return backend;
}

std::string DescribeDevices(const BackendInfo& info) {
  if (info.devices.empty()) return info.name;
  const DeviceDescription& first = info.devices.front();
  std::string text = first.name;
  if (info.name == "cpu") {
    absl::StrAppend(&text, " (", info.cpu_threads, " threads)");
  } else if (!first.compute_capability.empty()) {
    std::string sm = first.compute_capability;
    sm.erase(std::remove(sm.begin(), sm.end(), '.'), sm.end());
    absl::StrAppend(&text, " (sm_", sm, ")");
  }
  if (info.devices.size() > 1) text = absl::StrCat(info.devices.size(), " x ", text);
  return text;
}

// The load (docs/architecture.md "Loading"): the backend uploads what its devices hold straight
// from the files (Prepare), then the layers no device holds get host copies (all of them on the
// CPU backend). Logs what was read, where, and how fast. CANCELLED when options.cancel_load.
absl::Status LoadModel(Checkpoint& checkpoint, Backend& backend, const ServerOptions& options,
                       StartupTimeline& timeline) {
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status s = backend.Prepare(checkpoint); !s.ok()) return s;
  const auto uploaded = std::chrono::steady_clock::now();
  timeline.Add("model to the devices", start, uploaded);
  const std::string upload_profile = backend.DescribeLoad();
  std::vector<bool> host(checkpoint.layers().size());
  int64_t device_bytes = 0;
  for (size_t i = 0; i < host.size(); ++i) {
    host[i] = !backend.IsResident(checkpoint.layers()[i]);
    if (!host[i]) device_bytes += checkpoint.layers()[i].view.shape.packed_bytes();
  }
  // Copies read at Open (a format whose stored values are checked there) are freed where a
  // device holds the layer.
  std::vector<bool> resident(host.size());
  for (size_t i = 0; i < host.size(); ++i) resident[i] = !host[i];
  checkpoint.ReleaseHostCopies(resident);
  absl::StatusOr<int64_t> host_bytes =
      checkpoint.ReadHostCopies(host, options.load_threads, options.cancel_load);
  if (!host_bytes.ok()) return host_bytes.status();
  const auto done = std::chrono::steady_clock::now();
  timeline.Add("host copies", uploaded, done);
  const auto rate = [](int64_t bytes, std::chrono::steady_clock::duration d) {
    const double s = std::chrono::duration<double>(d).count();
    return s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0.0;
  };
  spdlog::info(
      "loaded {} layers: {} MB packed to the devices in {:.2f} s ({:.2f} GB/s), {} MB into host "
      "copies in {:.2f} s ({:.2f} GB/s){}{}",
      checkpoint.layers().size(), device_bytes >> 20,
      std::chrono::duration<double>(uploaded - start).count(), rate(device_bytes, uploaded - start),
      *host_bytes >> 20, std::chrono::duration<double>(done - uploaded).count(),
      rate(*host_bytes, done - uploaded), upload_profile.empty() ? "" : "; ", upload_profile);
  const BackendInfo info = backend.Info();
  int64_t host_layers = 0;
  int64_t host_only_bytes = 0;
  for (size_t i = 0; i < host.size(); ++i) {
    if (!host[i]) continue;
    ++host_layers;
    host_only_bytes += checkpoint.layers()[i].view.shape.packed_bytes();
  }
  if (info.name == "cuda" && host_layers > 0) {
    std::string held;
    for (const DeviceDescription& d : info.devices) {
      absl::StrAppend(&held, held.empty() ? "" : ", ", d.label, " ", d.resident_layers, " layers (",
                      d.resident_bytes >> 20, " MB)");
    }
    spdlog::warn(
        "{} of {} layers ({} MB packed) do not fit on the GPUs ({}; --device-memory-limit={}): "
        "they are served from host memory, staged to a GPU per call",
        host_layers, checkpoint.layers().size(), host_only_bytes >> 20, held,
        options.device_memory_limit_bytes);
  }
  return absl::OkStatus();
}

// Largest --shutdown-deadline accepted (a day): far beyond any drain, far below overflow.
constexpr double kMaxShutdownDeadlineSeconds = 86400;

// Largest --cpu-threads accepted: far above any host's cores, far below the thread limit.
constexpr int kMaxCpuThreads = 1024;

// --listen's prefix for a Unix domain socket (gRPC's own target syntax): unix:PATH.
constexpr absl::string_view kUnixPrefix = "unix:";

// OK when `address` is HOST:PORT (IPv6 hosts in brackets: [::1]:PORT) with PORT an integer in
// 0..65535; otherwise INVALID_ARGUMENT naming `option`.
absl::Status CheckHostPort(const char* option, const std::string& address) {
  const auto invalid = [&](const char* why) {
    return absl::InvalidArgumentError(
        absl::StrCat(option, " must be HOST:PORT with PORT in 0..65535 (IPv6: [ADDR]:PORT), got \"",
                     address, "\": ", why));
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return invalid("no port");
  const std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.empty()) return invalid("no host");
  const bool bracketed = host.front() == '[';
  if (bracketed && (host.size() < 3 || host.back() != ']')) return invalid("bad IPv6 host");
  if (!bracketed && host.find(':') != std::string::npos) {
    return invalid("an IPv6 host must be in brackets");
  }
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      std::stoi(port) > 65535) {
    return invalid("bad port");
  }
  return absl::OkStatus();
}

absl::Status CheckSharedMemoryOptions(const ServerOptions& options) {
  if (absl::StatusOr<SharedMemoryMode> mode = ParseSharedMemoryMode(options.shared_memory);
      !mode.ok()) {
    return mode.status();
  }
  if (options.shared_memory_max_regions < 0 || options.shared_memory_max_regions > 100000) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared_memory_max_regions (--shared-memory-max-regions) must be in "
                     "0..100000, got ",
                     options.shared_memory_max_regions));
  }
  if (options.shared_memory_max_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared_memory_max_bytes (--shared-memory-max-bytes) must be >= 0, got ",
                     options.shared_memory_max_bytes));
  }
  if (!(options.shared_memory_idle_release_seconds >= 0 &&
        options.shared_memory_idle_release_seconds <= 31536000)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared_memory_idle_release (--shared-memory-idle-release) must be a number of seconds "
        "in 0..31536000, got ",
        options.shared_memory_idle_release_seconds));
  }
  return absl::OkStatus();
}

// The abuse-limit options (their own block; see docs/hardening.md).
absl::Status CheckAbuseLimits(const ServerOptions& options) {
  if (absl::Status s = CheckTransportLimits(options.transport); !s.ok()) return s;
  if (!(options.stall_timeout_seconds >= 0 &&
        options.stall_timeout_seconds <= kMaxShutdownDeadlineSeconds)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stall-timeout must be a number of seconds in 0..",
                     kMaxShutdownDeadlineSeconds, ", got ", options.stall_timeout_seconds));
  }
  if (!(options.malloc_trim_interval_seconds >= 0 &&
        options.malloc_trim_interval_seconds <= 3600)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--malloc-trim-interval must be a number of seconds in 0..3600, got ",
                     options.malloc_trim_interval_seconds));
  }
  return absl::OkStatus();
}

// The RegionService for the options and the backend (device regions on the backend's GPUs;
// host regions pinned when the backend is CUDA).
std::unique_ptr<RegionService> MakeRegionService(const ServerOptions& options,
                                                 const BackendInfo& backend, Metrics* metrics) {
  RegionServiceOptions region_options;
  region_options.mode = *ParseSharedMemoryMode(options.shared_memory);  // checked by CheckOptions
  region_options.limits.max_regions = options.shared_memory_max_regions;
  region_options.limits.max_bytes = options.shared_memory_max_bytes;
  region_options.idle_release_seconds = options.shared_memory_idle_release_seconds;
  region_options.pin_host_regions = backend.name == "cuda";
  if (backend.name == "cuda") {
    for (const DeviceDescription& device : backend.devices) {
      region_options.cuda_devices.push_back(device.index);
    }
  }
  return std::make_unique<RegionService>(std::move(region_options), metrics);
}

// --devices (syntax here; the ordinals against the GPUs when the CUDA backend starts),
// --placement and DEQUANTD_INJECT_DEVICE_FAILURE.
absl::Status CheckDeviceOptions(const ServerOptions& options) {
  if (options.devices != "all") {  // "all" lists every GPU: nothing to check before they are known
    if (absl::StatusOr<std::vector<int>> devices =
            ParseDeviceList(options.devices, std::numeric_limits<int>::max());
        !devices.ok()) {
      return devices.status();
    }
  }
  if (options.backend == "cpu" && options.devices != "all") {
    return absl::InvalidArgumentError(
        absl::StrCat("--devices=", options.devices, " names CUDA devices but --backend is cpu"));
  }
  if (absl::StatusOr<PlacementMode> mode = ParsePlacementMode(options.placement); !mode.ok()) {
    return mode.status();
  }
  if (options.backend == "cpu" && options.placement != "auto") {
    return absl::InvalidArgumentError(absl::StrCat("--placement=", options.placement,
                                                   " places layers on GPUs but --backend is cpu"));
  }
  if (options.device_memory_limit_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device-memory-limit must be 0 (no limit) or a number of bytes, got ",
                     options.device_memory_limit_bytes));
  }
  if (options.backend == "cpu" && options.device_memory_limit_bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device-memory-limit=", options.device_memory_limit_bytes,
                     " limits GPU memory but --backend is cpu"));
  }
  return ParseDeviceFailureInjection(options.inject_device_failures).status();
}

absl::Status CheckOptions(const ServerOptions& options) {
  if (absl::Status s = CheckAbuseLimits(options); !s.ok()) return s;
  if (options.max_request_bytes <= 0 || options.max_request_bytes > kMaxRequestBytesLimit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_request_bytes (--max-request-bytes) must be in 1..", kMaxRequestBytesLimit,
        " (gRPC's largest message is ", INT_MAX,
        " bytes, less room for the request's other fields), got ", options.max_request_bytes));
  }
  if (options.load_threads < 0 || options.load_threads > kMaxLoadThreads) {
    return absl::InvalidArgumentError(absl::StrCat("load_threads (--load-threads) must be in 0..",
                                                   kMaxLoadThreads,
                                                   " (0 = min(16, hardware "
                                                   "threads)), got ",
                                                   options.load_threads));
  }
  if (options.load_staging_bytes < kMinLoadStagingBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "load_staging_bytes (--load-staging-bytes) must be at least ", kMinLoadStagingBytes,
        " (two 1 MiB buffers), got ", options.load_staging_bytes));
  }
  if (const int64_t budget = bench::HostMemoryBudget(0);
      budget > 0 && options.load_staging_bytes > budget) {
    return absl::ResourceExhaustedError(
        absl::StrCat("load_staging_bytes (--load-staging-bytes) = ", options.load_staging_bytes,
                     " bytes of pinned staging is more than half of this host's available memory (",
                     budget, " bytes): ask for less"));
  }
  if (options.resident_stored_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resident_stored_bytes (--resident-stored-bytes) must be 0 (none) or a number of bytes, "
        "got ",
        options.resident_stored_bytes));
  }
  if (options.resident_stored_bytes > 0 && options.read_staging_bytes == 0) {
    return absl::InvalidArgumentError(
        "--resident-stored-bytes keeps tensors read through the staging, but "
        "--read-staging-bytes=0 turns it off");
  }
  if (options.backend == "cpu" && options.resident_stored_bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--resident-stored-bytes=", options.resident_stored_bytes,
                     " keeps tensors in GPU memory but --backend is cpu"));
  }
  if (options.read_staging_bytes != 0 && options.read_staging_bytes < kMinLoadStagingBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "read_staging_bytes (--read-staging-bytes) must be 0 or at least ", kMinLoadStagingBytes,
        " (two 1 MiB buffers), got ", options.read_staging_bytes));
  }
  if (const int64_t budget = bench::HostMemoryBudget(0);
      budget > 0 && options.read_staging_bytes > budget) {
    return absl::ResourceExhaustedError(
        absl::StrCat("read_staging_bytes (--read-staging-bytes) = ", options.read_staging_bytes,
                     " bytes of pinned staging is more than half of this host's available memory (",
                     budget, " bytes): ask for less"));
  }
  if (options.max_output_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_output_bytes (--max-output-bytes) must be positive, got ", options.max_output_bytes));
  }
  if (options.default_chunk_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("default_chunk_bytes must be positive, got ", options.default_chunk_bytes));
  }
  if (options.cpu_threads < 0 || options.cpu_threads > kMaxCpuThreads) {
    return absl::InvalidArgumentError(absl::StrCat("cpu_threads (--cpu-threads) must be in 0..",
                                                   kMaxCpuThreads, ", got ", options.cpu_threads));
  }
  // NaN fails both comparisons; infinity and values whose deadline would overflow the clock
  // fail the upper bound.
  if (!(options.shutdown_deadline_seconds >= 0 &&
        options.shutdown_deadline_seconds <= kMaxShutdownDeadlineSeconds)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shutdown_deadline (--shutdown-deadline) must be a number of seconds in 0..",
                     kMaxShutdownDeadlineSeconds, ", got ", options.shutdown_deadline_seconds));
  }
  if (absl::Status s = CheckSharedMemoryOptions(options); !s.ok()) return s;
  if (absl::Status s = CheckDeviceOptions(options); !s.ok()) return s;
  if (options.listen.empty()) {
    return absl::InvalidArgumentError("listen (--listen) must not be empty");
  }
  if (options.max_concurrent_streams < 0 ||
      options.max_concurrent_streams > kMaxConcurrentStreamsLimit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_concurrent_streams (--max-concurrent-streams) must be in 0..",
        kMaxConcurrentStreamsLimit, " (0 = no limit), got ", options.max_concurrent_streams));
  }
  if (absl::StartsWith(options.listen, kUnixPrefix)) {
    if (options.listen.size() == kUnixPrefix.size()) {
      return absl::InvalidArgumentError("listen (--listen) unix: needs a path, e.g. unix:/run/dq");
    }
  } else if (absl::Status s = CheckHostPort("listen (--listen)", options.listen); !s.ok()) {
    return s;
  }
  if (!options.metrics_listen.empty()) {
    if (absl::Status s = CheckHostPort("metrics_listen (--metrics-listen)", options.metrics_listen);
        !s.ok()) {
      return s;
    }
    // The same address twice (port 0 excepted: each bind picks its own free port) would fail
    // later with an unhelpful "cannot bind".
    if (options.metrics_listen == options.listen &&
        options.listen.substr(options.listen.rfind(':') + 1) != "0") {
      return absl::InvalidArgumentError(absl::StrCat(
          "listen (--listen) and metrics_listen (--metrics-listen) conflict: both are \"",
          options.listen,
          "\"; give /metrics another port (or --metrics-listen= to "
          "disable it)"));
    }
  }
  if (!options.security.health_listen.empty()) {
    if (absl::Status s =
            CheckHostPort("health_listen (--health-listen)", options.security.health_listen);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// Logs and counts what server/auth/ reports: reloads, refused reloads, refused calls. Tokens are
// never in these messages (server/auth/ never puts them there).
auth::SecurityObserver MakeSecurityObserver(Metrics* metrics) {
  auth::SecurityObserver observer;
  observer.on_tls_served = [metrics](const auth::TlsMaterial& m) {
    spdlog::info("tls: serving certificate {} serial {} valid until {} (unix seconds)", m.subject,
                 m.serial_hex, m.not_after_unix);
    metrics->SetTlsCertificateExpiry(m.not_after_unix);
  };
  observer.on_tls_reload_error = [metrics](const absl::Status& s) {
    spdlog::error(
        "tls: the changed files were refused, the previous certificate is still "
        "served: {}",
        s.ToString());
    metrics->AddTlsReloadError();
  };
  observer.on_tokens_loaded = [metrics](size_t tokens) {
    spdlog::info("auth: {} token(s) loaded", tokens);
    metrics->SetAuthTokens(static_cast<int64_t>(tokens));
  };
  observer.on_tokens_reload_error = [metrics](const absl::Status& s) {
    spdlog::error("auth: the changed token file was refused, the previous tokens stay: {}",
                  s.ToString());
    metrics->AddAuthTokensReloadError();
  };
  observer.on_call_denied = [metrics](grpc::StatusCode code) {
    metrics->AddAuthDenied(static_cast<int>(code));
  };
  return observer;
}

// One start-up line saying what is protected and what is open.
void LogSecurity(const ServerOptions& options, int port, const auth::ServerSecurity& security) {
  const auth::SecurityOptions& s = options.security;
  // HOST:0 asked for a free port: name the one bound.
  const std::string listen =
      absl::EndsWith(options.listen, ":0") && !absl::StartsWith(options.listen, "unix:")
          ? absl::StrCat(options.listen.substr(0, options.listen.size() - 1), port)
          : options.listen;
  spdlog::info("security: {} on {}; tokens {}; reflection {}; health-only port {}",
               !security.tls()           ? "plaintext"
               : s.tls_client_ca.empty() ? "TLS"
                                         : "mutual TLS",
               listen, security.tokens() ? absl::StrCat("required (", s.auth_tokens, ")") : "off",
               s.reflection ? (security.tokens() ? "on (reader)" : "on") : "off",
               s.health_listen.empty() ? "none" : s.health_listen);
  if (!security.tls() && !security.tokens() && !auth::IsLoopbackOrUnix(options.listen)) {
    spdlog::warn(
        "security: {} is plaintext and needs no token: anyone who reaches it can read "
        "every weight and run Benchmark (README.md, Security)",
        listen);
  }
}

// The reason gRPC could not listen on `listen`, as a probe bind finds it.
std::string ListenFailure(const std::string& listen) {
  std::string why = WhyCannotListen(listen);
  return why.empty() ? "gRPC refused it, but a plain bind there succeeds now (a race with another "
                       "process, or a transport gRPC does not support?)"
                     : why;
}

// UNAVAILABLE naming --listen, or --health-listen, and why it cannot be served.
absl::Status ListenError(const std::string& listen, const std::string& why) {
  return absl::UnavailableError(
      absl::StrCat("listen (--listen) \"", listen, "\": cannot serve gRPC there: ", why));
}
absl::Status HealthListenError(const std::string& health_listen, const std::string& why) {
  return absl::UnavailableError(
      absl::StrCat("--health-listen \"", health_listen, "\": cannot serve there: ", why));
}

// UNAVAILABLE naming the flag when --listen or --health-listen cannot be served now, as the
// probes find it: checked before the model loads (minutes for a large checkpoint), so that a port
// in use or a missing socket directory costs no load. BuildAndStart still reports an address
// taken during the load.
absl::Status CheckListenAddresses(const ServerOptions& options) {
  if (std::string in_use = UnixSocketInUse(options.listen); !in_use.empty()) {
    return ListenError(options.listen, in_use);
  }
  // An address family the host lacks ("[::]:PORT" without IPv6) is left to gRPC, which falls
  // back to IPv4 for a wildcard host.
  const auto cannot = [](const std::string& listen) {
    std::string why = listen.empty() ? "" : WhyCannotListen(listen);
    return why == std::strerror(EAFNOSUPPORT) ? std::string() : why;
  };
  if (std::string why = cannot(options.listen); !why.empty()) {
    return ListenError(options.listen, why);
  }
  const std::string& health = options.security.health_listen;
  if (std::string why = cannot(health); !why.empty()) {
    return HealthListenError(health, why);
  }
  return absl::OkStatus();
}

#if DEQUANTD_HAVE_CUDA
// Whether CreateBackend will create the CUDA backend for `kind` (with no GPU it refuses "cuda"
// with FAILED_PRECONDITION and picks the CPU for "auto").
bool WillUseCuda(const std::string& kind) {
  return (kind == "cuda" || kind == "auto") && CudaDeviceCount() > 0;
}

// The server's autotuner on its cache file (--tune-cache, else the default location), with the
// start-up log lines: where the file is, how many entries it held, and why it was ignored.
std::unique_ptr<Autotuner> StartAutotuner(const ServerOptions& options,
                                          AutotuneObserver* observer) {
  const std::string path = formats::ResolveTuneFilePath(options.tune_cache);
  if (absl::Status s = formats::CreateTuneFileDirectory(path); !s.ok()) {
    spdlog::warn("autotune: {} (tunings will be kept in memory only)", s.ToString());
  }
  std::unique_ptr<TuneStore> store;
  if (!path.empty()) store = std::make_unique<formats::TuneFile>(path);
  auto tuner = std::make_unique<Autotuner>(std::move(store), observer);
  if (!tuner->load_warning().ok()) {
    spdlog::warn("autotune: the tune cache was ignored and will be rewritten: {}",
                 tuner->load_warning().ToString());
  }
  spdlog::info("autotune: {} tuned configurations loaded from {}", tuner->counters().entries,
               path.empty() ? "(no cache file: $XDG_CACHE_HOME and $HOME are unset)" : path);
  return tuner;
}

// --pretune: tunes every distinct layer shape of the model for fp16 output before serving.
void PretuneModel(Autotuner& tuner, cuda::KernelVariant variant,
                  const std::vector<TuneDevice>& devices, const Checkpoint* checkpoint) {
  if (checkpoint == nullptr) {
    spdlog::info("--pretune: no model is loaded, nothing to tune");
    return;
  }
  const std::vector<QuantShape> shapes = DistinctLayerShapes(checkpoint->layers());
  const DType out_dtypes[] = {DType::kF16};
  const PretuneReport report = PretuneCuda(tuner, variant, devices, shapes, out_dtypes);
  spdlog::info(
      "--pretune: {} distinct layer shapes x fp16 on {} GPU(s): {} tuned, {} already cached, {} "
      "with nothing to tune, {} failed, in {:.2f} s",
      shapes.size(), devices.size(), report.tuned, report.cached, report.untunable, report.failed,
      report.wall_seconds);
  if (!report.first_error.ok()) {
    spdlog::warn("--pretune: first failure: {}", report.first_error.ToString());
  }
}
#endif

// The running server; also the autotuner's observer: logs each tuning and forwards every event to
// the metrics.
class RunningServer final : public DequantServer, private AutotuneObserver {
 public:
  ~RunningServer() override { Shutdown(5.0); }

  int port() const override { return port_; }
  int metrics_port() const override { return metrics_port_; }
  int health_port() const override { return health_port_; }
  std::string backend_name() const override { return backend_info_.name; }
  std::string device_description() const override { return DescribeDevices(backend_info_); }
  int layer_count() const override {
    return checkpoint_ != nullptr ? static_cast<int>(checkpoint_->layers().size()) : 0;
  }

  void Shutdown(double deadline_seconds) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (shutting_down_) {
      done_cv_.wait(lock, [this] { return shut_down_; });
      return;
    }
    shutting_down_ = true;
    lock.unlock();
    if (server_ != nullptr) {
      const auto deadline = std::chrono::system_clock::now() +
                            std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                std::chrono::duration<double>(std::max(0.0, deadline_seconds)));
      DrainBeforeShutdown(deadline_seconds);
      server_->Shutdown(deadline);  // returns when every handler has returned
      server_->Wait();
    }
    if (autotuner_ != nullptr) {
      const AutotuneCounters c = autotuner_->counters();
      spdlog::info(
          "autotune: {} cache hits, {} misses, {} tunings ({} failed), {} entries in {}", c.hits,
          c.misses, c.tunings, c.tune_failures, c.entries,
          autotuner_->store_description().empty() ? "memory" : autotuner_->store_description());
    }
    regions_.reset();   // no call writes into a region any more; its idle thread reports metrics
    security_.reset();  // stops the TLS/token file watchers, which report into metrics_
    metrics_.reset();   // stops the HTTP endpoint; no handler or tuning uses it any more
    lock.lock();
    shut_down_ = true;
    done_cv_.notify_all();
  }

  void Wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return shut_down_; });
  }

 private:
  // Before gRPC's Shutdown (which sends GOAWAY and closes each connection as soon as its last
  // stream ends): health NOT_SERVING, then wait for in-flight calls and for every connection's
  // send queue to empty, so no stream loses its tail to a TCP reset (server/drain.h).
  void DrainBeforeShutdown(double deadline_seconds) {
    if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
      health->SetServingStatus(false);
    }
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(std::max(0.0, deadline_seconds)));
    if (WaitForDrain(call_tracker_, port_, deadline)) {
      // Time for the clients' last acknowledgements and WINDOW_UPDATEs to arrive before close.
      std::this_thread::sleep_until(
          std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(200)));
    }
  }

  friend absl::StatusOr<std::unique_ptr<DequantServer>> DequantServer::Start(
      const ServerOptions& options);

  // AutotuneObserver: called by autotuner_ (requests, --pretune, Benchmark RPCs), all of which
  // end before Shutdown resets metrics_.
  void ObserveLookup(bool hit) override {
    if (metrics_ != nullptr) metrics_->ObserveLookup(hit);
  }
  void ObserveEntries(size_t entries) override {
    if (metrics_ != nullptr) metrics_->ObserveEntries(entries);
  }
  void ObserveTuning(const AutotuneTuning& t) override {
    if (t.result.ok()) {
      spdlog::info("autotune: tuned {} -> {} ({:.2f} us per launch) in {:.1f} ms ({} candidates)",
                   t.key.ToString(), t.result->config.ToString(), t.result->seconds * 1e6,
                   t.wall_seconds * 1e3, t.candidates);
    } else {
      spdlog::warn("autotune: tuning {} failed after {:.1f} ms: {}", t.key.ToString(),
                   t.wall_seconds * 1e3, t.result.status().ToString());
    }
    if (!t.save_status.ok()) {
      spdlog::warn("autotune: the cache file was not written (the entry is used from memory): {}",
                   t.save_status.ToString());
    }
    if (metrics_ != nullptr) metrics_->ObserveTuning(t);
  }

  // Destroyed in reverse order: gRPC first, the checkpoint last. The autotuner outlives the
  // backend, whose launch-config provider refers to it.
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<Autotuner> autotuner_;
  std::unique_ptr<Backend> backend_;
  BackendInfo backend_info_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<RegionService> regions_;
  std::unique_ptr<StoredTensorCopier> stored_copier_;  // null: none (CPU, --read-staging-bytes=0)
  std::unique_ptr<StallWatchdog> stall_watchdog_;      // null with --stall-timeout 0
  std::unique_ptr<MemoryTrimmer> memory_trimmer_;      // null with --malloc-trim-interval 0
  std::unique_ptr<DequantService> service_;
  // Shutdown destroys it once server_ has stopped, before metrics_ (which it reports to).
  std::unique_ptr<auth::ServerSecurity> security_;
  CallTracker call_tracker_;  // counts dequant.v1 calls for the drain; outlives server_
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  int metrics_port_ = 0;
  int health_port_ = 0;

  std::mutex mu_;
  std::condition_variable done_cv_;
  bool shutting_down_ = false;  // guarded by mu_
  bool shut_down_ = false;      // guarded by mu_
};

}  // namespace

absl::StatusOr<std::unique_ptr<DequantServer>> DequantServer::Start(const ServerOptions& options) {
  StartupTimeline timeline;
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  if (absl::Status s = CheckListenAddresses(options); !s.ok()) return s;
  auto server = std::make_unique<RunningServer>();

  // The checkpoint's headers are read and validated (indexed only: the backend reads what it
  // holds straight from the files in Prepare, host copies are read only for the layers no device
  // holds) on a thread of its own while CUDA starts below: neither needs the other until the
  // load. Its error, when it has one, is the one returned, as when it ran first.
  std::future<absl::StatusOr<std::unique_ptr<Checkpoint>>> opening;
  if (!options.model_dir.empty()) {
    opening = std::async(
        std::launch::async, [&options, &timeline]() -> absl::StatusOr<std::unique_ptr<Checkpoint>> {
          StartupTimeline::Phase phase(&timeline, "checkpoint headers");
          return Checkpoint::Open(
              options.model_dir,
              CheckpointLoad{.host_copies = false, .threads = options.load_threads});
        });
  }
  // The checkpoint's result, once: null when there is no model.
  absl::StatusOr<std::unique_ptr<Checkpoint>> opened = std::unique_ptr<Checkpoint>();
  const auto wait_checkpoint = [&]() -> absl::Status {
    if (opening.valid()) opened = opening.get();
    return opened.status();
  };
  // An error of the steps beside the checkpoint's opening, unless that failed first.
  const auto fail = [&](absl::Status s) -> absl::Status {
    if (absl::Status c = wait_checkpoint(); !c.ok()) return c;
    return s;
  };

  // Metrics first: the backend reports its stages, kernels and memory into them.
  StartupTimeline::Phase metrics_phase(&timeline, "metrics");
  absl::StatusOr<std::unique_ptr<Metrics>> metrics =
      Metrics::Create(options.metrics_listen, kDequantdVersion);
  if (!metrics.ok()) return fail(metrics.status());
  metrics_phase.End();
  server->metrics_ = std::move(*metrics);
  server->metrics_port_ = server->metrics_->port();

  BackendOptions backend_options = MakeBackendOptions(options);
  backend_options.observer = server->metrics_.get();
#if DEQUANTD_HAVE_CUDA
  std::vector<TuneDevice> tune_devices;
  StartupTimeline::Phase driver_phase(&timeline, "cuda driver");
  const bool use_cuda = WillUseCuda(options.backend);
  driver_phase.End();
  if (use_cuda) {
    StartupTimeline::Phase devices_phase(&timeline, "cuda devices");
    absl::StatusOr<std::vector<TuneDevice>> devices = ReadTuneDevices();
    if (!devices.ok()) return fail(devices.status());
    devices_phase.End();
    tune_devices = *devices;
    StartupTimeline::Phase tune_phase(&timeline, "tune cache");
    server->autotuner_ = StartAutotuner(options, server.get());
    tune_phase.End();
    backend_options.cuda.launch_config =
        MakeAutotuneLaunchConfigProvider(*server->autotuner_, tune_devices);
    // --pretune also builds the whole model's grouped fp16 plan (DequantizeLayers) in Prepare.
    backend_options.cuda.build_model_plan = options.pretune;
    backend_options.cuda.load =
        cuda::ShardUploadOptions{.threads = options.load_threads,
                                 .staging_bytes = options.load_staging_bytes,
                                 .cancel = options.cancel_load};
    absl::StatusOr<std::vector<int>> ordinals =
        ParseDeviceList(options.devices, static_cast<int>(tune_devices.size()));
    if (!ordinals.ok()) return fail(ordinals.status());
    backend_options.cuda.devices = *ordinals;
    backend_options.cuda.timeline = &timeline;
    StartupTimeline::Phase contexts_phase(&timeline, "cuda contexts");
    cuda::CreatePrimaryContexts(*ordinals);
    contexts_phase.End();
    backend_options.cuda.placement = *ParsePlacementMode(options.placement);
    backend_options.cuda.device_memory_limit_bytes = options.device_memory_limit_bytes;
    backend_options.cuda.inject_failures =
        *ParseDeviceFailureInjection(options.inject_device_failures);
    backend_options.cuda.on_device_failed = [](std::string_view device, std::string_view reason) {
      spdlog::error("device {} taken out of rotation: {}; calls go on on the other GPUs", device,
                    reason);
    };
  }
#endif
  StartupTimeline::Phase backend_phase(&timeline, "backend");
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(backend_options);
  if (!backend.ok()) return fail(backend.status());
  backend_phase.End();
  server->backend_ = std::move(*backend);
  server->backend_info_ = server->backend_->Info();
  if (server->backend_info_.name == "cpu" && options.devices != "all") {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "--devices=", options.devices, " names CUDA devices but the backend is cpu (no GPU)")));
  }
  if (server->backend_info_.name == "cpu" && options.placement != "auto") {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("--placement=", options.placement,
                     " places layers on GPUs but the backend is cpu (no GPU)")));
  }
  if (server->backend_info_.name == "cpu" && options.resident_stored_bytes != 0) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("--resident-stored-bytes=", options.resident_stored_bytes,
                     " keeps tensors in GPU memory but the backend is cpu (no GPU)")));
  }
  if (server->backend_info_.name == "cpu" && options.device_memory_limit_bytes != 0) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("--device-memory-limit=", options.device_memory_limit_bytes,
                     " limits GPU memory but the backend is cpu (no GPU)")));
  }
  server->metrics_->SetDevices(server->backend_info_);
  if (absl::Status s = wait_checkpoint(); !s.ok()) return s;
  server->checkpoint_ = std::move(*opened);
  if (server->checkpoint_ != nullptr) {
    if (absl::Status s = LoadModel(*server->checkpoint_, *server->backend_, options, timeline);
        !s.ok()) {
      return s;
    }
  }
  server->metrics_->SetModelLayers(server->layer_count());

  if (options.pretune) {
    StartupTimeline::Phase pretune_phase(&timeline, "pretune");
#if DEQUANTD_HAVE_CUDA
    if (server->autotuner_ != nullptr) {
      PretuneModel(*server->autotuner_, backend_options.cuda.variant, tune_devices,
                   server->checkpoint_.get());
    }
#endif
    if (server->autotuner_ == nullptr) {
      spdlog::info("--pretune: nothing to tune on the {} backend", server->backend_info_.name);
    }
  }

  ServiceOptions service_options;
  service_options.version = kDequantdVersion;
  service_options.max_request_bytes = options.max_request_bytes;
  service_options.max_output_bytes = options.max_output_bytes;
  service_options.default_chunk_bytes = options.default_chunk_bytes;
  service_options.autotuner = server->autotuner_.get();
  service_options.max_concurrent_streams = options.max_concurrent_streams;
  server->regions_ = MakeRegionService(options, server->backend_info_, server->metrics_.get());
  service_options.regions = server->regions_.get();
#if DEQUANTD_HAVE_CUDA
  if (server->backend_info_.name == "cuda" && options.read_staging_bytes > 0) {
    server->stored_copier_ = cuda::MakeStagedTensorCopier(
        options.load_threads > 0 ? options.load_threads : DefaultLoadThreads(),
        options.read_staging_bytes, options.resident_stored_bytes);
    service_options.stored_copier = server->stored_copier_.get();
  }
#endif
  if (options.stall_timeout_seconds > 0) {
    Metrics* metrics_for_stalls = server->metrics_.get();
    server->stall_watchdog_ = std::make_unique<StallWatchdog>(
        options.stall_timeout_seconds,
        [metrics_for_stalls] { metrics_for_stalls->AddStalledCall(); });
    service_options.stall_watchdog = server->stall_watchdog_.get();
  }
  if (options.malloc_trim_interval_seconds > 0) {
    server->memory_trimmer_ = std::make_unique<MemoryTrimmer>(options.malloc_trim_interval_seconds);
  }
  BenchmarkServiceOptions benchmark_options;
  benchmark_options.backend = server->backend_info_.name;
  benchmark_options.cpu_threads = options.cpu_threads;
  benchmark_options.max_output_bytes = options.max_output_bytes;
  benchmark_options.checkpoint = server->checkpoint_.get();
  benchmark_options.autotuner = server->autotuner_.get();
  server->service_ = std::make_unique<DequantService>(
      service_options, server->checkpoint_.get(), server->backend_.get(), server->metrics_.get(),
      MakeBenchmarkRunner(std::move(benchmark_options)));

  absl::StatusOr<std::unique_ptr<auth::ServerSecurity>> security = auth::ServerSecurity::Create(
      options.security, options.listen, MakeSecurityObserver(server->metrics_.get()));
  if (!security.ok()) return security.status();
  server->security_ = std::move(*security);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // gRPC enables SO_REUSEPORT by default on Linux: a second server on the same port would start
  // and split the traffic. A port in use must be an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  server->security_->AddTo(builder, options.listen, &server->port_, &server->health_port_);
  builder.SetMaxReceiveMessageSize(GrpcReceiveLimitBytes(options.max_request_bytes));
  ApplyTransportLimits(options.transport, builder);
  InstallProtobufLogHandler();
  InstallGrpcLogHandler();
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(MakeMalformedRequestInterceptorFactory(server->metrics_.get()));
  interceptors.push_back(server->call_tracker_.MakeInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.RegisterService(server->service_.get());
  // gRPC unlinks whatever socket file is at a unix: path, live or stale: a second dequantd
  // would take a running one's clients without a word.
  if (std::string in_use = UnixSocketInUse(options.listen); !in_use.empty()) {
    return ListenError(options.listen, in_use);
  }
  StartupTimeline::Phase listener_phase(&timeline, "grpc listener");
  server->server_ = builder.BuildAndStart();
  listener_phase.End();
  if (server->server_ == nullptr || server->port_ == 0) {
    server->server_.reset();
    // Every port fails together: name the one that cannot be bound.
    if (!options.security.health_listen.empty() && WhyCannotListen(options.listen).empty() &&
        !WhyCannotListen(options.security.health_listen).empty()) {
      return HealthListenError(options.security.health_listen,
                               ListenFailure(options.security.health_listen));
    }
    return ListenError(options.listen, ListenFailure(options.listen));
  }
  if (!options.security.health_listen.empty() && server->health_port_ == 0) {
    return HealthListenError(options.security.health_listen,
                             ListenFailure(options.security.health_listen));
  }
  LogSecurity(options, server->port_, *server->security_);
  timeline.Add("ready", std::chrono::steady_clock::now(), std::chrono::steady_clock::now());
  spdlog::info("startup phases (seconds since exec): {}", timeline.Describe());
  return server;
}

}  // namespace dequantd
