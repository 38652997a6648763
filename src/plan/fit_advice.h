// When nothing fits: the smallest change of the request that makes it fit, found by re-planning with
// each candidate change (the model state's DRAM first, then the planner in the DP's space). Tried in
// order: a mode the planner was not allowed to choose (gradients: device, optimizer: hybrid,
// master_weights: bf16-sr, then all of them together), more host memory, a smaller batch.
#pragma once
#include <string>
#include <vector>

#include "plan/planner.h"

namespace lt {

struct FitAdvice {
  std::string change;               // "gradients: device", "host_mem >= 140 GiB", "batch <= 24"; empty: none found
  PlanRequest request;              // the request with the change applied
  std::vector<std::string> tried;   // every change tried, in order
  // "; it fits with <change>", or "; none of these fits: <tried>".
  std::string text() const;
};

FitAdvice fit_advice(const PlanRequest& r);

}  // namespace lt
