// Executor::prepare: the backend is asked to prepare exactly the geometries (batch, seq, segment runs, longest run)
// that the step's layer calls then use, per chunk of every micro-batch, so the one-time builds it triggers (cuDNN's
// attention graphs on the GPU) happen before the timed step and not in it.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "backend/cpu/cpu_backend.h"
#include "exec/executor.h"
#include "exec/optim_hook.h"
#include "exec_test_util.h"

namespace lt {
namespace {

using Shape = std::tuple<int64_t, int64_t, int64_t, int64_t>;  // batch, seq, runs, longest run
Shape shape_of(const DevGeometry& g) { return {g.batch, g.seq, g.runs, g.longest_run}; }

class GeometrySpy : public CpuBackend {
 public:
  using CpuBackend::CpuBackend;
  void prepare_geometry(const DevGeometry& g) override { prepared.insert(shape_of(g)); }
  void layer_forward(int64_t layer, const void* w, const DevGeometry& g, const void* x, void* y, OpLabel l) override {
    used.insert(shape_of(g));
    CpuBackend::layer_forward(layer, w, g, x, y, l);
  }
  std::set<Shape> prepared, used;
};

TEST(ExecPrepare, PreparesTheGeometriesTheStepUses) {
  const auto c = test::tiny_config(Arch::Qwen3, 2, true);
  ExecPlan p = ExecPlan::keep_all(c.layers, 4, 16);
  p.chunk_samples = 3;  // chunks of 3 and 1 samples: two geometries per micro-batch
  GeometrySpy be(c, test::cpu_opts());
  HostState st(be);
  test::random_weights(be.layout(), st, 5);
  Executor ex(c, be, p, st);
  std::vector<test::Batch> bs;
  for (uint64_t seed : {11u, 12u}) bs.push_back(test::random_batch(c, p.batch, p.seq, seed, true));
  std::vector<MicroBatch> mbs;
  for (auto& b : bs) mbs.push_back({b.ids.data(), b.targets.data(), b.positions.data(), b.segments.data()});
  ex.prepare(mbs);
  EXPECT_TRUE(be.used.empty()) << "prepare runs no layer";
  ASSERT_GE(be.prepared.size(), 2u);
  for (const auto& s : be.prepared) EXPECT_GT(std::get<2>(s), 0) << "packed rows carry their run count";
  ex.train_step(mbs);
  EXPECT_EQ(be.prepared, be.used);
}

}  // namespace
}  // namespace lt
