#include "train/checkpoint_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"

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

namespace {

constexpr const char* kManifestFormat = "lazytrain-checkpoint-manifest";

// The marker's manifest of dir: every regular file below it but the marker, by relative path, with its size.
std::string manifest_of(const fs::path& dir) {
  nlohmann::json files = nlohmann::json::object();
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const std::string rel = fs::relative(e.path(), dir).generic_string();
    if (rel != kCompleteMarker) files[rel] = uint64_t(e.file_size());
  }
  return nlohmann::json{{"format", kManifestFormat}, {"version", 1}, {"files", files}}.dump(1) + "\n";
}

// A manifest entry names a file inside the checkpoint.
bool inside(const std::string& rel) {
  const fs::path p(rel);
  if (rel.empty() || p.is_absolute()) return false;
  for (const auto& part : p)
    if (part == "..") return false;
  return true;
}

// What is wrong with file rel of a checkpoint: missing, or not of the manifest's size (size), or
// empty (no size known); "" when nothing.
std::string file_problem(const fs::path& dir, const std::string& rel, std::optional<uint64_t> size) {
  std::error_code ec;
  const fs::path p = dir / rel;
  if (!fs::is_regular_file(p, ec)) return rel + " is missing";
  const uint64_t actual = fs::file_size(p, ec);
  if (ec) return fmt::format("{} cannot be read: {}", rel, ec.message());
  if (size && actual != *size) return fmt::format("{} has {} bytes, the manifest says {} bytes", rel, actual, *size);
  if (!size && actual == 0) return rel + " is empty";
  return "";
}

std::string manifest_problem(const fs::path& dir, const std::string& marker_text) {
  const auto j = nlohmann::json::parse(marker_text, nullptr, false);
  if (!j.is_object() || j.value("format", "") != kManifestFormat || !j.contains("files") || !j["files"].is_object())
    return fmt::format("its {} marker is not a whole manifest (cut short?)", kCompleteMarker);
  for (const auto& [rel, size] : j["files"].items()) {
    if (!size.is_number_unsigned() || !inside(rel))
      return fmt::format("its {} marker has a malformed entry '{}'", kCompleteMarker, rel);
    std::string p = file_problem(dir, rel, size.get<uint64_t>());
    if (!p.empty()) return p;
  }
  return "";
}

}  // namespace

std::string checkpoint_problem(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "not a directory";
  const fs::path marker = dir / kCompleteMarker;
  if (!fs::is_regular_file(marker, ec)) return fmt::format("no {} marker: the save was interrupted", kCompleteMarker);
  std::string text;
  try {
    text = read_file_text(marker);
  } catch (const Error& e) {
    return e.what();
  }
  if (text.rfind("complete", 0) != 0) return manifest_problem(dir, text);
  for (const char* rel : kResumeFiles) {  // the older marker lists nothing: the files a resume reads
    std::string p = file_problem(dir, rel, std::nullopt);
    if (!p.empty()) return p;
  }
  return "";
}

bool is_complete_checkpoint(const fs::path& dir) { return checkpoint_problem(dir).empty(); }

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

namespace {

// The newest complete checkpoint of output_dir; the newer directories passed over are reported.
std::optional<fs::path> newest_complete(const fs::path& output_dir, bool report_skipped) {
  std::vector<CheckpointInfo> dirs;
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return std::nullopt;
  for (const auto& e : fs::directory_iterator(output_dir, ec)) {
    const int64_t s = checkpoint_step(e.path());
    if (s >= 0) dirs.push_back({s, e.path()});
  }
  std::sort(dirs.begin(), dirs.end(), [](auto& a, auto& b) { return a.step > b.step; });
  for (const auto& d : dirs) {
    const std::string why = checkpoint_problem(d.path);
    if (why.empty()) return d.path;
    if (report_skipped)
      log_warn("resume_from_checkpoint=auto: skipping {}, which is incomplete: {}", d.path.string(), why);
  }
  return std::nullopt;
}

}  // namespace

std::optional<fs::path> resolve_resume(const std::string& spec, const fs::path& output_dir, bool report_skipped) {
  if (spec.empty() || spec == "false" || spec == "none") return std::nullopt;
  if (spec == "auto" || spec == "true") return newest_complete(output_dir, report_skipped);
  fs::path p(spec);
  LT_CHECK(fs::is_directory(p), "resume_from_checkpoint: '{}' is not a directory", spec);
  const std::string why = checkpoint_problem(p);
  LT_CHECK(why.empty(),
           "resume_from_checkpoint: '{}' is incomplete ({}); use an earlier checkpoint or resume_from_checkpoint=auto",
           spec, why);
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
    errno = 0;
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    LT_CHECK(out.good(), "cannot open '{}' for writing: {}", p.string(), std::strerror(errno));
    out.write(bytes.data(), std::streamsize(bytes.size()));
    out.flush();
    const int err = errno;  // set by the failing write(2) inside the stream
    LT_CHECK(out.good(), "write to '{}' failed: {}", p.string(), err ? std::strerror(err) : "unknown error");
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
  write_file_durable(final_ / kCompleteMarker, manifest_of(final_));
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
