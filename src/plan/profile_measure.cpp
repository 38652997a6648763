// Short measurements for `lazytrain profile`: host memory bandwidth, NVMe O_DIRECT read/write and request latency, CPU
// AdamW throughput (fp32 and 8-bit blockwise moments), and the GPU hook registry.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/timer.h"
#include "core/units.h"
#include "plan/profile.h"

namespace lt {

namespace {
GpuProfiler g_gpu_profiler = nullptr;

template <typename F>
void parallel(int threads, int64_t n, F f) {
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    int64_t a = n * t / threads, b = n * (t + 1) / threads;
    ts.emplace_back([=] { f(a, b); });
  }
  for (auto& t : ts) t.join();
}

struct FreeDel {
  void operator()(void* p) const { std::free(p); }
};
using Buf = std::unique_ptr<char, FreeDel>;
Buf aligned(int64_t bytes) {
  void* p = std::aligned_alloc(4096, size_t((bytes + 4095) / 4096 * 4096));
  LT_CHECK(p, "cannot allocate {} for the measurement", format_bytes(double(bytes)));
  return Buf(static_cast<char*>(p));
}

// The disk's request latency, seconds: the median time of `samples` single 4 KiB reads (pread, one at a time:
// queue depth 1) at random 4 KiB-aligned offsets of the first `bytes` of the open file fd, O_DIRECT when fd is.
// The offsets come from a fixed seed, uniform over the file's blocks (O_DIRECT reads bypass the page cache, so a
// repeated block is read from the disk again). With buffered I/O the file's cache is dropped and read-ahead turned
// off first (POSIX_FADV_DONTNEED, POSIX_FADV_RANDOM).
double measure_read_latency(int fd, const std::filesystem::path& path, int64_t bytes, bool direct, int samples = 64) {
  constexpr int64_t kBlock = 4096;
  if (!direct) {
    ::posix_fadvise(fd, 0, bytes, POSIX_FADV_DONTNEED);
    ::posix_fadvise(fd, 0, bytes, POSIX_FADV_RANDOM);
  }
  Buf block = aligned(kBlock);
  std::mt19937_64 rng(12345);
  std::uniform_int_distribution<int64_t> pick(0, bytes / kBlock - 1);
  std::vector<double> t(static_cast<size_t>(samples));
  for (double& s : t) {
    const int64_t off = pick(rng) * kBlock;
    const double t0 = now_seconds();
    LT_CHECK(::pread(fd, block.get(), size_t(kBlock), off) == kBlock, "4 KiB read at offset {} of {} failed: {}", off,
             path.string(), std::strerror(errno));
    s = now_seconds() - t0;
  }
  std::nth_element(t.begin(), t.begin() + samples / 2, t.end());
  return t[size_t(samples / 2)];
}
}  // namespace

void register_gpu_profiler(GpuProfiler f) { g_gpu_profiler = f; }
GpuProfiler gpu_profiler() { return g_gpu_profiler; }

double measure_host_bandwidth(int threads, int64_t bytes, const ProgressFn& progress) {
  if (progress) progress(fmt::format("host memory: memcpy {} x 3 with {} threads", format_bytes(double(bytes)), threads));
  Buf a = aligned(bytes), b = aligned(bytes);
  parallel(threads, bytes, [&](int64_t x, int64_t y) {
    std::memset(a.get() + x, 1, size_t(y - x));
    std::memset(b.get() + x, 2, size_t(y - x));
  });
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    double t0 = now_seconds();
    parallel(threads, bytes, [&](int64_t x, int64_t y) { std::memcpy(b.get() + x, a.get() + x, size_t(y - x)); });
    best = std::min(best, now_seconds() - t0);
  }
  return 2.0 * double(bytes) / best;  // read + write traffic
}

NvmeBandwidth measure_nvme(const std::filesystem::path& dir, int64_t bytes, const ProgressFn& progress) {
  NvmeBandwidth r;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  LT_CHECK(std::filesystem::is_directory(dir), "NVMe directory {} does not exist and cannot be created", dir.string());
  r.free_bytes = int64_t(std::filesystem::space(dir).available);
  const int64_t chunk = 4 * MiB;
  bytes = std::max(chunk, bytes / chunk * chunk);
  LT_CHECK(r.free_bytes > 2 * bytes, "NVMe directory {} has only {} free; the measurement needs {}", dir.string(),
           format_bytes(double(r.free_bytes)), format_bytes(double(2 * bytes)));
  auto path = dir / fmt::format("lazytrain-profile-{}.tmp", ::getpid());
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_RDWR | O_DIRECT, 0600);
  if (fd < 0) {
    r.direct = false;
    fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_RDWR, 0600);
  }
  LT_CHECK(fd >= 0, "cannot create {}: {}", path.string(), std::strerror(errno));
  Buf buf = aligned(chunk);
  std::memset(buf.get(), 7, size_t(chunk));
  auto cleanup = [&] {
    ::close(fd);
    std::filesystem::remove(path, ec);
  };
  try {
    if (progress) progress(fmt::format("NVMe: write {} to {}{}", format_bytes(double(bytes)), dir.string(), r.direct ? " (O_DIRECT)" : " (buffered: O_DIRECT refused)"));
    double t0 = now_seconds();
    for (int64_t off = 0; off < bytes; off += chunk)
      LT_CHECK(::pwrite(fd, buf.get(), size_t(chunk), off) == chunk, "write to {} failed: {}", path.string(), std::strerror(errno));
    ::fsync(fd);
    r.write_bw = double(bytes) / (now_seconds() - t0);
    if (!r.direct) ::posix_fadvise(fd, 0, bytes, POSIX_FADV_DONTNEED);
    if (progress) progress(fmt::format("NVMe: read {} back", format_bytes(double(bytes))));
    t0 = now_seconds();
    for (int64_t off = 0; off < bytes; off += chunk)
      LT_CHECK(::pread(fd, buf.get(), size_t(chunk), off) == chunk, "read from {} failed: {}", path.string(), std::strerror(errno));
    r.read_bw = double(bytes) / (now_seconds() - t0);
    if (progress) progress("NVMe: latency, the median of 64 single 4 KiB reads at random offsets (queue depth 1)");
    r.latency_s = measure_read_latency(fd, path, bytes, r.direct);
  } catch (...) {
    cleanup();
    throw;
  }
  cleanup();
  return r;
}

}  // namespace lt
