// The NVMe space check before training (train/nvme_space.h): the need's parts, the error naming the directory, the
// need and the free space, and nothing checked when nothing goes to NVMe.
#include <gtest/gtest.h>

#include "../common/test_dir.h"
#include "core/error.h"
#include "core/units.h"
#include "train/nvme_space.h"

using namespace lt;
using namespace lt::train;

namespace {

std::string error_of(const std::string& dir, const NvmeNeed& n, int64_t free_bytes) {
  try {
    check_nvme_space(dir, n, free_bytes);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(NvmeSpace, NeedCountsTheMomentFilesTwiceWhileResuming) {
  NvmeNeed n{10 * GiB, 3 * GiB, false};
  EXPECT_EQ(n.bytes(), 13 * GiB);
  n.resuming = true;
  EXPECT_EQ(n.bytes(), 23 * GiB);
}

TEST(NvmeSpace, TooFullADiskIsAClearError) {
  const NvmeNeed n{10 * GiB, 3 * GiB, true};
  EXPECT_EQ(error_of("/ssd", n, 23 * GiB), "");
  const std::string e = error_of("/ssd", n, 20 * GiB);
  for (const char* want : {"nvme_dir '/ssd'", "needs 23.00 GiB", "10.00 GiB of optimizer moment files, twice while "
                           "the resume loads them", "3.00 GiB of activation checkpoints", "20.00 GiB is free"})
    EXPECT_NE(e.find(want), std::string::npos) << want << "\n" << e;
  EXPECT_NE(error_of("/ssd", {0, 3 * GiB, false}, GiB).find("(3.00 GiB of activation checkpoints)"), std::string::npos);
}

TEST(NvmeSpace, ReadsTheDisksFreeSpace) {
  lt::testing::TestDir d("lt_nvme_space_", "");
  EXPECT_GT(free_disk_bytes(d.p.string()), 0);
  EXPECT_EQ(free_disk_bytes((d.p / "missing").string()), -1);
  // The planner reads a directory the run creates later on its parent's disk.
  EXPECT_GT(free_disk_bytes_of_future_dir((d.p / "missing" / "deeper").string()), 0);
  EXPECT_NO_THROW(check_nvme_space(d.p.string(), {4096, 0, false}));
  EXPECT_NO_THROW(check_nvme_space((d.p / "missing").string(), {}));  // nothing goes to NVMe
  try {
    check_nvme_space((d.p / "missing").string(), {4096, 0, false});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot read its free space"), std::string::npos) << e.what();
  }
  // More than any disk holds.
  EXPECT_THROW(check_nvme_space(d.p.string(), {int64_t(1) << 60, 0, false}), Error);
}

}  // namespace
