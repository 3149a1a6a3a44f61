// The Benchmark RPC's core (see benchmark_service.h).
#include "server/rpc/benchmark_service.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/rpc/quoted_name.h"
#include "server/rpc/request.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;

// RESOURCE_EXHAUSTED (as Dequantize answers a result over the limit) unless
// K * N * sizeof(out_dtype) (overflow-safe) is within max_output_bytes.
absl::Status CheckOutputBytes(const std::string& field, int64_t K, int64_t N, DType out_dtype,
                              int64_t max_output_bytes) {
  const int64_t elements_limit = max_output_bytes / DTypeSize(out_dtype);
  if (K > 0 && N > 0 && K > elements_limit / N) {
    return absl::ResourceExhaustedError(
        absl::StrCat(field, ": the ", std::string(DTypeName(out_dtype)), " output of ", K, "x", N,
                     " is more than the server's max_output_bytes = ", max_output_bytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<bench::BenchmarkRequest> BenchmarkRequestFromProto(
    const v1::BenchmarkRequest& request, const BenchmarkServiceOptions& options) {
  const bool cpu = options.backend != "cuda";
  bench::BenchmarkRequest out;
  out.backend = cpu ? bench::Backend::kCpu : bench::Backend::kCuda;
  out.cpu_threads = options.cpu_threads;
  out.autotuner = options.autotuner;
  out.hardware_counters = request.hardware_counters();

  if (request.trials() < 0 || request.trials() > kMaxBenchmarkTrials) {
    return absl::InvalidArgumentError(absl::StrCat("trials must be in [0, ", kMaxBenchmarkTrials,
                                                   "] (0 = default), got ", request.trials()));
  }
  if (request.runs() < 0 || request.runs() > kMaxBenchmarkRuns) {
    return absl::InvalidArgumentError(absl::StrCat("runs must be in [0, ", kMaxBenchmarkRuns,
                                                   "] (0 = default), got ", request.runs()));
  }
  out.trials = request.trials() != 0 ? request.trials() : (cpu ? kCpuDefaultTrials : 0);
  out.runs = request.runs() != 0 ? request.runs() : (cpu ? kCpuDefaultRuns : 0);

  if (request.group_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("group_size must be >= 0 (0 = 128), got ", request.group_size()));
  }
  out.group_size = request.group_size() != 0 ? request.group_size() : 128;

  if (request.variants_size() > kMaxBenchmarkVariants) {
    return absl::InvalidArgumentError(absl::StrCat("variants: at most ", kMaxBenchmarkVariants,
                                                   " names, got ", request.variants_size()));
  }
  out.variants.assign(request.variants().begin(), request.variants().end());

  for (int i = 0; i < request.output_dtypes_size(); ++i) {
    absl::StatusOr<DType> dtype = OutputDTypeFromProto(request.output_dtypes(i));
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("output_dtypes[", i, "]: ", dtype.status().message()));
    }
    if (std::find(out.output_dtypes.begin(), out.output_dtypes.end(), *dtype) ==
        out.output_dtypes.end()) {
      out.output_dtypes.push_back(*dtype);
    }
  }
  if (out.output_dtypes.empty()) out.output_dtypes = {DType::kF16};

  const int count = request.shapes_size() + request.tensors_size();
  if (count > kMaxBenchmarkShapes) {
    return absl::InvalidArgumentError(
        absl::StrCat("shapes + tensors: at most ", kMaxBenchmarkShapes, " in all, got ", count));
  }
  std::vector<std::string> fields;  // the request field each of out.shapes comes from
  for (int i = 0; i < request.shapes_size(); ++i) {
    const v1::BenchmarkShape& s = request.shapes(i);
    out.shapes.push_back(
        bench::BenchmarkShape{s.in_features(), s.out_features(), out.group_size, DType::kF16});
    fields.push_back(absl::StrCat("shapes[", i, "]"));
  }
  for (int i = 0; i < request.tensors_size(); ++i) {
    const std::string& name = request.tensors(i);
    const QuantizedLayer* layer =
        options.checkpoint != nullptr ? options.checkpoint->Find(name) : nullptr;
    if (layer == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          "tensors[", i, "]: ", QuotedName(name), " is not a layer of the loaded model",
          options.checkpoint == nullptr ? " (no model is loaded)" : " (see ListTensors)"));
    }
    const QuantShape& s = layer->view.shape;
    out.shapes.push_back(bench::FromQuantShape(s));  // its format, bits, flags and orientation
    fields.push_back(absl::StrCat("tensors[", i, "] (", name, ")"));
  }
  if (out.shapes.empty()) {
    out.shapes = bench::DefaultShapes();
    if (cpu) out.shapes.resize(1);  // 1536x1536: the CPU reference is slow
    for (const bench::BenchmarkShape& s : out.shapes) {
      fields.push_back(absl::StrCat("default shape ", s.K, "x", s.N));
    }
  }
  if (request.orientation() != v1::ORIENTATION_UNSPECIFIED) {
    for (bench::BenchmarkShape& s : out.shapes) {
      absl::StatusOr<Orientation> o = OrientationFromProto(request.orientation(), s.format);
      if (!o.ok()) return o.status();
      s.orientation = *o;
    }
  }
  for (size_t i = 0; i < out.shapes.size(); ++i) {
    bench::BenchmarkShape& s = out.shapes[i];
    if (s.group_size == 0) s.group_size = out.group_size;
    const QuantShape shape = bench::ToQuantShape(s);
    for (DType dtype : out.output_dtypes) {
      // A malformed shape first (INVALID_ARGUMENT), then the server's limit (RESOURCE_EXHAUSTED).
      if (absl::Status st = ValidateShape(shape, dtype); !st.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            fields[i], " (", s.K, "x", s.N, ", group_size ", s.group_size, "): ", st.message()));
      }
      if (absl::Status st =
              CheckOutputBytes(fields[i], s.experts * s.K, s.N, dtype, options.max_output_bytes);
          !st.ok()) {
        return st;
      }
    }
  }
  return out;
}

v1::BenchmarkResponse BenchmarkResponseToProto(const bench::BenchmarkResult& result,
                                               bool hardware_counters) {
  v1::BenchmarkResponse response;
  response.set_device(result.device);
  response.set_backend(result.backend);
  response.set_peak_copy_bytes_per_second(result.peak_copy_bytes_per_second);
  for (const bench::BenchmarkRow& r : result.rows) {
    v1::BenchmarkRow* row = response.add_rows();
    row->set_variant(r.variant);
    row->set_in_features(r.K);
    row->set_out_features(r.N);
    row->set_format(std::string(FormatName(r.format)));
    row->set_experts(r.experts);
    row->set_orientation(OrientationToProto(r.orientation));
    row->set_group_size(r.group_size);
    row->set_output_dtype(DTypeToProto(r.output_dtype));
    row->set_bytes_moved(r.bytes_moved);
    row->set_median_seconds(r.latency.median);
    row->set_mean_seconds(r.latency.mean);
    row->set_std_seconds(r.latency.std);
    row->set_min_seconds(r.latency.min);
    row->set_max_seconds(r.latency.max);
    row->set_divergent(r.latency.divergent);
    row->set_throughput_seconds(r.throughput_seconds);
    row->set_bytes_per_second(r.bytes_per_second);
    row->set_fraction_of_peak(r.fraction_of_peak);
    row->set_throughput_bytes_per_second(r.throughput_bytes_per_second);
    row->set_throughput_fraction_of_peak(r.throughput_fraction_of_peak);
    row->set_correct(r.correct);
    row->set_launch_config(r.launch_config);
    row->mutable_counters()->insert(r.counters.begin(), r.counters.end());
  }
  // The library notes what it could not do (e.g. counters on the CPU); say it when it did not.
  std::string note = result.note;
  if (hardware_counters && !absl::StrContains(note, "hardware counters")) {
    constexpr char kNoCounters[] =
        "hardware counters not collected: this server does not collect them yet";
    note = note.empty() ? kNoCounters : absl::StrCat(kNoCounters, "; ", note);
  }
  response.set_note(note);
  return response;
}

BenchmarkRunner MakeBenchmarkRunner(BenchmarkServiceOptions options) {
  if (!options.run) options.run = bench::RunBenchmark;
  auto running = std::make_shared<std::atomic<bool>>(false);
  return [options = std::move(options), running](
             const v1::BenchmarkRequest& request,
             grpc::ServerContext* context) -> absl::StatusOr<v1::BenchmarkResponse> {
    absl::StatusOr<bench::BenchmarkRequest> converted = BenchmarkRequestFromProto(request, options);
    if (!converted.ok()) return converted.status();
    // A client that goes away (deadline, cancel, disconnect) stops the benchmark, freeing the
    // server for the next one.
    if (context != nullptr) converted->cancelled = [context] { return context->IsCancelled(); };
    if (running->exchange(true)) {
      return absl::ResourceExhaustedError(
          "a benchmark is already running on this server; retry when it has finished");
    }
    absl::Cleanup release = [&running] { running->store(false); };
    absl::StatusOr<bench::BenchmarkResult> result = options.run(*converted);
    if (!result.ok()) return result.status();
    return BenchmarkResponseToProto(*result, request.hardware_counters());
  };
}

}  // namespace dequantd
