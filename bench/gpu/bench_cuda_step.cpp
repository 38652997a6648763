// End-to-end training step on the GPU: the layer-streaming executor with the CUDA backend under a
// --gpu-mem cap, for the planner's heuristic (megatrain:4) and MILP plans. Prints TFLOPS (paper's
// formula 6*N*tokens/step), tokens/s, peak GPU memory and measured vs predicted exposed transfer per
// window. No optimizer runs (the CPU optimizer lane is benchmarked in bench_optim).
//
//   bench_cuda_step [--preset qwen2.5-3b --batch 32 --seq 1024 --gpu-mem-gib 80 --steps 3]
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <sstream>

#include "backend/cuda/cuda_backend.h"
#include "plan/cuda/gpu_profiler.h"
#include "core/error.h"
#include "core/units.h"
#include "exec/executor.h"
#include "exec/plan_adapter.h"
#include "model/accounting.h"
#include "plan/planner.h"
#include "plan/profile.h"

using namespace lt;

int main(int argc, char** argv) {
  CLI::App app{"end-to-end step on the CUDA backend"};
  std::string preset = "qwen2.5-3b", profile = "h200", planners = "megatrain:4,milp";
  int64_t batch = 32, seq = 1024;
  double cap_gib = 80;
  int steps = 3;
  double milp_s = 60;
  bool verbose = false;
  app.add_option("--preset", preset);
  app.add_option("--profile", profile, "base profile (GPU fields are re-measured here)");
  app.add_option("--planners", planners, "comma-separated planner names");
  app.add_option("--batch", batch);
  app.add_option("--seq", seq);
  app.add_option("--gpu-mem-gib", cap_gib);
  app.add_option("--steps", steps);
  app.add_option("--milp-seconds", milp_s);
  app.add_flag("--verbose", verbose);
  CLI11_PARSE(app, argc, argv);
  try {
    const ModelConfig c = preset_config(preset);
    const int64_t cap = int64_t(cap_gib * double(int64_t(1) << 30));
    ResourceProfile prof = resolve_profile(profile);
    cuda::install_gpu_profiler();
    LT_CHECK(gpu_profiler() != nullptr, "GPU profiler not registered");
    gpu_profiler()(prof, c, batch, seq);
    prof.hbm_bytes = cap;
    // No optimizer runs in this bench: let the planner's prediction assume none either, so that
    // measured and predicted exposed transfer compare like with like.
    prof.opt_fp32_params_per_s = prof.opt_8bit_params_per_s = 1e15;
    const LayerTiming& lt = prof.layer_timings.back();
    fmt::print("profile: h2d {:.1f} GB/s, d2h {:.1f}, both {:.1f}; gemm {:.0f} TFLOP/s, attn {:.0f}; layer fwd {:.2f} ms bwd {:.2f} ms\n",
               prof.h2d_bw / 1e9, prof.d2h_bw / 1e9, prof.both_bw / 1e9, prof.gemm_flops / 1e12, prof.attn_flops / 1e12,
               lt.fwd_s * 1e3, lt.bwd_s * 1e3);

    CudaBackendOptions bo;
    bo.gpu_mem_cap = cap;
    CudaBackend be(c, bo);
    HostState st(be);
    for (int64_t u = 0; u < st.units(); ++u) {
      std::vector<float> m(static_cast<size_t>(st.numel(u)));
      const bool small = st.numel(u) < 100000;
      for (int64_t i = 0; i < st.numel(u); ++i)
        m[size_t(i)] = small ? 1.f : 0.04f * (float((uint32_t(uint64_t(i + u * 7919) * 2654435761u) >> 8) & 0xffff) / 65536.f - 0.5f);
      st.write_master(u, m.data());
    }
    const int64_t T = batch * seq;
    std::vector<int32_t> ids(static_cast<size_t>(T)), tg(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      ids[size_t(t)] = int32_t((uint64_t(t) * 2654435761u) % uint64_t(c.vocab));
      tg[size_t(t)] = (t + 1) % seq == 0 ? -100 : int32_t((uint64_t(t + 1) * 2654435761u) % uint64_t(c.vocab));
    }
    MicroBatch mb{ids.data(), tg.data(), nullptr, nullptr};
    const double N = double(parameter_count(c));
    fmt::print("model {} ({:.2f} B params), batch {} x seq {} = {} tokens, --gpu-mem {:.0f} GiB\n", preset, N / 1e9, batch, seq,
               T, cap_gib);
    std::stringstream ss(planners);
    std::string planner;
    while (std::getline(ss, planner, ',')) {
      PlanRequest rq;
      rq.model = c;
      rq.batch = batch;
      rq.seq = seq;
      rq.profile = prof;
      rq.planner = planner;
      rq.optimizer = "adamw";
      rq.compare = false;
      rq.milp.time_limit_s = milp_s;
      auto out = make_plan(rq);
      if (!out.feasible) {
        fmt::print("{}: infeasible: {}\n", planner, out.why);
        continue;
      }
      ExecPlan p = exec_plan_from(out.plan, c);
      ExecOptions eo;
      eo.nvme_dir = "/tmp";
      Executor ex(c, be, p, st, eo);
      ex.train_step({mb});  // warm-up (first-touch, cuBLASLt heuristics)
      double step = 0, exposed = 0, pred = 0;
      StepResult last;
      for (int s = 0; s < steps; ++s) {
        last = ex.train_step({mb});
        step += last.step_s / steps;
        exposed += last.exposed_s / steps;
        pred += last.predicted_exposed_s / steps;
      }
      size_t fr = 0, tot = 0;
      cudaMemGetInfo(&fr, &tot);
      fmt::print("\n== {} (chosen: {}): step {:.1f} ms (predicted without optimizer {:.1f} ms), {:.1f} TFLOPS (6NT/t), "
                 "{:.0f} tokens/s, loss {:.4f}\n",
                 planner, out.chosen, step * 1e3, out.sim.step_no_opt_s * 1e3, 6.0 * N * double(T) / step / 1e12,
                 double(T) / step, last.loss);
      fmt::print("   exposed transfer {:.1f} ms measured vs {:.1f} ms predicted; peak device (tracked) {}, process GPU "
                 "memory now {} (arena {} + context)\n",
                 exposed * 1e3, pred * 1e3, format_bytes(double(last.peak_device)), format_bytes(double(tot - fr)),
                 format_bytes(double(be.arena_bytes())));
      fmt::print("{}", ex.window_table(last));
      if (verbose) fmt::print("{}", ex.memory_table());
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_cuda_step: {}\n", e.what());
    return 1;
  }
  return 0;
}
