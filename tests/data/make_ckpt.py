#!/usr/bin/env python3
"""
make_ckpt.py - small GPTQ and AWQ checkpoints, packed by the ecosystem's own
packers, with each packer's own dequantization of what it packed, for
tests/unit/test_ckpt_import.c.

Packers (from PyPI; run on the CPU, no GPU extension is used):
  auto-gptq 0.7.1  auto_gptq/quantization/quantizer.py  Quantizer (the
                   per-group scale and integer zero point of GPTQ's RTN
                   step), auto_gptq/nn_modules/qlinear/qlinear_cuda.py
                   QuantLinear.pack() (qweight int32 [K*bits/32, N], qzeros
                   int32 [G, N*bits/32] in the v1 "zeros - 1" form, scales,
                   g_idx) and QuantLinear.forward()'s torch dequantization
                   (the path it takes without CUDA).
  autoawq 0.2.9    awq/modules/linear/gemm.py WQLinear_GEMM.from_linear()
                   (qweight int32 [K, N/8] in AWQ's [0,2,4,6,1,3,5,7]
                   nibble order, qzeros [G, N/8], scales f16 [G, N]) and
                   awq/utils/packing_utils.py dequantize_gemm().
with torch 2.15 (CPU) and transformers 4.57 (auto-gptq's pack() refers to
transformers.pytorch_utils.Conv1D). The modules are loaded by file path
(below), so neither package's __init__ (which pulls in model code and
optional GPU extensions) runs.

The gptq_v2 case is the v1 case converted with gptqmodel's documented rule
(gptqmodel/utils/model.py convert_gptq_v1_to_v2_format_module: the packed
qzeros words plus 0x11111111 for 4 bits, 0x01010101 for 8, modulo 2^32):
the same weight, the other zero-point convention.

Run by hand, not by CI (the outputs are committed):

    PYTHONPATH=/path/to/auto_gptq-0.7.1:/path/to/autoawq-0.2.9 \
        python tests/data/make_ckpt.py [OUTDIR]      # default tests/data/ckpt

Each case is a directory:
  model.safetensors  the checkpoint as the packer's module state holds it,
                     tensors "<layer>.qweight", ".qzeros", ".scales",
                     ".g_idx" (GPTQ), ".bias"
  config.json        {"quantization_config": ...} as the packers' model
                     savers write it (quant_method, bits, group_size, sym,
                     desc_act, checkpoint_format / version)
  ref.safetensors    "deq_f32" [N, K] f32: the packer's dequantization with
                     the scales widened to f32 (exact: (u - z)*s);
                     "deq_f16" [N, K] f16: the packer's dequantization in
                     the checkpoint's own f16
"""
import importlib.util
import json
import os
import struct
import sys
import types

import torch
import transformers  # noqa: F401 (before the stub packages below)

LAYER = "model.layers.0.mlp.down_proj"


def load_by_path(modname, relpath):
    """Imports one module file of a package found on sys.path, registering
    empty parent packages so that the package's __init__ never runs."""
    parts = modname.split(".")
    for i in range(1, len(parts)):
        pkg = ".".join(parts[:i])
        if pkg not in sys.modules:
            for root in sys.path:
                d = os.path.join(root or ".", *parts[:i])
                if os.path.isdir(d):
                    m = types.ModuleType(pkg)
                    m.__path__ = [d]
                    sys.modules[pkg] = m
                    break
    for root in sys.path:
        f = os.path.join(root or ".", relpath)
        if os.path.isfile(f):
            spec = importlib.util.spec_from_file_location(modname, f)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[modname] = mod
            spec.loader.exec_module(mod)
            return mod
    raise SystemExit(f"{relpath} not found on PYTHONPATH")


quantizer = load_by_path("auto_gptq.quantization.quantizer",
                         "auto_gptq/quantization/quantizer.py")
qlinear_cuda = load_by_path("auto_gptq.nn_modules.qlinear.qlinear_cuda",
                            "auto_gptq/nn_modules/qlinear/qlinear_cuda.py")
awq_gemm = load_by_path("awq.modules.linear.gemm", "awq/modules/linear/gemm.py")
awq_pack = load_by_path("awq.utils.packing_utils", "awq/utils/packing_utils.py")

DT = {torch.float32: "F32", torch.float16: "F16", torch.int32: "I32"}


def write_st(path, tensors, metadata=None):
    """A safetensors file, written by hand (format: 8-byte little-endian
    header length, JSON header, data)."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        b = t.detach().contiguous().numpy().tobytes()
        header[name] = {"dtype": DT[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def group_params(w, bits, gs, sym):
    """Per-group scale and zero point from auto-gptq's Quantizer, [N, G]."""
    n, k = w.shape
    gs = k if gs == -1 else gs
    q = quantizer.Quantizer()
    q.configure(bits, perchannel=True, sym=sym, mse=False)
    scales, zeros = [], []
    for g in range(0, k, gs):
        q.find_params(w[:, g:g + gs], weight=True)
        scales.append(q.scale.reshape(-1))
        zeros.append(q.zero.reshape(-1))
    return torch.stack(scales, 1), torch.stack(zeros, 1)


def gptq_case(out, name, n, k, bits, gs, sym, act_order=False, v2=False,
              bias=False, seed=0):
    torch.manual_seed(seed)
    w = torch.randn(n, k) * 0.05
    lin = torch.nn.Linear(k, n, bias=bias).half()
    lin.weight.data = w.half()
    if bias:
        lin.bias.data = (torch.randn(n) * 0.1).half()
    wf = lin.weight.data.float()
    scales, zeros = group_params(wf, bits, gs, sym)
    gsz = k if gs == -1 else gs
    if act_order:
        # desc_act: columns quantized in a permuted order, so the group of
        # column k is g_idx[k], not k // gs.
        perm = torch.randperm(k, generator=torch.Generator().manual_seed(7))
        g_idx = torch.empty(k, dtype=torch.int32)
        g_idx[perm] = (torch.arange(k) // gsz).to(torch.int32)
    else:
        g_idx = (torch.arange(k) // gsz).to(torch.int32)
    ql = qlinear_cuda.QuantLinear(bits, gs, k, n, bias, weight_dtype=torch.float16)
    ql.pack(lin, scales.half().float(), zeros.float(), g_idx)
    assert (zeros >= 1).all() or sym, "auto-gptq's v1 packer mangles zero 0"
    sd = {f"{LAYER}.qweight": ql.qweight, f"{LAYER}.qzeros": ql.qzeros,
          f"{LAYER}.scales": ql.scales.half(), f"{LAYER}.g_idx": ql.g_idx}
    if bias:
        sd[f"{LAYER}.bias"] = ql.bias.half()

    # The packer's dequantization: forward() on the identity gives
    # dequant(W)^T exactly (one nonzero product per output).
    def deq(dtype):
        ql.scales = sd[f"{LAYER}.scales"].to(dtype)
        ql.bias = None
        with torch.no_grad():
            return ql(torch.eye(k, dtype=dtype)).t().contiguous()
    ref = {"deq_f32": deq(torch.float32), "deq_f16": deq(torch.float16)}

    qc = {"quant_method": "gptq", "bits": bits, "group_size": gs,
          "sym": sym, "desc_act": act_order, "checkpoint_format": "gptq"}
    if v2:
        step = 0x11111111 if bits == 4 else 0x01010101
        z = sd[f"{LAYER}.qzeros"].to(torch.int64) + step
        sd[f"{LAYER}.qzeros"] = (((z + 2**31) % 2**32) - 2**31).to(torch.int32)
        qc["checkpoint_format"] = "gptq_v2"
    save(out, name, sd, ref, qc)


def awq_case(out, name, n, k, gs, bias=False, seed=0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(k, n, bias=bias).half()
    lin.weight.data = (torch.randn(n, k) * 0.05).half()
    if bias:
        lin.bias.data = (torch.randn(n) * 0.1).half()
    # AWQ's zero-point quantizer (awq/quantize/quantizer.py pseudo_quantize,
    # zero_point=True): scale = (max - min) / 15, zero = -round(min / scale).
    w = lin.weight.data.float().reshape(-1, gs)
    mx, mn = w.amax(1, keepdim=True), w.amin(1, keepdim=True)
    scales = ((mx - mn).clamp(min=1e-5) / 15)
    zeros = (-torch.round(mn / scales)).clamp(0, 15)
    scales = scales.view(n, -1).half().float()
    zeros = zeros.view(n, -1)
    m = awq_gemm.WQLinear_GEMM.from_linear(lin, 4, gs, scales=scales.t().contiguous(),
                                           zeros=zeros.t().contiguous())
    sd = {f"{LAYER}.qweight": m.qweight, f"{LAYER}.qzeros": m.qzeros,
          f"{LAYER}.scales": m.scales.half()}
    if bias:
        sd[f"{LAYER}.bias"] = m.bias.half()
    ref = {}
    for key, dt in (("deq_f32", torch.float32), ("deq_f16", torch.float16)):
        d = awq_pack.dequantize_gemm(m.qweight, m.qzeros, m.scales.to(dt), 4, gs)
        ref[key] = d.t().contiguous().to(dt)
    qc = {"quant_method": "awq", "bits": 4, "group_size": gs,
          "zero_point": True, "version": "gemm"}
    save(out, name, sd, ref, qc)


def save(out, name, sd, ref, qc):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    write_st(os.path.join(d, "model.safetensors"), sd, {"format": "pt"})
    write_st(os.path.join(d, "ref.safetensors"), ref)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"quantization_config": qc}, f, indent=1, sort_keys=True)
        f.write("\n")
    print(name, {k: list(v.shape) for k, v in sd.items()})


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "ckpt")
    # N is a multiple of 32: both packers size qzeros as N // 32 * bits.
    gptq_case(out, "gptq4_sym_g128", 32, 256, 4, 128, True, bias=True)
    gptq_case(out, "gptq4_asym_g64", 32, 128, 4, 64, False, seed=1)
    gptq_case(out, "gptq4_asym_g32_v2", 32, 128, 4, 32, False, v2=True, seed=2)
    gptq_case(out, "gptq4_asym_perchannel", 32, 384, 4, -1, False, seed=3)
    gptq_case(out, "gptq8_sym_g128", 32, 128, 8, 128, True, seed=4)
    gptq_case(out, "gptq8_asym_g64", 32, 128, 8, 64, False, seed=5)
    gptq_case(out, "gptq4_actorder", 32, 128, 4, 64, False, act_order=True, seed=6)
    awq_case(out, "awq4_g128", 32, 256, 128, bias=True, seed=8)
    awq_case(out, "awq4_g64", 64, 128, 64, seed=9)

if __name__ == "__main__":
    main()
