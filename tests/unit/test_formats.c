/*
 * test_formats.c - unit tests for kernels/convert.c and kernels/formats.c:
 * f16/bf16/e4m3 conversions, weight sizes, q4g/q8c/q8b/f8r quantize, pack
 * and dequantize.
 *
 * Expected values are computed independently of the code under test: in
 * double precision (for f32 operands, one double operation rounded to float
 * is the correctly rounded f32 result) with a hand-written round half to
 * even, or written out by hand.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "import.h"
#include "ql_kernels.h"
#include "testutil.h"

/* ---------------------------------------------------------------- helpers */

/* v rounded to dt and widened back: what a stored scale reads as. */
static float narrow(ql_dtype dt, float v) {
  if (dt == QL_DTYPE_F16)
    return ql_f16_to_f32(ql_f32_to_f16(v));
  if (dt == QL_DTYPE_BF16)
    return ql_bf16_to_f32(ql_f32_to_bf16(v));
  return v;
}

static const ql_dtype all_dtypes[] = {QL_DTYPE_F32, QL_DTYPE_F16,
                                      QL_DTYPE_BF16};

/* Value of a f16 bit pattern, from the IEEE definition. */
static double f16_value(uint16_t h) {
  int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

/* ------------------------------------------------------------ conversions */

START_TEST(test_f16_exhaustive) {
  uint32_t h;
  for (h = 0; h < 65536; h++) {
    float f = ql_f16_to_f32((uint16_t)h);
    uint16_t back = ql_f32_to_f16(f);
    int e = (h >> 10) & 0x1F, m = h & 0x3FF;

    if (e == 0x1F && m != 0) {
      REQUIRE(isnan(f), "f16 %04x should widen to NaN", h);
      REQUIRE(!!signbit(f) == !!(h & 0x8000), "NaN sign %04x", h);
      REQUIRE(tu_f32_bits(f) & 0x00400000u, "NaN %04x not quiet", h);
      REQUIRE(back == (h | 0x200u), "NaN %04x came back as %04x", h,
                    back);
    } else if (e == 0x1F) {
      REQUIRE(isinf(f) && !!signbit(f) == !!(h & 0x8000), "Inf %04x", h);
      REQUIRE(back == h, "Inf %04x came back as %04x", h, back);
    } else {
      REQUIRE((double)f == f16_value((uint16_t)h),
                    "f16 %04x widened to %a, want %a", h, (double)f,
                    f16_value((uint16_t)h));
      REQUIRE(!!signbit(f) == !!(h & 0x8000), "sign of %04x", h);
      REQUIRE(back == h, "f16 %04x round trip gave %04x", h, back);
    }
  }
}
END_TEST

START_TEST(test_bf16_exhaustive) {
  uint32_t h;
  for (h = 0; h < 65536; h++) {
    float f = ql_bf16_to_f32((uint16_t)h);
    uint16_t back = ql_f32_to_bf16(f);

    if ((h & 0x7FFF) > 0x7F80) {
      REQUIRE(isnan(f), "bf16 %04x should widen to NaN", h);
      REQUIRE(tu_f32_bits(f) == ((h << 16) | 0x00400000u),
              "bf16 NaN %04x widened to %08x", h, tu_f32_bits(f));
      REQUIRE(back == (h | 0x40u), "NaN %04x came back as %04x", h,
                    back);
    } else {
      REQUIRE(tu_f32_bits(f) == h << 16, "bf16 %04x widened to %08x", h,
              tu_f32_bits(f));
      REQUIRE(back == h, "bf16 %04x round trip gave %04x", h, back);
    }
  }
}
END_TEST

START_TEST(test_f16_rounding_cases) {
  static const struct {
    uint32_t in;
    uint16_t out;
  } c[] = {
      {0x3F800000u, 0x3C00}, /* 1 */
      {0x3F801000u, 0x3C00}, /* 1 + 2^-11: tie, to even 1 */
      {0x3F801001u, 0x3C01}, /* just above the tie */
      {0x3F803000u, 0x3C02}, /* 1 + 3·2^-11: tie, to even 1 + 2^-9 */
      {0x3F802FFFu, 0x3C01}, /* just below that tie */
      {0x477FE000u, 0x7BFF}, /* 65504, the largest f16 */
      {0x477FEFFFu, 0x7BFF}, /* just below 65520 */
      {0x477FF000u, 0x7C00}, /* 65520: tie, rounds to even = Inf */
      {0x47800000u, 0x7C00}, /* 65536 */
      {0x501502F9u, 0x7C00}, /* 1e10 */
      {0x7F7FFFFFu, 0x7C00}, /* FLT_MAX */
      {0x7F800000u, 0x7C00}, /* Inf */
      {0xFF800000u, 0xFC00}, /* -Inf */
      {0xD01502F9u, 0xFC00}, /* -1e10 */
      {0x38800000u, 0x0400}, /* 2^-14, smallest normal */
      {0x387FE000u, 0x0400}, /* 2^-14 - 2^-25: tie 0x3FF/0x400, to even */
      {0x387FDFFFu, 0x03FF}, /* just below */
      {0x387FC000u, 0x03FF}, /* 2^-14 - 2^-24, the largest subnormal */
      {0x33800000u, 0x0001}, /* 2^-24, smallest subnormal */
      {0x33000000u, 0x0000}, /* 2^-25: tie, to even 0 */
      {0x33000001u, 0x0001}, /* just above */
      {0x33C00000u, 0x0002}, /* 3·2^-25: tie 1/2, to even 2 */
      {0x34200000u, 0x0002}, /* 5·2^-25: tie 2/3, to even 2 */
      {0x00000001u, 0x0000}, /* f32 subnormal */
      {0x80000000u, 0x8000}, /* -0 */
      {0xB3000000u, 0x8000}, /* -2^-25 */
      {0xBF801000u, 0xBC00}, /* -(1 + 2^-11) */
      {0x7FC00000u, 0x7E00}, /* quiet NaN */
      {0xFFC00000u, 0xFE00}, /* -NaN */
      {0x7F800001u, 0x7E00}, /* signalling NaN, payload below f16 bits */
      {0x7FA00000u, 0x7F00}, /* sNaN with a high payload bit: kept, quiet */
  };
  size_t i;
  for (i = 0; i < sizeof c / sizeof c[0]; i++) {
    uint16_t got = ql_f32_to_f16(tu_bits_f32(c[i].in));
    REQUIRE(got == c[i].out, "f32 %08x -> f16 %04x, want %04x", c[i].in,
                  got, c[i].out);
  }
}
END_TEST

START_TEST(test_bf16_rounding_cases) {
  static const struct {
    uint32_t in;
    uint16_t out;
  } c[] = {
      {0x3F808000u, 0x3F80}, /* 1 + 2^-8: tie, to even 1 */
      {0x3F808001u, 0x3F81}, /* just above */
      {0x3F818000u, 0x3F82}, /* 1 + 3·2^-8: tie, to even */
      {0x3F817FFFu, 0x3F81}, /* just below */
      {0x7F7F7FFFu, 0x7F7F}, /* below the overflow midpoint */
      {0x7F7F8000u, 0x7F80}, /* midpoint to 2^128: to even = Inf */
      {0x7F7FFFFFu, 0x7F80}, /* FLT_MAX */
      {0xFF7FFFFFu, 0xFF80}, /* -FLT_MAX */
      {0x7F800000u, 0x7F80}, /* Inf */
      {0x00008000u, 0x0000}, /* subnormal tie, to even 0 */
      {0x00018000u, 0x0002}, /* subnormal tie, to even 2 */
      {0x80000000u, 0x8000}, /* -0 */
      {0x7FC00000u, 0x7FC0}, /* quiet NaN */
      {0x7F800001u, 0x7FC0}, /* sNaN whose payload truncation would be Inf */
      {0xFF800001u, 0xFFC0}, /* negative sNaN */
      {0x7FFFFFFFu, 0x7FFF}, /* NaN with all payload bits */
  };
  size_t i;
  for (i = 0; i < sizeof c / sizeof c[0]; i++) {
    uint16_t got = ql_f32_to_bf16(tu_bits_f32(c[i].in));
    REQUIRE(got == c[i].out, "f32 %08x -> bf16 %04x, want %04x",
                  c[i].in, got, c[i].out);
  }
}
END_TEST

/* Whether h16 (magnitude bits hm) is a nearest neighbour of x, ties even,
 * among the representable magnitudes hm-1 and hm+1 (val gives values). */
static int is_nearest(double ax, uint32_t hm, uint32_t top,
                      double (*val)(uint32_t)) {
  double d = fabs(ax - val(hm));
  if (hm > 0) {
    double dl = fabs(ax - val(hm - 1));
    if (dl < d || (dl == d && (hm & 1)))
      return 0;
  }
  if (hm + 1 < top) {
    double du = fabs(ax - val(hm + 1));
    if (du < d || (du == d && (hm & 1)))
      return 0;
  }
  return 1;
}

static double f16_mag(uint32_t hm) { return f16_value((uint16_t)hm); }
static double bf16_mag(uint32_t hm) { return (double)tu_bits_f32(hm << 16); }
static double e4m3_mag(uint32_t cm) { return tu_e4m3_value(cm); }

START_TEST(test_narrowing_random_nearest) {
  uint64_t rng = 11;
  int i;

  for (i = 0; i < 200000; i++) {
    /* f16: magnitudes 2^-26 .. 2^17, so subnormals and overflow occur. */
    int e = (int)(tu_rng_next(&rng) % 44) - 26;
    float x =
        ldexpf(1.0f + (float)(tu_rng_next(&rng) & 0x7FFFFF) * 0x1p-23f, e);
    uint16_t h;
    uint32_t hm;

    if (tu_rng_next(&rng) & 1)
      x = -x;
    h = ql_f32_to_f16(x);
    REQUIRE(!!(h & 0x8000) == !!signbit(x), "sign of %a", (double)x);
    hm = h & 0x7FFF;
    if (fabsf(x) >= 65520.0f) {
      REQUIRE(hm == 0x7C00, "%a should overflow to Inf", (double)x);
    } else {
      REQUIRE(hm < 0x7C00, "%a gave non-finite %04x", (double)x, h);
      REQUIRE(is_nearest(fabs((double)x), hm, 0x7C00, f16_mag),
                    "f16 of %a is %04x: not the nearest-even", (double)x, h);
    }

    /* bf16: any finite f32. */
    {
      uint32_t u = (uint32_t)tu_rng_next(&rng);
      uint16_t b;
      if ((u & 0x7F800000u) == 0x7F800000u)
        u &= 0xBFFFFFFFu; /* avoid Inf/NaN */
      x = tu_bits_f32(u);
      b = ql_f32_to_bf16(x);
      hm = b & 0x7FFF;
      REQUIRE(!!(b & 0x8000) == !!(u >> 31), "bf16 sign of %08x", u);
      if ((u & 0x7FFFFFFFu) >= 0x7F7F8000u)
        REQUIRE(hm == 0x7F80, "%08x should overflow to Inf", u);
      else
        REQUIRE(is_nearest(fabs((double)x), hm, 0x7F80, bf16_mag),
                      "bf16 of %08x is %04x: not the nearest-even", u, b);
    }
  }
}
END_TEST

/*
 * e4m3fn: all 256 codes widen to their defined value and narrow back to
 * themselves (-0 included); the NaN codes widen to torch's quiet NaN.
 */
START_TEST(test_e4m3_all_codes) {
  uint32_t c;
  for (c = 0; c < 256; c++) {
    float f = ql_e4m3_to_f32((uint8_t)c);
    if ((c & 0x7F) == 0x7F) {
      REQUIRE(isnan(f), "e4m3 %02x should widen to NaN", c);
      REQUIRE(tu_f32_bits(f) == ((c & 0x80 ? 0x80000000u : 0) | 0x7FF00000u),
              "e4m3 NaN %02x widened to %08x", c, tu_f32_bits(f));
      REQUIRE(ql_f32_to_e4m3(f) == c, "NaN %02x came back as %02x", c,
              ql_f32_to_e4m3(f));
      continue;
    }
    REQUIRE((double)f == tu_e4m3_value(c), "e4m3 %02x widened to %a, want %a", c,
            (double)f, tu_e4m3_value(c));
    REQUIRE(!!signbit(f) == !!(c & 0x80), "sign of %02x", c);
    REQUIRE(ql_f32_to_e4m3(f) == c, "e4m3 %02x round trip gave %02x", c,
            ql_f32_to_e4m3(f));
    REQUIRE(tu_e4m3_nearest((double)f) == c, "test encoder disagrees on %02x", c);
  }
  /* the landmarks of the format */
  ck_assert(ql_e4m3_to_f32(0x7E) == 448.0f);
  ck_assert(ql_e4m3_to_f32(0x01) == 0x1p-9f);
  ck_assert(ql_e4m3_to_f32(0x07) == 7.0f * 0x1p-9f);
  ck_assert(ql_e4m3_to_f32(0x08) == 0x1p-6f);
  ck_assert(ql_e4m3_to_f32(0x38) == 1.0f);
  ck_assert(ql_e4m3_to_f32(0xB9) == -1.125f);
}
END_TEST

/*
 * Every rounding boundary: for each pair of consecutive finite e4m3
 * magnitudes (including 0 and the subnormal/normal seam) the midpoint is a
 * tie that goes to the even code, and the f32 neighbours of the midpoint
 * go to the nearer code; both signs.
 */
START_TEST(test_e4m3_boundaries) {
  uint32_t c;
  for (c = 0; c < 0x7E; c++) {
    float lo = (float)tu_e4m3_value(c), hi = (float)tu_e4m3_value(c + 1);
    float mid = (float)(((double)lo + hi) / 2); /* exact: few bits */
    uint32_t even = (c & 1) ? c + 1 : c, sg;

    REQUIRE((double)mid == ((double)lo + hi) / 2, "midpoint %02x inexact", c);
    for (sg = 0; sg < 2; sg++) {
      float sgn = sg ? -1.0f : 1.0f;
      uint32_t sb = sg ? 0x80u : 0u;
      REQUIRE(ql_f32_to_e4m3(sgn * lo) == (c | sb), "exact %02x", c | sb);
      REQUIRE(ql_f32_to_e4m3(sgn * mid) == (even | sb),
              "tie %a between %02x/%02x gave %02x", (double)(sgn * mid), c,
              c + 1, ql_f32_to_e4m3(sgn * mid));
      REQUIRE(ql_f32_to_e4m3(sgn * nextafterf(mid, 0.0f)) == (c | sb),
              "just below the tie %02x/%02x", c, c + 1);
      REQUIRE(ql_f32_to_e4m3(sgn * nextafterf(mid, 1000.0f)) == ((c + 1) | sb),
              "just above the tie %02x/%02x", c, c + 1);
    }
  }
}
END_TEST

/* Hand-picked f32 -> e4m3 cases. This table (and every boundary above) was
 * cross-checked offline against torch 2.15:
 *   torch.tensor(vals).to(torch.float8_e4m3fn).view(torch.uint8)
 * which also agreed with ql_f32_to_e4m3 on all 2^32 f32 inputs. */
START_TEST(test_e4m3_rounding_cases) {
  static const struct {
    uint32_t in;
    uint8_t out;
  } c[] = {
      {0x00000000u, 0x00}, /* 0 */
      {0x80000000u, 0x80}, /* -0 */
      {0x3F800000u, 0x38}, /* 1 */
      {0x3F880000u, 0x38}, /* 1.0625: tie, to even 1 */
      {0x3F880001u, 0x39}, /* just above */
      {0x3F980000u, 0x3A}, /* 1.1875: tie, to even 1.25 */
      {0x43680000u, 0x76}, /* 232: tie 224/240, to even 224 */
      {0x43780000u, 0x78}, /* 248: tie 240/256, to even 256 */
      {0x43700000u, 0x77}, /* 240 */
      {0x43D00000u, 0x7D}, /* 416 */
      {0x43D80000u, 0x7E}, /* 432: tie 416/448, to even 448 */
      {0x43D7FFFFu, 0x7D}, /* just below */
      {0x43E00000u, 0x7E}, /* 448, the largest */
      {0x43E00001u, 0x7E}, /* above 448: saturates */
      {0x43E80000u, 0x7E}, /* 464, would tie with 480: saturates */
      {0x43F00000u, 0x7E}, /* 480 */
      {0x7149F2CAu, 0x7E}, /* 1e30 */
      {0x7F7FFFFFu, 0x7E}, /* FLT_MAX */
      {0x7F800000u, 0x7E}, /* Inf saturates too (torch 2.15) */
      {0xFF800000u, 0xFE}, /* -Inf */
      {0xC3FA0000u, 0xFE}, /* -500 */
      {0x3C800000u, 0x08}, /* 2^-6, the smallest normal */
      {0x3C700000u, 0x08}, /* 7.5·2^-9: tie 7/8, to even 8 */
      {0x3C6FFFFFu, 0x07}, /* just below */
      {0x3C600000u, 0x07}, /* 7·2^-9, the largest subnormal */
      {0x3B000000u, 0x01}, /* 2^-9, the smallest subnormal */
      {0x3A800000u, 0x00}, /* 2^-10: tie 0/1, to even 0 */
      {0x3A800001u, 0x01}, /* just above */
      {0x3B400000u, 0x02}, /* 3·2^-10: tie 1/2, to even 2 */
      {0x3BA00000u, 0x02}, /* 5·2^-10: tie 2/3 (·2^-9), to even 2 */
      {0xBA800000u, 0x80}, /* -2^-10 */
      {0x00000001u, 0x00}, /* f32 subnormal */
      {0x7FC00000u, 0x7F}, /* quiet NaN */
      {0xFFC00000u, 0xFF}, /* -NaN */
      {0x7F800001u, 0x7F}, /* signalling NaN */
      {0xFF800001u, 0xFF}, /* negative signalling NaN */
  };
  size_t i;
  for (i = 0; i < sizeof c / sizeof c[0]; i++) {
    uint8_t got = ql_f32_to_e4m3(tu_bits_f32(c[i].in));
    REQUIRE(got == c[i].out, "f32 %08x -> e4m3 %02x, want %02x", c[i].in, got,
            c[i].out);
  }
}
END_TEST

/* Random f32 values around the whole e4m3 range: the code is a nearest
 * e4m3 value, ties to even (among its neighbours), or saturated. */
START_TEST(test_e4m3_random_nearest) {
  uint64_t rng = 13;
  int i;

  for (i = 0; i < 200000; i++) {
    /* magnitudes 2^-12 .. 2^10: zero flush, subnormals, saturation */
    int e = (int)(tu_rng_next(&rng) % 22) - 12;
    float x =
        ldexpf(1.0f + (float)(tu_rng_next(&rng) & 0x7FFFFF) * 0x1p-23f, e);
    uint8_t c;
    uint32_t cm;

    if (tu_rng_next(&rng) & 1)
      x = -x;
    c = ql_f32_to_e4m3(x);
    cm = c & 0x7Fu;
    REQUIRE(!!(c & 0x80) == !!signbit(x), "e4m3 sign of %a", (double)x);
    if (fabsf(x) >= 448.0f)
      REQUIRE(cm == 0x7E, "%a should saturate", (double)x);
    else
      REQUIRE(cm < 0x7F && is_nearest(fabs((double)x), cm, 0x7F, e4m3_mag),
              "e4m3 of %a is %02x: not the nearest-even", (double)x, c);
    REQUIRE(c == tu_e4m3_nearest((double)x), "e4m3 of %a: %02x vs %02x", (double)x,
            c, tu_e4m3_nearest((double)x));
  }
}
END_TEST

START_TEST(test_array_conversions) {
  float src[5] = {1.0f, -2.5f, 65504.0f, 1e-8f, 3.0e5f};
  float back[5], scratch[5];
  uint16_t h[5];
  size_t i;

  ql_from_f32(QL_DTYPE_F16, src, h, 5);
  for (i = 0; i < 5; i++)
    ck_assert_uint_eq(h[i], ql_f32_to_f16(src[i]));
  ck_assert_uint_eq(h[4], 0x7C00); /* 3e5 overflows f16 */
  ql_to_f32(QL_DTYPE_F16, h, back, 5);
  for (i = 0; i < 5; i++) {
    ck_assert(tu_f32_bits(back[i]) == tu_f32_bits(ql_f16_to_f32(h[i])));
    ck_assert(tu_f32_bits(ql_load_f32(QL_DTYPE_F16, h, i)) ==
              tu_f32_bits(back[i]));
  }

  ql_from_f32(QL_DTYPE_BF16, src, h, 5);
  for (i = 0; i < 5; i++)
    ck_assert_uint_eq(h[i], ql_f32_to_bf16(src[i]));
  ql_to_f32(QL_DTYPE_BF16, h, back, 5);
  for (i = 0; i < 5; i++)
    ck_assert(tu_f32_bits(back[i]) == tu_f32_bits(ql_bf16_to_f32(h[i])));

  ql_from_f32(QL_DTYPE_F32, src, scratch, 5);
  ck_assert(memcmp(scratch, src, sizeof src) == 0);
  ql_to_f32(QL_DTYPE_F32, src, back, 5);
  ck_assert(memcmp(back, src, sizeof src) == 0);
  for (i = 0; i < 5; i++)
    ck_assert(tu_f32_bits(ql_load_f32(QL_DTYPE_F32, src, i)) ==
              tu_f32_bits(src[i]));

  /* An invalid dtype: NaN on widening, nothing written on narrowing. */
  ql_to_f32((ql_dtype)0, src, back, 5);
  for (i = 0; i < 5; i++)
    ck_assert(isnan(back[i]));
  memset(h, 0xAB, sizeof h);
  ql_from_f32((ql_dtype)7, src, h, 5);
  for (i = 0; i < 5; i++)
    ck_assert_uint_eq(h[i], 0xABAB);
  ck_assert(isnan(ql_load_f32((ql_dtype)9, src, 0)));
}
END_TEST

/* ------------------------------------------------------------------ sizes */

START_TEST(test_group_size_valid) {
  uint32_t gs;
  for (gs = 0; gs <= 512; gs++) {
    int want = gs == 32 || gs == 64 || gs == 128 || gs == 256;
    REQUIRE(ql_group_size_valid(QL_FORMAT_Q4G, gs) == want, "gs %u", gs);
  }
  for (gs = 0; gs <= 512; gs++) {
    int want = gs == 32 || gs == 64 || gs == 128 || gs == 256;
    REQUIRE(ql_group_size_valid(QL_FORMAT_Q8B, gs) == want, "q8b gs %u", gs);
  }
  ck_assert(ql_group_size_valid(QL_FORMAT_Q8C, 0));
  ck_assert(ql_group_size_valid(QL_FORMAT_Q8C, 77));
  ck_assert(ql_group_size_valid(QL_FORMAT_F8R, 0));
  ck_assert(ql_group_size_valid(QL_FORMAT_F8R, 77));
  ck_assert(!ql_group_size_valid((ql_format)0, 32));
  ck_assert(!ql_group_size_valid((ql_format)9, 32));
}
END_TEST

START_TEST(test_sizes) {
  size_t qb = 0, sb = 0;
  int64_t g = 0;

  ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q4G, 32, 3, 33, QL_DTYPE_BF16,
                                    &qb, &sb, &g), 0);
  ck_assert_uint_eq(qb, 3 * 17);
  ck_assert_uint_eq(sb, 2 * 3 * 2);
  ck_assert_int_eq(g, 2);
  ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q4G, 256, 5, 1000, QL_DTYPE_F32,
                                    &qb, &sb, &g), 0);
  ck_assert_uint_eq(qb, 5 * 500);
  ck_assert_uint_eq(sb, 4 * 5 * 4);
  ck_assert_int_eq(g, 4);
  ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q4G, 64, 1, 1, QL_DTYPE_F16, &qb,
                                    &sb, &g), 0);
  ck_assert_uint_eq(qb, 1);
  ck_assert_uint_eq(sb, 2);
  ck_assert_int_eq(g, 1);
  /* q8c ignores gs */
  ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q8C, 0, 3, 33, QL_DTYPE_F16, &qb,
                                    &sb, &g), 0);
  ck_assert_uint_eq(qb, 99);
  ck_assert_uint_eq(sb, 6);
  ck_assert_int_eq(g, 1);
  /* q8b: one byte per value, [ceil(K/B), N] scales, ragged last block */
  ck_assert_int_eq(
      ql_qweight_sizes(QL_FORMAT_Q8B, 32, 3, 33, QL_DTYPE_BF16, &qb, &sb, &g),
      0);
  ck_assert_uint_eq(qb, 99);
  ck_assert_uint_eq(sb, 2 * 3 * 2);
  ck_assert_int_eq(g, 2);
  ck_assert_int_eq(
      ql_qweight_sizes(QL_FORMAT_Q8B, 256, 5, 1000, QL_DTYPE_F32, &qb, &sb, &g),
      0);
  ck_assert_uint_eq(qb, 5000);
  ck_assert_uint_eq(sb, 4 * 5 * 4);
  ck_assert_int_eq(g, 4);
  ck_assert_int_eq(
      ql_qweight_sizes(QL_FORMAT_Q8B, 64, 3, 128, QL_DTYPE_F16, &qb, &sb, &g),
      0); /* no ragged block */
  ck_assert_uint_eq(qb, 384);
  ck_assert_uint_eq(sb, 2 * 3 * 2);
  ck_assert_int_eq(g, 2);
  /* f8r: one code per value, [N] scales, gs ignored */
  ck_assert_int_eq(
      ql_qweight_sizes(QL_FORMAT_F8R, 7, 3, 33, QL_DTYPE_F32, &qb, &sb, &g), 0);
  ck_assert_uint_eq(qb, 99);
  ck_assert_uint_eq(sb, 12);
  ck_assert_int_eq(g, 1);
  /* every output may be NULL */
  ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q8C, 0, 3, 33, QL_DTYPE_F16,
                                    NULL, NULL, NULL), 0);
  /* the largest accepted shape: computed in size_t, no int overflow */
  if (sizeof(size_t) >= 8) {
    ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q4G, 32, QL_DIM_MAX,
                                      QL_DIM_MAX, QL_DTYPE_F32, &qb, &sb, &g),
                     0);
    ck_assert_uint_eq(qb, (size_t)QL_DIM_MAX * (((size_t)QL_DIM_MAX + 1) / 2));
    ck_assert_int_eq(g, (QL_DIM_MAX + 31) / 32);
    ck_assert_uint_eq(sb, (size_t)g * (size_t)QL_DIM_MAX * 4);
  } else {
    ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q8C, 0, QL_DIM_MAX,
                                      QL_DIM_MAX, QL_DTYPE_F32, &qb, &sb, &g),
                     QL_ESHAPE);
  }
}
END_TEST

START_TEST(test_sizes_reject) {
  size_t qb = 7;
  ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q4G, 16, 1, 64, QL_DTYPE_BF16,
                                    &qb, NULL, NULL), QL_EINVAL);
  ck_assert_uint_eq(qb, 7); /* untouched on failure */
  ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q4G, 0, 1, 64, QL_DTYPE_BF16,
                                    NULL, NULL, NULL), QL_EINVAL);
  ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q4G, 512, 1, 64, QL_DTYPE_BF16,
                                    NULL, NULL, NULL), QL_EINVAL);
  ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q4G, 32, 0, 64, QL_DTYPE_BF16,
                                    NULL, NULL, NULL), QL_ESHAPE);
  ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q4G, 32, 4, 0, QL_DTYPE_BF16,
                                    NULL, NULL, NULL), QL_ESHAPE);
  ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q8C, 0, -1, 4, QL_DTYPE_BF16,
                                    NULL, NULL, NULL), QL_ESHAPE);
  ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q8C, 0, 4, INT64_MIN,
                                    QL_DTYPE_BF16, NULL, NULL, NULL),
                   QL_ESHAPE);
  ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q8C, 0, QL_DIM_MAX + 1, 4,
                                    QL_DTYPE_BF16, NULL, NULL, NULL),
                   QL_ESHAPE);
  ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q4G, 32, 4, QL_DIM_MAX + 1,
                                    QL_DTYPE_BF16, NULL, NULL, NULL),
                   QL_ESHAPE);
  ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q8C, 0, INT64_MAX, INT64_MAX,
                                    QL_DTYPE_F32, NULL, NULL, NULL),
                   QL_ESHAPE);
  ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q4G, 32, 4, 64, (ql_dtype)0,
                                    NULL, NULL, NULL), QL_EDTYPE);
  ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q4G, 32, 4, 64, (ql_dtype)4,
                                    NULL, NULL, NULL), QL_EDTYPE);
  /* q8b takes q4g's block lengths; f8r ignores gs */
  ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q8B, 48, 4, 64, QL_DTYPE_BF16,
                                    NULL, NULL, NULL),
                   QL_EINVAL);
  ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q8B, 0, 4, 64, QL_DTYPE_BF16,
                                    NULL, NULL, NULL),
                   QL_EINVAL);
  ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_Q8B, 32, 4, 64, QL_DTYPE_BF16,
                                    NULL, NULL, NULL),
                   0);
  ck_assert_int_eq(ql_qweight_sizes(QL_FORMAT_F8R, 0, 4, 64, QL_DTYPE_BF16,
                                    NULL, NULL, NULL),
                   0);
  ck_assert_int_eq(
      ql_qweight_sizes(QL_FORMAT_F8R, 0, 4, 64, (ql_dtype)0, NULL, NULL, NULL),
      QL_EDTYPE);
  ck_assert_int_eq(ql_qweight_sizes((ql_format)5, 32, 4, 64, QL_DTYPE_BF16,
                                    NULL, NULL, NULL),
                   QL_EFORMAT);
  ck_assert_int_eq(ql_qweight_sizes((ql_format)0, 32, 4, 64, QL_DTYPE_BF16,
                                    NULL, NULL, NULL), QL_EFORMAT);
  ck_assert_int_eq(ql_qweight_sizes((ql_format)99, 32, 4, 64, QL_DTYPE_BF16,
                                    NULL, NULL, NULL), QL_EFORMAT);
}
END_TEST

/* ------------------------------------------------------- quantize helpers */

typedef struct cfg {
  ql_format f;
  uint32_t gs;
  int asym; /* q8b only */
} cfg;

static const cfg cfgs[] = {
    {QL_FORMAT_Q4G, 32, 0},  {QL_FORMAT_Q4G, 64, 0},  {QL_FORMAT_Q4G, 128, 0},
    {QL_FORMAT_Q4G, 256, 0}, {QL_FORMAT_Q8C, 0, 0},   {QL_FORMAT_Q8B, 32, 0},
    {QL_FORMAT_Q8B, 32, 1},  {QL_FORMAT_Q8B, 64, 0},  {QL_FORMAT_Q8B, 64, 1},
    {QL_FORMAT_Q8B, 128, 0}, {QL_FORMAT_Q8B, 128, 1}, {QL_FORMAT_Q8B, 256, 0},
    {QL_FORMAT_Q8B, 256, 1}, {QL_FORMAT_F8R, 0, 0},
};
#define NCFG ((int)(sizeof cfgs / sizeof cfgs[0]))

/* The quantize parameters of a configuration with scale dtype sdt. */
static ql_quant_params params_of(const cfg *c, ql_dtype sdt) {
  ql_quant_params p;
  memset(&p, 0, sizeof p);
  p.format = c->f;
  p.group_size = c->gs;
  p.asymmetric = c->asym;
  p.scale_dtype = sdt;
  return p;
}

static ql_qweight *quantize_p(const ql_quant_params *p, int64_t n, int64_t k,
                              const float *w, const float *bias) {
  ql_qweight *q = NULL;
  int rc = ql_qweight_quantize(p, n, k, QL_DTYPE_F32, w, bias, &q);
  REQUIRE(rc == 0, "quantize f=%d gs=%u asym=%d n=%lld k=%lld: rc %d",
          (int)p->format, p->group_size, p->asymmetric, (long long)n,
          (long long)k, rc);
  ck_assert_ptr_nonnull(q);
  return q;
}

/* The positional form the argument tests use: {f, gs, asymmetric 0, sdt}. */
static int quantize_args(ql_format f, uint32_t gs, int64_t n, int64_t k,
                         ql_dtype src, const void *w, const void *bias,
                         ql_dtype sdt, ql_qweight **out) {
  ql_quant_params p;
  memset(&p, 0, sizeof p);
  p.format = f;
  p.group_size = gs;
  p.scale_dtype = sdt;
  return ql_qweight_quantize(&p, n, k, src, w, bias, out);
}

/* The same with a configuration's format, group size and asymmetry. */
static int quantize_c(const cfg *c, int64_t n, int64_t k, ql_dtype src,
                      const void *w, const void *bias, ql_dtype sdt,
                      ql_qweight **out) {
  ql_quant_params p = params_of(c, sdt);
  return ql_qweight_quantize(&p, n, k, src, w, bias, out);
}

static ql_qweight *quantize_ok(ql_format f, uint32_t gs, int64_t n, int64_t k,
                               const float *w, const float *bias,
                               ql_dtype sdt) {
  cfg c = {f, gs, 0};
  ql_quant_params p = params_of(&c, sdt);
  return quantize_p(&p, n, k, w, bias);
}

static ql_qweight *quantize_cfg(const cfg *c, int64_t n, int64_t k,
                                const float *w, const float *bias,
                                ql_dtype sdt) {
  ql_quant_params p = params_of(c, sdt);
  return quantize_p(&p, n, k, w, bias);
}

/* The q4g value of row r, column i, read from the packed bytes. */
static int q4g_at(const ql_qweight *q, int64_t r, int64_t i) {
  return tu_s4_at(q->qdata + r * ((q->k + 1) / 2), i);
}

static int q8c_at(const ql_qweight *q, int64_t r, int64_t i) {
  return ((const int8_t *)q->qdata)[r * q->k + i];
}

/* q8b shares q8c's [N, K] int8 layout; f8r holds [N, K] e4m3 codes. */
#define q8b_at q8c_at
static unsigned f8r_at(const ql_qweight *q, int64_t r, int64_t i) {
  return q->qdata[r * q->k + i];
}

/*
 * q8b row r (x its f32 values, dq its dequantized values) against the
 * spec in double arithmetic, block by block. Symmetric blocks: the q8c
 * rule on the block. Asymmetric blocks: the q4g rule with 255 steps and
 * offset 128. Returns Σ (x - x̂)² and adds Σ Δ²/12 to *sref.
 */
static double check_q8b_row(const ql_qweight *q, ql_dtype rd, const float *x,
                            const float *dq, int64_t r, double *sref) {
  int64_t n = q->n, k = q->k, bs = q->group_size, b, k0, i;
  const double u = 0x1p-24;
  double sse = 0.0;

  REQUIRE((q->zero != NULL) == (q->asymmetric == 1), "q8b zero/asymmetric");
  for (b = 0, k0 = 0; k0 < k; b++, k0 += bs) {
    int64_t k1 = k0 + bs < k ? k0 + bs : k;
    size_t si = (size_t)(b * n + r);
    float s_st = ql_load_f32(q->scale_dtype, q->scale, si);

    if (!q->asymmetric) {
      float amax = 0.0f, s, inv;
      for (i = k0; i < k1; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
      s = (float)((double)amax / 127.5);
      if (s < FLT_EPSILON)
        s = FLT_EPSILON;
      REQUIRE(tu_f32_bits(s_st) == tu_f32_bits(narrow(rd, s)),
              "q8b scale r%lld b%lld: %a want %a", (long long)r, (long long)b,
              (double)s_st, (double)narrow(rd, s));
      inv = (float)(1.0 / (double)s_st);
      for (i = k0; i < k1; i++) {
        double t = tu_rne((double)(float)((double)x[i] * (double)inv));
        int want = (int)(t < -128 ? -128 : t > 127 ? 127 : t);
        int got = q8b_at(q, r, i);
        double err = fabs((double)x[i] - (double)dq[i]), bound;

        REQUIRE(got == want, "q8b sym q[%lld,%lld] = %d, want %d", (long long)r,
                (long long)i, got, want);
        if (fabsf(x[i]) == amax && s > FLT_EPSILON)
          REQUIRE(abs(got) >= 127, "block amax maps to %d", got);
        REQUIRE(tu_f32_bits(dq[i]) == tu_f32_bits((float)((double)got * s_st)),
                "q8b x̂[%lld,%lld] = %a", (long long)r, (long long)i,
                (double)dq[i]);
        bound = 0.5 * s_st + 127.5 * fabs((double)s - s_st) +
                8.0 * u * (fabs((double)x[i]) + fabs((double)dq[i]));
        REQUIRE(err <= bound, "q8b sym |x - x̂| = %g > %g at [%lld,%lld] (%s)",
                err, bound, (long long)r, (long long)i,
                tu_dtype_name(q->scale_dtype));
        sse += err * err;
        *sref += (double)s_st * s_st / 12.0;
      }
    } else {
      float mn = x[k0], mx = x[k0], rng, s, z, z_st;
      for (i = k0; i < k1; i++) {
        mn = x[i] < mn ? x[i] : mn;
        mx = x[i] > mx ? x[i] : mx;
      }
      rng = (float)((double)mx - (double)mn);
      if (rng < 1e-6f)
        rng = 1e-6f;
      s = (float)((double)rng / 255.0);
      z = (float)((double)mn + 128.0 * (double)s);
      z_st = ql_load_f32(q->scale_dtype, q->zero, si);
      REQUIRE(tu_f32_bits(s_st) == tu_f32_bits(narrow(rd, s)),
              "q8b scale r%lld b%lld: %a want %a", (long long)r, (long long)b,
              (double)s_st, (double)narrow(rd, s));
      REQUIRE(tu_f32_bits(z_st) == tu_f32_bits(narrow(rd, z)),
              "q8b zero r%lld b%lld: %a want %a", (long long)r, (long long)b,
              (double)z_st, (double)narrow(rd, z));
      for (i = k0; i < k1; i++) {
        float d = (float)((double)x[i] - (double)mn);
        double t = tu_rne((double)(float)((double)d / (double)s));
        int want = (int)(t < 0 ? 0 : t > 255 ? 255 : t) - 128;
        int got = q8b_at(q, r, i);
        float xh = dq[i];
        double err = fabs((double)x[i] - (double)xh), bound;

        REQUIRE(got == want, "q8b asym q[%lld,%lld] = %d, want %d",
                (long long)r, (long long)i, got, want);
        REQUIRE(x[i] != mn || got == -128, "block min maps to %d", got);
        REQUIRE(x[i] != mx || (double)mx - mn < 1e-6 || got == 127,
                "block max maps to %d", got);
        REQUIRE(tu_f32_bits(xh) ==
                    tu_f32_bits((float)((double)(float)((double)got * s_st) +
                                        (double)z_st)),
                "q8b x̂[%lld,%lld] = %a", (long long)r, (long long)i,
                (double)xh);
        bound = 0.5 * s + 128.0 * fabs((double)s_st - s) +
                fabs((double)z_st - z) +
                4.0 * u *
                    (256.0 * s + fabs((double)x[i] - mn) + fabs(z) +
                     fabs(got * (double)s_st) + fabs((double)xh));
        REQUIRE(err <= bound, "q8b asym |x - x̂| = %g > %g at [%lld,%lld] (%s)",
                err, bound, (long long)r, (long long)i,
                tu_dtype_name(q->scale_dtype));
        sse += err * err;
        *sref += (double)s_st * s_st / 12.0;
      }
    }
  }
  return sse;
}

/*
 * f8r row r against the spec in double arithmetic: scale =
 * max(amax, 1e-12f) / 448 correctly rounded, then rounded to the scale
 * dtype; q = the nearest-even e4m3 code of clamp(x / stored scale, ±448)
 * by exhaustive search (0 when an f16 scale underflows to 0); x̂ = e4m3(q)
 * · scale in one f32 rounding. Returns Σ (x - x̂)² and adds Σ Δ²/12 to
 * *sref, Δ being the e4m3 step at x / scale times the scale.
 */
static double check_f8r_row(const ql_qweight *q, ql_dtype rd, const float *x,
                            const float *dq, int64_t r, double *sref) {
  int64_t k = q->k, i;
  const double u = 0x1p-24;
  float amax = 0.0f, s, s_st;
  double sse = 0.0;

  for (i = 0; i < k; i++)
    amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
  s = (float)((double)(amax > 1e-12f ? amax : 1e-12f) / 448.0);
  s_st = ql_load_f32(q->scale_dtype, q->scale, (size_t)r);
  REQUIRE(tu_f32_bits(s_st) == tu_f32_bits(narrow(rd, s)),
          "f8r scale r%lld: %a want %a", (long long)r, (double)s_st,
          (double)narrow(rd, s));
  for (i = 0; i < k; i++) {
    unsigned got = f8r_at(q, r, i), want;
    float xh = dq[i];
    double t = 0.0, tc, err = fabs((double)x[i] - (double)xh), bound, step;

    if (s_st == 0.0f) {
      want = 0;
      step = 0.0;
      bound = fabs((double)x[i]);
    } else {
      t = (double)(float)((double)x[i] / (double)s_st);
      tc = t < -448.0 ? -448.0 : t > 448.0 ? 448.0 : t;
      want = tu_e4m3_nearest(tc);
      step = tu_e4m3_ulp(fabs(tc));
      bound = (double)s_st * (0.5 * step + fmax(0.0, fabs(t) - 448.0)) +
              4.0 * u * (fabs((double)x[i]) + fabs((double)xh));
    }
    REQUIRE(got == want, "f8r q[%lld,%lld] = %02x, want %02x (x %a, t %a)",
            (long long)r, (long long)i, got, want, (double)x[i], t);
    REQUIRE((got & 0x7F) != 0x7F, "f8r NaN code at [%lld,%lld]", (long long)r,
            (long long)i);
    if (fabsf(x[i]) == amax && amax >= 1e-12f &&
        fabs((double)s_st - s) <= 0x1p-8 * s)
      REQUIRE((got & 0x7F) == 0x7E, "f8r amax maps to %02x", got);
    REQUIRE(tu_f32_bits(xh) ==
                tu_f32_bits((float)(tu_e4m3_value(got) * (double)s_st)),
            "f8r x̂[%lld,%lld] = %a", (long long)r, (long long)i, (double)xh);
    REQUIRE(err <= bound, "f8r |x - x̂| = %g > %g at [%lld,%lld] (%s)", err,
            bound, (long long)r, (long long)i, tu_dtype_name(q->scale_dtype));
    sse += err * err;
    *sref += (double)s_st * step * ((double)s_st * step) / 12.0;
  }
  return sse;
}

/*
 * Checks one quantized weight against an independent evaluation of the
 * spec (double arithmetic, hand-written round half to even), then checks
 * dequantize: exact formula, and |x - x̂| within the bound derived from the
 * unrounded and stored parameters. Returns Σ (x - x̂)² and, in *ref,
 * Σ Δ²/12 with Δ the stored step of each element. rd is the dtype the
 * parameters were rounded to before being stored in q->scale_dtype.
 */
static double check_weight_rd(const ql_qweight *q, const float *w,
                              double *ref, ql_dtype rd) {
  int64_t n = q->n, k = q->k, r, i;
  float *dq = tu_xmalloc((size_t)(n * k) * sizeof(float));
  float *row = tu_xmalloc((size_t)k * sizeof(float));
  double sse = 0.0, sref = 0.0;
  const double u = 0x1p-24;

  ck_assert_int_eq(ql_qweight_check(q), 0);
  {
    /* the canonical sizes, from the layout table */
    int grouped = q->format == QL_FORMAT_Q4G || q->format == QL_FORMAT_Q8B;
    int64_t g = grouped ? (k + q->group_size - 1) / q->group_size : 1;
    int64_t row = q->format == QL_FORMAT_Q4G ? (k + 1) / 2 : k;
    REQUIRE(q->groups == g, "groups %lld, want %lld", (long long)q->groups,
            (long long)g);
    REQUIRE(q->qdata_bytes == (size_t)(n * row), "qdata_bytes %zu",
            q->qdata_bytes);
    REQUIRE(q->scale_bytes == (size_t)(g * n) * ql_dtype_size(q->scale_dtype),
            "scale_bytes %zu", q->scale_bytes);
    REQUIRE(grouped || q->group_size == (uint32_t)k, "group_size %u",
            q->group_size);
  }
  ck_assert_int_eq(ql_qweight_dequantize(q, dq), 0);
  for (r = 0; r < n; r++) {
    const float *x = w + r * k;

    REQUIRE(ql_qweight_dequantize_row(q, r, row) == 0, "dequantize_row");
    REQUIRE(memcmp(row, dq + r * k, (size_t)k * sizeof(float)) == 0,
            "dequantize_row %lld differs", (long long)r);
    if (q->format == QL_FORMAT_Q4G) {
      int64_t gs = q->group_size, g, k0;
      if (k & 1) /* padding nibble */
        REQUIRE(q->qdata[r * ((k + 1) / 2) + k / 2] >> 4 == 0,
                "padding nibble of row %lld", (long long)r);
      for (g = 0, k0 = 0; k0 < k; g++, k0 += gs) {
        int64_t k1 = k0 + gs < k ? k0 + gs : k;
        float mn = x[k0], mx = x[k0], rng, s, z, s_st, z_st;
        for (i = k0; i < k1; i++) {
          mn = x[i] < mn ? x[i] : mn;
          mx = x[i] > mx ? x[i] : mx;
        }
        rng = (float)((double)mx - (double)mn);
        if (rng < 1e-6f)
          rng = 1e-6f;
        s = (float)((double)rng / 15.0);
        z = (float)((double)mn + 8.0 * (double)s);
        s_st = ql_load_f32(q->scale_dtype, q->scale, (size_t)(g * n + r));
        z_st = ql_load_f32(q->scale_dtype, q->zero, (size_t)(g * n + r));
        REQUIRE(tu_f32_bits(s_st) == tu_f32_bits(narrow(rd, s)),
                "q4g scale r%lld g%lld: %a want %a", (long long)r, (long long)g,
                (double)s_st, (double)narrow(rd, s));
        REQUIRE(tu_f32_bits(z_st) == tu_f32_bits(narrow(rd, z)),
                "q4g zero r%lld g%lld: %a want %a", (long long)r, (long long)g,
                (double)z_st, (double)narrow(rd, z));
        for (i = k0; i < k1; i++) {
          float d = (float)((double)x[i] - (double)mn);
          double t = tu_rne((double)(float)((double)d / (double)s));
          int want = (int)(t < 0 ? 0 : t > 15 ? 15 : t) - 8;
          int got = q4g_at(q, r, i);
          float xh = dq[r * k + i];
          double err = fabs((double)x[i] - (double)xh), bound;

          REQUIRE(got == want, "q4g q[%lld,%lld] = %d, want %d",
                        (long long)r, (long long)i, got, want);
          REQUIRE(x[i] != mn || got == -8, "min maps to %d", got);
          REQUIRE(x[i] != mx || (double)mx - mn < 1e-6 || got == 7,
                  "max maps to %d", got);
          REQUIRE(tu_f32_bits(xh) ==
                      tu_f32_bits((float)((double)(float)((double)got * s_st) +
                                          (double)z_st)),
                  "q4g x̂[%lld,%lld] = %a", (long long)r, (long long)i,
                  (double)xh);
          bound = 0.5 * s + 8.0 * fabs((double)s_st - s) +
                  fabs((double)z_st - z) +
                  4.0 * u *
                      (16.0 * s + fabs((double)x[i] - mn) + fabs(z) +
                       fabs(got * (double)s_st) + fabs((double)xh));
          REQUIRE(err <= bound, "q4g |x - x̂| = %g > %g at [%lld,%lld] (%s)",
                  err, bound, (long long)r, (long long)i,
                  tu_dtype_name(q->scale_dtype));
          sse += err * err;
          sref += (double)s_st * s_st / 12.0;
        }
      }
    } else if (q->format == QL_FORMAT_Q8B) {
      sse += check_q8b_row(q, rd, x, dq + r * k, r, &sref);
    } else if (q->format == QL_FORMAT_F8R) {
      sse += check_f8r_row(q, rd, x, dq + r * k, r, &sref);
    } else {
      float amax = 0.0f, s, s_st, inv;
      for (i = 0; i < k; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
      s = (float)((double)amax / 127.5);
      if (s < FLT_EPSILON)
        s = FLT_EPSILON;
      s_st = ql_load_f32(q->scale_dtype, q->scale, (size_t)r);
      REQUIRE(tu_f32_bits(s_st) == tu_f32_bits(narrow(rd, s)),
              "q8c scale r%lld: %a want %a", (long long)r, (double)s_st,
              (double)narrow(rd, s));
      inv = (float)(1.0 / (double)s_st);
      for (i = 0; i < k; i++) {
        double t = tu_rne((double)(float)((double)x[i] * (double)inv));
        int want = (int)(t < -128 ? -128 : t > 127 ? 127 : t);
        int got = q8c_at(q, r, i);
        float xh = dq[r * k + i];
        double err = fabs((double)x[i] - (double)xh), bound;

        REQUIRE(got == want, "q8c q[%lld,%lld] = %d, want %d",
                      (long long)r, (long long)i, got, want);
        if (fabsf(x[i]) == amax && s > FLT_EPSILON)
          REQUIRE(abs(got) >= 127, "amax maps to %d", got);
        REQUIRE(tu_f32_bits(xh) == tu_f32_bits((float)((double)got * s_st)),
                "q8c x̂[%lld,%lld] = %a", (long long)r, (long long)i,
                (double)xh);
        bound = 0.5 * s_st + 127.5 * fabs((double)s - s_st) +
                8.0 * u * (fabs((double)x[i]) + fabs((double)xh));
        REQUIRE(err <= bound, "q8c |x - x̂| = %g > %g at [%lld,%lld] (%s)", err,
                bound, (long long)r, (long long)i,
                tu_dtype_name(q->scale_dtype));
        sse += err * err;
        sref += (double)s_st * s_st / 12.0;
      }
    }
  }
  free(dq);
  free(row);
  if (ref)
    *ref = sref;
  return sse;
}

/* check_weight_rd() of a weight whose parameters were rounded to the
 * dtype they are stored in (an explicit scale dtype, or the default where
 * it stores the source dtype). */
static double check_weight(const ql_qweight *q, const float *w, double *ref) {
  return check_weight_rd(q, w, ref, q->scale_dtype);
}

/* ---------------------------------------------------------------- formats */

START_TEST(test_q4g_pack_tiny) {
  /* K = 3, one group: min 0, max 3, scale = 3/15 = 0.2f, zero = 1.6f.
   * q = [15, 0, 5] - 8 = [7, -8, -3]: byte0 = 0x7 | 0x8 << 4 = 0x87,
   * byte1 = 0xD (-3) with the padding nibble 0. */
  static const float w[3] = {3.0f, 0.0f, 1.0f};
  static const struct {
    ql_dtype dt;
    uint32_t scale, zero;
  } want[] = {
      {QL_DTYPE_F32, 0x3E4CCCCDu, 0x3FCCCCCDu},
      {QL_DTYPE_BF16, 0x3E4Du, 0x3FCDu},
      {QL_DTYPE_F16, 0x3266u, 0x3E66u},
  };
  size_t i;

  for (i = 0; i < 3; i++) {
    ql_qweight *q = quantize_ok(QL_FORMAT_Q4G, 32, 1, 3, w, NULL, want[i].dt);
    uint32_t s = 0, z = 0;
    float dq[3];

    ck_assert_int_eq(q->format, QL_FORMAT_Q4G);
    ck_assert_uint_eq(q->group_size, 32);
    ck_assert_int_eq(q->n, 1);
    ck_assert_int_eq(q->k, 3);
    ck_assert_int_eq(q->groups, 1);
    ck_assert_uint_eq(q->qdata_bytes, 2);
    ck_assert_uint_eq(q->scale_bytes, ql_dtype_size(want[i].dt));
    ck_assert_ptr_null(q->bias);
    ck_assert_uint_eq(q->qdata[0], 0x87);
    ck_assert_uint_eq(q->qdata[1], 0x0D);
    memcpy(&s, q->scale, ql_dtype_size(want[i].dt));
    memcpy(&z, q->zero, ql_dtype_size(want[i].dt));
    REQUIRE(s == want[i].scale && z == want[i].zero, "%s: scale %x zero %x",
            tu_dtype_name(want[i].dt), s, z);
    ck_assert_int_eq(ql_qweight_dequantize(q, dq), 0);
    {
      static const int qv[3] = {7, -8, -3};
      float sv = ql_load_f32(want[i].dt, q->scale, 0);
      float zv = ql_load_f32(want[i].dt, q->zero, 0);
      size_t j;
      for (j = 0; j < 3; j++)
        ck_assert(dq[j] == (float)((double)(float)(qv[j] * (double)sv) + zv));
    }
    ql_qweight_free(q);
  }
}
END_TEST

START_TEST(test_q4g_scale_layout) {
  /* N = 2, K = 40, gs = 32: scale/zero are [G, N], index g·N + n. Values
   * are multiples of each group's scale, so everything is exact. */
  float w[2 * 40], dq[2 * 40], s[4];
  static const float ws[4] = {1.0f, 2.0f, 4.0f, 8.0f}; /* g0n0 g1n0 g0n1 g1n1 */
  static const int g1[8] = {0, 15, 1, 14, 2, 5, 6, 3};
  int i;
  ql_qweight *q;

  for (i = 0; i < 32; i++) {
    w[i] = ws[0] * (float)(i % 16);
    w[40 + i] = ws[2] * (float)(i % 16);
  }
  for (i = 0; i < 8; i++) {
    w[32 + i] = ws[1] * (float)g1[i];
    w[40 + 32 + i] = ws[3] * (float)g1[i];
  }
  q = quantize_ok(QL_FORMAT_Q4G, 32, 2, 40, w, NULL, QL_DTYPE_F32);
  memcpy(s, q->scale, sizeof s);
  ck_assert(s[0] == 1.0f && s[1] == 4.0f && s[2] == 2.0f && s[3] == 8.0f);
  memcpy(s, q->zero, sizeof s);
  ck_assert(s[0] == 8.0f && s[1] == 32.0f && s[2] == 16.0f && s[3] == 64.0f);
  /* row 1 starts at byte 20; k = 32, 33 hold q = -8, 7 */
  ck_assert_uint_eq(q->qdata[20 + 16], 0x78);
  ck_assert_uint_eq(q->qdata[0], 0x98); /* row 0: k0 = 0 -> -8, k1 = 1 -> -7 */
  ck_assert_int_eq(ql_qweight_dequantize(q, dq), 0);
  for (i = 0; i < 80; i++)
    REQUIRE(dq[i] == w[i], "x̂[%d] = %g, want %g", i, dq[i], w[i]);
  ql_qweight_free(q);
}
END_TEST

START_TEST(test_q8c_minus128) {
  /* amax = 127.5·s gives scale s exactly and x·(1/s) = -127.5 -> -128. */
  static const float base[8] = {-127.5f, 127.0f, 0.5f, 1.5f,
                                -0.5f,   -1.5f,  2.5f, -126.5f};
  static const int8_t want[8] = {-128, 127, 0, 2, 0, -2, 2, -126};
  static const float mult[2] = {1.0f, 0.125f};
  float w[8], dq[8];
  size_t d, m, i;

  for (m = 0; m < 2; m++)
    for (d = 0; d < 3; d++) {
      ql_qweight *q;
      for (i = 0; i < 8; i++)
        w[i] = base[i] * mult[m];
      q = quantize_ok(QL_FORMAT_Q8C, 0, 1, 8, w, NULL, all_dtypes[d]);
      ck_assert_uint_eq(q->group_size, 8);
      ck_assert_ptr_null(q->zero);
      ck_assert(memcmp(q->qdata, want, 8) == 0);
      ck_assert(ql_load_f32(all_dtypes[d], q->scale, 0) == mult[m]);
      ck_assert_int_eq(ql_qweight_dequantize(q, dq), 0);
      for (i = 0; i < 8; i++)
        ck_assert(dq[i] == (float)want[i] * mult[m]);
      ql_qweight_free(q);
    }
}
END_TEST

/*
 * q4g ties and the division. Row 0 (scale 1): (x - min)/scale is an exact
 * .5, rounded half to even (2.5 -> 2, not 3). Rows 1 and 2 use scales
 * 159·2^-16 and 219·2^-16, for which (x - min)/scale is an exact tie while
 * (x - min)·(1/scale) rounds to just below it: FBGEMM divides, so the
 * answer is the even neighbour of the tie, and a reciprocal multiply fails.
 */
START_TEST(test_q4g_ties_and_division) {
  static const double t0[9] = {0, 15, 0.5, 1.5, 2.5, 3.5, 4.5, 13.5, 14.5};
  static const int u0[9] = {0, 15, 0, 2, 2, 4, 4, 14, 14};
  const float s1 = ldexpf(159.0f, -16), s2 = ldexpf(219.0f, -16);
  float w[3 * 9] = {0};
  size_t d;
  int i;

  for (i = 0; i < 9; i++)
    w[i] = (float)t0[i];
  w[9 + 1] = 15.0f * s1;
  w[9 + 2] = 3.5f * s1;
  w[18 + 1] = 15.0f * s2;
  w[18 + 2] = 1.5f * s2;
  /* the traps are real: the reciprocal form lands below the tie */
  ck_assert(tu_rne((double)(float)((double)w[9 + 2] * (double)(1.0f / s1))) ==
            3.0);
  ck_assert(tu_rne((double)(float)((double)w[18 + 2] * (double)(1.0f / s2))) ==
            1.0);
  for (d = 0; d < 3; d++) {
    ql_qweight *q = quantize_ok(QL_FORMAT_Q4G, 32, 3, 9, w, NULL,
                                all_dtypes[d]);
    for (i = 0; i < 9; i++)
      ck_assert_msg(q4g_at(q, 0, i) == u0[i] - 8, "tie %g -> %d", t0[i],
                    q4g_at(q, 0, i) + 8);
    ck_assert_int_eq(q4g_at(q, 1, 2), 4 - 8);
    ck_assert_int_eq(q4g_at(q, 2, 2), 2 - 8);
    check_weight(q, w, NULL);
    ql_qweight_free(q);
  }
}
END_TEST

/*
 * q8c uses x·(1/scale), not x/scale (TorchAO quantize_affine). With scale
 * 167/256, x = -126.5·scale divides to the exact tie -126.5 (-> -126) but
 * multiplies to just below it (-> -127); with 159/256 the row's own -amax
 * gives -127, not -128. These scales are exact in every scale dtype.
 */
START_TEST(test_q8c_reciprocal) {
  const float s1 = 167.0f / 256.0f, s2 = 159.0f / 256.0f;
  float w[2 * 2] = {127.5f * s1, -126.5f * s1, -127.5f * s2, s2};
  size_t d;

  ck_assert(tu_rne((double)w[1] / s1) == -126.0); /* what division would give */
  ck_assert(tu_rne((double)w[2] / s2) == -128.0);
  for (d = 0; d < 3; d++) {
    ql_qweight *q = quantize_ok(QL_FORMAT_Q8C, 0, 2, 2, w, NULL,
                                all_dtypes[d]);
    ck_assert(ql_load_f32(all_dtypes[d], q->scale, 0) == s1);
    ck_assert(ql_load_f32(all_dtypes[d], q->scale, 1) == s2);
    ck_assert_int_eq(q8c_at(q, 0, 1), -127);
    ck_assert_int_eq(q8c_at(q, 1, 0), -127);
    ck_assert_int_eq(q8c_at(q, 1, 1), 1);
    check_weight(q, w, NULL);
    ql_qweight_free(q);
  }
}
END_TEST

/*
 * q8b layout: N = 2, K = 40, B = 32 (a ragged second block of 8). scale
 * and zero are [G, N], index b·N + n; qdata is [N, K] int8. Each value is
 * a multiple of its block's step ws (symmetric: v·ws with v in
 * [-127, 127] plus one -127.5·ws, the block's -amax, which gives -128;
 * asymmetric: (v + 128)·ws, min 0 and max 255·ws), so everything else is
 * exact.
 */
START_TEST(test_q8b_layout) {
  static const float ws[4] = {1.0f, 2.0f, 4.0f, 8.0f}; /* b0n0 b1n0 b0n1 b1n1 */
  float w[2 * 40], dq[2 * 40], s[4];
  int v[40];
  ql_qweight *q;
  int i, r, asym;

  for (asym = 0; asym < 2; asym++) {
    for (i = 0; i < 40; i++)
      v[i] = (i * 37) % 255 - 127;
    v[3] = v[35] = -128; /* from -127.5 (sym), the min 0 (asym) */
    v[5] = v[37] = 127;  /* the max 255·ws (asym) */
    for (r = 0; r < 2; r++)
      for (i = 0; i < 40; i++) {
        float step = ws[2 * r + (i >= 32)];
        w[r * 40 + i] = asym           ? (float)(v[i] + 128) * step
                        : v[i] == -128 ? -127.5f * step
                                       : (float)v[i] * step;
      }
    q = quantize_cfg(&(cfg){QL_FORMAT_Q8B, 32, asym}, 2, 40, w, NULL,
                     QL_DTYPE_F32);
    ck_assert_int_eq(q->groups, 2);
    ck_assert_uint_eq(q->qdata_bytes, 80);
    ck_assert_uint_eq(q->scale_bytes, 16);
    memcpy(s, q->scale, sizeof s);
    ck_assert(s[0] == 1.0f && s[1] == 4.0f && s[2] == 2.0f && s[3] == 8.0f);
    if (asym) {
      /* min 0 in every block: zero = 128·scale */
      memcpy(s, q->zero, sizeof s);
      ck_assert(s[0] == 128.0f && s[1] == 512.0f && s[2] == 256.0f &&
                s[3] == 1024.0f);
    } else {
      ck_assert_ptr_null(q->zero);
    }
    ck_assert_int_eq(ql_qweight_dequantize(q, dq), 0);
    for (r = 0; r < 2; r++)
      for (i = 0; i < 40; i++) {
        float want = asym || v[i] != -128 ? w[r * 40 + i]
                                          : -128.0f * ws[2 * r + (i >= 32)];
        REQUIRE(q8b_at(q, r, i) == v[i], "asym %d q[%d,%d] = %d, want %d", asym,
                r, i, q8b_at(q, r, i), v[i]);
        REQUIRE(dq[r * 40 + i] == want, "asym %d x̂[%d,%d] = %g, want %g", asym,
                r, i, dq[r * 40 + i], want);
      }
    check_weight(q, w, NULL);
    ql_qweight_free(q);
  }
}
END_TEST

/*
 * q8b symmetric is the q8c rule on each block: ties to even, -128 from the
 * block's -amax, the reciprocal multiply (scale 167/256: -126.5·scale
 * divides to a tie but multiplies to below it, -> -127), and each block
 * independent of its neighbours (block 1 has its own scale).
 */
START_TEST(test_q8b_sym_ties_minus128) {
  static const double t[8] = {-127.5, 127.0, 0.5, 1.5, -0.5, -1.5, 2.5, -126.5};
  static const int8_t want0[8] = {-128, 127, 0, 2, 0, -2, 2, -126};
  const float s1 = 167.0f / 256.0f;
  float w[64 + 8];
  size_t d;
  int i;

  for (i = 0; i < 64 + 8; i++)
    w[i] = 0.0f;
  for (i = 0; i < 8; i++)
    w[i] = (float)(t[i] * 0.125); /* block 0: scale 2^-3 */
  w[64] = 127.5f * s1;            /* block 2 (ragged, 8 long) */
  w[65] = -126.5f * s1;
  w[66] = 3.0f * s1;
  ck_assert(tu_rne((double)w[65] / s1) == -126.0); /* what division gives */
  for (d = 0; d < 3; d++) {
    ql_qweight *q = quantize_cfg(&(cfg){QL_FORMAT_Q8B, 32, 0}, 1, 72, w, NULL,
                                 all_dtypes[d]);
    ck_assert_int_eq(q->groups, 3);
    ck_assert(ql_load_f32(all_dtypes[d], q->scale, 0) == 0.125f);
    ck_assert(ql_load_f32(all_dtypes[d], q->scale, 1) == FLT_EPSILON);
    ck_assert(ql_load_f32(all_dtypes[d], q->scale, 2) == s1);
    for (i = 0; i < 8; i++)
      ck_assert_msg(q8b_at(q, 0, i) == want0[i], "x/s = %g: got %d, want %d",
                    t[i], q8b_at(q, 0, i), want0[i]);
    for (i = 8; i < 64; i++)
      REQUIRE(q8b_at(q, 0, i) == 0, "zero block at %d", i);
    ck_assert_int_eq(q8b_at(q, 0, 64), 127);
    ck_assert_int_eq(q8b_at(q, 0, 65), -127);
    ck_assert_int_eq(q8b_at(q, 0, 66), 3);
    check_weight(q, w, NULL);
    ql_qweight_free(q);
  }
}
END_TEST

/*
 * q8b asymmetric ties and the division, like q4g's. Row 0 (min 0, max 255,
 * scale 1): (x - min)/scale is an exact .5, half to even. Rows 1 and 2 use
 * scales 159·2^-16 and 167·2^-16, for which (x - min)/scale is an exact
 * tie (3.5, 6.5) while (x - min)·(1/scale) lands on the other side of it:
 * the division gives the even neighbour, a reciprocal multiply would not.
 */
START_TEST(test_q8b_asym_ties_and_division) {
  static const double t0[8] = {0, 255, 0.5, 1.5, 2.5, 126.5, 127.5, 254.5};
  static const int u0[8] = {0, 255, 0, 2, 2, 126, 128, 254};
  const float s1 = ldexpf(159.0f, -16), s2 = ldexpf(167.0f, -16);
  float w[3 * 8] = {0};
  size_t d;
  int i;

  for (i = 0; i < 8; i++)
    w[i] = (float)t0[i];
  w[8 + 1] = 255.0f * s1;
  w[8 + 2] = 3.5f * s1;
  w[16 + 1] = 255.0f * s2;
  w[16 + 2] = 6.5f * s2;
  /* the traps are real: the reciprocal form crosses the tie */
  ck_assert(rintf(w[8 + 2] * (1.0f / s1)) == 3.0f);
  ck_assert(rintf(w[16 + 2] * (1.0f / s2)) == 7.0f);
  for (d = 0; d < 3; d++) {
    ql_qweight *q = quantize_cfg(&(cfg){QL_FORMAT_Q8B, 32, 1}, 3, 8, w, NULL,
                                 all_dtypes[d]);
    for (i = 0; i < 8; i++)
      ck_assert_msg(q8b_at(q, 0, i) == u0[i] - 128, "tie %g -> %d", t0[i],
                    q8b_at(q, 0, i) + 128);
    ck_assert_int_eq(q8b_at(q, 1, 2), 4 - 128);
    ck_assert_int_eq(q8b_at(q, 2, 2), 6 - 128);
    ck_assert_int_eq(q8b_at(q, 1, 1), 127);
    ck_assert_int_eq(q8b_at(q, 1, 0), -128);
    check_weight(q, w, NULL);
    ql_qweight_free(q);
  }
}
END_TEST

/* On an all-positive block the asymmetric form spends its 256 levels on
 * [min, max] while the symmetric one spends half of them on negatives it
 * never sees: its steps (and MSE) must be much smaller. */
START_TEST(test_q8b_sym_vs_asym) {
  enum { N = 4, K = 256 };
  float *w = tu_xmalloc(N * K * sizeof(float));
  uint64_t rng = 77;
  double mse[2];
  int i, a;

  for (i = 0; i < N * K; i++)
    w[i] = (float)(3.0 + tu_rng_uniform(&rng));
  for (a = 0; a < 2; a++) {
    ql_qweight *q =
        quantize_cfg(&(cfg){QL_FORMAT_Q8B, 64, a}, N, K, w, NULL, QL_DTYPE_F32);
    ck_assert_int_eq(q->asymmetric, a);
    mse[a] = check_weight(q, w, NULL) / (N * K);
    ql_qweight_free(q);
  }
  /* step ratio: (4/127.5) / (1/255) ≈ 8, so MSE ratio ≈ 64 */
  REQUIRE(mse[0] > 30.0 * mse[1] && mse[0] < 130.0 * mse[1],
          "sym MSE %g vs asym %g", mse[0], mse[1]);
  free(w);
}
END_TEST

/*
 * f8r by hand: amax 448 gives scale 1 exactly, so each x is its own e4m3
 * argument: saturation points, ties to even (232 -> 224, 248 -> 256),
 * subnormals (2^-9 -> 0x01, 3·2^-10 -> tie -> 0x02, 2^-10 -> tie -> 0),
 * the signed zero.
 */
START_TEST(test_f8r_tiny) {
  static const float w[12] = {
      448.0f,  -448.0f,  1.0f,     232.0f, 248.0f,         -1.0625f,
      0x1p-9f, 0x3p-10f, 0x1p-10f, -0.0f,  7.5f * 0x1p-9f, -0.0146484375f};
  static const uint8_t want[12] = {0x7E, 0xFE, 0x38, 0x76, 0x78, 0xB8,
                                   0x01, 0x02, 0x00, 0x80, 0x08, 0x88};
  size_t d;
  int i;

  for (d = 0; d < 3; d++) {
    ql_qweight *q =
        quantize_ok(QL_FORMAT_F8R, 0, 1, 12, w, NULL, all_dtypes[d]);
    float dq[12];
    ck_assert_int_eq(q->format, QL_FORMAT_F8R);
    ck_assert_uint_eq(q->group_size, 12);
    ck_assert_int_eq(q->groups, 1);
    ck_assert_uint_eq(q->qdata_bytes, 12);
    ck_assert_uint_eq(q->scale_bytes, ql_dtype_size(all_dtypes[d]));
    ck_assert_ptr_null(q->zero);
    ck_assert(ql_load_f32(all_dtypes[d], q->scale, 0) == 1.0f);
    for (i = 0; i < 12; i++)
      ck_assert_msg(q->qdata[i] == want[i], "x = %a: code %02x, want %02x",
                    (double)w[i], q->qdata[i], want[i]);
    ck_assert_int_eq(ql_qweight_dequantize(q, dq), 0);
    ck_assert(dq[3] == 224.0f && dq[4] == 256.0f && dq[7] == 0x1p-8f);
    ck_assert(dq[9] == 0.0f && signbit(dq[9]));
    check_weight(q, w, NULL);
    ql_qweight_free(q);
  }
}
END_TEST

/*
 * f8r divides (TorchAO _quantize_affine_float8: x / scale). With scales
 * 159·2^-16 and 167·2^-16 (rows [448·s, t·s]) t = 31·2^-10 and 29·2^-10
 * are exact e4m3 ties that a division keeps (-> even 0x10, 0x0E) but
 * x·(1/s) pushes to the other side. A bf16 scale that rounds down makes
 * x / scale exceed 448: it saturates to 448, never NaN.
 */
START_TEST(test_f8r_division_and_saturation) {
  const float s1 = ldexpf(159.0f, -16), s2 = ldexpf(167.0f, -16);
  float w[3 * 2] = {448.0f * s1, 31.0f * 0x1p-10f * s1,
                    448.0f * s2, 29.0f * 0x1p-10f * s2,
                    448.875f,    -448.875f};
  size_t d;

  ck_assert_uint_eq(ql_f32_to_e4m3(w[1] * (1.0f / s1)), 0x0F);
  ck_assert_uint_eq(ql_f32_to_e4m3(w[3] * (1.0f / s2)), 0x0F);
  for (d = 0; d < 3; d++) {
    ql_qweight *q = quantize_ok(QL_FORMAT_F8R, 0, 3, 2, w, NULL, all_dtypes[d]);
    float s3 = ql_load_f32(all_dtypes[d], q->scale, 2);
    ck_assert_uint_eq(f8r_at(q, 0, 1), 0x10);
    ck_assert_uint_eq(f8r_at(q, 1, 1), 0x0E);
    /* 448.875 / 448 = 1 + 2^-9: exact in f32 and f16, 1 in bf16 */
    ck_assert(s3 == (all_dtypes[d] == QL_DTYPE_BF16 ? 1.0f : 1.001953125f));
    ck_assert(all_dtypes[d] != QL_DTYPE_BF16 || w[4] / s3 > 448.0f);
    ck_assert_uint_eq(f8r_at(q, 2, 0), 0x7E);
    ck_assert_uint_eq(f8r_at(q, 2, 1), 0xFE);
    check_weight(q, w, NULL);
    ql_qweight_free(q);
  }
}
END_TEST

/* Quantize then dequantize for every format, group size, ragged K, N and
 * scale dtype, on Gaussian and on shifted (all-positive) data. */
START_TEST(test_roundtrip_ragged) {
  static const int64_t ks[] = {1, 7, 33, 100, 257, 1000};
  static const int64_t ns[] = {1, 3};
  const cfg *c = &cfgs[_i];
  size_t ki, ni, d, kind;
  float *w = tu_xmalloc(3 * 1000 * sizeof(float));
  uint64_t rng = 100 + (uint64_t)_i;

  for (ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
    for (ni = 0; ni < 2; ni++)
      for (d = 0; d < 3; d++)
        for (kind = 0; kind < 2; kind++) {
          int64_t n = ns[ni], k = ks[ki], i;
          ql_qweight *q;
          for (i = 0; i < n * k; i++)
            w[i] = kind == 0 ? (float)(tu_rng_gauss(&rng) * 0.02)
                             : (float)(3.0 + tu_rng_uniform(&rng));
          q = quantize_cfg(c, n, k, w, NULL, all_dtypes[d]);
          check_weight(q, w, NULL);
          ql_qweight_free(q);
        }
  free(w);
}
END_TEST

START_TEST(test_zero_and_constant_rows) {
  float w[2 * 100], dq[2 * 100];
  const cfg *c = &cfgs[_i];
  size_t d, i;

  for (i = 0; i < 100; i++) {
    w[i] = 0.0f;
    w[100 + i] = 5.0f;
  }
  for (d = 0; d < 3; d++) {
    ql_qweight *q = quantize_cfg(c, 2, 100, w, NULL, all_dtypes[d]);
    check_weight(q, w, NULL);
    ck_assert_int_eq(ql_qweight_dequantize(q, dq), 0);
    for (i = 0; i < 200; i++)
      REQUIRE(isfinite(dq[i]), "x̂[%zu] = %g", i, dq[i]);
    if (c->f == QL_FORMAT_Q8C) {
      /* scale clamps to eps; the zero row is exactly zero */
      ck_assert(ql_load_f32(all_dtypes[d], q->scale, 0) == FLT_EPSILON);
      for (i = 0; i < 100; i++)
        REQUIRE(q8c_at(q, 0, (int64_t)i) == 0 && dq[i] == 0.0f,
                "zero row at %zu", i);
    } else if (c->f == QL_FORMAT_Q4G) {
      for (i = 0; i < 100; i++)
        REQUIRE(q4g_at(q, 0, (int64_t)i) == -8 &&
                    q4g_at(q, 1, (int64_t)i) == -8,
                "zero/constant row q at %zu", i);
      /* bf16/f32 keep zero = 8·scale exactly, so the zero row is 0 */
      if (all_dtypes[d] != QL_DTYPE_F16)
        for (i = 0; i < 100; i++)
          REQUIRE(dq[i] == 0.0f, "x̂[%zu] = %g", i, dq[i]);
    } else if (c->f == QL_FORMAT_Q8B && !c->asym) {
      /* every block of the zero row clamps to eps and is exactly zero;
       * the constant row's blocks sit at +amax: 5·(1/scale) ≈ 127.5 -> 127 */
      for (i = 0; i < (size_t)q->groups; i++)
        ck_assert(ql_load_f32(all_dtypes[d], q->scale, 2 * i) == FLT_EPSILON);
      for (i = 0; i < 100; i++)
        REQUIRE(q8b_at(q, 0, (int64_t)i) == 0 && dq[i] == 0.0f &&
                    q8b_at(q, 1, (int64_t)i) == 127,
                "zero/constant row at %zu", i);
    } else if (c->f == QL_FORMAT_Q8B) {
      for (i = 0; i < 100; i++)
        REQUIRE(q8b_at(q, 0, (int64_t)i) == -128 &&
                    q8b_at(q, 1, (int64_t)i) == -128,
                "zero/constant row q at %zu", i);
      /* bf16/f32 keep zero = 128·scale exactly, so the zero row is 0 */
      if (all_dtypes[d] != QL_DTYPE_F16)
        for (i = 0; i < 100; i++)
          REQUIRE(dq[i] == 0.0f, "x̂[%zu] = %g", i, dq[i]);
    } else {
      /* f8r: amax clamps to 1e-12, so the zero row is zeros, never NaN
       * (an f16 scale underflows to 0 and the codes are 0 as well); the
       * constant row is all +448 */
      float s0 = ql_load_f32(all_dtypes[d], q->scale, 0);
      ck_assert(s0 == narrow(all_dtypes[d], 1e-12f / 448.0f));
      ck_assert(all_dtypes[d] != QL_DTYPE_F16 || s0 == 0.0f);
      ck_assert(all_dtypes[d] == QL_DTYPE_F16 || s0 > 0.0f);
      for (i = 0; i < 100; i++)
        REQUIRE(f8r_at(q, 0, (int64_t)i) == 0 && dq[i] == 0.0f &&
                    f8r_at(q, 1, (int64_t)i) == 0x7E,
                "zero/constant row at %zu", i);
    }
    ql_qweight_free(q);
  }
}
END_TEST

/*
 * The default scale dtype (0): the scale rounded to the source dtype, and
 * stored as TorchAO stores it: in the source dtype for q4g and q8b, as f32
 * for q8c and f8r. Asking for the source dtype explicitly gives the same
 * values and codes (stored in the source dtype); asking for f32 from a
 * bf16/f16 source keeps the unrounded quotient, which differs somewhere.
 */
START_TEST(test_default_scale_dtype) {
  const cfg *c = &cfgs[_i];
  float w[3 * 70], wide[3 * 70];
  uint16_t w16[3 * 70];
  uint64_t rng = 21;
  size_t d, i;
  int f32_store = c->f == QL_FORMAT_Q8C || c->f == QL_FORMAT_F8R;

  for (i = 0; i < 210; i++)
    w[i] = (float)tu_rng_gauss(&rng);
  for (d = 0; d < 3; d++) {
    ql_dtype src = all_dtypes[d];
    ql_dtype want = f32_store ? QL_DTYPE_F32 : src;
    const void *in = w;
    ql_qweight *a = NULL, *b = NULL, *e = NULL;

    if (src != QL_DTYPE_F32) {
      ql_from_f32(src, w, w16, 210);
      in = w16;
    }
    ql_to_f32(src, in, wide, 210);
    ck_assert_int_eq(quantize_c(c, 3, 70, src, in, NULL, (ql_dtype)0, &a), 0);
    ck_assert_int_eq(quantize_c(c, 3, 70, src, in, NULL, src, &b), 0);
    ck_assert_int_eq(quantize_c(c, 3, 70, src, in, NULL, QL_DTYPE_F32, &e), 0);
    REQUIRE(a->scale_dtype == want, "%s source: scale dtype %d",
            tu_dtype_name(src), (int)a->scale_dtype);
    ck_assert(b->scale_dtype == src);
    size_t ns = a->scale_bytes / ql_dtype_size(a->scale_dtype);
    ck_assert_uint_eq(ns * ql_dtype_size(src), b->scale_bytes);
    for (i = 0; i < ns; i++) {
      float va = ql_load_f32(a->scale_dtype, a->scale, i);
      float vb = ql_load_f32(b->scale_dtype, b->scale, i);
      REQUIRE(tu_f32_bits(va) == tu_f32_bits(vb),
              "%s source: scale[%zu] %a by default, %a in the source dtype",
              tu_dtype_name(src), i, (double)va, (double)vb);
      if (a->zero) {
        va = ql_load_f32(a->scale_dtype, a->zero, i);
        vb = ql_load_f32(b->scale_dtype, b->zero, i);
        ck_assert(tu_f32_bits(va) == tu_f32_bits(vb));
      }
    }
    ck_assert(memcmp(a->qdata, b->qdata, a->qdata_bytes) == 0);
    ck_assert((a->zero != NULL) == (b->zero != NULL));
    if (src != QL_DTYPE_F32) {
      /* an explicit f32 scale is the f32 quotient, not TorchAO's value */
      size_t nd = 0;
      ck_assert_int_eq(e->scale_dtype, QL_DTYPE_F32);
      for (i = 0; i < ns; i++)
        nd += tu_f32_bits(ql_load_f32(QL_DTYPE_F32, e->scale, i)) !=
              tu_f32_bits(ql_load_f32(a->scale_dtype, a->scale, i));
      REQUIRE(nd > 0, "%s source: an explicit f32 scale equals the default",
              tu_dtype_name(src));
      check_weight(e, wide, NULL);
    } else {
      ck_assert(memcmp(a->scale, e->scale, a->scale_bytes) == 0 &&
                memcmp(a->qdata, e->qdata, a->qdata_bytes) == 0);
    }
    check_weight_rd(a, wide, NULL, src); /* rounded to the source dtype */
    ql_qweight_free(a);
    ql_qweight_free(b);
    ql_qweight_free(e);
  }
}
END_TEST

/*
 * f8r's default scale: TorchAO's Float8Tensor.from_hp computes a bf16/f16
 * weight's scale in that dtype (_choose_scale_float8: max_abs / 448
 * rounded to it) and then widens it to f32, which is what it stores. The
 * expected scales and codes are what TorchAO 0.18 gives for these rows
 * (hp_value_lb=1e-12, torch 2.15, CPU), except the last f16 row: amax 2^-20 makes the f16 scale 0, where TorchAO writes
 * codes 0x7E and NaN (x / 0) and we write zeros.
 */
START_TEST(test_f8r_default_scale_dtype) {
  static const float w[3 * 4] = {1.0f,     0.5f,     -0.25f,    0.0f,
                                 0x1p-13f, 0x1p-14f, -0x1p-13f, 0.0f,
                                 0x1p-20f, 0.0f,     0.0f,      0.0f};
  static const struct {
    ql_dtype src;
    float scale[3];
    uint8_t q[3 * 4];
  } want[] = {
      {QL_DTYPE_BF16,
       {0x1.24p-9f, 0x1.24p-22f, 0x1.24p-29f},
       {0x7E, 0x76, 0xEE, 0, 0x7E, 0x76, 0xFE, 0, 0x7E, 0, 0, 0}},
      /* 2^-13 / 448 rounds up to 5·2^-24 in f16: 2^-13 / scale = 409.6
       * gives 416 (0x7D), not 448 */
      {QL_DTYPE_F16,
       {0x1.248p-9f, 0x1.4p-22f, 0.0f},
       {0x7E, 0x76, 0xEE, 0, 0x7D, 0x75, 0xFD, 0, 0, 0, 0, 0}},
  };
  uint16_t w16[3 * 4];
  float wide[3 * 4];
  size_t d, i;

  for (d = 0; d < sizeof want / sizeof want[0]; d++) {
    ql_dtype src = want[d].src;
    ql_qweight *a = NULL, *b = NULL;

    ql_from_f32(src, w, w16, 12);
    ql_to_f32(src, w16, wide, 12);
    ck_assert(memcmp(wide, w, sizeof w) == 0); /* exact in both dtypes */
    ck_assert_int_eq(
        quantize_args(QL_FORMAT_F8R, 0, 3, 4, src, w16, NULL, (ql_dtype)0, &a),
        0);
    REQUIRE(a->scale_dtype == QL_DTYPE_F32, "%s: scale dtype %d",
            tu_dtype_name(src), (int)a->scale_dtype);
    ck_assert_uint_eq(a->scale_bytes, 3 * 4);
    for (i = 0; i < 3; i++)
      REQUIRE(tu_f32_bits(((const float *)a->scale)[i]) ==
                  tu_f32_bits(want[d].scale[i]),
              "%s: scale[%zu] %a, want %a", tu_dtype_name(src), i,
              (double)((const float *)a->scale)[i], (double)want[d].scale[i]);
    for (i = 0; i < 12; i++)
      REQUIRE(a->qdata[i] == want[d].q[i], "%s: q[%zu] %02x, want %02x",
              tu_dtype_name(src), i, a->qdata[i], want[d].q[i]);
    check_weight_rd(a, wide, NULL, src); /* rounded to the source dtype */

    /* an f32 scale keeps the f32 quotient: other values, other codes */
    ck_assert_int_eq(quantize_args(QL_FORMAT_F8R, 0, 3, 4, src, w16, NULL,
                                   QL_DTYPE_F32, &b),
                     0);
    ck_assert(ql_load_f32(QL_DTYPE_F32, b->scale, 0) == 1.0f / 448.0f);
    ck_assert(ql_load_f32(QL_DTYPE_F32, b->scale, 0) != want[d].scale[0]);
    ck_assert_uint_eq(b->qdata[4], 0x7E);
    check_weight(b, wide, NULL);
    ql_qweight_free(a);
    ql_qweight_free(b);
  }
  /* an f32 weight keeps f32 scales */
  {
    ql_qweight *a = NULL;
    ck_assert_int_eq(quantize_args(QL_FORMAT_F8R, 0, 3, 4, QL_DTYPE_F32, w,
                                   NULL, (ql_dtype)0, &a),
                     0);
    ck_assert_int_eq(a->scale_dtype, QL_DTYPE_F32);
    ck_assert(ql_load_f32(QL_DTYPE_F32, a->scale, 0) == 1.0f / 448.0f);
    ql_qweight_free(a);
  }
}
END_TEST

START_TEST(test_nonfinite_rejected) {
  const cfg *c = &cfgs[_i];
  const float bad[3] = {NAN, INFINITY, -INFINITY};
  float w[3 * 40], bias[3] = {0.5f, -1.0f, 2.0f};
  uint16_t w16[3 * 40];
  size_t b, i;
  ql_qweight *q;

  for (i = 0; i < 120; i++)
    w[i] = (float)i * 0.01f - 0.3f;
  for (b = 0; b < 3; b++) {
    float keep = w[40 + 37];
    w[40 + 37] = bad[b];
    q = (ql_qweight *)&q; /* must be reset to NULL */
    ck_assert_int_eq(
        quantize_c(c, 3, 40, QL_DTYPE_F32, w, bias, QL_DTYPE_BF16, &q),
        QL_ENONFINITE);
    ck_assert_ptr_null(q);
    w[40 + 37] = keep;

    keep = bias[2];
    bias[2] = bad[b];
    ck_assert_int_eq(
        quantize_c(c, 3, 40, QL_DTYPE_F32, w, bias, QL_DTYPE_BF16, &q),
        QL_ENONFINITE);
    ck_assert_ptr_null(q);
    bias[2] = keep;
  }
  /* 16-bit sources: f16 NaN/Inf, bf16 signalling NaN (last row, last k) */
  ql_from_f32(QL_DTYPE_F16, w, w16, 120);
  w16[119] = 0x7C00;
  ck_assert_int_eq(
      quantize_c(c, 3, 40, QL_DTYPE_F16, w16, NULL, QL_DTYPE_BF16, &q),
      QL_ENONFINITE);
  w16[119] = 0xFE01;
  ck_assert_int_eq(
      quantize_c(c, 3, 40, QL_DTYPE_F16, w16, NULL, QL_DTYPE_BF16, &q),
      QL_ENONFINITE);
  ql_from_f32(QL_DTYPE_BF16, w, w16, 120);
  w16[0] = 0x7F81;
  ck_assert_int_eq(
      quantize_c(c, 3, 40, QL_DTYPE_BF16, w16, NULL, QL_DTYPE_BF16, &q),
      QL_ENONFINITE);
  ck_assert_ptr_null(q);
  /* and the clean data goes through */
  ck_assert_int_eq(
      quantize_c(c, 3, 40, QL_DTYPE_F32, w, bias, QL_DTYPE_BF16, &q), 0);
  ck_assert_ptr_nonnull(q->bias);
  for (i = 0; i < 3; i++)
    ck_assert(q->bias[i] == bias[i]);
  ql_qweight_free(q);
}
END_TEST

/* Finite weights whose scale or zero does not fit the scale dtype. */
START_TEST(test_param_overflow_rejected) {
  float w[64];
  ql_qweight *q = NULL;
  int i;

  /* q8c: amax 1e7 -> scale 78431 > 65504 in f16; fine in bf16 and f32 */
  for (i = 0; i < 64; i++)
    w[i] = (float)(i - 32) * (1e7f / 32.0f);
  ck_assert_int_eq(quantize_args(QL_FORMAT_Q8C, 0, 1, 64, QL_DTYPE_F32, w, NULL,
                                 QL_DTYPE_F16, &q),
                   QL_ENONFINITE);
  ck_assert_ptr_null(q);
  q = quantize_ok(QL_FORMAT_Q8C, 0, 1, 64, w, NULL, QL_DTYPE_BF16);
  check_weight(q, w, NULL);
  ql_qweight_free(q);

  /* q4g: zero = min + 8·scale ≈ 1e5 overflows f16 */
  for (i = 0; i < 64; i++)
    w[i] = 1e5f + (float)i;
  ck_assert_int_eq(quantize_args(QL_FORMAT_Q4G, 32, 1, 64, QL_DTYPE_F32, w,
                                 NULL, QL_DTYPE_F16, &q),
                   QL_ENONFINITE);
  ck_assert_ptr_null(q);
  q = quantize_ok(QL_FORMAT_Q4G, 32, 1, 64, w, NULL, QL_DTYPE_F32);
  check_weight(q, w, NULL);
  ql_qweight_free(q);

  /* q4g: max - min overflows f32 */
  for (i = 0; i < 64; i++)
    w[i] = (i & 1) ? 3e38f : -3e38f;
  ck_assert_int_eq(quantize_args(QL_FORMAT_Q4G, 64, 1, 64, QL_DTYPE_F32, w,
                                 NULL, QL_DTYPE_F32, &q),
                   QL_ENONFINITE);
  ck_assert_ptr_null(q);
  /* but q8c handles it: scale = 3e38/127.5 */
  q = quantize_ok(QL_FORMAT_Q8C, 0, 1, 64, w, NULL, QL_DTYPE_F32);
  check_weight(q, w, NULL);
  ql_qweight_free(q);
  /* and so do symmetric q8b and f8r (scale 3e38/448); asymmetric q8b, like
   * q4g, cannot span it */
  q = quantize_cfg(&(cfg){QL_FORMAT_Q8B, 32, 0}, 1, 64, w, NULL, QL_DTYPE_F32);
  check_weight(q, w, NULL);
  ql_qweight_free(q);
  q = quantize_ok(QL_FORMAT_F8R, 0, 1, 64, w, NULL, QL_DTYPE_F32);
  check_weight(q, w, NULL);
  ql_qweight_free(q);
  ck_assert_int_eq(quantize_c(&(cfg){QL_FORMAT_Q8B, 32, 1}, 1, 64, QL_DTYPE_F32,
                              w, NULL, QL_DTYPE_F32, &q),
                   QL_ENONFINITE);
  ck_assert_ptr_null(q);

  /* q8b symmetric: only the second block's scale overflows f16 */
  for (i = 0; i < 64; i++)
    w[i] = i < 32 ? 1.0f : 1e7f;
  ck_assert_int_eq(quantize_c(&(cfg){QL_FORMAT_Q8B, 32, 0}, 1, 64, QL_DTYPE_F32,
                              w, NULL, QL_DTYPE_F16, &q),
                   QL_ENONFINITE);
  ck_assert_ptr_null(q);
  /* q8b asymmetric: zero = min + 128·scale ≈ 7e4 > 65504 in f16 */
  for (i = 0; i < 64; i++)
    w[i] = 7e4f + (float)i;
  ck_assert_int_eq(quantize_c(&(cfg){QL_FORMAT_Q8B, 64, 1}, 1, 64, QL_DTYPE_F32,
                              w, NULL, QL_DTYPE_F16, &q),
                   QL_ENONFINITE);
  ck_assert_ptr_null(q);
  /* f8r: amax 448·7e4 -> scale 7e4 overflows an f16 scale */
  for (i = 0; i < 64; i++)
    w[i] = (float)(i - 32) * (448.0f * 7e4f / 32.0f);
  ck_assert_int_eq(quantize_args(QL_FORMAT_F8R, 0, 1, 64, QL_DTYPE_F32, w, NULL,
                                 QL_DTYPE_F16, &q),
                   QL_ENONFINITE);
  ck_assert_ptr_null(q);
  q = quantize_ok(QL_FORMAT_F8R, 0, 1, 64, w, NULL, QL_DTYPE_BF16);
  check_weight(q, w, NULL);
  ql_qweight_free(q);
}
END_TEST

START_TEST(test_quantize_bad_args) {
  float w[64] = {0};
  ql_qweight *q = NULL;

  ck_assert_int_eq(quantize_args(QL_FORMAT_Q4G, 32, 1, 64, QL_DTYPE_F32, w,
                                 NULL, QL_DTYPE_BF16, NULL),
                   QL_EINVAL);
  q = (ql_qweight *)&q;
  ck_assert_int_eq(quantize_args(QL_FORMAT_Q4G, 32, 1, 64, QL_DTYPE_F32, NULL,
                                 NULL, QL_DTYPE_BF16, &q),
                   QL_EINVAL);
  ck_assert_ptr_null(q);
  ck_assert_int_eq(quantize_args(QL_FORMAT_Q4G, 32, 1, 64, (ql_dtype)0, w, NULL,
                                 QL_DTYPE_BF16, &q),
                   QL_EDTYPE);
  ck_assert_int_eq(quantize_args(QL_FORMAT_Q4G, 32, 1, 64, QL_DTYPE_F32, w,
                                 NULL, (ql_dtype)5, &q),
                   QL_EDTYPE);
  ck_assert_int_eq(quantize_args(QL_FORMAT_Q4G, 48, 1, 64, QL_DTYPE_F32, w,
                                 NULL, QL_DTYPE_BF16, &q),
                   QL_EINVAL);
  ck_assert_int_eq(quantize_args(QL_FORMAT_Q4G, 32, 0, 64, QL_DTYPE_F32, w,
                                 NULL, QL_DTYPE_BF16, &q),
                   QL_ESHAPE);
  ck_assert_int_eq(quantize_args(QL_FORMAT_Q8C, 0, 1, 0, QL_DTYPE_F32, w, NULL,
                                 QL_DTYPE_BF16, &q),
                   QL_ESHAPE);
  ck_assert_int_eq(quantize_args(QL_FORMAT_Q8C, 0, QL_DIM_MAX + 1, 1,
                                 QL_DTYPE_F32, w, NULL, QL_DTYPE_BF16, &q),
                   QL_ESHAPE);
  ck_assert_int_eq(quantize_args((ql_format)5, 32, 1, 64, QL_DTYPE_F32, w, NULL,
                                 QL_DTYPE_BF16, &q),
                   QL_EFORMAT);
  ck_assert_int_eq(quantize_args((ql_format)0, 32, 1, 64, QL_DTYPE_F32, w, NULL,
                                 QL_DTYPE_BF16, &q),
                   QL_EFORMAT);
  ck_assert_int_eq(quantize_args(QL_FORMAT_Q8B, 48, 1, 64, QL_DTYPE_F32, w,
                                 NULL, QL_DTYPE_BF16, &q),
                   QL_EINVAL);
  ck_assert_int_eq(quantize_args(QL_FORMAT_Q8B, 0, 1, 64, QL_DTYPE_F32, w, NULL,
                                 QL_DTYPE_BF16, &q),
                   QL_EINVAL);
  ck_assert_ptr_null(q);
  /* no parameters at all */
  q = (ql_qweight *)&q;
  ck_assert_int_eq(ql_qweight_quantize(NULL, 1, 64, QL_DTYPE_F32, w, NULL, &q),
                   QL_EINVAL);
  ck_assert_ptr_null(q);
}
END_TEST

/* asymmetric is q8b's alone, and only 0 or 1; the group size is kept for
 * q4g/q8b and set to K for q8c/f8r. */
START_TEST(test_quant_params) {
  static const ql_format others[3] = {QL_FORMAT_Q4G, QL_FORMAT_Q8C,
                                      QL_FORMAT_F8R};
  float w[2 * 70] = {0};
  ql_quant_params p;
  ql_qweight *q = NULL;
  int i;

  memset(&p, 0, sizeof p);
  p.group_size = 32;
  for (i = 0; i < 3; i++) {
    p.format = others[i];
    p.asymmetric = 1;
    q = (ql_qweight *)&q;
    ck_assert_int_eq(ql_qweight_quantize(&p, 2, 70, QL_DTYPE_F32, w, NULL, &q),
                     QL_EINVAL);
    ck_assert_ptr_null(q);
    p.asymmetric = 0;
    ck_assert_int_eq(ql_qweight_quantize(&p, 2, 70, QL_DTYPE_F32, w, NULL, &q),
                     0);
    ck_assert_int_eq(q->asymmetric, 0);
    ck_assert_uint_eq(q->group_size, others[i] == QL_FORMAT_Q4G ? 32 : 70);
    ck_assert_int_eq(q->groups, others[i] == QL_FORMAT_Q4G ? 3 : 1);
    ql_qweight_free(q);
  }
  p.format = QL_FORMAT_Q8B;
  p.asymmetric = 2;
  ck_assert_int_eq(ql_qweight_quantize(&p, 2, 70, QL_DTYPE_F32, w, NULL, &q),
                   QL_EINVAL);
  p.asymmetric = -1;
  ck_assert_int_eq(ql_qweight_quantize(&p, 2, 70, QL_DTYPE_F32, w, NULL, &q),
                   QL_EINVAL);
  ck_assert_ptr_null(q);
  for (i = 0; i < 2; i++) {
    p.asymmetric = i;
    p.group_size = 64;
    ck_assert_int_eq(ql_qweight_quantize(&p, 2, 70, QL_DTYPE_F32, w, NULL, &q),
                     0);
    ck_assert_int_eq(q->asymmetric, i);
    ck_assert_uint_eq(q->group_size, 64);
    ck_assert_int_eq(q->groups, 2);
    ck_assert_uint_eq(q->qdata_bytes, 140);
    ck_assert_uint_eq(q->scale_bytes, 2 * 2 * 4);
    ck_assert((q->zero != NULL) == (i == 1));
    ck_assert_int_eq(ql_qweight_check(q), 0);
    ql_qweight_free(q);
  }
  /* f8r ignores the group size */
  p.format = QL_FORMAT_F8R;
  p.asymmetric = 0;
  p.group_size = 3;
  ck_assert_int_eq(ql_qweight_quantize(&p, 2, 70, QL_DTYPE_F32, w, NULL, &q),
                   0);
  ck_assert_uint_eq(q->qdata_bytes, 140);
  ck_assert_uint_eq(q->scale_bytes, 8);
  ck_assert_ptr_null(q->zero);
  ql_qweight_free(q);
}
END_TEST

START_TEST(test_check_and_dequantize_args) {
  float w[2 * 40], out[2 * 40];
  ql_qweight *q, bad;
  int i;

  for (i = 0; i < 80; i++)
    w[i] = (float)i;
  q = quantize_ok(QL_FORMAT_Q4G, 32, 2, 40, w, NULL, QL_DTYPE_BF16);
  ck_assert_int_eq(ql_qweight_check(q), 0);
  ck_assert_int_eq(ql_qweight_check(NULL), QL_EINVAL);
  ck_assert_int_eq(ql_qweight_dequantize(NULL, out), QL_EINVAL);
  ck_assert_int_eq(ql_qweight_dequantize(q, NULL), QL_EINVAL);
  ck_assert_int_eq(ql_qweight_dequantize_row(q, 2, out), QL_ESHAPE);
  ck_assert_int_eq(ql_qweight_dequantize_row(q, -1, out), QL_ESHAPE);
  ck_assert_int_eq(ql_qweight_dequantize_row(q, 1, NULL), QL_EINVAL);

  bad = *q;
  bad.groups = 1;
  ck_assert_int_eq(ql_qweight_check(&bad), QL_EINVAL);
  bad = *q;
  bad.qdata_bytes--;
  ck_assert_int_eq(ql_qweight_dequantize(&bad, out), QL_EINVAL);
  bad = *q;
  bad.scale_bytes *= 2;
  ck_assert_int_eq(ql_qweight_check(&bad), QL_EINVAL);
  bad = *q;
  bad.zero = NULL;
  ck_assert_int_eq(ql_qweight_check(&bad), QL_EINVAL);
  bad = *q;
  bad.qdata = NULL;
  ck_assert_int_eq(ql_qweight_dequantize_row(&bad, 0, out), QL_EINVAL);
  bad = *q;
  bad.group_size = 40;
  ck_assert_int_eq(ql_qweight_check(&bad), QL_EINVAL);
  bad = *q;
  bad.format = (ql_format)5;
  ck_assert_int_eq(ql_qweight_check(&bad), QL_EFORMAT);
  bad = *q;
  bad.format = QL_FORMAT_Q8B; /* same gs, but K bytes per row */
  ck_assert_int_eq(ql_qweight_check(&bad), QL_EINVAL);
  bad = *q;
  bad.asymmetric = 1; /* q8b's flag on a q4g weight */
  ck_assert_int_eq(ql_qweight_check(&bad), QL_EINVAL);
  bad = *q;
  bad.scale_dtype = (ql_dtype)0;
  ck_assert_int_eq(ql_qweight_check(&bad), QL_EDTYPE);
  bad = *q;
  bad.k = 0;
  ck_assert_int_eq(ql_qweight_check(&bad), QL_ESHAPE);
  ql_qweight_free(q);

  /* q8b: zero[] present exactly when asymmetric; q8c/f8r: never */
  q = quantize_cfg(&(cfg){QL_FORMAT_Q8B, 32, 1}, 2, 40, w, NULL, QL_DTYPE_BF16);
  ck_assert_int_eq(ql_qweight_check(q), 0);
  bad = *q;
  bad.zero = NULL;
  ck_assert_int_eq(ql_qweight_check(&bad), QL_EINVAL);
  bad = *q;
  bad.asymmetric = 0;
  ck_assert_int_eq(ql_qweight_check(&bad), QL_EINVAL);
  bad = *q;
  bad.asymmetric = 2;
  ck_assert_int_eq(ql_qweight_check(&bad), QL_EINVAL);
  bad = *q;
  bad.group_size = 48;
  ck_assert_int_eq(ql_qweight_check(&bad), QL_EINVAL);
  bad = *q;
  bad.asymmetric = 0;
  bad.zero = NULL;
  ck_assert_int_eq(ql_qweight_check(&bad), 0); /* a well-formed symmetric */
  bad.format = QL_FORMAT_Q8C;                  /* same qdata size, G differs */
  ck_assert_int_eq(ql_qweight_check(&bad), QL_EINVAL);
  bad = *q;
  bad.format = QL_FORMAT_F8R;
  bad.asymmetric = 0;
  bad.groups = 1;
  bad.scale_bytes /= 2;
  ck_assert_int_eq(ql_qweight_check(&bad), QL_EINVAL); /* f8r with zero[] */
  bad.zero = NULL;
  ck_assert_int_eq(ql_qweight_check(&bad), 0);
  ql_qweight_free(q);

  /* free is safe on NULL and on a half-built weight */
  ql_qweight_free(NULL);
  q = calloc(1, sizeof *q);
  ck_assert_ptr_nonnull(q);
  q->qdata = malloc(16);
  ql_qweight_free(q);
}
END_TEST

/* A bf16/f16 weight quantizes exactly like its f32 widening. */
START_TEST(test_src_dtype_widening) {
  const cfg *c = &cfgs[_i];
  float w[4 * 100], wide[4 * 100], bias[4] = {1, 2, 3, 4};
  uint16_t w16[4 * 100], b16[4];
  size_t d, i;
  uint64_t rng = 7;

  for (i = 0; i < 400; i++)
    w[i] = (float)tu_rng_gauss(&rng);
  for (d = 1; d < 3; d++) {
    ql_dtype dt = all_dtypes[d];
    ql_qweight *a = NULL, *b;

    ql_from_f32(dt, w, w16, 400);
    ql_from_f32(dt, bias, b16, 4);
    ql_to_f32(dt, w16, wide, 400);
    ck_assert_int_eq(quantize_c(c, 4, 100, dt, w16, b16, QL_DTYPE_BF16, &a), 0);
    b = quantize_cfg(c, 4, 100, wide, bias, QL_DTYPE_BF16);
    ck_assert(a->qdata_bytes == b->qdata_bytes &&
              memcmp(a->qdata, b->qdata, a->qdata_bytes) == 0);
    ck_assert(memcmp(a->scale, b->scale, a->scale_bytes) == 0);
    ck_assert((a->zero != NULL) == (c->f == QL_FORMAT_Q4G || c->asym));
    ck_assert((b->zero != NULL) == (a->zero != NULL));
    if (a->zero != NULL)
      ck_assert(memcmp(a->zero, b->zero, a->scale_bytes) == 0);
    ck_assert(memcmp(a->bias, b->bias, 4 * sizeof(float)) == 0);
    check_weight(a, wide, NULL);
    ql_qweight_free(a);
    ql_qweight_free(b);
  }
}
END_TEST

/* On Gaussian data the quantization error is close to uniform within each
 * step: the measured MSE must be within 0.5–1.5× the mean Δ²/12, so a
 * "quantizer" that does not quantize (or quantizes too coarsely) fails. */
START_TEST(test_nmse_gaussian) {
  const cfg *c = &cfgs[_i];
  const int64_t n = 16, k = 1024;
  float *w = tu_xmalloc((size_t)(n * k) * sizeof(float));
  uint64_t rng = 42 + (uint64_t)_i;
  size_t d;
  int64_t i;

  for (i = 0; i < n * k; i++)
    w[i] = (float)tu_rng_gauss(&rng);
  for (d = 0; d < 3; d++) {
    ql_qweight *q = quantize_cfg(c, n, k, w, NULL, all_dtypes[d]);
    double ref, mse = check_weight(q, w, &ref) / (double)(n * k), ratio;

    ref /= (double)(n * k);
    ratio = mse / ref;
    REQUIRE(ratio > 0.5 && ratio < 1.5,
            "format %d gs %u %s: MSE %g vs Δ²/12 %g (ratio %g)", (int)c->f,
            c->gs, tu_dtype_name(all_dtypes[d]), mse, ref, ratio);
    if (c->f == QL_FORMAT_F8R) {
      /*
       * The relative error of e4m3 itself, derived rather than measured.
       * A value v = m·2^e (significand m in [1, 2)) sits on a grid of step
       * 2^(e-3) = 2^-3·|v|/m: a relative step of 2^-3 (m = 1) down to 2^-4
       * (m -> 2), and the rounding error is uniform over a step, so
       * E[err²] = 2^-6·v²/(12·m²). With a per-row scale the significand of
       * x/scale is log-uniform on [1, 2) (density 1/(m·ln 2)) and
       * independent of |x|, so
       *   NMSE = Σ err² / Σ x² = 2^-6/12 · E[m^-2]
       *        = 2^-6/12 · 3/(8·ln 2) = 2^-11/ln 2 ≈ 7.0e-4,
       * an RMS relative error of ≈ 2^-5.2.
       */
      double sx2 = 0.0, want = 0x1p-11 / log(2.0);
      for (i = 0; i < n * k; i++)
        sx2 += (double)w[i] * w[i];
      ratio = mse * (double)(n * k) / sx2 / want;
      REQUIRE(ratio > 0.5 && ratio < 1.5,
              "f8r %s: NMSE %g vs 2^-11/ln2 = %g (ratio %g)",
              tu_dtype_name(all_dtypes[d]), mse * (double)(n * k) / sx2, want,
              ratio);
    }
    ql_qweight_free(q);
  }
  free(w);
}
END_TEST

/* ---- borrowed imports: the arrays are used where they are */

static int released;
static void count_release(void *b) { released += b == &released; }

/* The canonical arrays of q as an import descriptor. */
static ql_import_desc desc_of(const ql_qweight *q) {
  ql_import_desc d;
  int sdt = (int)q->scale_dtype; /* ql_dtype values equal ADT 1..3 */
  memset(&d, 0, sizeof d);
  d.format = q->format;
  d.group_size = q->group_size;
  d.n = q->n;
  d.k = q->k;
  d.asymmetric = q->asymmetric;
  d.qdata = (ql_array){q->qdata, q->qdata_bytes,
                       q->format == QL_FORMAT_Q4G   ? QL_ADT_U8
                       : q->format == QL_FORMAT_F8R ? QL_ADT_F8E4M3
                                                    : QL_ADT_I8,
                       2,
                       {q->n, q->format == QL_FORMAT_Q4G ? (q->k + 1) / 2
                                                         : q->k}};
  int grouped = q->format == QL_FORMAT_Q4G || q->format == QL_FORMAT_Q8B;
  d.scale = (ql_array){q->scale, q->scale_bytes, sdt, grouped ? 2 : 1,
                       {grouped ? q->groups : q->n, grouped ? q->n : 1}};
  if (q->zero != NULL)
    d.zero = (ql_array){q->zero, q->scale_bytes, sdt, 2, {q->groups, q->n}};
  if (q->bias != NULL)
    d.bias = (ql_array){q->bias, (size_t)q->n * 4, QL_ADT_F32, 1, {q->n, 1}};
  return d;
}

START_TEST(test_import_borrowed) {
  static const ql_format fmts[] = {QL_FORMAT_Q4G, QL_FORMAT_Q8C,
                                   QL_FORMAT_Q8B, QL_FORMAT_F8R};
  enum { N = 12, K = 70 };
  float w[N * K], b[N], a[N * K], c[N * K];
  uint64_t st = 77;
  for (int i = 0; i < N * K; i++)
    w[i] = (float)tu_rng_gauss(&st);
  for (int i = 0; i < N; i++)
    b[i] = (float)tu_rng_gauss(&st);
  for (int f = 0; f < 4; f++) {
    ql_quant_params p = {fmts[f], fmts[f] == QL_FORMAT_Q8C ||
                                          fmts[f] == QL_FORMAT_F8R
                                      ? 0
                                      : 32,
                         fmts[f] == QL_FORMAT_Q8B, QL_DTYPE_BF16};
    ql_qweight *q = NULL, *v = NULL, *cp = NULL;
    char err[256];
    ck_assert_int_eq(ql_qweight_quantize(&p, N, K, QL_DTYPE_F32, w, b, &q), 0);
    ql_import_desc d = desc_of(q);
    ck_assert_int_eq(ql_qweight_import_borrowed(&d, &v, err, sizeof err), 0);
    ck_assert_int_eq(v->borrowed, 1);
    ck_assert_ptr_eq(v->qdata, q->qdata);
    ck_assert_ptr_eq(v->scale, q->scale);
    ck_assert_ptr_eq(v->zero, q->zero);
    ck_assert_ptr_eq(v->bias, q->bias);
    ck_assert_int_eq(ql_qweight_import(&d, &cp, err, sizeof err), 0);
    ck_assert_int_eq(cp->borrowed, 0);
    ck_assert_int_eq(ql_qweight_dequantize(v, a), 0);
    ck_assert_int_eq(ql_qweight_dequantize(cp, c), 0);
    ck_assert_mem_eq(a, c, sizeof a);
    /* Freeing a borrowed weight releases its backing, not the arrays. */
    released = 0;
    v->backing = &released;
    v->release = count_release;
    ql_qweight_free(v);
    ck_assert_int_eq(released, 1);
    ck_assert_int_eq(q->qdata[0], cp->qdata[0]);

    /* Not canonical, or misaligned: declined before any check. */
    ql_import_desc e = d;
    e.bias.dtype = QL_ADT_BF16;
    ck_assert_int_eq(ql_qweight_import_borrowed(&e, &v, err, sizeof err),
                     QL_ENOTSUP);
    ck_assert_ptr_null(v);
    e = d;
    e.scale.data = (const uint8_t *)d.scale.data + 1;
    ck_assert_int_eq(ql_qweight_import_borrowed(&e, &v, err, sizeof err),
                     QL_ENOTSUP);
    /* The values are checked as in a copying import. */
    uint16_t saved;
    memcpy(&saved, q->scale, 2);
    uint16_t nan = 0x7fc0; /* bf16 NaN */
    memcpy(q->scale, &nan, 2);
    ck_assert_int_eq(ql_qweight_import_borrowed(&d, &v, err, sizeof err),
                     QL_ENONFINITE);
    ck_assert_ptr_nonnull(strstr(err, "scale"));
    memcpy(q->scale, &saved, 2);
    if (fmts[f] == QL_FORMAT_F8R) {
      uint8_t keep = q->qdata[5];
      q->qdata[5] = 0x7f;
      ck_assert_int_eq(ql_qweight_import_borrowed(&d, &v, err, sizeof err),
                       QL_ENONFINITE);
      q->qdata[5] = keep;
    }
    if (fmts[f] == QL_FORMAT_Q4G) { /* K = 70 is even: make it odd */
      ql_import_desc o = d;
      o.k = K - 1;
      o.qdata.shape[1] = (K - 1 + 1) / 2;
      ck_assert_int_eq(
          ql_qweight_import_borrowed(&o, &v, err, sizeof err) != 0, 1);
    }
    ql_qweight_free(cp);
    ql_qweight_free(q);
  }
}
END_TEST

/*
 * Finite scales and zeros whose codes dequantize past FLT_MAX are refused
 * (QL_ENONFINITE), by the imports and the quantizer: kernels that
 * dequantize first would give Inf where the reference gives a number.
 * TorchAO's integer zero point form makes such a zero itself: q4g, bf16
 * scale 2^125, zp 1 is (u - 1)·s, finite, but -8·s overflows.
 */
START_TEST(test_dequant_range_refused) {
  static const ql_format fmts[] = {QL_FORMAT_Q4G, QL_FORMAT_Q8C,
                                   QL_FORMAT_Q8B, QL_FORMAT_F8R};
  enum { N = 4, K = 64 };
  float w[N * K];
  uint64_t st = 78;
  char err[256];
  for (int i = 0; i < N * K; i++)
    w[i] = (float)tu_rng_gauss(&st);
  for (int f = 0; f < 4; f++) {
    int gs = fmts[f] == QL_FORMAT_Q8C || fmts[f] == QL_FORMAT_F8R ? 0 : 32;
    ql_quant_params p = {fmts[f], (uint32_t)gs, 0, QL_DTYPE_F32};
    ql_qweight *q = NULL, *v = NULL;
    ck_assert_int_eq(ql_qweight_quantize(&p, N, K, QL_DTYPE_F32, w, NULL, &q),
                     0);
    ck_assert_int_eq(ql__qweight_range_fault(q), -1);
    ql_import_desc d = desc_of(q);
    float *sc = q->scale, keep = sc[1];
    /* the largest scale whose extreme code stays finite, then past it */
    double qmax = fmts[f] == QL_FORMAT_Q4G   ? 8.0
                  : fmts[f] == QL_FORMAT_F8R ? 448.0
                                             : 128.0;
    float zero1 = q->zero != NULL ? fabsf(((float *)q->zero)[1]) : 0.0f;
    sc[1] = nextafterf((float)(((double)FLT_MAX - zero1) / qmax), 0.0f);
    ck_assert_int_eq(ql__qweight_range_fault(q), -1);
    ck_assert_int_eq(ql_qweight_import(&d, &v, err, sizeof err), 0);
    ql_qweight_free(v);
    sc[1] = (float)((double)FLT_MAX / qmax) * 1.001f;
    ck_assert(isfinite(sc[1]));
    ck_assert_int_eq(ql__qweight_range_fault(q), 1);
    ck_assert_int_eq(ql_qweight_import(&d, &v, err, sizeof err),
                     QL_ENONFINITE);
    ck_assert_ptr_null(v);
    ck_assert_ptr_nonnull(strstr(err, "scale"));
    ck_assert_int_eq(ql_qweight_import_borrowed(&d, &v, err, sizeof err),
                     QL_ENONFINITE);
    sc[1] = keep;
    ql_qweight_free(q);
  }
  /* The integer zero point form: 2^125 with zero point 1. */
  {
    uint8_t qd[16] = {0}, zp[1] = {1};
    uint16_t s = 0x7E00; /* bf16 2^125 */
    ql_import_desc d;
    ql_qweight *v = NULL;
    memset(&d, 0, sizeof d);
    d.format = QL_FORMAT_Q4G;
    d.group_size = 32;
    d.n = 1;
    d.k = 32;
    d.zero_kind = QL_ZERO_INT;
    d.qdata = (ql_array){qd, sizeof qd, QL_ADT_U8, 2, {1, 16}};
    d.scale = (ql_array){&s, 2, QL_ADT_BF16, 2, {1, 1}};
    d.zero = (ql_array){zp, 1, QL_ADT_U8, 2, {1, 1}};
    ck_assert_int_eq(ql_qweight_import(&d, &v, err, sizeof err),
                     QL_ENONFINITE);
    ck_assert_ptr_null(v);
    s = 0x7C00; /* 2^121: -8·s + 7·s fits */
    ck_assert_int_eq(ql_qweight_import(&d, &v, err, sizeof err), 0);
    float out[32];
    ck_assert_int_eq(ql_qweight_dequantize(v, out), 0);
    for (int i = 0; i < 32; i++)
      ck_assert(isfinite(out[i]));
    ql_qweight_free(v);
  }
  /* The quantizer: a q8c row reaching -FLT_MAX gives -128 for its most
   * negative value, -128/127 of FLT_MAX. */
  {
    float row[K];
    for (int i = 0; i < K; i++)
      row[i] = 0.5f;
    row[3] = -FLT_MAX;
    ql_quant_params p = {QL_FORMAT_Q8C, 0, 0, QL_DTYPE_F32};
    ql_qweight *q = (ql_qweight *)&q;
    ck_assert_int_eq(ql_qweight_quantize(&p, 1, K, QL_DTYPE_F32, row, NULL,
                                         &q),
                     QL_ENONFINITE);
    ck_assert_ptr_null(q);
    row[3] = -1e38f; /* fits */
    ck_assert_int_eq(ql_qweight_quantize(&p, 1, K, QL_DTYPE_F32, row, NULL,
                                         &q),
                     0);
    ql_qweight_free(q);
  }
}
END_TEST

static Suite *formats_suite(void) {
  Suite *s = suite_create("formats");
  TCase *tc;

  tc = tcase_create("convert");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_f16_exhaustive);
  tcase_add_test(tc, test_bf16_exhaustive);
  tcase_add_test(tc, test_f16_rounding_cases);
  tcase_add_test(tc, test_bf16_rounding_cases);
  tcase_add_test(tc, test_narrowing_random_nearest);
  tcase_add_test(tc, test_array_conversions);
  tcase_add_test(tc, test_e4m3_all_codes);
  tcase_add_test(tc, test_e4m3_boundaries);
  tcase_add_test(tc, test_e4m3_rounding_cases);
  tcase_add_test(tc, test_e4m3_random_nearest);
  suite_add_tcase(s, tc);

  tc = tcase_create("sizes");
  tcase_add_test(tc, test_group_size_valid);
  tcase_add_test(tc, test_sizes);
  tcase_add_test(tc, test_sizes_reject);
  suite_add_tcase(s, tc);

  tc = tcase_create("quantize");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_q4g_pack_tiny);
  tcase_add_test(tc, test_q4g_scale_layout);
  tcase_add_test(tc, test_q8c_minus128);
  tcase_add_test(tc, test_q4g_ties_and_division);
  tcase_add_test(tc, test_q8c_reciprocal);
  tcase_add_test(tc, test_q8b_layout);
  tcase_add_test(tc, test_q8b_sym_ties_minus128);
  tcase_add_test(tc, test_q8b_asym_ties_and_division);
  tcase_add_test(tc, test_q8b_sym_vs_asym);
  tcase_add_test(tc, test_f8r_tiny);
  tcase_add_test(tc, test_f8r_division_and_saturation);
  tcase_add_loop_test(tc, test_roundtrip_ragged, 0, NCFG);
  tcase_add_loop_test(tc, test_zero_and_constant_rows, 0, NCFG);
  tcase_add_loop_test(tc, test_nonfinite_rejected, 0, NCFG);
  tcase_add_test(tc, test_param_overflow_rejected);
  tcase_add_test(tc, test_quantize_bad_args);
  tcase_add_test(tc, test_quant_params);
  tcase_add_loop_test(tc, test_default_scale_dtype, 0, NCFG);
  tcase_add_test(tc, test_f8r_default_scale_dtype);
  tcase_add_test(tc, test_check_and_dequantize_args);
  tcase_add_test(tc, test_import_borrowed);
  tcase_add_test(tc, test_dequant_range_refused);
  tcase_add_loop_test(tc, test_src_dtype_widening, 0, NCFG);
  tcase_add_loop_test(tc, test_nmse_gaussian, 0, NCFG);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run_suite(formats_suite(), CK_NORMAL); }
