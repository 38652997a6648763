// The fp32 CPU reference of causal GQA attention (src/backend/cpu/ops_attention.cpp) on bf16-rounded random
// inputs, for the GPU attention tests (our kernels and cuDNN's): inputs, outputs and gradients in the
// GPU's row layout, lse transposed to [T, heads] (and to [batch, heads, seq] for cuDNN's statistics).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "gpu_test_util.h"

namespace lt::gputest {

struct AttnCase {
  int64_t batch, seq, heads, kv_heads, hd;
  bool segments;
  int64_t tokens() const { return batch * seq; }
};
inline std::ostream& operator<<(std::ostream& o, const AttnCase& c) {
  return o << "B" << c.batch << "_S" << c.seq << "_H" << c.heads << "_KV" << c.kv_heads << "_D" << c.hd
           << (c.segments ? "_seg" : "");
}

struct AttnRef {
  std::vector<float> q, k, v, dout;        // inputs (bf16-rounded)
  std::vector<int32_t> seg;                // [T] segment ids (all 0 without segments)
  std::vector<float> o, dq, dk, dv;        // reference outputs
  std::vector<float> lse_rows;             // [T, heads]
  std::vector<float> lse_bhs;              // [batch, heads, seq]
  float scale = 0;
};

inline AttnRef attention_reference(const AttnCase& ac) {
  const int64_t B = ac.batch, S = ac.seq, H = ac.heads, KV = ac.kv_heads, D = ac.hd, T = B * S;
  std::mt19937 rng{uint32_t(S * 131 + H * 7 + D)};
  AttnRef r;
  r.q = round_bf16(randn(sz(T * H * D), rng));
  r.k = round_bf16(randn(sz(T * KV * D), rng));
  r.v = round_bf16(randn(sz(T * KV * D), rng));
  r.dout = round_bf16(randn(sz(T * H * D), rng));
  r.seg.assign(sz(T), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) r.seg[sz(b * S + s)] = ac.segments ? int32_t(s * 3 / std::max<int64_t>(S, 1)) : 0;
  const cpu::AttnShape sh{S, H, KV, D, float(1.0 / std::sqrt(double(D)))};
  r.scale = sh.scale;
  r.o.resize(r.q.size());
  r.dq.resize(r.q.size());
  r.dk.resize(r.k.size());
  r.dv.resize(r.v.size());
  std::vector<float> lse(sz(T * H));  // per sample [heads, S]
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* sg = ac.segments ? r.seg.data() + b * S : nullptr;
    const int64_t qo = b * S * H * D, ko = b * S * KV * D;
    cpu::attention_fwd(sh, r.q.data() + qo, r.k.data() + ko, r.v.data() + ko, sg, r.o.data() + qo,
                       lse.data() + b * S * H);
    cpu::attention_bwd(sh, r.q.data() + qo, r.k.data() + ko, r.v.data() + ko, sg, r.o.data() + qo,
                       lse.data() + b * S * H, r.dout.data() + qo, r.dq.data() + qo, r.dk.data() + ko,
                       r.dv.data() + ko);
  }
  r.lse_bhs = lse;
  r.lse_rows.resize(lse.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < S; ++s) r.lse_rows[sz((b * S + s) * H + h)] = lse[sz(b * S * H + h * S + s)];
  return r;
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

// o, lse within bf16 tolerance; dq/dk near zero when one key is visible (S == 1), else relative; dv relative.
inline void expect_attention_close(const AttnCase& ac, const AttnRef& r, const std::vector<float>& o,
                                   const std::vector<float>& lse, const std::vector<float>& lse_ref,
                                   const std::vector<float>& dq, const std::vector<float>& dk,
                                   const std::vector<float>& dv) {
  EXPECT_LE(rel_err(o, r.o), 1e-2) << ac;
  EXPECT_LE(max_abs_diff(lse, lse_ref), 2e-2) << ac;
  if (ac.seq == 1) {
    // One visible key: the softmax is constant, so dQ and dK are zero up to rounding (the reference's
    // too: comparing two rounding noises relatively would be meaningless).
    auto small = [&](const std::vector<float>& g) { return rel_err(g, std::vector<float>(g.size(), 0.f)); };
    const double scale = small(r.dout);
    EXPECT_LE(small(dq), 1e-2 * scale) << ac;
    EXPECT_LE(small(dk), 1e-2 * scale) << ac;
  } else {
    EXPECT_LE(rel_err(dq, r.dq), 2e-2) << ac;
    EXPECT_LE(rel_err(dk, r.dk), 2e-2) << ac;
  }
  EXPECT_LE(rel_err(dv, r.dv), 2e-2) << ac;
}

}  // namespace lt::gputest
