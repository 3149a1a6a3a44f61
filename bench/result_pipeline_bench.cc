// result_pipeline_bench: the CUDA backend's result pipeline (server/backend/cuda/result_pipeline.h)
// measured in-process, without gRPC: a Llama-3-8B-shaped synthetic AWQ model (32 blocks x 7
// projections = 224 layers, 13.96 GB of fp16 output) plus one 8192 x 28672 layer, generated with
// random packed data into --dir, made resident, then dequantized to fp16 into
//   discard   a sink that drops every chunk (device -> pinned staging -> sink, the gRPC path minus
//             gRPC),
//   host      a pinned host destination (device -> host DMA straight into it),
//   device    a device destination (the kernel writes into it; no copy).
// Prints one table row per case (median of --runs), with the peak of the backend's result
// buffers (its kBuffers memory report) and of the device's used memory (cudaMemGetInfo).
// usage: result_pipeline_bench [--dir DIR] [--runs N] [--keep]  (DIR is written, then read)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "formats/safetensors.h"
#include "server/backend/backend.h"
#include "server/backend/backend_observer.h"
#include "server/model/checkpoint.h"

namespace dequantd {
namespace {

struct Shape {
  const char* name;
  int64_t K;
  int64_t N;
};
constexpr Shape kBlock[] = {{"self_attn.q_proj", 4096, 4096}, {"self_attn.k_proj", 4096, 1024},
                            {"self_attn.v_proj", 4096, 1024}, {"self_attn.o_proj", 4096, 4096},
                            {"mlp.gate_proj", 4096, 14336},   {"mlp.up_proj", 4096, 14336},
                            {"mlp.down_proj", 14336, 4096}};
constexpr int kBlocks = 32;
constexpr int64_t kGroup = 128;

// Random bytes, fast (xorshift64*), in parallel.
void Fill(std::vector<uint8_t>& bytes, uint64_t seed) {
  const size_t threads = 8;
  const size_t per = (bytes.size() / threads + 7) / 8 * 8;
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      uint64_t x = seed * 0x9E3779B97F4A7C15ull + t + 1;
      const size_t begin = std::min(bytes.size(), t * per);
      const size_t end = std::min(bytes.size(), begin + per);
      for (size_t i = begin; i < end; i += 8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        const uint64_t v = x * 0x2545F4914F6CDD1Dull;
        std::memcpy(bytes.data() + i, &v, std::min<size_t>(8, end - i));
      }
    });
  }
  for (std::thread& th : pool) th.join();
}

// Writes the model (and the 8192 x 28672 layer "big") into `dir`.
bool WriteModel(const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json")
      << R"({"quantization_config":{"quant_method":"awq","bits":4,"group_size":128,)"
      << R"("zero_point":true,"version":"gemm"}})";
  std::vector<std::vector<uint8_t>> storage;
  std::vector<safetensors::TensorToWrite> tensors;
  auto add = [&](const std::string& name, int64_t K, int64_t N, uint64_t seed) {
    storage.emplace_back(static_cast<size_t>(K * N / 2));
    Fill(storage.back(), seed);
    tensors.push_back({name + ".qweight", "I32", {K, N / 8}, storage.back()});
    storage.emplace_back(static_cast<size_t>(K / kGroup * N / 2));
    Fill(storage.back(), seed + 1);
    tensors.push_back({name + ".qzeros", "I32", {K / kGroup, N / 8}, storage.back()});
    storage.emplace_back(static_cast<size_t>(K / kGroup * N * 2));
    auto* scales = reinterpret_cast<uint16_t*>(storage.back().data());
    for (int64_t i = 0; i < K / kGroup * N; ++i)
      scales[i] = static_cast<uint16_t>(0x2000 + i % 997);
    tensors.push_back({name + ".scales", "F16", {K / kGroup, N}, storage.back()});
  };
  storage.reserve(3 * (kBlocks * 7 + 1));
  uint64_t seed = 1;
  for (int b = 0; b < kBlocks; ++b) {
    for (const Shape& s : kBlock)
      add(absl::StrCat("model.layers.", b, ".", s.name), s.K, s.N, seed += 2);
  }
  add("big", 8192, 28672, seed + 2);
  absl::Status s = safetensors::WriteFile(dir + "/model.safetensors", tensors);
  if (!s.ok()) std::fprintf(stderr, "write: %s\n", s.ToString().c_str());
  return s.ok();
}

// The peak of the backend's result-buffer memory (kBuffers).
class PeakObserver final : public BackendObserver {
 public:
  void ObserveStage(DequantizeStage, double) override {}
  void ObserveKernel(std::string_view, std::string_view, std::string_view, int64_t, int64_t,
                     double) override {}
  void SetDeviceCopyBandwidth(std::string_view, double) override {}
  void SetDeviceMemoryUsed(std::string_view, DeviceMemoryKind kind, int64_t bytes) override {
    if (kind != DeviceMemoryKind::kBuffers) return;
    int64_t seen = peak.load();
    while (bytes > seen && !peak.compare_exchange_weak(seen, bytes)) {
    }
  }
  std::atomic<int64_t> peak{0};
};

// Counts bytes; optionally places them in `destination`.
class CountingSink final : public LayersSink {
 public:
  explicit CountingSink(const ResultDestination* destination) : destination_(destination) {}
  const ResultDestination* destination() const override { return destination_; }
  absl::Status Begin(const std::string& k) override {
    kernel = k;
    return absl::OkStatus();
  }
  absl::Status BeginLayer(int64_t) override { return absl::OkStatus(); }
  absl::Status Write(int64_t, absl::Span<const uint8_t> data) override {
    bytes += static_cast<int64_t>(data.size());
    return absl::OkStatus();
  }
  std::string kernel;
  int64_t bytes = 0;

 private:
  const ResultDestination* destination_;
};

int64_t DeviceUsed() {
  size_t free_bytes = 0, total = 0;
  cudaMemGetInfo(&free_bytes, &total);
  return static_cast<int64_t>(total - free_bytes);
}

int Main(int argc, char** argv) {
  std::string dir = "/tmp/result_pipeline_bench_model";
  int runs = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--dir" && i + 1 < argc) dir = argv[++i];
    if (arg == "--runs" && i + 1 < argc) runs = std::max(1, std::atoi(argv[++i]));
  }
  if (!std::filesystem::exists(dir + "/model.safetensors") && !WriteModel(dir)) return 1;
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir);
  if (!checkpoint.ok()) {
    std::fprintf(stderr, "open: %s\n", checkpoint.status().ToString().c_str());
    return 1;
  }
  PeakObserver observer;
  BackendOptions options;
  options.kind = "cuda";
  options.observer = &observer;
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(options);
  if (!backend.ok() || !(*backend)->Prepare(**checkpoint).ok()) {
    std::fprintf(stderr, "backend: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  std::vector<const QuantizedLayer*> model;
  const QuantizedLayer* big = (*checkpoint)->Find("big");
  for (const QuantizedLayer& l : (*checkpoint)->layers()) {
    if (&l != big) model.push_back(&l);
  }
  int64_t model_bytes = 0;
  for (const QuantizedLayer* l : model) model_bytes += l->view.shape.output_bytes(DType::kF16);
  const int64_t big_bytes = big->view.shape.output_bytes(DType::kF16);
  const int64_t resident_used = DeviceUsed();

  uint8_t* host = nullptr;
  void* device = nullptr;
  if (cudaHostAlloc(reinterpret_cast<void**>(&host), model_bytes, cudaHostAllocDefault) !=
          cudaSuccess ||
      cudaMalloc(&device, model_bytes) != cudaSuccess) {
    std::fprintf(stderr, "cannot allocate the destinations\n");
    return 1;
  }
  const int64_t destinations_used = DeviceUsed();
  std::printf("device memory: %.2f GB used with the model resident; result buffers peak below\n",
              resident_used * 1e-9);
  std::printf(
      "| case | output | bytes | median s | GB/s | result buffers peak MB |"
      " device used above resident+destinations MB |\n|---|---|---|---|---|---|---|\n");
  const char* names[] = {"discard", "host", "device"};
  for (int whole = 1; whole >= 0; --whole) {
    for (int d = 0; d < 3; ++d) {
      ResultDestination destination;
      destination.memory =
          d == 2 ? ResultDestination::Memory::kDevice : ResultDestination::Memory::kHost;
      destination.data = d == 2 ? static_cast<uint8_t*>(device) : host;
      destination.bytes = model_bytes;
      destination.pinned = d == 1;
      destination.device = 0;
      observer.peak = 0;
      int64_t peak_used = 0;
      std::atomic<bool> sampling{true};
      std::thread sampler([&] {
        while (sampling.load()) {
          peak_used = std::max(peak_used, DeviceUsed());
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
      });
      std::vector<double> seconds;
      int64_t bytes = 0;
      for (int r = 0; r < runs; ++r) {
        CountingSink sink(d == 0 ? nullptr : &destination);
        const auto start = std::chrono::steady_clock::now();
        absl::Status s;
        if (whole) {
          s = (*backend)->DequantizeLayers(model, DType::kF16, Orientation::kKN, int64_t{1} << 20,
                                           sink);
        } else {
          DequantSource source;
          source.layer = big;
          s = (*backend)->Dequantize(source, DType::kF16, int64_t{1} << 20, sink);
        }
        seconds.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        if (!s.ok()) {
          std::fprintf(stderr, "%s: %s\n", names[d], s.ToString().c_str());
          sampling = false;
          sampler.join();
          return 1;
        }
        bytes = sink.bytes;
      }
      sampling = false;
      sampler.join();
      std::sort(seconds.begin(), seconds.end());
      const double median = seconds[seconds.size() / 2];
      std::printf("| %s | %s | %lld | %.4f | %.1f | %.0f | %.0f |\n",
                  whole ? "8B model, 224 layers (DequantizeLayers)" : "8192x28672 (Dequantize)",
                  names[d], static_cast<long long>(bytes), median, bytes * 1e-9 / median,
                  observer.peak.load() * 1e-6,
                  std::max<int64_t>(0, peak_used - destinations_used) * 1e-6);
    }
  }
  std::printf("expected bytes: model %lld, big %lld\n", static_cast<long long>(model_bytes),
              static_cast<long long>(big_bytes));
  cudaFreeHost(host);
  cudaFree(device);
  return 0;
}

}  // namespace
}  // namespace dequantd

int main(int argc, char** argv) { return dequantd::Main(argc, argv); }
