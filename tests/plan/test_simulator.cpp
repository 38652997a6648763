#include <gtest/gtest.h>

#include "plan/simulator.h"
#include "plan_test_util.h"

namespace lt {
namespace {

Instance tiny() { return test::two_layer_instance(); }

TEST(PlanSimulator, SlotRulesByHand) {
  Instance in = tiny();
  // All on the GPU: no checkpoint traffic, blocks (0,1), (1,2).
  auto r = simulate(in, test::plan_for(in, {Tier::Gpu, Tier::Gpu, Tier::Gpu}));
  // prologue: (20 + 10) / 10 = 3
  // F0: max(1, 20/10) = 2          F1: max(1, 40/10) = 4 (head weights)
  // H: max(2, 20/10) = 2
  // B1: h = P = 20, d = G_head = 40: max(3, 2, 4, 60/15 = 4) = 4
  // B0: h = 0, d = G = 20: max(3, 2) = 3
  // epilogue: (20 + 10) / 10 = 3
  EXPECT_DOUBLE_EQ(r.pred.step_s, 3 + 2 + 4 + 2 + 4 + 3 + 3);
  EXPECT_DOUBLE_EQ(r.pred.compute_s, 1 + 1 + 2 + 3 + 3);
  EXPECT_DOUBLE_EQ(r.pred.exposed_h2d_s, 3 + 1 + 3);  // prologue + F0 + F1
  EXPECT_DOUBLE_EQ(r.pred.exposed_d2h_s, 1 + 3);      // B1 + epilogue
  EXPECT_DOUBLE_EQ(r.pred.exposed_optimizer_s, 0);
  // HBM: F1: ring 40 + b0 10 + in/out 20 + ws 1 = 71; B1: 40 + b0, b1 20 + ws 2 = 62;
  // H: 40 + b0, b1 20 + boundary L 10 + ws_head 3 = 73 (the peak).
  EXPECT_EQ(r.pred.peak_hbm, 73);
  EXPECT_TRUE(r.fits);

  // Boundary 1 on the CPU: D2H in F1 (with the head weights), H2D in H (before block (0,1)).
  auto c = simulate(in, test::plan_for(in, {Tier::Gpu, Tier::Cpu, Tier::Gpu}));
  // F1: h 40, d 10: max(1, 4, 1, 50/15) = 4 (unchanged); H: h 20 + 10 = 30: 3 (was 2)
  EXPECT_DOUBLE_EQ(c.pred.step_s, r.pred.step_s + 1);
  EXPECT_DOUBLE_EQ(c.dram, 100 + 10);

  // Recompute block (0,2): B1 recomputes layer 0 (rho 1) and loads its weights: h = P + 1*P = 40.
  auto b = simulate(in, test::plan_for(in, {Tier::Gpu, Tier::None, Tier::Gpu}));
  // B1: C = 3 + 1 = 4, h 40, d 40: max(4, 4, 4, 80/15 = 5.33)
  EXPECT_NEAR(b.pred.step_s, 3 + 2 + 4 + 2 + 80.0 / 15 + 3 + 3, 1e-12);
  EXPECT_DOUBLE_EQ(b.pred.recompute_s, 1);

  // Optimizer: layer 1's update (5 s) delays F0, which streams layer 1's weights.
  in.opt = {1, 5, 0, 0};
  auto o = simulate(in, test::plan_for(in, {Tier::Gpu, Tier::Gpu, Tier::Gpu}));
  // prologue at O0 = 1, ends 4; F0 waits until O1 = 6.
  EXPECT_DOUBLE_EQ(o.pred.step_s, r.pred.step_s + 1 + 2);
  EXPECT_DOUBLE_EQ(o.pred.exposed_optimizer_s, 3);

  // Two micro-batches: the second repeats the slots without the optimizer.
  in.opt = {0, 0, 0, 0};
  in.micro_batches = 2;
  auto m = simulate(in, test::plan_for(in, {Tier::Gpu, Tier::Gpu, Tier::Gpu}));
  EXPECT_DOUBLE_EQ(m.pred.step_s, 2 * r.pred.step_s);
}

// Unlike layers: layer 1 is larger (weights 30, workspaces 5 / 7) than layer 0 (20, 1 / 2). Each
// slot streams the weights of the layer it prefetches, D2Hs the gradient of the layer before it, and
// counts its own layer's workspace; the ring holds two of the largest layer.
TEST(PlanSimulator, UnlikeLayersByHand) {
  Instance in = tiny();
  in.kind = {LayerKind::GatedDeltaNet, LayerKind::Attention};
  in.P = {20, 30};
  in.G = {20, 30};
  in.ws_fwd = {1, 5};
  in.ws_bwd = {2, 7};
  in.ring = 60;
  auto r = simulate(in, test::plan_for(in, {Tier::Gpu, Tier::Gpu, Tier::Gpu}), true);
  // prologue (P0 + A) / 10 = 3; F0: h = P1 = 30: 3; F1: h = P_head: 4; H: h = P1 = 30: 3;
  // B1: h = P0 = 20, d = G_head = 40: max(3, 2, 4, 60/15) = 4; B0: d = G1 = 30: 3; epilogue (G0 + A) / 10 = 3.
  EXPECT_DOUBLE_EQ(r.pred.step_s, 3 + 3 + 4 + 3 + 4 + 3 + 3);
  // HBM: F0 60 + 20 + 1 = 81; F1 60 + 10 + 20 + 5 = 95 (peak); H 60 + 20 + 10 + 3 = 93; B1 60 + 20 + 7; B0 60 + 10 + 2.
  EXPECT_EQ(r.pred.peak_hbm, 95);
  EXPECT_DOUBLE_EQ(r.slot_hbm[size_t(in.slot_B(1))], 87);
  EXPECT_DOUBLE_EQ(r.slot_hbm[size_t(in.slot_B(0))], 72);
  // Compute ops carry their layer's kind (the SVG colours them); slot names carry a letter.
  EXPECT_EQ(slot_name(in, in.slot_F(0)), "F0 D");
  EXPECT_EQ(slot_name(in, in.slot_B(1)), "B1 A");
  int deltanet_ops = 0;
  for (auto& o : r.ops) deltanet_ops += o.kind == int(LayerKind::GatedDeltaNet);
  EXPECT_EQ(deltanet_ops, 2);  // F0 and B0

  // Recompute block (0,2): B1 re-runs layer 0 (rho 1) and loads its weights P0 = 20 besides its own 20.
  auto b = simulate(in, test::plan_for(in, {Tier::Gpu, Tier::None, Tier::Gpu}));
  // B1: C = 4, h = 40, d = 40: max(4, 4, 4, 80/15)
  EXPECT_NEAR(b.pred.step_s, 3 + 3 + 4 + 3 + 80.0 / 15 + 3 + 3, 1e-12);
  EXPECT_DOUBLE_EQ(b.slot_hbm[size_t(in.slot_B(1))], 60 + 10 + 10 + 7);  // boundary 0, regenerated 1, layer 1's set
}

TEST(PlanSimulator, ReportsShortestResource) {
  Instance in = tiny();
  in.hbm_cap = 60;
  auto r = simulate(in, test::plan_for(in, {Tier::Gpu, Tier::Gpu, Tier::Gpu}));
  EXPECT_FALSE(r.fits);
  EXPECT_EQ(r.violation, "does not fit: gpu short by 13 B (needs 73 B, has 60 B)");
}

}  // namespace
}  // namespace lt
