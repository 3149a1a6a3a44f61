// The checkpoint store: a quantized checkpoint directory, validated and read into memory.
//
// config.json must hold a quantization_config object whose quant_method names a format of the
// registry (kernels/format_registry.h; any case); that format's row checks the rest (AWQ: the
// transformers AwqConfig layout, AutoAWQ's w_bit / q_group_size accepted; bits 4, zero_point
// true (missing = true), version "gemm" (any case; missing = "gemm"), group_size -1 or > 0
// (missing = 128, the transformers default); kernels/awq.h). One format per checkpoint.
// Shards: the files named by model.safetensors.index.json's "weight_map" (tensor -> file; each
// listed tensor must be in its file) if that exists, else model.safetensors, else every
// *.safetensors file in the directory. A tensor name may appear in one shard only.
// A quantized layer is a prefix P with a tensor P.<anchor role> (AWQ: P.qweight); its other
// roles' tensors P.<role> may be in any shard. A tensor named P.<role> for any role of the format
// belongs to layer P, which must then have every required role (one rule for every format, driven
// by its row: roles, anchor_role, optional_roles, role_separator; only roles that unquantized
// tensors are also called, FormatRow::plain_name_roles, the FP8 formats' `.weight`, are exempt):
// a layer lacking one, its anchor included (MXFP4's P_scales without P_blocks, AWQ's P.qzeros
// without P.qweight), is FAILED_PRECONDITION naming the file, a tensor present and the role
// missing. (AWQ:
//   P.qweight: (K, N/8) I32;  P.qzeros: (K/G, N/8) I32;  P.scales: (K/G, N) F16 or BF16).
// Those dtypes and shapes are checked by formats::QuantShapeFromTensors (formats/quant_tensors.h,
// shared with dequantctl) through the format's row. AWQ's G is derived per layer from the shapes,
// G = K / scales rows, and must divide K; it is NOT required to equal the config's group_size. Real
// AutoAWQ checkpoints use one group size, but our bundled model (tools/make_default_model.py) uses
// 128 where K % 128 == 0 and 64 elsewhere, as its config.json notes. Each layer then passes
// ValidateShape (kernels/dequant.h). Every other tensor (embeddings, norms, biases, lm_head; any
// dtype) is indexed as a RawTensor (server/model/raw_tensor.h): name, dtype, shape and byte range
// only, its bytes read on demand. Memory (issue 22): Open indexes the layers (each stored tensor's
// shard and byte range, `QuantizedLayer::stored`) and, unless told not to, reads them into host
// copies the Checkpoint owns (one 64-byte-aligned buffer per layer), with several threads
// (server/model/shard_reader.h). A server whose backend holds layers on its GPUs opens without
// copies, uploads those layers straight from the files through bounded pinned staging, and reads
// host copies only of the layers no device holds (ReadHostCopies); so the packed model is never
// held twice. Once a layer's copy is read, truncating, rewriting or deleting the files cannot
// affect it (a memory map would SIGBUS on a truncated file). The shard headers are parsed through a
// memory map that reads only the header pages; a file truncated, extended or replaced while it is
// read is DATA_LOSS or ABORTED naming the file and tensor, not a crash.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/safetensors.h"
#include "kernels/dequant.h"
#include "kernels/format_registry.h"  // QuantizationConfig
#include "server/model/raw_tensor.h"
#include "server/model/shard_reader.h"

namespace dequantd {

// Where a stored tensor's bytes are in the checkpoint's files.
struct StoredRange {
  int shard = -1;      // index into Checkpoint::shards(); -1: not from a checkpoint
  int64_t offset = 0;  // from the start of the file, bytes
  int64_t bytes = 0;
};

struct QuantizedLayer {
  std::string name;  // prefix, e.g. "model.layers.0.mlp.down_proj"
  // Host pointers into the Checkpoint's own copies (64-byte aligned), or null for every role
  // when the layer has no host copy (opened without copies, or released).
  QuantView view;
  std::array<StoredRange, kMaxTensorRoles> stored{};  // per role, in role order
  std::string file;                                   // the safetensors file holding qweight
  // Its position in the owning Checkpoint's layers() (-1: not from a checkpoint). Backends use
  // it to find what they hold for the layer without hashing its name, after checking the name.
  int64_t index = -1;
};

// How Checkpoint::Open reads the layers.
struct CheckpointLoad {
  bool host_copies = true;  // read every layer into a host copy; false: index only
  int threads = 0;          // reader threads for host copies; 0 = DefaultLoadThreads()
};

// min(16, hardware threads): on the 16-core H100 host 16 readers upload the 70B-shaped model at
// 41 GB/s against 24 for 8 (docs/performance.md, 2026-12-06 H100 run).
int DefaultLoadThreads();

class Checkpoint {
 public:
  // Opens and validates `dir`. Policy for a corrupt file (bad safetensors header, offsets past
  // the end, a layer whose tensors disagree on shape or dtype): the checkpoint is refused and
  // the server does not start; the error names the file, tensor and field.
  // Errors: NOT_FOUND (dir, config.json or a shard missing, no *.safetensors), INVALID_ARGUMENT
  // (dir not a directory; a quantization_config its format refuses, wrong dtype or shape, G not
  // dividing K, no quantized layer at all, a corrupt header), FAILED_PRECONDITION (a layer lacking
  // a required role: "<file>: tensor '<P>.scales' (layer '<P>', format awq_gemm): the layer has
  // no qweight tensor: '<P>.qweight' is missing"), DATA_LOSS
  // (truncated file, also while being read), ABORTED (a shard replaced while being opened),
  // RESOURCE_EXHAUSTED (no memory for a layer's copy).
  // Thread-safety: the returned object is immutable and safe to read from any thread.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir,
                                                          const CheckpointLoad& load = {});
  ~Checkpoint();

  const std::string& dir() const { return dir_; }
  const QuantizationConfig& config() const { return config_; }
  // Layers sorted by name. Views stay valid for the Checkpoint's lifetime, or until
  // ReleaseHostCopies.
  const std::vector<QuantizedLayer>& layers() const { return layers_; }
  // nullptr if there is no such layer.
  const QuantizedLayer* Find(std::string_view name) const;

  // Frees the host copies of every layer and sets their view pointers to null (shapes, names and
  // files stay): for a server whose backend holds every layer resident on its devices (the CUDA
  // backend after Prepare), so that host memory does not keep a second copy of the packed model.
  // Afterwards a view's data must not be used (kernels refuse null pointers: INVALID_ARGUMENT).
  // Call before the Checkpoint is shared with other threads. Returns the bytes freed (0 when
  // already released).
  // `which` selects layers by position (all when empty).
  int64_t ReleaseHostCopies(const std::vector<bool>& which = {});

  // Reads the host copy of every layer that `which` selects (all when empty) and has none, with
  // `threads` threads (0 = DefaultLoadThreads()), setting its view's pointers. For the layers no
  // device holds; call before the Checkpoint is shared with other threads. Returns the bytes
  // read (the stored tensors' sizes). Errors: ShardReader's (ABORTED, DATA_LOSS naming file and
  // tensor), RESOURCE_EXHAUSTED (no memory for a copy), CANCELLED (`cancel`).
  absl::StatusOr<int64_t> ReadHostCopies(const std::vector<bool>& which = {}, int threads = 0,
                                         const std::atomic<bool>* cancel = nullptr);
  // True when layer `i` (a position in layers()) has its host copy.
  bool has_host_copy(size_t i) const { return i < copies_.size() && copies_[i] != nullptr; }

  // The shard files, as Open found them (path, identity, size): what QuantizedLayer::stored
  // indexes. Read them through ShardReader, which checks they are still those files.
  const std::vector<ShardFile>& shards() const { return shards_; }
  // "<layer>.<role>" (mxfp4: "<layer>_<role>", FormatRow::role_separator): a stored tensor's
  // name, for errors.
  std::string StoredTensorName(int64_t layer, int role) const;

  // Issue 10. The tensors that are not qweight/qzeros/scales of a layer, sorted by name (an
  // index; see server/model/raw_tensor.h). Not affected by ReleaseHostCopies.
  const std::vector<RawTensor>& raw_tensors() const { return raw_tensors_; }
  // nullptr if there is no such tensor.
  const RawTensor* FindRawTensor(std::string_view name) const;
  // config.json as read at Open (UTF-8 JSON text).
  const std::string& config_json() const { return config_json_; }

 private:
  Checkpoint() = default;
  std::string dir_;
  QuantizationConfig config_;
  struct AlignedFree {  // frees a 64-byte-aligned operator new[] block
    void operator()(uint8_t* p) const;
  };
  std::vector<std::unique_ptr<uint8_t[], AlignedFree>> copies_;  // by layer position; null: none
  std::vector<ShardFile> shards_;
  std::vector<QuantizedLayer> layers_;
  std::vector<RawTensor> raw_tensors_;
  std::string config_json_;
};

// Where a layer sits in a checkpoint's layers(), for code that keeps something per position (a
// backend's placement, a GPU's resident copies): by the layer's own `index` when the name at that
// position matches (a string compare, no hash), else by name, so a layer object that is not the
// checkpoint's own (a copy, a test's) is still found. Written by Assign, read-only after.
class LayerPositions {
 public:
  void Assign(const std::vector<QuantizedLayer>& layers);
  std::optional<int64_t> Find(const QuantizedLayer& layer) const;
  int64_t size() const { return static_cast<int64_t>(names_.size()); }

 private:
  std::vector<std::string> names_;                    // by position
  std::unordered_map<std::string, int64_t> by_name_;  // name -> position
};

}  // namespace dequantd
