"""The framework entry points: TorchAO's quantize_ with
qlinear.torchao.QlinearConfig, and Hugging Face's from_pretrained with
qlinear.hf.QlinearConfig. Both give modules whose forward is the op that
swap_linears' modules run, on weights whose bytes are TorchAO's own, and
both refuse a bad config before anything is uploaded."""

import copy
import importlib.util
import os
import re
import subprocess

import numpy as np
import pytest
import torch
from torch import nn
from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig
from torchao.quantization import quantize_
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import qlinear
import qlinear.hf as qh
import qlinear.torch as qt
import qlinear.torchao as qa

HERE = os.path.dirname(os.path.abspath(__file__))


def _tiny_llama(seed=0, dtype=torch.bfloat16, hidden=64):
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256,
                      max_position_embeddings=64, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).to(dtype).eval()


IDS = torch.tensor([[1, 5, 9, 33, 2, 7]])


def _logits(model):
    with torch.inference_mode():
        return model(IDS).logits


def _linears(model):
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, nn.Linear)]


@pytest.fixture
def cfg(daemon):
    return dict(address=daemon.address)


def test_quantize_whole_model_is_swap_linears(daemon, client, cfg):
    """quantize_ offloads every linear in place and the model answers
    exactly as swap_linears' does (the same weights, the same op)."""
    base = _tiny_llama()
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    quantize_(a, qa.QlinearConfig(format="q8c", **cfg))
    lins = _linears(a)
    assert len(lins) == 15  # 7 a layer, and lm_head
    for name, m in lins:
        assert isinstance(m.weight, qa.QlinearTensor), name
        assert m.weight.weight_name.endswith(
            ".src-" + client.lookup(m.weight.weight_name).source_digest)
    qt.swap_linears(b, client, format="q8c")
    ya, yb = _logits(a), _logits(b)
    assert torch.equal(ya, yb)
    yf = _logits(base)
    assert (ya.float() - yf.float()).abs().max() < 0.05 * yf.abs().max()


def test_quantize_one_module_in_place(cfg):
    """Given a single module, quantize_ keeps only in-place changes: the
    weight becomes a QlinearTensor, the module stays an nn.Linear."""
    lin = nn.Linear(128, 32).to(torch.bfloat16)
    x = torch.randn(3, 128, dtype=torch.bfloat16)
    with torch.no_grad():
        want = lin(x)
    quantize_(lin, qa.QlinearConfig(format="q8c", **cfg))
    assert type(lin) is nn.Linear and isinstance(lin.weight, qa.QlinearTensor)
    assert lin.weight.shape == (32, 128) and lin.weight.dtype == torch.bfloat16
    with torch.inference_mode():
        y = lin(x)
    assert y.dtype == torch.bfloat16 and y.shape == (3, 32)
    assert (y.float() - want.float()).abs().max() < 0.05 * want.abs().max()
    # Its data is not here: anything but linear says so.
    with pytest.raises(qlinear.QLinearError):
        lin.weight.t()


def test_quantize_fails_whole(daemon, client, cfg):
    """A whole-model quantize_ is one step: a layer the config cannot
    offload fails it, naming the layer, before anything is uploaded; the
    layers are named by their paths."""
    torch.manual_seed(11)
    m = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 48),
                      nn.Linear(48, 16))  # K = 48: no q4g32
    before = {w.name for w in client.list()}
    with pytest.raises(qlinear.QLinearError) as e:
        quantize_(m, qa.QlinearConfig(format="q4g32", prefix="whole/", **cfg))
    assert e.value.code == qlinear.QL_ESHAPE
    assert ": 3: in_features 48 " in str(e.value)
    assert not any(isinstance(x.weight, qa.QlinearTensor) for _, x in
                   _linears(m))
    assert {w.name for w in client.list()} == before
    # The config that fits every layer: each named by its path.
    quantize_(m, qa.QlinearConfig(format="q8c", prefix="whole/", **cfg))
    names = [x.weight.weight_name for _, x in _linears(m)]
    assert [n.split("/")[1] for n in names] == ["0", "2", "3"]


def test_quantize_failure_releases(client):
    """A daemon that refuses a layer midway (its weight budget is full):
    quantize_ fails naming that layer, what it had uploaded is unloaded,
    and no module was changed, so the model still runs as it was."""
    from conftest import Daemon
    d = Daemon(["--cpu-budget-bytes", "12000"])
    try:
        torch.manual_seed(12)
        m = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64),
                          nn.Linear(64, 64), nn.Linear(64, 64))
        x = torch.randn(2, 64)
        with torch.no_grad():
            want = m(x)
        c = qlinear.Client(d.address)
        with pytest.raises(qlinear.QLinearError) as e:
            quantize_(m, qa.QlinearConfig(format="q8c", address=d.address))
        assert e.value.code == qlinear.QL_ENOMEM, e.value
        assert re.search(r": [123]: ", str(e.value)), e.value
        assert c.list() == []
        assert not any(isinstance(x_.weight, qa.QlinearTensor)
                       for _, x_ in _linears(m))
        with torch.no_grad():
            assert torch.equal(m(x), want)
        c.close()
    finally:
        qa._clients.pop(d.address, None)
        d.stop()


def test_quantize_compiles_and_exports(cfg):
    base = _tiny_llama(seed=3)
    m = copy.deepcopy(base)
    quantize_(m, qa.QlinearConfig(format="q4g32", **cfg))
    want = _logits(m)
    torch._dynamo.reset()
    cm = torch.compile(m, fullgraph=True)
    with torch.inference_mode():
        got = cm(IDS).logits
    # Inductor fuses the model's own bf16 ops (norms, rope) its own way:
    # close, not bit-equal; the linears are the same op.
    assert (got.float() - want.float()).abs().max() < 0.02 * want.abs().max()
    lin = m.model.layers[0].mlp.down_proj
    ep = torch.export.export(lin, (torch.randn(2, 128,
                                               dtype=torch.bfloat16),))
    assert any("qlinear.linear" in str(n.target) for n in ep.graph.nodes)


def _golden_module():
    """tests/data/make_golden.py: it installs the int4 packing TorchAO
    imports from a CUDA-only package, so Int4WeightOnlyConfig runs here."""
    path = os.path.join(HERE, "..", "..", "..", "tests", "data",
                        "make_golden.py")
    spec = importlib.util.spec_from_file_location("make_golden", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _bits(t):
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def test_torchao_configs_hold_the_same_bytes(client, cfg):
    """A layer quantized by TorchAO's own Int8WeightOnlyConfig and
    Int4WeightOnlyConfig and the same layer offloaded by qlinear hold one
    weight: TorchAO's tensors, loaded packed, have qlinear's digest."""
    _golden_module()
    torch.manual_seed(11)
    src = nn.Linear(256, 48, bias=False).to(torch.bfloat16)
    # int8 per channel
    ao = copy.deepcopy(src)
    quantize_(ao, Int8WeightOnlyConfig())
    ql = copy.deepcopy(src)
    quantize_(ql, qa.QlinearConfig(format="q8c", **cfg))
    mine = client.lookup(ql.weight.weight_name)
    t = ao.weight
    scale = t.scale.float().reshape(-1).numpy()
    b = client.load_packed("py/fw/ao-int8", "q8c", 48, 256,
                           t.qdata.numpy(), scale)
    assert b.digest == mine.digest
    # int4 groupwise, group 128
    ao4 = copy.deepcopy(src)
    quantize_(ao4, Int4WeightOnlyConfig(group_size=128,
                                        int4_packing_format="plain"))
    ql4 = copy.deepcopy(src)
    quantize_(ql4, qa.QlinearConfig(format="q4g128", **cfg))
    mine4 = client.lookup(ql4.weight.weight_name)
    t4 = ao4.weight
    b4 = client.load_packed("py/fw/ao-int4", "q4g128", 48, 256,
                            t4.qdata.numpy().view(np.uint8),
                            (_bits(t4.scale), "bf16"),
                            (_bits(t4.zero_point), "bf16"))
    assert b4.digest == mine4.digest


def test_config_refused_before_upload(daemon, client, cfg):
    lin = nn.Linear(100, 16)
    before = {w.name for w in client.list()}
    with pytest.raises(qlinear.QLinearError) as e:
        quantize_(lin, qa.QlinearConfig(format="q9z", **cfg))
    assert "Linear(in_features=100" in str(e.value)
    with pytest.raises(qlinear.QLinearError) as e:
        quantize_(lin, qa.QlinearConfig(format="q4g64", **cfg))
    assert e.value.code == qlinear.QL_ESHAPE and "100" in str(e.value)
    assert isinstance(lin.weight, nn.Parameter) and \
        not isinstance(lin.weight, qa.QlinearTensor)
    with pytest.raises(qlinear.QLinearError) as e:
        quantize_(lin, qa.QlinearConfig(
            format="q8c", address="ipc://" + daemon.dir + "/nobody.sock"))
    assert e.value.code == qlinear.QL_ECONNECT
    assert {w.name for w in client.list()} == before


def _saved(tmp_path, model):
    d = str(tmp_path / "float")
    model.save_pretrained(d)
    return d


def test_from_pretrained_uploads_as_it_loads(tmp_path, client, cfg):
    """from_pretrained with qlinear's config: every decoder linear is a
    QlinearTensor, embeddings, norms and lm_head stay float in the client,
    and the answers are swap_linears' on the same float model."""
    base = _tiny_llama(seed=5)
    d = _saved(tmp_path, base)
    q = AutoModelForCausalLM.from_pretrained(
        d, quantization_config=qh.QlinearConfig(format="q8c", **cfg),
        dtype=torch.bfloat16)
    assert q.config.quantization_config.quant_method == "qlinear"
    offloaded = [n for n, m in _linears(q)
                 if isinstance(m.weight, qa.QlinearTensor)]
    assert len(offloaded) == 14 and "lm_head" not in offloaded
    name = q.model.layers[1].mlp.gate_proj.weight.weight_name
    assert name.startswith("hf/model.layers.1.mlp.gate_proj/q8c.src-")
    for n, p in q.named_parameters():
        if not isinstance(p, qa.QlinearTensor):
            assert "proj" not in n, n  # no float linear weight is left
    assert type(q.model.embed_tokens) is nn.Embedding
    assert not isinstance(q.model.embed_tokens.weight, qa.QlinearTensor)
    # The same float checkpoint loaded as is (the same attention and
    # rotary set-up) and then swapped.
    ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
    qt.swap_linears(ref, client, format="q8c",
                    filter=lambda n, m: n != "lm_head")
    assert torch.equal(_logits(q), _logits(ref))


def test_from_pretrained_refuses_before_upload(tmp_path, daemon, client):
    base = _tiny_llama(seed=6, hidden=48)  # intermediate 96
    d = _saved(tmp_path, base)
    before = {w.name for w in client.list()}
    with pytest.raises(qlinear.QLinearError) as e:
        AutoModelForCausalLM.from_pretrained(
            d, quantization_config=qh.QlinearConfig(
                format="q4g64", address=daemon.address))
    assert e.value.code == qlinear.QL_ESHAPE
    assert "model.layers.0" in str(e.value)
    with pytest.raises(qlinear.QLinearError) as e:
        AutoModelForCausalLM.from_pretrained(
            d, quantization_config=qh.QlinearConfig(
                format="q8c",
                address="ipc://" + daemon.dir + "/nobody.sock"))
    assert e.value.code == qlinear.QL_ECONNECT
    assert {w.name for w in client.list()} == before


def test_import_names_what_from_pretrained_finds(tmp_path, daemon, client):
    """One naming rule: an admin's `qlinearctl import --names content
    --prefix hf/` of a float checkpoint makes the very weights that
    from_pretrained then holds (nothing more is uploaded), and skips the
    embedding, which is no linear."""
    base = _tiny_llama(seed=8)
    d = _saved(tmp_path, base)
    ctl = os.path.join(os.environ.get("QL_BUILDDIR", "."), "qlinearctl")
    out = subprocess.run(
        [ctl, "--admin", "--address", daemon.admin_address, "import",
         os.path.join(d, "model.safetensors"), "--format", "q8c",
         "--prefix", "hf/", "--names", "content"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    assert "1 embeddings skipped" in out.stdout
    names = {w.name for w in client.list()}
    assert not any("embed_tokens" in n for n in names)
    q = AutoModelForCausalLM.from_pretrained(
        d, quantization_config=qh.QlinearConfig(format="q8c",
                                                address=daemon.address),
        dtype=torch.bfloat16)
    held = {m.weight.weight_name for _, m in _linears(q)
            if isinstance(m.weight, qa.QlinearTensor)}
    assert len(held) == 14 and held <= names
    assert {w.name for w in client.list()} == names  # nothing uploaded
    for n in held:
        assert client.lookup(n).source_digest in n


def test_no_checkpoint_without_its_weights(tmp_path, cfg):
    """torch.save and pickle of an offloaded weight raise instead of
    writing a checkpoint that lacks the linear weights (save_pretrained
    writes them: test_save_pretrained_and_reload)."""
    import io
    d = _saved(tmp_path, _tiny_llama(seed=9))
    q = AutoModelForCausalLM.from_pretrained(
        d, quantization_config=qh.QlinearConfig(format="q8c", **cfg),
        dtype=torch.bfloat16)
    with pytest.raises(qlinear.QLinearError, match="torch.save"):
        torch.save(q.state_dict(), io.BytesIO())
    lin = nn.Linear(64, 16)
    quantize_(lin, qa.QlinearConfig(format="q8c", **cfg))
    with pytest.raises(qlinear.QLinearError, match="resident in qlineard"):
        torch.save(lin, io.BytesIO())
    # A deep copy is still the same offloaded weight.
    c = copy.deepcopy(lin)
    x = torch.randn(2, 64)
    with torch.no_grad():
        assert torch.equal(c(x), lin(x))


def test_from_pretrained_missing_weight(tmp_path, daemon, client):
    """A checkpoint without one linear weight fails naming the layer, and
    the layers it had offloaded are released."""
    from safetensors.torch import load_file, save_file
    base = _tiny_llama(seed=10)
    d = _saved(tmp_path, base)
    f = os.path.join(d, "model.safetensors")
    t = load_file(f)
    del t["model.layers.1.mlp.down_proj.weight"]
    save_file(t, f, metadata={"format": "pt"})
    with pytest.raises(qlinear.QLinearError) as e:
        AutoModelForCausalLM.from_pretrained(
            d, quantization_config=qh.QlinearConfig(
                format="q8c", address=daemon.address, prefix="hf-miss/"),
            dtype=torch.bfloat16)
    assert "model.layers.1.mlp.down_proj" in str(e.value)
    assert not [w for w in client.list() if w.name.startswith("hf-miss/")]


def _offloaded_names(model):
    return {n: m.weight.weight_name for n, m in _linears(model)
            if isinstance(m.weight, qa.QlinearTensor)}


def _pack_gptq_awq(w, method, gs=32):
    """w [N, K] float32 quantized to 4-bit asymmetric groups of gs along K
    and packed as GPTQ (v1 zero points) or AWQ GEMM packs it; returns the
    tensors and the dequantized weight (u - z)·s."""
    n, k = w.shape
    g = k // gs
    wg = w.reshape(n, g, gs)
    lo = np.minimum(wg.min(-1), 0)
    hi = np.maximum(wg.max(-1), 0)
    s = ((hi - lo) / 15).astype(np.float16)
    s[s == 0] = 1
    sf = s.astype(np.float32)
    z = np.clip(np.round(-lo / sf), 1, 15).astype(np.int64)  # [N, G]
    u = np.clip(np.round(wg / sf[..., None]) + z[..., None], 0,
                15).astype(np.int64).reshape(n, k)
    deq = ((u.reshape(n, g, gs) - z[..., None]) *
           sf[..., None]).reshape(n, k)
    uk = u.T  # [K, N]
    if method == "gptq":
        qw = np.zeros((k // 8, n), np.int64)
        for i in range(8):
            qw |= uk[i::8] << (4 * i)
        zt = (z.T - 1) & 0xF  # [G, N], v1 stores z - 1
        qz = np.zeros((g, n // 8), np.int64)
        for i in range(8):
            qz |= zt[:, i::8] << (4 * i)
    else:
        order = [0, 2, 4, 6, 1, 3, 5, 7]
        qw = np.zeros((k, n // 8), np.int64)
        for i in range(8):
            qw |= uk[:, order[i]::8] << (4 * i)
        zt = z.T
        qz = np.zeros((g, n // 8), np.int64)
        for i in range(8):
            qz |= zt[:, order[i]::8] << (4 * i)
    t = {"qweight": torch.from_numpy(qw.astype(np.uint32).view(np.int32)),
         "qzeros": torch.from_numpy(qz.astype(np.uint32).view(np.int32)),
         "scales": torch.from_numpy(s.T.copy())}
    if method == "gptq":
        t["g_idx"] = torch.from_numpy((np.arange(k) // gs).astype(np.int32))
    return t, deq


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_from_pretrained_of_gptq_awq(tmp_path, daemon, client, method):
    """A GPTQ or AWQ checkpoint loaded with qlinear's config: each layer is
    converted exactly (the canonical weight is the packer's (u - z)·s, as
    `qlinearctl import` makes it: the same digests) and uploaded as it is;
    the model answers as the float model of those dequantized weights."""
    import json
    from safetensors.torch import save_file
    base = _tiny_llama(seed=17, dtype=torch.float32)
    ref = copy.deepcopy(base)
    d = str(tmp_path / method)
    base.save_pretrained(d)
    sd = {k: v.clone() for k, v in base.state_dict().items()}
    for name, m in _linears(base):
        if name == "lm_head":
            continue
        t, deq = _pack_gptq_awq(m.weight.detach().numpy(), method)
        del sd[name + ".weight"]
        for part, v in t.items():
            sd["%s.%s" % (name, part)] = v
        ref.get_submodule(name).weight.data = torch.from_numpy(
            deq.astype(np.float32))
    save_file(sd, os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(d, "config.json")) as f:
        conf = json.load(f)
    conf["quantization_config"] = (
        {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": False,
         "desc_act": False, "checkpoint_format": "gptq"}
        if method == "gptq" else
        {"quant_method": "awq", "bits": 4, "group_size": 32,
         "zero_point": True, "version": "gemm"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(conf, f)
    q = AutoModelForCausalLM.from_pretrained(
        d, quantization_config=qh.QlinearConfig(address=daemon.address,
                                                prefix=method + "/"),
        dtype=torch.float32)
    names = _offloaded_names(q)
    assert len(names) == 14
    assert all(("/q4g32.src-" in n) for n in names.values())
    got = {n: client.lookup(w).digest for n, w in names.items()}
    # qlinearctl import of the same file makes the same canonical weights.
    ctl = os.path.join(os.environ.get("QL_BUILDDIR", "."), "qlinearctl")
    out = subprocess.run(
        [ctl, "--admin", "--address", daemon.admin_address, "import",
         os.path.join(d, "model.safetensors"), "--prefix",
         "ctl-%s/" % method, "--match", "layers"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    for n in names:
        assert client.lookup("ctl-%s/%s" % (method, n)).digest == got[n], n
    want = _logits(ref)
    have = _logits(q)
    assert (have - want).abs().max() < 0.005 * want.abs().max()


def test_from_pretrained_of_a_torchao_checkpoint(tmp_path, daemon, client):
    """A checkpoint Hugging Face saved with TorchAO's own method
    (Int8WeightOnlyConfig) loaded with qlinear's config holds TorchAO's
    bytes, which are qlinear's q8c of the float model: the very weights
    from_pretrained of the float checkpoint makes, the same logits."""
    from transformers import TorchAoConfig
    base = _tiny_llama(seed=18)
    fd = _saved(tmp_path, base)
    tq = AutoModelForCausalLM.from_pretrained(
        fd, quantization_config=TorchAoConfig(Int8WeightOnlyConfig()),
        dtype=torch.bfloat16)
    td = str(tmp_path / "torchao")
    tq.save_pretrained(td)
    q = AutoModelForCausalLM.from_pretrained(
        td, quantization_config=qh.QlinearConfig(address=daemon.address,
                                                prefix="tao/"),
        dtype=torch.bfloat16)
    names = _offloaded_names(q)
    assert len(names) == 14
    f = AutoModelForCausalLM.from_pretrained(
        fd, quantization_config=qh.QlinearConfig(format="q8c",
                                                address=daemon.address,
                                                prefix="tao-f/"),
        dtype=torch.bfloat16)
    fnames = _offloaded_names(f)
    for n in names:
        assert client.lookup(names[n]).digest == \
            client.lookup(fnames[n]).digest, n
    assert torch.equal(_logits(q), _logits(f))


def test_convert_quantized_refuses_bad_layers():
    """ql_ckpt_convert() on bad tensors or a config that disagrees: an
    error naming the tensor or the config, never a converted layer."""
    import qlinear.checkpoint as qc
    w = np.random.default_rng(19).standard_normal((16, 64)).astype(
        np.float32)
    t, _ = _pack_gptq_awq(w, "gptq")
    ok = qc.convert_quantized("m.l", t["qweight"], t["qzeros"], t["scales"],
                              t["g_idx"])
    assert ok["format"] == "q4g32" and (ok["n"], ok["k"]) == (16, 64)
    with pytest.raises(qlinear.QLinearError) as e:
        qc.convert_quantized("m.l", t["qweight"].float(), t["qzeros"],
                             t["scales"], t["g_idx"])
    assert e.value.code == qlinear.QL_EDTYPE and "m.l.qweight" in str(e.value)
    with pytest.raises(qlinear.QLinearError) as e:
        qc.convert_quantized("m.l", t["qweight"], t["qzeros"], t["scales"],
                             t["g_idx"], {"quant_method": "gptq",
                                          "bits": "four"})
    assert e.value.code == qlinear.QL_EBADFILE and "bits" in str(e.value)
    with pytest.raises(qlinear.QLinearError) as e:
        qc.convert_quantized("m.l", t["qweight"], t["qzeros"], t["scales"],
                             t["g_idx"], {"quant_method": "gptq", "bits": 8})
    assert e.value.code == qlinear.QL_EFORMAT
    with pytest.raises(qlinear.QLinearError) as e:
        qc.convert_quantized("m.l", t["qweight"][:, :8], t["qzeros"],
                             t["scales"], t["g_idx"])
    assert e.value.code == qlinear.QL_EFORMAT
    assert "m.l.qweight: shape [8,8]" in str(e.value)


def test_save_pretrained_and_reload(tmp_path, daemon, client):
    """save_pretrained of an offloaded model writes every linear's packed
    weight, read back from the daemon, as TorchAO tensors; from_pretrained
    of that directory gives the same logits in a fresh daemon (the same
    digests, uploaded from the file) and, in the daemon that still has
    the weights, attaches to them by name and digest."""
    from safetensors import safe_open
    import json
    from conftest import Daemon
    base = _tiny_llama(seed=23)
    fd = _saved(tmp_path, base)
    q = AutoModelForCausalLM.from_pretrained(
        fd, quantization_config=qh.QlinearConfig(address=daemon.address,
                                                 format="q4g32",
                                                 prefix="save/"),
        dtype=torch.bfloat16)
    want = _logits(q)
    names = _offloaded_names(q)
    assert len(names) == 14
    sd = str(tmp_path / "saved")
    q.save_pretrained(sd)
    with safe_open(os.path.join(sd, "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        meta = f.metadata()
        entries = json.loads(meta["qlinear"])
        for n, w in names.items():
            assert n + ".weight" not in keys, n
            assert n + "._weight_qdata" in keys, n
            assert entries[n + ".weight"]["name"] == w
            client.hold(w)  # export reads only what the session holds
            e = client.export_weight(w)
            assert entries[n + ".weight"]["digest"] == e.info.digest
            assert np.array_equal(
                f.get_tensor(n + "._weight_qdata").numpy(), e.qdata), n
            assert np.array_equal(
                f.get_tensor(n + "._weight_scale").view(torch.int16)
                .numpy().view(np.uint16), e.scale), n
    assert "lm_head.weight" in keys and "model.embed_tokens.weight" in keys
    with open(os.path.join(sd, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    assert qc["quant_method"] == "qlinear" and "address" not in qc

    fresh = Daemon()
    try:
        r = AutoModelForCausalLM.from_pretrained(
            sd, quantization_config=qh.QlinearConfig(address=fresh.address),
            dtype=torch.bfloat16)
        rn = _offloaded_names(r)
        assert set(rn) == set(names)
        with qlinear.Client(fresh.address) as fc:
            for n in names:
                assert fc.lookup(rn[n]).digest == \
                    client.lookup(names[n]).digest, n
        assert torch.equal(_logits(r), want)
        del r
    finally:
        fresh.stop()
    # The daemon that has the weights: held by their names, no upload.
    before = len(client.list())
    r2 = AutoModelForCausalLM.from_pretrained(
        sd, quantization_config=qh.QlinearConfig(address=daemon.address),
        dtype=torch.bfloat16)
    assert _offloaded_names(r2) == names
    assert len(client.list()) == before
    assert torch.equal(_logits(r2), want)


def test_save_refuses_what_it_cannot_write(tmp_path, daemon):
    """A model with a q8b layer (no TorchAO tensor) is refused whole,
    naming the layer, and leaves no checkpoint file behind; torch.save
    still refuses a QlinearTensor."""
    import qlinear.checkpoint as qc
    base = _tiny_llama(seed=24, dtype=torch.float32)
    fd = _saved(tmp_path, base)
    q = AutoModelForCausalLM.from_pretrained(
        fd, quantization_config=qh.QlinearConfig(address=daemon.address,
                                                 format="q8b32"),
        dtype=torch.float32)
    sd = str(tmp_path / "saved")
    with pytest.raises(qlinear.QLinearError) as e:
        q.save_pretrained(sd)
    assert e.value.code == qlinear.QL_ENOTSUP and "q8b" in e.value.message
    assert "model.layers." in e.value.message
    assert not os.path.exists(os.path.join(sd, "model.safetensors"))
    with pytest.raises(qlinear.QLinearError):
        qc.save(q, str(tmp_path / "x.safetensors"))
    assert not os.path.exists(str(tmp_path / "x.safetensors"))
    with pytest.raises(qlinear.QLinearError):
        torch.save(q.state_dict(), str(tmp_path / "y.pt"))


def test_checkpoint_save_of_quantize_(tmp_path, daemon, client):
    """quantize_ with qlinear's config, then qlinear.checkpoint.save: the
    file holds TorchAO's Int8Tensor/Float8Tensor of the daemon's bytes, and
    checkpoint.load of it into a fresh float model gives the same
    outputs."""
    import qlinear.checkpoint as qc
    from safetensors import safe_open
    for fmt, kind in (("q8c", "Int8Tensor"), ("f8r", "Float8Tensor")):
        torch.manual_seed(25)
        m = nn.Sequential(nn.Linear(64, 32), nn.ReLU(),
                          nn.Linear(32, 16)).to(torch.bfloat16)
        fresh = copy.deepcopy(m)
        quantize_(m, qa.QlinearConfig(format=fmt, address=daemon.address,
                                      prefix="ckpt-%s/" % fmt))
        x = torch.randn(5, 64, dtype=torch.bfloat16)
        with torch.inference_mode():
            want = m(x)
        path = str(tmp_path / ("%s.safetensors" % fmt))
        qc.save(m, path)
        with safe_open(path, "pt") as f:
            meta = f.metadata()
            assert kind in meta["0.weight"] and kind in meta["2.weight"]
            assert "0.bias" in set(f.keys())
        got = qc.load(fresh, path, qa.QlinearConfig(address=daemon.address))
        assert got == [m[0].weight.weight_name, m[2].weight.weight_name]
        with torch.inference_mode():
            assert torch.equal(fresh(x), want)
