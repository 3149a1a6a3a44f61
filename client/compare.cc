// Streaming error statistics against a reference tensor (see compare.h).
#include "client/compare.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "formats/atomic_file.h"
#include "formats/npy.h"
#include "formats/safetensors.h"
#include "kernels/awq_format.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;

uint16_t Load16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t Load32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

uint64_t Load64(const uint8_t* p) {
  return static_cast<uint64_t>(Load32(p)) | (static_cast<uint64_t>(Load32(p + 4)) << 32);
}
double BitsToDouble(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

// `size` bytes of the file at `path` from `offset` (pread, EINTR retried). DATA_LOSS when the file
// ends first; errno-derived codes otherwise.
absl::StatusOr<std::vector<uint8_t>> ReadRange(const std::string& path, int64_t offset,
                                               int64_t size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return formats::ErrnoError(errno, "open", path);
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pread(fd, bytes.data() + done, bytes.size() - done,
                              static_cast<off_t>(offset + static_cast<int64_t>(done)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      if (n < 0) return formats::ErrnoError(err, "read", path);
      return absl::DataLossError(absl::StrCat(path, ": file ends ", bytes.size() - done,
                                              " bytes before the end of the reference"));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return bytes;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

}  // namespace

absl::StatusOr<ReferenceLayout> ParseReferenceLayout(const std::string& text) {
  if (text == "auto") return ReferenceLayout::kAuto;
  if (text == "kn") return ReferenceLayout::kKN;
  if (text == "nk") return ReferenceLayout::kNK;
  return absl::InvalidArgumentError(
      absl::StrCat("compare layout must be auto, kn or nk, got '", text, "'"));
}

absl::StatusOr<std::unique_ptr<ReferenceComparer>> ReferenceComparer::Open(
    const std::string& spec, const std::vector<std::string>& default_names,
    ReferenceLayout layout) {
  absl::StatusOr<std::unique_ptr<ReferenceComparer>> c =
      absl::EndsWith(spec, ".npy") || absl::StrContains(spec, ".npy:")
          ? OpenNpy(spec)
          : OpenSafetensors(spec, default_names);
  if (c.ok()) (*c)->layout_ = layout;
  return c;
}

absl::StatusOr<std::unique_ptr<ReferenceComparer>> ReferenceComparer::OpenSafetensors(
    const std::string& spec, const std::vector<std::string>& default_names) {
  std::string path = spec, name;
  // "FILE.safetensors:TENSOR": split at the first ':' after the extension.
  const size_t ext = spec.find(".safetensors:");
  if (ext != std::string::npos) {
    path = spec.substr(0, ext + 12);
    name = spec.substr(ext + 13);
  }
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> file =
      safetensors::MappedFile::Open(path);
  if (!file.ok()) return file.status();
  const auto& tensors = (*file)->header().tensors;
  if (name.empty()) {
    if (tensors.size() == 1) {
      name = tensors.begin()->first;
    } else {
      for (const std::string& candidate : default_names) {
        if (tensors.count(candidate) != 0) {
          name = candidate;
          break;
        }
      }
    }
    if (name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " holds ", tensors.size(), " tensors and none of [",
                       absl::StrJoin(default_names, ", "), "]: name one as ", path, ":TENSOR"));
    }
  }
  const auto it = tensors.find(name);
  if (it == tensors.end()) {
    return absl::NotFoundError(absl::StrCat(path, ": no tensor '", name, "'"));
  }
  const std::string& dtype = it->second.dtype;
  if (dtype != "F16" && dtype != "BF16" && dtype != "F32" && dtype != "F64") {
    return absl::InvalidArgumentError(absl::StrCat(path, ": reference '", name, "' has dtype ",
                                                   dtype, ", expected F16, BF16, F32 or F64"));
  }
  // Read the tensor into memory rather than keep the map: a map of a file truncated later
  // raises SIGBUS on access. The map (dropped on return) was only used to parse the header.
  const safetensors::TensorEntry& entry = it->second;
  absl::StatusOr<std::vector<uint8_t>> bytes = ReadRange(
      path, (*file)->header().data_start + entry.data_begin, entry.data_end - entry.data_begin);
  if (!bytes.ok()) return bytes.status();
  std::unique_ptr<ReferenceComparer> c(new ReferenceComparer());
  c->ref_data_ = *std::move(bytes);
  c->ref_bytes_ = c->ref_data_;
  c->ref_dtype_ = dtype;
  c->ref_shape_ = entry.shape;
  c->tensor_name_ = name;
  c->path_ = path;
  return c;
}

absl::StatusOr<std::unique_ptr<ReferenceComparer>> ReferenceComparer::OpenNpy(
    const std::string& spec) {
  if (!absl::EndsWith(spec, ".npy")) {
    return absl::InvalidArgumentError(
        absl::StrCat("compare reference '", spec, "': a .npy file holds one array, no :TENSOR"));
  }
  absl::StatusOr<npy::Array> array = npy::ReadFile(spec);
  if (!array.ok()) return array.status();
  // The .npy descrs of the reference dtypes (formats/npy.h), as safetensors dtype strings.
  const std::string& descr = array->header.descr;
  const char* dtype = descr == "<f2"   ? "F16"
                      : descr == "<f4" ? "F32"
                      : descr == "<f8" ? "F64"
                                       : nullptr;
  if (dtype == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec, ": reference has descr '", descr, "', expected '<f2', '<f4' or '<f8'"));
  }
  if (array->header.fortran_order) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec, ": reference is a Fortran-order array; save it in C order"));
  }
  std::unique_ptr<ReferenceComparer> c(new ReferenceComparer());
  c->path_ = spec;
  c->ref_dtype_ = dtype;
  c->ref_shape_ = array->header.shape;
  c->ref_data_ = std::move(array->data);
  c->ref_bytes_ = c->ref_data_;
  return c;
}

std::string ReferenceComparer::reference() const {
  return tensor_name_.empty() ? path_ : absl::StrCat(path_, ":", tensor_name_);
}

absl::Status ReferenceComparer::Begin(const v1::DequantizeHeader& header) {
  if (header.shape_size() != 2 && header.shape_size() != 3) {
    return absl::InvalidArgumentError("result is neither 2-D nor 3-D (E, ., .)");
  }
  // The result is (K, N), or (N, K) when the header says ORIENTATION_NK, each of E stacked
  // matrices for a 3-D header; --compare-layout names the reference's layout in those terms
  // (per matrix, the expert axis first), whatever the result's.
  const int first = header.shape_size() - 2;
  experts_ = first == 1 ? header.shape(0) : 1;
  rows_ = header.shape(first);
  cols_ = header.shape(first + 1);
  const bool result_nk = header.orientation() == v1::ORIENTATION_NK;
  K_ = result_nk ? cols_ : rows_;
  N_ = result_nk ? rows_ : cols_;
  out_dtype_ = header.dtype();
  out_element_bytes_ = out_dtype_ == v1::DTYPE_FP32                                   ? 4
                       : out_dtype_ == v1::DTYPE_FP16 || out_dtype_ == v1::DTYPE_BF16 ? 2
                                                                                      : 0;
  if (out_element_bytes_ == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot compare output dtype ", v1::DType_Name(out_dtype_)));
  }
  std::vector<int64_t> kn = {K_, N_}, nk = {N_, K_};
  if (first == 1) {
    kn.insert(kn.begin(), experts_);
    nk.insert(nk.begin(), experts_);
  }
  const bool is_kn = ref_shape_ == kn, is_nk = ref_shape_ == nk;
  if (layout_ == ReferenceLayout::kAuto && is_kn && is_nk) {  // K == N: (K, N) or (N, K)?
    return absl::InvalidArgumentError(
        absl::StrCat("reference '", reference(), "' is square (K = N = ", K_,
                     "): its layout is ambiguous; pass --compare-layout kn or nk"));
  }
  if (layout_ == ReferenceLayout::kKN && is_kn) {
    transposed_ = result_nk;
  } else if (layout_ == ReferenceLayout::kNK && is_nk) {
    transposed_ = !result_nk;
  } else if (layout_ == ReferenceLayout::kAuto && (is_kn || is_nk)) {
    transposed_ = is_kn == result_nk;
  } else {
    const std::string expected =
        layout_ == ReferenceLayout::kKN   ? absl::StrCat("kn expects (K, N) = ", ShapeString(kn))
        : layout_ == ReferenceLayout::kNK ? absl::StrCat("nk expects (N, K) = ", ShapeString(nk))
                                          : absl::StrCat("auto expects (K, N) = ", ShapeString(kn),
                                                         " or (N, K) = ", ShapeString(nk));
    return absl::InvalidArgumentError(absl::StrCat("reference '", reference(), "' has shape ",
                                                   ShapeString(ref_shape_), "; --compare-layout ",
                                                   expected));
  }
  return absl::OkStatus();
}

double ReferenceComparer::OutputAt(const uint8_t* p) const {
  switch (out_dtype_) {
    case v1::DTYPE_FP16:
      return HalfBitsToFloat(Load16(p));
    case v1::DTYPE_BF16:
      return Bf16BitsToFloat(Load16(p));
    default:
      return BitsToFloat(Load32(p));
  }
}

double ReferenceComparer::ReferenceAt(int64_t index) const {
  if (transposed_) {  // the same element of the same matrix, transposed
    const int64_t matrix = rows_ * cols_, at = index % matrix;
    index = index - at + (at % cols_) * rows_ + at / cols_;
  }
  if (ref_dtype_ == "F64") return BitsToDouble(Load64(ref_bytes_.data() + 8 * index));
  if (ref_dtype_ == "F32") return BitsToFloat(Load32(ref_bytes_.data() + 4 * index));
  const uint16_t bits = Load16(ref_bytes_.data() + 2 * index);
  return ref_dtype_ == "F16" ? HalfBitsToFloat(bits) : Bf16BitsToFloat(bits);
}

void ReferenceComparer::Accumulate(double out, double ref) {
  if (!std::isfinite(out) || !std::isfinite(ref)) {
    const bool agree = (std::isnan(out) && std::isnan(ref)) || out == ref;  // same infinity
    ++(agree ? nonfinite_ : nonfinite_mismatches_);
    return;
  }
  const double err = out - ref;
  max_abs_ = std::max(max_abs_, std::abs(err));
  sum_sq_err_ += err * err;
  sum_sq_ref_ += ref * ref;
  ++count_;
}

absl::Status ReferenceComparer::Add(absl::Span<const uint8_t> data) {
  if (out_element_bytes_ == 0) return absl::FailedPreconditionError("compare: Begin not called");
  const int64_t total = experts_ * K_ * N_;
  auto take = [&](const uint8_t* p) -> absl::Status {
    if (next_element_ >= total) return absl::OutOfRangeError("compare: more data than (K, N)");
    Accumulate(OutputAt(p), ReferenceAt(next_element_++));
    return absl::OkStatus();
  };
  size_t pos = 0;
  if (!partial_.empty()) {  // complete an element split across calls
    while (pos < data.size() && static_cast<int64_t>(partial_.size()) < out_element_bytes_) {
      partial_.push_back(data[pos++]);
    }
    if (static_cast<int64_t>(partial_.size()) < out_element_bytes_) return absl::OkStatus();
    absl::Status s = take(partial_.data());
    partial_.clear();
    if (!s.ok()) return s;
  }
  const size_t element_bytes = static_cast<size_t>(out_element_bytes_);
  for (; pos + element_bytes <= data.size(); pos += element_bytes) {
    absl::Status s = take(data.data() + pos);
    if (!s.ok()) return s;
  }
  partial_.assign(data.begin() + pos, data.end());
  return absl::OkStatus();
}

ErrorStats ReferenceComparer::Stats() const {
  ErrorStats s;
  s.count = count_;
  s.nonfinite = nonfinite_;
  s.nonfinite_mismatches = nonfinite_mismatches_;
  s.max_abs_error = nonfinite_mismatches_ > 0 ? std::numeric_limits<double>::infinity() : max_abs_;
  if (count_ > 0) {
    s.rms_error = std::sqrt(sum_sq_err_ / count_);
    const double ref_rms = std::sqrt(sum_sq_ref_ / count_);
    s.relative_rms_error = ref_rms > 0 ? s.rms_error / ref_rms : 0;
  }
  return s;
}

}  // namespace dequantd
