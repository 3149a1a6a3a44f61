// Runs the real dequantctl binary (DequantctlPath(): $DEQUANTCTL or the build's) against an
// in-process server: exit codes, the files it writes (.npy, .safetensors, raw) byte for byte,
// --packed input, --compare, and one-line errors.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "client/shm_client.h"
#include "formats/npy.h"
#include "formats/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_support.h"

namespace dequantd::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

struct CommandResult {
  int exit_code = -1;
  std::string out, err;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs dequantctl with `args`, capturing stdout and stderr through files in `dir`.
CommandResult RunDequantctl(const std::string& dir, const std::vector<std::string>& args) {
  const std::string out_path = dir + "/stdout.txt", err_path = dir + "/stderr.txt";
  std::vector<std::string> argv_strings = {DequantctlPath()};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out, 1);
    ::dup2(err, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  CommandResult run;
  int status = 0;
  if (pid > 0 && ::waitpid(pid, &status, 0) == pid && WIFEXITED(status)) {
    run.exit_code = WEXITSTATUS(status);
  }
  run.out = ReadAll(out_path);
  run.err = ReadAll(err_path);
  return run;
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

std::vector<uint8_t> FileBytes(const std::string& path) {
  const std::string s = ReadAll(path);
  return std::vector<uint8_t>(s.begin(), s.end());
}

// The shared server lets dequantctl --shm register host regions.
ServerOptions HostRegionsOptions() {
  ServerOptions options;
  options.shared_memory = "host";
  return options;
}

class DequantctlTest : public SharedServerSuite<DequantctlTest> {
 protected:
  static void SetUpTestSuite() {
    StartSharedServer(
        "dequantctl",
        {MakeRandomLayer("model.layers.0.self_attn.v_proj", 256, 192, 64, DType::kF16, 31)}, 64,
        HostRegionsOptions(), "model");
  }

  static CommandResult Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {"--server", server_->address});
    return RunDequantctl(*dir_, args);
  }
  static std::string Path(const std::string& name) { return *dir_ + "/" + name; }
};

TEST_F(DequantctlTest, ListPrintsTheLayerRow) {
  const CommandResult run = Ctl({"list"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.err, "");
  const std::vector<std::string> lines = Lines(run.out);
  ASSERT_EQ(lines.size(), 3u) << run.out;  // heading, one layer, summary
  EXPECT_THAT(lines[0], StartsWith("name"));
  // name, format, K, N, group_size, scale dtype, MiB (24576 + 384 + 1536 bytes = 0.03 MiB),
  // resident.
  std::vector<std::string> cells = absl::StrSplit(lines[1], ' ', absl::SkipEmpty());
  EXPECT_THAT(cells, ::testing::ElementsAre("model.layers.0.self_attn.v_proj", "awq_gemm", "256",
                                            "192", "64", "fp16", "0.03", "host"));
  EXPECT_THAT(lines[2], StartsWith("1 tensor, 0.03 MiB packed, model '"));
}

TEST_F(DequantctlTest, InfoPrintsBackend) {
  const CommandResult run = Ctl({"info"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("backend:      cpu\n"));
  EXPECT_THAT(run.out, HasSubstr("\nformats:      awq_gemm (1 layer)\n"));
}

TEST_F(DequantctlTest, DequantizeToNpyWritesExactBytesForEachDType) {
  for (const auto& [flag, descr, kernel] :
       {std::tuple{"fp16", "<f2", DType::kF16}, std::tuple{"bf16", "<u2", DType::kBF16},
        std::tuple{"fp32", "<f4", DType::kF32}}) {
    SCOPED_TRACE(flag);
    const std::string out = Path(absl::StrCat("v_proj.", flag, ".npy"));
    const CommandResult run =
        Ctl({"dequantize", "--tensor", layer(0).name, "--out", out, "--dtype", flag});
    ASSERT_EQ(run.exit_code, 0) << run.err;
    EXPECT_EQ(run.err, "");
    ASSERT_EQ(Lines(run.out).size(), 1u) << run.out;
    EXPECT_THAT(run.out, HasSubstr(absl::StrCat(layer(0).name, ": shape (256, 192) ", flag, ", ",
                                                layer(0).shape.output_bytes(kernel), " bytes")));
    absl::StatusOr<npy::Array> array = npy::ReadFile(out);
    ASSERT_TRUE(array.ok()) << array.status();
    EXPECT_EQ(array->header.descr, descr);
    EXPECT_FALSE(array->header.fortran_order);
    EXPECT_THAT(array->header.shape, ::testing::ElementsAre(256, 192));
    EXPECT_EQ(array->header.data_offset % 64, 0);
    EXPECT_TRUE(array->data == layer(0).Expected(kernel));
  }
}

// --shm: the result comes through a POSIX shared-memory region (issue 9), the file is the same,
// and the region and its object are gone afterwards.
// A run killed before it could unregister leaves its region and /dev/shm object behind; the next
// run with that name releases both (the object's process is gone) and succeeds. A region of that
// name whose process is alive (here: this test) is left alone: ALREADY_EXISTS.
TEST_F(DequantctlTest, ShmReleasesTheRegionOfAKilledRunButNotOfALiveOne) {
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  const int64_t bytes = layer(0).shape.output_bytes(DType::kF16);
  RegionClient regions(client().channel());
  const std::string stale_key = absl::StrCat("/dequantctl.", dead, ".stale");
  absl::StatusOr<std::unique_ptr<ShmObject>> stale = ShmObject::Create(stale_key, bytes);
  ASSERT_TRUE(stale.ok()) << stale.status();
  ASSERT_TRUE(regions.RegisterSystem("stale", stale_key, 0, bytes).ok());

  const std::string out = Path("v_proj.stale.npy");
  const CommandResult run =
      Ctl({"dequantize", "--tensor", layer(0).name, "--out", out, "--shm", "stale"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  absl::StatusOr<npy::Array> array = npy::ReadFile(out);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_TRUE(array->data == layer(0).Expected(DType::kF16));
  EXPECT_FALSE(fs::exists("/dev/shm" + stale_key)) << "the dead run's object was not removed";
  absl::StatusOr<v1::SharedMemoryStatusResponse> status = regions.Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->regions_size(), 0);

  const std::string live_key = absl::StrCat("/dequantctl.", getpid(), ".live");
  absl::StatusOr<std::unique_ptr<ShmObject>> live = ShmObject::Create(live_key, bytes);
  ASSERT_TRUE(live.ok()) << live.status();
  ASSERT_TRUE(regions.RegisterSystem("live", live_key, 0, bytes).ok());
  const CommandResult refused =
      Ctl({"dequantize", "--tensor", layer(0).name, "--out", Path("live.npy"), "--shm", "live"});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.err, HasSubstr("ALREADY_EXISTS"));
  EXPECT_TRUE(fs::exists("/dev/shm" + live_key));
  status = regions.Status();
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->regions_size(), 1);
  EXPECT_EQ(status->regions(0).name(), "live");
  ASSERT_TRUE(regions.UnregisterSystem("live").ok());
}

// `regions`: the SharedMemoryStatus table, one row per registered region, and the limits line.
TEST_F(DequantctlTest, RegionsListsTheRegisteredRegions) {
  CommandResult run = Ctl({"regions"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.err, "");
  std::vector<std::string> lines = Lines(run.out);
  ASSERT_EQ(lines.size(), 2u) << run.out;
  EXPECT_EQ(lines[0], "name  kind  key  device  offset  bytes  pinned  calls  idle s  owner");
  EXPECT_THAT(lines[1], StartsWith("0 regions, 0 of "));
  EXPECT_THAT(lines[1], HasSubstr("; --shared-memory=host, idle regions released "));

  const std::string key = absl::StrCat("/dequantctl-test.", getpid(), ".listed");
  absl::StatusOr<std::unique_ptr<ShmObject>> object = ShmObject::Create(key, 8192);
  ASSERT_TRUE(object.ok()) << object.status();
  RegionClient regions(client().channel());
  ASSERT_TRUE(regions.RegisterSystem("listed", key, 4096, 4096).ok());
  run = Ctl({"regions"});
  ASSERT_TRUE(regions.UnregisterSystem("listed").ok());
  ASSERT_EQ(run.exit_code, 0) << run.err;
  lines = Lines(run.out);
  ASSERT_EQ(lines.size(), 3u) << run.out;
  // name, kind, key, device, offset, bytes, pinned (no cudaHostRegister on the CPU backend),
  // calls in flight, idle seconds, owner (this test's connection).
  const std::vector<std::string> cells = absl::StrSplit(lines[1], ' ', absl::SkipEmpty());
  ASSERT_EQ(cells.size(), 10u) << lines[1];
  EXPECT_THAT(std::vector<std::string>(cells.begin(), cells.begin() + 8),
              ::testing::ElementsAre("listed", "host", key, "-", "4096", "4096", "no", "0"));
  EXPECT_THAT(cells[9], StartsWith("ipv4:127.0.0.1:"));
  EXPECT_THAT(lines[2], StartsWith("1 region, 4096 of "));
}

TEST_F(DequantctlTest, DequantizeThroughShmWritesTheSameNpyAndCleansUp) {
  const std::string out = Path("v_proj.shm.npy");
  const CommandResult run =
      Ctl({"dequantize", "--tensor", layer(0).name, "--out", out, "--shm", "ctl-test"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr(absl::StrCat(layer(0).name, ": shape (256, 192) fp16, ",
                                              layer(0).shape.output_bytes(DType::kF16), " bytes")));
  // The summary names the path the bytes took (it said ", N streams" of a parallel fetch that
  // did not happen; found by the new-user review).
  EXPECT_THAT(run.out, HasSubstr(", through shared-memory region ctl-test"));
  EXPECT_THAT(run.out, ::testing::Not(HasSubstr(" streams")));
  absl::StatusOr<npy::Array> array = npy::ReadFile(out);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->header.shape, ::testing::ElementsAre(256, 192));
  EXPECT_TRUE(array->data == layer(0).Expected(DType::kF16));
  bool leftover = false;
  for (const fs::directory_entry& entry : fs::directory_iterator("/dev/shm")) {
    leftover |= absl::StrContains(entry.path().filename().string(), ".ctl-test");
  }
  EXPECT_FALSE(leftover) << "dequantctl left its shm object in /dev/shm";
  absl::StatusOr<v1::SharedMemoryStatusResponse> status = RegionClient(client().channel()).Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->regions_size(), 0);
}

TEST_F(DequantctlTest, DequantizeToSafetensorsAndRaw) {
  const std::string st = Path("v_proj.safetensors");
  CommandResult run = Ctl({"dequantize", "--tensor", layer(0).name, "--out", st, "--dtype", "bf16",
                           "--chunk-bytes", "65536"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> file = safetensors::MappedFile::Open(st);
  ASSERT_TRUE(file.ok()) << file.status();
  const safetensors::TensorEntry& entry = (*file)->header().tensors.at(layer(0).name);
  EXPECT_EQ(entry.dtype, "BF16");
  EXPECT_THAT(entry.shape, ::testing::ElementsAre(256, 192));
  const absl::Span<const uint8_t> bytes = *(*file)->TensorBytes(layer(0).name);
  EXPECT_TRUE(std::vector<uint8_t>(bytes.begin(), bytes.end()) == layer(0).Expected(DType::kBF16));

  const std::string raw = Path("v_proj.bin");
  run = Ctl({"dequantize", "--tensor", layer(0).name, "--out", raw, "--dtype", "fp32"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(FileBytes(raw) == layer(0).Expected(DType::kF32));
}

// --out /dev/null writes into the device (exit 0; it stays a character device, as root too);
// --out LINK keeps the symlink and replaces the file it points to.
TEST_F(DequantctlTest, OutDevNullAndOutThroughASymlink) {
  CommandResult run = Ctl({"dequantize", "--tensor", layer(0).name, "--out", "/dev/null"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(fs::symlink_status("/dev/null").type(), fs::file_type::character);

  const std::string target = Path("link_target.bin"), link = Path("link.bin");
  std::ofstream(target) << "old";
  fs::create_symlink("link_target.bin", link);
  run = Ctl({"dequantize", "--tensor", layer(0).name, "--out", link, "--dtype", "fp32"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_TRUE(FileBytes(target) == layer(0).Expected(DType::kF32));
}

// --out /dev/stdout and --out - (its short form): standard output holds the result's bytes and
// nothing else; the report line goes to stderr.
TEST_F(DequantctlTest, OutDevStdoutHoldsOnlyTheResult) {
  for (const std::string out : {"/dev/stdout", "-"}) {
    SCOPED_TRACE(out);
    CommandResult run =
        Ctl({"dequantize", "--tensor", layer(0).name, "--out", out, "--dtype", "fp32"});
    ASSERT_EQ(run.exit_code, 0) << run.err;
    EXPECT_TRUE(std::vector<uint8_t>(run.out.begin(), run.out.end()) ==
                layer(0).Expected(DType::kF32))
        << run.out.size() << " bytes on stdout";
    EXPECT_THAT(run.err, ::testing::HasSubstr(" -> /dev/stdout ("));
    EXPECT_THAT(run.err, ::testing::Not(HasSubstr("Did you really mean")));  // absl's warning
    EXPECT_FALSE(fs::exists(fs::current_path() / "-"));
  }
}

TEST_F(DequantctlTest, DequantizeLayersWritesOneNpyPerLayerOrOneSafetensors) {
  const std::string out_dir = Path("layers_npy");
  ASSERT_TRUE(fs::create_directory(out_dir));
  CommandResult run = Ctl(
      {"dequantize-layers", "--tensors", layer(0).name, "--dtype", "bf16", "--out-dir", out_dir});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.err, "");
  ASSERT_EQ(Lines(run.out).size(), 1u) << run.out;
  // One layer of 256 * 192 * 2 bytes.
  EXPECT_THAT(run.out, StartsWith("1 layer, bf16, 98304 bytes in ")) << run.out;
  EXPECT_THAT(run.out, HasSubstr("GB/s)")) << run.out;
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(out_dir)) {
    files.push_back(entry.path().filename().string());
  }
  EXPECT_THAT(files, ::testing::ElementsAre(layer(0).name + ".npy"));
  absl::StatusOr<npy::Array> array = npy::ReadFile(out_dir + "/" + layer(0).name + ".npy");
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->header.descr, "<u2");
  EXPECT_THAT(array->header.shape, ::testing::ElementsAre(256, 192));
  EXPECT_TRUE(array->data == layer(0).Expected(DType::kBF16));

  // No --tensors: every layer of the model, into one safetensors file.
  const std::string st = Path("layers.safetensors");
  run = Ctl({"dequantize-layers", "--dtype", "fp32", "--out", st});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, StartsWith("1 layer, fp32, 196608 bytes in ")) << run.out;
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> file = safetensors::MappedFile::Open(st);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ((*file)->header().tensors.size(), 1u);
  const safetensors::TensorEntry& entry = (*file)->header().tensors.at(layer(0).name);
  EXPECT_EQ(entry.dtype, "F32");
  EXPECT_THAT(entry.shape, ::testing::ElementsAre(256, 192));
  const absl::Span<const uint8_t> bytes = *(*file)->TensorBytes(layer(0).name);
  EXPECT_TRUE(std::vector<uint8_t>(bytes.begin(), bytes.end()) == layer(0).Expected(DType::kF32));

  // Usage errors exit 2; an unknown layer is the server's NOT_FOUND, exit 1.
  run = Ctl({"dequantize-layers", "--out", Path("x.npy")});
  EXPECT_EQ(run.exit_code, 2) << run.err;
  run = Ctl({"dequantize-layers", "--out", st, "--out-dir", out_dir});
  EXPECT_EQ(run.exit_code, 2) << run.err;
  run = Ctl({"dequantize-layers", "--tensors", "no.such.layer", "--out-dir", out_dir});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.err, StartsWith("dequantctl: NOT_FOUND: ")) << run.err;
}

template <typename T>
absl::Span<const uint8_t> Bytes(const std::vector<T>& v) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T));
}

// Writes `layer` as <name>qweight/qzeros/scales (layer.name is the prefix, e.g. "blk.").
absl::Status WritePacked(const std::string& path, const RandomLayer& layer,
                         const std::string& scale_dtype) {
  const int64_t K = layer.shape.K, N = layer.shape.N, groups = K / layer.shape.group_size;
  return safetensors::WriteFile(
      path, {{layer.name + "qweight", "I32", {K, N / 8}, Bytes(layer.qweight)},
             {layer.name + "qzeros", "I32", {groups, N / 8}, Bytes(layer.qzeros)},
             {layer.name + "scales", scale_dtype, {groups, N}, Bytes(layer.scales)}});
}

// --out-dir DIR/ (as in the README): the summary names DIR/*.npy, not DIR//*.npy.
TEST_F(DequantctlTest, DequantizeLayersOutDirWithTrailingSlash) {
  const std::string out_dir = Path("slash_npy");
  const CommandResult run =
      Ctl({"dequantize-layers", "--tensors", layer(0).name, "--out-dir", out_dir + "/"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, StartsWith("1 layer, fp16, 98304 bytes in ")) << run.out;
  EXPECT_THAT(run.out, ::testing::EndsWith(" -> " + out_dir + "/*.npy\n")) << run.out;
  EXPECT_TRUE(fs::is_regular_file(out_dir + "/" + layer(0).name + ".npy"));
}

// dequantize --packed --out FILE.safetensors names the tensor after the prefix without its
// trailing '.' ("blk." -> "blk"), or "weight" when the prefix is empty.
TEST_F(DequantctlTest, PackedToSafetensorsNamesTheTensorAfterThePrefix) {
  for (const auto& [prefix, name] : {std::pair{"blk.", "blk"}, std::pair{"", "weight"}}) {
    SCOPED_TRACE(prefix);
    const RandomLayer packed = MakeRandomLayer(prefix, 64, 16, 32, DType::kF16, 35);
    const std::string input = Path(absl::StrCat("named_", name, ".safetensors"));
    ASSERT_TRUE(WritePacked(input, packed, "F16").ok());
    const std::string out = Path(absl::StrCat("named_", name, "_out.safetensors"));
    const CommandResult run =
        Ctl({"dequantize", "--packed", input, "--prefix", prefix, "--out", out});
    ASSERT_EQ(run.exit_code, 0) << run.err;
    absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> file =
        safetensors::MappedFile::Open(out);
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_EQ((*file)->header().tensors.size(), 1u);
    EXPECT_EQ((*file)->header().tensors.begin()->first, name);
    const absl::Span<const uint8_t> bytes = *(*file)->TensorBytes(name);
    EXPECT_TRUE(std::vector<uint8_t>(bytes.begin(), bytes.end()) == packed.Expected(DType::kF16));
  }
}

TEST_F(DequantctlTest, PackedInputWithCompareReportsZeroErrorAgainstExactReference) {
  // Inline input from a safetensors file, and an fp32 reference that is exactly the result.
  const RandomLayer packed = MakeRandomLayer("blk.", 128, 72, 32, DType::kBF16, 32);
  const std::string input = Path("packed.safetensors");
  const std::vector<uint8_t> expected = packed.Expected(DType::kF32);
  ASSERT_TRUE(WritePacked(input, packed, "BF16").ok());
  const std::string reference = Path("reference.safetensors");
  ASSERT_TRUE(safetensors::WriteFile(reference, {{"blk.weight", "F32", {128, 72}, expected}}).ok());

  const std::string out = Path("packed_out.npy");
  const CommandResult run = Ctl({"dequantize", "--packed", input, "--prefix", "blk.", "--out", out,
                                 "--dtype", "fp32", "--compare", reference});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::vector<std::string> lines = Lines(run.out);
  ASSERT_EQ(lines.size(), 2u) << run.out;
  EXPECT_THAT(lines[0], HasSubstr("shape (128, 72) fp32, 36864 bytes"));
  EXPECT_THAT(lines[1],
              HasSubstr(":blk.weight: max_abs 0, rms 0, relative_rms 0 over 9216 elements"));
  absl::StatusOr<npy::Array> array = npy::ReadFile(out);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_TRUE(array->data == expected);
}

// K = N = 64: a (K, N) reference cannot be told from an (N, K) one, so the default
// --compare-layout auto refuses it (exit 1, nothing written); kn compares it as is.
TEST_F(DequantctlTest, CompareSquareReferenceNeedsCompareLayout) {
  const RandomLayer packed = MakeRandomLayer("sq.", 64, 64, 32, DType::kF16, 33);
  const std::string input = Path("square_packed.safetensors");
  ASSERT_TRUE(WritePacked(input, packed, "F16").ok());
  const std::string reference = Path("square_reference.safetensors");
  ASSERT_TRUE(safetensors::WriteFile(reference,
                                     {{"sq.weight", "F32", {64, 64}, packed.Expected(DType::kF32)}})
                  .ok());
  const std::string out = Path("square_out.npy");
  CommandResult run = Ctl({"dequantize", "--packed", input, "--prefix", "sq.", "--out", out,
                           "--dtype", "fp32", "--compare", reference});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.out, "");
  EXPECT_EQ(run.err, "dequantctl: INVALID_ARGUMENT: reference '" + reference +
                         ":sq.weight' is square (K = N = 64): its layout is ambiguous; pass "
                         "--compare-layout kn or nk\n");
  EXPECT_FALSE(fs::exists(out));

  run = Ctl({"dequantize", "--packed", input, "--prefix", "sq.", "--dtype", "fp32", "--compare",
             reference, "--compare-layout", "kn"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out,
              HasSubstr(":sq.weight: max_abs 0, rms 0, relative_rms 0 over 4096 elements"));
}

// A (K, N) = (128, 72) reference with --compare-layout nk: exit 1 saying what nk expects.
TEST_F(DequantctlTest, CompareLayoutMismatchSaysWhatTheLayoutExpects) {
  const RandomLayer packed = MakeRandomLayer("mm.", 128, 72, 32, DType::kF16, 34);
  const std::string input = Path("mismatch_packed.safetensors");
  ASSERT_TRUE(WritePacked(input, packed, "F16").ok());
  const std::string reference = Path("mismatch_reference.safetensors");
  ASSERT_TRUE(safetensors::WriteFile(
                  reference, {{"mm.weight", "F32", {128, 72}, packed.Expected(DType::kF32)}})
                  .ok());
  const CommandResult run = Ctl({"dequantize", "--packed", input, "--prefix", "mm.", "--compare",
                                 reference, "--compare-layout", "nk"});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.out, "");
  EXPECT_EQ(run.err, "dequantctl: INVALID_ARGUMENT: reference '" + reference +
                         ":mm.weight' has shape (128, 72); --compare-layout nk expects (N, K) = "
                         "(72, 128)\n");
}

TEST_F(DequantctlTest, UnknownLayerExitsOneWithOneLineErrorAndWritesNothing) {
  const std::string out = Path("missing.npy");
  const CommandResult run =
      Ctl({"dequantize", "--tensor", "model.layers.7.mlp.up_proj", "--out", out});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.out, "");
  ASSERT_EQ(Lines(run.err).size(), 1u) << run.err;
  EXPECT_THAT(run.err, StartsWith("dequantctl: NOT_FOUND: "));
  EXPECT_THAT(run.err, HasSubstr("model.layers.7.mlp.up_proj"));
  EXPECT_FALSE(fs::exists(out));
  for (const auto& entry : fs::directory_iterator(*dir_)) {
    EXPECT_THAT(entry.path().filename().string(), ::testing::Not(StartsWith("missing.npy")))
        << "temporary file left behind";
  }
}

TEST_F(DequantctlTest, UsageErrorsExitTwo) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"dequantize", "--out", Path("x.npy")},  // no source
        std::vector<std::string>{"dequantize", "--tensor", "a", "--dtype", "int32"},
        std::vector<std::string>{"dequantize", "--tensor", "a", "--shm", "r", "--streams", "4"},
        std::vector<std::string>{"dequantize", "--tensor", "a", "--shm", "a/b"},
        std::vector<std::string>{"dequantize", "--tensor", "a", "--shm", std::string(129, 'x')},
        std::vector<std::string>{"dequantize", "--tensor", "a", "--shm", ""},
        std::vector<std::string>{"dequantize", "--tensor", "a", "--shm="},
        std::vector<std::string>{"dequantize", "--tensor", "a", "--streams", "-3"},
        std::vector<std::string>{"dequantize", "--packed", Path("p.safetensors"), "--prefix", "l.",
                                 "--group-size", "-1"},
        // An empty value is a forgotten one (--out "" discarded the result with exit 0).
        std::vector<std::string>{"dequantize", "--tensor", "a", "--out", ""},
        std::vector<std::string>{"dequantize", "--tensor", "a", "--orientation="},
        std::vector<std::string>{"dequantize-layers", "--out-dir="},
        std::vector<std::string>{"dequantize", "--tensor", "a", "--compare-layout", "kn"},
        // An explicit --streams where the bytes must come in order (new-user review: these ran
        // on one stream without a word).
        std::vector<std::string>{"dequantize", "--tensor", "a", "--streams", "3", "--out",
                                 Path("w.safetensors")},
        std::vector<std::string>{"dequantize", "--tensor", "a", "--streams", "4", "--out",
                                 Path("x.npy"), "--compare", Path("ref.npy")},
        std::vector<std::string>{"frobnicate"}, std::vector<std::string>{"--no-such-flag", "list"},
        std::vector<std::string>{}}) {
    SCOPED_TRACE(absl::StrJoin(args, " "));
    const CommandResult run = Ctl(args);
    EXPECT_EQ(run.exit_code, 2);
    ASSERT_EQ(Lines(run.err).size(), 1u) << run.err;
    EXPECT_THAT(run.err, StartsWith("dequantctl: INVALID_ARGUMENT: "));
  }
}

// --shm '' was taken as no --shm and the result came over the stream (found by the new-user
// review): an empty region name is a usage error naming the flag, and no call is made.
TEST_F(DequantctlTest, EmptyShmIsAUsageError) {
  const std::string out = Path("empty_shm.npy");
  const CommandResult run =
      Ctl({"dequantize", "--tensor", layer(0).name, "--out", out, "--shm", ""});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_EQ(run.out, "");
  EXPECT_EQ(run.err,
            "dequantctl: INVALID_ARGUMENT: --shm is empty: give a region name, or leave it out to "
            "use the stream (see dequantctl --help)\n");
  EXPECT_FALSE(fs::exists(out));
}

// A flag the subcommand would ignore is a usage error (exit 2) naming where it belongs, and
// nothing is written or created.
TEST_F(DequantctlTest, FlagsThatDoNotApplyToTheSubcommandExitTwo) {
  const std::string out_dir = Path("not_for_dequantize");
  CommandResult run = Ctl({"dequantize", "--tensor", layer(0).name, "--out-dir", out_dir});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_EQ(run.out, "");
  EXPECT_EQ(run.err,
            "dequantctl: INVALID_ARGUMENT: --out-dir does not apply to 'dequantize' (it is for "
            "dequantize-layers) (see dequantctl --help)\n");
  EXPECT_FALSE(fs::exists(out_dir));

  run = Ctl({"dequantize-layers", "--tensor", layer(0).name, "--out-dir", out_dir});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_EQ(run.err,
            "dequantctl: INVALID_ARGUMENT: --tensor does not apply to 'dequantize-layers' (it is "
            "for dequantize; did you mean --tensors?) (see dequantctl --help)\n");
  EXPECT_FALSE(fs::exists(out_dir));

  const std::string npy = Path("benchmark_out.npy");
  run = Ctl({"benchmark", "--shapes", "128x256", "--out=" + npy});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_EQ(run.err,
            "dequantctl: INVALID_ARGUMENT: --out does not apply to 'benchmark' (it is for "
            "dequantize and dequantize-layers) (see dequantctl --help)\n");
  EXPECT_FALSE(fs::exists(npy));

  // --nohardware-counters is --hardware-counters too.
  run = Ctl({"list", "--nohardware-counters"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_EQ(run.err,
            "dequantctl: INVALID_ARGUMENT: --hardware-counters does not apply to 'list' (it is for "
            "benchmark) (see dequantctl --help)\n");
}

TEST_F(DequantctlTest, DeadlineMustBePositive) {
  for (const char* value : {"0", "-1", "nan", "1e7"}) {
    SCOPED_TRACE(value);
    const CommandResult run = Ctl({"--deadline", value, "list"});
    EXPECT_EQ(run.exit_code, 2);
    EXPECT_EQ(run.out, "");
    ASSERT_EQ(Lines(run.err).size(), 1u) << run.err;
    EXPECT_THAT(run.err, StartsWith("dequantctl: INVALID_ARGUMENT: --deadline must be > 0 and <= "
                                    "1000000 seconds, got "));
  }
  const CommandResult run = Ctl({"--deadline=30", "list"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
}

// The word "help" as a flag's value is that value: the call is made (here the server refuses
// the layer, exit 1). Only `help` as the subcommand, --help or -h print the usage (exit 0).
TEST_F(DequantctlTest, HelpAsAFlagValueIsJustAValue) {
  CommandResult run = Ctl({"dequantize", "--tensor", "help"});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.out, "");
  EXPECT_THAT(run.err, StartsWith("dequantctl: NOT_FOUND: ")) << run.err;
  EXPECT_THAT(run.err, HasSubstr("help")) << run.err;

  run = Ctl({"dequantize", "--tensor", "no.such.layer", "--out", "help"});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.err, StartsWith("dequantctl: NOT_FOUND: ")) << run.err;

  run = Ctl({"dequantize-layers", "--tensors", "no.such.layer", "--out-dir", "help"});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.err, StartsWith("dequantctl: NOT_FOUND: ")) << run.err;

  run = Ctl({"list", "help"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_EQ(run.err,
            "dequantctl: INVALID_ARGUMENT: unexpected argument 'help' (see dequantctl --help)\n");

  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"help"}, std::vector<std::string>{"-h"},
        std::vector<std::string>{"dequantize", "--help"},
        std::vector<std::string>{"dequantize", "--tensor", layer(0).name, "--help"}}) {
    SCOPED_TRACE(absl::StrJoin(args, " "));
    run = Ctl(args);
    EXPECT_EQ(run.exit_code, 0) << run.err;
    EXPECT_EQ(run.err, "");
    EXPECT_THAT(run.out, StartsWith("dequantctl: client of the dequantd")) << run.out;
  }
}

// --tensors "" or with an empty name ("," "a,,b") would otherwise mean every layer; a layer
// listed twice would be reported twice but written once. Usage errors, nothing created.
TEST_F(DequantctlTest, DequantizeLayersRefusesEmptyAndRepeatedNames) {
  const std::string out_dir = Path("refused_layers");
  const std::string prefix = "dequantctl: INVALID_ARGUMENT: ";
  const std::string suffix = " (see dequantctl --help)\n";
  const std::string twice = layer(0).name + "," + layer(0).name;
  const std::string gap = layer(0).name + ",," + layer(0).name;
  for (const auto& [tensors, message] :
       {std::pair<std::string, std::string>{
            "", "--tensors is empty; leave it out to dequantize every layer"},
        {",", "--tensors \",\" has an empty layer name"},
        {gap, "--tensors \"" + gap + "\" has an empty layer name"},
        {twice, "--tensors lists layer '" + layer(0).name + "' twice"}}) {
    SCOPED_TRACE(tensors);
    const CommandResult run =
        Ctl({"dequantize-layers", "--tensors=" + tensors, "--out-dir", out_dir});
    EXPECT_EQ(run.exit_code, 2);
    EXPECT_EQ(run.out, "");
    EXPECT_EQ(run.err, prefix + message + suffix);
    EXPECT_FALSE(fs::exists(out_dir));
  }
}

TEST_F(DequantctlTest, DequantizeLayersFailingCallCreatesNoOutDir) {
  const std::string out_dir = Path("never_created/layers");
  const CommandResult run =
      Ctl({"dequantize-layers", "--tensors", "no.such.layer", "--out-dir", out_dir});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.err, StartsWith("dequantctl: NOT_FOUND: ")) << run.err;
  EXPECT_FALSE(fs::exists(Path("never_created")));
}

// Every ABSL_FLAG of client/main.cc (read from the source) appears in `dequantctl --help`.
// dequantize --packed with every reference vector case of tests/data/formats (GPTQ,
// compressed-tensors int and fp8, FP8 block, MXFP4), end to end on the CPU backend: the format and
// its quantization_config come from the case's <name>.config.json beside the file (as the server
// reads a checkpoint's), the layer goes inline, and the raw result in the format's own
// orientation is byte for byte the library's expected tensor, for each output dtype. Layers
// without an optional role (symmetric or g_idx-free compressed-tensors, GPTQ without g_idx) and
// compressed_tensors_fp8's one-scale strategy tensor are sent too.
TEST_F(DequantctlTest, PackedEveryFormatVectorCaseIsBitExact) {
  const fs::path root = fs::path(DEQUANTD_SOURCE_DIR) / "tests/data/formats";
  std::vector<fs::path> cases;
  for (const auto& dir : fs::directory_iterator(root)) {
    if (!dir.is_directory()) continue;
    for (const auto& f : fs::directory_iterator(dir.path()))
      if (f.path().extension() == ".safetensors") cases.push_back(f.path());
  }
  std::sort(cases.begin(), cases.end());
  ASSERT_EQ(cases.size(), 27u);  // fp8_block 4, gptq 12, compressed_tensors 9, mxfp4 2
  int checked = 0;
  for (const fs::path& file : cases) {
    const bool mxfp4 = file.parent_path().filename() == "mxfp4";
    // (prefix, expected tensor's stem): MXFP4 has two projections of stacked experts.
    std::vector<std::pair<std::string, std::string>> layers;
    if (mxfp4) {
      layers = {{"model.layers.0.mlp.experts.gate_up_proj_", "expected.gate_up_proj."},
                {"model.layers.0.mlp.experts.down_proj_", "expected.down_proj."}};
    } else {
      layers = {{"model.layers.0.mlp.down_proj.", "expected."}};
    }
    absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> vectors =
        safetensors::MappedFile::Open(file.string());
    ASSERT_TRUE(vectors.ok()) << vectors.status();
    // gptq_4bit_g64_asym_v1_zero0: GPTQModel's two dequantizers disagree; dequantd follows its
    // loader's (TorchLinear's) rule, whose fp16 result alone is stored (gptq_vectors_test.cc).
    const bool torchlinear = (*vectors)->header().tensors.count("expected_torchlinear.fp16") != 0;
    for (const auto& [prefix, stem] : layers) {
      for (const char* dtype : {"fp16", "bf16", "fp32"}) {
        if (torchlinear && std::string(dtype) != "fp16") continue;
        SCOPED_TRACE(absl::StrCat(file.filename().string(), " ", prefix, " ", dtype));
        const std::string out = Path("vector.bin");
        const CommandResult run = Ctl({"dequantize", "--packed", file.string(), "--prefix", prefix,
                                       "--dtype", dtype, "--out", out});
        ASSERT_EQ(run.exit_code, 0) << run.err;
        const absl::Span<const uint8_t> want =
            *(*vectors)->TensorBytes(torchlinear ? "expected_torchlinear.fp16" : stem + dtype);
        EXPECT_TRUE(FileBytes(out) == std::vector<uint8_t>(want.begin(), want.end()));
        ++checked;
      }
    }
  }
  // Three dtypes a layer (MXFP4's two cases have two layers each), the zero0 case fp16 only.
  EXPECT_EQ(checked, 3 * (static_cast<int>(cases.size()) + 2) - 2);
}

// The --packed declaration: --format names a format when no config is there (GPTQ needs its
// config: its zero convention is not in the bytes), and must agree with a config that is.
TEST_F(DequantctlTest, PackedFormatAndConfigFlags) {
  const fs::path vectors = fs::path(DEQUANTD_SOURCE_DIR) / "tests/data/formats";
  const std::string fp8 = Path("alone_fp8.safetensors");  // no config beside it
  fs::copy_file(vectors / "fp8_block/fp8_block_scalef32_136x144.safetensors", fp8,
                fs::copy_options::overwrite_existing);
  const std::string prefix = "model.layers.0.mlp.down_proj.";
  CommandResult run =
      Ctl({"dequantize", "--packed", fp8, "--prefix", prefix, "--format", "fp8_block"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("shape (136, 144) fp16")) << run.out;
  // Without a config or --format, the file is read as AWQ (as before other formats existed).
  run = Ctl({"dequantize", "--packed", fp8, "--prefix", prefix});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.err, "dequantctl: NOT_FOUND: " + fp8 + ": no tensor '" + prefix + "qweight'\n");
  // An unknown --format is a usage error (exit 2), found before any file is read.
  run = Ctl({"dequantize", "--packed", fp8, "--prefix", prefix, "--format", "fp9"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_EQ(run.err,
            "dequantctl: INVALID_ARGUMENT: --format 'fp9' is not known; known: 'awq_gemm', "
            "'gptq', 'compressed_tensors', 'fp8_block', 'compressed_tensors_fp8', 'mxfp4' (see "
            "dequantctl --help)\n");

  const std::string gptq = Path("alone_gptq.safetensors");
  fs::copy_file(vectors / "gptq/gptq_4bit_g32_asym_v1.safetensors", gptq,
                fs::copy_options::overwrite_existing);
  run = Ctl({"dequantize", "--packed", gptq, "--prefix", prefix, "--format", "gptq"});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.err, "dequantctl: INVALID_ARGUMENT: " + gptq +
                         ": format gptq needs the checkpoint's quantization_config (--config, or "
                         "a config.json beside the file): its checkpoint_format (zeros stored "
                         "minus one or not) and bits are not in the tensors\n");
  const std::string config = (vectors / "gptq/gptq_4bit_g32_asym_v1.config.json").string();
  const std::string out = Path("alone_gptq.bin");
  run = Ctl({"dequantize", "--packed", gptq, "--prefix", prefix, "--config", config, "--out", out});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> expected =
      safetensors::MappedFile::Open(gptq);
  ASSERT_TRUE(expected.ok());
  const absl::Span<const uint8_t> want = *(*expected)->TensorBytes("expected.fp16");
  EXPECT_TRUE(FileBytes(out) == std::vector<uint8_t>(want.begin(), want.end()));
  run = Ctl({"dequantize", "--packed", gptq, "--prefix", prefix, "--config", config, "--format",
             "awq_gemm"});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.err, "dequantctl: INVALID_ARGUMENT: --format awq_gemm disagrees with " + config +
                         ", whose quantization_config declares format gptq (quant_method "
                         "'gptq'); leave out --format or give --config\n");
  run = Ctl({"dequantize", "--packed", gptq, "--prefix", prefix, "--config", Path("none.json")});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.err, "dequantctl: NOT_FOUND: --config " + Path("none.json") + ": not found\n");
  run = Ctl({"dequantize", "--tensor", "x", "--format", "gptq"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_EQ(run.err,
            "dequantctl: INVALID_ARGUMENT: --format applies to --packed only (see dequantctl "
            "--help)\n");
}

// An MXFP4 (gpt-oss) checkpoint, transformers' vector case, served on the CPU backend:
// `dequantctl list` shows the format and experts columns, `info` the formats line;
// `dequantize-layers --out` (one stream and two) writes each projection as one (E, K, N) tensor
// bit-exact to transformers' [E, in, out] result; `dequantize --out x.npy` writes the (E, K, N)
// array.
TEST(DequantctlMxfp4Test, ListLayersAndDequantizeStackedExperts) {
  const std::string dir = MakeTempDir("dequantctl_mxfp4");
  const fs::path vectors = fs::path(DEQUANTD_SOURCE_DIR) / "tests/data/formats/mxfp4";
  const fs::path model = fs::path(dir) / "model";
  ASSERT_TRUE(fs::create_directory(model));
  fs::copy_file(vectors / "mxfp4_gptoss_e2.config.json", model / "config.json");
  fs::copy_file(vectors / "mxfp4_gptoss_e2.safetensors", model / "model.safetensors");
  ServerOptions options;
  options.model_dir = model.string();
  absl::StatusOr<std::unique_ptr<TestServer>> server = StartCpuServer(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const auto ctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"--server", (*server)->address});
    return RunDequantctl(dir, args);
  };
  absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> expected =
      safetensors::MappedFile::Open((vectors / "mxfp4_gptoss_e2.safetensors").string());
  ASSERT_TRUE(expected.ok()) << expected.status();
  const auto expected_bytes = [&](const std::string& name) {
    const absl::Span<const uint8_t> b = *(*expected)->TensorBytes(name);
    return std::vector<uint8_t>(b.begin(), b.end());
  };
  const std::string gate_up = "model.layers.0.mlp.experts.gate_up_proj";
  const std::string down = "model.layers.0.mlp.experts.down_proj";

  CommandResult run = ctl({"list"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("format  E   K   N  group_size  scale dtype")) << run.out;
  EXPECT_THAT(run.out, HasSubstr(down + "     mxfp4   2  32  64          32  uint8")) << run.out;
  run = ctl({"info"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("\nformats:      mxfp4 (2 layers, 2 experts each)\n")) << run.out;

  for (const char* streams : {"1", "2"}) {
    SCOPED_TRACE(streams);
    const std::string st = dir + "/layers" + streams + ".safetensors";
    run = ctl({"dequantize-layers", "--dtype", "bf16", "--streams", streams, "--out", st});
    ASSERT_EQ(run.exit_code, 0) << run.err;
    absl::StatusOr<std::unique_ptr<safetensors::MappedFile>> file =
        safetensors::MappedFile::Open(st);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_THAT((*file)->header().tensors.at(gate_up).shape, ::testing::ElementsAre(2, 64, 64));
    EXPECT_THAT((*file)->header().tensors.at(down).shape, ::testing::ElementsAre(2, 32, 64));
    for (const std::string& layer : {gate_up, down}) {
      const absl::Span<const uint8_t> got = *(*file)->TensorBytes(layer);
      const std::string proj = layer.substr(layer.rfind('.') + 1);
      EXPECT_TRUE(std::vector<uint8_t>(got.begin(), got.end()) ==
                  expected_bytes("expected." + proj + ".bf16"))
          << layer;
    }
  }

  const std::string npy_path = dir + "/down.npy";
  run = ctl({"dequantize", "--tensor", down, "--dtype", "fp32", "--out", npy_path});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("shape (2, 32, 64) fp32")) << run.out;
  absl::StatusOr<npy::Array> array = npy::ReadFile(npy_path);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->header.shape, ::testing::ElementsAre(2, 32, 64));
  EXPECT_TRUE(array->data == expected_bytes("expected.down_proj.fp32"));
}

TEST(DequantctlHelpTest, HelpListsEveryFlag) {
  const std::string source = ReadAll(std::string(DEQUANTD_SOURCE_DIR) + "/client/main.cc");
  std::vector<std::string> flags;
  for (size_t at = source.find("\nABSL_FLAG("); at != std::string::npos;
       at = source.find("\nABSL_FLAG(", at + 1)) {
    const size_t name = source.find(", ", at) + 2;
    flags.push_back(
        absl::StrReplaceAll(source.substr(name, source.find(',', name) - name), {{"_", "-"}}));
  }
  ASSERT_GE(flags.size(), 18u) << source.substr(0, 2000);
  const std::string dir = MakeTempDir("dequantctl_help");
  const CommandResult run = RunDequantctl(dir, {"--help"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  // "--FLAG" as a whole word ("--compare" does not count inside "--compare-layout").
  auto mentions = [&](const std::string& flag) {
    const std::string word = "--" + flag;
    for (size_t at = run.out.find(word); at != std::string::npos; at = run.out.find(word, at + 1)) {
      const char next = at + word.size() < run.out.size() ? run.out[at + word.size()] : ' ';
      if (!std::isalnum(static_cast<unsigned char>(next)) && next != '-' && next != '_') {
        return true;
      }
    }
    return false;
  };
  for (const std::string& flag : flags) EXPECT_TRUE(mentions(flag)) << flag << "\n" << run.out;
}

TEST(DequantctlNoServerTest, UnreachableServerExitsOneWithUnavailable) {
  const std::string dir = MakeTempDir("dequantctl_no_server");
  // Port 1 on loopback: nothing listens there.
  const CommandResult run =
      RunDequantctl(dir, {"--server", "127.0.0.1:1", "--deadline", "10", "list"});
  EXPECT_EQ(run.exit_code, 1);
  ASSERT_EQ(Lines(run.err).size(), 1u) << run.err;
  EXPECT_THAT(run.err, StartsWith("dequantctl: UNAVAILABLE: "));
}

// --streams S: the result in S byte ranges on S connections, written in place (pwrite) after the
// .npy preamble: the same file as one stream, and the reference bytes.
TEST_F(DequantctlTest, StreamsWriteTheSameNpyAndRawFileAsOneStream) {
  for (const char* ext : {"npy", "bin"}) {
    SCOPED_TRACE(ext);
    const std::string one = Path(absl::StrCat("one.", ext));
    const std::string four = Path(absl::StrCat("four.", ext));
    CommandResult run = Ctl({"dequantize", "--tensor", layer(0).name, "--out", one, "--dtype",
                             "fp32", "--streams", "1"});
    ASSERT_EQ(run.exit_code, 0) << run.err;
    run = Ctl({"dequantize", "--tensor", layer(0).name, "--out", four, "--dtype", "fp32",
               "--streams", "4", "--chunk-bytes", "65536"});
    ASSERT_EQ(run.exit_code, 0) << run.err;
    EXPECT_THAT(run.out, HasSubstr(", 4 streams -> "));
    EXPECT_EQ(FileBytes(four), FileBytes(one));
    const std::vector<uint8_t> expected = layer(0).Expected(DType::kF32);
    const std::vector<uint8_t> bytes = FileBytes(four);
    ASSERT_GE(bytes.size(), expected.size());
    EXPECT_TRUE(std::equal(expected.begin(), expected.end(), bytes.end() - expected.size()));
  }
}

TEST_F(DequantctlTest, StreamsOutOfRangeAreUsageErrors) {
  for (const char* streams : {"0", "65", "-1"}) {
    const CommandResult run = Ctl({"dequantize", "--tensor", layer(0).name, "--streams", streams});
    EXPECT_EQ(run.exit_code, 2) << streams;
    EXPECT_THAT(run.err, HasSubstr("--streams must be in ")) << streams;
  }
  const CommandResult run = Ctl({"dequantize-layers", "--streams", "0"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("--streams must be in 1..64, got 0"));
}

TEST_F(DequantctlTest, DequantizeLayersOverStreamsWritesEachLayer) {
  const std::string dir = Path("layers_streams");
  const CommandResult run = Ctl({"dequantize-layers", "--out-dir", dir, "--streams", "3"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  absl::StatusOr<npy::Array> array = npy::ReadFile(dir + "/" + layer(0).name + ".npy");
  ASSERT_TRUE(array.ok()) << array.status();
  const std::vector<uint8_t> expected = layer(0).Expected(DType::kF16);
  EXPECT_EQ(array->data, expected);
}

// dequantd --listen unix:PATH (in-process here) and dequantctl --server unix:PATH.
TEST(DequantctlUnixSocketTest, DequantizesOverAUnixSocket) {
  const std::string dir = MakeTempDir("dequantctl_unix");
  const RandomLayer packed = MakeRandomLayer("mm.", 128, 72, 32, DType::kF16, 37);
  const std::string input = dir + "/packed.safetensors";
  ASSERT_TRUE(WritePacked(input, packed, "F16").ok());
  ServerOptions options;
  options.model_dir = "";
  options.listen = "unix:" + dir + "/dq.sock";
  options.metrics_listen = "";
  options.backend = "cpu";
  absl::StatusOr<std::unique_ptr<DequantServer>> server = DequantServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string out = dir + "/w.bin";
  const CommandResult run =
      RunDequantctl(dir, {"--server", options.listen, "dequantize", "--packed", input, "--prefix",
                          "mm.", "--out", out, "--streams", "2"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(FileBytes(out), packed.Expected(DType::kF16));
}

// --server must be HOST:PORT with a port in 1..65535: gRPC would otherwise take 99999 as 34463,
// -1 as 65535 and a missing port as 0. Exit 2 before any call.
TEST(DequantctlNoServerTest, ServerWithoutAValidPortIsAUsageError) {
  const std::string dir = MakeTempDir("dequantctl_bad_server");
  for (const char* server :
       {"127.0.0.1:99999", "127.0.0.1:-1", "127.0.0.1", "127.0.0.1:", "127.0.0.1:0", ":50051",
        "::1:50051", "[::1]", "unix:", " 127.0.0.1:50051", "local host:50051"}) {
    SCOPED_TRACE(server);
    const CommandResult run = RunDequantctl(dir, {"--server", server, "--deadline", "10", "list"});
    EXPECT_EQ(run.exit_code, 2);
    EXPECT_EQ(run.out, "");
    EXPECT_EQ(run.err, absl::StrCat("dequantctl: INVALID_ARGUMENT: --server: '", server,
                                    "' must be HOST:PORT with a port in 1..65535 (or unix:PATH) "
                                    "(see dequantctl --help)\n"));
  }
  // Valid addresses reach the call: nothing listens there (exit 1).
  for (const char* server : {"127.0.0.1:1", "[::1]:1", "localhost:65535"}) {
    SCOPED_TRACE(server);
    const CommandResult run = RunDequantctl(dir, {"--server", server, "--deadline", "10", "list"});
    EXPECT_EQ(run.exit_code, 1) << run.err;
    EXPECT_THAT(run.err, StartsWith("dequantctl: UNAVAILABLE: "));
  }
  const std::string socket = dir + "/no_such.sock";
  const CommandResult run =
      RunDequantctl(dir, {"--server", "unix:" + socket, "--deadline", "10", "list"});
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_THAT(run.err, StartsWith("dequantctl: UNAVAILABLE: "));
}

// A model of three layers, for what happens between layers of one call.
class DequantctlThreeLayersTest : public SharedServerSuite<DequantctlThreeLayersTest> {
 protected:
  static void SetUpTestSuite() {
    StartSharedServer("dequantctl_three",
                      {MakeRandomLayer("model.layers.0.mlp.a", 128, 64, 32, DType::kF16, 41),
                       MakeRandomLayer("model.layers.0.mlp.b", 128, 64, 32, DType::kF16, 42),
                       MakeRandomLayer("model.layers.0.mlp.c", 128, 64, 32, DType::kF16, 43)},
                      32);
  }
};

// --out-dir, one stream: the third layer's .npy path is a directory, so the call fails there; the
// message says that the first two files are in place (each whole), and they hold their layers.
TEST_F(DequantctlThreeLayersTest, AFailureMidWaySaysHowManyLayersWereWritten) {
  const std::string out_dir = *dir_ + "/mid_way";
  ASSERT_TRUE(fs::create_directories(out_dir + "/" + layer(2).name + ".npy"));
  const CommandResult run =
      RunDequantctl(*dir_, {"--server", server_->address, "dequantize-layers", "--tensors",
                            layer(0).name + "," + layer(1).name + "," + layer(2).name, "--streams",
                            "1", "--dtype", "fp32", "--out-dir", out_dir});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.out, "");
  EXPECT_THAT(run.err, StartsWith("dequantctl: FAILED_PRECONDITION: "));
  EXPECT_THAT(run.err, HasSubstr(layer(2).name + ".npy"));
  EXPECT_THAT(run.err, ::testing::EndsWith(" (2 of 3 layers were written to " + out_dir +
                                           " before the failure)\n"));
  for (size_t i = 0; i < 2; ++i) {
    absl::StatusOr<npy::Array> array = npy::ReadFile(out_dir + "/" + layer(i).name + ".npy");
    ASSERT_TRUE(array.ok()) << array.status();
    EXPECT_TRUE(array->data == layer(i).Expected(DType::kF32)) << layer(i).name;
  }

  // The first layer's path in the way: none written, and the message says so.
  const std::string first = *dir_ + "/first_fails";
  ASSERT_TRUE(fs::create_directories(first + "/" + layer(0).name + ".npy"));
  const CommandResult none = RunDequantctl(
      *dir_, {"--server", server_->address, "dequantize-layers", "--tensors",
              layer(0).name + "," + layer(1).name, "--streams", "1", "--out-dir", first});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_THAT(none.err, ::testing::EndsWith(" (0 of 2 layers were written to " + first +
                                            " before the failure)\n"));
}

// --out-dir - is a usage error (it made a directory named '-'); nothing is created.
TEST_F(DequantctlThreeLayersTest, OutDirDashIsAUsageError) {
  const CommandResult run =
      RunDequantctl(*dir_, {"--server", server_->address, "dequantize-layers", "--out-dir", "-"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("--out-dir -: standard output cannot hold a directory"));
  EXPECT_FALSE(fs::exists(*dir_ + "/-"));
}

// --out - with standard output closed (`>&-`): a usage error, and no byte goes to whatever
// descriptor took number 1 (gRPC's event descriptors did, and got the result's bytes).
TEST_F(DequantctlThreeLayersTest, OutDashWithStandardOutputClosedIsAUsageError) {
  const std::string err = *dir_ + "/closed_stdout.err";
  const std::string command = DequantctlPath() + " --server " + server_->address +
                              " dequantize --tensor " + layer(0).name + " --out - >&- 2>" + err;
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_THAT(ReadAll(err), HasSubstr("--out /dev/stdout: standard output is closed"));
}

// With --packed, (K, N) is known before the call: a --compare reference that does not fit is
// refused before any RPC. Against an address where nothing listens, the error is the reference's
// (exit 1, INVALID_ARGUMENT), not UNAVAILABLE.
TEST(DequantctlNoServerTest, PackedCompareReferenceIsCheckedBeforeTheCall) {
  const std::string dir = MakeTempDir("dequantctl_compare_first");
  const RandomLayer packed = MakeRandomLayer("mm.", 128, 72, 32, DType::kF16, 36);
  const std::string input = dir + "/packed.safetensors";
  ASSERT_TRUE(WritePacked(input, packed, "F16").ok());
  const std::string reference = dir + "/reference.safetensors";
  ASSERT_TRUE(safetensors::WriteFile(
                  reference, {{"mm.weight", "F32", {128, 72}, packed.Expected(DType::kF32)}})
                  .ok());
  const std::string out = dir + "/out.npy";
  const CommandResult run = RunDequantctl(
      dir, {"--server", "127.0.0.1:1", "--deadline", "10", "dequantize", "--packed", input,
            "--prefix", "mm.", "--out", out, "--compare", reference, "--compare-layout", "nk"});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.out, "");
  EXPECT_EQ(run.err, "dequantctl: INVALID_ARGUMENT: reference '" + reference +
                         ":mm.weight' has shape (128, 72); --compare-layout nk expects (N, K) = "
                         "(72, 128)\n");
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace dequantd::testing
