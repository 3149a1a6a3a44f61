// The benchmark's CPU mode end to end (the plumbing the Benchmark RPC uses on CPU servers).
#include <string>

#include "gtest/gtest.h"
#include "kernels/gptq_format.h"
#include "measure/benchmark.h"
#include "measure/memory_budget.h"
#include "measure/table.h"

namespace dequantd::bench {
namespace {

BenchmarkRequest SmallCpuRequest() {
  BenchmarkRequest r;
  r.backend = Backend::kCpu;
  r.shapes = {{256, 512, 0, DType::kF16}, {384, 1024, 64, DType::kBF16}};
  r.group_size = 128;
  r.output_dtypes = {DType::kF16, DType::kBF16, DType::kF32};
  r.trials = 2;
  r.runs = 3;
  r.seed = 42;
  r.peak_copy_bytes = 1 << 20;
  r.cpu_threads = 2;
  return r;
}

TEST(CpuBenchmarkTest, RowsAreCorrectTimedAndCountTheRightBytes) {
  absl::StatusOr<BenchmarkResult> result = RunBenchmark(SmallCpuRequest());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->backend, "cpu");
  EXPECT_GT(result->peak_copy_bytes_per_second, 0);
  ASSERT_EQ(result->rows.size(), 2u * 3 * 3);  // shapes x dtypes x (reference, threads, copy)

  const char* kVariants[] = {"cpu_reference", "cpu_threads", "copy"};
  const DType kDtypes[] = {DType::kF16, DType::kBF16, DType::kF32};
  for (size_t i = 0; i < result->rows.size(); ++i) {
    const BenchmarkRow& row = result->rows[i];
    SCOPED_TRACE(row.variant + " " + std::to_string(row.K) + "x" + std::to_string(row.N));
    EXPECT_EQ(row.variant, kVariants[i % 3]);
    EXPECT_EQ(row.output_dtype, kDtypes[(i / 3) % 3]);
    EXPECT_TRUE(row.correct);
    EXPECT_EQ(row.latency.count, 6);
    EXPECT_GT(row.latency.median, 0);
    EXPECT_GT(row.latency.min, 0);
    EXPECT_LE(row.latency.min, row.latency.median);
    EXPECT_LE(row.latency.median, row.latency.max);
    EXPECT_EQ(row.throughput_seconds, 0);
    EXPECT_DOUBLE_EQ(row.bytes_per_second, row.bytes_moved / row.latency.median);
    EXPECT_DOUBLE_EQ(row.fraction_of_peak,
                     row.bytes_per_second / result->peak_copy_bytes_per_second);
  }
  // 256x512, G=128, fp16 scales, fp16 out: qweight 256*64*4 = 65536, qzeros 2*64*4 = 512,
  // scales 2*512*2 = 2048, output 256*512*2 = 262144.
  EXPECT_EQ(result->rows[0].K, 256);
  EXPECT_EQ(result->rows[0].group_size, 128);
  EXPECT_EQ(result->rows[0].bytes_moved, 65536 + 512 + 2048 + 262144);
  EXPECT_EQ(result->rows[2].bytes_moved, 65536 + 512 + 2048 + 262144);  // copy: same count
  // fp32 out: output 256*512*4 = 524288.
  EXPECT_EQ(result->rows[6].bytes_moved, 65536 + 512 + 2048 + 524288);
  // 384x1024, G=64, bf16 scales, bf16 out: qweight 384*128*4 = 196608, qzeros 6*128*4 = 3072,
  // scales 6*1024*2 = 12288, output 384*1024*2 = 786432.
  const BenchmarkRow& r = result->rows[9];
  EXPECT_EQ(r.K, 384);
  EXPECT_EQ(r.group_size, 64);
  EXPECT_EQ(r.output_dtype, DType::kF16);
  EXPECT_EQ(result->rows[12].bytes_moved, 196608 + 3072 + 12288 + 786432);
  EXPECT_EQ(result->rows[12].output_dtype, DType::kBF16);
}

TEST(CpuBenchmarkTest, SampledRowChecksAndVariantSelection) {
  BenchmarkRequest request = SmallCpuRequest();
  request.full_check_max_elements = 1000;  // every output is checked on sampled rows
  request.variants = {"cpu_threads"};
  request.output_dtypes = {};  // fp16
  absl::StatusOr<BenchmarkResult> result = RunBenchmark(request);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->rows.size(), 4u);
  EXPECT_EQ(result->rows[0].variant, "cpu_threads");
  EXPECT_EQ(result->rows[0].launch_config, "threads=2");
  EXPECT_EQ(result->rows[1].variant, "copy");
  EXPECT_EQ(result->rows[1].launch_config, "threads=2");  // the copy uses cpu_threads' threads
  for (const BenchmarkRow& row : result->rows) {
    EXPECT_TRUE(row.correct);
    EXPECT_EQ(row.output_dtype, DType::kF16);
  }
}

TEST(CpuBenchmarkTest, PeakAndCopyRowUseTheThreadsOfCpuThreads) {
  // Only cpu_reference is run; the yardstick still copies with cpu_threads' 3 threads. Copy rows:
  // 256x512 fp16 moves 330240 bytes, so 165120 are copied (>= 3 x 16 KiB).
  BenchmarkRequest request = SmallCpuRequest();
  request.cpu_threads = 3;
  request.variants = {"cpu_reference"};
  request.output_dtypes = {DType::kF16};
  absl::StatusOr<BenchmarkResult> result = RunBenchmark(request);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_GT(result->peak_copy_bytes_per_second, 0);
  ASSERT_EQ(result->rows.size(), 4u);  // 2 shapes x (cpu_reference, copy)
  for (const BenchmarkRow& row : result->rows) {
    SCOPED_TRACE(row.variant);
    EXPECT_EQ(row.launch_config, row.variant == "copy" ? "threads=3" : "threads=1");
    EXPECT_GT(row.fraction_of_peak, 0);
    EXPECT_DOUBLE_EQ(row.fraction_of_peak,
                     row.bytes_per_second / result->peak_copy_bytes_per_second);
  }
  EXPECT_EQ(result->rows[1].bytes_moved, 2 * 165120);
}

TEST(CpuBenchmarkTest, BadRequestsAreInvalidArgument) {
  BenchmarkRequest r = SmallCpuRequest();
  r.shapes.clear();
  EXPECT_EQ(RunBenchmark(r).status().code(), absl::StatusCode::kInvalidArgument);

  r = SmallCpuRequest();
  r.shapes = {{256, 1001}};
  const absl::Status bad_n = RunBenchmark(r).status();
  EXPECT_EQ(bad_n.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_n.message().find("256x1001"), std::string::npos) << bad_n;

  r = SmallCpuRequest();
  r.shapes = {{300, 512}};  // 300 % 128 != 0
  EXPECT_EQ(RunBenchmark(r).status().code(), absl::StatusCode::kInvalidArgument);

  r = SmallCpuRequest();
  r.variants = {"v4_vec16"};
  const absl::Status unknown = RunBenchmark(r).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("cpu_threads"), std::string::npos) << unknown;

  r = SmallCpuRequest();
  r.trials = -1;
  EXPECT_EQ(RunBenchmark(r).status().code(), absl::StatusCode::kInvalidArgument);
  r = SmallCpuRequest();
  r.runs = 10001;
  EXPECT_EQ(RunBenchmark(r).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuBenchmarkTest, CancelledIsPolledAndStopsTheBenchmark) {
  BenchmarkRequest r = SmallCpuRequest();
  int polls = 0;
  r.cancelled = [&polls] { return ++polls == 20; };  // fires inside the first (shape, dtype)
  const absl::StatusOr<BenchmarkResult> result = RunBenchmark(r);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(result.status().message(), "benchmark cancelled");
  EXPECT_EQ(polls, 20);  // not polled again once it fired
  // Cancelled before it starts: no work at all.
  polls = 0;
  r.cancelled = [&polls] { return ++polls > 0; };
  EXPECT_EQ(RunBenchmark(r).status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(polls, 1);
  // Never firing: the full result.
  r.cancelled = [] { return false; };
  const absl::StatusOr<BenchmarkResult> full = RunBenchmark(r);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->rows.size(), 2u * 3 * 3);  // shapes x dtypes x (2 variants + copy)
}

TEST(CpuBenchmarkTest, ShapeOverTheHostMemoryLimitIsResourceExhaustedBeforeAllocating) {
  BenchmarkRequest r = SmallCpuRequest();
  r.shapes = {{256, 512}};  // G = 128, fp16 scales
  r.output_dtypes = {DType::kF16};
  r.peak_copy_bytes = 4096;
  // inputs 65536 + 512 + 2048 = 68096; reference (131072 elements, checked in full): 262144;
  // bytes moved 68096 + 262144 = 330240, copy source 165120; shared output
  // max(262144, 165120) = 262144. Total 68096 + 262144 + 262144 + 165120 = 757504.
  r.host_memory_limit_bytes = 757503;
  const absl::Status over = RunBenchmark(r).status();
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.message(),
            "benchmark shape 256x512 (group_size 128, fp16 output) needs 757504 bytes of host "
            "memory (inputs 68096, reference 262144, output and copy buffers 427264), more than "
            "the 757503 bytes available (host_memory_limit_bytes)");
  r.host_memory_limit_bytes = 757504;  // exactly enough
  const absl::StatusOr<BenchmarkResult> fits = RunBenchmark(r);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(fits->rows.size(), 3u);
}

TEST(CpuBenchmarkTest, ReviewShapeIsRefusedWithoutAllocating) {
  // The new-user review's 65536 x 131072, G = 128, fp16 out (16 GiB of output): inputs
  // 4294967296 + 33554432 + 134217728 = 4462739456; reference one row, 262144; output
  // 17179869184 + copy source (4462739456 + 17179869184) / 2 = 10821304320.
  BenchmarkRequest r = SmallCpuRequest();
  r.shapes = {{65536, 131072}};
  r.output_dtypes = {DType::kF16};
  r.variants = {"copy"};
  r.host_memory_limit_bytes = int64_t{8} << 30;
  const absl::Status st = RunBenchmark(r).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(st.message(),
            "benchmark shape 65536x131072 (group_size 128, fp16 output) needs 32464175104 bytes "
            "of host memory (inputs 4462739456, reference 262144, output and copy buffers "
            "28001173504), more than the 8589934592 bytes available (host_memory_limit_bytes)");
}

TEST(CpuBenchmarkTest, PeakCopyOverTheHostMemoryLimitIsResourceExhausted) {
  BenchmarkRequest r = SmallCpuRequest();
  r.peak_copy_bytes = 1 << 20;  // source + destination: 2 MiB
  r.host_memory_limit_bytes = (2 << 20) - 1;
  const absl::Status st = RunBenchmark(r).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(st.message(),
            "the benchmark's peak copy needs 2097152 bytes of host memory, more than the 2097151 "
            "bytes available (host_memory_limit_bytes)");
}

TEST(CpuBenchmarkTest, CancelledDuringInputGenerationStopsBeforeAnyVariantIsTimed) {
  BenchmarkRequest r = SmallCpuRequest();
  // 4096 x 4096: qweight 8 MiB, generated in two 4 MiB blocks.
  r.shapes = {{4096, 4096}};
  r.output_dtypes = {DType::kF16};
  int polls = 0;
  // Polls: RunBenchmark's (1), the shape loop's (2), before allocating qweight (3), before its
  // first block (4), before its second block (5): fires inside the generation loop, before any
  // output buffer exists or any variant is timed.
  r.cancelled = [&polls] { return ++polls == 5; };
  const absl::StatusOr<BenchmarkResult> result = RunBenchmark(r);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(result.status().message(), "benchmark cancelled");
  EXPECT_EQ(polls, 5);

  // Never firing, one variant, 1 trial of 1 run: the setup polls 18 times, the method 12.
  // Setup: RunBenchmark 1, shape loop 1, generation 7 (qweight 1 + 2 blocks, qzeros 1 + 1,
  // scales 1 + 1), dtype loop 1, before the output 1, before the copy source 1, its fill 6 (copy
  // bytes (8388608 + 65536 + 262144 + 33554432) / 2 = 21135360: six 4 MiB slices).
  // Method: warm-up 2 runners x 3, timed 2, throughput 2, checks 2.
  r.variants = {"cpu_threads"};
  r.trials = 1;
  r.runs = 1;
  polls = 0;
  r.cancelled = [&polls] { return ++polls < 0; };
  const absl::StatusOr<BenchmarkResult> full = RunBenchmark(r);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(polls, 18 + 12);
}

TEST(HostMemoryBudgetTest, LimitWinsElseHalfOfMemAvailable) {
  EXPECT_EQ(HostMemoryBudget(12345), 12345);
  // Linux: /proc/meminfo has MemAvailable; half of it is positive.
  EXPECT_GT(HostMemoryBudget(0), 0);
}

TEST(CpuBenchmarkTest, HardwareCountersAreExplainedInTheNote) {
  BenchmarkRequest r = SmallCpuRequest();
  r.shapes = {{128, 64}};
  r.output_dtypes = {DType::kF16};
  r.hardware_counters = true;
  absl::StatusOr<BenchmarkResult> result = RunBenchmark(r);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NE(result->note.find("hardware counters"), std::string::npos);
}

TEST(BenchmarkDefaultsTest, NineShapesOfIssue3) {
  const std::vector<BenchmarkShape> shapes = DefaultShapes();
  ASSERT_EQ(shapes.size(), 9u);
  EXPECT_EQ(shapes[0].K, 1536);
  EXPECT_EQ(shapes[0].N, 1536);
  EXPECT_EQ(shapes[7].K, 8192);
  EXPECT_EQ(shapes[7].N, 28672);
  EXPECT_EQ(shapes[8].K, 28672);
  EXPECT_EQ(shapes[8].N, 8192);
}

TEST(FormatTableTest, MarkdownHasHeaderAndOneLinePerRow) {
  BenchmarkResult result;
  result.backend = "cpu";
  result.device = "CPU (2 hardware threads)";
  result.peak_copy_bytes_per_second = 4.2e12;
  BenchmarkRow row;
  row.variant = "cpu_threads";
  row.K = 1536;
  row.N = 8960;
  row.group_size = 128;
  row.latency.median = 12.5e-6;
  row.latency.mean = 13e-6;
  row.latency.std = 1e-6;
  row.bytes_per_second = 3.15e12;
  row.fraction_of_peak = 0.75;
  row.correct = true;
  result.rows = {row};
  const std::string md = FormatTable(result, {"2026-11-30 08:00 UTC", "abc1234"}, true);
  EXPECT_NE(md.find("- device: CPU (2 hardware threads) (backend cpu)\n"), std::string::npos);
  EXPECT_NE(md.find("- commit: abc1234\n"), std::string::npos);
  EXPECT_NE(md.find("- peak copy rate: 4200.0 GB/s"), std::string::npos);
  EXPECT_NE(md.find("| cpu_threads | 1536x8960 g128 | fp16 | 12.50 | 13.00 ± 1.00 | - | 3150.0 | "
                    "75.0 | - | - | no | yes | - |\n"),
            std::string::npos)
      << md;
}

// An MXFP4 shape (2 experts of 64 x 48, E8M0 scales) times on the CPU like any other: every
// row is bit-exact to the reference, bytes moved are blocks + scales + the stacked output, and
// the table names the format and the experts.
TEST(CpuBenchmarkTest, Mxfp4ShapeRowsAreCorrectAndNameTheFormat) {
  BenchmarkRequest r = SmallCpuRequest();
  r.shapes = {PresetShape(Format::kMxfp4, 64, 48, 32, 2)};
  r.output_dtypes = {DType::kBF16};
  absl::StatusOr<BenchmarkResult> result = RunBenchmark(r);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->rows.size(), 3u);  // cpu_reference, cpu_threads, copy
  for (const BenchmarkRow& row : result->rows) {
    EXPECT_TRUE(row.correct) << row.variant;
    EXPECT_EQ(row.format, Format::kMxfp4);
    EXPECT_EQ(row.experts, 2);
    // blocks 2*48*32 = 3072, scales 2*48*2 = 192, output 2*64*48*2 = 12288.
    EXPECT_EQ(row.bytes_moved, 3072 + 192 + 12288);
  }
  const std::string table = FormatTable(*result, {"now", "abc"}, true);
  EXPECT_NE(table.find("| cpu_threads | mxfp4/e2 64x48 g32 | bf16 |"), std::string::npos) << table;
}

// A GPTQ shape (act-order g_idx, asymmetric zeros) times like any other, its rows bit-exact in
// its own (N, K) orientation; declared symmetric, random zeros break its rule: refused, naming
// the format.
TEST(CpuBenchmarkTest, GptqShapeRowsAreCorrectAndSymIsInvalidArgument) {
  BenchmarkRequest r = SmallCpuRequest();
  r.shapes = {PresetShape(Format::kGptq, 128, 64, 32)};
  absl::StatusOr<BenchmarkResult> result = RunBenchmark(r);
  ASSERT_TRUE(result.ok()) << result.status();
  for (const BenchmarkRow& row : result->rows) {
    EXPECT_TRUE(row.correct) << row.variant;
    EXPECT_EQ(row.layout, "gptq/f1");
  }
  r.shapes[0].format_flags |= gptq::kSym;
  result = RunBenchmark(r);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("random gptq inputs"), std::string::npos)
      << result.status();
}

}  // namespace
}  // namespace dequantd::bench
