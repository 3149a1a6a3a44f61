// The shared-memory rows of the end-to-end benchmark (issue 9): one layer and a whole model
// written by a real dequantd (--shared-memory=all) into a host region (a POSIX shared-memory
// object this process creates) and into a device region (a cudaMalloc buffer of this process,
// exported by CUDA IPC), the whole call timed as the client sees it (request, work, reply) with
// the C++ client library (client/shm_client.h), beside the ceilings measured in the same run:
// pinned device-to-host copy for the host region, device-to-device copy for the device region.
// dequantd's own account of each call (handler time, kernel time and stages, read from its
// /metrics before and after the timed calls) says where the call's time goes.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "bench/e2e/synthetic_model.h"
#include "client/client.h"

namespace dequantd::e2e {

struct RegionRowsOptions {
  std::string dequantd;  // the dequantd binary
  std::string backend;   // its --backend
  std::string work_dir;  // where a generated model and the server's log go
  // "sizes": the checkpoint the caller wrote at `sizes_model_dir` from `sizes_layers` (the
  // single-layer rows use the largest, the model rows all of them); "llama-8b": a generated
  // Llama-3-8B-shaped model (MakeLlamaShapedModel(32, 1, ...), 224 layers, 13.96 GB of fp16) plus
  // one 8192 x 28672 layer (470 MB) for the single-layer rows; its rows: the smallest layer, the
  // 470 MB layer, the whole model, and the smallest layer 224 times in one DequantizeLayers (the
  // call's cost per layer).
  std::string model = "sizes";
  std::string sizes_model_dir;
  const std::vector<SyntheticLayer>* sizes_layers = nullptr;
  int trials = 5;                          // timed calls per row, after one untimed warm-up
  int64_t chunk_bytes = 0;                 // the requests' chunk_bytes (0: the server's default)
  double pinned_d2h_bytes_per_second = 0;  // the host region's ceiling, measured by the caller
  // "llama-8b" only: every dimension of the model's layers divided by this (1 = the real shapes;
  // 16 for a CPU run: 224 layers of 55 MB in all), the single layer's bytes by its square.
  int model_shrink = 1;
  // How the client reaches the server: "unix" (a socket file in work_dir: what a same-host client
  // uses, and the lower latency) or "tcp" (127.0.0.1).
  std::string transport = "unix";
  // The client's ClientOptions::region_busy_poll_us.
  int64_t busy_poll_us = ClientOptions{}.region_busy_poll_us;
};

// Runs the rows and prints their tables to `out`. Every row's result is compared with the CPU
// reference after its last timed call (the region is poisoned before that call). Returns false
// when a result differed or a call failed (named in the table); device rows are skipped, not
// failed, without a GPU.
bool RunRegionRows(const RegionRowsOptions& options, std::ostream& out);

}  // namespace dequantd::e2e
