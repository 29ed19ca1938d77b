/*
 * route.h - where a reply goes. A handler is given an opaque route with
 * each request and hands it to exactly one ql__route_reply() or
 * ql__route_drop(), on the loop thread. The request socket's routes
 * (transport.h) and a ring's (fastpath.h) both start with this header.
 */
#ifndef QL_ROUTE_H
#define QL_ROUTE_H

#include <stddef.h>

#include "protocol.h"

typedef struct ql__route ql__route;

typedef struct ql__route_ops {
  /* Packs resp and sends it; consumes the route whatever happens. Returns
   * 0 or a QL_E* code; adds the bytes sent to *bytes_out if not NULL. */
  int (*reply)(ql__route *rt, const ql__msg_response *resp,
               size_t *bytes_out);
  /* Frees the route without replying. */
  void (*drop)(ql__route *rt);
} ql__route_ops;

struct ql__route {
  const ql__route_ops *ops;
};

static inline int ql__route_reply(void *rt, const ql__msg_response *resp,
                                  size_t *bytes_out) {
  return ((ql__route *)rt)->ops->reply(rt, resp, bytes_out);
}

static inline void ql__route_drop(void *rt) {
  if (rt != NULL)
    ((ql__route *)rt)->ops->drop(rt);
}

#endif /* QL_ROUTE_H */
