// The fused AdamW update kernels (one pass over memory) and their run-time ISA dispatch.
//
// Per element, with PyTorch AdamW semantics (torch.optim.AdamW, single-tensor path) and the clip
// factor folded in (g = grad * grad_scale):
//   p = p * (1 - lr*wd)                       decoupled weight decay
//   m = m + (1-beta1) * (g - m)               exp_avg.lerp_(g, 1-beta1)
//   v = v * beta2 + ((1-beta2) * g) * g       exp_avg_sq.mul_(beta2).addcmul_(g, g, 1-beta2)
//   denom = sqrt(v) / sqrt(1-beta2^t) + eps   eps added after the bias-corrected sqrt
//   p = p + (-(lr / (1-beta1^t)) * m) / denom
//   out = bf16(p)                             round to nearest even
// The three paths (scalar, AVX2, AVX-512) perform the same IEEE operations in the same order (no FMA
// contraction: lt_optim builds with -ffp-contract=off), so their results are bit-identical.
//
// The 8-bit path computes the same formulas with fused multiply-adds, the moments' block scales folded
// into the decay factors, and a multiplication by 1/sqrt(1-beta2^t) instead of the division (each
// result within about one ulp of the fp32 path's, far below the error of the 8-bit states themselves):
// on a CPU core its update is bound by arithmetic. With dm, dv the decoded codes (QuantMap::decode) and
// sm, sv the blocks' absmax scales (m = dm * sm, v = dv * sv):
//   m = fma(beta1 * sm, dm, (1-beta1) * g);  v = fma((1-beta2) * g, g, dv * (beta2 * sv))
//   p = fma(p, 1 - lr*wd, (-(lr / (1-beta1^t)) * m) / fma(sqrt(v), 1/sqrt(1-beta2^t), eps))
// The scalar and AVX2 paths compute exactly these operations (std::fma in the scalar path); the
// AVX-512 path computes m and v the same way and takes sqrt and 1/x from hardware estimates
// (adamw_avx512_common.h).
#pragma once
#include <cstdint>
#include <string_view>

#include "core/dtype.h"

namespace lt::optim {

enum class Isa { Auto, Scalar, Avx2, Avx512 };
const char* isa_name(Isa i);        // "auto", "scalar", "avx2", "avx512"
Isa parse_isa(const std::string_view s);  // throws lt::Error on an unknown name
bool isa_supported(Isa i);          // this CPU can run the path
// The AVX-512 8-bit kernel also needs VBMI; without it adamw_q8(Isa::Avx512, ...) runs the AVX2 kernel.
bool q8_avx512_kernel_available();
// Auto -> LT_OPTIM_ISA from the environment if set, else the best supported path. An explicit path
// the CPU lacks throws lt::Error.
Isa resolve_isa(Isa requested);

// Step constants, computed once per (step, group) in double and rounded to float, as PyTorch does
// with its Python-float scalars.
struct AdamWScalars {
  float decay = 1;          // 1 - lr*wd
  float w1 = 0.1f;          // 1 - beta1
  float beta1 = 0.9f;       // beta1 (the 8-bit path multiplies it by m's block scale)
  float beta2 = 0.999f;
  float w2 = 0.001f;        // 1 - beta2
  float eps = 1e-8f;
  float bc2_sqrt = 1;       // sqrt(1 - beta2^t)
  float inv_bc2_sqrt = 1;   // 1 / sqrt(1 - beta2^t) (8-bit path)
  float neg_step_size = 0;  // -lr / (1 - beta1^t)
  float grad_scale = 1;     // clip coefficient
};
AdamWScalars make_adamw_scalars(double lr, double weight_decay, double beta1, double beta2, double eps,
                                int64_t step, float grad_scale);

constexpr int64_t kQ8Block = 256;  // elements per 8-bit quantisation block (one absmax scale each)

// fp32 moments. out may be null.
void adamw_f32(Isa isa, const AdamWScalars& s, float* p, const float* g, float* m, float* v, bf16_t* out,
               int64_t n);
// 8-bit moments: codes mq (signed dynamic map) and vq (unsigned dynamic map) with one absmax scale per
// kQ8Block elements in ms/vs. p, g, mq, vq, out point at a block boundary; ms/vs at that block's
// scale; the last block may be partial. Each block is dequantised, updated and requantised in one pass.
void adamw_q8(Isa isa, const AdamWScalars& s, float* p, const float* g, uint8_t* mq, uint8_t* vq, float* ms,
              float* vs, bf16_t* out, int64_t n);

// How the master weights are stored (described in optimizer.h).
enum class MasterFormat : uint8_t { F32 = 0, Split = 1, Bf16Sr = 2 };

// The master weights and gradient of a range in their storage forms, for the fused 8-bit kernel.
struct MasterIo {
  float* p = nullptr;          // F32: the masters
  bf16_t* bf16 = nullptr;      // F32: the streaming copy (may be null); Split: the high halves; Bf16Sr: the masters
  uint16_t* lo = nullptr;      // Split: the remainders
  const float* g = nullptr;    // the gradient: fp32, or
  const bf16_t* g16 = nullptr; // bf16
  uint32_t sr_key = 0;         // Bf16Sr: element i is rounded with sr_bits(sr_key, sr_element0 + i)
  uint32_t sr_element0 = 0;
};
// adamw_f32 and adamw_q8 over masters and gradients in any storage form, in one pass: each vector is
// rebuilt from its storage form, updated and stored back inside the AVX-512 kernel (8-bit: the VBMI
// one), with the same bits as join_master, split_master, round_bf16_sr (core/split_master.h) around the
// fp32-master kernel, i.e. the optimizer's tile path. Return false, doing nothing, where isa does not
// run that kernel.
bool adamw_f32_fused(Isa isa, const AdamWScalars& s, MasterFormat f, const MasterIo& io, float* m, float* v,
                     int64_t n);
bool adamw_q8_fused(Isa isa, const AdamWScalars& s, MasterFormat f, const MasterIo& io, uint8_t* mq, uint8_t* vq,
                    float* ms, float* vs, int64_t n);

// Sum of squares with double accumulation.
double sumsq(Isa isa, const float* g, int64_t n);

namespace detail {
// Per-ISA entry points (defined in adamw_<isa>.cpp).
void adamw_f32_scalar(const AdamWScalars&, float*, const float*, float*, float*, bf16_t*, int64_t);
void adamw_f32_avx2(const AdamWScalars&, float*, const float*, float*, float*, bf16_t*, int64_t);
void adamw_f32_avx512(const AdamWScalars&, float*, const float*, float*, float*, bf16_t*, int64_t);
void adamw_f32_avx512_fused(const AdamWScalars&, MasterFormat, const MasterIo&, float*, float*, int64_t);
void adamw_q8_scalar(const AdamWScalars&, float*, const float*, uint8_t*, uint8_t*, float*, float*, bf16_t*, int64_t);
void adamw_q8_avx2(const AdamWScalars&, float*, const float*, uint8_t*, uint8_t*, float*, float*, bf16_t*, int64_t);
void adamw_q8_avx512(const AdamWScalars&, float*, const float*, uint8_t*, uint8_t*, float*, float*, bf16_t*, int64_t);
void adamw_q8_avx512_fused(const AdamWScalars&, MasterFormat, const MasterIo&, uint8_t*, uint8_t*, float*, float*,
                           int64_t);
double sumsq_scalar(const float*, int64_t);
double sumsq_avx2(const float*, int64_t);
double sumsq_avx512(const float*, int64_t);
}  // namespace detail

}  // namespace lt::optim
