/* handlers.c - see handlers.h. */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "serve/handlers.h"
#include "serve/serve.h"
#include "dispatch/calibrate.h"
#include "dispatch/linear.h"
#include "wire/protocol.h"
#include "serve/reload.h"
#include "wire/reply.h"
#include "state/session.h"



/* -------------------------------------------------------------- dispatch */

size_t ql__handlers_in_flight(const ql__server *s) {
  return s->commits_running + ql__linear_in_flight(s) +
         (size_t)ql__calibrate_busy(s);
}


/*
 * What a ring carries (net/ring.h): Linear and LinearMulti whose results
 * go where the client can read them without a reply body (its regions or
 * device memory); a completion slot carries no tensor data.
 */
static int ring_body(const ql__msg_request *m, char *err, size_t errlen) {
  if (m->body_case == QLINEAR__V1__REQUEST__BODY_LINEAR) {
    const Qlinear__V1__LinearRequest *l = m->linear;
    if (l->y_out == NULL && l->y_out_cuda == NULL && l->y_out_ze == NULL) {
      snprintf(err, errlen, "linear: on the ring, y_out must name a region "
               "or device slice (a completion carries no tensor data)");
      return QL_EINVAL;
    }
    return 0;
  }
  if (m->body_case == QLINEAR__V1__REQUEST__BODY_LINEAR_MULTI) {
    const Qlinear__V1__LinearMultiRequest *l = m->linear_multi;
    if (l->n_y_out == 0 && l->n_y_out_cuda == 0 && l->n_y_out_ze == 0) {
      snprintf(err, errlen, "linear_multi: on the ring, y_out must name "
               "region or device slices (a completion carries no tensor "
               "data)");
      return QL_EINVAL;
    }
    return 0;
  }
  snprintf(err, errlen, "the ring carries linear and linear_multi requests "
           "only; the rest goes to the request socket");
  return QL_EPROTO;
}

/*
 * Both sockets' requests, and a ring's (ring_ss: the ring's session, whose
 * requests need no token). admin: from admin.sock, whose directory is the
 * access check (only the admin group may enter it); its requests carry no
 * session token and act for the admin socket as a whole.
 */
static void handle(ql__server *s, int admin, ql__session *ring_ss,
                   const void *buf, size_t len, void *route) {
  char err[256] = "";
  ql__request *req = NULL;
  s->counters.requests++;
  s->counters.bytes_in += len;

  /* The budget bounds what a message may make the unpacker allocate: the
   * bytes it carries plus room for its structure. */
  int rc = ql__request_decode(buf, len, len + (1u << 20), &req, err,
                              sizeof err);
  if (rc != 0) {
    ql__reply_error(&s->replies, route, 0, rc, err);
    return;
  }
  const ql__msg_request *m = req->msg;
  /* Every body but Hello (discovery) runs in a session: its token comes
   * first, before anything else about the request is looked at. */
  ql__session *ss = ring_ss;
  if (ss == NULL && !admin &&
      m->body_case != QLINEAR__V1__REQUEST__BODY_HELLO &&
      (ss = ql__session_find(s, m->session_token.data,
                             m->session_token.len)) == NULL) {
    ql__reply_error(&s->replies, route, m->request_id, QL_ESESSION,
                m->session_token.len == 0
                    ? "the request carries no session token (open a session "
                      "on session.sock first)"
                    : "unknown session token (the session ended, or the "
                      "daemon restarted)");
    ql__request_free(req);
    return;
  }
  if ((rc = ql__request_check_strings(buf, len, err, sizeof err)) != 0 ||
      (rc = ql__request_validate(m, err, sizeof err)) != 0) {
    ql__reply_error(&s->replies, route, m->request_id, rc, err);
    ql__request_free(req);
    return;
  }
  if (s->stopping) {
    ql__reply_error(&s->replies, route, m->request_id, QL_ESHUTDOWN, "daemon is stopping");
    ql__request_free(req);
    return;
  }
  /* Each socket has its own work: computing runs in sessions, which own
   * regions and quotas; administration only where the admin group is. */
  const char *refused = NULL;
  if (admin && (m->body_case == QLINEAR__V1__REQUEST__BODY_LINEAR ||
                m->body_case == QLINEAR__V1__REQUEST__BODY_LINEAR_MULTI))
    refused = "linear requests go to the request socket, in a session";
  else if (!admin && m->body_case == QLINEAR__V1__REQUEST__BODY_RELOAD)
    refused = "reload_config goes through the admin socket";
  if (ring_ss != NULL && refused == NULL && (rc = ring_body(m, err,
                                                            sizeof err))) {
    ql__reply_error(&s->replies, route, m->request_id, rc, err);
    ql__request_free(req);
    return;
  }
  if (refused != NULL) {
    ql__reply_error(&s->replies, route, m->request_id, QL_EPERM, refused);
    ql__request_free(req);
    return;
  }

  ql__reply r;
  ql__reply_init(&r, m->request_id);
  /* Bodies referenced by r live in this frame until send_reply below. */
  union {
    Qlinear__V1__LoadBeginResponse begin;
    Qlinear__V1__LoadChunkResponse chunk;
    Qlinear__V1__LoadAbortResponse abort;
    Qlinear__V1__UnloadWeightResponse unload;
    Qlinear__V1__ReloadConfigResponse reload;
    Qlinear__V1__HoldWeightResponse hold;
    ql__hello_buf hello;
  } body;
  ql__info_buf hold_info;
  char report[1024];
  ql__list_buf lc = {0};
  ql__export_buf eb = {0};

  switch (m->body_case) {
  case QLINEAR__V1__REQUEST__BODY_HELLO:
    ql__serve_hello(s, m->hello, &r, &body.hello);
    break;
  case QLINEAR__V1__REQUEST__BODY_LOAD_BEGIN:
    ql__serve_load_begin(s, ss, m->load_begin, &r, &body.begin);
    break;
  case QLINEAR__V1__REQUEST__BODY_LOAD_CHUNK:
    ql__serve_load_chunk(s, ss, m->load_chunk, &r, &body.chunk);
    break;
  case QLINEAR__V1__REQUEST__BODY_LOAD_COMMIT:
    if (ql__serve_load_commit(s, ss, m->request_id, m->load_commit, route, &r)) {
      ql__request_free(req);
      return;
    }
    break;
  case QLINEAR__V1__REQUEST__BODY_LOAD_ABORT:
    ql__serve_load_abort(s, ss, m->load_abort, &r, &body.abort);
    break;
  case QLINEAR__V1__REQUEST__BODY_UNLOAD:
    ql__serve_unload(s, ss, m->unload, &r, &body.unload);
    break;
  case QLINEAR__V1__REQUEST__BODY_HOLD:
    ql__serve_hold(s, ss, m->hold, &r, &hold_info, &body.hold);
    break;
  case QLINEAR__V1__REQUEST__BODY_LIST:
    ql__serve_list(s, &r, &lc);
    break;
  case QLINEAR__V1__REQUEST__BODY_EXPORT_WEIGHT:
    ql__serve_export(s, ss, m->export_weight, &r, &eb);
    break;
  case QLINEAR__V1__REQUEST__BODY_LINEAR:
  case QLINEAR__V1__REQUEST__BODY_LINEAR_MULTI:
    if (ql__linear_quota_waits(s, ss)) {
      ql__linear_when_settled(s, ql__linear_resubmit, req, route,
                              ql__session_id(ss));
      return; /* the wait owns req and route now */
    }
    if (m->body_case == QLINEAR__V1__REQUEST__BODY_LINEAR_MULTI
            ? ql__linear_submit_multi(s, ss, req, route, &r)
            : ql__linear_submit(s, ss, req, route, &r))
      return; /* the job owns req and route now */
    break;
  case QLINEAR__V1__REQUEST__BODY_STATS:
    /* After the loop has accounted every launch whose reply a worker
     * sent itself: what a client was answered is in what it reads. */
    /* arg: the uid whose share it shows, + 1 (0: the admin's, all). */
    ql__linear_when_settled(s, ql__serve_stats, req, route,
                            ss != NULL ? (uint64_t)ql__session_uid(ss) + 1
                                       : 0);
    return; /* the reply owns req and route now */
  case QLINEAR__V1__REQUEST__BODY_RELOAD:
    if ((rc = ql__server_reload(s, report, sizeof report)) != 0) {
      ql__reply_set_error(&r, rc, "reload: %s", report);
      break;
    }
    qlinear__v1__reload_config_response__init(&body.reload);
    body.reload.report = report;
    r.resp.body_case = QLINEAR__V1__RESPONSE__BODY_RELOAD;
    r.resp.reload = &body.reload;
    break;
  default:
    ql__reply_set_error(&r, QL_EPROTO, "request has no known body");
    break;
  }
  ql__reply_send(&s->replies, route, &r);
  ql__list_buf_free(&lc);
  ql__export_buf_free(&eb);
  ql__request_free(req);
}

void ql__handle_message(void *arg, const void *buf, size_t len, void *route) {
  handle(arg, 0, NULL, buf, len, route);
}

void ql__handle_admin_message(void *arg, const void *buf, size_t len,
                              void *route) {
  handle(arg, 1, NULL, buf, len, route);
}

static void ring_message(void *arg, void *owner, const void *buf, size_t len,
                         void *route) {
  ql__session *ss = owner;
  ql__session_touch(ss);
  handle(arg, 0, ss, buf, len, route);
}

static void ring_violation(void *arg, void *owner, const char *why) {
  (void)arg;
  ql__session_end(owner, why);
}

const ql__dring_ops ql__handlers_ring_ops = {ring_message, ring_violation};

