/*
 * test_fastpath.c - the session ring (proto/ql_ring.h, daemon/net/ring.c,
 * client/lib/ring.c) against a real qlineard: replies byte-identical to the
 * message path; hostile slots and indices written by a raw client that
 * maps the ring itself; a client killed mid-request; one that stops
 * consuming completions; a session ended with requests in flight; x
 * rewritten while its batch runs; idle rings that cost no CPU; the lease;
 * and clients that refuse the ring.
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "harness.h"
#include "ql_kernels.h"
#include "ql_ring.h"
#include "qlinear/qlinear.h"
#include "testutil.h"

/* ------------------------------------------------------------- helpers */

static int load(ql_client *c, const char *name, const td_layer *l,
                ql_format f, uint32_t gs) {
  return td_load(c, name, l, f, gs, 0, NULL, NULL);
}

static ql_stats_info *stats(ql_client *c) {
  ql_stats_info *st = NULL;
  ck_assert_int_eq(ql_stats(c, &st), 0);
  return st;
}

static uint64_t ring_requests(ql_client *c) {
  ql_stats_info *st = stats(c);
  uint64_t n = st->ring_requests;
  ql_stats_free(st);
  return n;
}

/* The in-process reference (same quantization, same generic op). */
static void *reference(const td_layer *l, ql_format f, uint32_t gs,
                       ql_path path, ql_dtype dt, const void *x, uint64_t m) {
  ql_qweight *q = NULL;
  ql_quant_params p = {f, gs, 0, (ql_dtype)0};
  ck_assert_int_eq(ql_qweight_quantize(&p, (int64_t)l->n, (int64_t)l->k,
                                       QL_DTYPE_F32, l->w, l->b, &q),
                   0);
  void *y = tu_xmalloc(m * l->n * ql_dtype_size(dt));
  int rc = path == QL_PATH_WEIGHT_ONLY
               ? ql_linear_wo_ref(q, dt, x, (int64_t)m, y)
               : ql_linear_aq_ref(q, dt, x, (int64_t)m, y);
  ck_assert_int_eq(rc, 0);
  ql_qweight_free(q);
  return y;
}

/* x as dtype dt from floats. */
static void *as_dtype(const float *xf, size_t n, ql_dtype dt) {
  void *x = tu_xmalloc(n * ql_dtype_size(dt));
  ql_from_f32(dt, xf, x, n);
  return x;
}

/* ------------------------------------------------ a raw ring of a test */

/* A session and its ring, driven by hand: what libqlinear does, and what
 * it never would. */
typedef struct raw {
  td_session s;
  ql_ring r;
  int bell;
  uint32_t sq_tail, cq_head;
} raw;

/* Opens a session and its ring of entries slots. */
static void raw_open(const td *d, raw *w, uint32_t entries) {
  memset(w, 0, sizeof *w);
  ck_assert_int_eq(td_session_open(d, &w->s), 0);
  Qlinear__V1__SessionRequest req = QLINEAR__V1__SESSION_REQUEST__INIT;
  Qlinear__V1__CreateRingRequest cr = QLINEAR__V1__CREATE_RING_REQUEST__INIT;
  cr.entries = entries;
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_CREATE_RING;
  req.create_ring = &cr;
  int fds[2];
  Qlinear__V1__SessionResponse *r = td_session_call_fds(&w->s, &req, fds,
                                                        5000);
  ck_assert_ptr_nonnull(r);
  ck_assert_msg(r->status == NULL || r->status->code == 0,
                "create_ring: %s", r->status ? r->status->message : "");
  ck_assert_int_eq(r->body_case,
                   QLINEAR__V1__SESSION_RESPONSE__BODY_CREATE_RING);
  ck_assert_uint_eq(r->create_ring->entries, entries);
  ck_assert_int_ge(fds[0], 0);
  ck_assert_int_ge(fds[1], 0);
  size_t size = (size_t)r->create_ring->size;
  ck_assert_uint_eq(size, ql__ring_size(entries));
  qlinear__v1__session_response__free_unpacked(r, NULL);
  void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0],
                    0);
  ck_assert_ptr_ne(base, MAP_FAILED);
  close(fds[0]);
  ck_assert_int_eq(ql__ring_attach(base, size, &w->r), 0);
  w->bell = fds[1];
}

static void raw_close(raw *w) {
  td_session_close(&w->s);
  if (w->r.hdr != NULL)
    munmap(w->r.hdr, w->r.size);
  if (w->bell >= 0)
    close(w->bell);
  w->r.hdr = NULL;
  w->bell = -1;
}

static void raw_ring_bell(const raw *w) {
  uint64_t one = 1;
  ck_assert_int_eq(write(w->bell, &one, sizeof one), (ssize_t)sizeof one);
}

/* Puts len bytes (any bytes) with tag in the next slot and publishes it;
 * claim is the length the slot says it holds. */
static void raw_post_bytes(raw *w, uint64_t tag, const void *msg, size_t len,
                           uint32_t claim) {
  ql_ring_entry *e = &w->r.sq[w->sq_tail & (w->r.entries - 1)];
  memcpy(e->msg, msg, len);
  e->tag = tag;
  e->len = claim;
  e->flags = 0;
  if (ql__ring_sq_publish(&w->r, w->sq_tail))
    raw_ring_bell(w);
  w->sq_tail++;
}

static void raw_post(raw *w, uint64_t tag, const Qlinear__V1__Request *req) {
  uint8_t buf[QL_RING_MSG_MAX];
  size_t len = qlinear__v1__request__get_packed_size(req);
  ck_assert_uint_le(len, sizeof buf);
  qlinear__v1__request__pack(req, buf);
  raw_post_bytes(w, tag, buf, len, (uint32_t)len);
}

/* Completions published and not yet taken. */
static uint32_t raw_ready(const raw *w) {
  return atomic_load(&w->r.hdr->cq_tail) - w->cq_head;
}

/* Waits up to timeout_ms for a completion; takes it: its tag and decoded
 * Response (NULL if it does not decode). 0, or -1 on timeout. */
static int raw_take(raw *w, uint64_t *tag, Qlinear__V1__Response **resp,
                    int timeout_ms, int consume) {
  int64_t end = td_now_ms() + timeout_ms;
  while (raw_ready(w) == 0) {
    if (td_now_ms() > end)
      return -1;
    ql__ring_wait(&w->r, w->cq_head, 10000000);
  }
  const ql_ring_entry *e = &w->r.cq[w->cq_head & (w->r.entries - 1)];
  ck_assert_uint_le(e->len, QL_RING_MSG_MAX);
  *tag = e->tag;
  *resp = qlinear__v1__response__unpack(NULL, e->len, e->msg);
  if (consume) {
    w->cq_head++;
    if (ql__ring_cq_release(&w->r, w->cq_head))
      raw_ring_bell(w);
  }
  return 0;
}

/* True once the daemon closed the session socket (it ended the session). */
static int raw_ended(const raw *w, int timeout_ms) {
  struct pollfd p = {w->s.fd, POLLIN | POLLRDHUP, 0};
  int64_t end = td_now_ms() + timeout_ms;
  while (td_now_ms() < end) {
    if (poll(&p, 1, 50) > 0 && (p.revents & (POLLHUP | POLLRDHUP)))
      return 1;
  }
  return 0;
}

/* A region of the raw session, mapped here. */
typedef struct raw_region {
  uint64_t id;
  size_t size;
  uint8_t *data;
} raw_region;

static void raw_region_new(raw *w, size_t size, raw_region *rg) {
  int fd = -1;
  ck_assert_int_eq(td_region_create(&w->s, size, &rg->id, &fd), 0);
  rg->size = size;
  rg->data = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ck_assert_ptr_ne(rg->data, MAP_FAILED);
  close(fd);
}

/* A Linear request of weight on m rows of f32 x at xoff of region xr, y
 * at yoff of region yr. The caller's structs hold it. */
typedef struct lin_msg {
  Qlinear__V1__Request req;
  Qlinear__V1__LinearRequest lr;
  Qlinear__V1__Tensor xt;
  Qlinear__V1__RegionSlice xs, ys;
  uint64_t shape[2];
} lin_msg;

static void lin_msg_make(lin_msg *L, const char *weight, uint64_t m,
                         uint64_t k, uint64_t n, uint64_t xr, uint64_t xoff,
                         uint64_t yr, uint64_t yoff, uint64_t id) {
  qlinear__v1__request__init(&L->req);
  qlinear__v1__linear_request__init(&L->lr);
  qlinear__v1__tensor__init(&L->xt);
  qlinear__v1__region_slice__init(&L->xs);
  qlinear__v1__region_slice__init(&L->ys);
  L->shape[0] = m;
  L->shape[1] = k;
  L->xt.dtype = QLINEAR__V1__DTYPE__DTYPE_F32;
  L->xt.shape = L->shape;
  L->xt.n_shape = 2;
  L->xt.data_case = QLINEAR__V1__TENSOR__DATA_REGION;
  L->xt.region = &L->xs;
  L->xs.region_id = xr;
  L->xs.offset = xoff;
  L->xs.length = m * k * 4;
  L->ys.region_id = yr;
  L->ys.offset = yoff;
  L->ys.length = m * n * 4;
  L->lr.weight = (char *)weight;
  L->lr.x = &L->xt;
  L->lr.y_out = &L->ys;
  L->lr.path = QLINEAR__V1__PATH__PATH_WEIGHT_ONLY;
  L->req.request_id = id;
  L->req.body_case = QLINEAR__V1__REQUEST__BODY_LINEAR;
  L->req.linear = &L->lr;
}

static int status_of(const Qlinear__V1__Response *r) {
  return r == NULL ? 1 : r->status != NULL ? r->status->code : 0;
}

/* ------------------------------------------------------------- tests */

/* Replies on the ring are the message path's, byte for byte: Linear with
 * inline (staged) and region tensors, LinearMulti, every dtype and path,
 * several row counts. The ring client's requests are counted as ring
 * requests, the other's are not. */
START_TEST(test_same_bytes) {
  td d;
  td_start(&d, NULL);
  ql_client *R = td_connect(&d), *M = td_connect_messages(&d);
  td_layer a, b;
  td_layer_make(&a, 48, 96, 11, 1);
  td_layer_make(&b, 40, 96, 12, 0);
  ck_assert_int_eq(load(R, "fp/a", &a, QL_FORMAT_Q4G, 32), 0);
  ck_assert_int_eq(load(R, "fp/b", &b, QL_FORMAT_Q8C, 0), 0);
  ck_assert_int_eq(ql_hold(M, "fp/a", NULL, NULL), 0);
  ck_assert_int_eq(ql_hold(M, "fp/b", NULL, NULL), 0);
  ql_region *rx = NULL, *ry = NULL;
  ck_assert_int_eq(ql_region_create(R, 1 << 20, &rx), 0);
  ck_assert_int_eq(ql_region_create(R, 1 << 20, &ry), 0);
  uint64_t seed = 5, calls = 0, r0 = ring_requests(M);
  static const uint64_t ms[] = {1, 5, 33};
  for (int dt = QL_DTYPE_F32; dt <= QL_DTYPE_BF16; dt++) {
    size_t es = ql_dtype_size((ql_dtype)dt);
    for (int path = QL_PATH_AUTO; path <= QL_PATH_ACT_QUANT; path++) {
      for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
        uint64_t m = ms[mi];
        float *xf = tu_xmalloc(m * 96 * 4);
        td_randn(&seed, xf, m * 96, 1.0f);
        void *x = as_dtype(xf, m * 96, (ql_dtype)dt);
        uint8_t *ym = tu_xmalloc(m * 48 * es), *yr = tu_xmalloc(m * 48 * es);
        ql_linear_result rm, rr;
        ck_assert_int_eq(ql_linear(M, "fp/a", (ql_path)path, (ql_dtype)dt, m,
                                   96, x, 48, ym, &rm),
                         0);
        ck_assert_int_eq(ql_linear(R, "fp/a", (ql_path)path, (ql_dtype)dt, m,
                                   96, x, 48, yr, &rr),
                         0);
        calls++;
        ck_assert_mem_eq(ym, yr, m * 48 * es);
        ck_assert_int_eq(rm.path, rr.path);
        ck_assert_str_eq(rm.impl, rr.impl);
        /* Region tensors of the caller's own. */
        memcpy(rx->data, x, m * 96 * es);
        memset(ry->data, 0xa5, m * 48 * es);
        ql_slice xs = {rx, 0, m * 96 * es}, ys = {ry, 64, m * 48 * es};
        ck_assert_int_eq(ql_linear_region(R, "fp/a", (ql_path)path,
                                          (ql_dtype)dt, m, 96, &xs, 48, &ys,
                                          NULL, &rr),
                         0);
        calls++;
        ck_assert_mem_eq((uint8_t *)ry->data + 64, ym, m * 48 * es);
        /* Both weights on one x. */
        const char *names[2] = {"fp/a", "fp/b"};
        uint64_t ns[2] = {48, 40};
        uint8_t *ma = tu_xmalloc(m * 48 * es), *mb = tu_xmalloc(m * 40 * es);
        uint8_t *ra = tu_xmalloc(m * 48 * es), *rb = tu_xmalloc(m * 40 * es);
        void *yms[2] = {ma, mb}, *yrs[2] = {ra, rb};
        ql_linear_result mres[2], rres[2];
        ck_assert_int_eq(ql_linear_multi(M, 2, names, (ql_path)path,
                                         (ql_dtype)dt, m, 96, x, ns, yms,
                                         mres),
                         0);
        ck_assert_int_eq(ql_linear_multi(R, 2, names, (ql_path)path,
                                         (ql_dtype)dt, m, 96, x, ns, yrs,
                                         rres),
                         0);
        calls++;
        ck_assert_mem_eq(ma, ra, m * 48 * es);
        ck_assert_mem_eq(mb, rb, m * 40 * es);
        ck_assert_mem_eq(ma, ym, m * 48 * es);
        for (int i = 0; i < 2; i++) {
          ck_assert_int_eq(mres[i].path, rres[i].path);
          ck_assert_str_eq(mres[i].impl, rres[i].impl);
        }
        free(ma);
        free(mb);
        free(ra);
        free(rb);
        free(xf);
        free(x);
        free(ym);
        free(yr);
      }
    }
  }
  /* Errors too: the same code either way. */
  float xe[96] = {0}, ye[48];
  ck_assert_int_eq(ql_linear(R, "fp/none", QL_PATH_AUTO, QL_DTYPE_F32, 1, 96,
                             xe, 48, ye, NULL),
                   QL_ENOTFOUND);
  ck_assert_int_eq(ql_linear(M, "fp/none", QL_PATH_AUTO, QL_DTYPE_F32, 1, 96,
                             xe, 48, ye, NULL),
                   QL_ENOTFOUND);
  xe[3] = NAN;
  ck_assert_int_eq(ql_linear(R, "fp/a", QL_PATH_AUTO, QL_DTYPE_F32, 1, 96, xe,
                             48, ye, NULL),
                   QL_ENONFINITE);
  calls += 2;
  /* Every ring call and only those came through the ring. */
  ck_assert_uint_eq(ring_requests(M) - r0, calls);
  ql_stats_info *st = stats(M);
  ck_assert_uint_eq(st->rings, 1); /* R's: M refused one, and the
                                      harness's own session is raw */
  ql_stats_free(st);
  td_layer_free(&a);
  td_layer_free(&b);
  ql_close(R);
  ql_close(M);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* Whatever a client writes into its ring's slots, each request gets an
 * error completion under its own tag, once, and the daemon goes on; a
 * well-formed one in between is answered correctly. */
START_TEST(test_hostile_slots) {
  td d;
  td_start(&d, NULL);
  ql_client *C = td_connect(&d);
  td_layer l;
  td_layer_make(&l, 16, 64, 21, 1);
  ck_assert_int_eq(load(C, "fp/h", &l, QL_FORMAT_Q8C, 0), 0);
  raw w, other;
  raw_open(&d, &w, 8);
  raw_open(&d, &other, 2);
  raw_region rg, og;
  raw_region_new(&w, 1 << 16, &rg);
  raw_region_new(&other, 1 << 16, &og);
  uint64_t seed = 77;
  float *xf = (float *)rg.data;
  td_randn(&seed, xf, 3 * 64, 1.0f);

  struct {
    uint64_t tag;
    int want; /* the status expected, 1: any error */
  } sent[16];
  int ns = 0;
  uint8_t junk[600];
  for (size_t i = 0; i < sizeof junk; i++)
    junk[i] = (uint8_t)(i * 131 + 7);
  /* Bytes that are no Request. */
  raw_post_bytes(&w, 101, junk, sizeof junk, sizeof junk);
  sent[ns].tag = 101, sent[ns++].want = 1;
  /* A slot that claims more than a slot holds. */
  raw_post_bytes(&w, 102, junk, 16, QL_RING_MSG_MAX + 1);
  sent[ns].tag = 102, sent[ns++].want = QL_ETOOBIG;
  /* A body the ring does not carry. */
  Qlinear__V1__Request hello = QLINEAR__V1__REQUEST__INIT;
  Qlinear__V1__HelloRequest hb = QLINEAR__V1__HELLO_REQUEST__INIT;
  hello.body_case = QLINEAR__V1__REQUEST__BODY_HELLO;
  hello.hello = &hb;
  raw_post(&w, 103, &hello);
  sent[ns].tag = 103, sent[ns++].want = QL_EPROTO;
  /* y inline: a completion carries no tensor data. */
  lin_msg L;
  lin_msg_make(&L, "fp/h", 3, 64, 16, rg.id, 0, rg.id, 4096, 7);
  L.lr.y_out = NULL;
  raw_post(&w, 104, &L.req);
  sent[ns].tag = 104, sent[ns++].want = QL_EINVAL;
  /* Another session's region. */
  lin_msg_make(&L, "fp/h", 3, 64, 16, og.id, 0, rg.id, 4096, 8);
  raw_post(&w, 105, &L.req);
  sent[ns].tag = 105, sent[ns++].want = QL_ENOTFOUND;
  /* A slice past the region's end. */
  lin_msg_make(&L, "fp/h", 3, 64, 16, rg.id, rg.size - 100, rg.id, 4096, 9);
  raw_post(&w, 106, &L.req);
  sent[ns].tag = 106, sent[ns++].want = 1;
  /* A good one, which must be right. */
  lin_msg_make(&L, "fp/h", 3, 64, 16, rg.id, 0, rg.id, 4096, 10);
  raw_post(&w, 107, &L.req);
  sent[ns].tag = 107, sent[ns++].want = 0;
  int seen[16] = {0};
  for (int i = 0; i < ns; i++) {
    uint64_t tag;
    Qlinear__V1__Response *r = NULL;
    ck_assert_int_eq(raw_take(&w, &tag, &r, 10000, 1), 0);
    int j = 0;
    while (j < ns && sent[j].tag != tag)
      j++;
    ck_assert_msg(j < ns, "a completion under tag %llu, never sent",
                  (unsigned long long)tag);
    ck_assert_msg(!seen[j], "tag %llu answered twice",
                  (unsigned long long)tag);
    seen[j] = 1;
    int code = status_of(r);
    if (sent[j].want == 1)
      ck_assert_msg(code < 0, "tag %llu: status %d", (unsigned long long)tag,
                    code);
    else
      ck_assert_msg(code == sent[j].want, "tag %llu: status %d, want %d",
                    (unsigned long long)tag, code, sent[j].want);
    if (r != NULL)
      qlinear__v1__response__free_unpacked(r, NULL);
  }
  void *want = reference(&l, QL_FORMAT_Q8C, 0, QL_PATH_WEIGHT_ONLY,
                         QL_DTYPE_F32, xf, 3);
  ck_assert_mem_eq(rg.data + 4096, want, 3 * 16 * 4);
  free(want);
  ck_assert_int_eq(raw_ready(&w), 0); /* nothing more */

  /* A producer index out of range ends the session, and only it. */
  atomic_store(&w.r.hdr->sq_tail, w.sq_tail + 1000);
  raw_ring_bell(&w);
  ck_assert_msg(raw_ended(&w, 5000), "the session outlived a broken ring");
  /* A consumer index out of range too. */
  lin_msg_make(&L, "fp/h", 1, 64, 16, og.id, 0, og.id, 4096, 11);
  raw_post(&other, 201, &L.req);
  uint64_t tag;
  Qlinear__V1__Response *r = NULL;
  ck_assert_int_eq(raw_take(&other, &tag, &r, 10000, 1), 0);
  qlinear__v1__response__free_unpacked(r, NULL);
  atomic_store(&other.r.hdr->cq_head, other.cq_head + 7);
  raw_post(&other, 202, &L.req);
  ck_assert_msg(raw_ended(&other, 5000),
                "the session outlived a completion index out of range");
  raw_close(&w);
  raw_close(&other);
  /* The daemon and its other clients go on. */
  float x1[64], y1[16];
  td_randn(&seed, x1, 64, 1.0f);
  ck_assert_int_eq(ql_linear(C, "fp/h", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 1,
                             64, x1, 16, y1, NULL),
                   0);
  want = reference(&l, QL_FORMAT_Q8C, 0, QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32,
                   x1, 1);
  ck_assert_mem_eq(y1, want, sizeof y1);
  free(want);
  td_layer_free(&l);
  ql_close(C);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* A client that scribbles over its ring (slots, indices, flags) while it
 * posts: the daemon survives, a ring client beside it is served right. */
typedef struct scribble_arg {
  raw *w;
  atomic_int stop;
  uint64_t seed;
} scribble_arg;

static void *scribble_main(void *p) {
  scribble_arg *a = p;
  uint8_t *sq = (uint8_t *)a->w->r.sq;
  size_t span = (size_t)a->w->r.entries * QL_RING_ENTRY_BYTES;
  while (!atomic_load(&a->stop)) {
    a->seed = a->seed * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t v = a->seed >> 11;
    switch (v % 6) {
    case 0:
      atomic_store(&a->w->r.hdr->sq_tail,
                   a->w->sq_tail + (uint32_t)(v >> 8) % 3);
      break;
    case 1:
      atomic_store(&a->w->r.hdr->idle, (uint32_t)(v >> 9));
      break;
    default:
      sq[(v >> 4) % span] = (uint8_t)(v >> 20);
      break;
    }
    if ((v & 63) == 0) {
      uint64_t one = 1;
      if (write(a->w->bell, &one, sizeof one) < 0)
        break;
    }
  }
  return NULL;
}

START_TEST(test_concurrent_rewrites) {
  td d;
  td_start(&d, NULL);
  ql_client *C = td_connect(&d);
  td_layer l;
  td_layer_make(&l, 16, 64, 31, 0);
  ck_assert_int_eq(load(C, "fp/s", &l, QL_FORMAT_Q8C, 0), 0);
  for (int round = 0; round < 4; round++) {
    raw w;
    raw_open(&d, &w, 4);
    raw_region rg;
    raw_region_new(&w, 1 << 16, &rg);
    scribble_arg a = {&w, 0, 1234 + (uint64_t)round};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, scribble_main, &a), 0);
    lin_msg L;
    lin_msg_make(&L, "fp/s", 2, 64, 16, rg.id, 0, rg.id, 8192, 1);
    float x[2 * 64], y[2 * 16];
    uint64_t seed = 3;
    for (int i = 0; i < 200; i++) {
      raw_post(&w, (uint64_t)i, &L.req);
      td_randn(&seed, x, 2 * 64, 1.0f);
      ck_assert_int_eq(ql_linear(C, "fp/s", QL_PATH_WEIGHT_ONLY,
                                 QL_DTYPE_F32, 2, 64, x, 16, y, NULL),
                       0);
      if (i % 50 == 0) {
        void *want = reference(&l, QL_FORMAT_Q8C, 0, QL_PATH_WEIGHT_ONLY,
                               QL_DTYPE_F32, x, 2);
        ck_assert_mem_eq(y, want, sizeof y);
        free(want);
      }
      /* Completions it never takes: the ring stalls, nothing else. */
    }
    atomic_store(&a.stop, 1);
    pthread_join(th, NULL);
    raw_close(&w);
    ck_assert(td_alive(&d));
  }
  td_layer_free(&l);
  ql_close(C);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* A client that never takes its completions: the daemon fills the CQ and
 * then takes no more requests (none lost, none answered twice), serves
 * others meanwhile, and resumes when the client consumes. */
START_TEST(test_not_consuming) {
  td d;
  td_start(&d, NULL);
  ql_client *C = td_connect(&d);
  td_layer l;
  td_layer_make(&l, 16, 64, 41, 1);
  ck_assert_int_eq(load(C, "fp/n", &l, QL_FORMAT_Q4G, 32), 0);
  raw w;
  raw_open(&d, &w, 4);
  raw_region rg;
  raw_region_new(&w, 1 << 20, &rg);
  uint64_t seed = 8;
  float *x = (float *)rg.data;
  td_randn(&seed, x, 8 * 64, 1.0f);
  lin_msg L[8];
  for (int i = 0; i < 8; i++) {
    /* Request i: row i of x into its own y. */
    lin_msg_make(&L[i], "fp/n", 1, 64, 16, rg.id, (uint64_t)i * 256, rg.id,
                 65536 + (uint64_t)i * 64, (uint64_t)i + 1);
    if (i < 4)
      raw_post(&w, 1000 + (uint64_t)i, &L[i].req);
  }
  /* All four answered; the CQ is full. */
  int64_t end = td_now_ms() + 10000;
  while (raw_ready(&w) < 4 && td_now_ms() < end)
    usleep(1000);
  ck_assert_uint_eq(raw_ready(&w), 4);
  for (int i = 4; i < 8; i++)
    raw_post(&w, 1000 + (uint64_t)i, &L[i].req);
  usleep(300 * 1000);
  /* Not taken: there is no room for their replies. */
  ck_assert_uint_eq(atomic_load(&w.r.hdr->sq_head), 4);
  ck_assert_uint_eq(raw_ready(&w), 4);
  ck_assert_uint_eq(atomic_load(&w.r.hdr->blocked), 1);
  /* Others are served meanwhile. */
  float x1[64], y1[16];
  td_randn(&seed, x1, 64, 1.0f);
  ck_assert_int_eq(ql_linear(C, "fp/n", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 1,
                             64, x1, 16, y1, NULL),
                   0);
  int seen[8] = {0};
  for (int i = 0; i < 8; i++) {
    uint64_t tag;
    Qlinear__V1__Response *r = NULL;
    ck_assert_int_eq(raw_take(&w, &tag, &r, 10000, 1), 0);
    ck_assert_uint_ge(tag, 1000);
    ck_assert_uint_lt(tag, 1008);
    ck_assert_msg(!seen[tag - 1000], "tag %llu twice",
                  (unsigned long long)tag);
    seen[tag - 1000] = 1;
    ck_assert_int_eq(status_of(r), 0);
    ck_assert_uint_eq(r->request_id, tag - 1000 + 1);
    qlinear__v1__response__free_unpacked(r, NULL);
  }
  for (int i = 0; i < 8; i++) {
    void *want = reference(&l, QL_FORMAT_Q4G, 32, QL_PATH_WEIGHT_ONLY,
                           QL_DTYPE_F32, x + i * 64, 1);
    ck_assert_mem_eq(rg.data + 65536 + i * 64, want, 16 * 4);
    free(want);
  }
  raw_close(&w);
  td_layer_free(&l);
  ql_close(C);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* The session ends (its socket closes) with requests queued and running:
 * nothing is left behind, the daemon and the others go on. */
START_TEST(test_end_in_flight) {
  td d;
  setenv("QL_TEST_KERNEL_DELAY_MS", "50", 1);
  td_start(&d, NULL);
  unsetenv("QL_TEST_KERNEL_DELAY_MS");
  ql_client *C = td_connect(&d);
  td_layer l;
  td_layer_make(&l, 16, 64, 51, 0);
  ck_assert_int_eq(load(C, "fp/e", &l, QL_FORMAT_Q8C, 0), 0);
  ql_stats_info *st = stats(C);
  uint64_t sessions = st->sessions;
  ql_stats_free(st);
  for (int round = 0; round < 3; round++) {
    raw w;
    raw_open(&d, &w, 8);
    raw_region rg;
    raw_region_new(&w, 1 << 16, &rg);
    lin_msg L;
    lin_msg_make(&L, "fp/e", 1, 64, 16, rg.id, 0, rg.id, 4096, 1);
    for (int i = 0; i < 8; i++)
      raw_post(&w, (uint64_t)i, &L.req);
    usleep(20 * 1000 * (useconds_t)round);
    raw_close(&w);
  }
  int64_t end = td_now_ms() + 10000;
  for (;;) {
    st = stats(C);
    uint64_t now = st->sessions, rings = st->rings;
    ql_stats_free(st);
    if (now == sessions && rings == 1)
      break;
    ck_assert_msg(td_now_ms() < end, "sessions or rings left behind");
    usleep(20 * 1000);
  }
  float x[64], y[16];
  uint64_t seed = 2;
  td_randn(&seed, x, 64, 1.0f);
  ck_assert_int_eq(ql_linear(C, "fp/e", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 1,
                             64, x, 16, y, NULL),
                   0);
  td_layer_free(&l);
  ql_close(C);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* A libqlinear client killed while its ring request runs: its session
 * ends, the daemon and the other clients go on. And a client whose daemon
 * dies while it waits on its ring is told so at once, not at its
 * timeout. */
START_TEST(test_client_killed) {
  td d;
  setenv("QL_TEST_KERNEL_DELAY_MS", "300", 1);
  td_start(&d, NULL);
  unsetenv("QL_TEST_KERNEL_DELAY_MS");
  /* The child first: libqlinear does not survive fork(). */
  int p[2], q[2];
  ck_assert_int_eq(pipe(p), 0);
  ck_assert_int_eq(pipe(q), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    ql_client *c = NULL;
    float x[64] = {1}, y[16];
    char go;
    if (read(q[0], &go, 1) != 1 || ql_connect(d.address, NULL, &c) != 0 ||
        ql_hold(c, "fp/k", NULL, NULL) != 0)
      _exit(2);
    if (write(p[1], "y", 1) != 1)
      _exit(3);
    for (;;)
      ql_linear(c, "fp/k", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 1, 64, x, 16,
                y, NULL);
  }
  close(p[1]);
  close(q[0]);
  ql_client *C = td_connect(&d);
  td_layer l;
  td_layer_make(&l, 16, 64, 61, 0);
  ck_assert_int_eq(load(C, "fp/k", &l, QL_FORMAT_Q8C, 0), 0);
  ql_stats_info *st = stats(C);
  uint64_t sessions = st->sessions;
  ql_stats_free(st);
  ck_assert_int_eq(write(q[1], "g", 1), 1);
  close(q[1]);
  char ok = 0;
  ck_assert_int_eq(read(p[0], &ok, 1), 1);
  close(p[0]);
  usleep(100 * 1000); /* its request is running */
  kill(pid, SIGKILL);
  int wst;
  ck_assert_int_eq(waitpid(pid, &wst, 0), pid);
  int64_t end = td_now_ms() + 10000;
  for (;;) {
    st = stats(C);
    uint64_t now = st->sessions;
    ql_stats_free(st);
    if (now == sessions)
      break;
    ck_assert_msg(td_now_ms() < end, "the killed client's session stayed");
    usleep(20 * 1000);
  }
  float x[64], y[16];
  uint64_t seed = 4;
  td_randn(&seed, x, 64, 1.0f);
  ck_assert_int_eq(ql_linear(C, "fp/k", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 1,
                             64, x, 16, y, NULL),
                   0);
  void *want = reference(&l, QL_FORMAT_Q8C, 0, QL_PATH_WEIGHT_ONLY,
                         QL_DTYPE_F32, x, 1);
  ck_assert_mem_eq(y, want, sizeof y);
  free(want);
  /* The daemon dies under a waiting call. */
  int64_t t0 = td_now_ms();
  pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    usleep(100 * 1000);
    kill(d.pid, SIGKILL);
    _exit(0);
  }
  int rc = ql_linear(C, "fp/k", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 1, 64, x,
                     16, y, NULL);
  ck_assert_int_eq(waitpid(pid, &wst, 0), pid);
  ck_assert_msg(rc == QL_ESESSION, "rc %d: %s", rc, ql_errmsg());
  ck_assert_msg(td_now_ms() - t0 < 10000,
                "the call waited for its timeout, not for the daemon");
  td_layer_free(&l);
  ql_close(C);
  ck_assert_int_eq(td_wait(&d, 5000), -1);
}
END_TEST

/* x rewritten (to NaN and back) while the batch that holds it runs: the
 * other requests of the batch are untouched. */
typedef struct flip_arg {
  float *x;
  size_t n;
  atomic_int stop;
} flip_arg;

static void *flip_main(void *p) {
  flip_arg *a = p;
  unsigned i = 0;
  while (!atomic_load(&a->stop)) {
    a->x[(i * 7) % a->n] = (i & 1) ? NAN : 0.5f;
    i++;
  }
  return NULL;
}

typedef struct victim_arg {
  ql_client *c;
  const float *x;
  const void *want;
  int runs, bad;
} victim_arg;

static void *victim_main(void *p) {
  victim_arg *a = p;
  float y[4 * 16];
  for (int i = 0; i < a->runs; i++) {
    if (ql_linear(a->c, "fp/r", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 4, 64,
                  a->x, 16, y, NULL) != 0 ||
        memcmp(y, a->want, sizeof y) != 0)
      a->bad++;
  }
  return NULL;
}

/* The rewriter's own requests: x in the region being rewritten. */
typedef struct writer_arg {
  ql_client *c;
  ql_region *rx, *ry;
  uint64_t yoff;
  int runs, nonfinite, other;
} writer_arg;

static void *writer_main(void *p) {
  writer_arg *a = p;
  for (int i = 0; i < a->runs; i++) {
    ql_slice xs = {a->rx, 0, 4 * 64 * 4}, ys = {a->ry, a->yoff, 4 * 16 * 4};
    int rc = ql_linear_region(a->c, "fp/r", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32,
                              4, 64, &xs, 16, &ys, NULL, NULL);
    a->nonfinite += rc == QL_ENONFINITE;
    a->other += rc != 0 && rc != QL_ENONFINITE;
  }
  return NULL;
}

START_TEST(test_rewrite_after_check) {
  td d;
  /* Launches take long enough that requests queue up and share them. */
  setenv("QL_TEST_KERNEL_DELAY_MS", "3", 1);
  td_start(&d, NULL);
  unsetenv("QL_TEST_KERNEL_DELAY_MS");
  ql_client *A = td_connect(&d), *B = td_connect(&d);
  td_layer l;
  td_layer_make(&l, 16, 64, 71, 1);
  ck_assert_int_eq(load(A, "fp/r", &l, QL_FORMAT_Q8C, 0), 0);
  ck_assert_int_eq(ql_hold(B, "fp/r", NULL, NULL), 0);
  ql_region *ra = NULL, *ry = NULL;
  ck_assert_int_eq(ql_region_create(A, 1 << 16, &ra), 0);
  ck_assert_int_eq(ql_region_create(A, 1 << 16, &ry), 0);
  float xb[4 * 64];
  uint64_t seed = 12;
  td_randn(&seed, xb, 4 * 64, 1.0f);
  void *want = reference(&l, QL_FORMAT_Q8C, 0, QL_PATH_WEIGHT_ONLY,
                         QL_DTYPE_F32, xb, 4);
  float *xa = ra->data;
  td_randn(&seed, xa, 4 * 64, 1.0f);
  flip_arg fa = {xa, 4 * 64, 0};
  /* Two threads of each client, so that requests queue while a launch
   * runs and share the next one. */
  enum { RUNS = 100 };
  victim_arg va[2] = {{B, xb, want, RUNS, 0}, {B, xb, want, RUNS, 0}};
  writer_arg wa[2] = {{A, ra, ry, 0, RUNS, 0, 0}, {A, ra, ry, 4096, RUNS, 0, 0}};
  pthread_t tf, tv[2], tw[2];
  ck_assert_int_eq(pthread_create(&tf, NULL, flip_main, &fa), 0);
  for (int i = 0; i < 2; i++) {
    ck_assert_int_eq(pthread_create(&tv[i], NULL, victim_main, &va[i]), 0);
    ck_assert_int_eq(pthread_create(&tw[i], NULL, writer_main, &wa[i]), 0);
  }
  int nonfinite = 0;
  for (int i = 0; i < 2; i++) {
    pthread_join(tv[i], NULL);
    pthread_join(tw[i], NULL);
    ck_assert_int_eq(va[i].bad, 0);
    ck_assert_int_eq(wa[i].other, 0);
    nonfinite += wa[i].nonfinite;
  }
  atomic_store(&fa.stop, 1);
  pthread_join(tf, NULL);
  ck_assert_int_gt(nonfinite, 0); /* the rewrites were seen */
  ql_stats_info *st = stats(A);
  uint64_t batches = 0, requests = 0;
  for (size_t i = 0; i < st->n_per_weight; i++) {
    batches += st->per_weight[i].batches;
    requests += st->per_weight[i].requests;
  }
  ql_stats_free(st);
  /* Requests did share launches (else this tested nothing). */
  ck_assert_uint_lt(batches, 4 * RUNS);
  (void)requests;
  free(want);
  td_layer_free(&l);
  ql_close(A);
  ql_close(B);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* CPU time of process pid (user + system), in clock ticks. */
static long cpu_ticks(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  ck_assert_ptr_nonnull(p);
  long ut = 0, stt = 0;
  /* After ") ": state, then 10 fields, then utime, stime. */
  ck_assert_int_eq(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u "
                          "%*u %ld %ld", &ut, &stt),
                   2);
  return ut + stt;
}

/* Idle rings cost no CPU: 16 sessions that used their ring and went
 * quiet leave the daemon asleep (not a speed test: a daemon that polled
 * its rings for ever would use a whole core). */
START_TEST(test_idle_rings_sleep) {
  td d;
  td_start(&d, NULL);
  ql_client *c[16];
  td_layer l;
  td_layer_make(&l, 16, 64, 81, 0);
  c[0] = td_connect(&d);
  ck_assert_int_eq(load(c[0], "fp/i", &l, QL_FORMAT_Q8C, 0), 0);
  float x[64] = {0}, y[16];
  for (int i = 0; i < 16; i++) {
    if (i > 0)
      c[i] = td_connect(&d);
    ck_assert_int_eq(ql_linear(c[i], "fp/i", QL_PATH_WEIGHT_ONLY,
                               QL_DTYPE_F32, 1, 64, x, 16, y, NULL),
                     0);
  }
  ql_stats_info *st = stats(c[0]);
  ck_assert_uint_eq(st->rings, 16);
  ql_stats_free(st);
  usleep(300 * 1000);
  long t0 = cpu_ticks(d.pid);
  usleep(2000 * 1000);
  long used = cpu_ticks(d.pid) - t0;
  long hz = sysconf(_SC_CLK_TCK);
  /* 2 s of a busy core would be 2 * hz ticks. */
  ck_assert_msg(used * 10 < 2 * hz, "an idle daemon used %ld ticks of %ld",
                used, 2 * hz);
  for (int i = 0; i < 16; i++)
    ql_close(c[i]);
  td_layer_free(&l);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* Ring requests count as the session's activity for the lease. */
START_TEST(test_lease) {
  td d;
  static const char *const args[] = {"--session-lease-ms", "1000", NULL};
  td_start(&d, args);
  ql_client *c = td_connect(&d);
  td_layer l;
  td_layer_make(&l, 16, 64, 91, 0);
  ck_assert_int_eq(load(c, "fp/l", &l, QL_FORMAT_Q8C, 0), 0);
  float x[64] = {0}, y[16];
  uint64_t r0 = ring_requests(c);
  int64_t end = td_now_ms() + 3500;
  int n = 0;
  while (td_now_ms() < end) {
    ck_assert_int_eq(ql_linear(c, "fp/l", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32,
                               1, 64, x, 16, y, NULL),
                     0);
    n++;
    usleep(100 * 1000);
  }
  ck_assert_uint_ge(ring_requests(c) - r0, (uint64_t)n);
  td_layer_free(&l);
  ql_close(c);
  /* The harness's own raw session has sent nothing: the lease ended it,
   * which td_stop() does not mind. */
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* A reply on the ring may reach the client before the loop has
 * accounted its launch (a device worker sends it): Stats asked for after
 * it still counts it, and its launch. */
START_TEST(test_stats_after_reply) {
  td d;
  /* Each worker hands its job back 20 ms after its early reply. */
  setenv("QL_TEST_EARLY_DELAY_MS", "20", 1);
  td_start(&d, NULL);
  unsetenv("QL_TEST_EARLY_DELAY_MS");
  ql_client *c = td_connect(&d), *m = td_connect_messages(&d);
  td_layer l;
  td_layer_make(&l, 16, 64, 97, 0);
  ck_assert_int_eq(load(c, "fp/st", &l, QL_FORMAT_Q8C, 0), 0);
  float x[64] = {0}, y[16];
  for (uint64_t i = 1; i <= 40; i++) {
    ck_assert_int_eq(ql_linear(c, "fp/st", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32,
                               1, 64, x, 16, y, NULL),
                     0);
    ql_stats_info *st = stats(i % 2 ? c : m);
    ck_assert_uint_eq(st->n_per_weight, 1);
    ck_assert_uint_eq(st->per_weight[0].requests, i);
    ck_assert_uint_eq(st->per_weight[0].rows, i);
    ck_assert_uint_eq(st->per_weight[0].batches, i);
    ql_stats_free(st);
  }
  td_layer_free(&l);
  ql_close(c);
  ql_close(m);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* A request answered on the ring no longer counts against its session's
 * quota (session_max_requests), though the loop accounts its launch
 * later: a client that waits for each reply, at a quota of 1, had its
 * next request refused with QL_EEXHAUSTED. */
START_TEST(test_quota_after_reply) {
  td d;
  const char *args[] = {"--session-max-requests", "1", NULL};
  setenv("QL_TEST_EARLY_DELAY_MS", "200", 1);
  td_start(&d, args);
  unsetenv("QL_TEST_EARLY_DELAY_MS");
  ql_client *c = td_connect(&d);
  td_layer l;
  td_layer_make(&l, 16, 64, 98, 0);
  ck_assert_int_eq(load(c, "fp/q", &l, QL_FORMAT_Q8C, 0), 0);
  float x[64] = {0}, y[16];
  uint64_t r0 = ring_requests(c);
  for (int i = 0; i < 4; i++)
    ck_assert_msg(ql_linear(c, "fp/q", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 1,
                            64, x, 16, y, NULL) == 0,
                  "request %d: %s", i, ql_errmsg());
  ck_assert_uint_ge(ring_requests(c) - r0, 4);
  td_layer_free(&l);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* Clients may refuse the ring (ql_connect_opts.no_ring, QLINEAR_RING=0):
 * they get none, and their requests are messages. */
START_TEST(test_refused) {
  td d;
  td_start(&d, NULL);
  ql_client *a = td_connect_messages(&d);
  setenv("QLINEAR_RING", "0", 1);
  ql_client *b = td_connect(&d);
  unsetenv("QLINEAR_RING");
  td_layer l;
  td_layer_make(&l, 16, 64, 95, 0);
  ck_assert_int_eq(load(a, "fp/x", &l, QL_FORMAT_Q8C, 0), 0);
  ql_stats_info *st = stats(a);
  ck_assert_uint_eq(st->rings, 0);
  ck_assert_uint_eq(st->region_bytes, 0);
  ql_stats_free(st);
  float x[64] = {0}, y[16];
  uint64_t r0 = ring_requests(a);
  ck_assert_int_eq(ql_linear(a, "fp/x", QL_PATH_AUTO, QL_DTYPE_F32, 1, 64, x,
                             16, y, NULL),
                   0);
  ck_assert_int_eq(ql_hold(b, "fp/x", NULL, NULL), 0);
  ck_assert_int_eq(ql_linear(b, "fp/x", QL_PATH_AUTO, QL_DTYPE_F32, 1, 64, x,
                             16, y, NULL),
                   0);
  ck_assert_uint_eq(ring_requests(a), r0);
  /* A second ring for a session is refused; a ring of a bad size too. */
  raw w;
  raw_open(&d, &w, 2);
  Qlinear__V1__SessionRequest req = QLINEAR__V1__SESSION_REQUEST__INIT;
  Qlinear__V1__CreateRingRequest cr = QLINEAR__V1__CREATE_RING_REQUEST__INIT;
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_CREATE_RING;
  req.create_ring = &cr;
  int fds[2];
  Qlinear__V1__SessionResponse *r = td_session_call_fds(&w.s, &req, fds, 5000);
  ck_assert_ptr_nonnull(r);
  ck_assert_int_eq(r->status->code, QL_EEXIST);
  ck_assert_int_eq(fds[0], -1);
  qlinear__v1__session_response__free_unpacked(r, NULL);
  td_session s2;
  ck_assert_int_eq(td_session_open(&d, &s2), 0);
  static const uint32_t bad[] = {3, 1, 512, 100};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    cr.entries = bad[i];
    r = td_session_call_fds(&s2, &req, fds, 5000);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->status->code, QL_EINVAL);
    ck_assert_int_eq(fds[0], -1);
    qlinear__v1__session_response__free_unpacked(r, NULL);
  }
  td_session_close(&s2);
  raw_close(&w);
  td_layer_free(&l);
  ql_close(a);
  ql_close(b);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("fastpath");
  TCase *tc = tcase_create("ring");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_same_bytes);
  tcase_add_test(tc, test_hostile_slots);
  tcase_add_test(tc, test_concurrent_rewrites);
  tcase_add_test(tc, test_not_consuming);
  tcase_add_test(tc, test_end_in_flight);
  tcase_add_test(tc, test_client_killed);
  tcase_add_test(tc, test_rewrite_after_check);
  tcase_add_test(tc, test_idle_rings_sleep);
  tcase_add_test(tc, test_lease);
  tcase_add_test(tc, test_refused);
  tcase_add_test(tc, test_stats_after_reply);
  tcase_add_test(tc, test_quota_after_reply);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
