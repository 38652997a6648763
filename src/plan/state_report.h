// Where every byte lives: the model state's parts (master + copy, gradients, moments, staging) and,
// for a plan, the activations, each with its home, bytes and bytes per parameter, then the total per
// home against its cap. Printed by `lazytrain plan` and reusable by the trainer at start-up.
#pragma once
#include <cstdint>
#include <string>

#include "plan/planner.h"
#include "plan/state_bytes.h"

namespace lt {

// The model state alone (no caps): one row per part, then the total per home.
std::string state_table(const StateBytes& s, int64_t params);

// The model state plus the plan's activations (weight ring and working sets at the GPU peak, CPU and
// NVMe checkpoints, NVMe staging), totals per home against the instance's caps. When the outcome is
// infeasible, the model state of the choice that was tried, against the caps.
std::string memory_table(const PlanOutcome& o);

}  // namespace lt
