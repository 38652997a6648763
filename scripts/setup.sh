#!/usr/bin/env bash
# Installs lazytrain's system dependencies (Debian packages) and builds it into ./build.
# Idempotent: a second run only rebuilds what changed. Set LT_SKIP_APT=1 to skip the install step.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(cmake ninja-build g++ pkg-config ccache
      libopenblas-dev coinor-libcbc-dev nlohmann-json3-dev libcli11-dev libyaml-cpp-dev
      liburing-dev libfmt-dev libicu-dev libpcre2-dev libgtest-dev libgmock-dev clang libclang-rt-14-dev)

if [[ "${LT_SKIP_APT:-0}" != 1 ]]; then
  missing=()
  for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if (( ${#missing[@]} )); then
    echo "setup: installing ${missing[*]}"
    SUDO=""; [[ $(id -u) != 0 ]] && SUDO=sudo
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
  fi
fi

# cuDNN frontend headers (PyPI) for the CUDA backend's attention; a no-op when present.
scripts/fetch-cudnn-frontend

BUILD=${LT_BUILD_DIR:-build}
JOBS=${LT_JOBS:-$(nproc)}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release ${LT_CMAKE_ARGS:-}
cmake --build "$BUILD" -j "$JOBS"
echo "setup: built $BUILD/bin/lazytrain"
