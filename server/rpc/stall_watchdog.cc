// The stall watchdog (see stall_watchdog.h).
#include "server/rpc/stall_watchdog.h"

#include <algorithm>
#include <utility>

namespace dequantd {

StallWatchdog::StallWatchdog(double timeout_seconds, std::function<void()> on_stall)
    : timeout_(timeout_seconds), on_stall_(std::move(on_stall)) {
  thread_ = std::thread([this] { Run(); });
}

StallWatchdog::~StallWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StallWatchdog::Run() {
  // Checks four times per timeout (at most once a second): a stalled write is cancelled between
  // 1 and 1.25 timeouts after it started.
  const auto period = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::min<std::chrono::duration<double>>(timeout_ / 4, std::chrono::seconds(1)));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, period);
    const auto now = std::chrono::steady_clock::now();
    for (auto& [id, entry] : writes_) {
      if (entry.stalled || now - entry.started < timeout_) continue;
      entry.stalled = true;
      entry.cancel();  // under mu_: the guard, and what cancel refers to, cannot go away
      if (on_stall_) on_stall_();
    }
  }
}

StallWatchdog::Write::Write(StallWatchdog* watchdog, std::function<void()> cancel)
    : watchdog_(watchdog) {
  if (watchdog_ == nullptr) return;
  std::lock_guard<std::mutex> lock(watchdog_->mu_);
  id_ = watchdog_->next_id_++;
  watchdog_->writes_.emplace(id_, Entry{std::chrono::steady_clock::now(), std::move(cancel)});
}

StallWatchdog::Write::~Write() {
  if (watchdog_ == nullptr) return;
  std::lock_guard<std::mutex> lock(watchdog_->mu_);
  watchdog_->writes_.erase(id_);
}

bool StallWatchdog::Write::stalled() const {
  if (watchdog_ == nullptr) return false;
  std::lock_guard<std::mutex> lock(watchdog_->mu_);
  const auto it = watchdog_->writes_.find(id_);
  return it != watchdog_->writes_.end() && it->second.stalled;
}

}  // namespace dequantd
