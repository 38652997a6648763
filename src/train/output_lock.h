// The exclusive lock of a training run on its output directory: an flock(2) on output_dir/.lazytrain.lock,
// held from before the resume point is chosen until the run ends (the kernel releases it when the
// process dies, however it dies). A second run into the same directory fails at once with an error
// naming the holder, read from the lock file: pid, host, start time and command line. Under
// `lazytrain launch` rank 0 alone takes it (DataParallel::prepare_output_dir).
#pragma once
#include <filesystem>
#include <string>

namespace lt::train {

namespace fs = std::filesystem;

inline constexpr const char* kOutputLockName = ".lazytrain.lock";

class OutputLock {
 public:
  OutputLock() = default;  // holds nothing
  // Creates output_dir if needed and takes its lock; throws lt::Error naming the holder when another
  // process (or another OutputLock of this one) has it.
  static OutputLock acquire(const fs::path& output_dir);
  // Removes the lock file, then releases the lock.
  ~OutputLock();
  OutputLock(OutputLock&& o) noexcept;
  OutputLock& operator=(OutputLock&& o) noexcept;
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

  bool held() const { return fd_ >= 0; }
  const fs::path& path() const { return path_; }

 private:
  void release();
  int fd_ = -1;
  fs::path path_;
};

// What a lock file says about its holder ("pid 12 on host h, started 2026-01-02 03:04:05, command: ..."),
// or why nothing is known.
std::string describe_lock_holder(const fs::path& lock_file);

}  // namespace lt::train
