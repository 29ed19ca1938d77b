/*
 * metrics.h - what a Prometheus scrapes: the daemon's counters rendered
 * in the text exposition format (version 0.0.4) and served at /metrics
 * over HTTP, by libmicrohttpd inside the loop thread (no thread of its
 * own, so rendering reads the daemon's state without locks).
 *
 * The listener is opt-in: a socket systemd hands over under the name
 * "metrics" (deploy/qlineard-metrics.socket), else metrics_listen, a
 * loopback address (listen.h); neither, and nothing listens. Every local
 * user can read a loopback port, so by default no weight name appears:
 * the series are the daemon's totals, per device, per format and per path
 * (latency histograms). metrics_weights = N adds a fixed set of series for
 * each of the N weights with the most requests, N at most
 * QL_METRICS_WEIGHTS_MAX, so the count of series is bounded whatever is
 * loaded.
 *
 * What it renders is counted elsewhere, whether or not anything is
 * served: the error slots (wire/counters.h) and the totals and log2
 * histograms the dispatcher fills as requests complete
 * (dispatch/counts.h).
 */
#ifndef QL_METRICS_H
#define QL_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "conf.h" /* QL_METRICS_WEIGHTS_MAX */
#include "dispatch/counts.h"
#include "ql_defs.h"
#include "wire/counters.h"

struct ql__server;
struct ql__weight;
typedef struct ql__metrics ql__metrics;


/* ------------------------------------------------------------ listener */

/*
 * Starts serving /metrics of s: on the socket systemd handed over under
 * the name "metrics" when there is one (cfg.metrics_listen is then not
 * bound), else on cfg.metrics_listen, else nowhere (*out = NULL, 0). The
 * listener runs on s->loop. 0 with *out set (NULL when nothing is
 * served), or a QL_E* code, logged with its reason, and nothing left
 * open. A handed-over descriptor is the listener's from here on, even
 * when this fails.
 */
int ql__metrics_open(struct ql__server *s, ql__metrics **out);

/* Stops listening and closes every connection at once; the memory goes
 * with the loop's close callbacks. Safe on NULL. */
void ql__metrics_close(ql__metrics *m);

/*
 * The exposition text of s as the listener serves it: a malloc'd buffer
 * (*text, *len bytes, NUL-terminated beyond them) the caller frees. 0 or
 * QL_ENOMEM (nothing allocated then). Loop thread.
 */
int ql__metrics_render(const struct ql__server *s, char **text,
                       size_t *len);

#endif /* QL_METRICS_H */
