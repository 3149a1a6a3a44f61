// Failure injection for the CUDA backend's workers, so the take-out-of-rotation path runs for
// real on one GPU or several (tests/gpu/multi_gpu_check.sh). Set by the environment variable
// DEQUANTD_INJECT_DEVICE_FAILURE (read by main.cc; not a flag: it is for tests only), a comma
// list of LABEL=WHEN, LABEL a worker's device label (device_placement.h WorkerLabels, e.g.
// cuda:1 or cuda:0.1):
//   cuda:1=start     the worker fails to start (as a GPU that is unavailable at start-up)
//   cuda:1=launch    its next kernel launch fails with cudaErrorLaunchFailure, and the worker stays
//                    failed (a sticky error, like a real one)
//   cuda:1=launch@N  the same, after N launches that succeed
// No CUDA here: tested on the CPU (tests/server/device_placement_test.cc).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace dequantd {

inline constexpr absl::string_view kInjectDeviceFailureEnv = "DEQUANTD_INJECT_DEVICE_FAILURE";

struct DeviceFailureInjection {
  bool at_start = false;
  int64_t launches_before_failure = -1;  // -1: launches never fail
};

// Parses the variable's value (empty: no injection). INVALID_ARGUMENT naming the variable and the
// item for anything else than the forms above (a label repeated is an error too).
absl::StatusOr<std::map<std::string, DeviceFailureInjection>> ParseDeviceFailureInjection(
    absl::string_view spec);

// Counts one worker's launches against its injection. Thread-safe.
class LaunchFailureCountdown {
 public:
  explicit LaunchFailureCountdown(int64_t launches_before_failure = -1)
      : armed_(launches_before_failure >= 0), remaining_(launches_before_failure) {}
  // Whether this launch fails. Once one has failed, every later one fails too.
  bool NextLaunchFails() {
    if (!armed_) return false;
    if (remaining_.fetch_sub(1) <= 0) failed_.store(true);
    return failed_.load();
  }
  bool failed() const { return failed_.load(); }

 private:
  const bool armed_;
  std::atomic<int64_t> remaining_;
  std::atomic<bool> failed_{false};
};

}  // namespace dequantd
