"""qlinear: Python client of qlineard, the daemon that serves quantized
linear layers (y = x·Wᵀ + b) to local processes.

A thin binding over the C client library libqlinear (ctypes): the daemon's
protocol is spoken only there. NumPy arrays go in and out; tensors travel
through shared-memory regions. ``qlinear.torch`` swaps a PyTorch model's
``nn.Linear`` modules for modules that run on the daemon.

    import qlinear
    with qlinear.Client() as c:
        c.load("demo/proj", w, b, format="q4g128")
        y = c.linear("demo/proj", x)
"""

from .client import *  # noqa: F401,F403
from .client import __all__  # noqa: F401

__version__ = "0.1.0"
