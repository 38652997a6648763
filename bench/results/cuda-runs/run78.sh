#!/usr/bin/env bash
# run 78 (issue 17): the first layers' updates on the GPU. GPU tests (8-bit AdamW kernel, device updates, plan
# invariance, kept internals, HF step), then the 3B shape (8-bit states) with device_update_layers auto and 0.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-gpu-out}; mkdir -p "$O"
P=build-gpu/pack
mkdir -p build-gpu && xz -dc build-gpu/carry/pack.tar.xz | tar -C build-gpu -xf -
LT_TEST_ARGS="--gtest_filter=*Q8*:*DeviceUpdate*:*PlanInvariance*:*Kept*:*HfStep*:*DeviceGrads*" \
  timeout 200 scripts/gpu-test tests > "$O/tests.txt" 2>&1; echo "tests rc=$?"
grep -E "^\[  (FAILED|PASSED)|tests ran|FAILED  \]" "$O/tests.txt" | tail -12
source <(sed -n '/^cudalib=/,/^export NCCL/p' scripts/gpu-test)
for k in ${LT_K:-auto 0}; do
  echo "== 3B batch 32 adamw8bit device_update_layers=$k $(date +%T)"
  timeout 170 "$P/bin/lazytrain" train configs/bench-qwen2.5-3b.yaml optimizer=adamw8bit max_steps=${LT_STEPS:-5} \
    device_update_layers=$k "trace=$O/train3b-k$k.trace.json" trace_step=3 > "$O/train3b-k$k.log" 2>&1; echo "rc=$?"
  grep -E "profile: host|^plan:|optimizer:|predicted|^step|time:|rror|first .* layers" "$O/train3b-k$k.log" | cut -c1-420
done
date +%T
