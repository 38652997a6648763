// NVMe tier: activation checkpoints (exec) and optimizer moments (optim/nvme_moments.h) as real files in
// a private directory under --nvme-dir, written and read with O_DIRECT from 4096-aligned (pinned) buffers. File I/O goes through an injectable IoLayer (syscall-like:
// results >= 0, or -errno), so tests can inject write errors, short reads and a full disk.
// Defaults: io_uring (liburing) when the kernel allows it, else pread/pwrite.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "nvme/io_queue.h"

namespace lt {

constexpr int64_t kIoAlign = 4096;  // O_DIRECT alignment of buffers, sizes and offsets
inline int64_t io_round_up(int64_t n) { return (n + kIoAlign - 1) / kIoAlign * kIoAlign; }

class IoLayer {
 public:
  virtual ~IoLayer() = default;
  virtual std::string name() const = 0;
  virtual int open(const std::string& path, int flags, int mode) = 0;  // fd or -errno
  virtual int64_t pwrite(int fd, const void* buf, int64_t n, int64_t off) = 0;  // bytes or -errno
  virtual int64_t pread(int fd, void* buf, int64_t n, int64_t off) = 0;         // bytes (0 = EOF) or -errno
  virtual int close(int fd) = 0;
  virtual int unlink(const std::string& path) = 0;
};
std::shared_ptr<IoLayer> posix_io();
// nullptr if io_uring is unavailable here. piece: bytes per submitted request; depth: requests in flight.
std::shared_ptr<IoLayer> uring_io(unsigned depth = 8, int64_t piece = 1 << 20);
std::shared_ptr<IoLayer> default_io();          // io_uring 8 x 1 MiB, else pread/pwrite
std::shared_ptr<IoLayer> default_io(const IoQueueShape& q);  // io_uring of shape q, else pread/pwrite

class NvmeStore {
 public:
  // Creates <dir>/lazytrain-<pid>-<n>/ (dir must exist or be creatable); files are <prefix>-<key>.bin.
  NvmeStore(const std::filesystem::path& dir, std::shared_ptr<IoLayer> io, std::string prefix = "ckpt");
  ~NvmeStore();  // removes its files and its directory
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  // Writes bytes at offset (multiples of kIoAlign) from an aligned buffer to the file for key (created on
  // first use). On failure the file is removed and lt::Error says which file, how many bytes, and why
  // (ENOSPC: "disk full").
  void write(int64_t key, int64_t offset, const void* buf, int64_t bytes);
  // Reads exactly bytes at offset; a file that ends earlier is an error ("short read").
  void read(int64_t key, int64_t offset, void* buf, int64_t bytes);
  void remove(int64_t key);  // no-op if absent
  void remove_all();
  int64_t live_files() const;  // regular files present in the directory right now
  const std::filesystem::path& dir() const { return dir_; }
  bool direct() const { return direct_; }
  std::string file_name(int64_t key) const;

 private:
  int open_file(const std::string& path, bool write);
  std::filesystem::path dir_;
  std::shared_ptr<IoLayer> io_;
  std::string prefix_;
  bool direct_ = true;
  mutable std::mutex mu_;
  std::set<int64_t> keys_;
};

}  // namespace lt
