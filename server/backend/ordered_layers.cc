// Parts of one DequantizeLayers call in parallel, delivered in order (see ordered_layers.h).
#include "server/backend/ordered_layers.h"

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

namespace dequantd {
namespace {

// What the part threads and the calling thread share.
class Courier {
 public:
  explicit Courier(size_t parts) : slots_(parts) {}

  // From part k's thread: waits until the calling thread ran `op` (or the call was aborted).
  absl::Status Post(size_t k, const std::function<absl::Status()>& op) {
    std::unique_lock<std::mutex> lock(mu_);
    if (aborted_) return Aborted();
    Slot& slot = slots_[k];
    slot.op = &op;
    slot.result.reset();
    cv_.notify_all();
    cv_.wait(lock, [&] { return slot.result.has_value() || aborted_; });
    slot.op = nullptr;
    if (!slot.result.has_value()) return Aborted();
    return *slot.result;
  }

  // From part k's thread when run() returned.
  void Finish(size_t k, absl::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    slots_[k].finished = std::move(status);
    slots_[k].took = true;  // holds nothing now: no later part waits for it
    cv_.notify_all();
  }

  // From part k's thread (PartTurn::Wait): until every part before k took or finished;
  // CANCELLED when the call was aborted or one of them failed.
  absl::Status WaitForTurn(size_t k) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto before = slots_.begin() + static_cast<std::ptrdiff_t>(k);
    cv_.wait(lock, [&] {
      return aborted_ || std::all_of(slots_.begin(), before, [](const Slot& s) { return s.took; });
    });
    if (aborted_ || std::any_of(slots_.begin(), before, [](const Slot& s) {
          return s.finished.has_value() && !s.finished->ok();
        })) {
      return Aborted();
    }
    return absl::OkStatus();
  }

  // From part k's thread (PartTurn::took).
  bool TookTurn(size_t k) {
    std::lock_guard<std::mutex> lock(mu_);
    return slots_[k].took;
  }

  // From part k's thread (PartTurn::Took).
  void Took(size_t k) {
    std::lock_guard<std::mutex> lock(mu_);
    slots_[k].took = true;
    cv_.notify_all();
  }

  // On the calling thread: serves part k's sink calls until it finishes; its status.
  absl::Status Serve(size_t k) {
    std::unique_lock<std::mutex> lock(mu_);
    Slot& slot = slots_[k];
    while (true) {
      cv_.wait(lock, [&] {
        return (slot.op != nullptr && !slot.result.has_value()) || slot.finished.has_value();
      });
      if (slot.op != nullptr && !slot.result.has_value()) {
        const std::function<absl::Status()>* op = slot.op;
        lock.unlock();
        absl::Status status = (*op)();
        lock.lock();
        slot.result = std::move(status);
        cv_.notify_all();
        continue;
      }
      return *slot.finished;
    }
  }

  void Abort() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  static absl::Status Aborted() {
    return absl::CancelledError("an earlier part of this DequantizeLayers call failed");
  }
  struct Slot {
    const std::function<absl::Status()>* op = nullptr;  // posted, not yet answered
    std::optional<absl::Status> result;
    std::optional<absl::Status> finished;
    bool took = false;  // took its slot (PartTurn::Took) or finished
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;  // guarded by mu_
  bool aborted_ = false;     // guarded by mu_
};

// Part k's view of the call's sink.
class PartSink final : public LayersSink {
 public:
  PartSink(LayersSink& sink, Courier& courier, size_t k, const OrderedPart& part)
      : sink_(sink), courier_(courier), k_(k), part_(part) {
    if (const ResultDestination* d = sink.destination(); d != nullptr) {
      shifted_ = *d;
      shifted_.data = d->data + part.bytes_before;
      shifted_.bytes = d->bytes - part.bytes_before;
      has_destination_ = true;
    }
  }
  const ResultDestination* destination() const override {
    return has_destination_ ? &shifted_ : nullptr;
  }
  Range range() const override { return sink_.range(); }
  absl::Status Begin(const std::string& kernel) override {
    if (k_ != 0) return absl::OkStatus();
    return courier_.Post(k_, [&] { return sink_.Begin(kernel); });
  }
  absl::Status BeginLayer(int64_t index) override {
    return courier_.Post(k_, [&] { return sink_.BeginLayer(part_.first_entry + index); });
  }
  absl::Status Write(int64_t offset, absl::Span<const uint8_t> bytes) override {
    return courier_.Post(k_, [&] { return sink_.Write(offset, bytes); });
  }
  absl::Status WriteShared(int64_t offset, absl::Span<const uint8_t> bytes,
                           std::shared_ptr<const void> keepalive) override {
    return courier_.Post(k_,
                         [&] { return sink_.WriteShared(offset, bytes, std::move(keepalive)); });
  }

 private:
  LayersSink& sink_;
  Courier& courier_;
  const size_t k_;
  const OrderedPart part_;
  ResultDestination shifted_;
  bool has_destination_ = false;
};

// Part k's turn, through the courier.
class CourierTurn final : public PartTurn {
 public:
  CourierTurn(Courier& courier, size_t k) : courier_(courier), k_(k) {}
  absl::Status Wait() override { return courier_.WaitForTurn(k_); }
  void Took() override { courier_.Took(k_); }
  bool took() const override { return courier_.TookTurn(k_); }

 private:
  Courier& courier_;
  const size_t k_;
};

}  // namespace

absl::Status RunOrderedParts(
    LayersSink& sink, absl::Span<const OrderedPart> parts,
    const std::function<absl::Status(size_t part, LayersSink& sink, PartTurn& turn)>& run) {
  Courier courier(parts.size());
  std::vector<std::unique_ptr<PartSink>> sinks;
  std::vector<std::unique_ptr<CourierTurn>> turns;
  for (size_t k = 0; k < parts.size(); ++k) {
    sinks.push_back(std::make_unique<PartSink>(sink, courier, k, parts[k]));
    turns.push_back(std::make_unique<CourierTurn>(courier, k));
  }
  std::vector<std::thread> threads;
  for (size_t k = 0; k < parts.size(); ++k) {
    threads.emplace_back([&, k] { courier.Finish(k, run(k, *sinks[k], *turns[k])); });
  }
  absl::Status first_error;
  for (size_t k = 0; k < parts.size(); ++k) {
    absl::Status status = courier.Serve(k);
    if (!status.ok()) {
      first_error = std::move(status);
      courier.Abort();
      break;
    }
  }
  for (std::thread& t : threads) t.join();
  return first_error;
}

}  // namespace dequantd
