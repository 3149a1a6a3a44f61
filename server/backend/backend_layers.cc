// Backend::DequantizeLayers' default: one Dequantize per layer, the per-layer sink calls mapped
// onto the LayersSink contract (see backend.h).
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/backend/backend.h"

namespace dequantd {
namespace {

// Forwards one layer's Dequantize to the LayersSink: the first layer's Begin becomes the call's
// Begin, every layer's Begin becomes BeginLayer(index). When the sink has a destination (the
// whole call's results, one after another in request order), the layer's part of it,
// `layer_start` bytes in, is this layer's destination.
class LayerAdapter final : public ChunkSink {
 public:
  LayerAdapter(LayersSink& sink, int64_t index, bool* begun, int64_t layer_start,
               int64_t layer_bytes)
      : sink_(sink), index_(index), begun_(begun) {
    if (const ResultDestination* whole = sink.destination(); whole != nullptr) {
      destination_ = *whole;
      destination_.data = whole->data + layer_start;
      destination_.bytes = layer_bytes;
      has_destination_ = true;
    }
  }

  const ResultDestination* destination() const override {
    return has_destination_ ? &destination_ : nullptr;
  }

  absl::Status Begin(const std::string& kernel) override {
    if (!*begun_) {
      if (absl::Status s = sink_.Begin(kernel); !s.ok()) return s;
      *begun_ = true;
    }
    return sink_.BeginLayer(index_);
  }
  absl::Status Write(int64_t offset, absl::Span<const uint8_t> bytes) override {
    return sink_.Write(offset, bytes);
  }
  absl::Status WriteShared(int64_t offset, absl::Span<const uint8_t> bytes,
                           std::shared_ptr<const void> keepalive) override {
    return sink_.WriteShared(offset, bytes, std::move(keepalive));
  }

 private:
  LayersSink& sink_;
  const int64_t index_;
  bool* const begun_;
  ResultDestination destination_;
  bool has_destination_ = false;
};

}  // namespace

absl::Status Backend::DequantizeLayers(absl::Span<const QuantizedLayer* const> layers,
                                       DType out_dtype, Orientation orientation,
                                       int64_t chunk_bytes, LayersSink& sink) {
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] == nullptr)
      return absl::InvalidArgumentError(absl::StrCat("layer ", i, " is null"));
  }
  bool begun = false;
  int64_t layer_start = 0;  // bytes of the results before layer i
  for (size_t i = 0; i < layers.size(); ++i) {
    const int64_t layer_bytes = layers[i]->view.shape.output_bytes(out_dtype);
    LayerAdapter adapter(sink, static_cast<int64_t>(i), &begun, layer_start, layer_bytes);
    layer_start += layer_bytes;
    DequantSource source;
    source.layer = layers[i];
    source.orientation = orientation;
    if (absl::Status s = Dequantize(source, out_dtype, chunk_bytes, adapter); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace dequantd
