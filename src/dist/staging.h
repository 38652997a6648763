// Rounds of a host-staged collective (NcclCommunicator with host buffers): the per-rank ranges of the
// array are moved through a device scratch buffer of W slots of `piece` elements; in round k every rank
// range contributes its k-th piece (at most `piece` elements) into slot `root`. Pure arithmetic, kept
// apart from NCCL so that it is tested on the CPU.
#pragma once
#include <cstdint>
#include <vector>

namespace lt::dist {

struct StagePiece {
  int root = 0;           // the rank whose range this piece belongs to (NCCL root of the reduce/broadcast)
  int64_t elem = 0;       // first element in the array
  int64_t count = 0;      // elements
  int64_t scratch = 0;    // first element in the scratch buffer (root * piece)
};

std::vector<std::vector<StagePiece>> staging_rounds(const std::vector<int64_t>& bounds, int64_t piece);

}  // namespace lt::dist
