#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan) into build-fuzz and runs each for a while over
# a copy of the committed seed corpus. Exits non-zero if any target finds a crash.
#   scripts/fuzz.sh [SECONDS]   (default 20: the safetensors target SECONDS, the config target SECONDS/4)
# LT_FUZZ_SEED=N fixes libFuzzer's seed (the test command uses 1, so that CI replays the same inputs on
# every run and a red CI means a change broke something); unset, each run explores anew.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-20}
BUILD=${LT_FUZZ_BUILD_DIR:-build-fuzz}
CXX_BIN=$(command -v clang++ || command -v clang++-14 || true)
CC_BIN=$(command -v clang || command -v clang-14 || true)
if [[ -z "$CXX_BIN" || -z "$CC_BIN" ]]; then
  echo "fuzz: clang not found (install clang and libclang-rt-14-dev: scripts/setup.sh)" >&2
  exit 1
fi
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER="$CC_BIN" \
  -DCMAKE_CXX_COMPILER="$CXX_BIN" -DLT_FUZZ=ON -DLT_CUDA=OFF -DLT_TESTS=OFF -DLT_BENCH=OFF >/dev/null
cmake --build "$BUILD" -j "${LT_JOBS:-$(nproc)}" --target fuzz_safetensors fuzz_model_config fuzz_tokenizer_json fuzz_jinja

run() {  # run TARGET CORPUS_DIR SECONDS [extra libFuzzer args]
  local target=$1 seeds=$2 secs=$3
  shift 3
  local work="$BUILD/fuzz-corpus/$target"
  mkdir -p "$work" "$BUILD/fuzz-artifacts"
  cp -n "$seeds"/* "$work"/ 2>/dev/null || true
  echo "fuzz: $target for ${secs}s"
  local log="$BUILD/fuzz-artifacts/$target.log" rc=0
  local seed=()
  [[ -n ${LT_FUZZ_SEED:-} ]] && seed=(-seed="$LT_FUZZ_SEED")
  "$FUZZ_BIN_DIR/$target" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=8192 "${seed[@]}" \
    -print_final_stats=1 -artifact_prefix="$BUILD/fuzz-artifacts/$target-" "$@" "$work" >"$log" 2>&1 || rc=$?
  if (( rc != 0 )); then
    tail -n 60 "$log" >&2
    echo "fuzz: $target FAILED (exit $rc); reproducer under $BUILD/fuzz-artifacts/, log $log" >&2
    return 1
  fi
  grep -E '^(Done|stat::(number_of_executed_units|new_units_added|peak_rss_mb))' "$log" || true
}

export LT_LOG_LEVEL=error  # parsers may warn; keep the fuzz log readable
FUZZ_BIN_DIR=${FUZZ_BIN_DIR:-$BUILD/fuzz}
status=0
run fuzz_safetensors fuzz/corpus/safetensors "$SECS" -dict=fuzz/safetensors.dict || status=1
cfg_secs=$(( SECS / 4 > 0 ? SECS / 4 : 1 ))
run fuzz_model_config fuzz/corpus/config "$cfg_secs" || status=1
run fuzz_tokenizer_json fuzz/corpus/tokenizer_json "$cfg_secs" || status=1
run fuzz_jinja fuzz/corpus/jinja "$cfg_secs" || status=1
exit $status
