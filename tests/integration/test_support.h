// Helpers for the integration tests: random AWQ layers (with the reference result computed by
// kernels/DequantizeReference), a checkpoint directory written from them, and a dequantd server
// started in-process on 127.0.0.1 with an ephemeral port and the CPU backend.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "kernels/dequant.h"
#include "server/server.h"

namespace dequantd::testing {

// One AWQ GEMM layer with random packed data: every qweight/qzeros bit pattern is possible
// (including bit 31), scales are random values in [-0.05, 0.05) rounded to the scale dtype.
struct RandomLayer {
  std::string name;  // layer prefix, e.g. "model.layers.0.self_attn.q_proj"
  QuantShape shape;
  std::vector<int32_t> qweight;  // (K, N/8)
  std::vector<int32_t> qzeros;   // (K/G, N/8)
  std::vector<uint16_t> scales;  // (K/G, N), fp16 or bf16 bits

  QuantView view() const;
  // The same layer as inline request input.
  v1::InlinePackedTensor ToInline() const;
  // The reference result (row-major (K, N) of `out`), from DequantizeReference.
  std::vector<uint8_t> Expected(DType out) const;
};

RandomLayer MakeRandomLayer(const std::string& name, int64_t K, int64_t N, int64_t group_size,
                            DType scale_dtype, uint32_t seed);

// Writes `dir`/config.json (quantization_config: awq, 4 bits, `group_size`, zero_point, gemm) and
// `dir`/model.safetensors holding <name>.qweight/.qzeros/.scales for every layer.
absl::Status WriteCheckpoint(const std::string& dir, const std::vector<RandomLayer>& layers,
                             int64_t group_size);

// A fresh empty directory under the test's temporary directory.
std::string MakeTempDir(const std::string& name);

// A running server and a client connected to it. The server shuts down on destruction.
struct TestServer {
  std::unique_ptr<DequantServer> server;
  std::unique_ptr<DequantClient> client;
  std::string address;  // "127.0.0.1:<port>"
  ~TestServer();
};

// Starts dequantd with `options` overridden to listen on 127.0.0.1:0 with `backend` ("cpu" uses
// 2 threads) and no /metrics endpoint; an empty tune_cache becomes a file in this process's
// temporary directory (not the user's cache).
absl::StatusOr<std::unique_ptr<TestServer>> StartServer(ServerOptions options,
                                                        const std::string& backend);
inline absl::StatusOr<std::unique_ptr<TestServer>> StartCpuServer(ServerOptions options) {
  return StartServer(std::move(options), "cpu");
}

// WriteCheckpoint(dir, layers, group_size), then StartCpuServer with options.model_dir = dir.
absl::StatusOr<std::unique_ptr<TestServer>> StartCpuServerOnCheckpoint(
    const std::string& dir, const std::vector<RandomLayer>& layers, int64_t group_size,
    ServerOptions options = {});

// Base of a test suite whose tests share one CPU server on a checkpoint of random layers, started
// once for the suite. `Suite` is the derived class, so each suite has its own static state. The
// derived SetUpTestSuite calls StartSharedServer; TearDownTestSuite stops the server.
template <class Suite>
class SharedServerSuite : public ::testing::Test {
 protected:
  // Writes `layers` (group size `group_size`) into a new temporary directory made from `name`
  // (into its subfolder `model_subdir` when that is not empty) and starts a server on it.
  static void StartSharedServer(const std::string& name, std::vector<RandomLayer> layers,
                                int64_t group_size, ServerOptions options = {},
                                const std::string& model_subdir = "") {
    layers_ = new std::vector<RandomLayer>(std::move(layers));
    dir_ = new std::string(MakeTempDir(name));
    const std::string model = model_subdir.empty() ? *dir_ : *dir_ + "/" + model_subdir;
    absl::StatusOr<std::unique_ptr<TestServer>> server =
        StartCpuServerOnCheckpoint(model, *layers_, group_size, std::move(options));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    delete layers_;
    layers_ = nullptr;
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr) << "server did not start"; }

  static DequantClient& client() { return *server_->client; }
  static const RandomLayer& layer(size_t i) { return (*layers_)[i]; }

  static inline std::vector<RandomLayer>* layers_ = nullptr;
  static inline std::string* dir_ = nullptr;  // the temporary directory
  static inline TestServer* server_ = nullptr;
};

// The bundled model directory: $DEQUANTD_MODEL_DIR, else <source>/models/smollm2-135m-awq if
// it holds a config.json; empty if neither exists.
std::string BundledModelDir();

// The dequantctl binary the tests run: $DEQUANTCTL (e.g. a copy on the GPU machine, where the
// build tree's path does not exist), else the build's own (DEQUANTCTL_PATH).
std::string DequantctlPath();

// Whether `message` contains `field` as a whole word (not inside a longer identifier).
bool NamesField(const std::string& message, const std::string& field);

}  // namespace dequantd::testing
