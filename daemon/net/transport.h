/*
 * transport.h - the request sockets (qlineard.sock, admin.sock): the
 * daemon's own listener for nanomsg's SP-over-IPC framing (spframe.h),
 * on the libuv loop.
 *
 * Clients are unchanged libnanomsg (or nng) REQ sockets: the wire protocol
 * is the contract. The daemon plays a raw REP socket: it holds many
 * requests at once and answers them out of order, each reply carrying back
 * the backtrace its request came with.
 *
 * Every byte a connection sends is untrusted. A malformed stream (bad
 * protocol header, a type byte other than 1, a length past the cap or too
 * short for a backtrace, a backtrace longer than two words) closes that
 * connection, logged at debug; nothing else is affected. What a
 * connection can make the daemon hold is bounded: a frame at most the
 * message cap (its buffer grows only as its bytes arrive), queued reply
 * bytes at most two messages, all connections' buffered bytes together at
 * most max_buffered; a partial frame, a missing protocol header or a reply
 * not read that stays so for frame_timeout_ms closes the connection. The
 * number of connections is capped in all and per peer uid (SO_PEERCRED);
 * a connection past a cap is closed at once. Running out of descriptors
 * pauses accepting and retries on a timer.
 *
 * One loop thread does everything: no threads, and a request's bytes are
 * read once into a loop-wide buffer and handed to the callback in place
 * (only a frame that spans reads is kept in a buffer of its connection).
 */
#ifndef QL_TRANSPORT_H
#define QL_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "wire/protocol.h"

typedef struct ql__transport ql__transport;

/* What one listener allows. */
typedef struct ql__transport_limits {
  size_t max_msg;             /* a message body's cap (announced in Hello);
                                 frames up to max_msg + 64 are read */
  unsigned max_conns;         /* connections open at once */
  unsigned max_conns_per_uid; /* of one peer uid */
  uint64_t frame_timeout_ms;  /* a partial frame, protocol header or
                                 unread reply left so long closes its
                                 connection */
  size_t max_buffered;        /* partial frames and queued replies of all
                                 connections together */
  unsigned uid_share;         /* percent of max_buffered one uid's
                                 connections may hold (0 or 100: all) */
} ql__transport_limits;

/*
 * Called on the loop thread for each message. body[0..len) is valid only
 * during the call. route says where the reply goes: the callee owns it and
 * must hand it to exactly one ql__transport_reply() or
 * ql__transport_drop(), on the loop thread.
 */
typedef void (*ql__on_message)(void *arg, const void *body, size_t len,
                               void *route);

/*
 * Binds address ("ipc://PATH" or PATH; the caller has removed a stale
 * file) and starts accepting. On success *out is the caller's; on failure
 * the reason (the system's, e.g. a full file system) is logged and nothing
 * is left open.
 */
int ql__transport_open(uv_loop_t *loop, const char *address,
                       const ql__transport_limits *lim, ql__on_message cb,
                       void *arg, ql__transport **out);

/*
 * Packs resp and sends it back along route, on the connection the request
 * came in on. Consumes route whatever happens. Never blocks: what the
 * peer cannot take now is queued within the bounds above, and a
 * connection past them is closed (its REQ socket reconnects and resends).
 * A connection already closed drops the reply (QL_ESHUTDOWN). Loop thread.
 * Returns 0 or a QL_E* code; adds the bytes sent or queued to *bytes_out
 * if not NULL.
 */
int ql__transport_reply(void *route, const ql__msg_response *resp,
                        size_t *bytes_out);

/* Frees a route without replying. */
void ql__transport_drop(void *route);

/* Stops accepting and reading new messages (shutdown); replies can still
 * be sent. */
void ql__transport_stop(ql__transport *t);

/* What a socket counted since it opened (the metrics). */
typedef struct ql__transport_counts {
  uint64_t accepted;   /* connections accepted */
  uint64_t refused;    /* of them, closed at once: a cap was reached */
  uint64_t malformed;  /* closed for a malformed stream */
  uint64_t timed_out;  /* closed by frame_timeout_ms */
  uint64_t overflowed; /* closed past a reply or buffer bound */
  unsigned open;       /* connections open now */
} ql__transport_counts;

/* t's counts into *out; all zero for NULL (a socket not open). */
void ql__transport_counts_get(const ql__transport *t,
                              ql__transport_counts *out);

/* Closes every connection and the listening socket and removes its file,
 * and logs how many connections were refused or closed for cause; safe on
 * NULL. Routes still held stay valid (their replies are dropped).
 * The memory is freed once libuv has closed the handles. */
void ql__transport_close(ql__transport *t);

#endif /* QL_TRANSPORT_H */
