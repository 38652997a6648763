// The checkpoint's small files (trainer_state.json, trainer_config.yaml, COMPLETE) are written through
// write_file_durable: a failed write names the file and the OS reason.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "train/checkpoint_dir.h"

namespace fs = std::filesystem;

TEST(CheckpointWrite, DurableFileWriteNamesTheReason) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const fs::path d = fs::temp_directory_path() / ("lt_ckpt_write_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  fs::create_symlink("/dev/full", d / "trainer_state.json");  // every write fails with ENOSPC, as on a full disk
  std::string e;
  try {
    lt::train::write_file_durable(d / "trainer_state.json", std::string(100, 'x'));
  } catch (const lt::Error& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("trainer_state.json"), std::string::npos) << e;
  EXPECT_NE(e.find(std::strerror(ENOSPC)), std::string::npos) << e;
  fs::remove_all(d);
}
