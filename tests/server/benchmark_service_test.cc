// The Benchmark RPC's core without gRPC: proto -> bench request (defaults per backend, every
// limit with its field named, tensors), bench result -> proto (field by field, the note), and
// the runner's one-at-a-time rule with a fake benchmark.
#include "server/rpc/benchmark_service.h"

#include <future>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;
using ::testing::HasSubstr;

v1::BenchmarkRequest ShapesRequest(std::vector<std::pair<int64_t, int64_t>> shapes) {
  v1::BenchmarkRequest request;
  for (const auto& [K, N] : shapes) {
    v1::BenchmarkShape* s = request.add_shapes();
    s->set_in_features(K);
    s->set_out_features(N);
  }
  return request;
}

BenchmarkServiceOptions Cpu() {
  BenchmarkServiceOptions options;
  options.backend = "cpu";
  options.cpu_threads = 3;
  return options;
}

absl::Status Convert(const v1::BenchmarkRequest& request,
                     const BenchmarkServiceOptions& options = Cpu()) {
  return BenchmarkRequestFromProto(request, options).status();
}

TEST(BenchmarkRequestFromProtoTest, CpuDefaultsAreSmall) {
  absl::StatusOr<bench::BenchmarkRequest> r = BenchmarkRequestFromProto({}, Cpu());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->backend, bench::Backend::kCpu);
  EXPECT_EQ(r->trials, kCpuDefaultTrials);
  EXPECT_EQ(r->runs, kCpuDefaultRuns);
  EXPECT_EQ(r->group_size, 128);
  EXPECT_EQ(r->cpu_threads, 3);
  ASSERT_EQ(r->output_dtypes.size(), 1u);
  EXPECT_EQ(r->output_dtypes[0], DType::kF16);
  ASSERT_EQ(r->shapes.size(), 1u);  // 1536x1536 only
  EXPECT_EQ(r->shapes[0].K, 1536);
  EXPECT_EQ(r->shapes[0].N, 1536);
  EXPECT_EQ(r->shapes[0].group_size, 128);
  EXPECT_TRUE(r->variants.empty());
  EXPECT_FALSE(r->hardware_counters);
}

TEST(BenchmarkRequestFromProtoTest, CudaDefaultsAreTheLibrarysAndTheNineShapes) {
  BenchmarkServiceOptions options;
  options.backend = "cuda";
  Autotuner tuner;
  options.autotuner = &tuner;
  absl::StatusOr<bench::BenchmarkRequest> r = BenchmarkRequestFromProto({}, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->backend, bench::Backend::kCuda);
  EXPECT_EQ(r->trials, 0);  // the library's default (5)
  EXPECT_EQ(r->runs, 0);    // the library's default (20)
  EXPECT_EQ(r->autotuner, &tuner);
  ASSERT_EQ(r->shapes.size(), 9u);
  EXPECT_EQ(r->shapes[8].K, 28672);
  EXPECT_EQ(r->shapes[8].N, 8192);
}

TEST(BenchmarkRequestFromProtoTest, FieldsAreCarriedOver) {
  v1::BenchmarkRequest request = ShapesRequest({{128, 256}, {256, 64}});
  request.set_group_size(64);
  request.add_variants("cpu_threads");
  request.add_output_dtypes(v1::DTYPE_BF16);
  request.add_output_dtypes(v1::DTYPE_FP32);
  request.add_output_dtypes(v1::DTYPE_BF16);  // duplicates are dropped
  request.set_trials(2);
  request.set_runs(3);
  request.set_hardware_counters(true);
  absl::StatusOr<bench::BenchmarkRequest> r = BenchmarkRequestFromProto(request, Cpu());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->trials, 2);
  EXPECT_EQ(r->runs, 3);
  EXPECT_EQ(r->group_size, 64);
  EXPECT_EQ(r->variants, std::vector<std::string>{"cpu_threads"});
  EXPECT_EQ(r->output_dtypes, (std::vector<DType>{DType::kBF16, DType::kF32}));
  EXPECT_TRUE(r->hardware_counters);
  ASSERT_EQ(r->shapes.size(), 2u);
  EXPECT_EQ(r->shapes[0].K, 128);
  EXPECT_EQ(r->shapes[0].N, 256);
  EXPECT_EQ(r->shapes[0].group_size, 64);
  EXPECT_EQ(r->shapes[0].scale_dtype, DType::kF16);
  EXPECT_EQ(r->shapes[1].K, 256);
  EXPECT_EQ(r->shapes[1].N, 64);
}

void ExpectInvalid(const v1::BenchmarkRequest& request, const std::string& field,
                   const BenchmarkServiceOptions& options = Cpu()) {
  const absl::Status s = Convert(request, options);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr(field));
}

// `orientation` sets every timed shape's result layout, the given shapes' and the defaults';
// UNSPECIFIED leaves each its format's own; an unknown number is INVALID_ARGUMENT naming it.
TEST(BenchmarkRequestFromProtoTest, OrientationAppliesToEveryShape) {
  v1::BenchmarkRequest request = ShapesRequest({{128, 256}, {256, 64}});
  request.set_orientation(v1::ORIENTATION_NK);
  absl::StatusOr<bench::BenchmarkRequest> r = BenchmarkRequestFromProto(request, Cpu());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->shapes.size(), 2u);
  for (const bench::BenchmarkShape& s : r->shapes) EXPECT_EQ(s.orientation, Orientation::kNK);
  EXPECT_EQ(bench::ToQuantShape(r->shapes[1]).orientation, Orientation::kNK);

  v1::BenchmarkRequest defaults;
  defaults.set_orientation(v1::ORIENTATION_NK);
  r = BenchmarkRequestFromProto(defaults, Cpu());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(r->shapes.empty());
  EXPECT_EQ(r->shapes[0].orientation, Orientation::kNK);

  request.set_orientation(v1::ORIENTATION_UNSPECIFIED);
  r = BenchmarkRequestFromProto(request, Cpu());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->shapes[0].orientation, std::nullopt);
  EXPECT_EQ(bench::ToQuantShape(r->shapes[0]).orientation, Orientation::kKN);  // AWQ's own

  request.set_orientation(static_cast<v1::Orientation>(7));
  ExpectInvalid(request, "orientation");
}

TEST(BenchmarkRequestFromProtoTest, EachLimitIsInvalidArgumentNamingItsField) {
  v1::BenchmarkRequest r = ShapesRequest({{128, 256}});
  r.set_trials(kMaxBenchmarkTrials);
  EXPECT_TRUE(Convert(r).ok());
  r.set_trials(kMaxBenchmarkTrials + 1);
  ExpectInvalid(r, "trials must be in [0, 100]");
  r.set_trials(-1);
  ExpectInvalid(r, "trials");

  r = ShapesRequest({{128, 256}});
  r.set_runs(kMaxBenchmarkRuns);
  EXPECT_TRUE(Convert(r).ok());
  r.set_runs(kMaxBenchmarkRuns + 1);
  ExpectInvalid(r, "runs must be in [0, 1000]");

  r = ShapesRequest({{128, 256}});
  r.set_group_size(-1);
  ExpectInvalid(r, "group_size");

  r = ShapesRequest({{128, 256}});
  for (int i = 0; i <= kMaxBenchmarkVariants; ++i) r.add_variants("cpu_threads");
  ExpectInvalid(r, "variants");

  r = ShapesRequest({{128, 256}});
  r.add_output_dtypes(v1::DTYPE_FP16);
  r.add_output_dtypes(v1::DTYPE_INT32);
  ExpectInvalid(r, "output_dtypes[1]");

  r = ShapesRequest(std::vector<std::pair<int64_t, int64_t>>(kMaxBenchmarkShapes, {128, 256}));
  EXPECT_TRUE(Convert(r).ok());
  r.add_tensors("one.too.many");
  ExpectInvalid(r, "shapes + tensors: at most 64");
}

TEST(BenchmarkRequestFromProtoTest, BadShapesNameTheirIndex) {
  ExpectInvalid(ShapesRequest({{128, 256}, {0, 256}}), "shapes[1] (0x256");
  ExpectInvalid(ShapesRequest({{128, 260}}), "shapes[0] (128x260");  // N not a multiple of 8
  ExpectInvalid(ShapesRequest({{100, 256}}), "shapes[0]");           // G = 128 does not divide K
}

// Over the server's limit is RESOURCE_EXHAUSTED, as Dequantize answers it.
void ExpectOverLimit(const v1::BenchmarkRequest& request, const std::string& message,
                     const BenchmarkServiceOptions& options = Cpu()) {
  const absl::Status s = Convert(request, options);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(s.message(), message);
}

TEST(BenchmarkRequestFromProtoTest, OutputsOverMaxOutputBytesAreResourceExhausted) {
  BenchmarkServiceOptions options = Cpu();
  options.max_output_bytes = 128 * 256 * 2;  // exactly one fp16 128x256
  EXPECT_TRUE(Convert(ShapesRequest({{128, 256}}), options).ok());
  v1::BenchmarkRequest fp32 = ShapesRequest({{128, 256}});
  fp32.add_output_dtypes(v1::DTYPE_FP32);
  ExpectOverLimit(fp32,
                  "shapes[0]: the fp32 output of 128x256 is more than the server's "
                  "max_output_bytes = 65536 bytes",
                  options);
  ExpectOverLimit(ShapesRequest({{256, 256}}),
                  "shapes[0]: the fp16 output of 256x256 is more than the server's "
                  "max_output_bytes = 65536 bytes",
                  options);
  // 2^20 x 2^20 is a valid shape (2^40 elements, the format's limit) over the default 16 GiB.
  ExpectOverLimit(ShapesRequest({{int64_t{1} << 20, int64_t{1} << 20}}),
                  "shapes[0]: the fp16 output of 1048576x1048576 is more than the server's "
                  "max_output_bytes = 17179869184 bytes");
  // A malformed shape stays INVALID_ARGUMENT even when it is also over the limit: N not a
  // multiple of 8, K * N beyond the format's 2^40 elements (not wrapped around).
  ExpectInvalid(ShapesRequest({{256, 260}}), "shapes[0] (256x260", options);
  ExpectInvalid(ShapesRequest({{int64_t{1} << 40, int64_t{1} << 40}}), "output elements");
}

TEST(BenchmarkRequestFromProtoTest, UnknownTensorIsNotFound) {
  v1::BenchmarkRequest r;
  r.add_tensors("model.layers.0.mlp.up_proj");
  const absl::Status s = Convert(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("tensors[0]: \"model.layers.0.mlp.up_proj\""));
  EXPECT_THAT(s.message(), HasSubstr("no model is loaded"));
}

TEST(BenchmarkRequestFromProtoTest, HugeUnknownTensorNameIsQuotedShort) {
  v1::BenchmarkRequest r;
  r.add_tensors(std::string(20000, 't'));
  const absl::Status s = Convert(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_LT(s.message().size(), 1024u);
  EXPECT_THAT(s.message(), HasSubstr("tensors[0]: \"" + std::string(200, 't') +
                                     "...\" (20000 bytes) is not a "
                                     "layer of the loaded model"));
}

bench::BenchmarkResult SampleResult() {
  bench::BenchmarkResult result;
  result.backend = "cuda";
  result.device = "NVIDIA H200 (sm_90, 132 SMs, L2 60 MiB)";
  result.peak_copy_bytes_per_second = 4.0e12;
  bench::BenchmarkRow row;
  row.variant = "v4_vec16";
  row.K = 4096;
  row.N = 14336;
  row.group_size = 128;
  row.output_dtype = DType::kBF16;
  row.bytes_moved = 147324928;
  row.latency = bench::SampleStats{.count = 10,
                                   .median = 4e-5,
                                   .mean = 5e-5,
                                   .std = 1e-6,
                                   .min = 3.9e-5,
                                   .max = 9e-5,
                                   .divergent = true};
  row.throughput_seconds = 3.8e-5;
  row.bytes_per_second = 3.6e12;
  row.fraction_of_peak = 0.9;
  row.throughput_bytes_per_second = 3.9e12;
  row.throughput_fraction_of_peak = 0.97;
  row.correct = true;
  row.launch_config = "block=128,words=1,rows=2";
  result.rows.push_back(row);
  return result;
}

TEST(BenchmarkResponseToProtoTest, EveryRowFieldIsCarried) {
  const v1::BenchmarkResponse p = BenchmarkResponseToProto(SampleResult(), false);
  EXPECT_EQ(p.device(), "NVIDIA H200 (sm_90, 132 SMs, L2 60 MiB)");
  EXPECT_EQ(p.backend(), "cuda");
  EXPECT_EQ(p.peak_copy_bytes_per_second(), 4.0e12);
  EXPECT_EQ(p.note(), "");
  ASSERT_EQ(p.rows_size(), 1);
  const v1::BenchmarkRow& r = p.rows(0);
  EXPECT_EQ(r.variant(), "v4_vec16");
  EXPECT_EQ(r.in_features(), 4096);
  EXPECT_EQ(r.out_features(), 14336);
  EXPECT_EQ(r.group_size(), 128);
  EXPECT_EQ(r.output_dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(r.bytes_moved(), 147324928);
  EXPECT_EQ(r.median_seconds(), 4e-5);
  EXPECT_EQ(r.mean_seconds(), 5e-5);
  EXPECT_EQ(r.std_seconds(), 1e-6);
  EXPECT_EQ(r.min_seconds(), 3.9e-5);
  EXPECT_EQ(r.max_seconds(), 9e-5);
  EXPECT_TRUE(r.divergent());
  EXPECT_EQ(r.throughput_seconds(), 3.8e-5);
  EXPECT_EQ(r.bytes_per_second(), 3.6e12);
  EXPECT_EQ(r.fraction_of_peak(), 0.9);
  EXPECT_EQ(r.throughput_bytes_per_second(), 3.9e12);
  EXPECT_EQ(r.throughput_fraction_of_peak(), 0.97);
  EXPECT_TRUE(r.correct());
  EXPECT_EQ(r.launch_config(), "block=128,words=1,rows=2");
  EXPECT_TRUE(r.counters().empty());
  EXPECT_EQ(r.format(), "awq_gemm");
  EXPECT_EQ(r.experts(), 1);
  EXPECT_EQ(r.orientation(), v1::ORIENTATION_KN);
}

TEST(BenchmarkResponseToProtoTest, RowSaysItsOrientation) {
  bench::BenchmarkResult result = SampleResult();
  result.rows[0].orientation = Orientation::kNK;
  EXPECT_EQ(BenchmarkResponseToProto(result, false).rows(0).orientation(), v1::ORIENTATION_NK);
}

TEST(BenchmarkResponseToProtoTest, Mxfp4RowNamesFormatAndExperts) {
  bench::BenchmarkResult result = SampleResult();
  result.rows[0].format = Format::kMxfp4;
  result.rows[0].experts = 32;
  const v1::BenchmarkResponse p = BenchmarkResponseToProto(result, false);
  ASSERT_EQ(p.rows_size(), 1);
  EXPECT_EQ(p.rows(0).format(), "mxfp4");
  EXPECT_EQ(p.rows(0).experts(), 32);
}

TEST(BenchmarkResponseToProtoTest, HardwareCountersRequestedGetsANote) {
  bench::BenchmarkResult result = SampleResult();
  EXPECT_EQ(BenchmarkResponseToProto(result, true).note(),
            "hardware counters not collected: this server does not collect them yet");
  result.note = "autotuner: something";
  EXPECT_EQ(BenchmarkResponseToProto(result, true).note(),
            "hardware counters not collected: this server does not collect them yet; "
            "autotuner: something");
  EXPECT_EQ(BenchmarkResponseToProto(result, false).note(), "autotuner: something");
  // The library already said why (the CPU has none): not repeated.
  result.note = "hardware counters are not collected on the CPU";
  EXPECT_EQ(BenchmarkResponseToProto(result, true).note(),
            "hardware counters are not collected on the CPU");
}

TEST(BenchmarkRunnerTest, RunsTheConvertedRequestAndConvertsTheResult) {
  BenchmarkServiceOptions options = Cpu();
  bench::BenchmarkRequest seen;
  options.run = [&](const bench::BenchmarkRequest& r) -> absl::StatusOr<bench::BenchmarkResult> {
    seen = r;
    return SampleResult();
  };
  const BenchmarkRunner runner = MakeBenchmarkRunner(options);
  v1::BenchmarkRequest request = ShapesRequest({{128, 256}});
  request.set_trials(2);
  absl::StatusOr<v1::BenchmarkResponse> response = runner(request, nullptr);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->rows_size(), 1);
  EXPECT_EQ(seen.trials, 2);
  ASSERT_EQ(seen.shapes.size(), 1u);
  EXPECT_EQ(seen.shapes[0].N, 256);
  // A bad request never reaches the benchmark.
  seen = {};
  request.set_trials(101);
  EXPECT_EQ(runner(request, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(seen.shapes.empty());
  // The benchmark's own error is returned as is.
  options.run = [](const bench::BenchmarkRequest&) -> absl::StatusOr<bench::BenchmarkResult> {
    return absl::FailedPreconditionError("no CUDA device 0");
  };
  EXPECT_EQ(MakeBenchmarkRunner(options)(ShapesRequest({{128, 256}}), nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(BenchmarkRunnerTest, ASecondCallWhileOneRunsIsResourceExhausted) {
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  BenchmarkServiceOptions options = Cpu();
  int runs = 0;
  options.run = [&](const bench::BenchmarkRequest&) -> absl::StatusOr<bench::BenchmarkResult> {
    if (++runs == 1) {
      entered.set_value();
      released.wait();
    }
    return SampleResult();
  };
  const BenchmarkRunner runner = MakeBenchmarkRunner(options);
  const v1::BenchmarkRequest request = ShapesRequest({{128, 256}});
  absl::StatusOr<v1::BenchmarkResponse> first = absl::UnknownError("not run");
  std::thread thread([&] { first = runner(request, nullptr); });
  entered.get_future().wait();

  const absl::StatusOr<v1::BenchmarkResponse> second = runner(request, nullptr);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(second.status().message(), HasSubstr("a benchmark is already running"));
  // An invalid request is still refused for what it is.
  v1::BenchmarkRequest bad = request;
  bad.set_runs(-1);
  EXPECT_EQ(runner(bad, nullptr).status().code(), absl::StatusCode::kInvalidArgument);

  release.set_value();
  thread.join();
  ASSERT_TRUE(first.ok()) << first.status();
  // The slot is free again.
  EXPECT_TRUE(runner(request, nullptr).ok());
  EXPECT_EQ(runs, 2);
}

}  // namespace
}  // namespace dequantd
