// dequantctl: the command-line client of dequantd.
//   dequantctl [--server HOST:PORT] list | info | regions | dequantize ... |
//              dequantize-layers ... | benchmark ...
// Flags may be spelled with '-' or '_' (--group-size == --group_size); a flag that does not apply
// to the subcommand (client/flag_scope.h) is a usage error. Exit status: 0 on
// success, 2 for a usage error, 1 when the call (or local file I/O) fails. Errors are one line
// on stderr: "dequantctl: <CODE>: <message>".
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "client/address_rotation.h"
#include "client/client.h"
#include "client/commands.h"
#include "client/flag_scope.h"
#include "client/progress.h"
#include "client/temp_file_guard.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051",
          "dequantd address, HOST:PORT, or a gRPC target that may resolve to several replicas "
          "(ipv4:A:P,B:P,... or dns:///NAME:PORT), or unix:PATH");
ABSL_FLAG(std::string, lb, "",
          "load balancing over the addresses --server resolves to: pick_first (gRPC's default: "
          "all calls to one) or round_robin (each call to the next ready one; with an ipv4:/ipv6: "
          "list, each dequantctl process and --streams connection to the next address)");
ABSL_FLAG(double, deadline, 0, "per-call deadline in seconds, > 0; not given = none");
// Security (client/credentials.h; README.md, Security).
ABSL_FLAG(std::string, tls_ca, "", "PEM CA that verifies the server's certificate: use TLS");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate chain for mutual TLS (with --tls-key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "name to verify in the server's certificate (default: the host of --server)");
ABSL_FLAG(std::string, token_file, "",
          "file whose first line is the bearer token to send; default: $DEQUANTD_TOKEN if set");
ABSL_FLAG(std::string, tensor, "", "dequantize: a layer of the loaded model (see `list`)");
ABSL_FLAG(std::string, packed, "",
          "dequantize: safetensors file with PREFIX<role> for every role of its format");
ABSL_FLAG(std::string, prefix, "", "dequantize --packed: tensor name prefix, e.g. 'layer.'");
ABSL_FLAG(std::string, format, "",
          "dequantize --packed: the format (awq_gemm, gptq, compressed_tensors, fp8_block, "
          "compressed_tensors_fp8, mxfp4) when no config is found; default: the config's, else "
          "awq_gemm");
ABSL_FLAG(std::string, config, "",
          "dequantize --packed: the checkpoint's config.json (its quantization_config); default: "
          "FILE's <name>.config.json or config.json beside it, if there");
ABSL_FLAG(int64_t, group_size, 0,
          "dequantize --packed: group size, checked against the file's (0 = from the shapes); "
          "benchmark: G (0 = 128)");
ABSL_FLAG(std::string, out, "",
          "dequantize: output file: *.npy, *.safetensors or raw bytes; - = raw bytes to standard "
          "output; empty = not written");
ABSL_FLAG(std::string, dtype, "",
          "output dtype: fp16 (default), bf16 or fp32; benchmark: comma-separated list");
ABSL_FLAG(std::string, orientation, "",
          "dequantize, dequantize-layers: result layout kn ((K, N)) or nk ((N, K), nn.Linear."
          "weight), written by the server's kernel; empty = the format's own (awq_gemm kn, gptq "
          "nk)");
ABSL_FLAG(int64_t, chunk_bytes, 0, "dequantize: bytes per response message; 0 = server default");
ABSL_FLAG(std::string, compare, "",
          "dequantize: REF.safetensors[:TENSOR] or REF.npy to compare the result with (error "
          "stats)");
ABSL_FLAG(std::string, compare_layout, "auto",
          "dequantize --compare: reference layout: auto, kn ((K, N)) or nk ((N, K), nn.Linear)");
ABSL_FLAG(std::string, shm, "",
          "dequantize: receive the result through a POSIX shared-memory region NAME (created, "
          "registered, read and removed by dequantctl) instead of the stream; the server must "
          "run on this host with --shared-memory=host or all");
ABSL_FLAG(std::string, shapes, "", "benchmark: comma-separated KxN shapes");
ABSL_FLAG(std::string, tensors, "",
          "benchmark, dequantize-layers: comma-separated layers of the loaded model");
ABSL_FLAG(std::string, out_dir, "",
          "dequantize-layers: directory for one <layer>.npy per layer (made, with missing parents, "
          "when the call succeeds)");
ABSL_FLAG(std::string, variants, "", "benchmark: comma-separated variants; empty = all");
ABSL_FLAG(int32_t, trials, 0, "benchmark: trials; 0 = server default");
ABSL_FLAG(int32_t, runs, 0, "benchmark: runs per trial; 0 = server default");
ABSL_FLAG(bool, hardware_counters, false, "benchmark: collect hardware counters");
ABSL_FLAG(int32_t, streams, 0,
          "dequantize: parallel byte-range streams on separate connections, 1..64 (default: 1 "
          "below 64 MB of result, else 4); dequantize-layers: parallel calls over subsets of "
          "the layers, 1..64 (default 1)");

namespace {

// Where a command's report goes: stderr when its output file is this process's standard output
// (--out /dev/stdout, or the file stdout is redirected to), so that no line of it lands among the
// result's bytes; stdout otherwise.
std::ostream& ReportStream(const std::string& out) {
  struct stat out_stat {};
  struct stat stdout_stat {};
  if (!out.empty() && ::stat(out.c_str(), &out_stat) == 0 &&
      ::fstat(STDOUT_FILENO, &stdout_stat) == 0 && out_stat.st_dev == stdout_stat.st_dev &&
      out_stat.st_ino == stdout_stat.st_ino) {
    return std::cerr;
  }
  return std::cout;
}

constexpr int kExitCallFailed = 1;
constexpr int kExitUsage = 2;
// The longest --deadline (about 11.6 days): keeps now() + deadline far from overflowing.
constexpr int kMaxDeadlineSeconds = 1000000;

constexpr char kUsage[] = R"(dequantctl: client of the dequantd dequantization service
(AWQ, GPTQ, compressed-tensors, FP8 block and MXFP4 checkpoints).

usage:
  dequantctl [--server HOST:PORT] list
  dequantctl [--server HOST:PORT] info
  dequantctl [--server HOST:PORT] regions     the server's shared-memory regions (admin role)
  dequantctl [--server HOST:PORT] dequantize --tensor LAYER [--out FILE] [--dtype fp16|bf16|fp32]
  dequantctl [--server HOST:PORT] dequantize --packed FILE.safetensors --prefix PREFIX
             [--config CONFIG.json] [--format F] [--group-size G] [--out FILE] [--dtype ...]
      [--orientation kn|nk]
      [--compare REF.safetensors[:TENSOR]|REF.npy [--compare-layout auto|kn|nk]]
      [--chunk-bytes B] [--streams S] [--shm NAME]
      --streams: S byte ranges fetched at once on S connections and written in place (default:
        1 below 64 MB, else 4; not with --compare or a .safetensors/device --out); a broken
        range stream is resumed from its last byte (4 times at most)
      --shm NAME: the result comes through a shared-memory region NAME (same host; the server
        runs with --shared-memory=host|all) instead of the stream (--streams does not apply)
      --packed: PREFIX<role> for every role of the format (awq_gemm: qweight, qzeros, scales;
        mxfp4: PREFIX ends in '_': blocks, scales), sent inline; the format and its
        quantization_config come from --config, else FILE's <name>.config.json or config.json
        beside it, as the server reads a checkpoint's (--format names it when there is none;
        gptq needs the config); a layer the request cannot carry is refused, naming why
      --group-size: with --packed, the layer's group size (0, the default: from the tensors'
        shapes; a value they contradict is refused, naming both)
      --orientation: the result's layout, kn = (K, N) or nk = (N, K) (nn.Linear.weight),
        written by the server's kernel; default: the format's own (awq_gemm kn; gptq and
        compressed_tensors nk)
      --compare-layout: the reference's: kn = (K, N), nk = (N, K) (nn.Linear.weight); auto
        tells them apart by shape and refuses a square reference (K == N)
      FILE: *.npy (NumPy; bf16 as raw <u2), *.safetensors, anything else = raw bytes; - (or
        /dev/stdout) = raw bytes to standard output, this report then on stderr; the
        .safetensors tensor is named LAYER, or PREFIX without its trailing separator ('.';
        mxfp4 '_'; "weight" if empty)
  dequantctl [--server HOST:PORT] dequantize-layers [--tensors L,...] [--dtype fp16|bf16|fp32]
             [--out-dir DIR | --out FILE.safetensors] [--chunk-bytes B] [--streams S]
             [--orientation kn|nk]
      --streams: S calls at once, each a share of the layers (by bytes), on S connections
      no --tensors: every layer of the model, in one call (one grouped launch on CUDA)
  dequantctl [--server HOST:PORT] benchmark [--shapes KxN,...] [--tensors L,...]
             [--group-size G] [--dtype fp16,...] [--variants V,...] [--trials T] [--runs R]
             [--hardware-counters]
      --hardware-counters: DRAM/cache counters per kernel row (CUDA build with CUPTI; replays)
every subcommand: --server HOST:PORT (default 127.0.0.1:50051), --deadline SECONDS (per call,
  > 0; default none), --lb pick_first|round_robin, --tls-ca FILE [--tls-cert FILE --tls-key FILE]
  [--tls-server-name NAME] (TLS, mutual TLS), --token-file FILE (else $DEQUANTD_TOKEN). A flag
  that does not apply to the subcommand is a usage error.
  --server also takes gRPC targets: ipv4:10.0.0.1:50051,10.0.0.2:50051 (several replicas),
  dns:///NAME:PORT (every address NAME resolves to, e.g. a Kubernetes headless Service),
  unix:PATH. With several addresses, --lb round_robin spreads the calls over them; with an
  ipv4:/ipv6: list each dequantctl process (and each --streams connection) goes to the address
  after the last process's (the others are its fallback), so one-shot calls from a script
  spread evenly too.
dequantize (results of 64 MiB and more) and dequantize-layers show a progress line (bytes, rate,
  time left) on stderr when stderr is a terminal; nothing otherwise.
exit status: 0 ok, 1 the call failed, 2 usage error)";

// While absl parses flags it may exit(1) on a bad value; make that a usage exit.
bool g_parsing_flags = false;
void ExitUsageIfParsing() {
  if (g_parsing_flags) ::_exit(kExitUsage);
}

int Fail(const absl::Status& status, int exit_code) {
  std::cerr << "dequantctl: " << absl::StatusCodeToString(status.code()) << ": "
            << absl::StrReplaceAll(status.message(), {{"\n", " "}}) << std::endl;
  return exit_code;
}

int UsageError(const std::string& message) {
  return Fail(absl::InvalidArgumentError(message + " (see dequantctl --help)"), kExitUsage);
}

// Rewrites "--group-size=4" as "--group_size=4" (and "--out -" as "--out=-") and checks that
// every flag exists, so an unknown flag is a one-line usage error; appends each flag's name
// ("group_size", "hardware_counters" for --nohardware-counters) to `specified`. Arguments after
// a bare "--" are left alone.
absl::Status NormalizeFlags(std::vector<std::string>* args, std::vector<std::string>* specified) {
  for (size_t i = 1; i < args->size(); ++i) {
    std::string& arg = (*args)[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-' || std::isdigit(static_cast<unsigned char>(arg[1]))) {
      continue;  // a positional argument or a negative number (a flag's value)
    }
    const size_t dashes = arg[1] == '-' ? 2 : 1;
    const size_t eq = arg.find('=');
    std::string name =
        arg.substr(dashes, eq == std::string::npos ? std::string::npos : eq - dashes);
    name = absl::StrReplaceAll(name, {{"-", "_"}});
    if (const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name); flag != nullptr) {
      specified->push_back(name);
      // "--out -": absl takes the value but warns that it looks like a flag; "--out=-" says the
      // same without the warning.
      if (eq == std::string::npos && i + 1 < args->size() && (*args)[i + 1] == "-" &&
          !flag->IsOfType<bool>()) {
        arg = absl::StrCat("--", name, "=-");
        args->erase(args->begin() + static_cast<std::ptrdiff_t>(i) + 1);
        continue;
      }
    } else if (absl::StartsWith(name, "no") &&
               absl::FindCommandLineFlag(name.substr(2)) != nullptr) {
      specified->push_back(name.substr(2));
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '", arg, "'"));
    }
    arg = absl::StrCat("--", name, eq == std::string::npos ? "" : arg.substr(eq));
  }
  return absl::OkStatus();
}

// --server: HOST:PORT or [IPV6]:PORT with a port in 1..65535, or a gRPC target with a scheme
// (unix:PATH, unix-abstract:NAME, dns:..., ipv4:..., ipv6:...) passed to gRPC as is.
absl::Status CheckServerAddress(absl::string_view target) {
  for (absl::string_view scheme : {"unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:"}) {
    if (absl::StartsWith(target, scheme) && target.size() > scheme.size()) {
      return absl::OkStatus();
    }
  }
  const size_t colon = target.rfind(':');
  bool valid = false;
  if (colon != absl::string_view::npos && colon > 0) {
    const absl::string_view host = target.substr(0, colon), port = target.substr(colon + 1);
    const bool host_ok = host.front() == '['
                             ? host.size() > 2 && host.back() == ']' &&
                                   host.find_first_of("[]", 1) == host.size() - 1
                             : host.find_first_of("[]: \t\n\r") == absl::string_view::npos;
    int port_number = 0;
    valid = host_ok && !port.empty() && port.size() <= 5 &&
            port.find_first_not_of("0123456789") == absl::string_view::npos &&
            absl::SimpleAtoi(port, &port_number) && port_number >= 1 && port_number <= 65535;
  }
  if (valid) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--server: '", target, "' must be HOST:PORT with a port in 1..65535 (or unix:PATH)"));
}

// True for `dequantctl help` (the subcommand position), and for --help or -h given as a flag
// anywhere before a bare "--" (`dequantctl dequantize --help`). A flag's value is not a request
// for help: in `--out help` or `--out-dir --help` the word is the file's name.
bool WantsHelp(const std::vector<std::string>& args) {
  bool subcommand_seen = false;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") break;
    if (arg == "--help" || arg == "-h") return true;
    if (arg.size() < 2 || arg[0] != '-' || std::isdigit(static_cast<unsigned char>(arg[1]))) {
      if (!subcommand_seen && arg == "help") return true;
      subcommand_seen = true;
      continue;
    }
    if (arg.find('=') != std::string::npos) continue;  // --flag=value
    // "--out VALUE": a flag other than a bool takes the next argument as its value (as absl
    // parses it).
    std::string name = absl::StrReplaceAll(arg.substr(arg[1] == '-' ? 2 : 1), {{"-", "_"}});
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag != nullptr && !flag->IsOfType<bool>()) ++i;
  }
  return false;
}

// Descriptors 0, 1 and 2 that the caller closed (`>&-`) are opened on /dev/null, so that no
// descriptor the process opens later (a file, gRPC's event descriptors) takes their number and
// receives what is meant for standard output. Returns whether standard output was closed.
bool OccupyClosedStandardDescriptors() {
  bool stdout_closed = false;
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    if (fd == STDOUT_FILENO) stdout_closed = true;
    // open() takes the lowest free number: `fd` itself, the ones below it being open by now.
    const int null_fd = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (null_fd >= 0 && null_fd != fd) {
      ::dup2(null_fd, fd);
      ::close(null_fd);
    }
  }
  return stdout_closed;
}

// --out - or /dev/stdout: refused when standard output was closed, or is a terminal (binary
// bytes on a screen; as gzip refuses). Empty when it is fine.
std::string StdoutOutputProblem(const std::string& out, bool stdout_closed) {
  if (out != "/dev/stdout") return "";
  if (stdout_closed) return "--out " + out + ": standard output is closed";
  if (::isatty(STDOUT_FILENO) == 1) {
    return "--out " + out +
           ": standard output is a terminal; redirect it to a file or a pipe for the result's "
           "bytes";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  const bool stdout_closed = OccupyClosedStandardDescriptors();
  dequantd::InstallTempFileSignalHandlers();  // INT/TERM/HUP/PIPE remove a half-written --out
  absl::SetProgramUsageMessage(kUsage);
  std::vector<std::string> args(argv, argv + argc);
  if (WantsHelp(args)) {
    std::cout << kUsage << '\n';
    return 0;
  }
  std::vector<std::string> specified;  // the flags given on the command line
  if (absl::Status s = NormalizeFlags(&args, &specified); !s.ok()) {
    return UsageError(std::string(s.message()));
  }
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::atexit(ExitUsageIfParsing);
  g_parsing_flags = true;
  const std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(args.size()), cargs.data());
  g_parsing_flags = false;

  if (positional.size() != 2) {
    return UsageError(positional.size() < 2
                          ? "missing subcommand: list, info, regions, dequantize, "
                            "dequantize-layers or benchmark"
                          : absl::StrCat("unexpected argument '", positional[2], "'"));
  }
  const std::string command = positional[1];
  if (absl::Status s = dequantd::CheckFlagsApply(command, specified); !s.ok()) {
    return UsageError(std::string(s.message()));
  }
  if (absl::Status s = CheckServerAddress(absl::GetFlag(FLAGS_server)); !s.ok()) {
    return UsageError(std::string(s.message()));
  }
  // A flag given an empty value is a value forgotten, not a flag left out: --out "" used to
  // discard the result with exit status 0, --orientation "" to mean the default.
  for (const char* name : {"out", "out_dir", "orientation", "tensor", "packed", "compare",
                           "compare_layout", "format", "config", "dtype"}) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag != nullptr && flag->CurrentValue().empty() &&
        std::find(specified.begin(), specified.end(), name) != specified.end()) {
      return UsageError(absl::StrCat("--", absl::StrReplaceAll(name, {{"_", "-"}}),
                                     " is empty: give a value, or leave the flag out"));
    }
  }
  if (std::find(specified.begin(), specified.end(), "compare_layout") != specified.end() &&
      absl::GetFlag(FLAGS_compare).empty()) {
    return UsageError("--compare-layout applies only with --compare REFERENCE");
  }
  const std::string lb = absl::GetFlag(FLAGS_lb);
  if (!lb.empty() && lb != "pick_first" && lb != "round_robin") {
    return UsageError(absl::StrCat("--lb must be pick_first or round_robin, got '", lb, "'"));
  }
  const double deadline = absl::GetFlag(FLAGS_deadline);
  if (std::find(specified.begin(), specified.end(), "deadline") != specified.end() &&
      !(deadline > 0 && deadline <= kMaxDeadlineSeconds)) {
    return UsageError(absl::StrCat("--deadline must be > 0 and <= ", kMaxDeadlineSeconds,
                                   " seconds, got ", deadline));
  }

  dequantd::DequantizeOptions dequantize;
  dequantd::DequantizeLayersOptions dequantize_layers;
  absl::StatusOr<dequantd::v1::BenchmarkRequest> benchmark;
  if (command == "dequantize") {
    dequantize.tensor = absl::GetFlag(FLAGS_tensor);
    dequantize.packed = absl::GetFlag(FLAGS_packed);
    dequantize.prefix = absl::GetFlag(FLAGS_prefix);
    dequantize.format = absl::GetFlag(FLAGS_format);
    dequantize.config = absl::GetFlag(FLAGS_config);
    dequantize.group_size = absl::GetFlag(FLAGS_group_size);
    if (dequantize.group_size < 0) {
      return UsageError(absl::StrCat("--group-size must be >= 0 (0 = from the shapes), got ",
                                     dequantize.group_size));
    }
    dequantize.out = absl::GetFlag(FLAGS_out);
    if (dequantize.out == "-") dequantize.out = "/dev/stdout";  // raw bytes, as /dev/stdout
    if (std::string problem = StdoutOutputProblem(dequantize.out, stdout_closed);
        !problem.empty()) {
      return UsageError(problem);
    }
    if (!absl::GetFlag(FLAGS_dtype).empty()) dequantize.dtype = absl::GetFlag(FLAGS_dtype);
    dequantize.orientation = absl::GetFlag(FLAGS_orientation);
    dequantize.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
    dequantize.compare = absl::GetFlag(FLAGS_compare);
    dequantize.compare_layout = absl::GetFlag(FLAGS_compare_layout);
    dequantize.streams = absl::GetFlag(FLAGS_streams);
    if (std::find(specified.begin(), specified.end(), "streams") != specified.end() &&
        dequantize.streams == 0) {
      return UsageError("--streams must be in 1..64 (leave it out to choose by size)");
    }
    dequantize.shm = absl::GetFlag(FLAGS_shm);
    if (dequantize.shm.empty() &&
        std::find(specified.begin(), specified.end(), "shm") != specified.end()) {
      return UsageError("--shm is empty: give a region name, or leave it out to use the stream");
    }
    dequantize.progress = dequantd::ProgressOutput::ForFd(STDERR_FILENO);
    if (absl::Status s = dequantd::CheckDequantizeOptions(dequantize); !s.ok()) {
      return UsageError(std::string(s.message()));
    }
  } else if (command == "dequantize-layers") {
    dequantize_layers.tensors = absl::GetFlag(FLAGS_tensors);
    if (dequantize_layers.tensors.empty() &&
        std::find(specified.begin(), specified.end(), "tensors") != specified.end()) {
      return UsageError("--tensors is empty; leave it out to dequantize every layer");
    }
    if (!absl::GetFlag(FLAGS_dtype).empty()) dequantize_layers.dtype = absl::GetFlag(FLAGS_dtype);
    dequantize_layers.orientation = absl::GetFlag(FLAGS_orientation);
    dequantize_layers.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
    dequantize_layers.out_dir = absl::GetFlag(FLAGS_out_dir);
    dequantize_layers.out = absl::GetFlag(FLAGS_out);
    if (std::find(specified.begin(), specified.end(), "streams") != specified.end()) {
      dequantize_layers.streams = absl::GetFlag(FLAGS_streams);
    }
    dequantize_layers.progress = dequantd::ProgressOutput::ForFd(STDERR_FILENO);
    if (absl::Status s = dequantd::CheckDequantizeLayersOptions(dequantize_layers); !s.ok()) {
      return UsageError(std::string(s.message()));
    }
  } else if (command == "benchmark") {
    dequantd::BenchmarkOptions options;
    options.shapes = absl::GetFlag(FLAGS_shapes);
    options.tensors = absl::GetFlag(FLAGS_tensors);
    options.group_size = absl::GetFlag(FLAGS_group_size);
    options.dtype = absl::GetFlag(FLAGS_dtype);
    options.variants = absl::GetFlag(FLAGS_variants);
    options.trials = absl::GetFlag(FLAGS_trials);
    options.runs = absl::GetFlag(FLAGS_runs);
    options.hardware_counters = absl::GetFlag(FLAGS_hardware_counters);
    benchmark = dequantd::MakeBenchmarkRequest(options);
    if (!benchmark.ok()) return UsageError(std::string(benchmark.status().message()));
  } else if (command != "list" && command != "info" && command != "regions") {
    return UsageError(
        absl::StrCat("unknown subcommand '", command,
                     "': expected list, info, regions, dequantize, dequantize-layers or "
                     "benchmark"));
  }

  dequantd::ClientOptions client_options;
  client_options.deadline_seconds = deadline;
  client_options.security.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  client_options.security.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  client_options.security.tls_key = absl::GetFlag(FLAGS_tls_key);
  client_options.security.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  absl::StatusOr<std::string> token = dequantd::ResolveToken(absl::GetFlag(FLAGS_token_file));
  if (!token.ok()) return UsageError(std::string(token.status().message()));
  client_options.security.token = std::move(*token);
  client_options.lb_policy = lb;
  // round_robin over an ipv4:/ipv6: list (address_rotation.h): each channel takes one address,
  // one further than the last dequantctl process's here (each --streams connection one further
  // again), as pick_first over the list rotated to start there; the others are its fallback.
  const std::string server = absl::GetFlag(FLAGS_server);
  uint64_t rotation = 0;
  if (lb == "round_robin" && dequantd::AddressCount(server) > 1) {
    rotation = dequantd::NextProcessRotation(dequantd::RotationKey(server, command));
    client_options.lb_policy = "pick_first";
  }
  absl::StatusOr<std::unique_ptr<dequantd::DequantClient>> client =
      dequantd::DequantClient::Connect(dequantd::RotateAddressList(server, rotation),
                                       client_options);
  if (!client.ok()) return UsageError(std::string(client.status().message()));

  // The parallel streams' clients: same server and options, each on its own connection.
  const dequantd::ClientFactory more = [&](int connection) {
    return dequantd::DequantClient::Connect(
        dequantd::RotateAddressList(server, rotation + static_cast<uint64_t>(connection)),
        client_options, connection);
  };
  absl::Status status;
  if (command == "list") {
    status = dequantd::RunList(**client, std::cout);
  } else if (command == "info") {
    status = dequantd::RunInfo(**client, std::cout);
  } else if (command == "regions") {
    status = dequantd::RunRegions(**client, std::cout);
  } else if (command == "dequantize") {
    status = dequantd::RunDequantize(**client, dequantize, ReportStream(dequantize.out), more);
  } else if (command == "dequantize-layers") {
    status = dequantd::RunDequantizeLayers(**client, dequantize_layers,
                                           ReportStream(dequantize_layers.out), more);
  } else {
    status = dequantd::RunBenchmark(**client, *benchmark, std::cout);
  }
  if (!status.ok()) {
    return Fail(dequantd::WithTlsMismatchHint(status, client_options.security.use_tls()),
                kExitCallFailed);
  }
  return 0;
}
