// MeasureCounters with CUPTI's Range Profiler (measure/hw_counters.h). One session per call:
//   host side (libnvperf_host through libcupti): chip name + counter availability -> config image
//   for the metrics; target side: enable the range profiler on the context, size and initialize a
//   counter data image, SetConfig (auto range: one range per kernel, bounded by the kernel's own
//   start and end; user replay: we run the passes), then per pass: flush L2, Start, launch, Stop,
//   until all passes are submitted; DecodeData, then evaluate range 0.
//
// Why user replay rather than CUPTI's kernel replay: kernel replay saves and restores the memory
// the kernel writes between passes, and the restore leaves dirty lines in L2 that the profiled
// kernel then evicts and is charged for (+22 MB of DRAM writes on a 117 MB output, which put DRAM
// throughput 8 points above Nsight Compute's). Our launches are idempotent (outputs are a function
// of inputs the kernel does not write), so no restore is needed, and a flush before each pass
// gives every pass the clean L2 that Nsight Compute's --cache-control all gives it.
#include <cuda.h>
#include <cupti_profiler_host.h>
#include <cupti_profiler_target.h>
#include <cupti_range_profiler.h>
#include <cupti_result.h>
#include <cupti_target.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "measure/hw_counters.h"
#include "measure/l2_flush.h"

namespace dequantd::bench {
namespace {

// Ranges per session: the launch is one kernel; the spare ranges let CUPTI record kernels that
// other threads ran meanwhile, so that they are detected (and the session retried).
constexpr size_t kMaxRanges = 4;

// Sessions tried before giving up when other kernels keep running during profiling.
constexpr int kBusyAttempts = 3;

// A bound on the replay loop: the five metrics take a handful of passes on Hopper.
constexpr int kMaxPasses = 64;

absl::Status CuptiStatus(CUptiResult result, const char* call) {
  if (result == CUPTI_SUCCESS) return absl::OkStatus();
  const char* text = nullptr;
  if (cuptiGetResultString(result, &text) != CUPTI_SUCCESS || text == nullptr) text = "?";
  const std::string message = absl::StrCat(call, ": ", text, " (CUPTI error ", result, ")");
  switch (result) {
    case CUPTI_ERROR_INSUFFICIENT_PRIVILEGES:
    case CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES:
    case CUPTI_ERROR_CONFIDENTIAL_COMPUTING_NOT_SUPPORTED:
    case CUPTI_ERROR_SLI_DEVICE_NOT_SUPPORTED:
    case CUPTI_ERROR_WSL_DEVICE_NOT_SUPPORTED:
    case CUPTI_ERROR_NOT_SUPPORTED:
    case CUPTI_ERROR_NOT_COMPATIBLE:
    case CUPTI_ERROR_NOT_INITIALIZED:
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
    case CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED:
    case CUPTI_ERROR_CMP_DEVICE_NOT_SUPPORTED:
    case CUPTI_ERROR_MIG_DEVICE_NOT_SUPPORTED:
    case CUPTI_ERROR_OLD_PROFILER_API_INITIALIZED:
    case CUPTI_ERROR_CUDA_COMPILER_NOT_COMPATIBLE:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

#define DEQUANTD_CUPTI_RETURN_IF_ERROR(call)                               \
  do {                                                                     \
    if (absl::Status s_ = CuptiStatus((call), #call); !s_.ok()) return s_; \
  } while (false)

// Zero-initialized CUPTI parameter struct with its structSize set.
template <typename Params>
Params MakeParams(size_t struct_size) {
  Params p{};
  p.structSize = struct_size;
  return p;
}
#define DEQUANTD_CUPTI_PARAMS(type) MakeParams<type>(type##_STRUCT_SIZE)

// The context the runtime made current for the device (cuCtxGetCurrent through the runtime, so
// this library does not link libcuda).
absl::StatusOr<CUcontext> CurrentContext() {
  if (cudaFree(nullptr) != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("no CUDA context: ", cudaGetErrorString(cudaGetLastError())));
  }
  using GetCurrent = CUresult (*)(CUcontext*);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      fn == nullptr) {
    cudaGetLastError();
    return absl::UnavailableError("cuCtxGetCurrent not found in the driver");
  }
  CUcontext ctx = nullptr;
  if (reinterpret_cast<GetCurrent>(fn)(&ctx) != CUDA_SUCCESS || ctx == nullptr) {
    return absl::UnavailableError("no current CUDA context");
  }
  return ctx;
}

// The host object for `chip`, configured for HardwareCounterNames(); deinitialized on exit.
class HostConfig {
 public:
  ~HostConfig() {
    if (host_ != nullptr) {
      auto p = DEQUANTD_CUPTI_PARAMS(CUpti_Profiler_Host_Deinitialize_Params);
      p.pHostObject = host_;
      cuptiProfilerHostDeinitialize(&p);
    }
  }

  absl::Status Init(const char* chip, const std::vector<uint8_t>& availability,
                    std::vector<const char*>& metrics) {
    auto init = DEQUANTD_CUPTI_PARAMS(CUpti_Profiler_Host_Initialize_Params);
    init.profilerType = CUPTI_PROFILER_TYPE_RANGE_PROFILER;
    init.pChipName = chip;
    init.pCounterAvailabilityImage = availability.data();
    DEQUANTD_CUPTI_RETURN_IF_ERROR(cuptiProfilerHostInitialize(&init));
    host_ = init.pHostObject;

    auto add = DEQUANTD_CUPTI_PARAMS(CUpti_Profiler_Host_ConfigAddMetrics_Params);
    add.pHostObject = host_;
    add.ppMetricNames = metrics.data();
    add.numMetrics = metrics.size();
    DEQUANTD_CUPTI_RETURN_IF_ERROR(cuptiProfilerHostConfigAddMetrics(&add));

    auto size = DEQUANTD_CUPTI_PARAMS(CUpti_Profiler_Host_GetConfigImageSize_Params);
    size.pHostObject = host_;
    DEQUANTD_CUPTI_RETURN_IF_ERROR(cuptiProfilerHostGetConfigImageSize(&size));
    config_.resize(size.configImageSize);
    auto image = DEQUANTD_CUPTI_PARAMS(CUpti_Profiler_Host_GetConfigImage_Params);
    image.pHostObject = host_;
    image.configImageSize = config_.size();
    image.pConfigImage = config_.data();
    DEQUANTD_CUPTI_RETURN_IF_ERROR(cuptiProfilerHostGetConfigImage(&image));
    return absl::OkStatus();
  }

  CUpti_Profiler_Host_Object* host() const { return host_; }
  const std::vector<uint8_t>& config() const { return config_; }

 private:
  CUpti_Profiler_Host_Object* host_ = nullptr;
  std::vector<uint8_t> config_;
};

// The range profiler enabled on a context; disabled on exit.
class RangeProfiler {
 public:
  ~RangeProfiler() {
    if (object_ != nullptr) {
      auto p = DEQUANTD_CUPTI_PARAMS(CUpti_RangeProfiler_Disable_Params);
      p.pRangeProfilerObject = object_;
      cuptiRangeProfilerDisable(&p);
    }
  }

  absl::Status Enable(CUcontext ctx) {
    auto p = DEQUANTD_CUPTI_PARAMS(CUpti_RangeProfiler_Enable_Params);
    p.ctx = ctx;
    DEQUANTD_CUPTI_RETURN_IF_ERROR(cuptiRangeProfilerEnable(&p));
    object_ = p.pRangeProfilerObject;
    return absl::OkStatus();
  }

  CUpti_RangeProfiler_Object* get() const { return object_; }

 private:
  CUpti_RangeProfiler_Object* object_ = nullptr;
};

absl::Status InitializeProfilerOnce() {
  static const absl::Status status = [] {
    auto p = DEQUANTD_CUPTI_PARAMS(CUpti_Profiler_Initialize_Params);
    return CuptiStatus(cuptiProfilerInitialize(&p), "cuptiProfilerInitialize");
  }();
  return status;
}

// One profiling session. Sets *busy when other kernels ran during it (the result is then an
// error and a later try may succeed).
absl::StatusOr<std::map<std::string, double>> Measure(
    const std::function<absl::Status(cudaStream_t)>& launch, cudaStream_t stream, bool* busy) {
  absl::StatusOr<CUcontext> ctx = CurrentContext();
  if (!ctx.ok()) return ctx.status();
  if (absl::Status s = InitializeProfilerOnce(); !s.ok()) return s;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    return absl::UnavailableError(cudaGetErrorString(cudaGetLastError()));
  }

  auto chip = DEQUANTD_CUPTI_PARAMS(CUpti_Device_GetChipName_Params);
  chip.deviceIndex = static_cast<size_t>(device);
  DEQUANTD_CUPTI_RETURN_IF_ERROR(cuptiDeviceGetChipName(&chip));

  // Counter availability must be read before the range profiler is enabled.
  auto avail = DEQUANTD_CUPTI_PARAMS(CUpti_Profiler_GetCounterAvailability_Params);
  avail.ctx = *ctx;
  DEQUANTD_CUPTI_RETURN_IF_ERROR(cuptiProfilerGetCounterAvailability(&avail));
  std::vector<uint8_t> availability(avail.counterAvailabilityImageSize);
  avail.pCounterAvailabilityImage = availability.data();
  DEQUANTD_CUPTI_RETURN_IF_ERROR(cuptiProfilerGetCounterAvailability(&avail));

  const std::vector<std::string>& names = HardwareCounterNames();
  std::vector<const char*> metrics;
  for (const std::string& n : names) metrics.push_back(n.c_str());
  HostConfig host;
  if (absl::Status s = host.Init(chip.pChipName, availability, metrics); !s.ok()) return s;

  // Before the profiler is enabled: its zeroing memset is not a profiled range.
  absl::StatusOr<L2Flush> flush = L2Flush::Create(stream);
  if (!flush.ok()) return flush.status();

  RangeProfiler profiler;
  if (absl::Status s = profiler.Enable(*ctx); !s.ok()) return s;

  auto size = DEQUANTD_CUPTI_PARAMS(CUpti_RangeProfiler_GetCounterDataSize_Params);
  size.pRangeProfilerObject = profiler.get();
  size.pMetricNames = metrics.data();
  size.numMetrics = metrics.size();
  size.maxNumOfRanges = kMaxRanges;
  size.maxNumRangeTreeNodes = kMaxRanges;
  DEQUANTD_CUPTI_RETURN_IF_ERROR(cuptiRangeProfilerGetCounterDataSize(&size));
  std::vector<uint8_t> counter_data(size.counterDataSize);
  auto init = DEQUANTD_CUPTI_PARAMS(CUpti_RangeProfiler_CounterDataImage_Initialize_Params);
  init.pRangeProfilerObject = profiler.get();
  init.counterDataSize = counter_data.size();
  init.pCounterData = counter_data.data();
  DEQUANTD_CUPTI_RETURN_IF_ERROR(cuptiRangeProfilerCounterDataImageInitialize(&init));

  auto config = DEQUANTD_CUPTI_PARAMS(CUpti_RangeProfiler_SetConfig_Params);
  config.pRangeProfilerObject = profiler.get();
  config.configSize = host.config().size();
  config.pConfig = host.config().data();
  config.counterDataImageSize = counter_data.size();
  config.pCounterDataImage = counter_data.data();
  config.range = CUPTI_AutoRange;
  config.replayMode = CUPTI_UserReplay;
  config.maxRangesPerPass = kMaxRanges;
  config.numNestingLevels = 1;
  config.minNestingLevel = 1;
  config.passIndex = 0;
  config.targetNestingLevel = 1;
  DEQUANTD_CUPTI_RETURN_IF_ERROR(cuptiRangeProfilerSetConfig(&config));

  // User replay: one pass per iteration, each on a flushed L2 (see the header), until CUPTI says
  // every pass the metrics need was submitted.
  for (int pass = 0;; ++pass) {
    if (pass == kMaxPasses) {
      return absl::InternalError(
          absl::StrCat("the range profiler wanted more than ", kMaxPasses, " passes"));
    }
    if (absl::Status s = flush->Enqueue(stream); !s.ok()) return s;
    if (cudaStreamSynchronize(stream) != cudaSuccess) {
      return absl::InternalError(
          absl::StrCat("L2 flush: ", cudaGetErrorString(cudaGetLastError())));
    }
    auto start = DEQUANTD_CUPTI_PARAMS(CUpti_RangeProfiler_Start_Params);
    start.pRangeProfilerObject = profiler.get();
    DEQUANTD_CUPTI_RETURN_IF_ERROR(cuptiRangeProfilerStart(&start));
    absl::Status launched = launch(stream);
    if (launched.ok() && cudaStreamSynchronize(stream) != cudaSuccess) {
      launched = absl::InternalError(
          absl::StrCat("profiled launch: ", cudaGetErrorString(cudaGetLastError())));
    }
    auto stop = DEQUANTD_CUPTI_PARAMS(CUpti_RangeProfiler_Stop_Params);
    stop.pRangeProfilerObject = profiler.get();
    const CUptiResult stopped = cuptiRangeProfilerStop(&stop);
    if (!launched.ok()) return launched;
    DEQUANTD_CUPTI_RETURN_IF_ERROR(stopped);
    if (stop.isAllPassSubmitted) break;
  }

  auto decode = DEQUANTD_CUPTI_PARAMS(CUpti_RangeProfiler_DecodeData_Params);
  decode.pRangeProfilerObject = profiler.get();
  DEQUANTD_CUPTI_RETURN_IF_ERROR(cuptiRangeProfilerDecodeData(&decode));

  auto info = DEQUANTD_CUPTI_PARAMS(CUpti_RangeProfiler_GetCounterDataInfo_Params);
  info.pCounterDataImage = counter_data.data();
  info.counterDataImageSize = counter_data.size();
  DEQUANTD_CUPTI_RETURN_IF_ERROR(cuptiRangeProfilerGetCounterDataInfo(&info));
  if (info.numTotalRanges == 0) {
    return absl::InternalError("the range profiler recorded no kernel (did the launch run one?)");
  }
  if (info.numTotalRanges > 1) {
    // Auto ranges cover every kernel of the context: another thread's kernel (a Dequantize call
    // in the server) ran between Start and Stop, so range 0 may not be ours.
    *busy = true;
    return absl::UnavailableError(absl::StrCat("the device was busy: ", info.numTotalRanges,
                                               " kernels ran while profiling a launch of one "
                                               "(other work on the device); retry when idle"));
  }

  std::vector<double> values(metrics.size());
  auto eval = DEQUANTD_CUPTI_PARAMS(CUpti_Profiler_Host_EvaluateToGpuValues_Params);
  eval.pHostObject = host.host();
  eval.pCounterDataImage = counter_data.data();
  eval.counterDataImageSize = counter_data.size();
  eval.rangeIndex = 0;
  eval.ppMetricNames = metrics.data();
  eval.numMetrics = metrics.size();
  eval.pMetricValues = values.data();
  DEQUANTD_CUPTI_RETURN_IF_ERROR(cuptiProfilerHostEvaluateToGpuValues(&eval));

  std::map<std::string, double> out;
  for (size_t i = 0; i < names.size(); ++i) {
    const bool percent = absl::EndsWith(names[i], ".pct") || absl::StrContains(names[i], "pct_of");
    out[names[i]] = percent ? std::clamp(values[i], 0.0, 100.0) : values[i];
  }
  return out;
}

}  // namespace

absl::StatusOr<std::map<std::string, double>> MeasureCounters(
    const std::function<absl::Status(cudaStream_t)>& launch, cudaStream_t stream) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  absl::StatusOr<std::map<std::string, double>> result;
  for (int attempt = 0; attempt < kBusyAttempts; ++attempt) {
    bool busy = false;
    result = Measure(launch, stream, &busy);
    if (!busy) break;
  }
  return result;
}

}  // namespace dequantd::bench
