/*
 * test_handlers.c - daemon/serve/handlers.c alone, with a fake dispatcher:
 * the body switch and the gates in front of it, for the three entry points
 * (the request socket, admin.sock and a session's ring).
 *
 * handlers.c is compiled here with the wire layer it uses (protocol.c,
 * reply.c) and nothing else of the daemon: every function of the session
 * registry, the serve files and the dispatcher that it calls is a stand-in
 * below that records its call. Requests are packed with the generated code
 * and handed over as bytes, as a transport does; replies are caught by a
 * route of this file. So each case shows which body reached which
 * handler, with which session, and what came back, without sockets,
 * threads or devices.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch/calibrate.h"
#include "dispatch/linear.h"
#include "qlineard.h"
#include "serve/handlers.h"
#include "serve/reload.h"
#include "serve/serve.h"
#include "state/session.h"
#include "testutil.h"
#include "wire/route.h"

/* ------------------------------------------------------------ the fakes */

/* What the stand-ins saw: the last handler called and with which session,
 * and how many calls each kind got. */
static struct {
  const char *last;       /* the name of the last stand-in called */
  ql__session *last_ss;   /* the session it was given */
  int calls;              /* stand-in calls in all */
  int submits;            /* ql__linear_submit / _multi */
  int settled;            /* ql__linear_when_settled */
  ql__settled_cb settled_cb;
  int quota_wait;         /* what ql__linear_quota_waits answers */
  int submit_takes;       /* what ql__linear_submit answers (1: owns it) */
  int ended;              /* ql__session_end */
  char end_why[128];
  int touched;
} fk;

/* Two sessions a token can name. */
static const uint8_t tok_a[QL_SESSION_TOKEN_BYTES] = "session-token-a";
static const uint8_t tok_b[QL_SESSION_TOKEN_BYTES] = "session-token-b";
static int sess_a, sess_b; /* their addresses stand for the sessions */
#define SS_A ((ql__session *)&sess_a)
#define SS_B ((ql__session *)&sess_b)

static void called(const char *name, ql__session *ss) {
  fk.last = name;
  fk.last_ss = ss;
  fk.calls++;
}

ql__session *ql__session_find(ql__server *s, const uint8_t *token,
                              size_t len) {
  (void)s;
  if (len == QL_SESSION_TOKEN_BYTES && memcmp(token, tok_a, len) == 0)
    return SS_A;
  if (len == QL_SESSION_TOKEN_BYTES && memcmp(token, tok_b, len) == 0)
    return SS_B;
  return NULL;
}
uint64_t ql__session_id(const ql__session *ss) { return ss == SS_A ? 1 : 2; }
uid_t ql__session_uid(const ql__session *ss) { return ss == SS_A ? 1000 : 1001; }
void ql__session_touch(ql__session *ss) {
  (void)ss;
  fk.touched++;
}
void ql__session_end(ql__session *ss, const char *why) {
  fk.ended++;
  fk.last_ss = ss;
  snprintf(fk.end_why, sizeof fk.end_why, "%s", why);
}

void ql__serve_hello(ql__server *s, const Qlinear__V1__HelloRequest *h,
                     ql__reply *r, ql__hello_buf *b) {
  (void)s, (void)h, (void)r, (void)b;
  called("hello", NULL);
}
void ql__serve_load_begin(ql__server *s, ql__session *ss,
                          const Qlinear__V1__LoadBeginRequest *b, ql__reply *r,
                          Qlinear__V1__LoadBeginResponse *out) {
  (void)s, (void)b, (void)r, (void)out;
  called("load_begin", ss);
}
void ql__serve_load_chunk(ql__server *s, ql__session *ss,
                          const Qlinear__V1__LoadChunkRequest *c, ql__reply *r,
                          Qlinear__V1__LoadChunkResponse *out) {
  (void)s, (void)c, (void)r, (void)out;
  called("load_chunk", ss);
}
int ql__serve_load_commit(ql__server *s, ql__session *ss, uint64_t id,
                          const Qlinear__V1__LoadCommitRequest *m, void *route,
                          ql__reply *r) {
  (void)s, (void)id, (void)m, (void)route, (void)r;
  called("load_commit", ss);
  return 0;
}
void ql__serve_load_abort(ql__server *s, ql__session *ss,
                          const Qlinear__V1__LoadAbortRequest *m, ql__reply *r,
                          Qlinear__V1__LoadAbortResponse *out) {
  (void)s, (void)m, (void)r, (void)out;
  called("load_abort", ss);
}
void ql__serve_unload(ql__server *s, ql__session *ss,
                      const Qlinear__V1__UnloadWeightRequest *u, ql__reply *r,
                      Qlinear__V1__UnloadWeightResponse *out) {
  (void)s, (void)u, (void)r, (void)out;
  called("unload", ss);
}
void ql__serve_hold(ql__server *s, ql__session *ss,
                    const Qlinear__V1__HoldWeightRequest *h, ql__reply *r,
                    ql__info_buf *info, Qlinear__V1__HoldWeightResponse *out) {
  (void)s, (void)h, (void)r, (void)info, (void)out;
  called("hold", ss);
}
void ql__serve_list(ql__server *s, ql__reply *r, ql__list_buf *lb) {
  (void)s, (void)r, (void)lb;
  called("list", NULL);
}
void ql__list_buf_free(ql__list_buf *lb) { (void)lb; }
void ql__serve_export(ql__server *s, ql__session *ss,
                      const Qlinear__V1__ExportWeightRequest *m, ql__reply *r,
                      ql__export_buf *b) {
  (void)s, (void)m, (void)r, (void)b;
  called("export", ss);
}
void ql__export_buf_free(ql__export_buf *b) { (void)b; }
void ql__serve_stats(ql__server *s, ql__request *req, void *route,
                     uint64_t arg) {
  (void)s, (void)req, (void)route, (void)arg;
  called("stats", NULL);
}
int ql__server_reload(ql__server *s, char *report, size_t len) {
  (void)s;
  called("reload", NULL);
  snprintf(report, len, "nothing changed");
  return 0;
}
int ql__linear_submit(ql__server *s, struct ql__session *ss, ql__request *req,
                      void *route, ql__reply *r) {
  (void)s;
  called("linear", ss);
  fk.submits++;
  if (!fk.submit_takes) {
    /* Refused: the error is in r, and handlers.c sends it. */
    ql__reply_set_error(r, QL_EEXHAUSTED, "the queue is full");
    return 0;
  }
  /* The job owns req and route: answer and free them as a worker would. */
  ql__route_drop(route);
  ql__request_free(req);
  return 1;
}
int ql__linear_submit_multi(ql__server *s, struct ql__session *ss,
                            ql__request *req, void *route, ql__reply *r) {
  (void)s, (void)r;
  called("linear_multi", ss);
  fk.submits++;
  ql__route_drop(route);
  ql__request_free(req);
  return 1;
}
void ql__linear_when_settled(ql__server *s, ql__settled_cb cb,
                             ql__request *req, void *route, uint64_t arg) {
  (void)s, (void)arg;
  fk.settled++;
  fk.settled_cb = cb;
  ql__route_drop(route);
  ql__request_free(req);
}
int ql__linear_quota_waits(ql__server *s, struct ql__session *ss) {
  (void)s, (void)ss;
  return fk.quota_wait;
}
void ql__linear_resubmit(ql__server *s, ql__request *req, void *route,
                         uint64_t arg) {
  (void)s, (void)req, (void)route, (void)arg;
}
size_t ql__linear_in_flight(const ql__server *s) {
  (void)s;
  return 3;
}
int ql__calibrate_busy(const ql__server *s) {
  (void)s;
  return 1;
}

/* ------------------------------------------------------------ the route */

/* A route that keeps the reply it is given (decoded back from its bytes,
 * as the client would read them) and counts how it was consumed. */
typedef struct catch_route {
  ql__route base;
  int replied, dropped;
  Qlinear__V1__Response *resp; /* the reply, unpacked; NULL: none */
} catch_route;

static int catch_reply(ql__route *rt, const ql__msg_response *resp,
                       size_t *bytes_out) {
  catch_route *c = (catch_route *)rt;
  size_t n = qlinear__v1__response__get_packed_size(resp);
  uint8_t *buf = tu_xmalloc(n ? n : 1);
  qlinear__v1__response__pack(resp, buf);
  c->resp = qlinear__v1__response__unpack(NULL, n, buf);
  free(buf);
  c->replied++;
  if (bytes_out != NULL)
    *bytes_out += n;
  return 0;
}
static void catch_drop(ql__route *rt) { ((catch_route *)rt)->dropped++; }
static const ql__route_ops catch_ops = {catch_reply, catch_drop, NULL, NULL,
                                        NULL};

/* ------------------------------------------------------------ helpers */

static ql__server *srv;

static void setup(void) {
  memset(&fk, 0, sizeof fk);
  fk.submit_takes = 1;
  srv = tu_xmalloc(sizeof *srv);
  memset(srv, 0, sizeof *srv);
  srv->cfg.max_message_bytes = 1 << 20;
  srv->replies.cap = &srv->cfg.max_message_bytes;
  srv->replies.counters = &srv->counters;
}
static void teardown(void) { free(srv); }

enum entry { REQUEST_SOCKET, ADMIN_SOCKET, RING };

/* Packs m and hands its bytes to the entry point; returns the route, whose
 * resp the caller frees (done()). */
static catch_route run(enum entry e, const Qlinear__V1__Request *m,
                       ql__session *ring_ss) {
  catch_route c = {{&catch_ops}, 0, 0, NULL};
  size_t n = qlinear__v1__request__get_packed_size(m);
  uint8_t *buf = tu_xmalloc(n ? n : 1);
  qlinear__v1__request__pack(m, buf);
  switch (e) {
  case REQUEST_SOCKET:
    ql__handle_message(srv, buf, n, &c);
    break;
  case ADMIN_SOCKET:
    ql__handle_admin_message(srv, buf, n, &c);
    break;
  case RING:
    ql__handlers_ring_ops.message(srv, ring_ss, buf, n, &c);
    break;
  }
  free(buf);
  /* Every request consumes its route exactly once. */
  ck_assert_int_eq(c.replied + c.dropped, 1);
  return c;
}

static void done(catch_route *c) {
  if (c->resp != NULL)
    qlinear__v1__response__free_unpacked(c->resp, NULL);
}

/* The code of the reply c caught (it must have one). */
static int code_of(const catch_route *c) {
  ck_assert_int_eq(c->replied, 1);
  ck_assert_ptr_nonnull(c->resp);
  ck_assert_ptr_nonnull(c->resp->status);
  return c->resp->status->code;
}

static const char *message_of(const catch_route *c) {
  return c->resp->status->message != NULL ? c->resp->status->message : "";
}

/* Request bodies, each with a weight name where the body needs one. */
typedef struct req_buf {
  Qlinear__V1__Request m;
  union {
    Qlinear__V1__HelloRequest hello;
    Qlinear__V1__ListWeightsRequest list;
    Qlinear__V1__StatsRequest stats;
    Qlinear__V1__ReloadConfigRequest reload;
    Qlinear__V1__UnloadWeightRequest unload;
    Qlinear__V1__HoldWeightRequest hold;
    Qlinear__V1__LoadAbortRequest abort;
  } b;
  Qlinear__V1__LinearRequest lin;
  Qlinear__V1__Tensor x;
  Qlinear__V1__RegionSlice xs, ys;
  uint64_t shape[2];
} req_buf;

static void with_token(req_buf *r, const uint8_t *tok) {
  r->m.session_token.data = (uint8_t *)tok;
  r->m.session_token.len = tok != NULL ? QL_SESSION_TOKEN_BYTES : 0;
}

static void make_hello(req_buf *r, const uint8_t *tok) {
  qlinear__v1__request__init(&r->m);
  qlinear__v1__hello_request__init(&r->b.hello);
  r->b.hello.client_name = "test";
  r->m.request_id = 7;
  r->m.body_case = QLINEAR__V1__REQUEST__BODY_HELLO;
  r->m.hello = &r->b.hello;
  with_token(r, tok);
}

static void make_list(req_buf *r, const uint8_t *tok) {
  qlinear__v1__request__init(&r->m);
  qlinear__v1__list_weights_request__init(&r->b.list);
  r->m.request_id = 8;
  r->m.body_case = QLINEAR__V1__REQUEST__BODY_LIST;
  r->m.list = &r->b.list;
  with_token(r, tok);
}

static void make_reload(req_buf *r, const uint8_t *tok) {
  qlinear__v1__request__init(&r->m);
  qlinear__v1__reload_config_request__init(&r->b.reload);
  r->m.request_id = 9;
  r->m.body_case = QLINEAR__V1__REQUEST__BODY_RELOAD;
  r->m.reload = &r->b.reload;
  with_token(r, tok);
}

static void make_unload(req_buf *r, const uint8_t *tok) {
  qlinear__v1__request__init(&r->m);
  qlinear__v1__unload_weight_request__init(&r->b.unload);
  r->b.unload.name = "layer0";
  r->m.request_id = 10;
  r->m.body_case = QLINEAR__V1__REQUEST__BODY_UNLOAD;
  r->m.unload = &r->b.unload;
  with_token(r, tok);
}

/* A Linear request of 1 x 4 f32 in a region, y into the region too
 * (ring_ok) or inline. */
static void make_linear(req_buf *r, const uint8_t *tok, int ring_ok) {
  qlinear__v1__request__init(&r->m);
  qlinear__v1__linear_request__init(&r->lin);
  qlinear__v1__tensor__init(&r->x);
  qlinear__v1__region_slice__init(&r->xs);
  qlinear__v1__region_slice__init(&r->ys);
  r->shape[0] = 1;
  r->shape[1] = 4;
  r->x.dtype = QLINEAR__V1__DTYPE__DTYPE_F32;
  r->x.n_shape = 2;
  r->x.shape = r->shape;
  r->xs.region_id = 1;
  r->xs.length = 16;
  r->x.data_case = QLINEAR__V1__TENSOR__DATA_REGION;
  r->x.region = &r->xs;
  r->ys.region_id = 1;
  r->ys.offset = 64;
  r->ys.length = 32;
  r->lin.weight = "layer0";
  r->lin.x = &r->x;
  r->lin.y_out = ring_ok ? &r->ys : NULL;
  r->m.request_id = 11;
  r->m.body_case = QLINEAR__V1__REQUEST__BODY_LINEAR;
  r->m.linear = &r->lin;
  with_token(r, tok);
}

/* ------------------------------------------------------------ cases */

START_TEST(hello_needs_no_session) {
  req_buf r;
  make_hello(&r, NULL);
  catch_route c = run(REQUEST_SOCKET, &r.m, NULL);
  ck_assert_int_eq(code_of(&c), 0);
  ck_assert_str_eq(fk.last, "hello");
  ck_assert_uint_eq(c.resp->request_id, 7);
  ck_assert_uint_eq(srv->counters.requests, 1);
  ck_assert_uint_gt(srv->counters.bytes_in, 0);
  done(&c);
}
END_TEST

START_TEST(other_bodies_need_a_session) {
  req_buf r;
  make_list(&r, NULL);
  catch_route c = run(REQUEST_SOCKET, &r.m, NULL);
  ck_assert_int_eq(code_of(&c), QL_ESESSION);
  ck_assert_ptr_nonnull(strstr(message_of(&c), "no session token"));
  ck_assert_uint_eq(c.resp->request_id, 8);
  done(&c);
  static const uint8_t stale[QL_SESSION_TOKEN_BYTES] = "stale-token-xyz";
  make_linear(&r, stale, 0);
  c = run(REQUEST_SOCKET, &r.m, NULL);
  ck_assert_int_eq(code_of(&c), QL_ESESSION);
  ck_assert_ptr_nonnull(strstr(message_of(&c), "unknown session token"));
  done(&c);
  /* Nothing behind the gate ran; both refusals are counted as errors. */
  ck_assert_int_eq(fk.calls, 0);
  ck_assert_uint_eq(srv->counters.errors, 2);
  ck_assert_uint_eq(srv->counters.errors_by_code[ql__err_slot(QL_ESESSION)],
                    2);
}
END_TEST

START_TEST(a_request_acts_for_its_session) {
  req_buf r;
  make_unload(&r, tok_b);
  catch_route c = run(REQUEST_SOCKET, &r.m, NULL);
  ck_assert_int_eq(code_of(&c), 0);
  ck_assert_str_eq(fk.last, "unload");
  ck_assert_ptr_eq(fk.last_ss, SS_B);
  done(&c);
  make_linear(&r, tok_a, 0);
  c = run(REQUEST_SOCKET, &r.m, NULL);
  /* The dispatcher took it: the route is its, handlers.c sent nothing. */
  ck_assert_int_eq(c.replied, 0);
  ck_assert_int_eq(c.dropped, 1);
  ck_assert_str_eq(fk.last, "linear");
  ck_assert_ptr_eq(fk.last_ss, SS_A);
  done(&c);
}
END_TEST

START_TEST(admin_socket_gates) {
  req_buf r;
  /* No token needed there, and none is looked at. */
  make_unload(&r, NULL);
  catch_route c = run(ADMIN_SOCKET, &r.m, NULL);
  ck_assert_int_eq(code_of(&c), 0);
  ck_assert_str_eq(fk.last, "unload");
  ck_assert_ptr_null(fk.last_ss);
  done(&c);
  /* Linear is refused on the admin socket... */
  int before = fk.calls;
  make_linear(&r, NULL, 1);
  c = run(ADMIN_SOCKET, &r.m, NULL);
  ck_assert_int_eq(code_of(&c), QL_EPERM);
  ck_assert_ptr_nonnull(strstr(message_of(&c), "request socket"));
  ck_assert_int_eq(fk.calls, before);
  done(&c);
  /* ...and reload everywhere else. */
  make_reload(&r, tok_a);
  c = run(REQUEST_SOCKET, &r.m, NULL);
  ck_assert_int_eq(code_of(&c), QL_EPERM);
  ck_assert_ptr_nonnull(strstr(message_of(&c), "admin socket"));
  ck_assert_int_eq(fk.calls, before);
  done(&c);
  make_reload(&r, NULL);
  c = run(ADMIN_SOCKET, &r.m, NULL);
  ck_assert_int_eq(code_of(&c), 0);
  ck_assert_str_eq(fk.last, "reload");
  ck_assert_str_eq(c.resp->reload->report, "nothing changed");
  done(&c);
}
END_TEST

START_TEST(ring_carries_linear_with_y_in_place_only) {
  req_buf r;
  /* The ring's session is the owner; the request needs no token. */
  make_linear(&r, NULL, 1);
  catch_route c = run(RING, &r.m, SS_B);
  ck_assert_int_eq(c.replied, 0);
  ck_assert_str_eq(fk.last, "linear");
  ck_assert_ptr_eq(fk.last_ss, SS_B);
  ck_assert_int_eq(fk.touched, 1);
  done(&c);
  int before = fk.calls;
  make_linear(&r, NULL, 0); /* y inline: a completion carries no data */
  c = run(RING, &r.m, SS_B);
  ck_assert_int_eq(code_of(&c), QL_EINVAL);
  ck_assert_ptr_nonnull(strstr(message_of(&c), "y_out"));
  done(&c);
  make_list(&r, NULL);
  c = run(RING, &r.m, SS_B);
  ck_assert_int_eq(code_of(&c), QL_EPROTO);
  ck_assert_ptr_nonnull(strstr(message_of(&c), "request socket"));
  done(&c);
  ck_assert_int_eq(fk.calls, before);
  /* A ring that broke its rules ends its session, with the reason. */
  ql__handlers_ring_ops.violation(srv, SS_A, "bad slot index");
  ck_assert_int_eq(fk.ended, 1);
  ck_assert_ptr_eq(fk.last_ss, SS_A);
  ck_assert_str_eq(fk.end_why, "bad slot index");
}
END_TEST

START_TEST(linear_waits_or_is_refused_by_the_dispatcher) {
  req_buf r;
  /* Over its quota with work outstanding: the request waits for the
   * session's replies to settle, then is resubmitted. */
  fk.quota_wait = 1;
  make_linear(&r, tok_a, 0);
  catch_route c = run(REQUEST_SOCKET, &r.m, NULL);
  ck_assert_int_eq(c.replied, 0);
  ck_assert_int_eq(fk.settled, 1);
  ck_assert_ptr_eq((void *)fk.settled_cb, (void *)ql__linear_resubmit);
  ck_assert_int_eq(fk.submits, 0);
  done(&c);
  /* Refused by the dispatcher: its error goes out from here. */
  fk.quota_wait = 0;
  fk.submit_takes = 0;
  c = run(REQUEST_SOCKET, &r.m, NULL);
  ck_assert_int_eq(fk.submits, 1);
  ck_assert_int_eq(code_of(&c), QL_EEXHAUSTED);
  ck_assert_str_eq(message_of(&c), "the queue is full");
  done(&c);
  /* Stats waits for the loop to settle too. */
  req_buf st;
  qlinear__v1__request__init(&st.m);
  qlinear__v1__stats_request__init(&st.b.stats);
  st.m.body_case = QLINEAR__V1__REQUEST__BODY_STATS;
  st.m.stats = &st.b.stats;
  with_token(&st, tok_a);
  c = run(REQUEST_SOCKET, &st.m, NULL);
  ck_assert_int_eq(fk.settled, 2);
  ck_assert_ptr_eq((void *)fk.settled_cb, (void *)ql__serve_stats);
  done(&c);
}
END_TEST

START_TEST(bad_bytes_and_stopping) {
  /* Not a Request: answered under id 0, nothing behind it runs. */
  static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x01};
  catch_route c = {{&catch_ops}, 0, 0, NULL};
  ql__handle_message(srv, junk, sizeof junk, &c);
  ck_assert_int_eq(code_of(&c), QL_EPROTO);
  ck_assert_uint_eq(c.resp->request_id, 0);
  done(&c);
  /* An invalid Linear (no x) is refused before the dispatcher sees it. */
  req_buf r;
  make_linear(&r, tok_a, 0);
  r.lin.x = NULL;
  c = run(REQUEST_SOCKET, &r.m, NULL);
  ck_assert_int_ne(code_of(&c), 0);
  ck_assert_uint_eq(c.resp->request_id, 11);
  done(&c);
  ck_assert_int_eq(fk.calls, 0);
  /* While stopping, sessions' requests are refused. */
  srv->stopping = 1;
  make_list(&r, tok_a);
  c = run(REQUEST_SOCKET, &r.m, NULL);
  ck_assert_int_eq(code_of(&c), QL_ESHUTDOWN);
  done(&c);
  ck_assert_int_eq(fk.calls, 0);
  /* The drain counts commits, linear jobs and a calibration. */
  srv->commits_running = 2;
  ck_assert_uint_eq(ql__handlers_in_flight(srv), 2 + 3 + 1);
}
END_TEST

static Suite *handlers_suite(void) {
  Suite *s = suite_create("handlers");
  TCase *tc = tcase_create("gates");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, hello_needs_no_session);
  tcase_add_test(tc, other_bodies_need_a_session);
  tcase_add_test(tc, a_request_acts_for_its_session);
  tcase_add_test(tc, admin_socket_gates);
  tcase_add_test(tc, ring_carries_linear_with_y_in_place_only);
  tcase_add_test(tc, linear_waits_or_is_refused_by_the_dispatcher);
  tcase_add_test(tc, bad_bytes_and_stopping);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run_suite(handlers_suite(), CK_ENV); }
