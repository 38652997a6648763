// CPU reference training step benchmark: forward + backward of a model shape (default the Qwen2.5-0.5B
// preset, random init) at batch x seq tokens. Reports total time per phase, the share of time in
// sgemm, and achieved GFLOP/s. Not a test.
//   bench_cpu_step [--model qwen2.5-0.5b] [--batch 1] [--seq 512] [--iters 3] [--layers N]
#include <CLI/CLI.hpp>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>

#include "backend/cpu/blas_setup.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/reference.h"
#include "backend/cpu/reference_model.h"
#include "core/timer.h"
#include "model/accounting.h"
#include "model/init.h"
#include "model/model_config.h"

using namespace lt;
using namespace lt::cpu;

namespace {
double cpu_seconds() {  // user + system time of the process (all threads)
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}
double load_average() {
  double l[1] = {0};
  return getloadavg(l, 1) == 1 ? l[0] : -1;
}
}  // namespace

int main(int argc, char** argv) {
  ensure_cpu_runtime_env(argc, argv);  // fast OpenBLAS kernels, passive OpenMP waiting (blas_setup.h)
  CLI::App app{"CPU reference forward+backward benchmark"};
  std::string model = "qwen2.5-0.5b";
  int64_t batch = 1, seq = 512, layers = 0;
  int iters = 3;
  app.add_option("--model", model, "preset name or HF model directory");
  app.add_option("--batch", batch);
  app.add_option("--seq", seq);
  app.add_option("--iters", iters, "timed iterations (after one warm-up)");
  app.add_option("--layers", layers, "override the number of layers (0 = the model's)");
  int64_t head_chunk = 0;
  app.add_option("--head-chunk", head_chunk, "rows per LM-head chunk (0 = automatic, ~64 MiB of logits)");
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);

  set_head_chunk_rows(head_chunk);
  ModelConfig c = resolve_model(model);
  if (layers > 0) c.layers = layers;
  const double t_init = now_seconds();
  ModelWeights w = random_model(c, 42);
  UnitBuffers grads(w.layout);
  std::printf("model %s: %lld layers, hidden %lld, ffn %lld, heads %lld/%lld, vocab %lld, %.1f M params; init %.1f s\n",
              c.name.c_str(), (long long)c.layers, (long long)c.hidden, (long long)c.ffn, (long long)c.heads,
              (long long)c.kv_heads, (long long)c.vocab, double(w.layout.parameter_count()) / 1e6, now_seconds() - t_init);

  SeqGeometry g;
  g.batch = batch;
  g.seq = seq;
  const int64_t T = g.tokens(), H = c.hidden, L = c.layers;
  std::mt19937 rng(7);
  std::vector<int32_t> ids(static_cast<size_t>(T)), labels(static_cast<size_t>(T)), targets(static_cast<size_t>(T));
  for (auto& x : ids) x = int32_t(rng() % uint32_t(c.vocab));
  labels = ids;
  shift_labels(labels.data(), g, targets.data());
  std::vector<const float*> wp;
  for (auto& u : w.units) wp.push_back(u.data());
  auto gp = grads.ptrs();
  const float* lm = c.tied ? wp.front() : wp.back() + w.layout.head().find("lm_head.weight").offset;
  float* dlm = c.tied ? gp.front() : gp.back() + w.layout.head().find("lm_head.weight").offset;

  std::vector<std::vector<float>> xs(static_cast<size_t>(L + 1), std::vector<float>(size_t(T * H)));
  std::vector<float> dx(static_cast<size_t>(T * H)), dprev(static_cast<size_t>(T * H));
  double best = 1e30, t_fwd = 0, t_head = 0, t_bwd = 0, gemm_s = 0, gemm_f = 0, loss = 0;
  for (int it = 0; it <= iters; ++it) {
    reset_gemm_stats();
    const double t0 = now_seconds(), c0 = cpu_seconds();
    embed_forward(c, wp.front(), ids.data(), T, xs[0].data());
    for (int64_t i = 0; i < L; ++i) layer_forward(c, w.layout.layer(i), wp[size_t(i + 1)], g, xs[size_t(i)].data(), xs[size_t(i + 1)].data());
    const double t1 = now_seconds();
    const double g1 = gemm_stats().seconds;
    HeadResult hr = head_forward_backward(c, w.layout.head(), wp.back(), lm, targets.data(), T, xs[size_t(L)].data(),
                                          1.0f / float(T - batch), dx.data(), gp.back(), dlm, seq);
    const double t2 = now_seconds();
    const double g2 = gemm_stats().seconds;
    for (int64_t i = L - 1; i >= 0; --i) {
      layer_backward(c, w.layout.layer(i), wp[size_t(i + 1)], g, xs[size_t(i)].data(), dx.data(), dprev.data(), gp[size_t(i + 1)]);
      std::swap(dx, dprev);
    }
    embed_backward(c, ids.data(), T, dx.data(), gp.front());
    const double t3 = now_seconds(), cpu = cpu_seconds() - c0;
    const GemmStats gs = gemm_stats();
    std::printf("  iter %d: %.3f s (forward %.3f [gemm %.3f], head fwd+bwd %.3f [gemm %.3f], backward incl. recompute %.3f [gemm %.3f]), cpu %.1f s, load %.1f, loss %.4f\n",
                it, t3 - t0, t1 - t0, g1, t2 - t1, g2 - g1, t3 - t2, gs.seconds - g2, cpu, load_average(), hr.loss_sum / double(hr.n_tokens));
    if (it > 0 && t3 - t0 < best) {  // iteration 0 is warm-up
      best = t3 - t0;
      t_fwd = t1 - t0;
      t_head = t2 - t1;
      t_bwd = t3 - t2;
      gemm_s = gs.seconds;
      gemm_f = gs.flops;
      loss = hr.loss_sum / double(hr.n_tokens);
    }
  }
  const double model_flops = 6.0 * double(parameter_count(c)) * double(T);
  std::printf("\nbest of %d: %.3f s/step  (forward %.3f s, head %.3f s, backward %.3f s), %.1f tokens/s, loss %.4f\n",
              iters, best, t_fwd, t_head, t_bwd, double(T) / best, loss);
  std::printf("GEMM: %.3f s = %.1f%% of the step, %.1f GFLOP executed (incl. recompute), %.1f GFLOP/s in GEMM\n", gemm_s,
              100.0 * gemm_s / best, gemm_f / 1e9, gemm_f / gemm_s / 1e9);
  std::printf("achieved: %.1f GFLOP/s executed GEMM FLOPs over the whole step; model FLOPs 6*N*tokens = %.1f GFLOP -> %.1f GFLOP/s\n",
              gemm_f / best / 1e9, model_flops / 1e9, model_flops / best / 1e9);
  const char* wp_env = std::getenv("OMP_WAIT_POLICY");
  std::printf("threads: %u hardware, OpenBLAS kernels %s, OMP_WAIT_POLICY=%s, head chunk %lld rows\n",
              std::thread::hardware_concurrency(), blas_core_name().c_str(), wp_env ? wp_env : "(unset)",
              (long long)head_chunk_rows(c.vocab));
  return 0;
}
