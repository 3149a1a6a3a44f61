// OpenHostRegion (see host_region.h).
#include "server/regions/host_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/regions/guarded_copy.h"
#if DEQUANTD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace dequantd::regions {
namespace {

constexpr char kShmDir[] = "/dev/shm/";

absl::Status ErrnoStatus(int error, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(error));
  switch (error) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InvalidArgumentError(message);
  }
}

class HostRegion final : public Region {
 public:
  HostRegion(RegionSpec spec, int fd, void* map, size_t map_bytes, int64_t data_offset, bool pinned)
      : Region(std::move(spec)),
        fd_(fd),
        map_(map),
        map_bytes_(map_bytes),
        data_(static_cast<uint8_t*>(map) + data_offset),
        pinned_(pinned) {}
  ~HostRegion() override {
#if DEQUANTD_HAVE_CUDA
    if (pinned_) cudaHostUnregister(map_);
#endif
    munmap(map_, map_bytes_);
    close(fd_);
  }

  RegionKind kind() const override { return RegionKind::kHost; }
  uint8_t* data() const override { return data_; }
  bool pinned() const override { return pinned_; }
  bool direct_writes() const override { return pinned_; }
  absl::Status CheckUsable() const override {
    struct stat st {};
    const int64_t end = spec().offset + spec().byte_size;
    if (fstat(fd_, &st) != 0 || st.st_size < end) {
      return absl::FailedPreconditionError(absl::StrCat(
          "region \"", spec().name, "\": its object ", spec().key, " was truncated to ", st.st_size,
          " bytes, less than offset + byte_size = ", end, "; unregister it"));
    }
    return absl::OkStatus();
  }
  absl::Status CopyIn(int64_t offset, absl::Span<const uint8_t> bytes) override {
    if (GuardedCopy(data_ + offset, bytes.data(), bytes.size(), static_cast<uint8_t*>(map_),
                    map_bytes_)) {
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "region \"", spec().name, "\": its object ", spec().key,
        " was truncated while a result was written into it (the write of ", bytes.size(),
        " bytes at region offset ", offset, " faulted); its bytes are incomplete"));
  }

 private:
  const int fd_;  // kept open: CheckUsable sees a truncation before a write would fault
  void* const map_;
  const size_t map_bytes_;
  uint8_t* const data_;
  const bool pinned_;
};

#if DEQUANTD_HAVE_CUDA
absl::Status Pin(void* map, size_t bytes, const std::string& key) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("key ", key, ": cannot pin the mapping: no CUDA device"));
  }
  const cudaError_t error = cudaHostRegister(map, bytes, cudaHostRegisterDefault);
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clears the sticky-free error so later calls do not see it
  const std::string message = absl::StrCat("key ", key, ": cudaHostRegister of ", bytes,
                                           " bytes failed: ", cudaGetErrorString(error));
  return error == cudaErrorMemoryAllocation ? absl::ResourceExhaustedError(message)
                                            : absl::FailedPreconditionError(message);
}
#endif

}  // namespace

const char* RegionKindName(RegionKind kind) {
  return kind == RegionKind::kHost ? "host" : "device";
}

absl::StatusOr<std::string> ShmPath(const std::string& key) {
  absl::string_view name = key;
  if (!absl::ConsumePrefix(&name, kShmDir) && !absl::ConsumePrefix(&name, "/")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key \"", key,
        "\" must be a POSIX shared-memory name \"/NAME\" or a path \"/dev/shm/NAME\""));
  }
  if (name.empty() || name == "." || name == ".." || absl::StrContains(name, '/') ||
      absl::StrContains(name, '\0') || name.size() > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("key \"", key, "\": NAME must be one path component (1..255 bytes, no '/', ",
                     "not \".\" or \"..\")"));
  }
  return absl::StrCat(kShmDir, name);
}

absl::StatusOr<std::unique_ptr<Region>> OpenHostRegion(RegionSpec spec, bool pin) {
  absl::StatusOr<std::string> path = ShmPath(spec.key);
  if (!path.ok()) return path.status();
  const std::string what = absl::StrCat("key \"", spec.key, "\" (", *path, ")");
  const int fd = open(path->c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int error = errno;
    if (error == ELOOP) return absl::InvalidArgumentError(absl::StrCat(what, " is a symlink"));
    return ErrnoStatus(error, absl::StrCat("cannot open ", what));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    close(fd);
    return ErrnoStatus(error, absl::StrCat("cannot stat ", what));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(what, " is not a regular file"));
  }
  if (spec.offset > st.st_size || spec.byte_size > st.st_size - spec.offset) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(what, " is ", st.st_size, " bytes: offset ",
                                                   spec.offset, " + byte_size ", spec.byte_size,
                                                   " runs past its end"));
  }
  const int64_t page = sysconf(_SC_PAGE_SIZE);
  const int64_t map_start = spec.offset / page * page;
  const size_t map_bytes = static_cast<size_t>(spec.offset - map_start + spec.byte_size);
  void* map = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, map_start);
  if (map == MAP_FAILED) {
    const int error = errno;
    close(fd);
    return ErrnoStatus(error, absl::StrCat("cannot map ", what));
  }
  bool pinned = false;
#if DEQUANTD_HAVE_CUDA
  if (pin) {
    if (absl::Status s = Pin(map, map_bytes, spec.key); !s.ok()) {
      munmap(map, map_bytes);
      close(fd);
      return s;
    }
    pinned = true;
  }
#else
  (void)pin;
#endif
  const int64_t data_offset = spec.offset - map_start;
  return std::make_unique<HostRegion>(std::move(spec), fd, map, map_bytes, data_offset, pinned);
}

}  // namespace dequantd::regions
