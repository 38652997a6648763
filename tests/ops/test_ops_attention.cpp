// The CPU attention computes packed segments one at a time (src/backend/cpu/ops_attention.cpp): the spans it
// splits a row into, and its results against the whole-square form that masks segments entry by entry.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/ops_attention_impl.h"
#include "grad_check.h"

using namespace lt::cpu;
using lt::cpu::attn_detail::Span;
using lt::test::randn;

namespace {

// Segment ids of contiguous runs with random lengths in [1, max_len] (the last one cut at S).
std::vector<int32_t> random_segments(int64_t S, int64_t max_len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> len(1, max_len);
  std::vector<int32_t> seg(static_cast<size_t>(S));
  int32_t id = 0;
  for (int64_t i = 0; i < S;) {
    const int64_t n = std::min(S - i, len(rng));
    for (int64_t j = 0; j < n; ++j) seg[size_t(i + j)] = id;
    i += n;
    ++id;
  }
  return seg;
}

struct Outputs {
  std::vector<float> out, lse, dq, dk, dv;
};

// Forward and backward of one call, span-wise (attention_fwd/bwd) or over the whole masked square.
Outputs run(const AttnShape& s, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
            const std::vector<float>& dout, const int32_t* seg, bool masked) {
  const size_t qn = q.size(), kn = k.size();
  Outputs o{std::vector<float>(qn), std::vector<float>(size_t(s.heads * s.seq)), std::vector<float>(qn),
            std::vector<float>(kn), std::vector<float>(kn)};
  if (masked) {
    attn_detail::attention_fwd_masked(s, q.data(), k.data(), v.data(), seg, o.out.data(), o.lse.data());
    attn_detail::attention_bwd_masked(s, q.data(), k.data(), v.data(), seg, o.out.data(), o.lse.data(), dout.data(),
                                      o.dq.data(), o.dk.data(), o.dv.data());
  } else {
    attention_fwd(s, q.data(), k.data(), v.data(), seg, o.out.data(), o.lse.data());
    attention_bwd(s, q.data(), k.data(), v.data(), seg, o.out.data(), o.lse.data(), dout.data(), o.dq.data(),
                  o.dk.data(), o.dv.data());
  }
  return o;
}

// Largest |a - b| / (1 + |b|) over the elements.
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]) / (1.0 + std::abs(b[i])));
  return m;
}

AttnShape shape(int64_t seq, int64_t heads, int64_t kv_heads, int64_t head_dim) {
  AttnShape s;
  s.seq = seq;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.scale = 1.0f / std::sqrt(float(head_dim));
  return s;
}

// Span-wise against the masked square on one row of random segments: equal within fp32 rounding (the GEMMs
// sum over fewer, zero-free terms in another blocking).
void compare_on_segments(const AttnShape& s, const std::vector<int32_t>& seg, uint64_t seed) {
  const size_t qn = size_t(s.seq * s.heads * s.head_dim), kn = size_t(s.seq * s.kv_heads * s.head_dim);
  auto q = randn(qn, seed), k = randn(kn, seed + 1), v = randn(kn, seed + 2), dout = randn(qn, seed + 3);
  const Outputs a = run(s, q, k, v, dout, seg.data(), false);
  const Outputs b = run(s, q, k, v, dout, seg.data(), true);
  EXPECT_LE(max_rel_diff(a.out, b.out), 1e-5) << "out, seed " << seed;
  EXPECT_LE(max_rel_diff(a.lse, b.lse), 1e-5) << "lse, seed " << seed;
  EXPECT_LE(max_rel_diff(a.dq, b.dq), 1e-5) << "dq, seed " << seed;
  EXPECT_LE(max_rel_diff(a.dk, b.dk), 1e-5) << "dk, seed " << seed;
  EXPECT_LE(max_rel_diff(a.dv, b.dv), 1e-5) << "dv, seed " << seed;
}

}  // namespace

TEST(AttentionSpans, RunsOfEqualIds) {
  const int32_t seg[7] = {4, 4, 4, 1, 1, 9, 9};
  auto spans = attn_detail::segment_spans(seg, 7);
  ASSERT_TRUE(spans.has_value());
  ASSERT_EQ(spans->size(), 3u);
  EXPECT_EQ((*spans)[0].begin, 0);
  EXPECT_EQ((*spans)[0].end, 3);
  EXPECT_EQ((*spans)[1].begin, 3);
  EXPECT_EQ((*spans)[1].end, 5);
  EXPECT_EQ((*spans)[2].begin, 5);
  EXPECT_EQ((*spans)[2].end, 7);
  auto whole = attn_detail::segment_spans(nullptr, 5);
  ASSERT_TRUE(whole.has_value());
  ASSERT_EQ(whole->size(), 1u);
  EXPECT_EQ((*whole)[0].end, 5);
  EXPECT_TRUE(attn_detail::segment_spans(seg, 0)->empty());
}

TEST(AttentionSpans, RecurringIdMeansNoSpans) {
  const int32_t seg[6] = {0, 0, 1, 1, 0, 0};  // id 0 again after its run ended
  EXPECT_FALSE(attn_detail::segment_spans(seg, 6).has_value());
}

TEST(AttentionSpans, OneSegmentIsBitIdenticalToTheSquare) {
  // No ids, or one id: the same blocks and GEMMs as the whole square.
  const AttnShape s = shape(300, 4, 2, 16);
  const size_t qn = size_t(s.seq * s.heads * s.head_dim), kn = size_t(s.seq * s.kv_heads * s.head_dim);
  auto q = randn(qn, 1), k = randn(kn, 2), v = randn(kn, 3), dout = randn(qn, 4);
  const std::vector<int32_t> same(size_t(s.seq), 7);
  for (const int32_t* seg : {static_cast<const int32_t*>(nullptr), same.data()}) {
    const Outputs a = run(s, q, k, v, dout, seg, false);
    const Outputs b = run(s, q, k, v, dout, nullptr, true);
    EXPECT_EQ(a.out, b.out);
    EXPECT_EQ(a.lse, b.lse);
    EXPECT_EQ(a.dq, b.dq);
    EXPECT_EQ(a.dk, b.dk);
    EXPECT_EQ(a.dv, b.dv);
  }
}

TEST(AttentionSpans, RandomSegmentsMatchTheMaskedSquare) {
  // Short samples (as packed rows), long ones crossing the 256-row query block, and a mix; GQA and MHA.
  for (uint64_t seed = 10; seed < 14; ++seed) {
    compare_on_segments(shape(700, 4, 2, 16), random_segments(700, 60, seed), seed);
    compare_on_segments(shape(700, 2, 2, 8), random_segments(700, 600, seed + 100), seed + 100);
    compare_on_segments(shape(333, 6, 3, 8), random_segments(333, 5, seed + 200), seed + 200);
  }
}

TEST(AttentionSpans, RecurringIdsFallBackToTheMaskedSquare) {
  // A non-contiguous id: the whole square with the mask, bit for bit.
  const AttnShape s = shape(40, 2, 1, 8);
  std::vector<int32_t> seg(40);
  for (int64_t i = 0; i < 40; ++i) seg[size_t(i)] = int32_t((i / 5) % 3);
  const size_t qn = size_t(s.seq * s.heads * s.head_dim), kn = size_t(s.seq * s.kv_heads * s.head_dim);
  auto q = randn(qn, 21), k = randn(kn, 22), v = randn(kn, 23), dout = randn(qn, 24);
  const Outputs a = run(s, q, k, v, dout, seg.data(), false);
  const Outputs b = run(s, q, k, v, dout, seg.data(), true);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.dq, b.dq);
  EXPECT_EQ(a.dk, b.dk);
  EXPECT_EQ(a.dv, b.dv);
}
