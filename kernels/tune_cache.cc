#include "kernels/tune_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "formats/atomic_file.h"
#include "nlohmann/json.hpp"

namespace dequantd {
namespace {

using Entries = std::vector<std::pair<TuneKey, TuneEntry>>;
using nlohmann::json;

std::string ErrnoText(int err) { return std::strerror(err); }

// Closes a file descriptor on scope exit.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

// Reads the whole file. NOT_FOUND when it does not exist, DATA_LOSS when it cannot be read.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(path);
    return absl::DataLossError(absl::StrCat("cannot open tune cache ", path, ": ", ErrnoText(err)));
  }
  FdCloser closer(fd);
  std::string text;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::DataLossError(
          absl::StrCat("cannot read tune cache ", path, ": ", ErrnoText(errno)));
    }
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

DType DTypeField(const json& j, const char* field) {
  DType t;
  const std::string name = j.at(field).get<std::string>();
  if (!ParseDType(name, &t)) throw std::invalid_argument(absl::StrCat(field, ": ", name));
  return t;
}

auto KeyTuple(const TuneKey& k) {
  return std::tie(k.device, k.compute_capability, k.variant, k.K, k.N, k.group_size, k.scale_dtype,
                  k.output_dtype);
}

}  // namespace

std::string TuneKey::ToString() const {
  return absl::StrCat(device, " sm", compute_capability, " ", variant, " ", K, "x", N, " g",
                      group_size, " ", std::string(DTypeName(scale_dtype)), "->",
                      std::string(DTypeName(output_dtype)));
}

absl::StatusOr<Entries> ParseTuneCacheJson(const std::string& text) {
  const json doc = json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::DataLossError("tune cache is not a JSON object");
  }
  const auto version = doc.find("version");
  if (version == doc.end() || !version->is_number_integer()) {
    return absl::DataLossError("tune cache has no integer \"version\"");
  }
  if (version->get<int64_t>() != TuneCache::kFileVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tune cache version ", version->get<int64_t>(), ", expected ", TuneCache::kFileVersion));
  }
  const auto list = doc.find("entries");
  if (list == doc.end() || !list->is_array()) {
    return absl::DataLossError("tune cache has no \"entries\" array");
  }
  Entries entries;
  try {
    for (const json& e : *list) {
      TuneKey key;
      key.device = e.at("device").get<std::string>();
      key.compute_capability = e.at("compute_capability").get<int>();
      key.variant = e.at("variant").get<std::string>();
      key.K = e.at("K").get<int64_t>();
      key.N = e.at("N").get<int64_t>();
      key.group_size = e.at("group_size").get<int64_t>();
      key.scale_dtype = DTypeField(e, "scale_dtype");
      key.output_dtype = DTypeField(e, "output_dtype");
      TuneEntry entry;
      const json& c = e.at("config");
      entry.config.block_size = c.at("block_size").get<int>();
      entry.config.words_per_thread = c.at("words_per_thread").get<int>();
      entry.config.rows_per_thread = c.at("rows_per_thread").get<int>();
      entry.seconds = e.at("seconds").get<double>();
      entries.emplace_back(std::move(key), entry);
    }
  } catch (const std::exception& ex) {
    return absl::DataLossError(absl::StrCat("tune cache entry is malformed: ", ex.what()));
  }
  return entries;
}

std::string TuneCacheToJson(Entries entries) {
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return KeyTuple(a.first) < KeyTuple(b.first); });
  json list = json::array();
  for (const auto& [key, entry] : entries) {
    list.push_back({{"device", key.device},
                    {"compute_capability", key.compute_capability},
                    {"variant", key.variant},
                    {"K", key.K},
                    {"N", key.N},
                    {"group_size", key.group_size},
                    {"scale_dtype", std::string(DTypeName(key.scale_dtype))},
                    {"output_dtype", std::string(DTypeName(key.output_dtype))},
                    {"config",
                     {{"block_size", entry.config.block_size},
                      {"words_per_thread", entry.config.words_per_thread},
                      {"rows_per_thread", entry.config.rows_per_thread}}},
                    {"seconds", entry.seconds}});
  }
  json doc = {{"version", TuneCache::kFileVersion}, {"entries", std::move(list)}};
  return doc.dump(1) + "\n";
}

std::string DefaultTuneCachePath() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && xdg[0] != '\0') {
    return absl::StrCat(xdg, "/dequantd/tune_cache.json");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] != '\0') {
    return absl::StrCat(home, "/.cache/dequantd/tune_cache.json");
  }
  return "";
}

TuneCache::TuneCache(std::string path) : path_(std::move(path)) {}

absl::Status TuneCache::Load() {
  if (path_.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> text = ReadFile(path_);
  if (absl::IsNotFound(text.status())) return absl::OkStatus();
  if (!text.ok()) return text.status();
  absl::StatusOr<Entries> entries = ParseTuneCacheJson(*text);
  if (!entries.ok()) {
    return absl::Status(entries.status().code(),
                        absl::StrCat(path_, ": ", entries.status().message(), " (ignored)"));
  }
  std::unique_lock lock(mu_);
  for (auto& [key, entry] : *entries) map_.try_emplace(std::move(key), entry);
  return absl::OkStatus();
}

std::optional<TuneEntry> TuneCache::Lookup(const TuneKey& key) const {
  std::shared_lock lock(mu_);
  const auto it = map_.find(key);
  if (it == map_.end()) return std::nullopt;
  return it->second;
}

void TuneCache::Insert(const TuneKey& key, const TuneEntry& entry) {
  std::unique_lock lock(mu_);
  map_.insert_or_assign(key, entry);
}

size_t TuneCache::size() const {
  std::shared_lock lock(mu_);
  return map_.size();
}

absl::Status TuneCache::Save() {
  if (path_.empty()) return absl::OkStatus();
  std::lock_guard save_lock(save_mu_);

  const std::filesystem::path path(path_);
  if (path.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(path.parent_path(), ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("cannot create directory ",
                                              path.parent_path().string(), ": ", ec.message()));
    }
  }

  // Cross-process lock on a side file (the cache file itself is replaced by rename).
  const std::string lock_path = path_ + ".lock";
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open ", lock_path, ": ", ErrnoText(errno)));
  }
  FdCloser lock_closer(lock_fd);  // closing releases the flock
  while (::flock(lock_fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      return absl::InternalError(absl::StrCat("cannot lock ", lock_path, ": ", ErrnoText(errno)));
    }
  }

  // Merge what other processes wrote since we loaded; a bad file is simply replaced.
  if (absl::StatusOr<std::string> text = ReadFile(path_); text.ok()) {
    if (absl::StatusOr<Entries> entries = ParseTuneCacheJson(*text); entries.ok()) {
      std::unique_lock lock(mu_);
      for (auto& [key, entry] : *entries) map_.try_emplace(std::move(key), entry);
    }
  }
  Entries snapshot;
  {
    std::shared_lock lock(mu_);
    snapshot.assign(map_.begin(), map_.end());
  }
  const std::string text = TuneCacheToJson(std::move(snapshot));

  if (absl::Status status = formats::WriteFileAtomically(path_, text); !status.ok()) {
    return absl::InternalError(absl::StrCat("cannot write tune cache: ", status.message()));
  }
  return absl::OkStatus();
}

}  // namespace dequantd
