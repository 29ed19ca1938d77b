/* registry.c - see registry.h. */
#include <string.h>

#include "registry.h"

/* ---------------------------------------------- generic implementations */

static int generic_wo(const ql_linear_args *a) {
  return ql_linear_wo_ref(a->w, a->dt, a->x, a->m, a->y);
}

static int generic_aq(const ql_linear_args *a) {
  return ql_linear_aq_ref(a->w, a->dt, a->x, a->m, a->y);
}

/* int8 AQ accumulates in int32: q8c declines K past the bound (q8b is
 * weight-only and not in the format mask at all). */
static int generic_aq_supports(const ql_kernel_impl *im, ql_format f,
                               int64_t m, int64_t n, int64_t k) {
  (void)im;
  (void)m;
  (void)n;
  return f != QL_FORMAT_Q8C || k <= QL_AQ_Q8C_MAX_K;
}

static int generic_qrows(const ql_qrows_args *a) {
  ql_dtype src = (int)a->src == 0 ? QL_DTYPE_F32 : a->src;

  switch (a->kind) {
  case QL_QROWS_I8:
    return ql_quantize_rows_i8_src(src, a->x, a->m, a->k, a->gs, a->xq, a->sx,
                                   a->gsum);
  case QL_QROWS_E4M3:
    if (a->gsum != NULL)
      return QL_EINVAL;
    return ql_quantize_rows_e4m3_src(src, a->x, a->m, a->k, a->xq, a->sx);
  }
  return QL_EINVAL;
}

/* The canonical form is the generic layout: nothing to repack. */
static int generic_repack(ql_repack_args *a) {
  a->packed = NULL;
  a->packed_bytes = 0;
  return 0;
}

static void generic_free_packed(void *p) { (void)p; }

static const ql_kernel_impl generic[QL_OP_COUNT] = {
    [QL_OP_QUANTIZE_ROWS] = {.name = "generic.quantize_rows",
                             .op = QL_OP_QUANTIZE_ROWS,
                             .formats = QL_ALL_FORMATS,
                             .dtypes = QL_ALL_DTYPES,
                             .fn.quantize_rows = generic_qrows},
    [QL_OP_LINEAR_WO] = {.name = "generic.linear_wo",
                         .op = QL_OP_LINEAR_WO,
                         .formats = QL_ALL_FORMATS,
                         .dtypes = QL_ALL_DTYPES,
                         .fn.linear = generic_wo},
    [QL_OP_LINEAR_AQ] = {.name = "generic.linear_aq",
                         .op = QL_OP_LINEAR_AQ,
                         .formats = QL_ALL_FORMATS & ~QL_FMT_BIT(QL_FORMAT_Q8B),
                         .dtypes = QL_ALL_DTYPES,
                         .supports = generic_aq_supports,
                         .fn.linear = generic_aq},
    [QL_OP_REPACK] = {.name = "generic.repack",
                      .op = QL_OP_REPACK,
                      .formats = QL_ALL_FORMATS,
                      .dtypes = QL_ALL_DTYPES,
                      .fn.repack = generic_repack,
                      .free_packed = generic_free_packed},
};

const ql_kernel_impl *ql_generic_impl(ql_op op) {
  if ((unsigned)op >= QL_OP_COUNT)
    return NULL;
  return &generic[op];
}

/* ----------------------------------------------------------- dispatch */

int ql_backend_check(const ql_backend *b) {
  if (b == NULL || b->name == NULL || (b->n_impls > 0 && b->impls == NULL))
    return QL_EINVAL;
  /* Devices come as a set: count, describe and bind, or none of them. */
  if ((b->device_count != NULL) != (b->device_info != NULL) ||
      (b->device_count != NULL) != (b->device_bind != NULL))
    return QL_EINVAL;
  /* IPC imports likewise: ipc_open with the event ops (handles as bytes)
   * or ipc_open_fd (handles with a descriptor), then ipc_close, the
   * device linear ops and a handle size; or none of them. */
  {
    int n_bytes = (b->ipc_open != NULL) + (b->ipc_event_open != NULL) +
                  (b->ipc_event_close != NULL);
    int n_dev = (b->ipc_close != NULL) + (b->linear_dev_supports != NULL) +
                (b->linear_dev != NULL);
    int with_fd = b->ipc_open_fd != NULL;
    int imports = n_bytes == 3 || with_fd;
    if ((n_bytes != 0 && n_bytes != 3) || (n_bytes == 3 && with_fd) ||
        n_dev != (imports ? 3 : 0) ||
        imports != (b->ipc_handle_bytes != 0))
      return QL_EINVAL;
  }
  /* Host registration: both or neither. */
  if ((b->host_register != NULL) != (b->host_unregister != NULL))
    return QL_EINVAL;
  for (size_t i = 0; i < b->n_impls; i++) {
    const ql_kernel_impl *im = &b->impls[i];
    if (im->name == NULL || (unsigned)im->op >= QL_OP_COUNT)
      return QL_EINVAL;
    int has_fn = im->op == QL_OP_QUANTIZE_ROWS ? im->fn.quantize_rows != NULL
                 : im->op == QL_OP_REPACK
                     ? im->fn.repack != NULL && im->free_packed != NULL
                     : im->fn.linear != NULL;
    if (!has_fn || (im->formats & ~QL_ALL_FORMATS) ||
        (im->dtypes & ~QL_ALL_DTYPES))
      return QL_EINVAL;
  }
  return 0;
}

/* True when im handles format f, dtype dt and the shape. */
static int handles(const ql_kernel_impl *im, ql_format f, ql_dtype dt,
                   int64_t m, int64_t n, int64_t k) {
  return (im->formats & QL_FMT_BIT(f)) && (im->dtypes & QL_DT_BIT(dt)) &&
         (im->supports == NULL || im->supports(im, f, m, n, k));
}

const ql_kernel_impl *ql_dispatch(const ql_backend *b, ql_op op, ql_format f,
                                  ql_dtype dt, int64_t m, int64_t n,
                                  int64_t k) {
  if ((unsigned)op >= QL_OP_COUNT)
    return NULL;
  for (size_t i = 0; b != NULL && i < b->n_impls; i++) {
    const ql_kernel_impl *im = &b->impls[i];
    if (im->op == op && handles(im, f, dt, m, n, k))
      return im;
  }
  return handles(&generic[op], f, dt, m, n, k) ? &generic[op] : NULL;
}

int ql_run_linear(const ql_backend *b, ql_op op, const ql_qweight *w,
                  const void *packed, ql_dtype dt, const void *x, int64_t m,
                  void *y, const char **impl) {
  const ql_kernel_impl *im = ql_dispatch(b, op, w->format, dt, m, w->n, w->k);
  if (impl != NULL)
    *impl = im != NULL ? im->name : NULL;
  if (im == NULL ||
      (op != QL_OP_LINEAR_WO && op != QL_OP_LINEAR_AQ))
    return QL_ENOTSUP;
  ql_linear_args a = {w, im == ql_generic_impl(op) ? NULL : packed, dt, x, m,
                      y, NULL};
  return im->fn.linear(&a);
}

int ql_run_linear_part(const ql_backend *b, ql_op op, const ql_qweight *w,
                       const void *packed, ql_dtype dt, const void *x,
                       int64_t m, void *y, ql_linear_part *part,
                       const char **impl) {
  const ql_kernel_impl *im = ql_dispatch(b, op, w->format, dt, m, w->n, w->k);
  int rc;
  if (impl != NULL)
    *impl = im != NULL ? im->name : NULL;
  if (im == NULL || (op != QL_OP_LINEAR_WO && op != QL_OP_LINEAR_AQ)) {
    rc = QL_ENOTSUP;
    goto fail;
  }
  if (part == NULL || !im->parts) {
    if (part != NULL && part->state != NULL) {
      /* Only an implementation with parts stops. */
      rc = QL_EINVAL;
      goto fail;
    }
    ql_linear_args a = {w, im == ql_generic_impl(op) ? NULL : packed, dt, x, m,
                        y, NULL};
    rc = im->fn.linear(&a);
    if (rc != 0)
      goto fail;
    if (part != NULL)
      part->done = 1;
    return 0;
  }
  ql_linear_args a = {w, packed, dt, x, m, y, part};
  return im->fn.linear(&a);
fail:
  if (part != NULL && part->state != NULL) {
    part->state_free(part->state);
    part->state = NULL;
  }
  return rc;
}

const ql_kernel_impl *ql_dispatch_dev(const ql_backend *b, ql_op op,
                                      ql_format f, ql_dtype dt, int64_t m,
                                      int64_t n, int64_t k) {
  if (b == NULL || b->linear_dev == NULL ||
      (op != QL_OP_LINEAR_WO && op != QL_OP_LINEAR_AQ))
    return NULL;
  /* ql_dispatch()'s order without the host-only implementations: one
   * that stages host tensors (CUDA's q8c on cuBLASLt, from some rows)
   * leaves the case to the next, with the same bytes, instead of refusing
   * it. linear_dev_supports first: a host-only one is not even asked
   * (its supports() may set up a library). */
  for (size_t i = 0; i < b->n_impls; i++) {
    const ql_kernel_impl *im = &b->impls[i];
    if (im->op == op && b->linear_dev_supports(im) &&
        handles(im, f, dt, m, n, k))
      return im;
  }
  return NULL;
}

int ql_run_linear_dev(const ql_backend *b, ql_op op,
                      const ql_linear_dev_args *a, const char **impl) {
  const ql_kernel_impl *im;
  if (impl != NULL)
    *impl = NULL;
  if (a == NULL || a->a.w == NULL)
    return QL_EINVAL;
  im = ql_dispatch_dev(b, op, a->a.w->format, a->a.dt, a->a.m, a->a.w->n,
                       a->a.w->k);
  if (im == NULL)
    return QL_ENOTSUP;
  if (impl != NULL)
    *impl = im->name;
  return b->linear_dev(im, a);
}
