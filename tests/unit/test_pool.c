/*
 * test_pool.c - the CPU backend's thread pool when the system gives it
 * fewer threads than configured (pthread_create failing: RLIMIT_NPROC, a
 * cgroup's pids.max, systemd's TasksMax). Callers plan their grids of
 * parts from ql__cpu_threads(), the configured count; the pool must still
 * run every part of that grid exactly once, and a linear call must give
 * the generic op's bytes and write nothing past y. (It ran the parts the
 * threads it had, so the grid divided by zero or computed rows past M.)
 *
 * Also: a small launch in parts keeps to the threads it was given.
 *
 * pthread_create is interposed here: the pool's object is linked into
 * this program, so its calls reach this definition, which fails once
 * `allow` threads have been made.
 */
#include "config.h"

#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "ql_kernels.h"
#include "registry.h"
#include "testutil.h"

static int allow = -1; /* threads pthread_create may still make; < 0: all */

typedef int (*create_fn)(pthread_t *, const pthread_attr_t *,
                         void *(*)(void *), void *);

int pthread_create(pthread_t *t, const pthread_attr_t *attr,
                   void *(*fn)(void *), void *arg) {
  static create_fn real;
  if (real == NULL) {
    void *sym = dlsym(RTLD_NEXT, "pthread_create");
    memcpy(&real, &sym, sizeof real);
  }
  if (allow == 0)
    return EAGAIN;
  if (allow > 0)
    allow--;
  return real(t, attr, fn, arg);
}

static void count_part(void *ctx, int part, int parts) {
  int *hits = ctx;
  ck_assert_int_eq(parts, 4);
  ck_assert_int_lt(part, parts);
  __atomic_fetch_add(&hits[part], 1, __ATOMIC_RELAXED);
}

/* 4 threads configured; the system gives 1 worker (and the caller), or
 * none: every part of 4 runs once, in every call. */
START_TEST(test_parts_with_fewer_threads) {
  static const int allowed[] = {1, 0};
  setenv("QL_CPU_THREADS", "4", 1);
  allow = allowed[_i];
  ck_assert_int_eq(ql__cpu_threads(), 4);
  for (int call = 0; call < 50; call++) {
    int hits[4] = {0, 0, 0, 0};
    ql__cpu_parallel(count_part, hits, 4);
    for (int p = 0; p < 4; p++)
      ck_assert_int_eq(hits[p], 1);
  }
}
END_TEST

/* A random q8c weight n x k and m rows of x (*x, the caller frees it). */
static ql_qweight *make_case(uint64_t seed, int64_t n, int64_t k, int64_t m,
                             float **x) {
  float *w = tu_xmalloc((size_t)(n * k) * sizeof(float));
  *x = tu_xmalloc((size_t)(m * k) * sizeof(float));
  for (int64_t i = 0; i < n * k; i++)
    w[i] = (float)(0.05 * tu_rng_gauss(&seed));
  for (int64_t i = 0; i < m * k; i++)
    (*x)[i] = (float)tu_rng_gauss(&seed);
  ql_quant_params qp = {QL_FORMAT_Q8C, 0, 0, QL_DTYPE_F32};
  ql_qweight *q = NULL;
  ck_assert_int_eq(ql_qweight_quantize(&qp, n, k, QL_DTYPE_F32, w, NULL, &q),
                   0);
  free(w);
  return q;
}

/* A linear call with the grid planned for 4 threads, on a pool of 2 (or
 * 1): the generic op's bytes, and the bytes past y untouched. The shapes
 * split tiles only (256 x 1024, M = 4) and tiles and rows (32 x 256,
 * M = 64: 2 tiles, so 2 row parts). */
START_TEST(test_linear_with_fewer_threads) {
  static const int allowed[] = {1, 0};
  static const int64_t shapes[][3] = {{256, 1024, 4}, {32, 256, 64}};
  setenv("QL_CPU_THREADS", "4", 1);
  allow = allowed[_i];
  const ql_backend *cpu = ql_backend_find("cpu");
  ck_assert_ptr_nonnull(cpu);
  for (int s = 0; s < 2; s++) {
    int64_t n = shapes[s][0], k = shapes[s][1], m = shapes[s][2];
    float *x;
    ql_qweight *q = make_case(5 + (uint64_t)s, n, k, m, &x);
    for (int aq = 0; aq < 2; aq++) {
      ql_op op = aq ? QL_OP_LINEAR_AQ : QL_OP_LINEAR_WO;
      const ql_kernel_impl *im =
          ql_dispatch(cpu, op, QL_FORMAT_Q8C, QL_DTYPE_F32, m, n, k);
      const ql_kernel_impl *rp = ql_dispatch(cpu, QL_OP_REPACK, QL_FORMAT_Q8C,
                                             QL_DTYPE_F32, 0, n, k);
      ck_assert_ptr_nonnull(im);
      ck_assert_ptr_nonnull(rp);
      ql_repack_args ra = {q, NULL, 0};
      ck_assert_int_eq(rp->fn.repack(&ra), 0);
      size_t ny = (size_t)(m * n), guard = (size_t)(m * n);
      float *y = tu_xmalloc((ny + guard) * sizeof(float));
      float *want = tu_xmalloc(ny * sizeof(float));
      memset(y, 0x5A, (ny + guard) * sizeof(float));
      ql_linear_args a = {q, ra.packed, QL_DTYPE_F32, x, m, y, NULL};
      ck_assert_int_eq(im->fn.linear(&a), 0);
      ck_assert_int_eq(aq ? ql_linear_aq_ref(q, QL_DTYPE_F32, x, m, want)
                          : ql_linear_wo_ref(q, QL_DTYPE_F32, x, m, want),
                       0);
      ck_assert_msg(memcmp(y, want, ny * sizeof(float)) == 0,
                    "%s %lldx%lld M=%lld: not the generic op's bytes",
                    im->name, (long long)n, (long long)k, (long long)m);
      for (size_t i = 0; i < guard * sizeof(float); i++)
        ck_assert_uint_eq(((unsigned char *)(y + ny))[i], 0x5A);
      rp->free_packed(ra.packed);
      free(y);
      free(want);
    }
    ql_qweight_free(q);
    free(x);
  }
}
END_TEST

/* Parts that wait until the test lets them go: the pool stays busy. */
static atomic_int inside, release;
static void hold_part(void *ctx, int part, int parts) {
  (void)ctx;
  (void)parts;
  if (part == 0)
    atomic_store(&inside, 1);
  while (!atomic_load(&release))
    sched_yield();
}

static void *hold_pool(void *arg) {
  (void)arg;
  ql__cpu_parallel(hold_part, NULL, 2);
  return NULL;
}

/* A launch in parts that is small enough to run whole keeps to the
 * threads it was given (ql_linear_part.threads = 1: the daemon leaves a
 * CPU to decode work): it runs on the calling thread alone, and so ends
 * while another call holds the pool. (It took the whole pool, and waited
 * for that call.) */
START_TEST(test_small_part_launch_keeps_to_its_threads) {
  setenv("QL_CPU_THREADS", "2", 1);
  const ql_backend *cpu = ql_backend_find("cpu");
  ck_assert_ptr_nonnull(cpu);
  const int64_t n = 64, k = 512, m = 32; /* 1M multiply-adds: run whole */
  float *x;
  ql_qweight *q = make_case(9, n, k, m, &x);
  const ql_kernel_impl *rp =
      ql_dispatch(cpu, QL_OP_REPACK, QL_FORMAT_Q8C, QL_DTYPE_F32, 0, n, k);
  ql_repack_args ra = {q, NULL, 0};
  ck_assert_int_eq(rp->fn.repack(&ra), 0);
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, hold_pool, NULL), 0);
  while (!atomic_load(&inside))
    sched_yield();
  for (int aq = 0; aq < 2; aq++) {
    ql_op op = aq ? QL_OP_LINEAR_AQ : QL_OP_LINEAR_WO;
    const ql_kernel_impl *im =
        ql_dispatch(cpu, op, QL_FORMAT_Q8C, QL_DTYPE_F32, m, n, k);
    float *y = tu_xmalloc((size_t)(m * n) * sizeof(float));
    float *want = tu_xmalloc((size_t)(m * n) * sizeof(float));
    ql_linear_part part;
    memset(&part, 0, sizeof part);
    part.threads = 1;
    ql_linear_args a = {q, ra.packed, QL_DTYPE_F32, x, m, y, &part};
    ck_assert_int_eq(im->fn.linear(&a), 0); /* (the check timeout if not) */
    ck_assert_int_eq(part.done, 1);
    ck_assert_int_eq(aq ? ql_linear_aq_ref(q, QL_DTYPE_F32, x, m, want)
                        : ql_linear_wo_ref(q, QL_DTYPE_F32, x, m, want),
                     0);
    ck_assert_mem_eq(y, want, (size_t)(m * n) * sizeof(float));
    free(y);
    free(want);
  }
  atomic_store(&release, 1);
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  rp->free_packed(ra.packed);
  ql_qweight_free(q);
  free(x);
}
END_TEST

static Suite *pool_suite(void) {
  Suite *s = suite_create("pool");
  TCase *tc = tcase_create("fewer threads");
  tcase_add_loop_test(tc, test_parts_with_fewer_threads, 0, 2);
  tcase_add_loop_test(tc, test_linear_with_fewer_threads, 0, 2);
  tcase_add_test(tc, test_small_part_launch_keeps_to_its_threads);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run_suite(pool_suite(), CK_NORMAL); }
