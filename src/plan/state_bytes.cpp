// The byte model of the model state (state_bytes.h, docs/memory.md).
#include "plan/state_bytes.h"

#include <algorithm>
#include <fmt/format.h>
#include <set>

#include "core/error.h"
#include "model/accounting.h"

namespace lt {

double moment_bytes(int64_t n, bool q8) { return q8 ? 2.0 * double(n) + 2.0 * 4.0 * double((n + 255) / 256) : 8.0 * double(n); }

double master_bytes_per_param(MasterMode m) { return m == MasterMode::Fp32 ? 4.0 : 2.0; }

double master_bytes_per_param(const StatePlacement& s) {
  return s.fp32_master_array ? 4.0 + 2.0 : master_bytes_per_param(s.master);
}

bool embedding_resident_for(const ModelConfig& c, const StatePlacement& s) { return s.grads == GradHome::Device && !c.tied; }

bool head_grad_slices_apply(const ModelConfig& c, const StatePlacement& s) {
  return s.grads == GradHome::Device && s.grad_dtype == GradDType::Bf16 && !c.tied;
}

const char* state_home_name(StateHome h) {
  static constexpr const char* kNames[] = {"gpu", "dram", "nvme"};
  return kNames[size_t(h)];
}

StateBytes model_state_bytes(const ModelConfig& c, const std::vector<std::string>& eight_bit, StatePlacement s) {
  const std::set<std::string> q8(eight_bit.begin(), eight_bit.end());
  LT_CHECK(s.moment_shards >= 1, "state bytes: moment_shards must be >= 1, got {}", s.moment_shards);
  StateBytes b;
  b.placement = s;
  const double shard = 1.0 / double(s.moment_shards);
  const double held_b = s.grad_dtype == GradDType::Bf16 ? 2.0 : 4.0;
  double largest_layer = 0, largest_nvme = 0, head = 0, emb = 0;
  std::vector<int64_t> held_units;
  for (auto& u : model_layout(c).units) {
    const double n = double(unit_param_count(u));
    // With GradHome::Device every unit's gradient is held in HBM (the embedding's table is on the GPU
    // then: tied, or resident by embedding_resident_for).
    const bool held = s.grads == GradHome::Device;
    const bool nvme = u.kind == UnitKind::Layer && moments_on_nvme(c, u.layer, s);
    b.params += int64_t(n);
    b.master += master_bytes_per_param(s) * n;
    const bool on_gpu = (s.embedding_update_device && u.kind == UnitKind::Embedding) ||
                        (u.kind == UnitKind::Layer && u.layer < s.device_update_layers);
    if (!on_gpu) (held ? b.grads_device : b.grads_host) += held_b * n;  // host: fp32, or bf16 (host_bf16_grads)
    double mb = 0;
    for (auto& p : u.params) {
      mb += moment_bytes(p.numel, q8.count(p.name) > 0);
      b.eight_bit_tensors += q8.count(p.name) > 0;
    }
    mb *= shard;  // data parallel: this rank's shard of the moments
    // Updated on the GPU: the moments and the remainders there; the DRAM copies (written back at a checkpoint) stay.
    if (on_gpu && u.kind == UnitKind::Embedding) b.device_update = mb + 2.0 * n;
    if (on_gpu && u.kind == UnitKind::Layer) b.device_layers += mb + 8.0 * n;  // + weights 2, remainders 2, gradient 4
    (nvme ? b.moments_nvme : b.moments) += mb;
    // The master remainders in the same image (split fp32): out of the DRAM master, into the file and its slot.
    const double rem = nvme && remainders_on_nvme(s) ? 2.0 * n : 0.0;
    b.master -= rem;
    b.remainders_nvme += rem;
    if (nvme) largest_nvme = std::max(largest_nvme, mb + rem);
    if (u.kind == UnitKind::Layer) largest_layer = std::max(largest_layer, n);
    if (u.kind == UnitKind::Head) head = n;
    if (u.kind == UnitKind::Embedding) emb = n;
    if (held) held_units.push_back(int64_t(n));
  }
  // Device: the executor's staging ring (grad_ring_elems) in the held dtype. Host bf16: none (the rounded pieces are
  // copied straight into the pinned gradients).
  b.staging = s.host_bf16_grads()             ? 0.0
              : s.grads == GradHome::Host ? 2.0 * 2.0 * largest_layer
                                          : held_b * double(grad_ring_elems(held_units, s.grad_ring_depth));
  // The executor's per-micro-batch fp32 gradient buffers (exec/executor_setup.cpp grad_memory): with host
  // gradients two layers', the head's and (tied: on the device) the embedding's, which the backward writes and
  // the D2H reads; with bf16 held ones the same, an untied head and the resident embedding sharing one
  // (shared_head_embedding_grad). Counting them in bf16 and only in the backward and head slots left a Qwen3.5-9B
  // plan at its largest batch 6 GiB short of what the executor allocated.
  // Host bf16: + the two bf16 buffers of the largest layer each gradient is rounded into, piece by piece, on its way
  // down (exec/micro_batch_run.cpp offload_grad).
  if (s.grads == GradHome::Host)
    b.grad_scratch = 4.0 * (2.0 * largest_layer + head + (c.tied ? emb : 0.0)) +
                     (s.host_bf16_grads() ? 2.0 * 2.0 * largest_layer : 0.0);
  else if (s.grad_dtype == GradDType::Bf16 && s.head_grad_slices)  // the head's norm and one slice of its matrix
    b.grad_scratch = 4.0 * (2.0 * largest_layer + double(c.hidden) * double(1 + head_grad_slice_rows(c)));
  else if (s.grad_dtype == GradDType::Bf16)
    b.grad_scratch = 4.0 * (2.0 * largest_layer + (c.tied ? head + emb : std::max(head, emb)));
  if (embedding_resident_for(c, s)) b.resident_table = 2.0 * emb;
  b.head_weights = 2.0 * (head + (c.tied ? emb : 0.0));
  b.moment_staging = double(std::min<int64_t>(3, s.nvme_layers)) * largest_nvme;  // AdamWConfig::nvme_slots
  return b;
}

double layer_moment_bytes(const ModelConfig& c, int64_t layer, const std::vector<std::string>& eight_bit) {
  const std::set<std::string> q8(eight_bit.begin(), eight_bit.end());
  const ModelLayout lay = model_layout(c);  // held: a reference into a temporary layout would dangle in the loop
  double b = 0;
  for (auto& p : lay.layer(layer).params) b += moment_bytes(p.numel, q8.count(p.name) > 0);
  return b;
}

double layer_nvme_image_bytes(const ModelConfig& c, int64_t layer, const std::vector<std::string>& eight_bit,
                              const StatePlacement& s) {
  double b = layer_moment_bytes(c, layer, eight_bit);
  if (remainders_on_nvme(s)) b += 2.0 * double(unit_param_count(model_layout(c).layer(layer)));
  return b;
}

std::vector<StatePart> StateBytes::parts() const {
  std::vector<StatePart> v;
  v.push_back({placement.fp32_master_array ? std::string("master (fp32 array) + copy (bf16)")
                                           : fmt::format("master + copy ({})", master_mode_name(placement.master)),
               StateHome::Dram, master});
  if (grads_device > 0)
    v.push_back({fmt::format("gradients ({}, held)", grad_dtype_name(placement.grad_dtype)), StateHome::Gpu, grads_device});
  if (grad_scratch > 0)
    v.push_back({placement.host_bf16_grads()    ? "gradient scratch (fp32, bf16)"
                 : placement.head_grad_slices ? "gradient scratch (fp32, head sliced)"
                                              : "gradient scratch (fp32)",
                 StateHome::Gpu, grad_scratch});
  if (resident_table > 0) v.push_back({"embedding table (resident)", StateHome::Gpu, resident_table});
  if (head_weights > 0) v.push_back({"head weights (bf16)", StateHome::Gpu, head_weights});
  if (device_update > 0) v.push_back({"embedding update (remainders, moments)", StateHome::Gpu, device_update});
  if (device_layers > 0)
    v.push_back({fmt::format("first {} layers' update (weights, remainders, moments, gradients)",
                             placement.device_update_layers),
                 StateHome::Gpu, device_layers});
  if (grads_host > 0)
    v.push_back({fmt::format("gradients ({})", grad_dtype_name(placement.grad_dtype)), StateHome::Dram, grads_host});
  std::string mom = eight_bit_tensors > 0 ? fmt::format("moments ({} 8-bit tensors)", eight_bit_tensors) : "moments (fp32)";
  if (placement.moment_shards > 1) mom += fmt::format(", shard 1/{}", placement.moment_shards);
  v.push_back({mom, StateHome::Dram, moments});
  if (moments_nvme > 0) {
    v.push_back({fmt::format("moments of the last {} layers", placement.nvme_layers), StateHome::Nvme, moments_nvme});
    if (remainders_nvme > 0)
      v.push_back({fmt::format("master remainders, last {} layers", placement.nvme_layers), StateHome::Nvme,
                   remainders_nvme});
    v.push_back({"moment staging slots", StateHome::Dram, moment_staging});
  }
  if (staging > 0)
    v.push_back({placement.grads == GradHome::Host ? "gradient slabs (pinned)" : "gradient staging ring (pinned)",
                 StateHome::Dram, staging});
  return v;
}

}  // namespace lt
