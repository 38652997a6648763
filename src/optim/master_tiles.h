// Tile conversions for the optimizer's non-fp32 storage (optimizer.h, MasterFormat): a tile of the
// master is rebuilt into an fp32 scratch that stays in L1/L2, the unchanged fp32 kernels update it,
// and it is written back in its storage form, so every AdamW kernel (scalar, AVX2, AVX-512; fp32 or
// 8-bit moments) serves every format with one extra pass over cache-resident data.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace lt::optim {

constexpr int64_t kMasterTile = 2048;  // elements; a multiple of the 8-bit block (kQ8Block)

// p[i] = join_master(hi[i], lo[i]).
void join_tile(const bf16_t* hi, const uint16_t* lo, float* p, int64_t n);
// (hi[i], lo[i]) = split_master(p[i]).
void split_tile(const float* p, bf16_t* hi, uint16_t* lo, int64_t n);
// out[i] = float(in[i]).
void widen_tile(const bf16_t* in, float* out, int64_t n);
// out[i] = round_bf16_sr(p[i], sr_bits(seed, step, index0 + i)).
void round_tile_sr(const float* p, bf16_t* out, int64_t n, uint64_t seed, uint64_t step, uint64_t index0);

}  // namespace lt::optim
