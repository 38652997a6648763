#include "exec/grad_stream.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "core/model_state.h"
#include "exec/executor.h"

namespace lt {

namespace {

// Ring capacity in elements (core/model_state.h grad_ring_elems).
int64_t ring_elems(const std::vector<int64_t>& order, const std::vector<int64_t>& numel, int depth) {
  std::vector<int64_t> n;
  for (int64_t u : order) n.push_back(numel[size_t(u)]);
  return grad_ring_elems(std::move(n), depth);
}

}  // namespace

int64_t GradStream::device_bytes(const std::vector<int64_t>& order, const std::vector<int64_t>& numel, DType dtype) {
  int64_t b = 0;
  for (int64_t u : order) b += numel[size_t(u)] * int64_t(dtype_size(dtype));
  return b;
}

int64_t GradStream::pinned_bytes(const std::vector<int64_t>& order, const std::vector<int64_t>& numel, DType dtype,
                                 int depth) {
  return ring_elems(order, numel, depth) * int64_t(dtype_size(dtype));
}

GradStream::GradStream(Backend& be, std::vector<int64_t> order, const std::vector<int64_t>& numel, DType dtype,
                       int depth)
    : be_(be), order_(std::move(order)), pos_(numel.size(), -1), dtype_(dtype), held_(numel.size()),
      units_(numel.size()) {
  const int64_t esz = int64_t(dtype_size(dtype));
  for (size_t k = 0; k < order_.size(); ++k) {
    const int64_t u = order_[k];
    pos_[size_t(u)] = int64_t(k);
    held_[size_t(u)] = std::make_unique<Buffer>(be, MemKind::Device, numel[size_t(u)] * esz, "grads.held");
  }
  if (order_.empty()) return;
  cap_ = ring_elems(order_, numel, depth) * esz;
  ring_ = std::make_unique<Buffer>(be, MemKind::Pinned, cap_, "grads.staging");
  worker_ = std::make_unique<HostWorker>("grad-stream");
}

GradStream::~GradStream() {
  try {
    flush();
    while (!live_.empty()) {  // waits for the updates reading the ring
      if (!live_.front().freed) release(live_.front().unit);
      else live_.pop_front();
    }
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
  // Room of the previous step's units that no forward waited for: their updates end first.
  while (!live_.empty()) {
    if (!live_.front().freed) release(live_.front().unit);
    else live_.pop_front();
  }
  hook_ = hook;
  for (int64_t u : order_) {
    LT_CHECK(units_[size_t(u)].state == State::Idle, "internal: unit {}'s previous gradient was not streamed", u);
    units_[size_t(u)].state = State::Pending;
  }
  while (issue_if_room()) {
  }
}

bool GradStream::any_pending() const { return next_pending() >= 0; }

int64_t GradStream::next_pending() const {
  for (int64_t v : order_)
    if (units_[size_t(v)].state == State::Pending) return v;
  return -1;
}

// The ring holds the staged units in issue order: the free room is after the newest span, up to the
// end of the ring or (wrapped) to the oldest live span.
int64_t GradStream::place(int64_t bytes) {
  while (!live_.empty() && live_.front().freed) live_.pop_front();
  if (live_.empty()) return bytes <= cap_ ? 0 : -1;
  const int64_t tail = live_.front().off, head = live_.back().off + live_.back().size;
  if (tail < head) {
    if (head + bytes <= cap_) return head;
    return bytes <= tail ? 0 : -1;
  }
  return head + bytes <= tail ? head : -1;
}

void GradStream::free_room(int64_t u) {
  for (auto& sp : live_)
    if (sp.unit == u && !sp.freed) {
      sp.freed = true;
      break;
    }
  while (!live_.empty() && live_.front().freed) live_.pop_front();
}

bool GradStream::issue_if_room() {
  const int64_t u = next_pending();
  if (u < 0 || place(bytes(u)) < 0) return false;
  issue_next();
  return true;
}

void GradStream::issue_next() {
  const int64_t u = next_pending();
  LT_CHECK(u >= 0, "internal: no gradient left to stream");
  int64_t off;
  while ((off = place(bytes(u))) < 0) {
    LT_CHECK(!live_.empty(), "internal: unit {}'s gradient ({} bytes) exceeds the staging ring ({} bytes)", u,
             bytes(u), cap_);
    release(live_.front().unit);  // the oldest staged unit's update is waited for
  }
  Unit& s = units_[size_t(u)];
  void* dst = static_cast<char*>(ring_->data()) + off;
  be_.copy(Lane::D2H, dst, buffer(u), bytes(u), OpLabel{"grad.d2h", -1, int32_t(u)});
  s.copied = be_.record(Lane::D2H);
  s.off = off;
  s.state = State::Issued;
  live_.push_back({u, off, bytes(u), false});
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
  free_room(u);
  s.off = -1;
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
  free_room(u);
  s.off = -1;
  s.state = State::Idle;
  while (issue_if_room()) {
  }
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
      free_room(u);
      s.off = -1;
      s.state = State::Pending;
    }
  }
}

}  // namespace lt
