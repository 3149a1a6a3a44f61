// TlsReloader (see tls_reloader.h).
#include "server/auth/tls_reloader.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dequantd::auth {
namespace {

constexpr char kKeyFile[] = "key.pem";
constexpr char kCertFile[] = "cert.pem";
constexpr char kCaFile[] = "client_ca.pem";

// Writes `contents` to `path` atomically (a 0600 temporary file in the same directory, then
// rename), so that a reader sees the old or the new file, never a part.
absl::Status WriteAtomically(const std::string& path, const std::string& contents) {
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  }
  size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n = write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      close(fd);
      return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(err)));
    }
    written += static_cast<size_t>(n);
  }
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> MakeStagingDir() {
  const char* tmpdir = getenv("TMPDIR");
  std::string pattern =
      absl::StrCat(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp", "/dequantd-tls-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {  // mode 0700
    return absl::InternalError(
        absl::StrCat("cannot make the TLS staging directory ", pattern, " (", std::strerror(errno),
                     "); set $TMPDIR to a writable directory (Kubernetes: an emptyDir volume)"));
  }
  return pattern;
}

}  // namespace

TlsReloader::TlsReloader(TlsFilePaths paths, std::string staging_dir, Observer observer)
    : paths_(std::move(paths)),
      staging_dir_(std::move(staging_dir)),
      observer_(std::move(observer)) {}

TlsReloader::~TlsReloader() {
  poller_.reset();
  std::error_code ec;
  std::filesystem::remove_all(staging_dir_, ec);
}

std::string TlsReloader::StagedPath(const char* name) const {
  return absl::StrCat(staging_dir_, "/", name);
}

absl::Status TlsReloader::Stage(const TlsMaterial& material) {
  // The CA first, then the key and the certificate as close together as possible: gRPC's
  // provider re-reads a pair whose modification times changed while it read them.
  if (!paths_.client_ca.empty()) {
    if (absl::Status s = WriteAtomically(StagedPath(kCaFile), material.client_ca_pem); !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = WriteAtomically(StagedPath(kKeyFile), material.key_pem); !s.ok()) return s;
  return WriteAtomically(StagedPath(kCertFile), material.cert_pem);
}

absl::Status TlsReloader::ReloadNow() {
  std::lock_guard<std::mutex> lock(reload_mu_);
  absl::StatusOr<TlsMaterial> material = LoadTlsFiles(paths_);
  absl::Status status = material.ok() ? Stage(*material) : material.status();
  if (!status.ok()) {
    if (observer_.on_reload_error) observer_.on_reload_error(status);
    return status;
  }
  if (observer_.on_served) observer_.on_served(*material);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TlsReloader>> TlsReloader::Start(const TlsFilePaths& paths,
                                                                int refresh_seconds,
                                                                Observer observer) {
  const bool mutual = !paths.client_ca.empty();
  std::vector<std::string> watched = {paths.cert, paths.key};
  if (mutual) watched.push_back(paths.client_ca);
  std::string baseline = FilePoller::Snapshot(watched);  // before the read: no change is missed
  absl::StatusOr<TlsMaterial> material = LoadTlsFiles(paths);
  if (!material.ok()) return material.status();
  absl::StatusOr<std::string> dir = MakeStagingDir();
  if (!dir.ok()) return dir.status();
  std::unique_ptr<TlsReloader> reloader(new TlsReloader(paths, *dir, std::move(observer)));
  if (absl::Status s = reloader->Stage(*material); !s.ok()) return s;
  if (reloader->observer_.on_served) reloader->observer_.on_served(*material);

  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      reloader->StagedPath(kKeyFile), reloader->StagedPath(kCertFile),
      mutual ? reloader->StagedPath(kCaFile) : std::string(),
      static_cast<unsigned int>(refresh_seconds));
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (mutual) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  reloader->credentials_ = grpc::experimental::TlsServerCredentials(options);

  TlsReloader* self = reloader.get();
  reloader->poller_ = std::make_unique<FilePoller>(
      std::move(watched), std::chrono::seconds(refresh_seconds),
      [self] { (void)self->ReloadNow(); }, std::move(baseline));
  return reloader;
}

}  // namespace dequantd::auth
