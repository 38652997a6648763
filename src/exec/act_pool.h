// Device buffers of one boundary activation each (GPU-tier checkpoints, working boundaries and their
// gradients), reused across windows. A released buffer remembers the events of the work still reading
// it; the next owner makes its lane wait for them before writing.
#pragma once
#include <vector>

#include "backend/backend.h"

namespace lt {

class ActPool {
 public:
  ActPool(Backend& be, int64_t bytes) : be_(be), bytes_(bytes) {}
  void reserve(int64_t n) {
    while (int64_t(bufs_.size()) < n) grow();
  }
  // A free buffer; `lane` will wait for the previous owner's pending work. Grows if none is free.
  int acquire(Lane lane) {
    if (free_.empty()) grow();
    const int id = free_.back();
    free_.pop_back();
    for (auto& e : busy_[size_t(id)]) be_.wait(lane, e);
    busy_[size_t(id)].clear();
    in_use_++;
    peak_ = std::max(peak_, in_use_);
    return id;
  }
  void release(int id, std::vector<Event> pending) {
    busy_[size_t(id)] = std::move(pending);
    free_.push_back(id);
    in_use_--;
  }
  void* ptr(int id) const { return bufs_[size_t(id)].data(); }
  // After synchronize(): everything free, no pending events.
  void reset() {
    free_.clear();
    for (size_t i = 0; i < bufs_.size(); ++i) {
      free_.push_back(int(bufs_.size() - 1 - i));
      busy_[i].clear();
    }
    in_use_ = 0;
  }
  int64_t size() const { return int64_t(bufs_.size()); }
  int64_t peak() const { return peak_; }
  int64_t grown() const { return grown_; }  // buffers added after the initial reserve
  void mark_reserved() { grown_ = 0; }

 private:
  void grow() {
    bufs_.emplace_back(be_, MemKind::Device, bytes_, "act.boundaries");
    busy_.emplace_back();
    free_.insert(free_.begin(), int(bufs_.size() - 1));
    grown_++;
  }
  Backend& be_;
  int64_t bytes_;
  std::vector<Buffer> bufs_;
  std::vector<std::vector<Event>> busy_;
  std::vector<int> free_;
  int64_t in_use_ = 0, peak_ = 0, grown_ = 0;
};

}  // namespace lt
