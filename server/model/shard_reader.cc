// ShardReader (see shard_reader.h).
#include "server/model/shard_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dequantd {

void AppendChunks(int shard, int64_t file_offset, int64_t bytes, int64_t layer, int role,
                  int64_t max_chunk_bytes, std::vector<ReadChunk>* chunks) {
  for (int64_t done = 0; done < bytes; done += max_chunk_bytes) {
    chunks->push_back(ReadChunk{.shard = shard,
                                .file_offset = file_offset + done,
                                .bytes = std::min(max_chunk_bytes, bytes - done),
                                .layer = layer,
                                .role = role,
                                .tensor_offset = done});
  }
}

namespace {

// ABORTED unless `fd` is the file `want` describes (same device and inode); with `check_size`,
// DATA_LOSS unless it also has the same size.
absl::Status CheckSame(int fd, const ShardFile& want, bool check_size) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("stat ", want.path));
  }
  if (st.st_dev != want.device || st.st_ino != want.inode) {
    return absl::AbortedError(absl::StrCat("shard '", want.path,
                                           "' was replaced since the "
                                           "checkpoint was opened; restart to load it again"));
  }
  if (check_size && st.st_size != want.size) {
    return absl::DataLossError(absl::StrCat(
        "shard '", want.path, "' is ", st.st_size, " bytes but was ", want.size,
        " bytes when the checkpoint was opened: it changed size during the load; nothing is "
        "served from it"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ShardReader> ShardReader::Open(const std::vector<ShardFile>& shards) {
  ShardReader reader;
  reader.shards_ = shards;
  for (const ShardFile& shard : shards) {
    const int fd = ::open(shard.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("open ", shard.path));
    reader.fds_.push_back(fd);
    // A size changed already shows in the reads (a truncated tensor, named) or after them.
    if (absl::Status s = CheckSame(fd, shard, /*check_size=*/false); !s.ok()) return s;
  }
  return reader;
}

ShardReader::ShardReader(ShardReader&& other) noexcept
    : shards_(std::move(other.shards_)), fds_(std::exchange(other.fds_, {})) {}

ShardReader& ShardReader::operator=(ShardReader&& other) noexcept {
  if (this != &other) {
    for (int fd : fds_) ::close(fd);
    shards_ = std::move(other.shards_);
    fds_ = std::exchange(other.fds_, {});
  }
  return *this;
}

ShardReader::~ShardReader() {
  for (int fd : fds_) ::close(fd);
}

absl::Status ShardReader::ReadOne(const ReadChunk& c, uint8_t* dst, const NameOf& name_of) const {
  const int fd = fds_[static_cast<size_t>(c.shard)];
  int64_t done = 0;
  while (done < c.bytes) {
    const size_t want = static_cast<size_t>(std::min<int64_t>(c.bytes - done, int64_t{1} << 30));
    const ssize_t got = ::pread(fd, dst + done, want, c.file_offset + done);
    if (got < 0 && errno == EINTR) continue;
    const std::string& path = shards_[static_cast<size_t>(c.shard)].path;
    if (got < 0) {
      return absl::ErrnoToStatus(
          errno, absl::StrCat(path, ": read tensor '", name_of(c.layer, c.role), "'"));
    }
    if (got == 0) {
      return absl::DataLossError(absl::StrCat(
          path, ": tensor '", name_of(c.layer, c.role), "' ends at byte ",
          c.file_offset - c.tensor_offset + c.bytes, " or later but the file ends at byte ",
          c.file_offset + done, ": truncated while loading; nothing is served from it"));
    }
    done += got;
  }
  return absl::OkStatus();
}

absl::Status ShardReader::Read(const std::vector<ReadChunk>& chunks, int threads,
                               const NameOf& name_of, const Destination& destination,
                               const Consume& consume, const std::atomic<bool>* cancel) const {
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  absl::Status first;  // guarded by mu
  const auto fail = [&](absl::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    if (first.ok()) first = std::move(s);
    stop.store(true);
  };
  const auto work = [&](int thread) {
    for (size_t i = next.fetch_add(1); i < chunks.size() && !stop.load(); i = next.fetch_add(1)) {
      if (cancel != nullptr && cancel->load()) {
        fail(absl::CancelledError("the load was interrupted (a shutdown signal)"));
        return;
      }
      const ReadChunk& c = chunks[i];
      absl::StatusOr<uint8_t*> dst = destination(thread, c);
      if (!dst.ok()) return fail(dst.status());
      if (absl::Status s = ReadOne(c, *dst, name_of); !s.ok()) return fail(std::move(s));
      if (absl::Status s = consume(thread, c, *dst); !s.ok()) return fail(std::move(s));
    }
  };
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(chunks.size())));
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& t : pool) t.join();
  if (!first.ok()) return first;
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (absl::Status st = CheckSame(fds_[s], shards_[s], /*check_size=*/true); !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace dequantd
