#!/bin/sh
# Compares weft-perf's measured times with the tuner's predicted ones (the
# "#  ^ algorithm ..." line after each row) for several collectives and
# prints, per row, size, algorithm, measured and predicted time and their
# ratio, then the ratio range over rows of at least MIN_BYTES.
#   bench/perf/predicted_vs_measured.sh BUILD_DIR [NRANKS] [MIN_BYTES]
set -eu
build=${1:?usage: predicted_vs_measured.sh BUILD_DIR [NRANKS] [MIN_BYTES]}
nranks=${2:-2}
min_bytes=${3:-32768}
for coll in allreduce allgather reducescatter broadcast alltoall; do
  "$build/tools/weftrun/weftrun" -n "$nranks" "$build/bench/perf/weft-perf" "$coll" \
    -b 8 -e 16M -f 8 -n 20 -w 5 2>&1 | sed -n 's/^\[0\] //p' |
    awk -v coll="$coll" '
      /^ *[0-9]/ { bytes = $1; measured = $6 }
      /^#  \^ algorithm/ {
        algo = $4; sub(",", "", algo); predicted = $6
        if (predicted < 0.01) next  # empty calls (count 0)
        printf "%-13s %10d %-9s measured %9.2f us predicted %9.2f us ratio %5.2f\n",
               coll, bytes, algo, measured, predicted, measured / predicted
      }'
done | tee /dev/stderr | awk -v min="$min_bytes" '
  $2 >= min { r = $NF; if (lo == "" || r < lo) lo = r; if (hi == "" || r > hi) hi = r }
  END { printf "measured/predicted from %d B: %.2f to %.2f\n", min, lo, hi }'
