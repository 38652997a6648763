// The 8-bit AdamW step as a backend op (Backend::adamw_step_q8): cpu::adamw_step_q8, fed device_scalars and
// device_q8_maps, is the CPU optimizer's scalar 8-bit path (optim::adamw_q8) bit for bit — masters, codes and block
// scales — over several consecutive steps, on fp32 and split masters, through CpuBackend too. Blocks of every kind:
// all zero, below FLT_MIN, large, spread over many decades, a partial last block. (The CUDA kernel against this
// reference: tests/gpu/test_adamw_q8_step.cpp.)
#include <gtest/gtest.h>

#include <cfloat>
#include <cstring>

#include "adamw_q8_test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "exec/device_q8.h"
#include "exec/optim_hook.h"
#include "exec_test_util.h"

namespace lt {
namespace {

constexpr int kSteps = 5;

void op_step(const AdamWStepScalars& d, test::Q8State& st, const float* g, int64_t n) {
  const bool split = st.p.empty();
  cpu::adamw_step_q8(d, device_q8_maps(), split ? nullptr : st.p.data(), split ? st.hi.data() : nullptr,
                     split ? st.lo.data() : nullptr, g, st.mq.data(), st.vq.data(), st.ms.data(), st.vs.data(), n);
}

// Steps the optimizer's path (on isa) and the op from the same state, comparing all state after every step.
void expect_op_matches(int64_t n, bool split, optim::Isa isa) {
  const test::Q8Case c = test::make_q8_case(n, kSteps, uint32_t(n));
  test::Q8State ref = split ? test::to_split(c.init) : c.init, op = ref;
  for (int t = 1; t <= kSteps; ++t) {
    const optim::AdamWScalars s = test::q8_scalars(t);
    const float* g = c.g[size_t(t - 1)].data();
    test::optim_q8_step(isa, s, ref, g, n);
    op_step(device_scalars(s), op, g, n);
    ASSERT_EQ(test::q8_diff(op, ref), "") << "n " << n << " split " << split << " isa " << optim::isa_name(isa)
                                          << " step " << t;
  }
  // The state moved: the comparison is not between untouched arrays.
  const test::Q8State init = split ? test::to_split(c.init) : c.init;
  EXPECT_FALSE(test::same_bits(op.mq, init.mq));
  EXPECT_FALSE(test::same_bits(op.vq, init.vq));
  EXPECT_FALSE(test::same_bits(op.ms, init.ms));
  if (split) EXPECT_FALSE(test::same_bits(op.lo, init.lo));
  else EXPECT_FALSE(test::same_bits(op.p, init.p));
}

const int64_t kSizes[] = {77, 3 * 256 + 77, 6 * 256 + 77, 12 * 256};

TEST(ExecQ8Step, CpuOpIsTheOptimizersScalarPathBitForBit) {
  for (int64_t n : kSizes) expect_op_matches(n, false, optim::Isa::Scalar);
}

TEST(ExecQ8Step, CpuOpOnTheSplitMasterIsJoinUpdateSplit) {
  for (int64_t n : kSizes) expect_op_matches(n, true, optim::Isa::Scalar);
}

// The AVX2 path performs the scalar path's operations (optim/adamw_kernels.h), so the op matches it too.
TEST(ExecQ8Step, CpuOpIsTheOptimizersAvx2PathBitForBit) {
  if (!optim::isa_supported(optim::Isa::Avx2)) GTEST_SKIP() << "no AVX2";
  for (int64_t n : kSizes)
    for (bool split : {false, true}) expect_op_matches(n, split, optim::Isa::Avx2);
}

// The special blocks do what quant8.h says after a step: an all-zero block stays scale 0 / code 0, a block below
// FLT_MIN keeps its (subnormal) scale with all magnitudes 0.
TEST(ExecQ8Step, ZeroAndSubnormalBlocks) {
  const int64_t n = 6 * 256 + 77;
  const test::Q8Case c = test::make_q8_case(n, 1, 3);
  test::Q8State op = c.init;
  op_step(device_scalars(test::q8_scalars(1)), op, c.g[0].data(), n);
  // Block 1: all zero; block 2: below FLT_MIN (test::make_q8_case's kinds).
  EXPECT_EQ(op.ms[1], 0.0f);
  EXPECT_EQ(op.vs[1], 0.0f);
  EXPECT_GT(op.ms[2], 0.0f);
  EXPECT_LT(op.ms[2], FLT_MIN);
  EXPECT_LT(op.vs[2], FLT_MIN);
  for (int64_t i = 256; i < 3 * 256; ++i) {
    EXPECT_EQ(op.mq[size_t(i)] & 0x7f, 0) << i;  // 0x80 (-0) for a negative m
    EXPECT_EQ(op.vq[size_t(i)], 0) << i;
  }
}

// The maps the backend reads are the optimizer's.
TEST(ExecQ8Step, DeviceMapsAreTheOptimizersMaps) {
  const Q8Maps& d = device_q8_maps();
  const optim::QuantMap* q[2] = {&optim::signed_dynamic_map(), &optim::unsigned_dynamic_map()};
  const Q8Map* b[2] = {&d.m, &d.v};
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(b[k]->is_signed, q[k]->is_signed ? 1 : 0);
    EXPECT_EQ(b[k]->mag_bits, q[k]->mag_bits);
    EXPECT_EQ(std::memcmp(b[k]->decode, q[k]->decode, sizeof(b[k]->decode)), 0);
    EXPECT_EQ(std::memcmp(b[k]->top, q[k]->top, sizeof(b[k]->top)), 0);
    EXPECT_EQ(std::memcmp(b[k]->inv_step, q[k]->inv_step, sizeof(b[k]->inv_step)), 0);
    EXPECT_EQ(std::memcmp(b[k]->code_off, q[k]->code_off, sizeof(b[k]->code_off)), 0);
  }
  EXPECT_EQ(&device_q8_maps(), &d);  // converted once
}

// device_scalars carries the 8-bit path's constants, and the op reads them: with either left at its default the
// result differs (so the bit-identity tests above would catch a dropped field).
TEST(ExecQ8Step, TheEightBitScalarsReachTheOp) {
  const optim::AdamWScalars s = test::q8_scalars(2);
  const AdamWStepScalars d = device_scalars(s);
  EXPECT_EQ(d.beta1, s.beta1);
  EXPECT_EQ(d.inv_bc2_sqrt, s.inv_bc2_sqrt);
  const int64_t n = 3 * 256 + 77;
  const test::Q8Case c = test::make_q8_case(n, 1, 9);
  test::Q8State ref = c.init;
  op_step(d, ref, c.g[0].data(), n);
  AdamWStepScalars no_beta1 = d, no_bc2 = d;
  no_beta1.beta1 = AdamWStepScalars{}.beta1;
  no_bc2.inv_bc2_sqrt = AdamWStepScalars{}.inv_bc2_sqrt;
  for (const AdamWStepScalars* w : {&no_beta1, &no_bc2}) {
    test::Q8State op = c.init;
    op_step(*w, op, c.g[0].data(), n);
    EXPECT_NE(test::q8_diff(op, ref), "");
  }
}

// Through the backend interface: CpuBackend enqueues the op on its compute lane; fp32 and split masters.
TEST(ExecQ8Step, CpuBackendRunsTheOp) {
  CpuBackend be(test::tiny_config(), test::cpu_opts());
  const int64_t n = 6 * 256 + 77;
  const test::Q8Case c = test::make_q8_case(n, kSteps, 21);
  for (bool split : {false, true}) {
    test::Q8State ref = split ? test::to_split(c.init) : c.init, op = ref;
    for (int t = 1; t <= kSteps; ++t) {
      const optim::AdamWScalars s = test::q8_scalars(t);
      const float* g = c.g[size_t(t - 1)].data();
      test::optim_q8_step(optim::Isa::Scalar, s, ref, g, n);
      {
        // A temporary copy of the maps: the enqueued op must not depend on the caller's copy staying alive.
        const Q8Maps maps = device_q8_maps();
        be.adamw_step_q8(device_scalars(s), maps, split ? nullptr : op.p.data(), split ? op.hi.data() : nullptr,
                         split ? op.lo.data() : nullptr, g, op.mq.data(), op.vq.data(), op.ms.data(), op.vs.data(),
                         n, OpLabel{"q8", -1, 0});
      }
      be.synchronize();
      ASSERT_EQ(test::q8_diff(op, ref), "") << "split " << split << " step " << t;
    }
  }
  // The master is fp32 or split, not both.
  test::Q8State st = test::to_split(c.init);
  std::vector<float> p = c.init.p;
  EXPECT_THROW(be.adamw_step_q8(device_scalars(test::q8_scalars(1)), device_q8_maps(), p.data(), st.hi.data(),
                                st.lo.data(), c.g[0].data(), st.mq.data(), st.vq.data(), st.ms.data(), st.vs.data(), n,
                                OpLabel{}),
               Error);
}

}  // namespace
}  // namespace lt
