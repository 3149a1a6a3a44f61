// Rotating a target's address list (see address_rotation.h).
#include "client/address_rotation.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <random>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace dequantd {
namespace {

// The scheme ("ipv4:" or "ipv6:") and the addresses of a list target; no addresses otherwise.
std::vector<absl::string_view> SplitList(absl::string_view target, absl::string_view* scheme) {
  for (absl::string_view s : {"ipv4:", "ipv6:"}) {
    if (absl::StartsWith(target, s)) {
      *scheme = s;
      return absl::StrSplit(target.substr(s.size()), ',');
    }
  }
  return {};
}

uint64_t RandomRotation() { return std::random_device()(); }

}  // namespace

int AddressCount(absl::string_view target) {
  absl::string_view scheme;
  const std::vector<absl::string_view> addresses = SplitList(target, &scheme);
  return addresses.size() > 1 ? static_cast<int>(addresses.size()) : 1;
}

std::string RotateAddressList(absl::string_view target, uint64_t by) {
  absl::string_view scheme;
  const std::vector<absl::string_view> addresses = SplitList(target, &scheme);
  if (addresses.size() < 2) return std::string(target);
  const size_t first = by % addresses.size();
  std::vector<absl::string_view> rotated(addresses.begin() + first, addresses.end());
  rotated.insert(rotated.end(), addresses.begin(), addresses.begin() + first);
  return absl::StrCat(scheme, absl::StrJoin(rotated, ","));
}

uint64_t NextProcessRotation(const std::string& key) {
  // O_NOFOLLOW: a link planted under the name is not followed.
  const int fd = ::shm_open(key.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return RandomRotation();
  const absl::Cleanup close_fd = [fd] { ::close(fd); };
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() ||
      (st.st_mode & 077) != 0 || ::flock(fd, LOCK_EX) != 0) {
    return RandomRotation();
  }
  // pread/pwrite, not a mapping: a file another process truncates cannot fault this one.
  uint64_t value = 0;
  const ssize_t n = ::pread(fd, &value, sizeof(value), 0);
  if (n != static_cast<ssize_t>(sizeof(value))) value = 0;  // new (empty) or cut short
  const uint64_t next = value + 1;
  const bool written = ::pwrite(fd, &next, sizeof(next), 0) == static_cast<ssize_t>(sizeof(next));
  ::flock(fd, LOCK_UN);
  return written ? value : RandomRotation();
}

std::string RotationKey(absl::string_view target, absl::string_view command) {
  uint64_t h = 0xcbf29ce484222325u;  // FNV-1a 64: stable across builds and processes
  auto mix = [&h](absl::string_view bytes) {
    for (unsigned char c : bytes) {
      h ^= c;
      h *= 0x100000001b3u;
    }
  };
  mix(target);
  mix(absl::string_view("\0", 1));
  mix(command);
  return absl::StrCat("/dequantctl-rotation.", ::geteuid(), ".", absl::Hex(h, absl::kZeroPad16));
}

}  // namespace dequantd
