// Host regions: a POSIX shared-memory object (shm_open's "/NAME", i.e. /dev/shm/NAME on Linux)
// mapped once into the server at registration.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "server/regions/region.h"

namespace dequantd::regions {

// Opens spec.key ("/NAME" or "/dev/shm/NAME"; NAME one path component, not "." or "..", not a
// symlink, a regular file), checks spec.offset + spec.byte_size against its size and maps those
// bytes shared and writable. `pin`: also cudaHostRegister the mapping (builds with CUDA only;
// without CUDA `pin` is ignored). Errors: INVALID_ARGUMENT (key malformed or not a regular file;
// the range past the object's end, naming key, size, offset and byte_size), NOT_FOUND (no such
// object), PERMISSION_DENIED (the server may not open it read-write), RESOURCE_EXHAUSTED (mmap
// or cudaHostRegister out of memory / locked-memory limit), FAILED_PRECONDITION (another
// cudaHostRegister failure, named).
absl::StatusOr<std::unique_ptr<Region>> OpenHostRegion(RegionSpec spec, bool pin);

// "/NAME" or "/dev/shm/NAME" -> "/dev/shm/NAME". INVALID_ARGUMENT naming `key` otherwise.
absl::StatusOr<std::string> ShmPath(const std::string& key);

}  // namespace dequantd::regions
