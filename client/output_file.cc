// The three output file kinds of dequantctl (see output_file.h).
#include "client/output_file.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/temp_file_guard.h"
#include "formats/atomic_file.h"
#include "formats/npy.h"
#include "formats/safetensors.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;

absl::Status NotStarted() { return absl::FailedPreconditionError("output file: Begin not called"); }

// .safetensors: the result is collected in memory, then written with safetensors::WriteFile.
class SafetensorsOutput : public OutputFile {
 public:
  SafetensorsOutput(std::string path, std::string tensor_name)
      : path_(std::move(path)), tensor_name_(std::move(tensor_name)) {}
  absl::Status Begin(const v1::DequantizeHeader& header) override {
    absl::StatusOr<std::string> dtype = SafetensorsDTypeFor(header.dtype());
    if (!dtype.ok()) return dtype.status();
    dtype_ = *dtype;
    shape_.assign(header.shape().begin(), header.shape().end());
    total_bytes_ = header.total_bytes();
    data_.reserve(static_cast<size_t>(total_bytes_));
    started_ = true;
    return absl::OkStatus();
  }
  absl::Status Write(absl::Span<const uint8_t> data) override {
    if (!started_) return NotStarted();
    if (static_cast<int64_t>(data.size()) > total_bytes_ - static_cast<int64_t>(data_.size())) {
      return absl::OutOfRangeError(absl::StrCat(path_, ": more bytes than total_bytes"));
    }
    data_.insert(data_.end(), data.begin(), data.end());
    return absl::OkStatus();
  }
  absl::Status WriteAt(int64_t, absl::Span<const uint8_t>) override {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": a .safetensors output is written in order, not at offsets"));
  }
  absl::Status Finish() override {
    if (!started_) return NotStarted();
    if (static_cast<int64_t>(data_.size()) != total_bytes_) {
      return absl::DataLossError(
          absl::StrCat(path_, ": ", data_.size(), " of ", total_bytes_, " bytes received"));
    }
    // WriteFile names its own temporary file: hold the signals back until it is renamed or
    // removed.
    ScopedSignalDeferral defer;
    return safetensors::WriteFile(path_, {{tensor_name_, dtype_, shape_, data_}});
  }
  const char* kind() const override { return "safetensors"; }

 private:
  std::string path_;
  std::string tensor_name_;
  std::string dtype_;
  std::vector<int64_t> shape_;
  int64_t total_bytes_ = 0;
  std::vector<uint8_t> data_;
  bool started_ = false;
};

// .npy and raw bytes: streamed to a temporary file in the same directory (registered with
// TempFileGuard, so SIGINT/SIGTERM/SIGHUP/SIGPIPE remove it) and renamed into place by Finish; or,
// for a path that is not a regular file, straight into it (AtomicFileWriter's direct mode). A .npy
// file starts with the preamble of npy::EncodePreamble.
class StreamedOutput : public OutputFile {
 public:
  StreamedOutput(std::string path, bool npy, int writers)
      : path_(std::move(path)), npy_(npy), writers_(writers) {}
  absl::Status Begin(const v1::DequantizeHeader& header) override {
    std::string preamble;
    total_bytes_ = header.total_bytes();
    if (npy_) {
      absl::StatusOr<std::string> descr = NpyDescrFor(header.dtype());
      if (!descr.ok()) return descr.status();
      const std::vector<int64_t> shape(header.shape().begin(), header.shape().end());
      absl::StatusOr<std::string> encoded = npy::EncodePreamble(*descr, shape);
      if (!encoded.ok()) return encoded.status();
      preamble = *std::move(encoded);
      preamble_bytes_ = static_cast<int64_t>(preamble.size());
      total_bytes_ = npy::DescrBytes(*descr);  // the data bytes the shape holds
      for (int64_t dim : shape) total_bytes_ *= dim;
    }
    {
      ScopedSignalDeferral defer;  // no signal between creating the file and registering it
      absl::StatusOr<formats::AtomicFileWriter> file = formats::AtomicFileWriter::Create(path_);
      if (!file.ok()) return file.status();
      file_.emplace(*std::move(file));
      // Direct mode (a device, FIFO or /dev/stdout: formats/atomic_file.h) has no temporary
      // file to remove on a signal.
      if (!file_->direct()) guard_ = TempFileGuard(file_->temporary_path());
    }
    if (absl::Status s = file_->Write(preamble); !s.ok()) return s;
    // Parallel range streams write at offsets: a mapped file lets them run at once
    // (formats/atomic_file.h, MapForWrites).
    if (file_->direct() || writers_ < 2) return absl::OkStatus();
    return file_->MapForWrites(preamble_bytes_ + total_bytes_, writers_).status();
  }
  absl::Status Write(absl::Span<const uint8_t> data) override {
    if (!file_) return NotStarted();
    if (static_cast<int64_t>(data.size()) > total_bytes_ - written_) {
      return absl::OutOfRangeError(absl::StrCat(path_, ": more bytes than total_bytes"));
    }
    absl::Status status = file_->Write(data);
    if (!status.ok()) return status;
    written_ += static_cast<int64_t>(data.size());
    return absl::OkStatus();
  }
  absl::Status WriteAt(int64_t offset, absl::Span<const uint8_t> data) override {
    if (!file_) return NotStarted();
    if (offset < 0 || static_cast<int64_t>(data.size()) > total_bytes_ - offset) {
      return absl::OutOfRangeError(absl::StrCat(path_, ": bytes [", offset, ", ",
                                                offset + static_cast<int64_t>(data.size()),
                                                ") past total_bytes ", total_bytes_));
    }
    absl::Status status = file_->WriteAt(preamble_bytes_ + offset, data);
    if (!status.ok()) return status;
    written_ += static_cast<int64_t>(data.size());
    return absl::OkStatus();
  }
  absl::Status Finish() override {
    if (!file_) return NotStarted();
    if (written_ != total_bytes_) {
      return absl::DataLossError(
          absl::StrCat(path_, ": ", written_.load(), " of ", total_bytes_, " bytes received"));
    }
    absl::Status status = file_->Commit();
    file_.reset();
    guard_ = TempFileGuard();
    return status;
  }
  const char* kind() const override { return npy_ ? "npy" : "raw"; }

 private:
  std::string path_;
  bool npy_;
  TempFileGuard guard_;  // declared before file_: unregistered after the file is removed
  std::optional<formats::AtomicFileWriter> file_;  // removes its temporary file unless committed
  int64_t total_bytes_ = 0;
  int64_t preamble_bytes_ = 0;       // .npy: the data starts after the preamble
  int writers_ = 1;                  // threads calling WriteAt at once (ForPath)
  std::atomic<int64_t> written_{0};  // WriteAt runs on several threads
};

}  // namespace

absl::StatusOr<std::string> NpyDescrFor(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP16:
      return std::string("<f2");
    case v1::DTYPE_BF16:
      return std::string("<u2");  // NumPy has no bfloat16: the raw bits
    case v1::DTYPE_FP32:
      return std::string("<f4");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("no .npy descr for output dtype ", v1::DType_Name(dtype)));
  }
}

absl::StatusOr<std::string> SafetensorsDTypeFor(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP16:
      return std::string("F16");
    case v1::DTYPE_BF16:
      return std::string("BF16");
    case v1::DTYPE_FP32:
      return std::string("F32");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("no safetensors dtype for output dtype ", v1::DType_Name(dtype)));
  }
}

bool OutputFile::CanWriteAt(const std::string& path) {
  // As the file will be opened: a path through /proc (/dev/stdout) is written in order even when
  // it reaches a regular file.
  return !absl::EndsWith(path, ".safetensors") && !formats::AtomicFileWriter::WritesInPlace(path);
}

std::unique_ptr<OutputFile> OutputFile::ForPath(const std::string& path,
                                                const std::string& tensor_name, int writers) {
  if (absl::EndsWith(path, ".npy")) {
    return std::make_unique<StreamedOutput>(path, /*npy=*/true, writers);
  }
  if (absl::EndsWith(path, ".safetensors")) {
    return std::make_unique<SafetensorsOutput>(path, tensor_name);
  }
  return std::make_unique<StreamedOutput>(path, /*npy=*/false, writers);
}

}  // namespace dequantd
