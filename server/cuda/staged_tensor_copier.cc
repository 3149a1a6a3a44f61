// MakeStagedTensorCopier (see staged_tensor_copier.h).
#include "server/cuda/staged_tensor_copier.h"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "server/cuda/pinned_read_staging.h"

namespace dequantd::cuda {
namespace {

class StagedTensorCopier final : public StoredTensorCopier {
 public:
  StagedTensorCopier(int threads, int64_t staging_bytes)
      : shape_(PinnedReadStaging::ShapeFor(threads, staging_bytes)),
        staging_bytes_(staging_bytes) {}

  int64_t min_bytes() const override { return 2 * shape_.chunk_bytes; }

  absl::Status CopyToDevice(const RawTensor& tensor, int device, uint8_t* device_dst,
                            const BeforeCopy& before_copy) override {
    Slot& slot = SlotOf(device);
    std::lock_guard<std::mutex> hold(slot.mu);  // one call per GPU holds its staging
    if (slot.staging == nullptr) {
      absl::StatusOr<std::unique_ptr<PinnedReadStaging>> made =
          PinnedReadStaging::Make(device, shape_);
      if (!made.ok()) {
        if (made.status().code() != absl::StatusCode::kResourceExhausted) return made.status();
        return absl::ResourceExhaustedError(
            absl::StrCat("cannot allocate ", int64_t{shape_.threads} * 2 * shape_.chunk_bytes,
                         " bytes of pinned host memory to stage ReadTensor into a device region "
                         "(--read-staging-bytes=",
                         staging_bytes_, "): ", made.status().message()));
      }
      slot.staging = *std::move(made);
    }
    PinnedReadStaging& pinned = *slot.staging;
    int current = 0;
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current));
    absl::Cleanup restore = [current] { cudaSetDevice(current); };
    std::mutex report_mu;  // before_copy's calls are serialized
    const absl::Status read = ReadRawTensorChunks(
        tensor, pinned.threads(), pinned.chunk_bytes(),
        [&](int thread, const ReadChunk&) { return pinned.NextBuffer(thread); },
        [&](int thread, const ReadChunk& c, uint8_t*) -> absl::Status {
          {
            std::lock_guard<std::mutex> lock(report_mu);
            if (absl::Status s = before_copy(c.tensor_offset, c.bytes); !s.ok()) return s;
          }
          return pinned.CopyToDevice(thread, device_dst + c.tensor_offset, c.bytes);
        });
    // Every copy must be done (or failed) before the reply, and before the next call reuses the
    // staging, on every path.
    const absl::Status synced = pinned.Synchronize();
    if (!read.ok()) return read;
    return synced;
  }

 private:
  struct Slot {
    std::mutex mu;
    std::unique_ptr<PinnedReadStaging> staging;  // guarded by mu; made at the first call
  };

  Slot& SlotOf(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    return slots_[device];  // std::map: a Slot never moves once made
  }

  const PinnedReadStaging::Shape shape_;
  const int64_t staging_bytes_;
  std::mutex mu_;
  std::map<int, Slot> slots_;  // by CUDA device; guarded by mu_
};

}  // namespace

std::unique_ptr<StoredTensorCopier> MakeStagedTensorCopier(int threads, int64_t staging_bytes) {
  return std::make_unique<StagedTensorCopier>(threads, staging_bytes);
}

}  // namespace dequantd::cuda
