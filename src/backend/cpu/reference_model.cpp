#include "backend/cpu/reference_model.h"

#include <algorithm>

#include "core/error.h"

namespace lt::cpu {

namespace {
void check_units(const ModelConfig& c, const ModelLayout& layout, size_t n_w, size_t n_g) {
  const size_t want = size_t(c.layers) + 2;
  LT_CHECK(layout.units.size() == want, "model layout has {} units, expected {} (layers + 2)", layout.units.size(), want);
  LT_CHECK(n_w == want, "model_forward_backward: {} weight buffers given, expected {}", n_w, want);
  LT_CHECK(n_g == 0 || n_g == want, "model_forward_backward: {} gradient buffers given, expected 0 or {}", n_g, want);
}

const float* lm_matrix(const ModelConfig& c, const ModelLayout& layout, const std::vector<const float*>& w) {
  if (c.tied) return w.front() + layout.embedding().find("embed_tokens.weight").offset;
  return w.back() + layout.head().find("lm_head.weight").offset;
}
}  // namespace

ModelStep model_forward_backward(const ModelConfig& c, const ModelLayout& layout, const std::vector<const float*>& w,
                                 const int32_t* ids, const int32_t* targets, const SeqGeometry& g,
                                 const std::vector<float*>& grads, float loss_scale) {
  check_units(c, layout, w.size(), grads.size());
  const int64_t T = g.tokens(), H = c.hidden, L = c.layers;
  // Boundary activations 0..L, all kept.
  std::vector<std::vector<float>> xs(size_t(L + 1), std::vector<float>(size_t(T * H)));
  embed_forward(c, w.front(), ids, T, xs[0].data());
  for (int64_t i = 0; i < L; ++i)
    layer_forward(c, layout.layer(i), w[size_t(i + 1)], g, xs[size_t(i)].data(), xs[size_t(i + 1)].data());

  int64_t n_valid = 0;
  for (int64_t t = 0; t < T; ++t) n_valid += targets[t] != kIgnoreIndex;
  const bool grad = !grads.empty();
  const float scale = loss_scale > 0 ? loss_scale : (n_valid > 0 ? float(1.0 / double(n_valid)) : 0.0f);
  std::vector<float> dx(grad ? size_t(T * H) : 0), dprev(grad ? size_t(T * H) : 0);
  float* d_lm = nullptr;
  if (grad)
    d_lm = c.tied ? grads.front() + layout.embedding().find("embed_tokens.weight").offset
                  : grads.back() + layout.head().find("lm_head.weight").offset;
  HeadResult hr = head_forward_backward(c, layout.head(), w.back(), lm_matrix(c, layout, w), targets, T,
                                        xs[size_t(L)].data(), scale, grad ? dx.data() : nullptr,
                                        grad ? grads.back() : nullptr, d_lm, g.seq);
  ModelStep st;
  st.loss_sum = hr.loss_sum;
  st.n_tokens = hr.n_tokens;
  st.loss = hr.n_tokens > 0 ? hr.loss_sum / double(hr.n_tokens) : 0.0;
  if (!grad) return st;
  for (int64_t i = L - 1; i >= 0; --i) {
    layer_backward(c, layout.layer(i), w[size_t(i + 1)], g, xs[size_t(i)].data(), dx.data(), dprev.data(),
                   grads[size_t(i + 1)]);
    std::swap(dx, dprev);
  }
  embed_backward(c, ids, T, dx.data(), grads.front());
  return st;
}

void model_logits(const ModelConfig& c, const ModelLayout& layout, const std::vector<const float*>& w,
                  const int32_t* ids, const SeqGeometry& g, float* logits) {
  check_units(c, layout, w.size(), 0);
  const int64_t T = g.tokens(), H = c.hidden;
  std::vector<float> x(static_cast<size_t>(T * H)), y(size_t(T * H));
  embed_forward(c, w.front(), ids, T, x.data());
  for (int64_t i = 0; i < c.layers; ++i) {
    layer_forward(c, layout.layer(i), w[size_t(i + 1)], g, x.data(), y.data());
    std::swap(x, y);
  }
  std::vector<int64_t> rows(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) rows[size_t(t)] = t;
  head_logits(c, layout.head(), w.back(), lm_matrix(c, layout, w), x.data(), rows.data(), T, logits);
}

UnitBuffers::UnitBuffers(const ModelLayout& layout) {
  for (auto& u : layout.units) units.emplace_back(size_t(u.numel), 0.0f);
}
std::vector<const float*> UnitBuffers::cptrs() const {
  std::vector<const float*> p;
  for (auto& u : units) p.push_back(u.data());
  return p;
}
std::vector<float*> UnitBuffers::ptrs() {
  std::vector<float*> p;
  for (auto& u : units) p.push_back(u.data());
  return p;
}

}  // namespace lt::cpu
