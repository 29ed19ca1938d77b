"""qlinear.torch: QLinear and swap_linears() on a small transformer-like
model built here with seeded weights, against the unmodified model."""

import copy

import numpy as np
import pytest
import torch
from torch import nn

import qlinear
import qlinear.torch as qt
from conftest import nmse
from quant import expected_nmse

D, F, HEADS = 128, 256, 4


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(D, D)
        self.k_proj = nn.Linear(D, D)
        self.v_proj = nn.Linear(D, D)
        self.o_proj = nn.Linear(D, D, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, HEADS, -1).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        a = torch.softmax(q @ k.transpose(-1, -2) / (D // HEADS) ** 0.5, -1)
        return self.o_proj((a @ v).transpose(1, 2).reshape(b, t, D))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = nn.LayerNorm(D)
        self.attn = Attention()
        self.norm2 = nn.LayerNorm(D)
        self.gate_proj = nn.Linear(D, F, bias=False)
        self.up_proj = nn.Linear(D, F, bias=False)
        self.down_proj = nn.Linear(F, D)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        h = self.norm2(x)
        return x + self.down_proj(nn.functional.silu(self.gate_proj(h)) *
                                  self.up_proj(h))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(32, D)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(D, 16)

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


class Cross(nn.Module):
    """query/key/value whose key and value read another tensor than the
    query: named like fusable siblings, but not fusable."""

    def __init__(self):
        super().__init__()
        self.query = nn.Linear(D, D)
        self.key = nn.Linear(D, D)
        self.value = nn.Linear(D, D)

    def forward(self, x, ctx):
        return self.query(x) + self.key(ctx) * self.value(ctx)


def make_model(seed=5):
    torch.manual_seed(seed)
    m = Tiny().eval()
    return m


def inputs(seed=6, b=2, t=12):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, t, 32, generator=g)


def rel_err(y, ref):
    return float((y.double() - ref.double()).norm() / ref.double().norm())


# End-to-end relative error the small model must stay under, per format: a
# few times what the two-block model measured, far below what a broken
# (unscaled, transposed, wrong-row) layer would give (order 1).
MODEL_BOUND = {"q8c": 0.03, "f8r": 0.15, "q4g128": 0.3, "q8b128": 0.03}


@pytest.mark.parametrize("fmt,path", [("q8c", "wo"), ("q8c", "aq"),
                                      ("f8r", "wo"), ("f8r", "aq"),
                                      ("q4g128", "wo"), ("q4g128", "aq"),
                                      ("q8b128", "wo")])
def test_swap_matches_model(client, fmt, path, grad_mode):
    """Every layer's output, for the input it really got, within the
    format's error model (quant.py), and the model's output close to the
    unmodified model's."""
    model = make_model()
    ref = copy.deepcopy(model)
    originals = {n: m for n, m in ref.named_modules()
                 if isinstance(m, nn.Linear)}
    swapped = qt.swap_linears(model, client, format=fmt, path=path)
    assert set(swapped) == set(originals)
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    seen = {}
    hooks = [q.register_forward_hook(
        lambda mod, inp, out, name=name: seen.__setitem__(name, (inp[0], out)))
        for name, q in swapped.items()]
    x = inputs()
    with grad_mode():
        y = model(x)
        y_ref = ref(x)
    for h in hooks:
        h.remove()
    assert y.shape == y_ref.shape and y.dtype == torch.float32
    err = rel_err(y, y_ref)
    assert 0 < err < MODEL_BOUND[fmt], err
    measured = expected = 0.0
    for name, (xin, out) in seen.items():
        lin = originals[name]
        xs = xin.reshape(-1, lin.in_features).numpy()
        w = lin.weight.detach().numpy()
        b = lin.bias.detach().numpy() if lin.bias is not None else 0
        ref_out = xs.astype(np.float64) @ w.T.astype(np.float64) + b
        r = ref_out ** 2
        measured += nmse(out.reshape(ref_out.shape).numpy(), ref_out) * r.sum()
        expected += expected_nmse(xs, w, fmt, path, b) * r.sum()
    assert 0.5 < measured / expected < 1.5, measured / expected


def test_fusion(client, grad_mode):
    """q/k/v and gate/up run as one ql_linear_multi() each, with the bytes
    of separate calls."""
    plain, fused = make_model(), make_model()
    qt.swap_linears(plain, client, format="q8c", fuse=None, path="wo")
    sw = qt.swap_linears(fused, client, format="q8c", path="wo")
    x = inputs()
    with grad_mode():
        yp, yf = plain(x), fused(x)
    assert torch.equal(yp, yf)
    groups = {id(q._group): q._group for q in sw.values() if q._group}
    assert len(groups) == 4  # per block: q/k/v and gate/up
    assert all(g.enabled and g.fused_calls == 1 for g in groups.values())
    assert plain.blocks[0].attn.q_proj._group is None
    # Explicit groups, and a group of modules that were not swapped.
    m = make_model()
    sw = qt.swap_linears(m, client, format="q8c",
                         fuse=[("blocks.0.attn.k_proj",
                                "blocks.0.attn.v_proj")])
    assert sw["blocks.0.attn.k_proj"]._group is not None
    assert sw["blocks.0.attn.q_proj"]._group is None
    with pytest.raises(qlinear.QLinearError):
        qt.swap_linears(make_model(), client, format="q8c", filter="head",
                        fuse=[("blocks.0.attn.k_proj", "head")])


def test_fusion_steps_aside_for_other_inputs(client, grad_mode):
    torch.manual_seed(3)
    m = Cross()
    ref = copy.deepcopy(m)
    sw = qt.swap_linears(m, client, format="q8c", path="wo")
    group = sw["query"]._group
    assert group is not None
    x, ctx = torch.randn(3, D), torch.randn(3, D)
    with grad_mode():
        y1, y2 = m(x, ctx), m(x, ctx)
        # The same computed member by member.
        alone = sw["query"]._run(x) + sw["key"]._run(ctx) * \
            sw["value"]._run(ctx)
        y_ref = ref(x, ctx)
    assert not group.enabled
    assert torch.equal(y1, alone) and torch.equal(y2, alone)
    assert rel_err(y1, y_ref) < 0.05
    # Same input for all three: now they agree as well.
    with grad_mode():
        assert rel_err(m(x, x), ref(x, x)) < 0.05


def test_filter_and_names(client):
    m = make_model()
    sw = qt.swap_linears(m, client, format="q8c", filter=r"\.attn\.")
    assert len(sw) == 8 and isinstance(m.head, nn.Linear)
    assert isinstance(m.blocks[1].attn.v_proj, qt.QLinear)
    m2 = make_model()
    sw2 = qt.swap_linears(m2, client, format="q4g64",
                          filter=lambda name, mod: mod.out_features == F)
    assert sorted(sw2) == ["blocks.0.gate_proj", "blocks.0.up_proj",
                           "blocks.1.gate_proj", "blocks.1.up_proj"]
    name = sw2["blocks.0.up_proj"].weight_name
    assert name.startswith("torch/Tiny/blocks.0.up_proj/q4g64.src-")
    assert client.lookup(name).format == "q4g64"
    with pytest.raises(qlinear.QLinearError):
        qt.swap_linears(nn.Linear(4, 4), client)


def test_copy_of_swapped_model(client, grad_mode):
    """A deep copy of a swapped model shares the client (the session) and
    its weights; a client cannot be pickled."""
    import pickle
    m = make_model()
    qt.swap_linears(m, client, format="q8c")
    m2 = copy.deepcopy(m)
    assert m2.head.client is client and m2.head is not m.head
    g, g2 = m.blocks[0].attn.q_proj._group, m2.blocks[0].attn.q_proj._group
    assert g2 is not g and g2.members[0] is m2.blocks[0].attn.q_proj
    x = inputs()
    with grad_mode():
        assert torch.equal(m(x), m2(x))
    assert g.fused_calls == g2.fused_calls == 1
    with pytest.raises(TypeError):
        pickle.dumps(client)


def test_same_model_shared(daemon, client, grad_mode):
    """The same model offloaded twice (another session: another process
    would be the same) uploads identical names and shares every weight."""
    a = make_model()
    sa = qt.swap_linears(a, client, format="f8r")
    with qlinear.Client(daemon.address) as other:
        b = make_model()
        sb = qt.swap_linears(b, other, format="f8r")
        assert all(q.info.shared for q in sb.values())
        assert [q.weight_name for q in sa.values()] == \
            [q.weight_name for q in sb.values()]
        x = inputs()
        with grad_mode():
            assert torch.equal(a(x), b(x))
    # A different model under the same module paths gets other names.
    c = make_model(seed=11)
    sc = qt.swap_linears(c, client, format="f8r")
    assert not any(q.info.shared for q in sc.values())


def test_tied_module_uploaded_once(client, grad_mode):
    torch.manual_seed(1)
    lin = nn.Linear(D, D)
    m = nn.Sequential(lin, nn.ReLU(), lin)
    ref = copy.deepcopy(m)
    sw = qt.swap_linears(m, client, format="q8c")
    assert sorted(sw) == ["0", "2"] and sw["0"] is sw["2"] is m[0] is m[2]
    x = torch.randn(4, D)
    with grad_mode():
        assert rel_err(m(x), ref(x)) < 0.03


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_models(client, dtype, grad_mode):
    """A model in f16/bf16 uploads its weights in that dtype and computes
    in it."""
    model = make_model()
    ref = copy.deepcopy(model)
    model = model.to(dtype)
    sw = qt.swap_linears(model, client, format="q8c")
    # q8c stores TorchAO's f32 scales, rounded to the weight's dtype
    assert sw["head"].info.scale_dtype == "f32"
    x = inputs()
    # LayerNorm and softmax in f16 are not implemented on the CPU by every
    # torch: compare one layer, then the bf16 model end to end.
    layer = model.blocks[0].gate_proj
    xl = torch.randn(5, D)
    with grad_mode():
        y = layer(xl.to(dtype))
        assert y.dtype == dtype and y.shape == (5, F)
        assert rel_err(y.float(), ref.blocks[0].gate_proj(xl)) < 0.03
        if dtype == torch.bfloat16:
            yb = model(x.to(dtype))
            assert yb.dtype == dtype
            assert rel_err(yb.float(), ref(x)) < 0.1


def test_inputs(client, daemon, grad_mode):
    torch.manual_seed(2)
    lin = nn.Linear(64, 32)
    q = qt.QLinear.from_linear(lin, client, "q8c", path="wo")
    # No rows: no request, an empty result.
    assert q(torch.empty(0, 64)).shape == (0, 32)
    # A strided view is made contiguous.
    x = torch.randn(64, 10).t()
    with grad_mode():
        assert torch.equal(q(x), q(x.contiguous()))
    # An input already in a region of the client is read in place.
    with client.region(1 << 16) as r:
        xr = qt.region_tensor(r, (10, 64))
        xr.copy_(x)
        with grad_mode():
            assert torch.equal(q(xr), q(x.contiguous()))
    # Bad input names the layer, what it takes and what it was given.
    with pytest.raises(qlinear.QLinearError) as e:
        q(torch.randn(3, 63))
    assert e.value.code == qlinear.QL_ESHAPE
    assert q.weight_name in str(e.value) and "[..., 64]" in str(e.value) \
        and "(3, 63)" in str(e.value)
    with pytest.raises(qlinear.QLinearError) as e:
        q(torch.randn(3, 64, dtype=torch.float64))
    assert e.value.code == qlinear.QL_EDTYPE
    assert q.weight_name in str(e.value) and "float64" in str(e.value)
    # A meta (or fake) input gets the fake kernel's result: shape, dtype,
    # device, no data read.
    with grad_mode():
        ym = q(torch.empty(3, 7, 64, device="meta", dtype=torch.bfloat16))
    assert ym.device.type == "meta" and ym.shape == (3, 7, 32)
    assert ym.dtype == torch.bfloat16 and ym.is_contiguous()
    # Inference only: an input that requires grad raises while grad mode
    # is on, instead of returning an output without history.
    xg = torch.randn(2, 64, requires_grad=True)
    with pytest.raises(qlinear.QLinearError) as e:
        q(xg)
    assert e.value.code == qlinear.QL_ENOTSUP and "grad" in str(e.value)
    with grad_mode():
        assert torch.equal(q(xg), q(xg.detach()))


def test_mapped_mode_refusals(client, grad_mode):
    """Mapped mode's arguments are checked before anything is mapped; the
    module stays usable through the daemon. (Mapping itself needs a GPU:
    test_cuda_daemon covers it on the emulated runtime.)"""
    torch.manual_seed(3)
    lin = nn.Linear(64, 32)
    with pytest.raises(qlinear.QLinearError) as e:
        qt.QLinear.from_linear(lin, client, "q8c", mode="remote")
    assert e.value.code == qlinear.QL_EINVAL
    q = qt.QLinear.from_linear(lin, client, "q8c", path="wo")
    for args, code in [(("cpu",), qlinear.QL_EINVAL),
                       (("cuda", torch.float64), qlinear.QL_EDTYPE),
                       (("cuda", torch.float32, 0), qlinear.QL_EINVAL),
                       (("cuda", torch.float32, 4097), qlinear.QL_EINVAL)]:
        with pytest.raises(qlinear.QLinearError) as e:
            q.map(*args)
        assert e.value.code == code, args
    assert q.mode == "call" and q._mapped is None
    q.unmap()  # not mapped: nothing to do
    # The constructor's mode= maps at once, with the same checks.
    for kw, code in [({"mode": "remote"}, qlinear.QL_EINVAL),
                     ({"mode": "mapped", "device": "cpu"}, qlinear.QL_EINVAL),
                     ({"mode": "mapped", "dtype": torch.int8},
                      qlinear.QL_EDTYPE),
                     ({"mode": "mapped", "max_rows": 0}, qlinear.QL_EINVAL)]:
        with pytest.raises(qlinear.QLinearError) as e:
            qt.QLinear(client, q.weight_name, 64, 32, **kw)
        assert e.value.code == code, kw
    direct = qt.QLinear(client, q.weight_name, 64, 32, path="wo")
    assert direct.mode == "call"
    x = torch.randn(2, 64)
    with grad_mode():
        assert q(x).shape == (2, 32)


def test_second_session_holds_without_upload(daemon, client,
                                              grad_mode):
    """A second process of the same model (here a second session) holds
    the resident weight by name: nothing is sent, and it computes the same
    bytes; the weight outlives the session that loaded it."""
    torch.manual_seed(11)
    lin = nn.Linear(256, 64)
    a = qt.QLinear.from_linear(lin, client, format="q8c",
                               module_name="hold.proj")
    assert a.info.shared is False
    other = qlinear.Client(daemon.address)
    try:
        before = client.stats().bytes_in
        b = qt.QLinear.from_linear(lin, other, format="q8c",
                                   module_name="hold.proj")
        sent = client.stats().bytes_in - before
        assert b.info.shared is True and b.weight_name == a.weight_name
        assert b.info.digest == a.info.digest
        # the float weight is 64 KiB: only a small request went out
        assert sent < 4096, sent
        x = torch.randn(3, 256)
        with grad_mode():
            ya = a(x)
        client.unload(a.weight_name)
        with grad_mode():
            yb = b(x)
        assert torch.equal(ya, yb)
        # the same name with another format is refused, not mixed up
        with pytest.raises(qlinear.QLinearError) as e:
            qt.QLinear.from_linear(lin, other, format="q4g128",
                                   name=b.weight_name)
        assert e.value.code in (qlinear.QL_EEXIST,)
    finally:
        other.close()


def test_names_tell_scale_dtype_and_policy(daemon, client):
    """A weight quantized with other scales or another policy is another
    weight: it gets another name, so a caller of the defaults is never
    served it, nor refused."""
    torch.manual_seed(12)
    lin = nn.Linear(128, 32)
    a = qt.QLinear.from_linear(lin, client, format="q4g128",
                               module_name="sd.proj", scale_dtype="f16")
    assert a.info.scale_dtype == "f16"
    other = qlinear.Client(daemon.address)
    try:
        b = qt.QLinear.from_linear(lin, other, format="q4g128",
                                   module_name="sd.proj")
        assert b.weight_name != a.weight_name
        assert b.info.scale_dtype == "f32"
        c = qt.QLinear.from_linear(lin, other, format="q4g128",
                                   module_name="sd.proj", policy="wo")
        assert c.weight_name not in (a.weight_name, b.weight_name)
        assert c.info.policy == "wo"
    finally:
        other.close()
    v = qt.weight_name(lin, "q4g128", "l", quantizer_version=2)
    assert v == qt.weight_name(lin, "q4g128", "l", quantizer_version=2,
                               scale_dtype=None, policy="auto")
