"""PyTorch integration: run a model's linear layers on qlineard.

``QLinear`` is an ``nn.Module`` that computes ``y = x·Wᵀ + b`` with a weight
resident in the daemon; ``swap_linears()`` replaces a model's ``nn.Linear``
modules by QLinear in place, the way quantization libraries swap modules::

    import qlinear, qlinear.torch
    client = qlinear.Client()
    qlinear.torch.swap_linears(model, client, format="q4g128")
    with torch.inference_mode():
        y = model(x)              # every linear layer now runs in qlineard

Weights are named by the module's path and a SHA-256 of their content, so
every process that offloads the same model shares one resident copy (the
daemon keeps one copy per name and content digest, and a weight lives while
any session holds it: keep the client open while the model is in use).

Every forward() is a custom op of the ``qlinear`` namespace (see
qlinear._ops: torch.ops.qlinear.linear, linear_multi, linear_mapped), so a
swapped model runs under torch.inference_mode() and torch.no_grad(), and
torch.compile (fullgraph=True included) and torch.export trace it with no
graph break. Call mode is not capturable in a CUDA graph (the op is tagged
cudagraph_unsafe); mapped mode is.

Inference only: an input that requires grad with grad mode on raises.
CPU tensors go through the client's shared-memory regions. CUDA tensors in
call mode stay on the GPU: the daemon reads x and writes y in place by CUDA
IPC (ql_linear_cuda(), through libqlinear-cuda), after the work queued on
the current stream, on a GPU that holds the weight. Mapped mode (map())
runs qlinear's kernel on CUDA tensors in this process instead, with no
round trip.
"""

import functools
import re
import threading
import weakref

import numpy as np
import torch
from torch import nn

from . import _lib, _ops
from ._ops import default_client, set_default_client, weight_ident
from .client import QLinearError, format_name, parse_format, source_digest

__all__ = ["QLinear", "swap_linears", "weight_name", "content_name",
           "region_tensor",
           "FUSE_PATTERNS", "set_default_client", "default_client",
           "weight_ident"]

_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}

# Sibling modules that usually consume the same input (self-attention's
# q/k/v, a gated MLP's gate/up) in the naming of common model families.
FUSE_PATTERNS = [
    ("q_proj", "k_proj", "v_proj"),
    ("query", "key", "value"),
    ("wq", "wk", "wv"),
    ("gate_proj", "up_proj"),
    ("w1", "w3"),
]

_NAME_BAD = re.compile(r"[^A-Za-z0-9._/-]")


def _err(name, message):
    return QLinearError(_lib.ERRORS[name], message)


def _host_bytes(t):
    """A CPU tensor's memory as a NumPy array of the same element size
    (bfloat16 as uint16: NumPy has no bfloat16)."""
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def weight_name(linear, format, module_name="", prefix="", *,
                quantizer_version, scale_dtype=None, policy="auto"):
    """The daemon-side name of a linear layer's weight in ``format``:
    ``prefix`` + the module path + "/" + the format + ".src-" + the 64 hex
    digits of the source digest of the load QLinear.from_linear() makes
    (qlinear.source_digest(): a SHA-256 over the format, shape, dtype,
    policy, scale dtype, weight and bias, and the version of the daemon's
    quantization rules: pass the daemon's own,
    ``Client.hello().quantizer_version``).

    Such a name is content-addressed: the daemon checks the digest against
    the bytes it receives and loads nothing else under the name, so
    whoever loaded it first (another process of the same model, or
    another user), the weight held by this name is this content, and
    nobody can take the name with other content (docs/security.md).
    Equal layers get equal names in any process, so the daemon shares
    them; a weight quantized by other rules, or with another
    ``scale_dtype`` or ``policy``, gets another name."""
    w = linear.weight.detach().cpu()
    if w.dtype not in _DTYPES:
        w = w.float()
    b = linear.bias.detach().cpu().to(w.dtype) \
        if linear.bias is not None else None
    digest = source_digest(_host_bytes(w),
                           _host_bytes(b) if b is not None else None,
                           format=format, dtype=_DTYPES[w.dtype],
                           policy=policy, scale_dtype=scale_dtype,
                           quantizer_version=quantizer_version)
    return content_name(prefix, module_name, format, digest)


def content_name(prefix, module_name, format, digest):
    """The one naming rule of weights loaded from Python (and `qlinearctl
    import --names content`): ``prefix`` + the module path (characters a
    name cannot hold as "_", shortened from the front to fit) + "/" + the
    format + ".src-" + the hex of the source digest (32 bytes) of what the
    load sends."""
    path = _NAME_BAD.sub("_", module_name or "linear")
    tail = "/%s.src-%s" % (format, digest.hex())
    # The protocol caps names at 255 bytes: shorten the path, keep the tail.
    room = 255 - len(prefix) - len(tail)
    if room < 1:
        raise _err("QL_ENAME", "prefix %r is too long" % prefix)
    return prefix + path[-room:].lstrip("/.") + tail


def region_tensor(region, shape, dtype=torch.float32, offset=0):
    """A tensor over a qlinear.Region's memory. A QLinear given an input
    that lies in a region of its client reads it in place, with no copy."""
    if dtype == torch.bfloat16:
        return torch.from_numpy(region.ndarray(shape, np.int16, offset)) \
            .view(torch.bfloat16)
    np_dtype = {torch.float32: np.float32,
                torch.float16: np.float16}.get(dtype)
    if np_dtype is None:
        raise _err("QL_EDTYPE", "regions hold float32, float16 or bfloat16")
    return torch.from_numpy(region.ndarray(shape, np_dtype, offset))


def _func_name(func):
    name = getattr(func, "__name__", str(func))
    if name == "__get__":  # a property's getter: name the property
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    return name


class _ServedWeight(torch.Tensor):
    """What a QLinear offers as ``weight``: a meta tensor of the weight's
    shape and dtype (what utilities such as Hugging Face's
    resize_token_embeddings() read first), whose data cannot be used: the
    weight lives in qlineard, so any use of it raises QLinearError saying
    so rather than computing silently with nothing."""

    _ALLOWED = None

    @staticmethod
    def __new__(cls, shape, dtype, layer):
        t = torch.Tensor._make_subclass(
            cls, torch.empty(shape, dtype=dtype, device="meta"))
        t._layer = layer
        return t

    @classmethod
    def _allowed(cls):
        if cls._ALLOWED is None:
            T = torch.Tensor
            cls._ALLOWED = {
                T.size, T.dim, T.numel, T.__repr__, T.__format__,
                T.shape.__get__, T.dtype.__get__, T.device.__get__,
                T.ndim.__get__, T.is_meta.__get__, T.layout.__get__,
                T.requires_grad.__get__, T.is_floating_point,
                T.element_size, T.is_cuda.__get__}
        return cls._ALLOWED

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in cls._allowed():
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        layer = next((a._layer for a in args if isinstance(a, _ServedWeight)),
                     "?")
        raise _err("QL_ENOTSUP", "%s: the weight of %s is resident in "
                   "qlineard, not in this process; it has a shape and dtype "
                   "but no data (resize or tie weights before "
                   "swap_linears())" % (_func_name(func), layer))

    def __repr__(self):
        return "ServedWeight(%s, %s, layer=%s)" % (
            tuple(self.shape), self.dtype, self._layer)


class QLinear(nn.Module):
    """A linear layer whose weight lives in qlineard.

    Construct it with QLinear.from_linear() (or swap_linears()); the module
    holds the client, the weight's name and its shape, not the weight.
    forward() takes x [..., in_features] of float32, float16 or bfloat16 on
    the CPU and returns [..., out_features] in x's dtype. ``path`` forces
    "wo" (weight-only) or "aq" (activation-quantized); "auto" leaves the
    choice to the daemon by the number of rows. ``mode="mapped"`` maps the
    weight at once (map(), with ``device``, ``dtype`` and ``max_rows``);
    the client must hold it on that GPU.

    forward() is one custom op (torch.ops.qlinear.linear, or
    linear_mapped when mapped), which torch.compile and torch.export
    trace without a graph break. The weight is named to the op by the
    buffer ``qlinear_id`` (weight_ident()): data, not a constant, so
    identical blocks compile once. ``weight`` is a data-less stand-in
    (shape and dtype only, see _ServedWeight); setting it raises.
    """

    def __init__(self, client, weight, in_features, out_features, *,
                 has_bias=True, format="", path="auto", mode="call",
                 device="cuda", dtype=torch.bfloat16, max_rows=64,
                 weight_dtype=torch.float32):
        if mode not in ("call", "mapped"):
            raise _err("QL_EINVAL", "mode: 'call' or 'mapped'")
        if path not in _ops.PATH_CODES:
            raise _err("QL_EINVAL", "path %r: auto, wo or aq" % (path,))
        super().__init__()
        self.client = client
        self.weight_name = weight
        self.in_features = in_features
        self.out_features = out_features
        self.has_bias = has_bias
        self.format = format
        self.path = path
        self._path_code = _ops.PATH_CODES[path]
        self.info = None
        self._weight_dtype = weight_dtype
        self._group = None  # a _FusedGroup this module belongs to
        self.mode = "call"
        self._mapped = None  # ql_mapped * (libqlinear-cuda), mode "mapped"
        self._mapped_lib = None
        self._mapped_key = None
        self._mapped_device = None
        self._mapped_dtype = None
        self._max_rows = 64
        # Non-persistent: the ident names a resident weight of this
        # process's client; a state_dict keeps to the model's own tensors.
        self.register_buffer("qlinear_id", _ops.weight_ident(weight, client),
                             persistent=False)
        if mode == "mapped":
            self.map(device, dtype, max_rows)

    @property
    def weight(self):
        """A meta tensor of shape [out_features, in_features] and the
        original weight's dtype; any use of its data raises QLinearError."""
        return _ServedWeight((self.out_features, self.in_features),
                             self._weight_dtype, self.weight_name)

    @property
    def bias(self):
        """As weight: a stand-in of shape [out_features], or None."""
        if not self.has_bias:
            return None
        return _ServedWeight((self.out_features,), self._weight_dtype,
                             self.weight_name)

    def __setattr__(self, name, value):
        if name in ("weight", "bias"):
            raise _err("QL_ENOTSUP", "%s of %s cannot be set: it is resident "
                       "in qlineard (tie or resize weights before "
                       "swap_linears())" % (name, self.weight_name))
        super().__setattr__(name, value)

    def map(self, device="cuda", dtype=torch.bfloat16, max_rows=64):
        """Mapped mode: maps the daemon's layout of this weight on the CUDA
        ``device`` into this process (libqlinear-cuda), after which
        forward() runs qlinear's weight-only kernel here, on the current
        torch stream, on CUDA tensors of ``dtype`` (capturable in a CUDA
        graph: no synchronisation, no allocation but y). One launch takes
        up to ``max_rows`` rows (more are cut into launches of that many).
        The daemon must hold the weight on that GPU; one resident copy
        serves every process that maps it."""
        if self._mapped is not None:
            raise _err("QL_EEXIST", "%s is mapped already" % self.weight_name)
        dev = torch.device(device)
        if dev.type != "cuda":
            raise _err("QL_EINVAL", "mapped mode needs a CUDA device")
        if dtype not in _DTYPES:
            raise _err("QL_EDTYPE", "mapped mode takes float32, float16 or "
                                    "bfloat16 activations")
        if not 1 <= max_rows <= _lib.QL_MAPPED_MAX_ROWS:
            raise _err("QL_EINVAL", "max_rows: 1 to %d"
                       % _lib.QL_MAPPED_MAX_ROWS)
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        h, L = _ops.open_mapped(self.client, self.weight_name, dev, dtype,
                                max_rows)
        key = _ops.mapped_key(self.weight_name, self.client, dev, dtype)
        _ops._mapped[key] = (h, L, max_rows, self)
        self._mapped, self._mapped_lib, self._mapped_key = h, L, key
        self._mapped_device, self._mapped_dtype = dev, dtype
        self._max_rows = max_rows
        # The ident goes where the activations are, read once here so that
        # a CUDA graph capture never copies it back.
        ident = self.qlinear_id.to(dev)
        _ops.remember_cuda_ident(ident, _ops.decode_ident(self.qlinear_id))
        self.qlinear_id = ident
        self.mode = "mapped"
        return self

    def unmap(self):
        """Undoes map(): synchronise the stream (and drop CUDA graphs that
        captured this module) first."""
        if self._mapped is not None:
            hit = _ops._mapped.get(self._mapped_key)
            if hit is not None and hit[0] == self._mapped:
                del _ops._mapped[self._mapped_key]
            self._mapped_lib.ql_mapped_close(self._mapped)
            self._mapped = None
            self.mode = "call"

    def __del__(self):
        try:
            self.unmap()
        except Exception:  # interpreter shutdown
            pass

    @classmethod
    def from_linear(cls, linear, client, format="q4g128", *, name=None,
                    module_name="", prefix="", path="auto", policy="auto",
                    scale_dtype=None, mode="call", max_rows=64):
        """Uploads ``linear``'s weight and bias (in their dtype; others than
        float32/16 and bfloat16 as float32) for the daemon to quantize into
        ``format``, and returns the QLinear that uses it. ``name`` defaults
        to weight_name(linear, format, module_name, prefix) with the
        daemon's quantizer version, which names the content: when a weight of that name and format is already
        resident (another process of the same model loaded it), this
        session only holds it (Client.hold()) and nothing is sent.
        ``mode="mapped"`` then maps it (map()) on the linear's CUDA device
        for activations of its weight's dtype."""
        if mode not in ("call", "mapped"):
            raise _err("QL_EINVAL", "mode: 'call' or 'mapped'")
        w = linear.weight.detach().cpu()
        if w.dtype not in _DTYPES:
            w = w.float()
        b = linear.bias.detach().cpu().to(w.dtype) \
            if linear.bias is not None else None
        if name is None:
            hi = client.hello_info or client.hello()
            name = weight_name(linear, format, module_name, prefix,
                               quantizer_version=hi.quantizer_version,
                               scale_dtype=scale_dtype, policy=policy)
        info = None
        if scale_dtype is None and policy == "auto":
            # weight_name() hashes the content and the format; the daemon's
            # defaults settle the rest, so a resident weight of that name
            # is this one
            try:
                info = client.hold(name)
            except QLinearError as e:
                if e.code != _lib.ERRORS["QL_ENOTFOUND"]:
                    raise
            if info is not None and (
                    info.format != format_name(*parse_format(format)) or
                    (info.n, info.k) != tuple(w.shape)):
                # (the hold stays: the session may have held it already)
                raise _err("QL_EEXIST", "weight %r is resident with another "
                                        "format or shape" % name)
        if info is None:
            info = client.load(name, _host_bytes(w),
                               _host_bytes(b) if b is not None else None,
                               format=format, dtype=_DTYPES[w.dtype],
                               policy=policy, scale_dtype=scale_dtype)
        m = cls(client, name, linear.in_features, linear.out_features,
                has_bias=b is not None, format=format, path=path,
                weight_dtype=w.dtype)
        m.info = info
        if mode == "mapped":
            dt = linear.weight.dtype if linear.weight.dtype in _DTYPES \
                else torch.float32
            m.map(linear.weight.device, dt, max_rows)
        return m

    def forward(self, x):
        # Only module attributes equal across identical layers are read
        # here (mode, sizes, the ident buffer), so dynamo's guards do not
        # tell the layers apart; the fused group is eager-only state.
        if self.mode == "mapped":
            return torch.ops.qlinear.linear_mapped(
                x, self.qlinear_id, self.out_features, self._max_rows)
        if not torch.compiler.is_compiling() and self._group is not None:
            return self._group.forward(self, x)
        return self._run(x)

    def _run(self, x):
        """This layer alone on x (call mode)."""
        return torch.ops.qlinear.linear(x, self.qlinear_id,
                                        self.out_features, self._path_code)

    def extra_repr(self):
        return "in_features=%d, out_features=%d, bias=%s, format=%s, " \
               "weight=%r" % (self.in_features, self.out_features,
                              self.has_bias, self.format, self.weight_name)


class _FusedGroup:
    """Sibling QLinear modules computed by one ql_linear_multi() call.

    The model still calls each member on its own. The first member called
    in a round computes every member's result for its input (one
    torch.ops.qlinear.linear_multi) and keeps the others'; a member then
    called with that same tensor (same object, unmodified: same version
    counter, or for an inference tensor, which has none, the same object)
    takes its kept result. A member called with anything else shows that
    the model does not feed the siblings one input (for example
    cross-attention's key and value): the group then stops fusing and
    every member computes alone from then on. Results never depend on the
    fusing, only the number of round trips does.

    Fusing is eager-only: under torch.compile or torch.export each member
    runs its own torch.ops.qlinear.linear (the same bytes), since keeping
    results between module calls is state a graph cannot hold.
    """

    def __init__(self, members):
        self.members = list(members)
        self.enabled = True
        self.fused_calls = 0  # ql_linear_multi() round trips so far
        self._kept = {}
        self._lock = threading.Lock()
        for m in self.members:
            m._group = self

    # A deep copy of the model gets a group of its own (members copied,
    # a new lock, nothing kept).
    def __getstate__(self):
        state = self.__dict__.copy()
        del state["_lock"]
        state["_kept"] = {}
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @staticmethod
    def _version(x):
        # An inference tensor has no version counter (reading it raises);
        # it cannot be modified outside inference mode, and the model is
        # assumed not to modify its input in place between sibling calls.
        return None if x.is_inference() else x._version

    def forward(self, member, x):
        with self._lock:
            if not self.enabled:
                return member._run(x)
            if self._kept:
                kept = self._kept.pop(member, None)
                if kept is not None and kept[0]() is x and \
                        kept[1] == self._version(x):
                    return kept[2]
                self.enabled = False
                self._kept.clear()
                return member._run(x)
            ys = self._run_all(x)
            ref = weakref.ref(x)
            ver = self._version(x)
            for m, y in zip(self.members, ys):
                if m is not member:
                    self._kept[m] = (ref, ver, y)
            return ys[self.members.index(member)]

    def _run_all(self, x):
        first = self.members[0]
        ns = [mem.out_features for mem in self.members]
        ys = torch.ops.qlinear.linear_multi(
            x, [mem.qlinear_id for mem in self.members], ns,
            first._path_code)
        dt = _DTYPES.get(x.dtype)
        rows = x.numel() // max(x.shape[-1], 1) if x.dim() else 0
        if dt is not None and rows and x.device.type == "cpu" and \
                first.client.multi_fits(dt, rows, first.in_features, ns):
            self.fused_calls += 1  # the op made one round trip of them
        return list(ys)


def _filter_fn(filter):
    if filter is None:
        return lambda name, mod: True
    if isinstance(filter, str):
        rx = re.compile(filter)
        return lambda name, mod: rx.search(name) is not None
    if callable(filter):
        return filter
    raise _err("QL_EINVAL", "filter: None, a regular expression or a "
                            "callable(name, module)")


def swap_linears(model, client, format="q4g128", filter=None, *,
                 fuse="auto", prefix=None, path="auto", policy="auto",
                 scale_dtype=None, mode="call", max_rows=64):
    """Replaces the ``nn.Linear`` modules of ``model`` by QLinear modules
    served by ``client``'s daemon, in place; returns {module path: QLinear}.

    ``format`` is a qlinear format name ("q4g128", "q8c", "f8r", "q8b128",
    ...). ``filter`` selects the modules to swap: a regular expression
    searched in the module path, or a callable(path, module) -> bool; None
    swaps all. ``fuse``: "auto" groups swapped siblings named as in
    FUSE_PATTERNS (q_proj/k_proj/v_proj, query/key/value, gate_proj/up_proj,
    ...) into one ql_linear_multi() round trip; a list of tuples of module
    paths names the groups explicitly; None disables fusing. Members of a
    group must share in_features. ``prefix`` starts every weight name
    (default "torch/<model class>/"). A module used at several places of
    the model is uploaded once and swapped everywhere. ``mode="mapped"``
    (a CUDA model) maps each weight into this process (QLinear.map()):
    the layers then run qlinear's kernels here, on the current stream,
    capturable in CUDA graphs; nothing is fused then.
    """
    if mode == "mapped":
        fuse = None
    if isinstance(model, nn.Linear):
        raise _err("QL_EINVAL", "the model is itself an nn.Linear: use "
                                "QLinear.from_linear()")
    keep = _filter_fn(filter)
    if prefix is None:
        prefix = "torch/%s/" % type(model).__name__
    done = {}      # id(nn.Linear) -> QLinear: shared modules upload once
    swapped = {}
    for name, mod in list(model.named_modules(remove_duplicate=False)):
        if not isinstance(mod, nn.Linear) or not keep(name, mod):
            continue
        q = done.get(id(mod))
        if q is None:
            q = QLinear.from_linear(mod, client, format, module_name=name,
                                    prefix=prefix, path=path, policy=policy,
                                    scale_dtype=scale_dtype, mode=mode,
                                    max_rows=max_rows)
            done[id(mod)] = q
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, q)
        swapped[name] = q

    if fuse == "auto":
        groups = []
        for name in swapped:
            parent, _, child = name.rpartition(".")
            for pat in FUSE_PATTERNS:
                if child == pat[0]:
                    base = parent + "." if parent else ""
                    groups.append(tuple(base + p for p in pat))
        groups = [g for g in groups if all(p in swapped for p in g)]
    elif fuse is None or fuse is False:
        groups = []
    else:
        groups = [tuple(g) for g in fuse]
        for g in groups:
            missing = [p for p in g if p not in swapped]
            if missing:
                raise _err("QL_EINVAL", "fuse group %s: %s not swapped"
                           % (g, ", ".join(missing)))
    for g in groups:
        members = [swapped[p] for p in g]
        if len({id(m) for m in members}) != len(members) or \
                any(m._group is not None for m in members) or \
                len({m.in_features for m in members}) != 1 or \
                len(members) > _lib.QL_MULTI_MAX:
            if fuse == "auto":
                continue  # not fusable as found: leave them separate
            raise _err("QL_EINVAL", "fuse group %s: members must be distinct, "
                       "ungrouped, at most %d, with equal in_features"
                       % (g, _lib.QL_MULTI_MAX))
        _FusedGroup(members)
    if swapped:
        _guard_resize(model)
    return swapped


def _resize_guarded(model, *args, **kwargs):
    """A swapped model's resize_token_embeddings(): refused, before
    anything changes, while the output embeddings are a QLinear (their
    rows are in qlineard and cannot be extended here; Hugging Face's own
    method would resize the input embeddings first, then fail on the
    head with a TypeError and leave the model half resized)."""
    head = model.get_output_embeddings() \
        if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, QLinear):
        raise _err("QL_ENOTSUP", "resize_token_embeddings: the output "
                   "embeddings (%s) are resident in qlineard and cannot be "
                   "resized in this process; resize before swap_linears(), "
                   "or swap with a filter that leaves them out; nothing "
                   "was changed" % head.weight_name)
    return type(model).resize_token_embeddings(model, *args, **kwargs)


def _guard_resize(model):
    """Puts _resize_guarded in front of a Hugging Face model's
    resize_token_embeddings (an attribute of this instance, so its class
    and other instances are untouched; a functools.partial of a module
    function, so the model still pickles)."""
    if not callable(getattr(type(model), "resize_token_embeddings", None)) \
            or "resize_token_embeddings" in model.__dict__:
        return
    model.__dict__["resize_token_embeddings"] = functools.partial(
        _resize_guarded, model)
