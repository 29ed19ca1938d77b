/* linear.c - see linear.h. */
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "devices.h"
#include "ipc.h"
#include "linear.h"
#include "log.h"
#include "registry.h"
#include "route.h"
#include "scheduler.h"
#include "session.h"
#include "xover.h"

/* Slices one batch may hold: one per request at least, up to the rows. */
#define BATCH_SLICES 256u
/* Queue keys per weight: (dtype, path), &w->sched_key[key_index()]. */
#define N_KEYS 8

/*
 * The scheduler orders two classes of work: decode (its WEIGHT_ONLY class:
 * runs first, never cut) and prefill (its ACT_QUANT class: after decode
 * work, whole, or in chunks of at most prefill_chunk_us of launch time
 * while decode work is about). On a device whose launches stop (the CPU)
 * a prefill launch runs in parts instead: it stops for decode work when
 * the scheduler says (ql__sched_yield_ns), waits on the device's stopped
 * list while the decode batches run, and goes on from where it stopped.
 * A request's class is its size, decode up to decode_max_rows, whatever
 * path its kernels take; the path is in the queue key, so one launch
 * never mixes paths or dtypes.
 */
static int key_index(ql_dtype dt, ql_path path) {
  return (int)(dt & 3) * 2 + (path == QL_PATH_ACT_QUANT);
}

struct multi;

/* One Linear request, or one weight of a LinearMulti: the scheduler's
 * record and what its reply needs. */
typedef struct lin_req {
  ql__sched_req sr;
  ql__server *s;
  struct multi *parent; /* LinearMulti: the request it is part of */
  unsigned index;       /* and which part */
  void *route;      /* Linear only (a part's is its parent's) */
  ql__request *req; /* owns x when it is inline (Linear only) */
  ql__weight *w;    /* one reference */
  ql__region *xr;   /* x's region (one reference), or NULL: inline */
  ql__region *yr;   /* y's region (one reference), or NULL: y is ours */
  ql__ipc_mem *xm;  /* x's IPC import (one reference), or NULL */
  ql__ipc_mem *ym;  /* y's IPC import (one reference), or NULL */
  void *ready;      /* x's ready event (ipc_event_open of ready_dev) */
  const ql__device *ready_dev;
  unsigned where;   /* QL_LINEAR_*_DEVICE: x, y in device memory */
  const uint8_t *x; /* inline data or inside xr's mapping */
  uint8_t *y;       /* malloc'd here, or inside yr's mapping */
  size_t x_row, y_row; /* bytes of one row of x and of y */
  size_t y_bytes;
  size_t cost;      /* bytes counted in s->queued_bytes */
  ql_dtype dt;
  ql_path path;
  int rc;           /* the first error of a batch it was in */
  int early;        /* its reply went from the worker (route.h early) */
  const char *impl; /* of its last launch (static) */
  uint64_t first_ns; /* when its first rows started (0: not yet) */
} lin_req;

/* One launch on a device worker. */
typedef struct batch_job {
  ql__job job;
  ql__server *s;
  ql__device *d;
  ql__sched_batch b;
  ql__sched_slice slice[BATCH_SLICES];
  int slice_rc[BATCH_SLICES];
  int rc;
  const char *impl;
  /* A prefill launch on a device whose kernels stop (ql_backend.
   * linear_parts) runs in calls: each stops once it has run yield_ns
   * (set by the loop when decode work waits; 0: run on) and the batch
   * waits on the device's stopped list until the decode work has run. */
  int in_parts;
  ql_linear_part part;
  _Atomic uint64_t yield_ns;
  uint64_t call_ns;   /* worker: when the current call began */
  uint64_t kernel_ns; /* the earlier calls' time */
  uint8_t *xbuf, *ybuf; /* several slices: x gathered, y until scattered */
  struct batch_job *next; /* in a device's stopped or in-parts list */
} batch_job;

struct ql__linear_state {
  ql__sched *sched;
  size_t in_flight;    /* accepted, not yet answered */
  /* A held queue: ask the scheduler again. A timerfd the loop watches,
   * not a uv timer: libuv's timers count whole milliseconds, and a queue
   * is held for tens or hundreds of µs. retry_at is its due time, 0 when
   * disarmed. */
  int retry_fd;
  uv_poll_t retry_poll;
  uint64_t retry_at;
  uv_timer_t expire;   /* answers expired requests while the worker is busy */
  int timers;
  int cpu_saturated; /* the CPU device has a thread for every CPU */
  /* Replies workers tried to send early, and of those, the ones that
   * are settled: accounted by the loop, or not sent early after all.
   * What waits for the replies sent before it arrived waits for
   * early_done to reach early_sent as it was then: a generation, so that
   * a steady stream of later replies cannot hold it back. */
  _Atomic uint64_t early_sent, early_done;
  struct settle_wait *waiting;
  /* Per device: its batches in parts on the worker, and those stopped
   * for decode work (oldest first), to go on with when it has run. */
  batch_job *in_parts[QL__MAX_DEVICES];
  batch_job *stopped[QL__MAX_DEVICES];
};

typedef struct settle_wait {
  ql__settled_cb cb;
  ql__request *req;
  void *route;
  uint64_t arg;
  uint64_t target; /* early_sent when it came */
  struct settle_wait *next;
} settle_wait;

static lin_req *of(ql__sched_req *sr) {
  return (lin_req *)((char *)sr - offsetof(lin_req, sr));
}

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

static void pump(ql__server *s);

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
  pump(s);
}

static void answer_list(ql__server *s, ql__sched_req *list);

/* Runs, oldest first, what waited for the early replies sent before it
 * came to be settled. */
static void run_settled(ql__server *s) {
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

static void on_expire(uv_timer_t *t) {
  ql__server *s = t->data;
  ql__sched_req *out = NULL;
  ql__sched_expire(s->lin->sched, ql__now_ns(), &out);
  answer_list(s, out);
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
    int rc = errno == ENOMEM ? QL_ENOMEM : QL_EEXHAUSTED; /* out of fds */
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
  s->lin = l;
  ql__weight_store_set_free_hook(s->weights, on_weight_freed, s);
  return 0;
}

void ql__linear_configure(ql__server *s) {
  ql__sched_config sc = sched_config(s);
  if (s->lin != NULL && ql__sched_configure(s->lin->sched, &sc) != 0)
    ql__warn("the scheduler kept its configuration");
  else if (s->lin != NULL)
    pump(s); /* shorter holds: a held queue may be due now */
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
  return s->lin ? s->lin->in_flight : 0;
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

/* ----------------------------------------------------------- replies */

/* A LinearMulti: answered when its last part is. */
typedef struct multi {
  void *route;
  ql__request *req; /* owns x when it is inline */
  size_t n;         /* parts submitted */
  size_t pending;   /* parts not yet answered */
  int rc;           /* the first failure */
  char err[640];
  struct part {
    uint8_t *y;     /* inline result (owned), or NULL: in a region */
    size_t y_bytes;
    uint64_t m, n;
    ql_dtype dt;
    ql_path path;
    const char *impl;
  } part[QL_MULTI_MAX];
} multi;

/*
 * y of a reply whose result went into the client's device memory: the
 * slice it asked for (want_cuda or want_ze), without handles: nothing that
 * maps memory travels back, and an import id names nothing outside the
 * session. yc or yz holds the slice; y points at it.
 */
static void device_y(Qlinear__V1__Tensor *y,
                     const Qlinear__V1__CudaIpcSlice *want_cuda,
                     const Qlinear__V1__ZeIpcSlice *want_ze,
                     Qlinear__V1__CudaIpcSlice *yc, Qlinear__V1__ZeIpcSlice *yz) {
  if (want_ze != NULL) {
    *yz = *want_ze;
    y->data_case = QLINEAR__V1__TENSOR__DATA_ZE_IPC;
    y->ze_ipc = yz;
    return;
  }
  qlinear__v1__cuda_ipc_slice__init(yc);
  yc->offset = want_cuda->offset;
  yc->length = want_cuda->length;
  yc->device = want_cuda->device;
  y->data_case = QLINEAR__V1__TENSOR__DATA_CUDA_IPC;
  y->cuda_ipc = yc;
}

static void multi_answer(ql__server *s, multi *mu) {
  ql__reply r;
  Qlinear__V1__LinearMultiResponse out;
  Qlinear__V1__LinearResponse res[QL_MULTI_MAX], *pres[QL_MULTI_MAX];
  Qlinear__V1__Tensor y[QL_MULTI_MAX];
  Qlinear__V1__RegionSlice ys[QL_MULTI_MAX];
  Qlinear__V1__CudaIpcSlice yc[QL_MULTI_MAX];
  Qlinear__V1__ZeIpcSlice yz[QL_MULTI_MAX];
  uint64_t shape[QL_MULTI_MAX][2];
  const Qlinear__V1__LinearMultiRequest *l = mu->req->msg->linear_multi;
  ql__reply_init(&r, mu->req->msg->request_id);
  if (mu->rc != 0) {
    ql__reply_set_error(&r, mu->rc, "linear_multi: %s", mu->err);
  } else {
    qlinear__v1__linear_multi_response__init(&out);
    for (size_t i = 0; i < mu->n; i++) {
      struct part *p = &mu->part[i];
      qlinear__v1__linear_response__init(&res[i]);
      qlinear__v1__tensor__init(&y[i]);
      shape[i][0] = p->m;
      shape[i][1] = p->n;
      y[i].dtype = (Qlinear__V1__DType)p->dt;
      y[i].shape = shape[i];
      y[i].n_shape = 2;
      if (p->y == NULL && (l->n_y_out_cuda != 0 || l->n_y_out_ze != 0)) {
        device_y(&y[i], l->n_y_out_cuda ? l->y_out_cuda[i] : NULL,
                 l->n_y_out_ze ? l->y_out_ze[i] : NULL, &yc[i], &yz[i]);
      } else if (p->y == NULL) {
        qlinear__v1__region_slice__init(&ys[i]);
        ys[i].region_id = l->y_out[i]->region_id;
        ys[i].offset = l->y_out[i]->offset;
        ys[i].length = l->y_out[i]->length;
        y[i].data_case = QLINEAR__V1__TENSOR__DATA_REGION;
        y[i].region = &ys[i];
      } else {
        y[i].data_case = QLINEAR__V1__TENSOR__DATA_INLINE_DATA;
        y[i].inline_data.data = p->y;
        y[i].inline_data.len = p->y_bytes;
      }
      res[i].y = &y[i];
      res[i].path = (Qlinear__V1__Path)p->path;
      res[i].impl = (char *)(p->impl ? p->impl : "");
      pres[i] = &res[i];
    }
    out.results = pres;
    out.n_results = mu->n;
    r.resp.body_case = QLINEAR__V1__RESPONSE__BODY_LINEAR_MULTI;
    r.resp.linear_multi = &out;
  }
  ql__reply_send(s, mu->route, &r);
  for (size_t i = 0; i < mu->n; i++)
    free(mu->part[i].y);
  ql__request_free(mu->req);
  free(mu);
}

static const char *error_text(int rc) {
  switch (rc) {
  case QL_ENONFINITE:
    return "NaN or Inf in the activations";
  case QL_ESHUTDOWN:
    return "the daemon stopped before running it";
  case QL_EDEADLINE:
    return "the deadline passed before it started";
  case QL_ESESSION:
    return "the session ended";
  case QL_EDEVICE:
    return "the device failed and is out of service";
  default:
    return ql_strerror(rc);
  }
}

/* Lets go of what a request holds in device memory: its imports and its
 * ready event. */
static void release_device(lin_req *j) {
  ql__ipc_unref(j->xm);
  ql__ipc_unref(j->ym);
  if (j->ready != NULL)
    j->ready_dev->b->ipc_event_close(j->ready_dev->ordinal, j->ready);
  j->xm = j->ym = NULL;
  j->ready = NULL;
}

/* A part of a LinearMulti is done: its result moves to the parent, which
 * is answered with the last part. */
static void part_done(ql__server *s, lin_req *j, int rc) {
  multi *mu = j->parent;
  struct part *p = &mu->part[j->index];
  if (rc != 0 && mu->rc == 0) {
    mu->rc = rc;
    snprintf(mu->err, sizeof mu->err, "weight '%s': %s", j->w->name,
             error_text(rc));
  }
  p->m = j->sr.rows;
  p->n = (uint64_t)j->w->q->n;
  p->dt = j->dt;
  p->path = j->path;
  p->impl = j->impl;
  p->y_bytes = j->y_bytes;
  p->y = j->yr == NULL && j->ym == NULL ? j->y : NULL; /* the parent's now */
  if (rc == 0) {
    j->w->stats[j->sr.on_device].requests++;
    j->w->stats[j->sr.on_device].rows += j->sr.rows;
  }
  ql__weight_unref(j->w);
  ql__region_unref(j->xr);
  ql__region_unref(j->yr);
  release_device(j);
  free(j);
  if (--mu->pending == 0)
    multi_answer(s, mu);
}

/* Answers one request and frees it. */
/* The bodies a Linear reply points to. */
typedef struct linear_body {
  Qlinear__V1__LinearResponse out;
  Qlinear__V1__Tensor y;
  Qlinear__V1__RegionSlice yslice;
  Qlinear__V1__CudaIpcSlice ycuda;
  Qlinear__V1__ZeIpcSlice yze;
  uint64_t shape[2];
} linear_body;

/*
 * Makes r the reply to Linear request j, which ended with rc and ran impl;
 * its bodies live in b. Touches nothing but j's request and result, so
 * that a worker can build it too (the early reply of batch_run).
 */
static void linear_reply(const lin_req *j, int rc, const char *impl,
                         ql__reply *r, linear_body *b) {
  ql__reply_init(r, j->req->msg->request_id);
  if (rc != 0) {
    ql__reply_set_error(r, rc, "linear: %s", error_text(rc));
    return;
  }
  b->shape[0] = j->sr.rows;
  b->shape[1] = (uint64_t)j->w->q->n;
  qlinear__v1__linear_response__init(&b->out);
  qlinear__v1__tensor__init(&b->y);
  b->y.dtype = (Qlinear__V1__DType)j->dt;
  b->y.shape = b->shape;
  b->y.n_shape = 2;
  if (j->yr != NULL) {
    /* The result is where the client asked for it: name that slice. */
    const Qlinear__V1__RegionSlice *want = j->req->msg->linear->y_out;
    qlinear__v1__region_slice__init(&b->yslice);
    b->yslice.region_id = want->region_id;
    b->yslice.offset = want->offset;
    b->yslice.length = want->length;
    b->y.data_case = QLINEAR__V1__TENSOR__DATA_REGION;
    b->y.region = &b->yslice;
  } else if (j->ym != NULL) {
    device_y(&b->y, j->req->msg->linear->y_out_cuda,
             j->req->msg->linear->y_out_ze, &b->ycuda, &b->yze);
  } else {
    b->y.data_case = QLINEAR__V1__TENSOR__DATA_INLINE_DATA;
    b->y.inline_data.data = j->y;
    b->y.inline_data.len = j->y_bytes;
  }
  b->out.y = &b->y;
  b->out.path = (Qlinear__V1__Path)j->path;
  b->out.impl = (char *)(impl ? impl : "");
  r->resp.body_case = QLINEAR__V1__RESPONSE__BODY_LINEAR;
  r->resp.linear = &b->out;
}

static void answer(ql__server *s, lin_req *j) {
  ql__reply r;
  linear_body b;
  int rc = j->sr.status != 0 ? j->sr.status : j->rc;
  s->queued_bytes -= j->cost;
  if (--s->lin->in_flight == 0)
    uv_timer_stop(&s->lin->expire);
  if (j->parent != NULL) {
    part_done(s, j, rc);
    return;
  }
  linear_reply(j, rc, j->impl, &r, &b);
  if (rc == 0 && !j->early) { /* (an early reply was counted then) */
    ql__weight_stats *st = &j->w->stats[j->sr.on_device];
    st->requests++;
    st->rows += j->sr.rows;
    if (j->impl != NULL)
      st->impl = j->impl;
  }
  if (j->early) {
    ql__route_done(j->route, &s->counters.bytes_out);
    /* Called from batch_done, after the launch was accounted. */
    atomic_fetch_add(&s->lin->early_done, 1);
    if (s->lin->waiting != NULL)
      run_settled(s);
  } else {
    ql__reply_send(s, j->route, &r);
  }
  ql__weight_unref(j->w);
  /* A region destroyed (or whose session ended) while this waited is
   * unmapped here, by its last reference. */
  ql__region_unref(j->xr);
  ql__region_unref(j->yr);
  /* An import the session let go of is closed here, by its last user. */
  int y_ours = j->yr == NULL && j->ym == NULL;
  release_device(j);
  ql__request_free(j->req);
  if (y_ours)
    free(j->y);
  free(j);
}

static void answer_list(ql__server *s, ql__sched_req *list) {
  while (list != NULL) {
    ql__sched_req *next = list->next;
    answer(s, of(list));
    list = next;
  }
}

/* ----------------------------------------------------------- batches */

/* The kernel of (weight, path, dtype) for m rows on backend b; NULL: none
 * can run it. */
static const ql_kernel_impl *kernel(const ql_backend *b, const ql_qweight *q,
                                    ql_path path, ql_dtype dt, int64_t m) {
  ql_op op = path == QL_PATH_WEIGHT_ONLY ? QL_OP_LINEAR_WO : QL_OP_LINEAR_AQ;
  return ql_dispatch(b, op, q->format, dt, m, q->n, q->k);
}

/* The same for x and y in device memory; NULL: the backend cannot. */
static const ql_kernel_impl *kernel_dev(const ql_backend *b,
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
    ql__reply r;
    linear_body b;
    linear_reply(j, 0, bj->impl, &r, &b);
    atomic_fetch_add(&bj->s->lin->early_sent, 1);
    j->early = ql__route_early(j->route, &r.resp);
    if (!j->early) /* settled already; batch_done runs what it held */
      atomic_fetch_add(&bj->s->lin->early_done, 1);
    any |= j->early;
  }
  /* Fault injection: a worker descheduled between its early replies and
   * handing the job back, so that clients act on them first. */
  if (any && bj->s->test_early_delay_ms > 0) {
    struct timespec ts = {(time_t)(bj->s->test_early_delay_ms / 1000),
                          (long)(bj->s->test_early_delay_ms % 1000) *
                              1000000L};
    nanosleep(&ts, NULL);
  }
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
  if (bj->s->test_piece_delay_us > 0) {
    struct timespec ts = {(time_t)(bj->s->test_piece_delay_us / 1000000),
                          (long)(bj->s->test_piece_delay_us % 1000000) *
                              1000L};
    nanosleep(&ts, NULL);
  }
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
  if (s->test_delay_ms > 0) {
    struct timespec ts = {(time_t)(s->test_delay_ms / 1000),
                          (long)(s->test_delay_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
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
      pump(s);
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
  }
  if (device_rc != 0)
    ql__device_fail(s, d, device_rc);
  st->batches++;
  if (of(b->slice[0].req)->path == QL_PATH_WEIGHT_ONLY)
    st->wo_batches++;
  else
    st->aq_batches++;
  st->kernel_ns += kernel_ns;
  /* The worker's end: replies may have left then (early), and the
   * clients' next rows with them. A failure holds nothing. */
  b->end_ns = bj->rc == 0 ? job->end_ns : 0;
  ql__sched_complete(s->lin->sched, b, bj->rc == 0 ? kernel_ns : 0, &finished);
  d->busy--;
  batch_free(bj);
  answer_list(s, finished);
  /* (Replies the worker could not send early were settled there.) */
  if (s->lin->waiting != NULL)
    run_settled(s);
  pump(s);
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
    answer_list(s, finished);
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
    answer_list(s, bj->b.expired);
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
      }
    }
    if (d->failed)
      bj->rc = QL_EDEVICE;
    /* A client waiting on its ring may spin unless this launch takes
     * every CPU (the CPU device with a thread per CPU). */
    int spare = !d->host || !s->lin->cpu_saturated;
    /* Prefill on a device whose kernels stop runs in parts, unless a
     * request's tensors are device memory (run slice by slice). */
    bj->in_parts = d->b->linear_parts && bj->b.path == QL_PATH_ACT_QUANT;
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

static void pump(ql__server *s) {
  for (unsigned d = 0; d < s->n_dev; d++)
    pump_device(s, &s->dev[d]);
}

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
static ql_path auto_path(const ql__server *s, const ql__weight *w,
                         uint64_t holders, uint64_t m, int *on) {
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
      kernel(on >= 0 ? s->dev[on].b : NULL, w->q, QL_PATH_ACT_QUANT, dt,
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
    const ql_kernel_impl *im = kernel_dev(ipc_dev->b, w->q, path, dt,
                                          (int64_t)m);
    if (im == NULL && path == QL_PATH_ACT_QUANT &&
        want != QL_PATH_ACT_QUANT) {
      path = QL_PATH_WEIGHT_ONLY;
      im = kernel_dev(ipc_dev->b, w->q, path, dt, (int64_t)m);
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
  s->lin->in_flight++;
  /* Deadlines are checked at every launch; while a long batch runs this
   * timer answers the expired ones on time. */
  if (j->sr.deadline_ns != 0 && !uv_is_active((uv_handle_t *)&s->lin->expire))
    uv_timer_start(&s->lin->expire, on_expire, 5, 5);
  pump(s);
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
    ql__reply_error(s, route, req->msg->request_id, QL_ESHUTDOWN,
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
  ql__reply_send(s, route, &r);
  ql__request_free(req);
}

int ql__linear_submit(ql__server *s, ql__session *ss, ql__request *req,
                      void *route, ql__reply *r) {
  const Qlinear__V1__LinearRequest *l = req->msg->linear;
  return submit_one(s, ss, req, route, NULL, 0, l->weight, l->x,
                    (ql_path)l->path, l->y_out, l->y_out_cuda, l->y_out_ze,
                    l->device, r);
}

int ql__linear_submit_multi(ql__server *s, ql__session *ss, ql__request *req,
                            void *route, ql__reply *r) {
  const Qlinear__V1__LinearMultiRequest *l = req->msg->linear_multi;
  size_t inline_bytes = 0;
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
    multi_answer(s, mu);
  return 1;
}

/* ---------------------------------------------------------- the end */

void ql__linear_session_ended(ql__server *s, uint64_t session_id) {
  ql__sched_req *out = NULL;
  if (s->lin == NULL)
    return;
  ql__sched_remove_session(s->lin->sched, session_id, QL_ESESSION, &out);
  answer_list(s, out);
}

void ql__linear_cancel_waiting(ql__server *s) {
  ql__sched_req *out = NULL;
  if (s->lin == NULL)
    return;
  ql__sched_remove_all(s->lin->sched, QL_ESHUTDOWN, &out);
  answer_list(s, out);
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
