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
#include "client/layers_file.h"
#include "client/output_file.h"
#include "client/ranged_fetch.h"
#include "client/table.h"
#include "client/temp_file_guard.h"

namespace dequantd {
namespace {

// Where --out-dir puts a layer: DIR/<name>.npy, with any '/' in the name made '_' (one '/' after
// DIR, also when DIR ends with '/').
std::string NpyPathFor(const std::string& dir, const std::string& tensor) {
  return (std::filesystem::path(dir) /
          absl::StrCat(absl::StrReplaceAll(tensor, {{"/", "_"}}), ".npy"))
      .string();
}

// --out-dir: FAILED_PRECONDITION when two of `layers` would be written to the same file (a '/'
// in a name becomes '_': "a/b" and "a_b"), checked before any call so that no layer silently
// replaces another.
absl::Status CheckDistinctNpyPaths(const std::string& dir,
                                   const std::vector<LayersSafetensorsFile::Layer>& layers) {
  std::map<std::string, std::string> owner;  // path -> the layer written there
  for (const LayersSafetensorsFile::Layer& layer : layers) {
    const auto [it, inserted] = owner.emplace(NpyPathFor(dir, layer.name), layer.name);
    if (inserted) continue;
    return absl::FailedPreconditionError(
        absl::StrCat("--out-dir: layers '", it->second, "' and '", layer.name,
                     "' would both be written to ", it->first,
                     " (a '/' in a layer name becomes '_'); fetch them apart with --tensors, or "
                     "write one file with --out"));
  }
  return absl::OkStatus();
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

// The layers of the request, or every layer of the model (ListTensors) when it names none, with
// their result shapes (0 x 0 for a name the server does not list: its answer is NOT_FOUND).
// The shapes are (rows, columns) of the results in `orientation` (UNSPECIFIED: each layer's own,
// from ListTensors; a server that does not say is (K, N)).
absl::StatusOr<std::vector<LayersSafetensorsFile::Layer>> ListLayers(
    DequantClient& client, const std::vector<std::string>& names, v1::Orientation orientation) {
  absl::StatusOr<v1::ListTensorsResponse> list = client.ListTensors();
  if (!list.ok()) return list.status();
  const auto result_shape = [orientation](const v1::QuantizedTensorInfo& info) {
    const v1::Orientation o =
        orientation != v1::ORIENTATION_UNSPECIFIED ? orientation : info.orientation();
    return o == v1::ORIENTATION_NK ? std::pair(info.out_features(), info.in_features())
                                   : std::pair(info.in_features(), info.out_features());
  };
  // Each listed layer as a file entry (experts: mxfp4's stacked matrices; 0 from an older server).
  const auto entry = [&](const v1::QuantizedTensorInfo& info) {
    const auto [rows, cols] = result_shape(info);
    return LayersSafetensorsFile::Layer{info.name(), rows, cols,
                                        std::max<int64_t>(1, info.experts())};
  };
  std::map<std::string, LayersSafetensorsFile::Layer> listed;
  for (const v1::QuantizedTensorInfo& info : list->tensors()) listed[info.name()] = entry(info);
  std::vector<LayersSafetensorsFile::Layer> layers;
  if (names.empty()) {
    for (const v1::QuantizedTensorInfo& info : list->tensors()) layers.push_back(entry(info));
    return layers;
  }
  for (const std::string& name : names) {
    auto it = listed.find(name);
    layers.push_back(it == listed.end() ? LayersSafetensorsFile::Layer{name, 0, 0} : it->second);
  }
  return layers;
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
  if (options.out_dir == "-") {
    return absl::InvalidArgumentError(
        "dequantize-layers --out-dir -: standard output cannot hold a directory of .npy files; "
        "name a directory");
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
  if (absl::Status s = ParseOrientation(options.orientation).status(); !s.ok()) return s;
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
  request.set_orientation(*ParseOrientation(options.orientation));
  request.set_chunk_bytes(options.chunk_bytes);
  const v1::DType dtype =
      request.output_dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_FP16 : request.output_dtype();

  // The layers and their shapes: for splitting them over streams, for laying out --out and for
  // the progress line's total.
  int streams = more ? options.streams : 1;
  std::vector<LayersSafetensorsFile::Layer> layers;
  std::unique_ptr<LayersSafetensorsFile> file;  // --out
  if (streams > 1 || !options.out.empty() || !options.out_dir.empty() ||
      options.progress.terminal) {
    absl::StatusOr<std::vector<LayersSafetensorsFile::Layer>> listed =
        ListLayers(client, *tensors, request.orientation());
    if (!listed.ok()) return listed.status();
    layers = *std::move(listed);
    if (!options.out_dir.empty()) {
      if (absl::Status s = CheckDistinctNpyPaths(options.out_dir, layers); !s.ok()) return s;
    }
    const bool all_known =
        std::all_of(layers.begin(), layers.end(), [](const auto& l) { return l.K > 0 && l.N > 0; });
    if (!options.out.empty() && all_known) {  // else the server's NOT_FOUND comes first
      absl::StatusOr<std::unique_ptr<LayersSafetensorsFile>> created =
          LayersSafetensorsFile::Create(options.out, layers, dtype, streams);
      if (!created.ok()) return created.status();
      file = *std::move(created);
      if (!file->in_place()) streams = 1;  // a device or FIFO: written in order
    }
  }

  // One stream per subset of the layers (one subset, the request as given, for one stream).
  std::vector<std::vector<std::string>> subsets = {*tensors};
  std::vector<std::unique_ptr<DequantClient>> extra;
  std::vector<DequantClient*> clients = {&client};
  if (streams > 1) {
    std::vector<int64_t> sizes;
    for (const LayersSafetensorsFile::Layer& l : layers) {
      sizes.push_back(l.elements() * OutputDTypeBytes(dtype));
    }
    if (!layers.empty()) subsets.clear();  // no layers listed: one call, the server's answer
    for (const std::vector<size_t>& subset : SplitLayers(sizes, streams)) {
      subsets.emplace_back();
      for (size_t i : subset) subsets.back().push_back(layers[i].name);
    }
    for (size_t i = 1; i < subsets.size(); ++i) {
      absl::StatusOr<std::unique_ptr<DequantClient>> c = more(static_cast<int>(i));
      if (!c.ok()) return c.status();
      clients.push_back(c->get());
      extra.push_back(*std::move(c));
    }
  }

  // Per stream: the current layer's .npy (--out-dir) or its index in the --out file.
  struct StreamState {
    std::unique_ptr<OutputFile> npy;
    size_t layer = 0;
  };
  std::unique_ptr<ProgressLine> progress;
  if (options.progress.terminal) {
    int64_t total = 0;  // 0 (unknown) when a name is not listed: the server's NOT_FOUND follows
    for (const LayersSafetensorsFile::Layer& l : layers) {
      if (l.K <= 0 || l.N <= 0) {
        total = 0;
        break;
      }
      total += l.elements() * OutputDTypeBytes(dtype);
    }
    progress = std::make_unique<ProgressLine>(
        options.progress, Count(static_cast<int64_t>(layers.size()), "layer"), total);
  }
  std::vector<StreamState> states(subsets.size());
  std::mutex dir_mu;
  bool dir_created = false;
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> npy_written{0};  // --out-dir: .npy files complete and in place
  // A failure after the directory was made says how many .npy files are in place (each is
  // whole: a file appears only once complete); --out's one file appears only at the end. With
  // --out-dir every requested layer is in `layers` (listed above).
  const auto failed = [&](const absl::Status& status) {
    if (npy_written.load() == 0 && !dir_created) return status;
    return absl::Status(
        status.code(),
        absl::StrCat(status.message(), " (", npy_written.load(), " of ", layers.size(),
                     " layers were written to ", options.out_dir, " before the failure)"));
  };
  const auto make_sink = [&](size_t stream) {
    StreamState& state = states[stream];
    LayersSink sink;
    sink.on_header = [&](const v1::DequantizeHeader& header) -> absl::Status {
      if (!options.out.empty()) {
        if (file == nullptr) return absl::DataLossError("a layer arrived that ListTensors lacks");
        absl::StatusOr<size_t> layer = file->Begin(header);
        if (!layer.ok()) return layer.status();
        state.layer = *layer;
        return absl::OkStatus();
      }
      if (options.out_dir.empty()) return absl::OkStatus();
      if (state.npy) {
        if (absl::Status s = state.npy->Finish(); !s.ok()) return s;
        ++npy_written;
      }
      {
        // The first result: a call that fails before it leaves no directory behind.
        std::lock_guard<std::mutex> lock(dir_mu);
        if (!dir_created) {
          if (absl::Status s = CreateOutDir(options.out_dir); !s.ok()) return s;
          dir_created = true;
        }
      }
      state.npy =
          OutputFile::ForPath(NpyPathFor(options.out_dir, header.tensor()), header.tensor());
      return state.npy->Begin(header);
    };
    sink.on_chunk = [&](int64_t offset, absl::Span<const uint8_t> data) -> absl::Status {
      bytes += static_cast<int64_t>(data.size());
      if (progress) progress->Add(static_cast<int64_t>(data.size()));
      if (file != nullptr) return file->WriteAt(state.layer, offset, data);
      return state.npy ? state.npy->Write(data) : absl::OkStatus();
    };
    return sink;
  };
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<v1::DequantizeHeader>> headers =
      FetchLayerSubsets(clients, request, subsets, make_sink);
  if (!headers.ok()) return failed(headers.status());
  for (StreamState& state : states) {
    if (state.npy) {
      if (absl::Status s = state.npy->Finish(); !s.ok()) return failed(s);
      ++npy_written;
    }
  }
  if (file != nullptr) {
    const ScopedSignalDeferral defer;  // the rename, and the temporary file's unregistration
    if (absl::Status s = file->Finish(); !s.ok()) return s;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (progress) progress->Finish();

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
