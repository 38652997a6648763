// Decode-time kernels (decode.h): split-K ("flash-decoding") attention of one query row per sequence
// against its KV cache, KV-cache append at per-row positions, and argmax over fp32 logits rows.
#include <cuda_bf16.h>

#include <climits>
#include <cmath>

#include "backend/cuda/cuda_util.h"
#include "infer/cuda/decode.h"
#include "backend/cuda/dev_common.cuh"

namespace lt::cuda {
namespace {
using namespace dev;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxPairs = 16;  // accumulator pairs per thread: G * hd / 2 <= kMaxPairs * kThreads
constexpr int kSplit = int(kDecodeSplitKeys);
constexpr float kLog2e = 1.4426950408889634f;

int tile_keys(int64_t hd) { return hd <= 128 ? 64 : 32; }

// Floats of dynamic shared memory: q [G*hd] fp32, scores/probabilities [G*tile], running max / sum /
// rescale [3 x G, padded to 4], then K and V tiles bf16 [tile*hd] each (tile*hd floats together).
int64_t smem_floats(int64_t G, int64_t hd, int64_t tile) {
  return G * hd + G * tile + (3 * G + 3) / 4 * 4 + tile * hd;
}

// One CTA per (split, kv head, row): the split's keys are processed in tiles of `tile` keys with an
// online softmax for all G query heads of the kv head (K/V are read once for the group). The CTA
// writes its unnormalised output and (max, sum) per head; decode_combine_kernel merges the splits.
__global__ void __launch_bounds__(kThreads) decode_attn_split_kernel(const bf16* q, const bf16* kc, const bf16* vc,
                                                                    const int64_t* row0, const int32_t* len,
                                                                    int heads, int kv_heads, int hd, int tile,
                                                                    float scale_log2, int nsplit, float* part_acc,
                                                                    float* part_ml) {
  const int s = blockIdx.x, kh = blockIdx.y, r = blockIdx.z;
  const int L = len[r];
  const int j_begin = s * kSplit, j_end = min(L, j_begin + kSplit);
  if (j_begin >= j_end) return;  // past this row's length: the combine kernel never reads this split
  const int G = heads / kv_heads, kvd = kv_heads * hd;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  extern __shared__ float4 smem4[];
  float* qs = reinterpret_cast<float*>(smem4);
  float* ps = qs + G * hd;
  float* st_m = ps + G * tile;
  float* st_l = st_m + G;
  float* st_a = st_l + G;
  bf16* ks = reinterpret_cast<bf16*>(qs + G * hd + G * tile + (3 * G + 3) / 4 * 4);
  bf16* vs = ks + tile * hd;

  const bf16* qr = q + (int64_t(r) * heads + int64_t(kh) * G) * hd;  // the group's G heads are adjacent
  for (int i = tid; i < G * hd; i += kThreads) qs[i] = __bfloat162float(qr[i]) * scale_log2;
  if (tid < G) {
    st_m[tid] = -INFINITY;
    st_l[tid] = 0.f;
  }
  const int half = hd / 2, pairs = G * half, per_lane = (hd + 31) / 32;
  float acc[kMaxPairs][2];
#pragma unroll
  for (int e = 0; e < kMaxPairs; ++e) acc[e][0] = acc[e][1] = 0.f;
  const int64_t base = row0[r];
  const int chunks = hd / 8;

  for (int j0 = j_begin; j0 < j_end; j0 += tile) {
    const int nk = min(tile, j_end - j0);
    __syncthreads();  // q loaded / the previous tile's P.V done with ks, vs, ps
    for (int i = tid; i < nk * chunks; i += kThreads) {
      const int j = i / chunks, c = i % chunks;
      const int64_t off = (base + j0 + j) * kvd + int64_t(kh) * hd + c * 8;
      reinterpret_cast<uint4*>(ks + j * hd)[c] = *reinterpret_cast<const uint4*>(kc + off);
      reinterpret_cast<uint4*>(vs + j * hd)[c] = *reinterpret_cast<const uint4*>(vc + off);
    }
    __syncthreads();
    // Scores (log2 domain): warp w takes keys w, w+4, ...; its lanes split the head dimension.
    for (int j = warp; j < nk; j += kWarps) {
      float kv[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int d = lane + 32 * i;
        kv[i] = (i < per_lane && d < hd) ? __bfloat162float(ks[j * hd + d]) : 0.f;
      }
      for (int g = 0; g < G; ++g) {
        float p = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int d = lane + 32 * i;
          if (i < per_lane && d < hd) p += qs[g * hd + d] * kv[i];
        }
        p = warp_sum(p);
        if (lane == 0) ps[g * tile + j] = p;
      }
    }
    __syncthreads();
    // Online softmax per query head: warp w takes heads w, w+4, ...
    for (int g = warp; g < G; g += kWarps) {
      float mx = -INFINITY;
      for (int j = lane; j < nk; j += 32) mx = fmaxf(mx, ps[g * tile + j]);
      mx = warp_max(mx);
      const float m_old = st_m[g], m_new = fmaxf(m_old, mx);
      float sum = 0.f;
      for (int j = lane; j < nk; j += 32) {
        const float p = exp2f(ps[g * tile + j] - m_new);
        ps[g * tile + j] = p;
        sum += p;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float a = exp2f(m_old - m_new);  // 0 on the first tile (m_old = -inf)
        st_a[g] = a;
        st_l[g] = st_l[g] * a + sum;
        st_m[g] = m_new;
      }
    }
    __syncthreads();
    // P.V: thread owns (head, dimension pair) entries tid, tid + 128, ...
#pragma unroll
    for (int e = 0; e < kMaxPairs; ++e) {
      const int idx = tid + e * kThreads;
      if (idx < pairs) {
        const int g = idx / half, dp = idx % half;
        const float a = st_a[g];
        float a0 = acc[e][0] * a, a1 = acc[e][1] * a;
        const float* pg = ps + g * tile;
        const bf16* vcol = vs + 2 * dp;
        for (int j = 0; j < nk; ++j) {
          const float2 v2 = unpack_bf16(ld_smem_u32(vcol + j * hd));
          a0 += pg[j] * v2.x;
          a1 += pg[j] * v2.y;
        }
        acc[e][0] = a0;
        acc[e][1] = a1;
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kMaxPairs; ++e) {
    const int idx = tid + e * kThreads;
    if (idx < pairs) {
      const int g = idx / half, dp = idx % half;
      const int64_t h = int64_t(kh) * G + g;
      float* dst = part_acc + ((int64_t(r) * heads + h) * nsplit + s) * hd + 2 * dp;
      dst[0] = acc[e][0];
      dst[1] = acc[e][1];
    }
  }
  if (tid < G) {
    const int64_t h = int64_t(kh) * G + tid;
    float* ml = part_ml + ((int64_t(r) * heads + h) * nsplit + s) * 2;
    ml[0] = st_m[tid];
    ml[1] = st_l[tid];
  }
}

// One CTA per (head, row): merges the row's splits in split order (deterministic).
__global__ void decode_combine_kernel(const float* part_acc, const float* part_ml, const int32_t* len, int heads,
                                      int hd, int nsplit, bf16* out) {
  const int h = blockIdx.x, r = blockIdx.y;
  const int ns = (len[r] + kSplit - 1) / kSplit;
  const float* ml = part_ml + (int64_t(r) * heads + h) * nsplit * 2;
  const float* acc = part_acc + (int64_t(r) * heads + h) * nsplit * hd;
  float M = -INFINITY;
  for (int s = 0; s < ns; ++s) M = fmaxf(M, ml[2 * s]);
  float L = 0.f;
  for (int s = 0; s < ns; ++s) L += ml[2 * s + 1] * exp2f(ml[2 * s] - M);
  const float inv = L > 0.f ? 1.f / L : 0.f;
  bf16* o = out + (int64_t(r) * heads + h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float v = 0.f;
    for (int s = 0; s < ns; ++s) v += acc[int64_t(s) * hd + d] * exp2f(ml[2 * s] - M);
    o[d] = __float2bfloat16(v * inv);
  }
}

__global__ void kv_append_kernel(const uint4* k, const uint4* v, int64_t n, int64_t c8, const int64_t* dst_row,
                                 uint4* kc, uint4* vc) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * c8) return;
  const int64_t r = i / c8, c = i % c8;
  const int64_t dst = dst_row[r] * c8 + c;
  kc[dst] = k[i];
  vc[dst] = v[i];
}

__device__ __forceinline__ void take_better(float& best, int& bi, float v, int i) {
  if (v > best || (v == best && i < bi)) {
    best = v;
    bi = i;
  }
}

constexpr int kArgmaxThreads = 256;
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float* logits, int64_t vocab, int32_t* ids) {
  const int64_t r = blockIdx.x;
  const float* row = logits + r * vocab;
  float best = -INFINITY;
  int bi = INT_MAX;
  if (vocab % 4 == 0) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    for (int64_t i = threadIdx.x; i < vocab / 4; i += kArgmaxThreads) {
      const float4 v = row4[i];
      take_better(best, bi, v.x, int(4 * i));
      take_better(best, bi, v.y, int(4 * i + 1));
      take_better(best, bi, v.z, int(4 * i + 2));
      take_better(best, bi, v.w, int(4 * i + 3));
    }
  } else {
    for (int64_t i = threadIdx.x; i < vocab; i += kArgmaxThreads) take_better(best, bi, row[i], int(i));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    take_better(best, bi, ov, oi);
  }
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int si[kArgmaxThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sv[warp] = best;
    si[warp] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / 32; ++w) take_better(best, bi, sv[w], si[w]);
    ids[r] = bi == INT_MAX ? 0 : bi;  // every entry NaN: id 0
  }
}

}  // namespace

void decode_attention_setup(const DecodeAttnDims& d) {
  const int64_t G = d.heads / d.kv_heads;
  const size_t smem = size_t(smem_floats(G, d.head_dim, tile_keys(d.head_dim))) * 4;
  // The attribute is per device and setup runs once per decoder: set it each time the shape needs more
  // than the default 48 KiB (a process-wide "already done" flag would miss a second GPU).
  if (smem > 48 * 1024)
    LT_CUDA(cudaFuncSetAttribute(decode_attn_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
}

void decode_attention(const DecodeAttnDims& d, const void* q, const void* k_cache, const void* v_cache,
                      const int64_t* row0, const int32_t* len, void* out, float* partial, cudaStream_t st) {
  if (d.n == 0) return;
  LT_CUDA_REQUIRE(d.kv_heads > 0 && d.heads % d.kv_heads == 0, "decode_attention: heads must be a multiple of kv_heads");
  LT_CUDA_REQUIRE(d.head_dim % 8 == 0 && d.head_dim <= 256, "decode_attention: head_dim must be a multiple of 8, <= 256");
  const int64_t G = d.heads / d.kv_heads;
  LT_CUDA_REQUIRE(G * d.head_dim / 2 <= int64_t(kMaxPairs) * kThreads, "decode_attention: (heads/kv_heads)*head_dim > 4096");
  LT_CUDA_REQUIRE(d.max_len > 0 && d.n <= 65535 && d.kv_heads <= 65535, "decode_attention: bad max_len or grid");
  const int64_t nsplit = decode_attention_splits(d.max_len);
  const int tile = tile_keys(d.head_dim);
  const size_t smem = size_t(smem_floats(G, d.head_dim, tile)) * 4;
  decode_attention_setup(d);
  float* part_acc = partial;
  float* part_ml = partial + d.n * d.heads * nsplit * d.head_dim;
  const dim3 grid(unsigned(nsplit), unsigned(d.kv_heads), unsigned(d.n));
  decode_attn_split_kernel<<<grid, kThreads, smem, st>>>(
      static_cast<const bf16*>(q), static_cast<const bf16*>(k_cache), static_cast<const bf16*>(v_cache), row0, len,
      int(d.heads), int(d.kv_heads), int(d.head_dim), tile, d.scale * kLog2e, int(nsplit), part_acc, part_ml);
  LT_CUDA_LAUNCH();
  decode_combine_kernel<<<dim3(unsigned(d.heads), unsigned(d.n)), 128, 0, st>>>(
      part_acc, part_ml, len, int(d.heads), int(d.head_dim), int(nsplit), static_cast<bf16*>(out));
  LT_CUDA_LAUNCH();
}

void kv_cache_append(const void* k, const void* v, int64_t n, int64_t kv_dim, const int64_t* dst_row, void* k_cache,
                     void* v_cache, cudaStream_t st) {
  LT_CUDA_REQUIRE(kv_dim % 8 == 0, "kv_cache_append: kv_dim must be a multiple of 8");
  const int64_t c8 = kv_dim / 8, total = n * c8;
  if (total == 0) return;
  kv_append_kernel<<<unsigned((total + 255) / 256), 256, 0, st>>>(static_cast<const uint4*>(k), static_cast<const uint4*>(v),
                                                                 n, c8, dst_row, static_cast<uint4*>(k_cache),
                                                                 static_cast<uint4*>(v_cache));
  LT_CUDA_LAUNCH();
}

void argmax_rows(const float* logits, int64_t n, int64_t vocab, int32_t* ids, cudaStream_t st) {
  if (n == 0) return;
  LT_CUDA_REQUIRE(vocab > 0 && vocab < INT_MAX && n <= INT_MAX, "argmax_rows: bad shape");
  argmax_kernel<<<unsigned(n), kArgmaxThreads, 0, st>>>(logits, vocab, ids);
  LT_CUDA_LAUNCH();
}

}  // namespace lt::cuda
