// World-size-independent optimizer state: merges the per-rank shard state files (CpuAdamW::save of a
// rank's sharded optimizer) into the file an unsharded CpuAdamW would write for the same moments, and
// splits such a file into one rank's shard file for any world size. Shard cuts lie on 8-bit block
// boundaries (shard.h), so fp32 moments, 8-bit codes and block scales are copied, never requantised:
// merge(split(f)) == f byte for byte, and a checkpoint does not depend on the world size that wrote it.
//
// The file format is optim's (src/optim/state_io.h, version 1), read and written with its StateReader /
// StateWriter: magic, version, block size, both checksums and the layout are checked against the expected one.
#pragma once
#include <filesystem>
#include <vector>

#include "dist/shard.h"
#include "optim/optimizer.h"

namespace lt::dist {

void merge_state_shards(const std::vector<std::filesystem::path>& shard_files, const std::vector<optim::UnitSpec>& full,
                        const ShardLayout& shards, const std::filesystem::path& out);

void split_state_file(const std::filesystem::path& full_file, const std::vector<optim::UnitSpec>& full,
                      const ShardLayout& shards, int rank, const std::filesystem::path& out);

}  // namespace lt::dist
