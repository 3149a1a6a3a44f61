// FastDivmod (kernels/cuda/fast_divmod.h) against plain division, on the host.
#include "kernels/cuda/fast_divmod.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace dequantd::cuda {
namespace {

TEST(FastDivmodTest, MatchesDivisionForDividendsBelowTwoTo31) {
  std::vector<uint32_t> divisors = {1,    2,    3,    5,       7,          8,
                                    45,   64,   128,  180,     192,        584,
                                    1120, 1792, 3584, 0x10000, 0x7FFFFFFE, 0x7FFFFFFF};
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) divisors.push_back(1 + rng() % 0x7FFFFFFFu);
  for (uint32_t d : divisors) {
    const FastDivmod f = FastDivmod::Make(d);
    std::vector<uint32_t> xs = {0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, 0x7FFFFFFF, 0x7FFFFFFE};
    for (int i = 0; i < 2000; ++i) xs.push_back(rng() & 0x7FFFFFFFu);
    for (uint32_t x : xs) {
      if (x > 0x7FFFFFFFu) continue;
      ASSERT_EQ(f.Div(x), x / d) << "x=" << x << " d=" << d;
    }
  }
}

}  // namespace
}  // namespace dequantd::cuda
