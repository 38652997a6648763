// The 8-bit AdamW step on the GPU (Backend::adamw_step_q8): the CUDA kernel gives cpu::adamw_step_q8's masters,
// codes and block scales bit for bit (and so the CPU optimizer's scalar 8-bit path, tests/exec/
// test_adamw_q8_step.cpp) over several consecutive steps, on fp32 and split masters, past the kernel's grid-stride
// bound with a partial last block; and CudaBackend runs it on its compute lane.
#include <gtest/gtest.h>

#include <cstring>

#include "../exec/adamw_q8_test_util.h"
#include "../exec/exec_test_util.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"
#include "exec/device_q8.h"
#include "exec/optim_hook.h"
#include "gpu_test_util.h"

namespace lt {
namespace {

using gputest::DevBuf;

cuda::AdamWQ8Consts q8_consts(const AdamWStepScalars& d) {
  return {d.beta1, d.w1, d.beta2, d.w2, d.eps, d.inv_bc2_sqrt, d.decay, d.neg_step_size, d.grad_scale};
}

cuda::Q8MapsConsts q8_map_consts(const Q8Maps& m) {
  static_assert(sizeof(cuda::Q8MapsConsts) == sizeof(Q8Maps), "the kernel's maps mirror lt::Q8Maps");
  cuda::Q8MapsConsts c;
  std::memcpy(&c, &m, sizeof(c));
  return c;
}

void cpu_step(const AdamWStepScalars& d, test::Q8State& st, const float* g, int64_t n) {
  const bool split = st.p.empty();
  cpu::adamw_step_q8(d, device_q8_maps(), split ? nullptr : st.p.data(), split ? st.hi.data() : nullptr,
                     split ? st.lo.data() : nullptr, g, st.mq.data(), st.vq.data(), st.ms.data(), st.vs.data(), n);
}

// The state on the device.
struct DevQ8 {
  DevBuf p, hi, lo, mq, vq, ms, vs;
  explicit DevQ8(const test::Q8State& s)
      : p(gputest::up(s.p)), hi(gputest::up(s.hi)), lo(gputest::up(s.lo)), mq(gputest::up(s.mq)),
        vq(gputest::up(s.vq)), ms(gputest::up(s.ms)), vs(gputest::up(s.vs)) {}
  bool split() const { return hi.bytes > 0; }
  float* fp() const { return split() ? nullptr : p.as<float>(); }
  uint16_t* fhi() const { return split() ? hi.as<uint16_t>() : nullptr; }
  uint16_t* flo() const { return split() ? lo.as<uint16_t>() : nullptr; }
  test::Q8State down(const test::Q8State& like) const {
    test::Q8State r;
    r.p = gputest::down<float>(p.p, like.p.size());
    r.hi = gputest::down<uint16_t>(hi.p, like.hi.size());
    r.lo = gputest::down<uint16_t>(lo.p, like.lo.size());
    r.mq = gputest::down<uint8_t>(mq.p, like.mq.size());
    r.vq = gputest::down<uint8_t>(vq.p, like.vq.size());
    r.ms = gputest::down<float>(ms.p, like.ms.size());
    r.vs = gputest::down<float>(vs.p, like.vs.size());
    return r;
  }
};

constexpr int kSteps = 4;

TEST(GpuQ8Step, KernelIsTheCpuReferenceBitForBit) {
  REQUIRE_GPU();
  // Past the grid-stride bound (132 * 16 blocks of 256), a partial last block.
  const int64_t n = (int64_t(1) << 20) + 77;
  const test::Q8Case c = test::make_q8_case(n, kSteps, 17);
  const cuda::Q8MapsConsts maps = q8_map_consts(device_q8_maps());
  std::vector<DevBuf> dg;
  for (const auto& g : c.g) dg.push_back(gputest::up(g));
  for (bool split : {false, true}) {
    test::Q8State ref = split ? test::to_split(c.init) : c.init;
    DevQ8 dev(ref);
    for (int t = 1; t <= kSteps; ++t) {
      const AdamWStepScalars d = device_scalars(test::q8_scalars(t));
      cpu_step(d, ref, c.g[size_t(t - 1)].data(), n);
      cuda::adamw_step_q8(q8_consts(d), maps, dev.fp(), dev.fhi(), dev.flo(), dg[size_t(t - 1)].as<float>(),
                          dev.mq.as<uint8_t>(), dev.vq.as<uint8_t>(), dev.ms.as<float>(), dev.vs.as<float>(), n,
                          nullptr);
      GT_CUDA(cudaDeviceSynchronize());
      ASSERT_EQ(test::q8_diff(dev.down(ref), ref), "") << "split " << split << " step " << t;
    }
    const test::Q8State init = split ? test::to_split(c.init) : c.init;
    EXPECT_FALSE(test::same_bits(ref.mq, init.mq));
    EXPECT_FALSE(test::same_bits(ref.vs, init.vs));
  }
}

// Small sizes: less than one block, exactly whole blocks, one element past.
TEST(GpuQ8Step, KernelSmallSizes) {
  REQUIRE_GPU();
  const cuda::Q8MapsConsts maps = q8_map_consts(device_q8_maps());
  for (int64_t n : {int64_t(1), int64_t(77), int64_t(256), int64_t(6 * 256 + 1)}) {
    const test::Q8Case c = test::make_q8_case(n, 2, uint32_t(n));
    for (bool split : {false, true}) {
      test::Q8State ref = split ? test::to_split(c.init) : c.init;
      DevQ8 dev(ref);
      for (int t = 1; t <= 2; ++t) {
        const AdamWStepScalars d = device_scalars(test::q8_scalars(t));
        cpu_step(d, ref, c.g[size_t(t - 1)].data(), n);
        DevBuf g = gputest::up(c.g[size_t(t - 1)]);
        cuda::adamw_step_q8(q8_consts(d), maps, dev.fp(), dev.fhi(), dev.flo(), g.as<float>(), dev.mq.as<uint8_t>(),
                            dev.vq.as<uint8_t>(), dev.ms.as<float>(), dev.vs.as<float>(), n, nullptr);
        GT_CUDA(cudaDeviceSynchronize());
        ASSERT_EQ(test::q8_diff(dev.down(ref), ref), "") << "n " << n << " split " << split << " step " << t;
      }
    }
  }
}

// Through the backend interface: CudaBackend enqueues the kernel on its compute lane.
TEST(GpuQ8Step, CudaBackendRunsTheOp) {
  REQUIRE_GPU();
  CudaBackendOptions o;
  o.gpu_mem_cap = int64_t(1) << 30;
  CudaBackend be(test::tiny_config(), o);
  const int64_t n = 40 * 256 + 77;
  const test::Q8Case c = test::make_q8_case(n, kSteps, 23);
  for (bool split : {false, true}) {
    test::Q8State ref = split ? test::to_split(c.init) : c.init;
    DevQ8 dev(ref);
    for (int t = 1; t <= kSteps; ++t) {
      const AdamWStepScalars d = device_scalars(test::q8_scalars(t));
      cpu_step(d, ref, c.g[size_t(t - 1)].data(), n);
      DevBuf g = gputest::up(c.g[size_t(t - 1)]);
      be.adamw_step_q8(d, device_q8_maps(), dev.fp(), dev.fhi(), dev.flo(), g.as<float>(), dev.mq.as<uint8_t>(),
                       dev.vq.as<uint8_t>(), dev.ms.as<float>(), dev.vs.as<float>(), n, OpLabel{"q8", -1, 0});
      be.synchronize();
      ASSERT_EQ(test::q8_diff(dev.down(ref), ref), "") << "split " << split << " step " << t;
    }
  }
}

}  // namespace
}  // namespace lt
