#!/bin/bash
# usage: interleave.sh ROUNDS COLLECTIVE RANKS (from /work/main, the build before in /tmp/base):
# per round, the build before, this build, Open MPI: 8-byte weft-perf time (us) / context
# switches on the whole machine during the run (perf stat -a), 200000 calls each
cd /work/main; coll=${2:-broadcast}; n=${3:-4}
for i in $(seq 1 $1); do line=""
 for B in /tmp/base/build build; do
  w=$(perf stat -a -x, -e context-switches -- $B/tools/weftrun/weftrun -n $n $B/bench/perf/weft-perf $coll -b 8 -e 8 -n 200000 -w 1000 -c 0 2>&1 | awk -F, '/^\[0\] +8 /{split($0,a," "); t=a[7]} /context-switches/{c=$1} END{print t"/"int(c/1000)"k"}')
  line="$line $w"; done
 m=$(perf stat -a -x, -e context-switches -- mpirun --oversubscribe --allow-run-as-root -np $n build/bench/peers/weft-peer-mpi $coll -b 8 -e 8 -n 200000 -w 1000 -c 0 2>&1 | awk -F, '/^ +8 /{split($0,a," "); t=a[6]} /context-switches/{c=$1} END{print t"/"int(c/1000)"k"}')
 echo "$line $m"; done
