/* admit.c - see linear_impl.h: Linear and LinearMulti requests taken in:
 * their tensors, device and path, and their queueing. */
#include <stdio.h>
#include <stdlib.h>

#include "dispatch/linear_impl.h"
#include "wire/route.h"

/* ------------------------------------------------------------ arrival */

/*
 * Looks up a slice in the session's regions and checks its bounds the only
 * safe way, off <= size && len <= size - off (protocol.c has already
 * checked its alignment and, for x, its length). Sets r and returns NULL
 * when it does not fit.
 */
static ql__region *slice_region(ql__session *ss, const char *what,
                                const Qlinear__V1__RegionSlice *sl,
                                ql__reply *r) {
  ql__region *reg = ql__session_region(ss, sl->region_id);
  if (reg == NULL) {
    ql__reply_set_error(r, QL_ENOTFOUND, "linear: %s: the session has no "
                        "region %llu", what,
                        (unsigned long long)sl->region_id);
    return NULL;
  }
  if (!ql__slice_valid(sl->offset, sl->length, reg->size)) {
    ql__reply_set_error(r, QL_EINVAL, "linear: %s: %llu bytes at offset %llu "
                        "do not fit region %llu of %llu bytes", what,
                        (unsigned long long)sl->length,
                        (unsigned long long)sl->offset,
                        (unsigned long long)reg->id,
                        (unsigned long long)reg->size);
    return NULL;
  }
  return reg;
}

/* 1 when the pages of slice sl of reg are populated (ql__region_populated),
 * else r is set and 0. Checked after every other check of the slice. */
static int slice_populated(const ql__region *reg, const char *what,
                           const Qlinear__V1__RegionSlice *sl, ql__reply *r) {
  if (ql__region_populated(reg, sl->offset, sl->length))
    return 1;
  ql__reply_set_error(r, QL_EINVAL, "linear: %s: region %llu has pages in "
                      "[%llu, +%llu) its client never wrote (or that are "
                      "swapped out): the daemon does not fault in a "
                      "client's memory; write them first (libqlinear "
                      "populates the regions it makes)", what,
                      (unsigned long long)reg->id,
                      (unsigned long long)sl->offset,
                      (unsigned long long)sl->length);
  return 0;
}

/*
 * The device of a request's device tensors, from where x's (dx) and y's
 * (dy) memory is, either NULL: one device, and the request's own when it
 * names one (asked), since an allocation is mapped on the device it lives
 * on and its request runs there. kind and ywhat name the tensors in
 * errors. Sets r and returns NULL when it does not add up.
 */
static ql__device *one_device(ql__server *s, ql__device *dx, ql__device *dy,
                              const char *asked, const char *kind,
                              const char *ywhat, ql__reply *r) {
  if (dx != NULL && dy != NULL && dx != dy) {
    ql__reply_set_error(r, QL_EINVAL, "linear: x is in the memory of %s, "
                        "%s in that of %s: a request runs on one device",
                        dx->alias, ywhat, dy->alias);
    return NULL;
  }
  ql__device *d = dx != NULL ? dx : dy;
  if (asked[0] != '\0' && ql__device_find(s, asked) != d) {
    ql__reply_set_error(r, QL_EINVAL, "linear: the request asks for device "
                        "'%.64s', its %s tensors are in the memory of %s",
                        asked, kind, d->alias);
    return NULL;
  }
  return d;
}

/*
 * The device of a request's CUDA IPC tensors (x, y or both; NULL when it
 * has none): the device their slices name, which must be one, must take
 * imports, and must be the request's own device when it names one: an
 * allocation is mapped on the device it lives on, and its request runs
 * there. Sets r and returns 0 when it does not add up.
 */
static int ipc_device(ql__server *s, const Qlinear__V1__CudaIpcSlice *xc,
                      const Qlinear__V1__CudaIpcSlice *yc, const char *asked,
                      ql__device **out, ql__reply *r) {
  ql__device *dx = NULL, *dy = NULL, *d;
  if (xc != NULL && (dx = ql__device_find(s, xc->device)) == NULL) {
    ql__reply_set_error(r, QL_ENOTFOUND, "linear: x: no device '%.64s'",
                        xc->device);
    return 0;
  }
  if (yc != NULL && (dy = ql__device_find(s, yc->device)) == NULL) {
    ql__reply_set_error(r, QL_ENOTFOUND, "linear: y_out_cuda: no device "
                        "'%.64s'", yc->device);
    return 0;
  }
  if ((d = one_device(s, dx, dy, asked, "CUDA IPC", "y_out_cuda", r)) ==
      NULL)
    return 0;
  if (d->b->ipc_open == NULL) {
    ql__reply_set_error(r, QL_ENOTSUP, "linear: device %s takes no CUDA IPC "
                        "memory", d->alias);
    return 0;
  }
  *out = d;
  return 1;
}

/*
 * The session's import of a CUDA IPC slice on d (opened at its first use),
 * with the slice checked against the allocation's real size the only safe
 * way. keep: the import of the request's other tensor (or NULL), which the
 * request holds no reference to yet and a full table must not let go of.
 * Sets r and returns NULL when it cannot be opened or does not fit.
 */
static ql__ipc_mem *ipc_slice(ql__session *ss, const ql__device *d,
                              const char *what,
                              const Qlinear__V1__CudaIpcSlice *sl,
                              const ql__ipc_mem *keep, ql__reply *r) {
  char err[256];
  ql__ipc_mem *m;
  int rc = ql__ipc_get(ql__session_ipc(ss), d, ql__session_id(ss),
                       sl->mem_handle.data, sl->mem_handle.len, keep, &m, err,
                       sizeof err);
  if (rc != 0) {
    ql__reply_set_error(r, rc, "linear: %s: %s", what, err);
    return NULL;
  }
  if (!ql__slice_valid(sl->offset, sl->length, m->size)) {
    ql__reply_set_error(r, QL_EINVAL, "linear: %s: %llu bytes at offset %llu "
                        "do not fit the CUDA allocation of %llu bytes", what,
                        (unsigned long long)sl->length,
                        (unsigned long long)sl->offset,
                        (unsigned long long)m->size);
    return NULL;
  }
  return m;
}

/*
 * A request's Level Zero tensors (x, y or both): the session's imports
 * they name, on one device, which must be the request's own when it names
 * one, and each slice inside its allocation's real size. Sets r and
 * returns 0 when it does not add up.
 */
static int ze_imports(ql__server *s, ql__session *ss,
                      const Qlinear__V1__ZeIpcSlice *xz,
                      const Qlinear__V1__ZeIpcSlice *yz, const char *asked,
                      ql__device **dev, ql__ipc_mem **xm, ql__ipc_mem **ym,
                      ql__reply *r) {
  const Qlinear__V1__ZeIpcSlice *sl[2] = {xz, yz};
  static const char *const what[2] = {"x", "y_out_ze"};
  ql__ipc_mem *m[2] = {NULL, NULL};
  for (int i = 0; i < 2; i++) {
    if (sl[i] == NULL)
      continue;
    /* Another session's import is not in this table: not found. */
    m[i] = ql__ipc_find(*ql__session_ipc(ss), sl[i]->import_id);
    if (m[i] == NULL) {
      ql__reply_set_error(r, QL_ENOTFOUND, "linear: %s: the session has no "
                          "Level Zero import %llu", what[i],
                          (unsigned long long)sl[i]->import_id);
      return 0;
    }
    if (!ql__slice_valid(sl[i]->offset, sl[i]->length, m[i]->size)) {
      ql__reply_set_error(r, QL_EINVAL, "linear: %s: %llu bytes at offset "
                          "%llu do not fit the Level Zero allocation of %llu "
                          "bytes", what[i],
                          (unsigned long long)sl[i]->length,
                          (unsigned long long)sl[i]->offset,
                          (unsigned long long)m[i]->size);
      return 0;
    }
  }
  ql__device *d = one_device(
      s, m[0] ? &s->dev[m[0]->dev->index] : NULL,
      m[1] ? &s->dev[m[1]->dev->index] : NULL, asked, "Level Zero",
      "y_out_ze", r);
  if (d == NULL)
    return 0;
  *dev = d;
  *xm = m[0];
  *ym = m[1];
  return 1;
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
 * The checks of a y slice that do not depend on what memory holds it
 * (what: "y_out", "y_out_cuda", "y_out_ze"): it holds exactly the
 * [m, n] result of y_bytes, and, when x is in the same region or
 * allocation (same), the two do not overlap. Both slices were checked to
 * be inside that memory, so the sums cannot wrap. Sets r and returns 0
 * when they fail.
 */
static int y_length_ok(const char *what, uint64_t len, uint64_t m, int64_t n,
                       size_t esz, size_t y_bytes, ql__reply *r) {
  if (len == y_bytes)
    return 1;
  ql__reply_set_error(r, QL_ESHAPE, "linear: the %s slice holds %llu bytes, "
                      "[%llu,%lld] of %zu-byte elements needs %zu", what,
                      (unsigned long long)len, (unsigned long long)m,
                      (long long)n, esz, y_bytes);
  return 0;
}

static int apart(const char *what, int same, uint64_t xoff, uint64_t xlen,
                 uint64_t yoff, uint64_t ylen, ql__reply *r) {
  if (!same || xoff >= yoff + ylen || yoff >= xoff + xlen)
    return 1;
  ql__reply_set_error(r, QL_EINVAL, "linear: the x and %s slices overlap",
                      what);
  return 0;
}

/*
 * Checks and queues one weight's computation on x: a Linear request (mu
 * NULL: the new lin_req owns req and route) or part index of a LinearMulti
 * (mu owns them). Returns 1 when queued, else 0 with r set.
 */
static int submit_one(ql__server *s, ql__session *ss, ql__request *req,
                      void *route, multi *mu, unsigned index,
                      const char *weight, const Qlinear__V1__Tensor *x,
                      ql_path want, const Qlinear__V1__RegionSlice *ys,
                      const Qlinear__V1__CudaIpcSlice *yc,
                      const Qlinear__V1__ZeIpcSlice *yz,
                      const char *device, ql__reply *r) {
  const Qlinear__V1__RegionSlice *xs =
      x->data_case == QLINEAR__V1__TENSOR__DATA_REGION ? x->region : NULL;
  const Qlinear__V1__CudaIpcSlice *xc =
      x->data_case == QLINEAR__V1__TENSOR__DATA_CUDA_IPC ? x->cuda_ipc : NULL;
  const Qlinear__V1__ZeIpcSlice *xz =
      x->data_case == QLINEAR__V1__TENSOR__DATA_ZE_IPC ? x->ze_ipc : NULL;
  ql__device *ipc_dev = NULL;
  ql__ipc_mem *xm = NULL, *ym = NULL;
  uint64_t now = ql__now_ns();
  ql__weight *w = ql__weight_store_get(s->weights, weight);
  if (w == NULL) {
    ql__reply_set_error(r, QL_ENOTFOUND, "linear: no weight named '%s'",
                        weight);
    return 0;
  }
  /* Device tensors run where their memory is. */
  if ((xc != NULL || yc != NULL) && (xz != NULL || yz != NULL)) {
    ql__reply_set_error(r, QL_EINVAL, "linear: CUDA and Level Zero IPC "
                        "tensors in one request");
    return 0;
  }
  if (xz != NULL || yz != NULL) {
    if (!ze_imports(s, ss, xz, yz, device, &ipc_dev, &xm, &ym, r))
      return 0;
    device = ipc_dev->name;
  }
  if (xc != NULL || yc != NULL) {
    if (!ipc_device(s, xc, yc, device, &ipc_dev, r))
      return 0;
    device = ipc_dev->name;
  }
  /* The device: the one asked for, which must hold the weight and be in
   * service, else the scheduler's choice among those that do. */
  uint64_t holders = w->devices & ~ql__devices_failed(s);
  int on = -1;
  if (device[0] != '\0') {
    const ql__device *d = ql__device_find(s, device);
    char on_list[256];
    ql__devices_list(s, w->devices, on_list, sizeof on_list);
    if (d == NULL || !(w->devices >> d->index & 1)) {
      ql__reply_set_error(r, QL_ENOTFOUND, "linear: no device '%.64s' holds "
                          "weight '%s' (it is on: %s)", device, w->name,
                          on_list);
      return 0;
    }
    if (d->failed) {
      ql__reply_set_error(r, QL_EDEVICE, "linear: device %s is out of "
                          "service", d->alias);
      return 0;
    }
    on = (int)d->index;
  } else if (holders == 0) {
    char on_list[256];
    ql__devices_list(s, w->devices, on_list, sizeof on_list);
    ql__reply_set_error(r, QL_EDEVICE, "linear: every device that holds "
                        "weight '%s' is out of service (%s)", w->name,
                        on_list);
    return 0;
  }
  uint64_t m = x->shape[0], k = x->shape[1];
  if (k != (uint64_t)w->q->k) {
    ql__reply_set_error(r, QL_ESHAPE, "linear: x has K=%llu, weight '%s' has "
                        "K=%lld", (unsigned long long)k, w->name,
                        (long long)w->q->k);
    return 0;
  }
  if (m > UINT32_MAX) {
    ql__reply_set_error(r, QL_ESHAPE, "linear: %llu rows are too many",
                        (unsigned long long)m);
    return 0;
  }
  ql_dtype dt = (ql_dtype)x->dtype;
  size_t esz = ql_dtype_size(dt), y_bytes;
  if (ql__mul_size(m, (size_t)w->q->n, esz, &y_bytes) != 0) {
    ql__reply_set_error(r, QL_ESHAPE, "linear: the [%llu,%lld] result "
                        "overflows", (unsigned long long)m,
                        (long long)w->q->n);
    return 0;
  }
  /* Only an inline y travels in the reply: a region takes any size. */
  if (ys == NULL && yc == NULL && yz == NULL && y_bytes > s->cfg.max_message_bytes - QL_ENVELOPE_BYTES) {
    ql__reply_set_error(r, QL_ETOOBIG, "linear: the [%llu,%lld] result "
                        "exceeds the %zu-byte message cap",
                        (unsigned long long)m, (long long)w->q->n,
                        s->cfg.max_message_bytes);
    return 0;
  }
  ql__region *xr = NULL, *yr = NULL;
  if (xs != NULL && (xr = slice_region(ss, "x", xs, r)) == NULL)
    return 0;
  if (ys != NULL) {
    if ((yr = slice_region(ss, "y_out", ys, r)) == NULL)
      return 0;
    if (!y_length_ok("y_out", ys->length, m, w->q->n, esz, y_bytes, r) ||
        !apart("y_out", xr == yr, xs ? xs->offset : 0, xs ? xs->length : 0,
               ys->offset, ys->length, r))
      return 0;
  }
  if (yz != NULL &&
      (!y_length_ok("y_out_ze", yz->length, m, w->q->n, esz, y_bytes, r) ||
       !apart("y_out_ze", xm == ym, xz ? xz->offset : 0,
              xz ? xz->length : 0, yz->offset, yz->length, r)))
    return 0;
  if (xc != NULL && (xm = ipc_slice(ss, ipc_dev, "x", xc, NULL, r)) == NULL)
    return 0;
  if (yc != NULL &&
      (!y_length_ok("y_out_cuda", yc->length, m, w->q->n, esz, y_bytes, r) ||
       (ym = ipc_slice(ss, ipc_dev, "y_out_cuda", yc, xm, r)) == NULL ||
       !apart("y_out_cuda", xm == ym, xc ? xc->offset : 0,
              xc ? xc->length : 0, yc->offset, yc->length, r)))
    return 0;
  /* Path: the request's own choice, else the weight's policy, else by the
   * request's own row count (DESIGN §6), never by what it is batched
   * with: that keeps its reply reproducible. */
  ql_path path = want;
  if (path == QL_PATH_AUTO)
    path = w->policy;
  if (path == QL_PATH_AUTO)
    path = auto_path(s, w, holders, m, &on);
  /* Where no implementation can run the activation-quantized path (q8b is
   * weight-only; int8 AQ accumulates in int32, which bounds K for q8c), a
   * chosen path falls back to weight-only and a forced one is refused. */
  if (path == QL_PATH_ACT_QUANT &&
      ql__lin_kernel(on >= 0 ? s->dev[on].b : NULL, w->q, QL_PATH_ACT_QUANT, dt,
             (int64_t)m) == NULL) {
    if (want == QL_PATH_ACT_QUANT) {
      ql__reply_set_error(r, QL_ENOTSUP, "linear: %s weight '%s' (K=%lld) has "
                          "no activation-quantized path",
                          ql__format_name(w->q->format), w->name,
                          (long long)w->q->k);
      return 0;
    }
    path = QL_PATH_WEIGHT_ONLY;
  }
  /* Device tensors need an implementation of the device's own that reads
   * them where they are (linear_dev); AQ without one falls back as above. */
  if (ipc_dev != NULL) {
    const ql_kernel_impl *im = ql__lin_kernel_dev(ipc_dev->b, w->q, path, dt,
                                          (int64_t)m);
    if (im == NULL && path == QL_PATH_ACT_QUANT &&
        want != QL_PATH_ACT_QUANT) {
      path = QL_PATH_WEIGHT_ONLY;
      im = ql__lin_kernel_dev(ipc_dev->b, w->q, path, dt, (int64_t)m);
    }
    if (im == NULL) {
      ql__reply_set_error(r, QL_ENOTSUP, "linear: no %s kernel of %s reads "
                          "device memory for %s weight '%s'",
                          path == QL_PATH_ACT_QUANT ? "activation-quantized"
                                                    : "weight-only",
                          ipc_dev->alias, ql__format_name(w->q->format),
                          w->name);
      return 0;
    }
  }
  if ((xr != NULL && !slice_populated(xr, "x", xs, r)) ||
      (yr != NULL && !slice_populated(yr, "y_out", ys, r)))
    return 0;
  /* Waiting requests hold their inline x and their inline y: bound both.
   * Region and device memory are the session's and bounded there. */
  size_t cost = (xr || xm ? 0 : x->inline_data.len) +
                (yr || ym ? 0 : y_bytes);
  /* (A reload may have set the bound below what is queued already.) */
  if (s->queued_bytes > s->cfg.max_queued_bytes ||
      cost > s->cfg.max_queued_bytes - s->queued_bytes) {
    ql__reply_set_error(r, QL_EEXHAUSTED, "linear: %zu bytes of requests are "
                        "already queued", s->queued_bytes);
    return 0;
  }
  /* While other users are connected, one user's share of the queues. */
  ql__tenant *tn = ss != NULL ? ql__session_tenant(ss) : NULL;
  if (tn != NULL && s->tenants.active >= 2) {
    size_t share_b = ql__tenant_share(s->cfg.max_queued_bytes,
                                      s->cfg.uid_share);
    size_t share_j = ql__tenant_share(s->cfg.max_queue, s->cfg.uid_share);
    if (tn->queued_jobs >= share_j || tn->queued_bytes > share_b ||
        cost > share_b - tn->queued_bytes) {
      ql__tenant_refused(&s->tenants, tn->uid, "the request queues");
      ql__reply_set_error(r, QL_EEXHAUSTED, "linear: uid %u has %zu "
                          "requests (%zu bytes) queued, its share "
                          "(uid_share = %u%% of max_queue and "
                          "max_queued_bytes) while other users are "
                          "connected", (unsigned)tn->uid, tn->queued_jobs,
                          tn->queued_bytes, (unsigned)s->cfg.uid_share);
      return 0;
    }
  }
  /* The ready event is opened per request (it is recorded anew for each
   * x) and last, so that nothing can fail with it open but the queueing. */
  void *ready = NULL;
  if (xc != NULL && xc->ready_event.len != 0) {
    int erc = ipc_dev->b->ipc_event_open(ipc_dev->ordinal,
                                         xc->ready_event.data,
                                         xc->ready_event.len, &ready);
    if (erc != 0) {
      ql__reply_set_error(r, erc, "linear: x: device %s cannot open the "
                          "ready event handle%s", ipc_dev->alias,
                          erc == QL_EINVAL ? " (not an interprocess event of "
                                             "a live process)" : "");
      return 0;
    }
  }
  lin_req *j = calloc(1, sizeof *j);
  if (j == NULL || (yr == NULL && ym == NULL &&
                    (j->y = malloc(y_bytes ? y_bytes : 1)) == NULL)) {
    free(j);
    if (ready != NULL)
      ipc_dev->b->ipc_event_close(ipc_dev->ordinal, ready);
    ql__reply_set_error(r, QL_ENOMEM, "linear: out of memory");
    return 0;
  }
  j->s = s;
  j->parent = mu;
  j->index = index;
  if (mu == NULL) {
    j->route = route;
    j->req = req;
  }
  j->w = w;
  j->xr = xr;
  j->yr = yr;
  j->x = xr   ? xr->base + xs->offset
         : xm ? xm->base + (xc ? xc->offset : xz->offset)
              : x->inline_data.data;
  if (yr)
    j->y = yr->base + ys->offset;
  if (ym)
    j->y = ym->base + (yc ? yc->offset : yz->offset);
  j->where = (xm ? QL_LINEAR_X_DEVICE : 0u) | (ym ? QL_LINEAR_Y_DEVICE : 0u);
  j->x_row = (size_t)k * esz;
  j->y_row = (size_t)w->q->n * esz;
  j->y_bytes = y_bytes;
  j->cost = cost;
  j->dt = dt;
  j->path = path;
  j->sr.weight = &w->sched_key[key_index(dt, path)];
  j->sr.device = on;
  j->sr.holders = holders;
  j->sr.path = m <= s->cfg.decode_max_rows ? QL_PATH_WEIGHT_ONLY
                                            : QL_PATH_ACT_QUANT;
  j->sr.rows = (uint32_t)m;
  j->sr.session = ql__session_id(ss);
  j->sr.tenant = (uint64_t)ql__session_uid(ss) + 1; /* a launch's fairness */
  /* A deadline past what the nanosecond clock can express (centuries) is
   * no deadline: computed naively it would wrap into the past. */
  uint64_t dl_ns = 0;
  if (req->msg->deadline_us != 0 &&
      (__builtin_mul_overflow(req->msg->deadline_us, (uint64_t)1000, &dl_ns) ||
       __builtin_add_overflow(dl_ns, now, &dl_ns)))
    dl_ns = 0;
  j->sr.deadline_ns = dl_ns;
  int rc = ql__sched_submit(s->lin->sched, &j->sr, now);
  if (rc != 0) {
    if (yr == NULL && ym == NULL)
      free(j->y);
    free(j);
    if (ready != NULL)
      ipc_dev->b->ipc_event_close(ipc_dev->ordinal, ready);
    if (rc == QL_EEXHAUSTED)
      ql__reply_set_error(r, rc, "linear: the queue of '%s' is full, or the "
                          "session has %zu requests waiting", w->name,
                          ql__sched_session_count(s->lin->sched,
                                                  ql__session_id(ss)));
    else if (rc == QL_EDEADLINE)
      ql__reply_set_error(r, rc, "linear: the deadline passed on arrival");
    else
      ql__reply_set_error(r, rc, "linear: %s", ql_strerror(rc));
    return 0;
  }
  ql__weight_ref(w);
  if (xr)
    ql__region_ref(xr);
  if (yr)
    ql__region_ref(yr);
  if (xm)
    ql__ipc_ref(xm);
  if (ym)
    ql__ipc_ref(ym);
  j->xm = xm;
  j->ym = ym;
  j->ready = ready;
  j->ready_dev = ipc_dev;
  s->queued_bytes += cost;
  if (tn != NULL) {
    tn->queued_bytes += cost;
    tn->queued_jobs++;
    j->tenant = tn;
  }
  s->lin->in_flight++;
  /* Deadlines are checked at every launch; while a long batch runs this
   * timer answers the expired ones on time. */
  if (j->sr.deadline_ns != 0 && !uv_is_active((uv_handle_t *)&s->lin->expire))
    uv_timer_start(&s->lin->expire, ql__lin_on_expire, 5, 5);
  ql__lin_pump(s);
  return 1;
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
  return submit_one(s, ss, req, route, NULL, 0, l->weight, l->x,
                    (ql_path)l->path, l->y_out, l->y_out_cuda, l->y_out_ze,
                    l->device, r);
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
    if (!submit_one(s, ss, req, route, mu, (unsigned)i, l->weights[i], l->x,
                    (ql_path)l->path, l->n_y_out ? l->y_out[i] : NULL,
                    l->n_y_out_cuda ? l->y_out_cuda[i] : NULL,
                    l->n_y_out_ze ? l->y_out_ze[i] : NULL, l->device,
                    &pr)) {
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
