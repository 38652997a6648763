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

// Gradient scratch of one chunk of one value head.
struct ChunkGrad {
  int64_t C, Dk, Dv;
  std::vector<float> dO, dDl, dW, YU, YW;  // [C, Dv], [C, Dv], [C, Dk], [C, Dv], [C, Dk]
  std::vector<double> dQ, dK, dgam, db;    // [C, Dk], [C, Dk], [C], [C]
  std::vector<double> dA, dS0, acc;        // [C, C], [Dk, Dv], [max(Dk, Dv)]
  ChunkGrad(int64_t c, int64_t dk, int64_t dv)
      : C(c),
        Dk(dk),
        Dv(dv),
        dO(size_t(C * Dv)),
        dDl(size_t(C * Dv)),
        dW(size_t(C * Dk)),
        YU(size_t(C * Dv)),
        YW(size_t(C * Dk)),
        dQ(size_t(C * Dk)),
        dK(size_t(C * Dk)),
        dgam(static_cast<size_t>(C)),
        db(static_cast<size_t>(C)),
        dA(size_t(C * C)),
        dS0(size_t(Dk * Dv)),
        acc(size_t(std::max(Dk, Dv))) {}
};

inline double dotdd(const double* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * double(b[i]);
  return s;
}

// Steps (1)-(3): gradients of the chunk outputs.
void output_grads(const ChunkWork& w, ChunkGrad& r, const float* S0, const float* dS) {
  const int64_t L = w.L, C = w.C, Dk = w.Dk, Dv = w.Dv;
  double* acc = r.acc.data();
  for (int64_t j = 0; j < L; ++j) {  // (1)
    vecmat(&w.k[size_t(j * Dk)], dS, Dk, Dv, acc);
    for (int64_t e = 0; e < Dv; ++e) acc[e] *= double(w.Ge[size_t(j)]);
    for (int64_t i = j; i < L; ++i)
      axpyd(double(w.QK[size_t(i * C + j)]) * double(w.M[size_t(i * C + j)]), &r.dO[size_t(i * Dv)], acc, Dv);
    to_float(acc, &r.dDl[size_t(j * Dv)], Dv);
  }
  for (int64_t i = 0; i < L; ++i) {  // (2)
    for (int64_t j = 0; j <= i; ++j) {
      const size_t ij = size_t(i * C + j);
      const double dp = dotd(&r.dO[size_t(i * Dv)], &w.Dl[size_t(j * Dv)], Dv), m = double(w.M[ij]);
      if (j < i) {  // M[i,i] = 1 does not depend on gam (skipping it avoids a cancellation)
        const double x = dp * double(w.QK[ij]) * m;
        r.dgam[size_t(i)] += x;
        r.dgam[size_t(j)] -= x;
      }
      for (int64_t d = 0; d < Dk; ++d) {
        r.dQ[size_t(i * Dk + d)] += dp * m * double(w.k[size_t(j * Dk + d)]);
        r.dK[size_t(j * Dk + d)] += dp * m * double(w.q[size_t(i * Dk + d)]);
      }
    }
  }
  for (int64_t i = 0; i < L; ++i) {  // (3)
    const double gi = double(w.G[size_t(i)]);
    const float* dOi = &r.dO[size_t(i * Dv)];
    matvec(S0, dOi, Dk, Dv, acc);
    for (int64_t d = 0; d < Dk; ++d) r.dQ[size_t(i * Dk + d)] += gi * acc[d];
    r.dgam[size_t(i)] += gi * dotdd(acc, &w.q[size_t(i * Dk)], Dk);
    for (int64_t d = 0; d < Dk; ++d) axpyd(gi * double(w.q[size_t(i * Dk + d)]), dOi, &r.dS0[size_t(d * Dv)], Dv);
  }
}

// Steps (4)-(5): gradients of the end state and of Dl = U - W S0.
void state_grads(const ChunkWork& w, ChunkGrad& r, const float* S0, const float* dS) {
  const int64_t L = w.L, Dk = w.Dk, Dv = w.Dv, last = L - 1;
  double* acc = r.acc.data();
  const double gl = double(w.G[size_t(last)]);
  for (int64_t i = 0; i < Dk * Dv; ++i) r.dS0[size_t(i)] += gl * double(dS[i]);
  r.dgam[size_t(last)] += gl * dotd(S0, dS, Dk * Dv);
  for (int64_t j = 0; j < L; ++j) {  // (4)
    const double ge = double(w.Ge[size_t(j)]);
    matvec(dS, &w.Dl[size_t(j * Dv)], Dk, Dv, acc);
    for (int64_t d = 0; d < Dk; ++d) r.dK[size_t(j * Dk + d)] += ge * acc[d];
    if (j < last) {  // Ge[last] = 1 does not depend on gam
      const double x = ge * dotdd(acc, &w.k[size_t(j * Dk)], Dk);
      r.dgam[size_t(last)] += x;
      r.dgam[size_t(j)] -= x;
    }
  }
  for (int64_t i = 0; i < L; ++i) {  // (5)
    const float* dDli = &r.dDl[size_t(i * Dv)];
    matvec(S0, dDli, Dk, Dv, acc);
    for (int64_t d = 0; d < Dk; ++d) r.dW[size_t(i * Dk + d)] = -float(acc[d]);
    for (int64_t d = 0; d < Dk; ++d) axpyd(-double(w.W[size_t(i * Dk + d)]), dDli, &r.dS0[size_t(d * Dv)], Dv);
  }
}

// Y_i = dX_i - sum_{j>i} A[j,i] Y_j  (solves (I + A)^T Y = dX), rows of width n.
void back_substitute(const ChunkWork& w, const float* dX, float* Y, int64_t n, double* acc) {
  for (int64_t i = w.L - 1; i >= 0; --i) {
    for (int64_t e = 0; e < n; ++e) acc[e] = double(dX[i * n + e]);
    for (int64_t j = i + 1; j < w.L; ++j) axpyd(-double(w.A[size_t(j * w.C + i)]), Y + j * n, acc, n);
    to_float(acc, Y + i * n, n);
  }
}

// Steps (6)-(8): backward of the UT transform and of A, B.
void ut_grads(const ChunkWork& w, ChunkGrad& r) {
  const int64_t L = w.L, C = w.C, Dk = w.Dk, Dv = w.Dv;
  back_substitute(w, r.dDl.data(), r.YU.data(), Dv, r.acc.data());  // (6)
  back_substitute(w, r.dW.data(), r.YW.data(), Dk, r.acc.data());
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < i; ++j)
      r.dA[size_t(i * C + j)] = -(dotd(&r.YU[size_t(i * Dv)], &w.U[size_t(j * Dv)], Dv) +
                                  dotd(&r.YW[size_t(i * Dk)], &w.W[size_t(j * Dk)], Dk));
  for (int64_t i = 0; i < L; ++i) {  // (7); dv_i = b_i YU_i is written by the caller
    const double bi = double(w.beta[size_t(i)]), gi = double(w.G[size_t(i)]);
    r.db[size_t(i)] += dotd(&w.v[size_t(i * Dv)], &r.YU[size_t(i * Dv)], Dv);
    const double tt = dotd(&w.k[size_t(i * Dk)], &r.YW[size_t(i * Dk)], Dk);
    r.db[size_t(i)] += gi * tt;
    r.dgam[size_t(i)] += bi * gi * tt;
    for (int64_t d = 0; d < Dk; ++d) r.dK[size_t(i * Dk + d)] += bi * gi * double(r.YW[size_t(i * Dk + d)]);
  }
  for (int64_t i = 0; i < L; ++i) {  // (8)
    const double bi = double(w.beta[size_t(i)]);
    for (int64_t j = 0; j < i; ++j) {
      const size_t ij = size_t(i * C + j);
      const double da = r.dA[ij], m = double(w.M[ij]), c = da * bi * m;
      r.db[size_t(i)] += da * double(w.KK[ij]) * m;
      for (int64_t d = 0; d < Dk; ++d) {
        r.dK[size_t(i * Dk + d)] += c * double(w.k[size_t(j * Dk + d)]);
        r.dK[size_t(j * Dk + d)] += c * double(w.k[size_t(i * Dk + d)]);
      }
      const double x = da * double(w.A[ij]);
      r.dgam[size_t(i)] += x;
      r.dgam[size_t(j)] -= x;
    }
  }
}

// Backward of one chunk of value head h. dS: in dL/dS_end, out dL/dS0. Adds to dq, dk; writes dv, dg, dbeta.
void chunk_bwd(const GdnShape& s, ChunkWork& w, ChunkGrad& r, const Chunk& c, int64_t h, const float* S0, float* dS,
               const float* dout, float* dq, float* dk, float* dv, float* dg, float* dbeta) {
  const int64_t L = w.L, Dk = s.Dk, Dv = s.Dv, kh = h / (s.Hv / s.Hk);
  for (int64_t i = 0; i < L; ++i)
    std::copy_n(dout + ((c.t0 + i) * s.Hv + h) * Dv, Dv, &r.dO[size_t(i * Dv)]);
  std::fill(r.dQ.begin(), r.dQ.end(), 0.0);
  std::fill(r.dK.begin(), r.dK.end(), 0.0);
  std::fill(r.dgam.begin(), r.dgam.end(), 0.0);
  std::fill(r.db.begin(), r.db.end(), 0.0);
  std::fill(r.dS0.begin(), r.dS0.end(), 0.0);
  w.deltas(S0);
  output_grads(w, r, S0, dS);
  state_grads(w, r, S0, dS);
  ut_grads(w, r);
  const float scale = q_scale(Dk);
  double suffix = 0;  // (9)
  for (int64_t i = L - 1; i >= 0; --i) {
    const int64_t t = c.t0 + i;
    suffix += r.dgam[size_t(i)];
    dg[t * s.Hv + h] = float(suffix);
    dbeta[t * s.Hv + h] = float(r.db[size_t(i)]);
    for (int64_t e = 0; e < Dv; ++e) dv[(t * s.Hv + h) * Dv + e] = w.beta[size_t(i)] * r.YU[size_t(i * Dv + e)];
    for (int64_t d = 0; d < Dk; ++d) {
      dq[(t * s.Hk + kh) * Dk + d] += scale * float(r.dQ[size_t(i * Dk + d)]);
      dk[(t * s.Hk + kh) * Dk + d] += float(r.dK[size_t(i * Dk + d)]);
    }
  }
  to_float(r.dS0.data(), dS, Dk * Dv);
}

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
    ChunkWork w(s.chunk, s.Dk, s.Dv);
    ChunkGrad r(s.chunk, s.Dk, s.Dv);
    std::vector<float> dS(static_cast<size_t>(DD)), own_states(chunk_states ? 0 : size_t(nC * DD));
    for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
      const float* states = chunk_states ? chunk_states + h * DD : own_states.data();
      const int64_t stride = chunk_states ? s.Hv * DD : DD;
      if (!chunk_states) head_chunked_fwd(s, q, k, v, g, beta, chunks, h, nullptr, own_states.data(), DD);
      std::fill(dS.begin(), dS.end(), 0.0f);
      for (int64_t ci = nC - 1; ci >= 0; --ci) {
        const Chunk& c = chunks[size_t(ci)];
        w.load(s, q, k, v, g, beta, c, h);
        chunk_bwd(s, w, r, c, h, states + ci * stride, dS.data(), dout, dq, dk, dv, dg, dbeta);
        if (c.first) std::fill(dS.begin(), dS.end(), 0.0f);
      }
    }
  }
}

}  // namespace lt::cpu
