// File rendezvous for ranks started by `lazytrain launch` on one host (or hosts sharing a directory):
// rank 0 publishes a small blob (the NCCL unique id) under a key in LT_RDZV_DIR, the others wait for it.
// Writes are atomic (temp file + rename), so a reader never sees a partial blob.
//
// The rendezvous directory `lazytrain launch` makes (RendezvousDir): lt-rdzv-XXXXXX under $TMPDIR, locked
// (flock) by the launcher and, through a descriptor they inherit, by its ranks, and removed when the
// launch ends. A launch killed by SIGKILL cannot remove it (its ranks get SIGTERM and end); the next
// launch removes every lt-rdzv-* directory of this user whose lock nobody holds any more.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace lt::dist {

class RendezvousDir {
 public:
  // A new directory under parent, locked by this process.
  static RendezvousDir create(const std::filesystem::path& parent);
  ~RendezvousDir();  // removes the directory, then drops the lock
  RendezvousDir(RendezvousDir&& o) noexcept;
  RendezvousDir(const RendezvousDir&) = delete;
  RendezvousDir& operator=(const RendezvousDir&) = delete;
  RendezvousDir& operator=(RendezvousDir&&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // The locked descriptor (close-on-exec): a rank that keeps it open across exec keeps the directory alive.
  int lock_fd() const { return fd_; }

 private:
  RendezvousDir() = default;
  std::filesystem::path path_;
  int fd_ = -1;
};

// Removes the lt-rdzv-* directories under parent that belong to this user and whose lock is free (their
// launcher and ranks have ended); returns them.
std::vector<std::filesystem::path> remove_stale_rendezvous_dirs(const std::filesystem::path& parent);

void rdzv_publish(const std::filesystem::path& dir, const std::string& key, const std::string& bytes);
// Waits up to timeout_s for the key; throws lt::Error naming the directory and key on timeout.
std::string rdzv_wait(const std::filesystem::path& dir, const std::string& key, double timeout_s);

}  // namespace lt::dist
