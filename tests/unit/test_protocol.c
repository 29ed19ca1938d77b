/*
 * test_protocol.c - unit tests for daemon/wire/protocol.c: the request decoder
 * with its allocation budget, stateless validation, weight names, the
 * overflow-checked size product, region slice bounds and the session
 * socket's message decoder.
 *
 * Every validation case goes over the wire the way the daemon sees it: the
 * message is packed with the generated protobuf-c code, decoded with
 * ql__request_decode() and validated; the in-memory message must get the
 * same answer. Most decoded requests are released through release(), which
 * also checks that the budget allocator got back every byte it handed out,
 * so a leak shows up even without ASan; the validation cases free them with
 * ql__request_free() as the daemon does.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire/protocol.h"
#include "testutil.h"

/* The budget the daemon gives a message (handlers.c). */
#define SLACK ((size_t)1 << 20)

/* ------------------------------------------------------------- helpers */

/* Packs m into a new buffer; the caller frees it. */
static uint8_t *pack_req(const Qlinear__V1__Request *m, size_t *len) {
  size_t n = qlinear__v1__request__get_packed_size(m);
  uint8_t *buf = tu_xmalloc(n ? n : 1);
  ck_assert_uint_eq(qlinear__v1__request__pack(m, buf), n);
  *len = n;
  return buf;
}

/* The same for a Response. */
static uint8_t *pack_resp(const Qlinear__V1__Response *m, size_t *len) {
  size_t n = qlinear__v1__response__get_packed_size(m);
  uint8_t *buf = tu_xmalloc(n ? n : 1);
  ck_assert_uint_eq(qlinear__v1__response__pack(m, buf), n);
  *len = n;
  return buf;
}

/* Decodes buf with the daemon's budget; the decode must succeed. */
static ql__request *decode_ok(const uint8_t *buf, size_t len) {
  ql__request *r = NULL;
  char err[256] = "";
  int rc = ql__request_decode(buf, len, len + SLACK, &r, err, sizeof err);
  ck_assert_msg(rc == 0, "decode: %s (%s)", ql_err_name(rc), err);
  ck_assert_ptr_nonnull(r);
  ck_assert_ptr_nonnull(r->msg);
  ck_assert_uint_le(r->used, r->limit);
  return r;
}

/* Frees a decoded request, checking that freeing the message returns every
 * byte to the budget. */
static void release(ql__request *r) {
  qlinear__v1__request__free_unpacked(r->msg, &r->alloc);
  r->msg = NULL;
  ck_assert_uint_eq(r->used, 0);
  ql__request_free(r);
}

/* Decodes buf, which must not be a Request: QL_EPROTO, nothing handed back
 * and a reason given. */
static void expect_decode_fails(const uint8_t *buf, size_t len,
                                size_t budget) {
  ql__request *r = (ql__request *)&r; /* any non-NULL value */
  char err[256] = "";
  int rc = ql__request_decode(buf, len, budget, &r, err, sizeof err);
  ck_assert_msg(rc == QL_EPROTO, "len %zu budget %zu: got %s", len, budget,
                ql_err_name(rc));
  ck_assert_ptr_null(r);
  ck_assert_str_ne(err, "");
}

/* Validates m as the daemon would: packed, decoded, validated. The
 * in-memory message must give the same answer and a failure must say why. */
static int wire_validate(const Qlinear__V1__Request *m) {
  size_t len;
  uint8_t *buf = pack_req(m, &len);
  ql__request *r = decode_ok(buf, len);
  char err[256] = "", err2[256] = "";
  int rc = ql__request_validate(r->msg, err, sizeof err);
  int rc2 = ql__request_validate(m, err2, sizeof err2);
  ck_assert_msg(rc == rc2, "wire %s, in memory %s", ql_err_name(rc),
                ql_err_name(rc2));
  if (rc != 0) {
    ck_assert_str_ne(err, "");
    ck_assert_str_eq(err, err2);
  }
  ql__request_free(r); /* the daemon's way; ASan watches this one */
  free(buf);
  return rc;
}

#define expect_rc(m, want)                                                     \
  do {                                                                         \
    int rc_ = wire_validate(m);                                                \
    ck_assert_msg(rc_ == (want), "got %s, want %s", ql_err_name(rc_),         \
                  ql_err_name(want));                                          \
  } while (0)

/* ---------------------------------------------------- message builders */

#define WNAME "model/layer0.q_proj"
#define XBUF_BYTES (16 * 64 * 4)

/* One of every message, rebuilt by the mk_* functions for each case. */
static struct {
  Qlinear__V1__Request req;
  Qlinear__V1__HelloRequest hello;
  Qlinear__V1__WeightSpec spec;
  Qlinear__V1__LoadBeginRequest begin;
  Qlinear__V1__LoadChunkRequest chunk;
  Qlinear__V1__LoadCommitRequest commit;
  Qlinear__V1__LoadAbortRequest abort;
  Qlinear__V1__UnloadWeightRequest unload;
  Qlinear__V1__ListWeightsRequest list;
  Qlinear__V1__StatsRequest stats;
  Qlinear__V1__LinearRequest linear;
  Qlinear__V1__Tensor x;
  Qlinear__V1__RegionSlice xs, ys;
  uint64_t shape[3];
  uint8_t chunk_data[300];
  uint8_t xbuf[XBUF_BYTES];
} g;

static Qlinear__V1__Request *mk_req(Qlinear__V1__Request__BodyCase bc) {
  qlinear__v1__request__init(&g.req);
  g.req.request_id = 0x0123456789abcdefull;
  g.req.body_case = bc;
  return &g.req;
}

static Qlinear__V1__Request *mk_hello(void) {
  qlinear__v1__hello_request__init(&g.hello);
  g.hello.protocol_version = QL_PROTOCOL_VERSION;
  g.hello.client_name = "test_protocol";
  mk_req(QLINEAR__V1__REQUEST__BODY_HELLO)->hello = &g.hello;
  return &g.req;
}

/* A valid spec of the given format: [64,256] f32 with a bias. */
static Qlinear__V1__Request *mk_load_begin(int format, uint32_t group_size) {
  qlinear__v1__weight_spec__init(&g.spec);
  g.spec.name = WNAME;
  g.spec.format = (Qlinear__V1__Format)format;
  g.spec.group_size = group_size;
  g.spec.n = 64;
  g.spec.k = 256;
  g.spec.dtype = QLINEAR__V1__DTYPE__DTYPE_F32;
  g.spec.has_bias = 1;
  g.spec.policy = QLINEAR__V1__PATH__PATH_AUTO;
  g.spec.scale_dtype = QLINEAR__V1__DTYPE__DTYPE_UNSPECIFIED;
  qlinear__v1__load_begin_request__init(&g.begin);
  g.begin.spec = &g.spec;
  mk_req(QLINEAR__V1__REQUEST__BODY_LOAD_BEGIN)->load_begin = &g.begin;
  return &g.req;
}

static Qlinear__V1__Request *mk_chunk(size_t len) {
  ck_assert_uint_le(len, sizeof g.chunk_data);
  for (size_t i = 0; i < sizeof g.chunk_data; i++)
    g.chunk_data[i] = (uint8_t)(i * 131u + 7u);
  qlinear__v1__load_chunk_request__init(&g.chunk);
  g.chunk.upload_id = 42;
  g.chunk.offset = (uint64_t)1 << 33;
  g.chunk.data.data = g.chunk_data;
  g.chunk.data.len = len;
  mk_req(QLINEAR__V1__REQUEST__BODY_LOAD_CHUNK)->load_chunk = &g.chunk;
  return &g.req;
}

static Qlinear__V1__Request *mk_commit(void) {
  qlinear__v1__load_commit_request__init(&g.commit);
  g.commit.upload_id = UINT64_MAX;
  mk_req(QLINEAR__V1__REQUEST__BODY_LOAD_COMMIT)->load_commit = &g.commit;
  return &g.req;
}

static Qlinear__V1__Request *mk_abort(void) {
  qlinear__v1__load_abort_request__init(&g.abort);
  g.abort.upload_id = 77;
  mk_req(QLINEAR__V1__REQUEST__BODY_LOAD_ABORT)->load_abort = &g.abort;
  return &g.req;
}

static Qlinear__V1__Request *mk_unload(const char *name) {
  qlinear__v1__unload_weight_request__init(&g.unload);
  g.unload.name = (char *)name;
  mk_req(QLINEAR__V1__REQUEST__BODY_UNLOAD)->unload = &g.unload;
  return &g.req;
}

static Qlinear__V1__Request *mk_list(void) {
  qlinear__v1__list_weights_request__init(&g.list);
  mk_req(QLINEAR__V1__REQUEST__BODY_LIST)->list = &g.list;
  return &g.req;
}

static Qlinear__V1__Request *mk_stats(void) {
  qlinear__v1__stats_request__init(&g.stats);
  mk_req(QLINEAR__V1__REQUEST__BODY_STATS)->stats = &g.stats;
  return &g.req;
}

/* A valid linear request: x is [m,k] of dtype with exactly m*k elements of
 * inline data (or none when dtype is not a known one). */
static Qlinear__V1__Request *mk_linear(int dtype, uint64_t m, uint64_t k) {
  for (size_t i = 0; i < sizeof g.xbuf; i++)
    g.xbuf[i] = (uint8_t)(i * 29u + 3u);
  size_t bytes = (size_t)(m * k * ql_dtype_size(dtype));
  ck_assert_uint_le(bytes, sizeof g.xbuf);
  qlinear__v1__tensor__init(&g.x);
  g.x.dtype = (Qlinear__V1__DType)dtype;
  g.shape[0] = m;
  g.shape[1] = k;
  g.shape[2] = 1;
  g.x.n_shape = 2;
  g.x.shape = g.shape;
  g.x.data_case = QLINEAR__V1__TENSOR__DATA_INLINE_DATA;
  g.x.inline_data.data = g.xbuf;
  g.x.inline_data.len = bytes;
  qlinear__v1__linear_request__init(&g.linear);
  g.linear.weight = WNAME;
  g.linear.x = &g.x;
  g.linear.path = QLINEAR__V1__PATH__PATH_AUTO;
  mk_req(QLINEAR__V1__REQUEST__BODY_LINEAR)->linear = &g.linear;
  return &g.req;
}

/* The same with x as a region slice at offset off (aligned), and y written
 * to a slice of region 9 when with_y. */
static Qlinear__V1__Request *mk_linear_region(int dtype, uint64_t m,
                                              uint64_t k, uint64_t off,
                                              int with_y) {
  mk_linear(dtype, 1, 1); /* no inline bytes needed: any m and k */
  g.shape[0] = m;
  g.shape[1] = k;
  qlinear__v1__region_slice__init(&g.xs);
  g.xs.region_id = 7;
  g.xs.offset = off;
  g.xs.length = m * k * ql_dtype_size(dtype);
  g.x.data_case = QLINEAR__V1__TENSOR__DATA_REGION;
  g.x.region = &g.xs;
  qlinear__v1__region_slice__init(&g.ys);
  g.ys.region_id = 9;
  g.ys.offset = 4096;
  g.ys.length = 12345; /* checked against the weight's N by the daemon */
  g.linear.y_out = with_y ? &g.ys : NULL;
  return &g.req;
}

/* Every valid request body, for the tests that sweep all of them. */
static Qlinear__V1__Request *mk_valid(int i) {
  switch (i) {
  case 0: return mk_hello();
  case 1: return mk_load_begin(QL_FORMAT_Q4G, 128);
  case 2: return mk_load_begin(QL_FORMAT_Q8C, 0);
  case 3: return mk_chunk(sizeof g.chunk_data);
  case 4: return mk_commit();
  case 5: return mk_abort();
  case 6: return mk_unload(WNAME);
  case 7: return mk_list();
  case 8: return mk_stats();
  case 9: return mk_linear(QL_DTYPE_F32, 3, 5);
  case 10: return mk_linear(QL_DTYPE_BF16, 16, 64);
  case 11: return mk_linear_region(QL_DTYPE_F16, 4, 8, 64, 0);
  default: return mk_linear_region(QL_DTYPE_F32, 1 << 20, 4096,
                                   (uint64_t)1 << 40, 1);
  }
}
#define N_VALID 13

/* ---------------------------------------------------------- round trips */

/* Packs the current g.req, decodes it, checks the envelope and that it
 * validates; the caller compares the body and calls release(). */
static ql__request *roundtrip(uint8_t **buf) {
  size_t len;
  *buf = pack_req(&g.req, &len);
  ql__request *r = decode_ok(*buf, len);
  ck_assert_uint_eq(r->msg->request_id, g.req.request_id);
  ck_assert_int_eq(r->msg->body_case, g.req.body_case);
  char err[256] = "";
  ck_assert_msg(ql__request_validate(r->msg, err, sizeof err) == 0, "%s", err);
  return r;
}

START_TEST(test_roundtrip_hello) {
  uint8_t *buf;
  mk_hello();
  ql__request *r = roundtrip(&buf);
  ck_assert_ptr_nonnull(r->msg->hello);
  ck_assert_uint_eq(r->msg->hello->protocol_version, QL_PROTOCOL_VERSION);
  ck_assert_str_eq(r->msg->hello->client_name, "test_protocol");
  release(r);
  free(buf);
}
END_TEST

START_TEST(test_roundtrip_load_begin) {
  static const struct {
    int format;
    uint32_t group;
    int dtype, scale, policy, bias;
  } cases[] = {
      {QL_FORMAT_Q4G, 32, QL_DTYPE_F32, 0, QL_PATH_AUTO, 1},
      {QL_FORMAT_Q4G, 256, QL_DTYPE_BF16, QL_DTYPE_F16, QL_PATH_WEIGHT_ONLY, 0},
      {QL_FORMAT_Q8C, 0, QL_DTYPE_F16, QL_DTYPE_BF16, QL_PATH_AUTO, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint8_t *buf;
    mk_load_begin(cases[i].format, cases[i].group);
    g.spec.dtype = (Qlinear__V1__DType)cases[i].dtype;
    g.spec.scale_dtype = (Qlinear__V1__DType)cases[i].scale;
    g.spec.policy = (Qlinear__V1__Path)cases[i].policy;
    g.spec.has_bias = cases[i].bias;
    g.spec.n = 4096;
    g.spec.k = QL_MAX_DIM;
    ql__request *r = roundtrip(&buf);
    const Qlinear__V1__WeightSpec *s = r->msg->load_begin->spec;
    ck_assert_ptr_nonnull(s);
    ck_assert_str_eq(s->name, WNAME);
    ck_assert_int_eq(s->format, cases[i].format);
    ck_assert_uint_eq(s->group_size, cases[i].group);
    ck_assert_uint_eq(s->n, 4096);
    ck_assert_uint_eq(s->k, QL_MAX_DIM);
    ck_assert_int_eq(s->dtype, cases[i].dtype);
    ck_assert_int_eq(s->scale_dtype, cases[i].scale);
    ck_assert_int_eq(s->policy, cases[i].policy);
    ck_assert_int_eq(!!s->has_bias, cases[i].bias);
    release(r);
    free(buf);
  }
}
END_TEST

START_TEST(test_roundtrip_load_chunk) {
  uint8_t *buf;
  mk_chunk(sizeof g.chunk_data);
  ql__request *r = roundtrip(&buf);
  const Qlinear__V1__LoadChunkRequest *c = r->msg->load_chunk;
  ck_assert_uint_eq(c->upload_id, 42);
  ck_assert_uint_eq(c->offset, (uint64_t)1 << 33);
  ck_assert_uint_eq(c->data.len, sizeof g.chunk_data);
  ck_assert_mem_eq(c->data.data, g.chunk_data, sizeof g.chunk_data);
  /* The payload is charged to the budget. */
  ck_assert_uint_ge(r->used, sizeof g.chunk_data);
  release(r);
  free(buf);
}
END_TEST

START_TEST(test_roundtrip_commit_abort) {
  uint8_t *buf;
  mk_commit();
  ql__request *r = roundtrip(&buf);
  ck_assert_uint_eq(r->msg->load_commit->upload_id, UINT64_MAX);
  release(r);
  free(buf);

  mk_abort();
  r = roundtrip(&buf);
  ck_assert_uint_eq(r->msg->load_abort->upload_id, 77);
  release(r);
  free(buf);
}
END_TEST

START_TEST(test_roundtrip_unload) {
  uint8_t *buf;
  mk_unload(WNAME);
  ql__request *r = roundtrip(&buf);
  ck_assert_str_eq(r->msg->unload->name, WNAME);
  release(r);
  free(buf);
}
END_TEST

START_TEST(test_roundtrip_list_stats) {
  uint8_t *buf;
  mk_list();
  ql__request *r = roundtrip(&buf);
  ck_assert_ptr_nonnull(r->msg->list);
  release(r);
  free(buf);

  mk_stats();
  r = roundtrip(&buf);
  ck_assert_ptr_nonnull(r->msg->stats);
  release(r);
  free(buf);
}
END_TEST

START_TEST(test_roundtrip_linear) {
  static const struct {
    int dtype, path;
    uint64_t m, k;
  } cases[] = {
      {QL_DTYPE_F32, QL_PATH_AUTO, 3, 5},
      {QL_DTYPE_F16, QL_PATH_WEIGHT_ONLY, 1, 64},
      {QL_DTYPE_BF16, QL_PATH_ACT_QUANT, 16, 64},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint8_t *buf;
    mk_linear(cases[i].dtype, cases[i].m, cases[i].k);
    g.linear.path = (Qlinear__V1__Path)cases[i].path;
    ql__request *r = roundtrip(&buf);
    const Qlinear__V1__LinearRequest *l = r->msg->linear;
    ck_assert_str_eq(l->weight, WNAME);
    ck_assert_int_eq(l->path, cases[i].path);
    ck_assert_ptr_nonnull(l->x);
    ck_assert_int_eq(l->x->dtype, cases[i].dtype);
    ck_assert_uint_eq(l->x->n_shape, 2);
    ck_assert_uint_eq(l->x->shape[0], cases[i].m);
    ck_assert_uint_eq(l->x->shape[1], cases[i].k);
    ck_assert_int_eq(l->x->data_case, QLINEAR__V1__TENSOR__DATA_INLINE_DATA);
    size_t bytes = cases[i].m * cases[i].k * ql_dtype_size(cases[i].dtype);
    ck_assert_uint_eq(l->x->inline_data.len, bytes);
    ck_assert_mem_eq(l->x->inline_data.data, g.xbuf, bytes);
    release(r);
    free(buf);
  }
}
END_TEST

START_TEST(test_roundtrip_linear_region) {
  /* x as a slice, y_out, and the session token of the envelope. */
  uint8_t token[16];
  for (int i = 0; i < 16; i++)
    token[i] = (uint8_t)(0x5a + i);
  mk_linear_region(QL_DTYPE_F32, 1 << 20, 4096, (uint64_t)1 << 40, 1);
  g.req.session_token.data = token;
  g.req.session_token.len = sizeof token;
  uint8_t *buf;
  ql__request *r = roundtrip(&buf);
  ck_assert_uint_eq(r->msg->session_token.len, 16);
  ck_assert_mem_eq(r->msg->session_token.data, token, 16);
  const Qlinear__V1__Tensor *x = r->msg->linear->x;
  ck_assert_int_eq(x->data_case, QLINEAR__V1__TENSOR__DATA_REGION);
  ck_assert_uint_eq(x->region->region_id, 7);
  ck_assert_uint_eq(x->region->offset, (uint64_t)1 << 40);
  ck_assert_uint_eq(x->region->length, ((uint64_t)1 << 20) * 4096 * 4);
  const Qlinear__V1__RegionSlice *y = r->msg->linear->y_out;
  ck_assert_ptr_nonnull(y);
  ck_assert_uint_eq(y->region_id, 9);
  ck_assert_uint_eq(y->offset, 4096);
  ck_assert_uint_eq(y->length, 12345);
  release(r);
  free(buf);
  /* Without y_out the field stays absent. */
  mk_linear_region(QL_DTYPE_F16, 4, 8, 64, 0);
  r = roundtrip(&buf);
  ck_assert_ptr_null(r->msg->linear->y_out);
  ck_assert_uint_eq(r->msg->session_token.len, 0);
  release(r);
  free(buf);
}
END_TEST

START_TEST(test_roundtrip_response_linear) {
  float y[2 * 3] = {1.5f, -2.0f, 0.0f, 3.25f, -0.5f, 1e-3f};
  uint64_t shape[2] = {2, 3};
  Qlinear__V1__Tensor t;
  qlinear__v1__tensor__init(&t);
  t.dtype = QLINEAR__V1__DTYPE__DTYPE_F32;
  t.n_shape = 2;
  t.shape = shape;
  t.data_case = QLINEAR__V1__TENSOR__DATA_INLINE_DATA;
  t.inline_data.data = (uint8_t *)y;
  t.inline_data.len = sizeof y;
  Qlinear__V1__LinearResponse lr;
  qlinear__v1__linear_response__init(&lr);
  lr.y = &t;
  lr.path = QLINEAR__V1__PATH__PATH_ACT_QUANT;
  lr.impl = "cpu.ref";
  Qlinear__V1__Status st;
  qlinear__v1__status__init(&st);
  Qlinear__V1__Response resp;
  qlinear__v1__response__init(&resp);
  resp.request_id = 99;
  resp.status = &st;
  resp.body_case = QLINEAR__V1__RESPONSE__BODY_LINEAR;
  resp.linear = &lr;

  size_t len;
  uint8_t *buf = pack_resp(&resp, &len);
  Qlinear__V1__Response *d = qlinear__v1__response__unpack(NULL, len, buf);
  ck_assert_ptr_nonnull(d);
  ck_assert_uint_eq(d->request_id, 99);
  ck_assert_ptr_nonnull(d->status);
  ck_assert_int_eq(d->status->code, 0);
  ck_assert_str_eq(d->status->message, "");
  ck_assert_int_eq(d->body_case, QLINEAR__V1__RESPONSE__BODY_LINEAR);
  ck_assert_int_eq(d->linear->path, QLINEAR__V1__PATH__PATH_ACT_QUANT);
  ck_assert_str_eq(d->linear->impl, "cpu.ref");
  const Qlinear__V1__Tensor *dy = d->linear->y;
  ck_assert_ptr_nonnull(dy);
  ck_assert_int_eq(dy->dtype, QLINEAR__V1__DTYPE__DTYPE_F32);
  ck_assert_uint_eq(dy->n_shape, 2);
  ck_assert_uint_eq(dy->shape[0], 2);
  ck_assert_uint_eq(dy->shape[1], 3);
  ck_assert_uint_eq(dy->inline_data.len, sizeof y);
  ck_assert_mem_eq(dy->inline_data.data, y, sizeof y);
  qlinear__v1__response__free_unpacked(d, NULL);
  free(buf);
}
END_TEST

START_TEST(test_roundtrip_response_error_and_hello) {
  /* An error reply: a negative code survives the sint32 encoding. */
  Qlinear__V1__Status st;
  qlinear__v1__status__init(&st);
  st.code = QL_ESHAPE;
  st.message = "linear: x must be 2-D";
  Qlinear__V1__Response resp;
  qlinear__v1__response__init(&resp);
  resp.request_id = UINT64_MAX;
  resp.status = &st;
  size_t len;
  uint8_t *buf = pack_resp(&resp, &len);
  Qlinear__V1__Response *d = qlinear__v1__response__unpack(NULL, len, buf);
  ck_assert_ptr_nonnull(d);
  ck_assert_uint_eq(d->request_id, UINT64_MAX);
  ck_assert_int_eq(d->status->code, QL_ESHAPE);
  ck_assert_str_eq(d->status->message, "linear: x must be 2-D");
  ck_assert_int_eq(d->body_case, QLINEAR__V1__RESPONSE__BODY__NOT_SET);
  qlinear__v1__response__free_unpacked(d, NULL);
  free(buf);

  /* Hello, with repeated devices and the instance id. */
  uint8_t iid[16];
  for (int i = 0; i < 16; i++)
    iid[i] = (uint8_t)(0xf0 ^ i);
  Qlinear__V1__Device dev[2], *devp[2] = {&dev[0], &dev[1]};
  qlinear__v1__device__init(&dev[0]);
  dev[0].name = "cpu";
  dev[0].kind = "cpu";
  dev[0].alias = "cpu";
  qlinear__v1__device__init(&dev[1]);
  dev[1].name = "cuda:GPU-0000";
  dev[1].kind = "cuda";
  dev[1].alias = "cuda:0";
  Qlinear__V1__HelloResponse h;
  qlinear__v1__hello_response__init(&h);
  h.protocol_version = QL_PROTOCOL_VERSION;
  h.daemon_version = "0.1.0";
  h.instance_id.data = iid;
  h.instance_id.len = sizeof iid;
  h.max_message_bytes = 64u << 20;
  h.max_chunk_bytes = 16u << 20;
  h.n_devices = 2;
  h.devices = devp;
  st.code = 0;
  st.message = "";
  resp.request_id = 1;
  resp.body_case = QLINEAR__V1__RESPONSE__BODY_HELLO;
  resp.hello = &h;
  buf = pack_resp(&resp, &len);
  d = qlinear__v1__response__unpack(NULL, len, buf);
  ck_assert_ptr_nonnull(d);
  ck_assert_int_eq(d->body_case, QLINEAR__V1__RESPONSE__BODY_HELLO);
  ck_assert_uint_eq(d->hello->protocol_version, QL_PROTOCOL_VERSION);
  ck_assert_str_eq(d->hello->daemon_version, "0.1.0");
  ck_assert_uint_eq(d->hello->instance_id.len, 16);
  ck_assert_mem_eq(d->hello->instance_id.data, iid, 16);
  ck_assert_uint_eq(d->hello->max_message_bytes, 64u << 20);
  ck_assert_uint_eq(d->hello->max_chunk_bytes, 16u << 20);
  ck_assert_uint_eq(d->hello->n_devices, 2);
  ck_assert_str_eq(d->hello->devices[1]->name, "cuda:GPU-0000");
  ck_assert_str_eq(d->hello->devices[1]->kind, "cuda");
  ck_assert_str_eq(d->hello->devices[1]->alias, "cuda:0");
  qlinear__v1__response__free_unpacked(d, NULL);
  free(buf);
}
END_TEST

/* ----------------------------------------------------------- validation */

START_TEST(test_validate_body) {
  /* The bodies with nothing to check are valid as they are. */
  expect_rc(mk_hello(), 0);
  expect_rc(mk_list(), 0);
  expect_rc(mk_stats(), 0);
  expect_rc(mk_commit(), 0);
  expect_rc(mk_abort(), 0);
  /* No body at all. */
  expect_rc(mk_req(QLINEAR__V1__REQUEST__BODY__NOT_SET), QL_EPROTO);
  /* A body case the decoder can never produce. */
  mk_hello()->body_case = (Qlinear__V1__Request__BodyCase)99;
  char err[256] = "";
  ck_assert_int_eq(ql__request_validate(&g.req, err, sizeof err), QL_EPROTO);
  ck_assert_str_ne(err, "");
}
END_TEST

START_TEST(test_validate_err_buffer) {
  /* No buffer, or a tiny one, is fine: the code is the same. */
  mk_unload("..");
  ck_assert_int_eq(ql__request_validate(&g.req, NULL, 0), QL_ENAME);
  char small[4] = "xxx";
  ck_assert_int_eq(ql__request_validate(&g.req, small, 0), QL_ENAME);
  ck_assert_str_eq(small, "xxx");
  ck_assert_int_eq(ql__request_validate(&g.req, small, sizeof small),
                   QL_ENAME);
  ck_assert_uint_eq(strlen(small), 3);
}
END_TEST

START_TEST(test_validate_spec_missing) {
  mk_load_begin(QL_FORMAT_Q4G, 64);
  g.begin.spec = NULL;
  expect_rc(&g.req, QL_EINVAL);
}
END_TEST

START_TEST(test_validate_spec_format) {
  expect_rc(mk_load_begin(QL_FORMAT_Q4G, 64), 0);
  expect_rc(mk_load_begin(QL_FORMAT_Q8C, 0), 0);
  expect_rc(mk_load_begin(QL_FORMAT_Q8B, 64), 0);
  expect_rc(mk_load_begin(QL_FORMAT_F8R, 0), 0);
  /* Only q8b has an asymmetric form. */
  mk_load_begin(QL_FORMAT_Q8B, 128);
  g.spec.asymmetric = 1;
  expect_rc(&g.req, 0);
  static const int sym_only[] = {QL_FORMAT_Q4G, QL_FORMAT_Q8C, QL_FORMAT_F8R};
  for (size_t i = 0; i < 3; i++) {
    mk_load_begin(sym_only[i], 64);
    g.spec.asymmetric = 1;
    expect_rc(&g.req, QL_EINVAL);
  }
  /* Unknown. */
  static const int bad[] = {0, 5, 99, -1, INT32_MIN, INT32_MAX};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    expect_rc(mk_load_begin(bad[i], 64), QL_EFORMAT);
}
END_TEST

/* A packed import: qdata and scale required, bias iff declared, array
 * dtypes, dims and sizes checked; the float data dtype is then ignored. */
/* A load's devices: at most 16, each a non-empty name of at most 63
 * bytes (which exist is the daemon's to say). */
START_TEST(test_validate_load_devices) {
  char *names[17], long_name[65];
  memset(long_name, 'a', 64);
  long_name[64] = '\0';
  for (int i = 0; i < 17; i++)
    names[i] = "cuda:0";
  mk_load_begin(QL_FORMAT_Q8C, 0);
  g.begin.devices = names;
  g.begin.n_devices = 16;
  expect_rc(&g.req, 0);
  g.begin.n_devices = 17;
  expect_rc(&g.req, QL_EINVAL);
  names[1] = "";
  g.begin.n_devices = 2;
  expect_rc(&g.req, QL_EINVAL);
  names[1] = long_name;
  expect_rc(&g.req, QL_EINVAL);
  long_name[63] = '\0';
  expect_rc(&g.req, 0);
}
END_TEST

START_TEST(test_validate_packed) {
  static Qlinear__V1__PackedSpec ps;
  static Qlinear__V1__ArraySpec qd, sc, ze, bi;
  static uint64_t qshape[2] = {64, 128}, sshape[2] = {4, 64}, bshape[1] = {64};
  mk_load_begin(QL_FORMAT_Q4G, 64);
  g.spec.dtype = QLINEAR__V1__DTYPE__DTYPE_UNSPECIFIED; /* ignored */
  qlinear__v1__packed_spec__init(&ps);
  qlinear__v1__array_spec__init(&qd);
  qlinear__v1__array_spec__init(&sc);
  qlinear__v1__array_spec__init(&ze);
  qlinear__v1__array_spec__init(&bi);
  qd.dtype = QLINEAR__V1__ARRAY_DTYPE__ADT_U8;
  qd.shape = qshape;
  qd.n_shape = 2;
  sc.dtype = ze.dtype = QLINEAR__V1__ARRAY_DTYPE__ADT_BF16;
  sc.shape = ze.shape = sshape;
  sc.n_shape = ze.n_shape = 2;
  bi.dtype = QLINEAR__V1__ARRAY_DTYPE__ADT_F32;
  bi.shape = bshape;
  bi.n_shape = 1;
  ps.qdata = &qd;
  ps.scale = &sc;
  ps.zero = &ze;
  ps.bias = &bi;
  g.begin.packed = &ps;
  expect_rc(&g.req, 0);
  /* Without packed the float dtype matters again. */
  g.begin.packed = NULL;
  expect_rc(&g.req, QL_EDTYPE);
  g.begin.packed = &ps;
  /* Bias declared but missing, and given but not declared. */
  ps.bias = NULL;
  expect_rc(&g.req, QL_EINVAL);
  g.spec.has_bias = 0;
  expect_rc(&g.req, 0);
  ps.bias = &bi;
  expect_rc(&g.req, QL_EINVAL);
  g.spec.has_bias = 1;
  /* Required arrays. */
  ps.qdata = NULL;
  expect_rc(&g.req, QL_EINVAL);
  ps.qdata = &qd;
  ps.scale = NULL;
  expect_rc(&g.req, QL_EINVAL);
  ps.scale = &sc;
  /* Array dtypes, dims, sizes. */
  qd.dtype = (Qlinear__V1__ArrayDType)8;
  expect_rc(&g.req, QL_EDTYPE);
  qd.dtype = QLINEAR__V1__ARRAY_DTYPE__ADT_UNSPECIFIED;
  expect_rc(&g.req, QL_EDTYPE);
  qd.dtype = QLINEAR__V1__ARRAY_DTYPE__ADT_U8;
  qd.n_shape = 0;
  expect_rc(&g.req, QL_ESHAPE);
  qd.n_shape = 2;
  ze.n_shape = 3;
  expect_rc(&g.req, QL_ESHAPE);
  ze.n_shape = 2;
  qshape[1] = 0;
  expect_rc(&g.req, QL_ESHAPE);
  qshape[1] = QL_MAX_DIM + 1;
  expect_rc(&g.req, QL_ESHAPE);
  qshape[1] = 128;
  /* Unknown zero kind. */
  ps.zero_kind = (Qlinear__V1__ZeroKind)2;
  expect_rc(&g.req, QL_EINVAL);
  ps.zero_kind = QLINEAR__V1__ZERO_KIND__ZERO_INT;
  expect_rc(&g.req, 0);
  g.begin.packed = NULL;
}
END_TEST

START_TEST(test_validate_spec_group_size) {
  static const uint32_t good[] = {32, 64, 128, 256};
  static const uint32_t bad[] = {0, 1, 16, 31, 33, 48, 96, 255, 512, 1024,
                                 UINT32_MAX};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
    expect_rc(mk_load_begin(QL_FORMAT_Q4G, good[i]), 0);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    expect_rc(mk_load_begin(QL_FORMAT_Q4G, bad[i]), QL_EINVAL);
  /* q8b blocks follow the same rule. */
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
    expect_rc(mk_load_begin(QL_FORMAT_Q8B, good[i]), 0);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    expect_rc(mk_load_begin(QL_FORMAT_Q8B, bad[i]), QL_EINVAL);
  /* f8r has no groups either. */
  expect_rc(mk_load_begin(QL_FORMAT_F8R, 3), 0);
  /* q8c has no groups: the field is ignored. */
  expect_rc(mk_load_begin(QL_FORMAT_Q8C, 0), 0);
  expect_rc(mk_load_begin(QL_FORMAT_Q8C, 7), 0);
}
END_TEST

START_TEST(test_validate_spec_shape) {
  mk_load_begin(QL_FORMAT_Q8C, 0);
  g.spec.n = QL_MAX_DIM;
  g.spec.k = QL_MAX_DIM;
  expect_rc(&g.req, 0);
  g.spec.n = 1;
  g.spec.k = 1;
  expect_rc(&g.req, 0);

  static const struct {
    uint64_t n, k;
  } bad[] = {
      {0, 256}, {64, 0}, {0, 0},
      {QL_MAX_DIM + 1, 256}, {64, QL_MAX_DIM + 1},
      {UINT64_MAX, 256}, {64, UINT64_MAX}, {(uint64_t)1 << 62, 8},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    mk_load_begin(QL_FORMAT_Q4G, 32);
    g.spec.n = bad[i].n;
    g.spec.k = bad[i].k;
    expect_rc(&g.req, QL_ESHAPE);
  }
}
END_TEST

START_TEST(test_validate_spec_dtype) {
  static const int good[] = {QL_DTYPE_F32, QL_DTYPE_F16, QL_DTYPE_BF16};
  static const int bad[] = {0, 4, 99, -1, INT32_MIN};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    mk_load_begin(QL_FORMAT_Q4G, 32)->load_begin->spec->dtype =
        (Qlinear__V1__DType)good[i];
    expect_rc(&g.req, 0);
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    mk_load_begin(QL_FORMAT_Q4G, 32);
    g.spec.dtype = (Qlinear__V1__DType)bad[i];
    expect_rc(&g.req, QL_EDTYPE);
  }
  /* The scale dtype: UNSPECIFIED (0) means the default. */
  static const int sgood[] = {0, QL_DTYPE_F32, QL_DTYPE_F16, QL_DTYPE_BF16};
  static const int sbad[] = {4, 99, -1};
  for (size_t i = 0; i < sizeof sgood / sizeof sgood[0]; i++) {
    mk_load_begin(QL_FORMAT_Q8C, 0);
    g.spec.scale_dtype = (Qlinear__V1__DType)sgood[i];
    expect_rc(&g.req, 0);
  }
  for (size_t i = 0; i < sizeof sbad / sizeof sbad[0]; i++) {
    mk_load_begin(QL_FORMAT_Q8C, 0);
    g.spec.scale_dtype = (Qlinear__V1__DType)sbad[i];
    expect_rc(&g.req, QL_EDTYPE);
  }
}
END_TEST

START_TEST(test_validate_spec_policy) {
  static const int good[] = {QL_PATH_AUTO, QL_PATH_WEIGHT_ONLY};
  static const int bad[] = {3, 99, -1};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    mk_load_begin(QL_FORMAT_Q4G, 64);
    g.spec.policy = (Qlinear__V1__Path)good[i];
    expect_rc(&g.req, 0);
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    mk_load_begin(QL_FORMAT_Q4G, 64);
    g.spec.policy = (Qlinear__V1__Path)bad[i];
    expect_rc(&g.req, QL_EINVAL);
  }
}
END_TEST

START_TEST(test_validate_chunk) {
  expect_rc(mk_chunk(1), 0);
  expect_rc(mk_chunk(sizeof g.chunk_data), 0);
  expect_rc(mk_chunk(0), QL_EINVAL);
}
END_TEST

START_TEST(test_validate_linear_path) {
  static const int good[] = {QL_PATH_AUTO, QL_PATH_WEIGHT_ONLY,
                             QL_PATH_ACT_QUANT};
  static const int bad[] = {3, 99, -1};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    mk_linear(QL_DTYPE_F32, 2, 8)->linear->path = (Qlinear__V1__Path)good[i];
    expect_rc(&g.req, 0);
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    mk_linear(QL_DTYPE_F32, 2, 8)->linear->path = (Qlinear__V1__Path)bad[i];
    expect_rc(&g.req, QL_EINVAL);
  }
}
END_TEST

START_TEST(test_validate_linear_x) {
  mk_linear(QL_DTYPE_F32, 2, 8);
  g.linear.x = NULL;
  expect_rc(&g.req, QL_EINVAL);
  /* Shape and all, but no data. */
  mk_linear(QL_DTYPE_F32, 2, 8);
  g.x.data_case = QLINEAR__V1__TENSOR__DATA__NOT_SET;
  expect_rc(&g.req, QL_EINVAL);
}
END_TEST

START_TEST(test_validate_linear_dtype) {
  expect_rc(mk_linear(QL_DTYPE_F32, 4, 16), 0);
  expect_rc(mk_linear(QL_DTYPE_F16, 4, 16), 0);
  expect_rc(mk_linear(QL_DTYPE_BF16, 4, 16), 0);
  static const int bad[] = {0, 4, 99, -1};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    mk_linear(QL_DTYPE_F32, 4, 16);
    g.x.dtype = (Qlinear__V1__DType)bad[i];
    expect_rc(&g.req, QL_EDTYPE);
  }
}
END_TEST

START_TEST(test_validate_linear_dims) {
  /* 32 floats of data, described with 0, 1 and 3 dimensions. */
  mk_linear(QL_DTYPE_F32, 4, 8);
  g.shape[0] = 32;
  g.x.n_shape = 1;
  expect_rc(&g.req, QL_ESHAPE);
  mk_linear(QL_DTYPE_F32, 4, 8);
  g.x.n_shape = 3; /* [4,8,1] */
  expect_rc(&g.req, QL_ESHAPE);
  mk_linear(QL_DTYPE_F32, 4, 8);
  g.x.n_shape = 0;
  g.x.shape = NULL;
  expect_rc(&g.req, QL_ESHAPE);
}
END_TEST

START_TEST(test_validate_linear_range) {
  static const struct {
    uint64_t m, k;
  } bad[] = {
      {0, 8}, {8, 0}, {0, 0},
      {QL_MAX_DIM + 1, 1}, {1, QL_MAX_DIM + 1},
      /* products that would overflow 64 bits: refused before multiplying */
      {(uint64_t)1 << 62, 8}, {8, (uint64_t)1 << 62},
      {(uint64_t)1 << 32, (uint64_t)1 << 32}, {UINT64_MAX, UINT64_MAX},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    mk_linear(QL_DTYPE_F32, 2, 8);
    g.shape[0] = bad[i].m;
    g.shape[1] = bad[i].k;
    expect_rc(&g.req, QL_ESHAPE);
  }
  /* M=0 with the matching (empty) data is still refused. */
  mk_linear(QL_DTYPE_F32, 0, 8);
  expect_rc(&g.req, QL_ESHAPE);
}
END_TEST

START_TEST(test_validate_linear_length) {
  static const int dts[] = {QL_DTYPE_F32, QL_DTYPE_F16, QL_DTYPE_BF16};
  for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
    mk_linear(dts[i], 3, 7);
    size_t want = g.x.inline_data.len;
    expect_rc(&g.req, 0);
    g.x.inline_data.len = want - 1;
    expect_rc(&g.req, QL_ESHAPE);
    g.x.inline_data.len = want + 1;
    expect_rc(&g.req, QL_ESHAPE);
    g.x.inline_data.len = 0;
    expect_rc(&g.req, QL_ESHAPE);
    /* Right byte count for another dtype. */
    g.x.inline_data.len = 3 * 7 * (ql_dtype_size(dts[i]) == 4 ? 2 : 4);
    expect_rc(&g.req, QL_ESHAPE);
  }
}
END_TEST

START_TEST(test_validate_linear_region) {
  static const int dts[] = {QL_DTYPE_F32, QL_DTYPE_F16, QL_DTYPE_BF16};
  for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
    uint64_t es = ql_dtype_size(dts[i]);
    expect_rc(mk_linear_region(dts[i], 3, 7, 0, 1), 0);
    /* Any aligned offset: bounds need the region (handlers.c). */
    expect_rc(mk_linear_region(dts[i], 3, 7, UINT64_MAX - es + 1, 1), 0);
    /* The length is dtype x shape, exactly. */
    mk_linear_region(dts[i], 3, 7, 0, 0);
    g.xs.length += 1;
    expect_rc(&g.req, QL_ESHAPE);
    g.xs.length -= 2;
    expect_rc(&g.req, QL_ESHAPE);
    g.xs.length = 0;
    expect_rc(&g.req, QL_ESHAPE);
    g.xs.length = 3 * 7 * (es == 4 ? 2 : 4); /* another dtype's */
    expect_rc(&g.req, QL_ESHAPE);
    g.xs.length = UINT64_MAX;
    expect_rc(&g.req, QL_ESHAPE);
    /* Offsets of x and y_out that split an element. */
    mk_linear_region(dts[i], 3, 7, 1, 0);
    expect_rc(&g.req, QL_EINVAL);
    mk_linear_region(dts[i], 3, 7, UINT64_MAX, 0);
    expect_rc(&g.req, QL_EINVAL);
    mk_linear_region(dts[i], 3, 7, 0, 1);
    g.ys.offset = es + 1;
    expect_rc(&g.req, QL_EINVAL);
  }
  /* A region case without its slice carries no data. */
  mk_linear_region(QL_DTYPE_F32, 2, 2, 0, 0);
  g.x.region = NULL;
  char err[256] = "";
  ck_assert_int_eq(ql__request_validate(&g.req, err, sizeof err), QL_EINVAL);
  /* Shapes whose byte size overflows fail whatever the slice says. */
  mk_linear_region(QL_DTYPE_F32, 2, 2, 0, 0);
  g.shape[0] = (uint64_t)1 << 62;
  expect_rc(&g.req, QL_ESHAPE);
}
END_TEST

/* CUDA IPC slices, stateless part: 64-byte handles, an optional 64-byte
 * event, a device, an aligned offset, x's exact length; one kind of y. The
 * bounds need the opened allocation (admit.c). */
START_TEST(test_validate_linear_cuda) {
  static uint8_t h[QL_CUDA_IPC_HANDLE_BYTES + 1];
  Qlinear__V1__CudaIpcSlice xc, yc;
  for (int i = 0; i < 13; i++) {
    mk_linear_region(QL_DTYPE_F16, 3, 7, 0, 0);
    qlinear__v1__cuda_ipc_slice__init(&xc);
    xc.mem_handle.data = h;
    xc.mem_handle.len = QL_CUDA_IPC_HANDLE_BYTES;
    xc.offset = 2;
    xc.length = 3 * 7 * 2;
    xc.device = "cuda:0";
    g.x.data_case = QLINEAR__V1__TENSOR__DATA_CUDA_IPC;
    g.x.cuda_ipc = &xc;
    yc = xc;
    yc.length = 999; /* checked against the weight's N by the daemon */
    int want = 0;
    switch (i) {
    case 0:
      break;
    case 1:
      xc.ready_event.data = h;
      xc.ready_event.len = QL_CUDA_IPC_HANDLE_BYTES;
      g.linear.y_out_cuda = &yc;
      break;
    case 2:
      xc.offset = UINT64_MAX - 1; /* aligned: bounds are the daemon's */
      break;
    case 3:
      xc.mem_handle.len = QL_CUDA_IPC_HANDLE_BYTES - 1;
      want = QL_EINVAL;
      break;
    case 4:
      xc.mem_handle.len = QL_CUDA_IPC_HANDLE_BYTES + 1;
      want = QL_EINVAL;
      break;
    case 5:
      xc.mem_handle.len = 0;
      want = QL_EINVAL;
      break;
    case 6:
      xc.ready_event.data = h;
      xc.ready_event.len = 1;
      want = QL_EINVAL;
      break;
    case 7:
      xc.device = "";
      want = QL_EINVAL;
      break;
    case 8:
      xc.offset = 3;
      want = QL_EINVAL;
      break;
    case 9:
      xc.length += 2;
      want = QL_ESHAPE;
      break;
    case 10:
      xc.length = UINT64_MAX;
      want = QL_ESHAPE;
      break;
    case 11: /* both kinds of y */
      g.linear.y_out = &g.ys;
      g.linear.y_out_cuda = &yc;
      want = QL_EINVAL;
      break;
    case 12:
      yc.mem_handle.len = 8;
      g.linear.y_out_cuda = &yc;
      want = QL_EINVAL;
      break;
    }
    ck_assert_msg(wire_validate(&g.req) == want, "case %d", i);
  }
  /* The oneof case without its message carries no data. */
  mk_linear_region(QL_DTYPE_F32, 2, 2, 0, 0);
  g.x.data_case = QLINEAR__V1__TENSOR__DATA_CUDA_IPC;
  g.x.cuda_ipc = NULL;
  char err[256] = "";
  ck_assert_int_eq(ql__request_validate(&g.req, err, sizeof err), QL_EINVAL);
}
END_TEST

/* The one bounds check of a slice: off <= size && len <= size - off. */
START_TEST(test_slice_valid) {
  static const struct {
    uint64_t off, len, size;
    int ok;
  } cases[] = {
      {0, 0, 0, 1},
      {0, 4096, 4096, 1},
      {4096, 0, 4096, 1}, /* empty, at the very end */
      {4094, 2, 4096, 1},
      {4095, 2, 4096, 0},
      {4096, 1, 4096, 0},
      {4097, 0, 4096, 0},
      {0, 4097, 4096, 0},
      {UINT64_MAX, 2, 4096, 0},     /* off + len wraps to 1 */
      {UINT64_MAX - 1, 2, 4096, 0}, /* wraps to 0 */
      {2, UINT64_MAX - 1, 4096, 0}, /* wraps to 0 */
      {UINT64_MAX, 1, UINT64_MAX, 0},
      {UINT64_MAX, 0, UINT64_MAX, 1},
      {0, UINT64_MAX, UINT64_MAX, 1},
      {1, UINT64_MAX, UINT64_MAX, 0},
      {(uint64_t)1 << 63, (uint64_t)1 << 63, UINT64_MAX, 0},
      {(uint64_t)1 << 63, ((uint64_t)1 << 63) - 1, UINT64_MAX, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    ck_assert_msg(ql__slice_valid(cases[i].off, cases[i].len,
                                  cases[i].size) == cases[i].ok,
                  "case %zu", i);
}
END_TEST

/* -------------------------------------------------------- session socket */

static uint8_t *pack_sreq(const Qlinear__V1__SessionRequest *m, size_t *len) {
  size_t n = qlinear__v1__session_request__get_packed_size(m);
  uint8_t *buf = tu_xmalloc(n ? n : 1);
  ck_assert_uint_eq(qlinear__v1__session_request__pack(m, buf), n);
  *len = n;
  return buf;
}

static struct {
  Qlinear__V1__SessionRequest req;
  Qlinear__V1__SessionOpenRequest open;
  Qlinear__V1__CreateRegionRequest create;
  Qlinear__V1__DestroyRegionRequest destroy;
} sg;

static Qlinear__V1__SessionRequest *mk_sreq(int which) {
  qlinear__v1__session_request__init(&sg.req);
  sg.req.request_id = 0xfedcba9876543210ull;
  switch (which) {
  case 0:
    qlinear__v1__session_open_request__init(&sg.open);
    sg.open.protocol_version = QL_PROTOCOL_VERSION;
    sg.open.client_name = "test_protocol";
    sg.req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_OPEN;
    sg.req.open = &sg.open;
    break;
  case 1:
    qlinear__v1__create_region_request__init(&sg.create);
    sg.create.size = (uint64_t)1 << 32;
    sg.req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_CREATE_REGION;
    sg.req.create_region = &sg.create;
    break;
  default:
    qlinear__v1__destroy_region_request__init(&sg.destroy);
    sg.destroy.region_id = UINT64_MAX;
    sg.req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_DESTROY_REGION;
    sg.req.destroy_region = &sg.destroy;
    break;
  }
  return &sg.req;
}
#define N_SVALID 3

static int session_validate(const Qlinear__V1__SessionRequest *m) {
  size_t len;
  uint8_t *buf = pack_sreq(m, &len);
  ql__session_request *r = NULL;
  char err[256] = "", err2[256] = "";
  ck_assert_int_eq(ql__session_request_decode(buf, len, len + 16384, &r, err,
                                              sizeof err),
                   0);
  ck_assert_uint_eq(r->msg->request_id, m->request_id);
  ck_assert_int_eq(r->msg->body_case, m->body_case);
  int rc = ql__session_request_validate(r->msg, err, sizeof err);
  ck_assert_int_eq(ql__session_request_validate(m, err2, sizeof err2), rc);
  if (rc != 0)
    ck_assert_str_ne(err, "");
  qlinear__v1__session_request__free_unpacked(r->msg, &r->alloc);
  r->msg = NULL;
  ck_assert_uint_eq(r->used, 0); /* every byte back to the budget */
  ql__session_request_free(r);
  free(buf);
  return rc;
}

START_TEST(test_session_messages) {
  for (int i = 0; i < N_SVALID; i++)
    ck_assert_int_eq(session_validate(mk_sreq(i)), 0);
  /* A client name travels intact. */
  size_t len;
  uint8_t *buf = pack_sreq(mk_sreq(0), &len);
  ql__session_request *r = NULL;
  ck_assert_int_eq(ql__session_request_decode(buf, len, len + 16384, &r, NULL,
                                              0),
                   0);
  ck_assert_str_eq(r->msg->open->client_name, "test_protocol");
  ck_assert_uint_eq(r->msg->open->protocol_version, QL_PROTOCOL_VERSION);
  ql__session_request_free(r);
  free(buf);
  /* Size 0, id 0, no body. */
  mk_sreq(1)->create_region->size = 0;
  ck_assert_int_eq(session_validate(&sg.req), QL_EINVAL);
  mk_sreq(2)->destroy_region->region_id = 0;
  ck_assert_int_eq(session_validate(&sg.req), QL_EINVAL);
  mk_sreq(0)->body_case = QLINEAR__V1__SESSION_REQUEST__BODY__NOT_SET;
  ck_assert_int_eq(session_validate(&sg.req), QL_EPROTO);
  /* Another protocol version still decodes: the session answers it. */
  mk_sreq(0)->open->protocol_version = 99;
  ck_assert_int_eq(session_validate(&sg.req), 0);
}
END_TEST

START_TEST(test_session_decode_bad) {
  ql__session_request *r = (ql__session_request *)&r;
  char err[256] = "";
  /* Garbage, and the request socket's messages are no session packets
   * when their fields clash. */
  static const struct {
    const char *bytes;
    size_t len;
  } bad[] = {
      {"\x0f", 1}, {"\x08\x80", 2}, {"\x82\x01\x05\x08", 4},
      {"\x80\x01\x00", 3}, {"\xff\xff\xff\xff\xff", 5},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    r = (ql__session_request *)&r;
    ck_assert_int_eq(ql__session_request_decode(bad[i].bytes, bad[i].len,
                                                16384, &r, err, sizeof err),
                     QL_EPROTO);
    ck_assert_ptr_null(r);
    ck_assert_str_ne(err, "");
  }
  /* A packet of the largest size decodes; one byte more never does,
   * whatever it holds. */
  char *name = calloc(1, QL_SESSION_MSG_MAX + 1);
  size_t len = 0, nl = QL_SESSION_MSG_MAX - 32;
  uint8_t *buf = NULL;
  for (;; nl++) {
    memset(name, 'n', nl);
    mk_sreq(0)->open->client_name = name;
    free(buf);
    buf = pack_sreq(&sg.req, &len);
    if (len >= QL_SESSION_MSG_MAX)
      break;
  }
  ck_assert_uint_eq(len, QL_SESSION_MSG_MAX);
  ck_assert_int_eq(ql__session_request_decode(buf, len, 65536, &r, NULL, 0),
                   0);
  ql__session_request_free(r);
  name[nl] = 'n';
  mk_sreq(0)->open->client_name = name;
  free(buf);
  buf = pack_sreq(&sg.req, &len);
  ck_assert_uint_eq(len, QL_SESSION_MSG_MAX + 1);
  ck_assert_int_eq(ql__session_request_decode(buf, len, 65536, &r, err,
                                              sizeof err),
                   QL_EPROTO);
  ck_assert_ptr_null(r);
  free(buf);
  free(name);
  /* Every strict prefix that cuts into a body, and every budget below
   * what a message needs, fail cleanly. */
  for (int i = 0; i < N_SVALID; i++) {
    size_t hlen;
    Qlinear__V1__SessionRequest *m = mk_sreq(i);
    Qlinear__V1__SessionRequest__BodyCase bc = m->body_case;
    m->body_case = QLINEAR__V1__SESSION_REQUEST__BODY__NOT_SET;
    free(pack_sreq(m, &hlen)); /* just the request_id */
    m->body_case = bc;
    buf = pack_sreq(m, &len);
    for (size_t cut = hlen + 1; cut < len; cut++) {
      ck_assert_int_eq(ql__session_request_decode(buf, cut, 16384, &r, NULL,
                                                  0),
                       QL_EPROTO);
      ck_assert_ptr_null(r);
    }
    size_t min = 0;
    while (ql__session_request_decode(buf, len, min, &r, NULL, 0) != 0) {
      ck_assert_ptr_null(r);
      min++;
      ck_assert_uint_lt(min, 16384);
    }
    ck_assert_uint_le(r->used, min);
    ql__session_request_free(r);
    free(buf);
  }
  ql__session_request_free(NULL);
}
END_TEST

/* The error space: QL_ESESSION, then QL_EDEVICE, joined the end of the
 * list (codes never move: clients compare them). */
START_TEST(test_error_codes) {
  ck_assert_int_eq(QL_ESESSION, -24);
  ck_assert_int_eq(QL_EDEVICE, -25);
  ck_assert_int_eq(QL_ERRNO_MIN_, QL_EDEVICE - 1);
  ck_assert_str_eq(ql_err_name(QL_ESESSION), "QL_ESESSION");
  ck_assert_str_eq(ql_strerror(QL_ESESSION), "no such session");
  ck_assert_str_eq(ql_err_name(QL_EDEVICE), "QL_EDEVICE");
  ck_assert_str_eq(ql_strerror(QL_EDEVICE), "device failed or out of service");
  ck_assert_str_eq(ql_err_name(QL_ERRNO_MIN_), "QL_EUNKNOWN");
  for (int code = -1; code > QL_ERRNO_MIN_; code--)
    ck_assert_str_ne(ql_err_name(code), "QL_EUNKNOWN");
}
END_TEST

/* ---------------------------------------------------------------- names */

static const struct {
  const char *name; /* NULL: len copies of 'a' */
  size_t len;
  int ok;
} names[] = {
    {"a", 0, 1},
    {"0", 0, 1},
    {"-", 0, 1},
    {"_", 0, 1},
    {WNAME, 0, 1},
    {"Llama-3/layers.31/mlp.down_proj", 0, 1},
    {"ABCXYZabcxyz0189._-/x", 0, 1},
    {"a.b.c", 0, 1},
    {".hidden", 0, 1},
    {NULL, 1, 1},
    {NULL, 255, 1},
    {NULL, 256, 0},
    {NULL, 1000, 0},
    {"", 0, 0},
    {"..", 0, 0},
    {"../a", 0, 0},
    {"a/..", 0, 0},
    {"a/../b", 0, 0},
    {"a..b", 0, 0}, /* stricter than a path component check, on purpose */
    {"...", 0, 0},
    {"/", 0, 0},
    {"/a", 0, 0},
    {"/model/w", 0, 0},
    {" ", 0, 0},
    {"a b", 0, 0},
    {" a", 0, 0},
    {"a ", 0, 0},
    {"a\tb", 0, 0},
    {"a\nb", 0, 0},
    {"a\\b", 0, 0},
    {"a:b", 0, 0},
    {"a*b", 0, 0},
    {"a%2e%2e", 0, 0},
    {"~user", 0, 0},
    {"\x7f", 0, 0},
    {"\x01", 0, 0},
    {"caf\xc3\xa9", 0, 0},          /* UTF-8 é */
    {"\xe6\xa8\xa1\xe5\x9e\x8b", 0, 0}, /* UTF-8 CJK */
    {"\xff", 0, 0},
};
#define N_NAMES ((int)(sizeof names / sizeof names[0]))

START_TEST(test_name_table) {
  char buf[1001];
  const char *name = names[_i].name;
  if (name == NULL) {
    ck_assert_uint_lt(names[_i].len, sizeof buf);
    memset(buf, 'a', names[_i].len);
    buf[names[_i].len] = '\0';
    name = buf;
  }
  ck_assert_msg(!!ql__name_valid(name) == names[_i].ok,
                "ql__name_valid(\"%.40s\") (len %zu) should be %d", name,
                strlen(name), names[_i].ok);
  /* The rule holds wherever a name travels. */
  int want = names[_i].ok ? 0 : QL_ENAME;
  expect_rc(mk_unload(name), want);
  mk_load_begin(QL_FORMAT_Q4G, 128);
  g.spec.name = (char *)name;
  expect_rc(&g.req, want);
  mk_linear(QL_DTYPE_F32, 2, 4);
  g.linear.weight = (char *)name;
  expect_rc(&g.req, want);
}
END_TEST

START_TEST(test_name_null) {
  /* Only an in-memory message can lack a string; it is refused, not read. */
  char err[256];
  ck_assert_int_eq(ql__request_validate(mk_unload(NULL), err, sizeof err),
                   QL_ENAME);
  mk_linear(QL_DTYPE_F32, 2, 4);
  g.linear.weight = NULL;
  ck_assert_int_eq(ql__request_validate(&g.req, err, sizeof err), QL_ENAME);
}
END_TEST

/* --------------------------------------------------------------- decode */

START_TEST(test_decode_garbage) {
  static const struct {
    const char *bytes;
    size_t len;
  } bad[] = {
      {"\x00\x00", 2},             /* field number 0 */
      {"\x0f", 1},                 /* wire type 7 */
      {"\x08", 1},                 /* tag without its value */
      {"\x08\x80", 2},             /* unterminated varint */
      {"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12}, /* 11 bytes */
      {"\xba\x01\x05\x0a", 4},     /* linear: 5 bytes promised, 1 present */
      {"\xba\x01\x02\x0a\x7f", 5}, /* weight longer than linear */
      {"\x0a\x01\x00", 3},         /* request_id as bytes */
      {"\x80\x01\x00", 3},         /* hello (field 16) as a varint */
      {"\xff\xff\xff\xff\xff", 5}, /* tag varint never ends */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    expect_decode_fails((const uint8_t *)bad[i].bytes, bad[i].len,
                        bad[i].len + SLACK);
  /* Text is not a Request either. */
  const char *text = "GET / HTTP/1.1\r\nHost: qlineard\r\n\r\n";
  expect_decode_fails((const uint8_t *)text, strlen(text),
                      strlen(text) + SLACK);
  /* Without an error buffer the result is the same. */
  ql__request *r = NULL;
  ck_assert_int_eq(ql__request_decode("\x0f", 1, SLACK, &r, NULL, 0),
                   QL_EPROTO);
  ck_assert_ptr_null(r);
  ql__request_free(NULL);
}
END_TEST

START_TEST(test_decode_empty) {
  /* Zero bytes are an empty Request: it decodes, and has no body. */
  ql__request *r = decode_ok((const uint8_t *)"", 0);
  ck_assert_uint_eq(r->msg->request_id, 0);
  char err[256] = "";
  ck_assert_int_eq(ql__request_validate(r->msg, err, sizeof err), QL_EPROTO);
  release(r);
}
END_TEST

/* Every strict prefix that cuts into the body is malformed. */
START_TEST(test_decode_truncated) {
  uint8_t *head, *buf;
  size_t hlen, len;
  Qlinear__V1__Request *m = mk_valid(_i);
  Qlinear__V1__Request__BodyCase bc = m->body_case;
  m->body_case = QLINEAR__V1__REQUEST__BODY__NOT_SET;
  head = pack_req(m, &hlen); /* just the request_id */
  m->body_case = bc;
  buf = pack_req(m, &len);
  ck_assert_uint_gt(len, hlen + 1);
  for (size_t cut = hlen + 1; cut < len; cut++)
    expect_decode_fails(buf, cut, len + SLACK);
  /* The request_id on its own is a bodiless request, cut inside it is not. */
  for (size_t cut = 1; cut < hlen; cut++)
    expect_decode_fails(buf, cut, len + SLACK);
  ql__request *r = decode_ok(buf, hlen);
  ck_assert_int_eq(r->msg->body_case, QLINEAR__V1__REQUEST__BODY__NOT_SET);
  release(r);
  free(head);
  free(buf);
}
END_TEST

/* Small deterministic generator for the mutation sweeps. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* Runs one input the way the daemon does; whatever the bytes, the result
 * is a known code and nothing leaks. */
static void survive(const uint8_t *buf, size_t len) {
  ql__request *r = NULL;
  char err[256] = "";
  int rc = ql__request_decode(buf, len, len + SLACK, &r, err, sizeof err);
  if (rc != 0) {
    ck_assert_int_eq(rc, QL_EPROTO);
    ck_assert_ptr_null(r);
    return;
  }
  rc = ql__request_validate(r->msg, err, sizeof err);
  ck_assert_msg(rc <= 0 && rc > QL_ERRNO_MIN_, "validate returned %d", rc);
  release(r);
}

START_TEST(test_decode_mutations) {
  size_t len;
  uint8_t *orig = pack_req(mk_valid(_i), &len);
  uint8_t *buf = tu_xmalloc(len + 16);
  static const uint8_t vals[] = {0x00, 0x01, 0x7f, 0x80, 0xff};
  /* Every byte replaced by a few interesting values. */
  for (size_t pos = 0; pos < len; pos++) {
    for (size_t v = 0; v < sizeof vals; v++) {
      memcpy(buf, orig, len);
      buf[pos] = vals[v];
      survive(buf, len);
    }
    memcpy(buf, orig, len);
    buf[pos] ^= 0x08; /* flips a wire type bit in a tag */
    survive(buf, len);
  }
  /* Random multi-byte damage, and random tails. */
  for (int n = 0; n < 500; n++) {
    memcpy(buf, orig, len);
    for (int j = 0; j < 3; j++)
      buf[rng() % len] = (uint8_t)rng();
    size_t extra = rng() % 16;
    for (size_t j = 0; j < extra; j++)
      buf[len + j] = (uint8_t)rng();
    survive(buf, len + extra);
  }
  free(buf);
  free(orig);
}
END_TEST

START_TEST(test_decode_random) {
  uint8_t buf[96];
  for (int n = 0; n < 5000; n++) {
    size_t len = rng() % sizeof buf;
    for (size_t j = 0; j < len; j++)
      buf[j] = (uint8_t)rng();
    survive(buf, len);
  }
}
END_TEST

/* Repeating a oneof member replaces the earlier one; the earlier one goes
 * back to the budget rather than piling up. */
START_TEST(test_decode_repeated_body) {
  size_t one_len;
  uint8_t *one = pack_req(mk_linear(QL_DTYPE_F32, 16, 64), &one_len);
  const size_t reps = 64;
  uint8_t *buf = tu_xmalloc(one_len * reps);
  for (size_t i = 0; i < reps; i++)
    memcpy(buf + i * one_len, one, one_len);
  /* Enough for about two copies of the body at once, far less than 64. */
  ql__request *r = NULL;
  char err[256];
  int rc = ql__request_decode(buf, one_len * reps, 4 * one_len + 8192, &r,
                              err, sizeof err);
  ck_assert_msg(rc == 0, "%s", err);
  ck_assert_int_eq(ql__request_validate(r->msg, err, sizeof err), 0);
  ck_assert_uint_eq(r->msg->linear->x->inline_data.len, 16 * 64 * 4);
  release(r);
  free(buf);
  free(one);
}
END_TEST

/* --------------------------------------------------------------- budget */

/* The smallest budget a message decodes in; below it, every budget fails
 * cleanly. This sweeps the failure of every allocation the unpacker makes,
 * like a fault-injecting allocator. */
START_TEST(test_budget_sweep) {
  size_t len;
  uint8_t *buf = pack_req(mk_valid(_i), &len);
  size_t min = 0;
  for (;; min++) {
    ql__request *r = NULL;
    int rc = ql__request_decode(buf, len, min, &r, NULL, 0);
    if (rc == 0) {
      ck_assert_uint_le(r->used, min);
      release(r);
      break;
    }
    ck_assert_int_eq(rc, QL_EPROTO);
    ck_assert_ptr_null(r);
    ck_assert_uint_lt(min, len + SLACK);
  }
  ck_assert_uint_gt(min, 0);
  /* Monotonic: every larger budget works. */
  for (size_t b = min; b < min + 64; b++) {
    ql__request *r = NULL;
    ck_assert_int_eq(ql__request_decode(buf, len, b, &r, NULL, 0), 0);
    release(r);
  }
  free(buf);
}
END_TEST

START_TEST(test_budget_payload) {
  /* 4 KiB of activations: a budget below the payload cannot hold it. */
  size_t len;
  uint8_t *buf = pack_req(mk_linear(QL_DTYPE_F32, 16, 64), &len);
  ck_assert_uint_gt(len, XBUF_BYTES);
  expect_decode_fails(buf, len, 0);
  expect_decode_fails(buf, len, 1024);
  expect_decode_fails(buf, len, XBUF_BYTES);
  ql__request *r = NULL;
  char err[256] = "";
  ck_assert_int_eq(ql__request_decode(buf, len, len + SLACK, &r, err,
                                      sizeof err),
                   0);
  ck_assert_uint_eq(r->limit, len + SLACK);
  ck_assert_uint_ge(r->used, XBUF_BYTES);
  ck_assert_uint_le(r->used, r->limit);
  ck_assert_int_eq(ql__request_validate(r->msg, err, sizeof err), 0);
  release(r);
  free(buf);
}
END_TEST

START_TEST(test_budget_amplification) {
  /* A packed repeated uint64 costs 1 byte per element on the wire and 8 in
   * memory. The daemon's budget (wire size + 1 MiB) absorbs a small blow-up
   * and refuses a large one. */
  static const struct {
    size_t n;
    int ok;
  } cases[] = {{100000, 1}, {400000, 0}};
  for (size_t c = 0; c < 2; c++) {
    size_t n = cases[c].n;
    uint64_t *shape = tu_xmalloc(n * sizeof *shape);
    for (size_t i = 0; i < n; i++)
      shape[i] = 1;
    mk_linear(QL_DTYPE_F32, 2, 4);
    g.x.shape = shape;
    g.x.n_shape = n;
    size_t len;
    uint8_t *buf = pack_req(&g.req, &len);
    ck_assert_uint_lt(len, n + 256);
    if (cases[c].ok) {
      ql__request *r = decode_ok(buf, len);
      ck_assert_uint_eq(r->msg->linear->x->n_shape, n);
      char err[256];
      ck_assert_int_eq(ql__request_validate(r->msg, err, sizeof err),
                       QL_ESHAPE);
      release(r);
    } else {
      expect_decode_fails(buf, len, len + SLACK);
    }
    free(buf);
    free(shape);
  }
}
END_TEST

/* ------------------------------------------------------------- mul_size */

START_TEST(test_mul_size) {
  static const struct {
    size_t a, b, c, want;
    int ok;
  } cases[] = {
      {0, 0, 0, 0, 1},
      {1, 1, 1, 1, 1},
      {2, 3, 4, 24, 1},
      {0, SIZE_MAX, SIZE_MAX, 0, 1},
      {SIZE_MAX, 1, 1, SIZE_MAX, 1},
      {1, SIZE_MAX, 1, SIZE_MAX, 1},
      {1, 1, SIZE_MAX, SIZE_MAX, 1},
      {SIZE_MAX / 3, 3, 1, SIZE_MAX / 3 * 3, 1},
      {SIZE_MAX / 3 + 1, 3, 1, 0, 0},
      {SIZE_MAX, 2, 1, 0, 0},
      {2, SIZE_MAX, 1, 0, 0},
      {1, 2, SIZE_MAX, 0, 0},
      {SIZE_MAX, SIZE_MAX, 1, 0, 0},
      {SIZE_MAX / 2 + 1, 1, 2, 0, 0},
#if SIZE_MAX > UINT32_MAX
      {(size_t)1 << 30, (size_t)1 << 30, 4, (size_t)1 << 62, 1},
      {(size_t)1 << 31, (size_t)1 << 31, 3, (size_t)3 << 62, 1},
      {(size_t)1 << 31, (size_t)1 << 31, 4, 0, 0},
      {(size_t)1 << 32, (size_t)1 << 32, 1, 0, 0},
      {(size_t)1 << 62, 8, 1, 0, 0},
      {(size_t)1 << 62, 2, 2, 0, 0},
      {(size_t)1 << 32, (size_t)1 << 31, 1, (size_t)1 << 63, 1},
#endif
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t out = 12345;
    int rc = ql__mul_size(cases[i].a, cases[i].b, cases[i].c, &out);
    ck_assert_msg(rc == (cases[i].ok ? 0 : QL_ESHAPE), "case %zu: rc %d", i,
                  rc);
    if (cases[i].ok)
      ck_assert_uint_eq(out, cases[i].want);
  }
}
END_TEST

/* ----------------------------------------------------------------- main */

static Suite *protocol_suite(void) {
  Suite *s = suite_create("protocol");

  TCase *tc = tcase_create("roundtrip");
  tcase_add_test(tc, test_roundtrip_hello);
  tcase_add_test(tc, test_roundtrip_load_begin);
  tcase_add_test(tc, test_roundtrip_load_chunk);
  tcase_add_test(tc, test_roundtrip_commit_abort);
  tcase_add_test(tc, test_roundtrip_unload);
  tcase_add_test(tc, test_roundtrip_list_stats);
  tcase_add_test(tc, test_roundtrip_linear);
  tcase_add_test(tc, test_roundtrip_linear_region);
  tcase_add_test(tc, test_roundtrip_response_linear);
  tcase_add_test(tc, test_roundtrip_response_error_and_hello);
  suite_add_tcase(s, tc);

  tc = tcase_create("validate");
  tcase_add_test(tc, test_validate_body);
  tcase_add_test(tc, test_validate_err_buffer);
  tcase_add_test(tc, test_validate_spec_missing);
  tcase_add_test(tc, test_validate_spec_format);
  tcase_add_test(tc, test_validate_spec_group_size);
  tcase_add_test(tc, test_validate_packed);
  tcase_add_test(tc, test_validate_load_devices);
  tcase_add_test(tc, test_validate_spec_shape);
  tcase_add_test(tc, test_validate_spec_dtype);
  tcase_add_test(tc, test_validate_spec_policy);
  tcase_add_test(tc, test_validate_chunk);
  tcase_add_test(tc, test_validate_linear_path);
  tcase_add_test(tc, test_validate_linear_x);
  tcase_add_test(tc, test_validate_linear_dtype);
  tcase_add_test(tc, test_validate_linear_dims);
  tcase_add_test(tc, test_validate_linear_range);
  tcase_add_test(tc, test_validate_linear_length);
  tcase_add_test(tc, test_validate_linear_region);
  tcase_add_test(tc, test_validate_linear_cuda);
  tcase_add_test(tc, test_slice_valid);
  suite_add_tcase(s, tc);

  tc = tcase_create("session");
  tcase_add_test(tc, test_session_messages);
  tcase_add_test(tc, test_session_decode_bad);
  tcase_add_test(tc, test_error_codes);
  suite_add_tcase(s, tc);

  tc = tcase_create("names");
  tcase_add_loop_test(tc, test_name_table, 0, N_NAMES);
  tcase_add_test(tc, test_name_null);
  suite_add_tcase(s, tc);

  tc = tcase_create("decode");
  tcase_add_test(tc, test_decode_garbage);
  tcase_add_test(tc, test_decode_empty);
  tcase_add_loop_test(tc, test_decode_truncated, 0, N_VALID);
  tcase_add_loop_test(tc, test_decode_mutations, 0, N_VALID);
  tcase_add_test(tc, test_decode_random);
  tcase_add_test(tc, test_decode_repeated_body);
  suite_add_tcase(s, tc);

  tc = tcase_create("budget");
  tcase_add_loop_test(tc, test_budget_sweep, 0, N_VALID);
  tcase_add_test(tc, test_budget_payload);
  tcase_add_test(tc, test_budget_amplification);
  suite_add_tcase(s, tc);

  tc = tcase_create("mul_size");
  tcase_add_test(tc, test_mul_size);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run_suite(protocol_suite(), CK_ENV); }
