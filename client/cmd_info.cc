// `dequantctl info` (see commands.h).
#include "client/commands.h"
#include "client/table.h"

namespace dequantd {

absl::Status RunInfo(DequantClient& client, std::ostream& out) {
  absl::StatusOr<v1::GetServerInfoResponse> info = client.GetServerInfo();
  if (!info.ok()) return info.status();
  // The layers' formats are ListTensors' (GetServerInfo carries none); same reader role.
  absl::StatusOr<v1::ListTensorsResponse> list = client.ListTensors();
  if (!list.ok()) return list.status();
  out << "version:      " << info->version() << '\n'
      << "backend:      " << info->backend() << '\n'
      << "model:        " << info->model() << '\n'
      << "tensors:      " << info->tensor_count() << '\n'
      << "formats:      " << LayerFormatSummary(*list) << '\n'
      << "cpu threads:  " << info->cpu_threads() << '\n'
      << "devices:      " << info->devices_size() << '\n';
  for (const v1::DeviceInfo& d : info->devices()) {
    out << "  [" << d.index() << "] " << d.name();
    if (!d.compute_capability().empty()) out << ", compute capability " << d.compute_capability();
    out << ", " << Fixed(static_cast<double>(d.memory_bytes()) / (int64_t{1} << 30), 1) << " GiB";
    if (!d.driver_version().empty()) out << ", driver " << d.driver_version();
    out << '\n';
  }
  if (info->backend() == "cuda") {
    out << "autotune:     " << info->autotune_entries() << " entries, " << info->autotune_hits()
        << " hits, " << info->autotune_misses() << " misses, " << info->autotune_tunings()
        << " tunings, cache " << (info->tune_cache().empty() ? "(memory only)" : info->tune_cache())
        << '\n';
  }
  return absl::OkStatus();
}

}  // namespace dequantd
