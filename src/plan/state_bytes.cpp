// The byte model of the model state (state_bytes.h, docs/memory.md).
#include "plan/state_bytes.h"

#include <algorithm>
#include <fmt/format.h>
#include <set>

#include "model/accounting.h"

namespace lt {

double moment_bytes(int64_t n, bool q8) { return q8 ? 2.0 * double(n) + 2.0 * 4.0 * double((n + 255) / 256) : 8.0 * double(n); }

double master_bytes_per_param(MasterMode m) { return m == MasterMode::Fp32 ? 4.0 : 2.0; }

bool grad_held_on_device(const UnitLayout& u, GradHome g) { return g == GradHome::Device && u.kind != UnitKind::Embedding; }

const char* state_home_name(StateHome h) {
  static constexpr const char* kNames[] = {"gpu", "dram", "nvme"};
  return kNames[size_t(h)];
}

StateBytes model_state_bytes(const ModelConfig& c, const std::vector<std::string>& eight_bit, StatePlacement s) {
  const std::set<std::string> q8(eight_bit.begin(), eight_bit.end());
  StateBytes b;
  b.placement = s;
  double largest_layer = 0, largest_held = 0;
  for (auto& u : model_layout(c).units) {
    const double n = double(unit_param_count(u));
    const bool held = grad_held_on_device(u, s.grads);
    b.params += int64_t(n);
    b.master += master_bytes_per_param(s.master) * n;
    (held ? b.grads_device : b.grads_host) += 4.0 * n;  // fp32: the backends' gradient dtype
    for (auto& p : u.params) {
      b.moments += moment_bytes(p.numel, q8.count(p.name) > 0);
      b.eight_bit_tensors += q8.count(p.name) > 0;
    }
    if (u.kind == UnitKind::Layer) largest_layer = std::max(largest_layer, n);
    if (held) largest_held = std::max(largest_held, n);
  }
  b.staging = s.grads == GradHome::Host ? 2.0 * 2.0 * largest_layer : 3.0 * 4.0 * largest_held;
  return b;
}

std::vector<StatePart> StateBytes::parts() const {
  std::vector<StatePart> v;
  v.push_back({fmt::format("master + copy ({})", master_mode_name(placement.master)), StateHome::Dram, master});
  if (grads_device > 0) v.push_back({"gradients (fp32, held)", StateHome::Gpu, grads_device});
  if (grads_host > 0)
    v.push_back({placement.grads == GradHome::Host ? "gradients (fp32)" : "gradients (fp32, embedding)", StateHome::Dram,
                 grads_host});
  v.push_back({eight_bit_tensors > 0 ? fmt::format("moments ({} 8-bit tensors)", eight_bit_tensors) : "moments (fp32)",
               StateHome::Dram, moments});
  v.push_back({placement.grads == GradHome::Host ? "gradient slabs (pinned)" : "gradient staging ring (pinned)",
               StateHome::Dram, staging});
  return v;
}

}  // namespace lt
