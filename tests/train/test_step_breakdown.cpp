// The per-step time breakdown (train/step_breakdown.h) from the executor's window figures.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "train/step_breakdown.h"

using namespace lt;
using namespace lt::train;

TEST(StepBreakdown, SumsWindowsByKindAndLeavesTheRestAsHostGaps) {
  StepResult r;
  auto win = [&](WindowKind k, double measured, double predicted) {
    WindowStats w;
    w.ref = {k, 0};
    w.measured.compute = measured;
    w.predicted.compute = predicted;
    r.windows.push_back(w);
  };
  win(WindowKind::Forward, 0.10, 0.09);
  win(WindowKind::Forward, 0.10, 0.09);
  win(WindowKind::Head, 0.05, 0.04);
  win(WindowKind::Recompute, 0.07, 0.08);
  win(WindowKind::Backward, 0.20, 0.18);
  win(WindowKind::Backward, 0.20, 0.18);
  r.windows.front().measured.embedding = 0.004;  // the lookup, inside window 0's compute
  r.windows.back().measured.embedding = 0.006;   // its backward, inside the last backward window's
  r.exposed_s = 0.03;
  r.exposed_optimizer_s = 0.01;
  // Two micro-batches: the last one's windows count twice.
  const StepBreakdown b = step_breakdown(r, 2, 1.5, 1.3, 0.002, 0.004);
  ASSERT_TRUE(b.valid);
  EXPECT_NEAR(b.measured.layers, 1.2 - 0.02, 1e-12);  // the embedding's 10 ms per micro-batch apart
  EXPECT_NEAR(b.measured.embedding, 0.02, 1e-12);
  EXPECT_EQ(b.predicted.embedding, 0.0);
  EXPECT_NEAR(b.measured.recompute, 0.14, 1e-12);
  EXPECT_NEAR(b.measured.head, 0.10, 1e-12);
  EXPECT_NEAR(b.measured.exposed_transfer, 0.02, 1e-12);
  EXPECT_NEAR(b.measured.exposed_optimizer, 0.01, 1e-12);
  EXPECT_NEAR(b.measured.gaps, 1.5 - (1.2 + 0.14 + 0.10 + 0.02 + 0.01), 1e-12);
  EXPECT_NEAR(b.predicted.layers, 1.08, 1e-12);
  EXPECT_NEAR(b.predicted.step, 1.3, 1e-12);
  EXPECT_EQ(breakdown_json(b)["measured"]["host_gaps_s"].get<double>(), b.measured.gaps);
  EXPECT_NE(format_breakdown(b).find("host gaps 30"), std::string::npos) << format_breakdown(b);
  EXPECT_NE(format_breakdown(b).find("embedding 20 (-)"), std::string::npos) << format_breakdown(b);
  EXPECT_EQ(breakdown_json(b)["measured"]["embedding_s"].get<double>(), b.measured.embedding);
  EXPECT_FALSE(step_breakdown(StepResult{}, 1, 1, 1, 0, 0).valid);  // no window figures: nothing to say
}
