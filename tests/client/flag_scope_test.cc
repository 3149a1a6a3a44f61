// CheckFlagsApply: each subcommand's own flags and the global ones pass; any other dequantctl
// flag is INVALID_ARGUMENT naming the flag, the subcommand and the subcommands it is for.
#include "client/flag_scope.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dequantd {
namespace {

TEST(FlagScopeTest, OwnAndGlobalFlagsApply) {
  EXPECT_TRUE(CheckFlagsApply("list", {"server", "deadline"}).ok());
  EXPECT_TRUE(CheckFlagsApply("dequantize", {"tensor", "out", "dtype", "compare", "compare_layout",
                                             "chunk_bytes"})
                  .ok());
  EXPECT_TRUE(CheckFlagsApply("dequantize", {"packed", "prefix", "group_size"}).ok());
  EXPECT_TRUE(CheckFlagsApply("dequantize-layers", {"tensors", "out_dir", "out", "dtype"}).ok());
  EXPECT_TRUE(CheckFlagsApply("dequantize", {"tensor", "orientation"}).ok());
  EXPECT_TRUE(CheckFlagsApply("dequantize-layers", {"orientation"}).ok());
  EXPECT_TRUE(CheckFlagsApply("benchmark", {"shapes", "tensors", "group_size", "dtype", "variants",
                                            "trials", "runs", "hardware_counters"})
                  .ok());
  // Not dequantctl's own flags (absl's), and subcommands main.cc rejects itself.
  EXPECT_TRUE(CheckFlagsApply("list", {"flagfile"}).ok());
  EXPECT_TRUE(CheckFlagsApply("frobnicate", {"out_dir"}).ok());
}

TEST(FlagScopeTest, OtherFlagsAreRefusedNamingWhereTheyBelong) {
  const absl::Status out_dir = CheckFlagsApply("dequantize", {"tensor", "out_dir"});
  EXPECT_EQ(out_dir.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out_dir.message(),
            "--out-dir does not apply to 'dequantize' (it is for dequantize-layers)");
  EXPECT_EQ(CheckFlagsApply("benchmark", {"out"}).message(),
            "--out does not apply to 'benchmark' (it is for dequantize and dequantize-layers)");
  EXPECT_EQ(CheckFlagsApply("list", {"dtype"}).message(),
            "--dtype does not apply to 'list' (it is for dequantize, dequantize-layers and "
            "benchmark)");
  EXPECT_EQ(CheckFlagsApply("list", {"orientation"}).message(),
            "--orientation does not apply to 'list' (it is for dequantize and dequantize-layers)");
  EXPECT_EQ(CheckFlagsApply("info", {"hardware_counters"}).message(),
            "--hardware-counters does not apply to 'info' (it is for benchmark)");
  EXPECT_EQ(CheckFlagsApply("dequantize-layers", {"tensor"}).message(),
            "--tensor does not apply to 'dequantize-layers' (it is for dequantize; did you mean "
            "--tensors?)");
  EXPECT_EQ(CheckFlagsApply("dequantize", {"tensors"}).message(),
            "--tensors does not apply to 'dequantize' (it is for dequantize-layers and "
            "benchmark; did you mean --tensor?)");
}

}  // namespace
}  // namespace dequantd
