#include <gtest/gtest.h>

#include <unistd.h>

#include "core/error.h"
#include "train/checkpoint_dir.h"
#include "../common/test_dir.h"

using namespace lt::train;

namespace {
struct TmpDir : lt::testing::TestDir {
  TmpDir() : TestDir("lt_ckpt_test_") {}
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

// Two runs writing one output_dir once left checkpoint-45 holding nothing but its COMPLETE marker (the
// other run's rotation had emptied it between the rename and the marker). resume_from_checkpoint=auto
// must take the newest checkpoint whose files are all there, whole: checkpoint-40 here.
TEST(ConcurrentOutputDir, ResumeAutoTakesTheNewestCompleteCheckpoint) {
  TmpDir t;
  save(t.p, 40, "forty");
  // checkpoint-45: only the marker, as the writer of the time wrote it.
  fs::create_directories(checkpoint_path(t.p, 45));
  write_file_durable(checkpoint_path(t.p, 45) / kCompleteMarker, "complete\n");
  // checkpoint-50: a whole save, then a file removed.
  save(t.p, 50, "fifty");
  fs::remove(checkpoint_path(t.p, 50) / "payload.txt");
  // checkpoint-55: a whole save, then a file cut short.
  save(t.p, 55, "fifty-five");
  write_file_durable(checkpoint_path(t.p, 55) / "payload.txt", "fifty");

  for (int64_t step : {45, 50, 55}) EXPECT_FALSE(is_complete_checkpoint(checkpoint_path(t.p, step))) << step;
  ASSERT_TRUE(latest_checkpoint(t.p));
  EXPECT_EQ(latest_checkpoint(t.p)->step, 40);
  ASSERT_TRUE(resolve_resume("auto", t.p));
  EXPECT_EQ(*resolve_resume("auto", t.p), checkpoint_path(t.p, 40));
  EXPECT_EQ(list_checkpoints(t.p).size(), 1u);

  // An explicit path to an incomplete checkpoint is refused, saying what is wrong with it.
  const auto refusal = [&](int64_t step) {
    try {
      resolve_resume(checkpoint_path(t.p, step).string(), t.p);
    } catch (const lt::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(refusal(45).find("trainer_state/trainer_state.json"), std::string::npos) << refusal(45);
  EXPECT_NE(refusal(50).find("payload.txt"), std::string::npos) << refusal(50);
  EXPECT_NE(refusal(55).find("payload.txt"), std::string::npos) << refusal(55);
  EXPECT_NE(refusal(55).find("5 bytes"), std::string::npos) << refusal(55);

  // Rotation (after the next save) removes them; checkpoint-40 stays.
  save(t.p, 60, "sixty");
  rotate_checkpoints(t.p, 0);
  for (int64_t step : {45, 50, 55}) EXPECT_FALSE(fs::exists(checkpoint_path(t.p, step))) << step;
  EXPECT_EQ(read_file_text(checkpoint_path(t.p, 40) / "payload.txt"), "forty");
}

// A checkpoint written before the marker listed its files (the marker says "complete") is complete
// when the files a resume reads are there.
TEST(ConcurrentOutputDir, CheckpointWithTheOlderMarkerIsCompleteWithItsTrainerState) {
  TmpDir t;
  const fs::path d = checkpoint_path(t.p, 30);
  fs::create_directories(d / "trainer_state" / "master");
  for (const char* f : {"config.json", "trainer_state/trainer_state.json", "trainer_state/optimizer.bin",
                        "trainer_state/master/config.json"})
    write_file_durable(d / f, "{}");
  write_file_durable(d / kCompleteMarker, "complete\n");
  EXPECT_TRUE(is_complete_checkpoint(d));
  fs::remove(d / "trainer_state" / "optimizer.bin");
  EXPECT_FALSE(is_complete_checkpoint(d));
}
