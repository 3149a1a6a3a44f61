// A progress line for long dequantctl calls, in the style of the Python client's tqdm bar
// (client/python/src/dequantd/client.py, _Progress: unit "B", unit_scale, unit_divisor 1024):
//
//   model.layers.0.mlp.down_proj:  45%|█████████▍           | 52.3M/117M [00:02<00:03, 21.4MB/s]
//
// label, percent, bar, bytes so far / total, [elapsed<remaining, rate]; sizes and rates in units
// of 1024 (k, M, G, T). The line is redrawn in place ('\r') at most every 0.1 s and ended with a
// newline. It is drawn only where the output is a terminal: with stderr redirected to a file or a
// pipe nothing is written, so scripts and logs stay clean.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "absl/strings/string_view.h"

namespace dequantd {

// `dequantize` shows a line for results of at least this many bytes (a 64 MiB result takes about
// 0.1 s over loopback, seconds over a network); `dequantize-layers` always does.
inline constexpr int64_t kProgressMinBytes = int64_t{64} << 20;

// Where a progress line goes. The default draws nothing (terminal false): what the client
// library and the tests get unless they ask.
struct ProgressOutput {
  bool terminal = false;                         // draw at all
  std::function<void(absl::string_view)> write;  // appends text to the terminal
  int columns = 80;                              // the terminal's width in characters
  std::function<std::chrono::steady_clock::time_point()> now = std::chrono::steady_clock::now;

  // For file descriptor `fd` (dequantctl: STDERR_FILENO): terminal iff isatty(fd), its width from
  // TIOCGWINSZ (80 when unknown), written with write(2).
  static ProgressOutput ForFd(int fd);
};

// tqdm's format_sizeof with divisor 1024: 3 significant digits and a unit letter,
// e.g. 999 -> "999", 1000 -> "0.98k", 123456789 -> "118M".
std::string FormatProgressSize(double value);
// tqdm's format_interval: "MM:SS", or "H:MM:SS" from an hour on; whole seconds.
std::string FormatProgressInterval(double seconds);
// One line: `bytes` of `total_bytes` (0: unknown, then no percent, bar or remaining time) after
// `seconds`, fitted to `columns` characters by the width of the bar (none when the rest does not
// leave room for one).
std::string FormatProgressLine(absl::string_view label, int64_t bytes, int64_t total_bytes,
                               double seconds, int columns);

// The line of one call. Thread-safe: Add may be called from several threads at once (the parallel
// streams of a ranged fetch); one of them redraws.
class ProgressLine {
 public:
  // `total_bytes`: the result's size; 0 = unknown. The clock starts now.
  ProgressLine(ProgressOutput output, std::string label, int64_t total_bytes);
  // Ends the line with a newline if one was drawn and Finish was not called (a failed call: its
  // error goes on the next line).
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // `bytes` more bytes arrived; redraws when 0.1 s has passed since the last draw (or none yet).
  void Add(int64_t bytes);
  // Draws the final state and ends the line (once; later calls do nothing).
  void Finish();

 private:
  void Draw(bool last);  // with mu_ held

  const ProgressOutput output_;
  const std::string label_;
  const int64_t total_bytes_;
  const std::chrono::steady_clock::time_point start_;
  std::atomic<int64_t> bytes_{0};
  std::mutex mu_;
  std::chrono::steady_clock::time_point last_draw_;  // guarded by mu_
  size_t last_length_ = 0;                           // guarded by mu_: of the line drawn last
  bool drawn_ = false;                               // guarded by mu_
  bool finished_ = false;                            // guarded by mu_
};

}  // namespace dequantd
