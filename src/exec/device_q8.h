// The optimizer's 8-bit quantisation maps (optim/quant8.h) as the backend's 8-bit device update takes them
// (Backend::adamw_step_q8), so that lt_backend need not depend on lt_optim.
#pragma once
#include "backend/backend.h"

namespace lt {

// optim::signed_dynamic_map() (m) and optim::unsigned_dynamic_map() (v), converted once.
const Q8Maps& device_q8_maps();

}  // namespace lt
