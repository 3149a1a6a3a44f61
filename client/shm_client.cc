// ShmObject, RegionClient and DequantizeThroughShm (see shm_client.h).
#include "client/shm_client.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace dequantd {
namespace {

absl::Status ErrnoStatus(int error, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(error));
  switch (error) {
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
      return absl::PermissionDeniedError(message);
    case ENOMEM:
    case ENOSPC:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace

// ---- ShmObject ------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ShmObject>> ShmObject::Create(const std::string& key,
                                                             int64_t bytes) {
  if (key.size() < 2 || key[0] != '/' || key.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("shm key \"", key, "\" must be \"/NAME\""));
  }
  if (bytes < 1) return absl::InvalidArgumentError(absl::StrCat("shm bytes ", bytes, " < 1"));
  const int fd = shm_open(key.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("shm_open(\"", key, "\")"));
  absl::Cleanup close_fd = [fd] { close(fd); };
  if (ftruncate(fd, bytes) != 0) {
    const int error = errno;
    shm_unlink(key.c_str());
    return ErrnoStatus(error, absl::StrCat("ftruncate(\"", key, "\", ", bytes, ")"));
  }
  void* map = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    const int error = errno;
    shm_unlink(key.c_str());
    return ErrnoStatus(error, absl::StrCat("mmap(\"", key, "\")"));
  }
  return std::unique_ptr<ShmObject>(new ShmObject(key, static_cast<uint8_t*>(map), bytes));
}

ShmObject::~ShmObject() {
  munmap(data_, static_cast<size_t>(bytes_));
  shm_unlink(key_.c_str());
}

// ---- RegionClient ---------------------------------------------------------------------------

RegionClient::RegionClient(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options)
    : stub_(v1::DequantService::NewStub(std::move(channel))), options_(options) {}

void RegionClient::SetDeadline(grpc::ClientContext* context) const {
  if (options_.deadline_seconds > 0) {
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::duration_cast<std::chrono::system_clock::duration>(
                              std::chrono::duration<double>(options_.deadline_seconds)));
  }
}

absl::StatusOr<v1::RegisterSystemSharedMemoryResponse> RegionClient::RegisterSystem(
    const std::string& name, const std::string& key, int64_t offset, int64_t byte_size) {
  v1::RegisterSystemSharedMemoryRequest request;
  request.set_name(name);
  request.set_key(key);
  request.set_offset(offset);
  request.set_byte_size(byte_size);
  v1::RegisterSystemSharedMemoryResponse response;
  grpc::ClientContext context;
  SetDeadline(&context);
  if (absl::Status s =
          FromGrpcStatus(stub_->RegisterSystemSharedMemory(&context, request, &response));
      !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<int> RegionClient::UnregisterSystem(const std::string& name) {
  v1::UnregisterSystemSharedMemoryRequest request;
  request.set_name(name);
  v1::UnregisterSystemSharedMemoryResponse response;
  grpc::ClientContext context;
  SetDeadline(&context);
  if (absl::Status s =
          FromGrpcStatus(stub_->UnregisterSystemSharedMemory(&context, request, &response));
      !s.ok()) {
    return s;
  }
  return response.released();
}

absl::Status RegionClient::RegisterCuda(const std::string& name, const std::string& raw_handle,
                                        int device, int64_t offset, int64_t byte_size) {
  v1::RegisterCudaSharedMemoryRequest request;
  request.set_name(name);
  request.set_raw_handle(raw_handle);
  request.set_device_id(device);
  request.set_offset(offset);
  request.set_byte_size(byte_size);
  v1::RegisterCudaSharedMemoryResponse response;
  grpc::ClientContext context;
  SetDeadline(&context);
  return FromGrpcStatus(stub_->RegisterCudaSharedMemory(&context, request, &response));
}

absl::StatusOr<int> RegionClient::UnregisterCuda(const std::string& name) {
  v1::UnregisterCudaSharedMemoryRequest request;
  request.set_name(name);
  v1::UnregisterCudaSharedMemoryResponse response;
  grpc::ClientContext context;
  SetDeadline(&context);
  if (absl::Status s =
          FromGrpcStatus(stub_->UnregisterCudaSharedMemory(&context, request, &response));
      !s.ok()) {
    return s;
  }
  return response.released();
}

absl::StatusOr<v1::SharedMemoryStatusResponse> RegionClient::Status() {
  v1::SharedMemoryStatusResponse response;
  grpc::ClientContext context;
  SetDeadline(&context);
  if (absl::Status s = FromGrpcStatus(
          stub_->SharedMemoryStatus(&context, v1::SharedMemoryStatusRequest(), &response));
      !s.ok()) {
    return s;
  }
  return response;
}

namespace {

// A completion queue for one call's operations, each waited for in turn: polled without sleeping
// until `poll_until`, then blocking (the call's deadline, if any, bounds the wait).
class CallQueue {
 public:
  explicit CallQueue(std::chrono::steady_clock::time_point poll_until) : poll_until_(poll_until) {}
  CallQueue(const CallQueue&) = delete;
  CallQueue& operator=(const CallQueue&) = delete;
  ~CallQueue() {
    queue_.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (queue_.Next(&tag, &ok)) {
    }
  }
  grpc::CompletionQueue* get() { return &queue_; }

  // Waits for the operation tagged `tag` (the only one outstanding); returns its `ok`.
  bool Wait(void* tag) {
    void* got = nullptr;
    bool ok = false;
    for (;;) {
      const bool poll = std::chrono::steady_clock::now() < poll_until_;
      const grpc::CompletionQueue::NextStatus next = queue_.AsyncNext(
          &got, &ok, poll ? gpr_time_0(GPR_CLOCK_MONOTONIC) : gpr_inf_future(GPR_CLOCK_MONOTONIC));
      if (next == grpc::CompletionQueue::GOT_EVENT && got == tag) return ok;
      if (next == grpc::CompletionQueue::SHUTDOWN) return false;
    }
  }

 private:
  grpc::CompletionQueue queue_;
  const std::chrono::steady_clock::time_point poll_until_;
};

}  // namespace

template <typename Request>
absl::StatusOr<v1::DequantizeResponse> RegionClient::CallIntoRegion(
    const Request& request,
    std::unique_ptr<grpc::ClientAsyncReader<v1::DequantizeResponse>> (
        v1::DequantService::Stub::*prepare)(grpc::ClientContext*, const Request&,
                                            grpc::CompletionQueue*)) {
  const std::string& region = request.output_region().name();
  grpc::ClientContext context;
  SetDeadline(&context);
  CallQueue queue(std::chrono::steady_clock::now() +
                  std::chrono::microseconds(std::max<int64_t>(0, options_.region_busy_poll_us)));
  std::unique_ptr<grpc::ClientAsyncReader<v1::DequantizeResponse>> call =
      ((*stub_).*prepare)(&context, request, queue.get());
  // Tags: addresses that name the operations.
  int start_tag = 0, read_tag = 0, finish_tag = 0;
  call->StartCall(&start_tag);
  queue.Wait(&start_tag);  // false when the call failed at once; Finish says why
  v1::DequantizeResponse reply;
  v1::DequantizeResponse extra;
  int messages = 0;
  for (v1::DequantizeResponse* into = &reply;; into = &extra) {
    call->Read(into, &read_tag);
    if (!queue.Wait(&read_tag)) break;
    if (++messages == 2) {
      context.TryCancel();  // not a region reply: read no more of it
      break;
    }
  }
  grpc::Status finished;
  call->Finish(&finished, &finish_tag);
  queue.Wait(&finish_tag);
  const absl::Status status = FromGrpcStatus(finished);
  if (messages <= 1 && !status.ok()) return status;
  if (messages != 1) {
    return absl::DataLossError(
        absl::StrCat("reply of a call into region \"", region,
                     "\": ", messages == 0 ? "no message" : "several messages", ", expected 1"));
  }
  if (!reply.data().empty()) {
    return absl::DataLossError(absl::StrCat("reply of a call into region \"", region, "\": ",
                                            reply.data().size(), " data bytes, expected none"));
  }
  return reply;
}

namespace {

// DATA_LOSS unless `header` names `region`.
absl::Status CheckNamesRegion(const v1::DequantizeHeader& header, const std::string& region,
                              const char* what) {
  if (header.region() == region) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("reply of a call into region \"", region, "\": ", what,
                                          " names region \"", header.region(), "\""));
}

}  // namespace

absl::StatusOr<v1::DequantizeHeader> RegionClient::DequantizeInto(
    const v1::DequantizeRequest& request) {
  const std::string& region = request.output_region().name();
  absl::StatusOr<v1::DequantizeResponse> reply =
      CallIntoRegion(request, &v1::DequantService::Stub::PrepareAsyncDequantize);
  if (!reply.ok()) return reply.status();
  if (!reply->has_header() || reply->layer_headers_size() != 0) {
    return absl::DataLossError(absl::StrCat("reply of a Dequantize into region \"", region,
                                            "\": expected a header, got ",
                                            reply->has_header() ? "one" : "none", " and ",
                                            reply->layer_headers_size(), " layer_headers"));
  }
  if (absl::Status s = CheckNamesRegion(reply->header(), region, "the header"); !s.ok()) return s;
  return reply->header();
}

namespace {

// The layer headers of a DequantizeLayers region reply, checked: no `header`, one per requested
// tensor in order (for a non-empty list), each naming `region`. DATA_LOSS otherwise.
absl::Status CheckLayerHeaders(const v1::DequantizeResponse& reply,
                               const v1::DequantizeLayersRequest& request) {
  const std::string& region = request.output_region().name();
  if (reply.has_header() || reply.layer_headers().empty() ||
      (!request.tensors().empty() && reply.layer_headers_size() != request.tensors_size())) {
    return absl::DataLossError(absl::StrCat(
        "reply of a DequantizeLayers into region \"", region, "\": ", reply.layer_headers_size(),
        " layer_headers for ", request.tensors_size(), " requested tensors",
        reply.has_header() ? ", and a header" : ""));
  }
  for (int i = 0; i < reply.layer_headers_size(); ++i) {
    const v1::DequantizeHeader& header = reply.layer_headers(i);
    if (!request.tensors().empty() && header.tensor() != request.tensors(i)) {
      return absl::DataLossError(absl::StrCat(
          "reply of a DequantizeLayers into region \"", region, "\": layer_headers[", i,
          "] is for \"", header.tensor(), "\", requested \"", request.tensors(i), "\""));
    }
    if (absl::Status s = CheckNamesRegion(header, region, "a layer header"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// The summary of checked layer headers (a server before region_reply answers with them): DATA_LOSS
// unless they lie one after another from output_region.offset, as a summary would say.
absl::StatusOr<v1::RegionSummary> SummaryOfHeaders(const v1::DequantizeResponse& reply,
                                                   const v1::DequantizeLayersRequest& request) {
  v1::RegionSummary summary;
  const v1::DequantizeHeader& first = reply.layer_headers(0);
  summary.set_region(first.region());
  summary.set_region_offset(request.output_region().offset());
  summary.set_dtype(first.dtype());
  summary.set_orientation(first.orientation());
  summary.set_backend(first.backend());
  summary.set_kernel(first.kernel());
  int64_t at = request.output_region().offset();
  for (const v1::DequantizeHeader& header : reply.layer_headers()) {
    if (header.region_offset() != at) {
      return absl::DataLossError(absl::StrCat(
          "reply of a DequantizeLayers into region \"", first.region(), "\": layer \"",
          header.tensor(), "\" at region offset ", header.region_offset(), ", expected ", at));
    }
    at += header.total_bytes();
  }
  summary.set_layer_count(reply.layer_headers_size());
  summary.set_total_bytes(at - request.output_region().offset());
  return summary;
}

}  // namespace

absl::StatusOr<v1::RegionSummary> RegionClient::DequantizeLayersIntoSummary(
    const v1::DequantizeLayersRequest& request) {
  if (request.region_reply() != v1::REGION_REPLY_SUMMARY) {
    return absl::InvalidArgumentError(
        "region_reply: DequantizeLayersIntoSummary needs REGION_REPLY_SUMMARY (or call "
        "DequantizeLayersInto for every layer's header)");
  }
  const std::string& region = request.output_region().name();
  absl::StatusOr<v1::DequantizeResponse> reply =
      CallIntoRegion(request, &v1::DequantService::Stub::PrepareAsyncDequantizeLayers);
  if (!reply.ok()) return reply.status();
  if (!reply->has_region_summary()) {
    // A server before issue 23: it answered with every header.
    if (absl::Status s = CheckLayerHeaders(*reply, request); !s.ok()) return s;
    return SummaryOfHeaders(*reply, request);
  }
  const v1::RegionSummary& summary = reply->region_summary();
  if (reply->has_header() || reply->layer_headers_size() != 0 || summary.region() != region ||
      summary.region_offset() != request.output_region().offset() ||
      (!request.tensors().empty() && summary.layer_count() != request.tensors_size())) {
    return absl::DataLossError(absl::StrCat(
        "reply of a DequantizeLayers into region \"", region, "\": a summary of ",
        summary.layer_count(), " layers in region \"", summary.region(), "\" at offset ",
        summary.region_offset(), " for ", request.tensors_size(), " requested tensors at offset ",
        request.output_region().offset(),
        reply->has_header() || reply->layer_headers_size() != 0 ? ", and headers" : ""));
  }
  return summary;
}

absl::StatusOr<std::vector<v1::DequantizeHeader>> RegionClient::DequantizeLayersInto(
    const v1::DequantizeLayersRequest& request) {
  if (request.region_reply() == v1::REGION_REPLY_SUMMARY) {
    return absl::InvalidArgumentError(
        "region_reply: REGION_REPLY_SUMMARY answers with no headers; call "
        "DequantizeLayersIntoSummary");
  }
  absl::StatusOr<v1::DequantizeResponse> reply =
      CallIntoRegion(request, &v1::DequantService::Stub::PrepareAsyncDequantizeLayers);
  if (!reply.ok()) return reply.status();
  if (absl::Status s = CheckLayerHeaders(*reply, request); !s.ok()) return s;
  google::protobuf::RepeatedPtrField<v1::DequantizeHeader>& parsed =
      *reply->mutable_layer_headers();
  return std::vector<v1::DequantizeHeader>(std::make_move_iterator(parsed.begin()),
                                           std::make_move_iterator(parsed.end()));
}

// ---- DequantizeThroughShm -------------------------------------------------------------------

namespace {

// The result's bytes for `request`: from the inline shape, else the layer in ListTensors.
absl::StatusOr<int64_t> ResultBytes(DequantClient& client, const v1::DequantizeRequest& request) {
  const int64_t element = OutputDTypeBytes(
      request.output_dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_FP16 : request.output_dtype());
  if (request.has_packed()) {
    return std::max<int64_t>(1, request.packed().experts()) * request.packed().in_features() *
           request.packed().out_features() * element;
  }
  absl::StatusOr<v1::ListTensorsResponse> list = client.ListTensors();
  if (!list.ok()) return list.status();
  for (const v1::QuantizedTensorInfo& info : list->tensors()) {
    if (info.name() == request.tensor()) {
      return std::max<int64_t>(1, info.experts()) * info.in_features() * info.out_features() *
             element;
    }
  }
  return absl::NotFoundError(
      absl::StrCat("tensor '", request.tensor(), "' is not a layer of the server's model"));
}

// The shm key DequantizeThroughShm uses for region `name` in process `pid`.
std::string ShmKey(pid_t pid, const std::string& name) {
  return absl::StrCat("/dequantctl.", pid, ".", name);
}

}  // namespace

absl::StatusOr<bool> ReleaseStaleRegion(RegionClient& regions, const std::string& name) {
  absl::StatusOr<v1::SharedMemoryStatusResponse> status = regions.Status();
  if (!status.ok()) return status.status();
  const auto& all = status->regions();
  const auto region = std::find_if(all.begin(), all.end(), [&](const auto& r) {
    return r.name() == name && r.kind() == "host" && r.calls_in_flight() == 0;
  });
  if (region == all.end()) return false;
  // The key must be ShmKey(pid, name) for some pid, its object this machine's (same /dev/shm),
  // and that process gone from here.
  const std::string& key = region->key();
  absl::string_view pid_text = key;
  int pid = 0;
  if (!absl::ConsumePrefix(&pid_text, "/dequantctl.") ||
      !absl::ConsumeSuffix(&pid_text, absl::StrCat(".", name)) ||
      !absl::SimpleAtoi(pid_text, &pid) || pid <= 0 || key != ShmKey(pid, name)) {
    return false;
  }
  if (::access(absl::StrCat("/dev/shm", key).c_str(), F_OK) != 0) return false;
  if (::kill(pid, 0) == 0 || errno != ESRCH) return false;
  absl::StatusOr<int> released = regions.UnregisterSystem(name);
  if (!released.ok()) return released.status();
  ::shm_unlink(key.c_str());
  return *released > 0;
}

absl::StatusOr<v1::DequantizeHeader> DequantizeThroughShm(DequantClient& client,
                                                          const std::string& name,
                                                          const v1::DequantizeRequest& request,
                                                          const DequantizeSink& sink) {
  absl::StatusOr<int64_t> bytes = ResultBytes(client, request);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<std::unique_ptr<ShmObject>> shm =
      ShmObject::Create(ShmKey(getpid(), name), *bytes);
  if (!shm.ok()) return shm.status();
  RegionClient regions(client.channel(), client.options());
  absl::StatusOr<v1::RegisterSystemSharedMemoryResponse> registered =
      regions.RegisterSystem(name, (*shm)->key(), 0, *bytes);
  if (registered.status().code() == absl::StatusCode::kAlreadyExists) {
    absl::StatusOr<bool> released = ReleaseStaleRegion(regions, name);
    if (released.ok() && *released) {
      registered = regions.RegisterSystem(name, (*shm)->key(), 0, *bytes);
    }
  }
  if (!registered.ok()) return registered.status();
  absl::Cleanup unregister = [&] { (void)regions.UnregisterSystem(name); };
  v1::DequantizeRequest into = request;
  into.mutable_output_region()->set_name(name);
  into.mutable_output_region()->set_offset(0);
  into.mutable_output_region()->set_expected_bytes(*bytes);  // a changed layer: refused unwritten
  absl::StatusOr<v1::DequantizeHeader> header = regions.DequantizeInto(into);
  if (!header.ok()) return header.status();
  if (header->total_bytes() != *bytes || header->region_offset() != 0) {
    return absl::DataLossError(
        absl::StrCat("Dequantize into region \"", name, "\": header says ", header->total_bytes(),
                     " bytes at offset ", header->region_offset(), ", expected ", *bytes, " at 0"));
  }
  if (sink.on_header) {
    if (absl::Status s = sink.on_header(*header); !s.ok()) return s;
  }
  if (sink.on_chunk) {
    if (absl::Status s = sink.on_chunk(
            0, absl::Span<const uint8_t>((*shm)->data(), static_cast<size_t>(*bytes)));
        !s.ok()) {
      return s;
    }
  }
  return header;
}

}  // namespace dequantd
