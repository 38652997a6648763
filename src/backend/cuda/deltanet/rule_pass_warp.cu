// The chunked rule's two serial passes with the state in registers (GdnRuleImpl::Chunked, Bf16 products): the
// forward state pass (deltanet/rule_fwd_chunked.cu's state_pass) and the backward dS pass
// (deltanet/rule_bwd_chunked.cu's ds_pass), same formulas and the same rounding (every product operand rounded to
// bf16 once, fp32 accumulation, the state carried in fp32).
//
// Why: the tile passes split the state S [Dk, Dv] into value tiles of 32 columns, one CTA each, every CTA loading
// the chunk's q, k, W, P again; the state lives in shared memory and each product assembles its fragments from
// fp32 shared tiles element by element. Here one CTA takes a whole (value head, sample) and Dv / 16 warps; warp w
// holds the transposed state S^T [16w .. 16w+16, 0 .. Dk) as mma accumulators. Every product is written so that
// the state is the A operand or the accumulator (products transposed: UD^T = U^T - S^T W^T, and so on), the bf16
// tiles (q, k, dO and chunk_prep's bf16 W and P) are read with ldmatrix, and a chunk's only barriers are the two
// around its double-buffered tiles.
//
// Fragment layout (PTX mma.m16n8k16, lane = 4 g + t): C (16 x 8) holds rows g, g+8 x columns 2t, 2t+1; an A
// fragment (16 x 16) is two C tiles side by side, so an accumulator block is reused as the next product's A
// operand after rounding to bf16.
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/deltanet/deltanet.h"
#include "backend/cuda/deltanet/frag.cuh"
#include "backend/cuda/deltanet/rule_chunked.cuh"

namespace lt::cuda {
namespace gdn {
namespace {

constexpr int kLdP = kC + kPad;  // bf16 P tile row stride

// Stores a warp's S^T block (rows e0.. of S^T = columns e0.. of S) into S [Dk, Dv] fp32 at dst.
template <int NT>
__device__ __forceinline__ void store_state(float* dst, int Dv, int e0, float (&S)[NT][4]) {
  for_acc(S, [&](int r, int d, float& x) { dst[int64_t(d) * Dv + e0 + r] = x; });
}

// One pipeline stage of shared tiles: bf16 q, k, W [64, Dk + pad], P [64, 64 + pad], T (fp32 U [64, Dv + 4] in
// the forward, bf16 dO [64, Dv + pad] in the backward), GG: G then Ge [2, 64].
template <typename TT>
struct Stage {
  bf16 *q, *k, *W, *P;
  TT* T;
  float* GG;
  static constexpr int tpad = sizeof(TT) == 4 ? 4 : kPad;
  __host__ __device__ static int64_t bytes(int Dk, int Dv) {
    return 3 * carve_bytes(int64_t(kC) * (Dk + kPad), 2) + carve_bytes(int64_t(kC) * kLdP, 2) +
           carve_bytes(int64_t(kC) * (Dv + tpad), sizeof(TT)) + carve_bytes(2 * kC, 4);
  }
  __device__ Stage(char* base, int Dk, int Dv) {
    Carve cv{base};
    q = cv.take<bf16>(int64_t(kC) * (Dk + kPad));
    k = cv.take<bf16>(int64_t(kC) * (Dk + kPad));
    W = cv.take<bf16>(int64_t(kC) * (Dk + kPad));
    P = cv.take<bf16>(int64_t(kC) * kLdP);
    T = cv.take<TT>(int64_t(kC) * (Dv + tpad));
    GG = cv.take<float>(2 * kC);
  }
  // Starts (and commits as one group) the copies of chunk c of value head h (key head kh); tsrc: the T rows of
  // this chunk's sample at row 0 of the group, row stride sv.
  __device__ void issue(const ChunkedArgs& p, const Chunk& ch, int64_t cidx, int h, int kh, const TT* tsrc,
                        int64_t sv) const {
    const int Dk = p.Dk, ldk = Dk + kPad;
    const int64_t sqk = int64_t(p.Hk) * Dk, sw = int64_t(p.Hv) * Dk;
    async_rows(q, ldk, p.q + ch.t0 * sqk + kh * Dk, sqk, Dk, kC, ch.L);
    async_rows(k, ldk, p.k + ch.t0 * sqk + kh * Dk, sqk, Dk, kC, ch.L);
    async_rows(W, ldk, p.Wb + ch.t0 * sw + int64_t(h) * Dk, sw, Dk, kC, ch.L);
    async_rows(P, kLdP, p.Pb + cidx * kC * kC, kC, kC, kC, kC);
    async_rows(T, p.Dv + tpad, tsrc + ch.t0 * sv, sv, p.Dv, kC, ch.L);
    async_copy(GG, p.GG + cidx * 2 * kC, 2 * kC);
    dev::cp_async_commit();
  }
};
template <typename TT>
int64_t pass_smem_bytes(int Dk, int Dv) {
  return 2 * Stage<TT>::bytes(Dk, Dv);
}

// ---------------------------------------------------------------------------------------- forward
// Per chunk (S = its start state, in the warp's registers as S^T):
//   UD^T = U^T - S^T W^T;  o^T = scale S^T q^T diag(G) + UD^T P^T;  S^T <- G_last S^T + UD^T diag(Ge) K.
template <int kDk>
__global__ void __launch_bounds__(256) state_pass_warp_kernel(ChunkedArgs p) {
  constexpr int NT = kDk / 8, ldk = kDk + kPad;
  extern __shared__ __align__(16) char smem[];
  const int Dv = p.Dv, Hv = p.Hv, h = blockIdx.x, kh = h / (Hv / p.Hk);
  const int64_t b = blockIdx.y, sv = int64_t(Hv) * Dv;
  const int e0 = (threadIdx.x >> 5) * 16;
  const int64_t stage_bytes = Stage<float>::bytes(kDk, Dv);
  const float* usrc = p.U + int64_t(h) * Dv;
  float S[NT][4] = {};
  auto stage = [&](int64_t c) { return Stage<float>(smem + (c & 1) * stage_bytes, kDk, Dv); };
  auto cidx_of = [&](int64_t c) { return (b * p.nck + c) * Hv + h; };
  stage(0).issue(p, Chunk(p, b, 0), cidx_of(0), h, kh, usrc, sv);
  for (int64_t c = 0; c < p.nck; ++c) {
    if (c + 1 < p.nck) {
      stage(c + 1).issue(p, Chunk(p, b, c + 1), cidx_of(c + 1), h, kh, usrc, sv);
      dev::cp_async_wait<1>();
    } else {
      dev::cp_async_wait<0>();
    }
    __syncthreads();
    const Stage<float> t = stage(c);
    const Chunk ch(p, b, c);
    if (ch.zero_start) for_acc(S, [](int, int, float& x) { x = 0.f; });
    store_state<NT>(p.states_out + cidx_of(c) * int64_t(kDk) * Dv, Dv, e0, S);
    const float* G = t.GG;
    const float* Ge = t.GG + kC;
    float UD[8][4], O[8][4] = {};
    for_acc(UD, [&](int r, int i, float& x) { x = t.T[i * (Dv + 4) + e0 + r]; });
#pragma unroll
    for (int kk = 0; kk < kDk / 16; ++kk) {  // over d
      uint32_t a[4], an[4];
      acc_to_a(a, S, kk, [](int) { return 1.f; });
      acc_to_a(an, S, kk, [](int) { return -1.f; });
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {  // rows i of the chunk
        uint32_t bw[4], bq[4];
        ldb_nmajor(bw, t.W, ldk, 16 * jj, 16 * kk);
        ldb_nmajor(bq, t.q, ldk, 16 * jj, 16 * kk);
        mma_pair(UD, jj, an, bw);
        mma_pair(O, jj, a, bq);
      }
    }
    for_acc(O, [&](int, int i, float& x) { x *= p.scale * G[i]; });
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {  // over the chunk rows j of UD
      uint32_t a[4];
      acc_to_a(a, UD, kk, [](int) { return 1.f; });
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        uint32_t bp[4];
        ldb_nmajor(bp, t.P, kLdP, 16 * jj, 16 * kk);  // B(j, i) = P[i][j]
        mma_pair(O, jj, a, bp);
      }
    }
    bf16* o = p.o + ch.t0 * sv + int64_t(h) * Dv + e0;
    for_acc(O, [&](int r, int i, float& x) {
      if (i < ch.L) o[i * sv + r] = __float2bfloat16(x);
    });
    const float glast = G[ch.L - 1];
    for_acc(S, [&](int, int, float& x) { x *= glast; });
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t a[4];
      acc_to_a(a, UD, kk, [&](int j) { return Ge[j]; });
#pragma unroll
      for (int nn = 0; nn < kDk / 16; ++nn) {
        uint32_t bk[4];
        ldb_kmajor(bk, t.k, ldk, 16 * nn, 16 * kk);  // B(j, d) = K[j][d]
        mma_pair(S, nn, a, bk);
      }
    }
    __syncthreads();  // the next iteration's issue overwrites this stage
  }
}

// ---------------------------------------------------------------------------------------- backward
// Chunks in reverse, dS = dL/d(the chunk's end state), in registers as dS^T:
//   dDl^T = dO^T P + (dS^T K^T) diag(Ge);  dS^T <- G_last dS^T + scale dO^T diag(G) Q - dDl^T W (0 at a reset).
template <int kDk>
__global__ void __launch_bounds__(256) ds_pass_warp_kernel(ChunkedArgs p) {
  constexpr int NT = kDk / 8, ldk = kDk + kPad;
  extern __shared__ __align__(16) char smem[];
  const int Dv = p.Dv, Hv = p.Hv, h = blockIdx.x, kh = h / (Hv / p.Hk), ldo = Dv + kPad;
  const int64_t b = blockIdx.y, sv = int64_t(Hv) * Dv;
  const int e0 = (threadIdx.x >> 5) * 16;
  const int64_t stage_bytes = Stage<bf16>::bytes(kDk, Dv);
  const bf16* osrc = p.dout + int64_t(h) * Dv;
  float dS[NT][4] = {};
  auto stage = [&](int64_t it) { return Stage<bf16>(smem + (it & 1) * stage_bytes, kDk, Dv); };
  auto cidx_of = [&](int64_t c) { return (b * p.nck + c) * Hv + h; };
  stage(0).issue(p, Chunk(p, b, p.nck - 1), cidx_of(p.nck - 1), h, kh, osrc, sv);
  for (int64_t it = 0; it < p.nck; ++it) {
    const int64_t c = p.nck - 1 - it;
    if (c > 0) {
      stage(it + 1).issue(p, Chunk(p, b, c - 1), cidx_of(c - 1), h, kh, osrc, sv);
      dev::cp_async_wait<1>();
    } else {
      dev::cp_async_wait<0>();
    }
    __syncthreads();
    const Stage<bf16> t = stage(it);
    const Chunk ch(p, b, c);
    store_state<NT>(p.dS + cidx_of(c) * int64_t(kDk) * Dv, Dv, e0, dS);
    const float* G = t.GG;
    const float* Ge = t.GG + kC;
    uint32_t adO[4][4];  // dO^T (m = e, k = i)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) lda_kmajor(adO[kk], t.T, ldo, e0, 16 * kk);
    float D1[8][4] = {}, D2[8][4] = {};
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)  // dO^T P over i
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        uint32_t bp[4];
        ldb_kmajor(bp, t.P, kLdP, 16 * jj, 16 * kk);  // B(i, j) = P[i][j]
        mma_pair(D1, jj, adO[kk], bp);
      }
#pragma unroll
    for (int kk = 0; kk < kDk / 16; ++kk) {  // dS^T K^T over d
      uint32_t a[4];
      acc_to_a(a, dS, kk, [](int) { return 1.f; });
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        uint32_t bk[4];
        ldb_nmajor(bk, t.k, ldk, 16 * jj, 16 * kk);  // B(d, j) = K[j][d]
        mma_pair(D2, jj, a, bk);
      }
    }
    float* dD = p.dDl + ch.t0 * sv + int64_t(h) * Dv + e0;
    {
      const int g = (threadIdx.x & 31) >> 2, t4 = threadIdx.x & 3;
#pragma unroll
      for (int jt = 0; jt < 8; ++jt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // the for_acc order, D1 and D2 together
          const int r = g + (i >> 1) * 8, j = 8 * jt + 2 * t4 + (i & 1);
          D1[jt][i] += Ge[j] * D2[jt][i];
          if (j < ch.L) dD[j * sv + r] = D1[jt][i];
        }
    }
    if (ch.zero_start) {
      for_acc(dS, [](int, int, float& x) { x = 0.f; });
    } else {
      const float glast = G[ch.L - 1];
      for_acc(dS, [&](int, int, float& x) { x *= glast; });
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        uint32_t ag[4], ad[4];
        const int t4 = threadIdx.x & 3, c0 = 16 * kk + 2 * t4;
        const float s0 = p.scale * G[c0], s1 = p.scale * G[c0 + 1], s2 = p.scale * G[c0 + 8], s3 = p.scale * G[c0 + 9];
        const float2 x0 = dev::unpack_bf16(adO[kk][0]), x1 = dev::unpack_bf16(adO[kk][1]);
        const float2 x2 = dev::unpack_bf16(adO[kk][2]), x3 = dev::unpack_bf16(adO[kk][3]);
        ag[0] = dev::pack_bf16(x0.x * s0, x0.y * s1);
        ag[1] = dev::pack_bf16(x1.x * s0, x1.y * s1);
        ag[2] = dev::pack_bf16(x2.x * s2, x2.y * s3);
        ag[3] = dev::pack_bf16(x3.x * s2, x3.y * s3);
        acc_to_a(ad, D1, kk, [](int) { return -1.f; });
#pragma unroll
        for (int nn = 0; nn < kDk / 16; ++nn) {
          uint32_t bq[4], bw[4];
          ldb_kmajor(bq, t.q, ldk, 16 * nn, 16 * kk);  // B(i, d) = Q[i][d]
          ldb_kmajor(bw, t.W, ldk, 16 * nn, 16 * kk);  // B(j, d) = W[j][d]
          mma_pair(dS, nn, ag, bq);
          mma_pair(dS, nn, ad, bw);
        }
      }
    }
    __syncthreads();
  }
}

template <typename TT, typename K64, typename K128>
void launch_pass(const GdnDims& s, const ChunkedArgs& a, cudaStream_t st, K64 k64, K128 k128) {
  const auto kern = a.Dk == 64 ? k64 : k128;
  const int64_t smem = pass_smem_bytes<TT>(a.Dk, a.Dv);
  LT_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kern<<<dim3(unsigned(s.Hv), unsigned(s.batch)), unsigned(2 * a.Dv), size_t(smem), st>>>(a);
  LT_CUDA_LAUNCH();
}

}  // namespace

bool warp_passes(const GdnDims& d) {
  if (!gdn_warp_passes_allowed() || gdn_split_products()) return false;
  const int Dk = int(d.Dk), Dv = int(d.Dv);
  if ((Dk != 64 && Dk != 128) || Dv % 16 != 0 || Dv > 128) return false;
  const int64_t need = std::max(pass_smem_bytes<float>(Dk, Dv), pass_smem_bytes<bf16>(Dk, Dv));
  return need <= shared_optin();
}

void launch_state_pass_warp(const GdnDims& s, const ChunkedArgs& a, cudaStream_t st) {
  launch_pass<float>(s, a, st, state_pass_warp_kernel<64>, state_pass_warp_kernel<128>);
}
void launch_ds_pass_warp(const GdnDims& s, const ChunkedArgs& a, cudaStream_t st) {
  launch_pass<bf16>(s, a, st, ds_pass_warp_kernel<64>, ds_pass_warp_kernel<128>);
}

}  // namespace gdn
}  // namespace lt::cuda
