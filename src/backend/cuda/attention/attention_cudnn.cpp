// cuDNN SDPA graphs for the causal GQA attention of the layers (see attention_cudnn.h). One forward and
// one backward graph per (device, batch, seq, heads, kv_heads, head_dim, scale, deterministic; packed rows: also
// the rounded run count and longest run), built on first use (~0.1 s a pair) and kept; executions bind the
// caller's pointers by tensor uid.
#include "backend/cuda/attention/attention_cudnn.h"

#include <algorithm>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernel_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"

#if LT_HAVE_CUDNN
#include <cudnn.h>

#include <cudnn_frontend.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#endif

namespace lt::cuda {

int64_t packed_index_ints(int64_t tokens) { return 5 * (tokens + 2); }  // PackedIndex's five arrays

PackedIndex packed_index_layout(const AttnDims& d, int32_t* index) {
  const int64_t n = d.tokens() + 2;
  return {index, index + n, index + 2 * n, index + 3 * n, index + 4 * n};
}

#if LT_HAVE_CUDNN
namespace fe = cudnn_frontend;

namespace {
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kQOff, kKvOff, kStOff, kLenQ, kLenKv, kOOff,
                     kDOOff, kDQOff, kDKOff, kDVOff };

// slots == 0: unpacked rows (b samples of s rows). slots > 0: packed rows, `slots` sequences of at most s rows
// (tokens = b * s_row rows in all, kept in `rows`).
struct Key {
  int device;
  int64_t b, s, h, hk, d;
  float scale;
  bool det;
  int64_t slots = 0, rows = 0;
  bool operator<(const Key& o) const {
    return std::tie(device, b, s, h, hk, d, scale, det, slots, rows) <
           std::tie(o.device, o.b, o.s, o.h, o.hk, o.d, o.scale, o.det, o.slots, o.rows);
  }
};

struct Graphs {
  bool ok = false;
  std::string why;  // when !ok
  std::shared_ptr<fe::graph::Graph> fwd, bwd;
  int64_t fwd_ws = 0, bwd_ws = 0;
};

struct State {
  std::mutex mu;
  std::map<int, cudnnHandle_t> handles;
  std::map<Key, Graphs> graphs;
  std::map<int, std::pair<void*, size_t>> fwd_ws;  // per device: the forward's workspace (0 B on sm_90)
};
State& state() {
  static State* s = new State;  // never destroyed: cuDNN handles outlive static teardown order
  return *s;
}

void check(fe::error_t e, const char* what) {
  LT_CHECK(e.is_good(), "cuDNN attention: {} failed: {}", what, e.get_message());
}

cudnnHandle_t handle_for(State& s, int dev) {
  auto it = s.handles.find(dev);
  if (it != s.handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  const cudnnStatus_t rc = cudnnCreate(&h);
  LT_CHECK(rc == CUDNN_STATUS_SUCCESS, "cuDNN attention: cudnnCreate on device {} failed: {}", dev,
           cudnnGetErrorString(rc));
  s.handles[dev] = h;
  return h;
}

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// [b, heads, s, d] view of our row-major [b*s, heads*d] activations; packed rows: `b` sequences at the ragged
// element offsets `off`.
void set_bhsd(fe::graph::Tensor_attributes& t, const Key& k, int64_t heads, const TensorPtr& off) {
  t.set_dim({k.slots ? k.slots : k.b, heads, k.s, k.d}).set_stride({k.s * heads * k.d, k.d, heads * k.d, 1});
  if (off) t.set_ragged_offset(off);
}
TensorPtr bhsd(fe::graph::Graph& g, const char* name, int64_t uid, const Key& k, int64_t heads, const TensorPtr& off) {
  fe::graph::Tensor_attributes t;
  t.set_name(name).set_uid(uid);
  set_bhsd(t, k, heads, off);
  return g.tensor(t);
}
void as_bhsd(const TensorPtr& t, int64_t uid, const Key& k, int64_t heads, const TensorPtr& off) {
  t->set_output(true).set_uid(uid);
  set_bhsd(*t, k, heads, off);
}
// int32 [n, 1, 1, 1]: ragged offsets and sequence lengths.
TensorPtr index_tensor(fe::graph::Graph& g, const char* name, int64_t uid, int64_t n) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_data_type(fe::DataType_t::INT32)
                      .set_dim({n, 1, 1, 1})
                      .set_stride({1, 1, 1, 1}));
}
// Statistics: unpacked [b, h, s] (cuDNN < 9.26 reads only this layout back); packed [T, h] at ragged offsets.
void set_stats(fe::graph::Tensor_attributes& t, const Key& k, const TensorPtr& off) {
  t.set_data_type(fe::DataType_t::FLOAT);
  if (k.slots) t.set_dim({k.slots, k.h, k.s, 1}).set_stride({k.s * k.h, 1, k.h, 1}).set_ragged_offset(off);
  else t.set_dim({k.b, k.h, k.s, 1}).set_stride({k.h * k.s, k.s, 1, 1});
}

// The ragged index tensors of a packed graph (null for unpacked rows).
struct Ragged {
  TensorPtr q_off, kv_off, st_off, len_q, len_kv, o_off, do_off, dq_off, dk_off, dv_off;
};
Ragged ragged_tensors(fe::graph::Graph& g, const Key& k, bool bwd) {
  Ragged r;
  if (!k.slots) return r;
  const int64_t n = k.slots + 1;
  r.q_off = index_tensor(g, "q_off", kQOff, n);
  r.kv_off = index_tensor(g, "kv_off", kKvOff, n);
  r.st_off = index_tensor(g, "stats_off", kStOff, n);
  r.o_off = index_tensor(g, "o_off", kOOff, n);
  r.len_q = index_tensor(g, "len_q", kLenQ, k.slots);
  r.len_kv = index_tensor(g, "len_kv", kLenKv, k.slots);
  if (bwd) {
    r.do_off = index_tensor(g, "do_off", kDOOff, n);
    r.dq_off = index_tensor(g, "dq_off", kDQOff, n);
    r.dk_off = index_tensor(g, "dk_off", kDKOff, n);
    r.dv_off = index_tensor(g, "dv_off", kDVOff, n);
  }
  return r;
}
template <typename Attr>
void packed_options(Attr& a, const Key& k, const Ragged& r) {
  if (!k.slots) return;
  a.set_padding_mask(true).set_seq_len_q(r.len_q).set_seq_len_kv(r.len_kv).set_max_total_seq_len_q(k.rows).set_max_total_seq_len_kv(
      k.rows);
}

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// validate -> operation graph -> heuristics -> support -> plans; an empty string when it all went through.
std::string finish(fe::graph::Graph& g, cudnnHandle_t h, int64_t& ws) {
  fe::error_t e = g.validate();
  if (e.is_good()) e = g.build_operation_graph(h);
  if (e.is_good()) e = g.create_execution_plans({fe::HeurMode_t::A});
  if (e.is_good()) e = g.check_support(h);
  if (e.is_good()) e = g.build_plans(h);
  if (e.is_good()) e = g.get_workspace_size(ws);
  return e.is_good() ? std::string() : e.get_message();
}

Graphs build(const Key& k, cudnnHandle_t h) {
  Graphs out;
  {
    auto g = new_graph();
    const Ragged r = ragged_tensors(*g, k, false);
    auto q = bhsd(*g, "Q", kQ, k, k.h, r.q_off), kk = bhsd(*g, "K", kK, k, k.hk, r.kv_off);
    auto v = bhsd(*g, "V", kV, k, k.hk, r.kv_off);
    auto opts = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_causal_mask(true).set_attn_scale(
        k.scale);
    packed_options(opts, k, r);
    auto [o, stats] = g->sdpa(q, kk, v, opts);
    as_bhsd(o, kO, k, k.h, r.o_off);
    stats->set_output(true).set_uid(kStats);
    set_stats(*stats, k, r.st_off);
    if (std::string why = finish(*g, h, out.fwd_ws); !why.empty()) {
      out.why = "forward " + why;
      return out;
    }
    out.fwd = g;
  }
  {
    auto g = new_graph();
    const Ragged r = ragged_tensors(*g, k, true);
    auto q = bhsd(*g, "Q", kQ, k, k.h, r.q_off), kk = bhsd(*g, "K", kK, k, k.hk, r.kv_off);
    auto v = bhsd(*g, "V", kV, k, k.hk, r.kv_off);
    auto o = bhsd(*g, "O", kO, k, k.h, r.o_off), dO = bhsd(*g, "dO", kDO, k, k.h, r.do_off);
    fe::graph::Tensor_attributes sa;
    sa.set_name("Stats").set_uid(kStats);
    set_stats(sa, k, r.st_off);
    auto stats = g->tensor(sa);
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("sdpa_backward")
                    .set_causal_mask(true)
                    .set_attn_scale(k.scale)
                    .set_deterministic_algorithm(k.det);
    packed_options(opts, k, r);
    auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, dO, stats, opts);
    as_bhsd(dq, kDQ, k, k.h, r.dq_off);
    as_bhsd(dk, kDK, k, k.hk, r.dk_off);
    as_bhsd(dv, kDV, k, k.hk, r.dv_off);
    if (std::string why = finish(*g, h, out.bwd_ws); !why.empty()) {
      out.why = "backward " + why;
      return out;
    }
    out.bwd = g;
  }
  out.ok = true;
  return out;
}

int64_t pow2_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

// Packed rows: the runs rounded up to a multiple of 1/16 of their power of two (at least 8; <= the rows) and the
// longest run to a power of two (>= 128, <= seq), so that a few graphs serve every batch of a run: each new key costs
// a build (measured: 1.3 s for the first, 0.2 s for the next, in the step that meets it), and a multiple of 8 made
// Qwen2.5-3B's 632 and 640 runs two keys. cuDNN 9.19 sizes the ragged backward's fp32 dQ accumulator by slots x
// longest, not by the rows: the rounding adds at most 1/16 of the slots for that.
Key key_of(const AttnDims& d, const PackedRows* p) {
  int dev = 0;
  LT_CUDA(cudaGetDevice(&dev));
  Key k{dev, d.batch, d.seq, d.heads, d.kv_heads, d.head_dim, d.scale, kernel_options().attention_deterministic};
  if (p) {
    k.rows = d.tokens();
    const int64_t granule = std::max<int64_t>(8, pow2_at_least(p->runs) / 16);
    k.slots = std::min(k.rows, (p->runs + granule - 1) / granule * granule);
    k.s = std::min(d.seq, std::max<int64_t>(128, pow2_at_least(p->longest)));
  }
  return k;
}

// The graphs of d (built when missing) with the state locked by `lk`.
Graphs& graphs_for(State& s, const Key& k) {
  auto it = s.graphs.find(k);
  if (it != s.graphs.end()) return it->second;
  const double t0 = now_seconds();
  Graphs gr = build(k, handle_for(s, k.device));
  // Each new shape costs a build (~0.1 s a pair); packed rows key on their rounded run count and longest run, so a
  // training run builds a few. Logged to tell a slow step's cause (notes 0z: the 3B's step 3 runs its layers ~15 %
  // slower, likely from this).
  if (gr.ok && k.slots)
    log_info("attention: cuDNN graphs for packed rows ({} sequence slots, longest {}) built in {:.0f} ms", k.slots, k.s,
             1e3 * (now_seconds() - t0));
  if (!gr.ok)
    log_warn("cuDNN attention declines b={} s={} heads={}/{} hd={}{} ({}); using our attention kernels", k.b, k.s,
             k.h, k.hk, k.d, k.slots ? fmt::format(" packed ({} sequence slots)", k.slots) : std::string(), gr.why);
  return s.graphs.emplace(k, std::move(gr)).first->second;
}

void run(State& s, const Key& k, const fe::graph::Graph& g, std::unordered_map<int64_t, void*>& ptrs, void* ws,
         cudaStream_t st, const char* what) {
  cudnnHandle_t h = handle_for(s, k.device);
  const cudnnStatus_t rc = cudnnSetStream(h, st);
  LT_CHECK(rc == CUDNN_STATUS_SUCCESS, "cuDNN attention: cudnnSetStream failed: {}", cudnnGetErrorString(rc));
  check(g.execute(h, ptrs, ws), what);
}
}  // namespace

bool cudnn_attention_built() { return true; }
bool cudnn_attention_enabled() { return kernel_options().attention == AttnPath::Cudnn; }

bool cudnn_attention_usable(const AttnDims& d, const PackedRows* packed) {
  if (!cudnn_attention_enabled() || d.head_dim % 8 != 0 || d.head_dim > 256 || d.heads % d.kv_heads != 0) return false;
  // Ragged offsets are int32 elements.
  if (packed && (packed->runs <= 0 || d.tokens() * d.heads * d.head_dim >= (int64_t(1) << 31))) return false;
  State& s = state();
  std::lock_guard lk(s.mu);
  return graphs_for(s, key_of(d, packed)).ok;
}

size_t cudnn_attention_bwd_workspace(const AttnDims& d, const PackedRows* packed) {
  if (!cudnn_attention_usable(d, packed)) return 0;
  State& s = state();
  std::lock_guard lk(s.mu);
  return size_t(graphs_for(s, key_of(d, packed)).bwd_ws);
}

namespace {
// The ragged index tensors of this call, rebuilt from the segments on `st`, into the pointer map.
void bind_packed(const AttnDims& d, const PackedRows* p, const Key& k, bool bwd,
                 std::unordered_map<int64_t, void*>& ptrs, cudaStream_t st) {
  if (!p) return;
  LT_CHECK(p->index && p->segments, "cuDNN attention: packed rows without their segments or index scratch");
  const PackedIndex ix = packed_index_layout(d, p->index);
  packed_attention_index(d, p->segments, int(k.slots), ix, st);
  ptrs[kQOff] = ix.q_off;
  ptrs[kOOff] = ix.q_off;
  ptrs[kKvOff] = ix.kv_off;
  ptrs[kStOff] = ix.st_off;
  ptrs[kLenQ] = ix.len;
  ptrs[kLenKv] = ix.len;
  if (bwd) {
    ptrs[kDOOff] = ix.q_off;
    ptrs[kDQOff] = ix.q_off;
    ptrs[kDKOff] = ix.kv_off;
    ptrs[kDVOff] = ix.kv_off;
  }
}
}  // namespace

void cudnn_attention_fwd(const AttnDims& d, const PackedRows* packed, const void* q, const void* k, const void* v,
                         void* o, float* stats, cudaStream_t st) {
  State& s = state();
  std::lock_guard lk(s.mu);
  const Key key = key_of(d, packed);
  Graphs& g = graphs_for(s, key);
  LT_CHECK(g.ok, "cuDNN attention: forward called for a shape it declined ({})", g.why);
  // The forward's workspace is 0 for these graphs on sm_90; a buffer of the module's covers any other engine.
  void* ws = nullptr;
  if (g.fwd_ws > 0) {
    auto& [p, n] = s.fwd_ws[key.device];
    if (n < size_t(g.fwd_ws)) {
      if (p) LT_CUDA(cudaFree(p));
      LT_CUDA(cudaMalloc(&p, size_t(g.fwd_ws)));
      n = size_t(g.fwd_ws);
    }
    ws = p;
  }
  std::unordered_map<int64_t, void*> ptrs{{kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)},
                                          {kV, const_cast<void*>(v)}, {kO, o}, {kStats, stats}};
  bind_packed(d, packed, key, false, ptrs, st);
  run(s, key, *g.fwd, ptrs, ws, st, "forward");
}

void cudnn_attention_bwd(const AttnDims& d, const PackedRows* packed, const void* q, const void* k, const void* v,
                         const void* o, const float* stats, const void* dout, void* dq, void* dk, void* dv,
                         void* workspace, size_t workspace_bytes, cudaStream_t st) {
  State& s = state();
  std::lock_guard lk(s.mu);
  const Key key = key_of(d, packed);
  Graphs& g = graphs_for(s, key);
  LT_CHECK(g.ok, "cuDNN attention: backward called for a shape it declined ({})", g.why);
  LT_CHECK(size_t(g.bwd_ws) <= workspace_bytes,
           "cuDNN attention: the backward needs {} B of workspace, the caller passed {} (cudnn_attention_bwd_workspace)",
           g.bwd_ws, workspace_bytes);
  std::unordered_map<int64_t, void*> ptrs{
      {kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)},       {kV, const_cast<void*>(v)},
      {kO, const_cast<void*>(o)}, {kStats, const_cast<float*>(stats)}, {kDO, const_cast<void*>(dout)},
      {kDQ, dq},                  {kDK, dk},                           {kDV, dv}};
  bind_packed(d, packed, key, true, ptrs, st);
  run(s, key, *g.bwd, ptrs, workspace, st, "backward");
}

std::string cudnn_attention_describe() {
  if (!cudnn_attention_enabled()) return "own kernels (attention=own)";
  const size_t v = cudnnGetVersion();
  return "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100) +
         " (frontend " + std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) + "." +
         std::to_string(CUDNN_FRONTEND_MINOR_VERSION) + "." + std::to_string(CUDNN_FRONTEND_PATCH_VERSION) + "), " +
         (kernel_options().attention_deterministic ? "deterministic" : "atomic") + " backward";
}

#else  // built without the cuDNN frontend: our kernels only

bool cudnn_attention_built() { return false; }
bool cudnn_attention_enabled() { return false; }
bool cudnn_attention_usable(const AttnDims&, const PackedRows*) { return false; }
size_t cudnn_attention_bwd_workspace(const AttnDims&, const PackedRows*) { return 0; }
void cudnn_attention_fwd(const AttnDims&, const PackedRows*, const void*, const void*, const void*, void*, float*,
                         cudaStream_t) {
  LT_CHECK(false, "cuDNN attention: this build has no cuDNN frontend (scripts/fetch-cudnn-frontend)");
}
void cudnn_attention_bwd(const AttnDims&, const PackedRows*, const void*, const void*, const void*, const void*,
                         const float*, const void*, void*, void*, void*, void*, size_t, cudaStream_t) {
  LT_CHECK(false, "cuDNN attention: this build has no cuDNN frontend (scripts/fetch-cudnn-frontend)");
}
std::string cudnn_attention_describe() { return "own kernels (built without the cuDNN frontend)"; }

#endif

}  // namespace lt::cuda
