/*
 * testutil.h - helpers shared by the test programs: a silent assertion, a
 * seedable random stream, f32 bit access, an independent round half to
 * even, and the check runner's main().
 *
 * Header only, static inline and macros, no global state: each random
 * stream is a uint64_t the caller owns and passes by pointer, so the same
 * seed gives the same numbers on every platform and in every process.
 */
#ifndef QL_TESTUTIL_H
#define QL_TESTUTIL_H

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ql_defs.h"

/* Like ck_assert_msg, but silent when it passes: check records a location
 * (a pipe write in fork mode) for every passing ck_assert, which makes
 * exhaustive loops slow. A macro so that a failure names the caller's line. */
#define REQUIRE(cond, ...)                                                     \
  do {                                                                         \
    if (!(cond))                                                               \
      ck_abort_msg(__VA_ARGS__);                                               \
  } while (0)

/* malloc that fails the test instead of returning NULL. */
static inline void *tu_xmalloc(size_t n) {
  void *p = malloc(n);
  ck_assert_ptr_nonnull(p);
  return p;
}

/* splitmix64: small, fixed, reproducible everywhere. *state is the seed
 * before the first call. */
static inline uint64_t tu_rng_next(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform in the open interval (0, 1): one draw. */
static inline double tu_rng_uniform(uint64_t *state) {
  return ((double)(tu_rng_next(state) >> 11) + 0.5) * 0x1p-53;
}

/* Standard normal by Box–Muller: two draws, the first feeds the log. */
static inline double tu_rng_gauss(uint64_t *state) {
  double u1 = tu_rng_uniform(state), u2 = tu_rng_uniform(state);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* The bits of an f32, and back (memcpy: no aliasing games). */
static inline uint32_t tu_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float tu_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Round half to even, written out (no rint) so that expected values do
 * not depend on the rounding mode or on the code under test. */
static inline double tu_rne(double v) {
  double f = floor(v), d = v - f;
  if (d > 0.5)
    return f + 1.0;
  if (d < 0.5)
    return f;
  return fmod(f, 2.0) == 0.0 ? f : f + 1.0;
}

/* "f32", "f16" or "bf16", for failure messages. */
static inline const char *tu_dtype_name(ql_dtype dt) {
  return dt == QL_DTYPE_F32 ? "f32" : dt == QL_DTYPE_F16 ? "f16" : "bf16";
}

/* Element i of a row of 4-bit two's complement values packed two to a
 * byte, the even element in the low nibble (the q4g layout). */
static inline int tu_s4_at(const uint8_t *row, int64_t i) {
  int nib = (row[i / 2] >> ((i % 2) * 4)) & 0xF;
  return nib >= 8 ? nib - 16 : nib;
}

/* The body of a test program's main(): runs s (and frees it) with the
 * given output mode; EXIT_SUCCESS when no test failed. */
static inline int tu_run_suite(Suite *s, enum print_output mode) {
  SRunner *sr = srunner_create(s);
  int failed;

  srunner_run_all(sr, mode);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/* The e4m3fn rules of DESIGN §4 written independently of kernels/convert.c,
 * for tests to check the kernels against. */
/* Value of an e4m3fn code from the definition: bias 7, 3 mantissa bits,
 * subnormals m·2^-9 (not for the NaN codes 0x7F/0xFF). */
static inline double tu_e4m3_value(uint32_t c) {
  int e = (c >> 3) & 0xF, m = c & 7;
  double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
  return (c & 0x80) ? -v : v;
}

/* The e4m3fn code nearest to v by exhaustive search, ties to the even code
 * (even mantissa), saturating at ±448, NaN to 0x7F|sign: the conversion
 * rule written independently of convert.c's bit manipulation. */
static inline uint8_t tu_e4m3_nearest(double v) {
  uint8_t sign = signbit(v) ? 0x80 : 0;
  double a = fabs(v), db = a;
  uint32_t best = 0, c;

  if (isnan(v))
    return sign | 0x7F;
  if (a >= 448.0)
    return sign | 0x7E;
  for (c = 1; c <= 0x7E; c++) {
    double d = fabs(a - tu_e4m3_value(c));
    if (d < db || (d == db && !(c & 1))) {
      best = c;
      db = d;
    }
  }
  return (uint8_t)(sign | best);
}

/* The spacing of e4m3 values around magnitude a (a <= 448): 2^-9 below
 * 2^-6 (subnormals), else 2^(floor(log2 a) - 3). */
static inline double tu_e4m3_ulp(double a) {
  int e;
  if (a < 0x1p-6)
    return 0x1p-9;
  frexp(a, &e); /* a in [2^(e-1), 2^e) */
  return ldexp(1.0, e - 4);
}


#endif
