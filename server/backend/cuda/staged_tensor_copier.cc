// MakeStagedTensorCopier (see staged_tensor_copier.h).
#include "server/backend/cuda/staged_tensor_copier.h"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <string>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "server/backend/cuda/cuda_objects.h"
#include "server/backend/cuda/pinned_read_staging.h"

namespace dequantd::cuda {
namespace {

class StagedTensorCopier final : public StoredTensorCopier {
 public:
  StagedTensorCopier(int threads, int64_t staging_bytes, int64_t resident_bytes)
      : plan_(PlanLoadStaging(threads, staging_bytes)),
        staging_bytes_(staging_bytes),
        resident_bytes_(resident_bytes) {}

  int64_t min_bytes() const override { return 2 * plan_.chunk_bytes; }

  absl::Status CopyToDevice(const RawTensor& tensor, int device, uint8_t* device_dst,
                            const BeforeCopy& before_copy) override {
    Slot& slot = SlotOf(device);
    std::lock_guard<std::mutex> hold(slot.mu);  // one call per GPU holds its staging
    int current = 0;
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current));
    absl::Cleanup restore = [current] { cudaSetDevice(current); };
    if (resident_bytes_ > 0) {
      auto kept = slot.resident.find(tensor.name);
      if (kept == slot.resident.end() && slot.resident_used + tensor.bytes <= resident_bytes_) {
        absl::StatusOr<uint8_t*> made = Keep(slot, tensor, device);
        // No device memory for it: the staged path, as without the option.
        if (!made.ok() && made.status().code() != absl::StatusCode::kResourceExhausted) {
          return made.status();
        }
        kept = slot.resident.find(tensor.name);
      }
      if (kept != slot.resident.end()) {
        return CopyKept(slot, tensor, static_cast<const uint8_t*>(kept->second.get()), device,
                        device_dst, before_copy);
      }
    }
    return Staged(slot, tensor, device, device_dst, before_copy);
  }

 private:
  struct Slot {
    std::mutex mu;
    // Guarded by mu:
    std::unique_ptr<PinnedReadStaging> staging;          // made at the first staged copy
    UniqueStream stream;                                 // device-to-device copies of kept tensors
    std::map<std::string, UniqueDeviceMemory> resident;  // kept tensors by name
    int64_t resident_used = 0;                           // their bytes
  };

  Slot& SlotOf(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    return slots_[device];  // std::map: a Slot never moves once made
  }

  // The staged path: the file's chunks by the reader threads into the staging, each copied to
  // `device_dst` after `before_copy` allowed it. Returns once no copy runs. Holds slot.mu.
  absl::Status Staged(Slot& slot, const RawTensor& tensor, int device, uint8_t* device_dst,
                      const BeforeCopy& before_copy) {
    if (slot.staging == nullptr) {
      absl::StatusOr<std::unique_ptr<PinnedReadStaging>> made =
          PinnedReadStaging::Make(device, plan_);
      if (!made.ok()) {
        if (made.status().code() != absl::StatusCode::kResourceExhausted) return made.status();
        return absl::ResourceExhaustedError(
            absl::StrCat("cannot allocate ", plan_.bytes(),
                         " bytes of pinned host memory to stage ReadTensor into a device region "
                         "(--read-staging-bytes=",
                         staging_bytes_, "): ", made.status().message()));
      }
      slot.staging = *std::move(made);
    }
    PinnedReadStaging& pinned = *slot.staging;
    std::mutex report_mu;  // before_copy's calls are serialized
    const absl::Status read = ReadRawTensorChunks(
        tensor, pinned.threads(), pinned.chunk_bytes(),
        [&](int thread, const ReadChunk&) { return pinned.NextBuffer(thread); },
        [&](int thread, const ReadChunk& c, uint8_t* data) -> absl::Status {
          {
            std::lock_guard<std::mutex> lock(report_mu);
            if (absl::Status s = before_copy(c.tensor_offset, c.bytes); !s.ok()) return s;
          }
          return pinned.CopyToDevice(thread, data, device_dst + c.tensor_offset, c.bytes);
        });
    // Every copy must be done (or failed) before the reply, and before the next call reuses the
    // staging, on every path.
    const absl::Status synced = pinned.Synchronize();
    if (!read.ok()) return read;
    return synced;
  }

  // Device memory on `device` for `tensor`, filled from its file and added to slot.resident.
  // RESOURCE_EXHAUSTED when cudaMalloc refuses; the staged path's errors. Holds slot.mu.
  absl::StatusOr<uint8_t*> Keep(Slot& slot, const RawTensor& tensor, int device) {
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    absl::StatusOr<UniqueDeviceMemory> memory = MakeDeviceMemory(tensor.bytes);
    if (!memory.ok()) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(memory.status().message());
    }
    uint8_t* const data = static_cast<uint8_t*>(memory->get());
    if (absl::Status s =
            Staged(slot, tensor, device, data, [](int64_t, int64_t) { return absl::OkStatus(); });
        !s.ok()) {
      return s;
    }
    slot.resident.emplace(tensor.name, *std::move(memory));
    slot.resident_used += tensor.bytes;
    return data;
  }

  // A kept tensor into `device_dst`: the file checked, one report, one device-to-device copy,
  // waited for. Holds slot.mu.
  absl::Status CopyKept(Slot& slot, const RawTensor& tensor, const uint8_t* kept, int device,
                        uint8_t* device_dst, const BeforeCopy& before_copy) {
    if (absl::Status s = CheckRawTensorFile(tensor); !s.ok()) return s;
    if (absl::Status s = before_copy(0, tensor.bytes); !s.ok()) return s;
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    if (slot.stream == nullptr) {
      absl::StatusOr<UniqueStream> stream = MakeStream();
      if (!stream.ok()) return stream.status();
      slot.stream = *std::move(stream);
    }
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_dst, kept,
                                                  static_cast<size_t>(tensor.bytes),
                                                  cudaMemcpyDeviceToDevice, slot.stream.get()));
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(slot.stream.get()));
    return absl::OkStatus();
  }

  const LoadStagingPlan plan_;
  const int64_t staging_bytes_;
  const int64_t resident_bytes_;
  std::mutex mu_;
  std::map<int, Slot> slots_;  // by CUDA device; guarded by mu_
};

}  // namespace

std::unique_ptr<StoredTensorCopier> MakeStagedTensorCopier(int threads, int64_t staging_bytes,
                                                           int64_t resident_bytes) {
  return std::make_unique<StagedTensorCopier>(threads, staging_bytes, resident_bytes);
}

}  // namespace dequantd::cuda
