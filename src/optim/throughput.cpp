#include "optim/throughput.h"

#include <algorithm>
#include <barrier>
#include <initializer_list>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/timer.h"
#include "optim/adamw_kernels.h"
#include "optim/aligned_buffer.h"
#include "optim/optimizer.h"

namespace lt::optim {

// The optimizer's kernels over n parameters split across threads. The threads are started once and
// first-touch their own slices; each repetition is timed between two barriers, so thread start-up and
// page faults are not counted (an earlier version timed the thread start-up too, which halved the
// 8-bit rate on 16 cores). The median of 7 repetitions is returned. The buffers are 64-byte aligned
// like the trainer's pinned ones (the kernels' aligned-store paths).
double measure_adamw_rate(bool q8, int threads, int64_t n) {
  threads = std::max(1, threads);
  const int64_t blocks = std::max<int64_t>(threads, n / kQ8Block);
  n = blocks * kQ8Block;
  const auto N = static_cast<size_t>(n), B = static_cast<size_t>(blocks);
  const Isa isa = resolve_isa(Isa::Auto);
  const auto sc = make_adamw_scalars(1e-5, 0.01, 0.9, 0.999, 1e-8, 1, 1.0f);
  // The trainer's exact fp32 masters are stored split (bf16 streaming copy + 16-bit remainder: 4 B a parameter
  // instead of fp32 + copy's 6) and updated by the fused kernels where the ISA has them: time that path, else the
  // fp32-master one. (Both read below the ~8.5 Gparams/s training reaches on the H200 host: 6.5 with the fp32 path
  // and 5.2 with this one, measured in different hours.)
  const bool fused = q8 ? q8_avx512_kernel_available() && isa == Isa::Avx512 : isa == Isa::Avx512;
  AlignedBuffer<float> p, g, m, v, ms, vs;
  AlignedBuffer<uint8_t> mq, vq;
  AlignedBuffer<bf16_t> out;
  AlignedBuffer<uint16_t> lo;
  g.reset(N, false);  // not zeroed here: each thread touches its slice
  out.reset(N, false);
  if (fused) lo.reset(N, false);
  else p.reset(N, false);
  if (q8) {
    mq.reset(N, false), vq.reset(N, false), ms.reset(B, false), vs.reset(B, false);
  } else {
    m.reset(N, false), v.reset(N, false);
  }
  constexpr int kReps = 7;
  std::barrier sync(threads + 1);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    const int64_t a = blocks * t / threads * kQ8Block, b = blocks * (t + 1) / threads * kQ8Block;
    ts.emplace_back([&, a, b] {
      for (int64_t i = a; i < b; ++i) {
        g.data()[i] = 1e-3f, out.data()[i] = f32_to_bf16(0.01f);
        if (fused) lo.data()[i] = 0;
        else p.data()[i] = 0.01f;
        if (q8) mq.data()[i] = 0, vq.data()[i] = 0;
        else m.data()[i] = 0, v.data()[i] = 0;
      }
      if (q8)
        for (int64_t k = a / kQ8Block; k < b / kQ8Block; ++k) ms.data()[k] = 0, vs.data()[k] = 0;
      MasterIo io;
      io.bf16 = out.data() + a;
      io.lo = fused ? lo.data() + a : nullptr;
      io.g = g.data() + a;
      for (int r = 0; r < kReps; ++r) {
        sync.arrive_and_wait();  // start
        if (fused && q8)
          adamw_q8_fused(isa, sc, MasterFormat::Split, io, mq.data() + a, vq.data() + a, ms.data() + a / kQ8Block,
                         vs.data() + a / kQ8Block, b - a);
        else if (fused)
          adamw_f32_fused(isa, sc, MasterFormat::Split, io, m.data() + a, v.data() + a, b - a);
        else if (q8)
          adamw_q8(isa, sc, p.data() + a, g.data() + a, mq.data() + a, vq.data() + a, ms.data() + a / kQ8Block,
                   vs.data() + a / kQ8Block, out.data() + a, b - a);
        else
          adamw_f32(isa, sc, p.data() + a, g.data() + a, m.data() + a, v.data() + a, out.data() + a, b - a);
        sync.arrive_and_wait();  // done
      }
    });
  }
  std::vector<double> times;
  for (int r = 0; r < kReps; ++r) {
    sync.arrive_and_wait();
    const double t0 = now_seconds();
    sync.arrive_and_wait();
    times.push_back(now_seconds() - t0);
  }
  for (auto& t : ts) t.join();
  // The median: the planner wants the rate training will see on a busy host, not the luckiest run.
  std::nth_element(times.begin(), times.begin() + kReps / 2, times.end());
  return double(n) / times[size_t(kReps / 2)];
}

double measure_optimizer_rate(bool q8, int threads, int64_t n) {
  constexpr int64_t kUnit = int64_t(1) << 24;  // 16M elements: a 3B model's layer is ~77M, its tensors 2-30M
  const int64_t units = std::max<int64_t>(1, (n + kUnit - 1) / kUnit);
  std::vector<UnitSpec> specs(static_cast<size_t>(units));
  for (auto& u : specs) {
    u.numel = kUnit;
    u.tensors.push_back({"w", 0, kUnit, 0, q8 ? StateFormat::Q8 : StateFormat::F32});
  }
  AdamWConfig cfg;
  cfg.threads = std::max(1, threads);
  cfg.master = MasterFormat::Split;
  CpuAdamW opt(specs, cfg);
  std::vector<AlignedBuffer<float>> g(specs.size());
  std::vector<AlignedBuffer<bf16_t>> hi(specs.size());
  std::vector<AlignedBuffer<uint16_t>> lo(specs.size());
  std::vector<UnitBuffers> bufs(specs.size());
  for (size_t u = 0; u < specs.size(); ++u) {
    g[u].reset(size_t(kUnit), false), hi[u].reset(size_t(kUnit), false), lo[u].reset(size_t(kUnit), true);
    std::fill_n(g[u].data(), kUnit, 1e-3f);
    std::fill_n(hi[u].data(), kUnit, f32_to_bf16(0.01f));
    bufs[u].grad = g[u].data(), bufs[u].bf16 = hi[u].data(), bufs[u].lo = lo[u].data();
  }
  constexpr int kSteps = 6;
  std::vector<double> times;
  for (int s = 0; s < kSteps; ++s) {
    opt.begin_step(1e-5f);
    for (size_t u = 0; u < specs.size(); ++u) opt.submit(int(u), bufs[u]);
    const double t0 = now_seconds();
    for (size_t u = 0; u < specs.size(); ++u) opt.add_grad_sumsq(int(u), 1e-6);  // the last one releases them all
    opt.wait_all();
    if (s > 0) times.push_back(now_seconds() - t0);  // the first step warms the pool and the pages
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return double(units * kUnit) / times[times.size() / 2];
}

}  // namespace lt::optim
