// Where the CPU time of a process goes, per thread, over an interval: /proc/PID/task/*/stat
// (utime + stime, clock ticks) and comm (the thread's name) sampled before and after, grouped by
// thread name. Threads that ended inside the interval are not in task/ any more; their time is
// the process's total (/proc/PID/stat, which counts ended threads) minus the live threads', and
// is reported as one group named "(ended threads)". Linux only; a process that cannot be read
// gives an empty snapshot.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dequantd::e2e {

struct ThreadSnapshot {
  struct Thread {
    std::string name;   // comm
    int64_t ticks = 0;  // utime + stime
  };
  std::map<pid_t, Thread> threads;  // by thread id
  int64_t process_ticks = 0;        // the whole process, ended threads included
};

// Reads `pid`'s threads now.
ThreadSnapshot SnapshotThreads(pid_t pid);

// CPU time of one thread name over an interval.
struct ThreadGroupUsage {
  std::string name;
  int threads = 0;         // threads of this name that ran in the interval
  double cpu_seconds = 0;  // their CPU time (user + system)
};

// The interval between two snapshots of one process, grouped by name, busiest first.
std::vector<ThreadGroupUsage> Usage(const ThreadSnapshot& before, const ThreadSnapshot& after);

// A markdown table: process, thread name, threads, CPU s, % of `wall_seconds` (100% = one
// core busy the whole time), for each process's groups; rows under 1% of a core are summed.
std::string FormatProfile(
    const std::vector<std::pair<std::string, std::vector<ThreadGroupUsage>>>& processes,
    double wall_seconds);

}  // namespace dequantd::e2e
