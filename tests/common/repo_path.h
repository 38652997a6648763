// Where the tests find the repository's data (fixtures, configs, profiles) — never only through the
// build machine's absolute path, so that test binaries built here run on another machine (the GPU
// machine runs a packed build in its own checkout). Order: $LT_REPO_ROOT; the source directory the
// build was configured from (LT_SOURCE_DIR), if it exists here; the working directory; the directories
// above the test binary. The first that holds tests/fixtures wins.
#pragma once
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace lt::testing {

inline std::filesystem::path repo_root() {
  namespace fs = std::filesystem;
  static const fs::path root = [] {
    auto ok = [](const fs::path& p) { return !p.empty() && fs::is_directory(p / "tests" / "fixtures"); };
    if (const char* e = std::getenv("LT_REPO_ROOT"); e && *e) {
      if (ok(e)) return fs::path(e);
      throw std::runtime_error(std::string("LT_REPO_ROOT=") + e + " has no tests/fixtures");
    }
#ifdef LT_SOURCE_DIR
    if (ok(LT_SOURCE_DIR)) return fs::path(LT_SOURCE_DIR);
#endif
    if (ok(fs::current_path())) return fs::current_path();
    std::error_code ec;
    for (fs::path p = fs::read_symlink("/proc/self/exe", ec).parent_path(); !ec && p.has_relative_path();
         p = p.parent_path())
      if (ok(p)) return p;
    throw std::runtime_error(
        "cannot find the repository (tests/fixtures): run from the repository root or set LT_REPO_ROOT");
  }();
  return root;
}

}  // namespace lt::testing
