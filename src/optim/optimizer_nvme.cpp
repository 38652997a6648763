// CpuAdamW's side of the NVMe moment tier (optim/nvme_moments.h): which reads to request, when an
// update may run, the write-back, and what an I/O error leaves behind.
//
// Per NVMe unit and step: begin_step requests the read (lowest unit first; a unit whose previous
// write-back is still in flight is requested when it lands) -> the read lands in a staging slot ->
// once the unit is submitted and the norm is known its work items run on the slot -> the last item
// queues the write-back -> it lands, the slot frees, wait(u) returns. A requested unit that is not
// updated (skipped step, unit not submitted) is released unwritten at the next begin_step/save/load.
//
// Faults (lt::Error from wait(u), naming the file, the bytes and the cause):
//   read fails   the unit's master, bf16 copy and moments are unchanged (its update did not run);
//                other units of the step were updated, so the run resumes from the last checkpoint.
//   write fails  the unit's master and bf16 copy were updated, its updated moments are lost (the
//                failed file is removed); later updates, save() and read_state() of the unit refuse
//                with the same advice until load() restores it.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "optim/nvme_moments.h"
#include "optim/optimizer.h"

namespace lt::optim {

namespace {
std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}
std::exception_ptr error_ptr(std::string msg) { return std::make_exception_ptr(Error(std::move(msg))); }
}  // namespace

void CpuAdamW::nvme_request_locked(int unit) {
  NvmeUnit& nv = state_[size_t(unit)].nv;
  nv.ticket = nvme_->prefetch(unit);
  nv.requested = true;
  nv.loaded = false;
  nv.slot = nullptr;
}

void CpuAdamW::nvme_release_leftovers_locked() {
  for (size_t u = 0; u < units_.size(); ++u) {
    NvmeUnit& nv = state_[u].nv;
    if (!units_[u].moments_on_nvme || state_[u].io || !nv.requested) continue;
    nvme_->release(int(u));
    nv.requested = nv.loaded = false;
    nv.slot = nullptr;
  }
}

void CpuAdamW::nvme_begin_step_locked() {
  nvme_release_leftovers_locked();
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!units_[u].moments_on_nvme) continue;
    UnitState& us = state_[u];
    us.nv.read_error = nullptr;
    if (us.nv.lost) continue;
    if (us.io) us.nv.want = true;  // the previous step's write-back has not landed yet
    else nvme_request_locked(int(u));
  }
}

bool CpuAdamW::nvme_enqueue_locked(int unit) {
  UnitState& us = state_[size_t(unit)];
  NvmeUnit& nv = us.nv;
  if (nv.lost) {
    us.error = error_ptr(fmt::format("optimizer: the NVMe moments of unit {} were lost in a failed write-back at step "
                                     "{}; unit {} was not updated in step {}: resume from the last checkpoint",
                                     unit, nv.step, unit, step_));
    return false;
  }
  if (nv.read_error) {
    us.error = error_ptr(fmt::format("optimizer: reading the NVMe moments of unit {} failed: {}; unit {}'s master, bf16 "
                                     "copy and moments were not updated in step {} (other units were): resume from "
                                     "the last checkpoint",
                                     unit, what_of(nv.read_error), unit, step_));
    nv.read_error = nullptr;
    return false;
  }
  if (!nv.requested) nvme_request_locked(unit);
  us.io = true;
  nv.step = step_;
  return nv.loaded;
}

void CpuAdamW::nvme_items_done_locked(int unit) { nvme_->write_back(unit); }

void CpuAdamW::on_nvme_event(int unit, bool write, uint64_t ticket, char* slot, std::exception_ptr err) {
  std::lock_guard<std::mutex> lk(mu_);
  UnitState& us = state_[size_t(unit)];
  NvmeUnit& nv = us.nv;
  if (!write) {
    if (!nv.requested || ticket != nv.ticket) return;  // released meanwhile
    if (err) {
      nv.requested = false;
      nv.read_error = err;
      if (us.io) {  // the update waits for this read: fail it now
        us.io = false;
        nvme_enqueue_locked(unit);
        done_cv_.notify_all();
      }
      return;
    }
    nv.loaded = true;
    nv.slot = slot;
    if (us.io) push_items_locked(unit);
    return;
  }
  us.io = false;
  nv.requested = nv.loaded = false;
  nv.slot = nullptr;
  if (err) {
    nv.lost = true;
    if (!us.error)
      us.error = error_ptr(fmt::format("optimizer: writing back the NVMe moments of unit {} failed: {}; unit {}'s master "
                                       "and bf16 copy were updated in step {} but its updated moments{} are lost: resume "
                                       "from the last checkpoint",
                                       unit, what_of(err), unit, nv.step,
                                       units_[size_t(unit)].remainders_on_nvme ? " and master remainders" : ""));
  } else if (nv.want) {
    nvme_request_locked(unit);
  }
  nv.want = false;
  done_cv_.notify_all();
}

void CpuAdamW::nvme_check_intact_locked(const char* what) const {
  for (size_t u = 0; u < units_.size(); ++u)
    LT_CHECK(!state_[u].nv.lost,
             "optimizer: cannot {}: the NVMe moments of unit {} were lost in a failed write-back at step {}; resume "
             "from the last checkpoint",
             what, u, state_[u].nv.step);
}

MomentHomes CpuAdamW::moment_homes() const {
  MomentHomes h;
  for (const UnitSpec& u : units_)
    for (const TensorSpec& t : u.tensors)
      if (!u.moments_on_nvme) h.dram += optim::state_bytes(t.numel, t.format);
  if (nvme_) {
    h.staging = nvme_->slot_bytes() * nvme_->slots();
    h.nvme = nvme_->file_bytes();
  }
  for (const UnitSpec& u : units_)
    if (u.remainders_on_nvme) h.remainders += 2 * u.numel;
  return h;
}

// Remainders in the NVMe image (UnitSpec::remainders_on_nvme): the pages holding [offset, offset + n).
void CpuAdamW::read_remainders(int unit, int64_t offset, int64_t n, uint16_t* dst) const {
  LT_CHECK(unit >= 0 && size_t(unit) < units_.size() && units_[size_t(unit)].remainders_on_nvme,
           "optimizer: read_remainders({}): the unit's master remainders are not on NVMe", unit);
  LT_CHECK(offset >= 0 && n >= 0 && offset + n <= units_[size_t(unit)].numel,
           "internal: read_remainders({}, {}, {}) outside the unit's {} elements", unit, offset, n,
           units_[size_t(unit)].numel);
  if (n == 0) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const UnitState& us = state_[size_t(unit)];
    LT_CHECK(!busy(us), "optimizer: the master remainders of unit {} were read while its update is in flight", unit);
    LT_CHECK(!us.nv.lost,
             "optimizer: the master remainders of unit {} were lost with its moments in a failed write-back at step {}; "
             "resume from the last checkpoint", unit, us.nv.step);
  }
  const UnitImage& img = nvme_->image(unit);
  const int64_t begin = img.lo + offset * 2, end = begin + n * 2;
  const int64_t a = begin / kIoAlign * kIoAlign, b = io_round_up(end);
  IoBuffer buf(b - a);
  nvme_->read_part(unit, a, buf.data(), b - a);
  std::memcpy(dst, buf.data() + (begin - a), size_t(n) * 2);
}

void CpuAdamW::write_remainders(int unit, const uint16_t* src) {
  LT_CHECK(unit >= 0 && size_t(unit) < units_.size() && units_[size_t(unit)].remainders_on_nvme,
           "optimizer: write_remainders({}): the unit's master remainders are not on NVMe", unit);
  {
    std::lock_guard<std::mutex> lk(mu_);
    LT_CHECK(norm_known_, "optimizer: cannot write the master remainders of unit {} in the middle of a step", unit);
  }
  wait_all();
  std::lock_guard<std::mutex> lk(mu_);
  // A slot staged for this step's update holds the old remainders: dropped, read again at the next begin_step.
  nvme_release_leftovers_locked();
  nvme_->quiesce();
  char* img = nvme_->scratch();
  nvme_->read_image(unit, img);  // the moments stay (zeros where lost: load() restores them)
  std::memcpy(image_remainders(img, nvme_->image(unit)), src, size_t(units_[size_t(unit)].numel) * 2);
  try {
    nvme_->stage_image(unit, img);
  } catch (...) {
    nvme_->discard_staged();
    throw;
  }
  nvme_->commit_staged();
}

}  // namespace lt::optim
