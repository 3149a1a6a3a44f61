// `dequantctl dequantize-layers --out FILE.safetensors`: the file is laid out from the layer list
// (names, shapes and dtype from ListTensors) before the first result byte arrives, and every
// stream writes the bytes it receives straight to their place in the file (pwrite), so the file
// is done when the last byte arrives: nothing is held in memory and nothing is written at the
// end. Written atomically (formats/atomic_file.h: a temporary file, registered for removal on a
// signal, renamed over FILE on Finish). A FILE that is not a regular file (/dev/null, a FIFO) is
// written in order instead: only one stream may feed it (in_place() false).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/client.h"
#include "client/temp_file_guard.h"
#include "formats/atomic_file.h"

namespace dequantd {

class LayersSafetensorsFile {
 public:
  // One layer of the file: its name and result shape in elements, (rows, columns) as delivered:
  // (K, N), or (N, K) for an ORIENTATION_NK result (K holds the rows, N the columns), of each of
  // `experts` stacked matrices (mxfp4; the tensor is then (experts, K, N)).
  struct Layer {
    std::string name;
    int64_t K = 0;
    int64_t N = 0;
    int64_t experts = 1;
    int64_t elements() const { return experts * K * N; }
  };
  // Creates the (temporary) file holding `layers` in this order, of `dtype` (fp16, bf16 or fp32),
  // and writes its header. Errors: INVALID_ARGUMENT (dtype; safetensors::PlanFile's: a repeated
  // name), the file's I/O codes.
  // `writers`: how many streams will call WriteAt at once; with more than one the file is sized
  // and mapped now (formats/atomic_file.h, MapForWrites), with one it is written with pwrite.
  static absl::StatusOr<std::unique_ptr<LayersSafetensorsFile>> Create(
      const std::string& path, const std::vector<Layer>& layers, v1::DType dtype, int writers = 1);

  // Whether WriteAt may be called from several streams at once, at any offsets (a regular file);
  // false: in layer order, consecutive bytes, one caller.
  bool in_place() const { return !file_->direct(); }

  // The index of the layer a result header announces. DATA_LOSS when the file has no such layer
  // or the header's shape or dtype differs from the layout.
  absl::StatusOr<size_t> Begin(const v1::DequantizeHeader& header) const;
  // Bytes [offset, offset + data.size()) of layer `layer`'s result. Thread-safe for disjoint
  // ranges when in_place(). Errors: OUT_OF_RANGE past the layer's size, DATA_LOSS for an
  // out-of-order write when !in_place(), I/O codes.
  absl::Status WriteAt(size_t layer, int64_t offset, absl::Span<const uint8_t> data);
  // Checks every byte arrived (DATA_LOSS naming the count otherwise) and moves the file into
  // place. Errors: also the commit's I/O codes.
  absl::Status Finish();

 private:
  LayersSafetensorsFile() = default;

  std::string path_;
  std::vector<Layer> layers_;
  v1::DType dtype_ = v1::DTYPE_FP16;
  std::vector<int64_t> offsets_;  // each layer's first byte in the file
  std::vector<int64_t> bytes_;    // each layer's size
  int64_t file_bytes_ = 0;
  TempFileGuard guard_;  // declared before file_: unregistered after the file is removed
  std::optional<formats::AtomicFileWriter> file_;
  std::atomic<int64_t> written_{0};  // data bytes, from every stream
  int64_t next_ = 0;                 // !in_place(): the next file offset expected
};

}  // namespace dequantd
