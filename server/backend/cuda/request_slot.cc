// RequestSlot (see request_slot.h).
#include "server/backend/cuda/request_slot.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace dequantd::cuda {
namespace {

// Pinned host memory for a BlockPool. cudaFreeHost may run on a gRPC thread after the call (the
// last slice of a block released); it needs only the process's CUDA context, which lives until
// exit.
BlockPool::Allocator PinnedAllocator() {
  return BlockPool::Allocator{
      .allocate = [](int64_t bytes) -> absl::StatusOr<uint8_t*> {
        absl::StatusOr<UniquePinnedMemory> pinned = MakePinnedMemory(bytes);
        if (!pinned.ok()) return pinned.status();
        return pinned->release();
      },
      .free = [](uint8_t* block) { PinnedFree()(block); },
  };
}

}  // namespace

absl::StatusOr<std::unique_ptr<RequestSlot>> RequestSlot::Create(int64_t staging_bytes,
                                                                 int staging_blocks, bool timing,
                                                                 const std::string& label) {
  if (staging_blocks < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging_blocks must be >= 2 (two copies in flight), got ", staging_blocks));
  }
  auto slot = std::make_unique<RequestSlot>();
  slot->staging_bytes = staging_bytes;
  absl::StatusOr<std::unique_ptr<BlockPool>> staging =
      BlockPool::Create(staging_blocks, staging_bytes, PinnedAllocator(),
                        absl::StrCat("the pinned staging blocks of a request slot on ", label));
  if (!staging.ok()) return staging.status();
  slot->staging = std::move(*staging);
  absl::StatusOr<UniqueStream> stream = MakeStream();
  if (!stream.ok()) return stream.status();
  slot->stream = std::move(*stream);
  for (UniquePinnedMemory& buffer : slot->upload) {
    absl::StatusOr<UniquePinnedMemory> pinned = MakePinnedMemory(kUploadBufferBytes);
    if (!pinned.ok()) return pinned.status();
    buffer = std::move(*pinned);
  }
  for (auto* events : {&slot->copy_start, &slot->copied, &slot->kernel_start, &slot->kernel_end,
                       &slot->h2d_start, &slot->h2d_end, &slot->uploaded}) {
    for (UniqueEvent& event : *events) {
      absl::StatusOr<UniqueEvent> made = MakeEvent(timing);
      if (!made.ok()) return made.status();
      event = std::move(*made);
    }
  }
  return slot;
}

}  // namespace dequantd::cuda
