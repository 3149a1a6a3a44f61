// The grouped benchmark (measure/grouped.h): one grouped launch for a whole model vs a copy of
// the same bytes and vs one v4 launch per layer.
#include "measure/grouped.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dequant_cuda.h"
#include "kernels/cuda/grouped_dequant.h"
#include "measure/cuda_timing.h"
#include "measure/method.h"
#include "measure/packed_inputs.h"

namespace dequantd::bench {
namespace {

using cuda::GroupedItem;
using cuda::GroupedOptions;
using cuda::GroupedPlan;

// One device copy of the model: all packed inputs first, then all outputs contiguously (so the
// copy variant can stream a contiguous span of outputs).
struct ModelCopy {
  DeviceBuffer memory;
  std::vector<GroupedItem> items;
  uint8_t* outputs = nullptr;  // start of the output span
  int64_t output_bytes = 0;    // span length
};

absl::StatusOr<ModelCopy> UploadModel(const std::vector<HostPackedTensor>& host, DType out) {
  int64_t inputs = 0, outputs = 0;
  for (const HostPackedTensor& t : host) {
    for (const std::vector<uint8_t>& bytes : t.tensors)
      inputs += AlignUp(static_cast<int64_t>(bytes.size()));
    outputs += AlignUp(t.shape.output_bytes(out));
  }
  ModelCopy m;
  absl::StatusOr<DeviceBuffer> memory = Allocate(inputs + outputs);
  if (!memory.ok()) return memory.status();
  m.memory = std::move(*memory);
  auto* base = static_cast<uint8_t*>(m.memory.get());
  m.outputs = base + inputs;
  m.output_bytes = outputs;
  int64_t in_at = 0, out_at = 0;
  const auto upload = [&](const void* src, int64_t bytes) -> absl::StatusOr<const void*> {
    uint8_t* dst = base + in_at;
    DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    in_at += AlignUp(bytes);
    return dst;
  };
  for (const HostPackedTensor& t : host) {
    GroupedItem item;
    item.in.shape = t.shape;
    for (size_t r = 0; r < t.tensors.size(); ++r) {
      if (t.tensors[r].empty()) continue;
      absl::StatusOr<const void*> at =
          upload(t.tensors[r].data(), static_cast<int64_t>(t.tensors[r].size()));
      if (!at.ok()) return at.status();
      item.in.tensors[r] = *at;
    }
    item.out = m.outputs + out_at;
    out_at += AlignUp(t.shape.output_bytes(out));
    m.items.push_back(item);
  }
  return m;
}

GroupedBenchRow MakeRow(std::string variant, std::string config, int64_t launches,
                        int64_t bytes_moved) {
  GroupedBenchRow row;
  row.variant = std::move(variant);
  row.config = std::move(config);
  row.launches = launches;
  row.bytes_moved = bytes_moved;
  return row;
}

// Something timed: enqueues one call on copy `c` (of the model's device copies).
struct Variant {
  GroupedBenchRow row;
  std::function<absl::Status(int c, cudaStream_t)> enqueue;
};

std::string OptionsString(const GroupedOptions& o) {
  return absl::StrCat("block=", o.block_size, ",rows=", o.rows_per_thread,
                      ",units=", o.units_per_thread, ",pdl=", o.programmatic_launch ? 1 : 0);
}

// Times every variant `runs` times, each run in a fresh random order, rotating over `copies`;
// fills in latency and fraction_of_peak. Two untimed warm-up calls per variant first.
absl::Status TimeVariants(std::vector<Variant>& variants, int runs, int copies, double peak,
                          EventTimer& timer, std::mt19937_64& rng) {
  std::vector<std::vector<double>> samples(variants.size());
  std::vector<size_t> order(variants.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  int call = 0;
  for (int run = -2; run < runs; ++run) {
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i : order) {
      const int c = call++ % copies;
      absl::StatusOr<double> t = timer.Time([&] { return variants[i].enqueue(c, timer.stream()); });
      if (!t.ok()) return t.status();
      if (run >= 0) samples[i].push_back(*t);
    }
  }
  for (size_t i = 0; i < variants.size(); ++i) {
    GroupedBenchRow& row = variants[i].row;
    row.latency = ComputeStats(samples[i]);
    row.fraction_of_peak = static_cast<double>(row.bytes_moved) / row.latency.median / peak;
  }
  return absl::OkStatus();
}

// Sentinel-fills copy 0's outputs, runs `v` on it and compares every layer with its checker
// (rows from PickRows: all rows of small layers, sampled rows of large ones).
absl::StatusOr<bool> CheckVariant(const Variant& v, ModelCopy& model,
                                  const std::vector<OutputChecker>& checkers, DType out,
                                  cudaStream_t stream, std::mt19937_64& rng) {
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(model.outputs, 0xFF, model.output_bytes, stream));
  if (absl::Status s = v.enqueue(0, stream); !s.ok()) return s;
  DEQUANTD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  std::vector<uint8_t> host;
  for (size_t i = 0; i < checkers.size(); ++i) {
    const OutputChecker& checker = checkers[i];
    for (const RowRange& r : checker.PickRows(rng, 8)) {
      host.resize(static_cast<size_t>((r.second - r.first) * checker.row_bytes()));
      DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemcpy(
          host.data(),
          static_cast<const uint8_t*>(model.items[i].out) + r.first * checker.row_bytes(),
          host.size(), cudaMemcpyDeviceToHost));
      absl::StatusOr<bool> ok = checker.Matches(r, host.data());
      if (!ok.ok()) return ok.status();
      if (!*ok) return false;
    }
  }
  (void)out;
  return true;
}

// The sweep's candidates: block sizes x rows x units per thread (PDL on).
std::vector<GroupedOptions> SweepCandidates() {
  std::vector<GroupedOptions> out;
  for (int block : {64, 128, 256, 512})
    for (int rows : {1, 2, 4, 8, 16})
      for (int units : {1, 2, 4})
        out.push_back({.block_size = block, .rows_per_thread = rows, .units_per_thread = units});
  return out;
}

}  // namespace

absl::StatusOr<ModelLayers> ModelByName(std::string_view name) {
  if (name == "qwen2.5-1.5b") {
    ModelLayers m;
    m.name = std::string(name);
    m.description = "28 layers x 7 projections (q, k, v, o, gate, up, down), group 128";
    const int64_t kProjections[7][2] = {{1536, 1536}, {1536, 256},  {1536, 256}, {1536, 1536},
                                        {1536, 8960}, {1536, 8960}, {8960, 1536}};
    for (int layer = 0; layer < 28; ++layer)
      for (const auto& kn : kProjections) m.layers.push_back({kn[0], kn[1], 128, DType::kF16});
    return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model \"", std::string(name), "\"; known: qwen2.5-1.5b"));
}

absl::StatusOr<GroupedBenchResult> RunGroupedBenchmark(const GroupedBenchRequest& request) {
  absl::StatusOr<ModelLayers> model = ModelByName(request.model);
  if (!model.ok()) return model.status();
  if (request.runs < 1 || request.sweep_runs < 0 || request.copies < 1)
    return absl::InvalidArgumentError("runs >= 1, sweep_runs >= 0 and copies >= 1 required");
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || request.device < 0 || request.device >= count) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device ", request.device));
  }
  absl::StatusOr<SelectedDevice> selected = SelectDevice(request.device);
  if (!selected.ok()) return selected.status();
  const cudaDeviceProp& prop = selected->prop;
  const int l2 = selected->l2_bytes;

  const DType out = request.out_dtype;
  GroupedBenchResult result;
  result.device = absl::StrCat(prop.name, " (sm_", prop.major, prop.minor, ", ",
                               prop.multiProcessorCount, " SMs, L2 ", l2 >> 20, " MiB)");
  result.model = absl::StrCat(model->name, ": ", model->description);
  result.out_dtype = out;
  result.layers = static_cast<int64_t>(model->layers.size());
  result.copies = request.copies;

  absl::StatusOr<EventTimer> timer = EventTimer::Create();
  if (!timer.ok()) return timer.status();
  std::mt19937_64 rng(request.seed);

  // The yardstick: a >= 1 GiB device-to-device copy, median of 10 after a warm-up.
  absl::StatusOr<double> peak_copy = MeasurePeakCopy(*timer, request.peak_copy_bytes);
  if (!peak_copy.ok()) return peak_copy.status();
  result.peak_copy_bytes_per_second = *peak_copy;
  const double peak = result.peak_copy_bytes_per_second;

  // Random layers, their checkers, and the device copies.
  std::vector<HostPackedTensor> host;
  host.reserve(model->layers.size());
  for (const QuantShape& shape : model->layers)
    host.push_back(MakeRandomPackedTensor(shape, rng()));
  std::vector<OutputChecker> checkers;
  for (const HostPackedTensor& t : host) {
    absl::StatusOr<OutputChecker> c = OutputChecker::Create(t.view(), out, int64_t{1} << 20);
    if (!c.ok()) return c.status();
    checkers.push_back(*std::move(c));
  }
  std::vector<ModelCopy> copies;
  for (int c = 0; c < request.copies; ++c) {
    absl::StatusOr<ModelCopy> m = UploadModel(host, out);
    if (!m.ok()) return m.status();
    copies.push_back(std::move(*m));
  }
  int64_t bytes = 0;
  for (const QuantShape& s : model->layers) bytes += s.bytes_moved(out);
  const int64_t layers = result.layers;

  // Plans: one per (options, copy).
  const auto make_plans =
      [&](const GroupedOptions& o) -> absl::StatusOr<std::shared_ptr<std::vector<GroupedPlan>>> {
    auto plans = std::make_shared<std::vector<GroupedPlan>>();
    for (ModelCopy& m : copies) {
      absl::StatusOr<GroupedPlan> p = GroupedPlan::Create(m.items, out, o);
      if (!p.ok()) return p.status();
      plans->push_back(*std::move(p));
    }
    return plans;
  };
  const auto plan_variant = [&](std::string name,
                                const GroupedOptions& o) -> absl::StatusOr<Variant> {
    absl::StatusOr<std::shared_ptr<std::vector<GroupedPlan>>> plans = make_plans(o);
    if (!plans.ok()) return plans.status();
    Variant v;
    v.row = MakeRow(std::move(name), OptionsString(o), 1, bytes);
    v.enqueue = [plans = *plans](int c, cudaStream_t s) { return (*plans)[c].Launch(s); };
    return v;
  };

  // The sweep.
  std::vector<Variant> sweep;
  for (const GroupedOptions& o : SweepCandidates()) {
    absl::StatusOr<Variant> v = plan_variant("sweep", o);
    if (!v.ok()) return v.status();
    sweep.push_back(*std::move(v));
  }
  if (request.sweep_runs > 0) {
    if (absl::Status s = TimeVariants(sweep, request.sweep_runs, request.copies, peak, *timer, rng);
        !s.ok())
      return s;
  }
  GroupedOptions best;
  double best_median = 1e30;
  for (size_t i = 0; i < sweep.size(); ++i) {
    result.sweep.push_back(sweep[i].row);
    if (request.sweep_runs > 0 && sweep[i].row.latency.median < best_median) {
      best_median = sweep[i].row.latency.median;
      best = SweepCandidates()[i];
    }
  }
  sweep.clear();

  // The comparison.
  std::vector<Variant> variants;
  {
    absl::StatusOr<Variant> v = plan_variant("grouped_plan", GroupedOptions{});
    if (!v.ok()) return v.status();
    variants.push_back(*std::move(v));
    if (!(best == GroupedOptions{})) {
      absl::StatusOr<Variant> tuned = plan_variant("grouped_plan_best", best);
      if (!tuned.ok()) return tuned.status();
      variants.push_back(*std::move(tuned));
    }
  }
  {
    Variant v;
    v.row = MakeRow("grouped_oneshot", OptionsString(GroupedOptions{}), 1, bytes);
    v.enqueue = [&copies, out](int c, cudaStream_t s) {
      return cuda::LaunchGroupedDequantize(copies[c].items, out, s);
    };
    variants.push_back(std::move(v));
  }
  // One v4 launch per layer (default launch configuration per shape), from the host...
  const auto per_layer = [&copies, out](int c, cudaStream_t s) -> absl::Status {
    for (const GroupedItem& item : copies[c].items) {
      const cuda::LaunchConfig config =
          cuda::DefaultConfig(cuda::KernelVariant::kV4Vec16, item.in.shape, out);
      if (absl::Status st = cuda::LaunchDequantize(cuda::KernelVariant::kV4Vec16, config, item.in,
                                                   out, item.out, s);
          !st.ok())
        return st;
    }
    return absl::OkStatus();
  };
  {
    Variant v;
    v.row = MakeRow("v4_per_layer_stream", "DefaultConfig per layer", layers, bytes);
    v.enqueue = per_layer;
    variants.push_back(std::move(v));
  }
  // ...and captured once per copy into a CUDA graph.
  {
    auto graphs = std::make_shared<std::vector<GraphExec>>();
    for (int c = 0; c < request.copies; ++c) {
      cudaStream_t s = timer->stream();
      absl::StatusOr<GraphExec> graph = CaptureGraph(s, [&] { return per_layer(c, s); });
      if (!graph.ok()) return graph.status();
      graphs->push_back(*std::move(graph));
    }
    Variant v;
    v.row = MakeRow("v4_per_layer_graph", "DefaultConfig per layer, CUDA graph", layers, bytes);
    v.enqueue = [graphs](int c, cudaStream_t s) -> absl::Status {
      DEQUANTD_CUDA_RETURN_IF_ERROR(cudaGraphLaunch((*graphs)[c].get(), s));
      return absl::OkStatus();
    };
    variants.push_back(std::move(v));
  }
  // The same byte count copied (read + written): copy c's outputs to copy c+1's.
  {
    const int64_t copy_bytes = CopyBytesFor(bytes);
    if (copy_bytes > copies.front().output_bytes || request.copies < 2)
      return absl::InvalidArgumentError("the copy variant needs 2 copies of the model");
    Variant v;
    v.row = MakeRow("copy", "cudaMemcpyAsync D2D", 1, 2 * copy_bytes);
    const int n = request.copies;
    v.enqueue = [&copies, copy_bytes, n](int c, cudaStream_t s) -> absl::Status {
      DEQUANTD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(copies[(c + 1) % n].outputs, copies[c].outputs,
                                                    copy_bytes, cudaMemcpyDeviceToDevice, s));
      return absl::OkStatus();
    };
    variants.push_back(std::move(v));
  }
  if (absl::Status s = TimeVariants(variants, request.runs, request.copies, peak, *timer, rng);
      !s.ok())
    return s;

  for (Variant& v : variants) {
    v.row.correct = true;
    if (v.row.variant != "copy") {
      absl::StatusOr<bool> ok =
          CheckVariant(v, copies.front(), checkers, out, timer->stream(), rng);
      if (!ok.ok()) return ok.status();
      v.row.checked = true;
      v.row.correct = *ok;
    }
    result.rows.push_back(v.row);
  }
  return result;
}

std::string FormatGroupedResult(const GroupedBenchResult& r) {
  std::string s = absl::StrFormat(
      "grouped benchmark: %s\n%d layers, %s output, %d device copies rotated\ndevice: %s\n"
      "peak copy rate: %.1f GB/s (>= 1 GiB cudaMemcpyAsync D2D, read + written)\n",
      r.model, r.layers, DTypeName(r.out_dtype), r.copies, r.device,
      r.peak_copy_bytes_per_second / 1e9);
  const auto table = [&](const std::vector<GroupedBenchRow>& rows) {
    absl::StrAppendFormat(&s, "%-20s %-32s %8s %10s %10s %10s %10s %8s %8s %s\n", "variant",
                          "config", "launches", "bytes", "median_us", "mean_us", "min_us", "GB/s",
                          "%peak", "correct");
    for (const GroupedBenchRow& row : rows) {
      absl::StrAppendFormat(&s, "%-20s %-32s %8d %10.3e %10.1f %10.1f %10.1f %8.1f %7.1f%% %s%s\n",
                            row.variant, row.config, row.launches,
                            static_cast<double>(row.bytes_moved), row.latency.median * 1e6,
                            row.latency.mean * 1e6, row.latency.min * 1e6,
                            row.bytes_moved / row.latency.median / 1e9, 100 * row.fraction_of_peak,
                            !row.checked  ? "-"
                            : row.correct ? "yes"
                                          : "NO",
                            row.latency.divergent ? " (divergent)" : "");
    }
  };
  if (!r.sweep.empty() && r.sweep.front().latency.count > 0) {
    s += "\nsweep of grouped launch options (latency of one grouped call):\n";
    table(r.sweep);
  }
  s += "\ncomparison (latency of one call for the whole model):\n";
  table(r.rows);
  return s;
}

}  // namespace dequantd::bench
