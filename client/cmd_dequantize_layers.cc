// `dequantctl dequantize-layers` (see commands.h).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
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
#include "client/ranged_fetch.h"
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
// Thread-safe between streams: each stream passes its own `current` (the layer it receives).
class SafetensorsCollector {
 public:
  struct Tensor;
  absl::Status Begin(const v1::DequantizeHeader& header, Tensor** current) {
    absl::StatusOr<std::string> dtype = SafetensorsDTypeFor(header.dtype());
    if (!dtype.ok()) return dtype.status();
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, inserted] = tensors_.try_emplace(header.tensor());
    *current = inserted ? &it->second : nullptr;  // a repeated layer is kept once
    if (inserted) {
      order_.push_back(header.tensor());
      it->second.dtype = *dtype;
      it->second.shape.assign(header.shape().begin(), header.shape().end());
      it->second.data.reserve(static_cast<size_t>(header.total_bytes()));
    }
    return absl::OkStatus();
  }
  static void Add(Tensor* current, absl::Span<const uint8_t> data) {
    if (current != nullptr) current->data.insert(current->data.end(), data.begin(), data.end());
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

  struct Tensor {
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;
  };

 private:
  std::mutex mu_;
  std::map<std::string, Tensor> tensors_;  // nodes stay put while others are inserted
  std::vector<std::string> order_;         // first appearance
};

// The layer names of the request, or every layer of the model (ListTensors) when it names none,
// with their result sizes in bytes (for balancing the streams).
absl::Status ListLayers(DequantClient& client, std::vector<std::string>& names,
                        std::vector<int64_t>& bytes, int64_t element_bytes) {
  absl::StatusOr<v1::ListTensorsResponse> list = client.ListTensors();
  if (!list.ok()) return list.status();
  std::map<std::string, int64_t> sizes;
  for (const v1::QuantizedTensorInfo& info : list->tensors()) {
    sizes[info.name()] = info.in_features() * info.out_features() * element_bytes;
  }
  if (names.empty()) {
    for (const v1::QuantizedTensorInfo& info : list->tensors()) names.push_back(info.name());
  }
  bytes.clear();
  for (const std::string& name : names) {
    auto it = sizes.find(name);
    bytes.push_back(it == sizes.end() ? 0 : it->second);  // unknown: the server says NOT_FOUND
  }
  return absl::OkStatus();
}

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
  if (options.streams < 1 || options.streams > kMaxStreams) {
    return absl::InvalidArgumentError(
        absl::StrCat("--streams must be in 1..", kMaxStreams, ", got ", options.streams));
  }
  if (absl::StatusOr<std::vector<std::string>> tensors = SplitLayerNames(options.tensors);
      !tensors.ok()) {
    return tensors.status();
  }
  return ParseOutputDType(options.dtype).status();
}

absl::Status RunDequantizeLayers(DequantClient& client, const DequantizeLayersOptions& options,
                                 std::ostream& out, const ClientFactory& more) {
  if (absl::Status s = CheckDequantizeLayersOptions(options); !s.ok()) return s;
  absl::StatusOr<std::vector<std::string>> tensors = SplitLayerNames(options.tensors);
  if (!tensors.ok()) return tensors.status();
  v1::DequantizeLayersRequest request;
  for (const std::string& name : *tensors) request.add_tensors(name);
  request.set_output_dtype(*ParseOutputDType(options.dtype));
  request.set_chunk_bytes(options.chunk_bytes);

  // One stream per subset of the layers (one subset, the request as given, for one stream).
  std::vector<std::vector<std::string>> subsets = {*tensors};
  std::vector<std::unique_ptr<DequantClient>> extra;
  std::vector<DequantClient*> clients = {&client};
  if (options.streams > 1 && more) {
    std::vector<std::string> names = *tensors;
    std::vector<int64_t> sizes;
    const int64_t element_bytes = OutputDTypeBytes(
        request.output_dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_FP16 : request.output_dtype());
    if (absl::Status s = ListLayers(client, names, sizes, element_bytes); !s.ok()) return s;
    if (!names.empty()) subsets.clear();  // no layers listed: one call, the server's answer
    for (const std::vector<size_t>& subset : SplitLayers(sizes, options.streams)) {
      subsets.emplace_back();
      for (size_t i : subset) subsets.back().push_back(names[i]);
    }
    for (size_t i = 1; i < subsets.size(); ++i) {
      absl::StatusOr<std::unique_ptr<DequantClient>> c = more(static_cast<int>(i));
      if (!c.ok()) return c.status();
      clients.push_back(c->get());
      extra.push_back(*std::move(c));
    }
  }

  // Per stream: the current layer's .npy (--out-dir) or collected tensor (--out).
  struct StreamState {
    std::unique_ptr<OutputFile> file;
    SafetensorsCollector::Tensor* tensor = nullptr;
  };
  std::vector<StreamState> states(subsets.size());
  SafetensorsCollector collected;  // --out
  std::mutex dir_mu;
  bool dir_created = false;
  std::atomic<int64_t> bytes{0};
  const auto make_sink = [&](size_t stream) {
    StreamState& state = states[stream];
    LayersSink sink;
    sink.on_header = [&](const v1::DequantizeHeader& header) -> absl::Status {
      if (!options.out.empty()) return collected.Begin(header, &state.tensor);
      if (options.out_dir.empty()) return absl::OkStatus();
      if (state.file) {
        if (absl::Status s = state.file->Finish(); !s.ok()) return s;
      }
      {
        // The first result: a call that fails before it leaves no directory behind.
        std::lock_guard<std::mutex> lock(dir_mu);
        if (!dir_created) {
          if (absl::Status s = CreateOutDir(options.out_dir); !s.ok()) return s;
          dir_created = true;
        }
      }
      state.file =
          OutputFile::ForPath(NpyPathFor(options.out_dir, header.tensor()), header.tensor());
      return state.file->Begin(header);
    };
    sink.on_chunk = [&](int64_t, absl::Span<const uint8_t> data) -> absl::Status {
      bytes += static_cast<int64_t>(data.size());
      if (!options.out.empty()) SafetensorsCollector::Add(state.tensor, data);
      return state.file ? state.file->Write(data) : absl::OkStatus();
    };
    return sink;
  };
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<v1::DequantizeHeader>> headers =
      FetchLayerSubsets(clients, request, subsets, make_sink);
  if (!headers.ok()) return headers.status();
  for (StreamState& state : states) {
    if (state.file) {
      if (absl::Status s = state.file->Finish(); !s.ok()) return s;
    }
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
      bytes.load(), seconds * 1e3, seconds > 0 ? bytes.load() / seconds / 1e9 : 0.0);
  if (!headers->empty()) {
    out << ", backend " << headers->front().backend() << ", kernel " << headers->front().kernel();
  }
  if (subsets.size() > 1) out << ", " << subsets.size() << " streams";
  if (!options.out_dir.empty()) out << " -> " << NpyPathFor(options.out_dir, "*");
  if (!options.out.empty()) out << " -> " << options.out << " (safetensors)";
  out << '\n';
  return absl::OkStatus();
}

}  // namespace dequantd
