// GPU kernel benchmarks (H200): cuBLASLt GEMMs at the layer shapes, flash attention fwd+bwd, and one
// decoder layer forward / backward (backward = recompute forward + backward, i.e. what HF's
// forward+backward does) through the CudaBackend. Prints a table and JSON lines (--json FILE) that
// tools/bench_compare.py sets against tools/bench_torch_kernels.py's numbers from the same run.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gemm/gemm.h"
#include "backend/cuda/attention/attention_cudnn.h"
#include "backend/cuda/attention/attention_variants.h"
#include "backend/cuda/kernel_options.h"
#include "backend/cuda/kernels.h"
#include "core/dtype.h"
#include "model/model_config.h"

using namespace lt;

namespace {

#define BC(call)                                                                   \
  do {                                                                             \
    cudaError_t e_ = (call);                                                       \
    if (e_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));             \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

// Median time (s) of `reps` runs of f on the stream, after `warm` warm-up runs, with events.
double time_median(const std::function<void()>& f, cudaStream_t st, int warm = 3, int reps = 10) {
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
    ts.push_back(ms * 1e-3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

void* dev_random_bf16(size_t n, uint32_t seed, float scale = 1.f) {
  std::vector<uint16_t> h(n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  for (auto& v : h) v = f32_to_bf16(d(rng));
  void* p = nullptr;
  BC(cudaMalloc(&p, n * 2));
  BC(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice));
  return p;
}

std::ofstream g_json;
void emit(const std::string& kind, const std::string& name, double seconds, double flops) {
  std::printf("%-10s %-48s %10.3f ms %8.1f TFLOP/s\n", kind.c_str(), name.c_str(), seconds * 1e3, flops / seconds / 1e12);
  if (g_json)
    g_json << "{\"impl\":\"lazytrain\",\"kind\":\"" << kind << "\",\"name\":\"" << name << "\",\"seconds\":" << seconds
           << ",\"tflops\":" << flops / seconds / 1e12 << "}\n";
}

void bench_gemms(cudaStream_t st) {
  struct G {
    const char* name;
    bool ta, tb;
    int64_t m, n, k;
    bool f32;
  };
  const int64_t T = 16384;
  const std::vector<G> gs = {
      {"square_8192", false, true, 8192, 8192, 8192, false},
      {"7b_qproj_fwd_T16384", false, true, T, 3584, 3584, false},
      {"7b_gateup_fwd_T16384", false, true, T, 2 * 18944, 3584, false},
      {"7b_down_fwd_T16384", false, true, T, 3584, 18944, false},
      {"7b_down_dx_T16384", false, false, T, 18944, 3584, false},
      {"7b_down_dw_T16384_f32acc", true, false, 3584, 18944, T, true},
      {"3b_gateup_fwd_T32768", false, true, 32768, 2 * 11008, 2048, false},
  };
  void* ws = nullptr;
  BC(cudaMalloc(&ws, cuda::Gemm::kWorkspaceBytes));
  cuda::Gemm gemm(ws, cuda::Gemm::kWorkspaceBytes);
  for (const G& g : gs) {
    // A stored [m,k] or [k,m]; B stored [k,n] or [n,k].
    void* a = dev_random_bf16(size_t(g.m * g.k), 1);
    void* b = dev_random_bf16(size_t(g.k * g.n), 2);
    void* c = nullptr;
    BC(cudaMalloc(&c, size_t(g.m * g.n) * (g.f32 ? 4 : 2)));
    BC(cudaMemset(c, 0, size_t(g.m * g.n) * (g.f32 ? 4 : 2)));
    cuda::GemmArgs ar;
    ar.trans_a = g.ta, ar.trans_b = g.tb, ar.m = g.m, ar.n = g.n, ar.k = g.k;
    ar.a = a, ar.b = b, ar.c = c, ar.c_f32 = g.f32, ar.beta = g.f32 ? 1.f : 0.f;
    const double t = time_median([&] { gemm.run(ar, st); }, st);
    emit("gemm", g.name, t, 2.0 * g.m * g.n * g.k);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
  }
  cudaFree(ws);
}

// Packed rows as the math data packs them: documents of 64..512 rows (fixed pseudo-random lengths), the last one
// cut at the row's end; the forward FLOPs of the causal attention within each document (hd_total = heads x hd).
struct PackedDocs {
  std::vector<int32_t> segments;
  int64_t runs = 0, longest = 0;
  double fwd_flops = 0;
};
PackedDocs math_like_packed_rows(int64_t B, int64_t S, int64_t hd_total) {
  PackedDocs p;
  p.segments.resize(static_cast<size_t>(B * S));
  for (int64_t b = 0; b < B; ++b) {
    uint32_t x = uint32_t(b) * 2654435761u + 1;
    for (int64_t r = 0, id = 0; r < S; ++id) {
      x = x * 1664525u + 1013904223u;
      const int64_t len = std::min<int64_t>(S - r, 64 + int64_t(x >> 8) % 449);
      std::fill_n(p.segments.begin() + b * S + r, len, int32_t(id));
      ++p.runs;
      p.longest = std::max(p.longest, len);
      p.fwd_flops += 4.0 * double(len) * double(len) * double(hd_total) / 2;
      r += len;
    }
  }
  return p;
}

// The installed kernel options with `f` applied (for a KernelOptionsScope).
template <typename F>
cuda::KernelOptions with_options(F f) {
  cuda::KernelOptions o = cuda::kernel_options();
  f(o);
  return o;
}

void bench_attention(cudaStream_t st, int64_t B, int64_t S, int64_t H, int64_t KV, int64_t D) {
  const int64_t T = B * S;
  void* q = dev_random_bf16(size_t(T * H * D), 3);
  void* k = dev_random_bf16(size_t(T * KV * D), 4);
  void* v = dev_random_bf16(size_t(T * KV * D), 5);
  void* dO = dev_random_bf16(size_t(T * H * D), 6);
  void *o, *dq, *dk, *dv;
  float *lse, *acc, *delta;
  BC(cudaMalloc(&o, size_t(T * H * D) * 2));
  BC(cudaMalloc(&dq, size_t(T * H * D) * 2));
  BC(cudaMalloc(&dk, size_t(T * KV * D) * 2));
  BC(cudaMalloc(&dv, size_t(T * KV * D) * 2));
  BC(cudaMalloc(&lse, size_t(T * H) * 4));
  BC(cudaMalloc(&delta, size_t(T * H) * 4));
  const cuda::AttnDims d{B, S, H, KV, D, float(1.0 / std::sqrt(double(D)))};
  // Our kernels' fp32 dQ, or cuDNN's backward workspace (both of its backward algorithms), whichever is larger.
  size_t ws = size_t(T * H * D) * 4;
  for (const bool det : {true, false}) {
    const cuda::KernelOptionsScope scope(
        with_options([&](cuda::KernelOptions& o) { o.attention_deterministic = det; }));
    if (cuda::cudnn_attention_usable(d)) ws = std::max(ws, cuda::cudnn_attention_bwd_workspace(d));
  }
  BC(cudaMalloc(&acc, ws));
  const double fwd_flops = 4.0 * B * S * S * H * D / 2;  // causal
  const std::string shape = "B" + std::to_string(B) + "_S" + std::to_string(S) + "_H" + std::to_string(H) + "_KV" +
                            std::to_string(KV) + "_D" + std::to_string(D);
  // The layers' path (cuDNN where usable: attention_cudnn.h; its workspace in `acc`) as
  // "attn_*", then our kernels as "attn_own_*", and cuDNN's atomic (non-deterministic) backward as "attn_atomic_*".
  const bool cudnn = cuda::cudnn_attention_usable(d);
  std::printf("attention %s: %s\n", shape.c_str(), cudnn ? cuda::cudnn_attention_describe().c_str() : "own kernels");
  const PackedDocs docs = math_like_packed_rows(B, S, H * D);
  cuda::PackedRows pr;
  pr.runs = docs.runs;
  pr.longest = docs.longest;
  const double packed_flops = docs.fwd_flops;
  int32_t *seg_d = nullptr, *index = nullptr;
  BC(cudaMalloc(&seg_d, size_t(T) * 4));
  BC(cudaMemcpy(seg_d, docs.segments.data(), size_t(T) * 4, cudaMemcpyHostToDevice));
  BC(cudaMalloc(&index, size_t(cuda::packed_index_ints(d.tokens())) * 4));
  pr.segments = seg_d;
  pr.index = index;
  auto time_path = [&](const std::string& prefix, bool on_cudnn, bool pack) {
    const cuda::PackedRows* p = pack ? &pr : nullptr;
    const int32_t* sg = pack ? seg_d : nullptr;
    const double fl = pack ? packed_flops : fwd_flops;
    const double tf = time_median(
        [&] {
          if (on_cudnn) cuda::cudnn_attention_fwd(d, p, q, k, v, o, lse, st);
          else cuda::attention_fwd(d, q, k, v, sg, o, lse, st);
        },
        st);
    const double tb = time_median(
        [&] {
          if (on_cudnn) cuda::cudnn_attention_bwd(d, p, q, k, v, o, lse, dO, dq, dk, dv, acc, ws, st);
          else cuda::attention_bwd(d, q, k, v, sg, o, lse, dO, dq, dk, dv, acc, delta, nullptr, st);
        },
        st);
    emit(prefix + "_fwd", shape, tf, fl);
    emit(prefix + "_bwd", shape, tb, 2.5 * fl);
    emit(prefix + "_fwdbwd", shape, tf + tb, 3.5 * fl);
  };
  time_path("attn", cudnn, false);
  if (cudnn) {
    time_path("attn_own", false, false);
    const cuda::KernelOptionsScope scope(
        with_options([](cuda::KernelOptions& o) { o.attention_deterministic = false; }));
    if (cuda::cudnn_attention_usable(d)) time_path("attn_atomic", true, false);
  }
  // Packed rows (the training runs' case): cuDNN's ragged graphs against our kernels with segments.
  std::printf("packed rows: %lld documents, longest %lld\n", (long long)pr.runs, (long long)pr.longest);
  const bool packed_cudnn = cuda::cudnn_attention_usable(d, &pr);
  if (packed_cudnn) {
    ws = std::max(ws, cuda::cudnn_attention_bwd_workspace(d, &pr));
    BC(cudaFree(acc));
    BC(cudaMalloc(&acc, ws));
    time_path("attn_packed", true, true);
  }
  time_path("attn_own_packed", false, true);
  cudaFree(seg_d);
  cudaFree(index);
  // Every kernel variant of the same shape (attention_variants.h), to pick the defaults.
  for (int fv = 0; fv < cuda::attention_fwd_variant_count(); ++fv) {
    const cuda::KernelOptionsScope scope(
        with_options([&](cuda::KernelOptions& o) { o.attention_fwd_variant = fv; }));
    emit("attn_fwd_v" + std::to_string(fv), shape,
         time_median([&] { cuda::attention_fwd(d, q, k, v, nullptr, o, lse, st); }, st), fwd_flops);
  }
  for (int bv = 0; bv < cuda::attention_bwd_variant_count(); ++bv) {
    const cuda::KernelOptionsScope scope(
        with_options([&](cuda::KernelOptions& o) { o.attention_bwd_variant = bv; }));
    const double t = time_median(
        [&] { cuda::attention_bwd(d, q, k, v, nullptr, o, lse, dO, dq, dk, dv, acc, delta, nullptr, st); }, st);
    std::printf("           bwd variant %d (%s): %.3f ms\n", bv, cuda::attention_bwd_variant_name(bv), t * 1e3);
    emit("attn_bwd_v" + std::to_string(bv), shape, t, 2.5 * fwd_flops);
  }
  for (void* p : {q, k, v, dO, o, dq, dk, dv}) cudaFree(p);
  for (float* p : {lse, acc, delta}) cudaFree(p);
}

void bench_layer(const std::string& preset, int64_t B, int64_t S) {
  const ModelConfig c = preset_config(preset);
  CudaBackendOptions o;
  o.gpu_mem_cap = int64_t(48) << 30;  // leave the rest of the GPU to the benchmark's own buffers
  CudaBackend be(c, o);
  const UnitLayout& lay = be.layout().layer(0);
  const int64_t T = B * S;
  std::vector<Allocation> al;
  auto A = [&](int64_t bytes) {
    al.push_back(be.alloc(MemKind::Device, bytes, "bench"));
    return al.back().ptr;
  };
  void* w = A(lay.numel * 2);
  {  // random bf16 weights (norm weights ~1)
    std::vector<uint16_t> h(size_t(lay.numel));
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 0.02f);
    for (auto& p : lay.params)
      for (int64_t i = 0; i < p.numel; ++i)
        h[size_t(p.offset + i)] = f32_to_bf16(p.suffix.find("norm") != std::string::npos ? 1.f : nd(rng));
    BC(cudaMemcpy(w, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  }
  void* x = A(T * c.hidden * 2);
  void* dy = A(T * c.hidden * 2);
  void* y = A(T * c.hidden * 2);
  void* dx = A(T * c.hidden * 2);
  void* dw = A(lay.numel * 4);
  {
    void* xr = dev_random_bf16(size_t(T * c.hidden), 8);
    void* dr = dev_random_bf16(size_t(T * c.hidden), 9, 0.01f);
    BC(cudaMemcpy(x, xr, size_t(T * c.hidden) * 2, cudaMemcpyDeviceToDevice));
    BC(cudaMemcpy(dy, dr, size_t(T * c.hidden) * 2, cudaMemcpyDeviceToDevice));
    cudaFree(xr);
    cudaFree(dr);
  }
  be.fill_zero(Lane::Compute, dw, lay.numel * 4, {});
  be.reserve_workspace(T);
  DevGeometry g{B, S, nullptr, nullptr};
  auto st = static_cast<cudaStream_t>(be.stream(Lane::Compute));
  const double tf = time_median([&] { be.layer_forward(0, w, g, x, y, {}); }, st, 2, 5);
  const double tb = time_median([&] { be.layer_backward(0, w, g, x, dy, dx, dw, {}); }, st, 2, 5);
  // Kept internals: the forward keeps them, the backward does not re-run them.
  const int64_t kb = be.layer_keep_bytes(0, B, S);
  void* keep = A(kb);
  const double tk = time_median(
      [&] {
        be.layer_forward_keep(0, w, g, x, y, keep, {});
        be.layer_backward_kept(0, w, g, x, dy, dx, dw, keep, {});
      },
      st, 2, 5);
  be.synchronize();
  // FLOPs: matmuls 2*T*P_matmul (fwd), attention causal; backward = 2x matmuls + 2.5x attention.
  const double mm = 2.0 * T * (double(c.hidden) * (c.q_dim() + 2 * c.kv_dim()) + double(c.q_dim()) * c.hidden +
                               3.0 * c.hidden * c.ffn);
  const double at = 4.0 * B * S * S * c.q_dim() / 2;
  const std::string name = preset + "_B" + std::to_string(B) + "_S" + std::to_string(S);
  emit("layer_fwd", name, tf, mm + at);
  emit("layer_fwdbwd", name, tb, 3 * mm + 3.5 * at);  // layer_backward = recompute forward + backward
  emit("layer_train_rerun", name, tf + tb, 3 * mm + 3.5 * at);  // a training step of the layer: fwd + bwd with re-run
  emit("layer_train_kept", name, tk, 3 * mm + 3.5 * at);         // ... with kept internals
  std::printf("           kept internals: %.2f GiB a layer; the layer's training step %.2f ms kept vs %.2f ms re-run "
              "(%.3fx)\n", double(kb) / (1 << 30), tk * 1e3, (tf + tb) * 1e3, (tf + tb) / tk);
  std::printf("           arena peak %.2f GiB (workspace for %ld tokens: %.2f GiB)\n",
              double(be.arena_peak()) / (1 << 30), long(T), double(be.layer_workspace_bytes(T)) / (1 << 30));
  for (auto& a : al) be.free(a);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lazytrain CUDA kernel benchmarks"};
  std::string json;
  bool gemm = true, attn = true, layer = true;
  std::string layer_preset = "qwen2.5-7b";
  int64_t layer_batch = 64, layer_seq = 1024;
  app.add_option("--json", json, "append JSON lines here");
  app.add_flag("!--no-gemm", gemm, "skip GEMMs");
  app.add_flag("!--no-attn", attn, "skip attention");
  app.add_flag("!--no-layer", layer, "skip the decoder layer");
  app.add_option("--layer-preset", layer_preset);
  app.add_option("--layer-batch", layer_batch);
  app.add_option("--layer-seq", layer_seq);
  CLI11_PARSE(app, argc, argv);
  if (!json.empty()) g_json.open(json, std::ios::app);
  cudaDeviceProp p{};
  BC(cudaGetDeviceProperties(&p, 0));
  std::printf("device: %s, %d SMs\n", p.name, p.multiProcessorCount);
  cudaStream_t st;
  BC(cudaStreamCreate(&st));
  if (gemm) bench_gemms(st);
  if (attn) {
    bench_attention(st, 16, 1024, 32, 8, 128);
    bench_attention(st, 16, 1024, 28, 4, 128);
    bench_attention(st, 16, 1024, 14, 2, 64);
    bench_attention(st, 8, 1024, 24, 4, 256);  // Qwen3.6-27B's full-attention layers
  }
  if (layer) bench_layer(layer_preset, layer_batch, layer_seq);
  return 0;
}
