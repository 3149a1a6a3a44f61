// The copy-rate ceilings without CUDA: none (see device_copy.h).
#include "bench/e2e/device_copy.h"

namespace dequantd::e2e {

double PinnedDeviceToHostBytesPerSecond(int64_t, std::string* device) {
  device->clear();
  return 0;
}

double DeviceCopyBytesPerSecond(int64_t) { return 0; }

}  // namespace dequantd::e2e
