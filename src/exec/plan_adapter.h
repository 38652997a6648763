// The planner's Plan (src/plan/plan.h) in the executor's terms. Same window numbering and boundary
// semantics; shares, ring, chunk, staging, residency and per-window predictions carry over unchanged.
#pragma once
#include "exec/exec_plan.h"
#include "model/model_config.h"
#include "plan/plan.h"

namespace lt {

// Validates the plan and checks it against the model (layers, hidden, vocab); throws lt::Error.
ExecPlan exec_plan_from(const Plan& p, const ModelConfig& c);

}  // namespace lt
