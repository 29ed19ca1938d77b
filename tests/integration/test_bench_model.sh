#!/bin/sh
# test_bench_model.sh - smoke test of `qlinear-bench model` on a tiny model
# (2 layers, hidden 64): every variant that is fast (all but the compiled
# ones), then the K-process mode with K = 1, 2. The bench starts its own
# qlineard on a private socket directory under TMPDIR. Structure and
# agreement only, no timing thresholds (timings on shared machines are
# noise): it exits 0, prints one JSON line per variant and the table, the
# figures are positive, qlinear q8c agrees with bf16 where the floor does
# not, and a decode step makes the round trips the fused groups promise.
#
# The interpreter is found as test_python.sh finds it ($QL_PYTHON, else
# deploy/python-env --find); a missing one fails the test.
set -u
: "${QLINEARD:?run through make check}" "${QL_BENCH:?}" "${QL_SRCDIR:?}" \
  "${QL_BUILDDIR:?}"
if [ -z "${QL_PYTHON:-}" ]; then
  QL_PYTHON=$("$QL_SRCDIR/deploy/python-env" --find) || {
    echo "FAIL: no Python test environment: run deploy/python-env (deploy/test does)"
    exit 1
  }
fi
export QL_PYTHON
QLINEAR_LIB="$QL_BUILDDIR/.libs/libqlinear.so.0"
export QLINEAR_LIB
# A sanitizer build's library needs the ASan runtime loaded before the
# interpreter (as in test_python.sh); the interpreter's own allocations at
# exit are not ours to report.
asan=$(ldd "$QLINEAR_LIB" 2>/dev/null | sed -n 's/.*\(libasan[^ ]*\) => \([^ ]*\).*/\2/p')
ubsan=$(ldd "$QLINEAR_LIB" 2>/dev/null | sed -n 's/.*\(libubsan[^ ]*\) => \([^ ]*\).*/\2/p')
if [ -n "$asan" ]; then
  cxx=$(/sbin/ldconfig -p 2>/dev/null |
    sed -n 's/.*libstdc++\.so\.6 (libc6,x86-64) => \(.*\)/\1/p' | head -1)
  LD_PRELOAD="$asan${ubsan:+ $ubsan}${cxx:+ $cxx}${LD_PRELOAD:+ $LD_PRELOAD}"
  ASAN_OPTIONS="detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
  export LD_PRELOAD ASAN_OPTIONS
fi
unset QLINEAR_ADDRESS QLINEAR_ADMIN_ADDRESS

tmp=$(mktemp -d /tmp/ql-bench-model-XXXXXX)
out="$tmp/out"
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
mkdir "$tmp/t"

# One torch thread: the machine is shared, and a tiny model on spinning
# threads measures the neighbours. A fixed crossover: the daemon does not
# spend the test's CPU measuring one per shape.
variants=bf16,ao_int8wo,ao_int4,ao_int8dq,floor,ql_q4_auto,ql_q4_wo,ql_q8_auto,ql_q8_wo
TMPDIR="$tmp/t" "$QL_BENCH" model --layers 2 --hidden 64 --intermediate 128 \
  --heads 4 --kv-heads 2 --vocab 256 --prompt 8 --new 6 --slow-new 3 \
  --prefill 16 --rounds 3 --threads 1 --variants "$variants" \
  --procs 1,2 --proc-variants ql_q4_auto,ao_int4 \
  --daemon "$QLINEARD" --daemon-arg=--crossover-rows --daemon-arg=16 \
  >"$out" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 0 ] || bad "qlinear-bench model exited $rc"

# The figures, checked by the interpreter that ran the bench.
"$QL_PYTHON" - "$out" "$variants" >"$tmp/check" 2>&1 <<'PY' || bad "$(cat "$tmp/check")"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
want = sys.argv[2].split(",")
rows = {r["variant"]: r for r in lines if r["bench"] == "model"}
procs = [r for r in lines if r["bench"] == "model_procs"]
err = []
if sorted(rows) != sorted(want):
    err.append("variants %s, want %s" % (sorted(rows), sorted(want)))
for v, r in rows.items():
    for key in ("decode_ms_per_token", "prefill_ms"):
        m = r[key]
        if not 0 < m["min"] <= m["median"] <= m["max"]:
            err.append("%s: %s %s" % (v, key, m))
    if not 0 <= r["agree"] <= 1 or r["model_bytes_in_process"] <= 0:
        err.append("%s: agree %s, bytes %s" % (v, r["agree"],
                                               r["model_bytes_in_process"]))
    if r["tokens"] != (3 if v in ("ao_int8wo", "ao_int8dq") else 6):
        err.append("%s: %d tokens" % (v, r["tokens"]))
get = lambda v, k: rows.get(v, {}).get(k)
if get("bf16", "agree") != 1.0 or get("bf16", "max_logits_err") != 0:
    err.append("bf16 differs from itself")
# q8c is close to bf16: its argmax is bf16's at (nearly) every step; the
# floor's logits are zeros, so it is not, and its error is bf16's scale.
for v in ("ql_q8_auto", "ql_q8_wo"):
    if not (get(v, "agree") or 0) >= 0.8:
        err.append("%s agrees with bf16 at %s of the steps" % (v, get(v, "agree")))
    if not 0 < (get(v, "max_logits_err") or 0) < 0.2 * get("bf16", "logits_scale"):
        err.append("%s: logits error %s" % (v, get(v, "max_logits_err")))
if not (get("floor", "agree") if "floor" in rows else 1) <= 0.5:
    err.append("the floor agrees with bf16 at %s" % get("floor", "agree"))
# A decode step of 2 layers: q/k/v and gate/up fused, o and down alone,
# lm_head: 2 x 4 + 1 = 9 round trips; the daemon ran launches and timed them.
for v in ("ql_q4_auto", "ql_q4_wo", "ql_q8_auto", "ql_q8_wo"):
    b = rows.get(v, {}).get("breakdown_ms_per_token")
    if b is None:
        err.append("%s: no breakdown" % v)
        continue
    if b["calls_per_token"] != 9:
        err.append("%s: %s round trips a token, want 9" % (v, b["calls_per_token"]))
    for k in ("step", "in_qlinear_forward", "round_trips", "daemon_kernel"):
        if not b[k] > 0:
            err.append("%s: breakdown %s = %s" % (v, k, b[k]))
    # Nested timings of the client's (a round trip inside its forward, in
    # every round, so their medians keep the order too). Not the daemon's
    # kernel time: the parts of a fused request launch side by side on the
    # device's lanes, and their times add up past the round trip's.
    if not b["in_qlinear_forward"] >= b["round_trips"]:
        err.append("%s: the parts exceed their whole: %s" % (v, b))
    if v.endswith("_wo") and b["aq_launches_per_token"] != 0:
        err.append("%s: AQ launches on path wo" % v)
    if b["wo_launches_per_token"] + b["aq_launches_per_token"] != 15:
        err.append("%s: %s launches a token, want 15 (one a weight)" % (v, b))
seen = sorted((r["variant"], r["procs"]) for r in procs)
if seen != [("ao_int4", 1), ("ao_int4", 2), ("ql_q4_auto", 1), ("ql_q4_auto", 2)]:
    err.append("procs rows %s" % seen)
for r in procs:
    if not r["aggregate_tok_s"] > 0 or not r["clients_pss_mib"] > 0 or \
            r["torch_threads"] != 1 or len(r["per_proc_ms_per_token"]) != r["procs"]:
        err.append("procs row %s" % r)
    if (r["variant"] == "ql_q4_auto") != (r["daemon_pss_mib"] is not None):
        err.append("daemon PSS %s for %s" % (r["daemon_pss_mib"], r["variant"]))
print("\n".join(err))
sys.exit(1 if err else 0)
PY

# The human tables: one row a variant, the breakdown, the K processes.
n=$(grep -c '^| qlinear q8c, swap_linears, path' "$out")
[ "$n" -eq 2 ] || bad "$n table rows of qlinear q8c, want 2"
grep -q '^breakdown of a decode step' "$out" || bad "no breakdown table"
grep -q '^| ql_q4_wo | ' "$out" || bad "no breakdown row of ql_q4_wo"
grep -q '^2 processes at once, 1 torch thread(s) each' "$out" ||
  bad "no K-process table"

# A bad option is refused, with the reason.
"$QL_BENCH" model --rounds 2 >"$tmp/bad" 2>&1
rc=$?
[ "$rc" -eq 2 ] || bad "--rounds 2 exited $rc, want 2"
grep -q 'at least 3' "$tmp/bad" || bad "--rounds 2: no reason: $(cat "$tmp/bad")"

# Nothing of the daemon left behind: stopped, its directory removed
# (torch may leave its compiler cache there, which is not the bench's).
left=$(ls -A "$tmp/t" | grep "^ql-bench-model-")
[ -z "$left" ] || bad "left behind in TMPDIR: $left"

if [ "$fail" -ne 0 ]; then
  echo "--- output of qlinear-bench model"
  cat "$out"
  echo "--- its stderr"
  tail -40 "$tmp/err"
  exit 1
fi
exit 0
