// Tiny models, random weights/batches/plans for the executor tests.
#pragma once
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/reference.h"
#include "backend/cpu/reference_model.h"
#include "exec/exec_plan.h"
#include "exec/executor.h"
#include "exec/host_state.h"
#include "model/model_config.h"
#include "model/param_layout.h"

namespace lt::test {

// Tiny models run fastest single-threaded (OpenMP barriers dominate and oversubscribe a busy CI box).
inline CpuBackendOptions cpu_opts() {
  CpuBackendOptions o;
  o.threads = 1;
  return o;
}

inline ModelConfig tiny_config(Arch arch = Arch::Qwen2, int64_t layers = 5, bool tied = false) {
  ModelConfig c;
  c.name = "tiny";
  c.arch = arch;
  c.hidden = 32;
  c.layers = layers;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 8;
  c.ffn = 48;
  c.vocab = 61;
  c.tied = tied;
  c.attn_bias = arch == Arch::Qwen2;
  c.qk_norm = arch == Arch::Qwen3;
  c.rms_eps = 1e-6;
  c.rope_theta = 10000;
  if (arch == Arch::Qwen3_5) {  // hybrid: Gated DeltaNet and gated attention layers, not in a 3:1 order
    c.qk_norm = true;
    c.attn_output_gate = true;
    c.norm_plus_one = true;
    c.partial_rotary = 0.5;
    c.linear = LinearAttnConfig{2, 4, 8, 6, 3};
    for (int64_t i = 0; i < layers; ++i)
      c.layer_kinds.push_back(i % 3 == 1 ? LayerKind::Attention : LayerKind::GatedDeltaNet);
  }
  return c;
}

inline void random_weights(const ModelLayout& lay, HostState& st, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 0.08f);
  for (size_t u = 0; u < lay.units.size(); ++u) {
    std::vector<float> m(size_t(lay.units[u].numel), 0.0f);
    for (auto& p : lay.units[u].params) {
      const bool norm = p.suffix.find("norm") != std::string::npos;
      for (int64_t i = 0; i < p.numel; ++i) m[size_t(p.offset + i)] = norm ? 1.0f + 0.1f * n(rng) : n(rng);
    }
    st.write_master(int64_t(u), m.data());
  }
}

struct Batch {
  int64_t batch = 0, seq = 0;
  std::vector<int32_t> ids, targets, positions, segments;
};

// Random ids, shifted targets with some ignored rows; optionally packed segments.
inline Batch random_batch(const ModelConfig& c, int64_t batch, int64_t seq, uint64_t seed, bool packed = false) {
  std::mt19937_64 rng(seed);
  Batch b;
  b.batch = batch;
  b.seq = seq;
  const int64_t T = batch * seq;
  b.ids.resize(size_t(T));
  std::vector<int32_t> labels(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    b.ids[size_t(t)] = int32_t(rng() % uint64_t(c.vocab));
    labels[size_t(t)] = rng() % 7 == 0 ? cpu::kIgnoreIndex : b.ids[size_t(t)];
  }
  if (packed) {
    b.segments.resize(size_t(T));
    b.positions.resize(size_t(T));
    for (int64_t s = 0; s < batch; ++s) {
      const int64_t cut = 1 + int64_t(rng() % uint64_t(seq - 1));
      for (int64_t r = 0; r < seq; ++r) {
        b.segments[size_t(s * seq + r)] = r < cut ? 0 : 1;
        b.positions[size_t(s * seq + r)] = int32_t(r < cut ? r : r - cut);
      }
    }
  }
  cpu::SeqGeometry g{batch, seq, packed ? b.positions.data() : nullptr, packed ? b.segments.data() : nullptr};
  b.targets.resize(size_t(T));
  cpu::shift_labels(labels.data(), g, b.targets.data());
  return b;
}

// One step's nmb random micro-batches (seeds seed, seed + 1, ...) and the executor's views of them (valid while this
// lives; moving it keeps them valid).
struct StepBatches {
  std::vector<Batch> batches;
  std::vector<MicroBatch> mbs;
};
inline StepBatches step_batches(const ModelConfig& c, const ExecPlan& p, int nmb, uint64_t seed) {
  StepBatches s;
  for (int m = 0; m < nmb; ++m) s.batches.push_back(random_batch(c, p.batch, p.seq, seed + uint64_t(m)));
  for (auto& b : s.batches) s.mbs.push_back({b.ids.data(), b.targets.data(), nullptr, nullptr});
  return s;
}

// A random valid plan: tiers, ring, chunk, residency, and transfer shares in their valid windows.
inline ExecPlan random_plan(int64_t L, int64_t batch, int64_t seq, std::mt19937_64& rng, bool allow_nvme = true) {
  ExecPlan p;
  p.batch = batch;
  p.seq = seq;
  p.tier.resize(size_t(L + 1));
  const int n_tiers = allow_nvme ? 4 : 3;
  for (int64_t i = 0; i <= L; ++i) p.tier[size_t(i)] = CkptTier(rng() % uint64_t(n_tiers));
  if (p.tier[0] == CkptTier::None) p.tier[0] = CkptTier(1 + rng() % uint64_t(n_tiers - 1));
  p.tier[size_t(L)] = CkptTier::Gpu;
  p.ring = int32_t(2 + rng() % 3);
  p.chunk_samples = int64_t(rng() % uint64_t(batch + 1));
  p.nvme_staging = int32_t(1 + rng() % 2);
  p.embedding_resident = rng() % 3 != 0;
  p.head_resident = rng() % 2 == 0;
  p.traffic.resize(size_t(L + 1));
  auto shares = [&](int64_t lo, int64_t hi) {
    std::vector<ExecPlan::Share> v;
    const int n = int(1 + rng() % 3);
    std::vector<int32_t> w;
    for (int k = 0; k < n; ++k) w.push_back(int32_t(lo + int64_t(rng() % uint64_t(hi - lo + 1))));
    std::sort(w.begin(), w.end());
    double left = 1.0;
    for (int k = 0; k < n; ++k) {
      const double f = k + 1 == n ? left : left * (0.2 + 0.6 * double(rng() % 1000) / 1000.0);
      v.push_back({w[size_t(k)], f});
      left -= f;
    }
    return v;
  };
  for (int64_t i = 0; i < L; ++i) {
    const CkptTier t = p.tier[size_t(i)];
    if (t != CkptTier::Cpu && t != CkptTier::Nvme) continue;
    auto& tr = p.traffic[size_t(i)];
    if (rng() % 4 == 0) continue;  // defaults
    const int32_t first = block_first_window(p, i);
    tr.d2h = shares(i, L);
    tr.h2d = shares(L, first);
    if (t == CkptTier::Nvme) {
      tr.nvme_write = shares(tr.d2h.front().window, L);
      tr.nvme_read = shares(tr.nvme_write.front().window, tr.h2d.back().window);
    }
  }
  // Kept internals (drawn last, so the draws above are those of the plans before it): none, some or all layers.
  // A backend that keeps nothing (the CPU's) runs them as plain layers.
  p.kept_layers = int64_t(rng() % uint64_t(L + 1));
  return p;
}

inline std::filesystem::path temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / fmt::format("lt-exec-test-{}-{}", name, ::getpid());
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace lt::test
