#!/usr/bin/env bash
# One host of the multi-node tests; runs as pid 1 of the host's own PID, IPC
# and UTS namespaces (inside its network namespace). Names the host, starts
# its ranks and records each rank's exit status in WORK/rankR.rc.
#   run_host.sh HOSTNAME WORK "R1 R2 ..." PROG ARGS...
host=$1 work=$2 ranks=$3
shift 3
hostname "$host" || exit 1
for r in $ranks; do
  (
    WEFT_RANK=$r "$@" >"$work/rank$r.out" 2>&1
    echo $? >"$work/rank$r.rc.tmp" && mv "$work/rank$r.rc.tmp" "$work/rank$r.rc"
  ) &
done
wait
