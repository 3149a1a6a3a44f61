// DequantClient (see client.h).
#include "client/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/response_view.h"

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
    case v1::DTYPE_INT64:
      return 8;
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
    case v1::DTYPE_INT64:
      return "int64";
    case v1::DTYPE_FP8_E4M3:
      return "fp8_e4m3";
    case v1::DTYPE_UINT8:
      return "uint8";
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

absl::StatusOr<v1::Orientation> ParseOrientation(const std::string& name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n.empty()) return v1::ORIENTATION_UNSPECIFIED;
  if (n == "kn") return v1::ORIENTATION_KN;
  if (n == "nk") return v1::ORIENTATION_NK;
  return absl::InvalidArgumentError(absl::StrCat(
      "--orientation must be kn, nk or left out (the format's own), got '", name, "'"));
}

// ---- ResponseStreamChecker ----------------------------------------------------------------

absl::Status ResponseStreamChecker::Next(const v1::DequantizeResponse& response) {
  return Next(response.has_header() ? &response.header() : nullptr, response.offset(),
              static_cast<int64_t>(response.data().size()));
}

absl::Status ResponseStreamChecker::Next(const v1::DequantizeHeader* header, int64_t offset,
                                         int64_t data_bytes) {
  if (!has_header_) {
    if (header == nullptr) return DataLoss("first message has no header");
    const v1::DequantizeHeader& h = *header;
    const int64_t element_bytes = OutputDTypeBytes(h.dtype());
    // (K, N), or (E, K, N) for a format with an expert axis (mxfp4).
    const bool dims_ok = h.shape_size() == 2 || h.shape_size() == 3;
    if (!dims_ok || element_bytes == 0 ||
        std::any_of(h.shape().begin(), h.shape().end(), [](int64_t d) { return d < 0; })) {
      return DataLoss(absl::StrCat("header has shape of ", h.shape_size(), " dims and dtype ",
                                   OutputDTypeName(h.dtype()),
                                   "; expected (K, N) or (E, K, N) and a float"));
    }
    const int64_t E = h.shape_size() == 3 ? h.shape(0) : 1;
    const int64_t K = h.shape(h.shape_size() - 2), N = h.shape(h.shape_size() - 1);
    if (N != 0 && K > kInt64Max / N / element_bytes) return DataLoss("header shape overflows");
    if (K * N != 0 && E > kInt64Max / (K * N * element_bytes)) {
      return DataLoss("header shape overflows");
    }
    if (h.total_bytes() != E * K * N * element_bytes) {
      return DataLoss(absl::StrCat("header total_bytes ", h.total_bytes(),
                                   " != ", E != 1 ? absl::StrCat(E, " * ") : "", K, " * ", N, " * ",
                                   element_bytes));
    }
    header_ = h;
    has_header_ = true;
  } else if (header != nullptr) {
    return DataLoss(absl::StrCat("second header at offset ", offset));
  }
  const int64_t expected = range_offset_ + bytes_received_;
  // A message without data (a header) carries no position: its offset field is 0 whatever the
  // range.
  if (data_bytes == 0) return absl::OkStatus();
  if (offset != expected) {
    return DataLoss(absl::StrCat("chunk at offset ", offset, ", expected ", expected,
                                 " (chunks not contiguous)"));
  }
  if (data_bytes > RangeEnd() - expected) {
    return DataLoss(absl::StrCat(
        "chunk [", offset, ", ", offset + data_bytes, ") runs past ",
        RangeEnd() == header_.total_bytes() ? "total_bytes " : "the range's end ", RangeEnd()));
  }
  bytes_received_ += data_bytes;
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

// The full method name of a DequantService RPC ("/dequant.v1.DequantService/<rpc>").
std::string MethodName(const char* rpc) {
  return absl::StrCat("/", v1::DequantService::service_full_name(), "/", rpc);
}

// Starts a server-streaming DequantService call whose responses arrive as raw ByteBuffers (read
// by ResponseView, without protobuf's copy of the data), as the generated stub would start it.
template <typename Request>
std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> StartStream(grpc::Channel* channel,
                                                                  const std::string& method,
                                                                  grpc::ClientContext* context,
                                                                  const Request& request) {
  const grpc::internal::RpcMethod rpc(method.c_str(), grpc::internal::RpcMethod::SERVER_STREAMING);
  return std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>>(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel, rpc, context,
                                                                    request));
}

// Reads every message of a server stream into `next` (as a ResponseView). On next's first error
// (or a message that does not parse), cancels the call, drains the stream and returns that
// error; otherwise returns the call's status.
template <typename Next>
absl::Status ReadStream(grpc::ClientContext& context, grpc::ClientReader<grpc::ByteBuffer>& reader,
                        Next&& next) {
  absl::Status local;  // first error found on this side (malformed stream or a sink's error)
  grpc::ByteBuffer message;
  ResponseView response;
  while (local.ok() && reader.Read(&message)) {
    local = response.Parse(message);
    if (local.ok()) local = next(response);
  }
  if (!local.ok()) {
    context.TryCancel();
    while (reader.Read(&message)) {
    }
    static_cast<void>(reader.Finish());  // cancelled: our own error is the one to report
    return local;
  }
  return FromGrpcStatus(reader.Finish());
}

// Feeds one response message to `checker` and the sink's callbacks (on_header when the message
// starts a result; on_chunk once per piece of its data, at consecutive offsets).
absl::Status Deliver(ResponseStreamChecker& checker, const DequantizeSink& sink,
                     const ResponseView& response) {
  const bool first = !checker.has_header();
  absl::Status status = checker.Next(response.has_header() ? &response.header() : nullptr,
                                     response.offset(), response.data_bytes());
  if (status.ok() && first && sink.on_header) status = sink.on_header(checker.header());
  if (status.ok() && response.data_bytes() > 0 && sink.on_message) {
    sink.on_message(response.offset(), response.data_bytes());
  }
  if (status.ok() && response.data_bytes() > 0 && sink.on_chunk) {
    int64_t offset = response.offset();
    for (absl::Span<const uint8_t> piece : response.data()) {
      status = sink.on_chunk(offset, piece);
      if (!status.ok()) break;
      offset += static_cast<int64_t>(piece.size());
    }
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
  static const std::string method = MethodName("Dequantize");
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader =
      StartStream(channel_.get(), method, &context, request);
  ResponseStreamChecker checker(request.offset(), request.length());
  absl::Status status = ReadStream(context, *reader, [&](const ResponseView& response) {
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
  static const std::string method = MethodName("DequantizeLayers");
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader =
      StartStream(channel_.get(), method, &context, request);
  std::vector<v1::DequantizeHeader> headers;
  ResponseStreamChecker checker;  // of the current layer
  absl::Status status = ReadStream(context, *reader, [&](const ResponseView& response) {
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
