// The NVMe-moment layers' master remainders in their NVMe images (StatePlacement::nvme_remainders,
// OptimizerSetup::nvme_remainders, optim::UnitSpec::remainders_on_nvme), trained through the executor and the
// optimizer hook on the CPU backend with split fp32 masters (split_on_fp32_stream): the same losses, norms and fp32
// masters as the all-DRAM run bit for bit, no DRAM remainders for those units, and a stop + resume (masters through
// read_master/write_master, the moments through the state file: the trainer's checkpoint path) continues
// bit-identically.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <unistd.h>
#include <vector>

#include "hook_run.h"

namespace lt {
namespace {

namespace fs = std::filesystem;

struct Saved {
  std::vector<std::vector<float>> masters;
  fs::path optimizer;  // empty: start from the random weights
};

struct TrainRun : test::HookRun {
  std::vector<int64_t> nvme_units;  // units whose remainders were on NVMe
};
using test::bit_equal;

OptimizerSetup setup(const fs::path& nvme_dir, bool remainders) {
  OptimizerSetup os;
  os.kind = optim::OptimizerKind::AdamW8bit;
  os.max_grad_norm = 0.5f;
  os.weight_decay = 0.01f;
  os.threads = 2;
  if (!nvme_dir.empty()) {
    os.nvme_dir = nvme_dir.string();
    os.nvme_units = {2, 3};  // the last two of 3 layers (units 1..3)
    os.nvme_remainders = remainders;
  }
  return os;
}

// Steps [first, last] (1-based; batch seeds 100 + step - 1); from `from` when it has masters; saves the masters and
// the optimizer state to `to` at the end when given.
// never_in_dram: the NVMe units' remainders get no DRAM array (HostStateOptions::nvme_remainder_units) and the
// weights are written after the hook exists, as the trainer does; else written before it, the arrays moved at attach.
TrainRun train(const ModelConfig& c, const OptimizerSetup& os, int first, int last, const Saved* from = nullptr,
          Saved* to = nullptr, bool never_in_dram = false) {
  CpuBackend be(c, test::cpu_opts());
  HostStateOptions ho;
  ho.split_on_fp32_stream = true;  // split fp32 masters on the CPU backend, as on a bf16-streaming one
  if (never_in_dram) ho.nvme_remainder_units = os.nvme_units;
  HostState st(be, ho);
  if (!never_in_dram) test::random_weights(be.layout(), st, 4);
  AdamWHook hook(be.layout(), st, os);
  if (never_in_dram) test::random_weights(be.layout(), st, 4);
  if (from) {  // resume: the masters after the hook exists (trainer_setup.cpp resume_from), then the moments
    for (int64_t u = 0; u < st.units(); ++u) st.write_master(u, from->masters[size_t(u)].data());
    hook.optimizer().load(from->optimizer);
  }
  TrainRun r;
  static_cast<test::HookRun&>(r) = test::train_with_hook(c, be, st, hook, first, last);
  for (int64_t u = 0; u < st.units(); ++u) {
    if (st.remainders_on_nvme(u)) r.nvme_units.push_back(u);
    EXPECT_EQ(st.update_buffers(u).lo == nullptr, st.remainders_on_nvme(u)) << "unit " << u;
  }
  if (to) {
    to->masters = r.masters;
    hook.optimizer().save(to->optimizer);
  }
  return r;
}

struct TmpDir {
  fs::path p;
  explicit TmpDir(const std::string& tag) : p(fs::temp_directory_path() / ("lt-nvme-rem-" + tag + "-" + std::to_string(::getpid()))) {
    fs::remove_all(p);
    fs::create_directories(p);
  }
  ~TmpDir() { fs::remove_all(p); }
};

TEST(NvmeRemainders, TrainBitIdenticallyToDramAndResume) {
  const ModelConfig c = test::tiny_config(Arch::Qwen2, 3, false);
  TmpDir nvme("files"), ckpt("ckpt");
  const TrainRun dram = train(c, setup({}, false), 1, 4);
  const TrainRun moments = train(c, setup(nvme.p, false), 1, 4);  // moments only on NVMe: remainders in DRAM
  const TrainRun both = train(c, setup(nvme.p, true), 1, 4);
  ASSERT_EQ(dram.losses.size(), 4u);
  EXPECT_EQ(both.losses, dram.losses);
  EXPECT_EQ(both.norms, dram.norms);
  EXPECT_TRUE(bit_equal(both.masters, dram.masters));
  EXPECT_TRUE(bit_equal(moments.masters, dram.masters));
  EXPECT_TRUE(moments.nvme_units.empty());
  EXPECT_EQ(both.nvme_units, (std::vector<int64_t>{2, 3}));
  // 2 B/param less DRAM for those layers' masters.
  const int64_t layer = int64_t(both.masters[2].size()) + int64_t(both.masters[3].size());
  EXPECT_EQ(both.master_bytes, dram.master_bytes - 2 * layer);
  // Stop after 2 steps, resume in a fresh process state: bit-identical to the straight run.
  Saved saved;
  saved.optimizer = ckpt.p / "optimizer.bin";
  const TrainRun a = train(c, setup(nvme.p, true), 1, 2, nullptr, &saved);
  const TrainRun b = train(c, setup(nvme.p, true), 3, 4, &saved);
  EXPECT_EQ(a.losses, std::vector<double>(dram.losses.begin(), dram.losses.begin() + 2));
  EXPECT_EQ(b.losses, std::vector<double>(dram.losses.begin() + 2, dram.losses.end()));
  EXPECT_TRUE(bit_equal(b.masters, dram.masters));
  // The DRAM run's checkpoint resumes onto NVMe remainders too, and back.
  Saved from_dram;
  from_dram.optimizer = ckpt.p / "dram.bin";
  train(c, setup({}, false), 1, 2, nullptr, &from_dram);
  const TrainRun d = train(c, setup(nvme.p, true), 3, 4, &from_dram);
  EXPECT_EQ(d.losses, b.losses);
  EXPECT_TRUE(bit_equal(d.masters, dram.masters));
  const TrainRun e = train(c, setup({}, false), 3, 4, &saved);
  EXPECT_EQ(e.losses, b.losses);
  EXPECT_TRUE(bit_equal(e.masters, dram.masters));
  EXPECT_TRUE(fs::is_empty(nvme.p)) << "NVMe files left behind";
}

// The trainer's order: the NVMe units' remainders never in DRAM (no array from the start, the weights written once the
// optimizer exists): the same run bit for bit, and a master written before the optimizer is a clear error.
TEST(NvmeRemainders, NeverInDramWhenTheOptimizerComesFirst) {
  const ModelConfig c = test::tiny_config(Arch::Qwen2, 3, false);
  TmpDir nvme("never");
  const TrainRun dram = train(c, setup({}, false), 1, 3);
  const TrainRun never = train(c, setup(nvme.p, true), 1, 3, nullptr, nullptr, true);
  EXPECT_EQ(never.losses, dram.losses);
  EXPECT_TRUE(bit_equal(never.masters, dram.masters));
  EXPECT_EQ(never.nvme_units, (std::vector<int64_t>{2, 3}));
  CpuBackend be(c, test::cpu_opts());
  HostStateOptions ho;
  ho.split_on_fp32_stream = true;
  ho.nvme_remainder_units = {2, 3};
  HostState st(be, ho);
  std::vector<float> w(size_t(st.numel(2)), 0.25f);
  try {
    st.write_master(2, w.data());
    ADD_FAILURE() << "a master written with no home for its remainders";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not attached yet"), std::string::npos) << e.what();
  }
  st.write_master(1, w.data());  // a unit with its remainders in DRAM
}

// Without split masters (the CPU backend's aliased fp32 master) the setup's remainders option changes nothing.
TEST(NvmeRemainders, IgnoredWithoutSplitMasters) {
  const ModelConfig c = test::tiny_config(Arch::Qwen2, 3, false);
  TmpDir nvme("plain");
  CpuBackend be(c, test::cpu_opts());
  HostState st(be);
  AdamWHook hook(be.layout(), st, setup(nvme.p, true));
  for (int64_t u = 0; u < st.units(); ++u) {
    EXPECT_FALSE(st.remainders_on_nvme(u));
    EXPECT_FALSE(hook.optimizer().units()[size_t(u)].remainders_on_nvme);
  }
  EXPECT_TRUE(hook.optimizer().units()[2].moments_on_nvme);
}

}  // namespace
}  // namespace lt
