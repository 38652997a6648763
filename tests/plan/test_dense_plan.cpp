// `lazytrain plan --model qwen2.5-7b --batch 72 --seq 1024 --profile h800-80g`: the report's layer line gives a
// dense model's layer parameters (not the upload bytes, 0 for layers updated on the GPU), without the per-kind
// table hybrids get; with `--planner megatrain:4` the automatic count of layers updated on the GPU
// (device_update_layers auto) leaves room for that planner's plan, and where a forced count does not, the advice
// names the smallest fix: fewer such layers.
#include <gtest/gtest.h>

#include "../common/repo_path.h"
#include "core/units.h"
#include "model/accounting.h"
#include "model/model_config.h"
#include "model/param_layout.h"
#include "plan/fit_advice.h"
#include "plan/planner.h"
#include "plan/profile.h"
#include "plan/report.h"

namespace lt {
namespace {

PlanRequest qwen7b_h800(const std::string& planner) {
  PlanRequest r;
  r.model = preset_config("qwen2.5-7b");
  r.batch = 72;
  r.seq = 1024;
  r.profile = load_profile_file((lt::testing::repo_root() / "configs" / "profiles" / "h800-80g.json").string());
  r.planner = planner;
  r.compare = false;
  r.milp.time_limit_s = 20;
  return r;
}



TEST(PlanDenseModel, LayerLineGivesTheLayersParameters) {
  const PlanRequest r = qwen7b_h800("dp");
  const PlanOutcome o = make_plan(r);
  ASSERT_TRUE(o.feasible) << o.why;
  ASSERT_GT(o.placement.device_update_layers, 0);  // the first layers' upload is 0: not their size
  const std::string rep = plan_report(r, o);
  const int64_t params = unit_param_count(model_layout(r.model).layer(0));
  const std::string line = fmt::format("layers: 28 x {:.1f}M params ({} bf16 each)", double(params) / 1e6,
                                       format_bytes(double(2 * params)));
  EXPECT_NE(rep.find(line), std::string::npos) << line << "\n" << rep;
  EXPECT_EQ(rep.find("0.0M params"), std::string::npos) << rep;
  EXPECT_EQ(rep.find("attention x28"), std::string::npos) << "a per-kind table for a dense model\n" << rep;
}

TEST(PlanDenseModel, MegatrainWithAutomaticDeviceLayersFits) {
  const PlanRequest r = qwen7b_h800("megatrain:4");
  const PlanOutcome o = make_plan(r);
  ASSERT_TRUE(o.feasible) << o.why;
  EXPECT_EQ(o.chosen, "megatrain:4");
  EXPECT_LE(o.sim.pred.peak_hbm, r.profile.hbm_bytes - r.profile.hbm_reserve);
  // The DP's plan may hold more layers on the GPU; megatrain:4's keeps as many as leave room for its checkpoints.
  const PlanOutcome dp = make_plan(qwen7b_h800("dp"));
  ASSERT_TRUE(dp.feasible) << dp.why;
  EXPECT_LE(o.placement.device_update_layers, dp.placement.device_update_layers);
  // One more layer on the GPU than chosen is either slower or does not fit megatrain:4.
  PlanRequest more = r;
  more.device_update_layers = o.placement.device_update_layers + 1;
  const PlanOutcome m = make_plan(more);
  EXPECT_TRUE(!m.feasible || m.sim.pred.step_s >= o.sim.pred.step_s * (1 - 1e-6));
}

TEST(PlanDenseModel, ForcedDeviceLayersThatLeaveNoRoomAdviseFewer) {
  PlanRequest r = qwen7b_h800("megatrain:4");
  r.device_update_layers = 18;
  const PlanOutcome o = make_plan(r);
  ASSERT_FALSE(o.feasible);
  // The shortfall is megatrain:4's, and the advice the fewest layers to take off the GPU.
  EXPECT_NE(o.why.find("does not fit: gpu short by"), std::string::npos) << o.why;
  const FitAdvice a = fit_advice(r);
  ASSERT_EQ(a.change.rfind("device_update_layers <= ", 0), 0u) << o.why;
  const int64_t k = std::stoll(a.change.substr(std::string("device_update_layers <= ").size()));
  EXPECT_LT(k, 18);
  EXPECT_GE(k, 1);
  EXPECT_NE(o.why.find("; it fits with device_update_layers <= " + std::to_string(k)), std::string::npos) << o.why;
  r.device_update_layers = k;
  EXPECT_TRUE(make_plan(r).feasible);
  r.device_update_layers = k + 1;
  EXPECT_FALSE(make_plan(r).feasible);

}

}  // namespace
}  // namespace lt
