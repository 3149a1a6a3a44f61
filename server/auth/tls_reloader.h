// TlsReloader: TLS server credentials whose certificate, key and client CA are reloaded from
// their files while the server runs, and a bad file never replaces good ones.
//
// gRPC's FileWatcherCertificateProvider reloads files on an interval, but in gRPC 1.51 it hands
// whatever the files hold to the TLS stack without checking that key and certificate parse and
// match, and it reports no failure to the application. So dequantd watches the operator's
// files itself (FilePoller), checks a changed set with OpenSSL (LoadTlsFiles) and only then
// copies it into a private staging directory ($TMPDIR or /tmp, mode 0700, files 0600) that
// gRPC's provider watches with the same interval. A bad set is logged, counted, and the staged
// (served) files stay as they were. New connections see a new certificate within two
// intervals; established connections keep theirs.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"
#include "server/auth/file_poller.h"
#include "server/auth/tls_files.h"

namespace dequantd::auth {

class TlsReloader {
 public:
  struct Observer {
    // A changed set of files was refused (the old certificate is still served). Thread-safe.
    std::function<void(const absl::Status&)> on_reload_error;
    // A set of files is being served (at start and after each accepted reload). Thread-safe.
    std::function<void(const TlsMaterial&)> on_served;
  };

  // Checks and stages the files, and starts watching them every `refresh_seconds` (1..3600).
  // Errors: LoadTlsFiles' INVALID_ARGUMENT naming the flag and file; INTERNAL when the staging
  // directory cannot be made or written (the message names it and $TMPDIR).
  static absl::StatusOr<std::unique_ptr<TlsReloader>> Start(const TlsFilePaths& paths,
                                                            int refresh_seconds, Observer observer);
  // Stops watching and removes the staging directory. Destroy after the gRPC server.
  ~TlsReloader();

  // The credentials to listen with: TLS 1.2+ with the staged identity; when paths.client_ca is
  // set, clients must present a certificate that the CA verifies (mutual TLS).
  std::shared_ptr<grpc::ServerCredentials> credentials() const { return credentials_; }

  // Checks the files now and stages them when they are good (what the poller does on a change).
  // Returns the check's status. Thread-safe.
  absl::Status ReloadNow();

 private:
  TlsReloader(TlsFilePaths paths, std::string staging_dir, Observer observer);
  absl::Status Stage(const TlsMaterial& material);
  std::string StagedPath(const char* name) const;

  const TlsFilePaths paths_;
  const std::string staging_dir_;
  const Observer observer_;
  std::mutex reload_mu_;  // one reload at a time
  std::shared_ptr<grpc::ServerCredentials> credentials_;
  std::unique_ptr<FilePoller> poller_;  // last member: stopped first
};

}  // namespace dequantd::auth
