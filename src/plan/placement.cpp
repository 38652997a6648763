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

// Counts of NVMe layers worth planning for placement p (each fits the DRAM and the disk; the HBM is the planner's
// state_fits check): the fewest that make
// the state fit the DRAM, then more, which free DRAM for activation checkpoints at the price of more disk I/O, up to
// the count that leaves room for every boundary in DRAM (at most 4 counts, evenly spaced; all layers at most).
std::vector<int64_t> nvme_layer_counts(const PlanRequest& r, StatePlacement p, const std::string& moments) {
  const double dram = double(r.profile.dram_bytes);
  const double A = double(r.batch * r.seq * r.model.hidden * 2);
  auto state_at = [&](int64_t k) {
    p.nvme_layers = k;
    return model_state_bytes(r.model, choose_8bit(r.model, moments, dram, p), p);
  };
  int64_t lo = 0;
  for (int64_t k = 1; k <= r.model.layers && lo == 0; ++k) {
    const StateBytes b = state_at(k);
    if (b.nvme() > double(r.profile.nvme_bytes)) return {};
    if (b.dram() <= dram) lo = k;
  }
  if (lo == 0) return {};
  int64_t hi = lo;
  while (hi < r.model.layers) {
    const StateBytes b = state_at(hi);
    if (b.dram() + double(r.model.layers + 1) * A <= dram) break;
    if (state_at(hi + 1).nvme() > double(r.profile.nvme_bytes)) break;
    ++hi;
  }
  std::vector<int64_t> ks;
  for (int i = 0; i <= 3; ++i) {
    const int64_t k = lo + (hi - lo) * i / 3;
    if (ks.empty() || ks.back() != k) ks.push_back(k);
  }
  return ks;
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
  LT_CHECK(!r.allow_nvme_moments && !r.nvme_all_layers,
           "plan: optimizer_nvme '{}' with world size {}: the data-parallel trainer keeps the optimizer moments "
           "in DRAM; use optimizer_nvme none", r.nvme_all_layers ? "all" : "auto", r.world);
}

}  // namespace

std::string device_update_blocker(const PlanRequest& r, const StateChoice& s) {
  const StatePlacement& p = s.placement;
  if (!r.model.tied) return "the embedding is not tied to the LM head (its table is not on the GPU for the whole step)";
  if (r.world != 1) return fmt::format("world size {} (the data-parallel trainer updates on the host)", r.world);
  if (p.grads != GradHome::Host) return "gradients held on the device";
  if (p.host_bf16_grads()) return "gradients on the host in bf16 (the device update reads fp32 ones)";
  if (p.master != MasterMode::Fp32 || p.fp32_master_array) return "the master weights are not split fp32";
  for (const auto& n : s.q8)
    if (n.find("embed_tokens") != std::string::npos) return fmt::format("'{}' has 8-bit moments", n);
  return {};
}

std::string layer_update_blocker(const PlanRequest& r, const StateChoice& s) {
  const StatePlacement& p = s.placement;
  if (r.world != 1) return fmt::format("world size {} (the data-parallel trainer updates on the host)", r.world);
  if (p.grads != GradHome::Host) return "gradients held on the device";
  if (p.host_bf16_grads()) return "gradients on the host in bf16 (the device update reads fp32 ones)";
  if (p.master != MasterMode::Fp32 || p.fp32_master_array) return "the master weights are not split fp32";
  return {};
}

std::string host_bf16_blocker(const PlanRequest& r) {
  if (r.world != 1) return fmt::format("world size {} (the data-parallel trainer reduces fp32 host gradients)", r.world);
  if (r.micro_batches != 1)
    return fmt::format("{} micro-batches per step (the executor rounds each gradient on the device as it leaves, so "
                       "one micro-batch per step; several would need their sum rounded on the host, not run yet)",
                       r.micro_batches);
  return {};
}

std::vector<StateChoice> placement_ladder(const PlanRequest& r) {
  const double dram = double(r.profile.dram_bytes);
  StatePlacement p{r.master.value_or(MasterMode::Fp32), r.grads.value_or(GradHome::Host),
                   r.grad_dtype.value_or(GradDType::F32)};
  const bool single = r.world == 1;  // data parallel: the rungs its trainer runs (check_data_parallel)
  LT_CHECK(!(r.nvme_all_layers && r.allow_nvme_moments), "plan: optimizer_nvme is either 'all' or 'auto'");
  if (r.nvme_all_layers) p.nvme_layers = r.model.layers;
  LT_CHECK(r.grad_ring_depth >= 0, "plan: gradient_ring_depth must be auto (0) or >= 1, got {}", r.grad_ring_depth);
  p.grad_ring_depth = r.grad_ring_depth > 0 ? r.grad_ring_depth : kGradRingDepth;
  p.head_grad_slices = r.head_grad_slices.value_or(false);  // kept only where it applies (planner.cpp prepare)
  if (!single) {
    check_data_parallel(r, p);
    p.moment_shards = r.world;
    p.fp32_master_array = true;
  }
  const std::string host_bf16_why = host_bf16_blocker(r);
  LT_CHECK(!(r.grads == GradHome::Host && r.grad_dtype == GradDType::Bf16) || host_bf16_why.empty(),
           "plan: gradients host with gradient_dtype bf16: {}; use gradient_dtype fp32 or gradients device",
           host_bf16_why);
  // Before the 8-bit rung a hybrid optimizer keeps fp32 moments.
  std::string moments = r.optimizer == "hybrid" ? "adamw" : r.optimizer;
  std::vector<StateChoice> v;
  std::string blocked;  // why a required embedding update on the GPU was left out
  int level = 0;
  // The gradient homes of the rungs from bf16 gradients on: held in HBM and on the host cost the same accuracy (one
  // rounding), so both are offered where neither is forced.
  std::vector<GradHome> homes{p.grads};
  auto push_home = [&](StatePlacement q, GradHome h) {
    q.grads = h;
    if (q.host_bf16_grads() && !host_bf16_why.empty()) return;
    push_rung(r, {q, choose_8bit(r.model, moments, dram, q), level}, v, blocked);
  };
  auto push = [&] {
    ++level;
    for (GradHome h : homes) push_home(p, h);
  };
  push();
  if (single && !r.grads) {
    p.grads = homes[0] = GradHome::Device;
    push();
  }
  if (r.optimizer == "hybrid") {
    moments = "hybrid";
    push();
  }
  const bool bf16_rung = single && !r.grad_dtype;
  if (bf16_rung) p.grad_dtype = GradDType::Bf16;
  if (p.grad_dtype == GradDType::Bf16 && !r.grads) homes = {GradHome::Device, GradHome::Host};
  if (bf16_rung) push();
  if (moments != "adamw") {
    p.embedding_8bit = true;
    push();
  }
  if (single && !r.master && r.allow_bf16_master) {
    p.master = MasterMode::Bf16Sr;
    push();
  }
  // A level of NVMe rungs from `base`: every gradient home, each with the layer counts worth planning.
  auto push_nvme_level = [&](const StatePlacement& base) {
    ++level;
    for (GradHome h : homes) {
      StatePlacement q = base;
      q.grads = h;
      if (q.host_bf16_grads() && !host_bf16_why.empty()) continue;
      for (int64_t k : nvme_layer_counts(r, q, moments)) {
        q.nvme_layers = k;
        push_home(q, h);
      }
    }
  };
  if (r.allow_nvme_moments && r.profile.nvme_bytes > 0) {
    push_nvme_level(p);
    // 8. + those layers' master remainders in their NVMe images too (split fp32 masters only: the bf16-sr rung before
    //    has none, and takes this place where it is allowed).
    StatePlacement rp = p;
    rp.nvme_remainders = true;
    rp.nvme_layers = 1;
    if (single && r.allow_nvme_remainders && remainders_on_nvme(rp)) push_nvme_level(rp);
  }
  LT_CHECK(!v.empty(), "plan: embedding_update device: {} (use embedding_update host or auto)", blocked);
  return v;
}

bool state_fits(const PlanRequest& r, const StateChoice& s) {
  const StateBytes b = model_state_bytes(r.model, s.q8, s.placement);
  return b.dram() <= double(r.profile.dram_bytes) && b.hbm() < double(r.profile.hbm_bytes - r.profile.hbm_reserve);
}

std::string describe_choice(const StateChoice& s) {
  const bool dtype = s.placement.grads == GradHome::Device || s.placement.grad_dtype != GradDType::F32;
  std::string d = fmt::format("master {}, gradients {}{}, {} 8-bit tensors", master_mode_name(s.placement.master),
                              grad_home_name(s.placement.grads),
                              dtype ? fmt::format(" ({})", grad_dtype_name(s.placement.grad_dtype)) : "", s.q8.size());
  if (s.placement.embedding_8bit) d += " (embedding included)";
  if (s.placement.nvme_layers > 0)
    d += fmt::format(", moments {}of {} layers on nvme", remainders_on_nvme(s.placement) ? "and master remainders " : "",
                     s.placement.nvme_layers);
  return d;
}

}  // namespace lt
