#!/usr/bin/env bash
# run 81: the 3B bench config as it stands (fp32 moments: the device layers' fp32 path), 4 steps.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
P=build-gpu/pack
source <(sed -n '/^cudalib=/,/^export NCCL/p' scripts/gpu-test)
timeout 150 $P/bin/lazytrain train configs/bench-qwen2.5-3b.yaml max_steps=4 > "$OUT/train3b-fp32m.log" 2>&1; echo "rc=$?"
grep -E "profile: (attention layer|host)|optimizer:|predicted|^step|time:|rror|update" "$OUT/train3b-fp32m.log" | cut -c1-330
