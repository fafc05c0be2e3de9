#!/usr/bin/env bash
# Every binary must load on a machine without a CUDA driver: none may need
# libcuda (found at run time) or the shared CUDA runtime (linked statically).
set -euo pipefail
status=0
for binary in "$@"; do
  needed=$(readelf -d "$binary" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  [[ -n $needed ]] || { echo "no NEEDED entries read from $binary" >&2; exit 1; }
  if bad=$(grep -E '^lib(cuda|cudart)\.so' <<<"$needed"); then
    echo "$binary needs $bad" >&2
    status=1
  fi
done
exit $status
