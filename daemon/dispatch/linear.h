/*
 * linear.h - Linear requests from arrival to reply (DESIGN §6): checked
 * and routed here (path by the request's own row count), queued in the
 * scheduler (scheduler.h), run as coalesced batches on the device worker,
 * and answered one by one as their rows complete.
 *
 * Everything here runs on the loop thread except the kernels, which run
 * on the device worker on batches that hold references to everything they
 * read or write (weight, regions, the requests' buffers).
 */
#ifndef QL_LINEAR_H
#define QL_LINEAR_H

#include <stddef.h>
#include <stdint.h>

#include "wire/protocol.h"
#include "qlineard.h"
#include "wire/reply.h"

struct ql__session;

/* Makes s->sched from s->cfg and hooks the weights' end into it. 0 or a
 * QL_E* code. */
int ql__linear_open(ql__server *s);

/* Applies the live options (SIGHUP, ReloadConfig). */
void ql__linear_configure(ql__server *s);

/* Closes the timers (with the loop's other handles). */
void ql__linear_close_timers(ql__server *s);

/* Frees the scheduler; call once nothing is in flight (after the worker
 * closed) and after the weight store (weights tell it when they go). Safe
 * when ql__linear_open() failed or never ran, and with the timers still
 * open (a start that failed later): it closes them and runs the loop once
 * for their callbacks. */
void ql__linear_close(ql__server *s);

/*
 * A Linear request of session ss. Returns 1 when it was accepted: req and
 * route are then owned here and answered later. Returns 0 with r set to
 * the error otherwise (req and route stay the caller's).
 */
int ql__linear_submit(ql__server *s, struct ql__session *ss,
                      ql__request *req, void *route, ql__reply *r);

/* The same for a LinearMulti request: one part per weight, each queued as
 * a request of its own; answered when all are done. */
int ql__linear_submit_multi(ql__server *s, struct ql__session *ss,
                            ql__request *req, void *route, ql__reply *r);

/*
 * Calls cb(s, req, route, arg) once every launch whose reply a device
 * worker sent itself (route.h, early) before this call has been accounted
 * by the loop: at once when none is pending. A Stats request waits so: a
 * client reads its own replies in the counters. cb owns req and route;
 * requests still waiting at shutdown are dropped unanswered
 * (ql__linear_close_timers).
 */
typedef void (*ql__settled_cb)(ql__server *s, ql__request *req, void *route,
                               uint64_t arg);
void ql__linear_when_settled(ql__server *s, ql__settled_cb cb,
                             ql__request *req, void *route, uint64_t arg);

/*
 * Whether a Linear or LinearMulti request of session ss would be refused
 * by the session's quota only because of requests already answered early
 * whose launches the loop has not accounted yet. Such a request waits for
 * them (ql__linear_resubmit) rather than being refused: its client, which
 * has its replies, has nothing outstanding.
 */
int ql__linear_quota_waits(ql__server *s, struct ql__session *ss);

/* ql__linear_when_settled's callback for such a request: submits it for
 * the session of id arg, or drops it when that session has ended. */
void ql__linear_resubmit(ql__server *s, ql__request *req, void *route,
                         uint64_t arg);

/* Linear requests accepted and not yet answered. */
size_t ql__linear_in_flight(const ql__server *s);

/* w's crossover on some device is known, or no longer to be measured
 * (calibrate.c): the AUTO requests that waited for it are taken again. */
void ql__linear_crossover_ready(ql__server *s, ql__weight *w);

/* The measured launch times of w on device dev (n sizes: m[i] rows took
 * wo_ns[i] weight-only and aq_ns[i] activation-quantized, 0 = no such
 * path), given to the scheduler's queues of w there for every activation
 * dtype: they size its prefill chunks. Nothing happens for n == 0 or when
 * out of memory (the queues then learn from launches alone). */
void ql__linear_set_times(ql__server *s, ql__weight *w, unsigned dev,
                          const uint32_t *m, const uint64_t *wo_ns,
                          const uint64_t *aq_ns, unsigned n);

/* The session ended: its waiting requests are answered QL_ESESSION (their
 * replies go nowhere; this frees what they hold). */
void ql__linear_session_ended(ql__server *s, uint64_t session_id);

/* The drain deadline passed: every waiting request is answered
 * QL_ESHUTDOWN (a batch already running completes). */
void ql__linear_cancel_waiting(ql__server *s);

/* Counters of weight w on device dev, over its activation dtypes. */
void ql__linear_stats(const ql__server *s, const ql__weight *w, unsigned dev,
                      Qlinear__V1__WeightStats *out,
                      uint64_t queue_hist[32], uint64_t kernel_hist[32]);

#endif /* QL_LINEAR_H */
