// NVMe-resident moments (UnitSpec::moments_on_nvme, optim/nvme_moments.h): bit-identical to DRAM moments,
// state files interchangeable across homes, injected I/O faults give clear errors and leave documented
// state, staging reads start before the norm is known, no files are left behind.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "helpers.h"
#include "nvme/nvme_store.h"
#include "optim/master_tiles.h"
#include "optim/nvme_moments.h"

using namespace lt;
using namespace lt::optim;
using namespace lt::optim::test;

namespace {

namespace fs = std::filesystem;

fs::path temp_root(const std::string& name) {
  auto d = fs::temp_directory_path() / fmt::format("lt-optim-nvme-{}-{}", name, ::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string file_bytes(const fs::path& f) {
  std::ifstream in(f, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Posix I/O where one chosen call fails: the read_at-th pread returns half its bytes and the next one
// end of file (a short read); the write_at-th pwrite fails with write_errno (ENOSPC: 4 KiB land first).
class OneFault final : public IoLayer {
 public:
  std::shared_ptr<IoLayer> base = posix_io();
  std::atomic<int> reads{0}, writes{0}, read_at{-1}, write_at{-1}, write_errno{EIO};
  std::string name() const override { return "one-fault"; }
  int open(const std::string& p, int f, int m) override { return base->open(p, f, m); }
  int close(int fd) override { return base->close(fd); }
  int unlink(const std::string& p) override { return base->unlink(p); }
  int64_t pread(int fd, void* b, int64_t n, int64_t off) override {
    const int k = ++reads;
    if (k == read_at) return base->pread(fd, b, n / 2 / kIoAlign * kIoAlign, off);
    if (k == read_at + 1) return 0;
    return base->pread(fd, b, n, off);
  }
  int64_t pwrite(int fd, const void* b, int64_t n, int64_t off) override {
    const int k = ++writes;
    if (k == write_at && write_errno == ENOSPC && n > kIoAlign) return base->pwrite(fd, b, kIoAlign, off);
    if (k == write_at || (k == write_at + 1 && write_errno == ENOSPC)) return -write_errno;
    return base->pwrite(fd, b, n, off);
  }
};

// Units of three tensors (fp32, or 8-bit / fp32 / 8-bit), their masters (fp32, or split into bf16 + 16-bit
// remainders), gradients and bf16 copies.
struct Model {
  std::vector<UnitSpec> specs;
  MasterFormat master;
  std::vector<std::vector<float>> p, g;
  std::vector<std::vector<bf16_t>> hi;
  std::vector<std::vector<uint16_t>> lo;
  Model(int units, bool q8, MasterFormat m, bool all_nvme) : master(m) {
    const StateFormat a = q8 ? StateFormat::Q8 : StateFormat::F32;
    for (int u = 0; u < units; ++u) {
      specs.push_back(make_unit({2000 + 37 * u, 700, 64 * 5 + 3}, {a, StateFormat::F32, a}, {0, 1, 0}));
      specs.back().moments_on_nvme = all_nvme || u % 2 == 1;
      const auto n = size_t(specs.back().numel);
      p.push_back(randn(int64_t(n), 100 + u, 0.05f));
      g.emplace_back(n);
      hi.emplace_back(n);
      lo.emplace_back(n);
      if (m == MasterFormat::Split) split_tile(p.back().data(), hi.back().data(), lo.back().data(), int64_t(n));
    }
  }
  std::vector<UnitSpec> dram_specs() const {
    auto s = specs;
    for (auto& u : s) u.moments_on_nvme = false;
    return s;
  }
  std::vector<char> lo_on_nvme;  // units whose remainders the optimizer keeps (UnitSpec::remainders_on_nvme)
  UnitBuffers buf(int u) {
    UnitBuffers b;
    if (master == MasterFormat::F32) b.master = p[size_t(u)].data();
    else if (lo_on_nvme.empty() || !lo_on_nvme[size_t(u)]) b.lo = lo[size_t(u)].data();
    b.bf16 = hi[size_t(u)].data();
    b.grad = g[size_t(u)].data();
    return b;
  }
  void grads(int step, bool nan = false) {
    for (size_t u = 0; u < g.size(); ++u) g[u] = randn(int64_t(g[u].size()), 1000 * uint64_t(step) + u, 0.01f);
    if (nan) g[1][5] = std::nanf("");
  }
  int units() const { return int(specs.size()); }
};

// One step in the executor's order: backward submits units last to first with their partial sums (the
// norm is known at the last one); or (norm_first) every partial sum first, then the submits, as with
// gradients held on the device. Then the next forward waits for the units in order.
void start_step(CpuAdamW& opt, Model& m, int step, bool norm_first = false, bool nan = false) {
  m.grads(step, nan);
  opt.begin_step(1e-3f);
  auto sumsq = [&](int u) { return grad_sumsq(m.g[size_t(u)].data(), int64_t(m.g[size_t(u)].size())); };
  if (norm_first)
    for (int u = 0; u < m.units(); ++u) opt.add_grad_sumsq(u, sumsq(u));
  for (int u = m.units() - 1; u >= 0; --u) {
    opt.submit(u, m.buf(u));
    if (!norm_first) opt.add_grad_sumsq(u, sumsq(u));
  }
}

void run_step(CpuAdamW& opt, Model& m, int step, bool norm_first = false, bool nan = false) {
  start_step(opt, m, step, norm_first, nan);
  for (int u = 0; u < m.units(); ++u) opt.wait(u);
}

void expect_same_weights(const Model& a, const Model& b, const std::string& where) {
  for (size_t u = 0; u < a.p.size(); ++u) {
    if (a.master == MasterFormat::F32)
      EXPECT_EQ(std::memcmp(a.p[u].data(), b.p[u].data(), a.p[u].size() * 4), 0) << where << ": master of unit " << u;
    else
      EXPECT_EQ(a.lo[u], b.lo[u]) << where << ": remainders of unit " << u;
    EXPECT_EQ(a.hi[u], b.hi[u]) << where << ": bf16 of unit " << u;
  }
}

struct Case {
  bool q8;
  int threads, slots;
  MasterFormat master;
  bool all_nvme;
};

class NvmeMomentsBitExact : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(NvmeMomentsBitExact, EqualsDramMomentsOverSteps) {
  const Case c = GetParam();
  const fs::path root = temp_root("exact");
  Model md(5, c.q8, c.master, c.all_nvme), mn = md;
  AdamWConfig cfg;
  cfg.threads = c.threads;
  cfg.chunk_elems = 256;  // several work items per tensor, running concurrently on the staged slot
  cfg.master = c.master;
  CpuAdamW dram(md.dram_specs(), cfg);
  cfg.nvme_dir = root;
  cfg.nvme_slots = c.slots;
  {
    CpuAdamW nvme(mn.specs, cfg);
    for (int step = 1; step <= 6; ++step) {
      const bool nan = step == 4;  // a skipped step in the middle: staged units are released unwritten
      run_step(dram, md, step, step % 2 == 0, nan);
      run_step(nvme, mn, step, step % 2 == 0, nan);
      expect_same_weights(md, mn, fmt::format("step {}", step));
    }
    EXPECT_EQ(dram.step_count(), 5);
    EXPECT_EQ(nvme.step_count(), 5);
    // The moments, byte for byte: both state files are identical.
    dram.save(root / "dram.state");
    nvme.save(root / "nvme.state");
    EXPECT_TRUE(file_bytes(root / "dram.state") == file_bytes(root / "nvme.state")) << "moments differ";
    for (int u = 0; u < md.units(); ++u) {
      std::vector<float> m1, v1, m2, v2;
      dram.read_state(u, 0, m1, v1);
      nvme.read_state(u, 0, m2, v2);
      EXPECT_EQ(m1, m2) << "unit " << u;
      EXPECT_EQ(v1, v2) << "unit " << u;
    }
    const UpdaterStats s = nvme.stats();
    EXPECT_GT(s.nvme_read_bytes, 0);
    EXPECT_GT(s.nvme_write_bytes, 0);
  }
  fs::remove_all(root);
}

INSTANTIATE_TEST_SUITE_P(
    Homes, NvmeMomentsBitExact,
    ::testing::Values(Case{false, 1, 1, MasterFormat::F32, true}, Case{false, 2, 2, MasterFormat::F32, false},
                      Case{true, 1, 3, MasterFormat::F32, true}, Case{true, 3, 2, MasterFormat::F32, false},
                      Case{true, 2, 1, MasterFormat::Split, true}, Case{false, 3, 3, MasterFormat::Split, false}));

// Split masters with the remainders of the NVMe units in their images (UnitSpec::remainders_on_nvme): masters (bf16
// high halves and remainders) and moments equal the all-DRAM run bit for bit over the steps (a skipped one among
// them); the state file is the same; loading one keeps the image's remainders; write_remainders replaces them.
TEST(NvmeMoments, RemaindersOnNvmeEqualDramOverSteps) {
  for (const bool q8 : {false, true}) {
    const fs::path root = temp_root(q8 ? "rem8" : "rem32");
    Model md(4, q8, MasterFormat::Split, false), mn = md;  // units 1 and 3 on NVMe
    AdamWConfig cfg;
    cfg.threads = 2;
    cfg.chunk_elems = 256;
    cfg.master = MasterFormat::Split;
    CpuAdamW dram(md.dram_specs(), cfg);
    cfg.nvme_dir = root;
    cfg.nvme_slots = 2;
    auto specs = mn.specs;
    mn.lo_on_nvme.assign(specs.size(), 0);
    for (size_t u = 0; u < specs.size(); ++u) specs[u].remainders_on_nvme = mn.lo_on_nvme[u] = specs[u].moments_on_nvme;
    {
      CpuAdamW nvme(specs, cfg);
      const MomentHomes h = nvme.moment_homes();
      EXPECT_EQ(h.remainders, 2 * (specs[1].numel + specs[3].numel));
      EXPECT_GE(h.nvme, h.remainders + state_bytes(specs[1].numel, StateFormat::F32));
      for (int u : {1, 3}) {
        nvme.write_remainders(u, mn.lo[size_t(u)].data());
        std::fill(mn.lo[size_t(u)].begin(), mn.lo[size_t(u)].end(), uint16_t(0xdead));  // not read from here
      }
      auto expect_same = [&](const std::string& where) {
        for (int u = 0; u < md.units(); ++u) {
          EXPECT_EQ(md.hi[size_t(u)], mn.hi[size_t(u)]) << where << ": bf16 of unit " << u;
          std::vector<uint16_t> lo(md.lo[size_t(u)].size());
          if (mn.lo_on_nvme[size_t(u)]) nvme.read_remainders(u, 0, int64_t(lo.size()), lo.data());
          else lo = mn.lo[size_t(u)];
          EXPECT_EQ(md.lo[size_t(u)], lo) << where << ": remainders of unit " << u;
        }
      };
      for (int step = 1; step <= 4; ++step) {
        const bool nan = step == 3;  // skipped: the staged slots are released unwritten
        run_step(dram, md, step, step % 2 == 0, nan);
        run_step(nvme, mn, step, step % 2 == 0, nan);
        expect_same(fmt::format("step {}", step));
      }
      EXPECT_EQ(nvme.step_count(), 3);
      // A range of remainders straddling pages: the same as the whole.
      std::vector<uint16_t> part(2001);
      nvme.read_remainders(1, 777, 2001, part.data());
      EXPECT_TRUE(std::equal(part.begin(), part.end(), md.lo[1].begin() + 777));
      dram.save(root / "dram.state");
      nvme.save(root / "nvme.state");
      EXPECT_TRUE(file_bytes(root / "dram.state") == file_bytes(root / "nvme.state")) << "moments differ";
      for (int u = 0; u < md.units(); ++u)
        for (int t = 0; t < 3; ++t) {
          std::vector<float> m1, v1, m2, v2;
          dram.read_state(u, t, m1, v1);
          nvme.read_state(u, t, m2, v2);
          EXPECT_EQ(m1, m2) << "unit " << u << " tensor " << t;
          EXPECT_EQ(v1, v2) << "unit " << u << " tensor " << t;
        }
      // Loading a state file keeps the remainders in the images; both continue alike.
      nvme.load(root / "dram.state");
      expect_same("after load");
      run_step(dram, md, 5);
      run_step(nvme, mn, 5);
      expect_same("step 5 after load");
      // The caller's remainders are refused for such a unit; write_remainders replaces them, keeping the moments.
      UnitBuffers b = mn.buf(1);
      b.lo = mn.lo[1].data();
      nvme.begin_step(1e-3f);
      try {
        nvme.submit(1, b);
        ADD_FAILURE() << "submit with `lo` for a unit with remainders on NVMe";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("remainders_on_nvme"), std::string::npos) << e.what();
      }
      for (int u = 0; u < mn.units(); ++u) nvme.add_grad_sumsq(u, std::nan(""));  // ends the step, skipped
      std::vector<uint16_t> ones(md.lo[3].size(), 1), back(ones.size());
      nvme.write_remainders(3, ones.data());
      nvme.read_remainders(3, 0, int64_t(back.size()), back.data());
      EXPECT_EQ(back, ones);
      std::vector<float> m1, v1, m2, v2;
      dram.read_state(3, 0, m1, v1);
      nvme.read_state(3, 0, m2, v2);
      EXPECT_EQ(m1, m2);
      EXPECT_EQ(v1, v2);
    }
    fs::remove_all(root);
  }
}

// Posix I/O whose reads take 30 ms: a staged update starts well after the step that queued it.
class SlowReads final : public IoLayer {
 public:
  std::shared_ptr<IoLayer> base = posix_io();
  std::string name() const override { return "slow-reads"; }
  int open(const std::string& p, int f, int m) override { return base->open(p, f, m); }
  int close(int fd) override { return base->close(fd); }
  int unlink(const std::string& p) override { return base->unlink(p); }
  int64_t pread(int fd, void* b, int64_t n, int64_t off) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    return base->pread(fd, b, n, off);
  }
  int64_t pwrite(int fd, const void* b, int64_t n, int64_t off) override { return base->pwrite(fd, b, n, off); }
};

// An NVMe unit's update whose read lands after the next begin_step (one slot, slow reads) uses its own step's
// learning rate and clip factor, not the next step's (it took the new lr and a reset clip factor of 1 before).
TEST(NvmeMoments, LateStagedUpdateKeepsItsStepsConstants) {
  const fs::path root = temp_root("late");
  Model md(3, false, MasterFormat::F32, true), mn = md;
  AdamWConfig cfg;
  cfg.threads = 2;
  cfg.max_grad_norm = 0.05f;  // clipping active
  CpuAdamW dram(md.dram_specs(), cfg);
  cfg.nvme_dir = root;
  cfg.nvme_slots = 1;
  cfg.nvme_io = std::make_shared<SlowReads>();
  {
    CpuAdamW nvme(mn.specs, cfg);
    run_step(dram, md, 1);
    run_step(nvme, mn, 1);  // the files exist: the next reads are slow
    start_step(dram, md, 2);
    start_step(nvme, mn, 2);
    EXPECT_LT(nvme.last_step().clip_coef, 1.0f);
    dram.begin_step(5e-3f);  // the next step begins before the staged updates ran
    nvme.begin_step(5e-3f);
    for (int u = 0; u < md.units(); ++u) {
      dram.wait(u);
      nvme.wait(u);
    }
    expect_same_weights(md, mn, "updates staged after the next begin_step");
  }
  fs::remove_all(root);
}

TEST(NvmeMoments, RemaindersOnNvmeNeedSplitMastersAndNvmeMoments) {
  const fs::path root = temp_root("remcheck");
  Model m(2, false, MasterFormat::F32, true);
  AdamWConfig cfg;
  cfg.threads = 1;
  cfg.nvme_dir = root;
  auto specs = m.specs;
  specs[1].remainders_on_nvme = true;
  EXPECT_THROW(CpuAdamW(specs, cfg), Error);  // fp32 masters have no remainders
  cfg.master = MasterFormat::Split;
  specs[1].moments_on_nvme = false;
  EXPECT_THROW(CpuAdamW(specs, cfg), Error);  // the moments in DRAM
  specs[1].moments_on_nvme = true;
  CpuAdamW ok(specs, cfg);
  std::vector<uint16_t> lo(size_t(specs[0].numel));
  EXPECT_THROW(ok.read_remainders(0, 0, 1, lo.data()), Error);  // unit 0's are the caller's
  fs::remove_all(root);
}

TEST(NvmeMoments, StateFilesLoadAcrossHomes) {
  const fs::path root = temp_root("homes");
  Model md(4, true, MasterFormat::F32, true), mn = md;
  AdamWConfig cfg;
  cfg.threads = 2;
  cfg.chunk_elems = 512;
  CpuAdamW dram(md.dram_specs(), cfg);
  AdamWConfig ncfg = cfg;
  ncfg.nvme_dir = root;
  ncfg.nvme_slots = 2;
  {
    // DRAM -> NVMe: two steps in DRAM, saved, loaded into an NVMe optimizer; both continue alike.
    for (int step = 1; step <= 2; ++step) run_step(dram, md, step);
    dram.save(root / "a.state");
    CpuAdamW nvme(mn.specs, ncfg);
    run_step(nvme, mn, 9);  // state it must replace
    mn = md;
    nvme.load(root / "a.state");
    EXPECT_EQ(nvme.step_count(), 2);
    for (int step = 3; step <= 4; ++step) {
      run_step(dram, md, step);
      run_step(nvme, mn, step);
    }
    expect_same_weights(md, mn, "DRAM state loaded into NVMe moments");
    // NVMe -> DRAM: the NVMe optimizer's file equals the DRAM one's and loads into a DRAM optimizer.
    dram.save(root / "b.state");
    nvme.save(root / "c.state");
    EXPECT_TRUE(file_bytes(root / "b.state") == file_bytes(root / "c.state"));
    Model m2 = mn;
    CpuAdamW dram2(m2.dram_specs(), cfg);
    dram2.load(root / "c.state");
    run_step(dram2, m2, 5);
    run_step(nvme, mn, 5);
    expect_same_weights(m2, mn, "NVMe state loaded into DRAM moments");
    // A corrupted file commits nothing: the NVMe optimizer's state is unchanged.
    std::string bytes = file_bytes(root / "c.state");
    bytes[bytes.size() - 100] ^= 1;
    std::ofstream(root / "bad.state", std::ios::binary) << bytes;
    nvme.save(root / "d.state");
    EXPECT_THROW(nvme.load(root / "bad.state"), Error);
    nvme.save(root / "e.state");
    EXPECT_TRUE(file_bytes(root / "d.state") == file_bytes(root / "e.state"));
  }
  fs::remove_all(root);
}

TEST(NvmeMoments, ReadFaultLeavesTheUnitUnchanged) {
  const fs::path root = temp_root("readfault");
  Model m(4, false, MasterFormat::F32, true);
  auto io = std::make_shared<OneFault>();
  AdamWConfig cfg;
  cfg.threads = 2;
  cfg.nvme_dir = root;
  cfg.nvme_io = io;
  cfg.nvme_slots = 2;
  {
    CpuAdamW opt(m.specs, cfg);
    run_step(opt, m, 1);
    const auto p1 = m.p;
    const auto hi1 = m.hi;
    std::vector<float> m1, v1;
    opt.read_state(2, 0, m1, v1);
    io->read_at = io->reads + 3;  // step 2 reads units 0, 1, 2, 3 in order: unit 2's read is short
    start_step(opt, m, 2);
    opt.wait(0);
    opt.wait(1);
    try {
      opt.wait(2);
      ADD_FAILURE() << "the read fault was not reported";
    } catch (const Error& e) {
      const std::string w = e.what();
      RecordProperty("read_fault", w);
      for (const char* part : {"unit 2", "moments-", "short read", "bytes", "not updated", "last checkpoint"})
        EXPECT_NE(w.find(part), std::string::npos) << part << " missing in: " << w;
    }
    opt.wait(3);
    EXPECT_EQ(m.p[2], p1[2]) << "unit 2's master changed although its moments could not be read";
    EXPECT_EQ(m.hi[2], hi1[2]);
    std::vector<float> m2, v2;
    opt.read_state(2, 0, m2, v2);
    EXPECT_EQ(m1, m2);
    EXPECT_EQ(v1, v2);
    for (int u : {0, 1, 3}) EXPECT_NE(m.p[size_t(u)], p1[size_t(u)]) << "unit " << u << " was not updated";
    run_step(opt, m, 3);  // the next step reads unit 2 again
  }
  fs::remove_all(root);
}

TEST(NvmeMoments, WriteFaultsAreReportedAndTheRunResumesFromACheckpoint) {
  for (int err : {EIO, ENOSPC}) {
    const fs::path root = temp_root("writefault");
    Model m(4, true, MasterFormat::F32, true), ref = m;
    auto io = std::make_shared<OneFault>();
    io->write_errno = err;
    AdamWConfig cfg;
    cfg.threads = 1;  // write-backs in unit order
    CpuAdamW dram(ref.dram_specs(), cfg);
    cfg.nvme_dir = root;
    cfg.nvme_io = io;
    cfg.nvme_slots = 2;
    {
      CpuAdamW opt(m.specs, cfg);
      run_step(opt, m, 1);
      run_step(dram, ref, 1);
      opt.save(root / "ckpt.state");
      const Model at_ckpt = m;
      io->write_at = io->writes + 2;  // unit 1's write-back in step 2
      start_step(opt, m, 2);
      opt.wait(0);
      try {
        opt.wait(1);
        ADD_FAILURE() << "the write fault was not reported";
      } catch (const Error& e) {
        const std::string w = e.what();
        RecordProperty(err == ENOSPC ? "enospc" : "eio", w);
        for (const char* part : {"unit 1", "writing back", "moments-", "bytes", "lost", "last checkpoint",
                                 err == ENOSPC ? "disk full" : "errno"})
          EXPECT_NE(w.find(part), std::string::npos) << part << " missing in: " << w;
      }
      opt.wait(2);
      opt.wait(3);
      EXPECT_NE(m.p[1], at_ckpt.p[1]) << "the master of the failed unit is documented as updated";
      try {
        opt.save(root / "after.state");
        ADD_FAILURE() << "saved a state whose moments were lost";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("lost"), std::string::npos) << e.what();
      }
      EXPECT_FALSE(fs::exists(root / "after.state"));
      std::vector<float> mv, vv;
      EXPECT_THROW(opt.read_state(1, 0, mv, vv), Error);
      // Resume from the checkpoint: state and masters back, the step again, equal to the clean run.
      opt.load(root / "ckpt.state");
      m = at_ckpt;
      run_step(opt, m, 2);
      run_step(dram, ref, 2);
      expect_same_weights(ref, m, "resumed after a failed write-back");
    }
    fs::remove_all(root);
  }
}

TEST(NvmeMoments, StagingStartsBeforeTheNormAndFilesAreRemoved) {
  const fs::path root = temp_root("files");
  Model m(5, true, MasterFormat::F32, false);  // units 1 and 3 on NVMe
  AdamWConfig cfg;
  cfg.threads = 2;
  cfg.nvme_dir = root;
  cfg.nvme_slots = 1;
  auto store_files = [&] {
    int64_t n = 0;
    for (auto& d : fs::directory_iterator(root))
      if (d.is_directory())
        for (auto& f : fs::directory_iterator(d.path())) n += f.is_regular_file();
    return n;
  };
  {
    CpuAdamW opt(m.specs, cfg);
    const MomentHomes h = opt.moment_homes();
    int64_t dram = 0, nvme = 0, biggest = 0;
    for (auto& u : m.specs) {
      int64_t b = 0;
      for (auto& t : u.tensors) b += state_bytes(t.numel, t.format);
      (u.moments_on_nvme ? nvme : dram) += b;
      if (u.moments_on_nvme) biggest = std::max(biggest, unit_image(u).bytes);
    }
    EXPECT_EQ(h.dram, dram);
    EXPECT_GE(h.nvme, nvme);  // images: 64-byte aligned arrays, 4 KiB-rounded
    EXPECT_LT(h.nvme, nvme + 2 * 4 * 64 * 3 + 2 * kIoAlign);
    EXPECT_EQ(h.staging, biggest);
    EXPECT_EQ(opt.state_bytes(), dram + nvme);
    EXPECT_EQ(store_files(), 0);  // moments start at zero: no file until the first write-back
    run_step(opt, m, 1);
    EXPECT_EQ(store_files(), 2);
    // The next step's first NVMe unit is staged at begin_step, long before its gradient or the norm.
    const int64_t before = opt.stats().nvme_read_bytes;
    opt.begin_step(1e-3f);
    for (int i = 0; i < 500 && opt.stats().nvme_read_bytes == before; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    EXPECT_EQ(opt.stats().nvme_read_bytes - before, unit_image(m.specs[1]).bytes);
    m.grads(2);
    for (int u = m.units() - 1; u >= 0; --u) {
      opt.submit(u, m.buf(u));
      opt.add_grad_sumsq(u, grad_sumsq(m.g[size_t(u)].data(), int64_t(m.g[size_t(u)].size())));
    }
    opt.wait_all();
    opt.save(root / "s.state");
    opt.load(root / "s.state");  // a second generation of the files, then the first removed
    EXPECT_EQ(store_files(), 2);
    fs::remove(root / "s.state");
  }
  EXPECT_TRUE(fs::is_empty(root)) << "files or directories left behind";
  fs::remove_all(root);
}

TEST(NvmeMoments, MissingDirectoryIsAClearError) {
  Model m(2, false, MasterFormat::F32, true);
  try {
    CpuAdamW opt(m.specs, AdamWConfig{});
    ADD_FAILURE() << "no error without an NVMe directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nvme_dir"), std::string::npos) << e.what();
  }
}
