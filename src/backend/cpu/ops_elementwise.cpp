// SwiGLU, embedding lookup and cross-entropy.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/ops.h"
#include "backend/cpu/vec_math.h"
#include "core/error.h"

namespace lt::cpu {

// Split into 64 KiB-ish blocks for threads; each element's arithmetic does not depend on the split.
void swiglu_fwd(const float* gate, const float* up, int64_t n, int64_t f, float* act) {
  const int64_t total = n * f, blk = 16384, nb = (total + blk - 1) / blk;
#pragma omp parallel for schedule(static) if (nb > 4)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t i0 = b * blk, len = std::min(blk, total - i0);
    vec::swiglu_fwd8(gate + i0, up + i0, len, act + i0);
  }
}

void swiglu_bwd(const float* gate, const float* up, const float* dact, int64_t n, int64_t f, float* dgate,
                float* dup) {
  const int64_t total = n * f, blk = 16384, nb = (total + blk - 1) / blk;
#pragma omp parallel for schedule(static) if (nb > 4)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t i0 = b * blk, len = std::min(blk, total - i0);
    vec::swiglu_bwd8(gate + i0, up + i0, dact + i0, len, dgate + i0, dup + i0);
  }
}

void embedding_fwd(const float* emb, int64_t vocab, int64_t hidden, const int32_t* ids, int64_t n, float* x) {
  for (int64_t t = 0; t < n; ++t)
    LT_CHECK(ids[t] >= 0 && ids[t] < vocab, "embedding: token id {} at position {} is outside [0, {})", ids[t], t,
             vocab);
#pragma omp parallel for schedule(static) if (n * hidden > 65536)
  for (int64_t t = 0; t < n; ++t) {
    const float* e = emb + int64_t(ids[t]) * hidden;
    float* xr = x + t * hidden;
    for (int64_t i = 0; i < hidden; ++i) xr[i] = e[i];
  }
}

void embedding_bwd(const int32_t* ids, int64_t n, int64_t hidden, const float* dx, float* demb) {
  for (int64_t t = 0; t < n; ++t) {  // token order: rows sharing an id add deterministically
    float* e = demb + int64_t(ids[t]) * hidden;
    const float* d = dx + t * hidden;
#pragma omp simd
    for (int64_t i = 0; i < hidden; ++i) e[i] += d[i];
  }
}

void cross_entropy(float* logits, const int32_t* targets, int64_t n, int64_t vocab, float grad_scale, bool want_grad,
                   double* loss_sum, int64_t* n_valid, float* lse_out) {
  for (int64_t r = 0; r < n; ++r)
    LT_CHECK(targets[r] == -100 || (targets[r] >= 0 && targets[r] < vocab),
             "cross_entropy: target {} at row {} is outside [0, {}) and is not -100", targets[r], r, vocab);
  std::vector<float> row_loss(static_cast<size_t>(n), 0.0f);
#pragma omp parallel for schedule(static) if (n * vocab > 65536)
  for (int64_t r = 0; r < n; ++r) {
    float* z = logits + r * vocab;
    const int32_t t = targets[r];
    if (t == -100) {
      if (want_grad) std::fill(z, z + vocab, 0.0f);
      if (lse_out) lse_out[r] = 0.0f;
      continue;
    }
    const float m = vec::row_max(z, vocab);
    const double sum = vec::sum_exp(z, vocab, m);
    const float lse = m + float(std::log(sum));
    if (lse_out) lse_out[r] = lse;
    row_loss[size_t(r)] = lse - z[t];
    if (want_grad) {
      // d loss / d z_i = softmax_i - [i == t]
      vec::exp_scale_inplace(z, vocab, lse, grad_scale);
      z[t] -= grad_scale;
    }
  }
  for (int64_t r = 0; r < n; ++r) {
    if (targets[r] == -100) continue;
    *loss_sum += double(row_loss[size_t(r)]);
    *n_valid += 1;
  }
}

void cross_entropy_slice_grad(float* z, const int32_t* targets, int64_t n, int64_t v0, int64_t n_v, const float* lse,
                              float grad_scale) {
#pragma omp parallel for schedule(static) if (n * n_v > 65536)
  for (int64_t r = 0; r < n; ++r) {
    float* zr = z + r * n_v;
    const int32_t t = targets[r];
    if (t == -100) {
      std::fill(zr, zr + n_v, 0.0f);
      continue;
    }
    vec::exp_scale_inplace(zr, n_v, lse[r], grad_scale);
    if (t >= v0 && t < v0 + n_v) zr[t - v0] -= grad_scale;
  }
}

}  // namespace lt::cpu
