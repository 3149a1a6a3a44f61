// Where dequantctl writes a Dequantize result, chosen by the file name:
//   *.npy          NumPy v1.0 (formats/npy.h), streamed: fp16 '<f2', fp32 '<f4', bf16 raw '<u2'
//   *.safetensors  one tensor (formats/safetensors.h), dtype F16 / BF16 / F32; held in memory
//   anything else  the raw row-major (K, N) little-endian bytes, streamed
// Every kind appears at its path only on a successful Finish (temporary file + rename; a symlink
// is kept and the file it points to replaced). A path that exists and is not a regular file
// (/dev/null, a FIFO, /dev/stdout) is written in place instead, so a failed stream may leave part
// of the bytes there (formats/atomic_file.h, direct mode). With
// InstallTempFileSignalHandlers (temp_file_guard.h), SIGINT, SIGTERM, SIGHUP and SIGPIPE remove
// the temporary file of a streamed kind, and are held back while a .safetensors file is written
// by Finish.
// Not thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dequant/v1/dequant.pb.h"

namespace dequantd {

class OutputFile {
 public:
  // `tensor_name` names the tensor in a .safetensors file. `writers`: how many threads will call
  // WriteAt at once; with more than one, a .npy or raw file is sized and mapped at Begin
  // (formats/atomic_file.h, MapForWrites: parallel pwrite into one file runs one writer at a
  // time), with one it is written with write()/pwrite (faster for a single writer: no page
  // faults). Does not touch the disk yet.
  static std::unique_ptr<OutputFile> ForPath(const std::string& path,
                                             const std::string& tensor_name, int writers = 1);
  virtual ~OutputFile() = default;

  // Called once with the stream's header (shape [K, N], dtype, total_bytes). Creates the
  // temporary file. Errors: INVALID_ARGUMENT (dtype not fp16/bf16/fp32), errno-derived I/O codes.
  virtual absl::Status Begin(const ::dequant::v1::DequantizeHeader& header) = 0;
  // Consecutive bytes of the result. Errors: I/O codes, OUT_OF_RANGE past total_bytes.
  virtual absl::Status Write(absl::Span<const uint8_t> data) = 0;
  // Bytes [offset, offset + data.size()) of the result, written in place (pwrite; a .npy file's
  // preamble is accounted for). Thread-safe for disjoint ranges, when CanWriteAt(path) held (not
  // mixed with Write). Errors: FAILED_PRECONDITION (this kind or file cannot: .safetensors, a
  // device or FIFO), OUT_OF_RANGE past total_bytes, I/O codes.
  virtual absl::Status WriteAt(int64_t offset, absl::Span<const uint8_t> data) = 0;
  // Whether WriteAt will work for `path`: a .npy or raw output that is a regular file (symlinks
  // followed, but not through /proc: /dev/stdout is written in order) or does not exist yet.
  static bool CanWriteAt(const std::string& path);
  // Completes the file and moves it into place. Errors: DATA_LOSS if bytes are missing, I/O.
  virtual absl::Status Finish() = 0;
  // "npy", "safetensors" or "raw".
  virtual const char* kind() const = 0;
};

// The .npy descr for an output dtype: fp16 "<f2", bf16 "<u2", fp32 "<f4". INVALID_ARGUMENT else.
absl::StatusOr<std::string> NpyDescrFor(::dequant::v1::DType dtype);
// The safetensors dtype for an output dtype: "F16", "BF16", "F32". INVALID_ARGUMENT else.
absl::StatusOr<std::string> SafetensorsDTypeFor(::dequant::v1::DType dtype);

}  // namespace dequantd
