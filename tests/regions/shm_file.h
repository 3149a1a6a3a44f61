// A POSIX shared-memory object for the region tests: /dev/shm/dequantd-test.<pid>.<name>,
// created with `bytes` bytes and removed on destruction.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace dequantd::testing {

class ShmFile {
 public:
  ShmFile(const std::string& name, int64_t bytes)
      : key_(absl::StrCat("/dequantd-test.", getpid(), ".", name)) {
    shm_unlink(key_.c_str());
    const int fd = shm_open(key_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    ok_ = fd >= 0 && ftruncate(fd, bytes) == 0;
    if (fd >= 0) close(fd);
  }
  ~ShmFile() { shm_unlink(key_.c_str()); }
  ShmFile(const ShmFile&) = delete;
  ShmFile& operator=(const ShmFile&) = delete;

  bool ok() const { return ok_; }
  const std::string& key() const { return key_; }  // "/dequantd-test.<pid>.<name>"
  std::string path() const { return "/dev/shm" + key_; }
  // The object's bytes [offset, offset + n), read through a fresh mapping of this process.
  std::string Read(int64_t offset, int64_t n) const {
    const int fd = shm_open(key_.c_str(), O_RDONLY, 0);
    std::string bytes(static_cast<size_t>(n), '\0');
    if (fd >= 0) {
      if (pread(fd, bytes.data(), bytes.size(), offset) != n) bytes.clear();
      close(fd);
    }
    return bytes;
  }
  bool Truncate(int64_t bytes) const { return truncate(path().c_str(), bytes) == 0; }

 private:
  std::string key_;
  bool ok_ = false;
};

}  // namespace dequantd::testing
