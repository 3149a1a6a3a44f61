// MemoryTrimmer (see memory_trim.h).
#include "server/memory_trim.h"

#include <malloc.h>

#include <chrono>

namespace dequantd {

bool MemoryTrimmer::TrimIfWorthIt() {
  const struct mallinfo2 info = ::mallinfo2();
  if (static_cast<int64_t>(info.fordblks) < kTrimThresholdBytes) return false;
  ::malloc_trim(0);
  return true;
}

MemoryTrimmer::MemoryTrimmer(double interval_seconds) {
  const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(interval_seconds));
  thread_ = std::thread([this, interval] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, interval, [this] { return stopping_; })) {
      lock.unlock();
      TrimIfWorthIt();
      lock.lock();
    }
  });
}

MemoryTrimmer::~MemoryTrimmer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

}  // namespace dequantd
