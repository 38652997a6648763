// The space a run writes under nvme_dir, checked against the disk before training (a full disk mid-run loses the
// step's moments: optim/nvme_moments.h "Faults"). The NVMe files are scratch: the checkpoints hold the state.
#pragma once
#include <cstdint>
#include <string>

namespace lt::train {

// Bytes free to an unprivileged writer on the filesystem of dir (statvfs f_bavail x f_frsize); -1 when it cannot be
// read (the directory does not exist).
int64_t free_disk_bytes(const std::string& dir);
// The same for a directory the run creates later: the free bytes of its nearest existing parent's filesystem (what
// the planner may use before the directory exists); -1 when none can be read.
int64_t free_disk_bytes_of_future_dir(const std::string& dir);

struct NvmeNeed {
  int64_t moment_files = 0;  // the moments' unit images on NVMe (CpuAdamW::moment_homes().nvme)
  int64_t checkpoints = 0;   // the plan's activation checkpoints on NVMe
  bool resuming = false;     // a resume loads the moments: both generations of each file exist until it passed
  // Bytes: the moment files (twice while resuming) and the checkpoints.
  int64_t bytes() const { return moment_files * (resuming ? 2 : 1) + checkpoints; }
};

// Throws naming dir, the need (with its parts) and the free space when the disk holds less than need.bytes(); nothing
// when nothing goes to NVMe. `free_bytes` < 0: read with free_disk_bytes(dir).
void check_nvme_space(const std::string& dir, const NvmeNeed& need, int64_t free_bytes = -1);

}  // namespace lt::train
