#!/usr/bin/env bash
# The device check (docs/gpu.md), for a machine with an NVIDIA GPU, CMake, ninja and nvcc,
# where nothing can be installed: prints the driver, the devices and the attributes the GPU
# path relies on; builds Weft with CUDA; runs the GPU tests (every collective x dtype x op at
# 1-4 ranks as processes and as threads on the one GPU, odd counts, in and out of place,
# stream and blocking, both IPC kinds, bad input, a stalled rank, the NCCL shim); weft-perf on
# device memory from 8 B to 512 MiB at 1, 2 and 4 ranks beside the device-to-device copy
# ceiling; PyTorch's "nccl" backend on Weft's libnccl.so.2 where torch sees the GPU; and ends
# with a short table. Logs go under $OUT when set, else under the build folder.
#
# Without UCX on the machine it unpacks the Debian packages scripts/gpu-deps.sh fetched into
# .gpu-deps/ (carry that folder with the device tool) into $WEFT_GPU_DEPS and builds against
# them. Step limits: 20 (probe) + 20 (deps) + 40 (configure) + 180 (build) + 40 + 40 (IPC
# kinds) + 100 (tests) + 3 x 30 (perf) + 40 (torch) = 570 s at the very worst; a run that
# passes takes far less.
#   WEFT_GPU_BUILD_DIR  build folder (default build-gpu-check, reused)
#   WEFT_GPU_DEPS       where the carried packages are unpacked (default /tmp/weft-gpu-deps)
#   CUDA_HOME           toolkit (default /usr/local/cuda)
#   WEFT_GPU_CHECK_TIME_SCALE  multiplies every step's limit (default 1; a dry run of the
#                       script on a 2-core machine without a GPU needs about 8)
# Exit status: 0 when every step passed, 1 otherwise. A GPU test that skips on a machine where
# a GPU is visible counts as a failure: it means the test could not reach the device.
set -uo pipefail
cd "$(dirname "$0")/.."
cuda=${CUDA_HOME:-/usr/local/cuda}
build=$(realpath -m "${WEFT_GPU_BUILD_DIR:-build-gpu-check}")
deps=${WEFT_GPU_DEPS:-/tmp/weft-gpu-deps}
logs=${OUT:-$build/logs}
mkdir -p "$build" "$logs"
export PATH=$cuda/bin:$PATH
jobs=$(nproc)
scale=${WEFT_GPU_CHECK_TIME_SCALE:-1}

declare -a rows=()
failed=0
step() {  # step NAME LIMIT_S COMMAND...: runs with a time limit, logs, records a row
  local name=$1 limit=$2 start rc
  shift 2
  start=$(date +%s)
  echo "== $name"
  timeout $((limit * scale)) "$@" >"$logs/$name.log" 2>&1
  rc=$?
  tail -n 25 "$logs/$name.log"
  local took=$(($(date +%s) - start))
  if [[ $rc == 0 ]]; then
    rows+=("$name|ok|${took}s")
  else
    rows+=("$name|FAILED (rc $rc, log $logs/$name.log)|${took}s")
    failed=1
  fi
  return $rc
}

# The driver and devices, through the runtime (the probe links cudart
# statically, like Weft, and never libcuda).
probe_source=$build/gpu_probe.cu
cat >"$probe_source" <<'EOF'
#include <cstdio>
#include <cuda_runtime.h>
int main() {
  int driver = 0, runtime = 0, count = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("driver API %d, runtime %d\n", driver, runtime);
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    std::printf("devices: none usable (%s)\n", cudaGetErrorString(e));
    return 2;
  }
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, d);
    int pools = 0, handles = 0, managed = 0, unified = 0;
    cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, d);
    cudaDeviceGetAttribute(&handles, cudaDevAttrMemoryPoolSupportedHandleTypes, d);
    cudaDeviceGetAttribute(&managed, cudaDevAttrConcurrentManagedAccess, d);
    cudaDeviceGetAttribute(&unified, cudaDevAttrUnifiedAddressing, d);
    std::printf("device %d: %s, sm_%d%d, %d SMs, %.1f GiB, bus %02x:%02x.0\n", d, p.name, p.major,
                p.minor, p.multiProcessorCount, p.totalGlobalMem / 1073741824.0, p.pciBusID,
                p.pciDeviceID);
    std::printf("  unified addressing %d, memory pools %d, POSIX-fd pool handles %d, "
                "concurrent managed access %d\n",
                unified, pools, (handles & cudaMemHandleTypePosixFileDescriptor) != 0, managed);
    for (int peer = 0; peer < count; ++peer) {
      int can = 0;
      if (peer != d && cudaDeviceCanAccessPeer(&can, d, peer) == cudaSuccess)
        std::printf("  peer access to device %d: %d\n", peer, can);
    }
  }
  return count > 0 ? 0 : 2;
}
EOF

echo "== host"
uname -srm
command -v nvidia-smi >/dev/null &&
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap --format=csv
nvcc --version | tail -n 2
gpu_visible=0
if step probe 20 bash -c "nvcc -O1 -arch=sm_90 -o '$build/gpu-probe' '$probe_source' && '$build/gpu-probe'"; then
  gpu_visible=1
fi

# The build's dependencies: the machine's own, else the carried Debian packages.
unpack_deps() {
  local deb
  [[ -d .gpu-deps ]] || { echo "no UCX here and no .gpu-deps/ (run scripts/gpu-deps.sh and carry it)"; return 1; }
  mkdir -p "$deps"
  for deb in .gpu-deps/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$deb" "$deps" || return 1
    else
      (cd "$deps" && ar p "$OLDPWD/$deb" data.tar.xz | tar -xJ) || return 1
    fi
  done
  ls "$deps/usr/lib/x86_64-linux-gnu" | head -n 40
}
if ! pkg-config --exists ucx 2>/dev/null; then
  export deps
  if step deps 20 bash -c "$(declare -f unpack_deps); unpack_deps"; then
    lib=$deps/usr/lib/x86_64-linux-gnu
    export PKG_CONFIG_PATH=$lib/pkgconfig:$deps/usr/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=$deps
    export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} UCX_MODULE_DIR=$lib/ucx
    export CMAKE_PREFIX_PATH=$deps/usr
    command -v pkg-config >/dev/null || export PKG_CONFIG=$deps/usr/bin/pkgconf
  fi
fi
pkg_config=${PKG_CONFIG:-pkg-config}

targets=(weft weft_nccl weftrun weft-perf weft_emulated_cuda_driver weft_gpu_collectives_test
  weft_nccl_gpu_test weft_driver_probe_test weft_device_api_test weft_cuda_functors_test
  weft_cuda_kernels_gpu_test weft_device_api_gpu_test)
# Release at -O2, as CI builds (GCC 12's -O3 warns falsely about string concatenation).
step configure 40 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" -DCMAKE_C_FLAGS_RELEASE="-O2 -DNDEBUG" \
  -DPKG_CONFIG_EXECUTABLE="$(command -v "$pkg_config")" \
  -DWEFT_ENABLE_CUDA=ON -DWEFT_CUDA_PTXAS_VERBOSE=ON &&
  step build 180 cmake --build "$build" -j "$jobs" --target "${targets[@]}"
# Registers and spills of the reduction kernels, from the build's -Xptxas -v.
grep -E "Used [0-9]+ registers|spill" "$logs/build.log" | sort | uniq -c | head -n 12

gtest=$build/tests/cuda/weft_gpu_collectives_test
if [[ -x $gtest ]]; then
  # Which IPC kind works between two processes on this GPU (each: every collective, exact).
  step ipc-posix-fd 40 "$gtest" --gtest_filter='*3_processes_posix_fd*'
  step ipc-legacy 40 "$gtest" --gtest_filter='*2_processes_legacy*'
  step tests 100 ctest --test-dir "$build" -L "gpu|cuda" --output-on-failure --timeout 100 -j 4
  skipped=$(grep -c "(Skipped)" "$logs/tests.log")
  if [[ $gpu_visible == 1 && $skipped != 0 ]]; then
    rows+=("skipped tests|FAILED: $skipped skipped with a GPU visible|-")
    failed=1
  elif [[ $skipped != 0 ]]; then
    rows+=("skipped tests|$skipped (no GPU visible)|-")
  fi
fi

# weft-perf on device memory, bf16 AllReduce from 8 B to 512 MiB, results checked.
perf_rows=()
if [[ -x $build/bench/perf/weft-perf ]]; then
  for n in 1 2 4; do
    step "perf-$n" 30 "$build/tools/weftrun/weftrun" -n "$n" --no-prefix --timeout 30 \
      "$build/bench/perf/weft-perf" allreduce -b 8 -e 512M -f 8 -d bfloat16 -G 1 -n 10 -w 3
    log=$logs/perf-$n.log
    ceiling=$(sed -n 's/.*copy ceiling on GPU [0-9]*: \([0-9.]*\) GB\/s.*/\1/p' "$log" | head -n 1)
    small=$(awk '$1 == 8 && $3 == "bfloat16" {print $6; exit}' "$log")
    big=$(awk '$1 ~ /^[0-9]+$/ && $1 >= 268435456 {b = $8} END {print b}' "$log")
    perf_rows+=("$n ranks: 8 B ${small:-?} us; busbw at the largest size ${big:-?} GB/s; copy ceiling ${ceiling:-?} GB/s")
  done
fi

# PyTorch's nccl backend on Weft's libnccl.so.2 (interposed), two ranks on the one GPU.
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  step torch 40 env LD_PRELOAD="$build/nccl/libnccl.so.2" python3 scripts/gpu-torch-check.py
fi

echo
echo "== summary"
printf '%-20s | %-60s | %s\n' step result time
for row in "${rows[@]}"; do
  IFS='|' read -r name result took <<<"$row"
  printf '%-20s | %-60s | %s\n' "$name" "$result" "$took"
done
grep -E "tests passed|tests failed" "$logs/tests.log" 2>/dev/null
for row in "${perf_rows[@]}"; do echo "weft-perf bf16 allreduce, $row"; done
exit $failed
