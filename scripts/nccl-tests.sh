#!/bin/bash
# Builds NVIDIA's nccl-tests against Weft's libnccl.so.2 and checks that every
# NCCL symbol of every binary resolves against it (docs/nccl-shim.md).
#
#   scripts/nccl-tests.sh SRC_DIR [OUT_DIR]
#
# SRC_DIR: an nccl-tests source tree, kept outside this repository (e.g.
# `git archive` of github.com/NVIDIA/nccl-tests into /tmp). OUT_DIR (default
# /tmp/weft-nccl-tests): the build. Environment: WEFT_BUILD (default build/)
# holds the built shim (build/nccl/libnccl.so.2: `cmake --build build
# --target weft_nccl`); CUDA_HOME (default /usr/local/cuda); NVCC_GENCODE
# (default sm_90 only, to keep the build short); MPI=0 to build without MPI
# (with MPI, the default when mpicc exists, several ranks can share one GPU).
# Running the binaries needs a GPU and Weft's GPU path; this only builds and checks.
set -euo pipefail

src=${1:?usage: $0 SRC_DIR [OUT_DIR]}
out=${2:-/tmp/weft-nccl-tests}
repo=$(cd "$(dirname "$0")/.." && pwd)
weft_build=${WEFT_BUILD:-$repo/build}
cuda=${CUDA_HOME:-/usr/local/cuda}
shim_dir=$weft_build/nccl
src=$(cd "$src" && pwd)

[ -f "$src/src/Makefile" ] || { echo "$src is not an nccl-tests source tree" >&2; exit 1; }
[ -e "$shim_dir/libnccl.so.2" ] || { echo "no $shim_dir/libnccl.so.2: build target weft_nccl" >&2; exit 1; }
[ -x "$cuda/bin/nvcc" ] || { echo "no nvcc in $cuda/bin" >&2; exit 1; }
case "$out" in "$repo"/*) echo "OUT_DIR must be outside the repository" >&2; exit 1 ;; esac

# NCCL_HOME as nccl-tests expects it: the system header, our library.
home=$out/nccl-home
mkdir -p "$home/include" "$home/lib"
ln -sf "$cuda/include/nccl.h" "$home/include/nccl.h"
[ -e "$cuda/include/nccl_device" ] && ln -sfn "$cuda/include/nccl_device" "$home/include/nccl_device"
[ -e "$cuda/include/nccl_device.h" ] && ln -sf "$cuda/include/nccl_device.h" "$home/include/nccl_device.h"
ln -sf "$shim_dir/libnccl.so.2" "$home/lib/libnccl.so.2"
ln -sf libnccl.so.2 "$home/lib/libnccl.so"

mpi_args=()
if [ "${MPI:-auto}" != 0 ] && command -v mpicc >/dev/null; then
  mpi_include=$(mpicc --showme:incdirs | awk '{print $1}')
  mpi_args=(MPI=1 MPI_HOME="$(dirname "$mpi_include")")
fi
make -C "$src/src" -j"$(nproc)" BUILDDIR="$out/build" CUDA_HOME="$cuda" NCCL_HOME="$home" \
  NVCC_GENCODE="${NVCC_GENCODE:--gencode=arch=compute_90,code=sm_90}" "${mpi_args[@]}"

# Every binary: libnccl.so.2 is ours, every NCCL name it imports is defined by
# ours, and the dynamic linker finds no undefined NCCL symbol.
ours=$(nm -D --defined-only "$shim_dir/libnccl.so.2" | awk '{print $3}' | sort)
fail=0 checked=0
for bin in "$out"/build/*_perf*; do
  [ -x "$bin" ] || continue
  checked=$((checked + 1))
  resolved=$(LD_LIBRARY_PATH=$home/lib ldd -r "$bin" 2>&1)
  if ! grep -q "libnccl.so.2 => $home/lib/libnccl.so.2" <<<"$resolved"; then
    echo "$bin: libnccl.so.2 does not resolve to Weft's"; fail=1
  fi
  if grep "undefined symbol: p\?nccl" <<<"$resolved"; then fail=1; fi
  imported=$(nm -D --undefined-only "$bin" | awk '{print $2}' | grep '^p\?nccl' | sort -u)
  missing=$(comm -23 <(echo "$imported") <(echo "$ours"))
  if [ -n "$missing" ]; then echo "$bin: missing $missing"; fail=1; fi
  echo "$(basename "$bin"): $(echo "$imported" | wc -l) NCCL symbols, all resolved by Weft"
done
[ "$checked" -gt 0 ] || { echo "no binaries were built"; exit 1; }
[ "$fail" -eq 0 ] && echo "nccl-tests: $checked binaries built against Weft's libnccl.so.2 in $out/build"
exit "$fail"
