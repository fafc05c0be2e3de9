#!/bin/bash
# usage: ab.sh rounds env coll... : base vs new, one run per size; lines: coll state build size oop ip
rounds=$1; envs=$2; shift 2
for r in $(seq 1 $rounds); do
 for coll in "$@"; do
  for b in base new; do
   [ $b = base ] && D=/tmp/base || D=/work/main
   st=$(/work/main/build/tools/weftrun/weftrun -n 2 /work/main/build/bench/perf/weft-perf allreduce -b 8 -e 8 -n 1000 -w 100 2>&1 | awk '/^\[0\] +8 /{print $7}' | head -1)
   for s in ${SIZES:-1M 4M 16M 64M}; do
    case $s in 64M) n=20; w=12;; 16M) n=30; w=15;; *) n=60; w=20;; esac
    env $envs $D/build/tools/weftrun/weftrun -n ${NR:-2} $D/build/bench/perf/weft-perf $coll -b $s -e $s -n $n -w $w 2>&1 | awk -v c=$coll -v s=$st -v g=$b '/^\[0\] +[0-9]+ /{print c, s, g, $2, $7, $11}'
   done
  done
 done
done
