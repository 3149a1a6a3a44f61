// The Benchmark RPC end to end on the CPU backend (what CI runs): a real in-process server, the
// real DequantClient and the dequantctl binary. Rows are checked against values worked out by
// hand (bytes moved) or recomputed from the row (rates); times only for being positive and
// ordered, never against a bound.
#include <stdio.h>
#include <sys/wait.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_support.h"

namespace dequantd::testing {
namespace {

using ::testing::HasSubstr;

class BenchmarkTest : public SharedServerSuite<BenchmarkTest> {
 protected:
  static void SetUpTestSuite() {
    StartSharedServer(
        "benchmark",
        {MakeRandomLayer("model.layers.0.mlp.up_proj", 256, 512, 64, DType::kBF16, 61)}, 64);
  }
};

v1::BenchmarkRequest SmallRequest() {
  v1::BenchmarkRequest request;
  v1::BenchmarkShape* shape = request.add_shapes();
  shape->set_in_features(128);
  shape->set_out_features(256);
  request.set_trials(2);
  request.set_runs(3);
  return request;
}

// Checks what every row of a CPU benchmark must satisfy, whatever its timings.
void ExpectConsistentRow(const v1::BenchmarkRow& r, double peak) {
  SCOPED_TRACE(r.variant());
  EXPECT_TRUE(r.correct());
  EXPECT_GT(r.min_seconds(), 0);
  EXPECT_LE(r.min_seconds(), r.median_seconds());
  EXPECT_LE(r.median_seconds(), r.max_seconds());
  EXPECT_LE(r.min_seconds(), r.mean_seconds());
  EXPECT_LE(r.mean_seconds(), r.max_seconds());
  EXPECT_GE(r.std_seconds(), 0);
  EXPECT_DOUBLE_EQ(r.bytes_per_second(), static_cast<double>(r.bytes_moved()) / r.median_seconds());
  EXPECT_DOUBLE_EQ(r.fraction_of_peak(), r.bytes_per_second() / peak);
  EXPECT_EQ(r.throughput_seconds(), 0);  // no CUDA graph on the CPU
  EXPECT_EQ(r.throughput_bytes_per_second(), 0);
  EXPECT_TRUE(r.counters().empty());
}

TEST_F(BenchmarkTest, SmallShapeGivesCorrectRowsWithBytesMovedByTheFormula) {
  absl::StatusOr<v1::BenchmarkResponse> response = client().Benchmark(SmallRequest());
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->backend(), "cpu");
  EXPECT_THAT(response->device(), HasSubstr("CPU"));
  EXPECT_GT(response->peak_copy_bytes_per_second(), 0);
  EXPECT_EQ(response->note(), "");
  // qweight 128 * 32 * 4 = 16384, qzeros 1 * 32 * 4 = 128, scales 1 * 256 * 2 = 512, fp16 output
  // 128 * 256 * 2 = 65536: 82560 bytes. The copy row moves the same (41280 read + 41280 written).
  constexpr int64_t kBytesMoved = 16384 + 128 + 512 + 65536;
  ASSERT_EQ(response->rows_size(), 3);
  const char* variants[] = {"cpu_reference", "cpu_threads", "copy"};
  for (int i = 0; i < 3; ++i) {
    const v1::BenchmarkRow& r = response->rows(i);
    EXPECT_EQ(r.variant(), variants[i]);
    EXPECT_EQ(r.in_features(), 128);
    EXPECT_EQ(r.out_features(), 256);
    EXPECT_EQ(r.group_size(), 128);
    EXPECT_EQ(r.output_dtype(), v1::DTYPE_FP16);
    EXPECT_EQ(r.bytes_moved(), kBytesMoved);
    ExpectConsistentRow(r, response->peak_copy_bytes_per_second());
  }
  EXPECT_EQ(response->rows(0).launch_config(), "threads=1");
  EXPECT_EQ(response->rows(1).launch_config(), "threads=2");  // the server's --cpu-threads
}

TEST_F(BenchmarkTest, ModelTensorIsBenchmarkedWithItsOwnGroupSizeAndScaleDtype) {
  v1::BenchmarkRequest request;
  request.add_tensors(layer(0).name);
  request.add_variants("cpu_threads");
  request.add_output_dtypes(v1::DTYPE_FP32);
  request.set_group_size(128);  // for `shapes` only: the layer keeps its G = 64
  request.set_trials(2);
  request.set_runs(3);
  absl::StatusOr<v1::BenchmarkResponse> response = client().Benchmark(request);
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->rows_size(), 2);  // cpu_threads, copy
  EXPECT_EQ(response->rows(0).variant(), "cpu_threads");
  EXPECT_EQ(response->rows(1).variant(), "copy");
  // qweight 256 * 64 * 4 = 65536, qzeros 4 * 64 * 4 = 1024, bf16 scales 4 * 512 * 2 = 4096,
  // fp32 output 256 * 512 * 4 = 524288.
  for (const v1::BenchmarkRow& r : response->rows()) {
    EXPECT_EQ(r.in_features(), 256);
    EXPECT_EQ(r.out_features(), 512);
    EXPECT_EQ(r.group_size(), 64);
    EXPECT_EQ(r.output_dtype(), v1::DTYPE_FP32);
    EXPECT_EQ(r.bytes_moved(), 65536 + 1024 + 4096 + 524288);
    ExpectConsistentRow(r, response->peak_copy_bytes_per_second());
  }
}

TEST_F(BenchmarkTest, UnknownTensorIsNotFound) {
  v1::BenchmarkRequest request = SmallRequest();
  request.add_tensors("model.layers.9.mlp.up_proj");
  absl::StatusOr<v1::BenchmarkResponse> response = client().Benchmark(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(response.status().message(), HasSubstr("tensors[0]"));
}

TEST_F(BenchmarkTest, OutOfRangeFieldsAreInvalidArgumentNamingThem) {
  v1::BenchmarkRequest request = SmallRequest();
  request.set_trials(101);
  absl::StatusOr<v1::BenchmarkResponse> response = client().Benchmark(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(NamesField(std::string(response.status().message()), "trials")) << response.status();

  request = SmallRequest();
  request.set_runs(1001);
  response = client().Benchmark(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(NamesField(std::string(response.status().message()), "runs")) << response.status();

  request = SmallRequest();
  request.add_variants("v4_vec16");  // a CUDA variant on the CPU backend
  response = client().Benchmark(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(response.status().message(), HasSubstr("v4_vec16"));
}

TEST_F(BenchmarkTest, HardwareCountersAreReportedAsNotCollected) {
  v1::BenchmarkRequest request = SmallRequest();
  request.set_hardware_counters(true);
  request.set_trials(1);
  request.set_runs(1);
  absl::StatusOr<v1::BenchmarkResponse> response = client().Benchmark(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_THAT(response->note(), HasSubstr("hardware counters"));
  for (const v1::BenchmarkRow& r : response->rows()) EXPECT_TRUE(r.counters().empty());
}

TEST_F(BenchmarkTest, CpuServerInfoHasNoAutotuner) {
  absl::StatusOr<v1::GetServerInfoResponse> info = client().GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->autotune_entries(), 0);
  EXPECT_EQ(info->autotune_hits(), 0);
  EXPECT_EQ(info->autotune_misses(), 0);
  EXPECT_EQ(info->autotune_tunings(), 0);
  EXPECT_EQ(info->tune_cache(), "");
}

// Runs `command` through the shell; its exit code and stdout + stderr.
std::pair<int, std::string> Shell(const std::string& command) {
  std::string output;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {-1, ""};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) output.append(buf, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

TEST_F(BenchmarkTest, DequantctlBenchmarkPrintsTheTable) {
  const auto [code, output] =
      Shell(absl::StrCat(DequantctlPath(), " --server ", server_->address,
                         " benchmark --shapes 128x256 --trials 2 --runs 3"));
  ASSERT_EQ(code, 0) << output;
  EXPECT_THAT(output, HasSubstr("device: CPU"));
  EXPECT_THAT(output, HasSubstr("variant"));
  EXPECT_THAT(output, HasSubstr("median us"));
  for (const char* v : {"cpu_reference", "cpu_threads", "copy"}) {
    EXPECT_THAT(output, HasSubstr(absl::StrCat("\n", v, " "))) << v;
  }
  EXPECT_THAT(output, ::testing::ContainsRegex("\ncpu_threads +awq_gemm +128 +256 "));
}

TEST_F(BenchmarkTest, DequantctlBenchmarkErrorExitsNonZeroWithTheStatus) {
  const auto [code, output] = Shell(absl::StrCat(DequantctlPath(), " --server ", server_->address,
                                                 " benchmark --shapes 128x256 --trials 101"));
  EXPECT_NE(code, 0);
  EXPECT_THAT(output, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(output, HasSubstr("trials"));
}

}  // namespace
}  // namespace dequantd::testing
