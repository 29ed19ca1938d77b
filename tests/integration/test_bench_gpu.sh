#!/bin/sh
# test_bench_gpu.sh - `qlinear-bench --device cuda:...` on emulated GPUs
# (qlinear-bench-cudaemu: the bench, the CUDA backend and its kernels on
# the emulated runtime): with a tiny shape it times every kernel case and
# prints one JSON line per case. Checked: the cases, the bytes each call
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
# 4 rows for linear_aq and quantize_rows; cuda:1 by alias.
"$QL_BENCH_CUDAEMU" --device cuda:1 --shapes 48x200 --gs 64 --aq-m 4 \
  --pairs 5 --iters 3 >"$out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || { bad "qlinear-bench --device cuda:1 exited $rc"; cat "$out"; }
grep -q 'peak memory bandwidth 3352.3 GB/s' "$out" ||
  bad "the human header does not give the peak"

grep '^{' "$out" | python3 -c '
import json, math, sys

def r16(n):
    return (n + 15) // 16 * 16

N, K, GS, M = 48, 200, 64, 4
G = (K + GS - 1) // GS
# cuda-1 layouts (kernels/cuda/backend.cpp make_packed), f32 scales.
layout = {
    "q4g": r16(N * r16((K + 1) // 2)) + 2 * r16(N * G * 4),
    "q8c": r16(N * r16(K)) + r16(N * 4),
    "q8b": r16(N * r16(K)) + r16(N * G * 4),
    "f8r": r16(N * r16(K)) + r16(N * 4),
}
want = {("quantize_rows", "i8")} | {("linear_wo", f) for f in layout} | \
    {("linear_aq", "q4g"), ("linear_aq", "q8c")}
fails = []
seen = set()
for line in sys.stdin:
    c = json.loads(line)
    key = (c["kernel"], c["format"])
    if key in seen:
        fails.append("case %s twice" % (key,))
    seen.add(key)
    if c["bench"] != "gpu" or c["alias"] != "cuda:1" or \
            not c["device"].startswith("cuda:GPU-"):
        fails.append("%s: device %s %s" % (key, c["device"], c["alias"]))
    if (c["n"], c["k"]) != (N, K) or c["iters"] != 3 or c["pairs"] != 5:
        fails.append("%s: shape or counts %s" % (key, line.strip()))
    kernel, fmt = key
    if kernel == "quantize_rows":
        exp = (0, M * K * 4, M * K + M * 4 + M * G * 4 + M * 8, 0)
    elif kernel == "linear_wo":
        exp = (layout[fmt], K * 4, N * 4, c["scratch_bytes"])
        if c["m"] != 1:
            fails.append("%s: m %d" % (key, c["m"]))
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
if seen != want:
    fails.append("cases %s, want %s" % (sorted(seen), sorted(want)))
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
' || bad "the JSON lines (above)"

# By UUID: the same device.
uuid=$(grep '^{' "$out" | head -1 | sed 's/.*"device":"\([^"]*\)".*/\1/')
"$QL_BENCH_CUDAEMU" --device "$uuid" --shapes 16x64 --gs 32 --aq-m 2 \
  --pairs 5 --iters 1 --json >"$tmp/uuid" 2>&1 ||
  bad "qlinear-bench --device $uuid failed"
[ "$(grep -c '"alias":"cuda:1"' "$tmp/uuid")" -eq 7 ] ||
  bad "--device $uuid: not 7 cases on cuda:1"

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
