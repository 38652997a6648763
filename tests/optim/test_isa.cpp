// The scalar, AVX2 and AVX-512 paths give bit-identical results (same IEEE ops in the same order), except
// the AVX-512 8-bit update's square root and division, which come from hardware estimates: there the
// moments (codes and scales) are still bit-identical and the masters are within the estimates' error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "helpers.h"
#include "optim/adamw_kernels.h"
#include "optim/aligned_buffer.h"
#include "optim/throughput.h"

using namespace lt::optim;
using namespace lt::optim::test;

namespace {

struct IsaRun {
  std::vector<float> p, m, v, ms, vs;
  std::vector<uint8_t> mq, vq;
  std::vector<lt::bf16_t> out;
};


IsaRun run(Isa isa, bool q8, int64_t n, int steps) {
  IsaRun r;
  r.p = randn(n, 11);
  r.m.assign(size_t(n), 0);
  r.v.assign(size_t(n), 0);
  r.mq.assign(size_t(n), 0);
  r.vq.assign(size_t(n), 0);
  int64_t blocks = (n + kQ8Block - 1) / kQ8Block;
  r.ms.assign(size_t(blocks), 0);
  r.vs.assign(size_t(blocks), 0);
  r.out.assign(size_t(n), 0);
  // The bf16 copy in a 64-byte aligned buffer, as pinned memory is.
  AlignedBuffer<lt::bf16_t> out(static_cast<size_t>(n));
  for (int t = 1; t <= steps; ++t) {
    std::vector<float> g = randn(n, 100 + t, t % 2 ? 0.01f : 3.0f);
    g[0] = 0;  // exact zeros and tiny values exercise the map's bottom
    if (n > 5) g[5] = 1e-30f;
    AdamWScalars s = make_adamw_scalars(1e-3, 0.01, 0.9, 0.999, 1e-8, t, t == 2 ? 0.25f : 1.0f);
    if (q8)
      adamw_q8(isa, s, r.p.data(), g.data(), r.mq.data(), r.vq.data(), r.ms.data(), r.vs.data(), out.data(), n);
    else
      adamw_f32(isa, s, r.p.data(), g.data(), r.m.data(), r.v.data(), out.data(), n);
  }
  std::copy(out.data(), out.data() + n, r.out.begin());
  return r;
}

void expect_same_moments(const IsaRun& a, const IsaRun& b, const char* what) {
  EXPECT_EQ(a.m, b.m) << what;
  EXPECT_EQ(a.v, b.v) << what;
  EXPECT_EQ(a.mq, b.mq) << what;
  EXPECT_EQ(a.vq, b.vq) << what;
  EXPECT_EQ(a.ms, b.ms) << what;
  EXPECT_EQ(a.vs, b.vs) << what;
}

void expect_same(const IsaRun& a, const IsaRun& b, const char* what) {
  EXPECT_EQ(a.p, b.p) << what;
  expect_same_moments(a, b, what);
  EXPECT_EQ(a.out, b.out) << what;
}

}  // namespace

TEST(Isa, PathsAreBitIdentical) {
  for (bool q8 : {false, true})
    for (int64_t n : {int64_t(1), int64_t(15), int64_t(256), int64_t(1000), int64_t(4096 + 77)}) {
      IsaRun ref = run(Isa::Scalar, q8, n, 5);
      std::string tag = std::string(q8 ? "q8" : "f32") + " n=" + std::to_string(n);
      if (isa_supported(Isa::Avx2)) expect_same(ref, run(Isa::Avx2, q8, n, 5), ("avx2 " + tag).c_str());
      if (!isa_supported(Isa::Avx512)) continue;
      if (q8)  // the moments depend on the gradients only; masters: Isa.Q8Avx512WithinEstimateError
        expect_same_moments(ref, run(Isa::Avx512, q8, n, 5), ("avx512 " + tag).c_str());
      else
        expect_same(ref, run(Isa::Avx512, q8, n, 5), ("avx512 " + tag).c_str());
    }
  if (!isa_supported(Isa::Avx512)) GTEST_SKIP() << "AVX-512 not available: only the paths present were compared";
}

// The AVX-512 8-bit update takes sqrt and 1/x from vrsqrt14ps / vrcp14ps (relative error < 2^-14 each):
// from the same state, each step's change of the master is within 2.5e-4 of the exact (scalar) path's,
// the moments are bit-identical and the bf16 copy is the rounding of the AVX-512 master. Steps run from
// the scalar path's state each time, with clipping (step 2), zeros and tiny gradients, 5 steps.
TEST(Isa, Q8Avx512WithinEstimateError) {
  if (!q8_avx512_kernel_available()) GTEST_SKIP() << "the AVX-512 8-bit kernel (AVX-512 + VBMI) is not available";
  const int64_t n = 4096 + 77;
  const auto N = static_cast<size_t>(n), B = static_cast<size_t>((n + kQ8Block - 1) / kQ8Block);
  std::vector<float> p = randn(n, 11), ms(B, 0.0f), vs(B, 0.0f);
  std::vector<uint8_t> mq(N, 0), vq(N, 0);
  AlignedBuffer<lt::bf16_t> out(N), out_ref(N);
  double worst = 0;
  for (int t = 1; t <= 5; ++t) {
    std::vector<float> g = randn(n, 100 + t, t % 2 ? 0.01f : 3.0f);
    g[0] = 0;
    g[5] = 1e-30f;
    const AdamWScalars s = make_adamw_scalars(1e-3, 0.01, 0.9, 0.999, 1e-8, t, t == 2 ? 0.25f : 1.0f);
    std::vector<float> p_ref = p, ms_ref = ms, vs_ref = vs;
    std::vector<uint8_t> mq_ref = mq, vq_ref = vq;
    adamw_q8(Isa::Scalar, s, p_ref.data(), g.data(), mq_ref.data(), vq_ref.data(), ms_ref.data(), vs_ref.data(),
             out_ref.data(), n);
    std::vector<float> p_before = p;
    adamw_q8(Isa::Avx512, s, p.data(), g.data(), mq.data(), vq.data(), ms.data(), vs.data(), out.data(), n);
    ASSERT_EQ(mq, mq_ref) << "step " << t;
    ASSERT_EQ(vq, vq_ref) << "step " << t;
    ASSERT_EQ(ms, ms_ref) << "step " << t;
    ASSERT_EQ(vs, vs_ref) << "step " << t;
    for (size_t i = 0; i < N; ++i) {
      const float step = p_ref[i] - p_before[i] * s.decay;  // the exact path's Adam step (after decay)
      const float tol = 2.5e-4f * std::fabs(step) + 2.0f * std::nextafter(std::fabs(p_ref[i]), INFINITY) -
                        2.0f * std::fabs(p_ref[i]);
      ASSERT_LE(std::fabs(p[i] - p_ref[i]), tol) << "step " << t << " element " << i;
      ASSERT_EQ(out.data()[i], lt::f32_to_bf16(p[i])) << "step " << t << " element " << i;
      const float ulp = std::nextafter(std::fabs(p_ref[i]), INFINITY) - std::fabs(p_ref[i]);
      if (std::fabs(step) > 65536 * ulp)  // steps far above the masters' rounding: the estimates' own error
        worst = std::max(worst, double(std::fabs(p[i] - p_ref[i]) / std::fabs(step)));
    }
    p = p_ref;  // next step from the exact path's state
  }
  EXPECT_GT(worst, 0.0) << "the AVX-512 path should differ from the exact one somewhere (estimates in use)";
  std::printf("[q8 avx512] worst |dp| / |step| vs the exact path (steps > 65536 ulp): %.2e (bound 2.5e-4)\n",
              worst);
}

// The AVX-512 8-bit kernel folds the step size into the denominator (denom / nss): a zero step size (lr 0,
// as at the start of a warm-up) must leave the masters exactly as they are, whatever the gradients,
// and a second moment that overflows to +inf (an unclipped gradient above ~6e20) must give a zero step,
// as on the exact path, not NaN.
TEST(Isa, Q8Avx512ZeroStepSizeAndInfiniteSecondMoment) {
  if (!q8_avx512_kernel_available()) GTEST_SKIP() << "the AVX-512 8-bit kernel (AVX-512 + VBMI) is not available";
  const int64_t n = 2 * kQ8Block;
  const auto N = static_cast<size_t>(n);
  for (double lr : {0.0, 5e-39, 1e-3}) {  // 5e-39: lr / bias correction overflows the folded quotient
    std::vector<float> p = randn(n, 3), g = randn(n, 4, 0.1f), ms(2, 0.0f), vs(2, 0.0f);
    g[7] = 3e21f;  // (1 - beta2) * g * g overflows: v = +inf in block 0
    std::vector<uint8_t> mq(N, 0), vq(N, 0);
    AlignedBuffer<lt::bf16_t> out(N);
    const std::vector<float> p0 = p;
    std::vector<float> p_ref = p, ms_ref = ms, vs_ref = vs;
    std::vector<uint8_t> mq_ref = mq, vq_ref = vq;
    const AdamWScalars s = make_adamw_scalars(lr, 0.1, 0.9, 0.999, 1e-8, 1, 1.0f);
    adamw_q8(Isa::Avx512, s, p.data(), g.data(), mq.data(), vq.data(), ms.data(), vs.data(), out.data(), n);
    adamw_q8(Isa::Scalar, s, p_ref.data(), g.data(), mq_ref.data(), vq_ref.data(), ms_ref.data(), vs_ref.data(),
             nullptr, n);
    EXPECT_EQ(mq, mq_ref) << "lr " << lr;
    EXPECT_EQ(vq, vq_ref) << "lr " << lr;
    EXPECT_EQ(ms, ms_ref) << "lr " << lr;
    EXPECT_EQ(vs, vs_ref) << "lr " << lr;
    EXPECT_EQ(p[7], p0[7] * s.decay) << "lr " << lr << ": v = inf gives no step";
    EXPECT_EQ(p[7], p_ref[7]) << "lr " << lr;
    if (lr < 1e-30) {
      for (size_t i = 0; i < N; ++i) {
        ASSERT_EQ(p[i], p0[i]) << "lr " << lr << " must leave element " << i << " as it is";
        ASSERT_EQ(p[i], p_ref[i]) << "lr " << lr << " element " << i;
      }
    }
  }
}

// Blocks whose scale falls below FLT_MIN (moments decaying under zero gradients for hundreds of steps):
// 1 / absmax would overflow, so block_inv gives 0 and every path stores the block as zeros. All paths
// agree on codes and scales, and in ordinary blocks a positive v never gets code 0.
TEST(Isa, TinyBlockScalesAgreeAcrossPaths) {
  const int64_t n = 3 * kQ8Block;
  const auto N = static_cast<size_t>(n);
  std::vector<uint8_t> mq0(N), vq0(N);
  for (size_t i = 0; i < N; ++i) mq0[i] = uint8_t(i * 37 + 11), vq0[i] = uint8_t(1 + i % 255);
  // Block 0: denormal scales, zero gradients; block 1: denormal scales, normal gradients; block 2: normal.
  const std::vector<float> ms0 = {2e-39f, 2e-39f, 0.01f}, vs0 = {2e-39f, 2e-39f, 1e-4f};
  std::vector<float> g = randn(n, 5, 0.01f);
  std::fill(g.begin(), g.begin() + kQ8Block, 0.0f);
  IsaRun ref;
  bool have_ref = false;
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (!isa_supported(isa)) continue;
    IsaRun r;
    r.p = randn(n, 6);
    r.mq = mq0, r.vq = vq0, r.ms = ms0, r.vs = vs0;
    AlignedBuffer<lt::bf16_t> out(N);
    const AdamWScalars s = make_adamw_scalars(1e-4, 0.0, 0.9, 0.999, 1e-8, 50, 1.0f);
    adamw_q8(isa, s, r.p.data(), g.data(), r.mq.data(), r.vq.data(), r.ms.data(), r.vs.data(), out.data(), n);
    for (int64_t i = 0; i < kQ8Block; ++i) {
      ASSERT_EQ(r.mq[size_t(i)] & 0x7f, 0) << isa_name(isa) << ": block 0 (scale below FLT_MIN) is stored as zeros (+-0), " << i;
      ASSERT_EQ(r.vq[size_t(i)], 0) << isa_name(isa) << ": block 0, element " << i;
    }
    for (int64_t i = 2 * kQ8Block; i < n; ++i)
      ASSERT_NE(r.vq[size_t(i)], 0) << isa_name(isa) << ": a positive v in an ordinary block got code 0, " << i;
    if (!have_ref) {
      ref = r;
      have_ref = true;
    } else {
      expect_same_moments(ref, r, isa_name(isa));
    }
  }
}

// The bf16 copy with ordinary stores (an output that is not 64-byte aligned: no non-temporal stores)
// equals the aligned one, and the masters and moments are the same.
TEST(Isa, Q8UnalignedCopyMatchesAligned) {
  const int64_t n = 4 * kQ8Block + 19;
  const auto N = static_cast<size_t>(n), B = static_cast<size_t>((n + kQ8Block - 1) / kQ8Block);
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (!isa_supported(isa)) continue;
    for (int64_t offset : {int64_t(1), int64_t(3), int64_t(31)}) {
      AlignedBuffer<lt::bf16_t> aligned(N), shifted(N + 64);
      std::vector<float> pa = randn(n, 8), pb = pa, msa(B, 0.0f), vsa(B, 0.0f), msb = msa, vsb = vsa;
      std::vector<uint8_t> mqa(N, 0), vqa(N, 0), mqb = mqa, vqb = vqa;
      for (int t = 1; t <= 2; ++t) {
        const std::vector<float> g = randn(n, 30 + t, 0.1f);
        const AdamWScalars s = make_adamw_scalars(1e-3, 0.01, 0.9, 0.999, 1e-8, t, 1.0f);
        adamw_q8(isa, s, pa.data(), g.data(), mqa.data(), vqa.data(), msa.data(), vsa.data(), aligned.data(), n);
        adamw_q8(isa, s, pb.data(), g.data(), mqb.data(), vqb.data(), msb.data(), vsb.data(),
                 shifted.data() + offset, n);
      }
      const std::string what = std::string(isa_name(isa)) + " offset " + std::to_string(offset);
      EXPECT_EQ(pa, pb) << what;
      EXPECT_EQ(mqa, mqb) << what;
      EXPECT_EQ(vqa, vqb) << what;
      for (size_t i = 0; i < N; ++i) ASSERT_EQ(aligned.data()[i], shifted.data()[size_t(offset) + i]) << what << " " << i;
    }
  }
}

TEST(Isa, SumOfSquaresAgrees) {
  std::vector<float> g = randn(10007, 5);
  double ref = 0;
  for (float x : g) ref += double(x) * double(x);
  for (Isa i : {Isa::Scalar, Isa::Avx2, Isa::Avx512})
    if (isa_supported(i)) {
      EXPECT_NEAR(sumsq(i, g.data(), int64_t(g.size())), ref, 1e-12 * ref) << isa_name(i);
    }
}

TEST(Isa, ParseAndResolve) {
  EXPECT_EQ(parse_isa("avx2"), Isa::Avx2);
  EXPECT_THROW(parse_isa("sse9"), lt::Error);
  EXPECT_EQ(resolve_isa(Isa::Scalar), Isa::Scalar);
  EXPECT_NE(resolve_isa(Isa::Auto), Isa::Auto);
}

// The bf16 copy equals lt::f32_to_bf16 of the new master for special values too: quiet and signalling
// NaNs with payloads, infinities, zeros, denormals and exact rounding ties (lr 0 keeps p as it is).
TEST(Isa, Bf16CopyOfSpecialValues) {
  std::vector<uint32_t> bits = {0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fbfffffu, 0xff800100u, 0x7f800000u,
                                0xff800000u, 0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x3f808000u,
                                0x3f818000u, 0x3f80ffffu, 0xbf808001u, 0x7f7fffffu, 0x3f800000u};
  const int64_t n = 512 + 37;  // two full 8-bit blocks and a partial one; vector bodies and tails
  for (bool q8 : {false, true})
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
      if (!isa_supported(isa)) continue;
      const auto N = static_cast<size_t>(n);
      std::vector<float> p(N), g(N, 0.0f), m(N, 0.0f), v(N, 0.0f);
      for (int64_t i = 0; i < n; ++i) {
        uint32_t b = bits[size_t(i) % bits.size()];
        std::memcpy(&p[size_t(i)], &b, 4);
      }
      std::vector<uint8_t> mq(N, 0), vq(N, 0);
      std::vector<float> ms(3, 0.0f), vs(3, 0.0f);
      AlignedBuffer<lt::bf16_t> out(N);
      AdamWScalars s = make_adamw_scalars(0.0, 0.0, 0.9, 0.999, 1e-8, 1, 1.0f);
      if (q8)
        adamw_q8(isa, s, p.data(), g.data(), mq.data(), vq.data(), ms.data(), vs.data(), out.data(), n);
      else
        adamw_f32(isa, s, p.data(), g.data(), m.data(), v.data(), out.data(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(out.data()[i], lt::f32_to_bf16(p[size_t(i)]))
            << isa_name(isa) << (q8 ? " q8" : " f32") << " element " << i << " bits " << std::hex
            << bits[size_t(i) % bits.size()];
    }
}

// The profile's optimizer rate (the trainer's split-master fused kernels where the ISA has them, else the
// fp32-master ones): a finite positive rate for both moment formats, threads and sizes that do not divide.
TEST(OptimThroughput, MeasuredRatesArePositive) {
  for (bool q8 : {false, true})
    for (int threads : {1, 3}) {
      const double r = lt::optim::measure_adamw_rate(q8, threads, (1 << 16) + 77);
      EXPECT_TRUE(std::isfinite(r) && r > 0) << (q8 ? "8-bit" : "fp32") << " " << threads << " threads: " << r;
    }
}

// The optimizer's own rate (its pool over split-master units, the figure the profile records): finite, positive,
// and of the kernels' order (the pool adds scheduling, not a different amount of memory traffic).
// One worker each and the best of three: with another test process on a 2-core machine, two workers that wait for
// each other measured the pool at under a quarter of the kernels (a descheduled worker stalls the other).
TEST(OptimThroughput, OptimizerRateIsOfTheKernelsOrder) {
  auto best_of_3 = [](auto measure) { return std::max({measure(), measure(), measure()}); };
  for (bool q8 : {false, true}) {
    const double pool = best_of_3([&] { return lt::optim::measure_optimizer_rate(q8, 1, 1 << 20); });
    const double kernels = best_of_3([&] { return lt::optim::measure_adamw_rate(q8, 1, 1 << 24); });
    EXPECT_TRUE(std::isfinite(pool) && pool > 0) << (q8 ? "8-bit" : "fp32") << ": " << pool;
    EXPECT_GT(pool, kernels / 4) << (q8 ? "8-bit" : "fp32");
    EXPECT_LT(pool, kernels * 4) << (q8 ? "8-bit" : "fp32");
  }
}
