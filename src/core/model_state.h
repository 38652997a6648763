// How the model state is stored and where each part lives (docs/memory.md). Shared by the
// optimizer (what its kernels read and write), the host state (what is allocated), the planner (what
// each mode costs in bytes) and the trainer (the config keys `master_weights` and `gradients`).
//
// Master weights
//   fp32     exact fp32 masters. On a backend that streams bf16 they are stored as the bf16 streaming
//            copy (round to nearest, ties away from zero: what the GPU reads) plus a 16-bit signed
//            remainder, from which the fp32 value is rebuilt bit-exactly: 4 B/param for master and
//            copy together (split_master.h). On the fp32-streaming CPU backend the master is the copy.
//   bf16-sr  the bf16 streaming copy is the master (2 B/param); the update rounds stochastically
//            (seeded, counter-based: reproducible whatever the threading).
// Gradients
//   host     accumulated in fp32 in pinned host memory (4 B/param in DRAM), as before; or in bf16
//            (gradient_dtype: bf16, 2 B/param in DRAM): each unit's fp32 gradient is rounded to
//            nearest-even on the device as it leaves (Backend::grad_add into a bf16 buffer, the held
//            bf16 path's rounding), in pieces through two bf16 buffers of the largest layer, and copied
//            down in bf16 (half the D2H); the clipping norm is over the rounded values. One micro-batch
//            per step (several would need the host to round their sum: not run yet).
//   device   held in HBM until the global clipping norm is known, then streamed down unit by unit
//            through a small pinned staging ring as the optimizer consumes them (during the next
//            step's forward). Held in fp32 (the backends' gradient dtype, 4 B/param) or in bf16
//            (gradient_dtype: bf16, 2 B/param in HBM and in the ring): each layer's fp32 gradient is
//            rounded to nearest-even as it is added into the held buffer, and the clipping norm is
//            taken over the rounded values, i.e. over exactly what the optimizer reads.
// Embedding update on the device (embedding_update)
//   a tied table is on the GPU for the whole step; with host gradients, fp32 masters and fp32 moments its AdamW step
//   can run there too (StatePlacement::embedding_update_device): off the CPU optimizer's critical path.
// Layers updated on the device (device_update_layers)
//   the first k decoder layers live in HBM with their optimizer state and are updated there after the norm, so the
//   next step's forward starts without waiting for the CPU optimizer (which starts on layer k at once).
// 8-bit embedding moments
//   adamw8bit keeps the input embedding's moments in fp32 (as bitsandbytes' stable embedding does);
//   when nothing else fits the planner may quantise them too (StatePlacement::embedding_8bit).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace lt {

enum class MasterMode : uint8_t { Fp32 = 0, Bf16Sr = 1 };
enum class GradHome : uint8_t { Host = 0, Device = 1 };
enum class GradDType : uint8_t { F32 = 0, Bf16 = 1 };  // of gradients held on the device

inline const char* master_mode_name(MasterMode m) { return m == MasterMode::Fp32 ? "fp32" : "bf16-sr"; }
inline const char* grad_home_name(GradHome g) { return g == GradHome::Host ? "host" : "device"; }
inline const char* grad_dtype_name(GradDType d) { return d == GradDType::F32 ? "fp32" : "bf16"; }

inline MasterMode parse_master_mode(const std::string& s) {
  if (s == "fp32") return MasterMode::Fp32;
  if (s == "bf16-sr") return MasterMode::Bf16Sr;
  fail("master_weights: expected fp32 or bf16-sr, got '{}'", s);
}
inline GradHome parse_grad_home(const std::string& s) {
  if (s == "host") return GradHome::Host;
  if (s == "device") return GradHome::Device;
  fail("gradients: expected host or device, got '{}'", s);
}
inline GradDType parse_grad_dtype(const std::string& s) {
  if (s == "fp32") return GradDType::F32;
  if (s == "bf16") return GradDType::Bf16;
  fail("gradient_dtype: expected fp32 or bf16, got '{}'", s);
}

// The pinned ring through which gradients held on the device reach the optimizer (exec/grad_stream.h),
// in elements: `depth` median held units, at most all of them, at least the largest (an untied
// LM head, which then streams with the ring to itself). Depth measured on the H200 with Qwen2.5-14B:
// 3 layers in flight left 1.8-2.0 s of the optimizer exposed per step, 8 about 1.0-1.2 s; the default is 8
// (StatePlacement::grad_ring_depth, config gradient_ring_depth).
// The executor allocates it and the planner (plan/state_bytes.cpp) counts it from this one function.
constexpr int kGradRingDepth = 8;
inline int64_t grad_ring_elems(std::vector<int64_t> unit_sizes, int depth = kGradRingDepth) {
  if (unit_sizes.empty()) return 0;
  std::sort(unit_sizes.begin(), unit_sizes.end());
  int64_t all = 0;
  for (int64_t n : unit_sizes) all += n;
  return std::max(unit_sizes.back(), std::min(all, int64_t(depth) * unit_sizes[unit_sizes.size() / 2]));
}

// The storage modes of one run. The planner fills it (plan JSON: "master_weights", "gradients");
// the trainer may force either part from its config.
struct StatePlacement {
  MasterMode master = MasterMode::Fp32;
  GradHome grads = GradHome::Host;
  GradDType grad_dtype = GradDType::F32;  // of the gradients, held (grads == Device) or on the host
  bool embedding_8bit = false;            // the input embedding's moments 8-bit too (8-bit optimizers)
  // The optimizer moments of the last nvme_layers decoder layers live in files on the NVMe tier
  // (optim/nvme_moments.h), staged through DRAM slots; 0 = every moment in DRAM.
  int64_t nvme_layers = 0;
  // Split fp32 masters only: the 16-bit master remainders of those nvme_layers layers live in their NVMe moment
  // images too (optim::UnitSpec::remainders_on_nvme): 2 B/param less DRAM, 2 B/param more NVMe, and each such layer's
  // read and write-back per step grows by as much (the planner's last rung).
  bool nvme_remainders = false;
  // Gradients held on the device: the pinned staging ring's depth in median units (grad_ring_elems). A shallower ring
  // gives its DRAM (2 B/param of a layer in bf16 per unit) to checkpoints; the optimizer then runs at most that many
  // units ahead of the next forward.
  int grad_ring_depth = kGradRingDepth;
  // Gradients held on the device in bf16 with an untied LM head: the head's weight gradient is computed by vocabulary
  // slices straight into its held gradient (one more logits GEMM) and the embedding's accumulated into its held one,
  // so neither needs a [vocab, hidden] fp32 buffer on the device (Backend::head_lm_grad_slice).
  bool head_grad_slices = false;
  // Data parallelism (docs/distributed.md, "Planner"): the optimizer moments are sharded over
  // moment_shards ranks (each holds 1/moment_shards of them), and the master is a full fp32 array
  // beside the bf16 streaming copy (6 B/param instead of the split 4 B) when fp32_master_array.
  int moment_shards = 1;
  bool fp32_master_array = false;
  // The embedding's update runs on the GPU (exec/device_update.h): its table is on the device anyway (tied to the LM
  // head), and its master remainders and fp32 moments join it in HBM (10 B/param); no host gradient for it.
  bool embedding_update_device = false;
  // The first device_update_layers decoder layers are updated on the GPU too (exec/device_update.h): their bf16
  // weights stay in HBM (no upload), their gradient never leaves it, and their master remainders and moments (fp32 or
  // 8-bit, as the optimizer keeps them) join them there. The next step's first forwards then never wait for the CPU
  // optimizer, which starts on the later layers at once. 0 = none.
  int64_t device_update_layers = 0;
  // Gradients on the host in bf16 (rounded on the device as they leave).
  bool host_bf16_grads() const { return grads == GradHome::Host && grad_dtype == GradDType::Bf16; }
  // Unit u (0 = embedding, 1..L = layers) is updated on the GPU.
  bool updated_on_device(int64_t u) const {
    return (u == 0 && embedding_update_device) || (u >= 1 && u <= device_update_layers);
  }
};

}  // namespace lt
