/*
 * formats.c - the canonical weight formats of DESIGN §4: sizes, quantize
 * (pack), dequantize and free. Only q4g and q8c exist so far; q8b and f8r
 * answer QL_EFORMAT.
 *
 * Everything here is bit-exact by contract (golden vectors from TorchAO),
 * so the file is compiled with -ffp-contract=off and every f32 expression
 * is written in the order the mirrored PyTorch code evaluates it.
 */
#include <float.h>
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

int ql_group_size_valid(ql_format f, uint32_t gs) {
  switch (f) {
  case QL_FORMAT_Q4G:
  case QL_FORMAT_Q8B:
    return gs == 32 || gs == 64 || gs == 128 || gs == 256;
  case QL_FORMAT_Q8C:
  case QL_FORMAT_F8R:
    return 1;
  }
  return 0;
}

int ql_qweight_sizes(ql_format f, uint32_t gs, int64_t n, int64_t k,
                     ql_dtype scale_dtype, size_t *qdata_bytes,
                     size_t *scale_bytes, int64_t *groups) {
  size_t esz = ql_dtype_size(scale_dtype);
  size_t nn, kk, g, row, qb, sb;

  if (f != QL_FORMAT_Q4G && f != QL_FORMAT_Q8C)
    return QL_EFORMAT;
  if (esz == 0)
    return QL_EDTYPE;
  if (f == QL_FORMAT_Q4G && !ql_group_size_valid(f, gs))
    return QL_EINVAL;
  if (n < 1 || n > QL_DIM_MAX || k < 1 || k > QL_DIM_MAX)
    return QL_ESHAPE;
  nn = (size_t)n;
  kk = (size_t)k;
  if (f == QL_FORMAT_Q4G) {
    g = kk / gs + (kk % gs != 0);
    row = kk / 2 + (kk & 1);
  } else {
    g = 1;
    row = kk;
  }
  if (!mul_size(nn, row, &qb) || !mul_size(g, nn, &sb) ||
      !mul_size(sb, esz, &sb))
    return QL_ESHAPE;
  if (qdata_bytes)
    *qdata_bytes = qb;
  if (scale_bytes)
    *scale_bytes = sb;
  if (groups)
    *groups = (int64_t)g;
  return 0;
}

int ql_qweight_check(const ql_qweight *w) {
  size_t qb, sb;
  int64_t g;
  int rc;

  if (w == NULL)
    return QL_EINVAL;
  rc = ql_qweight_sizes(w->format, w->group_size, w->n, w->k, w->scale_dtype,
                        &qb, &sb, &g);
  if (rc != 0)
    return rc;
  if (g != w->groups || qb != w->qdata_bytes || sb != w->scale_bytes)
    return QL_EINVAL;
  if (w->qdata == NULL || w->scale == NULL)
    return QL_EINVAL;
  if (w->format == QL_FORMAT_Q4G && w->zero == NULL)
    return QL_EINVAL;
  return 0;
}

void ql_qweight_free(ql_qweight *w) {
  if (w == NULL)
    return;
  free(w->qdata);
  free(w->scale);
  free(w->zero);
  free(w->bias);
  free(w);
}

/*
 * Rounds v to dt, stores it as element i of arr and returns the stored
 * value widened back to f32 in *stored: the quantizer and the dequantizer
 * must both see exactly what is stored. QL_ENONFINITE when the stored value
 * is not finite (an f16 overflow, or a parameter that overflowed in f32).
 */
static int store_param(ql_dtype dt, void *arr, size_t i, float v,
                       float *stored) {
  switch (dt) {
  case QL_DTYPE_F32:
    ((float *)arr)[i] = v;
    break;
  case QL_DTYPE_F16:
    ((uint16_t *)arr)[i] = ql_f32_to_f16(v);
    break;
  case QL_DTYPE_BF16:
    ((uint16_t *)arr)[i] = ql_f32_to_bf16(v);
    break;
  }
  *stored = ql_load_f32(dt, arr, i);
  return isfinite(*stored) ? 0 : QL_ENONFINITE;
}

/*
 * q4g, one row r of w already widened to f32 in x. Mirrors FBGEMM
 * int4_row_quantize_zp (fbgemm_gpu/experimental/gen_ai/gen_ai/quantize.py,
 * called by TorchAO Int4Tensor.from_hp, which then does scale.to(w.dtype))
 * group by group along K, the last group short as its torch.split gives it:
 *   scales = (max - min).clamp(min=1e-6) / 15          (f32)
 *   zeros  = min + scales * 8                          (f32)
 *   q      = (x - min).div(scales).round().clamp(0, 15) - 8
 * q uses the unrounded f32 scale, like FBGEMM; scale and zero are rounded
 * to scale_dtype only when stored (TorchAO converts them afterwards).
 * The division is a true division, not a reciprocal multiply, and round()
 * is half to even (rintf in the default rounding mode).
 */
static int quantize_q4g_row(ql_qweight *w, size_t r, const float *x) {
  size_t n = (size_t)w->n, k = (size_t)w->k, gs = w->group_size;
  size_t rowbytes = k / 2 + (k & 1);
  uint8_t *qd = w->qdata + r * rowbytes;
  size_t g, i, k0, k1;
  float s_st, z_st;
  int rc;

  memset(qd, 0, rowbytes); /* the padding nibble of an odd K stays 0 */
  for (g = 0, k0 = 0; k0 < k; g++, k0 = k1) {
    float mn, mx, scale, zero;

    k1 = k - k0 < gs ? k : k0 + gs;
    mn = mx = x[k0];
    for (i = k0 + 1; i < k1; i++) {
      if (x[i] < mn)
        mn = x[i];
      if (x[i] > mx)
        mx = x[i];
    }
    scale = fmaxf(mx - mn, 1e-6f) / 15.0f;
    zero = mn + scale * 8.0f;
    if (!isfinite(scale) || !isfinite(zero))
      return QL_ENONFINITE;
    if ((rc = store_param(w->scale_dtype, w->scale, g * n + r, scale, &s_st)) ||
        (rc = store_param(w->scale_dtype, w->zero, g * n + r, zero, &z_st)))
      return rc;
    for (i = k0; i < k1; i++) {
      float t = rintf((x[i] - mn) / scale);
      int u = t <= 0.0f ? 0 : t >= 15.0f ? 15 : (int)t;
      int q = u - 8;
      qd[i >> 1] |= (uint8_t)(((unsigned)q & 0xFu) << ((i & 1) * 4));
    }
  }
  return 0;
}

/*
 * q8c, one row r of w widened to f32 in x. Mirrors TorchAO Int8Tensor.from_hp
 * (torchao/quantization/quantize_/workflows/int8/int8_tensor.py), which
 * calls _choose_qparams_affine (torchao/quantization/quant_primitives.py)
 * with MappingType.SYMMETRIC, int8 -128..127 and no eps, so
 * eps = torch.finfo(input.dtype).eps = FLT_EPSILON for an f32 input:
 *   scale = clamp(amax / ((127 - (-128)) / 2), min=eps).to(scale_dtype)
 * then quantize_affine: clamp(round(x * (1.0 / scale)), -128, 127) with the
 * already stored (rounded) scale and the reciprocal computed in f32.
 * TorchAO on a bf16/f16 weight computes these steps in that dtype; we widen
 * to f32 first (DESIGN §4), so a rare tie may differ there.
 */
static int quantize_q8c_row(ql_qweight *w, size_t r, const float *x) {
  size_t k = (size_t)w->k, i;
  int8_t *qd = (int8_t *)w->qdata + r * k;
  float amax = 0.0f, scale, s_st, inv;
  int rc;

  for (i = 0; i < k; i++) {
    float a = fabsf(x[i]);
    if (a > amax)
      amax = a;
  }
  scale = amax / 127.5f;
  if (scale < QL_I8_SCALE_EPS)
    scale = QL_I8_SCALE_EPS;
  if ((rc = store_param(w->scale_dtype, w->scale, r, scale, &s_st)))
    return rc;
  inv = 1.0f / s_st;
  for (i = 0; i < k; i++) {
    float t = rintf(x[i] * inv);
    qd[i] = (int8_t)(t <= -128.0f ? -128 : t >= 127.0f ? 127 : (int)t);
  }
  return 0;
}

static int all_finite(const float *x, size_t n) {
  size_t i;
  for (i = 0; i < n; i++)
    if (!isfinite(x[i]))
      return 0;
  return 1;
}

int ql_qweight_quantize(ql_format f, uint32_t gs, int64_t n, int64_t k,
                        ql_dtype src_dtype, const void *w, const void *bias,
                        ql_dtype scale_dtype, ql_qweight **out) {
  size_t qb, sb, nk, src_bytes, row_bytes, bias_bytes, esz, r;
  ql_qweight *qw = NULL;
  float *row = NULL;
  int64_t groups;
  int rc;

  if (out == NULL)
    return QL_EINVAL;
  *out = NULL;
  if (w == NULL)
    return QL_EINVAL;
  if ((esz = ql_dtype_size(src_dtype)) == 0)
    return QL_EDTYPE;
  if ((rc = ql_qweight_sizes(f, gs, n, k, scale_dtype, &qb, &sb, &groups)))
    return rc;
  /* The caller's w holds N·K elements; that and our scratch must fit. */
  if (!mul_size((size_t)n, (size_t)k, &nk) || !mul_size(nk, esz, &src_bytes) ||
      !mul_size((size_t)k, sizeof(float), &row_bytes) ||
      !mul_size((size_t)n, sizeof(float), &bias_bytes))
    return QL_ESHAPE;

  rc = QL_ENOMEM;
  if ((qw = calloc(1, sizeof *qw)) == NULL)
    goto fail;
  qw->format = f;
  qw->group_size = f == QL_FORMAT_Q8C ? (uint32_t)k : gs;
  qw->n = n;
  qw->k = k;
  qw->groups = groups;
  qw->scale_dtype = scale_dtype;
  qw->qdata_bytes = qb;
  qw->scale_bytes = sb;
  if ((qw->qdata = malloc(qb)) == NULL || (qw->scale = malloc(sb)) == NULL)
    goto fail;
  if (f == QL_FORMAT_Q4G && (qw->zero = malloc(sb)) == NULL)
    goto fail;
  if ((row = malloc(row_bytes)) == NULL)
    goto fail;
  if (bias != NULL) {
    if ((qw->bias = malloc(bias_bytes)) == NULL)
      goto fail;
    ql_to_f32(src_dtype, bias, qw->bias, (size_t)n);
    rc = QL_ENONFINITE;
    if (!all_finite(qw->bias, (size_t)n))
      goto fail;
  }

  for (r = 0; r < (size_t)n; r++) {
    ql_to_f32(src_dtype, (const unsigned char *)w + r * (size_t)k * esz, row,
              (size_t)k);
    rc = QL_ENONFINITE;
    if (!all_finite(row, (size_t)k))
      goto fail;
    rc = f == QL_FORMAT_Q4G ? quantize_q4g_row(qw, r, row)
                            : quantize_q8c_row(qw, r, row);
    if (rc != 0)
      goto fail;
  }
  free(row);
  *out = qw;
  return 0;

fail:
  free(row);
  ql_qweight_free(qw);
  return rc;
}

/* Row r of dequant(w) into out; w has been checked. */
static void dequantize_row(const ql_qweight *w, size_t r, float *out) {
  size_t n = (size_t)w->n, k = (size_t)w->k, i;

  if (w->format == QL_FORMAT_Q4G) {
    size_t gs = w->group_size, rowbytes = k / 2 + (k & 1), g, k0, k1;
    const uint8_t *qd = w->qdata + r * rowbytes;

    for (g = 0, k0 = 0; k0 < k; g++, k0 = k1) {
      float s = ql_load_f32(w->scale_dtype, w->scale, g * n + r);
      float z = ql_load_f32(w->scale_dtype, w->zero, g * n + r);

      k1 = k - k0 < gs ? k : k0 + gs;
      for (i = k0; i < k1; i++) {
        unsigned nib = (qd[i >> 1] >> ((i & 1) * 4)) & 0xFu;
        int q = (int)(nib ^ 8u) - 8; /* sign-extend the 4-bit value */
        out[i] = (float)q * s + z;
      }
    }
  } else {
    const int8_t *qd = (const int8_t *)w->qdata + r * k;
    float s = ql_load_f32(w->scale_dtype, w->scale, r);

    for (i = 0; i < k; i++)
      out[i] = (float)qd[i] * s;
  }
}

int ql_qweight_dequantize_row(const ql_qweight *w, int64_t n, float *out) {
  int rc;

  if (w == NULL || out == NULL)
    return QL_EINVAL;
  if ((rc = ql_qweight_check(w)))
    return rc;
  if (n < 0 || n >= w->n)
    return QL_ESHAPE;
  dequantize_row(w, (size_t)n, out);
  return 0;
}

int ql_qweight_dequantize(const ql_qweight *w, float *out) {
  size_t nk, r;
  int rc;

  if (w == NULL || out == NULL)
    return QL_EINVAL;
  if ((rc = ql_qweight_check(w)))
    return rc;
  if (!mul_size((size_t)w->n, (size_t)w->k, &nk) ||
      !mul_size(nk, sizeof(float), &nk))
    return QL_ESHAPE;
  for (r = 0; r < (size_t)w->n; r++)
    dequantize_row(w, r, out + r * (size_t)w->k);
  return 0;
}
