/* admit.c - see linear_impl.h: Linear and LinearMulti requests taken in:
 * their tensors, device and path, and their queueing. */
#include <stdio.h>
#include <stdlib.h>

#include "dispatch/linear_impl.h"
#include "wire/route.h"

/* ------------------------------------------------------------ arrival */

/*
 * How one weight's computation on x is admitted (submit_one): the
 * request's tensors are described once (tensor_ref) and resolved where
 * they live; then the device, the shape, the path and the budgets are
 * checked, each step returning 0 or the QL_E* code it also wrote into the
 * reply with its message; make_job queues what passed.
 */

/* Sets r's error and is code: a refusal is one statement. */
#define REFUSE(r, code, ...) (ql__reply_set_error((r), (code), __VA_ARGS__), (code))

/* Where one tensor of a request is. */
typedef enum tensor_kind {
  IN_MESSAGE, /* x inline in the request, or y inline in the reply */
  IN_REGION,  /* a slice of one of the session's shared-memory regions */
  IN_CUDA,    /* a slice of a CUDA allocation, by IPC handle */
  IN_ZE,      /* a slice of a Level Zero import of the session's */
} tensor_kind;

/* One tensor of a request, described once from the message
 * (describe_tensors) and then resolved (resolve_tensor). */
typedef struct tensor_ref {
  tensor_kind kind;
  const char *what;        /* its name in errors: "x", "y_out", ... */
  uint64_t offset, length; /* the slice (not IN_MESSAGE) */
  uint64_t id;             /* the region (IN_REGION) or import (IN_ZE) */
  const Qlinear__V1__CudaIpcSlice *cuda; /* IN_CUDA: handle, device, event */
  ql__region *region;      /* IN_REGION once resolved (no reference) */
  ql__ipc_mem *mem;        /* IN_CUDA, IN_ZE once resolved (no reference) */
} tensor_ref;

/* One weight's computation on x, as the request states it: a Linear
 * request (mu NULL) or part index of a LinearMulti (mu). */
typedef struct linear_call {
  ql__request *req;
  void *route;
  multi *mu;
  unsigned index;
  const char *weight;
  const Qlinear__V1__Tensor *x;
  ql_path want; /* the request's path */
  const Qlinear__V1__RegionSlice *ys; /* at most one of the three y's */
  const Qlinear__V1__CudaIpcSlice *yc;
  const Qlinear__V1__ZeIpcSlice *yz;
  const char *device; /* the request's device ("" for any) */
} linear_call;

/* What admission decides for a call, step by step. */
typedef struct linear_plan {
  ql__weight *w;
  tensor_ref x, y;
  ql__device *ipc_dev; /* the device of its device tensors, or NULL */
  const char *device;  /* the device asked for, or ipc_dev's */
  uint64_t holders;    /* the devices in service that hold w */
  int on;              /* its device (index), or -1: the scheduler's */
  uint64_t m;          /* rows of x */
  ql_dtype dt;
  size_t esz, y_bytes;
  ql_path path;
  size_t cost;         /* bytes counted against the queue budgets */
  ql__tenant *tenant;  /* the uid that counts it, or NULL */
} linear_plan;

/* The x and y of c as tagged descriptors, unresolved. */
static void describe_tensors(const linear_call *c, tensor_ref *x,
                             tensor_ref *y) {
  *x = (tensor_ref){.kind = IN_MESSAGE, .what = "x"};
  *y = (tensor_ref){.kind = IN_MESSAGE, .what = "y"};
  const Qlinear__V1__Tensor *t = c->x;
  if (t->data_case == QLINEAR__V1__TENSOR__DATA_REGION)
    *x = (tensor_ref){IN_REGION, "x", t->region->offset, t->region->length,
                      t->region->region_id, NULL, NULL, NULL};
  else if (t->data_case == QLINEAR__V1__TENSOR__DATA_CUDA_IPC)
    *x = (tensor_ref){IN_CUDA, "x", t->cuda_ipc->offset,
                      t->cuda_ipc->length, 0, t->cuda_ipc, NULL, NULL};
  else if (t->data_case == QLINEAR__V1__TENSOR__DATA_ZE_IPC)
    *x = (tensor_ref){IN_ZE, "x", t->ze_ipc->offset, t->ze_ipc->length,
                      t->ze_ipc->import_id, NULL, NULL, NULL};
  if (c->ys != NULL)
    *y = (tensor_ref){IN_REGION, "y_out", c->ys->offset, c->ys->length,
                      c->ys->region_id, NULL, NULL, NULL};
  else if (c->yc != NULL)
    *y = (tensor_ref){IN_CUDA, "y_out_cuda", c->yc->offset, c->yc->length,
                      0, c->yc, NULL, NULL};
  else if (c->yz != NULL)
    *y = (tensor_ref){IN_ZE, "y_out_ze", c->yz->offset, c->yz->length,
                      c->yz->import_id, NULL, NULL, NULL};
}

static int on_device(const tensor_ref *t) {
  return t->kind == IN_CUDA || t->kind == IN_ZE;
}

/*
 * Resolves t: finds its region or import (a CUDA import is opened on dev
 * at its first use) and checks that the slice is inside its real size the
 * only safe way, off <= size && len <= size - off (protocol.c has already
 * checked its alignment and, for x, its length). keep: the import of the
 * request's other tensor (or NULL), which the request holds no reference
 * to yet and a full table must not let go of. Another session's import or
 * region is not in this one's tables: not found.
 */
static int resolve_tensor(ql__session *ss, const ql__device *dev,
                          tensor_ref *t, const ql__ipc_mem *keep,
                          ql__reply *r) {
  uint64_t size;
  const char *of;
  if (t->kind == IN_MESSAGE)
    return 0;
  if (t->kind == IN_REGION) {
    if ((t->region = ql__session_region(ss, t->id)) == NULL)
      return REFUSE(r, QL_ENOTFOUND, "linear: %s: the session has no region "
                    "%llu", t->what, (unsigned long long)t->id);
    size = t->region->size;
    of = "region";
  } else if (t->kind == IN_ZE) {
    if ((t->mem = ql__ipc_find(*ql__session_ipc(ss), t->id)) == NULL)
      return REFUSE(r, QL_ENOTFOUND, "linear: %s: the session has no Level "
                    "Zero import %llu", t->what, (unsigned long long)t->id);
    size = t->mem->size;
    of = "Level Zero allocation";
  } else {
    char err[256];
    int rc = ql__ipc_get(ql__session_ipc(ss), dev, ql__session_id(ss),
                         t->cuda->mem_handle.data, t->cuda->mem_handle.len,
                         keep, &t->mem, err, sizeof err);
    if (rc != 0)
      return REFUSE(r, rc, "linear: %s: %s", t->what, err);
    size = t->mem->size;
    of = "CUDA allocation";
  }
  if (ql__slice_valid(t->offset, t->length, size))
    return 0;
  if (t->kind == IN_REGION)
    return REFUSE(r, QL_EINVAL, "linear: %s: %llu bytes at offset %llu do "
                  "not fit region %llu of %llu bytes", t->what,
                  (unsigned long long)t->length,
                  (unsigned long long)t->offset, (unsigned long long)t->id,
                  (unsigned long long)size);
  return REFUSE(r, QL_EINVAL, "linear: %s: %llu bytes at offset %llu do not "
                "fit the %s of %llu bytes", t->what,
                (unsigned long long)t->length, (unsigned long long)t->offset,
                of, (unsigned long long)size);
}

/* The memory of a resolved tensor at its offset (NULL: IN_MESSAGE). */
static uint8_t *tensor_base(const tensor_ref *t) {
  if (t->region != NULL)
    return t->region->base + t->offset;
  if (t->mem != NULL)
    return (uint8_t *)t->mem->base + t->offset;
  return NULL;
}

/*
 * The device of a request's device tensors, from where x's (dx) and y's
 * (dy) memory is, either NULL: one device, and the request's own when it
 * names one (asked), since an allocation is mapped on the device it lives
 * on and its request runs there. kind and ywhat name the tensors in
 * errors.
 */
static int one_device(ql__server *s, ql__device *dx, ql__device *dy,
                      const char *asked, const char *kind, const char *ywhat,
                      ql__device **out, ql__reply *r) {
  if (dx != NULL && dy != NULL && dx != dy)
    return REFUSE(r, QL_EINVAL, "linear: x is in the memory of %s, %s in "
                  "that of %s: a request runs on one device", dx->alias,
                  ywhat, dy->alias);
  ql__device *d = dx != NULL ? dx : dy;
  if (asked[0] != '\0' && ql__device_find(s, asked) != d)
    return REFUSE(r, QL_EINVAL, "linear: the request asks for device "
                  "'%.64s', its %s tensors are in the memory of %s", asked,
                  kind, d->alias);
  *out = d;
  return 0;
}

/*
 * The device of the request's device tensors (p->ipc_dev, which then
 * becomes p->device; NULL when it has none). Level Zero tensors name
 * imports of the session's, resolved here, whose device they are on; CUDA
 * IPC tensors name their device, which must take imports.
 */
static int tensor_device(ql__server *s, ql__session *ss, linear_plan *p,
                         ql__reply *r) {
  tensor_ref *x = &p->x, *y = &p->y;
  ql__device *dx = NULL, *dy = NULL;
  int rc = 0;
  int cuda = x->kind == IN_CUDA || y->kind == IN_CUDA;
  int ze = x->kind == IN_ZE || y->kind == IN_ZE;
  if (cuda && ze)
    return REFUSE(r, QL_EINVAL, "linear: CUDA and Level Zero IPC tensors in "
                  "one request");
  if (ze) {
    if ((x->kind == IN_ZE && (rc = resolve_tensor(ss, NULL, x, NULL, r))) ||
        (y->kind == IN_ZE && (rc = resolve_tensor(ss, NULL, y, NULL, r))))
      return rc;
    if ((rc = one_device(s, x->mem ? &s->dev[x->mem->dev->index] : NULL,
                         y->mem ? &s->dev[y->mem->dev->index] : NULL,
                         p->device, "Level Zero", "y_out_ze", &p->ipc_dev,
                         r)) != 0)
      return rc;
  } else if (cuda) {
    if (x->kind == IN_CUDA &&
        (dx = ql__device_find(s, x->cuda->device)) == NULL)
      return REFUSE(r, QL_ENOTFOUND, "linear: x: no device '%.64s'",
                    x->cuda->device);
    if (y->kind == IN_CUDA &&
        (dy = ql__device_find(s, y->cuda->device)) == NULL)
      return REFUSE(r, QL_ENOTFOUND, "linear: y_out_cuda: no device "
                    "'%.64s'", y->cuda->device);
    if ((rc = one_device(s, dx, dy, p->device, "CUDA IPC", "y_out_cuda",
                         &p->ipc_dev, r)) != 0)
      return rc;
    if (p->ipc_dev->b->ipc_open == NULL)
      return REFUSE(r, QL_ENOTSUP, "linear: device %s takes no CUDA IPC "
                    "memory", p->ipc_dev->alias);
  }
  if (p->ipc_dev != NULL)
    p->device = p->ipc_dev->name;
  return 0;
}

/* The device: the one asked for, which must hold the weight and be in
 * service, else (p->on < 0) the scheduler's choice among those that do. */
static int choose_device(ql__server *s, linear_plan *p, ql__reply *r) {
  const ql__weight *w = p->w;
  char on_list[256];
  p->holders = w->devices & ~ql__devices_failed(s);
  p->on = -1;
  if (p->device[0] != '\0') {
    const ql__device *d = ql__device_find(s, p->device);
    if (d == NULL || !(w->devices >> d->index & 1)) {
      ql__devices_list(s, w->devices, on_list, sizeof on_list);
      return REFUSE(r, QL_ENOTFOUND, "linear: no device '%.64s' holds "
                    "weight '%s' (it is on: %s)", p->device, w->name,
                    on_list);
    }
    if (d->failed)
      return REFUSE(r, QL_EDEVICE, "linear: device %s is out of service",
                    d->alias);
    p->on = (int)d->index;
  } else if (p->holders == 0) {
    ql__devices_list(s, w->devices, on_list, sizeof on_list);
    return REFUSE(r, QL_EDEVICE, "linear: every device that holds weight "
                  "'%s' is out of service (%s)", w->name, on_list);
  }
  return 0;
}

/* x against the weight: K, the rows, and the result's bytes, which an
 * inline y must fit in one reply (a region takes any size). */
static int check_shape(const ql__server *s, const linear_call *c,
                       linear_plan *p, ql__reply *r) {
  const ql__weight *w = p->w;
  uint64_t k = c->x->shape[1];
  p->m = c->x->shape[0];
  if (k != (uint64_t)w->q->k)
    return REFUSE(r, QL_ESHAPE, "linear: x has K=%llu, weight '%s' has "
                  "K=%lld", (unsigned long long)k, w->name,
                  (long long)w->q->k);
  if (p->m > UINT32_MAX)
    return REFUSE(r, QL_ESHAPE, "linear: %llu rows are too many",
                  (unsigned long long)p->m);
  p->dt = (ql_dtype)c->x->dtype;
  p->esz = ql_dtype_size(p->dt);
  if (ql__mul_size(p->m, (size_t)w->q->n, p->esz, &p->y_bytes) != 0)
    return REFUSE(r, QL_ESHAPE, "linear: the [%llu,%lld] result overflows",
                  (unsigned long long)p->m, (long long)w->q->n);
  if (p->y.kind == IN_MESSAGE &&
      p->y_bytes > s->cfg.max_message_bytes - QL_ENVELOPE_BYTES)
    return REFUSE(r, QL_ETOOBIG, "linear: the [%llu,%lld] result exceeds "
                  "the %zu-byte message cap", (unsigned long long)p->m,
                  (long long)w->q->n, s->cfg.max_message_bytes);
  return 0;
}

/*
 * Resolves what tensor_device left (regions, CUDA imports), then checks
 * what does not depend on where y is: it holds exactly the [m, n] result,
 * and, when x is in the same region or allocation, the two do not
 * overlap. Both slices were checked to be inside that memory, so the sums
 * cannot wrap.
 */
static int resolve_tensors(ql__session *ss, linear_plan *p, ql__reply *r) {
  tensor_ref *x = &p->x, *y = &p->y;
  int rc = 0;
  if ((x->region == NULL && x->mem == NULL &&
       (rc = resolve_tensor(ss, p->ipc_dev, x, NULL, r)) != 0) ||
      (y->region == NULL && y->mem == NULL &&
       (rc = resolve_tensor(ss, p->ipc_dev, y, x->mem, r)) != 0))
    return rc;
  if (y->kind == IN_MESSAGE)
    return 0;
  if (y->length != p->y_bytes)
    return REFUSE(r, QL_ESHAPE, "linear: the %s slice holds %llu bytes, "
                  "[%llu,%lld] of %zu-byte elements needs %zu", y->what,
                  (unsigned long long)y->length, (unsigned long long)p->m,
                  (long long)p->w->q->n, p->esz, p->y_bytes);
  int same = x->kind == y->kind &&
             (x->region != NULL ? x->region == y->region : x->mem == y->mem);
  if (same && x->offset < y->offset + y->length &&
      y->offset < x->offset + x->length)
    return REFUSE(r, QL_EINVAL, "linear: the x and %s slices overlap",
                  y->what);
  return 0;
}

/* The crossover AUTO requests of w use on device dev (dev < 0: the first
 * that holds it), under the config's fixed and default values. */
static uint32_t crossover_rows(const ql__server *s, const ql__weight *w,
                               int dev, int *measured) {
  return ql__weight_crossover_rows(w, dev, s->cfg.crossover_rows,
                                   s->cfg.crossover_default_rows, measured);
}

/*
 * The path of an AUTO request of m rows on w (DESIGN §6): weight-only
 * below the crossover of the device it runs on, else activation-quantized.
 * With no device named (*on < 0) and the holders in service (holders)
 * disagreeing for m rows, the request is placed here, on the holder with
 * the least work queued (the lowest index on a tie), so that the path
 * follows the device's own crossover; otherwise the scheduler places it.
 */
static ql_path auto_path(const ql__server *s, ql__weight *w,
                         uint64_t holders, uint64_t m, int *on) {
  /* The crossovers consulted stay what they are now (weights.h,
   * crossover_used) unless the config fixes them. */
  if (s->cfg.crossover_rows == 0)
    w->crossover_used |= *on >= 0 ? (uint64_t)1 << *on : holders;
  if (*on >= 0)
    return m < crossover_rows(s, w, *on, NULL) ? QL_PATH_WEIGHT_ONLY
                                               : QL_PATH_ACT_QUANT;
  int aq = 0, wo = 0, best = -1;
  uint64_t best_load = 0;
  for (unsigned d = 0; d < s->n_dev; d++) {
    if (!(holders >> d & 1))
      continue;
    if (m < crossover_rows(s, w, (int)d, NULL))
      wo = 1;
    else
      aq = 1;
    uint64_t load = ql__sched_device_load(s->lin->sched, d);
    if (best < 0 || load < best_load) {
      best = (int)d;
      best_load = load;
    }
  }
  if (aq && wo) {
    *on = best;
    return m < crossover_rows(s, w, best, NULL) ? QL_PATH_WEIGHT_ONLY
                                                : QL_PATH_ACT_QUANT;
  }
  return aq ? QL_PATH_ACT_QUANT : QL_PATH_WEIGHT_ONLY;
}

/*
 * The path: the request's own choice, else the weight's policy, else by
 * the request's own row count (DESIGN §6), never by what it is batched
 * with: that keeps its reply reproducible. Where no implementation can
 * run the activation-quantized path (q8b is weight-only; int8 AQ
 * accumulates in int32, which bounds K for q8c), a chosen path falls back
 * to weight-only and a forced one is refused. Device tensors need an
 * implementation of the device's own that reads them where they are
 * (linear_dev); AQ without one falls back the same way.
 */
static int choose_path(ql__server *s, ql_path want, linear_plan *p,
                       ql__reply *r) {
  ql__weight *w = p->w;
  int64_t m = (int64_t)p->m;
  ql_path path = want;
  if (path == QL_PATH_AUTO)
    path = w->policy;
  if (path == QL_PATH_AUTO)
    path = auto_path(s, w, p->holders, p->m, &p->on);
  if (path == QL_PATH_ACT_QUANT &&
      ql__lin_kernel(p->on >= 0 ? s->dev[p->on].b : NULL, w->q,
                     QL_PATH_ACT_QUANT, p->dt, m) == NULL) {
    if (want == QL_PATH_ACT_QUANT)
      return REFUSE(r, QL_ENOTSUP, "linear: %s weight '%s' (K=%lld) has no "
                    "activation-quantized path",
                    ql__format_name(w->q->format), w->name,
                    (long long)w->q->k);
    path = QL_PATH_WEIGHT_ONLY;
  }
  if (p->ipc_dev != NULL) {
    const ql_kernel_impl *im =
        ql__lin_kernel_dev(p->ipc_dev->b, w->q, path, p->dt, m);
    if (im == NULL && path == QL_PATH_ACT_QUANT &&
        want != QL_PATH_ACT_QUANT) {
      path = QL_PATH_WEIGHT_ONLY;
      im = ql__lin_kernel_dev(p->ipc_dev->b, w->q, path, p->dt, m);
    }
    if (im == NULL)
      return REFUSE(r, QL_ENOTSUP, "linear: no %s kernel of %s reads device "
                    "memory for %s weight '%s'",
                    path == QL_PATH_ACT_QUANT ? "activation-quantized"
                                              : "weight-only",
                    p->ipc_dev->alias, ql__format_name(w->q->format),
                    w->name);
  }
  p->path = path;
  return 0;
}

/* The pages of a region tensor are populated (ql__region_populated):
 * checked after every other check of the slice. */
static int check_populated(const tensor_ref *t, ql__reply *r) {
  if (t->region == NULL ||
      ql__region_populated(t->region, t->offset, t->length))
    return 0;
  return REFUSE(r, QL_EINVAL, "linear: %s: region %llu has pages in "
                "[%llu, +%llu) its client never wrote (or that are swapped "
                "out): the daemon does not fault in a client's memory; write "
                "them first (libqlinear populates the regions it makes)",
                t->what, (unsigned long long)t->region->id,
                (unsigned long long)t->offset, (unsigned long long)t->length);
}

/*
 * The queue budgets. Waiting requests hold their inline x and their
 * inline y: bound both (region and device memory are the session's and
 * bounded there), in all and, while other users are connected, per user.
 */
static int check_budget(ql__server *s, ql__session *ss,
                        const linear_call *c, linear_plan *p, ql__reply *r) {
  p->cost = (p->x.kind == IN_MESSAGE ? c->x->inline_data.len : 0) +
            (p->y.kind == IN_MESSAGE ? p->y_bytes : 0);
  /* (A reload may have set the bound below what is queued already.) */
  if (s->queued_bytes > s->cfg.max_queued_bytes ||
      p->cost > s->cfg.max_queued_bytes - s->queued_bytes)
    return REFUSE(r, QL_EEXHAUSTED, "linear: %zu bytes of requests are "
                  "already queued", s->queued_bytes);
  ql__tenant *tn = ss != NULL ? ql__session_tenant(ss) : NULL;
  p->tenant = tn;
  if (tn == NULL || s->tenants.active < 2)
    return 0;
  size_t share_b = ql__tenant_share(s->cfg.max_queued_bytes,
                                    s->cfg.uid_share);
  size_t share_j = ql__tenant_share(s->cfg.max_queue, s->cfg.uid_share);
  if (tn->queued_jobs < share_j && tn->queued_bytes <= share_b &&
      p->cost <= share_b - tn->queued_bytes)
    return 0;
  ql__tenant_refused(&s->tenants, tn->uid, "the request queues");
  return REFUSE(r, QL_EEXHAUSTED, "linear: uid %u has %zu requests (%zu "
                "bytes) queued, its share (uid_share = %u%% of max_queue and "
                "max_queued_bytes) while other users are connected",
                (unsigned)tn->uid, tn->queued_jobs, tn->queued_bytes,
                (unsigned)s->cfg.uid_share);
}

/*
 * Makes the job of an admitted plan and queues it. The ready event is
 * opened per request (it is recorded anew for each x) and first here, so
 * that nothing can fail with it open but the queueing. On success the job
 * holds its references and, for a Linear request, owns req and route.
 */
static int make_job(ql__server *s, ql__session *ss, const linear_call *c,
                    linear_plan *p, ql__reply *r) {
  const Qlinear__V1__CudaIpcSlice *xc = p->x.cuda;
  ql__device *dev = p->ipc_dev;
  ql__weight *w = p->w;
  void *ready = NULL;
  uint64_t now = ql__now_ns();
  if (xc != NULL && xc->ready_event.len != 0) {
    int erc = dev->b->ipc_event_open(dev->ordinal, xc->ready_event.data,
                                     xc->ready_event.len, &ready);
    if (erc != 0)
      return REFUSE(r, erc, "linear: x: device %s cannot open the ready "
                    "event handle%s", dev->alias,
                    erc == QL_EINVAL ? " (not an interprocess event of a "
                                       "live process)" : "");
  }
  int y_ours = p->y.kind == IN_MESSAGE;
  lin_req *j = calloc(1, sizeof *j);
  if (j == NULL ||
      (y_ours && (j->y = malloc(p->y_bytes ? p->y_bytes : 1)) == NULL)) {
    free(j);
    if (ready != NULL)
      dev->b->ipc_event_close(dev->ordinal, ready);
    return REFUSE(r, QL_ENOMEM, "linear: out of memory");
  }
  j->s = s;
  j->parent = c->mu;
  j->index = c->index;
  if (c->mu == NULL) {
    j->route = c->route;
    j->req = c->req;
  }
  j->w = w;
  j->xr = p->x.region;
  j->yr = p->y.region;
  j->x = p->x.kind == IN_MESSAGE ? c->x->inline_data.data
                                 : tensor_base(&p->x);
  if (!y_ours)
    j->y = tensor_base(&p->y);
  j->where = (on_device(&p->x) ? QL_LINEAR_X_DEVICE : 0u) |
             (on_device(&p->y) ? QL_LINEAR_Y_DEVICE : 0u);
  j->x_row = (size_t)w->q->k * p->esz;
  j->y_row = (size_t)w->q->n * p->esz;
  j->y_bytes = p->y_bytes;
  j->cost = p->cost;
  j->dt = p->dt;
  j->path = p->path;
  j->sr.weight = &w->sched_key[key_index(p->dt, p->path)];
  j->sr.device = p->on;
  j->sr.holders = p->holders;
  j->sr.cls = p->m <= s->cfg.decode_max_rows ? QL_SCHED_DECODE
                                             : QL_SCHED_PREFILL;
  j->sr.rows = (uint32_t)p->m;
  j->sr.session = ql__session_id(ss);
  j->sr.tenant = (uint64_t)ql__session_uid(ss) + 1; /* a launch's fairness */
  /* A deadline past what the nanosecond clock can express (centuries) is
   * no deadline: computed naively it would wrap into the past. */
  uint64_t dl_ns = 0;
  if (c->req->msg->deadline_us != 0 &&
      (__builtin_mul_overflow(c->req->msg->deadline_us, (uint64_t)1000,
                              &dl_ns) ||
       __builtin_add_overflow(dl_ns, now, &dl_ns)))
    dl_ns = 0;
  j->sr.deadline_ns = dl_ns;
  int rc = ql__sched_submit(s->lin->sched, &j->sr, now);
  if (rc != 0) {
    if (y_ours)
      free(j->y);
    free(j);
    if (ready != NULL)
      dev->b->ipc_event_close(dev->ordinal, ready);
    if (rc == QL_EEXHAUSTED)
      return REFUSE(r, rc, "linear: the queue of '%s' is full, or the "
                    "session has %zu requests waiting", w->name,
                    ql__sched_session_count(s->lin->sched,
                                            ql__session_id(ss)));
    if (rc == QL_EDEADLINE)
      return REFUSE(r, rc, "linear: the deadline passed on arrival");
    return REFUSE(r, rc, "linear: %s", ql_strerror(rc));
  }
  ql__weight_ref(w);
  if (j->xr)
    ql__region_ref(j->xr);
  if (j->yr)
    ql__region_ref(j->yr);
  j->xm = p->x.mem;
  j->ym = p->y.mem;
  if (j->xm)
    ql__ipc_ref(j->xm);
  if (j->ym)
    ql__ipc_ref(j->ym);
  j->ready = ready;
  j->ready_dev = dev;
  s->queued_bytes += p->cost;
  if (p->tenant != NULL) {
    p->tenant->queued_bytes += p->cost;
    p->tenant->queued_jobs++;
    j->tenant = p->tenant;
  }
  s->lin->in_flight++;
  /* Deadlines are checked at every launch; while a long batch runs this
   * timer answers the expired ones on time. */
  if (j->sr.deadline_ns != 0 && !uv_is_active((uv_handle_t *)&s->lin->expire))
    uv_timer_start(&s->lin->expire, ql__lin_on_expire, 5, 5);
  ql__lin_pump(s);
  return 0;
}

/*
 * Checks and queues one weight's computation on x (c: a Linear request,
 * whose new job owns req and route, or part of a LinearMulti, whose multi
 * owns them). Returns 1 when queued, else 0 with r set.
 */
static int submit_one(ql__server *s, ql__session *ss, const linear_call *c,
                      ql__reply *r) {
  linear_plan p = {.device = c->device};
  if ((p.w = ql__weight_store_get(s->weights, c->weight)) == NULL) {
    ql__reply_set_error(r, QL_ENOTFOUND, "linear: no weight named '%s'",
                        c->weight);
    return 0;
  }
  describe_tensors(c, &p.x, &p.y);
  return tensor_device(s, ss, &p, r) == 0 && choose_device(s, &p, r) == 0 &&
         check_shape(s, c, &p, r) == 0 && resolve_tensors(ss, &p, r) == 0 &&
         choose_path(s, c->want, &p, r) == 0 &&
         check_populated(&p.x, r) == 0 && check_populated(&p.y, r) == 0 &&
         check_budget(s, ss, c, &p, r) == 0 && make_job(s, ss, c, &p, r) == 0;
}

int ql__linear_quota_waits(ql__server *s, ql__session *ss) {
  size_t quota = s->cfg.session_max_requests;
  return s->lin != NULL && quota != 0 &&
         atomic_load(&s->lin->early_done) <
             atomic_load(&s->lin->early_sent) &&
         ql__sched_session_count(s->lin->sched, ql__session_id(ss)) >= quota;
}

void ql__linear_resubmit(ql__server *s, ql__request *req, void *route,
                         uint64_t arg) {
  ql__session *ss = ql__session_by_id(s, arg);
  if (ss == NULL) { /* ended meanwhile: nobody to answer */
    ql__route_drop(route);
    ql__request_free(req);
    return;
  }
  if (s->stopping) {
    ql__reply_error(&s->replies, route, req->msg->request_id, QL_ESHUTDOWN,
                    "daemon is stopping");
    ql__request_free(req);
    return;
  }
  ql__reply r;
  ql__reply_init(&r, req->msg->request_id);
  int taken = req->msg->body_case == QLINEAR__V1__REQUEST__BODY_LINEAR
                  ? ql__linear_submit(s, ss, req, route, &r)
                  : ql__linear_submit_multi(s, ss, req, route, &r);
  if (taken)
    return; /* the job owns req and route now */
  ql__reply_send(&s->replies, route, &r);
  ql__request_free(req);
}

/* ------------------------------------------------ waiting for a crossover */

/* An AUTO request that waits for a crossover being measured. */
typedef struct xover_wait {
  ql__weight *w; /* one reference: the weight it waits on */
  ql__request *req;
  void *route;
  uint64_t session_id;
  struct xover_wait *next;
} xover_wait;

/*
 * Whether a request on weights names[0..n) with path want must wait
 * before it is routed: it leaves the path to the crossover, and the
 * crossover of one of those weights on a device that holds it is still
 * being measured (crossover_pending). It waits instead of being answered
 * by the default crossover and its repeat, moments later, by the measured
 * one: once a weight has answered, the same request gets the same bytes
 * (DESIGN §6, weights.h). Returns 1 when req waits (the wait owns req and
 * route then), 0 when it goes on, -1 when too many wait (r says so).
 */
static int crossover_waits(ql__server *s, ql__session *ss, ql__request *req,
                           void *route, char *const *names, size_t n,
                           ql_path want, ql__reply *r) {
  struct ql__linear_state *l = s->lin;
  ql__weight *w = NULL;
  if (want != QL_PATH_AUTO || s->cfg.crossover_rows != 0)
    return 0;
  for (size_t i = 0; i < n && w == NULL; i++) {
    ql__weight *c = ql__weight_store_get(s->weights, names[i]);
    if (c != NULL && c->policy == QL_PATH_AUTO &&
        (c->crossover_pending & c->devices) != 0)
      w = c;
  }
  if (w == NULL)
    return 0;
  xover_wait *x;
  if (l->n_xwaiting >= s->cfg.max_queue || (x = malloc(sizeof *x)) == NULL) {
    ql__reply_set_error(r, QL_EEXHAUSTED, "linear: weight '%s': %zu requests "
                        "already wait for its crossover to be measured; try "
                        "again", w->name, l->n_xwaiting);
    return -1;
  }
  ql__weight_ref(w);
  x->w = w;
  x->req = req;
  x->route = route;
  x->session_id = ql__session_id(ss);
  x->next = NULL;
  *l->xwaiting_tail = x;
  l->xwaiting_tail = &x->next;
  l->n_xwaiting++;
  return 1;
}

/* Points xwaiting_tail at the list's end again after removals. */
static void retail(struct ql__linear_state *l) {
  l->xwaiting_tail = &l->xwaiting;
  while (*l->xwaiting_tail != NULL)
    l->xwaiting_tail = &(*l->xwaiting_tail)->next;
}

void ql__linear_crossover_ready(ql__server *s, ql__weight *w) {
  struct ql__linear_state *l = s->lin;
  xover_wait *ready = NULL, **rt = &ready;
  if (l == NULL)
    return;
  /* Taken off first, in order: a request taken again may wait again
   * (another device of the weight still measuring), at the end. */
  for (xover_wait **pp = &l->xwaiting; *pp != NULL;) {
    xover_wait *x = *pp;
    if (x->w == w) {
      *pp = x->next;
      l->n_xwaiting--;
      x->next = NULL;
      *rt = x;
      rt = &x->next;
    } else {
      pp = &x->next;
    }
  }
  retail(l);
  while (ready != NULL) {
    xover_wait *x = ready;
    ready = x->next;
    ql__linear_resubmit(s, x->req, x->route, x->session_id);
    ql__weight_unref(x->w);
    free(x);
  }
}

void ql__lin_drop_xwaiting(ql__server *s, uint64_t session_id, int code) {
  struct ql__linear_state *l = s->lin;
  for (xover_wait **pp = &l->xwaiting; *pp != NULL;) {
    xover_wait *x = *pp;
    if (session_id != 0 && x->session_id != session_id) {
      pp = &x->next;
      continue;
    }
    *pp = x->next;
    l->n_xwaiting--;
    if (code != 0)
      ql__reply_error(&s->replies, x->route, x->req->msg->request_id, code,
                      code == QL_ESHUTDOWN ? "daemon is stopping"
                                           : "not answered");
    else
      ql__route_drop(x->route);
    ql__request_free(x->req);
    ql__weight_unref(x->w);
    free(x);
  }
  retail(l);
}

int ql__linear_submit(ql__server *s, ql__session *ss, ql__request *req,
                      void *route, ql__reply *r) {
  const Qlinear__V1__LinearRequest *l = req->msg->linear;
  int wt = crossover_waits(s, ss, req, route, (char *const *)&l->weight, 1,
                           (ql_path)l->path, r);
  if (wt != 0)
    return wt > 0;
  linear_call c = {.req = req,
                   .route = route,
                   .weight = l->weight,
                   .x = l->x,
                   .want = (ql_path)l->path,
                   .ys = l->y_out,
                   .yc = l->y_out_cuda,
                   .yz = l->y_out_ze,
                   .device = l->device};
  return submit_one(s, ss, &c, r);
}

int ql__linear_submit_multi(ql__server *s, ql__session *ss, ql__request *req,
                            void *route, ql__reply *r) {
  const Qlinear__V1__LinearMultiRequest *l = req->msg->linear_multi;
  size_t inline_bytes = 0;
  int wt = crossover_waits(s, ss, req, route, l->weights, l->n_weights,
                           (ql_path)l->path, r);
  if (wt != 0)
    return wt > 0;
  /* What can be checked before anything runs: every weight exists and
   * takes x, and the inline results fit one reply. */
  for (size_t i = 0; i < l->n_weights; i++) {
    const ql__weight *w = ql__weight_store_get(s->weights, l->weights[i]);
    if (w == NULL) {
      ql__reply_set_error(r, QL_ENOTFOUND, "linear_multi: no weight named "
                          "'%s'", l->weights[i]);
      return 0;
    }
    if (l->x->shape[1] != (uint64_t)w->q->k) {
      ql__reply_set_error(r, QL_ESHAPE, "linear_multi: x has K=%llu, weight "
                          "'%s' has K=%lld",
                          (unsigned long long)l->x->shape[1], w->name,
                          (long long)w->q->k);
      return 0;
    }
    if (l->n_y_out == 0 && l->n_y_out_cuda == 0 && l->n_y_out_ze == 0)
      inline_bytes += (size_t)l->x->shape[0] * (size_t)w->q->n *
                      ql_dtype_size((int)l->x->dtype);
  }
  if (inline_bytes > s->cfg.max_message_bytes - QL_ENVELOPE_BYTES) {
    ql__reply_set_error(r, QL_ETOOBIG, "linear_multi: the results (%zu "
                        "bytes) exceed the %zu-byte message cap",
                        inline_bytes, s->cfg.max_message_bytes);
    return 0;
  }
  multi *mu = calloc(1, sizeof *mu);
  if (mu == NULL) {
    ql__reply_set_error(r, QL_ENOMEM, "linear_multi: out of memory");
    return 0;
  }
  mu->route = route;
  mu->req = req;
  /* pending counts one extra until every part is submitted, so that a
   * part answered at once cannot answer the whole early. */
  mu->pending = 1;
  for (size_t i = 0; i < l->n_weights; i++) {
    ql__reply pr;
    ql__reply_init(&pr, 0);
    mu->pending++;
    linear_call c = {.req = req,
                     .route = route,
                     .mu = mu,
                     .index = (unsigned)i,
                     .weight = l->weights[i],
                     .x = l->x,
                     .want = (ql_path)l->path,
                     .ys = l->n_y_out ? l->y_out[i] : NULL,
                     .yc = l->n_y_out_cuda ? l->y_out_cuda[i] : NULL,
                     .yz = l->n_y_out_ze ? l->y_out_ze[i] : NULL,
                     .device = l->device};
    if (!submit_one(s, ss, &c, &pr)) {
      mu->pending--;
      if (i == 0) {
        /* Nothing runs: answer with the part's own error. */
        ql__reply_set_error(r, pr.status.code, "%s", pr.msg);
        free(mu);
        return 0;
      }
      mu->rc = pr.status.code;
      snprintf(mu->err, sizeof mu->err, "weight '%s': %s", l->weights[i],
               pr.msg);
      break;
    }
    mu->n = i + 1;
  }
  if (--mu->pending == 0)
    ql__lin_multi_answer(s, mu);
  return 1;
}
