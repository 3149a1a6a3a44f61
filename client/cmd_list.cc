// `dequantctl list` (see commands.h).
#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/table.h"

namespace dequantd {

absl::Status RunList(DequantClient& client, std::ostream& out) {
  absl::StatusOr<v1::ListTensorsResponse> response = client.ListTensors();
  if (!response.ok()) return response.status();
  Table table({"name", "K", "N", "group_size", "scale dtype", "MiB", "resident"},
              {false, true, true, true, false, true, false});
  int64_t total_bytes = 0;
  for (const v1::QuantizedTensorInfo& t : response->tensors()) {
    table.AddRow({t.name(), absl::StrCat(t.in_features()), absl::StrCat(t.out_features()),
                  absl::StrCat(t.group_size()), OutputDTypeName(t.scale_dtype()),
                  Fixed(static_cast<double>(t.packed_bytes()) / (1 << 20), 2),
                  t.resident_on_device() ? "gpu" : "host"});
    total_bytes += t.packed_bytes();
  }
  table.Print(out);
  out << Count(response->tensors_size(), "tensor") << ", "
      << Fixed(static_cast<double>(total_bytes) / (1 << 20), 2) << " MiB packed, model '"
      << response->model() << "'\n";
  return absl::OkStatus();
}

}  // namespace dequantd
