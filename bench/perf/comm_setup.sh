#!/usr/bin/env bash
# Communicator creation cost at 2, 4 and 8 ranks: weft-comm-setup's split +
# first AllReduce times and /dev/shm bytes, plus the mean of each setup phase
# over every rank and communicator (from the INIT log).
#   bench/perf/comm_setup.sh [build-dir] [splits]
set -euo pipefail
build=${1:-build}
splits=${2:-50}
echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for n in 2 4 8; do
  echo "## $n ranks"
  WEFT_DEBUG=INFO WEFT_DEBUG_SUBSYS=INIT "$build/tools/weftrun/weftrun" -n "$n" \
    "$build/bench/perf/weft-comm-setup" -s "$splits" 2>&1 |
    awk '/^\[0\] (#|setup_ms|cpu_ms|dev_shm)/ { sub(/^\[0\] /, ""); print }
         /communicator \/.*setup phases/ {
           for (i = 1; i <= NF; ++i) {
             if ($i == "transport") t += $(i + 1)
             if ($i == "bootstrap") b += $(i + 1)
             if ($i == "memory") s += $(i + 1)
           }
           ++c }
         /split exchange/ { for (i = 1; i <= NF; ++i) if ($i == "exchange") x += $(i + 1); ++xc }
         END { if (c) printf "phases_ms (mean per rank and communicator): split exchange %.2f, " \
                 "transport %.2f, bootstrap %.2f, shared memory %.2f\n", x / xc, t / c, b / c, s / c }'
done
echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg)"
