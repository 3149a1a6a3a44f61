// LoadTlsFiles: the start-up and reload checks of --tls-cert, --tls-key, --tls-client-ca.
#include "server/auth/tls_files.h"

#include <ctime>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/security/test_pki.h"

namespace dequantd::auth {
namespace {

using ::dequantd::testing::CertFiles;
using ::dequantd::testing::TestPki;
using ::testing::HasSubstr;

class TlsFilesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pki_ = new TestPki(::testing::TempDir() + "/tls_files_test");
    ca_ = new CertFiles(pki_->MakeCa("files-ca"));
    server_ = new CertFiles(pki_->MakeLeaf(*ca_, "files-server", 0x1234));
    other_ = new CertFiles(pki_->MakeLeaf(*ca_, "files-other", 7));
  }
  static void TearDownTestSuite() {
    delete other_;
    delete server_;
    delete ca_;
    delete pki_;
  }
  static std::string Garbage(const std::string& name) {
    const std::string path = pki_->dir() + "/" + name;
    std::ofstream(path) << "-----BEGIN CERTIFICATE-----\nnot base64 at all\n";
    return path;
  }

  static TestPki* pki_;
  static CertFiles* ca_;
  static CertFiles* server_;
  static CertFiles* other_;
};
TestPki* TlsFilesTest::pki_ = nullptr;
CertFiles* TlsFilesTest::ca_ = nullptr;
CertFiles* TlsFilesTest::server_ = nullptr;
CertFiles* TlsFilesTest::other_ = nullptr;

TEST_F(TlsFilesTest, GoodFilesGiveSubjectSerialAndExpiry) {
  absl::StatusOr<TlsMaterial> m = LoadTlsFiles({server_->cert, server_->key, ca_->cert});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->subject, "CN=files-server");
  EXPECT_EQ(m->serial_hex, "1234");
  // -days 2 from now: between 1 and 3 days ahead of this clock.
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  EXPECT_GT(m->not_after_unix, now + 86400);
  EXPECT_LT(m->not_after_unix, now + 3 * 86400);
  EXPECT_EQ(m->cert_pem, testing::ReadWholeFile(server_->cert));
  EXPECT_EQ(m->client_ca_pem, testing::ReadWholeFile(ca_->cert));
}

TEST_F(TlsFilesTest, MissingFileNamesFlagAndPath) {
  const std::string missing = pki_->dir() + "/missing.pem";
  absl::StatusOr<TlsMaterial> m = LoadTlsFiles({missing, server_->key, ""});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("--tls-cert " + missing + ": cannot read (No such file or directory)"));
}

TEST_F(TlsFilesTest, GarbageCertificateKeyOrCa) {
  const std::string bad = Garbage("garbage.pem");
  EXPECT_THAT(std::string(LoadTlsFiles({bad, server_->key, ""}).status().message()),
              HasSubstr("--tls-cert " + bad + ": no PEM certificate"));
  EXPECT_THAT(std::string(LoadTlsFiles({server_->cert, bad, ""}).status().message()),
              HasSubstr("--tls-key " + bad + ": no PEM private key"));
  EXPECT_THAT(std::string(LoadTlsFiles({server_->cert, server_->key, bad}).status().message()),
              HasSubstr("--tls-client-ca " + bad + ": no PEM certificate"));
}

TEST_F(TlsFilesTest, KeyOfAnotherCertificateIsRefused) {
  absl::StatusOr<TlsMaterial> m = LoadTlsFiles({server_->cert, other_->key, ""});
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("--tls-key " + other_->key +
                                                           ": does not match the certificate in "
                                                           "--tls-cert " +
                                                           server_->cert));
}

}  // namespace
}  // namespace dequantd::auth
