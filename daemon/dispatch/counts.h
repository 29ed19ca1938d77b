/*
 * counts.h - what the dispatcher counts for the metrics besides the
 * per-weight counters (ql__weight_stats, which go with their weight):
 * totals per device, per format and per path that only ever grow, as
 * Prometheus counters must, and log2 histograms of latencies. Kept in
 * ql__server.mcounts whether or not anything is served; serve/metrics.c
 * renders them.
 */
#ifndef QL_COUNTS_H
#define QL_COUNTS_H

#include <stdint.h>

#include "ql_defs.h"
#include "state/weights.h" /* QL__MAX_DEVICES, ql__weight */

/* One slot per weight format as a load names it (q4g32 ... q4g256,
 * q8b32 ... q8b256, q8b32a ... q8b256a, q8c, f8r), and one for anything
 * else: the format label's values, bounded whatever is loaded. */
enum { QL__FMT_SLOTS = 15, QL__FMT_OTHER = QL__FMT_SLOTS - 1 };
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

/* The totals. Loop thread, but for the atomic ones, which a device worker
 * adds to for the replies it sends itself (route.h, early). */
typedef struct ql__metrics_counts {
  struct ql__metrics_dev {
    _Atomic uint64_t requests; /* Linear requests and LinearMulti parts
                                  answered with success */
    _Atomic uint64_t rows;     /* their rows */
    uint64_t batches[2];       /* launches, by path (ql__path_slot) */
    uint64_t kernel_ns;        /* time in launches */
    uint64_t queue_ns;         /* time requests waited for their first */
  } dev[QL__MAX_DEVICES];
  struct ql__metrics_fmt {
    _Atomic uint64_t requests, rows; /* as above, by format */
  } fmt[QL__FMT_SLOTS];
  /* By path: a successful request from its admission to its answer
   * (latency), every request to its first launch (queue), and each
   * successful launch. */
  ql__hist latency[2], queue[2], launch[2];
} ql__metrics_counts;

/* A Linear request or a LinearMulti part on w, rows rows, answered with
 * success on device dev: counted for dev and w's format in mc. Any
 * thread (only atomic counters change). */
void ql__counts_request(ql__metrics_counts *mc, const ql__weight *w,
                        unsigned dev, uint64_t rows);

#endif /* QL_COUNTS_H */
