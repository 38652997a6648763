#!/usr/bin/env bash
# one-off device call: the H100 lines (the 27B shape at an 80 GB cap, then Qwen3.5-9B at batch 72)
set -u
O=$OUT; T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
mkdir -p $O/27b $O/9b
OUT=$O/27b LT_27B_ARGS="gpu_mem=76GiB max_steps=2" timeout 240 scripts/gpu-test scale27b 2>&1 | grep -vE "^(name|NVIDIA)" | tail -14
echo "== t=$(el)"
OUT=$O/9b LT_27B_ARGS="gpu_mem=76GiB model_name_or_path=qwen3.5-9b max_steps=1" timeout $(( 390 - $(el) )) scripts/gpu-test scale27b 2>&1 | grep -vE "^(name|NVIDIA)" | tail -10
echo "== t=$(el)"
grep -hE "skipp|non-finite|guard|cuDNN [0-9]" $O/*/train27b.log | head -8
cd $O && tar czf /tmp/logs.tgz . 2>/dev/null; find . -mindepth 1 -maxdepth 1 -exec rm -rf {} +; mv /tmp/logs.tgz .
