#!/bin/sh
# test_bench_daemon.sh - smoke test of `qlinear-bench daemon --quick`: it
# starts its own qlineard, runs every case once with tiny samples, stops
# the daemon and exits 0, printing one JSON line per case. Structure only:
# timings on shared machines are noise, so no figure is checked against a
# threshold.
set -u
: "${QLINEARD:?run through make check}" "${QL_BENCH:?}"

tmp=$(mktemp -d /tmp/ql-bench-XXXXXX)
out="$tmp/out"
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# Its socket directory goes under TMPDIR: this one, checked afterwards.
mkdir "$tmp/t"
TMPDIR="$tmp/t" "$QL_BENCH" daemon --quick --daemon "$QLINEARD" >"$out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || bad "qlinear-bench daemon --quick exited $rc"

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
expect '"case":"decode_p99"'
n=$(grep -c '^{' "$out")
[ "$n" -eq 8 ] || bad "$n JSON lines, want 8"

# Every case line carries its figures, each a median with its spread.
for key in overhead_ns echo_ns overhead_vs_echo inline_vs_region \
    region_overhead_ns rows_per_s vs_1_client alone_p99_ns prefill_p99_ns \
    p99_vs_alone; do
  grep '^{' "$out" | grep -q "\"$key\":{\"median\":[-0-9.e+]*,\"min\":" ||
    bad "no $key figure"
done
grep '^{' "$out" | grep -q '"same_bytes":false' &&
  bad "the daemon's y differs from the in-process kernel's"

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
