/*
 * bench_crossover.c - `qlinear-bench crossover` (DESIGN §12, issue 6): for
 * each format and shape, the weight-only and activation-quantized time per
 * M on the CPU backend, the crossover the daemon would choose
 * (ql_crossover_measure, the same call as its calibration), and the
 * regret at every M: the routed path's time over the better path's, both
 * measured again on fresh runs (not the calibration's own timings), as
 * the median of interleaved pairs with the spread over the pairs.
 *
 * Like the kernel bench, the calls rotate over copies of the weight whose
 * total is at least 4x the last-level cache, so every call streams its
 * weight from memory. Output: a table, and one JSON line per (format,
 * shape, M) starting with "{".
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "crossover.h"

#define MAXP 64

typedef struct xo_opts {
  int64_t n[8], k[8];
  int nshape;
  ql_format fmts[4];
  int nfmt;
  int pairs;
  double min_s;
  double llc;
  int64_t max_m;
} xo_opts;

typedef struct xo_ctx {
  const ql_backend *b;
  const wset *w;
  ql_op op;
  const float *x;
  int64_t m;
  float *y;
} xo_ctx;

static void xo_run(void *ctx, long i) {
  xo_ctx *c = ctx;
  int rc = ql_run_linear(c->b, c->op, c->w->q, c->w->pk[i % c->w->ncopies],
                         QL_DTYPE_F32, c->x, c->m, c->y, NULL);
  if (rc != 0) {
    fprintf(stderr, "qlinear-bench crossover: kernel error %d\n", rc);
    exit(1);
  }
}

static const char *fmt_name(ql_format f) {
  return f == QL_FORMAT_Q4G ? "q4g128" : f == QL_FORMAT_Q8C ? "q8c" : "f8r";
}

static int parse_shapes(const char *s, xo_opts *o) {
  o->nshape = 0;
  while (*s && o->nshape < 8) {
    long long n, k;
    int used;
    if (sscanf(s, "%lldx%lld%n", &n, &k, &used) != 2 || n < 1 || k < 1)
      return -1;
    o->n[o->nshape] = n;
    o->k[o->nshape++] = k;
    s += used;
    if (*s == ',')
      s++;
    else if (*s)
      return -1;
  }
  return o->nshape > 0 ? 0 : -1;
}

static int parse_formats(const char *s, xo_opts *o) {
  char buf[64];
  snprintf(buf, sizeof buf, "%s", s);
  o->nfmt = 0;
  for (char *t = strtok(buf, ","); t && o->nfmt < 4; t = strtok(NULL, ",")) {
    if (strcmp(t, "q4g") == 0)
      o->fmts[o->nfmt++] = QL_FORMAT_Q4G;
    else if (strcmp(t, "q8c") == 0)
      o->fmts[o->nfmt++] = QL_FORMAT_Q8C;
    else if (strcmp(t, "f8r") == 0)
      o->fmts[o->nfmt++] = QL_FORMAT_F8R;
    else
      return -1;
  }
  return o->nfmt > 0 ? 0 : -1;
}

int bench_crossover(int argc, char **argv) {
  xo_opts o;
  memset(&o, 0, sizeof o);
  o.n[0] = o.k[0] = 4096;
  o.nshape = 1;
  /* f8r runs the generic (scalar) kernels on the CPU: ask for it with a
   * small shape. */
  o.fmts[0] = QL_FORMAT_Q4G;
  o.fmts[1] = QL_FORMAT_Q8C;
  o.nfmt = 2;
  o.pairs = 7;
  o.min_s = 0.05;
  o.max_m = 512;
  long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  o.llc = llc > 0 ? (double)llc : 32.0 * (1 << 20);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--shapes") == 0 && v && parse_shapes(v, &o) == 0)
      i++;
    else if (strcmp(a, "--formats") == 0 && v && parse_formats(v, &o) == 0)
      i++;
    else if (strcmp(a, "--pairs") == 0 && v && atoi(v) >= 5 &&
             atoi(v) <= MAXP)
      o.pairs = atoi(argv[++i]);
    else if (strcmp(a, "--min-sample-ms") == 0 && v && atof(v) > 0)
      o.min_s = atof(argv[++i]) / 1000.0;
    else if (strcmp(a, "--quick") == 0) {
      o.n[0] = o.k[0] = 1024;
      o.nshape = 1;
      o.pairs = 5;
      o.min_s = 0.002;
      o.max_m = 64;
    } else {
      fprintf(stderr,
              "usage: qlinear-bench crossover [--shapes NxK,...] "
              "[--formats q4g,q8c,f8r (default q4g,q8c)] [--pairs P] "
              "[--min-sample-ms MS] "
              "[--quick]\n");
      return 2;
    }
  }
  const ql_backend *b = ql_backend_find("cpu");
  if (b == NULL)
    return 1;
  printf("qlinear-bench crossover: cpu level %s, %d threads, %d pairs, "
         "samples >= %.0f ms; times per call in us (medians of the pairs)\n",
         ql__cpu_level_name(ql__cpu_level_get()), ql__cpu_threads(), o.pairs,
         o.min_s * 1e3);
  double worst = 0;
  for (int s = 0; s < o.nshape; s++) {
    for (int fi = 0; fi < o.nfmt; fi++) {
      wset w;
      ql_format f = o.fmts[fi];
      int64_t n = o.n[s], k = o.k[s];
      if (wset_build(f, 128, 0, 0, n, k, o.llc, 0, &w) != 0) {
        fprintf(stderr, "qlinear-bench crossover: cannot make %s %lldx%lld\n",
                fmt_name(f), (long long)n, (long long)k);
        return 1;
      }
      ql_crossover xc;
      if (ql_crossover_measure(b, w.q, w.pk[0], QL_DTYPE_F32,
                               o.max_m, (uint64_t)10e9, &xc) != 0) {
        fprintf(stderr, "qlinear-bench crossover: calibration failed\n");
        return 1;
      }
      char xs[32];
      if (xc.rows == QL_CROSSOVER_NEVER)
        snprintf(xs, sizeof xs, "never");
      else
        snprintf(xs, sizeof xs, "%u", xc.rows);
      printf("\n%s %lldx%lld: crossover (calibration, %d sizes) = %s\n",
             fmt_name(f), (long long)n, (long long)k, xc.n, xs);
      printf("%6s %10s %10s  %-5s %-6s  %s\n", "M", "WO", "AQ", "best",
             "routed", "regret median [min-max]");
      float *x = xalloc((size_t)o.max_m * (size_t)k * sizeof(float));
      float *y = xalloc((size_t)o.max_m * (size_t)n * sizeof(float));
      for (size_t i = 0; i < (size_t)o.max_m * (size_t)k; i++)
        x[i] = (float)gauss();
      int has_aq = ql_dispatch(b, QL_OP_LINEAR_AQ, f, QL_DTYPE_F32, 1, n,
                               k) != NULL;
      for (int64_t m = 1; m <= o.max_m; m *= 2) {
        xo_ctx cw = {b, &w, QL_OP_LINEAR_WO, x, m, y};
        xo_ctx ca = {b, &w, QL_OP_LINEAR_AQ, x, m, y};
        timed tw = {"wo", xo_run, &cw, 1, 0}, ta = {"aq", xo_run, &ca, 1, 0};
        double vw[MAXP], va[MAXP], reg[MAXP];
        int routed_aq = has_aq && (uint64_t)m >= xc.rows;
        calibrate(&tw, o.min_s);
        if (has_aq)
          calibrate(&ta, o.min_s);
        for (int p = 0; p < o.pairs; p++) {
          /* Interleaved, the order alternating between pairs. */
          if (p % 2 == 0) {
            vw[p] = sample(&tw);
            va[p] = has_aq ? sample(&ta) : INFINITY;
          } else {
            va[p] = has_aq ? sample(&ta) : INFINITY;
            vw[p] = sample(&tw);
          }
          double best = vw[p] < va[p] ? vw[p] : va[p];
          reg[p] = (routed_aq ? va[p] : vw[p]) / best;
        }
        stat3 sw = stats(vw, o.pairs), sa = stats(va, o.pairs),
              sr = stats(reg, o.pairs);
        if (sr.med > worst)
          worst = sr.med;
        const char *best = sa.med < sw.med ? "aq" : "wo";
        printf("%6lld %10.1f %10.1f  %-5s %-6s  %.3f [%.3f-%.3f]\n",
               (long long)m, sw.med * 1e6, has_aq ? sa.med * 1e6 : NAN, best,
               routed_aq ? "aq" : "wo", sr.med, sr.min, sr.max);
        printf("{\"bench\":\"crossover\",\"format\":\"%s\",\"n\":%lld,"
               "\"k\":%lld,\"m\":%lld,\"crossover\":%lld,\"wo_us\":%.3f,"
               "\"aq_us\":%.3f,\"routed\":\"%s\",\"regret\":{\"median\":%.4f,"
               "\"min\":%.4f,\"max\":%.4f},\"pairs\":%d}\n",
               fmt_name(f), (long long)n, (long long)k, (long long)m,
               xc.rows == QL_CROSSOVER_NEVER ? -1LL : (long long)xc.rows,
               sw.med * 1e6, has_aq ? sa.med * 1e6 : -1.0,
               routed_aq ? "aq" : "wo", sr.med, sr.min, sr.max, o.pairs);
      }
      free(x);
      free(y);
      wset_free(&w);
    }
  }
  printf("\nworst median regret: %.3f (target <= 1.10)\n", worst);
  return 0;
}
