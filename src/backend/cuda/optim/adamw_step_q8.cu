// Backend::adamw_step_q8 on the GPU: the CPU optimizer's scalar 8-bit AdamW path (optim/adamw_scalar.cpp,
// optim/quant8.h) with every operation an IEEE round-to-nearest intrinsic, so nvcc contracts nothing and the result
// is bit-identical to cpu::adamw_step_q8 (backend/cpu/ops_adamw.cpp). One thread block per quantisation block of 256
// elements (grid-stride over blocks), one element per thread: decode, update, block max of |m| and v, new scales,
// requantise.
#include <algorithm>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/optim/split_master.cuh"

namespace lt::cuda {
namespace {

constexpr int kBlock = 256;  // optim::kQ8Block: one thread per element of a quantisation block
constexpr int kWarps = kBlock / 32;

// A map's quantiser lines in shared memory.
struct Lines {
  float top[8], inv_step[8], code_off[8];
  int mag_bits, is_signed;
};

// optim::quantize_one: the decade by comparisons with the tops, the decade's line, round to nearest even.
__device__ __forceinline__ uint8_t quantize(const Lines& q, float y) {
  const uint32_t bits = __float_as_uint(y);
  const float a = __uint_as_float(bits & 0x7fffffffu);
  int e = 0;
  for (int t = 1; t < q.mag_bits; ++t) e += a < q.top[t] ? 1 : 0;
  const float cf = __fmaf_rn(a, q.inv_step[e], q.code_off[e]);
  if (!(cf > -1.0f && cf < 256.0f)) return 0;  // non-finite y: code 0 as on the CPU
  constexpr float kRound = 12582912.0f;        // 1.5 * 2^23: round to nearest even
  int32_t code = int32_t(__fsub_rn(__fadd_rn(cf, kRound), kRound));
  if (q.is_signed) code |= int32_t((bits >> 31) << 7);
  else if (a == 0.0f) code = 0;
  return uint8_t(code);
}

// optim::block_inv.
__device__ __forceinline__ float block_inv(float absmax) {
  return absmax >= 1.17549435e-38f ? __fdiv_rn(1.0f, absmax) : 0.0f;  // FLT_MIN
}

// The CPU's running std::max from +0 keeps the largest x > 0 and ignores NaN, -0 and negatives; mapping those to +0
// first makes fmaxf's tree reduction give the same bits in any order.
__device__ __forceinline__ float max_operand(float x) { return x > 0.0f ? x : 0.0f; }

__global__ void adamw_step_q8_kernel(AdamWQ8Consts s, Q8MapsConsts maps, float* p, uint16_t* hi, uint16_t* lo,
                                     const float* g, uint8_t* mq, uint8_t* vq, float* ms, float* vs, int64_t n) {
  __shared__ float dec_m[256], dec_v[256];
  __shared__ Lines lm, lv;
  __shared__ float red_m[kWarps], red_v[kWarps];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  dec_m[t] = maps.m.decode[t];
  dec_v[t] = maps.v.decode[t];
  if (t < 8) {
    lm.top[t] = maps.m.top[t], lm.inv_step[t] = maps.m.inv_step[t], lm.code_off[t] = maps.m.code_off[t];
    lv.top[t] = maps.v.top[t], lv.inv_step[t] = maps.v.inv_step[t], lv.code_off[t] = maps.v.code_off[t];
  }
  if (t == 0) {
    lm.mag_bits = maps.m.mag_bits, lm.is_signed = maps.m.is_signed;
    lv.mag_bits = maps.v.mag_bits, lv.is_signed = maps.v.is_signed;
  }
  __syncthreads();
  const int64_t nblk = (n + kBlock - 1) / kBlock;
  for (int64_t blk = blockIdx.x; blk < nblk; blk += gridDim.x) {
    const int64_t k = blk * kBlock + t;
    const bool active = k < n;  // the last block may be partial
    // Every thread reads the old scales here; they are overwritten only after the reduction's barriers.
    const float b1s = __fmul_rn(s.beta1, ms[blk]), b2s = __fmul_rn(s.beta2, vs[blk]);
    float mm = 0.0f, vv = 0.0f;
    if (active) {
      const float dm = dec_m[mq[k]], vb = __fmul_rn(dec_v[vq[k]], b2s);
      const float gs = __fmul_rn(g[k], s.grad_scale);
      mm = __fmaf_rn(b1s, dm, __fmul_rn(s.w1, gs));
      vv = __fmaf_rn(__fmul_rn(s.w2, gs), gs, vb);
      const float denom = __fmaf_rn(__fsqrt_rn(vv), s.inv_bc2_sqrt, s.eps);
      const float upd = __fdiv_rn(__fmul_rn(s.neg_step_size, mm), denom);
      if (p) {
        p[k] = __fmaf_rn(p[k], s.decay, upd);
      } else {
        uint16_t h, l;
        split_master(__fmaf_rn(join_master(hi[k], lo[k]), s.decay, upd), &h, &l);
        hi[k] = h;
        lo[k] = l;
      }
    }
    float am = active ? max_operand(fabsf(mm)) : 0.0f, av = active ? max_operand(vv) : 0.0f;
    for (int o = 16; o > 0; o >>= 1) {
      am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
      av = fmaxf(av, __shfl_xor_sync(0xffffffffu, av, o));
    }
    if (lane == 0) red_m[warp] = am, red_v[warp] = av;
    __syncthreads();
    am = red_m[0], av = red_v[0];
    for (int w = 1; w < kWarps; ++w) am = fmaxf(am, red_m[w]), av = fmaxf(av, red_v[w]);
    // +0 (as on the CPU) for an all-zero block whatever max.f32 does with signed zeros; other values unchanged.
    am = __fadd_rn(am, 0.0f), av = __fadd_rn(av, 0.0f);
    __syncthreads();  // red_* are rewritten by the next block; every thread has read ms/vs[blk] above
    if (t == 0) ms[blk] = am, vs[blk] = av;
    if (active) {
      mq[k] = quantize(lm, __fmul_rn(mm, block_inv(am)));
      vq[k] = quantize(lv, __fmul_rn(vv, block_inv(av)));
    }
  }
}

}  // namespace

void adamw_step_q8(const AdamWQ8Consts& s, const Q8MapsConsts& maps, float* p, uint16_t* hi, uint16_t* lo,
                   const float* g, uint8_t* mq, uint8_t* vq, float* ms, float* vs, int64_t n, cudaStream_t st) {
  if (n <= 0) return;
  const int64_t blocks = std::min<int64_t>((n + kBlock - 1) / kBlock, 132 * 16);  // grid-stride past ~16 per SM
  adamw_step_q8_kernel<<<unsigned(blocks), kBlock, 0, st>>>(s, maps, p, hi, lo, g, mq, vq, ms, vs, n);
  LT_CUDA_LAUNCH();
}

}  // namespace lt::cuda
