// Test helpers over a finished lazytrain run: its exit code, a file's text, the loss of each step, and a
// checkpoint's fp32 master weights.
#pragma once
#include <sys/wait.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cli_process.h"
#include "io/safetensors.h"

namespace lt::testing {

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs lazytrain to the end; returns its exit code (128 + signal if killed). Output appended to log.
inline int run_lazytrain(const std::vector<std::string>& args, const std::filesystem::path& log) {
  const int st = finish_process(start_lazytrain(args, log));
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// step -> loss, from output_dir/metrics.jsonl.
inline std::map<int64_t, double> losses_by_step(const std::filesystem::path& out) {
  std::map<int64_t, double> m;
  for (const auto& j : train_records(out)) m[j["step"].get<int64_t>()] = j["loss"].get<double>();
  return m;
}

// The fp32 master weights of a checkpoint, by tensor name.
inline std::map<std::string, std::vector<float>> checkpoint_masters(const std::filesystem::path& ckpt) {
  std::map<std::string, std::vector<float>> m;
  for (const auto& e : std::filesystem::directory_iterator(ckpt / "trainer_state" / "master")) {
    if (e.path().extension() != ".safetensors") continue;
    SafetensorsFile f(e.path());
    for (const auto& t : f.header().tensors) {
      auto& v = m[t.name];
      v.resize(size_t(t.numel()));
      f.read_f32(t, v.data());
    }
  }
  return m;
}

}  // namespace lt::testing
