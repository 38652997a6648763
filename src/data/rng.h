// Small deterministic RNG and shuffle, identical on every platform and standard library
// (std::shuffle's algorithm is implementation-defined, which would break exact resume across builds).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

namespace lt::data {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() { return splitmix64(s_++ * 0x2545F4914F6CDD1Dull + 0x1234567ull); }
  // Uniform in [0, n), n > 0, by rejection (no modulo bias).
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = next(); while (x >= limit);
    return x % n;
  }

 private:
  uint64_t s_;
};

// Fisher-Yates.
template <typename T>
void shuffle_in_place(std::vector<T>& v, uint64_t seed) {
  Rng r(seed);
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[r.below(i)]);
}

// A seeded permutation of 0..n-1.
inline std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  shuffle_in_place(p, seed);
  return p;
}

}  // namespace lt::data
