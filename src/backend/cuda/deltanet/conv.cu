// Gated DeltaNet depthwise causal conv + SiLU, forward and backward (the CPU reference:
// src/backend/cpu/ops_gdn_conv.cpp). Packed rows restart the conv at each segment start; dw is reduced
// deterministically through per-row-chunk partials.
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "backend/cuda/deltanet/row_common.cuh"

namespace lt::cuda {
namespace {
using namespace dev;
using namespace gdn_rows;

constexpr int kConvRows = 64;  // rows per block of the conv backward (one dw partial per block)


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
// do (taps in the same order). The scalar forward read 2-byte values and recomputed the segment chain per
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

int64_t conv_row_chunks(const GdnDims& d) { return (d.seq + kConvRows - 1) / kConvRows; }

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
  check_dims(d);
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
  check_dims(d);
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

}  // namespace lt::cuda
