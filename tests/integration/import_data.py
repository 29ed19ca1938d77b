#!/usr/bin/env python3
"""import_data.py - files for test_import.sh, with the standard library only.

  import_data.py float DIR   a float checkpoint written here: DIR/model.safetensors
                             (layers.0.proj.weight f32 [64,128] + bias,
                             layers.1.up.weight f16 [32,64], norm.weight 1-D),
                             the same split into two shards with
                             DIR/sharded/model.safetensors.index.json, and
                             w0.npy / b0.npy / x0.npy / x1.npy for comparing
  import_data.py bad DIR     malformed checkpoints: truncated.safetensors,
                             overlap.safetensors, dtype.safetensors,
                             hugeheader.safetensors, and unknown.safetensors
                             (a quantization of no layout we know)
  import_data.py mixed SRC DIR
                             DIR/model.safetensors: the GPTQ checkpoint SRC
                             plus a float lm_head.weight; SRC's config.json
  import_data.py big DIR LAYERS K N
                             DIR/model.safetensors: LAYERS random GPTQ 4-bit
                             g128 layers [N,K], and its config.json
  import_data.py peakanon OUT CMD...
                             runs CMD, writes its peak heap (KiB) to OUT
  import_data.py x K M FILE  an f32 .npy [M,K] of activations
  import_data.py check REF MODEL X Y
                             Y [M,N] (.npy from qlinearctl linear) against
                             X·deq_f32ᵀ + bias, deq_f32 from REF (a
                             ref.safetensors of tests/data/ckpt, or a
                             golden w_deq.npy), the bias from MODEL: exit 1
                             past a relative 1e-5
"""
import json
import math
import os
import random
import struct
import sys


def npy(path, code, shape, values):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        code, "%d," % shape[0] if len(shape) == 1 else ", ".join(map(str, shape)))
    total = 10 + len(header) + 1
    header += " " * ((64 - total % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)))
        f.write(header.encode("latin1"))
        f.write(struct.pack("<%d%s" % (len(values), "e" if code == "<f2" else "f"), *values))


def read_npy(path):
    b = open(path, "rb").read()
    hl = struct.unpack("<H", b[8:10])[0]
    h = b[10:10 + hl].decode()
    shape = tuple(int(s) for s in h.split("(")[1].split(")")[0].split(",") if s.strip())
    n = 1
    for d in shape:
        n *= d
    return shape, struct.unpack("<%df" % n, b[10 + hl:10 + hl + 4 * n])


def st_bytes(tensors, hdr_len=None):
    """tensors: list of (name, dtype, shape, raw bytes)."""
    header, off, data = {"__metadata__": {"format": "pt"}}, 0, b""
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h) if hdr_len is None else hdr_len) + h + data


def gauss(rng, n, s):
    return [rng.gauss(0, s) for _ in range(n)]


def cmd_float(d):
    rng = random.Random(5)
    os.makedirs(os.path.join(d, "sharded"), exist_ok=True)
    w0, b0 = gauss(rng, 64 * 128, 0.05), gauss(rng, 64, 0.1)
    w1 = [round(v, 3) for v in gauss(rng, 32 * 64, 0.05)]
    norm = [1.0] * 128
    t0 = [("layers.0.proj.weight", "F32", [64, 128], struct.pack("<%df" % len(w0), *w0)),
          ("layers.0.proj.bias", "F32", [64], struct.pack("<%df" % len(b0), *b0))]
    t1 = [("layers.1.up.weight", "F16", [32, 64], struct.pack("<%de" % len(w1), *w1)),
          ("norm.weight", "F32", [128], struct.pack("<128f", *norm))]
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(st_bytes(t0 + t1))
    idx = {"metadata": {}, "weight_map": {}}
    for i, part in enumerate((t0, t1)):
        name = "model-%05d-of-00002.safetensors" % (i + 1)
        with open(os.path.join(d, "sharded", name), "wb") as f:
            f.write(st_bytes(part))
        for t in part:
            idx["weight_map"][t[0]] = name
    with open(os.path.join(d, "sharded", "model.safetensors.index.json"), "w") as f:
        json.dump(idx, f)
    npy(os.path.join(d, "w0.npy"), "<f4", (64, 128), w0)
    npy(os.path.join(d, "b0.npy"), "<f4", (64,), b0)
    npy(os.path.join(d, "x0.npy"), "<f4", (3, 128), gauss(rng, 3 * 128, 1.0))
    npy(os.path.join(d, "x1.npy"), "<f2", (2, 64), [round(v, 2) for v in gauss(rng, 128, 1.0)])


def cmd_bad(d):
    os.makedirs(d, exist_ok=True)
    good = st_bytes([("a.weight", "F32", [4, 8], bytes(128))])
    open(os.path.join(d, "truncated.safetensors"), "wb").write(good[:-5])
    open(os.path.join(d, "hugeheader.safetensors"), "wb").write(
        st_bytes([("a.weight", "F32", [4, 8], bytes(128))], hdr_len=1 << 20))
    h = {"a.weight": {"dtype": "F32", "shape": [4, 8], "data_offsets": [0, 128]},
         "b.weight": {"dtype": "F32", "shape": [4, 8], "data_offsets": [64, 192]}}
    hb = json.dumps(h).encode()
    open(os.path.join(d, "overlap.safetensors"), "wb").write(
        struct.pack("<Q", len(hb)) + hb + bytes(192))
    # compressed-tensors' pack-quantized layout: not a layout we know.
    open(os.path.join(d, "unknown.safetensors"), "wb").write(st_bytes(
        [("l.weight_packed", "I32", [4, 1], bytes(16)),
         ("l.weight_scale", "F16", [4, 1], bytes(8))]))
    h = {"a.weight": {"dtype": "F4", "shape": [4, 8], "data_offsets": [0, 16]}}
    hb = json.dumps(h).encode()
    open(os.path.join(d, "dtype.safetensors"), "wb").write(
        struct.pack("<Q", len(hb)) + hb + bytes(16))


def cmd_mixed(src, d):
    """The GPTQ checkpoint in src with an unquantized lm_head.weight added,
    as real GPTQ checkpoints have."""
    os.makedirs(d, exist_ok=True)
    b = open(os.path.join(src, "model.safetensors"), "rb").read()
    hl = struct.unpack("<Q", b[:8])[0]
    tensors = []
    for name, e in json.loads(b[8:8 + hl]).items():
        if name != "__metadata__":
            lo, hi = e["data_offsets"]
            tensors.append((name, e["dtype"], e["shape"], b[8 + hl + lo:8 + hl + hi]))
    rng = random.Random(3)
    tensors.append(("lm_head.weight", "F16", [16, 32],
                    struct.pack("<512e", *[round(v, 2) for v in gauss(rng, 512, 0.1)])))
    open(os.path.join(d, "model.safetensors"), "wb").write(st_bytes(tensors))
    with open(os.path.join(src, "config.json")) as f:
        cfg = f.read()
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write(cfg)


def cmd_big(d, layers, k, n):
    """DIR/model.safetensors: LAYERS GPTQ 4-bit g128 asymmetric layers
    [N, K] of random nibbles, for the import's peak memory."""
    os.makedirs(d, exist_ok=True)
    g = k // 128
    scales = struct.pack("<e", 0.01) * (g * n)
    tensors = []
    for i in range(layers):
        x = "model.layers.%d.mlp.down_proj" % i
        tensors += [(x + ".qweight", "I32", [k // 8, n], os.urandom(k // 8 * n * 4)),
                    (x + ".qzeros", "I32", [g, n // 8], os.urandom(g * n // 8 * 4)),
                    (x + ".scales", "F16", [g, n], scales)]
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(st_bytes(tensors))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"quantization_config": {"quant_method": "gptq", "bits": 4,
                                           "group_size": 128, "sym": False,
                                           "desc_act": False}}, f)


def cmd_peakanon(out, cmd):
    """Runs cmd and writes the most anonymous memory (KiB, RssAnon: the
    heap, not the mapped checkpoint) seen in it, polled each millisecond,
    to out; exits with its status. Polling can miss a short peak, never
    invent one."""
    import subprocess
    import time
    p = subprocess.Popen(cmd)
    peak = 0
    while p.poll() is None:
        try:
            with open("/proc/%d/status" % p.pid) as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        peak = max(peak, int(line.split()[1]))
        except OSError:
            pass
        time.sleep(0.001)
    with open(out, "w") as f:
        f.write("%d\n" % peak)
    sys.exit(p.returncode)


def cmd_x(k, m, path):
    rng = random.Random(11)
    npy(path, "<f4", (m, k), gauss(rng, m * k, 1.0))


def st_read(path):
    """{name: (dtype, shape, values)} of a safetensors file (F32/F16)."""
    b = open(path, "rb").read()
    hl = struct.unpack("<Q", b[:8])[0]
    out = {}
    for name, e in json.loads(b[8:8 + hl]).items():
        if name == "__metadata__" or e["dtype"] not in ("F32", "F16", "BF16"):
            continue
        lo, hi = e["data_offsets"]
        raw = b[8 + hl + lo:8 + hl + hi]
        if e["dtype"] == "BF16":  # the upper half of an f32
            vals = struct.unpack("<%df" % (len(raw) // 2), b"".join(
                b"\0\0" + raw[i:i + 2] for i in range(0, len(raw), 2)))
        else:
            code = "f" if e["dtype"] == "F32" else "e"
            vals = struct.unpack("<%d%s" % (len(raw) // struct.calcsize(code), code), raw)
        out[name] = (e["shape"], vals)
    return out


def cmd_check(ref, model, xp, yp):
    if ref.endswith(".npy"):
        (n, k), w = read_npy(ref)
    else:
        (n, k), w = st_read(ref)["deq_f32"]
    bias = [v for name, (_, v) in st_read(model).items() if name.endswith(".bias")]
    bias = bias[0] if bias else [0.0] * n
    (m, kx), x = read_npy(xp)
    (my, ny), y = read_npy(yp)
    assert kx == k and my == m and ny == n, ((m, kx), (my, ny), (n, k))
    worst = 0.0
    for i in range(m):
        for j in range(n):
            ref_v = math.fsum([x[i * k + t] * w[j * k + t] for t in range(k)] + [bias[j]])
            norm = math.fsum([abs(x[i * k + t] * w[j * k + t]) for t in range(k)] + [abs(bias[j])])
            # q4g sums s·Σx·q and zero·Σx per group: where ŵ = q·s + zero
            # cancels to 0 (an all-zero row) the result is rounding of
            # order u·|zero|·Σ|x|, not 0: allowed up to 1e-5·norm + 1e-9.
            worst = max(worst, abs(y[i * n + j] - ref_v) / max(norm + 1e-4, 1e-30))
    print("worst relative error %.3g" % worst)
    sys.exit(0 if worst < 1e-5 else 1)


if __name__ == "__main__":
    a = sys.argv[1:]
    {"float": lambda: cmd_float(a[1]), "bad": lambda: cmd_bad(a[1]),
     "x": lambda: cmd_x(int(a[1]), int(a[2]), a[3]),
     "mixed": lambda: cmd_mixed(a[1], a[2]),
     "big": lambda: cmd_big(a[1], int(a[2]), int(a[3]), int(a[4])),
     "peakanon": lambda: cmd_peakanon(a[1], a[2:]),
     "check": lambda: cmd_check(a[1], a[2], a[3], a[4])}[a[0]]()
