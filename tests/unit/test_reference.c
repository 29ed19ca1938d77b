/*
 * test_reference.c - unit tests for kernels/reference.c: per-row int8 and
 * e4m3 activation quantization and the reference WO and AQ linear ops.
 *
 * Each op is checked three ways: bit for bit against a naive re-evaluation
 * of its documented formula in the documented order (every f32 operation
 * forced to round through a volatile, so the test does not depend on the
 * compiler's contraction settings); against an fp64 evaluation within an
 * error bound stated as a function of K; and, against the unquantized
 * product, by an NMSE bounded from both sides.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ql_kernels.h"
#include "registry.h"
#include "testutil.h"

/* ---------------------------------------------------------------- helpers */

/* One rounded f32 operation each; volatile stops contraction into FMA. */
static float mul32(float a, float b) {
  volatile float r = a * b;
  return r;
}
static float add32(float a, float b) {
  volatile float r = a + b;
  return r;
}

typedef struct cfg {
  ql_format f;
  uint32_t gs;
  int asym; /* q8b only */
} cfg;

static const cfg cfgs[] = {
    {QL_FORMAT_Q4G, 32, 0},  {QL_FORMAT_Q4G, 64, 0},  {QL_FORMAT_Q4G, 128, 0},
    {QL_FORMAT_Q4G, 256, 0}, {QL_FORMAT_Q8C, 0, 0},   {QL_FORMAT_Q8B, 32, 0},
    {QL_FORMAT_Q8B, 64, 1},  {QL_FORMAT_Q8B, 128, 0}, {QL_FORMAT_Q8B, 256, 1},
    {QL_FORMAT_F8R, 0, 0},
};
#define NCFG ((int)(sizeof cfgs / sizeof cfgs[0]))

static ql_quant_params params_of(const cfg *c, ql_dtype sdt) {
  ql_quant_params p;
  memset(&p, 0, sizeof p);
  p.format = c->f;
  p.group_size = c->gs;
  p.asymmetric = c->asym;
  p.scale_dtype = sdt;
  return p;
}

typedef int (*linear_fn)(const ql_qweight *, ql_dtype, const void *, int64_t,
                         void *);

/* A weight [n,k] of Gaussian rows with per-row offsets (asymmetric groups),
 * optionally with a bias, drawn from the stream *rng. */
static ql_qweight *make_weight(uint64_t *rng, const cfg *c, int64_t n,
                               int64_t k, int bias, ql_dtype sdt,
                               float **w_out) {
  float *w = tu_xmalloc((size_t)(n * k) * sizeof(float));
  float *b = tu_xmalloc((size_t)n * sizeof(float));
  ql_qweight *q = NULL;
  int64_t i;
  int rc;

  for (i = 0; i < n * k; i++)
    w[i] = (float)(0.05 * tu_rng_gauss(rng) + 0.01 * (double)(i / k % 3));
  for (i = 0; i < n; i++)
    b[i] = (float)tu_rng_gauss(rng);
  {
    ql_quant_params p = params_of(c, sdt);
    rc = ql_qweight_quantize(&p, n, k, QL_DTYPE_F32, w, bias ? b : NULL, &q);
  }
  REQUIRE(rc == 0, "quantize: %d", rc);
  free(b);
  if (w_out)
    *w_out = w;
  else
    free(w);
  return q;
}

/* Activation rows: Gaussian (from *rng), exact .5 ties, and zeros, cycling
 * with r. */
static void make_x(uint64_t *rng, float *x, int64_t m, int64_t k) {
  int64_t r, i;
  for (r = 0; r < m; r++)
    for (i = 0; i < k; i++) {
      float *v = &x[r * k + i];
      switch (r % 3) {
      case 0:
        *v = (float)tu_rng_gauss(rng);
        break;
      case 1: /* scale 2^-4: x·(1/scale) = j + 0.5 exactly, amax first */
        *v = i == 0 ? -127.5f * 0.0625f
                    : (float)((double)((i * 37) % 255) - 127.0 + 0.5) * 0.0625f;
        break;
      default:
        *v = 0.0f;
      }
    }
}

/* The q value of row r, column i of a weight, however it is packed (the
 * e4m3 code for f8r). */
static int wq_at(const ql_qweight *q, int64_t r, int64_t i) {
  if (q->format == QL_FORMAT_Q4G)
    return tu_s4_at(q->qdata + r * ((q->k + 1) / 2), i);
  if (q->format == QL_FORMAT_F8R)
    return q->qdata[r * q->k + i];
  return ((const int8_t *)q->qdata)[r * q->k + i];
}

/* Whether ql_linear_aq_ref serves the format (q8b is weight-only). */
static int has_aq(const ql_qweight *q) { return q->format != QL_FORMAT_Q8B; }

/* ---------------------------------------------------- quantize_rows_i8 */

START_TEST(test_qrows_independent) {
  enum { M = 6, K = 100 };
  static const uint32_t gss[] = {1, 7, 32, 100, 1000};
  float *x = tu_xmalloc(M * K * sizeof(float)), sx[M];
  int8_t *xq = tu_xmalloc(M * K);
  int32_t *gsum = tu_xmalloc(M * K * sizeof(int32_t));
  size_t gi;
  int r, i;
  uint64_t rng = 1;

  for (r = 0; r < M; r++)
    for (i = 0; i < K; i++) {
      double g = tu_rng_gauss(&rng);
      float v;
      switch (r) {
      case 0:
        v = (float)g;
        break;
      case 1:
        v = (float)(1e3 * g);
        break;
      case 2: /* amax/127.5 below eps: the scale clamps to FLT_EPSILON */
        v = (float)(1e-7 * g);
        break;
      case 3:
        v = (float)((double)(i % 255) - 127.0 + 0.5) * 0.0625f;
        break;
      case 4:
        v = 0.0f;
        break;
      default:
        v = (float)(1.8 * tu_rng_uniform(&rng) - 0.9);
      }
      x[r * K + i] = v;
    }
  /* the row's -amax, 127.5·2^-7: scale 2^-7, so it maps to -128 */
  x[5 * K + 17] = -127.5f / 128.0f;

  for (gi = 0; gi < sizeof gss / sizeof gss[0]; gi++) {
    uint32_t gs = gss[gi];
    int g, ng = (int)((K + gs - 1) / gs);

    memset(gsum, 0x55, M * K * sizeof(int32_t));
    ck_assert_int_eq(ql_quantize_rows_i8(x, M, K, gs, xq, sx, gsum), 0);
    for (r = 0; r < M; r++) {
      const float *xr = x + r * K;
      float amax = 0.0f, s, inv;
      for (i = 0; i < K; i++)
        amax = fabsf(xr[i]) > amax ? fabsf(xr[i]) : amax;
      s = (float)((double)amax / 127.5);
      if (s < FLT_EPSILON)
        s = FLT_EPSILON;
      inv = (float)(1.0 / (double)s);
      REQUIRE(tu_f32_bits(sx[r]) == tu_f32_bits(s), "sx[%d] = %a, want %a", r,
              (double)sx[r], (double)s);
      for (i = 0; i < K; i++) {
        double t = tu_rne((double)(float)((double)xr[i] * (double)inv));
        int want = (int)(t < -128 ? -128 : t > 127 ? 127 : t);
        REQUIRE(xq[r * K + i] == want, "xq[%d,%d] = %d, want %d (x %a)", r,
                i, xq[r * K + i], want, (double)xr[i]);
      }
      for (g = 0; g < ng; g++) {
        int64_t sum = 0;
        for (i = g * (int)gs; i < K && i < (g + 1) * (int)gs; i++)
          sum += xq[r * K + i];
        REQUIRE(gsum[r * ng + g] == sum, "gs %u gsum[%d,%d] = %d, want %lld",
                gs, r, g, gsum[r * ng + g], (long long)sum);
      }
    }
    /* nothing written past M·G */
    REQUIRE(M * ng == M * K || gsum[M * ng] == 0x55555555, "gsum overrun");
  }
  ck_assert_int_eq(xq[5 * K + 17], -128);
  ck_assert(sx[2] == FLT_EPSILON);
  for (i = 0; i < K; i++)
    REQUIRE(xq[4 * K + i] == 0, "zero row");
  ck_assert(sx[4] == FLT_EPSILON);
  /* gsum is optional */
  ck_assert_int_eq(ql_quantize_rows_i8(x, M, K, 32, xq, sx, NULL), 0);
  free(x);
  free(xq);
  free(gsum);
}
END_TEST

START_TEST(test_qrows_ties) {
  /* amax = 127.5·2^-4 gives scale 2^-4 and 1/scale = 16 exactly, so each
   * x·16 below is an exact .5 tie: half to even, and -127.5 -> -128. */
  static const double t[] = {-127.5, -126.5, -2.5, -1.5, -0.5, 0.5,
                             1.5,    2.5,    3.5,  125.5, 126.5, 127.0};
  static const int8_t want[] = {-128, -126, -2, -2, 0, 0,
                                2,    2,    4,  126, 126, 127};
  enum { K = sizeof t / sizeof t[0] };
  float x[K], sx;
  int8_t xq[K];
  int32_t gsum[2];
  int i, s = 0;

  for (i = 0; i < K; i++)
    x[i] = (float)(t[i] * 0.0625);
  ck_assert_int_eq(ql_quantize_rows_i8(x, 1, K, 6, xq, &sx, gsum), 0);
  ck_assert(sx == 0.0625f);
  for (i = 0; i < K; i++)
    ck_assert_msg(xq[i] == want[i], "x·16 = %g: got %d, want %d", t[i], xq[i],
                  want[i]);
  for (i = 0; i < 6; i++)
    s += want[i];
  ck_assert_int_eq(gsum[0], s);
  for (s = 0, i = 6; i < K; i++)
    s += want[i];
  ck_assert_int_eq(gsum[1], s);
}
END_TEST

/* The reciprocal multiply, not a division: with scale 167/256,
 * -126.5·scale divides to an exact tie (-> -126) but x·(1/scale) lands
 * below it (-> -127); with 159/256 the row's -amax gives -127, not -128. */
START_TEST(test_qrows_reciprocal) {
  const float s1 = 167.0f / 256.0f, s2 = 159.0f / 256.0f;
  float x[2 * 3] = {127.5f * s1, -126.5f * s1, 0.0f, -127.5f * s2, s2, 0.0f};
  float sx[2];
  int8_t xq[6];
  int32_t gsum[2];

  ck_assert(tu_rne((double)x[1] / s1) == -126.0);
  ck_assert(tu_rne((double)x[3] / s2) == -128.0);
  ck_assert_int_eq(ql_quantize_rows_i8(x, 2, 3, 3, xq, sx, gsum), 0);
  ck_assert(sx[0] == s1 && sx[1] == s2);
  ck_assert_int_eq(xq[1], -127);
  ck_assert_int_eq(xq[3], -127);
  ck_assert_int_eq(xq[4], 1);
  ck_assert_int_eq(gsum[0], xq[0] - 127);
  ck_assert_int_eq(gsum[1], -126);
}
END_TEST

START_TEST(test_qrows_errors) {
  float x[2 * 8] = {0};
  int8_t xq[16];
  float sx[2];
  int32_t gsum[16];
  static const float bad[3] = {NAN, INFINITY, -INFINITY};
  int b;

  for (b = 0; b < 3; b++) {
    x[8 + 5] = bad[b];
    ck_assert_int_eq(ql_quantize_rows_i8(x, 2, 8, 4, xq, sx, gsum),
                     QL_ENONFINITE);
    ck_assert_int_eq(ql_quantize_rows_i8(x, 1, 8, 4, xq, sx, gsum), 0);
  }
  x[8 + 5] = 1.0f;
  ck_assert_int_eq(ql_quantize_rows_i8(NULL, 2, 8, 4, xq, sx, gsum),
                   QL_EINVAL);
  ck_assert_int_eq(ql_quantize_rows_i8(x, 2, 8, 4, NULL, sx, gsum),
                   QL_EINVAL);
  ck_assert_int_eq(ql_quantize_rows_i8(x, 2, 8, 4, xq, NULL, gsum),
                   QL_EINVAL);
  ck_assert_int_eq(ql_quantize_rows_i8(x, 2, 8, 0, xq, sx, gsum), QL_EINVAL);
  ck_assert_int_eq(ql_quantize_rows_i8(x, 2, 8, 0, xq, sx, NULL), QL_EINVAL);
  ck_assert_int_eq(ql_quantize_rows_i8(x, 0, 8, 4, xq, sx, gsum), QL_ESHAPE);
  ck_assert_int_eq(ql_quantize_rows_i8(x, 2, 0, 4, xq, sx, gsum), QL_ESHAPE);
  ck_assert_int_eq(ql_quantize_rows_i8(x, -1, 8, 4, xq, sx, gsum), QL_ESHAPE);
  ck_assert_int_eq(ql_quantize_rows_i8(x, QL_DIM_MAX + 1, 8, 4, xq, sx, gsum),
                   QL_ESHAPE);
  /* a huge gs with a small K is one group */
  ck_assert_int_eq(ql_quantize_rows_i8(x, 2, 8, UINT32_MAX, xq, sx, gsum), 0);
  ck_assert_int_eq(gsum[1], xq[8] + xq[9] + xq[10] + xq[11] + xq[12] +
                                xq[13] + xq[14] + xq[15]);
  ck_assert_int_eq(xq[13], 127);
}
END_TEST

/* ------------------------------------------------- quantize_rows_e4m3 */

/*
 * Against the f8r rule in double arithmetic with an exhaustive-search
 * e4m3 encoder: sx = max(amax, 1e-12f)/448 correctly rounded, q = nearest
 * even code of clamp(RN32(x / sx), ±448). Rows: Gaussian, huge, below the
 * 1e-12 floor, spanning the subnormals, all zero, a constant.
 */
START_TEST(test_qrows_e4m3_independent) {
  enum { M = 7, K = 300 };
  float *x = tu_xmalloc(M * K * sizeof(float)), sx[M];
  uint8_t *xq = tu_xmalloc(M * K);
  uint64_t rng = 3;
  int r, i;

  for (r = 0; r < M; r++)
    for (i = 0; i < K; i++) {
      double g = tu_rng_gauss(&rng);
      float v;
      switch (r) {
      case 0:
        v = (float)g;
        break;
      case 1:
        v = (float)(1e30 * g);
        break;
      case 2: /* amax below 1e-12: the floor sets the scale */
        v = (float)(1e-14 * g);
        break;
      case 3: /* 2^-20 .. 2^0 around amax 1: e4m3 subnormals and zeros */
        v = (float)ldexp(g > 0 ? 1.0 : -1.0, -(i % 21)) *
            (float)(1.0 + 0.3 * tu_rng_uniform(&rng));
        break;
      case 4:
        v = 0.0f;
        break;
      case 5:
        v = -2.5f;
        break;
      default:
        v = (float)(g * 1e-3);
      }
      x[r * K + i] = v;
    }
  ck_assert_int_eq(ql_quantize_rows_e4m3(x, M, K, xq, sx), 0);
  for (r = 0; r < M; r++) {
    const float *xr = x + r * K;
    float amax = 0.0f, s;
    for (i = 0; i < K; i++)
      amax = fabsf(xr[i]) > amax ? fabsf(xr[i]) : amax;
    s = (float)((double)(amax > 1e-12f ? amax : 1e-12f) / 448.0);
    REQUIRE(tu_f32_bits(sx[r]) == tu_f32_bits(s), "sx[%d] = %a, want %a", r,
            (double)sx[r], (double)s);
    for (i = 0; i < K; i++) {
      double t = (double)(float)((double)xr[i] / (double)s);
      uint8_t want = tu_e4m3_nearest(t < -448.0 ? -448.0 : t > 448.0 ? 448.0 : t);
      REQUIRE(xq[r * K + i] == want, "xq[%d,%d] = %02x, want %02x (x %a)", r, i,
              xq[r * K + i], want, (double)xr[i]);
      if (fabsf(xr[i]) == amax && amax >= 1e-12f)
        REQUIRE((xq[r * K + i] & 0x7F) == 0x7E, "amax gives %02x",
                xq[r * K + i]);
    }
  }
  /* the zero row: zeros, a finite positive scale, never NaN */
  ck_assert(sx[4] == 1e-12f / 448.0f && sx[4] > 0.0f);
  for (i = 0; i < K; i++)
    REQUIRE(xq[4 * K + i] == 0, "zero row at %d", i);
  /* the constant row: all -448 */
  for (i = 0; i < K; i++)
    REQUIRE(xq[5 * K + i] == 0xFE, "constant row at %d", i);
  /* the subnormal row reaches codes 1..7 and flushes some values to 0 */
  {
    int sub = 0, zero = 0;
    for (i = 0; i < K; i++) {
      sub += (xq[3 * K + i] & 0x7F) >= 1 && (xq[3 * K + i] & 0x7F) <= 7;
      zero += (xq[3 * K + i] & 0x7F) == 0;
    }
    ck_assert(sub > 10 && zero > 10);
  }
  free(x);
  free(xq);
}
END_TEST

/*
 * Ties and the division. amax = 448 gives sx = 1, so x itself is rounded:
 * e4m3 ties go to the even code. Rows 1 and 2 use scales 159·2^-16 and
 * 167·2^-16: t·scale with t = 31·2^-10 and 29·2^-10 divides back to an
 * exact tie (-> 0x10, 0x0E) that x·(1/scale) would push the other way.
 */
START_TEST(test_qrows_e4m3_ties) {
  static const float t[] = {448.0f,         1.0625f,  1.1875f,  -232.0f,
                            248.0f,         0x1p-10f, 0x3p-10f, -0x5p-10f,
                            7.5f * 0x1p-9f, -0.0f,    432.0f,   0x1p-12f};
  static const uint8_t want[] = {0x7E, 0x38, 0x3A, 0xF6, 0x78, 0x00,
                                 0x02, 0x82, 0x08, 0x80, 0x7E, 0x00};
  enum { K = sizeof t / sizeof t[0] };
  const float s1 = ldexpf(159.0f, -16), s2 = ldexpf(167.0f, -16);
  float x2[2 * 2] = {448.0f * s1, 31.0f * 0x1p-10f * s1, -448.0f * s2,
                     29.0f * 0x1p-10f * s2};
  float sx[2];
  uint8_t xq[K];
  int i;

  ck_assert_int_eq(ql_quantize_rows_e4m3(t, 1, K, xq, sx), 0);
  ck_assert(sx[0] == 1.0f);
  for (i = 0; i < K; i++)
    ck_assert_msg(xq[i] == want[i], "x = %a: got %02x, want %02x", (double)t[i],
                  xq[i], want[i]);
  ck_assert_uint_eq(ql_f32_to_e4m3(x2[1] * (1.0f / s1)), 0x0F);
  ck_assert_uint_eq(ql_f32_to_e4m3(x2[3] * (1.0f / s2)), 0x0F);
  ck_assert_int_eq(ql_quantize_rows_e4m3(x2, 2, 2, xq, sx), 0);
  ck_assert(sx[0] == s1 && sx[1] == s2);
  ck_assert_uint_eq(xq[0], 0x7E);
  ck_assert_uint_eq(xq[1], 0x10);
  ck_assert_uint_eq(xq[2], 0xFE);
  ck_assert_uint_eq(xq[3], 0x0E);
}
END_TEST

START_TEST(test_qrows_e4m3_errors) {
  float x[2 * 8] = {0};
  uint8_t xq[16];
  float sx[2];
  static const float bad[3] = {NAN, INFINITY, -INFINITY};
  int b;

  for (b = 0; b < 3; b++) {
    x[8 + 5] = bad[b];
    ck_assert_int_eq(ql_quantize_rows_e4m3(x, 2, 8, xq, sx), QL_ENONFINITE);
    ck_assert_int_eq(ql_quantize_rows_e4m3(x, 1, 8, xq, sx), 0);
    x[8 + 5] = 1.0f;
    x[0] = bad[b]; /* the first element of the first row too */
    ck_assert_int_eq(ql_quantize_rows_e4m3(x, 1, 8, xq, sx), QL_ENONFINITE);
    x[0] = 0.0f;
  }
  ck_assert_int_eq(ql_quantize_rows_e4m3(NULL, 2, 8, xq, sx), QL_EINVAL);
  ck_assert_int_eq(ql_quantize_rows_e4m3(x, 2, 8, NULL, sx), QL_EINVAL);
  ck_assert_int_eq(ql_quantize_rows_e4m3(x, 2, 8, xq, NULL), QL_EINVAL);
  ck_assert_int_eq(ql_quantize_rows_e4m3(x, 0, 8, xq, sx), QL_ESHAPE);
  ck_assert_int_eq(ql_quantize_rows_e4m3(x, 2, 0, xq, sx), QL_ESHAPE);
  ck_assert_int_eq(ql_quantize_rows_e4m3(x, -1, 8, xq, sx), QL_ESHAPE);
  ck_assert_int_eq(ql_quantize_rows_e4m3(x, 2, QL_DIM_MAX + 1, xq, sx),
                   QL_ESHAPE);
  ck_assert_int_eq(ql_quantize_rows_e4m3(x, 2, 8, xq, sx), 0);
  ck_assert_uint_eq(xq[8 + 5], 0x7E);
}
END_TEST

/* The generic QL_OP_QUANTIZE_ROWS dispatches on kind to the two
 * reference quantizers, and refuses what it cannot do. */
START_TEST(test_qrows_generic_op) {
  enum { M = 3, K = 50 };
  const ql_kernel_impl *im = ql_generic_impl(QL_OP_QUANTIZE_ROWS);
  float x[M * K], sx[M], sx2[M];
  int8_t xq[M * K], xq2[M * K];
  uint8_t xc[M * K], xc2[M * K];
  int32_t gsum[M * 2], gsum2[M * 2];
  ql_qrows_args a;
  uint64_t rng = 9;
  int i;

  for (i = 0; i < M * K; i++)
    x[i] = (float)tu_rng_gauss(&rng);
  memset(&a, 0, sizeof a);
  a.kind = QL_QROWS_I8;
  a.x = x;
  a.m = M;
  a.k = K;
  a.gs = 32;
  a.xq = xq;
  a.sx = sx;
  a.gsum = gsum;
  ck_assert_int_eq(im->fn.quantize_rows(&a), 0);
  ck_assert_int_eq(ql_quantize_rows_i8(x, M, K, 32, xq2, sx2, gsum2), 0);
  ck_assert(memcmp(xq, xq2, sizeof xq) == 0 &&
            memcmp(sx, sx2, sizeof sx) == 0 &&
            memcmp(gsum, gsum2, sizeof gsum) == 0);

  a.kind = QL_QROWS_E4M3;
  a.xq = xc;
  ck_assert_int_eq(im->fn.quantize_rows(&a), QL_EINVAL); /* gsum given */
  a.gsum = NULL;
  ck_assert_int_eq(im->fn.quantize_rows(&a), 0);
  ck_assert_int_eq(ql_quantize_rows_e4m3(x, M, K, xc2, sx2), 0);
  ck_assert(memcmp(xc, xc2, sizeof xc) == 0 && memcmp(sx, sx2, sizeof sx) == 0);
  a.kind = 0;
  ck_assert_int_eq(im->fn.quantize_rows(&a), QL_EINVAL);
  a.kind = 3;
  ck_assert_int_eq(im->fn.quantize_rows(&a), QL_EINVAL);
}
END_TEST

/* ------------------------------------------- quantize_rows in 16 bits */

/*
 * The rule of ql_kernels.h written independently: double arithmetic, each
 * f32 step one double operation rounded to float (for these operands the
 * correctly rounded f32 result: an f32 product is exact in double, and a
 * quotient of two f32 values rounded to double and then to float is
 * correctly rounded), and rounding to bf16/f16 by hand.
 */

/* v rounded to nearest even with a p-bit significand and exponent floor
 * emin (below 2^emin the step stays 2^(emin-p+1): subnormals). The tests
 * stay far from overflow. */
static double round_p(double v, int p, int emin) {
  int e, lsb;
  if (v == 0.0)
    return v;
  frexp(v, &e); /* |v| in [2^(e-1), 2^e) */
  lsb = e - p;
  if (lsb < emin - (p - 1))
    lsb = emin - (p - 1);
  return ldexp(tu_rne(ldexp(v, -lsb)), lsb);
}

/* rnd_src: to bf16 (8 bits, emin -126), f16 (11 bits, emin -14) or f32
 * (the identity). */
static double rnd16(ql_dtype src, double v) {
  if (src == QL_DTYPE_BF16)
    return round_p(v, 8, -126);
  if (src == QL_DTYPE_F16)
    return round_p(v, 11, -14);
  return v;
}

static double row_amax_ref(const float *x, int64_t k) {
  double a = 0.0;
  for (int64_t i = 0; i < k; i++)
    a = fabs((double)x[i]) > a ? fabs((double)x[i]) : a;
  return a;
}

/* The int8 rule for one row: returns sx, writes q. */
static float i8_row_ref(ql_dtype src, const float *x, int64_t k, int8_t *q) {
  double s = (float)(row_amax_ref(x, k) / 127.5), inv;
  s = rnd16(src, s);
  if (s < 0x1p-23)
    s = 0x1p-23;
  inv = (float)(1.0 / s);
  for (int64_t i = 0; i < k; i++) {
    double t = tu_rne((double)(float)((double)x[i] * inv));
    q[i] = (int8_t)(t < -128 ? -128 : t > 127 ? 127 : t);
  }
  return (float)s;
}

/* The e4m3 rule for one row: returns sx, writes the codes. */
static float e4m3_row_ref(ql_dtype src, const float *x, int64_t k,
                          uint8_t *q) {
  double a = row_amax_ref(x, k), s;
  s = (float)((a > (double)1e-12f ? a : (double)1e-12f) / 448.0);
  s = rnd16(src, s);
  if (src == QL_DTYPE_F16 && s < 0x1p-24)
    s = 0x1p-24;
  for (int64_t i = 0; i < k; i++) {
    double t = (double)(float)((double)x[i] / s);
    q[i] = tu_e4m3_nearest(t < -448.0 ? -448.0 : t > 448.0 ? 448.0 : t);
  }
  return (float)s;
}

enum { SRC_M = 48, SRC_K = 64 };

/*
 * Activation rows holding src values (rounded by rnd16): Gaussian at
 * several magnitudes, int8 ties at scale 2^-4, e4m3 ties at scale 1, all
 * zero, constant, tiny (f16 subnormals: the int8 eps and the f16 e4m3
 * floor), below 1e-12 (bf16), and rows chosen so that the 16-bit scale
 * changes a code (see the test); then random magnitudes 2^-20 .. 2^8.
 */
static void src_rows(ql_dtype src, uint64_t *rng, float *x) {
  static const float f8t[] = {448.0f, 17.0f, -19.0f, 9.5f,  -8.5f, 4.25f,
                              0x3p-10f, -0x1p-10f, 0.1875f, 26.0f, -30.0f,
                              232.0f};
  for (int r = 0; r < SRC_M; r++) {
    double mag = ldexp(1.0, (int)(tu_rng_uniform(rng) * 28.0) - 20);
    for (int i = 0; i < SRC_K; i++) {
      double g = tu_rng_gauss(rng), v;
      switch (r) {
      case 0:
        v = g;
        break;
      case 1:
        v = 1e3 * g;
        break;
      case 2:
        v = 1e-3 * g;
        break;
      case 3: /* f16 subnormals: amax / 127.5 < 2^-23, amax / 448 < 2^-25 */
        v = 2e-6 * g;
        break;
      case 4:
        v = 0.0;
        break;
      case 5: /* the golden vectors' constant row */
        v = -0.7;
        break;
      case 6: /* scale 2^-4 in every dtype: x·16 = j + 0.5 exactly */
        v = i == 0 ? -127.5 * 0.0625
                   : ((double)((i * 37) % 255) - 127.0 + 0.5) * 0.0625;
        break;
      case 7: /* scale 1: e4m3 ties */
        v = i < 12 ? (double)f8t[i] : 100.0 * g;
        break;
      case 8: /* bf16: amax below the 1e-12 floor */
        v = 1e-14 * g;
        break;
      case 9: /* bf16 scale 1.0078125·2^-7 instead of 2^-7/1.0039...:
               * 0.9921875 gives 126, not 127 */
        v = i == 0 ? 1.0 : i == 1 ? 0.9921875 : 0.15 * g;
        break;
      case 10: /* bf16 e4m3: 0.8203125 / scale = 368.2, not 367.5: 384 (0x7C),
               * not 352 */
        v = i == 0 ? 1.0 : i == 1 ? 0.8203125 : 0.15 * g;
        break;
      case 11: /* f16 e4m3: scale 5·2^-24 for amax 2^-13: 409.6 -> 416 */
        v = i == 0 ? 0x1p-13 : 0x1p-16 * g;
        break;
      default:
        v = mag * g;
      }
      x[r * SRC_K + i] = (float)rnd16(src, v);
    }
  }
}

/*
 * ql_quantize_rows_i8_src / _e4m3_src with src bf16 and f16, bit for bit
 * against the rule written independently above, and with src f32 byte
 * for byte the plain functions. The data must exercise what the rule is
 * about: scales that differ from the f32 rule's, and codes that differ
 * because of it.
 */
START_TEST(test_qrows_src_vs_rule) {
  static const ql_dtype srcs[] = {QL_DTYPE_BF16, QL_DTYPE_F16};
  static const uint32_t gss[] = {1, 7, 64, 1000};
  float *x = tu_xmalloc(SRC_M * SRC_K * sizeof(float)), sx[SRC_M],
        sx2[SRC_M], want_s;
  int8_t *xq = tu_xmalloc(SRC_M * SRC_K), *xq2 = tu_xmalloc(SRC_M * SRC_K),
         wq[SRC_K], wq32[SRC_K];
  uint8_t *xc = tu_xmalloc(SRC_M * SRC_K), *xc2 = tu_xmalloc(SRC_M * SRC_K),
          wc[SRC_K], wc32[SRC_K];
  int32_t *gsum = tu_xmalloc(SRC_M * SRC_K * sizeof(int32_t));
  int32_t *gsum2 = tu_xmalloc(SRC_M * SRC_K * sizeof(int32_t));
  uint64_t rng = 31;

  for (size_t d = 0; d < 2; d++) {
    ql_dtype src = srcs[d];
    int ds_i8 = 0, dq_i8 = 0, ds_f8 = 0, dq_f8 = 0;

    src_rows(src, &rng, x);
    for (size_t gi = 0; gi < 4; gi++) {
      uint32_t gs = gss[gi];
      int ng = (int)((SRC_K + gs - 1) / gs);
      ck_assert_int_eq(
          ql_quantize_rows_i8_src(src, x, SRC_M, SRC_K, gs, xq, sx, gsum), 0);
      for (int r = 0; r < SRC_M; r++) {
        const float *xr = x + r * SRC_K;
        want_s = i8_row_ref(src, xr, SRC_K, wq);
        REQUIRE(tu_f32_bits(sx[r]) == tu_f32_bits(want_s),
                "%s i8 sx[%d] = %a, want %a", tu_dtype_name(src), r,
                (double)sx[r], (double)want_s);
        for (int i = 0; i < SRC_K; i++)
          REQUIRE(xq[r * SRC_K + i] == wq[i],
                  "%s i8 xq[%d,%d] = %d, want %d (x %a, sx %a)",
                  tu_dtype_name(src), r, i, xq[r * SRC_K + i], wq[i],
                  (double)xr[i], (double)sx[r]);
        for (int g = 0; g < ng; g++) {
          int32_t sum = 0;
          for (int i = g * (int)gs; i < SRC_K && i < (g + 1) * (int)gs; i++)
            sum += wq[i];
          REQUIRE(gsum[r * ng + g] == sum, "%s gs %u gsum[%d,%d]",
                  tu_dtype_name(src), gs, r, g);
        }
        if (gi == 0) { /* what the 16-bit scale changed */
          float s32 = i8_row_ref(QL_DTYPE_F32, xr, SRC_K, wq32);
          ds_i8 += tu_f32_bits(s32) != tu_f32_bits(want_s);
          for (int i = 0; i < SRC_K; i++)
            dq_i8 += wq32[i] != wq[i];
        }
      }
    }
    ck_assert_int_eq(ql_quantize_rows_e4m3_src(src, x, SRC_M, SRC_K, xc, sx),
                     0);
    for (int r = 0; r < SRC_M; r++) {
      const float *xr = x + r * SRC_K;
      float s32 = e4m3_row_ref(QL_DTYPE_F32, xr, SRC_K, wc32);
      want_s = e4m3_row_ref(src, xr, SRC_K, wc);
      REQUIRE(tu_f32_bits(sx[r]) == tu_f32_bits(want_s),
              "%s e4m3 sx[%d] = %a, want %a", tu_dtype_name(src), r,
              (double)sx[r], (double)want_s);
      REQUIRE(sx[r] > 0.0f && isnormal(sx[r]), "sx[%d] = %a", r,
              (double)sx[r]);
      for (int i = 0; i < SRC_K; i++)
        REQUIRE(xc[r * SRC_K + i] == wc[i],
                "%s e4m3 xq[%d,%d] = %02x, want %02x (x %a, sx %a)",
                tu_dtype_name(src), r, i, xc[r * SRC_K + i], wc[i],
                (double)xr[i], (double)sx[r]);
      ds_f8 += tu_f32_bits(s32) != tu_f32_bits(want_s);
      for (int i = 0; i < SRC_K; i++)
        dq_f8 += wc32[i] != wc[i];
    }
    /* the data reach what the 16-bit rule changes */
    REQUIRE(ds_i8 > SRC_M / 2 && dq_i8 > 0 && ds_f8 > SRC_M / 2 && dq_f8 > 0,
            "%s: scales changed i8 %d, e4m3 %d; codes changed i8 %d, e4m3 %d",
            tu_dtype_name(src), ds_i8, ds_f8, dq_i8, dq_f8);

    /* the rows written for one case each */
    if (src == QL_DTYPE_BF16) {
      ck_assert_int_eq(
          ql_quantize_rows_i8_src(src, x, SRC_M, SRC_K, 64, xq, sx2, NULL), 0);
      ck_assert(sx2[9] == 0x1.02p-7f && xq[9 * SRC_K + 1] == 126);
      ck_assert(sx2[6] == 0.0625f && xq[6 * SRC_K] == -128);
      ck_assert(sx[10] == 0x1.24p-9f && xc[10 * SRC_K + 1] == 0x7C);
      ck_assert(sx[4] == 0x1.42p-49f); /* bf16(1e-12 / 448), TorchAO's too */
      ck_assert(sx[8] == sx[4]);
    } else {
      ck_assert_int_eq(
          ql_quantize_rows_i8_src(src, x, SRC_M, SRC_K, 64, xq, sx2, NULL), 0);
      /* -0.7 is 0x1.668p-1 in f16: -127, not the f32 rule's -128 */
      ck_assert(sx2[5] == 0x1.68p-8f && xq[5 * SRC_K] == -127);
      ck_assert(sx2[3] == 0x1p-23f && sx2[4] == 0x1p-23f);
      ck_assert(sx[11] == 0x1.4p-22f && xc[11 * SRC_K] == 0x7D);
      /* the floor: an all-zero row and a row of f16 subnormals */
      ck_assert(sx[4] == 0x1p-24f && sx[3] == 0x1p-24f);
      for (int i = 0; i < SRC_K; i++)
        REQUIRE(xc[4 * SRC_K + i] == 0, "zero row code %02x",
                xc[4 * SRC_K + i]);
    }

    /* src f32: the plain functions, byte for byte */
    ck_assert_int_eq(ql_quantize_rows_i8_src(QL_DTYPE_F32, x, SRC_M, SRC_K,
                                             7, xq, sx, gsum),
                     0);
    ck_assert_int_eq(ql_quantize_rows_i8(x, SRC_M, SRC_K, 7, xq2, sx2, gsum2),
                     0);
    ck_assert(memcmp(xq, xq2, SRC_M * SRC_K) == 0 &&
              memcmp(sx, sx2, sizeof sx) == 0 &&
              memcmp(gsum, gsum2, SRC_M * 10 * sizeof(int32_t)) == 0);
    ck_assert_int_eq(
        ql_quantize_rows_e4m3_src(QL_DTYPE_F32, x, SRC_M, SRC_K, xc, sx), 0);
    ck_assert_int_eq(ql_quantize_rows_e4m3(x, SRC_M, SRC_K, xc2, sx2), 0);
    ck_assert(memcmp(xc, xc2, SRC_M * SRC_K) == 0 &&
              memcmp(sx, sx2, sizeof sx) == 0);
  }
  free(x);
  free(xq);
  free(xq2);
  free(xc);
  free(xc2);
  free(gsum);
  free(gsum2);
}
END_TEST

/* src f32 on f32 data (not representable in 16 bits): the plain functions
 * byte for byte, and the rule in f32. */
START_TEST(test_qrows_src_f32_same) {
  enum { M = 8, K = 150 };
  float *x = tu_xmalloc(M * K * sizeof(float)), sx[M], sx2[M];
  int8_t *xq = tu_xmalloc(M * K), *xq2 = tu_xmalloc(M * K), wq[K];
  uint8_t *xc = tu_xmalloc(M * K), *xc2 = tu_xmalloc(M * K), wc[K];
  int32_t gsum[M * 5], gsum2[M * 5];
  uint64_t rng = 41;

  for (int r = 0; r < M; r++)
    for (int i = 0; i < K; i++)
      x[r * K + i] = r == 4   ? 0.0f
                     : r == 5 ? -0.7f
                              : (float)(ldexp(1.0, 6 * r - 24) *
                                        tu_rng_gauss(&rng));
  ck_assert_int_eq(
      ql_quantize_rows_i8_src(QL_DTYPE_F32, x, M, K, 32, xq, sx, gsum), 0);
  ck_assert_int_eq(ql_quantize_rows_i8(x, M, K, 32, xq2, sx2, gsum2), 0);
  ck_assert(memcmp(xq, xq2, M * K) == 0 && memcmp(sx, sx2, sizeof sx) == 0 &&
            memcmp(gsum, gsum2, sizeof gsum) == 0);
  for (int r = 0; r < M; r++) {
    float s = i8_row_ref(QL_DTYPE_F32, x + r * K, K, wq);
    ck_assert(tu_f32_bits(s) == tu_f32_bits(sx[r]) &&
              memcmp(wq, xq + r * K, K) == 0);
  }
  ck_assert_int_eq(
      ql_quantize_rows_e4m3_src(QL_DTYPE_F32, x, M, K, xc, sx), 0);
  ck_assert_int_eq(ql_quantize_rows_e4m3(x, M, K, xc2, sx2), 0);
  ck_assert(memcmp(xc, xc2, M * K) == 0 && memcmp(sx, sx2, sizeof sx) == 0);
  for (int r = 0; r < M; r++) {
    float s = e4m3_row_ref(QL_DTYPE_F32, x + r * K, K, wc);
    ck_assert(tu_f32_bits(s) == tu_f32_bits(sx[r]) &&
              memcmp(wc, xc + r * K, K) == 0);
  }
  free(x);
  free(xq);
  free(xq2);
  free(xc);
  free(xc2);
}
END_TEST

START_TEST(test_qrows_src_errors) {
  float x[2 * 4] = {1.0f, -0.5f, 0.25f, 2.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  int8_t xq[8];
  uint8_t xc[8];
  float sx[2];
  static const struct {
    ql_dtype src;
    float v;
  } unrepresentable[] = {
      {QL_DTYPE_BF16, 1.0f + 0x1p-10f}, {QL_DTYPE_BF16, 0x1.0001p-130f},
      {QL_DTYPE_F16, 1.0f + 0x1p-12f},  {QL_DTYPE_F16, 1e-9f},
      {QL_DTYPE_F16, 70000.0f},         {QL_DTYPE_F16, 0x1.8p-25f},
  };

  for (int bad = 0; bad <= 7; bad += 4) { /* 0 and 4 are not ql_dtypes */
    ck_assert_int_eq(
        ql_quantize_rows_i8_src((ql_dtype)bad, x, 2, 4, 4, xq, sx, NULL),
        QL_EDTYPE);
    ck_assert_int_eq(
        ql_quantize_rows_e4m3_src((ql_dtype)bad, x, 2, 4, xc, sx), QL_EDTYPE);
  }
  ck_assert_int_eq(
      ql_quantize_rows_i8_src(QL_DTYPE_BF16, NULL, 2, 4, 4, xq, sx, NULL),
      QL_EINVAL);
  ck_assert_int_eq(
      ql_quantize_rows_i8_src(QL_DTYPE_BF16, x, 2, 4, 0, xq, sx, NULL),
      QL_EINVAL);
  ck_assert_int_eq(
      ql_quantize_rows_e4m3_src(QL_DTYPE_F16, x, 2, 4, xc, NULL), QL_EINVAL);
  ck_assert_int_eq(
      ql_quantize_rows_i8_src(QL_DTYPE_F16, x, 0, 4, 4, xq, sx, NULL),
      QL_ESHAPE);
  ck_assert_int_eq(ql_quantize_rows_e4m3_src(QL_DTYPE_F16, x, 2, -1, xc, sx),
                   QL_ESHAPE);
  /* a value src cannot hold: x must be src data, widened */
  for (size_t i = 0; i < sizeof unrepresentable / sizeof unrepresentable[0];
       i++) {
    ql_dtype src = unrepresentable[i].src;
    x[6] = unrepresentable[i].v;
    ck_assert_int_eq(ql_quantize_rows_i8_src(src, x, 2, 4, 4, xq, sx, NULL),
                     QL_EINVAL);
    ck_assert_int_eq(ql_quantize_rows_e4m3_src(src, x, 2, 4, xc, sx),
                     QL_EINVAL);
    /* the same value is fine in f32, and the first row alone in src */
    ck_assert_int_eq(
        ql_quantize_rows_i8_src(QL_DTYPE_F32, x, 2, 4, 4, xq, sx, NULL), 0);
    ck_assert_int_eq(ql_quantize_rows_e4m3_src(src, x, 1, 4, xc, sx), 0);
  }
  x[6] = NAN;
  ck_assert_int_eq(
      ql_quantize_rows_i8_src(QL_DTYPE_BF16, x, 2, 4, 4, xq, sx, NULL),
      QL_ENONFINITE);
  ck_assert_int_eq(ql_quantize_rows_e4m3_src(QL_DTYPE_F16, x, 2, 4, xc, sx),
                   QL_ENONFINITE);
}
END_TEST

/* The generic QL_OP_QUANTIZE_ROWS with ql_qrows_args.src: 0 is f32, and a
 * 16-bit src gives the _src function's bytes. */
START_TEST(test_qrows_generic_op_src) {
  enum { M = 3, K = 50 };
  const ql_kernel_impl *im = ql_generic_impl(QL_OP_QUANTIZE_ROWS);
  float x[M * K], sx[M], sx2[M];
  int8_t xq[M * K], xq2[M * K];
  uint8_t xc[M * K], xc2[M * K];
  int32_t gsum[M * 2], gsum2[M * 2];
  static const ql_dtype srcs[] = {QL_DTYPE_F32, QL_DTYPE_F16, QL_DTYPE_BF16};
  ql_qrows_args a;
  uint64_t rng = 19;

  for (int i = 0; i < M * K; i++)
    x[i] = (float)rnd16(QL_DTYPE_BF16, tu_rng_gauss(&rng) * 0.3);
  for (size_t d = 0; d < 4; d++) {
    ql_dtype want = d == 0 ? QL_DTYPE_F32 : srcs[d - 1];
    memset(&a, 0, sizeof a);
    a.kind = QL_QROWS_I8;
    a.x = x;
    a.m = M;
    a.k = K;
    a.gs = 32;
    a.xq = xq;
    a.sx = sx;
    a.gsum = gsum;
    a.src = d == 0 ? (ql_dtype)0 : srcs[d - 1];
    if (want == QL_DTYPE_F16) /* bf16 data with 8 bits fits f16 here */
      for (int i = 0; i < M * K; i++)
        ck_assert(rnd16(QL_DTYPE_F16, x[i]) == x[i]);
    ck_assert_int_eq(im->fn.quantize_rows(&a), 0);
    ck_assert_int_eq(
        ql_quantize_rows_i8_src(want, x, M, K, 32, xq2, sx2, gsum2), 0);
    ck_assert(memcmp(xq, xq2, sizeof xq) == 0 &&
              memcmp(sx, sx2, sizeof sx) == 0 &&
              memcmp(gsum, gsum2, sizeof gsum) == 0);
    a.kind = QL_QROWS_E4M3;
    a.xq = xc;
    a.gsum = NULL;
    ck_assert_int_eq(im->fn.quantize_rows(&a), 0);
    ck_assert_int_eq(ql_quantize_rows_e4m3_src(want, x, M, K, xc2, sx2), 0);
    ck_assert(memcmp(xc, xc2, sizeof xc) == 0 &&
              memcmp(sx, sx2, sizeof sx) == 0);
    if (want == QL_DTYPE_BF16) /* and not the f32 rule's scales */
      ck_assert(ql_quantize_rows_e4m3(x, M, K, xc2, sx2) == 0 &&
                memcmp(sx, sx2, sizeof sx) != 0);
  }
  a.src = (ql_dtype)9;
  ck_assert_int_eq(im->fn.quantize_rows(&a), QL_EDTYPE);
}
END_TEST

/* ------------------------------------------------------ naive evaluations */

/* WO by the documented order: acc = 0; acc += x·ŵ in increasing k; + b. */
static void wo_naive(const ql_qweight *q, const float *x, int64_t m,
                     float *y) {
  int64_t n = q->n, k = q->k, r, j, i;
  float *dq = tu_xmalloc((size_t)(n * k) * sizeof(float));

  ck_assert_int_eq(ql_qweight_dequantize(q, dq), 0);
  for (r = 0; r < m; r++)
    for (j = 0; j < n; j++) {
      float acc = 0.0f;
      if (q->format == QL_FORMAT_Q4G) {
        /* the zero factored out of each group (ql_kernels.h) */
        for (int64_t g = 0; g < q->groups; g++) {
          int64_t k0 = g * q->group_size, k1 = k0 + q->group_size;
          float s = ql_load_f32(q->scale_dtype, q->scale, (size_t)(g * n + j));
          float z = ql_load_f32(q->scale_dtype, q->zero, (size_t)(g * n + j));
          float a = 0.0f, xs = 0.0f;
          for (i = k0; i < k1 && i < k; i++) {
            a = fmaf(x[r * k + i], (float)wq_at(q, j, i), a);
            xs = add32(xs, x[r * k + i]);
          }
          acc = add32(acc, fmaf(z, xs, mul32(s, a)));
        }
      } else if (q->format == QL_FORMAT_Q8C) {
        /* the scale factored out of the row */
        for (i = 0; i < k; i++)
          acc = fmaf(x[r * k + i], (float)wq_at(q, j, i), acc);
        acc = mul32(ql_load_f32(q->scale_dtype, q->scale, (size_t)j), acc);
      } else {
        for (i = 0; i < k; i++)
          acc = add32(acc, mul32(x[r * k + i], dq[j * k + i]));
      }
      if (q->bias)
        acc = add32(acc, q->bias[j]);
      y[r * n + j] = acc;
    }
  free(dq);
}

/* fp64 WO and its error bound: |y - y64| <= (K+2)·2^-24·(Σ|x·ŵ| + |b|);
 * for q4g, whose sums run over x·q and Σx per group, (K+G+3)·2^-24·
 * (Σ|x|·(|q·s| + |z|) + |b|). */
static void wo_check64(const ql_qweight *q, const float *x, int64_t m,
                       const float *y) {
  int64_t n = q->n, k = q->k, r, j, i;
  float *dq = tu_xmalloc((size_t)(n * k) * sizeof(float));

  ck_assert_int_eq(ql_qweight_dequantize(q, dq), 0);
  for (r = 0; r < m; r++)
    for (j = 0; j < n; j++) {
      double e = 0.0, a = 0.0, bound;
      int q4 = q->format == QL_FORMAT_Q4G;
      for (i = 0; i < k; i++) {
        double p = (double)x[r * k + i] * dq[j * k + i];
        e += p;
        if (q4) {
          size_t si = (size_t)(i / q->group_size * n + j);
          a += fabs((double)x[r * k + i]) *
               (fabs((double)wq_at(q, j, i) *
                     ql_load_f32(q->scale_dtype, q->scale, si)) +
                fabs((double)ql_load_f32(q->scale_dtype, q->zero, si)));
        } else {
          a += fabs(p);
        }
      }
      if (q->bias) {
        e += q->bias[j];
        a += fabs(q->bias[j]);
      }
      /* q8c: the scale once more, and ŵ = fl(q·s) is not the q·s summed */
      bound = (double)(k + 2 + (q4 ? q->groups + 1 : 0) +
                       (q->format == QL_FORMAT_Q8C ? 2 : 0)) *
                  0x1p-24 * a * 1.01 +
              1e-37;
      REQUIRE(fabs(y[r * n + j] - e) <= bound,
              "WO y[%lld,%lld] = %.9g, fp64 %.17g, bound %g (K %lld)",
              (long long)r, (long long)j, (double)y[r * n + j], e, bound,
              (long long)k);
    }
  free(dq);
}

/* Quantized activations for the AQ checks (the same call the op makes). */
typedef struct qx {
  int8_t *xq;  /* int8 formats */
  uint8_t *xc; /* f8r: e4m3 codes */
  float *sx;
  int32_t *gsum;
  int64_t ng;
} qx;

/* x holds activations of dtype src widened to f32. */
static void qx_make_src(const ql_qweight *q, ql_dtype src, const float *x,
                        int64_t m, qx *o) {
  int64_t k = q->k;
  uint32_t gs = q->format == QL_FORMAT_Q4G ? q->group_size : (uint32_t)k;
  o->ng = q->format == QL_FORMAT_Q4G ? q->groups : 1;
  o->xq = tu_xmalloc((size_t)(m * k));
  o->xc = tu_xmalloc((size_t)(m * k));
  o->sx = tu_xmalloc((size_t)m * sizeof(float));
  o->gsum = tu_xmalloc((size_t)(m * o->ng) * sizeof(int32_t));
  if (q->format == QL_FORMAT_F8R)
    ck_assert_int_eq(ql_quantize_rows_e4m3_src(src, x, m, k, o->xc, o->sx),
                     0);
  else
    ck_assert_int_eq(
        ql_quantize_rows_i8_src(src, x, m, k, gs, o->xq, o->sx, o->gsum), 0);
}

static void qx_make(const ql_qweight *q, const float *x, int64_t m, qx *o) {
  qx_make_src(q, QL_DTYPE_F32, x, m, o);
}

static void qx_free(qx *o) {
  free(o->xq);
  free(o->xc);
  free(o->sx);
  free(o->gsum);
}

/*
 * AQ by the documented formula and order, and its fp64 evaluation with a
 * bound: q8c 4·2^-24·(|Y| + |b|); q4g (2G+4)·2^-24·(|sx|·Σ|terms| + |b|);
 * f8r (K+3)·2^-24·(|sx·sw|·Σ|products| + |b|): K-1 roundings in the f32
 * sum, one in sx·sw, one in the product, one in + b. dt is the dtype of
 * the activations (x holds them widened) and of y: the rows are quantized
 * with src = dt, and a bf16/f16 y must be the formula's f32 value rounded
 * once (the fp64 bound is then checked through the f32 calls).
 */
static void aq_check_dt(const ql_qweight *q, ql_dtype dt, const float *x,
                        int64_t m, const void *y_out) {
  int64_t n = q->n, k = q->k, r, j, i, g;
  const double u = 0x1p-24;
  const float *y = y_out;
  qx o;

  qx_make_src(q, dt, x, m, &o);
  for (r = 0; r < m; r++)
    for (j = 0; j < n; j++) {
      const int8_t *xr = o.xq + r * k;
      double e, a, bound, b = q->bias ? q->bias[j] : 0.0;
      float v;

      if (q->format == QL_FORMAT_F8R) {
        const uint8_t *xc = o.xc + r * k;
        float sw = ql_load_f32(q->scale_dtype, q->scale, (size_t)j);
        float acc = 0.0f;
        double sum = 0.0;
        a = 0.0;
        for (i = 0; i < k; i++) {
          double p = tu_e4m3_value(xc[i]) * tu_e4m3_value((uint32_t)wq_at(q, j, i));
          REQUIRE((double)(float)p == p, "e4m3 product %a not exact in f32", p);
          acc = add32(acc, (float)p);
          sum += p;
          a += fabs(p);
        }
        v = mul32(acc, mul32(o.sx[r], sw));
        e = sum * o.sx[r] * sw;
        bound = (double)(k + 3) * u *
                    (fabs((double)o.sx[r] * sw) * a + fabs(b)) * 1.01 +
                1e-37;
      } else if (q->format == QL_FORMAT_Q8C) {
        float sw = ql_load_f32(q->scale_dtype, q->scale, (size_t)j);
        int64_t acc = 0;
        for (i = 0; i < k; i++)
          acc += xr[i] * wq_at(q, j, i);
        REQUIRE(acc >= INT32_MIN && acc <= INT32_MAX, "acc overflow");
        v = mul32((float)acc, mul32(o.sx[r], sw));
        e = (double)acc * o.sx[r] * sw;
        a = fabs(e);
        bound = 4.0 * u * (a + fabs(b)) * 1.01 + 1e-37;
      } else {
        float acc = 0.0f;
        double sum = 0.0;
        a = 0.0;
        for (g = 0; g < q->groups; g++) {
          float s = ql_load_f32(q->scale_dtype, q->scale, (size_t)(g * n + j));
          float z = ql_load_f32(q->scale_dtype, q->zero, (size_t)(g * n + j));
          int32_t dot = 0, xs = o.gsum[r * o.ng + g];
          int64_t k1 = (g + 1) * q->group_size < k ? (g + 1) * q->group_size : k;
          for (i = g * q->group_size; i < k1; i++)
            dot += xr[i] * wq_at(q, j, i);
          acc = add32(acc, mul32(s, (float)dot));
          acc = add32(acc, mul32(z, (float)xs));
          sum += (double)s * dot + (double)z * xs;
          a += fabs((double)s * dot) + fabs((double)z * xs);
        }
        v = mul32(o.sx[r], acc);
        e = (double)o.sx[r] * sum;
        bound = (double)(2 * q->groups + 4) * u *
                    (fabs((double)o.sx[r]) * a + fabs(b)) * 1.01 +
                1e-37;
      }
      if (q->bias)
        v = add32(v, q->bias[j]);
      e += b;
      if (dt != QL_DTYPE_F32) {
        uint16_t want, got;
        ql_from_f32(dt, &v, &want, 1);
        memcpy(&got, (const unsigned char *)y_out + 2 * (size_t)(r * n + j),
               2);
        REQUIRE(got == want, "AQ %s y[%lld,%lld] = %04x, formula gives %04x",
                tu_dtype_name(dt), (long long)r, (long long)j, got, want);
        continue;
      }
      REQUIRE(tu_f32_bits(y[r * n + j]) == tu_f32_bits(v),
              "AQ y[%lld,%lld] = %a, formula gives %a", (long long)r,
              (long long)j, (double)y[r * n + j], (double)v);
      REQUIRE(fabs(y[r * n + j] - e) <= bound,
              "AQ y[%lld,%lld] = %.9g, fp64 %.17g, bound %g", (long long)r,
              (long long)j, (double)y[r * n + j], e, bound);
    }
  qx_free(&o);
}

static void aq_check(const ql_qweight *q, const float *x, int64_t m,
                     const float *y) {
  aq_check_dt(q, QL_DTYPE_F32, x, m, y);
}

/* -------------------------------------------------------------- linear ops */

START_TEST(test_wo_aq_vs_formula_and_fp64) {
  static const int64_t ks[] = {1, 7, 33, 100, 257, 1000};
  static const int64_t ns[] = {1, 5};
  static const int64_t ms[] = {1, 3};
  static const ql_dtype sdts[] = {QL_DTYPE_BF16, QL_DTYPE_F16, QL_DTYPE_F32};
  const cfg *c = &cfgs[_i];
  size_t ki, ni, mi, bi, di;
  uint64_t rng = 200 + (uint64_t)_i;

  for (ki = 0; ki < 6; ki++)
    for (ni = 0; ni < 2; ni++)
      for (mi = 0; mi < 2; mi++)
        for (bi = 0; bi < 2; bi++)
          for (di = 0; di < 3; di++) {
            int64_t k = ks[ki], n = ns[ni], m = ms[mi], i;
            ql_qweight *q = make_weight(&rng, c, n, k, (int)bi, sdts[di], NULL);
            float *x = tu_xmalloc((size_t)(m * k) * sizeof(float));
            float *y = tu_xmalloc((size_t)(m * n) * sizeof(float));
            float *yn = tu_xmalloc((size_t)(m * n) * sizeof(float));

            make_x(&rng, x, m, k);
            ck_assert_int_eq(ql_linear_wo_ref(q, QL_DTYPE_F32, x, m, y), 0);
            wo_naive(q, x, m, yn);
            for (i = 0; i < m * n; i++)
              REQUIRE(tu_f32_bits(y[i]) == tu_f32_bits(yn[i]),
                      "WO y[%lld] = %a, formula %a (K %lld N %lld M %lld)",
                      (long long)i, (double)y[i], (double)yn[i], (long long)k,
                      (long long)n, (long long)m);
            wo_check64(q, x, m, y);

            if (has_aq(q)) {
              ck_assert_int_eq(ql_linear_aq_ref(q, QL_DTYPE_F32, x, m, y), 0);
              aq_check(q, x, m, y);
            } else {
              ck_assert_int_eq(ql_linear_aq_ref(q, QL_DTYPE_F32, x, m, y),
                               QL_ENOTSUP);
            }
            free(x);
            free(y);
            free(yn);
            ql_qweight_free(q);
          }
}
END_TEST

/* The bias is added once, after the dot product. */
START_TEST(test_bias) {
  const cfg *c = &cfgs[_i];
  enum { M = 2, N = 4, K = 64 };
  float *w, x[M * K], y0[M * N], y1[M * N];
  ql_qweight *q0, *q1;
  linear_fn ops[2] = {ql_linear_wo_ref, ql_linear_aq_ref};
  int o, i;
  uint64_t rng = 300;

  q1 = make_weight(&rng, c, N, K, 1, QL_DTYPE_BF16, &w);
  q0 = NULL;
  {
    ql_quant_params p = params_of(c, QL_DTYPE_BF16);
    ck_assert_int_eq(ql_qweight_quantize(&p, N, K, QL_DTYPE_F32, w, NULL, &q0),
                     0);
  }
  make_x(&rng, x, M, K);
  for (o = 0; o < 1 + has_aq(q1); o++) {
    ck_assert_int_eq(ops[o](q0, QL_DTYPE_F32, x, M, y0), 0);
    ck_assert_int_eq(ops[o](q1, QL_DTYPE_F32, x, M, y1), 0);
    for (i = 0; i < M * N; i++)
      REQUIRE(tu_f32_bits(y1[i]) == tu_f32_bits(y0[i] + q1->bias[i % N]),
              "op %d y[%d]: %a != %a + %a", o, i, (double)y1[i], (double)y0[i],
              (double)q1->bias[i % N]);
  }
  ql_qweight_free(q0);
  ql_qweight_free(q1);
  free(w);
}
END_TEST

/* f16/bf16 in and out: WO is the f32 computation on the widened input,
 * rounded once to the output dtype; AQ too, except that the rows are
 * quantized with src = that dtype (TorchAO's scales), so it is the AQ
 * formula on those codes and scales, rounded once. */
START_TEST(test_narrow_io) {
  const cfg *c = &cfgs[_i];
  enum { M = 4, N = 5, K = 100 };
  static const ql_dtype dts[2] = {QL_DTYPE_F16, QL_DTYPE_BF16};
  linear_fn ops[2] = {ql_linear_wo_ref, ql_linear_aq_ref};
  float x[M * K], xw[M * K], y32[M * N];
  uint16_t x16[M * K], y16[M * N];
  ql_qweight *q;
  int d, o, i;
  uint64_t rng = 400;

  q = make_weight(&rng, c, N, K, 1, QL_DTYPE_BF16, NULL);
  for (i = 0; i < M * K; i++)
    x[i] = (float)(3.0 * tu_rng_gauss(&rng));
  q->bias[1] = 1e5f; /* y[.,1] overflows f16 to Inf */
  for (d = 0; d < 2; d++) {
    ql_from_f32(dts[d], x, x16, M * K);
    ql_to_f32(dts[d], x16, xw, M * K);
    for (o = 0; o < 1 + has_aq(q); o++) {
      ck_assert_int_eq(ops[o](q, dts[d], x16, M, y16), 0);
      ck_assert_int_eq(ops[o](q, QL_DTYPE_F32, xw, M, y32), 0);
      if (o == 1)
        aq_check_dt(q, dts[d], xw, M, y16);
      for (i = 0; o == 0 && i < M * N; i++) {
        uint16_t want = dts[d] == QL_DTYPE_F16 ? ql_f32_to_f16(y32[i])
                                               : ql_f32_to_bf16(y32[i]);
        REQUIRE(y16[i] == want, "%s op %d y[%d] = %04x, want %04x",
                tu_dtype_name(dts[d]), o, i, y16[i], want);
      }
      if (dts[d] == QL_DTYPE_F16)
        ck_assert_uint_eq(y16[1], 0x7C00);
    }
  }
  ql_qweight_free(q);
}
END_TEST

/* A row's output is the same bytes alone, inside a batch, at any position. */
START_TEST(test_batch_invariance) {
  const cfg *c = &cfgs[_i];
  enum { M = 9, N = 6, K = 300 };
  static const ql_dtype dts[3] = {QL_DTYPE_F32, QL_DTYPE_F16, QL_DTYPE_BF16};
  linear_fn ops[2] = {ql_linear_wo_ref, ql_linear_aq_ref};
  float x[M * K];
  unsigned char xin[M * K * 4], xrev[M * K * 4];
  unsigned char yb[M * N * 4], yr[M * N * 4], y1[N * 4];
  ql_qweight *q;
  int d, o, r, i;
  uint64_t rng = 500;

  q = make_weight(&rng, c, N, K, 1, QL_DTYPE_BF16, NULL);
  make_x(&rng, x, M, K); /* rows 1, 4, 7: ties; 2, 5, 8: zeros */
  for (i = 0; i < K; i++) {
    x[3 * K + i] *= 1e-3f;
    x[6 * K + i] = 0.75f; /* a constant row */
  }
  for (d = 0; d < 3; d++) {
    size_t es = ql_dtype_size(dts[d]), row_in = K * es, row_out = N * es;
    ql_from_f32(dts[d], x, xin, M * K);
    for (r = 0; r < M; r++)
      memcpy(xrev + (size_t)(M - 1 - r) * row_in, xin + (size_t)r * row_in,
             row_in);
    for (o = 0; o < 1 + has_aq(q); o++) {
      ck_assert_int_eq(ops[o](q, dts[d], xin, M, yb), 0);
      ck_assert_int_eq(ops[o](q, dts[d], xrev, M, yr), 0);
      for (r = 0; r < M; r++) {
        ck_assert_int_eq(ops[o](q, dts[d], xin + (size_t)r * row_in, 1, y1),
                         0);
        REQUIRE(memcmp(y1, yb + (size_t)r * row_out, row_out) == 0,
                "%s op %d: row %d alone differs from the batch",
                tu_dtype_name(dts[d]), o, r);
        REQUIRE(memcmp(yr + (size_t)(M - 1 - r) * row_out,
                       yb + (size_t)r * row_out, row_out) == 0,
                "%s op %d: row %d differs at another position",
                tu_dtype_name(dts[d]), o, r);
      }
    }
  }
  ql_qweight_free(q);
}
END_TEST

/* The int32 accumulator of q8c AQ at its largest K, with every product at
 * its maximum (-128)·(-128); one more K is refused. */
START_TEST(test_aq_q8c_max_k) {
  const int64_t k = QL_AQ_Q8C_MAX_K;
  float *x = tu_xmalloc((size_t)(k + 1) * sizeof(float)), y = 0.0f;
  ql_quant_params p = {QL_FORMAT_Q8C, 0, 0, QL_DTYPE_F32};
  ql_qweight *q = NULL;
  int64_t i;

  for (i = 0; i <= k; i++)
    x[i] = -127.5f; /* scale exactly 1, every q = tu_rne(-127.5) = -128 */
  ck_assert_int_eq(ql_qweight_quantize(&p, 1, k, QL_DTYPE_F32, x, NULL, &q), 0);
  ck_assert_int_eq(wq_at(q, 0, k - 1), -128);
  ck_assert_int_eq(ql_linear_aq_ref(q, QL_DTYPE_F32, x, 1, &y), 0);
  ck_assert(y == (float)(k * 16384)); /* 2147467264, exact in f32 */
  ql_qweight_free(q);

  q = NULL;
  ck_assert_int_eq(ql_qweight_quantize(&p, 1, k + 1, QL_DTYPE_F32, x, NULL, &q),
                   0);
  ck_assert_int_eq(ql_linear_aq_ref(q, QL_DTYPE_F32, x, 1, &y), QL_ESHAPE);
  /* WO has no such limit: Σ (-127.5)·(-128·1) */
  ck_assert_int_eq(ql_linear_wo_ref(q, QL_DTYPE_F32, x, 1, &y), 0);
  ck_assert(fabs(y - (double)(k + 1) * 127.5 * 128.0) <=
            (double)(k + 3) * 0x1p-24 * (double)(k + 1) * 127.5 * 128.0);
  ql_qweight_free(q);
  free(x);
}
END_TEST

/*
 * f8r at a large K: WO and AQ against fp64 with their K-dependent bounds
 * (the f32 sums are where the error grows), and AQ exactly equal to the
 * documented order: Σ in increasing k from 0.0f, then ·(sx·sw).
 */
START_TEST(test_f8r_large_k) {
  const int64_t k = (int64_t)1 << 20;
  float *w = tu_xmalloc((size_t)k * sizeof(float));
  float *x = tu_xmalloc((size_t)k * sizeof(float)), y;
  uint64_t rng = 800;
  ql_quant_params p = {QL_FORMAT_F8R, 0, 0, QL_DTYPE_F32};
  ql_qweight *q = NULL;
  int64_t i;

  for (i = 0; i < k; i++) {
    w[i] = (float)tu_rng_gauss(&rng);
    x[i] = (float)(1.0 + tu_rng_gauss(&rng)); /* a mean, so Σ grows */
  }
  ck_assert_int_eq(ql_qweight_quantize(&p, 1, k, QL_DTYPE_F32, w, NULL, &q), 0);
  ck_assert_int_eq(ql_linear_wo_ref(q, QL_DTYPE_F32, x, 1, &y), 0);
  wo_check64(q, x, 1, &y);
  ck_assert_int_eq(ql_linear_aq_ref(q, QL_DTYPE_F32, x, 1, &y), 0);
  aq_check(q, x, 1, &y);
  ql_qweight_free(q);
  free(w);
  free(x);
}
END_TEST

START_TEST(test_op_errors) {
  const cfg *c = &cfgs[_i];
  enum { M = 2, N = 3, K = 40 };
  linear_fn ops[2] = {ql_linear_wo_ref, ql_linear_aq_ref};
  static const float bad[3] = {NAN, INFINITY, -INFINITY};
  float x[M * K], y[M * N];
  uint16_t x16[M * K];
  ql_qweight *q, broken;
  int o, b, i;
  uint64_t rng = 600;

  q = make_weight(&rng, c, N, K, 1, QL_DTYPE_BF16, NULL);
  make_x(&rng, x, M, K);
  for (o = 0; o < 2; o++) {
    ck_assert_int_eq(ops[o](NULL, QL_DTYPE_F32, x, M, y), QL_EINVAL);
    ck_assert_int_eq(ops[o](q, QL_DTYPE_F32, NULL, M, y), QL_EINVAL);
    ck_assert_int_eq(ops[o](q, QL_DTYPE_F32, x, M, NULL), QL_EINVAL);
    ck_assert_int_eq(ops[o](q, (ql_dtype)0, x, M, y), QL_EDTYPE);
    ck_assert_int_eq(ops[o](q, (ql_dtype)4, x, M, y), QL_EDTYPE);
    ck_assert_int_eq(ops[o](q, QL_DTYPE_F32, x, 0, y), QL_ESHAPE);
    ck_assert_int_eq(ops[o](q, QL_DTYPE_F32, x, -3, y), QL_ESHAPE);
    ck_assert_int_eq(ops[o](q, QL_DTYPE_F32, x, QL_DIM_MAX + 1, y),
                     QL_ESHAPE);
    broken = *q;
    broken.format = (ql_format)5;
    ck_assert_int_eq(ops[o](&broken, QL_DTYPE_F32, x, M, y), QL_EFORMAT);
    broken = *q;
    broken.asymmetric = !q->asymmetric; /* zero[] no longer matches */
    ck_assert_int_eq(ops[o](&broken, QL_DTYPE_F32, x, M, y), QL_EINVAL);
    broken = *q;
    broken.qdata = NULL;
    ck_assert_int_eq(ops[o](&broken, QL_DTYPE_F32, x, M, y), QL_EINVAL);
    broken = *q;
    broken.groups++;
    ck_assert_int_eq(ops[o](&broken, QL_DTYPE_F32, x, M, y), QL_EINVAL);

    if (o == 1 && !has_aq(q)) {
      /* q8b: every valid call is refused, whatever x holds */
      x[K + 7] = NAN;
      ck_assert_int_eq(ops[o](q, QL_DTYPE_F32, x, M, y), QL_ENOTSUP);
      make_x(&rng, x, M, K);
      ck_assert_int_eq(ops[o](q, QL_DTYPE_F32, x, M, y), QL_ENOTSUP);
      continue;
    }
    /* Non-finite activations fail before y is written. */
    for (b = 0; b < 3; b++) {
      float keep = x[K + 7];
      x[K + 7] = bad[b];
      for (i = 0; i < M * N; i++)
        y[i] = 42.0f;
      ck_assert_int_eq(ops[o](q, QL_DTYPE_F32, x, M, y), QL_ENONFINITE);
      for (i = 0; i < M * N; i++)
        ck_assert(y[i] == 42.0f);
      ql_from_f32(QL_DTYPE_BF16, x, x16, M * K);
      ck_assert_int_eq(ops[o](q, QL_DTYPE_BF16, x16, M, y), QL_ENONFINITE);
      x[K + 7] = keep;
    }
    ck_assert_int_eq(ops[o](q, QL_DTYPE_F32, x, M, y), 0);
  }
  ql_qweight_free(q);
}
END_TEST

/*
 * Against the unquantized product the error must look like quantization
 * noise: its mean square within 0.5–1.5× the prediction Σk x²·Δw²/12 (WO)
 * or Σk (x²·Δw² + w²·Δx²)/12 (AQ), so an op that ignores the scales, or
 * does not quantize at all, fails.
 */
START_TEST(test_nmse_vs_unquantized) {
  const cfg *c = &cfgs[_i];
  enum { M = 32, N = 32, K = 512 };
  float *w, *x = tu_xmalloc(M * K * sizeof(float)), *y = tu_xmalloc(M * N * 4);
  double *ye = tu_xmalloc(M * N * sizeof(double));
  ql_qweight *q;
  qx o;
  int r, j, i, op;
  uint64_t rng = 700 + (uint64_t)_i;

  q = make_weight(&rng, c, N, K, 0, QL_DTYPE_BF16, &w);
  for (i = 0; i < M * K; i++)
    x[i] = (float)tu_rng_gauss(&rng);
  for (r = 0; r < M; r++)
    for (j = 0; j < N; j++) {
      double e = 0.0;
      for (i = 0; i < K; i++)
        e += (double)x[r * K + i] * w[j * K + i];
      ye[r * N + j] = e;
    }
  qx_make(q, x, M, &o);
  for (op = 0; op < 1 + has_aq(q); op++) {
    double mse = 0.0, pred = 0.0, ratio;
    ck_assert_int_eq((op ? ql_linear_aq_ref : ql_linear_wo_ref)(
                         q, QL_DTYPE_F32, x, M, y),
                     0);
    for (r = 0; r < M; r++)
      for (j = 0; j < N; j++) {
        double d = y[r * N + j] - ye[r * N + j];
        mse += d * d;
        for (i = 0; i < K; i++) {
          int grouped =
              q->format == QL_FORMAT_Q4G || q->format == QL_FORMAT_Q8B;
          size_t si =
              grouped ? (size_t)(i / (int)q->group_size * N + j) : (size_t)j;
          double dw = ql_load_f32(q->scale_dtype, q->scale, si);
          double dx = o.sx[r];
          double xv = x[r * K + i], wv = w[j * K + i];
          if (q->format == QL_FORMAT_F8R) {
            /* the local e4m3 step, in units of the scale */
            dw *= tu_e4m3_ulp(fmin(fabs(wv) / dw, 448.0));
            dx *= tu_e4m3_ulp(fmin(fabs(xv) / dx, 448.0));
          }
          pred += xv * xv * dw * dw / 12.0;
          if (op)
            pred += wv * wv * dx * dx / 12.0;
        }
      }
    ratio = mse / pred;
    REQUIRE(ratio > 0.5 && ratio < 1.5,
            "%s format %d gs %u: MSE %g vs predicted %g (ratio %g)",
            op ? "AQ" : "WO", (int)c->f, c->gs, mse / (M * N),
            pred / (M * N), ratio);
  }
  qx_free(&o);
  ql_qweight_free(q);
  free(w);
  free(x);
  free(y);
  free(ye);
}
END_TEST

static Suite *reference_suite(void) {
  Suite *s = suite_create("reference");
  TCase *tc;

  tc = tcase_create("quantize_rows");
  tcase_add_test(tc, test_qrows_independent);
  tcase_add_test(tc, test_qrows_ties);
  tcase_add_test(tc, test_qrows_reciprocal);
  tcase_add_test(tc, test_qrows_errors);
  tcase_add_test(tc, test_qrows_e4m3_independent);
  tcase_add_test(tc, test_qrows_e4m3_ties);
  tcase_add_test(tc, test_qrows_e4m3_errors);
  tcase_add_test(tc, test_qrows_generic_op);
  tcase_add_test(tc, test_qrows_src_vs_rule);
  tcase_add_test(tc, test_qrows_src_f32_same);
  tcase_add_test(tc, test_qrows_src_errors);
  tcase_add_test(tc, test_qrows_generic_op_src);
  suite_add_tcase(s, tc);

  tc = tcase_create("linear");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_wo_aq_vs_formula_and_fp64, 0, NCFG);
  tcase_add_loop_test(tc, test_bias, 0, NCFG);
  tcase_add_loop_test(tc, test_narrow_io, 0, NCFG);
  tcase_add_loop_test(tc, test_batch_invariance, 0, NCFG);
  tcase_add_test(tc, test_aq_q8c_max_k);
  tcase_add_test(tc, test_f8r_large_k);
  tcase_add_loop_test(tc, test_op_errors, 0, NCFG);
  tcase_add_loop_test(tc, test_nmse_vs_unquantized, 0, NCFG);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run_suite(reference_suite(), CK_NORMAL); }
