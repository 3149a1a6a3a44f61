// A per-process temporary directory for client_test, removed when the test program ends.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace dequantd::client_test {

inline const std::filesystem::path& TestDir() {
  static const std::filesystem::path* const dir = [] {
    auto* d = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                        ("dequantd_client_test_" + std::to_string(::getpid())));
    std::filesystem::create_directories(*d);
    return d;
  }();
  return *dir;
}

// The path of `name` inside TestDir(); its parent directories are created.
inline std::string TempPath(const std::string& name) {
  const std::filesystem::path path = TestDir() / name;
  std::filesystem::create_directories(path.parent_path());
  return path.string();
}

class RemoveTestDir : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(TestDir(), ignored);
  }
};

inline ::testing::Environment* const kRemoveTestDir =
    ::testing::AddGlobalTestEnvironment(new RemoveTestDir);

}  // namespace dequantd::client_test
