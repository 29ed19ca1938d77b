/*
 * reference.c - the generic reference ops: per-row int8 and e4m3
 * activation quantization and the weight-only (WO) and
 * activation-quantized (AQ) linear products. Plain scalar C in a fixed
 * evaluation order: every backend op is checked against these, and they
 * define the batch-invariant reduction order (an output element depends on
 * its own x row only).
 *
 * Compiled with -ffp-contract=off: each f32 operation rounds once, exactly
 * as written.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ql_kernels.h"

/* *out = a·b; 0 when the product does not fit a size_t. */
static int mul_size(size_t a, size_t b, size_t *out) {
  if (a != 0 && b > SIZE_MAX / a)
    return 0;
  *out = a * b;
  return 1;
}

/*
 * amax of a row of k values, checking each: QL_ENONFINITE for NaN or Inf,
 * QL_EINVAL for a value src cannot hold (x must be src data widened; this
 * also keeps every f16 scale finite).
 */
static int row_amax(ql_dtype src, const float *x, size_t k, float *amax) {
  float m = 0.0f;
  size_t i;

  for (i = 0; i < k; i++) {
    float a = fabsf(x[i]);
    if (!isfinite(a))
      return QL_ENONFINITE;
    if (src != QL_DTYPE_F32 && ql_round_to(src, x[i]) != x[i])
      return QL_EINVAL;
    if (a > m)
      m = a;
  }
  *amax = m;
  return 0;
}

/*
 * One row of ql_quantize_rows_i8_src, the int8 rule of ql_kernels.h step
 * by step: TorchAO's Int8Tensor.from_hp on a row of dtype src
 * (quant_primitives.py _choose_qparams_affine +
 * _quantize_affine_no_dtype_cast): the scale divided in f32 and rounded to
 * src, clamped at eps, then a correctly rounded f32 reciprocal, one f32
 * product and rintf (half to even, like torch.round).
 */
static int quantize_row_i8(ql_dtype src, const float *x, size_t k, size_t gs,
                           int8_t *xq, float *sx, int32_t *gsum) {
  float amax, scale, inv;
  size_t i, g, k0, k1;
  int rc;

  if ((rc = row_amax(src, x, k, &amax)))
    return rc;
  scale = ql_round_to(src, amax / 127.5f);
  if (scale < QL_I8_SCALE_EPS)
    scale = QL_I8_SCALE_EPS;
  inv = 1.0f / scale;
  for (i = 0; i < k; i++) {
    float t = rintf(x[i] * inv);
    xq[i] = (int8_t)(t <= -128.0f ? -128 : t >= 127.0f ? 127 : (int)t);
  }
  *sx = scale;
  if (gsum != NULL)
    for (g = 0, k0 = 0; k0 < k; g++, k0 = k1) {
      int32_t s = 0;
      k1 = k - k0 < gs ? k : k0 + gs;
      for (i = k0; i < k1; i++)
        s += xq[i];
      gsum[g] = s;
    }
  return 0;
}

int ql_quantize_rows_i8_src(ql_dtype src, const float *x, int64_t m,
                            int64_t k, uint32_t gs, int8_t *xq, float *sx,
                            int32_t *gsum) {
  size_t mm, kk, g, mk, mg, r;
  int rc;

  if (x == NULL || xq == NULL || sx == NULL || gs < 1)
    return QL_EINVAL;
  if (!ql_dtype_valid((int)src))
    return QL_EDTYPE;
  if (m < 1 || m > QL_DIM_MAX || k < 1 || k > QL_DIM_MAX)
    return QL_ESHAPE;
  mm = (size_t)m;
  kk = (size_t)k;
  g = kk / gs + (kk % gs != 0);
  if (!mul_size(mm, kk, &mk) || !mul_size(mm, g, &mg))
    return QL_ESHAPE;
  /* A group sum of up to 2^24 values in [-128, 127] fits an int32. */
  if (gsum != NULL && (gs < kk ? (int64_t)gs : k) > QL_QROWS_MAX_GROUP)
    return QL_ESHAPE;
  for (r = 0; r < mm; r++) {
    rc = quantize_row_i8(src, x + r * kk, kk, gs, xq + r * kk, sx + r,
                         gsum != NULL ? gsum + r * g : NULL);
    if (rc != 0)
      return rc;
  }
  return 0;
}

int ql_quantize_rows_i8(const float *x, int64_t m, int64_t k, uint32_t gs,
                        int8_t *xq, float *sx, int32_t *gsum) {
  return ql_quantize_rows_i8_src(QL_DTYPE_F32, x, m, k, gs, xq, sx, gsum);
}

/*
 * One row of ql_quantize_rows_e4m3_src, the e4m3 rule of ql_kernels.h step
 * by step: TorchAO's float8 rowwise quantization of a row of dtype src
 * (quant_primitives.py _choose_scale_float8 with hp_value_lb = 1e-12, then
 * _quantize_affine_float8): the scale divided in f32 and rounded to src,
 * in f16 floored at 2^-24 where TorchAO's would be 0; then a true f32
 * division x / scale, the clamp to ±448 and the e4m3 rounding (nearest
 * even).
 */
static int quantize_row_e4m3(ql_dtype src, const float *x, size_t k,
                             uint8_t *xq, float *sx) {
  float amax, scale;
  size_t i;
  int rc;

  if ((rc = row_amax(src, x, k, &amax)))
    return rc;
  scale = ql_round_to(src, fmaxf(amax, QL_F8_AMAX_LB) / QL_E4M3_MAX);
  if (src == QL_DTYPE_F16 && scale < QL_F8_F16_SCALE_MIN)
    scale = QL_F8_F16_SCALE_MIN;
  for (i = 0; i < k; i++) {
    float t = x[i] / scale;
    t = t < -QL_E4M3_MAX ? -QL_E4M3_MAX : t > QL_E4M3_MAX ? QL_E4M3_MAX : t;
    xq[i] = ql_f32_to_e4m3(t);
  }
  *sx = scale;
  return 0;
}

int ql_quantize_rows_e4m3_src(ql_dtype src, const float *x, int64_t m,
                              int64_t k, uint8_t *xq, float *sx) {
  size_t mm, kk, mk, r;
  int rc;

  if (x == NULL || xq == NULL || sx == NULL)
    return QL_EINVAL;
  if (!ql_dtype_valid((int)src))
    return QL_EDTYPE;
  if (m < 1 || m > QL_DIM_MAX || k < 1 || k > QL_DIM_MAX)
    return QL_ESHAPE;
  mm = (size_t)m;
  kk = (size_t)k;
  if (!mul_size(mm, kk, &mk))
    return QL_ESHAPE;
  for (r = 0; r < mm; r++)
    if ((rc = quantize_row_e4m3(src, x + r * kk, kk, xq + r * kk, sx + r)))
      return rc;
  return 0;
}

int ql_quantize_rows_e4m3(const float *x, int64_t m, int64_t k, uint8_t *xq,
                          float *sx) {
  return ql_quantize_rows_e4m3_src(QL_DTYPE_F32, x, m, k, xq, sx);
}

/* Sizes of one linear call, validated once by op_args(). */
typedef struct op_shape {
  size_t m, n, k;
  size_t mk;  /* elements of x */
  size_t esz; /* bytes per element of x and y */
} op_shape;

/*
 * Argument checks shared by both linear ops, so that they fail the same
 * way: QL_EINVAL for missing pointers or a malformed weight, QL_EFORMAT for
 * an unknown format, QL_EDTYPE, QL_ESHAPE for M out of range or
 * sizes (x, y, the widened f32 copy of x) that overflow.
 */
static int op_args(const ql_qweight *w, ql_dtype dt, const void *x, int64_t m,
                   void *y, op_shape *s) {
  size_t mn, bytes;
  int rc;

  if (w == NULL || x == NULL || y == NULL)
    return QL_EINVAL;
  if ((rc = ql_qweight_check(w)))
    return rc;
  if ((s->esz = ql_dtype_size(dt)) == 0)
    return QL_EDTYPE;
  if (m < 1 || m > QL_DIM_MAX)
    return QL_ESHAPE;
  s->m = (size_t)m;
  s->n = (size_t)w->n;
  s->k = (size_t)w->k;
  if (!mul_size(s->m, s->k, &s->mk) || !mul_size(s->mk, sizeof(float), &bytes) ||
      !mul_size(s->m, s->n, &mn) || !mul_size(mn, s->esz, &bytes))
    return QL_ESHAPE;
  return 0;
}

/* Narrows v to dt and stores it as element i of y. */
static void store_out(ql_dtype dt, void *y, size_t esz, size_t i, float v) {
  ql_from_f32(dt, &v, (unsigned char *)y + i * esz, 1);
}

static void unpack_q4g_row(const ql_qweight *w, size_t r, int8_t *q);

void ql_q4g_group_sums(const float *x, int64_t m, int64_t k, uint32_t gs,
                       float *xs) {
  int64_t groups = (k + (int64_t)gs - 1) / (int64_t)gs, full = k / (int64_t)gs;
  for (int64_t r = 0; r < m; r++) {
    const float *xr = x + (size_t)r * (size_t)k;
    float *o = xs + (size_t)r * (size_t)groups;
    for (int64_t g = 0; g < groups; g++)
      o[g] = 0.0f;
    /* groups innermost: independent sums, each still in increasing k */
    for (int64_t i = 0; i < (int64_t)gs && full > 0; i++)
      for (int64_t g = 0; g < full; g++)
        o[g] += xr[g * (int64_t)gs + i];
    for (int64_t i = full * (int64_t)gs; i < k; i++)
      o[full] += xr[i];
  }
}

/*
 * q4g WO with the zero term factored out of each group (ql_kernels.h):
 * per group a = Σ x·q by FMAs, then acc += fma(zero, Σx, scale·a). The
 * zero·Σx term costs one multiply per group instead of one per weight,
 * and q needs no dequantization: the CPU kernels' inner step is one FMA.
 */
static int linear_wo_q4g(const ql_qweight *w, const float *xf,
                         const op_shape *s, ql_dtype dt, void *y) {
  size_t groups = (size_t)w->groups, gs = w->group_size, mg;
  float *xs = NULL;
  int8_t *q = NULL;
  int rc = QL_ESHAPE;

  if (!mul_size(s->m, groups, &mg))
    return rc;
  rc = QL_ENOMEM;
  if ((xs = malloc(mg * sizeof(float))) == NULL || (q = malloc(s->k)) == NULL)
    goto fail;
  ql_q4g_group_sums(xf, (int64_t)s->m, (int64_t)s->k, w->group_size, xs);
  for (size_t n = 0; n < s->n; n++) {
    unpack_q4g_row(w, n, q);
    for (size_t mi = 0; mi < s->m; mi++) {
      const float *xr = xf + mi * s->k;
      float acc = 0.0f;
      for (size_t g = 0; g < groups; g++) {
        size_t k0 = g * gs, k1 = k0 + gs < s->k ? k0 + gs : s->k;
        size_t si = g * s->n + n;
        float a = 0.0f;
        for (size_t k = k0; k < k1; k++)
          a = fmaf(xr[k], (float)q[k], a);
        acc += fmaf(ql_load_f32(w->scale_dtype, w->zero, si),
                    xs[mi * groups + g],
                    ql_load_f32(w->scale_dtype, w->scale, si) * a);
      }
      if (w->bias != NULL)
        acc += w->bias[n];
      store_out(dt, y, s->esz, mi * s->n + n, acc);
    }
  }
  rc = 0;
fail:
  free(xs);
  free(q);
  return rc;
}

/*
 * q8c WO with the scale factored out of the row (ql_kernels.h): a = Σ
 * fma(x, q, a) over K, then y = scale·a. One multiply per output instead
 * of one per weight: the CPU kernels' inner step is one FMA.
 */
static void linear_wo_q8c(const ql_qweight *w, const float *xf,
                          const op_shape *s, ql_dtype dt, void *y) {
  for (size_t n = 0; n < s->n; n++) {
    const int8_t *q = (const int8_t *)w->qdata + n * s->k;
    float sc = ql_load_f32(w->scale_dtype, w->scale, n);
    for (size_t mi = 0; mi < s->m; mi++) {
      const float *xr = xf + mi * s->k;
      float a = 0.0f, acc;
      for (size_t k = 0; k < s->k; k++)
        a = fmaf(xr[k], (float)q[k], a);
      acc = sc * a;
      if (w->bias != NULL)
        acc += w->bias[n];
      store_out(dt, y, s->esz, mi * s->n + n, acc);
    }
  }
}

int ql_linear_wo_ref(const ql_qweight *w, ql_dtype dt, const void *x,
                     int64_t m, void *y) {
  float *xf = NULL, *wrow = NULL;
  size_t i, mi, n, k;
  op_shape s;
  int rc;

  if ((rc = op_args(w, dt, x, m, y, &s)))
    return rc;
  rc = QL_ENOMEM;
  if ((xf = malloc(s.mk * sizeof(float))) == NULL ||
      (wrow = malloc(s.k * sizeof(float))) == NULL)
    goto fail;
  ql_to_f32(dt, x, xf, s.mk);
  rc = QL_ENONFINITE;
  for (i = 0; i < s.mk; i++)
    if (!isfinite(xf[i]))
      goto fail;
  if (w->format == QL_FORMAT_Q4G) {
    rc = linear_wo_q4g(w, xf, &s, dt, y);
    goto fail;
  }
  if (w->format == QL_FORMAT_Q8C) {
    linear_wo_q8c(w, xf, &s, dt, y);
    rc = 0;
    goto fail;
  }

  /* One dequantized row of W at a time, reused by every row of x: memory
   * stays O(M·K + K) however large N·K is. */
  for (n = 0; n < s.n; n++) {
    if ((rc = ql_qweight_dequantize_row(w, (int64_t)n, wrow)))
      goto fail;
    for (mi = 0; mi < s.m; mi++) {
      const float *xr = xf + mi * s.k;
      float acc = 0.0f;

      for (k = 0; k < s.k; k++)
        acc += xr[k] * wrow[k];
      if (w->bias != NULL)
        acc += w->bias[n];
      store_out(dt, y, s.esz, mi * s.n + n, acc);
    }
  }
  rc = 0;

fail:
  free(xf);
  free(wrow);
  return rc;
}

/* The int8 values of row r of a q4g weight, unpacked from their nibbles. */
static void unpack_q4g_row(const ql_qweight *w, size_t r, int8_t *q) {
  size_t k = (size_t)w->k, rowbytes = k / 2 + (k & 1), i;
  const uint8_t *qd = w->qdata + r * rowbytes;

  for (i = 0; i < k; i++) {
    unsigned nib = (qd[i >> 1] >> ((i & 1) * 4)) & 0xFu;
    q[i] = (int8_t)((int)(nib ^ 8u) - 8);
  }
}

/*
 * f8r AQ (W8A8 float8): acc = Σk e4m3(xq)·e4m3(wq) in f32 from 0.0f in
 * increasing k, then y = acc·(sx·sw) (+ b). Each product of two e4m3
 * values has at most 8 significant bits and lies within [2^-18, 448²], so
 * it is exact in f32 and an FMA would give the same sums: only the
 * additions round, in this order, which fixes the result on every backend
 * that keeps it. Memory: O(M·K) bytes of codes + O(K) floats.
 */
static int linear_aq_f8r(const ql_qweight *w, ql_dtype dt, const void *x,
                         const op_shape *s, void *y) {
  float *xf = NULL, *sx = NULL, *wrow = NULL, lut[256];
  uint8_t *xq = NULL;
  size_t mi, n, k;
  int rc;

  rc = QL_ENOMEM;
  if ((xf = malloc(s->mk * sizeof(float))) == NULL ||
      (xq = malloc(s->mk)) == NULL ||
      (sx = malloc(s->m * sizeof(float))) == NULL ||
      (wrow = malloc(s->k * sizeof(float))) == NULL)
    goto fail;
  ql_to_f32(dt, x, xf, s->mk);
  rc = ql_quantize_rows_e4m3_src(dt, xf, (int64_t)s->m, (int64_t)s->k, xq, sx);
  if (rc != 0)
    goto fail;
  free(xf);
  xf = NULL;
  for (k = 0; k < 256; k++)
    lut[k] = ql_e4m3_to_f32((uint8_t)k);

  for (n = 0; n < s->n; n++) {
    const uint8_t *wr = w->qdata + n * s->k;
    float sw = ql_load_f32(w->scale_dtype, w->scale, n);

    for (k = 0; k < s->k; k++)
      wrow[k] = lut[wr[k]];
    for (mi = 0; mi < s->m; mi++) {
      const uint8_t *xr = xq + mi * s->k;
      float acc = 0.0f, v;

      for (k = 0; k < s->k; k++)
        acc += lut[xr[k]] * wrow[k];
      v = acc * (sx[mi] * sw);
      if (w->bias != NULL)
        v += w->bias[n];
      store_out(dt, y, s->esz, mi * s->n + n, v);
    }
  }
  rc = 0;

fail:
  free(xf);
  free(xq);
  free(sx);
  free(wrow);
  return rc;
}

int ql_linear_aq_ref(const ql_qweight *w, ql_dtype dt, const void *x,
                     int64_t m, void *y) {
  float *xf = NULL, *sx = NULL, *gsc = NULL, *gze = NULL;
  int8_t *xq = NULL, *wq = NULL;
  int32_t *gsum = NULL;
  size_t mi, n, k, g, ng = 1, mg = 0;
  int q4g;
  op_shape s;
  int rc;

  if ((rc = op_args(w, dt, x, m, y, &s)))
    return rc;
  if (w->format == QL_FORMAT_Q8B) /* weight-only by design (DESIGN §4) */
    return QL_ENOTSUP;
  if (w->format == QL_FORMAT_F8R)
    return linear_aq_f8r(w, dt, x, &s, y);
  q4g = w->format == QL_FORMAT_Q4G;
  if (!q4g && w->k > QL_AQ_Q8C_MAX_K)
    return QL_ESHAPE;
  if (q4g) {
    ng = (size_t)w->groups;
    if (!mul_size(s.m, ng, &mg))
      return QL_ESHAPE;
  }

  rc = QL_ENOMEM;
  if ((xf = malloc(s.mk * sizeof(float))) == NULL ||
      (xq = malloc(s.mk)) == NULL || (sx = malloc(s.m * sizeof(float))) == NULL)
    goto fail;
  if (q4g && ((gsum = malloc(mg * sizeof(int32_t))) == NULL ||
              (wq = malloc(s.k)) == NULL ||
              (gsc = malloc(ng * sizeof(float))) == NULL ||
              (gze = malloc(ng * sizeof(float))) == NULL))
    goto fail;
  ql_to_f32(dt, x, xf, s.mk);
  rc = ql_quantize_rows_i8_src(dt, xf, (int64_t)s.m, (int64_t)s.k,
                               q4g ? w->group_size : (uint32_t)s.k, xq, sx,
                               gsum);
  if (rc != 0)
    goto fail;
  free(xf);
  xf = NULL;

  for (n = 0; n < s.n; n++) {
    if (q4g) {
      unpack_q4g_row(w, n, wq);
      for (g = 0; g < ng; g++) {
        gsc[g] = ql_load_f32(w->scale_dtype, w->scale, g * s.n + n);
        gze[g] = ql_load_f32(w->scale_dtype, w->zero, g * s.n + n);
      }
    }
    for (mi = 0; mi < s.m; mi++) {
      const int8_t *xr = xq + mi * s.k;
      float v;

      if (q4g) {
        /* W4A8: int32 dot inside a group, f32 across groups in increasing
         * g, the scale term before the zero term. */
        size_t gs = w->group_size, k0, k1;
        float acc = 0.0f;

        for (g = 0, k0 = 0; k0 < s.k; g++, k0 = k1) {
          int32_t a = 0;
          float t1, t2;

          k1 = s.k - k0 < gs ? s.k : k0 + gs;
          for (k = k0; k < k1; k++)
            a += (int32_t)xr[k] * wq[k];
          t1 = gsc[g] * (float)a;
          t2 = gze[g] * (float)gsum[mi * ng + g];
          acc += t1;
          acc += t2;
        }
        v = sx[mi] * acc;
      } else {
        /* W8A8: int32 dot over all of K (K <= QL_AQ_Q8C_MAX_K, so it cannot
         * overflow), then one f32 rescale by (sx·sw). */
        const int8_t *wr = (const int8_t *)w->qdata + n * s.k;
        float sxw = sx[mi] * ql_load_f32(w->scale_dtype, w->scale, n);
        int32_t acc = 0;

        for (k = 0; k < s.k; k++)
          acc += (int32_t)xr[k] * wr[k];
        v = (float)acc * sxw;
      }
      if (w->bias != NULL)
        v += w->bias[n];
      store_out(dt, y, s.esz, mi * s.n + n, v);
    }
  }
  rc = 0;

fail:
  free(xf);
  free(xq);
  free(sx);
  free(gsum);
  free(wq);
  free(gsc);
  free(gze);
  return rc;
}
