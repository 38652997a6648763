// When nothing fits: the smallest change of the request that makes it fit, found by re-planning with
// each candidate change (the model state's DRAM first, then the planner in the DP's space). Tried in
// order: fewer layers updated on the GPU (the most that fit, when device_update_layers is forced), a
// mode the planner was not allowed to choose (gradients: device, optimizer: hybrid, master_weights:
// bf16-sr, then all of them together; not with layers forced onto the GPU, which need neither), more
// host memory, a smaller batch. A change the rest of the request rules out counts as not fitting.
#pragma once
#include <string>
#include <vector>

#include "plan/planner.h"

namespace lt {

struct FitAdvice {
  // "device_update_layers <= 9", "gradients: device", "host_mem >= 140 GiB", "batch <= 24"; empty: none found
  std::string change;
  PlanRequest request;              // the request with the change applied
  std::vector<std::string> tried;   // every change tried, in order
  // "; it fits with <change>", or "; none of these fits: <tried>".
  std::string text() const;
};

FitAdvice fit_advice(const PlanRequest& r);

}  // namespace lt
