/*
 * test_conformance.c - the cross-backend conformance harness (DESIGN §4,
 * §5, §11). One program: for the generic fallback and for every backend
 * that kernels/backends.c registers, it asks the registry which
 * implementation the daemon would run for each case (ql_dispatch, also for
 * the repack that builds the layout it runs on) and checks that
 * implementation against the reference. A backend joins by being
 * registered; nothing below names one. A case the registry gives no
 * implementation for (AQ of the weight-only q8b, q8c AQ past
 * QL_AQ_Q8C_MAX_K) is reported as skipped, with the reason.
 *
 * Checks:
 *  - quantize_rows (int8 and e4m3): output bytes (codes, scales, group
 *    sums) identical to ql_quantize_rows_i8_src / _e4m3_src, for a
 *    batch and for every row alone, on activation rows that include the
 *    adversarial rows of DESIGN §4 (checked to be adversarial, against
 *    expectations computed here);
 *  - linear_wo: |y - y64| <= bound, y64 the fp64 product x·dequant(W)ᵀ (+b)
 *    of the same canonical weight (ql_qweight_dequantize);
 *  - linear_aq: the same kind of bound against the fp64 evaluation of the
 *    AQ formula of DESIGN §4 on the reference quantize_rows output;
 *  - batch invariance: each row computed alone (M = 1, through whatever
 *    the registry dispatches for M = 1) has the same bytes as inside the
 *    batch;
 *  - nothing written past an output (a canary after every buffer), every
 *    output written (buffers start as NaN / the complement of the answer);
 *  - mapped mode (built with QL_CONFORMANCE_MAPPED): a backend that exports
 *    its layouts (export_layout) runs each linear_wo case again through
 *    libqlinear-cuda on a read-only import of the exported layout, as a
 *    mapping client does (mapped_case.h): the same bytes as its own
 *    launch;
 *  - NaN or ±Inf in an activation row gives QL_ENONFINITE;
 *  - NMSE against the unquantized product within a two-sided band around
 *    the value predicted from each format's quantization step (see
 *    run_nmse), so that an implementation that does not quantize fails.
 *
 * Bounds (u = 2^-24, γ(n) = n·u / (1 - n·u), η = 2^-149 per operation for
 * underflow), computed in ref_wo() / ref_aq():
 *  WO:  γ(K+3)·(Σk |x|·m_k + |b|) + (K+3)·η, m_k = |q·s| + |z| for formats
 *       with a zero point, else |ŵ|: K products and sums, the bias, and
 *       two roundings for a dequantization done in-kernel in another order
 *       (an FMA q·s+z, say); q4g, whose zero is factored out of each group
 *       (s·Σx·q + z·Σx), adds G to both counts.
 *  AQ q8c: γ(4)·(|acc·sx·sw| + |b|): int32 acc exact, then at most
 *       4 roundings (acc to f32, sx·sw, the product, the bias).
 *  AQ q4g: γ(2G+5)·(|sx|·Σg(|s|(|A|+8|S|) + (|z|+8|s|)|S|) + |b|),
 *       A = Σ xq·q, S = Σ xq per group: covers the reference form and the
 *       VNNI form of DESIGN §4 (u = q+8, min = zero - 8·scale).
 *  AQ f8r: γ(K+3)·(|sx·sw|·Σk |x̃·w̃| + |b|): exact e4m3 products, f32 sums;
 *       on an FP8 tensor-core engine (an implementation whose name says
 *       cublaslt) the products are summed as those tensor cores sum them
 *       (DESIGN §4 as amended in README: 14 bits kept in blocks of 32,
 *       promoted to f32 every 128, measured by fp8-probe on an H200), so
 *       |sx·sw|·ql_fp8_acc_bound(p, 14, 32, 128) (tests/common/fp8_bound.h)
 *       + γ(3)·(|sx·sw|·Σ|p| + |b|) + (K+3)·η. QL_CONFORMANCE_F8R_BOUND=f32
 *       holds those engines to the f32 bound too: the mutation test that
 *       shows the f32 bound is not true of the hardware's (and the
 *       emulator's) accumulation.
 *  f16/bf16 outputs add half an ulp of that dtype at |y64| + bound.
 *
 * Coverage (a deterministic covering subset, printed at the start): the
 * full shape matrix for f32 activations and bf16 scales, each shape once
 * more under one of the 8 other (activation, scale) dtype pairs, rotating
 * with format and path; see build_shapes(). A case is one shape of one
 * (format, path, dtypes) group run by one distinct (implementation,
 * layout, lone-row implementation): backends that dispatch to the same
 * code share the case, and the group's line lists which backends ran what.
 *
 * The harness checks itself: fake implementations registered as a local
 * backend (one that skips quantization, one whose batch rows depend on
 * the batch, one that swaps rows, ...) go through the same checking code,
 * and each must be reported failing for the reason it was built to fail;
 * two controls (correct kernels written differently from the reference)
 * must pass.
 *
 * Options, for a backend too slow to run everything (an emulated GPU):
 *   --backend NAME  test NAME alone: the generic fallback is not in the
 *                   list, and a case NAME leaves to it is skipped (the run
 *                   without options checks the generic implementations);
 *   --small         a smaller shape matrix (SMALL_Ms x SMALL_Ns x
 *                   SMALL_Ks, the huge-K shapes kept), still with ragged
 *                   K, N = 1 and K larger than a 1024-value tile.
 * And for chasing one case on a real GPU (deploy/gpu-check --sanitize):
 *   --filter SUBSTR only the linear cases whose name contains SUBSTR; a
 *                   case's name is its group and its shape as a failure
 *                   prints them, spaces single, e.g.
 *                   "WO q8b/b32a act=f16 scale=f16 M=1 N=512 K=128 bias=1";
 *                   quantize_rows, non-finite x, NMSE and the self-check
 *                   do not run;
 *   --loop N        with --filter: the filtered cases N times over, in
 *                   this process; prints the failing runs only and ends
 *                   with how many of the N had a failure.
 *
 * Plain main(): the output is a report (what ran, dispatch, NMSE table,
 * skips) ending in "N passed, F failed, S skipped"; exit status 1 on any
 * failure. With QL_CONFORMANCE_FAIL_FAST set (not "0"), and always in a
 * program named mutant_* (the mutation tests), the run ends at its first
 * failing group. The linear groups run in two child processes (run time,
 * and a crashing implementation still leaves a report); a watchdog fails
 * the run instead of letting a hung implementation hang `make check`.
 */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ql_kernels.h"
#include "registry.h"
#include "testutil.h"
#include "../common/fp8_bound.h"
#ifdef QL_CONFORMANCE_MAPPED
#include "mapped_case.h"
#endif

/* The FP8 tensor cores' accumulation (fp8-probe, H200, sm_90). */
#define FP8_ACC_BITS 14
#define FP8_ACC_BLOCK 32
#define FP8_ACC_PROMOTE 128

/* ------------------------------------------------------------- plumbing */

static long g_passed, g_failed, g_skipped;

/* --backend: the one backend under test (NULL: every registered one and
 * the generic fallback). */
static const ql_backend *g_only;

/* --filter (NULL: every case) and --loop (0: once, with the workers). */
static const char *g_filter;
static long g_loop;

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (p == NULL) {
    fprintf(stderr, "conformance: out of memory (%zu bytes)\n", n);
    exit(2);
  }
  return p;
}

/* Output buffers get CANARY bytes of 0xA5 after their end; an
 * implementation that writes past its output is caught by canary_ok(). */
#define CANARY 64

static unsigned char *out_alloc(size_t n) {
  unsigned char *p = xmalloc(n + CANARY);
  memset(p + n, 0xA5, CANARY);
  return p;
}

static int canary_ok(const void *buf, size_t n) {
  const unsigned char *p = (const unsigned char *)buf + n;
  for (size_t i = 0; i < CANARY; i++)
    if (p[i] != 0xA5)
      return 0;
  return 1;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static const char *dtn(ql_dtype dt) { return tu_dtype_name(dt); }

/* The symbolic name of a QL_E* code, from the one list in ql_defs.h
 * (ql_err_name() lives in libqlproto, which this program does not link). */
static const char *errname(int rc) {
  if (rc == 0)
    return "0 (success)";
#define ERR_CASE_(name, val, msg)                                              \
  case val:                                                                    \
    return "QL_E" #name;
  switch (rc) {
    QL_ERRNO_MAP(ERR_CASE_)
  }
#undef ERR_CASE_
  return "unknown error";
}

/* A seed from a few small integers (splitmix of a running hash). */
static uint64_t seed_of(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  uint64_t s = 0x243F6A8885A308D3ull ^ a;
  s = tu_rng_next(&s) ^ b;
  s = tu_rng_next(&s) ^ c;
  s = tu_rng_next(&s) ^ d;
  return tu_rng_next(&s);
}

/* ------------------------------------------------- backends under test */

/* One entry of the list under test; b == NULL is the generic fallback
 * (ql_dispatch(NULL, ...) always answers the generic implementation). */
typedef struct bk {
  const char *name;
  const ql_backend *b;
} bk;

#define MAX_BK 16

/* Which implementations served a group, and for which backends (bit i =
 * bks[i]), so that the report names what the daemon would really run. */
typedef struct attr {
  const char *impl[8];
  unsigned mask[8];
  int n;
} attr;

static void attr_add(attr *a, const ql_kernel_impl *im, int bi) {
  int i;
  for (i = 0; i < a->n; i++)
    if (strcmp(a->impl[i], im->name) == 0)
      break;
  if (i == a->n) {
    if (a->n == 8)
      return;
    a->impl[a->n] = im->name;
    a->mask[a->n++] = 0;
  }
  a->mask[i] |= 1u << bi;
}

static void attr_print(const attr *a, const bk *bks, int nb) {
  printf("  [");
  for (int i = 0; i < a->n; i++) {
    int first = 1;
    printf("%s%s <-", i ? "; " : "", a->impl[i]);
    for (int j = 0; j < nb; j++)
      if (a->mask[i] & (1u << j)) {
        printf("%s%s", first ? " " : ",", bks[j].name);
        first = 0;
      }
  }
  printf("]");
}

/* ----------------------------------------------------- result sinks */

/* Why a case failed (bits), so that the self-check can tell that a fake
 * was caught by the check it was built to trip. */
enum {
  R_RC = 1,     /* the implementation returned an error */
  R_BOUND = 2,  /* |y - y64| above the bound (or NaN: output not written) */
  R_BATCH = 4,  /* a row differs alone and inside the batch */
  R_BYTES = 8,  /* quantize_rows bytes differ from the reference */
  R_NMSE = 16,  /* NMSE outside its band */
  R_CANARY = 32, /* wrote past the end of an output */
  R_MAPPED = 64  /* the mapped launch's bytes differ from the backend's */
};

static const char *why_names(unsigned w, char *buf, size_t n) {
  static const char *const nm[] = {"rc",   "bound",  "batch", "bytes",
                                   "nmse", "canary", "mapped"};
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 0; i < 7; i++)
    if (w & (1u << i))
      len += (size_t)snprintf(buf + len, n > len ? n - len : 0, "%s%s",
                              len ? "," : "", nm[i]);
  if (len == 0)
    snprintf(buf, n, "none");
  return buf;
}

/* Results of one group of cases. quiet: the self-check's fakes, whose
 * failures are expected, print nothing and touch no global counter. */
typedef struct sink {
  int quiet;
  const char *ctx; /* group description for failure messages */
  long passed, failed;
  unsigned why;    /* R_* bits over the failed cases */
  double worst;    /* largest |y - y64| / bound seen */
  int shown;       /* failure messages printed */
  char first[256]; /* quiet: the first failure message, for the report */
  long skipped;    /* cases no backend can run (ql_dispatch gave NULL) */
  char skipwhy[200];
  long nobatch;    /* cases with no M = 1 implementation to compare with */
  long mapped;     /* cases also run through a mapping (mapped_case.h),
                      with the same bytes: "N also mapped" */
  char mapped_skip[160]; /* why a backend's layouts were not mapped */
  attr at;
} sink;

#define MAX_SHOWN 4

static void note(sink *s, unsigned why, const char *fmt, ...) {
  va_list ap;
  s->why |= why;
  if (s->quiet && s->first[0] == '\0') {
    va_start(ap, fmt);
    vsnprintf(s->first, sizeof s->first, fmt, ap);
    va_end(ap);
  }
  if (s->quiet || s->shown >= MAX_SHOWN)
    return;
  s->shown++;
  printf("FAIL %s: ", s->ctx);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
}

static void case_done(sink *s, unsigned bad) {
  if (bad)
    s->failed++;
  else
    s->passed++;
}

/* A case that no implementation runs: the registry has nothing for it
 * (DESIGN §4 says why for the known ones). Counted as skipped. */
static void skip_case(sink *s, const char *fmt, ...) {
  va_list ap;
  if (s->skipped++ == 0) {
    va_start(ap, fmt);
    vsnprintf(s->skipwhy, sizeof s->skipwhy, fmt, ap);
    va_end(ap);
  }
}

static const char *no_impl_reason(ql_format f, int aq, int64_t k) {
  if (g_only != NULL)
    return "left to the generic fallback (--backend; the full run checks it)";
  if (aq && f == QL_FORMAT_Q8B)
    return "weight-only format (DESIGN §4)";
  if (aq && f == QL_FORMAT_Q8C && k > QL_AQ_Q8C_MAX_K)
    return "K > QL_AQ_Q8C_MAX_K = 131071 (int32 accumulator, DESIGN §4)";
  return "ql_dispatch gives no implementation";
}

/* ql_dispatch, except that with --backend a linear or quantize_rows case
 * that the backend leaves to the generic implementation gets NULL: it is
 * skipped, not run (repack is never filtered: a generic layout is only a
 * pointer to the canonical weight). */
static const ql_kernel_impl *dispatch(const ql_backend *b, ql_op op,
                                      ql_format f, ql_dtype dt, int64_t m,
                                      int64_t n, int64_t k) {
  const ql_kernel_impl *im = ql_dispatch(b, op, f, dt, m, n, k);
  if (g_only != NULL && op != QL_OP_REPACK && im == ql_generic_impl(op))
    return NULL;
  return im;
}

/*
 * Fail-fast (QL_CONFORMANCE_FAIL_FAST, or a program named mutant_*): the
 * mutation tests need one failure, not the whole matrix's, which is most
 * of their run time. The first group with a failure ends the run: in a
 * worker, with its counters and exit status FAIL_FAST_EXIT
 * (workers_finish() then stops the other worker); in the parent, after
 * killing the workers.
 */
#define WORKERS 2
#define FAIL_FAST_EXIT 4 /* a worker's status: stopped at a failure */
static int g_fail_fast, g_in_worker;
static pid_t g_worker_pid[WORKERS]; /* for the watchdog and fail-fast */

static void fail_fast_stop(const char *why) {
  if (!g_fail_fast)
    return;
  printf("FAIL fail-fast: the run stops at %s\n", why);
  if (g_in_worker) {
    printf("@counts %ld %ld %ld\n", g_passed, g_failed, g_skipped);
    fflush(stdout);
    _exit(FAIL_FAST_EXIT);
  }
  for (int w = 0; w < WORKERS; w++)
    if (g_worker_pid[w] > 0) {
      kill(g_worker_pid[w], SIGKILL);
      (void)waitpid(g_worker_pid[w], NULL, 0);
    }
  printf("%ld passed, %ld failed, %ld skipped (fail-fast)\n", g_passed,
         g_failed, g_skipped);
  fflush(stdout);
  exit(EXIT_FAILURE);
}

/* The group's closing lines, and the global counters. */
static void group_done(sink *s, const char *what, const bk *bks, int nb) {
  if (s->quiet)
    return;
  g_passed += s->passed;
  g_failed += s->failed;
  g_skipped += s->skipped;
  if (g_loop > 0 && s->failed == 0)
    return; /* --loop: the failing runs only */
  if (s->passed + s->failed > 0) {
    printf("%s %s: %ld cases", s->failed ? "FAIL" : "ok  ", what,
           s->passed + s->failed);
    if (s->failed)
      printf(" (%ld failed)", s->failed);
    if (s->worst > 0.0)
      printf(", worst err/bound %.3g", s->worst);
    if (s->mapped)
      printf(", %ld also mapped", s->mapped);
    attr_print(&s->at, bks, nb);
    printf("\n");
  }
  if (s->nobatch)
    printf("note %s: batch invariance not checked in %ld cases: nothing "
           "runs M = 1\n", what, s->nobatch);
  if (s->mapped_skip[0] != '\0')
    printf("note %s: %s\n", what, s->mapped_skip);
  if (s->skipped)
    printf("skip %s: %ld case%s, no implementation on any backend: %s\n",
           what, s->skipped, s->skipped > 1 ? "s" : "", s->skipwhy);
  if (s->failed)
    fail_fast_stop("its first failing group");
}

/* --------------------------------------------------- formats and data */

typedef struct fcfg {
  ql_format f;
  uint32_t gs; /* q4g group, q8b block; 0 for q8c, f8r */
  int asym;    /* q8b only */
} fcfg;

static const fcfg fcfgs[] = {
    {QL_FORMAT_Q4G, 32, 0},  {QL_FORMAT_Q4G, 64, 0},  {QL_FORMAT_Q4G, 128, 0},
    {QL_FORMAT_Q4G, 256, 0}, {QL_FORMAT_Q8B, 32, 0},  {QL_FORMAT_Q8B, 64, 0},
    {QL_FORMAT_Q8B, 128, 0}, {QL_FORMAT_Q8B, 256, 0}, {QL_FORMAT_Q8B, 32, 1},
    {QL_FORMAT_Q8B, 64, 1},  {QL_FORMAT_Q8B, 128, 1}, {QL_FORMAT_Q8B, 256, 1},
    {QL_FORMAT_Q8C, 0, 0},   {QL_FORMAT_F8R, 0, 0},
};
#define NFCFG ((int)(sizeof fcfgs / sizeof fcfgs[0]))

static const char *fcfg_name(const fcfg *c, char *buf, size_t n) {
  switch (c->f) {
  case QL_FORMAT_Q4G:
    snprintf(buf, n, "q4g/g%u", c->gs);
    break;
  case QL_FORMAT_Q8B:
    snprintf(buf, n, "q8b/b%u%s", c->gs, c->asym ? "a" : "s");
    break;
  case QL_FORMAT_Q8C:
    snprintf(buf, n, "q8c");
    break;
  default:
    snprintf(buf, n, "f8r");
  }
  return buf;
}

/* float8 e4m3fn, decoded here independently of the library. */
static double e4m3_dec(uint8_t c) {
  int e = (c >> 3) & 15, m = c & 7;
  double v;
  if (e == 15 && m == 7)
    return NAN;
  v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
  return (c & 0x80) ? -v : v;
}

/* Width of the e4m3 bin that holds |v| (v in units of the scale). */
static double e4m3_step(double v) {
  int e;
  v = fabs(v);
  if (v < 0x1p-6)
    return 0x1p-9;
  frexp(v, &e); /* v in [2^(e-1), 2^e): 3 mantissa bits below 2^(e-1) */
  return ldexp(1.0, e - 1 - 3);
}

/*
 * Activation rows, by r % 8: the adversarial rows of DESIGN §4 between
 * Gaussian ones. Every value is exact in f16 and bf16 where the row's
 * point depends on it (ties, -128, ±448), so the rows stay adversarial
 * whatever the activation dtype.
 */
enum {
  ROW_GAUSS,     /* ~N(0,1) (gauss4) */
  ROW_I8_TIES,   /* amax 127.5/16: 1/scale = 16 and every x·16 = j + 0.5;
                    x[0] = -amax -> -128, +amax also present -> 127 */
  ROW_E4M3_TIES, /* amax 14: scale 2^-5 and every x/scale the midpoint of
                    two e4m3 codes; x[0] = -amax -> -448 */
  ROW_ZERO,      /* all zero: scale clamps to eps / 1e-12 */
  ROW_PM_AMAX,   /* ~N(0,1) with +6 and -6 (±amax: |gauss4| < 3.47) */
  ROW_CONST,     /* constant 0.75 */
  ROW_SMALL,     /* ~N(0,1)·1e-3 */
  ROW_NEG_CONST, /* constant -127.5/128: scale 2^-7, every q = -128 */
  ROW_KINDS
};

static const char *const row_kind_name[ROW_KINDS] = {
    "gauss", "int8 ties", "e4m3 ties", "zeros",
    "+-amax", "const", "small", "const -127.5/128"};

/* Near-Gaussian (sum of four uniforms, unit variance, |v| < 3.47): the
 * conformance data needs a bell shape, not Box–Muller's tails, and this
 * costs no log or cos. The NMSE data uses the real thing. */
static double gauss4(uint64_t *rng) {
  double t = 0.0;
  for (int i = 0; i < 4; i++)
    t += tu_rng_uniform(rng);
  return (t - 2.0) * 1.7320508075688772;
}

/* Midpoint between e4m3 codes c and c+1 (0 <= c < 0x7E). */
static double e4m3_mid(int c) {
  return (e4m3_dec((uint8_t)c) + e4m3_dec((uint8_t)(c + 1))) / 2.0;
}

static void make_x_row(uint64_t *rng, int kind, float *x, int64_t k) {
  int64_t i;
  for (i = 0; i < k; i++) {
    switch (kind) {
    case ROW_GAUSS:
    case ROW_PM_AMAX:
      x[i] = (float)gauss4(rng);
      break;
    case ROW_I8_TIES:
      x[i] = i == 0 ? -127.5f / 16.0f
                    : (float)((double)((i * 37) % 255) - 127.0 + 0.5) / 16.0f;
      break;
    case ROW_E4M3_TIES: {
      int c = (int)((i * 29) % 126);
      double v = e4m3_mid(c) / 32.0;
      x[i] = i == 0 ? -14.0f : (float)(((i + i / 126) & 1) ? -v : v);
      break;
    }
    case ROW_ZERO:
      x[i] = 0.0f;
      break;
    case ROW_CONST:
      x[i] = 0.75f;
      break;
    case ROW_SMALL:
      x[i] = (float)(1e-3 * gauss4(rng));
      break;
    default:
      x[i] = -127.5f / 128.0f;
    }
  }
  if (kind == ROW_PM_AMAX) {
    x[0] = 6.0f;
    x[k / 2] = -6.0f;
  }
}

/* x [m,k]: f32 rows (by kind), narrowed to dt in xn, widened back in xw
 * (the values every reference uses). The rows depend on k and r only, so
 * a batch of m rows is a prefix of a batch of more rows. */
static void make_x(int64_t m, int64_t k, ql_dtype dt, void *xn, float *xw) {
  uint64_t rng = seed_of(1, (uint64_t)k, 0, 0);
  for (int64_t r = 0; r < m; r++)
    make_x_row(&rng, (int)(r % ROW_KINDS), xw + r * k, k);
  ql_from_f32(dt, xw, xn, (size_t)(m * k));
  ql_to_f32(dt, xn, xw, (size_t)(m * k));
}

/* The rows of the last make_x_cached() call: consecutive groups share K
 * and the activation dtype, and the Gaussian rows are not free to draw. */
static struct {
  int64_t m, k;
  ql_dtype dt;
  void *xn;
  float *xw;
} xc;

static void make_x_cached(int64_t m, int64_t k, ql_dtype dt, void **xn,
                          float **xw) {
  if (xc.xn == NULL || xc.k != k || xc.dt != dt || xc.m < m) {
    free(xc.xn);
    free(xc.xw);
    xc.m = m;
    xc.k = k;
    xc.dt = dt;
    xc.xn = xmalloc((size_t)(m * k) * ql_dtype_size(dt));
    xc.xw = xmalloc((size_t)(m * k) * sizeof(float));
    make_x(m, k, dt, xc.xn, xc.xw);
  }
  *xn = xc.xn;
  *xw = xc.xw;
}

static void xcache_free(void) {
  free(xc.xn);
  free(xc.xw);
  xc.xn = NULL;
  xc.xw = NULL;
}

/*
 * Weight rows (source f32): row 1 all zero, row 2 constant -127.5·2^-10
 * (q8c/q8b: every q = -128, the largest int32 AQ sum), row 3 ties with
 * -amax at the start of every 32 (q = -128 in every symmetric block), the
 * rest 0.05·N(0,1) plus a per-row offset (asymmetric groups).
 */
static void make_w(uint64_t seed, int64_t n, int64_t k, float *w, float *b) {
  uint64_t rng = seed;
  for (int64_t r = 0; r < n; r++)
    for (int64_t i = 0; i < k; i++) {
      float *v = &w[r * k + i];
      if (n >= 3 && r == 1)
        *v = 0.0f;
      else if (n >= 3 && r == 2)
        *v = -127.5f / 1024.0f;
      else if (n >= 3 && r == 3)
        *v = i % 32 == 0 ? -127.5f / 1024.0f
                         : (float)((i * 37) % 255 - 127) / 1024.0f;
      else
        *v = (float)(0.05 * gauss4(&rng) + 0.01 * (double)(r % 3));
    }
  for (int64_t r = 0; r < n; r++)
    b[r] = (float)gauss4(&rng);
}

/* The float source of the weight being checked. Only the fakes of the
 * self-check read it (an implementation that "forgets" to quantize). */
static const float *g_src_w;

static ql_qweight *quantize(const fcfg *c, ql_dtype sdt, int64_t n,
                            int64_t k, const float *w, const float *b,
                            int *rc) {
  ql_quant_params p = {.format = c->f, .group_size = c->gs,
                       .asymmetric = c->asym, .scale_dtype = sdt};
  ql_qweight *q = NULL;
  *rc = ql_qweight_quantize(&p, n, k, QL_DTYPE_F32, w, b, &q);
  return q;
}

/* Integer q of a q4g/q8b/q8c weight, and the index of its scale/zero. */
static int wq_int(const ql_qweight *q, int64_t n, int64_t k) {
  if (q->format == QL_FORMAT_Q4G)
    return tu_s4_at(q->qdata + n * ((q->k + 1) / 2), k);
  return ((const int8_t *)q->qdata)[n * q->k + k];
}

static size_t sc_idx(const ql_qweight *q, int64_t n, int64_t k) {
  if (q->format == QL_FORMAT_Q4G || q->format == QL_FORMAT_Q8B)
    return (size_t)((k / q->group_size) * q->n + n);
  return (size_t)n;
}

/* ----------------------------------------------------------- bounds */

static const double U32 = 0x1p-24, ETA = 0x1p-149;

static double gamma_n(double n) { return n * U32 / (1.0 - n * U32); }

/* Half an ulp of dt at magnitude a (0 for f32: its rounding is inside
 * the γ terms already). */
static double half_ulp(ql_dtype dt, double a) {
  int e;
  if (dt == QL_DTYPE_F32 || a == 0.0)
    return 0.0;
  frexp(a, &e); /* a in [2^(e-1), 2^e) */
  if (dt == QL_DTYPE_F16)
    return ldexp(1.0, (e - 1 < -14 ? -14 : e - 1) - 11);
  return ldexp(1.0, (e - 1 < -126 ? -126 : e - 1) - 8);
}

/*
 * fp64 WO: y64 = Σk xw·ŵ + b and its bound (see the top of the file), for
 * rows [0, m). ŵ = ql_qweight_dequantize(), the canonical values.
 */
static int ref_wo(const ql_qweight *q, const float *xw, int64_t m,
                  double *y64, double *err) {
  enum { JB = 8 }; /* weight rows per block: JB·K doubles x2 stay in cache */
  int64_t n = q->n, k = q->k, r, j, j0, i;
  float *dq = xmalloc((size_t)(n * k) * sizeof(float));
  double *wd = xmalloc((size_t)(JB * k) * sizeof(double));
  double *mg = xmalloc((size_t)(JB * k) * sizeof(double));
  double *xd = xmalloc((size_t)k * sizeof(double));
  double *xa = xmalloc((size_t)k * sizeof(double));
  int zp = q->zero != NULL;
  /* q4g sums x·q and x per group, then the groups: G more roundings */
  double ng = q->format == QL_FORMAT_Q4G ? (double)q->groups : 0.0;
  int rc = ql_qweight_dequantize(q, dq);

  for (j0 = 0; rc == 0 && j0 < n; j0 += JB) {
    int64_t j1 = j0 + JB < n ? j0 + JB : n;
    for (j = j0; j < j1; j++)
      for (i = 0; i < k; i++) {
        size_t si = sc_idx(q, j, i);
        wd[(j - j0) * k + i] = dq[j * k + i];
        mg[(j - j0) * k + i] =
            zp ? fabs((double)wq_int(q, j, i) *
                      ql_load_f32(q->scale_dtype, q->scale, si)) +
                     fabs((double)ql_load_f32(q->scale_dtype, q->zero, si))
               : fabs((double)dq[j * k + i]);
      }
    for (r = 0; r < m; r++) {
      for (i = 0; i < k; i++) {
        xd[i] = xw[r * k + i];
        xa[i] = fabs(xd[i]);
      }
      for (j = j0; j < j1; j++) {
        const double *wr = wd + (j - j0) * k, *mr = mg + (j - j0) * k;
        double e[4] = {0, 0, 0, 0}, a[4] = {0, 0, 0, 0};
        double b = q->bias ? q->bias[j] : 0;
        /* fp64 sums of exact products, in four interleaved chains (for
         * speed): their own error (~K·2^-53) is far below the f32 bound,
         * whatever the order */
        for (i = 0; i + 3 < k; i += 4)
          for (int l = 0; l < 4; l++) {
            e[l] += xd[i + l] * wr[i + l];
            a[l] += xa[i + l] * mr[i + l];
          }
        for (; i < k; i++) {
          e[0] += xd[i] * wr[i];
          a[0] += xa[i] * mr[i];
        }
        y64[r * n + j] = ((e[0] + e[1]) + (e[2] + e[3])) + b;
        err[r * n + j] =
            gamma_n((double)k + 3 + ng) *
                (((a[0] + a[1]) + (a[2] + a[3])) + fabs(b)) +
            ((double)k + 3 + ng) * ETA;
      }
    }
  }
  free(dq);
  free(wd);
  free(mg);
  free(xd);
  free(xa);
  return rc;
}

/*
 * The bound an implementation's results are held to: err_tc (f8r AQ on an
 * FP8 tensor-core engine, see the top of the file) for an implementation
 * named as running on cuBLASLt, unless QL_CONFORMANCE_F8R_BOUND=f32; err
 * otherwise.
 */
static const double *bound_of(const ql_kernel_impl *im, const double *err,
                              const double *err_tc) {
  static int f32 = -1;
  if (f32 < 0) {
    const char *v = getenv("QL_CONFORMANCE_F8R_BOUND");
    f32 = v != NULL && strcmp(v, "f32") == 0;
  }
  if (err_tc != NULL && !f32 && strstr(im->name, "cublaslt") != NULL)
    return err_tc;
  return err;
}

/*
 * fp64 AQ: DESIGN §4's formula on the reference quantize_rows output of
 * the same (widened) rows, and its bound (top of the file), rows [0, m).
 */
static int ref_aq(const ql_qweight *q, ql_dtype adt, const float *xw,
                  int64_t m, double *y64, double *err, double *err_tc) {
  int64_t n = q->n, k = q->k, r, j, i, g;
  float *sx = xmalloc((size_t)m * sizeof(float));
  uint8_t *xq = xmalloc((size_t)(m * k));
  int rc;

  if (q->format == QL_FORMAT_F8R) {
    enum { JB = 8 };
    double *wd = xmalloc((size_t)(JB * k) * sizeof(double));
    double *xd = xmalloc((size_t)k * sizeof(double));
    double *pp = xmalloc((size_t)k * sizeof(double));
    rc = ql_quantize_rows_e4m3_src(adt, xw, m, k, xq, sx);
    for (int64_t j0 = 0; rc == 0 && j0 < n; j0 += JB) {
      int64_t j1 = j0 + JB < n ? j0 + JB : n;
      for (i = 0; i < (j1 - j0) * k; i++)
        wd[i] = e4m3_dec(q->qdata[j0 * k + i]);
      for (r = 0; r < m; r++) {
        for (i = 0; i < k; i++)
          xd[i] = e4m3_dec(xq[r * k + i]);
        for (j = j0; j < j1; j++) {
          const double *wr = wd + (j - j0) * k;
          double acc = 0, mag = 0, b = q->bias ? q->bias[j] : 0;
          double ss = (double)sx[r] * ql_load_f32(q->scale_dtype, q->scale,
                                                  (size_t)j);
          /* e4m3 products are exact, and so is their fp64 sum */
          for (i = 0; i < k; i++) {
            double p = xd[i] * wr[i];
            pp[i] = p;
            acc += p;
            mag += fabs(p);
          }
          y64[r * n + j] = acc * ss + b;
          err[r * n + j] =
              gamma_n((double)k + 3) * (fabs(ss) * mag + fabs(b)) +
              ((double)k + 3) * ETA;
          if (err_tc != NULL)
            err_tc[r * n + j] =
                fabs(ss) * ql_fp8_acc_bound(pp, k, FP8_ACC_BITS,
                                            FP8_ACC_BLOCK, FP8_ACC_PROMOTE) +
                gamma_n(3) * (fabs(ss) * mag + fabs(b)) +
                ((double)k + 3) * ETA;
        }
      }
    }
    free(wd);
    free(xd);
    free(pp);
  } else {
    int q4g = q->format == QL_FORMAT_Q4G;
    int8_t *wq = xmalloc((size_t)(n * k));
    const int8_t *x8 = (const int8_t *)xq;
    rc = ql_quantize_rows_i8_src(adt, xw, m, k,
                                 q4g ? q->group_size : (uint32_t)k,
                                 (int8_t *)xq, sx, NULL);
    for (j = 0; rc == 0 && j < n; j++)
      for (i = 0; i < k; i++)
        wq[j * k + i] = (int8_t)wq_int(q, j, i);
    for (r = 0; rc == 0 && r < m; r++)
      for (j = 0; j < n; j++) {
        const int8_t *xr = x8 + r * k, *wr = wq + j * k;
        double b = q->bias ? q->bias[j] : 0, e, bound;
        if (!q4g) {
          int64_t acc = 0;
          double p;
          for (i = 0; i < k; i++)
            acc += xr[i] * wr[i];
          p = (double)acc * sx[r] *
              ql_load_f32(q->scale_dtype, q->scale, (size_t)j);
          e = p + b;
          bound = gamma_n(4) * (fabs(p) + fabs(b)) + 4 * ETA;
        } else {
          double sum = 0, mag = 0;
          int64_t gs = q->group_size;
          for (g = 0; g < q->groups; g++) {
            double s = ql_load_f32(q->scale_dtype, q->scale,
                                   (size_t)(g * n + j));
            double z = ql_load_f32(q->scale_dtype, q->zero,
                                   (size_t)(g * n + j));
            int64_t a = 0, xs = 0, k1 = (g + 1) * gs < k ? (g + 1) * gs : k;
            for (i = g * gs; i < k1; i++) {
              a += xr[i] * wr[i];
              xs += xr[i];
            }
            sum += s * (double)a + z * (double)xs;
            mag += fabs(s) * (fabs((double)a) + 8.0 * fabs((double)xs)) +
                   (fabs(z) + 8.0 * fabs(s)) * fabs((double)xs);
          }
          e = (double)sx[r] * sum + b;
          bound = gamma_n(2.0 * (double)q->groups + 5) *
                      (fabs((double)sx[r]) * mag + fabs(b)) +
                  (2.0 * (double)q->groups + 5) * ETA;
        }
        y64[r * n + j] = e;
        err[r * n + j] = bound;
      }
    free(wq);
  }
  free(sx);
  free(xq);
  return rc;
}

/* Checks y [m,n] (dtype dt) against y64 ± err; returns R_BOUND or 0 and
 * reports the first offender. */
static unsigned check_bound(sink *s, const char *cs, const void *y,
                            ql_dtype dt, int64_t r0, int64_t m, int64_t n,
                            const double *y64, const double *err) {
  size_t esz = ql_dtype_size(dt);
  unsigned bad = 0;
  for (int64_t r = 0; r < m; r++)
    for (int64_t j = 0; j < n; j++) {
      size_t i = (size_t)((r0 + r) * n + j);
      float v;
      double e = y64[i], tol, d;
      ql_to_f32(dt, (const unsigned char *)y + (size_t)(r * n + j) * esz, &v,
                1);
      /* (1 + 2^-30): the fp64 evaluation of y64 and of this check, at
       * most ~K·2^-53 relative for K < 2^18 */
      tol = (err[i] + half_ulp(dt, fabs(e) + err[i])) * (1.0 + 0x1p-30);
      d = fabs((double)v - e);
      if (!(d <= tol)) {
        if (!bad)
          note(s, R_BOUND, "%s: y[%lld,%lld] = %.9g, fp64 %.17g, |diff| %.3g > bound %.3g",
               cs, (long long)(r0 + r), (long long)j, (double)v, e, d, tol);
        bad = R_BOUND;
      } else if (tol > 0 && d / tol > s->worst) {
        s->worst = d / tol;
      }
    }
  return bad;
}

/* ------------------------------------------------------- linear cases */

typedef struct shape {
  int64_t m, n, k;
  int bias;
} shape;

typedef struct lgroup {
  const fcfg *c;
  int ci;   /* index into fcfgs, for seeds */
  int aq;   /* 0 WO, 1 AQ */
  ql_dtype adt, sdt;
} lgroup;

/* A repacked layout per distinct repack implementation. */
typedef struct rpslot {
  const ql_kernel_impl *im;
  void *packed;
  int rc;
} rpslot;

/* Rows computed alone (M = 1) per distinct (implementation, layout). */
typedef struct alslot {
  const ql_kernel_impl *im;
  int rp;                /* rpslot index, -1 for the canonical layout */
  unsigned char *y;      /* [mneed, n] in adt */
  unsigned *bad;         /* [mneed]: R_* of each lone run */
} alslot;

/* Runs impl on x [m,k] into a fresh buffer (NaN-filled, canaried). */
static unsigned run_linear_impl(sink *s, const char *cs,
                                const ql_kernel_impl *im, const ql_qweight *q,
                                const void *packed, ql_dtype dt,
                                const void *x, int64_t m, unsigned char **yo) {
  size_t bytes = (size_t)(m * q->n) * ql_dtype_size(dt);
  unsigned char *y = out_alloc(bytes);
  ql_linear_args a = {.w = q, .packed = packed, .dt = dt, .x = x, .m = m,
                      .y = y};
  unsigned bad = 0;
  int rc;

  memset(y, 0xFF, bytes); /* NaN in f32, f16 and bf16: unwritten fails */
  rc = im->fn.linear(&a);
  if (rc != 0) {
    note(s, R_RC, "%s: %s returned %s", cs, im->name, errname(rc));
    bad |= R_RC;
  }
  if (!canary_ok(y, bytes)) {
    note(s, R_CANARY, "%s: %s wrote past y[%lld,%lld]", cs, im->name,
         (long long)m, (long long)q->n);
    bad |= R_CANARY;
  }
  *yo = y;
  return bad;
}

#ifdef QL_CONFORMANCE_MAPPED
/* The case again as a mapping client runs it (mapped_case.h), on b's
 * layout packed: its bytes must be y's, the backend's own launch. A
 * backend whose layouts were made without export (QL_ENOTSUP) is noted
 * once, not failed. */
static unsigned run_mapped(sink *s, const char *cs, const ql_backend *b,
                           const void *packed, const ql_qweight *q,
                           ql_dtype dt, const void *x, int64_t m,
                           const unsigned char *y) {
  size_t bytes = (size_t)(m * q->n) * ql_dtype_size(dt);
  unsigned char *ym = out_alloc(bytes);
  unsigned bad = 0;
  memset(ym, 0xFF, bytes);
  int rc = ql__conf_mapped_linear(b, packed, q, dt, x, m, ym);
  if (rc == QL_ENOTSUP) {
    snprintf(s->mapped_skip, sizeof s->mapped_skip,
             "%s exports no layout (QL_ENOTSUP): mapped mode not checked",
             b->name);
  } else if (rc != 0) {
    note(s, R_RC, "%s, mapped: %s", cs, errname(rc));
    bad |= R_RC;
  } else if (!canary_ok(ym, bytes)) {
    note(s, R_CANARY, "%s, mapped: wrote past y", cs);
    bad |= R_CANARY;
  } else if (memcmp(ym, y, bytes) != 0) {
    size_t i = 0;
    while (ym[i] == y[i])
      i++;
    note(s, R_MAPPED, "%s: the mapped launch differs from %s's at byte %zu",
         cs, b->name, i);
    bad |= R_MAPPED;
  } else {
    s->mapped++;
  }
  free(ym);
  return bad;
}
#endif

static void run_linear(const bk *bks, int nb, const lgroup *g,
                       const shape *sh, int nsh, sink *s) {
  ql_op op = g->aq ? QL_OP_LINEAR_AQ : QL_OP_LINEAR_WO;
  ql_format f = g->c->f;
  size_t esz = ql_dtype_size(g->adt);
  int i0, i1;

  for (i0 = 0; i0 < nsh; i0 = i1) {
    int64_t n = sh[i0].n, k = sh[i0].k, mneed = 0;
    int bias = sh[i0].bias, nrp = 0, nal = 0, rpi[MAX_BK], rc;
    rpslot rp[MAX_BK];
    alslot al[MAX_BK];
    float *w, *b, *xw;
    void *xn;
    double *y64, *err, *err_tc = NULL;
    ql_qweight *q;
    char cs[200];

    for (i1 = i0; i1 < nsh && sh[i1].n == n && sh[i1].k == k &&
                  sh[i1].bias == bias;
         i1++)
      mneed = sh[i1].m > mneed ? sh[i1].m : mneed;

    /* Cases that no backend runs are skipped here, before any work. */
    {
      int any = 0;
      for (int i = i0; i < i1 && !any; i++)
        for (int bi = 0; bi < nb && !any; bi++)
          any = dispatch(bks[bi].b, op, f, g->adt, sh[i].m, n, k) != NULL;
      if (!any) {
        for (int i = i0; i < i1; i++)
          skip_case(s, "e.g. M=%lld N=%lld K=%lld: %s", (long long)sh[i].m,
                    (long long)n, (long long)k, no_impl_reason(f, g->aq, k));
        continue;
      }
    }

    w = xmalloc((size_t)(n * k) * sizeof(float));
    b = xmalloc((size_t)n * sizeof(float));
    make_w(seed_of((uint64_t)g->ci, (uint64_t)n, (uint64_t)k,
                   (uint64_t)g->sdt),
           n, k, w, b);
    q = quantize(g->c, g->sdt, n, k, w, bias ? b : NULL, &rc);
    snprintf(cs, sizeof cs, "N=%lld K=%lld bias=%d", (long long)n,
             (long long)k, bias);
    if (rc != 0) {
      note(s, R_RC, "%s: ql_qweight_quantize: %s", cs, errname(rc));
      for (int i = i0; i < i1; i++)
        case_done(s, R_RC);
      free(w);
      free(b);
      continue;
    }
    g_src_w = w;
    make_x_cached(mneed, k, g->adt, &xn, &xw);
    y64 = xmalloc((size_t)(mneed * n) * sizeof(double));
    err = xmalloc((size_t)(mneed * n) * sizeof(double));
    if (g->aq && f == QL_FORMAT_F8R)
      err_tc = xmalloc((size_t)(mneed * n) * sizeof(double));
    rc = g->aq ? ref_aq(q, g->adt, xw, mneed, y64, err, err_tc)
               : ref_wo(q, xw, mneed, y64, err);
    if (rc != 0) {
      note(s, R_RC, "%s: reference: %s", cs, errname(rc));
      for (int i = i0; i < i1; i++)
        case_done(s, R_RC);
      goto next;
    }

    /* The layout each backend builds at load time (its repack, dispatched
     * for M = 1: a load knows no M). A generic implementation runs on the
     * canonical weight and gets no layout (packed = NULL), as when a
     * backend's own implementation declines a shape. */
    for (int bi = 0; bi < nb; bi++) {
      const ql_kernel_impl *r =
          ql_dispatch(bks[bi].b, QL_OP_REPACK, f, g->adt, 1, n, k);
      int j;
      for (j = 0; j < nrp && rp[j].im != r; j++)
        ;
      if (j == nrp) {
        ql_repack_args ra = {.w = q};
        rp[j].im = r;
        rp[j].rc = r->fn.repack(&ra);
        rp[j].packed = rp[j].rc == 0 ? ra.packed : NULL;
        nrp++;
      }
      rpi[bi] = j;
    }

    for (int i = i0; i < i1; i++) {
      int64_t m = sh[i].m;
      const ql_kernel_impl *seen_im[MAX_BK];
      int seen_al[MAX_BK], seen_lay[MAX_BK], nseen = 0, nullseen = 0;
      char csm[240], csi[300];

      snprintf(csm, sizeof csm, "M=%lld %s", (long long)m, cs);
      for (int bi = 0; bi < nb; bi++) {
        const ql_kernel_impl *im =
            dispatch(bks[bi].b, op, f, g->adt, m, n, k);
        const ql_kernel_impl *l1 =
            dispatch(bks[bi].b, op, f, g->adt, 1, n, k);
        int lay = im == ql_generic_impl(op) ? -1 : rpi[bi];
        int lay1 = l1 == ql_generic_impl(op) ? -1 : rpi[bi];
        alslot *a;
        unsigned char *y;
        unsigned bad = 0;
        int j;

        if (im == NULL) {
          if (!nullseen++)
            skip_case(s, "%s on %s: %s", csm, bks[bi].name,
                      no_impl_reason(f, g->aq, k));
          continue;
        }
        attr_add(&s->at, im, bi);
        if (l1 != NULL)
          attr_add(&s->at, l1, bi);
        for (j = 0; j < nal && !(al[j].im == l1 && al[j].rp == lay1); j++)
          ;
        if (j == nal) {
          al[j] = (alslot){l1, lay1, NULL, NULL};
          nal++;
        }
        a = &al[j];
        /* Backends that dispatch to the same (implementation, layout,
         * lone-row implementation) run the same code on the same input:
         * checked once, counted once. */
        for (j = 0; j < nseen; j++)
          if (seen_im[j] == im && seen_lay[j] == lay &&
              seen_al[j] == (int)(a - al))
            break;
        if (j < nseen)
          continue;
        seen_im[nseen] = im;
        seen_lay[nseen] = lay;
        seen_al[nseen++] = (int)(a - al);

        if ((lay >= 0 && rp[lay].rc != 0) || (lay1 >= 0 && rp[lay1].rc != 0)) {
          int rl = lay >= 0 && rp[lay].rc != 0 ? lay : lay1;
          note(s, R_RC, "%s: %s returned %s", csm, rp[rl].im->name,
               errname(rp[rl].rc));
          case_done(s, R_RC);
          continue;
        }
        snprintf(csi, sizeof csi, "%s %s", im->name, csm);
        bad |= run_linear_impl(s, csi, im, q, lay >= 0 ? rp[lay].packed : NULL,
                               g->adt, xn, m, &y);
        if (!(bad & R_RC))
          bad |= check_bound(s, csi, y, g->adt, 0, m, n, y64,
                             bound_of(im, err, err_tc));
#ifdef QL_CONFORMANCE_MAPPED
        if (!g->aq && lay >= 0 && !(bad & R_RC) &&
            bks[bi].b->export_layout != NULL && m <= QL_MAPPED_MAX_ROWS)
          bad |= run_mapped(s, csi, bks[bi].b, rp[lay].packed, q, g->adt, xn,
                            m, y);
#endif

        /* Each row alone, once per (implementation, layout) and weight. */
        if (a->im == NULL) {
          s->nobatch++;
          free(y);
          case_done(s, bad);
          continue;
        }
        if (a->y == NULL) {
          a->y = xmalloc((size_t)(mneed * n) * esz);
          a->bad = xmalloc((size_t)mneed * sizeof(unsigned));
          for (int64_t r = 0; r < mneed; r++) {
            unsigned char *y1;
            char csr[300];
            unsigned b1;
            snprintf(csr, sizeof csr, "%s row %lld alone, %s", a->im->name,
                     (long long)r, cs);
            b1 = run_linear_impl(s, csr, a->im, q,
                                 a->rp >= 0 ? rp[a->rp].packed : NULL, g->adt,
                                 (const char *)xn + (size_t)(r * k) * esz, 1,
                                 &y1);
            if (!b1)
              b1 |= check_bound(s, csr, y1, g->adt, r, 1, n, y64,
                                bound_of(a->im, err, err_tc));
            a->bad[r] = b1;
            memcpy(a->y + (size_t)(r * n) * esz, y1, (size_t)n * esz);
            free(y1);
          }
        }
        for (int64_t r = 0; r < m; r++)
          bad |= a->bad[r];
        if (!(bad & R_RC)) {
          for (int64_t r = 0; r < m; r++)
            if (memcmp(y + (size_t)(r * n) * esz, a->y + (size_t)(r * n) * esz,
                       (size_t)n * esz) != 0) {
              note(s, R_BATCH,
                   "%s: row %lld differs alone (%s) and in the batch (%s)",
                   csm, (long long)r, a->im->name, im->name);
              bad |= R_BATCH;
              break;
            }
        }
        free(y);
        case_done(s, bad);
      }
    }

  next:
    for (int j = 0; j < nrp; j++)
      if (rp[j].packed != NULL)
        rp[j].im->free_packed(rp[j].packed);
    for (int j = 0; j < nal; j++) {
      free(al[j].y);
      free(al[j].bad);
    }
    ql_qweight_free(q);
    g_src_w = NULL;
    free(w);
    free(b);
    free(y64);
    free(err);
    free(err_tc);
  }
}

/* ------------------------------------------------------------ NMSE */

/*
 * NMSE of an implementation against the unquantized fp64 product x·Wᵀ on
 * Gaussian data (x, W ~ N(0,1), no bias), M = 128, N = 64, K = 1024, f32
 * activations, bf16 scales. The prediction gives each quantized value an
 * error variance v from its format's rule, and adds them up as independent
 * errors:
 *   WO: E[(y - y0)²] = Σk x²·v(w)
 *   AQ: E[(y - y0)²] = Σk (x²·v(w) + w²·v(x) + v(x)·v(w))
 * where, with Δ the step of the value's bin:
 *   - a value inside its range: Δ²/12 (uniform in its bin); Δ = the scale
 *     (int4/int8), or scale · the e4m3 bin width at value/scale (float8);
 *   - a symmetric int8 row or block: its ±amax sits on the edge ±127.5 (it
 *     rounds to 127 or -128, or clamps), so its error is computed, not
 *     modelled; likewise the e4m3 amax, which lands on ±448;
 *   - asymmetric formats (q4g, q8b asym): min and max of a group are exact
 *     with the f32 scale and zero that choose q, and every value also
 *     carries d = q·(s' - s) + (z' - z), s', z' the stored (bf16) scale
 *     and zero: v = [not min/max]·s²/12 + d².
 * The band on measured/predicted is [NMSE_LO, NMSE_HI] = [0.9, 1.1]. By
 * experiment (20 seeds × every format and path, this size): mean ratio
 * 0.993..1.006 per format and path, σ 1.2..2 %, extremes 0.961 and 1.055,
 * so the band is at least 4.5σ wide on each side, while an implementation
 * that skips quantization gives ~0 and one that doubles the error ~4.
 */
#define NMSE_M 128
#define NMSE_N 64
#define NMSE_K 1024
#define NMSE_LO 0.90
#define NMSE_HI 1.10

/* Error variance of v in a symmetric int8 row/block of max |.| amax and
 * stored scale s (DESIGN §4: q = clamp(rne(v/s), -128, 127)). */
static double var_sym_i8(double v, double amax, double s) {
  if (fabs(v) == amax && amax > 0) {
    double t = v / s, r = tu_rne(t);
    r = r < -128 ? -128 : r > 127 ? 127 : r;
    return (t - r) * (t - r) * s * s;
  }
  return s * s / 12.0;
}

/* Error variance of v in an e4m3 row of max |.| amax and scale s. */
static double var_e4m3(double v, double amax, double s) {
  if (fabs(v) == amax && amax > 0) {
    double d = amax - 448.0 * s;
    return d * d;
  }
  v = s * e4m3_step(v / s);
  return v * v / 12.0;
}

/* Predicted error variance of each value of row j of weight q, whose f32
 * source is w (the model above). */
static void w_err_var(const ql_qweight *q, const float *w, int64_t j,
                      double *var) {
  int64_t k = q->k, gs = q->group_size;
  int asym = q->zero != NULL;
  for (int64_t k0 = 0; k0 < k; k0 += gs) {
    int64_t k1 = k0 + gs < k ? k0 + gs : k;
    float mn = w[k0], mx = w[k0], amax = 0;
    double s1 = ql_load_f32(q->scale_dtype, q->scale, sc_idx(q, j, k0));
    for (int64_t i = k0; i < k1; i++) {
      mn = w[i] < mn ? w[i] : mn;
      mx = w[i] > mx ? w[i] : mx;
      amax = fabsf(w[i]) > amax ? fabsf(w[i]) : amax;
    }
    if (asym) {
      float lv = q->format == QL_FORMAT_Q4G ? 15.0f : 255.0f;
      float mid = q->format == QL_FORMAT_Q4G ? 8.0f : 128.0f;
      float sf = fmaxf(mx - mn, 1e-6f) / lv, zf = mn + sf * mid;
      double z1 = ql_load_f32(q->scale_dtype, q->zero, sc_idx(q, j, k0));
      for (int64_t i = k0; i < k1; i++) {
        double d = wq_int(q, j, i) * (s1 - sf) + (z1 - zf);
        var[i] = (w[i] == mn || w[i] == mx ? 0.0 : (double)sf * sf / 12.0) +
                 d * d;
      }
    } else {
      for (int64_t i = k0; i < k1; i++)
        var[i] = q->format == QL_FORMAT_F8R ? var_e4m3(w[i], amax, s1)
                                            : var_sym_i8(w[i], amax, s1);
    }
  }
}

typedef struct nmse_row {
  char fmt[24];
  int aq;
  const char *impl;
  unsigned mask;
  double nmse, pred, ratio;
} nmse_row;

static void run_nmse(const bk *bks, int nb, const fcfg *c, int ci, int aq,
                     sink *s, nmse_row *rows, int *nrows) {
  const int64_t m = NMSE_M, n = NMSE_N, k = NMSE_K;
  ql_op op = aq ? QL_OP_LINEAR_AQ : QL_OP_LINEAR_WO;
  float *w = xmalloc((size_t)(n * k) * sizeof(float));
  float *x = xmalloc((size_t)(m * k) * sizeof(float));
  float *sx = xmalloc((size_t)m * sizeof(float));
  uint8_t *xq = xmalloc((size_t)(m * k));
  double *y0 = xmalloc((size_t)(m * n) * sizeof(double));
  double *vx = xmalloc((size_t)(m * k) * sizeof(double));
  double *vw = xmalloc((size_t)(n * k) * sizeof(double));
  double pw = 0, sy2 = 0;
  const ql_kernel_impl *done[MAX_BK];
  int ndone = 0, rc;
  uint64_t rng = seed_of(7, (uint64_t)ci, 0, 0);
  ql_qweight *q;
  char fmt[24];

  fcfg_name(c, fmt, sizeof fmt);
  for (int64_t i = 0; i < n * k; i++)
    w[i] = (float)tu_rng_gauss(&rng);
  for (int64_t i = 0; i < m * k; i++)
    x[i] = (float)tu_rng_gauss(&rng);
  q = quantize(c, QL_DTYPE_BF16, n, k, w, NULL, &rc);
  g_src_w = w;
  if (rc != 0) {
    note(s, R_RC, "NMSE: ql_qweight_quantize: %s", errname(rc));
    case_done(s, R_RC);
    goto out;
  }
  for (int64_t j = 0; j < n; j++)
    w_err_var(q, w + j * k, j, vw + j * k);
  if (aq) {
    if (c->f == QL_FORMAT_F8R)
      rc = ql_quantize_rows_e4m3(x, m, k, xq, sx);
    else
      rc = ql_quantize_rows_i8(x, m, k, (uint32_t)k, (int8_t *)xq, sx, NULL);
    if (rc != 0) {
      note(s, R_RC, "NMSE: reference quantize_rows: %s", errname(rc));
      case_done(s, R_RC);
      goto out;
    }
    for (int64_t r = 0; r < m; r++) {
      double amax = 0;
      for (int64_t i = 0; i < k; i++)
        amax = fabs(x[r * k + i]) > amax ? fabs(x[r * k + i]) : amax;
      for (int64_t i = 0; i < k; i++)
        vx[r * k + i] = c->f == QL_FORMAT_F8R
                            ? var_e4m3(x[r * k + i], amax, sx[r])
                            : var_sym_i8(x[r * k + i], amax, sx[r]);
    }
  }
  for (int64_t r = 0; r < m; r++)
    for (int64_t j = 0; j < n; j++) {
      double e = 0;
      for (int64_t i = 0; i < k; i++) {
        double xv = x[r * k + i], wv = w[j * k + i], v = vw[j * k + i];
        e += xv * wv;
        pw += xv * xv * v;
        if (aq)
          pw += wv * wv * vx[r * k + i] + vx[r * k + i] * v;
      }
      y0[r * n + j] = e;
      sy2 += e * e;
    }

  for (int bi = 0; bi < nb; bi++) {
    const ql_kernel_impl *im = dispatch(bks[bi].b, op, c->f,
                                           QL_DTYPE_F32, m, n, k);
    const ql_kernel_impl *rpi = ql_dispatch(bks[bi].b, QL_OP_REPACK, c->f,
                                            QL_DTYPE_F32, 1, n, k);
    ql_repack_args ra = {.w = q};
    int own = im != ql_generic_impl(op); /* generic: canonical layout */
    nmse_row *row = NULL;
    unsigned char *yb;
    const float *y;
    double se = 0, ratio;
    unsigned bad = 0;
    int j;

    if (im == NULL) {
      if (bi == 0)
        skip_case(s, "NMSE %s %s: %s", fmt, aq ? "AQ" : "WO",
                  no_impl_reason(c->f, aq, k));
      continue;
    }
    attr_add(&s->at, im, bi);
    for (j = 0; j < ndone && done[j] != im; j++)
      ;
    if (rows != NULL) {
      for (int t = 0; t < *nrows; t++)
        if (strcmp(rows[t].fmt, fmt) == 0 && rows[t].aq == aq &&
            rows[t].impl == im->name)
          row = &rows[t];
      if (row != NULL)
        row->mask |= 1u << bi;
    }
    if (j < ndone)
      continue;
    done[ndone++] = im;
    if (own && (rc = rpi->fn.repack(&ra)) != 0) {
      note(s, R_RC, "NMSE: %s returned %s", rpi->name, errname(rc));
      case_done(s, R_RC);
      continue;
    }
    bad = run_linear_impl(s, "NMSE", im, q, ra.packed, QL_DTYPE_F32, x, m,
                          &yb);
    if (ra.packed != NULL)
      rpi->free_packed(ra.packed);
    y = (const float *)yb;
    for (int64_t i = 0; i < m * n; i++) {
      double d = (double)y[i] - y0[i];
      se += d * d;
    }
    free(yb);
    ratio = se / pw;
    if (!(ratio >= NMSE_LO && ratio <= NMSE_HI)) {
      note(s, R_NMSE,
           "NMSE %s %s %s: %.4g, predicted %.4g, ratio %.3f outside [%.2f, %.2f]",
           fmt, aq ? "AQ" : "WO", im->name, se / sy2, pw / sy2, ratio,
           NMSE_LO, NMSE_HI);
      bad |= R_NMSE;
    }
    case_done(s, bad);
    if (rows != NULL) {
      row = &rows[(*nrows)++];
      snprintf(row->fmt, sizeof row->fmt, "%s", fmt);
      row->aq = aq;
      row->impl = im->name;
      row->mask = 1u << bi;
      row->nmse = se / sy2;
      row->pred = pw / sy2;
      row->ratio = ratio;
    }
  }
out:
  ql_qweight_free(q);
  g_src_w = NULL;
  free(w);
  free(x);
  free(sx);
  free(xq);
  free(y0);
  free(vx);
  free(vw);
}

/* ---------------------------------------------------- quantize_rows */

typedef struct qvar {
  int kind;     /* QL_QROWS_I8 / QL_QROWS_E4M3 */
  ql_format f;  /* format whose AQ path uses it (for dispatch) */
  uint32_t gs;  /* group of gsum; 0 = K */
  int gsum;
  const char *name;
} qvar;

static const qvar qvars[] = {
    {QL_QROWS_I8, QL_FORMAT_Q4G, 32, 1, "i8 gs=32 +gsum"},
    {QL_QROWS_I8, QL_FORMAT_Q4G, 64, 1, "i8 gs=64 +gsum"},
    {QL_QROWS_I8, QL_FORMAT_Q4G, 128, 1, "i8 gs=128 +gsum"},
    {QL_QROWS_I8, QL_FORMAT_Q4G, 256, 1, "i8 gs=256 +gsum"},
    {QL_QROWS_I8, QL_FORMAT_Q8C, 0, 1, "i8 gs=K +gsum"},
    {QL_QROWS_I8, QL_FORMAT_Q8C, 0, 0, "i8 no gsum"},
    {QL_QROWS_E4M3, QL_FORMAT_F8R, 0, 0, "e4m3"},
};
#define NQVAR ((int)(sizeof qvars / sizeof qvars[0]))

/* Output of one quantize_rows call, canaried, prefilled with the
 * complement of the reference so that an unwritten byte differs. */
typedef struct qout {
  uint8_t *xq;
  float *sx;
  int32_t *gsum;
} qout;

static int64_t qgroups(const qvar *v, int64_t k) {
  int64_t gs = v->gs ? v->gs : k;
  return (k + gs - 1) / gs;
}

static void qout_alloc(qout *o, const qout *ref, int64_t r0, int64_t m,
                       int64_t k, int64_t ng, int gsum) {
  size_t nx = (size_t)(m * k), ns = (size_t)m * sizeof(float),
         ngs = (size_t)(m * ng) * sizeof(int32_t);
  o->xq = out_alloc(nx);
  o->sx = (float *)out_alloc(ns);
  o->gsum = gsum ? (int32_t *)out_alloc(ngs) : NULL;
  memcpy(o->xq, ref->xq + r0 * k, nx);
  memcpy(o->sx, ref->sx + r0, ns);
  for (size_t i = 0; i < nx; i++)
    o->xq[i] = (uint8_t)~o->xq[i];
  for (size_t i = 0; i < ns; i++)
    ((uint8_t *)o->sx)[i] = (uint8_t)~((uint8_t *)o->sx)[i];
  if (gsum) {
    memcpy(o->gsum, ref->gsum + r0 * ng, ngs);
    for (size_t i = 0; i < ngs; i++)
      ((uint8_t *)o->gsum)[i] = (uint8_t)~((uint8_t *)o->gsum)[i];
  }
}

static void qout_free(qout *o) {
  free(o->xq);
  free(o->sx);
  free(o->gsum);
}

/* Runs im on rows [r0, r0+m) and compares with the reference rows. */
static unsigned run_qrows_impl(sink *s, const char *cs, const qvar *v,
                               ql_dtype adt, const ql_kernel_impl *im,
                               const float *xw,
                               const qout *ref, int64_t r0, int64_t m,
                               int64_t k) {
  int64_t ng = qgroups(v, k);
  size_t nx = (size_t)(m * k), ns = (size_t)m * sizeof(float),
         ngs = (size_t)(m * ng) * sizeof(int32_t);
  unsigned bad = 0;
  qout o;
  int rc;

  qout_alloc(&o, ref, r0, m, k, ng, v->gsum);
  ql_qrows_args a = {.kind = v->kind, .x = xw + r0 * k, .m = m, .k = k,
                     .gs = v->gs ? v->gs : (uint32_t)k, .xq = o.xq,
                     .sx = o.sx, .gsum = o.gsum, .src = adt};
  if ((rc = im->fn.quantize_rows(&a)) != 0) {
    note(s, R_RC, "%s: %s returned %s", cs, im->name, errname(rc));
    bad |= R_RC;
  }
  if (!canary_ok(o.xq, nx) || !canary_ok(o.sx, ns) ||
      (v->gsum && !canary_ok(o.gsum, ngs))) {
    note(s, R_CANARY, "%s: %s wrote past an output", cs, im->name);
    bad |= R_CANARY;
  }
  if (!bad) {
    for (int64_t r = 0; r < m; r++) {
      const uint8_t *gx = o.xq + r * k, *wx = ref->xq + (r0 + r) * k;
      int64_t i;
      if (memcmp(gx, wx, (size_t)k) != 0) {
        for (i = 0; gx[i] == wx[i]; i++)
          ;
        note(s, R_BYTES,
             "%s: row %lld (%s) xq[%lld] = 0x%02x, reference 0x%02x (x = %a)",
             cs, (long long)(r0 + r), row_kind_name[(r0 + r) % ROW_KINDS],
             (long long)i, gx[i], wx[i], (double)xw[(r0 + r) * k + i]);
        bad |= R_BYTES;
        break;
      }
      if (memcmp(&o.sx[r], &ref->sx[r0 + r], sizeof(float)) != 0) {
        note(s, R_BYTES, "%s: row %lld sx = %a, reference %a", cs,
             (long long)(r0 + r), (double)o.sx[r], (double)ref->sx[r0 + r]);
        bad |= R_BYTES;
        break;
      }
      if (v->gsum && memcmp(o.gsum + r * ng, ref->gsum + (r0 + r) * ng,
                            (size_t)ng * sizeof(int32_t)) != 0) {
        note(s, R_BYTES, "%s: row %lld gsum differs", cs, (long long)(r0 + r));
        bad |= R_BYTES;
        break;
      }
    }
  }
  qout_free(&o);
  return bad;
}

/* Shapes (m, k): groups of the same k share the rows and the reference. */
static void run_qrows(const bk *bks, int nb, const qvar *v, ql_dtype adt,
                      const shape *sh, int nsh, sink *s) {
  int i0, i1;
  for (i0 = 0; i0 < nsh; i0 = i1) {
    int64_t k = sh[i0].k, mneed = 0, ng;
    const ql_kernel_impl *a1[MAX_BK];
    unsigned *a1bad[MAX_BK];
    int na1 = 0, rc;
    void *xn;
    float *xw;
    qout ref;
    char cs[120];

    for (i1 = i0; i1 < nsh && sh[i1].k == k; i1++)
      mneed = sh[i1].m > mneed ? sh[i1].m : mneed;
    ng = qgroups(v, k);
    make_x_cached(mneed, k, adt, &xn, &xw);
    ref.xq = xmalloc((size_t)(mneed * k));
    ref.sx = xmalloc((size_t)mneed * sizeof(float));
    ref.gsum = xmalloc((size_t)(mneed * ng) * sizeof(int32_t));
    rc = v->kind == QL_QROWS_E4M3
             ? ql_quantize_rows_e4m3_src(adt, xw, mneed, k, ref.xq, ref.sx)
             : ql_quantize_rows_i8_src(adt, xw, mneed, k,
                                       v->gs ? v->gs : (uint32_t)k,
                                       (int8_t *)ref.xq, ref.sx, ref.gsum);
    snprintf(cs, sizeof cs, "K=%lld", (long long)k);
    if (rc != 0) {
      note(s, R_RC, "%s: reference returned %s", cs, errname(rc));
      for (int i = i0; i < i1; i++)
        case_done(s, R_RC);
      goto next;
    }
    for (int i = i0; i < i1; i++) {
      int64_t m = sh[i].m;
      const ql_kernel_impl *seen[MAX_BK][2];
      int nseen = 0;
      char csm[160], csi[240];
      snprintf(csm, sizeof csm, "M=%lld %s", (long long)m, cs);
      for (int bi = 0; bi < nb; bi++) {
        const ql_kernel_impl *im = dispatch(bks[bi].b, QL_OP_QUANTIZE_ROWS,
                                               v->f, adt, m, 1, k);
        const ql_kernel_impl *l1 = dispatch(bks[bi].b, QL_OP_QUANTIZE_ROWS,
                                               v->f, adt, 1, 1, k);
        unsigned bad;
        int j;
        if (g_only != NULL && (im == NULL || l1 == NULL)) {
          skip_case(s, "%s: %s", csm, no_impl_reason(v->f, 1, k));
          continue;
        }
        if (im == NULL || l1 == NULL) { /* the generic one handles all */
          note(s, R_RC, "%s: no quantize_rows implementation on %s", csm,
               bks[bi].name);
          case_done(s, R_RC);
          continue;
        }
        attr_add(&s->at, im, bi);
        attr_add(&s->at, l1, bi);
        for (j = 0; j < nseen && !(seen[j][0] == im && seen[j][1] == l1); j++)
          ;
        if (j < nseen)
          continue;
        seen[nseen][0] = im;
        seen[nseen++][1] = l1;
        snprintf(csi, sizeof csi, "%s %s", im->name, csm);
        bad = run_qrows_impl(s, csi, v, adt, im, xw, &ref, 0, m, k);
        /* every row alone, once per lone-row implementation */
        for (j = 0; j < na1 && a1[j] != l1; j++)
          ;
        if (j == na1) {
          a1[j] = l1;
          a1bad[j] = xmalloc((size_t)mneed * sizeof(unsigned));
          for (int64_t r = 0; r < mneed; r++) {
            char csr[240];
            snprintf(csr, sizeof csr, "%s row %lld alone, %s", l1->name,
                     (long long)r, cs);
            a1bad[j][r] =
                run_qrows_impl(s, csr, v, adt, l1, xw, &ref, r, 1, k);
          }
          na1++;
        }
        for (int64_t r = 0; r < m; r++)
          bad |= a1bad[j][r] ? (a1bad[j][r] | R_BATCH) : 0;
        case_done(s, bad);
      }
    }
  next:
    for (int j = 0; j < na1; j++)
      free(a1bad[j]);
    free(ref.xq);
    free(ref.sx);
    free(ref.gsum);
  }
}

/* --------------------------------------------- non-finite activations */

/*
 * DESIGN §4: NaN or Inf in an activation row makes the request fail with a
 * clear error, QL_ENONFINITE, on every backend. One bad value (NaN, +Inf,
 * -Inf) in the last row of M = 3, N = 8, K = 129.
 */
static const float nonfinite[3] = {NAN, INFINITY, -INFINITY};

static void run_nonfinite_linear(const bk *bks, int nb, const lgroup *g,
                                 sink *s) {
  const int64_t m = 3, n = 8, k = 129;
  ql_op op = g->aq ? QL_OP_LINEAR_AQ : QL_OP_LINEAR_WO;
  size_t esz = ql_dtype_size(g->adt), ybytes = (size_t)(m * n) * esz;
  float *w = xmalloc((size_t)(n * k) * sizeof(float));
  float *b = xmalloc((size_t)n * sizeof(float));
  float *xf = xmalloc((size_t)(m * k) * sizeof(float));
  void *xn = xmalloc((size_t)(m * k) * esz);
  ql_qweight *q;
  int rc;

  make_w(seed_of((uint64_t)g->ci, 99, 0, 0), n, k, w, b);
  q = quantize(g->c, g->sdt, n, k, w, b, &rc);
  g_src_w = w;
  for (int v = 0; v < 3 && rc == 0; v++) {
    const ql_kernel_impl *seen[MAX_BK];
    int nseen = 0;
    make_x(m, k, g->adt, xn, xf);
    xf[(m - 1) * k + 77] = nonfinite[v];
    ql_from_f32(g->adt, xf, xn, (size_t)(m * k));
    for (int bi = 0; bi < nb; bi++) {
      const ql_kernel_impl *im = dispatch(bks[bi].b, op, g->c->f, g->adt,
                                             m, n, k);
      const ql_kernel_impl *rpi = ql_dispatch(bks[bi].b, QL_OP_REPACK,
                                              g->c->f, g->adt, 1, n, k);
      ql_repack_args ra = {.w = q};
      int own = im != ql_generic_impl(op); /* generic: canonical layout */
      unsigned char *y;
      unsigned bad = 0;
      int j, r2 = 0;
      char fmtb[24];
      if (im == NULL) {
        if (bi == 0)
          skip_case(s, "%s %s: %s", g->aq ? "AQ" : "WO",
                    fcfg_name(g->c, fmtb, sizeof fmtb),
                    no_impl_reason(g->c->f, g->aq, k));
        continue;
      }
      attr_add(&s->at, im, bi);
      for (j = 0; j < nseen && seen[j] != im; j++)
        ;
      if (j < nseen)
        continue;
      seen[nseen++] = im;
      if (own && (r2 = rpi->fn.repack(&ra)) != 0) {
        note(s, R_RC, "%s returned %s", rpi->name, errname(r2));
        case_done(s, R_RC);
        continue;
      }
      y = out_alloc(ybytes);
      {
        ql_linear_args a = {.w = q, .packed = ra.packed, .dt = g->adt,
                            .x = xn, .m = m, .y = y};
        r2 = im->fn.linear(&a);
      }
      if (r2 != QL_ENONFINITE) {
        note(s, R_RC, "%s %s act=%s x[%lld,77] = %g: %s returned %s, want "
             "QL_ENONFINITE", g->aq ? "AQ" : "WO",
             fcfg_name(g->c, fmtb, sizeof fmtb), dtn(g->adt),
             (long long)(m - 1), (double)nonfinite[v], im->name, errname(r2));
        bad |= R_RC;
      }
      if (!canary_ok(y, ybytes)) {
        note(s, R_CANARY, "%s wrote past y", im->name);
        bad |= R_CANARY;
      }
      if (ra.packed != NULL)
        rpi->free_packed(ra.packed);
      free(y);
      case_done(s, bad);
    }
  }
  if (rc != 0) {
    note(s, R_RC, "ql_qweight_quantize: %s", errname(rc));
    case_done(s, R_RC);
  }
  g_src_w = NULL;
  ql_qweight_free(q);
  free(w);
  free(b);
  free(xf);
  free(xn);
}

static void run_nonfinite_qrows(const bk *bks, int nb, const qvar *v,
                                ql_dtype adt, sink *s) {
  const int64_t m = 3, k = 129, ng = qgroups(v, k);
  float *x = xmalloc((size_t)(m * k) * sizeof(float));
  float *xn = xmalloc((size_t)(m * k) * sizeof(float));
  uint8_t *xq = out_alloc((size_t)(m * k));
  float *sx = (float *)out_alloc((size_t)m * sizeof(float));
  int32_t *gsum = (int32_t *)out_alloc((size_t)(m * ng) * sizeof(int32_t));

  for (int b = 0; b < 3; b++) {
    const ql_kernel_impl *seen[MAX_BK];
    int nseen = 0;
    make_x(m, k, adt, xn, x);
    x[(m - 1) * k + 77] = nonfinite[b];
    for (int bi = 0; bi < nb; bi++) {
      const ql_kernel_impl *im = dispatch(bks[bi].b, QL_OP_QUANTIZE_ROWS,
                                             v->f, adt, m, 1, k);
      ql_qrows_args a = {.kind = v->kind, .x = x, .m = m, .k = k,
                         .gs = v->gs ? v->gs : (uint32_t)k, .xq = xq,
                         .sx = sx, .gsum = v->gsum ? gsum : NULL,
                         .src = adt};
      int j, rc;
      if (im == NULL && g_only != NULL) {
        skip_case(s, "quantize_rows: %s", no_impl_reason(v->f, 1, k));
        continue;
      }
      if (im == NULL) {
        note(s, R_RC, "no quantize_rows implementation on %s", bks[bi].name);
        case_done(s, R_RC);
        continue;
      }
      attr_add(&s->at, im, bi);
      for (j = 0; j < nseen && seen[j] != im; j++)
        ;
      if (j < nseen)
        continue;
      seen[nseen++] = im;
      rc = im->fn.quantize_rows(&a);
      if (rc != QL_ENONFINITE)
        note(s, R_RC, "%s %s x[%lld,77] = %g: %s returned %s, want QL_ENONFINITE",
             v->name, dtn(adt), (long long)(m - 1), (double)nonfinite[b],
             im->name, errname(rc));
      case_done(s, rc != QL_ENONFINITE ? R_RC : 0);
    }
  }
  free(x);
  free(xn);
  free(xq);
  free(sx);
  free(gsum);
}

/* --------------------------------------------- the adversarial rows */

/*
 * The rows claim to be adversarial; this checks that they are, with
 * expectations computed here rather than taken from the library: the
 * int8 tie row gives rne(j + 0.5) (half to even) and -128, the constant
 * -127.5/128 row gives -128 everywhere, the e4m3 tie row gives the even
 * code of each pair and -448. Counted as one case per activation dtype.
 */
static void check_rows_adversarial(void) {
  static const ql_dtype dts[3] = {QL_DTYPE_F32, QL_DTYPE_F16, QL_DTYPE_BF16};
  const int64_t k = 300;
  for (int d = 0; d < 3; d++) {
    float xw[ROW_KINDS * 300], xn[ROW_KINDS * 300], sx[ROW_KINDS];
    int8_t q8[ROW_KINDS * 300];
    uint8_t q8f[ROW_KINDS * 300];
    int bad = 0, n128 = 0, ties = 0;

    make_x(ROW_KINDS, k, dts[d], xn, xw);
    bad |= ql_quantize_rows_i8_src(dts[d], xw, ROW_KINDS, k, (uint32_t)k, q8,
                                   sx, NULL) != 0;
    bad |= sx[ROW_I8_TIES] != 0.0625f || sx[ROW_NEG_CONST] != 0x1p-7f;
    for (int64_t i = 0; i < k && !bad; i++) {
      double t = (double)xw[ROW_I8_TIES * k + i] * 16.0, want = tu_rne(t);
      want = want < -128 ? -128 : want > 127 ? 127 : want;
      bad |= t != floor(t) + 0.5 || q8[ROW_I8_TIES * k + i] != (int)want;
      bad |= q8[ROW_NEG_CONST * k + i] != -128;
      n128 += q8[ROW_I8_TIES * k + i] == -128;
    }
    bad |= n128 == 0;
    bad |= ql_quantize_rows_e4m3_src(dts[d], xw, ROW_KINDS, k, q8f, sx) != 0;
    bad |= sx[ROW_E4M3_TIES] != 0x1p-5f;
    for (int64_t i = 1; i < k && !bad; i++) {
      int c = (int)((i * 29) % 126), even = (c & 1) ? c + 1 : c;
      int neg = xw[ROW_E4M3_TIES * k + i] < 0;
      uint8_t want = (uint8_t)(even | (neg ? 0x80 : 0));
      bad |= q8f[ROW_E4M3_TIES * k + i] != want;
      ties++;
    }
    bad |= q8f[ROW_E4M3_TIES * k] != 0xFE; /* -448 */
    if (bad) {
      g_failed++;
      printf("FAIL adversarial rows (%s): the tie / -128 / ±448 rows do not "
             "quantize as computed independently here\n", dtn(dts[d]));
    } else {
      g_passed++;
      printf("ok   adversarial rows (%s): %d int8 ties half-to-even incl. %d x -128, "
             "%lld x -128 constant, %d e4m3 ties to even, -448\n",
             dtn(dts[d]), (int)k, n128, (long long)k, ties);
    }
  }
}

/* ------------------------------------------------------ the matrix */

static const int64_t FULL_Ms[] = {1, 2, 3, 7, 16, 33, 128};
static const int64_t FULL_Ns[] = {1, 8, 65, 512};
static const int64_t FULL_Ks[] = {16, 100, 128, 129, 1000, 4096};
/* --small */
static const int64_t SMALL_Ms[] = {1, 2, 3, 7};
static const int64_t SMALL_Ns[] = {1, 8, 65};
static const int64_t SMALL_Ks[] = {16, 100, 128, 129, 1000, 4096};
#define COUNT(a) ((int)(sizeof a / sizeof a[0]))
#define NSHAPE (COUNT(FULL_Ms) * COUNT(FULL_Ns) * COUNT(FULL_Ks))
/* The shape matrix of this run: FULL_ or, with --small, SMALL_. */
static const int64_t *Ms = FULL_Ms, *Ns = FULL_Ns, *Ks = FULL_Ks;
static int NM = COUNT(FULL_Ms), NN = COUNT(FULL_Ns), NK = COUNT(FULL_Ks);
/* Huge K: the largest q8c AQ K (every product (-128)·(-128) in the
 * constant rows: acc = 2^31 - 2^14) and one past it; all formats. */
static const int64_t HUGE_K[] = {QL_AQ_Q8C_MAX_K, QL_AQ_Q8C_MAX_K + 2};
#define HUGE_M 8
#define HUGE_N 3

/* (activation dtype, scale dtype); combo 0 gets the full shape matrix. */
static const struct {
  ql_dtype act, scale;
} combos[] = {
    {QL_DTYPE_F32, QL_DTYPE_BF16},  {QL_DTYPE_F32, QL_DTYPE_F32},
    {QL_DTYPE_F32, QL_DTYPE_F16},   {QL_DTYPE_F16, QL_DTYPE_BF16},
    {QL_DTYPE_F16, QL_DTYPE_F16},   {QL_DTYPE_F16, QL_DTYPE_F32},
    {QL_DTYPE_BF16, QL_DTYPE_BF16}, {QL_DTYPE_BF16, QL_DTYPE_F16},
    {QL_DTYPE_BF16, QL_DTYPE_F32},
};
#define NCOMBO ((int)(sizeof combos / sizeof combos[0]))

/*
 * The covering subset, deterministic: combo 0 (f32 activations, bf16
 * scales) runs all NSHAPE shapes; each of the other 8 combos runs the
 * shapes s with (s + ci + 3·aq + combo) % 8 == 0, so every shape runs in
 * exactly one of them, a different one per format and path. Bias is on
 * for half of the (N, K) pairs, alternating with format and combo. The
 * huge-K shapes run in every combo.
 */
static int build_shapes(int ci, int aq, int combo, shape *out) {
  int n = 0;
  for (int ki = 0; ki < NK; ki++) /* K outermost: the x rows are shared */
    for (int ni = 0; ni < NN; ni++)
      for (int mi = 0; mi < NM; mi++) {
        int sidx = (mi * NN + ni) * NK + ki;
        if (combo != 0 && (sidx + ci + 3 * aq + combo) % 8 != 0)
          continue;
        out[n++] = (shape){Ms[mi], Ns[ni], Ks[ki], (ni + ki + ci + combo) & 1};
      }
  for (int h = 0; h < 2; h++)
    out[n++] = (shape){HUGE_M, HUGE_N, HUGE_K[h], (h + ci + combo) & 1};
  return n;
}

/* -------------------------------------------- the harness checks itself */

/* Fakes: each a wrong implementation that a conformance harness must
 * reject, registered as a local backend and run through the same code. */

static void widen(ql_dtype dt, const void *x, size_t n, float *out) {
  ql_to_f32(dt, x, out, n);
}

/* y = x·Wᵀ (+b) with the unquantized source weight, f32 accumulation;
 * scale2 != 0: y = 2·(x·dequant(W)ᵀ) - x·Wᵀ (twice the quantization
 * error). */
static int fake_float_product(const ql_linear_args *a, int twice) {
  int64_t n = a->w->n, k = a->w->k;
  float *x = xmalloc((size_t)(a->m * k) * sizeof(float));
  float *dq = xmalloc((size_t)(n * k) * sizeof(float));
  size_t esz = ql_dtype_size(a->dt);
  widen(a->dt, a->x, (size_t)(a->m * k), x);
  ql_qweight_dequantize(a->w, dq);
  for (int64_t r = 0; r < a->m; r++)
    for (int64_t j = 0; j < n; j++) {
      float acc = 0.0f, accq = 0.0f, v;
      for (int64_t i = 0; i < k; i++) {
        acc += x[r * k + i] * g_src_w[j * k + i];
        accq += x[r * k + i] * dq[j * k + i];
      }
      v = twice ? 2.0f * accq - acc : acc;
      if (a->w->bias)
        v += a->w->bias[j];
      ql_from_f32(a->dt, &v, (unsigned char *)a->y + (size_t)(r * n + j) * esz,
                  1);
    }
  free(x);
  free(dq);
  return 0;
}

static int fake_wo_noquant(const ql_linear_args *a) {
  return fake_float_product(a, 0);
}

static int fake_wo_double_noise(const ql_linear_args *a) {
  return fake_float_product(a, 1);
}

/* Batch rows accumulate in decreasing k, lone rows in increasing k: each
 * result is within the bound, but a row's bytes depend on its batch. */
static int fake_wo_batch_order(const ql_linear_args *a) {
  int64_t n = a->w->n, k = a->w->k;
  float *x, *dq;
  size_t esz = ql_dtype_size(a->dt);
  if (a->m == 1)
    return ql_linear_wo_ref(a->w, a->dt, a->x, a->m, a->y);
  x = xmalloc((size_t)(a->m * k) * sizeof(float));
  dq = xmalloc((size_t)(n * k) * sizeof(float));
  widen(a->dt, a->x, (size_t)(a->m * k), x);
  ql_qweight_dequantize(a->w, dq);
  for (int64_t r = 0; r < a->m; r++)
    for (int64_t j = 0; j < n; j++) {
      float acc = 0.0f;
      for (int64_t i = k - 1; i >= 0; i--)
        acc += x[r * k + i] * dq[j * k + i];
      if (a->w->bias)
        acc += a->w->bias[j];
      ql_from_f32(a->dt, &acc,
                  (unsigned char *)a->y + (size_t)(r * n + j) * esz, 1);
    }
  free(x);
  free(dq);
  return 0;
}

/* Swaps the first and last rows of the batch. */
static int fake_wo_swap_rows(const ql_linear_args *a) {
  size_t row = (size_t)a->w->n * ql_dtype_size(a->dt);
  unsigned char *t, *y = a->y;
  int rc = ql_linear_wo_ref(a->w, a->dt, a->x, a->m, a->y);
  if (rc != 0 || a->m < 2)
    return rc;
  t = xmalloc(row);
  memcpy(t, y, row);
  memcpy(y, y + (size_t)(a->m - 1) * row, row);
  memcpy(y + (size_t)(a->m - 1) * row, t, row);
  free(t);
  return 0;
}

/* The last output of the batch off by 2^-12 relative (f32 only). */
static int fake_wo_perturb(const ql_linear_args *a) {
  float *y = a->y;
  int rc = ql_linear_wo_ref(a->w, a->dt, a->x, a->m, a->y);
  size_t i = (size_t)(a->m * a->w->n) - 1;
  if (rc == 0)
    y[i] += ldexpf(fabsf(y[i]) + 1.0f, -12);
  return rc;
}

/* Writes one element past y. */
static int fake_wo_overrun(const ql_linear_args *a) {
  size_t esz = ql_dtype_size(a->dt);
  int rc = ql_linear_wo_ref(a->w, a->dt, a->x, a->m, a->y);
  memset((unsigned char *)a->y + (size_t)(a->m * a->w->n) * esz, 0, esz);
  return rc;
}

/* Reports success on NaN/Inf activations (whatever it wrote). */
static int fake_wo_nan_blind(const ql_linear_args *a) {
  int rc = ql_linear_wo_ref(a->w, a->dt, a->x, a->m, a->y);
  return rc == QL_ENONFINITE ? 0 : rc;
}

/* "AQ" that never quantizes the activations. */
static int fake_aq_as_wo(const ql_linear_args *a) {
  return ql_linear_wo_ref(a->w, a->dt, a->x, a->m, a->y);
}

/* int8 rows with round half away from zero (roundf) instead of rne. */
static int fake_qrows_round_away(const ql_qrows_args *a) {
  int8_t *xq = a->xq;
  if (a->kind != QL_QROWS_I8)
    return QL_EINVAL;
  for (int64_t r = 0; r < a->m; r++) {
    const float *x = a->x + r * a->k;
    float amax = 0.0f, s, inv;
    for (int64_t i = 0; i < a->k; i++)
      amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    s = amax / 127.5f;
    s = s < QL_I8_SCALE_EPS ? QL_I8_SCALE_EPS : s;
    inv = 1.0f / s;
    for (int64_t i = 0; i < a->k; i++) {
      float t = roundf(x[i] * inv);
      xq[r * a->k + i] = (int8_t)(t < -128 ? -128 : t > 127 ? 127 : t);
    }
    a->sx[r] = s;
    if (a->gsum != NULL) {
      int64_t ng = (a->k + a->gs - 1) / a->gs;
      for (int64_t g = 0; g < ng; g++) {
        int32_t sum = 0;
        for (int64_t i = g * a->gs; i < a->k && i < (g + 1) * (int64_t)a->gs;
             i++)
          sum += xq[r * a->k + i];
        a->gsum[r * ng + g] = sum;
      }
    }
  }
  return 0;
}

/* e4m3 rows with ties rounded away from zero (nearest code by search). */
static int fake_qrows_e4m3_away(const ql_qrows_args *a) {
  uint8_t *xq = a->xq;
  if (a->kind != QL_QROWS_E4M3 || a->gsum != NULL)
    return QL_EINVAL;
  for (int64_t r = 0; r < a->m; r++) {
    const float *x = a->x + r * a->k;
    float amax = 0.0f, s;
    for (int64_t i = 0; i < a->k; i++)
      amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    s = fmaxf(amax, QL_F8_AMAX_LB) / QL_E4M3_MAX;
    for (int64_t i = 0; i < a->k; i++) {
      double t = fabs((double)(x[i] / s)), bd = INFINITY;
      int best = 0;
      for (int c = 0; c <= 0x7E; c++) {
        double d = fabs(e4m3_dec((uint8_t)c) - t);
        if (d <= bd) { /* ties: the later, larger code */
          bd = d;
          best = c;
        }
      }
      xq[r * a->k + i] = (uint8_t)(best | (x[i] < 0 ? 0x80 : 0));
    }
    a->sx[r] = s;
  }
  return 0;
}

/*
 * Controls: correct implementations written differently from the
 * reference, as a backend would write them; the harness must pass them,
 * or its bounds would reject legitimate kernels.
 *  - ctrl.wo_4acc: WO on its own layout (a repack to dequantized f32 rows)
 *    with four interleaved partial sums, declining K < 64 (then generic
 *    runs, for every M alike);
 *  - ctrl.aq_q4g_vnni: W4A8 in the VNNI form of DESIGN §4,
 *    u = q + 8 against min = zero - 8·scale.
 */
static int ctrl_repack(ql_repack_args *a) {
  size_t n = (size_t)(a->w->n * a->w->k);
  float *p = malloc(n * sizeof(float));
  int rc;
  if (p == NULL)
    return QL_ENOMEM;
  if ((rc = ql_qweight_dequantize(a->w, p)) != 0) {
    free(p);
    return rc;
  }
  a->packed = p;
  a->packed_bytes = n * sizeof(float);
  return 0;
}

static void ctrl_free_packed(void *p) { free(p); }

static int ctrl_supports_k64(const ql_kernel_impl *im, ql_format f,
                             int64_t m, int64_t n, int64_t k) {
  (void)im, (void)f, (void)m, (void)n;
  return k >= 64;
}

static int ctrl_wo_4acc(const ql_linear_args *a) {
  int64_t n = a->w->n, k = a->w->k;
  const float *wf = a->packed;
  size_t esz = ql_dtype_size(a->dt);
  float *x;
  if (wf == NULL)
    return QL_EINVAL;
  x = xmalloc((size_t)(a->m * k) * sizeof(float));
  widen(a->dt, a->x, (size_t)(a->m * k), x);
  for (int64_t i = 0; i < a->m * k; i++)
    if (!isfinite(x[i])) {
      free(x);
      return QL_ENONFINITE;
    }
  for (int64_t r = 0; r < a->m; r++)
    for (int64_t j = 0; j < n; j++) {
      float p[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc;
      for (int64_t i = 0; i < k; i++)
        p[i & 3] += x[r * k + i] * wf[j * k + i];
      acc = (p[0] + p[1]) + (p[2] + p[3]);
      if (a->w->bias)
        acc += a->w->bias[j];
      ql_from_f32(a->dt, &acc,
                  (unsigned char *)a->y + (size_t)(r * n + j) * esz, 1);
    }
  free(x);
  return 0;
}

static int ctrl_aq_q4g_vnni(const ql_linear_args *a) {
  const ql_qweight *w = a->w;
  int64_t n = w->n, k = w->k, gs = w->group_size, ng = w->groups;
  size_t esz = ql_dtype_size(a->dt);
  float *x = xmalloc((size_t)(a->m * k) * sizeof(float));
  float *sx = xmalloc((size_t)a->m * sizeof(float));
  int8_t *xq = xmalloc((size_t)(a->m * k));
  int32_t *gsum = xmalloc((size_t)(a->m * ng) * sizeof(int32_t));
  int rc;

  widen(a->dt, a->x, (size_t)(a->m * k), x);
  rc = ql_quantize_rows_i8_src(a->dt, x, a->m, k, (uint32_t)gs, xq, sx, gsum);
  for (int64_t r = 0; rc == 0 && r < a->m; r++)
    for (int64_t j = 0; j < n; j++) {
      float acc = 0.0f, v;
      for (int64_t g = 0; g < ng; g++) {
        float sc = ql_load_f32(w->scale_dtype, w->scale, (size_t)(g * n + j));
        float mn = ql_load_f32(w->scale_dtype, w->zero, (size_t)(g * n + j)) -
                   8.0f * sc;
        int32_t d = 0;
        for (int64_t i = g * gs; i < k && i < (g + 1) * gs; i++)
          d += xq[r * k + i] * (wq_int(w, j, i) + 8); /* u8 x s8 */
        acc += sc * (float)d;
        acc += mn * (float)gsum[r * ng + g];
      }
      v = sx[r] * acc;
      if (w->bias)
        v += w->bias[j];
      ql_from_f32(a->dt, &v, (unsigned char *)a->y + (size_t)(r * n + j) * esz,
                  1);
    }
  free(x);
  free(sx);
  free(xq);
  free(gsum);
  return rc;
}

/* A fake (or control) backend: up to two implementations. */
typedef struct fake {
  const char *what;
  ql_kernel_impl im[2];
  unsigned expect; /* R_* bits that must all be reported (0: a control,
                      which must pass every case) */
  unsigned forbid; /* R_* bits that must not be (proves which check bit) */
} fake;

#define FMT_ALL QL_ALL_FORMATS
#define FMT_I8 (QL_FMT_BIT(QL_FORMAT_Q4G) | QL_FMT_BIT(QL_FORMAT_Q8C))
#define FMT_AQ (FMT_I8 | QL_FMT_BIT(QL_FORMAT_F8R))
#define WO_IMPL(nm, fn_, dts)                                                  \
  {nm, QL_OP_LINEAR_WO, FMT_ALL, dts, NULL, {.linear = fn_}, NULL, NULL, NULL, NULL, 0}

static const fake fakes[] = {
    {"skips quantization (unquantized W)",
     {WO_IMPL("fake.wo_noquant", fake_wo_noquant, QL_ALL_DTYPES)},
     R_BOUND | R_NMSE, 0},
    {"twice the quantization error",
     {WO_IMPL("fake.wo_double_noise", fake_wo_double_noise, QL_ALL_DTYPES)},
     R_BOUND | R_NMSE, 0},
    {"reduction order depends on M (within the bound)",
     {WO_IMPL("fake.wo_batch_order", fake_wo_batch_order, QL_ALL_DTYPES)},
     R_BATCH, R_BOUND},
    {"swaps the first and last rows",
     {WO_IMPL("fake.wo_swap_rows", fake_wo_swap_rows, QL_ALL_DTYPES)},
     R_BOUND | R_BATCH, 0},
    {"last output off by 2^-12 relative",
     {WO_IMPL("fake.wo_perturb", fake_wo_perturb, QL_DT_BIT(QL_DTYPE_F32))},
     R_BOUND, 0},
    {"writes one element past y",
     {WO_IMPL("fake.wo_overrun", fake_wo_overrun, QL_ALL_DTYPES)}, R_CANARY,
     0},
    {"accepts NaN/Inf activations",
     {WO_IMPL("fake.wo_nan_blind", fake_wo_nan_blind, QL_ALL_DTYPES)}, R_RC,
     R_BOUND | R_BATCH},
    {"AQ without activation quantization",
     {{"fake.aq_as_wo", QL_OP_LINEAR_AQ, FMT_AQ, QL_ALL_DTYPES, NULL,
       {.linear = fake_aq_as_wo}, NULL, NULL, NULL, NULL, 0}},
     R_BOUND, 0},
    {"int8 rows rounded half away from zero",
     {{"fake.qrows_round_away", QL_OP_QUANTIZE_ROWS, FMT_I8, QL_ALL_DTYPES,
       NULL, {.quantize_rows = fake_qrows_round_away}, NULL, NULL, NULL, NULL, 0}},
     R_BYTES, 0},
    {"e4m3 ties rounded away from zero",
     {{"fake.qrows_e4m3_away", QL_OP_QUANTIZE_ROWS,
       QL_FMT_BIT(QL_FORMAT_F8R), QL_ALL_DTYPES, NULL,
       {.quantize_rows = fake_qrows_e4m3_away}, NULL, NULL, NULL, NULL, 0}},
     R_BYTES, 0},
    {"control: 4 partial sums on its own layout, declines K < 64",
     {{"ctrl.wo_4acc", QL_OP_LINEAR_WO, FMT_ALL, QL_ALL_DTYPES,
       ctrl_supports_k64, {.linear = ctrl_wo_4acc}, NULL, NULL, NULL, NULL, 0},
      {"ctrl.repack", QL_OP_REPACK, FMT_ALL, QL_ALL_DTYPES, NULL,
       {.repack = ctrl_repack}, ctrl_free_packed, NULL, NULL, NULL, 0}},
     0, 0},
    {"control: W4A8 in the VNNI form (u = q+8, min = zero-8*scale)",
     {{"ctrl.aq_q4g_vnni", QL_OP_LINEAR_AQ, QL_FMT_BIT(QL_FORMAT_Q4G),
       QL_ALL_DTYPES, NULL, {.linear = ctrl_aq_q4g_vnni}, NULL, NULL, NULL, NULL, 0}},
     0, 0},
};
#define NFAKE ((int)(sizeof fakes / sizeof fakes[0]))

/*
 * Runs each fake through the same checks as the real backends (on a few
 * formats and small shapes, f32 activations and bf16 scales) and requires
 * it to be reported failing for the reason it was built to trip, and each
 * control to pass.
 */
static void self_check(void) {
  static const int64_t fm[] = {1, 3, 16}, fn[] = {8, 65}, fk[] = {16, 129};
  static const int fcis[] = {0, 8, 12, 13}; /* q4g/g32, q8b/b32a, q8c, f8r */
  shape sh[32];
  int nsh = 0;

  for (int ki = 0; ki < 2; ki++)
    for (int ni = 0; ni < 2; ni++)
      for (int mi = 0; mi < 3; mi++)
        sh[nsh++] = (shape){fm[mi], fn[ni], fk[ki], (ni + ki) & 1};

  for (int fi = 0; fi < NFAKE; fi++) {
    const fake *fk_ = &fakes[fi];
    const ql_kernel_impl *im = &fk_->im[0];
    ql_backend fb = {.name = "fake",
                     .impls = fk_->im,
                     .n_impls = fk_->im[1].name != NULL ? 2 : 1};
    bk list[1] = {{"fake", &fb}};
    sink s = {.quiet = 1, .ctx = ""};
    char wb[64], eb[64], fb2[64];
    int ok;

    if (ql_backend_check(&fb) != 0) {
      g_failed++;
      printf("FAIL self-check %s: ql_backend_check refuses it\n", im->name);
      continue;
    }
    if (im->op == QL_OP_QUANTIZE_ROWS) {
      const qvar *v =
          &qvars[im->formats & QL_FMT_BIT(QL_FORMAT_F8R) ? NQVAR - 1 : 0];
      shape qs[4] = {{3, 1, 16, 0}, {8, 1, 16, 0}, {3, 1, 129, 0},
                     {8, 1, 129, 0}};
      run_qrows(list, 1, v, QL_DTYPE_F32, qs, 4, &s);
      run_nonfinite_qrows(list, 1, v, QL_DTYPE_F32, &s);
    } else {
      int aq = im->op == QL_OP_LINEAR_AQ;
      for (int c = 0; c < 4; c++) {
        const fcfg *cf = &fcfgs[fcis[c]];
        lgroup g = {cf, fcis[c], aq, QL_DTYPE_F32, QL_DTYPE_BF16};
        if (!(im->formats & QL_FMT_BIT(cf->f)))
          continue;
        run_linear(list, 1, &g, sh, nsh, &s);
        run_nmse(list, 1, cf, fcis[c], aq, &s, NULL, NULL);
        run_nonfinite_linear(list, 1, &g, &s);
      }
    }
    if (fk_->expect == 0)
      ok = s.failed == 0 && s.passed > 0;
    else
      ok = s.failed > 0 && (s.why & fk_->expect) == fk_->expect &&
           !(s.why & fk_->forbid);
    if (ok)
      g_passed++;
    else
      g_failed++;
    if (fk_->expect == 0) {
      printf("%s self-check %-22s (%s): %ld of %ld cases passed, worst "
             "err/bound %.3g%s%s\n",
             ok ? "ok  " : "FAIL", im->name, fk_->what, s.passed,
             s.passed + s.failed, s.worst, s.failed ? "; first report: " : "",
             s.failed ? s.first : "");
      continue;
    }
    printf("%s self-check %-22s (%s): %ld of %ld cases failed; reported: %s; "
           "required: %s%s%s\n",
           ok ? "ok  " : "FAIL", im->name, fk_->what, s.failed,
           s.passed + s.failed, why_names(s.why, wb, sizeof wb),
           why_names(fk_->expect, eb, sizeof eb),
           fk_->forbid ? ", and not " : "",
           fk_->forbid ? why_names(fk_->forbid, fb2, sizeof fb2) : "");
    printf("       first report: %s\n", s.first);
  }
}

/* --filter: keeps the shapes of group ctx whose case name contains
 * g_filter (the name: ctx with its runs of spaces made single, then
 * "M=.. N=.. K=.. bias=.."); returns how many. */
static int filter_shapes(const char *ctx, shape *sh, int nsh) {
  char name[256];
  size_t j = 0;
  int kept = 0;
  for (const char *p = ctx; *p != '\0' && j + 1 < sizeof name; p++)
    if (*p != ' ' || (j > 0 && name[j - 1] != ' '))
      name[j++] = *p;
  if (j > 0 && name[j - 1] == ' ')
    j--;
  for (int i = 0; i < nsh; i++) {
    snprintf(name + j, sizeof name - j, " M=%lld N=%lld K=%lld bias=%d",
             (long long)sh[i].m, (long long)sh[i].n, (long long)sh[i].k,
             sh[i].bias);
    if (strstr(name, g_filter) != NULL)
      sh[kept++] = sh[i];
  }
  return kept;
}

/* The linear groups (every path and dtype combo) of fcfgs[c0, c1). */
static void run_linear_range(const bk *bks, int nb, int c0, int c1) {
  static shape sh[NSHAPE + 2];

  for (int ci = c0; ci < c1; ci++)
    for (int aq = 0; aq < 2; aq++) {
      const fcfg *c = &fcfgs[ci];
      long nskip = 0;
      char fmt[24], why[200] = "";
      fcfg_name(c, fmt, sizeof fmt);
      for (int combo = 0; combo < NCOMBO; combo++) {
        lgroup g = {c, ci, aq, combos[combo].act, combos[combo].scale};
        char ctx[96];
        sink s = {.ctx = ctx};
        int nsh = build_shapes(ci, aq, combo, sh);
        snprintf(ctx, sizeof ctx, "%s %-9s act=%-4s scale=%-4s",
                 aq ? "AQ" : "WO", fmt, dtn(g.adt), dtn(g.sdt));
        if (g_filter != NULL && (nsh = filter_shapes(ctx, sh, nsh)) == 0)
          continue;
        run_linear(bks, nb, &g, sh, nsh, &s);
        if (s.passed + s.failed == 0 && s.skipped > 0) {
          /* nothing ran: one line for the (format, path), below */
          nskip += s.skipped;
          g_skipped += s.skipped;
          if (why[0] == '\0')
            snprintf(why, sizeof why, "%s", no_impl_reason(c->f, aq, 0));
          continue;
        }
        group_done(&s, ctx, bks, nb);
      }
      if (nskip && g_loop == 0)
        printf("skip %s %s, every dtype combo: %ld cases, no implementation "
               "on any backend: %s\n",
               aq ? "AQ" : "WO", fmt, nskip, why);
    }
}

/*
 * The linear groups are most of the run time and independent of each
 * other, so two child processes share them (DESIGN §11: 2 cores), split
 * where the (format, path) count halves. They are forked before this
 * process calls any kernel, so that no thread (a backend's pool) exists
 * yet at fork(). Each child writes its report to a temporary file and ends
 * it with its counters; the parent prints the reports in format order and
 * adds the counters. A child that dies (a crashing implementation, a
 * sanitizer report) is a failure, not a lost report. Without fork() or
 * tmpfile() the groups run in this process.
 */
typedef struct workers {
  int cut[WORKERS + 1];
  FILE *tf[WORKERS];
  pid_t pid[WORKERS];
} workers;

static void workers_start(workers *wk, const bk *bks, int nb) {
  int total = 0, acc = 0;

  for (int ci = 0; ci < NFCFG; ci++) /* q8b has no AQ work */
    total += 1 + (fcfgs[ci].f != QL_FORMAT_Q8B);
  wk->cut[0] = 0;
  wk->cut[WORKERS] = NFCFG;
  for (int ci = 0, wi = 1; ci < NFCFG && wi < WORKERS; ci++) {
    acc += 1 + (fcfgs[ci].f != QL_FORMAT_Q8B);
    if (acc * WORKERS >= total * wi)
      wk->cut[wi++] = ci + 1;
  }
  fflush(stdout);
  for (int w = 0; w < WORKERS; w++) {
    wk->pid[w] = -1;
    if ((wk->tf[w] = tmpfile()) == NULL || (wk->pid[w] = fork()) < 0)
      continue; /* run by workers_finish() */
    if (wk->pid[w] == 0) {
      double t0 = now_s();
      if (dup2(fileno(wk->tf[w]), STDOUT_FILENO) < 0)
        _exit(3);
      g_in_worker = 1;
      g_passed = g_failed = g_skipped = 0;
      run_linear_range(bks, nb, wk->cut[w], wk->cut[w + 1]);
      xcache_free();
      printf("# worker %d (formats %d..%d): %.1f s, %.1f s of CPU\n", w,
             wk->cut[w], wk->cut[w + 1] - 1, now_s() - t0,
             (double)clock() / CLOCKS_PER_SEC);
      printf("@counts %ld %ld %ld\n", g_passed, g_failed, g_skipped);
      fflush(stdout);
      exit(0);
    }
    g_worker_pid[w] = wk->pid[w];
  }
}

static void workers_finish(workers *wk, const bk *bks, int nb) {
  int wst[WORKERS] = {0}, reaped[WORKERS] = {0}, killed[WORKERS] = {0};

  /* Fail-fast: the workers as they end (polled by pid), the others killed
   * once one fails; their reports are then read in order as below. */
  for (int live = g_fail_fast; live > 0;) {
    live = 0;
    for (int i = 0; i < WORKERS; i++) {
      int st = 0;
      if (wk->pid[i] <= 0 || reaped[i])
        continue;
      pid_t r = waitpid(wk->pid[i], &st, WNOHANG);
      if (r == 0) {
        live++;
        continue;
      }
      wst[i] = r < 0 ? -1 : st;
      reaped[i] = 1;
      g_worker_pid[i] = 0;
      if (r > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0)
        continue;
      for (int j = 0; j < WORKERS; j++)
        if (j != i && wk->pid[j] > 0 && !reaped[j] && !killed[j]) {
          kill(wk->pid[j], SIGKILL);
          killed[j] = 1;
        }
    }
    if (live > 0)
      usleep(20000);
  }
  for (int w = 0; w < WORKERS; w++) {
    char line[1024];
    long p, f = 0, sk;
    int st = 0, counted = 0;

    if (wk->pid[w] < 0) {
      if (wk->tf[w] != NULL)
        fclose(wk->tf[w]);
      run_linear_range(bks, nb, wk->cut[w], wk->cut[w + 1]);
      continue;
    }
    if (reaped[w])
      st = wst[w];
    else if (waitpid(wk->pid[w], &st, 0) < 0)
      st = -1;
    g_worker_pid[w] = 0;
    rewind(wk->tf[w]);
    while (fgets(line, sizeof line, wk->tf[w]) != NULL) {
      if (sscanf(line, "@counts %ld %ld %ld", &p, &f, &sk) == 3) {
        g_passed += p;
        g_failed += f;
        g_skipped += sk;
        counted = 1;
      } else {
        fputs(line, stdout);
      }
    }
    fclose(wk->tf[w]);
    if (killed[w] && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
      printf("note worker for formats %d..%d: stopped (fail-fast)\n",
             wk->cut[w], wk->cut[w + 1] - 1);
      continue;
    }
    /* stopped by fail-fast at failures its counters hold */
    if (g_fail_fast && counted && f > 0 && WIFEXITED(st) &&
        WEXITSTATUS(st) == FAIL_FAST_EXIT)
      continue;
    if (!counted || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      g_failed++;
      printf("FAIL worker for formats %d..%d: %s %d, report %s\n",
             wk->cut[w], wk->cut[w + 1] - 1,
             WIFSIGNALED(st) ? "killed by signal" : "exit status",
             WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st),
             counted ? "complete" : "incomplete");
    }
  }
}

/* A hung implementation (a lost wake-up in a pool, a spinning kernel) must
 * not hang `make check`: after WATCHDOG_S seconds the run fails, naming
 * the cause, and takes its workers with it. */
#define WATCHDOG_S 1200

static void on_watchdog(int sig) {
  static const char msg[] =
      "FAIL conformance: no result after 1200 s (a hung implementation?); "
      "workers killed\n";
  (void)sig;
  for (int w = 0; w < WORKERS; w++)
    if (g_worker_pid[w] > 0)
      kill(g_worker_pid[w], SIGKILL);
  if (write(STDOUT_FILENO, msg, sizeof msg - 1) < 0 ||
      write(STDERR_FILENO, msg, sizeof msg - 1) < 0)
    _exit(1);
  _exit(1);
}

/* --------------------------------------------------------------- main */

/*
 * b->device_count(), asked in a child process: a driver started in this
 * process before workers_start() forks would be unusable in the workers
 * (a Level Zero driver's threads do not survive fork). *why gets the
 * backend's sentence (a static buffer) when there is no device.
 */
static int probe_devices(const ql_backend *b, const char **why) {
  static char text[256];
  int fd[2], n = -1, status;
  pid_t pid;
  *why = "the device probe failed";
  if (pipe(fd) != 0)
    return -1;
  if ((pid = fork()) < 0) {
    close(fd[0]);
    close(fd[1]);
    return -1;
  }
  if (pid == 0) {
    const char *w = NULL;
    char out[sizeof text + 16];
    int c = b->device_count(&w);
    int len = snprintf(out, sizeof out, "%d %s", c, w != NULL ? w : "?");
    if (write(fd[1], out, (size_t)len) < 0)
      _exit(1);
    _exit(0);
  }
  close(fd[1]);
  char in[sizeof text + 16];
  ssize_t got = read(fd[0], in, sizeof in - 1);
  close(fd[0]);
  waitpid(pid, &status, 0);
  if (got > 0) {
    int at = 0;
    in[got] = '\0';
    if (sscanf(in, "%d %n", &n, &at) == 1) {
      snprintf(text, sizeof text, "%s", in + at);
      *why = text;
    } else {
      n = -1;
    }
  }
  return n;
}

static void print_dims(const char *name, const int64_t *v, int n) {
  printf("%s{", name);
  for (int i = 0; i < n; i++)
    printf("%s%lld", i ? "," : "", (long long)v[i]);
  printf("}");
}

int main(int argc, char **argv) {
  bk bks[MAX_BK];
  int nb = 0;
  size_t nreg = 0;
  const ql_backend *const *reg = ql_backends(&nreg);
  static nmse_row nrows[NFCFG * 2 * MAX_BK];
  workers wk;
  int nnr = 0;
  double t0 = now_s(), t;
  const char *ff = getenv("QL_CONFORMANCE_FAIL_FAST");
  const char *base = strrchr(argv[0], '/');
  setvbuf(stdout, NULL, _IOLBF, 0);
  /* (libtool runs an uninstalled program as lt-NAME) */
  base = base != NULL ? base + 1 : argv[0];
  g_fail_fast = (ff != NULL && ff[0] != '\0' && strcmp(ff, "0") != 0) ||
                strncmp(base, "mutant_", 7) == 0 ||
                strncmp(base, "lt-mutant_", 10) == 0;
#ifdef QL_CONFORMANCE_BACKEND
  /* A build of the harness for one backend (Makefile.am: the emulated CUDA
   * kernels) runs as if given --backend NAME --small. */
  if ((g_only = ql_backend_find(QL_CONFORMANCE_BACKEND)) == NULL) {
    printf("FAIL conformance: no backend called %s is built in\n",
           QL_CONFORMANCE_BACKEND);
    return EXIT_FAILURE;
  }
  Ms = SMALL_Ms, Ns = SMALL_Ns, Ks = SMALL_Ks;
  NM = COUNT(SMALL_Ms), NN = COUNT(SMALL_Ns), NK = COUNT(SMALL_Ks);
#endif
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
      if ((g_only = ql_backend_find(argv[++i])) == NULL) {
        printf("FAIL conformance: no backend called %s is built in\n",
               argv[i]);
        return EXIT_FAILURE;
      }
    } else if (strcmp(argv[i], "--small") == 0) {
      Ms = SMALL_Ms, Ns = SMALL_Ns, Ks = SMALL_Ks;
      NM = COUNT(SMALL_Ms), NN = COUNT(SMALL_Ns), NK = COUNT(SMALL_Ks);
    } else if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc) {
      g_filter = argv[++i];
    } else if (strcmp(argv[i], "--loop") == 0 && i + 1 < argc) {
      char *end;
      g_loop = strtol(argv[++i], &end, 10);
      if (*end != '\0' || g_loop < 1 || g_loop > 100000000)
        g_loop = -1;
    } else {
      g_loop = -1;
    }
    if (g_loop < 0)
      break;
  }
  if (g_loop < 0 || (g_loop > 0 && g_filter == NULL)) {
    fprintf(stderr, "usage: %s [--backend NAME] [--small] "
            "[--filter SUBSTR [--loop N]]\n", argv[0]);
    return 2;
  }
  signal(SIGALRM, on_watchdog);
  if (g_loop == 0) /* --loop: the caller bounds its time */
    alarm(WATCHDOG_S);
  if (g_only == NULL)
    bks[nb++] = (bk){"generic", NULL};
  for (size_t i = 0; i < nreg && nb < MAX_BK; i++) {
    if (g_only != NULL && reg[i] != g_only)
      continue;
    if (ql_backend_check(reg[i]) != 0) {
      printf("FAIL backend %s: ql_backend_check refuses its table\n",
             reg[i]->name);
      g_failed++;
      continue;
    }
    /* A backend whose devices this machine lacks (a GPU build here) cannot
     * run its ops; asked for by name it is a failure, in the run over all
     * backends it is left out and said so (the emulated build of its
     * kernels has a harness of its own). */
    const char *why = NULL;
    if (reg[i]->device_count != NULL && probe_devices(reg[i], &why) <= 0) {
      printf("%s backend %s: no device here (%s)\n",
             g_only != NULL ? "FAIL" : "left out:", reg[i]->name,
             why != NULL ? why : "?");
      if (g_only != NULL)
        g_failed++;
      continue;
    }
    bks[nb++] = (bk){reg[i]->name, reg[i]};
  }

  printf("qlinear conformance harness (DESIGN §4, §5, §11)\n");
  printf("backends:");
  for (int i = 0; i < nb; i++)
    if (bks[i].b == NULL)
      printf(" generic (fallback)");
    else
      printf("%s %s (%zu own implementations)", i ? "," : "", bks[i].name,
             bks[i].b->n_impls);
  if (g_only != NULL)
    printf("; --backend: cases it leaves to the generic fallback are "
           "skipped");
  if (Ms != FULL_Ms) {
    printf("\n--small: the shape matrix below is ");
    print_dims("M", Ms, NM);
    print_dims(" x N", Ns, NN);
    print_dims(" x K", Ks, NK);
    printf(" (%d shapes), huge K kept", NM * NN * NK);
  }
  printf("\ncoverage:\n"
         "  formats: q4g g32/64/128/256, q8b b32/64/128/256 sym+asym, q8c, "
         "f8r; WO for all, AQ for q4g (W4A8), q8c (W8A8), f8r (e4m3)\n"
         "  act f32 / scale bf16: full matrix M{1,2,3,7,16,33,128} x "
         "N{1,8,65,512} x K{16,100,128,129,1000,4096} (%d shapes)\n"
         "  the other 8 (act, scale) dtype combos: each shape in exactly one, "
         "rotating with format and path (~%d shapes each)\n"
         "  every combo: huge K {%lld, %lld} at M=%d N=%d; bias on for half "
         "of the (N,K) pairs\n"
         "  x rows cycle: gauss, int8 .5 ties (+-amax, -128), e4m3 ties "
         "(-448), zeros, +-amax, const, small, const -127.5/128 (-128)\n"
         "  W rows: 0 gauss, 1 zeros, 2 const (-128), 3 int8 ties (-128 per "
         "block), rest gauss + offset\n"
         "  quantize_rows: every M x K (+ huge K at M=8) for int8 gs "
         "32..256/K with and without gsum, and e4m3, all act dtypes\n"
         "bounds: u = 2^-24, g(n) = n*u/(1-n*u); WO g(K+3[+G])*(sum|x|*m + |b|); "
         "AQ q8c g(4)*(|Y|+|b|), q4g g(2G+5)*(..), f8r g(K+3)*(..); "
         "+ half ulp for f16/bf16 y\n",
         NSHAPE, NSHAPE / 8, (long long)HUGE_K[0], (long long)HUGE_K[1],
         HUGE_M, HUGE_N);

  if (g_filter != NULL) {
    /* The filtered linear cases alone, in this process (a case or a few:
     * no workers), --loop times. */
    long bad_runs = 0, runs = g_loop > 0 ? g_loop : 1;
    printf("--filter \"%s\": the linear cases whose name contains it, "
           "%ld time%s\n", g_filter, runs, runs > 1 ? "s" : "");
    for (long r = 0; r < runs; r++) {
      long f0 = g_failed;
      run_linear_range(bks, nb, 0, NFCFG);
      if (g_failed > f0) {
        bad_runs++;
        printf("run %ld of %ld: %ld failed\n", r + 1, runs, g_failed - f0);
      }
    }
    xcache_free();
    if (g_loop > 0)
      printf("--loop: %ld runs, %ld with a failure\n", runs, bad_runs);
    printf("%ld passed, %ld failed, %ld skipped; %.1f s\n", g_passed,
           g_failed, g_skipped, now_s() - t0);
    if (g_passed + g_failed == 0) {
      printf("FAIL --filter \"%s\": no case has that in its name\n",
             g_filter);
      return EXIT_FAILURE;
    }
    return g_failed ? EXIT_FAILURE : EXIT_SUCCESS;
  }

  /* Before this process calls any kernel: see workers_start(). */
  workers_start(&wk, bks, nb);

  check_rows_adversarial();

  /* quantize_rows */
  for (int v = 0; v < NQVAR; v++)
    for (int d = 0; d < 3; d++) {
      ql_dtype adt = combos[d == 0 ? 0 : d == 1 ? 3 : 6].act;
      shape qs[COUNT(FULL_Ms) * COUNT(FULL_Ks) + 2];
      int nq = 0;
      char ctx[96];
      sink s = {.ctx = ctx};
      snprintf(ctx, sizeof ctx, "quantize_rows %s act=%s", qvars[v].name,
               dtn(adt));
      for (int ki = 0; ki < NK; ki++)
        for (int mi = 0; mi < NM; mi++)
          qs[nq++] = (shape){Ms[mi], 1, Ks[ki], 0};
      for (int h = 0; h < 2; h++)
        qs[nq++] = (shape){HUGE_M, 1, HUGE_K[h], 0};
      run_qrows(bks, nb, &qvars[v], adt, qs, nq, &s);
      group_done(&s, ctx, bks, nb);
    }
  t = now_s();
  printf("# quantize_rows: %.1f s\n", t - t0);

  /* non-finite activations */
  for (int op = 0; op < 3; op++) {
    static const char *const what[3] = {"quantize_rows", "WO", "AQ"};
    char ctx[64];
    sink s = {.ctx = ctx};
    snprintf(ctx, sizeof ctx, "non-finite x (NaN, +-Inf) -> QL_ENONFINITE, %s",
             what[op]);
    for (int d = 0; d < 3; d++) {
      ql_dtype adt = combos[d == 0 ? 0 : d == 1 ? 3 : 6].act;
      if (op == 0) {
        for (int v = 0; v < NQVAR; v++)
          run_nonfinite_qrows(bks, nb, &qvars[v], adt, &s);
        continue;
      }
      for (int ci = 0; ci < NFCFG; ci++) {
        lgroup g = {&fcfgs[ci], ci, op == 2, adt, QL_DTYPE_BF16};
        run_nonfinite_linear(bks, nb, &g, &s);
      }
    }
    group_done(&s, ctx, bks, nb);
  }

  /* linear ops, in the workers started above */
  workers_finish(&wk, bks, nb);
  printf("# linear ops (workers, in parallel with the above): %.1f s\n",
         now_s() - t0);
  if (g_failed)
    fail_fast_stop("the workers' failures");
  t = now_s();

  /* NMSE */
  {
    char ctx[64];
    sink s = {.ctx = ctx};
    snprintf(ctx, sizeof ctx, "NMSE");
    for (int ci = 0; ci < NFCFG; ci++)
      for (int aq = 0; aq < 2; aq++)
        run_nmse(bks, nb, &fcfgs[ci], ci, aq, &s, nrows, &nnr);
    printf("NMSE vs the unquantized product (x, W ~ N(0,1), M=%d N=%d K=%d, "
           "act f32, scale bf16); band: measured/predicted in [%.2f, %.2f]\n",
           NMSE_M, NMSE_N, NMSE_K, NMSE_LO, NMSE_HI);
    printf("  %-9s %-4s %-22s %-12s %-12s %-7s %s\n", "format", "path",
           "implementation", "NMSE", "predicted", "ratio", "backends");
    for (int i = 0; i < nnr; i++) {
      printf("  %-9s %-4s %-22s %-12.4e %-12.4e %-7.3f", nrows[i].fmt,
             nrows[i].aq ? "AQ" : "WO", nrows[i].impl, nrows[i].nmse,
             nrows[i].pred, nrows[i].ratio);
      for (int j = 0, first = 1; j < nb; j++)
        if (nrows[i].mask & (1u << j)) {
          printf("%s%s", first ? " " : ",", bks[j].name);
          first = 0;
        }
      printf("%s\n", nrows[i].ratio >= NMSE_LO && nrows[i].ratio <= NMSE_HI
                         ? ""
                         : "  <- FAIL");
    }
    group_done(&s, "NMSE", bks, nb);
  }
  printf("# NMSE: %.1f s\n", now_s() - t);
  t = now_s();

  self_check();
  xcache_free();
  printf("# self-check: %.1f s; total %.1f s (this process: %.1f s of "
         "CPU)\n", now_s() - t, now_s() - t0,
         (double)clock() / CLOCKS_PER_SEC);

  printf("%ld passed, %ld failed, %ld skipped\n", g_passed, g_failed,
         g_skipped);
  return g_failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
