// Gated DeltaNet CPU reference ops benchmark: ms per sample of the chunked gated delta rule (forward with
// chunk states, backward from them) and of the causal conv1d + SiLU, at the hybrid demo's shape
// (configs/demo-qwen35.yaml: S=64, Hk=2, Hv=4, Dk=Dv=32, conv channels 256, kernel 4) and at a long
// sequence (S=1024, Hk=2, Hv=4, Dk=Dv=128). Median of --reps timed repetitions. Not a test.
//   OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 bench_gdn_cpu [--reps 30] [--iters N] [--wall] [--demo]
// Times are the calling thread's CPU time unless --wall (robust on a shared machine; one thread).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "backend/cpu/ops_gdn.h"

using namespace lt::cpu;

namespace {

std::vector<float> randn(size_t n, uint64_t seed, float sd = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
std::vector<float> uniform(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}
std::vector<float> unit_rows(int64_t n_vec, int64_t D, uint64_t seed) {
  auto x = randn(size_t(n_vec * D), seed);
  std::vector<float> y(x.size());
  gdn_l2norm_fwd(x.data(), n_vec, D, 1e-6f, y.data());
  return y;
}

// CPU time of the calling thread in ms: on a shared machine the wall clock also counts the time the
// thread waits for a core (run with OMP_NUM_THREADS=1; the ops then run on the calling thread).
double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return 1e3 * double(ts.tv_sec) + 1e-6 * double(ts.tv_nsec);
}
bool g_wall = false;  // --wall: report wall-clock time instead

// Median over reps of the mean ms of `iters` calls of f.
template <class F>
double time_ms(int reps, int iters, F&& f) {
  std::vector<double> t;
  f();  // warm-up
  for (int r = 0; r < reps; ++r) {
    const auto a = std::chrono::steady_clock::now();
    const double ca = thread_cpu_ms();
    for (int i = 0; i < iters; ++i) f();
    const double cb = thread_cpu_ms();
    const auto b = std::chrono::steady_clock::now();
    t.push_back((g_wall ? std::chrono::duration<double, std::milli>(b - a).count() : cb - ca) / iters);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double checksum(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += double(v) * double(v);
  return std::sqrt(s);
}

void bench_rule(const char* name, GdnShape s, int reps, int iters) {
  const auto q = unit_rows(s.S * s.Hk, s.Dk, 1), k = unit_rows(s.S * s.Hk, s.Dk, 2);
  const auto v = randn(size_t(s.S * s.Hv * s.Dv), 3);
  const auto g = uniform(size_t(s.S * s.Hv), 4, -3.0f, -1e-4f), beta = uniform(size_t(s.S * s.Hv), 5, 0.02f, 0.98f);
  const auto dout = randn(size_t(s.S * s.Hv * s.Dv), 6);
  std::vector<float> o(dout.size()), states(size_t(gdn_rule_num_chunks(s, nullptr) * s.Hv * s.Dk * s.Dv));
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size()), dg(g.size()), db(beta.size());
  const double fwd = time_ms(reps, iters, [&] {
    gdn_rule_chunked_fwd(s, q.data(), k.data(), v.data(), g.data(), beta.data(), nullptr, o.data(), states.data());
  });
  const double bwd = time_ms(reps, iters, [&] {
    gdn_rule_chunked_bwd(s, q.data(), k.data(), v.data(), g.data(), beta.data(), nullptr, states.data(), dout.data(),
                         dq.data(), dk.data(), dv.data(), dg.data(), db.data());
  });
  printf("rule %-34s fwd %8.4f ms  bwd %8.4f ms  total %8.4f ms   |o| %.6g |dq| %.6g |dk| %.6g |dv| %.6g |dg| %.6g "
         "|db| %.6g\n",
         name, fwd, bwd, fwd + bwd, checksum(o), checksum(dq), checksum(dk), checksum(dv), checksum(dg), checksum(db));
}

void bench_conv(const char* name, int64_t S, int64_t C, int64_t K, int reps, int iters) {
  const auto x = randn(size_t(S * C), 11), w = randn(size_t(C * K), 12, 0.5f), dy = randn(size_t(S * C), 13);
  std::vector<float> y(x.size()), dx(x.size()), dw(w.size(), 0.0f);
  const double fwd = time_ms(reps, iters, [&] { gdn_conv_silu_fwd(x.data(), w.data(), S, C, K, nullptr, y.data()); });
  const double bwd = time_ms(reps, iters, [&] {
    gdn_conv_silu_bwd(x.data(), w.data(), dy.data(), S, C, K, nullptr, dx.data(), dw.data());
  });
  printf("conv %-34s fwd %8.4f ms  bwd %8.4f ms  total %8.4f ms   |y| %.6g |dx| %.6g\n", name, fwd, bwd, fwd + bwd,
         checksum(y), checksum(dx));
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 30, iters = 0;
  bool demo_only = false;  // --demo: only the demo shape
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--wall")) g_wall = true;
    if (!std::strcmp(argv[i], "--demo")) demo_only = true;
    if (i + 1 < argc && !std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    if (i + 1 < argc && !std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
  }
  const int small = iters > 0 ? iters : 20, large = iters > 0 ? iters : 1;
  printf("ms per sample (median of %d reps, %s)\n", reps, g_wall ? "wall clock" : "thread CPU time");
  bench_rule("demo S=64 Hk=2 Hv=4 D=32 chunk 64", {64, 2, 4, 32, 32, 64}, reps, small);
  bench_rule("demo S=64 Hk=2 Hv=4 D=32 chunk 16", {64, 2, 4, 32, 32, 16}, reps, small);
  if (!demo_only) {
    bench_rule("S=128 Hk=2 Hv=4 D=32 chunk 64", {128, 2, 4, 32, 32, 64}, reps, small);
    bench_rule("S=1024 Hk=2 Hv=4 D=128 chunk 64", {1024, 2, 4, 128, 128, 64}, std::max(3, reps / 5), large);
  }
  bench_conv("demo S=64 C=256 K=4", 64, 256, 4, reps, small);
  if (!demo_only) bench_conv("S=1024 C=1024 K=4", 1024, 1024, 4, std::max(3, reps / 5), large);
  return 0;
}
