# usage: av.sh rounds : AllToAllv (equal counts) through weft-peer-weft, build before (/tmp/base) and after (/work/main), and Open MPI; lines: state size build us
cd /work/main
for i in $(seq 1 $1); do st=$(build/tools/weftrun/weftrun -n 2 build/bench/perf/weft-perf allreduce -b 8 -e 8 -n 1000 -w 100 2>&1 | awk '/^\[0\] +8 /{print $7}' | head -1)
for s in 1M 4M 16M 64M; do case $s in 64M) n=20;; 16M) n=30;; *) n=60;; esac
for b in /tmp/base /work/main; do w=$($b/build/tools/weftrun/weftrun -n 2 $b/build/bench/peers/weft-peer-weft alltoallv -b $s -e $s -n $n -w 10 2>&1 | awk '$1=="[0]" && $2 ~ /^[0-9]+$/ && NF>=12 {print $7}' | head -1); echo "$st $s $([ $b = /tmp/base ] && echo before || echo after) $w"; done
m=$(mpirun --oversubscribe --allow-run-as-root -np 2 build/bench/peers/weft-peer-mpi alltoallv -b $s -e $s -n $n -w 10 2>&1 | awk '$1 ~ /^[0-9]+$/ && NF>10 {print $6}' | head -1); echo "$st $s mpi $m"; done; done
