#include <gtest/gtest.h>

#include <cmath>

#include "train/lr_schedule.h"

using namespace lt::train;

// Expected values follow transformers' get_*_schedule_with_warmup lambdas.
TEST(LrSchedule, LinearWithWarmup) {
  LrSchedule s{LrSchedulerType::Linear, 1.0, 2, 10, 0};
  EXPECT_DOUBLE_EQ(s.lr(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr(1), 0.5);
  EXPECT_DOUBLE_EQ(s.lr(2), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(6), 0.5);
  EXPECT_DOUBLE_EQ(s.lr(9), 1.0 / 8);
  EXPECT_DOUBLE_EQ(s.lr(10), 0.0);
  EXPECT_DOUBLE_EQ(s.lr(12), 0.0);
}

TEST(LrSchedule, CosineWithWarmup) {
  LrSchedule s{LrSchedulerType::Cosine, 2.0, 4, 24, 0};
  EXPECT_DOUBLE_EQ(s.lr(2), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(4), 2.0);
  EXPECT_NEAR(s.lr(14), 1.0, 1e-12);  // halfway through decay
  EXPECT_NEAR(s.lr(9), 2.0 * 0.5 * (1 + std::cos(M_PI * 5.0 / 20.0)), 1e-12);
  EXPECT_NEAR(s.lr(24), 0.0, 1e-12);
}

TEST(LrSchedule, ConstantWithWarmupAndMinLr) {
  LrSchedule c{LrSchedulerType::Constant, 3.0, 3, 10, 0};
  EXPECT_DOUBLE_EQ(c.lr(0), 0.0);
  EXPECT_DOUBLE_EQ(c.lr(1), 1.0);
  EXPECT_DOUBLE_EQ(c.lr(3), 3.0);
  EXPECT_DOUBLE_EQ(c.lr(9), 3.0);
  LrSchedule m{LrSchedulerType::Cosine, 1.0, 0, 10, 0.1};
  EXPECT_DOUBLE_EQ(m.lr(0), 1.0);
  EXPECT_NEAR(m.lr(10), 0.1, 1e-12);
}

TEST(LrSchedule, WarmupResolution) {
  EXPECT_EQ(resolve_warmup_steps(0, 0.1, 95), 10);  // ceil(9.5)
  EXPECT_EQ(resolve_warmup_steps(7, 0.5, 95), 7);
  EXPECT_EQ(resolve_warmup_steps(0, 0.0, 95), 0);
}
