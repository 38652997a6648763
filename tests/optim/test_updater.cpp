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
