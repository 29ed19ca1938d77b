/*
 * test_hooks.c - daemon/faults.c: the QL_TEST_* hooks read from the
 * environment in their units and clamped to their bounds, an unset or
 * zero hook sleeping not at all, a set one at least its delay. In a build
 * configured --disable-test-hooks every hook must read as unset whatever
 * the environment says. (check runs each test in its own process, so
 * setenv stays local.)
 */
#include "config.h"

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "faults.h"

#ifdef QL_TEST_HOOKS
static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
#endif

static void set_all(const char *kernel, const char *early, const char *piece,
                    const char *start) {
  setenv("QL_TEST_KERNEL_DELAY_MS", kernel, 1);
  setenv("QL_TEST_EARLY_DELAY_MS", early, 1);
  setenv("QL_TEST_PIECE_DELAY_US", piece, 1);
  setenv("QL_TEST_START_DELAY_MS", start, 1);
}

START_TEST(units_and_bounds) {
  set_all("25", "7", "300", "99999999");
  ql__faults_init();
#ifdef QL_TEST_HOOKS
  ck_assert_uint_eq(ql__fault_delay_ns(QL_FAULT_KERNEL), 25000000u);
  ck_assert_uint_eq(ql__fault_delay_ns(QL_FAULT_EARLY), 7000000u);
  ck_assert_uint_eq(ql__fault_delay_ns(QL_FAULT_PIECE), 300000u);
  /* Clamped to a minute. */
  ck_assert_uint_eq(ql__fault_delay_ns(QL_FAULT_START), 60000000000u);
  /* A set hook sleeps at least its delay (nanosleep never returns early
   * without a signal); only a lower bound, which no load can break. */
  uint64_t t0 = now_ns();
  ql__fault_sleep(QL_FAULT_KERNEL);
  ck_assert_uint_ge(now_ns() - t0, 25000000u);
#else
  for (int f = 0; f < QL_FAULT_N_; f++)
    ck_assert_uint_eq(ql__fault_delay_ns((ql__fault)f), 0);
#endif
}
END_TEST

START_TEST(unset_and_zero) {
  unsetenv("QL_TEST_KERNEL_DELAY_MS");
  unsetenv("QL_TEST_EARLY_DELAY_MS");
  setenv("QL_TEST_PIECE_DELAY_US", "0", 1);
  setenv("QL_TEST_START_DELAY_MS", "not a number", 1);
  ql__faults_init();
  for (int f = 0; f < QL_FAULT_N_; f++)
    ck_assert_uint_eq(ql__fault_delay_ns((ql__fault)f), 0);
  /* A second init reads the environment again. */
  set_all("1", "0", "0", "0");
  ql__faults_init();
#ifdef QL_TEST_HOOKS
  ck_assert_uint_eq(ql__fault_delay_ns(QL_FAULT_KERNEL), 1000000u);
#else
  ck_assert_uint_eq(ql__fault_delay_ns(QL_FAULT_KERNEL), 0);
#endif
  ck_assert_uint_eq(ql__fault_delay_ns(QL_FAULT_EARLY), 0);
}
END_TEST

int main(void) {
  Suite *su = suite_create("hooks");
  TCase *tc = tcase_create("env");
  tcase_add_test(tc, units_and_bounds);
  tcase_add_test(tc, unset_and_zero);
  suite_add_tcase(su, tc);
  SRunner *sr = srunner_create(su);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
