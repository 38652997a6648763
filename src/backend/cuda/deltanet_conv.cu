// Gated DeltaNet row-wise kernels: depthwise causal conv + SiLU (fwd/bwd), the fused q/k L2 norm + gates
// ("prep", fwd/bwd), the gated RMSNorm (fwd/bwd) and the decode step. The math of each is the CPU
// reference's (src/backend/cpu/ops_gdn_conv.cpp, ops_gdn_recurrent.cpp); here in fp32 on bf16 data.
// Parameter gradients are reduced deterministically: per-block partial sums in a workspace, then one
// ordered pass that adds them to the fp32 gradient.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/deltanet.h"
#include "backend/cuda/dev_common.cuh"

namespace lt::cuda {
namespace {
using namespace dev;

constexpr int kMaxConvK = 8;
constexpr int kConvRows = 64;   // rows per block of the conv backward (one dw partial per block)
constexpr int kGateRows = 64;   // rows per block of the gates backward
constexpr int kNormVecs = 64;   // vectors per warp of the gated-norm backward
constexpr float kL2Eps = 1e-6f;

__device__ __forceinline__ float ldf(const bf16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float sigm(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float softplus_grad(float x) { return x > 20.f ? 1.f : sigm(x); }
__device__ __forceinline__ float silu_grad(float p) {
  const float s = sigm(p);
  return s * (1.f + p * (1.f - s));
}

// Number of rows before sample-local row s (of the sample starting at global row t0) that are in the
// same segment as s, capped at K-1: taps i >= K-1-nv of row s are valid.
__device__ __forceinline__ int conv_chain(const int32_t* seg, int64_t t0, int64_t s, int K) {
  int nv = 0;
  while (nv < K - 1 && s - nv > 0) {
    if (seg && seg[t0 + s - nv] != seg[t0 + s - nv - 1]) break;
    ++nv;
  }
  return nv;
}

// pre-activation of (sample row s, channel c).
__device__ __forceinline__ float conv_pre(const bf16* x, int64_t ldx, const bf16* w, int64_t t0, int64_t s,
                                          int64_t c, int K, int nv) {
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < kMaxConvK; ++i) {
    if (i < K && i >= K - 1 - nv) acc += ldf(w + c * K + i) * ldf(x + (t0 + s - (K - 1) + i) * ldx + c);
  }
  return acc;
}

// ------------------------------------------------------------------------------------------ conv
// One thread per (row, channel).
__global__ void conv_fwd_kernel(const bf16* x, int64_t ldx, const bf16* w, const int32_t* seg, int64_t T,
                                int64_t seq, int64_t C, int K, bf16* y) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T * C) return;
  const int64_t t = idx / C, c = idx % C, s = t % seq, t0 = t - s;
  const int nv = conv_chain(seg, t0, s, K);
  const float p = conv_pre(x, ldx, w, t0, s, c, K, nv);
  y[t * C + c] = __float2bfloat16(p * sigm(p));
}

// Block (row chunk r of sample b, channel block); thread = channel, walking rows s in [r0, r1 + K - 1)
// with a window of the last K dpre values. Writes dx rows [r0, r1) and the dw partial of its rows.
__global__ void conv_bwd_kernel(const bf16* x, int64_t ldx, const bf16* w, const bf16* dy, const int32_t* seg,
                                int64_t seq, int64_t C, int K, int64_t n_rc, bf16* dx, float* partial) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t b = blockIdx.y / n_rc, rc = blockIdx.y % n_rc;
  const int64_t t0 = b * seq, r0 = rc * kConvRows, r1 = min(seq, r0 + kConvRows);
  float dpw[kMaxConvK], dwacc[kMaxConvK];
  int nvw[kMaxConvK];
#pragma unroll
  for (int j = 0; j < kMaxConvK; ++j) dpw[j] = 0.f, nvw[j] = 0, dwacc[j] = 0.f;
  for (int64_t s = r0; s < r1 + K - 1; ++s) {
    float dp = 0.f;
    int nv = 0;
    if (s < seq) {
      nv = conv_chain(seg, t0, s, K);
      const float p = conv_pre(x, ldx, w, t0, s, c, K, nv);
      dp = ldf(dy + (t0 + s) * C + c) * silu_grad(p);
      if (s < r1) {
#pragma unroll
        for (int i = 0; i < kMaxConvK; ++i)
          if (i < K && i >= K - 1 - nv) dwacc[i] += dp * ldf(x + (t0 + s - (K - 1) + i) * ldx + c);
      }
    }
    // window: dpw[j] = dpre(s - j), nvw[j] = chain(s - j)
#pragma unroll
    for (int j = kMaxConvK - 1; j > 0; --j) dpw[j] = dpw[j - 1], nvw[j] = nvw[j - 1];
    dpw[0] = dp, nvw[0] = nv;
    const int64_t r = s - (K - 1);
    if (r >= r0 && r < r1) {
      // output rows r + jj (jj = 0..K-1) read x[r] through tap i = K-1-jj when their chain covers jj rows
      float acc = 0.f;
#pragma unroll
      for (int jj = 0; jj < kMaxConvK; ++jj) {
        const int widx = K - 1 - jj;  // window index of row r + jj
        if (jj < K && nvw[widx] >= jj) acc += ldf(w + c * K + (K - 1 - jj)) * dpw[widx];
      }
      dx[(t0 + r) * ldx + c] = __float2bfloat16(acc);
    }
  }
  float* pp = partial + int64_t(blockIdx.y) * C * K + c * K;
#pragma unroll
  for (int i = 0; i < kMaxConvK; ++i)
    if (i < K) pp[i] = dwacc[i];
}

// Vectorised conv kernels (16-byte rows of 8 channels), used when K is 2, 3 or 4 and the rows and bases are
// 16-byte aligned (dispatch below); the scalar kernels above cover the rest. Same arithmetic per element as they
// do (taps in the same order). Run 42: the scalar forward read 2-byte values and recomputed the segment chain per
// channel, 0.85 ms at the 27B shape where its 336 MB of traffic need ~0.1 ms.
constexpr int kConvFwdRows = 16;  // rows per thread of the vectorised forward

// wr[j][e] = w[c0 + e, K - 1 - j]: the tap that multiplies row s - j.
template <int K>
__device__ __forceinline__ void load_taps8(const bf16* w, int64_t c0, float (&wr)[K][8]) {
#pragma unroll
  for (int j = 0; j < K; ++j)
#pragma unroll
    for (int e = 0; e < 8; ++e) wr[j][e] = ldf(w + (c0 + e) * K + (K - 1 - j));
}
template <int K, typename T>
__device__ __forceinline__ void shift_window(T (&win)[K][8]) {
#pragma unroll
  for (int j = K - 1; j > 0; --j)
#pragma unroll
    for (int e = 0; e < 8; ++e) win[j][e] = win[j - 1][e];
}
// pre-activations of 8 channels at the window's newest row (xw[j] = row s - j, nv rows of chain).
template <int K>
__device__ __forceinline__ void conv_pre8(const float (&wr)[K][8], const float (&xw)[K][8], int nv, float (&p)[8]) {
#pragma unroll
  for (int e = 0; e < 8; ++e) p[e] = 0.f;
#pragma unroll
  for (int j = K - 1; j >= 0; --j)  // tap order i = K-1-j ascending, as conv_pre
    if (j <= nv)
#pragma unroll
      for (int e = 0; e < 8; ++e) p[e] += wr[j][e] * xw[j][e];
}

// Row s's 8 channels at c0 as raw bf16 (zero when !ok): the vectorised kernels load rows two ahead of their use,
// so that a row's global latency overlaps the two rows before it (one load at a time per thread kept the conv
// backward at ~4x its bytes' time).
__device__ __forceinline__ uint4 row8(const bf16* p, bool ok) {
  return ok ? *reinterpret_cast<const uint4*>(p) : make_uint4(0u, 0u, 0u, 0u);
}

// Thread = (8 channels, kConvFwdRows rows of one sample); the rows' inputs are read once into a register window.
template <int K>
__global__ void conv_fwd_vec8_kernel(const bf16* x, int64_t ldx, const bf16* w, const int32_t* seg, int64_t seq,
                                     int64_t C, int64_t n_rc, bf16* y) {
  const int64_t c0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (c0 >= C) return;
  const int64_t b = blockIdx.y / n_rc, rc = blockIdx.y % n_rc;
  const int64_t t0 = b * seq, r0 = rc * kConvFwdRows, r1 = min(seq, r0 + kConvFwdRows);
  float wr[K][8], xw[K][8];
  load_taps8<K>(w, c0, wr);
#pragma unroll
  for (int j = 0; j < K; ++j)
#pragma unroll
    for (int e = 0; e < 8; ++e) xw[j][e] = 0.f;
  auto xrow = [&](int64_t s) { return row8(x + (t0 + s) * ldx + c0, s >= 0 && s < r1); };
  uint4 xa = xrow(r0 - (K - 1)), xb = xrow(r0 - (K - 2));
  for (int64_t s = r0 - (K - 1); s < r1; ++s) {
    shift_window<K>(xw);
    unpack8(xa, xw[0]);
    xa = xb;
    xb = xrow(s + 2);
    if (s < r0) continue;
    float p[8];
    conv_pre8<K>(wr, xw, conv_chain(seg, t0, s, K), p);
#pragma unroll
    for (int e = 0; e < 8; ++e) p[e] = p[e] * sigm(p[e]);
    store8(y + (t0 + s) * C + c0, p);
  }
}

// As conv_bwd_kernel (block = row chunk of a sample, walking rows with windows of x, dpre and chains), with a
// thread per 8 channels. (196 registers at K = 4, 10 warps per SM; capping them for 16 or 24 warps measured
// slower: 0.455 -> 0.56 / 1.79 ms.)
template <int K>
__global__ void conv_bwd_vec8_kernel(const bf16* x, int64_t ldx, const bf16* w, const bf16* dy, const int32_t* seg,
                                     int64_t seq, int64_t C, int64_t n_rc, bf16* dx, float* partial) {
  const int64_t c0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (c0 >= C) return;
  const int64_t b = blockIdx.y / n_rc, rc = blockIdx.y % n_rc;
  const int64_t t0 = b * seq, r0 = rc * kConvRows, r1 = min(seq, r0 + kConvRows);
  float wr[K][8], xw[K][8], dpw[K][8], dwacc[K][8];
  int nvw[K];
  load_taps8<K>(w, c0, wr);
#pragma unroll
  for (int j = 0; j < K; ++j) {
    nvw[j] = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) xw[j][e] = dpw[j][e] = dwacc[j][e] = 0.f;
  }
  auto xrow = [&](int64_t s) { return row8(x + (t0 + s) * ldx + c0, s >= 0 && s < seq); };
  auto grow = [&](int64_t s) { return row8(dy + (t0 + s) * C + c0, s >= r0 && s < seq); };
  const int64_t sb = r0 - (K - 1);
  uint4 xa = xrow(sb), xb = xrow(sb + 1), ga = grow(sb), gb = grow(sb + 1);
  for (int64_t s = sb; s < r1 + K - 1; ++s) {
    shift_window<K>(xw);
    unpack8(xa, xw[0]);
    const uint4 gc = ga;
    xa = xb;
    ga = gb;
    xb = xrow(s + 2);
    gb = grow(s + 2);
    if (s < r0) continue;
    float dp[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    int nv = 0;
    if (s < seq) {
      nv = conv_chain(seg, t0, s, K);
      float p[8], g[8];
      conv_pre8<K>(wr, xw, nv, p);
      unpack8(gc, g);
#pragma unroll
      for (int e = 0; e < 8; ++e) dp[e] = g[e] * silu_grad(p[e]);
      if (s < r1) {
#pragma unroll
        for (int j = K - 1; j >= 0; --j)  // dw[c, i] with i = K-1-j, rows in order
          if (j <= nv)
#pragma unroll
            for (int e = 0; e < 8; ++e) dwacc[j][e] += dp[e] * xw[j][e];
      }
    }
    shift_window<K>(dpw);
#pragma unroll
    for (int j = K - 1; j > 0; --j) nvw[j] = nvw[j - 1];
#pragma unroll
    for (int e = 0; e < 8; ++e) dpw[0][e] = dp[e];
    nvw[0] = nv;
    const int64_t r = s - (K - 1);
    if (r >= r0 && r < r1) {  // row r feeds rows r + jj through tap K-1-jj when their chain covers jj rows
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int jj = 0; jj < K; ++jj) {
        const int widx = K - 1 - jj;
        if (nvw[widx] >= jj)
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[e] += wr[jj][e] * dpw[widx][e];
      }
      store8(dx + (t0 + r) * ldx + c0, acc);
    }
  }
  float* pp = partial + int64_t(blockIdx.y) * C * K;
#pragma unroll
  for (int e = 0; e < 8; ++e)
#pragma unroll
    for (int j = 0; j < K; ++j) pp[(c0 + e) * K + (K - 1 - j)] = dwacc[j][e];
}

// out[i] += sum_s partial[s, i] in split order.
__global__ void partial_finish_kernel(const float* partial, int64_t nsplit, int64_t n, float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc = 0.f;
  for (int64_t s = 0; s < nsplit; ++s) acc += partial[s * n + i];
  out[i] += acc;
}

// Same sums for few outputs over many splits: one block per output, a fixed strided split per thread and a fixed
// tree (deterministic). The one-thread-per-output kernel above spent 0.62 ms on the gated norm's 128 outputs x 6,144
// splits at the 27B shape.
__global__ void partial_finish_wide_kernel(const float* partial, int64_t nsplit, int64_t n, float* out) {
  __shared__ float red[256];
  const int64_t i = blockIdx.x;
  float acc = 0.f;
  for (int64_t s = threadIdx.x; s < nsplit; s += blockDim.x) acc += partial[s * n + i];
  red[threadIdx.x] = acc;
  __syncthreads();
  for (int h = blockDim.x / 2; h > 0; h >>= 1) {
    if (int(threadIdx.x) < h) red[threadIdx.x] += red[threadIdx.x + h];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[i] += red[0];
}

// ------------------------------------------------------------------------------------------ prep
// One block per row t. Warps take the 2*Hk q/k vectors; then v copy and gates.
__global__ void prep_fwd_kernel(const bf16* y, const bf16* a, const bf16* b, int64_t ldab, const bf16* A_log,
                                const bf16* dt_bias, int Hk, int Hv, int Dk, int Dv, bf16* qn, bf16* kn, bf16* v,
                                float* g, float* beta) {
  const int64_t t = blockIdx.x;
  const int64_t C = int64_t(2) * Hk * Dk + int64_t(Hv) * Dv;
  const bf16* yr = y + t * C;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  for (int vec = warp; vec < 2 * Hk; vec += nw) {
    const bf16* src = yr + int64_t(vec) * Dk;
    float ss = 0.f;
    for (int i = lane; i < Dk; i += 32) ss += ldf(src + i) * ldf(src + i);
    ss = warp_sum(ss);
    const float r = rsqrtf(ss + kL2Eps);
    bf16* dst = vec < Hk ? qn + (t * Hk + vec) * Dk : kn + (t * Hk + (vec - Hk)) * Dk;
    for (int i = lane; i < Dk; i += 32) dst[i] = __float2bfloat16(ldf(src + i) * r);
  }
  const bf16* vs = yr + int64_t(2) * Hk * Dk;
  for (int i = threadIdx.x; i < Hv * Dv; i += blockDim.x) v[t * Hv * Dv + i] = vs[i];
  for (int h = threadIdx.x; h < Hv; h += blockDim.x) {
    const float z = ldf(a + t * ldab + h) + ldf(dt_bias + h);
    g[t * Hv + h] = -expf(ldf(A_log + h)) * softplus(z);
    beta[t * Hv + h] = sigm(ldf(b + t * ldab + h));
  }
}

// dx = r dy - r^3 x (x . dy) per q/k vector; dv copied; per row t.
__global__ void prep_bwd_rows_kernel(const bf16* y, const float* dqn, const float* dkn, const float* dv, int Hk, int Hv,
                                     int Dk, int Dv, bf16* dy) {
  const int64_t t = blockIdx.x;
  const int64_t C = int64_t(2) * Hk * Dk + int64_t(Hv) * Dv;
  const bf16* yr = y + t * C;
  bf16* dyr = dy + t * C;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  for (int vec = warp; vec < 2 * Hk; vec += nw) {
    const bf16* xs = yr + int64_t(vec) * Dk;
    const float* gs = vec < Hk ? dqn + (t * Hk + vec) * Dk : dkn + (t * Hk + (vec - Hk)) * Dk;
    float ss = 0.f, xd = 0.f;
    for (int i = lane; i < Dk; i += 32) {
      const float xv = ldf(xs + i);
      ss += xv * xv;
      xd += xv * gs[i];
    }
    ss = warp_sum(ss);
    xd = warp_sum(xd);
    const float r = rsqrtf(ss + kL2Eps), c = r * r * r * xd;
    for (int i = lane; i < Dk; i += 32) dyr[int64_t(vec) * Dk + i] = __float2bfloat16(r * gs[i] - c * ldf(xs + i));
  }
  for (int i = threadIdx.x; i < Hv * Dv; i += blockDim.x)
    dyr[int64_t(2) * Hk * Dk + i] = __float2bfloat16(dv[t * Hv * Dv + i]);
}

// Block = rows [blk*kGateRows, ...), thread = head: da, db written; partial [blk][2][Hv] (dA_log, ddt_bias).
// a, b, da, db: row stride ldab; dg, dbeta dense [T, Hv].
__global__ void prep_bwd_gates_kernel(const bf16* a, const bf16* b, int64_t ldab, const bf16* A_log,
                                      const bf16* dt_bias, const float* dg, const float* dbeta, int64_t T, int Hv,
                                      bf16* da, bf16* db, float* partial) {
  const int64_t t0 = int64_t(blockIdx.x) * kGateRows, t1 = min(T, t0 + kGateRows);
  for (int h = threadIdx.x; h < Hv; h += blockDim.x) {
    const float e = expf(ldf(A_log + h)), bias = ldf(dt_bias + h);
    float sa = 0.f, sb = 0.f;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i = t * Hv + h, j = t * ldab + h;
      const float z = ldf(a + j) + bias;
      const float dz = dg[i] * (-e * softplus_grad(z));
      da[j] = __float2bfloat16(dz);
      sb += dz;
      sa += dg[i] * (-e * softplus(z));
      const float s = sigm(ldf(b + j));
      db[j] = __float2bfloat16(dbeta[i] * (s * (1.f - s)));
    }
    partial[(int64_t(blockIdx.x) * 2 + 0) * Hv + h] = sa;
    partial[(int64_t(blockIdx.x) * 2 + 1) * Hv + h] = sb;
  }
}

// dA_log[h] += sum_blk partial[blk][0][h]; ddt_bias[h] += ... [1][h].
__global__ void gates_finish_kernel(const float* partial, int64_t nblk, int Hv, float* dA_log, float* ddt_bias) {
  const int h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h >= Hv) return;
  float sa = 0.f, sb = 0.f;
  for (int64_t s = 0; s < nblk; ++s) sa += partial[(s * 2) * Hv + h], sb += partial[(s * 2 + 1) * Hv + h];
  dA_log[h] += sa;
  ddt_bias[h] += sb;
}

// ------------------------------------------------------------------------------------------ gated norm
// Vector vec = t Hv + h of z (and dz): row t of stride ldz, head h. 32-bit division (the host checks
// nvec < 2^31): the 64-bit one cost the forward ~20 %.
__device__ __forceinline__ int64_t zoff(int64_t vec, int Hv, int Dv, int64_t ldz) {
  const unsigned v = unsigned(vec), t = v / unsigned(Hv);
  return int64_t(t) * ldz + int64_t(v - t * unsigned(Hv)) * Dv;
}

// One warp per vector of Dv (<= 128: each lane holds <= 4 entries).
__global__ void gnorm_fwd_kernel(const bf16* o, const bf16* z, int Hv, int64_t ldz, const bf16* w, int64_t nvec,
                                 int Dv, float eps, bf16* out, float* rstd) {
  const int64_t vec = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (vec >= nvec) return;
  const bf16* x = o + vec * Dv;
  float ss = 0.f;
  for (int i = lane; i < Dv; i += 32) ss += ldf(x + i) * ldf(x + i);
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / float(Dv) + eps);
  if (lane == 0) rstd[vec] = r;
  for (int i = lane; i < Dv; i += 32) {
    const float zv = ldf(z + zoff(vec, Hv, Dv, ldz) + i);
    out[vec * Dv + i] = __float2bfloat16(ldf(w + i) * (ldf(x + i) * r) * (zv * sigm(zv)));
  }
}

// n = x r; dn = dy w silu(z); dx = r (dn - n mean(dn n)); dz = dy w n silu'(z); dw partial per warp.
__global__ void gnorm_bwd_kernel(const bf16* o, const bf16* z, int Hv, int64_t ldz, const bf16* w, const float* rstd,
                                 const bf16* dout, int64_t nvec, int Dv, bf16* dx, bf16* dz, float* partial) {
  const int64_t gw = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;  // global warp
  const int lane = threadIdx.x % 32;
  const int64_t v0 = gw * kNormVecs;
  float dwacc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int64_t vec = v0; vec < min(nvec, v0 + kNormVecs); ++vec) {
    const float r = rstd[vec];
    const int64_t zo = zoff(vec, Hv, Dv, ldz);
    float dot = 0.f;
    for (int i = lane; i < Dv; i += 32) {
      const float zv = ldf(z + zo + i), n = ldf(o + vec * Dv + i) * r;
      dot += ldf(dout + vec * Dv + i) * ldf(w + i) * (zv * sigm(zv)) * n;
    }
    dot = warp_sum(dot);
    const float c = dot / float(Dv);
    for (int i = lane, k = 0; i < Dv; i += 32, ++k) {
      const float zv = ldf(z + zo + i), s = sigm(zv), n = ldf(o + vec * Dv + i) * r;
      const float dyv = ldf(dout + vec * Dv + i), dyw = dyv * ldf(w + i);
      dx[vec * Dv + i] = __float2bfloat16(r * (dyw * (zv * s) - n * c));
      dz[zo + i] = __float2bfloat16(dyw * n * (s * (1.f + zv * (1.f - s))));
      dwacc[k] += dyv * n * (zv * s);
    }
  }
  if (v0 < nvec)
    for (int i = lane, k = 0; i < Dv; i += 32, ++k) partial[gw * Dv + i] = dwacc[k];
}

// The same two kernels with each lane holding 4 consecutive entries of a vector (8-byte loads and stores, every
// input read once; Dv a multiple of 4, at most 128 * NV). The scalar ones read 2 bytes a lane a load (measured:
// 0.17 / 0.45 ms at the 27B shape, several times their bytes' time).
__device__ __forceinline__ void ld4(const bf16* p, float (&x)[4]) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  x[0] = a.x, x[1] = a.y, x[2] = b.x, x[3] = b.y;
}
__device__ __forceinline__ void st4(bf16* p, const float (&x)[4]) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(x[0], x[1]), b = __floats2bfloat162_rn(x[2], x[3]);
  uint2 u;
  u.x = *reinterpret_cast<const uint32_t*>(&a);
  u.y = *reinterpret_cast<const uint32_t*>(&b);
  *reinterpret_cast<uint2*>(p) = u;
}
// a[k] <- entries 4 lane + 128 k (those < Dv) of vector vec of p (rows of Dv).
template <int NV>
__device__ __forceinline__ void ld_vec4(const bf16* p, int64_t vec, int Dv, float (&a)[NV][4]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int k = 0; k < NV; ++k)
    if (4 * lane + 128 * k < Dv) ld4(p + vec * Dv + 4 * lane + 128 * k, a[k]);
}
template <int NV>
__global__ void gnorm_fwd_vec4_kernel(const bf16* o, const bf16* z, int Hv, int64_t ldz, const bf16* w, int64_t nvec,
                                      int Dv, float eps, bf16* out, float* rstd) {
  const int64_t vec = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (vec >= nvec) return;
  float x[NV][4], zv[NV][4];
  ld_vec4(o, vec, Dv, x);
  ld_vec4(z + zoff(vec, Hv, Dv, ldz), 0, Dv, zv);
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k)
    if (4 * lane + 128 * k < Dv)
#pragma unroll
      for (int e = 0; e < 4; ++e) ss += x[k][e] * x[k][e];
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / float(Dv) + eps);
  if (lane == 0) rstd[vec] = r;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int i = 4 * lane + 128 * k;
    if (i < Dv) {
      float wv[4], y[4];
      ld4(w + i, wv);
#pragma unroll
      for (int e = 0; e < 4; ++e) y[e] = wv[e] * (x[k][e] * r) * (zv[k][e] * sigm(zv[k][e]));
      st4(out + vec * Dv + i, y);
    }
  }
}
template <int NV>
__global__ void gnorm_bwd_vec4_kernel(const bf16* o, const bf16* z, int Hv, int64_t ldz, const bf16* w,
                                      const float* rstd, const bf16* dout, int64_t nvec, int Dv, bf16* dx, bf16* dz,
                                      float* partial) {
  const int64_t gw = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;  // global warp
  const int lane = threadIdx.x % 32;
  const int64_t v0 = gw * kNormVecs;
  if (v0 >= nvec) return;
  float wv[NV][4], dwacc[NV][4];
#pragma unroll
  for (int k = 0; k < NV; ++k)
#pragma unroll
    for (int e = 0; e < 4; ++e) wv[k][e] = dwacc[k][e] = 0.f;
  ld_vec4(w, 0, Dv, wv);
  for (int64_t vec = v0; vec < min(nvec, v0 + kNormVecs); ++vec) {
    const float r = rstd[vec];
    const int64_t zo = zoff(vec, Hv, Dv, ldz);
    float x[NV][4], zv[NV][4], dy[NV][4];
    ld_vec4(o, vec, Dv, x);
    ld_vec4(z + zo, 0, Dv, zv);
    ld_vec4(dout, vec, Dv, dy);
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k)
      if (4 * lane + 128 * k < Dv)
#pragma unroll
        for (int e = 0; e < 4; ++e) dot += dy[k][e] * wv[k][e] * (zv[k][e] * sigm(zv[k][e])) * (x[k][e] * r);
    dot = warp_sum(dot);
    const float c = dot / float(Dv);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int i = 4 * lane + 128 * k;
      if (i < Dv) {
        float gx[4], gz[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float zz = zv[k][e], s = sigm(zz), n = x[k][e] * r, dyw = dy[k][e] * wv[k][e];
          gx[e] = r * (dyw * (zz * s) - n * c);
          gz[e] = dyw * n * (s * (1.f + zz * (1.f - s)));
          dwacc[k][e] += dy[k][e] * n * (zz * s);
        }
        st4(dx + vec * Dv + i, gx);
        st4(dz + zo + i, gz);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int i = 4 * lane + 128 * k;
    if (i < Dv)
#pragma unroll
      for (int e = 0; e < 4; ++e) partial[gw * Dv + i + e] = dwacc[k][e];
  }
}
// prep_fwd_kernel with 4-entry loads and stores of the q/k vectors (a lane per 4 entries) and 16-byte copies of v
// (Dk, Dv multiples of 8; y, qn, kn, v 16-byte aligned). The 2-byte accesses kept the scalar kernel at ~1.8x its
// bytes' time (0.18 ms at the 27B shape).
__global__ void prep_fwd_vec_kernel(const bf16* y, const bf16* a, const bf16* b, int64_t ldab, const bf16* A_log,
                                    const bf16* dt_bias, int Hk, int Hv, int Dk, int Dv, bf16* qn, bf16* kn, bf16* v,
                                    float* g, float* beta) {
  const int64_t t = blockIdx.x;
  const int64_t C = int64_t(2) * Hk * Dk + int64_t(Hv) * Dv;
  const bf16* yr = y + t * C;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  for (int vec = warp; vec < 2 * Hk; vec += nw) {
    const bf16* src = yr + int64_t(vec) * Dk;
    float x[4][4];  // entries 4 lane + 128 k (Dk <= 128: k = 0 only; the loop keeps larger ones correct)
    float ss = 0.f;
    for (int i = 4 * lane, k = 0; i < Dk; i += 128, ++k) {
      ld4(src + i, x[k & 3]);
#pragma unroll
      for (int e = 0; e < 4; ++e) ss += x[k & 3][e] * x[k & 3][e];
    }
    ss = warp_sum(ss);
    const float r = rsqrtf(ss + kL2Eps);
    bf16* dst = vec < Hk ? qn + (t * Hk + vec) * Dk : kn + (t * Hk + (vec - Hk)) * Dk;
    for (int i = 4 * lane, k = 0; i < Dk; i += 128, ++k) {
      float o[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) o[e] = x[k & 3][e] * r;
      st4(dst + i, o);
    }
  }
  const uint4* vs = reinterpret_cast<const uint4*>(yr + int64_t(2) * Hk * Dk);
  uint4* vd = reinterpret_cast<uint4*>(v + t * Hv * Dv);
  for (int i = threadIdx.x; i < Hv * Dv / 8; i += blockDim.x) vd[i] = vs[i];
  for (int h = threadIdx.x; h < Hv; h += blockDim.x) {
    const float z = ldf(a + t * ldab + h) + ldf(dt_bias + h);
    g[t * Hv + h] = -expf(ldf(A_log + h)) * softplus(z);
    beta[t * Hv + h] = sigm(ldf(b + t * ldab + h));
  }
}

// Whether the vec4 kernels take these pointers and Dv (8-byte aligned vectors, at most 256 entries).
bool gnorm_vec4(int Dv, std::initializer_list<const void*> ptrs) {
  if (Dv % 4 != 0 || Dv > 256) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 8 != 0) return false;
  return true;
}

// ------------------------------------------------------------------------------------------ decode
// Block (sequence n, value head h), blockDim >= max(Dk, Dv), multiple of 32 (<= 128). The conv outputs of
// the channels this head reads are recomputed from conv_state (not modified here; conv_shift_kernel
// updates it afterwards). Thread e < Dv owns column e of the state.
// Row n's states are those of batch slot slots[n] (slots == nullptr: slot n).
__global__ void decode_rule_kernel(const bf16* qkv, int64_t ldx, const bf16* w, const bf16* a, const bf16* b,
                                   const bf16* A_log, const bf16* dt_bias, const float* conv_state, float* rec_state,
                                   int Hk, int Hv, int Dk, int Dv, int K, const int32_t* slots, bf16* o) {
  __shared__ float qs[128], ks[128], red[2][4];
  const int64_t n = blockIdx.x, sn = slots ? int64_t(slots[n]) : n;
  const int h = blockIdx.y, kh = h / (Hv / Hk), tid = threadIdx.x;
  const int64_t C = int64_t(2) * Hk * Dk + int64_t(Hv) * Dv;
  auto conv = [&](int64_t c) {
    const float* sc = conv_state + (sn * C + c) * (K - 1);
    float acc = 0.f;
    for (int i = 0; i < K - 1; ++i) acc += ldf(w + c * K + i) * sc[i];
    acc += ldf(w + c * K + K - 1) * ldf(qkv + n * ldx + c);
    return acc * sigm(acc);
  };
  float qv = 0.f, kv = 0.f, vv = 0.f;
  if (tid < Dk) {
    qv = conv(int64_t(kh) * Dk + tid);
    kv = conv(int64_t(Hk) * Dk + int64_t(kh) * Dk + tid);
  }
  if (tid < Dv) vv = conv(int64_t(2) * Hk * Dk + int64_t(h) * Dv + tid);
  float sq = warp_sum(qv * qv), sk = warp_sum(kv * kv);
  if (tid % 32 == 0) red[0][tid / 32] = sq, red[1][tid / 32] = sk;
  __syncthreads();
  sq = 0.f, sk = 0.f;
  for (int i = 0; i < int(blockDim.x / 32); ++i) sq += red[0][i], sk += red[1][i];
  const float scale = rsqrtf(float(Dk));
  if (tid < Dk) {
    qs[tid] = qv * rsqrtf(sq + kL2Eps) * scale;
    ks[tid] = kv * rsqrtf(sk + kL2Eps);
  }
  __syncthreads();
  const float z = ldf(a + n * Hv + h) + ldf(dt_bias + h);
  const float gdec = expf(-expf(ldf(A_log + h)) * softplus(z)), bt = sigm(ldf(b + n * Hv + h));
  if (tid >= Dv) return;
  float* S = rec_state + (sn * Hv + h) * int64_t(Dk) * Dv + tid;
  float u = 0.f;
  for (int d = 0; d < Dk; ++d) u += (gdec * S[int64_t(d) * Dv]) * ks[d];
  const float delta = bt * (vv - u);
  float acc = 0.f;
  for (int d = 0; d < Dk; ++d) {
    const float s = gdec * S[int64_t(d) * Dv] + ks[d] * delta;
    S[int64_t(d) * Dv] = s;
    acc += s * qs[d];
  }
  o[(n * Hv + h) * Dv + tid] = __float2bfloat16(acc);
}

__global__ void conv_shift_kernel(const bf16* qkv, int64_t ldx, int64_t n, int64_t C, int K, const int32_t* slots,
                                  float* conv_state) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * C || K < 2) return;
  const int64_t r = idx / C, c = idx % C, sr = slots ? int64_t(slots[r]) : r;
  float* sc = conv_state + (sr * C + c) * (K - 1);
  for (int i = 0; i + 1 < K - 1; ++i) sc[i] = sc[i + 1];
  sc[K - 2] = ldf(qkv + r * ldx + c);
}

unsigned nblocks(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

// out[i] += sum_s partial[s, i], deterministic: a thread per output where the outputs outnumber the splits, else
// a block per output.
void partial_finish(const float* partial, int64_t nsplit, int64_t n, float* out, cudaStream_t st) {
  if (n >= nsplit)
    partial_finish_kernel<<<nblocks(n, 256), 256, 0, st>>>(partial, nsplit, n, out);
  else
    partial_finish_wide_kernel<<<unsigned(n), 256, 0, st>>>(partial, nsplit, n, out);
  LT_CUDA_LAUNCH();
}

const bf16* B(const void* p) { return static_cast<const bf16*>(p); }
bf16* Bm(void* p) { return static_cast<bf16*>(p); }

void check_dims(const GdnDims& d, const char* who) {
  (void)who;
  LT_CUDA_REQUIRE(gdn_dims_supported(d),
                  "Gated DeltaNet kernels: unsupported shape (need batch, seq >= 0, Hk, Hv > 0, Hv % Hk == 0, Dk and "
                  "Dv multiples of 8 in [8, 128], conv kernel K in [1, 8])");
}

int64_t conv_row_chunks(const GdnDims& d) { return (d.seq + kConvRows - 1) / kConvRows; }

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
// The vectorised conv kernels apply: K in {2, 3, 4}, channels and row stride multiples of 8, 16-byte bases.
bool conv_vec8(const GdnDims& d, const void* x, int64_t ldx, const void* out) {
  return d.K >= 2 && d.K <= 4 && d.conv_ch() % 8 == 0 && ldx % 8 == 0 && aligned16(x) && aligned16(out);
}

}  // namespace

bool gdn_dims_supported(const GdnDims& d) {
  return d.batch >= 0 && d.seq >= 0 && d.Hk > 0 && d.Hv > 0 && d.Hv % d.Hk == 0 && d.Dk % 8 == 0 && d.Dv % 8 == 0 &&
         d.Dk >= 8 && d.Dk <= 128 && d.Dv >= 8 && d.Dv <= 128 && d.K >= 1 && d.K <= kMaxConvK &&
         d.conv_ch() < (int64_t(1) << 30);
}

void gdn_conv_silu_fwd(const GdnDims& d, const void* x, int64_t ldx, const void* w, const int32_t* seg, void* y,
                       cudaStream_t st) {
  check_dims(d, "gdn_conv_silu_fwd");
  const int64_t T = d.tokens(), C = d.conv_ch();
  LT_CUDA_REQUIRE(ldx >= C, "gdn_conv_silu_fwd: ldx < conv channels");
  if (T == 0) return;
  const int64_t n_rc = (d.seq + kConvFwdRows - 1) / kConvFwdRows;
  if (conv_vec8(d, x, ldx, y) && d.batch * n_rc < 65536) {  // gridDim.y limit; else the 1-D scalar grid
    const dim3 grid(nblocks(C / 8, 128), unsigned(d.batch * n_rc));
    if (d.K == 2) conv_fwd_vec8_kernel<2><<<grid, 128, 0, st>>>(B(x), ldx, B(w), seg, d.seq, C, n_rc, Bm(y));
    if (d.K == 3) conv_fwd_vec8_kernel<3><<<grid, 128, 0, st>>>(B(x), ldx, B(w), seg, d.seq, C, n_rc, Bm(y));
    if (d.K == 4) conv_fwd_vec8_kernel<4><<<grid, 128, 0, st>>>(B(x), ldx, B(w), seg, d.seq, C, n_rc, Bm(y));
  } else {
    conv_fwd_kernel<<<nblocks(T * C, 256), 256, 0, st>>>(B(x), ldx, B(w), seg, T, d.seq, C, int(d.K), Bm(y));
  }
  LT_CUDA_LAUNCH();
}

int64_t gdn_conv_bwd_workspace_bytes(const GdnDims& d) {
  return std::max<int64_t>(1, d.batch * conv_row_chunks(d)) * d.conv_ch() * d.K * int64_t(sizeof(float));
}

void gdn_conv_silu_bwd(const GdnDims& d, const void* x, int64_t ldx, const void* w, const void* dy,
                       const int32_t* seg, void* dx, float* dw, void* ws, cudaStream_t st) {
  check_dims(d, "gdn_conv_silu_bwd");
  const int64_t T = d.tokens(), C = d.conv_ch(), n_rc = conv_row_chunks(d), nsplit = d.batch * n_rc;
  LT_CUDA_REQUIRE(ldx >= C, "gdn_conv_silu_bwd: ldx < conv channels");
  LT_CUDA_REQUIRE(nsplit < 65536, "gdn_conv_silu_bwd: too many row chunks (batch * ceil(seq/64) >= 65536)");
  if (T == 0) return;
  float* partial = static_cast<float*>(ws);
  if (conv_vec8(d, x, ldx, dx) && aligned16(dy)) {
    const dim3 grid(nblocks(C / 8, 64), unsigned(nsplit));
    if (d.K == 2) conv_bwd_vec8_kernel<2><<<grid, 64, 0, st>>>(B(x), ldx, B(w), B(dy), seg, d.seq, C, n_rc, Bm(dx), partial);
    if (d.K == 3) conv_bwd_vec8_kernel<3><<<grid, 64, 0, st>>>(B(x), ldx, B(w), B(dy), seg, d.seq, C, n_rc, Bm(dx), partial);
    if (d.K == 4) conv_bwd_vec8_kernel<4><<<grid, 64, 0, st>>>(B(x), ldx, B(w), B(dy), seg, d.seq, C, n_rc, Bm(dx), partial);
  } else {
    conv_bwd_kernel<<<dim3(nblocks(C, 128), unsigned(nsplit)), 128, 0, st>>>(B(x), ldx, B(w), B(dy), seg, d.seq, C,
                                                                              int(d.K), n_rc, Bm(dx), partial);
  }
  LT_CUDA_LAUNCH();
  partial_finish(partial, nsplit, C * d.K, dw, st);
}

void gdn_prep_fwd(const GdnDims& d, const void* y, const void* a, const void* b, int64_t ldab, const void* A_log,
                  const void* dt_bias, void* qn, void* kn, void* v, float* g, float* beta, cudaStream_t st) {
  check_dims(d, "gdn_prep_fwd");
  const int64_t T = d.tokens();
  LT_CUDA_REQUIRE(ldab >= d.Hv, "gdn_prep_fwd: ldab < value heads");
  if (T == 0) return;
  LT_CUDA_REQUIRE(T < (int64_t(1) << 31), "gdn_prep_fwd: too many rows");
  const bool vec = d.Dk <= 512 && aligned16(y) && aligned16(qn) && aligned16(kn) && aligned16(v);
  (vec ? prep_fwd_vec_kernel : prep_fwd_kernel)<<<unsigned(T), 256, 0, st>>>(
      B(y), B(a), B(b), ldab, B(A_log), B(dt_bias), int(d.Hk), int(d.Hv), int(d.Dk), int(d.Dv), Bm(qn), Bm(kn), Bm(v),
      g, beta);
  LT_CUDA_LAUNCH();
}

int64_t gdn_prep_bwd_workspace_bytes(const GdnDims& d) {
  const int64_t nblk = std::max<int64_t>(1, (d.tokens() + kGateRows - 1) / kGateRows);
  return nblk * 2 * d.Hv * int64_t(sizeof(float));
}

void gdn_prep_bwd(const GdnDims& d, const void* y, const void* a, const void* b, int64_t ldab, const void* A_log,
                  const void* dt_bias, const float* dqn, const float* dkn, const float* dv, const float* dg,
                  const float* dbeta, void* dy, void* da, void* db, float* dA_log, float* ddt_bias, void* ws,
                  cudaStream_t st) {
  check_dims(d, "gdn_prep_bwd");
  const int64_t T = d.tokens();
  LT_CUDA_REQUIRE(ldab >= d.Hv, "gdn_prep_bwd: ldab < value heads");
  if (T == 0) return;
  LT_CUDA_REQUIRE(T < (int64_t(1) << 31), "gdn_prep_bwd: too many rows");
  prep_bwd_rows_kernel<<<unsigned(T), 256, 0, st>>>(B(y), dqn, dkn, dv, int(d.Hk), int(d.Hv), int(d.Dk), int(d.Dv),
                                                    Bm(dy));
  LT_CUDA_LAUNCH();
  const int64_t nblk = (T + kGateRows - 1) / kGateRows;
  float* partial = static_cast<float*>(ws);
  prep_bwd_gates_kernel<<<unsigned(nblk), 64, 0, st>>>(B(a), B(b), ldab, B(A_log), B(dt_bias), dg, dbeta, T,
                                                       int(d.Hv), Bm(da), Bm(db), partial);
  LT_CUDA_LAUNCH();
  gates_finish_kernel<<<nblocks(d.Hv, 64), 64, 0, st>>>(partial, nblk, int(d.Hv), dA_log, ddt_bias);
  LT_CUDA_LAUNCH();
}

void gdn_gated_norm_fwd(const GdnDims& d, const void* o, const void* z, int64_t ldz, const void* w, float eps,
                        void* out, float* rstd, cudaStream_t st) {
  check_dims(d, "gdn_gated_norm_fwd");
  LT_CUDA_REQUIRE(ldz >= d.Hv * d.Dv, "gdn_gated_norm_fwd: ldz < value heads x head dim");
  const int64_t nvec = d.tokens() * d.Hv;
  if (nvec == 0) return;
  LT_CUDA_REQUIRE(nvec < (int64_t(1) << 31), "gdn_gated_norm_fwd: rows x value heads >= 2^31");
  const int Dv = int(d.Dv), Hv = int(d.Hv);
  const bool v4 = gnorm_vec4(Dv, {o, z, w, out}) && ldz % 4 == 0;
  if (v4 && Dv <= 128)
    gnorm_fwd_vec4_kernel<1><<<nblocks(nvec, 8), 256, 0, st>>>(B(o), B(z), Hv, ldz, B(w), nvec, Dv, eps, Bm(out),
                                                                rstd);
  else if (v4)
    gnorm_fwd_vec4_kernel<2><<<nblocks(nvec, 8), 256, 0, st>>>(B(o), B(z), Hv, ldz, B(w), nvec, Dv, eps, Bm(out),
                                                                rstd);
  else
    gnorm_fwd_kernel<<<nblocks(nvec, 8), 256, 0, st>>>(B(o), B(z), Hv, ldz, B(w), nvec, Dv, eps, Bm(out), rstd);
  LT_CUDA_LAUNCH();
}

int64_t gdn_gated_norm_bwd_workspace_bytes(const GdnDims& d) {
  const int64_t nwarp = std::max<int64_t>(1, (d.tokens() * d.Hv + kNormVecs - 1) / kNormVecs);
  return nwarp * d.Dv * int64_t(sizeof(float));
}

void gdn_gated_norm_bwd(const GdnDims& d, const void* o, const void* z, int64_t ldz, const void* w, float eps,
                        const float* rstd, const void* dout, void* do_, void* dz, float* dw, void* ws,
                        cudaStream_t st) {
  (void)eps;  // rstd from the forward already holds 1/sqrt(mean(o^2) + eps)
  check_dims(d, "gdn_gated_norm_bwd");
  LT_CUDA_REQUIRE(ldz >= d.Hv * d.Dv, "gdn_gated_norm_bwd: ldz < value heads x head dim");
  const int64_t nvec = d.tokens() * d.Hv;
  if (nvec == 0) return;
  LT_CUDA_REQUIRE(nvec < (int64_t(1) << 31), "gdn_gated_norm_bwd: rows x value heads >= 2^31");
  const int64_t nwarp = (nvec + kNormVecs - 1) / kNormVecs;
  float* partial = static_cast<float*>(ws);
  const int Dv = int(d.Dv), Hv = int(d.Hv);
  const bool v4 = gnorm_vec4(Dv, {o, z, w, dout, do_, dz}) && ldz % 4 == 0;
  if (v4 && Dv <= 128)
    gnorm_bwd_vec4_kernel<1><<<nblocks(nwarp, 8), 256, 0, st>>>(B(o), B(z), Hv, ldz, B(w), rstd, B(dout), nvec, Dv,
                                                                 Bm(do_), Bm(dz), partial);
  else if (v4)
    gnorm_bwd_vec4_kernel<2><<<nblocks(nwarp, 8), 256, 0, st>>>(B(o), B(z), Hv, ldz, B(w), rstd, B(dout), nvec, Dv,
                                                                 Bm(do_), Bm(dz), partial);
  else
    gnorm_bwd_kernel<<<nblocks(nwarp, 8), 256, 0, st>>>(B(o), B(z), Hv, ldz, B(w), rstd, B(dout), nvec, Dv, Bm(do_),
                                                        Bm(dz), partial);
  LT_CUDA_LAUNCH();
  partial_finish(partial, nwarp, d.Dv, dw, st);
}

void gdn_decode_step(const GdnDims& d, const void* qkv, int64_t ldx, const void* w_conv, const void* a, const void* b,
                     const void* A_log, const void* dt_bias, float* conv_state, float* rec_state, void* o,
                     cudaStream_t st, const int32_t* slots) {
  check_dims(d, "gdn_decode_step");
  LT_CUDA_REQUIRE(d.seq == 1, "gdn_decode_step: seq must be 1");
  const int64_t n = d.batch, C = d.conv_ch();
  LT_CUDA_REQUIRE(ldx >= C, "gdn_decode_step: ldx < conv channels");
  if (n == 0) return;
  const int threads = int(std::max(d.Dk, d.Dv) + 31) / 32 * 32;
  decode_rule_kernel<<<dim3(unsigned(n), unsigned(d.Hv)), threads, 0, st>>>(
      B(qkv), ldx, B(w_conv), B(a), B(b), B(A_log), B(dt_bias), conv_state, rec_state, int(d.Hk), int(d.Hv),
      int(d.Dk), int(d.Dv), int(d.K), slots, Bm(o));
  LT_CUDA_LAUNCH();
  if (d.K >= 2) {
    conv_shift_kernel<<<nblocks(n * C, 256), 256, 0, st>>>(B(qkv), ldx, n, C, int(d.K), slots, conv_state);
    LT_CUDA_LAUNCH();
  }
}

}  // namespace lt::cuda
