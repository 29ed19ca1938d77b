/*
 * test_crossover.c - the crossover choice from measured times, and the
 * measurement itself on fake kernels that advance a fake clock (no real
 * timing: the same answers on any machine, however loaded).
 */
#include <stdlib.h>
#include <string.h>

#include <check.h>

#include "crossover.h"
#include "testutil.h"

static ql_crossover times(int n, const double *wo, const double *aq) {
  ql_crossover c;
  memset(&c, 0, sizeof c);
  c.n = n;
  for (int i = 0; i < n; i++) {
    c.m[i] = (int64_t)1 << i;
    c.wo_ns[i] = wo[i];
    c.aq_ns[i] = aq[i];
  }
  return c;
}

START_TEST(test_choose) {
  static const double wo[] = {10, 20, 40, 80, 160};
  static const double always[] = {5, 5, 5, 5, 5};
  static const double from8[] = {50, 50, 50, 50, 50};
  static const double never[] = {500, 500, 500, 500, 500};
  static const double noisy[] = {9, 25, 30, 90, 100}; /* wins 1, 4, 16 */
  static const double band[] = {5, 10, 20, 100, 200}; /* wins small only */
  static const double none[] = {0, 0, 0, 0, 0};
  static const double tie[] = {10, 20, 40, 80, 160};
  ql_crossover c = times(5, wo, always);
  ck_assert_uint_eq(ql_crossover_choose(&c), 1);
  c = times(5, wo, from8);
  ck_assert_uint_eq(ql_crossover_choose(&c), 8); /* 50 > 40 at M = 4 */
  c = times(5, wo, from8);
  c.aq_ns[3] = 81; /* a loss at 8 moves it to 16 */
  ck_assert_uint_eq(ql_crossover_choose(&c), 16);
  c = times(5, wo, never);
  ck_assert_uint_eq(ql_crossover_choose(&c), QL_CROSSOVER_NEVER);
  /* Minimax: from 4 the worst is 90/80 at M = 8; from 1 it would be 25/20
   * at M = 2, from 16 40/30 at M = 4. */
  c = times(5, wo, noisy);
  ck_assert_uint_eq(ql_crossover_choose(&c), 4);
  /* AQ wins small and loses big: 200/160 from 1 beats 20/5 never. */
  c = times(5, wo, band);
  ck_assert_uint_eq(ql_crossover_choose(&c), 1);
  c = times(5, wo, none);
  ck_assert_uint_eq(ql_crossover_choose(&c), QL_CROSSOVER_NEVER);
  c = times(5, wo, tie); /* no slower is good enough */
  ck_assert_uint_eq(ql_crossover_choose(&c), 1);
  c = times(0, wo, always);
  ck_assert_uint_eq(ql_crossover_choose(&c), QL_CROSSOVER_NEVER);
  ck_assert_uint_eq(ql_crossover_choose(NULL), QL_CROSSOVER_NEVER);
}
END_TEST

/* A fake clock the fake kernels advance: weight-only costs 2 us a row,
 * activation-quantized 3 us plus 0.1 us a row (or aq_fixed when set). */
static uint64_t fake_now;
static uint64_t aq_fixed;
static int calls_wo, calls_aq;

static uint64_t fake_clock(void *arg) {
  (void)arg;
  return fake_now;
}

static int fake_wo(const ql_linear_args *a) {
  fake_now += 2000u * (uint64_t)a->m;
  calls_wo++;
  return 0;
}

static int fake_aq(const ql_linear_args *a) {
  fake_now += aq_fixed ? aq_fixed : 3000u + 100u * (uint64_t)a->m;
  calls_aq++;
  return 0;
}

static const ql_kernel_impl fake_impls[] = {
    {.name = "fake.wo",
     .op = QL_OP_LINEAR_WO,
     .formats = QL_ALL_FORMATS,
     .dtypes = QL_ALL_DTYPES,
     .fn.linear = fake_wo},
    {.name = "fake.aq",
     .op = QL_OP_LINEAR_AQ,
     .formats = QL_FMT_BIT(QL_FORMAT_Q8C),
     .dtypes = QL_ALL_DTYPES,
     .fn.linear = fake_aq},
};
static const ql_backend fake = {.name = "fake", .impls = fake_impls, .n_impls = 2};

static ql_qweight *small(ql_format f) {
  enum { N = 8, K = 64 };
  float w[N * K];
  uint64_t st = 5;
  for (int i = 0; i < N * K; i++)
    w[i] = (float)tu_rng_gauss(&st);
  ql_quant_params p = {f, f == QL_FORMAT_Q8B ? 32 : 0, 0, 0};
  ql_qweight *q = NULL;
  ck_assert_int_eq(ql_qweight_quantize(&p, N, K, QL_DTYPE_F32, w, NULL, &q), 0);
  return q;
}

START_TEST(test_measure) {
  ql_qweight *q = small(QL_FORMAT_Q8C);
  ql_crossover c;
  /* WO wins at M = 1 (2 us < 3.1 us), AQ from 2 on; every size is timed. */
  fake_now = 0;
  aq_fixed = 0;
  calls_wo = calls_aq = 0;
  ck_assert_int_eq(ql_crossover_measure_clock(&fake, q, NULL, QL_DTYPE_F32,
                                              512, (uint64_t)1e12, fake_clock,
                                              NULL, &c),
                   0);
  ck_assert_int_eq(c.n, 10);
  ck_assert_uint_eq(c.rows, 2);
  ck_assert_int_eq(c.m[9], 512);
  ck_assert(c.wo_ns[0] == 2000 && c.aq_ns[0] == 3100);
  ck_assert(c.wo_ns[2] == 8000 && c.aq_ns[2] == 3400);
  ck_assert_int_eq(calls_wo, 50); /* 5 fresh calls per size and path */
  ck_assert_int_eq(calls_aq, 50);
  /* AQ never wins: every size up to max_m. */
  fake_now = 0;
  aq_fixed = 100000000;
  ck_assert_int_eq(ql_crossover_measure_clock(&fake, q, NULL, QL_DTYPE_F32,
                                              64, (uint64_t)1e12, fake_clock,
                                              NULL, &c),
                   0);
  ck_assert_int_eq(c.n, 7);
  ck_assert_uint_eq(c.rows, QL_CROSSOVER_NEVER);
  /* The budget stops it after the size that used it up. */
  fake_now = 0;
  ck_assert_int_eq(ql_crossover_measure_clock(&fake, q, NULL, QL_DTYPE_F32,
                                              512, 600000000u, fake_clock,
                                              NULL, &c),
                   0);
  ck_assert_int_eq(c.n, 2);
  ql_qweight_free(q);
  /* No activation-quantized path: nothing measured. */
  q = small(QL_FORMAT_Q8B);
  calls_wo = 0;
  ck_assert_int_eq(ql_crossover_measure_clock(&fake, q, NULL, QL_DTYPE_F32,
                                              512, (uint64_t)1e12, fake_clock,
                                              NULL, &c),
                   0);
  ck_assert_int_eq(c.n, 0);
  ck_assert_uint_eq(c.rows, QL_CROSSOVER_NEVER);
  ck_assert_int_eq(calls_wo, 0);
  ck_assert_int_eq(ql_crossover_measure(&fake, q, NULL, QL_DTYPE_F32, 0,
                                        1, &c),
                   QL_EINVAL);
  ql_qweight_free(q);
}
END_TEST

int main(void) {
  Suite *s = suite_create("crossover");
  TCase *tc = tcase_create("crossover");
  tcase_add_test(tc, test_choose);
  tcase_add_test(tc, test_measure);
  suite_add_tcase(s, tc);
  return tu_run_suite(s, CK_NORMAL);
}
