// The schedule of one step: windows in order (exec_plan.h), each issuing its transfers first, then
// its compute. See docs/executor.md.
#include "exec/executor.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/reference.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/units.h"
#include "exec/executor_impl.h"
#include "exec/gather_rows.h"

namespace lt {

// ---------------------------------------------------------------------------------------- one micro-batch

namespace {

struct Range {
  int64_t off = 0, len = 0;
};

// Byte ranges of a share list over a padded boundary of `pad` bytes (rounded to kIoAlign).
std::vector<Range> share_ranges(const std::vector<ExecPlan::Share>& sh, int64_t pad) {
  std::vector<Range> r;
  double cum = 0;
  int64_t prev = 0;
  for (size_t k = 0; k < sh.size(); ++k) {
    cum += sh[k].fraction;
    int64_t end = k + 1 == sh.size() ? pad : std::min(pad, io_round_up(int64_t(std::llround(cum * double(pad)))));
    end = std::max(end, prev);
    r.push_back({prev, end - prev});
    prev = end;
  }
  return r;
}

// State of one boundary's trip through the CPU/NVMe tiers during one micro-batch.
struct CkptTrip {
  std::vector<Range> d2h_r, wr_r, rd_r, h2d_r;
  size_t d2h_next = 0, wr_next = 0, rd_next = 0, h2d_next = 0;
  std::vector<Event> d2h_ev;                  // per issued d2h share
  std::vector<std::shared_future<void>> wr_f, rd_f;
  Event h2d_last;
  int wslot = -1, rslot = -1;
  bool released = false;  // forward device buffer returned to the pool
};

}  // namespace

class MicroBatchRun {
 public:
  MicroBatchRun(Executor::Impl& im, const MicroBatch& mb, int32_t mb_index, int32_t n_mb, float loss_scale, bool train,
                UpdateHook* hook, std::vector<char>& waited, double& update_wait)
      : I(im), be(im.be), P(im.P), mb_(mb), mbi_(mb_index), nmb_(n_mb), scale_(loss_scale), train_(train),
        hook_(hook), waited_(waited), update_wait_(update_wait) {}

  void run();
  double t_forward_end = 0;

 private:
  Executor::Impl& I;
  Backend& be;
  const ExecPlan& P;
  const MicroBatch& mb_;
  int32_t mbi_, nmb_;
  float scale_;
  bool train_;
  UpdateHook* hook_;
  std::vector<char>& waited_;
  double& update_wait_;

  const RingSchedule* rs_ = nullptr;
  int64_t use_ = 0, next_load_ = 0;
  std::vector<Event> use_done_, load_ready_;
  std::vector<int> xbuf_;      // device buffer holding boundary i (forward / block)
  std::vector<Event> produced_;
  std::vector<CkptTrip> trip_;
  std::vector<int> wslot_owner_, rslot_owner_;  // boundary holding each NVMe staging slot, -1 = free
  std::vector<Event> rslot_free_ev_;
  Event emb_ready_, head_ready_, gslot_free_[2];
  int gslot_next_ = 0;
  int dy_ = -1;  // gradient at the current boundary
  int32_t cur_w_ = 0;

  void* X(int id) const { return I.pool->ptr(id); }
  char* row(void* base, int64_t r) const { return static_cast<char*>(base) + r * I.c.hidden * int64_t(I.act_sz); }
  DevGeometry geom(int64_t s0, int64_t ns) const {
    DevGeometry g;
    g.batch = ns;
    g.seq = P.seq;
    if (mb_.positions) g.positions = I.d_pos.as<int32_t>() + s0 * P.seq;
    if (mb_.segments) g.segments = I.d_seg.as<int32_t>() + s0 * P.seq;
    return g;
  }
  OpLabel lab(const char* what, int32_t index) const { return OpLabel{what, cur_w_, index}; }
  // f(first row, geometry) for each chunk of the micro-batch (ExecPlan::chunk_samples samples).
  template <typename F>
  void for_chunks(F&& f) const {
    for (int64_t s0 = 0; s0 < P.batch; s0 += I.chunk) f(s0 * P.seq, geom(s0, std::min(I.chunk, P.batch - s0)));
  }

  // ---- the phases of run()
  void begin();
  void stage_inputs();
  void upload_emb();
  void upload_head();
  void embed_inputs();
  void forward_layer(int64_t j);
  void head();
  int32_t backward_block(int64_t s, int64_t e, int32_t w);
  void enter_block_window(int64_t s, int32_t w, bool& reloaded);
  void backward_layer(int64_t j);
  void finish_embedding(int32_t w);

  void wait_update(int64_t unit) {
    if (!hook_ || waited_[size_t(unit)]) return;
    const double t0 = now_seconds();
    if (I.dgrads) I.dgrads->before_wait(unit);  // a device-held gradient reached the hook
    hook_->wait(unit);
    if (I.dgrads) I.dgrads->after_wait(unit);   // its staging slot takes the next gradient
    const double t1 = now_seconds();
    waited_[size_t(unit)] = 1;
    update_wait_ += t1 - t0;
    I.add_span(kTrackHost, OpLabel{kOptimizerWaitLabel, cur_w_, int32_t(unit)}, 0, t0, t1, mbi_);
  }

  // ---- weights
  // Issues the loads of uses <= upto whose slot is free of enqueued compute. Called with the current
  // use before its compute (mandatory load), and after enqueuing it with up to ring-1 uses ahead
  // (prefetch): waiting there for a layer's optimizer update never delays already-enqueued compute.
  void issue_loads(int64_t upto) {
    const auto& r = *rs_;
    const int64_t n = std::min<int64_t>(int64_t(r.layer.size()), upto + 1);
    while (next_load_ < n) {
      if (!r.load[size_t(next_load_)]) {
        ++next_load_;
        continue;
      }
      const int64_t ev_after = r.evict_after[size_t(next_load_)];
      if (next_load_ - use_ >= P.ring || ev_after >= use_) break;  // slot still needed by unenqueued compute
      const int64_t layer = r.layer[size_t(next_load_)];
      wait_update(layer + 1);
      if (ev_after >= 0) be.wait(Lane::H2D, use_done_[size_t(ev_after)]);
      // The layer's own size: slots hold the largest layer kind, the host copy only this layer.
      be.copy(Lane::H2D, I.ring[size_t(r.slot[size_t(next_load_)])].data(), I.st.stream(layer + 1),
              I.st.numel(layer + 1) * int64_t(I.w_sz), lab("w.h2d", int32_t(layer)));
      load_ready_[size_t(next_load_)] = be.record(Lane::H2D);
      ++next_load_;
    }
  }
  const void* weights_for_use() {
    const auto& r = *rs_;
    issue_loads(use_);
    LT_CHECK(next_load_ > r.loader[size_t(use_)], "executor: weight load for use {} not issued", use_);
    be.wait(Lane::Compute, load_ready_[size_t(r.loader[size_t(use_)])]);
    return I.ring[size_t(r.slot[size_t(use_)])].data();
  }
  void end_use() {
    use_done_[size_t(use_)] = be.record(Lane::Compute);
    ++use_;
    issue_loads(use_ + P.ring - 1);
  }

  // ---- checkpoint traffic
  void* tier_host_ptr(int64_t i, bool write_side) {
    if (P.tier[size_t(i)] == CkptTier::Cpu) return I.cpu_ckpt[size_t(i)].data();
    auto& t = trip_[size_t(i)];
    return write_side ? I.wstage[size_t(t.wslot)].data() : I.rstage[size_t(t.rslot)].data();
  }
  int acquire_wslot(int64_t i) {
    for (;;) {
      for (size_t k = 0; k < wslot_owner_.size(); ++k) {
        const int o = wslot_owner_[k];
        if (o < 0) {
          wslot_owner_[k] = int(i);
          return int(k);
        }
        auto& t = trip_[size_t(o)];
        if (t.wr_next == t.wr_r.size() && std::all_of(t.wr_f.begin(), t.wr_f.end(), [](auto& f) {
              return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
            })) {
          for (auto& f : t.wr_f) f.get();  // rethrows a write error
          wslot_owner_[k] = -1;
        }
      }
      if (std::find(wslot_owner_.begin(), wslot_owner_.end(), -1) != wslot_owner_.end()) continue;
      // None free: finish the oldest owner's writes now (host waits; counted as exposed).
      const int o = *std::min_element(wslot_owner_.begin(), wslot_owner_.end());
      const double t0 = now_seconds();
      auto& t = trip_[size_t(o)];
      while (t.wr_next < t.wr_r.size()) issue_write(o);
      for (auto& f : t.wr_f) f.get();
      I.add_span(kTrackHost, OpLabel{"nvme.staging_wait", cur_w_, o}, 0, t0, now_seconds(), mbi_);
    }
  }
  int acquire_rslot(int64_t i) {
    for (;;) {
      for (size_t k = 0; k < rslot_owner_.size(); ++k) {
        const int o = rslot_owner_[k];
        if (o < 0) {
          rslot_owner_[k] = int(i);
          if (rslot_free_ev_[k]) be.host_wait(rslot_free_ev_[k]);
          return int(k);
        }
        auto& t = trip_[size_t(o)];
        if (t.h2d_next == t.h2d_r.size() && be.done(t.h2d_last)) {
          rslot_free_ev_[k] = t.h2d_last;
          rslot_owner_[k] = -1;
        }
      }
      if (std::find(rslot_owner_.begin(), rslot_owner_.end(), -1) != rslot_owner_.end()) continue;
      const int o = *std::min_element(rslot_owner_.begin(), rslot_owner_.end());
      const double t0 = now_seconds();
      auto& t = trip_[size_t(o)];
      while (t.h2d_next < t.h2d_r.size()) issue_h2d(o);
      be.host_wait(t.h2d_last);
      I.add_span(kTrackHost, OpLabel{"nvme.staging_wait", cur_w_, o}, 0, t0, now_seconds(), mbi_);
    }
  }

  void issue_d2h(int64_t i) {
    auto& t = trip_[size_t(i)];
    if (t.d2h_next == 0 && P.tier[size_t(i)] == CkptTier::Nvme) t.wslot = acquire_wslot(i);
    const Range r = t.d2h_r[t.d2h_next++];
    const int64_t len = std::min(r.len, std::max<int64_t>(0, I.A - r.off));  // padding is not copied
    be.wait(Lane::D2H, produced_[size_t(i)]);
    if (len > 0)
      be.copy(Lane::D2H, static_cast<char*>(tier_host_ptr(i, true)) + r.off, static_cast<char*>(X(xbuf_[size_t(i)])) + r.off,
              len, lab("ckpt.d2h", int32_t(i)));
    t.d2h_ev.push_back(be.record(Lane::D2H));
  }
  static int64_t issued_bytes(const std::vector<Range>& r, size_t next) {
    return next == 0 ? 0 : r[next - 1].off + r[next - 1].len;
  }
  void issue_write(int64_t i) {
    auto& t = trip_[size_t(i)];
    const Range r = t.wr_r[t.wr_next++];
    // A range is written after its D2H: if the plan writes earlier, offload first.
    while (t.d2h_next < t.d2h_r.size() && issued_bytes(t.d2h_r, t.d2h_next) < r.off + r.len) issue_d2h(i);
    std::vector<Event> evs = t.d2h_ev;
    char* src = static_cast<char*>(tier_host_ptr(i, true)) + r.off;
    const OpLabel l{"nvme.write", cur_w_, int32_t(i)};
    NvmeStore* store = I.store.get();
    Executor::Impl* im = &I;
    Backend* bp = &be;
    const int32_t mbi = mbi_;
    t.wr_f.push_back(I.nvme_worker->submit([=] {
      for (auto& e : evs) bp->host_wait(e);
      const double t0 = now_seconds();
      store->write(i, r.off, src, r.len);
      im->add_span(kTrackNvmeWrite, l, r.len, t0, now_seconds(), mbi);
    }));
  }
  void issue_read(int64_t i) {
    auto& t = trip_[size_t(i)];
    if (t.rd_next == 0) {
      // The whole file must be on disk: every write issued (FIFO worker then orders read after write).
      while (t.wr_next < t.wr_r.size()) issue_write(i);
      t.rslot = acquire_rslot(i);
    }
    const Range r = t.rd_r[t.rd_next++];
    const bool last = t.rd_next == t.rd_r.size();
    char* dst = static_cast<char*>(I.rstage[size_t(t.rslot)].data()) + r.off;
    const OpLabel l{"nvme.read", cur_w_, int32_t(i)};
    NvmeStore* store = I.store.get();
    Executor::Impl* im = &I;
    const int32_t mbi = mbi_;
    const std::vector<std::shared_future<void>> writes = t.wr_f;
    t.rd_f.push_back(I.nvme_worker->submit([=] {
      for (auto& f : writes) f.get();  // a failed write is the error to report, not the missing file
      const double t0 = now_seconds();
      store->read(i, r.off, dst, r.len);
      if (last) store->remove(i);
      im->add_span(kTrackNvmeRead, l, r.len, t0, now_seconds(), mbi);
    }));
  }
  void issue_h2d(int64_t i) {
    auto& t = trip_[size_t(i)];
    if (t.h2d_next == 0) {
      if (!t.released) {  // reloaded in the window its offload ends: return the forward buffer first
        while (t.d2h_next < t.d2h_r.size()) issue_d2h(i);
        I.pool->release(xbuf_[size_t(i)], {t.d2h_ev.back(), use_done_[size_t(i)]});
        t.released = true;
      }
      xbuf_[size_t(i)] = I.pool->acquire(Lane::H2D);
    }
    const Range r = t.h2d_r[t.h2d_next++];
    if (P.tier[size_t(i)] == CkptTier::Nvme) {
      while (t.rd_next < t.rd_r.size() && issued_bytes(t.rd_r, t.rd_next) < r.off + r.len) issue_read(i);
      const double t0 = now_seconds();
      for (auto& f : t.rd_f) f.get();  // host waits for the read (rethrows I/O errors)
      const double t1 = now_seconds();
      if (t1 - t0 > 1e-4) I.add_span(kTrackHost, OpLabel{"nvme.read_wait", cur_w_, int32_t(i)}, 0, t0, t1, mbi_);
    } else {
      for (auto& e : t.d2h_ev) be.wait(Lane::H2D, e);
    }
    const int64_t len = std::min(r.len, std::max<int64_t>(0, I.A - r.off));
    if (len > 0)
      be.copy(Lane::H2D, static_cast<char*>(X(xbuf_[size_t(i)])) + r.off, static_cast<char*>(tier_host_ptr(i, false)) + r.off,
              len, lab("ckpt.h2d", int32_t(i)));
    t.h2d_last = be.record(Lane::H2D);
  }

  bool offloaded(int64_t i) const {
    return i < I.L && (P.tier[size_t(i)] == CkptTier::Cpu || P.tier[size_t(i)] == CkptTier::Nvme);
  }

  // Transfers assigned to window w (only boundaries already produced).
  void issue_window_transfers(int32_t w) {
    if (!train_) return;
    for (int64_t i = 0; i < I.L; ++i) {
      if (!offloaded(i)) continue;
      if (!produced_[size_t(i)]) continue;  // boundary 0 in window 0: after the embedding
      auto& t = trip_[size_t(i)];
      const auto& tr = I.traffic[size_t(i)];
      while (t.d2h_next < tr.d2h.size() && tr.d2h[t.d2h_next].window <= w) issue_d2h(i);
      while (t.wr_next < tr.nvme_write.size() && tr.nvme_write[t.wr_next].window <= w) issue_write(i);
      while (t.rd_next < tr.nvme_read.size() && tr.nvme_read[t.rd_next].window <= w) issue_read(i);
      while (t.h2d_next < tr.h2d.size() && tr.h2d[t.h2d_next].window <= w) issue_h2d(i);
    }
  }
  // After window w's compute: return forward buffers of offloaded boundaries whose D2H is all issued.
  void release_offloaded(int32_t w, const Event& win_end) {
    if (!train_) return;
    for (int64_t i = 0; i < I.L; ++i) {
      if (!offloaded(i) || !produced_[size_t(i)]) continue;
      auto& t = trip_[size_t(i)];
      if (t.released || t.d2h_next < t.d2h_r.size() || w < i) continue;
      I.pool->release(xbuf_[size_t(i)], {t.d2h_ev.back(), win_end});
      xbuf_[size_t(i)] = -1;
      t.released = true;
    }
  }

  // ---- gradients
  // Zeroes the buffer the backward accumulates unit's gradient into; a held buffer first waits until the
  // previous step's gradient left it.
  void zero_grad(int64_t unit, void* dst, int64_t bytes, bool held) {
    if (held) I.dgrads->before_write(unit);
    be.fill_zero(Lane::Compute, dst, bytes, lab("grad.zero", int32_t(unit)));
  }
  // Unit's gradient of this micro-batch is complete in dgrad: offloaded to the host or, held on the
  // device, its sum of squares taken (held_direct) or added into the unit's held accumulator (fp32 or
  // bf16; the sum of squares of the stored values with the last micro-batch's addition, as the host does).
  void grad_done(int64_t unit, void* dgrad, int64_t numel) {
    double* sumsq = I.d_scal.as<double>() + 2 + unit;
    if (!I.dgrads) return offload_grad(unit, dgrad, numel);
    if (I.held_direct) return be.grad_sumsq(dgrad, numel, sumsq, lab("grad.sumsq", int32_t(unit)));
    void* acc = I.dgrads->buffer(unit);
    const DType dt = I.dgrads->dtype();
    if (mbi_ == 0) zero_grad(unit, acc, numel * int64_t(dtype_size(dt)), true);
    be.grad_add(acc, dt, dgrad, numel, mbi_ + 1 == nmb_ ? sumsq : nullptr, lab("grad.add", int32_t(unit)));
  }
  // D2H of a unit's device gradient to the host; accumulation/conversion on the sink thread.
  void offload_grad(int64_t unit, void* dgrad, int64_t numel) {
    const int64_t bytes = numel * int64_t(I.g_sz);
    const bool direct = mbi_ == 0 && I.g_sz == 4;
    if (nmb_ == 1) be.grad_sumsq(dgrad, numel, I.d_scal.as<double>() + 2 + unit, lab("grad.sumsq", int32_t(unit)));
    const Event done_compute = be.record(Lane::Compute);
    be.wait(Lane::D2H, done_compute);
    if (direct) {
      be.copy(Lane::D2H, I.st.grad(unit), dgrad, bytes, lab("grad.d2h", int32_t(unit)));
      last_grad_d2h_ = be.record(Lane::D2H);
      return;
    }
    const int k = slab_next_++ % 2;
    if (slab_busy_[k].valid()) slab_busy_[k].get();
    be.copy(Lane::D2H, I.gslab[size_t(k)].data(), dgrad, bytes, lab("grad.d2h", int32_t(unit)));
    Event ev = be.record(Lane::D2H);
    last_grad_d2h_ = ev;
    float* dst = I.st.grad(unit);
    const void* src = I.gslab[size_t(k)].data();
    const bool assign = mbi_ == 0;
    const bool bf16 = I.g_sz == 2;
    // Last of several micro-batches: the sum of squares of the final gradient, in the same pass.
    double* sumsq = nmb_ > 1 && mbi_ + 1 == nmb_ ? &I.host_sumsq[size_t(unit)] : nullptr;
    Backend* bp = &be;
    slab_busy_[k] = I.sink_worker->submit([=] {
      bp->host_wait(ev);
      // dst = (assign ? 0 : dst) + src (fp32 slabs never assign: micro-batch 0 goes direct); the fp64
      // sum of squares only on the last micro-batch.
      auto accumulate = [&](auto load, bool with_sumsq) {
        double ss = 0;
        for (int64_t e = 0; e < numel; ++e) {
          dst[e] = (assign ? 0.0f : dst[e]) + load(e);
          if (with_sumsq) ss += double(dst[e]) * double(dst[e]);
        }
        return ss;
      };
      auto run = [&](auto load) {
        if (sumsq) *sumsq = accumulate(load, true);
        else accumulate(load, false);
      };
      if (bf16) {
        auto* s = static_cast<const bf16_t*>(src);
        run([s](int64_t e) { return bf16_to_f32(s[e]); });
      } else {
        auto* s = static_cast<const float*>(src);
        run([s](int64_t e) { return s[e]; });
      }
    });
  }
  int slab_next_ = 0;
  std::shared_future<void> slab_busy_[2];
  Event last_grad_d2h_;

 public:
  // After synchronize(): every host-side job of this micro-batch finished; rethrows their errors.
  void finish() {
    for (auto& f : slab_busy_)
      if (f.valid()) f.get();
    for (auto& t : trip_) {
      for (auto& f : t.wr_f) f.get();
      for (auto& f : t.rd_f) f.get();
    }
  }
};

// One micro-batch: inputs, the forward windows, the head, the backward blocks in reverse, the embedding's
// gradient (docs/executor.md, "Windows").
void MicroBatchRun::run() {
  begin();
  stage_inputs();
  if (P.embedding_resident && mbi_ == 0) upload_emb();
  if (P.head_resident && mbi_ == 0) upload_head();
  for (int64_t j = 0; j < I.L; ++j) forward_layer(j);
  t_forward_end = now_seconds();
  head();
  if (!train_) return;
  int32_t w = int32_t(I.L) + 1;
  for (size_t b = I.ck.size() - 1; b >= 1; --b) w = backward_block(I.ck[b - 1], I.ck[b], w);
  finish_embedding(w - 1);
}

void MicroBatchRun::begin() {
  const int64_t L = I.L;
  rs_ = train_ ? &I.ring_sched : &I.eval_sched;
  const int64_t nuse = int64_t(rs_->layer.size());
  use_done_.assign(size_t(nuse), nullptr);
  load_ready_.assign(size_t(nuse), nullptr);
  xbuf_.assign(size_t(L + 1), -1);
  produced_.assign(size_t(L + 1), nullptr);
  trip_.assign(size_t(L + 1), CkptTrip{});
  wslot_owner_.assign(I.wstage.size(), -1);
  rslot_owner_.assign(I.rstage.size(), -1);
  rslot_free_ev_.assign(I.rstage.size(), nullptr);
  if (!train_) return;
  for (int64_t i = 0; i < L; ++i)
    if (offloaded(i)) {
      auto& t = trip_[size_t(i)];
      const auto& tr = I.traffic[size_t(i)];
      t.d2h_r = share_ranges(tr.d2h, I.Apad);
      t.h2d_r = share_ranges(tr.h2d, I.Apad);
      t.wr_r = share_ranges(tr.nvme_write, I.Apad);
      t.rd_r = share_ranges(tr.nvme_read, I.Apad);
    }
}

// Window 0: token ids, targets, positions and segments up; the loss accumulators zeroed per step.
void MicroBatchRun::stage_inputs() {
  cur_w_ = 0;
  const int64_t T = I.T, ib = T * 4;
  std::memcpy(I.p_ids.data(), mb_.ids, size_t(ib));
  if (mb_.targets) std::memcpy(I.p_tgt.data(), mb_.targets, size_t(ib));
  else std::fill_n(I.p_tgt.as<int32_t>(), T, cpu::kIgnoreIndex);
  if (mb_.positions) std::memcpy(I.p_pos.data(), mb_.positions, size_t(ib));
  if (mb_.segments) std::memcpy(I.p_seg.data(), mb_.segments, size_t(ib));
  be.copy(Lane::H2D, I.d_ids.data(), I.p_ids.data(), ib, lab("inputs.h2d", -1));
  be.copy(Lane::H2D, I.d_tgt.data(), I.p_tgt.data(), ib, lab("inputs.h2d", -1));
  if (mb_.positions) be.copy(Lane::H2D, I.d_pos.data(), I.p_pos.data(), ib, lab("inputs.h2d", -1));
  if (mb_.segments) be.copy(Lane::H2D, I.d_seg.data(), I.p_seg.data(), ib, lab("inputs.h2d", -1));
  be.wait(Lane::Compute, be.record(Lane::H2D));
  if (mbi_ == 0) be.fill_zero(Lane::Compute, I.d_scal.data(), I.d_scal.bytes(), lab("scalars.zero", -1));
}

// Embedding and head weights: uploaded once per step (head in F_{L-1} when not resident; a tied,
// non-resident embedding at the start of the forward, embed_inputs).
void MicroBatchRun::upload_emb() {
  wait_update(0);
  be.copy(Lane::H2D, I.emb_w.data(), I.st.stream(0), I.emb_w.bytes(), lab("w.h2d", 0));
  emb_ready_ = be.record(Lane::H2D);
}
void MicroBatchRun::upload_head() {
  wait_update(I.L + 1);
  be.copy(Lane::H2D, I.head_w.data(), I.st.stream(I.L + 1), I.head_w.bytes(), lab("w.h2d", int32_t(I.L + 1)));
  head_ready_ = be.record(Lane::H2D);
}

// Boundary 0 in window 0: the lookup on the device (resident or tied embedding), or on the host from
// the streaming copy and then uploaded.
void MicroBatchRun::embed_inputs() {
  xbuf_[0] = I.pool->acquire(Lane::Compute);
  if (I.emb_on_device) {
    // A non-resident tied embedding is uploaded once per step, here, and looked up on the GPU; its
    // backward also runs there (B_0). The host gather this replaces took ~74 ms per micro-batch on
    // Qwen2.5-3B (32K random 4 KiB rows) against ~12 ms of upload.
    if (!P.embedding_resident && mbi_ == 0) upload_emb();
    be.wait(Lane::Compute, emb_ready_);
    be.embed_forward(I.emb_w.data(), I.d_ids.as<int32_t>(), I.T, X(xbuf_[0]), lab("embed.fwd", 0));
  } else {
    wait_update(0);
    const char* E = static_cast<const char*>(I.st.stream(0));
    const int64_t rowb = I.c.hidden * int64_t(I.act_sz);
    gather_rows(I.p_x0.as<char>(), E, mb_.ids, I.T, rowb);
    be.wait(Lane::H2D, be.record(Lane::Compute));  // xbuf_[0]'s previous readers (acquire made compute wait)
    be.copy(Lane::H2D, X(xbuf_[0]), I.p_x0.data(), I.A, lab("x0.h2d", 0));
    be.wait(Lane::Compute, be.record(Lane::H2D));
  }
  produced_[0] = be.record(Lane::Compute);
  issue_window_transfers(cur_w_);  // boundary 0's own transfers in window 0
}

// Window j of the forward: layer j, then boundary j dropped (none, or eval), kept (gpu), or returned
// once offloaded (cpu/nvme).
void MicroBatchRun::forward_layer(int64_t j) {
  cur_w_ = int32_t(j);
  issue_window_transfers(cur_w_);
  if (j == I.L - 1 && !P.head_resident && mbi_ == 0) upload_head();
  if (j == 0) embed_inputs();
  const void* w = weights_for_use();
  const int y = I.pool->acquire(Lane::Compute);
  for_chunks([&](int64_t r0, const DevGeometry& g) {
    be.layer_forward(j, w, g, row(X(xbuf_[size_t(j)]), r0), row(X(y), r0), lab("fwd", int32_t(j)));
  });
  end_use();
  const Event ev = use_done_[size_t(use_ - 1)];
  xbuf_[size_t(j + 1)] = y;
  produced_[size_t(j + 1)] = ev;
  if (!train_ || P.tier[size_t(j)] == CkptTier::None) {
    I.pool->release(xbuf_[size_t(j)], {ev});
    xbuf_[size_t(j)] = -1;
  }
  release_offloaded(cur_w_, ev);
}

// Window L: final norm, LM head and loss; in training the head's gradient and dY of the last layer.
void MicroBatchRun::head() {
  const int64_t L = I.L;
  const auto& lay = be.layout();
  cur_w_ = int32_t(L);
  issue_window_transfers(cur_w_);
  be.wait(Lane::Compute, head_ready_);
  if (I.emb_on_device) be.wait(Lane::Compute, emb_ready_);
  const char* lm_w = nullptr;
  char* d_lm_w = nullptr;
  if (I.c.tied) {
    lm_w = I.emb_w.as<char>();
    d_lm_w = static_cast<char*>(I.emb_grad);
  } else {
    const int64_t off = lay.head().find("lm_head.weight").offset;
    lm_w = I.head_w.as<char>() + off * int64_t(I.w_sz);
    d_lm_w = static_cast<char*>(I.head_grad) + off * int64_t(I.g_sz);
  }
  if (train_) {
    zero_grad(L + 1, I.head_grad, lay.head().numel * int64_t(I.g_sz), I.held_direct);
    // A tied head writes the embedding's gradient; an untied one's is zeroed before its own backward
    // (it may share the head's buffer: shared_head_embedding_grad).
    if (I.emb_on_device && I.c.tied) zero_grad(0, I.emb_grad, lay.embedding().numel * int64_t(I.g_sz), I.held_direct);
    dy_ = I.pool->acquire(Lane::Compute);
  }
  for_chunks([&](int64_t r0, const DevGeometry& g) {
    be.head_loss(I.head_w.data(), lm_w, I.d_tgt.as<int32_t>() + r0, g, row(X(xbuf_[size_t(L)]), r0), scale_,
                 train_ ? row(X(dy_), r0) : nullptr, train_ ? I.head_grad : nullptr, train_ ? d_lm_w : nullptr,
                 I.d_scal.as<double>(), lab("head", -1));
  });
  const Event ev = be.record(Lane::Compute);
  I.pool->release(xbuf_[size_t(L)], {ev});
  xbuf_[size_t(L)] = -1;
  release_offloaded(cur_w_, ev);
  if (train_) grad_done(L + 1, I.head_grad, lay.head().numel);
}

// Block [s, e) of the backward, from window w: its inner boundaries s+1 .. e-1 recomputed, then its
// layers' backward in reverse. Returns the next window.
int32_t MicroBatchRun::backward_block(int64_t s, int64_t e, int32_t w) {
  bool reloaded = false;
  for (int64_t j = s; j <= e - 2; ++j, ++w) {
    enter_block_window(s, w, reloaded);
    const void* wt = weights_for_use();
    const int y = I.pool->acquire(Lane::Compute);
    for_chunks([&](int64_t r0, const DevGeometry& g) {
      be.layer_forward(j, wt, g, row(X(xbuf_[size_t(j)]), r0), row(X(y), r0), lab("recompute", int32_t(j)));
    });
    end_use();
    xbuf_[size_t(j + 1)] = y;
  }
  for (int64_t j = e - 1; j >= s; --j, ++w) {
    enter_block_window(s, w, reloaded);
    backward_layer(j);
  }
  return w;
}

// Window w of block s: its transfers, and at the block's first window its input boundary back on the
// device (a late plan issues what is still missing of its reload now).
void MicroBatchRun::enter_block_window(int64_t s, int32_t w, bool& reloaded) {
  cur_w_ = w;
  issue_window_transfers(w);
  if (reloaded) return;
  reloaded = true;
  if (!offloaded(s)) return;
  auto& t = trip_[size_t(s)];
  while (t.h2d_next < t.h2d_r.size()) issue_h2d(s);
  be.wait(Lane::Compute, t.h2d_last);
}

// Layer j's backward into a gradient slot (or its held buffer); layer 0 also runs the embedding's
// backward when the table is on the device.
void MicroBatchRun::backward_layer(int64_t j) {
  const auto& lay = be.layout();
  const void* wt = weights_for_use();
  const int k = gslot_next_++ % 2;
  void* dw = I.held_direct ? I.dgrads->buffer(j + 1) : I.gslot[k].data();
  be.wait(Lane::Compute, gslot_free_[k]);
  zero_grad(j + 1, dw, lay.layer(j).numel * int64_t(I.g_sz), I.held_direct);
  const int dx = I.pool->acquire(Lane::Compute);
  for_chunks([&](int64_t r0, const DevGeometry& g) {
    be.layer_backward(j, wt, g, row(X(xbuf_[size_t(j)]), r0), row(X(dy_), r0), row(X(dx), r0), dw,
                      lab("bwd", int32_t(j)));
  });
  if (j == 0 && I.emb_on_device && !I.c.tied)
    zero_grad(0, I.emb_grad, lay.embedding().numel * int64_t(I.g_sz), I.held_direct);
  if (j == 0 && I.emb_on_device) be.embed_backward(I.d_ids.as<int32_t>(), I.T, X(dx), I.emb_grad, lab("embed.bwd", 0));
  end_use();
  const Event ev = use_done_[size_t(use_ - 1)];
  I.pool->release(xbuf_[size_t(j)], {ev});
  xbuf_[size_t(j)] = -1;
  I.pool->release(dy_, {ev});
  dy_ = dx;
  grad_done(j + 1, dw, lay.layer(j).numel);
  gslot_free_[k] = last_grad_d2h_;
}

// The embedding's gradient: on the device (resident or tied), else finished on the host from dx0
// (Executor::train_step).
void MicroBatchRun::finish_embedding(int32_t w) {
  cur_w_ = w;
  if (I.emb_on_device) {
    grad_done(0, I.emb_grad, be.layout().embedding().numel);
  } else {
    be.wait(Lane::D2H, be.record(Lane::Compute));
    be.copy(Lane::D2H, I.p_dx0.data(), X(dy_), I.A, lab("dx0.d2h", 0));
  }
  const Event last = be.record(Lane::Compute);
  I.pool->release(dy_, {last});
  dy_ = -1;
}

// ---------------------------------------------------------------------------------------- Executor

Executor::Executor(const ModelConfig& c, Backend& be, const ExecPlan& plan, HostState& state, ExecOptions opts)
    : cfg_(c), be_(be), plan_(plan), state_(state), opts_(std::move(opts)) {
  impl_ = std::make_unique<Impl>(*this);
}

Executor::~Executor() = default;

int64_t Executor::nvme_files_live() const { return impl_->store ? impl_->store->live_files() : 0; }

void Executor::flush_updates() {
  if (impl_->dgrads) impl_->dgrads->flush();
}

// After a failed step or eval: drain every lane and worker, drop this step's NVMe files, put gradients
// whose streaming failed back in line, forget the error.
void Executor::Impl::recover_from_failure() {
  try {
    be.synchronize();
  } catch (...) {
  }
  if (nvme_worker) nvme_worker->drain();
  sink_worker->drain();
  if (dgrads) dgrads->recover();  // before clear_error: a skipped copy must still read as failed
  if (store) store->remove_all();
  be.clear_error();
  pool->reset();
  pool->mark_reserved();
  be.take_spans();
}

// The step's per-unit sums of squares (device, or host where the host formed the gradient) into the
// host state; the update hook gets each unit (grad_ready, or grad_norm_part for a gradient held on the
// device), then the held gradients start streaming. Returns the global norm.
double Executor::Impl::report_gradients(int32_t nmb, UpdateHook* hook) {
  const double* sc = p_scal.as<double>();
  double total = 0;
  for (int64_t u = 0; u < L + 2; ++u) {
    const bool host = (u == 0 && !emb_on_device) || (!dgrads && nmb > 1);
    st.sumsq(u) = host ? host_sumsq[size_t(u)] : sc[2 + u];
    total += st.sumsq(u);
  }
  if (!hook) return std::sqrt(total);
  for (int64_t u = 0; u < L + 2; ++u) {
    if (dgrads && dgrads->held(u)) hook->grad_norm_part(u, st.sumsq(u));
    else hook->grad_ready(u, st.sumsq(u));
  }
  if (dgrads) dgrads->start(hook);
  return std::sqrt(total);
}


StepResult Executor::train_step(const std::vector<MicroBatch>& mbs) {
  Impl& I = *impl_;
  LT_CHECK(!mbs.empty(), "train_step: no micro-batches");
  StepResult res;
  const double t_step = now_seconds();
  const int64_t T = I.T, L = I.L;
  int64_t n_tok = 0;
  for (auto& mb : mbs) {
    LT_CHECK(mb.ids && mb.targets, "train_step: micro-batch without ids or targets");
    for (int64_t t = 0; t < T; ++t) n_tok += mb.targets[t] != cpu::kIgnoreIndex;
  }
  const float scale = 1.0f / float(std::max<int64_t>(1, n_tok));
  {
    std::lock_guard<std::mutex> g(I.trace_mu);
    I.trace.clear();
    I.trace_windows.clear();
    I.trace_t0 = t_step;
  }
  be_.take_spans();
  be_.memory().reset_peaks();
  const int32_t nmb = int32_t(mbs.size());
  LT_CHECK(!I.held_direct || nmb == 1, "train_step: {} micro-batches, but the gradients held on the device are "
           "sized for one (set ExecOptions::micro_batches)", nmb);
  if (!I.dgrads && (nmb > 1 || I.g_sz != 4)) {
    if (I.gslab.empty()) {
      int64_t mx = 0;
      for (auto& u : be_.layout().units) mx = std::max(mx, u.numel);
      for (int k = 0; k < 2; ++k) I.gslab.emplace_back(be_, MemKind::Pinned, mx * int64_t(I.g_sz), "grads.staging");
    }
  }
  std::vector<char> waited(size_t(L + 2), 0);
  double update_wait = 0;
  I.host_sumsq.assign(size_t(L + 2), 0.0);
  try {
    for (int32_t m = 0; m < nmb; ++m) {
      const double t_mb = now_seconds();
      MicroBatchRun run(I, mbs[size_t(m)], m, nmb, scale, true, hook_, waited, update_wait);
      run.run();
      be_.synchronize();
      run.finish();
      I.sink_worker->drain();
      if (!I.emb_on_device) I.host_embedding_backward(mbs[size_t(m)].ids, m == 0, m + 1 == nmb);
      const double t_end = now_seconds();
      I.collect_backend_spans(m);
      res.forward_s = run.t_forward_end - t_mb;
      res.backward_s = t_end - run.t_forward_end;
      auto ws = I.window_stats(m, t_mb);
      I.trace_windows.push_back(ws);
      for (auto& w : ws) {
        res.exposed_s += w.measured.exposed;
        res.exposed_optimizer_s += w.measured.exposed_optimizer;
        res.totals.compute += w.measured.compute;
        res.totals.h2d += w.measured.h2d;
        res.totals.d2h += w.measured.d2h;
        res.totals.nvme_read += w.measured.nvme_read;
        res.totals.nvme_write += w.measured.nvme_write;
        res.totals.exposed += w.measured.exposed;
        res.totals.exposed_optimizer += w.measured.exposed_optimizer;
      }
      if (m + 1 == nmb) res.windows = std::move(ws);
      if (I.pool->grown() > 0) {
        log_warn("executor: {} activation buffers beyond the planned {} (NVMe staging forced an early reload)",
                 I.pool->grown(), I.pool->size() - I.pool->grown());
        res.act_buffers_over_plan = std::max(res.act_buffers_over_plan, I.pool->grown());
      }
      I.pool->reset();
    }
    // Loss and per-unit sums of squares.
    be_.wait(Lane::D2H, be_.record(Lane::Compute));
    be_.copy(Lane::D2H, I.p_scal.data(), I.d_scal.data(), I.d_scal.bytes(), OpLabel{"scalars.d2h", -1, -1});
    be_.synchronize();
  } catch (const std::exception& e) {
    I.recover_from_failure();
    fail("train step failed: {}", e.what());
  }
  const double* sc = I.p_scal.as<double>();
  res.n_tokens = int64_t(sc[1]);
  res.loss = res.n_tokens > 0 ? sc[0] / double(res.n_tokens) : 0.0;
  res.rows = T * nmb;
  res.grad_norm = I.report_gradients(nmb, hook_);
  res.update_wait_s = update_wait;
  for (auto& w : res.windows) res.predicted_exposed_s += w.predicted.exposed * nmb;
  res.peak_device = be_.memory().peak(MemKind::Device);
  res.peak_pinned = be_.memory().peak(MemKind::Pinned);
  res.step_s = now_seconds() - t_step;
  return res;
}

double Executor::eval_loss(const MicroBatch& mb, int64_t* n_tokens) {
  Impl& I = *impl_;
  std::vector<char> waited(size_t(I.L + 2), 0);
  double uw = 0;
  try {
    MicroBatchRun run(I, mb, 0, 1, 1.0f, false, hook_, waited, uw);
    run.run();
    be_.wait(Lane::D2H, be_.record(Lane::Compute));
    be_.copy(Lane::D2H, I.p_scal.data(), I.d_scal.data(), 16, OpLabel{"scalars.d2h", -1, -1});
    be_.synchronize();
    I.pool->reset();
  } catch (const std::exception& e) {
    I.recover_from_failure();
    fail("eval failed: {}", e.what());
  }
  be_.take_spans();
  const double* sc = I.p_scal.as<double>();
  if (n_tokens) *n_tokens = int64_t(sc[1]);
  return sc[1] > 0 ? sc[0] / sc[1] : 0.0;
}

}  // namespace lt
