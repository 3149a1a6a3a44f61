// Hardware counters of one kernel launch, read in process with CUPTI's Range Profiler (CUDA 13:
// cupti_range_profiler.h, cupti_profiler_host.h, cupti_profiler_target.h). Used by the CUDA
// benchmark when BenchmarkRequest::hardware_counters is set (issue 4, part 2); never by Dequantize.
//
// Builds without CUPTI (CMake option DEQUANTD_CUPTI=OFF, or libcupti not found) compile a stub
// whose MeasureCounters returns UNAVAILABLE.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dequantd::bench {

// The metrics MeasureCounters returns, in Nsight Compute's names and units:
//   dram__throughput.avg.pct_of_peak_sustained_elapsed  percent, 0..100
//   lts__t_sector_hit_rate.pct                          percent (L2), 0..100
//   l1tex__t_sector_hit_rate.pct                        percent (L1/tex), 0..100
//   dram__bytes_read.sum                                bytes
//   dram__bytes_write.sum                               bytes
const std::vector<std::string>& HardwareCounterNames();

// Profiles the one kernel that `launch` enqueues on `stream` (the current device's primary
// context), measured from that kernel's start to its end, the boundary Nsight Compute uses.
// `launch` is called once per replay pass (a handful; user replay, no memory is saved or restored)
// and must enqueue the same single kernel each time with results that do not depend on earlier
// passes: true of the dequantize kernels, whose outputs are a function of inputs they never
// write. Before every pass the L2 is flushed (measure/l2_flush.h: 4 x L2 read, allocated per
// call) so each pass starts as Nsight Compute's default --cache-control all starts it: nothing left
// dirty by earlier work, nothing of the inputs cached. Percentages are clamped to [0, 100].
// Blocking (synchronizes `stream`).
//
// Profiling covers every kernel of the context, so kernels other threads launch meanwhile (a
// server's Dequantize calls) are seen: they run normally, once, with correct results, but the
// session is discarded and tried again, up to 3 times. While a session runs, other threads' kernels
// may be serialized with ours and wait behind the flushes (milliseconds).
//
// Errors: UNAVAILABLE when profiling cannot run here (no CUPTI in this build, driver refuses:
// CUPTI_ERROR_INSUFFICIENT_PRIVILEGES, unsupported device, another profiler attached) or when
// other kernels ran during all 3 sessions ("the device was busy"); INTERNAL for other CUPTI
// failures; RESOURCE_EXHAUSTED when the flush buffer does not fit in device memory; whatever
// `launch` returns. The message names the CUPTI call and its result string.
//
// Thread-safety: serialized internally (one profiling session per process at a time).
absl::StatusOr<std::map<std::string, double>> MeasureCounters(
    const std::function<absl::Status(cudaStream_t)>& launch, cudaStream_t stream);

}  // namespace dequantd::bench
