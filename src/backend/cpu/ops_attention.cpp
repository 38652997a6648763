// Causal grouped-query attention for one sequence, with an optional segment mask (packed sequences).
// Blocks of query rows per head: O(block * S) scratch, never an [S,S] matrix for all heads. Packed
// segments are computed one at a time: a row's scores cover only its own segment's keys, so a packed
// row costs the sum of its segments' squares, not the square of its length.
#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/ops_attention_impl.h"
#include "backend/cpu/scratch.h"
#include "core/error.h"
#include "model/sequence.h"

namespace lt::cpu {

namespace {

constexpr int64_t kParallelWork = 1 << 16;  // below this, thread start-up costs more than it saves

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline void axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

inline bool visible(const int32_t* seg, int64_t i, int64_t j) { return !seg || seg[i] == seg[j]; }

void check_shape(const AttnShape& s) {
  LT_CHECK(s.seq >= 0 && s.heads > 0 && s.kv_heads > 0 && s.head_dim > 0 && s.heads % s.kv_heads == 0,
           "attention: bad shape seq={} heads={} kv_heads={} head_dim={} (heads must be a multiple of kv_heads)",
           s.seq, s.heads, s.kv_heads, s.head_dim);
}

using attn_detail::Span;

// Query rows per block: the scratch is [kQueryBlock, longest span] scores (+ as much for dP in backward).
constexpr int64_t kQueryBlock = 256;

// Strides and the spans one call works through. mask: the ids to check entry by entry (the whole-square
// form), nullptr when the spans are the segments.
struct Geometry {
  int64_t H = 0, D = 0, group = 1, q_ld = 0, kv_ld = 0;
  int64_t bq = 1, longest = 0;  // query rows per block; the longest span (scratch columns)
  std::vector<Span> spans;
  const int32_t* mask = nullptr;
};

Geometry geometry(const AttnShape& s, std::vector<Span> spans, const int32_t* mask) {
  Geometry g;
  g.H = s.heads;
  g.D = s.head_dim;
  g.group = s.heads / s.kv_heads;
  g.q_ld = s.heads * s.head_dim;
  g.kv_ld = s.kv_heads * s.head_dim;
  for (const Span& sp : spans) g.longest = std::max(g.longest, sp.end - sp.begin);
  g.bq = std::min(kQueryBlock, std::max<int64_t>(g.longest, 1));
  g.spans = std::move(spans);
  g.mask = mask;
  return g;
}

// For query rows i0..i1 of a span starting at row a, sc [n, i1 - a] holds the scaled scores against keys
// a..i1-1. Replaces them with probabilities exp(score - lse_i) (masked and future entries exactly 0). If
// lse_in == nullptr the row statistics are computed here and written to lse_out; otherwise lse_in is used
// (backward recompute). Both are indexed by the row's position in the sequence.
void block_probs(float* sc, int64_t a, int64_t i0, int64_t i1, const int32_t* mask, const float* lse_in,
                 float* lse_out) {
  const int64_t n = i1 - i0, ld = i1 - a;
#pragma omp parallel for schedule(static) if (n * ld > kParallelWork)
  for (int64_t r = 0; r < n; ++r) {
    const int64_t i = i0 + r, last = i - a;  // row i sees keys a..i: columns 0..last
    float* row = sc + r * ld;
    if (mask)
      for (int64_t j = 0; j <= last; ++j)
        if (!visible(mask, i, a + j)) row[j] = -std::numeric_limits<float>::infinity();
    float l;
    if (lse_in) {
      l = lse_in[i];
    } else {
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j <= last; ++j) m = std::max(m, row[j]);
      double sum = 0;
      for (int64_t j = 0; j <= last; ++j) sum += double(std::exp(row[j] - m));  // exp(-inf) = 0
      l = m + float(std::log(sum));
      lse_out[i] = l;
    }
    for (int64_t j = 0; j <= last; ++j) row[j] = std::exp(row[j] - l);
    for (int64_t j = last + 1; j < ld; ++j) row[j] = 0.0f;
  }
}

// Per head, span and block of query rows, scores and the weighted sum of V are GEMMs (OpenBLAS, called
// from this thread), the softmax is an OpenMP loop over rows. Causal: block rows i0..i1 of a span starting
// at a only need keys a..i1-1.
void forward(const AttnShape& s, const Geometry& G, const float* q, const float* k, const float* v, float* out,
             float* lse) {
  const int64_t S = s.seq, D = G.D;
  Scratch& arena = Scratch::get(1);
  arena.reset(G.bq * G.longest + S, 2);
  float* sc = arena.take(G.bq * G.longest);
  float* lse_tmp = arena.take(S);
  for (int64_t h = 0; h < G.H; ++h) {
    const int64_t g = h / G.group;
    float* lse_h = lse ? lse + h * S : lse_tmp;
    for (const Span& sp : G.spans) {
      const float* kb = k + sp.begin * G.kv_ld + g * D;
      const float* vb = v + sp.begin * G.kv_ld + g * D;
      for (int64_t i0 = sp.begin; i0 < sp.end; i0 += G.bq) {
        const int64_t i1 = std::min(sp.end, i0 + G.bq), n = i1 - i0, nk = i1 - sp.begin;
        sgemm(false, true, n, nk, D, s.scale, q + i0 * G.q_ld + h * D, G.q_ld, kb, G.kv_ld, 0.0f, sc, nk);
        block_probs(sc, sp.begin, i0, i1, G.mask, nullptr, lse_h);
        sgemm(false, false, n, D, nk, 1.0f, sc, nk, vb, G.kv_ld, 0.0f, out + i0 * G.q_ld + h * D, G.q_ld);
      }
    }
  }
}

// dP = dO V^T, dS = P * (dP - rowsum(dO * O)) * scale, dQ = dS K, dK += dS^T Q, dV += P^T dO.
// dK/dV of a kv head accumulate over its query heads and blocks in a fixed order (deterministic).
void backward(const AttnShape& s, const Geometry& G, const float* q, const float* k, const float* v,
              const float* out, const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  const int64_t S = s.seq, D = G.D;
  std::fill(dk, dk + S * G.kv_ld, 0.0f);
  std::fill(dv, dv + S * G.kv_ld, 0.0f);
  Scratch& arena = Scratch::get(1);
  arena.reset(2 * G.bq * G.longest, 2);
  float* p = arena.take(G.bq * G.longest);
  float* dp = arena.take(G.bq * G.longest);
  for (int64_t h = 0; h < G.H; ++h) {
    const int64_t g = h / G.group;
    for (const Span& sp : G.spans) {
      const float* kb = k + sp.begin * G.kv_ld + g * D;
      const float* vb = v + sp.begin * G.kv_ld + g * D;
      float* dkb = dk + sp.begin * G.kv_ld + g * D;
      float* dvb = dv + sp.begin * G.kv_ld + g * D;
      for (int64_t i0 = sp.begin; i0 < sp.end; i0 += G.bq) {
        const int64_t i1 = std::min(sp.end, i0 + G.bq), n = i1 - i0, nk = i1 - sp.begin;
        const float* qb = q + i0 * G.q_ld + h * D;
        const float* dob = dout + i0 * G.q_ld + h * D;
        sgemm(false, true, n, nk, D, s.scale, qb, G.q_ld, kb, G.kv_ld, 0.0f, p, nk);
        block_probs(p, sp.begin, i0, i1, G.mask, lse + h * S, nullptr);
        sgemm(false, true, n, nk, D, 1.0f, dob, G.q_ld, vb, G.kv_ld, 0.0f, dp, nk);
#pragma omp parallel for schedule(static) if (n * nk > kParallelWork)
        for (int64_t r = 0; r < n; ++r) {
          const float d_i = dot(dob + r * G.q_ld, out + (i0 + r) * G.q_ld + h * D, D);  // sum_j p_j dp_j
          const float* pr = p + r * nk;
          float* dr = dp + r * nk;
#pragma omp simd
          for (int64_t j = 0; j < nk; ++j) dr[j] = pr[j] * (dr[j] - d_i) * s.scale;
        }
        sgemm(false, false, n, D, nk, 1.0f, dp, nk, kb, G.kv_ld, 0.0f, dq + i0 * G.q_ld + h * D, G.q_ld);
        sgemm(true, false, nk, D, n, 1.0f, dp, nk, qb, G.q_ld, 1.0f, dkb, G.kv_ld);
        sgemm(true, false, nk, D, n, 1.0f, p, nk, dob, G.q_ld, 1.0f, dvb, G.kv_ld);
      }
    }
  }
}

// The spans of one call: the segments when each is contiguous, else the whole sequence masked entry by entry.
Geometry call_geometry(const AttnShape& s, const int32_t* seg) {
  if (auto spans = attn_detail::segment_spans(seg, s.seq)) return geometry(s, std::move(*spans), nullptr);
  return geometry(s, {Span{0, s.seq}}, seg);
}

}  // namespace

namespace attn_detail {

std::optional<std::vector<Span>> segment_spans(const int32_t* seg, int64_t S) {
  std::vector<Span> spans;
  if (S == 0) return spans;
  if (!seg) return std::vector<Span>{Span{0, S}};
  std::unordered_set<int32_t> ended;  // ids whose run is over
  bool contiguous = true;
  for_each_segment_run(seg, S, [&](int64_t begin, int64_t end) {
    contiguous = contiguous && ended.insert(seg[begin]).second;
    spans.push_back(Span{begin, end});
  });
  if (!contiguous) return std::nullopt;
  return spans;
}

void attention_fwd_masked(const AttnShape& s, const float* q, const float* k, const float* v, const int32_t* seg,
                          float* out, float* lse) {
  check_shape(s);
  forward(s, geometry(s, {Span{0, s.seq}}, seg), q, k, v, out, lse);
}

void attention_bwd_masked(const AttnShape& s, const float* q, const float* k, const float* v, const int32_t* seg,
                          const float* out, const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  check_shape(s);
  backward(s, geometry(s, {Span{0, s.seq}}, seg), q, k, v, out, lse, dout, dq, dk, dv);
}

}  // namespace attn_detail

void attention_fwd(const AttnShape& s, const float* q, const float* k, const float* v, const int32_t* seg, float* out,
                   float* lse) {
  check_shape(s);
  forward(s, call_geometry(s, seg), q, k, v, out, lse);
}

void attention_bwd(const AttnShape& s, const float* q, const float* k, const float* v, const int32_t* seg,
                   const float* out, const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  check_shape(s);
  backward(s, call_geometry(s, seg), q, k, v, out, lse, dout, dq, dk, dv);
}

void attention_decode(const AttnShape& s, const float* q, const float* k_cache, const float* v_cache, int64_t n_ctx,
                      float* out) {
  check_shape(s);
  LT_CHECK(n_ctx > 0, "attention_decode: empty KV cache");
  const int64_t H = s.heads, D = s.head_dim, group = s.heads / s.kv_heads, kv_ld = s.kv_heads * D;
#pragma omp parallel for schedule(static) if (n_ctx * H * D > 65536)
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / group;
    std::vector<float> sc(static_cast<size_t>(n_ctx));
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n_ctx; ++j) {
      sc[size_t(j)] = dot(q + h * D, k_cache + j * kv_ld + g * D, D) * s.scale;
      m = std::max(m, sc[size_t(j)]);
    }
    double sum = 0;
    for (auto& x : sc) {
      x = std::exp(x - m);
      sum += x;
    }
    float* o = out + h * D;
    std::fill(o, o + D, 0.0f);
    for (int64_t j = 0; j < n_ctx; ++j) axpy(sc[size_t(j)], v_cache + j * kv_ld + g * D, o, D);
    const float inv = float(1.0 / sum);
    for (int64_t d = 0; d < D; ++d) o[d] *= inv;
  }
}

}  // namespace lt::cpu
