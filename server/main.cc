// dequantd: serves dequant.v1 (AWQ 4-bit dequantization) over gRPC, with /metrics over HTTP.
// Flags -> ServerOptions -> DequantServer::Start; SIGINT/SIGTERM/SIGHUP shut it down gracefully.
//
// Exit codes (also in --help):
//   0  stopped after a graceful shutdown, or --help / --version answered
//   1  could not start (bad option value, missing model, port in use, ...)
//   2  usage error: unknown flag, flag value that does not parse, positional argument
//   128+N  a second shutdown signal N (e.g. 130 for SIGINT) during the graceful shutdown ended
//      it at once, without waiting for in-flight calls
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <grpc/grpc.h>

#include "absl/flags/flag.h"
#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/backend/failure_injection.h"
#include "server/server.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, model, "models/smollm2-135m-awq",
          "checkpoint directory (config.json + *.safetensors; its quantization_config names the "
          "format). The default is the bundled "
          "model, made by scripts/make-model.sh; --model= starts with no model (inline requests "
          "only)");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "gRPC address HOST:PORT (port 0: pick a free one), or unix:PATH for a Unix domain "
          "socket (created with mode 0777 & ~umask; a client needs write permission on it: "
          "restrict it with the umask or the directory's permissions). Loopback by default: "
          "listen on 0.0.0.0 or a pod IP only with --tls-cert/--auth-tokens (README.md, Security)");
ABSL_FLAG(int, max_concurrent_streams, 0,
          "most Dequantize + DequantizeLayers streams served at once, 0..100000 (0 = no "
          "limit); a call past it gets RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "/metrics address HOST:PORT (port 0: pick a free one; empty: no metrics endpoint). "
          "Plain HTTP without authentication: keep it on loopback or a network only the "
          "scraper reaches");
ABSL_FLAG(std::string, backend, "auto", "auto (cuda when a GPU is present, else cpu), cpu or cuda");
ABSL_FLAG(int, cpu_threads, 0, "threads of the CPU backend, 0..1024; 0 = hardware concurrency");
ABSL_FLAG(std::string, devices, "all",
          "CUDA devices that serve: all, or a comma list of ordinals (e.g. 0,2); the model is "
          "resident on each when it fits, else its layers are split over them (--placement)");
ABSL_FLAG(std::string, placement, "auto",
          "auto (the whole model on every GPU when it fits, else split), replicated or split "
          "(layers split over the GPUs by bytes, contiguous in checkpoint order)");
ABSL_FLAG(int64_t, device_memory_limit, 0,
          "CUDA backend: the packed weights each GPU keeps resident, bytes (0 = no limit: what "
          "fits beside the working reserve; at most the GPU's memory). Layers past it are served "
          "from host memory, staged to the GPU per call");
ABSL_FLAG(int, load_threads, 0,
          "threads that read the checkpoint's files at start and stored tensors for ReadTensor "
          "(0..256; 0 = min(16, hardware threads))");
ABSL_FLAG(int64_t, load_staging_bytes, int64_t{256} << 20,
          "CUDA backend: pinned host memory that stages the upload from the files to the GPUs, "
          "bytes (2 MiB.. half of the available memory; held during the load only): the packed "
          "model is never copied into host memory");
ABSL_FLAG(int64_t, read_staging_bytes, int64_t{64} << 20,
          "CUDA backend: pinned host memory per GPU that stages ReadTensor into a device region, "
          "bytes (kept from the first such call; read by --load-threads threads; 0 = one thread "
          "reads and copies each 16 MiB piece; else 2 MiB.. half of the available memory)");
ABSL_FLAG(int64_t, resident_stored_bytes, 0,
          "CUDA backend: device memory per GPU that keeps stored tensors (embeddings, lm_head) "
          "once read into a device region, so later reads copy them device to device, bytes "
          "(0 = none; needs --read-staging-bytes > 0; not counted in --device-memory-limit)");
ABSL_FLAG(int64_t, max_request_bytes, int64_t{256} << 20,
          "largest inline request accepted (qweight + qzeros + scales), bytes");
ABSL_FLAG(int64_t, max_output_bytes, int64_t{16} << 30,
          "largest result of one tensor (K * N * dtype size) served or benchmarked, bytes: a "
          "call holds buffers of about its largest result; a whole-model DequantizeLayers of any "
          "total size is served");
ABSL_FLAG(std::string, tune_cache, "",
          "CUDA backend: the autotuner's cache file (versioned JSON, shared safely between "
          "servers); empty = $XDG_CACHE_HOME/dequantd/tune_cache.json, else "
          "$HOME/.cache/dequantd/tune_cache.json. The CPU backend has nothing to tune and does "
          "not use it");
ABSL_FLAG(bool, pretune, false,
          "CUDA backend: before serving, tune the launch configuration of every distinct layer "
          "shape of the model (fp16 output) that the cache does not hold yet, instead of on the "
          "first request for it. The CPU backend has nothing to tune");
ABSL_FLAG(double, shutdown_deadline, 5.0,
          "seconds (0..86400) in-flight calls get to finish on SIGINT/SIGTERM/SIGHUP before "
          "they are cancelled; a second signal ends dequantd at once");

// Security (server/auth/; README.md, Security).
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain (server certificate first): serve gRPC over TLS; reloaded when "
          "the file changes (see --credentials-refresh-seconds)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert; reloaded with it");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA certificate(s): mutual TLS, clients must present a certificate it verifies");
ABSL_FLAG(std::string, auth_tokens, "",
          "file of 'ROLE TOKEN' lines (ROLE reader or admin, '#' comments): every RPC but "
          "health needs 'authorization: Bearer TOKEN'; reloaded when the file changes");
ABSL_FLAG(bool, allow_insecure_tokens, false,
          "allow --auth-tokens over plaintext on a --listen that is not loopback or a Unix "
          "socket (tokens can then be read on the network)");
ABSL_FLAG(std::string, reflection, "on",
          "on|off: serve gRPC server reflection (grpcurl); with --auth-tokens it needs a reader "
          "or admin token");
ABSL_FLAG(std::string, health_listen, "",
          "HOST:PORT of a plaintext port serving only grpc.health.v1 without a token (for "
          "Kubernetes probes); empty: none");
ABSL_FLAG(int, credentials_refresh_seconds, 5,
          "seconds (1..3600) between checks of the --tls-* and --auth-tokens files for changes");
// Shared-memory regions (issue 9; docs/architecture.md "Shared-memory regions").
ABSL_FLAG(std::string, shared_memory, "off",
          "off, host, cuda or all: which shared-memory regions same-host clients may register "
          "and name as Dequantize outputs (host: POSIX shm under /dev/shm; cuda: CUDA IPC device "
          "buffers). Off by default: a region makes dequantd write into memory at a client's "
          "request, with dequantd's own permissions");
ABSL_FLAG(int, shared_memory_max_regions, 64, "most regions registered at once, 0..100000");
ABSL_FLAG(int64_t, shared_memory_max_bytes, int64_t{64} << 30,
          "most bytes of all registered regions together");
ABSL_FLAG(double, shared_memory_idle_release, 0,
          "seconds (0..31536000) after which a region no call has used is released (a client "
          "that died without unregistering); 0 = regions live until unregistered or dequantd "
          "stops");
// Abuse limits (docs/hardening.md).
ABSL_FLAG(double, stall_timeout, 60.0,
          "seconds (0..86400) a result write may wait for a client that stopped reading, and a "
          "Dequantize/DequantizeLayers call for its request, before the call is cancelled "
          "(counted in dequantd_stalled_calls_cancelled_total); 0 = never");
ABSL_FLAG(bool, accept_compressed_requests, false,
          "accept gzip/deflate-compressed requests (gRPC inflates them up to --max-request-bytes "
          "before any check of ours); default false: refused (UNIMPLEMENTED) when their headers "
          "arrive, before anything is inflated (docs/hardening.md)");
ABSL_FLAG(int64_t, grpc_memory_quota_bytes, int64_t{1} << 30,
          "gRPC ResourceQuota for transport buffers, bytes (1 MiB..1 TiB)");
ABSL_FLAG(int, max_threads, 256,
          "gRPC server threads (4..4096), about the most calls served at once; more get "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(double, malloc_trim_interval, 2.0,
          "seconds (0..3600) between checks that give freed heap memory back to the OS "
          "(malloc_trim when over 32 MiB is free); 0 = never");
ABSL_FLAG(int, max_streams_per_connection, 64,
          "HTTP/2 concurrent streams per client connection (1..65536)");

namespace {

constexpr int kUsageErrorExitCode = 2;

// True while absl parses the command line. absl reports a usage error (unknown flag, value that
// does not parse, missing value) on stderr, then calls std::exit(1); ExitWithUsageErrorCode,
// registered with atexit, turns that exit into kUsageErrorExitCode like dequantd's own usage
// errors. --help and --version do not exit there (they are handled after parsing).
std::atomic<bool> parsing_flags{false};

void ExitWithUsageErrorCode() {
  if (!parsing_flags.load()) return;
  std::fputs("dequantd: see dequantd --help\n", stderr);
  std::fflush(nullptr);
  std::_Exit(kUsageErrorExitCode);
}

// "0.0.0.0:0" with bound port 41234 -> "0.0.0.0:41234".
std::string WithPort(const std::string& address, int port) {
  if (absl::StartsWith(address, "unix:")) return address;  // a socket path has no port
  const size_t colon = address.rfind(':');
  return absl::StrCat(colon == std::string::npos ? address : address.substr(0, colon), ":", port);
}

// Flags may be spelled with dashes (--metrics-listen) as well as underscores (--metrics_listen):
// rewrites the name part of every "--flag[=value]" argument before "--" to underscores.
std::vector<char*> NormalizeFlagNames(int argc, char** argv, std::vector<std::string>& storage) {
  storage.assign(argv, argv + argc);
  for (size_t i = 1; i < storage.size(); ++i) {
    std::string& arg = storage[i];
    if (arg == "--") break;
    if (arg.size() < 3 || arg[0] != '-') continue;
    const size_t name_begin = arg[1] == '-' ? 2 : 1;
    const size_t name_end = std::min(arg.find('='), arg.size());
    for (size_t j = name_begin; j < name_end; ++j) {
      if (arg[j] == '-') arg[j] = '_';
    }
  }
  std::vector<char*> result;
  for (std::string& arg : storage) result.push_back(arg.data());
  return result;
}

// The security flags into `security`. INVALID_ARGUMENT for a --reflection other than on/off.
absl::Status ReadSecurityFlags(dequantd::auth::SecurityOptions& security) {
  security.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  security.tls_key = absl::GetFlag(FLAGS_tls_key);
  security.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  security.auth_tokens = absl::GetFlag(FLAGS_auth_tokens);
  security.allow_insecure_tokens = absl::GetFlag(FLAGS_allow_insecure_tokens);
  security.health_listen = absl::GetFlag(FLAGS_health_listen);
  security.refresh_seconds = absl::GetFlag(FLAGS_credentials_refresh_seconds);
  const std::string reflection = absl::GetFlag(FLAGS_reflection);
  if (reflection != "on" && reflection != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--reflection must be on or off, got \"", reflection, "\""));
  }
  security.reflection = reflection == "on";
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  // Block the shutdown signals first: one that comes while the flags are read waits for the
  // watchers below (a clean stop) instead of killing the process without a word; and before any
  // thread starts, so that every gRPC and HTTP thread inherits the mask and only the sigwait
  // calls below receive them. SIGHUP (the terminal or the session went away) shuts down like
  // SIGTERM, unless it was ignored when dequantd started (nohup): blocked, an ignored signal
  // would still reach sigwait, so it is left out.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  if (struct sigaction hup{}; sigaction(SIGHUP, nullptr, &hup) == 0 && hup.sa_handler != SIG_IGN) {
    sigaddset(&signals, SIGHUP);
  }
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::SetProgramUsageMessage(
      "serves dequantized weights of quantized checkpoints (AWQ, GPTQ, compressed-tensors, FP8 "
      "block, MXFP4) over gRPC, on the GPU (or the CPU).\n"
      "usage: dequantd [--model DIR] [--listen HOST:PORT|unix:PATH] [--metrics-listen HOST:PORT] "
      "[--backend auto|cpu|cuda] [--devices all|LIST]\n"
      "SIGINT, SIGTERM or SIGHUP: graceful shutdown (--shutdown-deadline); a second one: exit "
      "at once.\n"
      "exit codes: 0 stopped or --help/--version, 1 cannot start (including a flag value that "
      "parses but is out of range, e.g. --max-threads=-1), 2 usage error (unknown flag, a value "
      "that does not parse, positional argument), 128+N a second signal N ended the shutdown");
  absl::FlagsUsageConfig usage_config;
  // absl's --help names each flag's source file (the build's absolute path) and lists only flags
  // of files named like the program (dequantd.cc; main.cc is not): this file's flags are listed,
  // under "dequantd".
  usage_config.normalize_filename = [](absl::string_view file) {
    return absl::EndsWith(file, "server/main.cc") ? std::string("dequantd") : std::string(file);
  };
  const auto is_this_file = [](absl::string_view file) { return file == "dequantd"; };
  usage_config.contains_help_flags = is_this_file;
  usage_config.contains_helpshort_flags = is_this_file;
  usage_config.version_string = [] {
    return absl::StrCat("dequantd ", dequantd::kDequantdVersion, "\n");
  };
  absl::SetFlagsUsageConfig(usage_config);
  std::vector<std::string> arg_storage;
  std::vector<char*> args = NormalizeFlagNames(argc, argv, arg_storage);
  std::atexit(ExitWithUsageErrorCode);
  parsing_flags = true;
  const std::vector<char*> positional = absl::flags_internal::ParseCommandLineImpl(
      static_cast<int>(args.size()), args.data(),
      absl::flags_internal::ArgvListAction::kRemoveParsedArgs,
      absl::flags_internal::UsageFlagsAction::kIgnoreUsage,
      absl::flags_internal::OnUndefinedFlag::kAbortIfUndefined);
  parsing_flags = false;
  // --help, --helpfull, --version, ...: absl prints the answer and returns 1 after help, 0 after
  // --version; help that was asked for is not an error.
  if (absl::flags_internal::HandleUsageFlags(std::cout, absl::ProgramUsageMessage()) != -1) {
    return 0;
  }
  if (positional.size() > 1) {  // positional[0] is the program name
    const std::string arg = positional[1];
    const bool looks_like_path =
        arg.find('/') != std::string::npos || std::filesystem::is_directory(arg);
    std::fprintf(stderr, "dequantd: unexpected argument '%s' (%s)\n%s\n", arg.c_str(),
                 looks_like_path ? absl::StrCat("did you mean --model=", arg, "?").c_str()
                                 : "dequantd takes only flags; see --help",
                 std::string(absl::ProgramUsageMessage()).c_str());
    return kUsageErrorExitCode;
  }

  // The process holds its own gRPC library reference, never released. Otherwise the server's
  // destructor runs the last grpc_shutdown, which joins gRPC's executor threads; after a write to
  // a client that stopped reading had blocked, one of them sits in tcp_posix's backup poller
  // (grpc_pollset_work with a 10 s deadline), and the process lingered up to 10 s after
  // "dequantd stopped". With this reference the destructor only drops its own, our state is
  // still stopped and destroyed in order, and exit ends gRPC's threads (docs/architecture.md).
  // After the signal mask: the threads gRPC starts here inherit it.
  grpc_init();

  dequantd::ServerOptions options;
  options.model_dir = absl::GetFlag(FLAGS_model);
  options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.backend = absl::GetFlag(FLAGS_backend);
  options.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  options.devices = absl::GetFlag(FLAGS_devices);
  options.placement = absl::GetFlag(FLAGS_placement);
  options.device_memory_limit_bytes = absl::GetFlag(FLAGS_device_memory_limit);
  options.load_threads = absl::GetFlag(FLAGS_load_threads);
  options.load_staging_bytes = absl::GetFlag(FLAGS_load_staging_bytes);
  options.read_staging_bytes = absl::GetFlag(FLAGS_read_staging_bytes);
  options.resident_stored_bytes = absl::GetFlag(FLAGS_resident_stored_bytes);
  // Tests only (server/backend/failure_injection.h): make chosen GPUs fail at start or at a launch.
  if (const char* inject = std::getenv(std::string(dequantd::kInjectDeviceFailureEnv).c_str());
      inject != nullptr) {
    options.inject_device_failures = inject;
  }
  options.max_request_bytes = absl::GetFlag(FLAGS_max_request_bytes);
  options.max_output_bytes = absl::GetFlag(FLAGS_max_output_bytes);
  options.tune_cache = absl::GetFlag(FLAGS_tune_cache);
  options.pretune = absl::GetFlag(FLAGS_pretune);
  options.shutdown_deadline_seconds = absl::GetFlag(FLAGS_shutdown_deadline);
  if (absl::Status s = ReadSecurityFlags(options.security); !s.ok()) {
    std::fprintf(stderr, "dequantd: %s\n", std::string(s.message()).c_str());
    return kUsageErrorExitCode;
  }
  options.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  options.shared_memory = absl::GetFlag(FLAGS_shared_memory);
  options.shared_memory_max_regions = absl::GetFlag(FLAGS_shared_memory_max_regions);
  options.shared_memory_max_bytes = absl::GetFlag(FLAGS_shared_memory_max_bytes);
  options.shared_memory_idle_release_seconds = absl::GetFlag(FLAGS_shared_memory_idle_release);
  // Abuse limits.
  options.stall_timeout_seconds = absl::GetFlag(FLAGS_stall_timeout);
  options.malloc_trim_interval_seconds = absl::GetFlag(FLAGS_malloc_trim_interval);
  options.transport.accept_compressed_requests = absl::GetFlag(FLAGS_accept_compressed_requests);
  options.transport.memory_quota_bytes = absl::GetFlag(FLAGS_grpc_memory_quota_bytes);
  options.transport.max_threads = absl::GetFlag(FLAGS_max_threads);
  options.transport.max_streams_per_connection = absl::GetFlag(FLAGS_max_streams_per_connection);

  if (options.model_dir.empty()) {
    spdlog::warn("no model loaded (--model is empty): only inline Dequantize requests are served");
  } else if (std::error_code ec; !std::filesystem::exists(options.model_dir, ec)) {
    // Only a missing path gets this hint; a path that is not a directory reaches
    // Checkpoint::Open, which says so (INVALID_ARGUMENT "checkpoint 'X' is not a directory").
    spdlog::error(
        "model directory \"{}\" does not exist. Run scripts/make-model.sh to make the bundled "
        "model, pass --model=DIR, or --model= to start without a model",
        options.model_dir);
    return 1;
  }

  // A shutdown signal during the load (tens of seconds for a large model) stops it: a watcher
  // waits for one until Start returns, and the loader checks the flag between chunks.
  std::atomic<bool> loading{true};
  std::atomic<bool> cancel_load{false};
  std::atomic<int> load_signal{0};
  options.cancel_load = &cancel_load;
  std::thread load_watcher([&] {
    const timespec tick{.tv_sec = 0, .tv_nsec = 50'000'000};
    while (loading.load()) {
      const int got = sigtimedwait(&signals, nullptr, &tick);
      if (got > 0) {
        load_signal.store(got);
        cancel_load.store(true);
        return;
      }
    }
  });
  absl::StatusOr<std::unique_ptr<dequantd::DequantServer>> server =
      dequantd::DequantServer::Start(options);
  loading.store(false);
  load_watcher.join();
  if (load_signal.load() != 0) {
    const int got = load_signal.load();
    spdlog::info("signal {} (SIG{}) received while starting: stopped{}", got, sigabbrev_np(got),
                 server.ok() ? "" : absl::StrCat(" (", server.status().ToString(), ")"));
    if (server.ok()) (*server)->Shutdown(0);
    spdlog::info("dequantd stopped");
    return 0;
  }
  if (!server.ok()) {
    spdlog::error("dequantd cannot start: {}", server.status().ToString());
    return 1;
  }
  spdlog::info("dequantd {} listening on {} backend={} device={} model={} layers={}",
               dequantd::kDequantdVersion, WithPort(options.listen, (*server)->port()),
               (*server)->backend_name(), (*server)->device_description(),
               options.model_dir.empty() ? "(none)" : options.model_dir, (*server)->layer_count());
  if ((*server)->metrics_port() != 0) {
    spdlog::info("metrics on http://{}/metrics",
                 WithPort(options.metrics_listen, (*server)->metrics_port()));
  }
  if ((*server)->health_port() != 0) {
    spdlog::info("health-only gRPC (plaintext) on {}",
                 WithPort(options.security.health_listen, (*server)->health_port()));
  }

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  spdlog::info(
      "signal {} (SIG{}) received: shutting down (in-flight calls get {} s; a second signal "
      "exits at once)",
      signal_number, sigabbrev_np(signal_number), options.shutdown_deadline_seconds);
  // A second signal during the graceful shutdown (an operator who does not want to wait for the
  // deadline) ends the process at once, with 128 + its number as a shell reports a process
  // killed by it. Detached: it stays blocked in sigwait when the shutdown finishes first.
  std::thread([signals] {
    int second = 0;
    sigwait(&signals, &second);
    spdlog::warn("second signal: exiting now (signal {} (SIG{}), exit code {})", second,
                 sigabbrev_np(second), 128 + second);
    spdlog::default_logger()->flush();
    std::_Exit(128 + second);
  }).detach();
  (*server)->Shutdown(options.shutdown_deadline_seconds);
  spdlog::info("dequantd stopped");
  return 0;
}
