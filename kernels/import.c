/*
 * import.c - ql_qweight_import(): a canonical weight (ql_kernels.h) from
 * packed arrays a client or a file supplies (import.h).
 *
 * What is accepted, per format (N rows, K in_features, G = ceil(K/gs)):
 *
 *   q4g, QL_ZERO_FLOAT (TorchAO Int4Tensor, int4_packing_format="plain"):
 *     qdata u8 or i8 [N, ceil(K/2)], the canonical packing, which is also
 *     mslk/FBGEMM pack_int4's: signed q in [-8, 7], even k in the low
 *     nibble. TorchAO's tensor is int8; its bytes are used as they are.
 *     scale, zero [G, N] in f32, f16 or bf16, both the same dtype. That is
 *     TorchAO's own layout (int4_row_quantize_zp returns
 *     torch.cat(scales).t().contiguous()), so nothing is transposed.
 *   q4g, QL_ZERO_INT (TorchAO Int4PlainInt32Tensor, the XPU form):
 *     qdata u8 or i8 [N, ceil(K/2)] holding unsigned u in [0, 15] (even k
 *     low), or i32 [N, K/8] as TorchAO stores it: the XPU
 *     _convert_weight_to_int4pack puts eight nibbles in each int32, element
 *     k in bits 4·(k % 8) .. 4·(k % 8) + 3 of word k / 8; K must then be a
 *     multiple of 8. scale [G, N] in f32, f16 or bf16; zero [G, N] integer
 *     zero points in i8, u8 or i32, each in [0, 15] (TorchAO clamps them
 *     there). Converted to canonical: q = u - 8 and zero = (8 - zp)·scale.
 *   q8c (TorchAO Int8Tensor): qdata i8 [N, K]; scale [N] or [N, 1] (TorchAO
 *     keeps [N, 1]); no zero (TorchAO's zero_point is all zero for the
 *     symmetric mapping; the caller leaves it out).
 *   q8b: qdata i8 [N, K]; scale [G, N], G = ceil(K/B); zero [G, N] in the
 *     scale's dtype exactly when asymmetric is 1.
 *   f8r (TorchAO Float8Tensor, PerRow): qdata f8e4m3 [N, K]; scale [N] or
 *     [N, 1]; no zero. The NaN codes 0x7F/0xFF are refused (QL_ENONFINITE):
 *     TorchAO writes them for an all-zero row when no hp_value_lb is set,
 *     and a canonical weight never holds them.
 *   bias, for every format: [N] in f32, f16 or bf16, widened to f32.
 *
 * The integer zero point form keeps its scale and zero in f32, whatever
 * dtype the scale came in. TorchAO dequantizes that form as (u - zp)·scale
 * (quant_primitives.py _dequantize_affine_no_dtype_check, one product).
 * With a bf16/f16 scale widened exactly to f32, zero = (8 - zp)·scale is
 * exact in f32 (|8 - zp| <= 8 needs 4 more bits than the scale has), and
 * so is q·scale + zero = (u - zp)·scale: the import dequantizes bit for bit
 * as TorchAO does. Rounding zero to bf16 instead changes about one element
 * in ten of the golden vectors (tests/data/golden/q4i_*, meta.txt
 * zero_in_scale_dtype_ndiff). With an f32 scale, q·scale, the zero and
 * their sum each round once: the result is within about half an ulp of
 * each of |q·scale|, |zero| and itself of TorchAO's, which can be several
 * ulps of the result when q·scale and zero nearly cancel (6 seen).
 *
 * Every other array keeps its dtype and its bytes; nothing is read before
 * its dtype, shape and byte count have been checked, and the caller's
 * buffers need not be aligned (everything is copied before it is read as
 * a wider type).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "import.h"

/* Sets of array dtypes, a bit per ql_array_dtype. */
/* 0 outside [0, 32): a dtype from a caller is tested before its range. */
#define BIT(dt) ((unsigned)(dt) < 32u ? 1u << (unsigned)(dt) : 0u)
#define FLOATS (BIT(QL_ADT_F32) | BIT(QL_ADT_F16) | BIT(QL_ADT_BF16))
#define BYTES (BIT(QL_ADT_U8) | BIT(QL_ADT_I8))
#define INTS (BIT(QL_ADT_I8) | BIT(QL_ADT_U8) | BIT(QL_ADT_I32))

__attribute__((format(printf, 4, 5))) static int fail(char *err, size_t errlen,
                                                      int rc, const char *fmt,
                                                      ...) {
  if (err != NULL && errlen > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return rc;
}

static int mul_size(size_t a, size_t b, size_t *out) {
  if (a != 0 && b > SIZE_MAX / a)
    return 0;
  *out = a * b;
  return 1;
}

static const char *adt_name(int dt) {
  switch (dt) {
  case QL_ADT_F32:
    return "f32";
  case QL_ADT_F16:
    return "f16";
  case QL_ADT_BF16:
    return "bf16";
  case QL_ADT_I8:
    return "i8";
  case QL_ADT_U8:
    return "u8";
  case QL_ADT_I32:
    return "i32";
  case QL_ADT_F8E4M3:
    return "f8e4m3";
  }
  return NULL;
}

static const char *format_name(ql_format f) {
  switch (f) {
  case QL_FORMAT_Q4G:
    return "q4g";
  case QL_FORMAT_Q8C:
    return "q8c";
  case QL_FORMAT_Q8B:
    return "q8b";
  case QL_FORMAT_F8R:
    return "f8r";
  }
  return "?";
}

/* "f32, f16 or bf16": the dtypes of a set, for a message. */
static void dtypes_str(unsigned set, char *buf, size_t len) {
  int n = 0, seen = 0;
  size_t at = 0;

  for (int dt = 1; dt < 32; dt++)
    n += (set & BIT(dt)) != 0 && adt_name(dt) != NULL;
  buf[0] = '\0';
  for (int dt = 1; dt < 32 && at < len; dt++) {
    if (!(set & BIT(dt)) || adt_name(dt) == NULL)
      continue;
    seen++;
    int w = snprintf(buf + at, len - at, "%s%s",
                     seen == 1 ? "" : seen == n ? " or " : ", ", adt_name(dt));
    if (w < 0)
      break;
    at += (size_t)w;
  }
}

/* One accepted shape: ndim 1 or 2 and its dimensions. */
typedef struct shape {
  int ndim;
  int64_t d[2];
} shape;

static void shape_str(int ndim, const int64_t *d, char *buf, size_t len) {
  if (ndim == 1)
    snprintf(buf, len, "[%lld]", (long long)d[0]);
  else
    snprintf(buf, len, "[%lld,%lld]", (long long)d[0], (long long)d[1]);
}

/*
 * Checks the array `name` against a set of dtypes and up to two accepted
 * shapes, and that it holds exactly the bytes its shape needs. 0, or the
 * error (with its message in err): QL_EINVAL when absent, QL_EDTYPE,
 * QL_ESHAPE.
 */
static int check_array(const char *name, const ql_array *a, unsigned dtypes,
                       const shape *want, int nwant, char *err,
                       size_t errlen) {
  char got[48], exp[112], set[64];
  size_t esz, count, bytes;
  int i, match = -1;

  if (a->data == NULL)
    return fail(err, errlen, QL_EINVAL, "%s: missing", name);
  if (a->dtype <= 0 || a->dtype >= 32 || !(dtypes & BIT(a->dtype)) ||
      ql_array_dtype_size(a->dtype) == 0) {
    dtypes_str(dtypes, set, sizeof set);
    if (adt_name(a->dtype) != NULL)
      return fail(err, errlen, QL_EDTYPE, "%s: dtype %s, expected %s", name,
                  adt_name(a->dtype), set);
    return fail(err, errlen, QL_EDTYPE, "%s: unknown dtype %d, expected %s",
                name, a->dtype, set);
  }
  if (a->ndim != 1 && a->ndim != 2)
    return fail(err, errlen, QL_ESHAPE, "%s: %d dimensions, expected 1 or 2",
                name, a->ndim);
  shape_str(a->ndim, a->shape, got, sizeof got);
  for (i = 0; i < nwant && match < 0; i++)
    if (want[i].ndim == a->ndim && want[i].d[0] == a->shape[0] &&
        (a->ndim == 1 || want[i].d[1] == a->shape[1]))
      match = i;
  if (match < 0) {
    char w0[48], w1[48];
    shape_str(want[0].ndim, want[0].d, w0, sizeof w0);
    if (nwant > 1) {
      shape_str(want[1].ndim, want[1].d, w1, sizeof w1);
      snprintf(exp, sizeof exp, "%s or %s", w0, w1);
    } else {
      snprintf(exp, sizeof exp, "%s", w0);
    }
    return fail(err, errlen, QL_ESHAPE, "%s: shape %s, expected %s", name, got,
                exp);
  }
  /* The accepted shapes come from checked sizes, but the byte count of an
   * i32 or f32 [N, K] may still overflow. */
  esz = ql_array_dtype_size(a->dtype);
  if (!mul_size((size_t)want[match].d[0],
                want[match].ndim == 2 ? (size_t)want[match].d[1] : 1,
                &count) ||
      !mul_size(count, esz, &bytes))
    return fail(err, errlen, QL_ESHAPE, "%s: shape %s of %s is too large",
                name, got, adt_name(a->dtype));
  if (a->bytes != bytes)
    return fail(err, errlen, QL_ESHAPE,
                "%s: %zu bytes, expected %zu (shape %s of %s)", name, a->bytes,
                bytes, got, adt_name(a->dtype));
  return 0;
}

/* Element i of an integer array of dtype dt (i8, u8 or i32), from a copy
 * that need not be aligned. */
static int64_t load_int(int dt, const unsigned char *p, size_t i) {
  int32_t v32;
  switch (dt) {
  case QL_ADT_I8:
    return (int8_t)p[i];
  case QL_ADT_U8:
    return p[i];
  default:
    memcpy(&v32, p + 4 * i, 4);
    return v32;
  }
}

/* Nibble k (0..15) of row r of the integer-zero-point qdata. */
static unsigned int_nibble(const ql_array *q, size_t r, size_t k, size_t kk) {
  const unsigned char *p = q->data;
  if (q->dtype == QL_ADT_I32) {
    uint32_t w;
    memcpy(&w, p + 4 * (r * (kk / 8) + k / 8), 4);
    return (w >> (4 * (k % 8))) & 0xFu;
  }
  return (p[r * (kk / 2 + (kk & 1)) + k / 2] >> ((k & 1) * 4)) & 0xFu;
}

/* Copies the canonical qdata of d into w->qdata and checks what only the
 * values can tell: the padding nibble of an odd K, the NaN codes of f8r. */
static int check_qdata(const ql_import_desc *d, const ql_qweight *w,
                       char *err, size_t errlen);
static int import(const ql_import_desc *d, int borrow, ql_qweight **out,
                  char *err, size_t errlen);

static int import_qdata(const ql_import_desc *d, ql_qweight *w, char *err,
                        size_t errlen) {
  size_t n = (size_t)d->n, k = (size_t)d->k, r, i;
  const unsigned char *src = d->qdata.data;

  if (d->format == QL_FORMAT_Q4G && d->zero_kind == QL_ZERO_INT) {
    size_t rowbytes = k / 2 + (k & 1);
    memset(w->qdata, 0, w->qdata_bytes);
    for (r = 0; r < n; r++)
      for (i = 0; i < k; i++) /* q = u - 8, i.e. the nibble u ^ 8 */
        w->qdata[r * rowbytes + i / 2] |=
            (uint8_t)((int_nibble(&d->qdata, r, i, k) ^ 8u) << ((i & 1) * 4));
  } else {
    memcpy(w->qdata, src, w->qdata_bytes);
  }
  return check_qdata(d, w, err, errlen);
}

/* The values of canonical qdata that are not allowed: a non-zero padding
 * nibble (odd K, q4g) and the e4m3 NaN codes. Reads w->qdata. */
static int check_qdata(const ql_import_desc *d, const ql_qweight *w,
                       char *err, size_t errlen) {
  size_t n = (size_t)d->n, k = (size_t)d->k, r, i;
  const unsigned char *src = d->qdata.data;
  if (d->format == QL_FORMAT_Q4G && (k & 1)) {
    size_t rowbytes = k / 2 + 1;
    for (r = 0; r < n; r++) {
      /* The integer form's padding nibble was never converted: check the
       * source's (u8/i8 only, an i32 packing has no odd K). */
      unsigned pad = (src[r * rowbytes + rowbytes - 1] >> 4) & 0xFu;
      if (pad != 0)
        return fail(err, errlen, QL_EINVAL,
                    "qdata: row %zu: padding nibble 0x%x, expected 0 (K is "
                    "odd)", r, pad);
    }
  }
  if (d->format == QL_FORMAT_F8R)
    for (i = 0; i < w->qdata_bytes; i++)
      if ((w->qdata[i] & 0x7Fu) == 0x7Fu)
        return fail(err, errlen, QL_ENONFINITE,
                    "qdata: NaN code 0x%02x at [%zu,%zu]", w->qdata[i], i / k,
                    i % k);
  return 0;
}

/* Checks that the count values of a float array (dtype dt, aligned copy)
 * are finite. */
static int check_finite(const char *name, ql_dtype dt, const void *arr,
                        size_t count, size_t cols, char *err, size_t errlen) {
  for (size_t i = 0; i < count; i++) {
    float v = ql_load_f32(dt, arr, i);
    if (!isfinite(v)) {
      if (cols > 1)
        return fail(err, errlen, QL_ENONFINITE, "%s: %g at [%zu,%zu]", name,
                    (double)v, i / cols, i % cols);
      return fail(err, errlen, QL_ENONFINITE, "%s: %g at [%zu]", name,
                  (double)v, i);
    }
  }
  return 0;
}

/* Finite scales and zeros whose codes dequantize past FLT_MAX: the
 * kernels that dequantize first would give Inf where the reference gives
 * a number (TorchAO's integer zero point form, (u - zp)·s, stays finite
 * where q·s + (8 - zp)·s does not). cols: as check_finite's. */
static int check_range(const ql_qweight *w, size_t cols, char *err,
                       size_t errlen) {
  int64_t bad = ql__qweight_range_fault(w);
  if (bad < 0)
    return 0;
  float sc = ql_load_f32(w->scale_dtype, w->scale, (size_t)bad);
  float ze =
      w->zero != NULL ? ql_load_f32(w->scale_dtype, w->zero, (size_t)bad) : 0;
  return fail(err, errlen, QL_ENONFINITE,
              "scale: %g (zero %g) at [%zu,%zu]: its codes dequantize past "
              "the largest float",
              (double)sc, (double)ze, (size_t)bad / cols, (size_t)bad % cols);
}

/* The integer zero point form: scale widened to f32, zero = (8 - zp)·scale
 * in f32 (see the top of the file). */
static int import_int_zero(const ql_import_desc *d, ql_qweight *w, size_t g,
                           char *err, size_t errlen) {
  size_t n = (size_t)d->n, count = g * n, i;
  const unsigned char *zp = d->zero.data;
  float *scale = w->scale, *zero = w->zero;
  unsigned char *raw;
  size_t esz = ql_array_dtype_size(d->scale.dtype);

  /* The caller's scale may be unaligned: widen from an aligned copy. */
  if ((raw = malloc(count * esz)) == NULL)
    return fail(err, errlen, QL_ENOMEM, "scale: out of memory");
  memcpy(raw, d->scale.data, count * esz);
  ql_to_f32((ql_dtype)d->scale.dtype, raw, scale, count);
  free(raw);
  for (i = 0; i < count; i++) {
    int64_t z = load_int(d->zero.dtype, zp, i);
    if (!isfinite(scale[i]))
      return fail(err, errlen, QL_ENONFINITE, "scale: %g at [%zu,%zu]",
                  (double)scale[i], i / n, i % n);
    if (z < 0 || z > 15)
      return fail(err, errlen, QL_EINVAL,
                  "zero: zero point %lld at [%zu,%zu] outside [0, 15]",
                  (long long)z, i / n, i % n);
    zero[i] = (float)(8 - z) * scale[i];
    if (!isfinite(zero[i]))
      return fail(err, errlen, QL_ENONFINITE,
                  "zero: (8 - %lld)·scale overflows f32 at [%zu,%zu]",
                  (long long)z, i / n, i % n);
  }
  return 0;
}

static int aligned(const void *p, size_t a) {
  return ((uintptr_t)p & (a - 1)) == 0;
}

int ql_qweight_import_borrowed(const ql_import_desc *d, ql_qweight **out,
                               char *err, size_t errlen) {
  if (out != NULL)
    *out = NULL;
  if (d == NULL || out == NULL)
    return fail(err, errlen, QL_EINVAL, "no descriptor or output");
  size_t ssz = ql_array_dtype_size(d->scale.dtype);
  if (d->zero_kind != QL_ZERO_FLOAT || d->qdata.data == NULL ||
      !(BYTES & BIT(d->qdata.dtype) || d->qdata.dtype == QL_ADT_F8E4M3) ||
      d->scale.data == NULL || !(FLOATS & BIT(d->scale.dtype)) ||
      !aligned(d->scale.data, ssz) ||
      (d->zero.data != NULL && !aligned(d->zero.data, ssz)) ||
      (d->bias.data != NULL &&
       (d->bias.dtype != QL_ADT_F32 || !aligned(d->bias.data, 4))))
    return fail(err, errlen, QL_ENOTSUP, "not borrowable");
  return import(d, 1, out, err, errlen);
}

int ql_qweight_import(const ql_import_desc *d, ql_qweight **out, char *err,
                      size_t errlen) {
  return import(d, 0, out, err, errlen);
}

/* Both imports; borrow: d's arrays are canonical (checked by the caller)
 * and become the weight's without a copy. */
static int import(const ql_import_desc *d, int borrow, ql_qweight **out,
                  char *err, size_t errlen) {
  ql_qweight *w = NULL;
  size_t qb, sb, nn, kk, g, cols, esz;
  int64_t groups;
  ql_dtype sdt;
  shape want[2];
  int rc, int_zero, has_zero;
  unsigned qtypes;

  if (err != NULL && errlen > 0)
    err[0] = '\0';
  if (out == NULL)
    return fail(err, errlen, QL_EINVAL, "no output");
  *out = NULL;
  if (d == NULL)
    return fail(err, errlen, QL_EINVAL, "no descriptor");

  /* ---- the descriptor: format, sizes, group, zero kind, asymmetric */
  if (!ql_format_valid(d->format))
    return fail(err, errlen, QL_EFORMAT, "format: unknown format %d",
                (int)d->format);
  rc = ql_qweight_sizes(d->format, d->group_size, d->n, d->k, QL_DTYPE_F32,
                        &qb, &sb, &groups);
  if (rc == QL_EINVAL)
    return fail(err, errlen, rc, "group_size: %u is not valid for %s (32, "
                "64, 128 or 256)", d->group_size, format_name(d->format));
  if (rc == QL_ESHAPE)
    return fail(err, errlen, rc, "n, k: [%lld,%lld] outside [1, %lld] or too "
                "large", (long long)d->n, (long long)d->k,
                (long long)QL_DIM_MAX);
  if (rc != 0)
    return fail(err, errlen, rc, "format: %s is not supported",
                format_name(d->format));
  if (d->zero_kind != QL_ZERO_FLOAT && d->zero_kind != QL_ZERO_INT)
    return fail(err, errlen, QL_EINVAL, "zero_kind: unknown kind %d",
                (int)d->zero_kind);
  int_zero = d->zero_kind == QL_ZERO_INT;
  if (int_zero && d->format != QL_FORMAT_Q4G)
    return fail(err, errlen, QL_EINVAL, "zero_kind: an integer zero point "
                "is only for q4g, not %s", format_name(d->format));
  if (d->format == QL_FORMAT_Q8B ? d->asymmetric != 0 && d->asymmetric != 1
                                 : d->asymmetric != 0)
    return fail(err, errlen, QL_EINVAL, "asymmetric: %d is not valid for %s",
                d->asymmetric, format_name(d->format));
  nn = (size_t)d->n;
  kk = (size_t)d->k;
  g = (size_t)groups;
  has_zero = d->format == QL_FORMAT_Q4G ||
             (d->format == QL_FORMAT_Q8B && d->asymmetric);

  /* ---- qdata */
  want[0].ndim = 2;
  want[0].d[0] = d->n;
  want[0].d[1] = d->format == QL_FORMAT_Q4G ? (int64_t)(kk / 2 + (kk & 1))
                                            : d->k;
  qtypes = d->format == QL_FORMAT_Q4G   ? BYTES
           : d->format == QL_FORMAT_F8R ? BIT(QL_ADT_F8E4M3)
                                        : BIT(QL_ADT_I8);
  if (int_zero) {
    qtypes |= BIT(QL_ADT_I32);
    if (d->qdata.data != NULL && d->qdata.dtype == QL_ADT_I32) {
      if (kk % 8 != 0)
        return fail(err, errlen, QL_ESHAPE, "qdata: an i32 packing needs K "
                    "divisible by 8, K is %lld", (long long)d->k);
      want[0].d[1] = d->k / 8;
    }
  }
  if ((rc = check_array("qdata", &d->qdata, qtypes, want, 1, err, errlen)))
    return rc;

  /* ---- scale */
  if (d->format == QL_FORMAT_Q4G || d->format == QL_FORMAT_Q8B) {
    want[0].ndim = 2;
    want[0].d[0] = groups;
    want[0].d[1] = d->n;
    rc = check_array("scale", &d->scale, FLOATS, want, 1, err, errlen);
  } else {
    want[0].ndim = 1;
    want[0].d[0] = d->n;
    want[1].ndim = 2;
    want[1].d[0] = d->n;
    want[1].d[1] = 1;
    rc = check_array("scale", &d->scale, FLOATS, want, 2, err, errlen);
  }
  if (rc != 0)
    return rc;

  /* ---- zero: [G, N] where the format has one, else absent */
  if (has_zero) {
    want[0].ndim = 2;
    want[0].d[0] = groups;
    want[0].d[1] = d->n;
    rc = check_array("zero", &d->zero,
                     int_zero ? INTS : BIT(d->scale.dtype), want, 1, err,
                     errlen);
    if (rc == QL_EDTYPE && !int_zero &&
        ql_array_dtype_size(d->zero.dtype) != 0 &&
        (FLOATS & BIT(d->zero.dtype)))
      return fail(err, errlen, QL_EDTYPE, "zero: dtype %s, expected %s (the "
                  "scale's)", adt_name(d->zero.dtype),
                  adt_name(d->scale.dtype));
    if (rc != 0)
      return rc;
  } else if (d->zero.data != NULL) {
    return fail(err, errlen, QL_EINVAL, "zero: given, but %s%s has no zero "
                "point", d->format == QL_FORMAT_Q8B ? "symmetric " : "",
                format_name(d->format));
  }

  /* ---- bias: [N] */
  if (d->bias.data != NULL) {
    want[0].ndim = 1;
    want[0].d[0] = d->n;
    if ((rc = check_array("bias", &d->bias, FLOATS, want, 1, err, errlen)))
      return rc;
  }

  /* ---- build: every size below was checked against a supplied array */
  sdt = int_zero ? QL_DTYPE_F32 : (ql_dtype)d->scale.dtype;
  if ((rc = ql_qweight_sizes(d->format, d->group_size, d->n, d->k, sdt, &qb,
                             &sb, &groups)))
    return fail(err, errlen, rc, "scale: sizes overflow");
  if ((w = calloc(1, sizeof *w)) == NULL)
    return fail(err, errlen, QL_ENOMEM, "out of memory");
  w->format = d->format;
  w->group_size = d->format == QL_FORMAT_Q4G || d->format == QL_FORMAT_Q8B
                      ? d->group_size
                      : (uint32_t)d->k;
  w->n = d->n;
  w->k = d->k;
  w->groups = groups;
  w->asymmetric = d->format == QL_FORMAT_Q8B && d->asymmetric;
  w->scale_dtype = sdt;
  w->qdata_bytes = qb;
  w->scale_bytes = sb;
  /* columns of the [G, N] arrays, for messages; [N] ones are a column */
  cols = d->format == QL_FORMAT_Q4G || d->format == QL_FORMAT_Q8B ? nn : 1;
  if (borrow) {
    /* Never written through the weight (ql_qweight.borrowed). */
    w->borrowed = 1;
    w->qdata = (uint8_t *)d->qdata.data;
    w->scale = (void *)d->scale.data;
    w->zero = has_zero ? (void *)d->zero.data : NULL;
    w->bias = (float *)d->bias.data;
    if ((rc = check_qdata(d, w, err, errlen)) ||
        (rc = check_finite("scale", sdt, w->scale, sb / ql_dtype_size(sdt),
                           cols, err, errlen)) ||
        (w->zero != NULL &&
         (rc = check_finite("zero", sdt, w->zero, sb / ql_dtype_size(sdt),
                            nn, err, errlen))) ||
        (w->bias != NULL && (rc = check_finite("bias", QL_DTYPE_F32, w->bias,
                                               nn, 1, err, errlen))) ||
        (rc = check_range(w, cols, err, errlen)))
      goto fail;
    goto built;
  }
  rc = fail(err, errlen, QL_ENOMEM, "out of memory");
  if ((w->qdata = malloc(qb)) == NULL || (w->scale = malloc(sb)) == NULL ||
      (has_zero && (w->zero = malloc(sb)) == NULL) ||
      (d->bias.data != NULL &&
       (w->bias = malloc(nn * sizeof(float))) == NULL))
    goto fail;
  if (err != NULL && errlen > 0)
    err[0] = '\0';

  if ((rc = import_qdata(d, w, err, errlen)))
    goto fail;
  if (int_zero) {
    if ((rc = import_int_zero(d, w, g, err, errlen)))
      goto fail;
  } else {
    memcpy(w->scale, d->scale.data, sb);
    if ((rc = check_finite("scale", sdt, w->scale, sb / ql_dtype_size(sdt),
                           cols, err, errlen)))
      goto fail;
    if (w->zero != NULL) {
      memcpy(w->zero, d->zero.data, sb);
      if ((rc = check_finite("zero", sdt, w->zero, sb / ql_dtype_size(sdt),
                             cols, err, errlen)))
        goto fail;
    }
  }
  if ((rc = check_range(w, cols, err, errlen)))
    goto fail;
  if (w->bias != NULL) {
    /* The bias may be unaligned, and ql_to_f32 does not widen in place:
     * from an aligned temporary copy. */
    esz = ql_array_dtype_size(d->bias.dtype);
    void *raw = malloc(nn * esz);
    if (raw == NULL) {
      rc = fail(err, errlen, QL_ENOMEM, "bias: out of memory");
      goto fail;
    }
    memcpy(raw, d->bias.data, nn * esz);
    ql_to_f32((ql_dtype)d->bias.dtype, raw, w->bias, nn);
    free(raw);
    if ((rc = check_finite("bias", QL_DTYPE_F32, w->bias, nn, 1, err,
                           errlen)))
      goto fail;
  }
built:
  /* What we built must be what the rest of the library accepts. */
  if ((rc = ql_qweight_check(w)) != 0) {
    rc = fail(err, errlen, QL_EINTERNAL, "import built an inconsistent "
              "weight (error %d)", rc);
    goto fail;
  }
  *out = w;
  return 0;

fail:
  ql_qweight_free(w);
  return rc;
}
