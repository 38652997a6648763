// Runtime environment of the CPU path (OpenBLAS kernels, OpenMP waiting), fixed by re-executing.
//
// 1. Debian's OpenBLAS is built with DYNAMIC_ARCH and picks its kernels from the CPU's model number
//    when the library loads. On virtual CPUs that report an unknown model (the 2-core dev machine:
//    "Intel(R) Xeon(R) Processor") it falls back to the SSE3 "Prescott" kernels, 4x slower than the
//    AVX-512 "SkylakeX" ones there. OPENBLAS_CORETYPE overrides the choice, but only at load time.
// 2. libgomp threads spin after each parallel region; OpenBLAS's pthreads spin after each GEMM. The
//    ops alternate the two, so on few cores the spinners steal the cores the other pool needs:
//    OMP_WAIT_POLICY=PASSIVE made the layer part of bench_cpu_step 2-3x faster on 2 cores.
//    libgomp reads it only at load time too.
#pragma once
#include <string>

namespace lt::cpu {

// The kernel family OpenBLAS is using ("SkylakeX", "Haswell", "Prescott", ...).
std::string blas_core_name();
// The family this CPU's instruction set supports best ("SkylakeX" with AVX-512, "Haswell" with AVX2
// and FMA, or "" when nothing better than the fallback is available).
std::string best_blas_core_for_cpu();
// Call first thing in main(). Sets, when the user has not set them, OPENBLAS_CORETYPE (only if
// OpenBLAS fell back to a generic core although the CPU supports a faster one) and
// OMP_WAIT_POLICY=PASSIVE, then re-executes the program once with the same arguments so that the
// libraries load with them. Returns normally when nothing needs changing, or if exec fails.
// LT_NO_REEXEC=1 disables it.
void ensure_cpu_runtime_env(int argc, char** argv);

}  // namespace lt::cpu
