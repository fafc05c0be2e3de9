#!/usr/bin/env bash
# Driver for the packaging tests (see CMakeLists.txt here). One step per call:
#   install    CMAKE BUILD_DIR STAGE LIBDIR VERSION   install BUILD_DIR into STAGE/prefix, check the tree
#   cmake      CMAKE GENERATOR SRC STAGE OUT CMAKE_ARGS...  build SRC with find_package(Weft)
#                                                     from STAGE/prefix into STAGE/OUT
#   pkgconfig  CC SRC STAGE LIBDIR VERSION            build SRC/hello.c from `pkg-config weft`,
#                                                     with the line README.md gives
#   run        STAGE NRANKS BINARY                    run BINARY under the installed weftrun, check output
set -euo pipefail

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# Fails unless path (after following links) lies inside dir.
require_inside() {
  local path dir
  path=$(readlink -f "$1")
  dir=$(readlink -f "$2")
  [[ $path == "$dir"/* ]] || fail "$1 resolves to $path, outside $dir"
}

install_tree() {
  local cmake=$1 build=$2 stage=$3 libdir=$4 version=$5
  local prefix=$stage/prefix
  rm -rf "$stage"
  "$cmake" --install "$build" --prefix "$prefix"
  local lib=$prefix/$libdir
  [[ -f $prefix/include/weft/weft.h ]] || fail "weft.h not installed"
  [[ -x $prefix/bin/weftrun ]] || fail "weftrun not installed"
  [[ -f $lib/libweft.so.$version ]] || fail "libweft.so.$version not installed"
  # The SONAME link and the development link must both lead to the versioned file.
  [[ $(readlink "$lib/libweft.so.${version%%.*}") == "libweft.so.$version" ]] ||
    fail "libweft.so.${version%%.*} is not a link to libweft.so.$version"
  [[ $(readlink "$lib/libweft.so") == "libweft.so.${version%%.*}" ]] ||
    fail "libweft.so is not a link to the SONAME"
  local f
  for f in WeftConfig.cmake WeftConfigVersion.cmake WeftTargets.cmake; do
    [[ -f $lib/cmake/Weft/$f ]] || fail "$f not installed"
  done
  [[ -f $lib/pkgconfig/weft.pc ]] || fail "weft.pc not installed"
  # The library exports the C ABI and nothing else (internals stay local: no clashes with the
  # C++ API's inline classes, no interposition by a program's symbols).
  local extra
  extra=$(nm -D --defined-only "$lib/libweft.so.$version" | awk '$3 !~ /^weft[A-Z]/ {print $3}')
  [[ -z $extra ]] || fail "libweft.so exports more than the C ABI: $(head -5 <<<"$extra")"
  # The static internals are linked into libweft.so; the export must not name them.
  if grep -E 'weft_(core|common|transport)|UCX|Threads' "$lib"/cmake/Weft/WeftTargets*.cmake; then
    fail "the exported targets leak private dependencies"
  fi
}

cmake_build() {
  local cmake=$1 generator=$2 src=$3 stage=$4 out=$4/$5
  shift 5
  local prefix=$stage/prefix
  "$cmake" -S "$src" -B "$out" -G "$generator" -DCMAKE_PREFIX_PATH="$prefix" "$@"
  "$cmake" --build "$out"
  # find_package must have taken the installed package, not a build tree.
  local weft_dir
  weft_dir=$(sed -n 's/^Weft_DIR:PATH=//p' "$out/CMakeCache.txt")
  require_inside "$weft_dir" "$prefix"
}

pkgconfig_build() {
  local cc=$1 src=$2 stage=$3 libdir=$4 version=$5
  export PKG_CONFIG_PATH=$stage/prefix/$libdir/pkgconfig
  local got
  got=$(pkg-config --modversion weft)
  [[ $got == "$version" ]] || fail "pkg-config reports version $got, expected $version"
  require_inside "$(pkg-config --variable=libdir weft)" "$stage/prefix"
  mkdir -p "$stage/hello-pc"
  # Exactly the README's line: weft.pc's Libs carry the RPATH, so nothing more is needed.
  # shellcheck disable=SC2046  # the flags must split into words
  "$cc" "$src/hello.c" -o "$stage/hello-pc/hello" $(pkg-config --cflags --libs weft)
}

run_hello() {
  local stage=$1 nranks=$2 binary=$3
  local prefix=$stage/prefix
  # The library the loader picks must be the installed one, not the build tree's.
  local resolved
  resolved=$(ldd "$binary" | sed -n 's/^[[:space:]]*libweft\.so[^ ]* => \([^ ]*\).*/\1/p')
  [[ -n $resolved ]] || fail "$binary does not resolve libweft.so"
  require_inside "$resolved" "$prefix"
  local output rc=0
  output=$("$prefix/bin/weftrun" -n "$nranks" --timeout 60 "$binary" 2>&1) || rc=$?
  echo "$output"
  [[ $rc -eq 0 ]] || fail "weftrun exited with $rc"
  local rank left right line
  for ((rank = 0; rank < nranks; rank++)); do
    left=$(((rank + nranks - 1) % nranks))
    right=$(((rank + 1) % nranks))
    line="[$rank] hello from rank $rank of $nranks: got $left from left, $right from right: ok"
    grep -qxF -- "$line" <<<"$output" || fail "missing line: $line"
  done
}

step=$1
shift
case $step in
  install) install_tree "$@" ;;
  cmake) cmake_build "$@" ;;
  pkgconfig) pkgconfig_build "$@" ;;
  run) run_hello "$@" ;;
  *) fail "unknown step $step" ;;
esac
