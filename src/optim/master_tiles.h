// Tile conversions for the optimizer's non-fp32 storage (optimizer.h, MasterFormat): a tile of the
// master is rebuilt into an fp32 scratch that stays in L1/L2, the unchanged fp32 kernels update it,
// and it is written back in its storage form, so every AdamW kernel (scalar, AVX2, AVX-512; fp32 or
// 8-bit moments) serves every format with one extra pass over cache-resident data. The loops are
// integer bit manipulation written branch-free; each is compiled for AVX-512, AVX2 and baseline x86-64
// and picked at load time (target_clones), the same bits on every path. The AVX-512 kernels do the same
// conversions inside their own pass instead (adamw_avx512_masters.h, adamw_*_fused), with these bits.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "optim/adamw_kernels.h"

namespace lt::optim {

constexpr int64_t kMasterTile = 8192;  // elements; a multiple of the 8-bit block (kQ8Block)

// Tests: use at most the given vector path (Scalar, Avx2, Avx512; Auto = the best the CPU has).
void limit_tile_isa(Isa isa);

// p[i] = join_master(hi[i], lo[i]).
void join_tile(const bf16_t* hi, const uint16_t* lo, float* p, int64_t n);
// (hi[i], lo[i]) = split_master(p[i]).
void split_tile(const float* p, bf16_t* hi, uint16_t* lo, int64_t n);
// out[i] = float(in[i]).
void widen_tile(const bf16_t* in, float* out, int64_t n);
// out[i] = round_bf16_sr(p[i], sr_bits(key, element0 + i)) (core/split_master.h: sr_key).
void round_tile_sr(const float* p, bf16_t* out, int64_t n, uint32_t key, uint32_t element0);

}  // namespace lt::optim
