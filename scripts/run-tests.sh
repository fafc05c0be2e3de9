#!/usr/bin/env bash
# README command 2: from a fresh Debian 12 machine, install what Weft needs,
# build from scratch and run every test.
#   WEFT_BUILD_DIR   build folder (default: build-test, always rebuilt from scratch)
#   WEFT_SANITIZERS  1 (default): also build and test with ASan+UBSan (build-asan, every
#                    test) and TSan (build-tsan, the multi-threaded suites); 0: skip
#   WEFT_VENV        virtual environment for the PyTorch backend's tests (default
#                    /opt/weft-venv; created with torch when absent, reused when present)
#   WEFT_PYTHON      0: skip the PyTorch backend's tests
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)

configure() {  # configure DIR [cmake options...]
  local dir=$1
  shift
  rm -rf "$dir"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
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
  configure build-asan -DWEFT_SANITIZE=address
  cmake --build build-asan -j "$jobs"
  # A failed communicator abandons its UCX transport (lib/core/communicator.cc);
  # what UCX allocated inside it is reachable only through UCX's own pools.
  # hwloc dlopens its OpenCL plugin, which pulls in libOpenCL and its dynamic TLS;
  # Debian 12's LeakSanitizer (GCC 12) crashes scanning that TLS at exit ("Tracer
  # caught signal 11", DTLS entry with a bogus range) in any process that ran hwloc
  # discovery. Weft uses neither the OpenCL nor the GL plugin (GPUs and NICs come
  # from PCI), so the sanitizer runs keep hwloc from loading them.
  HWLOC_PLUGINS_BLACKLIST=hwloc_opencl,hwloc_gl \
    LSAN_OPTIONS=suppressions=$PWD/scripts/lsan-ucx.supp \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" --timeout 900

  # TSan: the suites where threads meet (progress thread, control threads, user threads).
  # UCX's memory hooks patch the allocator, which TSan's interceptors cannot share.
  configure build-tsan -DWEFT_SANITIZE=thread
  cmake --build build-tsan -j "$jobs" --target weftrun weft_p2p_test weft_comm_test \
    weft_failure_test weft_departure_test weft_stream_test weft_direct_test weft_register_test \
    weft_cma_test weft_nccl_tests
  UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no UCX_MEM_EVENTS=no \
    ctest --test-dir build-tsan --output-on-failure -j "$jobs" --timeout 900 -L threads
fi
