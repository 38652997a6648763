// Causal GQA attention mixer (reference): q/k/v projections (+ bias), QK-norm, (partial) RoPE, attention,
// the Qwen3.5 sigmoid output gate, o_proj.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/mixer_ref.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/scratch.h"
#include "core/error.h"

namespace lt::cpu {

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

AttnShape attn_shape(const ModelConfig& c, int64_t S) {
  AttnShape s;
  s.seq = S;
  s.heads = c.heads;
  s.kv_heads = c.kv_heads;
  s.head_dim = c.head_dim;
  s.scale = float(1.0 / std::sqrt(double(c.head_dim)));
  return s;
}

class AttentionRef final : public MixerRef {
 public:
  AttentionRef(const ModelConfig& c, const UnitLayout& lay, const float* w, float* dw, int64_t S)
      : c_(c), S_(S), Q_(c.q_dim()), KV_(c.kv_dim()), gated_(c.attn_output_gate), inv_freq_(rope_inv_freq(c)) {
    auto at = [&](const char* s) { return w + lay.find(s).offset; };
    auto dat = [&](const char* s) { return dw ? dw + lay.find(s).offset : nullptr; };
    wq_ = at("self_attn.q_proj.weight"), wk_ = at("self_attn.k_proj.weight"), wv_ = at("self_attn.v_proj.weight");
    wo_ = at("self_attn.o_proj.weight");
    dwq_ = dat("self_attn.q_proj.weight"), dwk_ = dat("self_attn.k_proj.weight"), dwv_ = dat("self_attn.v_proj.weight");
    dwo_ = dat("self_attn.o_proj.weight");
    if (c.attn_bias) {
      bq_ = at("self_attn.q_proj.bias"), bk_ = at("self_attn.k_proj.bias"), bv_ = at("self_attn.v_proj.bias");
      dbq_ = dat("self_attn.q_proj.bias"), dbk_ = dat("self_attn.k_proj.bias"), dbv_ = dat("self_attn.v_proj.bias");
    }
    if (c.qk_norm) {
      qn_.emplace_back(at("self_attn.q_norm.weight"), c.head_dim, c.norm_plus_one);
      qn_.emplace_back(at("self_attn.k_norm.weight"), c.head_dim, c.norm_plus_one);
      dqn_ = dat("self_attn.q_norm.weight"), dkn_ = dat("self_attn.k_norm.weight");
    }
    const int64_t qo = gated_ ? 2 * Q_ : Q_, G = gated_ ? Q_ : 0, N = c.qk_norm ? Q_ + KV_ : 0;
    const int64_t fwd = qo + G + N + Q_ + 2 * KV_ + Q_ + G + c.heads, bwd = dw ? qo + 2 * Q_ + 2 * KV_ + G : 0;
    Scratch& sc = Scratch::get(2);
    sc.reset(S * (fwd + bwd), 16);
    qfull_ = sc.take(S * qo);  // q_proj output: [S, heads, (q, gate)] when gated
    gate_ = gated_ ? sc.take(S * Q_) : nullptr;
    if (c.qk_norm) qpre_ = sc.take(S * Q_), kpre_ = sc.take(S * KV_);
    q_ = sc.take(S * Q_), k_ = sc.take(S * KV_), v_ = sc.take(S * KV_);
    a_ = sc.take(S * Q_), ag_ = gated_ ? sc.take(S * Q_) : a_;
    lse_ = sc.take(S * c.heads);
    if (dw) {
      dqfull_ = sc.take(S * qo), da_ = sc.take(S * Q_), dq_ = sc.take(S * Q_);
      dk_ = sc.take(S * KV_), dv_ = sc.take(S * KV_);
      dgate_ = gated_ ? sc.take(S * Q_) : nullptr;
    }
  }

  void forward(const SampleGeo& sg, const float* h, float* out) override {
    const int64_t S = S_, H = c_.hidden, D = c_.head_dim;
    const float eps = float(c_.rms_eps);
    float* qdst = c_.qk_norm ? qpre_ : q_;
    float* kdst = c_.qk_norm ? kpre_ : k_;
    linear_fwd(h, wq_, bq_, S, H, gated_ ? 2 * Q_ : Q_, gated_ ? qfull_ : qdst);
    if (gated_) split_gate(qdst);
    linear_fwd(h, wk_, bk_, S, H, KV_, kdst);
    linear_fwd(h, wv_, bv_, S, H, KV_, v_);
    if (c_.qk_norm) {
      qk_norm_fwd(qpre_, qn_[0].get(), S, c_.heads, D, eps, q_);
      qk_norm_fwd(kpre_, qn_[1].get(), S, c_.kv_heads, D, eps, k_);
    }
    rope_fwd(q_, S, c_.heads, D, sg.pos, inv_freq_.data(), c_.rotary_dim());
    rope_fwd(k_, S, c_.kv_heads, D, sg.pos, inv_freq_.data(), c_.rotary_dim());
    attention_fwd(shape(), q_, k_, v_, sg.seg, a_, lse_);
    if (gated_)  // HF: attn_output * sigmoid(gate)
      for (int64_t i = 0; i < S * Q_; ++i) ag_[i] = a_[i] * sigmoid(gate_[i]);
    linear_fwd(ag_, wo_, nullptr, S, Q_, H, out);
  }

  void prefill(const SampleGeo& sg, const float* h, float* out, MixerCache& cache, int64_t capacity) override {
    forward(sg, h, out);
    cache.k.assign(size_t(capacity * KV_), 0.0f);
    cache.v.assign(size_t(capacity * KV_), 0.0f);
    std::copy(k_, k_ + S_ * KV_, cache.k.begin());
    std::copy(v_, v_ + S_ * KV_, cache.v.begin());
    cache.len = S_;
  }

  void backward(const SampleGeo& sg, const float* h, const float* dout, float* dh) override {
    const int64_t S = S_, H = c_.hidden, D = c_.head_dim;
    const float eps = float(c_.rms_eps);
    linear_bwd(ag_, wo_, dout, S, Q_, H, da_, dwo_, nullptr);
    if (gated_) {  // da_ holds d(gated output): split it into d(attention output) and d(gate)
      for (int64_t i = 0; i < S * Q_; ++i) {
        const float s = sigmoid(gate_[i]);
        dgate_[i] = da_[i] * a_[i] * s * (1.0f - s);
        da_[i] = da_[i] * s;
      }
    }
    attention_bwd(shape(), q_, k_, v_, sg.seg, a_, lse_, da_, dq_, dk_, dv_);
    rope_bwd(dq_, S, c_.heads, D, sg.pos, inv_freq_.data(), c_.rotary_dim());
    rope_bwd(dk_, S, c_.kv_heads, D, sg.pos, inv_freq_.data(), c_.rotary_dim());
    if (c_.qk_norm) {  // in place: dq/dk become gradients of the pre-norm projections
      qk_norm_bwd(qpre_, qn_[0].get(), dq_, S, c_.heads, D, eps, dq_, dqn_);
      qk_norm_bwd(kpre_, qn_[1].get(), dk_, S, c_.kv_heads, D, eps, dk_, dkn_);
    }
    const float* dqproj = dq_;
    if (gated_) {
      join_gate(dq_, dgate_, dqfull_);
      dqproj = dqfull_;
    }
    linear_bwd(h, wq_, dqproj, S, H, gated_ ? 2 * Q_ : Q_, dh, dwq_, dbq_);
    linear_bwd(h, wk_, dk_, S, H, KV_, dh, dwk_, dbk_, true);
    linear_bwd(h, wv_, dv_, S, H, KV_, dh, dwv_, dbv_, true);
  }

 private:
  AttnShape shape() const { return attn_shape(c_, S_); }
  // q_proj's [S, heads, 2D] output -> queries [S, heads*D] and gates [S, heads*D] (HF torch.chunk).
  void split_gate(float* q) const {
    const int64_t D = c_.head_dim;
    for (int64_t r = 0; r < S_ * c_.heads; ++r) {
      std::memcpy(q + r * D, qfull_ + r * 2 * D, sizeof(float) * size_t(D));
      std::memcpy(gate_ + r * D, qfull_ + r * 2 * D + D, sizeof(float) * size_t(D));
    }
  }
  void join_gate(const float* dq, const float* dg, float* dst) const {
    const int64_t D = c_.head_dim;
    for (int64_t r = 0; r < S_ * c_.heads; ++r) {
      std::memcpy(dst + r * 2 * D, dq + r * D, sizeof(float) * size_t(D));
      std::memcpy(dst + r * 2 * D + D, dg + r * D, sizeof(float) * size_t(D));
    }
  }

  const ModelConfig& c_;
  int64_t S_, Q_, KV_;
  bool gated_;
  std::vector<float> inv_freq_;
  std::vector<NormScale> qn_;
  const float *wq_, *wk_, *wv_, *wo_, *bq_ = nullptr, *bk_ = nullptr, *bv_ = nullptr;
  float *dwq_, *dwk_, *dwv_, *dwo_, *dbq_ = nullptr, *dbk_ = nullptr, *dbv_ = nullptr, *dqn_ = nullptr,
        *dkn_ = nullptr;
  float *qfull_, *gate_, *qpre_ = nullptr, *kpre_ = nullptr, *q_, *k_, *v_, *a_, *ag_, *lse_;
  float *dqfull_ = nullptr, *da_ = nullptr, *dq_ = nullptr, *dk_ = nullptr, *dv_ = nullptr, *dgate_ = nullptr;
};

}  // namespace

std::unique_ptr<MixerRef> make_attention_ref(const ModelConfig& c, const UnitLayout& lay, const float* w, float* dw,
                                             int64_t S) {
  return std::make_unique<AttentionRef>(c, lay, w, dw, S);
}

void attention_decode_step(const ModelConfig& c, const UnitLayout& lay, const float* w, const float* h, int64_t n,
                           float* out, MixerCache* const* caches) {
  const int64_t H = c.hidden, Q = c.q_dim(), KV = c.kv_dim(), D = c.head_dim;
  const float eps = float(c.rms_eps);
  auto at = [&](const char* s) { return w + lay.find(s).offset; };
  auto opt = [&](const char* s) { const ParamInfo* p = lay.try_find(s); return p ? w + p->offset : nullptr; };
  const int64_t qo = c.attn_output_gate ? 2 * Q : Q;
  auto vec = [](int64_t m) { return std::vector<float>(static_cast<size_t>(m)); };
  auto qf = vec(n * qo), q = vec(n * Q), gate = vec(n * Q), k = vec(n * KV), v = vec(n * KV), a = vec(n * Q);
  linear_fwd(h, at("self_attn.q_proj.weight"), opt("self_attn.q_proj.bias"), n, H, qo, qf.data());
  linear_fwd(h, at("self_attn.k_proj.weight"), opt("self_attn.k_proj.bias"), n, H, KV, k.data());
  linear_fwd(h, at("self_attn.v_proj.weight"), opt("self_attn.v_proj.bias"), n, H, KV, v.data());
  if (c.attn_output_gate) {  // [heads, (q, gate)] -> q, gate
    for (int64_t r = 0; r < n * c.heads; ++r) {
      std::copy_n(&qf[size_t(r * 2 * D)], D, &q[size_t(r * D)]);
      std::copy_n(&qf[size_t(r * 2 * D + D)], D, &gate[size_t(r * D)]);
    }
  } else {
    q.swap(qf);
  }
  if (c.qk_norm) {
    auto t = q;
    qk_norm_fwd(t.data(), NormScale(at("self_attn.q_norm.weight"), D, c.norm_plus_one).get(), n, c.heads, D, eps,
                q.data());
    t = k;
    qk_norm_fwd(t.data(), NormScale(at("self_attn.k_norm.weight"), D, c.norm_plus_one).get(), n, c.kv_heads, D, eps,
                k.data());
  }
  const auto inv = rope_inv_freq(c);
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) pos[size_t(r)] = int32_t(caches[r]->len);
  rope_fwd(q.data(), n, c.heads, D, pos.data(), inv.data(), c.rotary_dim());
  rope_fwd(k.data(), n, c.kv_heads, D, pos.data(), inv.data(), c.rotary_dim());
  for (int64_t r = 0; r < n; ++r) {
    MixerCache& mc = *caches[r];
    LT_CHECK(int64_t(mc.k.size()) >= (mc.len + 1) * KV, "decode: KV cache full at {} rows", mc.len);
    std::copy_n(&k[size_t(r * KV)], KV, mc.k.begin() + mc.len * KV);
    std::copy_n(&v[size_t(r * KV)], KV, mc.v.begin() + mc.len * KV);
    attention_decode(attn_shape(c, mc.len + 1), &q[size_t(r * Q)], mc.k.data(), mc.v.data(), mc.len + 1,
                     &a[size_t(r * Q)]);
    mc.len += 1;
  }
  if (c.attn_output_gate)
    for (int64_t i = 0; i < n * Q; ++i) a[size_t(i)] *= sigmoid(gate[size_t(i)]);
  linear_fwd(a.data(), at("self_attn.o_proj.weight"), nullptr, n, Q, H, out);
}

}  // namespace lt::cpu
