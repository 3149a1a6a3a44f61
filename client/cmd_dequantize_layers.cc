// `dequantctl dequantize-layers` (see commands.h).
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "client/commands.h"
#include "client/output_file.h"
#include "client/table.h"
#include "client/temp_file_guard.h"
#include "formats/safetensors.h"

namespace dequantd {
namespace {

// Where --out-dir puts a layer: DIR/<name>.npy, with any '/' in the name made '_' (one '/' after
// DIR, also when DIR ends with '/').
std::string NpyPathFor(const std::string& dir, const std::string& tensor) {
  return (std::filesystem::path(dir) /
          absl::StrCat(absl::StrReplaceAll(tensor, {{"/", "_"}}), ".npy"))
      .string();
}

// --out-dir: created (with its parents) when the first result arrives.
absl::Status CreateOutDir(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create --out-dir \"", dir, "\": ", error.message()));
  }
  return absl::OkStatus();
}

// --out FILE.safetensors: every distinct layer collected in memory, written at the end.
class SafetensorsCollector {
 public:
  absl::Status Begin(const v1::DequantizeHeader& header) {
    absl::StatusOr<std::string> dtype = SafetensorsDTypeFor(header.dtype());
    if (!dtype.ok()) return dtype.status();
    auto [it, inserted] = tensors_.try_emplace(header.tensor());
    current_ = inserted ? &it->second : nullptr;  // a repeated layer is kept once
    if (inserted) {
      order_.push_back(header.tensor());
      it->second.dtype = *dtype;
      it->second.shape.assign(header.shape().begin(), header.shape().end());
      it->second.data.reserve(static_cast<size_t>(header.total_bytes()));
    }
    return absl::OkStatus();
  }
  void Add(absl::Span<const uint8_t> data) {
    if (current_ != nullptr) current_->data.insert(current_->data.end(), data.begin(), data.end());
  }
  absl::Status Write(const std::string& path) const {
    std::vector<safetensors::TensorToWrite> tensors;
    for (const std::string& name : order_) {
      const Tensor& t = tensors_.at(name);
      tensors.push_back({.name = name, .dtype = t.dtype, .shape = t.shape, .bytes = t.data});
    }
    const ScopedSignalDeferral defer;  // WriteFile's temporary file is not registered
    return safetensors::WriteFile(path, tensors);
  }

 private:
  struct Tensor {
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;
  };
  std::map<std::string, Tensor> tensors_;
  std::vector<std::string> order_;  // first appearance
  Tensor* current_ = nullptr;
};

// --tensors "a,b": the names in order; "" = none (every layer). INVALID_ARGUMENT for an empty
// name ("a,,b", ",") or a name listed twice.
absl::StatusOr<std::vector<std::string>> SplitLayerNames(const std::string& tensors) {
  std::vector<std::string> names;
  if (tensors.empty()) return names;
  for (absl::string_view name : absl::StrSplit(tensors, ',')) {
    if (name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tensors \"", tensors, "\" has an empty layer name"));
    }
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--tensors lists layer '", name, "' twice"));
    }
    names.emplace_back(name);
  }
  return names;
}

}  // namespace

absl::Status CheckDequantizeLayersOptions(const DequantizeLayersOptions& options) {
  if (!options.out.empty() && !options.out_dir.empty()) {
    return absl::InvalidArgumentError("dequantize-layers takes --out or --out-dir, not both");
  }
  if (!options.out.empty() && !absl::EndsWith(options.out, ".safetensors")) {
    return absl::InvalidArgumentError("dequantize-layers --out must name a .safetensors file");
  }
  if (options.chunk_bytes < 0) return absl::InvalidArgumentError("--chunk-bytes must be >= 0");
  if (absl::StatusOr<std::vector<std::string>> tensors = SplitLayerNames(options.tensors);
      !tensors.ok()) {
    return tensors.status();
  }
  return ParseOutputDType(options.dtype).status();
}

absl::Status RunDequantizeLayers(DequantClient& client, const DequantizeLayersOptions& options,
                                 std::ostream& out) {
  if (absl::Status s = CheckDequantizeLayersOptions(options); !s.ok()) return s;
  absl::StatusOr<std::vector<std::string>> tensors = SplitLayerNames(options.tensors);
  if (!tensors.ok()) return tensors.status();
  v1::DequantizeLayersRequest request;
  for (const std::string& name : *tensors) request.add_tensors(name);
  request.set_output_dtype(*ParseOutputDType(options.dtype));
  request.set_chunk_bytes(options.chunk_bytes);

  std::unique_ptr<OutputFile> file;  // --out-dir: the current layer's .npy
  SafetensorsCollector collected;    // --out
  int64_t bytes = 0;
  LayersSink sink;
  sink.on_header = [&](const v1::DequantizeHeader& header) -> absl::Status {
    if (!options.out.empty()) return collected.Begin(header);
    if (options.out_dir.empty()) return absl::OkStatus();
    if (file) {
      if (absl::Status s = file->Finish(); !s.ok()) return s;
    } else if (absl::Status s = CreateOutDir(options.out_dir); !s.ok()) {
      return s;  // the first result: a call that fails before it leaves no directory behind
    }
    file = OutputFile::ForPath(NpyPathFor(options.out_dir, header.tensor()), header.tensor());
    return file->Begin(header);
  };
  sink.on_chunk = [&](int64_t, absl::Span<const uint8_t> data) -> absl::Status {
    bytes += static_cast<int64_t>(data.size());
    if (!options.out.empty()) collected.Add(data);
    return file ? file->Write(data) : absl::OkStatus();
  };
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<v1::DequantizeHeader>> headers =
      client.DequantizeLayers(request, sink);
  if (!headers.ok()) return headers.status();
  if (file) {
    if (absl::Status s = file->Finish(); !s.ok()) return s;
  }
  if (!options.out.empty()) {
    if (absl::Status s = collected.Write(options.out); !s.ok()) return s;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  out << absl::StrFormat(
      "%s, %s, %d bytes in %.3f ms (%.3f GB/s)", Count(headers->size(), "layer"),
      OutputDTypeName(request.output_dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_FP16
                                                                      : request.output_dtype()),
      bytes, seconds * 1e3, seconds > 0 ? bytes / seconds / 1e9 : 0.0);
  if (!headers->empty()) {
    out << ", backend " << headers->front().backend() << ", kernel " << headers->front().kernel();
  }
  if (!options.out_dir.empty()) out << " -> " << NpyPathFor(options.out_dir, "*");
  if (!options.out.empty()) out << " -> " << options.out << " (safetensors)";
  out << '\n';
  return absl::OkStatus();
}

}  // namespace dequantd
