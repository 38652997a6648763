// One micro-batch's schedule (micro_batch_run.h): the phases of run(), the weight loads through the
// ring, and where each unit's gradient goes.
#include "exec/micro_batch_run.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/timer.h"
#include "exec/gather_rows.h"
#include "model/sequence.h"

namespace lt {

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
  else std::fill_n(I.p_tgt.as<int32_t>(), T, kIgnoreIndex);
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
  if (const DeviceUpdate* d = I.device_update(0); d && d->loaded()) {  // updated in place (set_update_hook loaded it)
    emb_ready_ = be.record(Lane::Compute);
    return;
  }
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
    wait_update(0, lookup_rows_first());  // only the rows it gathers, when they were updated first
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
    void* keep = train_ ? I.keep_for(j, r0) : nullptr;
    if (keep) be.layer_forward_keep(j, w, g, row(X(xbuf_[size_t(j)]), r0), row(X(y), r0), keep, lab("fwd", int32_t(j)));
    else be.layer_forward(j, w, g, row(X(xbuf_[size_t(j)]), r0), row(X(y), r0), lab("fwd", int32_t(j)));
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

const char* MicroBatchRun::lm_weights() const {
  if (I.c.tied) return I.emb_w.as<char>();
  return I.head_w.as<char>() + be.layout().head().find("lm_head.weight").offset * int64_t(I.w_sz);
}

// Window L: final norm, LM head and loss; in training the head's gradient and dY of the last layer.
void MicroBatchRun::head() {
  const int64_t L = I.L;
  cur_w_ = int32_t(L);
  issue_window_transfers(cur_w_);
  be.wait(Lane::Compute, head_ready_);
  if (I.emb_on_device) be.wait(Lane::Compute, emb_ready_);
  const bool sliced = train_ && I.head_slices;
  if (sliced) head_by_slices(lm_weights());
  else head_with_grads();
  const Event ev = be.record(Lane::Compute);
  I.pool->release(xbuf_[size_t(L)], {ev});
  xbuf_[size_t(L)] = -1;
  release_offloaded(cur_w_, ev);
  if (train_ && !sliced) grad_done(L + 1, I.head_grad, be.layout().head().numel);
}

// The head's loss and, in training, its gradient in head_grad (and emb_grad when tied).
void MicroBatchRun::head_with_grads() {
  const int64_t L = I.L;
  const auto& lay = be.layout();
  const char* lm_w = lm_weights();
  char* d_lm_w = I.c.tied ? static_cast<char*>(I.emb_grad)
                          : static_cast<char*>(I.head_grad) + lay.head().find("lm_head.weight").offset * int64_t(I.g_sz);
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
  DeviceUpdate* du = I.device_update(j + 1);
  void* dw = I.held_direct ? I.dgrads->buffer(j + 1) : du && nmb_ == 1 ? du->grad_target() : I.gslot[k].data();
  be.wait(Lane::Compute, gslot_free_[k]);
  zero_grad(j + 1, dw, lay.layer(j).numel * int64_t(I.g_sz), I.held_direct);
  const int dx = I.pool->acquire(Lane::Compute);
  for_chunks([&](int64_t r0, const DevGeometry& g) {
    const void* x = row(X(xbuf_[size_t(j)]), r0);
    if (void* keep = I.keep_for(j, r0))
      be.layer_backward_kept(j, wt, g, x, row(X(dy_), r0), row(X(dx), r0), dw, keep, lab("bwd", int32_t(j)));
    else be.layer_backward(j, wt, g, x, row(X(dy_), r0), row(X(dx), r0), dw, lab("bwd", int32_t(j)));
  });
  if (j == 0 && I.emb_on_device) embed_backward(X(dx));
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
    if (!I.head_slices) grad_done(0, I.emb_grad, be.layout().embedding().numel);  // else done in embed_backward
  } else {
    be.wait(Lane::D2H, be.record(Lane::Compute));
    be.copy(Lane::D2H, I.p_dx0.data(), X(dy_), I.A, lab("dx0.d2h", 0));
  }
  const Event last = be.record(Lane::Compute);
  I.pool->release(dy_, {last});
  dy_ = -1;
}

DevGeometry MicroBatchRun::geom(int64_t s0, int64_t ns) const {
  DevGeometry g;
  g.batch = ns;
  g.seq = P.seq;
  if (mb_.positions) g.positions = I.d_pos.as<int32_t>() + s0 * P.seq;
  if (mb_.segments) {
    g.segments = I.d_seg.as<int32_t>() + s0 * P.seq;
    for (int64_t b = s0; b < s0 + ns; ++b) {
      g.runs += seg_runs_[size_t(b)];
      g.longest_run = std::max(g.longest_run, seg_longest_[size_t(b)]);
    }
  }
  return g;
}

void MicroBatchRun::count_segment_runs() {
  if (!mb_.segments) return;
  const int64_t B = P.batch, S = P.seq;
  seg_runs_.assign(size_t(B), 0);
  seg_longest_.assign(size_t(B), 0);
  for (int64_t b = 0; b < B; ++b) {
    for_each_segment_run(mb_.segments + b * S, S, [&](int64_t begin, int64_t end) {
      ++seg_runs_[size_t(b)];
      seg_longest_[size_t(b)] = std::max(seg_longest_[size_t(b)], end - begin);
    });
  }
}

void MicroBatchRun::wait_update(int64_t unit, bool first_only) {
  if (!hook_ || waited_[size_t(unit)]) return;
  const double t0 = now_seconds();
  if (I.dgrads) I.dgrads->before_wait(unit);  // a device-held gradient reached the hook
  if (first_only) hook_->wait_first(unit);
  else hook_->wait(unit);
  if (I.dgrads) I.dgrads->after_wait(unit);   // its staging slot takes the next gradient
  const double t1 = now_seconds();
  if (!first_only) waited_[size_t(unit)] = 1;  // a later reader of the whole unit still waits for all of it
  update_wait_ += t1 - t0;
  I.add_span(kTrackHost, OpLabel{kOptimizerWaitLabel, cur_w_, int32_t(unit)}, 0, t0, t1, mbi_);
}

bool MicroBatchRun::lookup_rows_first() const {
  // Training only: the hinted rows are this step's batch's (an evaluation between steps reads other rows, and the
  // latest update's first ranges are already the next step's).
  const auto& rows = I.first_rows_active;
  if (!train_ || rows.empty()) return false;
  for (int64_t t = 0; t < I.T; ++t) {
    const int32_t r = mb_.ids[t];
    if (r < 0 || size_t(r) >= rows.size() || !rows[size_t(r)]) return false;
  }
  return true;
}

void MicroBatchRun::issue_loads(int64_t upto) {
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
    if (resident_weights(layer)) {  // updated on the device: its weights are there already, the slot stays unused
      load_ready_[size_t(next_load_++)] = be.record(Lane::Compute);
      continue;
    }
    wait_update(layer + 1);
    if (ev_after >= 0) be.wait(Lane::H2D, use_done_[size_t(ev_after)]);
    // The layer's own size: slots hold the largest layer kind, the host copy only this layer.
    be.copy(Lane::H2D, I.ring[size_t(r.slot[size_t(next_load_)])].data(), I.st.stream(layer + 1),
            I.st.numel(layer + 1) * int64_t(I.w_sz), lab("w.h2d", int32_t(layer)));
    load_ready_[size_t(next_load_)] = be.record(Lane::H2D);
    ++next_load_;
  }
}

const void* MicroBatchRun::weights_for_use() {
  const auto& r = *rs_;
  issue_loads(use_);
  LT_CHECK(next_load_ > r.loader[size_t(use_)], "executor: weight load for use {} not issued", use_);
  be.wait(Lane::Compute, load_ready_[size_t(r.loader[size_t(use_)])]);
  if (const void* w = resident_weights(r.layer[size_t(use_)])) return w;
  return I.ring[size_t(r.slot[size_t(use_)])].data();
}

const void* MicroBatchRun::resident_weights(int64_t layer) const {
  const DeviceUpdate* d = I.device_update(layer + 1);
  return d && d->loaded() ? d->weights() : nullptr;
}

void MicroBatchRun::end_use() {
  use_done_[size_t(use_)] = be.record(Lane::Compute);
  ++use_;
  issue_loads(use_ + P.ring - 1);
}

void MicroBatchRun::zero_grad(int64_t unit, void* dst, int64_t bytes, bool held) {
  if (held) I.dgrads->before_write(unit);
  be.fill_zero(Lane::Compute, dst, bytes, lab("grad.zero", int32_t(unit)));
}

void MicroBatchRun::grad_done(int64_t unit, void* dgrad, int64_t numel) {
  double* sumsq = I.d_scal.as<double>() + 2 + unit;
  if (I.updated_on_device(unit)) {  // stays on the device: summed over several micro-batches as the host would
    if (nmb_ == 1) return be.grad_sumsq(dgrad, numel, sumsq, lab("grad.sumsq", int32_t(unit)));
    float* acc = I.device_update(unit)->accumulator();
    LT_CHECK(acc, "train_step: {} micro-batches, but the device update of unit {} is sized for one (set "
             "ExecOptions::micro_batches)", nmb_, unit);
    if (mbi_ == 0) zero_grad(unit, acc, numel * 4, false);
    be.grad_add(acc, DType::F32, dgrad, numel, mbi_ + 1 == nmb_ ? sumsq : nullptr, lab("grad.add", int32_t(unit)));
    return;
  }
  if (!I.dgrads) return offload_grad(unit, dgrad, numel);
  if (I.held_direct) return be.grad_sumsq(dgrad, numel, sumsq, lab("grad.sumsq", int32_t(unit)));
  void* acc = I.dgrads->buffer(unit);
  const DType dt = I.dgrads->dtype();
  if (mbi_ == 0) zero_grad(unit, acc, numel * int64_t(dtype_size(dt)), true);
  be.grad_add(acc, dt, dgrad, numel, mbi_ + 1 == nmb_ ? sumsq : nullptr, lab("grad.add", int32_t(unit)));
}

// Gradients on the host in bf16: the unit's gradient in pieces of the largest layer, each rounded on the compute lane
// into a zeroed bf16 buffer by Backend::grad_add (the held bf16 path's rounding; its sum of squares, over the rounded
// values, into the unit's scalar) and copied down into the host gradient; a buffer is reused once its copy is done.
void MicroBatchRun::offload_grad_bf16(int64_t unit, const void* dgrad, int64_t numel) {
  const int64_t piece = I.g16[0].bytes() / 2;
  double* sumsq = I.d_scal.as<double>() + 2 + unit;
  bf16_t* dst = I.st.grad_bf16(unit);
  LT_CHECK(dst, "internal: unit {} has no bf16 host gradient", unit);
  for (int64_t off = 0; off < numel; off += piece) {
    const int64_t n = std::min(piece, numel - off);
    const int k = I.g16_next++ % 2;
    if (I.g16_free[k]) be.wait(Lane::Compute, I.g16_free[k]);
    be.fill_zero(Lane::Compute, I.g16[k].data(), n * 2, lab("grad.zero", int32_t(unit)));
    be.grad_add(I.g16[k].data(), DType::BF16, static_cast<const char*>(dgrad) + off * int64_t(I.g_sz), n, sumsq,
                lab("grad.round", int32_t(unit)));
    be.wait(Lane::D2H, be.record(Lane::Compute));
    be.copy(Lane::D2H, dst + off, I.g16[k].data(), n * 2, lab("grad.d2h", int32_t(unit)));
    last_grad_d2h_ = I.g16_free[k] = be.record(Lane::D2H);
  }
}

void MicroBatchRun::offload_grad(int64_t unit, void* dgrad, int64_t numel) {
  if (I.host_bf16) return offload_grad_bf16(unit, dgrad, numel);
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

void MicroBatchRun::prepare() {
  for_chunks([&](int64_t, const DevGeometry& g) { be.prepare_geometry(g); });
}

void MicroBatchRun::finish() {
  for (auto& f : slab_busy_)
    if (f.valid()) f.get();
  for (auto& t : trip_) {
    for (auto& f : t.wr_f) f.get();
    for (auto& f : t.rd_f) f.get();
  }
}

}  // namespace lt
