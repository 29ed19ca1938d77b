/*
 * transport.h - the request socket: a raw nanomsg REP socket (AF_SP_RAW)
 * polled from the libuv loop through NN_RCVFD.
 *
 * Raw mode lets the daemon hold many requests at once and answer them out
 * of order: each received message comes with its control header (the
 * nanomsg backtrace naming the peer pipe and its request), which the reply
 * must carry back. NN_RCVFD is level-triggered and must never be read; the
 * loop receives with NN_DONTWAIT until EAGAIN.
 */
#ifndef QL_TRANSPORT_H
#define QL_TRANSPORT_H

#include <stddef.h>

#include <uv.h>

#include "protocol.h"

typedef struct ql__transport ql__transport;

/*
 * Called on the loop thread for each message. body[0..len) is valid only
 * during the call. route says where the reply goes (a copy of the message's
 * control header): the callee owns it and must hand it to exactly one
 * ql__transport_reply() or ql__transport_drop().
 */
typedef void (*ql__on_message)(void *arg, const void *body, size_t len,
                               void *route);

/*
 * Binds address ("ipc://...") with messages larger than max_msg refused by
 * nanomsg, and starts polling. On success *out is the caller's; on
 * failure the reason (the system's, e.g. a full file system) is logged.
 */
int ql__transport_open(uv_loop_t *loop, const char *address, size_t max_msg,
                       ql__on_message cb, void *arg, ql__transport **out);

/*
 * Packs resp and sends it back along route, on the transport the request
 * came in on (which must still be open). Consumes route whatever happens.
 * Never blocks: a reply the peer cannot take now is dropped (its REQ socket
 * resends after its resend interval). May be called from any thread.
 * Returns 0 or a QL_E* code; adds the bytes sent to *bytes_out if not NULL.
 */
int ql__transport_reply(void *route, const ql__msg_response *resp,
                        size_t *bytes_out);

/* Frees a control header without replying. */
void ql__transport_drop(void *route);

/* Stops reading new messages (shutdown); replies can still be sent. */
void ql__transport_stop(ql__transport *t);

/* Closes the socket and the poll handle; safe on NULL. The memory is freed
 * once libuv has closed the handle. */
void ql__transport_close(ql__transport *t);

#endif /* QL_TRANSPORT_H */
