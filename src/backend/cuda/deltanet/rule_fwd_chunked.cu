// Chunked gated delta rule, forward, chunk-parallel (GdnRuleImpl::Chunked; deltanet/rule_chunked.cuh): chunk_prep
// computes every chunk's W, U and P at once; state_pass then walks a sample's chunks per (value tile, value head,
// sample) with only the state products left serial (the formulas of deltanet/rule_fwd.cu):
//   S0 -> state_ws;  Dl = U - W S0;  o_i = scale G_i S0^T q_i + sum_j P[i,j] Dl_j;  S_end = G_last S0 + K^T diag(Ge) Dl
#include <cuda_bf16.h>

#include <cmath>
#include <string>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/deltanet/deltanet.h"
#include "backend/cuda/deltanet/frag.cuh"
#include "backend/cuda/deltanet/rule_chunked.cuh"

namespace lt::cuda {
namespace gdn {
namespace {

int64_t prep_smem_bytes(int Dk, int Dv) {
  return carve_bytes(1, sizeof(ChunkScal)) + 2 * carve_bytes(int64_t(kC) * (Dk + kPad), 2) +
         2 * carve_bytes(kC * kC, 4) + carve_bytes(int64_t(kC) * (Dk + kPad), 4) +
         carve_bytes(int64_t(kC) * (Dv + kPad), 4) + carve_bytes(int64_t(kC) * (Dv + kPad), 2);
}
int64_t prep_lean_smem_bytes(int Dk, int Dv, bool dl) {
  return carve_bytes(1, sizeof(ChunkScal)) + 2 * carve_bytes(int64_t(kC) * (Dk + kPad), 2) +
         carve_bytes(int64_t(kC) * (Dv + kPad), 2) + carve_bytes(kC * kC, 4) +
         (dl ? carve_bytes(int64_t(kC) * (Dk + kPad), 2) : 0);
}
// The lean prep's Dl stages S0 as bf16 [Dk, Dv + pad] over qs and ks.
bool prep_lean_s0_fits(int Dk, int Dv) {
  return int64_t(Dk) * (Dv + kPad) * 2 <= 2 * carve_bytes(int64_t(kC) * (Dk + kPad), 2);
}
// The backward's S0 [Dk, Dv] fp32 is staged over qs, ks, KM, P once they are done with.
bool prep_s0_fits(int Dk, int Dv) {
  return int64_t(Dk) * Dv * 4 <= 2 * carve_bytes(int64_t(kC) * (Dk + kPad), 2) + 2 * carve_bytes(kC * kC, 4);
}

// Both preps' start: the chunk's q, k, v rows into shared tiles (row strides Dk + pad, Dv + pad), its scalars
// (cs), and G, Ge to the workspace for the serial passes. Syncs.
__device__ __forceinline__ void prep_load(const ChunkedArgs& p, const Chunk& ch, int64_t cidx, int h, int kh,
                                          ChunkScal& cs, bf16* qs, bf16* ks, bf16* vs) {
  const int Dk = p.Dk, Dv = p.Dv;
  const int64_t sqk = int64_t(p.Hk) * Dk, sv = int64_t(p.Hv) * Dv;
  async_rows(qs, Dk + kPad, p.q + ch.t0 * sqk + kh * Dk, sqk, Dk, kC, ch.L);
  async_rows(ks, Dk + kPad, p.k + ch.t0 * sqk + kh * Dk, sqk, Dk, kC, ch.L);
  async_rows(vs, Dv + kPad, p.v + ch.t0 * sv + int64_t(h) * Dv, sv, Dv, kC, ch.L);
  async_done();
  load_chunk_scalars(cs, p.g, p.beta, p.seg, ch.t0, ch.L, p.Hv, h);  // syncs (after the loads above)
  if (threadIdx.x < kC) {
    float* gg = p.GG + cidx * 2 * kC;
    gg[threadIdx.x] = cs.G[threadIdx.x];
    gg[kC + threadIdx.x] = cs.Ge[threadIdx.x];
  }
}

// KK^T and QK^T of a chunk (bf16 tiles [64, Dk + pad], Dk a multiple of 16) on the tensor cores with ldmatrix
// fragments: epi(i, j, (K K^T)[i, j], (Q K^T)[i, j]) for i, j < 64. The same products and k order as gemm2's
// fragments assembled element by element (bf16 inputs: exact either way).
template <typename Epi>
__device__ __forceinline__ void kq_products_ldm(const bf16* ks, const bf16* qs, int ldk, int Dk, Epi epi) {
  const int warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
  for (int tile = warp; tile < (kC / 16) * (kC / 16); tile += nwarp) {
    const int m0 = (tile / (kC / 16)) * 16, n0 = (tile % (kC / 16)) * 16;
    float akk[2][4] = {}, aqk[2][4] = {};
    for (int k0 = 0; k0 < Dk; k0 += 16) {
      uint32_t ak[4], aq[4], b[4];
      lda_mmajor(ak, ks, ldk, m0, k0);
      lda_mmajor(aq, qs, ldk, m0, k0);
      ldb_nmajor(b, ks, ldk, n0, k0);
      mma_pair(akk, 0, ak, b);
      mma_pair(aqk, 0, aq, b);
    }
    mma_epilogue(kC, kC, m0, n0, [&](int i, int j, int s, int q) { epi(i, j, akk[s][q], aqk[s][q]); });
  }
}

// The lean prep: the solves' right-hand sides are built in registers and their results, and P, go straight to
// global memory, so shared memory holds q, k, v and KM alone (~70 KB at Dk = Dv = 128: two CTAs per SM, by
// registers, where chunk_prep fits one). The forward's (the state pass needs W, U, P and G, Ge only); with kDl
// also the backward's for the register passes (Bf16 products): KM, and Dl = U - W S0 on the tensor cores from
// bf16 shared tiles of W and S0 (the rounding of chunk_prep's product).
template <bool kSplit, bool kDl>
__global__ void __launch_bounds__(kThreads) chunk_prep_lean_kernel(ChunkedArgs p) {
  extern __shared__ __align__(16) char smem[];
  const int Dk = p.Dk, Dv = p.Dv, Hv = p.Hv, h = blockIdx.y, kh = h / (Hv / p.Hk);
  const int64_t c = blockIdx.x, b = blockIdx.z, cidx = (b * p.nck + c) * Hv + h;
  const Chunk ch(p, b, c);
  const int ldk = Dk + kPad, ldu = Dv + kPad;
  Carve cv{smem};
  ChunkScal& cs = *cv.take<ChunkScal>(1);
  bf16* qs = cv.take<bf16>(int64_t(kC) * ldk);
  bf16* ks = cv.take<bf16>(int64_t(kC) * ldk);
  bf16* vs = cv.take<bf16>(int64_t(kC) * ldu);
  float* KM = cv.take<float>(kC * kC);
  prep_load(p, ch, cidx, h, kh, cs, qs, ks, vs);
  const float scale = p.scale;
  // p.W / p.P null: nobody reads the fp32 copies (the register passes read Wb, Pb; chunk_grads' bf16 path Wb).
  float* P = p.P ? p.P + cidx * kC * kC : nullptr;
  bf16* Pb = p.Pb ? p.Pb + cidx * kC * kC : nullptr;
  auto kq_epi = [&](int i, int j, float kk, float qk) {
    const float m = decay(cs, i, j);
    KM[i * kC + j] = j < i ? kk * m : 0.f;
    if (P) P[i * kC + j] = scale * qk * m;
    if (Pb) Pb[i * kC + j] = __float2bfloat16(scale * qk * m);
  };
  if (!kSplit && p.prep_ldm && Dk % 16 == 0)
    kq_products_ldm(ks, qs, ldk, Dk, kq_epi);
  else
    gemm2<true, kSplit>(kC, kC, prod(ks, ldk, 1, ks, 1, ldk, Dk), prod(qs, ldk, 1, ks, 1, ldk, Dk), kq_epi);
  __syncthreads();
  if (kDl) copy_f32(p.KM + cidx * kC * kC, KM, kC * kC);
  // W = (I+A)^-1 diag(bG) K, U = (I+A)^-1 diag(b) V: a column per thread (rows >= L: bt = 0, tiles zero-filled).
  const int64_t sw = int64_t(Hv) * Dk, sv = int64_t(Hv) * Dv;
  bf16* Wt = kDl ? cv.take<bf16>(int64_t(kC) * ldk) : nullptr;  // [64, Dk + pad]: W for the Dl product
  for (int col = threadIdx.x; col < Dk + Dv; col += blockDim.x) {
    const bool isw = col < Dk;
    const bf16* src = isw ? ks + col : vs + (col - Dk);
    const int ld = isw ? ldk : ldu;
    float x[kC];
#pragma unroll
    for (int i = 0; i < kC; ++i) x[i] = cs.bt[i] * (isw ? cs.G[i] : 1.f) * ldv(src + i * ld);
    fwd_subst(KM, cs.bt, x);
    float* dst = !isw ? p.U + ch.t0 * sv + int64_t(h) * Dv + (col - Dk)
                 : p.W  ? p.W + ch.t0 * sw + int64_t(h) * Dk + col
                        : nullptr;
    bf16* dstb = isw && p.Wb ? p.Wb + ch.t0 * sw + int64_t(h) * Dk + col : nullptr;
    float* dl = kDl && !isw && ch.zero_start ? p.Dl + ch.t0 * sv + int64_t(h) * Dv + (col - Dk) : nullptr;
    const int64_t ds = isw ? sw : sv;
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      if (i < ch.L) {
        if (dst) dst[i * ds] = x[i];
        if (dstb) dstb[i * ds] = __float2bfloat16(x[i]);
        if (dl) dl[i * ds] = x[i];  // S0 = 0: Dl = U
      }
      if (kDl && isw) Wt[i * ldk + col] = __float2bfloat16(x[i]);
    }
  }
  if (!kDl || ch.zero_start) return;
  // Dl = U - W S0: S0 as bf16 over qs, ks (no longer read), U read back from global (written above by this CTA).
  __syncthreads();
  bf16* S0 = qs;
  const int lds = Dv + kPad;
  // kB of a thread's loads in flight before their converted stores (one at a time, each waited for its global
  // latency before the next: the stores to shared memory may alias the loads as far as the compiler knows).
  const float4* s4 = reinterpret_cast<const float4*>(p.states + cidx * int64_t(Dk) * Dv);
  constexpr int kB = 8;
  const int n4 = Dk * Dv / 4;
  for (int base = threadIdx.x; base < n4; base += kB * blockDim.x) {
    float4 xs[kB];
#pragma unroll
    for (int u = 0; u < kB; ++u)
      if (base + u * int(blockDim.x) < n4) xs[u] = s4[base + u * blockDim.x];
#pragma unroll
    for (int u = 0; u < kB; ++u) {
      const int idx = base + u * blockDim.x;
      if (idx >= n4) break;
      const int d = (idx * 4) / Dv, e = (idx * 4) % Dv;
      *reinterpret_cast<uint2*>(S0 + d * lds + e) =
          make_uint2(dev::pack_bf16(xs[u].x, xs[u].y), dev::pack_bf16(xs[u].z, xs[u].w));
    }
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5, m0 = 16 * (warp & 3);
  const float* U = p.U + ch.t0 * sv + int64_t(h) * Dv;
  float* Dl = p.Dl + ch.t0 * sv + int64_t(h) * Dv;
  for (int pr = warp >> 2; pr < Dv / 16; pr += nwarp / 4) {  // 16 x 16 output tiles: rows m0, columns 16 pr
    float acc[2][4] = {}, u[2][4];
    // U (written above by this CTA) loaded before the products and the Dl stores (which may alias it)
    for_acc(u, [&](int r, int cc, float& x) {
      const int i = m0 + r;
      x = i < ch.L ? U[i * sv + 16 * pr + cc] : 0.f;
    });
    for (int kk = 0; kk < Dk / 16; ++kk) {
      uint32_t a[4], bs[4];
      lda_mmajor(a, Wt, ldk, m0, 16 * kk);
      ldb_kmajor(bs, S0, lds, 16 * pr, 16 * kk);
      mma_pair(acc, 0, a, bs);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[j][q] = u[j][q] - acc[j][q];
    for_acc(acc, [&](int r, int cc, float& x) {
      const int i = m0 + r;
      if (i < ch.L) Dl[i * sv + 16 * pr + cc] = x;
    });
  }
}

// The backward's prep for the tile passes (and Split products): as the lean one, plus KM and Dl = U - W S0 for
// chunk_grads, with W, U kept in shared memory for the Dl product.
template <bool kSplit>
__global__ void __launch_bounds__(kThreads) chunk_prep_kernel(ChunkedArgs p) {
  extern __shared__ __align__(16) char smem[];
  const int Dk = p.Dk, Dv = p.Dv, Hv = p.Hv, Hk = p.Hk, h = blockIdx.y, kh = h / (Hv / Hk);
  const int64_t c = blockIdx.x, b = blockIdx.z, cidx = (b * p.nck + c) * Hv + h;
  const Chunk ch(p, b, c);
  const int ldk = Dk + kPad, ldu = Dv + kPad;
  Carve cv{smem};
  ChunkScal& cs = *cv.take<ChunkScal>(1);
  bf16* qs = cv.take<bf16>(int64_t(kC) * ldk);
  bf16* ks = cv.take<bf16>(int64_t(kC) * ldk);
  float* KM = cv.take<float>(kC * kC);
  float* P = cv.take<float>(kC * kC);
  float* W = cv.take<float>(int64_t(kC) * ldk);
  float* U = cv.take<float>(int64_t(kC) * ldu);
  bf16* vs = cv.take<bf16>(int64_t(kC) * ldu);
  const int64_t sv = int64_t(Hv) * Dv, sw = int64_t(Hv) * Dk;
  prep_load(p, ch, cidx, h, kh, cs, qs, ks, vs);
  for (int idx = threadIdx.x; idx < kC * Dk; idx += blockDim.x) {
    const int i = idx / Dk, d = idx % Dk;
    W[i * ldk + d] = cs.bt[i] * cs.G[i] * ldv(ks + i * ldk + d);
  }
  for (int idx = threadIdx.x; idx < kC * Dv; idx += blockDim.x) {
    const int i = idx / Dv, e = idx % Dv;
    U[i * ldu + e] = cs.bt[i] * ldv(vs + i * ldu + e);  // rows >= L: bt = 0, vs = 0
  }
  const float scale = p.scale;
  gemm2<true, kSplit>(kC, kC, prod(ks, ldk, 1, ks, 1, ldk, Dk), prod(qs, ldk, 1, ks, 1, ldk, Dk),
              [&](int i, int j, float kk, float qk) {
                const float m = decay(cs, i, j);
                KM[i * kC + j] = j < i ? kk * m : 0.f;
                P[i * kC + j] = scale * qk * m;
              });
  __syncthreads();
  for (int col = threadIdx.x; col < Dk + Dv; col += blockDim.x) {  // W = (I+A)^-1 diag(bG) K, U = (I+A)^-1 diag(b) V
    if (col < Dk)
      fwd_subst_col(KM, cs.bt, W + col, ldk);
    else
      fwd_subst_col(KM, cs.bt, U + (col - Dk), ldu);
  }
  __syncthreads();
  copy_f32(p.P + cidx * kC * kC, P, kC * kC);
  store_rows_f32(p.W + ch.t0 * sw + int64_t(h) * Dk, sw, W, ldk, Dk, ch.L);
  store_rows_f32(p.U + ch.t0 * sv + int64_t(h) * Dv, sv, U, ldu, Dv, ch.L);
  if (p.Wb) {
    store_rows_bf16(p.Pb + cidx * kC * kC, kC, P, kC, kC, kC);
    store_rows_bf16(p.Wb + ch.t0 * sw + int64_t(h) * Dk, sw, W, ldk, Dk, ch.L);
  }
  copy_f32(p.KM + cidx * kC * kC, KM, kC * kC);
  float* Dl = p.Dl + ch.t0 * sv + int64_t(h) * Dv;
  if (ch.zero_start) {  // S0 = 0: Dl = U
    store_rows_f32(Dl, sv, U, ldu, Dv, ch.L);
    return;
  }
  __syncthreads();  // qs .. P no longer read: stage S0 over them
  float* S0 = reinterpret_cast<float*>(qs);
  async_copy(S0, p.states + cidx * int64_t(Dk) * Dv, Dk * Dv);
  async_done();
  __syncthreads();
  gemm<true, kSplit>(ch.L, Dv, prod(W, ldk, 1, S0, Dv, 1, Dk),
             [&](int i, int e, float acc) { Dl[i * sv + e] = U[i * ldu + e] - acc; });
}

// Per (value tile, value head, sample): the forward state recurrence over the sample's chunks, the next
// chunk's tiles loading while the current one computes.
int64_t state_smem_bytes(int Dk, int nt) {
  return carve_bytes(int64_t(Dk) * (nt + kPad), 4) + carve_bytes(int64_t(kC) * (nt + kPad), 4) +
         2 * PassTiles<float>::bytes(Dk, nt);
}

template <bool kSplit>
__global__ void __launch_bounds__(kThreads) state_pass_kernel(ChunkedArgs p) {
  extern __shared__ __align__(16) char smem[];
  const int Dk = p.Dk, Dv = p.Dv, Hv = p.Hv, Hk = p.Hk, nt = p.nt, h = blockIdx.y, kh = h / (Hv / Hk);
  const int e0 = blockIdx.x * nt;
  const int64_t b = blockIdx.z;
  const int ldk = Dk + kPad, ldt = nt + kPad;
  Carve cv{smem};
  float* S = cv.take<float>(int64_t(Dk) * ldt);   // [Dk, nt]
  float* Ot = cv.take<float>(int64_t(kC) * ldt);  // [64, nt]: scale G_i S0^T q_i
  PassTiles<float> tl[2];                         // T: U, then Dl
  tl[0].carve(cv, Dk, nt);
  tl[1].carve(cv, Dk, nt);
  const int64_t sv = int64_t(Hv) * Dv;
  const float* usrc = p.U + int64_t(h) * Dv + e0;
  const float scale = p.scale;
  for (int i = threadIdx.x; i < Dk * ldt; i += blockDim.x) S[i] = 0.f;
  __syncthreads();  // the chunk loop touches S in another thread-to-element order
  tl[0].issue(p, b, 0, h, kh, usrc, sv, nt);
  for (int64_t c = 0; c < p.nck; ++c) {
    const PassTiles<float>& t = tl[c & 1];
    if (c + 1 < p.nck) {
      tl[(c + 1) & 1].issue(p, b, c + 1, h, kh, usrc, sv, nt);
      dev::cp_async_wait<1>();
    } else {
      dev::cp_async_wait<0>();
    }
    const Chunk ch(p, b, c);
    float* st = p.states_out + ((b * p.nck + c) * Hv + h) * int64_t(Dk) * Dv + e0;
    for (int idx = threadIdx.x; idx < Dk * nt; idx += blockDim.x) {
      const int d = idx / nt, e = idx % nt;
      if (ch.zero_start) S[d * ldt + e] = 0.f;
      st[int64_t(d) * Dv + e] = S[d * ldt + e];
    }
    __syncthreads();
    const float* G = t.GG;
    const float* Ge = t.GG + kC;
    float* UD = t.T;
    gemm2<true, kSplit>(kC, nt, prod(t.W, ldk, 1, S, ldt, 1, Dk), prod(t.q, ldk, 1, S, ldt, 1, Dk),
                [&](int i, int e, float ws, float qsv) {
                  UD[i * ldt + e] -= ws;
                  Ot[i * ldt + e] = scale * G[i] * qsv;
                });
    __syncthreads();
    bf16* o = p.o + ch.t0 * sv + int64_t(h) * Dv + e0;
    gemm<true, kSplit>(ch.L, nt, prod(t.P, kC, 1, UD, ldt, 1, kC),
               [&](int i, int e, float acc) { o[i * sv + e] = __float2bfloat16(Ot[i * ldt + e] + acc); });
    const float glast = G[ch.L - 1];
    gemm<true, kSplit>(Dk, nt, prod(t.k, 1, ldk, UD, ldt, 1, kC, Ge),
               [&](int d, int e, float acc) { S[d * ldt + e] = glast * S[d * ldt + e] + acc; });
    __syncthreads();
  }
}

}  // namespace

int shared_optin() {
  int dev = 0, optin = 0;
  LT_CUDA(cudaGetDevice(&dev));
  LT_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return optin;
}

ChunkedArgs chunked_args(const GdnDims& d, const void* qn, const void* kn, const void* v, const float* g,
                         const float* beta, const int32_t* seg, const float* states, void* ws, int nt) {
  const ChunkedWs sz(d);
  float* w = static_cast<float*>(ws);
  ChunkedArgs a{};
  const int sched = gdn_sched_flags();
  a.prep_ldm = sched & 1;
  a.grads_prefetch = sched & 2;
  a.q = static_cast<const bf16*>(qn);
  a.k = static_cast<const bf16*>(kn);
  a.v = static_cast<const bf16*>(v);
  a.g = g;
  a.beta = beta;
  a.seg = seg;
  a.states = states;
  a.W = w;
  a.U = a.W + sz.W;
  a.P = a.U + sz.U;  // the forward's pieces first
  a.GG = a.P + sz.P;
  a.Wb = reinterpret_cast<bf16*>(a.GG + sz.GG);
  a.Pb = reinterpret_cast<bf16*>(a.GG + sz.GG + sz.Wb);
  a.Dl = a.GG + sz.GG + sz.Wb + sz.Pb;
  a.dDl = a.Dl + sz.Dl;
  a.KM = a.dDl + sz.dDl;
  a.dS = a.KM + sz.KM;
  a.seq = d.seq;
  a.nck = gdn_rule_num_chunks(d);
  a.Hk = int(d.Hk);
  a.Hv = int(d.Hv);
  a.Dk = int(d.Dk);
  a.Dv = int(d.Dv);
  a.nt = nt;
  a.scale = float(1.0 / std::sqrt(double(d.Dk)));
  return a;
}

void launch_chunk_prep(const GdnDims& d, const ChunkedArgs& a, bool bwd, cudaStream_t st) {
  // The backward's lean prep serves the register passes (a.Wb set: Bf16 products, Dk 64 or 128, Dv <= 128).
  const bool lean = !bwd || a.Wb;
  const int64_t smem = lean ? prep_lean_smem_bytes(a.Dk, a.Dv, bwd) : prep_smem_bytes(a.Dk, a.Dv);
  const bool s0_fits = !bwd || (lean ? prep_lean_s0_fits(a.Dk, a.Dv) : prep_s0_fits(a.Dk, a.Dv));
  LT_CUDA_REQUIRE(smem <= shared_optin() && s0_fits && (!lean || !bwd || !gdn_split_products()),
                  ("gdn rule (chunked): shared memory too small for Dk = " + std::to_string(a.Dk) +
                   ", Dv = " + std::to_string(a.Dv))
                      .c_str());
  const auto kern = !lean ? LT_GDN_SPLIT_KERNEL(chunk_prep_kernel)
                    : bwd ? chunk_prep_lean_kernel<false, true>
                          : (gdn_split_products() ? chunk_prep_lean_kernel<true, false>
                                                  : chunk_prep_lean_kernel<false, false>);
  LT_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kern<<<dim3(unsigned(a.nck), unsigned(d.Hv), unsigned(d.batch)), kThreads, size_t(smem), st>>>(a);
  LT_CUDA_LAUNCH();
}

}  // namespace gdn

int64_t gdn_rule_fwd_chunked_workspace_bytes(const GdnDims& d) { return gdn::ChunkedWs(d).fwd_floats() * 4; }

void gdn_rule_fwd_chunked(const GdnDims& d, const void* qn, const void* kn, const void* v, const float* g,
                          const float* beta, const int32_t* seg, void* o, float* state_ws, void* ws, cudaStream_t st) {
  using namespace gdn;
  LT_CUDA_REQUIRE(d.Hv < 65536, "gdn_rule_fwd: Hv must be < 65536");
  if (d.tokens() == 0) return;
  const int optin = shared_optin();
  const int nt = choose_tile(int(d.Dv), 32, optin, [&](int n) { return state_smem_bytes(int(d.Dk), n); });
  LT_CUDA_REQUIRE(nt > 0, ("gdn_rule_fwd (chunked): shared memory too small for Dk = " + std::to_string(d.Dk)).c_str());
  const int64_t smem = state_smem_bytes(int(d.Dk), nt);
  const auto kern = LT_GDN_SPLIT_KERNEL(state_pass_kernel);
  LT_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int64_t nck = gdn_rule_num_chunks(d);
  const bool warp = warp_passes(d);
  for_sample_groups(d, [&](const GdnDims& s, int64_t b0) {
    const int64_t r0 = b0 * d.seq;
    ChunkedArgs a = chunked_args(s, static_cast<const bf16*>(qn) + r0 * d.Hk * d.Dk,
                                 static_cast<const bf16*>(kn) + r0 * d.Hk * d.Dk,
                                 static_cast<const bf16*>(v) + r0 * d.Hv * d.Dv, g + r0 * d.Hv, beta + r0 * d.Hv,
                                 seg ? seg + r0 : nullptr, state_ws + b0 * nck * d.Hv * d.Dk * d.Dv, ws, nt);
    a.o = static_cast<bf16*>(o) + r0 * d.Hv * d.Dv;
    a.states_out = state_ws + b0 * nck * d.Hv * d.Dk * d.Dv;
    if (!warp) a.Wb = a.Pb = nullptr;
    if (warp) a.W = a.P = nullptr;  // the register passes read the bf16 copies only
    launch_chunk_prep(s, a, /*bwd=*/false, st);
    if (warp) {
      launch_state_pass_warp(s, a, st);
      return;
    }
    kern<<<dim3(unsigned(d.Dv / nt), unsigned(d.Hv), unsigned(s.batch)), kThreads, size_t(smem), st>>>(a);
    LT_CUDA_LAUNCH();
  });
}

}  // namespace lt::cuda
