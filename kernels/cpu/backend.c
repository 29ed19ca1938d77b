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
#include <stdatomic.h>
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

/* The kernels of level l, or of the level this CPU has in its place (an
 * implementation called without dispatch never runs instructions the CPU
 * lacks): the highest it has when l is above it, and avx2 for avx2vnni on
 * a CPU with AVX-512 VNNI but not AVX-VNNI (the levels are ordered, the
 * features are not). */
static const ql__cpu_kernels *kernels(ql__cpu_level l) {
  return ql__cpu_kernels_for(ql__cpu_level_capped(l));
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

/*
 * One linear call split over the pool as a grid of tparts x mparts: part
 * p computes the tiles [tiles·i/tparts, tiles·(i+1)/tparts) for the rows
 * [m·j/mparts, m·(j+1)/mparts), i = p % tparts, j = p / tparts. Rows are
 * split only when there are fewer tiles than parts (a narrow layer with a
 * large batch); the split changes which thread computes an output, never
 * how (cpu.h).
 *
 * A launch in parts (ql_linear_part) is split differently: into pieces of
 * rb rows x tb tiles, numbered row block first (each row block's x stays
 * in cache while its pieces pass over the weight, as the kernels' own row
 * chunks do), which the threads claim in order from a shared counter. A
 * claimed piece is always finished, so when the threads stop claiming the
 * pieces [0, counter) are done: the launch goes on from there next time.
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
  int cap; /* the most pool threads lin_run may use; 0: any */
  /* A launch in parts. */
  ql_linear_part *part;
  ql_dtype dt;  /* y's dtype: pieces store their own columns */
  void *yout;   /* y itself, when y above is an f32 buffer */
  int64_t rb, tb, ntb, pieces;
  atomic_llong next; /* the next piece to claim */
} lin_job;

/* The kernel of j's op over tiles [t0, t1) for rows [r0, r1). */
static void lin_block(const lin_job *j, int64_t r0, int64_t r1, int64_t t0,
                      int64_t t1) {
  const ql__cpu_packed *p = j->p;
  float *y = j->y + (size_t)r0 * (size_t)p->n;
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

static void lin_part(void *ctx, int part, int parts) {
  const lin_job *j = ctx;
  const ql__cpu_packed *p = j->p;
  int tparts = j->tparts, mparts = parts / tparts;
  int ti = part % tparts, mi = part / tparts;
  int64_t t0 = p->tiles * ti / tparts, t1 = p->tiles * (ti + 1) / tparts;
  int64_t r0 = j->m * mi / mparts, r1 = j->m * (mi + 1) / mparts;
  assert(parts % tparts == 0);
  if (t0 < t1 && r0 < r1)
    lin_block(j, r0, r1, t0, t1);
}

/* A launch in parts: claims pieces until they run out or the caller asks
 * it to stop (after its first piece, so that every call gets on). */
static void lin_piece(void *ctx, int part, int parts) {
  lin_job *j = ctx;
  const ql__cpu_packed *p = j->p;
  ql_linear_part *lp = j->part;
  size_t esz = ql_dtype_size(j->dt);
  (void)part, (void)parts;
  for (int first = 1;; first = 0) {
    if (!first && lp->stop != NULL && lp->stop(lp->ctx))
      return;
    int64_t c = atomic_fetch_add(&j->next, 1);
    if (c >= j->pieces)
      return;
    int64_t r0 = c / j->ntb * j->rb, t0 = c % j->ntb * j->tb;
    int64_t r1 = r0 + j->rb < j->m ? r0 + j->rb : j->m;
    int64_t t1 = t0 + j->tb < p->tiles ? t0 + j->tb : p->tiles;
    lin_block(j, r0, r1, t0, t1);
    if (j->yout != NULL) {
      int64_t c0 = t0 * QL_CPU_TILE, c1 = t1 * QL_CPU_TILE;
      if (c1 > p->n)
        c1 = p->n;
      for (int64_t r = r0; r < r1; r++) {
        size_t at = (size_t)r * (size_t)p->n + (size_t)c0;
        ql_from_f32(j->dt, j->y + at, (char *)j->yout + at * esz,
                    (size_t)(c1 - c0));
      }
    }
  }
}

/* Runs the job on as many pool threads as the work is worth, then stores
 * y (already there for f32 outputs). Tiles are split first; what is left
 * of the threads splits the rows. */
static void lin_run(lin_job *j, const ql_linear_args *a) {
  double macs = (double)j->m * (double)a->w->n * (double)a->w->k;
  int parts = macs < (double)PARALLEL_MIN_MACS ? 1 : ql__cpu_threads();
  if (j->cap > 0 && parts > j->cap)
    parts = j->cap;
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

/* Multiply-adds of one piece of a launch in parts: tens of µs of one
 * thread at the SIMD levels, small against a prefill launch and large
 * against the pool's wake-up and a claim. AQ pieces take twice the WO's
 * (its integer dot products run about 4x the multiply-adds of FMAs), so
 * that their row blocks are 60 rows at K = 4096, not 24: a weight larger
 * than the caches is read from memory once per row block, and a lone
 * M = 512 request on a 14336x4096 q8c weight took 1.4x the in-process
 * call for it (the daemon's job 51 ms against 35); now 37 ms against 34
 * (1.09x) on the 2-core Zen 5 VM (qlinear-bench daemon). A decode request
 * waits for the pieces running when it comes: 2^25 (96 rows) gave 1.07x,
 * but pieces of twice the length. */
#define PIECE_MACS ((int64_t)1 << 23)
#define PIECE_MACS_AQ ((int64_t)1 << 24)
#define PIECE_MACS_OF(aq) ((aq) ? PIECE_MACS_AQ : PIECE_MACS)
/* x bytes of one piece's row block: the kernels' own row chunk (an L2's
 * share). */
#define PIECE_X_BYTES ((int64_t)384 << 10)

/* Sizes the pieces of j's launch in parts (lin_piece). */
static void piece_plan(lin_job *j) {
  const ql__cpu_packed *p = j->p;
  int64_t row_bytes = j->aq ? j->xq.kp : p->k * (int64_t)sizeof(float);
  int64_t rb = PIECE_X_BYTES / (row_bytes > 0 ? row_bytes : 1) / 12 * 12;
  const int64_t macs = PIECE_MACS_OF(j->aq);
  /* Fewer rows where one 4-tile pass over them would be a long piece. */
  int64_t rb_time = macs / (4 * QL_CPU_TILE * p->k) / 12 * 12;
  if (rb > rb_time)
    rb = rb_time;
  if (rb < 12)
    rb = 12;
  if (rb > j->m)
    rb = j->m;
  int64_t per_tile = rb * QL_CPU_TILE * p->k, tb = macs / per_tile;
  /* the kernels' 4-tile passes (q8c AQ batches of 7-24 rows go 3 tiles
   * at a time and leave a tile or two to the whole-K blocks: a little
   * slower, the same bytes) */
  tb = tb < 4 ? 4 : tb / 4 * 4;
  if (tb > p->tiles)
    tb = p->tiles;
  j->rb = rb;
  j->tb = tb;
  j->ntb = (p->tiles + tb - 1) / tb;
  j->pieces = (j->m + rb - 1) / rb * j->ntb;
}

/*
 * What a linear call prepares before its kernels run (x widened to f32
 * and checked, or quantized; the f32 buffer of a 16-bit y; the layout when
 * the caller had none) and its job. The rows are prepared independently,
 * in parts over the pool; a launch in parts keeps all of it between its
 * calls (ql_linear_part.state) and prepares its rows in pieces that stop
 * as its kernel pieces do, so that no call runs long before it can stop.
 */
typedef struct prep {
  lin_job j;
  int aq;
  ql_dtype dt;
  const void *x;       /* the caller's x (first call) */
  int64_t m, k, kp;
  ql__cpu_packed *tmp; /* a layout built for this launch */
  const float *xf;     /* x as f32: the caller's or xbuf */
  float *xbuf;         /* x widened to f32 */
  float *ybuf;         /* y in f32 for a 16-bit dtype */
  float *xs;           /* WO q4g: group sums of x */
  int8_t *xq;          /* int8 AQ */
  float *sx, *gsumf;
  int32_t *gsum8;
  uint8_t *xc;         /* f8r AQ */
  float *xe;
  /* A launch in parts: rows prepared in pieces of prep_rows, claimed in
   * order; the first error found fails the launch. */
  int64_t prep_rows, prep_pieces;
  atomic_llong prep_next;
  atomic_int prep_rc;
  int rc[256]; /* a whole call: per part (the pool has at most 256) */
} prep;

static void prep_free(void *v) {
  prep *st = v;
  if (st == NULL)
    return;
  ql__cpu_packed_free(st->tmp);
  free(st->xbuf);
  free(st->ybuf);
  free(st->xs);
  free(st->xq);
  free(st->sx);
  free(st->gsumf);
  free(st->gsum8);
  free(st->xc);
  free(st->xe);
  free(st);
}

/*
 * Allocates what the call of a (already checked) needs and fills the
 * job but for the rows, which prep_rows() prepares. q8b has no AQ path
 * (QL_ENOTSUP, as the generic op), q8c AQ a bound on K (QL_ESHAPE).
 */
static int prep_alloc(ql__cpu_level level, int aq, const ql_linear_args *a,
                      prep *st) {
  const ql__cpu_packed *p;
  int64_t m = a->m, k = a->w->k, kb, ng;
  size_t mkp, xe_bytes;
  int rc;

  if (aq && a->w->format == QL_FORMAT_Q8B)
    return QL_ENOTSUP;
  if (aq && a->w->format == QL_FORMAT_Q8C && k > QL_AQ_Q8C_MAX_K)
    return QL_ESHAPE;
  st->aq = aq;
  st->dt = a->dt;
  st->x = a->x;
  st->m = m;
  st->k = k;
  kb = a->w->format == QL_FORMAT_Q4G ? QL_CPU_Q4G_KB : QL_CPU_Q8C_KB;
  st->kp = (k + kb - 1) / kb * kb;
  if (!mul_size((size_t)m, (size_t)st->kp, &mkp) ||
      !mul_size(mkp, sizeof(float), &xe_bytes))
    return QL_ESHAPE;
  if ((rc = layout(a, &p, &st->tmp)) != 0)
    return rc;
  st->j.kt = kernels(level);
  st->j.p = p;
  st->j.aq = aq;
  st->j.m = m;
  st->j.bias = a->w->bias;
  rc = QL_ENOMEM;
  if (a->dt == QL_DTYPE_F32) {
    st->xf = a->x;
    st->j.y = a->y;
  } else {
    /* linear_args() bounded m·k and m·n floats */
    if ((st->xbuf = malloc((size_t)m * (size_t)k * sizeof(float))) == NULL ||
        (st->ybuf = malloc((size_t)m * (size_t)a->w->n * sizeof(float))) ==
            NULL)
      return rc;
    st->xf = st->xbuf;
    st->j.y = st->ybuf;
  }
  if (!aq) {
    st->j.x = st->xf;
    if (p->format == QL_FORMAT_Q4G) {
      if ((st->xs = malloc((size_t)m * (size_t)p->groups * sizeof(float))) ==
          NULL)
        return rc;
      st->j.xs = st->xs;
    }
    return 0;
  }
  if ((st->sx = malloc((size_t)m * sizeof(float))) == NULL)
    return rc;
  if (p->format == QL_FORMAT_F8R) {
    if ((st->xc = malloc(mkp)) == NULL || (st->xe = malloc(xe_bytes)) == NULL)
      return rc;
    st->j.xq = (ql__cpu_xq){NULL, m, st->kp, st->sx, NULL, NULL, st->xc,
                            st->xe};
    return 0;
  }
  ng = p->format == QL_FORMAT_Q4G ? p->groups : 1;
  if ((st->xq = malloc(mkp)) == NULL ||
      (st->gsum8 = malloc((size_t)m * (size_t)ng * sizeof(int32_t))) == NULL ||
      (st->gsumf = malloc((size_t)m * (size_t)ng * sizeof(float))) == NULL)
    return rc;
  st->j.xq = (ql__cpu_xq){st->xq, m, st->kp, st->sx, st->gsum8, st->gsumf,
                          NULL, NULL};
  st->j.ng = ng;
  return 0;
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

/*
 * Prepares the rows [r0, r1): widened to f32 when x is 16-bit; for WO
 * checked finite (QL_ENONFINITE) with q4g's group sums; for AQ quantized
 * with the bit-exact int8 or e4m3 rule (ql_kernels.h), which fails NaN and
 * Inf the same way. Rows are independent, so any split gives the same
 * bytes.
 */
static int prep_rows(prep *st, int64_t r0, int64_t r1) {
  const ql__cpu_packed *p = st->j.p;
  const ql__cpu_kernels *kt = st->j.kt;
  size_t k = (size_t)st->k, kp = (size_t)st->kp, rows = (size_t)(r1 - r0);
  const float *xf = st->xf;
  if (st->xbuf != NULL)
    ql_to_f32(st->dt,
              (const char *)st->x + (size_t)r0 * k * ql_dtype_size(st->dt),
              st->xbuf + (size_t)r0 * k, rows * k);
  if (!st->aq) {
    for (size_t i = (size_t)r0 * k; i < (size_t)r1 * k; i++)
      if (!isfinite(xf[i]))
        return QL_ENONFINITE;
    if (p->format == QL_FORMAT_Q4G)
      ql_q4g_group_sums(xf + (size_t)r0 * k, r1 - r0, p->k, p->gs,
                        st->xs + (size_t)r0 * (size_t)p->groups);
    return 0;
  }
  if (p->format != QL_FORMAT_F8R)
    return quantize_x(kt, p, st->dt, xf, r0, r1, st->xq, st->kp, st->sx,
                      st->gsum8, st->gsumf);
  for (int64_t r = r0; r < r1; r++) {
    uint8_t *c = st->xc + (size_t)r * kp;
    float *e = st->xe + (size_t)r * kp;
    int rc = kt->quant_row_e4m3(st->dt, xf + (size_t)r * k, (int64_t)k, c, e,
                                st->sx + r);
    if (rc != 0)
      return rc;
    memset(c + k, 0, kp - k);
    memset(e + k, 0, (kp - k) * sizeof(float));
  }
  return 0;
}

/* A whole call's rows, in fixed parts over the pool; each part records
 * the error of its first bad row, and the call returns that of the lowest
 * part, as the reference does. */
static void prep_part(void *ctx, int part, int parts) {
  prep *st = ctx;
  st->rc[part] = prep_rows(st, st->m * part / parts,
                           st->m * (part + 1) / parts);
}

/* A launch in parts: claims pieces of rows until they run out, one fails,
 * or the caller asks it to stop (after its first piece). */
static void prep_piece(void *ctx, int part, int parts) {
  prep *st = ctx;
  ql_linear_part *lp = st->j.part;
  (void)part, (void)parts;
  for (int first = 1;; first = 0) {
    if (atomic_load(&st->prep_rc) != 0 ||
        (!first && lp->stop != NULL && lp->stop(lp->ctx)))
      return;
    int64_t c = atomic_fetch_add(&st->prep_next, 1);
    if (c >= st->prep_pieces)
      return;
    int64_t r0 = c * st->prep_rows;
    int64_t r1 = r0 + st->prep_rows < st->m ? r0 + st->prep_rows : st->m;
    int rc = prep_rows(st, r0, r1), none = 0;
    if (rc != 0)
      atomic_compare_exchange_strong(&st->prep_rc, &none, rc);
  }
}

/* Values of x prepared in one piece of rows: tens of microseconds. */
#define PREP_PIECE_VALUES ((int64_t)1 << 16)

/* Parts worth using to prepare m rows of k values. */
static int xq_parts(int64_t m, int64_t k) {
  int parts = (double)m * (double)k < (double)PARALLEL_MIN_XVALS
                  ? 1
                  : ql__cpu_threads();
  return (int64_t)parts > m ? (int)m : parts;
}

/*
 * QL_OP_LINEAR_WO (aq 0) and QL_OP_LINEAR_AQ (aq 1) at a level: the
 * argument checks, the rows prepared, then the kernels over the pool;
 * whole, or (a->part) in pieces that stop when asked, the launch keeping
 * what it prepared between its calls.
 */
static int run_linear_cap(ql__cpu_level level, int aq,
                          const ql_linear_args *a, unsigned cap);

static int run_linear(ql__cpu_level level, int aq, const ql_linear_args *a) {
  return run_linear_cap(level, aq, a, 0);
}

/* run_linear() on at most cap pool threads (0: as many as the work is
 * worth), for a launch in parts run whole. */
static int run_linear_cap(ql__cpu_level level, int aq,
                          const ql_linear_args *a, unsigned cap) {
  ql_linear_part *part = a->part;
  prep *st = part != NULL ? part->state : NULL;
  int threads, rc;
  size_t esz;

  /* A launch of a few pieces a thread runs whole: it ends about as soon
   * as it could stop, and pieces that few would not share out evenly. It
   * keeps to the threads the caller allowed the launch (part->threads:
   * the daemon leaves a CPU to decode work). */
  if (part != NULL && st == NULL &&
      (double)a->m * (double)a->w->n * (double)a->w->k <
          (double)PIECE_MACS_OF(aq) * 4 * ql__cpu_threads()) {
    ql_linear_args whole = *a;
    whole.part = NULL;
    rc = run_linear_cap(level, aq, &whole, part->threads);
    part->done = rc == 0;
    return rc;
  }
  if (st == NULL) {
    if ((rc = linear_args(a, &esz)) != 0)
      return rc;
    if ((st = calloc(1, sizeof *st)) == NULL)
      return QL_ENOMEM;
    if ((rc = prep_alloc(level, aq, a, st)) != 0)
      goto fail;
    if (part != NULL) {
      st->j.part = part;
      st->j.dt = a->dt;
      st->j.yout = a->dt == QL_DTYPE_F32 ? NULL : a->y;
      piece_plan(&st->j);
      atomic_init(&st->j.next, 0);
      st->prep_rows = PREP_PIECE_VALUES / st->k > 1 ? PREP_PIECE_VALUES / st->k
                                                    : 1;
      st->prep_pieces = (st->m + st->prep_rows - 1) / st->prep_rows;
      atomic_init(&st->prep_next, 0);
      atomic_init(&st->prep_rc, 0);
    }
  }
  threads = xq_parts(st->m, st->k);
  if (part != NULL && part->threads != 0 && (unsigned)threads > part->threads)
    threads = (int)part->threads;
  if (part == NULL) {
    if (cap != 0 && (unsigned)threads > cap)
      threads = (int)cap;
    ql__cpu_parallel(prep_part, st, threads);
    for (int i = 0; i < threads; i++)
      if ((rc = st->rc[i]) != 0)
        goto fail;
    st->j.cap = (int)cap;
    lin_run(&st->j, a);
    prep_free(st);
    return 0;
  }
  if (atomic_load(&st->prep_next) < st->prep_pieces) {
    ql__cpu_parallel(prep_piece, st, threads);
    if ((rc = atomic_load(&st->prep_rc)) != 0)
      goto fail;
    if (atomic_load(&st->prep_next) < st->prep_pieces)
      goto stopped;
    /* x is prepared: for AQ its f32 copy is not read again. */
    if (aq) {
      free(st->xbuf);
      st->xbuf = NULL;
    }
  }
  double macs = (double)a->m * (double)a->w->n * (double)a->w->k;
  threads = macs < (double)PARALLEL_MIN_MACS ? 1 : ql__cpu_threads();
  if (part->threads != 0 && (unsigned)threads > part->threads)
    threads = (int)part->threads;
  ql__cpu_parallel(lin_piece, &st->j, threads);
  if (atomic_load(&st->j.next) < st->j.pieces)
    goto stopped;
  part->state = NULL;
  part->done = 1;
  prep_free(st);
  return 0;
stopped:
  part->state = st;
  part->state_free = prep_free;
  part->done = 0;
  return 0;
fail:
  prep_free(st);
  if (part != NULL)
    part->state = NULL;
  return rc;
}

static int run_wo(ql__cpu_level level, const ql_linear_args *a) {
  return run_linear(level, 0, a);
}

static int run_aq(ql__cpu_level level, const ql_linear_args *a) {
  return run_linear(level, 1, a);
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
    .supports = sup, .fn = {.linear = f}, .parts = 1                           \
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
    .linear_parts = 1,
};
