#!/usr/bin/env bash
# run 83 (issue 17, final: margin on the device-layer count): scripts/gpu-validate efficiency (tests, attention beside SDPA, 7B batch 64, 3B batch 32; the
# first layers' updates on the GPU by default) with the SM clock and power sampled every 200 ms.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,utilization.gpu --format=csv -lms 200 > "$OUT/smi.csv" 2>&1 &
smi=$!
LT_TAIL=12 LT_TRAIN3B_ARGS="optimizer=adamw8bit max_steps=5" scripts/gpu-validate efficiency
kill $smi
mkdir -p /tmp/x && tar -C /tmp/x -xzf "$OUT/logs.tgz"
for f in train7b-keep-true.log train3b.log; do
  echo "== $f"; grep -E "profile: (attention|host)|^plan:|optimizer:|predicted|^step|time:|rror" /tmp/x/$f | cut -c1-330
done
grep -E "ratio|sdpa|SDPA" /tmp/x/attention.out | tail -12
