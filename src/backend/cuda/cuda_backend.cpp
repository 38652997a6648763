#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <iterator>

#include "backend/cpu/ops.h"
#include "backend/cuda/attention/attention_cudnn.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/device_arena.h"
#include "backend/cuda/gemm/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/layer/layer.h"
#include "core/error.h"
#include "core/timer.h"
#include "core/units.h"

namespace lt {

namespace {
struct CudaEvent final : EventImpl {
  cudaEvent_t e = nullptr;
  CudaEvent() { LT_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); }
  ~CudaEvent() override {
    if (e) cudaEventDestroy(e);
  }
};
struct PendingSpan {
  Lane lane;
  OpLabel label;
  int64_t bytes;
  cudaEvent_t e0, e1;
};
cuda::Geo geo(const DevGeometry& g) { return {g.batch, g.seq, g.positions, g.segments, g.runs, g.longest_run}; }
}  // namespace

struct CudaBackend::Impl {
  CudaBackendOptions opt;
  cuda::KernelOptions kernels;
  cudaDeviceProp prop{};
  std::unique_ptr<cuda::DeviceArena> arena;
  cudaStream_t streams[kNumLanes] = {};
  void* gemm_ws = nullptr;
  std::unique_ptr<cuda::Gemm> gemm;
  float* inv_freq = nullptr;
  double* sumsq_partial = nullptr;
  std::unique_ptr<cuda::LayerEngine> eng;
  void* ws = nullptr;
  int64_t ws_bytes = 0;
  bool ws_held = false;  // hold_workspace: ops may not grow it
  int* err_host = nullptr;  // mapped pinned flag written by kernels (bad ids / targets)
  int* err_dev = nullptr;
  int64_t pinned_total = 0;
  bool timing = false;
  cudaEvent_t base_ev = nullptr;
  double base_t = 0;
  std::vector<PendingSpan> spans;
  std::string error;  // first error of enqueued work, reported by check()
};

CudaBackend::CudaBackend(const ModelConfig& c, CudaBackendOptions o) : Backend(c), impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opt = o;
  m.kernels = o.kernels ? *o.kernels : cuda::kernel_options();
  cuda::set_kernel_options(m.kernels);  // the kernels' launch functions read it there
  cuda::select_device(o.device, "CUDA backend");
  LT_CUDA(cudaGetDeviceProperties(&m.prop, o.device));
  LT_CUDA(cudaFree(nullptr));  // create the context before measuring free memory
  size_t free_b = 0, total_b = 0;
  LT_CUDA(cudaMemGetInfo(&free_b, &total_b));
  int64_t arena = 0;
  if (o.gpu_mem_cap > 0) {
    LT_CHECK(o.gpu_mem_cap > o.margin + (int64_t(64) << 20),
             "--gpu-mem {} is too small: the backend keeps {} outside its arena", format_bytes(double(o.gpu_mem_cap)),
             format_bytes(double(o.margin)));
    arena = o.gpu_mem_cap - o.margin;
    LT_CHECK(arena <= int64_t(free_b),
             "--gpu-mem {}: the GPU has only {} free (of {}); lower --gpu-mem", format_bytes(double(o.gpu_mem_cap)),
             format_bytes(double(free_b)), format_bytes(double(total_b)));
  } else {
    arena = int64_t(free_b) - o.margin;
  }
  m.arena = std::make_unique<cuda::DeviceArena>(arena);
  mem_.set_budget(MemKind::Device, m.arena->size());
  mem_.set_budget(MemKind::Pinned, o.pinned_budget);
  for (auto& s : m.streams) LT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // Backend-internal device memory, counted against the device budget like everything else.
  auto internal = [&](int64_t bytes, const char* tag) {
    mem_.reserve(MemKind::Device, bytes, tag);
    return m.arena->allocate(bytes, tag);
  };
  m.gemm_ws = internal(int64_t(cuda::Gemm::kWorkspaceBytes), "cublas.workspace");
  m.gemm = std::make_unique<cuda::Gemm>(m.gemm_ws, cuda::Gemm::kWorkspaceBytes);
  const std::vector<float> inv = cpu::rope_inv_freq(c);
  m.inv_freq = static_cast<float*>(internal(int64_t(inv.size()) * 4, "rope.inv_freq"));
  LT_CUDA(cudaMemcpy(m.inv_freq, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
  m.sumsq_partial = static_cast<double*>(internal(cuda::kSumsqBlocks * 8, "reductions"));
  LT_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&m.err_host), sizeof(int), cudaHostAllocMapped));
  *m.err_host = 0;
  LT_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&m.err_dev), m.err_host, 0));
  m.eng = std::make_unique<cuda::LayerEngine>(c, *m.gemm, m.inv_freq, m.kernels);
}

CudaBackend::~CudaBackend() {
  Impl& m = *impl_;
  for (auto& s : m.streams)
    if (s) cudaStreamSynchronize(s);
  for (auto& p : m.spans) {
    cudaEventDestroy(p.e0);
    cudaEventDestroy(p.e1);
  }
  if (m.base_ev) cudaEventDestroy(m.base_ev);
  m.eng.reset();
  m.gemm.reset();
  for (auto& s : m.streams)
    if (s) cudaStreamDestroy(s);
  if (m.err_host) cudaFreeHost(m.err_host);
  m.arena.reset();  // frees every device allocation at once
}

std::string CudaBackend::name() const {
  return "cuda:" + std::to_string(impl_->opt.device) + " (" + impl_->prop.name + ")";
}

std::string CudaBackend::describe_kernels() const {
  return impl_->kernels.describe() + (cuda::cudnn_attention_built() ? "" : " (built without cuDNN: own attention)");
}
const cuda::KernelOptions& CudaBackend::kernel_options() const { return impl_->kernels; }

int64_t CudaBackend::arena_bytes() const { return impl_->arena->size(); }
int64_t CudaBackend::arena_peak() const { return impl_->arena->peak(); }
void* CudaBackend::stream(Lane lane) const { return impl_->streams[int(lane)]; }
int64_t CudaBackend::head_chunk_rows() const { return impl_->eng->head_chunk_rows(); }
void CudaBackend::set_head_chunk_rows(int64_t rows) { impl_->eng->set_head_chunk_rows(std::max<int64_t>(rows, 1)); }
void CudaBackend::set_mlp_pass_bound(int64_t rows) { impl_->eng->set_mlp_pass_bound(std::max<int64_t>(rows, 0)); }

// ------------------------------------------------------------------------------------------- memory
Allocation CudaBackend::alloc(MemKind k, int64_t bytes, const std::string& tag) {
  LT_CHECK(bytes > 0, "cuda backend: allocation of {} bytes for '{}' (expected > 0)", bytes, tag);
  mem_.reserve(k, bytes, tag);
  Allocation a;
  a.bytes = bytes;
  a.kind = k;
  a.tag = tag;
  try {
    if (k == MemKind::Device) {
      a.ptr = impl_->arena->allocate(bytes, tag.c_str());
    } else {
      a.ptr = cuda::pinned_alloc(bytes, impl_->pinned_total);
      impl_->pinned_total += bytes;
    }
  } catch (...) {
    mem_.release(k, bytes, tag);
    throw;
  }
  return a;
}

void CudaBackend::free(Allocation& a) {
  if (!a.ptr) return;
  if (a.kind == MemKind::Device) {
    impl_->arena->release(a.ptr);
  } else {
    cuda::pinned_free(a.ptr, a.bytes);
    impl_->pinned_total -= a.bytes;
  }
  mem_.release(a.kind, a.bytes, a.tag);
  a = {};
}

int64_t CudaBackend::layer_workspace_bytes(int64_t tokens, int64_t seq) const {
  const auto& e = *impl_->eng;
  const bool split = seq > 0 && tokens % seq == 0;
  const int64_t layer = split ? e.layer_workspace_bytes(tokens / seq, seq) : e.layer_workspace_bytes(tokens);
  return std::max({layer, e.head_workspace_bytes(tokens), e.embed_workspace_bytes(tokens)});
}

namespace {
// Frees the workspace once the work already enqueued, which may still read it, is done. Returns the wait's
// error (an error of that work) for the caller to throw, or to leave to check().
cudaError_t free_ws(CudaBackend::Impl& m, MemoryTracker& mem) {
  if (!m.ws) return cudaSuccess;
  const cudaError_t e = cudaStreamSynchronize(m.streams[int(Lane::Compute)]);
  m.arena->release(m.ws);
  mem.release(MemKind::Device, m.ws_bytes, "workspace");
  m.ws = nullptr;
  m.ws_bytes = 0;
  return e;
}

// A new workspace of `bytes` in place of the old one, at the arena's high end (ArenaAllocator::End::High), away from
// the long-lived buffers.
void take_ws(CudaBackend::Impl& m, MemoryTracker& mem, int64_t bytes) {
  LT_CUDA(free_ws(m, mem));
  mem.reserve(MemKind::Device, bytes, "workspace");
  try {
    m.ws = m.arena->allocate(bytes, "workspace", cuda::DeviceArena::End::High);
  } catch (...) {
    mem.release(MemKind::Device, bytes, "workspace");
    throw;
  }
  m.ws_bytes = bytes;
}

// At least `bytes` of workspace for `op` (label l, on `rows` rows); grows it unless a run holds it.
void ensure_ws(CudaBackend::Impl& m, MemoryTracker& mem, int64_t bytes, const char* op, const OpLabel& l,
               int64_t rows) {
  if (bytes <= m.ws_bytes) return;
  if (m.ws_held) fail_workspace_held(op, l, rows, bytes, m.ws_bytes);
  take_ws(m, mem, bytes);
}
}  // namespace

void CudaBackend::prepare_geometry(const DevGeometry& g) { impl_->eng->prepare(geo(g)); }

void CudaBackend::reserve_workspace(int64_t tokens, int64_t seq) {
  ensure_ws(*impl_, mem_, layer_workspace_bytes(tokens, seq), "reserve_workspace", OpLabel{}, tokens);
}

int64_t CudaBackend::embed_workspace_bytes(int64_t tokens) const { return impl_->eng->embed_workspace_bytes(tokens); }

void CudaBackend::hold_workspace(int64_t bytes) {
  Impl& m = *impl_;
  m.ws_held = false;
  if (bytes > 0) take_ws(m, mem_, bytes);
  else LT_CUDA(free_ws(m, mem_));
  m.ws_held = true;
}

void CudaBackend::release_workspace() {
  impl_->ws_held = false;
  free_ws(*impl_, mem_);  // no throw (an executor releases it on destruction): check() reports such an error
}

// ------------------------------------------------------------------------------------ lanes, events
Event CudaBackend::record(Lane lane) {
  auto ev = std::make_shared<CudaEvent>();
  LT_CUDA(cudaEventRecord(ev->e, impl_->streams[int(lane)]));
  return ev;
}

void CudaBackend::wait(Lane lane, const Event& ev) {
  if (!ev) return;
  auto* ce = dynamic_cast<CudaEvent*>(ev.get());
  LT_CHECK(ce, "cuda backend: wait on an event of another backend");
  LT_CUDA(cudaStreamWaitEvent(impl_->streams[int(lane)], ce->e, 0));
}

void CudaBackend::host_wait(const Event& ev) {
  if (ev) {
    auto* ce = dynamic_cast<CudaEvent*>(ev.get());
    LT_CHECK(ce, "cuda backend: host_wait on an event of another backend");
    LT_CUDA(cudaEventSynchronize(ce->e));
  }
  check();
}

bool CudaBackend::done(const Event& ev) {
  if (!ev) return true;
  auto* ce = dynamic_cast<CudaEvent*>(ev.get());
  LT_CHECK(ce, "cuda backend: done() on an event of another backend");
  const cudaError_t e = cudaEventQuery(ce->e);
  if (e == cudaErrorNotReady) return false;
  LT_CUDA(e);
  return true;
}

void CudaBackend::synchronize() {
  for (auto& s : impl_->streams) LT_CUDA(cudaStreamSynchronize(s));
  check();
}

void CudaBackend::check() {
  Impl& m = *impl_;
  const cudaError_t e = cudaPeekAtLastError();
  if (e != cudaSuccess && m.error.empty())
    m.error = fmt::format("CUDA error in enqueued work: {}: {}", cudaGetErrorName(e), cudaGetErrorString(e));
  if (m.error.empty() && *reinterpret_cast<volatile int*>(m.err_host) != 0) {
    const int code = *reinterpret_cast<volatile int*>(m.err_host);
    m.error = code == 1 ? fmt::format("embedding: a token id is outside [0, {}) (vocab_size)", cfg_.vocab)
                        : fmt::format("cross-entropy: a target is outside [0, {}) and is not -100", cfg_.vocab);
  }
  if (!m.error.empty()) throw Error(m.error);
}

void CudaBackend::clear_error() {
  impl_->error.clear();
  *impl_->err_host = 0;
  cudaGetLastError();
}

// ------------------------------------------------------------------------------------------- timing
void CudaBackend::set_timing(bool on) {
  Impl& m = *impl_;
  if (on && !m.timing) {
    if (!m.base_ev) LT_CUDA(cudaEventCreate(&m.base_ev));
    LT_CUDA(cudaEventRecord(m.base_ev, m.streams[0]));
    LT_CUDA(cudaEventSynchronize(m.base_ev));
    m.base_t = now_seconds();
  }
  m.timing = on;
}

std::vector<Span> CudaBackend::take_spans() {
  Impl& m = *impl_;
  std::vector<Span> out;
  out.reserve(m.spans.size());
  for (auto& p : m.spans) {
    float a = 0, b = 0;
    LT_CUDA(cudaEventSynchronize(p.e1));
    LT_CUDA(cudaEventElapsedTime(&a, m.base_ev, p.e0));
    LT_CUDA(cudaEventElapsedTime(&b, m.base_ev, p.e1));
    out.push_back(Span{p.lane, p.label, p.bytes, m.base_t + a * 1e-3, m.base_t + b * 1e-3});
    cudaEventDestroy(p.e0);
    cudaEventDestroy(p.e1);
  }
  m.spans.clear();
  return out;
}

namespace {
// Runs f (which enqueues on `lane`), bracketed by timing events when timing is on. Errors are kept
// and reported by the next check(), as the interface asks; after an error, ops are skipped.
template <typename F>
void enqueue(CudaBackend::Impl& m, Lane lane, OpLabel l, int64_t bytes, F&& f) {
  if (!m.error.empty()) return;
  cudaStream_t s = m.streams[int(lane)];
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  if (m.timing) {
    LT_CUDA(cudaEventCreate(&e0));
    LT_CUDA(cudaEventCreate(&e1));
    LT_CUDA(cudaEventRecord(e0, s));
  }
  try {
    f(s);
  } catch (const std::exception& ex) {
    m.error = ex.what();
  }
  if (m.timing) {
    LT_CUDA(cudaEventRecord(e1, s));
    m.spans.push_back(PendingSpan{lane, l, bytes, e0, e1});
  }
}
}  // namespace

void CudaBackend::copy(Lane lane, void* dst, const void* src, int64_t bytes, OpLabel l) {
  enqueue(*impl_, lane, l, bytes, [&](cudaStream_t s) {
    LT_CUDA(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDefault, s));
  });
}

void CudaBackend::fill_zero(Lane lane, void* dst, int64_t bytes, OpLabel l) {
  enqueue(*impl_, lane, l, 0, [&](cudaStream_t s) {
    LT_CUDA(cudaMemsetAsync(dst, 0, size_t(bytes), s));
  });
}

// ---------------------------------------------------------------------------------------------- ops
void CudaBackend::embed_forward(const void* emb, const int32_t* ids, int64_t T, void* x, OpLabel l) {
  Impl& m = *impl_;
  enqueue(m, Lane::Compute, l, 0, [&](cudaStream_t s) { m.eng->embed_forward(emb, ids, T, x, m.err_dev, s); });
}

void CudaBackend::embed_backward(const int32_t* ids, int64_t T, const void* dx, void* demb, OpLabel l) {
  Impl& m = *impl_;
  enqueue(m, Lane::Compute, l, 0, [&](cudaStream_t s) {
    ensure_ws(m, mem_, m.eng->embed_workspace_bytes(T), "embed_backward", l, T);
    m.eng->embed_backward(ids, T, dx, static_cast<float*>(demb), m.ws, m.ws_bytes, s);
  });
}

void CudaBackend::embed_backward_acc(const int32_t* ids, int64_t T, const void* dx, void* acc, DType acc_dtype,
                                     double* sumsq, OpLabel l) {
  LT_CHECK(acc_dtype == DType::F32 || acc_dtype == DType::BF16,
           "embed_backward_acc: accumulator dtype {} (expected F32 or BF16)", dtype_name(acc_dtype));
  Impl& m = *impl_;
  const int64_t n = cfg_.vocab * cfg_.hidden;
  enqueue(m, Lane::Compute, l, 0, [&](cudaStream_t s) {
    ensure_ws(m, mem_, m.eng->embed_workspace_bytes(T), "embed_backward_acc", l, T);
    if (acc_dtype == DType::F32) {
      cuda::embed_bwd(ids, T, cfg_.hidden, cfg_.vocab, dx, static_cast<float*>(acc), m.ws, m.ws_bytes, s);
      if (sumsq) cuda::sumsq_accum(static_cast<const float*>(acc), n, sumsq, m.sumsq_partial, s);
    } else {
      cuda::embed_bwd_acc_bf16(ids, T, cfg_.hidden, cfg_.vocab, dx, acc, m.ws, m.ws_bytes, s);
      if (sumsq) cuda::sumsq_accum_bf16(acc, n, sumsq, m.sumsq_partial, s);
    }
  });
}

void CudaBackend::layer_forward(int64_t layer, const void* w, const DevGeometry& g, const void* x, void* y,
                                OpLabel l) {
  layer_forward_keep(layer, w, g, x, y, nullptr, l);
}

void CudaBackend::layer_backward(int64_t layer, const void* w, const DevGeometry& g, const void* x, const void* dy,
                                 void* dx, void* dw, OpLabel l) {
  layer_backward_kept(layer, w, g, x, dy, dx, dw, nullptr, l);
}

int64_t CudaBackend::layer_keep_bytes(int64_t layer, int64_t batch, int64_t seq) const {
  LT_CHECK(layer >= 0 && layer < cfg_.layers, "layer_keep_bytes: layer {} outside [0, {})", layer, cfg_.layers);
  return impl_->eng->layer_keep_bytes(layout_.layer(layer), batch, seq);
}

void CudaBackend::layer_forward_keep(int64_t layer, const void* w, const DevGeometry& g, const void* x, void* y,
                                     void* keep, OpLabel l) {
  Impl& m = *impl_;
  enqueue(m, Lane::Compute, l, 0, [&](cudaStream_t s) {
    LT_CHECK(layer >= 0 && layer < cfg_.layers, "layer_forward: layer {} outside [0, {})", layer, cfg_.layers);
    ensure_ws(m, mem_, m.eng->layer_workspace_bytes(g.batch, g.seq), "layer_forward", l, g.tokens());
    m.eng->layer_forward(layout_.layer(layer), w, geo(g), x, y, m.ws, s, keep);
  });
}

void CudaBackend::layer_backward_kept(int64_t layer, const void* w, const DevGeometry& g, const void* x,
                                      const void* dy, void* dx, void* dw, void* keep, OpLabel l) {
  Impl& m = *impl_;
  enqueue(m, Lane::Compute, l, 0, [&](cudaStream_t s) {
    LT_CHECK(layer >= 0 && layer < cfg_.layers, "layer_backward: layer {} outside [0, {})", layer, cfg_.layers);
    ensure_ws(m, mem_, m.eng->layer_workspace_bytes(g.batch, g.seq), "layer_backward", l, g.tokens());
    m.eng->layer_backward(layout_.layer(layer), w, geo(g), x, dy, dx, static_cast<float*>(dw), m.ws, s, keep);
  });
}

// head_loss and head_loss_lse: LayerEngine::head_loss on the compute lane with the head's workspace.
void CudaBackend::enqueue_head(const char* op, const void* head_w, const void* lm_w, const int32_t* targets,
                               const DevGeometry& g, const void* x, float loss_scale, void* dx, float* d_norm_w,
                               float* d_lm_w, float* lse, double* acc, OpLabel l) {
  Impl& m = *impl_;
  enqueue(m, Lane::Compute, l, 0, [&](cudaStream_t s) {
    ensure_ws(m, mem_, m.eng->head_workspace_bytes(g.tokens()), op, l, g.tokens());
    m.eng->head_loss(layout_.head(), head_w, lm_w, targets, g.tokens(), x, loss_scale, dx, d_norm_w, d_lm_w, lse, acc,
                     m.err_dev, m.ws, s);
  });
}

void CudaBackend::head_loss(const void* head_w, const void* lm_w, const int32_t* targets, const DevGeometry& g,
                            const void* x, float loss_scale, void* dx, void* d_head_w, void* d_lm_w, double* acc,
                            OpLabel l) {
  float* d_norm_w = d_head_w ? static_cast<float*>(d_head_w) + layout_.head().find("norm.weight").offset : nullptr;
  enqueue_head("head_loss", head_w, lm_w, targets, g, x, loss_scale, dx, d_norm_w, static_cast<float*>(d_lm_w), nullptr,
               acc, l);
}

void CudaBackend::head_loss_lse(const void* head_w, const void* lm_w, const int32_t* targets, const DevGeometry& g,
                                const void* x, float loss_scale, void* dx, void* d_norm_w, float* lse, double* acc,
                                OpLabel l) {
  enqueue_head("head_loss_lse", head_w, lm_w, targets, g, x, loss_scale, dx, static_cast<float*>(d_norm_w), nullptr, lse,
               acc, l);
}

void CudaBackend::head_lm_grad_slice(const void* head_w, const void* lm_w, const int32_t* targets,
                                     const DevGeometry& g, const void* x, const float* lse, float loss_scale,
                                     int64_t v0, int64_t n_v, void* dw, OpLabel l) {
  Impl& m = *impl_;
  enqueue(m, Lane::Compute, l, 0, [&](cudaStream_t s) {
    ensure_ws(m, mem_, m.eng->head_workspace_bytes(g.tokens()), "head_lm_grad_slice", l, g.tokens());
    m.eng->head_lm_grad_slice(layout_.head(), head_w, lm_w, targets, g.tokens(), x, lse, loss_scale, v0, n_v,
                              static_cast<float*>(dw), m.ws, s);
  });
}

void CudaBackend::head_logits(const void* head_w, const void* lm_w, const void* x, const int64_t* rows,
                              int64_t n_rows, float* out, OpLabel l) {
  Impl& m = *impl_;
  enqueue(m, Lane::Compute, l, 0, [&](cudaStream_t s) {
    ensure_ws(m, mem_, 2 * ((n_rows * cfg_.hidden * 2 + 255) / 256 * 256), "head_logits", l, n_rows);
    m.eng->head_logits(layout_.head(), head_w, lm_w, x, rows, n_rows, out, m.ws, s);
  });
}

void CudaBackend::grad_sumsq(const void* grad, int64_t n, double* out, OpLabel l) {
  Impl& m = *impl_;
  enqueue(m, Lane::Compute, l, 0,
          [&](cudaStream_t s) { cuda::sumsq_accum(static_cast<const float*>(grad), n, out, m.sumsq_partial, s); });
}

void CudaBackend::grad_add(void* acc, DType acc_dtype, const void* grad, int64_t n, double* sumsq, OpLabel l) {
  LT_CHECK(acc_dtype == DType::F32 || acc_dtype == DType::BF16, "grad_add: accumulator dtype {} (expected F32 or BF16)",
           dtype_name(acc_dtype));
  Impl& m = *impl_;
  enqueue(m, Lane::Compute, l, 0, [&](cudaStream_t s) {
    const auto* g = static_cast<const float*>(grad);  // dtypes().grad is fp32
    if (acc_dtype == DType::F32) {
      cuda::add_f32(static_cast<float*>(acc), g, n, s);
      if (sumsq) cuda::sumsq_accum(static_cast<const float*>(acc), n, sumsq, m.sumsq_partial, s);
    } else {
      cuda::add_f32_to_bf16(acc, g, n, s);
      if (sumsq) cuda::sumsq_accum_bf16(acc, n, sumsq, m.sumsq_partial, s);
    }
  });
}

void CudaBackend::adamw_step(const AdamWStepScalars& s, float* p, bf16_t* hi, uint16_t* lo, const float* g, float* m,
                             float* v, int64_t n, OpLabel l) {
  LT_CHECK(p ? !hi && !lo : hi && lo, "adamw_step: the master is fp32 (p) or split (hi and lo), not both");
  const cuda::AdamWConsts c{s.decay, s.w1, s.beta2, s.w2, s.eps, s.bc2_sqrt, s.neg_step_size, s.grad_scale};
  enqueue(*impl_, Lane::Compute, l, 0, [&](cudaStream_t st) { cuda::adamw_step(c, p, hi, lo, g, m, v, n, st); });
}

namespace {
cuda::Q8MapConsts q8_map_consts(const Q8Map& q) {
  cuda::Q8MapConsts c;
  c.is_signed = q.is_signed;
  c.mag_bits = q.mag_bits;
  std::copy(std::begin(q.decode), std::end(q.decode), c.decode);
  std::copy(std::begin(q.top), std::end(q.top), c.top);
  std::copy(std::begin(q.inv_step), std::end(q.inv_step), c.inv_step);
  std::copy(std::begin(q.code_off), std::end(q.code_off), c.code_off);
  return c;
}
}  // namespace

void CudaBackend::adamw_step_q8(const AdamWStepScalars& s, const Q8Maps& maps, float* p, bf16_t* hi, uint16_t* lo,
                                const float* g, uint8_t* mq, uint8_t* vq, float* ms, float* vs, int64_t n, OpLabel l) {
  LT_CHECK(p ? !hi && !lo : hi && lo, "adamw_step_q8: the master is fp32 (p) or split (hi and lo), not both");
  const cuda::AdamWQ8Consts c{s.beta1,        s.w1,    s.beta2,         s.w2,        s.eps,
                              s.inv_bc2_sqrt, s.decay, s.neg_step_size, s.grad_scale};
  const cuda::Q8MapsConsts qc{q8_map_consts(maps.m), q8_map_consts(maps.v)};
  enqueue(*impl_, Lane::Compute, l, 0,
          [&](cudaStream_t st) { cuda::adamw_step_q8(c, qc, p, hi, lo, g, mq, vq, ms, vs, n, st); });
}

}  // namespace lt
