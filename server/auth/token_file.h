// TokenFile: the --auth-tokens file, loaded at start and reloaded while the server runs.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "server/auth/file_poller.h"
#include "server/auth/token_set.h"

namespace dequantd::auth {

class TokenFile {
 public:
  struct Observer {
    // A new set was loaded (at start and after each accepted reload). Thread-safe.
    std::function<void(std::shared_ptr<const TokenSet>)> on_loaded;
    // A changed file was refused; the previous set stays in force. Thread-safe.
    std::function<void(const absl::Status&)> on_reload_error;
  };

  // Reads the file `path` once (an error here is a start-up error) and then every
  // `refresh_seconds` (1..3600) when its stat changed. Errors: INVALID_ARGUMENT naming
  // --auth-tokens, the file and the line (TokenSet::Parse), or that it cannot be read.
  static absl::StatusOr<std::unique_ptr<TokenFile>> Start(const std::string& path,
                                                          int refresh_seconds, Observer observer);

  // Reads and parses the file now; on success reports it through on_loaded, otherwise through
  // on_reload_error. Thread-safe.
  absl::Status ReloadNow();

 private:
  TokenFile(std::string path, Observer observer);
  absl::StatusOr<std::shared_ptr<const TokenSet>> Load() const;

  const std::string path_;
  const Observer observer_;
  std::mutex reload_mu_;
  std::unique_ptr<FilePoller> poller_;  // last member: stopped first
};

}  // namespace dequantd::auth
