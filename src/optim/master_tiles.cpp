#include "optim/master_tiles.h"

#include "core/split_master.h"

namespace lt::optim {

void join_tile(const bf16_t* hi, const uint16_t* lo, float* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = join_master(hi[i], lo[i]);
}

void split_tile(const float* p, bf16_t* hi, uint16_t* lo, int64_t n) {
  for (int64_t i = 0; i < n; ++i) split_master(p[i], hi + i, lo + i);
}

void widen_tile(const bf16_t* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(in[i]);
}

void round_tile_sr(const float* p, bf16_t* out, int64_t n, uint64_t seed, uint64_t step, uint64_t index0) {
  for (int64_t i = 0; i < n; ++i) out[i] = round_bf16_sr(p[i], sr_bits(seed, step, index0 + uint64_t(i)));
}

}  // namespace lt::optim
