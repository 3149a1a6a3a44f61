// Parallel, resumable range fetching (see ranged_fetch.h).
#include "client/ranged_fetch.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dequantd {
namespace {

// A broken transport, worth asking again from the last byte: the server went away or restarted
// (UNAVAILABLE), the connection was reset mid-stream (INTERNAL, CANCELLED from gRPC itself).
bool IsBrokenStream(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kInternal ||
         code == absl::StatusCode::kCancelled;
}

// The first header of a fetch, shared by its streams: the first one to arrive is checked against
// the expected size and handed to the sink; the others must agree with it.
class SharedHeader {
 public:
  SharedHeader(int64_t total_bytes, const RangeSink& sink)
      : total_bytes_(total_bytes), sink_(sink) {}

  absl::Status Accept(const v1::DequantizeHeader& header) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!first_) {
      if (header.total_bytes() != total_bytes_) {
        return absl::DataLossError(absl::StrCat("the result has ", header.total_bytes(),
                                                " bytes, the fetch expected ", total_bytes_));
      }
      first_ = header;
      return sink_.on_header ? sink_.on_header(header) : absl::OkStatus();
    }
    if (header.total_bytes() != first_->total_bytes() || header.dtype() != first_->dtype() ||
        header.shape_size() != first_->shape_size() ||
        !std::equal(header.shape().begin(), header.shape().end(), first_->shape().begin())) {
      return absl::DataLossError("two range streams of one result sent different headers");
    }
    return absl::OkStatus();
  }
  v1::DequantizeHeader header() const {
    std::lock_guard<std::mutex> lock(mu_);
    return first_.value_or(v1::DequantizeHeader());
  }

 private:
  const int64_t total_bytes_;
  const RangeSink& sink_;
  mutable std::mutex mu_;
  std::optional<v1::DequantizeHeader> first_;
};

}  // namespace

double RetryOptions::DelayBefore(int retry) const {
  double delay = retry_delay_seconds;
  for (int r = 1; r < retry && delay < kMaxRetryDelaySeconds; ++r) delay *= 2;
  return std::min(delay, kMaxRetryDelaySeconds);
}

namespace {

// Fetches [begin, end) of the result into the sink, re-requesting from the last byte received
// after a broken stream, up to retry.max_retries times.
absl::Status FetchRange(DequantClient& client, v1::DequantizeRequest request, int64_t begin,
                        int64_t end, const RangeSink& sink, SharedHeader& header,
                        const RetryOptions& retry) {
  int64_t next = begin;  // the first byte not received yet
  absl::Status last;
  for (int attempt = 0; attempt <= retry.max_retries; ++attempt) {
    if (attempt > 0 && retry.retry_delay_seconds > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double>(retry.DelayBefore(attempt)));
    }
    request.set_offset(next);
    request.set_length(end - next);
    bool local_error = false;  // a callback failed: ours, not the transport's
    DequantizeSink stream_sink;
    stream_sink.on_header = [&](const v1::DequantizeHeader& h) {
      absl::Status s = header.Accept(h);
      local_error = !s.ok();
      return s;
    };
    stream_sink.on_chunk = [&](int64_t offset, absl::Span<const uint8_t> data) {
      absl::Status s = sink.write_at(offset, data);
      if (s.ok()) next = offset + static_cast<int64_t>(data.size());
      local_error = !s.ok();
      return s;
    };
    absl::StatusOr<v1::DequantizeHeader> result = client.Dequantize(request, stream_sink);
    if (result.ok()) return absl::OkStatus();
    last = result.status();
    if (local_error || !IsBrokenStream(last.code())) return last;
  }
  return absl::Status(last.code(),
                      absl::StrCat("range [", begin, ", ", end, "): stream broke at byte ", next,
                                   " after ", retry.max_retries, " re-requests: ", last.message()));
}

// Runs job(i) for i in [0, n) on n threads (the last on the calling thread); returns the first
// non-OK status by index.
absl::Status RunAll(size_t n, const std::function<absl::Status(size_t)>& job) {
  std::vector<absl::Status> statuses(n);
  std::vector<std::thread> threads;
  for (size_t i = 0; i + 1 < n; ++i) threads.emplace_back([&, i] { statuses[i] = job(i); });
  if (n > 0) statuses[n - 1] = job(n - 1);
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

int DefaultStreams(int64_t total_bytes) {
  return total_bytes >= kParallelThresholdBytes ? kDefaultParallelStreams : 1;
}

std::vector<std::pair<int64_t, int64_t>> SplitRanges(int64_t total_bytes, int streams) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  if (total_bytes <= 0) return ranges;
  const int64_t n = std::max(1, streams);
  int64_t step = (total_bytes + n - 1) / n;
  step = (step + kRangeAlignmentBytes - 1) / kRangeAlignmentBytes * kRangeAlignmentBytes;
  for (int64_t begin = 0; begin < total_bytes; begin += step) {
    ranges.emplace_back(begin, std::min(total_bytes, begin + step));
  }
  return ranges;
}

std::vector<std::vector<size_t>> SplitLayers(const std::vector<int64_t>& bytes, int streams) {
  const size_t n = std::min(bytes.size(), static_cast<size_t>(std::max(1, streams)));
  std::vector<std::vector<size_t>> subsets(n);
  std::vector<int64_t> load(n, 0);
  std::vector<size_t> order(bytes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });
  for (size_t layer : order) {
    const size_t target =
        static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    subsets[target].push_back(layer);
    load[target] += bytes[layer];
  }
  for (std::vector<size_t>& subset : subsets) std::sort(subset.begin(), subset.end());
  return subsets;
}

absl::StatusOr<int64_t> ResultBytes(DequantClient& client, const v1::DequantizeRequest& request) {
  const v1::DType dtype =
      request.output_dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_FP16 : request.output_dtype();
  const int64_t element_bytes = dtype == v1::DTYPE_INT32 ? 0 : OutputDTypeBytes(dtype);
  if (element_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("output dtype ", OutputDTypeName(dtype), " is not fp16, bf16 or fp32"));
  }
  if (request.has_packed()) {
    return std::max<int64_t>(1, request.packed().experts()) * request.packed().in_features() *
           request.packed().out_features() * element_bytes;
  }
  if (request.tensor().empty()) return absl::InvalidArgumentError("the request names no tensor");
  absl::StatusOr<v1::ListTensorsResponse> list = client.ListTensors();
  if (!list.ok()) return list.status();
  for (const v1::QuantizedTensorInfo& info : list->tensors()) {
    if (info.name() == request.tensor()) {
      return std::max<int64_t>(1, info.experts()) * info.in_features() * info.out_features() *
             element_bytes;
    }
  }
  return absl::NotFoundError(
      absl::StrCat("tensor \"", request.tensor(), "\" is not listed by the server"));
}

absl::StatusOr<v1::DequantizeHeader> FetchRanges(absl::Span<DequantClient* const> clients,
                                                 const v1::DequantizeRequest& request,
                                                 int64_t total_bytes, int streams,
                                                 const RangeSink& sink, const RetryOptions& retry) {
  if (clients.empty()) return absl::InvalidArgumentError("FetchRanges: no client");
  const std::vector<std::pair<int64_t, int64_t>> ranges =
      SplitRanges(total_bytes, std::clamp(streams, 1, kMaxStreams));
  SharedHeader header(total_bytes, sink);
  absl::Status status = RunAll(ranges.size(), [&](size_t i) {
    return FetchRange(*clients[i % clients.size()], request, ranges[i].first, ranges[i].second,
                      sink, header, retry);
  });
  if (!status.ok()) return status;
  return header.header();
}

absl::StatusOr<std::unique_ptr<ParallelClient>> ParallelClient::Connect(
    const std::string& target, const ClientOptions& options, int connections) {
  if (connections < 1 || connections > kMaxStreams) {
    return absl::InvalidArgumentError(
        absl::StrCat("connections must be in 1..", kMaxStreams, ", got ", connections));
  }
  auto parallel = std::make_unique<ParallelClient>();
  for (int i = 0; i < connections; ++i) {
    absl::StatusOr<std::unique_ptr<DequantClient>> client =
        DequantClient::Connect(target, options, i + 1);
    if (!client.ok()) return client.status();
    parallel->pointers_.push_back(client->get());
    parallel->clients_.push_back(*std::move(client));
  }
  return parallel;
}

absl::StatusOr<v1::DequantizeHeader> ParallelClient::DequantizeInto(
    const v1::DequantizeRequest& request, absl::Span<uint8_t> out, int streams,
    const RetryOptions& retry) {
  RangeSink sink;
  sink.write_at = [out](int64_t offset, absl::Span<const uint8_t> data) {
    if (offset < 0 ||
        offset + static_cast<int64_t>(data.size()) > static_cast<int64_t>(out.size())) {
      return absl::DataLossError(absl::StrCat("bytes [", offset, ", ", offset + data.size(),
                                              ") outside the buffer of ", out.size()));
    }
    std::copy(data.begin(), data.end(), out.begin() + offset);
    return absl::OkStatus();
  };
  const int64_t total = static_cast<int64_t>(out.size());
  return FetchRanges(pointers_, request, total, streams == 0 ? DefaultStreams(total) : streams,
                     sink, retry);
}

absl::StatusOr<DequantizedTensor> ParallelClient::DequantizeToMemory(
    const v1::DequantizeRequest& request, int streams, const RetryOptions& retry) {
  absl::StatusOr<int64_t> total = ResultBytes(*clients_.front(), request);
  if (!total.ok()) return total.status();
  DequantizedTensor result;
  result.data.resize(static_cast<size_t>(*total));
  absl::StatusOr<v1::DequantizeHeader> header =
      DequantizeInto(request, absl::MakeSpan(result.data), streams, retry);
  if (!header.ok()) return header.status();
  result.header = *std::move(header);
  return result;
}

absl::StatusOr<std::vector<v1::DequantizeHeader>> FetchLayerSubsets(
    absl::Span<DequantClient* const> clients, const v1::DequantizeLayersRequest& request,
    const std::vector<std::vector<std::string>>& subsets,
    const std::function<LayersSink(size_t subset)>& make_sink) {
  if (clients.empty()) return absl::InvalidArgumentError("FetchLayerSubsets: no client");
  std::vector<LayersSink> sinks;
  for (size_t i = 0; i < subsets.size(); ++i) sinks.push_back(make_sink(i));
  std::vector<std::vector<v1::DequantizeHeader>> headers(subsets.size());
  absl::Status status = RunAll(subsets.size(), [&](size_t i) -> absl::Status {
    v1::DequantizeLayersRequest subset = request;
    subset.clear_tensors();
    for (const std::string& name : subsets[i]) subset.add_tensors(name);
    absl::StatusOr<std::vector<v1::DequantizeHeader>> h =
        clients[i % clients.size()]->DequantizeLayers(subset, sinks[i]);
    if (!h.ok()) return h.status();
    headers[i] = *std::move(h);
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  std::vector<v1::DequantizeHeader> all;
  for (std::vector<v1::DequantizeHeader>& h : headers) {
    for (v1::DequantizeHeader& header : h) all.push_back(std::move(header));
  }
  return all;
}

}  // namespace dequantd
