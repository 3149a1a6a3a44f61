// dequantd end to end with TLS, mutual TLS, tokens and roles: a real server started in-process
// (CPU backend, no model) and real clients (client/credentials.h). Certificates are made in the
// test (test_pki.h); reloads are observed through new connections and /metrics.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/client.h"  // FromGrpcStatus
#include "client/credentials.h"
#include "dequant/v1/dequant.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/security/test_pki.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;
using ::dequantd::testing::CertFiles;
using ::dequantd::testing::ReadWholeFile;
using ::dequantd::testing::ReplaceFile;
using ::dequantd::testing::TestPki;
using ::testing::HasSubstr;

constexpr char kReaderToken[] = "reader-token-0123456789";
constexpr char kAdminToken[] = "admin-token-abcdefghijkl";

// Reloads are polled every second; a change must show within this bound (the tests never
// assert on time: they wait for the effect, up to this long).
constexpr auto kReloadWait = std::chrono::seconds(30);

bool WaitFor(const std::function<bool()>& condition) {
  const auto deadline = std::chrono::steady_clock::now() + kReloadWait;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return condition();
}

// GET /metrics from 127.0.0.1:`port`; the value of the series line starting with `series`
// (e.g. "dequantd_tls_reload_errors_total "), or nullopt.
std::optional<double> ScrapeValue(int port, const std::string& series) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string body;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) body.append(buffer, n);
    }
  }
  close(fd);
  const size_t at = body.find("\n" + series);
  if (at == std::string::npos) return std::nullopt;
  return std::strtod(body.c_str() + at + 1 + series.size(), nullptr);
}

struct CallResult {
  grpc::Status status;
  std::string peer_common_name;  // of the server certificate, over TLS
};

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pki_ = new TestPki(::testing::TempDir() + "/server_security_test");
    ca_ = new CertFiles(pki_->MakeCa("test-ca"));
    other_ca_ = new CertFiles(pki_->MakeCa("other-ca"));
    server1_ = new CertFiles(pki_->MakeLeaf(*ca_, "dequantd-1", 1));
    server2_ = new CertFiles(pki_->MakeLeaf(*ca_, "dequantd-2", 2));
    client_ = new CertFiles(pki_->MakeLeaf(*ca_, "client-1", 3));
    other_client_ = new CertFiles(pki_->MakeLeaf(*other_ca_, "client-other", 4));
  }
  static void TearDownTestSuite() {
    for (CertFiles* f : {ca_, other_ca_, server1_, server2_, client_, other_client_}) delete f;
    delete pki_;
  }

  void SetUp() override {
    dir_ = absl::StrCat(pki_->dir(), "/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    // The files the server watches: copies, so that a test can replace them.
    live_cert_ = dir_ + "/tls.crt";
    live_key_ = dir_ + "/tls.key";
    tokens_ = dir_ + "/tokens";
    ReplaceFile(live_cert_, ReadWholeFile(server1_->cert));
    ReplaceFile(live_key_, ReadWholeFile(server1_->key));
    ReplaceFile(tokens_, absl::StrCat("# test tokens\nreader ", kReaderToken, "\nadmin ",
                                      kAdminToken, "\n"));
  }

  static ServerOptions Options() {
    ServerOptions options;
    options.model_dir = "";
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "127.0.0.1:0";
    options.backend = "cpu";
    options.cpu_threads = 1;
    options.security.refresh_seconds = 1;
    return options;
  }
  ServerOptions TlsOptions() const {
    ServerOptions options = Options();
    options.security.tls_cert = live_cert_;
    options.security.tls_key = live_key_;
    return options;
  }

  void Start(const ServerOptions& options) {
    absl::StatusOr<std::unique_ptr<DequantServer>> server = DequantServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
  }

  // A new channel (own subchannel pool: a new connection, a new handshake) to `address`.
  static std::shared_ptr<grpc::Channel> Channel(const std::string& address,
                                                ClientSecurityOptions security) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    if (security.use_tls() && security.tls_server_name.empty()) {
      security.tls_server_name = "localhost";
    }
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        CreateClientChannel(address, security, args);
    EXPECT_TRUE(channel.ok()) << channel.status();
    return *channel;
  }

  static void Deadline(grpc::ClientContext& context) {
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  }

  CallResult GetServerInfo(const ClientSecurityOptions& security) const {
    auto stub = v1::DequantService::NewStub(Channel(address_, security));
    grpc::ClientContext context;
    Deadline(context);
    v1::GetServerInfoResponse response;
    CallResult result{stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &response), ""};
    if (auto auth = context.auth_context(); auth != nullptr) {
      for (const grpc::string_ref& cn : auth->FindPropertyValues("x509_common_name")) {
        result.peer_common_name.assign(cn.data(), cn.size());
      }
    }
    return result;
  }

  // Benchmark with trials out of range: INVALID_ARGUMENT from the handler when the call is
  // admitted, without running anything.
  grpc::Status BadBenchmark(const ClientSecurityOptions& security) const {
    auto stub = v1::DequantService::NewStub(Channel(address_, security));
    grpc::ClientContext context;
    Deadline(context);
    v1::BenchmarkRequest request;
    request.set_trials(1000);
    v1::BenchmarkResponse response;
    return stub->Benchmark(&context, request, &response);
  }

  // A unary call of `method` through the generic stub, with `request` bytes.
  static grpc::Status RawCall(const std::string& address, const ClientSecurityOptions& security,
                              const std::string& method, const std::string& request,
                              std::string* response_bytes) {
    grpc::GenericStub stub(Channel(address, security));
    grpc::ClientContext context;
    Deadline(context);
    grpc::Slice slice(request);
    grpc::ByteBuffer req(&slice, 1);
    grpc::ByteBuffer resp;
    std::mutex mu;
    std::condition_variable done_cv;
    std::optional<grpc::Status> status;
    stub.UnaryCall(&context, method, grpc::StubOptions(), &req, &resp, [&](grpc::Status s) {
      std::lock_guard<std::mutex> lock(mu);
      status = s;
      done_cv.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu);
    done_cv.wait(lock, [&] { return status.has_value(); });
    if (status->ok() && response_bytes != nullptr) {
      std::vector<grpc::Slice> slices;
      (void)resp.Dump(&slices);
      response_bytes->clear();
      for (const grpc::Slice& s : slices) {
        response_bytes->append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
    return *status;
  }

  // grpc.health.v1 Check of the whole server; OK only when the answer is SERVING (bytes 08 01).
  static grpc::Status HealthCheck(const std::string& address,
                                  const ClientSecurityOptions& security = {}) {
    std::string response;
    grpc::Status s = RawCall(address, security, "/grpc.health.v1.Health/Check", "", &response);
    if (s.ok() && response != std::string("\x08\x01", 2)) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "health answer is not SERVING");
    }
    return s;
  }

  std::optional<double> Metric(const std::string& series) const {
    return ScrapeValue(server_->metrics_port(), series);
  }

  static ClientSecurityOptions Tls() {
    ClientSecurityOptions security;
    security.tls_ca = ca_->cert;
    return security;
  }
  static ClientSecurityOptions Token(const std::string& token,
                                     ClientSecurityOptions security = {}) {
    security.token = token;
    return security;
  }

  static TestPki* pki_;
  static CertFiles* ca_;
  static CertFiles* other_ca_;
  static CertFiles* server1_;
  static CertFiles* server2_;
  static CertFiles* client_;
  static CertFiles* other_client_;

  std::string dir_;
  std::string live_cert_;
  std::string live_key_;
  std::string tokens_;
  std::unique_ptr<DequantServer> server_;
  std::string address_;
};
TestPki* SecurityTest::pki_ = nullptr;
CertFiles* SecurityTest::ca_ = nullptr;
CertFiles* SecurityTest::other_ca_ = nullptr;
CertFiles* SecurityTest::server1_ = nullptr;
CertFiles* SecurityTest::server2_ = nullptr;
CertFiles* SecurityTest::client_ = nullptr;
CertFiles* SecurityTest::other_client_ = nullptr;

// ---- TLS ---------------------------------------------------------------------------------------

TEST_F(SecurityTest, TlsServesClientsThatTrustItsCa) {
  Start(TlsOptions());
  const CallResult ok = GetServerInfo(Tls());
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.peer_common_name, "dequantd-1");
  EXPECT_TRUE(HealthCheck(address_, Tls()).ok());
}

// The failure says what is wrong: dequantctl's hint (WithTlsMismatchHint) names the flag.
TEST_F(SecurityTest, PlaintextClientCannotTalkToTlsServer) {
  Start(TlsOptions());
  const grpc::Status status = GetServerInfo({}).status;
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  const absl::Status hinted = WithTlsMismatchHint(FromGrpcStatus(status), false);
  EXPECT_EQ(hinted.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(hinted.message()),
              HasSubstr("; the server closed the connection: if it did so before any answer and "
                        "it serves TLS, pass --tls-ca FILE"));
}

TEST_F(SecurityTest, TlsClientOfAPlaintextServerIsToldItDoesNotSpeakTls) {
  Start(Options());  // plaintext
  const grpc::Status status = GetServerInfo(Tls()).status;
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(std::string(WithTlsMismatchHint(FromGrpcStatus(status), true).message()),
              HasSubstr("; the server does not speak TLS: leave out --tls-ca and --tls-cert"));
}

TEST(ClientCredentialsTest, OtherFailuresGetNoTlsHint) {
  const absl::Status refused = absl::UnavailableError("failed to connect: Connection refused");
  EXPECT_EQ(WithTlsMismatchHint(refused, false), refused);
  EXPECT_EQ(WithTlsMismatchHint(refused, true), refused);
  const absl::Status closed = absl::UnavailableError("ipv4:127.0.0.1:1: Socket closed");
  EXPECT_EQ(WithTlsMismatchHint(closed, true), closed);  // TLS already: not this mismatch
  const absl::Status denied = absl::PermissionDeniedError("Socket closed");
  EXPECT_EQ(WithTlsMismatchHint(denied, false), denied);
}

TEST_F(SecurityTest, ClientWithAnotherCaRefusesTheServer) {
  Start(TlsOptions());
  ClientSecurityOptions wrong_ca;
  wrong_ca.tls_ca = other_ca_->cert;
  EXPECT_EQ(GetServerInfo(wrong_ca).status.error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecurityTest, ClientCheckingAnotherServerNameRefusesTheServer) {
  Start(TlsOptions());
  ClientSecurityOptions security = Tls();
  security.tls_server_name = "not-dequantd.example";
  EXPECT_EQ(GetServerInfo(security).status.error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecurityTest, MutualTlsRequiresAClientCertificateFromItsCa) {
  ServerOptions options = TlsOptions();
  options.security.tls_client_ca = ca_->cert;
  Start(options);
  EXPECT_EQ(GetServerInfo(Tls()).status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << "no client certificate";
  ClientSecurityOptions other = Tls();
  other.tls_cert = other_client_->cert;
  other.tls_key = other_client_->key;
  EXPECT_EQ(GetServerInfo(other).status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << "client certificate from another CA";
  ClientSecurityOptions good = Tls();
  good.tls_cert = client_->cert;
  good.tls_key = client_->key;
  const CallResult ok = GetServerInfo(good);
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
}

TEST_F(SecurityTest, ReplacedCertificateIsServedToNewConnectionsAndABadOneIsRefused) {
  Start(TlsOptions());
  ASSERT_EQ(GetServerInfo(Tls()).peer_common_name, "dequantd-1");
  EXPECT_EQ(Metric("dequantd_tls_reload_errors_total "), 0);

  // The way a Kubernetes Secret volume updates: whole new files.
  ReplaceFile(live_key_, ReadWholeFile(server2_->key));
  ReplaceFile(live_cert_, ReadWholeFile(server2_->cert));
  EXPECT_TRUE(WaitFor([&] { return GetServerInfo(Tls()).peer_common_name == "dequantd-2"; }));

  // A broken certificate: refused, counted, and dequantd-2 is still served.
  ReplaceFile(live_cert_, "-----BEGIN CERTIFICATE-----\ntruncated\n");
  EXPECT_TRUE(WaitFor([&] { return Metric("dequantd_tls_reload_errors_total ") >= 1; }));
  // Twice the refresh interval: gRPC's own watcher has looked at the staged files again.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const CallResult after = GetServerInfo(Tls());
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.peer_common_name, "dequantd-2");
  // A key that does not match the certificate: refused too.
  ReplaceFile(live_cert_, ReadWholeFile(server1_->cert));
  EXPECT_TRUE(WaitFor([&] { return Metric("dequantd_tls_reload_errors_total ") >= 2; }));
  EXPECT_EQ(GetServerInfo(Tls()).peer_common_name, "dequantd-2");
}

TEST_F(SecurityTest, BadTlsOptionsAreStartUpErrorsNamingTheFlag) {
  ServerOptions missing = TlsOptions();
  missing.security.tls_cert = dir_ + "/absent.crt";
  absl::StatusOr<std::unique_ptr<DequantServer>> s = DequantServer::Start(missing);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("--tls-cert " + dir_ + "/absent.crt"));

  ServerOptions no_key = Options();
  no_key.security.tls_cert = live_cert_;
  EXPECT_THAT(std::string(DequantServer::Start(no_key).status().message()),
              HasSubstr("--tls-cert and --tls-key go together"));

  ServerOptions ca_only = Options();
  ca_only.security.tls_client_ca = ca_->cert;
  EXPECT_THAT(std::string(DequantServer::Start(ca_only).status().message()),
              HasSubstr("--tls-client-ca (mutual TLS) needs --tls-cert"));
}

// ---- Tokens and roles
// ----------------------------------------------------------------------------

TEST_F(SecurityTest, TokensAndRoles) {
  ServerOptions options = Options();
  options.security.auth_tokens = tokens_;
  Start(options);

  grpc::Status s = GetServerInfo({}).status;
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << "no token";
  EXPECT_THAT(s.error_message(), HasSubstr("GetServerInfo: no authorization metadata"));
  s = GetServerInfo(Token("unknown-token-000000000")).status;
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << "unknown token";
  EXPECT_THAT(s.error_message(), HasSubstr("unknown token"));

  EXPECT_TRUE(GetServerInfo(Token(kReaderToken)).status.ok());
  s = BadBenchmark(Token(kReaderToken));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("Benchmark: role reader may not call"));
  // admin reaches the handler, which refuses the request itself.
  s = BadBenchmark(Token(kAdminToken));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("trials"));

  EXPECT_TRUE(HealthCheck(address_).ok()) << "health needs no token";
  EXPECT_EQ(Metric("dequantd_auth_denied_total{code=\"UNAUTHENTICATED\"} "), 2);
  EXPECT_EQ(Metric("dequantd_auth_denied_total{code=\"PERMISSION_DENIED\"} "), 1);
  EXPECT_EQ(Metric("dequantd_auth_tokens "), 2);
}

TEST_F(SecurityTest, TokenFileIsReloadedAndABadOneKeepsTheOldTokens) {
  ServerOptions options = Options();
  options.security.auth_tokens = tokens_;
  Start(options);
  ASSERT_TRUE(GetServerInfo(Token(kReaderToken)).status.ok());

  const std::string rotated = "rotated-reader-token-42424242";
  ReplaceFile(tokens_, absl::StrCat("reader ", rotated, "\n"));
  EXPECT_TRUE(WaitFor([&] { return GetServerInfo(Token(rotated)).status.ok(); }));
  EXPECT_EQ(GetServerInfo(Token(kReaderToken)).status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Metric("dequantd_auth_tokens "), 1);

  ReplaceFile(tokens_, "superuser rotated-reader-token-42424242\n");
  EXPECT_TRUE(WaitFor([&] { return Metric("dequantd_auth_tokens_reload_errors_total ") >= 1; }));
  EXPECT_TRUE(GetServerInfo(Token(rotated)).status.ok()) << "the old set stays";
}

TEST_F(SecurityTest, TokensOverTls) {
  ServerOptions options = TlsOptions();
  options.listen = "0.0.0.0:0";  // not loopback: allowed, the tokens travel inside TLS
  options.security.auth_tokens = tokens_;
  Start(options);
  EXPECT_EQ(GetServerInfo(Tls()).status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  const CallResult ok = GetServerInfo(Token(kReaderToken, Tls()));
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(BadBenchmark(Token(kReaderToken, Tls())).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(SecurityTest, TokensOverPlaintextOnANonLoopbackListenerAreRefusedAtStart) {
  ServerOptions options = Options();
  options.listen = "0.0.0.0:0";
  options.security.auth_tokens = tokens_;
  absl::StatusOr<std::unique_ptr<DequantServer>> s = DequantServer::Start(options);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()),
              HasSubstr("--auth-tokens over plaintext on --listen 0.0.0.0:0"));
  options.security.allow_insecure_tokens = true;
  Start(options);
  EXPECT_TRUE(GetServerInfo(Token(kAdminToken)).status.ok());
}

TEST_F(SecurityTest, BadTokenFileIsAStartUpError) {
  ReplaceFile(tokens_, "reader short\n");
  ServerOptions options = Options();
  options.security.auth_tokens = tokens_;
  absl::StatusOr<std::unique_ptr<DequantServer>> s = DequantServer::Start(options);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()),
              HasSubstr("--auth-tokens " + tokens_ + ": line 1: the token has 5 characters"));
}

// ---- Health-only port and reflection
// --------------------------------------------------------------

TEST_F(SecurityTest, HealthPortServesOnlyHealthWithoutToken) {
  ServerOptions options = TlsOptions();
  options.security.auth_tokens = tokens_;
  options.security.health_listen = "127.0.0.1:0";
  Start(options);
  ASSERT_NE(server_->health_port(), 0);
  const std::string health = absl::StrCat("127.0.0.1:", server_->health_port());
  EXPECT_TRUE(HealthCheck(health).ok());
  std::string response;
  const grpc::Status s = RawCall(health, Token(kAdminToken),
                                 "/dequant.v1.DequantService/GetServerInfo", "", &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("serves only grpc.health.v1.Health"));
}

TEST_F(SecurityTest, AHealthPortInUseIsNamedNotTheMainPort) {
  Start(Options());  // its port is the one in use
  ServerOptions options = Options();
  options.listen = "127.0.0.1:0";
  options.security.health_listen = address_;
  absl::StatusOr<std::unique_ptr<DequantServer>> second = DequantServer::Start(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(second.status().message(),
            "--health-listen \"" + address_ + "\": cannot serve there: Address already in use");
}

// grpc.reflection.v1alpha ServerReflectionRequest{list_services: ""}.
constexpr char kReflection[] = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
const std::string kListServices("\x3a\x00", 2);

TEST_F(SecurityTest, ReflectionOffIsUnimplemented) {
  ServerOptions options = Options();
  options.security.reflection = false;
  Start(options);
  EXPECT_EQ(RawCall(address_, {}, kReflection, kListServices, nullptr).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

TEST_F(SecurityTest, ReflectionWithTokensNeedsAReaderToken) {
  ServerOptions options = Options();
  options.security.auth_tokens = tokens_;
  Start(options);
  EXPECT_EQ(RawCall(address_, {}, kReflection, kListServices, nullptr).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  std::string response;
  const grpc::Status s =
      RawCall(address_, Token(kReaderToken), kReflection, kListServices, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_THAT(response, HasSubstr("dequant.v1.DequantService"));
}

// ---- Client side
// ------------------------------------------------------------------------------------

TEST(ClientCredentialsTest, TokenFromFileOrEnvironment) {
  const std::string file = ::testing::TempDir() + "/client_token";
  std::ofstream(file) << "  file-token-0123456789  \nsecond line ignored\n";
  setenv("DEQUANTD_TOKEN", "env-token-0123456789", 1);
  EXPECT_EQ(ResolveToken(file).value(), "file-token-0123456789");
  EXPECT_EQ(ResolveToken("").value(), "env-token-0123456789");
  unsetenv("DEQUANTD_TOKEN");
  EXPECT_EQ(ResolveToken("").value(), "");
  std::ofstream(file, std::ios::trunc) << "\n";
  EXPECT_THAT(std::string(ResolveToken(file).status().message()),
              HasSubstr("--token-file " + file + ": the first line holds no token"));
}

TEST(ClientCredentialsTest, ATokenGrpcCannotSendIsRefusedWithoutEchoingIt) {
  const std::string file = ::testing::TempDir() + "/client_token_tab";
  std::ofstream(file, std::ios::trunc) << "abc\tsecret0123456789\n";
  absl::StatusOr<std::string> token = ResolveToken(file);
  EXPECT_EQ(token.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(token.status().message(),
            "--token-file " + file +
                ": the token holds byte 0x09 at position 3; a token is visible ASCII (0x21-0x7E)");
  setenv("DEQUANTD_TOKEN", "abcdefghijklmnop\x7f", 1);
  token = ResolveToken("");
  EXPECT_EQ(token.status().message(),
            "$DEQUANTD_TOKEN: the token holds byte 0x7F at position 16; a token is visible ASCII "
            "(0x21-0x7E)");
  setenv("DEQUANTD_TOKEN", "\xff-token-0123456789", 1);
  EXPECT_THAT(std::string(ResolveToken("").status().message()),
              HasSubstr("byte 0xFF at position 0"));
  unsetenv("DEQUANTD_TOKEN");
}

TEST(ClientCredentialsTest, BadOptionsNameTheFlag) {
  ClientSecurityOptions security;
  security.tls_cert = "/nonexistent/client.crt";
  EXPECT_THAT(std::string(CreateClientChannel("127.0.0.1:1", security, {}).status().message()),
              HasSubstr("--tls-cert and --tls-key go together"));
  security.tls_key = "/nonexistent/client.key";
  EXPECT_THAT(std::string(CreateClientChannel("127.0.0.1:1", security, {}).status().message()),
              HasSubstr("--tls-cert /nonexistent/client.crt: cannot read"));
  ClientSecurityOptions name_only;
  name_only.tls_server_name = "dequantd";
  EXPECT_THAT(std::string(CreateClientChannel("127.0.0.1:1", name_only, {}).status().message()),
              HasSubstr("--tls-server-name needs TLS"));
}

}  // namespace
}  // namespace dequantd
