#!/usr/bin/env python3
"""Decode through 32 Llama-shaped blocks on a GPU, in one CUDA graph, with
the linear layers as bf16 nn.Linear, as tinygemm int4 and as qlinear q4g in
mapped mode (qlinear.torch, mode="mapped": the daemon's resident layouts
mapped into this process, qlinear's kernel on the current stream).

    python3 mapped_decode.py [ADDRESS] [--sets S] [--blocks B] [--clients C]

A block is q, k, v and o (4096x4096), gate and up (14336x4096) and down
(4096x14336), joined by elementwise ops (no attention: only the linear
layers are compared). The weights come in S sets (default 2, past the
50 MB L2 of an H100) that the blocks take in turn. The daemon at ADDRESS
(default: the client's default) must serve a CUDA device. It prints per
kind the graph's time per replay (median of 7, each of 3 replays) and the
ratios; first, for each shape, whether the mapped call gives the same
bytes as the daemon's own weight-only launch. With --clients C, C more
processes then map every weight, one after another, and each says how
much device memory its mappings added (cudaMemGetInfo before and after,
its own context already made): one resident copy serves them all.
"""
import argparse
import json
import subprocess
import sys

import torch
import torch.nn.functional as F

import qlinear
import qlinear.torch as qt

SHAPES = {"q": (4096, 4096), "k": (4096, 4096), "v": (4096, 4096),
          "o": (4096, 4096), "g": (14336, 4096), "u": (14336, 4096),
          "d": (4096, 14336)}
GS = 128


def graph_us(fn, reps=7, inner=3):
    """Median microseconds per replay of fn captured in a CUDA graph."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        fn()  # warm-up outside the capture (kernels load lazily)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(reps):
        e0.record()
        for _ in range(inner):
            g.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3 / inner)
    return sorted(ts)[reps // 2]


def client_role(a):
    """--as-client: hold and map every weight, print the memory it took."""
    dev = torch.device("cuda", torch.cuda.current_device())
    c = qlinear.Client(a.address, name="mapped_decode-client")
    torch.empty(1, device=dev)  # the context first: not the mappings'
    torch.cuda.synchronize()
    before, _ = torch.cuda.mem_get_info(dev)
    mods = []
    for s in range(a.sets):
        for key, (n, k) in SHAPES.items():
            name = "example/mapped/s%d/%s" % (s, key)
            c.hold(name)
            mods.append(qt.QLinear(c, name, k, n).map(dev, torch.bfloat16,
                                                       16))
    torch.cuda.synchronize()
    after, _ = torch.cuda.mem_get_info(dev)
    print(json.dumps({"added_bytes": before - after}), flush=True)
    for q in mods:
        q.unmap()
    c.close()
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("address", nargs="?")
    ap.add_argument("--sets", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=32)
    ap.add_argument("--clients", type=int, default=0)
    ap.add_argument("--as-client", action="store_true",
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.as_client:
        return client_role(a)
    dev = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)
    c = qlinear.Client(a.address, name="mapped_decode")
    bf, tg, mp = {}, {}, {}
    for s in range(a.sets):
        for key, (n, k) in SHAPES.items():
            name = "example/mapped/s%d/%s" % (s, key)
            lin = torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16,
                                  device=dev)
            with torch.no_grad():
                lin.weight.normal_(0, 0.02)
            bf[name] = lin.weight
            # tinygemm's packed int4 (random codes: its time does not
            # depend on them)
            codes = torch.randint(0, 256, (n, k // 2), device=dev,
                                  dtype=torch.uint8)
            tg[name] = (torch.ops.aten._convert_weight_to_int4pack(codes, 8),
                        torch.randn(k // GS, n, 2, device=dev,
                                    dtype=torch.bfloat16) * 0.01)
            mp[name] = qt.QLinear.from_linear(lin, c, "q4g128", name=name,
                                              mode="mapped", max_rows=16)

    bad = 0
    for key, (n, k) in SHAPES.items():
        name = "example/mapped/s0/%s" % key
        x = torch.randn(3, k, dtype=torch.bfloat16)
        y = mp[name](x.to(dev)).cpu()
        yd = torch.empty(3, n, dtype=torch.bfloat16)
        c.linear_raw(name, "bf16", 3, k, x.data_ptr(), n, yd.data_ptr(),
                     path="wo")
        same = torch.equal(y.view(torch.int16), yd.view(torch.int16))
        bad += not same
        print("%-6s %5dx%-5d mapped == daemon: %s" % (key, n, k, same))

    def blocks(linear):
        def run(h):
            for b in range(a.blocks):
                p = "example/mapped/s%d/" % (b % a.sets)
                q, kk, v = (linear(p + "q", h), linear(p + "k", h),
                            linear(p + "v", h))
                h2 = h + linear(p + "o", q + kk + v)
                gate, up = linear(p + "g", h2), linear(p + "u", h2)
                h = h2 + linear(p + "d", F.silu(gate) * up)
            return h
        return run

    kinds = {
        "bf16 F.linear": blocks(lambda nm, h: F.linear(h, bf[nm])),
        "tinygemm int4": blocks(lambda nm, h: torch.ops.aten
                                ._weight_int4pack_mm(h, tg[nm][0], GS,
                                                     tg[nm][1])),
        "qlinear q4g mapped": blocks(lambda nm, h: mp[nm](h)),
    }
    x1 = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    us = {}
    for _ in range(2):  # two interleaved rounds; the better of each
        for kind, fn in kinds.items():
            t = graph_us(lambda: fn(x1))
            us[kind] = min(us.get(kind, t), t)
    for kind, t in us.items():
        print("%-20s %9.1f us per decode step (%d blocks)"
              % (kind, t, a.blocks))
    m = us["qlinear q4g mapped"]
    print("mapped / bf16 = %.3f, mapped / tinygemm = %.3f"
          % (m / us["bf16 F.linear"], m / us["tinygemm int4"]))
    if a.clients > 0:
        resident = sum(d.bytes_resident for d in c.stats().devices
                       if d.device.startswith("cuda"))
        added = []
        for _ in range(a.clients):
            argv = [sys.executable, __file__, "--as-client",
                    "--sets", str(a.sets)]
            if a.address:
                argv.append(a.address)
            out = subprocess.run(argv, capture_output=True, text=True,
                                 check=True).stdout
            added.append(json.loads(out.strip().splitlines()[-1])
                         ["added_bytes"])
        print("%d clients mapped %.1f MiB of weights: they added %s bytes; "
              "(daemon + clients) / one copy = %.3f"
              % (a.clients, resident / 2**20, added,
                 (resident + sum(added)) / resident))
    for q in mp.values():
        q.unmap()
    c.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
