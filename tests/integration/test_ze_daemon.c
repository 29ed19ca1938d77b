/*
 * test_ze_daemon.c - qlineard serving on Level Zero devices, end to end:
 * the real daemon ($QLINEARD) with the ze backend's host code
 * (kernels/ze/backend.c) on the Level Zero loader, which loads the test
 * driver tests/ze_driver/libze_qltest.so (ZE_ENABLE_ALT_DRIVERS; it runs
 * the kernels on PoCL) with the loader's validation layer between them
 * (ZE_ENABLE_VALIDATION_LAYER, parameter and handle-lifetime checks):
 * load -> repack into device memory -> linear -> reply, with real clients.
 *
 * What it checks: the devices are listed by UUID (ze:<uuid>) with ze:N
 * aliases beside the CPU; weights of every format are placed on them and
 * served there, weight-only and activation-quantized, with replies
 * identical to the same backend run in this process; a request may name
 * its device by alias or UUID; device memory is accounted against the
 * device's budget (a load past it is OUT_OF_MEMORY and leaves nothing
 * resident); a device that is lost or hangs (faults the driver injects)
 * fails its requests with QL_EDEVICE and a clear message and goes out of
 * service, and the daemon keeps serving; without a driver the daemon
 * serves on the CPU and says why once, and a required ze device that is
 * missing stops it from starting. The validation layer is loaded in the
 * daemon and refuses no call the backend makes (the backend says so on
 * stderr for every refused call: the log must never show it).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>
#include <level_zero/ze_api.h>

#include "golden_load.h"
#include "harness.h"
#include "ql_kernels.h"
#include "qlinear/qlinear.h"
#include "registry.h"
#include "testutil.h"

#ifndef QL_ZE_TEST_DRIVER
#error "QL_ZE_TEST_DRIVER: the path of libze_qltest.so (Makefile.am)"
#endif

#define N 48
#define K 200 /* ragged: not a multiple of 16, 32 or the group */
#define TMO 60000

/* What the backend writes for a call the validation layer (or a driver)
 * refused. */
#define REFUSED "a Level Zero call refused"

/* td_ze_env() on the test driver. */
static void ze_env(const char *devices, const char *mem, const char *fault) {
  td_ze_env(QL_ZE_TEST_DRIVER, devices, mem, fault);
}

/* 1 when the running daemon has a file whose path contains lib mapped. */
static int daemon_maps(const td *d, const char *lib) {
  char path[64], line[1024];
  int found = 0;
  snprintf(path, sizeof path, "/proc/%d/maps", (int)d->pid);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  while (!found && fgets(line, sizeof line, f) != NULL)
    found = strstr(line, lib) != NULL;
  fclose(f);
  return found;
}

/* One Linear request, raw, so that it can name a device and a path.
 * Returns the status code; on success y gets the m·N result, from the
 * implementation the path asks for. msg (may be NULL) gets the status
 * message. */
static int linear_path(const td *d, const char *weight, const char *device,
                       ql_path path, const float *x, uint64_t m, float *y,
                       char *msg, size_t msglen) {
  return td_linear_backend(d, "ze", weight, device, path, x, m, K, N, y, msg,
                           msglen, TMO);
}

static int linear_on(const td *d, const char *weight, const char *device,
                     const float *x, uint64_t m, float *y, char *msg,
                     size_t msglen) {
  return linear_path(d, weight, device, QL_PATH_WEIGHT_ONLY, x, m, y, msg,
                     msglen);
}

/* What expected_op() computes in its child; its stderr goes to err. */
typedef struct expect_args {
  const td_layer *l;
  ql_format f;
  uint32_t gs;
  ql_op op;
  const float *x;
  uint64_t m;
  int err;
} expect_args;

static int expect_in_child(void *arg, float *out) {
  const expect_args *a = arg;
  const td_layer *l = a->l;
  size_t bytes = a->m * l->n * sizeof(float);
  dup2(a->err, 2);
  ql_quant_params p = {a->f, a->gs, 0, (ql_dtype)0};
  ql_qweight *q = NULL;
  const char *impl = NULL;
  const ql_backend *ze = ql_backend_find("ze");
  const char *why = NULL;
  const char *want = a->op == QL_OP_LINEAR_AQ ? "ze.linear_aq"
                                              : "ze.linear_wo";
  float *ref = malloc(bytes);
  int ok = ref != NULL && ze != NULL && ze->device_count(&why) > 0 &&
           ze->device_bind(0) == 0 &&
           ql_qweight_quantize(&p, (int64_t)l->n, (int64_t)l->k,
                               QL_DTYPE_F32, l->w, l->b, &q) == 0 &&
           ql_run_linear(ze, a->op, q, NULL, QL_DTYPE_F32, a->x,
                         (int64_t)a->m, out, &impl) == 0 &&
           impl != NULL && strcmp(impl, want) == 0 &&
           ql_run_linear(NULL, a->op, q, NULL, QL_DTYPE_F32, a->x,
                         (int64_t)a->m, ref, NULL) == 0;
  /* The generic implementation of the same op computes the same sums in
   * another order: with K = 200 and these magnitudes (|x| ~ 1,
   * |w| ~ 0.05) the fp32 difference stays far below 1e-3, while a wrong
   * scale, group or row is off by much more. test_conformance_ze_l0
   * holds the backend to the exact bounds. */
  for (size_t i = 0; ok && i < a->m * l->n; i++)
    if (!(fabsf(out[i] - ref[i]) <= 1e-3f * (1.0f + fabsf(ref[i])))) {
      fprintf(stderr, "y[%zu] = %g, the generic implementation %g\n", i,
              (double)out[i], (double)ref[i]);
      ok = 0;
    }
  return ok;
}

/* The result this process's own ze backend (the same host code, driver
 * and layer) gives for layer l in format f with op: the daemon's must be
 * the same bytes (the kernels are batch-invariant); it must also be near
 * the generic implementation's. It runs in a child, so
 * that this process never starts the driver's threads (check forks its
 * tests) and its refusals, if any, are counted apart: the child fails when
 * the backend wrote REFUSED on its stderr, which goes to a file here. */
static void expected_op(const td_layer *l, ql_format f, uint32_t gs,
                        ql_op op, const float *x, uint64_t m, float *y) {
  FILE *err = tmpfile();
  ck_assert_ptr_nonnull(err);
  expect_args a = {l, f, gs, op, x, m, fileno(err)};
  int status = td_child_floats(expect_in_child, &a, y, m * l->n);
  char text[4096];
  rewind(err);
  size_t n = fread(text, 1, sizeof text - 1, err);
  text[n] = '\0';
  fclose(err);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "the in-process ze backend failed (%d): %s", status, text);
  ck_assert_msg(strstr(text, REFUSED) == NULL, "in process: %s", text);
}

/* expected_op() with the op a request's path runs (td_accel.expected). */
static void expected_path(const td_layer *l, ql_format f, uint32_t gs,
                          ql_path path, const float *x, uint64_t m, float *y) {
  expected_op(l, f, gs,
              path == QL_PATH_ACT_QUANT ? QL_OP_LINEAR_AQ : QL_OP_LINEAR_WO,
              x, m, y);
}

static void expected(const td_layer *l, ql_format f, uint32_t gs,
                     const float *x, uint64_t m, float *y) {
  expected_op(l, f, gs, QL_OP_LINEAR_WO, x, m, y);
}

/* The log of a daemon on the test driver: no call refused, none of the
 * driver's own error lines. */
static void assert_clean(const char *log) {
  ck_assert_msg(strstr(log, REFUSED) == NULL, "%s", log);
  ck_assert_msg(strstr(log, "ze_qltest:") == NULL, "%s", log);
}

/* The validation layer is live in a process with ze_env(): a call with a
 * NULL handle or pointer is refused by it before any driver sees it. The
 * checks of the daemon's log rest on this. */
START_TEST(validation_layer_active) {
  ze_env("1", NULL, NULL);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    uint32_t n = 0;
    ze_driver_handle_t drv;
    int ok = zeInit(0) == ZE_RESULT_SUCCESS &&
             zeDriverGet(&n, NULL) == ZE_RESULT_SUCCESS && n == 1 &&
             zeDriverGet(&n, &drv) == ZE_RESULT_SUCCESS &&
             zeKernelSetGroupSize(NULL, 64, 1, 1) ==
                 ZE_RESULT_ERROR_INVALID_NULL_HANDLE &&
             zeDeviceGet(drv, NULL, NULL) ==
                 ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}
END_TEST

/* NaN in x: a clear error, and the device stays in service. */
static void nan_in_x(const td *d, const char *weight, const float *x,
                     uint64_t m) {
  float xbad[5 * K], y[5 * N];
  ck_assert_uint_eq(m, 5);
  memcpy(xbad, x, sizeof xbad);
  xbad[3 * K + 7] = NAN;
  ck_assert_int_eq(linear_on(d, weight, "ze:0", xbad, m, y, NULL, 0),
                   QL_ENONFINITE);
}

/* The ze backend, for the harness's shared checks. */
static const td_accel ze = {"ze:0", "ze:1", N, K, linear_path, expected_path,
                            nan_in_x};

/* Two ze devices and the CPU; weights of every format go to both, are
 * served there by alias, by UUID and by the scheduler's choice, both
 * paths where the format has AQ; stats count device memory per device. */
START_TEST(serves_on_ze) {
  td d;
  ze_env("2", NULL, NULL);
  td_start(&d, NULL);
  ck_assert(daemon_maps(&d, "libze_validation_layer.so"));
  ck_assert(daemon_maps(&d, "libze_qltest.so"));
  ql_client *c = td_connect(&d);
  ql_hello_info h;
  ck_assert_int_eq(ql_hello(c, &h), 0);
  ck_assert_uint_eq(h.n_devices, 3);
  ck_assert_str_eq(h.devices[0].alias, "ze:0");
  ck_assert_str_eq(h.devices[1].alias, "ze:1");
  ck_assert_str_eq(h.devices[2].alias, "cpu");
  ck_assert_str_eq(h.devices[0].kind, "ze");
  /* Named by UUID (8-4-4-4-12 hex digits), distinct. */
  ck_assert_int_eq(strncmp(h.devices[0].name, "ze:", 3), 0);
  ck_assert_uint_eq(strlen(h.devices[0].name), 3 + 36);
  ck_assert_int_eq(h.devices[0].name[3 + 8], '-');
  ck_assert_str_ne(h.devices[0].name, h.devices[1].name);

  /* Each format on both devices; the NaN requests may count too. */
  ck_assert_uint_ge(td_serve_formats(&d, c, &h, &ze), 4 * 4 + 2);
  /* TorchAO's bf16/f16 weights, on both devices: the same weight loaded
   * from floats or from TorchAO's tensors. */
  ck_assert_int_eq(td_torchao_identity(c, NULL), 6);
  ql_close(c);
  char *log = td_read_log(&d);
  /* Each device announced once, with its UUID; none left service. */
  for (int i = 0; i < 2; i++) {
    char line[128];
    snprintf(line, sizeof line, "device %s: ", h.devices[i].alias);
    ck_assert_ptr_nonnull(strstr(log, line));
    snprintf(line, sizeof line, "(%s), ", h.devices[i].name);
    ck_assert_int_eq(td_count(log, line), 1);
  }
  ck_assert_ptr_null(strstr(log, "out of service"));
  assert_clean(log);
  free(log);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* Device memory is accounted against the device's budget: a load past it
 * is OUT_OF_MEMORY and leaves nothing resident; the next one that fits is
 * served. */
START_TEST(device_budget) {
  td d;
  /* 1 MiB: accel_budget_percent (87.5 by default) of it for weights */
  ze_env("1", "1048576", NULL);
  td_start(&d, NULL);
  ql_client *c = td_connect(&d);
  td_layer big, small;
  td_layer_make(&big, 1024, 1024, 1, 0); /* 1 MiB of q8c codes */
  td_layer_make(&small, N, K, 2, 0);
  ck_assert_int_eq(td_load(c, "big", &big, QL_FORMAT_Q8C, 0, 0, NULL, NULL),
                   QL_ENOMEM);
  ql_stats_info *st = NULL;
  ck_assert_int_eq(ql_stats(c, &st), 0);
  ck_assert_uint_eq(st->weights, 0);
  ck_assert_uint_eq(st->devices[0].bytes_resident, 0);
  ck_assert_uint_eq(st->devices[0].budget_bytes, 1048576 - 1048576 / 8);
  ql_stats_free(st);
  ck_assert_int_eq(td_load(c, "small", &small, QL_FORMAT_Q8C, 0, 0, NULL,
                           NULL),
                   0);
  float x[K], y[N], want[N];
  uint64_t seed = 5;
  td_randn(&seed, x, K, 1.0f);
  expected(&small, QL_FORMAT_Q8C, 0, x, 1, want);
  ck_assert_int_eq(linear_on(&d, "small", NULL, x, 1, y, NULL, 0), 0);
  ck_assert_int_eq(memcmp(y, want, sizeof y), 0);
  td_layer_free(&big);
  td_layer_free(&small);
  ql_close(c);
  char *log = td_read_log(&d);
  ck_assert_msg(strstr(log, REFUSED) == NULL, "%s", log);
  free(log);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/*
 * Device 0 is lost after some work, device 1 hangs (a kernel that never
 * finishes): each fails its requests with QL_EDEVICE and a clear message,
 * goes out of service (logged), and the rest keeps serving: the other
 * device while one is left, then new loads on the CPU.
 */
START_TEST(failing_devices) {
  td d;
  const char *args[] = {"--kernel-timeout-ms", "300ms", NULL};
  ze_env("2", NULL, "0:80:lost,1:120:hang");
  td_start(&d, args);
  ql_client *c = td_connect(&d);
  td_layer l;
  td_layer_make(&l, N, K, 3, 1);
  ck_assert_int_eq(td_load(c, "w", &l, QL_FORMAT_Q4G, 32, 0, NULL, NULL), 0);
  float x[2 * K], y[2 * N], want[2 * N];
  uint64_t seed = 9;
  td_randn(&seed, x, 2 * K, 1.0f);
  ze_env("1", NULL, NULL); /* the in-process expectation without faults */
  expected(&l, QL_FORMAT_Q4G, 32, x, 2, want);
  char msg[256];

  /* Device 0 serves until it is lost, then fails with QL_EDEVICE. */
  td_device_fails(&d, &ze, "w", "ze:0", x, 2, want);
  /* Requests that name no device go to device 1 until it hangs. */
  int rc = 0;
  int served = td_serve_until_error(&d, &ze, "w", NULL, x, 2, want, &rc, msg,
                                    sizeof msg, NULL);
  /* Failed by the kernel timeout, not left hanging (the log says which,
   * below). */
  ck_assert_int_gt(served, 0);
  ck_assert_int_eq(rc, QL_EDEVICE);
  /* Every device holding w is out of service. */
  ck_assert_int_eq(linear_on(&d, "w", NULL, x, 2, y, msg, sizeof msg),
                   QL_EDEVICE);
  ck_assert_ptr_nonnull(strstr(msg, "out of service"));
  /* The daemon keeps serving: a new load goes to the CPU. */
  ql_weight_info info;
  ck_assert_int_eq(td_load(c, "w2", &l, QL_FORMAT_Q8C, 0, 0, &info, NULL), 0);
  ck_assert_str_eq(info.devices, "cpu");
  ck_assert_int_eq(ql_linear(c, "w2", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 2,
                             K, x, N, y, NULL),
                   0);
  char *log = td_read_log(&d);
  ck_assert_int_eq(td_count(log, "device ze:0 ("), 1);
  ck_assert_int_eq(td_count(log, "device ze:1 ("), 1);
  ck_assert_ptr_nonnull(
      strstr(log, "Level Zero error ZE_RESULT_ERROR_DEVICE_LOST"));
  ck_assert_ptr_nonnull(strstr(log, "did not finish within 300 ms"));
  ck_assert_msg(strstr(log, REFUSED) == NULL, "%s", log);
  free(log);
  td_layer_free(&l);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* No driver: the CPU serves and the log says why, once; a daemon that
 * requires a ze device does not start. The loader is pointed at a driver
 * that does not exist, so the test does not depend on what the machine
 * has installed. */
START_TEST(no_driver) {
  td d;
  ze_env("1", NULL, NULL);
  setenv("ZE_ENABLE_ALT_DRIVERS", "/nonexistent/libze_none.so", 1);
  td_start(&d, NULL);
  ql_client *c = td_connect(&d);
  ql_hello_info h;
  ck_assert_int_eq(ql_hello(c, &h), 0);
  for (size_t i = 0; i < h.n_devices; i++)
    ck_assert_str_ne(h.devices[i].kind, "ze");
  ck_assert_str_eq(h.devices[h.n_devices - 1].name, "cpu");
  ql_close(c);
  char *log = td_read_log(&d); /* td_stop() removes it */
  ck_assert_int_eq(td_count(log, "ze: no device: no Level Zero driver"), 1);
  free(log);
  ck_assert_int_eq(td_stop(&d), 0);
  /* A required ze device that is not there: the daemon does not start. */
  char dir[] = "/tmp/ql-test-XXXXXX", out[4096];
  const char *req[] = {"--required-devices", "cpu,ze:0", NULL};
  ck_assert_ptr_nonnull(mkdtemp(dir));
  ck_assert_int_gt(td_start_or_exit(&d, dir, req, out, sizeof out), 0);
  ck_assert_ptr_nonnull(strstr(out, "required device ze:0 is not present"));
  rmdir(dir);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ze_daemon");
  TCase *tc = tcase_create("ze_daemon");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, validation_layer_active);
  tcase_add_test(tc, serves_on_ze);
  tcase_add_test(tc, device_budget);
  tcase_add_test(tc, failing_devices);
  tcase_add_test(tc, no_driver);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
