#!/usr/bin/env bash
# NOTE: the 3521dd6 binaries of this call were built without cuDNN (a worktree without .deps/cudnn-frontend):
# they ran our own attention kernels, so their lines compare nothing about cuDNN (scripts/gpu-pack-baseline fixes it)
# one-off device call (H100, warm after gpu_call1: build-gpu/pack is there): the 9B line on the tree the NaN was
# seen on (3521dd6) and, when it is non-finite there, on cb66450^ (c29921c) and cb66450; then the dense 7B with
# HEAD beside 3521dd6 (the tree before the restructuring), then the 27B shape on HEAD for 3 steps
set -u
O=$OUT; mkdir -p $O
T0=$(date +%s); el() { echo $(( $(date +%s)-T0 )); }
P=build-gpu/pack
[[ -x $P/bin/lazytrain ]] || { echo "no HEAD pack here"; exit 2; }
cudalib=""; for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [[ -d $d ]] && cudalib="$cudalib:$d"; done
pylib=$(python3 -c 'import nvidia, os; b=os.path.dirname(nvidia.__path__[0]); print(":".join(r for r, d, f in os.walk(os.path.join(b, "nvidia")) if any(x.startswith(("libcublas","libcudart","libnccl","libcudnn","libnvrtc")) for x in f)))')
export LD_LIBRARY_PATH="$PWD/$P/lib$cudalib:$pylib"
mkdir -p /tmp/ob; for f in .oldbins/lazytrain-*.xz; do xz -dc $f > /tmp/ob/$(basename ${f%.xz}); chmod +x /tmp/ob/$(basename ${f%.xz}); done
cp $P/bin/lazytrain /tmp/ob/lazytrain-HEAD; mkdir -p .oldbins/configs-HEAD; cp configs/bench-*.yaml .oldbins/configs-HEAD/
g() { grep -E "^plan|predicted|^step|rror|non-finite|skipp|^training" "$1" | cut -c1-300; }
line() {  # line <commit> <name> <config> <timeout> <args...>
  local c=$1 n=$2 cfg=$3 t=$4; shift 4
  timeout $t /tmp/ob/lazytrain-$c train .oldbins/configs-$c/$cfg "$@" > $O/$n-$c.log 2>&1
  echo "-- $n $c rc $? t=$(el)"; g $O/$n-$c.log
}
line 3521dd6 9b bench-qwen3.6-27b.yaml 150 model_name_or_path=qwen3.5-9b max_steps=1 gpu_mem=76GiB
if grep -qE "grad_norm (nan|inf)" $O/9b-3521dd6.log; then
  line c29921c 9b bench-qwen3.6-27b.yaml 150 model_name_or_path=qwen3.5-9b max_steps=1 gpu_mem=76GiB
  line cb66450 9b bench-qwen3.6-27b.yaml 150 model_name_or_path=qwen3.5-9b max_steps=1 gpu_mem=76GiB
fi
for c in HEAD 3521dd6; do
  [[ $(el) -lt 480 ]] && line $c 7b bench-qwen2.5-7b.yaml 100 max_steps=3
done
left=$(( 590 - $(el) ))
[[ $left -gt 120 ]] && line HEAD 27b bench-qwen3.6-27b.yaml $left gpu_mem=76GiB max_steps=3
echo "== end t=$(el)"
cd $O && tar czf /tmp/logs.tgz . 2>/dev/null; find . -mindepth 1 -maxdepth 1 -exec rm -rf {} +; mv /tmp/logs.tgz h100-call2-logs.tgz
