#!/bin/sh
# test_fp8_probe.sh - tests/bench/fp8_probe.cpp on the reference cuBLASLt
# (fp8-probe-emu): exact f32 sums must be reported as such, and the
# emulation's limited-precision model (QL_EMU_FP8_ACC_BITS, _BLOCK,
# _PROMOTE: emu_blaslt.h) must be measured back as the parameters it was
# given, in two settings, with every random error inside the draft bound
# (err/bnd <= 1). The same probe then measures a real GPU (docs/backends/cuda.md, "CUDA
# backend").
set -u
: "${QL_FP8_PROBE_EMU:?run through make check}"

tmp=$(mktemp -d /tmp/ql-fp8probe-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { fail=1; echo "FAIL: $*"; }

# run NAME: the probe with the environment given, its output in $tmp/NAME
run() {
  name=$1
  shift
  env QL_EMU_CUDA_DEVICES=1 "$@" "$QL_FP8_PROBE_EMU" >"$tmp/$name" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] || { bad "$name: fp8-probe-emu exited $rc"; cat "$tmp/$name"; }
}

# expect NAME LINE: LINE is in the output
expect() {
  grep -qxF "$2" "$tmp/$1" || { bad "$1: no line '$2'"; cat "$tmp/$1"; }
}

# bounded NAME: every err/bnd figure of the random rows is <= 1
bounded() {
  awk '/max err\/model bound = / { v = $NF + 0; n++; if (v > 1) bad = 1 }
       END { exit !(n > 0 && !bad) }' "$tmp/$1" ||
    { bad "$1: a random error exceeds the model's bound"; cat "$tmp/$1"; }
}

run exact QL_EMU_FP8_ACC_BITS=0
expect exact "fp8_probe: precise: exact f32 accumulation (24 bits kept, as f32 sums rounded to nearest)"
expect exact "fp8_probe: fast-accum: exact f32 accumulation (24 bits kept, as f32 sums rounded to nearest)"
expect exact "fp8_probe: bf16-out: the output keeps 8 bits (control: bf16 has 8)"
bounded exact

run hopper QL_EMU_FP8_ACC_BITS=14 QL_EMU_FP8_ACC_BLOCK=32 QL_EMU_FP8_ACC_PROMOTE=128
expect hopper "fp8_probe: precise: accumulator keeps 14 bits within a K-block of 32; promotes every 128 elements"
expect hopper "fp8_probe: fast-accum: accumulator keeps 14 bits within a K-block of 32; no promotion within K = 2048"
grep -q 'precise: 2^14 - unit/2 -> -1 unit, .*truncation toward -inf (floor)' "$tmp/hopper" ||
  bad "hopper: the floor of a lost negative term not seen"
grep -q 'each addend truncated after alignment' "$tmp/hopper" ||
  bad "hopper: addends truncated one by one not seen"
grep -q 'precise: promotion again at k = 256: yes' "$tmp/hopper" ||
  bad "hopper: the second promotion not seen"
bounded hopper

run other QL_EMU_FP8_ACC_BITS=12 QL_EMU_FP8_ACC_BLOCK=16 QL_EMU_FP8_ACC_PROMOTE=256
expect other "fp8_probe: precise: accumulator keeps 12 bits within a K-block of 16; promotes every 256 elements"
bounded other

[ "$fail" -eq 0 ] && echo "ok: fp8-probe-emu measures exact sums and the model's parameters"
exit "$fail"
