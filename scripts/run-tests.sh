#!/usr/bin/env bash
# README command 2: from a fresh Debian 12 machine, install what Weft needs,
# build from scratch and run every test.
#   WEFT_BUILD_DIR   build folder (default: build-test, always rebuilt from scratch)
#   WEFT_SANITIZERS  1 (default): also build and test with ASan+UBSan (build-asan); 0: skip
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)

build_and_test() {  # build_and_test DIR [cmake options...]
  local dir=$1
  shift
  rm -rf "$dir"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
  cmake --build "$dir" -j "$jobs"
  ctest --test-dir "$dir" --output-on-failure -j "$jobs" --timeout 600
}

build_and_test "${WEFT_BUILD_DIR:-build-test}"
if [[ ${WEFT_SANITIZERS:-1} == 1 ]]; then
  build_and_test build-asan -DWEFT_SANITIZE=address
fi
