// GPU half of `lazytrain profile` (src/plan/profile.h's hook): PCIe bandwidth with pinned memory
// (each way and both ways at once), the bf16 GEMM rate, the attention rate, and the forward/backward
// time of one decoder layer of each kind present (hybrid models: a full-attention and a Gated DeltaNet
// layer) at the requested shape, all measured with CUDA events on this machine.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <vector>

#include "backend/cuda/attention/attention_cudnn.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/gemm/gemm.h"
#include "backend/cuda/kernels.h"
#include "core/dtype.h"
#include "core/units.h"
#include "core/error.h"
#include "core/log.h"
#include "model/accounting.h"
#include "plan/cuda/gpu_profiler.h"
#include "plan/profile.h"

namespace lt::cuda {
namespace {

constexpr double kHeatUpSeconds = 1.0;  // GPU time before the layers are timed (heat_up)

double median_s(cudaStream_t st, int reps, const std::function<void()>& f) {
  f();  // warm-up
  LT_CUDA(cudaStreamSynchronize(st));
  cudaEvent_t a, b;
  LT_CUDA(cudaEventCreate(&a));
  LT_CUDA(cudaEventCreate(&b));
  std::vector<double> ts;
  for (int i = 0; i < reps; ++i) {
    LT_CUDA(cudaEventRecord(a, st));
    f();
    LT_CUDA(cudaEventRecord(b, st));
    LT_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    LT_CUDA(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms * 1e-3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

// Runs f back to back for at least `seconds` of GPU time: training keeps the GPU busy for the whole step, and under
// sustained load the H200 runs its layers slower than in a short burst after idling (measured: Qwen2.5-3B's forward
// 8.6 ms per layer in a step without optimizer waits against 7.7 ms profiled cold), so layers are timed warm.
void heat_up(cudaStream_t st, double seconds, const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
    for (int i = 0; i < 4; ++i) f();
    LT_CUDA(cudaStreamSynchronize(st));
  }
}

// Pseudo-random bf16 values in [-scale/2, scale/2) (zeros would run faster than real data).
void fill_random_bf16(void* dst, int64_t n, float scale, cudaStream_t st) {
  const int64_t chunk = int64_t(1) << 24;
  std::vector<float> h(size_t(std::min(n, chunk)));
  float* tmp = nullptr;
  LT_CUDA(cudaMalloc(&tmp, h.size() * 4));
  for (int64_t r = 0; r < n; r += chunk) {
    const int64_t m = std::min(chunk, n - r);
    for (int64_t i = 0; i < m; ++i)
      h[size_t(i)] = scale * (float((uint32_t(uint64_t(r + i) * 2654435761u) >> 8) & 0xffff) / 65536.f - 0.5f);
    LT_CUDA(cudaMemcpy(tmp, h.data(), size_t(m) * 4, cudaMemcpyHostToDevice));
    f32_to_bf16(tmp, m, static_cast<uint16_t*>(dst) + r, st);
    LT_CUDA(cudaStreamSynchronize(st));
  }
  cudaFree(tmp);
}

void measure_pcie(ResourceProfile& p, CudaBackend& be) {
  const int64_t n = int64_t(256) << 20;
  Allocation h1 = be.alloc(MemKind::Pinned, n, "profile.pinned"), h2 = be.alloc(MemKind::Pinned, n, "profile.pinned");
  Allocation d1 = be.alloc(MemKind::Device, n, "profile.dev"), d2 = be.alloc(MemKind::Device, n, "profile.dev");
  auto h2d = static_cast<cudaStream_t>(be.stream(Lane::H2D)), d2h = static_cast<cudaStream_t>(be.stream(Lane::D2H));
  p.h2d_bw = double(n) / median_s(h2d, 5, [&] { LT_CUDA(cudaMemcpyAsync(d1.ptr, h1.ptr, n, cudaMemcpyHostToDevice, h2d)); });
  p.d2h_bw = double(n) / median_s(d2h, 5, [&] { LT_CUDA(cudaMemcpyAsync(h2.ptr, d2.ptr, n, cudaMemcpyDeviceToHost, d2h)); });
  // Both ways at once: the D2H stream waits for nothing; time from before both to after both.
  cudaEvent_t go, done;
  LT_CUDA(cudaEventCreate(&go));
  LT_CUDA(cudaEventCreate(&done));
  p.both_bw = 2.0 * double(n) / median_s(h2d, 5, [&] {
                LT_CUDA(cudaEventRecord(go, h2d));
                LT_CUDA(cudaStreamWaitEvent(d2h, go, 0));
                LT_CUDA(cudaMemcpyAsync(d1.ptr, h1.ptr, n, cudaMemcpyHostToDevice, h2d));
                LT_CUDA(cudaMemcpyAsync(h2.ptr, d2.ptr, n, cudaMemcpyDeviceToHost, d2h));
                LT_CUDA(cudaEventRecord(done, d2h));
                LT_CUDA(cudaStreamWaitEvent(h2d, done, 0));
              });
  cudaEventDestroy(go);
  cudaEventDestroy(done);
  be.free(h1);
  be.free(h2);
  be.free(d1);
  be.free(d2);
}

void measure_gemm(ResourceProfile& p, CudaBackend& be) {
  const int64_t m = 8192;
  Allocation a = be.alloc(MemKind::Device, m * m * 2, "profile.gemm"), b = be.alloc(MemKind::Device, m * m * 2, "profile.gemm"),
             c = be.alloc(MemKind::Device, m * m * 2, "profile.gemm"), ws = be.alloc(MemKind::Device, Gemm::kWorkspaceBytes, "profile.gemm");
  auto st = static_cast<cudaStream_t>(be.stream(Lane::Compute));
  fill_random_bf16(a.ptr, m * m, 1.f, st);
  fill_random_bf16(b.ptr, m * m, 1.f, st);
  Gemm g(ws.ptr, Gemm::kWorkspaceBytes);
  GemmArgs ar;
  ar.trans_b = true, ar.m = m, ar.n = m, ar.k = m, ar.a = a.ptr, ar.b = b.ptr, ar.c = c.ptr;
  p.gemm_flops = 2.0 * m * m * m / median_s(st, 10, [&] { g.run(ar, st); });
  be.free(a);
  be.free(b);
  be.free(c);
  be.free(ws);
}

// Random weights for a layer unit: matrices small, every RMSNorm scale 1 ((1 + w) norms: w = 0).
void fill_layer_weights(const ModelConfig& c, const UnitLayout& lay, void* w, cudaStream_t st) {
  fill_random_bf16(w, lay.numel, 0.04f, st);
  std::vector<uint16_t> v;
  for (auto& prm : lay.params) {
    if (prm.suffix.find("norm") == std::string::npos) continue;
    const bool plus_one = c.norm_plus_one && prm.suffix != "linear_attn.norm.weight";  // the gated norm is plain
    v.assign(size_t(prm.numel), lt::f32_to_bf16(plus_one ? 0.f : 1.f));
    LT_CUDA(cudaMemcpy(static_cast<uint16_t*>(w) + prm.offset, v.data(), v.size() * 2, cudaMemcpyHostToDevice));
  }
}

// Forward and backward of one layer (the first of kind k) at batch x seq.
void measure_layer_kind(ResourceProfile& p, CudaBackend& be, const ModelConfig& c, LayerKind k, int64_t batch,
                        int64_t seq) {
  int64_t layer = 0;
  while (c.kind(layer) != k) ++layer;
  const UnitLayout& lay = be.layout().layer(layer);
  const int64_t T = batch * seq;
  auto st = static_cast<cudaStream_t>(be.stream(Lane::Compute));
  Allocation w = be.alloc(MemKind::Device, lay.numel * 2, "profile.layer"), dw = be.alloc(MemKind::Device, lay.numel * 4, "profile.layer");
  Allocation x = be.alloc(MemKind::Device, T * c.hidden * 2, "profile.layer"), y = be.alloc(MemKind::Device, T * c.hidden * 2, "profile.layer");
  Allocation dx = be.alloc(MemKind::Device, T * c.hidden * 2, "profile.layer");
  fill_layer_weights(c, lay, w.ptr, st);
  fill_random_bf16(x.ptr, T * c.hidden, 2.f, st);
  be.fill_zero(Lane::Compute, dw.ptr, lay.numel * 4, {});
  DevGeometry g{batch, seq, nullptr, nullptr};
  heat_up(st, kHeatUpSeconds, [&] { be.layer_backward(layer, w.ptr, g, x.ptr, y.ptr, dx.ptr, dw.ptr, {}); });
  const double tf = median_s(st, 3, [&] { be.layer_forward(layer, w.ptr, g, x.ptr, y.ptr, {}); });
  const double tb = median_s(st, 3, [&] { be.layer_backward(layer, w.ptr, g, x.ptr, y.ptr, dx.ptr, dw.ptr, {}); });
  // Kept internals: the forward that keeps them and the backward that reads them, as a pair (the kept backward
  // consumes its buffer), less the forward.
  const int64_t kb = be.layer_keep_bytes(layer, batch, seq);
  Allocation keep = be.alloc(MemKind::Device, kb, "profile.keep");
  const double tk = median_s(st, 3, [&] {
    be.layer_forward_keep(layer, w.ptr, g, x.ptr, y.ptr, keep.ptr, {});
    be.layer_backward_kept(layer, w.ptr, g, x.ptr, y.ptr, dx.ptr, dw.ptr, keep.ptr, {});
  });
  be.synchronize();
  // layer_backward re-runs the forward internals first
  LayerTiming t = layer_timing_for(c, k, batch, seq, tf, std::max(0.0, tb - tf));
  t.bwd_kept_s = std::max(1e-9, tk - tf);
  t.keep_bytes = kb;
  p.layer_timings.push_back(t);
  log_info("profile: {} layer fwd {:.3f} ms, bwd {:.3f} ms, bwd with kept internals {:.3f} ms ({} kept; {} x {})",
           layer_kind_short_name(k), tf * 1e3, std::max(0.0, tb - tf) * 1e3, t.bwd_kept_s * 1e3,
           format_bytes(double(kb)), batch, seq);
  for (Allocation* a : {&w, &dw, &x, &y, &dx, &keep}) be.free(*a);
}

// Attention alone at this shape (fwd + bwd), FLOPs as the model accounting counts them.
void measure_attention(ResourceProfile& p, CudaBackend& be, const ModelConfig& c, int64_t batch, int64_t seq) {
  const int64_t T = batch * seq, Q = c.q_dim(), KV = c.kv_dim();
  const AttnDims d{batch, seq, c.heads, c.kv_heads, c.head_dim, float(1.0 / std::sqrt(double(c.head_dim)))};
  auto st = static_cast<cudaStream_t>(be.stream(Lane::Compute));
  auto A = [&](int64_t bytes) { return be.alloc(MemKind::Device, bytes, "profile.attn"); };
  Allocation q = A(T * Q * 2), k = A(T * KV * 2), v = A(T * KV * 2), o = A(T * Q * 2), dO = A(T * Q * 2);
  Allocation dq = A(T * Q * 2), dk = A(T * KV * 2), dv = A(T * KV * 2), lse = A(T * c.heads * 4);
  const bool cudnn = cudnn_attention_usable(d);  // the path the layers take (mixer_attention.cpp)
  // Our kernels' fp32 dQ accumulator, or cuDNN's backward workspace.
  Allocation acc = A(std::max(T * Q * 4, cudnn ? int64_t(cudnn_attention_bwd_workspace(d)) : 0));
  Allocation dl = A(T * c.heads * 4), dkv = A(2 * T * KV * 4 + 256);
  fill_random_bf16(q.ptr, T * Q, 2.f, st);
  fill_random_bf16(k.ptr, T * KV, 2.f, st);
  fill_random_bf16(v.ptr, T * KV, 2.f, st);
  fill_random_bf16(dO.ptr, T * Q, 2.f, st);
  const double ta = median_s(st, 3, [&] {
    auto* stats = static_cast<float*>(lse.ptr);
    if (cudnn) {
      cudnn_attention_fwd(d, nullptr, q.ptr, k.ptr, v.ptr, o.ptr, stats, st);
      cudnn_attention_bwd(d, nullptr, q.ptr, k.ptr, v.ptr, o.ptr, stats, dO.ptr, dq.ptr, dk.ptr, dv.ptr, acc.ptr,
                          size_t(acc.bytes), st);
      return;
    }
    attention_fwd(d, q.ptr, k.ptr, v.ptr, nullptr, o.ptr, stats, st);
    attention_bwd(d, q.ptr, k.ptr, v.ptr, nullptr, o.ptr, stats, dO.ptr, dq.ptr, dk.ptr, dv.ptr,
                  static_cast<float*>(acc.ptr), static_cast<float*>(dl.ptr), static_cast<float*>(dkv.ptr), st);
  });
  log_info("profile: attention {} fwd+bwd {:.3f} ms ({} x {})", cudnn ? cudnn_attention_describe() : "own kernels",
           ta * 1e3, batch, seq);
  p.attn_flops = 3.5 * (4.0 * batch * seq * seq * Q / 2) / ta;
  for (Allocation* a : {&q, &k, &v, &o, &dO, &dq, &dk, &dv, &lse, &acc, &dl, &dkv}) be.free(*a);
}

// The head's pass with its LM weight gradient by vocabulary slices (StatePlacement::head_grad_slices), as the executor
// runs it (exec/head_grads.cpp): the pass without that gradient, then per slice its logits again, its gradient and its
// addition into a bf16 gradient (`held`, vocab x hidden bf16).
double time_sliced_head(CudaBackend& be, const ModelConfig& c, cudaStream_t st, const DevGeometry& g, const void* hw,
                        const void* lm, const int32_t* tg, const void* x, void* dx, void* held, double* acc) {
  const int64_t T = g.tokens(), H = c.hidden, V = c.vocab, S = head_grad_slice_rows(c);
  auto A = [&](int64_t bytes) { return be.alloc(MemKind::Device, bytes, "profile.head"); };
  Allocation lse = A(T * 4), dn = A(H * 4), slice = A(S * H * 4);
  be.fill_zero(Lane::Compute, held, V * H * 2, {});
  be.fill_zero(Lane::Compute, dn.ptr, H * 4, {});
  const float scale = 1.f / float(T);
  const double t = median_s(st, 3, [&] {
    be.head_loss_lse(hw, lm, tg, g, x, scale, dx, dn.ptr, static_cast<float*>(lse.ptr), acc, {});
    for (int64_t v0 = 0; v0 < V; v0 += S) {
      const int64_t nv = std::min(S, V - v0);
      be.fill_zero(Lane::Compute, slice.ptr, nv * H * 4, {});
      be.head_lm_grad_slice(hw, lm, tg, g, x, static_cast<const float*>(lse.ptr), scale, v0, nv, slice.ptr, {});
      be.grad_add(static_cast<uint16_t*>(held) + v0 * H, DType::BF16, slice.ptr, nv * H, nullptr, {});
    }
  });
  be.synchronize();
  for (Allocation* a : {&lse, &dn, &slice}) be.free(*a);
  return t;
}

// The head (final norm, LM head, cross-entropy; forward and backward) at batch x seq rows: the planner's head time
// (its GEMMs at the GEMM rate undercount the per-chunk logits and fp32 LM-head gradient traffic by ~25 %).
void measure_head(ResourceProfile& p, CudaBackend& be, const ModelConfig& c, int64_t batch, int64_t seq) {
  const int64_t T = batch * seq, H = c.hidden, V = c.vocab;
  const UnitLayout& hl = be.layout().head();
  auto st = static_cast<cudaStream_t>(be.stream(Lane::Compute));
  auto A = [&](int64_t bytes) { return be.alloc(MemKind::Device, bytes, "profile.head"); };
  Allocation hw = A(hl.numel * 2), lm = A(V * H * 2), x = A(T * H * 2), dx = A(T * H * 2), dhw = A(hl.numel * 4);
  Allocation dlm = A(V * H * 4), tg = A(T * 4), acc = A(16);
  fill_random_bf16(hw.ptr, hl.numel, 0.02f, st);
  fill_random_bf16(lm.ptr, V * H, 0.02f, st);
  fill_random_bf16(x.ptr, T * H, 1.f, st);
  std::vector<int32_t> t(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) t[size_t(i)] = int32_t((i * 7919) % V);
  LT_CUDA(cudaMemcpy(tg.ptr, t.data(), size_t(T) * 4, cudaMemcpyHostToDevice));
  be.fill_zero(Lane::Compute, dhw.ptr, hl.numel * 4, {});
  be.fill_zero(Lane::Compute, dlm.ptr, V * H * 4, {});
  be.fill_zero(Lane::Compute, acc.ptr, 16, {});
  const DevGeometry g{batch, seq, nullptr, nullptr};
  const double th = median_s(st, 3, [&] {
    be.head_loss(hw.ptr, lm.ptr, static_cast<const int32_t*>(tg.ptr), g, x.ptr, 1.f / float(T), dx.ptr, dhw.ptr,
                 dlm.ptr, static_cast<double*>(acc.ptr), {});
  });
  be.synchronize();
  p.head = {H, V, T, th};
  log_info("profile: head (norm, LM head, loss; fwd + bwd) {:.3f} ms ({} x {})", th * 1e3, batch, seq);
  if (!c.tied && be.has_sliced_head_grad()) {  // the fp32 gradient's buffer holds the bf16 one
    p.head.sliced_seconds = time_sliced_head(be, c, st, g, hw.ptr, lm.ptr, static_cast<const int32_t*>(tg.ptr), x.ptr,
                                             dx.ptr, dlm.ptr, static_cast<double*>(acc.ptr));
    log_info("profile: head with its LM weight gradient by vocabulary slices {:.3f} ms", p.head.sliced_seconds * 1e3);
  }
  for (Allocation* a : {&hw, &lm, &x, &dx, &dhw, &dlm, &tg, &acc}) be.free(*a);
}

// One layer of each kind present (hybrid models: both), and the attention rate.
void measure_layers(ResourceProfile& p, CudaBackend& be, const ModelConfig& c, int64_t batch, int64_t seq) {
  for (int k = 0; k < kNumLayerKinds; ++k)
    if (c.count(LayerKind(k)) > 0) measure_layer_kind(p, be, c, LayerKind(k), batch, seq);
  if (c.count(LayerKind::Attention) > 0) measure_attention(p, be, c, batch, seq);
  measure_head(p, be, c, batch, seq);
}

// The sample counts below mb at which the workspace is recorded for the planner (which interpolates linearly
// between them): the powers of two, and the two whole counts either side of the head's chunk rows, where its logits
// stop growing with the rows (the bend a line between powers of two would cut under, for a seq that does not divide
// the chunk rows).
std::vector<int64_t> workspace_sample_counts(int64_t mb, int64_t seq, int64_t head_rows) {
  std::vector<int64_t> n;
  for (int64_t k = 1; k < mb; k *= 2) n.push_back(k);
  for (int64_t k : {head_rows / seq, (head_rows + seq - 1) / seq})
    if (k >= 1 && k < mb) n.push_back(k);
  std::sort(n.begin(), n.end());
  n.erase(std::unique(n.begin(), n.end()), n.end());
  return n;
}

// The layers are measured at the batch, or at the largest halving of it that one layer pass on this GPU holds
// (half the free memory) within kMaxProfileTokens: a plan at a larger batch runs its layers in chunks of samples
// (plan.chunk), and the planner takes per-sample times from the timings (plan/profile.h layer_times). Without
// the cap, `per_device_train_batch_size` at the plan's largest batch (Qwen3.5-9B: 1,067 at an 80 GiB cap) asked
// 369 GiB for the measurement's workspace.
constexpr int64_t kMaxProfileTokens = int64_t(128) << 10;

void profile_gpu(ResourceProfile& p, const ModelConfig& c, int64_t batch, int64_t seq) {
  cudaFree(nullptr);
  size_t free_b = 0, total_b = 0;
  LT_CUDA(cudaMemGetInfo(&free_b, &total_b));
  CudaBackendOptions o;
  int64_t mb = batch;  // the samples the layers are measured at
  // Enough for the layer at this shape plus the copy and GEMM buffers; never more than is free.
  {
    CudaBackendOptions probe;
    probe.gpu_mem_cap = std::min<int64_t>(int64_t(free_b), int64_t(2) << 30);
    CudaBackend tmp(c, probe);
    auto need = [&](int64_t b) {
      int64_t keep = 0;  // the kept-internals pair (measure_layer_kind)
      for (int64_t j = 0; j < c.layers; ++j) keep = std::max(keep, tmp.layer_keep_bytes(j, b, seq));
      const int64_t head = c.vocab * c.hidden * 6 + tmp.layout().head().numel * 6;  // measure_head's weights, gradients
      return tmp.layer_workspace_bytes(b * seq, seq) + std::max(keep + tmp.layout().max_layer_numel() * 6, head) +
             4 * b * seq * c.hidden * 2 + (int64_t(3) << 30);
    };
    while (mb > 1 && (mb * seq > kMaxProfileTokens || need(mb) > int64_t(free_b) / 2)) mb = (mb + 1) / 2;
    if (mb < batch)
      log_info("profile: layers measured at {} of the {} samples (the plan runs them in chunks), and at 1, 2, 4, ...",
               mb, batch);
    const int64_t ws = tmp.layer_workspace_bytes(mb * seq, seq);
    o.gpu_mem_cap = std::min<int64_t>(int64_t(free_b) - (int64_t(256) << 20), need(mb) + o.margin);
    // What the planner must know of this backend: its one workspace buffer (32.1 GiB at the Qwen3.6-27B
    // shape, batch 72, where a plan from the model's per-kind estimate ran 4.4 GiB over the arena) and
    // the memory outside its arena (the context already taken, the margin kept for cuBLAS and modules).
    p.workspace_bytes = ws;
    p.workspace_tokens = mb * seq;
    p.workspace_points.clear();
    for (int64_t n : workspace_sample_counts(mb, seq, tmp.head_chunk_rows()))
      p.workspace_points.emplace_back(n * seq, tmp.layer_workspace_bytes(n * seq, seq));
    p.hbm_reserve = std::max<int64_t>(p.hbm_reserve, int64_t(total_b - free_b) + o.margin);
  }
  CudaBackend be(c, o);
  // The workspace of every measurement (the layers at mb and at 1 sample, the head at mb) first, and held: grown by
  // the head's call after the head's buffers were allocated, it found the arena's free bytes in two pieces, each
  // smaller than the head's workspace (Qwen3.5-9B at batch 8: 5.82 GiB asked, 8.91 GiB free, largest 4.47 GiB).
  be.hold_workspace(std::max(be.layer_workspace_bytes(mb * seq, seq), be.layer_workspace_bytes(seq, seq)));
  log_info("profile: GPU {} ({} total)", be.name(), total_b);
  if (p.hbm_bytes <= 0) p.hbm_bytes = int64_t(total_b);
  measure_pcie(p, be);
  measure_gemm(p, be);
  measure_layers(p, be, c, mb, seq);
  // Chunked plans: the layers at the powers of two below mb as well (1, 2, 4, ... samples a pass), where the GEMMs
  // run below their large-shape rate; the planner interpolates a chunk's per-sample time between the nearest two
  // (plan/profile.h layer_times, in log(samples)). With 1 and 36 samples only, every chunk between was that guess
  // (a Gated DeltaNet layer of the Qwen3.6-27B shape on an H100: 5.58 ms a sample at 1, 4.52 at 36).
  for (int64_t n = 1; n < mb; n *= 2)
    for (int k = 0; k < kNumLayerKinds; ++k)
      if (c.count(LayerKind(k)) > 0) measure_layer_kind(p, be, c, LayerKind(k), n, seq);
  p.gpu_measured = true;
}

}  // namespace

void install_gpu_profiler() { lt::register_gpu_profiler(&profile_gpu); }

}  // namespace lt::cuda
