#include "optim/throughput.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/timer.h"
#include "optim/adamw_kernels.h"

namespace lt::optim {

// The optimizer's kernels over n parameters split across threads; best of 3, parameters/s.
double measure_adamw_rate(bool q8, int threads, int64_t n) {
  n = n / kQ8Block * kQ8Block;
  std::vector<float> p(size_t(n), 0.01f), g(size_t(n), 1e-3f), m, v, ms, vs;
  std::vector<uint8_t> mq, vq;
  std::vector<bf16_t> out(static_cast<size_t>(n));
  if (q8) {
    mq.assign(size_t(n), 0);
    vq.assign(size_t(n), 0);
    ms.assign(size_t(n / kQ8Block), 0.f);
    vs.assign(size_t(n / kQ8Block), 0.f);
  } else {
    m.assign(size_t(n), 0.f);
    v.assign(size_t(n), 0.f);
  }
  const Isa isa = resolve_isa(Isa::Auto);
  const auto sc = make_adamw_scalars(1e-5, 0.01, 0.9, 0.999, 1e-8, 1, 1.0f);
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const double t0 = now_seconds();
    std::vector<std::thread> ts;
    const int64_t blocks = n / kQ8Block;
    for (int t = 0; t < threads; ++t) {
      const int64_t a = blocks * t / threads * kQ8Block, b = blocks * (t + 1) / threads * kQ8Block;
      ts.emplace_back([&, a, b] {
        if (q8)
          adamw_q8(isa, sc, p.data() + a, g.data() + a, mq.data() + a, vq.data() + a, ms.data() + a / kQ8Block,
                   vs.data() + a / kQ8Block, out.data() + a, b - a);
        else
          adamw_f32(isa, sc, p.data() + a, g.data() + a, m.data() + a, v.data() + a, out.data() + a, b - a);
      });
    }
    for (auto& t : ts) t.join();
    best = std::min(best, now_seconds() - t0);
  }
  return double(n) / best;
}


}  // namespace lt::optim
