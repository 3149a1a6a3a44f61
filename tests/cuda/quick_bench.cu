// cuda_quick_bench: a minimal timer for kernel development (the full benchmark is bench/).
// For each shape (fp16 scales, group 128): latency (events around one launch, median of 50) and
// throughput (a CUDA graph of 20 back-to-back launches, median of 10 replays, time per launch)
// of v1-v3 and every v4 candidate config, plus v4 cache-hint policies, over input/output sets
// rotated across >= 256 MB so no run is served from L2. The yardstick is a 1 GiB device-to-device
// cudaMemcpyAsync (bytes read + written over time) and a same-size copy timed both ways.
// Fractions printed = (bytes the kernel must move / time) / peak copy rate.
// Usage: cuda_quick_bench [--sweep] [out_dtype fp16|bf16|fp32 ...]   (default: fp16)
// --sweep: every v4 (block, words, rows) instead of CandidateConfigs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/awq_format.h"
#include "kernels/cuda/dequant_cuda.h"
#include "kernels/cuda/dequant_kernels.cuh"
#include "tests/cuda/check_cuda.h"

namespace dequantd::cuda {
namespace {

__global__ void FillHash(uint32_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = GlobalThreadIndex(); i < n; i += GridThreads()) {
    uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B9u ^ seed ^ static_cast<uint32_t>(i >> 32);
    x ^= x >> 16, x *= 0x7FEB352Du, x ^= x >> 15, x *= 0x846CA68Bu, x ^= x >> 16;
    p[i] = x & 0x3BFF3BFFu;  // finite fp16/bf16 halves (for scales); fine for words too
  }
}
__global__ void FillWords(uint32_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = GlobalThreadIndex(); i < n; i += GridThreads()) {
    uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B9u ^ seed;
    x ^= x >> 16, x *= 0x7FEB352Du, x ^= x >> 15, x *= 0x846CA68Bu, x ^= x >> 16;
    p[i] = x;
  }
}

struct Policy1 : Vec16DefaultPolicy {  // cached loads, plain stores
  __device__ __forceinline__ static uint32_t LoadQweight(const uint32_t* p) { return __ldg(p); }
  __device__ __forceinline__ static void Store(uint4* p, uint4 v) { *p = v; }
};
struct Policy2 : Vec16DefaultPolicy {  // streaming loads, plain stores
  __device__ __forceinline__ static void Store(uint4* p, uint4 v) { *p = v; }
};
struct Policy3 : Vec16DefaultPolicy {  // cached loads, streaming stores
  __device__ __forceinline__ static uint32_t LoadQweight(const uint32_t* p) { return __ldg(p); }
};

struct Policy4 : Vec16DefaultPolicy {  // non-coherent loads with a 256-byte L2 prefetch
  __device__ __forceinline__ static uint32_t LoadQweight(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
  }
};

// The traffic of v4 (words=1, rows=1, fp16 out) without the arithmetic: 4 bytes read, 16 written.
__global__ void TrafficOnly(const uint32_t* q, uint4* out, int64_t words) {
  for (int64_t i = GlobalThreadIndex(); i < words; i += GridThreads()) {
    const uint32_t w = __ldcs(q + i);
    __stcs(out + i, make_uint4(w, w ^ 1, w ^ 2, w ^ 3));
  }
}

// Traffic only, block-contiguous: a block owns blockDim * kU consecutive words; thread t loads
// words t + i * blockDim (i < kU) first, then stores their 16-byte outputs.
template <int kU>
__global__ void TrafficBlocked(const uint32_t* q, uint4* out, int64_t words) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x * kU + threadIdx.x;
  uint32_t w[kU];
#pragma unroll
  for (int i = 0; i < kU; ++i) {
    const int64_t j = base + i * blockDim.x;
    w[i] = j < words ? __ldcs(q + j) : 0;
  }
#pragma unroll
  for (int i = 0; i < kU; ++i) {
    const int64_t j = base + i * blockDim.x;
    if (j < words) __stcs(out + j, make_uint4(w[i], w[i] ^ 1, w[i] ^ 2, w[i] ^ 3));
  }
}

struct Buffers {
  QuantShape shape;
  DType out_dtype;
  std::vector<QuantView> in;
  std::vector<void*> out;
  std::vector<void*> owned;
};

Buffers MakeBuffers(const QuantShape& shape, DType out_dtype) {
  Buffers b{shape, out_dtype, {}, {}, {}};
  const int64_t set_bytes = shape.bytes_moved(out_dtype);
  const int sets = static_cast<int>(std::max<int64_t>(2, (int64_t{256} << 20) / set_bytes + 1));
  for (int s = 0; s < sets; ++s) {
    void *qw, *qz, *sc, *o;
    CHECK_CUDA(cudaMalloc(&qw, awq::QweightBytes(shape)));
    CHECK_CUDA(cudaMalloc(&qz, awq::QzerosBytes(shape)));
    CHECK_CUDA(cudaMalloc(&sc, awq::ScalesBytes(shape)));
    CHECK_CUDA(cudaMalloc(&o, shape.output_bytes(out_dtype)));
    FillWords<<<1024, 256>>>(static_cast<uint32_t*>(qw), awq::QweightElements(shape), 11 + s);
    FillWords<<<1024, 256>>>(static_cast<uint32_t*>(qz), awq::QzerosElements(shape), 23 + s);
    FillHash<<<1024, 256>>>(static_cast<uint32_t*>(sc), awq::ScalesBytes(shape) / 4, 37 + s);
    b.in.push_back(awq::MakeView(shape, static_cast<int32_t*>(qw), static_cast<int32_t*>(qz), sc));
    b.out.push_back(o);
    b.owned.insert(b.owned.end(), {qw, qz, sc, o});
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  return b;
}
void FreeBuffers(Buffers& b) {
  for (void* p : b.owned) CHECK_CUDA(cudaFree(p));
}

using LaunchFn = std::function<void(int set, cudaStream_t)>;

struct Timing {
  double latency_us, throughput_us;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Timing Time(const LaunchFn& launch, int sets, cudaStream_t stream) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i) launch(i % sets, stream);  // warm-up
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> lat;
  for (int i = 0; i < 50; ++i) {
    CHECK_CUDA(cudaEventRecord(a, stream));
    launch(i % sets, stream);
    CHECK_CUDA(cudaEventRecord(b, stream));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    lat.push_back(ms * 1e3);
  }
  constexpr int kGraphLaunches = 20;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kGraphLaunches; ++i) launch(i % sets, stream);
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphLaunch(exec, stream));
  std::vector<double> tput;
  for (int i = 0; i < 10; ++i) {
    CHECK_CUDA(cudaEventRecord(a, stream));
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_CUDA(cudaEventRecord(b, stream));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    tput.push_back(ms * 1e3 / kGraphLaunches);
  }
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  return {Median(lat), Median(tput)};
}

template <class Policy>
LaunchFn V4WithPolicy(const Buffers& b, LaunchConfig c, int64_t max_blocks, bool pdl = false) {
  return [&b, c, max_blocks, pdl](int set, cudaStream_t stream) {
    const QuantView& in = b.in[set];
    DequantParams p;
    p.qweight = reinterpret_cast<const uint32_t*>(awq::Qweight(in));
    p.qzeros = reinterpret_cast<const uint32_t*>(awq::Qzeros(in));
    p.scales = awq::Scales(in);
    p.out = b.out[set];
    p.K = in.shape.K;
    p.N = in.shape.N;
    p.words_per_row = in.shape.N / 8;
    p.group_size = in.shape.group_size;
    const auto run = [&](auto w_c, auto r_c) {
      constexpr int kW = decltype(w_c)::value, kR = decltype(r_c)::value;
      if constexpr (kW * kR <= kV4MaxTileWords) {
        if (c.words_per_thread == kW && c.rows_per_thread == kR)
          CHECK_CUDA((LaunchVec16<DType::kF16, DType::kF16, kW, kR, Policy>(
              p, c.block_size, max_blocks, pdl, stream)));
      }
    };
    const auto for_rows = [&](auto w_c) {
      run(w_c, std::integral_constant<int, 1>{});
      run(w_c, std::integral_constant<int, 2>{});
      run(w_c, std::integral_constant<int, 4>{});
      run(w_c, std::integral_constant<int, 8>{});
      run(w_c, std::integral_constant<int, 16>{});
    };
    // fp16 scales -> fp16 output only.
    for_rows(std::integral_constant<int, 1>{});
    for_rows(std::integral_constant<int, 2>{});
    for_rows(std::integral_constant<int, 4>{});
  };
}

void Row(const char* shape, const std::string& what, const std::string& config, Timing t,
         double bytes, double peak) {
  std::printf("%-12s %-22s %-26s lat %9.2f us %6.1f%%   tput %9.2f us %6.1f%%\n", shape,
              what.c_str(), config.c_str(), t.latency_us,
              100 * bytes / (t.latency_us * 1e-6) / peak, t.throughput_us,
              100 * bytes / (t.throughput_us * 1e-6) / peak);
}

int Main(int argc, char** argv) {
  std::vector<DType> outs;
  bool sweep = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--sweep") {
      sweep = true;
      continue;
    }
    DType d;
    if (!ParseDType(argv[i], &d)) return std::fprintf(stderr, "bad dtype %s\n", argv[i]), 2;
    outs.push_back(d);
  }
  if (outs.empty()) outs.push_back(DType::kF16);
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // Peak copy rate: 1 GiB device-to-device, bytes read + written.
  const size_t kCopy = size_t{1} << 30;
  void *src, *dst;
  CHECK_CUDA(cudaMalloc(&src, kCopy));
  CHECK_CUDA(cudaMalloc(&dst, kCopy));
  FillWords<<<1024, 256>>>(static_cast<uint32_t*>(src), kCopy / 4, 5);
  const Timing big = Time(
      [&](int, cudaStream_t s) {
        CHECK_CUDA(cudaMemcpyAsync(dst, src, kCopy, cudaMemcpyDeviceToDevice, s));
      },
      1, stream);
  const double peak = 2.0 * kCopy / (big.latency_us * 1e-6);
  std::printf(
      "device %s, %d SMs, L2 %d MB; 1 GiB D2D copy: %.1f us latency -> peak %.3f TB/s "
      "(graph: %.3f TB/s)\n",
      prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, big.latency_us, peak / 1e12,
      2.0 * kCopy / (big.throughput_us * 1e-6) / 1e12);

  struct S {
    int64_t K, N;
    const char* name;
  };
  const S shapes[] = {{4096, 14336, "4096x14336"}, {14336, 4096, "14336x4096"},
                      {8192, 28672, "8192x28672"}, {1536, 1536, "1536x1536"},
                      {1536, 8960, "1536x8960"},   {8960, 1536, "8960x1536"}};
  for (DType out_dtype : outs) {
    std::printf("== output %s\n", std::string(DTypeName(out_dtype)).c_str());
    for (const S& s : shapes) {
      const QuantShape shape{.K = s.K, .N = s.N, .group_size = 128, .scale_dtype = DType::kF16};
      Buffers b = MakeBuffers(shape, out_dtype);
      const int sets = static_cast<int>(b.in.size());
      const double bytes = static_cast<double>(shape.bytes_moved(out_dtype));
      // Same-size copy: read + write = bytes.
      const size_t copy_bytes = static_cast<size_t>(bytes / 2);
      const size_t copy_sets = std::min<size_t>(kCopy / copy_bytes, sets);
      Row(s.name, "copy(same bytes)", "",
          Time(
              [&](int set, cudaStream_t st) {
                const size_t off = (set % copy_sets) * copy_bytes;
                CHECK_CUDA(cudaMemcpyAsync(static_cast<char*>(dst) + off,
                                           static_cast<char*>(src) + off, copy_bytes,
                                           cudaMemcpyDeviceToDevice, st));
              },
              sets, stream),
          bytes, peak);
      for (KernelVariant v : AllVariants()) {
        std::vector<LaunchConfig> configs = CandidateConfigs(v, shape, out_dtype);
        if (v == KernelVariant::kV3PerWordBlock) configs.resize(1);
        if (v == KernelVariant::kV4Vec16 && sweep) {
          configs.clear();
          for (int bs : {128, 256, 512})
            for (int w : {1, 2, 4})
              for (int r : {1, 2, 4, 8, 16}) {
                const LaunchConfig c{.block_size = bs, .words_per_thread = w, .rows_per_thread = r};
                if (CanImplement(v, c, shape, out_dtype).ok()) configs.push_back(c);
              }
        }
        double best = 1e30;
        LaunchConfig best_config;
        for (const LaunchConfig& c : configs) {
          const Timing t = Time(
              [&](int set, cudaStream_t st) {
                const absl::Status status =
                    LaunchDequantize(v, c, b.in[set], out_dtype, b.out[set], st);
                if (!status.ok())
                  std::fprintf(stderr, "%s\n", status.ToString().c_str()), std::exit(1);
              },
              sets, stream);
          Row(s.name, std::string(VariantName(v)), c.ToString(), t, bytes, peak);
          if (t.throughput_us < best) best = t.throughput_us, best_config = c;
          if (v == KernelVariant::kV4Vec16 && sweep && out_dtype == DType::kF16)
            Row(s.name, "v4_pdl", c.ToString(),
                Time(V4WithPolicy<Vec16DefaultPolicy>(b, c, 0, true), sets, stream), bytes, peak);
        }
        if (v == KernelVariant::kV4Vec16 && out_dtype == DType::kF16) {
          const LaunchConfig c = best_config;
          Row(s.name, "v4 ldcs+stcs (default)", c.ToString(),
              Time(V4WithPolicy<Vec16DefaultPolicy>(b, c, 0), sets, stream), bytes, peak);
          Row(s.name, "v4 ldg+plain", c.ToString(),
              Time(V4WithPolicy<Policy1>(b, c, 0), sets, stream), bytes, peak);
          Row(s.name, "v4 ldcs+plain", c.ToString(),
              Time(V4WithPolicy<Policy2>(b, c, 0), sets, stream), bytes, peak);
          Row(s.name, "v4 ldg+stcs", c.ToString(),
              Time(V4WithPolicy<Policy3>(b, c, 0), sets, stream), bytes, peak);
          Row(s.name, "v4 nc+L2::256B+stcs", c.ToString(),
              Time(V4WithPolicy<Policy4>(b, c, 0), sets, stream), bytes, peak);
          Row(s.name, "v4 pdl", c.ToString(),
              Time(V4WithPolicy<Vec16DefaultPolicy>(b, c, 0, true), sets, stream), bytes, peak);
        }
      }
      // Ceilings for this traffic mix: write-only memset of the output, and v4's traffic alone.
      Row(s.name, "ceiling memset(out)", "",
          Time(
              [&](int set, cudaStream_t st) {
                CHECK_CUDA(cudaMemsetAsync(b.out[set], 0x3C, shape.output_bytes(out_dtype), st));
              },
              sets, stream),
          static_cast<double>(shape.output_bytes(out_dtype)), peak);
      if (out_dtype == DType::kF16) {
        Row(s.name, "ceiling traffic-only", "",
            Time(
                [&](int set, cudaStream_t st) {
                  const int64_t words = awq::QweightElements(shape);
                  TrafficOnly<<<static_cast<unsigned>((words + 255) / 256), 256, 0, st>>>(
                      reinterpret_cast<const uint32_t*>(awq::Qweight(b.in[set])),
                      static_cast<uint4*>(b.out[set]), words);
                },
                sets, stream),
            bytes, peak);
        const int64_t words = awq::QweightElements(shape);
        const auto blocked = [&](auto u_c, int block) {
          constexpr int kU = decltype(u_c)::value;
          Row(s.name, "traffic blocked U=" + std::to_string(kU), "block=" + std::to_string(block),
              Time(
                  [&](int set, cudaStream_t st) {
                    const int64_t per_block = int64_t{block} * kU;
                    TrafficBlocked<kU>
                        <<<static_cast<unsigned>((words + per_block - 1) / per_block), block, 0,
                           st>>>(reinterpret_cast<const uint32_t*>(awq::Qweight(b.in[set])),
                                 static_cast<uint4*>(b.out[set]), words);
                  },
                  sets, stream),
              bytes, peak);
        };
        blocked(std::integral_constant<int, 1>{}, 128);
        blocked(std::integral_constant<int, 2>{}, 128);
        blocked(std::integral_constant<int, 4>{}, 128);
        blocked(std::integral_constant<int, 8>{}, 128);
        blocked(std::integral_constant<int, 2>{}, 512);
        blocked(std::integral_constant<int, 4>{}, 512);
      }
      CHECK_CUDA(cudaGetLastError());
      FreeBuffers(b);
    }
  }
  return 0;
}

}  // namespace
}  // namespace dequantd::cuda

int main(int argc, char** argv) { return dequantd::cuda::Main(argc, argv); }
