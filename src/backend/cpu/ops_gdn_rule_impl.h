// Internal to ops_gdn_rule*.cpp: chunk bookkeeping and the per-(chunk, value head) intra-chunk
// quantities of the chunked gated delta rule, shared by the forward and the backward.
#pragma once
#include <immintrin.h>

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

// ---------------------------------------------------------------- vector math (AVX2; the backend is built for x86-64-v3)
// exp of 8 floats (Cephes expf polynomial, about 1 ulp); 0 below -87.3 (where fp32 would go denormal).
inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// silu(p) = p sigmoid(p) and sigmoid(p) of 8 lanes (exp8 of -p).
inline __m256 sigmoid8(__m256 p) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), p))));
}

// ---------------------------------------------------------------- small dense products (fp32 accumulation)
// Every intra-chunk product is a set of output rows, each a linear combination of rows of B:
//   Y[r, 0:n] (+)= sum_{p<k} A[r * lda + p * as] B[p, 0:n]      (r < m; NEG subtracts instead)
// (lda/as give A or A^T). Every output element is one fp32 fused multiply-add chain in p order (the
// vector lanes, the masked column tail and the row blocking all do the same operations), so results do
// not depend on m, n, alignment or where a chunk starts. Triangular products pad the last row block
// with entries that are exactly zero, which leaves every chain unchanged.
template <bool NEG = false>
void gemm_rows(float* Y, int64_t ldy, int64_t m, int64_t n, const float* A, int64_t lda, int64_t as, const float* B,
               int64_t ldb, int64_t k, bool accumulate);
// y[0:n] += alpha x[0:n] (fp32, fused).
void axpyf(float alpha, const float* x, float* y, int64_t n);
// dst[c * ldd + r] = src[r * lds + c], r < rows, c < cols.
void transpose(const float* src, int64_t rows, int64_t cols, int64_t lds, float* dst, int64_t ldd);
constexpr int64_t kRowBlock = 4;  // rows per block of the triangular products

// Flush-to-zero / denormals-are-zero for the scope (the calling thread's MXCSR, restored on exit). Decay
// factors exp(gam_i - gam_j) below FLT_MIN (about e^-87, reached within one chunk for g ~ -1.5) and their
// products would otherwise be fp32 denormals, which cost a microcode assist per operation; flushing them
// changes results only below 1e-38 relative to the unit-size terms.
class FlushDenormals {
 public:
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }  // FTZ (bit 15) | DAZ (bit 6)
  ~FlushDenormals() { _mm_setcsr(saved_); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned saved_;
};

// ---------------------------------------------------------------- intra-chunk quantities
// For one chunk of L rows and one value head h (key head kh), with rows i, j in [0, L):
//   q~_i = scale q_i,  k_i,  v_i,  b_i = beta_i
//   gam_i = sum_{m<=i} g_m (double),  G_i = exp(gam_i),  Ge_j = exp(gam_{L-1} - gam_j)
//   M[i,j] = exp(gam_i - gam_j) (j <= i; from the double difference),  KK[i,j] = k_i.k_j,  QK[i,j] = q~_i.k_j
//   A[i,j] = b_i KK[i,j] M[i,j] for j < i (strictly lower; the UT system is I + A; stored negated, nA = -A)
//   P[i,j] = QK[i,j] M[i,j] (j <= i),  qG_i = G_i q~_i,  kGe_j = Ge_j k_j
//   U = (I + A)^-1 diag(b) V          ("new values", forward substitution)
//   W = (I + A)^-1 diag(b G) K        ("k_cumdecay"; only when the start state is not zero)
//   Dl = U - W S0                     (the per-row deltas b_i (v_i - S'_i^T k_i) given the start state S0)
// Then o_i = G_i S0^T q~_i + sum_{j<=i} P[i,j] Dl_j and S_end = G_{L-1} S0 + sum_j Ge_j k_j Dl_j^T.
// M, KK, P and nA are zero above their triangles (rows < L); products are fp32 (gemm_rows), the
// log-decays and their differences double.
struct ChunkWork {
  int64_t C = 0, Dk = 0, Dv = 0, L = 0;
  bool zero_s0 = false;                // the chunk starts a segment: S0 = 0, W is not needed
  std::vector<float> q, k, v, beta;    // [C, Dk], [C, Dk], [C, Dv], [C]
  std::vector<float> kT;               // [Dk, C]
  std::vector<double> gam;             // [C]
  std::vector<float> G, Ge;            // [C]
  std::vector<float> M, KK, P, nA;     // [C, C]; KK holds KK[i,j] M[i,j] (j < i)
  std::vector<float> U, W, Dl;         // [C, Dv], [C, Dk], [C, Dv]
  std::vector<float> qG, kGe;          // [C, Dk] each

  ChunkWork(int64_t chunk, int64_t Dk, int64_t Dv);
  bool fits(int64_t chunk, int64_t dk, int64_t dv) const { return C == chunk && Dk == dk && Dv == dv; }
  // Gathers rows [c.t0, c.t0 + c.len) of value head h (q scaled) and computes gam, G, Ge, M, P, nA, U and,
  // unless c.first, W.
  void load(const GdnShape& s, const float* q, const float* k, const float* v, const float* g, const float* beta,
            const Chunk& c, int64_t h);
  // Dl = U - W S0 (S0 [Dk, Dv]; unused when zero_s0).
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
