#include "infer/generate.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "backend/cpu/mixer_ref.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/timer.h"
#include "data/tokenizer.h"

namespace lt::train {
namespace {

// Per-sequence decoding state: one cache per layer (KV rows, or conv window + recurrent state).
struct SeqCache {
  std::vector<cpu::MixerCache> layers;
  int64_t len = 0;
};

// Greedy decoding on the CPU reference: each layer's mixer is its kind's (backend/cpu/mixer_ref.h), the
// norms, residuals and MLP are shared here.
struct Decoder {
  const ModelWeightsView& w;
  const ModelConfig& c;

  explicit Decoder(const ModelWeightsView& wv) : w(wv), c(*wv.cfg) {}

  const float* unit(int64_t layer) const { return w.units[size_t(layer + 1)]; }
  const float* p(int64_t layer, const char* suffix) const {
    return unit(layer) + w.layout->layer(layer).find(suffix).offset;
  }
  void norm(int64_t layer, const char* suffix, const float* x, int64_t n, float* y) const {
    const cpu::NormScale s(p(layer, suffix), c.hidden, c.norm_plus_one);
    cpu::rmsnorm_fwd(x, s.get(), n, c.hidden, float(c.rms_eps), y);
  }
  // x [n, hidden] += MLP(RMSNorm(x)) of layer `layer`.
  void mlp(int64_t layer, float* x, int64_t n) const {
    const int64_t h = c.hidden, f = c.ffn;
    std::vector<float> xn(static_cast<size_t>(n * h)), g(static_cast<size_t>(n * f)), u(static_cast<size_t>(n * f)),
        tmp(static_cast<size_t>(n * h));
    norm(layer, "post_attention_layernorm.weight", x, n, xn.data());
    cpu::linear_fwd(xn.data(), p(layer, "mlp.gate_proj.weight"), nullptr, n, h, f, g.data());
    cpu::linear_fwd(xn.data(), p(layer, "mlp.up_proj.weight"), nullptr, n, h, f, u.data());
    cpu::swiglu_fwd(g.data(), u.data(), n, f, g.data());
    cpu::linear_fwd(g.data(), p(layer, "mlp.down_proj.weight"), nullptr, n, f, h, tmp.data());
    for (int64_t i = 0; i < n * h; ++i) x[i] += tmp[size_t(i)];
  }

  // logits [n, vocab] from the final hidden states x [n, hidden].
  void head(const float* x, int64_t n, float* logits) const {
    const int64_t L = c.layers;
    const UnitLayout& hl = w.layout->head();
    std::vector<float> xn(static_cast<size_t>(n * c.hidden));
    const cpu::NormScale s(w.units[size_t(L + 1)] + hl.find("norm.weight").offset, c.hidden, c.norm_plus_one);
    cpu::rmsnorm_fwd(x, s.get(), n, c.hidden, float(c.rms_eps), xn.data());
    const float* lm = c.tied ? w.units[0] + w.layout->embedding().find("embed_tokens.weight").offset
                             : w.units[size_t(L + 1)] + hl.find("lm_head.weight").offset;
    cpu::linear_fwd(xn.data(), lm, nullptr, n, c.hidden, c.vocab, logits);
  }

  void embed(const int32_t* ids, int64_t n, float* x) const {
    const float* emb = w.units[0] + w.layout->embedding().find("embed_tokens.weight").offset;
    cpu::embedding_fwd(emb, c.vocab, c.hidden, ids, n, x);
  }

  // Runs a whole prompt; fills the cache (capacity rows reserved) and returns the last row's hidden state.
  std::vector<float> prefill(const std::vector<int32_t>& ids, SeqCache& cache, int64_t capacity,
                             std::vector<float>* all_rows = nullptr) const {
    const int64_t n = int64_t(ids.size()), H = c.hidden;
    cache.layers.assign(size_t(c.layers), {});
    std::vector<float> x(static_cast<size_t>(n * H)), h(x.size()), out(x.size());
    embed(ids.data(), n, x.data());
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t(i);
    for (int64_t l = 0; l < c.layers; ++l) {
      norm(l, "input_layernorm.weight", x.data(), n, h.data());
      auto mixer = cpu::make_mixer_ref(c, w.layout->layer(l), unit(l), nullptr, n);
      mixer->prefill({pos.data(), nullptr}, h.data(), out.data(), cache.layers[size_t(l)], capacity);
      for (size_t i = 0; i < x.size(); ++i) x[i] += out[i];
      mlp(l, x.data(), n);
    }
    cache.len = n;
    if (all_rows) *all_rows = x;
    return std::vector<float>(x.end() - H, x.end());
  }

  // One new token for each of n sequences: x [n, hidden] holds their embeddings and becomes their last
  // hidden states.
  void step(float* x, int64_t n, const std::vector<SeqCache*>& caches) const {
    const int64_t H = c.hidden;
    std::vector<float> h(static_cast<size_t>(n * H)), out(h.size());
    std::vector<cpu::MixerCache*> mc(static_cast<size_t>(n));
    for (int64_t l = 0; l < c.layers; ++l) {
      for (int64_t r = 0; r < n; ++r) mc[size_t(r)] = &caches[size_t(r)]->layers[size_t(l)];
      norm(l, "input_layernorm.weight", x, n, h.data());
      cpu::mixer_decode_step(c, w.layout->layer(l), unit(l), h.data(), n, out.data(), mc.data());
      for (int64_t i = 0; i < n * H; ++i) x[i] += out[size_t(i)];
      mlp(l, x, n);
    }
    for (SeqCache* sc : caches) sc->len++;
  }
};

int32_t argmax(const float* row, int64_t n) {
  return int32_t(std::max_element(row, row + n) - row);
}

}  // namespace

void check_max_new_tokens(int64_t n, const std::string& what) {
  LT_CHECK(n >= 1, "{} {}: expected the number of new tokens to generate per sequence, >= 1", what, n);
}

void check_fits_max_position(const ModelConfig& c, int64_t prompt_tokens, int64_t max_new_tokens,
                             const std::string& what) {
  LT_CHECK(max_new_tokens <= c.max_position - prompt_tokens,
           "{} {}: a prompt of {} tokens + {} new tokens exceeds the model's max_position_embeddings {}", what,
           max_new_tokens, prompt_tokens, max_new_tokens, c.max_position);
}

void strip_stop(std::vector<int32_t>& ids, const std::vector<int32_t>& stop_ids) {
  if (!ids.empty() && std::find(stop_ids.begin(), stop_ids.end(), ids.back()) != stop_ids.end()) ids.pop_back();
}

void write_generation(std::FILE* out, size_t index, const std::string& prompt, const data::Tokenizer& tok,
                      std::vector<int32_t> ids, const std::vector<int32_t>& stop_ids) {
  strip_stop(ids, stop_ids);
  const std::string text = tok.decode_bytes(ids, true);
  std::fprintf(out, "### prompt %zu: ", index);
  std::fwrite(prompt.data(), 1, prompt.size(), out);
  std::fputc('\n', out);
  std::fwrite(text.data(), 1, text.size(), out);
  std::fputs("\n\n", out);
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
  // The KV cache of a sequence holds prompt + max_new_tokens rows: a negative count would size it
  // below the prompt.
  LT_CHECK(opt.max_new_tokens >= 0, "generate: max_new_tokens {}: expected >= 0", opt.max_new_tokens);
  Decoder d(w);
  std::vector<std::vector<int32_t>> out(prompts.size());
  const int64_t bs = std::max<int64_t>(1, opt.batch_size), H = c.hidden, V = c.vocab;
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
      check_fits_max_position(c, int64_t(pr.size()), opt.max_new_tokens,
                              fmt::format("generate: prompt {}: max_new_tokens", b0 + i));
      const int64_t cap = int64_t(pr.size()) + opt.max_new_tokens;
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
      std::vector<int32_t> ids(static_cast<size_t>(n));
      std::vector<SeqCache*> live_caches;
      for (int64_t r = 0; r < n; ++r) {
        ids[size_t(r)] = next[live[size_t(r)]];
        live_caches.push_back(&caches[live[size_t(r)]]);
      }
      std::vector<float> xr(static_cast<size_t>(n * H));
      d.embed(ids.data(), n, xr.data());
      d.step(xr.data(), n, live_caches);
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
