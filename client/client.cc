// DequantClient (see client.h).
#include "client/client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace dequantd {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

absl::Status DataLoss(const std::string& what) {
  return absl::DataLossError(absl::StrCat("Dequantize stream: ", what));
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

int64_t OutputDTypeBytes(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP16:
    case v1::DTYPE_BF16:
      return 2;
    case v1::DTYPE_FP32:
    case v1::DTYPE_INT32:
      return 4;
    default:
      return 0;
  }
}

std::string OutputDTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP16:
      return "fp16";
    case v1::DTYPE_BF16:
      return "bf16";
    case v1::DTYPE_FP32:
      return "fp32";
    case v1::DTYPE_INT32:
      return "int32";
    default:
      return "unspecified";
  }
}

absl::StatusOr<v1::DType> ParseOutputDType(const std::string& name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "fp16" || n == "float16" || n == "f16") return v1::DTYPE_FP16;
  if (n == "bf16" || n == "bfloat16") return v1::DTYPE_BF16;
  if (n == "fp32" || n == "float32" || n == "f32") return v1::DTYPE_FP32;
  return absl::InvalidArgumentError(
      absl::StrCat("dtype must be fp16, bf16 or fp32, got '", name, "'"));
}

// ---- ResponseStreamChecker ----------------------------------------------------------------

absl::Status ResponseStreamChecker::Next(const v1::DequantizeResponse& response) {
  if (!has_header_) {
    if (!response.has_header()) return DataLoss("first message has no header");
    const v1::DequantizeHeader& h = response.header();
    const int64_t element_bytes = OutputDTypeBytes(h.dtype());
    if (h.shape_size() != 2 || h.shape(0) < 0 || h.shape(1) < 0 || element_bytes == 0) {
      return DataLoss(absl::StrCat("header has shape of ", h.shape_size(), " dims and dtype ",
                                   OutputDTypeName(h.dtype()), "; expected (K, N) and a float"));
    }
    const int64_t K = h.shape(0), N = h.shape(1);
    if (N != 0 && K > kInt64Max / N / element_bytes) return DataLoss("header shape overflows");
    if (h.total_bytes() != K * N * element_bytes) {
      return DataLoss(absl::StrCat("header total_bytes ", h.total_bytes(), " != ", K, " * ", N,
                                   " * ", element_bytes));
    }
    header_ = h;
    has_header_ = true;
  } else if (response.has_header()) {
    return DataLoss(absl::StrCat("second header at offset ", response.offset()));
  }
  const int64_t expected = range_offset_ + bytes_received_;
  // A message without data (a header) carries no position: its offset field is 0 whatever the
  // range.
  if (response.data().empty()) return absl::OkStatus();
  if (response.offset() != expected) {
    return DataLoss(absl::StrCat("chunk at offset ", response.offset(), ", expected ", expected,
                                 " (chunks not contiguous)"));
  }
  const int64_t size = static_cast<int64_t>(response.data().size());
  if (size > RangeEnd() - expected) {
    return DataLoss(absl::StrCat(
        "chunk [", response.offset(), ", ", response.offset() + size, ") runs past ",
        RangeEnd() == header_.total_bytes() ? "total_bytes " : "the range's end ", RangeEnd()));
  }
  bytes_received_ += size;
  return absl::OkStatus();
}

int64_t ResponseStreamChecker::RangeEnd() const {
  const int64_t total = header_.total_bytes();
  if (range_length_ <= 0 || range_length_ > total - range_offset_) return total;
  return range_offset_ + range_length_;
}

absl::Status ResponseStreamChecker::Finish() const {
  if (!has_header_) return DataLoss("ended without a header");
  if (range_offset_ + bytes_received_ != RangeEnd()) {
    return DataLoss(absl::StrCat("ended after ", bytes_received_, " of ",
                                 RangeEnd() - range_offset_, " bytes"));
  }
  return absl::OkStatus();
}

// ---- DequantClient --------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<DequantClient>> DequantClient::Connect(const std::string& target,
                                                                      const ClientOptions& options,
                                                                      int connection) {
  if (target.empty()) return absl::InvalidArgumentError("server address is empty");
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  args.SetMaxSendMessageSize(options.max_send_message_bytes);
  if (connection > 0) {
    // A channel with its own subchannel pool never shares a connection with another channel.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("dequantd.connection", connection);
  }
  if (!options.lb_policy.empty()) args.SetLoadBalancingPolicyName(options.lb_policy);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      CreateClientChannel(target, options.security, std::move(args));
  if (!channel.ok()) return channel.status();
  return std::make_unique<DequantClient>(std::move(*channel), options);
}

DequantClient::DequantClient(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options)
    : channel_(std::move(channel)),
      stub_(v1::DequantService::NewStub(channel_)),
      options_(options) {}

void DequantClient::SetDeadline(grpc::ClientContext* context) const {
  if (options_.deadline_seconds > 0) {
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::duration_cast<std::chrono::system_clock::duration>(
                              std::chrono::duration<double>(options_.deadline_seconds)));
  }
}

absl::StatusOr<v1::ListTensorsResponse> DequantClient::ListTensors() {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::ListTensorsResponse response;
  absl::Status status =
      FromGrpcStatus(stub_->ListTensors(&context, v1::ListTensorsRequest(), &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::GetServerInfoResponse> DequantClient::GetServerInfo() {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::GetServerInfoResponse response;
  absl::Status status =
      FromGrpcStatus(stub_->GetServerInfo(&context, v1::GetServerInfoRequest(), &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::BenchmarkResponse> DequantClient::Benchmark(
    const v1::BenchmarkRequest& request) {
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::BenchmarkResponse response;
  absl::Status status = FromGrpcStatus(stub_->Benchmark(&context, request, &response));
  if (!status.ok()) return status;
  return response;
}

namespace {

// Reads every message of a server stream into `next`. On next's first error, cancels the call,
// drains the stream and returns that error; otherwise returns the call's status.
template <typename Response, typename Next>
absl::Status ReadStream(grpc::ClientContext& context, grpc::ClientReader<Response>& reader,
                        Next&& next) {
  absl::Status local;  // first error found on this side (malformed stream or a sink's error)
  Response response;
  while (local.ok() && reader.Read(&response)) local = next(response);
  if (!local.ok()) {
    context.TryCancel();
    while (reader.Read(&response)) {
    }
    static_cast<void>(reader.Finish());  // cancelled: our own error is the one to report
    return local;
  }
  return FromGrpcStatus(reader.Finish());
}

// Feeds one response message to `checker` and the sink's callbacks (on_header when the message
// starts a result).
absl::Status Deliver(ResponseStreamChecker& checker, const DequantizeSink& sink,
                     const v1::DequantizeResponse& response) {
  const bool first = !checker.has_header();
  absl::Status status = checker.Next(response);
  if (status.ok() && first && sink.on_header) status = sink.on_header(checker.header());
  if (status.ok() && !response.data().empty() && sink.on_chunk) {
    status =
        sink.on_chunk(response.offset(),
                      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(response.data().data()),
                                          response.data().size()));
  }
  return status;
}

// A sink appending each result to `results` in memory.
DequantizeSink MemorySink(std::vector<DequantizedTensor>& results) {
  DequantizeSink sink;
  sink.on_header = [&results](const v1::DequantizeHeader& header) {
    results.emplace_back();
    results.back().header = header;
    results.back().data.reserve(static_cast<size_t>(header.total_bytes()));
    return absl::OkStatus();
  };
  sink.on_chunk = [&results](int64_t, absl::Span<const uint8_t> data) {
    results.back().data.insert(results.back().data.end(), data.begin(), data.end());
    return absl::OkStatus();
  };
  return sink;
}

}  // namespace

absl::StatusOr<v1::DequantizeHeader> DequantClient::Dequantize(const v1::DequantizeRequest& request,
                                                               const DequantizeSink& sink) {
  grpc::ClientContext context;
  SetDeadline(&context);
  std::unique_ptr<grpc::ClientReader<v1::DequantizeResponse>> reader =
      stub_->Dequantize(&context, request);
  ResponseStreamChecker checker(request.offset(), request.length());
  absl::Status status = ReadStream(context, *reader, [&](const v1::DequantizeResponse& response) {
    return Deliver(checker, sink, response);
  });
  if (!status.ok()) return status;
  status = checker.Finish();
  if (!status.ok()) return status;
  return checker.header();
}

absl::StatusOr<std::vector<v1::DequantizeHeader>> DequantClient::DequantizeLayers(
    const v1::DequantizeLayersRequest& request, const LayersSink& sink) {
  grpc::ClientContext context;
  SetDeadline(&context);
  std::unique_ptr<grpc::ClientReader<v1::DequantizeResponse>> reader =
      stub_->DequantizeLayers(&context, request);
  std::vector<v1::DequantizeHeader> headers;
  ResponseStreamChecker checker;  // of the current layer
  absl::Status status = ReadStream(context, *reader, [&](const v1::DequantizeResponse& response) {
    if (response.has_header() && checker.has_header()) {  // the next layer starts
      if (absl::Status s = checker.Finish(); !s.ok()) {
        return DataLoss(absl::StrCat("layer \"", checker.header().tensor(), "\": ", s.message()));
      }
      checker = ResponseStreamChecker();
    }
    if (response.has_header()) {
      if (response.header().tensor().empty()) return DataLoss("a layer header has no tensor");
      headers.push_back(response.header());
    }
    return Deliver(checker, sink, response);
  });
  if (!status.ok()) return status;
  if (checker.has_header()) {
    status = checker.Finish();
    if (!status.ok()) return status;
  }
  return headers;
}

absl::StatusOr<std::vector<DequantizedTensor>> DequantClient::DequantizeLayersToMemory(
    const v1::DequantizeLayersRequest& request) {
  std::vector<DequantizedTensor> results;
  absl::StatusOr<std::vector<v1::DequantizeHeader>> headers =
      DequantizeLayers(request, MemorySink(results));
  if (!headers.ok()) return headers.status();
  return results;
}

absl::StatusOr<DequantizedTensor> DequantClient::DequantizeToMemory(
    const v1::DequantizeRequest& request) {
  DequantizedTensor result;
  DequantizeSink sink;
  sink.on_header = [&result](const v1::DequantizeHeader& header) {
    result.data.reserve(static_cast<size_t>(header.total_bytes()));
    return absl::OkStatus();
  };
  sink.on_chunk = [&result](int64_t, absl::Span<const uint8_t> data) {
    result.data.insert(result.data.end(), data.begin(), data.end());
    return absl::OkStatus();
  };
  absl::StatusOr<v1::DequantizeHeader> header = Dequantize(request, sink);
  if (!header.ok()) return header.status();
  result.header = *std::move(header);
  return result;
}

}  // namespace dequantd
