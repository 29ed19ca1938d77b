#!/usr/bin/env python3
"""
make_golden.py - golden vectors for qlinear's formats, produced by TorchAO's
own code (TorchAO 0.18.0, torch 2.15, CPU) on small seeded tensors.

Run it by hand with a Python that has torch, torchao and numpy (numpy only
because torchao.prototype.gptq, whose int4 dequantization is used below,
imports it; the .npy files are written by hand); it rewrites
tests/data/golden/. The generated files are committed and CI never runs
this script: tests/unit/test_golden.c reads them.

    /path/to/venv/bin/python tests/data/make_golden.py [OUTDIR]

Every case is one directory holding a meta.txt (key=value lines) and .npy
files (format 1.0, little-endian, written by hand below). Element types:
f32 '<f4', f16 '<f2', bf16 '<u2' (bit patterns), int8 '|i1', float8 e4m3fn
'|u1' (bytes), int32 '<i4'. golden/index.txt lists the cases.

Where TorchAO needs a package that only runs on a GPU (mslk, the successor
of fbgemm_gpu's gen_ai quantize helpers, and the XPU int4 packing kernel),
this script reproduces that function's exact op sequence with torch ops and
says so next to it; everything else is TorchAO's code called as it is.

Files of a case (shapes: N rows of W, K in_features, M rows of x, G groups):
  w.npy        [N,K]  the float weight (src dtype)
  x.npy        [M,K]  the activation (src dtype)
  qdata.npy, scale.npy, zero.npy / zero_point.npy   TorchAO's packed tensors
  w_deq.npy    [N,K]  f32: TorchAO's dequantized weight
  y_wo.npy     [M,N]  f32: x.double() @ w_deq.double().T, rounded to f32
  xq.npy, sx.npy      TorchAO's per-token activation quantization (AQ cases)
  y_aq.npy     [M,N]  f32: x_deq.double() @ w_deq.double().T (AQ cases)
"""
import os
import struct
import sys
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402

import torchao  # noqa: E402
from torchao.quantization import (  # noqa: E402
    Int4WeightOnlyConfig,
    Int8DynamicActivationInt8WeightConfig,
    Int8WeightOnlyConfig,
    quantize_,
)
from torchao.quantization.granularity import PerRow  # noqa: E402
from torchao.quantization.quant_primitives import (  # noqa: E402
    MappingType,
    choose_qparams_affine,
    dequantize_affine,
    quantize_affine,
)
from torchao.quantization.quantize_.common import (  # noqa: E402
    _choose_quant_func_and_quantize_tensor,
)
from torchao.quantization.quantize_.workflows.float8.float8_tensor import (  # noqa: E402
    Float8Tensor,
    QuantizeTensorToFloat8Kwargs,
)
import importlib  # noqa: E402

# "import a.quantize_.b as m" trips over the function quantize_ that
# torchao.quantization exports under the same name.
int4_tensor_mod = importlib.import_module(
    "torchao.quantization.quantize_.workflows.int4.int4_tensor")
from torchao.prototype.gptq.api import _int4_row_dequantize_zp  # noqa: E402

assert torchao.__version__.startswith("0.18"), torchao.__version__
assert sys.byteorder == "little"

N, K, M = 12, 256, 5

# ------------------------------------------------------------------ .npy


def npy_bytes(t, descr):
    """A version 1.0 .npy file of the 1-D or 2-D tensor t, whose element
    bytes are taken as they are (descr names their type)."""
    t = t.contiguous()
    shape = tuple(t.shape)
    assert len(shape) in (1, 2)
    if len(shape) == 1:
        sh = "(%d,)" % shape[0]
    else:
        sh = "(%d, %d)" % shape
    head = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, sh)
    total = 10 + len(head) + 1
    total = (total + 63) // 64 * 64
    head = head + " " * (total - 10 - len(head) - 1) + "\n"
    raw = bytes(t.view(torch.uint8).flatten().tolist()) if t.numel() else b""
    esz = {"<f4": 4, "<f2": 2, "<u2": 2, "|i1": 1, "|u1": 1, "<i4": 4}[descr]
    assert len(raw) == t.numel() * esz
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head.encode() + raw


DESCR = {
    torch.float32: "<f4",
    torch.float16: "<f2",
    torch.bfloat16: "<u2",
    torch.int8: "|i1",
    torch.uint8: "|u1",
    torch.float8_e4m3fn: "|u1",
    torch.int32: "<i4",
}
DTNAME = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


class Case:
    def __init__(self, outdir, name):
        self.dir = os.path.join(outdir, name)
        self.name = name
        os.makedirs(self.dir, exist_ok=True)
        self.meta = []

    def put(self, fname, t):
        with open(os.path.join(self.dir, fname + ".npy"), "wb") as f:
            f.write(npy_bytes(t, DESCR[t.dtype]))

    def kv(self, key, value):
        assert "\n" not in str(value) and "=" not in key
        self.meta.append("%s=%s" % (key, value))

    def close(self):
        with open(os.path.join(self.dir, "meta.txt"), "w") as f:
            f.write("\n".join(self.meta) + "\n")


# ------------------------------------------------------------------ inputs


def make_weight(n, k, seed):
    """An f32 [n, k] weight whose first rows are adversarial; the caller
    rounds it to bf16/f16 where needed (every special value below is exact
    in bf16 and f16)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g, dtype=torch.float32)
    # 0: all zero.
    w[0] = 0.0
    # 1: constant.
    w[1] = -0.625
    # 2: ±amax, both signs at the extreme.
    a = float(w[2].abs().max()) * 1.5
    w[2, 3] = a
    w[2, 200 % k] = -a
    # 3: int8 ties: multiples of 0.5 with amax 127.5, so the q8c scale is 1
    #    and x·(1/scale) lands on .5; -127.5 rounds (half to even) to -128.
    r = torch.randint(-255, 256, (k,), generator=g).to(torch.float32) * 0.5
    r[0], r[1] = -127.5, 127.5
    r[2], r[3], r[4], r[5] = 2.5, 3.5, -0.5, -1.5
    w[3] = r
    # 4: int4 ties at scale 1: every group of 32 spans exactly [0, 15], the
    #    other values are k + 0.5, so (x - min) / scale is an exact .5.
    r = torch.randint(0, 15, (k,), generator=g).to(torch.float32) + 0.5
    r[0::32] = 0.0
    r[1::32] = 15.0
    w[4] = r
    # 5: int4 ties at scale 0.5: range [-3.75, 3.75], odd multiples of 0.25.
    r = (torch.randint(0, 15, (k,), generator=g).to(torch.float32) * 0.5) - 3.5
    r = r + 0.25 * torch.where(torch.rand(k, generator=g) < 0.5, -1.0, 1.0)
    r = r.clamp(-3.75, 3.75)
    r[0::32] = -3.75
    r[1::32] = 3.75
    w[5] = r
    # 6: float8 ties: amax 448 makes the scale 1; 17, 19, 9.5, ... sit
    #    halfway between e4m3 neighbours, 3·2^-10 between two subnormals.
    r = torch.tensor([448.0, -448.0, 17.0, 19.0, -21.0, 9.5, 8.5, -4.25,
                      3 * 2.0**-10, -(3 * 2.0**-10), 2.0**-10, 0.1875])
    w[6] = w[6] * 3.0
    w[6, : r.numel()] = r
    # 7: groups of different character: zero, constant, wide, tiny.
    w[7] = w[7] * 1e-5
    w[7, 0:32] = 0.0
    w[7, 32:64] = 2.0
    w[7, 64:96] = w[7, 64:96] * 1e9  # a range of ~1e4
    return w


def make_wide_weight(k, seed):
    """A [64, k] f32 weight for the *_wide cases: make_weight's adversarial
    rows, then rows of Gaussian values whose magnitudes span 2^-6..2^6, so
    that the bf16/f16 roundings of many different scales (and the codes
    computed with them) are compared with TorchAO's."""
    w = make_weight(64, k, seed)
    g = torch.Generator().manual_seed(seed + 1000)
    mag = torch.exp2(torch.rand(56, 1, generator=g) * 12.0 - 6.0)
    w[8:] = w[8:] * mag
    return w


def make_activation(m, k, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g, dtype=torch.float32)
    # 1: all zero.
    x[1] = 0.0
    # 2: int8 ties (amax 127.5, scale 1), including -127.5 -> -128.
    r = torch.randint(-255, 256, (k,), generator=g).to(torch.float32) * 0.5
    r[0], r[1], r[2], r[3] = -127.5, 127.5, 0.5, -2.5
    x[2] = r
    # 3: float8 ties (amax 448, scale 1).
    x[3] = x[3] * 10.0
    x[3, :8] = torch.tensor([-448.0, 448.0, 17.0, -19.0, 9.5, 3 * 2.0**-10,
                             -(2.0**-10), 0.0])
    # 4: constant: the scale's rounding decides whether |q| is 127 or 128.
    x[4] = -0.7
    return x


def f16_tiny_rows(w, x, seed):
    """The f16 cases (f32 w and x, before the cast): the all-zero rows (w
    row 0, x row 1) become rows whose scales are f16 subnormals. TorchAO's
    float8 rowwise path applies hp_value_lb=1e-12 (when given) in the
    input's dtype, where it is 0 in f16, so an all-zero f16 row (any row
    with amax <=
    448·2^-25) gets scale 0 and NaN / ±448 codes; qlinear deliberately
    differs there (ql_quantize_rows_e4m3_src floors the scale at 2^-24,
    unit-tested), and the f32 and bf16 cases keep their all-zero rows. The
    tiny rows test what f16 subnormal scales do instead: amax 2^-10 (w) and
    3·2^-11 (x), so amax/127.5 and amax/448 are both below 2^-14 and keep
    only a few significant bits."""
    g = torch.Generator().manual_seed(seed)
    k = w.shape[1]
    r = (torch.randn(k, generator=g) * 2.0**-12).clamp(-2.0**-10, 2.0**-10)
    r[9] = 2.0**-10
    w[0] = r
    r = (torch.randn(k, generator=g) * 2.0**-11).clamp(-3 * 2.0**-11,
                                                      3 * 2.0**-11)
    r[4] = -3 * 2.0**-11
    x[1] = r


# ------------------------------------------------------------------ int4


# mslk.quantize.shuffle.int4_row_quantize_zp and pack_int4 (mslk >= 1.0.0,
# the same code as fbgemm_gpu/experimental/gen_ai/gen_ai/quantize.py), which
# TorchAO's Int4Tensor.from_hp (torchao/quantization/quantize_/workflows/
# int4/int4_tensor.py) imports; mslk only installs with CUDA, so the two
# functions are reproduced here op for op and installed in place of the
# missing import. Everything else in from_hp (scale.to(w.dtype), ...) is
# TorchAO's own code.
def mslk_int4_row_quantize_zp(x, group_size=128):
    n_bit = 4
    to_quant = torch.split(x.to(torch.float), group_size, dim=-1)
    max_val = [chunk.amax(dim=1, keepdim=True) for chunk in to_quant]
    min_val = [chunk.amin(dim=1, keepdim=True) for chunk in to_quant]
    max_int = 2**n_bit - 1
    min_int = 0
    scales = [
        (max_chunk - min_chunk).clamp(min=1e-6) / max_int
        for max_chunk, min_chunk in zip(max_val, min_val)
    ]
    zeros = [
        min_chunk + scale_chunk * (2 ** (n_bit - 1))
        for min_chunk, scale_chunk in zip(min_val, scales)
    ]
    out = [
        chunk.sub(min_chunk).div(scale_chunk).round().clamp_(min_int, max_int)
        for chunk, min_chunk, scale_chunk in zip(to_quant, min_val, scales)
    ]
    out = [(chunk - 2 ** (n_bit - 1)).to(dtype=torch.int8) for chunk in out]
    out = torch.cat(out, dim=-1)
    scales = torch.cat(scales, dim=-1).t().contiguous()
    zeros = torch.cat(zeros, dim=-1).t().contiguous()
    return out, scales, zeros


def mslk_pack_int4(x):
    low_x = x[:, ::2]
    high_x = x[:, 1::2]
    high_x = torch.bitwise_left_shift(high_x, 4)
    low_x = torch.bitwise_and(low_x, 0xF)
    return torch.bitwise_or(low_x, high_x).contiguous()


int4_tensor_mod.int4_row_quantize_zp = mslk_int4_row_quantize_zp
int4_tensor_mod.pack_int4 = mslk_pack_int4


def unpack_s4(qdata, k):
    """[N, ceil(K/2)] bytes -> [N, K] int32 in [-8, 7] (even k low)."""
    b = qdata.view(torch.uint8).to(torch.int32)
    lo, hi = b & 0xF, b >> 4
    q = torch.stack([lo, hi], dim=-1).reshape(b.shape[0], -1)[:, :k]
    return torch.where(q >= 8, q - 16, q)


def case_q4g(outdir, gs, src, k=K, seed=1, wide=False):
    name = "q4g_g%d_%s%s%s" % (gs, DTNAME[src], "" if k == K else "_k%d" % k,
                               "_wide" if wide else "")
    c = Case(outdir, name)
    w = (make_wide_weight(k, seed) if wide else make_weight(N, k, seed)).to(src)
    n = w.shape[0]
    x = make_activation(M, k, seed + 100).to(src)
    if k % gs == 0:
        # The config path, as a user runs it.
        lin = torch.nn.Linear(k, n, bias=False, dtype=src)
        lin.weight.data.copy_(w)
        quantize_(lin, Int4WeightOnlyConfig(group_size=gs,
                                            int4_packing_format="plain"))
        t = lin.weight
        fn = ("Int4WeightOnlyConfig(group_size=%d, int4_packing_format="
              "'plain') -> Int4Tensor.from_hp" % gs)
    else:
        # The config skips a K that gs does not divide; from_hp itself (and
        # int4_row_quantize_zp's torch.split) handles a short last group.
        t = int4_tensor_mod.Int4Tensor.from_hp(w, [1, gs])
        fn = "Int4Tensor.from_hp(w, [1, %d]) (the config skips K %% gs != 0)" % gs
    assert type(t).__name__ == "Int4Tensor", type(t)
    qdata, scale, zero = t.qdata, t.scale, t.zero_point
    g = (k + gs - 1) // gs
    assert qdata.dtype == torch.int8 and tuple(qdata.shape) == (n, k // 2)
    assert scale.dtype == src and tuple(scale.shape) == (g, n)
    assert zero.dtype == src and tuple(zero.shape) == (g, n)
    # TorchAO's dequantization of this form: _int4_row_dequantize_zp in
    # torchao/prototype/gptq/api.py, (q + 8)·scale + (zero - 8·scale) in f32.
    q = unpack_s4(qdata, k).to(torch.int8)
    w_deq = _int4_row_dequantize_zp(q, scale.float(), zero.float(), gs)
    # The kernel form q·scale + zero (mslk bf16i4bf16_rowwise), in f32:
    # how far it is from TorchAO's own dequantization, for the record.
    sc = scale.float().t().repeat_interleave(gs, dim=1)[:, :k]
    ze = zero.float().t().repeat_interleave(gs, dim=1)[:, :k]
    w_kern = q.float() * sc + ze
    ndiff = int((w_kern != w_deq).sum())
    y = (x.double() @ w_deq.double().t()).float()
    c.put("w", w)
    c.put("x", x)
    c.put("qdata", qdata)
    c.put("scale", scale)
    c.put("zero", zero)
    c.put("w_deq", w_deq)
    c.put("y_wo", y)
    c.kv("format", "q4g")
    c.kv("group_size", gs)
    c.kv("n", n)
    c.kv("k", k)
    c.kv("m", M)
    c.kv("src_dtype", DTNAME[src])
    c.kv("scale_dtype", DTNAME[src])
    c.kv("zero_kind", "float")
    c.kv("qdata_dtype", "i8")
    c.kv("torchao_fn", fn + " with mslk.quantize.shuffle.int4_row_quantize_zp "
         "and pack_int4 reproduced op for op (make_golden.py)")
    c.kv("dequant_fn", "torchao/prototype/gptq/api.py _int4_row_dequantize_zp")
    c.kv("dequant_vs_kernel_form_ndiff", ndiff)
    c.kv("cases", "wo")
    c.close()
    return name


# ------------------------------------------------------------------ int4 XPU


def case_q4i(outdir, gs, src, seed=2):
    """Int4PlainInt32Tensor (Int4WeightOnlyConfig(int4_packing_format=
    'plain_int32')), whose from_hp only runs on XPU or NPU. _from_hp_xpu
    (torchao/quantization/quantize_/workflows/int4/int4_plain_int32_tensor.py)
    is reproduced op for op: TorchAO's choose_qparams_affine and
    quantize_affine run on the CPU as they are; only
    torch.ops.aten._convert_weight_to_int4pack, whose XPU kernel
    (intel/torch-xpu-ops src/ATen/native/xpu/WeightInt4Pack.cpp and
    sycl/WeightInt4PackKernel.cpp) turns the uint8 [N, K/2] packing into int32
    [N, K/8] holding the same four bytes per element (little-endian), is
    replaced by a view of those bytes as int32."""
    name = "q4i_g%d_%s" % (gs, DTNAME[src])
    c = Case(outdir, name)
    w = make_weight(N, K, seed).to(src)
    x = make_activation(M, K, seed + 100).to(src)
    block_size = [1, gs]
    scale, zero_point = choose_qparams_affine(
        w, MappingType.ASYMMETRIC, block_size, torch.int32, 0, 15, 1e-6, None,
        torch.int32)
    int_data = quantize_affine(w, block_size, scale, zero_point, torch.int32,
                               0, 15)
    assert int_data.dtype == torch.int32
    packed_weight = (int_data[::, 1::2] << 4 | int_data[::, ::2]).to(torch.uint8)
    qdata = packed_weight.contiguous().view(torch.int32)  # XPU int4pack
    scale2 = scale.reshape(int_data.shape[0], -1)
    zp2 = zero_point.reshape(int_data.shape[0], -1)
    t_scale = scale2.transpose(0, 1).contiguous()
    t_zp = zp2.transpose(0, 1).contiguous().to(torch.int8)
    g = K // gs
    assert tuple(qdata.shape) == (N, K // 8)
    assert t_scale.dtype == src and tuple(t_scale.shape) == (g, N)
    assert t_zp.dtype == torch.int8 and tuple(t_zp.shape) == (g, N)
    # What the packed tensor holds. It differs from int_data where
    # quantize_affine left [0, 15]: for an all-zero f16 row the scale is
    # clamped to eps = 1e-6 (an f16 subnormal), 1.0 / scale overflows f16 to
    # Inf, 0·Inf is NaN, and NaN.to(int32) is INT_MIN, whose low nibble the
    # packing keeps (0).
    u = unpack_s4(packed_weight, K) & 0xF
    bad_rows = [i for i in range(N)
                if bool(((int_data[i] < 0) | (int_data[i] > 15)).any())]
    # TorchAO's dequantization of this form: dequantize_affine (quant_
    # primitives.py), (u - zp)·scale, here with output_dtype f32, applied to
    # the values the packed tensor holds.
    w_deq = dequantize_affine(u, block_size, scale, zero_point,
                              torch.int32, 0, 15, output_dtype=torch.float32)
    # The same weight in qlinear's canonical q4g form: q = u - 8, zero =
    # (8 - zp)·scale. The scale is widened to f32 (exact) and zero is
    # computed in f32, where (8 - zp)·scale is exact for a bf16/f16 scale;
    # then q·scale + zero = (u - zp)·scale exactly, bit for bit.
    q = (u - 8).to(torch.int8)
    canon_qdata = mslk_pack_int4(q).view(torch.uint8)
    canon_scale = t_scale.float()
    canon_zero = (8 - t_zp.to(torch.float32)) * canon_scale
    sc = canon_scale.t().repeat_interleave(gs, dim=1)
    ze = canon_zero.t().repeat_interleave(gs, dim=1)
    w_canon = q.float() * sc + ze
    assert torch.equal(w_canon, w_deq), "canonical form is not exact"
    # ... and what storing zero in the scale dtype would cost.
    ze16 = canon_zero.to(src).float().t().repeat_interleave(gs, dim=1)
    ndiff16 = int((q.float() * sc + ze16 != w_deq).sum())
    y = (x.double() @ w_deq.double().t()).float()
    c.put("w", w)
    c.put("x", x)
    c.put("qdata", qdata)
    c.put("scale", t_scale)
    c.put("zero_point", t_zp)
    c.put("w_deq", w_deq)
    c.put("y_wo", y)
    c.put("canon_qdata", canon_qdata)
    c.put("canon_scale", canon_scale)
    c.put("canon_zero", canon_zero)
    c.kv("format", "q4g")
    c.kv("group_size", gs)
    c.kv("n", N)
    c.kv("k", K)
    c.kv("m", M)
    c.kv("src_dtype", DTNAME[src])
    c.kv("scale_dtype", DTNAME[src])
    c.kv("canon_scale_dtype", "f32")
    c.kv("zero_kind", "int")
    c.kv("qdata_dtype", "i32")
    c.kv("torchao_fn", "Int4PlainInt32Tensor _from_hp_xpu reproduced on the "
         "CPU: choose_qparams_affine(ASYMMETRIC, int32, 0, 15, eps=1e-6) + "
         "quantize_affine, XPU _convert_weight_to_int4pack as a byte view")
    c.kv("dequant_fn", "torchao/quantization/quant_primitives.py "
         "dequantize_affine(output_dtype=f32)")
    c.kv("zero_in_scale_dtype_ndiff", ndiff16)
    c.kv("int_data_out_of_range_rows", ",".join(str(i) for i in bad_rows))
    c.kv("cases", "wo")
    c.close()
    return name


# ------------------------------------------------------------------ int8


def case_q8c(outdir, src, seed=3, wide=False):
    name = "q8c_%s%s" % (DTNAME[src], "_wide" if wide else "")
    c = Case(outdir, name)
    w = make_wide_weight(K, seed) if wide else make_weight(N, K, seed)
    n = w.shape[0]
    x = make_activation(M, K, seed + 100)
    if src == torch.float16:
        f16_tiny_rows(w, x, seed + 200)
    w, x = w.to(src), x.to(src)
    # Weight-only and dynamic-activation configs quantize the weight alike
    # (Int8Tensor.from_hp, choose_qparams_affine SYMMETRIC, eps = f32 eps,
    # then quantize_affine); the AQ one also carries the activation rule.
    lin = torch.nn.Linear(K, n, bias=False, dtype=src)
    lin.weight.data.copy_(w)
    quantize_(lin, Int8WeightOnlyConfig())
    wo = lin.weight
    lin = torch.nn.Linear(K, n, bias=False, dtype=src)
    lin.weight.data.copy_(w)
    quantize_(lin, Int8DynamicActivationInt8WeightConfig())
    t = lin.weight
    assert torch.equal(wo.qdata, t.qdata) and torch.equal(wo.scale, t.scale)
    assert t.qdata.dtype == torch.int8 and tuple(t.qdata.shape) == (n, K)
    assert t.scale.dtype == torch.float32 and tuple(t.scale.shape) == (n, 1)
    assert not bool(t.zero_point.any())
    w_deq = t.dequantize(torch.float32)
    # The activation exactly as Int8Tensor's linear quantizes it.
    xa = _choose_quant_func_and_quantize_tensor(x, t.act_quant_kwargs)
    assert xa.qdata.dtype == torch.int8 and tuple(xa.scale.shape) == (M, 1)
    assert not bool(xa.zero_point.any())
    x_deq = xa.dequantize(torch.float32)
    y_wo = (x.double() @ w_deq.double().t()).float()
    y_aq = (x_deq.double() @ w_deq.double().t()).float()
    c.put("w", w)
    c.put("x", x)
    c.put("qdata", t.qdata)
    c.put("scale", t.scale)
    c.put("w_deq", w_deq)
    c.put("y_wo", y_wo)
    c.put("xq", xa.qdata)
    c.put("sx", xa.scale)
    c.put("y_aq", y_aq)
    c.kv("format", "q8c")
    c.kv("group_size", K)
    c.kv("n", n)
    c.kv("k", K)
    c.kv("m", M)
    c.kv("src_dtype", DTNAME[src])
    c.kv("scale_dtype", "f32")
    c.kv("zero_kind", "none")
    c.kv("qdata_dtype", "i8")
    c.kv("torchao_fn", "Int8WeightOnlyConfig() and "
         "Int8DynamicActivationInt8WeightConfig() -> Int8Tensor.from_hp "
         "(choose_qparams_affine SYMMETRIC eps=finfo(f32).eps + quantize_affine)")
    c.kv("act_fn", "_choose_quant_func_and_quantize_tensor(x, "
         "weight.act_quant_kwargs) -> Int8Tensor.from_hp(x, PerRow())")
    c.kv("dequant_fn", "Int8Tensor.dequantize(torch.float32)")
    c.kv("cases", "wo,aq")
    c.close()
    return name


# ------------------------------------------------------------------ float8


def case_f8r(outdir, src, seed=4, wide=False):
    """Float8Tensor.from_hp with PerRow (the PLAIN path of
    Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())), whose
    torch kernel choice is _choose_scale_float8 + _quantize_affine_float8.
    The config itself refuses to run without a float8-capable GPU
    (_check_hardware_support), so from_hp is called directly, for the
    weight as the config does and for the activation as the weight's
    act_quant_kwargs would. Two variants. *_nolb: TorchAO 0.18's default.
    The config quantizes the weight with no lower bound on amax (from_hp
    without hp_value_lb) and its activation_value_lb defaults to None, so
    an all-zero row gets scale 0 and NaN codes (0/0), and TorchAO's own
    linear then gives NaN in that output column (or row, for an all-zero
    activation row). The main files: hp_value_lb=1e-12, the amax floor of
    TorchAO's float8 training (torchao/float8/float8_utils.py EPS), which
    qlinear's quantizers apply (QL_F8_AMAX_LB) so that such a row gives
    zeros; every other row is the same in both variants."""
    name = "f8r_%s%s" % (DTNAME[src], "_wide" if wide else "")
    c = Case(outdir, name)
    w = make_wide_weight(K, seed) if wide else make_weight(N, K, seed)
    n = w.shape[0]
    x = make_activation(M, K, seed + 100)
    if src == torch.float16:
        f16_tiny_rows(w, x, seed + 200)
    w, x = w.to(src), x.to(src)
    e4m3 = torch.float8_e4m3fn
    t = Float8Tensor.from_hp(w, e4m3, PerRow(), hp_value_lb=1e-12)
    t0 = Float8Tensor.from_hp(w, e4m3, PerRow())
    for tt in (t, t0):
        assert tt.qdata.dtype == e4m3 and tuple(tt.qdata.shape) == (n, K)
        assert tt.scale.dtype == torch.float32
        assert tuple(tt.scale.shape) == (n, 1)
    kw = QuantizeTensorToFloat8Kwargs(e4m3, PerRow(), hp_value_lb=1e-12)
    kw0 = QuantizeTensorToFloat8Kwargs(e4m3, PerRow())
    xa = _choose_quant_func_and_quantize_tensor(x, kw)
    xa0 = _choose_quant_func_and_quantize_tensor(x, kw0)
    w_deq = t.dequantize(torch.float32)
    x_deq = xa.dequantize(torch.float32)
    y_wo = (x.double() @ w_deq.double().t()).float()
    y_aq = (x_deq.double() @ w_deq.double().t()).float()
    c.put("w", w)
    c.put("x", x)
    c.put("qdata", t.qdata.view(torch.uint8))
    c.put("scale", t.scale)
    c.put("qdata_nolb", t0.qdata.view(torch.uint8))
    c.put("scale_nolb", t0.scale)
    c.put("w_deq", w_deq)
    c.put("y_wo", y_wo)
    c.put("xq", xa.qdata.view(torch.uint8))
    c.put("sx", xa.scale)
    c.put("xq_nolb", xa0.qdata.view(torch.uint8))
    c.put("sx_nolb", xa0.scale)
    c.put("y_aq", y_aq)
    c.kv("format", "f8r")
    c.kv("group_size", K)
    c.kv("n", n)
    c.kv("k", K)
    c.kv("m", M)
    c.kv("src_dtype", DTNAME[src])
    c.kv("scale_dtype", "f32")
    c.kv("zero_kind", "none")
    c.kv("qdata_dtype", "f8e4m3")
    c.kv("torchao_fn", "Float8Tensor.from_hp(w, float8_e4m3fn, PerRow(), "
         "hp_value_lb=1e-12) (torch kernel: _choose_scale_float8 + "
         "_quantize_affine_float8); *_nolb: hp_value_lb=None (the default)")
    c.kv("act_fn", "_choose_quant_func_and_quantize_tensor(x, "
         "QuantizeTensorToFloat8Kwargs(e4m3, PerRow(), hp_value_lb=1e-12)); "
         "*_nolb without hp_value_lb")
    c.kv("dequant_fn", "Float8Tensor.dequantize(torch.float32) "
         "(_dequantize_affine_float8)")
    c.kv("nolb_nan_weight_rows", ",".join(
        str(i) for i in range(n) if bool(t0.qdata[i].float().isnan().any())))
    c.kv("nolb_nan_act_rows", ",".join(
        str(i) for i in range(M) if bool(xa0.qdata[i].float().isnan().any())))
    c.kv("cases", "wo,aq")
    c.close()
    return name


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "golden")
    os.makedirs(outdir, exist_ok=True)
    torch.manual_seed(0)
    names = []
    for src in (torch.float32, torch.bfloat16):
        for gs in (32, 128):
            names.append(case_q4g(outdir, gs, src))
        names.append(case_q8c(outdir, src))
        names.append(case_f8r(outdir, src))
    names.append(case_q4g(outdir, 128, torch.float32, k=160, seed=5))
    # Int4PlainInt32Tensor takes only f16/bf16 weights (_from_hp_xpu asserts).
    names.append(case_q4i(outdir, 32, torch.bfloat16))
    names.append(case_q4i(outdir, 128, torch.bfloat16))
    names.append(case_q4i(outdir, 128, torch.float16))
    # f16 activations (and weights): TorchAO computes the int8 and float8
    # scales in f16 (see f16_tiny_rows for the all-zero rows).
    names.append(case_q8c(outdir, torch.float16))
    names.append(case_f8r(outdir, torch.float16))
    names.append(case_q4g(outdir, 128, torch.float16))
    # 64 rows of many magnitudes: bf16/f16 scales and codes in bulk.
    for src in (torch.bfloat16, torch.float16):
        names.append(case_q8c(outdir, src, seed=6, wide=True))
        names.append(case_f8r(outdir, src, seed=7, wide=True))
        names.append(case_q4g(outdir, 128, src, seed=8, wide=True))
    with open(os.path.join(outdir, "index.txt"), "w") as f:
        f.write("# cases written by tests/data/make_golden.py (TorchAO %s, "
                "torch %s)\n" % (torchao.__version__, torch.__version__.split("+")[0]))
        f.write("\n".join(names) + "\n")
    for n in names:
        print(n)


if __name__ == "__main__":
    main()
