// Rotating a target's address list and the per-host process counter (client/address_rotation.h).
#include "client/address_rotation.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dequantd {
namespace {

TEST(AddressRotationTest, CountsTheAddressesOfListTargetsOnly) {
  EXPECT_EQ(AddressCount("ipv4:127.0.0.1:5,127.0.0.2:5,127.0.0.3:5"), 3);
  EXPECT_EQ(AddressCount("ipv6:[::1]:5,[::2]:5"), 2);
  EXPECT_EQ(AddressCount("ipv4:127.0.0.1:5"), 1);
  EXPECT_EQ(AddressCount("127.0.0.1:50051"), 1);
  EXPECT_EQ(AddressCount("dns:///dequantd-headless.ns.svc.cluster.local:50051"), 1);
  EXPECT_EQ(AddressCount("unix:/run/dequantd/dq.sock"), 1);
}

TEST(AddressRotationTest, RotatesTheListLeft) {
  const std::string target = "ipv4:10.0.0.1:50051,10.0.0.2:50051,10.0.0.3:50051";
  EXPECT_EQ(RotateAddressList(target, 0), target);
  EXPECT_EQ(RotateAddressList(target, 1), "ipv4:10.0.0.2:50051,10.0.0.3:50051,10.0.0.1:50051");
  EXPECT_EQ(RotateAddressList(target, 2), "ipv4:10.0.0.3:50051,10.0.0.1:50051,10.0.0.2:50051");
  EXPECT_EQ(RotateAddressList(target, 3), target);
  EXPECT_EQ(RotateAddressList(target, 3 * 1000003 + 1), RotateAddressList(target, 1));
  EXPECT_EQ(RotateAddressList("ipv6:[::1]:5,[::2]:5", 1), "ipv6:[::2]:5,[::1]:5");
}

TEST(AddressRotationTest, LeavesOtherTargetsAlone) {
  for (const char* target :
       {"127.0.0.1:50051", "ipv4:127.0.0.1:5", "dns:///a,b:5", "unix:/x,y", "[::1]:50051"}) {
    EXPECT_EQ(RotateAddressList(target, 1), target);
  }
}

class ProcessRotationTest : public ::testing::Test {
 protected:
  void TearDown() override { ::shm_unlink(key_.c_str()); }
  const std::string key_ = absl::StrCat("/dequantd-rotation-test.", ::getpid());
};

TEST_F(ProcessRotationTest, CountsUpFromZero) {
  EXPECT_EQ(NextProcessRotation(key_), 0u);
  EXPECT_EQ(NextProcessRotation(key_), 1u);
  EXPECT_EQ(NextProcessRotation(key_), 2u);
  struct stat st {};
  ASSERT_EQ(::stat(absl::StrCat("/dev/shm", key_).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

// Each call opens the object itself, so the flock also orders calls of one process's threads
// (as it orders separate processes): no value is handed out twice.
TEST_F(ProcessRotationTest, ConcurrentCallersGetDistinctValues) {
  constexpr int kThreads = 8, kCalls = 50;
  std::vector<std::vector<uint64_t>> values(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) values[t].push_back(NextProcessRotation(key_));
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::vector<uint64_t> all;
  for (const std::vector<uint64_t>& v : values) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], i);
}

TEST_F(ProcessRotationTest, AnObjectOthersMayWriteIsNotUsed) {
  const int fd = ::shm_open(key_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fchmod(fd, 0666), 0);
  for (int i = 0; i < 3; ++i) NextProcessRotation(key_);  // random values, the object untouched
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  EXPECT_EQ(st.st_size, 0);
  ::close(fd);
}

// One counter per (address list, command): a script alternating `info` and `dequantize` over
// two replicas would otherwise send every dequantize to the same one. FNV-1a 64 of
// "ipv4:a:1,b:1" "\0" "info" is computed here independently of the implementation.
TEST(AddressRotationTest, KeyNamesTheUserTheListAndTheCommand) {
  uint64_t h = 0xcbf29ce484222325u;
  for (unsigned char c : std::string("ipv4:a:1,b:1") + std::string(1, '\0') + "info") {
    h ^= c;
    h *= 0x100000001b3u;
  }
  EXPECT_EQ(RotationKey("ipv4:a:1,b:1", "info"), absl::StrCat("/dequantctl-rotation.", ::geteuid(),
                                                              ".", absl::Hex(h, absl::kZeroPad16)));
  EXPECT_EQ(RotationKey("ipv4:a:1,b:1", "info"), RotationKey("ipv4:a:1,b:1", "info"));
  EXPECT_NE(RotationKey("ipv4:a:1,b:1", "info"), RotationKey("ipv4:a:1,b:1", "dequantize"));
  EXPECT_NE(RotationKey("ipv4:a:1,b:1", "info"), RotationKey("ipv4:b:1,a:1", "info"));
  EXPECT_EQ(RotationKey("x", "y").rfind("/dequantctl-rotation.", 0), 0u);
}

}  // namespace
}  // namespace dequantd
