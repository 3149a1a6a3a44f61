// Tests for RunOrderedParts (server/backend/ordered_layers.h): parts run at once on their own
// threads, yet the sink sees one Begin, BeginLayer with call-wide indices and every Write in
// request order, all on the calling thread; destinations are shifted per part; the first error in
// part order is returned and later parts are cancelled; parts take their slots in part order, so
// calls cut over GPUs in any order do not deadlock. No GPU.
#include "server/backend/ordered_layers.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backend/lease_pool.h"

namespace dequantd {
namespace {

using ::testing::ElementsAre;

// Records every call as text, and the thread it came on.
class RecordingSink final : public LayersSink {
 public:
  std::vector<std::string> calls;
  std::thread::id caller = std::this_thread::get_id();
  bool other_thread = false;
  int fail_at_call = -1;  // this call (0-based) returns DATA_LOSS
  ResultDestination dest;
  bool has_dest = false;

  const ResultDestination* destination() const override { return has_dest ? &dest : nullptr; }
  absl::Status Begin(const std::string& kernel) override { return Record("begin " + kernel); }
  absl::Status BeginLayer(int64_t index) override {
    return Record("layer " + std::to_string(index));
  }
  absl::Status Write(int64_t offset, absl::Span<const uint8_t> bytes) override {
    return Record("write " + std::to_string(offset) + " " +
                  std::string(bytes.begin(), bytes.end()));
  }

 private:
  absl::Status Record(std::string call) {
    if (std::this_thread::get_id() != caller) other_thread = true;
    calls.push_back(std::move(call));
    if (static_cast<int>(calls.size()) - 1 == fail_at_call) {
      return absl::DataLossError("client went away");
    }
    return absl::OkStatus();
  }
};

// A fake device: part k produces layers [first, first + n) as one letter each, after a delay
// that makes later parts finish first.
absl::Status FakePart(size_t k, int64_t layers, LayersSink& sink, size_t parts) {
  std::this_thread::sleep_for(std::chrono::milliseconds(5 * static_cast<int>(parts - k)));
  if (absl::Status s = sink.Begin("part" + std::to_string(k)); !s.ok()) return s;
  for (int64_t i = 0; i < layers; ++i) {
    if (absl::Status s = sink.BeginLayer(i); !s.ok()) return s;
    const std::string bytes(2, static_cast<char>('a' + k));
    if (absl::Status s =
            sink.Write(0, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), 2));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

TEST(RunOrderedPartsTest, SinkSeesOneDevicesOrderOnTheCallingThread) {
  RecordingSink sink;
  const std::vector<OrderedPart> parts = {{0, 0}, {2, 4}, {3, 6}};
  const std::vector<int64_t> layers = {2, 1, 2};
  absl::Status s = RunOrderedParts(sink, parts, [&](size_t k, LayersSink& part_sink, PartTurn&) {
    return FakePart(k, layers[k], part_sink, parts.size());
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_FALSE(sink.other_thread);
  EXPECT_THAT(sink.calls, ElementsAre("begin part0", "layer 0", "write 0 aa", "layer 1",
                                      "write 0 aa", "layer 2", "write 0 bb", "layer 3",
                                      "write 0 cc", "layer 4", "write 0 cc"));
}

TEST(RunOrderedPartsTest, PartsRunAtOnce) {
  RecordingSink sink;
  const std::vector<OrderedPart> parts = {{0, 0}, {1, 2}};
  std::atomic<int> running{0};
  std::atomic<bool> both{false};
  absl::Status s = RunOrderedParts(sink, parts, [&](size_t k, LayersSink& part_sink, PartTurn&) {
    ++running;
    for (int i = 0; i < 2000 && !both; ++i) {  // wait (bounded) for the other part to start
      if (running.load() == 2) both = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return FakePart(k, 1, part_sink, 2);
  });
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(both.load());
}

TEST(RunOrderedPartsTest, DestinationIsShiftedPerPart) {
  RecordingSink sink;
  std::vector<uint8_t> memory(64);
  sink.dest = ResultDestination{.memory = ResultDestination::Memory::kHost,
                                .data = memory.data(),
                                .bytes = 64,
                                .pinned = false,
                                .device = -1};
  sink.has_dest = true;
  const std::vector<OrderedPart> parts = {{0, 0}, {3, 48}};
  std::vector<ResultDestination> copies(2);
  absl::Status s = RunOrderedParts(sink, parts, [&](size_t k, LayersSink& part_sink, PartTurn&) {
    copies[k] = *part_sink.destination();
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(copies[0].data, memory.data());
  EXPECT_EQ(copies[0].bytes, 64);
  EXPECT_EQ(copies[1].data, memory.data() + 48);
  EXPECT_EQ(copies[1].bytes, 16);
}

TEST(RunOrderedPartsTest, SinkErrorStopsThePartAndCancelsLaterOnes) {
  RecordingSink sink;
  sink.fail_at_call = 2;  // part 0's first Write
  const std::vector<OrderedPart> parts = {{0, 0}, {2, 4}};
  std::vector<absl::Status> returned(2);
  absl::Status s = RunOrderedParts(sink, parts, [&](size_t k, LayersSink& part_sink, PartTurn&) {
    returned[k] = FakePart(k, 2, part_sink, 2);
    return returned[k];
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(returned[0].code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(returned[1].code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(sink.calls, ElementsAre("begin part0", "layer 0", "write 0 aa"));
}

TEST(RunOrderedPartsTest, PartErrorIsReturnedAfterEarlierPartsDelivered) {
  RecordingSink sink;
  const std::vector<OrderedPart> parts = {{0, 0}, {1, 2}, {2, 4}};
  absl::Status s = RunOrderedParts(sink, parts, [&](size_t k, LayersSink& part_sink, PartTurn&) {
    if (k == 1) return absl::UnavailableError("cuda:1 failed");
    return FakePart(k, 1, part_sink, 3);
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "cuda:1 failed");
  EXPECT_THAT(sink.calls, ElementsAre("begin part0", "layer 0", "write 0 aa"));
}

// Runs `body` on a thread of its own: false when it has not returned within `limit`. A
// deadlocked body is left blocked on its detached thread (so it must own what it uses) and the
// test fails instead of hanging.
bool FinishesWithin(std::chrono::seconds limit, std::function<void()> body) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  std::thread([body = std::move(body), done] {
    body();
    done->set_value();
  }).detach();
  return finished.wait_for(limit) == std::future_status::ready;
}

// Fake GPUs, each with a pool of request slots (the CUDA backend's LeasePool<RequestSlot>).
struct FakeGpus {
  FakeGpus(int gpus, int slots_each) {
    for (int g = 0; g < gpus; ++g) {
      std::vector<std::unique_ptr<int>> slots;
      for (int i = 0; i < slots_each; ++i) slots.push_back(std::make_unique<int>(i));
      pools.push_back(std::make_unique<LeasePool<int>>(std::move(slots)));
    }
  }
  std::vector<std::unique_ptr<LeasePool<int>>> pools;
};

// One DequantizeLayers call cut into parts, part k on GPU gpus_of_part[k]: like the CUDA
// pipeline, the part takes a slot of its GPU in its turn (after `delay_ms[k]` of host work) and
// holds it through its sink calls (one layer each).
absl::Status FakeCall(FakeGpus& gpus, const std::vector<int>& gpus_of_part,
                      const std::vector<int>& delay_ms) {
  RecordingSink sink;
  std::vector<OrderedPart> parts;
  for (size_t k = 0; k < gpus_of_part.size(); ++k) {
    parts.push_back({static_cast<int64_t>(k), static_cast<int64_t>(2 * k)});
  }
  return RunOrderedParts(sink, parts, [&](size_t k, LayersSink& part_sink, PartTurn& turn) {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms[k]));
    absl::StatusOr<LeasePool<int>::Lease> slot =
        TakeInTurn(*gpus.pools[static_cast<size_t>(gpus_of_part[k])], &turn, "slot");
    if (!slot.ok()) return slot.status();
    return FakePart(k, 1, part_sink, parts.size());
  });
}

// Two calls cut over two GPUs of one slot each in opposite orders (PlanLayerParts gives part 0
// to the least-loaded GPU, so concurrent calls differ), part 0 slower to reach its slot. Taking
// slots regardless of part order, each call's part 1 took the other's GPU and both part 0s waited
// forever: the hang of CudaBackendTest.ConcurrentCallsIntoDeviceMemoryWithPlanEvictionsAreBitExact.
TEST(RunOrderedPartsTest, CallsCutOverGpusInOppositeOrdersDoNotDeadlock) {
  auto gpus = std::make_shared<FakeGpus>(2, 1);
  auto statuses = std::make_shared<std::vector<absl::Status>>(2);
  ASSERT_TRUE(FinishesWithin(std::chrono::seconds(20), [gpus, statuses] {
    std::thread x([&] { (*statuses)[0] = FakeCall(*gpus, {0, 1}, {100, 0}); });
    std::thread y([&] { (*statuses)[1] = FakeCall(*gpus, {1, 0}, {100, 0}); });
    x.join();
    y.join();
  })) << "deadlock: later parts hold the slots their calls' first parts wait for";
  EXPECT_TRUE((*statuses)[0].ok()) << (*statuses)[0];
  EXPECT_TRUE((*statuses)[1].ok()) << (*statuses)[1];
}

// One call with two parts on a GPU of one slot (split placement: the request's layers alternate
// between GPUs): its part 2 must not take the slot its part 0 needs.
TEST(RunOrderedPartsTest, ACallWithTwoPartsOnOneSlotDoesNotDeadlockItself) {
  auto gpus = std::make_shared<FakeGpus>(2, 1);
  auto status = std::make_shared<absl::Status>();
  ASSERT_TRUE(FinishesWithin(std::chrono::seconds(20), [gpus, status] {
    *status = FakeCall(*gpus, {0, 1, 0}, {100, 0, 0});
  })) << "deadlock: part 2 holds the slot part 0 waits for";
  EXPECT_TRUE(status->ok()) << *status;
}

// The GPU test's load on the CPU: 6 threads, 40 calls each, two GPUs of 3 slots, parts in every
// order (two or three parts, crossed and alternating), host work of 0-2 ms before each slot.
TEST(RunOrderedPartsTest, ManyConcurrentCallsOverTwoGpusOfThreeSlotsFinish) {
  auto gpus = std::make_shared<FakeGpus>(2, 3);
  auto failures = std::make_shared<std::atomic<int>>(0);
  ASSERT_TRUE(FinishesWithin(std::chrono::seconds(60), [gpus, failures] {
    const std::vector<std::vector<int>> orders = {{0, 1}, {1, 0}, {0, 1, 0}, {1, 0, 1}};
    std::vector<std::thread> threads;
    for (int t = 0; t < 6; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 40; ++i) {
          const std::vector<int>& order = orders[static_cast<size_t>((t + i) % 4)];
          std::vector<int> delays;
          for (size_t k = 0; k < order.size(); ++k) {
            delays.push_back(static_cast<int>((t * 7 + i * 3 + static_cast<int>(k)) % 3));
          }
          if (!FakeCall(*gpus, order, delays).ok()) ++*failures;
        }
      });
    }
    for (std::thread& th : threads) th.join();
  })) << "deadlock";
  EXPECT_EQ(failures->load(), 0);
}

// Part 0's GPU fails after it took its slot, and the backend runs it again on the other GPU,
// whose only slot part 1 holds while it waits for part 0: the retry takes a free slot or none
// (UNAVAILABLE), never waits, so the call ends instead of hanging.
TEST(RunOrderedPartsTest, APartRunAgainAfterItsGpuFailedDoesNotWaitForASlot) {
  auto gpus = std::make_shared<FakeGpus>(2, 1);
  auto status = std::make_shared<absl::Status>();
  auto retry = std::make_shared<absl::Status>();
  ASSERT_TRUE(FinishesWithin(std::chrono::seconds(20), [gpus, status, retry] {
    RecordingSink sink;
    const std::vector<OrderedPart> parts = {{0, 0}, {1, 2}};
    *status = RunOrderedParts(sink, parts, [&](size_t k, LayersSink& part_sink, PartTurn& turn) {
      if (k == 1) {
        absl::StatusOr<LeasePool<int>::Lease> slot = TakeInTurn(*gpus->pools[1], &turn, "slot");
        if (!slot.ok()) return slot.status();
        return FakePart(k, 1, part_sink, parts.size());
      }
      {
        absl::StatusOr<LeasePool<int>::Lease> first = TakeInTurn(*gpus->pools[0], &turn, "slot");
        if (!first.ok()) return first.status();
      }  // GPU 0 failed: its slot is given back
      EXPECT_TRUE(turn.took());
      while (gpus->pools[1]->free_count() != 0) {  // until part 1 holds GPU 1's slot
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      absl::StatusOr<LeasePool<int>::Lease> again =
          TakeInTurn(*gpus->pools[1], &turn, "slot of gpu 1");
      *retry = again.status();
      if (!again.ok()) return again.status();
      return FakePart(k, 1, part_sink, parts.size());
    });
  })) << "deadlock: the retried part waits for the slot its own later part holds";
  EXPECT_EQ(retry->code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(retry->message()), ::testing::HasSubstr("no slot of gpu 1 is free"));
  EXPECT_EQ(status->code(), absl::StatusCode::kUnavailable);
  // With a slot free on the other GPU the retry runs.
  auto free_gpus = std::make_shared<FakeGpus>(2, 2);
  auto ok = std::make_shared<absl::Status>();
  ASSERT_TRUE(FinishesWithin(std::chrono::seconds(20), [free_gpus, ok] {
    RecordingSink sink;
    const std::vector<OrderedPart> parts = {{0, 0}, {1, 2}};
    *ok = RunOrderedParts(sink, parts, [&](size_t k, LayersSink& part_sink, PartTurn& turn) {
      if (k == 0) {
        absl::StatusOr<LeasePool<int>::Lease> first =
            TakeInTurn(*free_gpus->pools[0], &turn, "slot");
        if (!first.ok()) return first.status();
      }
      absl::StatusOr<LeasePool<int>::Lease> slot = TakeInTurn(*free_gpus->pools[1], &turn, "slot");
      if (!slot.ok()) return slot.status();
      return FakePart(k, 1, part_sink, parts.size());
    });
  }));
  EXPECT_TRUE(ok->ok()) << *ok;
}

// A part waiting for its turn when an earlier part fails takes nothing: CANCELLED.
TEST(RunOrderedPartsTest, TurnIsCancelledWhenAnEarlierPartFails) {
  RecordingSink sink;
  const std::vector<OrderedPart> parts = {{0, 0}, {1, 2}};
  absl::Status turn_status;
  absl::Status s = RunOrderedParts(sink, parts, [&](size_t k, LayersSink&, PartTurn& turn) {
    if (k == 0) return absl::UnavailableError("cuda:0 failed");
    turn_status = turn.Wait();
    return turn_status;
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(turn_status.code(), absl::StatusCode::kCancelled);
}

TEST(TouchTrackingSinkTest, RemembersWhetherAnythingReachedTheSink) {
  RecordingSink inner;
  TouchTrackingSink tracked(inner, &inner);
  EXPECT_FALSE(tracked.touched());
  EXPECT_EQ(tracked.destination(), nullptr);
  ASSERT_TRUE(tracked.BeginLayer(3).ok());
  EXPECT_TRUE(tracked.touched());
  EXPECT_THAT(inner.calls, ElementsAre("layer 3"));
}

}  // namespace
}  // namespace dequantd
