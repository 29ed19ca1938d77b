#!/bin/sh
# test_bench_daemon.sh - smoke test of `qlinear-bench daemon --quick`: it
# starts its own qlineard (with one --daemon-arg), runs every case once
# with tiny samples on the message path and on the ring, stops the daemon
# and exits 0, printing one JSON line per case. Structure only: timings on
# shared machines are noise, so no figure is checked against a threshold
# (the ring's figures must be there and positive: its cases ran).
set -u
: "${QLINEARD:?run through make check}" "${QL_BENCH:?}"

tmp=$(mktemp -d /tmp/ql-bench-XXXXXX)
out="$tmp/out"
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# Its socket directory goes under TMPDIR: this one, checked afterwards.
mkdir "$tmp/t"
# --daemon-arg reaches qlineard's command line: the default spin, spelt
# out.
TMPDIR="$tmp/t" "$QL_BENCH" daemon --quick --daemon "$QLINEARD" \
  --daemon-arg --ring-spin-us --daemon-arg 200 >"$out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || bad "qlinear-bench daemon --quick exited $rc"
grep -q '^qlineard arguments added: --ring-spin-us 200$' "$out" ||
  bad "no line naming the --daemon-arg arguments"

# expect PATTERN: exactly one JSON line matches.
expect() {
  n=$(grep '^{' "$out" | grep -c -- "$1")
  [ "$n" -eq 1 ] || bad "$n JSON lines match $1, want 1"
}
for m in 1 128 512; do
  expect "\"case\":\"overhead\",.*\"m\":$m,"
done
for c in 1 2 4 8; do
  expect "\"case\":\"throughput\",.*\"clients\":$c,"
done
expect '"case":"batch_bound"'
expect '"case":"decode_p99"'
expect '"case":"idle"'
n=$(grep -c '^{' "$out")
[ "$n" -eq 10 ] || bad "$n JSON lines, want 10"

# Every case line carries its figures, each a median with its spread.
for key in overhead_ns echo_ns overhead_vs_echo inline_vs_region \
    region_overhead_ns rows_per_s vs_1_client alone_p99_ns prefill_p99_ns \
    p99_vs_alone; do
  grep '^{' "$out" | grep -q "\"$key\":{\"median\":[-0-9.e+]*,\"min\":" ||
    bad "no $key figure"
done
grep '^{' "$out" | grep -q '"same_bytes":false' &&
  bad "the daemon's y differs from the in-process kernel's"

# The ring's figures, on every line of their case, with a positive median
# (a round trip, a rate, a latency or a ratio above 0: the ring served
# them).
# positive CASE COUNT KEY...: COUNT lines of CASE carry each KEY so.
positive() {
  c=$1 want=$2
  shift 2
  for key in "$@"; do
    n=$(grep '^{' "$out" | grep "\"case\":\"$c\"" |
      grep -Ec "\"$key\":\\{\"median\":(0\\.0*[1-9]|[1-9])[0-9.e+]*,")
    [ "$n" -eq "$want" ] ||
      bad "$n $c lines with a positive $key, want $want"
  done
}
positive overhead 3 ring_region_rt_ns ring_inline_rt_ns inline_rt_ns \
  region_rt_ns region_vs_ring_region inline_vs_ring_inline
for key in ring_region_overhead_ns ring_inline_overhead_ns; do
  n=$(grep '^{' "$out" | grep -c "\"$key\":{\"median\":[-0-9.e+]*,\"min\":")
  [ "$n" -eq 3 ] || bad "$n overhead lines with $key, want 3"
done
positive throughput 4 rows_per_s ring_rows_per_s ring_vs_1_client \
  ring_vs_message
positive batch_bound 1 kernel_m8_ns kernel_m8_over_m1
bb=$(grep '^{"bench":"daemon","case":"batch_bound"' "$out")
for key in back_to_back_vs_1_client ring_back_to_back_vs_1_client \
    free_transport_vs_1_client; do
  echo "$bb" | grep -Eq "\"$key\":(0\\.0*[1-9]|[1-9])" ||
    bad "batch_bound: no positive $key"
done
positive decode_p99 1 ring_alone_p50_ns ring_alone_p99_ns \
  ring_prefill_p50_ns ring_prefill_p99_ns ring_p99_vs_alone \
  alone_p99_message_vs_ring
# idle: 16 rings that exist (the daemon's region bytes grew), two windows
# measured, CPU use a number of 0 or more.
idle=$(grep '^{"bench":"daemon","case":"idle"' "$out")
echo "$idle" | grep -q '"ring_sessions":16,"ring_bytes":[1-9]' ||
  bad "idle: not 16 rings: $idle"
for key in window_s no_ring_window_s; do
  echo "$idle" | grep -Eq "\"$key\":(0\\.0*[1-9]|[1-9])" ||
    bad "idle: no $key: $idle"
done
for key in cpu_pct no_ring_cpu_pct cpu_pct_schedstat; do
  echo "$idle" | grep -q "\"$key\":[0-9][0-9.]*[,}]" ||
    bad "idle: $key is not a number >= 0: $idle"
done

# --shape: K a multiple of 32, refused otherwise before anything starts.
"$QL_BENCH" daemon --shape 64x48 --daemon "$QLINEARD" >"$tmp/shape" 2>&1
rc=$?
[ "$rc" -eq 2 ] || bad "--shape 64x48 exited $rc, want 2"
grep -q 'K must be a multiple of 32' "$tmp/shape" ||
  bad "--shape 64x48: no reason given: $(head -3 "$tmp/shape")"

# Each line is one JSON object, where python3 can tell.
if command -v python3 >/dev/null 2>&1; then
  grep '^{' "$out" | python3 -c '
import json, sys
for line in sys.stdin:
    json.loads(line)
' || bad "a JSON line does not parse"
fi

# Nothing left behind: the daemon was stopped and its directory removed.
[ -z "$(ls -A "$tmp/t")" ] || bad "left behind in TMPDIR: $(ls -A "$tmp/t")"

if [ "$fail" -ne 0 ]; then
  echo "--- output of qlinear-bench daemon --quick"
  cat "$out"
  exit 1
fi
exit 0
