// The shared-memory rows of the end-to-end benchmark (see region_rows.h).
#include "bench/e2e/region_rows.h"
#include "bench/e2e/clock.h"

#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/e2e/dequantd_process.h"
#include "bench/e2e/device_copy.h"
#include "bench/e2e/device_region.h"
#include "client/client.h"
#include "client/shm_client.h"
#include "kernels/dequant.h"
#include "tests/hardening/process_stats.h"

namespace dequantd::e2e {
namespace {

// A TCP port on 127.0.0.1 that was free a moment ago (0 if none could be found).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// The sum of every sample of metric `name` (e.g. "dequantd_kernel_duration_seconds_sum") whose
// label set contains `label` (e.g. `stage="kernel"`; empty: every sample) in a Prometheus text
// body.
double MetricSum(const std::string& body, const std::string& name, const std::string& label) {
  std::istringstream in(body);
  std::string line;
  double sum = 0;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    const char next = line[name.size()];
    if (next != '{' && next != ' ') continue;
    const size_t space = line.rfind(' ');
    if (!label.empty() && line.substr(0, space).find(label) == std::string::npos) continue;
    sum += std::atof(line.c_str() + space + 1);
  }
  return sum;
}

// What dequantd's metrics say about the calls between two scrapes: seconds summed over the calls.
struct ServerAccount {
  double calls = 0;         // RPCs of the method finished OK
  double handler = 0;       // their wall time in the handler (dequantd_rpc_duration_seconds)
  double queue = 0;         // waiting for a request slot
  double kernel = 0;        // kernel(s), CUDA events around the launches
  double d2h = 0;           // copies out of the result buffers (device-to-host or into the region)
  double send = 0;          // the sink's Writes (progress reports for a region)
  double kernel_bytes = 0;  // bytes the kernels read + wrote

  static ServerAccount Scrape(int port, const std::string& method) {
    const std::string body = testing::HttpGet(port, "/metrics");
    const std::string rpc = absl::StrCat("code=\"OK\",method=\"", method, "\"");
    const std::string stage = "dequantd_dequantize_stage_duration_seconds_sum";
    ServerAccount a;
    a.calls = MetricSum(body, "dequantd_rpc_duration_seconds_count", rpc);
    a.handler = MetricSum(body, "dequantd_rpc_duration_seconds_sum", rpc);
    a.queue = MetricSum(body, stage, "stage=\"queue_wait\"");
    a.kernel = MetricSum(body, stage, "stage=\"kernel\"");
    a.d2h = MetricSum(body, stage, "stage=\"device_to_host\"");
    a.send = MetricSum(body, stage, "stage=\"send\"");
    a.kernel_bytes = MetricSum(body, "dequantd_kernel_read_bytes_total", "") +
                     MetricSum(body, "dequantd_kernel_written_bytes_total", "");
    return a;
  }
  // Per call, from `before` to this.
  ServerAccount PerCallSince(const ServerAccount& before) const {
    const double n = calls - before.calls;
    if (n <= 0) return {};
    return {.calls = n,
            .handler = (handler - before.handler) / n,
            .queue = (queue - before.queue) / n,
            .kernel = (kernel - before.kernel) / n,
            .d2h = (d2h - before.d2h) / n,
            .send = (send - before.send) / n,
            .kernel_bytes = (kernel_bytes - before.kernel_bytes) / n};
  }
};

// A layer of the served checkpoint: its name there and its packed data (layers of a
// SyntheticModel share the data of one block).
struct NamedLayer {
  std::string name;
  const SyntheticLayer* data = nullptr;
};

// One workload: a Dequantize of one layer, or a DequantizeLayers of a list, into a region.
struct Workload {
  std::string what;
  std::vector<NamedLayer> layers;  // one: Dequantize; several: DequantizeLayers
  int64_t bytes = 0;               // fp16 output of all of them
  // DequantizeLayers with an empty list: every layer of the checkpoint (`layers` are all of
  // them, in the checkpoint's order), the request a whole-model load sends.
  bool every_layer = false;
  // DequantizeLayers asking for REGION_REPLY_SUMMARY (issue 23): the reply is the counts alone,
  // not one header per layer.
  bool summary = false;

  std::string method() const {
    return layers.size() == 1 && !every_layer ? "Dequantize" : "DequantizeLayers";
  }
};

// The destination of a row: its region's name, how to poison it and how to read it back.
struct Destination {
  std::string kind;  // "host region" or "device region"
  std::string region;
  std::function<absl::Status()> poison;
  std::function<absl::Status(int64_t offset, absl::Span<uint8_t> out)> read;
};

struct Row {
  Row(std::string destination_, std::string what_, int64_t bytes_)
      : destination(std::move(destination_)), what(std::move(what_)), bytes(bytes_) {}
  std::string destination, what;
  int64_t bytes = 0;
  double p50 = 0, p99 = 0;  // seconds per call, as the client sees it
  double mean = 0;          // seconds per call, mean (beside the server's means)
  std::string ceiling;      // the ceiling's name
  double ceiling_bps = 0;   // its bytes per second (output bytes)
  ServerAccount server;     // per call
  double copy_bps = 0;      // device copy, bytes copied per second (for kernel / copy)
  bool correct = true;
  std::string error;
};

// Compares the region's bytes with the CPU reference, layer by layer.
absl::Status Check(const Workload& w, const Destination& d) {
  int64_t offset = 0;
  std::vector<uint8_t> got, want;
  for (const NamedLayer& named : w.layers) {
    const SyntheticLayer* layer = named.data;
    const int64_t bytes = layer->shape.output_bytes(DType::kF16);
    got.resize(static_cast<size_t>(bytes));
    want.resize(static_cast<size_t>(bytes));
    if (absl::Status s = d.read(offset, absl::MakeSpan(got)); !s.ok()) return s;
    if (absl::Status s = DequantizeCpu(layer->view(), DType::kF16, 0, layer->shape.K, want.data());
        !s.ok()) {
      return s;
    }
    if (got != want) {
      return absl::DataLossError(absl::StrCat(d.kind, ": layer ", named.name, " at offset ", offset,
                                              " differs from the CPU reference"));
    }
    offset += bytes;
  }
  return absl::OkStatus();
}

// Times `trials` calls of `w` into `d` after a warm-up; poisons the region before the last one
// and checks the result after it.
Row Measure(RegionClient& client, int metrics_port, const Workload& w, const Destination& d,
            int trials, int64_t chunk_bytes) {
  Row row(d.kind, w.what, w.bytes);
  v1::DequantizeRequest one;
  v1::DequantizeLayersRequest many;
  for (auto* output : {one.mutable_output_region(), many.mutable_output_region()}) {
    output->set_name(d.region);
  }
  one.set_chunk_bytes(chunk_bytes);
  many.set_chunk_bytes(chunk_bytes);
  if (w.summary) many.set_region_reply(v1::REGION_REPLY_SUMMARY);
  if (w.every_layer) {
    // no names: every layer
  } else if (w.layers.size() == 1) {
    one.set_tensor(w.layers.front().name);
  } else {
    for (const NamedLayer& l : w.layers) many.add_tensors(l.name);
  }
  const auto call = [&]() -> absl::Status {
    if (w.layers.size() == 1 && !w.every_layer) return client.DequantizeInto(one).status();
    if (!w.summary) return client.DequantizeLayersInto(many).status();
    absl::StatusOr<v1::RegionSummary> summary = client.DequantizeLayersIntoSummary(many);
    if (!summary.ok()) return summary.status();
    // The placements are the bench's own (one after another from 0); the counts must agree.
    if (summary->layer_count() != static_cast<int64_t>(w.layers.size()) ||
        summary->total_bytes() != w.bytes) {
      return absl::DataLossError(absl::StrCat("summary of ", summary->layer_count(), " layers, ",
                                              summary->total_bytes(), " bytes; expected ",
                                              w.layers.size(), " layers, ", w.bytes, " bytes"));
    }
    return absl::OkStatus();
  };
  if (absl::Status s = call(); !s.ok()) {
    row.error = s.ToString();
    return row;
  }
  const ServerAccount before = ServerAccount::Scrape(metrics_port, w.method());
  std::vector<double> times;
  for (int t = 0; t < trials; ++t) {
    if (t + 1 == trials) {
      if (absl::Status s = d.poison(); !s.ok()) {
        row.error = s.ToString();
        return row;
      }
    }
    const Clock::time_point start = Clock::now();
    const absl::Status s = call();
    times.push_back(Seconds(start));
    if (!s.ok()) {
      row.error = s.ToString();
      return row;
    }
  }
  row.server = ServerAccount::Scrape(metrics_port, w.method()).PerCallSince(before);
  row.p50 = Percentile(times, 0.5);
  row.p99 = Percentile(times, 0.99);
  for (double t : times) row.mean += t / static_cast<double>(times.size());
  if (absl::Status s = Check(w, d); !s.ok()) {
    row.correct = false;
    row.error = s.ToString();
  }
  return row;
}

// p50 of `calls` empty unary RPCs (SharedMemoryStatus with no region): the transport's floor.
double EmptyRpcSeconds(RegionClient& client, int calls) {
  std::vector<double> times;
  for (int i = 0; i < calls + 10; ++i) {
    const Clock::time_point start = Clock::now();
    if (!client.Status().ok()) return 0;
    if (i >= 10) times.push_back(Seconds(start));
  }
  return Percentile(times, 0.5);
}

// p50 of `calls` server-streaming calls that end at once with a status and no message (a
// Dequantize into a region that is not registered: NOT_FOUND before any work): the floor of the
// call shape a region call uses, beside the unary one.
double EmptyStreamSeconds(RegionClient& client, int calls) {
  dequant::v1::DequantizeRequest request;
  request.set_tensor("absent");
  request.mutable_output_region()->set_name("absent");
  std::vector<double> times;
  for (int i = 0; i < calls + 10; ++i) {
    const Clock::time_point start = Clock::now();
    if (client.DequantizeInto(request).status().code() != absl::StatusCode::kNotFound) return 0;
    if (i >= 10) times.push_back(Seconds(start));
  }
  return Percentile(times, 0.5);
}

std::string Us(double seconds) { return absl::StrFormat("%.0f", seconds * 1e6); }

void PrintRows(const std::vector<Row>& rows, double empty_rpc, double empty_stream,
               std::ostream& out) {
  out << "| destination | result | MB | p50 ms | p99 ms | GB/s | ceiling | ceiling GB/s | fraction "
         "| kernel ms | kernel / device copy | call - kernel us (means) | correct |\n"
      << "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|\n";
  for (const Row& r : rows) {
    const double gbps = r.p50 > 0 ? static_cast<double>(r.bytes) / r.p50 / 1e9 : 0;
    const double kernel_rate = r.server.kernel > 0 ? r.server.kernel_bytes / r.server.kernel : 0;
    out << absl::StrFormat(
        "| %s | %s | %.1f | %.3f | %.3f | %.1f | %s | %.1f | %s | %.3f | %s | %s | %s |\n",
        r.destination, r.what, r.bytes / 1e6, r.p50 * 1e3, r.p99 * 1e3, gbps, r.ceiling,
        r.ceiling_bps / 1e9,
        r.ceiling_bps > 0 ? absl::StrFormat("%.2f", gbps * 1e9 / r.ceiling_bps) : "-",
        r.server.kernel * 1e3,
        r.copy_bps > 0 && kernel_rate > 0 ? absl::StrFormat("%.2f", kernel_rate / (2 * r.copy_bps))
                                          : "-",
        r.server.kernel > 0 ? Us(r.mean - r.server.kernel) : "-",
        r.error.empty() ? (r.correct ? "yes" : "NO") : "ERROR " + r.error);
  }
  out << "\nwhere a call's time goes (means per timed call, us; the server's from its metrics): "
         "client = handler + transport and client; handler = queue_wait + kernel + device_to_host "
         "+ "
         "send + other\n\n"
      << "| destination | result | client | handler | queue_wait | kernel | device_to_host "
         "| send (sink writes) | handler other | transport + client |\n"
      << "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const Row& r : rows) {
    const ServerAccount& s = r.server;
    out << absl::StrFormat("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.destination,
                           r.what, Us(r.mean), Us(s.handler), Us(s.queue), Us(s.kernel), Us(s.d2h),
                           Us(s.send), Us(s.handler - s.queue - s.kernel - s.d2h - s.send),
                           Us(r.mean - s.handler));
  }
  out << absl::StrFormat(
      "\nan empty unary RPC (SharedMemoryStatus) from the same client: p50 %s us; an empty "
      "server-streaming call (Dequantize into an unregistered region: NOT_FOUND, no message): "
      "p50 %s us\n",
      Us(empty_rpc), Us(empty_stream));
}

}  // namespace

bool RunRegionRows(const RegionRowsOptions& options, std::ostream& out) {
  // The model and the workloads.
  SyntheticModel model;
  std::vector<SyntheticLayer> big;
  std::string model_dir = options.sizes_model_dir;
  std::vector<NamedLayer> all;
  NamedLayer single;
  if (options.model == "llama-8b") {
    const Clock::time_point start = Clock::now();
    const int shrink = std::max(1, options.model_shrink);
    model = MakeLlamaShapedModel(/*blocks=*/32, shrink, /*seed=*/8);
    big = MakeLayers({470'000'000 / (int64_t{shrink} * shrink)}, 9);  // 8192 x 28672 unshrunk
    std::vector<std::string> names = model.names;
    std::vector<const SyntheticLayer*> data;
    for (size_t i = 0; i < model.names.size(); ++i) {
      data.push_back(&model.distinct[model.data_of[i]]);
      all.push_back({model.names[i], data.back()});
    }
    names.push_back(big.front().name);
    data.push_back(&big.front());
    single = {big.front().name, &big.front()};
    model_dir = options.work_dir + "/llama-8b";
    if (absl::Status s = WriteCheckpoint(model_dir, names, data); !s.ok()) {
      out << "region rows: cannot write the model: " << s << "\n";
      return false;
    }
    out << absl::StrFormat("region rows: generated the Llama-3-8B-shaped model in %.1f s\n",
                           Seconds(start));
  } else {
    if (options.sizes_layers == nullptr || options.sizes_layers->empty()) return false;
    for (const SyntheticLayer& l : *options.sizes_layers) all.push_back({l.name, &l});
    single = all.back();
  }
  const auto bytes_of = [](const std::vector<NamedLayer>& layers) {
    int64_t bytes = 0;
    for (const NamedLayer& l : layers) bytes += l.data->shape.output_bytes(DType::kF16);
    return bytes;
  };
  const auto label = [](const NamedLayer& l) {
    return absl::StrCat(l.data->shape.K, "x", l.data->shape.N, " layer");
  };
  std::vector<Workload> workloads = {
      {label(single), {single}, 0}, {absl::StrCat("whole model, ", all.size(), " layers"), all, 0}};
  if (options.model == "llama-8b") {
    // The smallest layer: a region call's fixed cost.
    const NamedLayer small =
        *std::min_element(all.begin(), all.end(), [](const NamedLayer& a, const NamedLayer& b) {
          return a.data->shape.output_bytes(DType::kF16) < b.data->shape.output_bytes(DType::kF16);
        });
    workloads.insert(workloads.begin(), {label(small), {small}, 0});
    // The smallest layer once per layer of the model in one DequantizeLayers call: the call's
    // cost per layer (headers, reports, launch setup) beside little work.
    workloads.push_back({absl::StrCat(label(small), " x ", all.size(), " (DequantizeLayers)"),
                         std::vector<NamedLayer>(all.size(), small), 0});
    // The whole checkpoint by an empty list (the model and the 470 MB layer, in checkpoint
    // order: by name): no names to send, parse or look up.
    std::vector<NamedLayer> every = all;
    every.push_back(single);
    std::sort(every.begin(), every.end(),
              [](const NamedLayer& a, const NamedLayer& b) { return a.name < b.name; });
    workloads.push_back({absl::StrCat("every layer (empty list), ", every.size(), " layers"),
                         std::move(every), 0, /*every_layer=*/true});
  }
  // Every DequantizeLayers workload again with the summary reply, right after it (issue 23: the
  // whole-model call without its 224 headers, beside the same call with them).
  for (size_t i = 0; i < workloads.size(); ++i) {
    if (workloads[i].method() != "DequantizeLayers" || workloads[i].summary) continue;
    Workload compact = workloads[i];
    compact.what += ", summary reply";
    compact.summary = true;
    workloads.insert(workloads.begin() + static_cast<std::ptrdiff_t>(i) + 1, std::move(compact));
  }
  for (Workload& w : workloads) w.bytes = bytes_of(w.layers);

  const int metrics_port = FreePort();
  absl::StatusOr<std::unique_ptr<DequantdProcess>> process = DequantdProcess::Start(
      options.dequantd, model_dir, options.backend,
      options.transport == "unix" ? options.work_dir + "/dequantd.regions.sock" : "",
      options.work_dir + "/dequantd.regions.log",
      {"--shared-memory=all", absl::StrCat("--metrics-listen=127.0.0.1:", metrics_port),
       "--max-output-bytes=20000000000", "--shared-memory-max-bytes=40000000000"});
  if (!process.ok()) {
    out << "region rows: " << process.status() << "\n";
    return false;
  }
  ClientOptions client_options;
  client_options.deadline_seconds = 600;
  client_options.region_busy_poll_us = options.busy_poll_us;
  absl::StatusOr<std::unique_ptr<DequantClient>> connected =
      DequantClient::Connect((*process)->target(), client_options);
  if (!connected.ok()) {
    out << "region rows: " << connected.status() << "\n";
    return false;
  }
  RegionClient client((*connected)->channel(), client_options);
  const double empty_rpc = EmptyRpcSeconds(client, 200);
  const double empty_stream = EmptyStreamSeconds(client, 200);
  const bool gpu = (*process)->backend() == "cuda";
  const double copy_bps =
      gpu ? DeviceCopyBytesPerSecond(single.data->shape.output_bytes(DType::kF16)) : 0;

  std::vector<Row> rows;
  for (const Workload& w : workloads) {
    // Host region: a POSIX shared-memory object of this process.
    {
      Row row("host region", w.what, w.bytes);
      absl::StatusOr<std::unique_ptr<ShmObject>> shm =
          ShmObject::Create(absl::StrCat("/dequantd_e2e.", ::getpid()), w.bytes);
      absl::Status s = shm.status();
      if (s.ok()) s = client.RegisterSystem("host", (*shm)->key(), 0, w.bytes).status();
      if (s.ok()) {
        // Both processes hold the object open now: its name can go, so that a killed bench
        // leaves no (up to 14 GB) object behind. (ShmObject's own unlink then finds none.)
        ::shm_unlink((*shm)->key().c_str());
        ShmObject& object = **shm;
        const Destination d{.kind = "host region",
                            .region = "host",
                            .poison =
                                [&] {
                                  std::memset(object.data(), 0xFF,
                                              static_cast<size_t>(object.bytes()));
                                  return absl::OkStatus();
                                },
                            .read =
                                [&](int64_t offset, absl::Span<uint8_t> to) {
                                  std::memcpy(to.data(), object.data() + offset, to.size());
                                  return absl::OkStatus();
                                }};
        row = Measure(client, metrics_port, w, d, options.trials, options.chunk_bytes);
        (void)client.UnregisterSystem("host");
      } else {
        row.error = s.ToString();
      }
      row.ceiling = "pinned D2H";
      row.ceiling_bps = options.pinned_d2h_bytes_per_second;
      rows.push_back(row);
    }
    // Device region: a cudaMalloc buffer of this process, opened by dequantd with CUDA IPC.
    if (gpu) {
      Row row("device region", w.what, w.bytes);
      absl::StatusOr<std::unique_ptr<DeviceRegionBuffer>> buffer =
          DeviceRegionBuffer::Create(w.bytes);
      absl::Status s = buffer.status();
      if (s.ok()) s = client.RegisterCuda("device", (*buffer)->ipc_handle(), 0, 0, w.bytes);
      if (s.ok()) {
        DeviceRegionBuffer& memory = **buffer;
        const Destination d{
            .kind = "device region",
            .region = "device",
            .poison = [&] { return memory.Fill(0xFF); },
            .read = [&](int64_t offset,
                        absl::Span<uint8_t> to) { return memory.CopyToHost(offset, to); }};
        row = Measure(client, metrics_port, w, d, options.trials, options.chunk_bytes);
        (void)client.UnregisterCuda("device");  // before the buffer is freed
      } else {
        row.error = s.ToString();
      }
      row.ceiling = "device copy";
      row.ceiling_bps = copy_bps;
      row.copy_bps = copy_bps;
      rows.push_back(row);
    }
  }

  out << "\nshared-memory regions (issue 9): dequantd --shared-memory=all, backend "
      << (*process)->backend() << ", model " << options.model << ", " << options.trials
      << " timed calls per row after a warm-up; whole call as the C++ client sees it ("
      << (options.transport == "unix" ? "Unix socket" : "TCP 127.0.0.1") << ", region_busy_poll_us "
      << client_options.region_busy_poll_us
      << "); GB = 1e9 "
         "bytes of fp16 output; ceilings of the same run: pinned device-to-host "
      << absl::StrFormat("%.2f", options.pinned_d2h_bytes_per_second / 1e9)
      << " GB/s, device-to-device copy "
      << (copy_bps > 0 ? absl::StrFormat("%.1f GB/s (%.1f GB/s read + written)", copy_bps / 1e9,
                                         2 * copy_bps / 1e9)
                       : std::string("none (no GPU)"))
      << "; kernel / device copy: the kernels' (read + written) bytes/s over the copy's\n\n";
  PrintRows(rows, empty_rpc, empty_stream, out);
  bool ok = true;
  for (const Row& r : rows) ok = ok && r.correct && r.error.empty();
  return ok;
}

}  // namespace dequantd::e2e
