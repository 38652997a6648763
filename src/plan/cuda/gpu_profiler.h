// The planner's GPU measurements (lt_plan_cuda, built with the CUDA backend): PCIe bandwidths, GEMM and
// attention rates and per-layer times on this machine's GPU, registered as plan/profile.h's GPU profiler.
#pragma once

namespace lt::cuda {
// Registers the GPU profiler with the planner (register_gpu_profiler); idempotent.
void install_gpu_profiler();
}  // namespace lt::cuda
