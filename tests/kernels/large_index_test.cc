// 64-bit indexing: the last rows of a layer with K * N / 8 > 2^32 packed words (K = 2^20,
// N = 32776, so qweight alone spans 17 GiB of address space). The inputs are anonymous
// MAP_NORESERVE mappings: only the pages of the rows written here get memory, and untouched
// pages read as zero. A 32-bit (or unsigned 32-bit) qweight index would wrap into those zero
// pages, giving q = 0 where every q written here is >= 1.
#include <sys/mman.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/awq_format.h"
#include "kernels/cpu_dequant_internal.h"
#include "kernels/dequant.h"
#include "tests/kernels/test_util.h"

namespace dequantd {
namespace {

// An anonymous, lazily backed mapping of `bytes` bytes.
class LazyBuffer {
 public:
  explicit LazyBuffer(int64_t bytes) : bytes_(static_cast<size_t>(bytes)) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : p;
  }
  ~LazyBuffer() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  LazyBuffer(const LazyBuffer&) = delete;
  LazyBuffer& operator=(const LazyBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  size_t bytes_;
  void* data_;
};

constexpr int64_t kK = int64_t{1} << 20;
constexpr int64_t kN = 32776;  // 8 * 4097
constexpr int64_t kG = 128;

// Values written for row k, column n (k in the last two rows, n in [0, N)).
uint32_t Q(int64_t k, int64_t n) { return 1 + static_cast<uint32_t>((n + k) % 15); }  // 1..15
uint32_t Z(int64_t n) { return static_cast<uint32_t>((n * 7) % 16); }
// fp16 scale 1 + m/1024 with m = n % 64: bits 0x3C00 + m.
uint16_t ScaleBits(int64_t n) { return static_cast<uint16_t>(0x3C00 + n % 64); }
double Expected(int64_t k, int64_t n) {
  return (static_cast<double>(Q(k, n)) - Z(n)) * (1.0 + static_cast<double>(n % 64) / 1024.0);
}

TEST(LargeIndexTest, LastRowsOfK1048576N32776G128) {
  const QuantShape shape{.K = kK, .N = kN, .group_size = kG, .scale_dtype = DType::kF16};
  ASSERT_TRUE(ValidateShape(shape, DType::kF32).ok());
  ASSERT_GT(awq::QweightElements(shape), int64_t{1} << 32);
  LazyBuffer qweight(awq::QweightBytes(shape));
  LazyBuffer qzeros(awq::QzerosBytes(shape));
  LazyBuffer scales(awq::ScalesBytes(shape));
  if (qweight.as<void>() == nullptr || qzeros.as<void>() == nullptr ||
      scales.as<void>() == nullptr) {
    GTEST_SKIP() << "cannot reserve " << awq::QweightBytes(shape) << " bytes of address space";
  }
  const int64_t words = kN / 8;
  const int64_t last_group = kK / kG - 1;
  for (int64_t k = kK - 2; k < kK; ++k) {
    for (int64_t c = 0; c < words; ++c) {
      std::array<uint32_t, 8> q;
      for (int i = 0; i < 8; ++i) q[i] = Q(k, 8 * c + i);
      qweight.as<int32_t>()[k * words + c] = static_cast<int32_t>(testing::PackColumns(q));
    }
  }
  for (int64_t c = 0; c < words; ++c) {
    std::array<uint32_t, 8> z;
    for (int i = 0; i < 8; ++i) z[i] = Z(8 * c + i);
    qzeros.as<int32_t>()[last_group * words + c] = static_cast<int32_t>(testing::PackColumns(z));
  }
  for (int64_t n = 0; n < kN; ++n) scales.as<uint16_t>()[last_group * kN + n] = ScaleBits(n);
  const QuantView view =
      awq::MakeView(shape, qweight.as<int32_t>(), qzeros.as<int32_t>(), scales.as<void>());

  auto check = [](const std::vector<float>& out, int64_t row_begin, const char* what) {
    int bad = 0;
    for (int64_t r = 0; r < static_cast<int64_t>(out.size()) / kN; ++r) {
      for (int64_t n = 0; n < kN; ++n) {
        const double want = Expected(row_begin + r, n);
        if (out[r * kN + n] != want && ++bad <= 5) {
          ADD_FAILURE() << what << ": row " << row_begin + r << " column " << n << ": got "
                        << out[r * kN + n] << ", want " << want;
        }
      }
    }
  };
  std::vector<float> out(2 * kN, -1.0f);
  ASSERT_TRUE(DequantizeReference(view, DType::kF32, kK - 2, kK, out.data()).ok());
  check(out, kK - 2, "reference");
  for (int threads : {1, 2}) {
    for (int64_t rows : {1, 2}) {  // one row and two threads: the row's words are split
      std::vector<float> cpu_out(static_cast<size_t>(rows * kN), -1.0f);
      ASSERT_TRUE(cpu::DequantizeCpuWithOptions(view, DType::kF32, kK - rows, kK, cpu_out.data(),
                                                {.threads = threads, .min_elements_per_thread = 1})
                      .ok());
      check(cpu_out, kK - rows, "DequantizeCpu");
    }
  }
}

}  // namespace
}  // namespace dequantd
