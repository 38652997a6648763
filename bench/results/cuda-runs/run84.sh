#!/usr/bin/env bash
# one-off device call: versions, real-shape attention tests, the hybrid smoke rows; the attention variants when the
# 27B row is non-finite; then the other smoke rows in the time left
set -u
O=$OUT; mkdir -p $O
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
{ nvidia-smi; python3 -c 'import torch;print("torch",torch.__version__,"cudnn",torch.backends.cudnn.version(),"cuda",torch.version.cuda)';
  pip list 2>/dev/null | grep -iE "nvidia|torch"; find / -name "libcudnn*.so*" 2>/dev/null | head; } > $O/versions.txt 2>&1
grep -E "torch|cudnn|H100|H200|Driver" $O/versions.txt | head -12
LT_TEST_ARGS="--gtest_filter=*RealShape*:*CudnnAttn*" timeout 150 scripts/gpu-test tests 2>&1 | grep -E "real-shape|FAILED|PASSED|Expected|Which is|actual|rel|Failure" | head -30
echo "== t=$(el)"
mkdir -p $O/a; OUT=$O/a LT_SMOKE_ROWS="qwen3.6-27b qwen3.5-9b" timeout 230 scripts/gpu-test smoke 2>&1 | grep -vE "^(name|NVIDIA)" | tail -12
mkdir -p $O/a/m; for r in /tmp/lt-smoke/*; do [[ -f $r/metrics.jsonl ]] && cp $r/metrics.jsonl $O/a/m/$(basename $r).jsonl; done
echo "== t=$(el)"
P=build-gpu/pack
export LD_LIBRARY_PATH="$PWD/$P/lib:$(python3 -c 'import nvidia, os; b=os.path.dirname(nvidia.__path__[0]); print(":".join(r for r, d, f in os.walk(os.path.join(b, "nvidia")) if any(x.startswith(("libcublas","libcudart","libnccl","libcudnn","libnvrtc")) for x in f)))')"
if ! grep -q "qwen3.6-27b" $O/a/smoke.md 2>/dev/null || grep -qiE "FAIL|nan|inf" $O/a/smoke.md; then
  for v in "LT_CHECK_FINITE=1" "LT_ATTN_BWD=own" "LT_ATTN_PACKED=own" "LT_ATTN_DETERMINISTIC=0"; do
    [[ $(el) -gt 480 ]] && break
    env $v timeout 60 $P/bin/lazytrain train configs/smoke.yaml model_name_or_path=qwen3.6-27b \
      "model_overrides={num_hidden_layers: 4, vocab_size: 248320}" max_steps=2 output_dir=/tmp/lt-v > "$O/var-$v.log" 2>&1
    echo "-- $v rc $? t=$(el): $(grep -E '^step|grad_norm|non-finite|NaN|skipp' "$O/var-$v.log" | head -6 | cut -c1-200 | tr '\n' '|')"
    grep -m 8 -iE "finite check|first non-finite|guard" "$O/var-$v.log" | cut -c1-300
  done
fi
left=$(( 570 - $(el) ))
if [[ $left -gt 60 ]]; then
  mkdir -p $O/b; OUT=$O/b LT_SMOKE_ROWS="qwen2.5 qwen3 llama3 27b-bf16sr 27b-devgrad-bf16 27b-devupdate 27b-nokeep 27b-nvme" \
    timeout $left scripts/gpu-test smoke 2>&1 | grep -vE "^(name|NVIDIA)" | tail -24
fi
echo "== t=$(el)"
mkdir -p $O/b/m; for r in /tmp/lt-smoke/*; do [[ -f $r/metrics.jsonl ]] && cp $r/metrics.jsonl $O/b/m/$(basename $r).jsonl; done 2>/dev/null
cd $O && tar czf /tmp/logs.tgz . 2>/dev/null; find . -mindepth 1 -maxdepth 1 -exec rm -rf {} +; mv /tmp/logs.tgz .
