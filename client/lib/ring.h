/*
 * ring.h - libqlinear's end of a session's ring (proto/ql_ring.h):
 * requests packed into submission slots, replies copied out of completion
 * slots, each calling thread spinning briefly and then sleeping on the
 * ring's futex until its own reply is there.
 *
 * Thread-safe: any number of threads may call at once; at most `entries`
 * requests are in flight (a call that finds no free slot is told to use
 * the message path instead). Internal to the library.
 */
#ifndef QL_CLIENT_RING_H
#define QL_CLIENT_RING_H

#include <stddef.h>
#include <stdint.h>

#include "qlinear.pb-c.h"

typedef struct ql__cring ql__cring;

/*
 * Maps ring_fd (size bytes, as CreateRingResponse said) and takes over
 * both descriptors (closed here on failure too). spin_ns: how long a
 * caller spins before it sleeps. QL_EPROTO if the mapping is not a ring
 * this library speaks, or ring_fd is not a memfd of size bytes sealed
 * against shrinking and growing.
 */
int ql__cring_open(int ring_fd, int bell_fd, uint64_t size, uint64_t spin_ns,
                   ql__cring **out);

/* Unmaps it; requests still in flight are forgotten. Safe on NULL. */
void ql__cring_free(ql__cring *r);

/* Called, under the ring's lock, when the reply of a request abandoned
 * by its caller (a timeout) arrives: whatever it wrote is final then. */
typedef void (*ql__cring_late)(void *arg);

/*
 * Sends req (request_id already set) and waits up to timeout_ms (< 0:
 * forever) for its reply; alive_fd is the session socket, looked at while
 * sleeping so that a daemon gone ends the wait. On success *out is the
 * decoded Response (the caller frees it with
 * qlinear__v1__response__free_unpacked).
 *
 * QL__CRING_FALLBACK (positive): nothing was sent (no free slot, a
 * message larger than a slot, or a ring disabled or broken earlier): use
 * the message path. Errors (negative, with why[0..whylen) saying what
 * happened): QL_ETIMEDOUT:
 * the request stays in flight; late(late_arg) runs once its reply comes
 * (if it ever does), and only then. QL_ESESSION /
 * QL_EPROTO: the daemon ended the session or broke the ring's rules; the
 * ring is unusable from then on, late never runs, and what the request
 * lent is the caller's again.
 */
#define QL__CRING_FALLBACK 1
int ql__cring_call(ql__cring *r, const Qlinear__V1__Request *req,
                   int timeout_ms, int alive_fd, ql__cring_late late,
                   void *late_arg, Qlinear__V1__Response **out, char *why,
                   size_t whylen);

/* Makes every later call answer QL__CRING_FALLBACK (a forked child's
 * copy: the session is the parent's). */
void ql__cring_disable(ql__cring *r);

#endif /* QL_CLIENT_RING_H */
