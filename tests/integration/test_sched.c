/*
 * test_sched.c - the scheduler in a real qlineard (DESIGN §6): many client
 * processes whose requests are coalesced, every reply checked byte for
 * byte against the reference computed in the client (so a request's bytes
 * are the same alone or coalesced), backpressure (a full queue, a session
 * quota), deadlines, and a long prefill run in chunks with decode work
 * going between them.
 *
 * QL_TEST_KERNEL_DELAY_MS makes every launch of the daemon take a known
 * time, so that requests pile up behind one another whatever the kernels'
 * speed; no assertion depends on how fast this machine is, only on order
 * and on bounds of several times the delay.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <check.h>

#include "harness.h"
#include "ql_kernels.h"
#include "qlinear/qlinear.h"
#include "testutil.h"

#define N 256
#define K 512
#define GS 128

static float W[N * K], B[N];
static ql_qweight *Q; /* the daemon's canonical weight, made here too */

static void make_weight(void) {
  uint64_t seed = 42;
  td_randn(&seed, W, N * K, 0.05f);
  td_randn(&seed, B, N, 0.1f);
  ql_quant_params p = {QL_FORMAT_Q4G, GS, 0, 0};
  ql_qweight_free(Q);
  Q = NULL;
  ck_assert_int_eq(ql_qweight_quantize(&p, N, K, QL_DTYPE_F32, W, B, &Q), 0);
}

static void load(ql_client *c) {
  ql_load_desc d;
  memset(&d, 0, sizeof d);
  d.name = "w";
  d.format = QL_FORMAT_Q4G;
  d.group_size = GS;
  d.n = N;
  d.k = K;
  d.dtype = QL_DTYPE_F32;
  d.data = W;
  d.bias = B;
  int rc = ql_load_float(c, &d, NULL, NULL);
  ck_assert_msg(rc == 0, "load: %s: %s", ql_strerror(rc), ql_errmsg());
}

/* x of request (a, b): m rows in dtype dt, from its own seed. */
static void *make_x(uint64_t a, uint64_t b, int64_t m, ql_dtype dt) {
  uint64_t seed = a * 1000003u + b + 7;
  float *f = tu_xmalloc((size_t)m * K * sizeof(float));
  td_randn(&seed, f, (size_t)m * K, 1.0f);
  if (dt == QL_DTYPE_F32)
    return f;
  void *x = tu_xmalloc((size_t)m * K * 2);
  ql_from_f32(dt, f, x, (size_t)m * K);
  free(f);
  return x;
}

/* What the daemon must answer: the reference of the path a request of m
 * rows takes (crossover 16: fewer rows run weight-only). */
static void *reference(const void *x, int64_t m, ql_dtype dt) {
  void *y = tu_xmalloc((size_t)m * N * ql_dtype_size(dt));
  int rc = m < 16 ? ql_linear_wo_ref(Q, dt, x, m, y)
                  : ql_linear_aq_ref(Q, dt, x, m, y);
  ck_assert_int_eq(rc, 0);
  return y;
}

/* Starts the daemon with a fixed crossover of 16 (reference() relies on
 * it), every launch taking delay_ms, and args. */
static void start(td *d, const char *delay_ms, const char *const *args) {
  const char *argv[16];
  int n = 0;
  argv[n++] = "--crossover-rows";
  argv[n++] = "16";
  for (int i = 0; args != NULL && args[i] != NULL && n < 15; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  if (delay_ms != NULL)
    setenv("QL_TEST_KERNEL_DELAY_MS", delay_ms, 1);
  td_start(d, argv);
  unsetenv("QL_TEST_KERNEL_DELAY_MS");
}

/* One Linear on its own thread. */
typedef struct call {
  ql_client *c;
  int64_t m;
  ql_dtype dt;
  ql_path path;
  const void *x;
  void *y;
  int rc;
  int64_t done_ms;
  ql_linear_result res;
} call;

static void *call_run(void *p) {
  call *a = p;
  a->rc = ql_linear(a->c, "w", a->path, a->dt, (uint64_t)a->m, K, a->x, N,
                    a->y, &a->res);
  a->done_ms = td_now_ms();
  return NULL;
}

static void call_init(call *a, ql_client *c, int64_t m, uint64_t seed) {
  memset(a, 0, sizeof *a);
  a->c = c;
  a->m = m;
  a->dt = QL_DTYPE_F32;
  a->x = make_x(99, seed, m, a->dt);
  a->y = tu_xmalloc((size_t)m * N * sizeof(float));
  a->rc = 1;
}

static void call_free(call *a) {
  free((void *)a->x);
  free(a->y);
}

static uint64_t weight_stat(ql_client *c, size_t off) {
  ql_stats_info *st = NULL;
  ck_assert_int_eq(ql_stats(c, &st), 0);
  ck_assert_uint_ge(st->n_per_weight, 1);
  uint64_t v;
  memcpy(&v, (const char *)&st->per_weight[0] + off, sizeof v);
  ql_stats_free(st);
  return v;
}

/* ------------------------------------------------------------- tests */

#define CLIENTS 8
#define PER_CLIENT 6

/*
 * Eight client processes send mixed requests (1 to 4 rows weight-only, 20
 * rows activation-quantized, f32 and bf16) while each launch takes 30 ms:
 * they queue and are coalesced. Every reply equals the reference the
 * client computes itself, which is also what the request gives alone.
 */
START_TEST(coalesced_replies_match_reference) {
  td d;
  int go[2];
  make_weight();
  start(&d, "30", NULL);
  /* The clients are forked before this process touches nanomsg, whose
   * threads do not survive a fork; they wait for the weight to be loaded. */
  ck_assert_int_eq(pipe(go), 0);
  int *bad = mmap(NULL, sizeof(int) * CLIENTS, PROT_READ | PROT_WRITE,
                  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ck_assert_ptr_ne(bad, MAP_FAILED);
  pid_t kids[CLIENTS];
  for (int i = 0; i < CLIENTS; i++) {
    kids[i] = fork();
    ck_assert_int_ge(kids[i], 0);
    if (kids[i] == 0) {
      ql_client *cc = NULL;
      int fails = 0;
      char b;
      close(go[1]);
      if (read(go[0], &b, 1) != 1)
        _exit(3);
      if (ql_connect(d.address, NULL, &cc) != 0)
        _exit(2);
      for (int r = 0; r < PER_CLIENT; r++) {
        int64_t m = r == 5 ? 20 : 1 + (i + r) % 4;
        ql_dtype dt = (i + r) % 3 == 0 ? QL_DTYPE_BF16 : QL_DTYPE_F32;
        void *x = make_x((uint64_t)i + 1, (uint64_t)r, m, dt);
        size_t yb = (size_t)m * N * ql_dtype_size(dt);
        void *y = tu_xmalloc(yb);
        int rc = ql_linear(cc, "w", QL_PATH_AUTO, dt, (uint64_t)m, K, x, N, y,
                           NULL);
        void *ref = reference(x, m, dt);
        if (rc != 0 || memcmp(y, ref, yb) != 0)
          fails++;
        free(x);
        free(y);
        free(ref);
      }
      ql_close(cc);
      bad[i] = fails;
      _exit(0);
    }
  }
  close(go[0]);
  ql_client *c = td_connect(&d);
  load(c);
  /* The same kind of requests alone first: one launch each. */
  for (int r = 0; r < 2; r++) {
    void *x = make_x(0, (uint64_t)r, 3, QL_DTYPE_F32);
    void *y = tu_xmalloc(3 * N * sizeof(float));
    ck_assert_int_eq(ql_linear(c, "w", QL_PATH_AUTO, QL_DTYPE_F32, 3, K, x, N,
                               y, NULL),
                     0);
    void *ref = reference(x, 3, QL_DTYPE_F32);
    ck_assert_mem_eq(y, ref, 3 * N * sizeof(float));
    free(x);
    free(y);
    free(ref);
  }
  uint64_t batches0 = weight_stat(c, offsetof(ql_weight_stats, batches));
  ck_assert_uint_eq(batches0, 2);
  char gobuf[CLIENTS] = {0};
  ck_assert_int_eq(write(go[1], gobuf, CLIENTS), CLIENTS);
  close(go[1]);
  for (int i = 0; i < CLIENTS; i++) {
    int st;
    ck_assert_int_eq(waitpid(kids[i], &st, 0), kids[i]);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "client %d exited %d", i, st);
    ck_assert_msg(bad[i] == 0, "client %d: %d replies differ from the "
                  "reference", i, bad[i]);
  }
  munmap(bad, sizeof(int) * CLIENTS);
  /* Coalescing happened: fewer launches than requests. */
  uint64_t requests = weight_stat(c, offsetof(ql_weight_stats, requests));
  uint64_t batches =
      weight_stat(c, offsetof(ql_weight_stats, batches)) - batches0;
  ck_assert_uint_eq(requests, 2 + CLIENTS * PER_CLIENT);
  ck_assert_msg(batches < CLIENTS * PER_CLIENT,
                "%llu launches for %d requests: nothing was coalesced",
                (unsigned long long)batches, CLIENTS * PER_CLIENT);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* A full queue answers at once; so does a session over its quota, while
 * another session still gets in. */
START_TEST(backpressure) {
  td d;
  make_weight();
  const char *args[] = {"--max-queue", "2", "--session-max-requests", "3",
                        NULL};
  start(&d, "400", args);
  ql_client *c = td_connect(&d), *c2 = td_connect(&d);
  load(c);
  call a[4];
  pthread_t t[4];
  for (int i = 0; i < 4; i++)
    call_init(&a[i], i < 3 ? c : c2, 1, (uint64_t)i);
  /* a[0] runs; a[1], a[2] wait in the weight-only queue (full: 2). */
  ck_assert_int_eq(pthread_create(&t[0], NULL, call_run, &a[0]), 0);
  usleep(150 * 1000);
  ck_assert_int_eq(pthread_create(&t[1], NULL, call_run, &a[1]), 0);
  ck_assert_int_eq(pthread_create(&t[2], NULL, call_run, &a[2]), 0);
  usleep(100 * 1000);
  /* Another session's request finds the queue full: refused at once. */
  int64_t t0 = td_now_ms();
  call_run(&a[3]);
  ck_assert_int_eq(a[3].rc, QL_EEXHAUSTED);
  ck_assert_int_lt(a[3].done_ms - t0, 300);
  /* The first session has 3 requests in the daemon: its quota. A
   * prefill (another queue, not full) is still refused. */
  call p;
  call_init(&p, c, 20, 9);
  t0 = td_now_ms();
  call_run(&p);
  ck_assert_int_eq(p.rc, QL_EEXHAUSTED);
  ck_assert_int_lt(p.done_ms - t0, 300);
  /* ... but the other session's prefill gets in. */
  p.c = c2;
  call_run(&p);
  ck_assert_int_eq(p.rc, 0);
  for (int i = 0; i < 3; i++) {
    pthread_join(t[i], NULL);
    ck_assert_int_eq(a[i].rc, 0);
  }
  for (int i = 0; i < 4; i++)
    call_free(&a[i]);
  call_free(&p);
  ql_close(c);
  ql_close(c2);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* A raw Linear request of m rows of x (f32, inline) with a deadline. */
typedef struct raw_call {
  const td *d;
  Qlinear__V1__Request req;
  Qlinear__V1__LinearRequest lin;
  Qlinear__V1__Tensor x;
  uint64_t shape[2];
  int rc;
  int64_t done_ms;
} raw_call;

static void raw_init(raw_call *r, const td *d, const float *x, uint64_t m,
                     uint64_t deadline_us) {
  memset(r, 0, sizeof *r);
  r->d = d;
  qlinear__v1__request__init(&r->req);
  qlinear__v1__linear_request__init(&r->lin);
  qlinear__v1__tensor__init(&r->x);
  r->shape[0] = m;
  r->shape[1] = K;
  r->x.dtype = QLINEAR__V1__DTYPE__DTYPE_F32;
  r->x.shape = r->shape;
  r->x.n_shape = 2;
  r->x.data_case = QLINEAR__V1__TENSOR__DATA_INLINE_DATA;
  r->x.inline_data.data = (uint8_t *)x;
  r->x.inline_data.len = m * K * sizeof(float);
  r->lin.weight = "w";
  r->lin.x = &r->x;
  r->req.request_id = 4242;
  r->req.deadline_us = deadline_us;
  r->req.body_case = QLINEAR__V1__REQUEST__BODY_LINEAR;
  r->req.linear = &r->lin;
}

static void *raw_run(void *p) {
  raw_call *r = p;
  Qlinear__V1__Response *resp = td_call(r->d, &r->req, 10000);
  r->rc = resp ? resp->status->code : 1;
  r->done_ms = td_now_ms();
  if (resp)
    qlinear__v1__response__free_unpacked(resp, NULL);
  return NULL;
}

/* A request whose deadline passes while it waits is answered
 * DEADLINE_EXCEEDED without running, on time even though the worker is
 * busy; one with time to spare runs. */
START_TEST(deadlines) {
  td d;
  make_weight();
  start(&d, "500", NULL);
  ql_client *c = td_connect(&d);
  load(c);
  call blocker;
  call_init(&blocker, c, 1, 1);
  pthread_t tb, t1, t2;
  ck_assert_int_eq(pthread_create(&tb, NULL, call_run, &blocker), 0);
  usleep(100 * 1000);
  float x[K];
  uint64_t seed = 3;
  td_randn(&seed, x, K, 1.0f);
  raw_call late, fine;
  raw_init(&late, &d, x, 1, 100 * 1000);       /* 100 ms */
  raw_init(&fine, &d, x, 1, 20 * 1000 * 1000); /* 20 s */
  int64_t t0 = td_now_ms();
  ck_assert_int_eq(pthread_create(&t1, NULL, raw_run, &late), 0);
  ck_assert_int_eq(pthread_create(&t2, NULL, raw_run, &fine), 0);
  pthread_join(t1, NULL);
  ck_assert_int_eq(late.rc, QL_EDEADLINE);
  /* Answered near its deadline, while the blocker still ran. */
  ck_assert_int_lt(late.done_ms - t0, 350);
  pthread_join(t2, NULL);
  ck_assert_int_eq(fine.rc, 0);
  pthread_join(tb, NULL);
  ck_assert_int_eq(blocker.rc, 0);
  ck_assert_uint_eq(weight_stat(c, offsetof(ql_weight_stats, requests)), 2);
  ck_assert_uint_eq(weight_stat(c, offsetof(ql_weight_stats, expired)), 1);
  call_free(&blocker);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* A 64-row prefill runs as four 16-row launches; a decode request sent
 * after it started is answered before it ends, and the prefill's bytes
 * are still exactly the reference's. */
START_TEST(prefill_chunks_let_decode_through) {
  td d;
  make_weight();
  const char *args[] = {"--prefill-chunk-rows", "16", NULL};
  start(&d, "120", args);
  ql_client *c = td_connect(&d);
  load(c);
  call pre, dec;
  call_init(&pre, c, 64, 5);
  call_init(&dec, c, 1, 6);
  pthread_t tp, td_;
  ck_assert_int_eq(pthread_create(&tp, NULL, call_run, &pre), 0);
  usleep(60 * 1000);
  ck_assert_int_eq(pthread_create(&td_, NULL, call_run, &dec), 0);
  pthread_join(td_, NULL);
  pthread_join(tp, NULL);
  ck_assert_int_eq(pre.rc, 0);
  ck_assert_int_eq(dec.rc, 0);
  ck_assert_msg(dec.done_ms < pre.done_ms,
                "the decode request waited for the whole prefill");
  ck_assert_int_eq(pre.res.path, QL_PATH_ACT_QUANT);
  ck_assert_int_eq(dec.res.path, QL_PATH_WEIGHT_ONLY);
  void *ref = reference(pre.x, 64, QL_DTYPE_F32);
  ck_assert_mem_eq(pre.y, ref, 64 * N * sizeof(float));
  free(ref);
  ref = reference(dec.x, 1, QL_DTYPE_F32);
  ck_assert_mem_eq(dec.y, ref, N * sizeof(float));
  free(ref);
  /* 4 prefill launches and 1 decode launch. */
  ck_assert_uint_eq(weight_stat(c, offsetof(ql_weight_stats, aq_batches)), 4);
  ck_assert_uint_eq(weight_stat(c, offsetof(ql_weight_stats, wo_batches)), 1);
  /* The histograms: one queue entry per request, one kernel entry per
   * launch, every launch at least the 120 ms the test delay makes it. */
  ql_stats_info *st = NULL;
  ck_assert_int_eq(ql_stats(c, &st), 0);
  uint64_t nq = 0, nk = 0, slow = 0;
  for (int b = 0; b < QL_HIST_BUCKETS; b++) {
    nq += st->per_weight[0].queue_hist[b];
    nk += st->per_weight[0].kernel_hist[b];
    if ((1024ull << b) > 120000000ull) /* the bucket's upper bound */
      slow += st->per_weight[0].kernel_hist[b];
  }
  ql_stats_free(st);
  ck_assert_uint_eq(nq, 2);
  ck_assert_uint_eq(nk, 5);
  ck_assert_uint_eq(slow, 5);
  call_free(&pre);
  call_free(&dec);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/*
 * On the CPU, whose launches stop at a piece boundary and go on later, a
 * long prefill runs as one launch: a decode request sent while it runs is
 * answered before it ends (the launch stops for it), and both answers are
 * exactly the reference's. QL_TEST_PIECE_DELAY_US makes each piece of the
 * prefill last, so that it is still running when the decode request comes,
 * whatever this machine's speed. With max_queue_delay_us (_i = 1) the
 * decode request is due only after its delay, while every lane is busy:
 * a timer must ask again then (it waited for the whole prefill).
 */
START_TEST(prefill_stops_for_decode) {
  td d;
  make_weight();
  const char *args[] = {"--cpu-threads", "1", "--max-batch-rows", "2048",
                        _i ? "--max-queue-delay-us" : NULL, "5000", NULL};
  setenv("QL_TEST_PIECE_DELAY_US", "3000", 1);
  start(&d, NULL, args);
  unsetenv("QL_TEST_PIECE_DELAY_US");
  ql_client *c = td_connect(&d);
  load(c);
  call pre, dec;
  /* 2048 rows: dozens of pieces (row blocks of at most 252 rows x 4-tile
   * passes, and 16 pieces of rows to quantize first). */
  call_init(&pre, c, 2048, 11);
  call_init(&dec, c, 1, 12);
  pthread_t tp, td_;
  ck_assert_int_eq(pthread_create(&tp, NULL, call_run, &pre), 0);
  usleep(40 * 1000);
  ck_assert_int_eq(pthread_create(&td_, NULL, call_run, &dec), 0);
  pthread_join(td_, NULL);
  pthread_join(tp, NULL);
  ck_assert_int_eq(pre.rc, 0);
  ck_assert_int_eq(dec.rc, 0);
  ck_assert_msg(dec.done_ms < pre.done_ms,
                "the decode request waited for the whole prefill");
  void *ref = reference(pre.x, 2048, QL_DTYPE_F32);
  ck_assert_mem_eq(pre.y, ref, 2048 * N * sizeof(float));
  free(ref);
  ref = reference(dec.x, 1, QL_DTYPE_F32);
  ck_assert_mem_eq(dec.y, ref, N * sizeof(float));
  free(ref);
  /* One prefill launch (stopped and gone on with, never cut into chunks)
   * and one decode launch. */
  ck_assert_uint_eq(weight_stat(c, offsetof(ql_weight_stats, aq_batches)), 1);
  ck_assert_uint_eq(weight_stat(c, offsetof(ql_weight_stats, wo_batches)), 1);
  ck_assert_uint_eq(weight_stat(c, offsetof(ql_weight_stats, requests)), 2);
  call_free(&pre);
  call_free(&dec);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* NaN in one coalesced request fails that request only: decode requests
 * (2 rows), and prefill ones (16 rows), whose batch the CPU runs as a
 * launch in parts. */
START_TEST(nonfinite_fails_only_its_request) {
  td d;
  int64_t rows = _i ? 16 : 2;
  make_weight();
  start(&d, "200", NULL);
  ql_client *c = td_connect(&d);
  load(c);
  call blocker, a, b;
  call_init(&blocker, c, 1, 1);
  call_init(&a, c, rows, 2);
  call_init(&b, c, rows, 3);
  ((float *)a.x)[K + 7] = __builtin_nanf("");
  pthread_t t0, t1, t2;
  ck_assert_int_eq(pthread_create(&t0, NULL, call_run, &blocker), 0);
  usleep(80 * 1000);
  ck_assert_int_eq(pthread_create(&t1, NULL, call_run, &a), 0);
  ck_assert_int_eq(pthread_create(&t2, NULL, call_run, &b), 0);
  pthread_join(t0, NULL);
  pthread_join(t1, NULL);
  pthread_join(t2, NULL);
  ck_assert_int_eq(blocker.rc, 0);
  ck_assert_int_eq(a.rc, QL_ENONFINITE);
  ck_assert_int_eq(b.rc, 0);
  void *ref = reference(b.x, rows, QL_DTYPE_F32);
  ck_assert_mem_eq(b.y, ref, (size_t)rows * N * sizeof(float));
  free(ref);
  call_free(&blocker);
  call_free(&a);
  call_free(&b);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

static void load_other(ql_client *c, const char *name, uint64_t n, uint64_t k,
                       uint64_t seed) {
  float *w = tu_xmalloc(n * k * sizeof(float));
  td_randn(&seed, w, n * k, 0.05f);
  ql_load_desc d;
  memset(&d, 0, sizeof d);
  d.name = name;
  d.format = QL_FORMAT_Q8C;
  d.n = n;
  d.k = k;
  d.dtype = QL_DTYPE_F32;
  d.data = w;
  ck_assert_int_eq(ql_load_float(c, &d, NULL, NULL), 0);
  free(w);
}

/* LinearMulti: several weights on one x give what each gives alone, in
 * one round trip; a weight that does not fit fails the whole. */
START_TEST(linear_multi) {
  td d;
  make_weight();
  start(&d, NULL, NULL);
  ql_client *c = td_connect(&d);
  load(c);
  load_other(c, "w2", 128, K, 8);
  load_other(c, "w3", 64, 256, 9);
  for (int64_t m = 1; m <= 32; m *= 4) {
    void *x = make_x(7, (uint64_t)m, m, QL_DTYPE_F32);
    const char *names[2] = {"w", "w2"};
    uint64_t ns[2] = {N, 128};
    float *y0 = tu_xmalloc((size_t)m * N * 4), *y1 = tu_xmalloc((size_t)m * 128 * 4);
    float *a0 = tu_xmalloc((size_t)m * N * 4), *a1 = tu_xmalloc((size_t)m * 128 * 4);
    void *ys[2] = {y0, y1};
    ql_linear_result res[2];
    int rc = ql_linear_multi(c, 2, names, QL_PATH_AUTO, QL_DTYPE_F32,
                             (uint64_t)m, K, x, ns, ys, res);
    ck_assert_msg(rc == 0, "linear_multi: %s: %s", ql_strerror(rc),
                  ql_errmsg());
    ck_assert_int_eq(ql_linear(c, "w", QL_PATH_AUTO, QL_DTYPE_F32,
                               (uint64_t)m, K, x, N, a0, NULL),
                     0);
    ck_assert_int_eq(ql_linear(c, "w2", QL_PATH_AUTO, QL_DTYPE_F32,
                               (uint64_t)m, K, x, 128, a1, NULL),
                     0);
    ck_assert_mem_eq(y0, a0, (size_t)m * N * 4);
    ck_assert_mem_eq(y1, a1, (size_t)m * 128 * 4);
    ck_assert_int_eq(res[0].path, m < 16 ? QL_PATH_WEIGHT_ONLY
                                         : QL_PATH_ACT_QUANT);
    free(x);
    free(y0);
    free(y1);
    free(a0);
    free(a1);
  }
  float x[K], y[N + 128 + 64];
  memset(x, 0, sizeof x);
  void *ys[3] = {y, y + N, y + N + 128};
  const char *bad_k[3] = {"w", "w2", "w3"};
  uint64_t ns[3] = {N, 128, 64};
  ck_assert_int_eq(ql_linear_multi(c, 3, bad_k, QL_PATH_AUTO, QL_DTYPE_F32, 1,
                                   K, x, ns, ys, NULL),
                   QL_ESHAPE);
  const char *missing[2] = {"w", "nope"};
  ck_assert_int_eq(ql_linear_multi(c, 2, missing, QL_PATH_AUTO, QL_DTYPE_F32,
                                   1, K, x, ns, ys, NULL),
                   QL_ENOTFOUND);
  ck_assert_int_eq(ql_linear_multi(c, 0, missing, QL_PATH_AUTO, QL_DTYPE_F32,
                                   1, K, x, ns, ys, NULL),
                   QL_EINVAL);
  /* The daemon's own checks: no weights, slices not one per weight. */
  Qlinear__V1__Request req;
  Qlinear__V1__LinearMultiRequest lm;
  Qlinear__V1__Tensor xt;
  qlinear__v1__request__init(&req);
  qlinear__v1__linear_multi_request__init(&lm);
  qlinear__v1__tensor__init(&xt);
  uint64_t shape[2] = {1, K};
  xt.dtype = QLINEAR__V1__DTYPE__DTYPE_F32;
  xt.shape = shape;
  xt.n_shape = 2;
  xt.data_case = QLINEAR__V1__TENSOR__DATA_INLINE_DATA;
  xt.inline_data.data = (uint8_t *)x;
  xt.inline_data.len = sizeof x;
  lm.x = &xt;
  req.request_id = 77;
  req.body_case = QLINEAR__V1__REQUEST__BODY_LINEAR_MULTI;
  req.linear_multi = &lm;
  Qlinear__V1__Response *resp = td_call(&d, &req, 10000);
  ck_assert_ptr_nonnull(resp);
  ck_assert_int_eq(resp->status->code, QL_EINVAL);
  qlinear__v1__response__free_unpacked(resp, NULL);
  char *two[2] = {"w", "w2"};
  Qlinear__V1__RegionSlice sl, *psl = &sl;
  qlinear__v1__region_slice__init(&sl);
  lm.weights = two;
  lm.n_weights = 2;
  lm.y_out = &psl;
  lm.n_y_out = 1;
  resp = td_call(&d, &req, 10000);
  ck_assert_ptr_nonnull(resp);
  ck_assert_int_eq(resp->status->code, QL_EINVAL);
  qlinear__v1__response__free_unpacked(resp, NULL);
  /* A request may name its device: the CPU holds every weight, nothing
   * else exists here. */
  raw_call dev;
  raw_init(&dev, &d, x, 1, 0);
  dev.lin.weight = "w";
  dev.lin.device = "cuda:0";
  raw_run(&dev);
  ck_assert_int_eq(dev.rc, QL_ENOTFOUND);
  dev.lin.device = "cpu";
  raw_run(&dev);
  ck_assert_int_eq(dev.rc, 0);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("sched");
  TCase *tc = tcase_create("sched");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, coalesced_replies_match_reference);
  tcase_add_test(tc, backpressure);
  tcase_add_test(tc, deadlines);
  tcase_add_test(tc, prefill_chunks_let_decode_through);
  tcase_add_loop_test(tc, prefill_stops_for_decode, 0, 2);
  tcase_add_loop_test(tc, nonfinite_fails_only_its_request, 0, 2);
  tcase_add_test(tc, linear_multi);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  ql_qweight_free(Q);
  return failed == 0 ? 0 : 1;
}
