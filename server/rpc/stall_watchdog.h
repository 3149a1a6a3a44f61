// --stall-timeout: cancels a call whose write to its client has made no progress for a time
// (a client that stopped reading holds a thread and the result it was being sent; gRPC's flow
// control only bounds what is queued on the connection, not how long the writer waits).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

namespace dequantd {

// One thread that wakes a few times per timeout and runs the cancel function of every write
// blocked for longer than the timeout. Thread-safe.
class StallWatchdog {
 public:
  // `timeout_seconds` > 0. `on_stall` runs (on the watchdog thread) once per cancelled write,
  // e.g. to count it in a metric.
  StallWatchdog(double timeout_seconds, std::function<void()> on_stall);
  ~StallWatchdog();  // joins the thread; every Write guard must be gone by then
  StallWatchdog(const StallWatchdog&) = delete;
  StallWatchdog& operator=(const StallWatchdog&) = delete;

  // Marks one blocking write in progress from construction to destruction. If it lasts longer
  // than the timeout, `cancel` runs once (on the watchdog thread, while the guard still exists,
  // so what `cancel` refers to is alive) and stalled() turns true.
  class Write {
   public:
    Write(StallWatchdog* watchdog, std::function<void()> cancel);  // watchdog may be null
    ~Write();
    Write(const Write&) = delete;
    Write& operator=(const Write&) = delete;
    bool stalled() const;

   private:
    StallWatchdog* const watchdog_;
    uint64_t id_ = 0;
  };

  double timeout_seconds() const { return timeout_.count(); }

 private:
  struct Entry {
    std::chrono::steady_clock::time_point started;
    std::function<void()> cancel;
    bool stalled = false;
  };
  void Run();

  const std::chrono::duration<double> timeout_;
  const std::function<void()> on_stall_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;             // guarded by mu_
  uint64_t next_id_ = 1;              // guarded by mu_
  std::map<uint64_t, Entry> writes_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace dequantd
