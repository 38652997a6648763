// Gated DeltaNet kernel timings (src/backend/cuda/deltanet/deltanet.h) at a layer shape, default the Qwen3.5/3.6
// 27B layer: batch 8 x seq 1024, Hk 16, Hv 48, Dk = Dv = 128, conv kernel 4. Median of 10 runs (events).
// The chunked rule is timed on every implementation (cuda::GdnRuleImpl Chunked in both precisions and, in Bf16, with
// the register passes and the tile passes; Mma, Simt)
// with the TFLOP/s it reaches at the model's FLOP count (src/model/mixer_deltanet.cpp: per token and value head
// C (3 Dk + 2 Dv) + 6 Dk Dv forward, twice that backward); the total uses the default implementation.
// Usage: bench_deltanet [batch seq Hk Hv Dk Dv]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/deltanet/deltanet.h"
#include "backend/cuda/kernel_options.h"
#include "core/dtype.h"

using namespace lt;

namespace {

#define BC(call)                                                       \
  do {                                                                 \
    cudaError_t e_ = (call);                                           \
    if (e_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                    \
    }                                                                  \
  } while (0)

double time_median_ms(const std::function<void()>& f, cudaStream_t st, int warm = 2, int reps = 10) {
  for (int i = 0; i < warm; ++i) f();
  BC(cudaStreamSynchronize(st));
  std::vector<double> ts;
  cudaEvent_t a, b;
  BC(cudaEventCreate(&a));
  BC(cudaEventCreate(&b));
  for (int i = 0; i < reps; ++i) {
    BC(cudaEventRecord(a, st));
    f();
    BC(cudaEventRecord(b, st));
    BC(cudaEventSynchronize(b));
    float ms = 0;
    BC(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

std::vector<void*> g_bufs;
void* dev_alloc(size_t bytes) {
  void* p = nullptr;
  BC(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
  BC(cudaMemset(p, 0, bytes));
  g_bufs.push_back(p);
  return p;
}
void* dev_bf16(size_t n, std::mt19937& rng, float scale, float mean = 0.f) {
  std::normal_distribution<float> d(mean, scale);
  std::vector<uint16_t> h(n);
  for (auto& x : h) x = f32_to_bf16(d(rng));
  void* p = dev_alloc(n * 2);
  BC(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice));
  return p;
}
float* dev_f32(size_t n, std::mt19937& rng, float scale, float mean = 0.f) {
  std::normal_distribution<float> d(mean, scale);
  std::vector<float> h(n);
  for (auto& x : h) x = d(rng);
  void* p = dev_alloc(n * 4);
  BC(cudaMemcpy(p, h.data(), n * 4, cudaMemcpyHostToDevice));
  return static_cast<float*>(p);
}

// One variant of the rule timed below: `base` with the implementation and precision; -1 keeps base's choice of the
// rest (warp_passes 0: the tile passes; grads_b16 0: the fragment path; grads_cta: threads a CTA; grads_wide 1:
// 16 x 32 warp tiles, 0: 16 x 16).
cuda::KernelOptions variant_options(cuda::KernelOptions o, cuda::GdnRuleImpl impl, cuda::GdnRulePrecision prec,
                                    int warp_passes, int grads_b16, int grads_cta, int grads_wide) {
  o.gdn_rule = impl;
  o.gdn_precision = prec;
  if (warp_passes >= 0) o.gdn_passes = warp_passes ? cuda::GdnPasses::Warp : cuda::GdnPasses::Tile;
  if (grads_b16 >= 0) o.gdn_grads = grads_b16 ? cuda::GdnGrads::Bf16 : cuda::GdnGrads::Frag;
  if (grads_cta >= 0) o.gdn_grads_cta = grads_cta;
  if (grads_wide >= 0) o.gdn_grads_tile = grads_wide ? 32 : 16;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  cuda::GdnDims d;
  d.batch = 8, d.seq = 1024, d.Hk = 16, d.Hv = 48, d.Dk = 128, d.Dv = 128, d.K = 4;
  if (argc == 7) {
    d.batch = std::atoll(argv[1]), d.seq = std::atoll(argv[2]), d.Hk = std::atoll(argv[3]);
    d.Hv = std::atoll(argv[4]), d.Dk = std::atoll(argv[5]), d.Dv = std::atoll(argv[6]);
  }
  const size_t T = size_t(d.tokens()), C = size_t(d.conv_ch()), KD = size_t(d.Hk * d.Dk), VD = size_t(d.Hv * d.Dv),
               NV = size_t(d.Hv);
  std::mt19937 rng(1);
  cudaStream_t st;
  BC(cudaStreamCreate(&st));
  // forward tensors
  void* x = dev_bf16(T * C, rng, 1.f);
  void* wconv = dev_bf16(C * size_t(d.K), rng, 0.5f);
  void* y = dev_alloc(T * C * 2);
  void* a = dev_bf16(T * NV, rng, 1.f);
  void* b = dev_bf16(T * NV, rng, 1.f);
  void* A_log = dev_bf16(NV, rng, 0.5f, 1.f);
  void* dt = dev_bf16(NV, rng, 0.5f);
  void* qn = dev_alloc(T * KD * 2);
  void* kn = dev_alloc(T * KD * 2);
  void* v = dev_alloc(T * VD * 2);
  float* g = static_cast<float*>(dev_alloc(T * NV * 4));
  float* beta = static_cast<float*>(dev_alloc(T * NV * 4));
  void* o = dev_alloc(T * VD * 2);
  float* states = static_cast<float*>(dev_alloc(size_t(cuda::gdn_rule_state_bytes(d))));
  void* z = dev_bf16(T * VD, rng, 1.f);
  void* wn = dev_bf16(size_t(d.Dv), rng, 0.3f, 1.f);
  void* yn = dev_alloc(T * VD * 2);
  float* rstd = static_cast<float*>(dev_alloc(T * NV * 4));
  // backward tensors
  void* dyn = dev_bf16(T * VD, rng, 1.f);
  void* dO = dev_alloc(T * VD * 2);
  void* dz = dev_alloc(T * VD * 2);
  float* dwn = static_cast<float*>(dev_alloc(size_t(d.Dv) * 4));
  float* dq = static_cast<float*>(dev_alloc(T * KD * 4));
  float* dk = static_cast<float*>(dev_alloc(T * KD * 4));
  float* dv = static_cast<float*>(dev_alloc(T * VD * 4));
  float* dg = static_cast<float*>(dev_alloc(T * NV * 4));
  float* dbeta = static_cast<float*>(dev_alloc(T * NV * 4));
  void* dy = dev_alloc(T * C * 2);
  void* da = dev_alloc(T * NV * 2);
  void* db = dev_alloc(T * NV * 2);
  float* dA = static_cast<float*>(dev_alloc(NV * 4));
  float* ddt = static_cast<float*>(dev_alloc(NV * 4));
  void* dx = dev_alloc(T * C * 2);
  float* dwc = static_cast<float*>(dev_alloc(C * size_t(d.K) * 4));
  const size_t ws_bytes = size_t(std::max({cuda::gdn_conv_bwd_workspace_bytes(d), cuda::gdn_prep_bwd_workspace_bytes(d),
                                           cuda::gdn_rule_bwd_workspace_bytes(d),
                                           cuda::gdn_gated_norm_bwd_workspace_bytes(d)}));
  void* ws = dev_alloc(ws_bytes);
  (void)dev_f32;

  // Realistic inputs for the rule: run the forward chain once.
  cuda::gdn_conv_silu_fwd(d, x, int64_t(C), wconv, nullptr, y, st);
  cuda::gdn_prep_fwd(d, y, a, b, d.Hv, A_log, dt, qn, kn, v, g, beta, st);
  cuda::gdn_rule_fwd(d, qn, kn, v, g, beta, nullptr, o, states, st, ws);
  cuda::gdn_gated_norm_bwd(d, o, z, d.Hv * d.Dv, wn, 1e-6f, rstd, dyn, dO, dz, dwn, ws, st);
  BC(cudaStreamSynchronize(st));

  struct Row {
    const char* name;
    double ms;
  };
  std::vector<Row> rows;
  auto add = [&](const char* name, const std::function<void()>& f) { rows.push_back({name, time_median_ms(f, st)}); };
  add("conv_silu_fwd", [&] { cuda::gdn_conv_silu_fwd(d, x, int64_t(C), wconv, nullptr, y, st); });
  add("prep_fwd", [&] { cuda::gdn_prep_fwd(d, y, a, b, d.Hv, A_log, dt, qn, kn, v, g, beta, st); });
  const cuda::GdnRuleImpl def_impl = cuda::gdn_rule_impl();
  const std::string fwd_name = std::string("rule_fwd [") + cuda::gdn_rule_impl_name(def_impl) + "]";
  const std::string bwd_name = std::string("rule_bwd [") + cuda::gdn_rule_impl_name(def_impl) + "]";
  add(fwd_name.c_str(),
      [&] { cuda::gdn_rule_fwd(d, qn, kn, v, g, beta, nullptr, o, states, st, ws); });
  add("gated_norm_fwd", [&] { cuda::gdn_gated_norm_fwd(d, o, z, d.Hv * d.Dv, wn, 1e-6f, yn, rstd, st); });
  add("gated_norm_bwd", [&] { cuda::gdn_gated_norm_bwd(d, o, z, d.Hv * d.Dv, wn, 1e-6f, rstd, dyn, dO, dz, dwn, ws, st); });
  add(bwd_name.c_str(), [&] {
    cuda::gdn_rule_bwd(d, qn, kn, v, g, beta, nullptr, states, dO, dq, dk, dv, dg, dbeta, ws, st);
  });
  add("prep_bwd", [&] { cuda::gdn_prep_bwd(d, y, a, b, d.Hv, A_log, dt, dq, dk, dv, dg, dbeta, dy, da, db, dA, ddt, ws, st); });
  add("conv_silu_bwd", [&] { cuda::gdn_conv_silu_bwd(d, x, int64_t(C), wconv, dy, nullptr, dx, dwc, ws, st); });
  std::printf("Gated DeltaNet kernels: batch %lld seq %lld Hk %lld Hv %lld Dk %lld Dv %lld K %lld\n",
              (long long)d.batch, (long long)d.seq, (long long)d.Hk, (long long)d.Hv, (long long)d.Dk,
              (long long)d.Dv, (long long)d.K);
  double total = 0;
  for (const auto& r : rows) {
    std::printf("  %-18s %9.3f ms\n", r.name, r.ms);
    total += r.ms;
  }
  std::printf("  %-18s %9.3f ms   (target for all of these: <= ~6 ms at the 27B shape)\n", "total", total);
  // The rule on every implementation.
  const double rule_flop_fwd = double(d.tokens()) * double(d.Hv) *
                               (double(cuda::kGdnChunk) * (3.0 * double(d.Dk) + 2.0 * double(d.Dv)) +
                                6.0 * double(d.Dk) * double(d.Dv));
  std::printf("  rule per implementation (FLOP fwd %.3g, bwd %.3g):\n", rule_flop_fwd, 2 * rule_flop_fwd);
  const cuda::KernelOptions base = cuda::kernel_options();
  struct Variant {
    cuda::GdnRuleImpl impl;
    cuda::GdnRulePrecision prec;
    int warp_passes;  // -1: the default (register passes where the shape allows), 0: the tile passes
    int grads_b16 = -1;  // -1: the default (chunk_grads' bf16 operands with the register passes), 0: fragment path
    int grads_cta = -1;  // chunk_grads' threads a CTA on the bf16 path (-1: the default)
    int grads_wide = -1;  // 1: chunk_grads' 16 x 32 warp tiles (-1: the default)
  };
  for (Variant var : {Variant{cuda::GdnRuleImpl::Chunked, cuda::GdnRulePrecision::Split, -1},
                      Variant{cuda::GdnRuleImpl::Chunked, cuda::GdnRulePrecision::Bf16, 0},
                      Variant{cuda::GdnRuleImpl::Chunked, cuda::GdnRulePrecision::Bf16, -1, 0},
                      Variant{cuda::GdnRuleImpl::Chunked, cuda::GdnRulePrecision::Bf16, -1},
                      Variant{cuda::GdnRuleImpl::Chunked, cuda::GdnRulePrecision::Bf16, -1, -1, 256, 0},
                      Variant{cuda::GdnRuleImpl::Chunked, cuda::GdnRulePrecision::Bf16, -1, -1, 384, 0},
                      Variant{cuda::GdnRuleImpl::Chunked, cuda::GdnRulePrecision::Bf16, -1, -1, 512, 0},
                      Variant{cuda::GdnRuleImpl::Chunked, cuda::GdnRulePrecision::Bf16, -1, -1, 256, 1},
                      Variant{cuda::GdnRuleImpl::Chunked, cuda::GdnRulePrecision::Bf16, -1, -1, 384, 1},
                      Variant{cuda::GdnRuleImpl::Chunked, cuda::GdnRulePrecision::Bf16, -1, -1, 512, 1},
                      Variant{cuda::GdnRuleImpl::Mma, cuda::GdnRulePrecision::Split, -1},
                      Variant{cuda::GdnRuleImpl::Simt, cuda::GdnRulePrecision::Split, -1}}) {
    const cuda::KernelOptionsScope scope(variant_options(base, var.impl, var.prec, var.warp_passes, var.grads_b16,
                                                        var.grads_cta, var.grads_wide));
    const double f = time_median_ms([&] { cuda::gdn_rule_fwd(d, qn, kn, v, g, beta, nullptr, o, states, st, ws); }, st);
    const double bw = time_median_ms(
        [&] { cuda::gdn_rule_bwd(d, qn, kn, v, g, beta, nullptr, states, dO, dq, dk, dv, dg, dbeta, ws, st); }, st);
    const std::string name = std::string(cuda::gdn_rule_impl_name(var.impl)) +
                             (var.impl == cuda::GdnRuleImpl::Chunked ? std::string("/") +
                                                                           cuda::gdn_rule_precision_name(var.prec)
                                                                     : std::string()) +
                             (var.warp_passes == 0 ? "/tile" : "") + (var.grads_b16 == 0 ? "/frag" : "") +
                             (var.grads_cta > 0 ? "/cta" + std::to_string(var.grads_cta) : "") +
                             (var.grads_wide == 1 ? "x32" : "");
    std::printf("    %-18s fwd %8.3f ms (%6.1f TFLOP/s)  bwd %8.3f ms (%6.1f TFLOP/s)  fwd+bwd %8.3f ms\n",
                name.c_str(), f, rule_flop_fwd / (f * 1e9), bw, 2 * rule_flop_fwd / (bw * 1e9), f + bw);
  }
  std::printf("  workspace: rule states %.1f MiB, bwd workspace %.1f MiB\n",
              double(cuda::gdn_rule_state_bytes(d)) / 1048576.0, double(ws_bytes) / 1048576.0);
  for (void* p : g_bufs) cudaFree(p);
  cudaStreamDestroy(st);
  return 0;
}
