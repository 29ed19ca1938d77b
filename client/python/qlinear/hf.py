"""qlinear as a Hugging Face transformers quantization method:

    import qlinear.hf
    model = AutoModelForCausalLM.from_pretrained(
        path, quantization_config=qlinear.hf.QlinearConfig(format="q4g128"))

registers the method "qlinear" (register_quantization_config and
register_quantizer). While from_pretrained loads the checkpoint, each
linear weight is uploaded to qlineard as soon as it is read and its module
gets a qlinear.torchao.QlinearTensor weight (the op
torch.ops.qlinear.linear): the float weights never exist all at once in
the client. Everything else (embeddings, norms, biases, and the modules
transformers keeps unconverted, such as a tied lm_head) stays in the
client as loaded. An embedding is never quantized as a linear.

Every layer is checked before the first weight is read: an unknown
format, a group size that a layer's in_features is not a multiple of, or
a daemon that is not running raise QLinearError naming the layer, with
nothing uploaded. Names come from qlinear.torch.weight_name() with the
layer's path, content-addressed (docs/security.md).

Checkpoints another method quantized load through the same quantizer when
from_pretrained is given a QlinearConfig: GPTQ and AWQ layers are
converted exactly (qlinear.checkpoint.convert_quantized(), the conversion
`qlinearctl import` does) and TorchAO's safetensors tensors (Int4Tensor,
Int8Tensor, Float8Tensor) are uploaded as they are, each under the
content-addressed name of what is sent. save_pretrained reads every
offloaded weight back from the daemon and writes it as TorchAO's tensor
of its bytes (qlinear.checkpoint.state_dict()), which from_pretrained
reloads through this quantizer; a weight with no TorchAO form (q8b)
fails the save before a file is written.
"""

import copy

import torch
from transformers.core_model_loading import ConversionOps
from transformers.quantizers.auto import (register_quantization_config,
                                          register_quantizer)
from transformers.quantizers.base import HfQuantizer
from transformers.quantizers.quantizers_utils import (get_module_from_name,
                                                      should_convert_module)
from transformers.utils.quantization_config import QuantizationConfigMixin

from transformers.quantizers import auto as _hf_auto

from . import checkpoint as _ckpt
from . import torchao as _qao
from .client import QLinearError

__all__ = ["QlinearConfig", "QlinearHfQuantizer"]


@register_quantization_config("qlinear")
class QlinearConfig(QuantizationConfigMixin):
    """from_pretrained's quantization_config for qlinear: as
    qlinear.torchao.QlinearConfig (format, address, path, prefix, policy,
    scale_dtype), and ``modules_to_not_convert`` (module names or
    patterns; None: transformers' default, the output embeddings)."""

    def __init__(self, format="q4g128", address=None, path="auto",
                 prefix="hf/", policy="auto", scale_dtype=None,
                 modules_to_not_convert=None, **kwargs):
        self.quant_method = "qlinear"
        self.format = format
        self.address = address
        self.path = path
        self.prefix = prefix
        self.policy = policy
        self.scale_dtype = scale_dtype
        self.modules_to_not_convert = modules_to_not_convert

    def to_dict(self):
        # The address is this machine's, not the model's: never saved.
        d = dict(super().to_dict())
        d.pop("address", None)
        d.pop("source_quantization", None)
        return d

    def get_loading_attributes(self):
        """What a config given to from_pretrained changes in the one a
        saved checkpoint carries: where the daemon is."""
        return {"address": self.address} if self.address is not None else {}

    def torchao_config(self):
        """The same settings as a qlinear.torchao.QlinearConfig."""
        return _qao.QlinearConfig(format=self.format, address=self.address,
                                  path=self.path, prefix=self.prefix,
                                  policy=self.policy,
                                  scale_dtype=self.scale_dtype)


# from_pretrained of a saved checkpoint given a QlinearConfig too takes the
# address from it (merge_quantization_configs).
if QlinearConfig not in _hf_auto.LOADING_ATTRIBUTES_CONFIG_TYPES:
    _hf_auto.LOADING_ATTRIBUTES_CONFIG_TYPES = (
        tuple(_hf_auto.LOADING_ATTRIBUTES_CONFIG_TYPES) + (QlinearConfig,))

# Checkpoints another method quantized (GPTQ, AWQ, TorchAO's own): a
# QlinearConfig given to from_pretrained takes their layers to qlineard,
# where transformers would otherwise insist on the checkpoint's own method.
_SOURCE_METHODS = ("gptq", "awq", "torchao")
_merge = _hf_auto.AutoHfQuantizer.merge_quantization_configs.__func__


def _merge_configs(cls, quantization_config, quantization_config_from_args):
    if isinstance(quantization_config_from_args, QlinearConfig):
        d = quantization_config if isinstance(quantization_config, dict) \
            else quantization_config.to_dict()
        method = d.get("quant_method")
        method = getattr(method, "value", method)
        if method != "qlinear":
            if method not in _SOURCE_METHODS:
                raise QLinearError(
                    _qao._lib.ERRORS["QL_ENOTSUP"],
                    "this checkpoint is quantized with %r: qlinear loads "
                    "GPTQ, AWQ and TorchAO checkpoints" % (method,))
            cfg = copy.copy(quantization_config_from_args)
            cfg.source_quantization = dict(d, quant_method=method)
            return cfg
    return _merge(cls, quantization_config, quantization_config_from_args)


if getattr(_hf_auto.AutoHfQuantizer.merge_quantization_configs, "__func__",
           None) is not _merge_configs:
    _hf_auto.AutoHfQuantizer.merge_quantization_configs = classmethod(
        _merge_configs)


def _release(hf_quantizer):
    """A failed load: what it had uploaded or held is released."""
    client = _qao.client_for(hf_quantizer.ao_config.address)
    for n in hf_quantizer.uploaded:
        if n not in hf_quantizer.held_before:
            try:
                client.unload(n)
            except QLinearError:
                pass
    hf_quantizer.uploaded = []


def _done(module, full_layer_name, missing_keys):
    if missing_keys is not None:
        missing_keys.discard(full_layer_name)
    module._is_hf_initialized = True
    for p in module.parameters(recurse=False):
        p._is_hf_initialized = True


class _Upload(ConversionOps):
    """Runs as from_pretrained reads each linear weight: sets it on its
    module, then offloads the module (qlinear.torchao.offload_linear)."""

    def __init__(self, hf_quantizer):
        self.hf_quantizer = hf_quantizer

    def convert(self, input_dict, model=None, full_layer_name=None,
                missing_keys=None, **kwargs):
        _, value = tuple(input_dict.items())[0]
        value = value[0] if isinstance(value, list) else value
        module, tensor_name = get_module_from_name(model, full_layer_name)
        module._parameters[tensor_name] = torch.nn.Parameter(
            value, requires_grad=False)
        path = full_layer_name.rsplit(".", 1)[0]
        try:
            _qao.offload_linear(module, self.hf_quantizer.ao_config, path,
                                module_name=path)
        except BaseException:
            _release(self.hf_quantizer)
            raise
        self.hf_quantizer.uploaded.append(module.weight.weight_name)
        _done(module, full_layer_name, missing_keys)
        return {}


class _Reload(ConversionOps):
    """Runs as from_pretrained reads each weight of a checkpoint that
    save_pretrained wrote (TorchAO tensors flattened into safetensors):
    rebuilds the TorchAO tensor and attaches its module to the daemon
    (qlinear.checkpoint.attach())."""

    def __init__(self, hf_quantizer):
        self.hf_quantizer = hf_quantizer

    def convert(self, input_dict, source_patterns=None, model=None,
                full_layer_name=None, missing_keys=None, **kwargs):
        from torchao.prototype.safetensors.safetensors_support import \
            unflatten_tensor_state_dict
        q = self.hf_quantizer
        module, _ = get_module_from_name(model, full_layer_name)
        path = full_layer_name.rsplit(".", 1)[0]
        try:
            parts = {}
            for suffix, value in input_dict.items():
                value = value[0] if isinstance(value, list) else value
                parts["%s.%s" % (path, suffix)] = value
            sd, _ = unflatten_tensor_state_dict(parts, q.metadata)
            t = sd.get(full_layer_name)
            if t is None:
                raise QLinearError(
                    _qao._lib.ERRORS["QL_EINVAL"],
                    "%s: the checkpoint's tensors %s do not make its weight"
                    % (path, ", ".join(sorted(input_dict))))
            name = _ckpt.attach(module, path, t,
                                q.entries.get(full_layer_name), q.ao_config)
        except BaseException:
            _release(q)
            raise
        q.uploaded.append(name)
        _done(module, full_layer_name, missing_keys)
        return {}


class _ReloadQuantized(ConversionOps):
    """Runs as from_pretrained reads each layer of a GPTQ or AWQ
    checkpoint (X.qweight, X.qzeros, X.scales, X.g_idx): converts it
    exactly (qlinear.checkpoint.convert_quantized()) and uploads it as it
    is, or holds it when the daemon has that content already."""

    def __init__(self, hf_quantizer):
        self.hf_quantizer = hf_quantizer

    def convert(self, input_dict, source_patterns=None, model=None,
                full_layer_name=None, missing_keys=None, **kwargs):
        q = self.hf_quantizer
        module, _ = get_module_from_name(model, full_layer_name)
        path = full_layer_name.rsplit(".", 1)[0]
        try:
            parts = {}
            for suffix, value in input_dict.items():
                parts[suffix] = value[0] if isinstance(value, list) else value
            packed = _ckpt.convert_quantized(
                path, parts.get("qweight"), parts.get("qzeros"),
                parts.get("scales"), parts.get("g_idx"), q.source)
            client = _qao.client_for(q.ao_config.address)
            dtype = module.weight.dtype if module.weight is not None else \
                torch.float32
            name, dtype = _ckpt.acquire_packed(module, path, packed, None,
                                               q.ao_config, client, dtype)
            _qao._set_weight(module, q.ao_config, client, name, dtype)
        except BaseException:
            _release(q)
            raise
        q.uploaded.append(name)
        _done(module, full_layer_name, missing_keys)
        return {}


@register_quantizer("qlinear")
class QlinearHfQuantizer(HfQuantizer):
    """The loader side of QlinearConfig (see the module's docstring)."""

    requires_calibration = False

    def __init__(self, quantization_config, **kwargs):
        super().__init__(quantization_config, **kwargs)
        self.ao_config = quantization_config.torchao_config()
        self.modules_to_not_convert = []
        self.uploaded = []  # names this load offloaded, in order
        self.held_before = set()
        self.metadata = {}
        self.entries = {}
        # The checkpoint's own quantization_config when another method made
        # it (from_pretrained given a QlinearConfig), else None.
        self.source = getattr(quantization_config, "source_quantization",
                              None)
        self.method = (self.source or {}).get("quant_method", "qlinear")

    def validate_environment(self, *args, **kwargs):
        # A daemon that is not running fails here, before any weight.
        client = _qao.client_for(self.ao_config.address)
        self.held_before = set(client._held)

    def _converts(self, name):
        return should_convert_module(name, self.modules_to_not_convert)

    def _process_model_before_weight_loading(self, model, checkpoint_files=None,
                                             **kwargs):
        self.modules_to_not_convert = self.get_modules_to_not_convert(
            model, self.quantization_config.modules_to_not_convert,
            getattr(model, "_keep_in_fp32_modules", None))
        if self.pre_quantized:
            self._read_metadata(checkpoint_files)
            if self.method in ("gptq", "awq"):
                self._read_shapes(checkpoint_files)
        # Every layer is checked before the first weight is read.
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and self._converts(name):
                if self.pre_quantized and self.method in ("gptq", "awq"):
                    self._check_quantized(mod, name)
                elif self.pre_quantized:
                    self._check_saved(mod, name)
                else:
                    self.ao_config.check(mod, name)

    def _read_metadata(self, checkpoint_files):
        from safetensors import safe_open
        md = {}
        for f in checkpoint_files or []:
            if not str(f).endswith(".safetensors"):
                raise QLinearError(
                    _qao._lib.ERRORS["QL_EINVAL"],
                    "%s: a qlinear checkpoint is safetensors" % f)
            with safe_open(f, framework="pt") as h:
                md.update(h.metadata() or {})
        self.metadata = md
        self.entries = _ckpt.entries(md)

    def _read_shapes(self, checkpoint_files):
        from safetensors import safe_open
        self.shapes = {}
        for f in checkpoint_files or []:
            with safe_open(f, framework="pt") as h:
                for key in h.keys():
                    self.shapes[key] = list(h.get_slice(key).get_shape())

    def _check_quantized(self, mod, name):
        """A GPTQ or AWQ layer has its tensors, and a qweight of the
        module's shape (the conversion checks everything else as it
        reads each layer)."""
        qw = self.shapes.get(name + ".qweight")
        if qw is None:
            if name + ".weight" in self.shapes:
                return  # left in float by its quantizer: loaded as it is
            raise QLinearError(_qao._lib.ERRORS["QL_ENOTFOUND"],
                               "%s: the checkpoint has no %s.qweight"
                               % (name, name))
        for part in ("qzeros", "scales"):
            if name + "." + part not in self.shapes:
                raise QLinearError(_qao._lib.ERRORS["QL_ENOTFOUND"],
                                   "%s: the checkpoint has no %s.%s"
                                   % (name, name, part))
        bits = int((self.source or {}).get("bits") or 4)
        k, n = mod.in_features, mod.out_features
        want = [k * bits // 32, n] if self.method == "gptq" else \
            [k, n * bits // 32]
        if len(qw) != 2 or qw != want:
            raise QLinearError(_qao._lib.ERRORS["QL_ESHAPE"],
                               "%s: %s.qweight is %s; a %d-bit %s layer of "
                               "[%d, %d] has %s" % (name, name, qw, bits,
                                                   self.method.upper(), n, k,
                                                   want))

    def _check_saved(self, mod, name):
        """A saved layer agrees with its module: a TorchAO tensor of a
        format qlinear serves, of the module's shape (from the metadata,
        before any tensor is read)."""
        import json
        raw = self.metadata.get(name + ".weight")
        if raw is None:
            return  # a float weight: loaded as it is, or missing (after)
        try:
            desc = json.loads(raw)
            kind = desc.get("_type")
            data = desc.get("_data") or {}
            bs = list(data.get("block_size") or [])
            shape = list(data.get("shape") or [])
        except (ValueError, AttributeError, TypeError):
            raise QLinearError(_qao._lib.ERRORS["QL_EINVAL"],
                               "%s: the checkpoint's description of its "
                               "weight is not valid JSON" % name) from None
        if kind == "Tensor":
            return
        if kind not in ("Int4Tensor", "Int8Tensor", "Float8Tensor"):
            raise QLinearError(_qao._lib.ERRORS["QL_ENOTSUP"],
                               "%s: a TorchAO %s cannot be loaded into "
                               "qlineard (Int4Tensor, Int8Tensor and "
                               "Float8Tensor can)" % (name, kind))
        want = [mod.out_features, mod.in_features]
        if shape and shape != want:
            raise QLinearError(_qao._lib.ERRORS["QL_ESHAPE"],
                               "%s: the checkpoint's weight is %s, the layer "
                               "%s" % (name, shape, want))
        ok = (len(bs) == 2 and bs[0] == 1 and
              (bs[1] in (32, 64, 128, 256) if kind == "Int4Tensor"
               else bs[1] == mod.in_features))
        if not ok:
            raise QLinearError(_qao._lib.ERRORS["QL_ESHAPE"],
                               "%s: %s block size %s is no qlinear format"
                               % (name, kind, bs))

    def _process_model_after_weight_loading(self, model, **kwargs):
        # A layer the checkpoint did not have would run as a float layer
        # the loader made up: the load fails, and releases what it held.
        for name, mod in model.named_modules():
            if (isinstance(mod, torch.nn.Linear) and self._converts(name) and
                    not isinstance(mod.weight, _qao.QlinearTensor)):
                _release(self)
                raise QLinearError(
                    _qao._lib.ERRORS["QL_ENOTFOUND"],
                    "%s: the checkpoint has no weight for this layer; "
                    "nothing of this load stays resident" % name)
        return model

    def param_needs_quantization(self, model, param_name, **kwargs):
        if self.pre_quantized:
            return False  # its layers come through get_weight_conversions
        module, tensor_name = get_module_from_name(model, param_name)
        return (isinstance(module, torch.nn.Linear) and
                tensor_name == "weight" and
                self._converts(param_name.rsplit(".", 1)[0]))

    def get_quantize_ops(self):
        return _Upload(self)

    @property
    def serialized_names(self):
        # The parts a checkpoint holds for a linear weight: TorchAO's
        # serializer's (a qlinear or TorchAO checkpoint), or GPTQ's and
        # AWQ's tensors; a layer is collected from them
        # (get_weight_conversions()).
        if not self.pre_quantized:
            return {}
        if self.method in ("gptq", "awq"):
            return {"weight": ["qweight", "qzeros", "scales", "g_idx"]}
        return {"weight": ["_weight_qdata", "_weight_scale",
                           "_weight_zero_point", "_weight_act_pre_scale"]}

    def get_load_operations(self):
        if self.method in ("gptq", "awq"):
            return {"deserialize": _ReloadQuantized}
        return {"deserialize": _Reload}

    def get_state_dict_and_metadata(self, model):
        # Every offloaded weight read back from the daemon as TorchAO's
        # tensors (qlinear.checkpoint.state_dict()): the checkpoint holds
        # all of them, and from_pretrained reloads it through _Reload.
        from . import checkpoint
        return checkpoint.state_dict(model)

    def is_serializable(self):
        return True

    @property
    def is_trainable(self):
        return False

    @property
    def is_compileable(self):
        return True
