#!/usr/bin/env bash
# The embedded default demo (README: ./scripts/setup.sh && ./scripts/demo.sh).
# Trains a small Qwen2-architecture model from random initialisation on lazytrain's built-in synthetic
# math data (configs/demo.yaml), with the MILP planner, on the CUDA backend when a GPU is visible and
# the build has it, else on the CPU backend; then scores exact match on held-out problems.
# Extra arguments are config overrides, e.g. ./scripts/demo.sh max_steps=100
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${LT_BUILD_DIR:-build}/bin/lazytrain
if [[ ! -x $BIN ]]; then
  echo "demo: $BIN not found; run ./scripts/setup.sh first" >&2
  exit 1
fi

# CPU threading. OpenMP threads that spin while waiting fight the executor's lane threads and the
# optimizer thread for the cores: on a 2-core machine that made steps 10-20x slower. Debian's OpenBLAS
# picks slow generic kernels on virtual CPUs that report an unknown model; name the right family.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if [[ -z ${OPENBLAS_CORETYPE:-} ]]; then
  if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell; fi
fi

OUT=${LT_DEMO_OUT:-output/demo}
start=$(date +%s)
# LT_DEMO_CONFIG picks another demo config (configs/demo-qwen35.yaml: the hybrid Qwen3.5 variant).
"$BIN" train "${LT_DEMO_CONFIG:-configs/demo.yaml}" "output_dir=$OUT" overwrite_output_dir=true "threads=$OMP_NUM_THREADS" "$@"
end=$(date +%s)
echo "demo: finished in $((end - start)) s. Model: $OUT/checkpoint-*/ (HF format); metrics: $OUT/metrics.jsonl;"
# The latest checkpoint this run saved (its step depends on max_steps and save_steps).
# (None when an override writes elsewhere or saves nothing: not an error.)
last=$( (ls -d "$OUT"/checkpoint-* 2>/dev/null || true) | sed 's/.*checkpoint-//' | sort -n | tail -1)
echo "      per-sample answers: $OUT/eval_results.jsonl. Try: $BIN generate --model $OUT/checkpoint-${last:-N} -p 'What is 157 + 68?'"
