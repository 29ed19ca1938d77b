/* reply.c - see reply.h. */
#include <stdarg.h>
#include <stdio.h>

#include "log.h"
#include "wire/reply.h"
#include "wire/route.h"

void ql__reply_init(ql__reply *r, uint64_t request_id) {
  qlinear__v1__response__init(&r->resp);
  qlinear__v1__status__init(&r->status);
  r->resp.request_id = request_id;
  r->resp.status = &r->status;
  r->msg[0] = '\0';
  r->status.message = r->msg;
}

void ql__reply_send(ql__reply_sink *k, void *route, ql__reply *r) {
  /* Clients receive at most the announced cap: a reply that outgrew it
   * (a very long listing) becomes an error they can read. */
  if (r->status.code == 0 && qlinear__v1__response__get_packed_size(&r->resp) >
                                 *k->cap) {
    r->status.code = QL_ETOOBIG;
    r->resp.body_case = QLINEAR__V1__RESPONSE__BODY__NOT_SET;
    snprintf(r->msg, sizeof r->msg, "the reply would exceed the %zu-byte "
             "message cap", *k->cap);
  }
  if (r->status.code != 0) {
    k->counters->errors++;
    k->counters->errors_by_code[ql__err_slot(r->status.code)]++;
    ql__debug("request %llu failed: %s: %s",
              (unsigned long long)r->resp.request_id,
              ql_err_name(r->status.code), r->msg);
  }
  ql__route_reply(route, &r->resp, &k->counters->bytes_out);
}

void ql__reply_set_error(ql__reply *r, int code, const char *fmt, ...) {
  r->status.code = code;
  r->resp.body_case = QLINEAR__V1__RESPONSE__BODY__NOT_SET;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->msg, sizeof r->msg, fmt, ap);
  va_end(ap);
}

void ql__reply_error(ql__reply_sink *k, void *route, uint64_t id, int code,
                     const char *text) {
  ql__reply r;
  ql__reply_init(&r, id);
  ql__reply_set_error(&r, code, "%s", text && *text ? text : ql_strerror(code));
  ql__reply_send(k, route, &r);
}
