// The phases of dequantd's start (issue 22): each phase's begin and end in seconds since the
// process was executed, so phases that overlap (the checkpoint index beside CUDA's start) show
// as overlapping, and the time before DequantServer::Start (exec, dynamic loading, flags) shows
// too. Logged as one "startup phases" line when the server is ready; tests never assert on it.
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

namespace dequantd {

// Thread-safe: phases may be recorded from several threads at once.
class StartupTimeline {
 public:
  using Clock = std::chrono::steady_clock;

  // Time zero is the process's start (/proc/self/stat, 10 ms resolution); where that cannot be
  // read, the construction.
  StartupTimeline();

  // Records phase `name` from `begin` to `end`.
  void Add(std::string name, Clock::time_point begin, Clock::time_point end);

  // Records the phase from its construction to its destruction (or End).
  class Phase {
   public:
    Phase(StartupTimeline* timeline, std::string name)
        : timeline_(timeline), name_(std::move(name)), begin_(Clock::now()) {}
    Phase(const Phase&) = delete;
    Phase& operator=(const Phase&) = delete;
    ~Phase() { End(); }
    void End() {
      if (timeline_ != nullptr) timeline_->Add(std::move(name_), begin_, Clock::now());
      timeline_ = nullptr;
    }

   private:
    StartupTimeline* timeline_;  // null once ended; may be null (nothing recorded)
    std::string name_;
    Clock::time_point begin_;
  };

  // Seconds since time zero at `t`.
  double SecondsAt(Clock::time_point t) const;

  // "exec..start 0.000-0.041, checkpoint index 0.041-0.055, ..." in the order the phases began,
  // seconds since exec.
  std::string Describe() const;

 private:
  struct Entry {
    std::string name;
    Clock::time_point begin, end;
  };
  Clock::time_point zero_;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;  // guarded by mu_
};

}  // namespace dequantd
