/*
 * test_scheduler.c - the scheduler's policy (DESIGN §6) on a fake clock
 * (plain numbers) and fake devices: FIFO queues, coalescing with each
 * request getting its own rows back, decode before prefill, prefill in
 * chunks, oldest-first fairness, max_queue_delay_us, the decode hold,
 * deadlines,
 * backpressure, removal by session and at shutdown, device choice, the
 * counters, and a randomized check of the invariants against a model.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <check.h>

#include "dispatch/scheduler.h"
#include "testutil.h"

#define WO QL_SCHED_DECODE
#define AQ QL_SCHED_PREFILL
#define US 1000u /* ns */

/* Weight keys: only their addresses matter. */
static const char W1, W2, W3;

static ql__sched_config cfg_default(void) {
  ql__sched_config c = {.max_batch_rows = 64,
                        .max_queue_delay_us = 0,
                        .prefill_chunk_rows = 0,
                        .max_queue = 16,
                        .session_quota = 0,
                        .n_devices = 1,
                        .default_ns_per_row = 0};
  return c;
}

static ql__sched *mk(const ql__sched_config *c) {
  ql__sched *s = NULL;
  ck_assert_int_eq(ql__sched_create(c, &s), 0);
  ck_assert_ptr_nonnull(s);
  return s;
}

/* A request for device 0 without a deadline. */
static void rq(ql__sched_req *r, const void *w, ql__sched_class p, uint32_t rows,
               uint64_t session) {
  memset(r, 0, sizeof *r);
  r->weight = w;
  r->device = 0;
  r->cls = p;
  r->rows = rows;
  r->session = session;
}

/* A batch with room for cap slices in sl. */
static void bt(ql__sched_batch *b, ql__sched_slice *sl, uint32_t cap) {
  memset(b, 0, sizeof *b);
  b->slice = sl;
  b->cap = cap;
}

static int list_len(const ql__sched_req *l) {
  int n = 0;
  for (; l != NULL; l = l->next)
    n++;
  return n;
}

static int in_list(const ql__sched_req *l, const ql__sched_req *r) {
  for (; l != NULL; l = l->next)
    if (l == r)
      return 1;
  return 0;
}

static void slice_is(const ql__sched_batch *b, uint32_t i,
                     const ql__sched_req *r, uint32_t off, uint32_t rows) {
  ck_assert_uint_lt(i, b->n);
  ck_assert_ptr_eq(b->slice[i].req, r);
  ck_assert_uint_eq(b->slice[i].offset, off);
  ck_assert_uint_eq(b->slice[i].rows, rows);
}

START_TEST(test_config) {
  ql__sched *s = (ql__sched *)&s;
  ql__sched_config c = cfg_default();
  ck_assert_int_eq(ql__sched_create(NULL, &s), QL_EINVAL);
  ck_assert_ptr_null(s);
  c.max_batch_rows = 0;
  ck_assert_int_eq(ql__sched_create(&c, &s), QL_EINVAL);
  c = cfg_default();
  c.max_queue = 0;
  ck_assert_int_eq(ql__sched_create(&c, &s), QL_EINVAL);
  c = cfg_default();
  c.n_devices = 0;
  ck_assert_int_eq(ql__sched_create(&c, &s), QL_EINVAL);
  c.n_devices = QL_SCHED_MAX_DEVICES + 1;
  ck_assert_int_eq(ql__sched_create(&c, &s), QL_EINVAL);
  c = cfg_default();
  c.max_queue_delay_us = QL_SCHED_MAX_DELAY_US + 1;
  ck_assert_int_eq(ql__sched_create(&c, &s), QL_EINVAL);
  ck_assert_ptr_null(s);
  ql__sched_free(NULL);

  /* 64 devices: the whole mask. */
  c = cfg_default();
  c.n_devices = QL_SCHED_MAX_DEVICES;
  s = mk(&c);
  ql__sched_req r;
  rq(&r, &W1, WO, 1, 1);
  r.device = -1;
  r.holders = (uint64_t)1 << 63;
  ck_assert_int_eq(ql__sched_submit(s, &r, 0), 0);
  ck_assert_uint_eq(r.on_device, 63);
  /* Reconfigure: the device count is fixed, the rest changes. */
  ck_assert_int_eq(ql__sched_configure(s, &c), 0);
  c.n_devices = 2;
  ck_assert_int_eq(ql__sched_configure(s, &c), QL_EINVAL);
  c.n_devices = QL_SCHED_MAX_DEVICES;
  c.max_batch_rows = 0;
  ck_assert_int_eq(ql__sched_configure(s, &c), QL_EINVAL);
  /* Free with a request inside: the request is not touched. */
  ql__sched_free(s);
  ck_assert_ptr_eq(r.weight, &W1);
}
END_TEST

START_TEST(test_submit_invalid) {
  ql__sched_config c = cfg_default();
  c.n_devices = 2;
  ql__sched *s = mk(&c);
  ql__sched_req r;
  rq(&r, NULL, WO, 1, 1);
  ck_assert_int_eq(ql__sched_submit(s, &r, 0), QL_EINVAL);
  rq(&r, &W1, WO, 0, 1);
  ck_assert_int_eq(ql__sched_submit(s, &r, 0), QL_EINVAL);
  rq(&r, &W1, (ql__sched_class)0, 1, 1);
  ck_assert_int_eq(ql__sched_submit(s, &r, 0), QL_EINVAL);
  rq(&r, &W1, (ql__sched_class)7, 1, 1);
  ck_assert_int_eq(ql__sched_submit(s, &r, 0), QL_EINVAL);
  rq(&r, &W1, WO, 1, 1);
  r.device = 2;
  ck_assert_int_eq(ql__sched_submit(s, &r, 0), QL_EINVAL);
  r.device = -1;
  r.holders = 0;
  ck_assert_int_eq(ql__sched_submit(s, &r, 0), QL_ENOTFOUND);
  r.holders = 4; /* only a device that does not exist */
  ck_assert_int_eq(ql__sched_submit(s, &r, 0), QL_ENOTFOUND);
  ck_assert_uint_eq(ql__sched_session_count(s, 1), 0);
  ql__sched_batch b;
  ql__sched_slice sl[4];
  bt(&b, sl, 4);
  ck_assert_int_eq(ql__sched_next(s, 2, 0, &b), QL_EINVAL);
  bt(&b, sl, 0);
  ck_assert_int_eq(ql__sched_next(s, 0, 0, &b), QL_EINVAL);
  bt(&b, NULL, 4);
  ck_assert_int_eq(ql__sched_next(s, 0, 0, &b), QL_EINVAL);
  ck_assert_uint_eq(b.n, 0);
  ck_assert_int_eq(ql__sched_set_cost(s, &W1, 2, WO, 1), QL_EINVAL);
  ck_assert_int_eq(ql__sched_set_cost(s, &W1, 0, (ql__sched_class)0, 1), QL_EINVAL);
  ck_assert_int_eq(ql__sched_set_cost(s, NULL, 0, WO, 1), QL_EINVAL);
  ql__sched_stats st;
  ck_assert_int_eq(ql__sched_stats_get(s, &W1, 0, &st), QL_ENOTFOUND);
  ck_assert_int_eq(ql__sched_stats_get(s, &W1, 9, &st), QL_ENOTFOUND);
  ck_assert_uint_eq(ql__sched_waiting(s, &W1, 9, WO), 0);
  ck_assert_uint_eq(ql__sched_device_load(s, 9), 0);
  ql__sched_free(s);
}
END_TEST

/* Within one queue requests leave in submit order. */
START_TEST(test_fifo) {
  ql__sched_config c = cfg_default();
  c.max_batch_rows = 2;
  ql__sched *s = mk(&c);
  ql__sched_req r[5];
  for (int i = 0; i < 5; i++) {
    rq(&r[i], &W1, WO, 1, 1);
    ck_assert_int_eq(ql__sched_submit(s, &r[i], (uint64_t)i), 0);
    ck_assert_uint_eq(r[i].enqueue_ns, (uint64_t)i);
    ck_assert_uint_eq(r[i].on_device, 0);
  }
  ck_assert_uint_eq(ql__sched_waiting(s, &W1, 0, WO), 5);
  ck_assert_uint_eq(ql__sched_session_count(s, 1), 5);
  ql__sched_batch b;
  ql__sched_slice sl[8];
  ql__sched_req *fin;
  for (int k = 0; k < 3; k++) {
    bt(&b, sl, 8);
    ck_assert_int_eq(ql__sched_next(s, 0, 10, &b), 0);
    ck_assert_uint_eq(b.n, k < 2 ? 2 : 1);
    ck_assert_ptr_eq(b.weight, &W1);
    ck_assert_int_eq(b.cls, WO);
    ck_assert_uint_eq(b.device, 0);
    for (uint32_t i = 0; i < b.n; i++)
      slice_is(&b, i, &r[2 * k + (int)i], 0, 1);
    ql__sched_complete(s, &b, 1000, &fin);
    ck_assert_int_eq(list_len(fin), (int)b.n);
    for (uint32_t i = 0; i < b.n; i++, fin = fin->next) {
      ck_assert_ptr_eq(fin, &r[2 * k + (int)i]);
      ck_assert_int_eq(fin->status, 0);
    }
    /* Completing twice does nothing. */
    ql__sched_complete(s, &b, 1000, &fin);
    ck_assert_ptr_null(fin);
  }
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 10, &b), 0);
  ck_assert_uint_eq(b.n, 0);
  ck_assert_uint_eq(b.retry_ns, 0);
  ck_assert_ptr_null(b.expired);
  ck_assert_uint_eq(ql__sched_session_count(s, 1), 0);
  ck_assert_uint_eq(ql__sched_device_load(s, 0), 0);
  ql__sched_free(s);
}
END_TEST

/*
 * Every waiting request of the queue runs in one launch up to
 * max_batch_rows; a request that does not fit is split, its rest staying
 * at the head. A fake kernel (y = 2x + 1 on each batch row) gathers x by
 * slice and scatters y back: each request gets exactly its own rows.
 */
/* Tenants: with another tenant's requests queued first, a launch takes
 * the oldest request of each tenant before more of the first one's; with
 * one tenant the order is oldest first, as test_fifo. */
START_TEST(test_tenants) {
  ql__sched_config c = cfg_default();
  c.max_batch_rows = 16;
  ql__sched *s = mk(&c);
  enum { A = 6 };
  ql__sched_req a[A], v, v2;
  for (int i = 0; i < A; i++) {
    rq(&a[i], &W1, WO, 8, 1);
    a[i].tenant = 7;
    ck_assert_int_eq(ql__sched_submit(s, &a[i], (uint64_t)i), 0);
  }
  rq(&v, &W1, WO, 1, 2);
  v.tenant = 9;
  ck_assert_int_eq(ql__sched_submit(s, &v, 10), 0);
  rq(&v2, &W1, WO, 1, 2);
  v2.tenant = 9;
  ck_assert_int_eq(ql__sched_submit(s, &v2, 11), 0);
  ql__sched_batch b;
  ql__sched_slice sl[8];
  ql__sched_req *fin;
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 20, &b), 0);
  /* a[0] whole, v (the other tenant's oldest), then a[1] cut to fit. */
  ck_assert_uint_eq(b.rows, 16);
  ck_assert_uint_eq(b.n, 3);
  slice_is(&b, 0, &a[0], 0, 8);
  slice_is(&b, 1, &v, 0, 1);
  slice_is(&b, 2, &a[1], 0, 7);
  ql__sched_complete(s, &b, 1000, &fin);
  ck_assert_int_eq(list_len(fin), 2);
  ck_assert(in_list(fin, &a[0]) && in_list(fin, &v));
  /* Next: a[1]'s last row (the head), v2, a[2] whole, a[3] cut. */
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 2000, &b), 0);
  slice_is(&b, 0, &a[1], 7, 1);
  slice_is(&b, 1, &v2, 0, 1);
  slice_is(&b, 2, &a[2], 0, 8);
  slice_is(&b, 3, &a[3], 0, 6);
  ql__sched_complete(s, &b, 3000, &fin);
  ck_assert_int_eq(list_len(fin), 3);
  ql__sched_remove_all(s, QL_ESHUTDOWN, &fin);
  ql__sched_free(s);
}
END_TEST

START_TEST(test_coalesce) {
  enum { K = 3, NR = 6 };
  static const uint32_t rows[NR] = {3, 1, 5, 2, 4, 7}; /* 22 rows */
  ql__sched_config c = cfg_default();
  c.max_batch_rows = 10;
  ql__sched *s = mk(&c);
  ql__sched_req r[NR];
  float x[NR][7][K], y[NR][7][K];
  int finished[NR] = {0};
  for (int i = 0; i < NR; i++) {
    rq(&r[i], &W1, WO, rows[i], 1);
    for (uint32_t m = 0; m < rows[i]; m++)
      for (int k = 0; k < K; k++)
        x[i][m][k] = (float)(i * 100 + (int)m * 10 + k);
    ck_assert_int_eq(ql__sched_submit(s, &r[i], 0), 0);
  }
  memset(y, 0, sizeof y);
  /* Another queue (other weight, other class) never joins. */
  ql__sched_req other, other2;
  rq(&other, &W2, WO, 1, 1);
  rq(&other2, &W1, AQ, 1, 1);
  ck_assert_int_eq(ql__sched_submit(s, &other, 1), 0);
  ck_assert_int_eq(ql__sched_submit(s, &other2, 1), 0);

  ql__sched_batch b;
  ql__sched_slice sl[16];
  const uint32_t want_rows[3] = {10, 10, 2};
  for (int k = 0; k < 3; k++) {
    bt(&b, sl, 16);
    ck_assert_int_eq(ql__sched_next(s, 0, 5, &b), 0);
    ck_assert_ptr_eq(b.weight, &W1);
    ck_assert_int_eq(b.cls, WO);
    ck_assert_uint_eq(b.rows, want_rows[k]);
    if (k == 0) {
      slice_is(&b, 0, &r[0], 0, 3);
      slice_is(&b, 1, &r[1], 0, 1);
      slice_is(&b, 2, &r[2], 0, 5);
      slice_is(&b, 3, &r[3], 0, 1); /* split */
      ck_assert_uint_eq(b.n, 4);
      ck_assert_uint_eq(ql__sched_waiting(s, &W1, 0, WO), 3);
    } else if (k == 1) {
      slice_is(&b, 0, &r[3], 1, 1);
      slice_is(&b, 1, &r[4], 0, 4);
      slice_is(&b, 2, &r[5], 0, 5);
      ck_assert_uint_eq(b.n, 3);
    } else {
      slice_is(&b, 0, &r[5], 5, 2);
      ck_assert_uint_eq(b.n, 1);
    }
    /* The launch: gather, compute, scatter. */
    float bx[16][K], by[16][K];
    uint32_t row = 0;
    for (uint32_t i = 0; i < b.n; i++) {
      int id = (int)(b.slice[i].req - r);
      for (uint32_t m = 0; m < b.slice[i].rows; m++, row++)
        memcpy(bx[row], x[id][b.slice[i].offset + m], sizeof bx[row]);
    }
    ck_assert_uint_eq(row, b.rows);
    for (uint32_t m = 0; m < row; m++)
      for (int kk = 0; kk < K; kk++)
        by[m][kk] = 2 * bx[m][kk] + 1;
    ql__sched_req *fin;
    ql__sched_complete(s, &b, 500, &fin);
    row = 0;
    for (uint32_t i = 0; i < b.n; i++) {
      int id = (int)(b.slice[i].req - r);
      for (uint32_t m = 0; m < b.slice[i].rows; m++, row++)
        memcpy(y[id][b.slice[i].offset + m], by[row], sizeof by[row]);
    }
    for (; fin != NULL; fin = fin->next) {
      int id = (int)(fin - r);
      ck_assert_int_eq(finished[id], 0);
      finished[id] = 1;
      ck_assert_int_eq(fin->status, 0);
    }
  }
  for (int i = 0; i < NR; i++) {
    ck_assert_int_eq(finished[i], 1);
    for (uint32_t m = 0; m < rows[i]; m++)
      for (int k = 0; k < K; k++)
        ck_assert(y[i][m][k] == 2 * x[i][m][k] + 1);
  }
  /* The slice room bounds a batch too. */
  ql__sched_req t[3];
  for (int i = 0; i < 3; i++) {
    rq(&t[i], &W3, WO, 1, 2);
    ck_assert_int_eq(ql__sched_submit(s, &t[i], 6), 0);
  }
  /* W2 and W1/AQ are older; take them out of the way. */
  ql__sched_req *fin;
  bt(&b, sl, 16);
  ck_assert_int_eq(ql__sched_next(s, 0, 7, &b), 0);
  slice_is(&b, 0, &other, 0, 1);
  ql__sched_complete(s, &b, 0, &fin);
  bt(&b, sl, 2);
  ck_assert_int_eq(ql__sched_next(s, 0, 7, &b), 0);
  ck_assert_ptr_eq(b.weight, &W3);
  ck_assert_uint_eq(b.n, 2);
  ql__sched_complete(s, &b, 0, &fin);
  ck_assert_int_eq(list_len(fin), 2);
  ql__sched_free(s);
}
END_TEST

/* Decode (WO) queues go before prefill (AQ) queues, even younger ones. */
START_TEST(test_wo_before_aq) {
  ql__sched *s = mk(&(ql__sched_config){
      .max_batch_rows = 64, .max_queue = 8, .n_devices = 1});
  ql__sched_req p, d1, d2;
  rq(&p, &W1, AQ, 32, 1);
  rq(&d1, &W2, WO, 1, 2);
  rq(&d2, &W1, WO, 1, 3);
  ck_assert_int_eq(ql__sched_submit(s, &p, 0), 0);
  ck_assert_int_eq(ql__sched_submit(s, &d1, 10), 0);
  ck_assert_int_eq(ql__sched_submit(s, &d2, 20), 0);
  ql__sched_batch b;
  ql__sched_slice sl[8];
  ql__sched_req *fin;
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 30, &b), 0);
  ck_assert_int_eq(b.cls, WO);
  slice_is(&b, 0, &d1, 0, 1);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 30, &b), 0);
  ck_assert_int_eq(b.cls, WO);
  slice_is(&b, 0, &d2, 0, 1);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 30, &b), 0);
  ck_assert_int_eq(b.cls, AQ);
  slice_is(&b, 0, &p, 0, 32);
  ql__sched_complete(s, &b, 0, &fin);
  ck_assert_ptr_eq(fin, &p);
  ql__sched_free(s);
}
END_TEST

/*
 * A long prefill runs in chunks of prefill_chunk_rows; decode work that
 * arrives meanwhile runs between chunks; the started request stays at its
 * queue's head (a later request of the same queue follows it) and is
 * handed back once, when its last running chunk completes, in any order.
 */
START_TEST(test_prefill_chunks) {
  ql__sched_config c = cfg_default();
  c.max_batch_rows = 16;
  c.prefill_chunk_rows = 4;
  ql__sched *s = mk(&c);
  ql__sched_req p, p2, d;
  rq(&p, &W1, AQ, 10, 1);
  ck_assert_int_eq(ql__sched_submit(s, &p, 0), 0);
  ql__sched_batch b1, b2, b3, bd;
  ql__sched_slice s1[4], s2[4], s3[4], sd[4];
  ql__sched_req *fin;
  bt(&b1, s1, 4);
  ck_assert_int_eq(ql__sched_next(s, 0, 1, &b1), 0);
  ck_assert_int_eq(b1.cls, AQ);
  slice_is(&b1, 0, &p, 0, 4);
  ck_assert_uint_eq(b1.n, 1);
  ck_assert_uint_eq(ql__sched_waiting(s, &W1, 0, AQ), 1);
  /* Decode arrives while the first chunk runs, and a second prefill. */
  rq(&d, &W2, WO, 1, 2);
  ck_assert_int_eq(ql__sched_submit(s, &d, 2), 0);
  rq(&p2, &W1, AQ, 3, 3);
  ck_assert_int_eq(ql__sched_submit(s, &p2, 3), 0);
  bt(&bd, sd, 4);
  ck_assert_int_eq(ql__sched_next(s, 0, 4, &bd), 0);
  ck_assert_int_eq(bd.cls, WO);
  slice_is(&bd, 0, &d, 0, 1);
  bt(&b2, s2, 4);
  ck_assert_int_eq(ql__sched_next(s, 0, 5, &b2), 0);
  slice_is(&b2, 0, &p, 4, 4);
  ck_assert_uint_eq(b2.n, 1);
  bt(&b3, s3, 4);
  ck_assert_int_eq(ql__sched_next(s, 0, 6, &b3), 0);
  slice_is(&b3, 0, &p, 8, 2);
  slice_is(&b3, 1, &p2, 0, 2);
  ck_assert_uint_eq(b3.rows, 4);
  ck_assert_uint_eq(ql__sched_waiting(s, &W1, 0, AQ), 1); /* p2's last row */
  /* Out of order: the last chunk first; p waits for all three. */
  ql__sched_complete(s, &b3, 100, &fin);
  ck_assert_ptr_null(fin);
  ql__sched_complete(s, &bd, 100, &fin);
  ck_assert_ptr_eq(fin, &d);
  ck_assert_ptr_null(fin->next);
  ql__sched_complete(s, &b1, 100, &fin);
  ck_assert_ptr_null(fin);
  ql__sched_complete(s, &b2, 100, &fin);
  ck_assert_ptr_eq(fin, &p);
  ck_assert_ptr_null(fin->next);
  ck_assert_int_eq(p.status, 0);
  bt(&b1, s1, 4);
  ck_assert_int_eq(ql__sched_next(s, 0, 7, &b1), 0);
  slice_is(&b1, 0, &p2, 2, 1);
  ql__sched_complete(s, &b1, 100, &fin);
  ck_assert_ptr_eq(fin, &p2);
  /* A forced weight-only request longer than a batch is split too. */
  ql__sched_req big;
  rq(&big, &W1, WO, 40, 1);
  ck_assert_int_eq(ql__sched_submit(s, &big, 8), 0);
  uint32_t off = 0;
  while (off < 40) {
    bt(&b1, s1, 4);
    ck_assert_int_eq(ql__sched_next(s, 0, 9, &b1), 0);
    slice_is(&b1, 0, &big, off, 40 - off < 16 ? 40 - off : 16);
    off += b1.rows;
    ql__sched_complete(s, &b1, 100, &fin);
    ck_assert_ptr_eq(fin, off == 40 ? &big : NULL);
  }
  ql__sched_stats st;
  ck_assert_int_eq(ql__sched_stats_get(s, &W1, 0, &st), 0);
  ck_assert_uint_eq(st.prefill_batches, 4);
  ck_assert_uint_eq(st.decode_batches, 3);
  ck_assert_uint_eq(st.requests, 3);
  ck_assert_uint_eq(st.rows, 53);
  ql__sched_free(s);
}
END_TEST

/*
 * Oldest-first: a hot weight fed faster than it drains cannot starve a
 * cold weight's old request; the cold one runs as soon as the hot queue's
 * head is younger than it.
 */
START_TEST(test_fairness) {
  for (int cls = 0; cls < 2; cls++) {
    ql__sched_class p = cls ? AQ : WO;
    ql__sched_config c = cfg_default();
    c.max_batch_rows = 2;
    c.max_queue = 1024;
    ql__sched *s = mk(&c);
    static ql__sched_req hot[400];
    ql__sched_req cold;
    int nh = 0, t = 0;
    for (; nh < 4; nh++) {
      rq(&hot[nh], &W1, p, 1, 1);
      ck_assert_int_eq(ql__sched_submit(s, &hot[nh], (uint64_t)t++), 0);
    }
    rq(&cold, &W2, p, 1, 2);
    ck_assert_int_eq(ql__sched_submit(s, &cold, (uint64_t)t++), 0);
    int cold_at = -1;
    for (int step = 0; step < 100; step++) {
      for (int k = 0; k < 3; k++, nh++) {
        rq(&hot[nh], &W1, p, 1, 1);
        ck_assert_int_eq(ql__sched_submit(s, &hot[nh], (uint64_t)t++), 0);
      }
      ql__sched_batch b;
      ql__sched_slice sl[4];
      ql__sched_req *fin;
      bt(&b, sl, 4);
      ck_assert_int_eq(ql__sched_next(s, 0, (uint64_t)t, &b), 0);
      ck_assert_uint_gt(b.n, 0);
      if (b.weight == &W2) {
        ck_assert_int_eq(cold_at, -1);
        cold_at = step;
        slice_is(&b, 0, &cold, 0, 1);
      }
      ql__sched_complete(s, &b, 10, &fin);
    }
    /* Two batches of the four older hot requests, then the cold one. */
    ck_assert_int_eq(cold_at, 2);
    ql__sched_req *out;
    ql__sched_remove_all(s, QL_ESHUTDOWN, &out);
    ck_assert_uint_eq(ql__sched_session_count(s, 1), 0);
    ql__sched_free(s);
  }
}
END_TEST

/* Two equally loaded weights alternate rather than one running on. */
START_TEST(test_fairness_alternate) {
  ql__sched_config c = cfg_default();
  c.max_batch_rows = 1;
  ql__sched *s = mk(&c);
  ql__sched_req a[8], z[8];
  for (int i = 0; i < 8; i++) {
    rq(&a[i], &W1, WO, 1, 1);
    rq(&z[i], &W2, WO, 1, 1);
    ck_assert_int_eq(ql__sched_submit(s, &a[i], 0), 0);
    ck_assert_int_eq(ql__sched_submit(s, &z[i], 0), 0);
  }
  for (int i = 0; i < 16; i++) {
    ql__sched_batch b;
    ql__sched_slice sl[1];
    ql__sched_req *fin;
    bt(&b, sl, 1);
    ck_assert_int_eq(ql__sched_next(s, 0, 1, &b), 0);
    slice_is(&b, 0, i % 2 ? &z[i / 2] : &a[i / 2], 0, 1);
    ql__sched_complete(s, &b, 0, &fin);
  }
  ql__sched_free(s);
}
END_TEST

/* max_queue_delay_us holds a short batch until its oldest request has
 * waited that long, never a full one, and tells when to ask again. */
START_TEST(test_delay) {
  ql__sched_config c = cfg_default();
  c.max_batch_rows = 4;
  c.max_queue_delay_us = 100;
  ql__sched *s = mk(&c);
  ql__sched_req r[8];
  ql__sched_batch b;
  ql__sched_slice sl[8];
  ql__sched_req *fin;
  rq(&r[0], &W1, WO, 1, 1);
  ck_assert_int_eq(ql__sched_submit(s, &r[0], 0), 0);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 10 * US, &b), 0);
  ck_assert_uint_eq(b.n, 0);
  ck_assert_uint_eq(b.retry_ns, 100 * US);
  rq(&r[1], &W1, WO, 1, 1);
  ck_assert_int_eq(ql__sched_submit(s, &r[1], 50 * US), 0);
  ck_assert_int_eq(ql__sched_next(s, 0, 100 * US - 1, &b), 0);
  ck_assert_uint_eq(b.n, 0);
  ck_assert_uint_eq(b.retry_ns, 100 * US); /* the oldest request counts */
  ck_assert_int_eq(ql__sched_next(s, 0, 100 * US, &b), 0);
  ck_assert_uint_eq(b.n, 2);
  slice_is(&b, 0, &r[0], 0, 1);
  slice_is(&b, 1, &r[1], 0, 1);
  ql__sched_complete(s, &b, 0, &fin);
  ck_assert_int_eq(list_len(fin), 2);

  /* A full batch goes at once. */
  for (int i = 2; i < 6; i++) {
    rq(&r[i], &W1, WO, 1, 1);
    ck_assert_int_eq(ql__sched_submit(s, &r[i], 200 * US), 0);
  }
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 200 * US, &b), 0);
  ck_assert_uint_eq(b.n, 4);
  ql__sched_complete(s, &b, 0, &fin);

  /* A held decode queue does not block a due prefill one (a full chunk),
   * and the retry time is the held queue's. */
  rq(&r[6], &W1, WO, 1, 1);
  rq(&r[7], &W2, AQ, 4, 1);
  ck_assert_int_eq(ql__sched_submit(s, &r[6], 300 * US), 0);
  ck_assert_int_eq(ql__sched_submit(s, &r[7], 310 * US), 0);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 320 * US, &b), 0);
  ck_assert_int_eq(b.cls, AQ);
  slice_is(&b, 0, &r[7], 0, 4);
  ql__sched_complete(s, &b, 0, &fin);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 320 * US, &b), 0);
  ck_assert_uint_eq(b.n, 0);
  ck_assert_uint_eq(b.retry_ns, 400 * US);
  ck_assert_int_eq(ql__sched_next(s, 0, 400 * US, &b), 0);
  slice_is(&b, 0, &r[6], 0, 1);
  ql__sched_complete(s, &b, 0, &fin);

  /* The rest of a started request is not held. */
  ql__sched_req big;
  rq(&big, &W1, WO, 6, 1);
  ck_assert_int_eq(ql__sched_submit(s, &big, 500 * US), 0);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 500 * US, &b), 0);
  slice_is(&b, 0, &big, 0, 4);
  ql__sched_batch b2;
  ql__sched_slice sl2[8];
  bt(&b2, sl2, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 500 * US, &b2), 0);
  slice_is(&b2, 0, &big, 4, 2);
  ql__sched_complete(s, &b, 0, &fin);
  ck_assert_ptr_null(fin);
  ql__sched_complete(s, &b2, 0, &fin);
  ck_assert_ptr_eq(fin, &big);

  /* A deadline within the hold ends it: the request runs now rather
   * than expire waiting (a later deadline does not). */
  rq(&r[0], &W1, WO, 1, 1);
  r[0].deadline_ns = 550 * US + 1;
  ck_assert_int_eq(ql__sched_submit(s, &r[0], 510 * US), 0);
  rq(&r[1], &W2, WO, 1, 1);
  r[1].deadline_ns = 700 * US;
  ck_assert_int_eq(ql__sched_submit(s, &r[1], 510 * US), 0);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 520 * US, &b), 0);
  slice_is(&b, 0, &r[0], 0, 1);
  ql__sched_complete(s, &b, 0, &fin);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 520 * US, &b), 0);
  ck_assert_uint_eq(b.n, 0);
  ck_assert_uint_eq(b.retry_ns, 610 * US);
  ck_assert_int_eq(ql__sched_next(s, 0, 610 * US, &b), 0);
  slice_is(&b, 0, &r[1], 0, 1);
  ql__sched_complete(s, &b, 0, &fin);

  /* A lower delay applies from the next call. */
  c.max_queue_delay_us = 10;
  ck_assert_int_eq(ql__sched_configure(s, &c), 0);
  rq(&r[0], &W1, WO, 1, 1);
  ck_assert_int_eq(ql__sched_submit(s, &r[0], 800 * US), 0);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 800 * US, &b), 0);
  ck_assert_uint_eq(b.retry_ns, 810 * US);
  ck_assert_int_eq(ql__sched_next(s, 0, 810 * US, &b), 0);
  ck_assert_uint_eq(b.n, 1);
  ql__sched_complete(s, &b, 0, &fin);
  ql__sched_free(s);
}
END_TEST

/* Submits one WO row of session sess for W1 at now. */
static void sub1(ql__sched *s, ql__sched_req *r, uint64_t sess, uint64_t now) {
  rq(r, &W1, WO, 1, sess);
  ck_assert_int_eq(ql__sched_submit(s, r, now), 0);
}

/* next() at now: the rows it launched (0: held, retry_ns in *retry). */
static uint32_t next_rows(ql__sched *s, uint64_t now, ql__sched_batch *b,
                          ql__sched_slice *sl, uint64_t *retry) {
  bt(b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, now, b), 0);
  if (retry != NULL)
    *retry = b->retry_ns;
  return b->rows;
}

/* Completes b as a launch that ended at t (0 kernel ns: the curve stays
 * as set); returns how many requests it finished. */
static int done_at(ql__sched *s, ql__sched_batch *b, uint64_t t) {
  ql__sched_req *fin;
  b->end_ns = t;
  ql__sched_complete(s, b, 0, &fin);
  return list_len(fin);
}

/* Sessions 1 and 2 send a row each at t (r[0] and r[1]), launched
 * together and done at t + 10 us: the next launch may hold for both. */
static void two_out(ql__sched *s, ql__sched_req *r, uint64_t t) {
  ql__sched_batch b;
  ql__sched_slice sl[8];
  sub1(s, &r[0], 1, t);
  sub1(s, &r[1], 2, t);
  ck_assert_uint_eq(next_rows(s, t, &b, sl, NULL), 2);
  ck_assert_int_eq(done_at(s, &b, t + 10 * US), 2);
}

/* Session 1's row comes back at t and launches alone at once. */
static void back_alone(ql__sched *s, ql__sched_req *r, uint64_t t) {
  ql__sched_batch b;
  ql__sched_slice sl[8];
  sub1(s, &r[0], 1, t);
  ck_assert_uint_eq(next_rows(s, t, &b, sl, NULL), 1);
  ck_assert_int_eq(done_at(s, &b, t + 5 * US), 1);
}

/* Session 1's row comes back at t and is held until release; session 2's
 * comes 5 us later and both launch. */
static void back_held(ql__sched *s, ql__sched_req *r, uint64_t t,
                      uint64_t release) {
  ql__sched_batch b;
  ql__sched_slice sl[8];
  uint64_t retry;
  sub1(s, &r[0], 1, t);
  ck_assert_uint_eq(next_rows(s, t, &b, sl, &retry), 0);
  ck_assert_uint_eq(retry, release);
  sub1(s, &r[1], 2, t + 5 * US);
  ck_assert_uint_eq(next_rows(s, t + 5 * US, &b, sl, NULL), 2);
  ck_assert_int_eq(done_at(s, &b, t + 10 * US), 2);
}

/* The hold with r rows waiting for e more, capped. */
static uint64_t hold_of(const ql__sched *s, uint32_t r, uint32_t e,
                        uint64_t cap) {
  uint64_t two = ql__sched_launch_ns(s, &W1, 0, WO, r) +
                 ql__sched_launch_ns(s, &W1, 0, WO, e);
  uint64_t one = ql__sched_launch_ns(s, &W1, 0, WO, r + e);
  ck_assert_uint_gt(two, one);
  return two - one < cap ? two - one : cap;
}

/*
 * decode_hold_us: after a decode launch completes, the queue's next launch
 * waits for the rows it answered to come back, as long as the curve says
 * one launch of them all saves more than the wait (the release moves as
 * rows come), at most decode_hold_us, never past a deadline. The wait
 * counts from the completion when rows were waiting then, else from the
 * first row back; a first row later than a whole hold after the
 * completion holds nothing; a session that sent its next request before
 * the completion is not waited for; a hold that runs out makes the next
 * two completions skip. A held decode queue keeps prefill off the device
 * but does not stop a running one later (ql__sched_yield_ns). A curve in
 * proportion to the rows or steeper, prefill, a launch without an end
 * time and a zero decode_hold_us never hold.
 */
START_TEST(test_decode_hold) {
  ql__sched_config c = cfg_default();
  c.decode_hold_us = 1000;
  ql__sched *s = mk(&c);
  ql__sched_req r[16];
  ql__sched_batch b;
  ql__sched_slice sl[8];
  uint64_t retry;
  const uint64_t cap = 1000 * US;
  /* Memory-bound: 8 rows cost little more than 1 (concave). */
  static const uint32_t m[] = {1, 2, 4, 8};
  static const uint64_t ns[] = {400 * US, 450 * US, 500 * US, 560 * US};
  ck_assert_int_eq(ql__sched_set_curve(s, &W1, 0, m, ns, 4), 0);

  /* No launch yet: no hold. */
  for (int i = 0; i < 4; i++)
    sub1(s, &r[i], 1 + (uint64_t)i, 0);
  ck_assert_uint_eq(next_rows(s, 1, &b, sl, NULL), 4);
  ck_assert_int_eq(done_at(s, &b, 100 * US), 4);

  /* The four come back one by one: held from the first row back, the
   * release moving with what one launch saves, until the fourth. */
  sub1(s, &r[4], 1, 110 * US);
  ck_assert_uint_eq(next_rows(s, 110 * US, &b, sl, &retry), 0);
  ck_assert_uint_eq(retry, 110 * US + hold_of(s, 1, 3, cap));
  sub1(s, &r[5], 2, 120 * US);
  ck_assert_uint_eq(next_rows(s, 121 * US, &b, sl, &retry), 0);
  ck_assert_uint_eq(retry, 110 * US + hold_of(s, 2, 2, cap));
  ck_assert_uint_ne(hold_of(s, 2, 2, cap), hold_of(s, 1, 3, cap));
  sub1(s, &r[6], 3, 130 * US);
  sub1(s, &r[7], 4, 130 * US);
  ck_assert_uint_eq(next_rows(s, 130 * US, &b, sl, NULL), 4);

  /* Session 1 sends its next request before the launch completes (its
   * reply went early): the hold waits for the other three only, and
   * counts from the completion, a row being there already. */
  sub1(s, &r[8], 1, 200 * US);
  ck_assert_int_eq(done_at(s, &b, 700 * US), 4);
  ck_assert_uint_eq(next_rows(s, 705 * US, &b, sl, &retry), 0);
  ck_assert_uint_eq(retry, 700 * US + hold_of(s, 1, 3, cap));
  sub1(s, &r[9], 2, 710 * US);
  sub1(s, &r[10], 3, 710 * US);
  sub1(s, &r[11], 4, 710 * US);
  ck_assert_uint_eq(next_rows(s, 710 * US, &b, sl, NULL), 4);
  ck_assert_int_eq(done_at(s, &b, 800 * US), 4);

  /* Only one comes back: the hold runs out and it goes alone. */
  sub1(s, &r[0], 1, 810 * US);
  ck_assert_uint_eq(next_rows(s, 810 * US, &b, sl, &retry), 0);
  ck_assert_uint_eq(retry, 810 * US + hold_of(s, 1, 3, cap));
  ck_assert_uint_eq(next_rows(s, retry - 1, &b, sl, NULL), 0);
  ck_assert_uint_eq(next_rows(s, retry, &b, sl, NULL), 1);
  uint64_t t = 2000 * US;
  ck_assert_int_eq(done_at(s, &b, t), 1);
  /* So that completion and the next one hold nothing: two rows go out,
   * one comes back first and goes alone. */
  sub1(s, &r[0], 1, t + 10 * US);
  sub1(s, &r[1], 2, t + 10 * US);
  ck_assert_uint_eq(next_rows(s, t + 10 * US, &b, sl, NULL), 2);
  ck_assert_int_eq(done_at(s, &b, t + 20 * US), 2);
  sub1(s, &r[0], 1, t + 30 * US);
  ck_assert_uint_eq(next_rows(s, t + 30 * US, &b, sl, NULL), 1);
  ck_assert_int_eq(done_at(s, &b, t + 40 * US), 1);
  /* The ones after hold again. */
  sub1(s, &r[0], 1, t + 50 * US);
  sub1(s, &r[1], 2, t + 50 * US);
  ck_assert_uint_eq(next_rows(s, t + 50 * US, &b, sl, NULL), 2);
  ck_assert_int_eq(done_at(s, &b, t + 60 * US), 2);
  sub1(s, &r[0], 1, t + 70 * US);
  ck_assert_uint_eq(next_rows(s, t + 70 * US, &b, sl, &retry), 0);
  ck_assert_uint_eq(retry, t + 70 * US + hold_of(s, 1, 1, cap));

  /* While it holds, prefill waits too (decode first)... */
  ql__sched_req pf;
  rq(&pf, &W2, AQ, 4, 9);
  ck_assert_int_eq(ql__sched_submit(s, &pf, t + 80 * US), 0);
  ck_assert_uint_eq(next_rows(s, t + 80 * US, &b, sl, &retry), 0);
  ck_assert_uint_eq(retry, t + 70 * US + hold_of(s, 1, 1, cap));
  /* ... and goes after the decode launch. */
  sub1(s, &r[1], 2, t + 90 * US);
  ck_assert_uint_eq(next_rows(s, t + 90 * US, &b, sl, NULL), 2);
  ck_assert_ptr_eq(b.weight, &W1);
  ck_assert_int_eq(done_at(s, &b, t + 100 * US), 2);
  ck_assert_uint_eq(next_rows(s, t + 100 * US, &b, sl, NULL), 4);
  ck_assert_ptr_eq(b.weight, &W2);
  ck_assert_int_eq(done_at(s, &b, t + 110 * US), 1); /* no hold: prefill */

  /* A first row back later than a whole hold after the completion: the
   * clients do not decode in a loop here; no hold. */
  t += 2000 * US;
  sub1(s, &r[0], 1, t);
  ck_assert_uint_eq(next_rows(s, t, &b, sl, NULL), 1);
  ck_assert_int_eq(done_at(s, &b, t + 10 * US), 1);
  t += 10 * US + cap + 1;
  two_out(s, r, t);
  t += 10 * US + cap + 1;
  sub1(s, &r[0], 1, t);
  ck_assert_uint_eq(next_rows(s, t, &b, sl, NULL), 1);

  /* A launch without an end time sets no hold. */
  ck_assert_int_eq(done_at(s, &b, t + 10 * US), 1);
  t += 2000 * US;
  sub1(s, &r[0], 1, t);
  sub1(s, &r[1], 2, t);
  ck_assert_uint_eq(next_rows(s, t, &b, sl, NULL), 2);
  ql__sched_req *fin;
  b.end_ns = 0;
  ql__sched_complete(s, &b, 0, &fin);
  sub1(s, &r[0], 1, t + 10 * US);
  ck_assert_uint_eq(next_rows(s, t + 10 * US, &b, sl, NULL), 1);
  ck_assert_int_eq(done_at(s, &b, t + 20 * US), 1);

  /* A hold whose rows were taken away (their session ended) is gone for
   * a row that comes later than a whole hold: no hold, and no miss. */
  t += 2000 * US;
  two_out(s, r, t);
  sub1(s, &r[0], 1, t + 20 * US);
  ck_assert_uint_eq(next_rows(s, t + 20 * US, &b, sl, NULL), 0);
  ql__sched_remove_session(s, 1, QL_ESESSION, &fin);
  ck_assert_int_eq(list_len(fin), 1);
  sub1(s, &r[0], 3, t + 20 * US + cap + 1);
  ck_assert_uint_eq(next_rows(s, t + 20 * US + cap + 1, &b, sl, NULL), 1);
  ck_assert_int_eq(done_at(s, &b, t + 30 * US + cap), 1);
  /* (The next completion holds as usual: no miss was counted.) */
  t += 2000 * US;
  two_out(s, r, t);
  sub1(s, &r[0], 1, t + 20 * US);
  ck_assert_uint_eq(next_rows(s, t + 20 * US, &b, sl, NULL), 0);
  sub1(s, &r[1], 2, t + 30 * US);
  ck_assert_uint_eq(next_rows(s, t + 30 * US, &b, sl, NULL), 2);
  ck_assert_int_eq(done_at(s, &b, t + 40 * US), 2);

  /* A deadline inside the hold: no hold. */
  t += 2000 * US;
  two_out(s, r, t);
  rq(&r[0], &W1, WO, 1, 1);
  r[0].deadline_ns = t + 100 * US;
  ck_assert_int_eq(ql__sched_submit(s, &r[0], t + 20 * US), 0);
  ck_assert_uint_eq(next_rows(s, t + 20 * US, &b, sl, NULL), 1);
  ck_assert_int_eq(done_at(s, &b, t + 30 * US), 1);

  /* decode_hold_us caps the hold. */
  c.decode_hold_us = 100;
  ck_assert_int_eq(ql__sched_configure(s, &c), 0);
  t += 2000 * US;
  two_out(s, r, t);
  back_held(s, r, t + 20 * US, t + 120 * US);

  /* 0: never, a hold set before included (and that is no miss). */
  two_out(s, r, t + 40 * US);
  c.decode_hold_us = 0;
  ck_assert_int_eq(ql__sched_configure(s, &c), 0);
  back_alone(s, r, t + 60 * US);
  two_out(s, r, t + 80 * US);
  back_alone(s, r, t + 100 * US);
  c.decode_hold_us = 100;
  ck_assert_int_eq(ql__sched_configure(s, &c), 0);
  two_out(s, r, t + 120 * US);
  back_held(s, r, t + 140 * US, t + 240 * US);
  c.decode_hold_us = QL_SCHED_MAX_DELAY_US + 1;
  ck_assert_int_eq(ql__sched_configure(s, &c), QL_EINVAL);

  /* In proportion to the rows, or steeper: nothing to save by waiting. */
  c.decode_hold_us = 1000;
  ck_assert_int_eq(ql__sched_configure(s, &c), 0);
  static const uint32_t m2[] = {1, 8};
  static const uint64_t prop[] = {100 * US, 800 * US};
  static const uint64_t steep[] = {100 * US, 1000 * US};
  for (int k = 0; k < 2; k++) {
    ck_assert_int_eq(ql__sched_set_curve(s, &W1, 0, m2, k ? steep : prop, 2),
                     0);
    t += 2000 * US;
    sub1(s, &r[0], 1, t);
    sub1(s, &r[1], 2, t);
    sub1(s, &r[2], 3, t);
    ck_assert_uint_eq(next_rows(s, t, &b, sl, NULL), 3);
    ck_assert_int_eq(done_at(s, &b, t + 10 * US), 3);
    sub1(s, &r[0], 1, t + 20 * US);
    ck_assert_uint_eq(next_rows(s, t + 20 * US, &b, sl, NULL), 1);
    ck_assert_int_eq(done_at(s, &b, t + 30 * US), 1);
  }
  ql__sched_free(s);

  /* A device whose prefill stops: a held decode queue still asks a
   * running prefill to stop (the rows gather meanwhile). */
  c = cfg_default();
  c.decode_hold_us = 1000;
  c.prefill_chunk_us = 1000;
  c.stops[0] = 1;
  s = mk(&c);
  ck_assert_int_eq(ql__sched_set_curve(s, &W1, 0, m, ns, 4), 0);
  sub1(s, &r[0], 1, 0);
  sub1(s, &r[1], 2, 0);
  ck_assert_uint_eq(next_rows(s, 0, &b, sl, NULL), 2);
  ck_assert_int_eq(done_at(s, &b, 10 * US), 2);
  rq(&pf, &W2, AQ, 4, 9);
  ck_assert_int_eq(ql__sched_submit(s, &pf, 20 * US), 0);
  ql__sched_batch pb;
  ql__sched_slice psl[8];
  bt(&pb, psl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 20 * US, &pb), 0);
  ck_assert_ptr_eq(pb.weight, &W2); /* the prefill runs */
  sub1(s, &r[0], 1, 30 * US);
  ck_assert_uint_gt(ql__sched_yield_ns(s, 0, 30 * US), 0);
  /* The prefill stopped for it: the decode work it stopped for runs. */
  bt(&b, sl, 8);
  b.decode_only = 1;
  ck_assert_int_eq(ql__sched_next(s, 0, 40 * US, &b), 0);
  ck_assert_uint_eq(b.rows, 1);
  ck_assert_int_eq(done_at(s, &b, 50 * US), 1);
  pb.end_ns = 60 * US;
  ql__sched_complete(s, &pb, 0, &fin);
  ql__sched_free(s);

  /* Two lanes: a held decode queue leaves prefill a lane while another
   * stays free; a batch completing while the other's hold waits adds its
   * rows to it. */
  c = cfg_default();
  c.decode_hold_us = 1000;
  c.lanes[0] = 2;
  s = mk(&c);
  ck_assert_int_eq(ql__sched_set_curve(s, &W1, 0, m, ns, 4), 0);
  ql__sched_batch b2;
  ql__sched_slice sl2[8];
  sub1(s, &r[0], 1, 0);
  sub1(s, &r[1], 2, 0);
  ck_assert_uint_eq(next_rows(s, 0, &b, sl, NULL), 2);
  sub1(s, &r[2], 3, 5 * US);
  ck_assert_uint_eq(next_rows(s, 5 * US, &b2, sl2, NULL), 1);
  ck_assert_int_eq(done_at(s, &b, 10 * US), 2); /* hold for 2 */
  ck_assert_int_eq(done_at(s, &b2, 20 * US), 1); /* now for 3 */
  sub1(s, &r[0], 1, 30 * US);
  sub1(s, &r[1], 2, 30 * US);
  ck_assert_uint_eq(next_rows(s, 30 * US, &b, sl, &retry), 0);
  ck_assert_uint_eq(retry, 30 * US + hold_of(s, 2, 1, cap));
  rq(&pf, &W2, AQ, 4, 9);
  ck_assert_int_eq(ql__sched_submit(s, &pf, 35 * US), 0);
  ck_assert_uint_eq(next_rows(s, 35 * US, &b2, sl2, NULL), 4);
  ck_assert_ptr_eq(b2.weight, &W2);
  sub1(s, &r[2], 3, 40 * US);
  ck_assert_uint_eq(next_rows(s, 40 * US, &b, sl, NULL), 3);
  ck_assert_int_eq(done_at(s, &b, 50 * US), 3);
  ck_assert_int_eq(done_at(s, &b2, 60 * US), 1);
  ql__sched_free(s);
}
END_TEST

/* An expired request is never in a batch: it comes back for
 * DEADLINE_EXCEEDED; one whose rows have started runs to its end. */
START_TEST(test_deadlines) {
  ql__sched_config c = cfg_default();
  c.n_devices = 2;
  c.max_batch_rows = 4;
  ql__sched *s = mk(&c);
  ql__sched_req r1, r2, r3, late;
  ql__sched_batch b;
  ql__sched_slice sl[8];
  ql__sched_req *fin, *out;

  /* Already due at submit: refused, nothing queued. */
  rq(&late, &W1, WO, 1, 1);
  late.deadline_ns = 10;
  ck_assert_int_eq(ql__sched_submit(s, &late, 10), QL_EDEADLINE);
  ck_assert_uint_eq(ql__sched_waiting(s, &W1, 0, WO), 0);
  ck_assert_uint_eq(ql__sched_session_count(s, 1), 0);

  rq(&r1, &W1, WO, 1, 1);
  r1.deadline_ns = 100;
  rq(&r2, &W1, WO, 1, 1);
  rq(&r3, &W1, WO, 1, 2);
  r3.deadline_ns = 50;
  ck_assert_int_eq(ql__sched_submit(s, &r1, 0), 0);
  ck_assert_int_eq(ql__sched_submit(s, &r2, 0), 0);
  ck_assert_int_eq(ql__sched_submit(s, &r3, 0), 0);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 50, &b), 0);
  ck_assert_ptr_eq(b.expired, &r3);
  ck_assert_ptr_null(r3.next);
  ck_assert_int_eq(r3.status, QL_EDEADLINE);
  ck_assert_uint_eq(b.n, 2);
  slice_is(&b, 0, &r1, 0, 1);
  slice_is(&b, 1, &r2, 0, 1);
  ck_assert_uint_eq(ql__sched_session_count(s, 2), 0);
  /* Past r1's deadline now, but it started in time: it completes. */
  ql__sched_complete(s, &b, 0, &fin);
  ck_assert_int_eq(list_len(fin), 2);
  ck_assert_int_eq(r1.status, 0);

  /* A started prefill survives its deadline between chunks. */
  c.prefill_chunk_rows = 2;
  ck_assert_int_eq(ql__sched_configure(s, &c), 0);
  ql__sched_req p;
  rq(&p, &W2, AQ, 4, 1);
  p.deadline_ns = 300;
  ck_assert_int_eq(ql__sched_submit(s, &p, 200), 0);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 250, &b), 0);
  slice_is(&b, 0, &p, 0, 2);
  ql__sched_complete(s, &b, 0, &fin);
  ql__sched_expire(s, 1000, &out);
  ck_assert_ptr_null(out);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 1000, &b), 0);
  ck_assert_ptr_null(b.expired);
  slice_is(&b, 0, &p, 2, 2);
  ql__sched_complete(s, &b, 0, &fin);
  ck_assert_ptr_eq(fin, &p);
  ck_assert_int_eq(p.status, 0);

  /* The timer sweep covers every device and keeps FIFO order; next() on
   * one device only expires its own. */
  ql__sched_req e[4];
  for (int i = 0; i < 4; i++) {
    rq(&e[i], i % 2 ? &W2 : &W1, i < 2 ? WO : AQ, 1, 3);
    e[i].device = i % 2;
    e[i].deadline_ns = 2000 + (uint64_t)i;
    ck_assert_int_eq(ql__sched_submit(s, &e[i], 1500), 0);
  }
  ql__sched_req keep;
  rq(&keep, &W1, WO, 1, 3);
  keep.deadline_ns = 5000;
  ck_assert_int_eq(ql__sched_submit(s, &keep, 1500), 0);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 1, 2003, &b), 0);
  ck_assert_int_eq(list_len(b.expired), 2); /* e[1], e[3] on device 1 */
  ck_assert(in_list(b.expired, &e[1]) && in_list(b.expired, &e[3]));
  ck_assert_uint_eq(b.n, 0);
  ql__sched_expire(s, 2001, &out); /* e[0] only: e[2] is due at 2002 */
  ck_assert_ptr_eq(out, &e[0]);
  ck_assert_ptr_null(out->next);
  ql__sched_expire(s, 2002, &out);
  ck_assert_ptr_eq(out, &e[2]);
  ck_assert_int_eq(e[2].status, QL_EDEADLINE);
  ck_assert_uint_eq(ql__sched_session_count(s, 3), 1);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 4999, &b), 0);
  slice_is(&b, 0, &keep, 0, 1);
  ql__sched_complete(s, &b, 0, &fin);
  ql__sched_stats st;
  ck_assert_int_eq(ql__sched_stats_get(s, &W1, 0, &st), 0);
  ck_assert_uint_eq(st.expired, 3); /* r3, e[0], e[2] */
  ck_assert_int_eq(ql__sched_stats_get(s, &W2, 1, &st), 0);
  ck_assert_uint_eq(st.expired, 2);
  ck_assert_uint_eq(ql__sched_device_load(s, 0), 0);
  ck_assert_uint_eq(ql__sched_device_load(s, 1), 0);
  ql__sched_free(s);
}
END_TEST

/* A full queue or a used-up quota: QL_EEXHAUSTED at once, nothing changed
 * (the request struct included). */
START_TEST(test_exhausted) {
  ql__sched_config c = cfg_default();
  c.max_queue = 2;
  c.session_quota = 3;
  ql__sched *s = mk(&c);
  ql__sched_req r[6], x;
  rq(&r[0], &W1, WO, 1, 1);
  rq(&r[1], &W1, WO, 1, 1);
  ck_assert_int_eq(ql__sched_submit(s, &r[0], 0), 0);
  ck_assert_int_eq(ql__sched_submit(s, &r[1], 0), 0);
  uint64_t load = ql__sched_device_load(s, 0);
  rq(&x, &W1, WO, 1, 2);
  x.on_device = 77;
  x.status = 55;
  x.enqueue_ns = 99;
  ql__sched_req before;
  memcpy(&before, &x, sizeof x);
  ck_assert_int_eq(ql__sched_submit(s, &x, 1), QL_EEXHAUSTED);
  ck_assert(memcmp(&before, &x, sizeof x) == 0);
  ck_assert_uint_eq(ql__sched_waiting(s, &W1, 0, WO), 2);
  ck_assert_uint_eq(ql__sched_session_count(s, 2), 0);
  ck_assert_uint_eq(ql__sched_device_load(s, 0), load);
  /* Another class or weight is another queue. */
  rq(&r[2], &W1, AQ, 1, 1);
  ck_assert_int_eq(ql__sched_submit(s, &r[2], 1), 0);
  /* Session 1 has 3 requests: its quota. */
  rq(&x, &W2, WO, 1, 1);
  memcpy(&before, &x, sizeof x);
  ck_assert_int_eq(ql__sched_submit(s, &x, 1), QL_EEXHAUSTED);
  ck_assert(memcmp(&before, &x, sizeof x) == 0);
  ck_assert_uint_eq(ql__sched_waiting(s, &W2, 0, WO), 0);
  ck_assert_uint_eq(ql__sched_session_count(s, 1), 3);
  rq(&r[3], &W2, WO, 1, 2);
  ck_assert_int_eq(ql__sched_submit(s, &r[3], 1), 0);
  /* The quota counts until a request is handed back, running included. */
  ql__sched_batch b;
  ql__sched_slice sl[4];
  ql__sched_req *fin;
  bt(&b, sl, 4);
  ck_assert_int_eq(ql__sched_next(s, 0, 2, &b), 0);
  slice_is(&b, 0, &r[0], 0, 1); /* r[0], r[1] */
  ck_assert_uint_eq(ql__sched_waiting(s, &W1, 0, WO), 0);
  rq(&r[4], &W1, WO, 1, 1);
  ck_assert_int_eq(ql__sched_submit(s, &r[4], 2), QL_EEXHAUSTED);
  ql__sched_complete(s, &b, 0, &fin);
  ck_assert_int_eq(list_len(fin), 2);
  ck_assert_uint_eq(ql__sched_session_count(s, 1), 1);
  ck_assert_int_eq(ql__sched_submit(s, &r[4], 3), 0);
  /* A larger max_queue applies at once. */
  rq(&r[5], &W1, WO, 1, 3);
  ck_assert_int_eq(ql__sched_submit(s, &r[5], 3), 0);
  rq(&x, &W1, WO, 1, 4);
  ck_assert_int_eq(ql__sched_submit(s, &x, 3), QL_EEXHAUSTED);
  c.max_queue = 3;
  ck_assert_int_eq(ql__sched_configure(s, &c), 0);
  ck_assert_int_eq(ql__sched_submit(s, &x, 3), 0);
  ql__sched_req *out;
  ql__sched_remove_all(s, QL_ESHUTDOWN, &out);
  ck_assert_int_eq(list_len(out), 5);
  ql__sched_free(s);
}
END_TEST

/* Ending a session takes its waiting requests back; a prefill of it that
 * is between chunks loses its remaining rows and comes back from the
 * complete() of its running chunk. Other sessions are untouched. */
START_TEST(test_remove_session) {
  ql__sched_config c = cfg_default();
  c.prefill_chunk_rows = 4;
  c.n_devices = 2;
  ql__sched *s = mk(&c);
  ql__sched_req a[4], bq[2], pa, pb;
  ql__sched_batch b, bb;
  ql__sched_slice sl[8], sl2[8];
  ql__sched_req *fin, *out;
  rq(&pa, &W1, AQ, 10, 1);
  ck_assert_int_eq(ql__sched_submit(s, &pa, 0), 0);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 1, &b), 0);
  slice_is(&b, 0, &pa, 0, 4);
  /* Session 2 has a prefill whose first chunk already finished. */
  rq(&pb, &W2, AQ, 10, 2);
  pb.device = 1;
  ck_assert_int_eq(ql__sched_submit(s, &pb, 1), 0);
  bt(&bb, sl2, 8);
  ck_assert_int_eq(ql__sched_next(s, 1, 1, &bb), 0);
  slice_is(&bb, 0, &pb, 0, 4);
  ql__sched_complete(s, &bb, 0, &fin);
  ck_assert_ptr_null(fin);
  for (int i = 0; i < 4; i++) {
    rq(&a[i], i % 2 ? &W1 : &W2, i < 2 ? WO : AQ, 2, 1);
    a[i].device = i / 2;
    ck_assert_int_eq(ql__sched_submit(s, &a[i], 2), 0);
  }
  for (int i = 0; i < 2; i++) {
    rq(&bq[i], &W1, WO, 1, 2);
    ck_assert_int_eq(ql__sched_submit(s, &bq[i], 3), 0);
  }
  ck_assert_uint_eq(ql__sched_session_count(s, 1), 5);
  ql__sched_remove_session(s, 1, QL_ESESSION, &out);
  ck_assert_int_eq(list_len(out), 4);
  for (int i = 0; i < 4; i++) {
    ck_assert(in_list(out, &a[i]));
    ck_assert_int_eq(a[i].status, QL_ESESSION);
  }
  ck_assert(!in_list(out, &pa));
  ck_assert_uint_eq(ql__sched_session_count(s, 1), 1); /* pa, running */
  ck_assert_uint_eq(ql__sched_waiting(s, &W1, 0, AQ), 0);
  ck_assert_uint_eq(ql__sched_waiting(s, &W1, 0, WO), 2);
  /* Removing again finds nothing. */
  ql__sched_remove_session(s, 1, QL_ESESSION, &out);
  ck_assert_ptr_null(out);
  /* Only session 2's work is left. */
  ql__sched_batch b2;
  bt(&b2, sl2, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 4, &b2), 0);
  ck_assert_uint_eq(b2.n, 2);
  slice_is(&b2, 0, &bq[0], 0, 1);
  slice_is(&b2, 1, &bq[1], 0, 1);
  ql__sched_complete(s, &b2, 0, &fin);
  ck_assert_int_eq(list_len(fin), 2);
  /* pa's running chunk completes: pa comes back, cut short. */
  ql__sched_complete(s, &b, 0, &fin);
  ck_assert_ptr_eq(fin, &pa);
  ck_assert_ptr_null(fin->next);
  ck_assert_int_eq(pa.status, QL_ESESSION);
  ck_assert_uint_eq(ql__sched_session_count(s, 1), 0);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 5, &b), 0);
  ck_assert_uint_eq(b.n, 0);
  /* Session 2's prefill with nothing running comes back at once. */
  ql__sched_remove_session(s, 2, QL_ESESSION, &out);
  ck_assert_ptr_eq(out, &pb);
  ck_assert_int_eq(pb.status, QL_ESESSION);
  ck_assert_uint_eq(ql__sched_device_load(s, 0), 0);
  ck_assert_uint_eq(ql__sched_device_load(s, 1), 0);
  ql__sched_stats st;
  ck_assert_int_eq(ql__sched_stats_get(s, &W1, 0, &st), 0);
  ck_assert_uint_eq(st.requests, 2); /* bq; pa was cut */
  ql__sched_free(s);
}
END_TEST

/* Shutdown: every waiting request comes back; running ones finish. */
START_TEST(test_remove_all) {
  ql__sched_config c = cfg_default();
  c.max_batch_rows = 4;
  c.n_devices = 3;
  ql__sched *s = mk(&c);
  ql__sched_req r[12], big;
  ql__sched_batch b, b2;
  ql__sched_slice sl[8], sl2[8];
  ql__sched_req *fin, *out;
  for (int i = 0; i < 12; i++) {
    rq(&r[i],
       i % 3 == 0   ? &W1
       : i % 3 == 1 ? &W2
                    : &W3,
       i % 2 ? AQ : WO, 1, (uint64_t)i % 4);
    r[i].device = i % 3;
    ck_assert_int_eq(ql__sched_submit(s, &r[i], (uint64_t)i), 0);
  }
  rq(&big, &W1, WO, 10, 9);
  ck_assert_int_eq(ql__sched_submit(s, &big, 20), 0);
  bt(&b, sl, 8); /* r0, r6 (W1 WO device 0) */
  ck_assert_int_eq(ql__sched_next(s, 0, 21, &b), 0);
  ck_assert_uint_eq(b.n, 3);
  slice_is(&b, 2, &big, 0, 2);
  bt(&b2, sl2, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 21, &b2), 0);
  slice_is(&b2, 0, &big, 2, 4);
  ql__sched_remove_all(s, QL_ESHUTDOWN, &out);
  ck_assert_int_eq(list_len(out), 10);
  for (int i = 0; i < 12; i++)
    if (i != 0 && i != 6) {
      ck_assert(in_list(out, &r[i]));
      ck_assert_int_eq(r[i].status, QL_ESHUTDOWN);
    }
  for (unsigned d = 0; d < 3; d++) {
    ql__sched_batch bn;
    ql__sched_slice sln[8];
    bt(&bn, sln, 8);
    ck_assert_int_eq(ql__sched_next(s, d, 22, &bn), 0);
    ck_assert_uint_eq(bn.n, 0);
    ck_assert_uint_eq(bn.retry_ns, 0);
  }
  ql__sched_complete(s, &b, 0, &fin);
  ck_assert_int_eq(list_len(fin), 2); /* r0 and r6; big still runs */
  ck_assert(in_list(fin, &r[0]) && in_list(fin, &r[6]));
  ck_assert_int_eq(r[0].status, 0);
  ql__sched_complete(s, &b2, 0, &fin);
  ck_assert_ptr_eq(fin, &big); /* rows 6..9 never ran */
  ck_assert_int_eq(big.status, QL_ESHUTDOWN);
  for (unsigned d = 0; d < 3; d++)
    ck_assert_uint_eq(ql__sched_device_load(s, d), 0);
  ql__sched_remove_all(s, QL_ESHUTDOWN, &out);
  ck_assert_ptr_null(out);
  ql__sched_free(s);
}
END_TEST

/* Device choice: among the holders with room, the earliest estimated
 * completion (queued and running estimates plus the request's own cost),
 * lowest index on a tie; a named device is obeyed. */
START_TEST(test_device_choice) {
  ql__sched_config c = cfg_default();
  c.n_devices = 3;
  c.max_queue = 8;
  c.default_ns_per_row = 1000;
  ql__sched *s = mk(&c);
  ck_assert_int_eq(ql__sched_set_cost(s, &W1, 0, WO, 100), 0);
  ck_assert_int_eq(ql__sched_set_cost(s, &W1, 2, WO, 300), 0);
  ql__sched_req r[12];
  /* Estimates (device 0, device 2) for 10 rows: (1000, 3000) -> 0,
   * (2000, 3000) -> 0, (3000, 3000) tie -> 0, (4000, 3000) -> 2,
   * (4000, 6000) -> 0, (5000, 6000) -> 0. Device 1 is idle but does not
   * hold the weight. */
  static const unsigned want[6] = {0, 0, 0, 2, 0, 0};
  for (int i = 0; i < 6; i++) {
    rq(&r[i], &W1, WO, 10, 1);
    r[i].device = -1;
    r[i].holders = 5;
    ck_assert_int_eq(ql__sched_submit(s, &r[i], 0), 0);
    ck_assert_uint_eq(r[i].on_device, want[i]);
  }
  ck_assert_uint_eq(ql__sched_device_load(s, 0), 5000);
  ck_assert_uint_eq(ql__sched_device_load(s, 1), 0);
  ck_assert_uint_eq(ql__sched_device_load(s, 2), 3000);
  /* A full queue is passed over: device 0 (6000, a tie that it would win)
   * has no room, so device 2; then both are full. */
  c.max_queue = 5;
  ck_assert_int_eq(ql__sched_configure(s, &c), 0);
  rq(&r[6], &W1, WO, 10, 1);
  r[6].device = -1;
  r[6].holders = 5;
  ck_assert_int_eq(ql__sched_submit(s, &r[6], 0), 0);
  ck_assert_uint_eq(r[6].on_device, 2);
  c.max_queue = 2;
  ck_assert_int_eq(ql__sched_configure(s, &c), 0);
  rq(&r[7], &W1, WO, 10, 1);
  r[7].device = -1;
  r[7].holders = 5;
  ck_assert_int_eq(ql__sched_submit(s, &r[7], 0), QL_EEXHAUSTED);
  c.max_queue = 8;
  ck_assert_int_eq(ql__sched_configure(s, &c), 0);
  /* A named device is obeyed even when it is not the best. */
  rq(&r[7], &W1, WO, 1, 1);
  r[7].device = 1;
  ck_assert_int_eq(ql__sched_submit(s, &r[7], 0), 0);
  ck_assert_uint_eq(r[7].on_device, 1);
  ck_assert_uint_eq(ql__sched_device_load(s, 1), 1000);

  /* Running work counts: device 0's 50 rows leave the queue for one
   * launch and still load the device. */
  ql__sched_batch b;
  ql__sched_slice sl[8];
  ql__sched_req *fin;
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 1, &b), 0);
  ck_assert_uint_eq(b.rows, 50);
  ck_assert_uint_eq(ql__sched_device_load(s, 0), 5000);
  /* A measurement (100 µs / 50 rows = 2000 ns) moves the estimate a
   * quarter of the way from the seed of 100: 575. */
  ql__sched_complete(s, &b, 100000, &fin);
  ck_assert_int_eq(list_len(fin), 5);
  ck_assert_uint_eq(ql__sched_device_load(s, 0), 0);
  rq(&r[8], &W1, WO, 1, 2);
  ck_assert_int_eq(ql__sched_submit(s, &r[8], 2), 0);
  ck_assert_uint_eq(ql__sched_device_load(s, 0), 575);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 3, &b), 0);
  ql__sched_complete(s, &b, 6000, &fin); /* (3 * 575 + 6000) / 4 */
  ck_assert_ptr_eq(fin, &r[8]);
  rq(&r[8], &W1, WO, 1, 2);
  ck_assert_int_eq(ql__sched_submit(s, &r[8], 4), 0);
  ck_assert_uint_eq(ql__sched_device_load(s, 0), 1931);
  /* Without a seed the first measurement replaces the default. */
  ql__sched_req w2;
  rq(&w2, &W2, AQ, 10, 2);
  w2.device = 1;
  ck_assert_int_eq(ql__sched_submit(s, &w2, 5), 0);
  ck_assert_uint_eq(ql__sched_device_load(s, 1), 11000);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 1, 6, &b), 0); /* r[7], WO */
  ql__sched_complete(s, &b, 0, &fin);               /* unmeasured: no change */
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 1, 6, &b), 0);
  ck_assert_ptr_eq(b.slice[0].req, &w2);
  ql__sched_complete(s, &b, 50000, &fin);
  rq(&w2, &W2, AQ, 1, 2);
  w2.device = 1;
  ck_assert_int_eq(ql__sched_submit(s, &w2, 7), 0);
  ck_assert_uint_eq(ql__sched_device_load(s, 1), 5000);
  rq(&r[9], &W1, WO, 1, 2);
  r[9].device = 1;
  ck_assert_int_eq(ql__sched_submit(s, &r[9], 7), 0);
  ck_assert_uint_eq(ql__sched_device_load(s, 1), 6000);
  /* Estimates are clamped to 1 .. QL_SCHED_MAX_NS_PER_ROW. */
  ck_assert_int_eq(ql__sched_set_cost(s, &W3, 2, AQ, 0), 0);
  ck_assert_int_eq(ql__sched_set_cost(s, &W3, 2, WO, UINT64_MAX), 0);
  uint64_t load2 = ql__sched_device_load(s, 2);
  ql__sched_req w3a, w3b;
  rq(&w3a, &W3, AQ, 5, 2);
  w3a.device = 2;
  ck_assert_int_eq(ql__sched_submit(s, &w3a, 8), 0);
  ck_assert_uint_eq(ql__sched_device_load(s, 2), load2 + 5);
  rq(&w3b, &W3, WO, 1, 2);
  w3b.device = 2;
  ck_assert_int_eq(ql__sched_submit(s, &w3b, 8), 0);
  ck_assert_uint_eq(ql__sched_device_load(s, 2),
                    load2 + 5 + QL_SCHED_MAX_NS_PER_ROW);
  ql__sched_req *out;
  ql__sched_remove_all(s, QL_ESHUTDOWN, &out);
  for (unsigned d = 0; d < 3; d++)
    ck_assert_uint_eq(ql__sched_device_load(s, d), 0);
  ql__sched_free(s);
}
END_TEST

/* The counters of (weight, device) and the log2 histograms. */
START_TEST(test_stats) {
  ck_assert_uint_eq(ql__sched_hist_bucket(0), 0);
  ck_assert_uint_eq(ql__sched_hist_bucket(1023), 0);
  ck_assert_uint_eq(ql__sched_hist_bucket(1024), 1);
  ck_assert_uint_eq(ql__sched_hist_bucket(2047), 1);
  ck_assert_uint_eq(ql__sched_hist_bucket(2048), 2);
  ck_assert_uint_eq(ql__sched_hist_bucket(UINT64_MAX),
                    QL_SCHED_HIST_BUCKETS - 1);
  for (unsigned b = 1; b < QL_SCHED_HIST_BUCKETS; b++) {
    uint64_t lo = ql__sched_hist_lower_ns(b);
    ck_assert_uint_eq(ql__sched_hist_bucket(lo), b);
    ck_assert_uint_eq(ql__sched_hist_bucket(lo - 1), b - 1);
  }
  ck_assert_uint_eq(ql__sched_hist_lower_ns(0), 0);
  ck_assert_uint_eq(ql__sched_hist_lower_ns(QL_SCHED_HIST_BUCKETS), 0);

  ql__sched_config c = cfg_default();
  c.max_batch_rows = 8;
  c.n_devices = 2;
  ql__sched *s = mk(&c);
  ql__sched_req r[4];
  ql__sched_batch b;
  ql__sched_slice sl[8];
  ql__sched_req *fin;
  rq(&r[0], &W1, WO, 1, 1);
  rq(&r[1], &W1, WO, 2, 1);
  rq(&r[2], &W1, AQ, 12, 1);
  rq(&r[3], &W1, WO, 1, 1);
  r[3].device = 1;
  for (int i = 0; i < 4; i++)
    ck_assert_int_eq(ql__sched_submit(s, &r[i], 1000), 0);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 1000 + 5000, &b), 0); /* 5 µs */
  ql__sched_complete(s, &b, 3000, &fin);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 1000 + 100000, &b), 0);
  ql__sched_complete(s, &b, 70000, &fin);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, 1000 + 200000, &b), 0);
  ql__sched_complete(s, &b, 0, &fin);
  ql__sched_stats st;
  ck_assert_int_eq(ql__sched_stats_get(s, &W1, 0, &st), 0);
  ck_assert_uint_eq(st.requests, 3);
  ck_assert_uint_eq(st.rows, 15);
  ck_assert_uint_eq(st.batches, 3);
  ck_assert_uint_eq(st.decode_batches, 1);
  ck_assert_uint_eq(st.prefill_batches, 2);
  ck_assert_uint_eq(st.expired, 0);
  ck_assert_uint_eq(st.queue_ns, 5000 + 5000 + 100000);
  ck_assert_uint_eq(st.kernel_ns, 73000);
  uint64_t nq = 0, nk = 0;
  for (int i = 0; i < QL_SCHED_HIST_BUCKETS; i++) {
    nq += st.queue_hist[i];
    nk += st.kernel_hist[i];
  }
  ck_assert_uint_eq(nq, 3); /* one per request, at its first launch */
  ck_assert_uint_eq(nk, 2); /* the unmeasured launch is not recorded */
  ck_assert_uint_eq(st.queue_hist[ql__sched_hist_bucket(5000)], 2);
  ck_assert_uint_eq(st.queue_hist[ql__sched_hist_bucket(100000)], 1);
  ck_assert_uint_eq(st.kernel_hist[ql__sched_hist_bucket(3000)], 1);
  ck_assert_uint_eq(st.kernel_hist[ql__sched_hist_bucket(70000)], 1);
  ck_assert_uint_eq(st.kernel_hist[0], 0);
  /* Device 1 has its own counters. */
  ck_assert_int_eq(ql__sched_stats_get(s, &W1, 1, &st), 0);
  ck_assert_uint_eq(st.batches, 0);
  ck_assert_uint_eq(ql__sched_waiting(s, &W1, 1, WO), 1);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 1, 2000, &b), 0);
  ql__sched_complete(s, &b, 10, &fin);
  ck_assert_int_eq(ql__sched_stats_get(s, &W1, 1, &st), 0);
  ck_assert_uint_eq(st.requests, 1);
  ck_assert_uint_eq(st.batches, 1);
  /* Forgetting the weight drops every device's counters. */
  ql__sched_forget(s, &W1);
  ck_assert_int_eq(ql__sched_stats_get(s, &W1, 0, &st), QL_ENOTFOUND);
  ck_assert_int_eq(ql__sched_stats_get(s, &W1, 1, &st), QL_ENOTFOUND);
  ql__sched_forget(s, &W2); /* never seen: nothing */
  ql__sched_free(s);
}
END_TEST

/* Many weights and sessions: the tables grow and delete correctly. */
START_TEST(test_many_keys) {
  enum { NW = 3000 };
  static char wk[NW];
  static ql__sched_req r[NW];
  ql__sched_config c = cfg_default();
  c.session_quota = 1;
  ql__sched *s = mk(&c);
  for (int i = 0; i < NW; i++) {
    rq(&r[i], &wk[i], i % 2 ? AQ : WO, 1, (uint64_t)i * 0x10001);
    ck_assert_int_eq(ql__sched_submit(s, &r[i], (uint64_t)i), 0);
  }
  for (int i = 0; i < NW; i++) {
    REQUIRE(ql__sched_session_count(s, (uint64_t)i * 0x10001) == 1, "%d", i);
    REQUIRE(ql__sched_waiting(s, &wk[i], 0, i % 2 ? AQ : WO) == 1, "%d", i);
  }
  /* Oldest first across classes: all decode, then all prefill. */
  int order = 0;
  for (int k = 0; k < NW; k++) {
    ql__sched_batch b;
    ql__sched_slice sl[4];
    ql__sched_req *fin;
    bt(&b, sl, 4);
    ck_assert_int_eq(ql__sched_next(s, 0, NW, &b), 0);
    int want = k < NW / 2 ? 2 * k : 2 * (k - NW / 2) + 1;
    REQUIRE(b.n == 1 && b.slice[0].req == &r[want], "batch %d", k);
    ql__sched_complete(s, &b, 10, &fin);
    REQUIRE(fin == &r[want], "batch %d", k);
    order++;
    /* Forget every third weight as soon as it is done. */
    if (want % 3 == 0)
      ql__sched_forget(s, &wk[want]);
  }
  ck_assert_int_eq(order, NW);
  ql__sched_stats st;
  for (int i = 0; i < NW; i++) {
    int rc = ql__sched_stats_get(s, &wk[i], 0, &st);
    REQUIRE(rc == (i % 3 == 0 ? QL_ENOTFOUND : 0), "%d", i);
    REQUIRE(ql__sched_session_count(s, (uint64_t)i * 0x10001) == 0, "%d", i);
  }
  ql__sched_free(s);
}
END_TEST

/* ------------------------------------------------------- prefill by time */

/* Runs one batch of device 0 at now and completes it as taking ns; the
 * rows it ran. */
static uint32_t run_one(ql__sched *s, uint64_t now, uint64_t ns,
                        ql__sched_req **fin) {
  ql__sched_batch b;
  ql__sched_slice sl[8];
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, now, &b), 0);
  uint32_t rows = b.rows;
  ql__sched_complete(s, &b, ns, fin);
  return rows;
}

/*
 * A device whose launches stop (cfg.stops, the CPU): prefill is never cut
 * into row chunks, decode about or not; while a prefill launch runs,
 * ql__sched_yield_ns() says how long it may go on before it stops for the
 * decode work that is due: half that decode launch's estimated time (its
 * queue's curve), at most prefill_chunk_us, 0 when none is due, on a
 * device that does not stop, or with prefill_chunk_us 0. A decode_only
 * next() takes decode work and leaves prefill waiting.
 */
START_TEST(test_prefill_stops) {
  ql__sched_config c = cfg_default();
  c.max_batch_rows = 1024;
  c.prefill_chunk_us = 500;
  c.max_queue_delay_us = 100;
  c.n_devices = 2;
  c.stops[0] = 1;
  ql__sched *s = mk(&c);
  static const uint32_t m[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
  uint64_t ns[10];
  for (int i = 0; i < 10; i++)
    ns[i] = (100 + 2 * (uint64_t)m[i]) * US;
  for (unsigned dev = 0; dev < 2; dev++) {
    ck_assert_int_eq(ql__sched_set_curve(s, &W1, dev, m, ns, 10), 0);
    ck_assert_int_eq(ql__sched_set_curve(s, &W2, dev, m, ns, 10), 0);
  }
  uint64_t t = 1000 * US;
  ql__sched_req d0, p, p2, d, d2, *fin;
  ql__sched_batch b, pb;
  ql__sched_slice sl[8], psl[8];

  /* Decode about (it just ran): still one whole prefill launch. */
  rq(&d0, &W2, WO, 1, 2);
  ck_assert_int_eq(ql__sched_submit(s, &d0, t), 0);
  ck_assert_int_eq(ql__sched_decode_active(s, 0, t), 1);
  ck_assert_uint_eq(run_one(s, t + 200 * US, 102 * US, &fin), 1);
  ck_assert_ptr_eq(fin, &d0);
  rq(&p, &W1, AQ, 512, 1);
  ck_assert_int_eq(ql__sched_submit(s, &p, t), 0);
  bt(&pb, psl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, t + 200 * US, &pb), 0);
  ck_assert_uint_eq(pb.rows, 512);
  /* Nothing due: run on. */
  ck_assert_uint_eq(ql__sched_yield_ns(s, 0, t + 200 * US), 0);

  /* A decode of 2 rows arrives; it is held by max_queue_delay_us until
   * t + 400 us, and only then asks the prefill to stop: after half its
   * estimated 104 us. */
  rq(&d, &W2, WO, 2, 2);
  ck_assert_int_eq(ql__sched_submit(s, &d, t + 300 * US), 0);
  ck_assert_uint_eq(ql__sched_yield_ns(s, 0, t + 350 * US), 0);
  /* ... which ql__sched_decode_due_ns() tells, for the caller's timer */
  ck_assert_uint_eq(ql__sched_decode_due_ns(s, 0, t + 350 * US), t + 400 * US);
  ck_assert_uint_eq(ql__sched_decode_due_ns(s, 1, t + 350 * US), 0);
  ck_assert_uint_eq(ql__sched_yield_ns(s, 0, t + 400 * US), 52 * US);
  ck_assert_uint_eq(ql__sched_decode_due_ns(s, 0, t + 400 * US), 0);
  /* Other devices: nothing is due there; a device that does not stop is
   * never asked. */
  ck_assert_uint_eq(ql__sched_yield_ns(s, 1, t + 400 * US), 0);
  ck_assert_uint_eq(ql__sched_yield_ns(s, 7, t + 400 * US), 0);

  /* The prefill stopped; the device takes decode work only: the decode,
   * not the second prefill waiting, nor the rows of the first. */
  rq(&p2, &W1, AQ, 64, 1);
  ck_assert_int_eq(ql__sched_submit(s, &p2, t + 410 * US), 0);
  bt(&b, sl, 8);
  b.decode_only = 1;
  ck_assert_int_eq(ql__sched_next(s, 0, t + 450 * US, &b), 0);
  ck_assert_uint_eq(b.n, 1);
  ck_assert_ptr_eq(b.slice[0].req, &d);
  ql__sched_complete(s, &b, 104 * US, &fin);
  ck_assert_ptr_eq(fin, &d);
  bt(&b, sl, 8);
  b.decode_only = 1;
  ck_assert_int_eq(ql__sched_next(s, 0, t + 560 * US, &b), 0);
  ck_assert_uint_eq(b.n, 0);
  ck_assert_uint_eq(ql__sched_yield_ns(s, 0, t + 560 * US), 0);
  /* The stopped launch goes on and completes, whole. */
  ql__sched_complete(s, &pb, 1200 * US, &fin);
  ck_assert_ptr_eq(fin, &p);
  ck_assert_int_eq(p.status, 0);

  /* A long decode: the wait is capped by prefill_chunk_us. */
  rq(&d2, &W2, WO, 1000, 2);
  ck_assert_int_eq(ql__sched_submit(s, &d2, t + 2000 * US), 0);
  ck_assert_uint_eq(ql__sched_yield_ns(s, 0, t + 2100 * US), 500 * US);
  /* prefill_chunk_us 0: never stopped. */
  c.prefill_chunk_us = 0;
  ck_assert_int_eq(ql__sched_configure(s, &c), 0);
  ck_assert_uint_eq(ql__sched_yield_ns(s, 0, t + 2100 * US), 0);
  ck_assert_uint_eq(run_one(s, t + 2100 * US, 2100 * US, &fin), 1000);
  ck_assert_ptr_eq(fin, &d2);
  ck_assert_uint_eq(run_one(s, t + 4000 * US, 228 * US, &fin), 64);
  ck_assert_ptr_eq(fin, &p2);
  /* Long after the last decode, it is no longer about. */
  ck_assert_int_eq(
      ql__sched_decode_active(s, 0, t + 4000 * US + QL_SCHED_DECODE_WINDOW_NS),
      0);
  ck_assert_int_eq(ql__sched_decode_active(s, 9, t), 0);
  ql__sched_free(s);
}
END_TEST

/*
 * A launch costs 100 us plus 2 us a row (the curve, as the calibration
 * gives it): with a 500 us budget a chunk is 200 rows. A lone prefill
 * runs whole; with decode about it runs in chunks of 200 rows, a decode
 * request arriving during a chunk runs right after it; once decode has
 * been quiet for the window, the rest runs whole.
 */
START_TEST(test_prefill_by_time) {
  ql__sched_config c = cfg_default();
  c.max_batch_rows = 1024;
  c.prefill_chunk_us = 500;
  ql__sched *s = mk(&c);
  static const uint32_t m[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
  uint64_t ns[10];
  for (int i = 0; i < 10; i++)
    ns[i] = (100 + 2 * (uint64_t)m[i]) * US;
  ck_assert_int_eq(ql__sched_set_curve(s, &W1, 0, m, ns, 10), 0);
  ck_assert_uint_eq(ql__sched_launch_ns(s, &W1, 0, AQ, 200), 500 * US);
  ck_assert_uint_eq(ql__sched_launch_ns(s, &W1, 0, AQ, 3), 106 * US);
  /* Past the last point: in proportion from it (overestimates). */
  ck_assert_uint_eq(ql__sched_launch_ns(s, &W1, 0, AQ, 1024), 2248 * US);
  ck_assert_uint_eq(ql__sched_launch_ns(s, &W2, 0, AQ, 1), 0);

  ql__sched_req p, d, d2, *fin;
  uint64_t t = 1000 * US;
  /* Alone: whole. */
  rq(&p, &W1, AQ, 512, 1);
  ck_assert_int_eq(ql__sched_submit(s, &p, t), 0);
  ck_assert_uint_eq(run_one(s, t, 1124 * US, &fin), 512);
  ck_assert_ptr_eq(fin, &p);

  /* Decode about: chunks of 200. */
  t += 2000 * US;
  rq(&d, &W2, WO, 1, 2);
  ck_assert_int_eq(ql__sched_submit(s, &d, t), 0);
  ck_assert_uint_eq(run_one(s, t, 50 * US, &fin), 1);
  ck_assert_ptr_eq(fin, &d);
  rq(&p, &W1, AQ, 512, 1);
  ck_assert_int_eq(ql__sched_submit(s, &p, t), 0);
  ck_assert_uint_eq(run_one(s, t, 500 * US, &fin), 200);
  ck_assert_ptr_null(fin);
  /* A decode arrives during the next chunk and runs right after it. */
  ql__sched_batch b;
  ql__sched_slice sl[8];
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, t + 500 * US, &b), 0);
  ck_assert_uint_eq(b.rows, 200);
  rq(&d2, &W2, WO, 1, 2);
  ck_assert_int_eq(ql__sched_submit(s, &d2, t + 600 * US), 0);
  ql__sched_complete(s, &b, 500 * US, &fin);
  ck_assert_ptr_null(fin);
  bt(&b, sl, 8);
  ck_assert_int_eq(ql__sched_next(s, 0, t + 1000 * US, &b), 0);
  ck_assert_ptr_eq(b.slice[0].req, &d2);
  ql__sched_complete(s, &b, 50 * US, &fin);
  ck_assert_ptr_eq(fin, &d2);
  /* Decode quiet for longer than the window: the last 112 rows whole
   * (they would fit the budget anyway), then a new prefill whole. */
  t += QL_SCHED_DECODE_WINDOW_NS + 1000 * US;
  ck_assert_uint_eq(run_one(s, t, 324 * US, &fin), 112);
  ck_assert_ptr_eq(fin, &p);
  ck_assert_int_eq(p.status, 0);
  rq(&p, &W1, AQ, 1000, 1);
  ck_assert_int_eq(ql__sched_submit(s, &p, t), 0);
  ck_assert_uint_eq(run_one(s, t, 2100 * US, &fin), 1000);
  ck_assert_ptr_eq(fin, &p);

  /* prefill_chunk_rows stays a bound, decode or not. */
  c.prefill_chunk_rows = 64;
  ck_assert_int_eq(ql__sched_configure(s, &c), 0);
  rq(&p, &W1, AQ, 100, 1);
  ck_assert_int_eq(ql__sched_submit(s, &p, t), 0);
  ck_assert_uint_eq(run_one(s, t, 228 * US, &fin), 64);
  ck_assert_uint_eq(run_one(s, t, 172 * US, &fin), 36);
  ck_assert_ptr_eq(fin, &p);
  /* 0 us: never cut by time. */
  c.prefill_chunk_rows = 0;
  c.prefill_chunk_us = 0;
  ck_assert_int_eq(ql__sched_configure(s, &c), 0);
  rq(&d, &W2, WO, 1, 2);
  ck_assert_int_eq(ql__sched_submit(s, &d, t), 0);
  rq(&p, &W1, AQ, 600, 1);
  ck_assert_int_eq(ql__sched_submit(s, &p, t), 0);
  ck_assert_uint_eq(run_one(s, t, 50 * US, &fin), 1);
  ck_assert_uint_eq(run_one(s, t, 1300 * US, &fin), 600);
  ck_assert_ptr_eq(fin, &p);
  ql__sched_free(s);
}
END_TEST

/*
 * Chunk sizes follow the measured costs: a steeper curve gives shorter
 * chunks, and launches measured later move it (a kernel faster than the
 * calibration said gets longer chunks). Without any time known, the rate
 * per row decides.
 */
START_TEST(test_prefill_follows_costs) {
  ql__sched_config c = cfg_default();
  c.max_batch_rows = 4096;
  c.prefill_chunk_us = 1000;
  c.default_ns_per_row = 10 * US;
  ql__sched *s = mk(&c);
  ql__sched_req p, d, *fin;
  rq(&d, &W2, WO, 1, 2);
  ck_assert_int_eq(ql__sched_submit(s, &d, 1), 0);
  /* No curve: 10 us a row, 100 rows; the launch (100 rows, 1 ms) then
   * becomes the curve's one point. */
  rq(&p, &W1, AQ, 4000, 1);
  ck_assert_int_eq(ql__sched_submit(s, &p, 1), 0);
  ck_assert_uint_eq(run_one(s, 2, 40 * US, &fin), 1); /* decode first */
  ck_assert_uint_eq(run_one(s, 3, 1000 * US, &fin), 100);
  /* In proportion past the point: still 100. */
  ck_assert_uint_eq(run_one(s, 4, 1000 * US, &fin), 100);
  /* A GPU-like kernel: 512 rows cost 400 us, 4096 rows 1.6 ms. */
  static const uint32_t m2[] = {1, 512, 4096};
  static const uint64_t ns2[] = {200 * US, 400 * US, 1600 * US};
  ck_assert_int_eq(ql__sched_set_curve(s, &W1, 0, m2, ns2, 3), 0);
  /* 1 ms: 512 + (600/1200) * 3584 = 2304 rows. */
  ck_assert_uint_eq(run_one(s, 5, 1000 * US, &fin), 2304);
  /* The launch took 1 ms as estimated; the last 1496 rows fit. */
  ck_assert_uint_eq(run_one(s, 6, 800 * US, &fin), 1496);
  ck_assert_ptr_eq(fin, &p);
  /* A steeper kernel: 1 ms per 50 rows. */
  static const uint32_t m3[] = {1, 64};
  static const uint64_t ns3[] = {20 * US, 1280 * US};
  ck_assert_int_eq(ql__sched_set_curve(s, &W3, 0, m3, ns3, 2), 0);
  rq(&p, &W3, AQ, 300, 1);
  ck_assert_int_eq(ql__sched_submit(s, &p, 7), 0);
  uint32_t rows = run_one(s, 8, 1000 * US, &fin);
  ck_assert_uint_eq(rows, 50);
  /* It ran in 500 us instead of 1 ms: the point at 50 rows moves a
   * quarter of the way, 875 us, and the chunk grows. */
  ck_assert_uint_eq(run_one(s, 9, 500 * US, &fin), 50);
  ck_assert_uint_eq(ql__sched_launch_ns(s, &W3, 0, AQ, 50), 875 * US);
  ck_assert_uint_gt(run_one(s, 10, 500 * US, &fin), 50);
  /* Bad curves. */
  ck_assert_int_eq(ql__sched_set_curve(s, &W3, 1, m3, ns3, 2), QL_EINVAL);
  static const uint32_t zr[] = {0};
  ck_assert_int_eq(ql__sched_set_curve(s, &W3, 0, zr, ns3, 1), QL_EINVAL);
  static const uint64_t zn[] = {0};
  ck_assert_int_eq(ql__sched_set_curve(s, &W3, 0, m3, zn, 1), QL_EINVAL);
  ck_assert_int_eq(ql__sched_set_curve(s, NULL, 0, m3, ns3, 2), QL_EINVAL);
  c.prefill_chunk_us = QL_SCHED_MAX_CHUNK_US + 1;
  ck_assert_int_eq(ql__sched_configure(s, &c), QL_EINVAL);
  ql__sched_remove_all(s, QL_ESHUTDOWN, &fin);
  ql__sched_free(s);
}
END_TEST

/*
 * A device of two lanes: a lone prefill takes one lane and a second
 * prefill the other; with decode about, a second prefill waits so that a
 * lane stays free, and a decode arriving runs on it at once, whatever the
 * running prefill's size (it is never cut).
 */
START_TEST(test_prefill_lanes) {
  ql__sched_config c = cfg_default();
  c.max_batch_rows = 1024;
  c.prefill_chunk_us = 100;
  c.lanes[0] = 2;
  ql__sched *s = mk(&c);
  ql__sched_req p1, p2, p3, d, *fin;
  ql__sched_batch b1, b2, b3, bd;
  ql__sched_slice s1[4], s2[4], s3[4], sd[4];
  rq(&p1, &W1, AQ, 512, 1);
  rq(&p2, &W1, AQ, 512, 2);
  ck_assert_int_eq(ql__sched_submit(s, &p1, 1), 0);
  bt(&b1, s1, 1);
  ck_assert_int_eq(ql__sched_next(s, 0, 2, &b1), 0);
  ck_assert_uint_eq(b1.rows, 512);
  ck_assert_int_eq(ql__sched_submit(s, &p2, 3), 0);
  bt(&b2, s2, 1);
  ck_assert_int_eq(ql__sched_next(s, 0, 4, &b2), 0);
  ck_assert_uint_eq(b2.rows, 512); /* no decode about: both lanes */
  ql__sched_complete(s, &b1, 1000 * US, &fin);
  ql__sched_complete(s, &b2, 1000 * US, &fin);
  /* Decode about. */
  rq(&d, &W2, WO, 1, 3);
  ck_assert_int_eq(ql__sched_submit(s, &d, 5), 0);
  ck_assert_uint_eq(run_one(s, 6, 20 * US, &fin), 1);
  rq(&p1, &W1, AQ, 512, 1);
  rq(&p2, &W1, AQ, 512, 2);
  ck_assert_int_eq(ql__sched_submit(s, &p1, 7), 0);
  ck_assert_int_eq(ql__sched_submit(s, &p2, 7), 0);
  bt(&b1, s1, 1);
  ck_assert_int_eq(ql__sched_next(s, 0, 8, &b1), 0);
  ck_assert_uint_eq(b1.rows, 512); /* whole: decode has its lane */
  bt(&b2, s2, 1);
  ck_assert_int_eq(ql__sched_next(s, 0, 9, &b2), 0);
  ck_assert_uint_eq(b2.n, 0); /* p2 keeps the lane free */
  ck_assert_uint_eq(b2.retry_ns, 0);
  rq(&d, &W2, WO, 1, 3);
  ck_assert_int_eq(ql__sched_submit(s, &d, 10), 0);
  bt(&bd, sd, 1);
  ck_assert_int_eq(ql__sched_next(s, 0, 11, &bd), 0);
  ck_assert_ptr_eq(bd.slice[0].req, &d);
  /* Both lanes busy; the decode ends, p2 still waits for p1. */
  ql__sched_complete(s, &bd, 20 * US, &fin);
  ck_assert_ptr_eq(fin, &d);
  bt(&b2, s2, 1);
  ck_assert_int_eq(ql__sched_next(s, 0, 12, &b2), 0);
  ck_assert_uint_eq(b2.n, 0);
  ql__sched_complete(s, &b1, 1000 * US, &fin);
  ck_assert_ptr_eq(fin, &p1);
  bt(&b2, s2, 1);
  ck_assert_int_eq(ql__sched_next(s, 0, 13, &b2), 0);
  ck_assert_uint_eq(b2.rows, 512);
  /* A third prefill once decode has been quiet for the window: the
   * second lane is free for it. */
  rq(&p3, &W1, AQ, 8, 4);
  uint64_t later = 13 + QL_SCHED_DECODE_WINDOW_NS;
  ck_assert_int_eq(ql__sched_submit(s, &p3, later), 0);
  bt(&b3, s3, 1);
  ck_assert_int_eq(ql__sched_next(s, 0, later, &b3), 0);
  ck_assert_uint_eq(b3.rows, 8);
  ql__sched_complete(s, &b3, 100 * US, &fin);
  ck_assert_ptr_eq(fin, &p3);
  ql__sched_complete(s, &b2, 1000 * US, &fin);
  ck_assert_ptr_eq(fin, &p2);
  ql__sched_free(s);
}
END_TEST

/* ------------------------------------------------------------ property */

/*
 * A model of what the scheduler holds, checked after every operation of a
 * long random run: every request comes back exactly once with the right
 * status; its rows are dispatched in order, each exactly once (each slice
 * starts where the previous one ended); batches never mix weights, classes
 * or devices and never exceed their row cap or slice room; nothing starts
 * after its deadline; quotas and queue bounds hold; and, without
 * max_queue_delay_us, the policy itself: decode before prefill, the
 * oldest request of the class first, batches as full as the queue allows.
 */
#define P_REQS 1500
#define P_FLIGHT 6
#define P_SESS 4

typedef struct mreq {
  ql__sched_req r; /* first: the scheduler's view */
  int in;          /* submitted and not handed back */
  int back;        /* handed back (once) */
  int cut;         /* removed while rows ran */
  int code;        /* the removal's status, when cut */
  uint32_t disp, done;
} mreq;

typedef struct pstate {
  ql__sched *s;
  ql__sched_config c;
  mreq *m;
  int nm;
  uint64_t now;
  const void *weights[3];
  ql__sched_batch fl[P_FLIGHT];
  ql__sched_slice fsl[P_FLIGHT][24];
  int fused[P_FLIGHT];
  uint64_t sess_in[P_SESS];
} pstate;

static mreq *M(ql__sched_req *r) { return (mreq *)r; }

static uint32_t cap_of(const ql__sched_config *c, ql__sched_class p) {
  uint32_t cap = c->max_batch_rows;
  if (p == AQ && c->prefill_chunk_rows && c->prefill_chunk_rows < cap)
    cap = c->prefill_chunk_rows;
  return cap;
}

/* Waiting in the model: in the scheduler with rows not yet dispatched and
 * not cut. */
static int waiting(const mreq *q) {
  return q->in && !q->cut && q->disp < q->r.rows;
}

static int same_queue(const mreq *a, const mreq *b) {
  return a->r.weight == b->r.weight && a->r.on_device == b->r.on_device &&
         a->r.cls == b->r.cls;
}

static void hand_back(pstate *ps, ql__sched_req *r, int status) {
  mreq *q = M(r);
  REQUIRE(q >= ps->m && q < ps->m + ps->nm, "a request we never made");
  REQUIRE(q->in && !q->back, "request %d handed back twice", (int)(q - ps->m));
  REQUIRE(r->status == status, "request %d: status %d, want %d",
          (int)(q - ps->m), r->status, status);
  REQUIRE(q->done == q->disp, "request %d back with rows running",
          (int)(q - ps->m));
  if (status == 0)
    REQUIRE(q->done == r->rows, "request %d back early", (int)(q - ps->m));
  q->in = 0;
  q->back = 1;
  ps->sess_in[r->session]--;
}

static void p_submit(pstate *ps, uint64_t *rng) {
  if (ps->nm == P_REQS)
    return;
  mreq *q = &ps->m[ps->nm];
  memset(q, 0, sizeof *q);
  ql__sched_req *r = &q->r;
  r->weight = ps->weights[tu_rng_next(rng) % 3];
  r->cls = tu_rng_next(rng) % 3 ? WO : AQ;
  r->rows = 1 + (uint32_t)(tu_rng_next(rng) % (r->cls == AQ ? 30 : 6));
  r->session = tu_rng_next(rng) % P_SESS;
  unsigned nd = ps->c.n_devices;
  if (tu_rng_next(rng) % 2) {
    r->device = (int)(tu_rng_next(rng) % nd);
  } else {
    r->device = -1;
    r->holders = tu_rng_next(rng) & ((1u << nd) - 1);
  }
  if (tu_rng_next(rng) % 3 == 0)
    r->deadline_ns = ps->now + tu_rng_next(rng) % (200 * US);
  int rc = ql__sched_submit(ps->s, r, ps->now);
  uint64_t cand = r->device >= 0 ? (uint64_t)1 << r->device : r->holders;
  if (rc == QL_ENOTFOUND) {
    REQUIRE(r->device < 0 && cand == 0, "ENOTFOUND with holders");
    return;
  }
  if (rc == QL_EDEADLINE) {
    REQUIRE(r->deadline_ns != 0 && r->deadline_ns <= ps->now, "EDEADLINE");
    return;
  }
  REQUIRE(cand != 0, "accepted without a device");
  if (rc == QL_EEXHAUSTED) {
    int quota =
        ps->c.session_quota && ps->sess_in[r->session] >= ps->c.session_quota;
    int full = 1;
    for (unsigned d = 0; d < nd; d++)
      if (cand >> d & 1)
        full &=
            ql__sched_waiting(ps->s, r->weight, d, r->cls) >= ps->c.max_queue;
    REQUIRE(quota || full, "EEXHAUSTED with room");
    return;
  }
  REQUIRE(rc == 0, "submit: %d", rc);
  REQUIRE(cand >> r->on_device & 1, "queued on a device not asked for");
  REQUIRE(ps->c.session_quota == 0 ||
              ps->sess_in[r->session] < ps->c.session_quota,
          "quota passed");
  q->in = 1;
  ps->sess_in[r->session]++;
  ps->nm++;
  REQUIRE(ql__sched_waiting(ps->s, r->weight, r->on_device, r->cls) <=
              ps->c.max_queue,
          "queue over its bound");
}

static void p_next(pstate *ps, uint64_t *rng) {
  int f = 0;
  while (f < P_FLIGHT && ps->fused[f])
    f++;
  if (f == P_FLIGHT)
    return;
  unsigned dev = (unsigned)(tu_rng_next(rng) % ps->c.n_devices);
  ql__sched_batch *b = &ps->fl[f];
  bt(b, ps->fsl[f], 4 + (uint32_t)(tu_rng_next(rng) % 21));
  REQUIRE(ql__sched_next(ps->s, dev, ps->now, b) == 0, "next");
  for (ql__sched_req *r = b->expired, *nx; r != NULL; r = nx) {
    nx = r->next;
    REQUIRE(r->on_device == dev, "expired from another device");
    REQUIRE(r->deadline_ns != 0 && r->deadline_ns <= ps->now, "not due");
    REQUIRE(M(r)->disp == 0, "expired after starting");
    hand_back(ps, r, QL_EDEADLINE);
  }
  /* No request left waiting on this device may be due and unstarted. */
  for (int i = 0; i < ps->nm; i++) {
    const mreq *q = &ps->m[i];
    REQUIRE(!(waiting(q) && q->r.on_device == dev && q->disp == 0 &&
              q->r.deadline_ns && q->r.deadline_ns <= ps->now),
            "due request %d left waiting", i);
  }
  if (b->n == 0) {
    int any = 0;
    for (int i = 0; i < ps->nm; i++)
      any |= waiting(&ps->m[i]) && ps->m[i].r.on_device == dev;
    if (ps->c.max_queue_delay_us == 0 && ps->c.decode_hold_us == 0)
      REQUIRE(!any, "nothing dispatched with work waiting");
    REQUIRE(any ? b->retry_ns > ps->now : b->retry_ns == 0, "retry_ns");
    uint64_t held = ps->c.max_queue_delay_us > ps->c.decode_hold_us
                        ? ps->c.max_queue_delay_us
                        : ps->c.decode_hold_us;
    REQUIRE(b->retry_ns <= ps->now + held * US, "retry_ns past the holds");
    return;
  }
  uint32_t cap = cap_of(&ps->c, b->cls), rows = 0;
  REQUIRE(b->n <= b->cap, "slice room");
  REQUIRE(b->device == dev, "device");
  const mreq *first = M(b->slice[0].req);
  /* The oldest waiting request of this queue comes first... */
  for (int i = 0; i < ps->nm; i++) {
    const mreq *q = &ps->m[i];
    if (waiting(q) && same_queue(q, first))
      REQUIRE(q->r.seq >= first->r.seq, "FIFO: %d waits, older", i);
  }
  if (ps->c.max_queue_delay_us == 0) {
    /* ... and, with nothing held, of its class on this device; decode
     * before prefill. */
    for (int i = 0; i < ps->nm; i++) {
      const mreq *q = &ps->m[i];
      if (!waiting(q) || q->r.on_device != dev)
        continue;
      REQUIRE(!(b->cls == AQ && q->r.cls == WO),
              "prefill launched with decode %d waiting", i);
      /* (A decode queue waiting for its rows to come back may be
       * passed by another.) */
      if (q->r.cls == b->cls && ps->c.decode_hold_us == 0)
        REQUIRE(q->r.seq >= first->r.seq, "request %d is older", i);
    }
  }
  uint64_t prev_seq = 0;
  for (uint32_t i = 0; i < b->n; i++) {
    ql__sched_slice *sl = &b->slice[i];
    mreq *q = M(sl->req);
    REQUIRE(waiting(q), "slice of a request not waiting");
    REQUIRE(sl->req->weight == b->weight && sl->req->cls == b->cls &&
                sl->req->on_device == dev,
            "batch mixes queues");
    REQUIRE(sl->req->seq > prev_seq, "slices out of order");
    prev_seq = sl->req->seq;
    REQUIRE(sl->rows > 0 && sl->offset == q->disp &&
                sl->rows <= sl->req->rows - q->disp,
            "rows out of order or twice");
    if (sl->offset == 0)
      REQUIRE(sl->req->deadline_ns == 0 || sl->req->deadline_ns > ps->now,
              "started after its deadline");
    /* Every slice but the last takes the rest of its request. */
    if (i + 1 < b->n)
      REQUIRE(sl->rows == sl->req->rows - q->disp, "split in the middle");
    q->disp += sl->rows;
    rows += sl->rows;
  }
  REQUIRE(rows == b->rows && rows <= cap, "rows %u, cap %u", rows, cap);
  /* As full as the queue allows. */
  int more = 0;
  for (int i = 0; i < ps->nm; i++)
    more |= waiting(&ps->m[i]) && same_queue(&ps->m[i], first);
  if (more)
    REQUIRE(rows == cap || b->n == b->cap, "batch not full");
  ps->fused[f] = 1;
}

static void p_complete(pstate *ps, uint64_t *rng) {
  int f = (int)(tu_rng_next(rng) % P_FLIGHT);
  if (!ps->fused[f])
    return;
  ql__sched_batch *b = &ps->fl[f];
  ql__sched_req *fin;
  int want = 0;
  for (uint32_t i = 0; i < b->n; i++)
    M(b->slice[i].req)->done += b->slice[i].rows;
  /* A request is in a batch once: these are the ones with nothing left. */
  for (uint32_t i = 0; i < b->n; i++) {
    const mreq *q = M(b->slice[i].req);
    want += q->done == q->disp && (q->disp == q->r.rows || q->cut);
  }
  b->end_ns = ps->now; /* decode holds follow */
  ql__sched_complete(ps->s, b, tu_rng_next(rng) % (50 * US), &fin);
  int nfin = 0;
  for (ql__sched_req *r = fin, *nx; r != NULL; r = nx) {
    nx = r->next;
    int found = 0;
    for (uint32_t i = 0; i < b->n; i++)
      found |= b->slice[i].req == r;
    REQUIRE(found, "finished request not in the batch");
    hand_back(ps, r, M(r)->cut ? M(r)->code : 0);
    nfin++;
  }
  REQUIRE(nfin == want, "finished %d, want %d", nfin, want);
  ps->fused[f] = 0;
}

/* Removal (one session, or all) and the timer sweep. */
static void p_remove(pstate *ps, uint64_t *rng, int all) {
  ql__sched_req *out;
  uint64_t sess = tu_rng_next(rng) % P_SESS;
  int code = all ? QL_ESHUTDOWN : QL_ESESSION;
  int want = 0;
  for (int i = 0; i < ps->nm; i++) {
    mreq *q = &ps->m[i];
    if (waiting(q) && (all || q->r.session == sess)) {
      if (q->done == q->disp) {
        want++;
      } else {
        q->cut = 1;
        q->code = code;
      }
    }
  }
  if (all)
    ql__sched_remove_all(ps->s, code, &out);
  else
    ql__sched_remove_session(ps->s, sess, code, &out);
  int n = 0;
  for (ql__sched_req *r = out, *nx; r != NULL; r = nx) {
    nx = r->next;
    REQUIRE(all || r->session == sess, "another session's request");
    hand_back(ps, r, code);
    n++;
  }
  REQUIRE(n == want, "removed %d, want %d", n, want);
}

static void p_expire(pstate *ps) {
  ql__sched_req *out;
  int want = 0;
  for (int i = 0; i < ps->nm; i++) {
    const mreq *q = &ps->m[i];
    want += waiting(q) && q->disp == 0 && q->r.deadline_ns &&
            q->r.deadline_ns <= ps->now;
  }
  ql__sched_expire(ps->s, ps->now, &out);
  int n = 0;
  for (ql__sched_req *r = out, *nx; r != NULL; r = nx) {
    nx = r->next;
    hand_back(ps, r, QL_EDEADLINE);
    n++;
  }
  REQUIRE(n == want, "expired %d, want %d", n, want);
}

static void p_check_counts(pstate *ps, int queues) {
  for (uint64_t k = 0; k < P_SESS; k++)
    REQUIRE(ql__sched_session_count(ps->s, k) == ps->sess_in[k],
            "session %d count", (int)k);
  if (!queues)
    return;
  for (int w = 0; w < 3; w++)
    for (unsigned d = 0; d < ps->c.n_devices; d++)
      for (int p = WO; p <= AQ; p++) {
        size_t n = 0;
        for (int i = 0; i < ps->nm; i++) {
          const mreq *q = &ps->m[i];
          n += waiting(q) && q->r.weight == ps->weights[w] &&
               q->r.on_device == d && q->r.cls == (ql__sched_class)p;
        }
        REQUIRE(ql__sched_waiting(ps->s, ps->weights[w], d, (ql__sched_class)p) == n,
                "queue (%d, %u, %d) length", w, d, p);
      }
}

static void run_property(uint64_t seed) {
  uint64_t rng = seed;
  static const char wk[3] = {0};
  pstate *ps = tu_xmalloc(sizeof *ps);
  memset(ps, 0, sizeof *ps);
  ps->m = tu_xmalloc(P_REQS * sizeof *ps->m);
  ps->weights[0] = &wk[0];
  ps->weights[1] = &wk[1];
  ps->weights[2] = &wk[2];
  ps->c.max_batch_rows = 1 + (uint32_t)(tu_rng_next(&rng) % 16);
  ps->c.prefill_chunk_rows = (uint32_t)(tu_rng_next(&rng) % 9);
  ps->c.max_queue = 1 + tu_rng_next(&rng) % 8;
  ps->c.session_quota = tu_rng_next(&rng) % 12;
  ps->c.n_devices = 1 + (unsigned)(tu_rng_next(&rng) % 3);
  ps->c.max_queue_delay_us = seed % 3 == 0 ? tu_rng_next(&rng) % 50 : 0;
  /* Holds follow the curves the random completions teach. */
  ps->c.decode_hold_us = seed % 3 == 1 ? tu_rng_next(&rng) % 50 : 0;
  ck_assert_int_eq(ql__sched_create(&ps->c, &ps->s), 0);
  for (int step = 0; step < 8000; step++) {
    ps->now += tu_rng_next(&rng) % (5 * US);
    unsigned a = (unsigned)(tu_rng_next(&rng) % 100);
    if (a < 40)
      p_submit(ps, &rng);
    else if (a < 70)
      p_next(ps, &rng);
    else if (a < 96)
      p_complete(ps, &rng);
    else if (a < 98)
      p_expire(ps);
    else if (a < 99)
      p_remove(ps, &rng, 0);
    else if (tu_rng_next(&rng) % 8 == 0)
      p_remove(ps, &rng, 1);
    p_check_counts(ps, step % 64 == 0);
  }
  /* Drain: finish what runs, then run everything still waiting. */
  for (int round = 0; round < 100000; round++) {
    int busy = 0;
    for (int f = 0; f < P_FLIGHT; f++)
      busy |= ps->fused[f];
    int any = 0;
    for (int i = 0; i < ps->nm; i++)
      any |= ps->m[i].in;
    if (!busy && !any)
      break;
    ps->now += 10 * US;
    p_next(ps, &rng);
    p_complete(ps, &rng);
  }
  for (int i = 0; i < ps->nm; i++) {
    const mreq *q = &ps->m[i];
    REQUIRE(q->back && !q->in, "request %d never came back", i);
    if (q->r.status == 0)
      REQUIRE(q->disp == q->r.rows && q->done == q->r.rows,
              "request %d: %u of %u rows", i, q->done, q->r.rows);
  }
  for (unsigned d = 0; d < ps->c.n_devices; d++)
    REQUIRE(ql__sched_device_load(ps->s, d) == 0, "device %u load", d);
  p_check_counts(ps, 1);
  ql__sched_free(ps->s);
  free(ps->m);
  free(ps);
}

START_TEST(test_property) {
  for (uint64_t seed = 1; seed <= 24; seed++)
    run_property(seed * 0x9E3779B97F4A7C15ull + (uint64_t)_i);
}
END_TEST

int main(void) {
  Suite *s = suite_create("scheduler");
  TCase *tc = tcase_create("scheduler");
  tcase_add_test(tc, test_config);
  tcase_add_test(tc, test_submit_invalid);
  tcase_add_test(tc, test_fifo);
  tcase_add_test(tc, test_tenants);
  tcase_add_test(tc, test_coalesce);
  tcase_add_test(tc, test_wo_before_aq);
  tcase_add_test(tc, test_prefill_chunks);
  tcase_add_test(tc, test_prefill_by_time);
  tcase_add_test(tc, test_prefill_stops);
  tcase_add_test(tc, test_prefill_follows_costs);
  tcase_add_test(tc, test_prefill_lanes);
  tcase_add_test(tc, test_fairness);
  tcase_add_test(tc, test_fairness_alternate);
  tcase_add_test(tc, test_delay);
  tcase_add_test(tc, test_decode_hold);
  tcase_add_test(tc, test_deadlines);
  tcase_add_test(tc, test_exhausted);
  tcase_add_test(tc, test_remove_session);
  tcase_add_test(tc, test_remove_all);
  tcase_add_test(tc, test_device_choice);
  tcase_add_test(tc, test_stats);
  tcase_add_test(tc, test_many_keys);
  tcase_add_loop_test(tc, test_property, 0, 2);
  suite_add_tcase(s, tc);
  return tu_run_suite(s, CK_NORMAL);
}
