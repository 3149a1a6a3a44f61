// StoredTensorCopier on CUDA (issue 23): a stored tensor is read by several threads in chunks
// (ReadRawTensorChunks) into pinned staging and copied to the device region asynchronously, each
// thread reading its next chunk while its last one crosses PCIe (PinnedReadStaging).
//
// Memory and threads, bounded server-wide: one staging of `staging_bytes` pinned host memory per
// GPU that serves such a call, made at the first one and kept for the server's life (so a load
// pays no cudaHostAlloc); one call per GPU uses it at a time (others wait), with its reader
// threads (at most `threads`, made for the call). Tensors under 2 chunks take the one-thread
// path (min_bytes()).
//
// Optionally (`resident_bytes` > 0, off by default) a tensor copied into a device region is also
// kept in device memory of that GPU, up to `resident_bytes` per GPU (first come, kept until the
// server stops; a tensor that does not fit, or whose cudaMalloc fails, takes the staged path each
// time): the next call copies it device to device. Its file is still checked at every call
// (replaced or truncated: DATA_LOSS, as ReadTensor says), but, like the layers, the bytes served
// are those read at the first call (a rewrite in place of the same size is not seen).
#pragma once

#include <cstdint>
#include <memory>

#include "server/backend/stored_tensor_copier.h"

namespace dequantd::cuda {

// `threads` >= 1 reader threads and `staging_bytes` >= 2 MiB of pinned host memory per GPU, cut
// as the model upload's staging (PlanLoadStaging: fewer threads when the staging cannot give each
// its buffers of 1 MiB); `resident_bytes` >= 0 of device memory per GPU for kept tensors (0: none).
std::unique_ptr<StoredTensorCopier> MakeStagedTensorCopier(int threads, int64_t staging_bytes,
                                                           int64_t resident_bytes = 0);

}  // namespace dequantd::cuda
