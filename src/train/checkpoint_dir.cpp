#include "train/checkpoint_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace lt::train {

std::function<void(const std::string&)> CheckpointWriter::fault_hook;

static const std::string kPrefix = "checkpoint-";
static const std::string kTmpPrefix = ".tmp-checkpoint-";

fs::path checkpoint_path(const fs::path& output_dir, int64_t step) {
  return output_dir / (kPrefix + std::to_string(step));
}

int64_t checkpoint_step(const fs::path& dir) {
  std::string name = dir.filename().string();
  if (name.compare(0, kPrefix.size(), kPrefix) != 0 || name.size() == kPrefix.size()) return -1;
  int64_t v = 0;
  for (size_t i = kPrefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

bool is_complete_checkpoint(const fs::path& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::is_regular_file(dir / kCompleteMarker, ec);
}

std::vector<CheckpointInfo> list_checkpoints(const fs::path& output_dir) {
  std::vector<CheckpointInfo> out;
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(output_dir, ec)) {
    int64_t s = checkpoint_step(e.path());
    if (s >= 0 && is_complete_checkpoint(e.path())) out.push_back({s, e.path()});
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.step < b.step; });
  return out;
}

std::optional<CheckpointInfo> latest_checkpoint(const fs::path& output_dir) {
  auto all = list_checkpoints(output_dir);
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::optional<fs::path> resolve_resume(const std::string& spec, const fs::path& output_dir) {
  if (spec.empty() || spec == "false" || spec == "none") return std::nullopt;
  if (spec == "auto" || spec == "true") {
    auto last = latest_checkpoint(output_dir);
    if (!last) return std::nullopt;
    return last->path;
  }
  fs::path p(spec);
  LT_CHECK(fs::is_directory(p), "resume_from_checkpoint: '{}' is not a directory", spec);
  LT_CHECK(is_complete_checkpoint(p),
           "resume_from_checkpoint: '{}' is incomplete (no {} marker: the save was interrupted); "
           "use an earlier checkpoint or resume_from_checkpoint=auto",
           spec, kCompleteMarker);
  return p;
}

void fsync_path(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | (fs::is_directory(p) ? O_DIRECTORY : 0));
  LT_CHECK(fd >= 0, "cannot open '{}' to fsync: {}", p.string(), std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  LT_CHECK(rc == 0, "fsync '{}' failed: {}", p.string(), std::strerror(err));
}

void write_file_durable(const fs::path& p, const std::string& bytes) {
  {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    LT_CHECK(out.good(), "cannot open '{}' for writing", p.string());
    out.write(bytes.data(), std::streamsize(bytes.size()));
    out.flush();
    LT_CHECK(out.good(), "write to '{}' failed (disk full?)", p.string());
  }
  fsync_path(p);
}

std::string read_file_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  LT_CHECK(in.good(), "cannot open '{}'", p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

CheckpointWriter::CheckpointWriter(const fs::path& output_dir, int64_t step) : output_dir_(output_dir) {
  fs::create_directories(output_dir_);
  final_ = checkpoint_path(output_dir_, step);
  tmp_ = output_dir_ / (kTmpPrefix + std::to_string(step) + "-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(tmp_, ec);
  fs::create_directories(tmp_);
}

CheckpointWriter::~CheckpointWriter() {
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }
}

fs::path CheckpointWriter::commit() {
  auto stage = [](const char* s) {
    if (fault_hook) fault_hook(s);
  };
  stage("fsync");
  for (const auto& e : fs::recursive_directory_iterator(tmp_))
    if (e.is_regular_file()) fsync_path(e.path());
  for (const auto& e : fs::recursive_directory_iterator(tmp_))
    if (e.is_directory()) fsync_path(e.path());
  fsync_path(tmp_);
  stage("rename");
  // An existing directory of the same step (a re-save after resume, or an incomplete leftover) is
  // moved aside first: rename(2) cannot replace a non-empty directory.
  std::error_code ec;
  fs::path old;
  if (fs::exists(final_, ec)) {
    old = output_dir_ / (".old-" + final_.filename().string() + "-" + std::to_string(::getpid()));
    fs::remove_all(old, ec);
    fs::rename(final_, old);
  }
  fs::rename(tmp_, final_);
  fsync_path(output_dir_);
  committed_ = true;
  stage("marker");
  write_file_durable(final_ / kCompleteMarker, "complete\n");
  fsync_path(final_);
  if (!old.empty()) fs::remove_all(old, ec);
  return final_;
}

std::vector<fs::path> rotate_checkpoints(const fs::path& output_dir, int64_t limit) {
  std::vector<fs::path> removed;
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return removed;
  for (const auto& e : fs::directory_iterator(output_dir, ec)) {
    std::string name = e.path().filename().string();
    bool stale_tmp = (name.rfind(kTmpPrefix, 0) == 0 || name.rfind(".old-", 0) == 0);
    bool incomplete = checkpoint_step(e.path()) >= 0 && !is_complete_checkpoint(e.path());
    if (stale_tmp || incomplete) {
      fs::remove_all(e.path(), ec);
      removed.push_back(e.path());
    }
  }
  if (limit > 0) {
    auto all = list_checkpoints(output_dir);
    for (size_t i = 0; i + size_t(limit) < all.size(); ++i) {
      fs::remove_all(all[i].path, ec);
      removed.push_back(all[i].path);
    }
  }
  return removed;
}

}  // namespace lt::train
