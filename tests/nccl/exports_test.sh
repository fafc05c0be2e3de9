#!/bin/sh
# Our libnccl.so.2 against the real one: every ncclX the real library exports
# weak is exported weak by ours, with a strong pncclX at the same address; the
# soname is libnccl.so.2, there are no symbol versions and no CUDA dependency.
set -u
ours=$1 real=$2
fail=0
say() { echo "exports_test: $*"; fail=1; }
table=$(nm -D --defined-only "$ours") || { echo "exports_test: cannot read $ours"; exit 1; }
names=$(nm -D --defined-only "$real" | awk '$2 == "W" && $3 ~ /^nccl/ {print $3}')
[ "$(echo "$names" | wc -l)" -ge 52 ] || say "the real library lists only $(echo "$names" | wc -l) weak names"
for name in $names; do
  weak=$(echo "$table" | awk -v n="$name" '$3 == n {print $1, $2}')
  strong=$(echo "$table" | awk -v n="p$name" '$3 == n {print $1, $2}')
  [ "${weak#* }" = "W" ] || { say "$name: not a weak export ('$weak')"; continue; }
  [ "${strong#* }" = "T" ] || { say "p$name: not a strong export ('$strong')"; continue; }
  [ "${weak% *}" = "${strong% *}" ] || say "$name and p$name are at different addresses"
done
extra=$(echo "$table" | awk '{print $3}' | grep -v '^p\{0,1\}nccl' || true)
[ -z "$extra" ] || say "exports names that are not NCCL's: $extra"
readelf -d "$ours" | grep -q 'SONAME.*\[libnccl\.so\.2\]' || say "soname is not libnccl.so.2"
! readelf -V "$ours" | grep -q "Version definition" || say "defines symbol versions"
! readelf -d "$ours" | grep -q 'NEEDED.*libcud' || say "links CUDA"
[ $fail -eq 0 ] && echo "exports_test: $(echo "$names" | wc -l) names weak with strong aliases, as in $real"
exit $fail
