// Backend::adamw_step on the GPU: the CPU optimizer's fp32 AdamW element update (optim/adamw_kernels.h) with every
// operation an IEEE round-to-nearest intrinsic, so nvcc contracts nothing into an FMA and the result is bit-identical
// to cpu::adamw_step (backend/cpu/ops_adamw.cpp). The split master's join and split are core/split_master.h's bit
// operations. Memory-bound: 28 B per element (16 read: master 4, gradient 4, moments 8; 12 written).
#include <algorithm>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/optim/split_master.cuh"

namespace lt::cuda {
namespace {

__device__ __forceinline__ float adamw_elem(const AdamWConsts& s, float p, float g_in, float& m, float& v) {
  const float g = __fmul_rn(g_in, s.grad_scale);
  const float pp = __fmul_rn(p, s.decay);
  const float mm = __fadd_rn(m, __fmul_rn(s.w1, __fsub_rn(g, m)));
  const float vv = __fadd_rn(__fmul_rn(v, s.beta2), __fmul_rn(__fmul_rn(s.w2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vv), s.bc2_sqrt), s.eps);
  m = mm;
  v = vv;
  return __fadd_rn(pp, __fdiv_rn(__fmul_rn(s.neg_step_size, mm), denom));
}

__global__ void adamw_step_kernel(AdamWConsts s, float* p, uint16_t* hi, uint16_t* lo, const float* g, float* m,
                                  float* v, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float mi = m[i], vi = v[i];
    if (p) {
      p[i] = adamw_elem(s, p[i], g[i], mi, vi);
    } else {
      uint16_t h, l;
      split_master(adamw_elem(s, join_master(hi[i], lo[i]), g[i], mi, vi), &h, &l);
      hi[i] = h;
      lo[i] = l;
    }
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace

void adamw_step(const AdamWConsts& s, float* p, uint16_t* hi, uint16_t* lo, const float* g, float* m, float* v,
                int64_t n, cudaStream_t st) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 132 * 16);  // grid-stride past ~16 per SM
  adamw_step_kernel<<<unsigned(blocks), kThreads, 0, st>>>(s, p, hi, lo, g, m, v, n);
  LT_CUDA_LAUNCH();
}

}  // namespace lt::cuda
