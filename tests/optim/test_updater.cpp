// The asynchronous updater: updates wait for the global norm, run lowest unit first, and wait(u)
// blocks only for unit u.
#include <gtest/gtest.h>

#include <thread>

#include "helpers.h"
#include "optim/thread_pool.h"

using namespace lt::optim;
using namespace lt::optim::test;

namespace {

struct Units {
  std::vector<UnitSpec> specs;
  std::vector<std::vector<float>> p, g;
  std::vector<std::vector<lt::bf16_t>> out;
  explicit Units(int n, int64_t numel) {
    for (int u = 0; u < n; ++u) {
      specs.push_back(make_unit({numel}, {u % 2 ? StateFormat::Q8 : StateFormat::F32}, {0}));
      p.push_back(randn(specs.back().numel, 200 + u));
      g.push_back(randn(specs.back().numel, 300 + u, 0.01f));
      out.emplace_back(size_t(specs.back().numel), lt::bf16_t(0));
    }
  }
  UnitBuffers buf(int u) { return {p[size_t(u)].data(), g[size_t(u)].data(), out[size_t(u)].data()}; }
};

}  // namespace

TEST(Updater, AsyncEqualsSynchronousAndWaitsForTheNorm) {
  Units a(5, 3000), b(5, 3000);
  AdamWConfig cfg;
  cfg.threads = 2;
  cfg.chunk_elems = 512;
  CpuAdamW oa(a.specs, cfg), ob(b.specs, cfg);
  for (int step = 0; step < 3; ++step) {
    ob.step(1e-3f, {b.buf(0), b.buf(1), b.buf(2), b.buf(3), b.buf(4)});
    // Executor order: backward finishes units in reverse; each is submitted as soon as it is final.
    oa.begin_step(1e-3f);
    auto before = a.p;
    for (int u = 4; u >= 1; --u) {
      oa.add_grad_sumsq(u, grad_sumsq(a.g[size_t(u)].data(), a.specs[size_t(u)].numel));
      oa.submit(u, a.buf(u));
    }
    EXPECT_FALSE(oa.norm_known());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(a.p, before) << "an update ran before the global norm was known";
    oa.add_grad_sumsq(0, grad_sumsq(a.g[0].data(), a.specs[0].numel));
    EXPECT_TRUE(oa.norm_known());
    oa.submit(0, a.buf(0));
    for (int u = 0; u < 5; ++u) oa.wait(u);  // next forward's order
  }
  for (int u = 0; u < 5; ++u) {
    EXPECT_EQ(a.p[size_t(u)], b.p[size_t(u)]) << "unit " << u;
    EXPECT_EQ(a.out[size_t(u)], b.out[size_t(u)]);
  }
  UpdaterStats s = oa.stats();
  EXPECT_EQ(s.steps, 3);
  EXPECT_GE(s.exposed_wait_s, 0.0);
  EXPECT_GT(s.busy_s, 0.0);
  EXPECT_EQ(s.params_updated, 3 * 5 * 3000);
}

TEST(Updater, PoolRunsLowestPriorityFirst) {
  // One worker held busy while tasks queue up in a scrambled order; they then run lowest unit first.
  ThreadPool pool(1);
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  std::vector<int> order;
  pool.push(-1, [&] {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return go; });
  });
  for (int u : {3, 1, 4, 0, 2, 0}) pool.push(u, [&, u] {
      std::lock_guard<std::mutex> lk(mu);
      order.push_back(u);
    });
  {
    std::lock_guard<std::mutex> lk(mu);
    go = true;
  }
  cv.notify_all();
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard<std::mutex> lk(mu);
    if (order.size() == 6) break;
  }
  EXPECT_EQ(order, (std::vector<int>{0, 0, 1, 2, 3, 4}));
}

TEST(Updater, WaitCountsExposedTime) {
  // Unit 0's update cannot start before the last partial sum arrives (20 ms later, from another
  // thread), so wait(0) blocks at least that long and the time is counted as exposed.
  Units a(3, 4096);
  AdamWConfig cfg;
  cfg.threads = 2;
  CpuAdamW opt(a.specs, cfg);
  opt.begin_step(1e-3f);
  for (int u = 0; u < 3; ++u) opt.submit(u, a.buf(u));
  opt.add_grad_sumsq(0, 1.0);
  opt.add_grad_sumsq(1, 1.0);
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    opt.add_grad_sumsq(2, 1.0);
  });
  opt.wait(0);
  late.join();
  EXPECT_GE(opt.stats().exposed_wait_s, 0.015);
  opt.wait_all();
  EXPECT_EQ(opt.stats().params_updated, 3 * 4096);
}

TEST(Updater, MisuseGivesClearErrors) {
  Units a(2, 100);
  AdamWConfig cfg;
  cfg.threads = 1;
  CpuAdamW opt(a.specs, cfg);
  EXPECT_THROW(opt.add_grad_sumsq(0, 1.0), lt::Error);  // before begin_step
  EXPECT_THROW(opt.submit(0, a.buf(0)), lt::Error);     // before begin_step
  opt.begin_step(1e-3f);
  opt.add_grad_sumsq(0, 1.0);
  EXPECT_THROW(opt.add_grad_sumsq(0, 1.0), lt::Error);  // twice
  EXPECT_THROW(opt.add_grad_sumsq(5, 1.0), lt::Error);  // out of range
  EXPECT_THROW(opt.begin_step(1e-3f), lt::Error);       // norm not known yet
  opt.submit(0, a.buf(0));
  EXPECT_THROW(opt.submit(0, a.buf(0)), lt::Error);     // twice
  EXPECT_THROW(opt.submit(1, {nullptr, nullptr, nullptr}), lt::Error);
  opt.add_grad_sumsq(1, 1.0);
  opt.wait_all();
}

namespace {

// First ranges (set_first_ranges): the update's result is the same bit for bit (fp32 and 8-bit tensors, ranges not
// on block boundaries are rounded out), and wait_first() returns with those ranges updated.
TEST(Updater, FirstRangesSameResultAndWaitFirst) {
  using namespace lt;
  using namespace lt::optim;
  const int64_t n0 = 64 * 1024, n1 = 8 * 1024;
  auto run = [&](bool first, std::vector<float>* after_first) {
    std::vector<UnitSpec> units(2);
    units[0].numel = n0;
    units[0].tensors = {{"emb", 0, n0 / 2, 0, StateFormat::F32}, {"emb8", n0 / 2, n0 / 2, 0, StateFormat::Q8}};
    units[1].numel = n1;
    units[1].tensors = {{"w", 0, n1, 0, StateFormat::Q8}};
    AdamWConfig cfg;
    cfg.threads = 2;
    cfg.chunk_elems = 512;
    CpuAdamW opt(units, cfg);
    std::vector<float> p0(static_cast<size_t>(n0)), g0(p0), p1(static_cast<size_t>(n1)), g1(p1);
    for (int64_t i = 0; i < n0; ++i) p0[size_t(i)] = 0.01f * float(i % 97), g0[size_t(i)] = 1e-3f * float(i % 13 - 6);
    for (int64_t i = 0; i < n1; ++i) p1[size_t(i)] = 0.02f * float(i % 31), g1[size_t(i)] = 1e-3f * float(i % 7 - 3);
    const std::vector<std::pair<int64_t, int64_t>> ranges = {{100, 300}, {n0 / 2 - 10, n0 / 2 + 700}, {n0 - 5, n0}};
    for (int step = 0; step < 2; ++step) {
      opt.begin_step(1e-2f);
      if (first) opt.set_first_ranges(0, ranges);
      opt.submit(0, {p0.data(), g0.data(), nullptr});
      opt.submit(1, {p1.data(), g1.data(), nullptr});
      opt.add_grad_sumsq(1, grad_sumsq(g1.data(), n1, opt.isa()));
      opt.add_grad_sumsq(0, grad_sumsq(g0.data(), n0, opt.isa()));
      if (first && after_first && step == 1) {
        opt.wait_first(0);
        for (auto [a, b] : ranges)
          for (int64_t i = a; i < b; ++i) after_first->push_back(p0[size_t(i)]);
      }
      opt.wait_all();
    }
    std::vector<float> out(p0);
    out.insert(out.end(), p1.begin(), p1.end());
    return out;
  };
  const auto ref = run(false, nullptr);
  std::vector<float> seen;
  const auto got = run(true, &seen);
  EXPECT_EQ(got, ref);
  // What wait_first() let the caller read is the final value of those elements.
  std::vector<float> want;
  for (auto [a, b] : std::vector<std::pair<int64_t, int64_t>>{{100, 300}, {n0 / 2 - 10, n0 / 2 + 700}, {n0 - 5, n0}})
    for (int64_t i = a; i < b; ++i) want.push_back(ref[size_t(i)]);
  EXPECT_EQ(seen, want);
}

}  // namespace

namespace {

// wait_first() while the next update's ranges are already hinted (the executor hints the next step's rows before
// this step's lookup waits): it waits for the latest update's first ranges only, not for the whole unit, whose rest
// runs after every other unit (one worker, ~8M elements behind it: the rest is usually still running when it returns).
// A loaded machine can deschedule the waiting thread until the worker has done everything, so one early return in
// five tries passes; a wait_first that waits for the whole unit never returns early.
TEST(Updater, WaitFirstIgnoresTheNextUpdatesHint) {
  using namespace lt;
  using namespace lt::optim;
  const int64_t n0 = 1 << 16, n1 = 1 << 23;
  std::vector<UnitSpec> units(2);
  units[0].numel = n0;
  units[0].tensors = {{"emb", 0, n0, 0, StateFormat::F32}};
  units[1].numel = n1;
  units[1].tensors = {{"w", 0, n1, 0, StateFormat::F32}};
  AdamWConfig cfg;
  cfg.threads = 1;
  cfg.chunk_elems = 1 << 12;
  bool early = false;
  for (int attempt = 0; attempt < 5 && !early; ++attempt) {
    CpuAdamW opt(units, cfg);
    std::vector<float> p0(static_cast<size_t>(n0), 0.5f), g0(p0), p1(static_cast<size_t>(n1), 0.5f), g1(p1);
    opt.begin_step(1e-2f);
    opt.set_first_ranges(0, {{0, 256}});
    opt.submit(0, {p0.data(), g0.data(), nullptr});
    opt.submit(1, {p1.data(), g1.data(), nullptr});
    opt.add_grad_sumsq(0, 1.0);
    opt.add_grad_sumsq(1, 1.0);
    opt.set_first_ranges(0, {{512, 768}});  // the next update's hint
    opt.wait_first(0);
    early = opt.stats().params_updated < n0 + n1;
    EXPECT_NE(p0[0], 0.5f);  // its first range is updated
    opt.wait_all();
    EXPECT_EQ(opt.stats().params_updated, n0 + n1);
  }
  EXPECT_TRUE(early) << "wait_first waited for the whole unit in five tries";
}

}  // namespace
