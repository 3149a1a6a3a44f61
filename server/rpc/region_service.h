// The shared-memory region RPCs of dequant.v1.DequantService (issue 9) and the region sinks of
// Dequantize/DequantizeLayers: DequantService's handlers call these with the peer and request.
// Owns the RegionRegistry and, with an idle release set, a thread that releases idle regions.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dequant/v1/dequant.pb.h"
#include "server/metrics/metrics.h"
#include "server/regions/region_sink.h"
#include "server/regions/registry.h"

namespace dequantd {

// --shared-memory: which regions clients may register.
enum class SharedMemoryMode { kOff, kHost, kCuda, kAll };

// "off", "host", "cuda", "all" <-> the mode. INVALID_ARGUMENT naming --shared-memory otherwise.
absl::StatusOr<SharedMemoryMode> ParseSharedMemoryMode(const std::string& text);
const char* SharedMemoryModeName(SharedMemoryMode mode);

struct RegionServiceOptions {
  SharedMemoryMode mode = SharedMemoryMode::kOff;
  regions::RegistryLimits limits;
  double idle_release_seconds = 0;  // release regions unused this long, seconds; 0 = never
  bool pin_host_regions = false;    // cudaHostRegister host regions (the CUDA backend's DMA)
  std::vector<int> cuda_devices;    // devices the backend computes on; device regions elsewhere
                                    // are FAILED_PRECONDITION (empty: the CPU backend)
};

// Thread-safe. `metrics` (may be null) must outlive it.
class RegionService {
 public:
  RegionService(RegionServiceOptions options, Metrics* metrics);
  ~RegionService();  // stops the idle thread, releases every region (no call may be running)

  // The RPCs; `peer` is grpc::ServerContext::peer(). Errors: see the proto, and
  // FAILED_PRECONDITION (the mode does not allow the kind), PERMISSION_DENIED (a remote peer).
  absl::Status RegisterSystem(const std::string& peer,
                              const dequant::v1::RegisterSystemSharedMemoryRequest& request,
                              dequant::v1::RegisterSystemSharedMemoryResponse* response);
  absl::Status UnregisterSystem(const std::string& peer,
                                const dequant::v1::UnregisterSystemSharedMemoryRequest& request,
                                dequant::v1::UnregisterSystemSharedMemoryResponse* response);
  absl::Status RegisterCuda(const std::string& peer,
                            const dequant::v1::RegisterCudaSharedMemoryRequest& request,
                            dequant::v1::RegisterCudaSharedMemoryResponse* response);
  absl::Status UnregisterCuda(const std::string& peer,
                              const dequant::v1::UnregisterCudaSharedMemoryRequest& request,
                              dequant::v1::UnregisterCudaSharedMemoryResponse* response);
  absl::Status Status(const std::string& peer, dequant::v1::SharedMemoryStatusResponse* response);

  // The sink of a call whose output is `output` (results of `result_bytes` each, one after
  // another). `cancelled` is polled by its Writes (RegionSink::kCancelPollInterval). Errors:
  // FAILED_PRECONDITION (regions off), PERMISSION_DENIED (remote peer), NOT_FOUND (the name),
  // INVALID_ARGUMENT (offset negative, not a multiple of 16, or the results past the region's
  // end: naming region, offset and bytes), the region's CheckUsable error.
  absl::StatusOr<std::unique_ptr<regions::RegionSink>> MakeSink(
      const std::string& peer, const dequant::v1::OutputRegion& output,
      std::vector<int64_t> result_bytes, std::function<bool()> cancelled);

  regions::RegionRegistry& registry() { return registry_; }

 private:
  // FAILED_PRECONDITION when the mode does not allow the kind, then CheckPeer's.
  absl::Status CheckAllowed(const std::string& peer, bool device) const;
  // PERMISSION_DENIED naming `peer` unless it is on this host.
  absl::Status CheckPeer(const std::string& peer) const;
  void IdleLoop();

  const RegionServiceOptions options_;
  Metrics* const metrics_;
  regions::RegionRegistry registry_;
  std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread idle_thread_;
};

}  // namespace dequantd
