// Under `lazytrain launch -n N -- train`, per_device_train_batch_size is per rank and the global batch is
// per_device_train_batch_size x gradient_accumulation_steps x N (HF Trainer / DeepSpeed): the demo config
// on 2 ranks with gradient_accumulation_steps=1 trains like one process with gradient_accumulation_steps=2.
// With the same threads per process (threads=1) the runs are bit for bit the same (one micro-batch per
// rank: the ranks' gradients are summed in the order one process accumulates them, each normalised by
// the global batch's loss tokens); with the default threads (all cores for one process, a share for a
// rank) the step-12 loss agrees within 1e-4 relative.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "../common/repo_path.h"
#include "cli_process.h"
#include "run_results.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;
using lt::testing::finish_process;
using lt::testing::start_lazytrain;
using lt::testing::train_records;
using lt::testing::slurp;
using lt::testing::run_lazytrain;
using lt::testing::losses_by_step;
using lt::testing::checkpoint_masters;

namespace {

class LaunchGlobalBatch : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lt_global_batch_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  // The demo config for 12 steps, a checkpoint at the end, no evaluation.
  std::vector<std::string> demo(const std::string& out, const std::vector<std::string>& extra) const {
    const fs::path root = lt::testing::repo_root();
    std::vector<std::string> a = {(root / "configs" / "demo.yaml").string(),
                                  "tokenizer=" + (root / "configs" / "demo").string(),
                                  "output_dir=" + (dir_ / out).string(),
                                  "max_steps=12",
                                  "logging_steps=1",
                                  "save_steps=0",
                                  "do_eval_dataset=",
                                  "progress_bar=false",
                                  "backend=cpu"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  // `train` with gradient_accumulation_steps=2 and `launch -n 2 -- train` with 1; their step-12 losses.
  std::pair<double, double> run_pair(const std::string& tag, const std::vector<std::string>& extra) {
    std::vector<std::string> one = {"train"}, two = {"launch", "-n", "2", "--", "train"};
    for (const auto& a : demo(tag + "_one", extra)) one.push_back(a);
    for (const auto& a : demo(tag + "_two", extra)) two.push_back(a);
    one.push_back("gradient_accumulation_steps=2");
    two.push_back("gradient_accumulation_steps=1");
    EXPECT_EQ(run_lazytrain(one, dir_ / (tag + "_one.log")), 0) << slurp(dir_ / (tag + "_one.log"));
    EXPECT_EQ(run_lazytrain(two, dir_ / (tag + "_two.log")), 0) << slurp(dir_ / (tag + "_two.log"));
    const auto a = losses_by_step(dir_ / (tag + "_one")), b = losses_by_step(dir_ / (tag + "_two"));
    EXPECT_EQ(a.size(), 12u);
    EXPECT_EQ(b.size(), 12u);
    if (!a.count(12) || !b.count(12)) return {NAN, NAN};
    const auto recs = train_records(dir_ / (tag + "_two"));
    // 2 ranks x 1 micro-batch of 16 rows: each rank's tokens are half of the step's.
    EXPECT_EQ(recs.back()["ranks"].size(), 2u);
    EXPECT_EQ(2 * recs.back()["ranks"][0]["tokens"].get<int64_t>(), recs.back()["tokens"].get<int64_t>());
    EXPECT_EQ(recs.back()["tokens"].get<int64_t>(),
              train_records(dir_ / (tag + "_one")).back()["tokens"].get<int64_t>());
    std::printf("%s: step-12 loss, 1 process (accumulation 2) %.17g, 2 ranks (accumulation 1) %.17g, relative "
                "difference %.3g\n",
                tag.c_str(), a.at(12), b.at(12), std::fabs(a.at(12) - b.at(12)) / a.at(12));
    return {a.at(12), b.at(12)};
  }
  fs::path dir_;
};

TEST_F(LaunchGlobalBatch, TwoRanksOfOneMicroBatchEqualOneProcessAccumulatingTwo) {
  const auto [one, two] = run_pair("default", {});
  EXPECT_NEAR(two, one, 1e-4 * one);
}

TEST_F(LaunchGlobalBatch, TwoRanksOfOneMicroBatchAreBitIdenticalWithTheSameThreads) {
  const auto [one, two] = run_pair("threads1", {"threads=1"});
  EXPECT_EQ(one, two);
  const auto a = losses_by_step(dir_ / "threads1_one"), b = losses_by_step(dir_ / "threads1_two");
  for (const auto& [step, loss] : a) EXPECT_EQ(loss, b.count(step) ? b.at(step) : NAN) << "step " << step;
  const auto wa = checkpoint_masters(dir_ / "threads1_one" / "checkpoint-12"),
             wb = checkpoint_masters(dir_ / "threads1_two" / "checkpoint-12");
  ASSERT_EQ(wa.size(), wb.size());
  size_t differ = 0, n = 0;
  for (const auto& [name, va] : wa) {
    ASSERT_TRUE(wb.count(name)) << name;
    const auto& vb = wb.at(name);
    ASSERT_EQ(va.size(), vb.size()) << name;
    for (size_t i = 0; i < va.size(); ++i) differ += va[i] != vb[i];
    n += va.size();
  }
  EXPECT_EQ(differ, 0u) << "of " << n << " master weights after 12 steps";
}

}  // namespace
