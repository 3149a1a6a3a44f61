// Fuzzes safetensors::ParseHeader on whole files: it must return a status (never crash, read out
// of bounds or overflow), and every tensor it accepts must lie inside the data section and not
// overlap another.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::StatusOr<dequantd::safetensors::Header> header =
      dequantd::safetensors::ParseHeader(absl::MakeConstSpan(data, size));
  if (!header.ok()) return 0;
  const int64_t data_bytes = static_cast<int64_t>(size) - header->data_start;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& [name, e] : header->tensors) {
    if (e.data_begin < 0 || e.data_begin > e.data_end || e.data_end > data_bytes) std::abort();
    if (e.data_end > e.data_begin) ranges.emplace_back(e.data_begin, e.data_end);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) std::abort();  // overlap accepted
  }
  return 0;
}
