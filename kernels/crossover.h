/*
 * crossover.h - where the activation-quantized path starts to beat the
 * weight-only one for a weight on a device (DESIGN §6): both paths timed at
 * M = 1, 2, 4 ... on the backend's own kernels, and the row count from
 * which AUTO requests run activation-quantized chosen from those times.
 */
#ifndef QL_CROSSOVER_H
#define QL_CROSSOVER_H

#include <stdint.h>

#include "registry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* M = 1, 2, 4, ... 512. */
#define QL_CROSSOVER_SIZES 10
/* rows: AUTO requests never run activation-quantized. */
#define QL_CROSSOVER_NEVER UINT32_MAX

typedef struct ql_crossover {
  int n;                               /* sizes measured, from M = 1 up */
  int64_t m[QL_CROSSOVER_SIZES];       /* 1, 2, 4, ... */
  double wo_ns[QL_CROSSOVER_SIZES];    /* median time of one call */
  double aq_ns[QL_CROSSOVER_SIZES];    /* 0: no activation-quantized path */
  uint32_t rows; /* AUTO requests of at least this many rows run
                    activation-quantized; QL_CROSSOVER_NEVER: none */
} ql_crossover;

/*
 * The crossover of measured times: the threshold t (a measured M, or
 * QL_CROSSOVER_NEVER) that minimises the worst regret over the measured
 * sizes, regret being the time of the path t routes M to (activation-
 * quantized from t on) over the better path's; the smallest such t.
 * QL_CROSSOVER_NEVER without times or without an activation-quantized
 * path. Pure: the same times give the same answer.
 */
uint32_t ql_crossover_choose(const ql_crossover *c);

/*
 * Times both paths of weight w (its layout packed, as ql_run_linear takes
 * it) on backend b for activations of dtype dt at M = 1, 2, 4 ... up to
 * max_m (at most 512), each the median of 5 calls on fresh inputs with the
 * two paths interleaved, and fills *out (out->rows by
 * ql_crossover_choose). It stops early when the time spent passes
 * budget_ns (the sizes measured so far decide). A weight without an
 * activation-quantized path
 * (q8b; q8c with a K the int32 sums cannot hold) gets
 * QL_CROSSOVER_NEVER without a measurement. 0, QL_EINVAL, QL_ENOMEM, or a
 * kernel's error.
 */
int ql_crossover_measure(const ql_backend *b, const ql_qweight *w,
                         const void *packed, ql_dtype dt, int64_t max_m,
                         uint64_t budget_ns, ql_crossover *out);

/*
 * One step of ql_crossover_measure(): both paths of w timed at m rows (the
 * median of 5 calls each on fresh inputs, the paths interleaved) into
 * *wo_ns and *aq_ns (0 when w has no activation-quantized path on b). For
 * callers that measure one size at a time between other work (the daemon
 * on a device's worker). 0, QL_EINVAL, QL_ENOMEM, or a kernel's error.
 */
int ql_crossover_time(const ql_backend *b, const ql_qweight *w,
                      const void *packed, ql_dtype dt, int64_t m,
                      double *wo_ns, double *aq_ns);

/* The same on the clock clock(clock_arg) (monotonic, in ns) instead of the
 * system's: for the tests, whose fake kernels advance a fake clock. */
int ql_crossover_measure_clock(const ql_backend *b, const ql_qweight *w,
                               const void *packed, ql_dtype dt, int64_t max_m,
                               uint64_t budget_ns,
                               uint64_t (*clock)(void *arg), void *clock_arg,
                               ql_crossover *out);

#ifdef __cplusplus
}
#endif
#endif /* QL_CROSSOVER_H */
