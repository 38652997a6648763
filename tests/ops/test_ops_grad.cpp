// Per-op checks of the fp32 CPU reference: backward vs finite differences, forward vs naive formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "grad_check.h"

using namespace lt;
using namespace lt::cpu;
using lt::test::dotd;
using lt::test::expect_grad;
using lt::test::randn;

namespace {
std::vector<float> zeros(size_t n) { return std::vector<float>(n, 0.0f); }
std::vector<float> ones_plus(size_t n, uint64_t seed, float s) {
  auto v = randn(n, seed, s);
  for (auto& x : v) x += 1.0f;
  return v;
}
}  // namespace

TEST(Ops, RmsNormGradients) {
  const int64_t n = 5, d = 24;
  const float eps = 1e-6f;
  auto x = randn(n * d, 1), w = ones_plus(d, 2, 0.2f), r = randn(n * d, 3);
  auto f = [&] {
    std::vector<float> y(n * d);
    rmsnorm_fwd(x.data(), w.data(), n, d, eps, y.data());
    return dotd(y, r);
  };
  auto dx = zeros(n * d), dw = zeros(d);
  rmsnorm_bwd(x.data(), w.data(), r.data(), n, d, eps, dx.data(), dw.data());
  expect_grad(f, x, dx, "rmsnorm dx");
  expect_grad(f, w, dw, "rmsnorm dw");
}

TEST(Ops, RmsNormForwardMatchesFormula) {
  const int64_t n = 3, d = 10;
  auto x = randn(n * d, 4), w = ones_plus(d, 5, 0.3f);
  std::vector<float> y(n * d);
  rmsnorm_fwd(x.data(), w.data(), n, d, 1e-5f, y.data());
  for (int64_t r = 0; r < n; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += double(x[r * d + i]) * x[r * d + i];
    const double rs = 1.0 / std::sqrt(ss / d + 1e-5);
    for (int64_t i = 0; i < d; ++i) EXPECT_NEAR(y[r * d + i], w[i] * x[r * d + i] * rs, 1e-6);
  }
}

TEST(Ops, RmsNormBackwardAccumulatesDw) {
  const int64_t n = 4, d = 8;
  auto x = randn(n * d, 6), w = ones_plus(d, 7, 0.1f), dy = randn(n * d, 8);
  auto dx = zeros(n * d), dw_once = zeros(d), dw_split = zeros(d);
  rmsnorm_bwd(x.data(), w.data(), dy.data(), n, d, 1e-6f, dx.data(), dw_once.data());
  // Split rows into two calls: row-order accumulation gives the same bits.
  rmsnorm_bwd(x.data(), w.data(), dy.data(), 1, d, 1e-6f, dx.data(), dw_split.data());
  rmsnorm_bwd(x.data() + d, w.data(), dy.data() + d, n - 1, d, 1e-6f, dx.data() + d, dw_split.data());
  EXPECT_EQ(dw_once, dw_split);
}

TEST(Ops, LinearGradients) {
  const int64_t n = 4, in = 10, out = 6;
  auto x = randn(n * in, 10), w = randn(out * in, 11, 0.3f), b = randn(out, 12), r = randn(n * out, 13);
  auto f = [&] {
    std::vector<float> y(n * out);
    linear_fwd(x.data(), w.data(), b.data(), n, in, out, y.data());
    return dotd(y, r);
  };
  // Forward vs the formula.
  std::vector<float> y(n * out);
  linear_fwd(x.data(), w.data(), b.data(), n, in, out, y.data());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = b[o];
      for (int64_t k = 0; k < in; ++k) s += double(x[i * in + k]) * w[o * in + k];
      EXPECT_NEAR(y[i * out + o], s, 1e-5);
    }
  auto dx = zeros(n * in), dw = zeros(out * in), db = zeros(out);
  linear_bwd(x.data(), w.data(), r.data(), n, in, out, dx.data(), dw.data(), db.data());
  expect_grad(f, x, dx, "linear dx");
  expect_grad(f, w, dw, "linear dw");
  expect_grad(f, b, db, "linear db");
  // Accumulation: a second backward doubles dw/db, and accumulate_dx doubles dx.
  auto dw1 = dw, db1 = db, dx1 = dx;
  linear_bwd(x.data(), w.data(), r.data(), n, in, out, dx.data(), dw.data(), db.data(), true);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_FLOAT_EQ(dw[i], 2 * dw1[i]);
  for (size_t i = 0; i < db.size(); ++i) EXPECT_FLOAT_EQ(db[i], 2 * db1[i]);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_FLOAT_EQ(dx[i], 2 * dx1[i]);
}

TEST(Ops, RopeIsRotationAndBackwardIsTranspose) {
  const int64_t n = 3, heads = 2, D = 8;
  const int32_t pos[n] = {0, 5, 37};
  auto inv = rope_inv_freq(D, 10000.0, RopeScaling{});
  ASSERT_EQ(inv.size(), size_t(D / 2));
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_NEAR(inv[1], std::pow(10000.0, -2.0 / 8), 1e-7);
  auto x = randn(n * heads * D, 20), r = randn(n * heads * D, 21);
  auto f = [&] {
    auto y = x;
    rope_fwd(y.data(), n, heads, D, pos, inv.data());
    return dotd(y, r);
  };
  auto g = r;
  rope_bwd(g.data(), n, heads, D, pos, inv.data());
  expect_grad(f, x, g, "rope dx");
  // Position 0 is the identity; the rotation keeps norms; bwd(fwd(x)) == x.
  auto y = x;
  rope_fwd(y.data(), n, heads, D, pos, inv.data());
  for (int64_t i = 0; i < heads * D; ++i) EXPECT_EQ(y[i], x[i]);
  EXPECT_NEAR(lt::test::norm2(y), lt::test::norm2(x), 1e-4);
  rope_bwd(y.data(), n, heads, D, pos, inv.data());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
  // Rotate-half pairing: element i pairs with i + D/2 at angle pos * inv_freq[i].
  std::vector<float> e(heads * D, 0.0f);
  e[1] = 1.0f;
  const int32_t p7 = 7;
  rope_fwd(e.data(), 1, heads, D, &p7, inv.data());
  EXPECT_NEAR(e[1], std::cos(7 * inv[1]), 1e-6);
  EXPECT_NEAR(e[1 + D / 2], std::sin(7 * inv[1]), 1e-6);
}

TEST(Ops, RopeLlama3Scaling) {
  RopeScaling sc;
  sc.type = "llama3";
  sc.factor = 8;
  sc.low_freq_factor = 1;
  sc.high_freq_factor = 4;
  sc.original_max_position_embeddings = 64;
  const int64_t D = 16;
  auto base = rope_inv_freq(D, 500000.0, RopeScaling{});
  auto scaled = rope_inv_freq(D, 500000.0, sc);
  const double two_pi = 2 * M_PI;
  int n_hi = 0, n_lo = 0, n_mid = 0;
  for (size_t i = 0; i < base.size(); ++i) {
    const double wl = two_pi / base[i];
    if (wl < 64.0 / 4) {  // high frequency: unchanged
      EXPECT_EQ(scaled[i], base[i]);
      ++n_hi;
    } else if (wl > 64.0 / 1) {  // low frequency: divided by factor
      EXPECT_FLOAT_EQ(scaled[i], base[i] / 8);
      ++n_lo;
    } else {  // in between: interpolated
      const double s = (64.0 / wl - 1) / (4 - 1);
      EXPECT_NEAR(scaled[i], (1 - s) * base[i] / 8 + s * base[i], 1e-6 * base[i]);
      ++n_mid;
    }
  }
  EXPECT_GT(n_hi, 0);
  EXPECT_GT(n_lo, 0);
  EXPECT_GT(n_mid, 0);
  sc.type = "yarn";
  EXPECT_THROW(rope_inv_freq(D, 1e4, sc), lt::Error);
}

TEST(Ops, QkNormGradients) {
  const int64_t n = 3, heads = 2, D = 8;
  auto x = randn(n * heads * D, 30), w = ones_plus(D, 31, 0.2f), r = randn(n * heads * D, 32);
  auto f = [&] {
    std::vector<float> y(x.size());
    qk_norm_fwd(x.data(), w.data(), n, heads, D, 1e-6f, y.data());
    return dotd(y, r);
  };
  auto dx = zeros(x.size()), dw = zeros(D);
  qk_norm_bwd(x.data(), w.data(), r.data(), n, heads, D, 1e-6f, dx.data(), dw.data());
  expect_grad(f, x, dx, "qk_norm dx");
  expect_grad(f, w, dw, "qk_norm dw");
}

namespace {
// Naive attention in double with an explicit mask, for checking the forward.
std::vector<float> naive_attention(const AttnShape& s, const std::vector<float>& q, const std::vector<float>& k,
                                   const std::vector<float>& v, const int32_t* seg) {
  const int64_t S = s.seq, H = s.heads, D = s.head_dim, KVH = s.kv_heads, grp = H / KVH;
  std::vector<float> out(S * H * D);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < S; ++i) {
      std::vector<double> p(S, 0.0);
      double m = -1e300, sum = 0;
      for (int64_t j = 0; j <= i; ++j) {
        if (seg && seg[j] != seg[i]) continue;
        double sc = 0;
        for (int64_t d = 0; d < D; ++d) sc += double(q[(i * H + h) * D + d]) * k[(j * KVH + h / grp) * D + d];
        p[j] = sc * s.scale;
        m = std::max(m, p[j]);
      }
      for (int64_t j = 0; j <= i; ++j) {
        if (seg && seg[j] != seg[i]) { p[j] = 0; continue; }
        p[j] = std::exp(p[j] - m);
        sum += p[j];
      }
      for (int64_t d = 0; d < D; ++d) {
        double o = 0;
        for (int64_t j = 0; j <= i; ++j) o += p[j] / sum * v[(j * KVH + h / grp) * D + d];
        out[(i * H + h) * D + d] = float(o);
      }
    }
  return out;
}

void attention_case(const int32_t* seg, uint64_t seed, int64_t seq = 7, int64_t heads = 4, int64_t kv_heads = 2) {
  AttnShape s;
  s.seq = seq;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.head_dim = 8;
  s.scale = 1.0f / std::sqrt(8.0f);
  const int64_t qn = s.seq * s.heads * s.head_dim, kn = s.seq * s.kv_heads * s.head_dim;
  auto q = randn(qn, seed), k = randn(kn, seed + 1), v = randn(kn, seed + 2), r = randn(qn, seed + 3);
  std::vector<float> out(qn), lse(s.heads * s.seq);
  attention_fwd(s, q.data(), k.data(), v.data(), seg, out.data(), lse.data());
  auto ref = naive_attention(s, q, k, v, seg);
  for (int64_t i = 0; i < qn; ++i) EXPECT_NEAR(out[i], ref[i], 1e-5) << "attention forward " << i;
  auto f = [&] {
    std::vector<float> o(qn);
    attention_fwd(s, q.data(), k.data(), v.data(), seg, o.data(), nullptr);
    return dotd(o, r);
  };
  std::vector<float> dq(qn), dk(kn), dv(kn);
  attention_bwd(s, q.data(), k.data(), v.data(), seg, out.data(), lse.data(), r.data(), dq.data(), dk.data(), dv.data());
  expect_grad(f, q, dq, "attention dq");
  expect_grad(f, k, dk, "attention dk");
  expect_grad(f, v, dv, "attention dv");
}
}  // namespace

TEST(Ops, AttentionCausalGqa) { attention_case(nullptr, 40); }

TEST(Ops, AttentionSegmentMask) {
  const int32_t seg[7] = {0, 0, 0, 1, 1, 2, 2};
  attention_case(seg, 50);
}

TEST(Ops, AttentionSeveralQueryBlocks) {
  // 300 rows span two query blocks (256 + 44); segments cut across the block boundary.
  std::vector<int32_t> seg(300);
  for (int i = 0; i < 300; ++i) seg[size_t(i)] = i < 100 ? 0 : (i < 270 ? 1 : 2);
  attention_case(seg.data(), 55, 300, 2, 1);
  attention_case(nullptr, 56, 300, 2, 2);
}

TEST(Ops, AttentionPackedEqualsSeparate) {
  // Two sequences packed in one row of 3+4 tokens give the same outputs as each alone.
  AttnShape s;
  s.heads = 2;
  s.kv_heads = 1;
  s.head_dim = 4;
  s.scale = 0.5f;
  const int64_t w = s.heads * s.head_dim, kw = s.kv_heads * s.head_dim;
  auto q = randn(7 * w, 60), k = randn(7 * kw, 61), v = randn(7 * kw, 62);
  const int32_t seg[7] = {3, 3, 3, 9, 9, 9, 9};
  std::vector<float> packed(7 * w), a(3 * w), b(4 * w);
  s.seq = 7;
  attention_fwd(s, q.data(), k.data(), v.data(), seg, packed.data(), nullptr);
  s.seq = 3;
  attention_fwd(s, q.data(), k.data(), v.data(), nullptr, a.data(), nullptr);
  s.seq = 4;
  attention_fwd(s, q.data() + 3 * w, k.data() + 3 * kw, v.data() + 3 * kw, nullptr, b.data(), nullptr);
  for (int64_t i = 0; i < 3 * w; ++i) EXPECT_FLOAT_EQ(packed[i], a[i]);
  for (int64_t i = 0; i < 4 * w; ++i) EXPECT_FLOAT_EQ(packed[3 * w + i], b[i]);
}

TEST(Ops, AttentionDecodeMatchesLastRow) {
  AttnShape s;
  s.seq = 9;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 8;
  s.scale = 0.35f;
  const int64_t w = s.heads * s.head_dim, kw = s.kv_heads * s.head_dim;
  auto q = randn(s.seq * w, 70), k = randn(s.seq * kw, 71), v = randn(s.seq * kw, 72);
  std::vector<float> out(s.seq * w), dec(w);
  attention_fwd(s, q.data(), k.data(), v.data(), nullptr, out.data(), nullptr);
  attention_decode(s, q.data() + (s.seq - 1) * w, k.data(), v.data(), s.seq, dec.data());
  for (int64_t i = 0; i < w; ++i) EXPECT_NEAR(dec[i], out[(s.seq - 1) * w + i], 1e-6);
}

TEST(Ops, SwiGluGradients) {
  const int64_t n = 3, f_ = 7;
  auto g = randn(n * f_, 80, 2.0f), u = randn(n * f_, 81), r = randn(n * f_, 82);
  auto f = [&] {
    std::vector<float> a(n * f_);
    swiglu_fwd(g.data(), u.data(), n, f_, a.data());
    return dotd(a, r);
  };
  std::vector<float> a(n * f_);
  swiglu_fwd(g.data(), u.data(), n, f_, a.data());
  for (int64_t i = 0; i < n * f_; ++i) EXPECT_NEAR(a[i], g[i] / (1 + std::exp(-double(g[i]))) * u[i], 1e-6);
  std::vector<float> dg(n * f_), du(n * f_);
  swiglu_bwd(g.data(), u.data(), r.data(), n, f_, dg.data(), du.data());
  expect_grad(f, g, dg, "swiglu dgate");
  expect_grad(f, u, du, "swiglu dup");
}

TEST(Ops, EmbeddingForwardBackward) {
  const int64_t V = 5, H = 3;
  auto emb = randn(V * H, 90);
  const int32_t ids[4] = {2, 0, 2, 4};
  std::vector<float> x(4 * H);
  embedding_fwd(emb.data(), V, H, ids, 4, x.data());
  for (int t = 0; t < 4; ++t)
    for (int i = 0; i < H; ++i) EXPECT_EQ(x[t * H + i], emb[ids[t] * H + i]);
  auto dx = randn(4 * H, 91);
  auto demb = zeros(V * H);
  embedding_bwd(ids, 4, H, dx.data(), demb.data());
  for (int i = 0; i < H; ++i) {
    EXPECT_FLOAT_EQ(demb[2 * H + i], dx[0 * H + i] + dx[2 * H + i]);  // repeated id adds
    EXPECT_EQ(demb[1 * H + i], 0.0f);
  }
  const int32_t bad[1] = {5};
  EXPECT_THROW(embedding_fwd(emb.data(), V, H, bad, 1, x.data()), lt::Error);
}

TEST(Ops, CrossEntropyLossAndGradient) {
  const int64_t n = 4, V = 11;
  auto z = randn(n * V, 100, 2.0f);
  const int32_t tg[n] = {3, -100, 10, 0};
  double loss = 0;
  int64_t nv = 0;
  auto zc = z;
  cross_entropy(zc.data(), tg, n, V, 1.0f, false, &loss, &nv);
  EXPECT_EQ(zc, z);  // unchanged without grad
  EXPECT_EQ(nv, 3);
  double ref = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (tg[r] < 0) continue;
    double s = 0;
    for (int64_t i = 0; i < V; ++i) s += std::exp(double(z[r * V + i]));
    ref += std::log(s) - z[r * V + tg[r]];
  }
  EXPECT_NEAR(loss, ref, 1e-5 * std::fabs(ref));
  auto f = [&] {
    auto t = z;
    double l = 0;
    int64_t c = 0;
    cross_entropy(t.data(), tg, n, V, 1.0f, false, &l, &c);
    return l;
  };
  auto g = z;
  double l2 = 0;
  int64_t c2 = 0;
  cross_entropy(g.data(), tg, n, V, 1.0f, true, &l2, &c2);
  for (int64_t i = 0; i < V; ++i) EXPECT_EQ(g[1 * V + i], 0.0f);  // ignored row
  expect_grad(f, z, g, "cross_entropy dlogits");
  // Gradient scale applies linearly.
  auto g2 = z;
  cross_entropy(g2.data(), tg, n, V, 0.25f, true, &l2, &c2);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g2[i], 0.25f * g[i], 1e-7);
}

TEST(Ops, CrossEntropyAllIgnoredAndBadTarget) {
  const int64_t V = 4;
  auto z = randn(2 * V, 110);
  const int32_t tg[2] = {-100, -100};
  double loss = 0;
  int64_t nv = 0;
  cross_entropy(z.data(), tg, 2, V, 1.0f, true, &loss, &nv);
  EXPECT_EQ(loss, 0.0);
  EXPECT_EQ(nv, 0);
  for (auto v : z) EXPECT_EQ(v, 0.0f);
  const int32_t bad[1] = {4};
  EXPECT_THROW(cross_entropy(z.data(), bad, 1, V, 1.0f, true, &loss, &nv), lt::Error);
}
