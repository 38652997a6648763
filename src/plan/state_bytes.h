// Bytes and home of each part of the model state for one placement (docs/memory.md).
// Per parameter, on the bf16-streaming (CUDA) backend:
//   master + streaming copy  fp32: 4 B (bf16 copy + 16-bit remainder); bf16-sr: 2 B         DRAM
//   gradients                host: fp32 4 B, pinned                                       DRAM
//                            host bf16 (gradient_dtype bf16): 2 B, pinned; each leaves the
//                            GPU rounded, through 2 bf16 buffers of the largest layer       DRAM (+ HBM)
//                            device: fp32 4 B or bf16 2 B held for the whole step (every
//                            unit: an untied embedding's table is then resident in HBM,
//                            its lookup and backward on the GPU)                           HBM
//                            bf16 held: + fp32 scratch the backward writes before the add
//                            (2 layer buffers, the LM head's and the embedding's: one
//                            buffer for both when untied)                                  HBM
//   moments                  fp32 8 B, or 8-bit 2 B + one fp32 absmax per 256 per moment    DRAM
//   the last nvme_layers layers' moments: in NVMe files, updated in DRAM staging slots (3 x the largest such layer's
//                            image at most); nvme_remainders (split fp32 masters): their 2 B of master remainders
//                            join the files (master 2 B/param in DRAM for them), the slots grow by as much   NVMe
//   data parallel (placement.moment_shards > 1): moments / moment_shards (the rank's shard);
//                            fp32_master_array: master fp32 4 B + bf16 streaming copy 2 B  DRAM
//   embedding updated on the GPU (embedding_update_device): its remainders 2 B + fp32 moments 8 B in HBM instead of
//                            DRAM, no host gradient for it                                   HBM
//   layers updated on the GPU (device_update_layers, the first k): their bf16 weights 2 B, remainders 2 B, moments
//                            (as above) and an fp32 gradient 4 B in HBM; no host gradient (the DRAM copies of
//                            master and moments stay, written back at a checkpoint)                     HBM
//   staging (pinned)         host: 2 bf16 slabs of the largest layer (D2H double buffer; none in bf16);
//                            device: the ring of grad_ring_elems in the held dtype          DRAM
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/model_state.h"
#include "model/model_config.h"
#include "model/param_layout.h"

namespace lt {

// Optimizer-moment bytes of a tensor of n elements: fp32 m and v (8 B each element), or 8-bit codes
// with one fp32 absmax per 256 elements for each moment.
double moment_bytes(int64_t n, bool q8);

// Master + bf16 streaming copy, bytes per parameter.
double master_bytes_per_param(MasterMode m);
double master_bytes_per_param(const StatePlacement& s);  // 6 with fp32_master_array

// The planner makes an untied embedding resident in HBM when gradients are held there (Plan::
// embedding_resident): its fp32 host gradient (4 B/param of the vocabulary) would otherwise stay in DRAM.
bool embedding_resident_for(const ModelConfig& c, const StatePlacement& s);
// Where the head's gradient can go by vocabulary slices (StatePlacement::head_grad_slices): gradients held on the
// device in bf16 (accumulated from fp32 pieces) and an untied head.
bool head_grad_slices_apply(const ModelConfig& c, const StatePlacement& s);

enum class StateHome : uint8_t { Gpu, Dram, Nvme };
const char* state_home_name(StateHome h);  // "gpu", "dram", "nvme"

struct StatePart {
  std::string name;
  StateHome home = StateHome::Dram;
  double bytes = 0;
};

struct StateBytes {
  StatePlacement placement;
  int64_t params = 0;           // parameters (tied counted once)
  int64_t eight_bit_tensors = 0;
  double master = 0;            // master + streaming copy (DRAM)
  double grads_host = 0;        // fp32 accumulators in pinned DRAM
  double grads_device = 0;      // gradients held in HBM (placement.grad_dtype)
  double grad_scratch = 0;      // HBM: fp32 buffers the backward writes (host gradients: before their D2H; bf16
                                //   held ones: before adding into them)
  double resident_table = 0;    // HBM: an untied embedding's bf16 table (embedding_resident_for)
  double head_weights = 0;      // HBM: the bf16 head (final norm + LM head; tied: the embedding table), on the
                                //   device for the whole step (exec/executor_setup.cpp "weights.head")
  double device_update = 0;     // HBM: the embedding's master remainders and fp32 moments (embedding_update_device)
  double device_layers = 0;     // HBM: the layers updated on the GPU (device_update_layers): weights, remainders,
                                //   moments, gradient
  double moments = 0;           // DRAM
  double moments_nvme = 0;      // moments of the NVMe layers (files on the NVMe tier)
  double remainders_nvme = 0;   // the NVMe layers' master remainders in the same files (placement.nvme_remainders)
  double moment_staging = 0;    // DRAM slots the NVMe moments are updated in (3 x the largest such layer's)
  double staging = 0;           // pinned DRAM receiving the gradient D2H
  double dram() const { return master + grads_host + moments + moment_staging + staging; }
  double hbm() const { return grads_device + grad_scratch + resident_table + head_weights + device_update + device_layers; }
  double nvme() const { return moments_nvme + remainders_nvme; }
  // The non-empty parts with a display name ("master + copy (fp32)", "gradients (fp32, held)", ...).
  std::vector<StatePart> parts() const;
};

StateBytes model_state_bytes(const ModelConfig& c, const std::vector<std::string>& eight_bit, StatePlacement s);

// Whether decoder layer j's moments live on NVMe under placement s (the last s.nvme_layers layers).
inline bool moments_on_nvme(const ModelConfig& c, int64_t layer, const StatePlacement& s) {
  return layer >= c.layers - s.nvme_layers;
}
// Moment bytes of decoder layer j (its tensors' formats from eight_bit).
double layer_moment_bytes(const ModelConfig& c, int64_t layer, const std::vector<std::string>& eight_bit);
// Whether s keeps the NVMe layers' master remainders in their files: asked for, and the masters are split fp32 (not
// bf16-sr, not fp32 arrays).
inline bool remainders_on_nvme(const StatePlacement& s) {
  return s.nvme_remainders && s.nvme_layers > 0 && s.master == MasterMode::Fp32 && !s.fp32_master_array;
}
// The NVMe image of decoder layer j under s: its moment bytes, + 2 B/param of remainders (remainders_on_nvme).
double layer_nvme_image_bytes(const ModelConfig& c, int64_t layer, const std::vector<std::string>& eight_bit,
                              const StatePlacement& s);

}  // namespace lt
