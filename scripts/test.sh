#!/usr/bin/env bash
# The test command: sets up (deps + build), runs the CPU test suite with CTest,
# then a short libFuzzer run over the binary parsers.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# Spinning OpenMP waiters steal the few cores the OpenBLAS threads need (see src/backend/cpu/blas_setup.h).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
ctest --test-dir "${LT_BUILD_DIR:-build}" -L cpu --output-on-failure -j "$(nproc)" --timeout 900
# Fixed seed: the same inputs every run (the seed corpus holds the reproducers of what was found);
# exploratory runs: scripts/fuzz.sh 600 without LT_FUZZ_SEED.
if [[ -x scripts/fuzz.sh ]]; then LT_FUZZ_SEED=${LT_FUZZ_SEED:-1} ./scripts/fuzz.sh 20; fi
