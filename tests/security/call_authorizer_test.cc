// CallAuthorizer's decisions, the method table and the loopback check (server/auth/).
#include "server/auth/call_authorizer.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/auth/method_roles.h"
#include "server/auth/server_security.h"

namespace dequantd::auth {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kReaderToken[] = "reader-token-0123456789";
constexpr char kAdminToken[] = "admin-token-abcdefghijkl";
constexpr char kBenchmark[] = "/dequant.v1.DequantService/Benchmark";
constexpr char kListTensors[] = "/dequant.v1.DequantService/ListTensors";
constexpr char kHealthCheck[] = "/grpc.health.v1.Health/Check";

std::shared_ptr<const TokenSet> Tokens(const std::string& contents) {
  absl::StatusOr<TokenSet> set = TokenSet::Parse(contents);
  EXPECT_TRUE(set.ok()) << set.status();
  return std::make_shared<const TokenSet>(std::move(*set));
}

class CallAuthorizerTest : public ::testing::Test {
 protected:
  CallAuthorizerTest()
      : authorizer_(CallAuthorizer::Mode::kTokens,
                    Tokens(std::string("reader ") + kReaderToken + "\nadmin " + kAdminToken),
                    [this](grpc::StatusCode code) { denied_.push_back(code); }) {}

  grpc::Status Call(const std::string& method, const std::string& authorization) {
    const absl::string_view value = authorization;
    return authorizer_.Authorize(method, &value);
  }

  CallAuthorizer authorizer_;
  std::vector<grpc::StatusCode> denied_;
};

TEST_F(CallAuthorizerTest, HealthNeedsNoToken) {
  EXPECT_TRUE(authorizer_.Authorize(kHealthCheck, nullptr).ok());
  EXPECT_TRUE(authorizer_.Authorize("/grpc.health.v1.Health/Watch", nullptr).ok());
  EXPECT_TRUE(denied_.empty());
}

TEST_F(CallAuthorizerTest, MissingTokenIsUnauthenticated) {
  const grpc::Status s = authorizer_.Authorize(kListTensors, nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), HasSubstr(kListTensors));
  EXPECT_THAT(s.error_message(), HasSubstr("no authorization metadata"));
  EXPECT_EQ(denied_, std::vector<grpc::StatusCode>{grpc::StatusCode::UNAUTHENTICATED});
}

TEST_F(CallAuthorizerTest, UnknownOrMalformedTokenIsUnauthenticated) {
  for (const std::string& value :
       {std::string("Bearer not-a-known-token-123"), std::string("Basic ") + kAdminToken,
        std::string(kAdminToken), std::string("Bearer "), std::string("Bearer  ") + kAdminToken}) {
    const grpc::Status s = Call(kListTensors, value);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << value;
    EXPECT_THAT(s.error_message(), Not(HasSubstr("token-123")));
    EXPECT_THAT(s.error_message(), Not(HasSubstr(kAdminToken)));
  }
}

TEST_F(CallAuthorizerTest, ReaderReadsButMayNotBenchmark) {
  EXPECT_TRUE(Call(kListTensors, std::string("Bearer ") + kReaderToken).ok());
  EXPECT_TRUE(Call(kListTensors, std::string("bearer ") + kReaderToken).ok());  // RFC 6750
  const grpc::Status s = Call(kBenchmark, std::string("Bearer ") + kReaderToken);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("role reader may not call"));
  EXPECT_THAT(s.error_message(), HasSubstr(kBenchmark));
  EXPECT_EQ(denied_, std::vector<grpc::StatusCode>{grpc::StatusCode::PERMISSION_DENIED});
}

TEST_F(CallAuthorizerTest, AdminMayBenchmark) {
  EXPECT_TRUE(Call(kBenchmark, std::string("Bearer ") + kAdminToken).ok());
  EXPECT_TRUE(Call(kListTensors, std::string("Bearer ") + kAdminToken).ok());
}

TEST_F(CallAuthorizerTest, MethodsNotInTheTableAreDeniedToAdmin) {
  const grpc::Status s =
      Call("/dequant.v1.DequantService/SomethingNew", std::string("Bearer ") + kAdminToken);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("not in dequantd's access table"));
}

TEST_F(CallAuthorizerTest, ReloadedTokensReplaceTheOldOnes) {
  authorizer_.SetTokens(Tokens("admin new-admin-token-000000000"));
  EXPECT_EQ(Call(kBenchmark, std::string("Bearer ") + kAdminToken).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Call(kBenchmark, "Bearer new-admin-token-000000000").ok());
}

TEST_F(CallAuthorizerTest, ProcessReadsPathAndTokenFromMetadataAndConsumesTheToken) {
  const std::string path = kBenchmark;
  const std::string auth = std::string("Bearer ") + kAdminToken;
  grpc::AuthMetadataProcessor::InputMetadata md = {
      {grpc::string_ref(":path"), grpc::string_ref(path)},
      {grpc::string_ref("authorization"), grpc::string_ref(auth)}};
  grpc::AuthMetadataProcessor::OutputMetadata consumed, response;
  EXPECT_TRUE(authorizer_.Process(md, nullptr, &consumed, &response).ok());
  EXPECT_EQ(consumed.count("authorization"), 1u);
  // Two authorization values: refused, not guessed.
  const std::string reader = std::string("Bearer ") + kReaderToken;
  md.emplace(grpc::string_ref("authorization"), grpc::string_ref(reader));
  EXPECT_EQ(authorizer_.Process(md, nullptr, &consumed, &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST(HealthOnlyAuthorizerTest, ServesHealthAndRefusesEverythingElse) {
  CallAuthorizer authorizer(CallAuthorizer::Mode::kHealthOnly, nullptr, nullptr);
  EXPECT_TRUE(authorizer.Authorize(kHealthCheck, nullptr).ok());
  const absl::string_view token = "Bearer admin-token-abcdefghijkl";
  const grpc::Status s = authorizer.Authorize(kListTensors, &token);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("--health-listen"));
}

TEST(MethodRolesTest, TheTable) {
  EXPECT_EQ(RequiredAccess("/dequant.v1.DequantService/GetServerInfo"), Access::kReader);
  EXPECT_EQ(RequiredAccess("/dequant.v1.DequantService/Dequantize"), Access::kReader);
  EXPECT_EQ(RequiredAccess("/dequant.v1.DequantService/DequantizeLayers"), Access::kReader);
  EXPECT_EQ(RequiredAccess(kBenchmark), Access::kAdmin);
  EXPECT_EQ(RequiredAccess("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"),
            Access::kReader);
  EXPECT_EQ(RequiredAccess(kHealthCheck), Access::kOpen);
  EXPECT_EQ(RequiredAccess("/dequant.v1.DequantService/benchmark"), std::nullopt);
  EXPECT_FALSE(Allows(Role::kReader, Access::kAdmin));
  EXPECT_TRUE(Allows(Role::kAdmin, Access::kAdmin));
  EXPECT_TRUE(Allows(Role::kReader, Access::kReader));
}

TEST(IsLoopbackOrUnixTest, Addresses) {
  for (const char* yes :
       {"127.0.0.1:50051", "127.3.2.1:0", "[::1]:50051", "localhost:1", "LOCALHOST:1",
        "unix:/run/dequantd.sock", "unix-abstract:dequantd", "[::ffff:127.0.0.1]:5"}) {
    EXPECT_TRUE(IsLoopbackOrUnix(yes)) << yes;
  }
  for (const char* no : {"0.0.0.0:50051", "[::]:50051", "10.0.0.1:50051", "128.0.0.1:1",
                         "example.com:50051", "dequantd", "[::2]:1"}) {
    EXPECT_FALSE(IsLoopbackOrUnix(no)) << no;
  }
}

}  // namespace
}  // namespace dequantd::auth
