// The NVMe tier and host bf16 gradients in the model-state placement (docs/memory.md, docs/planner.md "Model-state
// placement"): the I/O pipeline of the moments on NVMe in the optimizer lane, host bf16 gradients' bytes and D2H,
// the ladder's fastest rung per level, the advice naming the NVMe tier, and the two desktop targets (Qwen3.6-27B and
// Qwen3.5-9B on the rtx3090-24g profile) with their byte tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/units.h"
#include "model/accounting.h"
#include "model/param_layout.h"
#include "plan/fit_advice.h"
#include "plan/placement.h"
#include "plan/report.h"
#include "plan/planner.h"
#include "plan/state_bytes.h"
#include "plan/state_report.h"
#include "plan_test_util.h"

namespace lt {
namespace {

// tiny-qwen3 (test_state.cpp): per layer 49344 parameters, embedding 16384, head 16448.
constexpr double kLayer = 49344, kEmb = 16384, kHead = 16448;
constexpr double kN = kEmb + 2 * kLayer + kHead;

// By hand on the 2-layer instance: units 0, 1 (layers), 2 (head), 3 (embedding, updated first); both layers' moments
// on NVMe, read 2 s and written 3 s each; updates of 1 s.
TEST(PlanNvmeState, MomentPipelineByHand) {
  Instance in = test::two_layer_instance();
  in.opt = {1, 1, 1, 0};
  in.nvme_read = {2, 2, 0, 0};
  in.nvme_write = {3, 3, 0, 0};
  EXPECT_DOUBLE_EQ(in.nvme_io_s(), 10);
  // One slot: layer 0 was read ahead; its update 0-1, write-back 1-4 (O = 4), then layer 1's read 4-6, update 6-7,
  // write-back 7-10; the head (DRAM) updates 7-8 after layer 1. The next step's read-ahead (2 s) follows the queue.
  in.nvme_slots = 1;
  EXPECT_EQ(in.opt_done(), (std::vector<double>{4, 10, 8, 0}));
  EXPECT_DOUBLE_EQ(in.opt_last(), 12);
  // Three slots: both read ahead; updates 0-1 and 1-2, the head 2-3; write-backs 1-4 and 4-7; read-ahead 4 s.
  in.nvme_slots = 3;
  EXPECT_EQ(in.opt_done(), (std::vector<double>{4, 7, 3, 0}));
  EXPECT_DOUBLE_EQ(in.opt_last(), 11);
  // No I/O: the plain recurrence.
  in.nvme_read.clear();
  in.nvme_write.clear();
  EXPECT_EQ(in.opt_done(), (std::vector<double>{1, 2, 3, 0}));
  // The simulator's step ends no earlier than the queue: the next forward waits for layer 0's write-back.
  in.nvme_read = {2, 2, 0, 0};
  in.nvme_write = {3, 3, 0, 0};
  in.nvme_slots = 1;
  const auto r = simulate(in, test::plan_for(in, {Tier::Gpu, Tier::Gpu, Tier::Gpu}));
  EXPECT_GE(r.pred.step_s, 12);
  EXPECT_GT(r.pred.exposed_optimizer_s, 0);
}

// A 3-layer instance for the disk-sharing tests: units 0-2 (layers, on NVMe, updates of 1 s), 3 (head), 4 (embedding,
// updated first); every moment image read ahead (3 slots).
Instance three_layer_moments(std::vector<double> read, std::vector<double> write) {
  Instance in;
  in.L = 3;
  in.opt = {1, 1, 1, 0, 0};
  in.nvme_read = std::move(read);
  in.nvme_write = std::move(write);
  in.nvme_slots = 3;
  return in;
}

// By hand: the moments' reads and write-backs use only the lane time the checkpoints' transfers leave.
TEST(PlanNvmeState, MomentQueueSharesTheLanesByHand) {
  const Instance in = three_layer_moments({1, 1, 1, 0, 0}, {2, 2, 2, 0, 0});
  // Alone: updates 0-1, 1-2, 2-3 (head 3); write-backs 1-3, 3-5, 5-7; the read-ahead 7-10.
  EXPECT_EQ(in.opt_done(), (std::vector<double>{3, 5, 7, 3, 0}));
  EXPECT_DOUBLE_EQ(in.opt_last(), 10);
  // Slots of 2 s, the first 1 s after layer 0's write-back; F0 and F1 write checkpoints for 1.5 s, F2 reads for 1 s.
  CheckpointNvmeIo ck;
  ck.lead = 1;
  ck.slot_s.assign(7, 2.0);
  ck.write_s = {1.5, 1.5, 0, 0, 0, 0, 0};
  ck.read_s = {0, 0, 1, 0, 0, 0, 0};
  // F0 starts at 5 (layer 1's write-back) and writes 5-6.5: layer 2's write-back waits, 6.5-8.5. F1 starts at 8.5
  // (slot F0 ended at 7), F2 at 10.5 and reads 10.5-11.5: the read-ahead runs 8.5-10.5 and 11.5-12.5.
  EXPECT_EQ(in.opt_done(&ck), (std::vector<double>{3, 5, 8.5, 3, 0}));
  EXPECT_DOUBLE_EQ(in.opt_last(&ck), 12.5);
  CheckpointNvmeIo short_ck = ck;
  short_ck.slot_s.pop_back();
  EXPECT_THROW(in.opt_done(&short_ck), Error);
  // No checkpoint on the NVMe lanes: the queue alone.
  ck.write_s.assign(7, 0.0);
  ck.read_s.assign(7, 0.0);
  EXPECT_FALSE(ck.any());
  EXPECT_EQ(in.opt_done(&ck), in.opt_done());
  EXPECT_DOUBLE_EQ(in.opt_last(&ck), 10);
}

// By hand through the simulator: boundary 1 on NVMe is written in F2 and read in H (2 s each at 5 B/s); the
// read-ahead of the next step's moments shares the read lane with the H slot's read, and the step waits for it.
TEST(PlanNvmeState, SimulatedStepCountsTheSharedDisk) {
  Instance in = three_layer_moments({3, 3, 3, 0, 0}, {1, 1, 1, 0, 0});
  in.rho = {1, 1, 1};
  in.beta = {1, 1, 1};
  in.head_s = 1;
  in.A = 10;
  in.P = {0, 0, 0};
  in.G = {0, 0, 0};
  in.bh = in.bd = in.bb = 10;  // a boundary's transfer takes 1 s, hidden under 1 s of compute
  in.bnr = in.bnw = 5;
  in.ws_fwd = {1, 1, 1};
  in.ws_bwd = {1, 1, 1};
  in.hbm_cap = in.dram_cap = in.nvme_cap = 1000;
  const auto r = simulate(in, test::plan_for(in, {Tier::Gpu, Tier::Nvme, Tier::Gpu, Tier::Gpu}));
  ASSERT_DOUBLE_EQ(r.slots[2].w, 10);  // F2
  ASSERT_DOUBLE_EQ(r.slots[3].r, 10);  // H
  // Write-backs 1-2, 2-3, 3-4; prologue at 2; F0 3-4, F1 4-5, F2 5-7, H 7-9 (reads 7-9), B2 9-10, B1, B0: 12.
  EXPECT_DOUBLE_EQ(r.slot_start[3], 7);
  // The read-ahead alone would run 4-7, 7-10, 10-13 (a 13 s step); beside H's read: 4-7, 9-12, 12-15.
  EXPECT_DOUBLE_EQ(in.opt_last(), 13);
  EXPECT_DOUBLE_EQ(r.pred.step_s, 15);
  // Waits: 2 s for layer 0's write-back, 1 s before F0 (layer 1's), 3 s for the read-ahead at the end.
  EXPECT_DOUBLE_EQ(r.pred.exposed_optimizer_s, 2 + 1 + 3);
}

// make_instance: the last k layers' moment images (4 KiB-rounded) at the profile's NVMe rates; the CPU times stay.
TEST(PlanNvmeState, MomentTimesFromTheProfile) {
  const auto c = preset_config("tiny-qwen3");
  auto prof = load_profile_file(lt::testing::repo_root().string() + "/configs/profiles/h200.json");
  prof.nvme_read_bw = 2e6;
  prof.nvme_write_bw = 1e6;
  InstanceOptions o;
  o.optimizer_8bit = choose_8bit(c, "adamw8bit", 0);
  const Instance dram = make_instance(c, 1, 64, prof, o);
  EXPECT_TRUE(dram.nvme_read.empty());
  o.placement.nvme_layers = 1;
  const Instance nv = make_instance(c, 1, 64, prof, o);
  ASSERT_EQ(nv.nvme_read.size(), nv.opt.size());
  const double image = std::ceil(layer_moment_bytes(c, 1, o.optimizer_8bit) / 4096) * 4096;
  EXPECT_DOUBLE_EQ(nv.nvme_read[1], image / 2e6);
  EXPECT_DOUBLE_EQ(nv.nvme_write[1], image / 1e6);
  EXPECT_DOUBLE_EQ(nv.nvme_read[0], 0);
  EXPECT_EQ(nv.opt, dram.opt);
  prof.nvme_read_bw = 0;
  EXPECT_THROW(make_instance(c, 1, 64, prof, o), Error);
}

// Host bf16 gradients: 2 B per parameter in DRAM, no staging slabs, and in HBM the fp32 scratch plus the two bf16
// buffers of the largest layer the gradients are rounded into on their way down.
TEST(PlanNvmeState, HostBf16BytesByHand) {
  const auto c = preset_config("tiny-qwen3");
  StatePlacement p{MasterMode::Fp32, GradHome::Host, GradDType::Bf16};
  ASSERT_TRUE(p.host_bf16_grads());
  const auto b = model_state_bytes(c, {}, p);
  EXPECT_DOUBLE_EQ(b.grads_host, 2 * kN);
  EXPECT_DOUBLE_EQ(b.grads_device, 0);
  EXPECT_DOUBLE_EQ(b.staging, 0);
  EXPECT_DOUBLE_EQ(b.grad_scratch, 4 * (2 * kLayer + kHead) + 2 * 2 * kLayer);
  EXPECT_DOUBLE_EQ(b.dram(), 4 * kN + 2 * kN + 8 * kN);
  const std::string t = state_table(b, int64_t(kN));
  EXPECT_NE(t.find("gradients host (bf16)"), std::string::npos) << t;
  EXPECT_NE(t.find("gradients (bf16)"), std::string::npos) << t;
  EXPECT_EQ(t.find("gradient slabs"), std::string::npos) << t;
  // The D2H of the backward slots moves bf16.
  const auto prof = load_profile_file(lt::testing::repo_root().string() + "/configs/profiles/h200.json");
  InstanceOptions o;
  const Instance f32 = make_instance(c, 1, 64, prof, o);
  o.placement = p;
  const Instance b16 = make_instance(c, 1, 64, prof, o);
  for (size_t j = 0; j < f32.G.size(); ++j) EXPECT_DOUBLE_EQ(b16.G[j], f32.G[j] / 2);
  EXPECT_DOUBLE_EQ(b16.G_head, f32.G_head / 2);
  EXPECT_DOUBLE_EQ(b16.epi_d2h, f32.epi_d2h);  // boundary 0's gradient is an activation
}

// Where the executor cannot run host bf16 gradients the planner does not offer them, and refuses them when forced,
// naming why; updates on the GPU read fp32 gradients, so they are not offered with them either.
TEST(PlanNvmeState, HostBf16OnlyWhereTheExecutorRunsIt) {
  auto r = test::tiny_state_request(1e9);
  r.micro_batches = 2;
  for (const auto& s : placement_ladder(r)) EXPECT_FALSE(s.placement.host_bf16_grads());
  r.grads = GradHome::Host;
  r.grad_dtype = GradDType::Bf16;
  try {
    placement_ladder(r);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 micro-batches per step"), std::string::npos) << e.what();
  }
  r.micro_batches = 1;
  const StateChoice s{{MasterMode::Fp32, GradHome::Host, GradDType::Bf16}, {}};
  EXPECT_NE(layer_update_blocker(r, s).find("bf16"), std::string::npos);
  r.model = preset_config("tiny-qwen2");  // tied
  EXPECT_NE(device_update_blocker(r, s).find("bf16"), std::string::npos);
  // From the bf16 level on, both gradient homes, device first.
  r = test::tiny_state_request(1e9);
  r.optimizer = "adamw8bit";
  int host = 0, device = 0;
  for (const auto& st : placement_ladder(r)) {
    if (st.placement.grad_dtype != GradDType::Bf16) continue;
    (st.placement.grads == GradHome::Host ? host : device) += 1;
  }
  EXPECT_EQ(host, 2);  // bf16 gradients, + 8-bit embedding
  EXPECT_EQ(device, 2);
}

// The NVMe level: counts from the fewest that fit the DRAM up, for each gradient home; each rung's state fits.
TEST(PlanNvmeState, NvmeLevelOffersCountsPerHome) {
  auto r = test::tiny_state_request(0);
  r.model.layers = 8;
  r.optimizer = "adamw8bit";
  r.allow_bf16_master = true;
  r.allow_nvme_moments = true;
  r.profile.nvme_bytes = int64_t(1) << 30;
  r.profile.nvme_read_bw = r.profile.nvme_write_bw = 2e9;
  const StatePlacement dev{MasterMode::Bf16Sr, GradHome::Device, GradDType::Bf16, true, 0};
  const auto all8 = choose_8bit(r.model, "adamw8bit", 0, dev);
  r.profile.dram_bytes = int64_t(model_state_bytes(r.model, all8, dev).dram() - 0.5 * layer_moment_bytes(r.model, 0, all8));
  const auto ladder = placement_ladder(r);
  const int last = ladder.back().level;
  int rungs = 0;
  for (const auto& s : ladder) {
    if (s.level != last) continue;
    ++rungs;
    EXPECT_GE(s.placement.nvme_layers, 1);
    EXPECT_LE(model_state_bytes(r.model, s.q8, s.placement).dram(), double(r.profile.dram_bytes));
  }
  EXPECT_GE(rungs, 2);
  const auto o = make_plan(r);
  ASSERT_TRUE(o.feasible) << o.why;
  EXPECT_GE(o.placement.nvme_layers, 1);
  EXPECT_GT(o.nvme_moments_io_s, 0);
  EXPECT_GE(o.nvme_moments_cost_s, 0);
  EXPECT_LE(o.nvme_moments_cost_s, o.sim.pred.step_s);
}

// optimizer_nvme all: every rung of the ladder holds every layer's moments on NVMe, so the plan's table, NVMe bytes
// and simulated disk time are those of what the trainer runs (they showed every moment in DRAM and no NVMe before).
TEST(PlanNvmeState, AllLayersOnNvmeInEveryRung) {
  auto r = test::tiny_state_request(double(GiB));
  r.model.layers = 6;
  r.optimizer = "adamw8bit";
  r.nvme_all_layers = true;
  r.profile.nvme_bytes = int64_t(1) << 30;
  r.profile.nvme_read_bw = r.profile.nvme_write_bw = 2e9;
  for (const auto& s : placement_ladder(r)) EXPECT_EQ(s.placement.nvme_layers, 6);
  const auto o = make_plan(r);
  ASSERT_TRUE(o.feasible) << o.why;
  EXPECT_EQ(o.placement.nvme_layers, 6);
  double nvme = 0;
  for (int64_t j = 0; j < 6; ++j) nvme += layer_moment_bytes(r.model, j, o.plan.optimizer_8bit);
  EXPECT_DOUBLE_EQ(o.state.moments_nvme, nvme);
  EXPECT_GT(o.nvme_moments_io_s, 0);
  // 'all' and 'auto' together are a contradiction, not a silent choice.
  r.allow_nvme_moments = true;
  EXPECT_THROW(placement_ladder(r), std::exception);
}

// The NVMe layers' master remainders in their files (StatePlacement::nvme_remainders) by hand: 2 B/param of those
// layers out of the DRAM master into the NVMe files, the staging slots (3 of the largest image) grow by as much per
// slot, each image's read and write-back too; nothing with bf16-sr masters (no remainders) or fp32 master arrays.
TEST(PlanNvmeState, NvmeRemaindersBytesByHand) {
  auto c = preset_config("tiny-qwen3");
  c.layers = 8;
  const auto q8 = choose_8bit(c, "adamw8bit", 0);
  StatePlacement p{MasterMode::Fp32, GradHome::Host, GradDType::F32};
  p.nvme_layers = 6;
  const StateBytes m = model_state_bytes(c, q8, p);
  p.nvme_remainders = true;
  ASSERT_TRUE(remainders_on_nvme(p));
  const StateBytes r = model_state_bytes(c, q8, p);
  const double lm = layer_moment_bytes(c, 7, q8);
  EXPECT_DOUBLE_EQ(r.master, m.master - 2 * 6 * kLayer);
  EXPECT_DOUBLE_EQ(r.master, 4 * (kEmb + kHead + 2 * kLayer) + 2 * 6 * kLayer);
  EXPECT_DOUBLE_EQ(r.remainders_nvme, 2 * 6 * kLayer);
  EXPECT_DOUBLE_EQ(r.moments_nvme, m.moments_nvme);
  EXPECT_DOUBLE_EQ(r.nvme(), m.nvme() + 2 * 6 * kLayer);
  EXPECT_DOUBLE_EQ(m.moment_staging, 3 * lm);
  EXPECT_DOUBLE_EQ(r.moment_staging, 3 * (lm + 2 * kLayer));
  EXPECT_DOUBLE_EQ(r.dram(), m.dram() - 2 * 6 * kLayer + 3 * 2 * kLayer);
  EXPECT_DOUBLE_EQ(layer_nvme_image_bytes(c, 7, q8, p), lm + 2 * kLayer);
  const std::string t = state_table(r, r.params);
  EXPECT_NE(t.find("master remainders, last 6 layers     nvme"), std::string::npos) << t;
  // No remainders to move: bf16-sr masters, fp32 master arrays, no NVMe layers.
  StatePlacement sr = p, arr = p, none = p;
  sr.master = MasterMode::Bf16Sr;
  arr.fp32_master_array = true;
  none.nvme_layers = 0;
  for (const StatePlacement& q : {sr, arr, none}) {
    EXPECT_FALSE(remainders_on_nvme(q));
    StatePlacement without = q;
    without.nvme_remainders = false;
    EXPECT_DOUBLE_EQ(model_state_bytes(c, q8, q).dram(), model_state_bytes(c, q8, without).dram());
    EXPECT_DOUBLE_EQ(model_state_bytes(c, q8, q).nvme(), model_state_bytes(c, q8, without).nvme());
  }
  // The instance: each such layer's image read and written with its remainders.
  auto prof = load_profile_file(lt::testing::repo_root().string() + "/configs/profiles/h200.json");
  prof.nvme_read_bw = 2e6;
  prof.nvme_write_bw = 1e6;
  InstanceOptions o;
  o.optimizer_8bit = q8;
  o.placement = p;
  const Instance in = make_instance(c, 1, 64, prof, o);
  const double image = std::ceil((lm + 2 * kLayer) / 4096) * 4096;
  EXPECT_DOUBLE_EQ(in.nvme_read[7], image / 2e6);
  EXPECT_DOUBLE_EQ(in.nvme_write[7], image / 1e6);
  EXPECT_DOUBLE_EQ(in.nvme_read[1], 0);
}

// The ladder offers the remainders on NVMe as its last level, only where the master is split fp32 (forced fp32 or
// bf16-sr not allowed) and the moments may go to NVMe; a DRAM budget only it meets makes the plan take it, and
// plan.json, the report and the memory table carry it.
TEST(PlanNvmeState, NvmeRemaindersOnlyAsTheLastRungWhereTheyRun) {
  auto r = test::tiny_state_request(0);
  r.model.layers = 8;
  r.optimizer = "adamw8bit";
  r.master = MasterMode::Fp32;
  r.allow_nvme_moments = true;
  r.profile.nvme_bytes = int64_t(1) << 30;
  r.profile.nvme_read_bw = r.profile.nvme_write_bw = 2e9;
  // Every layer's moments and remainders on NVMe, gradients held in bf16: that fits, the same without remainders not.
  StatePlacement need{MasterMode::Fp32, GradHome::Device, GradDType::Bf16, true, 8};
  need.nvme_remainders = true;
  const auto all8 = choose_8bit(r.model, "adamw8bit", 0, need);
  const double fits = model_state_bytes(r.model, all8, need).dram();
  need.nvme_remainders = false;
  ASSERT_LT(fits + 0.25 * kLayer, model_state_bytes(r.model, all8, need).dram());
  r.profile.dram_bytes = int64_t(fits + 0.25 * kLayer);
  const auto ladder = placement_ladder(r);
  const int last = ladder.back().level;
  int rungs = 0;
  for (const auto& s : ladder) {
    EXPECT_EQ(s.placement.nvme_remainders, s.level == last) << describe_choice(s);
    if (s.level != last) continue;
    ++rungs;
    EXPECT_GE(s.placement.nvme_layers, 1);
    EXPECT_NE(describe_choice(s).find("moments and master remainders of"), std::string::npos) << describe_choice(s);
  }
  EXPECT_GE(rungs, 1);
  const auto o = make_plan(r);
  ASSERT_TRUE(o.feasible) << o.why;
  EXPECT_TRUE(o.placement.nvme_remainders);
  EXPECT_EQ(o.placement.nvme_layers, 8);
  EXPECT_DOUBLE_EQ(o.state.remainders_nvme, 2 * 8 * kLayer);
  const auto j = plan_to_json(o.plan);
  EXPECT_TRUE(j.at("nvme_remainders").get<bool>());
  EXPECT_TRUE(plan_from_json(j).placement.nvme_remainders);
  const std::string rep = plan_report(r, o);
  EXPECT_NE(rep.find("nvme moments: last 8 layers with their master remainders"), std::string::npos) << rep;
  EXPECT_NE(rep.find("master remainders, last 8 layers"), std::string::npos) << rep;
  // Absent from older plans and where not chosen.
  auto j2 = j;
  j2.erase("nvme_remainders");
  EXPECT_FALSE(plan_from_json(j2).placement.nvme_remainders);
  // Not offered: bf16-sr masters allowed (that rung comes first, and has no remainders), or no NVMe moments.
  auto sr = r;
  sr.master.reset();
  sr.allow_bf16_master = true;
  for (const auto& s : placement_ladder(sr)) EXPECT_FALSE(s.placement.nvme_remainders) << describe_choice(s);
  auto dram_only = r;
  dram_only.allow_nvme_moments = false;
  dram_only.profile.dram_bytes = int64_t(1e9);
  for (const auto& s : placement_ladder(dram_only)) EXPECT_FALSE(s.placement.nvme_remainders) << describe_choice(s);
}

// The desktop targets (the commands, in the DP's space).
PlanRequest desktop(const std::string& model, int64_t batch, double dram_gib) {
  PlanRequest r;
  r.model = preset_config(model);
  r.batch = batch;
  r.seq = 1024;
  r.profile = resolve_profile("rtx3090-24g");
  if (dram_gib > 0) r.profile.dram_bytes = int64_t(dram_gib * double(GiB));
  r.optimizer = "adamw8bit";
  r.allow_bf16_master = true;
  r.allow_nvme_moments = true;
  r.planner = "dp";
  r.compare = false;
  return r;
}

// The state's bytes from the layout: bf16-sr master and host bf16 gradients at 2 B each, every matrix 8-bit, the last
// k layers' moments on NVMe through 3 DRAM slots, the HBM's fp32 scratch and bf16 pieces and the head.
void expect_host_bf16_nvme_state(const ModelConfig& c, const PlanOutcome& o) {
  const auto& b = o.state;
  const auto lay = model_layout(c);
  const double n = double(b.params), head = double(unit_param_count(lay.head()));
  double layer = 0;  // the largest layer's parameters
  for (int64_t j = 0; j < c.layers; ++j) layer = std::max(layer, double(unit_param_count(lay.layer(j))));
  EXPECT_EQ(o.placement.master, MasterMode::Bf16Sr);
  EXPECT_TRUE(o.placement.host_bf16_grads());
  EXPECT_TRUE(o.placement.embedding_8bit);
  EXPECT_DOUBLE_EQ(b.master, 2 * n);
  EXPECT_DOUBLE_EQ(b.grads_host, 2 * n);
  EXPECT_DOUBLE_EQ(b.staging, 0);
  double all = 0, nvme = 0, largest = 0;
  const std::set<std::string> q8(o.plan.optimizer_8bit.begin(), o.plan.optimizer_8bit.end());
  for (const auto& u : lay.units)
    for (const auto& p : u.params) all += moment_bytes(p.numel, q8.count(p.name) > 0);
  for (int64_t j = c.layers - o.placement.nvme_layers; j < c.layers; ++j) {
    nvme += layer_moment_bytes(c, j, o.plan.optimizer_8bit);
    largest = std::max(largest, layer_moment_bytes(c, j, o.plan.optimizer_8bit));
  }
  EXPECT_DOUBLE_EQ(b.moments_nvme, nvme);
  EXPECT_NEAR(b.moments, all - nvme, 1e-6 * all);
  EXPECT_DOUBLE_EQ(b.moment_staging, 3 * largest);
  EXPECT_DOUBLE_EQ(b.grad_scratch, 4 * (2 * layer + head) + 2 * 2 * layer);
  EXPECT_DOUBLE_EQ(b.head_weights, 2 * head);
  EXPECT_LE(b.dram(), double(o.plan.dram_cap));
}

// Qwen3.6-27B at 8 x 1024 on a 24 GB card with 112 GiB of DRAM and an SSD: bf16-sr master and host bf16 gradients
// (50.10 GiB each) with the moments of 58 layers on NVMe.
TEST(PlanNvmeState, Qwen36_27bOnADesktop) {
  auto r = desktop("qwen3.6-27b", 8, 0);
  const auto o = make_plan(r);
  ASSERT_TRUE(o.feasible) << o.why;
  EXPECT_EQ(o.placement.nvme_layers, 58);
  expect_host_bf16_nvme_state(r.model, o);
  EXPECT_EQ(state_table(o.state, o.state.params),
            "memory (master bf16-sr, gradients host (bf16); 26.90B params):\n"
            "  part                                 home         bytes  B/param\n"
            "  master + copy (bf16-sr)              dram     50.10 GiB     2.00\n"
            "  gradient scratch (fp32, bf16)        gpu       9.02 GiB     0.36\n"
            "  head weights (bf16)                  gpu       2.37 GiB     0.09\n"
            "  gradients (bf16)                     dram     50.10 GiB     2.00\n"
            "  moments (498 8-bit tensors)          dram      9.14 GiB     0.36\n"
            "  moments of the last 58 layers        nvme     41.75 GiB     1.67\n"
            "  moment staging slots                 dram      2.18 GiB     0.09\n"
            "  total: gpu 11.39 GiB, dram 111.51 GiB, nvme 41.75 GiB\n");
  EXPECT_GT(o.nvme_moments_io_s, 20);  // 58 x (0.22 s read + 0.26 s write)
  // Without the NVMe tier nothing fits; the advice names it with the step it predicts.
  r.allow_nvme_moments = false;
  const auto a = fit_advice(r);
  EXPECT_EQ(a.change, "optimizer_nvme: auto");
  EXPECT_NEAR(a.step_s, o.sim.pred.step_s, 1e-9 * o.sim.pred.step_s);
  EXPECT_EQ(a.nvme_layers, 58);
  EXPECT_NE(a.text().find(fmt::format("(predicted step {:.2f} s, of which the moments of 58 layers on NVMe add {:.2f} s)",
                                      o.sim.pred.step_s, o.nvme_moments_cost_s)),
            std::string::npos)
      << a.text();
}

// Qwen3.5-9B at 16 x 1024 with 48 GiB of DRAM: the same modes with 9 layers' moments on NVMe.
TEST(PlanNvmeState, Qwen35_9bWith48GiB) {
  auto r = desktop("qwen3.5-9b", 16, 48);
  const auto o = make_plan(r);
  ASSERT_TRUE(o.feasible) << o.why;
  EXPECT_EQ(o.placement.nvme_layers, 9);
  expect_host_bf16_nvme_state(r.model, o);
  EXPECT_EQ(state_table(o.state, o.state.params),
            "memory (master bf16-sr, gradients host (bf16); 8.95B params):\n"
            "  part                                 home         bytes  B/param\n"
            "  master + copy (bf16-sr)              dram     16.68 GiB     2.00\n"
            "  gradient scratch (fp32, bf16)        gpu       6.23 GiB     0.75\n"
            "  head weights (bf16)                  gpu       1.89 GiB     0.23\n"
            "  gradients (bf16)                     dram     16.68 GiB     2.00\n"
            "  moments (250 8-bit tensors)          dram     13.27 GiB     1.59\n"
            "  moments of the last 9 layers         nvme      3.67 GiB     0.44\n"
            "  moment staging slots                 dram      1.24 GiB     0.15\n"
            "  total: gpu 8.12 GiB, dram 47.87 GiB, nvme 3.67 GiB\n");
  // The report's line for the NVMe tier.
  const std::string report = plan_report(r, o);
  EXPECT_NE(report.find(fmt::format("  nvme moments: last 9 layers, 3.67 GiB of files, {:.2f} s of disk I/O per step",
                                    o.nvme_moments_io_s)),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("gradients host (bf16)"), std::string::npos) << report;
  // The peaks line counts the moment files against the profile's NVMe space, as the byte table does.
  EXPECT_NE(report.find(fmt::format(", nvme {} of {}\n", format_bytes(o.sim.pred.nvme_bytes + o.state.nvme()),
                                    format_bytes(double(r.profile.nvme_bytes)))),
            std::string::npos)
      << report;
  EXPECT_NE(report.find(fmt::format("{} for checkpoints beside the moment files", format_bytes(o.inst.nvme_cap))),
            std::string::npos)
      << report;
  // The fastest rung of the level is never slower than the first that fits.
  auto first = r;
  first.fastest_placement = false;
  const auto f = make_plan(first);
  ASSERT_TRUE(f.feasible);
  EXPECT_LE(o.sim.pred.step_s, f.sim.pred.step_s * (1 + 1e-9));
  // Too small a disk: the advice names the NVMe space that fits (a GiB less does not).
  r.profile.nvme_bytes = GiB;
  const auto a = fit_advice(r);
  ASSERT_EQ(a.change.rfind("nvme_mem >= ", 0), 0u) << a.text();
  const int64_t gib = std::stoll(a.change.substr(12));
  auto at = [&](int64_t g) {
    auto q = r;
    q.explain = false;
    q.profile.nvme_bytes = g * GiB;
    return make_plan(q).feasible;
  };
  EXPECT_TRUE(at(gib));
  EXPECT_FALSE(at(gib - 1));
}

}  // namespace
}  // namespace lt
