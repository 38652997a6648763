#include "dist/rendezvous.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <chrono>
#include <fstream>
#include <iterator>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "core/timer.h"

namespace lt::dist {
namespace fs = std::filesystem;

namespace {

constexpr const char* kDirPrefix = "lt-rdzv-";

// Whether fd is the directory that path names now (a sweeper may have removed the path meanwhile).
bool names_same_dir(int fd, const fs::path& path) {
  struct stat a {}, b {};
  if (::fstat(fd, &a) != 0 || ::lstat(path.c_str(), &b) != 0) return false;
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

int open_dir(const fs::path& path) { return ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC); }

}  // namespace

RendezvousDir RendezvousDir::create(const fs::path& parent) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string tmpl = (parent / (std::string(kDirPrefix) + "XXXXXX")).string();
    LT_CHECK(::mkdtemp(tmpl.data()) != nullptr, "launch: cannot create a rendezvous directory {}: {}", tmpl,
             std::strerror(errno));
    const int fd = open_dir(tmpl);
    // Blocking: a sweeping launch holds another directory's lock only while it removes it.
    if (fd >= 0 && ::flock(fd, LOCK_EX) == 0 && names_same_dir(fd, tmpl)) {
      RendezvousDir d;
      d.path_ = tmpl;
      d.fd_ = fd;
      return d;
    }
    if (fd >= 0) ::close(fd);  // removed by a sweeping launch before we locked it: make another
  }
  fail("launch: cannot create and lock a rendezvous directory under {}", parent.string());
}

RendezvousDir::RendezvousDir(RendezvousDir&& o) noexcept : path_(std::move(o.path_)), fd_(o.fd_) { o.fd_ = -1; }

RendezvousDir::~RendezvousDir() {
  if (fd_ < 0) return;
  std::error_code ec;
  fs::remove_all(path_, ec);
  ::close(fd_);
}

std::vector<fs::path> remove_stale_rendezvous_dirs(const fs::path& parent) {
  std::vector<fs::path> removed;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const fs::path p = e.path();
    struct stat st {};
    if (p.filename().string().rfind(kDirPrefix, 0) != 0 || ::lstat(p.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != ::geteuid())
      continue;
    const int fd = open_dir(p);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && names_same_dir(fd, p)) {
      std::error_code rm;
      fs::remove_all(p, rm);
      if (!rm) removed.push_back(p);
    }
    ::close(fd);
  }
  return removed;
}

void rdzv_publish(const fs::path& dir, const std::string& key, const std::string& bytes) {
  LT_CHECK(!key.empty() && key.find('/') == std::string::npos, "rendezvous: bad key '{}'", key);
  const fs::path tmp = dir / fmt::format(".{}.{}.tmp", key, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    LT_CHECK(out.good(), "rendezvous {}: cannot write {}", dir.string(), tmp.string());
    out.write(bytes.data(), std::streamsize(bytes.size()));
    out.close();
    LT_CHECK(!out.fail(), "rendezvous {}: write of {} failed", dir.string(), tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, dir / key, ec);
  LT_CHECK(!ec, "rendezvous {}: cannot publish '{}': {}", dir.string(), key, ec.message());
}

std::string rdzv_wait(const fs::path& dir, const std::string& key, double timeout_s) {
  const double t0 = now_seconds();
  for (int i = 0;; ++i) {
    std::ifstream in(dir / key, std::ios::binary);
    if (in.good()) return {std::istreambuf_iterator<char>(in), {}};
    LT_CHECK(now_seconds() - t0 < timeout_s,
             "rendezvous {}: '{}' did not appear within {:.0f} s (did rank 0 start and reach the rendezvous?)",
             dir.string(), key, timeout_s);
    std::this_thread::sleep_for(std::chrono::milliseconds(i < 100 ? 2 : 50));
  }
}

}  // namespace lt::dist
