// TokenFile (see token_file.h).
#include "server/auth/token_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dequantd::auth {

TokenFile::TokenFile(std::string path, Observer observer)
    : path_(std::move(path)), observer_(std::move(observer)) {}

absl::StatusOr<std::shared_ptr<const TokenSet>> TokenFile::Load() const {
  std::ifstream in(path_, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth-tokens ", path_, ": cannot read (", std::strerror(errno), ")"));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  absl::StatusOr<TokenSet> set = TokenSet::Parse(contents.str());
  if (!set.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth-tokens ", path_, ": ", set.status().message()));
  }
  return std::make_shared<const TokenSet>(std::move(*set));
}

absl::Status TokenFile::ReloadNow() {
  std::lock_guard<std::mutex> lock(reload_mu_);
  absl::StatusOr<std::shared_ptr<const TokenSet>> set = Load();
  if (!set.ok()) {
    if (observer_.on_reload_error) observer_.on_reload_error(set.status());
    return set.status();
  }
  if (observer_.on_loaded) observer_.on_loaded(*set);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TokenFile>> TokenFile::Start(const std::string& path,
                                                            int refresh_seconds,
                                                            Observer observer) {
  std::unique_ptr<TokenFile> file(new TokenFile(path, std::move(observer)));
  std::string baseline = FilePoller::Snapshot({path});  // before the read: no change is missed
  absl::StatusOr<std::shared_ptr<const TokenSet>> set = file->Load();
  if (!set.ok()) return set.status();
  if (file->observer_.on_loaded) file->observer_.on_loaded(*set);
  TokenFile* self = file.get();
  file->poller_ = std::make_unique<FilePoller>(
      std::vector<std::string>{path}, std::chrono::seconds(refresh_seconds),
      [self] { (void)self->ReloadNow(); }, std::move(baseline));
  return file;
}

}  // namespace dequantd::auth
