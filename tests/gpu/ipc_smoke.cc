// dequantd_ipc_smoke SERVER: the CUDA-IPC smoke test of issue 9, a client process of its own
// (CUDA IPC handles cannot be opened by the process that made them). Allocates a device buffer,
// exports it with cudaIpcGetMemHandle, registers it with the server at SERVER (HOST:PORT; the
// server runs on this host with --backend=cuda --shared-memory=cuda|all), dequantizes a random
// inline 1024x4096 layer into it at offset 4096, copies it back and compares bit for bit with
// DequantizeReference; then checks that a region too small for the result is INVALID_ARGUMENT
// and that an unregistered name is NOT_FOUND. Prints one line per check; exit 0 when all pass.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/shm_client.h"
#include "kernels/awq_format.h"
#include "kernels/dequant.h"

namespace {

using dequantd::v1::DequantizeRequest;

int failures = 0;

void Expect(bool ok, const std::string& what, const std::string& detail = "") {
  std::printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", what.c_str(), detail.empty() ? "" : ": ",
              detail.c_str());
  failures += ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: dequantd_ipc_smoke HOST:PORT\n");
    return 2;
  }
  constexpr int64_t K = 1024, N = 4096, G = 128, kOffset = 4096;
  std::mt19937 rng(9);
  std::vector<int32_t> qweight(K * N / 8), qzeros(K / G * N / 8);
  std::vector<uint16_t> scales(K / G * N);
  for (int32_t& w : qweight) w = static_cast<int32_t>(rng());
  for (int32_t& z : qzeros) z = static_cast<int32_t>(rng());
  for (uint16_t& s : scales) s = static_cast<uint16_t>(0x2000u + rng() % 0x1C00u);
  const dequantd::QuantView view = dequantd::awq::MakeView(
      dequantd::QuantShape{.K = K, .N = N, .group_size = G, .scale_dtype = dequantd::DType::kF16},
      qweight.data(), qzeros.data(), scales.data());
  const int64_t bytes = K * N * 2;
  std::vector<uint8_t> expected(static_cast<size_t>(bytes));
  if (!dequantd::DequantizeReference(view, dequantd::DType::kF16, 0, K, expected.data()).ok()) {
    return 1;
  }

  void* buffer = nullptr;
  cudaIpcMemHandle_t handle;
  if (cudaMalloc(&buffer, kOffset + bytes) != cudaSuccess ||
      cudaMemset(buffer, 0xFF, kOffset + bytes) != cudaSuccess ||
      cudaIpcGetMemHandle(&handle, buffer) != cudaSuccess) {
    std::fprintf(stderr, "CUDA: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  absl::StatusOr<std::unique_ptr<dequantd::DequantClient>> client =
      dequantd::DequantClient::Connect(argv[1]);
  if (!client.ok()) return 1;
  dequantd::RegionClient regions((*client)->channel());
  const std::string raw(reinterpret_cast<const char*>(&handle), sizeof(handle));
  absl::Status s = regions.RegisterCuda("smoke", raw, 0, 0, kOffset + bytes);
  Expect(s.ok(), "RegisterCuda", s.ToString());

  DequantizeRequest request;
  request.mutable_packed()->set_in_features(K);
  request.mutable_packed()->set_out_features(N);
  request.mutable_packed()->set_group_size(G);
  request.mutable_packed()->set_qweight(qweight.data(), qweight.size() * 4);
  request.mutable_packed()->set_qzeros(qzeros.data(), qzeros.size() * 4);
  request.mutable_packed()->set_scales(scales.data(), scales.size() * 2);
  request.mutable_output_region()->set_name("smoke");
  request.mutable_output_region()->set_offset(kOffset);
  absl::StatusOr<dequantd::v1::DequantizeHeader> header = regions.DequantizeInto(request);
  Expect(header.ok() && header->region_offset() == kOffset, "Dequantize into the device buffer",
         header.status().ToString());
  std::vector<uint8_t> got(static_cast<size_t>(kOffset + bytes));
  cudaMemcpy(got.data(), buffer, got.size(), cudaMemcpyDeviceToHost);
  Expect(std::memcmp(got.data() + kOffset, expected.data(), expected.size()) == 0,
         "the device buffer equals DequantizeReference bit for bit");
  Expect(got[kOffset - 1] == 0xFF, "the bytes before the offset are untouched");

  request.mutable_output_region()->set_offset(kOffset + 16);
  header = regions.DequantizeInto(request);
  Expect(header.status().code() == absl::StatusCode::kInvalidArgument,
         "a result past the region's end is INVALID_ARGUMENT", header.status().ToString());
  absl::StatusOr<int> released = regions.UnregisterCuda("smoke");
  Expect(released.ok() && *released == 1, "UnregisterCuda", released.status().ToString());
  request.mutable_output_region()->set_offset(kOffset);
  header = regions.DequantizeInto(request);
  Expect(header.status().code() == absl::StatusCode::kNotFound,
         "an unregistered region is NOT_FOUND", header.status().ToString());
  cudaFree(buffer);  // after UnregisterCuda: the server closed its mapping
  std::printf("ipc smoke: %d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
