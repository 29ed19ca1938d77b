#!/usr/bin/env python3
"""gpu_table.py FILE... - one table of qlinear's GPU kernels against the
peers, from the JSON lines of `qlinear-bench --device` (bench "gpu" and
"gpu_invariance") and tests/bench/peers_gpu.py (bench "peer"), as
deploy/gpu-check writes them; other lines are ignored.

Per shape and M: each of our cases (kernel, format) with its time per call,
the fraction of the in-run streaming read of the same bytes (x READ), of
the nominal peak (x PEAK) and TOPS, then its time over each peer's at the
same shape and M (ours/peer: below 1 we are faster); then the peers' own
rows. A peer that ran padded rows (FP8 needs M a multiple of 16, int8
M > 16) is marked with *. The batch-invariance verdicts follow."""
import json
import sys

PEERS = [("cublas_bf16", "bf16"), ("tinygemm_int4_g128", "tinygemm"),
         ("scaled_mm_fp8_rowwise", "fp8"), ("int_mm_int8", "int8")]


errors = []


def load(paths):
    ours, peers, inv, env = [], {}, [], None
    for p in paths:
        try:
            f = open(p)
        except OSError as ex:
            print("gpu_table: %s" % ex, file=sys.stderr)
            continue
        with f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    c = json.loads(line)
                except ValueError:
                    continue
                b = c.get("bench")
                if b == "gpu":
                    ours.append(c)
                elif b == "gpu_invariance":
                    inv.append(c)
                elif b == "peer_env":
                    env = c
                elif b == "peer" and "ns" in c:
                    peers[(c["kind"], c["n"], c["k"], c["m"])] = c
                elif b == "peer":
                    errors.append(c)
    return ours, peers, inv, env


def main():
    ours, peers, inv, env = load(sys.argv[1:])
    if ours:
        c = ours[0]
        print("qlinear on %s (%s), peak %.0f GB/s" % (c.get("model", "?"), c["alias"],
                                                   c["peak_gb_per_s"]))
    if env:
        print("peers: torch %s, CUDA %s, %s" % (env["torch"], env["cuda"], env["gpu"]))
    print("ours/peer: time ratio (< 1: qlinear faster); * the peer ran padded rows")
    hdr = "%-11s %5s %-13s %-4s %9s %6s %6s %7s" % (
        "N x K", "M", "KERNEL", "FMT", "US", "xREAD", "xPEAK", "TOPS")
    for _, short in PEERS:
        hdr += " %9s" % ("/" + short)
    print(hdr)
    keys = []
    for c in ours:
        if c["kernel"] == "quantize_rows":
            continue
        key = (c["n"], c["k"], c["m"])
        if key not in keys:
            keys.append(key)
    for (kind, n, k, m) in peers:
        if (n, k, m) not in keys and any(o["n"] == n and o["k"] == k for o in ours):
            keys.append((n, k, m))
    shapes = []
    for (n, k, m) in keys:
        if (n, k) not in shapes:
            shapes.append((n, k))
    for (n, k) in shapes:
        for m in sorted({key[2] for key in keys if key[:2] == (n, k)}):
            sh = "%dx%d" % (n, k)
            for c in ours:
                if (c["n"], c["k"], c["m"]) != (n, k, m) or c["kernel"] == "quantize_rows":
                    continue
                ns = c["ns_per_call"]
                row = "%-11s %5d %-13s %-4s %9.2f %6s %6.3f %7s" % (
                    sh, m, c["kernel"], c["format"], ns / 1e3,
                    "%.3f" % c["read_ratio"] if "read_ratio" in c else "-",
                    c.get("ratio") or 0.0,
                    "%.1f" % c["tops"] if "tops" in c else "-")
                for kind, _ in PEERS:
                    p = peers.get((kind, n, k, m))
                    row += " %9s" % ("%.2f%s" % (ns / p["ns"], "*" if p["m_run"] != m else "")
                                     if p else "-")
                print(row)
            for kind, short in PEERS:
                p = peers.get((kind, n, k, m))
                if p:
                    print("%-11s %5d %-13s %-4s %9.2f %6s %6s %7.1f%s" % (
                        sh, m, "peer " + short, "", p["ns"] / 1e3, "-", "-",
                        p["tops"], "  (M=%d run)" % p["m_run"] if p["m_run"] != m else ""))
    # quantize_rows: its own small table (no peer).
    q = [c for c in ours if c["kernel"] == "quantize_rows"]
    if q:
        print("quantize_rows (int8, group sums): " + ", ".join(
            "%dx%d M=%d %.1f us (x READ %s)" % (
                c["n"], c["k"], c["m"], c["ns_per_call"] / 1e3,
                "%.2f" % c["read_ratio"] if "read_ratio" in c else "-") for c in q))
    if inv:
        bad = [c for c in inv if not c["pass"]]
        print("batch invariance on the GPU (row 0 at M=%s): %d checked, %s" % (
            ",".join(str(m) for m in inv[0]["ms"]), len(inv),
            "all PASS" if not bad else "%d FAIL" % len(bad)))
        for c in bad:
            print("  FAIL %s %s %s %dx%d: %s (%s, M=%d)" % (
                c["format"], c["path"], c["dtype"], c["n"], c["k"], c["why"],
                c["impls"], c["bad_m"]))
    for c in errors[:8]:
        print("peer %s %dx%d M=%s did not run: %s" % (
            c["kind"], c["n"], c["k"], c.get("m", "any"), c.get("error", "?")))
    if len(errors) > 8:
        print("... %d more peer errors" % (len(errors) - 8))
    if not ours and not peers:
        print("gpu_table: no JSON lines of qlinear-bench or peers_gpu.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
