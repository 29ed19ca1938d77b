/* batch.c - see linear_impl.h: the dispatcher's queues and batches on the
 * device workers, and its state. */
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "dispatch/linear_impl.h"
#include "ql_errno.h"
#include "faults.h"
#include "log.h"
#include "wire/route.h"
#include "dispatch/xover.h"

/* Frees a batch job and what a launch in parts keeps. */
static void batch_free(batch_job *bj) {
  if (bj->part.state != NULL)
    bj->part.state_free(bj->part.state);
  free(bj->xbuf);
  free(bj->ybuf);
  free(bj);
}

static ql__sched_config sched_config(const ql__server *s) {
  const ql__config *c = &s->cfg;
  ql__sched_config sc;
  memset(&sc, 0, sizeof sc);
  sc.max_batch_rows = c->max_batch_rows;
  sc.max_queue_delay_us = c->max_queue_delay_us;
  sc.decode_hold_us = c->decode_hold_us;
  sc.prefill_chunk_rows = c->prefill_chunk_rows;
  sc.prefill_chunk_us = c->prefill_chunk_us;
  sc.max_queue = c->max_queue;
  sc.session_quota = c->session_max_requests;
  sc.n_devices = s->n_dev;
  for (unsigned d = 0; d < s->n_dev && d < QL_SCHED_MAX_DEVICES; d++) {
    sc.lanes[d] = s->dev[d].lanes;
    sc.stops[d] = s->dev[d].b != NULL && s->dev[d].b->linear_parts;
  }
  return sc;
}

static void on_weight_freed(ql__weight *w, void *arg) {
  ql__server *s = arg;
  if (s->lin == NULL || s->lin->sched == NULL)
    return;
  for (int i = 0; i < N_KEYS; i++)
    ql__sched_forget(s->lin->sched, &w->sched_key[i]);
}

static void on_retry(uv_poll_t *p, int status, int events) {
  ql__server *s = p->data;
  uint64_t n;
  (void)status, (void)events;
  /* Non-blocking: EAGAIN when re-armed since it fired (it stays armed). */
  ssize_t got;
  while ((got = read(s->lin->retry_fd, &n, sizeof n)) < 0 && errno == EINTR)
    ;
  if (got == (ssize_t)sizeof n)
    s->lin->retry_at = 0;
  ql__lin_pump(s);
}

/* Runs, oldest first, what waited for the early replies sent before it
 * came to be settled. */
void ql__lin_run_settled(ql__server *s) {
  uint64_t done = atomic_load(&s->lin->early_done);
  settle_wait *w, *rev = NULL, **keep = &s->lin->waiting;
  /* The list is pushed at its head, so targets fall along it: the ones
   * due are its tail. */
  while (*keep != NULL && (*keep)->target > done)
    keep = &(*keep)->next;
  w = *keep;
  *keep = NULL;
  while (w != NULL) {
    settle_wait *next = w->next;
    w->next = rev;
    rev = w;
    w = next;
  }
  while (rev != NULL) {
    settle_wait *next = rev->next;
    rev->cb(s, rev->req, rev->route, rev->arg);
    free(rev);
    rev = next;
  }
}

void ql__linear_when_settled(ql__server *s, ql__settled_cb cb,
                             ql__request *req, void *route, uint64_t arg) {
  settle_wait *w;
  uint64_t target = s->lin != NULL ? atomic_load(&s->lin->early_sent) : 0;
  if (s->lin == NULL || atomic_load(&s->lin->early_done) >= target ||
      (w = malloc(sizeof *w)) == NULL) {
    cb(s, req, route, arg);
    return;
  }
  w->cb = cb;
  w->req = req;
  w->route = route;
  w->arg = arg;
  w->target = target;
  w->next = s->lin->waiting;
  s->lin->waiting = w;
}

void ql__lin_on_expire(uv_timer_t *t) {
  ql__server *s = t->data;
  ql__sched_req *out = NULL;
  ql__sched_expire(s->lin->sched, ql__now_ns(), &out);
  ql__lin_answer_list(s, out);
}

/* Whether the CPU device's kernels use every CPU this process may run on
 * (its backend says how many threads it runs): a client spinning beside
 * such a launch slows it. */
static int cpu_saturated(const ql__server *s) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
    cpus = CPU_COUNT(&set);
  const ql_backend *b = s->cpu_backend;
  return b == NULL || b->host_threads == NULL ||
         (long)b->host_threads() >= cpus;
}

int ql__linear_open(ql__server *s) {
  struct ql__linear_state *l = calloc(1, sizeof *l);
  if (l == NULL)
    return QL_ENOMEM;
  l->retry_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (l->retry_fd < 0) {
    int rc = ql__errno_from_sys(errno); /* out of fds, mostly */
    free(l);
    return rc;
  }
  ql__sched_config sc = sched_config(s);
  int rc = ql__sched_create(&sc, &l->sched);
  if (rc != 0) {
    close(l->retry_fd);
    free(l);
    return rc;
  }
  /* These cannot fail on a valid loop and a new fd (libuv checks the
   * arguments and sets the fd non-blocking, which it is). */
  uv_timer_init(s->loop, &l->expire);
  uv_poll_init(s->loop, &l->retry_poll, l->retry_fd);
  l->expire.data = l->retry_poll.data = s;
  uv_poll_start(&l->retry_poll, UV_READABLE, on_retry);
  l->timers = 1;
  l->cpu_saturated = cpu_saturated(s);
  l->xwaiting_tail = &l->xwaiting;
  s->lin = l;
  ql__weight_store_set_free_hook(s->weights, on_weight_freed, s);
  return 0;
}

void ql__linear_configure(ql__server *s) {
  ql__sched_config sc = sched_config(s);
  if (s->lin != NULL && ql__sched_configure(s->lin->sched, &sc) != 0)
    ql__warn("the scheduler kept its configuration");
  else if (s->lin != NULL)
    ql__lin_pump(s); /* shorter holds: a held queue may be due now */
}

void ql__linear_close_timers(ql__server *s) {
  if (s->lin != NULL && s->lin->timers) {
    uv_close((uv_handle_t *)&s->lin->retry_poll, NULL);
    uv_close((uv_handle_t *)&s->lin->expire, NULL);
    s->lin->timers = 0;
  }
}

void ql__linear_close(ql__server *s) {
  if (s->lin == NULL)
    return;
  /* A start that failed after the scheduler opened left its timer handles
   * open: closed, and their callbacks run, before they are freed. */
  if (s->lin->timers) {
    ql__linear_close_timers(s);
    uv_run(s->loop, UV_RUN_NOWAIT);
  }
  /* (The workers are closed: nothing is pending; this is a backstop.) */
  ql__lin_drop_xwaiting(s, 0, 0);
  while (s->lin->waiting != NULL) {
    settle_wait *w = s->lin->waiting;
    s->lin->waiting = w->next;
    ql__route_drop(w->route);
    ql__request_free(w->req);
    free(w);
  }
  for (unsigned d = 0; d < QL__MAX_DEVICES; d++)
    while (s->lin->stopped[d] != NULL) {
      batch_job *bj = s->lin->stopped[d];
      s->lin->stopped[d] = bj->next;
      batch_free(bj);
    }
  ql__sched_free(s->lin->sched);
  close(s->lin->retry_fd); /* its poll handle was closed with the timers */
  free(s->lin);
  s->lin = NULL;
}

size_t ql__linear_in_flight(const ql__server *s) {
  return s->lin ? s->lin->in_flight + s->lin->n_xwaiting : 0;
}

void ql__linear_set_times(ql__server *s, ql__weight *w, unsigned dev,
                          const uint32_t *m, const uint64_t *wo_ns,
                          const uint64_t *aq_ns, unsigned n) {
  uint32_t rows[QL_XOVER_POINTS];
  uint64_t ns[QL_XOVER_POINTS];
  if (s->lin == NULL || n == 0 || n > QL_XOVER_POINTS)
    return;
  for (int p = 0; p < 2; p++) {
    const uint64_t *t = p ? aq_ns : wo_ns;
    size_t k = 0;
    for (unsigned i = 0; i < n; i++)
      if (t[i] != 0) {
        rows[k] = m[i];
        ns[k++] = t[i];
      }
    if (k == 0)
      continue;
    for (ql_dtype dt = QL_DTYPE_F32; dt <= QL_DTYPE_BF16; dt++)
      (void)ql__sched_set_curve(
          s->lin->sched,
          &w->sched_key[key_index(dt, p ? QL_PATH_ACT_QUANT
                                        : QL_PATH_WEIGHT_ONLY)],
          dev, rows, ns, k);
  }
}

/* ----------------------------------------------------------- batches */

/* The kernel of (weight, path, dtype) for m rows on backend b; NULL: none
 * can run it. */
const ql_kernel_impl *ql__lin_kernel(const ql_backend *b, const ql_qweight *q,
                                     ql_path path, ql_dtype dt, int64_t m) {
  ql_op op = path == QL_PATH_WEIGHT_ONLY ? QL_OP_LINEAR_WO : QL_OP_LINEAR_AQ;
  return ql_dispatch(b, op, q->format, dt, m, q->n, q->k);
}

/* The same for x and y in device memory; NULL: the backend cannot. */
const ql_kernel_impl *ql__lin_kernel_dev(const ql_backend *b,
                                         const ql_qweight *q, ql_path path,
                                         ql_dtype dt, int64_t m) {
  ql_op op = path == QL_PATH_WEIGHT_ONLY ? QL_OP_LINEAR_WO : QL_OP_LINEAR_AQ;
  return ql_dispatch_dev(b, op, q->format, dt, m, q->n, q->k);
}

/* Worker thread of d, bound to it: rows [off, off + rows) of request j
 * with x and y where j has them, device memory included. */
static int run_dev(const ql__device *d, const lin_req *j, uint32_t off,
                   uint32_t rows, const char **impl) {
  ql_linear_dev_args da = {
      {j->w->q, j->w->lay[d->index].packed, j->dt, j->x + (size_t)off * j->x_row,
       rows, j->y + (size_t)off * j->y_row, NULL},
      j->where,
      j->ready};
  return ql_run_linear_dev(d->b,
                           j->path == QL_PATH_WEIGHT_ONLY ? QL_OP_LINEAR_WO
                                                          : QL_OP_LINEAR_AQ,
                           &da, impl);
}

/* Worker thread of d, bound to it. */
static int run_rows(const ql__device *d, const ql__weight *w, ql_path path,
                    ql_dtype dt, const void *x, int64_t m, void *y,
                    const char **impl) {
  return ql_run_linear(d->b,
                       path == QL_PATH_WEIGHT_ONLY ? QL_OP_LINEAR_WO
                                                   : QL_OP_LINEAR_AQ,
                       w->q, w->lay[d->index].packed, dt, x, m, y, impl);
}

/*
 * Worker thread. One slice runs in place (x and y where the request has
 * them: inline, or in a region the client maps too, no copy); several are
 * gathered into one x, run as one launch, and y scattered back. The
 * kernels compute every row on its own (DESIGN §4: batch-invariant), so a
 * request's bytes do not depend on what it was batched with. A launch that
 * finds NaN or Inf is run again slice by slice, so only the request that
 * holds it fails.
 */
static void batch_compute(batch_job *bj);

/*
 * Worker thread: the batch, then the replies of the requests it completed
 * whose routes take a reply from here (a ring: its client reads the
 * result now, without waiting for the loop to wake). Only a Linear
 * request wholly in this launch and answered with success qualifies; the
 * loop still does everything else when the batch is done (stats,
 * references), and sends every other reply.
 */
static void batch_run(ql__job *job) {
  batch_job *bj = (batch_job *)job;
  int any = 0;
  batch_compute(bj);
  if (bj->in_parts && bj->rc == 0 && !bj->part.done)
    return; /* stopped: no row is final yet */
  for (uint32_t i = 0; i < bj->b.n; i++) {
    const ql__sched_slice *sl = &bj->b.slice[i];
    lin_req *j = of(sl->req);
    int rc = bj->rc != 0 ? bj->rc : bj->slice_rc[i];
    if (rc != 0 || j->parent != NULL || sl->offset != 0 ||
        sl->rows != j->sr.rows || j->rc != 0)
      continue;
    if (!ql__route_has_early(j->route))
      continue;
    /* Counted first: the client may ask for Stats the moment it has the
     * reply. */
    ql__weight_stats *st = &j->w->stats[bj->d->index];
    st->requests++;
    st->rows += j->sr.rows;
    if (bj->impl != NULL)
      st->impl = bj->impl;
    ql__counts_request(&bj->s->mcounts, j->w, bj->d->index, j->sr.rows);
    ql__reply r;
    linear_body b;
    ql__lin_reply(j, 0, bj->impl, &r, &b);
    atomic_fetch_add(&bj->s->lin->early_sent, 1);
    j->early = ql__route_early(j->route, &r.resp);
    if (!j->early) /* settled already; batch_done runs what it held */
      atomic_fetch_add(&bj->s->lin->early_done, 1);
    any |= j->early;
  }
  /* Fault injection: a worker descheduled between its early replies and
   * handing the job back, so that clients act on them first. */
  if (any)
    ql__fault_sleep(QL_FAULT_EARLY);
}

/* Copies the x rows of b's slices, laid end to end, into buf. */
static void gather_x(const ql__sched_batch *b, uint8_t *buf, size_t xr) {
  size_t at = 0;
  for (uint32_t i = 0; i < b->n; i++) {
    const ql__sched_slice *sl = &b->slice[i];
    memcpy(buf + at * xr, of(sl->req)->x + (size_t)sl->offset * xr,
           (size_t)sl->rows * xr);
    at += sl->rows;
  }
}

/* Copies the y rows of b's launch in buf back to its slices' requests. */
static void scatter_y(const ql__sched_batch *b, const uint8_t *buf,
                      size_t yr) {
  size_t at = 0;
  for (uint32_t i = 0; i < b->n; i++) {
    const ql__sched_slice *sl = &b->slice[i];
    memcpy(of(sl->req)->y + (size_t)sl->offset * yr, buf + at * yr,
           (size_t)sl->rows * yr);
    at += sl->rows;
  }
}

/* Worker thread: b's host-memory slices one by one, each where its
 * request has x and y, after a launch of all of them found NaN or Inf:
 * only the request that holds it fails. */
static void run_slices(batch_job *bj) {
  const ql__sched_batch *b = &bj->b;
  for (uint32_t i = 0; i < b->n; i++) {
    const ql__sched_slice *sl = &b->slice[i];
    lin_req *j = of(sl->req);
    bj->slice_rc[i] = run_rows(bj->d, j->w, j->path, j->dt,
                               j->x + (size_t)sl->offset * j->x_row, sl->rows,
                               j->y + (size_t)sl->offset * j->y_row,
                               &bj->impl);
  }
}

/* The stop() of a launch in parts: once the call has run as long as the
 * loop allows (yield_ns, 0 while no decode work waits). Any pool thread. */
static int batch_stop(void *ctx) {
  batch_job *bj = ctx;
  ql__fault_sleep(QL_FAULT_PIECE);
  uint64_t y = atomic_load_explicit(&bj->yield_ns, memory_order_relaxed);
  return y != 0 && ql__now_ns() - bj->call_ns >= y;
}

/*
 * Worker thread: one call of a launch in parts (the device's kernels stop
 * when batch_stop says). One slice runs in place; several are gathered
 * into bj->xbuf at the first call and scattered from bj->ybuf after the
 * last. A launch that finds NaN or Inf (while it prepares x, before any
 * of y is written) runs the slices one by one, whole, as batch_compute
 * does, so only the request that holds it fails.
 */
static void batch_compute_parts(batch_job *bj) {
  const ql__device *d = bj->d;
  ql__sched_batch *b = &bj->b;
  lin_req *first = of(b->slice[0].req);
  const ql__weight *w = first->w;
  ql_op op = first->path == QL_PATH_WEIGHT_ONLY ? QL_OP_LINEAR_WO
                                                : QL_OP_LINEAR_AQ;
  size_t xr = first->x_row, yr = first->y_row;
  const void *x;
  void *y;

  bj->part.stop = batch_stop;
  bj->part.ctx = bj;
  bj->call_ns = ql__now_ns();
  if (b->n == 1) {
    x = first->x + (size_t)b->slice[0].offset * xr;
    y = first->y + (size_t)b->slice[0].offset * yr;
  } else {
    if (bj->xbuf == NULL) {
      bj->xbuf = malloc((size_t)b->rows * xr);
      bj->ybuf = malloc((size_t)b->rows * yr);
      if (bj->xbuf == NULL || bj->ybuf == NULL) {
        bj->rc = QL_ENOMEM;
        return;
      }
      gather_x(b, bj->xbuf, xr);
    }
    x = bj->xbuf;
    y = bj->ybuf;
  }
  bj->rc = ql_run_linear_part(d->b, op, w->q, w->lay[d->index].packed,
                              first->dt, x, b->rows, y, &bj->part, &bj->impl);
  if (bj->rc == QL_ENONFINITE && b->n > 1) {
    bj->rc = 0;
    bj->part.done = 1;
    run_slices(bj);
    return;
  }
  if (bj->rc == 0 && bj->part.done && b->n > 1)
    scatter_y(b, bj->ybuf, yr);
}

static void batch_compute(batch_job *bj) {
  ql__server *s = bj->s;
  const ql__device *d = bj->d;
  ql__sched_batch *b = &bj->b;
  lin_req *first = of(b->slice[0].req);
  const ql__weight *w = first->w;
  ql_dtype dt = first->dt;
  size_t xr = first->x_row, yr = first->y_row;
  uint8_t *xbuf = NULL, *ybuf = NULL;

  /* Fault injection for tests of queueing, ordering and the drain: a
   * launch that takes a known time whatever the kernels' speed. */
  ql__fault_sleep(QL_FAULT_KERNEL);
  if (atomic_load(&s->cancel)) {
    bj->rc = QL_ESHUTDOWN;
    return;
  }
  /* d->failed is the loop's; a worker reads it only through this copy,
   * taken when the batch was made. */
  if (bj->rc == QL_EDEVICE)
    return;
  if (d->b->device_bind != NULL && (bj->rc = d->b->device_bind(d->ordinal)))
    return;
  /* Device memory cannot be gathered by the host: a batch with a request
   * whose x or y is in device memory (or that waits for an event) runs
   * slice by slice, each where its tensors are. The kernels are
   * batch-invariant, so each request's bytes are the same as coalesced. */
  int per_slice = 0;
  for (uint32_t i = 0; i < b->n; i++) {
    const lin_req *j = of(b->slice[i].req);
    per_slice |= j->where != 0 || j->ready != NULL;
  }
  if (bj->in_parts) {
    batch_compute_parts(bj);
    return;
  }
  if (per_slice) {
    for (uint32_t i = 0; i < b->n; i++) {
      const ql__sched_slice *sl = &b->slice[i];
      const lin_req *j = of(sl->req);
      bj->slice_rc[i] =
          j->where != 0 || j->ready != NULL
              ? run_dev(d, j, sl->offset, sl->rows, &bj->impl)
              : run_rows(d, w, j->path, dt, j->x + (size_t)sl->offset * xr,
                         sl->rows, j->y + (size_t)sl->offset * yr, &bj->impl);
      /* A failed device fails the batch; other errors are the slice's. */
      if (bj->slice_rc[i] == QL_EDEVICE) {
        bj->rc = QL_EDEVICE;
        break;
      }
    }
    return;
  }
  if (b->n == 1) {
    lin_req *j = first;
    uint32_t off = b->slice[0].offset;
    bj->rc = run_rows(d, w, first->path, dt, j->x + (size_t)off * xr,
                      b->slice[0].rows, j->y + (size_t)off * yr, &bj->impl);
    return;
  }
  xbuf = malloc((size_t)b->rows * xr);
  ybuf = malloc((size_t)b->rows * yr);
  if (xbuf == NULL || ybuf == NULL) {
    bj->rc = QL_ENOMEM;
    goto done;
  }
  gather_x(b, xbuf, xr);
  bj->rc = run_rows(d, w, first->path, dt, xbuf, b->rows, ybuf, &bj->impl);
  if (bj->rc == QL_ENONFINITE) {
    bj->rc = 0;
    run_slices(bj);
  } else if (bj->rc == 0) {
    scatter_y(b, ybuf, yr);
  }
done:
  free(xbuf);
  free(ybuf);
}

static void batch_done(ql__job *job) {
  batch_job *bj = (batch_job *)job;
  ql__server *s = bj->s;
  ql__device *d = bj->d;
  ql__sched_batch *b = &bj->b;
  ql__sched_req *finished = NULL;
  ql__weight *w = of(b->slice[0].req)->w;
  ql__weight_stats *st = &w->stats[d->index];
  int device_rc = bj->rc == QL_EDEVICE ? bj->rc : 0;
  uint64_t kernel_ns = bj->kernel_ns + (job->end_ns - job->start_ns);
  if (bj->in_parts) {
    batch_job **pp = &s->lin->in_parts[d->index];
    while (*pp != bj)
      pp = &(*pp)->next;
    *pp = bj->next;
    bj->next = NULL;
    if (bj->rc == 0 && !bj->part.done) {
      /* Stopped for decode work: it goes on once that has run. */
      bj->kernel_ns = kernel_ns;
      pp = &s->lin->stopped[d->index];
      while (*pp != NULL)
        pp = &(*pp)->next;
      *pp = bj;
      d->busy--;
      ql__lin_pump(s);
      return;
    }
  }
  for (uint32_t i = 0; i < b->n; i++) {
    lin_req *j = of(b->slice[i].req);
    int rc = bj->rc != 0 ? bj->rc : bj->slice_rc[i];
    if (rc == QL_EDEVICE)
      device_rc = rc;
    if (rc != 0 && j->rc == 0)
      j->rc = rc;
    j->impl = bj->impl;
    j->done_ns = job->end_ns;
  }
  if (device_rc != 0)
    ql__device_fail(s, d, device_rc);
  st->batches++;
  int wo = of(b->slice[0].req)->path == QL_PATH_WEIGHT_ONLY;
  if (wo)
    st->wo_batches++;
  else
    st->aq_batches++;
  st->kernel_ns += kernel_ns;
  s->mcounts.dev[d->index].batches[wo ? 0 : 1]++;
  s->mcounts.dev[d->index].kernel_ns += kernel_ns;
  if (bj->rc == 0)
    ql__hist_add(&s->mcounts.launch[wo ? 0 : 1], kernel_ns);
  /* The worker's end: replies may have left then (early), and the
   * clients' next rows with them. A failure holds nothing. */
  b->end_ns = bj->rc == 0 ? job->end_ns : 0;
  ql__sched_complete(s->lin->sched, b, bj->rc == 0 ? kernel_ns : 0, &finished);
  d->busy--;
  batch_free(bj);
  ql__lin_answer_list(s, finished);
  /* (Replies the worker could not send early were settled there.) */
  if (s->lin->waiting != NULL)
    ql__lin_run_settled(s);
  ql__lin_pump(s);
}

/* Hands job bj to d's worker; on failure its rows are handed back failed.
 * It fails only after close: the worker's queue has room for every lane
 * and a measurement, all the loop gives it (devices.c). */
static void batch_submit(ql__server *s, ql__device *d, batch_job *bj) {
  /* While decode work is about, a launch in parts leaves a CPU to the
   * loop, the decode clients and the decode launch's own start: on a host
   * whose pool takes every CPU, they would otherwise wait for the
   * kernel's threads to be preempted. */
  if (bj->in_parts) {
    unsigned t = d->b->host_threads != NULL ? d->b->host_threads() : 0;
    bj->part.threads =
        t > 1 && ql__sched_decode_active(s->lin->sched, d->index,
                                         ql__now_ns())
            ? t - 1
            : 0;
  }
  bj->job.run = batch_run;
  bj->job.done = batch_done;
  int rc = ql__worker_submit(d->worker, &bj->job);
  if (rc != 0) {
    ql__sched_req *finished = NULL;
    bj->rc = rc;
    for (uint32_t i = 0; i < bj->b.n; i++)
      if (of(bj->b.slice[i].req)->rc == 0)
        of(bj->b.slice[i].req)->rc = rc;
    bj->b.end_ns = 0; /* nothing ran: no hold */
    ql__sched_complete(s->lin->sched, &bj->b, 0, &finished);
    batch_free(bj);
    ql__lin_answer_list(s, finished);
    return;
  }
  d->busy++;
  if (bj->in_parts) {
    bj->next = s->lin->in_parts[d->index];
    s->lin->in_parts[d->index] = bj;
  }
}

/* While decode work waits on d and every lane is busy, asks its launches
 * in parts to stop once they have run as long as the scheduler allows. */
static void arm_retry(struct ql__linear_state *l, uint64_t now,
                      uint64_t retry_ns);

static void ask_to_stop(ql__server *s, ql__device *d) {
  batch_job *bj = s->lin->in_parts[d->index];
  if (bj == NULL)
    return;
  uint64_t now = ql__now_ns();
  uint64_t y = ql__sched_yield_ns(s->lin->sched, d->index, now);
  if (y == 0) /* decode work held back by its delay: ask again then */
    arm_retry(s->lin, now,
              ql__sched_decode_due_ns(s->lin->sched, d->index, now));
  for (; y != 0 && bj != NULL; bj = bj->next) {
    uint64_t none = 0;
    atomic_compare_exchange_strong(&bj->yield_ns, &none, y);
  }
}

/* Asks the scheduler again at retry_ns (a queue held back by
 * max_queue_delay_us or decode_hold_us), unless the timer fires sooner
 * already. */
static void arm_retry(struct ql__linear_state *l, uint64_t now,
                      uint64_t retry_ns) {
  if (l->timers == 0 || retry_ns <= now ||
      (l->retry_at != 0 && l->retry_at <= retry_ns))
    return; /* closing, nothing held, or due sooner already */
  /* ql__now_ns() is CLOCK_MONOTONIC: an absolute time on that clock. */
  struct itimerspec it = {{0, 0},
                          {(time_t)(retry_ns / 1000000000u),
                           (long)(retry_ns % 1000000000u)}};
  if (timerfd_settime(l->retry_fd, TFD_TIMER_ABSTIME, &it, NULL) == 0)
    l->retry_at = retry_ns;
  else /* only bad arguments fail it */
    ql__warn("timerfd_settime: %s", strerror(errno));
}

/*
 * Gives device d's worker batches while it has a lane free. Expired
 * requests the scheduler hands back on the way are answered; a queue held
 * back by max_queue_delay_us or decode_hold_us sets the retry timer. The
 * batches of a device out of service still go to its worker, which
 * answers them QL_EDEVICE without running anything: its queue drains in
 * order.
 */
static void pump_lanes(ql__server *s, ql__device *d) {
  struct ql__linear_state *l = s->lin;
  while (d->busy < d->lanes) {
    batch_job *bj = calloc(1, sizeof *bj);
    if (bj == NULL) {
      /* Work stays queued; the next arrival or completion tries again. */
      ql__err("out of memory for a batch");
      return;
    }
    bj->s = s;
    bj->d = d;
    bj->b.slice = bj->slice;
    bj->b.cap = BATCH_SLICES;
    /* A stopped launch goes on once no decode work is due. */
    bj->b.decode_only = l->stopped[d->index] != NULL;
    uint64_t now = ql__now_ns();
    ql__sched_next(l->sched, d->index, now, &bj->b);
    ql__lin_answer_list(s, bj->b.expired);
    bj->b.expired = NULL;
    if (bj->b.n == 0 && bj->b.decode_only) {
      arm_retry(l, now, bj->b.retry_ns);
      free(bj);
      bj = l->stopped[d->index];
      l->stopped[d->index] = bj->next;
      bj->next = NULL;
      atomic_store(&bj->yield_ns, 0);
      if (d->failed)
        bj->rc = QL_EDEVICE;
      batch_submit(s, d, bj);
      continue;
    }
    if (bj->b.n == 0) {
      arm_retry(l, now, bj->b.retry_ns);
      free(bj);
      return;
    }
    for (uint32_t i = 0; i < bj->b.n; i++) {
      lin_req *j = of(bj->b.slice[i].req);
      if (j->first_ns == 0) {
        j->first_ns = now;
        j->w->stats[d->index].queue_ns += now - j->sr.enqueue_ns;
        s->mcounts.dev[d->index].queue_ns += now - j->sr.enqueue_ns;
        int p = ql__path_slot(j->path);
        if (p >= 0)
          ql__hist_add(&s->mcounts.queue[p], now - j->sr.enqueue_ns);
      }
    }
    if (d->failed)
      bj->rc = QL_EDEVICE;
    /* A client waiting on its ring may spin unless this launch takes
     * every CPU (the CPU device with a thread per CPU). */
    int spare = !d->host || !s->lin->cpu_saturated;
    /* Prefill on a device whose kernels stop runs in parts, unless a
     * request's tensors are device memory (run slice by slice). */
    bj->in_parts = d->b->linear_parts && bj->b.cls == QL_SCHED_PREFILL;
    for (uint32_t i = 0; i < bj->b.n; i++) {
      lin_req *j = of(bj->b.slice[i].req);
      ql__route_dispatched(j->parent ? j->parent->route : j->route, spare);
      if (j->where != 0 || j->ready != NULL)
        bj->in_parts = 0;
    }
    batch_submit(s, d, bj);
  }
}

/*
 * Gives device d's worker batches while it has a lane free: decode work
 * before a stopped launch, and that before new prefill. Then, with every
 * lane busy, asks a launch in parts to stop for the decode work waiting.
 */
static void pump_device(ql__server *s, ql__device *d) {
  pump_lanes(s, d);
  ask_to_stop(s, d);
}

void ql__lin_pump(ql__server *s) {
  for (unsigned d = 0; d < s->n_dev; d++)
    pump_device(s, &s->dev[d]);
}

/* ---------------------------------------------------------- the end */

void ql__linear_session_ended(ql__server *s, uint64_t session_id) {
  ql__sched_req *out = NULL;
  if (s->lin == NULL)
    return;
  ql__sched_remove_session(s->lin->sched, session_id, QL_ESESSION, &out);
  ql__lin_answer_list(s, out);
  ql__lin_drop_xwaiting(s, session_id, 0); /* nobody to answer */
}

void ql__linear_cancel_waiting(ql__server *s) {
  ql__sched_req *out = NULL;
  if (s->lin == NULL)
    return;
  ql__sched_remove_all(s->lin->sched, QL_ESHUTDOWN, &out);
  ql__lin_answer_list(s, out);
  ql__lin_drop_xwaiting(s, 0, QL_ESHUTDOWN);
}

void ql__linear_stats(const ql__server *s, const ql__weight *w, unsigned dev,
                      Qlinear__V1__WeightStats *out,
                      uint64_t queue_hist[32], uint64_t kernel_hist[32]) {
  size_t nq = 0, nk = 0;
  memset(queue_hist, 0, 32 * sizeof *queue_hist);
  memset(kernel_hist, 0, 32 * sizeof *kernel_hist);
  for (int i = 0; s->lin != NULL && i < N_KEYS; i++) {
    ql__sched_stats st;
    if (ql__sched_stats_get(s->lin->sched, &w->sched_key[i], dev, &st) != 0)
      continue;
    out->expired += st.expired;
    for (unsigned b = 0; b < QL_SCHED_HIST_BUCKETS && b < 32; b++) {
      queue_hist[b] += st.queue_hist[b];
      kernel_hist[b] += st.kernel_hist[b];
    }
  }
  for (size_t b = 0; b < 32; b++) {
    if (queue_hist[b])
      nq = b + 1;
    if (kernel_hist[b])
      nk = b + 1;
  }
  out->queue_hist = queue_hist;
  out->n_queue_hist = nq;
  out->kernel_hist = kernel_hist;
  out->n_kernel_hist = nk;
}
