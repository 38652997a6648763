#include "../common/repo_path.h"
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/units.h"
#include "model/accounting.h"
#include "plan/heuristics.h"
#include "plan/planner.h"
#include "plan/profile.h"
#include "plan/report.h"

namespace lt {
namespace {

ResourceProfile test_profile() {
  return load_profile_file(lt::testing::repo_root().string() + "/configs/profiles/h200.json");
}

PlanRequest request(const std::string& model, int64_t batch, int64_t hbm_gib) {
  PlanRequest r;
  r.model = preset_config(model);
  r.batch = batch;
  r.seq = 1024;
  r.profile = test_profile();
  r.profile.hbm_bytes = hbm_gib * GiB;
  r.profile.hbm_reserve = GiB;
  r.milp.time_limit_s = 10;
  return r;
}

TEST(Planner, PresetsLoad) {
  for (auto& n : profile_preset_names()) {
    auto p = load_profile_file(lt::testing::repo_root().string() + "/configs/profiles/" + n + ".json");
    EXPECT_EQ(p.name, n);
    EXPECT_FALSE(p.source.empty());
    auto j = profile_to_json(p);
    auto q = profile_from_json(j, "rt");
    EXPECT_EQ(profile_to_json(q).dump(), j.dump());
  }
}

TEST(Planner, ProfileErrors) {
  auto j = profile_to_json(test_profile());
  j["h2d_gbps"] = -1;
  EXPECT_THROW(profile_from_json(j, "x"), Error);
  j = profile_to_json(test_profile());
  j["extra"] = 1;
  EXPECT_THROW(profile_from_json(j, "x"), Error);
  j = profile_to_json(test_profile());
  j.erase("gemm_tflops");
  try {
    profile_from_json(j, "x.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing field 'gemm_tflops'"), std::string::npos);
  }
}

// The optional NVMe queue fields (nvme/io_queue.h): absent by default, round trip, errors naming the field.
TEST(Planner, ProfileNvmeQueueFields) {
  auto j = profile_to_json(test_profile());
  EXPECT_FALSE(j.contains("nvme_queue_depth"));
  j["nvme_latency_us"] = 80.0;
  j["nvme_queue_depth"] = 16;
  j["nvme_request_kib"] = 512;
  const ResourceProfile p = profile_from_json(j, "q");
  EXPECT_DOUBLE_EQ(p.nvme_latency_s, 80e-6);
  EXPECT_EQ(p.nvme_queue_depth, 16);
  EXPECT_EQ(p.nvme_request_bytes, 512 * 1024);
  EXPECT_EQ(profile_to_json(p).dump(), j.dump());
  auto error_of = [&](const char* k, nlohmann::json v) {
    auto b = j;
    b[k] = v;
    try {
      profile_from_json(b, "q.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of("nvme_request_kib", 6).find("'nvme_request_kib' must be a multiple of 4 (O_DIRECT's 4 KiB), got 6"),
            std::string::npos);
  EXPECT_NE(error_of("nvme_queue_depth", 0).find("'nvme_queue_depth' must be a whole number in [1, 64], got 0"),
            std::string::npos);
  EXPECT_NE(error_of("nvme_latency_us", -5).find("'nvme_latency_us' must be a number > 0, got -5"), std::string::npos);
}

// A measured head timing: round trip, strict fields, and head_time scales it by the rows for the model it was
// measured for (another model's hidden size or vocabulary: the GEMM estimate).
TEST(Planner, HeadTimingMeasured) {
  ResourceProfile p = test_profile();
  ModelConfig c = preset_config("qwen2.5-0.5b");
  const double estimate = head_time(p, c, 4, 1024);
  p.head = {c.hidden, c.vocab, 8192, 0.050};
  auto j = profile_to_json(p);
  EXPECT_EQ(profile_to_json(profile_from_json(j, "rt")).dump(), j.dump());
  EXPECT_DOUBLE_EQ(head_time(profile_from_json(j, "rt"), c, 4, 1024), 0.025);
  c.vocab += 1;
  EXPECT_DOUBLE_EQ(head_time(p, c, 4, 1024), head_time(test_profile(), c, 4, 1024));
  c.vocab -= 1;
  EXPECT_NE(estimate, 0.025);
  j["head_timing"]["seconds"] = 0;
  try {
    profile_from_json(j, "x.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x.json: head_timing: 'seconds' must be a positive number"), std::string::npos)
        << e.what();
  }
  j = profile_to_json(p);
  j["head_timing"]["rows"] = 1;
  EXPECT_THROW(profile_from_json(j, "x"), Error);
  // The LM weight's gradient by vocabulary slices: 4/3 of the full pass, or its own measured time.
  EXPECT_DOUBLE_EQ(head_time(p, c, 4, 1024, true), 0.025 * 4 / 3);
  EXPECT_DOUBLE_EQ(head_time(test_profile(), c, 4, 1024, true), estimate * 4 / 3);
  p.head.sliced_seconds = 0.060;
  j = profile_to_json(p);
  EXPECT_EQ(profile_to_json(profile_from_json(j, "rt")).dump(), j.dump());
  EXPECT_DOUBLE_EQ(head_time(profile_from_json(j, "rt"), c, 4, 1024, true), 0.030);
  EXPECT_DOUBLE_EQ(head_time(profile_from_json(j, "rt"), c, 4, 1024), 0.025);
  j["head_timing"]["sliced_seconds"] = -1;
  EXPECT_THROW(profile_from_json(j, "x"), Error);
}

// Every heuristic gives a valid plan; the final plan is never worse than any candidate.
TEST(Planner, HeuristicsValidAndMilpNeverWorse) {
  auto r = request("qwen2.5-0.5b", 8, 24);
  auto o = make_plan(r);
  ASSERT_TRUE(o.feasible) << o.why;
  int feasible = 0;
  for (auto& c : o.candidates) {
    if (!c.feasible) continue;
    ++feasible;
    EXPECT_NO_THROW(validate_plan(c.plan)) << c.name;
    EXPECT_LE(o.sim.pred.step_s, c.sim.pred.step_s * (1 + 1e-9)) << c.name;
  }
  EXPECT_GE(feasible, 5);
  // Round trip of the chosen plan through JSON keeps it valid and identical.
  auto q = plan_from_json(plan_to_json(o.plan));
  EXPECT_EQ(plan_to_json(q).dump(), plan_to_json(o.plan).dump());
  for (auto h : heuristic_names()) {
    auto t = heuristic_tiers(h, 24);
    EXPECT_EQ(t.front(), Tier::Gpu);
    EXPECT_EQ(t.back(), Tier::Gpu);
  }
  EXPECT_THROW(heuristic_tiers("megatrain:x", 8), Error);
  EXPECT_THROW(heuristic_tiers("nonsense", 8), Error);
}

TEST(Planner, DoesNotFitMessages) {
  {
    auto r = request("qwen2.5-7b", 64, 2);  // 2 GiB GPU
    auto o = make_plan(r);
    ASSERT_FALSE(o.feasible);
    EXPECT_EQ(o.why.rfind("does not fit: gpu short by ", 0), 0u) << o.why;
    EXPECT_NE(o.why.find("needs "), std::string::npos);
    EXPECT_NE(o.why.find("has "), std::string::npos);
  }
  {
    auto r = request("qwen2.5-7b", 4, 80);
    r.profile.dram_bytes = 40 * GiB;
    r.optimizer = "adamw";
    auto o = make_plan(r);
    ASSERT_FALSE(o.feasible);
    EXPECT_EQ(o.why.rfind("does not fit: dram short by ", 0), 0u) << o.why;
  }
}

TEST(Planner, Hybrid8bitSwitchesLargestFirstUntilItFits) {
  auto c = preset_config("qwen2.5-7b");
  const double fp32 = model_state_bytes(c, {}, {}).dram();
  EXPECT_TRUE(choose_8bit(c, "hybrid", fp32 + 1).empty());
  auto some = choose_8bit(c, "hybrid", fp32 - 10.0 * GiB);
  ASSERT_FALSE(some.empty());
  EXPECT_LE(model_state_bytes(c, some, {}).dram(), fp32 - 10.0 * GiB);
  auto fewer = std::vector<std::string>(some.begin(), some.end() - 1);
  EXPECT_GT(model_state_bytes(c, fewer, {}).dram(), fp32 - 10.0 * GiB);  // minimal
  // The untied LM head (vocab x hidden) is the largest, then the FFN matrices.
  EXPECT_EQ(some.front(), "lm_head.weight");
  for (size_t k = 1; k < some.size(); ++k) EXPECT_NE(some[k].find("mlp"), std::string::npos) << some[k];
  auto all = choose_8bit(c, "adamw8bit", 0);
  EXPECT_EQ(all.size(), size_t(c.layers * 7 + 1));
  StatePlacement emb;
  emb.embedding_8bit = true;
  EXPECT_EQ(choose_8bit(c, "adamw8bit", 0, emb).size(), size_t(c.layers * 7 + 2));
  EXPECT_THROW(choose_8bit(c, "sgd", 0), Error);
}

// --batch max: feasible at the answer, infeasible one above, and feasibility is monotone below.
TEST(Planner, MaxBatchMonotonic) {
  auto r = request("qwen2.5-0.5b", 1, 6);
  const int64_t b = max_feasible_batch(r, "dp", 512);
  ASSERT_GT(b, 1);
  ASSERT_LT(b, 512);
  r.compare = false;
  r.planner = "dp";
  for (int64_t x : {int64_t(1), b / 2, b - 1, b}) {
    r.batch = x;
    EXPECT_TRUE(make_plan(r).feasible) << x;
  }
  r.batch = b + 1;
  EXPECT_FALSE(make_plan(r).feasible);
  const int64_t m = max_feasible_batch(request("qwen2.5-0.5b", 1, 6), "megatrain:4", 512);
  EXPECT_LE(m, b);  // the DP's space contains megatrain:4
}

// --seq max: a multiple of the granule, feasible there, infeasible one granule above; megatrain:4's space is
// inside the DP's; the search stops at hi.
TEST(Planner, MaxSeqIsTheLongestFeasible) {
  auto r = request("qwen2.5-0.5b", 1, 6);
  const int64_t s = max_feasible_seq(r, "dp", 1024, int64_t(1) << 22);
  ASSERT_GT(s, 1024);
  ASSERT_LT(s, int64_t(1) << 22);
  EXPECT_EQ(s % 1024, 0);
  r.compare = false;
  r.planner = "dp";
  r.keep_internals = false;
  for (int64_t x : {int64_t(1024), s / 2048 * 1024, s}) {
    r.seq = x;
    EXPECT_TRUE(make_plan(r).feasible) << x;
  }
  r.seq = s + 1024;
  r.explain = false;
  const PlanOutcome next = make_plan(r);
  EXPECT_FALSE(next.feasible);
  EXPECT_NE(next.why.find("does not fit"), std::string::npos) << next.why;
  EXPECT_LE(max_feasible_seq(request("qwen2.5-0.5b", 1, 6), "megatrain:4", 1024, int64_t(1) << 22), s);
  // Batch 2 holds twice the boundaries (a layer pass may still take one sample): never longer.
  const int64_t s2 = max_feasible_seq(request("qwen2.5-0.5b", 2, 6), "dp", 1024, int64_t(1) << 22);
  EXPECT_GT(s2, 0);
  EXPECT_LE(s2, s);
  // Everything up to hi fits: hi (rounded down to the granule) is the answer.
  EXPECT_EQ(max_feasible_seq(request("qwen2.5-0.5b", 1, 80), "dp", 512, 2500), 2048);
  EXPECT_THROW(max_feasible_seq(r, "dp", 0, 4096), Error);
  EXPECT_THROW(max_feasible_seq(r, "dp", 4096, 1024), Error);
}

// The report's attention-inclusive line: 6*N*tokens plus causal attention over each row, against the step.
TEST(Planner, ReportHasTheAttentionInclusiveTflops) {
  auto r = request("qwen2.5-0.5b", 4, 24);
  r.compare = false;
  r.planner = "dp";
  const PlanOutcome o = make_plan(r);
  ASSERT_TRUE(o.feasible) << o.why;
  EXPECT_DOUBLE_EQ(o.flops_attn_per_step, model_flops_with_attention(r.model, full_rows(4, 1024)));
  EXPECT_GT(o.flops_attn_per_step, o.flops_per_step);
  const std::string line = attention_line(r, o);
  EXPECT_NE(line.find(fmt::format("with attention: {:.1f} TFLOPS", o.flops_attn_per_step / o.sim.pred.step_s / 1e12)),
            std::string::npos)
      << line;
  EXPECT_NE(plan_report(r, o).find(line), std::string::npos);
}

// The Qwen3.6-27B shape at batch 72 x 1024 under an 80 GB card's 76 GiB and a host budget, 8-bit moments, bf16-sr
// masters allowed, the DP alone.
PlanRequest qwen36_27b_on_80gb(int64_t dram_gib) {
  PlanRequest r;
  r.model = preset_config("qwen3.6-27b");
  r.batch = 72;
  r.seq = 1024;
  r.profile = load_profile_file(lt::testing::repo_root().string() + "/configs/profiles/h800-80g.json");
  r.profile.hbm_bytes = int64_t(76) << 30;
  r.profile.dram_bytes = dram_gib << 30;
  r.optimizer = "adamw8bit";
  r.allow_bf16_master = true;
  r.planner = "dp";
  r.compare = false;
  return r;
}

// gradient_ring_depth auto (PlanRequest::grad_ring_depth 0): with gradients held on the device and DRAM short (the
// 27B shape under an 80 GB card's 76 GiB and a 116 GiB host), a shallower staging ring whose DRAM the checkpoints
// use plans a faster step than the default 8; a fixed depth is kept; with DRAM to spare the gradients go to the host
// and the depth stays the default.
TEST(Planner, GradientRingDepthAutoTradesTheRingsDram) {
  PlanRequest r = qwen36_27b_on_80gb(116);
  const PlanOutcome fixed = make_plan(r);
  ASSERT_TRUE(fixed.feasible) << fixed.why;
  EXPECT_EQ(fixed.placement.grads, GradHome::Device);
  EXPECT_EQ(fixed.placement.grad_ring_depth, kGradRingDepth);
  r.grad_ring_depth = 0;
  const PlanOutcome chosen = make_plan(r);
  ASSERT_TRUE(chosen.feasible) << chosen.why;
  EXPECT_LT(chosen.placement.grad_ring_depth, kGradRingDepth);
  EXPECT_LT(chosen.sim.pred.step_s, fixed.sim.pred.step_s);
  EXPECT_LT(chosen.state.staging, fixed.state.staging);
  EXPECT_EQ(chosen.plan.placement.grad_ring_depth, chosen.placement.grad_ring_depth);  // into plan.json
  r.profile.dram_bytes = int64_t(400) << 30;
  const PlanOutcome roomy = make_plan(r);
  ASSERT_TRUE(roomy.feasible) << roomy.why;
  EXPECT_EQ(roomy.placement.grads, GradHome::Host);
  EXPECT_EQ(roomy.placement.grad_ring_depth, kGradRingDepth);
}

// The Qwen3.6-27B shape on an 80 GB card: the head's gradient by vocabulary slices (the planner's choice unless the
// request fixes it) gives the [vocab, hidden] fp32 buffers' 4.4 GiB to the activations: multi-sample chunks where the
// full buffers fit no plan (the advice then names head_gradient: auto); plan.json carries it; a tied head never takes
// it.
TEST(Planner, HeadGradientBySlicesGivesTheTableSizedBuffersToTheChunks) {
  PlanRequest r = qwen36_27b_on_80gb(108);
  r.explain = false;
  r.head_grad_slices = false;
  r.explain = true;
  const PlanOutcome full = make_plan(r);
  ASSERT_FALSE(full.feasible);  // on this preset's layer times no plan fits without the slices; the advice names them
  EXPECT_NE(full.why.find("it fits with head_gradient: auto"), std::string::npos) << full.why;
  r.explain = false;
  r.head_grad_slices.reset();
  const PlanOutcome chosen = make_plan(r);
  ASSERT_TRUE(chosen.feasible) << chosen.why;
  EXPECT_TRUE(chosen.placement.head_grad_slices);
  EXPECT_TRUE(chosen.plan.placement.head_grad_slices);
  EXPECT_GT(chosen.plan.chunk, 1);
  EXPECT_NEAR(full.state.hbm() - chosen.state.hbm(), 4.0 * 5120 * double(248320 - head_grad_slice_rows(r.model)), 1.0);
  r.head_grad_slices = true;
  const PlanOutcome forced = make_plan(r);
  ASSERT_TRUE(forced.feasible) << forced.why;
  EXPECT_EQ(forced.plan.chunk, chosen.plan.chunk);
  // Under 72 GiB with NVMe moments allowed: the full ladder reaches the NVMe-moment rung, the sliced one fits a rung
  // before it; the faster of the two is kept, whichever it is.
  r.profile.hbm_bytes = int64_t(72) << 30;
  r.allow_nvme_moments = true;
  r.head_grad_slices = false;
  const PlanOutcome nvme_full = make_plan(r);
  r.head_grad_slices = true;
  const PlanOutcome nvme_sliced = make_plan(r);
  r.head_grad_slices.reset();
  const PlanOutcome nvme_auto = make_plan(r);
  ASSERT_TRUE(nvme_full.feasible && nvme_sliced.feasible && nvme_auto.feasible);
  EXPECT_GT(nvme_full.placement.nvme_layers, 0);
  EXPECT_DOUBLE_EQ(nvme_auto.sim.pred.step_s, std::min(nvme_full.sim.pred.step_s, nvme_sliced.sim.pred.step_s));
  r.model = preset_config("qwen2.5-3b");  // tied
  r.head_grad_slices.reset();
  r.batch = 8;
  const PlanOutcome tied = make_plan(r);
  ASSERT_TRUE(tied.feasible) << tied.why;
  EXPECT_FALSE(tied.placement.head_grad_slices);
}

}  // namespace
}  // namespace lt
