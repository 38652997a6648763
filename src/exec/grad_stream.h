// Gradients held in device memory until the step's global norm is known, then streamed to the host
// through a small ring of pinned staging slots as the optimizer consumes them (HostState option
// GradHome::Device; docs/executor.md, "Gradients held on the device").
//
// Life of one unit's gradient (the executor drives it; all calls from the executor's thread):
//   backward   before_write(u), then the compute lane writes buffer(u)
//   step end   start(hook): every held unit is pending; those that fit the ring, in streaming order,
//              are copied (D2H) into it, each handed to hook->grad_staged(u, ptr, dtype) by
//              a worker thread once its copy completed
//   forward    before_wait(u) (u's gradient reached the hook), hook->wait(u), after_wait(u): u's slot
//              is free and takes the next pending unit
// The staging memory is one pinned ring (core/model_state.h grad_ring_elems: 8 median units, at least the largest),
// filled in streaming order with each unit's own size: several layers are in flight at once, and a
// unit larger than the rest (an untied LM head) waits until the ring has drained enough for it. A unit's part of the ring stays untouched until hook->wait(u)
// returned; when the ring is full the stream frees the oldest by calling hook->wait on its unit itself.
#pragma once
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/model_state.h"
#include "exec/host_worker.h"

namespace lt {

class UpdateHook;

class GradStream {
 public:
  // order: the device-held units, in the order the next forward waits for them; numel: elements of
  // every unit (indexed by unit); dtype: of the held buffers. Allocates one device buffer per held unit
  // ("grads.held") and a pinned staging ring ("grads.staging", see above).
  // depth: the ring's depth in median units (StatePlacement::grad_ring_depth).
  GradStream(Backend& be, std::vector<int64_t> order, const std::vector<int64_t>& numel, DType dtype,
             int depth = kGradRingDepth);
  // Streams what is left (flush) and waits for every update that reads a slot, so no callback or
  // update refers to the slots after it returns; errors are logged.
  ~GradStream();
  GradStream(const GradStream&) = delete;
  GradStream& operator=(const GradStream&) = delete;

  // Bytes GradStream allocates: device (held buffers) and pinned (the ring).
  static int64_t device_bytes(const std::vector<int64_t>& order, const std::vector<int64_t>& numel, DType dtype);
  static int64_t pinned_bytes(const std::vector<int64_t>& order, const std::vector<int64_t>& numel, DType dtype,
                              int depth = kGradRingDepth);

  bool held(int64_t u) const { return held_[size_t(u)] != nullptr; }
  void* buffer(int64_t u) const { return held_[size_t(u)]->data(); }
  int64_t bytes(int64_t u) const { return held_[size_t(u)]->bytes(); }
  DType dtype() const { return dtype_; }

  // The step's gradients are final in the held buffers (lanes synchronised, the norm reported): stream
  // them to `hook`, the first `slots` now.
  void start(UpdateHook* hook);
  // Before hook->wait(u): u's copy is issued (with every earlier pending unit's) and u's gradient was
  // handed to the hook, so that wait(u) covers its update. Rethrows a failed copy.
  void before_wait(int64_t u);
  // After hook->wait(u) returned: u's slot takes the next pending units.
  void after_wait(int64_t u);
  // Before the compute lane writes buffer(u) again: u was handed over, and the lane waits for its copy.
  void before_write(int64_t u);
  // Issues every pending copy (waiting for slots' updates as needed) and waits until each gradient was
  // handed to the hook: afterwards UpdateHook::wait covers every unit of the step.
  void flush();
  // After a failed step, lanes synchronised and the backend's error NOT yet cleared: waits for the
  // worker; a unit whose copy or hand-over failed is pending again (its held buffer was not written
  // since: before_write needs the hand-over), so it is streamed by the next before_wait / flush.
  void recover();

 private:
  enum class State : uint8_t { Idle, Pending, Issued };
  struct Unit {
    State state = State::Idle;
    int64_t off = -1;                     // its bytes in the ring
    Event copied;                         // D2H of the unit's gradient into its slot
    std::shared_future<void> handed;      // the worker's host_wait + hook->grad_staged
  };
  struct Span {
    int64_t unit, off, size;
    bool freed;
  };
  int64_t next_pending() const;  // the first pending unit in order, -1 if none
  bool issue_if_room();    // issues the next pending unit if the ring has room for it now
  void issue_next();       // the next pending unit, freeing the oldest units' room as needed
  int64_t place(int64_t bytes) ;  // ring offset for `bytes` now, -1 if there is no room
  void free_room(int64_t u);      // u's span is free (the ring's tail moves past freed spans)
  void release(int64_t u); // waits for u's update: its room is free
  void hand_over(int64_t u);  // waits for u's hand-over (rethrows)
  bool any_pending() const;

  Backend& be_;
  std::vector<int64_t> order_;
  std::vector<int64_t> pos_;  // position of each unit in order_ (-1: not held)
  DType dtype_;
  std::vector<std::unique_ptr<Buffer>> held_;
  std::unique_ptr<Buffer> ring_;
  int64_t cap_ = 0;
  std::deque<Span> live_;       // staged units in issue order
  std::vector<Unit> units_;
  UpdateHook* hook_ = nullptr;
  std::unique_ptr<HostWorker> worker_;
};

}  // namespace lt
