#include "nvme/nvme_store.h"

#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/units.h"

namespace lt {

namespace {

class PosixIo final : public IoLayer {
 public:
  std::string name() const override { return "posix"; }
  int open(const std::string& p, int flags, int mode) override {
    int fd = ::open(p.c_str(), flags, mode);
    return fd >= 0 ? fd : -errno;
  }
  int64_t pwrite(int fd, const void* b, int64_t n, int64_t off) override {
    ssize_t r = ::pwrite(fd, b, size_t(n), off);
    return r >= 0 ? r : -errno;
  }
  int64_t pread(int fd, void* b, int64_t n, int64_t off) override {
    ssize_t r = ::pread(fd, b, size_t(n), off);
    return r >= 0 ? r : -errno;
  }
  int close(int fd) override { return ::close(fd) == 0 ? 0 : -errno; }
  int unlink(const std::string& p) override { return ::unlink(p.c_str()) == 0 ? 0 : -errno; }
};

// pread/pwrite through io_uring: a request is split into pieces kept `depth` deep in flight.
class UringIo final : public IoLayer {
 public:
  UringIo(unsigned depth, int64_t piece) : depth_(depth), piece_(piece) {}
  bool init() { return io_uring_queue_init(depth_, &ring_, 0) == 0; }
  ~UringIo() override { io_uring_queue_exit(&ring_); }
  std::string name() const override { return "io_uring"; }
  int open(const std::string& p, int flags, int mode) override { return posix_.open(p, flags, mode); }
  int close(int fd) override { return posix_.close(fd); }
  int unlink(const std::string& p) override { return posix_.unlink(p); }
  int64_t pwrite(int fd, const void* b, int64_t n, int64_t off) override { return rw(true, fd, (void*)b, n, off); }
  int64_t pread(int fd, void* b, int64_t n, int64_t off) override { return rw(false, fd, b, n, off); }

 private:
  // Returns the bytes transferred contiguously from the start, or -errno of the first failed piece.
  int64_t rw(bool write, int fd, void* b, int64_t n, int64_t off) {
    std::lock_guard<std::mutex> g(mu_);
    const int64_t pieces = (n + piece_ - 1) / piece_;
    std::vector<int64_t> got(size_t(pieces), -1);
    int64_t next = 0, inflight = 0;
    while (next < pieces || inflight > 0) {
      while (next < pieces && inflight < int64_t(depth_)) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        if (!sqe) break;
        const int64_t o = next * piece_, len = std::min(piece_, n - o);
        char* p = static_cast<char*>(b) + o;
        if (write) io_uring_prep_write(sqe, fd, p, unsigned(len), uint64_t(off + o));
        else io_uring_prep_read(sqe, fd, p, unsigned(len), uint64_t(off + o));
        io_uring_sqe_set_data64(sqe, uint64_t(next));
        ++next;
        ++inflight;
      }
      int r = io_uring_submit(&ring_);
      if (r < 0) return r;
      io_uring_cqe* cqe = nullptr;
      r = io_uring_wait_cqe(&ring_, &cqe);
      if (r < 0) return r;
      got[size_t(io_uring_cqe_get_data64(cqe))] = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      --inflight;
    }
    int64_t total = 0;
    for (int64_t i = 0; i < pieces; ++i) {
      const int64_t len = std::min(piece_, n - i * piece_);
      if (got[size_t(i)] < 0) return total > 0 ? total : got[size_t(i)];
      total += got[size_t(i)];
      if (got[size_t(i)] < len) break;
    }
    return total;
  }
  unsigned depth_;
  int64_t piece_;
  io_uring ring_{};
  std::mutex mu_;
  PosixIo posix_;
};

std::string err_text(int64_t neg) {
  const int e = int(-neg);
  if (e == ENOSPC) return fmt::format("disk full (ENOSPC: {})", std::strerror(e));
  return fmt::format("{} (errno {})", std::strerror(e), e);
}

std::atomic<int64_t> g_store_counter{0};

}  // namespace

std::shared_ptr<IoLayer> posix_io() { return std::make_shared<PosixIo>(); }

std::shared_ptr<IoLayer> uring_io(unsigned depth, int64_t piece) {
  auto u = std::make_shared<UringIo>(depth, piece);
  if (!u->init()) return nullptr;
  return u;
}

std::shared_ptr<IoLayer> default_io() { return default_io(IoQueueShape{}); }

std::shared_ptr<IoLayer> default_io(const IoQueueShape& q) {
  if (auto u = uring_io(q.depth, q.piece)) return u;
  return posix_io();
}

NvmeStore::NvmeStore(const std::filesystem::path& dir, std::shared_ptr<IoLayer> io, std::string prefix)
    : io_(std::move(io)), prefix_(std::move(prefix)) {
  LT_CHECK(!dir.empty(), "NVMe tier: the plan puts checkpoints on NVMe but no --nvme-dir was given");
  if (!io_) io_ = default_io();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  LT_CHECK(!ec, "NVMe tier: cannot create directory {}: {}", dir.string(), ec.message());
  dir_ = dir / fmt::format("lazytrain-{}-{}", ::getpid(), g_store_counter++);
  std::filesystem::create_directory(dir_, ec);
  LT_CHECK(!ec, "NVMe tier: cannot create directory {}: {}", dir_.string(), ec.message());
}

NvmeStore::~NvmeStore() {
  remove_all();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);  // anything a failed write left behind
}

std::string NvmeStore::file_name(int64_t key) const { return (dir_ / fmt::format("{}-{}.bin", prefix_, key)).string(); }

int NvmeStore::open_file(const std::string& path, bool write) {
  const int base = write ? (O_WRONLY | O_CREAT) : O_RDONLY;
  int fd = io_->open(path, base | (direct_ ? O_DIRECT : 0), 0600);
  if (fd == -EINVAL && direct_) {  // tmpfs and some filesystems refuse O_DIRECT
    log_warn("NVMe tier: {} does not support O_DIRECT; using buffered I/O", dir_.string());
    direct_ = false;
    fd = io_->open(path, base, 0600);
  }
  if (fd < 0) fail("NVMe tier: cannot open {} for {}: {}", path, write ? "writing" : "reading", err_text(fd));
  return fd;
}

void NvmeStore::write(int64_t key, int64_t offset, const void* buf, int64_t bytes) {
  LT_CHECK(bytes % kIoAlign == 0 && offset % kIoAlign == 0 && reinterpret_cast<uintptr_t>(buf) % kIoAlign == 0,
           "NVMe tier: write of {} bytes at {} from {} is not {}-aligned", bytes, offset, buf, kIoAlign);
  const std::string path = file_name(key);
  {
    std::lock_guard<std::mutex> g(mu_);
    keys_.insert(key);
  }
  const int fd = open_file(path, true);
  int64_t done = 0;
  std::string err;
  while (done < bytes) {
    const int64_t r = io_->pwrite(fd, static_cast<const char*>(buf) + done, bytes - done, offset + done);
    if (r < 0) {
      err = err_text(r);
      break;
    }
    if (r == 0) {
      err = "no progress (0 bytes written)";
      break;
    }
    done += r;
  }
  io_->close(fd);
  if (!err.empty()) {
    remove(key);
    fail("NVMe tier: writing {} failed after {} of {} bytes at offset {}: {}", path, done, bytes, offset, err);
  }
}

void NvmeStore::read(int64_t key, int64_t offset, void* buf, int64_t bytes) {
  const std::string path = file_name(key);
  const int fd = open_file(path, false);
  int64_t done = 0;
  std::string err;
  while (done < bytes) {
    const int64_t r = io_->pread(fd, static_cast<char*>(buf) + done, bytes - done, offset + done);
    if (r < 0) {
      err = err_text(r);
      break;
    }
    if (r == 0) {
      err = fmt::format("short read: got {} of {} bytes at offset {}", done, bytes, offset);
      break;
    }
    done += r;
  }
  io_->close(fd);
  if (!err.empty()) fail("NVMe tier: reading {} failed: {}", path, err);
}

void NvmeStore::remove(int64_t key) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!keys_.erase(key)) return;
  }
  io_->unlink(file_name(key));
}

void NvmeStore::remove_all() {
  std::set<int64_t> ks;
  {
    std::lock_guard<std::mutex> g(mu_);
    ks.swap(keys_);
  }
  for (auto k : ks) io_->unlink(file_name(k));
}

int64_t NvmeStore::live_files() const {
  int64_t n = 0;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator(dir_, ec))
    if (e.is_regular_file()) ++n;
  return n;
}

}  // namespace lt
