#pragma once
#include <chrono>

namespace lt {
// Monotonic wall clock in seconds.
inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace lt
