// Writes of a model directory that fail (ENOSPC: the file is a link to /dev/full, as on a full disk) are errors
// naming the file and the OS reason, whichever file it is: small JSON files too, whose bytes only reach the disk
// when the stream is flushed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "io/model_io.h"
#include "model/init.h"

using namespace lt;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& tag) {
  auto d = fs::temp_directory_path() / ("lt_write_failure_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// The error of save_model into a directory where `file` is a link to /dev/full.
std::string save_error_with_full(const std::string& file, DType dtype) {
  const fs::path d = fresh_dir(file);
  fs::create_symlink("/dev/full", d / file);
  std::string e;
  try {
    save_model(d, random_model(preset_config("tiny-qwen2"), 3), {dtype, 5 * GiB});
  } catch (const Error& x) {
    e = x.what();
  }
  fs::remove_all(d);
  return e;
}

}  // namespace

TEST(WriteFailure, ModelFilesNameTheFileAndTheReason) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  for (const char* file : {"config.json", "generation_config.json", "model.safetensors.tmp"}) {
    for (DType dt : {DType::F32, DType::BF16}) {
      const std::string e = save_error_with_full(file, dt);
      EXPECT_NE(e.find(file), std::string::npos) << file << ": " << e;
      EXPECT_NE(e.find(std::strerror(ENOSPC)), std::string::npos) << file << ": " << e;
    }
  }
}
