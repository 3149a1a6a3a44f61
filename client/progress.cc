// ProgressLine (see progress.h).
#include "client/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dequantd {
namespace {

// The bar's cells, as tqdm draws them: full blocks, then one of eight partial blocks.
constexpr absl::string_view kFullCell = "\u2588";
constexpr absl::string_view kPartialCells[] = {" ",      "\u258f", "\u258e", "\u258d",
                                               "\u258c", "\u258b", "\u258a", "\u2589"};
constexpr auto kRedrawInterval = std::chrono::milliseconds(100);  // tqdm's mininterval

// `fraction` (0..1) of a bar of `width` cells.
std::string Bar(double fraction, int width) {
  const int eighths = static_cast<int>(std::clamp(fraction, 0.0, 1.0) * width * 8);
  const int full = eighths / 8;
  std::string bar;
  for (int i = 0; i < full; ++i) absl::StrAppend(&bar, kFullCell);
  if (full < width) {
    absl::StrAppend(&bar, kPartialCells[eighths % 8]);
    bar.append(static_cast<size_t>(width - full - 1), ' ');
  }
  return bar;
}

}  // namespace

ProgressOutput ProgressOutput::ForFd(int fd) {
  ProgressOutput output;
  output.terminal = ::isatty(fd) == 1;
  if (winsize size{}; ::ioctl(fd, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) {
    output.columns = size.ws_col;
  }
  output.write = [fd](absl::string_view text) {
    while (!text.empty()) {
      const ssize_t n = ::write(fd, text.data(), text.size());
      if (n <= 0) return;  // a progress line is not worth an error
      text.remove_prefix(static_cast<size_t>(n));
    }
  };
  return output;
}

std::string FormatProgressSize(double value) {
  for (const char* unit : {"", "k", "M", "G", "T", "P", "E", "Z"}) {
    if (std::abs(value) < 999.5) {
      if (std::abs(value) < 9.995) return absl::StrFormat("%1.2f%s", value, unit);
      if (std::abs(value) < 99.95) return absl::StrFormat("%2.1f%s", value, unit);
      return absl::StrFormat("%3.0f%s", value, unit);
    }
    value /= 1024;
  }
  return absl::StrFormat("%3.1fY", value);
}

std::string FormatProgressInterval(double seconds) {
  const int64_t whole = seconds > 0 ? static_cast<int64_t>(seconds) : 0;
  const int64_t h = whole / 3600, m = whole / 60 % 60, s = whole % 60;
  return h > 0 ? absl::StrFormat("%d:%02d:%02d", h, m, s) : absl::StrFormat("%02d:%02d", m, s);
}

std::string FormatProgressLine(absl::string_view label, int64_t bytes, int64_t total_bytes,
                               double seconds, int columns) {
  const double rate = seconds > 0 ? static_cast<double>(bytes) / seconds : 0;
  const std::string rate_text = rate > 0 ? absl::StrCat(FormatProgressSize(rate), "B/s") : "?B/s";
  if (total_bytes <= 0) {
    return absl::StrCat(label, ": ", FormatProgressSize(static_cast<double>(bytes)), " [",
                        FormatProgressInterval(seconds), ", ", rate_text, "]");
  }
  const double fraction = static_cast<double>(bytes) / static_cast<double>(total_bytes);
  const std::string remaining =
      rate > 0 ? FormatProgressInterval(static_cast<double>(total_bytes - bytes) / rate) : "?";
  const std::string left = absl::StrFormat("%s: %3.0f%%", label, fraction * 100);
  const std::string right =
      absl::StrCat(" ", FormatProgressSize(static_cast<double>(bytes)), "/",
                   FormatProgressSize(static_cast<double>(total_bytes)), " [",
                   FormatProgressInterval(seconds), "<", remaining, ", ", rate_text, "]");
  // The last column stays free: a line that fills it wraps on some terminals.
  const int bar_width = columns - 1 - static_cast<int>(left.size() + right.size()) - 2;
  if (bar_width < 1) return absl::StrCat(left, right);
  return absl::StrCat(left, "|", Bar(fraction, bar_width), "|", right);
}

ProgressLine::ProgressLine(ProgressOutput output, std::string label, int64_t total_bytes)
    : output_(std::move(output)),
      label_(std::move(label)),
      total_bytes_(total_bytes),
      start_(output_.now()) {}

ProgressLine::~ProgressLine() {
  std::lock_guard<std::mutex> lock(mu_);
  if (drawn_ && !finished_) output_.write("\n");
}

void ProgressLine::Add(int64_t bytes) {
  if (!output_.terminal) return;
  bytes_.fetch_add(bytes, std::memory_order_relaxed);
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || finished_) return;  // another thread is drawing
  if (drawn_ && output_.now() - last_draw_ < kRedrawInterval) return;
  Draw(/*last=*/false);
}

void ProgressLine::Finish() {
  if (!output_.terminal) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  Draw(/*last=*/true);
  finished_ = true;
}

void ProgressLine::Draw(bool last) {
  last_draw_ = output_.now();
  const double seconds = std::chrono::duration<double>(last_draw_ - start_).count();
  std::string line = FormatProgressLine(label_, bytes_.load(std::memory_order_relaxed),
                                        total_bytes_, seconds, output_.columns);
  // Display width: every cell of the bar is one column, however many bytes it takes in UTF-8.
  const size_t length = static_cast<size_t>(
      std::count_if(line.begin(), line.end(), [](char c) { return (c & 0xC0) != 0x80; }));
  std::string text = absl::StrCat("\r", line);
  if (length < last_length_) text.append(last_length_ - length, ' ');  // the longer line before
  if (last) text.push_back('\n');
  output_.write(text);
  last_length_ = length;
  drawn_ = true;
}

}  // namespace dequantd
