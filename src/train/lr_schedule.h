// Learning-rate schedules with HF transformers semantics (get_{constant,linear,cosine}_schedule_with_warmup).
// lr(step) is the rate used by the optimizer update number `step` (0-based): HF's scheduler returns
// lr_lambda(0) for the first update, so with warmup the first update has lr 0.
#pragma once
#include <cstdint>

#include "train/config_choices.h"

namespace lt::train {

struct LrSchedule {
  LrSchedulerType type = LrSchedulerType::Linear;
  double base_lr = 0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_ratio = 0;      // decay floor as a fraction of base_lr (0 = HF default)

  double factor(int64_t step) const;  // multiplier in [0, 1]
  double lr(int64_t step) const { return base_lr * factor(step); }
};

// HF: warmup_steps if > 0, else ceil(warmup_ratio * total_steps).
int64_t resolve_warmup_steps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps);

}  // namespace lt::train
