// Host memory facts from /proc.
#pragma once
#include <cstdint>

namespace lt {

// MemAvailable from /proc/meminfo in bytes; 0 when it cannot be read.
int64_t mem_available_bytes();

}  // namespace lt
