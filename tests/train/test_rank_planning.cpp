// The trainer's plan under `lazytrain launch` (train/planning.h): one rank plans with its share of the
// host's DRAM (host_mem is the host's budget), its gradient_accumulation_steps micro-batches and the collectives;
// LT_LOCAL_WORLD_SIZE says how many ranks share the host.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../common/repo_path.h"
#include "core/error.h"
#include "core/units.h"
#include "model/model_config.h"
#include "train/planning.h"

namespace lt::train {
namespace {

namespace fs = std::filesystem;

TrainConfig rank_config() {
  TrainConfig c;
  c.placement.profile = (lt::testing::repo_root() / "configs" / "profiles" / "h200.json").string();
  c.placement.host_mem = "64GiB";
  c.placement.planner = "dp";
  c.schedule.gradient_accumulation_steps = 4;
  return c;
}

TEST(RankPlanning, TwoRanksOnAHostPlanWithHalfItsDram) {
  const auto m = preset_config("tiny-qwen3");
  const TrainConfig c = rank_config();
  const TrainingPlan one = make_training_plan(c, m, 1, 64, "test", true);
  EXPECT_EQ(one.planned_dram, 64 * GiB);
  EXPECT_EQ(one.summary.find("data parallel"), std::string::npos);
  EXPECT_EQ(one.placement.moment_shards, 1);

  const TrainingPlan two = make_training_plan(c, m, 1, 64, "test", true, dist::Topology{2, 2, 1, 0});
  EXPECT_EQ(two.planned_dram, 32 * GiB);
  EXPECT_EQ(two.placement.moment_shards, 2);
  EXPECT_TRUE(two.placement.fp32_master_array);
  EXPECT_NE(two.summary.find("data parallel: world 2, 2 ranks per host: DRAM 32.00 GiB per rank x 2 = 64.00 GiB per host"),
            std::string::npos)
      << two.summary;
  // Four ranks over two hosts: two share each host.
  EXPECT_EQ(make_training_plan(c, m, 1, 64, "test", true, dist::Topology{4, 2, 1, 0}).planned_dram, 32 * GiB);
  // What does not fit the rank's share is an error naming the DRAM.
  TrainConfig small = c;
  small.placement.host_mem = "3MiB";  // one process: 2.3 MB of state; a rank of two: 2.0 MB in 1.5 MiB
  EXPECT_NO_THROW(make_training_plan(small, m, 1, 64, "test", true));
  try {
    make_training_plan(small, m, 1, 64, "test", true, dist::Topology{2, 2, 1, 0});
    ADD_FAILURE() << "a rank planned with the whole host";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dram short"), std::string::npos) << e.what();
  }
}

// per_device_train_batch_size and gradient_accumulation_steps are per rank (the global batch is N times
// one rank's): a rank plans all of its gradient_accumulation_steps micro-batches, not a share of them.
TEST(RankPlanning, ARankPlansItsGradientAccumulationSteps) {
  const auto m = preset_config("tiny-qwen3");
  TrainConfig c = rank_config();
  const fs::path dir = fs::temp_directory_path() / ("lt_rank_planning_" + std::to_string(::getpid()));
  c.output.output_dir = dir.string();
  for (int world : {1, 2, 4}) {
    fs::remove_all(dir);
    make_training_plan(c, m, 1, 64, "test", true, dist::Topology{world, world, 1, 0});
    std::ifstream in(dir / "plan.json");
    const auto plan = nlohmann::json::parse(in);
    EXPECT_EQ(plan.at("micro_batches").get<int64_t>(), c.schedule.gradient_accumulation_steps) << "world " << world;
  }
  fs::remove_all(dir);
}

TEST(RankPlanning, TopologyFromTheLauncherEnvironment) {
  ::unsetenv("LT_LOCAL_WORLD_SIZE");
  EXPECT_EQ(rank_topology(4).ranks_per_host, 4);
  ::setenv("LT_LOCAL_WORLD_SIZE", "2", 1);
  const auto t = rank_topology(4);
  EXPECT_EQ(t.world, 4);
  EXPECT_EQ(t.ranks_per_host, 2);
  for (const char* bad : {"3", "0", "x", "8"}) {
    ::setenv("LT_LOCAL_WORLD_SIZE", bad, 1);
    try {
      rank_topology(4);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("LT_LOCAL_WORLD_SIZE"), std::string::npos) << e.what();
    }
  }
  ::unsetenv("LT_LOCAL_WORLD_SIZE");
}

}  // namespace
}  // namespace lt::train
