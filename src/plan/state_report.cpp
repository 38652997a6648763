// The memory tables (state_report.h).
#include "plan/state_report.h"

#include <array>
#include <fmt/format.h>
#include <vector>

#include "core/units.h"

namespace lt {

namespace {

using Totals = std::array<double, 3>;  // per StateHome
using Caps = std::array<double, 3>;    // per StateHome; < 0: no cap shown

std::string rows(const std::vector<StatePart>& parts, int64_t params, Totals& tot) {
  std::string s = fmt::format("  {:<36} {:<5} {:>12} {:>8}\n", "part", "home", "bytes", "B/param");
  for (auto& p : parts) {
    if (p.bytes <= 0) continue;
    tot[size_t(p.home)] += p.bytes;
    s += fmt::format("  {:<36} {:<5} {:>12} {:>8.2f}\n", p.name, state_home_name(p.home), format_bytes(p.bytes),
                     p.bytes / double(params));
  }
  return s;
}

std::string totals(const Totals& tot, const Caps& caps) {
  std::string s = "  total:";
  for (size_t h = 0; h < tot.size(); ++h) {
    if (tot[h] <= 0 && caps[h] < 0) continue;
    s += fmt::format(" {} {}", state_home_name(StateHome(h)), format_bytes(tot[h]));
    if (caps[h] >= 0) s += fmt::format(" of {}", format_bytes(caps[h]));
    s += h + 1 < tot.size() ? "," : "";
  }
  if (s.back() == ',') s.pop_back();
  return s + "\n";
}

std::string header(const StateBytes& s, int64_t params) {
  const std::string n = params >= 100'000'000 ? fmt::format("{:.2f}B", double(params) / 1e9)
                                               : fmt::format("{:.2f}M", double(params) / 1e6);
  // The gradients' dtype where it is not the host's fp32 (held ones, host bf16 ones).
  const bool dtype = s.placement.grads == GradHome::Device || s.placement.grad_dtype != GradDType::F32;
  return fmt::format("memory (master {}, gradients {}{}; {} params):\n", master_mode_name(s.placement.master),
                     grad_home_name(s.placement.grads),
                     dtype ? fmt::format(" ({})", grad_dtype_name(s.placement.grad_dtype)) : std::string(), n);
}

// The plan's own memory beside the model state's: kept internals (in hbm_fixed besides the model state's HBM), the
// GPU peak's working part, the checkpoints.
std::vector<StatePart> activation_parts(const PlanOutcome& o) {
  const auto& in = o.inst;
  int ncpu = 0, nnvme = 0;
  for (auto t : o.plan.tier) {
    ncpu += t == Tier::Cpu;
    nnvme += t == Tier::Nvme;
  }
  std::vector<StatePart> v;
  if (in.kept > 0) v.push_back({fmt::format("kept internals (last {} layers)", in.kept), StateHome::Gpu, kept_hbm(in)});
  v.push_back({"weight ring + activations (gpu peak)", StateHome::Gpu, double(o.sim.pred.peak_hbm) - in.hbm_fixed});
  v.push_back({fmt::format("activation checkpoints ({} cpu)", ncpu), StateHome::Dram, in.A * ncpu});
  v.push_back({"nvme staging (pinned)", StateHome::Dram, nnvme > 0 ? 2.0 * in.staging * in.A : 0.0});
  v.push_back({fmt::format("activation checkpoints ({} nvme)", nnvme), StateHome::Nvme, in.A * nnvme});
  return v;
}

}  // namespace

std::string state_table(const StateBytes& s, int64_t params) {
  Totals tot{};
  std::string t = header(s, params) + rows(s.parts(), params, tot);
  return t + totals(tot, {-1, -1, -1});
}

std::string memory_table(const PlanOutcome& o) {
  const auto& in = o.inst;
  auto parts = o.state.parts();
  if (o.feasible)
    for (auto& p : activation_parts(o)) parts.push_back(p);
  Totals tot{};
  std::string t = header(o.state, o.state.params) + rows(parts, o.state.params, tot);
  // The instance's NVMe cap is what the moments' files leave for checkpoints: the disk is both.
  return t + totals(tot, {in.hbm_cap, in.dram_cap, in.nvme_cap + o.state.nvme()});
}

}  // namespace lt
