// GPU decoding of Qwen3.5/3.6 hybrid models (cuda_decoder.h with the decode mixers of decode_mixer.h):
//  * each kind's decode mixer (Gated DeltaNet: conv windows + recurrent states; gated attention with (1 + w)
//    QK-norm and partial RoPE: KV cache) against the CPU reference mixer: a packed prefill of prompts of
//    different lengths (outputs and, for Gated DeltaNet, the conv windows and recurrent states it leaves),
//    then batched decode steps whose rows map to permuted batch slots;
//  * the whole decoder against the CPU decoder (infer/generate.h) on bf16-rounded weights: logits of every
//    pass, tokens on well-separated models (batch > 1, prompts of different lengths, several prefill passes),
//    resident == streamed == eager bit for bit, and the HF fixtures (tests/fixtures/hf/qwen35_*) compared
//    token for token up to the first position where the CPU's top-2 margin is a near tie.
// Tolerances as test_decode.cpp, looser for the hybrids' longer bf16 chains (measured values are printed,
// "[hybrid-decode] ...").
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <numeric>
#include <sstream>

#include "../common/hf_fixture.h"
#include "backend/cpu/mixer_ref.h"
#include "backend/cpu/ops.h"
#include "infer/cuda/decode.h"
#include "infer/cuda/decode_mixer.h"
#include "decode_test_util.h"
#include "gpu_test_util.h"
#include "hybrid_test_util.h"
#include "infer/decode_state.h"
#include "io/model_io.h"
#include "io/safetensors.h"

using namespace lt;
using namespace lt::gputest;

namespace {

constexpr double kRowRelErr = 5e-2;  // relative L2 error of a logits row, GPU vs CPU
constexpr double kEntryErr = 0.2;    // largest logits entry error, x the row's RMS
constexpr double kTieMargin = 2 * kEntryErr;  // CPU top-2 margins (x RMS) below this are near ties

// ------------------------------------------------------------------------------------------ mixers

// One decode mixer (layer `layer` of c) with its state, scratch and GEMM, for prefill and decode passes.
struct MixerRig {
  ModelConfig c;
  ModelLayout lay;
  int64_t layer;
  LayerKind kind;
  DecodeCapacity cap;
  std::vector<float> w;
  DevBuf wd, state, scratch, gemm_ws, inv_freq, partial;
  std::unique_ptr<cuda::Gemm> gemm;
  std::unique_ptr<cuda::DecodeMixer> mixer;

  static std::vector<float> weights(const UnitLayout& u, uint32_t seed) {
    std::mt19937 rng(seed);
    return unit_weights(u, rng);
  }
  MixerRig(const ModelConfig& cfg, int64_t l, int64_t max_batch, int64_t max_seq, uint32_t seed)
      : c(cfg), lay(model_layout(cfg)), layer(l), kind(cfg.kind(l)), cap(decode_capacity(max_batch, max_seq)),
        w(weights(lay.layer(l), seed)), wd(up_bf16(w)), state(sz(decode_state_bytes(c, kind, cap))),
        scratch(sz(decode_scratch_bytes(c, kind, std::max(cap.prefill_rows, max_batch)))),
        gemm_ws(cuda::Gemm::kWorkspaceBytes), inv_freq(up(cpu::rope_inv_freq(c))),
        partial(sz(cuda::decode_attention_partial_floats(max_batch, c.heads, c.head_dim, max_seq) * 4)),
        gemm(std::make_unique<cuda::Gemm>(gemm_ws.p, cuda::Gemm::kWorkspaceBytes)),
        mixer(cuda::make_decode_mixer(c, kind)) {
    cuda::DecodeAttnDims ad;
    ad.heads = c.heads, ad.kv_heads = c.kv_heads, ad.head_dim = c.head_dim;
    cuda::decode_attention_setup(ad);
  }

  // out [rows, hidden] = mixer(h) (zero residual).
  std::vector<float> run(const cuda::DecodePass& p, const std::vector<float>& h) {
    DevBuf hd = up_bf16(h), res = up_bf16(std::vector<float>(h.size(), 0.f)), out(h.size() * 2);
    const cuda::DecodeMixerCall m{lay.layer(layer), static_cast<const uint16_t*>(wd.p), p, cap, state.p,
                                  scratch.p, *gemm, nullptr};
    mixer->forward(m, hd.p, res.p, out.p);
    return down_bf16(out.p, h.size());
  }
};

// Device copies of one pass's tables.
struct PassTables {
  DevBuf pos, seg, len, slot, dst_row, row0, last_rows;
  cuda::DecodePass pass;
  PassTables(const MixerRig& r, bool prefill, const std::vector<int32_t>& pos_, const std::vector<int32_t>& seg_,
             const std::vector<int32_t>& len_, const std::vector<int32_t>& slot_, const std::vector<int64_t>& dst_,
             const std::vector<int64_t>& row0_, const std::vector<int64_t>& last_)
      : pos(up(pos_)), seg(up(seg_)), len(up(len_)), slot(up(slot_)), dst_row(up(dst_)), row0(up(row0_)),
        last_rows(up(last_)) {
    pass.rows = int64_t(pos_.size());
    pass.seqs = int64_t(slot_.size());
    pass.prefill = prefill;
    pass.max_len = len_.empty() ? 0 : *std::max_element(len_.begin(), len_.end());
    pass.pos = pos.as<int32_t>(), pass.seg = seg.as<int32_t>(), pass.len = len.as<int32_t>();
    pass.slot = slot.as<int32_t>(), pass.dst_row = dst_row.as<int64_t>(), pass.row0 = row0.as<int64_t>();
    pass.last_rows = last_rows.as<int64_t>();
    pass.inv_freq = r.inv_freq.as<float>();
    pass.attn_partial = r.partial.as<float>();
  }
};

struct MixerCase {
  std::string cfg;
  LayerKind kind;
};
std::ostream& operator<<(std::ostream& o, const MixerCase& m) {
  return o << m.cfg << "_" << layer_kind_short_name(m.kind);
}
class HybridDecodeMixer : public ::testing::TestWithParam<MixerCase> {};

// Prompts of 1, 5, 64, 70 and 130 rows packed into one prefill pass (Gated DeltaNet: chunk-start states of
// the prompt's own chunk, and prompts that start inside the chunk of their last row), in batch slots
// 4, 0, 3, 1, 2; then 3 decode steps of all five sequences, row r in slot order 2, 4, 0, 1, 3.
TEST_P(HybridDecodeMixer, PrefillThenStepsMatchCpu) {
  REQUIRE_GPU();
  const MixerCase mc = GetParam();
  ModelConfig c = hybrid_config(mc.cfg);
  const int64_t layer = mc.kind == LayerKind::GatedDeltaNet ? 0 : 1, H = c.hidden, steps = 3;
  const std::vector<int64_t> lens = {1, 5, 64, 70, 130};
  const std::vector<int32_t> slots = {4, 0, 3, 1, 2};
  const int64_t n = int64_t(lens.size()), max_seq = 140, T = std::accumulate(lens.begin(), lens.end(), int64_t(0));
  MixerRig rig(c, layer, n, max_seq, 41 + uint32_t(layer));
  std::mt19937 rng(7);
  const auto h = round_bf16(randn(sz(T * H), rng));
  // CPU: each prompt alone through the reference mixer's prefill.
  std::vector<cpu::MixerCache> caches(sz(n));
  std::vector<float> ref(sz(T * H));
  std::vector<int32_t> pos, seg, slot32;
  std::vector<int64_t> dst, last;
  for (int64_t p = 0, r0 = 0; p < n; r0 += lens[sz(p)], ++p) {
    const int64_t S = lens[sz(p)];
    std::vector<int32_t> pp(sz(S));
    std::iota(pp.begin(), pp.end(), 0);
    auto m = cpu::make_mixer_ref(c, rig.lay.layer(layer), rig.w.data(), nullptr, S);
    m->prefill({pp.data(), nullptr}, h.data() + r0 * H, ref.data() + r0 * H, caches[sz(p)], max_seq);
    for (int64_t t = 0; t < S; ++t) {
      pos.push_back(int32_t(t));
      seg.push_back(int32_t(p));
      dst.push_back(slots[sz(p)] * max_seq + t);
    }
    last.push_back(r0 + S - 1);
  }
  PassTables pre(rig, true, pos, seg, {}, slots, dst, {}, last);
  const auto got = rig.run(pre.pass, h);
  const double e_pre = rel_err(got, ref);
  EXPECT_LE(e_pre, 2e-2) << mc << " prefill";
  if (mc.kind == LayerKind::GatedDeltaNet) {  // the states the prefill left in each slot
    const GdnDecodeState ss = gdn_decode_state(c, rig.cap);
    const int64_t cw = c.linear.conv_dim() * (c.linear.conv_kernel - 1), rs = c.linear.v_heads * c.linear.k_head_dim *
                                                                           c.linear.v_head_dim;
    for (int64_t p = 0; p < n; ++p) {
      const char* base = static_cast<const char*>(rig.state.p);
      auto conv = down<float>(base + ss.conv + slots[sz(p)] * cw * 4, sz(cw));
      auto rec = down<float>(base + ss.rec + slots[sz(p)] * rs * 4, sz(rs));
      EXPECT_LE(rel_err(conv, caches[sz(p)].conv), 1e-2) << mc << " conv window of prompt " << p;
      EXPECT_LE(rel_err(rec, caches[sz(p)].state), 3e-2) << mc << " recurrent state of prompt " << p;
    }
  }
  // Decode steps: row r is sequence order[r].
  const std::vector<int64_t> order = {3, 1, 4, 2, 0};
  double e_step = 0;
  for (int64_t s = 0; s < steps; ++s) {
    const auto hs = round_bf16(randn(sz(n * H), rng));
    std::vector<cpu::MixerCache*> cp;
    std::vector<int32_t> spos, slen, sslot;
    std::vector<int64_t> sdst, srow0;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t q = order[sz(r)], L = lens[sz(q)] + s;
      cp.push_back(&caches[sz(q)]);
      spos.push_back(int32_t(L));
      slen.push_back(int32_t(L + 1));
      sslot.push_back(slots[sz(q)]);
      sdst.push_back(slots[sz(q)] * max_seq + L);
      srow0.push_back(slots[sz(q)] * max_seq);
    }
    std::vector<float> sref(sz(n * H));
    cpu::mixer_decode_step(c, rig.lay.layer(layer), rig.w.data(), hs.data(), n, sref.data(), cp.data());
    PassTables dec(rig, false, spos, {}, slen, sslot, sdst, srow0, {});
    const double e = rel_err(rig.run(dec.pass, hs), sref);
    e_step = std::max(e_step, e);
    EXPECT_LE(e, 3e-2) << mc << " step " << s;
  }
  std::printf("[hybrid-decode] mixer %s %s: prefill rel err %.2e, worst step rel err %.2e\n", mc.cfg.c_str(),
              layer_kind_short_name(mc.kind), e_pre, e_step);
}

std::vector<MixerCase> mixer_cases() {
  std::vector<MixerCase> v;
  for (const char* k : {"hd64", "hd128", "hd256"})
    for (LayerKind kind : {LayerKind::GatedDeltaNet, LayerKind::Attention}) v.push_back({k, kind});
  return v;
}
INSTANTIATE_TEST_SUITE_P(Kinds, HybridDecodeMixer, ::testing::ValuesIn(mixer_cases()), [](const auto& info) {
  std::ostringstream s;
  s << info.param;
  return s.str();
});

// ------------------------------------------------------------------------------------------ decoder

// A 4-layer hybrid (Gated DeltaNet, gated attention, Gated DeltaNet x 2), untied; embedding and LM head
// ~ N(0, 1), the head's (1 + w) norm w ~ N(0, 0.1), layers as unit_weights; bf16-rounded.
Model make_hybrid(const std::string& kind, uint32_t seed, bool separated = false) {
  ModelConfig c = hybrid_config(kind);
  c.layers = 4;
  c.layer_kinds = {LayerKind::GatedDeltaNet, LayerKind::Attention, LayerKind::GatedDeltaNet,
                   LayerKind::GatedDeltaNet};
  c.vocab = 512;
  c.tied = false;
  c.max_position = 4096;
  Model m;
  m.w = make_weights(c);
  std::mt19937 rng(seed);
  for (int64_t l = 0; l < c.layers; ++l) m.w.units[sz(l + 1)] = unit_weights(m.w.layout.layer(l), rng);
  for (size_t u : {size_t(0), sz(c.layers + 1)})
    for (const auto& p : m.w.layout.units[u].params) {
      const bool norm = p.suffix.find("norm") != std::string::npos;
      auto v = randn(sz(p.numel), rng, norm ? 0.1f : 1.f);
      std::copy(v.begin(), v.end(), m.w.units[u].begin() + p.offset);
    }
  if (separated) separate_tokens(m.w);
  for (auto& u : m.w.units) u = round_bf16(u);
  return m;
}

class HybridDecoder : public ::testing::TestWithParam<const char*> {};

// The logits of every pass against a full CPU forward over the GPU's own prefix (decode_test_util.h). These
// random models' top-2 margins are small (mean ~0.2 x RMS), so more argmaxes are near ties than in
// test_decode.cpp: at least 70 % must agree, every other one must be a near tie.
TEST_P(HybridDecoder, LogitsOfEveryStepMatchCpuForward) {
  REQUIRE_GPU();
  expect_logits_match_cpu(make_hybrid(GetParam(), 11), GetParam(), kRowRelErr, kEntryErr, "[hybrid-decode]", 0.7);
}

// Well separated (CPU top-2 margins far beyond the bf16 error): the GPU's greedy tokens equal the CPU
// decoder's for a batch of prompts of different lengths, for each prompt alone, and in batches of 3.
TEST_P(HybridDecoder, GreedyTokensEqualCpuOnWellSeparatedModel) {
  REQUIRE_GPU();
  const Model m = make_hybrid(GetParam(), 21, true);
  const int64_t V = m.w.config.vocab, steps = 16;
  auto prompts = make_prompts({4, 40, 1, 77, 128, 65}, V, 8);
  train::GenerateOptions g;
  g.max_new_tokens = steps;
  g.batch_size = 64;
  const auto cpu = train::greedy_generate(m.view(), prompts, g);
  auto dec = make_decoder(m, WeightsMode::Resident, 8, 160, false);
  EXPECT_EQ(dec->generate(prompts, steps, 64, {}), cpu) << GetParam();
  EXPECT_EQ(dec->generate(prompts, steps, 3, {}), cpu) << GetParam() << " batches of 3";
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(dec->generate({prompts[i]}, steps, 1, {})[0], cpu[i]) << GetParam() << " prompt " << i << " alone";
  double min_margin = 1e30;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> prefix = prompts[i];
    for (int64_t t = 0; t < steps; t += 5) {
      min_margin = std::min(min_margin, top2_margin(cpu_next_logits(m, prefix)));
      for (int64_t k = 0; k < 5 && t + k < steps; ++k) prefix.push_back(cpu[i][sz(t + k)]);
    }
  }
  EXPECT_GE(min_margin, 5 * kTieMargin);  // the precondition
  std::printf("[hybrid-decode] %s separated: GPU tokens == CPU tokens (%zu x %lld, batch / alone / by 3); min CPU "
              "top-2 margin %.2f x RMS\n",
              GetParam(), prompts.size(), (long long)steps, min_margin);
}

// Resident (CUDA-graph decode steps), streamed and resident eager weights: the same tokens and logits, bit
// for bit, with stop tokens ending sequences at different steps (the recurrent states of the sequences that
// remain keep their slots).
TEST_P(HybridDecoder, ResidentStreamedAndEagerAreBitIdentical) {
  REQUIRE_GPU();
  expect_resident_streamed_eager_identical(make_hybrid(GetParam(), 12), GetParam(), "[hybrid-decode]");
}

INSTANTIATE_TEST_SUITE_P(Qwen35, HybridDecoder, ::testing::Values("hd64", "hd128", "hd256"));

// Capacity grows past the planned one, and ~9.6k prompt rows take two prefill passes (the recurrent states
// of the second pass's prompts go to their own slots); tokens equal the CPU decoder's.
TEST(HybridDecode, GrowsCapacityAndPrefillsInSeveralPasses) {
  REQUIRE_GPU();
  const Model m = make_hybrid("hd64", 23, true);
  std::vector<int64_t> lens;
  for (int i = 0; i < 48; ++i) lens.push_back(150 + (i * 37) % 101);
  auto prompts = make_prompts(lens, m.w.config.vocab, 10);
  auto dec = make_decoder(m, WeightsMode::Streamed, 2, 8, false);
  auto gpu = dec->generate(prompts, 4, 48, {});
  EXPECT_GE(dec->counters().passes, 2 + 3);
  train::GenerateOptions g;
  g.max_new_tokens = 4;
  g.batch_size = 48;
  EXPECT_EQ(gpu, train::greedy_generate(m.view(), prompts, g));
}

// ------------------------------------------------------------------------------------------ HF fixtures

// The Qwen3.5 HF fixtures (weights rounded to bf16; the CPU decoder on the same weights is the oracle, HF's
// fp32 tokens are not: bf16 rounding alone changes some of them): the fixture's generate() prompt and prompts
// of other lengths in one batch. At every step of the GPU's free-running greedy decoding, the CPU's logits
// over the same prefix (the GPU's own tokens) must be within the logits bounds, and where the CPU's top-2
// margin is not a near tie the GPU's token must be the CPU's. These tiny random models have small margins
// (~1/3 of the positions are well separated); the test reports how many were compared.
class HybridDecodeHf : public ::testing::TestWithParam<const char*> {};

TEST_P(HybridDecodeHf, GreedyTokensEqualCpuWhereWellSeparated) {
  REQUIRE_GPU();
  const auto dir = lt::testing::kHfFixtures / GetParam();
  Model m;
  m.w = load_model(dir);
  for (auto& u : m.w.units) u = round_bf16(u);
  const int64_t V = m.w.config.vocab;
  SafetensorsFile fx(dir / "fixture.safetensors");
  auto prompts = make_prompts({9, 1, 70, 30}, V, 3);
  prompts.insert(prompts.begin() + 1, lt::testing::read_ids(fx, "gen.prompt"));
  const int64_t steps = std::max<int64_t>(12, int64_t(lt::testing::read_ids(fx, "gen.tokens").size()));
  auto dec = make_decoder(m, WeightsMode::Auto, 8, 128, true);
  const auto gpu = dec->generate(prompts, steps, 64, {});
  const auto& cap = dec->captured_logits();
  ASSERT_EQ(cap.size(), size_t(steps));
  int64_t compared = 0, total = 0;
  double worst_rel = 0;
  // The two fixtures with hidden 48/64 are ill-conditioned for bf16 (docs/notes.md 0b: their HF bf16 step
  // parity misses 0.99 too); measured on the H200 their worst logits rows were 0.16 relative and
  // 0.54 x RMS per entry while their tokens were exact wherever separated. Bounds for them: 0.25 and 0.8.
  const bool small = m.w.config.hidden < 128;
  const double row_bound = small ? 0.25 : kRowRelErr, entry_bound = small ? 0.8 : kEntryErr;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> prefix = prompts[i];
    for (int64_t t = 0; t < steps; ++t, ++total) {
      const float* g = cap[sz(t)].data() + i * sz(V);
      const auto ref = cpu_next_logits(m, prefix);
      const double e = rel_err(std::vector<float>(g, g + V), ref);
      worst_rel = std::max(worst_rel, e);
      EXPECT_LE(e, row_bound) << GetParam() << " prompt " << i << " step " << t;
      EXPECT_LE(max_abs_diff(g, ref.data(), V) / rms(ref.data(), V), entry_bound) << GetParam() << " prompt " << i;
      if (top2_margin(ref) >= kTieMargin) {
        EXPECT_EQ(gpu[i][sz(t)], argmax(ref.data(), V)) << GetParam() << " prompt " << i << " step " << t;
        compared++;
      }
      prefix.push_back(gpu[i][sz(t)]);
    }
  }
  EXPECT_GE(compared, 10) << GetParam() << ": too few well-separated positions to say anything";
  std::printf("[hybrid-decode] %s: GPU token == CPU argmax at all %lld of %lld positions with a CPU top-2 margin >= "
              "%.2f x RMS; worst logits row rel err %.2e\n",
              GetParam(), (long long)compared, (long long)total, kTieMargin, worst_rel);
}

INSTANTIATE_TEST_SUITE_P(Qwen35, HybridDecodeHf,
                         ::testing::Values("qwen35_tied_3to1", "qwen35_untied_odd", "qwen35_hd128"));

}  // namespace
