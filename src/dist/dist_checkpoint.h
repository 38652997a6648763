// Checkpoint save/load for a data-parallel run, in the single-process layout (src/train/checkpoint.h):
//   <dir>/config.json, model*.safetensors         HF model, bf16 (rank 0)
//   <dir>/trainer_state/master/                   fp32 masters, HF dir (rank 0)
//   <dir>/trainer_state/optimizer.bin             optimizer state of the WHOLE model (merged from the shards)
// The files do not depend on the world size that wrote them; load works with any world size (the
// optimizer file is split for the loading rank's shard). Ranks share the filesystem (one host, or a
// shared mount). Collective: every rank calls these.
#pragma once
#include <filesystem>
#include <vector>

#include "dist/communicator.h"
#include "dist/data_parallel.h"
#include "model/model_config.h"
#include "model/param_layout.h"

namespace lt::dist {

struct DistModel {
  const ModelConfig* model = nullptr;
  const ModelLayout* layout = nullptr;
  HostState* state = nullptr;
  optim::CpuAdamW* shard_opt = nullptr;          // this rank's sharded optimizer
  const std::vector<optim::UnitSpec>* full_specs = nullptr;  // unsharded optimizer layout
  const ShardLayout* shards = nullptr;
};

// Finishes pending updates and gathers the masters (hook.gather_masters()), then writes the checkpoint.
void save_dist_checkpoint(const std::filesystem::path& dir, Communicator& comm, ShardedUpdateHook& hook,
                          const DistModel& m);
// Loads masters (and refreshes the streaming copies) and this rank's optimizer shard.
void load_dist_checkpoint(const std::filesystem::path& dir, Communicator& comm, const DistModel& m);

}  // namespace lt::dist
