#!/usr/bin/env bash
# The device check (docs/gpu.md), for a machine with an NVIDIA GPU, CMake and
# nvcc, where nothing can be installed: prints the driver, the devices and
# the attributes the GPU path relies on, builds Weft's CUDA parts and their
# tests with CUDA on, runs the `gpu`- and `cuda`-labelled tests, and ends with
# a short table. At most 8 minutes: the steps' time limits (60 + 90 + 240 + 90 s)
# add up to that. Logs go under $OUT when set, else under the build folder.
#   WEFT_GPU_BUILD_DIR  build folder (default build-gpu-check, reused)
#   CUDA_HOME           toolkit (default /usr/local/cuda)
# Exit status: 0 when every step passed, 1 otherwise. A GPU test that skips
# on a machine where a GPU is visible counts as a failure: it means the
# runtime could not reach the device (an old driver, say).
set -uo pipefail
cd "$(dirname "$0")/.."
cuda=${CUDA_HOME:-/usr/local/cuda}
build=${WEFT_GPU_BUILD_DIR:-build-gpu-check}
logs=${OUT:-$build/logs}
mkdir -p "$build" "$logs"
export PATH=$cuda/bin:$PATH
jobs=$(nproc)

declare -a rows=()
failed=0
step() {  # step NAME LIMIT_S COMMAND...: runs with a time limit, logs, records a row
  local name=$1 limit=$2 start rc
  shift 2
  start=$(date +%s)
  echo "== $name"
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
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
if step probe 60 bash -c "nvcc -O1 -arch=sm_90 -o '$build/gpu-probe' '$probe_source' && '$build/gpu-probe'"; then
  gpu_visible=1
fi

step configure 90 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DWEFT_ENABLE_CUDA=ON -DWEFT_BUILD_BENCH=OFF -DWEFT_CUDA_PTXAS_VERBOSE=ON &&
  step build 240 cmake --build "$build" -j "$jobs" --target weft_cuda_kernels \
    weft_cuda_functors_test weft_cuda_kernels_gpu_test weft_device_api_test \
    weft_device_api_gpu_test
# Registers and spills of the reduction kernels, from the build's -Xptxas -v.
grep -E "Used [0-9]+ registers|spill" "$logs/build.log" | sort | uniq -c | head -n 12

if [[ -x $build/tests/cuda/weft_cuda_kernels_gpu_test ]]; then
  step tests 90 ctest --test-dir "$build" -L "gpu|cuda" --output-on-failure --timeout 60 -j 4
  skipped=$(grep -c "(Skipped)" "$logs/tests.log")
  if [[ $gpu_visible == 1 && $skipped != 0 ]]; then
    rows+=("skipped tests|FAILED: $skipped skipped with a GPU visible|-")
    failed=1
  elif [[ $skipped != 0 ]]; then
    rows+=("skipped tests|$skipped (no GPU visible)|-")
  fi
fi

echo
echo "== summary"
printf '%-20s | %-50s | %s\n' step result time
for row in "${rows[@]}"; do
  IFS='|' read -r name result took <<<"$row"
  printf '%-20s | %-50s | %s\n' "$name" "$result" "$took"
done
grep -E "tests passed|tests failed" "$logs/tests.log" 2>/dev/null
exit $failed
