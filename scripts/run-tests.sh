#!/usr/bin/env bash
# README command 2: from a fresh Debian 12 machine, install what Weft needs,
# build from scratch and run every test.
#   WEFT_BUILD_DIR   build folder (default: build-test, always rebuilt from scratch)
#   WEFT_SANITIZERS  1 (default): also build and test with ASan+UBSan (build-asan, every
#                    test) and TSan (build-tsan, the multi-threaded suites); 0: skip
#   WEFT_VENV        virtual environment for the PyTorch backend's tests (default
#                    /opt/weft-venv; created with torch when absent, reused when present)
#   WEFT_PYTHON      0: skip the PyTorch backend's tests
#   WEFT_FUZZ        1 (default): build the fuzzers with clang (build-fuzz) and run each
#                    for WEFT_FUZZ_SECONDS (default 20) from its corpus; 0: skip
#   WEFT_CCACHE_DIR  compiler cache kept outside the checkout (default /var/cache/weft-ccache;
#                    created when absent). Build folders are still made from scratch; what
#                    ccache returns is the compiler's output for identical sources and flags.
#                    WEFT_CCACHE_DIR= (empty) compiles everything again.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)

launcher=()
if [[ -n ${WEFT_CCACHE_DIR-/var/cache/weft-ccache} ]] && command -v ccache >/dev/null; then
  # Paths relative to the checkout, so that every fresh clone hits the same entries.
  export CCACHE_DIR=${WEFT_CCACHE_DIR:-/var/cache/weft-ccache} CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}
  mkdir -p "$CCACHE_DIR"
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
    -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi

configure() {  # configure DIR [cmake options...]
  local dir=$1
  shift
  rm -rf "$dir"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" "$@"
}

dir=${WEFT_BUILD_DIR:-build-test}
configure "$dir"
cmake --build "$dir" -j "$jobs"
ctest --test-dir "$dir" --output-on-failure -j "$jobs" --timeout 600

if [[ ${WEFT_PYTHON:-1} == 1 ]]; then
  # The PyTorch backend (python/): torch from PyPI in a venv outside the checkout
  # (about 5 GB once), the package installed from this checkout against the
  # libweft just built, then its pytest suite.
  venv=${WEFT_VENV:-/opt/weft-venv}
  if ! "$venv/bin/python" -c 'import torch, pytest; assert torch.__version__.startswith("2.11.0")' \
    2>/dev/null; then
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install torch==2.11.0 numpy pytest
  fi
  WEFT_CMAKE_BUILD_DIR=$PWD/$dir "$venv/bin/pip" install ./python
  "$venv/bin/python" -m pytest python/tests -v
fi

if [[ ${WEFT_SANITIZERS:-1} == 1 ]]; then
  configure build-asan -DWEFT_SANITIZE=address -DWEFT_ENABLE_CUDA=OFF
  cmake --build build-asan -j "$jobs"
  # A failed communicator abandons its UCX transport (lib/core/communicator.cc);
  # what UCX allocated inside it is reachable only through UCX's own pools.
  # hwloc dlopens its OpenCL plugin, which pulls in libOpenCL and its dynamic TLS;
  # Debian 12's LeakSanitizer (GCC 12) crashes scanning that TLS at exit ("Tracer
  # caught signal 11", DTLS entry with a bogus range) in any process that ran hwloc
  # discovery. Weft uses neither the OpenCL nor the GL plugin (GPUs and NICs come
  # from PCI), so the sanitizer runs keep hwloc from loading them.
  HWLOC_PLUGINS_BLACKLIST=hwloc_opencl,hwloc_gl \
    LSAN_OPTIONS=suppressions=$PWD/scripts/lsan-ucx.supp:print_suppressions=0 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" --timeout 900

  # TSan: the suites where threads meet (progress thread, control threads, user threads).
  # UCX's memory hooks patch the allocator, which TSan's interceptors cannot share.
  configure build-tsan -DWEFT_SANITIZE=thread -DWEFT_ENABLE_CUDA=OFF
  cmake --build build-tsan -j "$jobs" --target weftrun weft_p2p_test weft_comm_test \
    weft_failure_test weft_shrink_test weft_departure_test weft_stream_test weft_direct_test weft_register_test \
    weft_cma_test weft_nccl_tests weft_gpu_collectives_test weft_emulated_cuda_driver weft-perf
  # UCX's exit-time race with its own async thread is suppressed (scripts/tsan-ucx.supp).
  tsan_options=suppressions=$PWD/scripts/tsan-ucx.supp:print_suppressions=0
  UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no UCX_MEM_EVENTS=no TSAN_OPTIONS=$tsan_options \
    ctest --test-dir build-tsan --output-on-failure -j "$jobs" --timeout 900 -L threads
  # The GPU path's orchestration on the emulated driver (stream threads, the watchdog, ranks
  # as threads and processes). Its forked children end with _exit, which skips joining the
  # bootstrap root's finished thread: not a leak (the next root reaps it), so leaks are not
  # reported here; races are.
  UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no UCX_MEM_EVENTS=no \
    TSAN_OPTIONS=$tsan_options:report_thread_leaks=0 \
    ctest --test-dir build-tsan --output-on-failure -j "$jobs" --timeout 900 -R '^emulated\.'

fi

if [[ ${WEFT_FUZZ:-1} == 1 ]]; then
  # libFuzzer needs clang: its own build folder, only the fuzz targets, every library they
  # use instrumented for coverage and checked by ASan+UBSan (tests/fuzz/CMakeLists.txt).
  configure build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link -DCMAKE_CXX_FLAGS=-fsanitize=fuzzer-no-link \
    -DWEFT_SANITIZE=address -DWEFT_ENABLE_CUDA=OFF -DWEFT_BUILD_BENCH=OFF -DWEFT_BUILD_FUZZERS=ON \
    -DWEFT_FUZZ_SECONDS="${WEFT_FUZZ_SECONDS:-20}"
  cmake --build build-fuzz -j "$jobs" --target weft_fuzz_bootstrap_frames weft_fuzz_cluster_file \
    weft_replay_bootstrap_frames weft_replay_cluster_file
  HWLOC_PLUGINS_BLACKLIST=hwloc_opencl,hwloc_gl \
    ctest --test-dir build-fuzz --output-on-failure -j "$jobs" -L fuzz
fi
