#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <numeric>
#include <thread>

#include <omp.h>

#include "backend/cpu/reference.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "core/timer.h"

namespace lt {

namespace {

struct CpuEvent final : EventImpl {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  void signal() {
    {
      std::lock_guard<std::mutex> g(mu);
      done = true;
    }
    cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> g(mu);
    cv.wait(g, [&] { return done; });
  }
};

CpuEvent* as_cpu(const Event& e) {
  auto* p = dynamic_cast<CpuEvent*>(e.get());
  LT_CHECK(p != nullptr, "cpu backend: event from another backend");
  return p;
}

// What a lane runs. Ops are skipped once an error was raised (events still complete).
struct Task {
  enum Kind { Op, Record, Wait } kind = Op;
  std::function<void()> fn;
  std::shared_ptr<CpuEvent> ev;
  OpLabel label;
  int64_t bytes = 0;
  double min_seconds = 0;  // bandwidth emulation: the op takes at least this long
};

}  // namespace

struct CpuBackend::Impl {
  struct LaneQ {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Task> q;
    int64_t busy = 0;  // tasks taken but not finished
    int64_t n_ops = 0;  // ops enqueued (for failure injection)
    int64_t fail_at = -1;
    std::string fail_msg;
    std::thread th;
  };
  LaneQ lanes[kNumLanes];
  std::atomic<bool> stop{false};
  std::atomic<bool> failed{false};
  std::mutex err_mu;
  std::string first_error;
  std::atomic<bool> timing{false};
  std::mutex span_mu;
  std::vector<Span> spans;
  std::condition_variable idle_cv;

  void set_error(const std::string& m) {
    std::lock_guard<std::mutex> g(err_mu);
    if (!failed.exchange(true)) first_error = m;
  }

  void run(int li) {
    LaneQ& L = lanes[li];
    for (;;) {
      Task t;
      {
        std::unique_lock<std::mutex> g(L.mu);
        L.cv.wait(g, [&] { return stop || !L.q.empty(); });
        if (L.q.empty()) return;
        t = std::move(L.q.front());
        L.q.pop_front();
        L.busy++;
      }
      if (t.kind == Task::Record) {
        t.ev->signal();
      } else if (t.kind == Task::Wait) {
        t.ev->wait();
      } else if (!failed) {
        const double t0 = now_seconds();
        try {
          t.fn();
        } catch (const std::exception& e) {
          set_error(fmt::format("{} lane, op '{}' (window {}, index {}): {}", lane_name(Lane(li)), t.label.what,
                                t.label.window, t.label.index, e.what()));
        }
        if (t.min_seconds > 0) {
          const double left = t.min_seconds - (now_seconds() - t0);
          if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
        }
        if (timing) {
          std::lock_guard<std::mutex> g(span_mu);
          spans.push_back(Span{Lane(li), t.label, t.bytes, t0, now_seconds()});
        }
      }
      {
        std::lock_guard<std::mutex> g(L.mu);
        L.busy--;
      }
      L.cv.notify_all();
    }
  }

  void push(Lane lane, Task t) {
    LaneQ& L = lanes[int(lane)];
    {
      std::lock_guard<std::mutex> g(L.mu);
      if (t.kind == Task::Op) {
        L.n_ops++;
        if (L.fail_at > 0 && L.n_ops == L.fail_at) {
          std::string msg = L.fail_msg;
          t.fn = [msg] { fail("{}", msg); };
          L.fail_at = -1;
        }
      }
      L.q.push_back(std::move(t));
    }
    L.cv.notify_all();
  }

  void drain() {
    for (auto& L : lanes) {
      std::unique_lock<std::mutex> g(L.mu);
      L.cv.wait(g, [&] { return L.q.empty() && L.busy == 0; });
    }
  }
};

CpuBackend::CpuBackend(const ModelConfig& c, CpuBackendOptions o) : Backend(c), opt_(o), impl_(std::make_unique<Impl>()) {
  mem_.set_budget(MemKind::Device, o.device_budget);
  if (o.device_budget >= ArenaAllocator::kAlign) arena_ = std::make_unique<ArenaAllocator>(o.device_budget);
  mem_.set_budget(MemKind::Pinned, o.pinned_budget);
  // 0: the constructing thread's OpenMP setting (omp_set_num_threads there applies to the lanes too).
  const int threads = o.threads > 0 ? o.threads : omp_get_max_threads();
  for (int i = 0; i < kNumLanes; ++i)
    impl_->lanes[i].th = std::thread([this, i, threads] {
      if (threads > 0) omp_set_num_threads(threads);  // this lane's parallel regions only
      impl_->run(i);
    });
}

CpuBackend::~CpuBackend() {
  impl_->drain();
  impl_->stop = true;
  for (auto& L : impl_->lanes) {
    L.cv.notify_all();
    L.th.join();
  }
  free_workspace();
}

Allocation CpuBackend::alloc(MemKind k, int64_t bytes, const std::string& tag) {
  LT_CHECK(bytes > 0, "cpu backend: allocation of {} bytes for '{}' (expected > 0)", bytes, tag);
  mem_.reserve(k, bytes, tag);
  int64_t off = -1;
  if (k == MemKind::Device && arena_) {
    try {
      off = arena_->allocate(bytes, tag);
    } catch (...) {
      mem_.release(k, bytes, tag);
      throw;
    }
  }
  const size_t align = k == MemKind::Pinned ? 4096 : 256;
  const size_t rounded = (size_t(bytes) + align - 1) / align * align;
  // Large buffers (masters, gradients, bf16 copies that the optimizer streams) get huge pages.
  void* p = aligned_host_alloc(rounded, align);
  if (!p) {
    if (off >= 0) arena_->release(off);
    mem_.release(k, bytes, tag);
    fail("cpu backend: out of host memory allocating {} bytes for '{}'", bytes, tag);
  }
  live_[reinterpret_cast<uintptr_t>(p)] = Live{bytes, tag, off};
  return Allocation{p, bytes, k, tag};
}

void CpuBackend::free(Allocation& a) {
  if (!a.ptr) return;
  auto it = live_.find(reinterpret_cast<uintptr_t>(a.ptr));
  if (it != live_.end()) {
    if (it->second.arena_offset >= 0) arena_->release(it->second.arena_offset);
    live_.erase(it);
  }
  std::free(a.ptr);
  mem_.release(a.kind, a.bytes, a.tag);
  a = {};
}

int64_t CpuBackend::layer_call_workspace(int64_t tokens) const {
  // The reference keeps q, k, v, attention output, normed input and the three MLP activations of the
  // rows it works on, plus their gradients in backward: an upper estimate, in fp32.
  const auto& c = cfg_;
  int64_t per_row = 2 * (3 * c.hidden + c.q_dim() + 2 * c.kv_dim() + c.q_dim() + 3 * c.ffn);
  if (c.count(LayerKind::GatedDeltaNet) > 0) {  // qkv before/after conv, q/k normalised, z, gates, rule output
    const auto& l = c.linear;
    per_row = std::max(per_row, 2 * (3 * c.hidden + 2 * l.conv_dim() + 4 * l.key_dim() + 3 * l.value_dim() +
                                     4 * l.v_heads + 3 * c.ffn));
  }
  return tokens * per_row * 4;
}

int64_t CpuBackend::head_call_workspace(int64_t seq) const {
  // head_loss runs the reference head sample by sample: per sample the normed rows and their gradient, and one
  // chunk of fp32 logits (the sample split into equal chunks of at most head_chunk_rows rows).
  const int64_t S = std::max<int64_t>(seq, 1), R0 = cpu::head_chunk_rows(cfg_.vocab);
  const int64_t chunks = (S + R0 - 1) / R0, rows = (S + chunks - 1) / chunks;
  return (2 * S * cfg_.hidden + rows * cfg_.vocab) * 4;
}

int64_t CpuBackend::layer_workspace_bytes(int64_t tokens, int64_t seq) const {
  const int64_t sample = seq > 0 && tokens % seq == 0 ? seq : tokens;
  return std::max(layer_call_workspace(tokens), head_call_workspace(sample));
}

// As the CUDA backend's: the old workspace freed, the new one at the arena's high end.
void CpuBackend::take_workspace(int64_t bytes) {
  free_workspace();
  mem_.reserve(MemKind::Device, bytes, "workspace");
  if (arena_) {
    try {
      ws_offset_ = arena_->allocate(bytes, "workspace", ArenaAllocator::End::High);
    } catch (...) {
      mem_.release(MemKind::Device, bytes, "workspace");
      throw;
    }
  }
  ws_bytes_ = bytes;
}

void CpuBackend::free_workspace() {
  if (ws_bytes_ == 0) return;
  if (ws_offset_ >= 0) arena_->release(ws_offset_);
  mem_.release(MemKind::Device, ws_bytes_, "workspace");
  ws_bytes_ = 0;
  ws_offset_ = -1;
}

void CpuBackend::workspace_for(int64_t bytes, const char* op, OpLabel l, int64_t rows) {
  if (bytes <= ws_bytes_ || impl_->failed) return;  // after an error the lane skips the op anyway
  try {
    if (ws_held_) fail_workspace_held(op, l, rows, bytes, ws_bytes_);
    take_workspace(bytes);
  } catch (const std::exception& e) {
    impl_->set_error(fmt::format("{} lane, op '{}' (window {}, index {}): {}", lane_name(Lane::Compute), l.what,
                                 l.window, l.index, e.what()));
  }
}

void CpuBackend::reserve_workspace(int64_t tokens, int64_t seq) {
  const int64_t want = layer_workspace_bytes(tokens, seq);
  if (want <= ws_bytes_) return;
  if (ws_held_) fail_workspace_held("reserve_workspace", OpLabel{}, tokens, want, ws_bytes_);
  take_workspace(want);
}

void CpuBackend::hold_workspace(int64_t bytes) {
  ws_held_ = false;
  if (bytes > 0) take_workspace(bytes);
  else free_workspace();
  ws_held_ = true;
}

void CpuBackend::release_workspace() {
  ws_held_ = false;
  free_workspace();
}

Event CpuBackend::record(Lane lane) {
  auto ev = std::make_shared<CpuEvent>();
  Task t;
  t.kind = Task::Record;
  t.ev = ev;
  impl_->push(lane, std::move(t));
  return ev;
}

void CpuBackend::wait(Lane lane, const Event& ev) {
  if (!ev) return;
  auto* ce = as_cpu(ev);
  Task t;
  t.kind = Task::Wait;
  t.ev = std::shared_ptr<CpuEvent>(ev, ce);
  impl_->push(lane, std::move(t));
}

void CpuBackend::host_wait(const Event& ev) {
  if (ev) as_cpu(ev)->wait();
  check();
}

bool CpuBackend::done(const Event& ev) {
  if (!ev) return true;
  auto* ce = as_cpu(ev);
  std::lock_guard<std::mutex> g(ce->mu);
  return ce->done;
}

void CpuBackend::synchronize() {
  impl_->drain();
  check();
}

void CpuBackend::check() {
  if (impl_->failed) {
    std::lock_guard<std::mutex> g(impl_->err_mu);
    throw Error(impl_->first_error);
  }
}

void CpuBackend::clear_error() {
  std::lock_guard<std::mutex> g(impl_->err_mu);
  impl_->failed = false;
  impl_->first_error.clear();
}

void CpuBackend::check_range(const void* p, int64_t bytes, const char* what, OpLabel l) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = live_.upper_bound(a);
  if (it == live_.begin()) return;  // not backend memory (the caller's own)
  --it;
  const int64_t off = int64_t(a - it->first), size = it->second.bytes;
  if (off >= size) return;
  LT_CHECK(off + bytes <= size, "cpu backend: copy '{}' ({} #{}) of {} bytes at offset {} of '{}' runs past its {} bytes",
           l.what, what, l.index, bytes, off, it->second.tag, size);
}

void CpuBackend::copy(Lane lane, void* dst, const void* src, int64_t bytes, OpLabel l) {
  check_range(dst, bytes, "destination", l);
  check_range(src, bytes, "source", l);
  Task t;
  t.fn = [dst, src, bytes] { std::memcpy(dst, src, size_t(bytes)); };
  t.label = l;
  t.bytes = bytes;
  const double bw = lane == Lane::H2D ? opt_.h2d_bytes_per_s : lane == Lane::D2H ? opt_.d2h_bytes_per_s : 0;
  if (bw > 0) t.min_seconds = double(bytes) / bw;
  impl_->push(lane, std::move(t));
}

void CpuBackend::fill_zero(Lane lane, void* dst, int64_t bytes, OpLabel l) {
  Task t;
  t.fn = [dst, bytes] { std::memset(dst, 0, size_t(bytes)); };
  t.label = l;
  impl_->push(lane, std::move(t));
}

void CpuBackend::set_timing(bool on) { impl_->timing = on; }

std::vector<Span> CpuBackend::take_spans() {
  std::lock_guard<std::mutex> g(impl_->span_mu);
  std::vector<Span> s;
  s.swap(impl_->spans);
  return s;
}

namespace {
cpu::SeqGeometry geom(const DevGeometry& g) { return cpu::SeqGeometry{g.batch, g.seq, g.positions, g.segments}; }
}  // namespace

void CpuBackend::embed_forward(const void* emb, const int32_t* ids, int64_t T, void* x, OpLabel l) {
  Task t;
  t.fn = [this, emb, ids, T, x] { cpu::embed_forward(cfg_, static_cast<const float*>(emb), ids, T, static_cast<float*>(x)); };
  t.label = l;
  impl_->push(Lane::Compute, std::move(t));
}

void CpuBackend::embed_backward(const int32_t* ids, int64_t T, const void* dx, void* demb, OpLabel l) {
  workspace_for(embed_workspace_bytes(T), "embed_backward", l, T);
  Task t;
  t.fn = [this, ids, T, dx, demb] {
    cpu::embed_backward(cfg_, ids, T, static_cast<const float*>(dx), static_cast<float*>(demb));
  };
  t.label = l;
  impl_->push(Lane::Compute, std::move(t));
}

// Each id's rows summed in token order from zero (embed_backward's sum), then added into its row of acc as
// grad_add adds; the sum of squares over the whole acc in element order, as grad_add's.
void CpuBackend::embed_backward_acc(const int32_t* ids, int64_t T, const void* dx, void* acc, DType acc_dtype,
                                    double* sumsq, OpLabel l) {
  LT_CHECK(acc_dtype == DType::F32 || acc_dtype == DType::BF16,
           "embed_backward_acc: accumulator dtype {} (expected F32 or BF16)", dtype_name(acc_dtype));
  Task t;
  t.fn = [this, ids, T, dx, acc, acc_dtype, sumsq] {
    const int64_t H = cfg_.hidden, n = cfg_.vocab * H;
    std::vector<int64_t> order(static_cast<size_t>(T));
    std::iota(order.begin(), order.end(), int64_t(0));
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
    std::vector<float> row(static_cast<size_t>(H));
    const float* d = static_cast<const float*>(dx);
    for (size_t i = 0; i < order.size();) {
      const int64_t id = ids[order[i]];
      std::fill(row.begin(), row.end(), 0.0f);
      for (; i < order.size() && ids[order[i]] == id; ++i)
        for (int64_t h = 0; h < H; ++h) row[size_t(h)] += d[order[i] * H + h];
      if (acc_dtype == DType::F32) {
        float* a = static_cast<float*>(acc) + id * H;
        for (int64_t h = 0; h < H; ++h) a[h] += row[size_t(h)];
      } else {
        add_into_bf16(static_cast<bf16_t*>(acc) + id * H, row.data(), H);  // grad_add's rounding
      }
    }
    if (!sumsq) return;
    double s = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double v = acc_dtype == DType::F32 ? double(static_cast<const float*>(acc)[i])
                                               : double(bf16_to_f32(static_cast<const bf16_t*>(acc)[i]));
      s += v * v;
    }
    *sumsq += s;
  };
  t.label = l;
  impl_->push(Lane::Compute, std::move(t));
}

void CpuBackend::layer_forward(int64_t layer, const void* w, const DevGeometry& g, const void* x, void* y, OpLabel l) {
  LT_CHECK(layer >= 0 && layer < cfg_.layers, "cpu backend: layer {} out of range [0, {})", layer, cfg_.layers);
  workspace_for(layer_call_workspace(g.tokens()), "layer_forward", l, g.tokens());
  Task t;
  t.fn = [this, layer, w, g, x, y] {
    cpu::layer_forward(cfg_, layout_.layer(layer), static_cast<const float*>(w), geom(g), static_cast<const float*>(x),
                       static_cast<float*>(y));
  };
  t.label = l;
  impl_->push(Lane::Compute, std::move(t));
}

void CpuBackend::layer_backward(int64_t layer, const void* w, const DevGeometry& g, const void* x, const void* dy,
                                void* dx, void* dw, OpLabel l) {
  LT_CHECK(layer >= 0 && layer < cfg_.layers, "cpu backend: layer {} out of range [0, {})", layer, cfg_.layers);
  workspace_for(layer_call_workspace(g.tokens()), "layer_backward", l, g.tokens());
  Task t;
  t.fn = [this, layer, w, g, x, dy, dx, dw] {
    cpu::layer_backward(cfg_, layout_.layer(layer), static_cast<const float*>(w), geom(g),
                        static_cast<const float*>(x), static_cast<const float*>(dy), static_cast<float*>(dx),
                        static_cast<float*>(dw));
  };
  t.label = l;
  impl_->push(Lane::Compute, std::move(t));
}

namespace {
// What the CPU backend's kept buffer holds (layer_keep_bytes).
struct KeptRecord {
  static constexpr uint64_t kMagic = 0x6b6570742d637075ull;  // "kept-cpu"
  uint64_t magic;
  int64_t layer, batch, seq;
  float x_head[4];  // the input's first values (its buffer may differ: a reloaded or recomputed boundary)
  void fill(int64_t l, const DevGeometry& g, const void* x) {
    magic = kMagic, layer = l, batch = g.batch, seq = g.seq;
    std::memcpy(x_head, x, sizeof(x_head));
  }
  bool same(int64_t l, const DevGeometry& g, const void* x) const {
    return magic == kMagic && layer == l && batch == g.batch && seq == g.seq &&
           std::memcmp(x_head, x, sizeof(x_head)) == 0;
  }
};
}  // namespace

int64_t CpuBackend::layer_keep_bytes(int64_t layer, int64_t batch, int64_t seq) const {
  LT_CHECK(layer >= 0 && layer < cfg_.layers, "cpu backend: layer {} out of range [0, {})", layer, cfg_.layers);
  (void)batch, (void)seq;
  return int64_t(sizeof(KeptRecord) + 255) / 256 * 256;
}

void CpuBackend::layer_forward_keep(int64_t layer, const void* w, const DevGeometry& g, const void* x, void* y,
                                    void* keep, OpLabel l) {
  layer_forward(layer, w, g, x, y, l);
  Task t;
  t.fn = [layer, g, x, keep] { static_cast<KeptRecord*>(keep)->fill(layer, g, x); };
  t.label = l;
  impl_->push(Lane::Compute, std::move(t));
}

void CpuBackend::layer_backward_kept(int64_t layer, const void* w, const DevGeometry& g, const void* x,
                                     const void* dy, void* dx, void* dw, void* keep, OpLabel l) {
  Task t;
  t.fn = [layer, g, x, keep] {
    auto* r = static_cast<KeptRecord*>(keep);
    LT_CHECK(r->same(layer, g, x),
             "cpu backend: layer_backward_kept of layer {} ({} x {}) on a buffer its layer_forward_keep did not fill "
             "(it holds layer {}, {} x {}{})",
             layer, g.batch, g.seq, r->layer, r->batch, r->seq, r->magic == KeptRecord::kMagic ? "" : ", or none");
    r->magic = 0;  // consumed
  };
  t.label = l;
  impl_->push(Lane::Compute, std::move(t));
  layer_backward(layer, w, g, x, dy, dx, dw, l);
}

// The head's ops run sample by sample (rows r0 = b * seq ..), so that their sums are accumulated in the same order
// however the executor chunks the batch: one compute task calling fn(r0) for each sample.
void CpuBackend::push_head_samples(const char* op, const DevGeometry& g, OpLabel l, std::function<void(int64_t)> fn) {
  workspace_for(head_call_workspace(g.seq), op, l, g.tokens());
  Task t;
  t.fn = [g, fn = std::move(fn)] {
    for (int64_t b = 0; b < g.batch; ++b) fn(b * g.seq);
  };
  t.label = l;
  impl_->push(Lane::Compute, std::move(t));
}

void CpuBackend::head_loss(const void* head_w, const void* lm_w, const int32_t* targets, const DevGeometry& g,
                           const void* x, float loss_scale, void* dx, void* d_head_w, void* d_lm_w, double* acc,
                           OpLabel l) {
  push_head_samples("head_loss", g, l, [=, this](int64_t r0) {
    const int64_t H = cfg_.hidden;
    auto res = cpu::head_forward_backward(
        cfg_, layout_.head(), static_cast<const float*>(head_w), static_cast<const float*>(lm_w), targets + r0, g.seq,
        static_cast<const float*>(x) + r0 * H, loss_scale, dx ? static_cast<float*>(dx) + r0 * H : nullptr,
        static_cast<float*>(d_head_w), static_cast<float*>(d_lm_w));
    acc[0] += res.loss_sum;
    acc[1] += double(res.n_tokens);
  });
}

void CpuBackend::head_loss_lse(const void* head_w, const void* lm_w, const int32_t* targets, const DevGeometry& g,
                               const void* x, float loss_scale, void* dx, void* d_norm_w, float* lse, double* acc,
                               OpLabel l) {
  push_head_samples("head_loss_lse", g, l, [=, this](int64_t r0) {
    const int64_t H = cfg_.hidden;
    auto res = cpu::head_forward_lse(cfg_, layout_.head(), static_cast<const float*>(head_w),
                                     static_cast<const float*>(lm_w), targets + r0, g.seq,
                                     static_cast<const float*>(x) + r0 * H, loss_scale,
                                     dx ? static_cast<float*>(dx) + r0 * H : nullptr, static_cast<float*>(d_norm_w),
                                     lse + r0);
    acc[0] += res.loss_sum;
    acc[1] += double(res.n_tokens);
  });
}

void CpuBackend::head_lm_grad_slice(const void* head_w, const void* lm_w, const int32_t* targets, const DevGeometry& g,
                                    const void* x, const float* lse, float loss_scale, int64_t v0, int64_t n_v,
                                    void* dw, OpLabel l) {
  push_head_samples("head_lm_grad_slice", g, l, [=, this](int64_t r0) {
    cpu::head_lm_grad_slice(cfg_, layout_.head(), static_cast<const float*>(head_w), static_cast<const float*>(lm_w),
                            targets + r0, g.seq, static_cast<const float*>(x) + r0 * cfg_.hidden, lse + r0,
                            loss_scale, v0, n_v, static_cast<float*>(dw));
  });
}

void CpuBackend::head_logits(const void* head_w, const void* lm_w, const void* x, const int64_t* rows, int64_t n_rows,
                             float* out, OpLabel l) {
  workspace_for(n_rows * cfg_.hidden * 4, "head_logits", l, n_rows);  // the normed rows
  Task t;
  t.fn = [this, head_w, lm_w, x, rows, n_rows, out] {
    cpu::head_logits(cfg_, layout_.head(), static_cast<const float*>(head_w), static_cast<const float*>(lm_w),
                     static_cast<const float*>(x), rows, n_rows, out);
  };
  t.label = l;
  impl_->push(Lane::Compute, std::move(t));
}

void CpuBackend::grad_sumsq(const void* grad, int64_t n, double* out, OpLabel l) {
  Task t;
  t.fn = [grad, n, out] {
    const float* g = static_cast<const float*>(grad);
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += double(g[i]) * double(g[i]);
    *out += s;
  };
  t.label = l;
  impl_->push(Lane::Compute, std::move(t));
}

void CpuBackend::grad_add(void* acc, DType acc_dtype, const void* grad, int64_t n, double* sumsq, OpLabel l) {
  LT_CHECK(acc_dtype == DType::F32 || acc_dtype == DType::BF16, "grad_add: accumulator dtype {} (expected F32 or BF16)",
           dtype_name(acc_dtype));
  Task t;
  t.fn = [acc, acc_dtype, grad, n, sumsq] {
    // One pass in element order: the host's accumulation (and its sum of squares) bit for bit.
    const float* g = static_cast<const float*>(grad);
    double s = 0;
    if (acc_dtype == DType::F32) {
      float* a = static_cast<float*>(acc);
      for (int64_t i = 0; i < n; ++i) {
        a[i] += g[i];
        s += double(a[i]) * double(a[i]);
      }
    } else {
      s = add_into_bf16(static_cast<bf16_t*>(acc), g, n);
    }
    if (sumsq) *sumsq += s;
  };
  t.label = l;
  impl_->push(Lane::Compute, std::move(t));
}

void CpuBackend::adamw_step(const AdamWStepScalars& s, float* p, bf16_t* hi, uint16_t* lo, const float* g, float* m,
                            float* v, int64_t n, OpLabel l) {
  LT_CHECK(p ? !hi && !lo : hi && lo, "adamw_step: the master is fp32 (p) or split (hi and lo), not both");
  Task t;
  t.fn = [=] { cpu::adamw_step(s, p, hi, lo, g, m, v, n); };
  t.label = l;
  impl_->push(Lane::Compute, std::move(t));
}

void CpuBackend::adamw_step_q8(const AdamWStepScalars& s, const Q8Maps& maps, float* p, bf16_t* hi, uint16_t* lo,
                               const float* g, uint8_t* mq, uint8_t* vq, float* ms, float* vs, int64_t n, OpLabel l) {
  LT_CHECK(p ? !hi && !lo : hi && lo, "adamw_step_q8: the master is fp32 (p) or split (hi and lo), not both");
  Task t;
  // The maps by value: the task may run after the caller's copy is gone.
  t.fn = [=, mp = maps] { cpu::adamw_step_q8(s, mp, p, hi, lo, g, mq, vq, ms, vs, n); };
  t.label = l;
  impl_->push(Lane::Compute, std::move(t));
}

void CpuBackend::inject_failure(Lane lane, int64_t nth, const std::string& msg) {
  auto& L = impl_->lanes[int(lane)];
  std::lock_guard<std::mutex> g(L.mu);
  L.fail_at = L.n_ops + nth;
  L.fail_msg = msg;
}

}  // namespace lt
