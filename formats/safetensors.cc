// safetensors header parsing, read-only memory maps and atomic writes (see safetensors.h).
#include "formats/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "formats/atomic_file.h"
#include "formats/strict_json.h"
#include "nlohmann/json.hpp"

namespace dequantd::safetensors {
namespace {

using formats::ErrnoError;
using nlohmann::json;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

uint64_t ReadLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void WriteLe64(uint64_t v, uint8_t* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// A JSON number that is a non-negative integer fitting in int64.
bool AsNonNegativeInt64(const json& j, int64_t* out) {
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(kInt64Max)) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = v;
    return true;
  }
  return false;
}

// Element count of `shape` times `dtype_bytes`, or an error naming the tensor.
absl::StatusOr<int64_t> ByteCount(const std::string& name, const std::vector<int64_t>& shape,
                                  int64_t dtype_bytes) {
  int64_t bytes = dtype_bytes;
  for (const int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "': field 'shape' has a negative dimension ", dim));
    }
    if (__builtin_mul_overflow(bytes, dim, &bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "': field 'shape' overflows a 64-bit byte count"));
    }
  }
  return bytes;
}

absl::StatusOr<TensorEntry> ParseEntry(const std::string& name, const json& j, int64_t data_bytes) {
  auto field_error = [&name](absl::string_view field, absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': field '", field, "' ", what));
  };
  if (!j.is_object())
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': entry is not an object"));
  TensorEntry e;
  e.name = name;

  const auto dtype_it = j.find("dtype");
  if (dtype_it == j.end() || !dtype_it->is_string())
    return field_error("dtype", "missing or not a string");
  e.dtype = dtype_it->get<std::string>();
  const int64_t dtype_bytes = DTypeBytes(e.dtype);
  if (dtype_bytes == 0) return field_error("dtype", absl::StrCat("is unknown: '", e.dtype, "'"));

  const auto shape_it = j.find("shape");
  if (shape_it == j.end() || !shape_it->is_array())
    return field_error("shape", "missing or not an array");
  for (const json& dim : *shape_it) {
    if (dim.is_number_integer() && !dim.is_number_unsigned() && dim.get<int64_t>() < 0) {
      return field_error("shape", absl::StrCat("has a negative dimension ", dim.get<int64_t>()));
    }
    int64_t d = 0;
    if (!AsNonNegativeInt64(dim, &d))
      return field_error("shape", "holds a non-integer or too large dimension");
    e.shape.push_back(d);
  }

  const auto off_it = j.find("data_offsets");
  if (off_it == j.end() || !off_it->is_array() || off_it->size() != 2 ||
      !AsNonNegativeInt64((*off_it)[0], &e.data_begin) ||
      !AsNonNegativeInt64((*off_it)[1], &e.data_end)) {
    return field_error("data_offsets", "must be two non-negative integers [begin, end]");
  }
  if (e.data_begin > e.data_end) {
    return field_error("data_offsets",
                       absl::StrCat("has begin ", e.data_begin, " > end ", e.data_end));
  }
  if (e.data_end > data_bytes) {
    return absl::DataLossError(absl::StrCat("tensor '", name, "': field 'data_offsets' end ",
                                            e.data_end, " is past the end of the data section (",
                                            data_bytes, " bytes): file truncated?"));
  }

  absl::StatusOr<int64_t> want = ByteCount(name, e.shape, dtype_bytes);
  if (!want.ok()) return want.status();
  if (e.data_end - e.data_begin != *want) {
    return field_error("data_offsets",
                       absl::StrCat("span ", e.data_end - e.data_begin,
                                    " bytes, but shape and dtype ", e.dtype, " need ", *want));
  }
  return e;
}

// INVALID_ARGUMENT naming both tensors when two non-empty byte ranges share a byte (a reader would
// serve one tensor's bytes as the other's).
absl::Status CheckNoOverlap(const std::map<std::string, TensorEntry>& tensors) {
  std::vector<const TensorEntry*> by_begin;
  for (const auto& [name, e] : tensors) {
    if (e.data_end > e.data_begin) by_begin.push_back(&e);
  }
  std::sort(by_begin.begin(), by_begin.end(), [](const TensorEntry* a, const TensorEntry* b) {
    return a->data_begin < b->data_begin;
  });
  const TensorEntry* furthest = nullptr;  // the range ending last among those before
  for (const TensorEntry* e : by_begin) {
    if (furthest != nullptr && e->data_begin < furthest->data_end) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", e->name, "': field 'data_offsets' [", e->data_begin, ", ",
                       e->data_end, ") overlaps tensor '", furthest->name, "' [",
                       furthest->data_begin, ", ", furthest->data_end, ")"));
    }
    if (furthest == nullptr || e->data_end > furthest->data_end) furthest = e;
  }
  return absl::OkStatus();
}

}  // namespace

int64_t DTypeBytes(const std::string& dtype) {
  static const auto* const kSizes = new std::map<std::string, int64_t, std::less<>>{
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  const auto it = kSizes->find(dtype);
  return it == kSizes->end() ? 0 : it->second;
}

absl::StatusOr<Header> ParseHeader(absl::Span<const uint8_t> file_bytes) {
  const int64_t total = static_cast<int64_t>(file_bytes.size());
  if (total < 8) {
    return absl::DataLossError(
        absl::StrCat("file is ", total, " bytes, shorter than the 8-byte header length"));
  }
  const uint64_t n = ReadLe64(file_bytes.data());
  if (n > static_cast<uint64_t>(kMaxHeaderBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("header length ", n, " is absurd (limit ",
                                                   kMaxHeaderBytes,
                                                   " bytes): not a safetensors file?"));
  }
  if (static_cast<int64_t>(n) > total - 8) {
    return absl::DataLossError(absl::StrCat("header length ", n, " runs past the end of the ",
                                            total, "-byte file: file truncated?"));
  }
  Header header;
  header.data_start = 8 + static_cast<int64_t>(n);
  const int64_t data_bytes = total - header.data_start;

  absl::StatusOr<json> parsed = formats::ParseJsonNoDuplicateKeys(
      absl::string_view(reinterpret_cast<const char*>(file_bytes.data() + 8), n));
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("header: ", parsed.status().message()));
  }
  const json& root = *parsed;
  if (!root.is_object()) return absl::InvalidArgumentError("header JSON is not an object");

  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) {
        return absl::InvalidArgumentError("field '__metadata__' is not an object");
      }
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat("field '__metadata__': value of '", mk, "' is not a string"));
        }
        header.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    absl::StatusOr<TensorEntry> entry = ParseEntry(key, value, data_bytes);
    if (!entry.ok()) return entry.status();
    header.tensors.emplace(key, *std::move(entry));
  }
  if (absl::Status s = CheckNoOverlap(header.tensors); !s.ok()) return s;
  return header;
}

MappedFile::~MappedFile() {
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), size_);
}

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(err, "stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a regular file"));
  }
  std::unique_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return ErrnoError(err, "mmap", path);
    }
    file->base_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive

  absl::StatusOr<Header> header =
      ParseHeader(absl::MakeConstSpan(file->base_, file->base_ ? file->size_ : 0));
  if (!header.ok()) {
    return absl::Status(header.status().code(),
                        absl::StrCat(path, ": ", header.status().message()));
  }
  file->header_ = *std::move(header);
  return file;
}

absl::StatusOr<absl::Span<const uint8_t>> MappedFile::TensorBytes(const std::string& name) const {
  const auto it = header_.tensors.find(name);
  if (it == header_.tensors.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", name, "'"));
  }
  const TensorEntry& e = it->second;
  return absl::MakeConstSpan(base_ + header_.data_start + e.data_begin,
                             static_cast<size_t>(e.data_end - e.data_begin));
}

absl::StatusOr<FileLayout> PlanFile(const std::vector<TensorSpec>& tensors,
                                    const std::map<std::string, std::string>& metadata) {
  json root = json::object();
  if (!metadata.empty()) {
    json meta = json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    root["__metadata__"] = std::move(meta);
  }
  FileLayout layout;
  int64_t offset = 0;
  std::set<std::string> names;
  for (const TensorSpec& t : tensors) {
    if (t.name == "__metadata__" || !names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name '", t.name, "' is reserved or repeated"));
    }
    const int64_t dtype_bytes = DTypeBytes(t.dtype);
    if (dtype_bytes == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "': field 'dtype' is unknown: '", t.dtype, "'"));
    }
    absl::StatusOr<int64_t> bytes = ByteCount(t.name, t.shape, dtype_bytes);
    if (!bytes.ok()) return bytes.status();
    root[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + *bytes}}};
    layout.tensor_bytes.push_back(*bytes);
    layout.data_offsets.push_back(offset);
    offset += *bytes;
  }
  std::string header_json = root.dump();
  header_json.append((8 - header_json.size() % 8) % 8, ' ');
  uint8_t prefix[8];
  WriteLe64(header_json.size(), prefix);
  layout.header.assign(reinterpret_cast<const char*>(prefix), sizeof prefix);
  layout.header += header_json;
  for (int64_t& o : layout.data_offsets) o += static_cast<int64_t>(layout.header.size());
  layout.file_bytes = static_cast<int64_t>(layout.header.size()) + offset;
  return layout;
}

absl::Status WriteFile(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  for (const TensorToWrite& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  absl::StatusOr<FileLayout> layout = PlanFile(specs, metadata);
  if (!layout.ok()) return layout.status();
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (static_cast<int64_t>(tensors[i].bytes.size()) != layout->tensor_bytes[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", tensors[i].name, "': ", tensors[i].bytes.size(),
                       " bytes given, shape and dtype need ", layout->tensor_bytes[i]));
    }
  }
  absl::StatusOr<formats::AtomicFileWriter> file = formats::AtomicFileWriter::Create(path);
  if (!file.ok()) return file.status();
  absl::Status status = file->Write(layout->header);
  for (const TensorToWrite& t : tensors) {
    if (!status.ok()) break;
    status = file->Write(t.bytes);
  }
  if (!status.ok()) return status;  // the writer's destructor removes the temporary file
  return file->Commit();
}

}  // namespace dequantd::safetensors
