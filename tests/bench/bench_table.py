#!/usr/bin/env python3
"""bench_table.py - turns qlinear-bench's JSON lines into the Markdown table
of README.md's performance section.

    ./tests/bench/qlinear-bench ... | tee bench.txt
    python3 tests/bench/bench_table.py bench.txt [--m 1,16,512]

One row per (shape, format, path, M); each figure is the median of the
interleaved A/B pairs with [min-max] over the pairs, as the bench prints it.
"""
import json
import sys


def fig(d, key):
    v = d.get(key)
    if v is None:
        return "-"
    return "%.2f [%.2f-%.2f]" % (v["median"], v["min"], v["max"])


def main(argv):
    ms = None
    files = []
    i = 1
    while i < len(argv):
        if argv[i] == "--m":
            ms = {int(v) for v in argv[i + 1].split(",")}
            i += 2
        else:
            files.append(argv[i])
            i += 1
    rows = []
    for f in files or ["-"]:
        fh = sys.stdin if f == "-" else open(f)
        for line in fh:
            if line.startswith("{"):
                d = json.loads(line)
                # the kernel cases; `qlinear-bench daemon` has its own
                if d.get("bench") == "kernel":
                    rows.append(d)
    print("| shape N x K | format | path | M | ms | weight GB/s | x read loop "
          "| x OpenBLAS | x oneDNN u8s8s32 | x our q8c AQ |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for d in rows:
        if ms is not None and d["m"] not in ms:
            continue
        fmt = d["format"] + ("/g%d" % d["group_size"] if d["format"] == "q4g"
                             else "/b%d" % d["group_size"]
                             if d["format"].startswith("q8b") else "")
        blas = d.get("vs_openblas_sgemv") or d.get("vs_openblas_sgemm")
        print("| %dx%d | %s | %s | %d | %.3f | %.1f | %s | %s | %s | %s |" % (
            d["n"], d["k"], fmt, d["path"].upper(), d["m"], d["ours_ms"],
            d["ours_gbs"], fig(d, "vs_read"),
            fig({"x": blas}, "x") if blas else "-",
            fig(d, "vs_onednn_u8s8s32"), fig(d, "vs_q8c_aq")))


if __name__ == "__main__":
    main(sys.argv)
