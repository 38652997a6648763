// A fresh directory under the system's temporary directory, named after a prefix, the process and the running
// test (so parallel test processes never share one), removed with everything in it at the end of its scope.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace lt::testing {

struct TestDir {
  std::filesystem::path p;
  explicit TestDir(const std::string& prefix, const std::string& tag = "") {
    p = std::filesystem::temp_directory_path() /
        (prefix + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name() +
         tag);
    std::filesystem::remove_all(p);
    std::filesystem::create_directories(p);
  }
  ~TestDir() { std::filesystem::remove_all(p); }
  TestDir(const TestDir&) = delete;
  TestDir& operator=(const TestDir&) = delete;
};

}  // namespace lt::testing
