/*
 * stage.c - libqlinear: staging regions and the choice between the ring and a
 * message.
 */
#include "internal.h"

/* ------------------------------------------------------------ fast path */

/*
 * A staging region of at least need bytes, marked busy, or NULL (no slot
 * free, or the daemon refused a region): the caller then uses the message
 * path, so this never changes ql_errmsg().
 */
stage *ql__stage_take(ql_client *c, size_t need) {
  stage *best = NULL, *empty = NULL, *victim = NULL;
  ql_region *old = NULL, *reg = NULL;
  pthread_mutex_lock(&c->lock);
  for (size_t i = 0; i < STAGE_SLOTS; i++) {
    stage *st = &c->stages[i];
    if (st->reg == NULL) {
      /* (busy with no region: another call is making one there) */
      if (empty == NULL && !st->busy)
        empty = st;
    } else if (!st->busy && st->reg->size >= need &&
               (best == NULL || st->reg->size < best->reg->size)) {
      best = st;
    } else if (!st->busy && victim == NULL) {
      victim = st;
    }
  }
  if (best != NULL) {
    best->busy = true;
    pthread_mutex_unlock(&c->lock);
    return best;
  }
  /* A new one, in an empty slot or instead of a free one too small. */
  stage *st = empty != NULL ? empty : victim;
  if (st == NULL) {
    pthread_mutex_unlock(&c->lock);
    return NULL;
  }
  old = st->reg;
  st->reg = NULL;
  st->busy = true; /* reserved while the region is made */
  pthread_mutex_unlock(&c->lock);
  char saved[ERRBUF_SIZE];
  memcpy(saved, ql__errbuf, sizeof saved);
  if (old != NULL)
    ql_region_destroy(c, old);
  size_t size = STAGE_MIN_BYTES;
  while (size < need)
    size *= 2;
  int rv = ql_region_create(c, size, &reg);
  memcpy(ql__errbuf, saved, sizeof saved);
  pthread_mutex_lock(&c->lock);
  st->c = c;
  st->reg = rv == 0 ? reg : NULL;
  st->busy = rv == 0;
  pthread_mutex_unlock(&c->lock);
  return rv == 0 ? st : NULL;
}

void ql__stage_put(stage *st) {
  if (st == NULL)
    return;
  pthread_mutex_lock(&st->c->lock);
  st->busy = false;
  pthread_mutex_unlock(&st->c->lock);
}

/* The ring's late callback: the reply of an abandoned request came, so
 * nothing writes to its stage any more. */
static void stage_late(void *arg) { ql__stage_put(arg); }

/* A stage a request may still write (it timed out on the message path,
 * where no late reply is ever seen): never used again. */
static void stage_poison(stage *st) {
  pthread_mutex_lock(&st->c->lock);
  ql_region *reg = st->reg;
  st->reg = NULL;
  st->busy = false;
  pthread_mutex_unlock(&st->c->lock);
  char saved[ERRBUF_SIZE];
  memcpy(saved, ql__errbuf, sizeof saved);
  /* The daemon keeps its mapping while the request runs. */
  ql_region_destroy(st->c, reg);
  memcpy(ql__errbuf, saved, sizeof saved);
}

/* Whether req can travel on the ring: a linear request whose results go
 * to regions or device memory (a completion carries no tensor data). */
static bool ring_carries(const Request *req) {
  if (req->body_case == QLINEAR__V1__REQUEST__BODY_LINEAR)
    return req->linear->y_out != NULL || req->linear->y_out_cuda != NULL ||
           req->linear->y_out_ze != NULL;
  if (req->body_case == QLINEAR__V1__REQUEST__BODY_LINEAR_MULTI)
    return req->linear_multi->n_y_out != 0 ||
           req->linear_multi->n_y_out_cuda != 0 ||
           req->linear_multi->n_y_out_ze != 0;
  return false;
}

/*
 * One request and its checked reply, on the session's ring when it can
 * carry it, else over a request socket (ql__call()). st is the staging region
 * the request writes, or NULL. On success *out is the caller's, and so is
 * st. On failure st is disposed of here: back in the pool, or kept by a
 * request still in flight until its reply comes, or never used again.
 */
int ql__exchange(ql_client *c, Request *req, BodyCase want, int timeout_ms,
                 stage *st, Response **out) {
  int rv;
  *out = NULL;
  if (c->ring != NULL && ring_carries(req)) {
    char why[256];
    Response *resp = NULL;
    req->request_id = ql__request_id_new();
    /* The ring is the session's: no token travels. */
    req->session_token.data = NULL;
    req->session_token.len = 0;
    rv = ql__cring_call(c->ring, req, timeout_ms, c->sess_fd,
                        st != NULL ? stage_late : NULL, st, &resp, why,
                        sizeof why);
    if (rv != QL__CRING_FALLBACK) {
      if (rv != 0) {
        /* A timed-out request keeps st until its reply: stage_late. */
        if (rv != QL_ETIMEDOUT)
          ql__stage_put(st);
        return ql__err_set(rv, "%s", why);
      }
      if ((rv = ql__reply_check(req, resp, want)) != 0) {
        qlinear__v1__response__free_unpacked(resp, NULL);
        ql__stage_put(st);
        return rv;
      }
      *out = resp;
      return 0;
    }
  }
  rv = ql__call(c, req, want, timeout_ms, out);
  if (rv == QL_ETIMEDOUT && st != NULL)
    stage_poison(st);
  else if (rv != 0)
    ql__stage_put(st);
  return rv;
}
