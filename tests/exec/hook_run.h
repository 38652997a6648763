// A tiny training run through the executor and an optimizer hook on the CPU backend, shared by the master-storage
// and NVMe-remainder tests: steps [first, last] at 2 x 8 tokens (batch seed 100 + step - 1, lr 3e-3) on a plan
// with one CPU and one recomputed boundary, then the fp32 masters read back.
#pragma once
#include <cstring>
#include <vector>

#include "exec/executor.h"
#include "exec/optim_hook.h"
#include "exec_test_util.h"

namespace lt::test {

struct HookRun {
  std::vector<double> losses, norms;
  std::vector<std::vector<float>> masters;
  int64_t master_bytes = 0;
};

inline HookRun train_with_hook(const ModelConfig& c, CpuBackend& be, HostState& st, AdamWHook& hook, int first,
                               int last) {
  ExecPlan p = ExecPlan::keep_all(c.layers, 2, 8);
  p.tier[1] = CkptTier::Cpu;
  p.tier[2] = CkptTier::None;
  Executor ex(c, be, p, st);
  ex.set_update_hook(&hook);
  HookRun r;
  for (int s = first; s <= last; ++s) {
    auto b = random_batch(c, 2, 8, 100 + uint64_t(s - 1));
    hook.begin_step(3e-3f);
    auto res = ex.train_step({{b.ids.data(), b.targets.data(), nullptr, nullptr}});
    r.losses.push_back(res.loss);
    r.norms.push_back(res.grad_norm);
  }
  hook.wait_all();
  for (int64_t u = 0; u < st.units(); ++u) {
    r.masters.emplace_back(size_t(st.numel(u)));
    st.read_master(u, r.masters.back().data());
  }
  r.master_bytes = st.master_bytes();
  return r;
}

inline bool bit_equal(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t u = 0; u < a.size(); ++u)
    if (a[u].size() != b[u].size() || std::memcmp(a[u].data(), b[u].data(), a[u].size() * 4) != 0) return false;
  return true;
}

}  // namespace lt::test
