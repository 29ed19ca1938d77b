/*
 * convert.c - scalar and array conversions between f32 and the 16-bit
 * float types (IEEE binary16 "f16" and bfloat16 "bf16"), and scalar
 * conversions between f32 and float8 e4m3fn.
 *
 * Narrowing rounds to nearest, ties to even, like PyTorch's
 * tensor.to(torch.float16 / torch.bfloat16) (c10::Half / c10::BFloat16
 * round_to_nearest_even); f16 overflow gives ±Inf. NaN stays NaN and comes
 * out quiet with its sign and the top payload bits kept. Everything is done
 * on bit patterns, so the result does not depend on the FPU rounding mode,
 * on FTZ/DAZ or on the compiler contracting expressions.
 */
#include <math.h>
#include <string.h>

#include "ql_kernels.h"

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

float ql_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1Fu;
  uint32_t m = h & 0x3FFu;

  if (e == 0x1F) /* Inf, or NaN made quiet with its payload kept */
    return bits_f32(sign | 0x7F800000u | (m ? 0x00400000u | (m << 13) : 0));
  if (e == 0) {
    if (m == 0)
      return bits_f32(sign);
    /* Subnormal m·2^-24: shift the leading one up to the implicit bit. */
    e = 113;
    while (!(m & 0x400u)) {
      m <<= 1;
      e--;
    }
    return bits_f32(sign | (e << 23) | ((m & 0x3FFu) << 13));
  }
  return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t ql_f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7FFFFFFFu;

  if (ax > 0x7F800000u) /* NaN: quiet, top 9 payload bits kept */
    return (uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x1FFu));
  /* 65520 is the midpoint between 65504 (odd mantissa) and 2^16: ties go
   * to the even neighbour 2^16, which does not exist, hence Inf. */
  if (ax >= 0x477FF000u)
    return (uint16_t)(sign | 0x7C00u);
  if (ax >= 0x38800000u) { /* normal f16 range, >= 2^-14 */
    uint32_t r = ax + 0x0FFFu + ((ax >> 13) & 1u); /* ties to even */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
  }
  if (ax <= 0x33000000u) /* <= 2^-25, half the smallest subnormal: ties to 0 */
    return sign;
  /* Subnormal result: value / 2^-24 = mant >> (126 - e), rounded. */
  uint32_t e = ax >> 23;
  uint32_t mant = (ax & 0x7FFFFFu) | 0x800000u;
  uint32_t shift = 126 - e; /* 14..24 */
  uint32_t q = mant >> shift;
  uint32_t rem = mant & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u)))
    q++; /* may carry into 0x400, the smallest normal: still correct */
  return (uint16_t)(sign | q);
}

float ql_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  if ((u & 0x7FFFFFFFu) > 0x7F800000u)
    u |= 0x00400000u; /* quiet a signalling NaN */
  return bits_f32(u);
}

uint16_t ql_f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  /* A NaN whose payload sits only in the low 16 bits would truncate to
   * Inf, so NaNs are handled first and made quiet. */
  if ((x & 0x7FFFFFFFu) > 0x7F800000u)
    return (uint16_t)((x >> 16) | 0x0040u);
  /* Ties to even; overflow carries into the exponent and gives Inf. */
  x += 0x7FFFu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

/*
 * f32 -> e4m3fn, round to nearest even with saturation (see ql_kernels.h):
 * the same byte as torch 2.15's tensor.to(torch.float8_e4m3fn) for all 2^32
 * f32 inputs (compared offline). e4m3fn: bias 7, normal values
 * 2^-6 .. 448 = 1.75·2^8 (0x7E; 0x7F is NaN), subnormals m·2^-9.
 */
uint8_t ql_f32_to_e4m3(float f) {
  uint32_t x = f32_bits(f);
  uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
  uint32_t ax = x & 0x7FFFFFFFu;

  if (ax > 0x7F800000u)
    return (uint8_t)(sign | 0x7Fu);
  /* 448 and above, Inf included, saturate: without saturation 464 would be
   * the tie between 448 and 480, which does not exist (it is NaN). */
  if (ax >= 0x43E00000u)
    return (uint8_t)(sign | 0x7Eu);
  if (ax >= 0x3C800000u) { /* normal e4m3 range, >= 2^-6 */
    uint32_t r = ax + 0x7FFFFu + ((ax >> 20) & 1u); /* ties to even */
    /* rebias 127 -> 7; a carry out of the mantissa bumps the exponent,
     * and it cannot reach 0x7F since ax < 448 rounds to at most 448 */
    return (uint8_t)(sign | ((r >> 20) - (120u << 3)));
  }
  if (ax <= 0x3A800000u) /* <= 2^-10, half the smallest subnormal: ties to 0 */
    return sign;
  {
    /* Subnormal result: value / 2^-9 = mant >> (141 - e), rounded. */
    uint32_t e = ax >> 23; /* 117..120 */
    uint32_t mant = (ax & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 141 - e; /* 21..24 */
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u)))
      q++; /* may carry into 8, the smallest normal: still correct */
    return (uint8_t)(sign | q);
  }
}

float ql_e4m3_to_f32(uint8_t c) {
  uint32_t sign = (uint32_t)(c & 0x80u) << 24;
  uint32_t e = (c >> 3) & 0xFu, m = c & 0x7u;

  if (e == 0xF && m == 0x7) /* NaN: quiet, mantissa kept, like torch */
    return bits_f32(sign | 0x7FF00000u);
  if (e == 0) { /* subnormal m·2^-9, exact; m = 0 keeps the sign of zero */
    float v = (float)m * 0x1p-9f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((e + 120) << 23) | (m << 20));
}

void ql_to_f32(ql_dtype dt, const void *src, float *dst, size_t n) {
  const uint16_t *s16 = src;
  size_t i;

  switch (dt) {
  case QL_DTYPE_F32:
    memmove(dst, src, n * sizeof(float));
    return;
  case QL_DTYPE_F16:
    for (i = 0; i < n; i++)
      dst[i] = ql_f16_to_f32(s16[i]);
    return;
  case QL_DTYPE_BF16:
    for (i = 0; i < n; i++)
      dst[i] = ql_bf16_to_f32(s16[i]);
    return;
  }
  /* Invalid dtype (a caller bug): make the misuse visible, not silent. */
  for (i = 0; i < n; i++)
    dst[i] = NAN;
}

void ql_from_f32(ql_dtype dt, const float *src, void *dst, size_t n) {
  uint16_t *d16 = dst;
  size_t i;

  switch (dt) {
  case QL_DTYPE_F32:
    memmove(dst, src, n * sizeof(float));
    return;
  case QL_DTYPE_F16:
    for (i = 0; i < n; i++)
      d16[i] = ql_f32_to_f16(src[i]);
    return;
  case QL_DTYPE_BF16:
    for (i = 0; i < n; i++)
      d16[i] = ql_f32_to_bf16(src[i]);
    return;
  }
  /* Invalid dtype: nothing is written. */
}

float ql_load_f32(ql_dtype dt, const void *p, size_t i) {
  switch (dt) {
  case QL_DTYPE_F32: {
    float f;
    memcpy(&f, (const unsigned char *)p + i * sizeof f, sizeof f);
    return f;
  }
  case QL_DTYPE_F16:
    return ql_f16_to_f32(((const uint16_t *)p)[i]);
  case QL_DTYPE_BF16:
    return ql_bf16_to_f32(((const uint16_t *)p)[i]);
  }
  return NAN;
}

float ql_round_to(ql_dtype dt, float v) {
  switch (dt) {
  case QL_DTYPE_F16:
    return ql_f16_to_f32(ql_f32_to_f16(v));
  case QL_DTYPE_BF16:
    return ql_bf16_to_f32(ql_f32_to_bf16(v));
  default:
    return v;
  }
}
