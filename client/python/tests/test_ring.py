"""The session's shared-memory ring (libqlinear's fast path) against the
message path: Client(ring=False) works, and the torch module and a fused
group compute the same bytes through either."""

import copy

import numpy as np
import pytest
import torch
from torch import nn

import qlinear
import qlinear.torch as qt

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Integer views for a byte comparison (NaN-safe, -0.0 distinct from 0.0).
_BITS = {torch.float32: torch.int32, torch.float16: torch.int16,
         torch.bfloat16: torch.int16}


def same_bytes(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and \
        torch.equal(a.contiguous().view(_BITS[a.dtype]),
                    b.contiguous().view(_BITS[b.dtype]))


@pytest.fixture
def pair(daemon):
    """A client with the ring (the default) and one without."""
    ring = qlinear.Client(daemon.address)
    msg = qlinear.Client(daemon.address, ring=False)
    yield ring, msg
    msg.close()
    ring.close()


def _regions_after_small_call(c, name, k):
    """How many regions one small linear call adds to the daemon: a ring
    client stages a tensor that is not in a region through a region of
    libqlinear's own (made on first use), while the message path carries
    it inline and makes none."""
    before = c.stats().regions
    c.linear(name, np.ones((1, k), np.float32))
    return c.stats().regions - before


def test_ring_false(daemon, rng):
    """Client(ring=False) loads, computes and closes as usual, and with
    the same bytes as a client that has the ring."""
    w = rng.standard_normal((48, 96)).astype(np.float32)
    b = rng.standard_normal(48).astype(np.float32)
    x = rng.standard_normal((5, 96)).astype(np.float32)
    with qlinear.Client(daemon.address, ring=False) as msg, \
            qlinear.Client(daemon.address) as ring:
        msg.load("ring/false", w, b, format="q8c")
        assert _regions_after_small_call(msg, "ring/false", 96) == 0
        ring.hold("ring/false")
        assert _regions_after_small_call(ring, "ring/false", 96) == 1
        for m in (5, 300):  # inline, and staged through a scratch region
            xm = np.resize(x, (m, 96))
            y = msg.linear("ring/false", xm, path="wo")
            assert y.shape == (m, 48)
            np.testing.assert_array_equal(
                y.view(np.uint32),
                ring.linear("ring/false", xm, path="wo").view(np.uint32))
        ys = msg.linear_multi(["ring/false", "ring/false"], x)
        assert all(np.array_equal(y.view(np.uint32),
                                  ys[0].view(np.uint32)) for y in ys)
        msg.unload("ring/false")
    assert msg.closed


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("path", ["wo", "aq"])
def test_qlinear_same_bytes(pair, dtype, path, grad_mode):
    """A QLinear module on a ring client and on a message client (the same
    resident weight) give byte-identical y on random inputs, small ones
    (ql_linear(), inline on the message path) and large ones (staged
    through the binding's scratch region: ql_linear_region())."""
    ring, msg = pair
    torch.manual_seed(21)
    lin = nn.Linear(96, 80).to(dtype)
    qr = qt.QLinear.from_linear(lin, ring, "q8c", module_name="ring.lin",
                                path=path)
    qm = qt.QLinear.from_linear(lin, msg, "q8c", module_name="ring.lin",
                                path=path)
    assert qm.info.shared and qm.weight_name == qr.weight_name
    g = torch.Generator().manual_seed(22)
    for shape in [(1, 96), (3, 96), (2, 7, 96), (40, 96), (3, 50, 96)]:
        x = torch.randn(shape, generator=g).to(dtype)
        with grad_mode():
            yr, ym = qr(x), qm(x)
        assert yr.shape == shape[:-1] + (80,) and yr.dtype == dtype
        assert same_bytes(yr, ym), shape
        assert torch.isfinite(yr.float()).all()


class QKV(nn.Module):
    """Self-attention's projections: fused into one linear_multi()."""

    def __init__(self, d=64):
        super().__init__()
        self.query = nn.Linear(d, d)
        self.key = nn.Linear(d, d)
        self.value = nn.Linear(d, d, bias=False)

    def forward(self, x):
        return torch.cat([self.query(x), self.key(x), self.value(x)], -1)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f16", "bf16"])
def test_fused_group_same_bytes(pair, dtype, grad_mode):
    """A fused q/k/v group (one ql_linear_multi() per forward) on a ring
    client and on a message client gives byte-identical outputs, and so
    does Client.linear_multi() on NumPy arrays."""
    ring, msg = pair
    torch.manual_seed(23)
    model = QKV().to(dtype).eval()
    mr, mm = copy.deepcopy(model), copy.deepcopy(model)
    sr = qt.swap_linears(mr, ring, format="q8c", path="wo")
    sm = qt.swap_linears(mm, msg, format="q8c", path="wo")
    gr, gm = sr["query"]._group, sm["query"]._group
    assert gr is not None and gm is not None
    g = torch.Generator().manual_seed(24)
    for i, shape in enumerate([(2, 64), (1, 9, 64), (4, 16, 64)]):
        x = torch.randn(shape, generator=g).to(dtype)
        with grad_mode():
            yr, ym = mr(x), mm(x)
        assert same_bytes(yr, ym), shape
        assert gr.enabled and gm.enabled
        assert gr.fused_calls == gm.fused_calls == i + 1
    # The binding's NumPy entry: float32 and float16 (bfloat16 as uint16).
    names = [q.weight_name for q in sr.values()]
    x = torch.randn(6, 64, generator=g).to(dtype)
    if dtype == torch.bfloat16:
        xa, kw = x.view(torch.int16).numpy().view(np.uint16), {"dtype":
                                                              "bf16"}
    else:
        xa, kw = x.numpy(), {}
    outs_r = ring.linear_multi(names, xa, **kw)
    outs_m = msg.linear_multi(names, xa, **kw)
    for a, b in zip(outs_r, outs_m):
        assert a.dtype == b.dtype and a.shape == (6, 64)
        assert a.tobytes() == b.tobytes()


def test_ring_env_off(daemon, monkeypatch):
    """QLINEAR_RING=0 refuses the ring for a client that did not."""
    monkeypatch.setenv("QLINEAR_RING", "0")
    rng = np.random.default_rng(3)
    with qlinear.Client(daemon.address) as c:
        c.load("ring/env", rng.standard_normal((8, 32)).astype(np.float32),
               format="q8c")
        assert _regions_after_small_call(c, "ring/env", 32) == 0
        c.unload("ring/env")
