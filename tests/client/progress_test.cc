// ProgressLine and its formatting (client/progress.h): tqdm's sizes and intervals, the line fitted
// to the terminal, redraws at most every 0.1 s of an injected clock, and no output at all where
// the descriptor is not a terminal (a pipe) while a pseudo-terminal gets the line.
#include "client/progress.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dequantd {
namespace {

using std::chrono::milliseconds;

constexpr int64_t kMiB = int64_t{1} << 20;

std::string Repeat(absl::string_view cell, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) absl::StrAppend(&s, cell);
  return s;
}

TEST(ProgressFormatTest, SizesHaveThreeDigitsInUnitsOf1024) {
  EXPECT_EQ(FormatProgressSize(0), "0.00");
  EXPECT_EQ(FormatProgressSize(9.99), "9.99");
  EXPECT_EQ(FormatProgressSize(12.34), "12.3");
  EXPECT_EQ(FormatProgressSize(999), "999");
  EXPECT_EQ(FormatProgressSize(1000), "0.98k");
  EXPECT_EQ(FormatProgressSize(1024), "1.00k");
  EXPECT_EQ(FormatProgressSize(123456789), "118M");
  EXPECT_EQ(FormatProgressSize(5.0 * (int64_t{1} << 30)), "5.00G");
  EXPECT_EQ(FormatProgressSize(137e9), "128G");
}

TEST(ProgressFormatTest, IntervalsAreMinutesAndSecondsThenHours) {
  EXPECT_EQ(FormatProgressInterval(0), "00:00");
  EXPECT_EQ(FormatProgressInterval(-1), "00:00");
  EXPECT_EQ(FormatProgressInterval(61.9), "01:01");
  EXPECT_EQ(FormatProgressInterval(3599), "59:59");
  EXPECT_EQ(FormatProgressInterval(3600), "1:00:00");
  EXPECT_EQ(FormatProgressInterval(90061), "25:01:01");
}

TEST(ProgressFormatTest, LineFillsTheTerminalWithTheBar) {
  // 512 MiB of 1 GiB after 2 s: half the bar, 2 s to go at 256 MiB/s; 59 columns used of 60.
  const std::string line = FormatProgressLine("x", 512 * kMiB, 1024 * kMiB, 2.0, 60);
  EXPECT_EQ(line,
            "x:  50%|\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588        | 512M/1.00G "
            "[00:02<00:02, 256MB/s]");
  // A partial cell: 1/3 of 20 cells is 6 full and 5/8 of the seventh.
  EXPECT_EQ(FormatProgressLine("x", 100, 300, 1.0, 60),
            "x:  33%|\u2588\u2588\u2588\u2588\u2588\u2588\u258b             | 100/300 "
            "[00:01<00:02, 100B/s]");
  EXPECT_EQ(FormatProgressLine("x", 300, 300, 3.0, 60),
            absl::StrCat("x: 100%|", Repeat("\u2588", 20), "| 300/300 [00:03<00:00, 100B/s]"));
}

TEST(ProgressFormatTest, NarrowTerminalDropsTheBar) {
  EXPECT_EQ(FormatProgressLine("model.layers.0.mlp.down_proj", 512 * kMiB, 1024 * kMiB, 2.0, 40),
            "model.layers.0.mlp.down_proj:  50% 512M/1.00G [00:02<00:02, 256MB/s]");
}

TEST(ProgressFormatTest, NothingYetMeansUnknownRateAndRemainingTime) {
  EXPECT_EQ(FormatProgressLine("x", 0, 1024, 0.0, 20), "x:   0% 0.00/1.00k [00:00<?, ?B/s]");
}

TEST(ProgressFormatTest, UnknownTotalShowsBytesTimeAndRate) {
  EXPECT_EQ(FormatProgressLine("210 layers", 3 * kMiB, 0, 1.5, 80),
            "210 layers: 3.00M [00:01, 2.00MB/s]");
}

// A terminal of 50 columns whose text and clock the test holds.
struct FakeTerminal {
  std::string text;
  std::chrono::steady_clock::time_point now{};
  ProgressOutput Output(bool terminal = true) {
    ProgressOutput output;
    output.terminal = terminal;
    output.columns = 50;
    output.write = [this](absl::string_view s) { absl::StrAppend(&text, s); };
    output.now = [this] { return now; };
    return output;
  }
};

TEST(ProgressLineTest, RedrawsInPlaceAtMostEveryTenthOfASecondAndEndsWithANewline) {
  FakeTerminal terminal;
  ProgressLine line(terminal.Output(), "x", 400);
  terminal.now += milliseconds(1000);
  line.Add(100);  // the first bytes: drawn at once
  EXPECT_EQ(terminal.text, "\rx:  25%|\u2588\u2588\u258c       | 100/400 [00:01<00:03, 100B/s]");
  terminal.text.clear();
  terminal.now += milliseconds(99);
  line.Add(100);  // within 0.1 s of the last draw: not drawn
  EXPECT_EQ(terminal.text, "");
  terminal.now += milliseconds(901);
  line.Add(100);
  EXPECT_EQ(terminal.text, absl::StrCat("\rx:  75%|", Repeat("\u2588", 7),
                                        "\u258c  | 300/400 [00:02<00:00, 150B/s]"));
  terminal.text.clear();
  terminal.now += milliseconds(50);
  line.Add(100);  // not drawn, but Finish draws the final state, then the newline
  EXPECT_EQ(terminal.text, "");
  line.Finish();
  EXPECT_EQ(terminal.text,
            absl::StrCat("\rx: 100%|", Repeat("\u2588", 10), "| 400/400 [00:02<00:00, 195B/s]\n"));
  terminal.text.clear();
  line.Finish();
  line.Add(1);
  EXPECT_EQ(terminal.text, "") << "nothing after Finish";
}

TEST(ProgressLineTest, AShorterLineBlanksTheRestOfTheLongerOne) {
  FakeTerminal terminal;
  ProgressLine line(terminal.Output(), "x", 0);
  terminal.now += milliseconds(1000);
  line.Add(2000);  // "x: 1.95k [00:01, 1.95kB/s]": 26 columns
  terminal.text.clear();
  terminal.now += milliseconds(9000);
  line.Add(0);  // "x: 1.95k [00:10, 200B/s]": 24 columns, then 2 blanks
  EXPECT_EQ(terminal.text, "\rx: 1.95k [00:10, 200B/s]  ");
}

TEST(ProgressLineTest, AnUnfinishedLineIsEndedWhenDestroyed) {
  FakeTerminal terminal;
  {
    ProgressLine line(terminal.Output(), "x", 10);
    line.Add(5);
  }
  EXPECT_EQ(terminal.text.back(), '\n');
  terminal.text.clear();
  { ProgressLine unused(terminal.Output(), "x", 10); }  // never drawn: nothing to end
  EXPECT_EQ(terminal.text, "");
}

TEST(ProgressLineTest, NotATerminalWritesNothing) {
  FakeTerminal terminal;
  {
    ProgressLine line(terminal.Output(/*terminal=*/false), "x", 10);
    line.Add(5);
    line.Add(5);
    line.Finish();
  }
  EXPECT_EQ(terminal.text, "");
}

TEST(ProgressOutputTest, APipeIsNotATerminalAndGetsNothing) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_NONBLOCK), 0);
  const ProgressOutput output = ProgressOutput::ForFd(fds[1]);
  EXPECT_FALSE(output.terminal);
  {
    ProgressLine line(output, "x", 10);
    line.Add(10);
    line.Finish();
  }
  char buffer[64];
  EXPECT_EQ(::read(fds[0], buffer, sizeof(buffer)), -1) << "the pipe got bytes";
  EXPECT_EQ(errno, EAGAIN);
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST(ProgressOutputTest, APseudoTerminalGetsTheLine) {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0) GTEST_SKIP() << "no pseudo-terminals here";
  ASSERT_EQ(::grantpt(master), 0);
  ASSERT_EQ(::unlockpt(master), 0);
  const int terminal = ::open(::ptsname(master), O_RDWR | O_NOCTTY);
  ASSERT_GE(terminal, 0);
  ProgressOutput output = ProgressOutput::ForFd(terminal);
  EXPECT_TRUE(output.terminal);
  output.columns = 60;  // whatever the new terminal says: room for a bar
  {
    ProgressLine line(output, "x", 10);
    line.Add(10);
  }
  std::string received;
  char buffer[256];
  ::fcntl(master, F_SETFL, O_NONBLOCK);
  for (ssize_t n; (n = ::read(master, buffer, sizeof(buffer))) > 0;) received.append(buffer, n);
  // The line discipline turns the final "\n" into "\r\n".
  EXPECT_EQ(received.substr(0, 9), "\rx: 100%|");
  EXPECT_EQ(received.substr(received.size() - 2), "\r\n");
  ::close(terminal);
  ::close(master);
}

}  // namespace
}  // namespace dequantd
