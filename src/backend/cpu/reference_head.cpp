// Embedding unit and the head (final norm + LM head + cross-entropy) of reference.h.
#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/reference.h"
#include "core/error.h"

namespace lt::cpu {

void embed_forward(const ModelConfig& c, const float* emb, const int32_t* ids, int64_t T, float* x) {
  embedding_fwd(emb, c.vocab, c.hidden, ids, T, x);
}

void embed_backward(const ModelConfig& c, const int32_t* ids, int64_t T, const float* dx, float* demb) {
  embedding_bwd(ids, T, c.hidden, dx, demb);
}

namespace {
std::atomic<int64_t> g_head_chunk_override{0};
}  // namespace

void set_head_chunk_rows(int64_t rows) { g_head_chunk_override = std::max<int64_t>(rows, 0); }

int64_t head_chunk_rows(int64_t vocab) {
  if (int64_t o = g_head_chunk_override.load(); o > 0) return o;
  // ~320 MiB of fp32 logits per chunk (552 rows at a 152k vocabulary). Each chunk re-reads and
  // re-writes the whole [vocab, hidden] gradient in its dW GEMM, so fewer, larger chunks are faster:
  // 110-row chunks made the Qwen2.5-0.5B head 1.35x slower than one 512-row chunk. Depends on the
  // vocabulary only, so the chunking is the same for every caller.
  const int64_t budget = (int64_t(320) << 20) / 4;
  return std::clamp<int64_t>(budget / std::max<int64_t>(vocab, 1), 16, 1024);
}

namespace {

// The head's token chunks (head_chunk_rows): fn(r0, n, any) for each chunk of each sample, any: it has a target.
template <class Fn>
void for_head_chunks(const int32_t* targets, int64_t T, int64_t V, int64_t seq, Fn&& fn) {
  // Chunks never cross a sample boundary (seq == 0: the T rows are one sample); each sample is split
  // into equal chunks of at most head_chunk_rows() rows (e.g. 1024 rows at 552 max -> 2 x 512). So a
  // call per sample with seq == 0 chunks exactly like one call over the batch with seq given.
  const int64_t span = seq > 0 ? seq : std::max<int64_t>(T, 1);
  const int64_t R0 = head_chunk_rows(V), n_chunks = (span + R0 - 1) / R0;
  const int64_t R = (span + n_chunks - 1) / n_chunks;
  for (int64_t s0 = 0; s0 < T; s0 += span)
    for (int64_t r0 = s0; r0 < std::min(T, s0 + span); r0 += R) {
      const int64_t n = std::min(R, s0 + span - r0);
      const bool any = std::any_of(targets + r0, targets + r0 + n, [](int32_t t) { return t != kIgnoreIndex; });
      fn(r0, n, any);
    }
}

int64_t head_chunk_span(int64_t T, int64_t V, int64_t seq) {
  const int64_t span = seq > 0 ? seq : std::max<int64_t>(T, 1);
  const int64_t R0 = head_chunk_rows(V), n_chunks = (span + R0 - 1) / R0;
  return std::min((span + n_chunks - 1) / n_chunks, span);
}

struct HeadNorm {
  NormScale scale;
  int64_t offset;
  HeadNorm(const ModelConfig& c, const UnitLayout& head_lay, const float* head_w)
      : scale(head_w + head_lay.find("norm.weight").offset, c.hidden, c.norm_plus_one),
        offset(head_lay.find("norm.weight").offset) {}
};

// The head's pass: loss, and with dx its gradient; d_lm_w (nullable) the LM weight's, d_norm_w the final norm's,
// lse (nullable) each row's log-sum-exp.
HeadResult head_pass(const ModelConfig& c, const UnitLayout& head_lay, const float* head_w, const float* lm_w,
                     const int32_t* targets, int64_t T, const float* x, float loss_scale, float* dx, float* d_norm_w,
                     float* d_lm_w, float* lse, int64_t seq) {
  LT_CHECK(head_lay.kind == UnitKind::Head, "head_forward_backward called with a non-head unit layout");
  LT_CHECK(seq >= 0 && (seq == 0 || T % seq == 0), "head_forward_backward: T={} is not a multiple of seq={}", T, seq);
  const bool grad = dx != nullptr;
  const int64_t H = c.hidden, V = c.vocab;
  const float eps = float(c.rms_eps);
  const HeadNorm norm(c, head_lay, head_w);
  auto xn = std::make_unique_for_overwrite<float[]>(size_t(std::max<int64_t>(T * H, 1)));
  rmsnorm_fwd(x, norm.scale.get(), T, H, eps, xn.get());
  std::unique_ptr<float[]> dxn;
  if (grad) dxn = std::make_unique_for_overwrite<float[]>(size_t(std::max<int64_t>(T * H, 1)));
  auto logits = std::make_unique_for_overwrite<float[]>(size_t(head_chunk_span(T, V, seq) * V));
  HeadResult res;
  for_head_chunks(targets, T, V, seq, [&](int64_t r0, int64_t n, bool any) {
    if (!any) {  // nothing to predict: no loss, zero gradient
      if (grad) std::fill(dxn.get() + r0 * H, dxn.get() + (r0 + n) * H, 0.0f);
      if (lse) std::fill(lse + r0, lse + r0 + n, 0.0f);
      return;
    }
    const float* xc = xn.get() + r0 * H;
    sgemm(false, true, n, V, H, 1.0f, xc, H, lm_w, H, 0.0f, logits.get(), V);
    cross_entropy(logits.get(), targets + r0, n, V, loss_scale, grad, &res.loss_sum, &res.n_tokens,
                  lse ? lse + r0 : nullptr);
    if (!grad) return;
    sgemm(false, false, n, H, V, 1.0f, logits.get(), V, lm_w, H, 0.0f, dxn.get() + r0 * H, H);
    if (d_lm_w) sgemm(true, false, V, H, n, 1.0f, logits.get(), V, xc, H, 1.0f, d_lm_w, H);
  });
  if (grad) rmsnorm_bwd(x, norm.scale.get(), dxn.get(), T, H, eps, dx, d_norm_w);
  return res;
}

}  // namespace

HeadResult head_forward_backward(const ModelConfig& c, const UnitLayout& head_lay, const float* head_w,
                                 const float* lm_w, const int32_t* targets, int64_t T, const float* x,
                                 float loss_scale, float* dx, float* d_head_w, float* d_lm_w, int64_t seq) {
  LT_CHECK(!dx || (d_head_w && d_lm_w), "head_forward_backward: dx given without d_head_w/d_lm_w");
  const int64_t norm_off = head_lay.find("norm.weight").offset;
  return head_pass(c, head_lay, head_w, lm_w, targets, T, x, loss_scale, dx, dx ? d_head_w + norm_off : nullptr, d_lm_w,
                   nullptr, seq);
}

HeadResult head_forward_lse(const ModelConfig& c, const UnitLayout& head_lay, const float* head_w, const float* lm_w,
                            const int32_t* targets, int64_t T, const float* x, float loss_scale, float* dx,
                            float* d_norm_w, float* lse, int64_t seq) {
  LT_CHECK(!dx || d_norm_w, "head_forward_lse: dx given without d_norm_w");
  return head_pass(c, head_lay, head_w, lm_w, targets, T, x, loss_scale, dx, d_norm_w, nullptr, lse, seq);
}

void head_lm_grad_slice(const ModelConfig& c, const UnitLayout& head_lay, const float* head_w, const float* lm_w,
                        const int32_t* targets, int64_t T, const float* x, const float* lse, float loss_scale,
                        int64_t v0, int64_t n_v, float* dw, int64_t seq) {
  const int64_t H = c.hidden, V = c.vocab;
  LT_CHECK(v0 >= 0 && n_v >= 1 && v0 + n_v <= V, "head_lm_grad_slice: columns [{}, {}) outside the vocabulary of {}",
           v0, v0 + n_v, V);
  const HeadNorm norm(c, head_lay, head_w);
  auto xn = std::make_unique_for_overwrite<float[]>(size_t(std::max<int64_t>(T * H, 1)));
  rmsnorm_fwd(x, norm.scale.get(), T, H, float(c.rms_eps), xn.get());
  auto z = std::make_unique_for_overwrite<float[]>(size_t(head_chunk_span(T, V, seq) * n_v));
  for_head_chunks(targets, T, V, seq, [&](int64_t r0, int64_t n, bool any) {
    if (!any) return;
    const float* xc = xn.get() + r0 * H;
    sgemm(false, true, n, n_v, H, 1.0f, xc, H, lm_w + v0 * H, H, 0.0f, z.get(), n_v);
    cross_entropy_slice_grad(z.get(), targets + r0, n, v0, n_v, lse + r0, loss_scale);
    sgemm(true, false, n_v, H, n, 1.0f, z.get(), n_v, xc, H, 1.0f, dw, H);
  });
}

void head_logits(const ModelConfig& c, const UnitLayout& head_lay, const float* head_w, const float* lm_w,
                 const float* x, const int64_t* rows, int64_t n_rows, float* out) {
  const int64_t H = c.hidden;
  const NormScale norm_scale(head_w + head_lay.find("norm.weight").offset, H, c.norm_plus_one);
  const float* norm_w = norm_scale.get();
  std::vector<float> xn(static_cast<size_t>(std::max<int64_t>(n_rows * H, 1)));
  for (int64_t i = 0; i < n_rows; ++i) rmsnorm_fwd(x + rows[i] * H, norm_w, 1, H, float(c.rms_eps), &xn[size_t(i * H)]);
  sgemm(false, true, n_rows, c.vocab, H, 1.0f, xn.data(), H, lm_w, H, 0.0f, out, c.vocab);
}

}  // namespace lt::cpu
