// Model-state placement: the byte model, the planner's choice of master mode / gradient
// home / 8-bit moments, forced modes, the "it fits with ..." advice, the plan JSON fields, and the
// device-gradient accounting in the instance and the simulator.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/units.h"
#include "model/accounting.h"
#include "model/param_layout.h"
#include "plan/fit_advice.h"
#include "plan/planner.h"
#include "plan/state_bytes.h"
#include "plan/state_report.h"
#include "plan_test_util.h"

namespace lt {
namespace {

// tiny-qwen3: hidden 64, 2 layers, 4 heads / 2 KV heads of 32, FFN 128, vocab 256, untied, QK norms.
// Per layer: norms 64 + 64, q 128x64 = 8192, k and v 64x64 = 4096 each, o 64x128 = 8192, q/k norms
// 32 + 32, gate/up/down 8192 each: 49344 (matrices 49152 in 7 tensors, 192 in 4 vectors).
// Embedding 256x64 = 16384; head: final norm 64 + lm_head 16384 = 16448.
constexpr double kLayer = 49344, kEmb = 16384, kHead = 16448;
constexpr double kN = kEmb + 2 * kLayer + kHead;  // 131520
// 8-bit moments of one layer's matrices: 2 B per element + 2 moments x 4 B per 256-element block
// (q 32 blocks, k 16, v 16, o 32, gate/up/down 32 each = 192 blocks).
constexpr double kLayer8 = 2 * 49152 + 8 * 192;
// adamw8bit: the layers' matrices and the LM head (64 blocks) 8-bit; vectors, final norm, embedding fp32.
constexpr double kHead8 = 2 * 16384 + 8 * 64 + 8 * 64;
constexpr double kMomentsAll8 = 2 * (kLayer8 + 8 * 192) + 8 * kEmb + kHead8;
constexpr double kEmb8Saves = 8 * kEmb - (2 * kEmb + 8 * 64);  // the embedding's moments 8-bit too

ModelConfig tiny() { return preset_config("tiny-qwen3"); }

std::vector<std::string> all_matrices(const ModelConfig& c) { return choose_8bit(c, "adamw8bit", 0); }

TEST(PlanState, BytesPerModeByHand) {
  const auto c = tiny();
  {
    const auto b = model_state_bytes(c, {}, {MasterMode::Fp32, GradHome::Host});
    EXPECT_EQ(b.params, int64_t(kN));
    EXPECT_DOUBLE_EQ(b.master, 4 * kN);  // bf16 copy + 16-bit remainder
    EXPECT_DOUBLE_EQ(b.grads_host, 4 * kN);
    EXPECT_DOUBLE_EQ(b.grads_device, 0);
    EXPECT_DOUBLE_EQ(b.moments, 8 * kN);
    EXPECT_DOUBLE_EQ(b.staging, 2 * 2 * kLayer);  // two bf16 slabs of the largest layer
    EXPECT_DOUBLE_EQ(b.dram(), 16 * kN + 4 * kLayer);
    // HBM: the fp32 gradient buffers (two layers' and the head's) and the bf16 head, for the whole step.
    EXPECT_DOUBLE_EQ(b.grad_scratch, 4 * (2 * kLayer + kHead));
    EXPECT_DOUBLE_EQ(b.head_weights, 2 * kHead);
    EXPECT_DOUBLE_EQ(b.hbm(), 4 * (2 * kLayer + kHead) + 2 * kHead);
  }
  {
    const auto b = model_state_bytes(c, all_matrices(c), {MasterMode::Bf16Sr, GradHome::Device});
    EXPECT_DOUBLE_EQ(b.master, 2 * kN);
    EXPECT_DOUBLE_EQ(b.grads_device, 4 * kN);  // fp32, every unit: the untied embedding is resident
    EXPECT_DOUBLE_EQ(b.grads_host, 0);
    EXPECT_DOUBLE_EQ(b.resident_table, 2 * kEmb);
    EXPECT_DOUBLE_EQ(b.moments, kMomentsAll8);
    EXPECT_EQ(b.eight_bit_tensors, 15);
    EXPECT_DOUBLE_EQ(b.staging, 4 * kN);  // the ring: 8 median units, at most all held ones
    EXPECT_DOUBLE_EQ(b.hbm(), 4 * kN + 2 * kEmb + 2 * kHead);
  }
  {
    // Held in bf16: half the held bytes and the ring, plus the fp32 buffers the backward writes first.
    StatePlacement s{MasterMode::Bf16Sr, GradHome::Device, GradDType::Bf16};
    const auto b = model_state_bytes(c, all_matrices(c), s);
    EXPECT_DOUBLE_EQ(b.grads_device, 2 * kN);
    EXPECT_DOUBLE_EQ(b.staging, 2 * kN);
    EXPECT_DOUBLE_EQ(b.grad_scratch, 4 * (2 * kLayer + std::max(kHead, kEmb)));  // head and embedding share
    s.grad_ring_depth = 1;  // one median unit, at least the largest
    EXPECT_DOUBLE_EQ(model_state_bytes(c, all_matrices(c), s).staging, 2 * std::max({kEmb, kHead, kLayer}));
    // The head's gradient by vocabulary slices: the final norm's and one slice's fp32 rows instead of the shared
    // [vocab, hidden] buffer; everything else as before.
    s.grad_ring_depth = kGradRingDepth;
    s.head_grad_slices = true;
    ASSERT_TRUE(head_grad_slices_apply(c, s));
    const auto sl = model_state_bytes(c, all_matrices(c), s);
    const double rows = double(head_grad_slice_rows(c));
    EXPECT_DOUBLE_EQ(sl.grad_scratch, 4 * (2 * kLayer + double(c.hidden) * (1 + rows)));
    EXPECT_DOUBLE_EQ(b.hbm() - sl.hbm(), 4 * (std::max(kHead, kEmb) - double(c.hidden) * (1 + rows)));
    EXPECT_DOUBLE_EQ(sl.dram(), b.dram());
    EXPECT_FALSE(head_grad_slices_apply(c, {MasterMode::Bf16Sr, GradHome::Device, GradDType::F32}));
    EXPECT_FALSE(head_grad_slices_apply(c, {MasterMode::Bf16Sr, GradHome::Host, GradDType::Bf16}));
    EXPECT_FALSE(head_grad_slices_apply(preset_config("tiny-qwen2"), s));  // tied
  }
  // Tied embeddings: the head unit is the final norm only; the tied matrix's gradient is held with the rest.
  const auto t = preset_config("tiny-qwen2");
  const auto lay = model_layout(t);
  const auto b = model_state_bytes(t, {}, {MasterMode::Fp32, GradHome::Device});
  EXPECT_DOUBLE_EQ(b.grads_host, 0);
  EXPECT_DOUBLE_EQ(b.grads_device, 4.0 * double(b.params));
  EXPECT_DOUBLE_EQ(b.resident_table, 0);  // the head's matrix: not an extra table
  EXPECT_EQ(lay.head().params.size(), 1u);
}

TEST(PlanState, TableListsEveryPart) {
  const auto c = tiny();
  const auto s = state_table(model_state_bytes(c, all_matrices(c), {MasterMode::Fp32, GradHome::Device}), int64_t(kN));
  for (const char* want : {"master + copy (fp32)", "gradients (fp32, held)", "embedding table (resident)",
                           "moments (15 8-bit tensors)", "gradient staging ring", "gpu", "dram", "4.00", "total:"})
    EXPECT_NE(s.find(want), std::string::npos) << want << "\n" << s;
}

// The DRAM the model state needs on each rung of the ladder (tiny-qwen3, bytes).
constexpr double kHostFp32 = 16 * kN + 4 * kLayer;                                   // 2301696
// Held gradients: master + the staging ring (all held units: every unit) + moments.
constexpr double kDevFp32 = 4 * kN + 4 * kN + 8 * kN;                  // 2104320
constexpr double kDevAll8 = 4 * kN + 4 * kN + kMomentsAll8;
constexpr double kDevAll8G16 = 4 * kN + 2 * kN + kMomentsAll8;          // bf16 ring
constexpr double kDevAll8G16E = kDevAll8G16 - kEmb8Saves;                                           // + 8-bit embedding
constexpr double kDevAll8Bf16 = kDevAll8G16E - 2 * kN;                                              // + bf16-sr master

PlanRequest tiny_request(double dram) { return test::tiny_state_request(dram); }

void expect_choice(const PlanOutcome& o, MasterMode m, GradHome g, bool eight_bit, GradDType gd = GradDType::F32,
                   bool emb8 = false) {
  ASSERT_TRUE(o.feasible) << o.why;
  EXPECT_EQ(o.placement.master, m);
  EXPECT_EQ(o.placement.grads, g);
  EXPECT_EQ(o.placement.grad_dtype, gd);
  EXPECT_EQ(o.plan.placement.grad_dtype, gd);
  EXPECT_EQ(o.placement.embedding_8bit, emb8);
  const bool has_emb = std::find(o.plan.optimizer_8bit.begin(), o.plan.optimizer_8bit.end(),
                                 "model.embed_tokens.weight") != o.plan.optimizer_8bit.end();
  EXPECT_EQ(has_emb, emb8);
  EXPECT_EQ(o.plan.placement.master, m);
  EXPECT_EQ(o.plan.placement.grads, g);
  EXPECT_EQ(o.plan.optimizer_8bit.empty(), !eight_bit);
  EXPECT_LE(o.state.dram(), double(o.plan.dram_cap));
}

TEST(PlanState, AutoChoiceOrder) {
  EXPECT_DOUBLE_EQ(kHostFp32, 2301696);
  EXPECT_DOUBLE_EQ(kDevFp32, 2104320);
  EXPECT_DOUBLE_EQ(kDevAll8, 1419776);
  EXPECT_DOUBLE_EQ(kDevAll8G16, 1156736);
  EXPECT_DOUBLE_EQ(kDevAll8G16E, 1058944);
  EXPECT_DOUBLE_EQ(kDevAll8Bf16, 795904);
  using enum GradDType;
  expect_choice(make_plan(tiny_request(kHostFp32 + 3e4)), MasterMode::Fp32, GradHome::Host, false);
  expect_choice(make_plan(tiny_request(kDevFp32 + 3e4)), MasterMode::Fp32, GradHome::Device, false);
  expect_choice(make_plan(tiny_request(kDevAll8 + 3e4)), MasterMode::Fp32, GradHome::Device, true);
  expect_choice(make_plan(tiny_request(kDevAll8G16 + 3e4)), MasterMode::Fp32, GradHome::Device, true, Bf16);
  expect_choice(make_plan(tiny_request(kDevAll8G16E + 3e4)), MasterMode::Fp32, GradHome::Device, true, Bf16, true);
  auto r = tiny_request(kDevAll8Bf16 + 3e4);
  EXPECT_FALSE(make_plan(r).feasible);  // bf16-sr only when allowed
  r.allow_bf16_master = true;
  expect_choice(make_plan(r), MasterMode::Bf16Sr, GradHome::Device, true, Bf16, true);
  // Forced fp32 held gradients skip the bf16 rung; plain adamw never quantises the embedding.
  r = tiny_request(kDevAll8G16 + 3e4);
  r.grad_dtype = F32;
  EXPECT_FALSE(make_plan(r).feasible);
  r = tiny_request(kDevAll8G16E + 3e4);
  r.optimizer = "adamw";
  EXPECT_FALSE(make_plan(r).feasible);
  // Forced host gradients in bf16: planned as such (one micro-batch); several micro-batches are refused.
  r = tiny_request(1e9);
  r.grads = GradHome::Host;
  r.grad_dtype = Bf16;
  expect_choice(make_plan(r), MasterMode::Fp32, GradHome::Host, false, Bf16);
  r.micro_batches = 2;
  EXPECT_THROW(make_plan(r), Error);
  // The device rung holds the gradients in HBM: the GPU peak includes them.
  const auto o = make_plan(tiny_request(kDevFp32 + 3e4));
  EXPECT_DOUBLE_EQ(o.inst.hbm_fixed, o.state.hbm());
  EXPECT_GE(double(o.sim.pred.peak_hbm), o.state.hbm() + o.inst.ring);
}

TEST(PlanState, ForcedModesRespected) {
  auto r = tiny_request(kDevFp32 + 3e4);
  r.grads = GradHome::Host;  // host + fp32 moments does not fit: 8-bit moments instead of device gradients
  expect_choice(make_plan(r), MasterMode::Fp32, GradHome::Host, true);
  r = tiny_request(1e9);
  r.grads = GradHome::Device;
  r.master = MasterMode::Bf16Sr;
  expect_choice(make_plan(r), MasterMode::Bf16Sr, GradHome::Device, false);
  r = tiny_request(kDevAll8Bf16 + 3e4);
  r.master = MasterMode::Fp32;
  r.allow_bf16_master = true;  // forced fp32 wins over the permission
  EXPECT_FALSE(make_plan(r).feasible);
  r = tiny_request(kDevFp32 + 3e4);
  r.optimizer = "adamw";
  expect_choice(make_plan(r), MasterMode::Fp32, GradHome::Device, false);
}

// The advice names a change; the request with that change (planned as asked: MILP, side-by-side) fits.
void expect_advice(PlanRequest r, const std::string& change) {
  const auto o = make_plan(r);
  ASSERT_FALSE(o.feasible);
  EXPECT_NE(o.why.find("; it fits with " + change), std::string::npos) << o.why;
  const auto a = fit_advice(r);
  EXPECT_EQ(a.change, change);
  const auto fixed = make_plan(a.request);
  EXPECT_TRUE(fixed.feasible) << fixed.why;
}

TEST(PlanState, AdviceNamesAChangeThatFits) {
  {
    auto r = tiny_request(kDevFp32 + 3e4);
    r.grads = GradHome::Host;
    r.grad_dtype = GradDType::F32;  // host bf16 gradients would fit
    r.optimizer = "adamw";
    expect_advice(r, "gradients: device");
  }
  {
    // Below fp32 moments with bf16 held gradients (the last rung plain adamw has).
    auto r = tiny_request(kDevFp32 - 2 * kN - 1e5);
    r.optimizer = "adamw";
    expect_advice(r, "optimizer: hybrid");
  }
  expect_advice(tiny_request(kDevAll8Bf16 + 3e4), "master_weights: bf16-sr");
  {
    auto r = tiny_request(kDevAll8Bf16 - 1e5);
    r.allow_bf16_master = true;
    expect_advice(r, "host_mem >= 1 GiB");
  }
  {
    // The GPU is short at this batch: the largest batch that fits.
    auto r = tiny_request(1e12);
    r.model = preset_config("qwen2.5-0.5b");
    r.seq = 1024;
    r.profile.hbm_bytes = 6 * GiB;
    r.profile.hbm_reserve = GiB;
    r.batch = 512;
    const int64_t b = max_feasible_batch(r, "dp", 511);
    ASSERT_GT(b, 1);
    expect_advice(r, fmt::format("batch <= {}", b));
  }
}

TEST(PlanState, AdviceListsWhatWasTriedWhenNothingFits) {
  auto r = tiny_request(1e12);
  r.profile.hbm_bytes = 100 * KiB;  // not even the weight ring (2 x 96 KiB) fits
  r.profile.hbm_reserve = 0;
  const auto o = make_plan(r);
  ASSERT_FALSE(o.feasible);
  EXPECT_EQ(o.why.rfind("does not fit: gpu short by ", 0), 0u) << o.why;
  EXPECT_NE(o.why.find("; none of these fits: master_weights: bf16-sr; optimizer_nvme: auto; master_weights: bf16-sr, "
                       "optimizer_nvme: auto; more NVMe space; more host memory; a smaller batch"),
            std::string::npos) << o.why;
}

TEST(PlanState, PlanJsonFields) {
  std::mt19937 rng(5);
  Instance in = test::random_instance(rng, 4, false);
  Plan p = test::plan_for(in, {Tier::Gpu, Tier::Cpu, Tier::Gpu, Tier::None, Tier::Gpu});
  p.placement = {MasterMode::Bf16Sr, GradHome::Device};
  auto j = plan_to_json(p);
  EXPECT_EQ(j["master_weights"], "bf16-sr");
  EXPECT_EQ(j["gradients"], "device");
  const Plan q = plan_from_json(j);
  EXPECT_EQ(q.placement.master, MasterMode::Bf16Sr);
  EXPECT_EQ(q.placement.grads, GradHome::Device);
  EXPECT_EQ(plan_to_json(q).dump(), j.dump());
  // A plan written before the fields existed loads with fp32 masters and host gradients.
  j.erase("master_weights");
  j.erase("gradients");
  const Plan old = plan_from_json(j);
  EXPECT_EQ(old.placement.master, MasterMode::Fp32);
  EXPECT_EQ(old.placement.grads, GradHome::Host);
  j["gradients"] = "disk";
  try {
    plan_from_json(j, "p.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("p.json: gradients: expected host or device, got 'disk'"), std::string::npos)
        << e.what();
  }
}

TEST(PlanState, DeviceGradientsInTheInstance) {
  const auto c = tiny();
  const auto prof = load_profile_file(lt::testing::repo_root().string() + "/configs/profiles/h200.json");
  InstanceOptions o;
  const Instance host = make_instance(c, 1, 64, prof, o);
  o.placement.grads = GradHome::Device;
  const Instance dev = make_instance(c, 1, 64, prof, o);
  EXPECT_DOUBLE_EQ(host.hbm_fixed, 4 * (2 * kLayer + kHead) + 2 * kHead);  // fp32 gradient buffers, bf16 head
  EXPECT_DOUBLE_EQ(dev.hbm_fixed, 4 * kN + 2 * kEmb + 2 * kHead);  // every gradient, the untied embedding's table
  EXPECT_DOUBLE_EQ(dev.hbm_room(), host.hbm_cap - dev.hbm_fixed);
  EXPECT_TRUE(host.opt_d2h.empty());
  for (int j = 0; j < dev.L; ++j) {
    EXPECT_DOUBLE_EQ(host.d_B(j), j < dev.L - 1 ? 4 * kLayer : 4 * kHead);  // fp32 gradients
    EXPECT_DOUBLE_EQ(dev.d_B(j), 0);  // no gradient D2H in the backward
  }
  EXPECT_DOUBLE_EQ(host.epilogue(), host.pcie(0, 4 * kLayer + host.A));  // + the boundary-0 gradient to the CPU
  EXPECT_DOUBLE_EQ(dev.epilogue(), dev.pcie(0, 0));        // the resident embedding's backward is on the GPU
  EXPECT_DOUBLE_EQ(dev.pro_h2d, 2 * kEmb);                 // its table goes up once per step
  ASSERT_EQ(dev.opt_d2h.size(), size_t(dev.L + 2));
  EXPECT_DOUBLE_EQ(dev.opt_d2h[0], 4 * kLayer / prof.d2h_bw);
  EXPECT_DOUBLE_EQ(dev.opt_d2h[size_t(dev.L)], 4 * kHead / prof.d2h_bw);
  EXPECT_DOUBLE_EQ(dev.opt_d2h[size_t(dev.L + 1)], 4 * kEmb / prof.d2h_bw);
  EXPECT_DOUBLE_EQ(dev.dram_fixed, model_state_bytes(c, {}, o.placement).dram());
  EXPECT_LT(dev.dram_fixed, host.dram_fixed);
}

// A backend-reported workspace (the GPU profiler's) is a floor under every slot's working set, scaled
// by the chunk's tokens; it round-trips through the profile JSON; without it nothing changes.
TEST(PlanState, BackendWorkspaceIsAFloorUnderTheWorkingSets) {
  const auto c = tiny();
  auto prof = load_profile_file(lt::testing::repo_root().string() + "/configs/profiles/h200.json");
  InstanceOptions o;
  const Instance base = make_instance(c, 4, 64, prof, o);
  prof.workspace_tokens = 2 * 64;
  prof.workspace_bytes = int64_t(4 * base.max_ws_bwd());  // per 128 tokens: 2x the estimate at 256
  const Instance floored = make_instance(c, 4, 64, prof, o);
  const double ws = 2.0 * double(prof.workspace_bytes);
  for (int j = 0; j < floored.L; ++j) {
    EXPECT_DOUBLE_EQ(floored.ws_fwd[size_t(j)], ws);
    EXPECT_GT(floored.ws_bwd[size_t(j)], ws);
    EXPECT_EQ(base.ws_bwd[size_t(j)] < floored.ws_bwd[size_t(j)], true);
  }
  EXPECT_GE(floored.ws_head, ws);
  o.chunk = 1;  // a quarter of the tokens: the floor scales down
  EXPECT_DOUBLE_EQ(make_instance(c, 4, 64, prof, o).ws_fwd[0], std::max(ws / 4, make_instance(c, 4, 64, load_profile_file(lt::testing::repo_root().string() + "/configs/profiles/h200.json"), o).ws_fwd[0]));
  const auto back = profile_from_json(profile_to_json(prof), "p.json");
  EXPECT_EQ(back.workspace_bytes, prof.workspace_bytes);
  EXPECT_EQ(back.workspace_tokens, prof.workspace_tokens);
  auto j = profile_to_json(prof);
  j.erase("workspace_tokens");
  EXPECT_THROW(profile_from_json(j, "p.json"), Error);
  // Smaller measured sizes (the head's logits chunk does not shrink with the rows): linear between the points,
  // scaled outside them.
  prof.workspace_points = {{16, int64_t(ws)}, {64, int64_t(ws) + 1000}};  // as much at 16 rows as scaling gives at 256
  o.chunk = 1;
  EXPECT_DOUBLE_EQ(make_instance(c, 4, 64, prof, o).ws_fwd[0], double(int64_t(ws) + 1000));
  EXPECT_DOUBLE_EQ(backend_workspace_bytes(prof, 8), double(int64_t(ws)) / 2);
  EXPECT_DOUBLE_EQ(backend_workspace_bytes(prof, 40), double(int64_t(ws)) + 500);
  EXPECT_DOUBLE_EQ(backend_workspace_bytes(prof, 256), 2.0 * double(prof.workspace_bytes));
  const auto back2 = profile_from_json(profile_to_json(prof), "p.json");
  EXPECT_EQ(back2.workspace_points, prof.workspace_points);
  auto j2 = profile_to_json(prof);
  j2["workspace_points"] = nlohmann::json::array({nlohmann::json::array({64, 1}), nlohmann::json::array({16, 2})});
  EXPECT_THROW(profile_from_json(j2, "p.json"), Error);  // not ascending
}

// The head runs once per chunk of samples, so its slot holds one chunk's rows: at chunks of one sample of a large
// vocabulary the logits chunk is seq rows, not head_chunk_tokens (the 27B shape at 76 GiB planned its moments onto
// NVMe at chunks of 9 for a 4.3 GiB head slot that does not exist at chunks of 1).
TEST(PlanState, HeadSlotHoldsOneChunksRows) {
  auto c = tiny();
  c.vocab = 200000;
  const auto prof = load_profile_file(lt::testing::repo_root().string() + "/configs/profiles/h200.json");
  InstanceOptions o;
  o.head_chunk_tokens = 4096;
  const int64_t batch = 16, seq = 1024;
  o.chunk = 1;
  const Instance one = make_instance(c, batch, seq, prof, o);
  EXPECT_DOUBLE_EQ(one.ws_head, double(head_workspace_bytes(c, seq, 4096)) + one.A);
  EXPECT_DOUBLE_EQ(double(head_workspace_bytes(c, seq, 4096)),
                   double(seq * (4 * c.hidden + 8) + head_chunk_workspace_bytes(c, seq)));
  o.chunk = 8;  // 8,192 rows: the logits chunk stops at 4,096 rows, the hidden-state copies grow
  const Instance eight = make_instance(c, batch, seq, prof, o);
  EXPECT_DOUBLE_EQ(eight.ws_head, double(8 * seq * (4 * c.hidden + 8) + head_chunk_workspace_bytes(c, 4096)) + eight.A);
  EXPECT_GT(eight.ws_head - one.ws_head, 2.9 * double(head_chunk_workspace_bytes(c, seq)));
}

// The simulator with held gradients, by hand on a 2-layer instance (test_simulator.cpp's numbers).
TEST(PlanState, SimulatorWithHeldGradientsByHand) {
  Instance in = test::two_layer_instance();
  in.G = {0, 0};
  in.G_head = 0;
  in.opt = {1, 1, 1, 1};
  in.opt_d2h = {3, 0.5, 0.5, 0};  // layer 0's gradient takes 3 s to come down: its update waits
  in.hbm_fixed = 100;
  const auto O = in.opt_done();
  // In update order (embedding, layers, head): max(previous update, gradient down) + update.
  EXPECT_EQ(O, (std::vector<double>{4, 5, 6, 1}));
  auto r = simulate(in, test::plan_for(in, {Tier::Gpu, Tier::Gpu, Tier::Gpu}));
  // prologue at O0 = 4: 3; F0 (waits O1 = 5): 2; F1 (waits O2 = 6): 4; H: 2; B1: max(3, 20/10) = 3;
  // B0: 3; epilogue: boundary-0 gradient 10/10 = 1.
  EXPECT_DOUBLE_EQ(r.pred.step_s, 4 + 3 + 2 + 4 + 2 + 3 + 3 + 1);
  EXPECT_DOUBLE_EQ(r.pred.exposed_d2h_s, 1);
  EXPECT_EQ(r.pred.peak_hbm, 73 + 100);  // the held gradients on top of the head slot's 73
  in.hbm_cap = 172;
  EXPECT_FALSE(simulate(in, test::plan_for(in, {Tier::Gpu, Tier::Gpu, Tier::Gpu})).fits);
}

// A bounded staging ring (Instance::grad_ring_bytes, from gradient_ring_depth): a unit's gradient comes down once the
// units before it have left the ring, each at its update's end or when the next forward waits for it, if later.
TEST(PlanState, BoundedGradientRingByHand) {
  Instance in = test::two_layer_instance();
  in.G = {0, 0};
  in.G_head = 0;
  in.opt = {1, 1, 1, 1};
  in.opt_d2h = {0.5, 0.5, 0.5, 0.5};  // 5 bytes each at bd = 10
  in.hbm_fixed = 100;
  const auto unbounded = in.opt_done();
  EXPECT_EQ(unbounded, (std::vector<double>{2.5, 3.5, 4.5, 1.5}));
  in.grad_ring_bytes = 5;  // one unit at a time; the forward waits for layer 1 at 10 and for the head at 20
  // Order embedding, layer 0, layer 1, head: 0.5 + 1 = 1.5; the embedding leaves at 1.5: 2 + 1 = 3; layer 0 leaves
  // at 3: 3.5 + 1 = 4.5; layer 1 leaves when the forward waits for it (10): 10.5 + 1 = 11.5.
  EXPECT_EQ(in.opt_done_ring({0, 10, 20, 0}), (std::vector<double>{3, 4.5, 11.5, 1.5}));
  const Plan p = test::plan_for(in, {Tier::Gpu, Tier::Gpu, Tier::Gpu});
  in.grad_ring_bytes = 0;
  const SimResult free_ring = simulate(in, p);
  in.grad_ring_bytes = 20;  // every unit fits: as unbounded
  EXPECT_DOUBLE_EQ(simulate(in, p).pred.step_s, free_ring.pred.step_s);
  in.grad_ring_bytes = 5;
  const SimResult one = simulate(in, p);
  EXPECT_GT(one.pred.exposed_optimizer_s, free_ring.pred.exposed_optimizer_s);
  EXPECT_GT(one.pred.step_s, free_ring.pred.step_s);
  // The times are a fixed point: the updates' ends from the forward's waits of the simulated step.
  std::vector<double> reach(4, 0.0);
  for (int j = 1; j <= in.L; ++j) reach[size_t(j)] = one.slot_start[size_t(j - 1)];
  const auto O = in.opt_done_ring(reach);
  EXPECT_DOUBLE_EQ(one.slot_start[1], std::max(one.slot_start[0] + one.slot_time[0], O[2]));
}

// The solvers' view of an instance with NVMe-moment units: the checkpoints get the disk's rates less the share of the
// step's compute the moments' reads and writes take (at least a tenth); the simulator's instance keeps the rates.
TEST(PlanState, SolverViewSharesTheDiskWithTheMoments) {
  Instance in = test::two_layer_instance();  // compute: rho 1 + 1, beta 3 + 3, head 2 = 10 s; disk 5 B/s each way
  EXPECT_DOUBLE_EQ(in.solver_view().bnr, in.bnr);  // no NVMe units
  in.nvme_read = {2, 0, 0, 0};
  in.nvme_write = {0, 3, 0, 0};
  const Instance v = in.solver_view();
  EXPECT_DOUBLE_EQ(v.bnr, 5 * (1 - 2.0 / 10));
  EXPECT_DOUBLE_EQ(v.bnw, 5 * (1 - 3.0 / 10));
  EXPECT_DOUBLE_EQ(in.bnr, 5);
  in.nvme_read = {20, 0, 0, 0};  // more than the step's compute: a tenth of the rate left
  EXPECT_DOUBLE_EQ(in.solver_view().bnr, 0.5);
}

// The last rung: the moments of the fewest last layers on NVMe, only when allowed and the disk holds them;
// the files count against the disk in the report, and the plan records the count.
TEST(PlanState, NvmeMomentRungWhenAllowed) {
  // 8 layers: moving k layers' moments frees k - min(3, k) of them (the staging slots stay in DRAM).
  auto r = tiny_request(0);
  r.model.layers = 8;
  // The rung before it: bf16-sr, held bf16 gradients, every matrix 8-bit including the embedding.
  const StatePlacement last{MasterMode::Bf16Sr, GradHome::Device, GradDType::Bf16, true, 0};
  const auto all8 = choose_8bit(r.model, "adamw8bit", 0, last);
  const double dram_only = model_state_bytes(r.model, all8, last).dram();
  r.profile.dram_bytes = int64_t(dram_only - 0.5 * layer_moment_bytes(r.model, 0, all8));
  r.optimizer = "adamw8bit";
  r.allow_bf16_master = true;
  r.profile.nvme_bytes = int64_t(1) << 30;
  r.profile.nvme_read_bw = r.profile.nvme_write_bw = 2e9;
  EXPECT_FALSE(make_plan(r).feasible);  // not allowed: no NVMe moments
  r.allow_nvme_moments = true;
  const auto o = make_plan(r);
  ASSERT_TRUE(o.feasible) << o.why;
  EXPECT_GE(o.placement.nvme_layers, 1);
  EXPECT_EQ(o.plan.placement.nvme_layers, o.placement.nvme_layers);
  EXPECT_GT(o.state.nvme(), 0);
  EXPECT_LE(o.state.dram(), double(r.profile.dram_bytes));
  // The fewest: one layer less does not fit.
  StatePlacement fewer = o.placement;
  fewer.nvme_layers -= 1;
  EXPECT_GT(model_state_bytes(r.model, o.plan.optimizer_8bit, fewer).dram(), double(r.profile.dram_bytes));
  EXPECT_NE(memory_table(o).find(fmt::format("nvme {} of {}", format_bytes(o.state.nvme()),
                                             format_bytes(double(r.profile.nvme_bytes)))),
            std::string::npos)
      << memory_table(o);
  EXPECT_EQ(plan_from_json(plan_to_json(o.plan)).placement.nvme_layers, o.placement.nvme_layers);
  r.profile.nvme_bytes = 1024;  // the disk cannot hold them
  EXPECT_FALSE(make_plan(r).feasible);
}

}  // namespace
}  // namespace lt

namespace lt {
namespace {

// The optimizer's update order is the executor's: the embedding first (the next forward's lookup needs it, tied or
// not), then the layers, then the head. A long embedding update delays the step's start, not its end.
TEST(PlanState, EmbeddingUpdateComesFirst) {
  Instance in = test::two_layer_instance();
  in.opt = {1, 1, 1, 5};  // layers 0, 1, head, embedding
  EXPECT_EQ(in.opt_order(), (std::vector<size_t>{3, 0, 1, 2}));
  EXPECT_EQ(in.opt_done(), (std::vector<double>{6, 7, 8, 5}));
  EXPECT_DOUBLE_EQ(in.opt_last(), 8);
  const auto r = simulate(in, test::plan_for(in, {Tier::Gpu, Tier::Gpu, Tier::Gpu}));
  in.opt = {0, 0, 0, 0};
  const auto free_opt = simulate(in, test::plan_for(in, {Tier::Gpu, Tier::Gpu, Tier::Gpu}));
  EXPECT_GE(r.pred.exposed_optimizer_s, 6.0);  // the prologue waits for the embedding and layer 0
  EXPECT_GE(r.pred.step_s, free_opt.pred.step_s + 6.0 - 1e-9);
}

// An untied table looked up on the host: the next batch's rows go first and the rest of the table last, so the
// model orders the embedding last (nothing waits for the whole of it); tied or resident tables stay first.
TEST(PlanState, HostLookupEmbeddingUpdatesLast) {
  Instance in = test::two_layer_instance();
  in.opt = {1, 1, 1, 5};
  in.embedding_first = false;
  EXPECT_EQ(in.opt_order(), (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(in.opt_done(), (std::vector<double>{1, 2, 3, 8}));
  PlanRequest r = test::tiny_state_request(1e9);
  ModelConfig c = r.model;
  c.tied = false;
  InstanceOptions io;
  io.embedding_rows_first = false;
  EXPECT_TRUE(make_instance(c, 1, 64, r.profile, io).embedding_first);  // the trainer's rows-first order is off
  io.embedding_rows_first = true;  // the default
  EXPECT_FALSE(make_instance(c, 1, 64, r.profile, io).embedding_first);  // host gradients: the lookup on the host
  io.placement.grads = GradHome::Device;
  EXPECT_TRUE(make_instance(c, 1, 64, r.profile, io).embedding_first);  // resident table
  c.tied = true;
  EXPECT_TRUE(make_instance(c, 1, 64, r.profile, InstanceOptions{}).embedding_first);
}

// A tied model's embedding update is its own unit (first), the head's holds only the final norm.
TEST(PlanState, TiedEmbeddingUpdateIsTheEmbeddingsUnit) {
  PlanRequest r = test::tiny_state_request(1e9);
  ModelConfig c = r.model;
  c.tied = true;
  const ResourceProfile& p = r.profile;
  const Instance in = make_instance(c, 1, 64, p, InstanceOptions{});
  const double r32 = p.opt_fp32_params_per_s;
  // The embedding is updated before the forward (full rate); the head beside it (optimizer_derate).
  EXPECT_NEAR(in.opt[size_t(in.L + 1)], double(c.vocab * c.hidden) / r32, 1e-12);
  EXPECT_NEAR(in.opt[size_t(in.L)], double(c.hidden) / r32 / optimizer_derate(in, p), 1e-12);
}

}  // namespace
}  // namespace lt

namespace lt {
namespace {

// The tied embedding's update on the GPU (StatePlacement::embedding_update_device): chosen wherever it can run
// (tied, host gradients, fp32 masters, fp32 moments for it, one process), never when asked not to, an error naming
// the reason when required where it cannot; its bytes move from DRAM (the host gradient) to HBM (remainders and
// moments), and the instance drops its CPU update, its upload and its gradient D2H.
TEST(PlanState, EmbeddingUpdateOnTheGpu) {
  PlanRequest r = test::tiny_state_request(1e9);
  r.model.tied = true;
  auto o = make_plan(r);
  ASSERT_TRUE(o.feasible) << o.why;
  EXPECT_TRUE(o.placement.embedding_update_device);
  EXPECT_EQ(plan_to_json(o.plan)["embedding_update"], "device");
  EXPECT_TRUE(plan_from_json(plan_to_json(o.plan)).placement.embedding_update_device);
  const StateBytes on = model_state_bytes(r.model, {}, o.placement);
  StatePlacement off_p = o.placement;
  off_p.embedding_update_device = false;
  const StateBytes off = model_state_bytes(r.model, {}, off_p);
  EXPECT_DOUBLE_EQ(on.device_update, 10 * kEmb);  // remainders 2 B + fp32 moments 8 B
  EXPECT_DOUBLE_EQ(on.hbm() - off.hbm(), 10 * kEmb);
  EXPECT_DOUBLE_EQ(off.dram() - on.dram(), 4 * kEmb);  // no host gradient for it
  EXPECT_DOUBLE_EQ(o.inst.opt[size_t(o.inst.L + 1)], 0.0);
  EXPECT_DOUBLE_EQ(o.inst.P_head, 2.0 * double(r.model.hidden));
  EXPECT_DOUBLE_EQ(o.inst.G_head, 4.0 * double(r.model.hidden));
  bool listed = false;
  for (const auto& part : on.parts()) listed |= part.name.find("embedding update") != std::string::npos;
  EXPECT_TRUE(listed);
  // Several micro-batches: the fp32 accumulator too.
  InstanceOptions io;
  io.placement = o.placement;
  const Instance one = make_instance(r.model, 1, 64, r.profile, io);
  io.micro_batches = 2;
  EXPECT_DOUBLE_EQ(make_instance(r.model, 1, 64, r.profile, io).hbm_fixed - one.hbm_fixed, 4 * kEmb);

  r.embedding_update_device = false;
  EXPECT_FALSE(make_plan(r).placement.embedding_update_device);
  // Untied: not chosen, and an error naming why when required.
  r = test::tiny_state_request(1e9);
  EXPECT_FALSE(make_plan(r).placement.embedding_update_device);
  r.embedding_update_device = true;
  try {
    make_plan(r);
    ADD_FAILURE() << "required on an untied embedding";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not tied"), std::string::npos) << e.what();
  }
  // Required, but every rung holds the gradients on the device (forced): no rung can.
  r = test::tiny_state_request(1e9);
  r.model.tied = true;
  r.grads = GradHome::Device;
  r.embedding_update_device = true;
  try {
    make_plan(r);
    ADD_FAILURE() << "required with gradients held on the device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gradients held on the device"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lt

namespace lt {
namespace {

// The optimizer's rates derated by the forward's weight uploads' share of the host memory traffic, by hand: every
// unit but an embedding updated before the forward; no derate without a host bandwidth; the uploads capped at PCIe.
TEST(PlanState, OptimizerDeratedByTheForwardsUploads) {
  PlanRequest r = test::tiny_state_request(1e9);
  ResourceProfile p = r.profile;
  const Instance in = make_instance(r.model, 1, 64, p, InstanceOptions{});
  double bytes = 0, secs = 0;
  for (int j = 0; j < in.L; ++j) bytes += in.P[size_t(j)], secs += in.rho[size_t(j)];
  const double f = std::max(0.5, 1.0 - std::min(bytes / secs, p.h2d_bw) / (2.0 * p.host_mem_bw));
  EXPECT_DOUBLE_EQ(optimizer_derate(in, p), f);
  EXPECT_LT(f, 1.0);
  p.host_mem_bw = 0;
  const Instance plain = make_instance(r.model, 1, 64, p, InstanceOptions{});
  EXPECT_DOUBLE_EQ(optimizer_derate(plain, p), 1.0);
  for (size_t u = 0; u < in.opt.size(); ++u) {
    const bool first = u == size_t(in.L + 1) && in.embedding_first;
    EXPECT_NEAR(in.opt[u], plain.opt[u] / (first ? 1.0 : f), 1e-15) << "unit " << u;
  }
}

}  // namespace
}  // namespace lt

namespace lt {
namespace {

// The first layers' updates on the GPU (StatePlacement::device_update_layers): with a CPU optimizer slower than the
// forward the planner chooses some (its simulated step and exposed optimizer fall), their instance costs lose the
// optimizer time, the upload and the gradient D2H, their state moves to HBM and out of DRAM's gradients; one layer
// fewer plans slower; forced counts are planned as given or refused with the reason.
TEST(PlanState, FirstLayersUpdatedOnTheGpu) {
  PlanRequest r = test::tiny_state_request(1e9);
  r.compare = false;
  r.planner = "dp";
  r.keep_internals = false;
  r.profile.opt_fp32_params_per_s /= 2000;  // the CPU optimizer far behind the forward
  r.profile.opt_8bit_params_per_s /= 2000;
  r.device_update_layers = 0;
  const PlanOutcome none = make_plan(r);
  ASSERT_TRUE(none.feasible) << none.why;
  ASSERT_GT(none.sim.pred.exposed_optimizer_s, 0.0);
  r.device_update_layers.reset();
  const PlanOutcome o = make_plan(r);
  ASSERT_TRUE(o.feasible) << o.why;
  const int64_t k = o.placement.device_update_layers;
  EXPECT_GT(k, 0);
  EXPECT_LT(o.sim.pred.step_s, none.sim.pred.step_s);
  EXPECT_LT(o.sim.pred.exposed_optimizer_s, none.sim.pred.exposed_optimizer_s);
  EXPECT_GT(o.inst.device_update_s, 0.0);
  for (int64_t j = 0; j < o.inst.L; ++j) {
    const bool dev = j < k;
    EXPECT_EQ(o.inst.opt[size_t(j)] == 0, dev) << "layer " << j;
    EXPECT_EQ(o.inst.P[size_t(j)] == 0, dev) << "layer " << j;
    EXPECT_EQ(o.inst.G[size_t(j)] == 0, dev) << "layer " << j;
  }
  EXPECT_EQ(plan_to_json(o.plan)["device_update_layers"], k);
  EXPECT_EQ(plan_from_json(plan_to_json(o.plan)).placement.device_update_layers, k);
  // The state: per layer weights 2 + remainders 2 + gradient 4 + moments in HBM; its host gradient out of DRAM.
  StatePlacement off = o.placement;
  off.device_update_layers = 0;
  const StateBytes on_b = model_state_bytes(r.model, o.plan.optimizer_8bit, o.placement);
  const StateBytes off_b = model_state_bytes(r.model, o.plan.optimizer_8bit, off);
  double n = 0, mb = 0;
  for (int64_t j = 0; j < k; ++j) {
    n += double(unit_param_count(model_layout(r.model).layer(j)));
    mb += layer_moment_bytes(r.model, j, o.plan.optimizer_8bit);
  }
  EXPECT_DOUBLE_EQ(on_b.device_layers, 8 * n + mb);
  EXPECT_DOUBLE_EQ(on_b.hbm() - off_b.hbm(), 8 * n + mb);
  EXPECT_DOUBLE_EQ(off_b.dram() - on_b.dram(), 4 * n);
  bool listed = false;
  for (const auto& part : on_b.parts()) listed |= part.name.find("layers' update") != std::string::npos;
  EXPECT_TRUE(listed);
  // A forced count.
  r.device_update_layers = 1;
  EXPECT_EQ(make_plan(r).placement.device_update_layers, 1);
  // The search keeps a count only for a gain: one layer fewer plans slower.
  r.device_update_layers = k - 1;
  EXPECT_GT(make_plan(r).sim.pred.step_s, o.sim.pred.step_s * (1 + 1e-7));
  // Forced where it cannot: gradients held on the device; more layers than the model has.
  r.grads = GradHome::Device;
  try {
    make_plan(r);
    ADD_FAILURE() << "layers on the device with gradients held on the device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gradients held on the device"), std::string::npos) << e.what();
  }
  r.grads.reset();
  r.device_update_layers = r.model.layers + 1;
  EXPECT_THROW(make_plan(r), Error);
}

}  // namespace
}  // namespace lt

namespace lt {
namespace {

// The count of layers updated on the GPU is chosen with a margin on the optimizer's rate (kOptimizerMargin = 1.2): a
// plan that hides the CPU optimizer at the profile's rate still hides it when training runs it 15 % slower.
TEST(PlanState, DeviceLayersLeaveAMarginForASlowerOptimizer) {
  int checked = 0;
  for (double slow : {0.5, 0.75, 1.0, 1.5, 2.0}) {
    PlanRequest r = test::tiny_state_request(64e9);
    r.model = preset_config("qwen2.5-0.5b");
    r.batch = 32;
    r.seq = 1024;
    r.profile.h2d_bw = r.profile.d2h_bw = r.profile.both_bw = 1e15;  // free PCIe: the layers go to the GPU for the optimizer alone
    r.compare = false;
    r.planner = "dp";
    r.profile.opt_fp32_params_per_s /= slow;
    r.profile.opt_8bit_params_per_s /= slow;
    const PlanOutcome o = make_plan(r);
    ASSERT_TRUE(o.feasible) << o.why;
    const int64_t k = o.placement.device_update_layers;
    if (k == 0 || k >= r.model.layers || o.sim.pred.exposed_optimizer_s > 1e-9) continue;
    Instance slower = o.inst;
    for (double& t : slower.opt) t *= 1.15;
    EXPECT_LT(simulate(slower, o.plan).pred.exposed_optimizer_s, 1e-9) << "slowdown " << slow << ", k " << k;
    ++checked;
  }
  EXPECT_GT(checked, 0) << "no profile gave a plan with some layers on the GPU and nothing exposed";
}

}  // namespace
}  // namespace lt
