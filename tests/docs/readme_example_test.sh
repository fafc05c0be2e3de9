#!/usr/bin/env bash
# The C example in README.md compiles against the build tree and prints the
# right sums on 4 ranks.
set -euo pipefail
readme=$1 include_dir=$2 lib_dir=$3 weftrun=$4 work=$5
mkdir -p "$work"
awk '/^```c$/{on=1; next} /^```$/{on=0} on' "$readme" > "$work/example.c"
[[ -s $work/example.c ]] || { echo "no C example in $readme"; exit 1; }
cc -std=c11 -Wall -Wextra -Werror -Wno-float-conversion "$work/example.c" -I"$include_dir" \
  -L"$lib_dir" -lweft -Wl,-rpath,"$lib_dir" -o "$work/example"
output=$("$weftrun" -n 4 --timeout 60 "$work/example")
echo "$output"
for rank in 0 1 2 3; do
  grep -qx "\[$rank\] rank $rank: sum of ranks = 6 (expect 6)" <<<"$output" ||
    { echo "rank $rank did not print the expected sum"; exit 1; }
done
