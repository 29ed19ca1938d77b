/*
 * ring.h - a session's shared-memory ring (proto/ql_ring.h): the
 * daemon's reader of requests and writer of completions.
 *
 * A ring carries Linear and LinearMulti requests whose results go to the
 * session's regions or device memory; each is handed up, through the
 * message callback the rings were opened with, to be handled exactly as
 * on the request socket (the same decoding, checks, quotas, deadlines and
 * scheduler), and its Response is packed into a completion slot instead
 * of a socket. The ring knows nothing of sessions or handlers: it calls
 * up only through ql__dring_ops (as a transport does, transport.h). Everything here runs on the loop thread, which never
 * blocks on the ring: it reads a ring when its doorbell (an eventfd the
 * loop polls) rings, and keeps polling a ring that was busy within the
 * last ring_spin_us without sleeping (a uv_idle handle), so that a client
 * sending request after request never needs the doorbell. An idle daemon
 * sleeps: rings cost nothing until used.
 *
 * The ring is untrusted memory: a client may write anything there at any
 * time. A slot is copied out once and then decoded; a producer index out of
 * range ends the session. The daemon takes a request only while the
 * completion queue has room for it and every request it already took, so a
 * client that stops consuming completions stalls its own ring and nothing
 * else, and no reply is ever dropped for want of room.
 */
#ifndef QL_DRING_H
#define QL_DRING_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "wire/counters.h"

typedef struct ql__drings ql__drings;
typedef struct ql__dring ql__dring;

/* What a ring calls up, on the loop thread; arg is ql__drings_open's,
 * owner the ring's (ql__dring_create). */
typedef struct ql__dring_ops {
  /* A request copied out of owner's ring (len bytes of buf, valid for
   * the call only): handle it and answer it through route, a ql__route
   * (route.h) that the callee owns from then on. */
  void (*message)(void *arg, void *owner, const void *buf, size_t len,
                  void *route);
  /* owner's client broke the ring's rules (why says how): end what the
   * ring belongs to, which ends the ring (ql__dring_end). */
  void (*violation)(void *arg, void *owner, const char *why);
} ql__dring_ops;

/* What the rings counted themselves, for Stats and the metrics. */
typedef struct ql__dring_counts {
  uint64_t taken;     /* requests taken from rings */
  uint64_t answered;  /* of them, answered by the ring itself (a slot it
                         could not read, no memory for a route) */
  uint64_t bytes_out; /* bytes of those answers */
  uint64_t errors[QL__ERR_SLOTS + 1]; /* those answers by code
                                         (ql__err_slot) */
} ql__dring_counts;

/* The daemon's set of rings and its spin handle on loop. A ring keeps
 * polling for *spin_us after it was busy (read on every use: the owner
 * may change it live, on the loop thread). ops (kept, not copied) and arg
 * are what rings call up with. On success *out is the caller's, released
 * by ql__drings_close(). */
int ql__drings_open(uv_loop_t *loop, const uint32_t *spin_us,
                       const ql__dring_ops *ops, void *arg,
                       ql__drings **out);

/* Adds what the rings counted so far to *out. */
void ql__drings_counts(const ql__drings *fps, ql__dring_counts *out);

/* Closes the spin handle once every ring ended (ql__dring_end); the
 * memory is freed by libuv's close callback. Safe on NULL. */
void ql__drings_close(ql__drings *fps);

/*
 * Makes a ring of entries slots per queue (0: QL_RING_DEFAULT_ENTRIES;
 * else a power of two in [QL_RING_MIN_ENTRIES, QL_RING_MAX_ENTRIES]) for
 * owner (passed to the ops; owner_id names it in the log). On success *ring_fd (the sealed memfd) and *bell_fd (the
 * eventfd the client writes) are descriptors for the caller to pass to the
 * client and then close, and *out is the session's until ql__dring_end.
 * QL_EINVAL for a bad size, QL_ENOMEM / QL_EEXHAUSTED / QL_EIO from the
 * system, with err set.
 */
int ql__dring_create(ql__drings *fps, void *owner, uint64_t owner_id,
                        uint32_t entries, ql__dring **out, int *ring_fd,
                        int *bell_fd, char *err, size_t errlen);

/* Bytes of its mapping (counted against the session's region bytes). */
uint64_t ql__dring_bytes(const ql__dring *fp);

/*
 * Its owner ended: the ring reads nothing more, replies still to come
 * are dropped, and it is unmapped once the last request that holds it has
 * been answered. Safe on NULL.
 */
void ql__dring_end(ql__dring *fp);

#endif /* QL_DRING_H */
