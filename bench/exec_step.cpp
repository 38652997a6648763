// Executor step on the CPU backend with emulated PCIe: measured per-window exposed transfer time vs
// the planner's simulator, for the heuristic plans and the planner's own plan.
//
//   exec_step [--layers 8 --hidden 128 --ffn 352 --heads 4 --kv 2 --vocab 2048 --batch 2 --seq 64]
//             [--pcie-gbps 0.01] [--nvme-dir /tmp] [--steps 3] [--trace step.json] [--verbose]
//
// The CPU backend moves fp32 where the GPU moves bf16, so copies are emulated at 2x the profile's
// bandwidth: both then take the time the planner assumes for the bf16 bytes.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops.h"
#include "core/units.h"
#include "exec/executor.h"
#include "exec/optim_hook.h"
#include "optim/layout_spec.h"
#include "exec/plan_adapter.h"
#include "plan/planner.h"

using namespace lt;

namespace {

struct Measured {
  double step_s = 0, exposed_s = 0, fwd_s = 0, bwd_s = 0, head_s = 0, h2d_s = 0, opt_wait_s = 0;
  StepResult last;
};

Measured run(const ModelConfig& c, const ExecPlan& p, double bw, const std::string& nvme, int steps,
             const std::string& trace, bool verbose, bool adamw) {
  CpuBackendOptions bo;
  bo.h2d_bytes_per_s = bw;
  bo.d2h_bytes_per_s = bw;
  CpuBackend be(c, bo);
  HostState st(be);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> nd(0, 0.02f);
  for (int64_t u = 0; u < st.units(); ++u)
    for (int64_t i = 0; i < st.numel(u); ++i) st.master(u)[i] = nd(rng);
  st.refresh_all_streams();
  ExecOptions o;
  o.nvme_dir = nvme;
  Executor ex(c, be, p, st, o);
  std::unique_ptr<optim::CpuAdamW> opt;
  std::unique_ptr<AdamWHook> hook;
  if (adamw) {
    std::vector<optim::UnitSpec> specs;
    for (auto& u : be.layout().units) specs.push_back(optim::unit_spec_from_layout(u, optim::OptimizerKind::AdamW));
    opt = std::make_unique<optim::CpuAdamW>(specs, optim::AdamWConfig{});
    hook = std::make_unique<AdamWHook>(*opt, st);
    ex.set_update_hook(hook.get());
  }
  auto step = [&](const MicroBatch& mb) {
    if (opt) opt->begin_step(1e-4f);
    return ex.train_step({mb});
  };
  const int64_t T = p.batch * p.seq;
  std::vector<int32_t> ids(static_cast<size_t>(T)), tg(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) ids[size_t(t)] = tg[size_t(t)] = int32_t(rng() % uint64_t(c.vocab));
  MicroBatch mb{ids.data(), tg.data(), nullptr, nullptr};
  step(mb);  // warm-up
  Measured m;
  for (int s = 0; s < steps; ++s) {
    auto r = step(mb);
    m.step_s += r.step_s / steps;
    m.opt_wait_s += r.update_wait_s / steps;
    m.exposed_s += r.exposed_s / steps;
    for (auto& w : r.windows) {
      if (w.ref.kind == WindowKind::Forward) m.fwd_s += w.measured.compute / steps / double(c.layers);
      if (w.ref.kind == WindowKind::Backward) m.bwd_s += w.measured.compute / steps / double(c.layers);
      if (w.ref.kind == WindowKind::Head) m.head_s += w.measured.compute / steps;
      m.h2d_s += w.measured.h2d / steps;
    }
    m.last = r;
  }
  if (verbose) fmt::print("{}\n{}", ex.window_table(m.last), ex.memory_table());
  if (!trace.empty()) ex.write_trace(trace);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"executor step on the CPU backend: measured vs predicted exposed transfer"};
  int64_t layers = 8, hidden = 128, ffn = 352, heads = 4, kv = 2, vocab = 2048, batch = 2, seq = 64;
  double gbps = 0.01;
  int steps = 3;
  std::string nvme = "/tmp", trace;
  bool verbose = false, adamw = false;
  app.add_option("--layers", layers);
  app.add_option("--hidden", hidden);
  app.add_option("--ffn", ffn);
  app.add_option("--heads", heads);
  app.add_option("--kv", kv);
  app.add_option("--vocab", vocab);
  app.add_option("--batch", batch);
  app.add_option("--seq", seq);
  app.add_option("--pcie-gbps", gbps, "emulated PCIe GB/s each way (profile units, bf16 bytes)");
  app.add_option("--nvme-dir", nvme);
  app.add_option("--steps", steps);
  app.add_option("--trace", trace, "Chrome trace of the planner's plan's last step");
  app.add_flag("--verbose", verbose, "per-window tables");
  app.add_flag("--adamw", adamw, "run the CPU AdamW through the update hook (exposed optimizer wait reported)");
  CLI11_PARSE(app, argc, argv);

  ModelConfig c;
  c.name = "bench";
  c.arch = Arch::Qwen2;
  c.hidden = hidden;
  c.layers = layers;
  c.heads = heads;
  c.kv_heads = kv;
  c.head_dim = hidden / heads;
  c.ffn = ffn;
  c.vocab = vocab;
  c.attn_bias = true;
  const double bw = gbps * 1e9;

  // 1. Measure the layer times with everything on the "GPU" and free copies.
  Measured base = run(c, ExecPlan::keep_all(layers, batch, seq), 0, nvme, steps, "", false, false);
  fmt::print("model: L={} hidden={} ffn={} vocab={} batch={} seq={}  (CPU backend, fp32)\n", layers, hidden, ffn,
             vocab, batch, seq);
  fmt::print("measured: layer fwd {:.2f} ms, layer bwd (incl. internal recompute) {:.2f} ms, head {:.2f} ms\n",
             base.fwd_s * 1e3, base.bwd_s * 1e3, base.head_s * 1e3);

  // 2. A profile of this "machine" for the planner.
  ResourceProfile prof;
  prof.name = "cpu-emulated";
  prof.source = "exec_step bench: measured layer times, emulated PCIe";
  prof.hbm_bytes = 64 * GiB;
  prof.dram_bytes = 64 * GiB;
  prof.nvme_bytes = 64 * GiB;
  prof.nvme_dir = nvme;
  prof.h2d_bw = prof.d2h_bw = bw;
  prof.both_bw = 2 * bw;
  prof.nvme_read_bw = prof.nvme_write_bw = 1.0e9;
  prof.host_mem_bw = 10e9;
  auto gs = cpu::gemm_stats();
  prof.gemm_flops = prof.attn_flops = prof.peak_flops = gs.seconds > 0 ? gs.flops / gs.seconds : 1e10;
  prof.opt_fp32_params_per_s = prof.opt_8bit_params_per_s = 1e12;  // no optimizer in this bench
  LayerTiming lt;
  lt.hidden = hidden;
  lt.ffn = ffn;
  lt.heads = heads;
  lt.kv_heads = kv;
  lt.head_dim = c.head_dim;
  lt.batch = batch;
  lt.seq = seq;
  lt.fwd_s = base.fwd_s;
  lt.bwd_s = std::max(0.0, base.bwd_s - base.fwd_s);
  prof.layer_timings.push_back(lt);

  fmt::print("emulated PCIe {:.2f} GB/s each way (bf16 bytes; copies of fp32 at 2x)\n\n", gbps);
  fmt::print("{:<14} {:>10} {:>10} | {:>12} {:>12} | {:>10} {:>10} {:>10}\n", "plan", "step ms", "pred ms",
             "exposed ms", "pred exp ms", "h2d ms", "opt wait", "act bufs");
  for (std::string planner : {"all-gpu", "megatrain:4", "sqrt", "cpu-all", "milp"}) {
    PlanRequest rq;
    rq.model = c;
    rq.batch = batch;
    rq.seq = seq;
    rq.profile = prof;
    rq.planner = planner;
    rq.optimizer = "adamw";
    rq.compare = false;
    rq.milp.time_limit_s = 10;
    auto out = make_plan(rq);
    if (!out.feasible) {
      fmt::print("{:<14} infeasible: {}\n", planner, out.why);
      continue;
    }
    ExecPlan p = exec_plan_from(out.plan, c);
    Measured m = run(c, p, 2 * bw, nvme, steps, planner == "milp" ? trace : "", verbose, adamw);
    double pred_exp = 0;
    for (auto& w : out.plan.predicted.windows) pred_exp += w.exposed;
    fmt::print("{:<14} {:>10.2f} {:>10.2f} | {:>12.2f} {:>12.2f} | {:>10.2f} {:>10.2f} {:>10}\n", planner,
               m.step_s * 1e3, out.sim.step_no_opt_s * 1e3, m.exposed_s * 1e3, pred_exp * 1e3, m.h2d_s * 1e3,
               m.opt_wait_s * 1e3, count_act_buffers(p));
  }
  return 0;
}
