// The placement ladder (placement.h).
#include "plan/placement.h"

#include <fmt/format.h>

namespace lt {

std::vector<StateChoice> placement_ladder(const PlanRequest& r) {
  const double dram = double(r.profile.dram_bytes);
  StatePlacement p{r.master.value_or(MasterMode::Fp32), r.grads.value_or(GradHome::Host)};
  // Before the 8-bit rung a hybrid optimizer keeps fp32 moments.
  std::string moments = r.optimizer == "hybrid" ? "adamw" : r.optimizer;
  std::vector<StateChoice> v;
  auto push = [&] { v.push_back({p, choose_8bit(r.model, moments, dram, p)}); };
  push();
  if (!r.grads) {
    p.grads = GradHome::Device;
    push();
  }
  if (r.optimizer == "hybrid") {
    moments = "hybrid";
    push();
  }
  if (!r.master && r.allow_bf16_master) {
    p.master = MasterMode::Bf16Sr;
    push();
  }
  return v;
}

bool state_fits(const PlanRequest& r, const StateChoice& s) {
  const StateBytes b = model_state_bytes(r.model, s.q8, s.placement);
  return b.dram() <= double(r.profile.dram_bytes) && b.hbm() < double(r.profile.hbm_bytes - r.profile.hbm_reserve);
}

std::string describe_choice(const StateChoice& s) {
  return fmt::format("master {}, gradients {}, {} 8-bit tensors", master_mode_name(s.placement.master),
                     grad_home_name(s.placement.grads), s.q8.size());
}

}  // namespace lt
