// A real dequantd process for the end-to-end benchmark (or any server of dequant.v1, e.g. the raw
// stream ceiling in its own process): started with fork/exec on a free 127.0.0.1 port (or a Unix
// socket), ready once GetServerInfo answers (UNIMPLEMENTED counts as an answer), stopped with
// SIGTERM.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dequantd::e2e {

// The dequantd binary a bench runs unless its --dequantd flag says otherwise: $DEQUANTD when set
// and not empty (as on the GPU host, where the build tree's path does not exist), else
// `build_path` (the build's DEQUANTD_PATH).
std::string DefaultDequantdBinary(const char* build_path);

class DequantdProcess {
 public:
  // Runs `binary` --model `model_dir` --backend `backend` --metrics-listen= --listen <address>
  // plus `extra_args`, output to `log_path`. `unix_socket` empty: a free TCP port on 127.0.0.1.
  // Waits (up to 300 s) until it answers. Errors: INTERNAL (fork/exec), UNAVAILABLE (it exited
  // or never answered; the log's path is named).
  static absl::StatusOr<std::unique_ptr<DequantdProcess>> Start(
      const std::string& binary, const std::string& model_dir, const std::string& backend,
      const std::string& unix_socket, const std::string& log_path,
      const std::vector<std::string>& extra_args = {});
  // Runs `argv` plus `listen_flag`=<address> (address as for Start). Errors: as Start.
  static absl::StatusOr<std::unique_ptr<DequantdProcess>> StartCommand(
      std::vector<std::string> argv, const std::string& listen_flag, const std::string& unix_socket,
      const std::string& log_path);
  ~DequantdProcess();  // SIGTERM, then waits for the exit

  pid_t pid() const { return pid_; }

  const std::string& target() const { return target_; }  // "127.0.0.1:PORT" or "unix:PATH"
  std::string backend() const { return backend_; }       // from GetServerInfo

 private:
  pid_t pid_ = -1;
  std::string target_;
  std::string backend_;
};

}  // namespace dequantd::e2e
