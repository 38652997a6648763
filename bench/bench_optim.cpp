// CPU optimizer throughput against measured memory bandwidth, in the same run and with the same threads.
//
//   bench_optim [--threads N] [--params N] [--units N] [--iters N] [--rounds N] [--isa auto|scalar|avx2|avx512]
//               [--stream-mib N] [--clock wall|cpu] [--fwd-ms X] [--in-cache]
//               [--nvme-dir DIR [--nvme-slots N] [--nvme-gbps X] [--nvme-depth N --nvme-request-kib N]]
//
// For each variant (state format fp32 / 8-bit x master storage x gradient dtype) the model is --units
// equal units of --params/--units elements (one tensor each), updated through CpuAdamW (thread pool,
// chunking, bf16 copy) exactly as in training; the global norm is given (the executor computes it where
// gradients are produced). Reported:
//   params/s        elements updated per second (best of --iters steps)
//   bytes/param     what the update must move, e.g. fp32 states, fp32 master: g, p, m, v read + p, m, v,
//                   bf16 written = 30 B; 8-bit: g, p, m8, v8 read + p, m8, v8, bf16 written = 18 B
//                   (+ 8 B of block scales per 256 elements, read and written); a split master reads and
//                   writes bf16 + 16-bit remainder (8 B) instead of p and the copy (10 B); a bf16-sr
//                   master 4 B; a bf16 gradient 2 B instead of 4
//   GB/s, % of bw   bytes/param * params/s, and its share of the best bandwidth measured in this run
// Bandwidth: copy, triad and an update-like read-modify-write over 4 arrays of --stream-mib MiB each
// (see BandwidthTest); the reference is the best of the three (the most conservative share).
// Rounds: on a shared machine other tenants' memory traffic comes and goes over seconds, so the
// reference and the updates are measured in --rounds interleaved rounds (reference, data movement,
// fp32, 8-bit; each with --iters steps) and each figure is its best over the rounds, as STREAM reports
// its best trial. The share in each round (update / reference measured seconds apart) is printed too.
// All arrays (bandwidth test, masters, gradients, states, bf16 copies) are allocated alike: 64-byte
// aligned and on transparent huge pages where the kernel allows, as the trainer's buffers are.
// --nvme-dir: instead, the 8-bit variant with every unit's moments in DRAM and with every unit's moments on
// NVMe under DIR (optim/nvme_moments.h; --nvme-slots staging slots), interleaved over the rounds: Mparams/s
// of both, and the NVMe tier's I/O (moment bytes read + written per step over the step time, and over the
// I/O thread's own time); the NVMe variant twice, through the old io_uring queue (8 x 1 MiB) and through the shape
// nvme/io_queue.h gives for --nvme-gbps at its default latency (or --nvme-depth / --nvme-request-kib).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <immintrin.h>

#include <time.h>

#include <algorithm>
#include <initializer_list>
#include <chrono>
#include <memory>
#include <random>
#include <utility>
#include <thread>
#include <vector>

#include "core/timer.h"
#include "nvme/io_queue.h"
#include "nvme/nvme_store.h"
#include "optim/aligned_buffer.h"
#include "optim/optimizer.h"

using namespace lt;
using namespace lt::optim;

namespace {

// --clock wall: elapsed time. --clock cpu: process CPU time / threads, i.e. the elapsed time the run would
// take if its threads were never descheduled: use it on a shared, oversubscribed machine (both the
// bandwidth test and the optimizer are timed the same way). The main thread only waits in both.
bool g_cpu_clock = false;
int g_threads = 1;
double clock_now() {
  if (!g_cpu_clock) return now_seconds();
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec)) / g_threads;
}

// Runs fn(begin, end) over [0, n) split into `threads` contiguous parts, one thread each.
template <typename F>
void parallel_for(int threads, int64_t n, F fn) {
  std::vector<std::thread> ts;
  int64_t per = (n + threads - 1) / threads;
  for (int t = 0; t < threads; ++t) {
    int64_t b = t * per, e = std::min(n, b + per);
    if (b < e) ts.emplace_back([=] { fn(b, e); });
  }
  for (auto& t : ts) t.join();
}

struct Bandwidth {
  double copy_gbs = 0, triad_gbs = 0, rmw_gbs = 0;
  double best() const { return std::max({copy_gbs, triad_gbs, rmw_gbs}); }
};

// Bandwidth kernels over [s, e) (e - s a multiple of 8 except at the end), vectorised with AVX2 when
// the CPU has it (scalar loops leave bandwidth unused on one core), scalar otherwise.
__attribute__((target("avx2"))) void copy_avx2(float* a, const float* b, int64_t s, int64_t e) {
  int64_t i = s;
  for (; i + 8 <= e; i += 8) _mm256_storeu_ps(a + i, _mm256_loadu_ps(b + i));
  for (; i < e; ++i) a[i] = b[i];
}
__attribute__((target("avx2"))) void triad_avx2(float* a, const float* b, const float* c, int64_t s, int64_t e) {
  const __m256 k = _mm256_set1_ps(3.0f);
  int64_t i = s;
  for (; i + 8 <= e; i += 8) _mm256_storeu_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(b + i), _mm256_mul_ps(k, _mm256_loadu_ps(c + i))));
  for (; i < e; ++i) a[i] = b[i] + 3.0f * c[i];
}
__attribute__((target("avx2"))) void rmw_avx2(float* a, float* b, float* c, const float* d, int64_t s, int64_t e) {
  int64_t i = s;
  for (; i + 8 <= e; i += 8) {
    __m256 x = _mm256_loadu_ps(d + i);
    _mm256_storeu_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(a + i), x));
    _mm256_storeu_ps(b + i, _mm256_add_ps(_mm256_loadu_ps(b + i), x));
    _mm256_storeu_ps(c + i, _mm256_add_ps(_mm256_loadu_ps(c + i), x));
  }
  for (; i < e; ++i) a[i] += d[i], b[i] += d[i], c[i] += d[i];
}
void copy_plain(float* a, const float* b, int64_t s, int64_t e) {
  for (int64_t i = s; i < e; ++i) a[i] = b[i];
}
void triad_plain(float* a, const float* b, const float* c, int64_t s, int64_t e) {
  for (int64_t i = s; i < e; ++i) a[i] = b[i] + 3.0f * c[i];
}
void rmw_plain(float* a, float* b, float* c, const float* d, int64_t s, int64_t e) {
  for (int64_t i = s; i < e; ++i) a[i] += d[i], b[i] += d[i], c[i] += d[i];
}

// STREAM-like copy (a = b, 8 B/elem), triad (a = b + s*c, 12 B/elem) and an update-like read-modify-write
// (a += d, b += d, c += d: 4 streams read, 3 written, 28 B/elem), each split over `threads` threads.
// Bytes are counted as STREAM does (no write-allocate traffic). trial() runs each kernel once and keeps
// the best rates seen.
class BandwidthTest {
 public:
  BandwidthTest(int threads, int64_t mib) : threads_(threads), n_(mib * (1 << 20) / int64_t(sizeof(float))) {
    for (auto* buf : {&a_, &b_, &c_, &d_}) buf->reset(size_t(n_), false);
    float *pa = a_.data(), *pb = b_.data(), *pc = c_.data(), *pd = d_.data();
    // First touch by the same split of threads as the measurement (NUMA placement).
    parallel_for(threads_, n_, [=](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) pa[i] = 0, pb[i] = 1, pc[i] = 2, pd[i] = 1e-9f;
    });
  }
  Bandwidth trial() {
    float *pa = a_.data(), *pb = b_.data(), *pc = c_.data();
    const float* pd = d_.data();
    const bool avx2 = __builtin_cpu_supports("avx2");
    auto timed = [&](auto body) {
      double t0 = clock_now();
      parallel_for(threads_, n_, body);
      return clock_now() - t0;
    };
    const double n = double(n_);
    Bandwidth now;
    now.copy_gbs = 8.0 * n / timed([=](int64_t s, int64_t e) { avx2 ? copy_avx2(pa, pb, s, e) : copy_plain(pa, pb, s, e); }) * 1e-9;
    now.triad_gbs = 12.0 * n / timed([=](int64_t s, int64_t e) { avx2 ? triad_avx2(pa, pb, pc, s, e) : triad_plain(pa, pb, pc, s, e); }) * 1e-9;
    now.rmw_gbs = 28.0 * n / timed([=](int64_t s, int64_t e) { avx2 ? rmw_avx2(pa, pb, pc, pd, s, e) : rmw_plain(pa, pb, pc, pd, s, e); }) * 1e-9;
    best_.copy_gbs = std::max(best_.copy_gbs, now.copy_gbs);
    best_.triad_gbs = std::max(best_.triad_gbs, now.triad_gbs);
    best_.rmw_gbs = std::max(best_.rmw_gbs, now.rmw_gbs);
    return now;
  }
  const Bandwidth& best() const { return best_; }

 private:
  int threads_;
  int64_t n_;
  AlignedBuffer<float> a_, b_, c_, d_;
  Bandwidth best_;
};

// The 8-bit update's memory traffic with no arithmetic: read p, g, m8, v8; write p, m8, v8 and a bf16
// copy (18 B/param as counted above), with ordinary or non-temporal stores for the bf16 copy. Bounds what
// the 8-bit kernel could reach on this machine if its arithmetic were free. GB/s, best of `iters`.
__attribute__((target("avx2"))) void q8_traffic(float* p, const float* g, uint8_t* mq, uint8_t* vq, uint16_t* out,
                                                int64_t s, int64_t e, bool nt) {
  for (int64_t i = s; i < e; i += 32) {  // s, e multiples of 32; out 64-byte aligned
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(mq + i));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vq + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(mq + i), _mm256_add_epi8(a, b));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(vq + i), _mm256_sub_epi8(a, b));
    for (int64_t k = 0; k < 32; k += 16) {
      __m256 p0 = _mm256_add_ps(_mm256_loadu_ps(p + i + k), _mm256_loadu_ps(g + i + k));
      __m256 p1 = _mm256_add_ps(_mm256_loadu_ps(p + i + k + 8), _mm256_loadu_ps(g + i + k + 8));
      _mm256_storeu_ps(p + i + k, p0);
      _mm256_storeu_ps(p + i + k + 8, p1);
      __m256i o = _mm256_castps_si256(_mm256_add_ps(p0, p1));  // 16 bf16 worth of bytes
      if (nt) _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i + k), o);
      else _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + k), o);
    }
  }
}
// Runs q8_traffic over buffers allocated once; trial() returns {ordinary, non-temporal} GB/s of one pass each.
class Q8TrafficTest {
 public:
  Q8TrafficTest(int threads, int64_t n) : threads_(threads), n_(n / (32 * threads) * (32 * threads)) {
    p_.reset(size_t(n_), false), g_.reset(size_t(n_), false), mq_.reset(size_t(n_), false);
    vq_.reset(size_t(n_), false), out_.reset(size_t(n_), false);
    float *pp = p_.data(), *pg = g_.data();
    uint8_t *pm = mq_.data(), *pv = vq_.data();
    uint16_t* po = out_.data();
    parallel_for(threads_, n_, [=](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) pp[i] = 1, pg[i] = 1e-9f, pm[i] = 0, pv[i] = 0, po[i] = 0;
    });
  }
  std::pair<double, double> trial() {
    double gbs[2] = {0, 0};
    float *pp = p_.data(), *pg = g_.data();
    uint8_t *pm = mq_.data(), *pv = vq_.data();
    uint16_t* po = out_.data();
    for (int nt = 0; nt < 2; ++nt) {
      double t0 = clock_now();
      parallel_for(threads_, n_, [=](int64_t s, int64_t e) { q8_traffic(pp, pg, pm, pv, po, s, e, nt == 1); });
      gbs[nt] = 18.0 * double(n_) / (clock_now() - t0) * 1e-9;
    }
    return {gbs[0], gbs[1]};
  }

 private:
  int threads_;
  int64_t n_;
  AlignedBuffer<float> p_, g_;
  AlignedBuffer<uint8_t> mq_, vq_;
  AlignedBuffer<uint16_t> out_;
};

// One configuration of the update: moments' format, masters' storage, gradients' dtype.
struct Variant {
  const char* name;
  StateFormat state;
  MasterFormat master;
  bool bf16_grad;
  double bytes_per_param() const {
    const double moments = state == StateFormat::F32 ? 16.0 : 4.0 + 16.0 / double(kQ8Block);
    const double masters = master == MasterFormat::F32 ? 10.0 : master == MasterFormat::Split ? 8.0 : 4.0;
    return moments + masters + (bf16_grad ? 2.0 : 4.0);
  }
};
const Variant kVariants[] = {
    {"fp32", StateFormat::F32, MasterFormat::F32, false},           // fp32 master + bf16 copy (6 B)
    {"8bit", StateFormat::Q8, MasterFormat::F32, false},
    {"fp32/split", StateFormat::F32, MasterFormat::Split, false},   // exact fp32 master in 4 B
    {"8bit/split", StateFormat::Q8, MasterFormat::Split, false},
    {"8bit/split/g16", StateFormat::Q8, MasterFormat::Split, true}, // + bf16 gradients (held on the GPU)
    {"8bit/sr/g16", StateFormat::Q8, MasterFormat::Bf16Sr, true},   // bf16-sr master
};

// `units` units of one tensor each (params/units elements, rounded up to whole 8-bit blocks) in the
// variant's formats, their masters and gradients (noise-valued) and page-aligned bf16 copies, as in training.
struct UnitsUnderTest {
  Variant v{};
  int64_t per = 0;
  std::unique_ptr<CpuAdamW> opt;
  // Allocated like the trainer's pinned host buffers (huge-page backed where the kernel allows).
  std::vector<AlignedBuffer<float>> p, g;
  std::vector<AlignedBuffer<bf16_t>> out, g16;
  std::vector<AlignedBuffer<uint16_t>> lo;
  bool warm = false;  // a step has run (the state pages are faulted in)
  UnitBuffers buffers(int u) {
    const size_t i = size_t(u);
    UnitBuffers b;
    if (v.master == MasterFormat::F32) b.master = p[i].data();
    if (v.master == MasterFormat::Split) b.lo = lo[i].data();
    b.bf16 = out[i].data();
    if (v.bf16_grad) b.grad_bf16 = g16[i].data();
    else b.grad = g[i].data();
    return b;
  }
};

UnitsUnderTest make_units(const Variant& v, int threads, int64_t params, int units, Isa isa,
                          const std::string& nvme_dir = "", int nvme_slots = 3,
                          const IoQueueShape& queue = IoQueueShape{}) {
  UnitsUnderTest t;
  t.v = v;
  t.per = (params / units + kQ8Block - 1) / kQ8Block * kQ8Block;
  std::vector<UnitSpec> specs;
  for (int u = 0; u < units; ++u) {
    UnitSpec s;
    s.numel = t.per;
    s.tensors.push_back(TensorSpec{fmt::format("unit{}.weight", u), 0, t.per, 0, v.state});
    s.moments_on_nvme = !nvme_dir.empty();
    specs.push_back(s);
  }
  AdamWConfig cfg;
  cfg.threads = threads;
  cfg.isa = isa;
  cfg.max_grad_norm = 1.0f;
  cfg.master = v.master;
  cfg.nvme_dir = nvme_dir;
  cfg.nvme_slots = nvme_slots;
  if (!nvme_dir.empty()) cfg.nvme_io = default_io(queue);
  t.opt = std::make_unique<CpuAdamW>(specs, cfg);
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> noise(4096);
  for (auto& x : noise) x = d(rng);
  const auto n = size_t(t.per);
  for (int u = 0; u < units; ++u) {
    t.out.emplace_back(n);
    if (v.master == MasterFormat::F32) t.p.emplace_back(n);
    if (v.master == MasterFormat::Split) t.lo.emplace_back(n);
    if (v.bf16_grad) t.g16.emplace_back(n);
    else t.g.emplace_back(n);
    for (size_t i = 0; i < n; ++i) {
      const float w = noise[i & 4095] * 0.02f, gr = noise[(i * 7 + size_t(u)) & 4095] * 1e-3f;
      if (v.master == MasterFormat::F32) t.p.back()[i] = w;
      else t.out.back()[i] = f32_to_bf16(w);
      if (v.bf16_grad) t.g16.back()[i] = f32_to_bf16(gr);
      else t.g.back()[i] = gr;
    }
  }
  return t;
}

// `iters` optimizer steps over t (the first step ever also faults the state pages in); best step time in
// seconds.
double best_step_s(UnitsUnderTest& t, int iters) {
  CpuAdamW& opt = *t.opt;
  const int units = int(t.out.size());
  double best = 1e30;
  for (int it = 0; it < iters + (t.warm ? 0 : 1); ++it) {
    double t0 = clock_now();
    opt.begin_step(1e-4f);
    for (int u = 0; u < units; ++u) opt.add_grad_sumsq(u, 0.25 / units);
    for (int u = 0; u < units; ++u) opt.submit(u, t.buffers(u));
    opt.wait_all();
    double dt = clock_now() - t0;
    if (t.warm) best = std::min(best, dt);
    t.warm = true;
  }
  return best;
}

// Overlap: after "backward" (all partial sums known) the next step's forward consumes the units in
// order, each taking fwd_ms of (simulated, GPU-side) compute after wait(u). Returns the exposed time
// (blocked in wait) per step and the update's span, in ms.
std::pair<double, double> bench_overlap(const Variant& v, int threads, int64_t params, int units, double fwd_ms,
                                        int iters, Isa isa) {
  UnitsUnderTest t = make_units(v, threads, params, units, isa);
  CpuAdamW& opt = *t.opt;
  double best_exposed = 1e30, span = 0;
  for (int it = 0; it < iters + 1; ++it) {
    opt.begin_step(1e-4f);
    for (int u = units - 1; u >= 0; --u) {  // backward order
      opt.submit(u, t.buffers(u));
      opt.add_grad_sumsq(u, 1e-6);
    }
    double t0 = now_seconds(), e0 = opt.stats().exposed_wait_s;
    for (int u = 0; u < units; ++u) {  // next forward
      opt.wait(u);
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(fwd_ms));
    }
    double exposed = opt.stats().exposed_wait_s - e0;
    if (it > 0 && exposed < best_exposed) best_exposed = exposed, span = now_seconds() - t0;
  }
  return {1e3 * best_exposed, 1e3 * span};
}

// Arithmetic cost per element with the data in cache: one thread calls the kernel of each ISA path
// directly on `n` elements (64K: ~1 MB of state, inside L2), best of `reps` calls; ns per element.
double in_cache_ns(Isa isa, bool q8, int64_t n, int reps) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.f, 1.f);
  const auto N = static_cast<size_t>(n), B = static_cast<size_t>(n / kQ8Block);
  AlignedBuffer<float> p(N), g(N), m(N), v(N), ms(B), vs(B);
  AlignedBuffer<uint8_t> mq(N), vq(N);
  AlignedBuffer<bf16_t> out(N);
  for (int64_t i = 0; i < n; ++i) {
    p.data()[i] = 0.02f * d(rng), g.data()[i] = 1e-3f * d(rng), m.data()[i] = 0, v.data()[i] = 0;
    mq.data()[i] = 0, vq.data()[i] = 0;
  }
  for (int64_t b = 0; b < n / kQ8Block; ++b) ms.data()[b] = 0, vs.data()[b] = 0;
  const auto sc = make_adamw_scalars(1e-5, 0.01, 0.9, 0.999, 1e-8, 10, 1.0f);
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    if (q8)
      adamw_q8(isa, sc, p.data(), g.data(), mq.data(), vq.data(), ms.data(), vs.data(), out.data(), n);
    else
      adamw_f32(isa, sc, p.data(), g.data(), m.data(), v.data(), out.data(), n);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    best = std::min(best, double(b.tv_sec - a.tv_sec) + 1e-9 * double(b.tv_nsec - a.tv_nsec));
  }
  return best / double(n) * 1e9;
}

// --nvme-dir: the 8-bit variant with DRAM moments and with NVMe moments, `rounds` interleaved rounds of
// `iters` steps each; best step of each.
void bench_nvme(const std::string& dir, int slots, int threads, int64_t params, int units, int iters, int rounds,
                Isa isa, const IoQueueShape& queue) {
  const Variant& v = kVariants[1];
  UnitsUnderTest dram = make_units(v, threads, params, units, isa);
  UnitsUnderTest old_q = make_units(v, threads, params, units, isa, dir, slots, IoQueueShape{});
  UnitsUnderTest new_q = make_units(v, threads, params, units, isa, dir, slots, queue);
  double best_d = 1e30, best_o = 1e30, best_n = 1e30;
  for (int r = 0; r < rounds; ++r) {
    best_d = std::min(best_d, best_step_s(dram, iters));
    best_o = std::min(best_o, best_step_s(old_q, iters));
    best_n = std::min(best_n, best_step_s(new_q, iters));
  }
  const MomentHomes h = new_q.opt->moment_homes();
  const double n = double(new_q.per * units), io_bytes = 2.0 * double(h.nvme);  // each step reads and writes all
  fmt::print("NVMe moments under {}: {:.2f} GiB of files, {} staging slots ({:.1f} MiB DRAM)\n", dir,
             double(h.nvme) / double(1 << 30), slots, double(h.staging) / double(1 << 20));
  fmt::print("{:<22} {:>12} {:>12} {:>14}\n", "variant", "Mparams/s", "I/O GB/s", "I/O thread GB/s");
  fmt::print("{:<22} {:>12.1f}\n", "8bit (DRAM)", n / best_d * 1e-6);
  for (const auto* u : {&old_q, &new_q}) {
    const UpdaterStats s = u->opt->stats();
    const double best = u == &old_q ? best_o : best_n;
    fmt::print("{:<22} {:>12.1f} {:>12.2f} {:>14.2f}   (read + write {:.2f} GiB per step)\n",
               fmt::format("8bit (NVMe {})", (u == &old_q ? IoQueueShape{} : queue).describe()), n / best * 1e-6,
               io_bytes / best * 1e-9,
               s.nvme_io_s > 0 ? double(s.nvme_read_bytes + s.nvme_write_bytes) / s.nvme_io_s * 1e-9 : 0.0,
               io_bytes / double(1 << 30));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU AdamW throughput vs measured memory bandwidth"};
  int threads = int(std::max(1u, std::thread::hardware_concurrency()));
  int64_t params = 64 << 20;
  int units = 8, iters = 5;
  int64_t stream_mib = 512;
  std::string isa_s = "auto", clock_s = "wall";
  app.add_option("--threads", threads, "worker threads (optimizer pool and bandwidth test)");
  app.add_option("--params", params, "parameters updated per step (all units)");
  app.add_option("--units", units, "units (layers) the parameters are split into");
  app.add_option("--iters", iters, "timed optimizer steps per round (best is reported)");
  int rounds = 5;
  app.add_option("--rounds", rounds, "interleaved rounds of reference, data movement, fp32 and 8-bit (best of all)")
      ->check(CLI::PositiveNumber);
  app.add_option("--stream-mib", stream_mib, "MiB per array of the bandwidth test");
  double fwd_ms = 0;
  app.add_option("--fwd-ms", fwd_ms, "also simulate overlap: next forward takes this many ms per unit (0: skip)");
  app.add_option("--isa", isa_s, "kernel path: auto|scalar|avx2|avx512");
  app.add_option("--clock", clock_s, "wall: elapsed time; cpu: process CPU time / threads (shared machines)")
      ->check(CLI::IsMember({"wall", "cpu"}));
  bool in_cache = false;
  app.add_flag("--in-cache", in_cache, "only the arithmetic cost: ns/element of each ISA path, data in cache, 1 thread");
  std::string nvme_dir;
  int nvme_slots = 3;
  app.add_option("--nvme-dir", nvme_dir, "only the 8-bit variant, moments in DRAM and on NVMe under this directory");
  app.add_option("--nvme-slots", nvme_slots, "DRAM staging slots of the NVMe moments")->check(CLI::PositiveNumber);
  double nvme_gbps = 3.5;
  unsigned nvme_depth = 0;
  int64_t nvme_request_kib = 0;
  app.add_option("--nvme-gbps", nvme_gbps, "the disk's rate for the io_uring queue rule (nvme/io_queue.h)");
  app.add_option("--nvme-depth", nvme_depth, "io_uring requests in flight (0: the rule's)");
  app.add_option("--nvme-request-kib", nvme_request_kib, "io_uring request size in KiB (0: the rule's)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (in_cache) {
      fmt::print("in-cache cost, 65536 elements, 1 thread, best of 200 calls (thread CPU time), ns/element\n");
      fmt::print("{:<8} {:>8} {:>8}\n", "path", "fp32", "8-bit");
      for (Isa i : {Isa::Scalar, Isa::Avx2, Isa::Avx512})
        if (isa_supported(i))
          fmt::print("{:<8} {:>8.3f} {:>8.3f}{}\n", isa_name(i), in_cache_ns(i, false, 65536, 200),
                     in_cache_ns(i, true, 65536, 200),
                     i == Isa::Avx512 && !q8_avx512_kernel_available() ? "  (8-bit: the AVX2 kernel, no VBMI)" : "");
      return 0;
    }
    Isa isa = resolve_isa(parse_isa(isa_s));
    g_cpu_clock = clock_s == "cpu";
    g_threads = threads;
    fmt::print("threads {}  isa {}  params {} in {} units  clock {}  {} rounds of {} steps\n", threads, isa_name(isa),
               params, units, clock_s, rounds, iters);
    if (!nvme_dir.empty()) {
      const IoQueueShape q = io_queue_shape(nvme_gbps * 1e9, kDefaultIoLatency, nvme_depth, nvme_request_kib * 1024);
      bench_nvme(nvme_dir, nvme_slots, threads, params, units, iters, rounds, isa, q);
      return 0;
    }
    BandwidthTest bw(threads, stream_mib);
    const bool avx2 = __builtin_cpu_supports("avx2");
    std::unique_ptr<Q8TrafficTest> traffic;
    if (avx2) traffic = std::make_unique<Q8TrafficTest>(threads, std::min<int64_t>(params, int64_t(64) << 20));
    constexpr int kN = int(std::size(kVariants));
    std::vector<UnitsUnderTest> uut;
    for (const Variant& v : kVariants) uut.push_back(make_units(v, threads, params, units, isa));
    std::vector<double> best_s(kN, 1e30);
    double plain = 0, nt = 0;
    std::vector<std::vector<double>> round_share(kN);
    for (int r = 0; r < rounds; ++r) {
      const double ref = bw.trial().best();
      if (traffic) {
        auto [a, b] = traffic->trial();
        plain = std::max(plain, a), nt = std::max(nt, b);
      }
      for (int f = 0; f < kN; ++f) {
        const double s = best_step_s(uut[size_t(f)], iters);
        best_s[size_t(f)] = std::min(best_s[size_t(f)], s);
        const double gbs = double(uut[size_t(f)].per * units) * kVariants[f].bytes_per_param() / s * 1e-9;
        round_share[size_t(f)].push_back(100 * gbs / ref);
      }
    }
    const Bandwidth& b = bw.best();
    fmt::print("memory bandwidth: copy {:.1f}, triad {:.1f}, update-like rmw {:.1f} GB/s ({} MiB arrays); "
               "reference = best {:.1f} GB/s\n",
               b.copy_gbs, b.triad_gbs, b.rmw_gbs, stream_mib, b.best());
    if (traffic)
      fmt::print("8-bit update's data movement alone (no arithmetic): {:.1f} GB/s ({:.1f}% of bw); "
                 "with non-temporal bf16 stores {:.1f} GB/s ({:.1f}%)\n",
                 plain, 100 * plain / b.best(), nt, 100 * nt / b.best());
    fmt::print("{:<15} {:>12} {:>11} {:>8} {:>10} {:>12}   {}\n", "variant", "Mparams/s", "bytes/param", "GB/s",
               "% of bw", "ns/param/thr", "% of bw in each round (that round's reference)");
    for (int f = 0; f < kN; ++f) {
      const Variant& v = kVariants[f];
      const double pps = double(uut[size_t(f)].per * units) / best_s[size_t(f)];
      const double gbs = pps * v.bytes_per_param() * 1e-9;
      std::string rs;
      for (double x : round_share[size_t(f)]) rs += fmt::format(" {:.1f}", x);
      fmt::print("{:<15} {:>12.1f} {:>11.2f} {:>8.1f} {:>9.1f}% {:>12.2f}  {}\n", v.name, pps * 1e-6,
                 v.bytes_per_param(), gbs, 100 * gbs / b.best(), 1e9 * threads / pps, rs);
    }
    if (fwd_ms > 0) {
      fmt::print("overlap: forward of each of {} units takes {} ms after wait(u) (wall clock)\n", units, fwd_ms);
      for (const Variant& v : kVariants) {
        auto [exposed, span] = bench_overlap(v, threads, params, units, fwd_ms, iters, isa);
        fmt::print("{:<15} exposed optimizer time {:.1f} ms per step (forward span {:.1f} ms, forward alone {:.1f} ms)\n",
                   v.name, exposed, span, fwd_ms * units);
      }
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_optim: {}\n", e.what());
    return 1;
  }
  return 0;
}
