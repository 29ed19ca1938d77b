/*
 * test_daemon.c - integration tests: a real qlineard on a temporary socket,
 * driven through libqlinear by this process, its threads and its forked
 * children, and through raw protocol messages for input the library would
 * refuse to send. Every test ends by stopping the daemon with SIGTERM and
 * requiring exit status 0.
 *
 * A weight lives while a session holds it (DESIGN §8): where clients that
 * come and go share a weight, a process holds it for the whole test
 * (fork_holder()). Sessions themselves are tested in test_sessions.c.
 */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "golden_load.h"
#include "harness.h"
#include "ql_kernels.h"
#include "import.h"
#include "qlinear/qlinear.h"

/* ------------------------------------------------------------- helpers */

/* A format as the tests name it: format, group/block size, q8b form. */
typedef struct fmt {
  ql_format f;
  uint32_t gs;
  int asym;
} fmt;
#define FMT(f, gs) ((fmt){(f), (gs), 0})

static int load(ql_client *c, const char *name, const td_layer *l, fmt F,
                int *shared) {
  ql_load_desc d;
  memset(&d, 0, sizeof d);
  d.name = name;
  d.format = F.f;
  d.group_size = F.gs;
  d.asymmetric = F.asym;
  d.n = l->n;
  d.k = l->k;
  d.dtype = QL_DTYPE_F32;
  d.data = l->w;
  d.bias = l->b;
  d.policy = QL_PATH_AUTO;
  return ql_load_float(c, &d, NULL, shared);
}

/* The in-process reference for what the daemon must return: the same
 * quantization and the same generic op, so results are equal bytes. */
static ql_qweight *quantize(const td_layer *l, fmt F) {
  ql_qweight *q = NULL;
  /* Scale dtype 0: the format's default, as the daemon picks it. */
  ql_quant_params p = {F.f, F.gs, F.asym, (ql_dtype)0};
  ck_assert_int_eq(ql_qweight_quantize(&p, (int64_t)l->n, (int64_t)l->k,
                                       QL_DTYPE_F32, l->w, l->b, &q),
                   0);
  return q;
}

static void *reference(const td_layer *l, fmt F, ql_path path, ql_dtype dt,
                       const void *x, uint64_t m) {
  ql_qweight *q = quantize(l, F);
  void *y = malloc(m * l->n * ql_dtype_size(dt));
  ck_assert_ptr_nonnull(y);
  int rc = path == QL_PATH_WEIGHT_ONLY
               ? ql_linear_wo_ref(q, dt, x, (int64_t)m, y)
               : ql_linear_aq_ref(q, dt, x, (int64_t)m, y);
  ck_assert_int_eq(rc, 0);
  ql_qweight_free(q);
  return y;
}

/* Runs one linear and compares it with the reference, byte for byte. */
static void check_linear(ql_client *c, const char *name, const td_layer *l,
                         fmt F, ql_path path, ql_dtype dt, uint64_t m,
                         uint64_t seed) {
  size_t es = ql_dtype_size(dt);
  float *xf = malloc(m * l->k * sizeof(float));
  void *x = malloc(m * l->k * es);
  void *y = malloc(m * l->n * es);
  ck_assert(xf && x && y);
  td_randn(&seed, xf, m * l->k, 1.0f);
  ql_from_f32(dt, xf, x, m * l->k);
  ql_linear_result res;
  int rc = ql_linear(c, name, path, dt, m, l->k, x, l->n, y, &res);
  ck_assert_msg(rc == 0, "linear %s: %s: %s", name, ql_strerror(rc),
                ql_errmsg());
  ck_assert_int_eq(res.path, path);
  void *want = reference(l, F, path, dt, x, m);
  ck_assert_msg(memcmp(y, want, m * l->n * es) == 0,
                "%s: daemon result differs from the reference", name);
  free(want);
  free(xf);
  free(x);
  free(y);
}

/*
 * Forks a client process that loads l as name and holds it (its session
 * stays open) until it is killed; returns once the weight is resident. The
 * caller must not have a nanomsg socket open (nanomsg does not survive
 * fork) and ends the holder with end_holder().
 */
static pid_t fork_holder(const td *d, const char *name, const td_layer *l,
                         fmt F) {
  int p[2];
  ck_assert_int_eq(pipe(p), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(p[0]);
    ql_client *c = NULL;
    char ok = ql_connect(d->address, NULL, &c) == 0 &&
                      load(c, name, l, F, NULL) == 0
                  ? 'y'
                  : 'n';
    if (write(p[1], &ok, 1) != 1)
      _exit(1);
    for (;;)
      pause();
  }
  close(p[1]);
  char ok = 0;
  ck_assert_int_eq(read(p[0], &ok, 1), 1);
  close(p[0]);
  ck_assert_msg(ok == 'y', "the holder could not load %s", name);
  return pid;
}

static void end_holder(pid_t pid) {
  int st;
  kill(pid, SIGKILL);
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
}

/* A Request with a fresh id, for raw calls. */
static void raw_init(Qlinear__V1__Request *r) {
  static uint64_t id = 1000;
  qlinear__v1__request__init(r);
  r->request_id = ++id;
}

static int raw_code(const td *d, const Qlinear__V1__Request *req) {
  Qlinear__V1__Response *resp = td_call(d, req, 5000);
  ck_assert_msg(resp != NULL, "no reply from the daemon");
  ck_assert_uint_eq(resp->request_id, req->request_id);
  ck_assert_ptr_nonnull(resp->status);
  int code = resp->status->code;
  if (code != 0)
    ck_assert_msg(resp->status->message && resp->status->message[0],
                  "error reply without a message");
  qlinear__v1__response__free_unpacked(resp, NULL);
  return code;
}

/* The fixture of most tests: a daemon with default options and one
 * connected client; teardown requires a clean exit on SIGTERM. */
static td D;
static ql_client *C;

static void setup(void) {
  /* A fixed crossover: the tests below check which path AUTO takes. */
  static const char *const args[] = {"--crossover-rows", "16", NULL};
  td_start(&D, args);
  C = td_connect(&D);
}

static void teardown(void) {
  ql_close(C);
  C = NULL;
  ck_assert_int_eq(td_stop(&D), 0);
}

/* --------------------------------------------------------------- tests */

START_TEST(test_hello) {
  td d;
  td_start(&d, NULL);
  ql_client *c = td_connect(&d);
  ql_hello_info h, h2;
  ck_assert_int_eq(ql_hello(c, &h), 0);
  ck_assert_uint_eq(h.protocol_version, QL_PROTOCOL_VERSION);
  ck_assert_uint_eq(h.quantizer_version, 2);
  ck_assert_uint_eq(h.max_message_bytes, 64u << 20);
  ck_assert_uint_ge(h.n_devices, 1);
  ck_assert_str_eq(h.devices[0].name, "cpu");
  uint8_t zero[sizeof h.instance_id] = {0};
  ck_assert(memcmp(h.instance_id, zero, sizeof zero) != 0);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);

  /* A new start has a new instance id. */
  td_start(&d, NULL);
  c = td_connect(&d);
  ck_assert_int_eq(ql_hello(c, &h2), 0);
  ck_assert(memcmp(h.instance_id, h2.instance_id, sizeof zero) != 0);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* Every format and group size, both paths, every activation dtype,
 * ragged K, N = 1, M = 1: equal bytes to the in-process reference. */
START_TEST(test_linear_matches_reference) {
  ql_client *c = C;
  static const struct {
    fmt F;
    uint64_t n, k;
  } cases[] = {
      {{QL_FORMAT_Q4G, 32, 0}, 17, 96},   {{QL_FORMAT_Q4G, 64, 0}, 1, 200},
      {{QL_FORMAT_Q4G, 128, 0}, 40, 300}, {{QL_FORMAT_Q4G, 256, 0}, 9, 513},
      {{QL_FORMAT_Q8C, 0, 0}, 33, 77},    {{QL_FORMAT_Q8C, 0, 0}, 1, 1},
      {{QL_FORMAT_Q8B, 64, 0}, 12, 150},  {{QL_FORMAT_Q8B, 32, 1}, 7, 97},
      {{QL_FORMAT_F8R, 0, 0}, 21, 130},   {{QL_FORMAT_F8R, 0, 0}, 1, 3},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    td_layer l;
    char name[64];
    fmt F = cases[i].F;
    snprintf(name, sizeof name, "t/layer.%zu", i);
    td_layer_make(&l, cases[i].n, cases[i].k, 100 + i, i % 2 == 0);
    int shared = -1;
    int rc = load(c, name, &l, F, &shared);
    ck_assert_msg(rc == 0, "load %s: %s: %s", name, ql_strerror(rc),
                  ql_errmsg());
    ck_assert_int_eq(shared, 0);
    for (int dt = QL_DTYPE_F32; dt <= QL_DTYPE_BF16; dt++) {
      check_linear(c, name, &l, F, QL_PATH_WEIGHT_ONLY, (ql_dtype)dt, 1, 7 + i);
      check_linear(c, name, &l, F, QL_PATH_WEIGHT_ONLY, (ql_dtype)dt, 5, 8 + i);
      if (F.f != QL_FORMAT_Q8B) /* weight-only format */
        check_linear(c, name, &l, F, QL_PATH_ACT_QUANT, (ql_dtype)dt, 3, 9 + i);
    }
    if (F.f == QL_FORMAT_Q8B) {
      /* AUTO falls back to weight-only; a forced AQ is refused. */
      float x[64 * 150] = {0}, y[64 * 12];
      ql_linear_result res;
      ck_assert_int_eq(ql_linear(c, name, QL_PATH_AUTO, QL_DTYPE_F32, 64,
                                 l.k, x, l.n, y, &res), 0);
      ck_assert_int_eq(res.path, QL_PATH_WEIGHT_ONLY);
      ck_assert_int_eq(ql_linear(c, name, QL_PATH_ACT_QUANT, QL_DTYPE_F32, 1,
                                 l.k, x, l.n, y, NULL), QL_ENOTSUP);
    }
    ql_weight_info info;
    ck_assert_int_eq(ql_lookup(c, name, &info), 0);
    ck_assert_int_eq(info.format, F.f);
    ck_assert_int_eq(info.asymmetric, F.asym);
    td_layer_free(&l);
  }
  /* AUTO picks weight-only for few rows and act-quant for many. */
  td_layer l;
  td_layer_make(&l, 8, 64, 5, 0);
  ck_assert_int_eq(load(c, "t/auto", &l, FMT(QL_FORMAT_Q8C, 0), NULL), 0);
  float x[32 * 64], y[32 * 8];
  uint64_t seed = 3;
  td_randn(&seed, x, 32 * 64, 1.0f);
  ql_linear_result res;
  ck_assert_int_eq(ql_linear(c, "t/auto", QL_PATH_AUTO, QL_DTYPE_F32, 1, 64,
                             x, 8, y, &res), 0);
  ck_assert_int_eq(res.path, QL_PATH_WEIGHT_ONLY);
  ck_assert_int_eq(ql_linear(c, "t/auto", QL_PATH_AUTO, QL_DTYPE_F32, 32, 64,
                             x, 8, y, &res), 0);
  ck_assert_int_eq(res.path, QL_PATH_ACT_QUANT);
  td_layer_free(&l);
}
END_TEST

START_TEST(test_share_exists_unload) {
  ql_client *c = C;
  td_layer a, b;
  td_layer_make(&a, 16, 64, 1, 1);
  td_layer_make(&b, 16, 64, 2, 1);
  int shared = -1;
  ck_assert_int_eq(load(c, "m/w", &a, FMT(QL_FORMAT_Q4G, 32), &shared), 0);
  ck_assert_int_eq(shared, 0);
  ql_weight_info before, after;
  ck_assert_int_eq(ql_lookup(c, "m/w", &before), 0);
  /* Same name, same content: shared. */
  ck_assert_int_eq(load(c, "m/w", &a, FMT(QL_FORMAT_Q4G, 32), &shared), 0);
  ck_assert_int_eq(shared, 1);
  /* Same name, other content: refused, the resident weight unchanged. */
  ck_assert_int_eq(load(c, "m/w", &b, FMT(QL_FORMAT_Q4G, 32), &shared), QL_EEXIST);
  ck_assert_int_eq(load(c, "m/w", &a, FMT(QL_FORMAT_Q8C, 0), &shared), QL_EEXIST);
  ck_assert_int_eq(ql_lookup(c, "m/w", &after), 0);
  ck_assert(memcmp(before.digest, after.digest, sizeof before.digest) == 0);
  check_linear(c, "m/w", &a, FMT(QL_FORMAT_Q4G, 32), QL_PATH_WEIGHT_ONLY,
               QL_DTYPE_F32, 2, 4);
  ck_assert_uint_eq(after.n, 16);
  ck_assert_uint_eq(after.k, 64);
  ck_assert_int_eq(after.has_bias, 1);
  ck_assert_int_eq(after.format, QL_FORMAT_Q4G);
  ck_assert_uint_eq(after.group_size, 32);

  ql_weight_info *list = NULL;
  size_t n = 0;
  ck_assert_int_eq(load(c, "m/v", &b, FMT(QL_FORMAT_Q8C, 0), NULL), 0);
  ck_assert_int_eq(ql_list(c, &list, &n), 0);
  ck_assert_uint_eq(n, 2);
  ql_free(list);

  ck_assert_int_eq(ql_unload(c, "m/w"), 0);
  ck_assert_int_eq(ql_unload(c, "m/w"), QL_ENOTFOUND);
  float x[64] = {0}, y[16];
  ck_assert_int_eq(ql_linear(c, "m/w", QL_PATH_AUTO, QL_DTYPE_F32, 1, 64, x,
                             16, y, NULL),
                   QL_ENOTFOUND);
  /* The name is free again, for other content too. */
  ck_assert_int_eq(load(c, "m/w", &b, FMT(QL_FORMAT_Q4G, 32), &shared), 0);
  ck_assert_int_eq(ql_list(c, &list, &n), 0);
  ck_assert_uint_eq(n, 2);
  ql_free(list);

  ql_stats_info *st = NULL;
  ck_assert_int_eq(ql_stats(c, &st), 0);
  ck_assert_uint_eq(st->weights, 2);
  ck_assert_uint_ge(st->errors, 4);
  ck_assert_uint_eq(st->n_per_weight, 2);
  ql_stats_free(st);
  td_layer_free(&a);
  td_layer_free(&b);
}
END_TEST

/* Bad input, through the library where it would send it and raw where it
 * would not: each gets its error and the daemon keeps serving. */
START_TEST(test_bad_input) {
  ql_client *c = C;
  td *dp = &D;
  td_layer l;
  td_layer_make(&l, 8, 40, 11, 0);
  ck_assert_int_eq(load(c, "ok", &l, FMT(QL_FORMAT_Q8C, 0), NULL), 0);
  float x[2 * 41], y[2 * 8];
  memset(x, 0, sizeof x);

  /* Unknown weight, K mismatch. */
  ck_assert_int_eq(ql_linear(c, "nope", QL_PATH_AUTO, QL_DTYPE_F32, 1, 40, x,
                             8, y, NULL),
                   QL_ENOTFOUND);
  ck_assert_int_eq(ql_linear(c, "ok", QL_PATH_AUTO, QL_DTYPE_F32, 2, 41, x, 8,
                             y, NULL),
                   QL_ESHAPE);
  /* NaN activations. */
  x[3] = NAN;
  ck_assert_int_eq(ql_linear(c, "ok", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 1,
                             40, x, 8, y, NULL),
                   QL_ENONFINITE);
  ck_assert_int_eq(ql_linear(c, "ok", QL_PATH_ACT_QUANT, QL_DTYPE_F32, 1, 40,
                             x, 8, y, NULL),
                   QL_ENONFINITE);
  x[3] = 0;
  /* A weight with Inf is refused and nothing is stored. */
  float saved = l.w[5];
  l.w[5] = INFINITY;
  ck_assert_int_eq(load(c, "inf", &l, FMT(QL_FORMAT_Q4G, 32), NULL), QL_ENONFINITE);
  ql_weight_info info;
  ck_assert_int_eq(ql_lookup(c, "inf", &info), QL_ENOTFOUND);
  l.w[5] = saved;
  /* Invalid names. */
  ck_assert_int_eq(load(c, "../etc", &l, FMT(QL_FORMAT_Q8C, 0), NULL), QL_ENAME);
  ck_assert_int_eq(load(c, "/abs", &l, FMT(QL_FORMAT_Q8C, 0), NULL), QL_ENAME);
  ck_assert_int_eq(load(c, "", &l, FMT(QL_FORMAT_Q8C, 0), NULL), QL_ENAME);

  /* Raw: M = 0. */
  Qlinear__V1__Request req;
  Qlinear__V1__LinearRequest lin;
  Qlinear__V1__Tensor t;
  uint64_t shape[2] = {0, 40};
  raw_init(&req);
  qlinear__v1__linear_request__init(&lin);
  qlinear__v1__tensor__init(&t);
  req.body_case = QLINEAR__V1__REQUEST__BODY_LINEAR;
  req.linear = &lin;
  lin.weight = "ok";
  lin.x = &t;
  t.dtype = QLINEAR__V1__DTYPE__DTYPE_F32;
  t.shape = shape;
  t.n_shape = 2;
  t.data_case = QLINEAR__V1__TENSOR__DATA_INLINE_DATA;
  t.inline_data.data = (uint8_t *)x;
  t.inline_data.len = 0;
  ck_assert_int_eq(raw_code(dp, &req), QL_ESHAPE);
  /* Wrong dtype size: f16 declared, f32 bytes sent. */
  shape[0] = 1;
  t.dtype = QLINEAR__V1__DTYPE__DTYPE_F16;
  t.inline_data.len = 40 * 4;
  ck_assert_int_eq(raw_code(dp, &req), QL_ESHAPE);
  /* Unknown dtype. */
  t.dtype = (Qlinear__V1__DType)42;
  ck_assert_int_eq(raw_code(dp, &req), QL_EDTYPE);
  /* A shape whose byte size overflows. */
  t.dtype = QLINEAR__V1__DTYPE__DTYPE_F32;
  shape[0] = (uint64_t)1 << 62;
  ck_assert_int_eq(raw_code(dp, &req), QL_ESHAPE);
  /* A good raw request still works. */
  shape[0] = 1;
  ck_assert_int_eq(raw_code(dp, &req), 0);

  /* Raw: unknown format, and q8b which does not exist yet. */
  Qlinear__V1__LoadBeginRequest lb;
  Qlinear__V1__WeightSpec sp;
  raw_init(&req);
  qlinear__v1__load_begin_request__init(&lb);
  qlinear__v1__weight_spec__init(&sp);
  req.body_case = QLINEAR__V1__REQUEST__BODY_LOAD_BEGIN;
  req.load_begin = &lb;
  lb.spec = &sp;
  sp.name = "raw/w";
  sp.format = (Qlinear__V1__Format)77;
  sp.n = 4;
  sp.k = 32;
  sp.dtype = QLINEAR__V1__DTYPE__DTYPE_F32;
  ck_assert_int_eq(raw_code(dp, &req), QL_EFORMAT);
  sp.format = QLINEAR__V1__FORMAT__FORMAT_Q8B; /* needs a block size */
  ck_assert_int_eq(raw_code(dp, &req), QL_EINVAL);
  sp.asymmetric = 1; /* q4g has no asymmetric form */
  sp.format = QLINEAR__V1__FORMAT__FORMAT_Q4G;
  sp.group_size = 32;
  ck_assert_int_eq(raw_code(dp, &req), QL_EINVAL);
  sp.asymmetric = 0;
  sp.format = QLINEAR__V1__FORMAT__FORMAT_Q4G;
  sp.group_size = 48;
  ck_assert_int_eq(raw_code(dp, &req), QL_EINVAL);

  /* Raw: chunks out of order, past the end, commit before complete. */
  sp.group_size = 32;
  Qlinear__V1__Response *resp = td_call(dp, &req, 5000);
  ck_assert_ptr_nonnull(resp);
  ck_assert_int_eq(resp->status->code, 0);
  ck_assert_int_eq(resp->body_case, QLINEAR__V1__RESPONSE__BODY_LOAD_BEGIN);
  uint64_t up = resp->load_begin->upload_id;
  ck_assert_uint_eq(resp->load_begin->total_bytes, 4 * 32 * 4);
  qlinear__v1__response__free_unpacked(resp, NULL);
  Qlinear__V1__LoadChunkRequest ch;
  uint8_t bytes[4 * 32 * 4 + 8];
  memset(bytes, 0, sizeof bytes);
  raw_init(&req);
  qlinear__v1__load_chunk_request__init(&ch);
  req.body_case = QLINEAR__V1__REQUEST__BODY_LOAD_CHUNK;
  req.load_chunk = &ch;
  ch.upload_id = up;
  ch.offset = 64;
  ch.data.data = bytes;
  ch.data.len = 64;
  ck_assert_int_eq(raw_code(dp, &req), QL_ESEQUENCE);
  ch.offset = 0;
  ch.data.len = sizeof bytes; /* 8 bytes too many */
  ck_assert_int_eq(raw_code(dp, &req), QL_ESHAPE);
  ch.data.len = 64;
  ck_assert_int_eq(raw_code(dp, &req), 0);
  ch.upload_id = up + 12345;
  ch.offset = 64;
  ck_assert_int_eq(raw_code(dp, &req), QL_ENOTFOUND);
  Qlinear__V1__LoadCommitRequest cm;
  raw_init(&req);
  qlinear__v1__load_commit_request__init(&cm);
  req.body_case = QLINEAR__V1__REQUEST__BODY_LOAD_COMMIT;
  req.load_commit = &cm;
  cm.upload_id = up;
  ck_assert_int_eq(raw_code(dp, &req), QL_ESHAPE);
  Qlinear__V1__LoadAbortRequest ab;
  raw_init(&req);
  qlinear__v1__load_abort_request__init(&ab);
  req.body_case = QLINEAR__V1__REQUEST__BODY_LOAD_ABORT;
  req.load_abort = &ab;
  ab.upload_id = up;
  ck_assert_int_eq(raw_code(dp, &req), 0);
  ck_assert_int_eq(raw_code(dp, &req), QL_ENOTFOUND);

  /* A request with no body, and garbage bytes. */
  raw_init(&req);
  ck_assert_int_eq(raw_code(dp, &req), QL_EPROTO);
  static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x12, 0x99,
                                    0x01, 0x02};
  resp = td_call_bytes(dp, garbage, sizeof garbage, 5000);
  ck_assert_ptr_nonnull(resp);
  ck_assert_int_eq(resp->status->code, QL_EPROTO);
  qlinear__v1__response__free_unpacked(resp, NULL);

  /* After all that, the good weight still computes the same thing. */
  check_linear(c, "ok", &l, FMT(QL_FORMAT_Q8C, 0), QL_PATH_ACT_QUANT, QL_DTYPE_F32,
               2, 99);
  ql_weight_info *list = NULL;
  size_t n = 0;
  ck_assert_int_eq(ql_list(c, &list, &n), 0);
  ck_assert_uint_eq(n, 1);
  ck_assert_str_eq(list[0].name, "ok");
  ql_free(list);
  td_layer_free(&l);
}
END_TEST

/* A peer sending more than the cap is dropped by nanomsg unread; the
 * library refuses such a message locally; other clients carry on. */
START_TEST(test_message_cap) {
  td d;
  static const char *const args[] = {"--max-message-bytes", "65536",
                                     "--max-chunk-bytes", "16384", NULL};
  td_start(&d, args);
  ql_client *c = td_connect(&d);
  ql_hello_info h;
  ck_assert_int_eq(ql_hello(c, &h), 0);
  ck_assert_uint_eq(h.max_message_bytes, 65536);
  ck_assert_uint_le(h.max_chunk_bytes, 16384);

  /* A weight larger than one message still loads, in chunks. */
  td_layer l;
  td_layer_make(&l, 64, 1024, 21, 1); /* 256 KiB of f32 */
  ck_assert_int_eq(load(c, "big", &l, FMT(QL_FORMAT_Q4G, 128), NULL), 0);
  check_linear(c, "big", &l, FMT(QL_FORMAT_Q4G, 128), QL_PATH_WEIGHT_ONLY,
               QL_DTYPE_F32, 2, 5);

  /* Over the cap through the library: refused locally. */
  size_t m = 32; /* 32 x 1024 f32 = 128 KiB */
  float *x = calloc(m * 1024, sizeof(float)), *y = calloc(m * 64, 4);
  ck_assert_int_eq(ql_linear(c, "big", QL_PATH_AUTO, QL_DTYPE_F32, m, 1024, x,
                             64, y, NULL),
                   QL_ETOOBIG);

  /* Over the cap from a raw peer: no reply, nothing disturbed. */
  size_t len = 200000;
  uint8_t *junk = calloc(1, len);
  Qlinear__V1__Response *resp = td_call_bytes(&d, junk, len, 1000);
  ck_assert_ptr_null(resp);
  free(junk);
  ck_assert(td_alive(&d));
  check_linear(c, "big", &l, FMT(QL_FORMAT_Q4G, 128), QL_PATH_ACT_QUANT,
               QL_DTYPE_F32, 4, 6);
  free(x);
  free(y);
  td_layer_free(&l);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* Several client processes at once: each loads its own weight and a
 * shared one, runs linears checked against the reference, unloads. They
 * start when go becomes readable. */
static void child_work(const td *d, int id, int go) {
  char byte;
  if (read(go, &byte, 1) != 1)
    _exit(9);
  ql_client *c = NULL;
  if (ql_connect(d->address, NULL, &c) != 0)
    _exit(10);
  td_layer own, common;
  td_layer_make(&own, 24 + id, 160, 500 + id, 1);
  td_layer_make(&common, 32, 128, 42, 1);
  char name[32];
  snprintf(name, sizeof name, "proc/%d", id);
  int shared;
  if (load(c, name, &own, FMT(QL_FORMAT_Q4G, 64), NULL) != 0)
    _exit(11);
  if (load(c, "proc/common", &common, FMT(QL_FORMAT_Q8C, 0), &shared) != 0)
    _exit(12);
  for (int i = 0; i < 10; i++) {
    check_linear(c, name, &own, FMT(QL_FORMAT_Q4G, 64),
                 i % 2 ? QL_PATH_ACT_QUANT : QL_PATH_WEIGHT_ONLY,
                 (ql_dtype)(QL_DTYPE_F32 + i % 3), 1 + (uint64_t)i, 1000 * id + i);
    check_linear(c, "proc/common", &common, FMT(QL_FORMAT_Q8C, 0),
                 QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 3, 77 * id + i);
  }
  if (ql_unload(c, name) != 0)
    _exit(13);
  td_layer_free(&own);
  td_layer_free(&common);
  ql_close(c);
  _exit(0);
}

START_TEST(test_concurrent_processes) {
  /* Children are forked before this process touches nanomsg, whose
   * global state does not survive a fork. */
  td d;
  td_start(&d, NULL);
  enum { NPROC = 4 };
  pid_t pids[NPROC];
  int go[2];
  ck_assert_int_eq(pipe(go), 0);
  for (int i = 0; i < NPROC; i++) {
    pids[i] = fork();
    ck_assert_int_ge(pids[i], 0);
    if (pids[i] == 0) {
      close(go[1]);
      child_work(&d, i, go[0]);
    }
  }
  close(go[0]);
  /* This session holds the shared weight before the children start, so it
   * outlives them: they come and go, it stays, with all their requests
   * counted. */
  ql_client *c = td_connect(&d);
  td_layer common;
  td_layer_make(&common, 32, 128, 42, 1);
  ck_assert_int_eq(load(c, "proc/common", &common, FMT(QL_FORMAT_Q8C, 0), NULL),
                   0);
  td_layer_free(&common);
  ck_assert_int_eq(write(go[1], "gogo", NPROC), NPROC);
  close(go[1]);
  for (int i = 0; i < NPROC; i++) {
    int st;
    ck_assert_int_eq(waitpid(pids[i], &st, 0), pids[i]);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "client process %d failed (status %d)", i, st);
  }
  ql_weight_info *list = NULL;
  size_t n = 0;
  ck_assert_int_eq(ql_list(c, &list, &n), 0);
  ck_assert_uint_eq(n, 1); /* only the shared weight is left */
  ck_assert_str_eq(list[0].name, "proc/common");
  ql_free(list);
  ql_stats_info *st = NULL;
  ck_assert_int_eq(ql_stats(c, &st), 0);
  ck_assert_uint_eq(st->n_per_weight, 1);
  ck_assert_uint_eq(st->per_weight[0].requests, NPROC * 10);
  ck_assert_uint_eq(st->per_weight[0].rows, NPROC * 10 * 3);
  ql_stats_free(st);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* Replies go out in completion order, not arrival order: a Stats request
 * sent while a long Linear runs is answered first. */
typedef struct slow_arg {
  ql_client *c;
  int rc;
  volatile int done;
} slow_arg;

static void *slow_linear(void *p) {
  slow_arg *a = p;
  size_t m = 128, k = 4096, n = 2048;
  float *x = calloc(m * k, sizeof(float)), *y = calloc(m * n, sizeof(float));
  for (size_t i = 0; i < m * k; i++)
    x[i] = (float)(i % 13) - 6.0f;
  a->rc = ql_linear(a->c, "slow", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, m, k, x,
                    n, y, NULL);
  a->done = 1;
  free(x);
  free(y);
  return NULL;
}

START_TEST(test_out_of_order_replies) {
  /* Every linear job takes 1.5 s, whatever the kernels' speed. */
  td d;
  setenv("QL_TEST_KERNEL_DELAY_MS", "1500", 1);
  td_start(&d, NULL);
  unsetenv("QL_TEST_KERNEL_DELAY_MS");
  ql_client *C = td_connect(&d);
  td_layer l;
  td_layer_make(&l, 2048, 4096, 31, 0);
  ck_assert_int_eq(load(C, "slow", &l, FMT(QL_FORMAT_Q8C, 0), NULL), 0);
  slow_arg a = {C, -1, 0};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, slow_linear, &a), 0);
  /* Wait until the worker has started on it: Stats then shows the queue
   * time is not yet accounted, and the request is in flight. */
  usleep(200 * 1000);
  ql_stats_info *st = NULL;
  ck_assert_int_eq(ql_stats(C, &st), 0);
  int answered_first = !a.done;
  ck_assert_uint_eq(st->per_weight[0].requests, 0);
  ql_stats_free(st);
  pthread_join(th, NULL);
  ck_assert_int_eq(a.rc, 0);
  ck_assert_msg(answered_first, "Stats waited for the Linear before it");
  ck_assert_int_eq(ql_stats(C, &st), 0);
  ck_assert_uint_eq(st->per_weight[0].requests, 1);
  ql_stats_free(st);
  td_layer_free(&l);
  ql_close(C);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* Threads of one process share one client. */
typedef struct thread_arg {
  ql_client *c;
  const td_layer *l;
  int id;
  int failures;
} thread_arg;

static void *thread_main(void *p) {
  thread_arg *a = p;
  uint64_t seed = 9000 + (uint64_t)a->id;
  float x[4 * 96], y[4 * 48];
  for (int i = 0; i < 25; i++) {
    td_randn(&seed, x, 4 * 96, 1.0f);
    if (ql_linear(a->c, "thr", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 4, 96, x,
                  48, y, NULL) != 0) {
      a->failures++;
      continue;
    }
    void *want = reference(a->l, FMT(QL_FORMAT_Q4G, 32), QL_PATH_WEIGHT_ONLY,
                           QL_DTYPE_F32, x, 4);
    if (memcmp(want, y, sizeof y) != 0)
      a->failures++;
    free(want);
  }
  return NULL;
}

START_TEST(test_concurrent_threads) {
  ql_client *c = C;
  td_layer l;
  td_layer_make(&l, 48, 96, 8, 0);
  ck_assert_int_eq(load(c, "thr", &l, FMT(QL_FORMAT_Q4G, 32), NULL), 0);
  enum { NT = 6 };
  pthread_t th[NT];
  thread_arg args[NT];
  for (int i = 0; i < NT; i++) {
    args[i] = (thread_arg){c, &l, i, 0};
    ck_assert_int_eq(pthread_create(&th[i], NULL, thread_main, &args[i]), 0);
  }
  for (int i = 0; i < NT; i++) {
    pthread_join(th[i], NULL);
    ck_assert_int_eq(args[i].failures, 0);
  }
  td_layer_free(&l);
}
END_TEST

/* A 4096x14336 f32 weight (224 MiB) uploads in chunks and computes. */
START_TEST(test_large_weight) {
  ql_client *c = C;
  td_layer l;
  td_layer_make(&l, 4096, 14336, 77, 0);
  int rc = load(c, "large", &l, FMT(QL_FORMAT_Q4G, 128), NULL);
  ck_assert_msg(rc == 0, "load: %s: %s", ql_strerror(rc), ql_errmsg());
  ql_weight_info info;
  ck_assert_int_eq(ql_lookup(c, "large", &info), 0);
  ck_assert_uint_eq(info.n, 4096);
  ck_assert_uint_eq(info.k, 14336);
  /* qdata + scale and zero per group of 128, in f32 like the data, plus
   * the CPU device's repacked layout when it keeps one. */
  ck_assert_uint_ge(info.bytes_resident,
                    4096ull * 7168 + 2ull * 4 * 4096 * 112);
  check_linear(c, "large", &l, FMT(QL_FORMAT_Q4G, 128), QL_PATH_WEIGHT_ONLY,
               QL_DTYPE_BF16, 1, 12);
  td_layer_free(&l);
}
END_TEST

/*
 * Memory handed back: uploads of large float weights (1 GiB three times,
 * 64 MiB twelve times in the four formats), each unloaded again, leave the
 * daemon's RSS within 20 % (plus 64 MiB) of what it was with nothing
 * resident. Upload and conversion buffers used to keep the heap's
 * high-water mark (RSS 183 MiB from 76 for this sequence). Under the
 * sanitizers the allocator keeps freed memory in quarantine by design:
 * the sequence runs, the bound is not checked.
 */
START_TEST(test_memory_returned) {
  static const fmt fmts[] = {{QL_FORMAT_Q4G, 128, 0}, {QL_FORMAT_Q8C, 0, 0},
                             {QL_FORMAT_Q8B, 128, 0}, {QL_FORMAT_F8R, 0, 0}};
  td d;
  td_start(&d, NULL);
  ql_client *c = td_connect(&d);
  td_layer small, mid, big;
  td_layer_make(&small, 64, 256, 1, 1);
  td_layer_make(&mid, 4096, 4096, 2, 1);   /* 64 MiB of f32 */
  td_layer_make(&big, 16384, 16384, 3, 0); /* 1 GiB of f32 */
  /* What a daemon that has served once holds with nothing resident. */
  ck_assert_int_eq(load(c, "warm", &small, fmts[1], NULL), 0);
  ck_assert_int_eq(ql_unload(c, "warm"), 0);
  long before = td_daemon_rss_kib(&d);
  char name[32];
  for (int i = 0; i < 3; i++) {
    snprintf(name, sizeof name, "big%d", i);
    int rc = load(c, name, &big, fmts[1], NULL);
    ck_assert_msg(rc == 0, "load %s: %s: %s", name, ql_strerror(rc),
                  ql_errmsg());
    ck_assert_int_eq(ql_unload(c, name), 0);
  }
  for (int i = 0; i < 12; i++) {
    snprintf(name, sizeof name, "mid%d", i);
    int rc = load(c, name, &mid, fmts[i % 4], NULL);
    ck_assert_msg(rc == 0, "load %s: %s: %s", name, ql_strerror(rc),
                  ql_errmsg());
    ck_assert_int_eq(ql_unload(c, name), 0);
  }
  /* A list after the unloads: the daemon has handled them all. */
  ql_weight_info *w = NULL;
  size_t n = 0;
  ck_assert_int_eq(ql_list(c, &w, &n), 0);
  ck_assert_uint_eq(n, 0);
  ql_free(w);
  long after = td_daemon_rss_kib(&d);
  fprintf(stderr, "memory_returned: RSS %ld KiB before, %ld KiB after\n",
          before, after);
  if (!td_sanitized())
    ck_assert_msg(after <= before + before / 5 + 64 * 1024,
                  "RSS %ld KiB after the loads and unloads, %ld before",
                  after, before);
  td_layer_free(&small);
  td_layer_free(&mid);
  td_layer_free(&big);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* SIGTERM while requests are queued: they are answered, the daemon exits
 * 0 and removes its socket. */
START_TEST(test_shutdown_drains) {
  td d;
  td_start(&d, NULL);
  td_layer l;
  td_layer_make(&l, 1024, 2048, 3, 0);
  pid_t holder = fork_holder(&d, "slow", &l, FMT(QL_FORMAT_Q8C, 0));
  enum { NPROC = 3 };
  pid_t pids[NPROC];
  for (int i = 0; i < NPROC; i++) {
    pids[i] = fork();
    ck_assert_int_ge(pids[i], 0);
    if (pids[i] == 0) {
      ql_client *cc = NULL;
      if (ql_connect(d.address, NULL, &cc) != 0)
        _exit(1);
      float *x = calloc(64 * 2048, sizeof(float));
      float *y = calloc(64 * 1024, sizeof(float));
      for (int j = 0; j < 64 * 2048; j++)
        x[j] = (float)(j % 7) - 3.0f;
      int rc = ql_linear(cc, "slow", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 64,
                         2048, x, 1024, y, NULL);
      _exit(rc == 0 ? 0 : 2);
    }
  }
  usleep(300 * 1000); /* let the requests reach the queue */
  ck_assert_int_eq(td_stop(&d), 0);
  for (int i = 0; i < NPROC; i++) {
    int st;
    ck_assert_int_eq(waitpid(pids[i], &st, 0), pids[i]);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "a request in flight at SIGTERM was not answered");
  }
  end_holder(holder);
  td_layer_free(&l);
}
END_TEST

/* Waiting jobs may hold at most --max-queued-bytes of tensors. */
START_TEST(test_queued_bytes_limit) {
  td d;
  static const char *const args[] = {"--max-queued-bytes", "1048576", NULL};
  td_start(&d, args);
  /* Inline tensors are what the bound counts: the message path. */
  ql_client *c = td_connect_messages(&d);
  td_layer l;
  td_layer_make(&l, 8, 65536, 4, 0);
  ck_assert_int_eq(load(c, "wide", &l, FMT(QL_FORMAT_Q8C, 0), NULL), 0);
  float *x = calloc(8 * 65536, sizeof(float)), y[8 * 8];
  ck_assert_int_eq(ql_linear(c, "wide", QL_PATH_AUTO, QL_DTYPE_F32, 8, 65536,
                             x, 8, y, NULL),
                   QL_EEXHAUSTED);
  ck_assert_int_eq(ql_linear(c, "wide", QL_PATH_AUTO, QL_DTYPE_F32, 1, 65536,
                             x, 8, y, NULL),
                   0);
  free(x);
  td_layer_free(&l);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* A listing that outgrows the message cap is an error the client reads,
 * not a reply it cannot receive. */
START_TEST(test_reply_over_cap) {
  td d;
  static const char *const args[] = {"--max-message-bytes", "8192", NULL};
  td_start(&d, args);
  ql_client *c = td_connect(&d);
  td_layer l;
  td_layer_make(&l, 1, 32, 4, 0);
  for (int i = 0; i < 40; i++) {
    char name[256];
    memset(name, 'a', 200);
    snprintf(name + 200, sizeof name - 200, "%d", i);
    ck_assert_int_eq(load(c, name, &l, FMT(QL_FORMAT_Q8C, 0), NULL), 0);
  }
  ql_weight_info *list = NULL;
  size_t n = 0;
  ck_assert_int_eq(ql_list(c, &list, &n), QL_ETOOBIG);
  ck_assert_ptr_null(list);
  ql_hello_info h;
  ck_assert_int_eq(ql_hello(c, &h), 0);
  td_layer_free(&l);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* q8c with K past the int32 bound of int8 AQ: AUTO falls back to
 * weight-only, a forced ACT_QUANT is refused. */
START_TEST(test_aq_large_k) {
  td_layer l;
  td_layer_make(&l, 2, QL_AQ_Q8C_MAX_K + 2, 17, 1);
  ck_assert_int_eq(load(C, "deep", &l, FMT(QL_FORMAT_Q8C, 0), NULL), 0);
  size_t m = 16, k = (size_t)l.k;
  float *x = calloc(m * k, sizeof(float)), y[16 * 2];
  ck_assert_int_eq(ql_linear(C, "deep", QL_PATH_ACT_QUANT, QL_DTYPE_F32, m, k,
                             x, 2, y, NULL),
                   QL_ENOTSUP);
  free(x);
  check_linear(C, "deep", &l, FMT(QL_FORMAT_Q8C, 0), QL_PATH_WEIGHT_ONLY,
               QL_DTYPE_F32, 1, 3);
  ql_linear_result res;
  x = calloc(m * k, sizeof(float));
  ck_assert_int_eq(ql_linear(C, "deep", QL_PATH_AUTO, QL_DTYPE_F32, m, k, x,
                             2, y, &res),
                   0);
  ck_assert_int_eq(res.path, QL_PATH_WEIGHT_ONLY);
  free(x);
  td_layer_free(&l);
}
END_TEST

/* TorchAO's bf16/f16 weights on the CPU: loaded from floats or from
 * TorchAO's own tensors, one weight (the GPU daemon tests run the same). */
START_TEST(test_torchao_identity) {
  ck_assert_int_eq(td_torchao_identity(C, NULL), 6);
}
END_TEST

/* A weight uploaded in canonical packed form is the same weight as the
 * one the daemon quantized from floats: same digest, shared by name; a
 * mismatched array is refused with a message naming it. */
START_TEST(test_packed_import) {
  td_layer l;
  td_layer_make(&l, 24, 200, 61, 1);
  fmt F = {QL_FORMAT_Q4G, 64, 0};
  ck_assert_int_eq(load(C, "imp/a", &l, F, NULL), 0);
  ql_qweight *q = quantize(&l, F);
  uint64_t n = (uint64_t)q->n, g = (uint64_t)q->groups;
  ql_packed_desc d;
  memset(&d, 0, sizeof d);
  d.name = "imp/a";
  d.format = q->format;
  d.group_size = q->group_size;
  d.n = n;
  d.k = (uint64_t)q->k;
  d.qdata = (ql_packed_array){q->qdata, QL_ADT_U8, 2, {n, (d.k + 1) / 2}};
  d.scale = (ql_packed_array){q->scale, (int)q->scale_dtype, 2, {g, n}};
  d.zero = (ql_packed_array){q->zero, (int)q->scale_dtype, 2, {g, n}};
  d.bias = (ql_packed_array){q->bias, QL_ADT_F32, 1, {n, 0}};
  int shared = -1;
  ql_weight_info a, b;
  int rc = ql_load_packed(C, &d, &a, &shared);
  ck_assert_msg(rc == 0, "%s: %s", ql_strerror(rc), ql_errmsg());
  ck_assert_int_eq(shared, 1);
  d.name = "imp/b";
  ck_assert_int_eq(ql_load_packed(C, &d, &b, &shared), 0);
  ck_assert_int_eq(shared, 0);
  ck_assert(memcmp(a.digest, b.digest, sizeof a.digest) == 0);
  check_linear(C, "imp/b", &l, F, QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 3, 5);
  check_linear(C, "imp/b", &l, F, QL_PATH_ACT_QUANT, QL_DTYPE_BF16, 2, 6);

  /* One group too few in scale. */
  d.name = "imp/c";
  d.scale.shape[0] = g - 1;
  ck_assert_int_eq(ql_load_packed(C, &d, NULL, NULL), QL_ESHAPE);
  ck_assert_msg(strstr(ql_errmsg(), "scale") != NULL, "message: %s",
                ql_errmsg());
  d.scale.shape[0] = g;
  /* qdata of the right size in the wrong dtype. */
  d.qdata = (ql_packed_array){q->qdata, QL_ADT_F32, 2, {n, (d.k + 1) / 8}};
  ck_assert_int_ne(ql_load_packed(C, &d, NULL, NULL), 0);
  ck_assert_msg(strstr(ql_errmsg(), "qdata") != NULL, "message: %s",
                ql_errmsg());
  ql_weight_info info;
  ck_assert_int_eq(ql_lookup(C, "imp/c", &info), QL_ENOTFOUND);
  ql_qweight_free(q);
  td_layer_free(&l);
}
END_TEST

/* A long job for the drain tests: about a second of generic WO work. */
static int long_linear(const char *address) {
  ql_client *c = NULL;
  if (ql_connect(address, NULL, &c) != 0)
    return -1000;
  size_t m = 192, k = 4096, n = 2048;
  float *x = calloc(m * k, sizeof(float)), *y = calloc(m * n, sizeof(float));
  for (size_t i = 0; i < m * k; i++)
    x[i] = (float)(i % 11) - 5.0f;
  int rc = ql_linear(c, "long", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, m, k, x, n,
                     y, NULL);
  free(x);
  free(y);
  ql_close(c);
  return rc;
}

/* Loads "long" in a holder process (end it with end_holder()). */
static pid_t load_long(const td *d) {
  td_layer l;
  td_layer_make(&l, 2048, 4096, 5, 0);
  pid_t holder = fork_holder(d, "long", &l, FMT(QL_FORMAT_Q8C, 0));
  td_layer_free(&l);
  return holder;
}

/* Forks clients running long_linear; their exit codes carry -rc. */
static void fork_long(const td *d, pid_t *pids, int n) {
  for (int i = 0; i < n; i++) {
    pids[i] = fork();
    ck_assert_int_ge(pids[i], 0);
    if (pids[i] == 0)
      _exit(-long_linear(d->address));
  }
}

static int child_rc(pid_t pid) {
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert(WIFEXITED(st));
  return -WEXITSTATUS(st);
}

/* While draining, the daemon answers new requests QL_ESHUTDOWN at once and
 * still finishes the job it is running. */
START_TEST(test_drain_refuses_new) {
  td d;
  /* Jobs take a known time, whatever the kernels' speed. */
  setenv("QL_TEST_KERNEL_DELAY_MS", "1500", 1);
  td_start(&d, NULL);
  unsetenv("QL_TEST_KERNEL_DELAY_MS");
  pid_t holder = load_long(&d);
  pid_t pid;
  fork_long(&d, &pid, 1);
  usleep(300 * 1000);
  td_kill(&d, SIGTERM);
  usleep(50 * 1000);
  Qlinear__V1__Request req;
  Qlinear__V1__HelloRequest hello;
  raw_init(&req);
  qlinear__v1__hello_request__init(&hello);
  hello.protocol_version = QL_PROTOCOL_VERSION;
  req.body_case = QLINEAR__V1__REQUEST__BODY_HELLO;
  req.hello = &hello;
  ck_assert_int_eq(raw_code(&d, &req), QL_ESHUTDOWN);
  ck_assert_int_eq(child_rc(pid), 0);
  ck_assert_int_eq(td_wait(&d, 60000), 0);
  end_holder(holder);
}
END_TEST

/* Past --drain-ms, queued jobs not yet started are answered QL_ESHUTDOWN:
 * every client gets an answer, none waits for its timeout. */
START_TEST(test_drain_deadline) {
  td d;
  static const char *const args[] = {"--drain-ms", "0", NULL};
  setenv("QL_TEST_KERNEL_DELAY_MS", "1000", 1);
  td_start(&d, args);
  unsetenv("QL_TEST_KERNEL_DELAY_MS");
  pid_t holder = load_long(&d);
  enum { NPROC = 3 };
  pid_t pids[NPROC];
  fork_long(&d, pids, NPROC);
  usleep(300 * 1000);
  ck_assert_int_eq(td_stop(&d), 0);
  int refused = 0;
  for (int i = 0; i < NPROC; i++) {
    int rc = child_rc(pids[i]);
    ck_assert_msg(rc == 0 || rc == QL_ESHUTDOWN, "client %d got %s", i,
                  ql_err_name(rc));
    refused += rc == QL_ESHUTDOWN;
  }
  ck_assert_int_ge(refused, 1);
  end_holder(holder);
}
END_TEST

START_TEST(test_connect_without_daemon) {
  ql_client *c = (ql_client *)1;
  int rc = ql_connect("ipc:///tmp/ql-test-does-not-exist/qlineard.sock", NULL,
                      &c);
  ck_assert_int_eq(rc, QL_ECONNECT);
  ck_assert_ptr_null(c);
}
END_TEST

int main(void) {
  Suite *s = suite_create("daemon");
  /* Tests on the default daemon of the fixture. */
  TCase *tc = tcase_create("default");
  tcase_set_timeout(tc, 300);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_linear_matches_reference);
  tcase_add_test(tc, test_torchao_identity);
  tcase_add_test(tc, test_share_exists_unload);
  tcase_add_test(tc, test_bad_input);
  tcase_add_test(tc, test_concurrent_threads);
  tcase_add_test(tc, test_large_weight);
  tcase_add_test(tc, test_aq_large_k);
  tcase_add_test(tc, test_packed_import);
  suite_add_tcase(s, tc);
  /* Tests that start (and stop) daemons of their own. */
  TCase *own = tcase_create("own-daemon");
  tcase_set_timeout(own, 300);
  tcase_add_test(own, test_hello);
  tcase_add_test(own, test_out_of_order_replies);
  tcase_add_test(own, test_message_cap);
  tcase_add_test(own, test_concurrent_processes);
  tcase_add_test(own, test_shutdown_drains);
  tcase_add_test(own, test_queued_bytes_limit);
  tcase_add_test(own, test_reply_over_cap);
  tcase_add_test(own, test_drain_refuses_new);
  tcase_add_test(own, test_drain_deadline);
  tcase_add_test(own, test_connect_without_daemon);
  tcase_add_test(own, test_memory_returned);
  suite_add_tcase(s, own);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
