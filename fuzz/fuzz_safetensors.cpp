// libFuzzer target: the safetensors header parser on arbitrary bytes (a whole "file" in memory).
// Valid input must parse; invalid input must raise lt::Error. Anything else (a crash, a sanitizer
// report, another exception type) is a bug. Accepted headers are then checked for consistency and
// every float tensor is converted, which touches every byte the header claims.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lt::StHeader h;
  try {
    h = lt::parse_safetensors(data, size, "fuzz");
  } catch (const lt::Error&) {
    return 0;
  }
  if (h.data_offset > size || h.data_offset + h.data_size != size) std::abort();
  std::vector<float> buf;
  for (auto& t : h.tensors) {
    if (t.end > h.data_size || t.begin > t.end) std::abort();
    if (uint64_t(t.numel()) * t.elem_size != t.nbytes()) std::abort();
    if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16") continue;
    if (t.numel() > (1 << 16)) continue;
    buf.resize(size_t(t.numel()));
    lt::convert_to_f32(t.dtype, data + h.data_offset + t.begin, t.numel(), buf.data(), t.name);
  }
  return 0;
}
