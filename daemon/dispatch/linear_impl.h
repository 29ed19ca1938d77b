/*
 * linear_impl.h - what the dispatcher's three files share (linear.h is
 * its interface): admit.c takes Linear and LinearMulti requests in
 * (tensors, device, path, queueing), batch.c runs them (the scheduler's
 * queues, batches on the device workers, launches in parts, the settle
 * waits and the dispatcher's state), answer.c answers them (replies,
 * LinearMulti's parts, early replies). Loop thread, but where a function
 * says a worker calls it.
 */
#ifndef QL_LINEAR_IMPL_H
#define QL_LINEAR_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "state/devices.h"
#include "state/ipc.h"
#include "dispatch/linear.h"
#include "registry.h"
#include "dispatch/scheduler.h"
#include "state/session.h"
#include "state/worker.h"

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
static inline int key_index(ql_dtype dt, ql_path path) {
  return (int)(dt & 3) * 2 + (path == QL_PATH_ACT_QUANT);
}

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
  ql__tenant *tenant; /* its session's uid, which counts it and cost
                         (NULL: not counted) */
  ql_dtype dt;
  ql_path path;
  int rc;           /* the first error of a batch it was in */
  int early;        /* its reply went from the worker (route.h early) */
  const char *impl; /* of its last launch (static) */
  uint64_t first_ns; /* when its first rows started (0: not yet) */
  uint64_t done_ns;  /* when the launch that finished it ended (the time
                        of an early reply) */
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
  /* AUTO requests waiting for a crossover being measured (admit.c),
   * oldest first. */
  struct xover_wait *xwaiting, **xwaiting_tail;
  size_t n_xwaiting;
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

static inline lin_req *of(ql__sched_req *sr) {
  return (lin_req *)((char *)sr - offsetof(lin_req, sr));
}

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

/* The bodies a Linear reply points to. */
typedef struct linear_body {
  Qlinear__V1__LinearResponse out;
  Qlinear__V1__Tensor y;
  Qlinear__V1__RegionSlice yslice;
  Qlinear__V1__CudaIpcSlice ycuda;
  Qlinear__V1__ZeIpcSlice yze;
  uint64_t shape[2];
} linear_body;

/* batch.c */
/* Gives every device with work and a free lane its next batch. */
void ql__lin_pump(ql__server *s);
/* Runs the settle waits whose early replies have all been accounted. */
void ql__lin_run_settled(ql__server *s);
/* The expiry timer: answers requests past their deadline while the
 * worker is busy. */
void ql__lin_on_expire(uv_timer_t *t);
/* The kernel of (weight, path, dtype) for m rows on backend b, for x and
 * y in host memory (ql__lin_kernel) or in device memory (_dev); NULL:
 * none can run it. */
const ql_kernel_impl *ql__lin_kernel(const ql_backend *b, const ql_qweight *q,
                                     ql_path path, ql_dtype dt, int64_t m);
const ql_kernel_impl *ql__lin_kernel_dev(const ql_backend *b,
                                         const ql_qweight *q, ql_path path,
                                         ql_dtype dt, int64_t m);

/* admit.c: the requests that wait for a crossover. Drops those of
 * session_id (0: all), answering each with code when it is not 0. */
void ql__lin_drop_xwaiting(ql__server *s, uint64_t session_id, int code);

/* answer.c */
/* Makes r the reply to Linear request j, which ended with rc and ran
 * impl; its bodies live in b. Touches nothing but j's request and result,
 * so that a worker can build it too (an early reply). */
void ql__lin_reply(const lin_req *j, int rc, const char *impl, ql__reply *r,
                   linear_body *b);
/* Answers LinearMulti mu once its last part is done, and frees it. */
void ql__lin_multi_answer(ql__server *s, multi *mu);
/* Answers and frees every request of list (the scheduler's, linked by
 * next). */
void ql__lin_answer_list(ql__server *s, ql__sched_req *list);

#endif /* QL_LINEAR_IMPL_H */
