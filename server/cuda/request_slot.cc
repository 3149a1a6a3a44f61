// RequestSlot (see request_slot.h).
#include "server/cuda/request_slot.h"

namespace dequantd::cuda {

absl::StatusOr<std::unique_ptr<RequestSlot>> RequestSlot::Create(int64_t staging_bytes,
                                                                 bool timing) {
  auto slot = std::make_unique<RequestSlot>();
  slot->staging_bytes = staging_bytes;
  absl::StatusOr<UniqueStream> stream = MakeStream();
  if (!stream.ok()) return stream.status();
  slot->stream = std::move(*stream);
  for (UniquePinnedMemory& buffer : slot->staging) {
    absl::StatusOr<UniquePinnedMemory> pinned = MakePinnedMemory(staging_bytes);
    if (!pinned.ok()) return pinned.status();
    buffer = std::move(*pinned);
  }
  for (auto* events :
       {&slot->copy_start, &slot->copied, &slot->kernel_start, &slot->kernel_end, &slot->h2d}) {
    for (UniqueEvent& event : *events) {
      absl::StatusOr<UniqueEvent> made = MakeEvent(timing);
      if (!made.ok()) return made.status();
      event = std::move(*made);
    }
  }
  return slot;
}

}  // namespace dequantd::cuda
