// A per-minute budget of log lines for libraries that log once per request (libprotobuf, gRPC):
// an abusive client must not be able to flood the log, nor stall the server on a log sink that
// cannot keep up (docs/hardening.md, "Refused compressed requests").
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "absl/strings/string_view.h"

namespace dequantd {

// Admits at most `lines_per_minute` lines per key (e.g. a call site "file:line") in each
// one-minute window; the first line admitted for a key in a new window also reports how many
// of that key's lines the previous window dropped. Thread-safe. Holds one entry per key seen
// (keys are call sites: a fixed, small set).
class LogRateLimiter {
 public:
  explicit LogRateLimiter(int lines_per_minute) : lines_per_minute_(lines_per_minute) {}

  struct Decision {
    bool admit = false;
    int64_t dropped_before = 0;  // lines of this key dropped in its previous window (admit only)
  };
  // `now` is a parameter so that tests can step the clock.
  Decision Admit(absl::string_view key,
                 std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());

  int lines_per_minute() const { return lines_per_minute_; }

 private:
  struct Window {
    std::chrono::steady_clock::time_point start;
    int lines = 0;
    int64_t dropped = 0;
  };
  const int lines_per_minute_;
  std::mutex mu_;
  std::map<std::string, Window, std::less<>> windows_;  // guarded by mu_
};

}  // namespace dequantd
