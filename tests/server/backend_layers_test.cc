// Backend::DequantizeLayers' default (the CPU backend's): Begin once with the kernel, then per
// listed layer BeginLayer(index) and its chunks with offsets from 0, bytes equal to
// DequantizeReference; duplicates; errors stop the stream.
#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backend/backend.h"
#include "server/model/checkpoint.h"
#include "tests/server/test_layer.h"

namespace dequantd {
namespace {

using ::dequantd::testing::PackedLayer;
using ::dequantd::testing::RandomPackedLayer;
using ::dequantd::testing::ReferenceBytes;

// Records every call in order and each layer's bytes.
class RecordingLayersSink final : public LayersSink {
 public:
  explicit RecordingLayersSink(int fail_begin_layer = -1) : fail_begin_layer_(fail_begin_layer) {}
  absl::Status Begin(const std::string& kernel) override {
    calls.push_back("Begin " + kernel);
    return absl::OkStatus();
  }
  absl::Status BeginLayer(int64_t index) override {
    calls.push_back("BeginLayer " + std::to_string(index));
    if (index == fail_begin_layer_) return absl::CancelledError("gone");
    results.emplace_back();
    return absl::OkStatus();
  }
  absl::Status Write(int64_t offset, absl::Span<const uint8_t> bytes) override {
    if (results.empty() || offset != static_cast<int64_t>(results.back().size())) gaps = true;
    if (!results.empty()) results.back().insert(results.back().end(), bytes.begin(), bytes.end());
    return absl::OkStatus();
  }
  std::vector<std::string> calls;  // Begin / BeginLayer, in order (writes not listed)
  std::vector<std::vector<uint8_t>> results;
  bool gaps = false;

 private:
  int fail_begin_layer_;
};

QuantizedLayer Layer(const std::string& name, const PackedLayer& packed) {
  return QuantizedLayer{.name = name, .view = packed.view(), .file = ""};
}

TEST(BackendLayersTest, CpuStreamsEachListedLayerFromOffsetZero) {
  const PackedLayer a = RandomPackedLayer({.K = 256, .N = 72, .group_size = 64}, 1);
  const PackedLayer b =
      RandomPackedLayer({.K = 64, .N = 1024, .group_size = 32, .scale_dtype = DType::kBF16}, 2);
  const QuantizedLayer la = Layer("a", a), lb = Layer("b", b);
  std::unique_ptr<Backend> backend = MakeCpuBackend(2);
  const std::vector<const QuantizedLayer*> layers = {&lb, &la, &lb};
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(dtype));
    RecordingLayersSink sink;
    // 1000-byte chunks: not a multiple of a row, so chunks cross rows.
    ASSERT_TRUE(backend->DequantizeLayers(layers, dtype, Orientation::kKN, 1000, sink).ok());
    EXPECT_THAT(sink.calls, ::testing::ElementsAre("Begin cpu threads=2", "BeginLayer 0",
                                                   "BeginLayer 1", "BeginLayer 2"));
    EXPECT_FALSE(sink.gaps);
    ASSERT_EQ(sink.results.size(), 3u);
    EXPECT_TRUE(sink.results[0] == ReferenceBytes(b, dtype));
    EXPECT_TRUE(sink.results[1] == ReferenceBytes(a, dtype));
    EXPECT_TRUE(sink.results[2] == ReferenceBytes(b, dtype));
  }
}

TEST(BackendLayersTest, EmptyListCallsNothingAndErrorsStop) {
  const PackedLayer a = RandomPackedLayer({.K = 128, .N = 64, .group_size = 64}, 3);
  const QuantizedLayer la = Layer("a", a);
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);

  RecordingLayersSink empty;
  EXPECT_TRUE(backend->DequantizeLayers({}, DType::kF16, Orientation::kKN, 1000, empty).ok());
  EXPECT_TRUE(empty.calls.empty());

  RecordingLayersSink failing(/*fail_begin_layer=*/1);
  const std::vector<const QuantizedLayer*> two = {&la, &la};
  EXPECT_EQ(backend->DequantizeLayers(two, DType::kF16, Orientation::kKN, 1000, failing).code(),
            absl::StatusCode::kCancelled);
  EXPECT_THAT(failing.calls,
              ::testing::ElementsAre("Begin cpu threads=1", "BeginLayer 0", "BeginLayer 1"));

  RecordingLayersSink sink;
  const std::vector<const QuantizedLayer*> with_null = {&la, nullptr};
  EXPECT_EQ(backend->DequantizeLayers(with_null, DType::kF16, Orientation::kKN, 1000, sink).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(sink.calls.empty());  // checked before any work
  EXPECT_EQ(backend->DequantizeLayers(two, DType::kF16, Orientation::kKN, 0, sink).code(),
            absl::StatusCode::kInvalidArgument);  // chunk_bytes < 1
}

}  // namespace
}  // namespace dequantd
