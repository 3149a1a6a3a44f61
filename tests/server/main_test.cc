// Tests for the dequantd executable (server/main.cc), run as a child process: usage errors
// (positional arguments, unknown flags, unparsable values) exit 2 before anything starts, --help
// exits 0, an option that CheckOptions refuses ends it with exit code 1 and the status naming the
// flag; SIGHUP shuts it down gracefully and a second signal during the shutdown ends it at once.
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "dequant/v1/dequant.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/dequantd_process.h"

namespace dequantd {
namespace {

using ::dequantd::testing::DequantdProcess;
using ::testing::HasSubstr;

struct ProcessResult {
  int exit_code = -1;  // -1: did not exit normally
  std::string output;  // stdout and stderr
};

// Runs the dequantd binary with `args` (shell words) and waits for it. A dequantd that starts
// serving instead of refusing its command line is killed after 30 s (exit code 124), so a
// regression fails rather than hangs.
// Runs dequantd with `args`, and the environment assignments `env` (e.g. "A=1") when not empty.
ProcessResult RunDequantd(const std::string& args, const std::string& env = "") {
  ProcessResult run;
  const std::string command = "timeout 30 " + (env.empty() ? "" : "env " + env + " ") +
                              ::dequantd::testing::DequantdBinary() + " " + args + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) run.output.append(buf, n);
  const int status = ::pclose(pipe);
  if (status != -1 && WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  return run;
}

TEST(DequantdMainTest, SighupShutsDownGracefully) {
  DequantdProcess dequantd(
      {"--model=", "--listen=127.0.0.1:0", "--metrics-listen=", "--backend=cpu"});
  ASSERT_GT(dequantd.ListeningPort(), 0) << dequantd.output();
  ASSERT_EQ(::kill(dequantd.pid(), SIGHUP), 0);
  // Without SIGHUP among the shutdown signals its default action kills dequantd: 128 + 1.
  EXPECT_EQ(dequantd.Wait(), 0) << dequantd.output();
  EXPECT_THAT(dequantd.output(), HasSubstr("signal 1 (SIGHUP) received: shutting down"));
  EXPECT_THAT(dequantd.output(), HasSubstr("dequantd stopped"));
}

// --listen HOST:0 asks for a free port: the security line names the port bound, not 0.
TEST(DequantdMainTest, TheSecurityLineNamesThePortBoundForPortZero) {
  DequantdProcess dequantd(
      {"--model=", "--listen=127.0.0.1:0", "--metrics-listen=", "--backend=cpu"});
  const int port = dequantd.ListeningPort();
  ASSERT_GT(port, 0) << dequantd.output();
  EXPECT_THAT(dequantd.output(),
              HasSubstr(absl::StrCat("security: plaintext on 127.0.0.1:", port, "; tokens off")));
  ASSERT_EQ(::kill(dequantd.pid(), SIGTERM), 0);
  EXPECT_EQ(dequantd.Wait(), 0) << dequantd.output();
}

TEST(DequantdMainTest, SecondSignalDuringTheShutdownExitsAtOnce) {
  DequantdProcess dequantd({"--model=", "--listen=127.0.0.1:0", "--metrics-listen=",
                            "--backend=cpu", "--cpu-threads=1", "--shutdown-deadline=60"});
  const int port = dequantd.ListeningPort();
  ASSERT_GT(port, 0) << dequantd.output();

  // An in-flight call that cannot finish: a 256 MiB result (8192 x 8192 fp32) whose client reads
  // only the header, so the server's writes block on flow control. The graceful shutdown would
  // wait the whole --shutdown-deadline (60 s) for it.
  auto stub = ::dequant::v1::DequantService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  constexpr int64_t K = 8192, N = 8192, G = 128;
  ::dequant::v1::DequantizeRequest request;
  ::dequant::v1::InlinePackedTensor* packed = request.mutable_packed();
  packed->set_in_features(K);
  packed->set_out_features(N);
  packed->set_group_size(G);
  packed->set_qweight(std::string(K * N / 2, '\0'));
  packed->set_qzeros(std::string(K / G * N / 2, '\0'));
  packed->set_scales(std::string(K / G * N * 2, '\0'));
  request.set_output_dtype(::dequant::v1::DTYPE_FP32);
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<::dequant::v1::DequantizeResponse>> reader =
      stub->Dequantize(&context, request);
  ::dequant::v1::DequantizeResponse header;
  ASSERT_TRUE(reader->Read(&header));
  ASSERT_TRUE(header.has_header());

  ASSERT_EQ(::kill(dequantd.pid(), SIGTERM), 0);
  // The first signal is taken (standard signals do not queue: send the second after it).
  ASSERT_TRUE(dequantd.ReadUntil("received: shutting down")) << dequantd.output();
  ASSERT_EQ(::kill(dequantd.pid(), SIGINT), 0);
  // Without the second-signal watcher dequantd would wait for the call until SIGALRM (30 s)
  // killed it: 128 + 14.
  EXPECT_EQ(dequantd.Wait(), 128 + SIGINT) << dequantd.output();
  EXPECT_THAT(dequantd.output(), HasSubstr("signal 15 (SIGTERM) received: shutting down"));
  EXPECT_THAT(dequantd.output(),
              HasSubstr("second signal: exiting now (signal 2 (SIGINT), exit code 130)"));
  EXPECT_THAT(dequantd.output(), ::testing::Not(HasSubstr("dequantd stopped")));
  context.TryCancel();
  reader->Finish();
}

TEST(DequantdMainTest, PositionalPathIsRefusedNamingItAndSuggestingModel) {
  // Without the check it would start serving the bundled model on the default ports.
  const ProcessResult run = RunDequantd("/path/to/model --listen=127.0.0.1:0 --metrics-listen=");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("dequantd: unexpected argument '/path/to/model' (did you mean "
                                    "--model=/path/to/model?)"));
  EXPECT_THAT(run.output, HasSubstr("usage: dequantd [--model DIR]"));
}

TEST(DequantdMainTest, PositionalWordAndArgumentsAfterDoubleDashAreRefused) {
  ProcessResult run = RunDequantd("--model= serve");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("unexpected argument 'serve' (dequantd takes only flags; see --help)"));
  run = RunDequantd("--model= -- --listen=127.0.0.1:0");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("unexpected argument '--listen=127.0.0.1:0'"));
}

TEST(DequantdMainTest, UnknownFlagAndUnparsableValueAreUsageErrorsWithExitCode2) {
  ProcessResult run = RunDequantd("--bogus=1");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("Unknown command line flag 'bogus'"));
  EXPECT_THAT(run.output, HasSubstr("dequantd: see dequantd --help"));
  run = RunDequantd("--cpu-threads=abc");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("Illegal value 'abc' specified for flag 'cpu_threads'"));
  run = RunDequantd("--model= --listen");  // a string flag without its value
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("Missing the value for the flag 'listen'"));
}

TEST(DequantdMainTest, HelpExitsZeroWithTheUsageAndNoSourcePath) {
  ProcessResult run = RunDequantd("--help");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, ::testing::StartsWith("dequantd: serves dequantized weights"));
  EXPECT_THAT(run.output, HasSubstr("usage: dequantd [--model DIR]"));
  EXPECT_THAT(run.output, HasSubstr("exit codes: 0 stopped or --help/--version, 1 cannot start "
                                    "(including a flag value that parses but is out of range"));
  EXPECT_THAT(run.output, HasSubstr("2 usage error (unknown flag, a value that does not parse"));
  EXPECT_THAT(run.output, HasSubstr("\n  Flags from dequantd:\n"));
  EXPECT_THAT(run.output, HasSubstr("--shutdown_deadline"));
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("main.cc")));
  run = RunDequantd("--version");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, ::testing::StartsWith("dequantd "));
}

TEST(DequantdMainTest, NanShutdownDeadlineIsRefusedNamingTheFlag) {
  const ProcessResult run = RunDequantd(
      "--model= --listen=127.0.0.1:0 --metrics-listen= --backend=cpu --shutdown-deadline=nan");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("INVALID_ARGUMENT: shutdown_deadline (--shutdown-deadline) must be a "
                        "number of seconds in 0..86400, got nan"));
}

TEST(DequantdMainTest, HugeMaxRequestBytesIsRefusedNamingTheFlag) {
  const ProcessResult run = RunDequantd(
      "--model= --listen=127.0.0.1:0 --metrics-listen= --backend=cpu "
      "--max-request-bytes=9223372036854775807");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("INVALID_ARGUMENT: max_request_bytes (--max-request-bytes) "
                                    "must be in 1..2020174185"));
}

TEST(DequantdMainTest, OptionErrorsNameTheFlag) {
  const std::string common = "--model= --metrics-listen= --backend=cpu ";
  ProcessResult run = RunDequantd(common + "--listen=127.0.0.1:0 --max-output-bytes=0");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("INVALID_ARGUMENT: max_output_bytes (--max-output-bytes) "
                                    "must be positive, got 0"));
  run = RunDequantd(common + "--listen=127.0.0.1:0 --cpu-threads=2000");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("INVALID_ARGUMENT: cpu_threads (--cpu-threads) must be in "
                                    "0..1024, got 2000"));
  run = RunDequantd(common + "--listen=localhost");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("INVALID_ARGUMENT: listen (--listen) must be HOST:PORT"));
  run = RunDequantd("--model= --backend=cpu --listen=127.0.0.1:0 --metrics-listen=127.0.0.1:x");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("INVALID_ARGUMENT: metrics_listen (--metrics-listen) must be HOST:PORT"));
}

// Issue 22: the load's flags are checked at start, before anything is read.
TEST(DequantdMainTest, LoadOptionErrorsNameTheFlag) {
  const std::string common = "--model= --metrics-listen= --backend=cpu --listen=127.0.0.1:0 ";
  ProcessResult run = RunDequantd(common + "--load-threads=257");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("INVALID_ARGUMENT: load_threads (--load-threads) must be in "
                                    "0..256 (0 = min(16, hardware threads)), got 257"));
  run = RunDequantd(common + "--load-staging-bytes=1048576");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("INVALID_ARGUMENT: load_staging_bytes (--load-staging-bytes) "
                                    "must be at least 2097152 (two 1 MiB buffers), got 1048576"));
  // Host memory too small for the staging asked for: 1 TiB here (24 GiB, or a CI runner).
  run = RunDequantd(common + "--load-staging-bytes=1099511627776");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("RESOURCE_EXHAUSTED: load_staging_bytes (--load-staging-bytes) = "
                        "1099511627776 bytes of pinned staging is more than half of this host's "
                        "available memory"));
  // Issue 23: ReadTensor's staging, 0 (off) or at least two 1 MiB buffers.
  run = RunDequantd(common + "--read-staging-bytes=1048576");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("INVALID_ARGUMENT: read_staging_bytes (--read-staging-bytes) "
                                    "must be 0 or at least 2097152 (two 1 MiB buffers), got "
                                    "1048576"));
  run = RunDequantd(common + "--resident-stored-bytes=-1");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("INVALID_ARGUMENT: resident_stored_bytes "
                                    "(--resident-stored-bytes) must be 0 (none)"));
  run = RunDequantd(common + "--resident-stored-bytes=1 --read-staging-bytes=0");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("INVALID_ARGUMENT: --resident-stored-bytes keeps tensors read "
                                    "through the staging, but --read-staging-bytes=0"));
  run = RunDequantd(common + "--resident-stored-bytes=1");  // common has --backend=cpu
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("INVALID_ARGUMENT: --resident-stored-bytes=1 keeps tensors in "
                                    "GPU memory but --backend is cpu"));
  run = RunDequantd(common + "--read-staging-bytes=1099511627776");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("RESOURCE_EXHAUSTED: read_staging_bytes (--read-staging-bytes) = "
                        "1099511627776 bytes of pinned staging is more than half of this host's "
                        "available memory"));
}

TEST(DequantdMainTest, DeviceOptionErrorsNameTheFlagOrVariable) {
  const std::string common = "--model= --metrics-listen= --listen=127.0.0.1:0 ";
  ProcessResult run = RunDequantd(common + "--backend=cpu --devices=0,x");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("INVALID_ARGUMENT: --devices: \"0,x\" is not \"all\" or a "
                                    "comma-separated list of CUDA ordinals"));
  run = RunDequantd(common + "--backend=cpu --devices=1");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("INVALID_ARGUMENT: --devices=1 names CUDA devices but --backend is cpu"));
  run = RunDequantd(common + "--backend=cpu --placement=spread");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(
      run.output,
      HasSubstr("INVALID_ARGUMENT: --placement: \"spread\" is not auto, replicated or split"));
  run = RunDequantd(common + "--backend=cpu --placement=split");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("INVALID_ARGUMENT: --placement=split places layers on GPUs but --backend "
                        "is cpu"));
  // --device-memory-limit: refused with the cpu backend (it limits GPU memory), and when negative.
  run = RunDequantd(common + "--backend=cpu --device-memory-limit=1048576");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("INVALID_ARGUMENT: --device-memory-limit=1048576 limits GPU "
                                    "memory but --backend is cpu"));
  run = RunDequantd(common + "--backend=cpu --device-memory-limit=-1");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("INVALID_ARGUMENT: --device-memory-limit must be 0 (no limit) "
                                    "or a number of bytes, got -1"));
  run = RunDequantd(common + "--backend=cpu --device-memory-limit=half");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("Illegal value 'half' specified for flag 'device_memory_limit'"));
  run = RunDequantd(common + "--backend=cpu", "DEQUANTD_INJECT_DEVICE_FAILURE=cuda:1=explode");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("INVALID_ARGUMENT: DEQUANTD_INJECT_DEVICE_FAILURE: "
                                    "\"cuda:1=explode\" is not LABEL=start"));
}

TEST(DequantdMainTest, SameListenAndMetricsListenConflict) {
  // Refused before anything binds, so the port need not be free.
  const ProcessResult run = RunDequantd(
      "--model= --backend=cpu --listen=127.0.0.1:50999 --metrics-listen=127.0.0.1:50999");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("INVALID_ARGUMENT: listen (--listen) and metrics_listen "
                                    "(--metrics-listen) conflict: both are \"127.0.0.1:50999\""));
}

TEST(DequantdMainTest, RegularFileAsModelIsNotADirectoryAndMissingDirDoesNotExist) {
  const std::string file = ::testing::TempDir() + "/main_test_model_file.md";
  {
    FILE* f = fopen(file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fputs("# readme\n", f);
    fclose(f);
  }
  ProcessResult run =
      RunDequantd("--model=" + file + " --listen=127.0.0.1:0 --metrics-listen= --backend=cpu");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("INVALID_ARGUMENT: checkpoint '" + file + "' is not a directory"));
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("does not exist")));
  run = RunDequantd("--model=" + file + ".missing --listen=127.0.0.1:0 --metrics-listen=");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("does not exist"));
}

}  // namespace
}  // namespace dequantd
