// The placement ladder (placement.h).
#include "plan/placement.h"

#include <fmt/format.h>

#include "core/error.h"

#include "plan/state_bytes.h"

namespace lt {

namespace {

// Adds the rung with the embedding's update as the request wants it: on the GPU where it can (unset), only where it
// can (true: an ineligible rung is left out; placement_ladder fails when no rung is left), or never.
void push_rung(const PlanRequest& r, StateChoice s, std::vector<StateChoice>& v, std::string& blocked) {
  if (r.embedding_update_device != false) {
    const std::string why = device_update_blocker(r, s);
    if (why.empty()) s.placement.embedding_update_device = true;
    else if (r.embedding_update_device) {
      if (blocked.empty()) blocked = why;
      return;
    }
  }
  v.push_back(std::move(s));
}

// The last rung: the moments of the fewest last layers on the NVMe tier that make the state fit the
// DRAM (and the files the disk), if any count does.
void push_nvme_rung(const PlanRequest& r, StatePlacement p, const std::string& moments, std::vector<StateChoice>& v,
                    std::string& blocked) {
  const double dram = double(r.profile.dram_bytes), nvme = double(r.profile.nvme_bytes);
  for (int64_t k = 1; k <= r.model.layers; ++k) {
    p.nvme_layers = k;
    StateChoice s{p, choose_8bit(r.model, moments, dram, p)};
    const StateBytes b = model_state_bytes(r.model, s.q8, p);
    if (b.nvme() > nvme) return;
    if (b.dram() <= dram) {
      push_rung(r, std::move(s), v, blocked);
      return;
    }
  }
}

// World > 1: only what the data-parallel trainer runs (docs/distributed.md): fp32 master arrays, host
// gradients, moments in DRAM sharded over the ranks. Forcing anything else is an error naming it.
void check_data_parallel(const PlanRequest& r, const StatePlacement& p) {
  LT_CHECK(p.master == MasterMode::Fp32,
           "plan: master_weights 'bf16-sr' with world size {}: the data-parallel trainer all-gathers fp32 "
           "masters; use master_weights fp32 or auto", r.world);
  LT_CHECK(p.grads == GradHome::Host,
           "plan: gradients 'device' with world size {}: the data-parallel trainer reduce-scatters fp32 host "
           "gradients; use gradients host or auto", r.world);
  LT_CHECK(p.grad_dtype == GradDType::F32,
           "plan: gradient_dtype 'bf16' with world size {}: the data-parallel trainer keeps fp32 host "
           "gradients; use gradient_dtype fp32 or auto", r.world);
  LT_CHECK(!r.allow_nvme_moments,
           "plan: optimizer_nvme 'auto' with world size {}: the data-parallel trainer keeps the optimizer moments "
           "in DRAM; use optimizer_nvme none", r.world);
}

}  // namespace

std::string device_update_blocker(const PlanRequest& r, const StateChoice& s) {
  const StatePlacement& p = s.placement;
  if (!r.model.tied) return "the embedding is not tied to the LM head (its table is not on the GPU for the whole step)";
  if (r.world != 1) return fmt::format("world size {} (the data-parallel trainer updates on the host)", r.world);
  if (p.grads != GradHome::Host) return "gradients held on the device";
  if (p.master != MasterMode::Fp32 || p.fp32_master_array) return "the master weights are not split fp32";
  for (const auto& n : s.q8)
    if (n.find("embed_tokens") != std::string::npos) return fmt::format("'{}' has 8-bit moments", n);
  return {};
}

std::string layer_update_blocker(const PlanRequest& r, const StateChoice& s) {
  const StatePlacement& p = s.placement;
  if (r.world != 1) return fmt::format("world size {} (the data-parallel trainer updates on the host)", r.world);
  if (p.grads != GradHome::Host) return "gradients held on the device";
  if (p.master != MasterMode::Fp32 || p.fp32_master_array) return "the master weights are not split fp32";
  return {};
}

std::vector<StateChoice> placement_ladder(const PlanRequest& r) {
  const double dram = double(r.profile.dram_bytes);
  LT_CHECK(!(r.grads == GradHome::Host && r.grad_dtype == GradDType::Bf16),
           "plan: gradient dtype bf16 applies to gradients held on the device; with gradients on the host they "
           "are fp32 accumulators (use gradients device or auto)");
  StatePlacement p{r.master.value_or(MasterMode::Fp32), r.grads.value_or(GradHome::Host),
                   r.grad_dtype.value_or(GradDType::F32)};
  const bool single = r.world == 1;  // data parallel: the rungs its trainer runs (check_data_parallel)
  if (!single) {
    check_data_parallel(r, p);
    p.moment_shards = r.world;
    p.fp32_master_array = true;
  }
  // Before the 8-bit rung a hybrid optimizer keeps fp32 moments.
  std::string moments = r.optimizer == "hybrid" ? "adamw" : r.optimizer;
  std::vector<StateChoice> v;
  std::string blocked;  // why a required embedding update on the GPU was left out
  auto push = [&] { push_rung(r, {p, choose_8bit(r.model, moments, dram, p)}, v, blocked); };
  push();
  if (single && !r.grads) {
    p.grads = GradHome::Device;
    push();
  }
  if (r.optimizer == "hybrid") {
    moments = "hybrid";
    push();
  }
  if (p.grads == GradHome::Device && !r.grad_dtype) {
    p.grad_dtype = GradDType::Bf16;
    push();
  }
  if (moments != "adamw") {
    p.embedding_8bit = true;
    push();
  }
  if (single && !r.master && r.allow_bf16_master) {
    p.master = MasterMode::Bf16Sr;
    push();
  }
  if (r.allow_nvme_moments && r.profile.nvme_bytes > 0) push_nvme_rung(r, p, moments, v, blocked);
  LT_CHECK(!v.empty(), "plan: embedding_update device: {} (use embedding_update host or auto)", blocked);
  return v;
}

bool state_fits(const PlanRequest& r, const StateChoice& s) {
  const StateBytes b = model_state_bytes(r.model, s.q8, s.placement);
  return b.dram() <= double(r.profile.dram_bytes) && b.hbm() < double(r.profile.hbm_bytes - r.profile.hbm_reserve);
}

std::string describe_choice(const StateChoice& s) {
  std::string d = fmt::format("master {}, gradients {}{}, {} 8-bit tensors", master_mode_name(s.placement.master),
                              grad_home_name(s.placement.grads),
                              s.placement.grads == GradHome::Device ? fmt::format(" ({})", grad_dtype_name(s.placement.grad_dtype)) : "",
                              s.q8.size());
  if (s.placement.embedding_8bit) d += " (embedding included)";
  if (s.placement.nvme_layers > 0) d += fmt::format(", moments of {} layers on nvme", s.placement.nvme_layers);
  return d;
}

}  // namespace lt
