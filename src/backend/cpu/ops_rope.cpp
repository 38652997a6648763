// Rotary position embedding (HF rotate-half convention) and its inverse frequencies.
#include <cmath>
#include <numbers>

#include "backend/cpu/ops.h"
#include "core/error.h"

namespace lt::cpu {

std::vector<float> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& sc) {
  LT_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope: head_dim must be positive and even, got {}", head_dim);
  const int64_t half = head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  // HF: 1 / base ** (arange(0, dim, 2).float() / dim), evaluated in fp32.
  for (int64_t i = 0; i < half; ++i) {
    float expo = float(2 * i) / float(head_dim);
    inv[size_t(i)] = 1.0f / std::pow(float(theta), expo);
  }
  if (sc.type == "none" || sc.type == "default" || sc.type.empty()) return inv;
  LT_CHECK(sc.type == "llama3", "rope_scaling type '{}' is not supported (supported: none, llama3)", sc.type);
  LT_CHECK(sc.high_freq_factor != sc.low_freq_factor, "rope_scaling llama3: high_freq_factor == low_freq_factor ({})",
           sc.high_freq_factor);
  // transformers' _compute_llama3_parameters: long wavelengths divided by factor, short ones kept,
  // the band in between interpolated smoothly.
  const double factor = sc.factor, lo = sc.low_freq_factor, hi = sc.high_freq_factor;
  const double old_ctx = double(sc.original_max_position_embeddings);
  const double low_freq_wavelen = old_ctx / lo, high_freq_wavelen = old_ctx / hi;
  for (auto& f : inv) {
    const float wavelen = float(2.0 * std::numbers::pi) / f;
    float llama = double(wavelen) > low_freq_wavelen ? float(f / factor) : f;
    const bool medium = !(double(wavelen) < high_freq_wavelen) && !(double(wavelen) > low_freq_wavelen);
    if (medium) {
      float smooth = float((old_ctx / double(wavelen) - lo) / (hi - lo));
      llama = (1.0f - smooth) * llama / float(factor) + smooth * llama;
    }
    f = llama;
  }
  return inv;
}

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  return rope_inv_freq(c.rotary_dim(), c.rope_theta, c.rope_scaling);
}

namespace {
template <bool kInverse>
void rope_apply(float* x, int64_t n, int64_t n_heads, int64_t head_dim, int64_t rot_dim, const int32_t* pos,
                const float* inv_freq) {
  // Partial RoPE (Qwen3.5): the first rot_dim entries of each head rotate, the rest pass through.
  const int64_t half = (rot_dim > 0 ? rot_dim : head_dim) / 2;
#pragma omp parallel if (n * n_heads * head_dim > 65536)
  {
    std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      const float p = float(pos[r]);
      for (int64_t i = 0; i < half; ++i) {
        const float ang = p * inv_freq[i];  // fp32 product, as HF's fp32 matmul of inv_freq and positions
        cs[size_t(i)] = std::cos(ang);
        sn[size_t(i)] = kInverse ? -std::sin(ang) : std::sin(ang);
      }
      for (int64_t h = 0; h < n_heads; ++h) {
        float* a = x + (r * n_heads + h) * head_dim;
        float* b = a + half;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = a[i], x2 = b[i];
          a[i] = x1 * cs[size_t(i)] - x2 * sn[size_t(i)];
          b[i] = x2 * cs[size_t(i)] + x1 * sn[size_t(i)];
        }
      }
    }
  }
}
}  // namespace

void rope_fwd(float* x, int64_t n, int64_t n_heads, int64_t head_dim, const int32_t* pos, const float* inv_freq,
              int64_t rot_dim) {
  rope_apply<false>(x, n, n_heads, head_dim, rot_dim, pos, inv_freq);
}

void rope_bwd(float* dx, int64_t n, int64_t n_heads, int64_t head_dim, const int32_t* pos, const float* inv_freq,
              int64_t rot_dim) {
  // The rotation is orthogonal: its transpose is the rotation by -angle.
  rope_apply<true>(dx, n, n_heads, head_dim, rot_dim, pos, inv_freq);
}

}  // namespace lt::cpu
