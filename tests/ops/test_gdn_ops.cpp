// Gated DeltaNet reference ops: gradients vs finite differences, forwards vs formulas, segment isolation,
// decode steps vs full forwards, and the chunked delta rule (forward and backward) vs the recurrence.
#include <gtest/gtest.h>
#include <omp.h>
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/cpu/ops_gdn.h"
#include "grad_check.h"

using namespace lt::cpu;
using lt::test::dotd;
using lt::test::expect_grad;
using lt::test::norm2;
using lt::test::randn;

namespace {

std::vector<float> zeros(size_t n) { return std::vector<float>(n, 0.0f); }

std::vector<float> uniform(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// Random vectors of length D, L2-normalised as the layer does before the delta rule.
std::vector<float> unit_rows(int64_t n_vec, int64_t D, uint64_t seed) {
  auto x = randn(size_t(n_vec * D), seed);
  std::vector<float> y(x.size());
  gdn_l2norm_fwd(x.data(), n_vec, D, 1e-6f, y.data());
  return y;
}

// ||a - b|| / ||b||
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double dd = 0;
  for (size_t i = 0; i < a.size(); ++i) dd += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  const double nb = norm2(b);
  return nb == 0 ? std::sqrt(dd) : std::sqrt(dd) / nb;
}

// seg ids from segment lengths.
std::vector<int32_t> segments(const std::vector<int64_t>& lens) {
  std::vector<int32_t> seg;
  int32_t id = 7;
  for (auto n : lens) {
    for (int64_t i = 0; i < n; ++i) seg.push_back(id);
    id += 3;
  }
  return seg;
}

// rows [t0, t0 + n) of a row-major [S, width] array.
std::vector<float> rows(const std::vector<float>& x, int64_t width, int64_t t0, int64_t n) {
  return std::vector<float>(x.begin() + t0 * width, x.begin() + (t0 + n) * width);
}

// ---------------------------------------------------------------- delta-rule inputs
struct Rule {
  GdnShape s;
  std::vector<float> q, k, v, g, beta;
  Rule(GdnShape sh, uint64_t seed, float g_lo = -3.0f, float g_hi = -1e-4f, float b_lo = 0.02f, float b_hi = 0.98f)
      : s(sh),
        q(unit_rows(sh.S * sh.Hk, sh.Dk, seed)),
        k(unit_rows(sh.S * sh.Hk, sh.Dk, seed + 1)),
        v(randn(size_t(sh.S * sh.Hv * sh.Dv), seed + 2)),
        g(uniform(size_t(sh.S * sh.Hv), seed + 3, g_lo, g_hi)),
        beta(uniform(size_t(sh.S * sh.Hv), seed + 4, b_lo, b_hi)) {}
  size_t nq() const { return size_t(s.S * s.Hk * s.Dk); }
  size_t no() const { return size_t(s.S * s.Hv * s.Dv); }
  size_t ng() const { return size_t(s.S * s.Hv); }
  std::vector<float> recurrent(const int32_t* seg) const {
    std::vector<float> o(no());
    gdn_rule_recurrent_fwd(s, q.data(), k.data(), v.data(), g.data(), beta.data(), seg, o.data());
    return o;
  }
  std::vector<float> chunked(const int32_t* seg, std::vector<float>* states = nullptr) const {
    std::vector<float> o(no());
    if (states) states->assign(size_t(gdn_rule_num_chunks(s, seg) * s.Hv * s.Dk * s.Dv), -1.0f);
    gdn_rule_chunked_fwd(s, q.data(), k.data(), v.data(), g.data(), beta.data(), seg, o.data(),
                         states ? states->data() : nullptr);
    return o;
  }
};

struct RuleGrads {
  std::vector<float> dq, dk, dv, dg, dbeta;
  explicit RuleGrads(const Rule& r)
      : dq(r.nq(), 99.0f), dk(r.nq(), 99.0f), dv(r.no(), 99.0f), dg(r.ng(), 99.0f), dbeta(r.ng(), 99.0f) {}
};

RuleGrads recurrent_bwd(const Rule& r, const int32_t* seg, const std::vector<float>& dout) {
  RuleGrads gr(r);
  gdn_rule_recurrent_bwd(r.s, r.q.data(), r.k.data(), r.v.data(), r.g.data(), r.beta.data(), seg, dout.data(),
                         gr.dq.data(), gr.dk.data(), gr.dv.data(), gr.dg.data(), gr.dbeta.data());
  return gr;
}

RuleGrads chunked_bwd(const Rule& r, const int32_t* seg, const std::vector<float>& dout, const float* states) {
  RuleGrads gr(r);
  gdn_rule_chunked_bwd(r.s, r.q.data(), r.k.data(), r.v.data(), r.g.data(), r.beta.data(), seg, states, dout.data(),
                       gr.dq.data(), gr.dk.data(), gr.dv.data(), gr.dg.data(), gr.dbeta.data());
  return gr;
}

// Independent double-precision oracle of the recurrence straight from the formula (one segment).
std::vector<double> naive_rule(const Rule& r) {
  const auto& s = r.s;
  const int64_t group = s.Hv / s.Hk;
  const double scale = 1.0 / std::sqrt(double(s.Dk));
  std::vector<double> o(r.no());
  for (int64_t h = 0; h < s.Hv; ++h) {
    const int64_t kh = h / group;
    std::vector<double> St(size_t(s.Dk * s.Dv), 0.0);
    for (int64_t t = 0; t < s.S; ++t) {
      const float* q = &r.q[size_t((t * s.Hk + kh) * s.Dk)];
      const float* k = &r.k[size_t((t * s.Hk + kh) * s.Dk)];
      const float* v = &r.v[size_t((t * s.Hv + h) * s.Dv)];
      const double a = std::exp(double(r.g[size_t(t * s.Hv + h)])), b = r.beta[size_t(t * s.Hv + h)];
      for (auto& x : St) x *= a;
      for (int64_t c = 0; c < s.Dv; ++c) {
        double kv = 0;
        for (int64_t d = 0; d < s.Dk; ++d) kv += St[size_t(d * s.Dv + c)] * k[d];
        const double delta = b * (v[c] - kv);
        for (int64_t d = 0; d < s.Dk; ++d) St[size_t(d * s.Dv + c)] += k[d] * delta;
        double oc = 0;
        for (int64_t d = 0; d < s.Dk; ++d) oc += St[size_t(d * s.Dv + c)] * scale * q[d];
        o[size_t((t * s.Hv + h) * s.Dv + c)] = oc;
      }
    }
  }
  return o;
}

void expect_grads_close(const RuleGrads& a, const RuleGrads& b, double tol, const char* what) {
  const double eq = rel_err(a.dq, b.dq), ek = rel_err(a.dk, b.dk), ev = rel_err(a.dv, b.dv),
               eg = rel_err(a.dg, b.dg), eb = rel_err(a.dbeta, b.dbeta);
  printf("  %s: rel err dq %.2e dk %.2e dv %.2e dg %.2e dbeta %.2e\n", what, eq, ek, ev, eg, eb);
  EXPECT_LE(eq, tol) << what << " dq";
  EXPECT_LE(ek, tol) << what << " dk";
  EXPECT_LE(ev, tol) << what << " dv";
  EXPECT_LE(eg, tol) << what << " dg";
  EXPECT_LE(eb, tol) << what << " dbeta";
}

}  // namespace

// ================================================================ conv1d + SiLU

TEST(GdnConv, ForwardMatchesFormula) {
  const int64_t S = 11, C = 5, K = 4;
  const auto seg = segments({6, 5});
  auto x = randn(size_t(S * C), 1), w = randn(size_t(C * K), 2, 0.5f);
  std::vector<float> y(size_t(S * C));
  gdn_conv_silu_fwd(x.data(), w.data(), S, C, K, seg.data(), y.data());
  for (int64_t t = 0; t < S; ++t) {
    const int64_t start = t < 6 ? 0 : 6;
    for (int64_t c = 0; c < C; ++c) {
      double p = 0;
      for (int64_t i = 0; i < K; ++i) {
        const int64_t r = t - (K - 1) + i;
        if (r >= start) p += double(w[size_t(c * K + i)]) * x[size_t(r * C + c)];
      }
      EXPECT_NEAR(y[size_t(t * C + c)], p / (1.0 + std::exp(-p)), 1e-6) << t << "," << c;
    }
  }
}

TEST(GdnConv, Gradients) {
  for (int64_t K : {4, 2}) {
    const int64_t S = 13, C = 6;
    const auto seg = segments({5, 1, 7});
    auto x = randn(size_t(S * C), 10 + K), w = randn(size_t(C * K), 20 + K, 0.5f), r = randn(size_t(S * C), 30 + K);
    auto f = [&] {
      std::vector<float> y(size_t(S * C));
      gdn_conv_silu_fwd(x.data(), w.data(), S, C, K, seg.data(), y.data());
      return dotd(y, r);
    };
    auto dx = zeros(size_t(S * C)), dw = zeros(size_t(C * K));
    gdn_conv_silu_bwd(x.data(), w.data(), r.data(), S, C, K, seg.data(), dx.data(), dw.data());
    expect_grad(f, x, dx, "conv dx K=" + std::to_string(K));
    expect_grad(f, w, dw, "conv dw K=" + std::to_string(K));
    // Without segments too.
    auto f1 = [&] {
      std::vector<float> y(size_t(S * C));
      gdn_conv_silu_fwd(x.data(), w.data(), S, C, K, nullptr, y.data());
      return dotd(y, r);
    };
    std::fill(dw.begin(), dw.end(), 0.0f);
    gdn_conv_silu_bwd(x.data(), w.data(), r.data(), S, C, K, nullptr, dx.data(), dw.data());
    expect_grad(f1, x, dx, "conv dx (no seg) K=" + std::to_string(K));
    expect_grad(f1, w, dw, "conv dw (no seg) K=" + std::to_string(K));
  }
}

TEST(GdnConv, SegmentsAreIsolated) {
  const int64_t C = 4, K = 4, S0 = 9, S1 = 8, S = S0 + S1;
  const auto seg = segments({S0, S1});
  auto x = randn(size_t(S * C), 40), w = randn(size_t(C * K), 41, 0.5f), dy = randn(size_t(S * C), 42);
  std::vector<float> y(size_t(S * C)), y2(size_t(S * C));
  gdn_conv_silu_fwd(x.data(), w.data(), S, C, K, seg.data(), y.data());
  auto x2 = x;
  for (int64_t i = 0; i < S0 * C; ++i) x2[size_t(i)] += 1.0f;  // change segment 0 only
  gdn_conv_silu_fwd(x2.data(), w.data(), S, C, K, seg.data(), y2.data());
  for (int64_t i = S0 * C; i < S * C; ++i) EXPECT_EQ(y[size_t(i)], y2[size_t(i)]) << i;
  EXPECT_NE(y[0], y2[0]);
  // Packed == each segment alone, forward and backward; dw accumulates in row order across calls.
  std::vector<float> ya(size_t(S0 * C)), yb(size_t(S1 * C));
  gdn_conv_silu_fwd(x.data(), w.data(), S0, C, K, nullptr, ya.data());
  gdn_conv_silu_fwd(x.data() + S0 * C, w.data(), S1, C, K, nullptr, yb.data());
  EXPECT_EQ(rows(y, C, 0, S0), ya);
  EXPECT_EQ(rows(y, C, S0, S1), yb);
  auto dx = zeros(size_t(S * C)), dw = zeros(size_t(C * K)), dxs = zeros(size_t(S * C)), dws = zeros(size_t(C * K));
  gdn_conv_silu_bwd(x.data(), w.data(), dy.data(), S, C, K, seg.data(), dx.data(), dw.data());
  gdn_conv_silu_bwd(x.data(), w.data(), dy.data(), S0, C, K, nullptr, dxs.data(), dws.data());
  gdn_conv_silu_bwd(x.data() + S0 * C, w.data(), dy.data() + S0 * C, S1, C, K, nullptr, dxs.data() + S0 * C,
                    dws.data());
  EXPECT_EQ(dx, dxs);
  EXPECT_EQ(dw, dws);
}

TEST(GdnConv, StepMatchesFullConv) {
  for (int64_t K : {4, 2}) {
    const int64_t C = 7, S = 12;
    const auto seg = segments({5, 7});
    auto x = randn(size_t(S * C), 50 + K), w = randn(size_t(C * K), 60 + K, 0.5f);
    std::vector<float> y(size_t(S * C)), state(size_t(C * (K - 1))), yt(static_cast<size_t>(C));
    gdn_conv_silu_fwd(x.data(), w.data(), S, C, K, seg.data(), y.data());
    for (int64_t t = 0; t < S; ++t) {
      if (t == 0 || seg[size_t(t)] != seg[size_t(t - 1)]) std::fill(state.begin(), state.end(), 0.0f);
      gdn_conv_silu_step(x.data() + t * C, w.data(), C, K, state.data(), yt.data());
      EXPECT_EQ(yt, rows(y, C, t, 1)) << "K=" << K << " row " << t;
    }
    // The state holds the last K-1 inputs of the last segment, oldest first.
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < K - 1; ++i)
        EXPECT_EQ(state[size_t(c * (K - 1) + i)], x[size_t((S - (K - 1) + i) * C + c)]);
  }
}

// ================================================================ L2 norm, gates, gated RMSNorm

TEST(GdnL2Norm, ForwardAndGradients) {
  const int64_t n = 6, D = 16;
  const float eps = 1e-6f;
  auto x = randn(size_t(n * D), 70), r = randn(size_t(n * D), 71);
  std::vector<float> y(size_t(n * D));
  gdn_l2norm_fwd(x.data(), n, D, eps, y.data());
  for (int64_t v = 0; v < n; ++v) {
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += double(x[size_t(v * D + i)]) * x[size_t(v * D + i)];
    for (int64_t i = 0; i < D; ++i)
      EXPECT_NEAR(y[size_t(v * D + i)], x[size_t(v * D + i)] / std::sqrt(ss + eps), 1e-6);
  }
  auto f = [&] {
    std::vector<float> yy(size_t(n * D));
    gdn_l2norm_fwd(x.data(), n, D, eps, yy.data());
    return dotd(yy, r);
  };
  auto dx = zeros(size_t(n * D));
  gdn_l2norm_bwd(x.data(), r.data(), n, D, eps, dx.data());
  expect_grad(f, x, dx, "l2norm dx");
}

TEST(GdnGates, ForwardAndGradients) {
  const int64_t S = 7, Hv = 3;
  auto a = randn(size_t(S * Hv), 80, 2.0f), b = randn(size_t(S * Hv), 81, 2.0f);
  auto A_log = uniform(size_t(Hv), 82, std::log(0.5f), std::log(8.0f)), dt = randn(size_t(Hv), 83, 0.5f);
  auto r1 = randn(size_t(S * Hv), 84), r2 = randn(size_t(S * Hv), 85);
  std::vector<float> g(size_t(S * Hv)), beta(size_t(S * Hv));
  gdn_gates_fwd(a.data(), b.data(), A_log.data(), dt.data(), S, Hv, g.data(), beta.data());
  for (int64_t t = 0; t < S; ++t)
    for (int64_t h = 0; h < Hv; ++h) {
      const size_t i = size_t(t * Hv + h);
      const double z = double(a[i]) + dt[size_t(h)];
      EXPECT_NEAR(g[i], -std::exp(double(A_log[size_t(h)])) * std::log1p(std::exp(z)), 1e-5 * (1 + std::fabs(g[i])));
      EXPECT_NEAR(beta[i], 1.0 / (1.0 + std::exp(-double(b[i]))), 1e-6);
      EXPECT_LT(g[i], 0.0f);
    }
  auto f = [&] {
    std::vector<float> gg(size_t(S * Hv)), bb(size_t(S * Hv));
    gdn_gates_fwd(a.data(), b.data(), A_log.data(), dt.data(), S, Hv, gg.data(), bb.data());
    return dotd(gg, r1) + dotd(bb, r2);
  };
  auto da = zeros(size_t(S * Hv)), db = zeros(size_t(S * Hv)), dA = zeros(static_cast<size_t>(Hv)), ddt = zeros(static_cast<size_t>(Hv));
  gdn_gates_bwd(a.data(), b.data(), A_log.data(), dt.data(), r1.data(), r2.data(), S, Hv, da.data(), db.data(),
                dA.data(), ddt.data());
  expect_grad(f, a, da, "gates da");
  expect_grad(f, b, db, "gates db");
  expect_grad(f, A_log, dA, "gates dA_log");
  expect_grad(f, dt, ddt, "gates ddt_bias");
  // Torch softplus threshold: identity above 20, gradient 1.
  const float a_big = 25.0f, b0 = 0.0f, al = 0.0f, dt0 = 0.0f, one = 1.0f;
  float gb, bb, dab, dbb, dAb = 0, ddtb = 0;
  gdn_gates_fwd(&a_big, &b0, &al, &dt0, 1, 1, &gb, &bb);
  EXPECT_EQ(gb, -25.0f);
  EXPECT_EQ(bb, 0.5f);
  gdn_gates_bwd(&a_big, &b0, &al, &dt0, &one, &one, 1, 1, &dab, &dbb, &dAb, &ddtb);
  EXPECT_EQ(dab, -1.0f);
  EXPECT_EQ(ddtb, -1.0f);
  EXPECT_EQ(dAb, -25.0f);
  EXPECT_EQ(dbb, 0.25f);
}

TEST(GdnGatedRmsNorm, ForwardAndGradients) {
  const int64_t n = 5, D = 12;
  const float eps = 1e-6f;
  auto x = randn(size_t(n * D), 90), z = randn(size_t(n * D), 91, 1.5f), w = uniform(size_t(D), 92, 0.5f, 1.5f);
  auto r = randn(size_t(n * D), 93);
  std::vector<float> y(size_t(n * D));
  gdn_gated_rmsnorm_fwd(x.data(), z.data(), w.data(), n, D, eps, y.data());
  for (int64_t v = 0; v < n; ++v) {
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += double(x[size_t(v * D + i)]) * x[size_t(v * D + i)];
    const double rs = 1.0 / std::sqrt(ss / D + eps);
    for (int64_t i = 0; i < D; ++i) {
      const double zz = z[size_t(v * D + i)];
      EXPECT_NEAR(y[size_t(v * D + i)], w[size_t(i)] * x[size_t(v * D + i)] * rs * zz / (1 + std::exp(-zz)), 1e-5);
    }
  }
  auto f = [&] {
    std::vector<float> yy(size_t(n * D));
    gdn_gated_rmsnorm_fwd(x.data(), z.data(), w.data(), n, D, eps, yy.data());
    return dotd(yy, r);
  };
  auto dx = zeros(size_t(n * D)), dz = zeros(size_t(n * D)), dw = zeros(static_cast<size_t>(D));
  gdn_gated_rmsnorm_bwd(x.data(), z.data(), w.data(), r.data(), n, D, eps, dx.data(), dz.data(), dw.data());
  expect_grad(f, x, dx, "gated rmsnorm dx");
  expect_grad(f, z, dz, "gated rmsnorm dz");
  expect_grad(f, w, dw, "gated rmsnorm dw");
  // dw accumulates in vector order: two calls == one.
  auto dw2 = zeros(static_cast<size_t>(D));
  gdn_gated_rmsnorm_bwd(x.data(), z.data(), w.data(), r.data(), 2, D, eps, dx.data(), dz.data(), dw2.data());
  gdn_gated_rmsnorm_bwd(x.data() + 2 * D, z.data() + 2 * D, w.data(), r.data() + 2 * D, n - 2, D, eps, dx.data(),
                        dz.data(), dw2.data());
  EXPECT_EQ(dw, dw2);
}

// ================================================================ delta rule, forward

TEST(GdnRule, RecurrentMatchesNaiveDouble) {
  Rule r({23, 2, 6, 8, 5, 64}, 100);
  const auto o = r.recurrent(nullptr);
  const auto ref = naive_rule(r);
  std::vector<float> reff(ref.begin(), ref.end());
  const double e = rel_err(o, reff);
  printf("  recurrent vs double formula: rel err %.2e\n", e);
  EXPECT_LE(e, 1e-6);
}

TEST(GdnRule, StepMatchesRecurrent) {
  Rule r({19, 2, 4, 8, 6, 64}, 110);
  const auto seg = segments({8, 11});
  const auto o = r.recurrent(seg.data());
  const auto& s = r.s;
  std::vector<float> state(size_t(s.Hv * s.Dk * s.Dv)), ot(size_t(s.Hv * s.Dv));
  for (int64_t t = 0; t < s.S; ++t) {
    if (t == 0 || seg[size_t(t)] != seg[size_t(t - 1)]) std::fill(state.begin(), state.end(), 0.0f);
    gdn_rule_step(&r.q[size_t(t * s.Hk * s.Dk)], &r.k[size_t(t * s.Hk * s.Dk)], &r.v[size_t(t * s.Hv * s.Dv)],
                  &r.g[size_t(t * s.Hv)], &r.beta[size_t(t * s.Hv)], s.Hk, s.Hv, s.Dk, s.Dv, state.data(), ot.data());
    EXPECT_EQ(ot, rows(o, s.Hv * s.Dv, t, 1)) << "row " << t;
  }
}

TEST(GdnRule, ChunkedMatchesRecurrent) {
  struct Case {
    const char* name;
    GdnShape s;
    float g_lo, g_hi, b_lo, b_hi;
  };
  const Case cases[] = {
      {"S=37 chunk 16 Dk!=Dv", {37, 2, 2, 16, 24, 16}, -3.0f, -1e-4f, 0.02f, 0.98f},
      {"S=130 chunk 64 Hv=2Hk", {130, 1, 2, 16, 16, 64}, -3.0f, -1e-4f, 0.02f, 0.98f},
      {"S=45 chunk 16 Hv=3Hk", {45, 2, 6, 8, 12, 16}, -3.0f, -1e-4f, 0.02f, 0.98f},
      {"S=64 chunk 64 exact", {64, 1, 1, 16, 8, 64}, -3.0f, -1e-4f, 0.02f, 0.98f},
      {"fast decay g in [-20,-5)", {70, 1, 2, 16, 12, 32}, -20.0f, -5.0f, 0.02f, 0.98f},
      {"g near 0", {70, 1, 2, 16, 12, 32}, -1e-3f, -1e-7f, 0.02f, 0.98f},
      {"beta near 0", {70, 1, 2, 16, 12, 32}, -3.0f, -1e-4f, 1e-4f, 1e-2f},
      {"beta near 1", {70, 1, 2, 16, 12, 32}, -3.0f, -1e-4f, 0.99f, 0.9999f},
      {"beta near 1, g near 0", {70, 1, 2, 16, 12, 32}, -1e-3f, -1e-7f, 0.99f, 0.9999f},
      {"chunk 1", {9, 1, 1, 4, 4, 1}, -3.0f, -1e-4f, 0.02f, 0.98f},
      {"extreme decay g in [-300,-50) (exp underflows)", {40, 1, 2, 8, 8, 16}, -300.0f, -50.0f, 0.02f, 0.98f},
      {"S=300 Hk=2 Hv=4 (threaded path)", {300, 2, 4, 16, 16, 64}, -3.0f, -1e-4f, 0.02f, 0.98f},
  };
  uint64_t seed = 200;
  for (const auto& c : cases) {
    Rule r(c.s, seed += 10, c.g_lo, c.g_hi, c.b_lo, c.b_hi);
    std::vector<float> states;
    const auto oc = r.chunked(nullptr, &states), orr = r.recurrent(nullptr);
    const double e = rel_err(oc, orr);
    printf("  %s: rel err %.2e\n", c.name, e);
    EXPECT_LE(e, 1e-5) << c.name;
    // chunk_states[ci] == the recurrent state after row ci*chunk - 1 (replayed with the step).
    const auto& s = r.s;
    const int64_t DD = s.Hv * s.Dk * s.Dv;
    std::vector<float> state(size_t(DD), 0.0f), ot(size_t(s.Hv * s.Dv));
    double worst = 0;
    for (int64_t t = 0; t < s.S; ++t) {
      if (t % s.chunk == 0) {
        const auto saved = rows(states, DD, t / s.chunk, 1);
        worst = std::max(worst, t == 0 ? norm2(saved) : rel_err(saved, state));
      }
      gdn_rule_step(&r.q[size_t(t * s.Hk * s.Dk)], &r.k[size_t(t * s.Hk * s.Dk)], &r.v[size_t(t * s.Hv * s.Dv)],
                    &r.g[size_t(t * s.Hv)], &r.beta[size_t(t * s.Hv)], s.Hk, s.Hv, s.Dk, s.Dv, state.data(),
                    ot.data());
    }
    EXPECT_LE(worst, 1e-5) << c.name << " chunk states";
  }
}

TEST(GdnRule, ChunkedSegmentsMatchSeparateRuns) {
  const std::vector<int64_t> lens = {20, 45, 7, 1, 33};
  const auto seg = segments(lens);
  GdnShape s{int64_t(seg.size()), 2, 4, 8, 12, 16};
  Rule r(s, 300);
  std::vector<float> states;
  const auto o = r.chunked(seg.data(), &states);
  const auto orr = r.recurrent(seg.data());
  EXPECT_LE(rel_err(o, orr), 1e-5);
  EXPECT_EQ(gdn_rule_num_chunks(s, seg.data()), 2 + 3 + 1 + 1 + 3);
  const auto dout = randn(r.no(), 301);
  const auto gc = chunked_bwd(r, seg.data(), dout, states.data());
  int64_t t0 = 0;
  for (int64_t n : lens) {
    GdnShape s1 = s;
    s1.S = n;
    Rule r1(s1, 0);
    r1.q = rows(r.q, s.Hk * s.Dk, t0, n);
    r1.k = rows(r.k, s.Hk * s.Dk, t0, n);
    r1.v = rows(r.v, s.Hv * s.Dv, t0, n);
    r1.g = rows(r.g, s.Hv, t0, n);
    r1.beta = rows(r.beta, s.Hv, t0, n);
    EXPECT_EQ(r1.chunked(nullptr), rows(o, s.Hv * s.Dv, t0, n)) << "segment at " << t0;
    EXPECT_EQ(r1.recurrent(nullptr), rows(orr, s.Hv * s.Dv, t0, n)) << "segment at " << t0;
    const auto g1 = chunked_bwd(r1, nullptr, rows(dout, s.Hv * s.Dv, t0, n), nullptr);
    EXPECT_EQ(g1.dq, rows(gc.dq, s.Hk * s.Dk, t0, n)) << "segment at " << t0;
    EXPECT_EQ(g1.dk, rows(gc.dk, s.Hk * s.Dk, t0, n)) << "segment at " << t0;
    EXPECT_EQ(g1.dv, rows(gc.dv, s.Hv * s.Dv, t0, n)) << "segment at " << t0;
    EXPECT_EQ(g1.dg, rows(gc.dg, s.Hv, t0, n)) << "segment at " << t0;
    EXPECT_EQ(g1.dbeta, rows(gc.dbeta, s.Hv, t0, n)) << "segment at " << t0;
    t0 += n;
  }
  // Changing segment 0 leaves the other segments' outputs unchanged.
  Rule r2 = r;
  for (int64_t i = 0; i < lens[0] * s.Hv * s.Dv; ++i) r2.v[size_t(i)] += 0.5f;
  const auto o2 = r2.chunked(seg.data());
  EXPECT_EQ(rows(o2, s.Hv * s.Dv, lens[0], s.S - lens[0]), rows(o, s.Hv * s.Dv, lens[0], s.S - lens[0]));
}

// ================================================================ delta rule, backward

TEST(GdnRule, RecurrentBackwardGradients) {
  const auto seg = segments({4, 7});
  GdnShape s{11, 1, 2, 4, 5, 64};
  Rule r(s, 400);
  const auto dout = randn(r.no(), 401);
  for (const int32_t* sg : {static_cast<const int32_t*>(nullptr), seg.data()}) {
    const auto gr = recurrent_bwd(r, sg, dout);
    auto f = [&] { return dotd(r.recurrent(sg), dout); };
    const std::string tag = sg ? " (segments)" : "";
    expect_grad(f, r.q, gr.dq, "rule dq" + tag);
    expect_grad(f, r.k, gr.dk, "rule dk" + tag);
    expect_grad(f, r.v, gr.dv, "rule dv" + tag);
    expect_grad(f, r.g, gr.dg, "rule dg" + tag);
    expect_grad(f, r.beta, gr.dbeta, "rule dbeta" + tag);
  }
}

TEST(GdnRule, ChunkedBackwardMatchesRecurrent) {
  struct Case {
    const char* name;
    GdnShape s;
    std::vector<int64_t> lens;  // empty: no segments
    float g_lo, g_hi, b_lo, b_hi;
  };
  const Case cases[] = {
      {"S=37 chunk 16 Dk!=Dv", {37, 2, 2, 16, 24, 16}, {}, -3.0f, -1e-4f, 0.02f, 0.98f},
      {"S=130 chunk 64 Hv=2Hk", {130, 1, 2, 16, 16, 64}, {}, -3.0f, -1e-4f, 0.02f, 0.98f},
      {"Hv=3Hk segments", {61, 2, 6, 8, 12, 16}, {17, 30, 1, 13}, -3.0f, -1e-4f, 0.02f, 0.98f},
      {"segments chunk 8", {50, 1, 2, 8, 8, 8}, {9, 16, 25}, -3.0f, -1e-4f, 0.02f, 0.98f},
      {"fast decay", {40, 1, 2, 8, 8, 16}, {}, -20.0f, -5.0f, 0.02f, 0.98f},
      {"g near 0", {40, 1, 2, 8, 8, 16}, {}, -1e-3f, -1e-7f, 0.02f, 0.98f},
      {"beta near 0", {40, 1, 2, 8, 8, 16}, {}, -3.0f, -1e-4f, 1e-4f, 1e-2f},
      {"beta near 1", {40, 1, 2, 8, 8, 16}, {}, -3.0f, -1e-4f, 0.99f, 0.9999f},
      {"extreme decay", {40, 1, 2, 8, 8, 16}, {10, 30}, -300.0f, -50.0f, 0.02f, 0.98f},
      {"S=300 Hk=2 Hv=4 (threaded path)", {300, 2, 4, 16, 16, 64}, {100, 77, 123}, -3.0f, -1e-4f, 0.02f, 0.98f},
  };
  uint64_t seed = 500;
  for (const auto& c : cases) {
    Rule r(c.s, seed += 10, c.g_lo, c.g_hi, c.b_lo, c.b_hi);
    const auto seg = segments(c.lens);
    const int32_t* sg = c.lens.empty() ? nullptr : seg.data();
    const auto dout = randn(r.no(), seed + 5);
    std::vector<float> states;
    r.chunked(sg, &states);
    const auto ref = recurrent_bwd(r, sg, dout);
    const auto with_states = chunked_bwd(r, sg, dout, states.data());
    const auto recomputed = chunked_bwd(r, sg, dout, nullptr);
    expect_grads_close(with_states, ref, 1e-4, c.name);
    EXPECT_EQ(with_states.dq, recomputed.dq) << c.name;
    EXPECT_EQ(with_states.dk, recomputed.dk) << c.name;
    EXPECT_EQ(with_states.dv, recomputed.dv) << c.name;
    EXPECT_EQ(with_states.dg, recomputed.dg) << c.name;
    EXPECT_EQ(with_states.dbeta, recomputed.dbeta) << c.name;
  }
}

// The chunked backward against finite differences of the chunked forward directly (small case, segments).
TEST(GdnRule, ChunkedBackwardGradients) {
  const auto seg = segments({6, 9});
  GdnShape s{15, 1, 2, 4, 3, 4};
  Rule r(s, 600);
  const auto dout = randn(r.no(), 601);
  const auto gr = chunked_bwd(r, seg.data(), dout, nullptr);
  auto f = [&] { return dotd(r.chunked(seg.data()), dout); };
  expect_grad(f, r.q, gr.dq, "chunked dq");
  expect_grad(f, r.k, gr.dk, "chunked dk");
  expect_grad(f, r.v, gr.dv, "chunked dv");
  expect_grad(f, r.g, gr.dg, "chunked dg");
  expect_grad(f, r.beta, gr.dbeta, "chunked dbeta");
}

// The demo's shape (Dk = Dv = 32, chunk 64, Hv = 2 Hk) with decays whose products underflow fp32 within a
// chunk (flushed to zero inside the ops): chunked vs recurrent forward and backward, and the caller's
// floating-point control state is left as it was.
TEST(GdnRule, ChunkedDemoShapeMatchesRecurrent) {
  struct Case {
    const char* name;
    float g_lo, g_hi;
    std::vector<int64_t> lens;
  };
  const Case cases[] = {{"g in [-3, 0)", -3.0f, -1e-4f, {}},
                        {"g in [-8, -2) (decay products below FLT_MIN)", -8.0f, -2.0f, {}},
                        {"segments, g in [-3, 0)", -3.0f, -1e-4f, {70, 5, 53}}};
  uint64_t seed = 700;
  for (const auto& c : cases) {
    GdnShape s{128, 2, 4, 32, 32, 64};
    Rule r(s, seed += 10, c.g_lo, c.g_hi);
    const auto seg = segments(c.lens);
    const int32_t* sg = c.lens.empty() ? nullptr : seg.data();
    const unsigned csr = _mm_getcsr();
    std::vector<float> states;
    const auto oc = r.chunked(sg, &states);
    const double e = rel_err(oc, r.recurrent(sg));
    printf("  %s: rel err %.2e\n", c.name, e);
    EXPECT_LE(e, 1e-5) << c.name;
    const auto dout = randn(r.no(), seed + 5);
    expect_grads_close(chunked_bwd(r, sg, dout, states.data()), recurrent_bwd(r, sg, dout), 1e-4, c.name);
    EXPECT_EQ(_mm_getcsr(), csr) << c.name;
  }
}

// Results do not depend on where the inputs sit in memory (alignment of the rows) nor on the OpenMP thread
// count (a shape above the parallel threshold).
TEST(GdnRule, ChunkedIndependentOfAlignmentAndThreads) {
  GdnShape s{300, 2, 4, 24, 40, 64};
  Rule r(s, 800);
  const auto dout = randn(r.no(), 801);
  std::vector<float> states;
  const auto o = r.chunked(nullptr, &states);
  const auto gr = chunked_bwd(r, nullptr, dout, states.data());
  // Shifted copies (one float off the original alignment).
  auto shifted = [](const std::vector<float>& x) {
    std::vector<float> y(x.size() + 1);
    std::copy(x.begin(), x.end(), y.begin() + 1);
    return y;
  };
  const auto q1 = shifted(r.q), k1 = shifted(r.k), v1 = shifted(r.v), g1 = shifted(r.g), b1 = shifted(r.beta),
             d1 = shifted(dout);
  std::vector<float> o1(r.no() + 1), st1(states.size() + 1);
  gdn_rule_chunked_fwd(s, q1.data() + 1, k1.data() + 1, v1.data() + 1, g1.data() + 1, b1.data() + 1, nullptr,
                       o1.data() + 1, st1.data() + 1);
  EXPECT_EQ(std::vector<float>(o1.begin() + 1, o1.end()), o);
  EXPECT_EQ(std::vector<float>(st1.begin() + 1, st1.end()), states);
  std::vector<float> dq(r.nq() + 1), dk(r.nq() + 1), dv(r.no() + 1), dg(r.ng() + 1), db(r.ng() + 1);
  gdn_rule_chunked_bwd(s, q1.data() + 1, k1.data() + 1, v1.data() + 1, g1.data() + 1, b1.data() + 1, nullptr,
                       st1.data() + 1, d1.data() + 1, dq.data() + 1, dk.data() + 1, dv.data() + 1, dg.data() + 1,
                       db.data() + 1);
  EXPECT_EQ(std::vector<float>(dq.begin() + 1, dq.end()), gr.dq);
  EXPECT_EQ(std::vector<float>(dk.begin() + 1, dk.end()), gr.dk);
  EXPECT_EQ(std::vector<float>(dv.begin() + 1, dv.end()), gr.dv);
  EXPECT_EQ(std::vector<float>(dg.begin() + 1, dg.end()), gr.dg);
  EXPECT_EQ(std::vector<float>(db.begin() + 1, db.end()), gr.dbeta);
  // One thread vs several.
  const int saved = omp_get_max_threads();
  for (int threads : {1, 3}) {
    omp_set_num_threads(threads);
    std::vector<float> st2;
    EXPECT_EQ(r.chunked(nullptr, &st2), o) << threads << " threads";
    EXPECT_EQ(st2, states) << threads << " threads";
    const auto g2 = chunked_bwd(r, nullptr, dout, st2.data());
    EXPECT_EQ(g2.dq, gr.dq) << threads << " threads";
    EXPECT_EQ(g2.dk, gr.dk) << threads << " threads";
    EXPECT_EQ(g2.dv, gr.dv) << threads << " threads";
    EXPECT_EQ(g2.dg, gr.dg) << threads << " threads";
    EXPECT_EQ(g2.dbeta, gr.dbeta) << threads << " threads";
  }
  omp_set_num_threads(saved);
}

// The conv at the demo's width (C = 256, several 8-lane blocks and a tail when C = 259): packed sequences ==
// each alone, one thread == several, and the decode step == the full forward.
TEST(GdnConv, WideChannelsSplitsThreadsAndStep) {
  for (int64_t C : {256, 259}) {
    const int64_t K = 4, S0 = 40, S1 = 33, S = S0 + S1;
    const auto seg = segments({S0, S1});
    auto x = randn(size_t(S * C), 900 + C), w = randn(size_t(C * K), 901, 0.5f), dy = randn(size_t(S * C), 902);
    std::vector<float> y(size_t(S * C)), ys(size_t(S * C));
    gdn_conv_silu_fwd(x.data(), w.data(), S, C, K, seg.data(), y.data());
    gdn_conv_silu_fwd(x.data(), w.data(), S0, C, K, nullptr, ys.data());
    gdn_conv_silu_fwd(x.data() + S0 * C, w.data(), S1, C, K, nullptr, ys.data() + S0 * C);
    EXPECT_EQ(y, ys) << C;
    auto dx = zeros(size_t(S * C)), dw = zeros(size_t(C * K)), dxs = zeros(size_t(S * C)), dws = zeros(size_t(C * K));
    gdn_conv_silu_bwd(x.data(), w.data(), dy.data(), S, C, K, seg.data(), dx.data(), dw.data());
    gdn_conv_silu_bwd(x.data(), w.data(), dy.data(), S0, C, K, nullptr, dxs.data(), dws.data());
    gdn_conv_silu_bwd(x.data() + S0 * C, w.data(), dy.data() + S0 * C, S1, C, K, nullptr, dxs.data() + S0 * C,
                      dws.data());
    EXPECT_EQ(dx, dxs) << C;
    EXPECT_EQ(dw, dws) << C;
    const int saved = omp_get_max_threads();
    omp_set_num_threads(saved == 1 ? 2 : 1);
    std::vector<float> y2(size_t(S * C));
    auto dx2 = zeros(size_t(S * C)), dw2 = zeros(size_t(C * K));
    gdn_conv_silu_fwd(x.data(), w.data(), S, C, K, seg.data(), y2.data());
    gdn_conv_silu_bwd(x.data(), w.data(), dy.data(), S, C, K, seg.data(), dx2.data(), dw2.data());
    omp_set_num_threads(saved);
    EXPECT_EQ(y2, y) << C;
    EXPECT_EQ(dx2, dx) << C;
    EXPECT_EQ(dw2, dw) << C;
    std::vector<float> state(size_t(C * (K - 1)), 0.0f), yt(static_cast<size_t>(C));
    for (int64_t t = 0; t < S0; ++t) {
      gdn_conv_silu_step(x.data() + t * C, w.data(), C, K, state.data(), yt.data());
      EXPECT_EQ(yt, rows(y, C, t, 1)) << "C=" << C << " row " << t;
    }
    // Against the formula (the vector exp of the SiLU).
    double worst = 0;
    for (int64_t t = 0; t < S0; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double p = 0;
        for (int64_t i = 0; i < K; ++i) {
          const int64_t r = t - (K - 1) + i;
          if (r >= 0) p += double(w[size_t(c * K + i)]) * x[size_t(r * C + c)];
        }
        worst = std::max(worst, std::fabs(y[size_t(t * C + c)] - p / (1.0 + std::exp(-p))) / (1.0 + std::fabs(p)));
      }
    EXPECT_LE(worst, 1e-6) << C;
  }
}
