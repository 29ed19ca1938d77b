/*
 * reply.h - building and sending a Response: every reply carries a Status,
 * errors carry a QL_E* code and a message, and a reply that would exceed
 * the announced message cap becomes an error the client can read.
 */
#ifndef QL_REPLY_H
#define QL_REPLY_H

#include <stddef.h>
#include <stdint.h>

#include "wire/counters.h"
#include "wire/protocol.h"

/* Where sent replies are counted, and the cap they must fit: the server's
 * own (ql__server.replies), so the wire layer needs no server. cap points
 * at the live option, which a reload may change. */
typedef struct ql__reply_sink {
  const size_t *cap;       /* max_message_bytes */
  ql__counters *counters;  /* errors, errors by code, bytes out */
} ql__reply_sink;

/* A Response and the Status and message buffer it points to. A body set
 * on resp must stay alive until ql__reply_send(). */
typedef struct ql__reply {
  ql__msg_response resp;
  Qlinear__V1__Status status;
  char msg[256];
} ql__reply;

/* An empty success reply to request_id. */
void ql__reply_init(ql__reply *r, uint64_t request_id);

/* Makes r an error (code < 0) without a body; the message is formatted. */
void ql__reply_set_error(ql__reply *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Sends r along route (consumed) and counts it in k. Loop thread. */
void ql__reply_send(ql__reply_sink *k, void *route, ql__reply *r);

/* Replies with an error and no body; text NULL or "": ql_strerror(code). */
void ql__reply_error(ql__reply_sink *k, void *route, uint64_t id, int code,
                     const char *text);

#endif /* QL_REPLY_H */
