// Run-time choice of the kernel path.
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "optim/adamw_kernels.h"

namespace lt::optim {
namespace {
bool avx512_vbmi() {
  static const bool has = __builtin_cpu_supports("avx512vbmi");
  return has;
}
}  // namespace

const char* isa_name(Isa i) {
  switch (i) {
    case Isa::Auto: return "auto";
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "?";
}

Isa parse_isa(std::string_view s) {
  if (s == "auto") return Isa::Auto;
  if (s == "scalar") return Isa::Scalar;
  if (s == "avx2") return Isa::Avx2;
  if (s == "avx512") return Isa::Avx512;
  fail("optimizer ISA: expected one of auto|scalar|avx2|avx512, got '{}'", s);
}

bool isa_supported(Isa i) {
  switch (i) {
    case Isa::Auto:
    case Isa::Scalar: return true;
    case Isa::Avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512cd") && isa_supported(Isa::Avx2);
  }
  return false;
}

Isa resolve_isa(Isa requested) {
  if (requested == Isa::Auto) {
    if (const char* env = std::getenv("LT_OPTIM_ISA"); env && *env) {
      Isa e = parse_isa(env);
      if (e != Isa::Auto) return resolve_isa(e);
    }
    if (isa_supported(Isa::Avx512)) return Isa::Avx512;
    if (isa_supported(Isa::Avx2)) return Isa::Avx2;
    return Isa::Scalar;
  }
  LT_CHECK(isa_supported(requested), "optimizer ISA '{}' is not supported by this CPU", isa_name(requested));
  return requested;
}

AdamWScalars make_adamw_scalars(double lr, double weight_decay, double beta1, double beta2, double eps,
                                int64_t step, float grad_scale) {
  LT_CHECK(step >= 1, "AdamW step count must be >= 1, got {}", step);
  AdamWScalars s;
  double bc1 = 1.0 - std::pow(beta1, double(step));
  double bc2 = 1.0 - std::pow(beta2, double(step));
  s.decay = float(1.0 - lr * weight_decay);
  s.w1 = float(1.0 - beta1);
  s.beta1 = float(beta1);
  s.beta2 = float(beta2);
  s.w2 = float(1.0 - beta2);
  s.eps = float(eps);
  s.bc2_sqrt = float(std::sqrt(bc2));
  s.inv_bc2_sqrt = float(1.0 / std::sqrt(bc2));
  s.neg_step_size = float(-(lr / bc1));
  s.grad_scale = grad_scale;
  return s;
}

void adamw_f32(Isa isa, const AdamWScalars& s, float* p, const float* g, float* m, float* v, bf16_t* out,
               int64_t n) {
  switch (resolve_isa(isa)) {
    case Isa::Avx512: return detail::adamw_f32_avx512(s, p, g, m, v, out, n);
    case Isa::Avx2: return detail::adamw_f32_avx2(s, p, g, m, v, out, n);
    default: return detail::adamw_f32_scalar(s, p, g, m, v, out, n);
  }
}

bool q8_avx512_kernel_available() { return isa_supported(Isa::Avx512) && avx512_vbmi(); }

void adamw_q8(Isa isa, const AdamWScalars& s, float* p, const float* g, uint8_t* mq, uint8_t* vq, float* ms,
              float* vs, bf16_t* out, int64_t n) {
  switch (resolve_isa(isa)) {
    case Isa::Avx512:  // the 8-bit kernel also needs VBMI; without it AVX2 (bit-identical to scalar)
      if (q8_avx512_kernel_available()) return detail::adamw_q8_avx512(s, p, g, mq, vq, ms, vs, out, n);
      return detail::adamw_q8_avx2(s, p, g, mq, vq, ms, vs, out, n);
    case Isa::Avx2: return detail::adamw_q8_avx2(s, p, g, mq, vq, ms, vs, out, n);
    default: return detail::adamw_q8_scalar(s, p, g, mq, vq, ms, vs, out, n);
  }
}

bool adamw_f32_fused(Isa isa, const AdamWScalars& s, MasterFormat f, const MasterIo& io, float* m, float* v,
                     int64_t n) {
  if (resolve_isa(isa) != Isa::Avx512) return false;
  detail::adamw_f32_avx512_fused(s, f, io, m, v, n);
  return true;
}

bool adamw_q8_fused(Isa isa, const AdamWScalars& s, MasterFormat f, const MasterIo& io, uint8_t* mq, uint8_t* vq,
                    float* ms, float* vs, int64_t n) {
  if (resolve_isa(isa) != Isa::Avx512 || !q8_avx512_kernel_available()) return false;
  detail::adamw_q8_avx512_fused(s, f, io, mq, vq, ms, vs, n);
  return true;
}

double sumsq(Isa isa, const float* g, int64_t n) {
  switch (resolve_isa(isa)) {
    case Isa::Avx512: return detail::sumsq_avx512(g, n);
    case Isa::Avx2: return detail::sumsq_avx2(g, n);
    default: return detail::sumsq_scalar(g, n);
  }
}

}  // namespace lt::optim
