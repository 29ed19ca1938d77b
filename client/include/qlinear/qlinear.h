/*
 * qlinear.h - libqlinear, the client library of qlineard.
 *
 * qlineard keeps quantized linear-layer weights resident on its devices and
 * computes y = x·Wᵀ + b for many local processes. This library speaks its
 * request protocol (nanomsg REQ/REP carrying protobuf messages, see
 * proto/qlinear.proto and DESIGN §7) so that callers see plain C calls.
 *
 * Conventions, valid for every function below unless its comment says
 * otherwise:
 * - Every call returns 0 on success or a negative QL_E* code from
 *   <qlinear/ql_defs.h>. An error the daemon reports is returned as the
 *   daemon sent it; ql_errmsg() then holds the daemon's explanation.
 * - Pointers passed in are borrowed for the duration of the call only; the
 *   library keeps no reference to them after it returns.
 * - Output structs are written only on success, except where stated.
 * - A ql_client may be used by several threads at once: each call in flight
 *   uses its own connection. ql_connect() and ql_close() are the exceptions:
 *   nothing else may use the client while they run.
 * - Data buffers are row-major and in the machine's (little-endian) byte
 *   order; f16 is IEEE binary16, bf16 the upper half of an f32.
 * - A child process made by fork() must not use, nor close, a client of
 *   its parent (nanomsg's threads do not survive fork, and the session is
 *   the parent's), nor connect anew: once the parent has made a client,
 *   ql_connect() in the child fails with QL_ENOTSUP. A child that needs
 *   the daemon execs a new program. In the child the library closes its
 *   copy of every session socket and forgets the tokens, so the parent's
 *   session still ends when the parent does; the parent's regions stay
 *   mapped in the child (fork copies mappings) but the child cannot name
 *   them in requests.
 *
 * Sessions: ql_connect() opens a session with the daemon (on session.sock,
 * in the directory of the ipc:// request socket) and every request carries
 * its token; ql_close() ends it. The session owns what it made: its
 * shared-memory regions, and its hold on every weight it loaded (or loaded
 * again and found shared). When the session ends, even by a crash of the
 * process, the daemon destroys its regions and drops its holds at once; a
 * weight that no session holds any more is unloaded.
 */
#ifndef QLINEAR_H
#define QLINEAR_H

#include <stddef.h>
#include <stdint.h>

#include "ql_defs.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef QL_EXPORT
#define QL_EXPORT __attribute__((visibility("default")))
#endif

/* Sizes of the fixed arrays below, NUL terminators included. Strings from
 * the daemon that do not fit are truncated, except weight names: the
 * protocol limits those to 255 bytes, and a longer one is QL_EPROTO. */
#define QL_NAME_MAX 256         /* weight names */
#define QL_DEVICE_NAME_MAX 64   /* "cuda:<uuid>" and friends */
#define QL_DEVICE_KIND_MAX 16   /* "cpu", "cuda", "ze" */
#define QL_DEVICE_ALIAS_MAX 32  /* "cuda:0" */
#define QL_VERSION_MAX 64       /* daemon version string */
#define QL_IMPL_MAX 64          /* kernel implementation names */
#define QL_DEVICES_STR_MAX 256  /* comma-joined device lists */
#define QL_MAX_DEVICES 16       /* devices reported by ql_hello() */
#define QL_INSTANCE_ID_BYTES 16 /* the daemon's random instance id */
/* QL_DIGEST_BYTES (ql_defs.h): the SHA-256 of a weight's canonical form */
#define QL_ADDRESS_MAX 512      /* a buffer that holds any default address */

#define QL_DEFAULT_TIMEOUT_MS 30000

/* A connection to one daemon: its address, the limits it announced in Hello,
 * a pool of idle sockets and the session. Opaque; created by ql_connect(),
 * freed by ql_close(). */
typedef struct ql_client ql_client;

/* Options of ql_connect(). Zero-initialise the struct ({0}) and set what you
 * need: a zero field means its default, so fields added later keep the
 * behaviour of today's callers. */
typedef struct ql_connect_opts {
  /* Time limit of each call's round trip (each request of a multi-request
   * call such as ql_load_float()), in milliseconds. 0 means
   * QL_DEFAULT_TIMEOUT_MS; a negative value waits forever. */
  int timeout_ms;
  /* Shown in the daemon's log only; NULL means "libqlinear". Copied. */
  const char *client_name;
  /* 1: address is the daemon's admin socket (ipc://ADMIN_DIR/admin.sock,
   * open only to the admin group). No session is opened: persistent loads,
   * ql_unload() of any weight and ql_reload_config() work there; regions
   * and ql_linear() do not (QL_ESESSION / QL_EPERM). */
  int admin;
  /* 1: do not use the session's shared-memory ring (the fast path): every
   * request travels as a message over the request socket. By default
   * linear requests use the ring when the daemon offers one (tensors not
   * in a region are staged through regions of the library's own), which
   * cuts a round trip to a few microseconds above the kernel; the results
   * are the same bytes either way. QLINEAR_RING=0 in the environment
   * refuses it too. */
  int no_ring;
} ql_connect_opts;

/* One device of the daemon, as Hello lists it. */
typedef struct ql_device_info {
  char name[QL_DEVICE_NAME_MAX];   /* "cpu", "cuda:<uuid>", "ze:<uuid>" */
  char kind[QL_DEVICE_KIND_MAX];   /* its backend: "cpu", "cuda", "ze" */
  char alias[QL_DEVICE_ALIAS_MAX]; /* "cpu", "cuda:0", ... */
} ql_device_info;

/* What the daemon says about itself (the Hello exchange). */
typedef struct ql_hello_info {
  uint32_t protocol_version;           /* equals QL_PROTOCOL_VERSION */
  char daemon_version[QL_VERSION_MAX]; /* e.g. "0.1.0" */
  /* Random bytes, new at every daemon start: a change means the daemon
   * restarted and lost whatever was not persistent. */
  uint8_t instance_id[QL_INSTANCE_ID_BYTES];
  /* The largest message the daemon accepts (and sends); larger requests
   * are refused locally with QL_ETOOBIG. */
  uint64_t max_message_bytes;
  /* The largest LoadChunk payload the daemon accepts; 0 if it set none. */
  uint64_t max_chunk_bytes;
  /* Devices listed in devices[]: min(n_devices_total, QL_MAX_DEVICES). */
  size_t n_devices;
  size_t n_devices_total; /* devices the daemon announced */
  ql_device_info devices[QL_MAX_DEVICES];
  /* The version of the rules by which the daemon quantizes float weights
   * (ql_load_float() with the default scale dtype); a new version may give
   * other bytes for the same float weight. A client that names weights
   * after their float content puts it in the name (the Python binding's
   * weight_name() does). 1 for a daemon that does not announce it. */
  uint32_t quantizer_version;
} ql_hello_info;

/* Called by ql_load_float() on the calling thread, once with done = 0 before
 * the first chunk and then after each chunk the daemon acknowledged, with
 * the bytes uploaded so far and the total (weight plus bias bytes). Never
 * called after ql_load_float() returns. */
typedef void (*ql_progress_cb)(void *arg, uint64_t done, uint64_t total);

/* A float weight to upload; the daemon quantizes it. */
typedef struct ql_load_desc {
  /* The weight's name: [A-Za-z0-9._/-]{1,255}, no "..", no leading "/"
   * (checked by the daemon: QL_ENAME). */
  const char *name;
  ql_format format;    /* any ql_format */
  uint32_t group_size; /* q4g group, q8b block: 32, 64, 128 or 256;
                          ignored for q8c and f8r */
  uint64_t n;          /* out_features: rows of data, entries of bias */
  uint64_t k;          /* in_features: columns of data */
  ql_dtype dtype;      /* element type of data and bias: F32, F16, BF16 */
  const void *data;    /* [n, k] row-major in dtype; borrowed */
  const void *bias;    /* [n] in dtype, or NULL for no bias; borrowed */
  ql_path policy;      /* the path of requests that leave theirs AUTO */
  /* dtype of the scale and zero arrays the daemon keeps: 0 means the
   * default, TorchAO 0.18's bytes (for a bf16/f16 weight the scale is
   * rounded to that dtype and kept as f32 for q8c and f8r, in that dtype
   * for q4g and q8b); a ql_dtype rounds and keeps the scales in it (f32:
   * the unrounded f32 quotient). */
  int scale_dtype;
  ql_progress_cb progress; /* optional, NULL for none */
  void *progress_arg;      /* passed to progress as is */
  int asymmetric;          /* q8b: 1 for the asymmetric form */
  /* 1: store the weight in the daemon's state directory: it stays
   * resident with no session holding it and across restarts, until an
   * admin unload. Admin socket only (QL_EPERM on the request socket;
   * QL_ENOTSUP when the daemon has no state directory). */
  int persistent;
  /* Where the weight is made resident: device names or aliases from
   * ql_hello() separated by ',', e.g. "cuda:0,cpu"; NULL or "": every
   * accelerator, or the CPU when there is none. An unknown device is
   * QL_ENOTFOUND, one out of service QL_EDEVICE, one named twice
   * QL_EINVAL. A persistent weight keeps its placement across restarts.
   * Content already resident under the name is shared where it is: a
   * list naming a device it is not on is QL_EEXIST. Borrowed. */
  const char *devices;
} ql_load_desc;

/* One already-quantized array (row-major, borrowed). data NULL: absent. */
typedef struct ql_packed_array {
  const void *data;
  int dtype;         /* a ql_array_dtype */
  int ndim;          /* 1 or 2 */
  uint64_t shape[2]; /* shape[1] ignored when ndim is 1 */
} ql_packed_array;

/*
 * An already-quantized weight, as TorchAO makes it (DESIGN §4 layouts):
 * q4g qdata [N, ceil(K/2)] bytes, scale and zero [G, N]; q8c qdata [N, K]
 * int8, scale [N]; q8b qdata [N, K] int8, scale (and zero) [ceil(K/B), N];
 * f8r qdata [N, K] e4m3 bytes, scale [N]. The daemon checks every array's
 * dtype and shape and names the one that does not fit.
 */
typedef struct ql_packed_desc {
  const char *name;     /* as in ql_load_desc */
  ql_format format;
  uint32_t group_size;  /* q4g group, q8b block */
  uint64_t n, k;
  int asymmetric;       /* q8b with a zero array */
  ql_zero_kind zero_kind; /* QL_ZERO_INT: int4 with integer zero points */
  ql_packed_array qdata, scale, zero, bias; /* zero, bias may be absent */
  ql_path policy;
  ql_progress_cb progress; /* optional */
  void *progress_arg;
  int persistent;          /* as in ql_load_desc */
  const char *devices;     /* as in ql_load_desc */
} ql_packed_desc;

/* A resident weight (ListWeights, LoadCommit). Enumerated fields hold the
 * daemon's value as sent, so a format newer than this library shows as a
 * number instead of failing the whole listing. */
typedef struct ql_weight_info {
  char name[QL_NAME_MAX];
  int format;          /* a ql_format */
  uint32_t group_size; /* q4g group size (0 where it does not apply) */
  uint64_t n;          /* out_features */
  uint64_t k;          /* in_features */
  int has_bias;        /* 1 if the weight has a bias, else 0 */
  int asymmetric;      /* q8b: 1 for the asymmetric form */
  int persistent;      /* 1 if stored in the daemon's state directory */
  int policy;          /* a ql_path: AUTO or WEIGHT_ONLY */
  int scale_dtype;     /* a ql_dtype; 0 if the daemon left it unspecified */
  uint8_t digest[QL_DIGEST_BYTES]; /* SHA-256 of the canonical form */
  uint64_t bytes_resident;         /* over all devices */
  /* AUTO requests of at least this many rows run activation-quantized
   * (UINT32_MAX: none do) on the first device that holds the weight
   * (accelerators first; ql_stats() has each device's); crossover_measured
   * is 1 when the daemon measured it for this shape there, 0 for its
   * default or configured value. */
  uint32_t crossover_rows;
  int crossover_measured;
  size_t n_devices;                /* devices holding it */
  /* Their names joined by ",", e.g. "cpu,cuda:0"; ends in "..." if the list
   * did not fit. */
  char devices[QL_DEVICES_STR_MAX];
  /* The source digest of its load (ql_source_digest_float()), valid when
   * has_source_digest is 1 (0: the daemon does not know it, e.g. a stored
   * weight under a plain name). */
  uint8_t source_digest[QL_DIGEST_BYTES];
  int has_source_digest;
} ql_weight_info;

/* How a ql_linear() call was served. */
typedef struct ql_linear_result {
  ql_path path;          /* the path that ran: WEIGHT_ONLY or ACT_QUANT */
  char impl[QL_IMPL_MAX]; /* the kernel implementation that ran */
} ql_linear_result;

/* Counters of one weight on one device. Times are sums over all requests,
 * in nanoseconds. */
#define QL_HIST_BUCKETS 32 /* log2 time histograms: see ql_weight_stats */

typedef struct ql_weight_stats {
  char weight[QL_NAME_MAX];
  char device[QL_DEVICE_NAME_MAX];
  uint64_t requests;   /* Linear requests served */
  uint64_t rows;       /* rows of x computed */
  uint64_t batches;    /* kernel launches (coalesced requests) */
  uint64_t wo_batches; /* batches that ran weight-only */
  uint64_t aq_batches; /* batches that ran activation-quantized */
  uint64_t queue_ns;   /* time requests waited in queues */
  uint64_t kernel_ns;  /* time spent in kernels */
  char impl[QL_IMPL_MAX]; /* implementation used last */
  uint64_t bytes_resident; /* this weight's bytes on this device */
  uint64_t expired;        /* requests answered QL_EDEADLINE */
  /* Histograms: bucket 0 counts times in [0, 1024) ns, bucket b > 0 those
   * in [2^(b+9), 2^(b+10)) ns, the last one everything above. queue_hist
   * has one entry per request (arrival to its first launch), kernel_hist
   * one per launch. */
  uint64_t queue_hist[QL_HIST_BUCKETS];
  uint64_t kernel_hist[QL_HIST_BUCKETS];
  /* AUTO requests of at least this many rows run activation-quantized on
   * this device (UINT32_MAX: none do); crossover_measured is 1 when the
   * daemon measured it for this shape on this device. */
  uint32_t crossover_rows;
  int crossover_measured;
} ql_weight_stats;

/* Weight memory of one device against its budget. */
typedef struct ql_device_memory {
  char device[QL_DEVICE_NAME_MAX];
  uint64_t bytes_resident; /* weights resident on it */
  uint64_t budget_bytes;   /* loads past it fail (QL_ENOMEM); 0: none */
} ql_device_memory;

/* The daemon's counters (Stats). One allocation: free it with
 * ql_stats_free() (or ql_free()), never per_weight on its own. */
/* What one user (uid) holds of the daemon's shared budgets (uid_share in
 * qlineard.conf(5)). */
typedef struct ql_user_stats {
  uint32_t uid;
  uint32_t sessions;        /* open now */
  uint64_t queued_requests; /* waiting or running (fused parts each) */
  uint64_t queued_bytes;    /* their inline x and y bytes */
  uint64_t uploads;         /* in progress */
  uint64_t upload_bytes;    /* what they count against max_upload_bytes */
  uint64_t refused;         /* refused for its share since first seen */
} ql_user_stats;

typedef struct ql_stats_info {
  uint64_t uptime_ns;           /* since the daemon started */
  uint64_t requests;            /* requests received, of every kind */
  uint64_t errors;              /* requests answered with an error */
  uint64_t bytes_in;            /* request bytes received */
  uint64_t bytes_out;           /* reply bytes sent */
  uint64_t weights;             /* weights resident now */
  uint64_t uploads_in_progress; /* begun, neither committed nor aborted */
  size_t n_per_weight;          /* entries of per_weight */
  ql_weight_stats *per_weight;  /* one per (weight, device); inside this
                                   allocation, NULL when n_per_weight is 0 */
  uint64_t sessions;            /* sessions open now, this one included */
  uint64_t regions;             /* regions of all sessions */
  uint64_t region_bytes;        /* their sizes added up */
  uint64_t persistent_weights;  /* weights in the state directory */
  size_t n_devices;             /* entries of devices[] */
  size_t n_devices_total;       /* devices the daemon reported */
  ql_device_memory devices[QL_MAX_DEVICES];
  uint64_t rings;               /* sessions with a ring (the fast path) */
  uint64_t ring_requests;       /* requests received through rings, of
                                   all sessions (included in requests) */
  /* Users: every uid counted on an admin client, this client's own uid
   * otherwise; inside this allocation, NULL when n_users is 0. */
  size_t n_users;
  ql_user_stats *users;
} ql_stats_info;

/*
 * A shared-memory region made by the daemon for this client's session
 * (ql_region_create()): the same memory is mapped in the daemon, so a
 * Linear request can read x from it and write y into it with no copy and no
 * message-size limit. Owned by the library: valid from ql_region_create()
 * until ql_region_destroy() or ql_close(). Read and write data freely; only
 * avoid writing a slice that a request in flight reads, or reading one it
 * writes, until that request returned.
 */
typedef struct ql_region {
  uint64_t id;  /* the daemon's id, unique while it runs; never 0 */
  size_t size;  /* bytes, as asked for */
  void *data;   /* size bytes, read-write, page-aligned; zero-filled at
                   creation */
} ql_region;

/* Bytes [offset, offset + length) of a region of this client. offset must
 * be a multiple of the element size of the data it holds. */
typedef struct ql_slice {
  const ql_region *region;
  uint64_t offset;
  uint64_t length;
} ql_slice;

/*
 * A tensor in the caller's CUDA device memory, which the daemon reads or
 * writes in place through CUDA IPC: bytes [offset, offset + length) of
 * the allocation that mem_handle (cudaIpcGetMemHandle of its base) names.
 * A plain value, owned by the caller; the library copies what it sends.
 * <qlinear/qlinear_cuda.h> fills one from a device pointer; this library
 * itself does not use CUDA.
 *
 * The daemon opens each handle once per session and keeps the allocation
 * mapped until the session ends (ql_close()), so memory freed by the
 * caller meanwhile is not returned to the device until then; it checks
 * every slice against the allocation's real size. A request with such a
 * tensor runs on its device, which must hold the weight.
 */
typedef struct ql_cuda_slice {
  unsigned char mem_handle[QL_CUDA_IPC_HANDLE_BYTES]; /* cudaIpcMemHandle_t */
  uint64_t offset; /* from the allocation's base; a multiple of the element
                      size */
  uint64_t length; /* bytes: exactly the tensor's */
  /* The allocation's device as the daemon names it ("cuda:GPU-<uuid>",
   * which any process agrees on, or an alias such as "cuda:0" in the
   * daemon's own order), NUL-terminated. */
  char device[QL_DEVICE_NAME_MAX];
  /* x only: when non-zero, ready_event is a cudaIpcEventHandle_t of an
   * event (cudaEventInterprocess | cudaEventDisableTiming) recorded after
   * the work that produces x; the daemon reads x once it has completed. */
  int has_ready_event;
  unsigned char ready_event[QL_CUDA_IPC_HANDLE_BYTES];
} ql_cuda_slice;

/*
 * A tensor in the caller's Level Zero device memory, which the daemon
 * reads or writes in place: bytes [offset, offset + length) of the
 * allocation imported as import_id (ql_ze_import()). A plain value.
 */
typedef struct ql_ze_slice {
  uint64_t import_id; /* from ql_ze_import(), of this client's session */
  uint64_t offset;    /* from the allocation's base; a multiple of the
                         element size */
  uint64_t length;    /* bytes: exactly the tensor's */
} ql_ze_slice;

/*
 * Writes the default daemon address into buf (len bytes, NUL included):
 *  1. the environment variable QLINEAR_ADDRESS, verbatim, if it is set and
 *     not empty;
 *  2. else "ipc://" $XDG_RUNTIME_DIR "/qlinear/qlineard.sock" if
 *     XDG_RUNTIME_DIR is set and starts with "/" (the XDG spec says to
 *     ignore a relative one);
 *  3. else "ipc:///tmp/qlinear-<uid>/qlineard.sock", <uid> being the real
 *     uid (getuid()) in decimal;
 *  and when the socket of 2 or 3 does not exist (no per-user daemon runs)
 *  but the system service's does, the system service's:
 *  QLINEAR_SYSTEM_ADDRESS if set and not empty, else
 *  "ipc:///run/qlinear/qlineard.sock" (deploy/qlineard.service).
 * Returns 0, or QL_EINVAL if buf is NULL or the address does not fit (buf
 * then holds ""). QL_ADDRESS_MAX bytes suffice unless the environment holds
 * longer paths. Thread-safe as far as getenv() is.
 */
QL_EXPORT int ql_default_address(char *buf, size_t len);

/*
 * Writes the default admin socket address into buf (len bytes): the
 * environment variable QLINEAR_ADMIN_ADDRESS if it is set and not empty,
 * else "admin/admin.sock" in the directory of ql_default_address() (where
 * a daemon without admin_dir in its config puts it); when
 * ql_default_address() fell back to the system service, its admin socket:
 * "admin.sock" in the directory of that socket's directory with "-admin"
 * appended (ipc:///run/qlinear-admin/admin.sock, its admin_dir).
 * Returns 0, or QL_EINVAL (buf then holds "").
 */
QL_EXPORT int ql_default_admin_address(char *buf, size_t len);

/*
 * Connects to the daemon at address (NULL means ql_default_address()) and
 * performs Hello: the protocol versions must match (else QL_EVERSION), and
 * the announced message cap, chunk limit and instance id are remembered.
 * Then opens the session: the address must be ipc://DIR/NAME, and the
 * session socket is DIR/session.sock (else QL_EINVAL, QL_ECONNECT, or
 * QL_EEXHAUSTED when the daemon has too many sessions open). opts may be
 * NULL for the defaults.
 *
 * For an ipc:// address the socket file is checked first, so a missing
 * daemon fails at once with QL_ECONNECT (or QL_EPERM) instead of waiting
 * for the timeout; a daemon that accepts but does not answer gives
 * QL_ETIMEDOUT.
 *
 * On success *out owns a new client, to be freed with ql_close(); on failure
 * *out is set to NULL.
 */
QL_EXPORT int ql_connect(const char *address, const ql_connect_opts *opts,
                         ql_client **out);

/* Ends the session (the daemon destroys its regions and drops its weight
 * holds), unmaps and frees the regions still alive, closes the client's
 * sockets and frees it. NULL is a no-op. No other call on this client may
 * be running or follow. */
QL_EXPORT void ql_close(ql_client *c);

/* Performs a new Hello and fills *out. Also refreshes the limits the client
 * uses (a restarted daemon may announce new ones); compare instance_id with
 * an earlier answer to notice a restart. */
QL_EXPORT int ql_hello(ql_client *c, ql_hello_info *out);

/*
 * Uploads a float weight (and bias) for the daemon to quantize and keep:
 * LoadBegin, LoadChunk in order, LoadCommit. If a call fails after
 * LoadBegin, the upload is aborted (LoadAbort, best effort) and the first
 * error is returned. On success *info_out (if not NULL) describes the
 * resident weight and *shared_out (if not NULL) is 1 when an identical
 * weight was already resident under that name and is now shared, else 0.
 * Loading a name that exists with different content is QL_EEXIST.
 */
QL_EXPORT int ql_load_float(ql_client *c, const ql_load_desc *d,
                            ql_weight_info *info_out, int *shared_out);

/*
 * Uploads an already-quantized weight (see ql_packed_desc), kept as given:
 * scales and zeros keep their dtype. Same results and errors as
 * ql_load_float(); a mismatched array is QL_ESHAPE or QL_EDTYPE with a
 * message naming it.
 */
QL_EXPORT int ql_load_packed(ql_client *c, const ql_packed_desc *d,
                             ql_weight_info *info_out, int *shared_out);

/*
 * The source digest of a float load (docs/security.md): the SHA-256 the
 * daemon computes over what ql_load_float(d) sends, for a daemon whose
 * quantizer version (ql_hello_info.quantizer_version) is
 * quantizer_version. A name ending in ".src-" and its 64 lowercase hex
 * digits is content-addressed: the daemon loads only that content under
 * it, so such a name can be held by anyone without a digest and can never
 * be taken by other content. d->name, devices, persistent and progress do
 * not count. 0, or QL_EINVAL / QL_EDTYPE / QL_ETOOBIG as ql_load_float().
 * Reads the data: as slow as SHA-256 over it.
 */
QL_EXPORT int ql_source_digest_float(const ql_load_desc *d,
                                     uint32_t quantizer_version,
                                     uint8_t out[QL_DIGEST_BYTES]);

/* The same for ql_load_packed(d) (no quantizer version: nothing is
 * quantized). */
QL_EXPORT int ql_source_digest_packed(const ql_packed_desc *d,
                                      uint8_t out[QL_DIGEST_BYTES]);

/* Drops this session's hold on the weight called name (the daemon unloads
 * a weight no session holds). QL_ENOTFOUND when there is no such weight,
 * QL_EPERM when only other sessions hold it or the admin socket keeps it.
 * On an admin client, removes the weight whoever holds it, and its stored
 * file when it is persistent. */
QL_EXPORT int ql_unload(ql_client *c, const char *name);

/* Makes this session a holder of the resident weight called name, as
 * loading the same content would, without sending it: a process that knows
 * the weight another one loaded (by name, and by digest when digest is not
 * NULL: the weight's digest, or the source digest of its load, see
 * ql_source_digest_float()). It stays resident while the session holds it;
 * ql_unload() drops the hold. *out (may be NULL) describes it. QL_ENOTFOUND
 * when no weight has that name, QL_EEXIST when its digest is another,
 * QL_EPERM on an admin client, and without a digest when another user
 * loaded the weight under a plain name (not content-addressed, not from the
 * admin socket): such a weight could be anything. */
QL_EXPORT int ql_hold(ql_client *c, const char *name,
                      const uint8_t digest[QL_DIGEST_BYTES],
                      ql_weight_info *out);

/* A resident weight read back (ql_export_weight()): one allocation. */
typedef struct ql_exported_weight {
  ql_weight_info info;   /* the weight, as the read began */
  /* Its canonical arrays, as ql_load_packed() takes them (the upload of
   * packed gives the same digest): name points at info.name, the arrays
   * into this allocation (each 64-byte aligned); qdata i8 (q4g: two codes
   * a byte, even k low; f8r: e4m3 bytes), scale and zero in
   * info.scale_dtype, zero_kind QL_ZERO_FLOAT, bias f32; progress,
   * persistent and devices are left 0. */
  ql_packed_desc packed;
  uint64_t bytes;        /* of the four arrays together */
} ql_exported_weight;

/*
 * Reads the resident weight called name back in its canonical form, in
 * requests of at most the daemon's chunk size, so that a client can save
 * it (docs/protocol.md, ExportWeight). A session reads only the weights it
 * holds (it loaded them or ql_hold() succeeded): QL_EPERM for another
 * resident weight, QL_ENOTFOUND for none; an admin client reads any. On
 * success *out is the caller's, freed with ql_free(); on failure it is
 * NULL. A weight replaced under its name between two of the requests
 * (another digest) is QL_EEXIST, and nothing is returned.
 */
QL_EXPORT int ql_export_weight(ql_client *c, const char *name,
                               ql_exported_weight **out);

/* Admin client only (QL_EPERM otherwise): makes the daemon read its
 * configuration again, as SIGHUP does. report (len bytes, may be NULL)
 * receives what changed and what needs a restart, NUL-terminated. */
QL_EXPORT int ql_reload_config(ql_client *c, char *report, size_t len);

/*
 * Lists the resident weights. On success *out is an array of *count entries
 * that the caller frees with ql_free() (NULL when *count is 0); on failure
 * *out is NULL and *count 0.
 */
QL_EXPORT int ql_list(ql_client *c, ql_weight_info **out, size_t *count);

/* Finds the weight called name (through ql_list(), so it costs a full
 * listing) and copies its description into *out. QL_ENOTFOUND if no such
 * weight is resident. */
QL_EXPORT int ql_lookup(ql_client *c, const char *name, ql_weight_info *out);

/*
 * Computes y = x·Wᵀ (+ b) with the resident weight called weight: x is
 * [m, k] in dtype, y receives [m, n] in the same dtype (n is the weight's
 * out_features, see ql_lookup()). path forces a path or leaves the choice
 * to the daemon (QL_PATH_AUTO). If res is not NULL it receives the path and
 * implementation that ran.
 *
 * A request or reply larger than the daemon's message cap is refused here
 * with QL_ETOOBIG, without sending. A reply whose y is not [m, n] is
 * QL_ESHAPE, one whose y is not in dtype is QL_EDTYPE; y is written only on
 * success.
 */
QL_EXPORT int ql_linear(ql_client *c, const char *weight, ql_path path,
                        ql_dtype dtype, uint64_t m, uint64_t k, const void *x,
                        uint64_t n, void *y, ql_linear_result *res);

/*
 * The same with x read from a region slice and y written either into a
 * region slice (y not NULL, y_inline NULL: nothing is copied either way,
 * and the result may be larger than the message cap) or into y_inline
 * (y NULL: the reply carries it, as for ql_linear()). Exactly one of y and
 * y_inline is given. x->length must be m·k and y->length m·n elements of
 * dtype; both slices lie inside their regions, belong to this client and do
 * not overlap (QL_EINVAL or QL_ESHAPE otherwise, checked here and again by
 * the daemon).
 */
/*
 * Several weights applied to the same x in one round trip (fused q/k/v or
 * gate/up): for i < count (at most QL_MULTI_MAX), y[i] [m, n[i]] =
 * x·weights[i]ᵀ + b_i. Every weight must have in_features k. Each runs as
 * a request of its own in the daemon (its own path, reported in res[i] when
 * res is not NULL); the call fails if any does, and then writes no y. All
 * results come back in one reply: together they must fit the daemon's
 * message cap (QL_ETOOBIG otherwise).
 */
/* QL_MULTI_MAX: in ql_defs.h, the wire's limit */
QL_EXPORT int ql_linear_multi(ql_client *c, size_t count,
                              const char *const *weights, ql_path path,
                              ql_dtype dtype, uint64_t m, uint64_t k,
                              const void *x, const uint64_t *n,
                              void *const *y, ql_linear_result *res);

QL_EXPORT int ql_linear_region(ql_client *c, const char *weight, ql_path path,
                               ql_dtype dtype, uint64_t m, uint64_t k,
                               const ql_slice *x, uint64_t n,
                               const ql_slice *y, void *y_inline,
                               ql_linear_result *res);

/*
 * The same with x in the caller's CUDA device memory (see ql_cuda_slice)
 * and y written either into device memory too (y not NULL, y_inline NULL:
 * the call returns once y is written there, with no copy through the
 * host and no message-size limit) or into y_inline (y NULL: the reply
 * carries it, as for ql_linear()). Exactly one of y and y_inline is
 * given. x->length must be m·k and y->length m·n elements of dtype, and x
 * and y name one device (QL_EINVAL or QL_ESHAPE otherwise, checked here
 * and again by the daemon, which also checks the slices against the real
 * allocations: QL_EINVAL for a slice past an allocation's end or a handle
 * it cannot open).
 */
QL_EXPORT int ql_linear_cuda(ql_client *c, const char *weight, ql_path path,
                             ql_dtype dtype, uint64_t m, uint64_t k,
                             const ql_cuda_slice *x, uint64_t n,
                             const ql_cuda_slice *y, void *y_inline,
                             ql_linear_result *res);

/*
 * Imports a Level Zero device allocation of the caller into its session:
 * fd is the allocation's dma-buf descriptor and handle the
 * ze_ipc_mem_handle_t that zeMemGetIpcHandle gave for it, for device (a
 * name or alias from ql_hello(), "ze:<uuid>" or "ze:0");
 * <qlinear/qlinear_ze.h> gets both from a device pointer. The descriptor
 * travels to the daemon as SCM_RIGHTS: the caller keeps its own and may
 * close it once this returns. The daemon opens the allocation once, bounds
 * every slice by its real size (*size, may be NULL), and keeps it open
 * until ql_ze_release(), ql_close() or the end of the process (so memory
 * freed meanwhile is not returned to the device until then). On success
 * *import_id (never 0) names it in ql_ze_slice. QL_ENOTSUP: the device or
 * its driver has no memory IPC; QL_EINVAL: a handle or descriptor the
 * device cannot open; QL_ENOTFOUND: no such device; QL_EEXHAUSTED: the
 * session has as many imports as it may.
 */
QL_EXPORT int ql_ze_import(ql_client *c, int fd,
                           const unsigned char handle[QL_ZE_IPC_HANDLE_BYTES],
                           const char *device, uint64_t *import_id,
                           uint64_t *size);

/* Lets the daemon close an import; requests already sent that use it
 * still complete. QL_ENOTFOUND for an id this session does not have. */
QL_EXPORT int ql_ze_release(ql_client *c, uint64_t import_id);

/*
 * ql_linear_cuda() for Level Zero memory: x in an imported allocation
 * (ql_ze_slice), y into one too (y not NULL, y_inline NULL) or inline in
 * the reply (y NULL). The request runs on the imports' device, which must
 * hold the weight; x and y must be imports of one device and must not
 * overlap. The caller makes sure its writes of x are complete (e.g. with
 * zeEventHostSynchronize) before the call; y is written when it
 * returns 0. Slices past an allocation's real end are QL_EINVAL, an
 * import id of no import of this session QL_ENOTFOUND.
 */
QL_EXPORT int ql_linear_ze(ql_client *c, const char *weight, ql_path path,
                           ql_dtype dtype, uint64_t m, uint64_t k,
                           const ql_ze_slice *x, uint64_t n,
                           const ql_ze_slice *y, void *y_inline,
                           ql_linear_result *res);

/*
 * Asks the daemon for a new region of size bytes (size > 0) and maps it.
 * The daemon seals it against shrinking and growing, so neither side can
 * cut the memory from under the other. A session holds at most a daemon-set
 * number of regions and bytes (QL_EEXHAUSTED past them). On success *out
 * is the library's, released by ql_region_destroy() or ql_close(); on
 * failure it is NULL.
 */
QL_EXPORT int ql_region_create(ql_client *c, size_t size, ql_region **out);

/*
 * Destroys a region of this client: tells the daemon (requests already
 * queued on it still complete: the daemon keeps its mapping until they
 * finish), then unmaps and frees it here whatever the daemon answered. NULL
 * is a no-op; a region of another client is QL_EINVAL.
 */
QL_EXPORT int ql_region_destroy(ql_client *c, ql_region *r);

/*
 * What ql_map_weight() gives: the device allocation that holds a weight's
 * layout, as a descriptor, and where the layout's arrays lie in it, for a
 * client that runs the kernels on it in its own process (mapped mode).
 * libqlinear-cuda does that (<qlinear/qlinear_mapped.h>); this is for
 * those who do it themselves.
 */
typedef struct ql_weight_map {
  int fd;               /* the allocation (CUDA: a POSIX descriptor for
                           cuMemImportFromShareableHandle); the caller owns
                           it and closes it once imported */
  uint64_t size;        /* bytes of the allocation: map exactly this */
  char layout[16];      /* the layout's name: "cuda-1" */
  char device[QL_DEVICE_NAME_MAX]; /* its device ("cuda:GPU-<uuid>") */
  ql_format format;
  ql_dtype scale_dtype; /* of the scales and zero points */
  uint64_t n, k;        /* out_features, in_features */
  uint64_t groups;      /* scale groups per row (1 for q8c, f8r) */
  uint32_t group_size;  /* elements per group */
  uint64_t ldq;         /* bytes between rows of codes */
  uint64_t q_offset;    /* codes [n, ldq], from the allocation's start */
  uint64_t scale_offset; /* scales [n, groups] in scale_dtype */
  uint64_t zero_offset; /* zero points, as scales; UINT64_MAX: none */
  uint64_t bias_offset; /* bias [n] f32; UINT64_MAX: none */
  uint32_t sms;         /* the device's multiprocessors (the grid) */
  int writable;         /* 1: the driver cannot map it read-only (the
                           daemon tried): map it read-write; 0: map it
                           read-only */
  uint8_t digest[QL_DIGEST_BYTES]; /* the weight's SHA-256 */
} ql_weight_map;

/*
 * Asks the daemon for the layout of weight name on device (a name or
 * alias; NULL or "": the weight's first device that can export one),
 * for mapped mode. The session must hold the weight (it loaded it, or
 * ql_hold()): QL_ENOTFOUND otherwise. The daemon keeps that layout
 * resident until this client's session ends, even if the weight is
 * unloaded or replaced meanwhile, and the session cannot ql_unload() it
 * before it ends (QL_EPERM). QL_ENOTSUP where the device cannot export it
 * (the CPU, an old driver) or mapped_mode is off; QL_EPERM where
 * mapped_mode = owner and this process's user is not the daemon's.
 * On success out->fd is the caller's.
 */
QL_EXPORT int ql_map_weight(ql_client *c, const char *name,
                            const char *device, ql_weight_map *out);

/* Fetches the daemon's counters. On success *out is owned by the caller and
 * freed with ql_stats_free(); on failure it is NULL. */
QL_EXPORT int ql_stats(ql_client *c, ql_stats_info **out);

/* Frees what ql_stats() returned. NULL is a no-op. */
QL_EXPORT void ql_stats_free(ql_stats_info *s);

/* Frees memory this library handed to the caller (ql_list(), ql_stats()).
 * NULL is a no-op. */
QL_EXPORT void ql_free(void *p);

/*
 * Explains the most recent call of this library on this thread that failed:
 * the daemon's Status.message, or a description of a local failure (may be
 * "" if there is nothing to add to ql_strerror()). Every call clears it
 * when it starts, so after a successful call it is "". The string lives in
 * a thread-local buffer that the next call on this thread overwrites. Never
 * NULL.
 */
QL_EXPORT const char *ql_errmsg(void);

#ifdef __cplusplus
}
#endif
#endif /* QLINEAR_H */
