#!/bin/sh
# What mismatch detection (WEFT_CHECK=on) costs an 8-byte oneshot AllReduce, in
# instructions counted by callgrind (load-insensitive), on 2 ranks of one node (one rank
# has no peer to compare with, so bench/perf/call_overhead.sh cannot see it). Rank 0's
# counts; N iterations of weft-perf (two calls each). Prints, per call:
#   - announce: the announcement made at launch, and the call's tag for the direct path's
#     ready words;
#   - check at completion: the comparison with the peer's announcement when the call ends
#     (DirectState::agrees), skipped when the peers' ready words carried the same tag, and
#     how many calls made it (these two, and a compare per poll of the ready words, are the
#     cost on the call's path);
#   - checks while waiting: the comparisons made while the rank waits for its peer (they
#     run instead of spinning, so they add no latency beyond one check when the peer comes);
#   - the whole call with WEFT_CHECK=on and =off (includes waiting, so it moves with the
#     ranks' timing: compare the first two lines with the 1-rank figure of call_overhead.sh).
#   bench/perf/check_overhead.sh BUILD_DIR [N]      (default N = 1000; needs valgrind)
set -eu
build=${1:?usage: check_overhead.sh BUILD_DIR [N]}
iterations=${2:-1000}
command -v valgrind >/dev/null || { echo "check_overhead.sh: valgrind is not installed" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
profile() {  # mode
  WEFT_CHECK=$1 WEFT_ALGO=allreduce:oneshot "$build/tools/weftrun/weftrun" -n 2 --no-prefix \
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.$1.%q{WEFT_RANK}" \
    "$build/bench/perf/weft-perf" allreduce -b 8 -e 8 -n "$iterations" -w 10 -c 0 >/dev/null 2>&1
  callgrind_annotate --inclusive=yes --tree=caller --threshold=100 "$out/cg.$1.0" 2>/dev/null >"$out/tree.$1"
}
# Sums the cost and the calls of `callee` from callers matching `caller` (a regex).
from_callers() {  # tree callee caller
  awk -v callee="$2" -v caller="$3" '
    /^ *[0-9,]+ .*< / { callers[n++] = $0; next }
    /^ *[0-9,]+ .*\* / {
      if (index($0, callee) > 0)
        for (i = 0; i < n; i++)
          if (callers[i] ~ caller) {
            line = callers[i]; cost = line; sub(/^ */, "", cost); sub(/ .*/, "", cost)
            gsub(/,/, "", cost); calls = line; sub(/.*\(/, "", calls); sub(/x\).*/, "", calls)
            gsub(/,/, "", calls); total += cost; count += calls
          }
      n = 0; next
    }
    { n = 0 }
    END { printf "%d %d\n", total, count }' "$1"
}
per_call() {  # cost calls
  [ "$2" -gt 0 ] && echo $(($1 / $2)) || echo 0
}
profile on
profile off
set -- $(from_callers "$out/tree.on" "weft_api.cc:weftAllReduce" "weft-perf|perf")
calls=$2 whole_on=$(per_call "$1" "$2")
set -- $(from_callers "$out/tree.off" "weft_api.cc:weftAllReduce" "weft-perf|perf")
whole_off=$(per_call "$1" "$2")
set -- $(from_callers "$out/tree.on" "DirectState::announce(" ".")
announce=$(( $1 / calls ))
# agrees() is reached through maybe_mismatched, inlined or not: either is counted once.
set -- $(from_callers "$out/tree.on" "DirectState::agrees(" "finish_job")
at_end=$1 checked=$2
set -- $(from_callers "$out/tree.on" "maybe_mismatched(" "finish_job")
at_end=$(( (at_end + $1) / calls )) checked=$((checked + $2))
set -- $(from_callers "$out/tree.on" "DirectState::agrees(" "check_mismatch|run_direct_job|check_mismatches")
echo "allreduce 8 bytes oneshot, 2 ranks, $calls calls on rank 0 (instructions per call):"
echo "  announce:                 $announce"
echo "  check at completion:      $at_end ($checked of $calls calls checked)"
echo "  checks while waiting:     $(( $1 / calls )) ($2 checks)"
echo "  whole call, WEFT_CHECK=on:  $whole_on"
echo "  whole call, WEFT_CHECK=off: $whole_off"
