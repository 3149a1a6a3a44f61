// Writing (streamed) and reading NumPy .npy files, format version 1.0
// (https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html):
//   "\x93NUMPY" | major 1 | minor 0 | u16 LE HEADER_LEN | HEADER_LEN bytes of ASCII | data
// The header is a Python dict literal
//   {'descr': '<f2', 'fortran_order': False, 'shape': (K, N), }
// padded with spaces and ended by '\n' so the data starts at a multiple of 64 bytes. Data is
// C order (row-major), little-endian. dequantd writes fp16 as '<f2', fp32 as '<f4' and bf16 as
// raw '<u2' (NumPy has no bfloat16; the bits are the bf16 bits). No network code here.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "formats/atomic_file.h"

namespace dequantd::npy {

// Bytes per element of a descr this module supports ("<f2", "<f4", "<f8", "<u2", "<i4", "|u1"),
// or 0.
int64_t DescrBytes(const std::string& descr);

// The preamble (magic, version, header length, header dict, padding) for a C-order array.
// Its size is a multiple of 64. Errors: INVALID_ARGUMENT (unknown descr, negative dim).
absl::StatusOr<std::string> EncodePreamble(const std::string& descr,
                                           const std::vector<int64_t>& shape);

// Writes one array to a file as the bytes arrive, without holding them: the preamble first,
// then Append() calls with consecutive row-major bytes, then Finish(). The file appears at
// `path` only on a successful Finish (temporary file in the same directory + rename); a writer
// destroyed before Finish removes its temporary file. Not thread-safe.
class NpyWriter {
 public:
  // Creates the temporary file and writes the preamble. Errors: INVALID_ARGUMENT (descr, shape),
  // an errno-derived code (e.g. NOT_FOUND, PERMISSION_DENIED) when the file cannot be created.
  static absl::StatusOr<std::unique_ptr<NpyWriter>> Create(const std::string& path,
                                                           const std::string& descr,
                                                           const std::vector<int64_t>& shape);
  ~NpyWriter() = default;  // removes the temporary file unless finished
  NpyWriter(const NpyWriter&) = delete;
  NpyWriter& operator=(const NpyWriter&) = delete;

  // Appends the next bytes of the data. Errors: OUT_OF_RANGE (more bytes than the shape holds),
  // FAILED_PRECONDITION (after Finish or an earlier error), errno-derived codes for I/O.
  absl::Status Append(absl::Span<const uint8_t> bytes);
  // Flushes, syncs and renames into place (or, for a path that is not a regular file, just
  // closes it: formats/atomic_file.h, direct mode). Errors: DATA_LOSS (fewer bytes than the shape
  // holds; nothing is written at `path`), FAILED_PRECONDITION (called twice), errno-derived codes.
  absl::Status Finish();

  int64_t bytes_expected() const { return bytes_expected_; }  // data bytes the shape holds
  int64_t bytes_written() const { return bytes_written_; }    // data bytes appended so far

 private:
  NpyWriter() = default;
  void Abandon();  // closes and removes the temporary file

  std::string path_;
  std::optional<formats::AtomicFileWriter> file_;  // empty once finished or abandoned
  int64_t bytes_expected_ = 0;
  int64_t bytes_written_ = 0;
};

// A parsed header. `data_offset` is the byte offset of the data in the file.
struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
  int64_t data_offset = 0;
};

// Parses the preamble of a .npy byte buffer (versions 1.0, 2.0 and 3.0). Errors:
// INVALID_ARGUMENT naming the field ("magic", "version", "descr", "fortran_order", "shape"),
// DATA_LOSS when the buffer is shorter than the preamble or the data the shape needs.
absl::StatusOr<Header> ParseHeader(absl::Span<const uint8_t> file_bytes);

// A whole array in memory (meant for tests and small files).
struct Array {
  Header header;
  std::vector<uint8_t> data;  // element count * DescrBytes(descr) bytes, as stored
};

// Reads and parses a whole .npy file. Errors: as ParseHeader, NOT_FOUND for a missing file.
absl::StatusOr<Array> ReadFile(const std::string& path);

}  // namespace dequantd::npy
