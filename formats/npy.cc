// NumPy .npy v1.0 streamed writer and a minimal reader (see npy.h).
#include "formats/npy.h"

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "formats/atomic_file.h"

namespace dequantd::npy {
namespace {

using formats::AtomicFileWriter;
using formats::ErrnoError;

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;
constexpr int64_t kAlignment = 64;  // data starts at a multiple of this (NumPy's ARRAY_ALIGN)
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// Element count times element size, or INVALID_ARGUMENT on a negative dim or overflow.
absl::StatusOr<int64_t> DataBytes(const std::vector<int64_t>& shape, int64_t element_bytes) {
  int64_t bytes = element_bytes;
  for (const int64_t d : shape) {
    if (d < 0)
      return absl::InvalidArgumentError(absl::StrCat("npy field 'shape': dim ", d, " < 0"));
    if (d != 0 && bytes > kInt64Max / d) {
      return absl::InvalidArgumentError("npy field 'shape': byte count overflows int64");
    }
    bytes *= d;
  }
  return bytes;
}

// Python's repr of a tuple of ints: "()", "(5,)", "(3, 4)".
std::string ShapeRepr(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

// A tiny parser for the header dict: string keys; values are strings, True/False or tuples of
// non-negative ints. That is all NumPy writes.
class DictParser {
 public:
  explicit DictParser(std::string_view text) : text_(text) {}

  absl::Status Parse(Header* out) {
    bool have_descr = false, have_order = false, have_shape = false;
    SkipSpace();
    if (!Consume('{')) return Error("header", "expected '{'");
    for (;;) {
      SkipSpace();
      if (Consume('}')) break;
      std::string key;
      if (!ParseString(&key)) return Error("header", "expected a quoted key");
      SkipSpace();
      if (!Consume(':')) return Error(key, "expected ':'");
      SkipSpace();
      if (key == "descr") {
        if (!ParseString(&out->descr)) return Error(key, "expected a string");
        have_descr = true;
      } else if (key == "fortran_order") {
        if (!ParseBool(&out->fortran_order)) return Error(key, "expected True or False");
        have_order = true;
      } else if (key == "shape") {
        if (!ParseTuple(&out->shape)) return Error(key, "expected a tuple of integers");
        have_shape = true;
      } else {
        return Error(key, "unknown key");
      }
      SkipSpace();
      if (Consume('}')) break;
      if (!Consume(',')) return Error("header", "expected ',' or '}'");
    }
    if (!have_descr) return Error("descr", "missing");
    if (!have_order) return Error("fortran_order", "missing");
    if (!have_shape) return Error("shape", "missing");
    return absl::OkStatus();
  }

 private:
  static absl::Status Error(absl::string_view field, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("npy field '", field, "': ", what));
  }
  void SkipSpace() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool Consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool ConsumeWord(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  bool ParseString(std::string* out) {
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) return false;
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) return false;
    *out = std::string(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return true;
  }
  bool ParseBool(bool* out) {
    if (ConsumeWord("True")) {
      *out = true;
    } else if (ConsumeWord("False")) {
      *out = false;
    } else {
      return false;
    }
    return true;
  }
  bool ParseInt(int64_t* out) {
    const size_t begin = pos_;
    int64_t v = 0;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      const int digit = text_[pos_++] - '0';
      if (v > (kInt64Max - digit) / 10) return false;
      v = v * 10 + digit;
    }
    if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2 long suffix
    *out = v;
    return pos_ > begin;
  }
  bool ParseTuple(std::vector<int64_t>* out) {
    out->clear();
    if (!Consume('(')) return false;
    for (;;) {
      SkipSpace();
      if (Consume(')')) return true;
      int64_t v;
      if (!ParseInt(&v)) return false;
      out->push_back(v);
      SkipSpace();
      if (Consume(')')) return true;
      if (!Consume(',')) return false;
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

int64_t DescrBytes(const std::string& descr) {
  if (descr == "<f2" || descr == "<u2") return 2;
  if (descr == "<f4" || descr == "<i4") return 4;
  if (descr == "<f8") return 8;
  if (descr == "|u1") return 1;
  return 0;
}

absl::StatusOr<std::string> EncodePreamble(const std::string& descr,
                                           const std::vector<int64_t>& shape) {
  const int64_t element_bytes = DescrBytes(descr);
  if (element_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("npy field 'descr': unsupported '", descr, "'"));
  }
  absl::StatusOr<int64_t> data_bytes = DataBytes(shape, element_bytes);
  if (!data_bytes.ok()) return data_bytes.status();
  std::string dict = absl::StrCat("{'descr': '", descr,
                                  "', 'fortran_order': False, 'shape': ", ShapeRepr(shape), ", }");
  // magic (6) + version (2) + HEADER_LEN (2) + dict + spaces + '\n' == multiple of 64.
  const size_t fixed = kMagicBytes + 2 + 2;
  const size_t unpadded = fixed + dict.size() + 1;
  dict.append((kAlignment - unpadded % kAlignment) % kAlignment, ' ');
  dict.push_back('\n');
  if (dict.size() > 0xFFFF) return absl::InvalidArgumentError("npy field 'shape': header too long");
  std::string out(kMagic, kMagicBytes);
  out.push_back(1);  // major
  out.push_back(0);  // minor
  out.push_back(static_cast<char>(dict.size() & 0xFF));
  out.push_back(static_cast<char>(dict.size() >> 8));
  out += dict;
  return out;
}

absl::StatusOr<std::unique_ptr<NpyWriter>> NpyWriter::Create(const std::string& path,
                                                             const std::string& descr,
                                                             const std::vector<int64_t>& shape) {
  absl::StatusOr<std::string> preamble = EncodePreamble(descr, shape);
  if (!preamble.ok()) return preamble.status();
  std::unique_ptr<NpyWriter> w(new NpyWriter());
  w->path_ = path;
  w->bytes_expected_ = *DataBytes(shape, DescrBytes(descr));  // checked by EncodePreamble
  absl::StatusOr<AtomicFileWriter> file = AtomicFileWriter::Create(path);
  if (!file.ok()) return file.status();
  w->file_.emplace(*std::move(file));
  absl::Status status = w->file_->Write(*preamble);
  if (!status.ok()) return status;  // the destructor removes the temporary file
  return w;
}

void NpyWriter::Abandon() { file_.reset(); }

absl::Status NpyWriter::Append(absl::Span<const uint8_t> bytes) {
  if (!file_) return absl::FailedPreconditionError("NpyWriter: already finished");
  if (static_cast<int64_t>(bytes.size()) > bytes_expected_ - bytes_written_) {
    const int64_t total = bytes_written_ + static_cast<int64_t>(bytes.size());
    Abandon();
    return absl::OutOfRangeError(absl::StrCat("npy data for '", path_, "': ", total,
                                              " bytes appended, shape holds ", bytes_expected_));
  }
  absl::Status status = file_->Write(bytes);
  if (!status.ok()) {
    Abandon();
    return status;
  }
  bytes_written_ += static_cast<int64_t>(bytes.size());
  return absl::OkStatus();
}

absl::Status NpyWriter::Finish() {
  if (!file_) return absl::FailedPreconditionError("NpyWriter: already finished");
  if (bytes_written_ != bytes_expected_) {
    Abandon();
    return absl::DataLossError(absl::StrCat("npy data for '", path_, "': ", bytes_written_,
                                            " bytes appended, shape holds ", bytes_expected_));
  }
  absl::Status status = file_->Commit();
  file_.reset();
  return status;
}

absl::StatusOr<Header> ParseHeader(absl::Span<const uint8_t> file_bytes) {
  constexpr size_t kFixed = kMagicBytes + 2;
  if (file_bytes.size() < kFixed + 2) return absl::DataLossError("npy: file shorter than preamble");
  if (std::memcmp(file_bytes.data(), kMagic, kMagicBytes) != 0) {
    return absl::InvalidArgumentError("npy field 'magic': not a .npy file");
  }
  const int major = file_bytes[kMagicBytes];
  size_t len_bytes = 0;
  if (major == 1) {
    len_bytes = 2;
  } else if (major == 2 || major == 3) {
    len_bytes = 4;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("npy field 'version': ", major, " unsupported"));
  }
  if (file_bytes.size() < kFixed + len_bytes) {
    return absl::DataLossError("npy: file shorter than preamble");
  }
  uint64_t header_len = 0;
  for (size_t i = 0; i < len_bytes; ++i) {
    header_len |= static_cast<uint64_t>(file_bytes[kFixed + i]) << (8 * i);
  }
  const uint64_t data_offset = kFixed + len_bytes + header_len;
  if (file_bytes.size() < data_offset) return absl::DataLossError("npy: header past end of file");
  const std::string_view dict(reinterpret_cast<const char*>(file_bytes.data()) + kFixed + len_bytes,
                              header_len);
  Header header;
  absl::Status status = DictParser(dict).Parse(&header);
  if (!status.ok()) return status;
  const int64_t element_bytes = DescrBytes(header.descr);
  if (element_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("npy field 'descr': unsupported '", header.descr, "'"));
  }
  absl::StatusOr<int64_t> data_bytes = DataBytes(header.shape, element_bytes);
  if (!data_bytes.ok()) return data_bytes.status();
  const uint64_t have = file_bytes.size() - data_offset;
  if (have < static_cast<uint64_t>(*data_bytes)) {
    return absl::DataLossError(
        absl::StrCat("npy: data holds ", have, " bytes, shape needs ", *data_bytes));
  }
  if (have > static_cast<uint64_t>(*data_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("npy field 'shape': data holds ", have, " bytes, shape needs ", *data_bytes));
  }
  header.data_offset = static_cast<int64_t>(data_offset);
  return header;
}

absl::StatusOr<Array> ReadFile(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return ErrnoError(errno, "open", path);
  std::vector<uint8_t> bytes;
  uint8_t buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) bytes.insert(bytes.end(), buf, buf + n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return absl::DataLossError(absl::StrCat("read '", path, "' failed"));
  absl::StatusOr<Header> header = ParseHeader(bytes);
  if (!header.ok()) {
    return absl::Status(header.status().code(),
                        absl::StrCat(path, ": ", header.status().message()));
  }
  Array array;
  array.header = *std::move(header);
  array.data.assign(bytes.begin() + array.header.data_offset, bytes.end());
  return array;
}

}  // namespace dequantd::npy
