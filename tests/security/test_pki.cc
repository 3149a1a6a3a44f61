// TestPki (see test_pki.h).
#include "tests/security/test_pki.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dequantd::testing {

TestPki::TestPki(const std::string& dir) : dir_(absl::StrCat(dir, ".", getpid())) {
  std::filesystem::remove_all(dir_);
  std::filesystem::create_directories(dir_);
  std::ofstream(dir_ + "/leaf.ext") << "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                                       "basicConstraints=CA:FALSE\n"
                                       "keyUsage=digitalSignature\n"
                                       "extendedKeyUsage=serverAuth,clientAuth\n";
}

TestPki::~TestPki() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

void TestPki::Run(const std::string& command) {
  const std::string full = absl::StrCat("cd '", dir_, "' && ", command, " 2>openssl.err");
  ASSERT_EQ(std::system(full.c_str()), 0) << full << "\n" << ReadWholeFile(dir_ + "/openssl.err");
}

CertFiles TestPki::MakeCa(const std::string& name) {
  Run(absl::StrCat("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ",
                   "-keyout ", name, ".key -out ", name, ".pem -days 2 -subj /CN=", name));
  return {absl::StrCat(dir_, "/", name, ".pem"), absl::StrCat(dir_, "/", name, ".key")};
}

CertFiles TestPki::MakeLeaf(const CertFiles& ca, const std::string& cn, int serial) {
  Run(absl::StrCat("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ",
                   "-keyout ", cn, ".key -out ", cn, ".csr -subj /CN=", cn,
                   " && openssl x509 -req -in ", cn, ".csr -CA '", ca.cert, "' -CAkey '", ca.key,
                   "' -set_serial ", serial, " -days 2 -extfile leaf.ext -out ", cn, ".pem"));
  return {absl::StrCat(dir_, "/", cn, ".pem"), absl::StrCat(dir_, "/", cn, ".key")};
}

void ReplaceFile(const std::string& path, const std::string& contents) {
  const std::string tmp = path + ".new";
  std::ofstream(tmp, std::ios::binary | std::ios::trunc) << contents;
  std::filesystem::rename(tmp, path);
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

}  // namespace dequantd::testing
