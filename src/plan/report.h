// Human-readable plan report (text tables) and the SVG timeline of a simulated step.
#pragma once
#include <string>

#include "plan/planner.h"

namespace lt {

// Checkpoints per tier, blocks, predicted step/TFLOPS with breakdown, peaks per tier, every
// candidate side by side, and the MILP's objective/bound/gap/solve time.
std::string plan_report(const PlanRequest& r, const PlanOutcome& o);
// A line saying the attention core's share was scaled by r.attention_fraction (packed rows); empty when it is 1.
std::string packed_rows_line(const PlanRequest& r);
// The predicted step's attention-inclusive TFLOPS (model_flops_with_attention, every row's causal square times
// r.attention_fraction), the
// share of it 6*N leaves out, and both MFUs against the profile's peak; empty without a predicted step.
std::string attention_line(const PlanRequest& r, const PlanOutcome& o);
// Lanes over time: one row per lane, one rect per op, exposed GPU time in red.
std::string timeline_svg(const SimResult& s, const std::string& title);

}  // namespace lt
