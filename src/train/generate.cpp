#include "train/generate.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/timer.h"

namespace lt::train {
namespace {

// Per-sequence KV cache: for each layer, k and v rows [capacity, kv_dim].
struct SeqCache {
  std::vector<std::vector<float>> k, v;
  int64_t len = 0;
};

struct Decoder {
  const ModelWeightsView& w;
  const ModelConfig& c;
  std::vector<float> inv_freq;

  explicit Decoder(const ModelWeightsView& wv) : w(wv), c(*wv.cfg) { inv_freq = cpu::rope_inv_freq(c); }

  const float* p(int64_t unit, const UnitLayout& lay, const char* suffix) const {
    return w.units[size_t(unit)] + lay.find(suffix).offset;
  }
  const float* p_opt(int64_t unit, const UnitLayout& lay, const char* suffix) const {
    const ParamInfo* pi = lay.try_find(suffix);
    return pi ? w.units[size_t(unit)] + pi->offset : nullptr;
  }

  // attn(q, k, v, out): q [n, q_dim], k/v [n, kv_dim] after norm + RoPE; writes out [n, q_dim].
  using AttnFn = std::function<void(const float*, const float*, const float*, float*)>;

  // x [n, hidden] is updated in place through decoder layer `layer`.
  void layer(int64_t layer, float* x, int64_t n, const int32_t* pos, const AttnFn& attn) const {
    const int64_t unit = layer + 1;
    const UnitLayout& lay = w.layout->layer(layer);
    const int64_t h = c.hidden, qd = c.q_dim(), kvd = c.kv_dim(), f = c.ffn, D = c.head_dim;
    const float eps = float(c.rms_eps);
    std::vector<float> xn(size_t(n * h)), q(size_t(n * qd)), k(size_t(n * kvd)), v(size_t(n * kvd)),
        o(size_t(n * qd)), tmp(size_t(n * h));
    cpu::rmsnorm_fwd(x, p(unit, lay, "input_layernorm.weight"), n, h, eps, xn.data());
    cpu::linear_fwd(xn.data(), p(unit, lay, "self_attn.q_proj.weight"), p_opt(unit, lay, "self_attn.q_proj.bias"), n,
                    h, qd, q.data());
    cpu::linear_fwd(xn.data(), p(unit, lay, "self_attn.k_proj.weight"), p_opt(unit, lay, "self_attn.k_proj.bias"), n,
                    h, kvd, k.data());
    cpu::linear_fwd(xn.data(), p(unit, lay, "self_attn.v_proj.weight"), p_opt(unit, lay, "self_attn.v_proj.bias"), n,
                    h, kvd, v.data());
    if (c.qk_norm) {
      std::vector<float> t(q.size());
      cpu::qk_norm_fwd(q.data(), p(unit, lay, "self_attn.q_norm.weight"), n, c.heads, D, eps, t.data());
      q.swap(t);
      t.assign(k.size(), 0.f);
      cpu::qk_norm_fwd(k.data(), p(unit, lay, "self_attn.k_norm.weight"), n, c.kv_heads, D, eps, t.data());
      k.swap(t);
    }
    cpu::rope_fwd(q.data(), n, c.heads, D, pos, inv_freq.data());
    cpu::rope_fwd(k.data(), n, c.kv_heads, D, pos, inv_freq.data());
    attn(q.data(), k.data(), v.data(), o.data());
    cpu::linear_fwd(o.data(), p(unit, lay, "self_attn.o_proj.weight"), nullptr, n, qd, h, tmp.data());
    for (int64_t i = 0; i < n * h; ++i) x[i] += tmp[size_t(i)];
    cpu::rmsnorm_fwd(x, p(unit, lay, "post_attention_layernorm.weight"), n, h, eps, xn.data());
    std::vector<float> g(size_t(n * f)), u(size_t(n * f));
    cpu::linear_fwd(xn.data(), p(unit, lay, "mlp.gate_proj.weight"), nullptr, n, h, f, g.data());
    cpu::linear_fwd(xn.data(), p(unit, lay, "mlp.up_proj.weight"), nullptr, n, h, f, u.data());
    cpu::swiglu_fwd(g.data(), u.data(), n, f, g.data());
    cpu::linear_fwd(g.data(), p(unit, lay, "mlp.down_proj.weight"), nullptr, n, f, h, tmp.data());
    for (int64_t i = 0; i < n * h; ++i) x[i] += tmp[size_t(i)];
  }

  // logits [n, vocab] from the final hidden states x [n, hidden].
  void head(const float* x, int64_t n, float* logits) const {
    const int64_t L = c.layers;
    const UnitLayout& hl = w.layout->head();
    std::vector<float> xn(size_t(n * c.hidden));
    cpu::rmsnorm_fwd(x, w.units[size_t(L + 1)] + hl.find("norm.weight").offset, n, c.hidden, float(c.rms_eps),
                     xn.data());
    const float* lm = c.tied ? w.units[0] + w.layout->embedding().find("embed_tokens.weight").offset
                             : w.units[size_t(L + 1)] + hl.find("lm_head.weight").offset;
    cpu::linear_fwd(xn.data(), lm, nullptr, n, c.hidden, c.vocab, logits);
  }

  void embed(const int32_t* ids, int64_t n, float* x) const {
    const float* emb = w.units[0] + w.layout->embedding().find("embed_tokens.weight").offset;
    cpu::embedding_fwd(emb, c.vocab, c.hidden, ids, n, x);
  }

  cpu::AttnShape shape(int64_t seq) const {
    return {seq, c.heads, c.kv_heads, c.head_dim, float(1.0 / std::sqrt(double(c.head_dim)))};
  }

  // Runs a whole prompt; fills the cache (capacity rows reserved) and returns the last row's hidden state.
  std::vector<float> prefill(const std::vector<int32_t>& ids, SeqCache& cache, int64_t capacity,
                             std::vector<float>* all_rows = nullptr) const {
    const int64_t n = int64_t(ids.size()), kvd = c.kv_dim();
    cache.k.assign(size_t(c.layers), std::vector<float>(size_t(capacity * kvd)));
    cache.v.assign(size_t(c.layers), std::vector<float>(size_t(capacity * kvd)));
    std::vector<float> x(size_t(n * c.hidden));
    embed(ids.data(), n, x.data());
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t(i);
    for (int64_t l = 0; l < c.layers; ++l) {
      layer(l, x.data(), n, pos.data(), [&](const float* q, const float* k, const float* v, float* out) {
        std::copy(k, k + n * kvd, cache.k[size_t(l)].begin());
        std::copy(v, v + n * kvd, cache.v[size_t(l)].begin());
        cpu::attention_fwd(shape(n), q, k, v, nullptr, out, nullptr);
      });
    }
    cache.len = n;
    if (all_rows) *all_rows = x;
    return std::vector<float>(x.end() - c.hidden, x.end());
  }
};

int32_t argmax(const float* row, int64_t n) {
  return int32_t(std::max_element(row, row + n) - row);
}

}  // namespace

void strip_stop(std::vector<int32_t>& ids, const std::vector<int32_t>& stop_ids) {
  if (!ids.empty() && std::find(stop_ids.begin(), stop_ids.end(), ids.back()) != stop_ids.end()) ids.pop_back();
}

ModelWeightsView view_of(const ModelWeights& w) {
  ModelWeightsView v{&w.config, &w.layout, {}};
  for (const auto& u : w.units) v.units.push_back(u.data());
  return v;
}

std::vector<float> forward_logits(const ModelWeightsView& w, const std::vector<int32_t>& ids) {
  Decoder d(w);
  SeqCache cache;
  std::vector<float> rows;
  d.prefill(ids, cache, int64_t(ids.size()), &rows);
  std::vector<float> logits(ids.size() * size_t(w.cfg->vocab));
  d.head(rows.data(), int64_t(ids.size()), logits.data());
  return logits;
}

std::vector<std::vector<int32_t>> greedy_generate(const ModelWeightsView& w,
                                                  const std::vector<std::vector<int32_t>>& prompts,
                                                  const GenerateOptions& opt, DecodeStats* stats) {
  const ModelConfig& c = *w.cfg;
  DecodeStats st;
  LT_CHECK(w.units.size() == size_t(c.layers + 2), "generate: expected {} weight units, got {}", c.layers + 2,
           w.units.size());
  Decoder d(w);
  std::vector<std::vector<int32_t>> out(prompts.size());
  const int64_t bs = std::max<int64_t>(1, opt.batch_size), kvd = c.kv_dim(), H = c.hidden, V = c.vocab;
  auto is_stop = [&](int32_t t) { return std::find(opt.stop_ids.begin(), opt.stop_ids.end(), t) != opt.stop_ids.end(); };

  for (size_t b0 = 0; b0 < prompts.size(); b0 += size_t(bs)) {
    const size_t nb = std::min(prompts.size() - b0, size_t(bs));
    std::vector<SeqCache> caches(nb);
    std::vector<float> x(nb * size_t(H)), logits(nb * size_t(V));
    std::vector<int32_t> next(nb);
    std::vector<bool> done(nb, false);
    const double t0 = now_seconds();
    st.sequences += int64_t(nb);
    // Prefill each prompt, then take its first generated token from the last row's logits.
    for (size_t i = 0; i < nb; ++i) {
      const auto& pr = prompts[b0 + i];
      LT_CHECK(!pr.empty(), "generate: prompt {} is empty", b0 + i);
      int64_t cap = int64_t(pr.size()) + opt.max_new_tokens;
      LT_CHECK(cap <= c.max_position, "generate: prompt {} ({} tokens) + max_new_tokens {} exceeds max_position {}",
               b0 + i, pr.size(), opt.max_new_tokens, c.max_position);
      st.prompt_tokens += int64_t(pr.size());
      auto last = d.prefill(pr, caches[i], cap);
      std::copy(last.begin(), last.end(), x.begin() + int64_t(i) * H);
    }
    if (opt.max_new_tokens <= 0) {
      st.prefill_seconds += now_seconds() - t0;
      continue;
    }
    d.head(x.data(), int64_t(nb), logits.data());
    for (size_t i = 0; i < nb; ++i) {
      next[i] = argmax(&logits[i * size_t(V)], V);
      out[b0 + i].push_back(next[i]);
      if (is_stop(next[i])) done[i] = true;
    }
    st.generated_tokens += int64_t(nb);
    const double t1 = now_seconds();
    st.prefill_seconds += t1 - t0;
    // Decode: all live sequences advance together.
    for (int64_t t = 1; t < opt.max_new_tokens; ++t) {
      std::vector<size_t> live;
      for (size_t i = 0; i < nb; ++i)
        if (!done[i]) live.push_back(i);
      if (live.empty()) break;
      const int64_t n = int64_t(live.size());
      std::vector<int32_t> ids(static_cast<size_t>(n)), pos(static_cast<size_t>(n));
      for (int64_t r = 0; r < n; ++r) {
        ids[size_t(r)] = next[live[size_t(r)]];
        pos[size_t(r)] = int32_t(caches[live[size_t(r)]].len);
      }
      std::vector<float> xr(static_cast<size_t>(n * H));
      d.embed(ids.data(), n, xr.data());
      for (int64_t l = 0; l < c.layers; ++l) {
        d.layer(l, xr.data(), n, pos.data(), [&](const float* q, const float* k, const float* v, float* o) {
          for (int64_t r = 0; r < n; ++r) {
            SeqCache& sc = caches[live[size_t(r)]];
            std::copy(k + r * kvd, k + (r + 1) * kvd, sc.k[size_t(l)].begin() + sc.len * kvd);
            std::copy(v + r * kvd, v + (r + 1) * kvd, sc.v[size_t(l)].begin() + sc.len * kvd);
            cpu::attention_decode(d.shape(sc.len + 1), q + r * c.q_dim(), sc.k[size_t(l)].data(),
                                  sc.v[size_t(l)].data(), sc.len + 1, o + r * c.q_dim());
          }
        });
      }
      for (int64_t r = 0; r < n; ++r) caches[live[size_t(r)]].len++;
      d.head(xr.data(), n, logits.data());
      for (int64_t r = 0; r < n; ++r) {
        size_t i = live[size_t(r)];
        next[i] = argmax(&logits[size_t(r * V)], V);
        out[b0 + i].push_back(next[i]);
        if (is_stop(next[i])) done[i] = true;
      }
      st.generated_tokens += n;
    }
    st.decode_seconds += now_seconds() - t1;
  }
  if (stats) {
    stats->sequences += st.sequences;
    stats->prompt_tokens += st.prompt_tokens;
    stats->generated_tokens += st.generated_tokens;
    stats->prefill_seconds += st.prefill_seconds;
    stats->decode_seconds += st.decode_seconds;
  }
  return out;
}

std::string format_decode_stats(const std::string& where, const DecodeStats& s) {
  const double t = s.seconds();
  const int64_t steps_tokens = s.generated_tokens - std::min(s.generated_tokens, s.sequences);
  return fmt::format(
      "decode on {}: {} sequences, {} tokens generated in {:.2f} s ({:.0f} tokens/s; decode steps {:.0f} tokens/s), "
      "{} prompt tokens prefilled in {:.2f} s",
      where, s.sequences, s.generated_tokens, t, t > 0 ? double(s.generated_tokens) / t : 0.0,
      s.decode_seconds > 0 ? double(steps_tokens) / s.decode_seconds : 0.0, s.prompt_tokens, s.prefill_seconds);
}

namespace {
class CpuGenerator final : public Generator {
 public:
  explicit CpuGenerator(const ModelWeightsView& w) : w_(w) {}
  std::vector<std::vector<int32_t>> generate(const std::vector<std::vector<int32_t>>& prompts,
                                             const GenerateOptions& opt) override {
    return greedy_generate(w_, prompts, opt, &stats_);
  }
  std::string describe() const override { return "CPU (fp32, KV cache)"; }
  DecodeStats stats() const override { return stats_; }

 private:
  ModelWeightsView w_;
  DecodeStats stats_;
};
}  // namespace

std::unique_ptr<Generator> make_cpu_generator(const ModelWeightsView& w) { return std::make_unique<CpuGenerator>(w); }

}  // namespace lt::train
