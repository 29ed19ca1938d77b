"""qlinear as a TorchAO backend: ``quantize_(model, QlinearConfig(...))``.

    from torchao.quantization import quantize_
    import qlinear.torchao

    quantize_(model, qlinear.torchao.QlinearConfig(format="q4g128"))

uploads the weight of every nn.Linear quantize_ selects to qlineard (which
quantizes it, to TorchAO's own bytes for bf16 and f16 weights) and gives
the module a weight that is a tensor subclass, QlinearTensor: F.linear and
aten.linear on it run torch.ops.qlinear.linear, the op swap_linears'
modules run, so torch.compile and torch.export see one opaque op per
layer. The change is in place (the module stays an nn.Linear), which is
what TorchAO keeps when quantize_ is given a single module.

The config holds no client: an address (None: the default address), a
format, a path policy and a name prefix. Each address gets one client per
process, made when it is first needed (client_for()). Weights are named by
qlinear.torch.weight_name(), content-addressed, so equal layers share one
resident copy in any process of any user (docs/security.md).

The bias stays in the client, a parameter of the module as TorchAO leaves
it, and is added after the op; the daemon holds the weight alone.
"""

import dataclasses
import sys
import threading
import types
import weakref
from typing import Optional

import torch
from torchao.core.config import AOBaseConfig
from torchao.quantization.transform_module import \
    register_quantize_module_handler
from torchao.utils import TorchAOBaseTensor

from . import _lib, _ops
from .client import Client, QLinearError, parse_format
from .torch import _DTYPES, _host_bytes, weight_name

__all__ = ["QlinearConfig", "QlinearTensor", "client_for", "offload_linear",
           "offload_linears"]

aten = torch.ops.aten

_clients = {}
_clients_lock = threading.Lock()


def client_for(address=None):
    """The process's client of ``address`` (None: the default address),
    connected on first use and kept for the process's life."""
    with _clients_lock:
        c = _clients.get(address)
        if c is None or c.closed:
            c = Client(address)
            _clients[address] = c
        return c


@dataclasses.dataclass
class QlinearConfig(AOBaseConfig):
    """What quantize_ does to each selected nn.Linear: upload its weight to
    the qlineard at ``address`` (None: the default address) in ``format``
    ("q4g128", "q8c", "f8r", "q8b128", ...), to be run on ``path`` ("auto",
    "wo", "aq"). ``prefix`` starts every weight name; ``policy`` and
    ``scale_dtype`` are load()'s. For q4g and q8b formats, in_features must
    be a multiple of the group size (TorchAO's own rule)."""
    format: str = "q4g128"
    address: Optional[str] = None
    path: str = "auto"
    prefix: str = "torchao/"
    policy: str = "auto"
    scale_dtype: Optional[str] = None

    def check(self, linear, what="layer"):
        """Raises QLinearError, naming ``what``, when this config cannot
        offload ``linear``; nothing is uploaded."""
        try:
            code, group, _ = parse_format(self.format)
        except QLinearError as e:
            raise QLinearError(e.code, "%s: %s" % (what, e)) from None
        if self.path not in _ops.PATH_CODES:
            raise QLinearError(_lib.ERRORS["QL_EINVAL"],
                               "%s: path %r: auto, wo or aq"
                               % (what, self.path))
        k = linear.in_features
        if group and k % group != 0:
            raise QLinearError(_lib.ERRORS["QL_ESHAPE"],
                               "%s: in_features %d is not a multiple of the "
                               "group size %d of %s" % (what, k, group,
                                                        self.format))
        return code


class QlinearTensor(TorchAOBaseTensor):
    """The weight of an offloaded linear: shape [out_features,
    in_features] and the original dtype, no data in this process. ``ident``
    names the resident weight to the op (weight_ident(): data, so
    identical layers compile once); F.linear and aten.linear run
    torch.ops.qlinear.linear. Anything that reads its data raises."""

    tensor_data_names = ["ident"]
    tensor_attribute_names = ["out_features", "in_features", "orig_dtype",
                              "path_code", "weight_name"]

    def __new__(cls, ident, out_features, in_features, orig_dtype,
                path_code, weight_name):
        return torch.Tensor._make_wrapper_subclass(
            cls, (out_features, in_features), dtype=orig_dtype,
            device=ident.device, requires_grad=False)

    def __init__(self, ident, out_features, in_features, orig_dtype,
                 path_code, weight_name):
        self.ident = ident
        self.out_features = out_features
        self.in_features = in_features
        self.orig_dtype = orig_dtype
        self.path_code = path_code
        self.weight_name = weight_name

    def __reduce_ex__(self, protocol):
        # A pickle would hold the ident, not the weight: a checkpoint
        # without its weights is refused rather than written.
        raise QLinearError(_lib.ERRORS["QL_ENOTSUP"],
                           "weight %s is resident in qlineard: torch.save and "
                           "pickle cannot save it (qlinear.checkpoint.save() "
                           "or save_pretrained() write its bytes)"
                           % self.weight_name)

    def __repr__(self):
        return "QlinearTensor(%r, [%d, %d], %s)" % (
            self.weight_name, self.out_features, self.in_features,
            self.orig_dtype)


implements = QlinearTensor.implements
implements_torch_function = QlinearTensor.implements_torch_function


@implements(aten.linear.default)
@implements_torch_function(torch.nn.functional.linear)
def _linear(func, types_, args, kwargs):
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else (kwargs or {}).get("bias")
    y = torch.ops.qlinear.linear(x, w.ident, w.out_features, w.path_code)
    return y if bias is None else y + bias.to(y.dtype)


@implements([aten.t.default, aten.mm.default, aten.addmm.default,
             aten.matmul.default, aten.view.default, aten._to_copy.default])
def _no_data(func, types_, args, kwargs):
    w = next(a for a in args if isinstance(a, QlinearTensor))
    raise QLinearError(_lib.ERRORS["QL_ENOTSUP"],
                       "%s: weight %s is resident in qlineard; only linear "
                       "runs on it" % (func, w.weight_name))


def _offload_weight(linear, config, client, what, module_name):
    """Uploads (or holds) linear's weight as config says; returns its
    name. Nothing of the module changes."""
    w = linear.weight.detach().cpu()
    if w.dtype not in _DTYPES:
        w = w.float()
    # The daemon holds the weight only: the bias stays the module's.
    src = types.SimpleNamespace(weight=w, bias=None)
    hi = client.hello_info or client.hello()
    if not module_name:
        module_name = "%s_%dx%d" % (type(linear).__name__, linear.out_features,
                                    linear.in_features)
    name = weight_name(src, config.format, module_name, config.prefix,
                       quantizer_version=hi.quantizer_version,
                       scale_dtype=config.scale_dtype, policy=config.policy)
    try:
        client.hold(name)
    except QLinearError as e:
        if e.code != _lib.ERRORS["QL_ENOTFOUND"]:
            raise QLinearError(e.code, "%s: %s" % (what, e)) from None
        try:
            client.load(name, _host_bytes(w), None, format=config.format,
                        dtype=_DTYPES[w.dtype], policy=config.policy,
                        scale_dtype=config.scale_dtype)
        except QLinearError as e2:
            raise QLinearError(e2.code, "%s: %s" % (what, e2)) from None
    return name


def _set_weight(linear, config, client, name, dtype=None):
    """Gives linear the QlinearTensor of the resident weight name, for
    activations of ``dtype`` (None: the module's weight's)."""
    if dtype is None:
        dtype = linear.weight.dtype if linear.weight.dtype in _DTYPES else \
            torch.float32
    t = QlinearTensor(_ops.weight_ident(name, client), linear.out_features,
                      linear.in_features, dtype,
                      _ops.PATH_CODES[config.path], name)
    linear.weight = torch.nn.Parameter(t, requires_grad=False)
    if linear.bias is not None:
        # Inference only, as the op: no gradient flows into the layer.
        linear.bias.requires_grad_(False)


def _check_linear(module, config, what):
    if not isinstance(module, torch.nn.Linear):
        raise QLinearError(_lib.ERRORS["QL_EINVAL"],
                           "%s: QlinearConfig applies to nn.Linear, not %s"
                           % (what, type(module).__name__))
    if isinstance(module.weight, QlinearTensor):
        raise QLinearError(_lib.ERRORS["QL_EEXIST"],
                           "%s: its weight is already offloaded (%s)"
                           % (what, module.weight.weight_name))
    config.check(module, what)


def offload_linear(linear, config, what="layer", module_name=None):
    """What the quantize_ handler does to one nn.Linear, in place: checks
    config against it, uploads (or holds) its weight, and replaces
    linear.weight by a QlinearTensor. ``module_name`` (its path in the
    model, when known) goes into the weight's name; else its class and
    shape do. ``what`` names it in errors. Returns linear."""
    return offload_linears([(module_name, linear)], config, what)[0]


def offload_linears(layers, config, what=None):
    """offload_linear() for many layers as one step: ``layers`` is a list
    of (module path or None, nn.Linear). Every layer is checked before
    anything is uploaded, and if an upload fails, what this call uploaded
    or held is released and no module is changed, so that a failed call
    leaves neither half an offloaded model nor weights resident for it.
    ``what`` names a single layer in errors (else each layer's path).
    Returns the modules."""
    names = []
    for path, lin in layers:
        label = what or path or "%s(in_features=%d, out_features=%d)" % (
            type(lin).__name__, getattr(lin, "in_features", 0),
            getattr(lin, "out_features", 0))
        names.append(label)
        _check_linear(lin, config, label)
    client = client_for(config.address)  # no daemon: fails here
    held_before = set(client._held)
    done = []
    try:
        for (path, lin), label in zip(layers, names):
            done.append(_offload_weight(lin, config, client, label, path))
    except BaseException:
        for n in done:
            if n not in held_before:
                try:
                    client.unload(n)
                except QLinearError:
                    pass
        raise
    for (_, lin), name in zip(layers, done):
        _set_weight(lin, config, client, name)
    return [lin for _, lin in layers]


def _quantize_call():
    """The model and filter of the quantize_ call this handler runs in,
    from the frames of TorchAO's module walk
    (quant_api._replace_with_custom_fn_if_matches_filter, whose outermost
    call has the whole model), or None when it runs from anywhere else."""
    f = sys._getframe(2)
    outer = None
    while f is not None:
        code = f.f_code
        if code.co_name == "_replace_with_custom_fn_if_matches_filter" and \
                code.co_filename.endswith("quant_api.py"):
            outer = f
        f = f.f_back
    if outer is None:
        return None
    loc = outer.f_locals
    model, filter_fn = loc.get("model"), loc.get("filter_fn")
    if not isinstance(model, torch.nn.Module) or not callable(filter_fn):
        return None
    return model, filter_fn, loc.get("cur_fqn") or ""


def _selected(module, filter_fn, fqn):
    """(path, module) of each module quantize_ gives the handler, in its
    order: TorchAO's walk, which does not descend into a module its filter
    selects."""
    if filter_fn(module, fqn[:-1]):
        return [(fqn[:-1], module)]
    out = []
    for name, child in list(module.named_children()):
        out += _selected(child, filter_fn, "%s%s." % (fqn, name))
    return out


# Modules the running quantize_ call offloaded ahead of their turn: the
# handler, called for each of them later, takes them as done.
_ahead = weakref.WeakSet()


@register_quantize_module_handler(QlinearConfig)
def _qlinear_transform(module, config):
    if module in _ahead:
        _ahead.discard(module)
        return module
    call = _quantize_call()
    if call is None:  # not from quantize_'s walk: this module alone
        return offload_linear(module, config)
    # The whole call at once, on its first module: every selected layer is
    # checked before the first upload, each is named by its path, and a
    # failure leaves nothing resident and no module changed.
    model, filter_fn, fqn = call
    layers = _selected(model, filter_fn, fqn)
    if not any(m is module for _, m in layers):
        return offload_linear(module, config)
    offload_linears(layers, config)
    for _, m in layers:
        if m is not module:
            _ahead.add(m)
    return module
