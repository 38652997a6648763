// The trainer's plan under `lazytrain launch` (train/planning.h): one rank plans with its share of the
// host's DRAM (host_mem is the host's budget), its share of the micro-batches and the collectives;
// LT_LOCAL_WORLD_SIZE says how many ranks share the host.
#include <gtest/gtest.h>
#include <stdlib.h>

#include "../common/repo_path.h"
#include "core/error.h"
#include "core/units.h"
#include "model/model_config.h"
#include "train/planning.h"

namespace lt::train {
namespace {

TrainConfig rank_config() {
  TrainConfig c;
  c.profile = (lt::testing::repo_root() / "configs" / "profiles" / "h200.json").string();
  c.host_mem = "64GiB";
  c.planner = "dp";
  c.gradient_accumulation_steps = 4;
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
  small.host_mem = "3MiB";  // one process: 2.3 MB of state; a rank of two: 2.0 MB in 1.5 MiB
  EXPECT_NO_THROW(make_training_plan(small, m, 1, 64, "test", true));
  try {
    make_training_plan(small, m, 1, 64, "test", true, dist::Topology{2, 2, 1, 0});
    ADD_FAILURE() << "a rank planned with the whole host";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dram short"), std::string::npos) << e.what();
  }
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
