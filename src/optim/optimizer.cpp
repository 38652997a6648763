#include "optim/optimizer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cmath>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/split_master.h"
#include "optim/master_tiles.h"
#include "optim/nvme_moments.h"
#include "optim/quant8.h"
#include "optim/thread_pool.h"

namespace lt::optim {

const char* master_format_name(MasterFormat f) {
  switch (f) {
    case MasterFormat::F32: return "fp32";
    case MasterFormat::Split: return "split";
    case MasterFormat::Bf16Sr: return "bf16-sr";
  }
  return "?";
}

const char* state_format_name(StateFormat f) { return f == StateFormat::Q8 ? "8bit" : "fp32"; }

int64_t state_bytes(int64_t numel, StateFormat f) {
  if (f == StateFormat::F32) return numel * 8;
  int64_t blocks = (numel + kQ8Block - 1) / kQ8Block;
  return numel * 2 + blocks * 8;
}

float clip_coefficient(double total_norm, float max_norm) {
  if (max_norm <= 0) return 1.0f;
  // torch computes in fp32: clip_coef = max_norm / (total_norm + 1e-6); clamped to 1.
  float coef = max_norm / (float(total_norm) + 1e-6f);
  return coef < 1.0f ? coef : 1.0f;
}

double grad_sumsq(const float* g, int64_t n, Isa isa) { return sumsq(isa, g, n); }

double grad_sumsq_bf16(const bf16_t* g, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(bf16_to_f32(g[i])) * double(bf16_to_f32(g[i]));
  return s;
}

struct CpuAdamW::WorkItem {
  int unit;
  int tensor;
  int64_t begin, count;  // element range within the tensor (begin is a block multiple)
  AdamWScalars s;
  int64_t s_step;        // the AdamW step t this update makes (stochastic rounding's counter)
  bool first = false;    // one of the unit's first ranges (set_first_ranges)
};

CpuAdamW::CpuAdamW(std::vector<UnitSpec> units, AdamWConfig cfg)
    : units_(std::move(units)), cfg_(std::move(cfg)), isa_(resolve_isa(cfg_.isa)) {
  LT_CHECK(!cfg_.groups.empty(), "optimizer: no parameter groups");
  LT_CHECK(cfg_.beta1 >= 0 && cfg_.beta1 < 1, "optimizer: beta1 must be in [0,1), got {}", cfg_.beta1);
  LT_CHECK(cfg_.beta2 >= 0 && cfg_.beta2 < 1, "optimizer: beta2 must be in [0,1), got {}", cfg_.beta2);
  LT_CHECK(cfg_.eps > 0, "optimizer: eps must be > 0, got {}", cfg_.eps);
  LT_CHECK(cfg_.chunk_elems >= kQ8Block, "optimizer: chunk_elems must be >= {}, got {}", kQ8Block, cfg_.chunk_elems);
  cfg_.chunk_elems = cfg_.chunk_elems / kQ8Block * kQ8Block;
  state_.resize(units_.size());
  for (size_t u = 0; u < units_.size(); ++u) {
    const UnitSpec& us = units_[u];
    LT_CHECK(!us.remainders_on_nvme || (us.moments_on_nvme && cfg_.master == MasterFormat::Split),
             "optimizer: unit {} has its master remainders on NVMe, which needs its moments on NVMe too and split "
             "masters (MasterFormat::Split; these masters are {}, moments {})",
             u, master_format_name(cfg_.master), us.moments_on_nvme ? "on NVMe" : "in DRAM");
    state_[u].tensors.resize(us.tensors.size());
    for (size_t t = 0; t < us.tensors.size(); ++t) {
      const TensorSpec& ts = us.tensors[t];
      LT_CHECK(ts.numel > 0 && ts.offset >= 0 && ts.offset + ts.numel <= us.numel,
               "optimizer: unit {} tensor '{}' range [{}, {}) outside the unit's {} elements", u, ts.name,
               ts.offset, ts.offset + ts.numel, us.numel);
      LT_CHECK(ts.group >= 0 && size_t(ts.group) < cfg_.groups.size(),
               "optimizer: unit {} tensor '{}' group {} out of range (have {} groups)", u, ts.name, ts.group,
               cfg_.groups.size());
      TensorState& st = state_[u].tensors[t];
      if (us.moments_on_nvme) continue;  // in a file, staged through the NVMe tier's slots
      if (ts.format == StateFormat::F32) {
        st.m.reset(size_t(ts.numel), false);
        st.v.reset(size_t(ts.numel), false);
      } else {
        size_t blocks = size_t((ts.numel + kQ8Block - 1) / kQ8Block);
        st.mq.reset(size_t(ts.numel), false);
        st.vq.reset(size_t(ts.numel), false);
        st.ms.reset(blocks);
        st.vs.reset(blocks);
      }
    }
  }
  int threads = cfg_.threads > 0 ? cfg_.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  pool_ = std::make_unique<ThreadPool>(threads);
  zero_states();
  // More staging slots than NVMe units would hold DRAM for nothing (plan/state_bytes.cpp counts the same).
  const int n_nvme = int(std::count_if(units_.begin(), units_.end(), [](const UnitSpec& u) { return u.moments_on_nvme; }));
  if (n_nvme > 0)
    nvme_ = std::make_unique<NvmeMoments>(units_, cfg_.nvme_dir, cfg_.nvme_io, std::min(cfg_.nvme_slots, n_nvme),
                                          [this](const NvmeMoments::Event& e) {
                                            on_nvme_event(e.unit, e.write, e.ticket, e.slot, e.err);
                                          });
}

void CpuAdamW::zero_states() {
  // Zero the moments in chunks on the workers: faster than one thread for tens of GB. (Pages are first
  // touched by whichever worker takes a chunk: the pool has no affinity, so this is not NUMA placement.)
  std::mutex mu;
  std::condition_variable cv;
  int64_t left = 0;
  auto zero = [](void* p, size_t bytes) { std::memset(p, 0, bytes); };
  std::vector<std::pair<void*, size_t>> parts;
  for (auto& us : state_)
    for (auto& st : us.tensors) {
      const size_t chunk = size_t(cfg_.chunk_elems) * 4;
      auto add = [&](void* base, size_t bytes) {
        for (size_t o = 0; o < bytes; o += chunk) parts.emplace_back(static_cast<char*>(base) + o, std::min(chunk, bytes - o));
      };
      if (st.m.data()) add(st.m.data(), st.m.bytes());
      if (st.v.data()) add(st.v.data(), st.v.bytes());
      if (st.mq.data()) add(st.mq.data(), st.mq.bytes());
      if (st.vq.data()) add(st.vq.data(), st.vq.bytes());
    }
  left = int64_t(parts.size());
  for (auto& [p, n] : parts)
    pool_->push(0, [&, p = p, n = n] {
      zero(p, n);
      std::lock_guard<std::mutex> lk(mu);
      if (--left == 0) cv.notify_all();
    });
  std::unique_lock<std::mutex> lk(mu);
  cv.wait(lk, [&] { return left == 0; });
}

CpuAdamW::~CpuAdamW() {
  try {
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] {
      for (auto& s : state_)
        if (busy(s)) return false;
      return true;
    });
  } catch (...) {
  }
  nvme_.reset();  // before the pool: its last event may still arrive
  pool_.reset();
}

void CpuAdamW::begin_step(float lr) {
  std::lock_guard<std::mutex> lk(mu_);
  LT_CHECK(norm_known_, "optimizer: begin_step() before the previous step's gradient norm is known ({} of {} units "
                        "reported their partial sums)", reported_, units_.size());
  LT_CHECK(std::isfinite(lr) && lr >= 0, "optimizer: learning rate must be finite and >= 0, got {}", lr);
  for (auto& s : state_) {
    s.reported = false;
    s.submitted = false;
    s.sumsq = 0;
  }
  if (nvme_) nvme_begin_step_locked();  // start staging this step's NVMe moments, lowest unit first
  begun_ = true;
  in_step_ = true;
  norm_known_ = false;
  lr_ = lr;
  reported_ = 0;
  info_ = StepInfo{step_, 0, 1.0f, false};
  step_number_ = next_step_number_ > 0 ? next_step_number_ : step_ + stats_.skipped_steps + 1;
  next_step_number_ = 0;
}

void CpuAdamW::set_step_number(int64_t n) {
  std::lock_guard<std::mutex> lk(mu_);
  LT_CHECK(n > 0, "optimizer: step number must be > 0, got {}", n);
  next_step_number_ = n;
}

std::vector<int> CpuAdamW::nonfinite_units() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<int> out;
  for (size_t u = 0; u < state_.size(); ++u)
    if (state_[u].reported && !std::isfinite(state_[u].sumsq)) out.push_back(int(u));
  return out;
}

void CpuAdamW::add_grad_sumsq(int unit, double sumsq) {
  std::lock_guard<std::mutex> lk(mu_);
  LT_CHECK(unit >= 0 && size_t(unit) < units_.size(), "optimizer: unit {} out of range (have {})", unit,
           units_.size());
  LT_CHECK(in_step_ && !norm_known_, "optimizer: add_grad_sumsq({}) outside a step (call begin_step first)", unit);
  UnitState& us = state_[size_t(unit)];
  LT_CHECK(!us.reported, "optimizer: unit {} reported its gradient partial sum twice in one step", unit);
  us.reported = true;
  us.sumsq = sumsq;
  if (++reported_ == int(units_.size())) finish_norm_locked();
}

void CpuAdamW::finish_norm_locked() {
  // Sum in unit order, so the norm does not depend on the order the partial sums arrived in.
  double total = 0;
  for (auto& s : state_) total += s.sumsq;
  double norm = std::sqrt(total);
  norm_known_ = true;
  in_step_ = false;
  info_.grad_norm = norm;
  done_cv_.notify_all();  // waiters on held-back units re-check (a skipped step releases them at once)
  if (!std::isfinite(norm)) {
    info_.skipped = true;
    for (auto& us : state_) us.first_used = false;  // nothing pushed: wait_first waits for whatever still runs
    info_.clip_coef = 1.0f;
    info_.step = step_;
    ++stats_.skipped_steps;
    if (cfg_.on_nonfinite == NonFinitePolicy::Stop)
      fail("optimizer: non-finite gradient norm ({}) at step {}; stopping (on_nonfinite = stop)", norm, step_number_);
    // Debug only: the caller reports the skip (the trainer, with where the non-finite value first appears).
    log_debug("optimizer: non-finite gradient norm ({}) at step {}; update skipped ({} skipped so far)", norm,
              step_number_, stats_.skipped_steps);
    return;
  }
  info_.clip_coef = clip_coefficient(norm, cfg_.max_grad_norm);
  ++step_;
  ++stats_.steps;
  info_.step = step_;
  for (size_t u = 0; u < units_.size(); ++u)
    if (state_[u].submitted) enqueue_unit_locked(int(u));
}

AdamWScalars CpuAdamW::step_scalars(int unit, int tensor) const {
  std::lock_guard<std::mutex> lk(mu_);
  LT_CHECK(unit >= 0 && size_t(unit) < units_.size() && tensor >= 0 &&
               size_t(tensor) < units_[size_t(unit)].tensors.size(),
           "optimizer: step_scalars({}, {}) out of range", unit, tensor);
  LT_CHECK(norm_known_ && begun_ && !info_.skipped,
           "optimizer: step_scalars({}) before the step's norm is known, or for a skipped step", unit);
  const GroupHyper& gh = cfg_.groups[size_t(units_[size_t(unit)].tensors[size_t(tensor)].group)];
  return make_adamw_scalars(double(lr_) * double(gh.lr_scale), gh.weight_decay, cfg_.beta1, cfg_.beta2, cfg_.eps,
                            step_, info_.clip_coef);
}

std::pair<float*, float*> CpuAdamW::f32_moments(int unit, int tensor) {
  LT_CHECK(unit >= 0 && size_t(unit) < units_.size() && tensor >= 0 &&
               size_t(tensor) < units_[size_t(unit)].tensors.size(),
           "optimizer: f32_moments({}, {}) out of range", unit, tensor);
  const UnitSpec& u = units_[size_t(unit)];
  LT_CHECK(u.tensors[size_t(tensor)].format == StateFormat::F32 && !u.moments_on_nvme,
           "optimizer: '{}' has {} moments{}; only fp32 moments in DRAM have host arrays", u.tensors[size_t(tensor)].name,
           state_format_name(u.tensors[size_t(tensor)].format), u.moments_on_nvme ? " on NVMe" : "");
  TensorState& t = state_[size_t(unit)].tensors[size_t(tensor)];
  return {t.m.data(), t.v.data()};
}

MomentArrays CpuAdamW::host_moments(int unit, int tensor) {
  LT_CHECK(unit >= 0 && size_t(unit) < units_.size() && tensor >= 0 &&
               size_t(tensor) < units_[size_t(unit)].tensors.size(),
           "optimizer: host_moments({}, {}) out of range", unit, tensor);
  const UnitSpec& u = units_[size_t(unit)];
  LT_CHECK(!u.moments_on_nvme, "optimizer: '{}' has its moments on NVMe; only moments in DRAM have host arrays",
           u.tensors[size_t(tensor)].name);
  return arrays(unit, tensor);
}

bool CpuAdamW::is_8bit(int unit, int tensor) const {
  return units_.at(size_t(unit)).tensors.at(size_t(tensor)).format == StateFormat::Q8;
}

void CpuAdamW::submit(int unit, const UnitBuffers& bufs) {
  std::unique_lock<std::mutex> lk(mu_);
  LT_CHECK(unit >= 0 && size_t(unit) < units_.size(), "optimizer: unit {} out of range (have {})", unit,
           units_.size());
  LT_CHECK(begun_, "optimizer: submit({}) before begin_step()", unit);
  check_buffers(unit, bufs);
  UnitState& us = state_[size_t(unit)];
  LT_CHECK(!us.submitted, "optimizer: unit {} submitted twice in one step", unit);
  if (busy(us)) {  // the previous step's update of this unit is still running
    double t0 = now_seconds();
    done_cv_.wait(lk, [&] { return !busy(us); });
    stats_.exposed_wait_s += now_seconds() - t0;
  }
  us.submitted = true;
  us.bufs = bufs;
  if (norm_known_ && !info_.skipped) enqueue_unit_locked(unit);
}

void CpuAdamW::enqueue_unit_locked(int unit) {
  // The step's constants, fixed now: an NVMe unit's items are pushed when its read lands, which may be after the
  // next begin_step (a new lr, the clip factor reset).
  UnitState& us = state_[size_t(unit)];
  us.q_lr = lr_;
  us.q_clip = info_.clip_coef;
  us.q_step = step_;
  if (units_[size_t(unit)].moments_on_nvme && !nvme_enqueue_locked(unit)) return;  // pushed once staged
  push_items_locked(unit);
}

void CpuAdamW::push_items_locked(int unit) {
  UnitState& us = state_[size_t(unit)];
  const UnitSpec& spec = units_[size_t(unit)];
  std::vector<std::pair<int64_t, int64_t>> first;
  first.swap(us.first);  // for this update only
  us.first_used = false;
  for (size_t t = 0; t < spec.tensors.size(); ++t) {
    const TensorSpec& ts = spec.tensors[t];
    const GroupHyper& gh = cfg_.groups[size_t(ts.group)];
    double lr = double(us.q_lr) * double(gh.lr_scale);
    AdamWScalars s = make_adamw_scalars(lr, gh.weight_decay, cfg_.beta1, cfg_.beta2, cfg_.eps, us.q_step, us.q_clip);
    // The first ranges inside this tensor, block-aligned and merged, then the rest of it after every other unit.
    std::vector<std::pair<int64_t, int64_t>> mine;
    for (auto [a, b] : first) {
      a = std::max<int64_t>(a - ts.offset, 0), b = std::min<int64_t>(b - ts.offset, ts.numel);
      if (a >= b) continue;
      a = a / kQ8Block * kQ8Block, b = std::min(ts.numel, (b + kQ8Block - 1) / kQ8Block * kQ8Block);
      if (!mine.empty() && a <= mine.back().second) mine.back().second = std::max(mine.back().second, b);
      else mine.emplace_back(a, b);
    }
    if (mine.empty()) {
      push_range_locked(unit, int(t), s, 0, ts.numel, unit, false);
      continue;
    }
    int64_t at = 0;
    const int64_t last = int64_t(units_.size());
    us.first_used = true;
    for (auto [a, b] : mine) push_range_locked(unit, int(t), s, a, b, unit, true);
    for (auto [a, b] : mine) {
      push_range_locked(unit, int(t), s, at, a, last, false);
      at = b;
    }
    push_range_locked(unit, int(t), s, at, ts.numel, last, false);
  }
}

void CpuAdamW::push_range_locked(int unit, int tensor, const AdamWScalars& s, int64_t begin, int64_t end,
                                 int64_t priority, bool first) {
  UnitState& us = state_[size_t(unit)];
  for (int64_t b = begin; b < end; b += cfg_.chunk_elems) {
    WorkItem w{unit, tensor, b, std::min(cfg_.chunk_elems, end - b), s, us.q_step, first};
    ++us.pending;
    us.first_pending += first;
    pool_->push(priority, [this, w] { run_item(w); });
  }
}

void CpuAdamW::run_item(const WorkItem& w) {
  auto t0 = std::chrono::steady_clock::now();
  UnitState& us = state_[size_t(w.unit)];
  std::exception_ptr err;
  try {
    const TensorSpec& ts = units_[size_t(w.unit)].tensors[size_t(w.tensor)];
    const MomentArrays st = arrays(w.unit, w.tensor);
    const int64_t off = ts.offset + w.begin;
    UnitBuffers b = us.bufs;
    // Remainders in the NVMe image (UnitSpec::remainders_on_nvme): updated in the staging slot.
    if (units_[size_t(w.unit)].remainders_on_nvme) b.lo = image_remainders(us.nv.slot, nvme_->image(w.unit));
    if (cfg_.master == MasterFormat::F32 && b.grad) {  // the kernels' own format: no conversion
      bf16_t* out = b.bf16 ? b.bf16 + off : nullptr;
      update_range(ts, st, w, 0, b.master + off, b.grad + off, out, w.count);
    } else {
      run_tiles(w, b, off);
    }
  } catch (...) {
    err = std::current_exception();
  }
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  busy_ns_ += ns;
  params_done_ += w.count;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (err && !us.error) us.error = err;
    if (w.first && --us.first_pending == 0) done_cv_.notify_all();
    if (--us.pending == 0) {
      if (us.io) nvme_items_done_locked(w.unit);  // write the moments back; done when it lands
      done_cv_.notify_all();
    }
  }
}

MomentArrays CpuAdamW::arrays(int unit, int tensor) {
  if (units_[size_t(unit)].moments_on_nvme)
    return image_arrays(state_[size_t(unit)].nv.slot, units_[size_t(unit)], nvme_->image(unit), size_t(tensor));
  TensorState& st = state_[size_t(unit)].tensors[size_t(tensor)];
  return {st.m.data(), st.v.data(), st.mq.data(), st.vq.data(), st.ms.data(), st.vs.data()};
}

void CpuAdamW::check_buffers(int unit, const UnitBuffers& b) const {
  LT_CHECK((b.grad != nullptr) != (b.grad_bf16 != nullptr),
           "optimizer: submit({}) needs exactly one gradient buffer (fp32 or bf16)", unit);
  switch (cfg_.master) {
    case MasterFormat::F32:
      LT_CHECK(b.master && !b.lo, "optimizer: submit({}): fp32 masters need `master` (and no remainders)", unit);
      break;
    case MasterFormat::Split:
      if (units_[size_t(unit)].remainders_on_nvme)
        LT_CHECK(!b.master && b.bf16 && !b.lo,
                 "optimizer: submit({}): the unit's master remainders are in its NVMe image "
                 "(UnitSpec::remainders_on_nvme): pass `bf16` and no `lo`", unit);
      else
        LT_CHECK(!b.master && b.bf16 && b.lo, "optimizer: submit({}): split masters need `bf16` and `lo`", unit);
      break;
    case MasterFormat::Bf16Sr:
      LT_CHECK(!b.master && b.bf16 && !b.lo, "optimizer: submit({}): bf16-sr masters need `bf16` only", unit);
      break;
  }
}

// One kernel call over [w.begin + at, + n) of the tensor with fp32 p and g (block-aligned `at`).
void CpuAdamW::update_range(const TensorSpec& ts, const MomentArrays& st, const WorkItem& w, int64_t at, float* p,
                            const float* g, bf16_t* out, int64_t n) {
  const int64_t e = w.begin + at;
  if (ts.format == StateFormat::F32) {
    adamw_f32(isa_, w.s, p, g, st.m + e, st.v + e, out, n);
  } else {
    const int64_t blk = e / kQ8Block;
    adamw_q8(isa_, w.s, p, g, st.mq + e, st.vq + e, st.ms + blk, st.vs + blk, out, n);
  }
}

// Non-fp32 storage (master_tiles.h): per tile, fp32 master and gradient in scratch, the fp32 kernel,
// then the master back in its form. The fp32 values the kernel sees are exactly those of the F32
// format (Split rebuilds them bit-exactly), so Split masters equal F32 masters bit for bit. The AVX-512
// path (8-bit: with VBMI) converts inside the kernel instead (adamw_*_fused), with the same bits.
void CpuAdamW::run_tiles(const WorkItem& w, const UnitBuffers& b, int64_t off) {
  const TensorSpec& ts = units_[size_t(w.unit)].tensors[size_t(w.tensor)];
  const MomentArrays st = arrays(w.unit, w.tensor);
  const uint32_t key = sr_key(cfg_.sr_seed, uint64_t(w.s_step), uint64_t(w.unit));
  if (cfg_.fused_masters) {
    auto at = [off](auto* a) { return a ? a + off : nullptr; };
    const MasterIo io{at(b.master), at(b.bf16), at(b.lo), at(b.grad), at(b.grad_bf16), key, uint32_t(off)};
    const int64_t e = w.begin, blk = e / kQ8Block;
    if (ts.format == StateFormat::F32 ? adamw_f32_fused(isa_, w.s, cfg_.master, io, st.m + e, st.v + e, w.count)
                                      : adamw_q8_fused(isa_, w.s, cfg_.master, io, st.mq + e, st.vq + e,
                                                       st.ms + blk, st.vs + blk, w.count))
      return;
  }
  alignas(64) float pt[kMasterTile];
  alignas(64) float gt[kMasterTile];
  for (int64_t at = 0; at < w.count; at += kMasterTile) {
    const int64_t n = std::min(kMasterTile, w.count - at), o = off + at;
    float* p = b.master ? b.master + o : pt;
    if (cfg_.master == MasterFormat::Split) join_tile(b.bf16 + o, b.lo + o, pt, n);
    if (cfg_.master == MasterFormat::Bf16Sr) widen_tile(b.bf16 + o, pt, n);
    const float* g = b.grad ? b.grad + o : gt;
    if (b.grad_bf16) widen_tile(b.grad_bf16 + o, gt, n);
    bf16_t* out = cfg_.master == MasterFormat::F32 && b.bf16 ? b.bf16 + o : nullptr;
    update_range(ts, st, w, at, p, g, out, n);
    if (cfg_.master == MasterFormat::Split) split_tile(pt, b.bf16 + o, b.lo + o, n);
    if (cfg_.master == MasterFormat::Bf16Sr)
      round_tile_sr(pt, b.bf16 + o, n, key, uint32_t(o));
  }
}

void CpuAdamW::wait(int unit) {
  LT_CHECK(unit >= 0 && size_t(unit) < units_.size(), "optimizer: unit {} out of range (have {})", unit,
           units_.size());
  std::unique_lock<std::mutex> lk(mu_);
  UnitState& us = state_[size_t(unit)];
  // Done when nothing of the unit is queued or running, and a submitted update is not still held back
  // waiting for the global norm (it blocks until the last partial sum arrives, from another thread).
  auto done = [&] { return !busy(us) && !(us.submitted && !norm_known_); };
  if (!done()) {
    double t0 = now_seconds();
    done_cv_.wait(lk, done);
    stats_.exposed_wait_s += now_seconds() - t0;
  }
  if (us.error) {
    std::exception_ptr e = us.error;
    us.error = nullptr;
    std::rethrow_exception(e);
  }
}

void CpuAdamW::set_first_ranges(int unit, std::vector<std::pair<int64_t, int64_t>> ranges) {
  LT_CHECK(unit >= 0 && size_t(unit) < units_.size(), "optimizer: unit {} out of range (have {})", unit,
           units_.size());
  std::sort(ranges.begin(), ranges.end());
  std::lock_guard<std::mutex> lk(mu_);
  if (units_[size_t(unit)].moments_on_nvme) return;  // its update is one staged image: no order inside it
  state_[size_t(unit)].first = std::move(ranges);
}

void CpuAdamW::wait_first(int unit) {
  LT_CHECK(unit >= 0 && size_t(unit) < units_.size(), "optimizer: unit {} out of range (have {})", unit,
           units_.size());
  {
    std::unique_lock<std::mutex> lk(mu_);
    UnitState& us = state_[size_t(unit)];
    // Its items are pushed (the first ranges among them) once the norm is known; the latest pushed update ran
    // first ranges or not (first_used; ranges set since are for the next update: the executor hints the next step's
    // rows before this step's lookup waits here). None, or a skipped step: the whole update, as wait().
    auto held = [&] { return us.submitted && !norm_known_; };
    auto done = [&] { return !held() && (us.error || (us.first_used ? us.first_pending == 0 : !busy(us))); };
    if (!done()) {
      double t0 = now_seconds();
      done_cv_.wait(lk, done);
      stats_.exposed_wait_s += now_seconds() - t0;
    }
    if (!us.error) return;
  }
  wait(unit);  // rethrows the worker's error once the unit's items are done
}

void CpuAdamW::wait_all() {
  for (size_t u = 0; u < units_.size(); ++u) wait(int(u));
}

StepInfo CpuAdamW::step(float lr, const std::vector<UnitBuffers>& bufs) {
  LT_CHECK(bufs.size() == units_.size(), "optimizer: step() got {} unit buffers, expected {}", bufs.size(),
           units_.size());
  begin_step(lr);
  for (size_t u = 0; u < units_.size(); ++u) {
    const UnitBuffers& b = bufs[u];
    LT_CHECK(b.grad || b.grad_bf16, "optimizer: step() unit {} has no gradient buffer", u);
    add_grad_sumsq(int(u), b.grad ? grad_sumsq(b.grad, units_[u].numel, isa_) : grad_sumsq_bf16(b.grad_bf16, units_[u].numel));
  }
  for (size_t u = 0; u < units_.size(); ++u) submit(int(u), bufs[u]);
  wait_all();
  return last_step();
}

bool CpuAdamW::norm_known() const {
  std::lock_guard<std::mutex> lk(mu_);
  return norm_known_;
}

StepInfo CpuAdamW::last_step() const {
  std::lock_guard<std::mutex> lk(mu_);
  return info_;
}

UpdaterStats CpuAdamW::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  UpdaterStats s = stats_;
  s.busy_s = double(busy_ns_.load()) * 1e-9;
  s.params_updated = params_done_.load();
  if (nvme_) {
    const NvmeIoStats io = nvme_->stats();
    s.nvme_read_bytes = io.read_bytes;
    s.nvme_write_bytes = io.write_bytes;
    s.nvme_io_s = io.io_s;
  }
  return s;
}

int64_t CpuAdamW::state_bytes() const {
  int64_t b = 0;
  for (auto& u : units_)
    for (auto& t : u.tensors) b += optim::state_bytes(t.numel, t.format);
  return b;
}

void CpuAdamW::read_state(int unit, int tensor, std::vector<float>& m, std::vector<float>& v) const {
  LT_CHECK(unit >= 0 && size_t(unit) < units_.size() && tensor >= 0 &&
               size_t(tensor) < units_[size_t(unit)].tensors.size(),
           "optimizer: read_state({}, {}) out of range", unit, tensor);
  const TensorSpec& ts = units_[size_t(unit)].tensors[size_t(tensor)];
  IoBuffer image;  // NVMe moments: the unit's file, read here
  MomentArrays st;
  if (units_[size_t(unit)].moments_on_nvme) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      LT_CHECK(!busy(state_[size_t(unit)]), "optimizer: read_state({}) while the unit's update is in flight", unit);
      LT_CHECK(!state_[size_t(unit)].nv.lost, "optimizer: read_state({}): the unit's NVMe moments were lost in a "
               "failed write-back at step {}; resume from the last checkpoint", unit, state_[size_t(unit)].nv.step);
    }
    image = IoBuffer(nvme_->image(unit).bytes);
    nvme_->read_image(unit, image.data());
    st = image_arrays(image.data(), units_[size_t(unit)], nvme_->image(unit), size_t(tensor));
  } else {
    st = const_cast<CpuAdamW*>(this)->arrays(unit, tensor);
  }
  m.resize(size_t(ts.numel));
  v.resize(size_t(ts.numel));
  if (ts.format == StateFormat::F32) {
    std::copy(st.m, st.m + ts.numel, m.begin());
    std::copy(st.v, st.v + ts.numel, v.begin());
    return;
  }
  const QuantMap& qm = signed_dynamic_map();
  const QuantMap& qv = unsigned_dynamic_map();
  for (int64_t i = 0; i < ts.numel; ++i) {
    m[size_t(i)] = dequantize_one(qm, st.mq[size_t(i)], st.ms[size_t(i / kQ8Block)]);
    v[size_t(i)] = dequantize_one(qv, st.vq[size_t(i)], st.vs[size_t(i / kQ8Block)]);
  }
}

}  // namespace lt::optim
