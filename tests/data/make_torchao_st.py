#!/usr/bin/env python3
"""
make_torchao_st.py - TorchAO-quantized weights saved to safetensors the way
TorchAO saves them, for tests/unit/test_ckpt_import.c.

For each case below, the packed arrays TorchAO made in tests/data/golden/
(make_golden.py) are put back into TorchAO's own tensor subclass
(Int4Tensor, Int4PlainInt32Tensor, Int8Tensor, Float8Tensor, via their
constructors), flattened with TorchAO's serializer
(torchao.prototype.safetensors.safetensors_support.flatten_tensor_state_dict:
tensors "<module>._weight_<part>" plus the subclass's JSON in the file's
__metadata__) and written with safetensors.torch.save_file. The reference
is the golden case's w_deq.npy, TorchAO's own dequantization, so the test
needs nothing new beside each file. (Only cases that TorchAO dequantizes in
the canonical q·s + z are used: for int4 with f32 scales TorchAO's
_int4_row_dequantize_zp rounds another formula, see test_golden.c.)

Run by hand with torch 2.15, torchao 0.18.0, numpy and safetensors; the
outputs (tests/data/torchao/*.safetensors) are committed.

    python tests/data/make_torchao_st.py [OUTDIR]
"""
import os
import sys
import warnings

warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from torchao.prototype.safetensors.safetensors_support import (  # noqa: E402
    flatten_tensor_state_dict)
from torchao.quantization import (Float8Tensor, Int4PlainInt32Tensor,  # noqa: E402
                                  Int4Tensor, Int8Tensor)

HERE = os.path.dirname(os.path.abspath(__file__))
LAYER = "model.layers.0.self_attn.o_proj"


def npy(case, name, dtype=None):
    a = np.load(os.path.join(HERE, "golden", case, name))
    t = torch.from_numpy(a.copy())
    if dtype == torch.bfloat16:
        t = t.view(torch.int16).view(torch.bfloat16)  # stored as '<u2' bits
    elif dtype == torch.float8_e4m3fn:
        t = t.view(torch.float8_e4m3fn)  # stored as '|u1' bytes
    return t


def meta(case):
    with open(os.path.join(HERE, "golden", case, "meta.txt")) as f:
        return dict(line.strip().split("=", 1) for line in f if "=" in line)


DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def build(case):
    m = meta(case)
    n, k, gs = int(m["n"]), int(m["k"]), int(m["group_size"])
    sdt = DT[m["scale_dtype"]]
    if case.startswith("q4g"):
        return Int4Tensor(npy(case, "qdata.npy"), npy(case, "scale.npy", sdt),
                          npy(case, "zero.npy", sdt), [1, gs], torch.Size([n, k]))
    if case.startswith("q4i"):
        return Int4PlainInt32Tensor(npy(case, "qdata.npy"),
                                    npy(case, "scale.npy", sdt),
                                    npy(case, "zero_point.npy"), [1, gs],
                                    torch.Size([n, k]))
    if case.startswith("q8c"):
        scale = npy(case, "scale.npy", sdt).reshape(n, 1)
        return Int8Tensor(npy(case, "qdata.npy"), scale, [1, k],
                          DT[m["src_dtype"]],
                          zero_point=torch.zeros(n, 1, dtype=torch.int8))
    if case.startswith("f8r"):
        scale = npy(case, "scale.npy", sdt).reshape(n, 1)
        return Float8Tensor(npy(case, "qdata.npy", torch.float8_e4m3fn), scale,
                            block_size=[1, k], dtype=DT[m["src_dtype"]])
    raise SystemExit(case)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "torchao")
    os.makedirs(out, exist_ok=True)
    for case in ("q4g_g128_bf16", "q4g_g32_bf16", "q4i_g128_f16", "q8c_bf16",
                 "f8r_f32"):
        t = build(case)
        sd = {LAYER + ".weight": t}
        if case == "q8c_bf16":  # a plain tensor beside the subclass
            sd[LAYER + ".bias"] = torch.linspace(-1, 1, t.shape[0]).to(torch.bfloat16)
        tensors, md = flatten_tensor_state_dict(sd)
        save_file(tensors, os.path.join(out, case + ".safetensors"), md)
        print(case, type(t).__name__, {k: (str(v.dtype), list(v.shape))
                                       for k, v in tensors.items()})


if __name__ == "__main__":
    main()
