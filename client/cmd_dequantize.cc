// `dequantctl dequantize` (see commands.h).
#include <algorithm>
#include <cctype>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/commands.h"
#include "client/compare.h"
#include "client/output_file.h"
#include "client/packed_input.h"
#include "client/ranged_fetch.h"
#include "client/shm_client.h"

namespace dequantd {
namespace {

// The layer name without its format's trailing separator ("model.layers.0.mlp.up_proj." ->
// "...up_proj"; mxfp4: "...experts.down_proj_" -> "...experts.down_proj").
std::string LayerOfPrefix(std::string prefix, std::string_view separator) {
  if (absl::EndsWith(prefix, absl::string_view(separator.data(), separator.size())))
    prefix.resize(prefix.size() - separator.size());
  return prefix;
}

// The clients of `streams` parallel streams: `first`, then connections 1.. made by `more`.
absl::StatusOr<std::vector<std::unique_ptr<DequantClient>>> MoreClients(const ClientFactory& more,
                                                                        int streams) {
  std::vector<std::unique_ptr<DequantClient>> clients;
  for (int i = 1; i < streams && more; ++i) {
    absl::StatusOr<std::unique_ptr<DequantClient>> client = more(i);
    if (!client.ok()) return client.status();
    clients.push_back(*std::move(client));
  }
  return clients;
}

// Fetches `request`'s result of `total_bytes` in `streams` ranges into `file` (written in place)
// or nowhere (file null), counting the bytes on `progress` (when not null). Returns the header.
absl::StatusOr<v1::DequantizeHeader> FetchRangesInto(DequantClient& client,
                                                     const ClientFactory& more,
                                                     const v1::DequantizeRequest& request,
                                                     int64_t total_bytes, int streams,
                                                     OutputFile* file, ProgressLine* progress) {
  absl::StatusOr<std::vector<std::unique_ptr<DequantClient>>> extra = MoreClients(more, streams);
  if (!extra.ok()) return extra.status();
  std::vector<DequantClient*> clients = {&client};
  for (const std::unique_ptr<DequantClient>& c : *extra) clients.push_back(c.get());
  RangeSink sink;
  sink.on_header = [file](const v1::DequantizeHeader& header) {
    return file != nullptr ? file->Begin(header) : absl::OkStatus();
  };
  sink.write_at = [file, progress](int64_t offset, absl::Span<const uint8_t> data) {
    if (progress != nullptr) progress->Add(static_cast<int64_t>(data.size()));
    return file != nullptr ? file->WriteAt(offset, data) : absl::OkStatus();
  };
  return FetchRanges(clients, request, total_bytes, static_cast<int>(clients.size()), sink);
}

}  // namespace

absl::Status CheckDequantizeOptions(const DequantizeOptions& options) {
  if (options.tensor.empty() == options.packed.empty()) {
    return absl::InvalidArgumentError("dequantize needs exactly one of --tensor or --packed");
  }
  if (!options.prefix.empty() && options.packed.empty()) {
    return absl::InvalidArgumentError("--prefix applies to --packed only");
  }
  if (!options.format.empty() && options.packed.empty()) {
    return absl::InvalidArgumentError("--format applies to --packed only");
  }
  if (!options.format.empty()) {
    if (absl::StatusOr<Format> format = ParseFormatFlag(options.format); !format.ok()) {
      return format.status();  // a usage error, before any file is read
    }
  }
  if (!options.config.empty() && options.packed.empty()) {
    return absl::InvalidArgumentError("--config applies to --packed only");
  }
  if (options.group_size != 0 && options.packed.empty()) {
    return absl::InvalidArgumentError("--group-size applies to --packed only");
  }
  if (options.chunk_bytes < 0) return absl::InvalidArgumentError("--chunk-bytes must be >= 0");
  if (options.streams < 0 || options.streams > kMaxStreams) {
    return absl::InvalidArgumentError(absl::StrCat("--streams must be in 1..", kMaxStreams,
                                                   " (leave it out to choose by size), got ",
                                                   options.streams));
  }
  if (!options.shm.empty() &&
      (options.shm.size() > 128 ||
       !std::all_of(options.shm.begin(), options.shm.end(), [](unsigned char c) {
         return std::isalnum(c) || c == '.' || c == '_' || c == '-';
       }))) {
    // The server's rule for region names (RegisterSystemSharedMemoryRequest.name), checked here
    // so that the error names the flag rather than the shared-memory key made from it.
    return absl::InvalidArgumentError(absl::StrCat(
        "--shm: a region name is 1..128 bytes of [A-Za-z0-9._-], got \"", options.shm, "\""));
  }
  if (options.streams > 0 && !options.shm.empty()) {
    return absl::InvalidArgumentError(
        "--streams does not apply with --shm: the result is written into the region in one call");
  }
  // --streams S > 1 needs bytes that may arrive out of order (see RunDequantize); where they
  // cannot, an explicit S is refused rather than quietly run on one stream.
  if (options.streams > 1 && !options.compare.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--streams ", options.streams,
        " does not apply with --compare: the result is compared in order on one stream"));
  }
  if (options.streams > 1 && !options.out.empty() && !OutputFile::CanWriteAt(options.out)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--streams ", options.streams, " does not apply with --out ", options.out,
        ": a .safetensors file, or an output that is not a regular file, is written in order on "
        "one stream"));
  }
  absl::StatusOr<v1::DType> dtype = ParseOutputDType(options.dtype);
  if (!dtype.ok()) return dtype.status();
  if (absl::StatusOr<v1::Orientation> o = ParseOrientation(options.orientation); !o.ok()) {
    return o.status();
  }
  if (!options.compare.empty()) {
    absl::StatusOr<ReferenceLayout> layout = ParseReferenceLayout(options.compare_layout);
    if (!layout.ok()) return layout.status();
  }
  return absl::OkStatus();
}

absl::Status RunDequantize(DequantClient& client, const DequantizeOptions& options,
                           std::ostream& out, const ClientFactory& more) {
  absl::Status status = CheckDequantizeOptions(options);
  if (!status.ok()) return status;

  v1::DequantizeRequest request;
  request.set_output_dtype(*ParseOutputDType(options.dtype));
  request.set_orientation(*ParseOrientation(options.orientation));
  request.set_chunk_bytes(options.chunk_bytes);
  std::string label;                 // what the summary calls the tensor
  std::string_view separator = ".";  // --packed: its format's, between the layer and a role
  std::vector<std::string> reference_names;
  if (!options.tensor.empty()) {
    request.set_tensor(options.tensor);
    label = options.tensor;
    reference_names = {options.tensor + ".weight", options.tensor};
  } else {
    absl::StatusOr<PackedDeclaration> declared =
        FindPackedDeclaration(options.packed, options.config, options.format);
    if (!declared.ok()) return declared.status();
    absl::StatusOr<v1::InlinePackedTensor> packed =
        LoadInlinePacked(options.packed, options.prefix, options.group_size, declared->format,
                         declared->config.has_value() ? &*declared->config : nullptr);
    if (!packed.ok()) return packed.status();
    *request.mutable_packed() = *std::move(packed);
    separator = FormatRowOf(declared->format).role_separator;
    const std::string layer = LayerOfPrefix(options.prefix, separator);
    label = absl::StrCat(options.packed, ":", options.prefix, "*");
    reference_names = {layer + ".weight", layer, "weight"};
  }

  std::unique_ptr<ReferenceComparer> comparer;
  if (!options.compare.empty()) {
    absl::StatusOr<std::unique_ptr<ReferenceComparer>> opened = ReferenceComparer::Open(
        options.compare, reference_names, *ParseReferenceLayout(options.compare_layout));
    if (!opened.ok()) return opened.status();
    comparer = *std::move(opened);
    const bool awq = request.packed().format().empty() || request.packed().format() == "awq_gemm";
    if (request.has_packed() && (request.orientation() != v1::ORIENTATION_UNSPECIFIED || awq)) {
      // The result's shape and dtype are known (awq_gemm's own orientation is (K, N); another
      // format's own is the server's to say): refuse a reference that does not fit before the
      // call.
      const bool nk = request.orientation() == v1::ORIENTATION_NK;
      v1::DequantizeHeader expected;
      expected.add_shape(nk ? request.packed().out_features() : request.packed().in_features());
      expected.add_shape(nk ? request.packed().in_features() : request.packed().out_features());
      expected.set_dtype(request.output_dtype());
      if (absl::Status s = comparer->Begin(expected); !s.ok()) return s;
    }
  }
  // Ranged (parallel, resumable) when the bytes may arrive out of order: no comparison, and an
  // output written at offsets or none. The size must be known first (ListTensors for a tensor);
  // when it cannot be, the single stream below reports the server's own error.
  int streams = 0;
  int64_t total_bytes = 0;
  if (options.compare.empty() && (options.out.empty() || OutputFile::CanWriteAt(options.out))) {
    if (absl::StatusOr<int64_t> total = ResultBytes(client, request); total.ok()) {
      total_bytes = *total;
      streams = more ? (options.streams > 0 ? options.streams : DefaultStreams(total_bytes)) : 1;
    }
  }
  std::unique_ptr<OutputFile> file;
  if (!options.out.empty()) {
    // The tensor's name in a .safetensors file: the layer, or "weight" for an empty --prefix.
    std::string name =
        options.tensor.empty() ? LayerOfPrefix(options.prefix, separator) : options.tensor;
    file = OutputFile::ForPath(options.out, name.empty() ? "weight" : name, std::max(streams, 1));
  }
  // The progress line, for a large result: made before a ranged fetch (the size is known), else
  // when the header arrives.
  std::unique_ptr<ProgressLine> progress;
  const auto begin_progress = [&](int64_t result_bytes) {
    if (options.progress.terminal && result_bytes >= kProgressMinBytes && !progress) {
      progress = std::make_unique<ProgressLine>(options.progress, label, result_bytes);
    }
  };
  if (streams > 0) begin_progress(total_bytes);
  DequantizeSink sink;
  sink.on_header = [&](const v1::DequantizeHeader& header) {
    begin_progress(header.total_bytes());
    // The comparison first: a reference it refuses leaves no temporary output file behind.
    absl::Status s = comparer ? comparer->Begin(header) : absl::OkStatus();
    if (s.ok() && file) s = file->Begin(header);
    return s;
  };
  sink.on_chunk = [&](int64_t, absl::Span<const uint8_t> data) {
    if (progress) progress->Add(static_cast<int64_t>(data.size()));
    absl::Status s = file ? file->Write(data) : absl::OkStatus();
    if (s.ok() && comparer) s = comparer->Add(data);
    return s;
  };
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<v1::DequantizeHeader> header =
      !options.shm.empty() ? DequantizeThroughShm(client, options.shm, request, sink)
      : streams > 0
          ? FetchRangesInto(client, more, request, total_bytes, streams, file.get(), progress.get())
          : client.Dequantize(request, sink);
  if (!header.ok()) return header.status();
  if (file) {
    status = file->Finish();
    if (!status.ok()) return status;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (progress) progress->Finish();

  const int64_t bytes = header->total_bytes();
  out << absl::StrFormat(
      "%s: shape (%s) %s, %d bytes in %.3f ms (%.1f MB/s), backend %s%s", label,
      absl::StrJoin(header->shape(), ", "), OutputDTypeName(header->dtype()), bytes, seconds * 1e3,
      seconds > 0 ? bytes / seconds / 1e6 : 0.0, header->backend(),
      header->kernel().empty() ? "" : absl::StrCat(", kernel ", header->kernel()));
  if (!options.shm.empty()) {
    out << ", through shared-memory region " << options.shm;
  } else if (streams > 1) {
    out << ", " << streams << " streams";
  }
  if (file) out << " -> " << options.out << " (" << file->kind() << ")";
  out << '\n';
  if (comparer) {
    const ErrorStats e = comparer->Stats();
    out << absl::StrFormat(
        "error vs %s%s: max_abs %.6g, rms %.6g, relative_rms %.6g over %d elements",
        comparer->reference(), comparer->transposed() ? " (N, K) transposed" : "", e.max_abs_error,
        e.rms_error, e.relative_rms_error, e.count);
    if (e.nonfinite > 0) out << "; " << e.nonfinite << " non-finite in both, equal";
    if (e.nonfinite_mismatches > 0) {
      out << "; " << e.nonfinite_mismatches
          << " MISMATCHED: non-finite on one side only, or a different NaN / infinity";
    }
    out << '\n';
  }
  return absl::OkStatus();
}

}  // namespace dequantd
