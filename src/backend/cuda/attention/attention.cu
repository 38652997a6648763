// Flash-attention-style causal GQA attention (forward and backward) on tensor cores (mma.sync
// m16n8k16, bf16 in, fp32 accumulate). Scores live in registers only: no S x S matrix in memory.
//
// Forward: one CTA = 64 query rows of one (sample, head); 4 warps x 16 rows. Key/value tiles of 64
// rows stream through shared memory with cp.async double buffering; online softmax in the log2
// domain (exp2f), fully masked rows handled (running max -inf -> scale 0).
// Backward (FlashAttention-2 order): one CTA = 64 (default) or 128 key rows (warps x 16) of one (sample,
// kv head); it loops over the query heads of its group and over query tiles, accumulating dK and dV in
// registers (deterministic, written once), and adds dQ with fp32 atomics into dq_acc.
// Grids are 1-D in longest-first order (see attn_fwd_kernel). The other variants (cluster head split,
// warp pairs) are kept selectable for benchmarking; their measured times are in docs/cuda.md.
// Head dims 64 and 128; 256 (Qwen3.5/3.6) where the opt-in shared memory allows (sm_90): the forward
// kernel and the warp-pair backward with 64-key tiles (the others would spill their accumulators).
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/dev_common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/attention/attention_variants.h"
#include "backend/cuda/kernel_options.h"

namespace lt::cuda {
namespace {

using namespace dev;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct AttnParams {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  const bf16* o;
  const bf16* dout;
  const int32_t* seg;
  bf16* out;
  float* lse;
  float* dq_acc;
  const float* delta;
  bf16* dk;
  bf16* dv;
  int S, heads, kv_heads;
  float scale, scale_log2;
  int batch;
  int lpt;    // 1: 1-D grid in longest-first order over all (sample, head) pairs (see below)
  int split;  // backward: CTAs (one cluster) sharing one key tile, each over a part of the query heads
};

// ------------------------------------------------------------------------------------------ forward
template <int HD>
struct FwdCfg {
  static constexpr int BR = 64, BC = 64, LD = HD + 8, THREADS = 128;
  static constexpr int kSmem = (BR * LD + 4 * BC * LD) * 2 + 2 * BC * 4;
};

// Length: one kernel body on purpose. Its stages (marked by the comments inside) share register-resident fragments
// and accumulators (the S tile, the running max and sum, the O accumulator) and the shared-memory pipeline's stage
// indices; split into functions they would pass those arrays by reference across every call (kept in registers only
// when all of it inlines) and read no clearer than the stage comments do.
template <int HD>
__global__ void __launch_bounds__(128) attn_fwd_kernel(AttnParams p) {
  using C = FwdCfg<HD>;
  constexpr int BR = C::BR, BC = C::BC, LD = C::LD;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sK = sQ + BR * LD;       // [2][BC][LD]
  bf16* sV = sK + 2 * BC * LD;   // [2][BC][LD]
  int* sSeg = reinterpret_cast<int*>(sV + 2 * BC * LD);  // [2][BC]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  // Causal work grows with the query tile: the heaviest (last) tiles go first. With lpt the order is
  // global (all samples and heads), which the block scheduler then fills longest-first.
  int qb, h, b;
  if (p.lpt) {
    const int nqb = (p.S + BR - 1) / BR, hb = p.heads * p.batch, i = blockIdx.x;
    qb = nqb - 1 - i / hb;
    h = (i % hb) % p.heads;
    b = (i % hb) / p.heads;
  } else {
    qb = gridDim.x - 1 - blockIdx.x;
    h = blockIdx.y;
    b = blockIdx.z;
  }
  const int S = p.S;
  const int kvh = h / (p.heads / p.kv_heads);
  const int64_t q_ld = int64_t(p.heads) * HD, kv_ld = int64_t(p.kv_heads) * HD;
  const int q0 = qb * BR;
  const bf16* qbase = p.q + int64_t(b) * S * q_ld + h * HD;
  const bf16* kbase = p.k + int64_t(b) * S * kv_ld + kvh * HD;
  const bf16* vbase = p.v + int64_t(b) * S * kv_ld + kvh * HD;
  const int32_t* seg = p.seg ? p.seg + int64_t(b) * S : nullptr;

  constexpr int CH = HD / 8;  // 16-byte chunks per row
  for (int idx = tid; idx < BR * CH; idx += C::THREADS) {
    const int r = idx / CH, c = (idx % CH) * 8;
    const bool ok = q0 + r < S;
    cp_async16(sQ + r * LD + c, qbase + int64_t(ok ? q0 + r : 0) * q_ld + c, ok);
  }
  auto load_kv = [&](int kb, int stage) {
    const int k0 = kb * BC;
    bf16* dk = sK + stage * BC * LD;
    bf16* dv = sV + stage * BC * LD;
    for (int idx = tid; idx < BC * CH; idx += C::THREADS) {
      const int r = idx / CH, c = (idx % CH) * 8;
      const bool ok = k0 + r < S;
      const int64_t off = int64_t(ok ? k0 + r : 0) * kv_ld + c;
      cp_async16(dk + r * LD + c, kbase + off, ok);
      cp_async16(dv + r * LD + c, vbase + off, ok);
    }
    if (seg && tid < BC) sSeg[stage * BC + tid] = (k0 + tid < S) ? seg[k0 + tid] : -1;
  };

  // Causal: key tiles up to the one holding this tile's last valid query.
  const int last_q = min(q0 + BR, S) - 1;
  const int nkb = last_q / BC + 1;
  load_kv(0, 0);
  cp_async_commit();

  const int row0 = warp * 16 + g;  // this thread's rows: row0 and row0 + 8 (tile-relative)
  int qseg[2] = {0, 0};
  if (seg) {
    qseg[0] = (q0 + row0 < S) ? seg[q0 + row0] : -2;
    qseg[1] = (q0 + row0 + 8 < S) ? seg[q0 + row0 + 8] : -2;
  }
  uint32_t qf[HD / 16][4];
  float acc[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const int li = lane / 8, lr = lane % 8;

  for (int kb = 0; kb < nkb; ++kb) {
    const int stage = kb & 1;
    if (kb + 1 < nkb) {
      load_kv(kb + 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (kb == 0) {
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk)
        ldmatrix_x4(qf[kk], sQ + (warp * 16 + (li & 1) * 8 + lr) * LD + kk * 16 + (li >> 1) * 8);
    }
    const bf16* tK = sK + stage * BC * LD;
    const bf16* tV = sV + stage * BC * LD;
    float s[BC / 8][4];
#pragma unroll
    for (int i = 0; i < BC / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < BC / 16; ++np) {
        uint32_t r[4];
        ldmatrix_x4(r, tK + (np * 16 + (li >> 1) * 8 + lr) * LD + kk * 16 + (li & 1) * 8);
        mma_bf16(s[2 * np], qf[kk], r[0], r[1]);
        mma_bf16(s[2 * np + 1], qf[kk], r[2], r[3]);
      }
    }
    const int k0 = kb * BC;
    const bool need_mask = seg != nullptr || k0 + BC > q0 || k0 + BC > S;
    float mx[2] = {m_run[0], m_run[1]};
#pragma unroll
    for (int nt = 0; nt < BC / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e] * p.scale_log2;
        if (need_mask) {
          const int hi = e >> 1;
          const int kr = nt * 8 + 2 * t + (e & 1);
          const int kpos = k0 + kr, qpos = q0 + row0 + 8 * hi;
          bool ok = kpos <= qpos && kpos < S;
          if (seg) ok = ok && sSeg[stage * BC + kr] == qseg[hi];
          if (!ok) x = -INFINITY;
        }
        s[nt][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    }
    float alpha[2], m_use[2];
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffffu, mx[hi], 1));
      mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffffu, mx[hi], 2));
      m_use[hi] = mx[hi] == -INFINITY ? 0.f : mx[hi];
      alpha[hi] = exp2f(m_run[hi] - m_use[hi]);  // m_run = -inf -> 0
      m_run[hi] = mx[hi];
      l_run[hi] *= alpha[hi];
    }
#pragma unroll
    for (int nt = 0; nt < BC / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pv = exp2f(s[nt][e] - m_use[e >> 1]);
        s[nt][e] = pv;
        l_run[e >> 1] += pv;
      }
    }
#pragma unroll
    for (int dt = 0; dt < HD / 8; ++dt) {
      acc[dt][0] *= alpha[0];
      acc[dt][1] *= alpha[0];
      acc[dt][2] *= alpha[1];
      acc[dt][3] *= alpha[1];
    }
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      uint32_t a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                       pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < HD / 16; ++dp) {
        uint32_t r[4];
        ldmatrix_x4_trans(r, tV + (kk * 16 + (li & 1) * 8 + lr) * LD + dp * 16 + (li >> 1) * 8);
        mma_bf16(acc[2 * dp], a, r[0], r[1]);
        mma_bf16(acc[2 * dp + 1], a, r[2], r[3]);
      }
    }
    __syncthreads();  // this stage is overwritten by the next iteration's prefetch
  }

#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    float l = l_run[hi];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int qpos = q0 + row0 + 8 * hi;
    if (qpos >= S) continue;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    bf16* orow = p.out + (int64_t(b) * S + qpos) * q_ld + h * HD;
#pragma unroll
    for (int dt = 0; dt < HD / 8; ++dt)
      *reinterpret_cast<uint32_t*>(orow + dt * 8 + 2 * t) =
          pack_bf16(acc[dt][2 * hi] * inv, acc[dt][2 * hi + 1] * inv);
    if (t == 0) p.lse[(int64_t(b) * S + qpos) * p.heads + h] = (m_run[hi] + log2f(l)) * kLn2;
  }
}

// --------------------------------------------------------------------------------- backward: delta
// delta[row, h] = sum_d dout[row, h, d] * o[row, h, d]; one warp per (row, head).
template <int HD>
__global__ void attn_delta_kernel(const bf16* o, const bf16* dout, int64_t rows, int heads, float* delta) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= rows * heads) return;
  const bf16* a = o + w * HD;
  const bf16* d = dout + w * HD;
  float s = 0.f;
#pragma unroll
  for (int i = lane * 2; i < HD; i += 64) {
    const float2 x = unpack_bf16(*reinterpret_cast<const uint32_t*>(a + i));
    const float2 y = unpack_bf16(*reinterpret_cast<const uint32_t*>(d + i));
    s += x.x * y.x + x.y * y.y;
  }
  s = warp_sum(s);
  if (lane == 0) delta[w] = s;
}

// ------------------------------------------------------------------------------ backward: dK, dV, dQ
template <int HD, int BC_ = 128>
struct BwdCfg {
  static constexpr int BC = BC_;               // key rows per CTA (BC / 16 warps x 16)
  static constexpr int NW = BC / 16, THREADS = NW * 32;
  static constexpr int BQ = HD == 128 ? 32 : 64;  // query rows per inner step
  static constexpr int LD = HD + 8, LDS = BQ + 8;
  static constexpr int kSmem = (2 * BC * LD + 4 * BQ * LD + BC * LDS) * 2 + (2 * 3 * BQ + BC) * 4;
};

// dQ += scale * dS K for one query tile (BQ rows) over the BC keys of the CTA's tile, added into p.dq_acc with
// fp32 atomics (several key tiles add to the same rows). dS^T is in shared memory (bf16, key-major, row stride LDS),
// K in shared memory (row stride LD). The warps split the tile: warp / WPM picks the 16-row m-tile, warp % WPM the
// DQC columns. Shared by both backward kernels.
template <int HD, int BC, int LD, int LDS, int DQC, int WPM>
__device__ __forceinline__ void dq_tile_add(const AttnParams& p, const bf16* sdS, const bf16* sK, int warp, int lane,
                                            int qs, int64_t row_base, int64_t q_ld, int h) {
  const int g = lane / 4, t = lane % 4, li = lane / 8, lr = lane % 8, S = p.S;
  const int mt = warp / WPM, c0 = (warp % WPM) * DQC;
  float dq[DQC / 8][4];
#pragma unroll
  for (int i = 0; i < DQC / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < BC / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4_trans(a, sdS + (kk * 16 + (li >> 1) * 8 + lr) * LDS + mt * 16 + (li & 1) * 8);
#pragma unroll
    for (int dp = 0; dp < DQC / 16; ++dp) {
      uint32_t r[4];
      ldmatrix_x4_trans(r, sK + (kk * 16 + (li & 1) * 8 + lr) * LD + c0 + dp * 16 + (li >> 1) * 8);
      mma_bf16(dq[2 * dp], a, r[0], r[1]);
      mma_bf16(dq[2 * dp + 1], a, r[2], r[3]);
    }
  }
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int qpos = qs + mt * 16 + g + 8 * hi;
    if (qpos >= S) continue;
    float* dst = p.dq_acc + (row_base + qpos) * q_ld + h * HD + c0;
#pragma unroll
    for (int nt = 0; nt < DQC / 8; ++nt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      atomicAdd(reinterpret_cast<float2*>(dst + nt * 8 + 2 * t),
                make_float2(dq[nt][2 * hi] * p.scale, dq[nt][2 * hi + 1] * p.scale));
#else
      atomicAdd(dst + nt * 8 + 2 * t, dq[nt][2 * hi] * p.scale);
      atomicAdd(dst + nt * 8 + 2 * t + 1, dq[nt][2 * hi + 1] * p.scale);
#endif
    }
  }
}

// CL: the CTAs of one cluster (p.split of them, sm_90) share one key tile, each takes a contiguous
// part of the group's query heads; their dK/dV partials are summed through distributed shared memory
// in rank order (deterministic) and rank 0 writes them. Shortens the longest CTA (the first key tile
// sees every query) by the split factor, which balances the causal triangle over the SMs.
// The default launch is BC_ 64 without clusters; BC_ 128 and CL are comparison variants (kBwdVariants).
// Length: one kernel body on purpose. Its stages (marked by the comments inside) share register-resident fragments
// and accumulators (S^T, dP^T, the dK and dV accumulators; the dQ tile is dq_tile_add) and the shared-memory
// pipeline's stage indices; split into functions they would pass those arrays by reference across every call (kept
// in registers only when all of it inlines) and read no clearer than the stage comments do.
template <int HD, int BC_, bool CL>
__global__ void __launch_bounds__(BwdCfg<HD, BC_>::THREADS) attn_bwd_kernel(AttnParams p) {
  using C = BwdCfg<HD, BC_>;
  constexpr int BC = C::BC, BQ = C::BQ, LD = C::LD, LDS = C::LDS;
  constexpr int NQT = BQ / 8;            // query n-tiles of S^T per warp
  constexpr int MT = BQ / 16;            // dQ m-tiles
  constexpr int WPM = C::NW / MT;        // warps per dQ m-tile
  constexpr int DQC = HD / WPM;          // dQ columns per warp
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);
  bf16* sV = sK + BC * LD;
  bf16* sQ = sV + BC * LD;        // [2][BQ][LD]
  bf16* sdO = sQ + 2 * BQ * LD;   // [2][BQ][LD]
  bf16* sdS = sdO + 2 * BQ * LD;  // [BC][LDS] (dS^T: key-major)
  float* sLse = reinterpret_cast<float*>(sdS + BC * LDS);  // [2][BQ], log2 domain
  float* sDel = sLse + 2 * BQ;                             // [2][BQ]
  int* sSegQ = reinterpret_cast<int*>(sDel + 2 * BQ);       // [2][BQ]
  int* sSegK = sSegQ + 2 * BQ;                              // [BC]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int li = lane / 8, lr = lane % 8;
  int kb, kvh, b, part = 0;
  if (p.lpt) {  // 1-D grid: key tiles with the most work (kb = 0) first over all (sample, kv head)
    const int i = blockIdx.x / p.split, kb_stride = p.kv_heads * p.batch;
    part = blockIdx.x % p.split;
    kb = i / kb_stride;
    kvh = (i % kb_stride) % p.kv_heads;
    b = (i % kb_stride) / p.kv_heads;
  } else {
    kb = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  }
  const int S = p.S;
  const int rep = p.heads / p.kv_heads;
  const int h_begin = kvh * rep + part * rep / p.split;     // this CTA's query heads
  const int n_heads = (part + 1) * rep / p.split - part * rep / p.split;
  const int64_t q_ld = int64_t(p.heads) * HD, kv_ld = int64_t(p.kv_heads) * HD;
  const int k0 = kb * BC;
  const int64_t row_base = int64_t(b) * S;
  const int32_t* seg = p.seg ? p.seg + row_base : nullptr;
  constexpr int CH = HD / 8;

  for (int idx = tid; idx < BC * CH; idx += C::THREADS) {
    const int r = idx / CH, c = (idx % CH) * 8;
    const bool ok = k0 + r < S;
    const int64_t off = (row_base + (ok ? k0 + r : 0)) * kv_ld + kvh * HD + c;
    cp_async16(sK + r * LD + c, p.k + off, ok);
    cp_async16(sV + r * LD + c, p.v + off, ok);
  }
  if (tid < BC) sSegK[tid] = (seg && k0 + tid < S) ? seg[k0 + tid] : 0;

  const int qb0 = k0 / BQ, nqb = (S + BQ - 1) / BQ;
  const int n_it = n_heads * (nqb - qb0);
  auto load_q = [&](int it, int stage) {
    const int h = h_begin + it / (nqb - qb0);
    const int qs = (qb0 + it % (nqb - qb0)) * BQ;
    bf16* dq = sQ + stage * BQ * LD;
    bf16* ddo = sdO + stage * BQ * LD;
    for (int idx = tid; idx < BQ * CH; idx += C::THREADS) {
      const int r = idx / CH, c = (idx % CH) * 8;
      const bool ok = qs + r < S;
      const int64_t off = (row_base + (ok ? qs + r : 0)) * q_ld + h * HD + c;
      cp_async16(dq + r * LD + c, p.q + off, ok);
      cp_async16(ddo + r * LD + c, p.dout + off, ok);
    }
    if (tid < BQ) {
      const bool ok = qs + tid < S;
      const int64_t ri = (row_base + qs + tid) * p.heads + h;
      sLse[stage * BQ + tid] = ok ? p.lse[ri] * kLog2e : 0.f;
      sDel[stage * BQ + tid] = ok ? p.delta[ri] : 0.f;
      sSegQ[stage * BQ + tid] = (seg && ok) ? seg[qs + tid] : 0;
    }
  };
  if (n_it > 0) load_q(0, 0);
  cp_async_commit();

  float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;

  const int kw = warp * 16;  // this warp's key rows (tile-relative)
  for (int it = 0; it < n_it; ++it) {
    const int stage = it & 1;
    if (it + 1 < n_it) {
      load_q(it + 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int h = h_begin + it / (nqb - qb0);
    const int qs = (qb0 + it % (nqb - qb0)) * BQ;
    const bf16* tQ = sQ + stage * BQ * LD;
    const bf16* tdO = sdO + stage * BQ * LD;
    const float* tL = sLse + stage * BQ;
    const float* tD = sDel + stage * BQ;
    const int* tS = sSegQ + stage * BQ;

    // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys x BQ queries.
    float st[NQT][4], dpt[NQT][4];
#pragma unroll
    for (int i = 0; i < NQT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[i][e] = dpt[i][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t ka[4], va[4];
      ldmatrix_x4(ka, sK + (kw + (li & 1) * 8 + lr) * LD + kk * 16 + (li >> 1) * 8);
      ldmatrix_x4(va, sV + (kw + (li & 1) * 8 + lr) * LD + kk * 16 + (li >> 1) * 8);
#pragma unroll
      for (int np = 0; np < BQ / 16; ++np) {
        uint32_t r[4], rd[4];
        ldmatrix_x4(r, tQ + (np * 16 + (li >> 1) * 8 + lr) * LD + kk * 16 + (li & 1) * 8);
        ldmatrix_x4(rd, tdO + (np * 16 + (li >> 1) * 8 + lr) * LD + kk * 16 + (li & 1) * 8);
        mma_bf16(st[2 * np], ka, r[0], r[1]);
        mma_bf16(st[2 * np + 1], ka, r[2], r[3]);
        mma_bf16(dpt[2 * np], va, rd[0], rd[1]);
        mma_bf16(dpt[2 * np + 1], va, rd[2], rd[3]);
      }
    }
    // P^T and dS^T = P^T (dP^T - delta) (the softmax scale is applied to dK and dQ at the end).
    // Masks only where some key of this warp may follow some query, or rows run past S.
    const bool need_mask = seg != nullptr || qs < k0 + kw + 15 || qs + BQ > S || k0 + kw + 16 > S;
#pragma unroll
    for (int nt = 0; nt < NQT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int kr = kw + g + 8 * (e >> 1);
        const int qr = nt * 8 + 2 * t + (e & 1);
        bool ok = true;
        if (need_mask) {
          const int kpos = k0 + kr, qpos = qs + qr;
          ok = kpos <= qpos && qpos < S && kpos < S && (!seg || sSegK[kr] == tS[qr]);
        }
        const float pv = ok ? exp2f(st[nt][e] * p.scale_log2 - tL[qr]) : 0.f;
        st[nt][e] = pv;
        dpt[nt][e] = pv * (dpt[nt][e] - tD[qr]);
      }
    }
    // dV += P^T dO, dK += dS^T Q (k-dim = queries).
#pragma unroll
    for (int kq = 0; kq < BQ / 16; ++kq) {
      uint32_t pa[4] = {pack_bf16(st[2 * kq][0], st[2 * kq][1]), pack_bf16(st[2 * kq][2], st[2 * kq][3]),
                        pack_bf16(st[2 * kq + 1][0], st[2 * kq + 1][1]),
                        pack_bf16(st[2 * kq + 1][2], st[2 * kq + 1][3])};
      uint32_t da[4] = {pack_bf16(dpt[2 * kq][0], dpt[2 * kq][1]), pack_bf16(dpt[2 * kq][2], dpt[2 * kq][3]),
                        pack_bf16(dpt[2 * kq + 1][0], dpt[2 * kq + 1][1]),
                        pack_bf16(dpt[2 * kq + 1][2], dpt[2 * kq + 1][3])};
#pragma unroll
      for (int dp = 0; dp < HD / 16; ++dp) {
        uint32_t r[4], rq[4];
        ldmatrix_x4_trans(r, tdO + (kq * 16 + (li & 1) * 8 + lr) * LD + dp * 16 + (li >> 1) * 8);
        ldmatrix_x4_trans(rq, tQ + (kq * 16 + (li & 1) * 8 + lr) * LD + dp * 16 + (li >> 1) * 8);
        mma_bf16(dv[2 * dp], pa, r[0], r[1]);
        mma_bf16(dv[2 * dp + 1], pa, r[2], r[3]);
        mma_bf16(dk[2 * dp], da, rq[0], rq[1]);
        mma_bf16(dk[2 * dp + 1], da, rq[2], rq[3]);
      }
    }
    // dS^T -> shared memory (bf16), then dQ = scale * dS K over all 64 keys of the tile.
#pragma unroll
    for (int nt = 0; nt < NQT; ++nt) {
#pragma unroll
      for (int hi = 0; hi < 2; ++hi)
        *reinterpret_cast<uint32_t*>(sdS + (kw + g + 8 * hi) * LDS + nt * 8 + 2 * t) =
            pack_bf16(dpt[nt][2 * hi], dpt[nt][2 * hi + 1]);
    }
    __syncthreads();
    dq_tile_add<HD, BC, LD, LDS, DQC, WPM>(p, sdS, sK, warp, lane, qs, row_base, q_ld, h);
    __syncthreads();  // sQ/sdO stage and sdS are reused by the next iteration
  }
  cp_async_wait<0>();  // (only the empty group of a CTA without heads can be pending)

  if constexpr (CL) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Sum the partials of the cluster's CTAs: rank r > 0 parks its accumulators in its shared memory
    // (same slot per thread in every rank), rank 0 adds ranks 1, 2, ... in order. dV, then dK.
    static_assert(HD / 2 * C::THREADS * 4 <= C::kSmem, "reduction buffer exceeds shared memory");
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    const unsigned rank = cl.block_rank();
    float* red = reinterpret_cast<float*>(smem);
    __syncthreads();
#pragma unroll
    for (int round = 0; round < 2; ++round) {
      float(&acc)[HD / 8][4] = round == 0 ? dv : dk;
      if (rank != 0) {
#pragma unroll
        for (int dt = 0; dt < HD / 8; ++dt)
#pragma unroll
          for (int e = 0; e < 4; ++e) red[(dt * 4 + e) * C::THREADS + tid] = acc[dt][e];
      }
      cl.sync();
      if (rank == 0) {
        for (int r = 1; r < p.split; ++r) {
          const float* rem = cl.map_shared_rank(red, r);
#pragma unroll
          for (int dt = 0; dt < HD / 8; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[dt][e] += rem[(dt * 4 + e) * C::THREADS + tid];
        }
      }
      cl.sync();  // the partials are read before they are overwritten (or their CTA exits)
    }
    if (rank != 0) return;
#endif
  }

#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int kpos = k0 + kw + g + 8 * hi;
    if (kpos >= S) continue;
    const int64_t off = (row_base + kpos) * kv_ld + kvh * HD;
#pragma unroll
    for (int dt = 0; dt < HD / 8; ++dt) {
      *reinterpret_cast<uint32_t*>(p.dk + off + dt * 8 + 2 * t) =
          pack_bf16(dk[dt][2 * hi] * p.scale, dk[dt][2 * hi + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(p.dv + off + dt * 8 + 2 * t) = pack_bf16(dv[dt][2 * hi], dv[dt][2 * hi + 1]);
    }
  }
}

// ------------------------------------------------------------- backward, warp pairs (dV | dK warps)
// Same work as attn_bwd_kernel with 64-key tiles, but each 16-key slice has two warps: warp "P"
// computes S^T, P^T and accumulates dV; warp "D" computes dP^T, takes P^T from shared memory (fp32,
// same fragment slot per lane), forms dS^T and accumulates dK. Each warp holds one HD-wide
// accumulator instead of two, so registers per thread fall (~half the accumulators) and twice the
// warps fit on an SM to hide the latency of the mma/ldmatrix chains.
// The backward at head_dim 256; at 64 and 128 a comparison variant (kBwdVariants).
template <int HD, int BC_>
struct PairCfg {
  static constexpr int BC = BC_, NP = BC / 16, NW = 2 * NP, THREADS = NW * 32;
  static constexpr int BQ = HD == 128 ? 32 : 64;
  static constexpr int LD = HD + 8, LDS = BQ + 8;
  static constexpr int kSmem =
      (2 * BC * LD + 4 * BQ * LD + BC * LDS) * 2 + BC * BQ * 4 + (2 * 3 * BQ + BC) * 4;
};

// Length: one kernel body on purpose. Its stages (marked by the comments inside) share register-resident fragments
// and accumulators (S^T or dP^T, the dK or dV accumulator; the dQ tile is dq_tile_add) and the shared-memory
// pipeline's stage indices; split into functions they would pass those arrays by reference across every call (kept
// in registers only when all of it inlines) and read no clearer than the stage comments do.
template <int HD, int BC_, int MINB>
__global__ void __launch_bounds__(PairCfg<HD, BC_>::THREADS, MINB) attn_bwd_pair_kernel(AttnParams p) {
  using C = PairCfg<HD, BC_>;
  constexpr int BC = C::BC, BQ = C::BQ, LD = C::LD, LDS = C::LDS;
  constexpr int NQT = BQ / 8;
  constexpr int MT = BQ / 16;
  constexpr int WPM = C::NW / MT;
  constexpr int DQC = HD / WPM;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);
  bf16* sV = sK + BC * LD;
  bf16* sQ = sV + BC * LD;        // [2][BQ][LD]
  bf16* sdO = sQ + 2 * BQ * LD;   // [2][BQ][LD]
  bf16* sdS = sdO + 2 * BQ * LD;  // [BC][LDS]
  float* sP = reinterpret_cast<float*>(sdS + BC * LDS);  // [NP][NQT*4][32]: P^T in fragment order
  float* sLse = sP + BC * BQ;
  float* sDel = sLse + 2 * BQ;
  int* sSegQ = reinterpret_cast<int*>(sDel + 2 * BQ);
  int* sSegK = sSegQ + 2 * BQ;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int li = lane / 8, lr = lane % 8;
  const int pair = warp % C::NP;
  const bool dkw = warp >= C::NP;  // this warp accumulates dK (else dV)
  const int kb_stride = p.kv_heads * p.batch, i = blockIdx.x;
  const int kb = i / kb_stride, kvh = (i % kb_stride) % p.kv_heads, b = (i % kb_stride) / p.kv_heads;
  const int S = p.S, rep = p.heads / p.kv_heads;
  const int64_t q_ld = int64_t(p.heads) * HD, kv_ld = int64_t(p.kv_heads) * HD;
  const int k0 = kb * BC;
  const int64_t row_base = int64_t(b) * S;
  const int32_t* seg = p.seg ? p.seg + row_base : nullptr;
  constexpr int CH = HD / 8;

  for (int idx = tid; idx < BC * CH; idx += C::THREADS) {
    const int r = idx / CH, c = (idx % CH) * 8;
    const bool ok = k0 + r < S;
    const int64_t off = (row_base + (ok ? k0 + r : 0)) * kv_ld + kvh * HD + c;
    cp_async16(sK + r * LD + c, p.k + off, ok);
    cp_async16(sV + r * LD + c, p.v + off, ok);
  }
  if (tid < BC) sSegK[tid] = (seg && k0 + tid < S) ? seg[k0 + tid] : 0;

  const int qb0 = k0 / BQ, nqb = (S + BQ - 1) / BQ;
  const int n_it = rep * (nqb - qb0);
  auto load_q = [&](int it, int stage) {
    const int h = kvh * rep + it / (nqb - qb0);
    const int qs = (qb0 + it % (nqb - qb0)) * BQ;
    bf16* dq = sQ + stage * BQ * LD;
    bf16* ddo = sdO + stage * BQ * LD;
    for (int idx = tid; idx < BQ * CH; idx += C::THREADS) {
      const int r = idx / CH, c = (idx % CH) * 8;
      const bool ok = qs + r < S;
      const int64_t off = (row_base + (ok ? qs + r : 0)) * q_ld + h * HD + c;
      cp_async16(dq + r * LD + c, p.q + off, ok);
      cp_async16(ddo + r * LD + c, p.dout + off, ok);
    }
    if (tid < BQ) {
      const bool ok = qs + tid < S;
      const int64_t ri = (row_base + qs + tid) * p.heads + h;
      sLse[stage * BQ + tid] = ok ? p.lse[ri] * kLog2e : 0.f;
      sDel[stage * BQ + tid] = ok ? p.delta[ri] : 0.f;
      sSegQ[stage * BQ + tid] = (seg && ok) ? seg[qs + tid] : 0;
    }
  };
  load_q(0, 0);
  cp_async_commit();

  float acc[HD / 8][4];  // dV (P warps) or dK (D warps) of this warp's 16 keys
#pragma unroll
  for (int i2 = 0; i2 < HD / 8; ++i2)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i2][e] = 0.f;

  const int kw = pair * 16;
  float* myP = sP + pair * (NQT * 4 * 32);
  for (int it = 0; it < n_it; ++it) {
    const int stage = it & 1;
    if (it + 1 < n_it) {
      load_q(it + 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int h = kvh * rep + it / (nqb - qb0);
    const int qs = (qb0 + it % (nqb - qb0)) * BQ;
    const bf16* tQ = sQ + stage * BQ * LD;
    const bf16* tdO = sdO + stage * BQ * LD;
    const float* tL = sLse + stage * BQ;
    const float* tD = sDel + stage * BQ;
    const int* tS = sSegQ + stage * BQ;

    // P warps: S^T = K Q^T; D warps: dP^T = V dO^T (16 keys x BQ queries each).
    float x[NQT][4];
#pragma unroll
    for (int n = 0; n < NQT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[n][e] = 0.f;
    const bf16* aS = dkw ? sV : sK;
    const bf16* bS = dkw ? tdO : tQ;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, aS + (kw + (li & 1) * 8 + lr) * LD + kk * 16 + (li >> 1) * 8);
#pragma unroll
      for (int np = 0; np < BQ / 16; ++np) {
        uint32_t r[4];
        ldmatrix_x4(r, bS + (np * 16 + (li >> 1) * 8 + lr) * LD + kk * 16 + (li & 1) * 8);
        mma_bf16(x[2 * np], a, r[0], r[1]);
        mma_bf16(x[2 * np + 1], a, r[2], r[3]);
      }
    }
    if (!dkw) {
      const bool need_mask = seg != nullptr || qs < k0 + kw + 15 || qs + BQ > S || k0 + kw + 16 > S;
#pragma unroll
      for (int nt = 0; nt < NQT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int kr = kw + g + 8 * (e >> 1);
          const int qr = nt * 8 + 2 * t + (e & 1);
          bool ok = true;
          if (need_mask) {
            const int kpos = k0 + kr, qpos = qs + qr;
            ok = kpos <= qpos && qpos < S && kpos < S && (!seg || sSegK[kr] == tS[qr]);
          }
          const float pv = ok ? exp2f(x[nt][e] * p.scale_log2 - tL[qr]) : 0.f;
          x[nt][e] = pv;
          myP[(nt * 4 + e) * 32 + lane] = pv;
        }
      }
    }
    __syncthreads();  // P^T visible to the D warps
    if (dkw) {
#pragma unroll
      for (int nt = 0; nt < NQT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qr = nt * 8 + 2 * t + (e & 1);
          x[nt][e] = myP[(nt * 4 + e) * 32 + lane] * (x[nt][e] - tD[qr]);
        }
#pragma unroll
        for (int hi = 0; hi < 2; ++hi)
          *reinterpret_cast<uint32_t*>(sdS + (kw + g + 8 * hi) * LDS + nt * 8 + 2 * t) =
              pack_bf16(x[nt][2 * hi], x[nt][2 * hi + 1]);
      }
    }
    // dV += P^T dO (P warps), dK += dS^T Q (D warps); k-dim = queries.
    const bf16* bT = dkw ? tQ : tdO;
#pragma unroll
    for (int kq = 0; kq < BQ / 16; ++kq) {
      uint32_t a[4] = {pack_bf16(x[2 * kq][0], x[2 * kq][1]), pack_bf16(x[2 * kq][2], x[2 * kq][3]),
                       pack_bf16(x[2 * kq + 1][0], x[2 * kq + 1][1]), pack_bf16(x[2 * kq + 1][2], x[2 * kq + 1][3])};
#pragma unroll
      for (int dp = 0; dp < HD / 16; ++dp) {
        uint32_t r[4];
        ldmatrix_x4_trans(r, bT + (kq * 16 + (li & 1) * 8 + lr) * LD + dp * 16 + (li >> 1) * 8);
        mma_bf16(acc[2 * dp], a, r[0], r[1]);
        mma_bf16(acc[2 * dp + 1], a, r[2], r[3]);
      }
    }
    __syncthreads();  // dS^T complete
    dq_tile_add<HD, BC, LD, LDS, DQC, WPM>(p, sdS, sK, warp, lane, qs, row_base, q_ld, h);
    __syncthreads();  // sQ/sdO stage, sP and sdS are reused by the next iteration
  }

  const float f = dkw ? p.scale : 1.f;
  bf16* out = dkw ? p.dk : p.dv;
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int kpos = k0 + kw + g + 8 * hi;
    if (kpos >= S) continue;
    const int64_t off = (row_base + kpos) * kv_ld + kvh * HD;
#pragma unroll
    for (int dt = 0; dt < HD / 8; ++dt)
      *reinterpret_cast<uint32_t*>(out + off + dt * 8 + 2 * t) = pack_bf16(acc[dt][2 * hi] * f, acc[dt][2 * hi + 1] * f);
  }
}

AttnParams make_params(const AttnDims& d) {
  LT_CUDA_REQUIRE(d.heads > 0 && d.kv_heads > 0 && d.heads % d.kv_heads == 0,
                  "attention: heads must be a positive multiple of kv_heads");
  LT_CUDA_REQUIRE(d.seq > 0 && d.seq < (1 << 30) && d.batch > 0 && d.batch < 65536, "attention: bad batch/seq");
  AttnParams p{};
  p.S = int(d.seq);
  p.heads = int(d.heads);
  p.kv_heads = int(d.kv_heads);
  p.batch = int(d.batch);
  p.scale = d.scale;
  p.scale_log2 = d.scale * kLog2e;
  p.split = 1;
  return p;
}

// ------------------------------------------------------------------------------------- variants
// Kept selectable (KernelOptions::attention_{fwd,bwd}_variant, env LT_ATTN_FWD / LT_ATTN_BWD) so that one GPU run
// can time them all; the defaults are the fastest measured on the H200 (docs/cuda.md). Every variant but the
// defaults (forward 1, backward 2) is a comparison variant: bench_cuda_kernels times them all.
struct BwdVariant {
  int bc, split;
  bool lpt;
  const char* name;
};
constexpr BwdVariant kBwdVariants[] = {
    {128, 1, false, "bc128 grid(kb,kvh,b)"}, {128, 1, true, "bc128 lpt"},        {64, 1, true, "bc64 lpt"},
    {128, 2, true, "bc128 lpt split2"},      {64, 2, true, "bc64 lpt split2"},   {128, 4, true, "bc128 lpt split4"},
    {64, 4, true, "bc64 lpt split4"},        {-64, 1, true, "bc64 lpt warp pairs"},  {-65, 1, true, "bc64 lpt warp pairs, 2 CTAs/SM"},
    {-128, 1, true, "bc128 lpt warp pairs (16 warps)"},
};
constexpr int kNumBwd = int(sizeof(kBwdVariants) / sizeof(kBwdVariants[0]));
constexpr int kNumFwd = 2;  // 0: grid (qb, h, b); 1: 1-D longest-first

int default_bwd(int) { return 2; }  // bc64 lpt: fastest for hd 64 and 128 (run 5)
int default_fwd(int) { return 1; }
// KernelOptions::attention_{fwd,bwd}_variant (validated there), else the default.
int fwd_variant(int hd) {
  const int v = kernel_options().attention_fwd_variant;
  return v >= 0 ? v : default_fwd(hd);
}
int bwd_variant(int hd) {
  const int v = kernel_options().attention_bwd_variant;
  return v >= 0 ? v : default_bwd(hd);
}

bool has_clusters() {
  static const bool ok = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    return major >= 9;
  }();
  return ok;
}

template <int HD>
void launch_fwd(AttnParams p, int64_t batch, cudaStream_t st) {
  using C = FwdCfg<HD>;
  static bool attr = false;  // the dynamic shared-memory limit is set once per kernel
  if (!attr) {
    LT_CUDA(cudaFuncSetAttribute(attn_fwd_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
    attr = true;
  }
  p.lpt = fwd_variant(HD) == 1;
  const unsigned nqb = unsigned((p.S + C::BR - 1) / C::BR);
  const dim3 grid = p.lpt ? dim3(nqb * unsigned(p.heads) * unsigned(batch)) : dim3(nqb, unsigned(p.heads), unsigned(batch));
  attn_fwd_kernel<HD><<<grid, C::THREADS, C::kSmem, st>>>(p);
  LT_CUDA_LAUNCH();
}

template <int HD, int BC, bool CL>
void launch_bwd_kernel(const AttnParams& p, cudaStream_t st) {
  using C = BwdCfg<HD, BC>;
  static bool attr = false;
  if (!attr) {
    LT_CUDA(cudaFuncSetAttribute(attn_bwd_kernel<HD, BC, CL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 C::kSmem));
    attr = true;
  }
  const unsigned nkb = unsigned((p.S + BC - 1) / BC);
  if (!p.lpt) {
    dim3 grid(nkb, unsigned(p.kv_heads), unsigned(p.batch));
    attn_bwd_kernel<HD, BC, CL><<<grid, C::THREADS, C::kSmem, st>>>(p);
    LT_CUDA_LAUNCH();
    return;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(nkb * unsigned(p.kv_heads) * unsigned(p.batch) * unsigned(p.split));
  cfg.blockDim = dim3(C::THREADS);
  cfg.dynamicSmemBytes = C::kSmem;
  cfg.stream = st;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = unsigned(p.split);
  at[0].val.clusterDim.y = 1;
  at[0].val.clusterDim.z = 1;
  cfg.attrs = at;
  cfg.numAttrs = CL ? 1 : 0;
  LT_CUDA(cudaLaunchKernelEx(&cfg, attn_bwd_kernel<HD, BC, CL>, p));
}

template <int HD, int BC, int MINB>
void launch_pair(const AttnParams& p, cudaStream_t st) {
  using C = PairCfg<HD, BC>;
  static bool attr = false;
  if (!attr) {
    LT_CUDA(cudaFuncSetAttribute(attn_bwd_pair_kernel<HD, BC, MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 C::kSmem));
    attr = true;
  }
  const unsigned nkb = unsigned((p.S + C::BC - 1) / C::BC);
  attn_bwd_pair_kernel<HD, BC, MINB><<<nkb * unsigned(p.kv_heads) * unsigned(p.batch), C::THREADS, C::kSmem, st>>>(p);
  LT_CUDA_LAUNCH();
}

template <int HD>
void launch_bwd(AttnParams p, int64_t batch, cudaStream_t st) {
  const int64_t rows = batch * p.S;
  const int64_t warps = rows * p.heads;
  attn_delta_kernel<HD><<<unsigned((warps * 32 + 255) / 256), 256, 0, st>>>(p.o, p.dout, rows, p.heads,
                                                                          const_cast<float*>(p.delta));
  LT_CUDA_LAUNCH();
  const BwdVariant& v = kBwdVariants[bwd_variant(HD)];
  p.lpt = v.lpt;
  p.split = v.lpt && has_clusters() ? std::min(v.split, p.heads / p.kv_heads) : 1;
  if (v.bc < 0) {  // warp-pair kernel: 1-D longest-first grid, no split
    p.lpt = 1;
    p.split = 1;
    if (v.bc == -64)
      launch_pair<HD, 64, 1>(p, st);
    else if (v.bc == -65)
      launch_pair<HD, 64, 2>(p, st);
    else
      launch_pair<HD, 128, 1>(p, st);
    return;
  }
  if (v.bc == 128)
    p.split > 1 ? launch_bwd_kernel<HD, 128, true>(p, st) : launch_bwd_kernel<HD, 128, false>(p, st);
  else
    p.split > 1 ? launch_bwd_kernel<HD, 64, true>(p, st) : launch_bwd_kernel<HD, 64, false>(p, st);
}

}  // namespace

int attention_fwd_variant_count() { return kNumFwd; }
int attention_bwd_variant_count() { return kNumBwd; }
const char* attention_bwd_variant_name(int v) { return v >= 0 && v < kNumBwd ? kBwdVariants[v].name : "default"; }

namespace {
// Head dim 256 (Qwen3.5/3.6): the forward kernel with 64 x 64 tiles and the warp-pair backward with
// 64-key tiles, whose shared memory (225 KiB) needs sm_90's opt-in limit. KernelOptions::attention_hd256 =
// Generic (LT_ATTN_HD256=generic) forces the generic kernels (for comparison).
constexpr int kHd256BwdSmem = PairCfg<256, 64>::kSmem;
bool hd256_fits_device() {
  static const bool ok = [] {
    int dev = 0, smem = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) return false;
    return smem >= kHd256BwdSmem && smem >= FwdCfg<256>::kSmem;
  }();
  return ok;
}
bool hd256_flash() { return kernel_options().attention_hd256 == Hd256Attn::Flash && hd256_fits_device(); }

void launch_bwd_hd256(AttnParams p, int64_t batch, cudaStream_t st) {
  const int64_t rows = batch * p.S;
  attn_delta_kernel<256><<<unsigned((rows * p.heads * 32 + 255) / 256), 256, 0, st>>>(p.o, p.dout, rows, p.heads,
                                                                                      const_cast<float*>(p.delta));
  LT_CUDA_LAUNCH();
  p.lpt = 1;
  p.split = 1;
  launch_pair<256, 64, 1>(p, st);  // one HD-wide accumulator per warp: the only variant without spills at 256
}
}  // namespace

bool attention_supported(int64_t head_dim) {
  return head_dim == 64 || head_dim == 128 || (head_dim == 256 && hd256_flash());
}

void attention_fwd(const AttnDims& d, const void* q, const void* k, const void* v, const int32_t* segments, void* o,
                   float* lse, cudaStream_t st) {
  if (!attention_supported(d.head_dim)) return attention_fwd_generic(d, q, k, v, segments, o, lse, st);
  AttnParams p = make_params(d);
  p.q = static_cast<const bf16*>(q);
  p.k = static_cast<const bf16*>(k);
  p.v = static_cast<const bf16*>(v);
  p.seg = segments;
  p.out = static_cast<bf16*>(o);
  p.lse = lse;
  if (d.head_dim == 64)
    launch_fwd<64>(p, d.batch, st);
  else if (d.head_dim == 128)
    launch_fwd<128>(p, d.batch, st);
  else
    launch_fwd<256>(p, d.batch, st);
}

void attention_bwd_f32dq(const AttnDims& d, const void* q, const void* k, const void* v, const int32_t* segments,
                         const void* o, const float* lse, const void* dout, void* dk, void* dv, float* dq_acc,
                         float* delta, float* dkv_acc, cudaStream_t st) {
  if (!attention_supported(d.head_dim)) {
    LT_CUDA_REQUIRE(dkv_acc != nullptr, "attention backward (generic): dkv_acc workspace missing");
    return attention_bwd_generic(d, q, k, v, segments, o, lse, dout, dk, dv, dq_acc, dkv_acc, st);
  }
  AttnParams p = make_params(d);
  p.q = static_cast<const bf16*>(q);
  p.k = static_cast<const bf16*>(k);
  p.v = static_cast<const bf16*>(v);
  p.o = static_cast<const bf16*>(o);
  p.dout = static_cast<const bf16*>(dout);
  p.seg = segments;
  p.lse = const_cast<float*>(lse);
  p.dq_acc = dq_acc;
  p.delta = delta;
  p.dk = static_cast<bf16*>(dk);
  p.dv = static_cast<bf16*>(dv);
  LT_CUDA(cudaMemsetAsync(dq_acc, 0, size_t(d.tokens() * d.heads * d.head_dim) * sizeof(float), st));
  if (d.head_dim == 64)
    launch_bwd<64>(p, d.batch, st);
  else if (d.head_dim == 128)
    launch_bwd<128>(p, d.batch, st);
  else
    launch_bwd_hd256(p, d.batch, st);
}

void attention_bwd(const AttnDims& d, const void* q, const void* k, const void* v, const int32_t* segments,
                   const void* o, const float* lse, const void* dout, void* dq, void* dk, void* dv, float* dq_acc,
                   float* delta, float* dkv_acc, cudaStream_t st) {
  attention_bwd_f32dq(d, q, k, v, segments, o, lse, dout, dk, dv, dq_acc, delta, dkv_acc, st);
  f32_to_bf16(dq_acc, d.tokens() * d.heads * d.head_dim, dq, st);
}

}  // namespace lt::cuda
