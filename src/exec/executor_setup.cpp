// Executor setup: plan-derived sizes, the allocation of every buffer (so that a plan that does not fit
// is refused before running), teardown, and host-side helpers.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <iterator>

#include "core/error.h"
#include "core/log.h"
#include "core/units.h"
#include "exec/executor_impl.h"
#include "model/accounting.h"

namespace lt {

// ---------------------------------------------------------------------------------------- sizing

int64_t count_act_buffers(const ExecPlan& p) {
  const int64_t L = int64_t(p.tier.size()) - 1;
  const auto wins = plan_windows(p);
  std::vector<int32_t> wb(size_t(L), -1), wr(size_t(L), -1);
  for (size_t w = 0; w < wins.size(); ++w) {
    if (wins[w].kind == WindowKind::Backward) wb[size_t(wins[w].layer)] = int32_t(w);
    if (wins[w].kind == WindowKind::Recompute) wr[size_t(wins[w].layer)] = int32_t(w);
  }
  std::vector<std::pair<int64_t, int64_t>> iv;  // closed [acquire, release] windows
  for (int64_t i = 0; i <= L; ++i) {
    const int64_t a = std::max<int64_t>(i - 1, 0);
    const CkptTier t = i == L ? CkptTier::None : p.tier[size_t(i)];
    int64_t r = i;
    if (i == L) r = L;
    else if (t == CkptTier::Gpu) r = wb[size_t(i)];
    else if (t == CkptTier::Cpu || t == CkptTier::Nvme) r = std::max<int64_t>(i, effective_traffic(p, i).d2h.back().window);
    iv.push_back({a, r});
  }
  iv.push_back({L, wb[size_t(L - 1)]});  // dy_L
  const auto ck = plan_checkpoints(p);
  for (size_t b = 0; b + 1 < ck.size(); ++b) {
    const int64_t s = ck[b], e = ck[b + 1];
    const CkptTier t = p.tier[size_t(s)];
    if (t == CkptTier::Cpu || t == CkptTier::Nvme) iv.push_back({effective_traffic(p, s).h2d.front().window, wb[size_t(s)]});
    for (int64_t j = s + 1; j < e; ++j) iv.push_back({wr[size_t(j - 1)], wb[size_t(j)]});
    for (int64_t j = e - 1; j >= s; --j) iv.push_back({wb[size_t(j)], j > 0 ? wb[size_t(j - 1)] : wb[0]});
  }
  int64_t best = 0;
  for (size_t w = 0; w < wins.size(); ++w) {
    int64_t n = 0;
    for (auto& [a, r] : iv) n += (a <= int64_t(w) && int64_t(w) <= r);
    best = std::max(best, n);
  }
  return best;
}

bool embedding_on_device(const ModelConfig& c, const ExecPlan& p) { return p.embedding_resident || c.tied; }

// With gradients held on the device, the untied head's and embedding's per-micro-batch gradients share
// one buffer: the head's is added into its held buffer (compute lane) before the layers' backward, the
// embedding's is zeroed and written after it. (Host gradients leave by D2H copies that may still be in
// flight; a tied head writes the embedding's gradient itself.)
bool shared_head_embedding_grad(const ModelConfig& c, const ExecPlan& p) { return !c.tied && embedding_on_device(c, p); }

std::vector<int64_t> host_grad_units(const ModelConfig& c, const ExecPlan& p) {
  if (embedding_on_device(c, p)) return {};
  return {0};
}

namespace {

// Device-held units in the order the next forward waits for their updates: the embedding (on the device)
// and a resident head at its start, the layers, a streamed head in F_{L-1}.
std::vector<int64_t> held_grad_order(const ModelConfig& c, const ExecPlan& p) {
  const int64_t L = c.layers;
  std::vector<int64_t> o;
  if (embedding_on_device(c, p)) o.push_back(0);
  if (p.head_resident) o.push_back(L + 1);
  for (int64_t u = 1; u <= L; ++u) o.push_back(u);
  if (!p.head_resident) o.push_back(L + 1);
  return o;
}

std::vector<int64_t> unit_numels(const ModelLayout& lay) {
  std::vector<int64_t> n;
  for (const auto& u : lay.units) n.push_back(u.numel);
  return n;
}

// The dtype of the held gradients and whether the backward writes into them directly (one micro-batch
// in the backend's gradient dtype) or each micro-batch's gradient is added into them (grad_add).
DType held_grad_dtype(DType grad, int32_t micro_batches, GradDType held) {
  if (held == GradDType::Bf16) return DType::BF16;
  return micro_batches > 1 ? DType::F32 : grad;
}
bool held_grads_direct(DType grad, int32_t micro_batches, GradDType held) {
  return micro_batches == 1 && held_grad_dtype(grad, micro_batches, held) == grad;
}

// Device and pinned bytes of the weight gradients: per-micro-batch buffers (host gradients, or
// accumulation into the held buffers) and the held buffers with their staging ring.
ExecMemory grad_memory(const ModelConfig& c, const ExecPlan& p, const ModelLayout& lay, DType grad, const GradSizing& s) {
  const int64_t g = int64_t(dtype_size(grad));
  ExecMemory m;
  const int64_t head = lay.head().numel, emb = embedding_on_device(c, p) ? lay.embedding().numel : 0;
  if (s.home == GradHome::Host) {
    m.device = (2 * lay.max_layer_numel() + head + emb) * g;
    if (s.dtype == GradDType::Bf16) m.device += 2 * lay.max_layer_numel() * 2;  // host bf16: the rounding pieces
    return m;
  }
  // With head slices: the head's norm and one vocabulary slice instead of the head's and the embedding's buffers, and
  // each row's log-sum-exp.
  const int64_t heads = s.head_slices                      ? c.hidden + head_grad_slice_rows(c) * c.hidden
                        : shared_head_embedding_grad(c, p) ? std::max(head, emb)
                                                           : head + emb;
  const int64_t scratch = (2 * lay.max_layer_numel() + heads) * g + (s.head_slices ? p.batch * p.seq * 4 : 0);
  const auto order = held_grad_order(c, p);
  const auto numel = unit_numels(lay);
  const DType held = held_grad_dtype(grad, s.micro_batches, s.dtype);
  m.device = (held_grads_direct(grad, s.micro_batches, s.dtype) ? 0 : scratch) +
             GradStream::device_bytes(order, numel, held);
  m.pinned = GradStream::pinned_bytes(order, numel, held, s.ring_depth);
  return m;
}

}  // namespace

std::vector<int64_t> kept_internals_bytes(const Backend& be, const ExecPlan& p) {
  const int64_t L = be.config().layers, chunk = p.chunk_samples > 0 ? p.chunk_samples : p.batch;
  std::vector<int64_t> b(size_t(L), 0);
  for (int64_t j = std::max<int64_t>(0, L - p.kept_layers); j < L; ++j)
    b[size_t(j)] = be.layer_keep_bytes(j, chunk, p.seq) * ((p.batch + chunk - 1) / chunk);
  return b;
}

// Every call geometry the micro-batch run uses (for_chunks): the layers' forward, recompute and backward (kept or
// not) and the head on chunks of `chunk` samples and on the last, shorter chunk, in training and evaluation alike;
// the embedding's backward on the whole micro-batch.
int64_t plan_workspace_bytes(const Backend& be, const ExecPlan& p) {
  const int64_t chunk = p.chunk_samples > 0 ? p.chunk_samples : p.batch, last = p.batch % chunk;
  int64_t ws = be.layer_workspace_bytes(chunk * p.seq, p.seq);
  if (last > 0) ws = std::max(ws, be.layer_workspace_bytes(last * p.seq, p.seq));
  if (embedding_on_device(be.config(), p)) ws = std::max(ws, be.embed_workspace_bytes(p.batch * p.seq));
  return ws;
}

ExecMemory executor_memory(const ModelConfig& c, const ExecPlan& p, BackendDTypes dt, int64_t workspace_bytes,
                           const GradSizing& grads, int64_t kept_bytes) {
  const auto lay = model_layout(c);
  const int64_t L = c.layers, T = p.batch * p.seq;
  const int64_t w = int64_t(dtype_size(dt.weight)), a = int64_t(dtype_size(dt.act));
  const int64_t A = T * c.hidden * a, Apad = io_round_up(A), ln = lay.max_layer_numel();
  const ExecMemory gm = grad_memory(c, p, lay, dt.grad, grads);
  ExecMemory m;
  m.device = p.ring * ln * w + lay.head().numel * w + 4 * T * 4 + (2 + L + 2) * 8 + count_act_buffers(p) * A +
             workspace_bytes + gm.device + kept_bytes;
  if (embedding_on_device(c, p)) m.device += lay.embedding().numel * w;
  m.pinned = 4 * T * 4 + (2 + L + 2) * 8 + gm.pinned;
  if (!embedding_on_device(c, p)) m.pinned += 2 * A;  // host lookup: boundary 0 and its gradient
  int64_t n_cpu = 0, n_nvme = 0;
  for (int64_t i = 0; i < L; ++i) {
    n_cpu += p.tier[size_t(i)] == CkptTier::Cpu;
    n_nvme += p.tier[size_t(i)] == CkptTier::Nvme;
  }
  m.pinned += n_cpu * Apad + (n_nvme > 0 ? 2 * p.nvme_staging * Apad : 0);
  m.nvme = n_nvme * Apad;
  return m;
}

// ---------------------------------------------------------------------------------------- setup

Executor::Impl::Impl(Executor& e) : ex(e), be(e.be_), P(e.plan_), st(e.state_), c(e.cfg_) {
  L = c.layers;
  validate_plan(P, L);
  LT_CHECK(st.units() == L + 2, "executor: host state has {} units, expected {}", st.units(), L + 2);
  const auto dt = be.dtypes();
  LT_CHECK(dt.weight == st.stream_dtype(), "executor: host streaming copy is {}, backend streams {}",
           dtype_name(st.stream_dtype()), dtype_name(dt.weight));
  act_sz = dtype_size(dt.act);
  w_sz = dtype_size(dt.weight);
  g_sz = dtype_size(dt.grad);
  T = P.batch * P.seq;
  A = T * c.hidden * int64_t(act_sz);
  Apad = io_round_up(A);
  chunk = P.chunk_samples > 0 ? P.chunk_samples : P.batch;
  wins = plan_windows(P);
  ck = plan_checkpoints(P);
  win_bwd.assign(size_t(L), -1);
  win_rec.assign(size_t(L), -1);
  for (size_t w = 0; w < wins.size(); ++w) {
    if (wins[w].kind == WindowKind::Backward) win_bwd[size_t(wins[w].layer)] = int32_t(w);
    if (wins[w].kind == WindowKind::Recompute) win_rec[size_t(wins[w].layer)] = int32_t(w);
  }
  block_end.assign(size_t(L + 1), -1);
  for (size_t b = 0; b + 1 < ck.size(); ++b) block_end[size_t(ck[b])] = ck[b + 1];
  traffic.resize(size_t(L + 1));
  for (int64_t i = 0; i < L; ++i)
    if (P.tier[size_t(i)] == CkptTier::Cpu || P.tier[size_t(i)] == CkptTier::Nvme) traffic[size_t(i)] = effective_traffic(P, i);
  emb_on_device = embedding_on_device(c, P);
  LT_CHECK(ex.opts_.micro_batches >= 1, "executor: ExecOptions::micro_batches must be >= 1, got {}",
           ex.opts_.micro_batches);
  if (st.options().grads == GradHome::Device)
    for (int64_t u : host_grad_units(c, P))
      LT_CHECK(st.has_host_grad(u), "executor: gradients are held on the device, but unit {} (the embedding, "
               "looked up on the host) needs a host gradient: list host_grad_units() in HostStateOptions", u);
  if (!emb_on_device)
    LT_CHECK(dt.act == dt.weight, "executor: host embedding needs activation dtype {} == weight dtype {}",
             dtype_name(dt.act), dtype_name(dt.weight));
  // Weight-use sequences.
  std::vector<int64_t> layers;
  std::vector<int32_t> uw;
  for (size_t w = 0; w < wins.size(); ++w)
    if (wins[w].kind != WindowKind::Head) {
      layers.push_back(wins[w].layer);
      uw.push_back(int32_t(w));
    }
  ring_sched = build_ring_schedule(layers, uw, P.ring);
  std::vector<int64_t> fl;
  std::vector<int32_t> fw;
  for (int64_t j = 0; j < L; ++j) {
    fl.push_back(j);
    fw.push_back(int32_t(j));
  }
  eval_sched = build_ring_schedule(fl, fw, P.ring);
  allocate();
}

void Executor::Impl::allocate() {
  const auto& lay = be.layout();
  const int64_t layer_numel = lay.max_layer_numel();  // ring slots hold any layer kind
  // NVMe capacity first: it is known without allocating.
  int64_t n_nvme = 0;
  for (int64_t i = 0; i < L; ++i) n_nvme += P.tier[size_t(i)] == CkptTier::Nvme;
  if (n_nvme > 0 && ex.opts_.nvme_budget >= 0 && n_nvme * Apad > ex.opts_.nvme_budget)
    fail("does not fit: nvme short by {} ({} checkpoints of {}, budget {})",
         format_bytes(double(n_nvme * Apad - ex.opts_.nvme_budget)), n_nvme, format_bytes(double(Apad)),
         format_bytes(double(ex.opts_.nvme_budget)));
  // Device. The workspace first and held at its size for the executor's lifetime (Backend::hold_workspace): no call
  // of the plan grows it later, when the other buffers could have left the free bytes in pieces.
  workspace.hold(be, plan_workspace_bytes(be, P));
  for (int k = 0; k < P.ring; ++k) ring.emplace_back(be, MemKind::Device, layer_numel * int64_t(w_sz), "weights.ring");
  if (emb_on_device) emb_w = Buffer(be, MemKind::Device, lay.embedding().numel * int64_t(w_sz), "weights.embedding");
  head_w = Buffer(be, MemKind::Device, lay.head().numel * int64_t(w_sz), "weights.head");
  allocate_grads();
  const int64_t ib = T * 4;
  d_ids = Buffer(be, MemKind::Device, ib, "batch.inputs");
  d_tgt = Buffer(be, MemKind::Device, ib, "batch.inputs");
  d_pos = Buffer(be, MemKind::Device, ib, "batch.inputs");
  d_seg = Buffer(be, MemKind::Device, ib, "batch.inputs");
  d_scal = Buffer(be, MemKind::Device, (2 + L + 2) * 8, "scalars");
  pool = std::make_unique<ActPool>(be, A);
  pool->reserve(count_act_buffers(P));
  pool->mark_reserved();
  allocate_kept();
  // Pinned.
  p_ids = Buffer(be, MemKind::Pinned, ib, "batch.staging");
  p_tgt = Buffer(be, MemKind::Pinned, ib, "batch.staging");
  p_pos = Buffer(be, MemKind::Pinned, ib, "batch.staging");
  p_seg = Buffer(be, MemKind::Pinned, ib, "batch.staging");
  p_scal = Buffer(be, MemKind::Pinned, (2 + L + 2) * 8, "scalars");
  if (!emb_on_device) {
    p_x0 = Buffer(be, MemKind::Pinned, A, "embedding.host_io");
    p_dx0 = Buffer(be, MemKind::Pinned, A, "embedding.host_io");
  }
  cpu_ckpt.resize(size_t(L + 1));
  for (int64_t i = 0; i < L; ++i)
    if (P.tier[size_t(i)] == CkptTier::Cpu) cpu_ckpt[size_t(i)] = Buffer(be, MemKind::Pinned, Apad, "ckpt.cpu");
  if (n_nvme > 0) {
    for (int k = 0; k < P.nvme_staging; ++k) {
      wstage.emplace_back(be, MemKind::Pinned, Apad, "ckpt.nvme_staging");
      rstage.emplace_back(be, MemKind::Pinned, Apad, "ckpt.nvme_staging");
    }
    store = std::make_unique<NvmeStore>(ex.opts_.nvme_dir, ex.opts_.io);
    nvme_worker = std::make_unique<HostWorker>("nvme");
  }
  sink_worker = std::make_unique<HostWorker>("grad-sink");
  be.set_timing(ex.opts_.timing);
}

// The kept layers' buffers, for the whole run (the planner counts them as held for the whole step). A backend
// that keeps nothing (layer_keep_bytes 0) runs those layers as plain ones.
void Executor::Impl::allocate_kept() {
  keep.resize(size_t(L));
  keep_chunk.assign(size_t(L), 0);
  const std::vector<int64_t> bytes = kept_internals_bytes(be, P);
  const int64_t chunks = (P.batch + chunk - 1) / chunk;
  for (int64_t j = 0; j < L; ++j) {
    if (bytes[size_t(j)] <= 0) continue;
    keep_chunk[size_t(j)] = bytes[size_t(j)] / chunks;
    keep[size_t(j)] = Buffer(be, MemKind::Device, bytes[size_t(j)], fmt::format("keep.layer{}", j));
  }
}

void* Executor::Impl::keep_for(int64_t j, int64_t row0) const {
  if (keep_chunk[size_t(j)] == 0) return nullptr;
  return keep[size_t(j)].as<char>() + row0 / (chunk * P.seq) * keep_chunk[size_t(j)];
}

// Weight gradient buffers on the device: per micro-batch (host gradients, or several micro-batches /
// bf16 held gradients accumulated into the held buffers) and, with GradHome::Device, the held buffers
// and their stream.
void Executor::Impl::allocate_grads() {
  const auto& lay = be.layout();
  const bool device = st.options().grads == GradHome::Device;
  const DType held = held_grad_dtype(be.dtypes().grad, ex.opts_.micro_batches, st.options().grad_dtype);
  held_direct = device && held_grads_direct(be.dtypes().grad, ex.opts_.micro_batches, st.options().grad_dtype);
  head_slices = st.options().head_grad_slices;
  if (head_slices) {
    LT_CHECK(device && !held_direct && !c.tied && emb_on_device && be.has_sliced_head_grad(),
             "executor: the head's gradient by vocabulary slices needs gradients held on the device in bf16, an untied "
             "LM head and a backend that has it ({}): here gradients {}, held {}, tied {}",
             be.name(), device ? "device" : "host", held_direct ? "directly" : "in accumulators", c.tied);
    head_slice_rows = ex.opts_.head_slice_rows > 0 ? std::min(ex.opts_.head_slice_rows, c.vocab) : head_grad_slice_rows(c);
    head_norm_g = Buffer(be, MemKind::Device, c.hidden * int64_t(g_sz), "grads.head_norm");
    head_slice_g = Buffer(be, MemKind::Device, head_slice_rows * c.hidden * int64_t(g_sz), "grads.head_slice");
    head_lse = Buffer(be, MemKind::Device, T * 4, "head.lse");
    for (auto& g : gslot) g = Buffer(be, MemKind::Device, lay.max_layer_numel() * int64_t(g_sz), "grads.layer");
  } else if (!held_direct) {
    const bool share = device && shared_head_embedding_grad(c, P);
    const int64_t head_n = share ? std::max(lay.head().numel, lay.embedding().numel) : lay.head().numel;
    if (emb_on_device && !share)
      emb_g = Buffer(be, MemKind::Device, lay.embedding().numel * int64_t(g_sz), "grads.embedding");
    head_g = Buffer(be, MemKind::Device, head_n * int64_t(g_sz), share ? "grads.head+embedding" : "grads.head");
    for (auto& g : gslot) g = Buffer(be, MemKind::Device, lay.max_layer_numel() * int64_t(g_sz), "grads.layer");
  }
  if (device) {
    dgrads = std::make_unique<GradStream>(be, held_grad_order(c, P), unit_numels(lay), held, st.options().grad_ring_depth);
  }
  host_bf16 = st.options().host_bf16_grads();
  if (host_bf16) {
    LT_CHECK(ex.opts_.micro_batches == 1, "executor: gradients on the host in bf16 with {} micro-batches: each "
             "gradient is rounded on the device as it leaves, so one micro-batch per step (use gradient_dtype fp32 or "
             "gradients device)", ex.opts_.micro_batches);
    LT_CHECK(st.options().device_update_layers == 0 && !st.options().embedding_update_device,
             "executor: updates on the device read fp32 gradients, but the host gradients are bf16 (use "
             "gradient_dtype fp32, or device_update_layers 0 and embedding_update host)");
    for (auto& g : g16) g = Buffer(be, MemKind::Device, lay.max_layer_numel() * 2, "grads.bf16_pieces");
  }
  if (emb_on_device) emb_grad = held_direct || head_slices ? dgrads->buffer(0) : emb_g ? emb_g.data() : head_g.data();
  head_grad = held_direct || head_slices ? dgrads->buffer(L + 1) : head_g.data();
  if (st.options().embedding_update_device) {
    LT_CHECK(emb_on_device, "executor: embedding_update device needs the table on the device (tied to the LM head); "
             "this plan looks it up on the host");
    LT_CHECK(!dgrads, "executor: embedding_update device with gradients held on the device is not supported; use "
             "gradients host or embedding_update host");
    dev_updates.push_back(std::make_unique<DeviceUpdate>(be, st, 0, emb_w.data(), static_cast<const float*>(emb_grad),
                                                         ex.opts_.micro_batches));
  }
  const int64_t k = st.options().device_update_layers;
  LT_CHECK(k >= 0 && k <= L, "executor: device_update_layers {} outside [0, {}] (the model's layers)", k, L);
  LT_CHECK(k == 0 || !dgrads, "executor: layers updated on the device with gradients held on the device are not "
           "supported; use gradients host or device_update_layers 0");
  for (int64_t u = 1; u <= k; ++u)
    dev_updates.push_back(std::make_unique<DeviceUpdate>(be, st, u, nullptr, nullptr, ex.opts_.micro_batches));
  if (!dev_updates.empty()) {
    dev_update_of.assign(size_t(L + 2), nullptr);
    for (auto& d : dev_updates) dev_update_of[size_t(d->unit())] = d.get();
  }
}

void WorkspaceHold::hold(Backend& be, int64_t bytes) {
  be.hold_workspace(bytes);
  be_ = &be;
}

WorkspaceHold::~WorkspaceHold() {
  if (!be_) return;
  try {
    be_->release_workspace();
  } catch (const std::exception& e) {
    log_warn("executor shutdown: releasing the workspace: {}", e.what());
  }
}

Executor::Impl::~Impl() {
  dgrads.reset();  // streams what is left and waits for the updates reading its staging slots
  try {
    be.synchronize();
  } catch (const std::exception& e) {
    log_warn("executor shutdown: {}", e.what());
  }
  if (nvme_worker) nvme_worker->drain();
  if (sink_worker) sink_worker->drain();
  be.clear_error();
  store.reset();  // removes files and directory
}

void Executor::Impl::add_span(int track, OpLabel l, int64_t bytes, double t0, double t1, int32_t mb) {
  std::lock_guard<std::mutex> g(trace_mu);
  trace.push_back(TraceSpan{track, l, bytes, t0, t1, mb});
}

void Executor::Impl::collect_backend_spans(int32_t mb) {
  for (auto& s : be.take_spans()) add_span(int(s.lane), s.label, s.bytes, s.t0, s.t1, mb);
}

// The update this step ends with runs the next step's embedding rows first (host lookup only: a lookup on the
// device reads the whole uploaded table).
void Executor::Impl::hint_next_rows(UpdateHook* hook, const std::vector<int32_t>& next_ids) {
  first_rows_active.swap(first_rows_pending);
  first_rows_pending.clear();
  if (emb_on_device || !hook || next_ids.empty()) return;
  const int64_t H = c.hidden, V = c.vocab;
  std::vector<char> hit(size_t(V), 0);
  for (int32_t r : next_ids)
    if (r >= 0 && r < V) hit[size_t(r)] = 1;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t r = 0; r < V; ++r) {
    if (!hit[size_t(r)]) continue;
    if (!ranges.empty() && ranges.back().second == r * H) ranges.back().second += H;
    else ranges.emplace_back(r * H, (r + 1) * H);
  }
  hook->prioritize(0, std::move(ranges));
  first_rows_pending = std::move(hit);
}

// The embedding's gradient of one micro-batch when the lookup runs on the host (untied weights, not
// resident: embedding_on_device), formed in the same order as on the device (the lookup's
// scatter-add in token order), then assigned to (first micro-batch) or added into the host gradient.
void Executor::Impl::host_embedding_backward(const int32_t* ids, bool assign, bool last, bool track_rows) {
  // g = (assign ? 0 : g) + e, e = scatter of dx by token. Only the rows that tokens hit get scatter
  // terms; every other row is a plain (parallel) add. A 152k x 4k vocabulary makes this ~600M floats
  // per step, so no full-size temporary and no serial pass. The arithmetic per element is that of
  // cpu::embed_backward (0 + dx_t1 + dx_t2 ... in token order, then added to g), bit for bit.
  const int64_t H = c.hidden, V = c.vocab, n = st.numel(0);
  // Host bf16 gradients (one micro-batch: every call assigns): each row rounded as the device rounds its gradients.
  bf16_t* g16 = st.grad_bf16(0);
  LT_CHECK(!g16 || (assign && last), "executor: a bf16 host gradient of the embedding takes one micro-batch per step");
  float* g = g16 ? nullptr : st.grad(0);
  // Rows hit by tokens, each accumulated in token order into a compact buffer. The rows are split over threads
  // (each scans every token and adds only its own rows' ones, so each row's order is the token order): the serial
  // loop took ~250 ms for Qwen2.5-7B at 64 x 1024 tokens, after the backward and before the embedding's update
  // (measured in a step trace).
  std::vector<int32_t> slot(size_t(V), -1);
  std::vector<int32_t> rows;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t r = ids[t];
    LT_CHECK(r >= 0 && r < V, "embedding backward: token id {} at position {} is outside [0, {})", r, t, V);
    if (slot[size_t(r)] < 0) {
      slot[size_t(r)] = int32_t(rows.size());
      rows.push_back(r);
    }
  }
  std::vector<float> acc(rows.size() * size_t(H), 0.0f);
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), me = omp_get_thread_num();
    for (int64_t t = 0; t < T; ++t) {
      const int64_t sl = slot[size_t(ids[t])];
      if (sl % nt != me) continue;
      float* e = acc.data() + size_t(sl) * size_t(H);
      if (act_sz == 2) {
        const bf16_t* d = p_dx0.as<bf16_t>() + t * H;
        for (int64_t k = 0; k < H; ++k) e[k] += bf16_to_f32(d[k]);
      } else {
        const float* d = p_dx0.as<float>() + t * H;
        for (int64_t k = 0; k < H; ++k) e[k] += d[k];
      }
    }
  }
  // Every row: g = (assign ? 0 : g) + e; rows no token hit have e = 0, so they are zeroed (first
  // micro-batch) or left as they are (g + 0 == g: these gradients are never -0). The sum of squares,
  // needed only after the last micro-batch, per fixed block of rows added in block order, so the norm
  // does not depend on the thread count.
  // With the nonzero rows known (the previous step assigned them, nobody else wrote g), an assignment visits only
  // those and the rows hit now: every other row is zero already and adds exactly 0 to the sums, so the result is
  // the same bit for bit, without the pass over the whole table (~2.2 GB written for Qwen2.5-7B: ~50 ms).
  const bool sparse = assign && track_rows && emb_rows_valid;
  emb_rows_valid = false;
  std::vector<int32_t> visit;  // ascending
  if (sparse) {
    std::vector<int32_t> hit(rows);
    std::sort(hit.begin(), hit.end());
    std::set_union(hit.begin(), hit.end(), emb_rows.begin(), emb_rows.end(), std::back_inserter(visit));
  }
  const int64_t rows_per_block = std::max<int64_t>(1, (int64_t(1) << 20) / std::max<int64_t>(H, 1));
  const int64_t nblocks = (V + rows_per_block - 1) / rows_per_block;
  std::vector<double> part(size_t(nblocks), 0.0);
  auto do_row = [&](int64_t r, double& ss) {
    if (g16) {  // assign: zero, then add_into_bf16 as Backend::grad_add into a zeroed bf16 accumulator
      bf16_t* gr = g16 + r * H;
      std::fill(gr, gr + H, bf16_t(0));
      if (slot[size_t(r)] >= 0) ss += add_into_bf16(gr, acc.data() + size_t(slot[size_t(r)]) * size_t(H), H);
      return;
    }
    float* gr = g + r * H;
    if (slot[size_t(r)] >= 0) {
      const float* e = acc.data() + size_t(slot[size_t(r)]) * size_t(H);
      for (int64_t k = 0; k < H; ++k) gr[k] = assign ? e[k] : gr[k] + e[k];
    } else if (assign) {
      std::fill(gr, gr + H, 0.0f);
    }
    if (last)
      for (int64_t k = 0; k < H; ++k) ss += double(gr[k]) * double(gr[k]);
  };
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = 0; b < nblocks; ++b) {
    double ss = 0;
    const int64_t r0 = b * rows_per_block, r1 = std::min(V, (b + 1) * rows_per_block);
    if (sparse) {
      for (auto it = std::lower_bound(visit.begin(), visit.end(), int32_t(r0)); it != visit.end() && *it < r1; ++it)
        do_row(*it, ss);
    } else {
      for (int64_t r = r0; r < r1; ++r) do_row(r, ss);
    }
    part[size_t(b)] = ss;
  }
  // Alignment padding of the unit's flat buffer (beyond V*H) stays zero.
  for (int64_t i = V * H; i < n; ++i) g16 ? void(g16[i] = 0) : void(g[i] = 0.0f);
  double ss = 0;
  for (double x : part) ss += x;
  if (last) host_sumsq[0] = ss;
  // After a step's only micro-batch the nonzero rows are the ones hit (several micro-batches: not tracked).
  if (assign && last && track_rows) {
    emb_rows = std::move(rows);
    std::sort(emb_rows.begin(), emb_rows.end());
    emb_rows_valid = true;
  }
}

}  // namespace lt
