// dequantctl's subcommands, one file each (cmd_*.cc). Each takes its options as a struct (main.cc
// fills them from flags), talks to the server through DequantClient and prints to `out`.
// Building a request from options (Make*Request) does no RPC: its INVALID_ARGUMENT is a usage
// error. Run* returns the server's status or a local I/O status.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "client/progress.h"

namespace dequantd {

// `list`: a table of the loaded model's quantized layers (name, format, E when some layer stacks
// more than one expert, K, N, group_size, scale dtype, packed MiB, resident).
absl::Status RunList(DequantClient& client, std::ostream& out);

// `info`: version, backend, model, its layers' formats (ListTensors), and devices.
absl::Status RunInfo(DequantClient& client, std::ostream& out);

// A layer's format as ListTensors reports it; empty (a server before issue 21, which served AWQ
// only) reads as "awq_gemm".
std::string LayerFormatName(const v1::QuantizedTensorInfo& layer);
// The layers' formats in the order first listed, with their layer counts and, where > 1, their
// stacked experts: "awq_gemm (30 layers)", "mxfp4 (48 layers, 32 experts each)"; layers of one
// format with different expert counts are listed once per count. "none (no quantized layers)"
// for an empty list (no model loaded).
std::string LayerFormatSummary(const v1::ListTensorsResponse& list);

// `regions`: the server's shared-memory regions (SharedMemoryStatus) as a table (name, kind,
// key, device, offset, bytes, pinned, calls in flight, idle seconds, owner), then one line with
// their count and bytes against the server's limits, its --shared-memory mode and idle release.
// Errors: the server's (PERMISSION_DENIED for a peer on another host or a token without the
// admin role).
absl::Status RunRegions(DequantClient& client, std::ostream& out);

// `dequantize`.
struct DequantizeOptions {
  std::string tensor;  // --tensor: a layer of the loaded model
  std::string packed;  // --packed: a safetensors file with inline input
  std::string prefix;  // --prefix: tensor name prefix in --packed, e.g. "layer."
  // --format: a FormatName ("gptq") for --packed when no config is found; empty = the config's,
  // else awq_gemm (FindPackedDeclaration, client/packed_input.h).
  std::string format;
  // --config: the checkpoint's config.json for --packed; empty = <packed>.config.json or
  // config.json beside it, when there.
  std::string config;
  int64_t group_size = 0;      // --group-size: for --packed; 0 = derived from the shapes
  std::string out;             // --out: .npy, .safetensors or raw; empty = not written
  std::string dtype = "fp16";  // --dtype: fp16, bf16 or fp32
  // --orientation: kn ((K, N)), nk ((N, K) = nn.Linear.weight) or empty (the format's own:
  // awq_gemm kn; gptq and compressed_tensors nk), produced by the server's kernel.
  std::string orientation;
  int64_t chunk_bytes = 0;  // --chunk-bytes: 0 = server default
  std::string compare;      // --compare: REF.safetensors[:TENSOR]; empty = no comparison
  std::string compare_layout = "auto";  // --compare-layout: auto, kn or nk
  int streams =
      0;  // --streams: parallel range streams, 0..kMaxStreams; 0 = by size (ranged_fetch.h)
  std::string shm;  // --shm: a region name ([A-Za-z0-9._-]): the result comes through a host
                    // shared-memory region (client/shm_client.h) instead of the stream
  // Where the progress line of a result of kProgressMinBytes or more goes (client/progress.h);
  // default: none. dequantctl: stderr when it is a terminal.
  ProgressOutput progress;
};

// Makes a client on its own connection number `connection` (>= 1) to the same server, for the
// parallel streams of --streams. Null: one stream only, on the client given.
using ClientFactory = std::function<absl::StatusOr<std::unique_ptr<DequantClient>>(int connection)>;
// Usage checks: exactly one of tensor / packed, prefix, format and config only with packed,
// dtype, layout.
absl::Status CheckDequantizeOptions(const DequantizeOptions& options);
// Dequantizes, streams the result into the output file (and the comparison), then prints one
// summary line (tensor, shape, dtype, bytes, wall time, MB/s) and, with --compare, one error line.
// A .safetensors --out holds one tensor named `tensor`, or `prefix` without its format's trailing
// separator ('.'; mxfp4 '_'; "weight" when the prefix is empty). --packed is read as
// FindPackedDeclaration and LoadInlinePacked say (client/packed_input.h), whose errors it returns.
// --compare's reference is opened before the call; with
// --packed, (K, N) is known, so a reference that does not fit it (Begin's INVALID_ARGUMENT,
// compare.h) is refused before the call too; with --tensor, when the header arrives.
// Without --compare and with --out a .npy or raw file (regular, or not there yet) or no --out,
// the result is fetched in byte ranges (ranged_fetch.h): --streams ranges at once on their own
// connections (made by `more`), written in place, each resumed from its last byte after a broken
// stream; otherwise (or when the size cannot be learnt first) in one stream, in order.
absl::Status RunDequantize(DequantClient& client, const DequantizeOptions& options,
                           std::ostream& out, const ClientFactory& more = nullptr);

// `dequantize-layers`.
struct DequantizeLayersOptions {
  std::string tensors;         // --tensors: comma-separated distinct layers; empty = every layer
  std::string dtype = "fp16";  // --dtype: fp16, bf16 or fp32
  std::string orientation;     // --orientation: as DequantizeOptions::orientation
  int64_t chunk_bytes = 0;     // --chunk-bytes: 0 = server default
  std::string out_dir;         // --out-dir: one DIR/<layer>.npy per layer (see below)
  std::string out;             // --out: one FILE.safetensors holding every layer (once each)
  int streams = 1;             // --streams: parallel DequantizeLayers calls, each a subset of the
                               // layers, 1..kMaxStreams
  // Where the progress line goes (client/progress.h), for every call; default: none. With a
  // terminal and no --tensors, the layers are listed first (ListTensors) to know the total.
  ProgressOutput progress;
};
// Usage checks: at most one of out / out_dir, out ends in .safetensors, dtype, chunk_bytes >= 0,
// no empty or repeated name in tensors.
absl::Status CheckDequantizeLayersOptions(const DequantizeLayersOptions& options);
// Dequantizes the layers in one DequantizeLayers call, writes the files (--out-dir DIR is created,
// with its parents, when the first layer arrives: a call that fails first leaves none), then
// prints one summary line (layers, dtype, bytes, wall time, GB/s, backend and kernel).
// With streams > 1 the layers (every layer: from ListTensors) are split over that many calls on
// their own connections (made by `more`; null: one call), balanced by bytes, all at once.
// --out FILE.safetensors is laid out first (names and shapes from ListTensors) and written in
// place by every stream as bytes arrive (client/layers_file.h); a FILE that is not a regular file
// is written in order over one stream.
absl::Status RunDequantizeLayers(DequantClient& client, const DequantizeLayersOptions& options,
                                 std::ostream& out, const ClientFactory& more = nullptr);

// `benchmark`.
struct BenchmarkOptions {
  std::string shapes;              // --shapes: "KxN,KxN,..." (random packed inputs)
  std::string tensors;             // --tensors: comma-separated layers of the loaded model
  int64_t group_size = 0;          // --group-size: for shapes; 0 = server default (128)
  std::string dtype;               // --dtype: comma-separated output dtypes; empty = server default
  std::string variants;            // --variants: comma-separated; empty = all
  int trials = 0;                  // --trials: 0 = server default
  int runs = 0;                    // --runs: 0 = server default
  bool hardware_counters = false;  // --hardware-counters
};
// Builds the request. INVALID_ARGUMENT for a malformed shape ("KxN" with positive integers) or
// dtype, or negative trials/runs/group_size.
absl::StatusOr<v1::BenchmarkRequest> MakeBenchmarkRequest(const BenchmarkOptions& options);
// Prints the BenchmarkResponse as a table (times in microseconds, rates in GB/s).
absl::Status RunBenchmark(DequantClient& client, const v1::BenchmarkRequest& request,
                          std::ostream& out);

}  // namespace dequantd
