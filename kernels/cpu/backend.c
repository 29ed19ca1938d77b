/*
 * backend.c - the CPU backend's registration (the one place that lists
 * its implementations) and the glue every CPU op shares: argument checks
 * as strict as the reference's, activation widening and quantization,
 * the split of N between the pool's threads, and the f32 → dtype store.
 * The CPU is always built and is the default device.
 *
 * Levels (cpu.h): each op is registered once per instruction level,
 * highest first, with a supports() that accepts only the level the
 * process runs at, so dispatch picks the one that runs and its name says
 * which (metrics, qlinearctl). All levels read the same layout, made by
 * cpu.repack, and give the same bytes as the generic op.
 *
 * Formats: q4g, q8c and f8r (WO and AQ) and q8b (WO: it is a weight-only
 * format, DESIGN §4), all with a layout made by cpu.repack.
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "registry.h"

/* The formats of each op: every one has a layout and a WO kernel; q8b
 * has no AQ path anywhere, so no activation quantization either. */
#define FMTS_WO                                                                \
  (QL_FMT_BIT(QL_FORMAT_Q4G) | QL_FMT_BIT(QL_FORMAT_Q8C) |                     \
   QL_FMT_BIT(QL_FORMAT_Q8B) | QL_FMT_BIT(QL_FORMAT_F8R))
#define FMTS_AQ                                                                \
  (QL_FMT_BIT(QL_FORMAT_Q4G) | QL_FMT_BIT(QL_FORMAT_Q8C) |                     \
   QL_FMT_BIT(QL_FORMAT_F8R))
#define FMTS_QROWS FMTS_AQ

/* Below this many multiply-adds a call stays on the calling thread: the
 * wake-up of the pool would cost more than it saves. */
#define PARALLEL_MIN_MACS ((int64_t)1 << 17)
/* The same for the f8r activation quantization, per value (a division
 * and an e4m3 rounding each). */
#define PARALLEL_MIN_XVALS ((int64_t)1 << 13)

static int mul_size(size_t a, size_t b, size_t *out) {
  if (a != 0 && b > SIZE_MAX / a)
    return 0;
  *out = a * b;
  return 1;
}

/* The kernels of level l, or of the highest level this CPU has when l is
 * above it (an implementation called without dispatch never runs
 * instructions the CPU lacks). */
static const ql__cpu_kernels *kernels(ql__cpu_level l) {
  ql__cpu_level d = ql__cpu_level_detected();
  return ql__cpu_kernels_for(l < d ? l : d);
}

/* The argument checks of kernels/reference.c op_args(), so that the CPU
 * ops fail where and how the generic ones do. */
static int linear_args(const ql_linear_args *a, size_t *esz) {
  size_t mk, mn, bytes;
  int rc;
  if (a == NULL || a->w == NULL || a->x == NULL || a->y == NULL)
    return QL_EINVAL;
  if ((rc = ql_qweight_check(a->w)) != 0)
    return rc;
  if ((*esz = ql_dtype_size(a->dt)) == 0)
    return QL_EDTYPE;
  if (a->m < 1 || a->m > QL_DIM_MAX)
    return QL_ESHAPE;
  if (!mul_size((size_t)a->m, (size_t)a->w->k, &mk) ||
      !mul_size(mk, sizeof(float), &bytes) ||
      !mul_size((size_t)a->m, (size_t)a->w->n, &mn) ||
      !mul_size(mn, sizeof(float), &bytes))
    return QL_ESHAPE;
  return 0;
}

/* The layout to read: the one repack made at load, or (a caller that has
 * none, e.g. a weight loaded before this backend had a repack) one built
 * for this call in *tmp. */
static int layout(const ql_linear_args *a, const ql__cpu_packed **p,
                  ql__cpu_packed **tmp) {
  *tmp = NULL;
  if (a->packed != NULL) {
    *p = a->packed;
    return ql__cpu_packed_matches(*p, a->w) ? 0 : QL_EINVAL;
  }
  int rc = ql__cpu_pack(a->w, tmp);
  *p = *tmp;
  return rc;
}

/* x as f32: x itself for f32 activations, else a widened copy in *buf.
 * QL_ENONFINITE when check is set and any value is NaN or Inf. */
static int widen_x(const ql_linear_args *a, int check, const float **xf,
                   float **buf) {
  size_t n = (size_t)a->m * (size_t)a->w->k;
  *buf = NULL;
  if (a->dt == QL_DTYPE_F32) {
    *xf = a->x;
  } else {
    if ((*buf = malloc(n * sizeof(float))) == NULL)
      return QL_ENOMEM;
    ql_to_f32(a->dt, a->x, *buf, n);
    *xf = *buf;
  }
  if (check)
    for (size_t i = 0; i < n; i++)
      if (!isfinite((*xf)[i]))
        return QL_ENONFINITE;
  return 0;
}

/*
 * One linear call split over the pool as a grid of tparts x mparts: part
 * p computes the tiles [tiles·i/tparts, tiles·(i+1)/tparts) for the rows
 * [m·j/mparts, m·(j+1)/mparts), i = p % tparts, j = p / tparts. Rows are
 * split only when there are fewer tiles than parts (a narrow layer with a
 * large batch); the split changes which thread computes an output, never
 * how (cpu.h).
 */
typedef struct lin_job {
  const ql__cpu_kernels *kt;
  const ql__cpu_packed *p;
  int aq;
  const float *x;  /* WO */
  const float *xs; /* WO q4g: group sums of x [m][G] */
  int64_t m;
  ql__cpu_xq xq; /* AQ */
  int64_t ng;    /* AQ: per-row entries of xq.gsum8 and xq.gsumf */
  const float *bias;
  float *y;
  int tparts;
} lin_job;

static void lin_part(void *ctx, int part, int parts) {
  const lin_job *j = ctx;
  const ql__cpu_packed *p = j->p;
  int tparts = j->tparts, mparts = parts / tparts;
  int ti = part % tparts, mi = part / tparts;
  int64_t t0 = p->tiles * ti / tparts, t1 = p->tiles * (ti + 1) / tparts;
  int64_t r0 = j->m * mi / mparts, r1 = j->m * (mi + 1) / mparts;
  assert(parts % tparts == 0);
  float *y = j->y + (size_t)r0 * (size_t)p->n;
  if (t0 >= t1 || r0 >= r1)
    return;
  if (j->aq) {
    ql__cpu_xq xq = j->xq;
    size_t kr = (size_t)r0 * (size_t)xq.kp, gr = (size_t)r0 * (size_t)j->ng;
    xq.m = r1 - r0;
    xq.sx += r0;
    if (xq.xq != NULL)
      xq.xq += kr;
    if (xq.gsum8 != NULL)
      xq.gsum8 += gr;
    if (xq.gsumf != NULL)
      xq.gsumf += gr;
    if (xq.xc != NULL)
      xq.xc += kr;
    if (xq.xe != NULL)
      xq.xe += kr;
    if (p->format == QL_FORMAT_Q4G)
      j->kt->aq_q4g(p, &xq, t0, t1, j->bias, y);
    else if (p->format == QL_FORMAT_F8R)
      j->kt->aq_f8r(p, &xq, t0, t1, j->bias, y);
    else
      j->kt->aq_q8c(p, &xq, t0, t1, j->bias, y);
  } else {
    const float *x = j->x + (size_t)r0 * (size_t)p->k;
    int64_t m = r1 - r0;
    switch (p->format) {
    case QL_FORMAT_Q4G:
      j->kt->wo_q4g(p, x, j->xs + (size_t)r0 * (size_t)p->groups, m, t0, t1,
                    j->bias, y);
      break;
    case QL_FORMAT_Q8B:
      j->kt->wo_q8b(p, x, m, t0, t1, j->bias, y);
      break;
    case QL_FORMAT_F8R:
      j->kt->wo_f8r(p, x, m, t0, t1, j->bias, y);
      break;
    default:
      j->kt->wo_q8c(p, x, m, t0, t1, j->bias, y);
      break;
    }
  }
}

/* Runs the job on as many pool threads as the work is worth, then stores
 * y (already there for f32 outputs). Tiles are split first; what is left
 * of the threads splits the rows. */
static void lin_run(lin_job *j, const ql_linear_args *a) {
  double macs = (double)j->m * (double)a->w->n * (double)a->w->k;
  int parts = macs < (double)PARALLEL_MIN_MACS ? 1 : ql__cpu_threads();
  int tparts = parts, mparts = 1;
  if ((int64_t)tparts > j->p->tiles) {
    tparts = (int)j->p->tiles;
    mparts = parts / tparts;
    if ((int64_t)mparts > j->m)
      mparts = (int)j->m;
  }
  j->tparts = tparts;
  ql__cpu_parallel(lin_part, j, tparts * mparts);
  if (a->dt != QL_DTYPE_F32)
    ql_from_f32(a->dt, j->y, a->y, (size_t)j->m * (size_t)a->w->n);
}

static int run_wo(ql__cpu_level level, const ql_linear_args *a) {
  const ql__cpu_packed *p;
  ql__cpu_packed *tmp = NULL;
  float *xbuf = NULL, *ybuf = NULL, *xs = NULL;
  lin_job j;
  size_t esz;
  int rc;

  if ((rc = linear_args(a, &esz)) != 0)
    return rc;
  memset(&j, 0, sizeof j);
  if ((rc = widen_x(a, 1, &j.x, &xbuf)) != 0)
    goto out;
  if ((rc = layout(a, &p, &tmp)) != 0)
    goto out;
  rc = QL_ENOMEM;
  if (a->dt != QL_DTYPE_F32 &&
      (ybuf = malloc((size_t)a->m * (size_t)a->w->n * sizeof(float))) == NULL)
    goto out;
  if (p->format == QL_FORMAT_Q4G) {
    /* m·G <= m·K: no overflow once linear_args() passed */
    if ((xs = malloc((size_t)a->m * (size_t)p->groups * sizeof(float))) ==
        NULL)
      goto out;
    ql_q4g_group_sums(j.x, a->m, p->k, p->gs, xs);
  }
  rc = 0;
  j.xs = xs;
  j.kt = kernels(level);
  j.p = p;
  j.m = a->m;
  j.bias = a->w->bias;
  j.y = a->dt == QL_DTYPE_F32 ? a->y : ybuf;
  lin_run(&j, a);
out:
  ql__cpu_packed_free(tmp);
  free(xbuf);
  free(ybuf);
  free(xs);
  return rc;
}

/* Quantizes the rows [r0, r1) of xf [m][k], src data widened, into xq
 * (the bit-exact int8 rule of ql_quantize_rows_i8_src), rows padded with
 * zeros to kp, with the sums the AQ kernels need (cpu.h). */
static int quantize_x(const ql__cpu_kernels *kt, const ql__cpu_packed *p,
                      ql_dtype src, const float *xf, int64_t r0, int64_t r1,
                      int8_t *xq, int64_t kp, float *sx, int32_t *gsum8,
                      float *gsumf) {
  int64_t k = p->k;
  for (int64_t r = r0; r < r1; r++) {
    int8_t *q = xq + (size_t)r * (size_t)kp;
    int rc = kt->quant_row(src, xf + (size_t)r * (size_t)k, k, q, sx + r);
    if (rc != 0)
      return rc;
    memset(q + k, 0, (size_t)(kp - k));
    if (p->format == QL_FORMAT_Q4G) {
      for (int64_t g = 0; g < p->groups; g++) {
        int64_t k0 = g * (int64_t)p->gs, k1 = k0 + (int64_t)p->gs;
        int32_t s = 0;
        if (k1 > k)
          k1 = k;
        for (int64_t i = k0; i < k1; i++)
          s += q[i];
        gsum8[(size_t)r * (size_t)p->groups + (size_t)g] = 8 * s;
        gsumf[(size_t)r * (size_t)p->groups + (size_t)g] = (float)s;
      }
    } else {
      int32_t s = 0;
      for (int64_t i = 0; i < k; i++)
        s += q[i];
      gsum8[r] = 128 * s; /* |s| <= 128·K: fits for K <= QL_AQ_Q8C_MAX_K */
    }
  }
  return 0;
}

/* The int8 activation rows of one call, quantized in parts over the pool
 * (rows are independent; each part records the error of its first bad
 * row, and the call returns that of the lowest row, as the reference
 * does). */
typedef struct i8q_job {
  const ql__cpu_kernels *kt;
  const ql__cpu_packed *p;
  ql_dtype src;
  const float *xf;
  int64_t m, kp;
  int8_t *xq;
  float *sx, *gsumf;
  int32_t *gsum8;
  int rc[256]; /* per part; the pool has at most 256 threads */
} i8q_job;

static void i8q_part(void *ctx, int part, int parts) {
  i8q_job *j = ctx;
  j->rc[part] = quantize_x(j->kt, j->p, j->src, j->xf, j->m * part / parts,
                           j->m * (part + 1) / parts, j->xq, j->kp, j->sx,
                           j->gsum8, j->gsumf);
}

/* Parts worth using to quantize m rows of k values. */
static int xq_parts(int64_t m, int64_t k) {
  int parts = (double)m * (double)k < (double)PARALLEL_MIN_XVALS
                  ? 1
                  : ql__cpu_threads();
  return (int64_t)parts > m ? (int)m : parts;
}

/* The f8r activation rows of one call, quantized in parts over the pool
 * (rows are independent; each part records the error of its first bad
 * row, and the call returns that of the lowest row, as the reference
 * does). */
typedef struct f8q_job {
  const ql__cpu_kernels *kt;
  ql_dtype src;
  const float *xf;
  int64_t m, k, kp;
  uint8_t *xc;
  float *xe, *sx;
  int rc[256]; /* per part; the pool has at most 256 threads */
} f8q_job;

static void f8q_part(void *ctx, int part, int parts) {
  f8q_job *j = ctx;
  int64_t r0 = j->m * part / parts, r1 = j->m * (part + 1) / parts;
  j->rc[part] = 0;
  for (int64_t r = r0; r < r1; r++) {
    uint8_t *c = j->xc + (size_t)r * (size_t)j->kp;
    float *e = j->xe + (size_t)r * (size_t)j->kp;
    int rc = j->kt->quant_row_e4m3(j->src, j->xf + (size_t)r * (size_t)j->k,
                                   j->k, c, e, j->sx + r);
    if (rc != 0) {
      j->rc[part] = rc;
      return;
    }
    memset(c + j->k, 0, (size_t)(j->kp - j->k));
    memset(e + j->k, 0, (size_t)(j->kp - j->k) * sizeof(float));
  }
}

/*
 * The f8r AQ path: the rows of xf quantized with the bit-exact e4m3 rule
 * of ql_quantize_rows_e4m3_src (the level's quant_row_e4m3) into the
 * codes and their values ×2^119 that the kernels read (ql__cpu_xq), then
 * the kernels over the pool.
 */
static int run_aq_f8r(const ql__cpu_kernels *kt, const ql_linear_args *a,
                      const ql__cpu_packed *p, const float *xf, float *y) {
  int64_t k = a->w->k, kp = (k + QL_CPU_Q8C_KB - 1) / QL_CPU_Q8C_KB *
                                QL_CPU_Q8C_KB;
  size_t mkp = (size_t)a->m * (size_t)kp, xe_bytes;
  f8q_job *q = NULL;
  lin_job j;
  int rc = QL_ESHAPE, parts;

  if (!mul_size(mkp, sizeof(float), &xe_bytes))
    return rc;
  rc = QL_ENOMEM;
  if ((q = calloc(1, sizeof *q)) == NULL || (q->xc = malloc(mkp)) == NULL ||
      (q->xe = malloc(xe_bytes)) == NULL ||
      (q->sx = malloc((size_t)a->m * sizeof(float))) == NULL)
    goto out;
  q->kt = kt;
  q->src = a->dt;
  q->xf = xf;
  q->m = a->m;
  q->k = k;
  q->kp = kp;
  parts = xq_parts(a->m, k);
  ql__cpu_parallel(f8q_part, q, parts);
  for (int i = 0; i < parts; i++)
    if ((rc = q->rc[i]) != 0)
      goto out;
  memset(&j, 0, sizeof j);
  j.kt = kt;
  j.p = p;
  j.aq = 1;
  j.m = a->m;
  j.xq = (ql__cpu_xq){NULL, a->m, kp, q->sx, NULL, NULL, q->xc, q->xe};
  j.bias = a->w->bias;
  j.y = y;
  lin_run(&j, a);
  rc = 0;
out:
  if (q != NULL) {
    free(q->xc);
    free(q->xe);
    free(q->sx);
  }
  free(q);
  return rc;
}

static int run_aq(ql__cpu_level level, const ql_linear_args *a) {
  const ql__cpu_packed *p;
  ql__cpu_packed *tmp = NULL;
  float *xbuf = NULL, *ybuf = NULL, *sx = NULL, *gsumf = NULL;
  int8_t *xq = NULL;
  int32_t *gsum8 = NULL;
  const float *xf;
  int64_t kb, kp, ng;
  size_t esz, xq_bytes;
  i8q_job *q = NULL;
  lin_job j;
  int rc, parts;

  if ((rc = linear_args(a, &esz)) != 0)
    return rc;
  if (a->w->format == QL_FORMAT_Q8B) /* weight-only, as the generic op */
    return QL_ENOTSUP;
  if (a->w->format == QL_FORMAT_Q8C && a->w->k > QL_AQ_Q8C_MAX_K)
    return QL_ESHAPE;
  memset(&j, 0, sizeof j);
  j.kt = kernels(level);
  if (a->w->format == QL_FORMAT_F8R) {
    if ((rc = widen_x(a, 0, &xf, &xbuf)) != 0)
      goto out;
    if ((rc = layout(a, &p, &tmp)) != 0)
      goto out;
    rc = QL_ENOMEM;
    if (a->dt != QL_DTYPE_F32 &&
        (ybuf = malloc((size_t)a->m * (size_t)a->w->n * sizeof(float))) ==
            NULL)
      goto out;
    rc = run_aq_f8r(j.kt, a, p, xf, a->dt == QL_DTYPE_F32 ? a->y : ybuf);
    goto out;
  }
  kb = a->w->format == QL_FORMAT_Q4G ? QL_CPU_Q4G_KB : QL_CPU_Q8C_KB;
  kp = (a->w->k + kb - 1) / kb * kb;
  ng = a->w->format == QL_FORMAT_Q4G ? a->w->groups : 1;
  rc = QL_ESHAPE;
  if (!mul_size((size_t)a->m, (size_t)kp, &xq_bytes))
    goto out;
  if ((rc = widen_x(a, 0, &xf, &xbuf)) != 0)
    goto out;
  if ((rc = layout(a, &p, &tmp)) != 0)
    goto out;
  rc = QL_ENOMEM;
  if ((xq = malloc(xq_bytes)) == NULL ||
      (sx = malloc((size_t)a->m * sizeof(float))) == NULL ||
      (gsum8 = malloc((size_t)a->m * (size_t)ng * sizeof(int32_t))) == NULL ||
      (gsumf = malloc((size_t)a->m * (size_t)ng * sizeof(float))) == NULL)
    goto out;
  if ((q = calloc(1, sizeof *q)) == NULL)
    goto out;
  *q = (i8q_job){.kt = j.kt, .p = p, .src = a->dt, .xf = xf, .m = a->m,
                 .kp = kp, .xq = xq, .sx = sx, .gsumf = gsumf, .gsum8 = gsum8};
  parts = xq_parts(a->m, a->w->k);
  ql__cpu_parallel(i8q_part, q, parts);
  for (int i = 0; i < parts; i++)
    if ((rc = q->rc[i]) != 0)
      goto out;
  free(xbuf);
  xbuf = NULL;
  rc = QL_ENOMEM;
  if (a->dt != QL_DTYPE_F32 &&
      (ybuf = malloc((size_t)a->m * (size_t)a->w->n * sizeof(float))) == NULL)
    goto out;
  j.p = p;
  j.aq = 1;
  j.m = a->m;
  j.xq = (ql__cpu_xq){xq, a->m, kp, sx, gsum8, gsumf, NULL, NULL};
  j.ng = ng;
  j.bias = a->w->bias;
  j.y = a->dt == QL_DTYPE_F32 ? a->y : ybuf;
  lin_run(&j, a);
  rc = 0;
out:
  ql__cpu_packed_free(tmp);
  free(xbuf);
  free(ybuf);
  free(xq);
  free(sx);
  free(gsum8);
  free(gsumf);
  free(q);
  return rc;
}

/* QL_OP_QUANTIZE_ROWS with QL_QROWS_E4M3 and f32 rows: the level's
 * quant_row_e4m3, with the argument checks of ql_quantize_rows_e4m3_src. */
static int run_qrows_e4m3(const ql__cpu_kernels *kt, const ql_qrows_args *a) {
  size_t mk;
  if (a->x == NULL || a->xq == NULL || a->sx == NULL)
    return QL_EINVAL;
  if (a->m < 1 || a->m > QL_DIM_MAX || a->k < 1 || a->k > QL_DIM_MAX ||
      !mul_size((size_t)a->m, (size_t)a->k, &mk))
    return QL_ESHAPE;
  for (int64_t r = 0; r < a->m; r++) {
    int rc = kt->quant_row_e4m3(
        QL_DTYPE_F32, a->x + (size_t)r * (size_t)a->k, a->k,
        (uint8_t *)a->xq + (size_t)r * (size_t)a->k, NULL, a->sx + r);
    if (rc != 0)
      return rc;
  }
  return 0;
}

/* QL_OP_QUANTIZE_ROWS: f32 rows at the level's speed, the same bytes as
 * ql_quantize_rows_i8_src / _e4m3_src and their argument checks. Rows of
 * another src (whose values the reference also checks for
 * representability) go to the reference. */
static int run_qrows(ql__cpu_level level, const ql_qrows_args *a) {
  const ql__cpu_kernels *kt = kernels(level);
  size_t mk, mg, ng;
  if (a == NULL)
    return QL_EINVAL;
  ql_dtype src = (int)a->src == 0 ? QL_DTYPE_F32 : a->src;
  if (a->kind == QL_QROWS_E4M3)
    return a->gsum != NULL ? QL_EINVAL
           : src != QL_DTYPE_F32
               ? ql_quantize_rows_e4m3_src(src, a->x, a->m, a->k, a->xq,
                                           a->sx)
               : run_qrows_e4m3(kt, a);
  if (a->kind != QL_QROWS_I8)
    return QL_EINVAL;
  if (src != QL_DTYPE_F32)
    return ql_quantize_rows_i8_src(src, a->x, a->m, a->k, a->gs, a->xq, a->sx,
                                   a->gsum);
  if (a->x == NULL || a->xq == NULL || a->sx == NULL || a->gs < 1)
    return QL_EINVAL;
  if (a->m < 1 || a->m > QL_DIM_MAX || a->k < 1 || a->k > QL_DIM_MAX)
    return QL_ESHAPE;
  ng = (size_t)a->k / a->gs + ((size_t)a->k % a->gs != 0);
  if (!mul_size((size_t)a->m, (size_t)a->k, &mk) ||
      !mul_size((size_t)a->m, ng, &mg))
    return QL_ESHAPE;
  if (a->gsum != NULL &&
      ((int64_t)a->gs < a->k ? (int64_t)a->gs : a->k) > QL_QROWS_MAX_GROUP)
    return QL_ESHAPE;
  for (int64_t r = 0; r < a->m; r++) {
    int8_t *q = (int8_t *)a->xq + (size_t)r * (size_t)a->k;
    int rc = kt->quant_row(QL_DTYPE_F32, a->x + (size_t)r * (size_t)a->k, a->k,
                           q, a->sx + r);
    if (rc != 0)
      return rc;
    if (a->gsum != NULL)
      for (size_t g = 0, k0 = 0; k0 < (size_t)a->k; g++, k0 += a->gs) {
        size_t k1 = (size_t)a->k - k0 < a->gs ? (size_t)a->k : k0 + a->gs;
        int32_t s = 0;
        for (size_t i = k0; i < k1; i++)
          s += q[i];
        a->gsum[(size_t)r * ng + g] = s;
      }
  }
  return 0;
}

static int repack(ql_repack_args *a) {
  ql__cpu_packed *p = NULL;
  int rc = ql__cpu_pack(a->w, &p);
  a->packed = p;
  a->packed_bytes = rc == 0 ? p->bytes + sizeof *p : 0;
  return rc;
}

static void free_packed(void *p) { ql__cpu_packed_free(p); }

static int image(const void *packed, const void **data, size_t *len) {
  const ql__cpu_packed *p = packed;
  *data = p->data;
  *len = p->bytes;
  return 0;
}

static int adopt(const ql_qweight *w, const void *data, size_t len,
                 void **packed, size_t *packed_bytes) {
  ql__cpu_packed *p = NULL;
  int rc = ql__cpu_packed_adopt(w, data, len, &p);
  *packed = p;
  *packed_bytes = rc == 0 ? p->bytes + sizeof *p : 0;
  return rc;
}

/* ------------------------------------------------------- registration */

/* supports() of level L: only at the level the process runs at. The q8c
 * AQ bound on K is the generic one (int32 sums). */
#define LEVEL_FUNCS(L, tag)                                                    \
  static int sup_##tag(const ql_kernel_impl *im, ql_format f, int64_t m,       \
                       int64_t n, int64_t k) {                                 \
    (void)im, (void)f, (void)m, (void)n, (void)k;                              \
    return ql__cpu_level_get() == (L);                                         \
  }                                                                            \
  static int sup_aq_##tag(const ql_kernel_impl *im, ql_format f, int64_t m,    \
                          int64_t n, int64_t k) {                              \
    return sup_##tag(im, f, m, n, k) &&                                        \
           (f != QL_FORMAT_Q8C || k <= QL_AQ_Q8C_MAX_K);                       \
  }                                                                            \
  static int wo_##tag(const ql_linear_args *a) { return run_wo((L), a); }      \
  static int aq_##tag(const ql_linear_args *a) { return run_aq((L), a); }      \
  static int qrows_##tag(const ql_qrows_args *a) { return run_qrows((L), a); }

LEVEL_FUNCS(QL_CPU_LEVEL_AVX512, avx512)
LEVEL_FUNCS(QL_CPU_LEVEL_AVX2_VNNI, avx2vnni)
LEVEL_FUNCS(QL_CPU_LEVEL_AVX2, avx2)
LEVEL_FUNCS(QL_CPU_LEVEL_C, c)

#define IMPL_LIN(nm, o, fm, sup, f)                                            \
  {                                                                            \
    .name = nm, .op = o, .formats = fm, .dtypes = QL_ALL_DTYPES,               \
    .supports = sup, .fn = {.linear = f}                                       \
  }
#define IMPL_WO(nm, sup, f) IMPL_LIN(nm, QL_OP_LINEAR_WO, FMTS_WO, sup, f)
#define IMPL_AQ(nm, sup, f) IMPL_LIN(nm, QL_OP_LINEAR_AQ, FMTS_AQ, sup, f)
/* quantize_rows: f32 activations only; rows that came from f16/bf16 take
 * the generic op. */
#define IMPL_QROWS(nm, sup, f)                                                 \
  {                                                                            \
    .name = nm, .op = QL_OP_QUANTIZE_ROWS, .formats = FMTS_QROWS,              \
    .dtypes = QL_DT_BIT(QL_DTYPE_F32), .supports = sup,                        \
    .fn = {.quantize_rows = f}                                                 \
  }

static const ql_kernel_impl impls[] = {
    {.name = "cpu.repack",
     .op = QL_OP_REPACK,
     .formats = FMTS_WO,
     .dtypes = QL_ALL_DTYPES,
     .fn = {.repack = repack},
     .free_packed = free_packed,
     .layout_id = QL_CPU_LAYOUT_ID,
     .image = image,
     .adopt = adopt},

    IMPL_WO("cpu.avx512.linear_wo", sup_avx512, wo_avx512),
    IMPL_WO("cpu.avx2vnni.linear_wo", sup_avx2vnni, wo_avx2vnni),
    IMPL_WO("cpu.avx2.linear_wo", sup_avx2, wo_avx2),
    IMPL_WO("cpu.c.linear_wo", sup_c, wo_c),

    IMPL_AQ("cpu.avx512.linear_aq", sup_aq_avx512, aq_avx512),
    IMPL_AQ("cpu.avx2vnni.linear_aq", sup_aq_avx2vnni, aq_avx2vnni),
    IMPL_AQ("cpu.avx2.linear_aq", sup_aq_avx2, aq_avx2),
    IMPL_AQ("cpu.c.linear_aq", sup_aq_c, aq_c),

    IMPL_QROWS("cpu.avx512.quantize_rows", sup_avx512, qrows_avx512),
    IMPL_QROWS("cpu.avx2vnni.quantize_rows", sup_avx2vnni, qrows_avx2vnni),
    IMPL_QROWS("cpu.avx2.quantize_rows", sup_avx2, qrows_avx2),
    IMPL_QROWS("cpu.c.quantize_rows", sup_c, qrows_c),
};

static int configure(const ql_backend_config *c) {
  int rc = ql__cpu_level_set(c->level);
  return rc != 0 ? rc : ql__cpu_set_threads(c->threads);
}

static unsigned host_threads(void) { return (unsigned)ql__cpu_threads(); }

const ql_backend ql__backend_cpu = {
    .name = "cpu",
    .impls = impls,
    .n_impls = sizeof impls / sizeof impls[0],
    .configure = configure,
    .host_threads = host_threads,
};
