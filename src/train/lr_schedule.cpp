#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace lt::train {

double LrSchedule::factor(int64_t step) const {
  if (step < warmup_steps) return double(step) / double(std::max<int64_t>(1, warmup_steps));
  if (type == LrSchedulerType::Constant) return 1.0;
  double progress = double(step - warmup_steps) / double(std::max<int64_t>(1, total_steps - warmup_steps));
  double f;
  if (type == LrSchedulerType::Linear) {
    f = std::max(0.0, double(total_steps - step) / double(std::max<int64_t>(1, total_steps - warmup_steps)));
  } else {
    // cosine, num_cycles = 0.5: one half cosine from 1 to 0 over the decay steps.
    f = std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * 2.0 * 0.5 * progress)));
  }
  return min_lr_ratio + (1.0 - min_lr_ratio) * f;
}

int64_t resolve_warmup_steps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps) {
  if (warmup_steps > 0) return warmup_steps;
  return static_cast<int64_t>(std::ceil(warmup_ratio * double(total_steps)));
}

}  // namespace lt::train
