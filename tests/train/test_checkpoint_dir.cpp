#include <gtest/gtest.h>

#include <unistd.h>

#include "core/error.h"
#include "train/checkpoint_dir.h"

using namespace lt::train;

namespace {
struct TmpDir {
  fs::path p;
  TmpDir() {
    p = fs::temp_directory_path() / ("lt_ckpt_test_" + std::to_string(::getpid()) + "_" +
                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(p);
    fs::create_directories(p);
  }
  ~TmpDir() { fs::remove_all(p); }
};

void save(const fs::path& out, int64_t step, const std::string& payload) {
  CheckpointWriter w(out, step);
  write_file_durable(w.dir() / "payload.txt", payload);
  w.commit();
}
}  // namespace

TEST(CheckpointDir, SaveListLatestRotate) {
  TmpDir t;
  save(t.p, 10, "a");
  save(t.p, 20, "b");
  save(t.p, 30, "c");
  auto all = list_checkpoints(t.p);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].step, 10);
  EXPECT_EQ(latest_checkpoint(t.p)->step, 30);
  EXPECT_EQ(read_file_text(latest_checkpoint(t.p)->path / "payload.txt"), "c");
  rotate_checkpoints(t.p, 2);
  all = list_checkpoints(t.p);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].step, 20);
  EXPECT_FALSE(fs::exists(checkpoint_path(t.p, 10)));
}

TEST(CheckpointDir, CrashAtEveryStageKeepsPreviousValid) {
  for (const char* stage : {"fsync", "rename", "marker"}) {
    TmpDir t;
    save(t.p, 1, "good");
    CheckpointWriter::fault_hook = [&](const std::string& s) {
      if (s == stage) throw std::runtime_error("injected crash");
    };
    EXPECT_THROW(save(t.p, 2, "new"), std::runtime_error) << stage;
    CheckpointWriter::fault_hook = nullptr;
    auto last = latest_checkpoint(t.p);
    ASSERT_TRUE(last) << stage;
    EXPECT_EQ(last->step, 1) << stage;
    EXPECT_EQ(read_file_text(last->path / "payload.txt"), "good");
    EXPECT_EQ(*resolve_resume("auto", t.p), last->path);
    if (std::string(stage) == "marker") {
      // renamed but unmarked: present on disk, refused as a resume source, removed by rotation
      EXPECT_TRUE(fs::exists(checkpoint_path(t.p, 2)));
      EXPECT_THROW(resolve_resume(checkpoint_path(t.p, 2).string(), t.p), lt::Error);
      rotate_checkpoints(t.p, 0);
      EXPECT_FALSE(fs::exists(checkpoint_path(t.p, 2)));
    }
    // the next save of the same step succeeds
    save(t.p, 2, "new");
    EXPECT_EQ(latest_checkpoint(t.p)->step, 2);
  }
}

TEST(CheckpointDir, ResaveSameStepReplaces) {
  TmpDir t;
  save(t.p, 5, "x");
  save(t.p, 5, "y");
  EXPECT_EQ(read_file_text(checkpoint_path(t.p, 5) / "payload.txt"), "y");
  EXPECT_EQ(list_checkpoints(t.p).size(), 1u);
}

TEST(CheckpointDir, ResolveResume) {
  TmpDir t;
  EXPECT_FALSE(resolve_resume("", t.p));
  EXPECT_FALSE(resolve_resume("auto", t.p));
  EXPECT_THROW(resolve_resume((t.p / "nope").string(), t.p), lt::Error);
  EXPECT_EQ(checkpoint_step("checkpoint-123"), 123);
  EXPECT_EQ(checkpoint_step("checkpoint-x"), -1);
}
