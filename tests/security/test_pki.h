// Certificates for the security tests, made with the openssl command-line tool in a temporary
// directory: CAs, and server/client certificates (EC P-256, 2 days) signed by them. Server
// certificates name DNS:localhost and IP:127.0.0.1.
#pragma once

#include <string>

namespace dequantd::testing {

struct CertFiles {
  std::string cert;  // PEM certificate
  std::string key;   // PEM private key
};

class TestPki {
 public:
  // Files go under `dir`.<pid> (created; removed by the destructor): ctest runs each test in its
  // own process, in parallel, and each makes its own certificates.
  explicit TestPki(const std::string& dir);
  ~TestPki();

  // A self-signed CA named `name` (files <name>.pem, <name>.key). Fails the test on error.
  CertFiles MakeCa(const std::string& name);
  // A certificate for common name `cn` with serial `serial`, signed by `ca` (files <cn>.pem,
  // <cn>.key). Usable as a server (SANs above) and a client certificate.
  CertFiles MakeLeaf(const CertFiles& ca, const std::string& cn, int serial);

  const std::string& dir() const { return dir_; }

 private:
  void Run(const std::string& command);
  std::string dir_;
};

// Replaces `path` with `contents` atomically (write a temporary file, then rename), as a
// Kubernetes Secret volume update does.
void ReplaceFile(const std::string& path, const std::string& contents);
// The whole file.
std::string ReadWholeFile(const std::string& path);

}  // namespace dequantd::testing
