// server/regions: the same-host peer rule, host regions (open, map, bounds, truncation), the
// registry (names, limits, leases that make Unregister wait, idle release) and RegionSink
// (bounds, Unregister during a call, the copy-in fallback), the CPU backend computing into a
// region's destination, and truncation under a write (GuardedCopy: the server fails the call and
// lives on).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backend/backend.h"
#include "server/regions/cuda_region.h"
#include "server/regions/guarded_copy.h"
#include "server/regions/host_region.h"
#include "server/regions/peer.h"
#include "server/regions/region_sink.h"
#include "server/regions/registry.h"
#include "server/rpc/region_service.h"
#include "tests/observability/metrics_series.h"
#include "tests/regions/shm_file.h"
#include "tests/server/test_layer.h"

namespace dequantd::regions {
namespace {

using ::dequantd::testing::ShmFile;
using ::testing::HasSubstr;

TEST(PeerTest, SameHostPeersAreUnixSocketsAndLoopback) {
  for (const char* peer :
       {"ipv4:127.0.0.1:40000", "ipv4:127.1.2.3:1", "ipv6:[::1]:50051", "ipv6:[::ffff:127.0.0.1]:9",
        "unix:/tmp/dequantd.sock", "unix:", "unix-abstract:dequantd"}) {
    EXPECT_TRUE(IsSameHostPeer(peer)) << peer;
  }
  for (const char* peer :
       {"ipv4:10.0.0.1:40000", "ipv4:128.0.0.1:1", "ipv4:0.0.0.0:1", "ipv6:[::2]:1",
        "ipv6:[fe80::1]:5", "ipv6:[::ffff:10.0.0.1]:9", "ipv6:[::1:1", "ipv4:127.0.0.1",
        "ipv4:localhost:80", "", "127.0.0.1:1", "dns:localhost:1"}) {
    EXPECT_FALSE(IsSameHostPeer(peer)) << peer;
  }
}

TEST(HostRegionTest, ShmPathAcceptsOneComponentUnderDevShm) {
  EXPECT_EQ(*ShmPath("/x"), "/dev/shm/x");
  EXPECT_EQ(*ShmPath("/dev/shm/a.b"), "/dev/shm/a.b");
  for (const char* key :
       {"", "x", "/", "/a/b", "/..", "/.", "/dev/shm/", "/dev/shm/../etc", "/tmp/x", "../x"}) {
    const absl::StatusOr<std::string> path = ShmPath(key);
    EXPECT_EQ(path.status().code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_THAT(path.status().message(), HasSubstr("key")) << key;
  }
}

RegionSpec Spec(const std::string& name, const std::string& key, int64_t offset, int64_t size) {
  RegionSpec spec;
  spec.name = name;
  spec.key = key;
  spec.offset = offset;
  spec.byte_size = size;
  spec.owner = "test";
  return spec;
}

TEST(HostRegionTest, MapsTheObjectSharedAtTheOffset) {
  ShmFile shm("map", 3 * 4096);
  ASSERT_TRUE(shm.ok());
  // An offset that is not page-aligned: the region starts exactly there.
  absl::StatusOr<std::unique_ptr<Region>> region =
      OpenHostRegion(Spec("r", shm.key(), 4096 + 48, 100), /*pin=*/false);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ((*region)->kind(), RegionKind::kHost);
  EXPECT_FALSE((*region)->pinned());
  std::memcpy((*region)->data(), "hello", 5);
  const uint8_t more[] = {'!', '?'};
  ASSERT_TRUE((*region)->CopyIn(98, more).ok());
  EXPECT_EQ(shm.Read(4096 + 48, 5), "hello");
  EXPECT_EQ(shm.Read(4096 + 48 + 98, 2), "!?");
  EXPECT_EQ(shm.Read(4096 + 40, 8), std::string(8, '\0'));  // nothing before the offset
}

TEST(HostRegionTest, ErrorsNameTheKeyAndTheProblem) {
  ShmFile shm("errors", 1000);
  ASSERT_TRUE(shm.ok());
  absl::StatusOr<std::unique_ptr<Region>> r =
      OpenHostRegion(Spec("r", "/dequantd-test-no-such-object", 0, 1), false);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("dequantd-test-no-such-object"));

  r = OpenHostRegion(Spec("r", shm.key(), 992, 16), false);  // 992 + 16 > 1000
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("is 1000 bytes: offset 992 + byte_size 16"));

  const std::string link = absl::StrCat("/dev/shm/dequantd-test.", getpid(), ".link");
  std::filesystem::remove(link);
  std::filesystem::create_symlink(shm.path(), link);
  r = OpenHostRegion(Spec("r", link, 0, 1), false);
  std::filesystem::remove(link);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("symlink"));

  const std::string dir = absl::StrCat("/dev/shm/dequantd-test.", getpid(), ".dir");
  std::filesystem::create_directory(dir);
  r = OpenHostRegion(Spec("r", dir, 0, 1), false);
  std::filesystem::remove(dir);
  EXPECT_NE(r.status().code(), absl::StatusCode::kOk);

  if (geteuid() != 0) {  // root opens anything
    ShmFile readonly("readonly", 64);
    ASSERT_EQ(chmod(readonly.path().c_str(), 0400), 0);
    r = OpenHostRegion(Spec("r", readonly.key(), 0, 64), false);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
  }
}

TEST(CudaRegionTest, HandleOfTheWrongLengthIsInvalidArgumentOrNoCudaIsFailedPrecondition) {
  RegionSpec spec = Spec("d", "", 0, 16);
  spec.device = 0;
  absl::StatusOr<std::unique_ptr<Region>> r = OpenCudaRegion(spec, std::string(63, 'x'));
#if DEQUANTD_HAVE_CUDA
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("raw_handle must be 64 bytes"));
#else
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
#endif
}

// A host region over a plain buffer that records its release.
class FakeRegion final : public Region {
 public:
  FakeRegion(const std::string& name, int64_t size, std::atomic<int>* released,
             RegionKind kind = RegionKind::kHost)
      : Region(Spec(name, "", 0, size)),
        bytes_(static_cast<size_t>(size)),
        released_(released),
        kind_(kind) {}
  ~FakeRegion() override {
    if (released_ != nullptr) ++*released_;
  }
  RegionKind kind() const override { return kind_; }
  uint8_t* data() const override { return const_cast<uint8_t*>(bytes_.data()); }
  absl::Status CopyIn(int64_t offset, absl::Span<const uint8_t> bytes) override {
    ++copies;
    std::memcpy(bytes_.data() + offset, bytes.data(), bytes.size());
    return absl::OkStatus();
  }
  int copies = 0;

 private:
  std::vector<uint8_t> bytes_;
  std::atomic<int>* released_;
  RegionKind kind_;
};

TEST(RegistryTest, NamesAreUniqueAndLimitsHold) {
  RegionTotals last;
  RegionRegistry registry(RegistryLimits{.max_regions = 2, .max_bytes = 1000},
                          [&](const RegionTotals& t) { last = t; });
  ASSERT_TRUE(registry.Add(std::make_unique<FakeRegion>("a", 600, nullptr)).ok());
  EXPECT_EQ(last.host_count, 1);
  EXPECT_EQ(last.host_bytes, 600);
  absl::Status s = registry.CheckCanAdd("a", 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(s.message(), HasSubstr("\"a\""));
  s = registry.CheckCanAdd("b", 401);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("--shared-memory-max-bytes"));
  EXPECT_EQ(registry.Add(std::make_unique<FakeRegion>("b", 401, nullptr)).code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(registry.Add(std::make_unique<FakeRegion>("b", 400, nullptr)).ok());
  s = registry.CheckCanAdd("c", 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("--shared-memory-max-regions"));
  ASSERT_TRUE(
      registry.Add(std::make_unique<FakeRegion>("d", 0, nullptr, RegionKind::kDevice)).code() ==
      absl::StatusCode::kResourceExhausted);

  EXPECT_EQ(registry.Acquire("zz").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Remove("a", RegionKind::kDevice).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(registry.Remove("a", RegionKind::kHost).ok());
  EXPECT_EQ(last.host_count, 1);
  EXPECT_EQ(last.host_bytes, 400);
  EXPECT_TRUE(registry.CheckCanAdd("a", 600).ok());
  EXPECT_EQ(registry.RemoveAll(RegionKind::kHost), 1);
  EXPECT_EQ(last.host_count, 0);
  EXPECT_TRUE(registry.List().empty());
}

TEST(RegistryTest, RemoveWaitsForLeasesAndReleasesAfterTheLast) {
  std::atomic<int> released{0};
  RegionRegistry registry({});
  ASSERT_TRUE(registry.Add(std::make_unique<FakeRegion>("r", 64, &released)).ok());
  absl::StatusOr<RegionLease> lease = registry.Acquire("r");
  ASSERT_TRUE(lease.ok());
  EXPECT_FALSE(lease->closing());
  EXPECT_EQ(registry.List()[0].calls_in_flight, 1);

  std::atomic<bool> removed{false};
  std::thread remover([&] {
    EXPECT_TRUE(registry.Remove("r", RegionKind::kHost).ok());
    removed = true;
  });
  // The name goes at once (new calls get NOT_FOUND) and the holder is told to stop ...
  while (registry.Acquire("r").ok()) std::this_thread::yield();
  EXPECT_TRUE(lease->closing());
  // ... but the memory stays until the lease ends: Remove has not returned, nothing released.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(removed.load());
  EXPECT_EQ(released.load(), 0);
  lease->region().data()[63] = 1;  // still mapped: writing is safe
  *lease = RegionLease();          // the call ends
  remover.join();
  EXPECT_TRUE(removed.load());
  EXPECT_EQ(released.load(), 1);
}

TEST(RegistryTest, ReleaseIdleTakesOnlyUnusedRegionsOlderThanTheIdleTime) {
  std::atomic<int> released{0};
  RegionRegistry registry({});
  ASSERT_TRUE(registry.Add(std::make_unique<FakeRegion>("old", 8, &released)).ok());
  ASSERT_TRUE(registry.Add(std::make_unique<FakeRegion>("busy", 8, &released)).ok());
  absl::StatusOr<RegionLease> busy = registry.Acquire("busy");
  ASSERT_TRUE(busy.ok());
  const auto now = RegionRegistry::Clock::now();
  EXPECT_TRUE(registry.ReleaseIdle(now, std::chrono::hours(1)).empty());
  EXPECT_THAT(registry.ReleaseIdle(now + std::chrono::hours(2), std::chrono::hours(1)),
              ::testing::ElementsAre("old"));
  EXPECT_EQ(released.load(), 1);
  *busy = RegionLease();
  EXPECT_THAT(registry.ReleaseIdle(RegionRegistry::Clock::now() + std::chrono::hours(2),
                                   std::chrono::hours(1)),
              ::testing::ElementsAre("busy"));
  EXPECT_EQ(released.load(), 2);
}

TEST(RegistryTest, ATruncatedObjectIsFailedPreconditionBeforeAnyWrite) {
  ShmFile shm("truncated", 8192);
  ASSERT_TRUE(shm.ok());
  RegionRegistry registry({});
  absl::StatusOr<std::unique_ptr<Region>> region =
      OpenHostRegion(Spec("t", shm.key(), 0, 8192), false);
  ASSERT_TRUE(region.ok());
  ASSERT_TRUE(registry.Add(std::move(*region)).ok());
  EXPECT_TRUE(registry.Acquire("t").ok());
  ASSERT_TRUE(shm.Truncate(4096));
  const absl::Status s = registry.Acquire("t").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("truncated to 4096 bytes"));
}

// Forwards a backend's calls to a RegionSink (its destination included), recording Begin and
// BeginLayer; `on_begin` runs in Begin, before the sink's.
class Recorder final : public LayersSink {
 public:
  explicit Recorder(RegionSink& sink) : sink_(sink) {}
  const ResultDestination* destination() const override { return sink_.destination(); }
  absl::Status Begin(const std::string& kernel) override {
    calls.push_back("Begin " + kernel);
    if (on_begin) on_begin();
    return sink_.Begin(kernel);
  }
  absl::Status BeginLayer(int64_t index) override {
    calls.push_back("BeginLayer " + std::to_string(index));
    return sink_.BeginLayer(index);
  }
  absl::Status Write(int64_t offset, absl::Span<const uint8_t> bytes) override {
    return sink_.Write(offset, bytes);
  }
  std::vector<std::string> calls;
  std::function<void()> on_begin;

 private:
  RegionSink& sink_;
};

using ::dequantd::testing::PackedLayer;
using ::dequantd::testing::RandomPackedLayer;
using ::dequantd::testing::ReferenceBytes;

TEST(RegionSinkTest, CpuBackendComputesIntoTheRegionAtTheOffset) {
  const PackedLayer layer = RandomPackedLayer({.K = 512, .N = 1024, .group_size = 128}, 7);
  const std::vector<uint8_t> expected = ReferenceBytes(layer, DType::kF16);
  const int64_t offset = 4096 + 16;
  auto fake = std::make_unique<FakeRegion>("r", offset + static_cast<int64_t>(expected.size()) + 64,
                                           nullptr);
  FakeRegion* region = fake.get();
  RegionRegistry registry({});
  ASSERT_TRUE(registry.Add(std::move(fake)).ok());
  int64_t delivered = 0;
  int reports = 0;
  {
    RegionSink sink(*registry.Acquire("r"), offset, {static_cast<int64_t>(expected.size())},
                    nullptr, [&](RegionKind, int64_t n) {
                      delivered += n;
                      ++reports;
                    });
    std::unique_ptr<Backend> backend = MakeCpuBackend(2);
    DequantSource source;
    source.host = layer.view();
    ASSERT_TRUE(backend->Dequantize(source, DType::kF16, 100000, sink).ok());
    EXPECT_EQ(sink.kernel(), "cpu threads=2");
    EXPECT_EQ(reports, 0);  // counted once, when the call's sink goes
  }
  EXPECT_EQ(std::memcmp(region->data() + offset, expected.data(), expected.size()), 0);
  EXPECT_EQ(region->data()[offset - 1], 0);                // nothing before
  EXPECT_EQ(region->data()[offset + expected.size()], 0);  // nothing after
  EXPECT_EQ(region->copies, 0);  // computed in place: no copy through CopyIn
  EXPECT_EQ(delivered, static_cast<int64_t>(expected.size()));
  EXPECT_EQ(reports, 1);
}

// The on_begin hook (the service encodes the reply there, while the kernel runs) runs once per
// Begin, after kernel() is set, and never before Begin.
TEST(RegionSinkTest, OnBeginRunsInBeginWithTheKernelSet) {
  RegionRegistry registry({});
  ASSERT_TRUE(registry.Add(std::make_unique<FakeRegion>("r", 4096, nullptr)).ok());
  RegionSink sink(*registry.Acquire("r"), 0, {1024}, nullptr, nullptr);
  std::vector<std::string> seen;
  sink.set_on_begin([&] { seen.push_back(sink.kernel()); });
  ASSERT_TRUE(sink.BeginLayer(0).ok());
  EXPECT_TRUE(seen.empty());
  ASSERT_TRUE(sink.Begin("grouped layers=1").ok());
  EXPECT_EQ(seen, std::vector<std::string>{"grouped layers=1"});
  ASSERT_TRUE(sink.Begin("grouped layers=2").ok());  // again: the hook sees the new kernel
  EXPECT_EQ(seen, (std::vector<std::string>{"grouped layers=1", "grouped layers=2"}));
}

TEST(RegionSinkTest, CpuDequantizeLayersPlacesTheLayersOneAfterAnother) {
  const PackedLayer a = RandomPackedLayer({.K = 128, .N = 256, .group_size = 64}, 1);
  const PackedLayer b =
      RandomPackedLayer({.K = 64, .N = 512, .group_size = 32, .scale_dtype = DType::kBF16}, 2);
  const QuantizedLayer la{.name = "a", .view = a.view(), .file = ""};
  const QuantizedLayer lb{.name = "b", .view = b.view(), .file = ""};
  const std::vector<uint8_t> ea = ReferenceBytes(a, DType::kF32),
                             eb = ReferenceBytes(b, DType::kF32);
  const int64_t na = static_cast<int64_t>(ea.size()), nb = static_cast<int64_t>(eb.size());
  auto fake = std::make_unique<FakeRegion>("r", 32 + nb + na + nb, nullptr);
  FakeRegion* region = fake.get();
  RegionRegistry registry({});
  ASSERT_TRUE(registry.Add(std::move(fake)).ok());
  RegionSink sink(*registry.Acquire("r"), 32, {nb, na, nb}, nullptr, nullptr);
  Recorder headers(sink);
  EXPECT_THAT(sink.result_offsets(), ::testing::ElementsAre(32, 32 + nb, 32 + nb + na));
  std::unique_ptr<Backend> backend = MakeCpuBackend(2);
  const std::vector<const QuantizedLayer*> layers = {&lb, &la, &lb};
  ASSERT_TRUE(
      backend->DequantizeLayers(layers, DType::kF32, Orientation::kKN, 1 << 16, headers).ok());
  EXPECT_EQ(sink.kernel(), "cpu threads=2");
  EXPECT_EQ(std::memcmp(region->data() + 32, eb.data(), eb.size()), 0);
  EXPECT_EQ(std::memcmp(region->data() + 32 + nb, ea.data(), ea.size()), 0);
  EXPECT_EQ(std::memcmp(region->data() + 32 + nb + na, eb.data(), eb.size()), 0);
  EXPECT_EQ(region->copies, 0);
  EXPECT_THAT(headers.calls, ::testing::ElementsAre("Begin cpu threads=2", "BeginLayer 0",
                                                    "BeginLayer 1", "BeginLayer 2"));
}

TEST(RegionSinkTest, UnregisterDuringTheCallAbortsItAndReleasesTheRegionAfterIt) {
  const PackedLayer layer = RandomPackedLayer({.K = 1024, .N = 2048, .group_size = 128}, 3);
  const int64_t bytes = layer.shape.output_bytes(DType::kF16);
  std::atomic<int> released{0};
  RegionRegistry registry({});
  ASSERT_TRUE(registry.Add(std::make_unique<FakeRegion>("r", bytes, &released)).ok());
  std::thread remover;
  std::atomic<bool> removed{false};
  absl::Status call;
  {
    RegionSink sink(*registry.Acquire("r"), 0, {bytes}, nullptr, nullptr);
    Recorder headers(sink);
    // Unregister arrives once the call has begun; it waits for the call.
    headers.on_begin = [&] {
      remover = std::thread([&] {
        EXPECT_TRUE(registry.Remove("r", RegionKind::kHost).ok());
        removed = true;
      });
      while (registry.Acquire("r").ok()) std::this_thread::yield();
    };
    std::unique_ptr<Backend> backend = MakeCpuBackend(2);
    DequantSource source;
    source.host = layer.view();
    call = backend->Dequantize(source, DType::kF16, 1 << 20, headers);
    EXPECT_EQ(released.load(), 0);  // the sink still holds its lease
  }
  remover.join();
  EXPECT_EQ(call.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(call.message(), HasSubstr("region \"r\" was unregistered"));
  EXPECT_TRUE(removed.load());
  EXPECT_EQ(released.load(), 1);
}

TEST(RegionSinkTest, WritesAreBoundsCheckedAndForeignBytesAreCopiedIn) {
  RegionRegistry registry({});
  auto fake = std::make_unique<FakeRegion>("r", 256, nullptr);
  FakeRegion* region = fake.get();
  ASSERT_TRUE(registry.Add(std::move(fake)).ok());
  bool cancelled = false;
  RegionSink sink(
      *registry.Acquire("r"), 64, {128}, [&] { return cancelled; }, nullptr);
  ASSERT_TRUE(sink.Begin("k").ok());
  const std::vector<uint8_t> bytes(100, 7);
  // A backend that ignores destination() hands its own buffer: copied in at the right place.
  ASSERT_TRUE(sink.Write(16, bytes).ok());
  EXPECT_EQ(region->copies, 1);
  EXPECT_EQ(region->data()[64 + 16], 7);
  EXPECT_EQ(region->data()[64 + 15], 0);
  absl::Status s = sink.Write(29, bytes);  // 29 + 100 > 128
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("region \"r\": a write of 100 bytes at result offset 29"));
  EXPECT_EQ(sink.Write(-1, bytes).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(region->copies, 1);  // nothing written out of bounds
}

TEST(RegionSinkTest, TheFirstWriteOfACancelledCallIsCancelled) {
  RegionRegistry registry({});
  auto fake = std::make_unique<FakeRegion>("r", 256, nullptr);
  FakeRegion* region = fake.get();
  ASSERT_TRUE(registry.Add(std::move(fake)).ok());
  int polls = 0;
  RegionSink sink(
      *registry.Acquire("r"), 0, {256}, [&] { return ++polls > 0; }, nullptr);
  ASSERT_TRUE(sink.Begin("k").ok());
  const std::vector<uint8_t> bytes(16, 7);
  const absl::Status s = sink.Write(0, bytes);  // the first Write always asks
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(s.message(), "the client cancelled the call");
  EXPECT_EQ(polls, 1);
  EXPECT_EQ(region->copies, 0);  // stopped before writing
}

// A shared mapping of `shm` (every byte), unmapped on destruction.
class Mapping {
 public:
  Mapping(const ShmFile& shm, size_t bytes) : bytes_(bytes) {
    const int fd = shm_open(shm.key().c_str(), O_RDWR, 0);
    if (fd >= 0) {
      void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
      if (map != MAP_FAILED) data_ = static_cast<uint8_t*>(map);
    }
  }
  ~Mapping() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  uint8_t* data() const { return data_; }

 private:
  uint8_t* data_ = nullptr;
  size_t bytes_;
};

TEST(GuardedCopyTest, ATruncatedObjectEndsTheCopyWithFalseAndTheProcessLivesOn) {
  constexpr size_t kBytes = 16 * 4096;
  ShmFile shm("guarded", kBytes);
  ASSERT_TRUE(shm.ok());
  Mapping map(shm, kBytes);
  ASSERT_NE(map.data(), nullptr);
  const std::vector<uint8_t> source(kBytes, 0x5A);
  EXPECT_TRUE(GuardedCopy(map.data(), source.data(), kBytes, map.data(), kBytes));
  EXPECT_EQ(shm.Read(kBytes - 1, 1), "\x5A");
  // Shrunk to 4 pages: a plain memcpy into page 4 would raise SIGBUS.
  ASSERT_TRUE(shm.Truncate(4 * 4096));
  EXPECT_FALSE(GuardedCopy(map.data(), source.data(), kBytes, map.data(), kBytes));
  EXPECT_FALSE(GuardedCopy(map.data() + 8 * 4096, source.data(), 100, map.data(), kBytes));
  // The pages below the new end still take writes; grown back, the whole mapping does.
  EXPECT_TRUE(GuardedCopy(map.data(), source.data(), 4 * 4096, map.data(), kBytes));
  ASSERT_TRUE(shm.Truncate(kBytes));
  EXPECT_TRUE(GuardedCopy(map.data(), source.data(), kBytes, map.data(), kBytes));
  EXPECT_EQ(shm.Read(kBytes - 1, 1), "\x5A");
}

// The process died of a SIGBUS outside every guarded copy: by the default action, or, when a
// sanitizer installed the handler GuardedCopy replaced, by that handler (AddressSanitizer
// reports "BUS on unknown address" and exits 1).
bool DiedOfTheFault(int status) {
#if defined(__SANITIZE_ADDRESS__)
  if (WIFEXITED(status) && WEXITSTATUS(status) == 1) return true;
#endif
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS;
}

TEST(GuardedCopyDeathTest, AFaultOutsideAGuardedCopyStillKillsWithSigbus) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  constexpr size_t kBytes = 4 * 4096;
  ShmFile shm("unguarded", kBytes);
  ASSERT_TRUE(shm.ok());
  const std::vector<uint8_t> source(kBytes, 1);
  uint8_t elsewhere[64];
  EXPECT_EXIT(
      {
        Mapping map(shm, kBytes);
        GuardedCopy(elsewhere, source.data(), sizeof elsewhere, elsewhere, sizeof elsewhere);
        shm.Truncate(0);
        // The child dies below without running destructors: its own object (named by its pid)
        // is unlinked here, or each run left it in /dev/shm. The mapping keeps it alive.
        shm_unlink(shm.key().c_str());
        // The handler is installed; this write is in no guarded range: the default action.
        volatile uint8_t* page = map.data() + 4096;
        *page = 1;
        std::exit(0);
      },
      DiedOfTheFault, "");
  EXPECT_EXIT(
      {
        Mapping map(shm, kBytes);
        shm.Truncate(0);
        shm_unlink(shm.key().c_str());  // as above
        // A guarded copy whose range is another buffer does not cover this mapping.
        GuardedCopy(map.data(), source.data(), kBytes, elsewhere, sizeof elsewhere);
        std::exit(0);
      },
      DiedOfTheFault, "");
}

TEST(HostRegionTest, CopyInToATruncatedObjectIsFailedPrecondition) {
  ShmFile shm("copy-in", 8 * 4096);
  ASSERT_TRUE(shm.ok());
  absl::StatusOr<std::unique_ptr<Region>> region =
      OpenHostRegion(Spec("r", shm.key(), 0, 8 * 4096), /*pin=*/false);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_FALSE((*region)->direct_writes());  // not pinned: the server's CPU writes are guarded
  ASSERT_TRUE(shm.Truncate(4096));
  const std::vector<uint8_t> bytes(4096, 3);
  const absl::Status s = (*region)->CopyIn(2 * 4096, bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("region \"r\": its object " + shm.key() +
                                     " was truncated while a result was written into it"));
  EXPECT_THAT(s.message(), HasSubstr("at region offset 8192"));
  EXPECT_TRUE((*region)->CopyIn(0, bytes).ok());  // below the new end: fine
}

TEST(RegionSinkTest, ATruncationDuringACpuCallFailsItPreciselyAndTheNextCallWorks) {
  const PackedLayer layer = RandomPackedLayer({.K = 1024, .N = 2048, .group_size = 128}, 5);
  const std::vector<uint8_t> expected = ReferenceBytes(layer, DType::kF16);
  const int64_t bytes = static_cast<int64_t>(expected.size());
  ShmFile shm("during", bytes);
  ASSERT_TRUE(shm.ok());
  RegionRegistry registry({});
  absl::StatusOr<std::unique_ptr<Region>> region =
      OpenHostRegion(Spec("r", shm.key(), 0, bytes), /*pin=*/false);
  ASSERT_TRUE(region.ok()) << region.status();
  ASSERT_TRUE(registry.Add(std::move(*region)).ok());
  std::unique_ptr<Backend> backend = MakeCpuBackend(2);
  DequantSource source;
  source.host = layer.view();
  {
    // The object shrinks after the call's check at Acquire, before the first byte is written.
    RegionSink sink(*registry.Acquire("r"), 0, {bytes}, nullptr, nullptr);
    Recorder headers(sink);
    headers.on_begin = [&] { ASSERT_TRUE(shm.Truncate(4096)); };
    EXPECT_EQ(sink.destination(), nullptr);  // unpinned host memory: written through CopyIn
    const absl::Status s = backend->Dequantize(source, DType::kF16, 1 << 20, headers);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), HasSubstr("truncated to 4096 bytes"));
  }
  // Grown back, the same region takes the next call whole.
  ASSERT_TRUE(shm.Truncate(bytes));
  RegionSink sink(*registry.Acquire("r"), 0, {bytes}, nullptr, nullptr);
  ASSERT_TRUE(backend->Dequantize(source, DType::kF16, 1 << 20, sink).ok());
  EXPECT_TRUE(shm.Read(0, bytes) == std::string(expected.begin(), expected.end()));
}

RegionServiceOptions Mode(SharedMemoryMode mode, std::vector<int> cuda_devices = {}) {
  RegionServiceOptions options;
  options.mode = mode;
  options.cuda_devices = std::move(cuda_devices);
  return options;
}

// The RPC layer's rules, with the peer given directly (a test cannot connect from another host).
TEST(RegionServiceTest, RemotePeersArePermissionDeniedAndTheModeIsEnforced) {
  ShmFile shm("service", 4096);
  ASSERT_TRUE(shm.ok());
  RegionService host(Mode(SharedMemoryMode::kHost), nullptr);
  dequant::v1::RegisterSystemSharedMemoryRequest request;
  request.set_name("r");
  request.set_key(shm.key());
  request.set_byte_size(4096);
  dequant::v1::RegisterSystemSharedMemoryResponse response;
  for (const char* remote : {"ipv4:192.168.1.20:50000", "ipv6:[2001:db8::1]:1"}) {
    const absl::Status s = host.RegisterSystem(remote, request, &response);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << remote;
    EXPECT_THAT(s.message(), HasSubstr(remote));
  }
  ASSERT_TRUE(host.RegisterSystem("ipv6:[::1]:4000", request, &response).ok());
  // A remote peer may not name it as an output either, nor list or unregister it.
  dequant::v1::OutputRegion output;
  output.set_name("r");
  EXPECT_EQ(host.MakeSink("ipv4:10.1.1.1:7", output, {16}, nullptr).status().code(),
            absl::StatusCode::kPermissionDenied);
  dequant::v1::SharedMemoryStatusResponse status;
  EXPECT_EQ(host.Status("ipv4:10.1.1.1:7", &status).code(), absl::StatusCode::kPermissionDenied);
  dequant::v1::UnregisterSystemSharedMemoryRequest unregister;
  dequant::v1::UnregisterSystemSharedMemoryResponse released;
  EXPECT_EQ(host.UnregisterSystem("ipv4:10.1.1.1:7", unregister, &released).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(host.MakeSink("unix:/run/x.sock", output, {16}, nullptr).ok());

  // Host mode refuses device regions; cuda mode refuses host regions.
  dequant::v1::RegisterCudaSharedMemoryRequest cuda;
  cuda.set_name("d");
  cuda.set_raw_handle(std::string(64, '\0'));
  cuda.set_byte_size(16);
  dequant::v1::RegisterCudaSharedMemoryResponse cuda_response;
  EXPECT_EQ(host.RegisterCuda("ipv4:127.0.0.1:1", cuda, &cuda_response).code(),
            absl::StatusCode::kFailedPrecondition);
  RegionService device_only(Mode(SharedMemoryMode::kCuda, {0}), nullptr);
  request.set_name("r2");
  const absl::Status s = device_only.RegisterSystem("ipv4:127.0.0.1:1", request, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("--shared-memory=cuda"));
}

TEST(RegionServiceTest, ADeviceTheBackendDoesNotUseIsFailedPrecondition) {
  RegionService service(Mode(SharedMemoryMode::kAll, {0}), nullptr);
  dequant::v1::RegisterCudaSharedMemoryRequest cuda;
  cuda.set_name("d");
  cuda.set_raw_handle(std::string(64, '\0'));
  cuda.set_device_id(1);
  cuda.set_byte_size(16);
  dequant::v1::RegisterCudaSharedMemoryResponse response;
  absl::Status s = service.RegisterCuda("ipv4:127.0.0.1:1", cuda, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("device_id 1: the backend does not compute on that device"));
  RegionService cpu(Mode(SharedMemoryMode::kAll), nullptr);
  cuda.set_device_id(0);
  s = cpu.RegisterCuda("ipv4:127.0.0.1:1", cuda, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("cpu backend"));
}

TEST(RegionServiceTest, MetricsCountRegionsAndDeliveredBytesPerDestination) {
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create("", "test");
  ASSERT_TRUE(metrics.ok());
  const auto value = [&](const std::string& name, const testing::Labels& labels) {
    return testing::SeriesValue(**metrics, name, labels).value_or(-1);
  };
  const PackedLayer layer = RandomPackedLayer({.K = 64, .N = 256, .group_size = 64}, 5);
  const int64_t bytes = layer.shape.output_bytes(DType::kF16);
  ShmFile shm("metrics", bytes);
  ASSERT_TRUE(shm.ok());
  RegionService service(Mode(SharedMemoryMode::kHost), metrics->get());
  EXPECT_EQ(value("dequantd_shared_memory_regions", {{"kind", "host"}}), 0);
  EXPECT_EQ(value("dequantd_shared_memory_region_bytes", {{"kind", "device"}}), 0);
  dequant::v1::RegisterSystemSharedMemoryRequest request;
  request.set_name("m");
  request.set_key(shm.key());
  request.set_byte_size(bytes);
  dequant::v1::RegisterSystemSharedMemoryResponse response;
  ASSERT_TRUE(service.RegisterSystem("unix:", request, &response).ok());
  EXPECT_EQ(value("dequantd_shared_memory_regions", {{"kind", "host"}}), 1);
  EXPECT_EQ(value("dequantd_shared_memory_region_bytes", {{"kind", "host"}}), bytes);

  dequant::v1::OutputRegion output;
  output.set_name("m");
  absl::StatusOr<std::unique_ptr<RegionSink>> sink =
      service.MakeSink("unix:", output, {bytes}, nullptr);
  ASSERT_TRUE(sink.ok()) << sink.status();
  DequantSource source;
  source.host = layer.view();
  ASSERT_TRUE(MakeCpuBackend(1)->Dequantize(source, DType::kF16, 4096, **sink).ok());
  sink->reset();
  EXPECT_EQ(value("dequantd_delivered_bytes_total", {{"destination", "host_region"}}), bytes);
  EXPECT_EQ(value("dequantd_delivered_bytes_total", {{"destination", "device_region"}}), 0);
  EXPECT_EQ(shm.Read(0, bytes),
            std::string(reinterpret_cast<const char*>(ReferenceBytes(layer, DType::kF16).data()),
                        static_cast<size_t>(bytes)));
  dequant::v1::UnregisterSystemSharedMemoryRequest unregister;
  dequant::v1::UnregisterSystemSharedMemoryResponse released;
  ASSERT_TRUE(service.UnregisterSystem("unix:", unregister, &released).ok());
  EXPECT_EQ(released.released(), 1);
  EXPECT_EQ(value("dequantd_shared_memory_regions", {{"kind", "host"}}), 0);
  EXPECT_EQ(value("dequantd_shared_memory_region_bytes", {{"kind", "host"}}), 0);
}

TEST(RegionServiceTest, ParsesTheModeFlag) {
  EXPECT_EQ(*ParseSharedMemoryMode("off"), SharedMemoryMode::kOff);
  EXPECT_EQ(*ParseSharedMemoryMode("all"), SharedMemoryMode::kAll);
  EXPECT_STREQ(SharedMemoryModeName(*ParseSharedMemoryMode("cuda")), "cuda");
  EXPECT_STREQ(SharedMemoryModeName(*ParseSharedMemoryMode("host")), "host");
  const absl::Status s = ParseSharedMemoryMode("on").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--shared-memory"));
}

}  // namespace
}  // namespace dequantd::regions
