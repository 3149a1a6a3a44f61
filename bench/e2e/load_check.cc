// CheckServedLayers (see load_check.h).
#include "bench/e2e/load_check.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/dequant.h"

namespace dequantd::e2e {

std::vector<size_t> LayersToCheck(const SyntheticModel& model) {
  const size_t per_block = model.distinct.size();
  std::vector<size_t> which;
  for (size_t i = 0; per_block > 0 && i < model.names.size(); ++i) {
    if (i % per_block == (i / per_block) % per_block) which.push_back(i);
  }
  if (!model.names.empty() && (which.empty() || which.back() != model.names.size() - 1)) {
    which.push_back(model.names.size() - 1);  // the last layer too
  }
  return which;
}

absl::Status CheckServedLayers(DequantClient& client, const SyntheticModel& model,
                               const std::vector<size_t>& which) {
  std::vector<std::vector<uint8_t>> reference(model.distinct.size());  // fp16 (K, N), on demand
  for (size_t i : which) {
    const size_t d = model.data_of[i];
    const SyntheticLayer& data = model.distinct[d];
    if (reference[d].empty()) {
      reference[d].resize(static_cast<size_t>(data.shape.output_bytes(DType::kF16)));
      if (absl::Status s =
              DequantizeCpu(data.view(), DType::kF16, 0, data.shape.K, reference[d].data());
          !s.ok()) {
        return s;
      }
    }
    v1::DequantizeRequest request;
    request.set_tensor(model.names[i]);
    request.set_output_dtype(v1::DTYPE_FP16);
    absl::StatusOr<DequantizedTensor> got = client.DequantizeToMemory(request);
    if (!got.ok()) return got.status();
    const std::vector<uint8_t>& want = reference[d];
    if (got->data.size() != want.size()) {
      return absl::DataLossError(absl::StrCat(model.names[i], ": ", got->data.size(),
                                              " bytes served, ", want.size(), " expected"));
    }
    const auto differ = std::mismatch(want.begin(), want.end(), got->data.begin());
    if (differ.first != want.end()) {
      return absl::DataLossError(absl::StrCat(model.names[i], ": byte ",
                                              differ.first - want.begin(), " of ", want.size(),
                                              " differs from the reference"));
    }
  }
  return absl::OkStatus();
}

}  // namespace dequantd::e2e
