// Reading and writing the safetensors format (https://github.com/huggingface/safetensors):
//   8 bytes little-endian u64 N | N bytes JSON header | data
// The header maps tensor name -> {"dtype": "F16"|"BF16"|"F32"|"I32"|..., "shape": [..],
// "data_offsets": [begin, end]} (offsets relative to the start of data), plus an optional
// "__metadata__" string map. No I/O policy lives here beyond plain files and memory maps.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dequantd::safetensors {

struct TensorEntry {
  std::string name;
  std::string dtype;           // as written: "F16", "BF16", "F32", "I32", "I8", ...
  std::vector<int64_t> shape;  // in elements
  int64_t data_begin = 0;      // byte offset from the start of the data section
  int64_t data_end = 0;        // one past the last byte
};

// Largest header accepted (the limit the reference implementation uses: 100,000,000 bytes).
inline constexpr int64_t kMaxHeaderBytes = 100'000'000;

// A parsed header. Validation: the JSON parses, every entry has a known dtype, a shape of
// non-negative dims, data_offsets with begin <= end inside the data section, end - begin equal to
// the element count times the dtype size, no two non-empty tensors sharing a byte, and no key
// twice in one JSON object (nlohmann::json would keep the last silently).
// Errors, naming the tensor and field:
//   DATA_LOSS: file under 8 bytes; header length past the end of the file; data_offsets past the
//     end of the data section (a truncated file).
//   INVALID_ARGUMENT: header length over kMaxHeaderBytes; JSON that does not parse or is not an
//     object; a key twice in one object; unknown dtype; negative or non-integer dims; bad
//     data_offsets; size mismatch; overlapping data_offsets (naming both tensors); a non-string
//     __metadata__ value.
struct Header {
  int64_t data_start = 0;  // byte offset of the data section in the file (8 + N)
  std::map<std::string, TensorEntry> tensors;
  std::map<std::string, std::string> metadata;
};

// Parses the header of a whole safetensors file held in `file_bytes`.
absl::StatusOr<Header> ParseHeader(absl::Span<const uint8_t> file_bytes);

// Bytes per element of a safetensors dtype string, or 0 if unknown. Known: BOOL U8 I8 F8_E5M2
// F8_E4M3 (1), I16 U16 F16 BF16 (2), I32 U32 F32 (4), I64 U64 F64 (8).
int64_t DTypeBytes(const std::string& dtype);

// A read-only memory-mapped safetensors file (mmap PROT_READ, MAP_PRIVATE; unmapped by the
// destructor). Thread-safe for reads. Tensor bytes are only as aligned as their offsets in the
// file (the data section starts at 8 + N; writers pad N to a multiple of 8).
class MappedFile {
 public:
  // Errors: NOT_FOUND (no such file), PERMISSION_DENIED, INVALID_ARGUMENT / DATA_LOSS (corrupt,
  // as ParseHeader, with the path prefixed to the message).
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const Header& header() const { return header_; }
  // The bytes of one tensor (a view into the map), or NOT_FOUND.
  absl::StatusOr<absl::Span<const uint8_t>> TensorBytes(const std::string& name) const;

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  Header header_;
};

// One tensor to write.
struct TensorToWrite {
  std::string name;
  std::string dtype;  // safetensors dtype string
  std::vector<int64_t> shape;
  absl::Span<const uint8_t> bytes;  // element count * dtype size bytes
};

// One tensor of a file to be laid out (its bytes come later, e.g. written in place).
struct TensorSpec {
  std::string name;
  std::string dtype;  // safetensors dtype string
  std::vector<int64_t> shape;
};

// Where everything goes in a safetensors file, in the layout WriteFile writes: the tensors one
// after another in the given order after the header.
struct FileLayout {
  std::string header;                 // the file's first bytes: 8-byte length + JSON (padded)
  std::vector<int64_t> data_offsets;  // each tensor's first byte, offset in the FILE (bytes)
  std::vector<int64_t> tensor_bytes;  // each tensor's size in bytes
  int64_t file_bytes = 0;             // the whole file's size
};

// Lays out `tensors` (and `metadata`). Errors: INVALID_ARGUMENT (unknown dtype, negative dim,
// repeated or reserved name).
absl::StatusOr<FileLayout> PlanFile(const std::vector<TensorSpec>& tensors,
                                    const std::map<std::string, std::string>& metadata = {});

// Writes a safetensors file (header padded with spaces to a multiple of 8 bytes, tensors laid
// out in the given order), atomically (temporary file in the same directory, fsync, rename).
// Errors: INVALID_ARGUMENT (unknown dtype, negative dim, byte count not matching shape and dtype,
// repeated or reserved name); for I/O the errno's code (e.g. NOT_FOUND for a missing directory).
absl::Status WriteFile(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace dequantd::safetensors
