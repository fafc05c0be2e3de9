#!/usr/bin/env bash
# README command 1: from a fresh Debian 12 machine, install what Weft needs,
# build it, and run the main job: a verified AllReduce sweep on 4 local ranks
# (nccl-tests format; exits non-zero if any element is wrong).
#   WEFT_RANKS   local ranks (default 4)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DWEFT_BUILD_TESTS=OFF
cmake --build build -j "$(nproc)" --target weft weftrun weft-perf
build/tools/weftrun/weftrun -n "${WEFT_RANKS:-4}" --timeout 600 \
  build/bench/perf/weft-perf allreduce -b 8 -e 64M -f 4 -c 1 "$@"
