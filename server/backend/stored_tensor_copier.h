// The seam for ReadTensor into a device region (issue 23): copying a stored tensor (embeddings,
// lm_head, norms; server/model/raw_tensor.h) from its file into device memory at the page cache's
// and PCIe's rate rather than one thread's. The CUDA implementation is
// server/backend/cuda/staged_tensor_copier.h; without it (the CPU backend, --read-staging-bytes=0)
// the service reads the tensor with one thread and copies it in through the region sink, as before.
#pragma once

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "server/model/raw_tensor.h"

namespace dequantd {

class StoredTensorCopier {
 public:
  // Called before the copy of a piece is enqueued: bytes [offset, offset + bytes) of the tensor.
  // Its error (the region sink's: bounds, the client's cancellation, an Unregister) stops the copy
  // and is returned. Calls are serialized (never two at once).
  using BeforeCopy = std::function<absl::Status(int64_t offset, int64_t bytes)>;

  virtual ~StoredTensorCopier() = default;

  // Tensors of at least this many bytes are worth the staged path; smaller ones (norms, biases)
  // take the one-thread path, so they never wait behind a large copy.
  virtual int64_t min_bytes() const = 0;

  // Copies every byte of `tensor` to `device_dst` (tensor.bytes bytes of device memory on CUDA
  // device `device`) and returns once they are all there, or, on an error, once no copy of this
  // call still runs (the caller may then release the memory). Thread-safe; calls on one device
  // may wait for each other (the staging is shared). Errors: ReadRawTensorChunks' (NOT_FOUND,
  // DATA_LOSS naming file and tensor), RESOURCE_EXHAUSTED (the pinned staging cannot be had),
  // INTERNAL (CUDA), `before_copy`'s.
  virtual absl::Status CopyToDevice(const RawTensor& tensor, int device, uint8_t* device_dst,
                                    const BeforeCopy& before_copy) = 0;
};

}  // namespace dequantd
