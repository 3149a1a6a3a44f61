// dequantd_e2e_bench: what a client gets, end to end, beside the ceilings measured in the same
// run on the same host (issue 8, part 1). Prints two tables:
//   ceilings  host memcpy; pinned device-to-host copy (with a GPU); a raw gRPC byte stream (a
//             minimal service inside this program, same chunk size and channel settings, no
//             computation) over TCP loopback and a Unix socket, 1 and S streams, C clients;
//   dequantd  a real dequantd process (spawned) on a synthetic checkpoint with one layer per
//             --sizes entry: resident layers over 1 and S streams, inline requests, C concurrent
//             clients; over TCP loopback and a Unix socket. The client receives every byte into
//             memory (ParallelClient::DequantizeInto, client/ranged_fetch.h).
// With --model_blocks, whole-model rows follow (model_rows.h): DequantizeLayers of a
// Llama-3-8B-shaped (or, --model_shape=llama-70b, 70B-shaped) model into the client's memory over
// S streams, the file system's write rate,
// and dequantctl's safetensors writing. Rows of --profile_min_mb or more carry a per-thread CPU
// profile of the server process and of this (client) process (thread_profile.h). The raw stream
// server runs in its own process (this program with --serve_raw), like dequantd.
// Each row: p50/p99 latency of one result, GB/s of output delivered (GB = 1e9 bytes; C clients:
// all bytes / wall time) and the fraction of the matching raw-gRPC ceiling (same transport,
// size, streams and clients). Every fetch's bytes are compared with the CPU reference (dequantd)
// or the served pattern (raw) once per row; --check exits 1 on any mismatch (the CI test).
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/e2e/clock.h"
#include "bench/e2e/dequantd_process.h"
#include "bench/e2e/device_copy.h"
#include "bench/e2e/model_rows.h"
#include "bench/e2e/raw_stream_service.h"
#include "bench/e2e/region_rows.h"
#include "bench/e2e/synthetic_model.h"
#include "bench/e2e/thread_profile.h"
#include "build_commit.h"
#include "client/client.h"
#include "client/ranged_fetch.h"
#include "kernels/dequant.h"

ABSL_FLAG(std::string, dequantd, dequantd::e2e::DefaultDequantdBinary(DEQUANTD_PATH),
          "the dequantd binary to run (default: $DEQUANTD when set, else the build's)");
ABSL_FLAG(std::string, backend, "auto", "dequantd --backend: auto, cpu or cuda");
ABSL_FLAG(std::string, sizes, "1,16,64",
          "layer output sizes, MB (1e6 bytes) of fp16, comma-separated (470 = 8192 x 28672)");
ABSL_FLAG(int, streams, 4, "S: parallel range streams (the multi-stream rows)");
ABSL_FLAG(int, clients, 4, "C: concurrent clients (one stream each)");
ABSL_FLAG(int, trials, 5, "timed fetches per row (per client), after one untimed warm-up");
ABSL_FLAG(int64_t, chunk_bytes, 0, "chunk_bytes of every request; 0 = the server default (1 MiB)");
ABSL_FLAG(bool, inline_requests, true, "also time inline requests (packed tensors sent along)");
ABSL_FLAG(bool, unix_socket, true, "also run dequantd and the raw stream on a Unix socket");
ABSL_FLAG(std::string, work_dir, "",
          "where the synthetic checkpoint and logs go; empty = a temp dir");
ABSL_FLAG(std::string, region_model, "none",
          "shared-memory region rows (issue 9, bench/e2e/region_rows.h): none, sizes (the --sizes "
          "checkpoint) or llama-8b (a generated 8B-shaped model and an 8192 x 28672 layer)");
ABSL_FLAG(std::string, region_transport, "unix",
          "region rows: how the client reaches dequantd, unix (a socket file; what a same-host "
          "client uses) or tcp (127.0.0.1)");
ABSL_FLAG(int64_t, region_busy_poll_us, dequantd::ClientOptions{}.region_busy_poll_us,
          "region rows: the client's ClientOptions::region_busy_poll_us (how long a region call's "
          "wait polls before it blocks), >= 0");
ABSL_FLAG(bool, region_rows_only, false,
          "with --region_model: run only the region rows (and the pinned device-to-host ceiling "
          "they are compared with), not the stream ceilings, stream rows and model rows");
ABSL_FLAG(double, profile_min_mb, 64,
          "rows of at least this many MB get a per-thread CPU profile (server and client)");
ABSL_FLAG(int, model_blocks, 0,
          "whole-model rows: blocks of the Llama-3-8B-shaped model (32 = 224 layers); 0 = none");
ABSL_FLAG(std::string, model_shape, "llama-8b",
          "whole-model rows: llama-8b (32 blocks = 224 layers, 14 GB of fp16: received into one "
          "buffer, file and dequantctl rows) or llama-70b (80 blocks = 560 layers, 137 GB of fp16: "
          "received into one reused buffer per stream, memory rows only)");
ABSL_FLAG(
    int, model_shrink, 1,
    "divide every dimension of the model's layers by this: 1 (the real shapes), 2, 4, 8 or 16");
ABSL_FLAG(std::string, model_streams, "",
          "S of the whole-model rows, comma-separated; "
          "empty = 1 and --streams");
ABSL_FLAG(int, model_trials, 2, "timed repetitions of each whole-model row");
ABSL_FLAG(std::string, model_out_dir, "",
          "where the file rows write (a tmpfs such as /dev/shm for the ceiling); empty = "
          "--work_dir");
ABSL_FLAG(std::string, device_memory_limit, "",
          "dequantd --device-memory-limit for the dequantd rows (models larger than the GPU, "
          "issue 22): empty = none, \"half\" = half of the checkpoint's packed bytes (the layers "
          "past it are served from host memory, staged per call), or a number of bytes");
ABSL_FLAG(std::string, serve_raw, "",
          "internal: serve the raw stream of --sizes on this address until killed");
ABSL_FLAG(std::string, raw_encoding, "zero_copy",
          "internal, with --serve_raw: zero_copy, one_copy or protobuf");
ABSL_FLAG(bool, check, false,
          "correctness only (CI): exit 1 when any fetched byte differs; times are still printed");

namespace dequantd::e2e {
namespace {

struct Row {
  std::string what;       // "raw gRPC", "dequantd resident", "dequantd inline"
  std::string transport;  // "tcp", "unix"
  int64_t bytes = 0;
  int streams = 1;
  int clients = 1;
  double p50 = 0, p99 = 0;  // seconds per result
  double gbps = 0;          // GB/s delivered
  bool correct = true;
  std::string error;
  std::string profile;  // per-thread CPU over the timed fetches (rows of --profile_min_mb)
};

// Times `trials` fetches of `request` (whole result of `bytes`) by `clients` clients at once,
// each over `streams` range streams on its own connections, after one untimed warm-up each.
// Compares the first and last fetch of every client with `expected`.
// With `server_pid` > 0 and a result of --profile_min_mb or more, profiles the server and this
// process over the timed fetches.
Row Measure(const std::string& target, const v1::DequantizeRequest& request, int64_t bytes,
            absl::Span<const uint8_t> expected, int streams, int clients, int trials,
            pid_t server_pid = -1) {
  Row row;
  row.bytes = bytes;
  row.streams = streams;
  row.clients = clients;
  ClientOptions options;
  options.deadline_seconds = 600;
  std::vector<std::unique_ptr<ParallelClient>> parallel;
  std::vector<std::vector<uint8_t>> buffers(static_cast<size_t>(clients));
  for (int c = 0; c < clients; ++c) {
    absl::StatusOr<std::unique_ptr<ParallelClient>> client =
        ParallelClient::Connect(target, options, streams);
    if (!client.ok()) {
      row.error = client.status().ToString();
      return row;
    }
    parallel.push_back(*std::move(client));
    buffers[c].assign(static_cast<size_t>(bytes), 0);  // touched: no page faults while timed
  }
  const auto check = [&](int c) {
    if (expected.size() != buffers[c].size() ||
        std::memcmp(expected.data(), buffers[c].data(), expected.size()) != 0) {
      row.correct = false;
    }
  };
  std::vector<std::vector<double>> latencies(static_cast<size_t>(clients));
  std::vector<absl::Status> statuses(static_cast<size_t>(clients));
  const auto run = [&](int c) {
    absl::StatusOr<v1::DequantizeHeader> warm =
        parallel[c]->DequantizeInto(request, absl::MakeSpan(buffers[c]), streams);
    if (!warm.ok()) {
      statuses[c] = warm.status();
      return;
    }
    check(c);
    std::fill(buffers[c].begin(), buffers[c].end(), 0);
  };
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) threads.emplace_back(run, c);
  for (std::thread& t : threads) t.join();
  threads.clear();
  const bool profile =
      server_pid > 0 && static_cast<double>(bytes) >= absl::GetFlag(FLAGS_profile_min_mb) * 1e6;
  const ThreadSnapshot server_before = profile ? SnapshotThreads(server_pid) : ThreadSnapshot();
  const ThreadSnapshot client_before = profile ? SnapshotThreads(::getpid()) : ThreadSnapshot();
  const Clock::time_point start = Clock::now();
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      for (int t = 0; t < trials && statuses[c].ok(); ++t) {
        const Clock::time_point begin = Clock::now();
        absl::StatusOr<v1::DequantizeHeader> h =
            parallel[c]->DequantizeInto(request, absl::MakeSpan(buffers[c]), streams);
        if (!h.ok()) statuses[c] = h.status();
        latencies[c].push_back(Seconds(begin));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double wall = Seconds(start);
  if (profile) {
    row.profile =
        FormatProfile({{"server", Usage(server_before, SnapshotThreads(server_pid))},
                       {"client (bench)", Usage(client_before, SnapshotThreads(::getpid()))}},
                      wall);
  }
  std::vector<double> all;
  for (int c = 0; c < clients; ++c) {
    if (!statuses[c].ok()) row.error = statuses[c].ToString();
    check(c);
    all.insert(all.end(), latencies[c].begin(), latencies[c].end());
  }
  row.p50 = Percentile(all, 0.5);
  row.p99 = Percentile(all, 0.99);
  row.gbps =
      wall > 0 ? static_cast<double>(bytes) * static_cast<double>(all.size()) / wall / 1e9 : 0;
  return row;
}

std::string Now() {
  char text[64];
  const std::time_t t = std::time(nullptr);
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  return text;
}

std::string CpuName() {
  FILE* f = std::fopen("/proc/cpuinfo", "r");
  char line[512];
  std::string name = "cpu";
  while (f != nullptr && std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "model name", 10) == 0) {
      const char* colon = std::strchr(line, ':');
      if (colon != nullptr) name = std::string(colon + 2, std::strcspn(colon + 2, "\n"));
      break;
    }
  }
  if (f != nullptr) std::fclose(f);
  return absl::StrCat(name, ", ", std::thread::hardware_concurrency(), " threads");
}

// Host memcpy rate (bytes copied per second, one thread): best of 5 copies of `bytes`.
double HostCopyBytesPerSecond(int64_t bytes) {
  std::vector<uint8_t> src(static_cast<size_t>(bytes), 1), dst(static_cast<size_t>(bytes), 0);
  double best = 0;
  for (int i = 0; i < 6; ++i) {
    const Clock::time_point start = Clock::now();
    std::memcpy(dst.data(), src.data(), src.size());
    const double s = Seconds(start);
    if (i > 0 && s > 0) best = std::max(best, static_cast<double>(bytes) / s);
  }
  return best;
}

void PrintRows(const std::vector<Row>& rows, const std::vector<Row>* ceilings) {
  std::cout << "| path | transport | MB | streams | clients | p50 ms | p99 ms | GB/s |"
            << (ceilings ? " ceiling GB/s | fraction |" : "") << " correct |\n"
            << "|---|---|---:|---:|---:|---:|---:|---:|" << (ceilings ? "---:|---:|" : "")
            << "---|\n";
  for (const Row& r : rows) {
    std::cout << absl::StrFormat("| %s | %s | %.1f | %d | %d | %.2f | %.2f | %.2f |", r.what,
                                 r.transport, r.bytes / 1e6, r.streams, r.clients, r.p50 * 1e3,
                                 r.p99 * 1e3, r.gbps);
    if (ceilings) {
      double ceiling = 0;
      for (const Row& c : *ceilings) {
        if (c.transport == r.transport && c.bytes == r.bytes && c.streams == r.streams &&
            c.clients == r.clients) {
          ceiling = c.gbps;
        }
      }
      std::cout << absl::StrFormat(
          " %.2f | %s |", ceiling,
          ceiling > 0 ? absl::StrFormat("%.0f%%", 100 * r.gbps / ceiling) : std::string("-"));
    }
    std::cout << " " << (r.error.empty() ? (r.correct ? "yes" : "NO") : "ERROR " + r.error)
              << " |\n";
  }
}

// The profiles of `rows` that have one, each under its row's description.
void PrintProfiles(const std::vector<Row>& rows, const std::string& what) {
  for (const Row& r : rows) {
    if (r.profile.empty()) continue;
    std::cout << absl::StrFormat(
                     "\nper-thread CPU, %s, %s, %.1f MB, %d streams, %d clients (the timed "
                     "fetches)\n\n",
                     what, r.transport, r.bytes / 1e6, r.streams, r.clients)
              << r.profile;
  }
}

// --serve_raw: the raw stream of `layers`' shapes until the process is killed.
int ServeRaw(const std::vector<int64_t>& sizes) {
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (int64_t bytes : sizes) {
    const QuantShape shape = ShapeForBytes(bytes);
    shapes.emplace_back(shape.K, shape.N);
  }
  RawStreamService service(shapes);
  const std::string encoding = absl::GetFlag(FLAGS_raw_encoding);
  service.set_encoding(encoding == "one_copy"   ? RawStreamService::Encoding::kOneCopy
                       : encoding == "protobuf" ? RawStreamService::Encoding::kProtobuf
                                                : RawStreamService::Encoding::kZeroCopy);
  int port = 0;
  std::unique_ptr<grpc::Server> server =
      StartRawServer(&service, absl::GetFlag(FLAGS_serve_raw), &port);
  if (server == nullptr) {
    std::cerr << "cannot serve on " << absl::GetFlag(FLAGS_serve_raw) << "\n";
    return 1;
  }
  server->Wait();  // until SIGTERM
  return 0;
}

int Main() {
  std::vector<int64_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',', absl::SkipEmpty())) {
    double mb = 0;
    if (!absl::SimpleAtod(s, &mb) || mb <= 0) {
      std::cerr << "--sizes: bad size '" << s << "'\n";
      return 2;
    }
    sizes.push_back(static_cast<int64_t>(mb * 1e6));
  }
  if (!absl::GetFlag(FLAGS_serve_raw).empty()) return ServeRaw(sizes);
  // Every flag is checked before anything is written.
  if (const int shrink = absl::GetFlag(FLAGS_model_shrink);
      shrink != 1 && shrink != 2 && shrink != 4 && shrink != 8 && shrink != 16) {
    std::cerr << "--model_shrink must be 1, 2, 4, 8 or 16 (it must divide the layers' dimensions "
                 "and keep them multiples of 128 and 8), not "
              << shrink << "\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_region_busy_poll_us) < 0) {
    std::cerr << "--region_busy_poll_us must be >= 0\n";
    return 2;
  }
  if (const std::string t = absl::GetFlag(FLAGS_region_transport); t != "unix" && t != "tcp") {
    std::cerr << "--region_transport must be unix or tcp, not \"" << t << "\"\n";
    return 2;
  }
  const std::string region_model = absl::GetFlag(FLAGS_region_model);
  if (region_model != "none" && region_model != "sizes" && region_model != "llama-8b") {
    std::cerr << "--region_model must be none, sizes or llama-8b, not \"" << region_model << "\"\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_region_rows_only) && region_model == "none") {
    std::cerr << "--region_rows_only needs --region_model=sizes or llama-8b\n";
    return 2;
  }
  if (const std::string m = absl::GetFlag(FLAGS_model_shape); m != "llama-8b" && m != "llama-70b") {
    std::cerr << "--model_shape must be llama-8b or llama-70b, not \"" << m << "\"\n";
    return 2;
  }
  const std::string memory_limit = absl::GetFlag(FLAGS_device_memory_limit);
  int64_t memory_limit_bytes = 0;
  if (!memory_limit.empty() && memory_limit != "half" &&
      (!absl::SimpleAtoi(memory_limit, &memory_limit_bytes) || memory_limit_bytes <= 0)) {
    std::cerr << "--device_memory_limit must be empty, half or a number of bytes, not \""
              << memory_limit << "\"\n";
    return 2;
  }
  const int S = std::clamp(absl::GetFlag(FLAGS_streams), 1, kMaxStreams);
  const int C = std::max(1, absl::GetFlag(FLAGS_clients));
  const int trials = std::max(1, absl::GetFlag(FLAGS_trials));
  std::string work = absl::GetFlag(FLAGS_work_dir);
  if (work.empty()) {
    work = (std::filesystem::temp_directory_path() / absl::StrCat("dequantd_e2e.", ::getpid()))
               .string();
  }
  std::filesystem::create_directories(work);

  const std::vector<SyntheticLayer> layers = MakeLayers(sizes, 42);
  // The whole model (--model_blocks) shares the checkpoint with the sized layers.
  const int blocks = std::max(0, absl::GetFlag(FLAGS_model_blocks));
  const bool model_70b = absl::GetFlag(FLAGS_model_shape) == "llama-70b";
  const SyntheticModel model = MakeLlamaModel(model_70b ? kLlama70B : kLlama8B, blocks,
                                              absl::GetFlag(FLAGS_model_shrink), 43);
  std::vector<std::string> names = model.names;
  std::vector<const SyntheticLayer*> data;
  for (size_t d : model.data_of) data.push_back(&model.distinct[d]);
  for (const SyntheticLayer& l : layers) {
    names.push_back(l.name);
    data.push_back(&l);
  }
  if (absl::Status s = WriteCheckpoint(work + "/model", names, data); !s.ok()) {
    std::cerr << "cannot write the checkpoint: " << s << "\n";
    return 1;
  }
  int64_t packed_bytes = 0;  // the checkpoint's files (headers are a few KB of it)
  for (const auto& e : std::filesystem::directory_iterator(work + "/model")) {
    if (e.path().extension() == ".safetensors") {
      packed_bytes += static_cast<int64_t>(e.file_size());
    }
  }
  if (memory_limit == "half") memory_limit_bytes = packed_bytes / 2;
  std::vector<std::string> dequantd_flags = {"--max-request-bytes=1000000000",
                                             "--max-output-bytes=20000000000"};
  if (memory_limit_bytes > 0) {
    dequantd_flags.push_back(absl::StrCat("--device-memory-limit=", memory_limit_bytes));
  }
  const bool regions_only = absl::GetFlag(FLAGS_region_rows_only);
  std::vector<std::vector<uint8_t>> reference;
  for (const SyntheticLayer& l : regions_only ? std::vector<SyntheticLayer>{} : layers) {
    reference.emplace_back(static_cast<size_t>(l.shape.output_bytes(DType::kF16)));
    if (!DequantizeCpu(l.view(), DType::kF16, 0, l.shape.K, reference.back().data()).ok()) {
      std::cerr << "reference failed\n";
      return 1;
    }
  }
  std::vector<std::vector<uint8_t>> model_reference;
  for (const SyntheticLayer& l : model.distinct) {
    model_reference.emplace_back(static_cast<size_t>(l.shape.output_bytes(DType::kF16)));
    if (!DequantizeCpu(l.view(), DType::kF16, 0, l.shape.K, model_reference.back().data()).ok()) {
      std::cerr << "reference failed\n";
      return 1;
    }
  }
  std::string gpu;
  const int64_t largest = layers.back().shape.output_bytes(DType::kF16);
  const double d2h = PinnedDeviceToHostBytesPerSecond(std::max<int64_t>(largest, 64 << 20), &gpu);
  const double memcpy_rate = HostCopyBytesPerSecond(std::max<int64_t>(largest, 64 << 20));
  const int64_t chunk = absl::GetFlag(FLAGS_chunk_bytes);
  const auto region_rows = [&] {
    return RunRegionRows({.dequantd = absl::GetFlag(FLAGS_dequantd),
                          .backend = absl::GetFlag(FLAGS_backend),
                          .work_dir = work,
                          .model = absl::GetFlag(FLAGS_region_model),
                          .sizes_model_dir = work + "/model",
                          .sizes_layers = &layers,
                          .trials = trials,
                          .chunk_bytes = chunk,
                          .pinned_d2h_bytes_per_second = d2h,
                          .model_shrink = absl::GetFlag(FLAGS_model_shrink),
                          .transport = absl::GetFlag(FLAGS_region_transport),
                          .busy_poll_us = absl::GetFlag(FLAGS_region_busy_poll_us)},
                         std::cout);
  };
  if (regions_only) {
    std::cout << "dequantd region rows, " << Now() << ", commit " << DEQUANTD_BUILD_COMMIT
              << "\nhost: " << CpuName() << "; GPU: " << (gpu.empty() ? "none" : gpu) << "; "
              << trials << " timed calls per row\n"
              << (d2h > 0 ? absl::StrFormat("pinned device-to-host copy: %.2f GB/s\n", d2h / 1e9)
                          : std::string("pinned device-to-host copy: no GPU\n"));
    const bool ok = region_rows();
    if (!ok) std::cerr << "dequantd_e2e_bench: some region bytes were wrong or a call failed\n";
    if (absl::GetFlag(FLAGS_work_dir).empty()) std::filesystem::remove_all(work);
    return ok ? 0 : 1;  // a call that failed (or a server that never started) fails the run
  }

  std::vector<std::string> transports = {"tcp"};
  if (absl::GetFlag(FLAGS_unix_socket)) transports.push_back("unix");

  // Ceilings: the raw stream, served by this program in its own process (--serve_raw).
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (const SyntheticLayer& l : layers) shapes.emplace_back(l.shape.K, l.shape.N);
  const RawStreamService raw(shapes);  // the pattern the raw server streams, for the checks
  const auto start_raw = [&](const std::string& transport, const std::string& encoding) {
    return DequantdProcess::StartCommand(
        {std::filesystem::read_symlink("/proc/self/exe").string(),
         "--sizes=" + absl::GetFlag(FLAGS_sizes), "--raw_encoding=" + encoding},
        "--serve_raw", transport == "tcp" ? "" : work + "/raw.sock",
        absl::StrCat(work, "/raw.", transport, ".", encoding, ".log"));
  };
  std::vector<Row> ceilings;
  std::vector<Row> encodings;  // the raw stream with dequantd's (and the old) message building
  for (const std::string& transport : transports) {
    absl::StatusOr<std::unique_ptr<DequantdProcess>> server = start_raw(transport, "zero_copy");
    if (!server.ok()) {
      std::cerr << "cannot start the raw stream server (" << transport << "): " << server.status()
                << "\n";
      return 1;
    }
    for (size_t i = 0; i < layers.size(); ++i) {
      v1::DequantizeRequest request;
      request.set_tensor("raw." + std::to_string(i));
      request.set_chunk_bytes(chunk);
      const int64_t bytes = static_cast<int64_t>(reference[i].size());
      const absl::Span<const uint8_t> expected(raw.bytes().data(), reference[i].size());
      for (auto [streams, clients] : {std::pair{1, 1}, std::pair{S, 1}, std::pair{1, C}}) {
        Row row = Measure((*server)->target(), request, bytes, expected, streams, clients, trials,
                          (*server)->pid());
        row.what = "raw gRPC";
        row.transport = transport;
        ceilings.push_back(row);
      }
    }
    server->reset();
    if (transport == "tcp") {
      // The serialization's cost: the largest size, one stream, each way of building a message.
      const size_t i = layers.size() - 1;
      v1::DequantizeRequest request;
      request.set_tensor("raw." + std::to_string(i));
      request.set_chunk_bytes(chunk);
      const absl::Span<const uint8_t> expected(raw.bytes().data(), reference[i].size());
      for (auto [encoding, name] : {std::pair{"one_copy", "raw gRPC, one copy"},
                                    std::pair{"protobuf", "raw gRPC, protobuf bytes"}}) {
        absl::StatusOr<std::unique_ptr<DequantdProcess>> encoded = start_raw(transport, encoding);
        if (!encoded.ok()) {
          std::cerr << "cannot start the raw stream server: " << encoded.status() << "\n";
          return 1;
        }
        Row row = Measure((*encoded)->target(), request, static_cast<int64_t>(reference[i].size()),
                          expected, 1, 1, trials);
        row.what = name;
        row.transport = transport;
        encodings.push_back(row);
      }
    }
  }

  // dequantd end to end.
  std::vector<Row> rows;
  std::vector<ModelRow> model_rows;
  std::string backend;
  for (const std::string& transport : transports) {
    absl::StatusOr<std::unique_ptr<DequantdProcess>> process = DequantdProcess::Start(
        absl::GetFlag(FLAGS_dequantd), work + "/model", absl::GetFlag(FLAGS_backend),
        transport == "tcp" ? "" : work + "/dequantd.sock", work + "/dequantd." + transport + ".log",
        dequantd_flags);
    if (!process.ok()) {
      std::cerr << process.status() << "\n";
      return 1;
    }
    backend = (*process)->backend();
    for (size_t i = 0; i < layers.size(); ++i) {
      v1::DequantizeRequest request;
      request.set_tensor(layers[i].name);
      request.set_chunk_bytes(chunk);
      const int64_t bytes = static_cast<int64_t>(reference[i].size());
      for (auto [streams, clients] : {std::pair{1, 1}, std::pair{S, 1}, std::pair{1, C}}) {
        Row row = Measure((*process)->target(), request, bytes, reference[i], streams, clients,
                          trials, (*process)->pid());
        row.what = "dequantd resident";
        row.transport = transport;
        rows.push_back(row);
      }
      if (absl::GetFlag(FLAGS_inline_requests) && transport == "tcp") {
        v1::DequantizeRequest inline_request;
        v1::InlinePackedTensor* packed = inline_request.mutable_packed();
        const SyntheticLayer& l = layers[i];
        packed->set_in_features(l.shape.K);
        packed->set_out_features(l.shape.N);
        packed->set_group_size(l.shape.group_size);
        packed->set_scale_dtype(v1::DTYPE_FP16);
        packed->set_qweight(l.qweight.data(), l.qweight.size() * 4);
        packed->set_qzeros(l.qzeros.data(), l.qzeros.size() * 4);
        packed->set_scales(l.scales.data(), l.scales.size() * 2);
        inline_request.set_chunk_bytes(chunk);
        Row row = Measure((*process)->target(), inline_request, bytes, reference[i], 1, 1, trials);
        row.what = "dequantd inline";
        row.transport = transport;
        rows.push_back(row);
      }
    }
    if (blocks > 0) {
      ModelRowsOptions options;
      options.target = (*process)->target();
      options.transport = transport;
      options.server_pid = (*process)->pid();
      options.trials = std::max(1, absl::GetFlag(FLAGS_model_trials));
      options.out_dir =
          absl::GetFlag(FLAGS_model_out_dir).empty() ? work : absl::GetFlag(FLAGS_model_out_dir);
      options.file_rows = transport == transports.back() && !model_70b;  // once: the file's rate
      options.reused_buffer = model_70b;
      for (absl::string_view v :
           absl::StrSplit(absl::GetFlag(FLAGS_model_streams), ',', absl::SkipEmpty())) {
        int n = 0;
        if (absl::SimpleAtoi(v, &n)) options.streams.push_back(std::clamp(n, 1, kMaxStreams));
      }
      if (options.streams.empty())
        options.streams = S > 1 ? std::vector<int>{1, S} : std::vector<int>{1};
      options.stream_ceiling = [&, transport](int streams) {
        double best = 0;  // the raw ceiling of the largest size at these streams, one client
        for (const Row& c : ceilings) {
          if (c.transport == transport && c.streams == streams && c.clients == 1 &&
              c.bytes == largest) {
            best = c.gbps;
          }
        }
        return best;
      };
      std::vector<ModelRow> got = MeasureModel(model, model_reference, options);
      model_rows.insert(model_rows.end(), got.begin(), got.end());
    }
  }

  std::cout << "dequantd end to end, " << Now() << ", commit " << DEQUANTD_BUILD_COMMIT
            << "\nhost: " << CpuName() << "; GPU: " << (gpu.empty() ? "none" : gpu)
            << "; dequantd backend: " << backend << "; chunk_bytes "
            << (chunk == 0 ? std::string("server default (1 MiB)") : std::to_string(chunk)) << "; "
            << trials << " timed fetches per row and client, S = " << S << ", C = " << C << "\n";
  if (memory_limit_bytes > 0) {
    std::cout << absl::StrFormat(
        "dequantd --device-memory-limit=%d (%.0f%% of the checkpoint's %.2f GB packed): the "
        "layers past it are served from host memory, staged per call\n",
        memory_limit_bytes, 100.0 * static_cast<double>(memory_limit_bytes) / packed_bytes,
        packed_bytes / 1e9);
  }
  std::cout << "\n";
  std::cout << absl::StrFormat("host memcpy (1 thread): %.2f GB/s\n", memcpy_rate / 1e9);
  std::cout << (d2h > 0 ? absl::StrFormat("pinned device-to-host copy: %.2f GB/s\n", d2h / 1e9)
                        : std::string("pinned device-to-host copy: no GPU\n"))
            << "\nceilings: raw gRPC byte stream (no computation, no copy on the server)\n\n";
  PrintRows(ceilings, nullptr);
  std::cout << "\nthe same raw stream, messages built as dequantd builds them now (one copy into a "
               "slice) and before issue 8 (protobuf bytes field + serialization: two copies)\n\n";
  PrintRows(encodings, &ceilings);
  std::cout << "\ndequantd (every byte received into the client's memory)\n\n";
  PrintRows(rows, &ceilings);

  PrintProfiles(ceilings, "raw gRPC ceiling");
  PrintProfiles(rows, "dequantd");
  if (!model_rows.empty()) {
    std::cout << absl::StrFormat(
                     "\nwhole model: %d layers of a %s-shaped model (dimensions / %d), "
                     "%.2f GB of fp16, DequantizeLayers\n\n",
                     model.names.size(),
                     absl::GetFlag(FLAGS_model_shape) == "llama-70b" ? "Llama-3-70B" : "Llama-3-8B",
                     absl::GetFlag(FLAGS_model_shrink), model.fp16_bytes() / 1e9)
              << FormatModelRows(model_rows);
  }

  bool ok = true;
  for (const std::vector<Row>* table : {&ceilings, &encodings, &rows}) {
    for (const Row& r : *table) ok = ok && r.correct && r.error.empty();
  }
  if (absl::GetFlag(FLAGS_region_model) != "none") {
    ok = region_rows() && ok;
  }
  for (const ModelRow& r : model_rows) ok = ok && r.correct && r.error.empty();
  if (!ok) std::cerr << "dequantd_e2e_bench: some fetched bytes were wrong or a call failed\n";
  if (absl::GetFlag(FLAGS_work_dir).empty()) std::filesystem::remove_all(work);
  return ok || !absl::GetFlag(FLAGS_check) ? 0 : 1;
}

}  // namespace
}  // namespace dequantd::e2e

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "dequantd_e2e_bench: end-to-end delivery of dequantd results beside the raw gRPC, memcpy "
      "and device-to-host ceilings, in one run");
  absl::ParseCommandLine(argc, argv);
  return dequantd::e2e::Main();
}
