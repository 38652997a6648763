#include "dist/rendezvous.h"

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "core/timer.h"

namespace lt::dist {
namespace fs = std::filesystem;

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
