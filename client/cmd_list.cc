// `dequantctl list` (see commands.h).
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/table.h"

namespace dequantd {

absl::Status RunList(DequantClient& client, std::ostream& out) {
  absl::StatusOr<v1::ListTensorsResponse> response = client.ListTensors();
  if (!response.ok()) return response.status();
  // An "E" column (stacked experts, mxfp4) only when some layer has more than one.
  const bool experts =
      std::any_of(response->tensors().begin(), response->tensors().end(),
                  [](const v1::QuantizedTensorInfo& t) { return t.experts() > 1; });
  std::vector<std::string> titles = {"name",        "K",   "N",       "group_size",
                                     "scale dtype", "MiB", "resident"};
  std::vector<bool> right = {false, true, true, true, false, true, false};
  if (experts) {
    titles.insert(titles.begin() + 1, "E");
    right.insert(right.begin() + 1, true);
  }
  Table table(titles, right);
  int64_t total_bytes = 0;
  for (const v1::QuantizedTensorInfo& t : response->tensors()) {
    std::vector<std::string> row = {t.name(),
                                    absl::StrCat(t.in_features()),
                                    absl::StrCat(t.out_features()),
                                    absl::StrCat(t.group_size()),
                                    OutputDTypeName(t.scale_dtype()),
                                    Fixed(static_cast<double>(t.packed_bytes()) / (1 << 20), 2),
                                    t.resident_on_device() ? "gpu" : "host"};
    if (experts) row.insert(row.begin() + 1, absl::StrCat(std::max<int64_t>(1, t.experts())));
    table.AddRow(row);
    total_bytes += t.packed_bytes();
  }
  table.Print(out);
  out << Count(response->tensors_size(), "tensor") << ", "
      << Fixed(static_cast<double>(total_bytes) / (1 << 20), 2) << " MiB packed, model '"
      << response->model() << "'\n";
  return absl::OkStatus();
}

}  // namespace dequantd
