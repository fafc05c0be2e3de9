cd /work/main; R=build/tools/weftrun/weftrun; P=build/bench/perf/weft-perf
st=$($R -n 2 $P allreduce -b 8 -e 8 -n 1000 -w 100 2>&1 | awk '/^\[0\] +8 /{print $7}' | head -1); echo state $st
for c in allgather alltoall; do for s in 4M 8M 16M 32M 64M; do
 case $s in 64M) n=40;; 32M) n=60;; *) n=120;; esac
 XALT=${XA:-1} WEFT_SHM_CMA_BYTES=1M WEFT_DEBUG=TRACE WEFT_DEBUG_SUBSYS=COLL $R -n 2 $P $c -b $s -e $s -n $n -w 4 2>&1 | grep -E "blocks read with" > /tmp/nt/alt.txt
 python3 - $c $s <<'PY'
import sys,collections,statistics,re
d=collections.defaultdict(list)
for l in open('/tmp/nt/alt.txt'):
  m=re.search(r'rank (\d).* with (\w+) stores took ([\d.]+) us',l)
  if m: d[m.group(2)].append(float(m.group(3)))
o=d['ordinary'][4:]; s=d['streaming'][4:]
print(sys.argv[1],sys.argv[2],f"ord n{len(o)} med {statistics.median(o):.0f} p25 {statistics.quantiles(o)[0]:.0f} | str n{len(s)} med {statistics.median(s):.0f} p25 {statistics.quantiles(s)[0]:.0f} | ord/str {statistics.median(o)/statistics.median(s):.2f}")
PY
done; done
