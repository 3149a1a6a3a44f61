// dequantd_upload_paths: the ways to move a file that is in the page cache to GPU memory, timed
// side by side on one host (issue 22's warm load: dequantd's upload ran at 23.8 GB/s against 31
// GB/s for the same preads into pageable buffers on the H100 host). Rows, each over the whole
// file with T threads taking chunks in turn, best of --trials:
//   pread -> pageable          the read ceiling (no copy to the device at all);
//   pread -> pinned -> device  dequantd's upload, through its own PinnedReadStaging (4 pinned
//                              buffers per thread, its own stream, a buffer reused once its
//                              copy is done);
//   mapping -> device          cudaMemcpyAsync straight from a read-only mapping of the file
//                              (the driver stages pageable memory itself);
//   registered mapping         each chunk of the read-only mapping registered
//                              (cudaHostRegisterReadOnly), copied by DMA from the page cache
//                              itself, unregistered once copied: no host copy at all.
// Every row's device bytes are compared with the file's (a checksum on the host of a copy back).
//
//   dequantd_upload_paths [--file=/tmp/dequantd-upload-paths.bin] [--gb=8] [--threads=8,16]
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "server/backend/cuda/pinned_read_staging.h"
#include "server/model/load_staging_plan.h"

ABSL_FLAG(std::string, file, "/tmp/dequantd-upload-paths.bin",
          "the file to upload; written (random bytes) when it is absent or of another size");
ABSL_FLAG(double, gb, 8, "the file's size in GB (1e9 bytes, rounded down to 64 MiB)");
ABSL_FLAG(std::string, threads, "8,16", "reader thread counts, one set of rows each");
ABSL_FLAG(int, staging_chunk_mib, 8, "chunk of the pinned-staging row (dequantd's upload: 8)");
ABSL_FLAG(int, register_chunk_mib, 64, "chunk registered at a time in the registered row");
ABSL_FLAG(int, trials, 3, "timed repetitions of each row (the best is reported)");

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

#define CHECK_CUDA(call)                                                                           \
  do {                                                                                             \
    const cudaError_t err_ = (call);                                                               \
    if (err_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

// Full pread of [offset, offset + n) or exit.
void PreadAll(int fd, uint8_t* dst, int64_t n, int64_t offset) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, dst, static_cast<size_t>(n), offset);
    if (got <= 0) {
      std::perror("pread");
      std::exit(1);
    }
    dst += got;
    n -= got;
    offset += got;
  }
}

void EnsureFile(const std::string& path, int64_t bytes) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && st.st_size == bytes) return;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    std::perror("open for writing");
    std::exit(1);
  }
  std::vector<uint64_t> block((int64_t{64} << 20) / 8);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int64_t at = 0; at < bytes; at += int64_t{64} << 20) {
    for (uint64_t& w : block) {  // xorshift64
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      w = x;
    }
    if (::write(fd, block.data(), block.size() * 8) != static_cast<ssize_t>(block.size() * 8)) {
      std::perror("write");
      std::exit(1);
    }
  }
  ::close(fd);
}

// Runs body(thread, chunk index) on `threads` threads over `chunks` chunks taken in turn.
template <typename Body>
void OnChunks(int threads, int64_t chunks, Body body) {
  std::atomic<int64_t> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int64_t c = next++; c < chunks; c = next++) body(t, c);
    });
  }
  for (std::thread& th : pool) th.join();
}

// FNV-1a over 64-bit words of a host buffer.
uint64_t Checksum(const uint8_t* p, int64_t n) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  return h;
}

struct Setup {
  int fd = -1;
  int64_t bytes = 0;
  const uint8_t* map = nullptr;  // read-only, shared
  uint8_t* device = nullptr;     // `bytes` of device memory
  uint64_t want = 0;             // Checksum of the file
};

uint64_t DeviceChecksum(const Setup& s) {
  std::vector<uint8_t> back(static_cast<size_t>(s.bytes));
  CHECK_CUDA(
      cudaMemcpy(back.data(), s.device, static_cast<size_t>(s.bytes), cudaMemcpyDeviceToHost));
  return Checksum(back.data(), s.bytes);
}

double RowPageable(const Setup& s, int threads, int64_t chunk) {
  std::vector<std::vector<uint8_t>> buffers(static_cast<size_t>(threads),
                                            std::vector<uint8_t>(static_cast<size_t>(chunk)));
  const Clock::time_point start = Clock::now();
  OnChunks(threads, s.bytes / chunk, [&](int t, int64_t c) {
    PreadAll(s.fd, buffers[static_cast<size_t>(t)].data(), chunk, c * chunk);
  });
  return Since(start);
}

// dequantd's own staging (PinnedReadStaging, as the model upload cuts it: 4 buffers per thread).
double RowPinned(const Setup& s, int threads, int64_t chunk) {
  const dequantd::LoadStagingPlan plan{.threads = threads, .buffers = 4, .chunk_bytes = chunk};
  absl::StatusOr<std::unique_ptr<dequantd::cuda::PinnedReadStaging>> staging =
      dequantd::cuda::PinnedReadStaging::Make(0, plan);
  if (!staging.ok()) {
    std::fprintf(stderr, "pinned staging: %s\n", std::string(staging.status().message()).c_str());
    std::exit(1);
  }
  dequantd::cuda::PinnedReadStaging& pinned = **staging;
  const Clock::time_point start = Clock::now();
  OnChunks(threads, s.bytes / chunk, [&](int t, int64_t c) {
    absl::StatusOr<uint8_t*> buffer = pinned.NextBuffer(t);
    absl::Status copied = buffer.status();
    if (buffer.ok()) {
      PreadAll(s.fd, *buffer, chunk, c * chunk);
      copied = pinned.CopyToDevice(t, *buffer, s.device + c * chunk, chunk);
    }
    if (!copied.ok()) {
      std::fprintf(stderr, "pinned staging: %s\n", std::string(copied.message()).c_str());
      std::exit(1);
    }
  });
  if (!pinned.Synchronize().ok()) std::exit(1);
  return Since(start);
}

double RowMapping(const Setup& s, int threads, int64_t chunk) {
  std::vector<cudaStream_t> streams(static_cast<size_t>(threads));
  for (cudaStream_t& st : streams)
    CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const Clock::time_point start = Clock::now();
  OnChunks(threads, s.bytes / chunk, [&](int t, int64_t c) {
    CHECK_CUDA(cudaMemcpyAsync(s.device + c * chunk, s.map + c * chunk, static_cast<size_t>(chunk),
                               cudaMemcpyHostToDevice, streams[static_cast<size_t>(t)]));
  });
  for (cudaStream_t st : streams) CHECK_CUDA(cudaStreamSynchronize(st));
  const double seconds = Since(start);
  for (cudaStream_t st : streams) CHECK_CUDA(cudaStreamDestroy(st));
  return seconds;
}

// Registered row; `register_seconds` gets the sum over threads of cudaHostRegister calls and
// `unregister_seconds` of cudaHostUnregister. Returns a negative time when registration fails.
double RowRegistered(const Setup& s, int threads, int64_t chunk, double* register_seconds,
                     double* unregister_seconds, std::string* error) {
  constexpr int kInFlight = 2;  // chunks registered per thread at once
  struct Reader {
    cudaStream_t stream;
    cudaEvent_t done[kInFlight];
    const uint8_t* held[kInFlight] = {};
    int next = 0;
    double reg = 0, unreg = 0;
  };
  std::vector<Reader> readers(static_cast<size_t>(threads));
  for (Reader& r : readers) {
    CHECK_CUDA(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
    for (cudaEvent_t& e : r.done) CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  std::atomic<bool> failed{false};
  const Clock::time_point start = Clock::now();
  OnChunks(threads, s.bytes / chunk, [&](int t, int64_t c) {
    if (failed) return;
    Reader& r = readers[static_cast<size_t>(t)];
    const int b = r.next;
    r.next = (r.next + 1) % kInFlight;
    if (r.held[b] != nullptr) {
      CHECK_CUDA(cudaEventSynchronize(r.done[b]));
      const Clock::time_point u = Clock::now();
      CHECK_CUDA(cudaHostUnregister(const_cast<uint8_t*>(r.held[b])));
      r.unreg += Since(u);
      r.held[b] = nullptr;
    }
    const uint8_t* src = s.map + c * chunk;
    const Clock::time_point g = Clock::now();
    const cudaError_t err = cudaHostRegister(const_cast<uint8_t*>(src), static_cast<size_t>(chunk),
                                             cudaHostRegisterReadOnly);
    r.reg += Since(g);
    if (err != cudaSuccess) {
      if (!failed.exchange(true)) *error = cudaGetErrorString(err);
      cudaGetLastError();
      return;
    }
    r.held[b] = src;
    CHECK_CUDA(cudaMemcpyAsync(s.device + c * chunk, src, static_cast<size_t>(chunk),
                               cudaMemcpyHostToDevice, r.stream));
    CHECK_CUDA(cudaEventRecord(r.done[b], r.stream));
  });
  for (Reader& r : readers) {
    CHECK_CUDA(cudaStreamSynchronize(r.stream));
    for (const uint8_t*& p : r.held) {
      if (p == nullptr) continue;
      const Clock::time_point u = Clock::now();
      CHECK_CUDA(cudaHostUnregister(const_cast<uint8_t*>(p)));
      r.unreg += Since(u);
      p = nullptr;
    }
  }
  const double seconds = Since(start);
  for (Reader& r : readers) {
    *register_seconds += r.reg;
    *unregister_seconds += r.unreg;
    for (cudaEvent_t e : r.done) CHECK_CUDA(cudaEventDestroy(e));
    CHECK_CUDA(cudaStreamDestroy(r.stream));
  }
  return failed ? -1 : seconds;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int64_t step = int64_t{64} << 20;
  Setup s;
  s.bytes = static_cast<int64_t>(absl::GetFlag(FLAGS_gb) * 1e9) / step * step;
  const std::string path = absl::GetFlag(FLAGS_file);
  EnsureFile(path, s.bytes);
  s.fd = ::open(path.c_str(), O_RDONLY);
  if (s.fd < 0) {
    std::perror("open");
    return 1;
  }
  void* map = ::mmap(nullptr, static_cast<size_t>(s.bytes), PROT_READ, MAP_SHARED, s.fd, 0);
  if (map == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  s.map = static_cast<const uint8_t*>(map);
  s.want = Checksum(s.map, s.bytes);  // also brings the file into the page cache
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&s.device), static_cast<size_t>(s.bytes)));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  int read_only = 0;
  cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, 0);
  std::printf("- device: %s; host %d cores; file %s, %.2f GB in the page cache\n", prop.name,
              static_cast<int>(std::thread::hardware_concurrency()), path.c_str(),
              static_cast<double>(s.bytes) / 1e9);
  std::printf("- cudaDevAttrHostRegisterReadOnlySupported: %d\n\n", read_only);
  std::printf(
      "| path | threads | chunk MiB | best s | GB/s | of read ceiling | bytes on device | note "
      "|\n");
  std::printf("|---|---:|---:|---:|---:|---:|---|---|\n");
  const int64_t staging_chunk = int64_t{absl::GetFlag(FLAGS_staging_chunk_mib)} << 20;
  const int64_t register_chunk = int64_t{absl::GetFlag(FLAGS_register_chunk_mib)} << 20;
  const int trials = std::max(1, absl::GetFlag(FLAGS_trials));
  for (absl::string_view word : absl::StrSplit(absl::GetFlag(FLAGS_threads), ',')) {
    int threads = 0;
    if (!absl::SimpleAtoi(word, &threads) || threads < 1) {
      std::fprintf(stderr, "--threads: bad entry '%s'\n", std::string(word).c_str());
      return 2;
    }
    const double gb = static_cast<double>(s.bytes) / 1e9;
    double ceiling = 0;
    auto row = [&](const char* what, int64_t chunk, auto run, const std::string& note,
                   bool on_device) {
      double best = -1;
      for (int t = 0; t < trials; ++t) {
        if (on_device) CHECK_CUDA(cudaMemset(s.device, 0, static_cast<size_t>(s.bytes)));
        CHECK_CUDA(cudaDeviceSynchronize());
        const double seconds = run();
        if (seconds < 0) break;
        best = best < 0 ? seconds : std::min(best, seconds);
      }
      if (best < 0) {
        std::printf("| %s | %d | %lld | - | - | - | - | %s |\n", what, threads,
                    static_cast<long long>(chunk >> 20), note.c_str());
        return;
      }
      if (ceiling == 0) ceiling = best;
      const char* exact = !on_device ? "-" : DeviceChecksum(s) == s.want ? "exact" : "DIFFER";
      std::printf("| %s | %d | %lld | %.3f | %.2f | %.0f%% | %s | %s |\n", what, threads,
                  static_cast<long long>(chunk >> 20), best, gb / best, 100 * ceiling / best, exact,
                  note.c_str());
      std::fflush(stdout);
    };
    row(
        "pread -> pageable (read ceiling)", staging_chunk,
        [&] { return RowPageable(s, threads, staging_chunk); }, "", false);
    row(
        "pread -> pinned -> device (dequantd)", staging_chunk,
        [&] { return RowPinned(s, threads, staging_chunk); }, "4 buffers per thread", true);
    row(
        "mapping -> device (driver-staged)", register_chunk,
        [&] { return RowMapping(s, threads, register_chunk); }, "", true);
    double reg = 0, unreg = 0;
    std::string error;
    int runs = 0;
    row(
        "registered mapping -> device", register_chunk,
        [&] {
          ++runs;
          return RowRegistered(s, threads, register_chunk, &reg, &unreg, &error);
        },
        "", true);
    if (!error.empty()) {
      std::printf("|  |  |  |  |  |  |  | registration failed: %s |\n", error.c_str());
    } else {
      std::printf(
          "|  |  |  |  |  |  |  | per run, summed over threads: register %.3f s, "
          "unregister %.3f s |\n",
          reg / std::max(1, runs), unreg / std::max(1, runs));
    }
  }
  return 0;
}
