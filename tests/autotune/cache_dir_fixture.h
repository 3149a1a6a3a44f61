// A gtest fixture for autotune_test: a fresh directory per test (named after the process and the
// test) holding the tune cache path, removed afterwards.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace dequantd::autotune_testing {

class CacheDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("autotune_test." + std::to_string(::getpid()) + "." + info->test_suite_name() + "." +
            info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "cache.json").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;  // this test's directory
  std::string path_;           // dir_/cache.json (not created)
};

}  // namespace dequantd::autotune_testing
