// Tests for ReadTensor's staged copy into device memory
// (server/backend/cuda/staged_tensor_copier.h, issue 23), run on a GPU and skipped without one: the
// bytes land exactly as stored for sizes that are not a multiple of the chunk; before_copy sees
// every chunk once, and its error stops the copy and comes back unchanged, the staging then serving
// the next call; a truncated file is DATA_LOSS; two calls at once (one staging per GPU) both land;
// the caller's current device is kept; with
// --resident-stored-bytes a tensor that fits is kept and copied device to device (one report),
// one that does not is staged, and a kept tensor's replaced file is still DATA_LOSS.
#if DEQUANTD_HAVE_CUDA

#include <sys/stat.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backend/cuda/cuda_backend.h"
#include "server/backend/cuda/staged_tensor_copier.h"
#include "server/model/raw_tensor.h"

namespace dequantd {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kHeaderBytes = 4099;  // the tensor starts at an odd offset in its file
constexpr int64_t kStagingBytes = int64_t{16} << 20;  // PlanLoadStaging: 4 threads x 4 x 1 MiB

class StagedTensorCopierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    std::string templ = ::testing::TempDir() + "/staged_copier_test.XXXXXX";
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir_ = templ;
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // A file of kHeaderBytes of zeros and then `bytes` random bytes, indexed as a raw tensor.
  RawTensor Write(const std::string& name, int64_t bytes, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t>& data = stored_[name];
    data.resize(static_cast<size_t>(bytes));
    for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
    const std::string path = dir_ + "/" + name;
    std::ofstream out(path, std::ios::binary);
    out << std::string(kHeaderBytes, '\0');
    out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(bytes));
    out.close();
    struct stat st;
    EXPECT_EQ(::stat(path.c_str(), &st), 0);
    return RawTensor{.name = name,
                     .dtype = "U8",
                     .shape = {bytes},
                     .file = path,
                     .file_offset = kHeaderBytes,
                     .bytes = bytes,
                     .device = st.st_dev,
                     .inode = st.st_ino};
  }

  // The device bytes at `device_dst`.
  static std::vector<uint8_t> Fetch(const uint8_t* device_dst, int64_t bytes) {
    std::vector<uint8_t> out(static_cast<size_t>(bytes));
    EXPECT_EQ(cudaMemcpy(out.data(), device_dst, out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

  std::string dir_;
  std::map<std::string, std::vector<uint8_t>> stored_;
};

struct DeviceBuffer {
  explicit DeviceBuffer(int64_t bytes) {
    EXPECT_EQ(cudaMalloc(&ptr, static_cast<size_t>(bytes)), cudaSuccess);
    EXPECT_EQ(cudaMemset(ptr, 0, static_cast<size_t>(bytes)), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  uint8_t* get() const { return static_cast<uint8_t*>(ptr); }
  void* ptr = nullptr;
};

// Both rotations: kStagingBytes = 4 readers x 4 buffers x 1 MiB; 3 MiB = 1 reader x 2 buffers of
// 1.5 MiB (a chunk that is not a power of two).
TEST_F(StagedTensorCopierTest, EveryByteLandsAsStoredAndEachChunkIsReportedOnce) {
  for (const auto& [staging, chunk] : {std::pair{kStagingBytes, int64_t{1} << 20},
                                       std::pair{int64_t{3} << 20, int64_t{3} << 19}}) {
    std::unique_ptr<StoredTensorCopier> copier = cuda::MakeStagedTensorCopier(4, staging);
    EXPECT_EQ(copier->min_bytes(), 2 * chunk);  // two chunks
    for (const int64_t bytes : {2 * chunk, (int64_t{13} << 20) + 4097}) {
      SCOPED_TRACE(testing::Message() << staging << " bytes of staging, a tensor of " << bytes);
      const RawTensor tensor = Write("t" + std::to_string(bytes), bytes, 7);
      DeviceBuffer device(bytes);
      std::vector<std::pair<int64_t, int64_t>> reported;
      const absl::Status s =
          copier->CopyToDevice(tensor, 0, device.get(), [&](int64_t offset, int64_t n) {
            reported.emplace_back(offset, n);
            return absl::OkStatus();
          });
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_TRUE(Fetch(device.get(), bytes) == stored_[tensor.name]);
      std::sort(reported.begin(), reported.end());
      int64_t next = 0;
      for (const auto& [offset, n] : reported) {
        EXPECT_EQ(offset, next);
        EXPECT_LE(n, chunk);
        next = offset + n;
      }
      EXPECT_EQ(next, bytes);
    }
  }
}

TEST_F(StagedTensorCopierTest, ABeforeCopyErrorStopsTheCopyAndTheNextCallWorks) {
  std::unique_ptr<StoredTensorCopier> copier = cuda::MakeStagedTensorCopier(4, kStagingBytes);
  const int64_t bytes = int64_t{16} << 20;
  const RawTensor tensor = Write("t", bytes, 3);
  DeviceBuffer device(bytes);
  int calls = 0;
  const absl::Status stopped = copier->CopyToDevice(tensor, 0, device.get(), [&](int64_t, int64_t) {
    return ++calls == 3 ? absl::AbortedError("unregistered") : absl::OkStatus();
  });
  EXPECT_EQ(stopped.code(), absl::StatusCode::kAborted) << stopped;
  EXPECT_EQ(stopped.message(), "unregistered");
  const absl::Status ok = copier->CopyToDevice(tensor, 0, device.get(),
                                               [](int64_t, int64_t) { return absl::OkStatus(); });
  ASSERT_TRUE(ok.ok()) << ok;
  EXPECT_TRUE(Fetch(device.get(), bytes) == stored_["t"]);
}

TEST_F(StagedTensorCopierTest, ATruncatedFileIsDataLoss) {
  std::unique_ptr<StoredTensorCopier> copier = cuda::MakeStagedTensorCopier(4, kStagingBytes);
  const int64_t bytes = int64_t{4} << 20;
  const RawTensor tensor = Write("t", bytes, 5);
  ASSERT_EQ(::truncate(tensor.file.c_str(), kHeaderBytes + bytes - 1), 0);
  DeviceBuffer device(bytes);
  const absl::Status s = copier->CopyToDevice(tensor, 0, device.get(),
                                              [](int64_t, int64_t) { return absl::OkStatus(); });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("truncated"));
}

TEST_F(StagedTensorCopierTest, TwoCallsAtOnceBothLandAndTheCallersDeviceIsKept) {
  std::unique_ptr<StoredTensorCopier> copier = cuda::MakeStagedTensorCopier(4, kStagingBytes);
  const int64_t bytes = (int64_t{9} << 20) + 16;
  const RawTensor a = Write("a", bytes, 11);
  const RawTensor b = Write("b", bytes, 12);
  DeviceBuffer da(bytes), db(bytes);
  absl::Status sa, sb;
  std::thread other([&] {
    sb = copier->CopyToDevice(b, 0, db.get(), [](int64_t, int64_t) { return absl::OkStatus(); });
  });
  sa = copier->CopyToDevice(a, 0, da.get(), [](int64_t, int64_t) { return absl::OkStatus(); });
  other.join();
  ASSERT_TRUE(sa.ok()) << sa;
  ASSERT_TRUE(sb.ok()) << sb;
  EXPECT_TRUE(Fetch(da.get(), bytes) == stored_["a"]);
  EXPECT_TRUE(Fetch(db.get(), bytes) == stored_["b"]);
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0);
}

TEST_F(StagedTensorCopierTest, AKeptTensorIsCopiedDeviceToDeviceAndItsFileStillChecked) {
  std::unique_ptr<StoredTensorCopier> copier =
      cuda::MakeStagedTensorCopier(4, kStagingBytes, /*resident_bytes=*/int64_t{10} << 20);
  const int64_t kept_bytes = (int64_t{9} << 20) + 16, staged_bytes = int64_t{4} << 20;
  const RawTensor kept = Write("kept", kept_bytes, 21);
  const RawTensor staged = Write("staged", staged_bytes, 22);
  for (int call = 0; call < 2; ++call) {
    SCOPED_TRACE(call);
    DeviceBuffer dk(kept_bytes), ds(staged_bytes);
    std::vector<std::pair<int64_t, int64_t>> reports_kept, reports_staged;
    absl::Status s = copier->CopyToDevice(kept, 0, dk.get(), [&](int64_t offset, int64_t n) {
      reports_kept.emplace_back(offset, n);
      return absl::OkStatus();
    });
    ASSERT_TRUE(s.ok()) << s;
    s = copier->CopyToDevice(staged, 0, ds.get(), [&](int64_t offset, int64_t n) {
      reports_staged.emplace_back(offset, n);
      return absl::OkStatus();
    });
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(Fetch(dk.get(), kept_bytes) == stored_["kept"]);
    EXPECT_TRUE(Fetch(ds.get(), staged_bytes) == stored_["staged"]);
    // Kept: one report of the whole tensor; staged (9 + 4 MiB > 10 MiB): one per 1 MiB chunk.
    EXPECT_EQ(reports_kept, (std::vector<std::pair<int64_t, int64_t>>{{0, kept_bytes}}));
    EXPECT_EQ(reports_staged.size(), 4u);
  }
  // The kept copy is not served once its file was replaced (the same bytes in another file
  // renamed over it: a new inode; deleting it first could give the new file the same inode
  // number, as on the H200 host's disk, which the modification time then tells).
  {
    std::ofstream out(kept.file + ".new", std::ios::binary);
    out << std::string(kHeaderBytes, '\0');
    out.write(reinterpret_cast<const char*>(stored_["kept"].data()),
              static_cast<std::streamsize>(kept_bytes));
  }
  ASSERT_EQ(::rename((kept.file + ".new").c_str(), kept.file.c_str()), 0);
  DeviceBuffer dk(kept_bytes);
  const absl::Status replaced =
      copier->CopyToDevice(kept, 0, dk.get(), [](int64_t, int64_t) { return absl::OkStatus(); });
  EXPECT_EQ(replaced.code(), absl::StatusCode::kDataLoss) << replaced;
  EXPECT_THAT(replaced.message(), HasSubstr("replaced"));
}

}  // namespace
}  // namespace dequantd

#endif  // DEQUANTD_HAVE_CUDA
