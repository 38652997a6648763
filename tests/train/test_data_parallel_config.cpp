// What `lazytrain launch -n N -- train` refuses (train/data_parallel.h), each error naming the config
// field, expected vs actual (not the micro-batch count: gradient_accumulation_steps is per rank); and the
// threads a rank takes when the config says all cores.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "core/error.h"
#include "train/data_parallel.h"

namespace lt::train {
namespace {

std::string refusal(const TrainConfig& c, const TrainingPlan& tp, int world) {
  try {
    check_data_parallel_config(c.placement, tp, world);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DataParallelConfig, RefusesWhatTheRanksCannotRunNamingTheField) {
  TrainConfig c;
  c.schedule.gradient_accumulation_steps = 4;
  TrainingPlan tp;
  // gradient_accumulation_steps is per rank: any count runs on any number of ranks.
  for (int world : {2, 4, 5, 8}) EXPECT_EQ(refusal(c, tp, world), "") << world;
  c.schedule.gradient_accumulation_steps = 1;
  EXPECT_EQ(refusal(c, tp, 8), "");

  TrainingPlan sr = tp;
  sr.placement.master = MasterMode::Bf16Sr;
  c.placement.master_weights = MasterWeights::Auto;
  const std::string m = refusal(c, sr, 2);
  EXPECT_NE(m.find("master_weights 'auto'"), std::string::npos) << m;
  EXPECT_NE(m.find("set master_weights=fp32"), std::string::npos) << m;
  c.placement.master_weights = MasterWeights::Fp32;

  TrainingPlan dev = tp;
  dev.placement.grads = GradHome::Device;
  const std::string g = refusal(c, dev, 2);
  EXPECT_NE(g.find("gradients 'auto'"), std::string::npos) << g;
  EXPECT_NE(g.find("set gradients=host"), std::string::npos) << g;

  TrainingPlan nvme = tp;
  nvme.placement.nvme_layers = 3;
  const std::string n = refusal(c, nvme, 2);
  EXPECT_NE(n.find("optimizer_nvme"), std::string::npos) << n;
  c.placement.optimizer_nvme = OptimizerNvme::All;
  EXPECT_NE(refusal(c, tp, 2).find("optimizer_nvme 'all'"), std::string::npos);
}

TEST(DataParallelConfig, AllCoresAreSharedByTheRanksOfTheHost) {
  TrainConfig c;
  c.placement.threads = 0;
  ::unsetenv("LT_LOCAL_WORLD_SIZE");
  EXPECT_EQ(with_rank_threads(c).placement.threads, 0);  // one process: all cores, as before
  ::setenv("LT_LOCAL_WORLD_SIZE", "1024", 1);
  EXPECT_EQ(with_rank_threads(c).placement.threads, 1);  // at least one
  ::setenv("LT_LOCAL_WORLD_SIZE", "2", 1);
  EXPECT_GE(with_rank_threads(c).placement.threads, 1);
  c.placement.threads = 3;
  EXPECT_EQ(with_rank_threads(c).placement.threads, 3);  // an explicit count is kept
  ::unsetenv("LT_LOCAL_WORLD_SIZE");
}

}  // namespace
}  // namespace lt::train
