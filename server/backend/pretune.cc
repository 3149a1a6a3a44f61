// Pretune and its helpers (see pretune.h).
#include "server/backend/pretune.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dequantd {

std::vector<QuantShape> DistinctLayerShapes(absl::Span<const QuantizedLayer> layers) {
  std::vector<QuantShape> shapes;
  for (const QuantizedLayer& layer : layers) {
    const QuantShape& s = layer.view.shape;
    bool seen = false;
    for (const QuantShape& t : shapes) {
      if (t == s) {  // format, bits and flags included (a GPTQ layer is no AWQ shape)
        seen = true;
        break;
      }
    }
    if (!seen) shapes.push_back(s);
  }
  return shapes;
}

void PretuneReport::Add(const PretuneReport& other) {
  keys += other.keys;
  tuned += other.tuned;
  cached += other.cached;
  untunable += other.untunable;
  failed += other.failed;
  if (first_error.ok()) first_error = other.first_error;
  wall_seconds += other.wall_seconds;
}

PretuneReport Pretune(Autotuner& tuner, TuneTarget& target, absl::Span<const QuantShape> shapes,
                      absl::Span<const DType> out_dtypes) {
  PretuneReport report;
  const auto start = std::chrono::steady_clock::now();
  for (const QuantShape& shape : shapes) {
    for (DType out_dtype : out_dtypes) {
      ++report.keys;
      const int candidates = target.CandidateCount(shape, out_dtype);
      if (candidates <= 1) {
        ++report.untunable;
        continue;
      }
      const TuneKey key = target.Key(shape, out_dtype);
      absl::StatusOr<Autotuner::Result> r =
          tuner.GetOrTune(key, candidates, [&] { return target.Tune(shape, out_dtype); });
      if (!r.ok()) {
        ++report.failed;
        if (report.first_error.ok()) {
          report.first_error = absl::Status(
              r.status().code(), absl::StrCat(key.ToString(), ": ", r.status().message()));
        }
      } else if (r->tuned) {
        ++report.tuned;
      } else {
        ++report.cached;
      }
    }
  }
  report.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace dequantd
