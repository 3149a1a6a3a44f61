// dequantd_load_bench (issue 22): time to serving of a large checkpoint beside the time to read
// its files with the same number of threads, measured in the same run, from a warm page cache
// and from files dropped from it (posix_fadvise DONTNEED, which works for files on a disk, not
// on tmpfs: the table says which), with the server's peak RSS beside that of a server with no
// model.
//
//   dequantd_load_bench --dir /data/llama70b [--model llama-70b] [--threads 8] [--cold]
//
// The checkpoint (random AWQ words, Llama-3-70B- or 8B-shaped, 8 shards with an index) is
// written to --dir unless it is there already (a marker file names its shape). The read ceiling
// reads every shard's bytes in 16 MiB chunks with --threads threads, each chunk into the
// thread's own buffer (discarded): the pattern the server's loader uses, without the copy to the
// GPU. Time to serving: from fork/exec of dequantd until GetServerInfo answers.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/e2e/dequantd_process.h"
#include "bench/e2e/load_check.h"
#include "bench/e2e/synthetic_model.h"
#include "build_commit.h"

ABSL_FLAG(std::string, dir, "", "checkpoint directory (written unless it holds the model)");
ABSL_FLAG(std::string, model, "llama-70b", "llama-70b (80 blocks, 35.6 GB) or llama-8b");
ABSL_FLAG(int, shards, 8, "shard files of a checkpoint written here");
ABSL_FLAG(int, threads, 16, "reader threads: the ceiling's and the server's --load-threads");
ABSL_FLAG(bool, cold, false, "also from files dropped from the page cache (posix_fadvise)");
ABSL_FLAG(std::string, dequantd, dequantd::e2e::DefaultDequantdBinary(DEQUANTD_PATH),
          "the dequantd binary (default: $DEQUANTD when set, else the build's)");
ABSL_FLAG(std::string, backend, "cuda", "the server's --backend");
ABSL_FLAG(std::string, tune_cache, "", "the server's --tune-cache (default: DIR/../tune.json)");
ABSL_FLAG(std::string, extra, "", "more dequantd flags, comma-separated");
ABSL_FLAG(bool, check, true,
          "after the rows, start dequantd once more and check one layer of every model block "
          "bit-exact against the CPU reference (bench/e2e/load_check.h)");

namespace dequantd::e2e {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::vector<std::string> Shards(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

int64_t TotalBytes(const std::vector<std::string>& files) {
  int64_t total = 0;
  for (const std::string& f : files) total += static_cast<int64_t>(std::filesystem::file_size(f));
  return total;
}

// Drops the files' pages from the page cache; false when a file stays cached (tmpfs).
bool DropFromPageCache(const std::vector<std::string>& files) {
  bool ok = true;
  for (const std::string& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ::fdatasync(fd);
    ok &= ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
    ::close(fd);
  }
  return ok;
}

// Reads every byte of `files` in 16 MiB chunks with `threads` threads; seconds.
double ReadFiles(const std::vector<std::string>& files, int threads) {
  constexpr int64_t kChunk = int64_t{16} << 20;
  struct Chunk {
    int fd;
    int64_t offset, bytes;
  };
  std::vector<int> fds;
  std::vector<Chunk> chunks;
  for (const std::string& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    fds.push_back(fd);
    const int64_t size = static_cast<int64_t>(std::filesystem::file_size(f));
    for (int64_t at = 0; at < size; at += kChunk) {
      chunks.push_back({fd, at, std::min(kChunk, size - at)});
    }
  }
  std::atomic<size_t> next{0};
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      std::vector<uint8_t> buffer(static_cast<size_t>(kChunk));
      for (size_t i = next.fetch_add(1); i < chunks.size(); i = next.fetch_add(1)) {
        int64_t done = 0;
        while (done < chunks[i].bytes) {
          const ssize_t got =
              ::pread(chunks[i].fd, buffer.data(), static_cast<size_t>(chunks[i].bytes - done),
                      chunks[i].offset + done);
          if (got <= 0) break;
          done += got;
        }
      }
    });
  }
  for (std::thread& t : pool) t.join();
  const double seconds = Seconds(start, Clock::now());
  for (int fd : fds) ::close(fd);
  return seconds;
}

// The peak resident set of process `pid` (VmHWM), bytes; 0 if unreadable.
int64_t PeakRss(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string key;
  while (status >> key) {
    if (key == "VmHWM:") {
      int64_t kib = 0;
      status >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

// The last line of the server's log holding `what` and `also`, from `what` on, or "".
std::string LogLine(const std::string& log, const std::string& what, const std::string& also) {
  std::ifstream in(log);
  std::string line, found;
  while (std::getline(in, line)) {
    const size_t at = line.find(what);
    if (at != std::string::npos && line.find(also) != std::string::npos) found = line.substr(at);
  }
  return found;
}

struct Serving {
  double seconds = 0;
  int64_t peak_rss = 0;
  std::string loaded;   // the server's "loaded N layers: ..." line (with the upload's profile)
  std::string startup;  // its "startup phases (seconds since exec): ..." line
};

absl::StatusOr<Serving> TimeToServing(const std::string& model_dir, const std::string& log,
                                      const std::vector<std::string>& extra) {
  const Clock::time_point start = Clock::now();
  absl::StatusOr<std::unique_ptr<DequantdProcess>> server = DequantdProcess::Start(
      absl::GetFlag(FLAGS_dequantd), model_dir, absl::GetFlag(FLAGS_backend), "", log, extra);
  if (!server.ok()) return server.status();
  Serving out;
  out.seconds = Seconds(start, Clock::now());
  out.peak_rss = PeakRss((*server)->pid());
  server->reset();
  out.loaded = LogLine(log, "loaded ", "layers:");
  out.startup = LogLine(log, "startup phases", "");
  return out;
}

int Run() {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) {
    std::fprintf(stderr, "--dir is required\n");
    return 2;
  }
  const std::string shape = absl::GetFlag(FLAGS_model);
  const bool big = shape == "llama-70b";
  if (!big && shape != "llama-8b") {
    std::fprintf(stderr, "--model must be llama-70b or llama-8b\n");
    return 2;
  }
  const auto make_model = [big] {
    return big ? MakeLlamaModel(kLlama70B, 80, 1, 70) : MakeLlamaModel(kLlama8B, 32, 1, 8);
  };
  const std::string marker = dir + "/.dequantd_load_bench";
  std::string have;
  std::ifstream(marker) >> have;
  if (have != shape) {
    const Clock::time_point start = Clock::now();
    std::filesystem::remove_all(dir);
    const SyntheticModel model = make_model();
    std::vector<const SyntheticLayer*> data;
    for (size_t d : model.data_of) data.push_back(&model.distinct[d]);
    if (absl::Status s =
            WriteShardedCheckpoint(dir, model.names, data, absl::GetFlag(FLAGS_shards));
        !s.ok()) {
      std::fprintf(stderr, "writing the checkpoint: %s\n", s.ToString().c_str());
      return 1;
    }
    std::ofstream(marker) << shape;
    std::printf("wrote the %s-shaped checkpoint (%zu layers) to %s in %.1f s\n", shape.c_str(),
                model.names.size(), dir.c_str(), Seconds(start, Clock::now()));
  }
  const std::vector<std::string> files = Shards(dir);
  const int64_t bytes = TotalBytes(files);
  const int threads = absl::GetFlag(FLAGS_threads);
  std::string tune_cache = absl::GetFlag(FLAGS_tune_cache);
  if (tune_cache.empty()) tune_cache = dir + ".tune.json";
  std::filesystem::remove(tune_cache);
  std::vector<std::string> extra = {absl::StrCat("--load-threads=", threads),
                                    "--tune-cache=" + tune_cache, "--metrics-listen="};
  for (absl::string_view e : absl::StrSplit(absl::GetFlag(FLAGS_extra), ',', absl::SkipEmpty())) {
    extra.emplace_back(e);
  }
  const std::string log = dir + ".dequantd.log";

  std::printf("dequantd_load_bench %s  commit %s  %s, %zu shards, %.2f GB, %d threads\n",
              shape.c_str(), DEQUANTD_BUILD_COMMIT, dir.c_str(), files.size(), bytes / 1e9,
              threads);
  absl::StatusOr<Serving> empty = TimeToServing("", log, extra);
  if (!empty.ok()) {
    std::fprintf(stderr, "dequantd without a model: %s\n", empty.status().ToString().c_str());
    return 1;
  }
  std::printf("dequantd with no model: ready in %.2f s, peak RSS %.0f MB\n    server: %s\n\n",
              empty->seconds, empty->peak_rss / 1e6, empty->startup.c_str());
  std::printf("%-34s %9s %9s %10s %9s %7s %12s %14s\n", "case", "read s", "read GB/s", "serving s",
              "GB/s", "ratio", "peak RSS MB", "above empty MB");
  struct Case {
    const char* name;
    bool cold;
  };
  std::vector<Case> cases = {{"warm page cache, first start", false},
                             {"warm page cache, restart", false}};
  if (absl::GetFlag(FLAGS_cold)) {
    cases.push_back({"dropped from the page cache", true});
    cases.push_back({"dropped from the page cache, restart", true});
  }
  int failures = 0;
  for (const Case& c : cases) {
    bool dropped = true;
    if (c.cold) dropped = DropFromPageCache(files);
    const double read = ReadFiles(files, threads);
    if (c.cold) dropped &= DropFromPageCache(files);
    absl::StatusOr<Serving> serving = TimeToServing(dir, log, extra);
    if (!serving.ok()) {
      std::printf("%-34s failed: %s\n", c.name, serving.status().ToString().c_str());
      ++failures;
      continue;
    }
    std::printf("%-34s %9.2f %9.2f %10.2f %9.2f %7.2f %12.0f %14.0f%s\n", c.name, read,
                bytes / read / 1e9, serving->seconds, bytes / serving->seconds / 1e9,
                serving->seconds / read, serving->peak_rss / 1e6,
                (serving->peak_rss - empty->peak_rss) / 1e6,
                c.cold && !dropped ? "  (files stayed cached: tmpfs?)" : "");
    std::printf("    server: %s\n    server: %s\n", serving->loaded.c_str(),
                serving->startup.c_str());
  }
  std::printf(
      "\nratio = time to serving / time to read the files with the same threads "
      "(target <= 1.25); above empty = peak RSS - that of dequantd with no model "
      "(target <= 2 GiB)\n");
  if (absl::GetFlag(FLAGS_check)) {
    const SyntheticModel model = make_model();
    const std::vector<size_t> which = LayersToCheck(model);
    absl::StatusOr<std::unique_ptr<DequantdProcess>> server = DequantdProcess::Start(
        absl::GetFlag(FLAGS_dequantd), dir, absl::GetFlag(FLAGS_backend), "", log, extra);
    absl::StatusOr<std::unique_ptr<DequantClient>> client =
        server.ok() ? DequantClient::Connect((*server)->target()) : server.status();
    const absl::Status checked =
        client.ok() ? CheckServedLayers(**client, model, which) : client.status();
    if (checked.ok()) {
      std::printf(
          "check: %zu of %zu layers (one per model block, every projection, the last) "
          "served bit-exact against the CPU reference\n",
          which.size(), model.names.size());
    } else {
      std::printf("check FAILED: %s\n", checked.ToString().c_str());
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace dequantd::e2e

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("time to serving of a large checkpoint beside its file read");
  absl::ParseCommandLine(argc, argv);
  return dequantd::e2e::Run();
}
