/*
 * formats.c - the canonical weight formats of DESIGN §4 (q4g, q8c, q8b,
 * f8r): sizes, quantize (pack), dequantize and free.
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

  if (!ql_format_valid(f))
    return QL_EFORMAT;
  if (esz == 0)
    return QL_EDTYPE;
  if ((f == QL_FORMAT_Q4G || f == QL_FORMAT_Q8B) && !ql_group_size_valid(f, gs))
    return QL_EINVAL;
  if (n < 1 || n > QL_DIM_MAX || k < 1 || k > QL_DIM_MAX)
    return QL_ESHAPE;
  nn = (size_t)n;
  kk = (size_t)k;
  switch (f) {
  case QL_FORMAT_Q4G: /* two values per byte */
    g = kk / gs + (kk % gs != 0);
    row = kk / 2 + (kk & 1);
    break;
  case QL_FORMAT_Q8B: /* one byte per value, a scale per block */
    g = kk / gs + (kk % gs != 0);
    row = kk;
    break;
  default: /* q8c, f8r: one byte per value, one scale per row */
    g = 1;
    row = kk;
    break;
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
  if (w->asymmetric != 0 && !(w->format == QL_FORMAT_Q8B && w->asymmetric == 1))
    return QL_EINVAL;
  /* zero[] exists exactly where the format reads it */
  if ((w->zero != NULL) != (w->format == QL_FORMAT_Q4G || w->asymmetric))
    return QL_EINVAL;
  return 0;
}

void ql_qweight_free(ql_qweight *w) {
  if (w == NULL)
    return;
  if (w->borrowed) {
    if (w->release != NULL)
      w->release(w->backing);
  } else {
    free(w->qdata);
    free(w->scale);
    free(w->zero);
    free(w->bias);
  }
  free(w);
}

/*
 * Rounds v to rd, the dtype the scale is computed in (TorchAO rounds a
 * bf16/f16 weight's scale to that dtype), stores it as element i of arr in
 * st, the dtype it is kept in (rd's values are exact in st: st is rd or
 * f32), and returns the stored value widened back to f32 in *stored: the
 * quantizer and the dequantizer must both see exactly what is stored.
 * QL_ENONFINITE when the value is not finite (an f16 overflow, or a
 * parameter that overflowed in f32).
 */
static int store_param(ql_dtype rd, ql_dtype st, void *arr, size_t i, float v,
                       float *stored) {
  v = ql_round_to(rd, v);
  ql_from_f32(st, &v, (unsigned char *)arr + i * ql_dtype_size(st), 1);
  *stored = ql_load_f32(st, arr, i);
  return isfinite(*stored) ? 0 : QL_ENONFINITE;
}

/*
 * The asymmetric parameters of x[k0..k1) for `levels` steps (15 for q4g,
 * 255 for q8b) and the offset `mid` (8, 128) that makes q signed:
 *   scale = max(max - min, 1e-6) / levels,  zero = min + scale·mid   (f32)
 * QL_ENONFINITE when max - min (hence scale) or zero overflows f32.
 */
static int asym_params(const float *x, size_t k0, size_t k1, float levels,
                       float mid, float *mn_out, float *scale, float *zero) {
  float mn = x[k0], mx = x[k0];
  size_t i;

  for (i = k0 + 1; i < k1; i++) {
    if (x[i] < mn)
      mn = x[i];
    if (x[i] > mx)
      mx = x[i];
  }
  *mn_out = mn;
  *scale = fmaxf(mx - mn, 1e-6f) / levels;
  *zero = mn + *scale * mid;
  return isfinite(*scale) && isfinite(*zero) ? 0 : QL_ENONFINITE;
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
static int quantize_q4g_row(ql_qweight *w, ql_dtype rd, size_t r,
                            const float *x) {
  size_t n = (size_t)w->n, k = (size_t)w->k, gs = w->group_size;
  size_t rowbytes = k / 2 + (k & 1);
  uint8_t *qd = w->qdata + r * rowbytes;
  size_t g, i, k0, k1;
  float s_st, z_st;
  int rc;

  memset(qd, 0, rowbytes); /* the padding nibble of an odd K stays 0 */
  for (g = 0, k0 = 0; k0 < k; g++, k0 = k1) {
    float mn, scale, zero;

    k1 = k - k0 < gs ? k : k0 + gs;
    if ((rc = asym_params(x, k0, k1, 15.0f, 8.0f, &mn, &scale, &zero)))
      return rc;
    if ((rc = store_param(rd, w->scale_dtype, w->scale, g * n + r, scale, &s_st)) ||
        (rc = store_param(rd, w->scale_dtype, w->zero, g * n + r, zero, &z_st)))
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
 * Symmetric int8 of x[k0..k1) (one q8c row or one symmetric q8b block) into
 * qd[k0..k1), its scale stored as element si. The q8c rule; mirrors TorchAO
 * 0.18 Int8Tensor.from_hp
 * (torchao/quantization/quantize_/workflows/int8/int8_tensor.py), which
 * calls _choose_qparams_affine (torchao/quantization/quant_primitives.py)
 * with MappingType.SYMMETRIC, int8 -128..127, eps = finfo(float32).eps for
 * every input dtype and scale_dtype float32:
 *   scale = clamp(amax / ((127 - (-128)) / 2), min=eps).to(float32)
 * where amax and the quotient are tensors of the weight's dtype (for a
 * bf16/f16 weight the f32 quotient rounded once to that dtype: rd here),
 * then quantize_affine: clamp(round(x * (1.0 / scale)), -128, 127) with
 * that f32 scale, the reciprocal and the product in f32. eps = 2^-23 is
 * exact in bf16 and f16, so clamping before or after the rounding is the
 * same. By default (rd = the weight's dtype, stored as f32) the stored
 * scale and the codes are TorchAO's bytes.
 */
static int quantize_i8_sym(const ql_qweight *w, ql_dtype rd, const float *x,
                           size_t k0, size_t k1, size_t si, int8_t *qd) {
  float amax = 0.0f, scale, s_st, inv;
  size_t i;
  int rc;

  for (i = k0; i < k1; i++) {
    float a = fabsf(x[i]);
    if (a > amax)
      amax = a;
  }
  scale = amax / 127.5f;
  if (scale < QL_I8_SCALE_EPS)
    scale = QL_I8_SCALE_EPS;
  if ((rc = store_param(rd, w->scale_dtype, w->scale, si, scale, &s_st)))
    return rc;
  inv = 1.0f / s_st;
  for (i = k0; i < k1; i++) {
    float t = rintf(x[i] * inv);
    qd[i] = (int8_t)(t <= -128.0f ? -128 : t >= 127.0f ? 127 : (int)t);
  }
  return 0;
}

static int quantize_q8c_row(ql_qweight *w, ql_dtype rd, size_t r,
                            const float *x) {
  size_t k = (size_t)w->k;
  return quantize_i8_sym(w, rd, x, 0, k, r, (int8_t *)w->qdata + r * k);
}

/*
 * q8b (torch_xla blockwise W8A16 layout), one row r of w widened to f32 in
 * x, block by block along K, the last block short (DESIGN §4). Symmetric
 * blocks use exactly the q8c rule above (stored scale, reciprocal multiply,
 * -128 reachable); asymmetric blocks the q4g rule widened to 8 bits (255
 * steps, offset 128), so each q8b flavour shares its code with a format
 * that mirrors TorchAO:
 *   scale = max(max - min, 1e-6) / 255,  zero = min + scale·128      (f32)
 *   q     = clamp(rne((x - min) / scale), 0, 255) - 128
 * with a true division by the unrounded f32 scale; scale and zero are
 * rounded to scale_dtype only when stored.
 */
static int quantize_q8b_row(ql_qweight *w, ql_dtype rd, size_t r,
                            const float *x) {
  size_t n = (size_t)w->n, k = (size_t)w->k, bs = w->group_size;
  int8_t *qd = (int8_t *)w->qdata + r * k;
  size_t b, i, k0, k1;
  int rc;

  for (b = 0, k0 = 0; k0 < k; b++, k0 = k1) {
    float mn, scale, zero, s_st, z_st;

    k1 = k - k0 < bs ? k : k0 + bs;
    if (!w->asymmetric) {
      if ((rc = quantize_i8_sym(w, rd, x, k0, k1, b * n + r, qd)))
        return rc;
      continue;
    }
    if ((rc = asym_params(x, k0, k1, 255.0f, 128.0f, &mn, &scale, &zero)) ||
        (rc = store_param(rd, w->scale_dtype, w->scale, b * n + r, scale, &s_st)) ||
        (rc = store_param(rd, w->scale_dtype, w->zero, b * n + r, zero, &z_st)))
      return rc;
    for (i = k0; i < k1; i++) {
      float t = rintf((x[i] - mn) / scale);
      int u = t <= 0.0f ? 0 : t >= 255.0f ? 255 : (int)t;
      qd[i] = (int8_t)(u - 128);
    }
  }
  return 0;
}

/*
 * f8r, one row r of w widened to f32 in x. Mirrors TorchAO
 * Float8Tensor.from_hp with PerRow granularity
 * (torchao/quantization/quantize_/workflows/float8/float8_tensor.py, the
 * "torch" kernel choice), which calls, in quant_primitives.py:
 *   _choose_scale_float8: max_abs = x.abs().amax(row), clamped to
 *     min=hp_value_lb when one is given, scale = max_abs / 448
 *     (torch.finfo(float8_e4m3fn).max), returned as f32;
 *   _quantize_affine_float8: (x.to(f32) / scale).clamp(-448, 448)
 *     .to(torch.float8_e4m3fn) - a true division, round to nearest even.
 * from_hp passes hp_value_lb=None by default, so TorchAO turns an all-zero
 * row into 0/0 = NaN; we clamp amax at QL_F8_AMAX_LB = 1e-12, the floor
 * of TorchAO's float8 training (torchao/float8/float8_utils.py EPS), so
 * that row gives zeros (DESIGN §4).
 * For every other f32 row this is bit-identical to TorchAO. On a bf16/f16
 * weight TorchAO divides in f32, rounds the scale to the weight's dtype
 * and returns it widened to f32; by default we do the same (rd = the
 * weight's dtype, stored as f32), so the scale and the codes are TorchAO's
 * bytes (the division uses the stored scale, as TorchAO divides by the
 * scale it returns). TorchAO applies a 1e-12 bound (when given) in that
 * dtype; we apply it in f32 before the rounding, which gives the same
 * scale for every bf16 amax (bf16(1e-12) / 448 and 1e-12f / 448 round to
 * the same bf16).
 * An f16 scale can underflow to 0 (amax <= 448·2^-25; TorchAO's bound is
 * 0 in f16, so it writes NaN and ±448 codes there): every x̂ of that row
 * is then 0 whatever q is, and q is written as 0 instead of x/0.
 */
static int quantize_f8r_row(ql_qweight *w, ql_dtype rd, size_t r,
                            const float *x) {
  size_t k = (size_t)w->k, i;
  uint8_t *qd = w->qdata + r * k;
  float amax = 0.0f, scale, s_st;
  int rc;

  for (i = 0; i < k; i++) {
    float a = fabsf(x[i]);
    if (a > amax)
      amax = a;
  }
  scale = fmaxf(amax, QL_F8_AMAX_LB) / QL_E4M3_MAX;
  if ((rc = store_param(rd, w->scale_dtype, w->scale, r, scale, &s_st)))
    return rc;
  if (s_st == 0.0f) {
    memset(qd, 0, k);
    return 0;
  }
  for (i = 0; i < k; i++) {
    float t = x[i] / s_st;
    t = t < -QL_E4M3_MAX ? -QL_E4M3_MAX : t > QL_E4M3_MAX ? QL_E4M3_MAX : t;
    qd[i] = ql_f32_to_e4m3(t);
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

/*
 * Whether every dequantized value q·s + z of w is finite: |q|·|s| + |z|
 * <= FLT_MAX for the largest |q| of the format (8 for q4g, 128 for q8c
 * and q8b, 448 for f8r), bounded in double. Finite scales and zeros can
 * still overflow there (q4g's -8·s with s near 2^125, a q8c scale past
 * FLT_MAX/128), and the kernels that dequantize first would then give
 * Inf where the reference, which factors the zero or scale out, gives a
 * number. Returns the index of the first (scale, zero) pair past it, or
 * -1 for none.
 */
int64_t ql__qweight_range_fault(const ql_qweight *w) {
  size_t count = w->scale_bytes / ql_dtype_size(w->scale_dtype);
  double qmax = w->format == QL_FORMAT_Q4G   ? 8.0
                : w->format == QL_FORMAT_F8R ? (double)QL_E4M3_MAX
                                             : 128.0;
  for (size_t i = 0; i < count; i++) {
    double b = qmax * fabs((double)ql_load_f32(w->scale_dtype, w->scale, i));
    if (w->zero != NULL)
      b += fabs((double)ql_load_f32(w->scale_dtype, w->zero, i));
    if (!(b <= (double)FLT_MAX))
      return (int64_t)i;
  }
  return -1;
}

int ql_qweight_quantize(const ql_quant_params *p, int64_t n, int64_t k,
                        ql_dtype src_dtype, const void *w, const void *bias,
                        ql_qweight **out) {
  size_t qb, sb, nk, src_bytes, row_bytes, bias_bytes, esz, r;
  ql_qweight *qw = NULL;
  float *row = NULL;
  ql_dtype scale_dtype, rd;
  ql_format f;
  uint32_t gs;
  int64_t groups;
  int rc;

  if (out == NULL)
    return QL_EINVAL;
  *out = NULL;
  if (p == NULL || w == NULL)
    return QL_EINVAL;
  if ((esz = ql_dtype_size(src_dtype)) == 0)
    return QL_EDTYPE;
  f = p->format;
  gs = p->group_size;
  /* rd: the dtype the scale is rounded to; scale_dtype: the one it is
   * stored in (ql_quant_params). */
  rd = scale_dtype = p->scale_dtype;
  if ((int)scale_dtype == 0) {
    rd = src_dtype;
    scale_dtype = f == QL_FORMAT_Q8C || f == QL_FORMAT_F8R ? QL_DTYPE_F32
                                                           : src_dtype;
  }
  if ((rc = ql_qweight_sizes(f, gs, n, k, scale_dtype, &qb, &sb, &groups)))
    return rc;
  if (p->asymmetric != 0 && !(f == QL_FORMAT_Q8B && p->asymmetric == 1))
    return QL_EINVAL;
  /* The caller's w holds N·K elements; that and our scratch must fit. */
  if (!mul_size((size_t)n, (size_t)k, &nk) || !mul_size(nk, esz, &src_bytes) ||
      !mul_size((size_t)k, sizeof(float), &row_bytes) ||
      !mul_size((size_t)n, sizeof(float), &bias_bytes))
    return QL_ESHAPE;

  rc = QL_ENOMEM;
  if ((qw = calloc(1, sizeof *qw)) == NULL)
    goto fail;
  qw->format = f;
  qw->group_size = f == QL_FORMAT_Q4G || f == QL_FORMAT_Q8B ? gs : (uint32_t)k;
  qw->n = n;
  qw->k = k;
  qw->groups = groups;
  qw->asymmetric = p->asymmetric;
  qw->scale_dtype = scale_dtype;
  qw->qdata_bytes = qb;
  qw->scale_bytes = sb;
  if ((qw->qdata = malloc(qb)) == NULL || (qw->scale = malloc(sb)) == NULL)
    goto fail;
  if ((f == QL_FORMAT_Q4G || qw->asymmetric) && (qw->zero = malloc(sb)) == NULL)
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
    switch (f) {
    case QL_FORMAT_Q4G:
      rc = quantize_q4g_row(qw, rd, r, row);
      break;
    case QL_FORMAT_Q8C:
      rc = quantize_q8c_row(qw, rd, r, row);
      break;
    case QL_FORMAT_Q8B:
      rc = quantize_q8b_row(qw, rd, r, row);
      break;
    case QL_FORMAT_F8R:
      rc = quantize_f8r_row(qw, rd, r, row);
      break;
    }
    if (rc != 0)
      goto fail;
  }
  /* A row spanning nearly FLT_MAX: finite scales whose extreme code
   * dequantizes past it (q8c's -128·amax/127). */
  rc = QL_ENONFINITE;
  if (ql__qweight_range_fault(qw) >= 0)
    goto fail;
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
  } else if (w->format == QL_FORMAT_Q8B) {
    size_t bs = w->group_size, b, k0, k1;
    const int8_t *qd = (const int8_t *)w->qdata + r * k;

    for (b = 0, k0 = 0; k0 < k; b++, k0 = k1) {
      float s = ql_load_f32(w->scale_dtype, w->scale, b * n + r);

      k1 = k - k0 < bs ? k : k0 + bs;
      if (w->asymmetric) {
        float z = ql_load_f32(w->scale_dtype, w->zero, b * n + r);
        for (i = k0; i < k1; i++)
          out[i] = (float)qd[i] * s + z;
      } else {
        for (i = k0; i < k1; i++)
          out[i] = (float)qd[i] * s;
      }
    }
  } else if (w->format == QL_FORMAT_F8R) {
    /* TorchAO _dequantize_affine_float8: qdata.to(f32) * scale */
    const uint8_t *qd = w->qdata + r * k;
    float s = ql_load_f32(w->scale_dtype, w->scale, r);

    for (i = 0; i < k; i++)
      out[i] = ql_e4m3_to_f32(qd[i]) * s;
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
