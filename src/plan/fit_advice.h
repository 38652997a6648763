// When nothing fits: the smallest change of the request that makes it fit, found by re-planning with
// each candidate change (the model state's DRAM first, then the planner in the DP's space). Tried in
// order: fewer layers updated on the GPU (the most that fit, when device_update_layers is forced), a
// mode the planner was not allowed to choose (gradients: device or host, gradient_dtype: bf16, optimizer: hybrid,
// master_weights: bf16-sr, optimizer_nvme: auto, then all of them together; not with layers forced onto the GPU,
// which need host fp32 gradients and fp32 masters), more NVMe space (with optimizer_nvme auto), more host memory, a
// smaller batch. A change the rest of the request rules out counts as not fitting. The change found is planned once
// more for its predicted step time.
#pragma once
#include <string>
#include <vector>

#include "plan/planner.h"

namespace lt {

struct FitAdvice {
  // "device_update_layers <= 9", "gradients: device", "optimizer_nvme: auto", "nvme_mem >= 80 GiB",
  // "host_mem >= 140 GiB", "batch <= 24"; empty: none found
  std::string change;
  PlanRequest request;              // the request with the change applied
  std::vector<std::string> tried;   // every change tried, in order
  // The changed request's plan (the DP's space): its predicted step, and with moments on NVMe how many layers' and
  // what their I/O adds to the step (PlanOutcome::nvme_moments_cost_s). 0 when not planned.
  double step_s = 0, nvme_cost_s = 0;
  int64_t nvme_layers = 0;
  bool nvme_remainders = false;     // their master remainders on NVMe too (StatePlacement::nvme_remainders)
  // "; it fits with <change> (predicted step X s[, of which the moments of K layers on NVMe add Y s])", or
  // "; none of these fits: <tried>".
  std::string text() const;
};

FitAdvice fit_advice(const PlanRequest& r);

}  // namespace lt
