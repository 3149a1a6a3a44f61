// Whole-model rows of the end-to-end benchmark (see model_rows.h).
#include "bench/e2e/model_rows.h"
#include "bench/e2e/clock.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/e2e/thread_profile.h"
#include "client/commands.h"
#include "client/ranged_fetch.h"
#include "formats/atomic_file.h"
#include "formats/safetensors.h"

namespace dequantd::e2e {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

// The model's layout in one buffer: layer i's fp16 result at offsets[i], sizes[i] bytes.
struct Layout {
  std::vector<int64_t> offsets, sizes;
  std::map<std::string, size_t> index;  // by name
  int64_t total = 0;
};

Layout LayoutOf(const SyntheticModel& model) {
  Layout layout;
  for (size_t i = 0; i < model.names.size(); ++i) {
    const int64_t bytes = model.distinct[model.data_of[i]].shape.output_bytes(DType::kF16);
    layout.offsets.push_back(layout.total);
    layout.sizes.push_back(bytes);
    layout.index[model.names[i]] = i;
    layout.total += bytes;
  }
  return layout;
}

// Every layer of `buffer` equal to its reference.
bool BufferCorrect(const SyntheticModel& model, const std::vector<std::vector<uint8_t>>& reference,
                   const Layout& layout, const std::vector<uint8_t>& buffer) {
  for (size_t i = 0; i < model.names.size(); ++i) {
    const std::vector<uint8_t>& want = reference[model.data_of[i]];
    if (static_cast<int64_t>(want.size()) != layout.sizes[i] ||
        std::memcmp(buffer.data() + layout.offsets[i], want.data(), want.size()) != 0) {
      return false;
    }
  }
  return true;
}

// Profiles the server and this process around `run`, which returns its own error.
class Profiler {
 public:
  explicit Profiler(pid_t server) : server_(server) {
    server_before_ = SnapshotThreads(server_);
    client_before_ = SnapshotThreads(::getpid());
    start_ = Clock::now();
  }
  std::string Finish() {
    const double wall = Seconds(start_);
    const ThreadSnapshot client_after = SnapshotThreads(::getpid());
    const ThreadSnapshot server_after = SnapshotThreads(server_);
    return FormatProfile({{"dequantd", Usage(server_before_, server_after)},
                          {"client (bench)", Usage(client_before_, client_after)}},
                         wall);
  }

 private:
  pid_t server_;
  ThreadSnapshot server_before_, client_before_;
  Clock::time_point start_;
};

// Where a fetch puts each layer's bytes: `into(stream, layer)` is the destination of `layer`'s
// result arriving on `stream` (layout.sizes[layer] bytes); `done(stream, layer)`, when set, runs
// once that layer's last byte has arrived (a stream's layers arrive one after another).
struct Destination {
  std::function<uint8_t*(size_t stream, size_t layer)> into;
  std::function<absl::Status(size_t stream, size_t layer)> done;
};

// DequantizeLayers of every layer over `streams` streams into `dest`.
absl::Status FetchModel(ParallelClient& clients, const SyntheticModel& model, const Layout& layout,
                        int streams, const Destination& dest) {
  const std::vector<std::vector<size_t>> split = SplitLayers(layout.sizes, streams);
  std::vector<std::vector<std::string>> subsets;
  for (const std::vector<size_t>& subset : split) {
    subsets.emplace_back();
    for (size_t i : subset) subsets.back().push_back(model.names[i]);
  }
  v1::DequantizeLayersRequest request;
  request.set_output_dtype(v1::DTYPE_FP16);
  std::vector<size_t> current(subsets.size(), 0);
  std::vector<int64_t> received(subsets.size(), 0);
  absl::StatusOr<std::vector<v1::DequantizeHeader>> headers =
      FetchLayerSubsets(clients.clients(), request, subsets, [&](size_t stream) {
        LayersSink sink;
        sink.on_header = [&, stream](const v1::DequantizeHeader& header) -> absl::Status {
          auto it = layout.index.find(header.tensor());
          if (it == layout.index.end() || header.total_bytes() != layout.sizes[it->second]) {
            return absl::DataLossError(absl::StrCat("unexpected layer ", header.tensor()));
          }
          current[stream] = it->second;
          received[stream] = 0;
          return absl::OkStatus();
        };
        sink.on_chunk = [&, stream](int64_t offset, absl::Span<const uint8_t> data) {
          const size_t layer = current[stream];
          if (offset < 0 || offset + static_cast<int64_t>(data.size()) > layout.sizes[layer]) {
            return absl::DataLossError("a chunk past its layer's end");
          }
          std::memcpy(dest.into(stream, layer) + offset, data.data(), data.size());
          received[stream] += static_cast<int64_t>(data.size());
          if (dest.done && received[stream] == layout.sizes[layer]) return dest.done(stream, layer);
          return absl::OkStatus();
        };
        return sink;
      });
  if (!headers.ok()) return headers.status();
  if (headers->size() != model.names.size()) {
    return absl::DataLossError(
        absl::StrCat(headers->size(), " layers arrived of ", model.names.size()));
  }
  return absl::OkStatus();
}

// One memory row: a warm-up fetch, then options.trials timed ones, each into `dest`; `correct`
// (run after the warm-up and after the last trial) says whether the bytes were right.
ModelRow TimeFetches(const SyntheticModel& model, const Layout& layout,
                     const ModelRowsOptions& options, int streams, const std::string& what,
                     const Destination& warm_up, const Destination& timed,
                     const std::function<bool()>& correct) {
  ModelRow row;
  row.what = what;
  row.transport = options.transport;
  row.streams = streams;
  row.bytes = layout.total;
  row.ceiling_gbps = options.stream_ceiling ? options.stream_ceiling(streams) : 0;
  ClientOptions client_options;
  client_options.deadline_seconds = 600;
  absl::StatusOr<std::unique_ptr<ParallelClient>> clients =
      ParallelClient::Connect(options.target, client_options, streams);
  if (!clients.ok()) {
    row.error = clients.status().ToString();
    return row;
  }
  if (absl::Status s = FetchModel(**clients, model, layout, streams, warm_up); !s.ok()) {
    row.error = s.ToString();
    return row;
  }
  row.correct = correct();
  std::vector<double> times;
  Profiler profiler(options.server_pid);
  for (int t = 0; t < options.trials; ++t) {
    const Clock::time_point start = Clock::now();
    if (absl::Status s = FetchModel(**clients, model, layout, streams, timed); !s.ok()) {
      row.error = s.ToString();
      break;
    }
    times.push_back(Seconds(start));
  }
  row.profile = profiler.Finish();
  row.correct = row.correct && correct();
  row.p50 = Median(times);
  row.gbps = row.p50 > 0 ? static_cast<double>(row.bytes) / row.p50 / 1e9 : 0;
  return row;
}

// Every layer into its place in `buffer` (the whole model), checked after the warm-up and after
// the last trial.
ModelRow MemoryRow(const SyntheticModel& model, const std::vector<std::vector<uint8_t>>& reference,
                   const Layout& layout, std::vector<uint8_t>& buffer,
                   const ModelRowsOptions& options, int streams) {
  std::fill(buffer.begin(), buffer.end(), 0);
  Destination dest;
  dest.into = [&](size_t, size_t layer) { return buffer.data() + layout.offsets[layer]; };
  return TimeFetches(model, layout, options, streams, "DequantizeLayers -> client memory", dest,
                     dest, [&] { return BufferCorrect(model, reference, layout, buffer); });
}

// Models larger than host memory: each stream receives into one buffer of the largest layer,
// reused for every layer it gets. In the warm-up every layer is compared with its reference the
// moment its last byte arrives (every byte checked); the timed fetches only receive.
ModelRow ReusedMemoryRow(const SyntheticModel& model,
                         const std::vector<std::vector<uint8_t>>& reference, const Layout& layout,
                         const ModelRowsOptions& options, int streams) {
  const int64_t largest = *std::max_element(layout.sizes.begin(), layout.sizes.end());
  std::vector<std::vector<uint8_t>> buffers(static_cast<size_t>(streams),
                                            std::vector<uint8_t>(static_cast<size_t>(largest), 0));
  std::atomic<int64_t> wrong{0}, checked{0};
  Destination timed;
  timed.into = [&](size_t stream, size_t) { return buffers[stream].data(); };
  Destination warm_up = timed;
  warm_up.done = [&](size_t stream, size_t layer) {
    const std::vector<uint8_t>& want = reference[model.data_of[layer]];
    if (std::memcmp(buffers[stream].data(), want.data(), want.size()) != 0) ++wrong;
    std::fill_n(buffers[stream].begin(), want.size(), uint8_t{0});  // the next layer's bytes
    ++checked;
    return absl::OkStatus();
  };
  return TimeFetches(
      model, layout, options, streams,
      "DequantizeLayers -> client memory (one reused buffer per stream)", warm_up, timed, [&] {
        return wrong.load() == 0 && checked.load() == static_cast<int64_t>(model.names.size());
      });
}

// Writes `data` to a new file `path` with `threads` threads (1: write() in order; more: disjoint
// parts at offsets, through pwrite or, `mapped`, as dequantctl writes its files:
// formats::AtomicFileWriter with MapForWrites and as many prefault threads, WriteAt in 16 MiB
// pieces), then fsync and close.
// Returns seconds, or -1 on an I/O error.
double WriteFileTimed(const std::string& path, const std::vector<uint8_t>& data, int threads,
                      bool mapped) {
  const Clock::time_point start = Clock::now();
  absl::StatusOr<formats::AtomicFileWriter> file = formats::AtomicFileWriter::Create(path);
  if (!file.ok()) return -1;
  const int64_t total = static_cast<int64_t>(data.size());
  if (mapped && !file->MapForWrites(total, threads).ok()) return -1;
  const int64_t piece = mapped ? int64_t{16} << 20 : int64_t{64} << 20;
  const int64_t part = (total / threads + 4095) / 4096 * 4096;
  std::vector<std::thread> pool;
  std::atomic<bool> ok{true};
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const int64_t begin = std::min(total, t * part);
      const int64_t end = t + 1 == threads ? total : std::min(total, begin + part);
      for (int64_t at = begin; at < end && ok; at += piece) {
        const auto bytes =
            absl::MakeConstSpan(data.data() + at, static_cast<size_t>(std::min(piece, end - at)));
        if (!(threads == 1 && !mapped ? file->Write(bytes) : file->WriteAt(at, bytes)).ok()) {
          ok = false;
        }
      }
    });
  }
  for (std::thread& t : pool) t.join();
  const bool committed = ok && file->Commit().ok();
  const double seconds = Seconds(start);
  std::filesystem::remove(path);
  return committed ? seconds : -1;
}

ModelRow FileSystemRow(const std::vector<uint8_t>& buffer, const ModelRowsOptions& options,
                       int threads, bool mapped) {
  ModelRow row;
  row.what =
      threads == 1 && !mapped
          ? std::string("file system ceiling: write, 1 thread")
          : absl::StrCat("file system ceiling: ", mapped ? "mapped (dequantctl's)" : "pwrite", ", ",
                         threads, " threads");
  row.streams = threads;
  row.bytes = static_cast<int64_t>(buffer.size());
  std::vector<double> times;
  for (int t = 0; t < options.trials; ++t) {
    const double s =
        WriteFileTimed(absl::StrCat(options.out_dir, "/e2e_fs_ceiling.", ::getpid(), ".bin"),
                       buffer, threads, mapped);
    if (s < 0) {
      row.error = absl::StrCat("writing into ", options.out_dir, " failed");
      return row;
    }
    times.push_back(s);
  }
  row.p50 = Median(times);
  row.gbps = row.p50 > 0 ? static_cast<double>(row.bytes) / row.p50 / 1e9 : 0;
  return row;
}

// The safetensors file dequantctl wrote: every layer's tensor equal to its reference.
std::string CheckSafetensors(const std::string& path, const SyntheticModel& model,
                             const std::vector<std::vector<uint8_t>>& reference) {
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> file =
      safetensors::MappedFile::Open(path);
  if (!file.ok()) return file.status().ToString();
  for (size_t i = 0; i < model.names.size(); ++i) {
    absl::StatusOr<absl::Span<const uint8_t>> bytes = (*file)->TensorBytes(model.names[i]);
    if (!bytes.ok()) return bytes.status().ToString();
    const std::vector<uint8_t>& want = reference[model.data_of[i]];
    if (bytes->size() != want.size() || std::memcmp(bytes->data(), want.data(), want.size()) != 0 ||
        (*file)->header().tensors.at(model.names[i]).dtype != "F16") {
      return absl::StrCat("layer ", model.names[i], " differs");
    }
  }
  if ((*file)->header().tensors.size() != model.names.size()) return "extra tensors in the file";
  return "";
}

ModelRow DequantctlRow(const SyntheticModel& model,
                       const std::vector<std::vector<uint8_t>>& reference, int64_t bytes,
                       const ModelRowsOptions& options, int streams, double fs_ceiling) {
  ModelRow row;
  row.what = "dequantctl dequantize-layers --out x.safetensors";
  row.transport = options.transport;
  row.streams = streams;
  row.bytes = bytes;
  row.ceiling_gbps = fs_ceiling;
  const std::string path = absl::StrCat(options.out_dir, "/e2e_model.", ::getpid(), ".safetensors");
  DequantizeLayersOptions layers;
  layers.out = path;
  layers.streams = streams;
  layers.tensors = absl::StrJoin(model.names, ",");  // the checkpoint holds other layers too
  ClientOptions client_options;
  client_options.deadline_seconds = 600;
  const ClientFactory more = [&](int connection) {
    return DequantClient::Connect(options.target, client_options, connection);
  };
  std::vector<double> times;
  Profiler profiler(options.server_pid);
  for (int t = 0; t < options.trials; ++t) {
    // A new file each time, as the file system rows write (replacing the last trial's file would
    // time the kernel freeing its pages inside the rename: about 1 s per 14 GB on tmpfs).
    std::filesystem::remove(path);
    // As dequantctl does: a fresh client (and connections) per command.
    absl::StatusOr<std::unique_ptr<DequantClient>> client =
        DequantClient::Connect(options.target, client_options);
    if (!client.ok()) {
      row.error = client.status().ToString();
      break;
    }
    std::ostringstream out;
    const Clock::time_point start = Clock::now();
    if (absl::Status s = RunDequantizeLayers(**client, layers, out, more); !s.ok()) {
      row.error = s.ToString();
      break;
    }
    times.push_back(Seconds(start));
  }
  row.profile = profiler.Finish();
  if (row.error.empty()) {
    const std::string wrong = CheckSafetensors(path, model, reference);
    row.correct = wrong.empty();
    if (!wrong.empty()) row.error = wrong;
  }
  std::filesystem::remove(path);
  row.p50 = Median(times);
  row.gbps = row.p50 > 0 ? static_cast<double>(row.bytes) / row.p50 / 1e9 : 0;
  return row;
}

}  // namespace

std::vector<ModelRow> MeasureModel(const SyntheticModel& model,
                                   const std::vector<std::vector<uint8_t>>& reference,
                                   const ModelRowsOptions& options) {
  const Layout layout = LayoutOf(model);
  std::vector<ModelRow> rows;
  if (options.reused_buffer) {
    for (int streams : options.streams) {
      rows.push_back(ReusedMemoryRow(model, reference, layout, options, streams));
    }
    return rows;
  }
  std::vector<uint8_t> buffer(static_cast<size_t>(layout.total), 0);
  for (int streams : options.streams) {
    rows.push_back(MemoryRow(model, reference, layout, buffer, options, streams));
  }
  if (!options.file_rows) return rows;
  double fs_ceiling = 0;
  std::vector<int> writers = {1};
  const int most = *std::max_element(options.streams.begin(), options.streams.end());
  if (most > 1) writers.push_back(most);
  for (int threads : writers) {
    rows.push_back(FileSystemRow(buffer, options, threads, /*mapped=*/false));
  }
  // The ceiling of dequantctl's rows: the file system taking the same pattern (mapped, as many
  // writers as the most streams), measured here.
  for (int threads : writers) {
    rows.push_back(FileSystemRow(buffer, options, threads, /*mapped=*/true));
    fs_ceiling = std::max(fs_ceiling, rows.back().gbps);
  }
  for (int streams : options.streams) {
    rows.push_back(DequantctlRow(model, reference, layout.total, options, streams, fs_ceiling));
  }
  return rows;
}

std::string FormatModelRows(const std::vector<ModelRow>& rows) {
  std::string out =
      "| path | transport | streams | GB | p50 s | GB/s | ceiling GB/s | fraction | correct |\n"
      "|---|---|---:|---:|---:|---:|---:|---:|---|\n";
  for (const ModelRow& r : rows) {
    absl::StrAppend(
        &out,
        absl::StrFormat(
            "| %s | %s | %d | %.2f | %.3f | %.2f | %s | %s | %s |\n", r.what,
            r.transport.empty() ? "-" : r.transport, r.streams, r.bytes / 1e9, r.p50, r.gbps,
            r.ceiling_gbps > 0 ? absl::StrFormat("%.2f", r.ceiling_gbps) : "-",
            r.ceiling_gbps > 0 ? absl::StrFormat("%.0f%%", 100 * r.gbps / r.ceiling_gbps) : "-",
            r.error.empty() ? (r.correct ? "yes" : "NO") : "ERROR " + r.error));
  }
  for (const ModelRow& r : rows) {
    if (r.profile.empty()) continue;
    absl::StrAppend(&out, "\nper-thread CPU, ", r.what, ", ", r.transport, ", ", r.streams,
                    " streams (the timed repetitions)\n\n", r.profile);
  }
  return out;
}

}  // namespace dequantd::e2e
