#!/bin/sh
# test_bench_gpu.sh - `qlinear-bench --device cuda:...` on emulated GPUs
# (qlinear-bench-cudaemu: the bench, the CUDA backend and its kernels on
# the emulated runtime): with a tiny shape it checks batch invariance, times
# every kernel case and the in-run read of its bytes, and prints one JSON
# line per case. Checked: the invariance verdicts, the cases, the bytes each call
# moves (computed here from the cuda-1 layout rule of ql_cuda.h: rows of
# codes padded to 16 bytes, f32 scales [N, G], then zeros, each section
# 16-aligned), the peak from the emulated device (2619 MHz x 2 x 5120
# bits), and that every ratio is a finite positive number. Emulated times
# are the CPU's, so no figure is held to a threshold. A device that does
# not exist is an error (exit status 2) that names the devices there are.
set -u
: "${QL_BENCH_CUDAEMU:?run through make check}"

tmp=$(mktemp -d /tmp/ql-bgpu-XXXXXX)
out="$tmp/out"
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

export QL_EMU_CUDA_DEVICES=2
unset QL_EMU_CUDA_FAULT QL_EMU_CUDA_NODRIVER 2>/dev/null

# 48 x 200 (K ragged: not a multiple of 16 or of the group), groups of 64,
# linear_wo at 1 and 2 rows, linear_aq (and quantize_rows, cuBLASLt's IMMA
# from 16 rows) at 4 and 16; the batch-invariance check on the same shape
# at M = 1, 16, 17; cuda:1 by alias.
"$QL_BENCH_CUDAEMU" --device cuda:1 --shapes 48x200 --gs 64 --wo-m 1,2 \
  --aq-m 4,16 --inv-shapes 48x200 --inv-m 1,16,17 --pairs 5 --iters 3 \
  >"$out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || { bad "qlinear-bench --device cuda:1 exited $rc"; cat "$out"; }
grep -q 'peak memory bandwidth 3352.3 GB/s' "$out" ||
  bad "the human header does not give the peak"
grep -q '^batch invariance: PASS$' "$out" ||
  bad "no batch invariance PASS line"

grep '^{' "$out" | python3 -c '
import json, math, sys

def r16(n):
    return (n + 15) // 16 * 16

N, K, GS = 48, 200, 64
G = (K + GS - 1) // GS
# cuda-1 layouts (kernels/cuda/backend.cpp make_packed), f32 scales.
layout = {
    "q4g": r16(N * r16((K + 1) // 2)) + 2 * r16(N * G * 4),
    "q8c": r16(N * r16(K)) + r16(N * 4),
    "q8b": r16(N * r16(K)) + r16(N * G * 4),
    "f8r": r16(N * r16(K)) + r16(N * 4),
}
want = {("quantize_rows", "i8", 16), ("linear_aq_lt", "q8c", 16)} | \
    {("linear_wo", f, m) for f in layout for m in (1, 2)} | \
    {("linear_aq", f, m) for f in ("q4g", "q8c", "f8r") for m in (4, 16)}
want_inv = {(f, "wo", d) for f in ("q4g", "q8c", "q8b", "q8b-asym", "f8r")
            for d in ("f32", "bf16")} | \
    {(f, "aq", d) for f in ("q4g", "q8c", "f8r") for d in ("f32", "bf16")}
fails = []
seen = set()
seen_inv = set()
for line in sys.stdin:
    c = json.loads(line)
    if c["bench"] == "gpu_invariance":
        key = (c["format"], c["path"], c["dtype"])
        seen_inv.add(key)
        if not c["pass"] or c["ms"] != [1, 16, 17] or \
                (c["n"], c["k"]) != (N, K):
            fails.append("invariance %s: %s" % (key, line.strip()))
        continue
    key = (c["kernel"], c["format"], c["m"])
    if key in seen:
        fails.append("case %s twice" % (key,))
    seen.add(key)
    if c["bench"] != "gpu" or c["alias"] != "cuda:1" or \
            not c["device"].startswith("cuda:GPU-"):
        fails.append("%s: device %s %s" % (key, c["device"], c["alias"]))
    if (c["n"], c["k"]) != (N, K) or c["iters"] != 3 or c["pairs"] != 5 or \
            c["graph"]:
        fails.append("%s: shape or counts %s" % (key, line.strip()))
    kernel, fmt, M = key
    if kernel == "quantize_rows":
        exp = (0, M * K * 4, M * K + M * 4 + M * G * 4 + M * 8, 0)
    elif kernel == "linear_wo":
        exp = (layout[fmt], M * K * 4, M * N * 4, c["scratch_bytes"])
    elif kernel == "linear_aq_lt" or fmt == "f8r":
        # cuBLASLt: codes in rows of r16(K), an f32 accumulator [M, r16(N)]
        exp = (layout[fmt], M * r16(K) + M * 4, M * N * 4, M * r16(N) * 4)
    else:
        exp = (layout[fmt], M * K + M * 4 + (M * G * 4 if fmt == "q4g" else 0),
               M * N * 4, 0)
    got = (c["layout_bytes"], c["x_bytes"], c["y_bytes"], c["scratch_bytes"])
    if got != exp:
        fails.append("%s: layout, x, y, scratch bytes %s, want %s"
                     % (key, got, exp))
    if c["bytes_per_call"] != sum(exp[:3]) + 2 * exp[3]:
        fails.append("%s: bytes_per_call %d, want %d"
                     % (key, c["bytes_per_call"], sum(exp[:3]) + 2 * exp[3]))
    if abs(c["peak_gb_per_s"] - 2619e6 * 2 * 5120 / 8 / 1e9) > 1e-3:
        fails.append("%s: peak %s" % (key, c["peak_gb_per_s"]))
    r = c["ratio"]
    if not (isinstance(r, float) and math.isfinite(r) and r > 0) or \
            not (0 < c["ratio_min"] <= r <= c["ratio_max"]) or \
            not math.isfinite(c["ratio_max"]):
        fails.append("%s: ratio %s [%s-%s]" % (key, r, c["ratio_min"],
                                               c["ratio_max"]))
    if not (c["ns_per_call"] > 0 and c["gb_per_s"] > 0):
        fails.append("%s: time %s, GB/s %s" % (key, c["ns_per_call"],
                                               c["gb_per_s"]))
    # The ratio is the bandwidth over the peak.
    if abs(c["gb_per_s"] / c["peak_gb_per_s"] - r) > 1e-3 * r + 1e-9:
        fails.append("%s: ratio %s is not %s / %s" % (key, r, c["gb_per_s"],
                                                     c["peak_gb_per_s"]))
    # The in-run read of the same bytes: its share is read time / case time.
    rr, rns = c.get("read_ratio"), c.get("read_ns_per_call")
    if not (isinstance(rr, float) and rr > 0 and rns > 0) or \
            abs(rr - rns / c["ns_per_call"]) > 1e-3 * rr or \
            abs(c["read_gb_per_s"] - c["bytes_per_call"] / rns) > \
            1e-3 * c["read_gb_per_s"]:
        fails.append("%s: read %s %s" % (key, rr, rns))
    tops = 2 * M * N * K / c["ns_per_call"] / 1e3
    if kernel != "quantize_rows" and \
            abs(c.get("tops", -1) - tops) > 1e-3 * tops:
        fails.append("%s: tops %s, want %s" % (key, c.get("tops"), tops))
if seen != want:
    fails.append("cases %s, want %s" % (sorted(seen), sorted(want)))
if seen_inv != want_inv:
    fails.append("invariance %s, want %s" % (sorted(seen_inv),
                                             sorted(want_inv)))
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
' || bad "the JSON lines (above)"

# deploy/gpu-check's table (tests/bench/gpu_table.py) of those lines: a row
# per case, the invariance verdict.
python3 "${srcdir:-.}/tests/bench/gpu_table.py" "$out" >"$tmp/table" 2>&1 ||
  bad "gpu_table.py failed: $(cat "$tmp/table")"
if [ "$(grep -c '^48x200 ' "$tmp/table")" -ne 15 ] ||
  ! grep -q 'batch invariance on the GPU (row 0 at M=1,16,17): 16 checked, all PASS' \
    "$tmp/table"; then
  bad "gpu_table.py: $(cat "$tmp/table")"
fi

# By UUID: the same device.
uuid=$(grep '^{"bench":"gpu",' "$out" | head -1 | sed 's/.*"device":"\([^"]*\)".*/\1/')
"$QL_BENCH_CUDAEMU" --device "$uuid" --shapes 16x64 --gs 32 --wo-m 1 \
  --aq-m 2 --no-invariance --pairs 5 --iters 1 --json >"$tmp/uuid" 2>&1 ||
  bad "qlinear-bench --device $uuid failed"
[ "$(grep -c '"alias":"cuda:1"' "$tmp/uuid")" -eq 7 ] ||
  bad "--device $uuid: not 7 cases on cuda:1"

# --mapped: each linear_wo case again on read-only imports of the exported
# layouts (mapped mode), the same bytes per call; none without export
# (QL_CUDA_VMM=0), which the bench says.
"$QL_BENCH_CUDAEMU" --device cuda:0 --shapes 48x200 --gs 64 --wo-m 1,2 \
  --aq-m 2 --formats q4g,q8b --mapped --no-invariance --pairs 5 --iters 1 \
  --json >"$tmp/mapped" 2>&1 || bad "qlinear-bench --mapped failed"
grep -q 'FAIL' "$tmp/mapped" && bad "--mapped: $(grep FAIL "$tmp/mapped")"
python3 - "$tmp/mapped" <<'PY' || bad "--mapped: $(cat "$tmp/mapped")"
import json, sys
cases = {}
for line in open(sys.argv[1]):
    if line.startswith("{"):
        c = json.loads(line)
        cases[(c["kernel"], c["format"], c["m"])] = c
for f in ("q4g", "q8b"):
    for m in (1, 2):
        a, b = cases[("linear_wo", f, m)], cases[("linear_wo_mapped", f, m)]
        for key in ("layout_bytes", "bytes_per_call", "rot"):
            assert a[key] == b[key], (f, m, key, a[key], b[key])
        assert b["ns_per_call"] > 0
PY
QL_CUDA_VMM=0 "$QL_BENCH_CUDAEMU" --device cuda:0 --shapes 16x64 --gs 32 \
  --wo-m 1 --aq-m 2 --formats q4g --mapped --no-invariance --pairs 5 \
  --iters 1 --json >"$tmp/nomap" 2>&1 || bad "--mapped, QL_CUDA_VMM=0 failed"
grep -q '"kernel":"linear_wo_mapped"' "$tmp/nomap" &&
  bad "a mapped case without export"
grep -q 'no mapped case: operation not supported' "$tmp/nomap" ||
  bad "QL_CUDA_VMM=0: $(cat "$tmp/nomap")"

# No such device: status 2, and the message names the devices.
"$QL_BENCH_CUDAEMU" --device cuda:7 --shapes 16x64 >"$tmp/err" 2>&1
rc=$?
[ "$rc" -eq 2 ] || bad "--device cuda:7 exited $rc, want 2"
grep -q "no device 'cuda:7' (cuda:0 = cuda:GPU-" "$tmp/err" ||
  bad "--device cuda:7: $(cat "$tmp/err")"
"$QL_BENCH_CUDAEMU" --device gpu0 >"$tmp/err" 2>&1
rc=$?
[ "$rc" -eq 2 ] || bad "--device gpu0 exited $rc, want 2"
QL_EMU_CUDA_NODRIVER=1 "$QL_BENCH_CUDAEMU" --device cuda:0 >"$tmp/err" 2>&1
rc=$?
[ "$rc" -eq 2 ] || bad "--device cuda:0 without a driver exited $rc, want 2"
grep -q "no CUDA driver" "$tmp/err" || bad "no driver: $(cat "$tmp/err")"

[ "$fail" -eq 0 ] && echo "test_bench_gpu: ok"
exit "$fail"
