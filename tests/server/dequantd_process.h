// DequantdProcess: the dequantd binary (DequantdBinary: $DEQUANTD when set, as on the GPU host
// where the build tree's path does not exist, else DEQUANTD_PATH, a compile definition of the
// test target) run as a child process whose output the test reads. Shared by server_test and the
// hardening and soak tests.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace dequantd::testing {

// The dequantd binary the tests run: $DEQUANTD when set and not empty, else the build's.
inline std::string DequantdBinary() {
  const char* env = std::getenv("DEQUANTD");
  return env != nullptr && *env != '\0' ? env : DEQUANTD_PATH;
}

// A running dequantd child process; its stdout and stderr go to a pipe read by the test. The
// child gets alarm(30) before exec (a pending alarm survives exec): a dequantd that does not
// stop on the signals a test sends dies of SIGALRM after 30 s, so a regression fails rather
// than hangs (`alarm_seconds` changes the 30 s).
class DequantdProcess {
 public:
  explicit DequantdProcess(const std::vector<std::string>& args, unsigned alarm_seconds = 30) {
    std::vector<std::string> words = {DequantdBinary()};
    words.insert(words.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& word : words) argv.push_back(word.data());
    argv.push_back(nullptr);
    int fds[2];
    if (::pipe(fds) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {  // the child: only async-signal-safe calls before exec
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      ::close(fds[0]);
      ::close(fds[1]);
      ::alarm(alarm_seconds);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    fd_ = fds[0];
  }
  DequantdProcess(const DequantdProcess&) = delete;
  DequantdProcess& operator=(const DequantdProcess&) = delete;
  ~DequantdProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }

  pid_t pid() const { return pid_; }
  const std::string& output() const { return output_; }

  // Reads the output until it contains `text` (true) or the pipe is closed (false).
  bool ReadUntil(const std::string& text) {
    while (output_.find(text) == std::string::npos) {
      char buf[4096];
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) return false;
      output_.append(buf, static_cast<size_t>(n));
    }
    return true;
  }

  // Reads the output to its end and waits for the process: its exit code, or 128 + the number
  // of the signal that killed it (as a shell reports it).
  int Wait() {
    ReadUntil(std::string(1, '\0'));  // never in the output: reads to the end
    int status = 0;
    if (::waitpid(pid_, &status, 0) != pid_) return -1;
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // The gRPC port from the "listening on HOST:PORT " line, after waiting for it; 0 if none.
  int ListeningPort() {
    const std::string marker = "listening on 127.0.0.1:";
    if (!ReadUntil(marker) || !ReadUntil(" backend=")) return 0;
    return std::atoi(output_.c_str() + output_.find(marker) + marker.size());
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string output_;
};

}  // namespace dequantd::testing
