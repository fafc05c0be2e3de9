#!/bin/sh
# A program linked against the real libnccl.so.2, run with ours LD_PRELOADed
# (how PyTorch must load it): every call binds to Weft. The program checks
# where ncclAllReduce comes from and its own results; Weft's log (asked for
# through NCCL_DEBUG, which the shim maps) shows Weft did the work.
set -u
weftrun=$1 program=$2 ours=$3 real=$4
log=$(mktemp)
trap 'rm -f "$log"' EXIT
fail=0
say() { echo "preload_test: $*"; fail=1; }
ldd "$program" | grep -q "libnccl.so.2 => $real" || say "$program is not linked against $real"
# An ASan build's program would refuse a preloaded library ahead of its runtime.
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0
LD_PRELOAD=$ours NCCL_SHIM_EXPECT=$ours NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,NET \
  NCCL_ALGO=ring NCCL_SOCKET_IFNAME=lo "$weftrun" -n 2 --timeout 120 "$program" >"$log" 2>&1 ||
  say "the program failed"
grep -q "weft INFO INIT" "$log" || say "no Weft INIT log lines"
grep -q "NCCL_ALGO=ring -> WEFT_ALGO=allreduce:ring,reducescatter:ring,allgather:ring" "$log" ||
  say "NCCL_ALGO was not mapped"
grep -q "NCCL_DEBUG_SUBSYS=INIT,ENV,NET -> WEFT_DEBUG_SUBSYS=INIT,ENV,TRANSPORT" "$log" ||
  say "NCCL_DEBUG_SUBSYS was not mapped"
grep -q "NCCL_SOCKET_IFNAME=lo -> WEFT_SOCKET_IFNAME=lo" "$log" || say "NCCL_SOCKET_IFNAME was not mapped"
! grep -q "NCCL INFO" "$log" || say "the real NCCL logged: it ran"
[ "$(grep -c 'nccl abi test passed' "$log")" -eq 2 ] || say "not every rank passed"
# The per-collective form, and a user's WEFT_ variable winning over NCCL's.
LD_PRELOAD=$ours NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ENV WEFT_SOCKET_IFNAME=lo NCCL_SOCKET_IFNAME=nope \
  NCCL_ALGO="allreduce:tree,ring;allgather:bruck" "$weftrun" -n 1 --timeout 60 "$program" \
  >>"$log" 2>&1 || say "the program failed with the per-collective NCCL_ALGO"
grep -q "NCCL_ALGO=allreduce:tree,ring;allgather:bruck -> WEFT_ALGO=allreduce:tree,allgather:bruck" \
  "$log" || say "per-collective NCCL_ALGO was not mapped"
! grep -q "WEFT_SOCKET_IFNAME=nope" "$log" || say "NCCL_SOCKET_IFNAME overrode WEFT_SOCKET_IFNAME"
[ $fail -eq 0 ] || { tail -40 "$log"; exit 1; }
echo "preload_test: both ranks bound to Weft through LD_PRELOAD over $real"
