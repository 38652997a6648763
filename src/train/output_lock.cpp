#include "train/output_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace lt::train {

namespace {

std::string host_name() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

std::string local_time_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S %Z", &tm);
  return buf;
}

// This process's command line, its arguments separated by spaces.
std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), {});
  while (!all.empty() && all.back() == '\0') all.pop_back();
  for (char& c : all)
    if (c == '\0') c = ' ';
  return all;
}

std::string holder_record() {
  return nlohmann::json{{"pid", int64_t(::getpid())},
                        {"host", host_name()},
                        {"started", local_time_now()},
                        {"command", command_line()}}
             .dump() +
         "\n";
}

// Whether fd is the file that path names now (a lock taken on a file its holder has just removed
// from the directory protects nothing).
bool names_same_file(int fd, const fs::path& path) {
  struct stat a {}, b {};
  if (::fstat(fd, &a) != 0 || ::stat(path.c_str(), &b) != 0) return false;
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

void write_holder(int fd, const fs::path& path) {
  const std::string rec = holder_record();
  LT_CHECK(::ftruncate(fd, 0) == 0 && ::pwrite(fd, rec.data(), rec.size(), 0) == ssize_t(rec.size()),
           "cannot write the lock file '{}': {}", path.string(), std::strerror(errno));
}

[[noreturn]] void fail_in_use(const fs::path& output_dir, const fs::path& path) {
  fail("output_dir '{}' is in use by another training run ({}); two runs writing one output_dir lose each "
       "other's checkpoints. Wait for that run to end or stop it, or choose another output_dir (lock file: {})",
       output_dir.string(), describe_lock_holder(path), path.string());
}

}  // namespace

std::string describe_lock_holder(const fs::path& lock_file) {
  std::ifstream in(lock_file, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("pid")) return "its pid is not written yet";
  std::string s = "pid " + j["pid"].dump();
  if (j.contains("host") && j["host"].is_string()) s += " on host " + j["host"].get<std::string>();
  if (j.contains("started") && j["started"].is_string()) s += ", started " + j["started"].get<std::string>();
  if (j.contains("command") && j["command"].is_string()) s += ", command: " + j["command"].get<std::string>();
  return s;
}

OutputLock OutputLock::acquire(const fs::path& output_dir) {
  std::error_code ec;
  fs::create_directories(output_dir, ec);
  LT_CHECK(!ec, "cannot create output_dir '{}': {}", output_dir.string(), ec.message());
  OutputLock lock;
  lock.path_ = output_dir / kOutputLockName;
  // A holder that ends removes the file; whoever locked that file meanwhile tries again on the new one.
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::open(lock.path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    LT_CHECK(fd >= 0, "cannot open the lock file '{}' of output_dir: {}", lock.path_.string(), std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EWOULDBLOCK) fail_in_use(output_dir, lock.path_);
      fail("cannot lock '{}' (output_dir's lock against a second run): {}", lock.path_.string(), std::strerror(err));
    }
    if (!names_same_file(fd, lock.path_)) {
      ::close(fd);
      continue;
    }
    lock.fd_ = fd;
    write_holder(fd, lock.path_);
    return lock;
  }
  fail("cannot lock '{}': the file keeps being replaced by other runs", lock.path_.string());
}

OutputLock::~OutputLock() { release(); }

OutputLock::OutputLock(OutputLock&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }

OutputLock& OutputLock::operator=(OutputLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

void OutputLock::release() {
  if (fd_ < 0) return;
  if (names_same_file(fd_, path_)) ::unlink(path_.c_str());
  ::close(fd_);
  fd_ = -1;
}

}  // namespace lt::train
