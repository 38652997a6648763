// Reusable per-thread scratch memory for the reference ops. Large temporaries allocated afresh on
// every layer call cost page faults (tens of MB per call); this arena keeps its memory across calls.
// Usage: Scratch& s = Scratch::get(slot); float* a = s.reserve(total) ... carve with take().
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace lt::cpu {

class Scratch {
 public:
  // One arena per (thread, slot); slots let nested users (layer -> attention) keep separate arenas.
  static Scratch& get(int slot);
  // Makes room for n floats (plus alignment of every take) and resets the carve position. Pointers
  // from earlier takes on this arena become invalid.
  void reset(int64_t n_floats, int n_takes);
  // Next n floats, 64-byte aligned, uninitialised.
  float* take(int64_t n);

 private:
  std::unique_ptr<float[]> mem_;
  size_t cap_ = 0, used_ = 0;
};

}  // namespace lt::cpu
