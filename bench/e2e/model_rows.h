// The whole-model rows of the end-to-end benchmark (issue 8): DequantizeLayers of every layer of
// a synthetic Llama-3-8B- or 70B-shaped model (synthetic_model.h) from a running dequantd,
//   memory       over S streams (FetchLayerSubsets, client/ranged_fetch.h: a subset of the
//                layers per stream, each on its own connection) into one buffer of the whole
//                model in the client's memory;
//   file system  the ceiling of the file the next row writes: the same bytes written to a new
//                file in the same directory, by 1 thread (write) and by S threads (pwrite of
//                disjoint parts), fsync included (as the atomic writer does);
//   dequantctl   `dequantctl dequantize-layers --streams S --out DIR/model.safetensors`'s own
//                code (RunDequantizeLayers), in this process, the file checked tensor by tensor;
// each with the per-thread CPU profile of dequantd and of this process over the timed fetches.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "bench/e2e/synthetic_model.h"

namespace dequantd::e2e {

struct ModelRow {
  std::string what;         // "DequantizeLayers -> memory", "file system: ...", "dequantctl ..."
  std::string transport;    // "tcp", "unix", "" (the file system)
  int streams = 1;          // streams (or writer threads)
  int64_t bytes = 0;        // per repetition
  double p50 = 0;           // seconds per repetition
  double gbps = 0;          // GB/s: bytes / p50
  double ceiling_gbps = 0;  // the matching ceiling (0: none)
  bool correct = true;
  std::string error;
  std::string profile;  // FormatProfile's table (empty for file-system rows)
};

struct ModelRowsOptions {
  std::string target;        // dequantd serving the model ("127.0.0.1:P" or "unix:PATH")
  std::string transport;     // its name in the rows
  pid_t server_pid = -1;     // for the profile
  std::vector<int> streams;  // S of each memory and dequantctl row
  int trials = 1;            // timed repetitions per row (after one untimed warm-up)
  std::string out_dir;       // where the file rows write (e.g. /dev/shm), removed after
  bool file_rows = true;     // also the file-system and dequantctl rows
  // Models larger than host memory (70B-shaped: 137 GB of fp16): the memory rows receive into one
  // buffer of the largest layer per stream, reused, each layer compared with its reference as it
  // completes in the untimed warm-up; no file rows.
  bool reused_buffer = false;
  // The raw gRPC ceiling (GB/s) of `streams` streams on this transport, 0 if not measured.
  std::function<double(int streams)> stream_ceiling;
};

// `reference[d]` is model.distinct[d]'s fp16 result. Rows in the order above.
std::vector<ModelRow> MeasureModel(const SyntheticModel& model,
                                   const std::vector<std::vector<uint8_t>>& reference,
                                   const ModelRowsOptions& options);

// Markdown: the rows' table, then each row's profile under its name.
std::string FormatModelRows(const std::vector<ModelRow>& rows);

}  // namespace dequantd::e2e
