// StartupTimeline (see startup_timeline.h).
#include "server/model/startup_timeline.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_format.h"

namespace dequantd {
namespace {

// Seconds since the process started (field 22 of /proc/self/stat, clock ticks since boot,
// against CLOCK_BOOTTIME); negative when unreadable.
double SecondsSinceExec() {
  std::ifstream in("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The command name (field 2) is in parentheses and may hold spaces: count after its ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i < 22 && fields >> field; ++i) {
  }
  unsigned long long start_ticks = 0;
  if (!(fields >> start_ticks)) return -1;
  const long ticks = ::sysconf(_SC_CLK_TCK);
  timespec now{};
  if (ticks <= 0 || ::clock_gettime(CLOCK_BOOTTIME, &now) != 0) return -1;
  const double seconds = static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9 -
                         static_cast<double>(start_ticks) / static_cast<double>(ticks);
  return seconds >= 0 ? seconds : -1;
}

}  // namespace

StartupTimeline::StartupTimeline() {
  const Clock::time_point now = Clock::now();
  const double since_exec = SecondsSinceExec();
  zero_ = now - std::chrono::duration_cast<Clock::duration>(
                    std::chrono::duration<double>(std::max(0.0, since_exec)));
  if (since_exec >= 0) Add("exec..start", zero_, now);
}

void StartupTimeline::Add(std::string name, Clock::time_point begin, Clock::time_point end) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.push_back(Entry{.name = std::move(name), .begin = begin, .end = end});
}

double StartupTimeline::SecondsAt(Clock::time_point t) const {
  return std::chrono::duration<double>(t - zero_).count();
}

std::string StartupTimeline::Describe() const {
  std::vector<Entry> entries;
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries = entries_;
  }
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  std::string text;
  for (const Entry& e : entries) {
    absl::StrAppendFormat(&text, "%s%s %.3f-%.3f", text.empty() ? "" : ", ", e.name,
                          SecondsAt(e.begin), SecondsAt(e.end));
  }
  return text;
}

}  // namespace dequantd
