/*
 * test_registry.c - the kernel registry: the generic implementations,
 * the built-in backend table, registration checks, and dispatch choosing a
 * backend's own implementation only where it handles the format, dtype
 * and shape.
 */
#include <string.h>

#include <check.h>

#include "registry.h"

static int fake_calls;

static int fake_linear(const ql_linear_args *a) {
  (void)a;
  fake_calls++;
  return 12345;
}

/* Declines batches of more than 4 rows. */
static int small_m_only(const ql_kernel_impl *im, ql_format f, int64_t m,
                        int64_t n, int64_t k) {
  (void)im;
  (void)f;
  (void)n;
  (void)k;
  return m <= 4;
}

static const ql_kernel_impl fake_impls[] = {
    {.name = "fake.linear_wo",
     .op = QL_OP_LINEAR_WO,
     .formats = QL_FMT_BIT(QL_FORMAT_Q8C),
     .dtypes = QL_DT_BIT(QL_DTYPE_F32),
     .supports = small_m_only,
     .fn.linear = fake_linear},
    {.name = "fake.linear_aq",
     .op = QL_OP_LINEAR_AQ,
     .formats = QL_ALL_FORMATS,
     .dtypes = QL_ALL_DTYPES,
     .fn.linear = fake_linear},
};

static const ql_backend fake = {.name = "fake", .impls = fake_impls, .n_impls = 2};

START_TEST(test_generic) {
  static const char *names[QL_OP_COUNT] = {
      "generic.quantize_rows", "generic.linear_wo", "generic.linear_aq",
      "generic.repack"};
  for (int op = 0; op < QL_OP_COUNT; op++) {
    const ql_kernel_impl *g = ql_generic_impl((ql_op)op);
    ck_assert_ptr_nonnull(g);
    ck_assert_int_eq(g->op, op);
    ck_assert_str_eq(g->name, names[op]);
    ck_assert_uint_eq(g->formats,
                      op == QL_OP_LINEAR_AQ
                          ? QL_ALL_FORMATS & ~QL_FMT_BIT(QL_FORMAT_Q8B)
                          : QL_ALL_FORMATS);
    ck_assert_uint_eq(g->dtypes, QL_ALL_DTYPES);
  }
  ck_assert_ptr_null(ql_generic_impl(QL_OP_COUNT));
  ck_assert_ptr_null(ql_dispatch(NULL, QL_OP_COUNT, QL_FORMAT_Q8C,
                                 QL_DTYPE_F32, 1, 1, 1));
}
END_TEST

START_TEST(test_builtin_backends) {
  size_t n = 0;
  const ql_backend *const *b = ql_backends(&n);
  ck_assert_uint_ge(n, 1);
  int have_cpu = 0;
  for (size_t i = 0; i < n; i++) {
    ck_assert_int_eq(ql_backend_check(b[i]), 0);
    ck_assert_ptr_eq(ql_backend_find(b[i]->name), b[i]);
    have_cpu |= strcmp(b[i]->name, "cpu") == 0;
  }
  ck_assert(have_cpu);
  ck_assert_ptr_null(ql_backend_find("no-such-backend"));
}
END_TEST

START_TEST(test_dispatch) {
  ck_assert_int_eq(ql_backend_check(&fake), 0);
  /* Handled format, dtype and shape: the backend's own. */
  const ql_kernel_impl *im =
      ql_dispatch(&fake, QL_OP_LINEAR_WO, QL_FORMAT_Q8C, QL_DTYPE_F32, 4, 8, 8);
  ck_assert_str_eq(im->name, "fake.linear_wo");
  fake_calls = 0;
  ck_assert_int_eq(im->fn.linear(NULL), 12345);
  ck_assert_int_eq(fake_calls, 1);
  /* Declined shape, other format, other dtype: generic. */
  ck_assert_ptr_eq(ql_dispatch(&fake, QL_OP_LINEAR_WO, QL_FORMAT_Q8C,
                               QL_DTYPE_F32, 5, 8, 8),
                   ql_generic_impl(QL_OP_LINEAR_WO));
  ck_assert_ptr_eq(ql_dispatch(&fake, QL_OP_LINEAR_WO, QL_FORMAT_Q4G,
                               QL_DTYPE_F32, 1, 8, 8),
                   ql_generic_impl(QL_OP_LINEAR_WO));
  ck_assert_ptr_eq(ql_dispatch(&fake, QL_OP_LINEAR_WO, QL_FORMAT_Q8C,
                               QL_DTYPE_BF16, 1, 8, 8),
                   ql_generic_impl(QL_OP_LINEAR_WO));
  /* An op the backend has for every case; one it lacks. */
  ck_assert_str_eq(ql_dispatch(&fake, QL_OP_LINEAR_AQ, QL_FORMAT_Q4G,
                               QL_DTYPE_F16, 512, 8, 8)->name,
                   "fake.linear_aq");
  ck_assert_ptr_eq(ql_dispatch(&fake, QL_OP_QUANTIZE_ROWS, QL_FORMAT_Q4G,
                               QL_DTYPE_F32, 1, 8, 8),
                   ql_generic_impl(QL_OP_QUANTIZE_ROWS));
  /* Nothing runs q8b AQ or q8c AQ past the int32 bound. */
  ck_assert_ptr_null(ql_dispatch(NULL, QL_OP_LINEAR_AQ, QL_FORMAT_Q8B,
                                 QL_DTYPE_F32, 1, 8, 64));
  ck_assert_ptr_null(ql_dispatch(NULL, QL_OP_LINEAR_AQ, QL_FORMAT_Q8C,
                                 QL_DTYPE_F32, 1, 8, QL_AQ_Q8C_MAX_K + 1));
  ck_assert_ptr_nonnull(ql_dispatch(NULL, QL_OP_LINEAR_AQ, QL_FORMAT_Q8C,
                                    QL_DTYPE_F32, 1, 8, QL_AQ_Q8C_MAX_K));
  ck_assert_ptr_nonnull(ql_dispatch(NULL, QL_OP_LINEAR_WO, QL_FORMAT_Q8B,
                                    QL_DTYPE_F32, 1, 8, 64));
  /* No backend: generic. */
  ck_assert_ptr_eq(ql_dispatch(NULL, QL_OP_LINEAR_AQ, QL_FORMAT_Q8C,
                               QL_DTYPE_F32, 1, 8, 8),
                   ql_generic_impl(QL_OP_LINEAR_AQ));
}
END_TEST

static int dev_count(const char **why) {
  (void)why;
  return 1;
}
static int dev_info(int o, ql_device_desc *out) {
  (void)o;
  (void)out;
  return 0;
}
static int dev_bind(int o) {
  (void)o;
  return 0;
}

START_TEST(test_backend_check_rejects) {
  ql_kernel_impl bad[1];
  ql_backend b = {.name = "bad", .impls = bad, .n_impls = 1};
  bad[0] = fake_impls[0];
  ck_assert_int_eq(ql_backend_check(&b), 0);
  bad[0].fn.linear = NULL; /* no function */
  ck_assert_int_eq(ql_backend_check(&b), QL_EINVAL);
  bad[0] = fake_impls[0];
  bad[0].op = QL_OP_COUNT; /* unknown op */
  ck_assert_int_eq(ql_backend_check(&b), QL_EINVAL);
  bad[0] = fake_impls[0];
  bad[0].formats |= 1u << 9; /* unknown format bit */
  ck_assert_int_eq(ql_backend_check(&b), QL_EINVAL);
  bad[0] = fake_impls[0];
  bad[0].name = NULL;
  ck_assert_int_eq(ql_backend_check(&b), QL_EINVAL);
  /* A repack needs its free function too. */
  bad[0] = *ql_generic_impl(QL_OP_REPACK);
  ck_assert_int_eq(ql_backend_check(&b), 0);
  bad[0].free_packed = NULL;
  ck_assert_int_eq(ql_backend_check(&b), QL_EINVAL);
  ql_backend nul = {.name = NULL};
  ck_assert_int_eq(ql_backend_check(&nul), QL_EINVAL);
  ck_assert_int_eq(ql_backend_check(NULL), QL_EINVAL);
  ql_backend noimpls = {.name = "x", .impls = NULL, .n_impls = 3};
  ck_assert_int_eq(ql_backend_check(&noimpls), QL_EINVAL);
  /* Device functions come as a set. */
  ql_backend half = {.name = "x", .device_count = dev_count};
  ck_assert_int_eq(ql_backend_check(&half), QL_EINVAL);
  half.device_info = dev_info;
  ck_assert_int_eq(ql_backend_check(&half), QL_EINVAL);
  half.device_bind = dev_bind;
  ck_assert_int_eq(ql_backend_check(&half), 0);
}
END_TEST

/* A backend with IPC imports whose linear_dev takes its WO only. */
static int dev_calls;
static int ipc_open_(int o, const void *h, size_t len, void **base,
                     uint64_t *size) {
  (void)o, (void)h, (void)len, (void)base, (void)size;
  return QL_EINVAL;
}
static int ipc_open_fd_(int o, int fd, const void *h, size_t len,
                        void **base, uint64_t *size) {
  (void)o, (void)fd, (void)h, (void)len, (void)base, (void)size;
  return QL_EINVAL;
}
static int ipc_close_(int o, void *base) {
  (void)o, (void)base;
  return 0;
}
static int ev_open_(int o, const void *h, size_t len, void **ev) {
  (void)o, (void)h, (void)len, (void)ev;
  return QL_EINVAL;
}
static void ev_close_(int o, void *ev) { (void)o, (void)ev; }
static int host_register_(void *p, size_t len) {
  (void)p, (void)len;
  return 0;
}
static void host_unregister_(void *p) { (void)p; }
static int dev_supports_(const ql_kernel_impl *im) {
  return im == &fake_impls[0];
}
static int dev_linear_(const ql_kernel_impl *im, const ql_linear_dev_args *a) {
  (void)a;
  dev_calls++;
  return im == &fake_impls[0] ? 777 : QL_ENOTSUP;
}

/* IPC ops come as a set with a handle size; device tensors run only on a
 * backend's own implementation that takes them, never on a generic one. */
START_TEST(test_linear_dev) {
  ql_backend b = {.name = "dev",
                  .impls = fake_impls,
                  .n_impls = 2,
                  .ipc_handle_bytes = 64,
                  .ipc_open = ipc_open_,
                  .ipc_close = ipc_close_,
                  .ipc_event_open = ev_open_,
                  .ipc_event_close = ev_close_,
                  .linear_dev_supports = dev_supports_,
                  .linear_dev = dev_linear_};
  ck_assert_int_eq(ql_backend_check(&b), 0);
  b.ipc_handle_bytes = 0;
  ck_assert_int_eq(ql_backend_check(&b), QL_EINVAL);
  b.ipc_handle_bytes = 64;
  b.linear_dev = NULL;
  ck_assert_int_eq(ql_backend_check(&b), QL_EINVAL);
  b.linear_dev = dev_linear_;
  b.ipc_event_close = NULL;
  ck_assert_int_eq(ql_backend_check(&b), QL_EINVAL);
  b.ipc_event_close = ev_close_;
  /* Handles with a descriptor (ipc_open_fd) replace ipc_open and the
   * event ops, never join them; they need ipc_close and the device ops. */
  b.ipc_open_fd = ipc_open_fd_;
  ck_assert_int_eq(ql_backend_check(&b), QL_EINVAL);
  b.ipc_open = NULL;
  b.ipc_event_open = NULL;
  b.ipc_event_close = NULL;
  ck_assert_int_eq(ql_backend_check(&b), 0);
  b.ipc_close = NULL;
  ck_assert_int_eq(ql_backend_check(&b), QL_EINVAL);
  b.ipc_close = ipc_close_;
  b.ipc_handle_bytes = 0;
  ck_assert_int_eq(ql_backend_check(&b), QL_EINVAL);
  b.ipc_handle_bytes = 64;
  b.ipc_open_fd = NULL;
  ck_assert_int_eq(ql_backend_check(&b), QL_EINVAL); /* device ops alone */
  b.ipc_open = ipc_open_;
  b.ipc_event_open = ev_open_;
  b.ipc_event_close = ev_close_;
  ck_assert_int_eq(ql_backend_check(&b), 0);
  /* Host registration: both ops or neither. */
  b.host_register = host_register_;
  ck_assert_int_eq(ql_backend_check(&b), QL_EINVAL);
  b.host_unregister = host_unregister_;
  ck_assert_int_eq(ql_backend_check(&b), 0);
  b.host_register = NULL;
  ck_assert_int_eq(ql_backend_check(&b), QL_EINVAL);
  b.host_unregister = NULL;

  ql_qweight w;
  memset(&w, 0, sizeof w);
  w.format = QL_FORMAT_Q8C;
  w.n = 8;
  w.k = 16;
  ql_linear_dev_args a;
  memset(&a, 0, sizeof a);
  a.a.w = &w;
  a.a.dt = QL_DTYPE_F32;
  a.a.m = 2;
  a.where = QL_LINEAR_X_DEVICE;
  const char *impl = "x";
  /* Its own WO for 2 rows. */
  ck_assert_ptr_eq(ql_dispatch_dev(&b, QL_OP_LINEAR_WO, QL_FORMAT_Q8C,
                                   QL_DTYPE_F32, 2, 8, 16),
                   &fake_impls[0]);
  ck_assert_int_eq(ql_run_linear_dev(&b, QL_OP_LINEAR_WO, &a, &impl), 777);
  ck_assert_str_eq(impl, "fake.linear_wo");
  ck_assert_int_eq(dev_calls, 1);
  /* 8 rows: its WO declines, the generic one would run: refused. */
  a.a.m = 8;
  ck_assert_ptr_null(ql_dispatch_dev(&b, QL_OP_LINEAR_WO, QL_FORMAT_Q8C,
                                     QL_DTYPE_F32, 8, 8, 16));
  ck_assert_int_eq(ql_run_linear_dev(&b, QL_OP_LINEAR_WO, &a, &impl),
                   QL_ENOTSUP);
  ck_assert_ptr_null(impl);
  /* Its AQ does not take device memory. */
  a.a.m = 2;
  ck_assert_int_eq(ql_run_linear_dev(&b, QL_OP_LINEAR_AQ, &a, &impl),
                   QL_ENOTSUP);
  /* Without linear_dev (the CPU), nothing does. */
  ck_assert_int_eq(ql_run_linear_dev(&fake, QL_OP_LINEAR_WO, &a, &impl),
                   QL_ENOTSUP);
  ck_assert_int_eq(ql_run_linear_dev(NULL, QL_OP_LINEAR_WO, &a, &impl),
                   QL_ENOTSUP);
  ck_assert_int_eq(dev_calls, 1);
}
END_TEST

/* From 4 rows an AQ of host memory only (as CUDA's q8c on cuBLASLt is),
 * before one of device memory for every row count of q8c only. */
static int large_m_calls;
static int large_m_only(const ql_kernel_impl *im, ql_format f, int64_t m,
                        int64_t n, int64_t k) {
  (void)im, (void)f, (void)n, (void)k;
  large_m_calls++;
  return m >= 4;
}
static const ql_kernel_impl staged_impls[] = {
    {.name = "staged.linear_aq",
     .op = QL_OP_LINEAR_AQ,
     .formats = QL_FMT_BIT(QL_FORMAT_Q8C) | QL_FMT_BIT(QL_FORMAT_Q4G),
     .dtypes = QL_ALL_DTYPES,
     .supports = large_m_only,
     .fn.linear = fake_linear},
    {.name = "inplace.linear_aq",
     .op = QL_OP_LINEAR_AQ,
     .formats = QL_FMT_BIT(QL_FORMAT_Q8C),
     .dtypes = QL_ALL_DTYPES,
     .fn.linear = fake_linear},
};
static int inplace_only_(const ql_kernel_impl *im) {
  return im == &staged_impls[1];
}
static int inplace_linear_(const ql_kernel_impl *im,
                           const ql_linear_dev_args *a) {
  (void)a;
  return im == &staged_impls[1] ? 778 : QL_ENOTSUP;
}

/* Device tensors skip an implementation that reads host memory only for
 * the next one of the backend's that takes them, at every row count; the
 * skipped one is not even asked about the case. */
START_TEST(test_linear_dev_next) {
  ql_backend b = {.name = "staged",
                  .impls = staged_impls,
                  .n_impls = 2,
                  .ipc_handle_bytes = 64,
                  .ipc_open = ipc_open_,
                  .ipc_close = ipc_close_,
                  .ipc_event_open = ev_open_,
                  .ipc_event_close = ev_close_,
                  .linear_dev_supports = inplace_only_,
                  .linear_dev = inplace_linear_};
  ck_assert_int_eq(ql_backend_check(&b), 0);
  ck_assert_ptr_eq(ql_dispatch(&b, QL_OP_LINEAR_AQ, QL_FORMAT_Q8C,
                               QL_DTYPE_F32, 8, 8, 16),
                   &staged_impls[0]);
  ql_qweight w;
  memset(&w, 0, sizeof w);
  w.format = QL_FORMAT_Q8C;
  w.n = 8;
  w.k = 16;
  ql_linear_dev_args a;
  memset(&a, 0, sizeof a);
  a.a.w = &w;
  a.a.dt = QL_DTYPE_F32;
  a.where = QL_LINEAR_X_DEVICE | QL_LINEAR_Y_DEVICE;
  large_m_calls = 0;
  for (int64_t m = 1; m <= 8; m++) {
    const char *impl = NULL;
    a.a.m = m;
    ck_assert_ptr_eq(ql_dispatch_dev(&b, QL_OP_LINEAR_AQ, QL_FORMAT_Q8C,
                                     QL_DTYPE_F32, m, 8, 16),
                     &staged_impls[1]);
    ck_assert_int_eq(ql_run_linear_dev(&b, QL_OP_LINEAR_AQ, &a, &impl), 778);
    ck_assert_str_eq(impl, "inplace.linear_aq");
  }
  ck_assert_int_eq(large_m_calls, 0);
  /* A case that only the host-only one handles has none: no generic. */
  ck_assert_ptr_null(ql_dispatch_dev(&b, QL_OP_LINEAR_AQ, QL_FORMAT_Q4G,
                                     QL_DTYPE_F32, 8, 8, 16));
}
END_TEST

int main(void) {
  Suite *s = suite_create("registry");
  TCase *tc = tcase_create("registry");
  tcase_add_test(tc, test_generic);
  tcase_add_test(tc, test_builtin_backends);
  tcase_add_test(tc, test_dispatch);
  tcase_add_test(tc, test_backend_check_rejects);
  tcase_add_test(tc, test_linear_dev);
  tcase_add_test(tc, test_linear_dev_next);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
