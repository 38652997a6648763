// The checkpoints' trips through the CPU and NVMe tiers within one micro-batch: D2H shares, NVMe writes
// and reads through the staging slots, H2D shares, each issued in the window the plan assigns it
// (docs/executor.md, "Checkpoint traffic").
#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/timer.h"
#include "exec/micro_batch_run.h"

namespace lt {

// Byte ranges of a share list over a padded boundary of `pad` bytes (rounded to kIoAlign).
std::vector<CkptRange> share_ranges(const std::vector<ExecPlan::Share>& sh, int64_t pad) {
  std::vector<CkptRange> r;
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

void* MicroBatchRun::tier_host_ptr(int64_t i, bool write_side) {
  if (P.tier[size_t(i)] == CkptTier::Cpu) return I.cpu_ckpt[size_t(i)].data();
  auto& t = trip_[size_t(i)];
  return write_side ? I.wstage[size_t(t.wslot)].data() : I.rstage[size_t(t.rslot)].data();
}

int MicroBatchRun::acquire_wslot(int64_t i) {
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

int MicroBatchRun::acquire_rslot(int64_t i) {
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

void MicroBatchRun::issue_d2h(int64_t i) {
  auto& t = trip_[size_t(i)];
  if (t.d2h_next == 0 && P.tier[size_t(i)] == CkptTier::Nvme) t.wslot = acquire_wslot(i);
  const CkptRange r = t.d2h_r[t.d2h_next++];
  const int64_t len = std::min(r.len, std::max<int64_t>(0, I.A - r.off));  // padding is not copied
  be.wait(Lane::D2H, produced_[size_t(i)]);
  if (len > 0)
    be.copy(Lane::D2H, static_cast<char*>(tier_host_ptr(i, true)) + r.off, static_cast<char*>(X(xbuf_[size_t(i)])) + r.off,
            len, lab("ckpt.d2h", int32_t(i)));
  t.d2h_ev.push_back(be.record(Lane::D2H));
}

int64_t MicroBatchRun::issued_bytes(const std::vector<CkptRange>& r, size_t next) {
  return next == 0 ? 0 : r[next - 1].off + r[next - 1].len;
}

void MicroBatchRun::issue_write(int64_t i) {
  auto& t = trip_[size_t(i)];
  const CkptRange r = t.wr_r[t.wr_next++];
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

void MicroBatchRun::issue_read(int64_t i) {
  auto& t = trip_[size_t(i)];
  if (t.rd_next == 0) {
    // The whole file must be on disk: every write issued (FIFO worker then orders read after write).
    while (t.wr_next < t.wr_r.size()) issue_write(i);
    t.rslot = acquire_rslot(i);
  }
  const CkptRange r = t.rd_r[t.rd_next++];
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

void MicroBatchRun::issue_h2d(int64_t i) {
  auto& t = trip_[size_t(i)];
  if (t.h2d_next == 0) {
    if (!t.released) {  // reloaded in the window its offload ends: return the forward buffer first
      while (t.d2h_next < t.d2h_r.size()) issue_d2h(i);
      I.pool->release(xbuf_[size_t(i)], {t.d2h_ev.back(), use_done_[size_t(i)]});
      t.released = true;
    }
    xbuf_[size_t(i)] = I.pool->acquire(Lane::H2D);
  }
  const CkptRange r = t.h2d_r[t.h2d_next++];
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

void MicroBatchRun::issue_window_transfers(int32_t w) {
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

void MicroBatchRun::release_offloaded(int32_t w, const Event& win_end) {
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

}  // namespace lt
