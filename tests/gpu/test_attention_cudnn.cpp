// cuDNN's fused flash attention (attention_cudnn.h) against the fp32 CPU reference, forward and backward, at
// the head dims of the supported models (64, 128, 256), GQA groups 1..7, one-row and multi-tile sequences,
// unpacked and packed rows (runs of equal segment ids: cuDNN's ragged layout), with the deterministic and the
// atomic backward; the deterministic one must repeat its bits. On a build
// with the cuDNN frontend these shapes must all be taken (usable), not silently left to our kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "attn_test_util.h"
#include "backend/cuda/attention/attention_cudnn.h"
#include "backend/cuda/kernel_options.h"
#include "backend/cuda/kernels.h"
#include "gpu_test_util.h"

using namespace lt;
using namespace lt::gputest;

namespace {

class CudnnAttnTest : public ::testing::TestWithParam<AttnCase> {};

struct CudnnRun {
  std::vector<float> o, stats, dq, dk, dv;
  std::vector<float> own_dq, own_dk, own_dv;  // packed: our backward after cuDNN's forward (same statistics)
};

// Packed rows as the executor describes them: runs of equal ids within each sample, counted on the host.
cuda::PackedRows packed_rows(const AttnCase& ac, const AttnRef& r) {
  cuda::PackedRows p;
  for (int64_t i = 0, start = 0; i < ac.tokens(); ++i) {
    if (i + 1 < ac.tokens() && (i + 1) % ac.seq != 0 && r.seg[sz(i + 1)] == r.seg[sz(i)]) continue;
    ++p.runs;
    p.longest = std::max(p.longest, i + 1 - start);
    start = i + 1;
  }
  return p;
}

CudnnRun run_cudnn(const AttnCase& ac, const AttnRef& r) {
  const int64_t T = ac.tokens(), H = ac.heads;
  const cuda::AttnDims d{ac.batch, ac.seq, H, ac.kv_heads, ac.hd, r.scale};
  DevBuf seg = up(r.seg), index(sz(cuda::packed_index_ints(d.tokens())) * 4);
  cuda::PackedRows pr = packed_rows(ac, r);
  pr.segments = seg.as<int32_t>();
  pr.index = index.as<int32_t>();
  const cuda::PackedRows* p = ac.segments ? &pr : nullptr;
  DevBuf q = up_bf16(r.q), k = up_bf16(r.k), v = up_bf16(r.v), dO = up_bf16(r.dout);
  DevBuf o(r.q.size() * 2), stats(sz(T * H) * 4), gq(r.q.size() * 2), gk(r.k.size() * 2), gv(r.v.size() * 2);
  const size_t ws_bytes = cuda::cudnn_attention_bwd_workspace(d, p);
  DevBuf ws(std::max<size_t>(ws_bytes, 16));
  cuda::cudnn_attention_fwd(d, p, q.p, k.p, v.p, o.p, stats.as<float>(), nullptr);
  cuda::cudnn_attention_bwd(d, p, q.p, k.p, v.p, o.p, stats.as<float>(), dO.p, gq.p, gk.p, gv.p, ws.p, ws_bytes, nullptr);
  cudaError_t e = cudaDeviceSynchronize();
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
  CudnnRun out{down_bf16(o.p, r.q.size()), down<float>(stats.p, sz(T * H)), down_bf16(gq.p, r.q.size()),
               down_bf16(gk.p, r.k.size()), down_bf16(gv.p, r.v.size())};
  if (p) {  // the mixer's fallback when a packed batch wants more workspace than it carved
    DevBuf acc(r.q.size() * 4), delta(sz(T * H) * 4), dkv(r.k.size() * 8);
    cuda::attention_bwd(d, q.p, k.p, v.p, seg.as<int32_t>(), o.p, stats.as<float>(), dO.p, gq.p, gk.p, gv.p,
                        acc.as<float>(), delta.as<float>(), dkv.as<float>(), nullptr);
    e = cudaDeviceSynchronize();
    EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
    out.own_dq = down_bf16(gq.p, r.q.size());
    out.own_dk = down_bf16(gk.p, r.k.size());
    out.own_dv = down_bf16(gv.p, r.v.size());
  }
  return out;
}

TEST_P(CudnnAttnTest, ForwardBackwardMatchCpu) {
  REQUIRE_GPU();
  if (!cuda::cudnn_attention_enabled()) GTEST_SKIP() << cuda::cudnn_attention_describe();
  const AttnCase ac = GetParam();
  const AttnRef r = attention_reference(ac);
  for (const bool det : {true, false}) {
    cuda::KernelOptions ko = cuda::kernel_options();
    ko.attention_deterministic = det;
    const cuda::KernelOptionsScope scope(ko);
    const cuda::AttnDims d{ac.batch, ac.seq, ac.heads, ac.kv_heads, ac.hd, r.scale};
    const cuda::PackedRows pr = packed_rows(ac, r);
    const cuda::PackedRows* p = ac.segments ? &pr : nullptr;
    if (ac.seq == 1 && !cuda::cudnn_attention_usable(d, p))  // cuDNN 9.19: "backward s_q = s_kv = 1 is not supported"
      GTEST_SKIP() << "cuDNN declines one-row sequences; the layers then run our kernels (LayerTest covers S=1)";
    ASSERT_TRUE(cuda::cudnn_attention_usable(d, p)) << ac << " det=" << det << ": " << cuda::cudnn_attention_describe();
    const CudnnRun a = run_cudnn(ac, r);
    SCOPED_TRACE(det ? "deterministic backward" : "atomic backward");
    // Statistics: [batch, heads, seq] for unpacked rows, [T, heads] (as our kernels') for packed ones.
    expect_attention_close(ac, r, a.o, a.stats, ac.segments ? r.lse_rows : r.lse_bhs, a.dq, a.dk, a.dv);
    if (ac.segments) {
      SCOPED_TRACE("cuDNN forward, our backward");
      expect_attention_close(ac, r, a.o, a.stats, r.lse_rows, a.own_dq, a.own_dk, a.own_dv);
    }
    if (det) {
      const CudnnRun b = run_cudnn(ac, r);
      EXPECT_EQ(std::memcmp(a.dq.data(), b.dq.data(), a.dq.size() * 4), 0) << ac << ": dQ not reproducible";
      EXPECT_EQ(std::memcmp(a.dk.data(), b.dk.data(), a.dk.size() * 4), 0) << ac;
      EXPECT_EQ(std::memcmp(a.dv.data(), b.dv.data(), a.dv.size() * 4), 0) << ac;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudnnAttnTest,
    ::testing::Values(AttnCase{2, 100, 4, 4, 64, false}, AttnCase{1, 257, 8, 1, 128, false},
                      AttnCase{1, 1, 4, 2, 64, false}, AttnCase{2, 192, 4, 4, 128, false},
                      AttnCase{1, 300, 14, 2, 64, false}, AttnCase{2, 260, 7, 1, 128, false},
                      AttnCase{2, 130, 6, 1, 256, false}, AttnCase{1, 257, 24, 4, 256, false},
                      AttnCase{1, 1, 2, 1, 256, false},
                      // packed rows (three runs a sample, the reference's segments), one to many key tiles
                      AttnCase{2, 130, 4, 2, 128, true}, AttnCase{3, 64, 6, 3, 64, true},
                      AttnCase{1, 300, 14, 2, 64, true}, AttnCase{2, 130, 6, 1, 256, true},
                      AttnCase{3, 64, 4, 2, 256, true}, AttnCase{2, 1024, 8, 2, 128, true}),
    [](const auto& info) {
      std::ostringstream s;
      s << info.param;
      return s.str();
    });

}  // namespace
