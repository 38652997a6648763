#include "infer/cuda/cuda_decoder.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <thread>

#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_util.h"
#include "infer/cuda/decode.h"
#include "infer/cuda/decode_mixer.h"
#include "backend/cuda/deltanet/deltanet.h"
#include "backend/cuda/device_arena.h"
#include "backend/cuda/gemm/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/layer/mixer.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/units.h"
#include "infer/decode_state.h"

namespace lt::cuda {

UnitSource fp32_units(const ModelLayout& layout, std::vector<const float*> units) {
  std::vector<int64_t> numel;
  for (const auto& u : layout.units) numel.push_back(u.numel);
  return [numel = std::move(numel), units = std::move(units)](int64_t u, uint16_t* dst) {
    const float* src = units[size_t(u)];
    const int64_t n = numel[size_t(u)];
    auto run = [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i) dst[i] = ::lt::f32_to_bf16(src[i]);
    };
    const int64_t threads = std::clamp<int64_t>(n / (int64_t(1) << 22), 1,
                                                std::max<int64_t>(1, int64_t(std::thread::hardware_concurrency())));
    if (threads == 1) return run(0, n);
    std::vector<std::thread> th;
    for (int64_t t = 0; t < threads; ++t) th.emplace_back(run, n * t / threads, n * (t + 1) / threads);
    for (auto& t : th) t.join();
  };
}

std::string decoder_unsupported(const ModelConfig& c) {
  if (c.count(LayerKind::GatedDeltaNet) == 0) return {};
  const auto& l = c.linear;
  GdnDims d;
  d.batch = d.seq = 1;
  d.Hk = l.k_heads, d.Hv = l.v_heads, d.Dk = l.k_head_dim, d.Dv = l.v_head_dim, d.K = l.conv_kernel;
  if (gdn_dims_supported(d)) return {};
  return fmt::format(
      "{}'s Gated DeltaNet shape (key heads {} x {}, value heads {} x {}, conv kernel {}) is not supported by the "
      "GPU kernels (head dims multiples of 8 up to 128, conv kernel 1..8, value heads a multiple of key heads)",
      c.name.empty() ? std::string(arch_hf_name(c.arch)) : c.name, l.k_heads, l.k_head_dim, l.v_heads, l.v_head_dim,
      l.conv_kernel);
}

struct CudaDecoder::Impl {
  ModelConfig c;
  ModelLayout lay;
  DecoderOptions opt;
  std::string name;
  cudaStream_t comp = nullptr, copy = nullptr;
  cudaEvent_t up_done[2] = {}, comp_done[2] = {};
  DeviceMemorySource mem;
  int64_t budget = 0;
  WeightsMode mode = WeightsMode::Resident;
  // Weights block: embedding, head, then every layer (resident) or two slots (streamed).
  char* wblock = nullptr;
  int64_t wblock_bytes = 0;
  const uint16_t* emb = nullptr;
  const uint16_t* head_w = nullptr;
  const uint16_t* lm_w = nullptr;
  std::vector<const uint16_t*> layer_dev;  // resident
  uint16_t* slot[2] = {};                  // streamed
  uint16_t* host_layers = nullptr;         // streamed: pinned bf16 layers
  int64_t host_layers_bytes = 0;
  bool layer0_ready = false;               // streamed: layer 0 is (being) uploaded into slot 0
  std::vector<int64_t> layer_off, layer_bytes;  // byte offsets in host_layers (streamed), sizes
  // Decoding states (per layer, its kind's: KV cache or conv + recurrent states) + workspace block.
  char* kblock = nullptr;
  int64_t kblock_bytes = 0;
  DecodeCapacity cap;
  DecodeWorkspace ws;
  char* wsb = nullptr;
  std::vector<char*> layer_state;
  std::unique_ptr<DecodeMixer> mixers[kNumLayerKinds];  // one per kind present
  char* staging = nullptr;    // pinned: the per-pass tables
  int32_t* out_host = nullptr;  // pinned: ids, then the error flag
  std::unique_ptr<Gemm> gemm;
  bool use_graphs = true;
  std::map<int64_t, cudaGraphExec_t> graphs;  // decode steps by row count (resident weights)
  DecodeCounters cnt;
  std::vector<std::vector<float>> captured;

  ~Impl() {
    if (comp) cudaStreamSynchronize(comp);
    if (copy) cudaStreamSynchronize(copy);
    clear_graphs();
    gemm.reset();
    dev_free(kblock);
    dev_free(wblock);
    if (host_layers) pinned_free(host_layers, host_layers_bytes);
    host_free(staging);
    host_free(out_host);
    for (int i = 0; i < 2; ++i) {
      if (up_done[i]) cudaEventDestroy(up_done[i]);
      if (comp_done[i]) cudaEventDestroy(comp_done[i]);
    }
    if (comp) cudaStreamDestroy(comp);
    if (copy) cudaStreamDestroy(copy);
  }

  template <typename T>
  T* at(int64_t off) const {
    return reinterpret_cast<T*>(wsb + off);
  }
  template <typename T>
  T* stage(int64_t off) const {
    return reinterpret_cast<T*>(staging + off);
  }
  bool streamed() const { return mode == WeightsMode::Streamed; }

  void* dev_alloc(int64_t bytes, const char* tag) { return mem.alloc(bytes, tag); }
  template <typename T>
  void dev_free(T*& p) {
    if (p) mem.release(p);
    p = nullptr;
  }
  template <typename T>
  static void host_free(T*& p) {  // cudaHostAlloc'd
    if (p) cudaFreeHost(p);
    p = nullptr;
  }

  void alloc_kv_workspace(const DecodeCapacity& cp);
  void upload_layer(int64_t l);
  DecodePass pass(int64_t T, int64_t seqs, bool prefill, int64_t max_len) const;
  void forward_layers(const DecodePass& p);
  void layer(int64_t l, const uint16_t* w, const DecodePass& p);
  void head(int64_t n, bool gather);
  void finish_pass(int64_t n);
  void enqueue_decode(int64_t n, int64_t max_len);
  void decode_step(int64_t n, int64_t max_len);
  void clear_graphs();
  void ensure_capacity(int64_t batch, int64_t seq);
};

void CudaDecoder::Impl::alloc_kv_workspace(const DecodeCapacity& cp) {
  if (comp) LT_CUDA(cudaStreamSynchronize(comp));  // nothing in flight uses the old buffers
  clear_graphs();  // they hold the old workspace's pointers and grid sizes
  gemm.reset();
  dev_free(kblock);
  host_free(staging);
  host_free(out_host);
  cap = cp;
  ws = decode_workspace(c, cap);
  const DecodeMemory m = decode_memory(c, lay, cap);
  kblock_bytes = m.kv_cache + ws.bytes;
  kblock = static_cast<char*>(dev_alloc(kblock_bytes, "decode.kv+workspace"));
  layer_state.clear();
  int64_t off = 0;
  for (int64_t l = 0; l < c.layers; ++l) {
    layer_state.push_back(kblock + off);
    off += decode_state_bytes(c, c.kind(l), cap);
  }
  LT_CHECK(off == m.kv_cache, "internal: decoding states {} != planned {}", off, m.kv_cache);
  wsb = kblock + m.kv_cache;
  LT_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&staging), size_t(ws.table_bytes), cudaHostAllocDefault));
  LT_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&out_host), size_t(cap.max_batch + 1) * 4, cudaHostAllocDefault));
  const std::vector<float> inv = cpu::rope_inv_freq(c);
  LT_CUDA(cudaMemcpy(at<float>(ws.inv_freq), inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
  LT_CUDA(cudaMemset(at<int>(ws.err), 0, 4));
  gemm = std::make_unique<Gemm>(at<void>(ws.gemm), size_t(kDecodeGemmWorkspace));
}

void CudaDecoder::Impl::ensure_capacity(int64_t batch, int64_t seq) {
  if (batch <= cap.max_batch && seq <= cap.max_seq) return;
  const DecodeCapacity cp = decode_capacity(std::max(batch, cap.max_batch), std::max(seq, cap.max_seq));
  const DecodeMemory m = decode_memory(c, lay, cp);
  const int64_t need = m.kv_cache + m.workspace, avail = budget - wblock_bytes;
  if (need > avail)
    fail_decode_does_not_fit(
        need, avail, fmt::format("for a KV cache of {} sequences x {} tokens and its workspace", cp.max_batch, cp.max_seq),
        fmt::format("{} left beside the {} weights", format_bytes(double(avail)), weights_mode_name(mode)),
        "use a smaller --batch-size or --max-new-tokens, or raise --gpu-mem");
  alloc_kv_workspace(cp);
}

void CudaDecoder::Impl::upload_layer(int64_t l) {
  const int s = int(l % 2);
  LT_CUDA(cudaStreamWaitEvent(copy, comp_done[s], 0));  // the slot's previous layer is done
  LT_CUDA(cudaMemcpyAsync(slot[s], reinterpret_cast<const char*>(host_layers) + layer_off[size_t(l)],
                          size_t(layer_bytes[size_t(l)]), cudaMemcpyHostToDevice, copy));
  LT_CUDA(cudaEventRecord(up_done[s], copy));
}

// The device tables of a pass of T rows over `seqs` sequences (the staging copy has filled them).
DecodePass CudaDecoder::Impl::pass(int64_t T, int64_t seqs, bool prefill, int64_t max_len) const {
  DecodePass p;
  p.rows = T;
  p.seqs = seqs;
  p.prefill = prefill;
  p.max_len = max_len;
  p.pos = at<int32_t>(ws.pos);
  p.seg = at<int32_t>(ws.seg);
  p.len = at<int32_t>(ws.len);
  p.slot = at<int32_t>(ws.slot);
  p.dst_row = at<int64_t>(ws.dst_row);
  p.row0 = at<int64_t>(ws.row0);
  p.last_rows = at<int64_t>(ws.last_rows);
  p.inv_freq = at<float>(ws.inv_freq);
  p.attn_partial = at<float>(ws.partial);
  return p;
}

// Streamed: layer l+1 is uploaded into the other slot while layer l computes; the copy into a slot
// waits for the compute of the layer that used it before. Layer 0 of the next pass is uploaded as soon
// as this pass's layers are done (it overlaps the head, the argmax and the host's bookkeeping).
void CudaDecoder::Impl::forward_layers(const DecodePass& p) {
  const int64_t L = c.layers;
  if (streamed() && !layer0_ready) upload_layer(0);
  layer0_ready = false;
  for (int64_t l = 0; l < L; ++l) {
    const uint16_t* w = nullptr;
    if (streamed()) {
      if (l + 1 < L) upload_layer(l + 1);  // overlaps this layer's compute
      LT_CUDA(cudaStreamWaitEvent(comp, up_done[l % 2], 0));
      w = slot[l % 2];
      cnt.bytes_uploaded += layer_bytes[size_t(l)];
    } else {
      w = layer_dev[size_t(l)];
    }
    layer(l, w, p);
    if (streamed()) LT_CUDA(cudaEventRecord(comp_done[l % 2], comp));
  }
  if (streamed()) {
    upload_layer(0);
    layer0_ready = true;
  }
}

// What every kind shares: x1 = x + mixer(RMSNorm(x)) (the mixer of the layer's kind, decode_mixer.h), then
// x = x1 + MLP(RMSNorm(x1)). The norms scale by (1 + w) when c.norm_plus_one.
void CudaDecoder::Impl::layer(int64_t l, const uint16_t* w, const DecodePass& p) {
  const UnitLayout& u = lay.layer(l);
  const int64_t T = p.rows, H = c.hidden, F = c.ffn;
  const float eps = float(c.rms_eps), noff = c.norm_plus_one ? 1.f : 0.f;
  void* x = at<void>(ws.x);
  void* x1 = at<void>(ws.x1);
  void* h = at<void>(ws.h);
  uint16_t* gu = at<uint16_t>(ws.gu);
  void* act = at<void>(ws.act);
  rmsnorm_fwd(x, wptr(w, u, "input_layernorm.weight"), T, H, eps, h, nullptr, comp, noff);
  const DecodeMixerCall mc{u, w, p, cap, layer_state[size_t(l)], at<void>(ws.mixer), *gemm, comp};
  mixers[int(c.kind(l))]->forward(mc, h, x, x1);  // x1 = x + mixer(h)
  rmsnorm_fwd(x1, wptr(w, u, "post_attention_layernorm.weight"), T, H, eps, h, nullptr, comp, noff);
  const uint16_t* wg = wptr(w, u, "mlp.gate_proj.weight");
  const uint16_t* wu = wptr(w, u, "mlp.up_proj.weight");
  if (wu == wg + F * H) {
    decode_linear(*gemm, comp, T, h, wg, nullptr, gu, 2 * F, H);
  } else {
    decode_linear(*gemm, comp, T, h, wg, nullptr, gu, F, H, 2 * F);
    decode_linear(*gemm, comp, T, h, wu, nullptr, gu + F, F, H, 2 * F);
  }
  swiglu_fwd(gu, T, F, act, comp);
  decode_linear(*gemm, comp, T, act, wptr(w, u, "mlp.down_proj.weight"), nullptr, x, H, F, 0, x1);  // x = x1 + act Wd^T
}

// Logits of n rows (the last row of each prompt when gather, else rows 0..n-1), their argmax, the ids
// and the error flag back to pinned host memory. Enqueues only (capturable into a CUDA graph).
void CudaDecoder::Impl::head(int64_t n, bool gather) {
  const int64_t H = c.hidden, V = c.vocab;
  const void* src = at<void>(ws.x);
  if (gather) {
    gather_rows(src, at<int64_t>(ws.last_rows), n, H, at<void>(ws.xr), comp);
    src = at<void>(ws.xr);
  }
  rmsnorm_fwd(src, head_w, n, H, float(c.rms_eps), at<void>(ws.hn), nullptr, comp, c.norm_plus_one ? 1.f : 0.f);
  GemmArgs a;
  a.trans_b = true;
  a.m = n, a.n = V, a.k = H;
  a.a = at<void>(ws.hn), a.b = lm_w, a.c = at<float>(ws.logits), a.c_f32 = true;
  gemm->run(a, comp);
  argmax_rows(at<float>(ws.logits), n, V, at<int32_t>(ws.out_ids), comp);
  LT_CUDA(cudaMemcpyAsync(out_host, at<int32_t>(ws.out_ids), size_t(n) * 4, cudaMemcpyDeviceToHost, comp));
  LT_CUDA(cudaMemcpyAsync(out_host + cap.max_batch, at<int32_t>(ws.err), 4, cudaMemcpyDeviceToHost, comp));
}

// Waits for the pass; the ids are in out_host[0..n).
void CudaDecoder::Impl::finish_pass(int64_t n) {
  LT_CUDA(cudaStreamSynchronize(comp));
  if (out_host[cap.max_batch] != 0) {  // clear the device flag so the decoder stays usable after the error
    LT_CUDA(cudaMemset(at<int>(ws.err), 0, 4));
    fail("generate: a token id is outside the model's vocabulary ({})", c.vocab);
  }
  if (opt.capture_logits) {
    std::vector<float> lg(size_t(n * c.vocab));
    LT_CUDA(cudaMemcpy(lg.data(), at<float>(ws.logits), lg.size() * 4, cudaMemcpyDeviceToHost));
    captured.push_back(std::move(lg));
  }
  cnt.passes++;
}

void CudaDecoder::Impl::enqueue_decode(int64_t n, int64_t max_len) {
  LT_CUDA(cudaMemcpyAsync(wsb, staging, size_t(ws.table_bytes), cudaMemcpyHostToDevice, comp));
  embed_fwd(emb, at<int32_t>(ws.ids), n, c.hidden, c.vocab, at<void>(ws.x), at<int>(ws.err), comp);
  forward_layers(pass(n, n, false, max_len));
  head(n, false);
}

void CudaDecoder::Impl::clear_graphs() {
  for (auto& [n, g] : graphs) cudaGraphExecDestroy(g);
  graphs.clear();
}

// A decode step of n rows. Resident weights: one CUDA graph per row count n, captured on first use and
// replayed (the step is ~14 launches per layer; replaying them as a graph removes the per-launch host
// cost). The graph's decode-attention grid covers the cache capacity (max_seq): the CTAs past a row's
// length exit at once, and the split size is fixed, so results are those of the eager path bit for bit.
void CudaDecoder::Impl::decode_step(int64_t n, int64_t max_len) {
  if (use_graphs && !streamed()) {
    auto it = graphs.find(n);
    if (it == graphs.end()) {
      cudaGraph_t g = nullptr;
      cudaGraphExec_t ex = nullptr;
      bool ok = false;
      try {
        LT_CUDA(cudaStreamBeginCapture(comp, cudaStreamCaptureModeThreadLocal));
        try {
          enqueue_decode(n, cap.max_seq);
        } catch (...) {
          cudaStreamEndCapture(comp, &g);
          throw;
        }
        LT_CUDA(cudaStreamEndCapture(comp, &g));
        LT_CUDA(cudaGraphInstantiate(&ex, g, 0));
        ok = true;
      } catch (const std::exception& e) {
        log_warn("CUDA decoder: capturing a decode step as a CUDA graph failed ({}); launching kernels one by one",
                 e.what());
      }
      if (g) cudaGraphDestroy(g);
      cudaGetLastError();
      if (!ok) {
        use_graphs = false;
        if (ex) cudaGraphExecDestroy(ex);
        enqueue_decode(n, max_len);
        return finish_pass(n);
      }
      it = graphs.emplace(n, ex).first;
      cnt.graphs++;
    }
    LT_CUDA(cudaGraphLaunch(it->second, comp));
  } else {
    enqueue_decode(n, max_len);
  }
  finish_pass(n);
}

CudaDecoder::CudaDecoder(const ModelConfig& c, const ModelLayout& layout, const UnitSource& src,
                         const DecoderOptions& o)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.c = c;
  m.lay = layout;
  m.opt = o;
  LT_CHECK(int64_t(layout.units.size()) == c.layers + 2, "CUDA decoder: expected {} units, got {}", c.layers + 2,
           layout.units.size());
  const std::string why = decoder_unsupported(c);
  LT_CHECK(why.empty(), "CUDA decoder: {}; decode on the CPU (--device cpu)", why);
  LT_CHECK(c.head_dim % 8 == 0 && c.head_dim <= 256 && c.hidden % 8 == 0 && c.ffn % 2 == 0 &&
               c.kv_heads > 0 && c.heads % c.kv_heads == 0 && (c.heads / c.kv_heads) * c.head_dim <= 4096,
           "CUDA decoder: unsupported shape (head_dim {} must be a multiple of 8 up to 256, hidden {} a multiple of "
           "8, heads {} a multiple of kv_heads {}, group x head_dim <= 4096)",
           c.head_dim, c.hidden, c.heads, c.kv_heads);
  select_device(o.device, "CUDA decoder");
  cudaDeviceProp prop{};
  LT_CUDA(cudaGetDeviceProperties(&prop, o.device));
  m.name = fmt::format("cuda:{} ({})", o.device, prop.name);
  LT_CUDA(cudaFree(nullptr));

  // Device memory: borrowed, or cudaMalloc within the cap.
  if (o.memory.alloc) {
    m.mem = o.memory;
    m.budget = o.memory.available;
  } else {
    size_t free_b = 0, total_b = 0;
    LT_CUDA(cudaMemGetInfo(&free_b, &total_b));
    int64_t cap = int64_t(free_b);
    if (o.gpu_mem_cap > 0) {
      LT_CHECK(o.gpu_mem_cap > o.margin, "--gpu-mem {} is too small: the decoder keeps {} outside its budget",
               format_bytes(double(o.gpu_mem_cap)), format_bytes(double(o.margin)));
      LT_CHECK(o.gpu_mem_cap - o.margin <= int64_t(free_b), "--gpu-mem {}: the GPU has only {} free (of {})",
               format_bytes(double(o.gpu_mem_cap)), format_bytes(double(free_b)), format_bytes(double(total_b)));
      cap = o.gpu_mem_cap;
    }
    m.budget = cap - o.margin;
    m.mem.alloc = [](int64_t bytes, const char* tag) -> void* {
      void* p = nullptr;
      const cudaError_t err = cudaMalloc(&p, size_t(bytes));
      if (err != cudaSuccess) {
        cudaGetLastError();
        fail("CUDA decoder: cudaMalloc of {} for {} failed: {}", format_bytes(double(bytes)), tag,
             cudaGetErrorString(err));
      }
      return p;
    };
    m.mem.release = [](void* p) { cudaFree(p); };
  }

  const DecodeCapacity cp = decode_capacity(std::max<int64_t>(o.max_batch, 1), std::max<int64_t>(o.max_seq, 1));
  const DecodeMemory dm = decode_memory(c, layout, cp);
  const WeightsChoice wc = choose_weights_mode(dm, m.budget, o.weights);
  m.mode = wc.mode;

  LT_CUDA(cudaStreamCreateWithFlags(&m.comp, cudaStreamNonBlocking));
  LT_CUDA(cudaStreamCreateWithFlags(&m.copy, cudaStreamNonBlocking));
  for (int i = 0; i < 2; ++i) {
    LT_CUDA(cudaEventCreateWithFlags(&m.up_done[i], cudaEventDisableTiming));
    LT_CUDA(cudaEventCreateWithFlags(&m.comp_done[i], cudaEventDisableTiming));
  }

  // Weights block.
  m.wblock_bytes = dm.embedding + dm.head + (m.streamed() ? 2 * dm.layer_max : dm.layers);
  m.wblock = static_cast<char*>(m.dev_alloc(m.wblock_bytes, "decode.weights"));
  std::vector<uint16_t> tmp;
  auto put_unit = [&](int64_t unit, char* dst) {
    tmp.assign(size_t(layout.units[size_t(unit)].numel), 0);
    src(unit, tmp.data());
    LT_CUDA(cudaMemcpy(dst, tmp.data(), tmp.size() * 2, cudaMemcpyHostToDevice));
  };
  char* p = m.wblock;
  put_unit(0, p);
  m.emb = reinterpret_cast<const uint16_t*>(p);
  p += dm.embedding;
  put_unit(c.layers + 1, p);
  m.head_w = reinterpret_cast<const uint16_t*>(p) + layout.head().find("norm.weight").offset;
  m.lm_w = c.tied ? m.emb + layout.embedding().find("embed_tokens.weight").offset
                  : reinterpret_cast<const uint16_t*>(p) + layout.head().find("lm_head.weight").offset;
  p += dm.head;
  for (int64_t l = 0; l < c.layers; ++l) {
    m.layer_off.push_back(m.host_layers_bytes);
    m.layer_bytes.push_back(decode_unit_bytes(layout.layer(l)));
    m.host_layers_bytes += m.layer_bytes.back();
  }
  if (m.streamed()) {
    m.slot[0] = reinterpret_cast<uint16_t*>(p);
    m.slot[1] = reinterpret_cast<uint16_t*>(p + dm.layer_max);
    m.host_layers = static_cast<uint16_t*>(pinned_alloc(m.host_layers_bytes, 0));
    for (int64_t l = 0; l < c.layers; ++l)
      src(l + 1, reinterpret_cast<uint16_t*>(reinterpret_cast<char*>(m.host_layers) + m.layer_off[size_t(l)]));
  } else {
    for (int64_t l = 0; l < c.layers; ++l) {
      put_unit(l + 1, p + m.layer_off[size_t(l)]);
      m.layer_dev.push_back(reinterpret_cast<const uint16_t*>(p + m.layer_off[size_t(l)]));
    }
  }
  m.use_graphs = o.cuda_graphs;
  cuda::DecodeAttnDims ad;
  ad.heads = c.heads, ad.kv_heads = c.kv_heads, ad.head_dim = c.head_dim;
  decode_attention_setup(ad);  // shared-memory opt-in before any graph capture
  for (int64_t l = 0; l < c.layers; ++l)
    if (!m.mixers[int(c.kind(l))]) m.mixers[int(c.kind(l))] = make_decode_mixer(c, c.kind(l));
  m.alloc_kv_workspace(cp);
}

CudaDecoder::~CudaDecoder() = default;

WeightsMode CudaDecoder::mode() const { return impl_->mode; }
std::string CudaDecoder::device_name() const { return impl_->name; }
int64_t CudaDecoder::device_bytes() const { return impl_->wblock_bytes + impl_->kblock_bytes; }
const DecodeCounters& CudaDecoder::counters() const { return impl_->cnt; }
void CudaDecoder::reset_counters() { impl_->cnt = {}; }
const std::vector<std::vector<float>>& CudaDecoder::captured_logits() const { return impl_->captured; }
void CudaDecoder::clear_captured_logits() { impl_->captured.clear(); }
int64_t CudaDecoder::streamed_bytes_per_pass() const { return impl_->host_layers_bytes; }

bool CudaDecoder::uses_graphs() const { return impl_->use_graphs && !impl_->streamed(); }

std::string CudaDecoder::describe() const {
  const Impl& m = *impl_;
  std::string s = fmt::format("{}, weights {}{}, {} on the device", m.name, weights_mode_name(m.mode),
                              uses_graphs() ? " (CUDA graphs)" : "", format_bytes(double(device_bytes())));
  if (m.streamed())
    s += fmt::format(" ({} of layers streamed from pinned host memory per pass)", format_bytes(double(m.host_layers_bytes)));
  return s;
}

double CudaDecoder::time_uploads_only(int passes) {
  Impl& m = *impl_;
  LT_CHECK(m.streamed(), "time_uploads_only: the decoder's weights are resident");
  LT_CUDA(cudaDeviceSynchronize());
  m.layer0_ready = false;  // the slots are overwritten below
  cudaEvent_t e0, e1;
  LT_CUDA(cudaEventCreate(&e0));
  LT_CUDA(cudaEventCreate(&e1));
  LT_CUDA(cudaEventRecord(e0, m.copy));
  for (int p = 0; p < passes; ++p)
    for (int64_t l = 0; l < m.c.layers; ++l)
      LT_CUDA(cudaMemcpyAsync(m.slot[l % 2], reinterpret_cast<const char*>(m.host_layers) + m.layer_off[size_t(l)],
                              size_t(m.layer_bytes[size_t(l)]), cudaMemcpyHostToDevice, m.copy));
  LT_CUDA(cudaEventRecord(e1, m.copy));
  LT_CUDA(cudaEventSynchronize(e1));
  float ms = 0;
  LT_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return double(ms) / 1e3;
}

std::vector<std::vector<int32_t>> CudaDecoder::generate(const std::vector<std::vector<int32_t>>& prompts,
                                                        int64_t max_new_tokens, int64_t batch_size,
                                                        const std::vector<int32_t>& stop_ids) {
  Impl& m = *impl_;
  const ModelConfig& c = m.c;
  std::vector<std::vector<int32_t>> out(prompts.size());
  const int64_t bs = std::max<int64_t>(1, batch_size);
  auto is_stop = [&](int32_t t) { return std::find(stop_ids.begin(), stop_ids.end(), t) != stop_ids.end(); };
  for (size_t i = 0; i < prompts.size(); ++i) {
    LT_CHECK(!prompts[i].empty(), "generate: prompt {} is empty", i);
    LT_CHECK(int64_t(prompts[i].size()) + max_new_tokens <= c.max_position,
             "generate: prompt {} ({} tokens) + max_new_tokens {} exceeds max_position {}", i, prompts[i].size(),
             max_new_tokens, c.max_position);
  }
  if (max_new_tokens <= 0) return out;

  for (size_t b0 = 0; b0 < prompts.size(); b0 += size_t(bs)) {
    const int64_t nb = int64_t(std::min(prompts.size() - b0, size_t(bs)));
    int64_t longest = 0;
    for (int64_t i = 0; i < nb; ++i) longest = std::max<int64_t>(longest, int64_t(prompts[b0 + size_t(i)].size()));
    const int64_t cap_b = longest + max_new_tokens;  // cache rows per sequence of this batch
    m.ensure_capacity(nb, cap_b);
    std::vector<int32_t> next(size_t(nb), 0), len(size_t(nb), 0);
    std::vector<char> done(size_t(nb), 0);
    m.cnt.sequences += nb;

    // ---- prefill: whole prompts packed into passes of at most prefill_rows rows
    double t0 = now_seconds();
    for (int64_t i = 0; i < nb;) {
      int64_t j = i, T = 0;
      while (j < nb && T + int64_t(prompts[b0 + size_t(j)].size()) <= m.cap.prefill_rows)
        T += int64_t(prompts[b0 + size_t(j++)].size());
      LT_CHECK(j > i, "internal: prompt {} does not fit a prefill pass of {} rows", b0 + size_t(i), m.cap.prefill_rows);
      int32_t* ids = m.stage<int32_t>(m.ws.ids);
      int32_t* pos = m.stage<int32_t>(m.ws.pos);
      int32_t* seg = m.stage<int32_t>(m.ws.seg);
      int64_t* dst = m.stage<int64_t>(m.ws.dst_row);
      int64_t* last = m.stage<int64_t>(m.ws.last_rows);
      int32_t* slots = m.stage<int32_t>(m.ws.slot);
      int64_t r = 0;
      for (int64_t s = i; s < j; ++s) {
        const auto& pr = prompts[b0 + size_t(s)];
        for (size_t t = 0; t < pr.size(); ++t, ++r) {
          ids[r] = pr[t];
          pos[r] = int32_t(t);
          seg[r] = int32_t(s - i);
          dst[r] = s * cap_b + int64_t(t);
        }
        last[s - i] = r - 1;
        slots[s - i] = int32_t(s);
        len[size_t(s)] = int32_t(pr.size());
      }
      LT_CUDA(cudaMemcpyAsync(m.wsb, m.staging, size_t(m.ws.table_bytes), cudaMemcpyHostToDevice, m.comp));
      embed_fwd(m.emb, m.at<int32_t>(m.ws.ids), T, c.hidden, c.vocab, m.at<void>(m.ws.x), m.at<int>(m.ws.err), m.comp);
      m.forward_layers(m.pass(T, j - i, true, 0));
      m.head(j - i, true);
      m.finish_pass(j - i);
      for (int64_t s = i; s < j; ++s) {
        const int32_t id = m.out_host[s - i];
        next[size_t(s)] = id;
        out[b0 + size_t(s)].push_back(id);
        if (is_stop(id)) done[size_t(s)] = 1;
      }
      m.cnt.prompt_tokens += T;
      m.cnt.generated_tokens += j - i;
      i = j;
    }
    double t1 = now_seconds();
    m.cnt.prefill_seconds += t1 - t0;

    // ---- decode: all live sequences advance together
    std::vector<int64_t> live;
    for (int64_t t = 1; t < max_new_tokens; ++t) {
      live.clear();
      for (int64_t i = 0; i < nb; ++i)
        if (!done[size_t(i)]) live.push_back(i);
      if (live.empty()) break;
      const int64_t n = int64_t(live.size());
      int32_t* ids = m.stage<int32_t>(m.ws.ids);
      int32_t* pos = m.stage<int32_t>(m.ws.pos);
      int32_t* lens = m.stage<int32_t>(m.ws.len);
      int64_t* dst = m.stage<int64_t>(m.ws.dst_row);
      int64_t* row0 = m.stage<int64_t>(m.ws.row0);
      int32_t* slots = m.stage<int32_t>(m.ws.slot);
      int64_t max_len = 0;
      for (int64_t r = 0; r < n; ++r) {
        const int64_t s = live[size_t(r)];
        ids[r] = next[size_t(s)];
        pos[r] = len[size_t(s)];
        lens[r] = len[size_t(s)] + 1;
        row0[r] = s * cap_b;
        slots[r] = int32_t(s);
        dst[r] = s * cap_b + len[size_t(s)];
        max_len = std::max<int64_t>(max_len, lens[r]);
      }
      m.decode_step(n, max_len);
      for (int64_t r = 0; r < n; ++r) {
        const int64_t s = live[size_t(r)];
        len[size_t(s)]++;
        const int32_t id = m.out_host[r];
        next[size_t(s)] = id;
        out[b0 + size_t(s)].push_back(id);
        if (is_stop(id)) done[size_t(s)] = 1;
      }
      m.cnt.generated_tokens += n;
    }
    m.cnt.decode_seconds += now_seconds() - t1;
  }
  return out;
}

}  // namespace lt::cuda
