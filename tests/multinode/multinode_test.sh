#!/usr/bin/env bash
# Multi-node tests on one machine. Three "hosts" are network namespaces, each
# with a veth "weft0" (10.213.0.x/24) plugged into a bridge that lives in a
# fourth namespace, so nothing is added to the machine's own network. Each
# host's ranks also share UTS, IPC and PID namespaces of their own: the host
# name makes Weft's host identity (hostname + boot id) differ per host, and
# separate IPC/PID namespaces make UCX treat the hosts as separate machines.
#
#   multinode_test.sh collectives PROG WORKDIR  every collective, exact, across hosts
#   multinode_test.sh twolevel PROG WORKDIR     the hier and leader schedules forced, exact
#   multinode_test.sh mismatch PROG WORKDIR     calls that differ across hosts: every rank fails
#                                                naming both calls
#   multinode_test.sh kill PROG WORKDIR         host c's ranks are killed mid-AllReduce
#   multinode_test.sh linkdown PROG WORKDIR     host c's link goes down mid-AllReduce
#   multinode_test.sh cut PROG WORKDIR VICTIM PHASE
#                                                the fault matrix's network cut: the link of
#                                                host a (VICTIM root: it hosts rank 0 and the
#                                                bootstrap root) or host c (VICTIM nonroot) goes
#                                                down while every rank loops on PHASE (split;
#                                                blocking: AllReduce; stream: AllReduce on a
#                                                stream; group: Send/Recv between every pair),
#                                                or (init) before the ranks start
#   multinode_test.sh heal PROG WORKDIR VICTIM PHASE
#                                                the same cut, but the link comes back after
#                                                1 s (a third of the timeout): no rank may
#                                                fail, every result stays exact
#
# In the fault tests every surviving rank must report an error and exit
# within the timeout (WEFT_TIMEOUT_MS=3000) plus a margin, never hang. In
# cut, the ranks on the other hosts must name a rank of the cut host, and the
# cut host's ranks (alive, cut off) must fail within the same bound; each
# rank's time to error is printed as "fault-matrix: VICTIM_cut_PHASE rank=R
# seconds=S" (scripts/fault-matrix.py collects these lines).
# Exit 77 (ctest skip) where network namespaces cannot be created.
set -uo pipefail

mode=${1:-} prog=${2:-} work=${3:-} victim=${4:-} phase=${5:-blocking}
margin_ms=5000
case $mode in
  collectives | twolevel | mismatch | kill | linkdown) ;;
  cut | heal)
    case $victim in
      root) victim_host=a ;;
      nonroot) victim_host=c ;;
      *) echo "$0: $mode needs VICTIM root or nonroot, got '$victim'" >&2; exit 2 ;;
    esac
    case $phase in
      init | split) phase_name=$phase ;;
      blocking) phase_name=blocking_allreduce ;;
      stream) phase_name=stream_allreduce ;;
      group) phase_name=group_sendrecv ;;
      *) echo "$0: $mode needs PHASE init, split, blocking, stream or group, got '$phase'" >&2; exit 2 ;;
    esac
    [[ $mode == heal && $phase == init ]] && { echo "$0: heal has no init phase" >&2; exit 2; }
    margin_ms=2000 ;;  # the fault matrix's bound: the timeout plus 2 s
  *) echo "usage: $0 collectives|twolevel|mismatch|kill|linkdown PROG WORKDIR | cut|heal PROG WORKDIR root|nonroot init|split|blocking|stream|group" >&2; exit 2 ;;
esac
# TCP retransmits with exponential backoff, so what was sent at the start of an outage of d
# seconds arrives up to about 2d + 0.2 s later (more under load): a heal needs a timeout above that, with room
# for a loaded machine (a 1 s cut under a 3 s timeout failed 1 CI run in about 8).
readonly skip=77 outage_s=1
if [[ $mode == heal ]]; then readonly timeout_ms=5000; else readonly timeout_ms=3000; fi
hosts=(a b c)
rank_host=(a b c a c)  # 5 ranks, uneven (2 + 1 + 2) and interleaved
nranks=${#rank_host[@]}
prefix=weftmn-$$
switch=$prefix-sw

label=$mode
[[ $mode == cut || $mode == heal ]] && label="$mode ${victim}_${mode}_$phase_name"
say() { echo "multinode_test[$label]: $*"; }
fail() { say "FAIL: $*"; exit 1; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# Ends the processes left in a namespace (by id) and removes it.
remove_ns() {
  local ns=$1 pid
  for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
  ip netns del "$ns" 2>/dev/null
}
cleanup() {
  local h
  for h in "${hosts[@]}"; do remove_ns "$prefix-$h"; done
  remove_ns "$switch"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# Namespaces of earlier runs whose script was killed (ctest timeout, SIGKILL).
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^weftmn-[0-9]*-'); do
  owner=${ns#weftmn-}
  owner=${owner%%-*}
  kill -0 "$owner" 2>/dev/null || remove_ns "$ns"
done

[[ $(id -u) == 0 ]] || { say "SKIP: network namespaces need root"; exit $skip; }
command -v ip >/dev/null && command -v unshare >/dev/null ||
  { say "SKIP: ip (iproute2) or unshare is missing"; exit $skip; }
ip netns add "$switch" 2>/dev/null || { say "SKIP: cannot create network namespaces here"; exit $skip; }
unshare --uts --ipc --pid --fork --mount-proc true 2>/dev/null ||
  { say "SKIP: cannot create UTS, IPC and PID namespaces here"; exit $skip; }

# The switch: a bridge, one port per host.
ip -n "$switch" link add br0 type bridge || fail "cannot create the bridge"
ip -n "$switch" link set br0 up
for i in "${!hosts[@]}"; do
  h=${hosts[$i]} ns=$prefix-${hosts[$i]}
  ip netns add "$ns" || fail "cannot create namespace $ns"
  ip -n "$switch" link add "port-$h" type veth peer name weft0 netns "$ns" || fail "veth for $h"
  ip -n "$switch" link set "port-$h" master br0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "10.213.0.$((i + 1))/24" dev weft0
  ip -n "$ns" link set weft0 up
done

rm -rf "$work" && mkdir -p "$work" || fail "cannot create $work"
secret=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export WEFT_NRANKS=$nranks WEFT_ROOT=10.213.0.1:29517 WEFT_SECRET=$secret
export WEFT_SOCKET_IFNAME==weft0 WEFT_TIMEOUT_MS=$timeout_ms
# A bound on each host, so that a hang fails the test instead of ctest's timeout.
rank_limit=45

case $mode in
  collectives) args=(check ${#hosts[@]}) ;;
  twolevel) args=(twolevel ${#hosts[@]}) ;;
  mismatch) args=(mismatch ${#hosts[@]}) ;;
  heal) args=(fault ${#hosts[@]} "$work/ready" "$phase" "$work/healed") ;;
  *) args=(fault ${#hosts[@]} "$work/ready" "$phase") ;;
esac
# UCX's debug log names every endpoint's transports (checked below).
[[ $mode == collectives ]] && export UCX_LOG_LEVEL=debug
here=$(cd "$(dirname "$0")" && pwd)
cut_ranks=()
cut_link() {
  ip -n "$switch" link set "port-$victim_host" down
  say "took host $victim_host's link down ($victim victim, $phase_name)"
  for r in "${!rank_host[@]}"; do [[ ${rank_host[$r]} == "$victim_host" ]] && cut_ranks+=("$r"); done
}
# For init the cut comes before any rank starts; time to error counts from the start.
[[ $mode == cut && $phase == init ]] && { cut_link; t0=$(now_ms); }
for h in "${hosts[@]}"; do
  ranks=""
  for r in "${!rank_host[@]}"; do [[ ${rank_host[$r]} == "$h" ]] && ranks+="$r "; done
  # Own PID and IPC namespaces per host: UCX then sees the other hosts' shared
  # memory and CMA as unreachable (as on real separate machines) and picks TCP.
  timeout -k 2 $rank_limit ip netns exec "$prefix-$h" \
    unshare --uts --ipc --pid --fork --kill-child --mount-proc \
    bash "$here/run_host.sh" "host-$h" "$work" "$ranks" "$prog" "${args[@]}" &
  disown  # completion is read from the ranks' status files
done

# Waits until each listed rank has an exit status or the deadline passes;
# sets code[r] (or "none") and took[r] (ms since $t0).
declare -A code took
await_ranks() {
  local deadline=$1 r pending
  shift
  while true; do
    pending=0
    for r in "$@"; do
      [[ -n ${code[$r]:-} ]] && continue
      if [[ -e $work/rank$r.rc ]]; then
        code[$r]=$(<"$work/rank$r.rc")
        took[$r]=$(($(now_ms) - t0))
      else
        pending=1
      fi
    done
    ((pending)) || return 0
    if (($(now_ms) > deadline)); then
      for r in "$@"; do [[ -n ${code[$r]:-} ]] || code[$r]=none; done
      return 1
    fi
    sleep 0.05
  done
}

show_output() {
  local r
  for r in "${!rank_host[@]}"; do
    grep -v ' UCX ' "$work/rank$r.out" | sed "s/^/[rank $r on host-${rank_host[$r]}] /"
  done
}

# Each rank must reach the ranks of other hosts over TCP (weft0) and those of
# its own host over shared memory, and never through UCX's cma (which aborts a
# rank whose peer exits mid-transfer), read from UCX's debug log
# ("ep 0x...: lane[i]:  k:tcp/weft0.0 ...").
verify_transports() {
  local r q pairs tcp shm want_tcp want_shm
  for r in "${all_ranks[@]}"; do
    want_tcp=0 want_shm=0
    for q in "${all_ranks[@]}"; do
      ((q == r)) && continue
      if [[ ${rank_host[$q]} == "${rank_host[$r]}" ]]; then ((++want_shm)); else ((++want_tcp)); fi
    done
    pairs=$(sed -nE 's/.*(ep 0x[0-9a-f]+): lane\[[0-9]+\]: +[0-9]+:([a-z0-9_]+)\/.*/\1 \2/p' \
      "$work/rank$r.out" | sort -u)
    [[ -n $pairs ]] || fail "rank $r: UCX logged no endpoint lanes; cannot tell its transports"
    ! awk '$3 == "cma"' <<<"$pairs" | grep -q . || fail "rank $r: UCX uses cma: $(grep -m1 ':cma/' "$work/rank$r.out")"
    tcp=$(awk '$3 == "tcp" {print $2}' <<<"$pairs" | sort -u)
    shm=$(awk '$3 ~ /^(sysv|posix|xpmem|knem|cma)$/ {print $2}' <<<"$pairs" | sort -u | grep -vxF "$tcp")
    say "rank $r on host-${rank_host[$r]}: $(wc -w <<<"$tcp") endpoints over TCP, $(wc -w <<<"$shm") over shared memory"
    (($(wc -w <<<"$tcp") == want_tcp)) || fail "rank $r: want $want_tcp TCP endpoints (one per rank on another host)"
    (($(wc -w <<<"$shm") == want_shm)) || fail "rank $r: want $want_shm shared-memory endpoints (one per rank on its host)"
  done
}

all_ranks=("${!rank_host[@]}")
if [[ $mode == collectives || $mode == twolevel || $mode == mismatch ]]; then
  t0=$(now_ms)
  await_ranks $((t0 + rank_limit * 1000)) "${all_ranks[@]}"
  show_output
  for r in "${all_ranks[@]}"; do
    [[ ${code[$r]} == 0 ]] || fail "rank $r exited ${code[$r]}"
    grep -q "rank $r: [0-9]* checks, 0 mismatches" "$work/rank$r.out" || fail "rank $r did not report its checks"
  done
  grep -q "rank 0: $nranks ranks on ${#hosts[@]} hosts" "$work/rank0.out" || fail "rank 0 did not see ${#hosts[@]} hosts"
  # The two-level run opens more communicators, and so more UCX endpoints.
  [[ $mode == mismatch ]] && { say "PASS: every mismatch named on every rank across ${#hosts[@]} hosts in $(($(now_ms) - t0)) ms"; exit 0; }
  [[ $mode == twolevel ]] || verify_transports
  say "PASS: every collective exact on $nranks ranks across ${#hosts[@]} hosts in $(($(now_ms) - t0)) ms"
  exit 0
fi

# Fault tests: wait until every rank is inside the AllReduce loop.
deadline=$(($(now_ms) + 30000))
for r in "${all_ranks[@]}"; do
  [[ $mode == cut && $phase == init ]] && break
  until [[ -e $work/ready.$r ]]; do
    (($(now_ms) < deadline)) || { show_output; fail "rank $r never reached the loop"; }
    [[ ! -e $work/rank$r.rc ]] || { show_output; fail "rank $r ended before the fault"; }
    sleep 0.05
  done
done

if [[ $mode == heal ]]; then
  t0=$(now_ms)
  cut_link
  sleep "$outage_s"  # the outage's length, not a wait for the ranks
  ip -n "$switch" link set "port-$victim_host" up
  say "brought host $victim_host's link back after $(($(now_ms) - t0)) ms"
  touch "$work/healed"
  await_ranks $((t0 + rank_limit * 1000)) "${all_ranks[@]}"
  failed=0
  for r in "${all_ranks[@]}"; do
    if [[ ${code[$r]} != 0 ]] || ! grep -q "^rank $r: [0-9]* iterations, none failed" "$work/rank$r.out"; then
      say "rank $r exited ${code[$r]}: $(grep -m1 "^rank $r: " "$work/rank$r.out")"
      failed=1
    fi
  done
  ((failed == 0)) || { show_output; fail "a rank failed although the cut healed within the timeout"; }
  say "PASS: every rank went on exactly through a ${outage_s} s cut of host $victim_host (timeout $timeout_ms ms)"
  exit 0
elif [[ $mode == cut ]]; then
  [[ $phase == init ]] || { t0=$(now_ms); cut_link; }
  survivors=("${all_ranks[@]}")  # the cut host's ranks are alive, cut off, and must fail too
elif [[ $mode == kill ]]; then
  t0=$(now_ms)
  for pid in $(ip netns pids "$prefix-c"); do kill -9 "$pid" 2>/dev/null; done
  say "killed host c"
  survivors=()
  for r in "${all_ranks[@]}"; do [[ ${rank_host[$r]} == c ]] || survivors+=("$r"); done
else
  t0=$(now_ms)
  ip -n "$switch" link set port-c down
  say "took host c's link down"
  survivors=("${all_ranks[@]}")  # host c's ranks are alive, cut off, and must fail too
fi

await_ranks $((t0 + timeout_ms + margin_ms)) "${survivors[@]}"
failed=0
for r in "${survivors[@]}"; do
  message=$(grep -m1 -E "^rank $r: .* failed( at iteration [0-9]+)?: " "$work/rank$r.out")
  on_cut_host=0
  for q in "${cut_ranks[@]}"; do ((q == r)) && on_cut_host=1; done
  if [[ ${code[$r]} == none ]]; then
    say "rank $r had not ended $((timeout_ms + margin_ms)) ms after the fault"
    failed=1
  elif [[ ${code[$r]} != 3 ]]; then
    say "rank $r exited ${code[$r]} (want 3: an error reported by the collective)"
    failed=1
  elif [[ -z $message ]]; then
    say "rank $r printed no error message"
    failed=1
  elif [[ $mode == cut ]] && ((!on_cut_host)) &&
    ! grep -qE "rank ($(IFS='|'; echo "${cut_ranks[*]}"))\b" <<<"$message"; then
    say "rank $r's error names no rank of the cut host ($victim_host: ranks ${cut_ranks[*]}): $message"
    failed=1
  else
    say "rank $r on host-${rank_host[$r]} failed after ${took[$r]} ms: $message"
  fi
  if [[ $mode == cut && ${code[$r]} != none ]]; then
    printf 'fault-matrix: %s_cut_%s rank=%d seconds=%d.%03d cut_host=%d\n' "$victim" "$phase_name" \
      "$r" $((took[$r] / 1000)) $((took[$r] % 1000)) "$on_cut_host"
  fi
done
((failed == 0)) || { show_output; fail "a surviving rank did not fail cleanly"; }
say "PASS: every surviving rank reported an error within $((timeout_ms + margin_ms)) ms"
