// The NVMe tier's file store lives in src/nvme (lt_nvme), below both the executor (activation
// checkpoints) and the optimizer (moments, optim/nvme_moments.h); this header keeps the old include path.
#pragma once
#include "nvme/nvme_store.h"
