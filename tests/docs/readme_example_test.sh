#!/usr/bin/env bash
# The C and C++ examples in README.md compile against the build tree and print
# the right sums on 4 ranks.
set -euo pipefail
readme=$1 include_dir=$2 lib_dir=$3 weftrun=$4 work=$5
nranks=4 sum=6 # 0 + 1 + 2 + 3
mkdir -p "$work"

extract() { # extract LANGUAGE FILE: the README's first code block in LANGUAGE
  awk -v fence="\`\`\`$1" '$0 == fence {on=1; next} on && /^```$/ {exit} on' "$readme" >"$2"
  [[ -s $2 ]] || {
    echo "no $1 example in $readme"
    exit 1
  }
}

extract c "$work/example.c"
cc -std=c11 -Wall -Wextra -Werror -Wno-float-conversion "$work/example.c" -I"$include_dir" \
  -L"$lib_dir" -lweft -Wl,-rpath,"$lib_dir" -o "$work/example"
output=$("$weftrun" -n $nranks --timeout 60 "$work/example")
echo "$output"
for ((rank = 0; rank < nranks; rank++)); do
  grep -qx "\[$rank\] rank $rank: sum of ranks = $sum (expect $sum)" <<<"$output" ||
    { echo "C example: rank $rank did not print the expected sum"; exit 1; }
done

extract cpp "$work/example.cc"
c++ -std=c++20 -Wall -Wextra -Werror "$work/example.cc" -I"$include_dir" \
  -L"$lib_dir" -lweft -Wl,-rpath,"$lib_dir" -o "$work/example-cpp"
output=$("$weftrun" -n $nranks --timeout 60 "$work/example-cpp")
echo "$output"
gathered=$((4 * nranks))
for ((rank = 0; rank < nranks; rank++)); do
  line="[$rank] rank $rank: sum of ranks = $sum, gathered $gathered (expect $sum, $gathered)"
  grep -qxF -- "$line" <<<"$output" ||
    { echo "C++ example: rank $rank did not print: $line"; exit 1; }
done
