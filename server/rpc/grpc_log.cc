// gRPC log routed through spdlog, rate-limited per call site (see grpc_log.h).
#include "server/rpc/grpc_log.h"

#include <grpc/support/log.h>

#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/rpc/log_rate_limit.h"
#include "spdlog/spdlog.h"

namespace dequantd {
namespace {

LogRateLimiter& Limiter() {
  static LogRateLimiter* limiter = new LogRateLimiter(kGrpcLogLinesPerMinute);  // never destroyed:
  return *limiter;  // gRPC may log from its threads until the process exits
}

void RateLimitedGrpcLog(gpr_log_func_args* args) {
  const std::string site = absl::StrCat(args->file != nullptr ? args->file : "?", ":", args->line);
  const LogRateLimiter::Decision decision = Limiter().Admit(site);
  if (!decision.admit) return;
  if (decision.dropped_before > 0) {
    spdlog::warn("grpc {}: {} more lines dropped in the last minute (rate limit {}/min)", site,
                 decision.dropped_before, kGrpcLogLinesPerMinute);
  }
  const spdlog::level::level_enum level =
      args->severity == GPR_LOG_SEVERITY_ERROR  ? spdlog::level::err
      : args->severity == GPR_LOG_SEVERITY_INFO ? spdlog::level::info
                                                : spdlog::level::debug;
  spdlog::log(level, "grpc {}: {}", site, args->message != nullptr ? args->message : "");
}

}  // namespace

void InstallGrpcLogHandler() {
  static std::once_flag once;
  std::call_once(once, [] { gpr_set_log_function(&RateLimitedGrpcLog); });
}

}  // namespace dequantd
