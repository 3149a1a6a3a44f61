// The autotuner's cache file: a TuneStore (kernels/autotune.h) kept as versioned JSON, shared
// safely between processes. Knows nothing of CUDA: the config is cuda::LaunchConfig's plain data.
//
// File format (version 4; written by this code only):
//   {"version": 4,
//    "entries": [{"device": "NVIDIA H200", "compute_capability": 90, "variant": "v4_vec16",
//                 "K": 4096, "N": 14336, "group_size": 128, "scale_dtype": "fp16",
//                 "output_dtype": "fp16", "objective": "latency",
//                 "config": {"block_size": 128, "words_per_thread": 1, "rows_per_thread": 2},
//                 "seconds": 2.1e-05}, ...]}
// Version 1 (no "objective"; chosen by the old single-pass timing) and any other version, or a
// file that does not parse as the above, is ignored as a whole (a warning) and replaced by the
// next write.
#pragma once

#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/autotune.h"

namespace dequantd::formats {

// Version 4: the AWQ (N, K) kernel's launch configuration is tiles along K per block (a version-3
// entry's block size would be refused). Version 3: keys name the format (issue 21). Version 2
// added the objective.
inline constexpr int kTuneFileVersion = 4;

// A TuneStore on the file at `path`.
//
// Thread-safety: Load and Merge may be called from several threads (Merge serializes with other
// Merges of this object by a mutex) and processes: Merge holds flock(2) on `path + ".lock"`,
// re-reads the file, merges, and writes the union to a temporary file in the same directory that
// is renamed over `path` (formats/atomic_file.h). Readers see the old or the new file, never a
// part, and no process loses another's entries.
class TuneFile final : public TuneStore {
 public:
  explicit TuneFile(std::string path) : path_(std::move(path)) {}

  const std::string& path() const { return path_; }

  std::string Describe() const override { return path_; }
  // A missing file is no entries (OK). DATA_LOSS naming the path for an unreadable file or one
  // that is not valid cache JSON; FAILED_PRECONDITION naming the path for another version.
  absl::StatusOr<TuneEntries> Load() override;
  // See TuneStore::Merge. Creates missing parent directories. A corrupt or other-version file is
  // replaced. INTERNAL naming the path and the error when the directory, lock, temporary file,
  // write or rename fails.
  absl::StatusOr<TuneEntries> Merge(const TuneEntries& entries) override;

 private:
  const std::string path_;
  std::mutex merge_mu_;
};

// Parses cache file text. Errors as TuneFile::Load (without the path).
absl::StatusOr<TuneEntries> ParseTuneFileJson(const std::string& text);

// The version-2 document for `entries`, sorted by key so equal sets give equal text.
std::string TuneFileToJson(TuneEntries entries);

// The cache file to use: `flag` (--tune-cache) when set, else $XDG_CACHE_HOME/dequantd/
// tune_cache.json, else $HOME/.cache/dequantd/tune_cache.json, else "" (memory only). An empty
// variable counts as unset.
std::string ResolveTuneFilePath(const std::string& flag);

// Creates the parent directory of `path` (and its parents). OK for "" and for an existing
// directory; INTERNAL naming the directory and the error otherwise.
absl::Status CreateTuneFileDirectory(const std::string& path);

}  // namespace dequantd::formats
