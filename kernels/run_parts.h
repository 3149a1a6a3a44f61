// Running the parts of a CPU job on one std::thread each: the fork/join shared by the CPU
// dequantization path (kernels/cpu_dequant.cc) and the CPU benchmark's copy yardstick
// (measure/benchmark_cpu.cc), so both pay the same thread start-up.
#pragma once

#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

namespace dequantd {

// Calls part(i) for i in [0, n): parts 1..n-1 each on a new std::thread (in the calling thread
// when one cannot be started), part 0 in the calling thread; returns when every part is done.
// `part` must be safe to call concurrently for distinct i. n <= 0 does nothing.
template <class Part>
void RunParts(int64_t n, const Part& part) {
  std::vector<std::thread> workers;
  workers.reserve(n > 1 ? static_cast<size_t>(n - 1) : 0);
  for (int64_t i = 1; i < n; ++i) {
    try {
      workers.emplace_back([&part, i] { part(i); });
    } catch (const std::system_error&) {
      part(i);  // no thread to be had: run this part here
    }
  }
  if (n > 0) part(0);
  for (std::thread& w : workers) w.join();
}

}  // namespace dequantd
