// What the format reference-vector tests (gptq_vectors_test.cc, compressed_tensors_vectors_test.cc)
// share: the vector files of tests/data/formats/<format>/ (see its README), a checkpoint directory
// made of one case, its tensors' bytes, the (K, N) transpose of an (N, K) result, a collected
// result stream, and a sink that collects a backend's result.
#pragma once

#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dequant/v1/dequant.grpc.pb.h"
#include "formats/safetensors.h"
#include "gtest/gtest.h"
#include "server/backend/backend.h"

namespace dequantd::testing {

// tests/data/formats/<format>.
inline std::filesystem::path VectorDir(const char* format) {
  return std::filesystem::path(DEQUANTD_SOURCE_DIR) / "tests/data/formats" / format;
}

inline std::string ReadText(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void WriteText(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A fresh temporary directory holding `config` as config.json (empty path on failure).
inline std::filesystem::path MakeConfigDir(const std::string& config) {
  std::string templ = ::testing::TempDir() + "/format_vectors.XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) return {};
  const std::filesystem::path dir(templ);
  WriteText(dir / "config.json", config);
  return dir;
}

// A checkpoint directory holding `config` as config.json and a copy of `safetensors`.
inline std::filesystem::path MakeCheckpoint(const std::string& config,
                                            const std::filesystem::path& safetensors) {
  const std::filesystem::path dir = MakeConfigDir(config);
  if (!dir.empty()) std::filesystem::copy_file(safetensors, dir / "model.safetensors");
  return dir;
}

inline std::vector<uint8_t> TensorOf(const safetensors::MappedFile& file, const std::string& name) {
  absl::StatusOr<absl::Span<const uint8_t>> bytes = file.TensorBytes(name);
  EXPECT_TRUE(bytes.ok()) << name << ": " << bytes.status();
  if (!bytes.ok()) return {};
  return std::vector<uint8_t>(bytes->begin(), bytes->end());
}

// The (K, N) result whose transpose is `nk` ((N, K), `elem` bytes per element).
inline std::vector<uint8_t> TransposeNk(const std::vector<uint8_t>& nk, int64_t N, int64_t K,
                                        int64_t elem) {
  std::vector<uint8_t> kn(nk.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      std::memcpy(kn.data() + (k * N + n) * elem, nk.data() + (n * K + k) * elem,
                  static_cast<size_t>(elem));
  return kn;
}

// Every message of a Dequantize / DequantizeLayers stream: the data concatenated, the last header.
struct ReadStream {
  std::vector<uint8_t> bytes;
  ::dequant::v1::DequantizeHeader header;
  grpc::Status status;
};
template <class Reader>
ReadStream ReadAll(Reader& reader) {
  ReadStream out;
  ::dequant::v1::DequantizeResponse response;
  while (reader->Read(&response)) {
    if (response.has_header()) out.header = response.header();
    out.bytes.insert(out.bytes.end(), response.data().begin(), response.data().end());
  }
  out.status = reader->Finish();
  return out;
}

// Collects one backend result.
class BytesSink : public ChunkSink {
 public:
  absl::Status Begin(const std::string& k) override {
    kernel = k;
    return absl::OkStatus();
  }
  absl::Status Write(int64_t, absl::Span<const uint8_t> data) override {
    bytes.insert(bytes.end(), data.begin(), data.end());
    return absl::OkStatus();
  }
  std::string kernel;
  std::vector<uint8_t> bytes;
};

}  // namespace dequantd::testing
