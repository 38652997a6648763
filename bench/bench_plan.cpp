// Planner benchmark: solve time of the DP and the MILP (CBC) on this machine for the reference shapes
// at 24 GiB and 80 GiB GPU caps, with proven optimality / gap, and predicted step time of the MILP
// plan vs megatrain:4 at the baseline's max batch, plus each one's max feasible batch.
//   bench_plan [--models qwen2.5-3b,qwen2.5-7b,...] [--caps 24,80] [--profile h800-80g]
//              [--host-mem 1536GiB] [--time-limit 30] [--micro-batches 1] [--no-max]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fmt/format.h>
#include <sstream>

#include "core/timer.h"
#include "core/units.h"
#include "model/model_config.h"
#include "plan/planner.h"

using namespace lt;

int main(int argc, char** argv) {
  CLI::App app{"bench_plan: planner solve times and predicted step times"};
  std::string models = "qwen2.5-3b,qwen2.5-7b,qwen2.5-14b,qwen2.5-32b,qwen2.5-72b", caps = "24,80";
  std::string profile = "h800-80g", host_mem = "1536GiB";
  double time_limit = 30, gap = 0.005;
  int micro = 1;
  bool no_max = false;
  int64_t fixed_batch = 0;
  app.add_option("--models", models);
  app.add_option("--caps", caps, "GPU caps in GiB");
  app.add_option("--profile", profile);
  app.add_option("--host-mem", host_mem, "DRAM budget (large enough for the 72B model state)");
  app.add_option("--time-limit", time_limit);
  app.add_option("--gap", gap);
  app.add_option("--micro-batches", micro);
  app.add_option("--batch", fixed_batch, "solve at this batch instead of megatrain:4's max");
  app.add_flag("--no-max", no_max, "skip the MILP solve at the DP's max batch");
  CLI11_PARSE(app, argc, argv);

  auto split = [](const std::string& s) {
    std::vector<std::string> v;
    std::stringstream ss(s);
    for (std::string x; std::getline(ss, x, ',');) v.push_back(x);
    return v;
  };
  std::printf("| model | L | cap | batch | DP s | MILP s | cols/rows/ints | gap | optimal | step MILP ms | step megatrain:4 ms | "
              "speedup | TFLOPS MILP / m4 | max batch m4 | max batch DP | MILP @max: step ms, TFLOPS, solve s, gap |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (auto& m : split(models)) {
    for (auto& cap : split(caps)) {
      PlanRequest r;
      r.model = resolve_model(m);
      r.seq = 1024;
      r.micro_batches = micro;
      r.profile = resolve_profile(profile);
      r.profile.hbm_bytes = std::stoll(cap) * GiB;
      r.profile.hbm_reserve = std::min(r.profile.hbm_reserve, r.profile.hbm_bytes / 8);
      r.profile.dram_bytes = parse_bytes(host_mem);
      r.milp.time_limit_s = time_limit;
      r.milp.rel_gap = gap;
      std::fprintf(stderr, "%s @ %s GiB: max batch search...\n", m.c_str(), cap.c_str());
      const int64_t bm4 = max_feasible_batch(r, "megatrain:4", 1024);
      const int64_t bdp = max_feasible_batch(r, "dp", 1024);
      r.batch = fixed_batch > 0 ? fixed_batch : std::max<int64_t>(1, bm4);
      std::fprintf(stderr, "  solving at batch %lld...\n", (long long)r.batch);
      auto o = make_plan(r);
      const Candidate* m4 = nullptr;
      for (auto& c : o.candidates)
        if (c.name == "megatrain:4") m4 = &c;
      std::string at_max = "-";
      if (!no_max && bdp > 0 && bdp != r.batch) {
        PlanRequest q = r;
        q.batch = bdp;
        q.compare = false;
        auto om = make_plan(q);
        if (om.feasible && om.milp)
          at_max = fmt::format("{:.1f}, {:.1f}, {:.2f}, {:.3f}%", om.sim.pred.step_s * 1e3, om.sim.pred.tflops, om.milp->solve_s,
                               100 * om.milp->gap);
      }
      if (!o.feasible || !o.milp) {
        std::printf("| %s | %lld | %s GiB | %lld | - | - | - | - | - | %s |\n", m.c_str(), (long long)r.model.layers, cap.c_str(),
                    (long long)r.batch, o.why.c_str());
        continue;
      }
      const auto& ms = *o.milp;
      const double s_m4 = m4 && m4->feasible ? m4->sim.pred.step_s : 0;
      std::printf("| %s | %lld | %s GiB | %lld | %.3f | %.2f | %d/%d/%d | %.3f%% | %s | %.1f | %s | %s | %.1f / %s | %lld | %s | %s |\n",
                  m.c_str(), (long long)r.model.layers, cap.c_str(), (long long)r.batch, o.dp->solve_s, ms.solve_s,
                  ms.columns, ms.rows, ms.integers, 100 * ms.gap, ms.optimal ? "yes" : "no", o.sim.pred.step_s * 1e3,
                  s_m4 > 0 ? fmt::format("{:.1f}", s_m4 * 1e3).c_str() : "infeasible",
                  s_m4 > 0 ? fmt::format("{:.3f}x", s_m4 / o.sim.pred.step_s).c_str() : "-", o.sim.pred.tflops,
                  s_m4 > 0 ? fmt::format("{:.1f}", m4->sim.pred.tflops).c_str() : "-", (long long)bm4, bdp >= 1024 ? ">=1024" : std::to_string(bdp).c_str(),
                  at_max.c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}
