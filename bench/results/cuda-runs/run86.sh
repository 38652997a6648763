#!/usr/bin/env bash
# one-off device call (H100 or H200, HEAD pack): versions, the whole GPU suite, the smoke matrix, the 9B line
set -u
O=$OUT; mkdir -p $O; K=${1:-gpu}
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
{ nvidia-smi; python3 -c 'import torch;print("torch",torch.__version__,"cudnn",torch.backends.cudnn.version(),"cuda",torch.version.cuda)'; } > $O/$K-versions.txt 2>&1
grep -E "torch|H100|H200|Driver" $O/$K-versions.txt | head -4
if [[ ${LT_SKIP_TESTS:-0} != 1 ]]; then
  mkdir -p $O/t; OUT=$O/t timeout 200 scripts/gpu-test tests 2>&1 | grep -E "FAILED|PASSED|SKIPPED|tests ran|Failure|Expected|Which is" | head -30
  echo "== tests t=$(el)"
fi
mkdir -p $O/s; OUT=$O/s timeout $(( ${LT_SMOKE_END:-520} - $(el) )) scripts/gpu-test smoke 2>&1 | grep -vE "^(name|NVIDIA)" | cut -c1-300 | tail -40
mkdir -p $O/s/m; for r in /tmp/lt-smoke/*; do [[ -f $r/metrics.jsonl ]] && cp $r/metrics.jsonl $O/s/m/$(basename $r).jsonl; done 2>/dev/null
echo "== smoke t=$(el)"
left=$(( 585 - $(el) ))
if [[ $left -gt 70 && ${LT_NO_9B:-0} != 1 ]]; then
  mkdir -p $O/9b; OUT=$O/9b LT_27B_ARGS="gpu_mem=76GiB model_name_or_path=qwen3.5-9b max_steps=1" timeout $left scripts/gpu-test scale27b 2>&1 | grep -E "^plan|predicted|^step|rror" | cut -c1-330
  mv $O/9b/train27b.log $O/9b/train9b.log 2>/dev/null
fi
echo "== end t=$(el)"
cd $O && tar czf /tmp/logs.tgz . 2>/dev/null; find . -mindepth 1 -maxdepth 1 -exec rm -rf {} +; mv /tmp/logs.tgz $K-logs.tgz
