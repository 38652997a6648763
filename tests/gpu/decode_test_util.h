// Helpers of the GPU decoding tests (test_decode.cpp, test_hybrid_decode.cpp): bf16-rounded models, prompts,
// the CUDA decoder, and the CPU decoder's logits to compare against.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "infer/cuda/cuda_decoder.h"
#include "gpu_test_util.h"
#include "infer/generate.h"
#include "model/weights.h"

namespace lt::gputest {

struct Model {
  ModelWeights w;
  train::ModelWeightsView view() const { return train::view_of(w); }
  std::vector<const float*> ptrs() const {
    std::vector<const float*> p;
    for (const auto& u : w.units) p.push_back(u.data());
    return p;
  }
};

// Well separated: the LM head maps the hidden state of token i to token perm(i) with a margin far beyond
// the bf16 error (lm_head += 4 * embedding rows, permuted). Untied models only; before bf16 rounding.
inline void separate_tokens(ModelWeights& w) {
  const ModelConfig& c = w.config;
  EXPECT_FALSE(c.tied);
  const float* emb = w.tensor("model.embed_tokens.weight");
  float* lm = w.tensor("lm_head.weight");
  for (int64_t i = 0; i < c.vocab; ++i) {
    const int64_t j = (i * 37 + 11) % c.vocab;  // perm(i)
    for (int64_t h = 0; h < c.hidden; ++h) lm[j * c.hidden + h] += 4.f * emb[i * c.hidden + h];
  }
}

inline std::vector<std::vector<int32_t>> make_prompts(const std::vector<int64_t>& lens, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> p;
  for (int64_t L : lens) {
    std::vector<int32_t> ids(sz(L));
    for (auto& t : ids) t = int32_t(rng() % uint32_t(vocab));
    p.push_back(ids);
  }
  return p;
}

inline std::unique_ptr<cuda::CudaDecoder> make_decoder(const Model& m, WeightsMode mode, int64_t max_batch,
                                                       int64_t max_seq, bool capture = true,
                                                       cuda::DeviceMemorySource mem = {}, bool graphs = true) {
  cuda::DecoderOptions o;
  o.cuda_graphs = graphs;
  o.weights = mode;
  o.max_batch = max_batch;
  o.max_seq = max_seq;
  o.capture_logits = capture;
  o.memory = std::move(mem);
  return std::make_unique<cuda::CudaDecoder>(m.w.config, m.w.layout, cuda::fp32_units(m.w.layout, m.ptrs()), o);
}

inline double rms(const float* a, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(a[i]) * a[i];
  return std::sqrt(s / double(n));
}
inline double max_abs_diff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}
inline int32_t argmax(const float* a, int64_t n) { return int32_t(std::max_element(a, a + n) - a); }

// (top1 - top2) / RMS of a logits row.
inline double top2_margin(const std::vector<float>& row) {
  std::vector<float> s(row);
  std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<float>());
  return (s[0] - s[1]) / rms(row.data(), int64_t(row.size()));
}

// CPU logits of the next token after `ids` (full forward).
inline std::vector<float> cpu_next_logits(const Model& m, const std::vector<int32_t>& ids) {
  auto all = train::forward_logits(m.view(), ids);
  const int64_t V = m.w.config.vocab;
  return std::vector<float>(all.end() - V, all.end());
}

// The logits of every pass (the prefill's first token, then each decode step) against a full CPU forward
// over the same prefix (the GPU's own tokens), sequences of different lengths in one batch: every row within
// row_tol (relative L2) and entry_tol (largest entry error x the row's RMS); where the argmaxes differ, the
// CPU's top-2 margin is a near tie (<= 2 entry_tol), and at least min_agree of them agree. Prints
// "<tag> <name>: ..." with the measured values.
inline void expect_logits_match_cpu(const Model& m, const char* name, double row_tol, double entry_tol,
                                    const char* tag, double min_agree = 0.85) {
  const int64_t V = m.w.config.vocab, steps = 10;
  auto prompts = make_prompts({1, 7, 33, 64, 100, 129}, V, 5);
  auto dec = make_decoder(m, WeightsMode::Resident, 8, 160);
  auto gen = dec->generate(prompts, steps, 64, {});
  const auto& cap = dec->captured_logits();
  ASSERT_EQ(cap.size(), size_t(steps));  // one prefill pass + steps-1 decode steps, all sequences live
  double worst_rel = 0, worst_entry = 0;
  int64_t cpu_agree = 0, total = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(gen[i].size(), size_t(steps));
    std::vector<int32_t> prefix = prompts[i];
    for (int64_t t = 0; t < steps; ++t) {
      const float* g = cap[sz(t)].data() + i * sz(V);
      ASSERT_EQ(gen[i][sz(t)], argmax(g, V)) << "the GPU argmax picks the GPU logits' maximum";
      auto ref = cpu_next_logits(m, prefix);
      const double e = rel_err(std::vector<float>(g, g + V), ref);
      const double ent = max_abs_diff(g, ref.data(), V) / rms(ref.data(), V);
      worst_rel = std::max(worst_rel, e);
      worst_entry = std::max(worst_entry, ent);
      EXPECT_LE(e, row_tol) << name << " seq " << i << " step " << t;
      EXPECT_LE(ent, entry_tol) << name << " seq " << i << " step " << t;
      // Teacher-forced greedy agreement: where the argmaxes differ, it is a near tie on the CPU.
      const int32_t c = argmax(ref.data(), V), gt = gen[i][sz(t)];
      total++;
      if (c == gt) {
        cpu_agree++;
      } else {
        const double margin = (ref[sz(c)] - ref[sz(gt)]) / rms(ref.data(), V);
        EXPECT_LE(margin, 2 * entry_tol) << "seq " << i << " step " << t << ": not a near tie";
      }
      prefix.push_back(gt);
    }
  }
  EXPECT_GE(double(cpu_agree), min_agree * double(total)) << name;
  std::printf("%s %s: logits vs CPU over %lld steps: worst row rel err %.2e, worst entry err %.3f x RMS; "
              "argmax agrees %lld/%lld\n",
              tag, name, (long long)total, worst_rel, worst_entry, (long long)cpu_agree, (long long)total);
}

// Resident weights (decode steps replayed as CUDA graphs), streamed weights and resident eager launches run
// the same kernels on the same bytes: identical tokens and logits (bit for bit) over prefill, decode steps
// and stop tokens.
inline void expect_resident_streamed_eager_identical(const Model& m, const char* name, const char* tag) {
  const int64_t V = m.w.config.vocab;
  auto prompts = make_prompts({3, 50, 17, 90, 1}, V, 6);
  auto res = make_decoder(m, WeightsMode::Resident, 4, 120);
  auto str = make_decoder(m, WeightsMode::Streamed, 4, 120);
  auto eager = make_decoder(m, WeightsMode::Resident, 4, 120, true, {}, false);
  ASSERT_EQ(res->mode(), WeightsMode::Resident);
  ASSERT_EQ(str->mode(), WeightsMode::Streamed);
  ASSERT_FALSE(eager->uses_graphs());
  auto free_run = res->generate(prompts, 12, 4, {});
  res->clear_captured_logits();
  const std::vector<int32_t> stops = {free_run[1][4], free_run[3][2]};
  auto a = res->generate(prompts, 12, 4, stops);
  auto b = str->generate(prompts, 12, 4, stops);
  auto e = eager->generate(prompts, 12, 4, stops);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, e);
  EXPECT_TRUE(!res->uses_graphs() || res->counters().graphs > 0);
  const auto &la = res->captured_logits(), &lb = str->captured_logits(), &le = eager->captured_logits();
  ASSERT_EQ(la.size(), lb.size());
  ASSERT_EQ(la.size(), le.size());
  for (size_t p = 0; p < la.size(); ++p) {
    ASSERT_EQ(la[p].size(), lb[p].size());
    ASSERT_EQ(la[p].size(), le[p].size());
    EXPECT_EQ(std::memcmp(la[p].data(), lb[p].data(), la[p].size() * 4), 0) << "pass " << p;
    EXPECT_EQ(std::memcmp(la[p].data(), le[p].data(), la[p].size() * 4), 0) << "pass " << p;
  }
  const auto& cs = str->counters();
  EXPECT_EQ(cs.bytes_uploaded, cs.passes * str->streamed_bytes_per_pass());
  std::printf("%s %s: resident (%lld graphs) == streamed == resident eager over %zu passes (%lld layer bytes "
              "streamed)\n",
              tag, name, (long long)res->counters().graphs, la.size(), (long long)cs.bytes_uploaded);
}

}  // namespace lt::gputest
