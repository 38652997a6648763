// Measured throughput of the CPU optimizer's own kernels (fp32 or 8-bit moments), for resource
// profiles: `lazytrain profile` and the profile `lazytrain train` measures at start.
#pragma once
#include <cstdint>

namespace lt::optim {

// AdamW over n parameters split across `threads` threads (the real kernels, the run-time ISA choice);
// median of 7 repetitions (threads started and memory touched outside the timing), in parameters
// per second.
double measure_adamw_rate(bool eight_bit, int threads, int64_t n);

}  // namespace lt::optim
