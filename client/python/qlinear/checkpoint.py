"""TorchAO and GPTQ/AWQ checkpoints loaded into qlineard.

    import qlinear.checkpoint as qc
    qc.load(model, "model.safetensors", qlinear.torchao.QlinearConfig())

load() reads a TorchAO safetensors checkpoint (TorchAO's serializer:
"<module>._weight_qdata", "_weight_scale", "_weight_zero_point", the
subclass described in the file's metadata) of Int4Tensor (q4g),
Int8Tensor (q8c) or Float8Tensor (f8r) weights, whose arrays are
qlinear's canonical form as they are, and offloads each linear of the
model to them; convert_quantized() converts a GPTQ or AWQ layer exactly
(ql_ckpt_convert()). qlinear.hf uses both for from_pretrained.

A metadata entry "qlinear" (a JSON object: for a weight's key, the daemon
name and digest it had) makes load hold that name by that digest (another
content under the name is refused) when the daemon still has it, without
an upload; otherwise the arrays are uploaded as they are (load_packed)
under the content-addressed name of what is sent
(``<prefix><module path>/<format>.src-<packed source digest>``,
docs/security.md), which any process loading the same file finds.

save() and state_dict() are the other way: every offloaded linear's
weight is read back from the daemon (Client.export_weight()) as the
TorchAO tensor of its bytes, so that the file is a TorchAO checkpoint
that holds every weight, and load() (or from_pretrained) makes the same
model again, in another daemon too. A weight with no TorchAO form (q8b)
is refused before anything is written.
"""

import json

import numpy as np
import torch

from . import _lib
from .client import QLinearError, packed_source_digest, parse_format
from .torch import content_name

__all__ = ["load", "save", "state_dict", "to_torchao", "attach", "acquire",
           "acquire_packed", "entries", "packed_of", "convert_quantized",
           "METADATA_KEY"]

METADATA_KEY = "qlinear"

_TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16,
                 "bf16": torch.bfloat16}
_DTYPE_NAMES = {v: k for k, v in _TORCH_DTYPES.items()}


def _err(code, message):
    return QLinearError(_lib.ERRORS[code], message)


def _numpy(t):
    """A torch tensor as a numpy array, or (uint16 bits, "bf16") for bf16,
    (uint8 bytes, "e4m3") for float8: load_packed()'s forms."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return (t.view(torch.int16).numpy().view(np.uint16), "bf16")
    if t.dtype == torch.float8_e4m3fn:
        return (t.view(torch.uint8).numpy(), "e4m3")
    return t.numpy()


def packed_of(t, what="weight"):
    """load_packed()'s arguments for a TorchAO tensor: a dict of format,
    n, k, qdata, scale, zero and zero_kind."""
    kind = type(t).__name__
    n, k = int(t.shape[0]), int(t.shape[1])
    bs = list(getattr(t, "block_size", []) or [])
    if kind == "Int4Tensor":
        if len(bs) != 2 or bs[0] != 1:
            raise _err("QL_ESHAPE", "%s: Int4Tensor block size %s: [1, G] "
                       "expected" % (what, bs))
        fmt = "q4g%d" % bs[1]
        parse_format(fmt)
        zero = t.zero_point
        return dict(format=fmt, n=n, k=k, qdata=_numpy(t.qdata),
                    scale=_numpy(t.scale), zero=_numpy(zero),
                    zero_kind="float")
    if kind in ("Int8Tensor", "Float8Tensor"):
        if bs != [1, k]:
            raise _err("QL_ESHAPE", "%s: %s block size %s: per row [1, %d] "
                       "expected" % (what, kind, bs, k))
        zp = getattr(t, "zero_point", None)
        if zp is not None and bool(torch.any(zp != 0)):
            raise _err("QL_ENOTSUP", "%s: an Int8Tensor with non-zero zero "
                       "points (asymmetric) has no qlinear format" % what)
        scale = t.scale.reshape(n)
        return dict(format="q8c" if kind == "Int8Tensor" else "f8r", n=n,
                    k=k, qdata=_numpy(t.qdata), scale=_numpy(scale),
                    zero=None, zero_kind="float")
    raise _err("QL_ENOTSUP", "%s: a TorchAO %s cannot be loaded into "
               "qlineard (Int4Tensor, Int8Tensor and Float8Tensor can)"
               % (what, kind))


def entries(metadata):
    """The "qlinear" metadata of a saved file: {param key: entry}; {} when
    there is none (a TorchAO checkpoint made elsewhere)."""
    raw = (metadata or {}).get(METADATA_KEY)
    if not raw:
        return {}
    try:
        e = json.loads(raw)
    except ValueError:
        raise _err("QL_EINVAL", "the checkpoint's %r metadata is not JSON"
                   % METADATA_KEY) from None
    if not isinstance(e, dict):
        raise _err("QL_EINVAL", "the checkpoint's %r metadata is not an "
                   "object" % METADATA_KEY)
    return e


def acquire(linear, path, t, entry, config, client):
    """The first half of attach(): makes ``client``'s session hold the
    weight (held by the entry's name and digest, else uploaded) and
    returns (its name, the layer's float dtype); the module is not
    changed."""
    dtype = _TORCH_DTYPES.get((entry or {}).get("dtype")) or \
        getattr(t, "dtype", torch.float32)
    return acquire_packed(linear, path, packed_of(t, path), entry, config,
                          client, dtype)


def acquire_packed(linear, path, packed, entry, config, client, dtype):
    """acquire() of load_packed()'s arguments (packed_of(),
    convert_quantized()): returns (name, dtype)."""
    if (packed["n"], packed["k"]) != (linear.out_features,
                                      linear.in_features):
        raise _err("QL_ESHAPE", "%s: the checkpoint's weight is [%d, %d], "
                   "the layer [%d, %d]" % (path, packed["n"], packed["k"],
                                           linear.out_features,
                                           linear.in_features))
    name = None
    if isinstance(entry, dict) and isinstance(entry.get("name"), str) and \
            isinstance(entry.get("digest"), str):
        try:
            client.hold(entry["name"], entry["digest"])
            name = entry["name"]
        except QLinearError as e:
            # Gone, or another content under that name: upload instead.
            if e.code not in (_lib.ERRORS["QL_ENOTFOUND"],
                              _lib.ERRORS["QL_EEXIST"],
                              _lib.ERRORS["QL_EINVAL"],
                              _lib.ERRORS["QL_ENAME"]):
                raise QLinearError(e.code, "%s: %s" % (path, e)) from None
    if name is None:
        args = dict(packed)
        fmt = args.pop("format")
        digest = packed_source_digest(fmt, args["n"], args["k"],
                                      args["qdata"], args["scale"],
                                      args["zero"],
                                      zero_kind=args["zero_kind"],
                                      policy=config.policy)
        name = content_name(config.prefix, path, fmt, digest)
        try:
            client.hold(name)
        except QLinearError as e:
            if e.code != _lib.ERRORS["QL_ENOTFOUND"]:
                raise QLinearError(e.code, "%s: %s" % (path, e)) from None
            try:
                client.load_packed(name, fmt, args["n"], args["k"],
                                   args["qdata"], args["scale"], args["zero"],
                                   zero_kind=args["zero_kind"],
                                   policy=config.policy)
            except QLinearError as e2:
                raise QLinearError(e2.code, "%s: %s" % (path, e2)) from None
    if dtype not in _DTYPE_NAMES:
        dtype = torch.float32
    return name, dtype


def attach(linear, path, t, entry, config, client=None):
    """Makes the nn.Linear ``linear`` (at ``path`` in its model) run on the
    saved TorchAO weight ``t``: holds the daemon weight its entry (from
    the file's "qlinear" metadata, or None) names by its digest, else
    uploads t's arrays under their content-addressed name; then gives the
    module a QlinearTensor weight. ``config`` is a
    qlinear.torchao.QlinearConfig (address, path, prefix, policy). Returns
    the weight's name."""
    from . import torchao as qao
    client = client or qao.client_for(config.address)
    name, dtype = acquire(linear, path, t, entry, config, client)
    qao._set_weight(linear, config, client, name, dtype)
    return name


def load(model, path, config):
    """Loads a TorchAO safetensors checkpoint of Int4Tensor, Int8Tensor or
    Float8Tensor weights into ``model``, whose
    linears become offloaded (attach()) and whose other tensors are loaded
    as they are. Every saved weight is checked against its layer before
    the first upload; a failure releases what this call uploaded or held.
    Returns the names of the weights it attached."""
    from safetensors import safe_open
    from torchao.prototype.safetensors.safetensors_support import \
        unflatten_tensor_state_dict
    from . import torchao as qao
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata() or {}
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    sd, leftover = unflatten_tensor_state_dict(tensors, metadata)
    info = entries(metadata)
    mods = dict(model.named_modules())
    layers = []
    for key, t in sd.items():
        if isinstance(t, torch.Tensor) and type(t) is not torch.Tensor and \
                type(t) is not torch.nn.Parameter:
            mpath, pname = key.rsplit(".", 1)
            lin = mods.get(mpath)
            if pname != "weight" or not isinstance(lin, torch.nn.Linear):
                raise _err("QL_ENOTSUP", "%s: a quantized tensor for a "
                           "module that is not an nn.Linear" % key)
            packed_of(t, mpath)  # the subclass and its block size
            layers.append((mpath, lin, t, info.get(key)))
    client = qao.client_for(config.address)
    held_before = set(client._held)
    got = []
    try:
        for mpath, lin, t, entry in layers:
            got.append(acquire(lin, mpath, t, entry, config, client))
    except BaseException:
        for n, _ in got:
            if n not in held_before:
                try:
                    client.unload(n)
                except QLinearError:
                    pass
        raise
    for (mpath, lin, t, entry), (name, dtype) in zip(layers, got):
        qao._set_weight(lin, config, client, name, dtype)
    plain = {key: t for key, t in sd.items()
             if not any(key == m + ".weight" for m, _, _, _ in layers)}
    plain.update(leftover)
    missing, unexpected = model.load_state_dict(plain, strict=False)
    if unexpected:
        raise _err("QL_EINVAL", "tensors the model has no place for: %s"
                   % ", ".join(sorted(unexpected)[:8]))
    return [n for n, _ in got]


def _torch_of(a, dt):
    """A numpy array of ExportedWeight as a torch tensor of dtype dt
    (bf16 arrives as uint16 bits, e4m3 as bytes)."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    if dt == torch.bfloat16:
        return t.view(torch.int16).view(torch.bfloat16)
    if dt == torch.float8_e4m3fn:
        return t.view(torch.float8_e4m3fn)
    return t


def to_torchao(e, dtype=torch.float32, what=None):
    """The TorchAO tensor of an ExportedWeight: Int4Tensor for q4g,
    Int8Tensor for q8c, Float8Tensor for f8r, holding its arrays as they
    are (TorchAO's own layouts); ``dtype`` is the layer's float dtype.
    q8b, which TorchAO has no tensor for, is QL_ENOTSUP."""
    from torchao.quantization import Float8Tensor, Int4Tensor, Int8Tensor
    what = what or e.info.name
    sdt = _TORCH_DTYPES.get(e.scale_dtype)
    if sdt is None:
        raise _err("QL_EDTYPE", "%s: scale dtype %s" % (what, e.scale_dtype))
    n, k = e.n, e.k
    fmt = e.info.format_code
    if fmt == _lib.QL_FORMAT_Q4G:
        if k % 2:
            raise _err("QL_ENOTSUP", "%s: q4g with an odd K (%d) has no "
                       "TorchAO Int4Tensor" % (what, k))
        return Int4Tensor(_torch_of(e.qdata, torch.int8),
                          _torch_of(e.scale, sdt), _torch_of(e.zero, sdt),
                          [1, e.info.group_size], torch.Size([n, k]))
    if fmt == _lib.QL_FORMAT_Q8C:
        scale = _torch_of(e.scale, sdt).reshape(n, 1)
        return Int8Tensor(_torch_of(e.qdata, torch.int8), scale, [1, k],
                          dtype, zero_point=torch.zeros(n, 1,
                                                        dtype=torch.int8))
    if fmt == _lib.QL_FORMAT_F8R:
        scale = _torch_of(e.scale, sdt).reshape(n, 1)
        return Float8Tensor(_torch_of(e.qdata, torch.float8_e4m3fn), scale,
                            block_size=[1, k], dtype=dtype)
    raise _err("QL_ENOTSUP", "%s: a %s weight has no TorchAO tensor and "
               "cannot be saved (q4g, q8c and f8r can)" % (what, e.format))


def state_dict(model):
    """The model's state as a TorchAO safetensors checkpoint holds it:
    (tensors, metadata), TorchAO's flattened form of every offloaded
    linear's weight read back from the daemon, the other tensors as they
    are, and in the metadata the "qlinear" entries (each weight's daemon
    name, digest and float dtype) that let load() attach to weights still
    resident. Every weight is read before anything is returned: a weight
    that cannot be saved raises, naming its layer."""
    from torchao.prototype.safetensors.safetensors_support import \
        flatten_tensor_state_dict
    from . import _ops
    from .torchao import QlinearTensor
    sd = model.state_dict()
    out, info = {}, {}
    for key, t in sd.items():
        if not isinstance(t, QlinearTensor):
            out[key] = t
            continue
        name, client = _ops._resolve(t.ident)
        try:
            e = client.export_weight(name)
        except QLinearError as err:
            raise QLinearError(err.code, "%s: %s" % (key, err)) from None
        if e.bias is not None:
            raise _err("QL_ENOTSUP", "%s: weight %s has a bias in the "
                       "daemon; the module's own bias is what is saved"
                       % (key, name))
        out[key] = to_torchao(e, t.orig_dtype, key)
        info[key] = {"name": name, "digest": e.info.digest,
                     "dtype": _DTYPE_NAMES.get(t.orig_dtype, "f32")}
    tensors, metadata = flatten_tensor_state_dict(out)
    metadata = dict(metadata)
    metadata[METADATA_KEY] = json.dumps(info, sort_keys=True)
    return tensors, metadata


def save(model, path):
    """Writes state_dict(model) to the safetensors file ``path``: a
    checkpoint that load() reads back into a model of the same
    architecture (or any TorchAO user reads as TorchAO tensors)."""
    from safetensors.torch import save_file
    tensors, metadata = state_dict(model)
    metadata.setdefault("format", "pt")
    save_file({k: v.contiguous() for k, v in tensors.items()}, path,
              metadata=metadata)


def _ckpt_tensor(t, what):
    """A torch tensor as a ql_ckpt_tensor and the array it points into."""
    t = t.detach().cpu().contiguous()
    codes = {torch.int32: _lib.QL_ADT_I32, torch.float16: _lib.QL_ADT_F16,
             torch.bfloat16: _lib.QL_ADT_BF16, torch.float32: _lib.QL_ADT_F32}
    if t.dtype not in codes:
        raise _err("QL_EDTYPE", "%s: element type %s (int32, f16, bf16 or "
                   "f32 expected)" % (what, t.dtype))
    if t.dim() not in (1, 2):
        raise _err("QL_ESHAPE", "%s has %d dimensions, not 1 or 2"
                   % (what, t.dim()))
    arr = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()
    ct = _lib.ql_ckpt_tensor()
    ct.data = arr.ctypes.data
    ct.bytes = arr.nbytes
    ct.dtype = codes[t.dtype]
    ct.ndim = t.dim()
    ct.shape[0] = t.shape[0]
    ct.shape[1] = t.shape[1] if t.dim() == 2 else 0
    return ct, arr


_ADT_NUMPY = {_lib.QL_ADT_U8: np.uint8, _lib.QL_ADT_I8: np.int8,
              _lib.QL_ADT_F16: np.float16, _lib.QL_ADT_F32: np.float32,
              _lib.QL_ADT_BF16: np.uint16}


def convert_quantized(layer, qweight, qzeros, scales, g_idx=None,
                      quantization_config=None):
    """load_packed()'s arguments (a dict as packed_of()'s) for the GPTQ or
    AWQ layer ``layer`` given its tensors (torch): the exact conversion
    `qlinearctl import` does (ql_ckpt_convert(), docs/import.md).
    ``quantization_config`` is the checkpoint's (a dict), checked against
    the tensors."""
    import ctypes
    from .client import _check, format_name
    keep = []
    cts = []
    for part, t in (("qweight", qweight), ("qzeros", qzeros),
                    ("scales", scales), ("g_idx", g_idx)):
        if t is None:
            cts.append(None)
            continue
        ct, arr = _ckpt_tensor(t, "%s.%s" % (layer, part))
        keep.append(arr)
        cts.append(ctypes.byref(ct))
        keep.append(ct)
    cfg = None
    if quantization_config is not None:
        cfg = json.dumps({"quantization_config": quantization_config}).encode()
    lib = _lib.load()
    out = ctypes.POINTER(_lib.ql_ckpt_layer)()
    _check(lib, lib.ql_ckpt_convert(layer.encode(), cts[0], cts[1], cts[2],
                                    cts[3], cfg, len(cfg) if cfg else 0,
                                    ctypes.byref(out)))
    try:
        d = out.contents.desc

        def arr(pa):
            if not pa.data:
                return None
            shape = (pa.shape[0],) if pa.ndim == 1 else (pa.shape[0],
                                                          pa.shape[1])
            dt = _ADT_NUMPY[pa.dtype]
            n = int(np.prod(shape)) * np.dtype(dt).itemsize
            a = np.frombuffer(ctypes.string_at(pa.data, n), dtype=dt)
            a = a.reshape(shape).copy()
            return (a, "bf16") if pa.dtype == _lib.QL_ADT_BF16 else a
        return dict(format=format_name(d.format, d.group_size,
                                       bool(d.asymmetric)),
                    n=d.n, k=d.k, qdata=arr(d.qdata), scale=arr(d.scale),
                    zero=arr(d.zero), zero_kind="float")
    finally:
        lib.ql_free(ctypes.cast(out, ctypes.c_void_p))
