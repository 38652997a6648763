// Test data for the 8-bit AdamW step as a backend op (tests/exec/test_adamw_q8_step.cpp, tests/gpu/
// test_adamw_q8_step.cpp): masters, 8-bit moment states made with optim::quantize_block from random fp32 moments,
// and a gradient per step. Blocks cycle through kinds: ordinary, all zero, below FLT_MIN (subnormal moments and
// gradients), large, magnitudes spread over many decades, and half-zero gradients.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/split_master.h"
#include "optim/adamw_kernels.h"
#include "optim/quant8.h"

namespace lt::test {

struct Q8State {
  std::vector<float> p;                // fp32 master (empty for the split master)
  std::vector<bf16_t> hi;              // split master (empty for fp32)
  std::vector<uint16_t> lo;
  std::vector<uint8_t> mq, vq;         // codes
  std::vector<float> ms, vs;           // block scales
};

struct Q8Case {
  int64_t n = 0;
  Q8State init;                        // fp32 master
  std::vector<std::vector<float>> g;   // one gradient per step
};

constexpr int kQ8Kinds = 6;

inline Q8Case make_q8_case(int64_t n, int steps, uint32_t seed) {
  const int64_t B = optim::kQ8Block, nblk = (n + B - 1) / B;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  auto sign = [&] { return ud(rng) < 0.5f ? -1.0f : 1.0f; };
  Q8Case c;
  c.n = n;
  std::vector<float> m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
  c.init.p.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    const int kind = int((i / B) % kQ8Kinds);
    float mi = 0, vi = 0;
    switch (kind) {
      case 0: case 5: mi = nd(rng) * 1e-3f, vi = std::fabs(nd(rng)) * 1e-6f; break;
      case 1: break;                                                     // all zero
      case 2: mi = nd(rng) * 1e-39f, vi = std::fabs(nd(rng)) * 1e-40f; break;  // subnormal
      case 3: mi = nd(rng), vi = std::fabs(nd(rng)) * 100.0f; break;     // large
      case 4: mi = sign() * std::pow(10.0f, -12.0f * ud(rng)), vi = std::pow(10.0f, -20.0f * ud(rng)); break;
    }
    m[size_t(i)] = mi, v[size_t(i)] = vi;
    c.init.p[size_t(i)] = nd(rng) * (kind == 3 ? 3.0f : 0.05f);
  }
  c.init.mq.resize(size_t(n)), c.init.vq.resize(size_t(n));
  c.init.ms.resize(size_t(nblk)), c.init.vs.resize(size_t(nblk));
  for (int64_t b = 0; b < nblk; ++b) {
    const int64_t b0 = b * B, len = std::min(B, n - b0);
    c.init.ms[size_t(b)] = optim::quantize_block(optim::signed_dynamic_map(), &m[size_t(b0)], len, &c.init.mq[size_t(b0)]);
    c.init.vs[size_t(b)] = optim::quantize_block(optim::unsigned_dynamic_map(), &v[size_t(b0)], len, &c.init.vq[size_t(b0)]);
  }
  for (int s = 0; s < steps; ++s) {
    std::vector<float> g(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      float gi = 0;
      switch (int((i / B) % kQ8Kinds)) {
        case 0: gi = nd(rng) * 1e-2f; break;
        case 1: break;
        case 2: gi = nd(rng) * 1e-38f; break;  // m stays below FLT_MIN
        case 3: gi = nd(rng) * 10.0f; break;
        case 4: gi = ud(rng) < 0.1f ? 0.0f : sign() * std::pow(10.0f, 1.0f - 11.0f * ud(rng)); break;
        case 5: gi = ud(rng) < 0.5f ? 0.0f : nd(rng) * 1e-2f; break;
      }
      g[size_t(i)] = gi;
    }
    c.g.push_back(std::move(g));
  }
  return c;
}

// Step t's constants (t from 1): non-default betas (so that beta1 and inv_bc2_sqrt must reach the backend), weight
// decay, a learning rate and a clip factor that change per step.
inline optim::AdamWScalars q8_scalars(int t) {
  return optim::make_adamw_scalars(1e-3 * t, 0.1, 0.85, 0.98, 1e-8, t, t % 2 ? 0.37f : 1.0f);
}

// The split form of an fp32-master state.
inline Q8State to_split(const Q8State& s) {
  Q8State r = s;
  r.p.clear();
  r.hi.resize(s.p.size()), r.lo.resize(s.p.size());
  for (size_t i = 0; i < s.p.size(); ++i) split_master(s.p[i], &r.hi[i], &r.lo[i]);
  return r;
}

// The CPU optimizer's 8-bit step (optim::adamw_q8 on isa) on either master form: a split master is joined to fp32,
// updated and split again, as the optimizer's tile path does it.
inline void optim_q8_step(optim::Isa isa, const optim::AdamWScalars& s, Q8State& st, const float* g, int64_t n) {
  if (!st.p.empty()) {
    optim::adamw_q8(isa, s, st.p.data(), g, st.mq.data(), st.vq.data(), st.ms.data(), st.vs.data(), nullptr, n);
    return;
  }
  std::vector<float> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = join_master(st.hi[size_t(i)], st.lo[size_t(i)]);
  optim::adamw_q8(isa, s, p.data(), g, st.mq.data(), st.vq.data(), st.ms.data(), st.vs.data(), nullptr, n);
  for (int64_t i = 0; i < n; ++i) split_master(p[size_t(i)], &st.hi[size_t(i)], &st.lo[size_t(i)]);
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// First differing index of two arrays (for messages), -1 if none.
template <typename T>
int64_t first_diff(const std::vector<T>& a, const std::vector<T>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return int64_t(i);
  return a.size() == b.size() ? -1 : int64_t(std::min(a.size(), b.size()));
}

// "" when a and b hold the same bits, else which arrays differ and where.
inline std::string q8_diff(const Q8State& a, const Q8State& b) {
  std::string r;
  auto check = [&r](const char* name, const auto& x, const auto& y) {
    const int64_t i = first_diff(x, y);
    if (i >= 0) r += std::string(name) + " differs at " + std::to_string(i) + "; ";
  };
  check("p", a.p, b.p);
  check("hi", a.hi, b.hi);
  check("lo", a.lo, b.lo);
  check("mq", a.mq, b.mq);
  check("vq", a.vq, b.vq);
  check("ms", a.ms, b.ms);
  check("vs", a.vs, b.vs);
  return r;
}

}  // namespace lt::test
