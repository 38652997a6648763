// The NVMe tier's file I/O through io_uring (nvme/nvme_store.h) at several queue shapes, and the shape the rule in
// nvme/io_queue.h picks for this disk against the old fixed 8 x 1 MiB.
//
//   bench_nvme_io [--dir DIR] [--mib N] [--rounds N] [--depths 1,2,4,8] [--pieces-kib 256,1024,4096]
//                 [--latency-us X] [--read-gbps X --write-gbps X]
//
// Each shape writes --mib MiB to one file under DIR with O_DIRECT (NvmeStore::write) and reads it back
// (NvmeStore::read): GB/s of each (best of --rounds interleaved rounds), and the submitting thread's CPU time per
// request. The disk's latency is the mean of 256 depth-1 4 KiB O_DIRECT reads at random offsets of that file
// (unless --latency-us); the bandwidth for the rule is the best read and write measured over the sweep (unless
// --read-gbps / --write-gbps). Then the old shape and the rule's are measured again, interleaved, as before/after.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <fmt/format.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/timer.h"
#include "nvme/io_queue.h"
#include "nvme/nvme_store.h"

using namespace lt;

namespace {

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) v.push_back(std::stoll(x));
  return v;
}

struct Figures {
  double write_gbps = 0, read_gbps = 0, cpu_us_per_request = 0;
};

// One write and one read of `bytes` through a fresh store with the given shape.
Figures measure(const std::string& dir, const IoQueueShape& q, void* buf, int64_t bytes) {
  auto io = uring_io(q.depth, q.piece);
  LT_CHECK(io, "io_uring unavailable here (io_uring_queue_init failed)");
  NvmeStore store(dir, io, "bench");
  Figures f;
  const double c0 = thread_cpu_s(), t0 = now_seconds();
  store.write(1, 0, buf, bytes);
  const double t1 = now_seconds();
  store.read(1, 0, buf, bytes);
  const double t2 = now_seconds(), c1 = thread_cpu_s();
  f.write_gbps = double(bytes) / (t1 - t0) * 1e-9;
  f.read_gbps = double(bytes) / (t2 - t1) * 1e-9;
  const double requests = 2.0 * double((bytes + q.piece - 1) / q.piece);
  f.cpu_us_per_request = (c1 - c0) / requests * 1e6;
  if (!store.direct()) fmt::print("  (buffered: {} refused O_DIRECT)\n", dir);
  return f;
}

void keep_best(Figures& best, const Figures& f) {
  best.write_gbps = std::max(best.write_gbps, f.write_gbps);
  best.read_gbps = std::max(best.read_gbps, f.read_gbps);
  best.cpu_us_per_request = best.cpu_us_per_request > 0 ? std::min(best.cpu_us_per_request, f.cpu_us_per_request)
                                                         : f.cpu_us_per_request;
}

// Mean latency of depth-1 4 KiB O_DIRECT reads at random 4 KiB offsets of a file of `bytes` written first.
double read_latency_s(const std::string& dir, void* buf, int64_t bytes) {
  NvmeStore store(dir, posix_io(), "lat");
  store.write(1, 0, buf, bytes);
  const int fd = ::open(store.file_name(1).c_str(), O_RDONLY | O_DIRECT);
  LT_CHECK(fd >= 0, "cannot open {} with O_DIRECT: {}", store.file_name(1), std::strerror(errno));
  std::mt19937_64 rng(1);
  const int n = 256;
  const double t0 = now_seconds();
  for (int i = 0; i < n; ++i) {
    const int64_t off = int64_t(rng() % uint64_t(bytes / kIoAlign)) * kIoAlign;
    LT_CHECK(::pread(fd, buf, kIoAlign, off) == kIoAlign, "read of 4 KiB at {} failed", off);
  }
  const double t = (now_seconds() - t0) / n;
  ::close(fd);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"NVMe tier I/O through io_uring at several queue shapes, and the rule's shape"};
  std::string dir = "/tmp", depths_s = "1,2,4,8,16", pieces_s = "256,1024,4096";
  int64_t mib = 256;
  int rounds = 3;
  double latency_us = 0, read_gbps = 0, write_gbps = 0;
  app.add_option("--dir", dir, "directory on the disk to measure");
  app.add_option("--mib", mib, "MiB per write and read")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "interleaved rounds (best is reported)")->check(CLI::PositiveNumber);
  app.add_option("--depths", depths_s, "requests in flight, comma-separated");
  app.add_option("--pieces-kib", pieces_s, "request sizes in KiB, comma-separated");
  app.add_option("--latency-us", latency_us, "the disk's latency for the rule (0: measure it)");
  app.add_option("--read-gbps", read_gbps, "the disk's read bandwidth for the rule (0: the best measured)");
  app.add_option("--write-gbps", write_gbps, "the disk's write bandwidth for the rule (0: the best measured)");
  CLI11_PARSE(app, argc, argv);
  try {
    const int64_t bytes = mib << 20;
    void* buf = std::aligned_alloc(size_t(kIoAlign), size_t(bytes));
    std::memset(buf, 7, size_t(bytes));
    std::vector<IoQueueShape> shapes;
    for (int64_t p : parse_list(pieces_s))
      for (int64_t d : parse_list(depths_s)) shapes.push_back({unsigned(d), p << 10});
    std::vector<Figures> best(shapes.size());
    for (int r = 0; r < rounds; ++r)
      for (size_t i = 0; i < shapes.size(); ++i) keep_best(best[i], measure(dir, shapes[i], buf, bytes));
    fmt::print("{} MiB under {}, best of {} rounds\n{:<16} {:>10} {:>10} {:>14}\n", mib, dir, rounds, "shape",
               "write GB/s", "read GB/s", "CPU us/request");
    Figures top;
    for (size_t i = 0; i < shapes.size(); ++i) {
      fmt::print("{:<16} {:>10.2f} {:>10.2f} {:>14.1f}\n", shapes[i].describe(), best[i].write_gbps,
                 best[i].read_gbps, best[i].cpu_us_per_request);
      top.write_gbps = std::max(top.write_gbps, best[i].write_gbps);
      top.read_gbps = std::max(top.read_gbps, best[i].read_gbps);
    }
    const double lat = latency_us > 0 ? latency_us * 1e-6 : read_latency_s(dir, buf, bytes);
    const double bw = 1e9 * std::max(read_gbps > 0 ? read_gbps : top.read_gbps, write_gbps > 0 ? write_gbps : top.write_gbps);
    const IoQueueShape before{8, 1 << 20}, after = io_queue_shape(bw, lat);
    fmt::print("latency {:.1f} us{}, bandwidth {:.2f} GB/s: the rule's shape {}\n", lat * 1e6,
               latency_us > 0 ? " (given)" : " (4 KiB at depth 1)", bw * 1e-9, after.describe());
    Figures b, a;
    for (int r = 0; r < rounds; ++r) {
      keep_best(b, measure(dir, before, buf, bytes));
      keep_best(a, measure(dir, after, buf, bytes));
    }
    fmt::print("before {:<12} write {:.2f} GB/s, read {:.2f} GB/s, {:.1f} us CPU/request\n", before.describe(),
               b.write_gbps, b.read_gbps, b.cpu_us_per_request);
    fmt::print("after  {:<12} write {:.2f} GB/s, read {:.2f} GB/s, {:.1f} us CPU/request\n", after.describe(),
               a.write_gbps, a.read_gbps, a.cpu_us_per_request);
    std::free(buf);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_nvme_io: {}\n", e.what());
    return 1;
  }
  return 0;
}
