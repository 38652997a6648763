// Data-parallel scaling benchmark (docs/distributed.md): weak scaling, each rank runs `--micro-batches`
// micro-batches of `--batch` x `--seq` per step; efficiency(W) = (tokens/s per rank at W) / (tokens/s at 1).
//
// Two modes:
//   threads (default): ranks are threads of this process on the CPU backend, for each W in --world.
//     Ranks share the CPU cores, so this measures the sharding/collective overhead, not GPU scaling.
//   nccl: started by `lazytrain launch -n N --program -- bench_dist --backend cuda --plan plan.json ...`
//     (LT_WORLD_SIZE set): one rank per GPU, CUDA backend, NCCL (CUDA builds with NCCL only); run it for
//     N = 1 and N = 8 and compare the printed tokens/s per GPU.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/reference.h"
#include "core/timer.h"
#include "dist/data_parallel.h"
#include "dist/thread_comm.h"
#include "exec/plan_adapter.h"
#include "model/init.h"
#include "model/model_config.h"
#include "optim/layout_spec.h"
#include "plan/plan.h"
#ifdef LT_HAVE_NCCL
#include "backend/cuda/cuda_backend.h"
#include "dist/nccl/nccl_comm.h"
#endif

using namespace lt;

struct Args {
  std::string model = "qwen2.5-0.5b", optimizer = "adamw", backend = "cpu", plan_file, worlds = "1,2";
  int64_t layers = 0, hidden = 0, ffn = 0, vocab = 0, batch = 1, seq = 128, gpu_mem = 0;
  int micro = 2, steps = 3, warmup = 1, opt_threads = 1;
};

struct RankStats {
  double step_s = 0, comm_s = 0, loss = 0;
  int64_t tokens = 0, comm_bytes = 0;
};

ModelConfig model_of(const Args& a) {
  ModelConfig c = resolve_model(a.model);
  if (a.layers) c.layers = a.layers;
  if (a.hidden) {
    c.head_dim = c.head_dim * a.hidden / c.hidden;
    c.hidden = a.hidden;
  }
  if (a.ffn) c.ffn = a.ffn;
  if (a.vocab) c.vocab = a.vocab;
  return c;
}

// One rank: model state, sharded optimizer, executor; `steps` timed steps after `warmup`.
RankStats run_rank(dist::Communicator& comm, const Args& a, const ModelConfig& c, Backend& be, const ExecPlan& plan) {
  HostState st(be);
  ModelWeights w = random_model(c, 1, 1);
  for (int64_t u = 0; u < st.units(); ++u) {
    std::copy(w.units[size_t(u)].begin(), w.units[size_t(u)].end(), st.master(u));
    st.refresh_stream(u);
  }
  std::vector<optim::UnitSpec> full;
  for (auto& u : be.layout().units) full.push_back(optim::unit_spec_from_layout(u, optim::parse_optimizer_kind(a.optimizer)));
  const auto shards = dist::make_shard_layout(full, comm.size());
  optim::AdamWConfig oc;
  oc.threads = a.opt_threads;
  optim::CpuAdamW opt(dist::rank_unit_specs(full, shards, comm.rank()), oc);
  dist::ShardedUpdateHook hook(comm, st, shards, opt);
  Executor ex(c, be, plan, st);
  ex.set_update_hook(&hook);
  const int64_t T = plan.batch * plan.seq;
  std::mt19937_64 rng(uint64_t(17 + comm.rank()));
  std::vector<std::vector<int32_t>> ids(size_t(a.micro)), tg(size_t(a.micro));
  std::vector<MicroBatch> mbs;
  for (int m = 0; m < a.micro; ++m) {
    ids[size_t(m)].resize(size_t(T));
    for (auto& x : ids[size_t(m)]) x = int32_t(rng() % uint64_t(c.vocab));
    const std::vector<int32_t> labels = ids[size_t(m)];
    tg[size_t(m)].resize(size_t(T));
    cpu::SeqGeometry g{plan.batch, plan.seq, nullptr, nullptr};
    cpu::shift_labels(labels.data(), g, tg[size_t(m)].data());
    mbs.push_back({ids[size_t(m)].data(), tg[size_t(m)].data(), nullptr, nullptr});
  }
  RankStats s;
  for (int i = 0; i < a.warmup + a.steps; ++i) {
    if (i == a.warmup) {
      comm.barrier();
      s = {};
      hook.sync();
    }
    const double c0 = hook.comm_seconds();
    const int64_t b0 = hook.comm_bytes();
    const double t0 = now_seconds();
    auto r = dist::data_parallel_step(comm, ex, hook, opt, mbs, 1e-4f);
    s.step_s += now_seconds() - t0;
    s.comm_s += hook.comm_seconds() - c0;
    s.comm_bytes += hook.comm_bytes() - b0;
    s.tokens += a.micro * T;
    s.loss = r.loss;
  }
  hook.sync();
  return s;
}

// The step is as slow as the slowest rank: max over ranks of the summed step time.
double slowest(dist::Communicator& comm, double x) {
  std::vector<double> v(size_t(comm.size()), 0.0);
  v[size_t(comm.rank())] = x;
  comm.all_reduce(v.data(), int64_t(v.size()), dist::CommType::F64);
  return *std::max_element(v.begin(), v.end());
}

void report(int W, const RankStats& s, const Args& a, double base_per_rank) {
  const double per_rank = double(s.tokens) / s.step_s;
  std::printf("W=%d  step %.3f s  tokens/s %.0f (per rank %.0f)  efficiency %.1f%%  collectives %.3f s/step "
              "(%.1f MB/step/rank)  loss %.4f\n",
              W, s.step_s / a.steps, per_rank * W, per_rank, base_per_rank > 0 ? 100 * per_rank / base_per_rank : 100.0,
              s.comm_s / a.steps, double(s.comm_bytes) / a.steps / 1e6, s.loss);
  std::fflush(stdout);
}

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"bench_dist: data-parallel scaling (threads on the CPU backend, or NCCL under lazytrain launch)"};
  app.add_option("--model", a.model, "preset or model directory")->capture_default_str();
  app.add_option("--layers", a.layers, "override num_hidden_layers");
  app.add_option("--hidden", a.hidden, "override hidden size (head_dim scaled)");
  app.add_option("--ffn", a.ffn, "override intermediate size");
  app.add_option("--vocab", a.vocab, "override vocab size");
  app.add_option("--batch", a.batch, "samples per micro-batch")->capture_default_str();
  app.add_option("--seq", a.seq, "sequence length")->capture_default_str();
  app.add_option("--micro-batches", a.micro, "micro-batches per rank per step")->capture_default_str();
  app.add_option("--steps", a.steps, "timed steps")->capture_default_str();
  app.add_option("--warmup", a.warmup, "untimed steps")->capture_default_str();
  app.add_option("--optimizer", a.optimizer, "adamw | adamw8bit")->capture_default_str();
  app.add_option("--opt-threads", a.opt_threads, "optimizer threads per rank")->capture_default_str();
  app.add_option("--world", a.worlds, "threads mode: world sizes to run, e.g. 1,2,4")->capture_default_str();
  app.add_option("--backend", a.backend, "cpu (threads mode) | cuda (under lazytrain launch)")->capture_default_str();
  app.add_option("--plan", a.plan_file, "cuda: plan JSON from `lazytrain plan -o` (batch/seq taken from it)");
  app.add_option("--gpu-mem", a.gpu_mem, "cuda: GPU memory cap in bytes (0: free memory)");
  CLI11_PARSE(app, argc, argv);
  try {
    const ModelConfig c = model_of(a);
    const dist::DistEnv env = dist::dist_env_from_environment();
    if (env.launched) {
#ifdef LT_HAVE_NCCL
      LT_CHECK(a.backend == "cuda" && !a.plan_file.empty(), "bench_dist: under lazytrain launch use --backend cuda --plan FILE");
      std::ifstream in(a.plan_file);
      LT_CHECK(in.good(), "bench_dist: cannot read {}", a.plan_file);
      const Plan p = plan_from_json(nlohmann::json::parse(in), a.plan_file);
      const ExecPlan plan = exec_plan_from(p, c);
      auto comm = dist::NcclCommunicator::create(env);
      CudaBackendOptions bo;
      bo.device = env.local_rank;
      bo.gpu_mem_cap = a.gpu_mem;
      CudaBackend be(c, bo);
      a.batch = plan.batch;
      a.seq = plan.seq;
      RankStats s = run_rank(*comm, a, c, be, plan);
      s.step_s = slowest(*comm, s.step_s);
      if (env.rank == 0) report(env.world, s, a, 0);  // compare tokens/s per rank with the N=1 run
      return 0;
#else
      fail("bench_dist: launched with LT_WORLD_SIZE={} but built without NCCL (needs a CUDA build)", env.world);
#endif
    }
    LT_CHECK(a.backend == "cpu", "bench_dist: threads mode runs the CPU backend only (got --backend {})", a.backend);
    std::vector<int> worlds;
    std::stringstream ss(a.worlds);
    for (std::string t; std::getline(ss, t, ',');) worlds.push_back(std::stoi(t));
    std::printf("bench_dist threads mode: %s layers %ld hidden %ld vocab %ld, per rank %d x %ld x %ld tokens/step, %s\n",
                c.name.c_str(), long(c.layers), long(c.hidden), long(c.vocab), a.micro, long(a.batch), long(a.seq),
                a.optimizer.c_str());
    double base = 0;
    for (int W : worlds) {
      std::mutex mu;
      RankStats r0;
      dist::run_ranks(W, [&](dist::Communicator& comm) {
        CpuBackendOptions bo;
        bo.threads = 1;
        CpuBackend be(c, bo);
        RankStats s = run_rank(comm, a, c, be, ExecPlan::keep_all(c.layers, a.batch, a.seq));
        s.step_s = slowest(comm, s.step_s);
        std::lock_guard<std::mutex> g(mu);
        if (comm.rank() == 0) r0 = s;
      });
      if (base == 0) base = double(r0.tokens) / r0.step_s;
      report(W, r0, a, base);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_dist: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
