#!/usr/bin/env python3
"""torch_call_gpu.py QLINEARD [ARGS] - call mode on real CUDA tensors (deploy/gpu-check's
torch part; needs a GPU, PyTorch with CUDA, and QLINEAR_LIB /
QLINEAR_CUDA_LIB naming libqlinear and libqlinear-cuda).

QLINEARD (a command: e.g. env LD_LIBRARY_PATH=... qlineard) is started
on a private socket directory. QL_PRELOAD_DIR, when set, is where
libqlinear's own dependencies (nanomsg, protobuf-c) are loaded from before
it, so that PyTorch's process gets no LD_LIBRARY_PATH of ours. It then swaps the linears of a small
model (q4g128 and q8c, on cuda:0), and runs it on CUDA tensors through
torch.ops.qlinear.linear: x and y stay on the GPU (CUDA IPC), after the
work queued on the current stream. Each output must equal, byte for byte,
the same layer on the same values given as CPU tensors (the daemon runs
both on the weight's GPU with the same kernel), on the default stream and
on a side stream, in f32 and bf16, eager and under torch.compile. Prints
one line per case and a summary; exits 1 on any mismatch or error."""

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

_pre = os.environ.get("QL_PRELOAD_DIR")
for _lib in ("libprotobuf-c.so.1", "libnanomsg.so.5"):
    if _pre and os.path.exists(os.path.join(_pre, _lib)):
        ctypes.CDLL(os.path.join(_pre, _lib), mode=ctypes.RTLD_GLOBAL)

import qlinear  # noqa: E402 (after the preloads)
import qlinear.torch as qt  # noqa: E402


def start(cmd):
    d = tempfile.mkdtemp(prefix="ql-gpu-torch-")
    sock = os.path.join(d, "sock")
    log = open(os.path.join(d, "daemon.log"), "w+")
    p = subprocess.Popen(cmd + ["--socket-dir", sock, "--state-dir",
                          os.path.join(d, "state"), "--crossover-rows", "16"],
                         stdout=log, stderr=subprocess.STDOUT)
    path = os.path.join(sock, "admin", "admin.sock")
    t = time.monotonic()
    while not os.path.exists(path):
        if p.poll() is not None or time.monotonic() - t > 30:
            log.seek(0)
            sys.exit("qlineard did not start:\n" + log.read())
        time.sleep(0.05)
    return p, d, "ipc://%s/qlineard.sock" % sock


def main():
    if len(sys.argv) < 2 or not torch.cuda.is_available():
        sys.exit("usage: torch_call_gpu.py QLINEARD [ARGS] (with CUDA)")
    proc, tmp, addr = start(sys.argv[1:])
    bad = cases = 0
    try:
        c = qlinear.Client(addr)
        torch.manual_seed(0)
        for fmt in ("q4g128", "q8c"):
            model = nn.Sequential(nn.Linear(512, 768), nn.Linear(768, 256))
            qt.swap_linears(model, c, format=fmt, fuse=None)
            for dt in (torch.float32, torch.bfloat16):
                for m in (1, 5, 40):
                    x = torch.randn(m, 512, dtype=dt)
                    with torch.inference_mode():
                        ref = model(x)
                    for how in ("default", "side", "compiled"):
                        cases += 1
                        try:
                            with torch.inference_mode():
                                xg = x.cuda()
                                if how == "side":
                                    s = torch.cuda.Stream()
                                    s.wait_stream(torch.cuda.current_stream())
                                    with torch.cuda.stream(s):
                                        y = model(xg * 1)
                                    torch.cuda.current_stream().wait_stream(s)
                                elif how == "compiled":
                                    y = torch.compile(model, fullgraph=True)(xg)
                                else:
                                    y = model(xg)
                            ok = y.is_cuda and torch.equal(
                                y.cpu().view(torch.uint8), ref.view(torch.uint8))
                        except Exception as e:  # a case that fails is reported
                            ok = False
                            print("  %s %s m=%d %s: %r" % (fmt, dt, m, how, e))
                        bad += not ok
                        print("%s %s %s m=%d %s" % ("PASS" if ok else "FAIL", fmt,
                                                    str(dt)[6:], m, how))
        c.close()
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    print("torch call mode on CUDA: %d cases, %d failed" % (cases, bad))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
