// The three output file kinds of dequantctl (see output_file.h).
#include "client/output_file.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "formats/atomic_file.h"
#include "formats/npy.h"
#include "formats/safetensors.h"

namespace dequantd {
namespace {

namespace v1 = ::dequant::v1;

absl::Status NotStarted() { return absl::FailedPreconditionError("output file: Begin not called"); }

// .npy, streamed through npy::NpyWriter.
class NpyOutput : public OutputFile {
 public:
  explicit NpyOutput(std::string path) : path_(std::move(path)) {}
  absl::Status Begin(const v1::DequantizeHeader& header) override {
    absl::StatusOr<std::string> descr = NpyDescrFor(header.dtype());
    if (!descr.ok()) return descr.status();
    std::vector<int64_t> shape(header.shape().begin(), header.shape().end());
    absl::StatusOr<std::unique_ptr<npy::NpyWriter>> writer =
        npy::NpyWriter::Create(path_, *descr, shape);
    if (!writer.ok()) return writer.status();
    writer_ = *std::move(writer);
    return absl::OkStatus();
  }
  absl::Status Write(absl::Span<const uint8_t> data) override {
    return writer_ ? writer_->Append(data) : NotStarted();
  }
  absl::Status Finish() override { return writer_ ? writer_->Finish() : NotStarted(); }
  const char* kind() const override { return "npy"; }

 private:
  std::string path_;
  std::unique_ptr<npy::NpyWriter> writer_;
};

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
  absl::Status Finish() override {
    if (!started_) return NotStarted();
    if (static_cast<int64_t>(data_.size()) != total_bytes_) {
      return absl::DataLossError(
          absl::StrCat(path_, ": ", data_.size(), " of ", total_bytes_, " bytes received"));
    }
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

// Raw bytes, streamed to a temporary file in the same directory and renamed into place.
class RawOutput : public OutputFile {
 public:
  explicit RawOutput(std::string path) : path_(std::move(path)) {}
  absl::Status Begin(const v1::DequantizeHeader& header) override {
    total_bytes_ = header.total_bytes();
    absl::StatusOr<formats::AtomicFileWriter> file = formats::AtomicFileWriter::Create(path_);
    if (!file.ok()) return file.status();
    file_.emplace(*std::move(file));
    return absl::OkStatus();
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
  absl::Status Finish() override {
    if (!file_) return NotStarted();
    if (written_ != total_bytes_) {
      return absl::DataLossError(
          absl::StrCat(path_, ": ", written_, " of ", total_bytes_, " bytes received"));
    }
    absl::Status status = file_->Commit();
    file_.reset();
    return status;
  }
  const char* kind() const override { return "raw"; }

 private:
  std::string path_;
  std::optional<formats::AtomicFileWriter> file_;  // removes its temporary file unless committed
  int64_t total_bytes_ = 0;
  int64_t written_ = 0;
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

std::unique_ptr<OutputFile> OutputFile::ForPath(const std::string& path,
                                                const std::string& tensor_name) {
  if (absl::EndsWith(path, ".npy")) return std::make_unique<NpyOutput>(path);
  if (absl::EndsWith(path, ".safetensors")) {
    return std::make_unique<SafetensorsOutput>(path, tensor_name);
  }
  return std::make_unique<RawOutput>(path);
}

}  // namespace dequantd
