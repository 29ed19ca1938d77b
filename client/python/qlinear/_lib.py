"""ctypes declarations of libqlinear (client/include/qlinear/qlinear.h).

This module only mirrors the C API: constants, structs and prototypes, and
the rule that finds the shared library. Everything that speaks the protocol
lives in libqlinear itself; the Python package never reimplements it.

The structs below must match the header field by field. The test
``test_layout.py`` compiles a small C program against the installed header
and compares every offset and size with these declarations, so a change to
the header that is not carried over here fails the test suite.
"""

import ctypes
import ctypes.util
import os
import shutil
import subprocess

# --------------------------------------------------------------- constants
# Sizes of the fixed arrays of qlinear.h, NUL terminators included.
QL_NAME_MAX = 256
QL_DEVICE_NAME_MAX = 64
QL_DEVICE_KIND_MAX = 16
QL_DEVICE_ALIAS_MAX = 32
QL_VERSION_MAX = 64
QL_IMPL_MAX = 64
QL_DEVICES_STR_MAX = 256
QL_MAX_DEVICES = 16
QL_INSTANCE_ID_BYTES = 16
QL_DIGEST_BYTES = 32
QL_CUDA_IPC_HANDLE_BYTES = 64
QL_ADDRESS_MAX = 512
QL_HIST_BUCKETS = 32
QL_MULTI_MAX = 16
QL_PROTOCOL_VERSION = 1
# Room libqlinear keeps for the envelope around a payload (ql_defs.h).
QL_ENVELOPE_BYTES = 4096

# The error space of proto/ql_defs.h (QL_ERRNO_MAP), by symbolic name.
ERRORS = {
    "QL_EINVAL": -1,
    "QL_ENOMEM": -2,
    "QL_ENOTFOUND": -3,
    "QL_EEXIST": -4,
    "QL_ESHAPE": -5,
    "QL_EDTYPE": -6,
    "QL_EFORMAT": -7,
    "QL_ETOOBIG": -8,
    "QL_EPROTO": -9,
    "QL_EVERSION": -10,
    "QL_ETIMEDOUT": -11,
    "QL_EIO": -12,
    "QL_EEXHAUSTED": -13,
    "QL_EDEADLINE": -14,
    "QL_ENOTSUP": -15,
    "QL_ENONFINITE": -16,
    "QL_ESHUTDOWN": -17,
    "QL_EINTERNAL": -18,
    "QL_ESEQUENCE": -19,
    "QL_EBADFILE": -20,
    "QL_ECONNECT": -21,
    "QL_EPERM": -22,
    "QL_ENAME": -23,
    "QL_ESESSION": -24,
    "QL_EDEVICE": -25,
}

# Enumerations of ql_defs.h.
QL_DTYPE_F32, QL_DTYPE_F16, QL_DTYPE_BF16 = 1, 2, 3
QL_FORMAT_Q4G, QL_FORMAT_Q8C, QL_FORMAT_Q8B, QL_FORMAT_F8R = 1, 2, 3, 4
QL_PATH_AUTO, QL_PATH_WEIGHT_ONLY, QL_PATH_ACT_QUANT = 0, 1, 2
QL_ADT_F32, QL_ADT_F16, QL_ADT_BF16 = 1, 2, 3
QL_ADT_I8, QL_ADT_U8, QL_ADT_I32, QL_ADT_F8E4M3 = 4, 5, 6, 7
QL_ZERO_FLOAT, QL_ZERO_INT = 0, 1

# Every constant above that has a C counterpart of the same name, for the
# layout test. (The ERRORS dict is checked separately.)
C_CONSTANTS = [
    "QL_NAME_MAX", "QL_DEVICE_NAME_MAX", "QL_DEVICE_KIND_MAX",
    "QL_DEVICE_ALIAS_MAX", "QL_VERSION_MAX", "QL_IMPL_MAX",
    "QL_DEVICES_STR_MAX", "QL_MAX_DEVICES", "QL_INSTANCE_ID_BYTES",
    "QL_DIGEST_BYTES", "QL_CUDA_IPC_HANDLE_BYTES", "QL_ADDRESS_MAX", "QL_HIST_BUCKETS", "QL_MULTI_MAX",
    "QL_PROTOCOL_VERSION", "QL_ENVELOPE_BYTES",
    "QL_DTYPE_F32", "QL_DTYPE_F16", "QL_DTYPE_BF16",
    "QL_FORMAT_Q4G", "QL_FORMAT_Q8C", "QL_FORMAT_Q8B", "QL_FORMAT_F8R",
    "QL_PATH_AUTO", "QL_PATH_WEIGHT_ONLY", "QL_PATH_ACT_QUANT",
    "QL_ADT_F32", "QL_ADT_F16", "QL_ADT_BF16", "QL_ADT_I8", "QL_ADT_U8",
    "QL_ADT_I32", "QL_ADT_F8E4M3", "QL_ZERO_FLOAT", "QL_ZERO_INT",
]

# C enums are int-sized on every ABI this library is built for.
c_enum = ctypes.c_int


# ----------------------------------------------------------------- structs
class ql_connect_opts(ctypes.Structure):
    _fields_ = [
        ("timeout_ms", ctypes.c_int),
        ("client_name", ctypes.c_char_p),
        ("admin", ctypes.c_int),
        ("no_ring", ctypes.c_int),
    ]


class ql_device_info(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * QL_DEVICE_NAME_MAX),
        ("kind", ctypes.c_char * QL_DEVICE_KIND_MAX),
        ("alias", ctypes.c_char * QL_DEVICE_ALIAS_MAX),
    ]


class ql_hello_info(ctypes.Structure):
    _fields_ = [
        ("protocol_version", ctypes.c_uint32),
        ("daemon_version", ctypes.c_char * QL_VERSION_MAX),
        ("instance_id", ctypes.c_uint8 * QL_INSTANCE_ID_BYTES),
        ("max_message_bytes", ctypes.c_uint64),
        ("max_chunk_bytes", ctypes.c_uint64),
        ("n_devices", ctypes.c_size_t),
        ("n_devices_total", ctypes.c_size_t),
        ("devices", ql_device_info * QL_MAX_DEVICES),
        ("quantizer_version", ctypes.c_uint32),
    ]


ql_progress_cb = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64,
                                  ctypes.c_uint64)


class ql_load_desc(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("format", c_enum),
        ("group_size", ctypes.c_uint32),
        ("n", ctypes.c_uint64),
        ("k", ctypes.c_uint64),
        ("dtype", c_enum),
        ("data", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("policy", c_enum),
        ("scale_dtype", ctypes.c_int),
        ("progress", ql_progress_cb),
        ("progress_arg", ctypes.c_void_p),
        ("asymmetric", ctypes.c_int),
        ("persistent", ctypes.c_int),
        ("devices", ctypes.c_char_p),
    ]


class ql_packed_array(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.c_uint64 * 2),
    ]


class ql_packed_desc(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("format", c_enum),
        ("group_size", ctypes.c_uint32),
        ("n", ctypes.c_uint64),
        ("k", ctypes.c_uint64),
        ("asymmetric", ctypes.c_int),
        ("zero_kind", c_enum),
        ("qdata", ql_packed_array),
        ("scale", ql_packed_array),
        ("zero", ql_packed_array),
        ("bias", ql_packed_array),
        ("policy", c_enum),
        ("progress", ql_progress_cb),
        ("progress_arg", ctypes.c_void_p),
        ("persistent", ctypes.c_int),
        ("devices", ctypes.c_char_p),
    ]


class ql_weight_info(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * QL_NAME_MAX),
        ("format", ctypes.c_int),
        ("group_size", ctypes.c_uint32),
        ("n", ctypes.c_uint64),
        ("k", ctypes.c_uint64),
        ("has_bias", ctypes.c_int),
        ("asymmetric", ctypes.c_int),
        ("persistent", ctypes.c_int),
        ("policy", ctypes.c_int),
        ("scale_dtype", ctypes.c_int),
        ("digest", ctypes.c_uint8 * QL_DIGEST_BYTES),
        ("bytes_resident", ctypes.c_uint64),
        ("crossover_rows", ctypes.c_uint32),
        ("crossover_measured", ctypes.c_int),
        ("n_devices", ctypes.c_size_t),
        ("devices", ctypes.c_char * QL_DEVICES_STR_MAX),
        ("source_digest", ctypes.c_uint8 * QL_DIGEST_BYTES),
        ("has_source_digest", ctypes.c_int),
    ]


class ql_exported_weight(ctypes.Structure):
    _fields_ = [
        ("info", ql_weight_info),
        ("packed", ql_packed_desc),
        ("bytes", ctypes.c_uint64),
    ]


class ql_linear_result(ctypes.Structure):
    _fields_ = [
        ("path", c_enum),
        ("impl", ctypes.c_char * QL_IMPL_MAX),
    ]


class ql_weight_stats(ctypes.Structure):
    _fields_ = [
        ("weight", ctypes.c_char * QL_NAME_MAX),
        ("device", ctypes.c_char * QL_DEVICE_NAME_MAX),
        ("requests", ctypes.c_uint64),
        ("rows", ctypes.c_uint64),
        ("batches", ctypes.c_uint64),
        ("wo_batches", ctypes.c_uint64),
        ("aq_batches", ctypes.c_uint64),
        ("queue_ns", ctypes.c_uint64),
        ("kernel_ns", ctypes.c_uint64),
        ("impl", ctypes.c_char * QL_IMPL_MAX),
        ("bytes_resident", ctypes.c_uint64),
        ("expired", ctypes.c_uint64),
        ("queue_hist", ctypes.c_uint64 * QL_HIST_BUCKETS),
        ("kernel_hist", ctypes.c_uint64 * QL_HIST_BUCKETS),
        ("crossover_rows", ctypes.c_uint32),
        ("crossover_measured", ctypes.c_int),
    ]


class ql_device_memory(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_char * QL_DEVICE_NAME_MAX),
        ("bytes_resident", ctypes.c_uint64),
        ("budget_bytes", ctypes.c_uint64),
    ]


class ql_user_stats(ctypes.Structure):
    _fields_ = [
        ("uid", ctypes.c_uint32),
        ("sessions", ctypes.c_uint32),
        ("queued_requests", ctypes.c_uint64),
        ("queued_bytes", ctypes.c_uint64),
        ("uploads", ctypes.c_uint64),
        ("upload_bytes", ctypes.c_uint64),
        ("refused", ctypes.c_uint64),
    ]


class ql_stats_info(ctypes.Structure):
    _fields_ = [
        ("uptime_ns", ctypes.c_uint64),
        ("requests", ctypes.c_uint64),
        ("errors", ctypes.c_uint64),
        ("bytes_in", ctypes.c_uint64),
        ("bytes_out", ctypes.c_uint64),
        ("weights", ctypes.c_uint64),
        ("uploads_in_progress", ctypes.c_uint64),
        ("n_per_weight", ctypes.c_size_t),
        ("per_weight", ctypes.POINTER(ql_weight_stats)),
        ("sessions", ctypes.c_uint64),
        ("regions", ctypes.c_uint64),
        ("region_bytes", ctypes.c_uint64),
        ("persistent_weights", ctypes.c_uint64),
        ("n_devices", ctypes.c_size_t),
        ("n_devices_total", ctypes.c_size_t),
        ("devices", ql_device_memory * QL_MAX_DEVICES),
        ("rings", ctypes.c_uint64),
        ("ring_requests", ctypes.c_uint64),
        ("n_users", ctypes.c_size_t),
        ("users", ctypes.POINTER(ql_user_stats)),
    ]


class ql_region(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_uint64),
        ("size", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
    ]


class ql_slice(ctypes.Structure):
    _fields_ = [
        ("region", ctypes.POINTER(ql_region)),
        ("offset", ctypes.c_uint64),
        ("length", ctypes.c_uint64),
    ]


class ql_cuda_slice(ctypes.Structure):
    _fields_ = [
        ("mem_handle", ctypes.c_ubyte * QL_CUDA_IPC_HANDLE_BYTES),
        ("offset", ctypes.c_uint64),
        ("length", ctypes.c_uint64),
        ("device", ctypes.c_char * QL_DEVICE_NAME_MAX),
        ("has_ready_event", ctypes.c_int),
        ("ready_event", ctypes.c_ubyte * QL_CUDA_IPC_HANDLE_BYTES),
    ]


# qlinear_ckpt.h: quantized checkpoint layers converted to packed arrays.
class ql_ckpt_tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("bytes", ctypes.c_uint64),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.c_uint64 * 2),
    ]


class ql_ckpt_layer(ctypes.Structure):
    _fields_ = [
        ("desc", ql_packed_desc),
        ("method", ctypes.c_int),
        ("bits", ctypes.c_int),
        ("src_group", ctypes.c_uint32),
        ("symmetric", ctypes.c_int),
    ]


# Every struct above, by its C name, for the layout test.
STRUCTS = [
    ql_connect_opts, ql_device_info, ql_hello_info, ql_load_desc,
    ql_packed_array, ql_packed_desc, ql_weight_info, ql_linear_result,
    ql_weight_stats, ql_device_memory, ql_stats_info, ql_region, ql_slice,
    ql_cuda_slice, ql_ckpt_tensor, ql_ckpt_layer,
]

# -------------------------------------------------------------- prototypes
_c_client_p = ctypes.c_void_p  # ql_client *, opaque
_P = ctypes.POINTER

_PROTOTYPES = {
    "ql_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "ql_err_name": (ctypes.c_char_p, [ctypes.c_int]),
    "ql_errmsg": (ctypes.c_char_p, []),
    "ql_default_address": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_size_t]),
    "ql_default_admin_address": (ctypes.c_int,
                                 [ctypes.c_char_p, ctypes.c_size_t]),
    "ql_connect": (ctypes.c_int, [ctypes.c_char_p, _P(ql_connect_opts),
                                  _P(_c_client_p)]),
    "ql_close": (None, [_c_client_p]),
    "ql_hello": (ctypes.c_int, [_c_client_p, _P(ql_hello_info)]),
    "ql_load_float": (ctypes.c_int, [_c_client_p, _P(ql_load_desc),
                                     _P(ql_weight_info), _P(ctypes.c_int)]),
    "ql_load_packed": (ctypes.c_int, [_c_client_p, _P(ql_packed_desc),
                                      _P(ql_weight_info), _P(ctypes.c_int)]),
    "ql_unload": (ctypes.c_int, [_c_client_p, ctypes.c_char_p]),
    "ql_hold": (ctypes.c_int, [_c_client_p, ctypes.c_char_p,
                               ctypes.c_char_p, _P(ql_weight_info)]),
    "ql_export_weight": (ctypes.c_int, [_c_client_p, ctypes.c_char_p,
                                        _P(_P(ql_exported_weight))]),
    "ql_source_digest_float": (ctypes.c_int, [_P(ql_load_desc),
                                              ctypes.c_uint32,
                                              ctypes.c_char_p]),
    "ql_source_digest_packed": (ctypes.c_int, [_P(ql_packed_desc),
                                               ctypes.c_char_p]),
    "ql_ckpt_convert": (ctypes.c_int, [ctypes.c_char_p, _P(ql_ckpt_tensor),
                                       _P(ql_ckpt_tensor), _P(ql_ckpt_tensor),
                                       _P(ql_ckpt_tensor), ctypes.c_char_p,
                                       ctypes.c_size_t,
                                       _P(_P(ql_ckpt_layer))]),
    "ql_reload_config": (ctypes.c_int, [_c_client_p, ctypes.c_char_p,
                                        ctypes.c_size_t]),
    "ql_list": (ctypes.c_int, [_c_client_p, _P(_P(ql_weight_info)),
                               _P(ctypes.c_size_t)]),
    "ql_lookup": (ctypes.c_int, [_c_client_p, ctypes.c_char_p,
                                 _P(ql_weight_info)]),
    "ql_linear": (ctypes.c_int, [_c_client_p, ctypes.c_char_p, c_enum,
                                 c_enum, ctypes.c_uint64, ctypes.c_uint64,
                                 ctypes.c_void_p, ctypes.c_uint64,
                                 ctypes.c_void_p, _P(ql_linear_result)]),
    "ql_linear_multi": (ctypes.c_int, [_c_client_p, ctypes.c_size_t,
                                       _P(ctypes.c_char_p), c_enum, c_enum,
                                       ctypes.c_uint64, ctypes.c_uint64,
                                       ctypes.c_void_p, _P(ctypes.c_uint64),
                                       _P(ctypes.c_void_p),
                                       _P(ql_linear_result)]),
    "ql_linear_region": (ctypes.c_int, [_c_client_p, ctypes.c_char_p, c_enum,
                                        c_enum, ctypes.c_uint64,
                                        ctypes.c_uint64, _P(ql_slice),
                                        ctypes.c_uint64, _P(ql_slice),
                                        ctypes.c_void_p,
                                        _P(ql_linear_result)]),
    "ql_linear_cuda": (ctypes.c_int, [_c_client_p, ctypes.c_char_p, c_enum,
                                      c_enum, ctypes.c_uint64,
                                      ctypes.c_uint64, _P(ql_cuda_slice),
                                      ctypes.c_uint64, _P(ql_cuda_slice),
                                      ctypes.c_void_p,
                                      _P(ql_linear_result)]),
    "ql_region_create": (ctypes.c_int, [_c_client_p, ctypes.c_size_t,
                                        _P(_P(ql_region))]),
    "ql_region_destroy": (ctypes.c_int, [_c_client_p, _P(ql_region)]),
    "ql_stats": (ctypes.c_int, [_c_client_p, _P(_P(ql_stats_info))]),
    "ql_stats_free": (None, [_P(ql_stats_info)]),
    "ql_free": (None, [ctypes.c_void_p]),
}

# ------------------------------------------------------- finding the library
_LIB_NAME = "libqlinear.so.0"  # the soname: -version-info 0:0:0


def _pkg_config_libdir():
    """The libdir that pkg-config gives for qlinear, or None."""
    exe = shutil.which("pkg-config") or shutil.which("pkgconf")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--variable=libdir", "qlinear"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    libdir = out.stdout.strip()
    return libdir if out.returncode == 0 and libdir else None


def _build_tree_lib():
    """libqlinear of the source tree this package sits in, if it was built
    in place (client/python/qlinear/ -> top/.libs/): lets a developer use the
    package straight from a checkout."""
    top = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))))
    path = os.path.join(top, ".libs", _LIB_NAME)
    return path if os.path.exists(path) else None


def _recorded():
    """The paths setup.py recorded when this package was built (a pip
    install; a source checkout has none): [library path, ...]."""
    try:
        from . import _paths
    except ImportError:
        return []
    out = []
    if getattr(_paths, "PKG_CONFIG_LIBDIR", None):
        out.append(os.path.join(_paths.PKG_CONFIG_LIBDIR, _LIB_NAME))
    if getattr(_paths, "BUILD_TREE_LIB", None):
        out.append(_paths.BUILD_TREE_LIB)
    return out


def find_library(path=None):
    """Where libqlinear is, as a path or a name dlopen() resolves.

    In this order: ``path`` if given; the environment variable QLINEAR_LIB;
    the libdir pkg-config gives for ``qlinear``; what the package's build
    recorded (qlinear.pc's libdir, then the in-tree build of the source
    tree it was installed from); the dynamic linker's own search
    (ctypes.util.find_library); the build tree around this package.
    Raises OSError when none of them has it.
    """
    if path:
        return path
    env = os.environ.get("QLINEAR_LIB")
    if env:
        return env
    libdir = _pkg_config_libdir()
    if libdir:
        cand = os.path.join(libdir, _LIB_NAME)
        if os.path.exists(cand):
            return cand
    for cand in _recorded():
        if os.path.exists(cand):
            return cand
    name = ctypes.util.find_library("qlinear")
    if name:
        return name
    built = _build_tree_lib()
    if built:
        return built
    raise OSError("libqlinear not found: set QLINEAR_LIB to its path, or "
                  "install qlinear where pkg-config finds qlinear.pc, or "
                  "pip install the package after building libqlinear")


_loaded = {}


def load(path=None):
    """The libqlinear CDLL (loaded once per resolved path), with every
    prototype declared so that ctypes converts arguments and results."""
    where = find_library(path)
    lib = _loaded.get(where)
    if lib is not None:
        return lib
    lib = _declared(ctypes.CDLL(where), _PROTOTYPES)
    _loaded[where] = lib
    return lib


def _declared(lib, prototypes):
    """lib with each function of prototypes given its types."""
    for name, (restype, argtypes) in prototypes.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


# ------------------------------------------------------- libqlinear-cuda
# Mapped mode and call mode's slices of device pointers
# (client/include/qlinear/qlinear_mapped.h): built only where the CUDA
# toolkit is, beside libqlinear.
_MAPPED_PROTOTYPES = {
    "ql_mapped_open": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p,
                                      ctypes.c_char_p, ctypes.c_int,
                                      ctypes.c_int64,
                                      ctypes.POINTER(ctypes.c_void_p)]),
    "ql_linear_mapped": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_void_p]),
    "ql_mapped_shape": (None, [ctypes.c_void_p,
                               ctypes.POINTER(ctypes.c_uint64),
                               ctypes.POINTER(ctypes.c_uint64)]),
    "ql_mapped_close": (None, [ctypes.c_void_p]),
}
_CUDA_CALL_PROTOTYPES = {
    "ql_cuda_call_slices": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t,
                                           ctypes.c_void_p, ctypes.c_size_t,
                                           ctypes.c_void_p,
                                           ctypes.POINTER(ql_cuda_slice),
                                           ctypes.POINTER(ql_cuda_slice)]),
}
QL_MAPPED_MAX_ROWS = 4096


def load_mapped(path=None):
    """The libqlinear-cuda CDLL with mapped mode declared (see
    _load_cuda())."""
    return _load_cuda(path, "mapped", _MAPPED_PROTOTYPES)


def load_cuda_call(path=None):
    """The libqlinear-cuda CDLL with ql_cuda_call_slices() declared: call
    mode on CUDA tensors."""
    return _load_cuda(path, "call", _CUDA_CALL_PROTOTYPES)


def _load_cuda(path, what, prototypes):
    """libqlinear-cuda: QLINEAR_CUDA_LIB, else the file beside libqlinear
    (``path`` as for load()), else the dynamic linker's search, with the
    prototypes of ``what`` declared. Raises OSError when it is not there
    (a build without CUDA)."""
    env = os.environ.get("QLINEAR_CUDA_LIB")
    where = env
    if not where:
        base = find_library(path)
        cand = os.path.join(os.path.dirname(base),
                            _LIB_NAME.replace("libqlinear", "libqlinear-cuda"))
        where = cand if os.path.dirname(base) and os.path.exists(cand) \
            else ctypes.util.find_library("qlinear-cuda")
    if not where:
        raise OSError("libqlinear-cuda not found (qlinear built without "
                      "CUDA?): set QLINEAR_CUDA_LIB to its path")
    key = (what, where)
    lib = _loaded.get(key)
    if lib is not None:
        return lib
    load(path)  # libqlinear first: the one the client handles belong to
    lib = _declared(ctypes.CDLL(where), prototypes)
    _loaded[key] = lib
    return lib
