// Per-key log line budget (see log_rate_limit.h).
#include "server/rpc/log_rate_limit.h"

namespace dequantd {

LogRateLimiter::Decision LogRateLimiter::Admit(absl::string_view key,
                                               std::chrono::steady_clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = windows_.find(key);
  if (it == windows_.end()) it = windows_.emplace(std::string(key), Window{now, 0, 0}).first;
  Window& w = it->second;
  Decision decision;
  if (now - w.start >= std::chrono::minutes(1)) {
    decision.dropped_before = w.dropped;
    w = Window{now, 0, 0};
  }
  if (w.lines >= lines_per_minute_) {
    ++w.dropped;
    return Decision{};
  }
  ++w.lines;
  decision.admit = true;
  return decision;
}

}  // namespace dequantd
