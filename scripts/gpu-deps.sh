#!/usr/bin/env bash
# Fetches, on this Debian 12 machine, the Debian packages Weft's build needs that the GPU
# machine's image lacks (UCX, hwloc, GoogleTest, pkg-config), into .gpu-deps/ (git-ignored),
# for the device tool to carry there: scripts/gpu-check.sh unpacks them into a folder of its
# own when the machine has no UCX (nothing can be installed there). Their libraries need a
# glibc at least as new as Debian 12's (2.36). Run as a user who may run apt-get download.
#   bash scripts/gpu-deps.sh     then: device run with carry [".gpu-deps"]
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(
  libucx0 libucx-dev libnuma1 libibverbs1 librdmacm1          # UCX and what it links
  libhwloc15 libhwloc-dev libnuma-dev libltdl7 libltdl-dev libudev1  # hwloc
  googletest libgtest-dev libgmock-dev                         # GoogleTest (static + CMake)
  pkgconf pkgconf-bin libpkgconf3                              # pkg-config itself
)
rm -rf .gpu-deps
mkdir -p .gpu-deps
(cd .gpu-deps && apt-get download "${packages[@]}")
du -sh .gpu-deps
ls .gpu-deps
