// The Gated DeltaNet CUDA kernels (src/backend/cuda/deltanet/deltanet.h) against the fp32 CPU reference
// (src/backend/cpu/ops_gdn.h), on bf16-rounded inputs, at edge shapes: seq not a multiple of the chunk
// (37, 100, 130), packed segments (several per sample, a 1-token one, one starting exactly at a chunk
// boundary), Hv = 3 Hk, Dk != Dv, batch 3.
// Tolerances: bf16 outputs rel. error (||got - ref|| / ||ref||) <= 1e-2 per tensor; fp32 gradients from
// bf16 inputs: cosine >= 0.999 (and rel. error <= 3e-2); fp32 outputs of fp32 math (g, beta, rstd, the
// rule's chunk states, the decode states) rel. error <= 1e-3.
// The rule runs on every implementation (cuda::GdnRuleImpl: Chunked, the chunk-parallel backward; Mma, tensor
// cores per value tile; Simt, CUDA cores), each against the CPU reference with the same tolerances, and
// Chunked against Mma, Mma against Simt: o rel <= 5e-3 (bf16 outputs), the fp32 chunk states and every
// gradient rel <= 1e-4 (the split-bf16 products keep ~16 mantissa bits).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <iterator>
#include <tuple>
#include <utility>

#include "backend/cpu/ops_gdn.h"
#include "backend/cuda/deltanet/deltanet.h"
#include "gpu_test_util.h"

using namespace lt;
using namespace lt::gputest;

namespace {

struct GdnCase {
  int64_t batch, seq, Hk, Hv, Dk, Dv;
  bool segments;
};
std::ostream& operator<<(std::ostream& o, const GdnCase& c) {
  return o << "B" << c.batch << "_S" << c.seq << "_Hk" << c.Hk << "_Hv" << c.Hv << "_Dk" << c.Dk << "_Dv" << c.Dv
           << (c.segments ? "_seg" : "");
}

cuda::GdnDims dims_of(const GdnCase& c) {
  cuda::GdnDims d;
  d.batch = c.batch, d.seq = c.seq, d.Hk = c.Hk, d.Hv = c.Hv, d.Dk = c.Dk, d.Dv = c.Dv, d.K = 4;
  return d;
}

// Segment ids [T]: per sample, starts at S/3, S/3 + 1 (a 1-token segment), 64 (a chunk boundary) and
// 2S/3 + 5, where inside the sample. Ids restart per sample.
std::vector<int32_t> make_segments(const GdnCase& c) {
  std::vector<int32_t> seg(sz(c.batch * c.seq), 0);
  if (!c.segments) return seg;
  const int64_t S = c.seq;
  std::vector<int64_t> starts = {S / 3, S / 3 + 1, 64, 2 * S / 3 + 5};
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t s = 0; s < S; ++s) {
      int32_t id = 0;
      for (int64_t st : starts)
        if (st > 0 && st < S && s >= st) ++id;
      seg[sz(b * S + s)] = id + int32_t(b % 2) * 7;
    }
  return seg;
}

std::vector<float> sigmoid_v(std::vector<float> v) {
  for (auto& x : v) x = 1.f / (1.f + std::exp(-x));
  return v;
}

void expect_grad(const std::vector<float>& got, const std::vector<float>& ref, const std::string& what) {
  const double cs = cosine(got.data(), ref.data(), got.size());
  EXPECT_GE(cs, 0.999) << what;
  EXPECT_LE(rel_err(got, ref), 3e-2) << what;
}

// x [rows, cols] as rows of stride ld >= cols (a slice of the layer's one input-projection output), the other
// entries `pad`; and back.
std::vector<float> strided(const std::vector<float>& x, int64_t rows, int64_t cols, int64_t ld, float pad) {
  std::vector<float> w(sz(rows * ld), pad);
  for (int64_t r = 0; r < rows; ++r) std::copy_n(&x[sz(r * cols)], cols, &w[sz(r * ld)]);
  return w;
}
std::vector<float> dense(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> x(sz(rows * cols));
  for (int64_t r = 0; r < rows; ++r) std::copy_n(&w[sz(r * ld)], cols, &x[sz(r * cols)]);
  return x;
}
// Entries of w outside the [rows, cols] slice that differ from pad (a strided write must leave them).
int64_t pad_changed(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t ld, float pad) {
  int64_t n = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = cols; c < ld; ++c) n += w[sz(r * ld + c)] != pad;
  return n;
}

class GdnKernel : public ::testing::TestWithParam<GdnCase> {};

// ------------------------------------------------------------------------------------------ conv
TEST_P(GdnKernel, ConvForwardBackward) {
  REQUIRE_GPU();
  const GdnCase gc = GetParam();
  const auto d = dims_of(gc);
  const int64_t T = d.tokens(), C = d.conv_ch(), K = d.K, S = gc.seq, ldx = C + 8;
  std::mt19937 rng{uint32_t(T * 7 + C)};
  auto xw = round_bf16(randn(sz(T * ldx), rng));  // a slice of a wider projection output
  auto w = round_bf16(randn(sz(C * K), rng, 0.5f)), dy = round_bf16(randn(sz(T * C), rng));
  auto dw0 = randn(sz(C * K), rng);
  const auto seg = make_segments(gc);
  std::vector<float> x(sz(T * C));
  for (int64_t t = 0; t < T; ++t) std::copy_n(&xw[sz(t * ldx)], C, &x[sz(t * C)]);
  std::vector<float> y_ref(x.size()), dx_ref(x.size()), dw_ref = dw0;
  for (int64_t b = 0; b < gc.batch; ++b) {
    const int32_t* sg = gc.segments ? seg.data() + b * S : nullptr;
    cpu::gdn_conv_silu_fwd(x.data() + b * S * C, w.data(), S, C, K, sg, y_ref.data() + b * S * C);
    cpu::gdn_conv_silu_bwd(x.data() + b * S * C, w.data(), dy.data() + b * S * C, S, C, K, sg,
                           dx_ref.data() + b * S * C, dw_ref.data());
  }
  DevBuf dx_in = up_bf16(xw), dwt = up_bf16(w), ddy = up_bf16(dy), dseg = up(seg), ddw = up(dw0);
  DevBuf y(sz(T * C) * 2), gx(sz(T * ldx) * 2), ws(sz(cuda::gdn_conv_bwd_workspace_bytes(d)));
  const int32_t* sp = gc.segments ? dseg.as<int32_t>() : nullptr;
  cuda::gdn_conv_silu_fwd(d, dx_in.p, ldx, dwt.p, sp, y.p, nullptr);
  cuda::gdn_conv_silu_bwd(d, dx_in.p, ldx, dwt.p, ddy.p, sp, gx.p, ddw.as<float>(), ws.p, nullptr);
  GT_CUDA(cudaDeviceSynchronize());
  EXPECT_LE(rel_err(down_bf16(y.p, sz(T * C)), y_ref), 1e-2) << gc;
  const auto gxw = down_bf16(gx.p, sz(T * ldx));
  std::vector<float> gxc(sz(T * C));
  for (int64_t t = 0; t < T; ++t) std::copy_n(&gxw[sz(t * ldx)], C, &gxc[sz(t * C)]);
  EXPECT_LE(rel_err(gxc, dx_ref), 1e-2) << gc;
  auto dw_got = down<float>(ddw.p, sz(C * K));
  for (size_t i = 0; i < dw_got.size(); ++i) dw_got[i] -= dw0[i], dw_ref[i] -= dw0[i];
  expect_grad(dw_got, dw_ref, "conv dw");
}

// ------------------------------------------------------------------------------------------ prep
TEST_P(GdnKernel, PrepForwardBackward) {
  REQUIRE_GPU();
  const GdnCase gc = GetParam();
  const auto d = dims_of(gc);
  const int64_t T = d.tokens(), C = d.conv_ch(), KD = d.Hk * d.Dk, VD = d.Hv * d.Dv, NV = d.Hv;
  std::mt19937 rng{uint32_t(T * 11 + C)};
  auto y = round_bf16(randn(sz(T * C), rng)), a = round_bf16(randn(sz(T * NV), rng));
  auto bb = round_bf16(randn(sz(T * NV), rng));
  auto A_log = round_bf16(randn(sz(NV), rng, 0.5f, 1.f)), dt = round_bf16(randn(sz(NV), rng, 0.5f));
  auto dqn = randn(sz(T * KD), rng), dkn = randn(sz(T * KD), rng), dv = randn(sz(T * VD), rng);
  auto dg = randn(sz(T * NV), rng), dbeta = randn(sz(T * NV), rng);
  auto dA0 = randn(sz(NV), rng), ddt0 = randn(sz(NV), rng);
  // reference
  std::vector<float> q0(sz(T * KD)), k0(sz(T * KD)), v0(sz(T * VD));
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(&y[sz(t * C)], KD, &q0[sz(t * KD)]);
    std::copy_n(&y[sz(t * C + KD)], KD, &k0[sz(t * KD)]);
    std::copy_n(&y[sz(t * C + 2 * KD)], VD, &v0[sz(t * VD)]);
  }
  std::vector<float> qn_ref(q0.size()), kn_ref(k0.size()), g_ref(sz(T * NV)), beta_ref(sz(T * NV));
  cpu::gdn_l2norm_fwd(q0.data(), T * d.Hk, d.Dk, 1e-6f, qn_ref.data());
  cpu::gdn_l2norm_fwd(k0.data(), T * d.Hk, d.Dk, 1e-6f, kn_ref.data());
  cpu::gdn_gates_fwd(a.data(), bb.data(), A_log.data(), dt.data(), T, NV, g_ref.data(), beta_ref.data());
  std::vector<float> dq0(q0.size()), dk0(k0.size()), dy_ref(sz(T * C)), da_ref(sz(T * NV)), db_ref(sz(T * NV));
  std::vector<float> dA_ref = dA0, ddt_ref = ddt0;
  cpu::gdn_l2norm_bwd(q0.data(), dqn.data(), T * d.Hk, d.Dk, 1e-6f, dq0.data());
  cpu::gdn_l2norm_bwd(k0.data(), dkn.data(), T * d.Hk, d.Dk, 1e-6f, dk0.data());
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(&dq0[sz(t * KD)], KD, &dy_ref[sz(t * C)]);
    std::copy_n(&dk0[sz(t * KD)], KD, &dy_ref[sz(t * C + KD)]);
    std::copy_n(&dv[sz(t * VD)], VD, &dy_ref[sz(t * C + 2 * KD)]);
  }
  cpu::gdn_gates_bwd(a.data(), bb.data(), A_log.data(), dt.data(), dg.data(), dbeta.data(), T, NV, da_ref.data(),
                     db_ref.data(), dA_ref.data(), ddt_ref.data());
  // GPU: a, b (and da, db) as slices of rows of stride ldab (odd: the layer's one projection output)
  const int64_t ldab = NV + 5;
  const float pad = 3.f;
  DevBuf dy_ = up_bf16(y), da_ = up_bf16(strided(a, T, NV, ldab, pad)), db_ = up_bf16(strided(bb, T, NV, ldab, pad));
  DevBuf dAl = up_bf16(A_log), ddt = up_bf16(dt);
  DevBuf qn(sz(T * KD) * 2), kn(sz(T * KD) * 2), vv(sz(T * VD) * 2), g(sz(T * NV) * 4), beta(sz(T * NV) * 4);
  cuda::gdn_prep_fwd(d, dy_.p, da_.p, db_.p, ldab, dAl.p, ddt.p, qn.p, kn.p, vv.p, g.as<float>(), beta.as<float>(),
                     nullptr);
  DevBuf gdq = up(dqn), gdk = up(dkn), gdv = up(dv), gdg = up(dg), gdb = up(dbeta), gA = up(dA0), gdt = up(ddt0);
  const std::vector<float> pads(sz(T * ldab), pad);
  DevBuf o_dy(sz(T * C) * 2), o_da = up_bf16(pads), o_db = up_bf16(pads);
  DevBuf ws(sz(cuda::gdn_prep_bwd_workspace_bytes(d)));
  cuda::gdn_prep_bwd(d, dy_.p, da_.p, db_.p, ldab, dAl.p, ddt.p, gdq.as<float>(), gdk.as<float>(), gdv.as<float>(),
                     gdg.as<float>(), gdb.as<float>(), o_dy.p, o_da.p, o_db.p, gA.as<float>(), gdt.as<float>(), ws.p,
                     nullptr);
  GT_CUDA(cudaDeviceSynchronize());
  EXPECT_LE(rel_err(down_bf16(qn.p, q0.size()), qn_ref), 1e-2) << gc;
  EXPECT_LE(rel_err(down_bf16(kn.p, k0.size()), kn_ref), 1e-2) << gc;
  EXPECT_EQ(rel_err(down_bf16(vv.p, v0.size()), v0), 0.0) << gc;  // an exact copy
  EXPECT_LE(rel_err(down<float>(g.p, sz(T * NV)), g_ref), 1e-3) << gc;
  EXPECT_LE(rel_err(down<float>(beta.p, sz(T * NV)), beta_ref), 1e-3) << gc;
  EXPECT_LE(rel_err(down_bf16(o_dy.p, sz(T * C)), dy_ref), 1e-2) << gc;
  const auto da_w = down_bf16(o_da.p, sz(T * ldab)), db_w = down_bf16(o_db.p, sz(T * ldab));
  EXPECT_LE(rel_err(dense(da_w, T, NV, ldab), da_ref), 1e-2) << gc;
  EXPECT_LE(rel_err(dense(db_w, T, NV, ldab), db_ref), 1e-2) << gc;
  EXPECT_EQ(pad_changed(da_w, T, NV, ldab, pad), 0) << gc;
  EXPECT_EQ(pad_changed(db_w, T, NV, ldab, pad), 0) << gc;
  EXPECT_LE(rel_err(down<float>(gA.p, sz(NV)), dA_ref), 1e-3) << gc;
  EXPECT_LE(rel_err(down<float>(gdt.p, sz(NV)), ddt_ref), 1e-3) << gc;
  // The scalar forward (taken when y is not 16-byte aligned): y one entry into its buffer.
  DevBuf ymis(sz(T * C + 8) * 2);
  GT_CUDA(cudaMemcpy(static_cast<char*>(ymis.p) + 2, dy_.p, sz(T * C) * 2, cudaMemcpyDeviceToDevice));
  for (DevBuf* o : {&qn, &kn, &vv}) GT_CUDA(cudaMemset(o->p, 0xFF, o->bytes));  // poison
  cuda::gdn_prep_fwd(d, static_cast<char*>(ymis.p) + 2, da_.p, db_.p, ldab, dAl.p, ddt.p, qn.p, kn.p, vv.p,
                     g.as<float>(), beta.as<float>(), nullptr);
  GT_CUDA(cudaDeviceSynchronize());
  EXPECT_LE(rel_err(down_bf16(qn.p, q0.size()), qn_ref), 1e-2) << gc << " scalar";
  EXPECT_LE(rel_err(down_bf16(kn.p, k0.size()), kn_ref), 1e-2) << gc << " scalar";
  EXPECT_EQ(rel_err(down_bf16(vv.p, v0.size()), v0), 0.0) << gc << " scalar";
}

// ------------------------------------------------------------------------------------------ rule
struct RuleInputs {
  std::vector<float> q, k, v, g, beta, dout;
};
RuleInputs rule_inputs(const GdnCase& gc, uint32_t seed) {
  const int64_t T = gc.batch * gc.seq;
  std::mt19937 rng(seed);
  RuleInputs r;
  auto l2 = [&](std::vector<float> x, int64_t D) {
    std::vector<float> y(x.size());
    cpu::gdn_l2norm_fwd(x.data(), int64_t(x.size()) / D, D, 1e-6f, y.data());
    return round_bf16(y);
  };
  r.q = l2(randn(sz(T * gc.Hk * gc.Dk), rng), gc.Dk);
  r.k = l2(randn(sz(T * gc.Hk * gc.Dk), rng), gc.Dk);
  r.v = round_bf16(randn(sz(T * gc.Hv * gc.Dv), rng));
  // g as the layer makes it: -exp(A_log) softplus(a + dt_bias), a mix of slow and fast decays.
  std::uniform_real_distribution<float> u(0.f, 1.f);
  r.g.resize(sz(T * gc.Hv));
  for (auto& x : r.g) x = -std::exp(2.5f * u(rng) - 2.f) * std::log1p(std::exp(2.f * u(rng) - 1.f));
  r.beta = sigmoid_v(randn(sz(T * gc.Hv), rng));
  r.dout = round_bf16(randn(sz(T * gc.Hv * gc.Dv), rng));
  return r;
}

// Sets the rule implementation for a scope (restores the previous kernel options).
cuda::KernelOptions with_rule(cuda::GdnRuleImpl impl) {
  cuda::KernelOptions o = cuda::kernel_options();
  o.gdn_rule = impl;
  return o;
}
struct RuleImplScope : cuda::KernelOptionsScope {
  explicit RuleImplScope(cuda::GdnRuleImpl impl) : cuda::KernelOptionsScope(with_rule(impl)) {}
};
const char* impl_name(cuda::GdnRuleImpl i) { return cuda::gdn_rule_impl_name(i); }
constexpr cuda::GdnRuleImpl kImpls[3] = {cuda::GdnRuleImpl::Chunked, cuda::GdnRuleImpl::Mma,
                                         cuda::GdnRuleImpl::Simt};

// One rule fwd + bwd on the device with implementation impl; host copies of every output.
struct RuleOut {
  std::vector<float> o, states, dq, dk, dv, dg, db;
  float ms_fwd = 0, ms_bwd = 0;
};
// The kernel options of one rule run: implementation and precision; -1 keeps the installed choice of the rest
// (warp_passes 0: the tile passes; grads_b16 0: chunk_grads' fragment path; grads_shape: chunk_grads' threads a CTA
// on the bf16 operand path and, 1, its 16 x 32 warp tiles).
cuda::KernelOptions rule_options(cuda::GdnRuleImpl impl, cuda::GdnRulePrecision prec, int warp_passes, int grads_b16,
                                 std::pair<int, int> grads_shape) {
  cuda::KernelOptions o = with_rule(impl);
  o.gdn_precision = prec;
  if (warp_passes >= 0) o.gdn_passes = warp_passes ? cuda::GdnPasses::Warp : cuda::GdnPasses::Tile;
  if (grads_b16 >= 0) o.gdn_grads = grads_b16 ? cuda::GdnGrads::Bf16 : cuda::GdnGrads::Frag;
  if (grads_shape.first >= 0) o.gdn_grads_cta = grads_shape.first;
  if (grads_shape.second >= 0) o.gdn_grads_tile = grads_shape.second ? 32 : 16;
  return o;
}
// The bf16 grads variants the rule test runs beside the default one: (threads a CTA, 16 x 32 warp tiles).
constexpr std::pair<int, int> kGradsShapes[] = {{256, 0}, {384, 0}, {512, 0}, {256, 1}, {384, 1}};

void run_rule(const GdnCase& gc, const RuleInputs& in, const std::vector<int32_t>& seg, cuda::GdnRuleImpl impl,
              RuleOut& r, cuda::GdnRulePrecision prec = cuda::GdnRulePrecision::Split, int warp_passes = -1,
              int grads_b16 = -1, std::pair<int, int> grads_shape = {-1, -1}) {
  const cuda::KernelOptionsScope scope(rule_options(impl, prec, warp_passes, grads_b16, grads_shape));
  const auto d = dims_of(gc);
  const int64_t T = d.tokens(), KD = d.Hk * d.Dk, VD = d.Hv * d.Dv, NV = d.Hv;
  DevBuf q = up_bf16(in.q), k = up_bf16(in.k), v = up_bf16(in.v), g = up(in.g), beta = up(in.beta);
  DevBuf dO = up_bf16(in.dout), dseg = up(seg);
  DevBuf o(sz(T * VD) * 2), states(sz(cuda::gdn_rule_state_bytes(d)));
  DevBuf dq(sz(T * KD) * 4), dk(sz(T * KD) * 4), dv(sz(T * VD) * 4), dg(sz(T * NV) * 4), db(sz(T * NV) * 4);
  DevBuf ws(sz(cuda::gdn_rule_bwd_workspace_bytes(d))), fws(sz(cuda::gdn_rule_fwd_workspace_bytes(d)));
  const int32_t* sp = gc.segments ? dseg.as<int32_t>() : nullptr;
  cudaEvent_t e0, e1, e2;
  cudaEventCreate(&e0), cudaEventCreate(&e1), cudaEventCreate(&e2);
  cudaEventRecord(e0);
  cuda::gdn_rule_fwd(d, q.p, k.p, v.p, g.as<float>(), beta.as<float>(), sp, o.p, states.as<float>(), nullptr, fws.p);
  cudaEventRecord(e1);
  cuda::gdn_rule_bwd(d, q.p, k.p, v.p, g.as<float>(), beta.as<float>(), sp, states.as<float>(), dO.p, dq.as<float>(),
                     dk.as<float>(), dv.as<float>(), dg.as<float>(), db.as<float>(), ws.p, nullptr);
  cudaEventRecord(e2);
  GT_CUDA(cudaDeviceSynchronize());
  cudaEventElapsedTime(&r.ms_fwd, e0, e1);
  cudaEventElapsedTime(&r.ms_bwd, e1, e2);
  cudaEventDestroy(e0), cudaEventDestroy(e1), cudaEventDestroy(e2);
  r.o = down_bf16(o.p, sz(T * VD));
  r.states = down<float>(states.p, states.bytes / 4);
  r.dq = down<float>(dq.p, sz(T * KD));
  r.dk = down<float>(dk.p, sz(T * KD));
  r.dv = down<float>(dv.p, sz(T * VD));
  r.dg = down<float>(dg.p, sz(T * NV));
  r.db = down<float>(db.p, sz(T * NV));
}

// Mma against Simt (same inputs): o rel <= 5e-3, states and gradients rel <= 1e-4.
void expect_impls_agree(const RuleOut& m, const RuleOut& s, const std::string& what) {
  EXPECT_LE(rel_err(m.o, s.o), 5e-3) << "o " << what;
  EXPECT_LE(rel_err(m.states, s.states), 1e-4) << "states " << what;
  EXPECT_LE(rel_err(m.dq, s.dq), 1e-4) << "dq " << what;
  EXPECT_LE(rel_err(m.dk, s.dk), 1e-4) << "dk " << what;
  EXPECT_LE(rel_err(m.dv, s.dv), 1e-4) << "dv " << what;
  EXPECT_LE(rel_err(m.dg, s.dg), 1e-4) << "dg " << what;
  EXPECT_LE(rel_err(m.db, s.db), 1e-4) << "dbeta " << what;
}

TEST_P(GdnKernel, RuleForwardBackward) {
  REQUIRE_GPU();
  const GdnCase gc = GetParam();
  const auto d = dims_of(gc);
  const int64_t T = d.tokens(), S = gc.seq, KD = d.Hk * d.Dk, VD = d.Hv * d.Dv, NV = d.Hv;
  const auto in = rule_inputs(gc, uint32_t(T * 13 + d.Dk + d.Dv));
  const auto seg = make_segments(gc);
  cpu::GdnShape sh{S, d.Hk, d.Hv, d.Dk, d.Dv, 64};
  std::vector<float> o_ref(sz(T * VD)), dq_ref(sz(T * KD)), dk_ref(sz(T * KD)), dv_ref(sz(T * VD)), dg_ref(sz(T * NV)),
      db_ref(sz(T * NV));
  const int64_t nck = cuda::gdn_rule_num_chunks(d), DD = d.Hv * d.Dk * d.Dv;
  std::vector<float> st_ref(sz(d.batch * nck * DD));
  for (int64_t b = 0; b < gc.batch; ++b) {
    const int32_t* sg = gc.segments ? seg.data() + b * S : nullptr;
    auto off = [&](int64_t w) { return b * S * w; };
    cpu::gdn_rule_chunked_fwd(sh, in.q.data() + off(KD), in.k.data() + off(KD), in.v.data() + off(VD),
                              in.g.data() + off(NV), in.beta.data() + off(NV), sg, o_ref.data() + off(VD),
                              gc.segments ? nullptr : st_ref.data() + b * nck * DD);
    cpu::gdn_rule_chunked_bwd(sh, in.q.data() + off(KD), in.k.data() + off(KD), in.v.data() + off(VD),
                              in.g.data() + off(NV), in.beta.data() + off(NV), sg, nullptr, in.dout.data() + off(VD),
                              dq_ref.data() + off(KD), dk_ref.data() + off(KD), dv_ref.data() + off(VD),
                              dg_ref.data() + off(NV), db_ref.data() + off(NV));
  }
  // The three implementations (split products), then Chunked with bf16 products (GdnRulePrecision::Bf16), with the
  // default serial passes (the register passes where the shape allows), with the tile passes, and with the
  // register passes but chunk_grads' fragment path, and chunk_grads' bf16 path in the kGradsShapes: the same
  // tolerances except the fp32 chunk states, whose products now round their fp32 operands to bf16
  // (8 mantissa bits, as flash-linear-attention's kernels): rel <= 1e-2.
  constexpr int kVariants = 6 + int(std::size(kGradsShapes));
  RuleOut res[kVariants];
  for (int ii = 0; ii < kVariants; ++ii) {
    RuleOut& r = res[ii];
    const bool bf16 = ii >= 3, tile = ii == 4, frag = ii == 5;
    const std::pair<int, int> shape = ii >= 6 ? kGradsShapes[ii - 6] : std::pair<int, int>{-1, -1};
    const cuda::GdnRuleImpl impl = bf16 ? cuda::GdnRuleImpl::Chunked : kImpls[ii];
    run_rule(gc, in, seg, impl, r, bf16 ? cuda::GdnRulePrecision::Bf16 : cuda::GdnRulePrecision::Split,
             tile ? 0 : -1, frag ? 0 : -1, shape);
    ASSERT_FALSE(::testing::Test::HasFatalFailure()) << impl_name(impl);
    std::ostringstream name;
    name << gc << " [" << impl_name(impl) << (bf16 ? "/bf16" : "") << (tile ? "/tile" : "") << (frag ? "/frag" : "");
    if (shape.first > 0) name << "/cta" << shape.first << (shape.second ? "x32" : "");
    name << "]";
    EXPECT_LE(rel_err(r.o, o_ref), 1e-2) << name.str();
    if (!gc.segments) {  // the chunk grids agree without segments: the states are the same tensors
      EXPECT_LE(rel_err(r.states, st_ref), bf16 ? 1e-2 : 1e-3) << name.str();
    }
    expect_grad(r.dq, dq_ref, "dq " + name.str());
    expect_grad(r.dk, dk_ref, "dk " + name.str());
    expect_grad(r.dv, dv_ref, "dv " + name.str());
    expect_grad(r.dg, dg_ref, "dg " + name.str());
    expect_grad(r.db, db_ref, "dbeta " + name.str());
    if (bf16)
      std::printf("[gdn-bf16] %s rel o %.2e states %.2e dq %.2e dk %.2e dv %.2e dg %.2e dbeta %.2e; cos dq %.6f dk %.6f "
                  "dg %.6f\n",
                  name.str().c_str(), rel_err(r.o, o_ref), gc.segments ? 0.0 : rel_err(r.states, st_ref),
                  rel_err(r.dq, dq_ref), rel_err(r.dk, dk_ref), rel_err(r.dv, dv_ref), rel_err(r.dg, dg_ref),
                  rel_err(r.db, db_ref), cosine(r.dq.data(), dq_ref.data(), r.dq.size()),
                  cosine(r.dk.data(), dk_ref.data(), r.dk.size()), cosine(r.dg.data(), dg_ref.data(), r.dg.size()));
  }
  std::ostringstream cm, ms;
  cm << gc << " [chunked vs mma]";
  ms << gc << " [mma vs simt]";
  expect_impls_agree(res[0], res[1], cm.str());
  expect_impls_agree(res[1], res[2], ms.str());
  // chunk_grads' bf16 operand path rounds as the fragment path does; only the summation order may differ (the
  // forward and the states are the same kernels: equal).
  const RuleOut &b16 = res[3], &frag = res[5];
  EXPECT_EQ(rel_err(b16.o, frag.o), 0.0) << gc << " o [bf16 vs frag grads]";
  for (auto [x, y, what] : {std::tuple{&b16.dq, &frag.dq, "dq"}, {&b16.dk, &frag.dk, "dk"}, {&b16.dv, &frag.dv, "dv"},
                            {&b16.dg, &frag.dg, "dg"}, {&b16.db, &frag.db, "dbeta"}})
    EXPECT_LE(rel_err(*x, *y), 1e-5) << gc << " " << what << " [bf16 vs frag grads]";
  std::printf("[gdn-grads] %s bf16 vs frag grads: rel dq %.2e dk %.2e dv %.2e dg %.2e dbeta %.2e\n",
              testing::PrintToString(gc).c_str(), rel_err(b16.dq, frag.dq), rel_err(b16.dk, frag.dk),
              rel_err(b16.dv, frag.dv), rel_err(b16.dg, frag.dg), rel_err(b16.db, frag.db));
  // The CTA sizes change only the order of the <S0, dS> sum (dgam of the chunk's last row), the warp tiles nothing.
  for (int ii = 6; ii < kVariants; ++ii) {
    const RuleOut& c = res[ii];
    for (auto [x, y, what] : {std::tuple{&c.dq, &b16.dq, "dq"}, {&c.dk, &b16.dk, "dk"}, {&c.dv, &b16.dv, "dv"},
                              {&c.dg, &b16.dg, "dg"}, {&c.db, &b16.db, "dbeta"}})
      EXPECT_LE(rel_err(*x, *y), 1e-5) << gc << " " << what << " [bf16 grads, cta " << kGradsShapes[ii - 6].first
                                       << (kGradsShapes[ii - 6].second ? " x32" : "") << "]";
  }
}

// ------------------------------------------------------------------------------------------ gated norm
TEST_P(GdnKernel, GatedNormForwardBackward) {
  REQUIRE_GPU();
  const GdnCase gc = GetParam();
  const auto d = dims_of(gc);
  const int64_t T = d.tokens(), nvec = T * d.Hv, D = d.Dv;
  std::mt19937 rng{uint32_t(T * 17 + D)};
  auto o = round_bf16(randn(sz(nvec * D), rng, 0.3f)), z = round_bf16(randn(sz(nvec * D), rng));
  auto w = round_bf16(randn(sz(D), rng, 0.3f, 1.f)), dy = round_bf16(randn(sz(nvec * D), rng));
  auto dw0 = randn(sz(D), rng);
  const float eps = 1e-6f;
  std::vector<float> y_ref(o.size()), dx_ref(o.size()), dz_ref(o.size()), dw_ref = dw0, rstd_ref(sz(nvec));
  cpu::gdn_gated_rmsnorm_fwd(o.data(), z.data(), w.data(), nvec, D, eps, y_ref.data());
  cpu::gdn_gated_rmsnorm_bwd(o.data(), z.data(), w.data(), dy.data(), nvec, D, eps, dx_ref.data(), dz_ref.data(),
                             dw_ref.data());
  for (int64_t i = 0; i < nvec; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < D; ++j) ss += double(o[sz(i * D + j)]) * o[sz(i * D + j)];
    rstd_ref[sz(i)] = float(1.0 / std::sqrt(ss / double(D) + eps));
  }
  for (int64_t i = 0; i < D; ++i) dw_ref[sz(i)] -= dw0[sz(i)];
  // z (and dz) as slices of rows of stride ldz: VD (dense), VD + 8 (the 4-entry path), VD + 2 (the scalar one).
  const int64_t VD = d.Hv * D;
  for (const int64_t ldz : {VD, VD + 8, VD + 2}) {
    const float pad = 3.f;
    DevBuf go = up_bf16(o), gz = up_bf16(strided(z, T, VD, ldz, pad)), gw = up_bf16(w), gdy = up_bf16(dy);
    DevBuf gdw = up(dw0), y(o.size() * 2), rstd(sz(nvec) * 4), gdx(o.size() * 2);
    DevBuf gdz = up_bf16(std::vector<float>(sz(T * ldz), pad));
    DevBuf ws(sz(cuda::gdn_gated_norm_bwd_workspace_bytes(d)));
    cuda::gdn_gated_norm_fwd(d, go.p, gz.p, ldz, gw.p, eps, y.p, rstd.as<float>(), nullptr);
    cuda::gdn_gated_norm_bwd(d, go.p, gz.p, ldz, gw.p, eps, rstd.as<float>(), gdy.p, gdx.p, gdz.p, gdw.as<float>(),
                             ws.p, nullptr);
    GT_CUDA(cudaDeviceSynchronize());
    const std::string at = " ldz " + std::to_string(ldz);
    EXPECT_LE(rel_err(down_bf16(y.p, o.size()), y_ref), 1e-2) << gc << at;
    EXPECT_LE(rel_err(down<float>(rstd.p, sz(nvec)), rstd_ref), 1e-3) << gc << at;
    EXPECT_LE(rel_err(down_bf16(gdx.p, o.size()), dx_ref), 1e-2) << gc << at;
    const auto dz_w = down_bf16(gdz.p, sz(T * ldz));
    EXPECT_LE(rel_err(dense(dz_w, T, VD, ldz), dz_ref), 1e-2) << gc << at;
    EXPECT_EQ(pad_changed(dz_w, T, VD, ldz, pad), 0) << gc << at;
    auto dw_got = down<float>(gdw.p, sz(D));
    for (int64_t i = 0; i < D; ++i) dw_got[sz(i)] -= dw0[sz(i)];
    expect_grad(dw_got, dw_ref, "gated norm dw" + at);
  }
}

// ------------------------------------------------------------------------------------------ decode
TEST_P(GdnKernel, DecodeStepMatchesCpuSteps) {
  REQUIRE_GPU();
  GdnCase gc = GetParam();
  auto d = dims_of(gc);
  const int64_t n = gc.batch, C = d.conv_ch(), K = d.K, KD = d.Hk * d.Dk, NV = d.Hv, VD = NV * d.Dv, ldx = C + 16;
  d.seq = 1;
  std::mt19937 rng{uint32_t(n * 19 + C)};
  auto w = round_bf16(randn(sz(C * K), rng, 0.5f));
  auto A_log = round_bf16(randn(sz(NV), rng, 0.5f, 1.f)), dt = round_bf16(randn(sz(NV), rng, 0.5f));
  // A mid-sequence start: non-zero conv windows and recurrent states.
  auto conv_st = randn(sz(n * C * (K - 1)), rng), rec_st = randn(sz(n * NV * d.Dk * d.Dv), rng, 0.3f);
  DevBuf gw = up_bf16(w), gA = up_bf16(A_log), gdt = up_bf16(dt), gconv = up(conv_st), grec = up(rec_st);
  DevBuf go(sz(n * VD) * 2);
  for (int step = 0; step < 4; ++step) {
    auto qkv = round_bf16(randn(sz(n * ldx), rng)), a = round_bf16(randn(sz(n * NV), rng));
    auto b = round_bf16(randn(sz(n * NV), rng));
    std::vector<float> o_ref(sz(n * VD));
    for (int64_t r = 0; r < n; ++r) {
      std::vector<float> y(sz(C)), q(sz(KD)), k(sz(KD)), g(sz(NV)), beta(sz(NV));
      cpu::gdn_conv_silu_step(&qkv[sz(r * ldx)], w.data(), C, K, &conv_st[sz(r * C * (K - 1))], y.data());
      cpu::gdn_l2norm_fwd(y.data(), d.Hk, d.Dk, 1e-6f, q.data());
      cpu::gdn_l2norm_fwd(y.data() + KD, d.Hk, d.Dk, 1e-6f, k.data());
      cpu::gdn_gates_fwd(&a[sz(r * NV)], &b[sz(r * NV)], A_log.data(), dt.data(), 1, NV, g.data(), beta.data());
      cpu::gdn_rule_step(q.data(), k.data(), y.data() + 2 * KD, g.data(), beta.data(), d.Hk, NV, d.Dk, d.Dv,
                         &rec_st[sz(r * NV * d.Dk * d.Dv)], &o_ref[sz(r * VD)]);
    }
    DevBuf gq = up_bf16(qkv), ga = up_bf16(a), gb = up_bf16(b);
    cuda::gdn_decode_step(d, gq.p, ldx, gw.p, ga.p, gb.p, gA.p, gdt.p, gconv.as<float>(), grec.as<float>(), go.p,
                          nullptr);
    GT_CUDA(cudaDeviceSynchronize());
    EXPECT_LE(rel_err(down_bf16(go.p, sz(n * VD)), o_ref), 1e-2) << gc << " step " << step;
  }
  EXPECT_LE(rel_err(down<float>(gconv.p, conv_st.size()), conv_st), 1e-6) << gc;
  EXPECT_LE(rel_err(down<float>(grec.p, rec_st.size()), rec_st), 1e-3) << gc;
}

INSTANTIATE_TEST_SUITE_P(
    GdnKernelShapes, GdnKernel,
    ::testing::Values(GdnCase{1, 37, 2, 2, 16, 16, false}, GdnCase{2, 100, 2, 6, 24, 32, true},
                      GdnCase{3, 130, 1, 3, 64, 64, true}, GdnCase{1, 130, 2, 2, 128, 128, false},
                      GdnCase{2, 70, 1, 3, 128, 128, true}, GdnCase{2, 64, 2, 2, 64, 128, false},
                      GdnCase{1, 200, 1, 2, 128, 64, true}, GdnCase{3, 1, 1, 1, 32, 16, false},
                      // the register passes with three warps (Dv 48), three chunks, segments
                      GdnCase{2, 150, 2, 6, 64, 48, true}),
    [](const auto& info) {
      std::ostringstream s;
      s << info.param;
      return s.str();
    });

// The backward has no atomics: two runs give the same bits.
class GdnKernelDeterminism : public ::testing::TestWithParam<cuda::GdnRuleImpl> {};
TEST_P(GdnKernelDeterminism, RuleBackwardIsDeterministic) {
  REQUIRE_GPU();
  RuleImplScope scope(GetParam());
  const GdnCase gc{2, 150, 2, 6, 128, 128, true};
  const auto d = dims_of(gc);
  const int64_t T = d.tokens(), KD = d.Hk * d.Dk, VD = d.Hv * d.Dv;
  const auto in = rule_inputs(gc, 23);
  const auto seg = make_segments(gc);
  DevBuf q = up_bf16(in.q), k = up_bf16(in.k), v = up_bf16(in.v), g = up(in.g), beta = up(in.beta);
  DevBuf dO = up_bf16(in.dout), dseg = up(seg), o(sz(T * VD) * 2), states(sz(cuda::gdn_rule_state_bytes(d)));
  DevBuf ws(sz(cuda::gdn_rule_bwd_workspace_bytes(d)));
  cuda::gdn_rule_fwd(d, q.p, k.p, v.p, g.as<float>(), beta.as<float>(), dseg.as<int32_t>(), o.p, states.as<float>(),
                     nullptr, ws.p);
  std::vector<float> first;
  for (int rep = 0; rep < 2; ++rep) {
    DevBuf dq(sz(T * KD) * 4), dk(sz(T * KD) * 4), dv(sz(T * VD) * 4), dg(sz(T * d.Hv) * 4), db(sz(T * d.Hv) * 4);
    cuda::gdn_rule_bwd(d, q.p, k.p, v.p, g.as<float>(), beta.as<float>(), dseg.as<int32_t>(), states.as<float>(),
                       dO.p, dq.as<float>(), dk.as<float>(), dv.as<float>(), dg.as<float>(), db.as<float>(), ws.p,
                       nullptr);
    auto all = down<float>(dq.p, sz(T * KD));
    for (auto* b : {&dk, &dv, &dg, &db}) {
      auto x = down<float>(b->p, b->bytes / 4);
      all.insert(all.end(), x.begin(), x.end());
    }
    if (rep == 0)
      first = all;
    else
      EXPECT_EQ(std::memcmp(first.data(), all.data(), all.size() * 4), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Impls, GdnKernelDeterminism, ::testing::ValuesIn(kImpls),
                         [](const auto& info) { return std::string(impl_name(info.param)); });

// The 27B layer shape runs (shared-memory configuration at Dk = Dv = 128, Hv = 3 Hk) and gives finite
// results; prints the time of rule fwd + bwd (bench/gpu/bench_deltanet.cu has the full timing table).
TEST(GdnKernelShape, Qwen27BLayerRuns) {
  REQUIRE_GPU();
  const GdnCase gc{8, 1024, 16, 48, 128, 128, false};
  const auto in = rule_inputs(gc, 29);
  const std::vector<int32_t> seg(sz(gc.batch * gc.seq), 0);
  auto finite = [](const std::vector<float>& x) {
    return std::all_of(x.begin(), x.end(), [](float y) { return std::isfinite(y); });
  };
  RuleOut res[3];
  for (int ii = 0; ii < 3; ++ii) {
    RuleOut& r = res[ii];
    run_rule(gc, in, seg, kImpls[ii], r);
    ASSERT_FALSE(::testing::Test::HasFatalFailure()) << impl_name(kImpls[ii]);
    std::printf("[27B shape, first call, %s] gdn_rule_fwd %.3f ms, gdn_rule_bwd %.3f ms\n", impl_name(kImpls[ii]),
                r.ms_fwd, r.ms_bwd);
    const char* nm = impl_name(kImpls[ii]);
    EXPECT_TRUE(finite(r.o)) << nm;
    EXPECT_TRUE(finite(r.states)) << nm;
    EXPECT_TRUE(finite(r.dq)) << nm;
    EXPECT_TRUE(finite(r.dk)) << nm;
    EXPECT_TRUE(finite(r.dv)) << nm;
    EXPECT_TRUE(finite(r.dg)) << nm;
    EXPECT_TRUE(finite(r.db)) << nm;
  }
  expect_impls_agree(res[0], res[1], "27B shape [chunked vs mma]");
  expect_impls_agree(res[1], res[2], "27B shape [mma vs simt]");
  // Chunked with bf16 products against the split ones at this shape (16 chunks of state recurrence), with the
  // register passes (the default) and the tile passes.
  RuleOut b16, b16t;
  run_rule(gc, in, seg, cuda::GdnRuleImpl::Chunked, b16t, cuda::GdnRulePrecision::Bf16, 0);
  run_rule(gc, in, seg, cuda::GdnRuleImpl::Chunked, b16, cuda::GdnRulePrecision::Bf16);
  const RuleOut& sp = res[0];
  std::printf("[27B shape, chunked/bf16/tile] fwd %.3f ms, bwd %.3f ms; rel to split: o %.2e states %.2e dq %.2e dk "
              "%.2e dv %.2e dg %.2e dbeta %.2e\n",
              b16t.ms_fwd, b16t.ms_bwd, rel_err(b16t.o, sp.o), rel_err(b16t.states, sp.states),
              rel_err(b16t.dq, sp.dq), rel_err(b16t.dk, sp.dk), rel_err(b16t.dv, sp.dv), rel_err(b16t.dg, sp.dg),
              rel_err(b16t.db, sp.db));
  std::printf("[27B shape, chunked/bf16] fwd %.3f ms, bwd %.3f ms; rel to split: o %.2e states %.2e dq %.2e dk %.2e "
              "dv %.2e dg %.2e dbeta %.2e\n",
              b16.ms_fwd, b16.ms_bwd, rel_err(b16.o, sp.o), rel_err(b16.states, sp.states), rel_err(b16.dq, sp.dq),
              rel_err(b16.dk, sp.dk), rel_err(b16.dv, sp.dv), rel_err(b16.dg, sp.dg), rel_err(b16.db, sp.db));
  EXPECT_LE(rel_err(b16.o, sp.o), 1e-2);
  EXPECT_LE(rel_err(b16.states, sp.states), 1e-2);
  for (auto [got, ref, nm] : {std::tuple{&b16.dq, &sp.dq, "dq"}, std::tuple{&b16.dk, &sp.dk, "dk"},
                              std::tuple{&b16.dv, &sp.dv, "dv"}, std::tuple{&b16.dg, &sp.dg, "dg"},
                              std::tuple{&b16.db, &sp.db, "dbeta"}})
    expect_grad(*got, *ref, std::string(nm) + " 27B shape [chunked/bf16 vs split]");
}

}  // namespace
