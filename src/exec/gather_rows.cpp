#include "exec/gather_rows.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

namespace lt {

void gather_rows(char* dst, const char* src, const int32_t* ids, int64_t n, int64_t rowb, int max_threads) {
  auto run = [=](int64_t a, int64_t b) {
    for (int64_t t = a; t < b; ++t) std::memcpy(dst + t * rowb, src + int64_t(ids[t]) * rowb, size_t(rowb));
  };
  const int64_t cap = max_threads > 0 ? max_threads : std::min<int64_t>(16, std::max(1u, std::thread::hardware_concurrency()));
  const int64_t threads = std::min<int64_t>(cap, n * rowb / (int64_t(4) << 20));
  if (threads <= 1) return run(0, n);
  std::vector<std::thread> ts;
  for (int64_t k = 1; k < threads; ++k) ts.emplace_back(run, n * k / threads, n * (k + 1) / threads);
  run(0, n / threads);
  for (auto& t : ts) t.join();
}

}  // namespace lt
