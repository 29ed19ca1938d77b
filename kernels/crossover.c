/* crossover.c - see crossover.h. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "crossover.h"

#define REPS 5

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The worst regret of threshold t over the measured sizes: the routed
 * path's time over the better path's. */
static double worst_regret(const ql_crossover *c, uint64_t t) {
  double worst = 1.0;
  for (int i = 0; i < c->n; i++) {
    double wo = c->wo_ns[i], aq = c->aq_ns[i];
    double best = aq > 0 && aq < wo ? aq : wo;
    double routed = (uint64_t)c->m[i] >= t && aq > 0 ? aq : wo;
    if (best > 0 && routed / best > worst)
      worst = routed / best;
  }
  return worst;
}

uint32_t ql_crossover_choose(const ql_crossover *c) {
  uint32_t rows = QL_CROSSOVER_NEVER;
  if (c == NULL || c->n == 0)
    return rows;
  /* Minimax: the threshold whose worst regret is smallest, the smallest
   * such (activation-quantized scales better past the sizes measured). A
   * path that wins only in a middle band of sizes cannot be followed by
   * one threshold; this keeps the loss where it does not win small. */
  double best = worst_regret(c, QL_CROSSOVER_NEVER);
  for (int i = c->n - 1; i >= 0; i--) {
    if (c->aq_ns[i] <= 0)
      continue;
    double r = worst_regret(c, (uint64_t)c->m[i]);
    if (r <= best) {
      best = r;
      rows = (uint32_t)c->m[i];
    }
  }
  return rows;
}

static uint64_t real_clock(void *arg) {
  (void)arg;
  return now_ns();
}

int ql_crossover_measure(const ql_backend *b, const ql_qweight *w,
                         const void *packed, ql_dtype dt, int64_t max_m,
                         uint64_t budget_ns, ql_crossover *out) {
  return ql_crossover_measure_clock(b, w, packed, dt, max_m, budget_ns,
                                    real_clock, NULL, out);
}

/* Fresh activations: REPS inputs of m rows in dt, the caller's to free. */
static void *fresh_inputs(int64_t m, int64_t k, ql_dtype dt) {
  size_t n = (size_t)m * REPS * (size_t)k;
  float *xf = malloc(n * sizeof(float));
  void *x = malloc(n * ql_dtype_size(dt));
  if (xf == NULL || x == NULL) {
    free(xf);
    free(x);
    return NULL;
  }
  uint64_t st = 0x2545f4914f6cdd1du;
  for (size_t i = 0; i < n; i++) {
    st = st * 6364136223846793005u + 1442695040888963407u;
    xf[i] = (float)((int32_t)(st >> 32)) * (1.0f / 2147483648.0f);
  }
  ql_from_f32(dt, xf, x, n);
  free(xf);
  return x;
}

/* Times both paths at m rows on the inputs x (REPS inputs of at least m
 * rows each, xstride bytes apart); medians into *wo and *aq. */
static int time_size(const ql_backend *b, const ql_qweight *w,
                     const void *packed, ql_dtype dt, const uint8_t *x,
                     size_t xstride, int64_t m, void *y, int aq_path,
                     uint64_t (*clock)(void *arg), void *clock_arg,
                     double *wo, double *aq) {
  double tw[REPS], ta[REPS];
  for (int r = 0; r < REPS; r++) {
    const uint8_t *xr = x + (size_t)r * xstride;
    /* Interleaved, so that a burst of noise hits both paths. */
    for (int p = 0; p < 1 + aq_path; p++) {
      uint64_t a = clock(clock_arg);
      int rc = ql_run_linear(b, p ? QL_OP_LINEAR_AQ : QL_OP_LINEAR_WO, w,
                             packed, dt, xr, m, y, NULL);
      uint64_t e = clock(clock_arg) - a;
      if (rc != 0)
        return rc;
      (p ? ta : tw)[r] = (double)e;
    }
  }
  qsort(tw, REPS, sizeof *tw, cmp_double);
  *wo = tw[REPS / 2];
  *aq = 0;
  if (aq_path) {
    qsort(ta, REPS, sizeof *ta, cmp_double);
    *aq = ta[REPS / 2];
  }
  return 0;
}

int ql_crossover_time(const ql_backend *b, const ql_qweight *w,
                      const void *packed, ql_dtype dt, int64_t m,
                      double *wo_ns, double *aq_ns) {
  if (w == NULL || wo_ns == NULL || aq_ns == NULL || m < 1 || m > 512 ||
      ql_dtype_size(dt) == 0)
    return QL_EINVAL;
  int aq = ql_dispatch(b, QL_OP_LINEAR_AQ, w->format, dt, 1, w->n, w->k) !=
           NULL;
  size_t esz = ql_dtype_size(dt);
  void *x = fresh_inputs(m, w->k, dt);
  void *y = malloc((size_t)m * (size_t)w->n * esz);
  int rc = QL_ENOMEM;
  if (x != NULL && y != NULL)
    rc = time_size(b, w, packed, dt, x, (size_t)m * (size_t)w->k * esz, m, y,
                   aq, real_clock, NULL, wo_ns, aq_ns);
  free(x);
  free(y);
  return rc;
}

int ql_crossover_measure_clock(const ql_backend *b, const ql_qweight *w,
                               const void *packed, ql_dtype dt, int64_t max_m,
                               uint64_t budget_ns,
                               uint64_t (*clock)(void *arg), void *clock_arg,
                               ql_crossover *out) {
  int rc = 0;
  void *x = NULL, *y = NULL;
  if (out == NULL || w == NULL || max_m < 1)
    return QL_EINVAL;
  memset(out, 0, sizeof *out);
  out->rows = QL_CROSSOVER_NEVER;
  if (max_m > 512)
    max_m = 512;
  if (ql_dispatch(b, QL_OP_LINEAR_AQ, w->format, dt, 1, w->n, w->k) == NULL)
    return 0;
  size_t esz = ql_dtype_size(dt), kk = (size_t)w->k, nn = (size_t)w->n;
  /* REPS fresh inputs of max_m rows: a call never reads what the one
   * before it just brought into the cache. */
  x = fresh_inputs(max_m, w->k, dt);
  y = malloc((size_t)max_m * nn * esz);
  if (x == NULL || y == NULL) {
    rc = QL_ENOMEM;
    goto done;
  }
  uint64_t t0 = clock(clock_arg);
  for (int64_t m = 1; m <= max_m && out->n < QL_CROSSOVER_SIZES; m *= 2) {
    rc = time_size(b, w, packed, dt, x, (size_t)m * kk * esz, m, y, 1, clock,
                   clock_arg, &out->wo_ns[out->n], &out->aq_ns[out->n]);
    if (rc != 0)
      goto done;
    out->m[out->n] = m;
    out->n++;
    if (clock(clock_arg) - t0 > budget_ns)
      break;
  }
  out->rows = ql_crossover_choose(out);
done:
  free(x);
  free(y);
  return rc;
}
