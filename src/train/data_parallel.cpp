#include "train/data_parallel.h"

#include <fmt/format.h>

#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "dist/shm_comm.h"
#include "dist/state_shards.h"
#include "optim/layout_spec.h"
#include "train/checkpoint_dir.h"
#include "train/trainer_setup.h"

namespace lt::train {

void check_data_parallel_config(const PlacementSection& cfg, const TrainingPlan& tp, int world) {
  LT_CHECK(tp.placement.master == MasterMode::Fp32,
           "data parallel ({} ranks): master_weights '{}' (the plan chose bf16-sr) is not supported over ranks: the "
           "ranks all-gather fp32 masters; set master_weights=fp32",
           world, name_of(cfg.master_weights));
  LT_CHECK(tp.placement.grads == GradHome::Host,
           "data parallel ({} ranks): gradients '{}' (the plan holds them on the device) is not supported over "
           "ranks: the gradient is reduce-scattered on the host; set gradients=host",
           world, name_of(cfg.gradients));
  LT_CHECK(tp.placement.nvme_layers == 0 && cfg.optimizer_nvme != OptimizerNvme::All,
           "data parallel ({} ranks): optimizer_nvme '{}' (optimizer moments on NVMe) is not supported over ranks "
           "yet; set optimizer_nvme=none",
           world, name_of(cfg.optimizer_nvme));
}

TrainConfig with_rank_threads(const TrainConfig& cfg) {
  TrainConfig c = cfg;
  const int local = local_world_size().value_or(1);
  int64_t& threads = c.placement.threads;
  if (threads == 0 && local > 1) {
    const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::max(1, cores / local);
    log_info("data parallel: {} ranks on this host, {} threads each (threads: 0)", local, threads);
  }
  return c;
}

DataParallel::DataParallel(const dist::DistEnv& env, const TrainConfig& cfg, const CommunicatorFactory& factory)
    : rank_(env.rank), world_(env.world), scratch_(env.rdzv_dir) {
  LT_CHECK(env.world > 1, "internal: DataParallel for a single rank");
  if (factory) {
    comm_ = factory(env, cfg);
  } else {
    dist::ShmCommOptions o;
    o.timeout_s = dist::comm_timeout_from_environment();
    comm_ = dist::ShmCommunicator::create(env, o);
  }
  LT_CHECK(comm_ && comm_->rank() == env.rank && comm_->size() == env.world,
           "data parallel: the communicator is not rank {} of {}", env.rank, env.world);
}

std::optional<fs::path> DataParallel::prepare_output_dir(const OutputSection& cfg, OutputLock& lock) {
  std::optional<fs::path> resume;
  on_leader([&] { resume = train::prepare_output_dir(cfg, lock); }, "preparing the output directory");
  // Rank 0 reported the checkpoints it skipped.
  if (!leader()) resume = resolve_resume(cfg.resume_from_checkpoint, cfg.output_dir, /*report_skipped=*/false);
  // Every rank must start from the same checkpoint.
  int64_t step = resume ? checkpoint_step(*resume) : -1;
  const int64_t mine = step;
  comm_->broadcast(&step, 1, dist::CommType::I64, 0);
  LT_CHECK(step == mine, "data parallel: rank {} would resume from {}, rank 0 from step {}", rank_,
           resume ? resume->string() : std::string("nothing"), step);
  return resume;
}

void DataParallel::check_same_plan(const TrainingPlan& tp) {
  std::string key = fmt::format("master {} grads {} nvme {} 8-bit:", int(tp.placement.master), int(tp.placement.grads),
                                tp.placement.nvme_layers);
  for (const auto& t : tp.tensors_8bit) key += " " + t;
  int64_t h = int64_t(std::hash<std::string>{}(key) & 0x7fffffffffffffffull);
  const int64_t mine = h;
  comm_->broadcast(&h, 1, dist::CommType::I64, 0);
  const int64_t differ = comm_->sum(int64_t(h != mine));
  LT_CHECK(differ == 0,
           "data parallel: {} rank(s) planned other optimizer state formats or placement than rank 0 (each rank "
           "plans on its own measurements); this rank's: {}. Fix them in the config (optimizer: adamw or adamw8bit "
           "instead of hybrid, master_weights, gradients, optimizer_nvme)",
           differ, key);
}

TrainConfig DataParallel::planning_config(const TrainConfig& cfg) const {
  TrainConfig c = cfg;
  if (!leader()) c.output.output_dir.clear();
  return c;
}

void DataParallel::attach(const ModelLayout& layout, HostState& st, const OptimizerSetup& s) {
  full_specs_.clear();
  for (const auto& u : layout.units) full_specs_.push_back(optim::unit_spec_from_layout(u, s.kind, &s.tensors_8bit));
  shards_ = dist::make_shard_layout(full_specs_, world_);
  opt_ = std::make_unique<optim::CpuAdamW>(dist::rank_unit_specs(full_specs_, shards_, rank_),
                                           adamw_config(s, st.optimizer_format()));
  hook_ = std::make_unique<dist::ShardedUpdateHook>(*comm_, st, shards_, *opt_);
}

StepResult DataParallel::step(Executor& ex, const std::vector<MicroBatch>& global_mbs, float lr, StepResult* local) {
  const dist::DistStepResult d =
      dist::data_parallel_step(*comm_, ex, *hook_, *opt_, dist::rank_share(global_mbs, rank_, world_), lr);
  if (local) *local = d.local;
  StepResult r = d.local;
  r.loss = d.loss;
  r.n_tokens = d.n_tokens;
  r.rows = d.rows;
  return r;
}

bool DataParallel::any(bool flag) { return comm_->sum(int64_t(flag)) > 0; }

std::vector<RankFigures> DataParallel::gather(const RankFigures& mine) {
  constexpr int kFields = 5;
  std::vector<double> all(static_cast<size_t>(world_ * kFields), 0.0);
  double* f = all.data() + rank_ * kFields;
  f[0] = mine.step_time;
  f[1] = double(mine.tokens);
  f[2] = double(mine.loss_tokens);
  f[3] = double(mine.host_rss_bytes);
  f[4] = mine.comm_s;
  comm_->all_gather(all.data(), dist::even_bounds(int64_t(all.size()), world_), dist::CommType::F64);
  std::vector<RankFigures> out(static_cast<size_t>(world_));
  for (int r = 0; r < world_; ++r) {
    const double* g = all.data() + r * kFields;
    out[size_t(r)] = RankFigures{g[0], int64_t(g[1]), int64_t(g[2]), int64_t(g[3]), g[4]};
  }
  return out;
}

void DataParallel::on_leader(const std::function<void()>& fn, const char* what) {
  // The others wait for rank 0 here: a checkpoint of a large model takes longer than a collective.
  // (Rank 0 itself keeps the usual bound on waiting for them.)
  dist::ScopedCommTimeout longer(*comm_, leader() ? 0.0 : kLeaderPhaseTimeoutS);
  int64_t ok = 1;
  std::string err;
  if (leader()) {
    try {
      fn();
    } catch (const std::exception& e) {
      ok = 0;
      err = e.what();
    }
  }
  try {
    comm_->broadcast(&ok, 1, dist::CommType::I64, 0);
  } catch (const std::exception&) {
    // The others may leave the broadcast with rank 0's failure before rank 0 does: its own error is the one to tell.
    if (leader() && !ok) throw Error(err);
    throw;
  }
  if (ok) return;
  if (leader()) throw Error(err);
  fail("data parallel: rank 0 failed {} (its error is in its output)", what);
}

void DataParallel::save(const std::function<void(const std::function<void(const fs::path&)>&)>& write) {
  wait_all();
  const auto shard_file = [&](int r) { return scratch_ / fmt::format("optimizer.rank{}-of-{}.bin", r, world_); };
  opt_->save(shard_file(rank_));
  comm_->barrier();
  on_leader(
      [&] {
        std::vector<fs::path> files;
        for (int r = 0; r < world_; ++r) files.push_back(shard_file(r));
        write([&](const fs::path& out) { dist::merge_state_shards(files, full_specs_, shards_, out); });
      },
      "writing the checkpoint");
  std::error_code ec;
  fs::remove(shard_file(rank_), ec);
}

void DataParallel::load_optimizer(const fs::path& optimizer_bin) {
  const fs::path mine = scratch_ / fmt::format("optimizer.load.rank{}-of-{}.bin", rank_, world_);
  dist::split_state_file(optimizer_bin, full_specs_, shards_, rank_, mine);
  opt_->load(mine);
  std::error_code ec;
  fs::remove(mine, ec);
}

}  // namespace lt::train
