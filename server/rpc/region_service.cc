// RegionService (see region_service.h).
#include "server/rpc/region_service.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "server/regions/cuda_region.h"
#include "server/regions/host_region.h"
#include "server/regions/peer.h"
#include "server/rpc/quoted_name.h"
#include "spdlog/spdlog.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;
using regions::RegionKind;

constexpr size_t kMaxNameBytes = 128;
constexpr int64_t kAlignment = 16;  // offsets: the kernels' widest store

const char* DestinationLabel(RegionKind kind) {
  return kind == RegionKind::kHost ? "host_region" : "device_region";
}

absl::Status CheckName(const std::string& name) {
  const bool valid = !name.empty() && name.size() <= kMaxNameBytes &&
                     std::all_of(name.begin(), name.end(), [](char c) {
                       return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' ||
                              c == '_' || c == '-';
                     });
  if (valid) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("name ", QuotedName(name), " must be 1..",
                                                 kMaxNameBytes, " bytes of [A-Za-z0-9._-]"));
}

absl::Status CheckRange(int64_t offset, int64_t byte_size) {
  if (offset < 0 || offset % kAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("offset must be >= 0 and a multiple of ", kAlignment, ", got ", offset));
  }
  if (byte_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("byte_size must be >= 1, got ", byte_size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SharedMemoryMode> ParseSharedMemoryMode(const std::string& text) {
  if (text == "off") return SharedMemoryMode::kOff;
  if (text == "host") return SharedMemoryMode::kHost;
  if (text == "cuda") return SharedMemoryMode::kCuda;
  if (text == "all") return SharedMemoryMode::kAll;
  return absl::InvalidArgumentError(absl::StrCat(
      "shared_memory (--shared-memory) must be off, host, cuda or all, got \"", text, "\""));
}

const char* SharedMemoryModeName(SharedMemoryMode mode) {
  switch (mode) {
    case SharedMemoryMode::kHost:
      return "host";
    case SharedMemoryMode::kCuda:
      return "cuda";
    case SharedMemoryMode::kAll:
      return "all";
    case SharedMemoryMode::kOff:
      break;
  }
  return "off";
}

RegionService::RegionService(RegionServiceOptions options, Metrics* metrics)
    : options_(std::move(options)),
      metrics_(metrics),
      registry_(options_.limits, [metrics](const regions::RegionTotals& totals) {
        if (metrics == nullptr) return;
        metrics->SetSharedMemoryRegions("host", totals.host_count, totals.host_bytes);
        metrics->SetSharedMemoryRegions("device", totals.device_count, totals.device_bytes);
      }) {
  if (metrics_ != nullptr) {
    metrics_->SetSharedMemoryRegions("host", 0, 0);
    metrics_->SetSharedMemoryRegions("device", 0, 0);
  }
  if (options_.mode != SharedMemoryMode::kOff && options_.idle_release_seconds > 0) {
    idle_thread_ = std::thread([this] { IdleLoop(); });
  }
}

RegionService::~RegionService() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (idle_thread_.joinable()) idle_thread_.join();
}

void RegionService::IdleLoop() {
  const auto idle = std::chrono::duration_cast<regions::RegionRegistry::Clock::duration>(
      std::chrono::duration<double>(options_.idle_release_seconds));
  // Checks four times per idle period (every 0.1 s at least, 10 s at most): a region goes at
  // most a quarter period late.
  const auto period = std::clamp<regions::RegionRegistry::Clock::duration>(
      idle / 4, std::chrono::milliseconds(100), std::chrono::seconds(10));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_cv_.wait_for(lock, period, [this] { return stop_; })) {
    lock.unlock();
    for (const std::string& name :
         registry_.ReleaseIdle(regions::RegionRegistry::Clock::now(), idle)) {
      spdlog::info("shared memory: released region \"{}\", unused for {} s", name,
                   options_.idle_release_seconds);
    }
    lock.lock();
  }
}

absl::Status RegionService::CheckAllowed(const std::string& peer, bool device) const {
  const SharedMemoryMode mode = options_.mode;
  const bool allowed = mode == SharedMemoryMode::kAll ||
                       mode == (device ? SharedMemoryMode::kCuda : SharedMemoryMode::kHost);
  if (!allowed) {
    return absl::FailedPreconditionError(absl::StrCat(
        device ? "device (CUDA IPC)" : "host (system shared-memory)",
        " regions are switched off on this server (--shared-memory=", SharedMemoryModeName(mode),
        "; start it with --shared-memory=", device ? "cuda" : "host", " or all)"));
  }
  return CheckPeer(peer);
}

absl::Status RegionService::CheckPeer(const std::string& peer) const {
  if (regions::IsSameHostPeer(peer)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("shared-memory regions are served to same-host clients only (loopback or a "
                   "Unix socket); this call came from ",
                   QuotedName(peer)));
}

absl::Status RegionService::RegisterSystem(const std::string& peer,
                                           const v1::RegisterSystemSharedMemoryRequest& request,
                                           v1::RegisterSystemSharedMemoryResponse* response) {
  if (absl::Status s = CheckAllowed(peer, /*device=*/false); !s.ok()) return s;
  if (absl::Status s = CheckName(request.name()); !s.ok()) return s;
  if (absl::Status s = CheckRange(request.offset(), request.byte_size()); !s.ok()) return s;
  if (absl::Status s = registry_.CheckCanAdd(request.name(), request.byte_size()); !s.ok()) {
    return s;
  }
  regions::RegionSpec spec{.name = request.name(),
                           .key = request.key(),
                           .device = -1,
                           .offset = request.offset(),
                           .byte_size = request.byte_size(),
                           .owner = peer};
  absl::StatusOr<std::unique_ptr<regions::Region>> region =
      regions::OpenHostRegion(std::move(spec), options_.pin_host_regions);
  if (!region.ok()) return region.status();
  const bool pinned = (*region)->pinned();
  if (absl::Status s = registry_.Add(std::move(*region)); !s.ok()) return s;
  response->set_pinned(pinned);
  spdlog::info("shared memory: {} registered host region \"{}\" ({} bytes of {}, pinned: {})", peer,
               request.name(), request.byte_size(), request.key(), pinned);
  return absl::OkStatus();
}

absl::Status RegionService::RegisterCuda(const std::string& peer,
                                         const v1::RegisterCudaSharedMemoryRequest& request,
                                         v1::RegisterCudaSharedMemoryResponse*) {
  if (absl::Status s = CheckAllowed(peer, /*device=*/true); !s.ok()) return s;
  if (absl::Status s = CheckName(request.name()); !s.ok()) return s;
  if (absl::Status s = CheckRange(request.offset(), request.byte_size()); !s.ok()) return s;
  const std::vector<int>& devices = options_.cuda_devices;
  if (std::find(devices.begin(), devices.end(), request.device_id()) == devices.end()) {
    std::string used;
    for (int d : devices) absl::StrAppend(&used, used.empty() ? "" : ", ", d);
    return absl::FailedPreconditionError(absl::StrCat(
        "device_id ", request.device_id(), ": the backend does not compute on that device (",
        devices.empty() ? "the cpu backend computes on no CUDA device"
                        : absl::StrCat("it uses device(s) ", used),
        ")"));
  }
  if (absl::Status s = registry_.CheckCanAdd(request.name(), request.byte_size()); !s.ok()) {
    return s;
  }
  regions::RegionSpec spec{.name = request.name(),
                           .key = "",
                           .device = request.device_id(),
                           .offset = request.offset(),
                           .byte_size = request.byte_size(),
                           .owner = peer};
  absl::StatusOr<std::unique_ptr<regions::Region>> region =
      regions::OpenCudaRegion(std::move(spec), request.raw_handle());
  if (!region.ok()) return region.status();
  if (absl::Status s = registry_.Add(std::move(*region)); !s.ok()) return s;
  spdlog::info("shared memory: {} registered device region \"{}\" ({} bytes on device {})", peer,
               request.name(), request.byte_size(), request.device_id());
  return absl::OkStatus();
}

namespace {

// Unregisters `name` of `kind` (empty: every region of that kind); returns how many.
absl::StatusOr<int> Unregister(regions::RegionRegistry& registry, const std::string& name,
                               RegionKind kind) {
  if (name.empty()) return registry.RemoveAll(kind);
  if (absl::Status s = registry.Remove(name, kind); !s.ok()) return s;
  return 1;
}

}  // namespace

absl::Status RegionService::UnregisterSystem(const std::string& peer,
                                             const v1::UnregisterSystemSharedMemoryRequest& request,
                                             v1::UnregisterSystemSharedMemoryResponse* response) {
  if (absl::Status s = CheckAllowed(peer, /*device=*/false); !s.ok()) return s;
  absl::StatusOr<int> released = Unregister(registry_, request.name(), RegionKind::kHost);
  if (!released.ok()) return released.status();
  response->set_released(*released);
  return absl::OkStatus();
}

absl::Status RegionService::UnregisterCuda(const std::string& peer,
                                           const v1::UnregisterCudaSharedMemoryRequest& request,
                                           v1::UnregisterCudaSharedMemoryResponse* response) {
  if (absl::Status s = CheckAllowed(peer, /*device=*/true); !s.ok()) return s;
  absl::StatusOr<int> released = Unregister(registry_, request.name(), RegionKind::kDevice);
  if (!released.ok()) return released.status();
  response->set_released(*released);
  return absl::OkStatus();
}

absl::Status RegionService::Status(const std::string& peer,
                                   v1::SharedMemoryStatusResponse* response) {
  if (absl::Status s = CheckPeer(peer); !s.ok()) return s;
  response->set_mode(SharedMemoryModeName(options_.mode));
  response->set_max_regions(options_.limits.max_regions);
  response->set_max_bytes(options_.limits.max_bytes);
  response->set_idle_release_seconds(options_.idle_release_seconds);
  for (const regions::RegionStatus& status : registry_.List()) {
    v1::SharedMemoryRegionInfo* info = response->add_regions();
    info->set_name(status.spec.name);
    info->set_kind(regions::RegionKindName(status.kind));
    info->set_key(status.spec.key);
    info->set_device_id(status.spec.device);
    info->set_offset(status.spec.offset);
    info->set_byte_size(status.spec.byte_size);
    info->set_pinned(status.pinned);
    info->set_owner(status.spec.owner);
    info->set_calls_in_flight(status.calls_in_flight);
    info->set_idle_seconds(status.idle_seconds);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<regions::RegionSink>> RegionService::MakeSink(
    const std::string& peer, const v1::OutputRegion& output, std::vector<int64_t> result_bytes,
    std::function<bool()> cancelled) {
  if (options_.mode == SharedMemoryMode::kOff) {
    return absl::FailedPreconditionError(
        "output_region: shared-memory regions are switched off on this server "
        "(--shared-memory=off); leave output_region unset to stream the result");
  }
  if (absl::Status s = CheckPeer(peer); !s.ok()) return s;
  absl::StatusOr<regions::RegionLease> lease = registry_.Acquire(output.name());
  if (!lease.ok()) return lease.status();
  const regions::Region& region = lease->region();
  int64_t total = 0;
  for (int64_t bytes : result_bytes) total += bytes;
  // The caller's own total first: a stale listing is named as such, not as a misfit.
  if (output.expected_bytes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("output_region.expected_bytes must be >= 0, got ", output.expected_bytes()));
  }
  if (output.expected_bytes() != 0 && output.expected_bytes() != total) {
    return absl::FailedPreconditionError(absl::StrCat(
        "output_region.expected_bytes = ", output.expected_bytes(), ", but the results are ", total,
        " bytes (", result_bytes.size(),
        " results): the client's listing does not describe this server's model; nothing was "
        "written"));
  }
  const int64_t size = region.spec().byte_size;
  if (output.offset() < 0 || output.offset() % kAlignment != 0 || output.offset() > size ||
      total > size - output.offset()) {
    return absl::InvalidArgumentError(
        absl::StrCat("output_region: region \"", output.name(), "\" is ", size, " bytes; ", total,
                     " bytes of results at offset ", output.offset(),
                     output.offset() % kAlignment != 0 || output.offset() < 0
                         ? absl::StrCat(": the offset must be >= 0 and a multiple of ", kAlignment)
                         : " run past its end"));
  }
  Metrics* metrics = metrics_;
  return std::make_unique<regions::RegionSink>(
      std::move(*lease), output.offset(), std::move(result_bytes), std::move(cancelled),
      [metrics](RegionKind kind, int64_t bytes) {
        if (metrics != nullptr) metrics->AddDeliveredBytes(DestinationLabel(kind), bytes);
      });
}

}  // namespace dequantd
