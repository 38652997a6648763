// The head's and the embedding's gradients written into their held bf16 buffers without a [vocab, hidden] fp32
// buffer (HostStateOptions::head_grad_slices): the LM weight's by vocabulary slices, the embedding's accumulated in
// place. Each held element is rounded once per micro-batch, as grad_done's grad_add rounds it.
#include <algorithm>

#include "core/dtype.h"
#include "exec/micro_batch_run.h"

namespace lt {

// The loss, dX and the final norm's gradient as head_loss computes them, each row's log-sum-exp kept; then, slice by
// slice of the vocabulary, that slice's LM weight gradient over every row of the micro-batch from its logits computed
// again, added into the held gradient. The x rows (boundary L) stay on the device until the last slice.
void MicroBatchRun::head_by_slices(const char* lm_w) {
  const int64_t unit = I.L + 1, H = I.c.hidden, V = I.c.vocab;
  const UnitLayout& lay = be.layout().head();
  const DType dt = I.dgrads->dtype();
  const int64_t esz = int64_t(dtype_size(dt));
  char* held = static_cast<char*>(I.dgrads->buffer(unit));
  double* sumsq = mbi_ + 1 == nmb_ ? I.d_scal.as<double>() + 2 + unit : nullptr;
  void* x = X(xbuf_[size_t(I.L)]);
  auto* tgt = I.d_tgt.as<int32_t>();
  auto* lse = I.head_lse.as<float>();
  if (mbi_ == 0) zero_grad(unit, held, lay.numel * esz, true);
  zero_grad(unit, I.head_norm_g.data(), H * int64_t(I.g_sz), false);
  dy_ = I.pool->acquire(Lane::Compute);
  for_chunks([&](int64_t r0, const DevGeometry& g) {
    be.head_loss_lse(I.head_w.data(), lm_w, tgt + r0, g, row(x, r0), scale_, row(X(dy_), r0), I.head_norm_g.data(),
                     lse + r0, I.d_scal.as<double>(), lab("head", -1));
  });
  be.grad_add(held + lay.find("norm.weight").offset * esz, dt, I.head_norm_g.data(), H, sumsq,
              lab("grad.add", int32_t(unit)));
  const int64_t lm = lay.find("lm_head.weight").offset, S = I.head_slice_rows;
  for (int64_t v0 = 0; v0 < V; v0 += S) {
    const int64_t nv = std::min(S, V - v0);
    void* dw = I.head_slice_g.data();
    be.fill_zero(Lane::Compute, dw, nv * H * int64_t(I.g_sz), lab("grad.zero", int32_t(unit)));
    for_chunks([&](int64_t r0, const DevGeometry& g) {
      be.head_lm_grad_slice(I.head_w.data(), lm_w, tgt + r0, g, row(x, r0), lse + r0, scale_, v0, nv, dw,
                            lab("head.dw", int32_t(v0 / S)));
    });
    be.grad_add(held + (lm + v0 * H) * esz, dt, dw, nv * H, sumsq, lab("grad.add", int32_t(unit)));
  }
}

// The embedding's gradient from dx (layer 0's input gradient): into emb_grad (then grad_done), or with head slices
// accumulated straight into its held buffer.
void MicroBatchRun::embed_backward(const void* dx) {
  const int64_t numel = be.layout().embedding().numel;
  if (!I.head_slices) {
    if (!I.c.tied) zero_grad(0, I.emb_grad, numel * int64_t(I.g_sz), I.held_direct);
    be.embed_backward(I.d_ids.as<int32_t>(), I.T, dx, I.emb_grad, lab("embed.bwd", 0));
    return;
  }
  void* held = I.dgrads->buffer(0);
  const DType dt = I.dgrads->dtype();
  if (mbi_ == 0) zero_grad(0, held, numel * int64_t(dtype_size(dt)), true);
  be.embed_backward_acc(I.d_ids.as<int32_t>(), I.T, dx, held, dt,
                        mbi_ + 1 == nmb_ ? I.d_scal.as<double>() + 2 : nullptr, lab("embed.bwd", 0));
}

}  // namespace lt
