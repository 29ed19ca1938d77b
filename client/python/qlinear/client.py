"""The Python face of libqlinear: a Client, its Regions, and NumPy arrays in
and out.

Every call goes through the C library (see _lib.py): the protocol, the
session, the upload in chunks and the region descriptors are all its work.
What this module adds is the translation between NumPy arrays (or raw
pointers, for the torch module) and the C calls, and one exception class.
"""

import contextlib
import ctypes
import dataclasses
import os
import re
import threading
import weakref

import numpy as np

from . import _lib

__all__ = [
    "QLinearError", "Client", "Region", "WeightInfo", "HelloInfo", "Device",
    "Stats", "WeightStats", "DeviceMemory", "UserStats", "LinearInfo",
    "ExportedWeight", "parse_format",
    "format_name", "default_address", "default_admin_address", "strerror",
    "err_name", "source_digest", "packed_source_digest",
]

# Error codes as module constants, QL_EINVAL and friends.
globals().update(_lib.ERRORS)
__all__ += list(_lib.ERRORS)
_ERROR_NAMES = {v: k for k, v in _lib.ERRORS.items()}


class QLinearError(Exception):
    """Any failure of a qlinear call.

    ``code`` is the negative QL_E* code (qlinear.QL_ENOTFOUND, ...),
    ``name`` its symbolic name ("QL_ENOTFOUND") and ``message`` the
    explanation: the daemon's Status.message, or libqlinear's or this
    package's description of a local failure.
    """

    def __init__(self, code, message=""):
        self.code = int(code)
        self.name = _ERROR_NAMES.get(self.code, "QL_E%d" % -self.code)
        self.message = message
        text = "%s: %s" % (self.name, _describe(self.code))
        if message:
            text += ": " + message
        super().__init__(text)


def _describe(code):
    """ql_strerror() when the library is loaded, else the symbolic name."""
    for lib in _lib._loaded.values():
        return lib.ql_strerror(code).decode()
    return _ERROR_NAMES.get(code, "unknown error")


def _check(lib, rv):
    """Raises QLinearError for a negative return value. ql_errmsg() is read
    at once: it is thread-local and the next call on this thread clears it
    (ctypes runs the call and this check on the same thread)."""
    if rv < 0:
        raise QLinearError(rv, lib.ql_errmsg().decode(errors="replace"))
    return rv


def strerror(code):
    """The C library's description of an error code."""
    return _lib.load().ql_strerror(code).decode()


def err_name(code):
    """The symbolic name of an error code, e.g. "QL_EINVAL"."""
    return _lib.load().ql_err_name(code).decode()


def default_address(lib=None):
    """The address ql_connect() uses when given none (QLINEAR_ADDRESS, else
    the XDG runtime directory, else /tmp/qlinear-UID)."""
    L = _lib.load(lib)
    buf = ctypes.create_string_buffer(4096)
    _check(L, L.ql_default_address(buf, len(buf)))
    return buf.value.decode()


def default_admin_address(lib=None):
    """The admin socket address ql_connect(admin=1) uses by default."""
    L = _lib.load(lib)
    buf = ctypes.create_string_buffer(4096)
    _check(L, L.ql_default_admin_address(buf, len(buf)))
    return buf.value.decode()


# ----------------------------------------------------------------- formats
_FORMAT_RE = re.compile(r"^(?:(q8c|f8r)|(q4g|q8b)(32|64|128|256)(a?))$")
_FORMAT_CODES = {"q4g": _lib.QL_FORMAT_Q4G, "q8c": _lib.QL_FORMAT_Q8C,
                 "q8b": _lib.QL_FORMAT_Q8B, "f8r": _lib.QL_FORMAT_F8R}
_FORMAT_STEMS = {v: k for k, v in _FORMAT_CODES.items()}


def parse_format(fmt):
    """Parses a format name as qlinearctl spells it: "q4g32" .. "q4g256",
    "q8c", "q8b32" .. "q8b256" (with a trailing "a" for the asymmetric
    form), "f8r". Returns (format code, group size, asymmetric)."""
    m = _FORMAT_RE.match(fmt) if isinstance(fmt, str) else None
    if m is None or (m.group(2) == "q4g" and m.group(4)):
        raise QLinearError(_lib.ERRORS["QL_EFORMAT"],
                           "unknown format %r: q4g<G>, q8c, q8b<B>[a] or "
                           "f8r with G, B in 32, 64, 128, 256" % (fmt,))
    if m.group(1):
        return _FORMAT_CODES[m.group(1)], 0, False
    return _FORMAT_CODES[m.group(2)], int(m.group(3)), bool(m.group(4))


def format_name(code, group_size=0, asymmetric=False):
    """The inverse of parse_format(); a code this package does not know
    shows as "format<code>"."""
    stem = _FORMAT_STEMS.get(code)
    if stem is None:
        return "format%d" % code
    if code in (_lib.QL_FORMAT_Q4G, _lib.QL_FORMAT_Q8B):
        return "%s%d%s" % (stem, group_size, "a" if asymmetric else "")
    return stem


_PATHS = {"auto": _lib.QL_PATH_AUTO, "wo": _lib.QL_PATH_WEIGHT_ONLY,
          "weight_only": _lib.QL_PATH_WEIGHT_ONLY,
          "aq": _lib.QL_PATH_ACT_QUANT, "act_quant": _lib.QL_PATH_ACT_QUANT}
_PATH_NAMES = {_lib.QL_PATH_AUTO: "auto", _lib.QL_PATH_WEIGHT_ONLY: "wo",
               _lib.QL_PATH_ACT_QUANT: "aq"}


def _path_code(path):
    if isinstance(path, int) and path in _PATH_NAMES:
        return path
    code = _PATHS.get(path) if isinstance(path, str) else None
    if code is None:
        raise QLinearError(_lib.ERRORS["QL_EINVAL"],
                           "unknown path %r: auto, wo or aq" % (path,))
    return code


# ------------------------------------------------------------------ dtypes
_DTYPE_CODES = {"f32": _lib.QL_DTYPE_F32, "f16": _lib.QL_DTYPE_F16,
                "bf16": _lib.QL_DTYPE_BF16}
_DTYPE_NAMES = {v: k for k, v in _DTYPE_CODES.items()}
_DTYPE_SIZES = {_lib.QL_DTYPE_F32: 4, _lib.QL_DTYPE_F16: 2,
                _lib.QL_DTYPE_BF16: 2}


def _dtype_code(arr, dtype):
    """The ql_dtype of a float array. NumPy has no bfloat16: one is either
    ml_dtypes' bfloat16 or a uint16 array with dtype="bf16"."""
    if dtype is not None:
        code = _DTYPE_CODES.get(dtype)
        if code is None:
            raise QLinearError(_lib.ERRORS["QL_EDTYPE"],
                               "dtype %r: f32, f16 or bf16" % (dtype,))
        # The array's own type, or for bf16 its bits in a 16-bit integer
        # array: anything else would be reinterpreted, not converted.
        if arr.dtype.name not in _DTYPE_CARRIERS[dtype] or \
                not arr.dtype.isnative:
            raise QLinearError(_lib.ERRORS["QL_EDTYPE"],
                               "array of %s given as %s (accepted: %s, in "
                               "native byte order)" % (
                                   arr.dtype.str, dtype,
                                   ", ".join(_DTYPE_CARRIERS[dtype])))
        return code
    if arr.dtype == np.float32:
        return _lib.QL_DTYPE_F32
    if arr.dtype == np.float16:
        return _lib.QL_DTYPE_F16
    if arr.dtype.name == "bfloat16":
        return _lib.QL_DTYPE_BF16
    raise QLinearError(_lib.ERRORS["QL_EDTYPE"],
                       "array of %s: float32, float16, or bfloat16 "
                       "(ml_dtypes, or uint16 with dtype='bf16')" % arr.dtype)


_ADT_BY_NUMPY = {"float32": _lib.QL_ADT_F32, "float16": _lib.QL_ADT_F16,
                 "bfloat16": _lib.QL_ADT_BF16, "int8": _lib.QL_ADT_I8,
                 "uint8": _lib.QL_ADT_U8, "int32": _lib.QL_ADT_I32,
                 "float8_e4m3fn": _lib.QL_ADT_F8E4M3}
_ADT_BY_NAME = {"f32": _lib.QL_ADT_F32, "f16": _lib.QL_ADT_F16,
                "bf16": _lib.QL_ADT_BF16, "i8": _lib.QL_ADT_I8,
                "u8": _lib.QL_ADT_U8, "i32": _lib.QL_ADT_I32,
                "e4m3": _lib.QL_ADT_F8E4M3}
# The NumPy dtypes an (array, NAME) pair may hold: the type itself, or for
# the types NumPy lacks their bits in an integer array of the same size.
_ADT_CARRIERS = {"f32": ("float32",), "f16": ("float16",),
                 "bf16": ("bfloat16", "uint16", "int16"), "i8": ("int8",),
                 "u8": ("uint8",), "i32": ("int32",),
                 "e4m3": ("float8_e4m3fn", "uint8", "int8")}
# The NumPy dtypes an array given with dtype=NAME (a float) may have.
_DTYPE_CARRIERS = {k: _ADT_CARRIERS[k] for k in _DTYPE_CODES}


def _c_contig(arr):
    """arr as a C-contiguous ndarray (a copy only when it is not one)."""
    return np.ascontiguousarray(arr)


def _packed(arr, what):
    """A ql_packed_array for arr, which is an array (its dtype says the
    element type), a pair (array, element type name) for the types NumPy
    lacks ("bf16" in uint16, "e4m3" in uint8), or None (absent). Returns
    the struct and the contiguous array that must outlive the call."""
    if arr is None:
        return _lib.ql_packed_array(), None
    dt = None
    if isinstance(arr, tuple):
        arr, name = arr
        dt = _ADT_BY_NAME.get(name)
        if dt is None:
            raise QLinearError(_lib.ERRORS["QL_EDTYPE"],
                               "%s: element type %r" % (what, name))
        arr = np.asarray(arr)
        # The library reads shape x size-of-NAME bytes: an array of other
        # elements would be read past its end, or reinterpreted.
        if arr.dtype.name not in _ADT_CARRIERS[name]:
            raise QLinearError(_lib.ERRORS["QL_EDTYPE"],
                               "%s: an array of %s given as %s (accepted: "
                               "%s)" % (what, arr.dtype, name,
                                        ", ".join(_ADT_CARRIERS[name])))
    arr = np.asarray(arr)
    if not arr.dtype.isnative:  # the same numbers, in this machine's order
        arr = arr.astype(arr.dtype.newbyteorder("="))
    arr = _c_contig(arr)
    if dt is None:
        dt = _ADT_BY_NUMPY.get(arr.dtype.name)
        if dt is None:
            raise QLinearError(_lib.ERRORS["QL_EDTYPE"],
                               "%s: arrays of %s are not accepted"
                               % (what, arr.dtype))
    if arr.ndim not in (1, 2):
        raise QLinearError(_lib.ERRORS["QL_ESHAPE"],
                           "%s has %d dimensions, not 1 or 2"
                           % (what, arr.ndim))
    pa = _lib.ql_packed_array()
    pa.data = arr.ctypes.data
    pa.dtype = dt
    pa.ndim = arr.ndim
    pa.shape[0] = arr.shape[0]
    pa.shape[1] = arr.shape[1] if arr.ndim == 2 else 0
    return pa, arr


# ----------------------------------------------------------- result types
@dataclasses.dataclass
class Device:
    """One device of the daemon, as Hello lists it."""
    name: str
    kind: str
    alias: str


@dataclasses.dataclass
class HelloInfo:
    """What the daemon says about itself (ql_hello)."""
    protocol_version: int
    daemon_version: str
    instance_id: bytes
    max_message_bytes: int
    max_chunk_bytes: int
    devices: list
    n_devices_total: int
    # the version of the daemon's quantization rules (ql_hello_info)
    quantizer_version: int = 1


@dataclasses.dataclass
class WeightInfo:
    """A resident weight (ql_weight_info). ``shared`` is set by load():
    True when an identical weight was already resident under the name."""
    name: str
    format: str
    format_code: int
    group_size: int
    n: int
    k: int
    has_bias: bool
    asymmetric: bool
    persistent: bool
    policy: str
    scale_dtype: str
    digest: str
    bytes_resident: int
    crossover_rows: int
    crossover_measured: bool
    devices: list
    shared: bool = None
    #: the source digest of its load in hex (qlinear.source_digest()), or
    #: None where the daemon does not know it
    source_digest: str = None


@dataclasses.dataclass
class LinearInfo:
    """How a linear call was served: the path that ran ("wo" or "aq") and
    the kernel implementation."""
    path: str
    impl: str


@dataclasses.dataclass
class WeightStats:
    """Counters of one weight on one device (ql_weight_stats)."""
    weight: str
    device: str
    requests: int
    rows: int
    batches: int
    wo_batches: int
    aq_batches: int
    queue_ns: int
    kernel_ns: int
    impl: str
    bytes_resident: int
    expired: int
    queue_hist: list
    kernel_hist: list
    crossover_rows: int
    crossover_measured: bool


@dataclasses.dataclass
class DeviceMemory:
    """Weight memory of one device against its budget."""
    device: str
    bytes_resident: int
    budget_bytes: int


@dataclasses.dataclass
class Stats:
    """The daemon's counters (ql_stats)."""
    uptime_ns: int
    requests: int
    errors: int
    bytes_in: int
    bytes_out: int
    weights: int
    uploads_in_progress: int
    per_weight: list
    sessions: int
    regions: int
    region_bytes: int
    persistent_weights: int
    devices: list
    n_devices_total: int
    rings: int = 0          # sessions with a ring (the fast path)
    ring_requests: int = 0  # requests received through rings
    #: UserStats of every uid (an admin client) or of this client's own
    users: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class UserStats:
    """What one user (uid) holds of the daemon's shared budgets
    (ql_user_stats; uid_share in qlineard.conf(5))."""
    uid: int
    sessions: int
    queued_requests: int
    queued_bytes: int
    uploads: int
    upload_bytes: int
    refused: int


def _s(chars):
    return chars.decode(errors="replace")


@dataclasses.dataclass
class ExportedWeight:
    """A resident weight read back in its canonical packed form
    (Client.export_weight()). The arrays are numpy copies, in the layouts
    load_packed() takes: qdata int8 [n, ceil(k/2)] for q4g (two codes a
    byte, even k low), int8 [n, k] for q8c and q8b, uint8 e4m3 bytes
    [n, k] for f8r; scale (and zero) [G, n] or [n] in ``scale_dtype``
    (bf16 held in uint16); bias float32 [n] or None. load_args() gives
    load_packed()'s arguments back: loaded again, the weight has the same
    digest."""
    info: WeightInfo
    format: str
    n: int
    k: int
    qdata: np.ndarray
    scale: np.ndarray
    zero: np.ndarray
    bias: np.ndarray
    scale_dtype: str

    def load_args(self):
        """(format, n, k, qdata, scale, zero, bias) for load_packed()."""
        def tag(a):
            if a is None or self.scale_dtype != "bf16":
                return a
            return (a, "bf16")
        qdata = (self.qdata, "e4m3") if self.format == "f8r" else self.qdata
        return (self.format, self.n, self.k, qdata, tag(self.scale),
                tag(self.zero), self.bias)


_ADT_NP = {_lib.QL_ADT_F32: np.float32, _lib.QL_ADT_F16: np.float16,
           _lib.QL_ADT_BF16: np.uint16, _lib.QL_ADT_I8: np.int8,
           _lib.QL_ADT_U8: np.uint8, _lib.QL_ADT_F8E4M3: np.uint8,
           _lib.QL_ADT_I32: np.int32}


def _array_of(pa):
    """A numpy copy of one ql_packed_array, or None when it is absent."""
    if not pa.data:
        return None
    shape = tuple(pa.shape[i] for i in range(pa.ndim))
    dt = np.dtype(_ADT_NP[pa.dtype])
    count = int(np.prod(shape))
    buf = (ctypes.c_uint8 * (count * dt.itemsize)).from_address(pa.data)
    return np.frombuffer(buf, dtype=dt, count=count).reshape(shape).copy()


def _weight_info(wi, shared=None):
    return WeightInfo(
        name=_s(wi.name), format=format_name(wi.format, wi.group_size,
                                             bool(wi.asymmetric)),
        format_code=wi.format, group_size=wi.group_size, n=wi.n, k=wi.k,
        has_bias=bool(wi.has_bias), asymmetric=bool(wi.asymmetric),
        persistent=bool(wi.persistent),
        policy=_PATH_NAMES.get(wi.policy, str(wi.policy)),
        scale_dtype=_DTYPE_NAMES.get(wi.scale_dtype, str(wi.scale_dtype)),
        digest=bytes(wi.digest).hex(), bytes_resident=wi.bytes_resident,
        crossover_rows=wi.crossover_rows,
        crossover_measured=bool(wi.crossover_measured),
        devices=[d for d in _s(wi.devices).split(",") if d], shared=shared,
        source_digest=bytes(wi.source_digest).hex()
        if wi.has_source_digest else None)


def _addr(arr):
    return arr.__array_interface__["data"][0]


def _progress_cb(progress):
    """A ql_progress_cb calling progress(done, total), or None, and the
    list that takes the first exception it raises: ctypes would print and
    drop it, and the C callback cannot stop the upload, so the caller
    raises it once the call returns."""
    if progress is None:
        return None, None
    error = []

    def call(_arg, done, total):
        if error:
            return
        try:
            progress(done, total)
        except BaseException as e:  # KeyboardInterrupt too
            error.append(e)
    return _lib.ql_progress_cb(call), error


# ----------------------------------------------------------------- regions
class Region:
    """A shared-memory region of a Client's session (ql_region_create()).

    The daemon maps the same memory, so a linear call whose x and y lie in
    regions moves no tensor bytes through messages. Arrays from ndarray()
    are views of the mapping: write x into one, pass it to Client.linear()
    with ``out`` another, and nothing is copied. The views keep this object
    alive, but not the mapping: after close() (or the client's close())
    they must no longer be touched, as with the C API. A region dropped
    without close() is destroyed when it is collected.
    """

    def __init__(self, client, ptr, scratch=False):
        # A user region holds its client (its views hold it, and the
        # client's close would unmap it); a scratch region, which the
        # client holds, only refers to it, so the client is still
        # collected when dropped.
        self._cref = weakref.ref(client) if scratch else lambda: client
        self._ptr = ptr
        self.id = ptr.contents.id
        self.size = ptr.contents.size
        self.address = ptr.contents.data
        self._finalizer = weakref.finalize(self, Region._collected,
                                           weakref.ref(client), ptr)

    @property
    def _client(self):
        return self._cref()

    @staticmethod
    def _collected(cref, ptr):
        """Destroys a region nobody refers to any more: no call uses it
        (a call holds its regions), so waiting for none."""
        client = cref()
        if client is None:
            return
        try:
            with client._call(wait=False) as c:
                client._lib.ql_region_destroy(c, ptr)
        except QLinearError:
            pass  # closed meanwhile: ql_close() unmapped it

    @property
    def closed(self):
        """True once the region was destroyed."""
        return self._ptr is None

    def _live(self):
        if self._ptr is None:
            raise QLinearError(_lib.ERRORS["QL_EINVAL"],
                               "the region was destroyed")
        return self._ptr

    def buffer(self):
        """The whole region as a writable ctypes byte array (it also
        exposes the buffer protocol, for memoryview and np.frombuffer)."""
        self._live()
        buf = (ctypes.c_ubyte * self.size).from_address(self.address)
        # Views of the buffer keep it alive; it keeps the Region alive, so
        # an unreachable region is not collected under a live view.
        buf._qlinear_region = self
        return buf

    def ndarray(self, shape, dtype=np.float32, offset=0):
        """A NumPy view of the region: ``shape`` elements of ``dtype`` from
        byte ``offset`` (a multiple of the element size)."""
        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = count * dtype.itemsize
        if offset < 0 or offset % dtype.itemsize or offset > self.size or \
                nbytes > self.size - offset:
            raise QLinearError(_lib.ERRORS["QL_EINVAL"],
                               "%d bytes at offset %d do not fit a region of "
                               "%d bytes" % (nbytes, offset, self.size))
        return np.frombuffer(self.buffer(), dtype=dtype, count=count,
                             offset=offset).reshape(shape)

    def close(self):
        """Destroys the region (ql_region_destroy()). Views become invalid.
        Idempotent. Waits for the client's calls in flight, which may be
        reading or writing it (calls that start meanwhile wait for it)."""
        if self._ptr is None:
            return
        client = self._client
        if client is None:  # a scratch region of a collected client
            self._ptr = None
            return
        with client._exclusive():
            self._destroy()

    def _destroy(self):
        if self._ptr is None:
            return
        ptr, self._ptr = self._ptr, None
        self._finalizer.detach()
        client = self._client
        if client is None:
            return
        client._forget_region(self)
        if client._usable():
            L = client._lib
            _check(L, L.ql_region_destroy(client._c, ptr))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<qlinear.Region id=%d size=%d%s>" % (
            self.id, self.size, " closed" if self.closed else "")


def _slice(region, offset, length):
    s = _lib.ql_slice()
    s.region = region._live()
    s.offset = offset
    s.length = length
    return s


# ------------------------------------------------------------------ client

def _devices_arg(devices):
    """A load's devices as ql_load_desc.devices takes them: None, one
    comma-separated string, or a sequence of names."""
    if devices is None:
        return None
    if not isinstance(devices, str):
        devices = ",".join(devices)
    return devices.encode()

def _float_desc(name, weight, bias, format, dtype, policy, scale_dtype):
    """The ql_load_desc of a float load (name may be None), and the arrays
    it points into, which must outlive it."""
    fmt, group, asym = parse_format(format)
    w = _c_contig(weight)
    if w.ndim != 2:
        raise QLinearError(_lib.ERRORS["QL_ESHAPE"],
                           "weight has shape %s, not [n, k]" % (w.shape,))
    dt = _dtype_code(w, dtype)
    b = None
    if bias is not None:
        b = _c_contig(bias)
        if b.shape != (w.shape[0],) or _dtype_code(b, dtype) != dt:
            raise QLinearError(_lib.ERRORS["QL_ESHAPE"],
                               "bias %s %s does not match weight %s %s"
                               % (b.shape, b.dtype, w.shape, w.dtype))
    d = _lib.ql_load_desc()
    d.name = name.encode() if name is not None else None
    d.format = fmt
    d.group_size = group
    d.asymmetric = int(asym)
    d.n, d.k = w.shape
    d.dtype = dt
    d.data = w.ctypes.data
    d.bias = b.ctypes.data if b is not None else None
    d.policy = _path_code(policy)
    d.scale_dtype = 0 if scale_dtype is None else \
        _DTYPE_CODES.get(scale_dtype, -1)
    return d, (w, b)


def source_digest(weight, bias=None, *, format="q4g128", dtype=None,
                  policy="auto", scale_dtype=None, quantizer_version,
                  lib=None):
    """The source digest (32 bytes) of load(name, weight, bias, format=...,
    dtype=..., policy=..., scale_dtype=...) on a daemon whose quantizer
    version is ``quantizer_version`` (Client.hello().quantizer_version):
    the SHA-256 the daemon computes over what that load sends
    (ql_source_digest_float()). A name ending in ".src-" and its hex form
    is content-addressed: the daemon loads only this content under it
    (docs/security.md)."""
    d, keep = _float_desc(None, weight, bias, format, dtype, policy,
                          scale_dtype)
    lib = lib or _lib.load()
    out = ctypes.create_string_buffer(32)
    _check(lib, lib.ql_source_digest_float(ctypes.byref(d),
                                           quantizer_version, out))
    del keep  # the arrays d points into live until here
    return out.raw


def _packed_desc(name, format, n, k, qdata, scale, zero, bias, zero_kind,
                 policy):
    """The ql_packed_desc of Client.load_packed()'s arguments, and the
    arrays it points into, which must outlive its use."""
    fmt, group, asym = parse_format(format)
    if fmt == _lib.QL_FORMAT_F8R and isinstance(qdata, np.ndarray) and \
            qdata.dtype == np.uint8:
        qdata = (qdata, "e4m3")  # f8r bytes can only be e4m3
    d = _lib.ql_packed_desc()
    d.name = name.encode() if name is not None else None
    d.format = fmt
    d.group_size = group
    d.asymmetric = int(asym)
    d.n, d.k = n, k
    if zero_kind not in ("float", "int"):
        raise QLinearError(_lib.ERRORS["QL_EINVAL"],
                           "zero_kind %r: float or int" % (zero_kind,))
    d.zero_kind = _lib.QL_ZERO_INT if zero_kind == "int" else \
        _lib.QL_ZERO_FLOAT
    keep = []
    for field, arr in (("qdata", qdata), ("scale", scale), ("zero", zero),
                       ("bias", bias)):
        pa, held = _packed(arr, field)
        setattr(d, field, pa)
        keep.append(held)
    d.policy = _path_code(policy)
    return d, keep


def packed_source_digest(format, n, k, qdata, scale, zero=None, bias=None, *,
                         zero_kind="float", policy="auto", lib=None):
    """The source digest (32 bytes) of Client.load_packed() with these
    arguments (ql_source_digest_packed()): the name of an already-quantized
    weight ending in ".src-" and its hex form is content-addressed, as for
    source_digest()."""
    d, keep = _packed_desc(None, format, n, k, qdata, scale, zero, bias,
                           zero_kind, policy)
    lib = lib or _lib.load()
    out = ctypes.create_string_buffer(32)
    _check(lib, lib.ql_source_digest_packed(ctypes.byref(d), out))
    del keep  # the arrays d points into live until here
    return out.raw


class Client:
    """A session with qlineard (ql_connect()).

    ``address`` is an ipc:// address (None: default_address()); ``lib`` an
    explicit path of libqlinear (else QLINEAR_LIB, pkg-config, the dynamic
    linker). The weights this client loads stay resident while it is open
    (or another session holds them); close() ends the session and the
    daemon drops its holds and destroys its regions. A client may be used
    by several threads; a child process made by fork() can neither use it
    nor connect (nanomsg does not survive fork()): it execs a new program.

    ``ring`` (default True) lets the session use the daemon's shared-memory
    ring, the fast path of linear(), linear_multi() and the torch module's
    calls, when the daemon offers one; ring=False sets
    ql_connect_opts.no_ring so that every request travels as a message over
    the request socket (QLINEAR_RING=0 in the environment does the same for
    every client). The results are the same bytes either way.
    """

    # Tensors of at least this many bytes go through the client's scratch
    # region rather than inline in the message. The daemon's own bench
    # measured the region path cheaper at every size, but a region costs a
    # session slot and memory, so tiny tensors stay inline.
    region_min_bytes = 4096

    def __init__(self, address=None, *, timeout_ms=0, name="python",
                 admin=False, lib=None, ring=True):
        self._lib = _lib.load(lib)
        self._lib_path = lib  # libqlinear-cuda is looked for beside it
        self._cuda_call = None  # libqlinear-cuda, once a CUDA call found it
        self._c = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        # Calls in flight, counted so that close() and Region.close() wait
        # for them: the C library's close and region destroy unmap memory
        # those calls use. A region close in wait holds new calls back.
        self._gate = threading.Condition()
        self._busy = 0
        self._excl = 0
        self._closing = False
        self._tls = threading.local()  # .depth: this thread's calls
        # id -> Region, the user's regions (weakly: one dropped unclosed
        # is destroyed when collected, not kept for the session's life)
        self._regions = weakref.WeakValueDictionary()
        # Private regions that stage tensors not already in a region: one
        # per call in flight, so threads do not wait for each other.
        self._scratch_free = []
        self._scratch_all = []
        self._shapes = {}           # weight name -> (n, k), from load/lookup
        self._held = set()          # names this session loaded or holds
        opts = _lib.ql_connect_opts()
        opts.timeout_ms = timeout_ms
        opts.client_name = name.encode()
        opts.admin = 1 if admin else 0
        opts.no_ring = 0 if ring else 1
        handle = ctypes.c_void_p()
        _check(self._lib, self._lib.ql_connect(
            address.encode() if address else None, ctypes.byref(opts),
            ctypes.byref(handle)))
        self._c = handle
        self.admin = bool(admin)
        # Closed when collected too, unless in a fork child (the header
        # forbids closing a parent's client there).
        self._finalizer = weakref.finalize(self, Client._finalize, self._lib,
                                           handle, self._pid)
        self.hello_info = None if admin else self.hello()

    @staticmethod
    def _finalize(lib, handle, pid):
        if os.getpid() == pid:
            lib.ql_close(handle)

    # -- lifetime
    def _usable(self):
        return self._c is not None and os.getpid() == self._pid

    def _handle(self):
        if self._c is None:
            raise QLinearError(_lib.ERRORS["QL_EINVAL"],
                               "the client is closed")
        if os.getpid() != self._pid:
            raise QLinearError(_lib.ERRORS["QL_ESESSION"],
                               "a client of the parent process; after fork() "
                               "a child execs a new program to connect")
        return self._c

    @contextlib.contextmanager
    def _call(self, wait=True):
        """The session's handle for one call into the library; counted in
        flight until the block ends. A nested call (a progress callback's)
        does not wait for a region close, which waits for its caller; nor
        does a wait=False one (a collected region's destroy)."""
        depth = getattr(self._tls, "depth", 0)
        with self._gate:
            while wait and depth == 0 and self._excl and not self._closing:
                self._gate.wait()
            if self._closing:
                raise QLinearError(_lib.ERRORS["QL_EINVAL"],
                                   "the client is closed")
            c = self._handle()
            self._busy += 1
        self._tls.depth = depth + 1
        try:
            yield c
        finally:
            self._tls.depth = depth
            with self._gate:
                self._busy -= 1
                if self._busy == 0:
                    self._gate.notify_all()

    @contextlib.contextmanager
    def _exclusive(self):
        """No call of this client in flight for the block's length."""
        if getattr(self._tls, "depth", 0):
            raise QLinearError(_lib.ERRORS["QL_EINVAL"],
                               "a region cannot be closed from within a "
                               "call of its client (a progress callback)")
        with self._gate:
            self._excl += 1
            while self._busy:
                self._gate.wait()
        try:
            yield
        finally:
            with self._gate:
                self._excl -= 1
                self._gate.notify_all()

    def _do(self, fn, *args):
        """fn(handle, *args), its failure raised."""
        with self._call() as c:
            _check(self._lib, fn(c, *args))

    def _uploaded(self, name, progress_error):
        """After an upload: an exception its progress callback raised is
        raised now, the weight's hold dropped (the C callback could not
        stop the upload; the caller meant it not to happen)."""
        if progress_error:
            try:
                self.unload(name)
            except QLinearError:
                pass
            raise progress_error[0]

    def close(self):
        """Ends the session (ql_close()): regions are unmapped, the
        daemon drops this session's weight holds. Idempotent. Calls in
        flight on other threads end first; calls made from now on raise
        QL_EINVAL."""
        if self._c is None:
            return
        if getattr(self._tls, "depth", 0):
            raise QLinearError(_lib.ERRORS["QL_EINVAL"],
                               "close() from within a call of this client "
                               "(a progress callback)")
        with self._gate:
            if self._closing:  # another thread closes it: wait for that
                while self._c is not None:
                    self._gate.wait()
                return
            self._closing = True
            while self._busy:
                self._gate.wait()
        with self._lock:
            regions = list(self._regions.values())
            self._regions.clear()
            regions += self._scratch_all
            self._scratch_all, self._scratch_free = [], []
        for r in regions:  # ql_close() unmaps them all
            r._ptr = None
            r._finalizer.detach()
        self._finalizer()
        with self._gate:
            self._c = None
            self._gate.notify_all()

    @property
    def closed(self):
        return self._c is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- administration
    def hello(self):
        """A new Hello exchange (ql_hello())."""
        h = _lib.ql_hello_info()
        self._do(self._lib.ql_hello, ctypes.byref(h))
        return HelloInfo(
            protocol_version=h.protocol_version,
            daemon_version=_s(h.daemon_version),
            instance_id=bytes(h.instance_id),
            max_message_bytes=h.max_message_bytes,
            max_chunk_bytes=h.max_chunk_bytes,
            devices=[Device(_s(d.name), _s(d.kind), _s(d.alias))
                     for d in h.devices[:h.n_devices]],
            n_devices_total=h.n_devices_total,
            quantizer_version=h.quantizer_version)

    def load(self, name, weight, bias=None, *, format="q4g128", dtype=None,
             policy="auto", scale_dtype=None, persistent=False,
             progress=None, devices=None):
        """Uploads a float weight [n, k] (and bias [n]) for the daemon to
        quantize into ``format`` (ql_load_float()). ``dtype`` names the
        element type when the array's own does not ("bf16" for a uint16
        array). ``scale_dtype`` ("f32", "f16", "bf16") rounds and stores
        the scales in that dtype; the default (None) gives TorchAO 0.18's
        bytes (README, Formats). ``progress(done, total)`` is called
        as chunks are acknowledged; an exception it raises is raised once
        the upload ends, and the weight is then not held. ``devices`` (a
        list of device names or aliases, or one comma-separated string)
        places the weight on those devices only; None: every accelerator,
        or the CPU when there is none. Returns the WeightInfo; its ``shared``
        is True when identical content was already resident by that name
        (loading other content under it raises QL_EEXIST)."""
        d, keep = _float_desc(name, weight, bias, format, dtype, policy,
                              scale_dtype)
        d.persistent = int(bool(persistent))
        d.devices = _devices_arg(devices)
        cb, cb_error = _progress_cb(progress)
        if cb is not None:
            d.progress = cb
        info = _lib.ql_weight_info()
        shared = ctypes.c_int()
        self._do(self._lib.ql_load_float, ctypes.byref(d), ctypes.byref(info),
                 ctypes.byref(shared))
        self._uploaded(name, cb_error)
        self._shapes[name] = (info.n, info.k)
        self._held.add(name)
        return _weight_info(info, bool(shared.value))

    def load_packed(self, name, format, n, k, qdata, scale, zero=None,
                    bias=None, *, zero_kind="float", policy="auto",
                    persistent=False, progress=None, devices=None):
        """Uploads an already-quantized weight in TorchAO's canonical
        layouts (ql_load_packed(), DESIGN §4): q4g qdata [n, ceil(k/2)]
        uint8, scale and zero [G, n]; q8c qdata [n, k] int8, scale [n];
        q8b qdata [n, k] int8, scale (zero) [ceil(k/B), n]; f8r qdata
        [n, k] e4m3 bytes, scale [n]. Each array's dtype gives its element
        type; give (array, "bf16") for bfloat16 held in uint16 and
        (array, "e4m3") for float8 held in uint8. ``zero_kind="int"`` is
        int4 with integer zero points. ``devices`` as in load(). Returns
        the WeightInfo as load()."""
        d, keep = _packed_desc(name, format, n, k, qdata, scale, zero, bias,
                               zero_kind, policy)
        d.persistent = int(bool(persistent))
        d.devices = _devices_arg(devices)
        cb, cb_error = _progress_cb(progress)
        if cb is not None:
            d.progress = cb
        info = _lib.ql_weight_info()
        shared = ctypes.c_int()
        self._do(self._lib.ql_load_packed, ctypes.byref(d),
                 ctypes.byref(info), ctypes.byref(shared))
        self._uploaded(name, cb_error)
        self._shapes[name] = (info.n, info.k)
        self._held.add(name)
        return _weight_info(info, bool(shared.value))

    def unload(self, name):
        """Drops this session's hold on a weight (ql_unload())."""
        self._shapes.pop(name, None)
        self._do(self._lib.ql_unload, name.encode())
        self._held.discard(name)

    def hold(self, name, digest=None):
        """Makes this session a holder of a weight already resident
        (ql_hold()), as loading the same content would, without sending it.
        ``digest`` (32 bytes or 64 hex digits), when given, must be the
        weight's. QL_ENOTFOUND when no weight has that name."""
        if isinstance(digest, str):
            digest = bytes.fromhex(digest)
        if digest is not None and len(digest) != 32:
            raise QLinearError(_lib.ERRORS["QL_EINVAL"],
                               "a digest is 32 bytes")
        info = _lib.ql_weight_info()
        self._do(self._lib.ql_hold, name.encode(), digest,
                 ctypes.byref(info))
        self._shapes[name] = (info.n, info.k)
        self._held.add(name)
        return _weight_info(info, True)

    def export_weight(self, name):
        """Reads the resident weight called name back in its canonical
        packed form (ql_export_weight()), as an ExportedWeight. A session
        reads only the weights it holds (it loaded them, or hold()
        succeeded): QL_EPERM for another resident weight, QL_ENOTFOUND
        when there is none."""
        p = ctypes.POINTER(_lib.ql_exported_weight)()
        self._do(self._lib.ql_export_weight, name.encode(), ctypes.byref(p))
        try:
            e = p.contents
            info = _weight_info(e.info)
            pk = e.packed
            return ExportedWeight(
                info=info, format=info.format, n=pk.n, k=pk.k,
                qdata=_array_of(pk.qdata), scale=_array_of(pk.scale),
                zero=_array_of(pk.zero), bias=_array_of(pk.bias),
                scale_dtype=info.scale_dtype)
        finally:
            self._lib.ql_free(ctypes.cast(p, ctypes.c_void_p))

    def list(self):
        """The resident weights (ql_list()), as WeightInfo."""
        arr = ctypes.POINTER(_lib.ql_weight_info)()
        count = ctypes.c_size_t()
        self._do(self._lib.ql_list, ctypes.byref(arr), ctypes.byref(count))
        try:
            return [_weight_info(arr[i]) for i in range(count.value)]
        finally:
            self._lib.ql_free(ctypes.cast(arr, ctypes.c_void_p))

    def lookup(self, name):
        """The WeightInfo of one resident weight (ql_lookup());
        QL_ENOTFOUND if there is none by that name."""
        info = _lib.ql_weight_info()
        self._do(self._lib.ql_lookup, name.encode(), ctypes.byref(info))
        self._shapes[name] = (info.n, info.k)
        return _weight_info(info)

    def stats(self):
        """The daemon's counters (ql_stats())."""
        p = ctypes.POINTER(_lib.ql_stats_info)()
        self._do(self._lib.ql_stats, ctypes.byref(p))
        try:
            s = p.contents
            per = [WeightStats(
                weight=_s(w.weight), device=_s(w.device), requests=w.requests,
                rows=w.rows, batches=w.batches, wo_batches=w.wo_batches,
                aq_batches=w.aq_batches, queue_ns=w.queue_ns,
                kernel_ns=w.kernel_ns, impl=_s(w.impl),
                bytes_resident=w.bytes_resident, expired=w.expired,
                queue_hist=list(w.queue_hist), kernel_hist=list(w.kernel_hist),
                crossover_rows=w.crossover_rows,
                crossover_measured=bool(w.crossover_measured))
                for w in (s.per_weight[i] for i in range(s.n_per_weight))]
            return Stats(
                uptime_ns=s.uptime_ns, requests=s.requests, errors=s.errors,
                bytes_in=s.bytes_in, bytes_out=s.bytes_out, weights=s.weights,
                uploads_in_progress=s.uploads_in_progress, per_weight=per,
                sessions=s.sessions, regions=s.regions,
                region_bytes=s.region_bytes,
                persistent_weights=s.persistent_weights,
                devices=[DeviceMemory(_s(d.device), d.bytes_resident,
                                      d.budget_bytes)
                         for d in s.devices[:s.n_devices]],
                n_devices_total=s.n_devices_total, rings=s.rings,
                ring_requests=s.ring_requests,
                users=[UserStats(u.uid, u.sessions, u.queued_requests,
                                 u.queued_bytes, u.uploads, u.upload_bytes,
                                 u.refused)
                       for u in (s.users[i] for i in range(s.n_users))])
        finally:
            self._lib.ql_stats_free(p)

    # -- regions
    def region(self, size, _scratch=False):
        """A new shared-memory region of ``size`` bytes (ql_region_create());
        see Region."""
        p = ctypes.POINTER(_lib.ql_region)()
        self._do(self._lib.ql_region_create, size, ctypes.byref(p))
        r = Region(self, p, scratch=_scratch)
        with self._lock:
            if _scratch:  # not a user region: never matched by address
                self._scratch_all.append(r)
            else:
                self._regions[r.id] = r
        return r

    def _forget_region(self, r):
        with self._lock:
            self._regions.pop(r.id, None)

    def _find_region(self, ptr, nbytes):
        """(region, offset) of the user region that holds [ptr, ptr+nbytes),
        or None."""
        with self._lock:
            regions = list(self._regions.values())
        for r in regions:
            if r.address <= ptr and ptr + nbytes <= r.address + r.size:
                return r, ptr - r.address
        return None

    def _take_scratch(self, size):
        """A staging region of at least size bytes, for one call: an idle
        one, or a new one. Give it back with _give_scratch()."""
        with self._lock:
            r = self._scratch_free.pop() if self._scratch_free else None
            if r is not None and r.size < size:
                self._scratch_all.remove(r)
            elif r is not None:
                return r
        old = r.size if r is not None else 0
        if r is not None:
            r._destroy()  # idle: no call uses it
        # Grow geometrically, in whole MiB, so that a model's layers of
        # growing sizes do not each make a new one.
        want = max(size, 2 * old)
        want = (want + (1 << 20) - 1) & ~((1 << 20) - 1)
        return self.region(want, _scratch=True)

    def _give_scratch(self, r):
        with self._lock:
            if not r.closed:
                self._scratch_free.append(r)

    def _weight_shape(self, name):
        shape = self._shapes.get(name)
        if shape is None:
            info = self.lookup(name)
            shape = (info.n, info.k)
        return shape

    # -- linear
    def linear_raw(self, weight, dtype, m, k, x_ptr, n, y_ptr, *,
                   path="auto", via="auto"):
        """y = x·Wᵀ (+ b) on raw memory: x at address x_ptr holds [m, k]
        elements of ``dtype`` ("f32", "f16", "bf16" or a ql_dtype code),
        [m, n] results are written at y_ptr. The torch module's entry.

        ``via`` is "inline" (tensors in the messages), "region", or "auto":
        memory already inside one of this client's regions is used in
        place; other tensors of at least region_min_bytes are staged
        through the client's scratch region (one copy each way, no message
        size limit), smaller ones travel inline. Returns a LinearInfo."""
        dt = dtype if isinstance(dtype, int) else _DTYPE_CODES.get(dtype)
        if dt not in _DTYPE_SIZES:
            raise QLinearError(_lib.ERRORS["QL_EDTYPE"],
                               "dtype %r: f32, f16 or bf16" % (dtype,))
        if via not in ("auto", "inline", "region"):
            raise QLinearError(_lib.ERRORS["QL_EINVAL"],
                               "via %r: auto, inline or region" % (via,))
        p = _path_code(path)
        esz = _DTYPE_SIZES[dt]
        xb, yb = m * k * esz, m * n * esz
        res = _lib.ql_linear_result()
        L, wname = self._lib, weight.encode()
        with self._call() as c:
            xr = self._find_region(x_ptr, xb) if via != "inline" else None
            yr = self._find_region(y_ptr, yb) if via != "inline" else None
            if via == "inline" or (via == "auto" and xr is None and
                                   max(xb, yb) < self.region_min_bytes):
                _check(L, L.ql_linear(c, wname, p, dt, m, k, x_ptr, n, y_ptr,
                                      ctypes.byref(res)))
            elif xr is not None and yr is not None:
                xs, ys = _slice(xr[0], xr[1], xb), _slice(yr[0], yr[1], yb)
                _check(L, L.ql_linear_region(c, wname, p, dt, m, k,
                                             ctypes.byref(xs), n,
                                             ctypes.byref(ys), None,
                                             ctypes.byref(res)))
            else:
                # Stage what is not in a region yet: x first, y after it at an
                # offset aligned for any dtype.
                xoff = 0
                yoff = 0 if xr is not None else (xb + 63) & ~63
                s = self._take_scratch(yoff + (yb if yr is None else 0))
                try:
                    if xr is None:
                        ctypes.memmove(s.address + xoff, x_ptr, xb)
                        xs = _slice(s, xoff, xb)
                    else:
                        xs = _slice(xr[0], xr[1], xb)
                    ys = _slice(s, yoff, yb) if yr is None else \
                        _slice(yr[0], yr[1], yb)
                    _check(L, L.ql_linear_region(c, wname, p, dt, m, k,
                                                 ctypes.byref(xs), n,
                                                 ctypes.byref(ys), None,
                                                 ctypes.byref(res)))
                    if yr is None:
                        ctypes.memmove(y_ptr, s.address + yoff, yb)
                finally:
                    self._give_scratch(s)
        return LinearInfo(_PATH_NAMES.get(res.path, str(res.path)),
                          _s(res.impl))

    def linear_cuda_raw(self, weight, dtype, m, k, x_ptr, n, y_ptr, *,
                        stream=None, path="auto"):
        """y = x·Wᵀ (+ b) on CUDA device memory, by CUDA IPC (call mode):
        x_ptr holds [m, k] elements of ``dtype`` in device memory, [m, n]
        results are written at y_ptr on the same device, and the call
        returns once they are there. ``stream`` (a cudaStream_t as an int;
        None: the legacy default stream) is where x is produced: the
        daemon reads x after the work queued there before the call
        (libqlinear-cuda records an interprocess event on it). The device
        must hold the weight. Returns a LinearInfo."""
        dt = dtype if isinstance(dtype, int) else _DTYPE_CODES.get(dtype)
        if dt not in _DTYPE_SIZES:
            raise QLinearError(_lib.ERRORS["QL_EDTYPE"],
                               "dtype %r: f32, f16 or bf16" % (dtype,))
        p = _path_code(path)
        esz = _DTYPE_SIZES[dt]
        xb, yb = m * k * esz, m * n * esz
        try:
            # Found once: the search stats files, and this is per call.
            C = self._cuda_call or _lib.load_cuda_call(self._lib_path)
            self._cuda_call = C
        except OSError as e:
            raise QLinearError(_lib.ERRORS["QL_ENOTSUP"],
                               "CUDA input in call mode needs "
                               "libqlinear-cuda: %s" % e) from None
        xs, ys = _lib.ql_cuda_slice(), _lib.ql_cuda_slice()
        rv = C.ql_cuda_call_slices(x_ptr, xb, y_ptr, yb, stream or None,
                                   ctypes.byref(xs), ctypes.byref(ys))
        if rv < 0:
            why = {
                _lib.ERRORS["QL_EINVAL"]:
                    "x and y must be device memory of one CUDA device, "
                    "each inside one allocation",
                _lib.ERRORS["QL_ENOTSUP"]:
                    "the CUDA runtime cannot export this memory by CUDA "
                    "IPC (PyTorch's expandable_segments allocator cannot)",
                _lib.ERRORS["QL_EDEVICE"]:
                    "the CUDA runtime refused to record x's ready event",
            }.get(rv, "the CUDA runtime refused the slices")
            raise QLinearError(rv, "x at 0x%x (%d bytes), y at 0x%x "
                               "(%d bytes): %s" % (x_ptr, xb, y_ptr, yb, why))
        res = _lib.ql_linear_result()
        L = self._lib
        with self._call() as c:
            _check(L, L.ql_linear_cuda(c, weight.encode(), p, dt, m, k,
                                       ctypes.byref(xs), n, ctypes.byref(ys),
                                       None, ctypes.byref(res)))
        return LinearInfo(_PATH_NAMES.get(res.path, str(res.path)),
                          _s(res.impl))

    def linear(self, weight, x, *, path="auto", out=None, dtype=None,
               via="auto", info=False):
        """y = x·Wᵀ (+ b) with the resident weight called ``weight``.

        x is [..., k] of float32, float16 or bfloat16 (ml_dtypes, or uint16
        with dtype="bf16"); the result is [..., n] of the same dtype, written
        into ``out`` when given (C-contiguous). x and out inside this
        client's regions (Region.ndarray()) are used in place: no copy. See
        linear_raw() for ``via``. With info=True, returns (y, LinearInfo)."""
        x = np.asarray(x)
        dt = _dtype_code(x, dtype)
        n, k = self._weight_shape(weight)
        if x.ndim < 1 or x.shape[-1] != k:
            raise QLinearError(_lib.ERRORS["QL_ESHAPE"],
                               "x has shape %s; weight %s takes [..., %d]"
                               % (x.shape, weight, k))
        x = _c_contig(x)
        lead = x.shape[:-1]
        m = int(np.prod(lead, dtype=np.int64))
        if out is None:
            out = np.empty(lead + (n,), dtype=x.dtype)
        elif out.shape != lead + (n,) or out.dtype != x.dtype or \
                not out.flags.c_contiguous or not out.flags.writeable:
            raise QLinearError(_lib.ERRORS["QL_ESHAPE"],
                               "out must be a writable C-contiguous %s array "
                               "of shape %s" % (x.dtype, lead + (n,)))
        if m == 0:  # nothing to send
            return (out, None) if info else out
        try:
            li = self.linear_raw(weight, dt, m, k, _addr(x), n, _addr(out),
                                 path=path, via=via)
        except QLinearError as e:
            if e.code == _lib.ERRORS["QL_ESHAPE"]:
                self._shapes.pop(weight, None)  # the name may be reused
            raise
        return (out, li) if info else out

    def linear_multi(self, weights, x, *, path="auto", dtype=None,
                     info=False):
        """Several weights applied to the same x in one round trip
        (ql_linear_multi(): fused q/k/v or gate/up). Returns a list of
        arrays [..., n_i] (and a list of LinearInfo with info=True). The
        tensors travel inline: x and all results must fit the daemon's
        message cap (QL_ETOOBIG otherwise)."""
        x = np.asarray(x)
        dt = _dtype_code(x, dtype)
        if not 1 <= len(weights) <= _lib.QL_MULTI_MAX:
            raise QLinearError(_lib.ERRORS["QL_EINVAL"],
                               "1 to %d weights" % _lib.QL_MULTI_MAX)
        shapes = [self._weight_shape(w) for w in weights]
        k = x.shape[-1] if x.ndim else -1
        for w, (n, wk) in zip(weights, shapes):
            if wk != k:
                raise QLinearError(_lib.ERRORS["QL_ESHAPE"],
                                   "x has shape %s; weight %s takes [..., %d]"
                                   % (x.shape, w, wk))
        x = _c_contig(x)
        lead = x.shape[:-1]
        m = int(np.prod(lead, dtype=np.int64))
        outs = [np.empty(lead + (n,), dtype=x.dtype) for n, _ in shapes]
        if m == 0:
            return (outs, None) if info else outs
        infos = self.linear_multi_raw(weights, dt, m, k, _addr(x),
                                      [n for n, _ in shapes],
                                      [_addr(o) for o in outs], path=path)
        return (outs, infos) if info else outs

    def linear_multi_raw(self, weights, dtype, m, k, x_ptr, ns, y_ptrs, *,
                         path="auto"):
        """ql_linear_multi() on raw memory, as linear_raw(). Returns a list
        of LinearInfo."""
        dt = dtype if isinstance(dtype, int) else _DTYPE_CODES.get(dtype)
        if dt not in _DTYPE_SIZES:
            raise QLinearError(_lib.ERRORS["QL_EDTYPE"],
                               "dtype %r: f32, f16 or bf16" % (dtype,))
        count = len(weights)
        names = (ctypes.c_char_p * count)(*[w.encode() for w in weights])
        nv = (ctypes.c_uint64 * count)(*ns)
        yv = (ctypes.c_void_p * count)(*y_ptrs)
        res = (_lib.ql_linear_result * count)()
        self._do(self._lib.ql_linear_multi, count, names, _path_code(path),
                 dt, m, k, x_ptr, nv, yv, res)
        return [LinearInfo(_PATH_NAMES.get(r.path, str(r.path)), _s(r.impl))
                for r in res]

    def multi_fits(self, dtype, m, k, ns):
        """Whether ql_linear_multi() of these sizes fits the daemon's
        message cap (both the request with x and the reply with every y)."""
        dt = dtype if isinstance(dtype, int) else _DTYPE_CODES[dtype]
        cap = (self.hello_info.max_message_bytes if self.hello_info
               else 0) - _lib.QL_ENVELOPE_BYTES * (len(ns) + 1)
        esz = _DTYPE_SIZES[dt]
        return m * k * esz <= cap and m * sum(ns) * esz <= cap

    # A client is a session: copies of an object that holds one (a deep
    # copy of a swapped model) share it rather than duplicate the handle,
    # and it cannot be pickled.
    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise TypeError("a qlinear.Client is a session with the daemon and "
                        "cannot be pickled")

    def __repr__(self):
        return "<qlinear.Client%s>" % (" closed" if self.closed else "")
