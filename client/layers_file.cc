// LayersSafetensorsFile (see layers_file.h).
#include "client/layers_file.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/output_file.h"
#include "formats/safetensors.h"

namespace dequantd {

absl::StatusOr<std::unique_ptr<LayersSafetensorsFile>> LayersSafetensorsFile::Create(
    const std::string& path, const std::vector<Layer>& layers, v1::DType dtype, int writers) {
  absl::StatusOr<std::string> st_dtype = SafetensorsDTypeFor(dtype);
  if (!st_dtype.ok()) return st_dtype.status();
  std::vector<safetensors::TensorSpec> specs;
  for (const Layer& l : layers) {
    specs.push_back({l.name, *st_dtype,
                     l.experts == 1 ? std::vector<int64_t>{l.K, l.N}
                                    : std::vector<int64_t>{l.experts, l.K, l.N}});
  }
  absl::StatusOr<safetensors::FileLayout> layout = safetensors::PlanFile(specs);
  if (!layout.ok()) return layout.status();
  std::unique_ptr<LayersSafetensorsFile> file(new LayersSafetensorsFile());
  file->path_ = path;
  file->layers_ = layers;
  file->dtype_ = dtype;
  file->offsets_ = layout->data_offsets;
  file->bytes_ = layout->tensor_bytes;
  file->file_bytes_ = layout->file_bytes;
  {
    ScopedSignalDeferral defer;  // no signal between creating the file and registering it
    absl::StatusOr<formats::AtomicFileWriter> writer = formats::AtomicFileWriter::Create(path);
    if (!writer.ok()) return writer.status();
    file->file_.emplace(*std::move(writer));
    if (!file->file_->direct()) file->guard_ = TempFileGuard(file->file_->temporary_path());
  }
  if (absl::Status s = file->file_->Write(layout->header); !s.ok()) return s;
  // Every stream writes its layers at their offsets: mapped, they do so at once instead of one
  // at a time on the file's inode lock (formats/atomic_file.h, MapForWrites).
  if (!file->file_->direct() && writers > 1) {
    if (absl::Status s = file->file_->MapForWrites(file->file_bytes_, writers).status(); !s.ok())
      return s;
  }
  file->next_ = static_cast<int64_t>(layout->header.size());
  return file;
}

absl::StatusOr<size_t> LayersSafetensorsFile::Begin(const v1::DequantizeHeader& header) const {
  const auto it = std::find_if(layers_.begin(), layers_.end(),
                               [&](const Layer& l) { return l.name == header.tensor(); });
  if (it == layers_.end()) {
    return absl::DataLossError(
        absl::StrCat(path_, ": the server sent layer \"", header.tensor(), "\", not asked for"));
  }
  // (K, N), or (E, K, N) for a layer of stacked experts (mxfp4).
  const std::vector<int64_t> want = it->experts == 1
                                        ? std::vector<int64_t>{it->K, it->N}
                                        : std::vector<int64_t>{it->experts, it->K, it->N};
  if (header.dtype() != dtype_ ||
      !std::equal(header.shape().begin(), header.shape().end(), want.begin(), want.end())) {
    return absl::DataLossError(absl::StrCat(path_, ": layer \"", it->name,
                                            "\" arrived with another shape or dtype than "
                                            "ListTensors and the request gave"));
  }
  return static_cast<size_t>(it - layers_.begin());
}

absl::Status LayersSafetensorsFile::WriteAt(size_t layer, int64_t offset,
                                            absl::Span<const uint8_t> data) {
  const int64_t size = static_cast<int64_t>(data.size());
  if (layer >= layers_.size() || offset < 0 || size > bytes_[layer] - offset) {
    return absl::OutOfRangeError(
        absl::StrCat(path_, ": bytes [", offset, ", ", offset + size, ") past the layer's end"));
  }
  const int64_t at = offsets_[layer] + offset;
  absl::Status status;
  if (in_place()) {
    status = file_->WriteAt(at, data);
  } else if (at != next_) {
    status = absl::DataLossError(absl::StrCat(path_, ": bytes at file offset ", at,
                                              " arrived out of order (expected ", next_, ")"));
  } else {
    status = file_->Write(data);
    next_ += size;
  }
  if (status.ok()) written_ += size;
  return status;
}

absl::Status LayersSafetensorsFile::Finish() {
  int64_t want = 0;
  for (int64_t b : bytes_) want += b;
  if (written_.load() != want) {
    return absl::DataLossError(
        absl::StrCat(path_, ": ", written_.load(), " of ", want, " result bytes received"));
  }
  absl::Status status = file_->Commit();
  file_.reset();
  guard_ = TempFileGuard();
  return status;
}

}  // namespace dequantd
