// The autotuner's memory: tuned launch configurations keyed by (device, kernel variant, shape,
// dtypes), held in memory and persisted in a versioned JSON file. CPU-only (no CUDA types), so the
// file handling is tested on machines without a GPU.
//
// File format (version 1), written by this code only:
//   {"version": 1,
//    "entries": [{"device": "NVIDIA H200", "compute_capability": 90, "variant": "v4_vec16",
//                 "K": 4096, "N": 14336, "group_size": 128, "scale_dtype": "fp16",
//                 "output_dtype": "fp16",
//                 "config": {"block_size": 256, "words_per_thread": 4, "rows_per_thread": 2},
//                 "seconds": 2.1e-05}, ...]}
// A file of another version, or one that does not parse as the above, is ignored as a whole.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/awq_format.h"
#include "kernels/dequant.h"

namespace dequantd {

// What a tuned configuration is for. Two keys are equal when every field is.
struct TuneKey {
  std::string device;                // device name, e.g. "NVIDIA H200" (cudaDeviceProp::name)
  int compute_capability = 0;        // major * 10 + minor, e.g. 90
  std::string variant;               // kernel variant name, e.g. "v4_vec16" (cuda::VariantName)
  int64_t K = 0;                     // in_features
  int64_t N = 0;                     // out_features
  int64_t group_size = 0;            // G
  DType scale_dtype = DType::kF16;   // fp16 or bf16
  DType output_dtype = DType::kF16;  // fp16, bf16 or fp32

  // The key of (device, kernel variant, layer shape, output dtype).
  static TuneKey For(std::string device, int compute_capability, std::string_view variant,
                     const AwqShape& shape, DType output_dtype) {
    return TuneKey{std::move(device), compute_capability, std::string(variant), shape.K,
                   shape.N,           shape.group_size,   shape.scale_dtype,    output_dtype};
  }

  bool operator==(const TuneKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const TuneKey& k) {
    return H::combine(std::move(h), k.device, k.compute_capability, k.variant, k.K, k.N,
                      k.group_size, k.scale_dtype, k.output_dtype);
  }
  // "NVIDIA H200 sm90 v4_vec16 4096x14336 g128 fp16->fp16", for logs.
  std::string ToString() const;
};

// A launch configuration as the cache stores it; mirrors cuda::LaunchConfig (kernels/cuda/
// dequant_cuda.h) without depending on CUDA headers.
struct TunedConfig {
  int block_size = 256;      // threads per block
  int words_per_thread = 1;  // consecutive packed words along N per thread
  int rows_per_thread = 1;   // consecutive rows of K per thread
  bool operator==(const TunedConfig&) const = default;
};

// One tuning result.
struct TuneEntry {
  TunedConfig config;
  double seconds = 0;  // measured time of one launch with `config`, in seconds
  bool operator==(const TuneEntry&) const = default;
};

// In-memory map plus the JSON file at `path`.
//
// Thread-safety: all methods may be called concurrently. Lookup takes a shared lock only (the hot
// path of the autotuner). Save serializes with other Saves in this process (a mutex) and in other
// processes (flock(2) on `path + ".lock"`).
//
// Sharing the file between processes: Save re-reads the file under the lock, merges its entries
// into memory (entries already in memory win), and writes the union to a temporary file in the same
// directory that is then renamed over `path`. Readers therefore see either the old or the new file,
// never a partial one, and no process loses another's entries.
class TuneCache {
 public:
  static constexpr int kFileVersion = 1;

  // `path` empty: memory only (Load and Save do nothing and return OK).
  explicit TuneCache(std::string path);

  TuneCache(const TuneCache&) = delete;
  TuneCache& operator=(const TuneCache&) = delete;

  const std::string& path() const { return path_; }

  // Reads the file into memory (adding to, never replacing, what is already there). A missing file
  // is not an error. Returns a warning the caller should report once, after which the file is
  // ignored (nothing loaded) and the next Save overwrites it:
  //   DATA_LOSS for a file that is unreadable or not valid cache JSON,
  //   FAILED_PRECONDITION for a file of another version.
  absl::Status Load();

  // The entry for `key`, if any.
  std::optional<TuneEntry> Lookup(const TuneKey& key) const;

  // Adds or replaces the entry for `key` in memory (Save persists it).
  void Insert(const TuneKey& key, const TuneEntry& entry);

  // Number of entries in memory.
  size_t size() const;

  // Merges the file's current entries into memory (see above) and writes everything atomically.
  // Creates missing parent directories. A corrupt or other-version file is replaced without a
  // warning (Load reports it). Returns INTERNAL naming the path and errno text when the lock,
  // temporary file, write or rename fails; memory is unaffected then.
  absl::Status Save();

 private:
  using Map = absl::flat_hash_map<TuneKey, TuneEntry>;

  std::string path_;
  mutable std::shared_mutex mu_;  // guards map_
  Map map_;
  std::mutex save_mu_;  // one Save at a time in this process
};

// Parses cache file text into entries. Errors as TuneCache::Load (DATA_LOSS, FAILED_PRECONDITION).
absl::StatusOr<std::vector<std::pair<TuneKey, TuneEntry>>> ParseTuneCacheJson(
    const std::string& text);

// Serializes entries (sorted, so equal caches give equal files) as the version-1 JSON document.
std::string TuneCacheToJson(std::vector<std::pair<TuneKey, TuneEntry>> entries);

// The default cache file: $XDG_CACHE_HOME/dequantd/tune_cache.json, else
// $HOME/.cache/dequantd/tune_cache.json, else "" (memory only) when neither variable is set.
std::string DefaultTuneCachePath();

}  // namespace dequantd
