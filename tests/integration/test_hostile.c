/*
 * test_hostile.c - hostile values in every field of every request type
 * (DESIGN §7, docs/security.md): raw protobuf messages where
 * libqlinear would refuse to send them, the library otherwise. Each input
 * must get its documented QL_E* code with a message, while another client
 * process keeps being served correct results, and afterwards the resident
 * weights (their list, digests and results) and the stored files are
 * unchanged. The number of hostile inputs tried is printed.
 *
 * What test_daemon.c and test_sessions.c already check one case at a time
 * is here swept field by field with the extreme values: 0, negative
 * (enums and sint fields), huge, 2^63, SIZE_MAX, products that overflow,
 * unknown enum values, NaN and Inf in every dtype, slices that wrap, and
 * names with "..", "/", NUL, non-ASCII or 300 characters.
 */
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <dirent.h>

#include <check.h>

#include "bystander.h"
#include "harness.h"
#include "ql_kernels.h"
#include "qlinear/qlinear.h"
#include "testutil.h"

#define BIG63 ((uint64_t)1 << 63)
#define TMO 10000

/* Hostile inputs sent, over all tests of this program's process. */
static unsigned n_tried;

/* ------------------------------------------------------------- helpers */

static void raw_init(Qlinear__V1__Request *r) {
  static uint64_t id = 5000;
  qlinear__v1__request__init(r);
  r->request_id = ++id;
}

/* The reply's code, checked: the reply answers this request, and an error
 * has a message that names no path of the daemon's. */
static int check_reply(Qlinear__V1__Response *resp, uint64_t id,
                       const char *what) {
  ck_assert_msg(resp != NULL, "%s: no reply from the daemon", what);
  ck_assert_msg(resp->status != NULL, "%s: reply without a status", what);
  int code = resp->status->code;
  if (code != 0) {
    ck_assert_msg(resp->status->message && resp->status->message[0],
                  "%s: error reply without a message", what);
    ck_assert_msg(strstr(resp->status->message, "/tmp/") == NULL,
                  "%s: the message names a path: %s", what,
                  resp->status->message);
  }
  if (id != 0)
    ck_assert_uint_eq(resp->request_id, id);
  qlinear__v1__response__free_unpacked(resp, NULL);
  return code;
}

/* One hostile raw request as session s (NULL: no token), which must be
 * answered want. */
static void expect_as(const td *d, const td_session *s,
                      const Qlinear__V1__Request *req, int want,
                      const char *what) {
  int code = check_reply(td_call_as(d, s, req, TMO), req->request_id, what);
  ck_assert_msg(code == want, "%s: got %s, want %s", what, ql_err_name(code),
                ql_err_name(want));
  n_tried++;
}

static void expect(const td *d, const Qlinear__V1__Request *req, int want,
                   const char *what) {
  expect_as(d, &d->sess, req, want, what);
}

static void expect_admin(const td *d, const Qlinear__V1__Request *req,
                         int want, const char *what) {
  int code = check_reply(td_call_admin(d, req, TMO), req->request_id, what);
  ck_assert_msg(code == want, "%s: got %s, want %s", what, ql_err_name(code),
                ql_err_name(want));
  n_tried++;
}

/*
 * Packs req (with the harness session's token), replaces the first
 * occurrence of the bytes find with repl (same length; find is long enough
 * not to occur in the random token) and sends the
 * result: how a string with a NUL or a byte protobuf-c would not write
 * reaches the daemon.
 */
static void expect_patched(const td *d, const Qlinear__V1__Request *req,
                           const char *find, const void *repl, size_t n,
                           int want, const char *what) {
  Qlinear__V1__Request r = *req;
  r.session_token.data = (uint8_t *)d->sess.token;
  r.session_token.len = sizeof d->sess.token;
  size_t len = qlinear__v1__request__get_packed_size(&r);
  uint8_t *buf = tu_xmalloc(len);
  qlinear__v1__request__pack(&r, buf);
  uint8_t *at = memmem(buf, len, find, n);
  ck_assert_msg(at != NULL, "%s: the marker is not in the message", what);
  memcpy(at, repl, n);
  int code = check_reply(td_call_bytes(d, buf, len, TMO), req->request_id,
                         what);
  free(buf);
  ck_assert_msg(code == want, "%s: got %s, want %s", what, ql_err_name(code),
                ql_err_name(want));
  n_tried++;
}

/* Raw bytes that must be answered want (request id unknown: 0). */
static void expect_bytes(const td *d, const void *buf, size_t len, int want,
                         const char *what) {
  int code = check_reply(td_call_bytes(d, buf, len, TMO), 0, what);
  ck_assert_msg(code == want, "%s: got %s, want %s", what, ql_err_name(code),
                ql_err_name(want));
  n_tried++;
}

static int load(ql_client *c, const char *name, const td_layer *l,
                ql_format f, uint32_t gs, int persistent) {
  return td_load(c, name, l, f, gs, persistent, NULL, NULL);
}

/* The weights of these tests, and their references in this process. */
typedef struct hw {
  const char *name;
  ql_format f;
  uint32_t gs;
  uint64_t n, k;
  int persistent; /* loaded on the admin socket, stored */
  td_layer l;
  ql_qweight *q;
} hw;

static hw W[] = {
    {"h/q8", QL_FORMAT_Q8C, 0, 8, 40, 0, {0}, NULL},
    {"h/q4", QL_FORMAT_Q4G, 32, 16, 64, 0, {0}, NULL},
    {"h/q8b", QL_FORMAT_Q8B, 32, 4, 64, 0, {0}, NULL},
    {"h/f8", QL_FORMAT_F8R, 0, 6, 24, 0, {0}, NULL},
    {"h/stored", QL_FORMAT_Q4G, 64, 12, 128, 1, {0}, NULL},
};
#define NW (sizeof W / sizeof W[0])

static void weights_make(void) {
  for (size_t i = 0; i < NW; i++) {
    td_layer_make(&W[i].l, W[i].n, W[i].k, 70 + i, i % 2 == 0);
    ql_quant_params p = {W[i].f, W[i].gs, 0, (ql_dtype)0};
    ck_assert_int_eq(ql_qweight_quantize(&p, (int64_t)W[i].n,
                                         (int64_t)W[i].k, QL_DTYPE_F32,
                                         W[i].l.w, W[i].l.b, &W[i].q),
                     0);
  }
}

static void weights_free(void) {
  for (size_t i = 0; i < NW; i++) {
    td_layer_free(&W[i].l);
    ql_qweight_free(W[i].q);
    W[i].q = NULL;
  }
}

/* Runs m rows of x through weight i in the daemon, both paths where the
 * format has them, in dt, and compares with the reference byte for byte.
 * Returns 0 when equal, 1 when different, or the call's error code. */
static int verify(ql_client *c, size_t i, ql_dtype dt, uint64_t m,
                  uint64_t seed) {
  const hw *w = &W[i];
  size_t es = ql_dtype_size(dt);
  float *xf = tu_xmalloc(m * w->k * sizeof(float));
  uint8_t *x = tu_xmalloc(m * w->k * es), *y = tu_xmalloc(m * w->n * es),
          *ref = tu_xmalloc(m * w->n * es);
  int result = 0;
  td_randn(&seed, xf, m * w->k, 1.0f);
  ql_from_f32(dt, xf, x, m * w->k);
  for (int p = QL_PATH_WEIGHT_ONLY; p <= QL_PATH_ACT_QUANT && !result; p++) {
    if (p == QL_PATH_ACT_QUANT && w->f == QL_FORMAT_Q8B)
      break;
    int rc = ql_linear(c, w->name, (ql_path)p, dt, m, w->k, x, w->n, y, NULL);
    if (rc != 0) {
      result = rc;
      break;
    }
    ck_assert_int_eq(p == QL_PATH_WEIGHT_ONLY
                         ? ql_linear_wo_ref(w->q, dt, x, (int64_t)m, ref)
                         : ql_linear_aq_ref(w->q, dt, x, (int64_t)m, ref),
                     0);
    if (memcmp(y, ref, m * w->n * es) != 0)
      result = 1;
  }
  free(xf);
  free(x);
  free(y);
  free(ref);
  return result;
}

/* What a listing says about the weights: names, digests, shapes, in the
 * daemon's order. */
static char *listing(ql_client *c) {
  ql_weight_info *list = NULL;
  size_t n = 0;
  ck_assert_int_eq(ql_list(c, &list, &n), 0);
  size_t cap = 64 + n * (QL_NAME_MAX + 2 * QL_DIGEST_BYTES + 64), at = 0;
  char *s = tu_xmalloc(cap);
  s[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    at += (size_t)snprintf(s + at, cap - at, "%s %d %u %llu %llu %d %d ",
                           list[i].name, list[i].format, list[i].group_size,
                           (unsigned long long)list[i].n,
                           (unsigned long long)list[i].k, list[i].has_bias,
                           list[i].persistent);
    for (int b = 0; b < QL_DIGEST_BYTES; b++)
      at += (size_t)snprintf(s + at, cap - at, "%02x", list[i].digest[b]);
    at += (size_t)snprintf(s + at, cap - at, "\n");
  }
  ql_free(list);
  return s;
}

/* An FNV-1a hash of every file of dir: names, sizes and bytes. */
static uint64_t dir_hash(const char *dir) {
  uint64_t h = 1469598103934665603ull;
  struct dirent **ents = NULL;
  int n = scandir(dir, &ents, NULL, alphasort);
  ck_assert_int_ge(n, 0);
  for (int i = 0; i < n; i++) {
    char path[600];
    const char *nm = ents[i]->d_name;
    if (nm[0] != '.') {
      for (const char *p = nm; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
      snprintf(path, sizeof path, "%s/%s", dir, nm);
      FILE *f = fopen(path, "rb");
      ck_assert_ptr_nonnull(f);
      int ch;
      while ((ch = fgetc(f)) != EOF)
        h = (h ^ (uint8_t)ch) * 1099511628211ull;
      fclose(f);
    }
    free(ents[i]);
  }
  free(ents);
  return h;
}

/* --------------------------------------------------- request builders */

typedef struct rlin {
  Qlinear__V1__Request req;
  Qlinear__V1__LinearRequest lin;
  Qlinear__V1__Tensor x;
  Qlinear__V1__RegionSlice xs, ys;
  uint64_t shape[3];
  uint8_t data[4 * 64 * 4];
} rlin;

/* A valid inline Linear of m rows (m * k * 4 <= sizeof data) on weight i,
 * f32 zeros. */
static void rlin_init(rlin *r, size_t i, uint64_t m) {
  raw_init(&r->req);
  qlinear__v1__linear_request__init(&r->lin);
  qlinear__v1__tensor__init(&r->x);
  qlinear__v1__region_slice__init(&r->xs);
  qlinear__v1__region_slice__init(&r->ys);
  memset(r->data, 0, sizeof r->data);
  r->req.body_case = QLINEAR__V1__REQUEST__BODY_LINEAR;
  r->req.linear = &r->lin;
  r->lin.weight = (char *)W[i].name;
  r->lin.x = &r->x;
  r->x.dtype = QLINEAR__V1__DTYPE__DTYPE_F32;
  r->shape[0] = m;
  r->shape[1] = W[i].k;
  r->x.shape = r->shape;
  r->x.n_shape = 2;
  r->x.data_case = QLINEAR__V1__TENSOR__DATA_INLINE_DATA;
  r->x.inline_data.data = r->data;
  r->x.inline_data.len = m * W[i].k * 4;
  ck_assert_uint_le(r->x.inline_data.len, sizeof r->data);
}

typedef struct rbegin {
  Qlinear__V1__Request req;
  Qlinear__V1__LoadBeginRequest lb;
  Qlinear__V1__WeightSpec sp;
  Qlinear__V1__PackedSpec pk;
  Qlinear__V1__ArraySpec qd, sc, zr, bs;
  uint64_t qshape[3], sshape[3], zshape[3], bshape[3];
} rbegin;

/* A valid float LoadBegin of a q8c [4, 32] weight called name. */
static void rbegin_init(rbegin *b, const char *name) {
  memset(b, 0, sizeof *b);
  raw_init(&b->req);
  qlinear__v1__load_begin_request__init(&b->lb);
  qlinear__v1__weight_spec__init(&b->sp);
  b->req.body_case = QLINEAR__V1__REQUEST__BODY_LOAD_BEGIN;
  b->req.load_begin = &b->lb;
  b->lb.spec = &b->sp;
  b->sp.name = (char *)name;
  b->sp.format = QLINEAR__V1__FORMAT__FORMAT_Q8C;
  b->sp.n = 4;
  b->sp.k = 32;
  b->sp.dtype = QLINEAR__V1__DTYPE__DTYPE_F32;
}

/* The same as a packed q8c import: qdata [4,32] i8, scale [4] f32. */
static void rbegin_packed(rbegin *b, const char *name) {
  rbegin_init(b, name);
  qlinear__v1__packed_spec__init(&b->pk);
  qlinear__v1__array_spec__init(&b->qd);
  qlinear__v1__array_spec__init(&b->sc);
  qlinear__v1__array_spec__init(&b->zr);
  qlinear__v1__array_spec__init(&b->bs);
  b->lb.packed = &b->pk;
  b->pk.qdata = &b->qd;
  b->pk.scale = &b->sc;
  b->qd.dtype = QLINEAR__V1__ARRAY_DTYPE__ADT_I8;
  b->qshape[0] = 4;
  b->qshape[1] = 32;
  b->qd.shape = b->qshape;
  b->qd.n_shape = 2;
  b->sc.dtype = QLINEAR__V1__ARRAY_DTYPE__ADT_F32;
  b->sshape[0] = 4;
  b->sc.shape = b->sshape;
  b->sc.n_shape = 1;
}

/* LoadBegin that must succeed: returns the upload id and its total. */
static uint64_t begin_ok(const td *d, const td_session *s,
                         const Qlinear__V1__Request *req, uint64_t *total) {
  Qlinear__V1__Response *resp = s ? td_call_as(d, s, req, TMO)
                                  : td_call_admin(d, req, TMO);
  ck_assert_ptr_nonnull(resp);
  ck_assert_msg(resp->status->code == 0, "load_begin: %s",
                resp->status->message);
  ck_assert_int_eq(resp->body_case, QLINEAR__V1__RESPONSE__BODY_LOAD_BEGIN);
  uint64_t id = resp->load_begin->upload_id;
  if (total)
    *total = resp->load_begin->total_bytes;
  qlinear__v1__response__free_unpacked(resp, NULL);
  return id;
}

static void chunk_init(Qlinear__V1__Request *req,
                       Qlinear__V1__LoadChunkRequest *ch, uint64_t id,
                       uint64_t off, const void *data, size_t len) {
  raw_init(req);
  qlinear__v1__load_chunk_request__init(ch);
  req->body_case = QLINEAR__V1__REQUEST__BODY_LOAD_CHUNK;
  req->load_chunk = ch;
  ch->upload_id = id;
  ch->offset = off;
  ch->data.data = (uint8_t *)data;
  ch->data.len = len;
}

static void commit_init(Qlinear__V1__Request *req,
                        Qlinear__V1__LoadCommitRequest *cm, uint64_t id) {
  raw_init(req);
  qlinear__v1__load_commit_request__init(cm);
  req->body_case = QLINEAR__V1__REQUEST__BODY_LOAD_COMMIT;
  req->load_commit = cm;
  cm->upload_id = id;
}

static void abort_init(Qlinear__V1__Request *req,
                       Qlinear__V1__LoadAbortRequest *ab, uint64_t id) {
  raw_init(req);
  qlinear__v1__load_abort_request__init(ab);
  req->body_case = QLINEAR__V1__REQUEST__BODY_LOAD_ABORT;
  req->load_abort = ab;
  ab->upload_id = id;
}

static void unload_init(Qlinear__V1__Request *req,
                        Qlinear__V1__UnloadWeightRequest *u,
                        const char *name) {
  raw_init(req);
  qlinear__v1__unload_weight_request__init(u);
  req->body_case = QLINEAR__V1__REQUEST__BODY_UNLOAD;
  req->unload = u;
  u->name = (char *)name;
}

/* Hostile weight names, each with the code it gets. A NUL inside a name
 * is patched into the packed message (protobuf-c writes C strings). */
static const char *const bad_names[] = {
    "", "..", "a/../b", "../etc/passwd", "a/..", "/abs", "/", "a b",
    "a\\b", "a:b", "a\nb", "caf\xc3\xa9", "a*", "%s%s%n", "~root",
};
#define NBAD (sizeof bad_names / sizeof bad_names[0])

/* A name of len characters of 'x'. */
static char *long_name(size_t len) {
  char *s = tu_xmalloc(len + 1);
  memset(s, 'x', len);
  s[len] = '\0';
  return s;
}

/* ------------------------------------------------------------ fixture */

static char state_parent[64], state[128];
static td D;

static void start(void) {
  snprintf(state_parent, sizeof state_parent, "/tmp/ql-hostile-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(state_parent));
  snprintf(state, sizeof state, "%s/store", state_parent);
  const char *args[] = {"--state-dir", state, "--max-chunk-bytes", "16384",
                        NULL};
  td_start(&D, args);
}

static void stop(void) {
  ck_assert_int_eq(td_stop(&D), 0);
  DIR *dd = opendir(state);
  struct dirent *e;
  char path[600];
  while (dd && (e = readdir(dd)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    snprintf(path, sizeof path, "%s/%s", state, e->d_name);
    unlink(path);
  }
  if (dd)
    closedir(dd);
  rmdir(state);
  rmdir(state_parent);
}

/* ----------------------------------------------------- the sweeps */

static void sweep_tokens(const td *d) {
  /* Every body but Hello needs the token of an open session. */
  td_session closed;
  ck_assert_int_eq(td_session_open(d, &closed), 0);
  uint8_t closed_token[16];
  memcpy(closed_token, closed.token, 16);
  td_session_close(&closed);
  /* The daemon ends it when it sees the close; wait until it has. */
  Qlinear__V1__Request lst;
  Qlinear__V1__ListWeightsRequest lr;
  raw_init(&lst);
  qlinear__v1__list_weights_request__init(&lr);
  lst.body_case = QLINEAR__V1__REQUEST__BODY_LIST;
  lst.list = &lr;
  lst.session_token.data = closed_token;
  lst.session_token.len = 16;
  int code = 0;
  for (int64_t t0 = td_now_ms(); td_now_ms() - t0 < 5000; usleep(2000)) {
    code = check_reply(td_call_as(d, NULL, &lst, TMO), lst.request_id,
                       "closed token");
    if (code == QL_ESESSION)
      break;
  }
  ck_assert_int_eq(code, QL_ESESSION);

  uint8_t tok[17], zeros[16] = {0}, ones[16];
  memset(ones, 0xff, sizeof ones);
  memcpy(tok, d->sess.token, 16);
  tok[16] = 0;
  struct {
    const uint8_t *data;
    size_t len;
    const char *what;
  } toks[] = {
      {NULL, 0, "no token"},
      {tok, 1, "1-byte token"},
      {tok, 15, "15 bytes of the right token"},
      {tok, 17, "the right token and one byte more"},
      {zeros, 16, "zero token"},
      {ones, 16, "all-ones token"},
      {closed_token, 16, "the token of a closed session"},
  };
  rlin rl;
  rbegin rb;
  Qlinear__V1__Request un, st;
  Qlinear__V1__UnloadWeightRequest ur;
  Qlinear__V1__StatsRequest sr;
  rlin_init(&rl, 0, 1);
  rbegin_init(&rb, "tok/w");
  unload_init(&un, &ur, W[0].name);
  raw_init(&st);
  qlinear__v1__stats_request__init(&sr);
  st.body_case = QLINEAR__V1__REQUEST__BODY_STATS;
  st.stats = &sr;
  Qlinear__V1__Request *reqs[] = {&rl.req, &rb.req, &un, &st, &lst};
  for (size_t t = 0; t < sizeof toks / sizeof toks[0]; t++) {
    for (size_t r = 0; r < sizeof reqs / sizeof reqs[0]; r++) {
      char what[128];
      reqs[r]->session_token.data = (uint8_t *)toks[t].data;
      reqs[r]->session_token.len = toks[t].len;
      snprintf(what, sizeof what, "%s, body %d", toks[t].what,
               (int)reqs[r]->body_case);
      expect_as(d, NULL, reqs[r], QL_ESESSION, what);
      reqs[r]->session_token.len = 0;
    }
  }
  /* A flipped bit of the right token. */
  tok[7] ^= 0x10;
  rl.req.session_token.data = tok;
  rl.req.session_token.len = 16;
  expect_as(d, NULL, &rl.req, QL_ESESSION, "one bit of the token flipped");
}

static void sweep_hello(const td *d) {
  Qlinear__V1__Request req;
  Qlinear__V1__HelloRequest h;
  raw_init(&req);
  qlinear__v1__hello_request__init(&h);
  req.body_case = QLINEAR__V1__REQUEST__BODY_HELLO;
  req.hello = &h;
  static const uint32_t versions[] = {0, QL_PROTOCOL_VERSION + 1, UINT32_MAX};
  for (size_t i = 0; i < 3; i++) {
    h.protocol_version = versions[i];
    expect_as(d, NULL, &req, QL_EVERSION, "hello: wrong version");
  }
  /* The client name is for logs only: any length is harmless. */
  char *nm = long_name(100000);
  h.protocol_version = QL_PROTOCOL_VERSION;
  h.client_name = nm;
  expect_as(d, NULL, &req, 0, "hello: a 100000-character client name");
  free(nm);
}

static void sweep_load_begin(const td *d) {
  rbegin b;
  char what[160];
  /* Names. */
  for (size_t i = 0; i < NBAD; i++) {
    rbegin_init(&b, bad_names[i]);
    snprintf(what, sizeof what, "load_begin: name '%s'", bad_names[i]);
    expect(d, &b.req, QL_ENAME, what);
  }
  static const size_t lens[] = {256, 300, 4096};
  for (size_t i = 0; i < 3; i++) {
    char *nm = long_name(lens[i]);
    rbegin_init(&b, nm);
    snprintf(what, sizeof what, "load_begin: a %zu-character name", lens[i]);
    expect(d, &b.req, QL_ENAME, what);
    free(nm);
  }
  rbegin_init(&b, "nul/aXb");
  expect_patched(d, &b.req, "nul/aXb", "nul/a\0b", 7, QL_ENAME,
                 "load_begin: a NUL inside the name");
  rbegin_init(&b, "nul/aX");
  expect_patched(d, &b.req, "nul/aX", "nul/a\0", 6, QL_ENAME,
                 "load_begin: a NUL at the end of the name");
  rbegin_init(&b, "nul/X/../../etc");
  expect_patched(d, &b.req, "nul/X/..", "nul/\0/..", 8, QL_ENAME,
                 "load_begin: a NUL hiding '..'");

  /* No spec at all. */
  rbegin_init(&b, "s/w");
  b.lb.spec = NULL;
  expect(d, &b.req, QL_EINVAL, "load_begin: no spec");

  /* Formats: unspecified, unknown, negative, huge. */
  static const int formats[] = {0, 5, 77, -1, INT32_MIN, INT32_MAX};
  for (size_t i = 0; i < 6; i++) {
    rbegin_init(&b, "s/w");
    b.sp.format = (Qlinear__V1__Format)formats[i];
    snprintf(what, sizeof what, "load_begin: format %d", formats[i]);
    expect(d, &b.req, QL_EFORMAT, what);
  }
  /* Group sizes of q4g and block sizes of q8b. */
  static const uint32_t gss[] = {0, 1, 16, 48, 512, UINT32_MAX};
  for (int f = QL_FORMAT_Q4G; f <= QL_FORMAT_Q8B; f += 2)
    for (size_t i = 0; i < 6; i++) {
      rbegin_init(&b, "s/w");
      b.sp.format = (Qlinear__V1__Format)f;
      b.sp.group_size = gss[i];
      snprintf(what, sizeof what, "load_begin: format %d group %u", f,
               gss[i]);
      expect(d, &b.req, QL_EINVAL, what);
    }
  /* The asymmetric form is q8b's only. */
  for (int f = QL_FORMAT_Q4G; f <= QL_FORMAT_F8R; f++) {
    if (f == QL_FORMAT_Q8B)
      continue;
    rbegin_init(&b, "s/w");
    b.sp.format = (Qlinear__V1__Format)f;
    b.sp.group_size = 32;
    b.sp.asymmetric = 1;
    expect(d, &b.req, QL_EINVAL, "load_begin: asymmetric, not q8b");
  }
  /* Shapes: 0, over the limit, 2^63, UINT64_MAX, on each side. */
  static const uint64_t dims[] = {0, ((uint64_t)1 << 30) + 1, BIG63,
                                  UINT64_MAX, (uint64_t)SIZE_MAX - 3};
  for (size_t i = 0; i < 5; i++)
    for (int side = 0; side < 2; side++) {
      rbegin_init(&b, "s/w");
      if (side)
        b.sp.k = dims[i];
      else
        b.sp.n = dims[i];
      snprintf(what, sizeof what, "load_begin: %s = %llu", side ? "k" : "n",
               (unsigned long long)dims[i]);
      expect(d, &b.req, QL_ESHAPE, what);
    }
  /* Dimensions each in range whose product overflows nothing but is far
   * past any budget: refused before a byte is uploaded. */
  rbegin_init(&b, "s/w");
  b.sp.n = b.sp.k = (uint64_t)1 << 30;
  expect(d, &b.req, QL_EEXHAUSTED, "load_begin: [2^30, 2^30]");
  rbegin_init(&b, "s/w");
  b.sp.n = (uint64_t)1 << 30;
  b.sp.k = 1u << 20;
  b.sp.has_bias = 1;
  expect(d, &b.req, QL_EEXHAUSTED, "load_begin: [2^30, 2^20] with bias");
  /* Data and scale dtypes. */
  static const int dts[] = {0, 4, 7, -1, INT32_MAX};
  for (size_t i = 0; i < 5; i++) {
    rbegin_init(&b, "s/w");
    b.sp.dtype = (Qlinear__V1__DType)dts[i];
    snprintf(what, sizeof what, "load_begin: dtype %d", dts[i]);
    expect(d, &b.req, QL_EDTYPE, what);
    if (dts[i] == 0)
      continue; /* scale dtype 0: the format's default */
    rbegin_init(&b, "s/w");
    b.sp.scale_dtype = (Qlinear__V1__DType)dts[i];
    snprintf(what, sizeof what, "load_begin: scale dtype %d", dts[i]);
    expect(d, &b.req, QL_EDTYPE, what);
  }
  /* Policies. */
  static const int pol[] = {3, -1, INT32_MAX};
  for (size_t i = 0; i < 3; i++) {
    rbegin_init(&b, "s/w");
    b.sp.policy = (Qlinear__V1__Path)pol[i];
    expect(d, &b.req, QL_EINVAL, "load_begin: unknown policy");
  }
  /* Persistent loads belong to the admin socket. */
  rbegin_init(&b, "s/w");
  b.sp.persistent = 1;
  expect(d, &b.req, QL_EPERM, "load_begin: persistent on the request socket");

  /* Packed specs. */
  rbegin_packed(&b, "p/w");
  b.pk.qdata = NULL;
  expect(d, &b.req, QL_EINVAL, "packed: no qdata");
  rbegin_packed(&b, "p/w");
  b.pk.scale = NULL;
  expect(d, &b.req, QL_EINVAL, "packed: no scale");
  rbegin_packed(&b, "p/w");
  b.sp.has_bias = 1;
  expect(d, &b.req, QL_EINVAL, "packed: bias declared, not given");
  rbegin_packed(&b, "p/w");
  b.pk.bias = &b.bs;
  b.bs.dtype = QLINEAR__V1__ARRAY_DTYPE__ADT_F32;
  b.bshape[0] = 4;
  b.bs.shape = b.bshape;
  b.bs.n_shape = 1;
  expect(d, &b.req, QL_EINVAL, "packed: bias given, not declared");
  static const int zk[] = {2, -1, INT32_MAX};
  for (size_t i = 0; i < 3; i++) {
    rbegin_packed(&b, "p/w");
    b.pk.zero_kind = (Qlinear__V1__ZeroKind)zk[i];
    expect(d, &b.req, QL_EINVAL, "packed: unknown zero kind");
  }
  static const int adts[] = {0, 8, -1, INT32_MAX};
  for (size_t i = 0; i < 4; i++) {
    rbegin_packed(&b, "p/w");
    b.qd.dtype = (Qlinear__V1__ArrayDType)adts[i];
    expect(d, &b.req, QL_EDTYPE, "packed: qdata dtype unknown");
    rbegin_packed(&b, "p/w");
    b.sc.dtype = (Qlinear__V1__ArrayDType)adts[i];
    expect(d, &b.req, QL_EDTYPE, "packed: scale dtype unknown");
  }
  rbegin_packed(&b, "p/w");
  b.qd.n_shape = 0;
  expect(d, &b.req, QL_ESHAPE, "packed: qdata with no dims");
  rbegin_packed(&b, "p/w");
  b.qshape[2] = 1;
  b.qd.n_shape = 3;
  expect(d, &b.req, QL_ESHAPE, "packed: qdata with 3 dims");
  static const uint64_t adims[] = {0, ((uint64_t)1 << 30) + 1, BIG63,
                                   UINT64_MAX};
  for (size_t i = 0; i < 4; i++) {
    rbegin_packed(&b, "p/w");
    b.qshape[1] = adims[i];
    expect(d, &b.req, QL_ESHAPE, "packed: qdata dim");
    rbegin_packed(&b, "p/w");
    b.sshape[0] = adims[i];
    expect(d, &b.req, QL_ESHAPE, "packed: scale dim");
  }
}

/* An upload whose bytes all arrive, then commit: the code of the commit. */
static int upload_commit(const td *d, const Qlinear__V1__Request *begin,
                         const void *data, size_t len) {
  uint64_t total = 0;
  uint64_t id = begin_ok(d, &d->sess, begin, &total);
  ck_assert_uint_eq(total, len);
  Qlinear__V1__Request req;
  Qlinear__V1__LoadChunkRequest ch;
  Qlinear__V1__LoadCommitRequest cm;
  chunk_init(&req, &ch, id, 0, data, len);
  ck_assert_int_eq(check_reply(td_call(d, &req, TMO), req.request_id,
                               "chunk"), 0);
  commit_init(&req, &cm, id);
  int code = check_reply(td_call(d, &req, TMO), req.request_id, "commit");
  n_tried++;
  return code;
}

static void sweep_uploads(const td *d, td_session *other) {
  rbegin b;
  Qlinear__V1__Request req;
  Qlinear__V1__LoadChunkRequest ch;
  Qlinear__V1__LoadCommitRequest cm;
  Qlinear__V1__LoadAbortRequest ab;
  uint8_t buf[20000];
  memset(buf, 0, sizeof buf);

  rbegin_init(&b, "up/w");
  uint64_t total = 0, id = begin_ok(d, &d->sess, &b.req, &total);
  ck_assert_uint_eq(total, 4 * 32 * 4);
  static const uint64_t ids[] = {0, 1u << 20, BIG63, UINT64_MAX};
  for (size_t i = 0; i < 4; i++) {
    chunk_init(&req, &ch, ids[i], 0, buf, 16);
    expect(d, &req, QL_ENOTFOUND, "load_chunk: unknown upload");
    commit_init(&req, &cm, ids[i]);
    expect(d, &req, QL_ENOTFOUND, "load_commit: unknown upload");
    abort_init(&req, &ab, ids[i]);
    expect(d, &req, QL_ENOTFOUND, "load_abort: unknown upload");
  }
  /* Another session's upload is not found, for every upload request. */
  chunk_init(&req, &ch, id, 0, buf, 16);
  expect_as(d, other, &req, QL_ENOTFOUND, "load_chunk: foreign upload");
  commit_init(&req, &cm, id);
  expect_as(d, other, &req, QL_ENOTFOUND, "load_commit: foreign upload");
  abort_init(&req, &ab, id);
  expect_as(d, other, &req, QL_ENOTFOUND, "load_abort: foreign upload");
  /* And the admin socket's view: not its upload either. */
  chunk_init(&req, &ch, id, 0, buf, 16);
  expect_admin(d, &req, QL_ENOTFOUND, "load_chunk: a session's upload, admin");
  /* Offsets. */
  static const uint64_t offs[] = {1, 16, 512, BIG63, UINT64_MAX,
                                  UINT64_MAX - 15};
  for (size_t i = 0; i < 6; i++) {
    chunk_init(&req, &ch, id, offs[i], buf, 16);
    expect(d, &req, QL_ESEQUENCE, "load_chunk: offset out of order");
  }
  chunk_init(&req, &ch, id, 0, buf, 0);
  expect(d, &req, QL_EINVAL, "load_chunk: empty");
  chunk_init(&req, &ch, id, 0, buf, 16385);
  expect(d, &req, QL_ETOOBIG, "load_chunk: over max_chunk_bytes");
  chunk_init(&req, &ch, id, 0, buf, 513);
  expect(d, &req, QL_ESHAPE, "load_chunk: more than the total");
  chunk_init(&req, &ch, id, 0, buf, 500);
  ck_assert_int_eq(check_reply(td_call(d, &req, TMO), req.request_id, "c"),
                   0);
  chunk_init(&req, &ch, id, 500, buf, 13);
  expect(d, &req, QL_ESHAPE, "load_chunk: past the total");
  chunk_init(&req, &ch, id, 0, buf, 12);
  expect(d, &req, QL_ESEQUENCE, "load_chunk: the same offset again");
  commit_init(&req, &cm, id);
  expect(d, &req, QL_ESHAPE, "load_commit: incomplete");
  abort_init(&req, &ab, id);
  expect(d, &req, 0, "load_abort");
  expect(d, &req, QL_ENOTFOUND, "load_abort: twice");
  commit_init(&req, &cm, id);
  expect(d, &req, QL_ENOTFOUND, "load_commit: aborted upload");

  /* Complete uploads whose data the commit refuses: nothing is kept. */
  float f[4 * 32];
  for (int i = 0; i < 4 * 32; i++)
    f[i] = (float)(i % 7) - 3.0f;
  static const float bad[] = {NAN, INFINITY, -INFINITY};
  for (size_t i = 0; i < 3; i++) {
    float g[4 * 32];
    memcpy(g, f, sizeof g);
    g[37] = bad[i];
    rbegin_init(&b, "up/nonfinite");
    ck_assert_int_eq(upload_commit(d, &b.req, g, sizeof g), QL_ENONFINITE);
  }
  /* f16 NaN and bf16 Inf bit patterns. */
  uint16_t h[4 * 32];
  memset(h, 0, sizeof h);
  h[5] = 0x7e00;
  rbegin_init(&b, "up/nonfinite");
  b.sp.dtype = QLINEAR__V1__DTYPE__DTYPE_F16;
  ck_assert_int_eq(upload_commit(d, &b.req, h, sizeof h), QL_ENONFINITE);
  h[5] = 0x7f80;
  rbegin_init(&b, "up/nonfinite");
  b.sp.dtype = QLINEAR__V1__DTYPE__DTYPE_BF16;
  ck_assert_int_eq(upload_commit(d, &b.req, h, sizeof h), QL_ENONFINITE);
  /* Packed arrays that do not fit the spec: named, refused at commit. */
  uint8_t pk[4 * 64 * 4];
  memset(pk, 1, sizeof pk);
  rbegin_packed(&b, "up/packed");
  b.qshape[1] = 31; /* K is 32 */
  ck_assert_int_eq(upload_commit(d, &b.req, pk, 4 * 31 + 16), QL_ESHAPE);
  rbegin_packed(&b, "up/packed");
  b.sshape[0] = 5; /* N is 4 */
  ck_assert_int_eq(upload_commit(d, &b.req, pk, 4 * 32 + 20), QL_ESHAPE);
  rbegin_packed(&b, "up/packed");
  b.qd.dtype = QLINEAR__V1__ARRAY_DTYPE__ADT_F32; /* q8c qdata is i8 */
  ck_assert_int_eq(upload_commit(d, &b.req, pk, 4 * 32 * 4 + 16),
                   QL_EDTYPE);
  rbegin_packed(&b, "up/packed");
  b.sc.dtype = QLINEAR__V1__ARRAY_DTYPE__ADT_I32;
  ck_assert_int_eq(upload_commit(d, &b.req, pk, 4 * 32 + 16), QL_EDTYPE);
  /* A scale of NaN in an import. */
  float nan = NAN;
  memset(pk, 0, sizeof pk);
  memcpy(pk + 4 * 32 + 4, &nan, 4);
  rbegin_packed(&b, "up/packed");
  ck_assert_int_eq(upload_commit(d, &b.req, pk, 4 * 32 + 16), QL_ENONFINITE);

  /* Duplicate loads: the same name with other content, shape or format. */
  for (size_t i = 0; i < 2; i++) {
    const hw *w = &W[i];
    rbegin_init(&b, w->name);
    b.sp.format = (Qlinear__V1__Format)w->f;
    b.sp.group_size = w->gs;
    b.sp.n = w->n;
    b.sp.k = w->k;
    b.sp.has_bias = w->l.b != NULL;
    size_t len = (w->n * w->k + (w->l.b ? w->n : 0)) * sizeof(float);
    float *data = tu_xmalloc(len);
    memset(data, 0, len); /* other content */
    ck_assert_int_eq(upload_commit(d, &b.req, data, len), QL_EEXIST);
    b.sp.format = QLINEAR__V1__FORMAT__FORMAT_F8R; /* other format */
    ck_assert_int_eq(upload_commit(d, &b.req, data, len), QL_EEXIST);
    b.sp.format = (Qlinear__V1__Format)w->f;
    b.sp.n = 1; /* other shape */
    ck_assert_int_eq(upload_commit(d, &b.req, data,
                                   (w->k + (w->l.b ? 1 : 0)) * sizeof(float)),
                     QL_EEXIST);
    free(data);
  }
  /* A duplicate of the stored weight by a session: the same refusal. */
  rbegin_init(&b, "h/stored");
  ck_assert_int_eq(upload_commit(d, &b.req, f, sizeof f), QL_EEXIST);
}

static void sweep_unload(const td *d, td_session *other) {
  Qlinear__V1__Request req;
  Qlinear__V1__UnloadWeightRequest u;
  char what[160];
  for (size_t i = 0; i < NBAD; i++) {
    unload_init(&req, &u, bad_names[i]);
    snprintf(what, sizeof what, "unload: name '%s'", bad_names[i]);
    expect(d, &req, QL_ENAME, what);
    unload_init(&req, &u, bad_names[i]);
    expect_admin(d, &req, QL_ENAME, what);
  }
  char *nm = long_name(300);
  unload_init(&req, &u, nm);
  expect(d, &req, QL_ENAME, "unload: a 300-character name");
  free(nm);
  unload_init(&req, &u, "h/q8X");
  expect_patched(d, &req, "h/q8X", "h/q8\0", 5, QL_ENAME,
                 "unload: a NUL after a resident weight's name");
  unload_init(&req, &u, "no/such");
  expect(d, &req, QL_ENOTFOUND, "unload: not resident");
  unload_init(&req, &u, "no/such");
  expect_admin(d, &req, QL_ENOTFOUND, "admin unload: not resident");
  /* Weights this session does not hold: another's, the admin's. */
  for (size_t i = 0; i < NW; i++) {
    unload_init(&req, &u, W[i].name);
    expect_as(d, other, &req, QL_EPERM, "unload: not this session's");
  }
  unload_init(&req, &u, "by/w");
  expect(d, &req, QL_EPERM, "unload: the bystander's weight");
}

static void sweep_linear(const td *d, td_session *other) {
  rlin r;
  char what[200];
  /* Names. */
  for (size_t i = 0; i < NBAD; i++) {
    rlin_init(&r, 0, 1);
    r.lin.weight = (char *)bad_names[i];
    snprintf(what, sizeof what, "linear: weight '%s'", bad_names[i]);
    expect(d, &r.req, QL_ENAME, what);
  }
  char *nm = long_name(300);
  rlin_init(&r, 0, 1);
  r.lin.weight = nm;
  expect(d, &r.req, QL_ENAME, "linear: a 300-character weight name");
  free(nm);
  rlin_init(&r, 0, 1);
  r.lin.weight = "h/q8X";
  expect_patched(d, &r.req, "h/q8X", "h/q8\0", 5, QL_ENAME,
                 "linear: a NUL after a resident weight's name");
  rlin_init(&r, 0, 1);
  r.lin.weight = "no/such";
  expect(d, &r.req, QL_ENOTFOUND, "linear: unknown weight");
  /* Paths. */
  static const int paths[] = {3, -1, INT32_MAX, INT32_MIN};
  for (size_t i = 0; i < 4; i++) {
    rlin_init(&r, 0, 1);
    r.lin.path = (Qlinear__V1__Path)paths[i];
    expect(d, &r.req, QL_EINVAL, "linear: unknown path");
  }
  rlin_init(&r, 2, 1);
  r.lin.path = QLINEAR__V1__PATH__PATH_ACT_QUANT;
  expect(d, &r.req, QL_ENOTSUP, "linear: forced AQ on q8b");
  /* Devices. */
  static const char *const devs[] = {"gpu", "cuda:0", "cpu:1", "CPU",
                                     "ze:00000000"};
  for (size_t i = 0; i < 5; i++) {
    rlin_init(&r, 0, 1);
    r.lin.device = (char *)devs[i];
    expect(d, &r.req, QL_ENOTFOUND, "linear: unknown device");
  }
  nm = long_name(5000);
  rlin_init(&r, 0, 1);
  r.lin.device = nm;
  expect(d, &r.req, QL_ENOTFOUND, "linear: a 5000-character device");
  free(nm);
  /* x. */
  rlin_init(&r, 0, 1);
  r.lin.x = NULL;
  expect(d, &r.req, QL_EINVAL, "linear: no x");
  rlin_init(&r, 0, 1);
  r.x.data_case = QLINEAR__V1__TENSOR__DATA__NOT_SET;
  expect(d, &r.req, QL_EINVAL, "linear: x without data");
  static const int dts[] = {0, 4, -1, INT32_MAX};
  for (size_t i = 0; i < 4; i++) {
    rlin_init(&r, 0, 1);
    r.x.dtype = (Qlinear__V1__DType)dts[i];
    expect(d, &r.req, QL_EDTYPE, "linear: x dtype");
  }
  for (size_t nd = 0; nd <= 3; nd++) {
    if (nd == 2)
      continue;
    rlin_init(&r, 0, 1);
    r.shape[2] = 1;
    r.x.n_shape = nd;
    expect(d, &r.req, QL_ESHAPE, "linear: x is not 2-D");
  }
  static const uint64_t dims[] = {0, ((uint64_t)1 << 30) + 1, BIG63,
                                  UINT64_MAX, (uint64_t)SIZE_MAX / 4 + 1};
  for (size_t i = 0; i < 5; i++)
    for (int side = 0; side < 2; side++) {
      rlin_init(&r, 0, 1);
      r.shape[side] = dims[i];
      snprintf(what, sizeof what, "linear: x dim %d = %llu", side,
               (unsigned long long)dims[i]);
      expect(d, &r.req, QL_ESHAPE, what);
    }
  /* In range, the product far past what was sent. */
  rlin_init(&r, 0, 1);
  r.shape[0] = r.shape[1] = (uint64_t)1 << 30;
  expect(d, &r.req, QL_ESHAPE, "linear: x [2^30, 2^30] inline");
  /* Lengths that disagree with dtype and shape. */
  rlin_init(&r, 0, 2);
  r.x.inline_data.len -= 1;
  expect(d, &r.req, QL_ESHAPE, "linear: x one byte short");
  rlin_init(&r, 0, 2);
  r.x.inline_data.len += 4;
  expect(d, &r.req, QL_ESHAPE, "linear: x one element long");
  rlin_init(&r, 0, 2);
  r.x.dtype = QLINEAR__V1__DTYPE__DTYPE_BF16;
  expect(d, &r.req, QL_ESHAPE, "linear: bf16 declared, f32 bytes");
  rlin_init(&r, 0, 1);
  r.shape[1] = 20;
  r.x.inline_data.len = 80;
  expect(d, &r.req, QL_ESHAPE, "linear: K of another weight");
  /* Non-finite activations in every dtype, on both paths. */
  for (int p = QL_PATH_WEIGHT_ONLY; p <= QL_PATH_ACT_QUANT; p++) {
    static const float fbad[] = {NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < 3; i++) {
      rlin_init(&r, 0, 2);
      float v = fbad[i];
      memcpy(r.data + 4 * 45, &v, 4);
      r.lin.path = (Qlinear__V1__Path)p;
      expect(d, &r.req, QL_ENONFINITE, "linear: f32 NaN/Inf");
    }
    static const uint16_t h16[] = {0x7c00, 0xfc00, 0x7e00, 0x7c01};
    static const uint16_t b16[] = {0x7f80, 0xff80, 0x7fc0, 0xffc1};
    for (int bf = 0; bf < 2; bf++)
      for (size_t i = 0; i < 4; i++) {
        rlin_init(&r, 0, 2);
        uint16_t v = bf ? b16[i] : h16[i];
        r.x.dtype = bf ? QLINEAR__V1__DTYPE__DTYPE_BF16
                       : QLINEAR__V1__DTYPE__DTYPE_F16;
        r.x.inline_data.len = 2 * 40 * 2;
        memcpy(r.data + 2 * 79, &v, 2);
        r.lin.path = (Qlinear__V1__Path)p;
        expect(d, &r.req, QL_ENONFINITE, "linear: f16/bf16 NaN/Inf");
      }
  }
  /* Deadlines: any value is a deadline, none crashes or wraps into the
   * past; a huge one is no deadline at all. */
  static const uint64_t dl[] = {1u << 30, BIG63 / 1000, BIG63, UINT64_MAX};
  for (size_t i = 0; i < 4; i++) {
    rlin_init(&r, 0, 1);
    r.req.deadline_us = dl[i];
    snprintf(what, sizeof what, "linear: deadline %llu us",
             (unsigned long long)dl[i]);
    expect(d, &r.req, 0, what);
  }

  /* Region slices. The harness session makes the regions; the other
   * session has its own. */
  uint64_t rid, orid, did;
  int fd, ofd, dfd;
  const uint64_t size = 4096;
  ck_assert_int_eq(td_region_create((td_session *)&d->sess, size, &rid, &fd),
                   0);
  ck_assert_int_eq(td_region_create(other, size, &orid, &ofd), 0);
  ck_assert_int_eq(td_region_create((td_session *)&d->sess, size, &did, &dfd),
                   0);
  ck_assert_int_eq(td_region_destroy((td_session *)&d->sess, did), 0);
  /* x [2, 40] f32 = 320 bytes, y [2, 8] = 64 bytes. */
  struct {
    uint64_t id, off, len;
    int code;
    const char *what;
  } xs[] = {
      {0, 0, 320, QL_ENOTFOUND, "region id 0"},
      {UINT64_MAX, 0, 320, QL_ENOTFOUND, "region id 2^64-1"},
      {0, 0, 320, QL_ENOTFOUND, "another session's region"},
      {0, 0, 320, QL_ENOTFOUND, "a destroyed region"},
      {0, 2, 320, QL_EINVAL, "misaligned offset"},
      {0, size, 320, QL_EINVAL, "offset at the end"},
      {0, size - 316, 320, QL_EINVAL, "crossing the end"},
      {0, UINT64_MAX - 3, 320, QL_EINVAL, "offset that wraps"},
      {0, BIG63, 320, QL_EINVAL, "offset 2^63"},
      {0, UINT64_MAX - 319, 320, QL_EINVAL, "off + len == 2^64"},
      {0, 0, 316, QL_ESHAPE, "length short"},
      {0, 0, UINT64_MAX, QL_ESHAPE, "length 2^64-1"},
      {0, 0, size, QL_ESHAPE, "the whole region"},
  };
  for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
    rlin_init(&r, 0, 2);
    r.x.data_case = QLINEAR__V1__TENSOR__DATA_REGION;
    r.x.region = &r.xs;
    r.xs.region_id = xs[i].id ? xs[i].id : i == 2 ? orid : i == 3 ? did : rid;
    if (i == 0)
      r.xs.region_id = 0;
    r.xs.offset = xs[i].off;
    r.xs.length = xs[i].len;
    snprintf(what, sizeof what, "linear: x slice: %s", xs[i].what);
    expect(d, &r.req, xs[i].code, what);
  }
  struct {
    uint64_t id, off, len;
    int code;
    const char *what;
  } ys[] = {
      {0, 0, 64, QL_EINVAL, "overlapping x"},
      {0, 316, 64, QL_EINVAL, "overlapping x's end"},
      {0, 320, 60, QL_ESHAPE, "short"},
      {0, 320, 68, QL_ESHAPE, "long"},
      {0, 322, 64, QL_EINVAL, "misaligned"},
      {0, UINT64_MAX - 63, 64, QL_EINVAL, "wrapping"},
      {0, size - 60, 64, QL_EINVAL, "crossing the end"},
      {UINT64_MAX, 320, 64, QL_ENOTFOUND, "unknown region"},
      {1, 320, 64, QL_ENOTFOUND, "another session's region"},
      {2, 320, 64, QL_ENOTFOUND, "a destroyed region"},
  };
  for (size_t i = 0; i < sizeof ys / sizeof ys[0]; i++) {
    rlin_init(&r, 0, 2);
    r.x.data_case = QLINEAR__V1__TENSOR__DATA_REGION;
    r.x.region = &r.xs;
    r.xs.region_id = rid;
    r.xs.length = 320;
    r.lin.y_out = &r.ys;
    r.ys.region_id = ys[i].id == 1   ? orid
                     : ys[i].id == 2 ? did
                     : ys[i].id      ? ys[i].id
                                     : rid;
    r.ys.offset = ys[i].off;
    r.ys.length = ys[i].len;
    snprintf(what, sizeof what, "linear: y_out slice: %s", ys[i].what);
    expect(d, &r.req, ys[i].code, what);
  }
  /* The same request with good slices works: the region was fine. */
  rlin_init(&r, 0, 2);
  r.x.data_case = QLINEAR__V1__TENSOR__DATA_REGION;
  r.x.region = &r.xs;
  r.xs.region_id = rid;
  r.xs.length = 320;
  r.lin.y_out = &r.ys;
  r.ys.region_id = rid;
  r.ys.offset = 320;
  r.ys.length = 64;
  ck_assert_int_eq(check_reply(td_call(d, &r.req, TMO), r.req.request_id,
                               "good slices"), 0);
  /* The other session cannot name the harness's regions either. */
  r.ys.region_id = orid;
  expect_as(d, other, &r.req, QL_ENOTFOUND, "linear: x in a foreign region");
  close(fd);
  close(ofd);
  close(dfd);
  ck_assert_int_eq(td_region_destroy((td_session *)&d->sess, rid), 0);
  ck_assert_int_eq(td_region_destroy(other, orid), 0);

  /* Linear is not the admin socket's. */
  rlin_init(&r, 0, 1);
  expect_admin(d, &r.req, QL_EPERM, "linear on the admin socket");
}

static void sweep_multi(const td *d) {
  Qlinear__V1__Request req;
  Qlinear__V1__LinearMultiRequest lm;
  Qlinear__V1__Tensor x;
  Qlinear__V1__RegionSlice ys[17], *yp[17];
  char *names[17];
  uint64_t shape[2] = {1, 40};
  uint8_t data[40 * 4];
  memset(data, 0, sizeof data);
  for (int i = 0; i < 17; i++) {
    names[i] = (char *)W[0].name;
    qlinear__v1__region_slice__init(&ys[i]);
    yp[i] = &ys[i];
  }
#define MULTI_INIT(nw)                                                         \
  do {                                                                         \
    raw_init(&req);                                                            \
    qlinear__v1__linear_multi_request__init(&lm);                              \
    qlinear__v1__tensor__init(&x);                                             \
    req.body_case = QLINEAR__V1__REQUEST__BODY_LINEAR_MULTI;                   \
    req.linear_multi = &lm;                                                    \
    lm.weights = names;                                                        \
    lm.n_weights = (nw);                                                       \
    lm.x = &x;                                                                 \
    x.dtype = QLINEAR__V1__DTYPE__DTYPE_F32;                                   \
    x.shape = shape;                                                           \
    x.n_shape = 2;                                                             \
    x.data_case = QLINEAR__V1__TENSOR__DATA_INLINE_DATA;                       \
    x.inline_data.data = data;                                                 \
    x.inline_data.len = sizeof data;                                           \
  } while (0)
  MULTI_INIT(0);
  expect(d, &req, QL_EINVAL, "linear_multi: no weights");
  MULTI_INIT(17);
  expect(d, &req, QL_EINVAL, "linear_multi: 17 weights");
  MULTI_INIT(16);
  expect(d, &req, 0, "linear_multi: the same weight 16 times");
  for (size_t i = 0; i < NBAD; i++) {
    MULTI_INIT(3);
    names[1] = (char *)bad_names[i];
    expect(d, &req, QL_ENAME, "linear_multi: a bad name");
    names[1] = (char *)W[0].name;
  }
  MULTI_INIT(3);
  names[2] = "no/such";
  expect(d, &req, QL_ENOTFOUND, "linear_multi: an unknown weight");
  names[2] = (char *)W[1].name; /* K 64, x has 40 */
  expect(d, &req, QL_ESHAPE, "linear_multi: a weight of another K");
  names[2] = (char *)W[0].name;
  MULTI_INIT(3);
  lm.path = (Qlinear__V1__Path)7;
  expect(d, &req, QL_EINVAL, "linear_multi: unknown path");
  MULTI_INIT(3);
  lm.y_out = yp;
  lm.n_y_out = 2;
  expect(d, &req, QL_EINVAL, "linear_multi: 2 y_out for 3 weights");
  MULTI_INIT(3);
  lm.y_out = yp;
  lm.n_y_out = 3;
  ys[1].offset = 2;
  expect(d, &req, QL_EINVAL, "linear_multi: misaligned y_out");
  ys[1].offset = 0;
  ys[0].region_id = ys[1].region_id = ys[2].region_id = 999999;
  ys[0].length = ys[1].length = ys[2].length = 32;
  expect(d, &req, QL_ENOTFOUND, "linear_multi: y_out in no region");
  MULTI_INIT(3);
  shape[0] = BIG63;
  expect(d, &req, QL_ESHAPE, "linear_multi: M = 2^63");
  shape[0] = 1;
  MULTI_INIT(3);
  float nan = NAN;
  memcpy(data + 8, &nan, 4);
  expect(d, &req, QL_ENONFINITE, "linear_multi: NaN in x");
  memset(data, 0, sizeof data);
  MULTI_INIT(2);
  expect_admin(d, &req, QL_EPERM, "linear_multi on the admin socket");
#undef MULTI_INIT
}

static void sweep_misc(const td *d) {
  /* Reload belongs to the admin socket. */
  Qlinear__V1__Request req;
  Qlinear__V1__ReloadConfigRequest rc;
  raw_init(&req);
  qlinear__v1__reload_config_request__init(&rc);
  req.body_case = QLINEAR__V1__REQUEST__BODY_RELOAD;
  req.reload = &rc;
  expect(d, &req, QL_EPERM, "reload on the request socket");
  /* No body; an unknown body field (number 99); garbage; empty. */
  raw_init(&req);
  expect(d, &req, QL_EPROTO, "no body");
  {
    /* A request with the token and only an unknown field 99 (of a later
     * protocol version, say) as its body. */
    uint8_t buf[64];
    raw_init(&req);
    req.session_token.data = (uint8_t *)d->sess.token;
    req.session_token.len = sizeof d->sess.token;
    size_t len = qlinear__v1__request__get_packed_size(&req);
    ck_assert_uint_le(len + 3, sizeof buf);
    qlinear__v1__request__pack(&req, buf);
    memcpy(buf + len, "\x9a\x06\x00", 3);
    expect_bytes(d, buf, len + 3, QL_EPROTO, "an unknown body field");
  }
  static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                    0xff, 0xff, 0xff, 0xff, 0x01};
  expect_bytes(d, garbage, sizeof garbage, QL_EPROTO, "an overlong varint");
  /* A length-delimited field claiming 2^62 bytes. */
  static const uint8_t huge_len[] = {0x12, 0x80, 0x80, 0x80, 0x80, 0x80,
                                     0x80, 0x80, 0x80, 0x40};
  expect_bytes(d, huge_len, sizeof huge_len, QL_EPROTO,
               "a field longer than the message");
  /* A Linear whose x carries a shape of a million dims: decoding it needs
   * more than the per-request budget allows, or it is refused as not 2-D. */
  size_t nd = 1u << 20;
  uint64_t *shape = tu_xmalloc(nd * sizeof *shape);
  for (size_t i = 0; i < nd; i++)
    shape[i] = 1;
  rlin r;
  rlin_init(&r, 0, 1);
  r.x.shape = shape;
  r.x.n_shape = nd;
  Qlinear__V1__Response *resp = td_call(d, &r.req, TMO);
  int code = check_reply(resp, 0, "a million dims");
  ck_assert_msg(code == QL_EPROTO || code == QL_ESHAPE, "got %s",
                ql_err_name(code));
  n_tried++;
  free(shape);
}

/* --------------------------------------------------------------- tests */

START_TEST(every_field_hostile) {
  n_tried = 0;
  start();
  td_bystander by;
  td_bystander_start(&D, &by);
  weights_make();
  uint64_t before_hash;
  char *before;
  {
    ql_client *c = td_connect_messages(&D), *a = td_connect_admin(&D);
    for (size_t i = 0; i < NW; i++) {
      int rc = load(W[i].persistent ? a : c, W[i].name, &W[i].l, W[i].f,
                    W[i].gs, W[i].persistent);
      ck_assert_msg(rc == 0, "load %s: %s", W[i].name, ql_errmsg());
    }
    ql_close(a);
    before = listing(c);
    before_hash = dir_hash(state);
    for (size_t i = 0; i < NW; i++)
      ck_assert_int_eq(verify(c, i, QL_DTYPE_F32, 3, 1), 0);
    /* c keeps its holds: the weights stay while the sweeps run. */
    td_session other;
    ck_assert_int_eq(td_session_open(&D, &other), 0);

    sweep_tokens(&D);
    sweep_hello(&D);
    sweep_load_begin(&D);
    sweep_uploads(&D, &other);
    sweep_unload(&D, &other);
    sweep_linear(&D, &other);
    sweep_multi(&D);
    sweep_misc(&D);

    td_session_close(&other);
    /* Nothing changed: the listing (names, shapes, digests), the stored
     * files, and every weight's results in every dtype. */
    char *after = listing(c);
    ck_assert_str_eq(after, before);
    free(after);
    ck_assert_uint_eq(dir_hash(state), before_hash);
    for (size_t i = 0; i < NW; i++)
      for (int dt = QL_DTYPE_F32; dt <= QL_DTYPE_BF16; dt++)
        ck_assert_int_eq(verify(c, i, (ql_dtype)dt, 2, 10 + i), 0);
    ql_stats_info *st = NULL;
    ck_assert_int_eq(ql_stats(c, &st), 0);
    ck_assert_uint_eq(st->uploads_in_progress, 0);
    ck_assert_uint_eq(st->regions, 0);
    ck_assert_uint_ge(st->errors, n_tried - 10);
    ql_stats_free(st);
    ql_close(c);
  }
  td_bystander_end(&by);
  free(before);
  weights_free();
  printf("hostile inputs tried: %u\n", n_tried);
  fflush(stdout);
  stop();
}
END_TEST

/* ---------------------------------------- unload with requests queued */

typedef struct qcall {
  pthread_t t;
  ql_client *c;
  size_t w;
  uint64_t seed;
  int rc;
  int same; /* the result equals the reference */
} qcall;

/* One weight-only call of 2 rows, compared with the reference. */
static void *qcall_run(void *p) {
  qcall *q = p;
  const hw *w = &W[q->w];
  float x[2 * 64], y[2 * 16], ref[2 * 16];
  uint64_t seed = q->seed;
  td_randn(&seed, x, 2 * w->k, 1.0f);
  q->rc = ql_linear(q->c, w->name, QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 2,
                    w->k, x, w->n, y, NULL);
  q->same = q->rc == 0 &&
            ql_linear_wo_ref(w->q, QL_DTYPE_F32, x, 2, ref) == 0 &&
            memcmp(y, ref, 2 * w->n * sizeof(float)) == 0;
  return NULL;
}

/*
 * Unloading a weight while requests on it are running and queued (the
 * session's own hold, and the admin's unload of a held weight): they all
 * complete with the right result, later requests find nothing, and the
 * name is free again.
 */
START_TEST(unload_while_queued) {
  setenv("QL_TEST_KERNEL_DELAY_MS", "300", 1);
  td d;
  td_start(&d, NULL);
  unsetenv("QL_TEST_KERNEL_DELAY_MS");
  weights_make();
  ql_client *c = td_connect(&d), *a = td_connect_admin(&d);
  for (int round = 0; round < 2; round++) {
    ck_assert_int_eq(load(c, W[0].name, &W[0].l, W[0].f, W[0].gs, 0), 0);
    qcall q[4];
    for (int i = 0; i < 4; i++) {
      q[i].c = c;
      q[i].w = 0;
      q[i].seed = 100 + (uint64_t)i;
      ck_assert_int_eq(pthread_create(&q[i].t, NULL, qcall_run, &q[i]), 0);
    }
    /* The first launch runs (300 ms per launch), the others wait. */
    usleep(150 * 1000);
    int rc = round == 0 ? ql_unload(c, W[0].name) : ql_unload(a, W[0].name);
    n_tried++;
    ck_assert_int_eq(rc, 0);
    for (int i = 0; i < 4; i++) {
      pthread_join(q[i].t, NULL);
      ck_assert_msg(q[i].same, "queued request %d: %s", i,
                    q[i].rc == 0 ? "wrong result" : ql_strerror(q[i].rc));
    }
    float x[40] = {0}, y[8];
    ck_assert_int_eq(ql_linear(c, W[0].name, QL_PATH_AUTO, QL_DTYPE_F32, 1,
                               40, x, 8, y, NULL),
                     QL_ENOTFOUND);
    n_tried++;
    if (round == 1) /* the session's hold outlived the admin's unload */
      ck_assert_int_eq(ql_unload(c, W[0].name), 0);
    ql_weight_info wi;
    ck_assert_int_eq(ql_lookup(c, W[0].name, &wi), QL_ENOTFOUND);
  }
  ql_close(a);
  ql_close(c);
  weights_free();
  printf("hostile inputs tried (with unloads): %u\n", n_tried);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("hostile");
  TCase *tc = tcase_create("hostile");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, every_field_hostile);
  tcase_add_test(tc, unload_while_queued);
  suite_add_tcase(s, tc);
  return tu_run_suite(s, CK_NORMAL);
}
