// `dequantctl info` (see commands.h).
#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/table.h"

namespace dequantd {

absl::Status RunInfo(DequantClient& client, std::ostream& out) {
  absl::StatusOr<v1::GetServerInfoResponse> info = client.GetServerInfo();
  if (!info.ok()) return info.status();
  // The layers' formats are ListTensors' (GetServerInfo carries none). That call can fail where
  // GetServerInfo did not (a list over the client's max_receive_message_bytes, a deadline): the
  // line then says why and the rest of the server's facts are still printed.
  absl::StatusOr<v1::ListTensorsResponse> list = client.ListTensors();
  out << "version:      " << info->version() << '\n'
      << "backend:      " << info->backend() << '\n'
      << "model:        " << info->model() << '\n'
      << "tensors:      " << info->tensor_count() << '\n'
      << "formats:      "
      << (list.ok() ? LayerFormatSummary(*list)
                    : absl::StrCat("unknown (ListTensors failed: ", list.status().ToString(), ")"))
      << '\n'
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
