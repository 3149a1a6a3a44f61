// `dequantctl list` (see commands.h).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/table.h"

namespace dequantd {

std::string LayerFormatName(const v1::QuantizedTensorInfo& layer) {
  return layer.format().empty() ? "awq_gemm" : layer.format();
}

std::string LayerFormatSummary(const v1::ListTensorsResponse& list) {
  // (format, experts) -> layers, in the order first seen.
  std::vector<std::pair<std::pair<std::string, int64_t>, int64_t>> groups;
  for (const v1::QuantizedTensorInfo& t : list.tensors()) {
    const std::pair<std::string, int64_t> key = {LayerFormatName(t),
                                                 std::max<int64_t>(1, t.experts())};
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&key](const auto& g) { return g.first == key; });
    if (it == groups.end()) {
      groups.push_back({key, 1});
    } else {
      ++it->second;
    }
  }
  if (groups.empty()) return "none (no quantized layers)";
  std::string out;
  for (const auto& [key, layers] : groups) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", key.first, " (", Count(layers, "layer"),
                    key.second > 1 ? absl::StrCat(", ", key.second, " experts each") : "", ")");
  }
  return out;
}

absl::Status RunList(DequantClient& client, std::ostream& out) {
  absl::StatusOr<v1::ListTensorsResponse> response = client.ListTensors();
  if (!response.ok()) return response.status();
  // An "E" column (stacked experts, mxfp4) only when some layer has more than one.
  const bool experts =
      std::any_of(response->tensors().begin(), response->tensors().end(),
                  [](const v1::QuantizedTensorInfo& t) { return t.experts() > 1; });
  std::vector<std::string> titles = {"name",       "format",      "K",   "N",
                                     "group_size", "scale dtype", "MiB", "resident"};
  std::vector<bool> right = {false, false, true, true, true, false, true, false};
  if (experts) {
    titles.insert(titles.begin() + 2, "E");
    right.insert(right.begin() + 2, true);
  }
  Table table(titles, right);
  int64_t total_bytes = 0;
  for (const v1::QuantizedTensorInfo& t : response->tensors()) {
    std::vector<std::string> row = {t.name(),
                                    LayerFormatName(t),
                                    absl::StrCat(t.in_features()),
                                    absl::StrCat(t.out_features()),
                                    absl::StrCat(t.group_size()),
                                    OutputDTypeName(t.scale_dtype()),
                                    Fixed(static_cast<double>(t.packed_bytes()) / (1 << 20), 2),
                                    t.resident_on_device() ? "gpu" : "host"};
    if (experts) row.insert(row.begin() + 2, absl::StrCat(std::max<int64_t>(1, t.experts())));
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
