#!/usr/bin/env bash
# Installs what Weft needs to build, test and benchmark on Debian 12 (bookworm).
# Idempotent: asks apt only when a package is missing, so a ready machine returns at once.
# Run as root, or as a user who may use sudo.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

packages=(
  build-essential cmake ninja-build pkg-config git      # toolchain
  libucx-dev ucx-utils libhwloc-dev hwloc               # transport and topology
  libopenmpi-dev openmpi-bin libgloo-dev                # peers for tests and benchmarks
  libgtest-dev libgmock-dev googletest libbenchmark-dev # test and benchmark frameworks
  clang-format python3 iproute2                         # formatting, scripts, netns tests
  clang libclang-rt-dev                                 # the fuzzers (clang's libFuzzer)
  ccache                                                # compiler cache for repeated test runs
  python3-venv python3-dev                              # the PyTorch backend's venv and build
)

if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
  echo "install-deps: needs dpkg and apt (Debian 12); install the packages by hand:" >&2
  echo "  ${packages[*]}" >&2
  exit 1
fi

# dpkg-query names each known package with its state; unknown ones are simply absent.
declare -A installed=()
while read -r name state; do
  [[ $state == installed ]] && installed[$name]=1
done < <(dpkg-query -W -f='${Package} ${db:Status-Status}\n' "${packages[@]}" 2>/dev/null || true)

missing=()
for package in "${packages[@]}"; do
  [[ -n ${installed[$package]:-} ]] || missing+=("$package")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

as_root=()
if ((EUID != 0)); then
  if ! command -v sudo >/dev/null; then
    echo "install-deps: missing ${missing[*]}; run as root (sudo is not available)" >&2
    exit 1
  fi
  as_root=(sudo --preserve-env=DEBIAN_FRONTEND)
fi

echo "install-deps: installing ${missing[*]}"
"${as_root[@]}" apt-get update
"${as_root[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
echo "install-deps: done"
