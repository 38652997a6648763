#include "plan/report.h"

#include <algorithm>
#include <fmt/format.h>

#include "core/units.h"
#include "model/accounting.h"
#include "model/param_layout.h"
#include "plan/state_report.h"

namespace lt {

namespace {

constexpr const char* kDeltaNetColor = "#d4a017";  // GPU compute of a Gated DeltaNet layer (attention: the lane's blue)

std::string ms(double s) { return fmt::format("{:.1f}", s * 1e3); }

std::string tier_list(const Plan& p, Tier t) {
  std::string s;
  int n = 0;
  for (size_t i = 0; i < p.tier.size(); ++i)
    if (p.tier[i] == t) {
      s += (n++ ? "," : "") + std::to_string(i);
    }
  return fmt::format("{} [{}]", n, s);
}

// Layer j's backward compute in its slot besides any re-run: beta - rho, or beta itself when it keeps its internals.
double bwd_only(const Instance& in, int j) {
  const bool kept = j >= in.L - in.kept;
  return kept ? in.beta[size_t(j)] : in.beta[size_t(j)] - in.rho[size_t(j)];
}

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '<') o += "&lt;";
    else if (ch == '>') o += "&gt;";
    else if (ch == '&') o += "&amp;";
    else o += ch;
  }
  return o;
}

// The layers: a dense model's in one line (count, parameters and bf16 bytes of one layer, forward/backward time); a
// model mixing kinds gets a line per kind. The parameters are the layout's (the instance's P is what a step uploads:
// 0 for the layers updated on the GPU).
std::string kind_summary(const PlanRequest& r, const Instance& in) {
  const ModelLayout lay = model_layout(r.model);
  std::vector<LayerKind> kinds;
  for (int k = 0; k < kNumLayerKinds; ++k)
    if (r.model.count(LayerKind(k)) > 0) kinds.push_back(LayerKind(k));
  auto first_of = [&](LayerKind kind) {
    int j = 0;
    while (in.kind_of(j) != kind) ++j;
    return j;
  };
  auto params_of = [&](LayerKind kind) { return double(unit_param_count(lay.layer(first_of(kind)))); };
  auto times_of = [&](LayerKind kind) {
    const int j = first_of(kind);
    const auto t = layer_times(r.profile, r.model, kind, r.batch, r.seq, r.chunk);
    return fmt::format("fwd {} ms, bwd {} ms per layer ({})", ms(in.rho[size_t(j)]), ms(bwd_only(in, j)),
                       t.measured ? "measured" : "estimated");
  };
  if (kinds.size() == 1)
    return fmt::format("layers: {} x {:.1f}M params ({} bf16 each), {}\n", r.model.layers, params_of(kinds[0]) / 1e6,
                       format_bytes(2 * params_of(kinds[0])), times_of(kinds[0]));
  std::string s = "layers:";
  for (LayerKind kind : kinds) s += fmt::format(" {} {}", r.model.count(kind), layer_kind_short_name(kind));
  s += "\n";
  for (LayerKind kind : kinds)
    s += fmt::format("  {:<9} x{:<3} {:.1f}M params each ({} bf16), {}\n", layer_kind_short_name(kind),
                     r.model.count(kind), params_of(kind) / 1e6, format_bytes(2 * params_of(kind)), times_of(kind));
  return s;
}

// Per layer (models mixing kinds): kind, tier of its input boundary, its block, forward and backward time, weights
// (bf16, the layout's: the layers updated on the GPU upload none).
std::string layer_table(const ModelConfig& c, const Instance& in, const Plan& p) {
  const ModelLayout lay = model_layout(c);
  std::string s = fmt::format("\n  {:>5}  {:<9} {:<5} {:<9} {:>9} {:>9} {:>11}\n", "layer", "kind", "input", "block",
                              "fwd ms", "bwd ms", "weights");
  for (const auto& b : p.blocks)
    for (int j = b.start; j < b.end; ++j)
      s += fmt::format("  {:>5}  {:<9} {:<5} {:<9} {:>9} {:>9} {:>11}\n", j, layer_kind_short_name(in.kind_of(j)),
                       tier_name(p.tier[size_t(j)]), fmt::format("({},{})", b.start, b.end), ms(in.rho[size_t(j)]),
                       ms(bwd_only(in, j)), format_bytes(2 * double(unit_param_count(lay.layer(j)))));
  return s;
}

}  // namespace

std::string packed_rows_line(const PlanRequest& r) {
  if (r.attention_fraction == 1.0) return {};
  return fmt::format("packed rows: the attention core's share of each attention layer's time scaled by {:.4f} (the "
                     "data's sum of segment len^2 / seq^2 per row)\n", r.attention_fraction);
}

std::string plan_report(const PlanRequest& r, const PlanOutcome& o) {
  std::string s;
  const auto& in = o.inst;
  s += fmt::format("model {} ({} layers, hidden {}), batch {} x seq {} x {} micro-batches = {} tokens/step, profile {}\n",
                   r.model.name, r.model.layers, r.model.hidden, r.batch, r.seq, r.micro_batches,
                   r.batch * r.seq * r.micro_batches, r.profile.name);
  // NVMe: the profile's space; the checkpoints get what the moment files leave (Instance::nvme_cap).
  const double nvme_files = o.state.nvme();
  s += fmt::format("caps: gpu {} (usable {}), dram {}, nvme {}{}; boundary {}, weight ring {} (largest layer x {})\n",
                   format_bytes(double(r.profile.hbm_bytes)), format_bytes(in.hbm_cap), format_bytes(in.dram_cap),
                   format_bytes(double(r.profile.nvme_bytes)),
                   nvme_files > 0 ? fmt::format(" ({} for checkpoints beside the moment files)", format_bytes(in.nvme_cap))
                                  : std::string(),
                   format_bytes(in.A), format_bytes(in.ring), r.ring);
  s += kind_summary(r, in);
  s += packed_rows_line(r);
  s += fmt::format("optimizer {}: {} tensors ({:.2f}B params) with 8-bit moments; master_weights {}, gradients {}; "
                   "model state in DRAM {}, in HBM {}\n", r.optimizer, o.eight_bit_tensors, double(o.eight_bit_params) / 1e9,
                   master_mode_name(o.placement.master),
                   fmt::format("{} ({}){}", grad_home_name(o.placement.grads), grad_dtype_name(o.placement.grad_dtype),
                               o.placement.head_grad_slices ? ", the head's by vocabulary slices" : ""),
                   format_bytes(in.dram_fixed), format_bytes(in.hbm_fixed));
  if (o.dp) s += fmt::format("dp: {} in {:.3f} s ({} states)\n", o.dp->feasible ? "feasible" : "infeasible", o.dp->solve_s, o.dp->states);
  if (o.milp) {
    const auto& m = *o.milp;
    s += fmt::format("milp (CBC): {} cols ({} integer, {} edges kept), {} rows; ", m.columns, m.integers, m.edges, m.rows);
    if (m.feasible)
      s += fmt::format("objective {} ms, bound {} ms, gap {:.3f}%{}, solve {:.2f} s\n", ms(m.objective), ms(m.bound),
                       100 * m.gap, m.optimal ? " (optimal within tolerance)" : "", m.solve_s);
    else
      s += fmt::format("no solution, {:.2f} s\n", m.solve_s);
  }
  if (!o.feasible) {
    s += memory_table(o) + o.why + "\n";
    return s;
  }
  const auto& p = o.plan;
  const auto& q = o.sim.pred;
  s += fmt::format("\nplan [{}] chunk {} samples, weight ring {}\n", p.planner, p.chunk, p.ring);
  s += fmt::format("  gpu  checkpoints: {}\n", tier_list(p, Tier::Gpu));
  s += fmt::format("  cpu  checkpoints: {}\n", tier_list(p, Tier::Cpu));
  s += fmt::format("  nvme checkpoints: {}\n", tier_list(p, Tier::Nvme));
  std::string bl;
  for (auto& b : p.blocks)
    if (b.end - b.start > 1) bl += fmt::format(" ({},{})", b.start, b.end);
  s += fmt::format("  recompute blocks:{}\n", bl.empty() ? " none" : bl);
  if (p.kept_layers > 0) s += fmt::format("  kept internals: last {} layers ({})\n", p.kept_layers, format_bytes(kept_hbm(in)));
  s += fmt::format("  predicted step {} ms, {:.1f} TFLOPS (6*N*tokens/step, N={:.2f}B), {:.0f} tokens/s\n", ms(q.step_s),
                   q.tflops, double(parameter_count(r.model)) / 1e9, double(r.batch * r.seq * r.micro_batches) / q.step_s);
  s += attention_line(r, o);
  s += fmt::format("  breakdown: compute {} + recompute {} + exposed h2d {} + d2h {} + nvme {} + optimizer {} ms\n",
                   ms(q.compute_s), ms(q.recompute_s), ms(q.exposed_h2d_s), ms(q.exposed_d2h_s), ms(q.exposed_nvme_s),
                   ms(q.exposed_optimizer_s));
  s += fmt::format("  peaks: gpu {} of {}, dram {} of {}, nvme {} of {}\n", format_bytes(double(q.peak_hbm)),
                   format_bytes(in.hbm_cap), format_bytes(double(q.peak_dram)), format_bytes(in.dram_cap),
                   format_bytes(double(q.nvme_bytes) + nvme_files), format_bytes(double(r.profile.nvme_bytes)));
  if (o.placement.nvme_layers > 0)
    s += fmt::format("  nvme moments: last {} layers{}, {} of files, {:.2f} s of disk I/O per step, adding {} ms to the "
                     "step\n",
                     o.placement.nvme_layers, remainders_on_nvme(o.placement) ? " with their master remainders" : "",
                     format_bytes(o.state.nvme()), o.nvme_moments_io_s, ms(o.nvme_moments_cost_s));
  s += "\n" + memory_table(o);
  if (r.model.hybrid()) s += layer_table(r.model, in, p);
  s += "\ncandidates (same simulator):\n";
  s += fmt::format("  {:<14} {:>10} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11}  {}\n", "planner", "step ms", "TFLOPS",
                   "recompute", "exp h2d", "exp d2h", "exp nvme", "exp opt", "peak gpu", "checkpoints g/c/n");
  for (auto& c : o.candidates) {
    if (!c.feasible) {
      s += fmt::format("  {:<14} {}\n", c.name, c.why);
      continue;
    }
    const auto& x = c.sim.pred;
    int g = 0, cc = 0, n = 0;
    for (auto t : c.plan.tier) {
      g += t == Tier::Gpu;
      cc += t == Tier::Cpu;
      n += t == Tier::Nvme;
    }
    s += fmt::format("  {:<14} {:>10} {:>8.1f} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11}  {}/{}/{}\n", c.name, ms(x.step_s),
                     x.tflops, ms(x.recompute_s), ms(x.exposed_h2d_s), ms(x.exposed_d2h_s), ms(x.exposed_nvme_s),
                     ms(x.exposed_optimizer_s), format_bytes(double(x.peak_hbm)), g, cc, n);
  }
  return s;
}

std::string attention_line(const PlanRequest& r, const PlanOutcome& o) {
  const double step_s = o.sim.pred.step_s;
  if (step_s <= 0) return {};
  const double tflops = o.flops_attn_per_step / step_s / 1e12;
  const double share = 1.0 - o.flops_per_step / std::max(o.flops_attn_per_step, 1.0);
  std::string s = fmt::format("  with attention: {:.1f} TFLOPS (6*N*tokens + causal attention{}, {:.1f}% of it)", tflops,
                              r.model.hybrid() ? " + delta rule" : "", 100 * share);
  if (r.profile.peak_flops > 0)
    s += fmt::format(", MFU {:.1f}% ({:.1f}% at 6*N) of {:.0f} TFLOP/s", 100 * tflops * 1e12 / r.profile.peak_flops,
                     100 * o.sim.pred.tflops * 1e12 / r.profile.peak_flops, r.profile.peak_flops / 1e12);
  return s + "\n";
}

std::string timeline_svg(const SimResult& sim, const std::string& title) {
  const double W = 1600, lane_h = 34, left = 120, top = 40;
  const int nl = int(SimLane::Count);
  double tmax = sim.pred.step_s;
  for (auto& o : sim.ops) tmax = std::max(tmax, o.t1);
  if (tmax <= 0) tmax = 1;
  const double k = (W - left - 20) / tmax;
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"11\">\n",
      W, top + nl * lane_h + 50);
  s += fmt::format("<text x=\"10\" y=\"20\" font-size=\"14\">{}</text>\n", xml_escape(title));
  const char* colors[] = {"#4c78a8", "#f58518", "#54a24b", "#b279a2", "#9d755d", "#72b7b2"};
  for (int l = 0; l < nl; ++l) {
    const double y = top + l * lane_h;
    s += fmt::format("<text x=\"10\" y=\"{}\">{}</text>\n", y + lane_h * 0.6, sim_lane_name(SimLane(l)));
    s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#ddd\"/>\n", left, y + lane_h, W - 20, y + lane_h);
  }
  for (auto& o : sim.ops) {
    const double y = top + int(o.lane) * lane_h + 4;
    const double x = left + o.t0 * k, w = std::max(0.5, (o.t1 - o.t0) * k);
    const std::string fill = o.exposed ? "#e45756" : o.kind == int(LayerKind::GatedDeltaNet) ? kDeltaNetColor : colors[int(o.lane)];
    s += fmt::format("<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\" stroke=\"white\" "
                     "stroke-width=\"0.3\"><title>{} {:.2f}-{:.2f} ms</title></rect>\n",
                     x, y, w, lane_h - 8, fill, xml_escape(o.label), o.t0 * 1e3, o.t1 * 1e3);
    if (w > 24)
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"white\" font-size=\"9\">{}</text>\n", x + 2, y + lane_h * 0.5,
                       xml_escape(o.label));
  }
  const double yb = top + nl * lane_h + 20;
  for (int t = 0; t <= 10; ++t) {
    const double x = left + tmax * t / 10 * k;
    s += fmt::format("<text x=\"{:.1f}\" y=\"{}\">{:.0f} ms</text>\n", x - 10, yb, tmax * t / 10 * 1e3);
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#e45756\">red: GPU idle (exposed transfer or optimizer wait)</text>\n",
                   left, yb + 20);
  if (std::any_of(sim.ops.begin(), sim.ops.end(), [](const SimOp& o) { return o.kind == int(LayerKind::GatedDeltaNet); }))
    s += fmt::format("<text x=\"{}\" y=\"{}\">GPU compute: <tspan fill=\"{}\">blue: attention layer (A)</tspan>, "
                     "<tspan fill=\"{}\">gold: Gated DeltaNet layer (D)</tspan></text>\n",
                     left + 420, yb + 20, colors[0], kDeltaNetColor);
  s += "</svg>\n";
  return s;
}

}  // namespace lt
