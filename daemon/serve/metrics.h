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
 * Also here, since the counters are kept whether or not anything is
 * served: the error slots (a counter per QL_E* code) and the log2
 * histograms the dispatcher fills as requests complete.
 */
#ifndef QL_METRICS_H
#define QL_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "conf.h" /* QL_METRICS_WEIGHTS_MAX */
#include "ql_defs.h"
#include "wire/counters.h"

struct ql__server;
struct ql__weight;
typedef struct ql__metrics ql__metrics;


/* ------------------------------------------------------------ counters */

/* One slot per weight format as a load names it (q4g32 ... q4g256,
 * q8b32 ... q8b256, q8b32a ... q8b256a, q8c, f8r), and one for anything
 * else: the format label's values, bounded whatever is loaded. */
enum { QL__FMT_SLOTS = 15 };
unsigned ql__fmt_slot(int format, uint32_t group_size, int asymmetric);
const char *ql__fmt_slot_name(unsigned slot); /* "q4g128", ...; "other" */
/* The slot of weight w. */
unsigned ql__fmt_slot_of(const struct ql__weight *w);

/* A path's index in the per-path counters: 0 weight-only, 1
 * activation-quantized, -1 for any other value (AUTO, not yet routed). */
static inline int ql__path_slot(int path) {
  return path == QL_PATH_WEIGHT_ONLY ? 0 : path == QL_PATH_ACT_QUANT ? 1 : -1;
}

/*
 * A histogram of durations in the scheduler's log2 buckets
 * (ql__sched_hist_bucket: bucket 0 holds [0, 1024) ns, bucket b > 0
 * [2^(b+9), 2^(b+10)) ns, the last one everything above), with their sum
 * and count. Loop thread.
 */
#define QL__HIST_BUCKETS 32
typedef struct ql__hist {
  uint64_t bucket[QL__HIST_BUCKETS];
  uint64_t sum_ns;
  uint64_t count;
} ql__hist;

void ql__hist_add(ql__hist *h, uint64_t ns);

/* A Linear request or a LinearMulti part on w, rows rows, answered with
 * success on device dev: counted for dev and w's format in s->mcounts.
 * Any thread (only atomic counters change). */
void ql__metrics_count_request(struct ql__server *s,
                               const struct ql__weight *w, unsigned dev,
                               uint64_t rows);

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
