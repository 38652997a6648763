// Data-parallel inputs of the planner (docs/planner.md, "Data parallelism"): the collectives' PCIe
// bytes per rank and per optimizer step, given by the caller (dist::step_collectives computes them;
// lt_plan does not depend on lt_dist). Host-staged path: the gradient reduce-scatter runs after the last
// backward window (an extra epilogue, once per step), the weight all-gather before the forward (an
// extra prologue, once per step); both are serial on the PCIe lanes in the slot model.
#pragma once

namespace lt {

struct StepCollectives {
  double grad_h2d = 0, grad_d2h = 0;      // gradient reduce-scatter: after the last backward
  double weight_h2d = 0, weight_d2h = 0;  // weight all-gather: before the first forward
  double h2d() const { return grad_h2d + weight_h2d; }
  double d2h() const { return grad_d2h + weight_d2h; }
};

}  // namespace lt
