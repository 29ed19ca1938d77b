#!/bin/sh
# run.sh - runs libFuzzer targets for a bounded time, several at once, and
# prints a table of what each did (for 'make fuzz' and the fuzz smoke run
# at the end of 'make check').
#
#   run.sh SECONDS JOBS BINDIR WORKDIR CORPUSDIR TARGET...
#
# Each TARGET runs as BINDIR/fuzz_TARGET for SECONDS, over the new inputs
# it keeps in WORKDIR/TARGET and its seed corpus CORPUSDIR/TARGET; JOBS
# targets at a time (0: one per online CPU). Its output goes to
# WORKDIR/TARGET.log and anything it finds to WORKDIR/TARGET-crash-...
# (leak-, timeout-, oom-). The exit status is 1 when any target found
# something or failed to run.
set -u

if [ $# -lt 6 ]; then
  echo "usage: $0 SECONDS JOBS BINDIR WORKDIR CORPUSDIR TARGET..." >&2
  exit 2
fi
seconds=$1 jobs=$2 bindir=$3 workdir=$4 corpus=$5
shift 5
case $jobs in
'' | *[!0-9]* | 0)
  jobs=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
  ;;
esac
ntargets=$#
[ "$jobs" -gt "$ntargets" ] && jobs=$ntargets

# One target: its log, and its exit status in WORKDIR/TARGET.rc so the
# summary below can read it once every runner has finished.
run_one() {
  t=$1
  mkdir -p "$workdir/$t"
  rm -f "$workdir/$t.rc"
  "$bindir/fuzz_$t" -max_total_time="$seconds" -print_final_stats=1 \
    -artifact_prefix="$workdir/$t-" "$workdir/$t" "$corpus/$t" \
    >"$workdir/$t.log" 2>&1
  echo $? >"$workdir/$t.rc"
}

echo "fuzz: $ntargets targets, ${seconds} s each, $jobs at a time" \
  "(logs: $workdir/TARGET.log)"
# JOBS runners, runner w taking targets w, w + JOBS, w + 2 JOBS, ...: every
# target runs for the same time, so this keeps all of them busy without
# the job control POSIX sh lacks.
w=0
while [ $w -lt "$jobs" ]; do
  (
    i=0
    for t in "$@"; do
      [ $((i % jobs)) -eq $w ] && run_one "$t"
      i=$((i + 1))
    done
  ) &
  w=$((w + 1))
done
wait

# libFuzzer's -print_final_stats=1 line "stat::NAME: VALUE" of $log.
final_stat() {
  sed -n "s/^stat::$1: *\([0-9]*\).*/\1/p" "$log" 2>/dev/null | tail -n 1
}

status=0
printf '%-12s %14s %8s %10s %8s  %s\n' target executions exec/s "new units" \
  crashes result
for t in "$@"; do
  log=$workdir/$t.log
  rc=$(cat "$workdir/$t.rc" 2>/dev/null || echo '?')
  execs=$(final_stat number_of_executed_units)
  rate=$(final_stat average_exec_per_sec)
  new=$(final_stat new_units_added)
  # What libFuzzer wrote in this run (a crash, leak, timeout or oom), not
  # what an earlier run left.
  found=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" 2>/dev/null)
  crashes=$(printf '%s' "$found" | grep -c . || true)
  if [ "$rc" = 0 ] && [ "$crashes" = 0 ] && [ -n "$execs" ]; then
    result=ok
  else
    result=FAIL
    status=1
  fi
  printf '%-12s %14s %8s %10s %8s  %s\n' "$t" "${execs:--}" "${rate:--}" \
    "${new:--}" "$crashes" "$result"
done
for t in "$@"; do
  log=$workdir/$t.log
  rc=$(cat "$workdir/$t.rc" 2>/dev/null || echo '?')
  found=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" 2>/dev/null)
  for f in $found; do
    kind=${f#"$workdir/$t-"}
    echo "FAIL: fuzz_$t: ${kind%%-*} in $f (log: $log)"
  done
  if [ -z "$found" ] && { [ "$rc" != 0 ] ||
    ! grep -q '^stat::number_of_executed_units' "$log" 2>/dev/null; }; then
    echo "FAIL: fuzz_$t: exit status $rc, no final stats (log: $log)"
    tail -n 5 "$log" 2>/dev/null | sed 's/^/  /'
  fi
done
exit $status
