#include "model/init.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

namespace lt {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash_name(const std::string& s) {  // FNV-1a
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

// Counter-based normal: element pair k of a tensor comes from two uniforms hashed from (key, k),
// Box-Muller gives both elements. So values depend only on (seed, name, index). Writes elements [begin, end) of the
// tensor: dst[0] is element begin (either end may split a pair).
void fill_normal(float* dst, uint64_t key, double std, int64_t begin, int64_t end) {
  // Float math is plenty for fp32 weights (tails reach 5.8 sigma) and several times faster than double.
  constexpr float two_pi = 6.28318530717958647692f;
  const float sd = float(std);
  for (int64_t i = begin & ~int64_t(1); i < end; i += 2) {
    uint64_t k = uint64_t(i / 2);
    // One 64-bit hash gives both uniforms (24 bits each).
    uint64_t a = splitmix64(key + k * 0x9e3779b97f4a7c15ull);
    float u1 = (float(uint32_t(a >> 40)) + 1.0f) * 0x1.0p-24f;        // (0, 1]
    float u2 = float(uint32_t(a >> 16) & 0xffffffu) * 0x1.0p-24f;      // [0, 1)
    float r = sd * std::sqrt(-2.0f * std::log(u1));
    float sn, cs;
    ::sincosf(two_pi * u2, &sn, &cs);
    if (i >= begin) dst[i - begin] = r * cs;
    if (i + 1 < end) dst[i + 1 - begin] = r * sn;
  }
}

int pick_threads(int threads) {
  if (threads > 0) return threads;
  unsigned hc = std::thread::hardware_concurrency();
  return int(std::clamp(hc, 1u, 16u));
}

bool is_norm(const ParamInfo& p) { return p.suffix.find("norm.weight") != std::string::npos; }
bool is_bias(const ParamInfo& p) { return p.suffix.size() >= 5 && p.suffix.compare(p.suffix.size() - 5, 5, ".bias") == 0; }

}  // namespace

void init_unit_part(const ModelConfig& c, const UnitLayout& u, int64_t offset, int64_t count, float* out, uint64_t seed,
                    int threads) {
  LT_CHECK(offset >= 0 && count >= 0 && offset + count <= u.numel,
           "internal: init_unit_part({}, {}) outside the unit's {} elements", offset, count, u.numel);
  std::memset(out, 0, size_t(count) * sizeof(float));
  const uint64_t seed_key = splitmix64(seed ^ 0x6c617a7974726169ull);
  struct Job {
    float* out;          // element begin of the tensor
    int64_t begin, end;  // the tensor's elements in the window
    uint64_t key;
  };
  std::vector<Job> jobs;
  for (auto& p : u.params) {
    const int64_t b = std::max(offset, p.offset) - p.offset, e = std::min(offset + count, p.offset + p.numel) - p.offset;
    if (b >= e) continue;
    float* dst = out + (p.offset + b - offset);
    if (is_norm(p)) {
      // Qwen3.5's RMSNorms scale by (1 + w) and start at w = 0; its gated norm (linear_attn.norm) by w = 1.
      const bool plus_one = c.norm_plus_one && p.suffix != "linear_attn.norm.weight";
      std::fill(dst, dst + (e - b), plus_one ? 0.0f : 1.0f);
    } else if (p.suffix == "linear_attn.dt_bias") {
      std::fill(dst, dst + (e - b), 1.0f);  // HF: ones
    } else if (p.suffix == "linear_attn.A_log") {
      // HF: log of uniform(0.01, 16) per value head (decay rates spread over three decades).
      const uint64_t key = splitmix64(seed_key ^ hash_name(p.name));
      for (int64_t i = b; i < e; ++i) {
        const double v = double(splitmix64(key + uint64_t(i)) >> 11) * 0x1.0p-53;
        dst[i - b] = float(std::log(0.01 + v * (16.0 - 0.01)));
      }
    } else if (is_bias(p)) {
      // already zero
    } else {
      jobs.push_back({dst, b, e, splitmix64(seed_key ^ hash_name(p.name))});
    }
  }
  // Split the normal fills into even-sized slices across threads (values do not depend on it).
  int64_t total = 0;
  for (auto& j : jobs) total += j.end - j.begin;
  const int nt = total < (1 << 20) ? 1 : pick_threads(threads);
  auto work = [&](int t) {
    const int64_t lo = total * t / nt, hi = total * (t + 1) / nt;
    int64_t base = 0;
    for (auto& j : jobs) {
      const int64_t len = j.end - j.begin;
      const int64_t b = std::max(lo, base) - base, e = std::min(hi, base + len) - base;
      if (b < e) fill_normal(j.out + b, j.key, c.initializer_range, j.begin + b, j.begin + e);
      base += len;
    }
  };
  if (nt == 1) {
    work(0);
  } else {
    std::vector<std::thread> ts;
    for (int t = 0; t < nt; ++t) ts.emplace_back(work, t);
    for (auto& th : ts) th.join();
  }
  // HF zeroes the padding_idx row of nn.Embedding (padding_idx = pad_token_id).
  if (u.kind == UnitKind::Embedding && c.pad_token_id >= 0 && c.pad_token_id < c.vocab) {
    const int64_t row = u.params.front().offset + c.pad_token_id * c.hidden;
    const int64_t b = std::max(offset, row), e = std::min(offset + count, row + c.hidden);
    if (b < e) std::fill(out + (b - offset), out + (e - offset), 0.0f);
  }
}

void init_unit(const ModelConfig& c, const UnitLayout& u, float* buf, uint64_t seed, int threads) {
  init_unit_part(c, u, 0, u.numel, buf, seed, threads);
}

void init_weights(ModelWeights& w, uint64_t seed, int threads) {
  for (size_t i = 0; i < w.units.size(); ++i) init_unit(w.config, w.layout.units[i], w.unit(i), seed, threads);
}

ModelWeights random_model(const ModelConfig& c, uint64_t seed, int threads) {
  ModelWeights w = make_weights(c);
  init_weights(w, seed, threads);
  return w;
}

}  // namespace lt
