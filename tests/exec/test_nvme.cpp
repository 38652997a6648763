// NVMe tier: real files (O_DIRECT where the filesystem allows it), round trip, cleanup, and injected
// faults (write error, short read, full disk) that must fail the step cleanly.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>

#include "backend/cpu/cpu_backend.h"
#include "exec/executor.h"
#include "core/error.h"
#include "exec/nvme_store.h"
#include "exec_test_util.h"

namespace lt {
namespace {

// Posix I/O with faults injected on the n-th call.
class FaultyIo final : public IoLayer {
 public:
  enum Mode { None, WriteError, DiskFull, ShortRead };
  std::atomic<int> mode{None};
  std::atomic<int> countdown{1};  // fault on this call (1 = the first)
  std::shared_ptr<IoLayer> base = posix_io();
  std::string name() const override { return "faulty"; }
  int open(const std::string& p, int f, int m) override { return base->open(p, f, m); }
  int close(int fd) override { return base->close(fd); }
  int unlink(const std::string& p) override { return base->unlink(p); }
  int64_t pwrite(int fd, const void* b, int64_t n, int64_t off) override {
    if ((mode == WriteError || mode == DiskFull) && --countdown == 0) {
      if (mode == DiskFull) {  // part of it lands, then the disk is full
        const int64_t part = n > 4096 ? 4096 : 0;
        if (part) return base->pwrite(fd, b, part, off);
      }
      return mode == DiskFull ? -ENOSPC : -EIO;
    }
    if (mode == DiskFull && countdown <= 0) return -ENOSPC;
    return base->pwrite(fd, b, n, off);
  }
  int64_t pread(int fd, void* b, int64_t n, int64_t off) override {
    if (mode == ShortRead && --countdown <= 0) {
      if (countdown == 0 && n > 1) return base->pread(fd, b, n / 2 / 4096 * 4096, off);
      return 0;  // end of file
    }
    return base->pread(fd, b, n, off);
  }
};

class CountingHook final : public UpdateHook {
 public:
  int calls = 0;
  void grad_ready(int64_t, double) override { ++calls; }
  void wait(int64_t) override {}
};

TEST(NvmeStore, RoundTripRangesAndCleanup) {
  auto root = test::temp_dir("store");
  std::filesystem::path dir;
  {
    NvmeStore s(root, nullptr);
    dir = s.dir();
    EXPECT_TRUE(std::filesystem::is_directory(dir));
    const int64_t n = 3 * kIoAlign;
    auto* buf = static_cast<uint8_t*>(std::aligned_alloc(kIoAlign, size_t(n)));
    auto* back = static_cast<uint8_t*>(std::aligned_alloc(kIoAlign, size_t(n)));
    for (int64_t i = 0; i < n; ++i) buf[i] = uint8_t(i * 7 + 3);
    s.write(5, 0, buf, kIoAlign);
    s.write(5, kIoAlign, buf + kIoAlign, 2 * kIoAlign);
    s.write(9, 0, buf, kIoAlign);
    EXPECT_EQ(s.live_files(), 2);
    std::memset(back, 0, size_t(n));
    s.read(5, kIoAlign, back + kIoAlign, 2 * kIoAlign);
    s.read(5, 0, back, kIoAlign);
    EXPECT_EQ(std::memcmp(buf, back, size_t(n)), 0);
    // Reading past the end is a short read with a clear message.
    try {
      s.read(9, 0, back, 2 * kIoAlign);
      ADD_FAILURE() << "short read not detected";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("short read"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("ckpt-9.bin"), std::string::npos) << e.what();
    }
    s.remove(5);
    EXPECT_EQ(s.live_files(), 1);
    std::free(buf);
    std::free(back);
  }
  EXPECT_FALSE(std::filesystem::exists(dir)) << "store directory left behind";
  std::filesystem::remove_all(root);
}

TEST(NvmeStore, UringAndPosixAgree) {
  auto u = uring_io(4, 8192);
  if (!u) GTEST_SKIP() << "io_uring unavailable here";
  auto root = test::temp_dir("uring");
  {
    NvmeStore a(root, u), b(root, posix_io());
    const int64_t n = 5 * kIoAlign;
    auto* buf = static_cast<uint8_t*>(std::aligned_alloc(kIoAlign, size_t(n)));
    auto* back = static_cast<uint8_t*>(std::aligned_alloc(kIoAlign, size_t(n)));
    for (int64_t i = 0; i < n; ++i) buf[i] = uint8_t(i ^ (i >> 8));
    // Written with io_uring (pieces of 8 KiB, 4 in flight), read back with io_uring and with pread.
    a.write(1, 0, buf, n);
    std::memset(back, 0, size_t(n));
    a.read(1, 0, back, n);
    EXPECT_EQ(std::memcmp(buf, back, size_t(n)), 0);
    std::filesystem::copy_file(a.dir() / "ckpt-1.bin", b.dir() / "ckpt-1.bin");
    std::memset(back, 0, size_t(n));
    b.read(1, 0, back, n);
    EXPECT_EQ(std::memcmp(buf, back, size_t(n)), 0);
    std::free(buf);
    std::free(back);
  }
  std::filesystem::remove_all(root);
}

struct FaultCase {
  FaultyIo::Mode mode;
  int countdown;
  const char* expect;
};

TEST(ExecNvmeFaults, StepFailsCleanlyAndRecovers) {
  auto c = test::tiny_config(Arch::Qwen2, 4, false);
  const int64_t B = 2, S = 8;
  auto b = test::random_batch(c, B, S, 41);
  ExecPlan p = ExecPlan::keep_all(c.layers, B, S);
  p.tier = {CkptTier::Nvme, CkptTier::None, CkptTier::Nvme, CkptTier::Nvme, CkptTier::Gpu};
  auto root = test::temp_dir("faults");
  MicroBatch mb{b.ids.data(), b.targets.data(), nullptr, nullptr};

  // Clean reference gradients.
  std::vector<std::vector<float>> clean;
  {
    CpuBackend be(c, test::cpu_opts());
    HostState st(be);
    test::random_weights(be.layout(), st, 3);
    ExecOptions o;
    o.nvme_dir = root;
    Executor ex(c, be, p, st, o);
    ex.train_step({mb});
    for (int64_t u = 0; u < st.units(); ++u) clean.emplace_back(st.grad(u), st.grad(u) + st.numel(u));
  }
  const FaultCase cases[] = {{FaultyIo::WriteError, 2, "Input/output error"},
                             {FaultyIo::DiskFull, 1, "disk full"},
                             {FaultyIo::ShortRead, 1, "short read"},
                             {FaultyIo::ShortRead, 3, "short read"}};
  for (const auto& fc : cases) {
    CpuBackend be(c, test::cpu_opts());
    HostState st(be);
    test::random_weights(be.layout(), st, 3);
    std::vector<std::vector<float>> master0;
    for (int64_t u = 0; u < st.units(); ++u) master0.emplace_back(st.master(u), st.master(u) + st.numel(u));
    auto io = std::make_shared<FaultyIo>();
    io->mode = fc.mode;
    io->countdown = fc.countdown;
    ExecOptions o;
    o.nvme_dir = root;
    o.io = io;
    std::filesystem::path dir;
    {
      Executor ex(c, be, p, st, o);
      CountingHook hook;
      ex.set_update_hook(&hook);
      try {
        ex.train_step({mb});
        ADD_FAILURE() << "fault " << fc.expect << " did not fail the step";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(fc.expect), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("train step failed"), std::string::npos) << e.what();
      }
      EXPECT_EQ(hook.calls, 0) << "optimizer hook called for a failed step";
      EXPECT_EQ(ex.nvme_files_live(), 0) << "files left behind after " << fc.expect;
      for (int64_t u = 0; u < st.units(); ++u)
        EXPECT_EQ(std::memcmp(master0[size_t(u)].data(), st.master(u), size_t(st.numel(u)) * 4), 0)
            << "master weights touched, unit " << u;
      // The executor stays usable: the next step (fault gone) gives the clean gradients.
      io->mode = FaultyIo::None;
      auto r = ex.train_step({mb});
      EXPECT_GT(r.loss, 0);
      EXPECT_EQ(hook.calls, int(st.units()));
      for (int64_t u = 0; u < st.units(); ++u)
        EXPECT_EQ(std::memcmp(clean[size_t(u)].data(), st.grad(u), size_t(st.numel(u)) * 4), 0) << "unit " << u;
      EXPECT_EQ(ex.nvme_files_live(), 0);
      // Fail again and destroy right after the failure.
      io->mode = fc.mode;
      io->countdown = fc.countdown;
      EXPECT_THROW(ex.train_step({mb}), Error);
    }
    // Nothing left in the NVMe root after destruction.
    EXPECT_TRUE(std::filesystem::is_empty(root)) << "NVMe directory not cleaned up after " << fc.expect;
  }
  std::filesystem::remove_all(root);
}

TEST(ExecNvmeFaults, BackendOpFailureIsReportedAndRecoverable) {
  auto c = test::tiny_config(Arch::Qwen3, 3, true);
  auto b = test::random_batch(c, 2, 8, 5);
  CpuBackend be(c, test::cpu_opts());
  HostState st(be);
  test::random_weights(be.layout(), st, 1);
  ExecPlan p = ExecPlan::keep_all(c.layers, 2, 8);
  p.tier = {CkptTier::Cpu, CkptTier::None, CkptTier::Gpu, CkptTier::Gpu};
  Executor ex(c, be, p, st);
  MicroBatch mb{b.ids.data(), b.targets.data(), nullptr, nullptr};
  auto ok = ex.train_step({mb});
  be.inject_failure(Lane::Compute, 4, "injected kernel failure");
  try {
    ex.train_step({mb});
    ADD_FAILURE() << "injected failure not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("injected kernel failure"), std::string::npos) << e.what();
  }
  auto again = ex.train_step({mb});
  EXPECT_EQ(ok.loss, again.loss);
}

TEST(ExecNvmeFaults, NvmeBudgetRefusedUpFront) {
  auto c = test::tiny_config(Arch::Qwen2, 4, false);
  CpuBackend be(c, test::cpu_opts());
  HostState st(be);
  ExecPlan p = ExecPlan::keep_all(c.layers, 2, 8);
  p.tier = {CkptTier::Nvme, CkptTier::Nvme, CkptTier::Nvme, CkptTier::Gpu, CkptTier::Gpu};
  ExecOptions o;
  o.nvme_dir = test::temp_dir("budget");
  o.nvme_budget = 2 * kIoAlign;
  try {
    Executor ex(c, be, p, st, o);
    ADD_FAILURE() << "plan over the NVMe budget was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit: nvme short by"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(o.nvme_dir);
}

}  // namespace
}  // namespace lt
