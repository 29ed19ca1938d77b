/* answer.c - see linear_impl.h: the replies to Linear and LinearMulti
 * requests. */
#include <stdio.h>
#include <stdlib.h>

#include "dispatch/linear_impl.h"
#include "wire/route.h"

/* ----------------------------------------------------------- replies */


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

void ql__lin_multi_answer(ql__server *s, multi *mu) {
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
  ql__reply_send(&s->replies, mu->route, &r);
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

/* A request that ended with success, from its admission to end_ns: the
 * latency histogram of its path. */
static void count_latency(ql__server *s, const lin_req *j, uint64_t end_ns) {
  int p = ql__path_slot(j->path);
  if (p >= 0 && j->sr.enqueue_ns != 0 && end_ns >= j->sr.enqueue_ns)
    ql__hist_add(&s->mcounts.latency[p], end_ns - j->sr.enqueue_ns);
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
    ql__counts_request(&s->mcounts, j->w, j->sr.on_device, j->sr.rows);
    count_latency(s, j, ql__now_ns());
  }
  ql__weight_unref(j->w);
  ql__region_unref(j->xr);
  ql__region_unref(j->yr);
  release_device(j);
  free(j);
  if (--mu->pending == 0)
    ql__lin_multi_answer(s, mu);
}


/*
 * Makes r the reply to Linear request j, which ended with rc and ran impl;
 * its bodies live in b. Touches nothing but j's request and result, so
 * that a worker can build it too (the early reply of batch_run).
 */
void ql__lin_reply(const lin_req *j, int rc, const char *impl, ql__reply *r,
                   linear_body *b) {
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
  if (j->tenant != NULL) {
    j->tenant->queued_bytes -= j->cost;
    j->tenant->queued_jobs--;
    ql__tenant_release(&s->tenants, j->tenant);
    j->tenant = NULL;
  }
  if (--s->lin->in_flight == 0)
    uv_timer_stop(&s->lin->expire);
  if (j->parent != NULL) {
    part_done(s, j, rc);
    return;
  }
  ql__lin_reply(j, rc, j->impl, &r, &b);
  if (rc == 0 && !j->early) { /* (an early reply was counted then) */
    ql__weight_stats *st = &j->w->stats[j->sr.on_device];
    st->requests++;
    st->rows += j->sr.rows;
    if (j->impl != NULL)
      st->impl = j->impl;
    ql__counts_request(&s->mcounts, j->w, j->sr.on_device, j->sr.rows);
  }
  /* An early reply left when its launch ended, not now. */
  if (rc == 0)
    count_latency(s, j, j->early ? j->done_ns : ql__now_ns());
  if (j->early) {
    ql__route_done(j->route, &s->counters.bytes_out);
    /* Called from batch_done, after the launch was accounted. */
    atomic_fetch_add(&s->lin->early_done, 1);
    if (s->lin->waiting != NULL)
      ql__lin_run_settled(s);
  } else {
    ql__reply_send(&s->replies, j->route, &r);
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

void ql__lin_answer_list(ql__server *s, ql__sched_req *list) {
  while (list != NULL) {
    ql__sched_req *next = list->next;
    answer(s, of(list));
    list = next;
  }
}
