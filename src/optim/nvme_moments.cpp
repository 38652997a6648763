#include "optim/nvme_moments.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/host_memory.h"
#include "core/timer.h"
#include "optim/quant8.h"

namespace lt::optim {

namespace {
int64_t align64(int64_t n) { return (n + 63) / 64 * 64; }
}  // namespace

UnitImage unit_image(const UnitSpec& u) {
  UnitImage img;
  int64_t at = 0;
  auto take = [&at](int64_t bytes) {
    const int64_t o = at;
    at = align64(at + bytes);
    return o;
  };
  for (const TensorSpec& t : u.tensors) {
    UnitImage::Tensor ti;
    if (t.format == StateFormat::F32) {
      ti.a = take(t.numel * 4);
      ti.b = take(t.numel * 4);
    } else {
      const int64_t blocks = (t.numel + kQ8Block - 1) / kQ8Block;
      ti.a = take(t.numel);
      ti.b = take(t.numel);
      ti.c = take(blocks * 4);
      ti.d = take(blocks * 4);
    }
    img.tensors.push_back(ti);
  }
  if (u.remainders_on_nvme) img.lo = take(u.numel * 2);
  img.bytes = io_round_up(std::max<int64_t>(at, 1));
  return img;
}

MomentArrays image_arrays(char* base, const UnitSpec& u, const UnitImage& img, size_t tensor) {
  const UnitImage::Tensor& t = img.tensors[tensor];
  MomentArrays a;
  if (u.tensors[tensor].format == StateFormat::F32) {
    a.m = reinterpret_cast<float*>(base + t.a);
    a.v = reinterpret_cast<float*>(base + t.b);
  } else {
    a.mq = reinterpret_cast<uint8_t*>(base + t.a);
    a.vq = reinterpret_cast<uint8_t*>(base + t.b);
    a.ms = reinterpret_cast<float*>(base + t.c);
    a.vs = reinterpret_cast<float*>(base + t.d);
  }
  return a;
}

void IoBuffer::Free::operator()(char* p) const { std::free(p); }

IoBuffer::IoBuffer(int64_t bytes) : n_(bytes) {
  p_.reset(static_cast<char*>(aligned_host_alloc(size_t(bytes), size_t(kIoAlign))));
  LT_CHECK(p_ != nullptr, "optimizer: cannot allocate {} bytes of NVMe staging memory", bytes);
}

NvmeMoments::NvmeMoments(const std::vector<UnitSpec>& units, const std::filesystem::path& dir,
                         std::shared_ptr<IoLayer> io, int slots, Listener listener)
    : listener_(std::move(listener)), units_(units.size()) {
  LT_CHECK(!dir.empty(), "optimizer: moments are placed on NVMe but no NVMe directory was given (nvme_dir)");
  LT_CHECK(slots >= 1, "optimizer: NVMe moments need at least 1 staging slot, got {}", slots);
  for (const UnitSpec& u : units) {
    on_nvme_.push_back(u.moments_on_nvme);
    images_.push_back(u.moments_on_nvme ? unit_image(u) : UnitImage{});
    slot_bytes_ = std::max(slot_bytes_, images_.back().bytes);
  }
  store_ = std::make_unique<NvmeStore>(dir, std::move(io), "moments");
  for (int s = 0; s < slots; ++s) {
    slots_.emplace_back(slot_bytes_);
    free_.push_back(s);
  }
  thread_ = std::thread([this] { loop(); });
}

NvmeMoments::~NvmeMoments() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  store_.reset();  // removes the files and the directory
}

int64_t NvmeMoments::file_bytes() const {
  int64_t b = 0;
  for (const UnitImage& i : images_) b += i.bytes;
  return b;
}

std::string NvmeMoments::file_name(int unit) const {
  std::lock_guard<std::mutex> lk(mu_);
  return store_->file_name(key(unit, units_[size_t(unit)].gen));
}

uint64_t NvmeMoments::prefetch(int unit) {
  std::lock_guard<std::mutex> lk(mu_);
  Unit& u = units_[size_t(unit)];
  LT_CHECK(on_nvme_[size_t(unit)] && !u.queued, "internal: NVMe moments: unit {} requested twice", unit);
  u.queued = true;
  u.ticket = ++next_ticket_;
  reads_.push_back(unit);
  cv_.notify_all();
  return u.ticket;
}

void NvmeMoments::write_back(int unit) {
  std::lock_guard<std::mutex> lk(mu_);
  Unit& u = units_[size_t(unit)];
  LT_CHECK(u.phase == Phase::Loaded, "internal: NVMe moments: write-back of unit {}, which is not loaded", unit);
  u.phase = Phase::Writing;
  writes_.push_back(unit);
  cv_.notify_all();
}

void NvmeMoments::release(int unit) {
  std::lock_guard<std::mutex> lk(mu_);
  Unit& u = units_[size_t(unit)];
  if (u.queued) {
    reads_.erase(std::find(reads_.begin(), reads_.end(), unit));
    u.queued = false;
  }
  if (u.phase == Phase::Reading) u.cancel = true;
  if (u.phase == Phase::Loaded) {
    free_.push_back(u.slot);
    u.slot = -1;
    u.phase = Phase::Idle;
    cv_.notify_all();
    idle_cv_.notify_all();
  }
}

void NvmeMoments::quiesce() {
  std::unique_lock<std::mutex> lk(mu_);
  idle_cv_.wait(lk, [&] { return reads_.empty() && writes_.empty() && !busy_ && free_.size() == slots_.size(); });
}

bool NvmeMoments::read_ready_locked() const {
  return !reads_.empty() && !free_.empty() && units_[size_t(reads_.front())].phase == Phase::Idle;
}

void NvmeMoments::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !writes_.empty() || read_ready_locked(); });
    if (stop_) return;
    Event ev;
    Unit* u = nullptr;
    bool zeros = false;
    int64_t k = 0;
    if (!writes_.empty()) {  // first: it frees a slot
      ev.unit = writes_.front();
      writes_.pop_front();
      ev.write = true;
      u = &units_[size_t(ev.unit)];
    } else {
      ev.unit = reads_.front();
      reads_.pop_front();
      u = &units_[size_t(ev.unit)];
      u->queued = false;
      u->phase = Phase::Reading;
      u->slot = free_.back();
      free_.pop_back();
      ev.ticket = u->ticket;
      zeros = !u->written;
    }
    k = key(ev.unit, u->gen);
    ev.slot = slots_[size_t(u->slot)].data();
    const int64_t bytes = images_[size_t(ev.unit)].bytes;
    busy_ = true;
    lk.unlock();
    const double t0 = now_seconds();
    try {
      if (ev.write) store_->write(k, 0, ev.slot, bytes);
      else if (zeros) std::memset(ev.slot, 0, size_t(bytes));
      else store_->read(k, 0, ev.slot, bytes);
    } catch (...) {
      ev.err = std::current_exception();
    }
    const double dt = now_seconds() - t0;
    lk.lock();
    busy_ = false;
    if (!zeros) {
      stats_.io_s += dt;
      if (!ev.err) (ev.write ? stats_.write_bytes : stats_.read_bytes) += bytes;
    }
    bool report = true;
    if (ev.write) {
      u->written = !ev.err;  // a failed write removed the file (NvmeStore)
      free_.push_back(u->slot);
      u->slot = -1;
      u->phase = Phase::Idle;
    } else if (u->cancel || ev.err) {
      report = !u->cancel;
      u->cancel = false;
      free_.push_back(u->slot);
      u->slot = -1;
      u->phase = Phase::Idle;
    } else {
      u->phase = Phase::Loaded;
    }
    idle_cv_.notify_all();
    if (report && listener_) {
      lk.unlock();
      listener_(ev);
      lk.lock();
    }
  }
}

void NvmeMoments::read_image(int unit, void* buf) {
  int64_t k;
  bool written;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const Unit& u = units_[size_t(unit)];
    LT_CHECK(u.phase != Phase::Writing, "internal: NVMe moments: unit {} read while its write-back is in flight", unit);
    k = key(unit, u.gen);
    written = u.written;
  }
  const int64_t bytes = images_[size_t(unit)].bytes;
  if (!written) {
    std::memset(buf, 0, size_t(bytes));
    return;
  }
  const double t0 = now_seconds();
  store_->read(k, 0, buf, bytes);
  std::lock_guard<std::mutex> lk(mu_);
  stats_.io_s += now_seconds() - t0;
  stats_.read_bytes += bytes;
}

void NvmeMoments::read_part(int unit, int64_t offset, void* buf, int64_t bytes) {
  int64_t k;
  bool written;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const Unit& u = units_[size_t(unit)];
    LT_CHECK(u.phase != Phase::Writing, "internal: NVMe moments: unit {} read while its write-back is in flight", unit);
    LT_CHECK(offset % kIoAlign == 0 && bytes % kIoAlign == 0 && offset >= 0 &&
                 offset + bytes <= images_[size_t(unit)].bytes,
             "internal: NVMe moments: read of bytes [{}, {}) of unit {}'s image", offset, offset + bytes, unit);
    k = key(unit, u.gen);
    written = u.written;
  }
  if (!written) {
    std::memset(buf, 0, size_t(bytes));
    return;
  }
  const double t0 = now_seconds();
  store_->read(k, offset, buf, bytes);
  std::lock_guard<std::mutex> lk(mu_);
  stats_.io_s += now_seconds() - t0;
  stats_.read_bytes += bytes;
}

void NvmeMoments::stage_image(int unit, const void* buf) {
  int64_t k;
  {
    std::lock_guard<std::mutex> lk(mu_);
    Unit& u = units_[size_t(unit)];
    LT_CHECK(u.phase == Phase::Idle && !u.queued, "internal: NVMe moments: unit {} staged while in use", unit);
    k = key(unit, 1 - u.gen);
    u.staged = true;
  }
  const int64_t bytes = images_[size_t(unit)].bytes;
  const double t0 = now_seconds();
  store_->write(k, 0, buf, bytes);
  std::lock_guard<std::mutex> lk(mu_);
  stats_.io_s += now_seconds() - t0;
  stats_.write_bytes += bytes;
}

void NvmeMoments::commit_staged() {
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t i = 0; i < units_.size(); ++i) {
    Unit& u = units_[i];
    if (!u.staged) continue;
    store_->remove(key(int(i), u.gen));
    u.gen = 1 - u.gen;
    u.written = true;
    u.staged = false;
  }
}

void NvmeMoments::discard_staged() {
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t i = 0; i < units_.size(); ++i) {
    Unit& u = units_[i];
    if (!u.staged) continue;
    store_->remove(key(int(i), 1 - u.gen));
    u.staged = false;
  }
}

NvmeIoStats NvmeMoments::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

}  // namespace lt::optim
