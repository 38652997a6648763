// Gated delta rule, chunked backward (the algorithm the CUDA kernel implements).
//
// Per value head, chunks are visited in REVERSE order carrying dS = dL/dS_end of the current chunk
// (zero for the last chunk of a segment). Each chunk recomputes its forward quantities from its start
// state S0 (saved chunk_states, or a recomputed forward state pass) -- see ops_gdn_rule_impl.h for the
// names: q~, k, v, b, gam, G, Ge, M, KK, QK, A, U, W, Dl, P[i,j] = QK[i,j] M[i,j] (j <= i) -- and then,
// with dO the chunk rows of dout and rows i, j in [0, L), last = L-1:
//
//  (1) dDl_j  = sum_{i>=j} P[i,j] dO_i + Ge_j dS^T k_j        (o = P Dl + ...; S_end = ... + Ge_j k_j Dl_j^T)
//  (2) intra-chunk output o_i += sum_{j<=i} P[i,j] Dl_j: with dP[i,j] = dO_i . Dl_j,
//        dq~_i += sum_j dP[i,j] M[i,j] k_j,   dk_j += sum_i dP[i,j] M[i,j] q~_i,
//        dgam_i += dP[i,j] P[i,j],  dgam_j -= dP[i,j] P[i,j]  for j < i    (M[i,j] = exp(gam_i - gam_j))
//  (3) inter-chunk output o_i += G_i S0^T q~_i: with r_i = S0 dO_i,
//        dq~_i += G_i r_i,   dgam_i += G_i (q~_i . r_i),   dS0 += sum_i G_i q~_i dO_i^T
//  (4) end state S_end = G_last S0 + sum_j Ge_j k_j Dl_j^T: with r_j = dS Dl_j,
//        dS0 += G_last dS,   dgam_last += G_last <S0, dS>,
//        dk_j += Ge_j r_j,   dgam_last += Ge_j (k_j . r_j),   dgam_j -= Ge_j (k_j . r_j)  (j < last)
//  (5) Dl = U - W S0:  dU = dDl,  dW_i = -S0 dDl_i,  dS0 -= sum_i W_i dDl_i^T
//  (6) UT transform X = (I+A)^-1 B for (X, B) = (U, diag(b) V) and (W, diag(b G) K): dB = (I+A)^-T dX by
//      back substitution, Y_i = dX_i - sum_{j>i} A[j,i] Y_j (YU from dU, YW from dW), and
//        dA[i,j] = -(YU_i . U_j + YW_i . W_j)   for j < i
//  (7) B rows b_i v_i and b_i G_i k_i:
//        dv_i = b_i YU_i,  db_i += v_i . YU_i,  dk_i += b_i G_i YW_i,
//        db_i += G_i (k_i . YW_i),  dgam_i += b_i G_i (k_i . YW_i)
//  (8) A[i,j] = b_i KK[i,j] M[i,j], j < i:
//        db_i += dA KK M,  dk_i += dA b_i M k_j,  dk_j += dA b_i M k_i,
//        dgam_i += dA A[i,j],  dgam_j -= dA A[i,j]
//  (9) gam = cumsum(g) within the chunk: dg_i = sum_{m>=i} dgam_m;  q~ = scale q: dq = scale dq~.
//      dS <- dS0 for the previous chunk (dropped at a segment start).
// dq and dk of a key head sum the value heads of its group in head order; one thread per key head.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops_gdn.h"
#include "backend/cpu/ops_gdn_rule_impl.h"

namespace lt::cpu {

using namespace gdn_detail;

namespace {

// Gradient scratch of one chunk of one value head (fp32 rows; per-row scalars in double).
struct ChunkGrad {
  int64_t C = 0, Dk = 0, Dv = 0;
  std::vector<float> dO, dOG, DlGe, dDl, dW, YU, YW;  // [C, Dv] x 3, [C, Dv], [C, Dk], [C, Dv], [C, Dk]
  std::vector<float> dQ, dK, T;                       // [C, Dk] each (T: a temporary)
  std::vector<float> DlT, UT, WT;                     // [Dv, C], [Dv, C], [Dk, C]
  std::vector<float> S0T, dST;                        // [Dv, Dk] each
  std::vector<float> dPM, cA, X;                      // [C, C]
  std::vector<double> dgam, db;                       // [C]
  std::vector<float> dS0;                             // [Dk, Dv]
  ChunkGrad(int64_t c, int64_t dk, int64_t dv)
      : C(c),
        Dk(dk),
        Dv(dv),
        dO(size_t(C * Dv)),
        dOG(size_t(C * Dv)),
        DlGe(size_t(C * Dv)),
        dDl(size_t(C * Dv)),
        dW(size_t(C * Dk)),
        YU(size_t(C * Dv)),
        YW(size_t(C * Dk)),
        dQ(size_t(C * Dk)),
        dK(size_t(C * Dk)),
        T(size_t(C * Dk)),
        DlT(size_t(Dv * C)),
        UT(size_t(Dv * C)),
        WT(size_t(Dk * C)),
        S0T(size_t(Dv * Dk)),
        dST(size_t(Dv * Dk)),
        dPM(size_t(C * C)),
        cA(size_t(C * C)),
        X(size_t(C * C)),
        dgam(static_cast<size_t>(C)),
        db(static_cast<size_t>(C)),
        dS0(size_t(Dk * Dv)) {}
  bool fits(int64_t c, int64_t dk, int64_t dv) const { return C == c && Dk == dk && Dv == dv; }
};

inline double dotf(const float* a, const float* b, int64_t n) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += double(a[i]) * double(b[i]);
  return s;
}

// X[i,j] (j < i) is added to row i's and subtracted from row j's entry of d (double sums, fixed order).
void add_pairs(const float* X, int64_t C, int64_t L, double* d) {
  for (int64_t i = 1; i < L; ++i) {
    const float* Xi = X + i * C;
    double rs = 0;
    for (int64_t j = 0; j < i; ++j) {
      rs += double(Xi[j]);
      d[j] -= double(Xi[j]);
    }
    d[i] += rs;
  }
}

// Y[j, :] (+)= sum_{i>=j} Z[i, j] B[i, :] for j < L, Z [C, C] zero above its diagonal (Z^T B by row blocks).
void lower_t_times(const float* Z, int64_t C, int64_t L, const float* B, int64_t n, float* Y, bool accumulate) {
  for (int64_t j0 = 0; j0 < L; j0 += kRowBlock) {
    const int64_t m = std::min(kRowBlock, L - j0);
    gemm_rows(Y + j0 * n, n, m, n, Z + j0 * C + j0, 1, C, B + j0 * n, n, L - j0, accumulate);
  }
}
// Y[i, :] (+)= sum_{j<=i} Z[i, j] B[j, :] for i < L, Z [C, C] zero above its diagonal (Z B by row blocks).
void lower_times(const float* Z, int64_t C, int64_t L, const float* B, int64_t n, float* Y, bool accumulate) {
  for (int64_t i0 = 0; i0 < L; i0 += kRowBlock) {
    const int64_t m = std::min(kRowBlock, L - i0);
    gemm_rows(Y + i0 * n, n, m, n, Z + i0 * C, C, 1, B, n, i0 + m, accumulate);
  }
}

// Steps (1)-(3): gradients of the chunk outputs. S0 / dS are nullptr when zero.
void output_grads(const ChunkWork& w, ChunkGrad& r, const float* S0, const float* dS) {
  const int64_t L = w.L, C = w.C, Dk = w.Dk, Dv = w.Dv;
  // (1) dDl_j = Ge_j dS^T k_j + sum_{i>=j} P[i,j] dO_i
  if (dS) gemm_rows(r.dDl.data(), Dv, L, Dv, w.kGe.data(), Dk, 1, dS, Dv, Dk, false);
  lower_t_times(w.P.data(), C, L, r.dO.data(), Dv, r.dDl.data(), dS != nullptr);
  // (2) dP[i,j] = dO_i . Dl_j; dPM = dP M (zero above the diagonal); X = dP P (-> dgam, j < i).
  transpose(w.Dl.data(), L, Dv, Dv, r.DlT.data(), C);
  for (int64_t i0 = 0; i0 < L; i0 += kRowBlock) {
    const int64_t m = std::min(kRowBlock, L - i0);
    gemm_rows(&r.dPM[size_t(i0 * C)], C, m, i0 + m, &r.dO[size_t(i0 * Dv)], Dv, 1, r.DlT.data(), C, Dv, false);
  }
  for (int64_t i = 0; i < L; ++i) {
    float* dPi = &r.dPM[size_t(i * C)];
    const float* Mi = &w.M[size_t(i * C)];
    const float* Pi = &w.P[size_t(i * C)];
    float* Xi = &r.X[size_t(i * C)];
    for (int64_t j = 0; j <= i; ++j) {
      Xi[j] = dPi[j] * Pi[j];
      dPi[j] *= Mi[j];
    }
    for (int64_t j = i + 1; j < L; ++j) Xi[j] = dPi[j] = 0.0f;
  }
  add_pairs(r.X.data(), C, L, r.dgam.data());  // M[i,i] = 1 does not depend on gam (the diagonal is skipped)
  lower_times(r.dPM.data(), C, L, w.k.data(), Dk, r.dQ.data(), false);    // dq~_i = sum_{j<=i} dPM[i,j] k_j
  lower_t_times(r.dPM.data(), C, L, w.q.data(), Dk, r.dK.data(), false);  // dk_j = sum_{i>=j} dPM[i,j] q~_i
  if (!S0) return;
  // (3) r_i = S0 dO_i: dq~_i += G_i r_i, dgam_i += G_i q~_i . r_i, dS0 = sum_i G_i q~_i dO_i^T.
  transpose(S0, Dk, Dv, Dv, r.S0T.data(), Dk);
  for (int64_t i = 0; i < L; ++i)
    for (int64_t e = 0; e < Dv; ++e) r.dOG[size_t(i * Dv + e)] = w.G[size_t(i)] * r.dO[size_t(i * Dv + e)];
  gemm_rows(r.T.data(), Dk, L, Dk, r.dOG.data(), Dv, 1, r.S0T.data(), Dk, Dv, false);
  for (int64_t i = 0; i < L; ++i) {
    const float* t = &r.T[size_t(i * Dk)];
    axpyf(1.0f, t, &r.dQ[size_t(i * Dk)], Dk);
    r.dgam[size_t(i)] += dotf(t, &w.q[size_t(i * Dk)], Dk);
  }
  gemm_rows(r.dS0.data(), Dv, Dk, Dv, w.qG.data(), 1, Dk, r.dO.data(), Dv, L, false);
}

// Steps (4)-(5): gradients of the end state and of Dl = U - W S0. S0 / dS are nullptr when zero.
void state_grads(const ChunkWork& w, ChunkGrad& r, const float* S0, const float* dS) {
  const int64_t L = w.L, Dk = w.Dk, Dv = w.Dv, last = L - 1;
  if (dS) {  // (4) r_j = dS Dl_j: dk_j += Ge_j r_j, dgam_last/j +-= Ge_j k_j . r_j
    if (S0) r.dgam[size_t(last)] += double(w.G[size_t(last)]) * dotf(S0, dS, Dk * Dv);
    transpose(dS, Dk, Dv, Dv, r.dST.data(), Dk);
    for (int64_t j = 0; j < L; ++j)
      for (int64_t e = 0; e < Dv; ++e) r.DlGe[size_t(j * Dv + e)] = w.Ge[size_t(j)] * w.Dl[size_t(j * Dv + e)];
    gemm_rows(r.T.data(), Dk, L, Dk, r.DlGe.data(), Dv, 1, r.dST.data(), Dk, Dv, false);
    for (int64_t j = 0; j < L; ++j) {
      const float* t = &r.T[size_t(j * Dk)];
      axpyf(1.0f, t, &r.dK[size_t(j * Dk)], Dk);
      if (j < last) {  // Ge[last] = 1 does not depend on gam
        const double x = dotf(t, &w.k[size_t(j * Dk)], Dk);
        r.dgam[size_t(last)] += x;
        r.dgam[size_t(j)] -= x;
      }
    }
  }
  if (!S0) return;
  // (5) dW_i = -S0 dDl_i;  dS0 += G_last dS - sum_i W_i dDl_i^T
  gemm_rows<true>(r.dW.data(), Dk, L, Dk, r.dDl.data(), Dv, 1, r.S0T.data(), Dk, Dv, false);
  gemm_rows<true>(r.dS0.data(), Dv, Dk, Dv, w.W.data(), 1, Dk, r.dDl.data(), Dv, L, true);
  if (dS) axpyf(w.G[size_t(last)], dS, r.dS0.data(), Dk * Dv);
}

// Y_i = dX_i - sum_{j>i} A[j,i] Y_j  (solves (I + A)^T Y = dX), rows of width n, by row blocks from the
// last: the rows after the block in one product, then the block's own rows from its last.
void back_substitute(const ChunkWork& w, const float* dX, float* Y, int64_t n) {
  const int64_t L = w.L, C = w.C;
  std::copy_n(dX, L * n, Y);
  const float* nA = w.nA.data();
  for (int64_t i0 = (L - 1) / kRowBlock * kRowBlock; i0 >= 0; i0 -= kRowBlock) {
    const int64_t m = std::min(kRowBlock, L - i0), e = i0 + m;
    gemm_rows(Y + i0 * n, n, m, n, nA + e * C + i0, 1, C, Y + e * n, n, L - e, true);
    for (int64_t i = e - 2; i >= i0; --i)
      gemm_rows(Y + i * n, n, 1, n, nA + (i + 1) * C + i, 1, C, Y + (i + 1) * n, n, e - 1 - i, true);
  }
}

// Steps (6)-(8): backward of the UT transform and of A, B.
void ut_grads(const ChunkWork& w, ChunkGrad& r, bool zero_s0) {
  const int64_t L = w.L, C = w.C, Dk = w.Dk, Dv = w.Dv;
  back_substitute(w, r.dDl.data(), r.YU.data(), Dv);  // (6)
  if (!zero_s0) back_substitute(w, r.dW.data(), r.YW.data(), Dk);
  // dA[i,j] = -(YU_i . U_j + YW_i . W_j), j < i; kept as cA = dA b_i M (-> dk) and X = dA A (-> dgam).
  transpose(w.U.data(), L, Dv, Dv, r.UT.data(), C);
  if (!zero_s0) transpose(w.W.data(), L, Dk, Dk, r.WT.data(), C);
  for (int64_t i0 = 0; i0 < L; i0 += kRowBlock) {
    const int64_t m = std::min(kRowBlock, L - i0);
    float* dA0 = &r.cA[size_t(i0 * C)];
    gemm_rows<true>(dA0, C, m, i0 + m, &r.YU[size_t(i0 * Dv)], Dv, 1, r.UT.data(), C, Dv, false);
    if (!zero_s0) gemm_rows<true>(dA0, C, m, i0 + m, &r.YW[size_t(i0 * Dk)], Dk, 1, r.WT.data(), C, Dk, true);
  }
  for (int64_t i = 0; i < L; ++i) {
    const double bi = double(w.beta[size_t(i)]);
    // (7) B rows b_i v_i and b_i G_i k_i
    r.db[size_t(i)] += dotf(&w.v[size_t(i * Dv)], &r.YU[size_t(i * Dv)], Dv);
    if (!zero_s0) {
      const double gi = double(w.G[size_t(i)]);
      const double tt = dotf(&w.k[size_t(i * Dk)], &r.YW[size_t(i * Dk)], Dk);
      r.db[size_t(i)] += gi * tt;
      r.dgam[size_t(i)] += bi * gi * tt;
      axpyf(float(bi * gi), &r.YW[size_t(i * Dk)], &r.dK[size_t(i * Dk)], Dk);
    }
    // (8) A[i,j] = b_i KK[i,j] M[i,j]: db_i += dA KK M; dgam_i/j +-= dA A; cA = dA b_i M.
    float* dAi = &r.cA[size_t(i * C)];
    const float* nAi = &w.nA[size_t(i * C)];
    const float* KMi = &w.KK[size_t(i * C)];
    const float* Mi = &w.M[size_t(i * C)];
    float* Xi = &r.X[size_t(i * C)];
    const float bf = w.beta[size_t(i)];
    double dbi = 0;
    for (int64_t j = 0; j < i; ++j) {
      const float da = dAi[j];
      Xi[j] = -(da * nAi[j]);
      dbi += double(da) * double(KMi[j]);
      dAi[j] = da * (bf * Mi[j]);
    }
    for (int64_t j = i; j < L; ++j) Xi[j] = dAi[j] = 0.0f;
    r.db[size_t(i)] += dbi;
  }
  add_pairs(r.X.data(), C, L, r.dgam.data());
  // dk_i += sum_{j<i} cA[i,j] k_j,  dk_j += sum_{i>j} cA[i,j] k_i
  lower_times(r.cA.data(), C, L, w.k.data(), Dk, r.dK.data(), true);
  lower_t_times(r.cA.data(), C, L, w.k.data(), Dk, r.dK.data(), true);
}

// Backward of one chunk of value head h. dS: in dL/dS_end (zero when dS_zero), out dL/dS0. Adds to dq,
// dk; writes dv, dg, dbeta.
void chunk_bwd(const GdnShape& s, ChunkWork& w, ChunkGrad& r, const Chunk& c, int64_t h, const float* S0, float* dS,
               bool dS_zero, const float* dout, float* dq, float* dk, float* dv, float* dg, float* dbeta) {
  const int64_t L = w.L, Dk = s.Dk, Dv = s.Dv, kh = h / (s.Hv / s.Hk);
  for (int64_t i = 0; i < L; ++i)
    std::copy_n(dout + ((c.t0 + i) * s.Hv + h) * Dv, Dv, &r.dO[size_t(i * Dv)]);
  std::fill_n(r.dgam.begin(), L, 0.0);
  std::fill_n(r.db.begin(), L, 0.0);
  const float* s0 = w.zero_s0 ? nullptr : S0;
  const float* ds = dS_zero ? nullptr : dS;
  w.deltas(S0);
  output_grads(w, r, s0, ds);
  state_grads(w, r, s0, ds);
  ut_grads(w, r, w.zero_s0);
  const float scale = q_scale(Dk);
  double suffix = 0;  // (9)
  for (int64_t i = L - 1; i >= 0; --i) {
    const int64_t t = c.t0 + i;
    suffix += r.dgam[size_t(i)];
    dg[t * s.Hv + h] = float(suffix);
    dbeta[t * s.Hv + h] = float(r.db[size_t(i)]);
    const float bi = w.beta[size_t(i)];
    float* dvr = dv + (t * s.Hv + h) * Dv;
    for (int64_t e = 0; e < Dv; ++e) dvr[e] = bi * r.YU[size_t(i * Dv + e)];
    float* dqr = dq + (t * s.Hk + kh) * Dk;
    float* dkr = dk + (t * s.Hk + kh) * Dk;
    for (int64_t d = 0; d < Dk; ++d) {
      dqr[d] += scale * r.dQ[size_t(i * Dk + d)];
      dkr[d] += r.dK[size_t(i * Dk + d)];
    }
  }
  if (!w.zero_s0) std::copy_n(r.dS0.data(), Dk * Dv, dS);
}

// Per-thread scratch of the backward (reused across calls).
struct BwdScratch {
  ChunkWork w{0, 0, 0};
  ChunkGrad r{0, 0, 0};
  std::vector<float> dS, states;
  void prepare(const GdnShape& s, int64_t n_states) {
    if (!w.fits(s.chunk, s.Dk, s.Dv)) w = ChunkWork(s.chunk, s.Dk, s.Dv);
    if (!r.fits(s.chunk, s.Dk, s.Dv)) r = ChunkGrad(s.chunk, s.Dk, s.Dv);
    dS.resize(size_t(s.Dk * s.Dv));
    if (int64_t(states.size()) < n_states) states.resize(size_t(n_states));
  }
};

}  // namespace

void gdn_rule_chunked_bwd(const GdnShape& s, const float* q, const float* k, const float* v, const float* g,
                          const float* beta, const int32_t* seg, const float* chunk_states, const float* dout,
                          float* dq, float* dk, float* dv, float* dg, float* dbeta) {
  check_shape(s, "gdn_rule_chunked_bwd");
  const auto chunks = make_chunks(s, seg);
  const int64_t nC = int64_t(chunks.size()), DD = s.Dk * s.Dv, group = s.Hv / s.Hk;
  std::fill(dq, dq + s.S * s.Hk * s.Dk, 0.0f);
  std::fill(dk, dk + s.S * s.Hk * s.Dk, 0.0f);
#pragma omp parallel for schedule(static) if (s.S * s.Hv * DD > (1 << 18))
  for (int64_t kh = 0; kh < s.Hk; ++kh) {
    const FlushDenormals ftz;
    thread_local BwdScratch scratch;
    scratch.prepare(s, chunk_states ? 0 : nC * DD);
    ChunkWork& w = scratch.w;
    ChunkGrad& r = scratch.r;
    float* dS = scratch.dS.data();
    for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
      const float* states = chunk_states ? chunk_states + h * DD : scratch.states.data();
      const int64_t stride = chunk_states ? s.Hv * DD : DD;
      if (!chunk_states) head_chunked_fwd(s, q, k, v, g, beta, chunks, h, nullptr, scratch.states.data(), DD);
      for (int64_t ci = nC - 1; ci >= 0; --ci) {
        const Chunk& c = chunks[size_t(ci)];
        const bool dS_zero = ci + 1 == nC || chunks[size_t(ci + 1)].first;  // last chunk of its segment
        w.load(s, q, k, v, g, beta, c, h);
        chunk_bwd(s, w, r, c, h, states + ci * stride, dS, dS_zero, dout, dq, dk, dv, dg, dbeta);
      }
    }
  }
}

}  // namespace lt::cpu
