// The client side of shared-memory regions (issue 9): a POSIX shared-memory object the client
// creates (ShmObject), the region RPCs (RegionClient), and Dequantize/DequantizeLayers calls whose
// result the server writes into a region (the stream then carries only headers).
// Thread-safe like DequantClient (each call has its own context); ShmObject is not.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/client.h"

namespace dequantd {

// A POSIX shared-memory object created and mapped read-write by this process; unmapped and
// unlinked on destruction.
class ShmObject {
 public:
  // Creates `key` ("/NAME", exclusive: it must not exist) of `bytes` (>= 1) and maps it.
  // Errors: INVALID_ARGUMENT (key, bytes), ALREADY_EXISTS, errno-derived codes.
  static absl::StatusOr<std::unique_ptr<ShmObject>> Create(const std::string& key, int64_t bytes);
  ~ShmObject();
  ShmObject(const ShmObject&) = delete;
  ShmObject& operator=(const ShmObject&) = delete;

  const std::string& key() const { return key_; }
  uint8_t* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  ShmObject(std::string key, uint8_t* data, int64_t bytes)
      : key_(std::move(key)), data_(data), bytes_(bytes) {}
  std::string key_;
  uint8_t* data_;
  int64_t bytes_;
};

class RegionClient {
 public:
  RegionClient(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options = {});

  // The region RPCs; each returns the server's status on failure.
  absl::StatusOr<v1::RegisterSystemSharedMemoryResponse> RegisterSystem(const std::string& name,
                                                                        const std::string& key,
                                                                        int64_t offset,
                                                                        int64_t byte_size);
  // `name` empty: every host region. Returns how many were released.
  absl::StatusOr<int> UnregisterSystem(const std::string& name);
  // `raw_handle`: a cudaIpcMemHandle_t's 64 bytes.
  absl::Status RegisterCuda(const std::string& name, const std::string& raw_handle, int device,
                            int64_t offset, int64_t byte_size);
  absl::StatusOr<int> UnregisterCuda(const std::string& name);
  absl::StatusOr<v1::SharedMemoryStatusResponse> Status();

  // Dequantize with request.output_region set; returns the header. The result is in the region
  // once this returns OK. The reply is one message, the header (naming the region, with
  // region_offset), which arrives with the OK status. Errors: the server's, DATA_LOSS when the
  // reply is not exactly that (no message or several, data bytes, layer_headers, another region).
  absl::StatusOr<v1::DequantizeHeader> DequantizeInto(const v1::DequantizeRequest& request);
  // DequantizeLayers with request.output_region set; returns each layer's header in request order
  // (region_offset says where it went), from the one reply message's layer_headers. Errors: the
  // server's, DATA_LOSS when the reply is not exactly one message (not several) without data and
  // `header`
  // whose layer_headers name the region and, for a non-empty request list, one per requested
  // tensor, in order.
  // request.region_reply must be UNSPECIFIED or HEADERS (SUMMARY: INVALID_ARGUMENT, see
  // DequantizeLayersIntoSummary).
  absl::StatusOr<std::vector<v1::DequantizeHeader>> DequantizeLayersInto(
      const v1::DequantizeLayersRequest& request);
  // DequantizeLayers with request.output_region set and request.region_reply =
  // REGION_REPLY_SUMMARY (issue 23): returns the reply's region_summary (layer count, total bytes,
  // region, first offset, dtype, orientation, backend, kernel). Every result is in the region once
  // this returns OK, placed one after another from output_region.offset in request order (the
  // caller knows each one's bytes from ListTensors: K * N * sizeof(dtype)). A server that predates
  // region_reply ignores it and answers with layer_headers; their summary is returned then, once
  // they are checked to be the requested layers placed one after another from the offset.
  // Errors: INVALID_ARGUMENT (region_reply is not SUMMARY), the server's, DATA_LOSS when the reply
  // is not one message without data whose summary names the region at output_region.offset
  // with, for a non-empty request list, layer_count = its entries (or headers failing the checks
  // above).
  absl::StatusOr<v1::RegionSummary> DequantizeLayersIntoSummary(
      const v1::DequantizeLayersRequest& request);

 private:
  // Calls a region method (`prepare`: the stub's PrepareAsyncDequantize or
  // PrepareAsyncDequantizeLayers) with `request`, which names an output region, and returns the
  // one reply message. The server sends it with the status, once every byte is in the region; the
  // wait polls the call's own completion queue for up to ClientOptions::region_busy_poll_us
  // before it blocks, so the reply is taken as it lands rather than after the thread is woken.
  // Errors: the server's, DATA_LOSS (no message, several, or data bytes).
  template <typename Request>
  absl::StatusOr<v1::DequantizeResponse> CallIntoRegion(
      const Request& request,
      std::unique_ptr<grpc::ClientAsyncReader<v1::DequantizeResponse>> (
          v1::DequantService::Stub::*prepare)(grpc::ClientContext*, const Request&,
                                              grpc::CompletionQueue*));
  void SetDeadline(grpc::ClientContext* context) const;

  std::unique_ptr<v1::DequantService::Stub> stub_;
  ClientOptions options_;
};

// Dequantize through a host region instead of the stream: creates the POSIX shm object
// "/dequantctl.<pid>.<name>" of the result's size (from request.packed, else ListTensors),
// registers it as region `name`, calls Dequantize into it, then hands the header and the region's
// bytes to `sink` (on_header, then one on_chunk), unregisters the region and removes the object.
// A registration of `name` left by an earlier run that was killed (ReleaseStaleRegion) is
// released first. Errors: the server's (ALREADY_EXISTS: `name` is another client's region),
// ShmObject's, the sink's, NOT_FOUND (a tensor not in ListTensors).
// Whether host region `name` on the server was left by a DequantizeThroughShm run that is gone
// (killed before it could unregister): its key is "/dequantctl.<pid>.<name>", that object still
// exists in this machine's /dev/shm, no call is writing into it, and no process <pid> exists
// here. If so, unregisters it, removes the object and returns true; false (touching nothing) for
// any other region, including one of a live run. Errors: the server's.
absl::StatusOr<bool> ReleaseStaleRegion(RegionClient& regions, const std::string& name);

absl::StatusOr<v1::DequantizeHeader> DequantizeThroughShm(DequantClient& client,
                                                          const std::string& name,
                                                          const v1::DequantizeRequest& request,
                                                          const DequantizeSink& sink);

}  // namespace dequantd
