// CudaBackend runtime: the --gpu-mem cap, budgets, pinned memory, lanes/events, timing spans,
// deferred errors.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "gpu_test_util.h"
#include "model/model_config.h"

using namespace lt;
using namespace lt::gputest;

namespace {

ModelConfig tiny() {
  ModelConfig c;
  c.hidden = 128, c.layers = 2, c.heads = 2, c.kv_heads = 1, c.head_dim = 64, c.ffn = 256, c.vocab = 500;
  return c;
}

TEST(CudaBackendRuntime, GpuMemCapIsHard) {
  REQUIRE_GPU();
  cudaFree(nullptr);
  size_t free0 = 0, total = 0;
  GT_CUDA(cudaMemGetInfo(&free0, &total));
  const int64_t cap = int64_t(2) << 30;
  CudaBackendOptions o;
  o.gpu_mem_cap = cap;
  CudaBackend be(tiny(), o);
  size_t free1 = 0;
  GT_CUDA(cudaMemGetInfo(&free1, &total));
  // What the backend took (arena + handles + module code) stays within the cap.
  EXPECT_LE(int64_t(free0) - int64_t(free1), cap);
  EXPECT_LE(be.arena_bytes(), cap);
  Allocation a = be.alloc(MemKind::Device, int64_t(1) << 30, "big");
  try {
    Allocation b = be.alloc(MemKind::Device, int64_t(1) << 30, "too.big");
    ADD_FAILURE() << "second 1 GiB allocation should not fit in a 2 GiB cap";
    be.free(b);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit"), std::string::npos) << e.what();
  }
  be.free(a);
  // A lower budget set by the executor is honoured too.
  be.memory().set_budget(MemKind::Device, be.memory().current(MemKind::Device) + (int64_t(1) << 20));
  EXPECT_THROW(be.alloc(MemKind::Device, int64_t(2) << 20, "over.budget"), Error);
}

TEST(CudaBackendRuntime, LanesEventsAndPinnedRoundTrip) {
  REQUIRE_GPU();
  CudaBackendOptions o;
  o.gpu_mem_cap = int64_t(1) << 30;
  CudaBackend be(tiny(), o);
  const int64_t n = int64_t(64) << 20;
  Allocation h1 = be.alloc(MemKind::Pinned, n, "pin.a"), h2 = be.alloc(MemKind::Pinned, n, "pin.b");
  Allocation d = be.alloc(MemKind::Device, n, "dev");
  auto* p1 = static_cast<uint8_t*>(h1.ptr);
  for (int64_t i = 0; i < n; ++i) p1[i] = uint8_t(i * 7 + 3);
  std::memset(h2.ptr, 0, size_t(n));
  be.set_timing(true);
  be.copy(Lane::H2D, d.ptr, h1.ptr, n, {"w.h2d", 0, 0});
  Event e = be.record(Lane::H2D);
  be.wait(Lane::D2H, e);
  be.copy(Lane::D2H, h2.ptr, d.ptr, n, {"ckpt.d2h", 0, 1});
  Event e2 = be.record(Lane::D2H);
  be.host_wait(e2);
  EXPECT_TRUE(be.done(e2));
  EXPECT_EQ(std::memcmp(h1.ptr, h2.ptr, size_t(n)), 0);
  be.synchronize();
  auto spans = be.take_spans();
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].lane, Lane::H2D);
  EXPECT_GE(spans[1].t0, spans[0].t1 - 1e-4);  // the D2H waited for the H2D
  EXPECT_GT(spans[0].t1, spans[0].t0);
  std::printf("[backend] 64 MiB H2D %.1f GB/s, D2H %.1f GB/s\n", double(n) / (spans[0].t1 - spans[0].t0) / 1e9,
              double(n) / (spans[1].t1 - spans[1].t0) / 1e9);
  be.free(h1);
  be.free(h2);
  be.free(d);
  EXPECT_EQ(be.memory().current(MemKind::Pinned), 0);
}

// Backend::grad_add: fp32 accumulation on the device (gradients held on the device, several
// micro-batches), with the sum of squares of the result.
TEST(CudaBackendRuntime, GradAddAccumulatesAndSumsSquares) {
  REQUIRE_GPU();
  CudaBackendOptions o;
  o.gpu_mem_cap = int64_t(1) << 30;
  CudaBackend be(tiny(), o);
  const int64_t n = 300001;
  std::vector<float> a(sz(n)), g(sz(n));
  for (int64_t i = 0; i < n; ++i) {
    a[size_t(i)] = float(i % 17) * 0.25f - 2.0f;
    g[size_t(i)] = float(i % 5) * 0.5f - 1.0f;
  }
  Allocation ha = be.alloc(MemKind::Pinned, n * 4, "pin"), hg = be.alloc(MemKind::Pinned, n * 4, "pin");
  Allocation da = be.alloc(MemKind::Device, n * 4, "dev"), dg = be.alloc(MemKind::Device, n * 4, "dev");
  Allocation ds = be.alloc(MemKind::Device, 8, "dev"), hs = be.alloc(MemKind::Pinned, 8, "pin");
  std::memcpy(ha.ptr, a.data(), size_t(n) * 4);
  std::memcpy(hg.ptr, g.data(), size_t(n) * 4);
  be.copy(Lane::Compute, da.ptr, ha.ptr, n * 4, {"t", -1, -1});
  be.copy(Lane::Compute, dg.ptr, hg.ptr, n * 4, {"t", -1, -1});
  be.fill_zero(Lane::Compute, ds.ptr, 8, {"t", -1, -1});
  be.grad_add(da.ptr, DType::F32, dg.ptr, n, nullptr, {"t", -1, -1});
  be.grad_add(da.ptr, DType::F32, dg.ptr, n, static_cast<double*>(ds.ptr), {"t", -1, -1});
  be.copy(Lane::Compute, ha.ptr, da.ptr, n * 4, {"t", -1, -1});
  be.copy(Lane::Compute, hs.ptr, ds.ptr, 8, {"t", -1, -1});
  be.synchronize();
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float want = (a[size_t(i)] + g[size_t(i)]) + g[size_t(i)];
    ASSERT_EQ(static_cast<float*>(ha.ptr)[i], want) << i;
    ss += double(want) * double(want);
  }
  EXPECT_NEAR(*static_cast<double*>(hs.ptr), ss, 1e-9 * ss);
  for (Allocation* x : {&ha, &hg, &da, &dg, &ds, &hs}) be.free(*x);
}

// The bf16 accumulator (gradients held in bf16): round-to-nearest-even of the fp32 sum, as the CPU
// backend computes it, bit for bit; the sum of squares over the stored bf16 values.
TEST(CudaBackendRuntime, GradAddIntoBf16RoundsToNearestEven) {
  REQUIRE_GPU();
  CudaBackendOptions o;
  o.gpu_mem_cap = int64_t(1) << 30;
  CudaBackend be(tiny(), o);
  const int64_t n = 300001;
  std::vector<bf16_t> a(sz(n));
  std::vector<float> g(sz(n));
  for (int64_t i = 0; i < n; ++i) {
    a[size_t(i)] = f32_to_bf16(float(i % 17) * 0.37f - 3.0f);
    g[size_t(i)] = float(i % 13) * 1.0e-3f - 6.1e-3f + float(i % 7) * 3.3e-6f;  // below bf16's spacing
  }
  Allocation ha = be.alloc(MemKind::Pinned, n * 2, "pin"), hg = be.alloc(MemKind::Pinned, n * 4, "pin");
  Allocation da = be.alloc(MemKind::Device, n * 2, "dev"), dg = be.alloc(MemKind::Device, n * 4, "dev");
  Allocation ds = be.alloc(MemKind::Device, 8, "dev"), hs = be.alloc(MemKind::Pinned, 8, "pin");
  std::memcpy(ha.ptr, a.data(), size_t(n) * 2);
  std::memcpy(hg.ptr, g.data(), size_t(n) * 4);
  be.copy(Lane::Compute, da.ptr, ha.ptr, n * 2, {"t", -1, -1});
  be.copy(Lane::Compute, dg.ptr, hg.ptr, n * 4, {"t", -1, -1});
  be.fill_zero(Lane::Compute, ds.ptr, 8, {"t", -1, -1});
  be.grad_add(da.ptr, DType::BF16, dg.ptr, n, nullptr, {"t", -1, -1});
  be.grad_add(da.ptr, DType::BF16, dg.ptr, n, static_cast<double*>(ds.ptr), {"t", -1, -1});
  be.copy(Lane::Compute, ha.ptr, da.ptr, n * 2, {"t", -1, -1});
  be.copy(Lane::Compute, hs.ptr, ds.ptr, 8, {"t", -1, -1});
  be.synchronize();
  double ss = 0;
  int64_t moved = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bf16_t once = f32_to_bf16(bf16_to_f32(a[size_t(i)]) + g[size_t(i)]);
    const bf16_t want = f32_to_bf16(bf16_to_f32(once) + g[size_t(i)]);
    ASSERT_EQ(static_cast<bf16_t*>(ha.ptr)[i], want) << i;
    moved += want != a[size_t(i)];
    ss += double(bf16_to_f32(want)) * double(bf16_to_f32(want));
  }
  EXPECT_GT(moved, 0);
  EXPECT_NEAR(*static_cast<double*>(hs.ptr), ss, 1e-9 * ss);
  for (Allocation* x : {&ha, &hg, &da, &dg, &ds, &hs}) be.free(*x);
}

TEST(CudaBackendRuntime, BadTokenIdIsReportedAtSynchronize) {
  REQUIRE_GPU();
  CudaBackendOptions o;
  o.gpu_mem_cap = int64_t(1) << 30;
  const ModelConfig c = tiny();
  CudaBackend be(c, o);
  Allocation emb = be.alloc(MemKind::Device, c.vocab * c.hidden * 2, "emb");
  Allocation ids = be.alloc(MemKind::Device, 16, "ids");
  Allocation x = be.alloc(MemKind::Device, 4 * c.hidden * 2, "x");
  const int32_t bad[4] = {1, 2, int32_t(c.vocab), 3};
  cudaMemcpy(ids.ptr, bad, 16, cudaMemcpyHostToDevice);
  be.embed_forward(emb.ptr, static_cast<int32_t*>(ids.ptr), 4, x.ptr, {});
  try {
    be.synchronize();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id"), std::string::npos) << e.what();
  }
  be.clear_error();
  be.synchronize();
  be.free(emb);
  be.free(ids);
  be.free(x);
}

}  // namespace
