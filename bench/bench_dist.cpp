// Data-parallel scaling benchmark (docs/distributed.md): weak scaling, each rank runs `--micro-batches`
// micro-batches of `--batch` x `--seq` per step; efficiency(W) = (tokens/s per rank at W) / (tokens/s at 1).
//
// Two modes:
//   threads (default): ranks are threads of this process on the CPU backend, for each W in --world.
//     Ranks share the CPU cores, so this measures the sharding/collective overhead, not GPU scaling.
//     Run it with OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1: threaded BLAS/OpenMP pools called from several
//     rank threads at once contend badly (measured 20x slower steps at W=2).
//   nccl: started by `lazytrain launch -n N --program -- bench_dist --backend cuda --plan plan.json ...`
//     (LT_WORLD_SIZE set): one rank per GPU, CUDA backend, NCCL (CUDA builds with NCCL only); run it for
//     N = 1 and N = 8 and compare the printed tokens/s per GPU.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/reference.h"
#include "core/timer.h"
#include "dist/data_parallel.h"
#include "exec/optim_hook.h"
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
  int micro = 2, steps = 3, warmup = 1, opt_threads = 0;
  int init_threads = 0;  // 0: hardware concurrency / ranks on the host
  bool verify = false;
};

struct RankStats {
  double step_s = 0, comm_s = 0, loss = 0;
  int64_t tokens = 0, comm_bytes = 0;
};

ModelConfig model_of(const Args& a) {
  ModelConfig c = resolve_model(a.model);
  if (a.layers) c.layers = a.layers;
  if (a.hidden) {  // keep head_dim; heads follow the width
    const int64_t heads = std::max<int64_t>(1, a.hidden / c.head_dim);
    int64_t kv = std::max<int64_t>(1, heads * c.kv_heads / c.heads);
    if (heads % kv) kv = 1;
    c.heads = heads;
    c.kv_heads = kv;
    c.hidden = a.hidden;
  }
  if (a.ffn) c.ffn = a.ffn;
  if (a.vocab) c.vocab = a.vocab;
  return c;
}

// Deterministic data: micro-batch m of step i's global batch (same on every rank and world size).
struct Data {
  std::vector<std::vector<int32_t>> ids, tg;
  std::vector<MicroBatch> mbs;
  Data(const ModelConfig& c, const ExecPlan& plan, int step, int64_t first, int64_t count) {
    const int64_t T = plan.batch * plan.seq;
    for (int64_t m = first; m < first + count; ++m) {
      std::mt19937_64 rng(uint64_t(1000003 * step + m));
      ids.emplace_back(size_t(T));
      for (auto& x : ids.back()) x = int32_t(rng() % uint64_t(c.vocab));
      tg.emplace_back(size_t(T));
      cpu::SeqGeometry g{plan.batch, plan.seq, nullptr, nullptr};
      cpu::shift_labels(ids.back().data(), g, tg.back().data());
    }
    for (size_t i = 0; i < ids.size(); ++i) mbs.push_back({ids[i].data(), tg[i].data(), nullptr, nullptr});
  }
};

// Seeded init straight into the masters (no second copy of the model: 7B ranks share one host).
void init_state(HostState& st, const ModelConfig& c, const ModelLayout& lay, int threads) {
  for (int64_t u = 0; u < st.units(); ++u) {
    init_unit(c, lay.units[size_t(u)], st.master(u), 1, threads);
    st.refresh_stream(u);
  }
}

std::vector<optim::UnitSpec> full_specs(const Backend& be, const Args& a) {
  std::vector<optim::UnitSpec> full;
  for (auto& u : be.layout().units) full.push_back(optim::unit_spec_from_layout(u, optim::parse_optimizer_kind(a.optimizer)));
  return full;
}

constexpr float kLr = 1e-4f;

// One rank: model state, sharded optimizer, executor; `steps` timed steps after `warmup`. Rank r runs its
// share (a.micro micro-batches) of a global batch of world * a.micro micro-batches.
RankStats run_rank(dist::Communicator& comm, const Args& a, const ModelConfig& c, Backend& be, const ExecPlan& plan,
                   std::vector<double>* losses = nullptr, std::vector<std::vector<float>>* masters = nullptr) {
  HostState st(be, dist::dp_host_state());
  init_state(st, c, be.layout(), a.init_threads);
  const auto full = full_specs(be, a);
  const auto shards = dist::make_shard_layout(full, comm.size());
  optim::AdamWConfig oc;
  oc.threads = a.opt_threads;
  optim::CpuAdamW opt(dist::rank_unit_specs(full, shards, comm.rank()), oc);
  dist::ShardedUpdateHook hook(comm, st, shards, opt);
  Executor ex(c, be, plan, st);
  ex.set_update_hook(&hook);
  const int64_t T = plan.batch * plan.seq;
  RankStats s;
  for (int i = 0; i < a.warmup + a.steps; ++i) {
    if (i == a.warmup) {
      hook.sync();
      comm.barrier();
      s = {};
    }
    Data d(c, plan, i, int64_t(comm.rank()) * a.micro, a.micro);
    const double c0 = hook.comm_seconds();
    const int64_t b0 = hook.comm_bytes();
    const double t0 = now_seconds();
    auto r = dist::data_parallel_step(comm, ex, hook, opt, d.mbs, kLr);
    s.step_s += now_seconds() - t0;
    s.comm_s += hook.comm_seconds() - c0;
    s.comm_bytes += hook.comm_bytes() - b0;
    s.tokens += a.micro * T;
    s.loss = r.loss;
    if (losses) losses->push_back(r.loss);
  }
  hook.sync();
  if (masters)
    for (int64_t u = 0; u < st.units(); ++u) masters->emplace_back(st.master(u), st.master(u) + st.numel(u));
  return s;
}

// --verify: the single-process run with the same global batches (world * micro micro-batches per step)
// on `be`; compares the losses (tolerance loss_tol, relative) and reports the weight differences.
bool verify(const Args& a, const ModelConfig& c, Backend& be, const ExecPlan& plan, int world,
            const std::vector<double>& dp_losses, const std::vector<std::vector<float>>& dp_masters, double loss_tol) {
  HostState st(be, dist::dp_host_state());
  init_state(st, c, be.layout(), a.init_threads);
  optim::AdamWConfig oc;
  oc.threads = a.opt_threads;
  optim::CpuAdamW opt(full_specs(be, a), oc);
  AdamWHook hook(opt, st);
  Executor ex(c, be, plan, st);
  ex.set_update_hook(&hook);
  bool ok = true;
  for (int i = 0; i < a.warmup + a.steps; ++i) {
    Data d(c, plan, i, 0, int64_t(world) * a.micro);
    opt.begin_step(kLr);
    const double l = ex.train_step(d.mbs).loss;
    const double rel = std::fabs(l - dp_losses[size_t(i)]) / std::max(1e-12, std::fabs(l));
    std::printf("verify step %d: loss single %.6f  data-parallel %.6f  rel diff %.2e%s\n", i, l, dp_losses[size_t(i)],
                rel, rel > loss_tol ? "  > tolerance" : "");
    ok = ok && rel <= loss_tol;
  }
  opt.wait_all();
  double mx = 0;
  int64_t over = 0, n = 0;
  for (int64_t u = 0; u < st.units(); ++u)
    for (int64_t k = 0; k < st.numel(u); ++k) {
      const double d = std::fabs(double(st.master(u)[k]) - double(dp_masters[size_t(u)][size_t(k)]));
      mx = std::max(mx, d);
      over += d > 0.1 * kLr;
      ++n;
    }
  std::printf("verify weights: max |w_single - w_dp| = %.3g (%.3g lr), %.4f%% of elements differ by > 0.1 lr\n", mx,
              mx / kLr, 100.0 * double(over) / double(n));
  std::printf("verify: %s (loss tolerance %.1e relative)\n", ok ? "PASS" : "FAIL", loss_tol);
  return ok;
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
  app.add_option("--hidden", a.hidden, "override hidden size (head_dim kept, heads = hidden / head_dim)");
  app.add_option("--ffn", a.ffn, "override intermediate size");
  app.add_option("--vocab", a.vocab, "override vocab size");
  app.add_option("--batch", a.batch, "samples per micro-batch")->capture_default_str();
  app.add_option("--seq", a.seq, "sequence length")->capture_default_str();
  app.add_option("--micro-batches", a.micro, "micro-batches per rank per step")->capture_default_str();
  app.add_option("--steps", a.steps, "timed steps")->capture_default_str();
  app.add_option("--warmup", a.warmup, "untimed steps")->capture_default_str();
  app.add_option("--optimizer", a.optimizer, "adamw | adamw8bit")->capture_default_str();
  app.add_option("--opt-threads", a.opt_threads,
                 "optimizer threads per rank (0: under lazytrain launch the host's cores / ranks, else 1)")
      ->capture_default_str();
  app.add_option("--world", a.worlds, "threads mode: world sizes to run, e.g. 1,2,4")->capture_default_str();
  app.add_option("--backend", a.backend, "cpu (threads mode) | cuda (under lazytrain launch)")->capture_default_str();
  app.add_option("--plan", a.plan_file, "cuda: plan JSON from `lazytrain plan -o` (batch/seq taken from it)");
  app.add_flag("--verify", a.verify, "also run the single-process reference on the same global batches and compare");
  app.add_option("--gpu-mem", a.gpu_mem, "cuda: GPU memory cap in bytes (0: free memory)");
  CLI11_PARSE(app, argc, argv);
  try {
    const ModelConfig c = model_of(a);
    const dist::DistEnv env = dist::dist_env_from_environment();
    a.init_threads = std::max(1, int(std::thread::hardware_concurrency()) / std::max(1, env.world));
    // A launched rank updates its optimizer shard with its share of the host's cores, as the trainer
    // does; one thread made the 7B's data-parallel steps optimizer-bound (docs/distributed.md).
    if (a.opt_threads <= 0) a.opt_threads = env.launched ? a.init_threads : 1;
    if (env.launched) {
#ifdef LT_HAVE_NCCL
      LT_CHECK(a.backend == "cuda" && !a.plan_file.empty(), "bench_dist: under lazytrain launch use --backend cuda --plan FILE");
      const Plan p = load_plan(a.plan_file);
      const ExecPlan plan = exec_plan_from(p, c);
      auto comm = dist::NcclCommunicator::create(env);
      CudaBackendOptions bo;
      bo.device = env.local_rank;
      bo.gpu_mem_cap = a.gpu_mem;
      CudaBackend be(c, bo);
      a.batch = plan.batch;
      a.seq = plan.seq;
      std::vector<double> losses;
      std::vector<std::vector<float>> masters;
      RankStats s = run_rank(*comm, a, c, be, plan, &losses, a.verify ? &masters : nullptr);
      s.step_s = slowest(*comm, s.step_s);
      if (env.rank == 0) report(env.world, s, a, 0);  // compare tokens/s per rank with the N=1 run
      int64_t ok = 1;
      if (a.verify && env.rank == 0) ok = verify(a, c, be, plan, env.world, losses, masters, 2e-2) ? 1 : 0;
      comm->broadcast(&ok, 1, dist::CommType::I64, 0);
      return ok ? 0 : 3;
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
    bool ok = true;
    const ExecPlan plan = ExecPlan::keep_all(c.layers, a.batch, a.seq);
    a.init_threads = 1;
    CpuBackendOptions bo;
    bo.threads = 1;
    for (int W : worlds) {
      RankStats r0;
      std::vector<double> losses;
      std::vector<std::vector<float>> masters;
      dist::run_ranks(W, [&](dist::Communicator& comm) {
        CpuBackend be(c, bo);
        const bool zero = comm.rank() == 0;
        RankStats s = run_rank(comm, a, c, be, plan, zero ? &losses : nullptr, zero && a.verify ? &masters : nullptr);
        s.step_s = slowest(comm, s.step_s);
        if (zero) r0 = s;
      });
      if (base == 0) base = double(r0.tokens) / r0.step_s;
      report(W, r0, a, base);
      if (a.verify) {
        CpuBackend be(c, bo);
        ok = verify(a, c, be, plan, W, losses, masters, 1e-5) && ok;
      }
    }
    if (!ok) return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_dist: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
