// How well one core overlaps arithmetic with memory traffic: the bound on the 8-bit update's share of
// bandwidth on a given machine.
//
//   bench_overlap [--threads N] [--params N] [--rounds N]
//
// A streaming loop moves exactly the 8-bit update's bytes (read p, g, m8, v8; write p, m8, v8 and a
// bf16 copy with non-temporal stores: 18 B/param) and does K extra 512-bit FMAs per 16 elements on
// 12 independent accumulators: no dependency chains, no software prefetch, the hardware prefetchers'
// favourite pattern. It is timed for K = 0 … 60 with the data in memory (--params elements, --threads
// threads) and in L1/L2 (32K elements, repeated, one thread: the arithmetic's cost per core; the
// kernel's L2 prefetches run past a small range's end into a neighbour's), and the real 8-bit AdamW
// kernel in the same interleaved rounds. If memory
// and arithmetic overlapped perfectly, the loop's in-memory time would be the larger of its K = 0
// in-memory time and its in-cache time; the gap to that is what the core loses. The kernel (about 61
// vector operations per 16 elements) can be compared with the loop at K = 60.
// Each figure is the minimum over --rounds interleaved rounds (ns per parameter per thread).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <immintrin.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "core/timer.h"
#include "optim/adamw_kernels.h"
#include "optim/aligned_buffer.h"

using namespace lt;
using namespace lt::optim;

namespace {

template <int K>
__attribute__((target("avx512f,avx512bw"))) void traffic(float* p, const float* g, uint8_t* mq, uint8_t* vq,
                                                          uint16_t* out, int64_t s, int64_t e) {
  const __m512 c = _mm512_set1_ps(1.0001f);
  __m512 acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = _mm512_set1_ps(float(k));
  for (int64_t i = s; i < e; i += 64) {  // s, e multiples of 64; out 64-byte aligned
    const __m512i a = _mm512_loadu_si512(mq + i), b = _mm512_loadu_si512(vq + i);
    _mm512_storeu_si512(mq + i, _mm512_add_epi8(a, b));
    _mm512_storeu_si512(vq + i, _mm512_sub_epi8(a, b));
    for (int64_t k = 0; k < 64; k += 32) {
      const __m512 p0 = _mm512_add_ps(_mm512_loadu_ps(p + i + k), _mm512_loadu_ps(g + i + k));
      const __m512 p1 = _mm512_add_ps(_mm512_loadu_ps(p + i + k + 16), _mm512_loadu_ps(g + i + k + 16));
      _Pragma("GCC unroll 128") for (int j = 0; j < 2 * K; ++j) acc[j % 12] =
          _mm512_fmadd_ps(acc[j % 12], c, (j & 1) ? p1 : p0);
      _mm512_storeu_ps(p + i + k, p0);
      _mm512_storeu_ps(p + i + k + 16, p1);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(out + i + k), _mm512_castps_si512(_mm512_add_ps(p0, p1)));
    }
  }
  _mm_sfence();
  __m512 sum = acc[0];
  for (int k = 1; k < 12; ++k) sum = _mm512_add_ps(sum, acc[k]);
  asm volatile("" ::"v"(sum));  // keep the arithmetic
}

using TrafficFn = void (*)(float*, const float*, uint8_t*, uint8_t*, uint16_t*, int64_t, int64_t);
constexpr int kOps[] = {0, 10, 20, 30, 40, 50, 60};
constexpr TrafficFn kTraffic[] = {traffic<0>, traffic<10>, traffic<20>, traffic<30>, traffic<40>, traffic<50>, traffic<60>};
constexpr int kVariants = int(std::size(kOps)) + 1;  // the loops, then the 8-bit kernel

// The update's arrays, each thread's part contiguous and first touched by that thread.
struct Arrays {
  int64_t n;
  AlignedBuffer<float> p, g, ms, vs;
  AlignedBuffer<uint8_t> mq, vq;
  AlignedBuffer<uint16_t> out;
  Arrays(int64_t n_, int threads) : n(n_) {
    p.reset(size_t(n), false), g.reset(size_t(n), false), mq.reset(size_t(n), false), vq.reset(size_t(n), false);
    out.reset(size_t(n), false);
    ms.reset(size_t(n / kQ8Block)), vs.reset(size_t(n / kQ8Block));
    run(threads, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) p[i] = 1, g[i] = 1e-3f * float(i % 13 - 6), mq[i] = 0, vq[i] = 0, out[i] = 0;
    });
  }
  // fn(s, e) on each thread's contiguous part (multiples of kQ8Block, a multiple of 64).
  template <typename F>
  void run(int threads, F fn) const {
    std::vector<std::thread> ts;
    const int64_t per = n / threads / kQ8Block * kQ8Block;
    for (int t = 0; t < threads; ++t) ts.emplace_back([=, n = n] { fn(t * per, t + 1 == threads ? n : (t + 1) * per); });
    for (auto& t : ts) t.join();
  }
};

// ns per parameter per thread of one pass of variant v over the arrays, repeated `reps` times.
double time_variant(int v, Arrays& a, int threads, int reps, int step) {
  const AdamWScalars s = make_adamw_scalars(1e-3, 0.01, 0.9, 0.999, 1e-8, step, 1.0f);
  const double t0 = now_seconds();
  a.run(threads, [&, v](int64_t b, int64_t e) {
    for (int r = 0; r < reps; ++r) {
      if (v < kVariants - 1)
        kTraffic[v](a.p.data(), a.g.data(), a.mq.data(), a.vq.data(), a.out.data(), b, e);
      else
        adamw_q8(Isa::Auto, s, a.p.data() + b, a.g.data() + b, a.mq.data() + b, a.vq.data() + b,
                 a.ms.data() + b / kQ8Block, a.vs.data() + b / kQ8Block, a.out.data() + b, e - b);
    }
  });
  return (now_seconds() - t0) / double(a.n) / reps * 1e9 * threads;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_overlap: how one core overlaps arithmetic with the 8-bit update's memory traffic"};
  int threads = 1, rounds = 15;
  int64_t params = int64_t(1) << 26;
  app.add_option("--threads", threads, "threads, each on its own contiguous part")->check(CLI::Range(1, 1024));
  app.add_option("--params", params, "elements in memory (arrays far above the last-level cache)")
      ->check(CLI::Range(int64_t(1) << 20, int64_t(1) << 34));
  app.add_option("--rounds", rounds, "interleaved rounds; each figure is the minimum")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) {
    fmt::print(stderr, "bench_overlap: needs AVX-512 F/BW (the loops are written for 512-bit vectors)\n");
    return 2;
  }
  const int64_t unit = int64_t(threads) * kQ8Block;
  Arrays mem(params / unit * unit, threads), cache(32768, 1);
  const int cache_reps = int(std::max<int64_t>(1, params / cache.n));
  std::vector<double> in_mem(kVariants, 1e30), in_cache(kVariants, 1e30);
  for (int r = 0; r < rounds; ++r)
    for (int v = 0; v < kVariants; ++v) {
      in_mem[size_t(v)] = std::min(in_mem[size_t(v)], time_variant(v, mem, threads, 1, r + 1));
      in_cache[size_t(v)] = std::min(in_cache[size_t(v)], time_variant(v, cache, 1, cache_reps, r + 1));
    }
  const double base = in_mem[0];  // K = 0 in memory: the traffic alone
  fmt::print("threads {}  params {} in memory, {} in cache (1 thread)  {} rounds (minimum)  ns/param/thread\n",
             threads, mem.n, cache.n, rounds);
  fmt::print("{:<26} {:>9} {:>10} {:>8} {:>12} {:>14}\n", "loop", "in cache", "in memory", "GB/s", "if overlapped",
             "% of traffic");
  for (int v = 0; v < kVariants; ++v) {
    const double m = in_mem[size_t(v)], c = in_cache[size_t(v)];
    const std::string name = v < kVariants - 1 ? fmt::format("traffic + {} ops/16", kOps[v]) : "8-bit AdamW kernel";
    const double bytes = v < kVariants - 1 ? 18.0 : 18.0 + 16.0 / double(kQ8Block);  // + the block scales
    fmt::print("{:<26} {:>9.3f} {:>10.3f} {:>8.1f} {:>12.3f} {:>13.1f}%\n", name, c, m, bytes * threads / m,
               std::max(base, c), 100.0 * base / m);
  }
  fmt::print("'if overlapped' = max(traffic alone in memory, this loop in cache); '% of traffic' = traffic alone / this.\n");
  return 0;
}
