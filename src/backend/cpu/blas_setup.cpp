#include "backend/cpu/blas_setup.h"

#include <unistd.h>

#include <cstdlib>
#include <cerrno>
#include <cstring>

#include "core/log.h"

extern "C" char* openblas_get_corename();

namespace lt::cpu {

std::string blas_core_name() {
  const char* n = openblas_get_corename();
  return n ? std::string(n) : std::string();
}

std::string best_blas_core_for_cpu() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return "";
}

void ensure_cpu_runtime_env(int argc, char** argv) {
  (void)argc;
  if (std::getenv("LT_NO_REEXEC") || std::getenv("LT_REEXECED")) return;
  bool changed = false;
  if (!std::getenv("OPENBLAS_CORETYPE")) {
    const std::string cur = blas_core_name(), best = best_blas_core_for_cpu();
    // Only the generic fallbacks are overridden; a core OpenBLAS recognised itself is kept.
    static const char* kGeneric[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Katmai",
                                     "Coppermine", "Northwood", "Banias", "Atom"};
    bool generic = false;
    for (const char* g : kGeneric) generic |= cur == g;
    if (generic && !best.empty() && best != cur) {
      log_debug("OpenBLAS chose the generic '{}' kernels; using OPENBLAS_CORETYPE={}", cur, best);
      setenv("OPENBLAS_CORETYPE", best.c_str(), 1);
      changed = true;
    }
  }
  if (!std::getenv("OMP_WAIT_POLICY")) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    changed = true;
  }
  if (!changed) return;
  setenv("LT_REEXECED", "1", 1);
  execv("/proc/self/exe", argv);
  log_debug("re-exec with the CPU runtime environment failed: {}", std::strerror(errno));
}

}  // namespace lt::cpu
