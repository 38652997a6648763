// Short measurements for `lazytrain profile`: host memory bandwidth, NVMe O_DIRECT read/write, CPU
// AdamW throughput (fp32 and 8-bit blockwise moments), and the GPU hook registry.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
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
  } catch (...) {
    cleanup();
    throw;
  }
  cleanup();
  return r;
}

namespace {

inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

// Proxy of the CPU AdamW step with the same memory traffic as the real one: fp32 moments, or 8-bit
// moments with one absmax per 256-element block (dequantise, update, requantise).
void adamw_fp32(float* p, const float* g, float* m, float* v, uint16_t* out, int64_t a, int64_t b) {
  const float b1 = 0.9f, b2 = 0.999f, lr = 1e-5f, eps = 1e-8f, wd = 0.01f;
  for (int64_t i = a; i < b; ++i) {
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    p[i] -= lr * (m[i] / (std::sqrt(v[i]) + eps) + wd * p[i]);
    out[i] = to_bf16(p[i]);
  }
}

void adamw_8bit(float* p, const float* g, int8_t* m, uint8_t* v, float* sm, float* sv, uint16_t* out, int64_t a, int64_t b) {
  const float b1 = 0.9f, b2 = 0.999f, lr = 1e-5f, eps = 1e-8f, wd = 0.01f;
  constexpr int64_t B = 256;
  float mt[B], vt[B];
  for (int64_t blk = a / B; blk < (b + B - 1) / B; ++blk) {
    int64_t lo = std::max(a, blk * B), hi = std::min(b, (blk + 1) * B);
    float am = 0, av = 0;
    for (int64_t i = lo; i < hi; ++i) {
      float mm = b1 * (float(m[i]) * sm[blk] / 127.f) + (1 - b1) * g[i];
      float vv = b2 * (float(v[i]) * float(v[i]) * sv[blk] / 65025.f) + (1 - b2) * g[i] * g[i];
      mt[i - lo] = mm;
      vt[i - lo] = vv;
      am = std::max(am, std::fabs(mm));
      av = std::max(av, vv);
      p[i] -= lr * (mm / (std::sqrt(vv) + eps) + wd * p[i]);
      out[i] = to_bf16(p[i]);
    }
    sm[blk] = am > 0 ? am : 1;
    sv[blk] = av > 0 ? av : 1;
    for (int64_t i = lo; i < hi; ++i) {
      m[i] = int8_t(std::lrint(mt[i - lo] / sm[blk] * 127.f));
      v[i] = uint8_t(std::lrint(std::sqrt(vt[i - lo] / sv[blk]) * 255.f));
    }
  }
}

}  // namespace

double measure_optimizer(bool eight_bit, int threads, int64_t n, const ProgressFn& progress) {
  n = std::max<int64_t>(n / 256 * 256, 256 * threads);
  if (progress)
    progress(fmt::format("CPU optimizer: AdamW {} over {:.0f}M params with {} threads", eight_bit ? "8-bit" : "fp32",
                         double(n) / 1e6, threads));
  std::vector<float> p(size_t(n), 0.01f), g(size_t(n), 1e-3f);
  std::vector<uint16_t> out(static_cast<size_t>(n));
  double best = 1e30;
  if (!eight_bit) {
    std::vector<float> m(size_t(n), 0.f), v(size_t(n), 0.f);
    for (int r = 0; r < 3; ++r) {
      double t0 = now_seconds();
      parallel(threads, n / 256, [&](int64_t a, int64_t b) {
        adamw_fp32(p.data(), g.data(), m.data(), v.data(), out.data(), a * 256, b * 256);
      });
      best = std::min(best, now_seconds() - t0);
    }
  } else {
    std::vector<int8_t> m(size_t(n), 0);
    std::vector<uint8_t> v(size_t(n), 0);
    std::vector<float> sm(size_t(n / 256), 1.f), sv(size_t(n / 256), 1.f);
    for (int r = 0; r < 3; ++r) {
      double t0 = now_seconds();
      parallel(threads, n / 256, [&](int64_t a, int64_t b) {
        adamw_8bit(p.data(), g.data(), m.data(), v.data(), sm.data(), sv.data(), out.data(), a * 256, b * 256);
      });
      best = std::min(best, now_seconds() - t0);
    }
  }
  return double(n) / best;
}

}  // namespace lt
