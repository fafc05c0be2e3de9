#!/bin/bash
# The build before (base: a worktree of 064f016 built in /tmp/base), this build (new) and
# Open MPI (mpi), one after the other in every repeat; prints each variant's median µs per
# size, out of place / in place. Run from the repository root.
#   OUT=DIR VARIANTS="base new mpi" ab.sh REPEATS RANKS COLLECTIVE MIN MAX FACTOR ITERS
# Variant cma: this build with WEFT_SHM_CMA_BYTES=${CMA:-64K}.
# STATE=1: each repeat starts with this build's 2-rank 8-byte AllReduce (1000 calls), and the
# medians are given per host state (fast: under 0.45 us; docs/performance.md, "The host has
# two states").
set -e
R=build/tools/weftrun/weftrun
reps=$1 n=$2 coll=$3 b=$4 e=$5 f=$6 it=$7
out=${OUT:-/tmp}/ab-$n-$coll.txt
: >"$out"
for rep in $(seq "$reps"); do
  state=all
  if [ -n "$STATE" ]; then
    us=$($R -n 2 --no-prefix build/bench/perf/weft-perf allreduce -b 8 -e 8 -n 1000 -w 50 -c 0 |
      awk '/^ *[0-9]/{print $6}')
    state=$(awk -v us="$us" 'BEGIN{print (us < 0.45 ? "fast" : "slow")}')
    echo "repeat $rep: 8-byte AllReduce $us us, $state" >&2
  fi
  for v in ${VARIANTS:-base new mpi}; do
    case $v in
      base) cmd="$R -n $n --no-prefix /tmp/base/build/bench/perf/weft-perf" ;;
      new) cmd="$R -n $n --no-prefix build/bench/perf/weft-perf" ;;
      cma) cmd="env WEFT_SHM_CMA_BYTES=${CMA:-64K} $R -n $n --no-prefix build/bench/perf/weft-perf" ;;
      mpi) cmd="mpirun --oversubscribe --allow-run-as-root -np $n build/bench/peers/weft-peer-mpi" ;;
    esac
    $cmd "$coll" -b "$b" -e "$e" -f "$f" -n "$it" -w 3 -c 0 2>&1 |
      awk -v v="$v" -v s="$state" '/^ *[0-9]/{print v, $1, $6, $10, s}' >>"$out"
  done
done
python3 - "$out" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    variant, size, oop, ip, *state = line.split()
    runs[(state[0] if state else "all", int(size), variant)].append((float(oop), float(ip)))
variants = [v for v in ("base", "new", "cma", "mpi") if any(k[2] == v for k in runs)]
for state in sorted({k[0] for k in runs}):
    repeats = len(runs[next(k for k in runs if k[0] == state)])
    print(f"{state} ({repeats} repeats):" if state != "all" else "", " ".join(variants))
    for size in sorted({k[1] for k in runs if k[0] == state}):
        cells = []
        for v in variants:
            oop = statistics.median(r[0] for r in runs[(state, size, v)])
            ip = statistics.median(r[1] for r in runs[(state, size, v)])
            cells.append(f"{oop:.1f}/{ip:.1f}")
        print(size, " ".join(cells))
PY
