// A fixed set of objects lent to one caller at a time (the CUDA backend's request slots: a stream,
// staging buffers and events per slot). No CUDA here, so the pool is tested on the CPU.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace dequantd {

// Owns `items` for its whole life; Acquire lends one (blocking while all are lent) and the Lease
// gives it back on destruction. Thread-safe. Every Lease must be destroyed before the pool.
template <class T>
class LeasePool {
 public:
  explicit LeasePool(std::vector<std::unique_ptr<T>> items) : items_(std::move(items)) {
    for (const std::unique_ptr<T>& item : items_) free_.push_back(item.get());
  }
  LeasePool(const LeasePool&) = delete;
  LeasePool& operator=(const LeasePool&) = delete;

  class Lease {
   public:
    Lease(Lease&& other) noexcept
        : pool_(std::exchange(other.pool_, nullptr)), item_(std::exchange(other.item_, nullptr)) {}
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    ~Lease() {
      if (pool_ != nullptr) pool_->Return(item_);
    }
    T* operator->() const { return item_; }
    T& operator*() const { return *item_; }

   private:
    friend class LeasePool;
    Lease(LeasePool* pool, T* item) : pool_(pool), item_(item) {}
    LeasePool* pool_;
    T* item_;
  };

  // Lends a free item, waiting while none is free (callers queue without bound in time, not in
  // memory: each waits on its own thread).
  Lease Acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    free_cv_.wait(lock, [this] { return !free_.empty(); });
    T* item = free_.back();
    free_.pop_back();
    return Lease(this, item);
  }

  // Lends a free item at once, or nullopt when every item is lent.
  std::optional<Lease> TryAcquire() {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) return std::nullopt;
    T* item = free_.back();
    free_.pop_back();
    return Lease(this, item);
  }

  size_t size() const { return items_.size(); }
  // Items not lent right now (a snapshot).
  size_t free_count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return free_.size();
  }
  // Any item, for work outside requests (e.g. uploads at start-up, before any Acquire).
  T& front() const { return *items_.front(); }

 private:
  void Return(T* item) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(item);
    }
    free_cv_.notify_one();
  }

  const std::vector<std::unique_ptr<T>> items_;
  mutable std::mutex mu_;
  std::condition_variable free_cv_;
  std::vector<T*> free_;  // guarded by mu_
};

}  // namespace dequantd
