#include "exec/weight_ring.h"

#include "core/error.h"

namespace lt {

int64_t RingSchedule::loads() const {
  int64_t n = 0;
  for (char c : load) n += c;
  return n;
}

RingSchedule build_ring_schedule(const std::vector<int64_t>& layers, const std::vector<int32_t>& windows, int ring) {
  LT_CHECK(ring >= 2, "weight ring: {} slots, expected >= 2", ring);
  const int64_t n = int64_t(layers.size());
  RingSchedule r;
  r.layer = layers;
  r.window = windows;
  r.slot.assign(size_t(n), -1);
  r.load.assign(size_t(n), 0);
  r.evict_after.assign(size_t(n), -1);
  r.loader.assign(size_t(n), -1);
  std::vector<int64_t> content(size_t(ring), -1), last_use(size_t(ring), -1), loaded_by(size_t(ring), -1);
  auto next_use = [&](int64_t layer, int64_t from) {
    for (int64_t m = from; m < n; ++m)
      if (layers[size_t(m)] == layer) return m;
    return n + 1;  // never again
  };
  for (int64_t u = 0; u < n; ++u) {
    int hit = -1;
    for (int s = 0; s < ring; ++s)
      if (content[size_t(s)] == layers[size_t(u)]) hit = s;
    if (hit >= 0) {
      r.slot[size_t(u)] = hit;
      r.loader[size_t(u)] = loaded_by[size_t(hit)];
      last_use[size_t(hit)] = u;
      continue;
    }
    // Victim: an empty slot, else the content needed farthest ahead (ties: least recently used), among
    // the slots not used by the previous ring-1 uses: then the load can be issued ring-1 uses ahead.
    int victim = -1;
    int64_t best = -1, best_last = 0;
    for (int s = 0; s < ring; ++s) {
      if (content[size_t(s)] >= 0 && last_use[size_t(s)] > u - ring) continue;
      const int64_t nu = content[size_t(s)] < 0 ? n + 2 : next_use(content[size_t(s)], u);
      if (nu > best || (nu == best && last_use[size_t(s)] < best_last)) {
        best = nu;
        best_last = last_use[size_t(s)];
        victim = s;
      }
    }
    r.slot[size_t(u)] = victim;
    r.load[size_t(u)] = 1;
    r.evict_after[size_t(u)] = last_use[size_t(victim)];
    r.loader[size_t(u)] = u;
    content[size_t(victim)] = layers[size_t(u)];
    last_use[size_t(victim)] = u;
    loaded_by[size_t(victim)] = u;
  }
  return r;
}

}  // namespace lt
