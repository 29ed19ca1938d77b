/*
 * route.h - where a reply goes. A handler is given an opaque route with
 * each request and hands it to exactly one ql__route_reply() or
 * ql__route_drop(), on the loop thread. The request socket's routes
 * (transport.h) and a ring's (net/ring.h) both start with this header.
 */
#ifndef QL_ROUTE_H
#define QL_ROUTE_H

#include <stddef.h>

#include "wire/protocol.h"

typedef struct ql__route ql__route;

typedef struct ql__route_ops {
  /* Packs resp and sends it; consumes the route whatever happens. Returns
   * 0 or a QL_E* code; adds the bytes sent to *bytes_out if not NULL. */
  int (*reply)(ql__route *rt, const ql__msg_response *resp,
               size_t *bytes_out);
  /* Frees the route without replying. */
  void (*drop)(ql__route *rt);
  /* Optional (NULL: not offered). Sends the reply now, from any thread
   * (a device worker, the moment its kernel is done), and returns 1; the
   * loop then consumes the route with done() instead of reply(). */
  int (*early)(ql__route *rt, const ql__msg_response *resp);
  /* Consumes a route whose reply early() sent (loop thread). */
  void (*done)(ql__route *rt, size_t *bytes_out);
  /* Optional: the request starts on a device that leaves CPUs free
   * (spare 1) or uses them all (0); a client may wait accordingly. */
  void (*dispatched)(ql__route *rt, int spare);
} ql__route_ops;

struct ql__route {
  const ql__route_ops *ops;
};

static inline int ql__route_reply(void *rt, const ql__msg_response *resp,
                                  size_t *bytes_out) {
  return ((ql__route *)rt)->ops->reply(rt, resp, bytes_out);
}

/* Whether the route takes a reply through early(). */
static inline int ql__route_has_early(const void *rt) {
  return ((const ql__route *)rt)->ops->early != NULL;
}

/* 1 if the reply went now through early(), else 0 (send it later). */
static inline int ql__route_early(void *rt, const ql__msg_response *resp) {
  const ql__route_ops *ops = ((ql__route *)rt)->ops;
  return ops->early != NULL && ops->early(rt, resp);
}

static inline void ql__route_done(void *rt, size_t *bytes_out) {
  ((ql__route *)rt)->ops->done(rt, bytes_out);
}

static inline void ql__route_dispatched(void *rt, int spare) {
  const ql__route_ops *ops = ((ql__route *)rt)->ops;
  if (ops->dispatched != NULL)
    ops->dispatched(rt, spare);
}

static inline void ql__route_drop(void *rt) {
  if (rt != NULL)
    ((ql__route *)rt)->ops->drop(rt);
}

#endif /* QL_ROUTE_H */
