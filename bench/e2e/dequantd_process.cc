// DequantdProcess (see dequantd_process.h).
#include "bench/e2e/dequantd_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/client.h"

namespace dequantd::e2e {

std::string DefaultDequantdBinary(const char* build_path) {
  const char* env = std::getenv("DEQUANTD");
  return env != nullptr && *env != '\0' ? env : build_path;
}

namespace {

// A port nothing listens on now (bound to port 0, then released).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DequantdProcess>> DequantdProcess::Start(
    const std::string& binary, const std::string& model_dir, const std::string& backend,
    const std::string& unix_socket, const std::string& log_path,
    const std::vector<std::string>& extra_args) {
  std::vector<std::string> args = {binary, "--model=" + model_dir, "--backend=" + backend,
                                   "--metrics-listen="};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  return StartCommand(std::move(args), "--listen", unix_socket, log_path);
}

absl::StatusOr<std::unique_ptr<DequantdProcess>> DequantdProcess::StartCommand(
    std::vector<std::string> args, const std::string& listen_flag, const std::string& unix_socket,
    const std::string& log_path) {
  auto process = std::make_unique<DequantdProcess>();
  process->target_ = unix_socket.empty() ? absl::StrCat("127.0.0.1:", FreePort())
                                         : absl::StrCat("unix:", unix_socket);
  args.push_back(listen_flag + "=" + process->target_);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  process->pid_ = ::fork();
  if (process->pid_ < 0) return absl::InternalError("fork failed");
  if (process->pid_ == 0) {
    // The server goes when the bench does, even when the bench is killed (no destructor runs
    // then): SIGTERM when the forking thread, the bench's main thread, exits.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);  // the bench died before the prctl
    const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(log, 1);
    ::dup2(log, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (std::chrono::steady_clock::now() < give_up) {
    int status = 0;
    if (::waitpid(process->pid_, &status, WNOHANG) == process->pid_) {
      process->pid_ = -1;
      return absl::UnavailableError(
          absl::StrCat(args[0], " exited at start-up (status ", status, "); see ", log_path));
    }
    // A new channel per attempt: one channel's reconnect backoff (1 s, 1.6 s, 2.6 s, ...) after
    // the refused first connection would add seconds to a measured time to serving.
    absl::StatusOr<std::unique_ptr<DequantClient>> client =
        DequantClient::Connect(process->target_);
    if (!client.ok()) return client.status();
    absl::StatusOr<v1::GetServerInfoResponse> info = (*client)->GetServerInfo();
    if (info.ok() || info.status().code() == absl::StatusCode::kUnimplemented) {
      process->backend_ = info.ok() ? info->backend() : "";
      return process;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::UnavailableError(absl::StrCat(args[0], " did not answer in 300 s; see ", log_path));
}

DequantdProcess::~DequantdProcess() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  int status = 0;
  ::waitpid(pid_, &status, 0);
}

}  // namespace dequantd::e2e
