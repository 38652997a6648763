// Measured throughput of the CPU optimizer's own kernels (fp32 or 8-bit moments), for resource
// profiles: `lazytrain profile` and the profile `lazytrain train` measures at start.
#pragma once
#include <cstdint>

namespace lt::optim {

// AdamW over n parameters split across `threads` threads (the real kernels, the run-time ISA choice);
// median of 7 repetitions (threads started and memory touched outside the timing), in parameters
// per second.
double measure_adamw_rate(bool eight_bit, int threads, int64_t n);

// The optimizer as training runs it (measured: the kernel-only figure above read 6.3-6.8 Gparams/s for 8-bit moments
// on the H200 host while training's updates ran at 7.9-8.5): a CpuAdamW with `threads` workers over n parameters in
// units of a decoder layer's order of size (one tensor each), split fp32 masters and pinned-style buffers, every
// unit submitted, then the norm reported; the time from the norm to the last update's end, median of 5 steps after
// a warm-up one, in parameters per second.
double measure_optimizer_rate(bool eight_bit, int threads, int64_t n);

}  // namespace lt::optim
