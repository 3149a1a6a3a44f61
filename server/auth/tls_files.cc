// LoadTlsFiles (see tls_files.h).
#include "server/auth/tls_files.h"

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dequantd::auth {
namespace {

struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;

absl::Status Invalid(const char* flag, const std::string& path, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": ", why));
}

absl::StatusOr<std::string> ReadFile(const char* flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Invalid(flag, path, absl::StrCat("cannot read (", std::strerror(errno), ")"));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return Invalid(flag, path, "read error");
  return contents.str();
}

std::unique_ptr<BIO, BioFree> MemoryBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// Every PEM certificate in `pem`, in order.
std::vector<X509Ptr> ReadCertificates(const std::string& pem) {
  std::vector<X509Ptr> certs;
  auto bio = MemoryBio(pem);
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    certs.emplace_back(cert);
  }
  ERR_clear_error();  // the loop ends on "no start line"
  return certs;
}

std::string SubjectOf(X509* cert) {
  auto bio = std::unique_ptr<BIO, BioFree>(BIO_new(BIO_s_mem()));
  X509_NAME_print_ex(bio.get(), X509_get_subject_name(cert), 0, XN_FLAG_RFC2253);
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

std::string SerialOf(X509* cert) {
  BIGNUM* bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(cert), nullptr);
  char* hex = BN_bn2hex(bn);
  std::string serial = hex != nullptr ? hex : "";
  OPENSSL_free(hex);
  BN_free(bn);
  return serial;
}

int64_t NotAfterOf(X509* cert) {
  struct tm tm {};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(cert), &tm) != 1) return 0;
  return static_cast<int64_t>(timegm(&tm));
}

}  // namespace

absl::StatusOr<TlsMaterial> LoadTlsFiles(const TlsFilePaths& paths) {
  TlsMaterial material;
  absl::StatusOr<std::string> cert_pem = ReadFile("--tls-cert", paths.cert);
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = ReadFile("--tls-key", paths.key);
  if (!key_pem.ok()) return key_pem.status();

  std::vector<X509Ptr> chain = ReadCertificates(*cert_pem);
  if (chain.empty()) return Invalid("--tls-cert", paths.cert, "no PEM certificate");
  auto key_bio = MemoryBio(*key_pem);
  std::unique_ptr<EVP_PKEY, PkeyFree> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (key == nullptr) return Invalid("--tls-key", paths.key, "no PEM private key");
  if (X509_check_private_key(chain.front().get(), key.get()) != 1) {
    ERR_clear_error();
    return Invalid("--tls-key", paths.key,
                   absl::StrCat("does not match the certificate in --tls-cert ", paths.cert));
  }
  if (!paths.client_ca.empty()) {
    absl::StatusOr<std::string> ca_pem = ReadFile("--tls-client-ca", paths.client_ca);
    if (!ca_pem.ok()) return ca_pem.status();
    if (ReadCertificates(*ca_pem).empty()) {
      return Invalid("--tls-client-ca", paths.client_ca, "no PEM certificate");
    }
    material.client_ca_pem = std::move(*ca_pem);
  }
  material.not_after_unix = NotAfterOf(chain.front().get());
  material.subject = SubjectOf(chain.front().get());
  material.serial_hex = SerialOf(chain.front().get());
  material.cert_pem = std::move(*cert_pem);
  material.key_pem = std::move(*key_pem);
  return material;
}

}  // namespace dequantd::auth
