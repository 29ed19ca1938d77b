"""torch.ops.qlinear: the custom operators every QLinear runs through.

They are Python ``torch.library.custom_op``s with ``register_fake`` rather
than a C++ TORCH_LIBRARY shim: the op's body is the existing ctypes call
into libqlinear, and nothing has to be compiled against one torch's C++
ABI (the package stays pure Python and works with any torch that has
custom_op). To torch.compile and torch.export an op is opaque: the fake
kernel gives the output's shape, dtype, device and strides without reading
data, and the real kernel runs eagerly (inductor calls it from the
generated code), so a swapped model compiles with no graph break.

    torch.ops.qlinear.linear(x, ident, out_features, path) -> y
        call mode: the daemon computes y. CPU tensors travel in the
        request (or through a shared region); CUDA tensors stay on the
        GPU, read and written by the daemon in place through CUDA IPC
        (libqlinear-cuda's ql_cuda_call_slices(), then
        ql_linear_cuda()), after the work queued on the current stream.
        Tagged
        cudagraph_unsafe: it talks to another process, so it cannot be
        captured in a CUDA graph and the compiler splits the graph there.
    torch.ops.qlinear.linear_multi(x, idents, out_features, path) -> [y]
        several weights on one x in one ql_linear_multi() round trip.
    torch.ops.qlinear.linear_mapped(x, ident, out_features, max_rows) -> y
        mapped mode: qlinear's kernel in this process on the current
        stream (libqlinear-cuda); capturable in a CUDA graph.

``ident`` names the weight as data, not as a constant: a uint8 tensor of
IDENT_BYTES (weight_ident()), the weight's name NUL-padded to
QL_NAME_MAX, then a token of the client that holds it. Because it is a
graph input (a buffer of the module) and always of one shape, dynamo does
not guard on which weight a layer serves: one compiled decoder block
serves every block of the model. The real kernel decodes it and finds the
client by the token among this process's clients, else uses the default
client (set_default_client(), or one connected lazily to QLINEAR_ADDRESS),
which is how an exported program loaded in a fresh process finds its
daemon.
"""

import ctypes
import os
import threading
import weakref

import torch

from . import _lib
from .client import Client, QLinearError

QL_NAME_MAX = _lib.QL_NAME_MAX
TOKEN_BYTES = 8
IDENT_BYTES = QL_NAME_MAX + TOKEN_BYTES

_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_PATHS = {0: "auto", 1: "wo", 2: "aq"}
PATH_CODES = {v: k for k, v in _PATHS.items()}

_lock = threading.Lock()
_clients = weakref.WeakValueDictionary()   # token -> Client of this process
_tokens = weakref.WeakKeyDictionary()      # Client -> token
_default = None                            # Client: set_default_client()
_default_owned = False                     # made here, lazily


# Callables f(op, weight names, x, outputs) called after every real
# kernel: for tests and debugging (which layer ran, on what, giving what),
# in eager and compiled code alike.
observers = []


def _observe(op, names, x, ys):
    for f in list(observers):
        f(op, names, x, ys)


def _err(name, message):
    return QLinearError(_lib.ERRORS[name], message)


def client_token(client):
    """The random token that names ``client`` inside weight idents (it is
    not a pointer: an ident saved by another process never finds a client
    of this one by accident)."""
    with _lock:
        t = _tokens.get(client)
        if t is None:
            t = int.from_bytes(os.urandom(TOKEN_BYTES), "little") or 1
            _tokens[client] = t
            _clients[t] = client
        return t


def weight_ident(name, client=None):
    """The uint8 tensor [IDENT_BYTES] that the ops take for weight ``name``
    of ``client`` (None: whatever default client the process has)."""
    raw = name.encode()
    if not raw or len(raw) >= QL_NAME_MAX or b"\0" in raw:
        raise _err("QL_ENAME", "weight name %r: 1 to %d bytes, no NUL"
                   % (name, QL_NAME_MAX - 1))
    tok = client_token(client) if client is not None else 0
    buf = raw.ljust(QL_NAME_MAX, b"\0") + tok.to_bytes(TOKEN_BYTES, "little")
    return torch.frombuffer(bytearray(buf), dtype=torch.uint8).clone()


def set_default_client(client):
    """The client that serves idents whose own client is not in this
    process (an exported program loaded elsewhere, a module whose client
    was collected). None forgets it."""
    global _default, _default_owned
    if client is not None and not isinstance(client, Client):
        raise _err("QL_EINVAL", "set_default_client() takes a "
                                "qlinear.Client or None")
    with _lock:
        old, owned = _default, _default_owned
        _default, _default_owned = client, False
    if owned and old is not None and old is not client:
        old.close()


def default_client():
    """The default client: set_default_client()'s, else one connected now
    to the default address (QLINEAR_ADDRESS, else deploy/run's socket) and
    kept for the process's life."""
    global _default, _default_owned
    with _lock:
        c = _default
    if c is not None and not c.closed:
        return c
    c = Client()
    with _lock:
        if _default is None or _default.closed:
            _default, _default_owned = c, True
            return c
        other = _default
    c.close()
    return other


# CUDA idents (a model moved to the GPU moves its buffers): reading one
# costs a device-to-host copy, which a CUDA graph capture forbids, so each
# is read once and remembered by its address. QLinear.map() fills this for
# its own buffer without any read.
_cuda_names = {}


def remember_cuda_ident(ident, name):
    _cuda_names[(ident.device.index, ident.data_ptr())] = name


def _ident_bytes(ident):
    if ident.dtype != torch.uint8 or ident.dim() != 1 or \
            ident.numel() != IDENT_BYTES:
        raise _err("QL_EINVAL", "not a qlinear weight ident: %s %s"
                   % (ident.dtype, tuple(ident.shape)))
    return bytes(ident.detach().cpu().contiguous().numpy())


def decode_ident(ident):
    """(weight name, client token) from an ident tensor."""
    raw = _ident_bytes(ident)
    name = raw[:QL_NAME_MAX].split(b"\0", 1)[0].decode(errors="replace")
    return name, int.from_bytes(raw[QL_NAME_MAX:], "little")


def _resolve(ident):
    """(name, Client) that serve this ident."""
    if ident.device.type == "cuda":
        key = (ident.device.index, ident.data_ptr())
        hit = _cuda_names.get(key)
        if hit is not None:
            name, tok = hit
        else:
            name, tok = decode_ident(ident)
            _cuda_names[key] = (name, tok)
    else:
        name, tok = decode_ident(ident)
    c = _clients.get(tok) if tok else None
    if c is None or c.closed:
        c = default_client()
    return name, c


def _check_x(name, client, x, out_features):
    """Checks in the real kernels: the layer, what it takes, what it got."""
    if x.dtype not in _DTYPES:
        raise _err("QL_EDTYPE", "layer %s takes float32, float16 or bfloat16 "
                   "input; given %s" % (name, x.dtype))
    n, k = client._weight_shape(name)
    if x.dim() < 1 or x.shape[-1] != k:
        raise _err("QL_ESHAPE", "layer %s takes [..., %d]; given %s"
                   % (name, k, tuple(x.shape)))
    if out_features != n:
        raise _err("QL_ESHAPE", "layer %s gives %d features; the module "
                   "says %d" % (name, n, out_features))
    return k


def _named(name, e):
    """e re-raised with the layer it happened in."""
    if name in e.message:
        return e
    return QLinearError(e.code, "layer %s: %s" % (name, e.message or e.name))


def _call_device(name, x):
    """x's device type, when call mode serves it (CPU, CUDA)."""
    if x.device.type not in ("cpu", "cuda"):
        raise _err("QL_ENOTSUP", "layer %s: a %s input in call mode; call "
                   "mode takes CPU and CUDA tensors" % (name, x.device))
    return x.device.type


def _run_one(client, name, x2, y, path):
    """One call-mode request of the [m, k] contiguous x2 into y: CUDA
    tensors by CUDA IPC on x2's current stream, CPU ones through
    linear_raw()."""
    m, k = x2.shape
    n = y.shape[-1]
    dt = _DTYPES[x2.dtype]
    p = _PATHS.get(path, path)
    if x2.device.type == "cuda":
        stream = torch.cuda.current_stream(x2.device).cuda_stream
        client.linear_cuda_raw(name, dt, m, k, x2.data_ptr(), n,
                               y.data_ptr(), stream=stream, path=p)
    else:
        client.linear_raw(name, dt, m, k, x2.data_ptr(), n, y.data_ptr(),
                          path=p)


def _refuse_grad(ctx, inputs, output):
    # Called by autograd only when an input requires grad with grad mode
    # on: the daemon has no backward, and an output without history would
    # silently stop training. A fake input is a trace (torch.export of a
    # model whose parameters require grad): the graph is still inference
    # only, and running it on real tensors comes back here.
    if isinstance(inputs[0], torch._subclasses.fake_tensor.FakeTensor):
        return
    raise _err("QL_ENOTSUP", "qlinear layers are inference only: the input "
               "requires grad; run under torch.no_grad() or "
               "torch.inference_mode()")


def _no_backward(ctx, *grads):
    raise _err("QL_ENOTSUP", "qlinear layers have no backward")


# ------------------------------------------------------------------ linear
@torch.library.custom_op("qlinear::linear", mutates_args=(),
                         tags=(torch.Tag.cudagraph_unsafe,))
def linear(x: torch.Tensor, ident: torch.Tensor, out_features: int,
           path: int) -> torch.Tensor:
    """y = x·Wᵀ + b by the daemon, W named by ident (call mode)."""
    name, client = _resolve(ident)
    _call_device(name, x)
    try:
        k = _check_x(name, client, x, out_features)
        x2 = x.detach().reshape(-1, k).contiguous()
        y = torch.empty(tuple(x.shape[:-1]) + (out_features,), dtype=x.dtype,
                        device=x.device)
        if x2.shape[0] > 0:
            _run_one(client, name, x2, y.view(-1, out_features), path)
    except QLinearError as e:
        raise _named(name, e) from None
    if observers:
        _observe("linear", [name], x, [y])
    return y


@linear.register_fake
def _linear_fake(x, ident, out_features, path):
    return x.new_empty(tuple(x.shape[:-1]) + (out_features,))


linear.register_autograd(_no_backward, setup_context=_refuse_grad)


# ------------------------------------------------------------ linear_multi
@torch.library.custom_op("qlinear::linear_multi", mutates_args=(),
                         tags=(torch.Tag.cudagraph_unsafe,))
def linear_multi(x: torch.Tensor, idents: list[torch.Tensor],
                 out_features: list[int], path: int) -> list[torch.Tensor]:
    """Every weight of idents on x: one ql_linear_multi() round trip when
    the tensors fit a message, else one call each (same bytes)."""
    if len(idents) != len(out_features) or \
            not 1 <= len(idents) <= _lib.QL_MULTI_MAX:
        raise _err("QL_EINVAL", "linear_multi: 1 to %d idents, one "
                   "out_features each" % _lib.QL_MULTI_MAX)
    resolved = [_resolve(i) for i in idents]
    names = [r[0] for r in resolved]
    client = resolved[0][1]
    dev = _call_device(names[0], x)
    lead = tuple(x.shape[:-1])
    ys = [torch.empty(lead + (n,), dtype=x.dtype, device=x.device)
          for n in out_features]
    try:
        ks = {_check_x(nm, c, x, n)
              for (nm, c), n in zip(resolved, out_features)}
        k = ks.pop()
        x2 = x.detach().reshape(-1, k).contiguous()
        m = x2.shape[0]
        if m == 0:
            return ys
        dt = _DTYPES[x.dtype]
        p = _PATHS.get(path, path)
        one = all(c is client for _, c in resolved)
        if dev == "cuda":
            # One CUDA IPC request a weight: y stays on the GPU, so no
            # message size bounds it, and the multi request is inline only.
            for (nm, c), y, n in zip(resolved, ys, out_features):
                _run_one(c, nm, x2, y.view(-1, n), path)
        elif one and client.multi_fits(dt, m, k, out_features):
            client.linear_multi_raw(names, dt, m, k, x2.data_ptr(),
                                    list(out_features),
                                    [y.data_ptr() for y in ys], path=p)
        else:
            for (nm, c), y, n in zip(resolved, ys, out_features):
                c.linear_raw(nm, dt, m, k, x2.data_ptr(), n, y.data_ptr(),
                             path=p)
    except QLinearError as e:
        raise _named(",".join(names), e) from None
    if observers:
        _observe("linear_multi", names, x, ys)
    return ys


@linear_multi.register_fake
def _linear_multi_fake(x, idents, out_features, path):
    lead = tuple(x.shape[:-1])
    return [x.new_empty(lead + (n,)) for n in out_features]


linear_multi.register_autograd(_no_backward, setup_context=_refuse_grad)


# ----------------------------------------------------------- linear_mapped
# (name, client token, device index, dtype) -> (handle, libqlinear-cuda,
# max_rows): the mappings of this process, made by QLinear.map() or, for
# an ident seen first by the op (an exported program), by the op itself.
_mapped = {}
_CODES = {"f32": _lib.QL_DTYPE_F32, "f16": _lib.QL_DTYPE_F16,
          "bf16": _lib.QL_DTYPE_BF16}


def mapped_key(name, client, device, dtype):
    return (name, client_token(client), device.index, dtype)


def open_mapped(client, name, device, dtype, max_rows):
    """ql_mapped_open() of weight name on CUDA device for dtype
    activations: (handle, lib)."""
    L = _lib.load_mapped()
    # The daemon names a GPU by its UUID, as this process sees it.
    gpu = "cuda:GPU-%s" % torch.cuda.get_device_properties(device).uuid
    torch.cuda.init()
    h = ctypes.c_void_p()
    with torch.cuda.device(device), client._call() as c:
        rv = L.ql_mapped_open(c, name.encode(), gpu.encode(),
                              _CODES[_DTYPES[dtype]], max_rows,
                              ctypes.byref(h))
    if rv < 0:
        # ql_errmsg() is libqlinear's, where ql_map_weight failed
        raise QLinearError(rv, "layer %s: %s" % (
            name, client._lib.ql_errmsg().decode(errors="replace")))
    return h.value, L


@torch.library.custom_op("qlinear::linear_mapped", mutates_args=())
def linear_mapped(x: torch.Tensor, ident: torch.Tensor, out_features: int,
                  max_rows: int) -> torch.Tensor:
    """y = x·Wᵀ + b by qlinear's kernel in this process, on the current
    stream (mapped mode): no synchronisation, no allocation but y."""
    name, client = _resolve(ident)
    if x.device.type != "cuda":
        raise _err("QL_EINVAL", "layer %s is mapped: it takes CUDA input; "
                   "given %s" % (name, x.device))
    if x.dtype not in _DTYPES:
        raise _err("QL_EDTYPE", "layer %s takes float32, float16 or "
                   "bfloat16 input; given %s" % (name, x.dtype))
    dev = x.device if x.device.index is not None else \
        torch.device("cuda", torch.cuda.current_device())
    key = mapped_key(name, client, dev, x.dtype)
    hit = _mapped.get(key)
    if hit is None:
        h, L = open_mapped(client, name, dev, x.dtype, max_rows)
        hit = _mapped.setdefault(key, (h, L, max_rows, None))
    h, L, rows_max = hit[0], hit[1], hit[2]
    n = ctypes.c_uint64()
    k = ctypes.c_uint64()
    L.ql_mapped_shape(h, ctypes.byref(n), ctypes.byref(k))
    if x.dim() < 1 or x.shape[-1] != k.value or out_features != n.value:
        raise _err("QL_ESHAPE", "layer %s takes [..., %d] and gives %d; "
                   "given %s for %d" % (name, k.value, n.value,
                                        tuple(x.shape), out_features))
    x2 = x.detach().reshape(-1, k.value).contiguous()
    y = torch.empty(tuple(x.shape[:-1]) + (out_features,), dtype=x.dtype,
                    device=x.device)
    rows, esz = x2.shape[0], x2.element_size()
    stream = torch.cuda.current_stream(x.device).cuda_stream
    xp, yp = x2.data_ptr(), y.data_ptr()
    for r0 in range(0, rows, rows_max):
        r = min(rows_max, rows - r0)
        rv = L.ql_linear_mapped(h, xp + r0 * k.value * esz,
                                yp + r0 * out_features * esz, r, stream)
        if rv < 0:
            raise QLinearError(rv, "layer %s: ql_linear_mapped failed" % name)
    if observers:
        _observe("linear_mapped", [name], x, [y])
    return y


@linear_mapped.register_fake
def _linear_mapped_fake(x, ident, out_features, max_rows):
    return x.new_empty(tuple(x.shape[:-1]) + (out_features,))


linear_mapped.register_autograd(_no_backward, setup_context=_refuse_grad)
