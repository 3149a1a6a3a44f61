// What a process holds, read from /proc (Linux): resident memory, threads, open descriptors; and
// a plain HTTP GET for reading /metrics. For the hardening and soak tests.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace dequantd::testing {

// VmRSS of `pid` in bytes (-1 if unreadable).
int64_t ResidentBytes(pid_t pid);
// Threads of `pid` (the Threads: line of /proc/PID/status; -1 if unreadable).
int ThreadCount(pid_t pid);
// Open file descriptors of `pid` (entries of /proc/PID/fd; -1 if unreadable).
int OpenFdCount(pid_t pid);

// The body of GET http://127.0.0.1:`port``path` (HTTP/1.0), or "" on any error.
std::string HttpGet(int port, const std::string& path);

// The value of the sample line starting with `series` (e.g.
// `dequantd_rpc_requests_total{code="INVALID_ARGUMENT",method="Dequantize"}`) in a Prometheus
// text body, or -1 if there is none.
double MetricValue(const std::string& body, const std::string& series);

}  // namespace dequantd::testing
