#!/usr/bin/env bash
# run 80: the whole GPU test suite, and the 3B bench config as it stands (fp32 moments: the device layers' fp32 path).
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
timeout 330 scripts/gpu-test tests > "$OUT/tests.txt" 2>&1; echo "tests rc=$?"
grep -E "^\[  (FAILED|PASSED|SKIPPED)|tests ran|FAILED  \]" "$OUT/tests.log" | tail -12
source <(sed -n '/^cudalib=/,/^export NCCL/p' scripts/gpu-test)
timeout 150 build-gpu/pack/bin/lazytrain train configs/bench-qwen2.5-3b.yaml max_steps=4 > "$OUT/train3b-fp32m.log" 2>&1; echo "rc=$?"
grep -E "profile: (attention layer|host)|optimizer:|predicted|^step|time:|rror" "$OUT/train3b-fp32m.log" | cut -c1-330
