#include "dist/shm_comm.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <new>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "core/timer.h"
#include "dist/rendezvous.h"

namespace lt::dist {
namespace fs = std::filesystem;

namespace {
constexpr uint64_t kMagic = 0x4c54'5348'4d43'0002ull;  // "LTSHMC" v2
constexpr int kMaxWorld = 1024;
constexpr int64_t kPage = 4096;
}  // namespace

// The shared page(s) before the slots. Lock-free atomics only (process-shared by construction).
struct ShmCommunicator::Shared {
  std::atomic<uint64_t> magic;  // written last by rank 0
  int32_t world;
  int64_t slot_bytes;
  std::atomic<uint32_t> generation;  // futex word: bumped by the last rank to arrive at a barrier
  std::atomic<int32_t> arrived;
  std::atomic<int64_t> completed;    // barriers completed (set by the last rank to arrive, before the bump)
  std::atomic<int32_t> failed_rank;  // -1: none
  char fail_msg[512];
  std::atomic<int32_t> pid[kMaxWorld];
  std::atomic<int64_t> passed[kMaxWorld];  // barriers each rank has entered
};
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free);

namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// A process that no longer runs: gone, or a zombie not reaped yet.
bool process_gone(int pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream st("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(st, line)) return false;
  const size_t p = line.rfind(')');
  return p != std::string::npos && p + 2 < line.size() && (line[p + 2] == 'Z' || line[p + 2] == 'X');
}

void futex_wait(std::atomic<uint32_t>* w, uint32_t expected, double seconds) {
  timespec ts{};
  ts.tv_sec = time_t(seconds);
  ts.tv_nsec = long((seconds - double(ts.tv_sec)) * 1e9);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* w) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

std::string rank_list(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

namespace {

// Where the segment lives: a POSIX shared memory object (tmpfs, never written back to a disk) or, where
// shm_open is unavailable, a file in the rendezvous directory. Rank 0 publishes "shm:<name>" or
// "file:<path>" under the communicator's key in the rendezvous directory.
struct Segment {
  bool posix = true;
  std::string where;
  std::string text() const { return (posix ? "shm:" : "file:") + where; }
  static Segment parse(const std::string& t) {
    Segment s;
    s.posix = t.rfind("shm:", 0) == 0;
    LT_CHECK(s.posix || t.rfind("file:", 0) == 0, "shm communicator: malformed rendezvous entry '{}'", t);
    s.where = t.substr(s.posix ? 4 : 5);
    return s;
  }
  std::string describe() const { return posix ? "shared memory object " + where : where; }
  int create(const fs::path& dir, const std::string& key) {
    posix = true;
    where = fmt::format("/lt-{}-{}", key, ::getpid());
    const int fd = ::shm_open(where.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) return fd;
    posix = false;
    where = (dir / fmt::format(".{}.{}.segment", key, ::getpid())).string();
    return ::open(where.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  }
  int open() const {
    return posix ? ::shm_open(where.c_str(), O_RDWR | O_CLOEXEC, 0) : ::open(where.c_str(), O_RDWR | O_CLOEXEC);
  }
  void remove() const {
    if (posix)
      ::shm_unlink(where.c_str());
    else
      ::unlink(where.c_str());
  }
};

void* map_segment(int fd, int64_t bytes, const Segment& s) {
  void* p = ::mmap(nullptr, size_t(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  ::close(fd);
  LT_CHECK(p != MAP_FAILED, "shm communicator: cannot map {}: {}", s.describe(), std::strerror(e));
  return p;
}

}  // namespace

std::unique_ptr<ShmCommunicator> ShmCommunicator::create(const DistEnv& env, const ShmCommOptions& o) {
  LT_CHECK(env.world >= 1 && env.world <= kMaxWorld, "shm communicator: world size {} outside [1, {}]", env.world,
           kMaxWorld);
  LT_CHECK(!env.rdzv_dir.empty(), "shm communicator: no rendezvous directory (LT_RDZV_DIR; start the ranks with "
                                  "`lazytrain launch -n N`)");
  LT_CHECK(o.timeout_s > 0 && o.slot_bytes >= 64, "shm communicator: timeout {} s / slot {} bytes must be positive",
           o.timeout_s, o.slot_bytes);
  std::unique_ptr<ShmCommunicator> c(new ShmCommunicator());
  c->rank_ = env.rank;
  c->world_ = env.world;
  c->timeout_s_ = o.timeout_s;
  c->slot_bytes_ = round_up(o.slot_bytes, 64);
  const int64_t head = round_up(int64_t(sizeof(Shared)), kPage);
  c->map_bytes_ = head + c->slot_bytes_ * env.world;
  const fs::path dir = env.rdzv_dir;
  Segment seg;
  if (env.rank == 0) {
    std::error_code ec;
    fs::remove(dir / o.key, ec);  // a previous run's entry (a crash during its setup)
    const int fd = seg.create(dir, o.key);
    LT_CHECK(fd >= 0, "shm communicator: cannot create {}: {}", seg.describe(), std::strerror(errno));
    if (::ftruncate(fd, off_t(c->map_bytes_)) != 0) {
      const int e = errno;
      ::close(fd);
      seg.remove();
      fail("shm communicator: cannot size {} to {} bytes: {}", seg.describe(), c->map_bytes_, std::strerror(e));
    }
    auto* sh = new (map_segment(fd, c->map_bytes_, seg)) Shared();
    sh->world = env.world;
    sh->slot_bytes = c->slot_bytes_;
    sh->generation.store(0);
    sh->arrived.store(0);
    sh->failed_rank.store(-1);
    sh->completed.store(0);
    for (int r = 0; r < kMaxWorld; ++r) {
      sh->pid[r].store(0);
      sh->passed[r].store(0);
    }
    sh->magic.store(kMagic);
    c->sh_ = sh;
    rdzv_publish(dir, o.key, seg.text());  // only now: the others never map a half-initialised segment
  } else {
    // A stale entry (its segment gone) is replaced by rank 0's: read it again until the segment opens.
    const double t0 = now_seconds();
    int fd = -1;
    for (;;) {
      seg = Segment::parse(rdzv_wait(dir, o.key, std::max(0.01, o.timeout_s - (now_seconds() - t0))));
      fd = seg.open();
      if (fd >= 0) break;
      LT_CHECK(now_seconds() - t0 < o.timeout_s, "shm communicator: rank {}: cannot open {} published in {}: {}",
               env.rank, seg.describe(), dir.string(), std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    struct stat sb {};
    ::fstat(fd, &sb);
    if (int64_t(sb.st_size) != c->map_bytes_) {
      ::close(fd);
      fail("shm communicator: rank {}: {} has {} bytes, expected {} for {} ranks of {}-byte slots (do all ranks "
           "use the same world size and slot size?)",
           env.rank, seg.describe(), int64_t(sb.st_size), c->map_bytes_, env.world, c->slot_bytes_);
    }
    c->sh_ = static_cast<Shared*>(map_segment(fd, c->map_bytes_, seg));
    LT_CHECK(c->sh_->magic.load() == kMagic && c->sh_->world == env.world,
             "shm communicator: rank {}: {} is not a segment for {} ranks (world {} in it)", env.rank, seg.describe(),
             env.world, c->sh_->world);
  }
  c->slots_ = reinterpret_cast<char*>(c->sh_) + head;
  c->sh_->pid[env.rank].store(int32_t(::getpid()));
  try {
    c->sync("setup");
  } catch (...) {
    if (env.rank == 0) seg.remove();
    throw;
  }
  if (env.rank == 0) {  // every rank has it mapped: nothing is left behind, whatever happens next
    seg.remove();
    std::error_code ec;
    fs::remove(dir / o.key, ec);
  }
  return c;
}

ShmCommunicator::~ShmCommunicator() {
  if (!sh_) return;
  if (std::uncaught_exceptions() > 0) abort("its process is ending with an error");
  ::munmap(sh_, size_t(map_bytes_));
}

char* ShmCommunicator::slot(int r) const { return slots_ + slot_bytes_ * r; }

void ShmCommunicator::abort(const std::string& why) {
  int32_t none = -1;
  if (sh_->failed_rank.compare_exchange_strong(none, -2)) {  // -2: message being written
    const size_t n = std::min(why.size(), sizeof(sh_->fail_msg) - 1);
    std::memcpy(sh_->fail_msg, why.data(), n);
    sh_->fail_msg[n] = '\0';
    sh_->failed_rank.store(rank_);
  }
  sh_->generation.fetch_add(1);  // wake the waiters so that they see the failure
  futex_wake_all(&sh_->generation);
}

void ShmCommunicator::fail_collective(const char* op, const std::string& what) {
  const std::string msg = fmt::format("communicator (shm): rank {}: {} failed: {}", rank_, op, what);
  abort(msg);
  throw Error(msg);
}

void ShmCommunicator::sync(const char* op) {
  const auto check_failed = [&] {
    const int32_t f = sh_->failed_rank.load();
    if (f == -1) return;
    while (sh_->failed_rank.load() == -2) std::this_thread::yield();
    const int32_t who = sh_->failed_rank.load();
    throw Error(fmt::format("communicator (shm): rank {}: {} stopped: rank {} failed: {}", rank_, op, who,
                            sh_->fail_msg));
  };
  check_failed();
  const int64_t my = ++syncs_;
  sh_->passed[rank_].store(my);
  const uint32_t gen = sh_->generation.load();
  if (sh_->arrived.fetch_add(1) + 1 == world_) {
    sh_->arrived.store(0);
    sh_->completed.store(my);
    sh_->generation.fetch_add(1);
    futex_wake_all(&sh_->generation);
    return;
  }
  const double t0 = now_seconds();
  double next_liveness = t0 + 0.1;
  for (int spin = 0;; ++spin) {
    if (sh_->generation.load() != gen) {
      // Completed, or woken by abort(): a rank that failed after the barrier completed is this rank's news at its
      // next collective, not this one's (which passed).
      if (sh_->completed.load() < my) check_failed();
      return;
    }
    if (spin < 200) {
      std::this_thread::yield();
      continue;
    }
    futex_wait(&sh_->generation, gen, 0.02);
    if (sh_->generation.load() != gen) continue;
    check_failed();
    const double now = now_seconds();
    if (now < next_liveness) continue;
    next_liveness = now + 0.1;
    std::vector<int> missing, gone;
    for (int q = 0; q < world_; ++q) {
      if (q == rank_ || sh_->passed[q].load() >= my) continue;
      missing.push_back(q);
      if (process_gone(sh_->pid[q].load())) gone.push_back(q);
    }
    if (sh_->generation.load() != gen) continue;  // the barrier completed meanwhile
    if (!gone.empty())
      fail_collective(op, fmt::format("rank(s) {} exited (their process is gone) before reaching it", rank_list(gone)));
    if (now - t0 > timeout_s_)
      fail_collective(op, fmt::format("rank(s) {} did not arrive within {:.0f} s (hung or much slower; the timeout "
                                      "is LT_COMM_TIMEOUT_S)",
                                      rank_list(missing), timeout_s_));
  }
}

void ShmCommunicator::reduce_scatter(void* buf, const std::vector<int64_t>& b, CommType t) {
  reduce_scatter_as(buf, b, t, "reduce_scatter");
}

void ShmCommunicator::all_gather(void* buf, const std::vector<int64_t>& b, CommType t) {
  all_gather_as(buf, b, t, "all_gather");
}

void ShmCommunicator::reduce_scatter_as(void* buf, const std::vector<int64_t>& b, CommType t, const char* op) {
  check_bounds(b, world_, op);
  LT_CHECK(t != CommType::BF16, "reduce_scatter: bf16 reduction is not supported (reduce in fp32)");
  const int64_t es = int64_t(comm_type_size(t)), cap = slot_bytes_ / es, n = b.back();
  const int64_t lo = b[size_t(rank_)], hi = b[size_t(rank_) + 1];
  char* out = static_cast<char*>(buf);
  std::vector<const char*> src(static_cast<size_t>(world_));
  for (int q = 0; q < world_; ++q) src[size_t(q)] = slot(q);
  for (int64_t off = 0; off < n; off += cap) {
    const int64_t len = std::min(cap, n - off);
    std::memcpy(slot(rank_), out + off * es, size_t(len * es));
    sync(op);
    const int64_t a = std::max(lo, off), e = std::min(hi, off + len);
    if (e > a) {
      std::vector<const char*> s(src);
      for (auto& p : s) p += (a - off) * es;
      sum_in_rank_order(s, out + a * es, e - a, t);
    }
    sync(op);
  }
}

void ShmCommunicator::all_gather_as(void* buf, const std::vector<int64_t>& b, CommType t, const char* op) {
  check_bounds(b, world_, op);
  const int64_t es = int64_t(comm_type_size(t)), cap = slot_bytes_ / es;
  int64_t longest = 0;
  for (int q = 0; q < world_; ++q) longest = std::max(longest, b[size_t(q) + 1] - b[size_t(q)]);
  char* io = static_cast<char*>(buf);
  for (int64_t k = 0; k < longest; k += cap) {
    const auto piece = [&](int q, int64_t* at) {
      *at = b[size_t(q)] + k;
      return std::max<int64_t>(0, std::min(b[size_t(q) + 1], *at + cap) - *at);
    };
    int64_t at = 0;
    const int64_t mine = piece(rank_, &at);
    if (mine > 0) std::memcpy(slot(rank_), io + at * es, size_t(mine * es));
    sync(op);
    for (int q = 0; q < world_; ++q) {
      if (q == rank_) continue;
      const int64_t c = piece(q, &at);
      if (c > 0) std::memcpy(io + at * es, slot(q), size_t(c * es));
    }
    sync(op);
  }
}

void ShmCommunicator::all_reduce(void* buf, int64_t n, CommType t) {
  const auto b = even_bounds(n, world_);
  reduce_scatter_as(buf, b, t, "all_reduce");
  all_gather_as(buf, b, t, "all_reduce");
}

void ShmCommunicator::broadcast(void* buf, int64_t n, CommType t, int root) {
  LT_CHECK(root >= 0 && root < world_, "broadcast: root {} out of range [0, {})", root, world_);
  const int64_t es = int64_t(comm_type_size(t)), cap = slot_bytes_ / es;
  char* io = static_cast<char*>(buf);
  for (int64_t off = 0; off < n; off += cap) {
    const int64_t len = std::min(cap, n - off);
    if (rank_ == root) std::memcpy(slot(root), io + off * es, size_t(len * es));
    sync("broadcast");
    if (rank_ != root) std::memcpy(io + off * es, slot(root), size_t(len * es));
    sync("broadcast");
  }
}

}  // namespace lt::dist
