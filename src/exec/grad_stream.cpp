#include "exec/grad_stream.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "exec/executor.h"

namespace lt {

namespace {

int64_t largest(const std::vector<int64_t>& order, const std::vector<int64_t>& numel) {
  int64_t m = 0;
  for (int64_t u : order) m = std::max(m, numel[size_t(u)]);
  return m;
}

}  // namespace

int64_t GradStream::device_bytes(const std::vector<int64_t>& order, const std::vector<int64_t>& numel, DType dtype) {
  int64_t b = 0;
  for (int64_t u : order) b += numel[size_t(u)] * int64_t(dtype_size(dtype));
  return b;
}

int64_t GradStream::pinned_bytes(const std::vector<int64_t>& order, const std::vector<int64_t>& numel, DType dtype,
                                 int slots) {
  return order.empty() ? 0 : slots * largest(order, numel) * int64_t(dtype_size(dtype));
}

GradStream::GradStream(Backend& be, std::vector<int64_t> order, const std::vector<int64_t>& numel, DType dtype,
                       int slots)
    : be_(be), order_(std::move(order)), pos_(numel.size(), -1), dtype_(dtype), held_(numel.size()),
      units_(numel.size()) {
  LT_CHECK(slots >= 1, "internal: gradient stream needs a staging slot");
  const int64_t esz = int64_t(dtype_size(dtype));
  for (size_t k = 0; k < order_.size(); ++k) {
    const int64_t u = order_[k];
    pos_[size_t(u)] = int64_t(k);
    held_[size_t(u)] = std::make_unique<Buffer>(be, MemKind::Device, numel[size_t(u)] * esz, "grads.held");
  }
  if (order_.empty()) return;
  for (int k = 0; k < slots; ++k)
    slots_.emplace_back(be, MemKind::Pinned, largest(order_, numel) * esz, "grads.staging");
  owner_.assign(size_t(slots), -1);
  worker_ = std::make_unique<HostWorker>("grad-stream");
}

GradStream::~GradStream() {
  try {
    flush();
    for (size_t k = 0; k < owner_.size(); ++k)
      if (owner_[k] >= 0) release(owner_[k]);  // waits for the update reading the slot
  } catch (const std::exception& e) {
    log_warn("gradient stream shutdown: {}", e.what());
  }
  if (worker_) worker_->drain();
  try {
    be_.synchronize();  // a copy whose hand-over failed early may still be running
  } catch (...) {
  }
}

void GradStream::start(UpdateHook* hook) {
  // Slots of the previous step's units that no forward waited for: their updates end first.
  for (size_t k = 0; k < owner_.size(); ++k)
    if (owner_[k] >= 0) release(owner_[k]);
  hook_ = hook;
  for (int64_t u : order_) {
    LT_CHECK(units_[size_t(u)].state == State::Idle, "internal: unit {}'s previous gradient was not streamed", u);
    units_[size_t(u)].state = State::Pending;
  }
  while (any_pending() && std::find(owner_.begin(), owner_.end(), -1) != owner_.end()) issue_next();
}

bool GradStream::any_pending() const {
  for (int64_t u : order_)
    if (units_[size_t(u)].state == State::Pending) return true;
  return false;
}

int GradStream::free_slot() {
  auto it = std::find(owner_.begin(), owner_.end(), -1);
  if (it == owner_.end()) {
    // Every slot taken: the unit earliest in the order has its update waited for.
    it = std::min_element(owner_.begin(), owner_.end(),
                          [&](int64_t a, int64_t b) { return pos_[size_t(a)] < pos_[size_t(b)]; });
    release(*it);
  }
  return int(it - owner_.begin());
}

void GradStream::issue_next() {
  int64_t u = -1;
  for (int64_t v : order_)
    if (units_[size_t(v)].state == State::Pending) {
      u = v;
      break;
    }
  LT_CHECK(u >= 0, "internal: no gradient left to stream");
  const int k = free_slot();
  Unit& s = units_[size_t(u)];
  void* dst = slots_[size_t(k)].data();
  be_.copy(Lane::D2H, dst, buffer(u), bytes(u), OpLabel{"grad.d2h", -1, int32_t(u)});
  s.copied = be_.record(Lane::D2H);
  s.slot = k;
  s.state = State::Issued;
  owner_[size_t(k)] = u;
  Backend* be = &be_;
  UpdateHook* hook = hook_;
  const Event ev = s.copied;
  const DType dt = dtype_;
  s.handed = worker_->submit([=] {
    be->host_wait(ev);  // throws if the copy was skipped after a backend error
    hook->grad_staged(u, dst, dt);
  });
}

void GradStream::hand_over(int64_t u) {
  Unit& s = units_[size_t(u)];
  if (s.state == State::Issued) s.handed.get();
}

void GradStream::release(int64_t u) {
  Unit& s = units_[size_t(u)];
  hand_over(u);
  hook_->wait(u);  // idempotent: the forward may wait for u again
  owner_[size_t(s.slot)] = -1;
  s.slot = -1;
  s.state = State::Idle;
}

void GradStream::before_wait(int64_t u) {
  if (pos_[size_t(u)] < 0) return;
  while (units_[size_t(u)].state == State::Pending) issue_next();
  hand_over(u);
}

void GradStream::after_wait(int64_t u) {
  if (pos_[size_t(u)] < 0 || units_[size_t(u)].state != State::Issued) return;
  Unit& s = units_[size_t(u)];
  owner_[size_t(s.slot)] = -1;
  s.slot = -1;
  s.state = State::Idle;
  while (any_pending() && std::find(owner_.begin(), owner_.end(), -1) != owner_.end()) issue_next();
}

void GradStream::before_write(int64_t u) {
  before_wait(u);
  be_.wait(Lane::Compute, units_[size_t(u)].copied);
}

void GradStream::flush() {
  while (any_pending()) issue_next();
  for (int64_t u : order_) hand_over(u);
}

void GradStream::recover() {
  if (worker_) worker_->drain();
  for (int64_t u : order_) {
    Unit& s = units_[size_t(u)];
    if (s.state != State::Issued) continue;
    try {
      s.handed.get();
    } catch (...) {
      owner_[size_t(s.slot)] = -1;
      s.slot = -1;
      s.state = State::Pending;
    }
  }
}

}  // namespace lt
