"""Call mode on CUDA device memory (Client.linear_cuda_raw(), which
torch.ops.qlinear.linear runs for a CUDA tensor), end to end on the
emulated CUDA runtime: this process allocates "device" memory through
libqlinear-cuda's call-mode helper built against the emulated runtime
($QL_CUDAEMU_CLIENT_LIB, client/cuda/cuda_call.cpp, loaded as libqlinear-cuda
through QLINEAR_CUDA_LIB), and the daemon is qlineard-cudaemu on the same
two emulated GPUs (memfd-backed allocations it maps through their IPC
handles).

What only a real GPU can show is how torch hands over its tensors
(data_ptr() of the caching allocator's blocks, the current stream): the
op passes those to the same call tested here."""

import ctypes
import os
import threading

import numpy as np
import pytest

import qlinear
from conftest import Daemon

EMU_ENV = {"QL_EMU_CUDA_DEVICES": "2"}
N, K = 48, 200
H2D, D2H = 1, 2


@pytest.fixture(scope="module")
def emu():
    """The emulated runtime of this process (the helper library)."""
    path = os.environ.get("QL_CUDAEMU_CLIENT_LIB")
    assert path and os.path.exists(path), \
        "QL_CUDAEMU_CLIENT_LIB is not set to the built helper (make check sets it)"
    # The runtime reads its devices at first use; the daemon gets the same
    # variable, so both sides see the same GPUs with the same UUIDs.
    os.environ.update(EMU_ENV)
    os.environ["QLINEAR_CUDA_LIB"] = path
    lib = ctypes.CDLL(path)
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    for name, args in {"cudaMalloc": [ctypes.POINTER(vp), sz],
                       "cudaFree": [vp],
                       "cudaMemcpy": [vp, vp, sz, ctypes.c_int],
                       "cudaSetDevice": [ctypes.c_int],
                       "cudaStreamCreateWithFlags": [ctypes.POINTER(vp),
                                                     ctypes.c_uint],
                       "cudaStreamDestroy": [vp]}.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.c_int, args
    yield lib
    os.environ.pop("QLINEAR_CUDA_LIB", None)


@pytest.fixture(scope="module")
def emu_daemon(emu):
    path = os.environ.get("QLINEARD_CUDAEMU")
    assert path and os.path.exists(path), \
        "QLINEARD_CUDAEMU is not set (make check sets it)"
    d = Daemon(bin=path, env=EMU_ENV)
    yield d
    alive = d.proc.poll() is None
    log = d.text()
    d.stop()
    assert alive, "qlineard-cudaemu exited during the tests:\n" + log


@pytest.fixture
def ccl(emu_daemon):
    c = qlinear.Client(emu_daemon.address)
    yield c
    c.close()


class Dev:
    """One cudaMalloc of the emulated runtime on device ordinal dev."""

    def __init__(self, emu, nbytes, dev=0):
        self.emu = emu
        assert emu.cudaSetDevice(dev) == 0
        p = ctypes.c_void_p()
        assert emu.cudaMalloc(ctypes.byref(p), nbytes) == 0
        assert emu.cudaSetDevice(0) == 0
        self.ptr, self.nbytes = p.value, nbytes

    def put(self, a, at=0):
        a = np.ascontiguousarray(a)
        assert self.emu.cudaMemcpy(self.ptr + at, a.ctypes.data, a.nbytes,
                                   H2D) == 0

    def get(self, shape, dtype, at=0):
        out = np.empty(shape, dtype)
        assert self.emu.cudaMemcpy(out.ctypes.data, self.ptr + at,
                                   out.nbytes, D2H) == 0
        return out

    def free(self):
        self.emu.cudaFree(self.ptr)


def _load(ccl, name, fmt, rng, devices="cuda:0"):
    w = rng.standard_normal((N, K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    ccl.load(name, w, b, format=fmt, devices=devices)


@pytest.mark.parametrize("fmt", ["q4g128", "q8c"])
@pytest.mark.parametrize("path", ["wo", "aq"])
@pytest.mark.parametrize("m", [1, 5])
def test_device_memory_matches_inline(emu, ccl, rng, fmt, path, m):
    """y written into device memory equals the inline reply byte for
    byte, with x and y at offsets inside larger allocations (blocks of a
    caching allocator), on a stream of this process."""
    name = "cuda-call/%s" % fmt
    if name not in [w.name for w in ccl.list()]:
        _load(ccl, name, fmt, rng)
    x = rng.standard_normal((m, K)).astype(np.float32)
    ref = ccl.linear(name, x, path=path, via="inline")
    xa, ya = Dev(emu, 1 << 16), Dev(emu, 1 << 16)
    st = ctypes.c_void_p()
    assert emu.cudaStreamCreateWithFlags(ctypes.byref(st), 1) == 0
    try:
        xa.put(x, at=4096)
        info = ccl.linear_cuda_raw(name, "f32", m, K, xa.ptr + 4096, N,
                                   ya.ptr + 512, stream=st.value, path=path)
        assert info.path == path
        y = ya.get((m, N), np.float32, at=512)
        assert y.tobytes() == ref.tobytes()
        # the legacy default stream too
        ccl.linear_cuda_raw(name, "f32", m, K, xa.ptr + 4096, N, ya.ptr,
                            path=path)
        assert ya.get((m, N), np.float32).tobytes() == ref.tobytes()
    finally:
        emu.cudaStreamDestroy(st.value)
        xa.free()
        ya.free()


def test_bf16_on_second_gpu(emu, ccl, rng):
    """bf16 activations on the second GPU, where the weight lives: the
    slices name their own device, whatever the thread's current one."""
    name = "cuda-call/bf16"
    _load(ccl, name, "q8c", rng, devices="cuda:1")
    xf = rng.standard_normal((3, K)).astype(np.float32)
    x = (xf.view(np.uint32) >> 16).astype(np.uint16)  # bf16 by truncation
    ref = ccl.linear(name, x, dtype="bf16", via="inline")
    xa, ya = Dev(emu, x.nbytes, dev=1), Dev(emu, 3 * N * 2, dev=1)
    try:
        xa.put(x)
        ccl.linear_cuda_raw(name, "bf16", 3, K, xa.ptr, N, ya.ptr)
        assert ya.get((3, N), np.uint16).tobytes() == ref.tobytes()
    finally:
        xa.free()
        ya.free()


def test_threads_keep_their_own_events(emu, ccl, rng):
    """Calls from several threads at once, each on its own stream (each
    thread records its own event): every reply is right."""
    name = "cuda-call/threads"
    _load(ccl, name, "q4g128", rng)
    xs = [rng.standard_normal((2, K)).astype(np.float32) for _ in range(4)]
    refs = [ccl.linear(name, x, via="inline") for x in xs]
    bad = []

    def run(i):
        xa, ya = Dev(emu, xs[i].nbytes), Dev(emu, 2 * N * 4)
        st = ctypes.c_void_p()
        assert emu.cudaStreamCreateWithFlags(ctypes.byref(st), 1) == 0
        try:
            xa.put(xs[i])
            for _ in range(10):
                ccl.linear_cuda_raw(name, "f32", 2, K, xa.ptr, N, ya.ptr,
                                    stream=st.value)
                if ya.get((2, N), np.float32).tobytes() != refs[i].tobytes():
                    bad.append(i)
        except Exception as e:  # reported below, in the test's thread
            bad.append(repr(e))
        finally:
            emu.cudaStreamDestroy(st.value)
            xa.free()
            ya.free()

    ts = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert bad == []


def test_refusals(emu, ccl, rng):
    """Host memory, two devices, a range past its allocation and a GPU
    without the weight: each a QLinearError that says what is wrong, and
    the client keeps working."""
    name = "cuda-call/refusals"
    _load(ccl, name, "q8c", rng)
    xa, ya = Dev(emu, K * 4), Dev(emu, N * 4)
    y1 = Dev(emu, N * 4, dev=1)
    host = np.zeros((1, K), np.float32)
    try:
        with pytest.raises(qlinear.QLinearError) as e:
            ccl.linear_cuda_raw(name, "f32", 1, K, host.ctypes.data, N,
                                ya.ptr)
        assert e.value.code == qlinear.QL_EINVAL
        assert "device memory of one CUDA device" in str(e.value)
        with pytest.raises(qlinear.QLinearError) as e:
            ccl.linear_cuda_raw(name, "f32", 1, K, xa.ptr, N, y1.ptr)
        assert e.value.code == qlinear.QL_EINVAL
        with pytest.raises(qlinear.QLinearError) as e:  # 2 rows in 1 row
            ccl.linear_cuda_raw(name, "f32", 2, K, xa.ptr, N, ya.ptr)
        assert e.value.code == qlinear.QL_EINVAL
        other = "cuda-call/on-gpu1"
        _load(ccl, other, "q8c", rng, devices="cuda:1")
        with pytest.raises(qlinear.QLinearError) as e:
            ccl.linear_cuda_raw(other, "f32", 1, K, xa.ptr, N, ya.ptr)
        assert other in str(e.value) or "device" in str(e.value)
        with pytest.raises(qlinear.QLinearError) as e:
            ccl.linear_cuda_raw(name, "f64", 1, K, xa.ptr, N, ya.ptr)
        assert e.value.code == qlinear.QL_EDTYPE
        # still serving
        x = rng.standard_normal((1, K)).astype(np.float32)
        xa.put(x)
        ccl.linear_cuda_raw(name, "f32", 1, K, xa.ptr, N, ya.ptr)
        assert ya.get((1, N), np.float32).tobytes() == \
            ccl.linear(name, x, via="inline").tobytes()
    finally:
        xa.free()
        ya.free()
        y1.free()
