#include "core/host_memory.h"

#include <fstream>
#include <string>

namespace lt {

int64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kb = 0;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

}  // namespace lt
