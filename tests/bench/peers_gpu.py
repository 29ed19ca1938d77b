#!/usr/bin/env python3
"""peers_gpu.py - the baselines `qlinear-bench --device` is compared with,
on the same GPU, shapes and row counts, timed the same way (deploy/gpu-check
runs both and tests/bench/gpu_table.py joins them):

  cublas_bf16            torch.nn.functional.linear on bf16 (cuBLAS)
  tinygemm_int4_g128     torch.ops.aten._weight_int4pack_mm, int4 groups of
                         128 (what TorchAO int4 weight-only runs)
  scaled_mm_fp8_rowwise  torch._scaled_mm, e4m3 with per-row and per-column
                         f32 scales, bf16 out
  int_mm_int8            torch._int_mm, int8 x int8 -> int32 (cuBLASLt IMMA)

Each call rotates over copies of the weight that add up to at least four
times the L2 cache, so every call reads its weight from device memory; the
calls of a sample are captured in a CUDA graph (no Python launch cost) and
timed with CUDA events; a figure is the median of --pairs (>= 5) samples.
_scaled_mm needs M a multiple of 16 and _int_mm M > 16: smaller M run
padded (m_run says so). Bytes per call count the weight (codes, scales,
zeros), x and y. One JSON line per case on stdout, progress on stderr.

PyTorch with CUDA is all it needs (no qlinear code)."""
import argparse
import json
import math
import sys
import time

import torch

GS = 128


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="4096x4096,14336x4096,4096x14336",
                   help="NxK,... (default %(default)s)")
    p.add_argument("--ms", default="1,2,4,8,16,64,128,512,2048",
                   help="rows M,... (default %(default)s)")
    p.add_argument("--peers", default="cublas_bf16,tinygemm_int4_g128,"
                   "scaled_mm_fp8_rowwise,int_mm_int8",
                   help="which (default all)")
    p.add_argument("--tinygemm-max-m", type=int, default=512,
                   help="tinygemm only up to this M (slow beyond)")
    p.add_argument("--pairs", type=int, default=5, help="samples (>= 5)")
    p.add_argument("--quick", action="store_true",
                   help="14336x4096 at M 1,16,512 (unless given)")
    a = p.parse_args()
    if a.quick:
        if "--shapes" not in sys.argv:
            a.shapes = "14336x4096"
        if "--ms" not in sys.argv:
            a.ms = "1,16,512"
    a.shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    a.ms = [int(m) for m in a.ms.split(",")]
    a.peers = a.peers.split(",")
    a.pairs = max(5, a.pairs)
    return a


def graph_time(calls, pairs):
    """ns per call: median over pairs samples of replays of one graph that
    makes every call of calls once."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in calls:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in calls:
            f()
    g.replay()
    torch.cuda.synchronize()
    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    # Replays per sample: enough for ~5 ms.
    e0.record(); g.replay(); e1.record(); e1.synchronize()
    one = max(e0.elapsed_time(e1), 1e-3)
    reps = max(1, min(64, int(math.ceil(5.0 / one))))
    ts = []
    for _ in range(pairs):
        e0.record()
        for _ in range(reps):
            g.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e6 / (reps * len(calls)))
    del g
    ts.sort()
    return ts[len(ts) // 2], ts[0], ts[-1]


def peer_weights(name, n, k, copies, dev):
    """copies of the weight of peer name, and the bytes of one."""
    ws = []
    for _ in range(copies):
        if name == "cublas_bf16":
            ws.append(torch.randn(n, k, device=dev, dtype=torch.bfloat16))
        elif name == "tinygemm_int4_g128":
            wq = torch.randint(0, 256, (n, k // 2), device=dev, dtype=torch.uint8)
            p = torch.ops.aten._convert_weight_to_int4pack(wq, 8)
            sz = torch.randn(k // GS, n, 2, device=dev, dtype=torch.bfloat16) * 0.01
            ws.append((p, sz))
        elif name == "scaled_mm_fp8_rowwise":
            w = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn)
            ws.append((w, torch.ones(1, n, device=dev)))
        else:
            ws.append(torch.randint(-128, 127, (n, k), device=dev, dtype=torch.int8))
    return ws


def weight_bytes(name, n, k):
    if name == "cublas_bf16":
        return n * k * 2
    if name == "tinygemm_int4_g128":
        return n * k // 2 + (k // GS) * n * 4
    if name == "scaled_mm_fp8_rowwise":
        return n * k + n * 4
    return n * k


def m_run(name, m):
    if name == "scaled_mm_fp8_rowwise":
        return max(16, (m + 15) // 16 * 16)
    if name == "int_mm_int8":
        return max(m, 32)
    return m


def make_call(name, w, x):
    if name == "cublas_bf16":
        return lambda: torch.nn.functional.linear(x[0], w)
    if name == "tinygemm_int4_g128":
        return lambda: torch.ops.aten._weight_int4pack_mm(x[0], w[0], GS, w[1])
    if name == "scaled_mm_fp8_rowwise":
        return lambda: torch._scaled_mm(x[0], w[0].t(), scale_a=x[1],
                                        scale_b=w[1], out_dtype=torch.bfloat16)
    return lambda: torch._int_mm(x[0], w.t())


def make_x(name, m, k, dev):
    if name in ("cublas_bf16", "tinygemm_int4_g128"):
        return (torch.randn(m, k, device=dev, dtype=torch.bfloat16),), m * k * 2
    if name == "scaled_mm_fp8_rowwise":
        return ((torch.randn(m, k, device=dev).to(torch.float8_e4m3fn),
                 torch.ones(m, 1, device=dev)), m * k + m * 4)
    return (torch.randint(-128, 127, (m, k), device=dev, dtype=torch.int8),), m * k


def main():
    a = parse_args()
    dev = "cuda"
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 0) or (50 << 20)
    print(json.dumps(dict(bench="peer_env", gpu=props.name, torch=torch.__version__,
                          cuda=torch.version.cuda, l2=l2,
                          sms=props.multi_processor_count)), flush=True)
    t0 = time.time()
    for (n, k) in a.shapes:
        for name in a.peers:
            wb = weight_bytes(name, n, k)
            copies = max(2, min(32, (4 * l2) // wb + 1))
            try:
                ws = peer_weights(name, n, k, copies, dev)
            except Exception as ex:  # a peer this torch or GPU lacks
                print(json.dumps(dict(bench="peer", kind=name, n=n, k=k,
                                      error=str(ex)[:300])), flush=True)
                continue
            for m in a.ms:
                if name == "tinygemm_int4_g128" and m > a.tinygemm_max_m:
                    continue
                mr = m_run(name, m)
                try:
                    x, xb = make_x(name, mr, k, dev)
                    yb = mr * n * (4 if name == "int_mm_int8" else 2)
                    # One graph: every copy once, repeated up to 64 calls
                    # (8 for large M: the graph keeps each call's output).
                    rep = max(1, (64 if mr < 512 else 8) // copies)
                    calls = [make_call(name, w, x) for w in ws] * rep
                    ns, lo, hi = graph_time(calls, a.pairs)
                    nbytes = wb + xb + yb
                    print(json.dumps(dict(
                        bench="peer", kind=name, graph=True, n=n, k=k, m=m,
                        m_run=mr, ns=ns, ns_min=lo, ns_max=hi, copies=copies,
                        bytes_per_call=nbytes, gbs=nbytes / ns,
                        tops=2.0 * mr * n * k / ns / 1e3)), flush=True)
                except Exception as ex:
                    print(json.dumps(dict(bench="peer", kind=name, n=n, k=k,
                                          m=m, error=str(ex)[:300])), flush=True)
                torch.cuda.empty_cache()
            del ws
            torch.cuda.empty_cache()
            print("peers_gpu: %s %dx%d done, %.0f s" % (name, n, k, time.time() - t0),
                  file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
