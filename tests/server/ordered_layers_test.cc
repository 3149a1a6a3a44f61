// Tests for RunOrderedParts (server/backend/ordered_layers.h): parts run at once on their own
// threads, yet the sink sees one Begin, BeginLayer with call-wide indices and every Write in
// request order, all on the calling thread; destinations are shifted per part; the first error in
// part order is returned and later parts are cancelled. No GPU.
#include "server/backend/ordered_layers.h"

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

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
  absl::Status s = RunOrderedParts(sink, parts, [&](size_t k, LayersSink& part_sink) {
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
  absl::Status s = RunOrderedParts(sink, parts, [&](size_t k, LayersSink& part_sink) {
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
  absl::Status s = RunOrderedParts(sink, parts, [&](size_t k, LayersSink& part_sink) {
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
  absl::Status s = RunOrderedParts(sink, parts, [&](size_t k, LayersSink& part_sink) {
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
  absl::Status s = RunOrderedParts(sink, parts, [&](size_t k, LayersSink& part_sink) {
    if (k == 1) return absl::UnavailableError("cuda:1 failed");
    return FakePart(k, 1, part_sink, 3);
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "cuda:1 failed");
  EXPECT_THAT(sink.calls, ElementsAre("begin part0", "layer 0", "write 0 aa"));
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
