// Checkpoint files for the fuzzers (see fuzz_files.h).
#include "tests/fuzz/fuzz_files.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <vector>

#include "formats/safetensors.h"

namespace dequantd::fuzz {

const std::string& CheckpointDir() {
  static const std::string* const dir = [] {
    const char* tmp = ::getenv("TMPDIR");
    std::string templ =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/dequantd_fuzz.XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) ::abort();
    return new std::string(templ);
  }();
  return *dir;
}

void WriteFile(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) ::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) ::abort();
  std::fclose(f);
}

std::string ValidShard() {
  static const std::string* const bytes = [] {
    constexpr int64_t K = 64, N = 8, G = 64;
    std::vector<uint8_t> qweight(K * N / 2, 0x12), qzeros(K / G * N / 2, 0x88),
        scales(K / G * N * 2, 0x3c);
    const std::string path = CheckpointDir() + "/seed.safetensors";
    if (!safetensors::WriteFile(path, {{"l.qweight", "I32", {K, N / 8}, qweight},
                                       {"l.qzeros", "I32", {K / G, N / 8}, qzeros},
                                       {"l.scales", "F16", {K / G, N}, scales}})
             .ok()) {
      ::abort();
    }
    FILE* f = std::fopen(path.c_str(), "rb");
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    std::fclose(f);
    ::unlink(path.c_str());
    return new std::string(out);
  }();
  return *bytes;
}

}  // namespace dequantd::fuzz
