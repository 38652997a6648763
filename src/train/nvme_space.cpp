// The NVMe space check before training (nvme_space.h).
#include "train/nvme_space.h"

#include <sys/statvfs.h>

#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"

namespace lt::train {

int64_t free_disk_bytes(const std::string& dir) {
  struct statvfs s {};
  if (dir.empty() || ::statvfs(dir.c_str(), &s) != 0) return -1;
  return int64_t(s.f_bavail) * int64_t(s.f_frsize);
}

int64_t free_disk_bytes_of_future_dir(const std::string& dir) {
  if (dir.empty()) return -1;
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(dir, ec);
  while (!std::filesystem::exists(p, ec) && p.has_parent_path() && p.parent_path() != p) p = p.parent_path();
  return free_disk_bytes(p.string());
}

void check_nvme_space(const std::string& dir, const NvmeNeed& need, int64_t free_bytes) {
  if (need.bytes() <= 0) return;
  if (free_bytes < 0) free_bytes = free_disk_bytes(dir);
  LT_CHECK(free_bytes >= 0, "nvme_dir '{}': cannot read its free space (statvfs failed: does the directory exist?)",
           dir);
  if (need.bytes() <= free_bytes) return;
  const std::string moments =
      need.moment_files > 0
          ? fmt::format("{} of optimizer moment files{}", format_bytes(double(need.moment_files)),
                        need.resuming ? ", twice while the resume loads them" : "")
          : std::string();
  const std::string ckpts =
      need.checkpoints > 0 ? fmt::format("{} of activation checkpoints", format_bytes(double(need.checkpoints))) : "";
  fail("nvme_dir '{}': the disk is too full: the run needs {} ({}{}{}), {} is free; free space there, set nvme_dir to "
       "a larger disk, or plan with nvme_mem at most the free space",
       dir, format_bytes(double(need.bytes())), moments, !moments.empty() && !ckpts.empty() ? " + " : "", ckpts,
       format_bytes(double(free_bytes)));
}

}  // namespace lt::train
