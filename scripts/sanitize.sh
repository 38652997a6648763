#!/usr/bin/env bash
# The training and command-line tests (test_train, test_cli: bad inputs, kills, resumes, stops, non-finite steps,
# checkpoint write failures) built with AddressSanitizer and UndefinedBehaviorSanitizer in build-asan/ (CPU only);
# any memory error or undefined behaviour in them or in the lazytrain processes they start fails the run. Leak
# detection is off (process-lifetime singletons). Called by CI after the test command; ~12 min on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${LT_ASAN_BUILD_DIR:-build-asan}
san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLT_CUDA=OFF -DLT_TESTS=ON -DLT_BENCH=OFF \
  -DCMAKE_CXX_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$B" -j "$(nproc)" --target test_train test_cli lazytrain
export ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
for t in test_train test_cli; do
  echo "sanitize: $t"
  "$B/tests/$t" --gtest_brief=1
done
echo "sanitize: no memory error or undefined behaviour in test_train and test_cli"
