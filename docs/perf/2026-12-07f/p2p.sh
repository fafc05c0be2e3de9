#!/usr/bin/env bash
# Point-to-point on one node, interleaved: weft-perf sendrecv (each rank exchanges with its
# neighbours) from each named build, then Open MPI's MPI_Sendrecv, ROUNDS rounds.
#   p2p.sh ROUNDS RANKS NAME=BUILD_DIR...
# P2P_ARGS replaces the programs' arguments and P2P_COLUMN the column printed (7, busbw;
# 6, microseconds per exchange), e.g. for small exchanges:
#   P2P_ARGS="sendrecv -b 8 -e 512 -f 8 -n 20000 -w 100 -c 0" P2P_COLUMN=6 p2p.sh 5 2 ...
rounds=$1 ranks=$2
shift 2
read -r -a args <<<"${P2P_ARGS:-sendrecv -b 8K -e 32M -f 4 -n 40 -w 5 -c 0}"
column=${P2P_COLUMN:-7}
row() { grep -E '^(\[0\])?\s+[0-9]' | sed 's/^\[0\]//' | awk -v c="$column" '{printf "%s:%s ", $1, $c}'; }
bind=core
((ranks > $(nproc))) && bind=none
echo "# $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg) ranks $ranks: size:column $column (${args[*]})"
for ((r = 1; r <= rounds; r++)); do
  for named in "$@"; do
    name=${named%%=*} build=${named#*=}
    echo "$name $r $("$build/tools/weftrun/weftrun" -n "$ranks" "$build/bench/perf/weft-perf" "${args[@]}" 2>&1 | row)"
  done
  mpi_build=${1#*=}
  echo "mpi $r $(mpirun --allow-run-as-root --oversubscribe -n "$ranks" --bind-to $bind \
    "$mpi_build/bench/peers/weft-peer-mpi" "${args[@]}" 2>&1 | row)"
done
