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
"""

import torch
from transformers.core_model_loading import ConversionOps
from transformers.quantizers.auto import (register_quantization_config,
                                          register_quantizer)
from transformers.quantizers.base import HfQuantizer
from transformers.quantizers.quantizers_utils import (get_module_from_name,
                                                      should_convert_module)
from transformers.utils.quantization_config import QuantizationConfigMixin

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

    def torchao_config(self):
        """The same settings as a qlinear.torchao.QlinearConfig."""
        return _qao.QlinearConfig(format=self.format, address=self.address,
                                  path=self.path, prefix=self.prefix,
                                  policy=self.policy,
                                  scale_dtype=self.scale_dtype)


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
        _qao.offload_linear(module, self.hf_quantizer.ao_config, path,
                            module_name=path)
        self.hf_quantizer.uploaded.append(module.weight.weight_name)
        if missing_keys is not None:
            missing_keys.discard(full_layer_name)
        module._is_hf_initialized = True
        for p in module.parameters(recurse=False):
            p._is_hf_initialized = True
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

    def validate_environment(self, *args, **kwargs):
        if self.pre_quantized:
            raise QLinearError(
                _qao._lib.ERRORS["QL_ENOTSUP"],
                "this checkpoint was saved quantized with method 'qlinear'; "
                "reloading such a checkpoint is not supported yet: load the "
                "float checkpoint with a QlinearConfig")
        # A daemon that is not running fails here, before any weight.
        _qao.client_for(self.ao_config.address)

    def _converts(self, name):
        return should_convert_module(name, self.modules_to_not_convert)

    def _process_model_before_weight_loading(self, model, **kwargs):
        self.modules_to_not_convert = self.get_modules_to_not_convert(
            model, self.quantization_config.modules_to_not_convert,
            getattr(model, "_keep_in_fp32_modules", None))
        # Every layer is checked before the first weight is read.
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and self._converts(name):
                self.ao_config.check(mod, name)

    def _process_model_after_weight_loading(self, model, **kwargs):
        # A layer the checkpoint did not have would run as a float layer
        # the loader made up: the load fails, and releases what it held.
        for name, mod in model.named_modules():
            if (isinstance(mod, torch.nn.Linear) and self._converts(name) and
                    not isinstance(mod.weight, _qao.QlinearTensor)):
                client = _qao.client_for(self.ao_config.address)
                for n in self.uploaded:
                    try:
                        client.unload(n)
                    except QLinearError:
                        pass
                self.uploaded = []
                raise QLinearError(
                    _qao._lib.ERRORS["QL_ENOTFOUND"],
                    "%s: the checkpoint has no weight for this layer; "
                    "nothing of this load stays resident" % name)
        return model

    def param_needs_quantization(self, model, param_name, **kwargs):
        module, tensor_name = get_module_from_name(model, param_name)
        return (isinstance(module, torch.nn.Linear) and
                tensor_name == "weight" and
                self._converts(param_name.rsplit(".", 1)[0]))

    def get_quantize_ops(self):
        return _Upload(self)

    def is_serializable(self):
        return False

    @property
    def is_trainable(self):
        return False

    @property
    def is_compileable(self):
        return True
