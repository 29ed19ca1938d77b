#!/bin/sh
# The build's spill check (kernels/cuda/ptxas_check.sh) on made-up ptxas
# reports: a clean one passes, a spill store, a spill load or an empty
# report fails it.
set -u
check="${QL_SRCDIR:-.}/kernels/cuda/ptxas_check.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fails=0

report() { # $1 file, $2 spill stores, $3 spill loads
  cat >"$1" <<EOR
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z1kPf' for 'sm_80'
ptxas info    : Function properties for _Z1kPf
    0 bytes stack frame, $2 bytes spill stores, $3 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 4096 bytes smem
ptxas info    : Compiling entry function '_Z1gPf' for 'sm_90'
ptxas info    : Function properties for _Z1gPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers
EOR
}
expect() { # $1 expected status (0 or 1), $2 file, $3 what
  sh "$check" "$2" >"$dir/out" 2>&1
  st=$?
  if [ "$st" -ne "$1" ]; then
    echo "FAIL $3: status $st, want $1"; cat "$dir/out"; fails=$((fails + 1))
  else
    echo "ok   $3: $(cat "$dir/out")"
  fi
}
report "$dir/clean" 0 0
expect 0 "$dir/clean" "clean report"
grep -q "at most 64 registers" "$dir/out" || { echo "FAIL register count"; fails=$((fails + 1)); }
report "$dir/store" 16 0
expect 1 "$dir/store" "spill store"
report "$dir/load" 0 8
expect 1 "$dir/load" "spill load"
: >"$dir/empty"
expect 1 "$dir/empty" "empty report"
[ "$fails" -eq 0 ]
