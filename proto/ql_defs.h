/*
 * ql_defs.h - definitions shared by every part of qlinear and by the wire:
 * the one error space and the enumerations that travel in messages.
 *
 * This header is part of the installed client API (as <qlinear/ql_defs.h>)
 * and is included by the kernel library and the daemon, so it holds plain
 * C only: no types from libuv, nanomsg or protobuf-c.
 *
 * The numeric values of ql_dtype, ql_format and ql_path are the values of the
 * matching enums in proto/qlinear.proto; a value received from a peer is
 * range-checked before it is cast (see ql_dtype_valid() and friends).
 */
#ifndef QL_DEFS_H
#define QL_DEFS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The error space. Every function in qlinear returns 0 or a negative QL_E*
 * code; errors from libraries (errno, nanomsg, protobuf-c, CUDA, Level Zero)
 * are mapped to one of these where they enter our code. The same numbers
 * travel in Status.code, so the list may grow but existing values never
 * change meaning.
 */
#define QL_ERRNO_MAP(XX)                                                       \
  XX(INVAL, -1, "invalid argument")                                            \
  XX(NOMEM, -2, "out of memory")                                               \
  XX(NOTFOUND, -3, "not found")                                                \
  XX(EXIST, -4, "already exists with different content")                      \
  XX(SHAPE, -5, "shape mismatch")                                              \
  XX(DTYPE, -6, "unsupported or mismatched data type")                         \
  XX(FORMAT, -7, "unknown or unsupported format")                              \
  XX(TOOBIG, -8, "message larger than the announced cap")                      \
  XX(PROTO, -9, "malformed or unexpected message")                             \
  XX(VERSION, -10, "protocol version mismatch")                                \
  XX(TIMEDOUT, -11, "timed out")                                               \
  XX(IO, -12, "input/output error")                                            \
  XX(EXHAUSTED, -13, "resource exhausted, try again later")                    \
  XX(DEADLINE, -14, "deadline exceeded")                                       \
  XX(NOTSUP, -15, "operation not supported")                                   \
  XX(NONFINITE, -16, "NaN or Inf in input")                                    \
  XX(SHUTDOWN, -17, "daemon is shutting down")                                 \
  XX(INTERNAL, -18, "internal error")                                          \
  XX(SEQUENCE, -19, "upload chunk out of order")                               \
  XX(BADFILE, -20, "malformed or unsupported file")                            \
  XX(CONNECT, -21, "cannot connect to the daemon")                             \
  XX(PERM, -22, "permission denied")                                           \
  XX(NAME, -23, "invalid weight name")                                         \
  XX(SESSION, -24, "no such session")                                          \
  XX(DEVICE, -25, "device failed or out of service")

typedef enum ql_errno {
  QL_OK = 0,
#define QL_ERRNO_ENUM_(name, val, msg) QL_E##name = (val),
  QL_ERRNO_MAP(QL_ERRNO_ENUM_)
#undef QL_ERRNO_ENUM_
  QL_ERRNO_MIN_ = -26 /* one below the last code: for range checks */
} ql_errno;

/* A static, human-readable description of err ("unknown error" for codes
 * not in the list, "success" for 0). Never NULL. */
const char *ql_strerror(int err);
/* The symbolic name of err, e.g. "QL_EINVAL". Never NULL. */
const char *ql_err_name(int err);

/* Bytes of a CUDA IPC memory or event handle (cudaIpcMemHandle_t,
 * cudaIpcEventHandle_t: CUDA_IPC_HANDLE_SIZE), as CudaIpcSlice carries
 * them. */
#define QL_CUDA_IPC_HANDLE_BYTES 64

/* Bytes of a weight's content digest: SHA-256 of its canonical form. */
#define QL_DIGEST_BYTES 32

/* The most weights one LinearMulti request applies to its x. */
#define QL_MULTI_MAX 16

/* Bytes of a session token (Request.session_token, SessionOpen's reply). */
#define QL_SESSION_TOKEN_BYTES 16

/* Largest packet on the session socket, either way. */
#define QL_SESSION_MSG_MAX 4096

/* Bytes of a Level Zero IPC memory handle (ze_ipc_mem_handle_t:
 * ZE_MAX_IPC_HANDLE_SIZE), as ImportZeIpcRequest carries it. */
#define QL_ZE_IPC_HANDLE_BYTES 64

/* Element types of tensors: activations, outputs, float weights, scales. */
typedef enum ql_dtype {
  QL_DTYPE_F32 = 1,
  QL_DTYPE_F16 = 2,
  QL_DTYPE_BF16 = 3,
} ql_dtype;

/* Weight formats of DESIGN §4. */
typedef enum ql_format {
  QL_FORMAT_Q4G = 1, /* int4 groupwise, asymmetric, float zero point */
  QL_FORMAT_Q8C = 2, /* int8 per output channel, symmetric */
  QL_FORMAT_Q8B = 3, /* int8 blockwise along K (weight-only) */
  QL_FORMAT_F8R = 4, /* float8 e4m3fn per row */
} ql_format;

/* How a linear request is computed. */
typedef enum ql_path {
  QL_PATH_AUTO = 0,        /* the daemon chooses by the request's rows */
  QL_PATH_WEIGHT_ONLY = 1, /* dequantize the weight, float accumulation */
  QL_PATH_ACT_QUANT = 2,   /* quantize activation rows, integer dots */
} ql_path;

/* Element types of packed arrays (imports); 1..3 are the ql_dtype values. */
typedef enum ql_array_dtype {
  QL_ADT_F32 = 1,
  QL_ADT_F16 = 2,
  QL_ADT_BF16 = 3,
  QL_ADT_I8 = 4,
  QL_ADT_U8 = 5,
  QL_ADT_I32 = 6,
  QL_ADT_F8E4M3 = 7, /* float8 e4m3fn bytes */
} ql_array_dtype;

/* How the zero point of an imported int4 weight is given. */
typedef enum ql_zero_kind {
  QL_ZERO_FLOAT = 0, /* canonical: q in [-8,7], x̂ = q·scale + zero */
  QL_ZERO_INT = 1,   /* TorchAO PLAIN_INT32 / XPU: u in [0,15], integer
                        zero point zp: q = u - 8, zero = (8 - zp)·scale */
} ql_zero_kind;

/* Size in bytes of one element of a valid array dtype, 0 otherwise. */
static inline size_t ql_array_dtype_size(int dt) {
  switch (dt) {
  case QL_ADT_F32:
  case QL_ADT_I32:
    return 4;
  case QL_ADT_F16:
  case QL_ADT_BF16:
    return 2;
  case QL_ADT_I8:
  case QL_ADT_U8:
  case QL_ADT_F8E4M3:
    return 1;
  default:
    return 0;
  }
}

/* Size in bytes of one element of a valid dtype, 0 for an invalid one. */
static inline size_t ql_dtype_size(int dt) {
  return dt == QL_DTYPE_F32 ? 4 : (dt == QL_DTYPE_F16 || dt == QL_DTYPE_BF16) ? 2 : 0;
}
static inline int ql_dtype_valid(int dt) { return ql_dtype_size(dt) != 0; }
static inline int ql_format_valid(int f) { return f >= QL_FORMAT_Q4G && f <= QL_FORMAT_F8R; }
static inline int ql_path_valid(int p) { return p >= QL_PATH_AUTO && p <= QL_PATH_ACT_QUANT; }

/* Room both sides keep for the envelope around a tensor or chunk payload
 * (ids, tags, shape, status, implementation name) when checking a payload
 * against the message cap. */
#define QL_ENVELOPE_BYTES 4096u

/* Protocol version spoken by this build (Hello). */
#define QL_PROTOCOL_VERSION 1u

#ifdef __cplusplus
}
#endif
#endif /* QL_DEFS_H */
