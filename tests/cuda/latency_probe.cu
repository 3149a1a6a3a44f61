// cuda_latency_probe: where the single-launch latency of v4 goes on large layers (kernel
// development tool, see kernels/cuda/NOTES.md). For each shape (fp16 scales and output, group
// 128, a fixed v4 config), times one operation alone with CUDA events, median and min of 30, over
// three input/output sets rotated so L2 does not serve them, in three ways:
//   events    start event, the operation, stop event (what dequantd_bench's latency column does)
//   blocked   the same behind a kernel that spins until the host has enqueued all three, so the
//             host's launch cost is not inside the events
//   flushed   blocked, after measure/l2_flush.h's 4 x L2 read, so no dirty line of the previous
//   operation is
//             written back during this one
// for v4 as a programmatic dependent launch (as shipped), v4 without it, and a device-to-device
// copy of half the bytes v4 moves. Inputs are constant byte patterns: this tool times, cuda_test
// checks results.
// Usage: cuda_latency_probe [KxN:block,words,rows ...]
//   (default: 8192x28672:256,1,2 4096x14336:256,1,4)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/dequant_kernels.cuh"
#include "measure/l2_flush.h"
#include "tests/cuda/check_cuda.h"

namespace dequantd::cuda {
namespace {

constexpr int kSets = 3;
constexpr int kSamples = 30;
constexpr int kGroup = 128;

__global__ void SpinUntilSet(const volatile int* flag) {
  while (*flag == 0) __nanosleep(200);
}

struct Shape {
  int64_t K, N;
  int block, words, rows;
};

struct Set {
  DequantParams p;
  void* copy_src = nullptr;
  void* copy_dst = nullptr;
};

void* Alloc(size_t bytes, int fill) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, bytes));
  CHECK_CUDA(cudaMemset(p, fill, bytes));
  return p;
}

template <int kWords, int kRows>
cudaError_t LaunchV4(const DequantParams& p, int block, bool pdl, cudaStream_t s) {
  return LaunchVec16<DType::kF16, DType::kF16, kWords, kRows>(p, block, 0, pdl, s);
}

// The v4 launch for (words, rows) among the configs this tool knows.
std::function<cudaError_t(const DequantParams&, int, bool, cudaStream_t)> V4For(int words,
                                                                                int rows) {
  if (words == 1 && rows == 1) return LaunchV4<1, 1>;
  if (words == 1 && rows == 2) return LaunchV4<1, 2>;
  if (words == 1 && rows == 4) return LaunchV4<1, 4>;
  if (words == 2 && rows == 1) return LaunchV4<2, 1>;
  if (words == 2 && rows == 2) return LaunchV4<2, 2>;
  if (words == 4 && rows == 1) return LaunchV4<4, 1>;
  std::fprintf(stderr, "unsupported words=%d rows=%d\n", words, rows);
  std::exit(2);
}

struct Stats {
  double median_us, min_us;
};

Stats Summarize(std::vector<float> ms) {
  std::sort(ms.begin(), ms.end());
  return {1000.0 * ms[ms.size() / 2], 1000.0 * ms.front()};
}

void Run(const Shape& shape) {
  const int64_t K = shape.K, N = shape.N;
  const size_t qweight_bytes = K * N / 2, qzeros_bytes = K / kGroup * N / 2;
  const size_t scales_bytes = K / kGroup * N * 2, out_bytes = K * N * 2;
  const size_t moved = qweight_bytes + qzeros_bytes + scales_bytes + out_bytes;
  const size_t copy_bytes = moved / 2 / 16 * 16;
  std::vector<Set> sets(kSets);
  for (Set& s : sets) {
    s.p.qweight = static_cast<const uint32_t*>(Alloc(qweight_bytes, 0x5A));
    s.p.qzeros = static_cast<const uint32_t*>(Alloc(qzeros_bytes, 0x11));
    s.p.scales = Alloc(scales_bytes, 0x3C);  // fp16 0x3C3C, about 1.06
    s.p.out = Alloc(out_bytes, 0);
    s.p.K = K, s.p.N = N, s.p.words_per_row = N / 8, s.p.group_size = kGroup;
    s.copy_src = Alloc(copy_bytes, 0x33);
    s.copy_dst = Alloc(copy_bytes, 0);
  }
  int* flag_host = nullptr;
  int* flag_dev = nullptr;
  CHECK_CUDA(cudaHostAlloc(&flag_host, sizeof(int), cudaHostAllocMapped));
  CHECK_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&flag_dev), flag_host, 0));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  const auto v4 = V4For(shape.words, shape.rows);
  absl::StatusOr<bench::L2Flush> flush = bench::L2Flush::Create(stream);
  if (!flush.ok()) {
    std::fprintf(stderr, "%s\n", std::string(flush.status().message()).c_str());
    std::exit(1);
  }

  using Op = std::function<void(const Set&)>;
  const std::vector<std::pair<std::string, Op>> ops = {
      {"v4 pdl", [&](const Set& s) { CHECK_CUDA(v4(s.p, shape.block, true, stream)); }},
      {"v4 no-pdl", [&](const Set& s) { CHECK_CUDA(v4(s.p, shape.block, false, stream)); }},
      {"copy", [&](const Set& s) {
         CHECK_CUDA(
             cudaMemcpyAsync(s.copy_dst, s.copy_src, copy_bytes, cudaMemcpyDeviceToDevice, stream));
       }}};
  const char* modes[] = {"events", "blocked", "flushed"};
  std::printf(
      "\n%lldx%lld fp16 g128, v4 block=%d,words=%d,rows=%d; v4 moves %.1f MB, copy %.1f "
      "MB x 2\n",
      static_cast<long long>(K), static_cast<long long>(N), shape.block, shape.words, shape.rows,
      moved / 1e6, copy_bytes / 1e6);
  std::printf("%-10s %-8s %10s %10s %9s\n", "op", "mode", "median us", "min us", "GB/s");
  for (const auto& [name, op] : ops) {
    for (int mode = 0; mode < 3; ++mode) {
      std::vector<float> ms;
      for (int i = 0; i < kSamples + 3; ++i) {
        const Set& s = sets[i % kSets];
        if (mode == 2 && !flush->Enqueue(stream).ok()) std::exit(1);
        if (mode >= 1) {
          *reinterpret_cast<volatile int*>(flag_host) = 0;
          SpinUntilSet<<<1, 1, 0, stream>>>(flag_dev);
        }
        CHECK_CUDA(cudaEventRecord(start, stream));
        op(s);
        CHECK_CUDA(cudaEventRecord(stop, stream));
        if (mode >= 1) *reinterpret_cast<volatile int*>(flag_host) = 1;
        CHECK_CUDA(cudaEventSynchronize(stop));
        float t = 0;
        CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
        if (i >= 3) ms.push_back(t);  // 3 warm-up samples
      }
      const Stats st = Summarize(ms);
      std::printf("%-10s %-8s %10.2f %10.2f %9.1f\n", name.c_str(), modes[mode], st.median_us,
                  st.min_us, moved / (st.median_us * 1e3));
    }
  }
  for (Set& s : sets) {
    cudaFree(const_cast<uint32_t*>(s.p.qweight));
    cudaFree(const_cast<uint32_t*>(s.p.qzeros));
    cudaFree(const_cast<void*>(s.p.scales));
    cudaFree(s.p.out);
    cudaFree(s.copy_src);
    cudaFree(s.copy_dst);
  }
  cudaFreeHost(flag_host);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace dequantd::cuda

int main(int argc, char** argv) {
  std::vector<dequantd::cuda::Shape> shapes;
  for (int i = 1; i < argc; ++i) {
    dequantd::cuda::Shape s{};
    long long K = 0, N = 0;
    if (std::sscanf(argv[i], "%lldx%lld:%d,%d,%d", &K, &N, &s.block, &s.words, &s.rows) != 5) {
      std::fprintf(stderr, "usage: cuda_latency_probe [KxN:block,words,rows ...]\n");
      return 2;
    }
    s.K = K, s.N = N;
    shapes.push_back(s);
  }
  if (shapes.empty()) shapes = {{8192, 28672, 256, 1, 2}, {4096, 14336, 256, 1, 4}};
  for (const auto& s : shapes) dequantd::cuda::Run(s);
  return 0;
}
