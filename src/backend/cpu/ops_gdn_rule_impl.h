// Internal to ops_gdn_rule*.cpp: chunk bookkeeping and the per-(chunk, value head) intra-chunk
// quantities of the chunked gated delta rule, shared by the forward and the backward.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cpu/ops_gdn.h"

namespace lt::cpu::gdn_detail {

// ---------------------------------------------------------------- small dense helpers (double accumulation)
inline double dotd(const float* a, const float* b, int64_t n) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += double(a[i]) * double(b[i]);
  return s;
}
// acc[c] += alpha * x[c]
inline void axpyd(double alpha, const float* x, double* acc, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) acc[i] += alpha * double(x[i]);
}
// acc[c] = sum_d x[d] M[d, c]   (x^T M, M [rows, cols] row-major)
inline void vecmat(const float* x, const float* M, int64_t rows, int64_t cols, double* acc) {
  for (int64_t c = 0; c < cols; ++c) acc[c] = 0;
  for (int64_t d = 0; d < rows; ++d) axpyd(double(x[d]), M + d * cols, acc, cols);
}
// out[d] = sum_c M[d, c] y[c]   (M y)
inline void matvec(const float* M, const float* y, int64_t rows, int64_t cols, double* out) {
  for (int64_t d = 0; d < rows; ++d) out[d] = dotd(M + d * cols, y, cols);
}
inline void to_float(const double* a, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = float(a[i]);
}

inline float q_scale(int64_t Dk) { return float(1.0 / std::sqrt(double(Dk))); }

// ---------------------------------------------------------------- chunks
struct Chunk {
  int64_t t0 = 0, len = 0;
  bool first = false;  // first chunk of its segment: its start state is zero
};
// Chunks start at every segment start and then every s.chunk rows.
std::vector<Chunk> make_chunks(const GdnShape& s, const int32_t* seg);
// Segment-start flags per row (row 0 is always a start).
std::vector<char> segment_start_flags(const int32_t* seg, int64_t S);
void check_shape(const GdnShape& s, const char* what);

// ---------------------------------------------------------------- intra-chunk quantities
// For one chunk of L rows and one value head h (key head kh), with rows i, j in [0, L):
//   q~_i = scale q_i,  k_i,  v_i,  b_i = beta_i
//   gam_i = sum_{m<=i} g_m (double),  G_i = exp(gam_i),  Ge_j = exp(gam_{L-1} - gam_j)
//   M[i,j] = exp(gam_i - gam_j) (j <= i),  KK[i,j] = k_i.k_j,  QK[i,j] = q~_i.k_j
//   A[i,j] = b_i KK[i,j] M[i,j] for j < i (strictly lower; the UT system is I + A)
//   U = (I + A)^-1 diag(b) V          ("new values", forward substitution)
//   W = (I + A)^-1 diag(b G) K        ("k_cumdecay")
//   Dl = U - W S0                     (the per-row deltas b_i (v_i - S'_i^T k_i) given the start state S0)
// Then o_i = G_i S0^T q~_i + sum_{j<=i} QK[i,j] M[i,j] Dl_j and S_end = G_{L-1} S0 + sum_j Ge_j k_j Dl_j^T.
struct ChunkWork {
  int64_t C = 0, Dk = 0, Dv = 0, L = 0;
  std::vector<float> q, k, v, beta;   // [C, Dk], [C, Dk], [C, Dv], [C]
  std::vector<double> gam;            // [C]
  std::vector<float> G, Ge;           // [C]
  std::vector<float> M, KK, QK, A;    // [C, C]
  std::vector<float> U, W, Dl;        // [C, Dv], [C, Dk], [C, Dv]
  std::vector<double> acc;            // [max(Dk, Dv)] row accumulator

  ChunkWork(int64_t chunk, int64_t Dk, int64_t Dv);
  // Gathers rows [c.t0, c.t0 + c.len) of value head h (q scaled) and computes gam, G, Ge, M, KK, QK, A, U, W.
  void load(const GdnShape& s, const float* q, const float* k, const float* v, const float* g, const float* beta,
            const Chunk& c, int64_t h);
  // Dl = U - W S0 (S0 [Dk, Dv]; nullptr means zero).
  void deltas(const float* S0);
  // S_end = G_{L-1} S0 + sum_j Ge_j k_j Dl_j^T, in place on S [Dk, Dv] (S holds S0 on entry).
  void advance_state(float* S);
};

// Chunked forward of one value head over all chunks: writes o rows of head h (if o != nullptr) and the
// start state of every chunk to states + ci * state_stride (if states != nullptr).
void head_chunked_fwd(const GdnShape& s, const float* q, const float* k, const float* v, const float* g,
                      const float* beta, const std::vector<Chunk>& chunks, int64_t h, float* o, float* states,
                      int64_t state_stride);

}  // namespace lt::cpu::gdn_detail
