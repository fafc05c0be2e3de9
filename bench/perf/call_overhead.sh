#!/bin/sh
# Instructions per call on the host path (API entry, validation, tuner, job setup,
# executor, the algorithm's own work) for 8-byte calls on one rank, counted by
# callgrind: unlike a timing, the count does not move with the machine's load, so it
# tracks the per-call overhead from commit to commit. Two runs of 10 and 10 + N
# iterations (weft-perf makes two calls per iteration: out of place, then in place);
# the difference divided by 2N calls removes init and teardown.
#   bench/perf/call_overhead.sh BUILD_DIR [N] [COLLECTIVE[:ALGORITHM] ...]
# Needs valgrind. Default: every collective the blocking fast path serves, by oneshot
# (allreduce reducescatter allgather broadcast reduce alltoall), allreduce:ring (the
# general path) and sendrecv (a group of one send and one receive, to this rank itself:
# the point-to-point path), N = 20000. WEFT_FAST_PATH=0 in the environment counts the
# general path for the oneshot ones too.
set -eu
build=${1:?usage: call_overhead.sh BUILD_DIR [N] [COLLECTIVE:ALGORITHM ...]}
calls=${2:-20000}
[ $# -ge 2 ] && shift 2 || shift $#
[ $# -eq 0 ] && set -- allreduce:oneshot reducescatter:oneshot allgather:oneshot \
  broadcast:oneshot reduce:oneshot alltoall:oneshot allreduce:ring sendrecv
command -v valgrind >/dev/null || { echo "call_overhead.sh: valgrind is not installed" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
instructions() {  # collective algorithm calls (algorithm: empty for none)
  env ${2:+"WEFT_ALGO=$1:$2"} "$build/tools/weftrun/weftrun" -n 1 --no-prefix \
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.$3" \
    "$build/bench/perf/weft-perf" "$1" -b 8 -e 8 -n "$3" -w 10 -c 0 2>&1 >/dev/null |
    sed -n 's/.*Collected : *\([0-9]*\).*/\1/p'
}
for pair in "$@"; do
  coll=${pair%%:*} algo=${pair#"$coll"}
  algo=${algo#:}
  base=$(instructions "$coll" "$algo" 10)
  total=$(instructions "$coll" "$algo" $((10 + calls)))
  [ -n "$base" ] && [ -n "$total" ] || { echo "call_overhead.sh: $pair did not run" >&2; exit 1; }
  echo "$coll${algo:+ $algo}: $(( (total - base) / (2 * calls) )) instructions per call"
done
