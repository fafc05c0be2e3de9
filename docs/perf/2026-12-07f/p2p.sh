#!/usr/bin/env bash
# Point-to-point on one node, interleaved: weft-perf sendrecv (each rank exchanges with its
# neighbours) from each named build, then Open MPI's MPI_Sendrecv, ROUNDS rounds.
#   p2p.sh ROUNDS RANKS NAME=BUILD_DIR...
rounds=$1 ranks=$2
shift 2
args=(sendrecv -b 8K -e 32M -f 4 -n 40 -w 5 -c 0)
row() { grep -E '^(\[0\])?\s+[0-9]' | sed 's/^\[0\]//' | awk '{printf "%s:%s ", $1, $7}'; }
bind=core
((ranks > $(nproc))) && bind=none
echo "# $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg) ranks $ranks: size:busbw GB/s"
for ((r = 1; r <= rounds; r++)); do
  for named in "$@"; do
    name=${named%%=*} build=${named#*=}
    echo "$name $r $("$build/tools/weftrun/weftrun" -n "$ranks" "$build/bench/perf/weft-perf" "${args[@]}" 2>&1 | row)"
  done
  mpi_build=${1#*=}
  echo "mpi $r $(mpirun --allow-run-as-root --oversubscribe -n "$ranks" --bind-to $bind \
    "$mpi_build/bench/peers/weft-peer-mpi" "${args[@]}" 2>&1 | row)"
done
