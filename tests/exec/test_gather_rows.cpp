// The host embedding lookup's row gather, single- and multi-threaded.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "exec/gather_rows.h"

TEST(GatherRows, EqualsTheSerialCopyForAnyThreadCount) {
  const int64_t rows = 3000, rowb = 4096, n = 5000;  // 20 MiB out: up to 5 threads at 4 MiB each
  std::vector<char> table(size_t(rows * rowb));
  std::mt19937 rng(3);
  for (auto& c : table) c = char(rng());
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& i : ids) i = int32_t(rng() % rows);
  std::vector<char> ref(size_t(n * rowb));
  for (int64_t t = 0; t < n; ++t) std::memcpy(&ref[size_t(t * rowb)], &table[size_t(ids[size_t(t)]) * size_t(rowb)], size_t(rowb));
  for (int threads : {1, 2, 3, 8, 0}) {
    std::vector<char> out(ref.size(), 0);
    lt::gather_rows(out.data(), table.data(), ids.data(), n, rowb, threads);
    EXPECT_EQ(out, ref) << "threads " << threads;
  }
}
