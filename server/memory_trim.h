// Gives freed heap memory back to the operating system. glibc keeps what a large call freed in
// its arenas (the probe: idle RSS 743 MB after an abuse burst; malloc_trim(0) brought it to
// 88 MB). A thread checks every `interval` how much free memory the heap holds (mallinfo2) and,
// above a threshold, calls malloc_trim(0). docs/hardening.md has the measurements.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace dequantd {

class MemoryTrimmer {
 public:
  // Free heap bytes above which a check trims.
  static constexpr int64_t kTrimThresholdBytes = int64_t{32} << 20;

  // `interval_seconds` > 0.
  explicit MemoryTrimmer(double interval_seconds);
  ~MemoryTrimmer();  // stops and joins the thread
  MemoryTrimmer(const MemoryTrimmer&) = delete;
  MemoryTrimmer& operator=(const MemoryTrimmer&) = delete;

  // Trims now if the heap holds more than kTrimThresholdBytes free; returns whether it trimmed.
  static bool TrimIfWorthIt();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace dequantd
