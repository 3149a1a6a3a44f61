// SeriesCache: the series of one prometheus-cpp family by its label values, found once.
// Family::Add builds a label map of strings, hashes it and takes the family's lock on every call
// (about a microsecond each, several per RPC on a call's critical path); a hot path asks the
// cache instead, which hashes the values under a shared lock and calls Add only the first time a
// combination is seen. Label sets stay small (method x code, variant, device: no tensor names), so
// the cache is never trimmed. Thread-safe. Series pointers stay valid for the family's life
// (prometheus-cpp removes a series only on Remove, which dequantd calls on the benchmark families
// alone, none of which goes through a cache).
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/family.h"
#include "prometheus/labels.h"

namespace dequantd {

template <typename Metric, size_t kLabels>
class SeriesCache {
 public:
  // Adds the series for `labels` to its family (e.g. a histogram's buckets go here).
  using Adder = std::function<Metric&(const prometheus::Labels& labels)>;

  SeriesCache(std::array<std::string, kLabels> names, Adder add)
      : names_(std::move(names)), add_(std::move(add)) {}
  SeriesCache(prometheus::Family<Metric>* family, std::array<std::string, kLabels> names)
      : SeriesCache(std::move(names), [family](const prometheus::Labels& labels) -> Metric& {
          return family->Add(labels);
        }) {}

  // The series whose label values are `values`, in the order of the names given at construction.
  Metric& Get(const std::array<std::string_view, kLabels>& values) {
    // The key is built in this thread's buffer (reused: after a thread's first calls a hit
    // allocates nothing) and looked up as a view.
    thread_local std::string key;
    key.clear();
    for (std::string_view value : values) {
      key.append(value);
      key.push_back('\x1f');  // (not in a label value dequantd sets)
    }
    {
      absl::ReaderMutexLock lock(&mu_);
      if (auto it = series_.find(absl::string_view(key)); it != series_.end()) return *it->second;
    }
    std::string owned_key = key;  // before add_, which may use this thread's buffer again
    prometheus::Labels labels;
    for (size_t i = 0; i < kLabels; ++i) labels.emplace(names_[i], std::string(values[i]));
    Metric& series = add_(labels);  // Add returns the existing series for equal labels
    absl::MutexLock lock(&mu_);
    series_.emplace(std::move(owned_key), &series);
    return series;
  }

 private:
  const std::array<std::string, kLabels> names_;
  const Adder add_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Metric*> series_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dequantd
