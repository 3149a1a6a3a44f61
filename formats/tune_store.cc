#include "formats/tune_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "formats/atomic_file.h"
#include "nlohmann/json.hpp"

namespace dequantd::formats {
namespace {

using nlohmann::json;

std::string ErrnoText(int err) { return std::strerror(err); }

// Closes a file descriptor on scope exit (closing a lock file releases its flock).
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
  return std::tie(k.device.name, k.device.compute_capability, k.variant, k.K, k.N, k.group_size,
                  k.scale_dtype, k.output_dtype, k.objective);
}

std::string EnvOrEmpty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

}  // namespace

absl::StatusOr<TuneEntries> ParseTuneFileJson(const std::string& text) {
  const json doc = json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::DataLossError("tune cache is not a JSON object");
  }
  const auto version = doc.find("version");
  if (version == doc.end() || !version->is_number_integer()) {
    return absl::DataLossError("tune cache has no integer \"version\"");
  }
  if (version->get<int64_t>() != kTuneFileVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tune cache version ", version->get<int64_t>(), ", expected ", kTuneFileVersion));
  }
  const auto list = doc.find("entries");
  if (list == doc.end() || !list->is_array()) {
    return absl::DataLossError("tune cache has no \"entries\" array");
  }
  TuneEntries entries;
  try {
    for (const json& e : *list) {
      TuneKey key;
      key.device.name = e.at("device").get<std::string>();
      key.device.compute_capability = e.at("compute_capability").get<int>();
      key.format = e.at("format").get<std::string>();
      key.variant = e.at("variant").get<std::string>();
      key.K = e.at("K").get<int64_t>();
      key.N = e.at("N").get<int64_t>();
      key.group_size = e.at("group_size").get<int64_t>();
      key.scale_dtype = DTypeField(e, "scale_dtype");
      key.output_dtype = DTypeField(e, "output_dtype");
      const std::string objective = e.at("objective").get<std::string>();
      if (!ParseTuneObjective(objective, &key.objective)) {
        throw std::invalid_argument(absl::StrCat("objective: ", objective));
      }
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

std::string TuneFileToJson(TuneEntries entries) {
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return KeyTuple(a.first) < KeyTuple(b.first); });
  json list = json::array();
  for (const auto& [key, entry] : entries) {
    list.push_back({{"device", key.device.name},
                    {"compute_capability", key.device.compute_capability},
                    {"format", key.format},
                    {"variant", key.variant},
                    {"K", key.K},
                    {"N", key.N},
                    {"group_size", key.group_size},
                    {"scale_dtype", std::string(DTypeName(key.scale_dtype))},
                    {"output_dtype", std::string(DTypeName(key.output_dtype))},
                    {"objective", std::string(TuneObjectiveName(key.objective))},
                    {"config",
                     {{"block_size", entry.config.block_size},
                      {"words_per_thread", entry.config.words_per_thread},
                      {"rows_per_thread", entry.config.rows_per_thread}}},
                    {"seconds", entry.seconds}});
  }
  json doc = {{"version", kTuneFileVersion}, {"entries", std::move(list)}};
  return doc.dump(1) + "\n";
}

std::string ResolveTuneFilePath(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const std::string xdg = EnvOrEmpty("XDG_CACHE_HOME"); !xdg.empty()) {
    return absl::StrCat(xdg, "/dequantd/tune_cache.json");
  }
  if (const std::string home = EnvOrEmpty("HOME"); !home.empty()) {
    return absl::StrCat(home, "/.cache/dequantd/tune_cache.json");
  }
  return "";
}

absl::Status CreateTuneFileDirectory(const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) return absl::OkStatus();
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InternalError(absl::StrCat("cannot create the tune cache directory \"",
                                            dir.string(), "\": ", error.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<TuneEntries> TuneFile::Load() {
  absl::StatusOr<std::string> text = ReadFile(path_);
  if (absl::IsNotFound(text.status())) return TuneEntries{};
  if (!text.ok()) return text.status();
  absl::StatusOr<TuneEntries> entries = ParseTuneFileJson(*text);
  if (!entries.ok()) {
    return absl::Status(entries.status().code(),
                        absl::StrCat(path_, ": ", entries.status().message(), " (ignored)"));
  }
  return entries;
}

absl::StatusOr<TuneEntries> TuneFile::Merge(const TuneEntries& entries) {
  std::lock_guard merge_lock(merge_mu_);
  if (absl::Status s = CreateTuneFileDirectory(path_); !s.ok()) return s;

  // Cross-process lock on a side file (the cache file itself is replaced by rename).
  const std::string lock_path = path_ + ".lock";
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open ", lock_path, ": ", ErrnoText(errno)));
  }
  FdCloser lock_closer(lock_fd);
  while (::flock(lock_fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      return absl::InternalError(absl::StrCat("cannot lock ", lock_path, ": ", ErrnoText(errno)));
    }
  }

  // What other processes wrote since; a bad file is simply replaced.
  absl::flat_hash_set<TuneKey> mine;
  for (const auto& [key, entry] : entries) mine.insert(key);
  TuneEntries others;
  if (absl::StatusOr<std::string> text = ReadFile(path_); text.ok()) {
    if (absl::StatusOr<TuneEntries> stored = ParseTuneFileJson(*text); stored.ok()) {
      for (auto& stored_entry : *stored) {
        if (!mine.contains(stored_entry.first)) others.push_back(std::move(stored_entry));
      }
    }
  }
  TuneEntries all = entries;
  all.insert(all.end(), others.begin(), others.end());
  if (absl::Status s = WriteFileAtomically(path_, TuneFileToJson(std::move(all))); !s.ok()) {
    return absl::InternalError(absl::StrCat("cannot write tune cache: ", s.message()));
  }
  return others;
}

}  // namespace dequantd::formats
