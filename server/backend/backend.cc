// CreateBackend: the --backend auto|cpu|cuda choice (see backend.h).
#include "server/backend/backend.h"
#include "absl/strings/str_cat.h"

namespace dequantd {

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options) {
  const std::string& kind = options.kind;
  if (kind != "auto" && kind != "cpu" && kind != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("backend must be \"auto\", \"cpu\" or \"cuda\", got \"", kind, "\""));
  }
  if (kind == "cpu") return MakeCpuBackend(options.cpu_threads, options.observer);
#if DEQUANTD_HAVE_CUDA
  if (CudaDeviceCount() > 0) return MakeCudaBackend(options.cuda, options.observer);
  if (kind == "cuda") {
    return absl::FailedPreconditionError(
        "backend \"cuda\" was requested but no CUDA device is available (use --backend=cpu or "
        "auto)");
  }
#else
  if (kind == "cuda") {
    return absl::FailedPreconditionError(
        "backend \"cuda\" was requested but this dequantd was built without CUDA (use "
        "--backend=cpu "
        "or auto)");
  }
#endif
  return MakeCpuBackend(options.cpu_threads, options.observer);
}

}  // namespace dequantd
