// ZeRO-style sharding of the model's units over ranks (docs/distributed.md, "Shards").
//
// Every unit's flat buffer (model/param_layout.h) is cut into W contiguous ranges, one per rank. Rank r
// owns the optimizer state of range r of every unit, receives that range of the summed gradient
// (reduce-scatter) and sends back its updated weights (all-gather). Cuts are placed near n*r/W but
// snapped down to a multiple of the 8-bit block (optim kQ8Block) counted from the start of the tensor
// they fall in, so that each 8-bit block lies entirely in one shard: the sharded optimizer then
// computes exactly what the unsharded one would, and shard state files merge into the unsharded one
// (state_shards.h). A tiny unit may leave some ranks an empty range.
#pragma once
#include <cstdint>
#include <vector>

#include "optim/optimizer.h"

namespace lt::dist {

struct ShardLayout {
  int world = 1;
  std::vector<std::vector<int64_t>> bounds;  // [unit] -> W+1 offsets
  int64_t lo(int64_t unit, int rank) const { return bounds[size_t(unit)][size_t(rank)]; }
  int64_t hi(int64_t unit, int rank) const { return bounds[size_t(unit)][size_t(rank) + 1]; }
  int64_t owned(int rank) const;  // elements rank owns over all units
};

// Cuts for one unit.
std::vector<int64_t> shard_bounds(const optim::UnitSpec& unit, int world);
ShardLayout make_shard_layout(const std::vector<optim::UnitSpec>& units, int world);

// The part of `unit` in [lo, hi) as a UnitSpec of its own (offsets relative to lo, numel hi-lo;
// tensors cut at the range ends keep their name; an 8-bit tensor's piece must start on a block).
optim::UnitSpec sub_unit_spec(const optim::UnitSpec& unit, int64_t lo, int64_t hi);
// The optimizer layout of rank r: one sub-unit per unit.
std::vector<optim::UnitSpec> rank_unit_specs(const std::vector<optim::UnitSpec>& units, const ShardLayout& s, int rank);

}  // namespace lt::dist
