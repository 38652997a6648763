#include "dist/shard.h"

#include <algorithm>

#include "core/error.h"

namespace lt::dist {

int64_t ShardLayout::owned(int rank) const {
  int64_t n = 0;
  for (size_t u = 0; u < bounds.size(); ++u) n += hi(int64_t(u), rank) - lo(int64_t(u), rank);
  return n;
}

std::vector<int64_t> shard_bounds(const optim::UnitSpec& unit, int world) {
  LT_CHECK(world >= 1, "shard_bounds: world size must be >= 1, got {}", world);
  std::vector<int64_t> b(size_t(world) + 1, 0);
  b[size_t(world)] = unit.numel;
  for (int r = 1; r < world; ++r) {
    int64_t c = (unit.numel * r + world / 2) / world;
    for (const auto& t : unit.tensors)
      if (c > t.offset && c < t.offset + t.numel) {
        c = t.offset + (c - t.offset) / optim::kQ8Block * optim::kQ8Block;
        break;
      }
    b[size_t(r)] = std::max(c, b[size_t(r) - 1]);
  }
  return b;
}

ShardLayout make_shard_layout(const std::vector<optim::UnitSpec>& units, int world) {
  ShardLayout s;
  s.world = world;
  for (const auto& u : units) s.bounds.push_back(shard_bounds(u, world));
  return s;
}

optim::UnitSpec sub_unit_spec(const optim::UnitSpec& unit, int64_t lo, int64_t hi) {
  LT_CHECK(0 <= lo && lo <= hi && hi <= unit.numel, "sub_unit_spec: range [{}, {}) outside the unit's {} elements", lo,
           hi, unit.numel);
  optim::UnitSpec s;
  s.numel = hi - lo;
  for (const auto& t : unit.tensors) {
    const int64_t a = std::max(lo, t.offset), e = std::min(hi, t.offset + t.numel);
    if (a >= e) continue;
    LT_CHECK(t.format != optim::StateFormat::Q8 || (a - t.offset) % optim::kQ8Block == 0,
             "sub_unit_spec: 8-bit tensor '{}' piece starts at element {} of the tensor, not on a {}-element block",
             t.name, a - t.offset, optim::kQ8Block);
    optim::TensorSpec p = t;
    p.offset = a - lo;
    p.numel = e - a;
    s.tensors.push_back(std::move(p));
  }
  return s;
}

std::vector<optim::UnitSpec> rank_unit_specs(const std::vector<optim::UnitSpec>& units, const ShardLayout& s, int rank) {
  LT_CHECK(units.size() == s.bounds.size(), "rank_unit_specs: {} units but the shard layout has {}", units.size(),
           s.bounds.size());
  LT_CHECK(rank >= 0 && rank < s.world, "rank_unit_specs: rank {} out of range [0, {})", rank, s.world);
  std::vector<optim::UnitSpec> v;
  for (size_t u = 0; u < units.size(); ++u)
    v.push_back(sub_unit_spec(units[u], s.lo(int64_t(u), rank), s.hi(int64_t(u), rank)));
  return v;
}

}  // namespace lt::dist
