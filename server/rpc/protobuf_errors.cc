// Malformed-request status and libprotobuf log rate limiting (see protobuf_errors.h).
#include "server/rpc/protobuf_errors.h"

#include <google/protobuf/stubs/logging.h>

#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/metrics/metrics.h"
#include "server/rpc/log_rate_limit.h"
#include "spdlog/spdlog.h"

namespace dequantd {
namespace {

constexpr absl::string_view kServicePrefix = "/dequant.v1.DequantService/";

thread_local std::string last_protobuf_error;

void RateLimitedProtobufLog(google::protobuf::LogLevel level, const char* filename, int line,
                            const std::string& message) {
  if (level >= google::protobuf::LOGLEVEL_ERROR) last_protobuf_error = message;
  // One budget for all of libprotobuf (it logs a parse failure from one of several call sites).
  static LogRateLimiter* limiter = new LogRateLimiter(kProtobufLogLinesPerMinute);  // never freed
  const LogRateLimiter::Decision decision = limiter->Admit("libprotobuf");
  if (!decision.admit) return;
  if (decision.dropped_before > 0) {
    spdlog::warn("libprotobuf: {} more lines dropped in the last minute (rate limit {}/min)",
                 decision.dropped_before, kProtobufLogLinesPerMinute);
  }
  const spdlog::level::level_enum spd_level =
      level >= google::protobuf::LOGLEVEL_ERROR     ? spdlog::level::err
      : level == google::protobuf::LOGLEVEL_WARNING ? spdlog::level::warn
                                                    : spdlog::level::info;
  spdlog::log(spd_level, "libprotobuf {}:{}: {}", filename, line, message);
}

class MalformedRequestInterceptor final : public grpc::experimental::Interceptor {
 public:
  MalformedRequestInterceptor(Metrics* metrics, std::string method)
      : metrics_(metrics), method_(std::move(method)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      if (status.error_code() == grpc::StatusCode::INTERNAL && status.error_message().empty()) {
        std::string reason = TakeLastProtobufError();
        if (reason.empty()) reason = "it does not parse as protobuf";
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("request is not a valid dequant.v1.", method_, "Request: ", reason)));
        if (metrics_ != nullptr) {
          metrics_->RpcStarted(method_);
          metrics_->RpcFinished(method_, grpc::StatusCode::INVALID_ARGUMENT, 0.0);
        }
      }
    }
    methods->Proceed();
  }

 private:
  Metrics* const metrics_;
  const std::string method_;
};

class MalformedRequestInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit MalformedRequestInterceptorFactory(Metrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    const absl::string_view path = info->method() != nullptr ? info->method() : "";
    if (!absl::StartsWith(path, kServicePrefix)) return nullptr;
    return new MalformedRequestInterceptor(metrics_,
                                           std::string(path.substr(kServicePrefix.size())));
  }

 private:
  Metrics* const metrics_;
};

}  // namespace

void InstallProtobufLogHandler() {
  static std::once_flag once;
  std::call_once(once, [] { google::protobuf::SetLogHandler(&RateLimitedProtobufLog); });
}

std::string TakeLastProtobufError() {
  std::string message;
  message.swap(last_protobuf_error);
  return message;
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeMalformedRequestInterceptorFactory(Metrics* metrics) {
  return std::make_unique<MalformedRequestInterceptorFactory>(metrics);
}

}  // namespace dequantd
