// Per-thread CPU profile from /proc (see thread_profile.h).
#include "bench/e2e/thread_profile.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dequantd::e2e {
namespace {

// utime + stime (fields 14 and 15) of a /proc .../stat line; -1 when it does not read. The
// second field, (comm), may hold spaces: fields are counted after its closing parenthesis.
int64_t StatTicks(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return -1;
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(line.substr(close + 2));
  std::string field;
  int64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {  // field 3 is the state
    if (i == 14) utime = std::atoll(field.c_str());
    if (i == 15) stime = std::atoll(field.c_str());
  }
  return utime + stime;
}

std::string Comm(const std::string& path) {
  std::ifstream in(path);
  std::string name;
  std::getline(in, name);
  return name;
}

}  // namespace

ThreadSnapshot SnapshotThreads(pid_t pid) {
  ThreadSnapshot snapshot;
  const std::string base = absl::StrCat("/proc/", pid);
  snapshot.process_ticks = std::max<int64_t>(0, StatTicks(base + "/stat"));
  DIR* dir = ::opendir((base + "/task").c_str());
  if (dir == nullptr) return snapshot;
  while (const dirent* entry = ::readdir(dir)) {
    const pid_t tid = static_cast<pid_t>(std::atoi(entry->d_name));
    if (tid <= 0) continue;
    const std::string task = absl::StrCat(base, "/task/", tid);
    const int64_t ticks = StatTicks(task + "/stat");
    if (ticks < 0) continue;  // ended while we read
    snapshot.threads[tid] = {Comm(task + "/comm"), ticks};
  }
  ::closedir(dir);
  return snapshot;
}

std::vector<ThreadGroupUsage> Usage(const ThreadSnapshot& before, const ThreadSnapshot& after) {
  const double tick = 1.0 / static_cast<double>(::sysconf(_SC_CLK_TCK));
  std::map<std::string, ThreadGroupUsage> groups;
  int64_t live_ticks = 0;  // the live threads' time inside the interval
  for (const auto& [tid, thread] : after.threads) {
    auto it = before.threads.find(tid);
    const int64_t ticks = thread.ticks - (it == before.threads.end() ? 0 : it->second.ticks);
    live_ticks += ticks;
    if (ticks <= 0) continue;
    ThreadGroupUsage& g = groups[thread.name];
    g.name = thread.name;
    ++g.threads;
    g.cpu_seconds += static_cast<double>(ticks) * tick;
  }
  // Threads that ended inside the interval: the process's total (which keeps ended threads'
  // time) minus what the live ones account for.
  const int64_t ended = (after.process_ticks - before.process_ticks) - live_ticks;
  if (ended > 0) {
    ThreadGroupUsage& g = groups["(ended threads)"];
    g.name = "(ended threads)";
    g.cpu_seconds = static_cast<double>(ended) * tick;
  }
  std::vector<ThreadGroupUsage> out;
  for (auto& [name, g] : groups) out.push_back(g);
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.cpu_seconds > b.cpu_seconds; });
  return out;
}

std::string FormatProfile(
    const std::vector<std::pair<std::string, std::vector<ThreadGroupUsage>>>& processes,
    double wall_seconds) {
  std::string out =
      "| process | thread | threads | CPU s | % of wall |\n|---|---|---:|---:|---:|\n";
  for (const auto& [process, groups] : processes) {
    double total = 0, rest = 0;
    int rest_threads = 0;
    for (const ThreadGroupUsage& g : groups) {
      total += g.cpu_seconds;
      if (wall_seconds > 0 && g.cpu_seconds / wall_seconds < 0.01) {
        rest += g.cpu_seconds;
        rest_threads += g.threads;
        continue;
      }
      absl::StrAppend(&out,
                      absl::StrFormat("| %s | %s | %s | %.3f | %.0f%% |\n", process, g.name,
                                      g.threads > 0 ? absl::StrCat(g.threads) : "-", g.cpu_seconds,
                                      wall_seconds > 0 ? 100 * g.cpu_seconds / wall_seconds : 0.0));
    }
    if (rest > 0) {
      absl::StrAppend(
          &out, absl::StrFormat("| %s | (others, each < 1%%) | %d | %.3f | %.0f%% |\n", process,
                                rest_threads, rest, 100 * rest / wall_seconds));
    }
    absl::StrAppend(&out, absl::StrFormat("| %s | **all** | | %.3f | %.0f%% |\n", process, total,
                                          wall_seconds > 0 ? 100 * total / wall_seconds : 0.0));
  }
  return out;
}

}  // namespace dequantd::e2e
