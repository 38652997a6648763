// OpenBLAS kernel selection.
// Debian's OpenBLAS is built with DYNAMIC_ARCH and picks its kernels from the CPU's model number when
// the library loads. On virtual CPUs that report an unknown model (as the 2-core dev machine does:
// "Intel(R) Xeon(R) Processor") it falls back to the SSE3 "Prescott" kernels, 4x slower than the
// AVX-512 "SkylakeX" ones on the same machine. The choice cannot change after load; the environment
// variable OPENBLAS_CORETYPE overrides it, so the fix is to set it and re-execute.
#pragma once
#include <string>

namespace lt::cpu {

// The kernel family OpenBLAS is using ("SkylakeX", "Haswell", "Prescott", ...).
std::string blas_core_name();
// The family this CPU's instruction set supports best ("SkylakeX" with AVX-512, "Haswell" with AVX2
// and FMA, or "" when nothing better than the fallback is available).
std::string best_blas_core_for_cpu();
// Call first thing in main(): if OpenBLAS fell back to a generic core although the CPU supports a
// faster one, and OPENBLAS_CORETYPE is not set by the user, sets it and re-executes the program with
// the same arguments (once). Returns normally otherwise. Set LT_NO_BLAS_REEXEC=1 to disable.
void reexec_with_better_blas_core(int argc, char** argv);

}  // namespace lt::cpu
