#include "exec/device_q8.h"

#include <cstring>

#include "optim/quant8.h"

namespace lt {

namespace {

Q8Map convert(const optim::QuantMap& q) {
  Q8Map r;
  r.is_signed = q.is_signed ? 1 : 0;
  r.mag_bits = q.mag_bits;
  static_assert(sizeof(r.decode) == sizeof(q.decode) && sizeof(r.top) == sizeof(q.top) &&
                sizeof(r.inv_step) == sizeof(q.inv_step) && sizeof(r.code_off) == sizeof(q.code_off));
  std::memcpy(r.decode, q.decode, sizeof(r.decode));
  std::memcpy(r.top, q.top, sizeof(r.top));
  std::memcpy(r.inv_step, q.inv_step, sizeof(r.inv_step));
  std::memcpy(r.code_off, q.code_off, sizeof(r.code_off));
  return r;
}

}  // namespace

const Q8Maps& device_q8_maps() {
  static const Q8Maps maps{convert(optim::signed_dynamic_map()), convert(optim::unsigned_dynamic_map())};
  return maps;
}

}  // namespace lt
