"""torch.ops.qlinear under torch.compile and torch.export: custom ops that
trace without graph breaks, opcheck per op and dtype, tiny Llama and Qwen2
causal LMs (random weights from a config, no hub) swapped and compiled
(inductor, fullgraph) or exported, one compile for repeated blocks, an
exported program run in a fresh process, bad input in compiled code, and
what Hugging Face utilities meet on a swapped model.

Compiling is slow on few cores: the models are tiny (2 layers, hidden 64,
vocabulary 128) and compiled models are shared by module-scoped fixtures.
"""

import copy
import subprocess
import sys
import textwrap

import pytest
import torch
import transformers
from torch import nn

import qlinear
import qlinear.torch as qt
from qlinear import _ops

ARCHS = ["llama", "qwen2"]
N_LINEARS = 2 * 7 + 1  # q k v o gate up down per layer, and lm_head


def build(arch, layers=2, tie=False):
    """A tiny causal LM of that architecture, seeded random weights."""
    torch.manual_seed(0)
    kw = dict(hidden_size=64, intermediate_size=128,
              num_hidden_layers=layers, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=128,
              max_position_embeddings=64, tie_word_embeddings=tie)
    if arch == "llama":
        m = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw))
    else:
        m = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw))
    return m.eval()


def ids_of(b=2, t=6, seed=1):
    return torch.randint(0, 128, (b, t),
                         generator=torch.Generator().manual_seed(seed))


class Logits(nn.Module):
    """model(input_ids) -> logits, without a cache: what is exported."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids):
        return self.m(input_ids=ids, use_cache=False).logits


def greedy(fn, ids, steps):
    """Greedy tokens from fn(ids) -> logits, the whole prefix each step."""
    for _ in range(steps):
        nxt = fn(ids)[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
    return ids


class Recorder:
    """Every real qlinear kernel run while active: (op, names, x, ys)."""

    def __init__(self):
        self.calls = []

    def __call__(self, op, names, x, ys):
        self.calls.append((op, tuple(names), x.clone(),
                           [y.clone() for y in ys]))

    def __enter__(self):
        _ops.observers.append(self)
        return self

    def __exit__(self, *exc):
        _ops.observers.remove(self)


@pytest.fixture(scope="module")
def mclient(daemon):
    c = qlinear.Client(daemon.address)
    yield c
    c.close()


@pytest.fixture(scope="module", params=ARCHS)
def swapped(request, mclient):
    """(arch, swapped model, its compiled fullgraph inductor form)."""
    m = build(request.param)
    sw = qt.swap_linears(m, mclient, format="q8c", path="wo")
    assert len(sw) == N_LINEARS
    torch._dynamo.reset()
    return request.param, m, torch.compile(Logits(m), fullgraph=True,
                                           dynamic=True)


# ----------------------------------------------------------------- opcheck
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16,
                                   torch.float16])
def test_opcheck(mclient, dtype):
    """torch.library.opcheck on every op: schema, fake kernel against the
    real one, autograd registration, AOT dispatch; mapped mode (a GPU's)
    on meta inputs only, which runs the schema and fake kernel checks."""
    torch.manual_seed(4)
    qs = [qt.QLinear.from_linear(nn.Linear(64, n).to(dtype), mclient, "q8c",
                                 module_name="opcheck.%d" % n, path="wo")
          for n in (32, 48)]
    x = torch.randn(3, 5, 64, dtype=dtype)
    xs = torch.randn(64, 10, dtype=dtype).t()[None].expand(2, 10, 64)
    for inp in (x, xs):
        torch.library.opcheck(torch.ops.qlinear.linear.default,
                              (inp, qs[0].qlinear_id, 32, 1))
        torch.library.opcheck(torch.ops.qlinear.linear_multi.default,
                              (inp, [q.qlinear_id for q in qs], [32, 48], 1))
    # A real result of the op, checked against the module and its dtype.
    y = torch.ops.qlinear.linear(x, qs[0].qlinear_id, 32, 1)
    assert y.dtype == dtype and y.shape == (3, 5, 32)
    with torch.no_grad():
        assert torch.equal(y, qs[0](x))
    ys = torch.ops.qlinear.linear_multi(x, [q.qlinear_id for q in qs],
                                        [32, 48], 1)
    assert torch.equal(ys[0], y) and ys[1].shape == (3, 5, 48)
    xm = torch.empty(4, 64, dtype=dtype, device="meta")
    torch.library.opcheck(torch.ops.qlinear.linear_mapped.default,
                          (xm, qs[0].qlinear_id, 32, 64))
    # The tags: call mode splits a CUDA graph, mapped mode does not.
    assert torch.Tag.cudagraph_unsafe in torch.ops.qlinear.linear.default.tags
    assert torch.Tag.cudagraph_unsafe in \
        torch.ops.qlinear.linear_multi.default.tags
    assert torch.Tag.cudagraph_unsafe not in \
        torch.ops.qlinear.linear_mapped.default.tags


# ------------------------------------------------------- compile and export
def test_explain_no_graph_breaks(swapped, grad_mode):
    arch, m, _ = swapped
    with grad_mode():
        ex = torch._dynamo.explain(Logits(m))(ids_of())
    assert ex.graph_break_count == 0, [str(r.reason) for r in
                                       ex.break_reasons]
    assert ex.graph_count == 1
    ops = [n.target for g in ex.graphs for n in g.graph.nodes
           if n.op == "call_function" and "qlinear" in str(n.target)]
    # In a graph every layer is its own op: fusing is eager-only.
    assert len(ops) == N_LINEARS, ops


def test_compiled_matches_eager(swapped, grad_mode):
    """Inductor, fullgraph: eager's greedy tokens, and every op of the
    compiled run gives the bytes the eager module gives for its input."""
    arch, m, cm = swapped
    ids = ids_of()
    with grad_mode():
        eager = greedy(Logits(m), ids, 3)
        with Recorder() as rec:
            comp = greedy(cm, ids, 3)
        assert torch.equal(eager, comp)
        assert len(rec.calls) == 3 * N_LINEARS
        assert {c[0] for c in rec.calls} == {"linear"}
        mods = {q.weight_name: q for q in m.modules()
                if isinstance(q, qt.QLinear)}
        assert len({c[1][0] for c in rec.calls}) == N_LINEARS
        for op, (name,), x, (y,) in rec.calls:
            assert torch.equal(mods[name]._run(x), y), name
        # Eager fuses q/k/v and gate/up through linear_multi: same bytes.
        with Recorder() as rec:
            y_eager = Logits(m)(ids)
        assert sum(c[0] == "linear_multi" for c in rec.calls) == 4
        assert torch.allclose(cm(ids), y_eager, rtol=1e-4, atol=1e-5)


def test_generate_compiled(swapped, grad_mode):
    arch, m, _ = swapped
    ids = ids_of(1, 5)
    with grad_mode():
        ref = m.generate(ids, max_new_tokens=3, do_sample=False)
        m2 = copy.copy(m)
        m2.forward = torch.compile(m.forward, dynamic=True)
        out = m2.generate(ids, max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 8) and torch.equal(out, ref)


def test_export_dynamic_and_load_elsewhere(swapped, daemon, tmp_path,
                                           grad_mode):
    """torch.export with dynamic batch and length: the qlinear ops are in
    the graph; the program matches eager, and saved and loaded in a fresh
    process it runs against the daemon (the default client)."""
    arch, m, _ = swapped
    b, s = torch.export.Dim("b", max=8), torch.export.Dim("s", max=32)
    ep = torch.export.export(Logits(m), (ids_of(),),
                             dynamic_shapes={"ids": {0: b, 1: s}})
    ops = [n for n in ep.graph.nodes if n.op == "call_function" and
           str(n.target).startswith("qlinear.")]
    assert len(ops) == N_LINEARS
    small = ids_of(1, 3, seed=2)
    with grad_mode():
        assert torch.equal(ep.module()(ids_of()), Logits(m)(ids_of()))
        ref = Logits(m)(small)
        assert torch.equal(ep.module()(small), ref)
    path = tmp_path / "model.pt2"
    torch.export.save(ep, str(path))
    torch.save(small, str(tmp_path / "ids.pt"))
    script = textwrap.dedent("""
        import sys, torch, qlinear, qlinear.torch as qt
        qt.set_default_client(qlinear.Client(sys.argv[1]))
        ep = torch.export.load(sys.argv[2])
        with torch.inference_mode():
            y = ep.module()(torch.load(sys.argv[3]))
        torch.save(y.clone(), sys.argv[4])
    """)
    r = subprocess.run([sys.executable, "-c", script, daemon.address,
                        str(path), str(tmp_path / "ids.pt"),
                        str(tmp_path / "y.pt")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert torch.equal(torch.load(str(tmp_path / "y.pt")), ref)


def test_regional_compile_once(mclient, grad_mode):
    """Each of 4 identical decoder layers compiled on its own compiles one
    graph: the ident is a graph input, not a guarded constant."""
    m = build("llama", layers=4)
    ref = copy.deepcopy(m)
    qt.swap_linears(m, mclient, format="q8c", path="wo")
    qt.swap_linears(ref, mclient, format="q8c", path="wo")
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    for layer in m.model.layers:
        layer.compile(backend="eager", fullgraph=True)
    ids = ids_of()
    with grad_mode():
        with Recorder() as rec:
            y = Logits(m)(ids)
        assert torch.equal(y, Logits(ref)(ids))
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    # every layer's weights were served, each by its own name
    assert len({c[1][0] for c in rec.calls}) == 4 * 7 + 1


# ---------------------------------------------------------------- bad input
def test_bad_input_compiled(mclient, grad_mode):
    """Wrong dtype or last dimension raise QLinearError naming the layer,
    what it takes and what it was given, in compiled code too."""
    torch.manual_seed(5)
    q = qt.QLinear.from_linear(nn.Linear(64, 32), mclient, "q8c",
                               module_name="bad.proj")
    torch._dynamo.reset()
    cq = torch.compile(q, fullgraph=True, backend="inductor")
    with grad_mode():
        x = torch.randn(3, 64)
        assert torch.equal(cq(x), q(x))
        for fn in (q, cq):
            with pytest.raises(qlinear.QLinearError) as e:
                fn(torch.randn(3, 64, dtype=torch.float64))
            assert e.value.code == qlinear.QL_EDTYPE
            assert "bad.proj" in str(e.value) and "float64" in str(e.value)
            with pytest.raises(qlinear.QLinearError) as e:
                fn(torch.randn(3, 60))
            assert e.value.code == qlinear.QL_ESHAPE
            assert "bad.proj" in str(e.value) and "[..., 64]" in \
                str(e.value) and "(3, 60)" in str(e.value)
        # a non-contiguous input is copied, not refused
        xt = torch.randn(64, 3).t()
        assert torch.equal(cq(xt), q(xt.contiguous()))


def test_daemon_gone(grad_mode):
    """A daemon that went away: QLinearError naming the layer, eager and
    compiled; no fallback, no crash."""
    from conftest import Daemon
    d = Daemon()
    try:
        c = qlinear.Client(d.address, timeout_ms=2000)
        torch.manual_seed(6)
        q = qt.QLinear.from_linear(nn.Linear(64, 32), c, "q8c",
                                   module_name="gone.proj")
        torch._dynamo.reset()
        cq = torch.compile(q, fullgraph=True)
        x = torch.randn(2, 64)
        with grad_mode():
            cq(x)
            d.proc.terminate()
            d.proc.wait(20)
            for fn in (q, cq):
                with pytest.raises(qlinear.QLinearError) as e:
                    fn(x)
                assert "gone.proj" in str(e.value)
        c.close()
    finally:
        d.stop()


# ------------------------------------------------------- Hugging Face utils
def test_hf_utilities(mclient, grad_mode):
    """resize_token_embeddings and tie_weights on a swapped model: the
    swapped lm_head offers its shape and dtype, and refuses with a clear
    QLinearError what needs its data; left unswapped, resizing works."""
    m = build("llama")
    qt.swap_linears(m, mclient, format="q8c")
    head = m.get_output_embeddings()
    assert isinstance(head, qt.QLinear)
    assert head.weight.shape == (128, 64) and head.weight.dtype == \
        torch.float32 and head.in_features == 64 and head.out_features == 128
    # Refused before anything changes (transformers' own method would
    # resize the input embeddings, then fail on the head).
    with pytest.raises(qlinear.QLinearError) as e:
        m.resize_token_embeddings(136)
    assert "lm_head" in str(e.value) and "before swap_linears" in \
        str(e.value)
    assert m.get_input_embeddings().weight.shape == (128, 64)
    assert m.config.vocab_size == 128
    with grad_mode():
        assert m(ids_of(), use_cache=False).logits.shape == (2, 6, 128)
    # What reads the weight's data gets the reason.
    with pytest.raises(qlinear.QLinearError) as e:
        head.weight.data[:4].clone()
    assert "lm_head" in str(e.value) and "qlineard" in str(e.value)
    with pytest.raises(qlinear.QLinearError) as e:
        head.weight = nn.Parameter(torch.zeros(128, 64))
    assert "lm_head" in str(e.value)
    tied = build("llama", tie=True)
    qt.swap_linears(tied, mclient, format="q8c")
    with pytest.raises(qlinear.QLinearError):
        tied.tie_weights()
    # lm_head kept as nn.Linear: HF's resizing works on the swapped rest
    m2 = build("llama")
    qt.swap_linears(m2, mclient, format="q8c", filter=r"^model\.")
    m2.resize_token_embeddings(136)
    with grad_mode():
        y = m2(ids_of(), use_cache=False).logits
    assert y.shape == (2, 6, 136)
