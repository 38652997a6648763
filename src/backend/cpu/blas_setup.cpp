#include "backend/cpu/blas_setup.h"

#include <unistd.h>

#include <cstdlib>
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

void reexec_with_better_blas_core(int argc, char** argv) {
  (void)argc;
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv("LT_NO_BLAS_REEXEC") || std::getenv("LT_BLAS_REEXECED")) return;
  const std::string cur = blas_core_name(), best = best_blas_core_for_cpu();
  // Only the generic fallbacks are overridden; a core OpenBLAS recognised itself is kept.
  static const char* kGeneric[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Sandybridge", "Katmai",
                                   "Coppermine", "Northwood", "Banias", "Atom"};
  bool generic = false;
  for (const char* g : kGeneric) generic |= cur == g;
  if (!generic || best.empty() || best == cur) return;
  log_debug("OpenBLAS chose the generic '{}' kernels; re-executing with OPENBLAS_CORETYPE={}", cur, best);
  setenv("OPENBLAS_CORETYPE", best.c_str(), 1);
  setenv("LT_BLAS_REEXECED", "1", 1);
  execv("/proc/self/exe", argv);
  // execv returned: it failed; carry on with the slow kernels.
  unsetenv("OPENBLAS_CORETYPE");
}

}  // namespace lt::cpu
