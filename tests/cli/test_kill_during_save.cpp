// `kill -9` of `lazytrain train` at arbitrary moments, most of them inside a checkpoint save (one save
// per step) or, with the moments on the NVMe tier, inside a step's moment reads and writes: the newest
// checkpoint on disk is always complete, and resuming from it finishes with the same losses as a run that
// was never killed (exact resume), for each master-weight mode.
#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fcntl.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "../common/repo_path.h"
#include "cli_process.h"
#include "train/checkpoint_dir.h"

namespace fs = std::filesystem;

namespace {

using lt::testing::finish_process;
using lt::testing::start_lazytrain;

fs::path write_config(const fs::path& dir) {
  const fs::path cfg = dir / "kill.yaml";
  std::ofstream(cfg) << "model_name_or_path: tiny-qwen2\n"
                     << "tokenizer: " << (lt::testing::repo_root() / "configs" / "demo").string() << "\n"
                     << "template: chatml\ndataset: builtin:math\nmax_samples: 256\ncutoff_len: 96\n"
                     << "per_device_train_batch_size: 4\nlearning_rate: 2.0e-3\nwarmup_steps: 1\n"
                     << "max_steps: 30\nsave_steps: 1\nsave_total_limit: 2\nlogging_steps: 1\n"
                     << "progress_bar: false\nthreads: 1\nbackend: cpu\n";
  return cfg;
}

pid_t start(const std::vector<std::string>& args, const fs::path& log) { return start_lazytrain(args, log); }
int finish(pid_t pid) { return finish_process(pid); }

// The "train" records of metrics.jsonl as (step, loss), every one (a resumed run appends to the file and
// logs again the steps after its checkpoint; a line cut by the kill is skipped).
std::vector<std::pair<int64_t, double>> losses(const fs::path& out) {
  std::vector<std::pair<int64_t, double>> v;
  for (const auto& j : lt::testing::train_records(out)) v.emplace_back(j["step"].get<int64_t>(), j["loss"].get<double>());
  return v;
}

// `extra`: overrides for every run (the killed ones and the reference); `nvme` puts every layer's moments in
// files under the test directory, scratch that a kill leaves behind and the next run replaces.
void kill_and_resume(const std::string& mode, bool nvme = false) {
  const std::string name = mode + (nvme ? "_nvme" : "");
  const fs::path dir = fs::temp_directory_path() / ("lt_kill_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path cfg = write_config(dir);
  const std::string m = "master_weights=" + mode;
  std::vector<std::string> extra;
  if (nvme)
    extra = {"optimizer=adamw8bit", "optimizer_nvme=all", "nvme_dir=" + (dir / "nvme").string(), "gradients=host",
             "gradient_dtype=bf16"};
  auto with = [&](std::vector<std::string> args) {
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  // Reference: never killed.
  ASSERT_EQ(finish(start(with({"train", cfg.string(), m, "output_dir=" + (dir / "ref").string()}), dir / "ref.log")), 0);
  std::map<int64_t, double> ref;
  for (auto& [step, loss] : losses(dir / "ref")) ref[step] = loss;
  ASSERT_EQ(ref.size(), 30u);
  const fs::path out = dir / "killed";
  int kills = 0;
  for (int k = 0; k < 6; ++k) {
    std::vector<std::string> args = with({"train", cfg.string(), m, "output_dir=" + out.string()});
    if (k > 0) args.push_back("resume_from_checkpoint=auto");
    const pid_t pid = start(args, dir / "killed.log");
    std::this_thread::sleep_for(std::chrono::milliseconds(900 + 170 * k));
    kills += ::kill(pid, SIGKILL) == 0;
    finish(pid);
    auto last = lt::train::latest_checkpoint(out);
    if (!last) continue;  // killed before the first save completed
    EXPECT_TRUE(lt::train::is_complete_checkpoint(last->path)) << last->path;
  }
  EXPECT_GT(kills, 0);
  ASSERT_EQ(finish(start(with({"train", cfg.string(), m, "output_dir=" + out.string(), "resume_from_checkpoint=auto"}),
                         dir / "killed.log")),
            0);
  // Every step the killed runs logged again after a resume has the reference's loss, bit for bit.
  std::map<int64_t, int> seen;
  for (auto& [step, loss] : losses(out)) {
    ++seen[step];
    ASSERT_TRUE(ref.count(step)) << step;
    EXPECT_EQ(loss, ref.at(step)) << name << " step " << step;
  }
  EXPECT_EQ(seen.size(), 30u);
  fs::remove_all(dir);
}

}  // namespace

TEST(KillDuringSave, Fp32MasterLosesNothing) { kill_and_resume("fp32"); }
TEST(KillDuringSave, Bf16SrMasterLosesNothing) { kill_and_resume("bf16-sr"); }
// The 8-bit moments of every layer on the NVMe tier (read ahead of and written behind each step's CPU update) with
// bf16 host gradients: a kill inside those reads and writes loses nothing either (the files are scratch; the
// checkpoint holds the moments).
TEST(KillDuringSave, NvmeMomentsLoseNothing) { kill_and_resume("bf16-sr", true); }
