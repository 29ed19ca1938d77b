/*
 * registry.h - the kernel registry (DESIGN §5).
 *
 * An op is declared once, here, with its argument struct. The generic
 * implementation (plain C, kernels/reference.c) is registered for every
 * device; a backend registers faster implementations for the (op, format,
 * activation dtype) cases it supports and may decline a shape through
 * supports(). Dispatch takes the backend's own implementation when it
 * supports the case, else the generic one, and hands back the chosen
 * implementation so the caller can say which ran.
 *
 * This file and kernels/backends.c are the only places that know which
 * backends exist; the daemon asks the registry and never tests for a
 * backend at compile time. Modelled on TorchAO's TORCH_LIBRARY /
 * TORCH_LIBRARY_IMPL split and ggml's backend registry.
 */
#ifndef QL_REGISTRY_H
#define QL_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "ql_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The ops. */
typedef enum ql_op {
  QL_OP_QUANTIZE_ROWS = 0, /* activation rows -> int8/e4m3 + scales */
  QL_OP_LINEAR_WO = 1,     /* weight-only linear */
  QL_OP_LINEAR_AQ = 2,     /* activation-quantized linear */
  QL_OP_REPACK = 3,        /* canonical weight -> device layout */
  QL_OP_COUNT
} ql_op;

/*
 * A launch in parts (ql_linear_args.part), for an implementation whose
 * parts flag is set: the call computes y in pieces of its own choosing,
 * asks stop() between pieces and returns early when it says so, keeping
 * its place in state; the next call with the same part, x, y and weight
 * goes on from there. Each output element is computed exactly as in one
 * whole call (the kernels keep a fixed reduction order), so a launch's
 * bytes do not depend on where it stopped. The daemon stops a long
 * prefill launch this way when decode work arrives and resumes it after,
 * instead of cutting it into row chunks that each read the whole weight
 * again.
 */
typedef struct ql_linear_part {
  /* In, may be NULL (never stop): non-zero asks the call to return at its
   * next piece boundary. Called from any of the call's threads, several
   * at once; each thread computes a piece before it first asks, so every
   * call gets on. */
  int (*stop)(void *ctx);
  void *ctx;
  /* In: the most host threads this call may use (the CPU backend's
   * pool), so that others keep a CPU; 0: as many as it would use. */
  unsigned threads;
  /* Out: 1 when the launch is done (y is whole), 0 when it stopped. */
  int done;
  /* In/out: the launch's place and what its first call prepared (x
   * converted or quantized), kept for the next call. NULL at the first
   * call; set by a call that stops and cleared by the one that finishes
   * or fails. Owned by the caller in between: one that gives the launch
   * up frees it with state_free(state). */
  void *state;
  void (*state_free)(void *state);
} ql_linear_part;

/* Arguments of QL_OP_LINEAR_WO and QL_OP_LINEAR_AQ: y[M,N] = x[M,K]·Wᵀ+b. */
typedef struct ql_linear_args {
  const ql_qweight *w; /* canonical weight */
  const void *packed;  /* the layout the same backend's repack made at
                          load, or NULL when it has none (then the
                          canonical form is read); always NULL for the
                          generic implementations */
  ql_dtype dt;         /* dtype of x and y */
  const void *x;       /* [m, w->k] */
  int64_t m;
  void *y;             /* [m, w->n] */
  ql_linear_part *part; /* NULL: the whole launch in one call; else see
                           ql_linear_part (only an implementation whose
                           parts flag is set reads it) */
} ql_linear_args;

/* Bits of ql_linear_dev_args.where. */
#define QL_LINEAR_X_DEVICE 1u /* x is device memory of the bound device */
#define QL_LINEAR_Y_DEVICE 2u /* y is device memory of the bound device */

/* The linear ops' arguments when x or y is device memory that the
 * backend imported from a client (ql_backend.ipc_open), for
 * ql_backend.linear_dev. */
typedef struct ql_linear_dev_args {
  ql_linear_args a; /* a.x / a.y: device pointers where where says so */
  unsigned where;   /* QL_LINEAR_*_DEVICE bits; 0: both in host memory */
  /* An event from the same backend's ipc_event_open that the op waits for
   * before it reads x (the client records it after its producer of x), or
   * NULL. A wait past the backend's kernel timeout fails the call with
   * QL_ETIMEDOUT and leaves the device in service: the event is the
   * client's, not the device's. */
  void *ready;
} ql_linear_dev_args;

/* Values of ql_qrows_args.kind. */
#define QL_QROWS_I8 1   /* int8, the q8c rule (ql_quantize_rows_i8_src) */
#define QL_QROWS_E4M3 2 /* float8 e4m3fn, the f8r rule
                           (ql_quantize_rows_e4m3_src) */

/* Arguments of QL_OP_QUANTIZE_ROWS. An unknown kind, or gsum with
 * QL_QROWS_E4M3 (e4m3 codes have no integer sum), is QL_EINVAL; the rest
 * as ql_quantize_rows_i8_src / ql_quantize_rows_e4m3_src, whose rule
 * (ql_kernels.h) every implementation reproduces bit for bit. */
typedef struct ql_qrows_args {
  int kind;       /* QL_QROWS_I8 or QL_QROWS_E4M3 */
  const float *x; /* [m, k] */
  int64_t m, k;
  uint32_t gs;    /* I8: group length of gsum; ignored for E4M3 */
  void *xq;       /* [m, k]: int8_t (I8) or e4m3 codes, uint8_t (E4M3) */
  float *sx;      /* [m] */
  int32_t *gsum;  /* I8: [m, ceil(k/gs)] or NULL; E4M3: NULL */
  ql_dtype src;   /* the dtype x arrived in (x holds it widened to f32),
                     in which the scale is computed as TorchAO does; 0
                     means QL_DTYPE_F32, so args that leave it out keep
                     the f32 rule */
} ql_qrows_args;

/*
 * Arguments of QL_OP_REPACK. On success *packed is a new layout that the
 * caller frees with the same implementation's free_packed().
 */
typedef struct ql_repack_args {
  const ql_qweight *w;
  void *packed;        /* out */
  size_t packed_bytes; /* out: resident size of the layout */
} ql_repack_args;

typedef struct ql_kernel_impl ql_kernel_impl;

/* One implementation of one op. */
struct ql_kernel_impl {
  const char *name;  /* "generic.linear_wo", "cpu.avx2.linear_wo", ... */
  ql_op op;
  uint32_t formats;  /* bit (1u << ql_format) per format handled */
  uint32_t dtypes;   /* bit (1u << ql_dtype) per activation dtype */
  /* Declines a shape it cannot run (NULL: every shape of its formats and
   * dtypes). Returns non-zero when it supports (format, m, n, k). A backend
   * with devices may also decline for the device the calling thread bound
   * (ql_backend.device_bind; ordinal 0 when it bound none). */
  int (*supports)(const ql_kernel_impl *impl, ql_format f, int64_t m,
                  int64_t n, int64_t k);
  union {
    int (*linear)(const ql_linear_args *a);
    int (*quantize_rows)(const ql_qrows_args *a);
    int (*repack)(ql_repack_args *a);
  } fn;
  void (*free_packed)(void *packed); /* QL_OP_REPACK only */
  /*
   * QL_OP_REPACK, optional (NULL: a layout is not cached). A layout whose
   * bytes form one contiguous image can be cached across restarts:
   * image() gives that image; adopt() rebuilds the layout of w around such
   * an image without copying it (the image must outlive the layout, and
   * free_packed() then leaves it alone). adopt() checks that len is the
   * size w's layout has and everything else it can without reading the
   * image, whose bytes it trusts. layout_id names the image format ("cpu-1"):
   * a cache keys images by (weight digest, layout_id), and a layout_id
   * changes whenever the layout does.
   */
  const char *layout_id;
  int (*image)(const void *packed, const void **data, size_t *len);
  int (*adopt)(const ql_qweight *w, const void *data, size_t len,
               void **packed, size_t *packed_bytes);
  /* QL_OP_LINEAR_*: 1 when fn.linear honours ql_linear_args.part (the
   * launch can stop early and go on later); 0: it ignores part and runs
   * whole (ql_run_linear_part then says so). */
  int parts;
};

/* What ql_backend.configure takes; a zero field is the backend's default. */
typedef struct ql_backend_config {
  unsigned threads;  /* kernel threads; 0: the CPUs this process may use */
  const char *level; /* highest instruction level ("avx512", "avx2vnni",
                        "avx2", "c"); NULL or "auto": the best detected */
  unsigned kernel_timeout_ms; /* accelerators: a launch not finished by
                                 then takes its device out of service */
} ql_backend_config;

/* One device of a backend (ql_backend.device_info). */
typedef struct ql_device_desc {
  char name[64];       /* stable across processes: "cuda:<uuid>" */
  char alias[32];      /* this process's enumeration order: "cuda:0" */
  char model[64];      /* what the driver calls it, for logs */
  size_t memory_bytes; /* the device's whole memory; the daemon gives its
                          weights a share of it (its budget) */
  uint64_t peak_bytes_per_s; /* peak memory bandwidth, as the vendor
                                computes it from the memory clock and bus
                                width; 0 when the driver does not say */
  char note[160];      /* what else the log should say of the device (which
                          optional paths its ops take, and why not), or
                          empty */
} ql_device_desc;

/*
 * A device layout handed to another process to map (mapped mode, DESIGN
 * §7): the allocation that holds it, as a descriptor, and where the
 * layout's arrays lie in it. Made by ql_backend.export_layout.
 */
typedef struct ql_layout_export {
  int fd;             /* a new descriptor of the allocation; the caller
                         owns it (and closes it once sent) */
  uint64_t size;      /* bytes of the allocation: what the importer maps */
  const char *layout; /* the layout's name ("cuda-1": ql_cuda.h), static */
  int64_t ldq;        /* bytes between rows of codes */
  uint64_t q_offset;  /* codes [n, ldq], from the allocation's start */
  uint64_t scale_offset; /* scales [n, groups], in the weight's scale dtype */
  uint64_t zero_offset;  /* zero points as scales, or UINT64_MAX: none */
  uint64_t bias_offset;  /* bias [n] f32, or UINT64_MAX: none */
  uint32_t sms;       /* multiprocessors of the device (the kernels' grid) */
  int scale_dtype;    /* ql_dtype of scales and zeros in the layout (may
                         be wider than the weight's) */
  int readonly;       /* 1: the driver maps it read-only for another
                         process; 0: only read-write */
} ql_layout_export;

/* A backend: one kind of device and its implementations. */
typedef struct ql_backend {
  const char *name; /* "cpu", "cuda", "ze" */
  const ql_kernel_impl *impls;
  size_t n_impls;
  /* Optional: the backend's settings from the daemon's configuration,
   * applied before its first kernel runs. 0, QL_EINVAL (a value out of
   * range or unknown), QL_ENOTSUP (a level the machine lacks, or too late:
   * its threads exist). */
  int (*configure)(const struct ql_backend_config *c);
  /* Optional: the host threads one launch of the host device uses, as
   * configured (the CPU backend's pool); NULL for accelerators. */
  unsigned (*host_threads)(void);
  /*
   * Devices. A backend without device_count has one device, the host,
   * named after the backend ("cpu"), whose memory is the host's.
   *
   * device_count() returns the devices present, or 0 when there are none
   * (no driver, no GPU), and then sets *why to a static sentence saying
   * so, for the log. device_info() describes device ordinal (0 ..
   * count-1). device_bind() makes ordinal the device that the calling
   * thread's ops run on, and on which repack places its layouts; a thread
   * that never bound one uses ordinal 0. Ops of a device that failed for
   * good (a sticky error, a kernel that never finished) return
   * QL_EDEVICE from then on: the caller takes the device out of service.
   */
  int (*device_count)(const char **why);
  int (*device_info)(int ordinal, ql_device_desc *out);
  int (*device_bind)(int ordinal);
  /* Calls that run at once on one device, each from its own thread (own
   * stream and scratch); 0 or 1: the backend runs them one at a time. The
   * daemon's batches_in_flight is capped by it. */
  unsigned device_lanes;
  /* Optional: 0 while ordinal is in service, else QL_EDEVICE with the
   * reason it failed written to buf (for the log). */
  int (*device_error)(int ordinal, char *buf, size_t len);
  /*
   * Optional, together: memory and events of another process's device,
   * named by the handles its runtime exported (CUDA IPC). Callable from
   * any thread; each binds ordinal itself.
   *
   * ipc_open maps the allocation that handle (len bytes, ipc_handle_bytes
   * for a valid one) names into ordinal's context and gives *base, a
   * device pointer to the allocation's first byte, and *size, the size of
   * the whole allocation as the driver reports it (never as the handle
   * claims), which bounds every slice taken from it. Opening a handle the
   * process has open already gives the same base and counts once more;
   * each successful open needs one ipc_close(ordinal, base). Errors:
   * QL_EINVAL for a handle that is malformed, of an allocation that is
   * gone, or that this device cannot map; QL_ENOMEM; QL_EDEVICE. A bad
   * handle never takes the device out of service.
   *
   * ipc_event_open imports an event handle the same way into *ev, for
   * ql_linear_dev_args.ready; ipc_event_close releases it.
   *
   * ipc_open_fd replaces ipc_open (and the event ops, which it goes
   * without) for a backend whose handles carry a file descriptor of the
   * importing process (Level Zero dma-buf handles): it opens handle (len
   * bytes, as the exporter's zeMemGetIpcHandle gave it) with the
   * descriptor fd of this process written into it, as ipc_open does, and
   * never takes fd over (the caller closes it, after ipc_close). Such
   * handles come only with their descriptor, over the session socket:
   * bytes alone in a request would name whatever descriptor of the daemon
   * has that number. QL_ENOTSUP when the driver has no memory IPC.
   *
   * linear_dev runs im, one of this backend's own QL_OP_LINEAR_WO / _AQ
   * implementations, on device tensors (ql_linear_dev_args), when
   * linear_dev_supports(im) says it can (non-zero); else QL_ENOTSUP. The
   * generic implementations read host memory only.
   */
  size_t ipc_handle_bytes;
  int (*ipc_open)(int ordinal, const void *handle, size_t len, void **base,
                  uint64_t *size);
  int (*ipc_open_fd)(int ordinal, int fd, const void *handle, size_t len,
                     void **base, uint64_t *size);
  int (*ipc_close)(int ordinal, void *base);
  int (*ipc_event_open)(int ordinal, const void *handle, size_t len,
                        void **ev);
  void (*ipc_event_close)(int ordinal, void *ev);
  int (*linear_dev_supports)(const ql_kernel_impl *im);
  int (*linear_dev)(const ql_kernel_impl *im, const ql_linear_dev_args *a);
  /*
   * Optional, together (NULL for a backend without them): host memory
   * that the devices' copy engines reach directly. host_register(p, len)
   * page-locks [p, p + len), memory the caller owns, has mapped read-write
   * and keeps mapped; from then on the backend's linear ops read an x and
   * write a y lying wholly inside it directly, without staging copies of
   * their own. The memory stays the caller's. 0, or QL_EINVAL (p NULL,
   * len 0, a range that overlaps one registered already), QL_ENOMEM,
   * QL_EDEVICE (no device in service could do it), QL_ENOTSUP: a failure
   * costs only speed, the ops then stage as before. host_unregister(p)
   * undoes a successful host_register of the same p; the caller calls it
   * before unmapping the memory, once no op in flight uses it. Callable
   * from any thread.
   */
  int (*host_register)(void *p, size_t len);
  void (*host_unregister)(void *p);
  /* 1 when its own linear implementations (not the generic ones) honour
   * ql_linear_args.part: a long launch on its devices can stop for more
   * urgent work and go on later. */
  int linear_parts;
  /*
   * Optional (NULL: no mapped mode): exports the layout packed, made by
   * this backend's repack, for another process to map read-only and run
   * the same kernels on (ql_layout_export). Callable from the loop thread
   * while the layout lives; the memory stays the layout's, and a mapping
   * keeps it alive in the driver until the importer unmaps it. 0,
   * QL_ENOTSUP (the layout was not made exportable: an old driver, or
   * QL_CUDA_VMM=0), QL_EEXHAUSTED (out of descriptors), QL_EDEVICE.
   */
  int (*export_layout)(const void *packed, ql_layout_export *out);
} ql_backend;


/* Bits for ql_kernel_impl.formats and .dtypes. */
#define QL_FMT_BIT(f) (1u << (unsigned)(f))
#define QL_DT_BIT(d) (1u << (unsigned)(d))
#define QL_ALL_FORMATS                                                         \
  (QL_FMT_BIT(QL_FORMAT_Q4G) | QL_FMT_BIT(QL_FORMAT_Q8C) |                     \
   QL_FMT_BIT(QL_FORMAT_Q8B) | QL_FMT_BIT(QL_FORMAT_F8R))
#define QL_ALL_DTYPES                                                          \
  (QL_DT_BIT(QL_DTYPE_F32) | QL_DT_BIT(QL_DTYPE_F16) | QL_DT_BIT(QL_DTYPE_BF16))

/*
 * Checks an implementation table: every entry names a known op, sets the
 * function its op needs (and free_packed for repack), and a name. Returns
 * 0 or QL_EINVAL. The built-in backends are checked when the registry is
 * first used; a test registering its own backend calls this directly.
 */
int ql_backend_check(const ql_backend *b);

/* The backends built into this library, in priority order; generic is not
 * among them. */
const ql_backend *const *ql_backends(size_t *count);

/* The backend called name, or NULL. */
const ql_backend *ql_backend_find(const char *name);

/* The generic implementation of op, for every format and dtype. */
const ql_kernel_impl *ql_generic_impl(ql_op op);

/*
 * Chooses the implementation of op for (format, activation dtype, m, n,
 * k): the first of backend b's own that handles the format and dtype and
 * whose supports() accepts the shape, else the generic one when it does.
 * b may be NULL (generic only). NULL when nothing can run the case: the
 * generic AQ declines q8b (a weight-only format) and q8c with K over
 * QL_AQ_Q8C_MAX_K; callers then fall back to weight-only or refuse.
 */
const ql_kernel_impl *ql_dispatch(const ql_backend *b, ql_op op, ql_format f,
                                  ql_dtype dt, int64_t m, int64_t n,
                                  int64_t k);

/*
 * y = x·Wᵀ + b for m rows on backend b's implementation of op
 * (QL_OP_LINEAR_WO or QL_OP_LINEAR_AQ): the generic op reads the canonical
 * w, a backend's own reads packed, the layout its repack made (NULL when
 * it made none). *impl (may be NULL) is set to the implementation's name.
 * QL_ENOTSUP when nothing can run it; otherwise what the op returns.
 */
int ql_run_linear(const ql_backend *b, ql_op op, const ql_qweight *w,
                  const void *packed, ql_dtype dt, const void *x, int64_t m,
                  void *y, const char **impl);

/*
 * ql_run_linear() as one call of a launch in parts (ql_linear_part): with
 * an implementation that cannot stop, the whole launch runs in this call
 * (part->done 1). On failure part->state is NULL (freed).
 */
int ql_run_linear_part(const ql_backend *b, ql_op op, const ql_qweight *w,
                       const void *packed, ql_dtype dt, const void *x,
                       int64_t m, void *y, ql_linear_part *part,
                       const char **impl);

/*
 * The implementation of op for the case on device tensors: the first of
 * b's own that b can run on them (linear_dev_supports) and that handles
 * the case as ql_dispatch() asks it; else NULL (never a generic one).
 * Implementations that dispatch chooses between by the row count give the
 * same bytes (DESIGN §4, batch invariance), so one passed over for
 * reading host memory only changes no result.
 */
const ql_kernel_impl *ql_dispatch_dev(const ql_backend *b, ql_op op,
                                      ql_format f, ql_dtype dt, int64_t m,
                                      int64_t n, int64_t k);

/*
 * The same on device tensors (ql_linear_dev_args): runs b's linear_dev on
 * the implementation of ql_dispatch_dev(). QL_ENOTSUP (and *impl NULL)
 * when there is none (the generic implementations read host memory only).
 */
int ql_run_linear_dev(const ql_backend *b, ql_op op,
                      const ql_linear_dev_args *a, const char **impl);

#ifdef __cplusplus
}
#endif
#endif /* QL_REGISTRY_H */
