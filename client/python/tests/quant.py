"""The error a format's quantization is expected to add, from DESIGN §4's
rules: each weight (and, on the activation-quantized path, each activation)
is rounded to a grid of step Δ, an error uniform in ±Δ/2 of variance Δ²/12,
independent from one element to the next. For y = x·Wᵀ that gives, per
output, var = Σk x²·Δw²/12 (+ Σk w²·Δx²/12). A test that finds the measured
error between 0.5 and 1.5 times this knows the daemon quantized as the
format says: neither more coarsely nor, silently, not at all.
"""

import numpy as np


def _rows_amax(a):
    return np.max(np.abs(a), axis=1, keepdims=True)


def _e4m3_step(a, amax):
    """Step of e4m3 rounding of a / (amax/448) at each element, in a's units
    (3 mantissa bits; subnormal below 2^-6)."""
    scale = np.maximum(amax, 1e-12) / 448.0
    s = np.abs(a) / scale
    e = np.floor(np.log2(np.maximum(s, 2.0 ** -6)))
    return 2.0 ** (e - 3) * scale


def weight_step(w, fmt):
    """Δ per element of w [n, k] for a format name."""
    w = w.astype(np.float64)
    n, k = w.shape
    if fmt == "q8c":
        return np.broadcast_to(_rows_amax(w) / 127.5, w.shape)
    if fmt == "f8r":
        return _e4m3_step(w, _rows_amax(w))
    gs = int(fmt[3:].rstrip("a"))
    step = np.empty_like(w)
    for g in range(0, k, gs):
        blk = w[:, g:g + gs]
        if fmt.startswith("q4g"):
            d = (blk.max(1, keepdims=True) - blk.min(1, keepdims=True)) / 15
        elif fmt.endswith("a"):
            d = (blk.max(1, keepdims=True) - blk.min(1, keepdims=True)) / 255
        else:
            d = _rows_amax(blk) / 127.5
        step[:, g:g + gs] = d
    return step


def act_step(x, fmt):
    """Δ per element of x [m, k] on the activation-quantized path: int8
    rows for the integer formats, e4m3 rows for f8r."""
    x = x.astype(np.float64)
    if fmt == "f8r":
        return _e4m3_step(x, _rows_amax(x))
    return np.broadcast_to(_rows_amax(x) / 127.5, x.shape)


def expected_nmse(x, w, fmt, path, bias=None):
    """The NMSE of y = x·Wᵀ + b that quantizing in fmt should give."""
    x = x.astype(np.float64)
    w = w.astype(np.float64)
    var = (x ** 2) @ (weight_step(w, fmt) ** 2 / 12).T
    if path == "aq":
        var += (act_step(x, fmt) ** 2 / 12) @ (w ** 2).T
    ref = x @ w.T + (0 if bias is None else bias)
    return float(var.sum() / np.sum(ref ** 2))
