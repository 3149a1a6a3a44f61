// dequantd_load_bench's check that the load put every byte where it belongs (issue 22): layers
// of a server started on a checkpoint written from a SyntheticModel, dequantized by the server
// (from its resident copy) and compared byte for byte with DequantizeCpu of the same packed data.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "bench/e2e/synthetic_model.h"
#include "client/client.h"

namespace dequantd::e2e {

// One layer of each model block (80 for the 70B shape), the projection rotating from block to
// block, so every projection and every part of the checkpoint (every shard, every device block)
// is checked: indices into model.names.
std::vector<size_t> LayersToCheck(const SyntheticModel& model);

// Dequantizes model.names[i] for each i of `which` through `client` (fp16, the format's own
// (K, N)) and compares it with the reference. Errors: the call's, or DATA_LOSS naming the first
// layer whose result differs and where.
absl::Status CheckServedLayers(DequantClient& client, const SyntheticModel& model,
                               const std::vector<size_t>& which);

}  // namespace dequantd::e2e
