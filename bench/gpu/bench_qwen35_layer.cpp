// One Qwen3.5/3.6 decoder layer of each kind at the 27B shape (hidden 5120, ffn 17408, 24/4 heads of
// head_dim 256 with the output gate, (1 + w) norms and partial RoPE; Gated DeltaNet with 16 key / 48
// value heads of 128, conv 4), batch 8 x 1024, bf16, through the CudaBackend: forward, backward
// (layer_backward = recompute of the forward internals + backward) and forward+backward (what one
// training step does per layer, and what HF's forward + loss.backward() does: compare with
// tools/bench_hf_qwen35_layer.py run on the same GPU). Prints ms and the linear/full ratio, and one JSON
// line per kind with --json FILE.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "model/model_config.h"

using namespace lt;

namespace {

#define BC(call)                                                       \
  do {                                                                 \
    cudaError_t e_ = (call);                                           \
    if (e_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                    \
    }                                                                  \
  } while (0)

double time_median(const std::function<void()>& f, cudaStream_t st, int warm, int reps) {
  for (int i = 0; i < warm; ++i) f();
  BC(cudaStreamSynchronize(st));
  std::vector<double> ts;
  cudaEvent_t a, b;
  BC(cudaEventCreate(&a));
  BC(cudaEventCreate(&b));
  for (int i = 0; i < reps; ++i) {
    BC(cudaEventRecord(a, st));
    f();
    BC(cudaEventRecord(b, st));
    BC(cudaEventSynchronize(b));
    float ms = 0;
    BC(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms * 1e-3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

ModelConfig qwen36_27b_two_layers() {
  ModelConfig c = preset_config("qwen3.6-27b");
  c.layers = 2;
  c.layer_kinds = {LayerKind::GatedDeltaNet, LayerKind::Attention};
  c.vocab = 1024;  // the head is not timed
  return c;
}

// Weights as HF initialises them in spirit: matrices ~ N(0, 0.02), (1 + w) norms w = 0, the gated norm's
// weight 1, conv taps ~ N(0, 0.2), A_log = log U(1, 16), dt_bias 1.
std::vector<uint16_t> layer_weights(const UnitLayout& lay, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  std::uniform_real_distribution<float> u(1.f, 16.f);
  std::vector<uint16_t> h(size_t(lay.numel), 0);
  for (auto& p : lay.params)
    for (int64_t i = 0; i < p.numel; ++i) {
      float v = 0.02f * n(rng);
      if (p.suffix == "linear_attn.norm.weight") v = 1.f;
      else if (p.suffix.find("norm") != std::string::npos) v = 0.f;
      else if (p.suffix.find("conv1d") != std::string::npos) v = 0.2f * n(rng);
      else if (p.suffix.find("A_log") != std::string::npos) v = std::log(u(rng));
      else if (p.suffix.find("dt_bias") != std::string::npos) v = 1.f;
      h[size_t(p.offset + i)] = f32_to_bf16(v);
    }
  return h;
}

struct Timing {
  double fwd = 0, bwd = 0, both = 0;
};

Timing time_layer(CudaBackend& be, int64_t layer, int64_t batch, int64_t seq, int warm, int reps) {
  const ModelConfig& c = be.config();
  const UnitLayout& lay = be.layout().layer(layer);
  const int64_t T = batch * seq, H = c.hidden;
  auto st = static_cast<cudaStream_t>(be.stream(Lane::Compute));
  Allocation w = be.alloc(MemKind::Device, lay.numel * 2, "bench.w"), dw = be.alloc(MemKind::Device, lay.numel * 4, "bench.dw");
  Allocation x = be.alloc(MemKind::Device, T * H * 2, "bench.x"), y = be.alloc(MemKind::Device, T * H * 2, "bench.y");
  Allocation dx = be.alloc(MemKind::Device, T * H * 2, "bench.dx");
  const auto wh = layer_weights(lay, uint32_t(11 + layer));
  BC(cudaMemcpy(w.ptr, wh.data(), wh.size() * 2, cudaMemcpyHostToDevice));
  {
    std::mt19937 rng(3);
    std::normal_distribution<float> n(0.f, 1.f);
    std::vector<uint16_t> xh(size_t(T * H));
    for (auto& v : xh) v = f32_to_bf16(n(rng));
    BC(cudaMemcpy(x.ptr, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
  }
  be.fill_zero(Lane::Compute, dw.ptr, lay.numel * 4, {});
  be.reserve_workspace(T);
  DevGeometry g{batch, seq, nullptr, nullptr};
  auto fwd = [&] { be.layer_forward(layer, w.ptr, g, x.ptr, y.ptr, {}); };
  auto bwd = [&] { be.layer_backward(layer, w.ptr, g, x.ptr, y.ptr, dx.ptr, dw.ptr, {}); };
  Timing t;
  t.fwd = time_median(fwd, st, warm, reps);
  t.bwd = time_median(bwd, st, warm, reps);
  t.both = time_median([&] { fwd(); bwd(); }, st, warm, reps);
  be.synchronize();
  for (Allocation* a : {&w, &dw, &x, &y, &dx}) be.free(*a);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Qwen3.5/3.6 layer forward+backward at the 27B shape (CUDA backend)"};
  int64_t batch = 8, seq = 1024;
  int warm = 2, reps = 5;
  std::string json;
  app.add_option("--batch", batch, "samples");
  app.add_option("--seq", seq, "rows per sample");
  app.add_option("--warmup", warm, "untimed runs");
  app.add_option("--reps", reps, "timed runs (median)");
  app.add_option("--json", json, "append one JSON line per layer kind to this file");
  std::string only = "both";
  app.add_option("--kind", only, "linear, full or both (one kind alone: e.g. under a profiler)")
      ->check(CLI::IsMember({"linear", "full", "both"}));
  CLI11_PARSE(app, argc, argv);
  try {
    const ModelConfig c = qwen36_27b_two_layers();
    CudaBackendOptions o;
    CudaBackend be(c, o);
    std::printf("bench_qwen35_layer: %s, hidden %lld, ffn %lld, heads %lld/%lld x %lld (rotary %lld), linear %lld/%lld "
                "x %lld/%lld conv %lld, batch %lld x seq %lld, bf16\n",
                be.name().c_str(), (long long)c.hidden, (long long)c.ffn, (long long)c.heads, (long long)c.kv_heads,
                (long long)c.head_dim, (long long)c.rotary_dim(), (long long)c.linear.k_heads,
                (long long)c.linear.v_heads, (long long)c.linear.k_head_dim, (long long)c.linear.v_head_dim,
                (long long)c.linear.conv_kernel, (long long)batch, (long long)seq);
    const bool do_lin = only != "full", do_full = only != "linear";
    const Timing lin = do_lin ? time_layer(be, 0, batch, seq, warm, reps) : Timing{};
    const Timing full = do_full ? time_layer(be, 1, batch, seq, warm, reps) : Timing{};
    auto row = [&](const char* name, const Timing& t) {
      std::printf("  %-18s fwd %8.2f ms   bwd (recompute+bwd) %8.2f ms   fwd+bwd %8.2f ms\n", name, t.fwd * 1e3,
                  t.bwd * 1e3, t.both * 1e3);
    };
    if (do_lin) row("linear_attention", lin);
    if (do_full) row("full_attention", full);
    if (do_lin && do_full)
      std::printf("  ratio linear/full (fwd+bwd): %.3f (target <= 1.2)\n", lin.both / full.both);
    std::printf("  peak device arena: %.2f GiB\n", double(be.arena_peak()) / double(1 << 30));
    if (!json.empty()) {
      std::ofstream f(json, std::ios::app);
      for (auto [kind, t] : {std::pair<const char*, Timing>{"linear_attention", lin}, {"full_attention", full}})
        if (t.both > 0)
          f << "{\"bench\":\"qwen35_layer\",\"impl\":\"lazytrain\",\"kind\":\"" << kind << "\",\"batch\":" << batch
            << ",\"seq\":" << seq << ",\"fwd_ms\":" << t.fwd * 1e3 << ",\"bwd_ms\":" << t.bwd * 1e3
            << ",\"fwd_bwd_ms\":" << t.both * 1e3 << "}\n";
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_qwen35_layer: %s\n", e.what());
    return 1;
  }
  return 0;
}
