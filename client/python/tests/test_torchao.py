"""bf16 and f16 weights the daemon quantizes are TorchAO 0.18's bytes: a
load() of the float weight and a load_packed() of TorchAO's own tensors
(the golden vectors tests/data/make_golden.py made with TorchAO itself)
give one weight, one digest, one resident copy. Also: what an explicit
scale dtype means, and weight names that carry the quantizer's version."""

import os

import numpy as np
import pytest
import torch
from torch import nn

import qlinear
import qlinear.torch as qt

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                      "..", "tests", "data", "golden")

# every 16-bit case of a format the daemon quantizes (q4i is import-only)
CASES = ["q8c_bf16", "f8r_bf16", "q4g_g32_bf16", "q4g_g128_bf16",
         "q8c_f16", "f8r_f16", "q4g_g128_f16",
         "q8c_bf16_wide", "f8r_bf16_wide", "q4g_g128_bf16_wide",
         "q8c_f16_wide", "f8r_f16_wide", "q4g_g128_f16_wide"]


def _meta(case):
    with open(os.path.join(GOLDEN, case, "meta.txt")) as f:
        return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)


def _npy(case, name):
    return np.load(os.path.join(GOLDEN, case, name + ".npy"))


def _arg(a, dtype):
    """A scale/zero array for load_packed: bf16 travels as uint16 bits."""
    return (a, "bf16") if dtype == "bf16" else a


def test_cases_listed():
    """Every case named here is in the golden index (no silent skip)."""
    with open(os.path.join(GOLDEN, "index.txt")) as f:
        index = {line.strip() for line in f if not line.startswith("#")}
    assert set(CASES) <= index


@pytest.mark.parametrize("case", CASES)
def test_load_and_load_packed_are_one_weight(client, case):
    m = _meta(case)
    src, n, k = m["src_dtype"], int(m["n"]), int(m["k"])
    fmt = m["format"] if m["format"] != "q4g" else "q4g%s" % m["group_size"]
    w = _npy(case, "w")
    assert w.dtype == (np.uint16 if src == "bf16" else np.float16)
    name = "py/torchao/" + case
    a = client.load(name, w, dtype=src, format=fmt)
    assert not a.shared
    assert a.scale_dtype == m["scale_dtype"]
    q = _npy(case, "qdata")
    if fmt.startswith("q4g"):
        q = q.view(np.uint8)
    s = _npy(case, "scale")
    if s.ndim == 2 and s.shape[1] == 1:  # TorchAO's [N, 1]
        s = s.reshape(-1)
    z = None
    if fmt.startswith("q4g"):
        z = _arg(_npy(case, "zero"), m["scale_dtype"])
    b = client.load_packed(name, fmt, n, k, q, _arg(s, m["scale_dtype"]), z)
    assert b.shared, "TorchAO's tensors are another weight than load()'s"
    assert b.digest == a.digest
    assert client.lookup(name).digest == a.digest
    client.unload(name)


def test_bf16_reproduction(client):
    """A 1x32 bf16 weight [1.0, 0.5, -0.25, 0.1] x 8: TorchAO's
    Int8WeightOnlyConfig stores the scale as f32 0.007873535156 (1/127.5
    rounded to bf16) and the codes x * (1/scale) rounded; load() gives
    those bytes, so load_packed() of them is the same weight."""
    w32 = np.array([1.0, 0.5, -0.25, 0.1] * 8, np.float32).reshape(1, 32)
    wb = torch.from_numpy(w32).to(torch.bfloat16)
    bits = wb.view(torch.int16).numpy().view(np.uint16)
    a = client.load("py/torchao/repro", bits, dtype="bf16", format="q8c")
    assert a.scale_dtype == "f32"
    scale = np.float32(0.00787353515625)
    assert scale == torch.tensor(1.0 / 127.5).to(torch.bfloat16).float().item()
    xw = wb.float().numpy()
    codes = np.clip(np.rint(xw * (np.float32(1.0) / scale)), -128, 127)
    codes = codes.astype(np.int8)
    assert list(codes[0, :4]) == [127, 64, -32, 13]
    b = client.load_packed("py/torchao/repro", "q8c", 1, 32, codes,
                           np.array([scale], np.float32))
    assert b.shared and b.digest == a.digest
    # The same weight quantized with f32 scales computed in f32 (the rule
    # of an explicit scale_dtype="f32") is another weight: the daemon
    # refuses it under this name.
    with pytest.raises(qlinear.QLinearError) as e:
        client.load("py/torchao/repro", bits, dtype="bf16", format="q8c",
                    scale_dtype="f32")
    assert e.value.code == qlinear.QL_EEXIST


def test_explicit_scale_dtype(client):
    """scale_dtype rounds the scale to that dtype and stores it there; only
    the default gives TorchAO's bytes for a 16-bit weight."""
    rng = np.random.default_rng(27)
    w = rng.standard_normal((24, 96)).astype(np.float32)
    bits = torch.from_numpy(w).to(torch.bfloat16).view(torch.int16) \
        .numpy().view(np.uint16)
    dflt = client.load("py/sdt/default", bits, dtype="bf16", format="f8r")
    f32 = client.load("py/sdt/f32", bits, dtype="bf16", format="f8r",
                      scale_dtype="f32")
    b16 = client.load("py/sdt/bf16", bits, dtype="bf16", format="f8r",
                      scale_dtype="bf16")
    assert (dflt.scale_dtype, f32.scale_dtype, b16.scale_dtype) == \
        ("f32", "f32", "bf16")
    assert len({dflt.digest, f32.digest, b16.digest}) == 3
    # bf16 scales hold the default's values (the same codes): the products
    # agree exactly; f32 scales are the f32 quotient: close, not equal.
    x = rng.standard_normal((3, 96)).astype(np.float32)
    yd = client.linear("py/sdt/default", x, path="wo")
    yb = client.linear("py/sdt/bf16", x, path="wo")
    yf = client.linear("py/sdt/f32", x, path="wo")
    assert np.array_equal(yd, yb)
    assert not np.array_equal(yd, yf)
    assert np.abs(yd - yf).max() <= 0.1 * np.abs(yd).max()


def test_weight_name_carries_quantizer_version(client):
    lin = nn.Linear(16, 8)
    v1 = qt.weight_name(lin, "q8c", "l", quantizer_version=1)
    with pytest.raises(TypeError):  # the daemon's version must be given
        qt.weight_name(lin, "q8c", "l")
    # the name is content-addressed: the source digest of the load, which
    # hashes the daemon's quantizer version with the content
    w, b = lin.weight.detach(), lin.bias.detach()
    assert v1 == "l/q8c.src-" + qlinear.source_digest(
        w.numpy(), b.numpy(), format="q8c", quantizer_version=1).hex()
    v2 = qt.weight_name(lin, "q8c", "l", quantizer_version=2)
    assert v2 != v1 and v2.startswith("l/q8c.src-") and len(v2) == len(v1)
    qv = client.hello().quantizer_version
    assert qv == 2
    m = qt.QLinear.from_linear(lin, client, "q8c", module_name="l")
    assert m.weight_name == qt.weight_name(lin, "q8c", "l",
                                           quantizer_version=qv)
    # the daemon computed the same digest from the bytes it received
    assert m.weight_name.endswith(".src-" + m.info.source_digest)
