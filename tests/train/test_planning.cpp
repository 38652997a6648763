// The training plan's NVMe queue (train/planning.h, nvme_queue_shape): the rule at the profile's faster NVMe rate and
// its latency (or the default), and the profile's overrides.
#include <gtest/gtest.h>

#include "../common/repo_path.h"
#include "nvme/io_queue.h"
#include "plan/profile.h"
#include "train/planning.h"

using namespace lt;

namespace {

TEST(Planning, NvmeQueueFromTheProfile) {
  ResourceProfile p = load_profile_file(lt::testing::repo_root().string() + "/configs/profiles/rtx3090-24g.json");
  // 3.5 GB/s read (faster than the 3.0 GB/s write), the default 100 us: 4 x 2 MiB (nvme/io_queue.h by hand).
  IoQueueShape s = train::nvme_queue_shape(p);
  EXPECT_EQ(s.depth, 4u);
  EXPECT_EQ(s.piece, 2 << 20);
  // A slow network disk: 5 ms at 2 GB/s: 11 x 1 MiB.
  p.nvme_read_bw = 2e9;
  p.nvme_write_bw = 1e9;
  p.nvme_latency_s = 5e-3;
  s = train::nvme_queue_shape(p);
  EXPECT_EQ(s.depth, 11u);
  EXPECT_EQ(s.piece, 1 << 20);
  // The profile's overrides.
  p.nvme_queue_depth = 32;
  p.nvme_request_bytes = 128 << 10;
  s = train::nvme_queue_shape(p);
  EXPECT_EQ(s.depth, 32u);
  EXPECT_EQ(s.piece, 128 << 10);
}

}  // namespace
