/*
 * test_cuda_daemon.c - qlineard serving on CUDA devices, end to end, with
 * the CUDA backend's host code running against the emulated runtime
 * (kernels/cuda/emu_runtime.h) and its kernels under the emulation header:
 * load -> repack into device memory -> linear -> reply, through a real
 * daemon ($QLINEARD_CUDAEMU) and real clients.
 *
 * What it checks: the GPUs are listed by UUID beside the CPU; weights are
 * placed on the accelerators and served there, with replies identical to
 * the same backend run in this process (batch-invariant kernels); a
 * request may name its device; device memory is accounted against the
 * device's budget (a load past it is OUT_OF_MEMORY and changes nothing);
 * a device that fails (a sticky error injected into the runtime) or hangs
 * (a kernel that never finishes) fails its requests with QL_EDEVICE and a
 * clear message, is logged, and the other devices keep serving; without a
 * driver the daemon serves on the CPU and says why once, and a required
 * GPU that is missing stops it from starting; f8r activation-quantized
 * runs on cuBLASLt on a GPU of compute capability 8.9 or newer and on the
 * generic op below that; q8c batches run on cuBLASLt's IMMA from
 * QL_CUDA_IMMA_MIN_ROWS rows with the same bytes.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "emu_runtime.h"
#include "golden_load.h"
#include "harness.h"
#include "ql_kernels.h"
#include "qlinear/qlinear.h"
#include "qlinear/qlinear_mapped.h"
#include "registry.h"
#include "testutil.h"
#include "vmm.h"

#define N 48
#define K 200 /* ragged: not a multiple of 16, 32 or the group */
#define TMO 20000

/* One Linear request, raw, so that it can name a device. Returns the
 * status code; on success y gets the m·N result and impl (may be NULL, 64
 * bytes) the implementation that ran. msg (may be NULL) gets the status
 * message. */
static int linear_impl(const td *d, const char *weight, const char *device,
                       ql_path path, const float *x, uint64_t m, float *y,
                       char *impl, char *msg, size_t msglen) {
  return td_linear(d, weight, device, path, x, m, K, N, y, impl, msg, msglen,
                   TMO);
}

/* A raw request that must run on the CUDA backend's own kernels. */
static int linear_path(const td *d, const char *weight, const char *device,
                       ql_path path, const float *x, uint64_t m, float *y,
                       char *msg, size_t msglen) {
  return td_linear_backend(d, "cuda", weight, device, path, x, m, K, N, y,
                           msg, msglen, TMO);
}

/* Weight-only, which every format has. */
static int linear_on(const td *d, const char *weight, const char *device,
                     const float *x, uint64_t m, float *y, char *msg,
                     size_t msglen) {
  return linear_path(d, weight, device, QL_PATH_WEIGHT_ONLY, x, m, y, msg,
                     msglen);
}

/* What expected_op() computes in its child. */
typedef struct expect_args {
  const td_layer *l;
  ql_format f;
  uint32_t gs;
  ql_op op;
  const float *x;
  uint64_t m;
} expect_args;

static int expect_in_child(void *arg, float *out) {
  const expect_args *a = arg;
  ql_quant_params p = {a->f, a->gs, 0, (ql_dtype)0};
  ql_qweight *q = NULL;
  const char *impl = NULL;
  const ql_backend *cuda = ql_backend_find("cuda");
  const char *want = a->op == QL_OP_LINEAR_AQ ? "cuda.linear_aq"
                                              : "cuda.linear_wo";
  return cuda != NULL &&
         ql_qweight_quantize(&p, (int64_t)a->l->n, (int64_t)a->l->k,
                             QL_DTYPE_F32, a->l->w, a->l->b, &q) == 0 &&
         ql_run_linear(cuda, a->op, q, NULL, QL_DTYPE_F32, a->x,
                       (int64_t)a->m, out, &impl) == 0 &&
         impl != NULL && strcmp(impl, want) == 0;
}

/* The result this process's own CUDA backend (same emulated kernels)
 * gives for layer l in format f: the daemon's must be the same bytes. It
 * runs in a child that leaves with _exit(): the emulated kernels run on
 * fiber stacks, after which LeakSanitizer (in a sanitizer build) no longer
 * finds this process's own pointers and would report check's allocations
 * as leaked when the test ends. */
static void expected_op(const td_layer *l, ql_format f, uint32_t gs,
                        ql_op op, const float *x, uint64_t m, float *y) {
  expect_args a = {l, f, gs, op, x, m};
  int status = td_child_floats(expect_in_child, &a, y, m * l->n);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "the in-process cuda backend failed (%d)", status);
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

static void start(td *d, const char *devices, const char *fault,
                  const char *const *args) {
  td_cuda_env(devices, fault);
  td_start(d, args);
}

/* The CUDA backend, for the harness's shared checks. */
static const td_accel cuda = {"cuda:0", "cuda:1", N, K, linear_path,
                              expected_path, NULL};

/* Two GPUs and the CPU; weights go to both GPUs, are served there, name
 * their devices; stats count device memory per device. */
START_TEST(serves_on_gpus) {
  td d;
  start(&d, "2", NULL, NULL);
  ql_client *c = td_connect(&d);
  ql_hello_info h;
  ck_assert_int_eq(ql_hello(c, &h), 0);
  ck_assert_uint_eq(h.n_devices, 3);
  ck_assert_str_eq(h.devices[0].alias, "cuda:0");
  ck_assert_str_eq(h.devices[1].alias, "cuda:1");
  ck_assert_str_eq(h.devices[2].alias, "cpu");
  ck_assert_str_eq(h.devices[0].kind, "cuda");
  /* Named by UUID, distinct. */
  ck_assert_int_eq(strncmp(h.devices[0].name, "cuda:GPU-", 9), 0);
  ck_assert_uint_eq(strlen(h.devices[0].name), 5 + 4 + 36);
  ck_assert_str_ne(h.devices[0].name, h.devices[1].name);

  /* Each format on both GPUs: four requests on each weight and two
   * activation-quantized ones are counted. */
  ck_assert_uint_eq(td_serve_formats(&d, c, &h, &cuda), 4 * 4 + 2);
  /* TorchAO's bf16/f16 weights, on both GPUs: the same weight loaded from
   * floats or from TorchAO's tensors. */
  ck_assert_int_eq(td_torchao_identity(c, NULL), 6);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/*
 * f8r activation-quantized on cuBLASLt (the emulated build's reference
 * cuBLASLt): on a GPU of compute capability 9.0 it runs
 * cuda.cublaslt.linear_aq; on one of 8.0 (no FP8 tensor cores) the same
 * request still succeeds, through the generic op, and says so. The log
 * says which GPU takes which path. Both give the same bytes here: the
 * reference cuBLASLt, told to sum exactly (QL_EMU_FP8_ACC_BITS=0, not the
 * FP8 tensor cores' accumulation it models by default), sums in
 * increasing k from 0 like the generic op, and the epilogue is the
 * generic op's. A row's bytes are the same at M = 1 and
 * M = 37 (the algorithm does not depend on M). Where cuBLASLt does not
 * start, every request takes the generic op, the first one too.
 */
START_TEST(f8r_on_cublaslt) {
  td d;
  setenv("QL_EMU_CUDA_CC", "9.0,8.0", 1);
  setenv("QL_EMU_FP8_ACC_BITS", "0", 1);
  start(&d, "2", NULL, NULL);
  unsetenv("QL_EMU_CUDA_CC");
  unsetenv("QL_EMU_FP8_ACC_BITS");
  ql_client *c = td_connect(&d);
  td_layer l;
  td_layer_make(&l, N, K, 21, 1);
  ck_assert_int_eq(td_load(c, "f8", &l, QL_FORMAT_F8R, 0, 0, NULL, NULL), 0);
  enum { M = 37 };
  float *x = tu_xmalloc(M * K * sizeof(float));
  float *y0 = tu_xmalloc(M * N * sizeof(float));
  float *y1 = tu_xmalloc(M * N * sizeof(float));
  float *want = tu_xmalloc(M * N * sizeof(float));
  float one[N];
  char impl[64];
  uint64_t seed = 77;
  td_randn(&seed, x, M * K, 1.0f);

  ck_assert_int_eq(linear_impl(&d, "f8", "cuda:0", QL_PATH_ACT_QUANT, x, M,
                               y0, impl, NULL, 0),
                   0);
  ck_assert_str_eq(impl, "cuda.cublaslt.linear_aq");
  ck_assert_int_eq(linear_impl(&d, "f8", "cuda:1", QL_PATH_ACT_QUANT, x, M,
                               y1, impl, NULL, 0),
                   0);
  ck_assert_str_eq(impl, "generic.linear_aq");
  /* The generic op's bytes, in this process. */
  ql_quant_params p = {QL_FORMAT_F8R, 0, 0, (ql_dtype)0};
  ql_qweight *q = NULL;
  ck_assert_int_eq(ql_qweight_quantize(&p, N, K, QL_DTYPE_F32, l.w, l.b, &q),
                   0);
  ck_assert_int_eq(ql_linear_aq_ref(q, QL_DTYPE_F32, x, M, want), 0);
  ql_qweight_free(q);
  ck_assert_msg(memcmp(y1, want, M * N * sizeof(float)) == 0,
                "sm_80: not the generic op's bytes");
  ck_assert_msg(memcmp(y0, want, M * N * sizeof(float)) == 0,
                "sm_90 (cuBLASLt): not the reference's bytes");
  /* Rows alone. */
  static const int rows[] = {0, 17, M - 1};
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    ck_assert_int_eq(linear_impl(&d, "f8", "cuda:0", QL_PATH_ACT_QUANT,
                                 x + (size_t)rows[i] * K, 1, one, impl, NULL,
                                 0),
                     0);
    ck_assert_str_eq(impl, "cuda.cublaslt.linear_aq");
    ck_assert_msg(memcmp(one, y0 + (size_t)rows[i] * N, sizeof one) == 0,
                  "row %d: other bytes alone than at M=%d", rows[i], M);
  }
  float x0[K], y00[N];
  memcpy(x0, x, sizeof x0);
  memcpy(y00, y0, sizeof y00);
  td_layer_free(&l);
  free(x);
  free(y0);
  free(y1);
  free(want);
  ql_close(c);
  char *log = td_read_log(&d); /* td_stop() removes it */
  ck_assert_int_eq(td_stop(&d), 0);
  ck_assert_msg(strstr(log, "device cuda:0: Emulated GPU sm_90") != NULL &&
                    td_count(log, "f8r activation-quantized on cuBLASLt "
                                  "13.1.0") == 1,
                "the log does not say that cuda:0 uses cuBLASLt:\n%s", log);
  ck_assert_msg(td_count(log, "f8r activation-quantized on the generic op: FP8 "
                              "GEMM needs sm_89 or newer") == 1,
                "the log does not say why cuda:1 does not:\n%s", log);
  free(log);

  /* A cuBLASLt that does not start (QL_EMU_CUBLASLT=0): the generic op
   * from the first request on, and the log says why. */
  setenv("QL_EMU_CUBLASLT", "0", 1);
  start(&d, "1", NULL, NULL);
  unsetenv("QL_EMU_CUBLASLT");
  c = td_connect(&d);
  td_layer_make(&l, N, K, 21, 1);
  ck_assert_int_eq(td_load(c, "f8", &l, QL_FORMAT_F8R, 0, 0, NULL, NULL), 0);
  ck_assert_int_eq(linear_impl(&d, "f8", "cuda:0", QL_PATH_ACT_QUANT, x0, 1,
                               one, impl, NULL, 0),
                   0);
  ck_assert_str_eq(impl, "generic.linear_aq");
  ck_assert_msg(memcmp(one, y00, sizeof one) == 0,
                "the generic op: not the bytes of row 0");
  td_layer_free(&l);
  ql_close(c);
  log = td_read_log(&d);
  ck_assert_int_eq(td_stop(&d), 0);
  ck_assert_msg(td_count(log, "f8r activation-quantized on the generic op: "
                              "cuBLASLt did not start on it") == 1,
                "the log does not say that cuBLASLt did not start:\n%s", log);
  free(log);
}
END_TEST

/*
 * q8c activation-quantized on cuBLASLt's IMMA from `from` rows, with
 * QL_CUDA_IMMA_MIN_ROWS set to env in the daemon's environment (NULL:
 * unset): a batch of m rows runs cuda.cublaslt.linear_aq, rows [off, off +
 * rows) alone (fewer than `from`) our tensor-core kernel, and both give the
 * bytes of our kernel in this process (int32 sums are exact, the epilogue
 * is the reference's), so the switch changes no result; the log says
 * where the switch is.
 */
static void imma_switch(const char *env, unsigned from, int m, int off,
                        int rows, uint64_t seed) {
  td d;
  td_layer l;
  td_layer_make(&l, N, K, seed, 1);
  float *x = tu_xmalloc((size_t)m * K * sizeof(float));
  float *y = tu_xmalloc((size_t)m * N * sizeof(float));
  float *want = tu_xmalloc((size_t)m * N * sizeof(float));
  char impl[64], line[64];
  td_randn(&seed, x, (size_t)m * K, 1.0f);
  /* Our kernel's bytes, in this process (the suite sets the variable to
   * 0), before the daemon's environment changes it. */
  expected_op(&l, QL_FORMAT_Q8C, 0, QL_OP_LINEAR_AQ, x, (uint64_t)m, want);
  if (env != NULL)
    setenv("QL_CUDA_IMMA_MIN_ROWS", env, 1);
  else
    unsetenv("QL_CUDA_IMMA_MIN_ROWS");
  start(&d, "1", NULL, NULL);
  setenv("QL_CUDA_IMMA_MIN_ROWS", "0", 1);
  ql_client *c = td_connect(&d);
  ck_assert_int_eq(td_load(c, "q8", &l, QL_FORMAT_Q8C, 0, 0, NULL, NULL), 0);
  ck_assert_int_eq(linear_impl(&d, "q8", "cuda:0", QL_PATH_ACT_QUANT, x,
                               (uint64_t)m, y, impl, NULL, 0),
                   0);
  ck_assert_str_eq(impl, "cuda.cublaslt.linear_aq");
  ck_assert_msg(memcmp(y, want, (size_t)m * N * sizeof(float)) == 0,
                "IMMA: not the bytes of our tensor-core kernel");
  ck_assert_int_eq(linear_impl(&d, "q8", "cuda:0", QL_PATH_ACT_QUANT,
                               x + (size_t)off * K, (uint64_t)rows, y, impl,
                               NULL, 0),
                   0);
  ck_assert_str_eq(impl, "cuda.linear_aq");
  ck_assert_msg(memcmp(y, want + (size_t)off * N,
                       (size_t)rows * N * sizeof(float)) == 0,
                "%d rows on our kernel: not their bytes in the batch of %d",
                rows, m);
  td_layer_free(&l);
  ql_close(c);
  char *log = td_read_log(&d); /* td_stop() removes it */
  ck_assert_int_eq(td_stop(&d), 0);
  snprintf(line, sizeof line, "q8c from %u rows on cuBLASLt IMMA", from);
  ck_assert_msg(td_count(log, line) == 1,
                "the log does not say that q8c uses IMMA from %u rows:\n%s",
                from, log);
  free(log);
  free(x);
  free(y);
  free(want);
}

/* QL_CUDA_IMMA_MIN_ROWS=4: 9 rows on IMMA, 3 on our kernel. */
START_TEST(q8c_on_imma) { imma_switch("4", 4, 9, 2, 3, 91); }
END_TEST

/* Unset, the switch is at 16 rows (the measured default): 16 rows on
 * IMMA, 15 on our kernel. */
START_TEST(q8c_imma_default) { imma_switch(NULL, 16, 16, 1, 15, 93); }
END_TEST

/* Device memory is accounted against the device's budget: a load past it
 * is OUT_OF_MEMORY and leaves nothing resident; the next one that fits is
 * served. */
START_TEST(device_budget) {
  td d;
  /* 1 MiB per GPU: seven eighths of it for weights. */
  setenv("QL_EMU_CUDA_MEM", "1048576", 1);
  start(&d, "1", NULL, NULL);
  unsetenv("QL_EMU_CUDA_MEM");
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
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* A float load of layer l placed on devices (NULL: the default). */
static int load_on(ql_client *c, const char *name, const td_layer *l,
                   ql_format f, int persistent, const char *devices,
                   ql_weight_info *info, int *shared) {
  return td_load_on(c, name, l, f, f == QL_FORMAT_Q4G ? 64 : 0, persistent,
                    devices, info, shared);
}

/* Writes text to path. */
static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fputs(text, f) >= 0, 1);
  ck_assert_int_eq(fclose(f), 0);
}

/* The budgets of the devices in Stats, GPUs first. */
static void budgets(ql_client *c, uint64_t *b0, uint64_t *b1) {
  ql_stats_info *st = NULL;
  ck_assert_int_eq(ql_stats(c, &st), 0);
  ck_assert_uint_eq(st->n_devices, 3);
  *b0 = st->devices[0].budget_bytes;
  *b1 = st->devices[1].budget_bytes;
  ql_stats_free(st);
}

/*
 * The budgets come from the configuration: accel_budget_percent of each
 * GPU's memory, or a device's own device_budget_bytes; a load past one is
 * OUT_OF_MEMORY with nothing resident anywhere; a reload changes them
 * live, and the same load then fits.
 */
START_TEST(configured_budget) {
  td d;
  char conf[300], report[1024];
  uint64_t b0, b1;
  /* 4 MiB per GPU: 25 % is 1 MiB; cuda:1 gets 3 MiB of its own. */
  setenv("QL_EMU_CUDA_MEM", "4194304", 1);
  td_cuda_env("2", NULL);
  snprintf(conf, sizeof conf, "/tmp/ql-budget-%d.conf", (int)getpid());
  write_file(conf, "[qlineard]\naccel_budget_percent = 25\n"
                   "device_budget_bytes = cuda:1=3M\n");
  const char *args[] = {"--config", conf, NULL};
  td_start(&d, args);
  unsetenv("QL_EMU_CUDA_MEM");
  ql_client *c = td_connect(&d), *admin = td_connect_admin(&d);
  budgets(c, &b0, &b1);
  ck_assert_uint_eq(b0, 1u << 20);
  ck_assert_uint_eq(b1, 3u << 20);

  /* 1.5 MiB of q8c codes: past cuda:0's budget, within cuda:1's. */
  td_layer big;
  td_layer_make(&big, 1024, 1536, 3, 0);
  char msg[512];
  ck_assert_int_eq(td_load(c, "big", &big, QL_FORMAT_Q8C, 0, 0, NULL, NULL),
                   QL_ENOMEM);
  snprintf(msg, sizeof msg, "%s", ql_errmsg());
  ck_assert_msg(strstr(msg, "budget") != NULL, "%s", msg);
  ql_stats_info *st = NULL;
  ck_assert_int_eq(ql_stats(c, &st), 0);
  ck_assert_uint_eq(st->weights, 0);
  ck_assert_uint_eq(st->devices[0].bytes_resident, 0);
  ck_assert_uint_eq(st->devices[1].bytes_resident, 0);
  ql_stats_free(st);

  /* Live: 50 % of 4 MiB is 2 MiB; cuda:1 back on the percent. */
  write_file(conf, "[qlineard]\naccel_budget_percent = 50\n");
  ck_assert_int_eq(ql_reload_config(admin, report, sizeof report), 0);
  ck_assert_msg(strstr(report, "accel_budget_percent = 50") != NULL, "%s",
                report);
  budgets(c, &b0, &b1);
  ck_assert_uint_eq(b0, 2u << 20);
  ck_assert_uint_eq(b1, 2u << 20);
  ck_assert_int_eq(td_load(c, "big", &big, QL_FORMAT_Q8C, 0, 0, NULL, NULL),
                   0);

  /* Two items for one device (alias and UUID): the reload is refused,
   * and nothing of the file applies (the budgets stay, and so does
   * accel_budget_percent beside them). */
  ql_hello_info h;
  ck_assert_int_eq(ql_hello(c, &h), 0);
  char text[512];
  snprintf(text, sizeof text, "[qlineard]\naccel_budget_percent = 75\n"
           "device_budget_bytes = cuda:0=1M,%s=2M\n", h.devices[0].name);
  write_file(conf, text);
  ck_assert_int_eq(ql_reload_config(admin, report, sizeof report), QL_EINVAL);
  ck_assert_msg(strstr(ql_errmsg(), "name the same device cuda:0") != NULL,
                "%s", ql_errmsg());
  budgets(c, &b0, &b1);
  ck_assert_uint_eq(b0, 2u << 20);
  ck_assert_uint_eq(b1, 2u << 20);
  write_file(conf, "[qlineard]\naccel_budget_percent = 50\n");
  ck_assert_int_eq(ql_reload_config(admin, report, sizeof report), 0);
  ck_assert_msg(strstr(report, "no changes") != NULL, "%s", report);

  td_layer_free(&big);
  ql_close(admin);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
  unlink(conf);
}
END_TEST

/*
 * A load names its devices: the weight is made resident there only and
 * served there only; unknown or repeated devices are refused before
 * anything is uploaded; content already resident is shared where it is;
 * a persistent weight keeps its placement across a restart, and falls
 * back to the default placement when its device is gone.
 */
START_TEST(placement) {
  td d;
  char state[] = "/tmp/ql-place-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(state));
  const char *args[] = {"--state-dir", state, NULL};
  start(&d, "2", NULL, args);
  ql_client *c = td_connect(&d), *admin = td_connect_admin(&d);
  ql_hello_info h;
  ck_assert_int_eq(ql_hello(c, &h), 0);
  td_layer l, l2;
  td_layer_make(&l, N, K, 21, 1);
  td_layer_make(&l2, N, K, 22, 1);
  ql_weight_info info;
  int shared = -1;
  float x[2 * K], y[2 * N], want[2 * N];
  uint64_t seed = 9;
  td_randn(&seed, x, 2 * K, 1.0f);
  expected(&l, QL_FORMAT_Q8C, 0, x, 2, want);

  /* On cuda:1 only. */
  ck_assert_int_eq(load_on(c, "one", &l, QL_FORMAT_Q8C, 0, "cuda:1", &info,
                           &shared),
                   0);
  ck_assert_int_eq(shared, 0);
  ck_assert_uint_eq(info.n_devices, 1);
  ck_assert_str_eq(info.devices, h.devices[1].name);
  char msg[512];
  ck_assert_int_eq(linear_on(&d, "one", "cuda:0", x, 2, y, msg, sizeof msg),
                   QL_ENOTFOUND);
  ck_assert_int_eq(linear_on(&d, "one", NULL, x, 2, y, NULL, 0), 0);
  ck_assert_int_eq(memcmp(y, want, sizeof y), 0);
  ql_stats_info *st = NULL;
  ck_assert_int_eq(ql_stats(c, &st), 0);
  ck_assert_uint_eq(st->devices[0].bytes_resident, 0);
  ck_assert_uint_gt(st->devices[1].bytes_resident, 0);
  ck_assert_uint_eq(st->n_per_weight, 1);
  ck_assert_str_eq(st->per_weight[0].device, h.devices[1].name);
  ql_stats_free(st);

  /* The CPU and a GPU, by name and alias (blanks around items are fine). */
  char list[160];
  snprintf(list, sizeof list, " cpu , %s", h.devices[0].name);
  ck_assert_int_eq(load_on(c, "two", &l2, QL_FORMAT_Q4G, 0, list, &info,
                           NULL),
                   0);
  ck_assert_uint_eq(info.n_devices, 2);
  ck_assert_ptr_nonnull(strstr(info.devices, "cpu"));
  ck_assert_ptr_nonnull(strstr(info.devices, h.devices[0].name));
  ck_assert_ptr_null(strstr(info.devices, h.devices[1].name));

  /* Refused before anything is uploaded, nothing left resident. */
  ck_assert_int_eq(load_on(c, "bad", &l, QL_FORMAT_Q8C, 0, "cuda:7", NULL,
                           NULL),
                   QL_ENOTFOUND);
  ck_assert_ptr_nonnull(strstr(ql_errmsg(), "no device 'cuda:7'"));
  snprintf(list, sizeof list, "cuda:0,%s", h.devices[0].name);
  ck_assert_int_eq(load_on(c, "bad", &l, QL_FORMAT_Q8C, 0, list, NULL, NULL),
                   QL_EINVAL);
  ck_assert_ptr_nonnull(strstr(ql_errmsg(), "named twice"));
  ck_assert_int_eq(load_on(c, "bad", &l, QL_FORMAT_Q8C, 0, "cpu,", NULL,
                           NULL),
                   QL_EINVAL);

  /* The same content again: shared where it is, so a list naming a
   * device it is not on is refused. */
  ck_assert_int_eq(load_on(c, "one", &l, QL_FORMAT_Q8C, 0, "cuda:0", NULL,
                           NULL),
                   QL_EEXIST);
  ck_assert_ptr_nonnull(strstr(ql_errmsg(), "is resident on cuda:1"));
  ck_assert_int_eq(load_on(c, "one", &l, QL_FORMAT_Q8C, 0, "cuda:1", &info,
                           &shared),
                   0);
  ck_assert_int_eq(shared, 1);
  ck_assert_int_eq(load_on(c, "one", &l, QL_FORMAT_Q8C, 0, NULL, &info,
                           &shared),
                   0);
  ck_assert_int_eq(shared, 1);
  ck_assert_uint_eq(info.n_devices, 1);
  ck_assert_int_eq(ql_stats(c, &st), 0);
  ck_assert_uint_eq(st->weights, 2);
  ql_stats_free(st);

  /* Persistent on cuda:1: after a restart it is there again. */
  ck_assert_int_eq(load_on(admin, "kept", &l, QL_FORMAT_Q8C, 1, "cuda:1",
                           &info, NULL),
                   0);
  ck_assert_str_eq(info.devices, h.devices[1].name);
  ql_close(admin);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
  start(&d, "2", NULL, args);
  c = td_connect(&d);
  ql_weight_info *ws = NULL;
  size_t nw = 0;
  ck_assert_int_eq(ql_list(c, &ws, &nw), 0);
  ck_assert_uint_eq(nw, 1);
  ck_assert_str_eq(ws[0].name, "kept");
  ck_assert_str_eq(ws[0].devices, h.devices[1].name);
  ql_free(ws);
  ck_assert_int_eq(linear_on(&d, "kept", "cuda:1", x, 2, y, NULL, 0), 0);
  ck_assert_int_eq(memcmp(y, want, sizeof y), 0);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);

  /* Its GPU gone (one GPU left): the default placement, with a warning. */
  start(&d, "1", NULL, args);
  c = td_connect(&d);
  ck_assert_int_eq(ql_list(c, &ws, &nw), 0);
  ck_assert_uint_eq(nw, 1);
  ck_assert_str_eq(ws[0].devices, h.devices[0].name);
  ql_free(ws);
  char *log = td_read_log(&d);
  ck_assert_ptr_nonnull(strstr(log, "stored weight kept was placed on"));
  free(log);
  ck_assert_int_eq(linear_on(&d, "kept", NULL, x, 2, y, NULL, 0), 0);
  ck_assert_int_eq(memcmp(y, want, sizeof y), 0);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);

  td_layer_free(&l);
  td_layer_free(&l2);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", state);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* An AUTO request of m rows of x [m, k] on weight (device NULL: the
 * scheduler's choice); returns the path that ran. */
static ql_path auto_request(const td *d, const char *weight,
                            const char *device, const float *x, uint64_t m,
                            uint64_t k) {
  Qlinear__V1__Response *r = td_linear_inline(d, weight, device, QL_PATH_AUTO,
                                              x, m, k, TMO);
  ck_assert_int_eq(r->status->code, 0);
  ql_path p = (ql_path)r->linear->path;
  qlinear__v1__response__free_unpacked(r, NULL);
  return p;
}

/* The crossover of weight on the GPUs, from Stats; 0 where not measured. */
static void gpu_crossovers(ql_client *c, const ql_hello_info *h,
                           const char *weight, uint32_t rows[2],
                           uint64_t reqs[2], uint64_t aq[2]) {
  ql_stats_info *st = NULL;
  ck_assert_int_eq(ql_stats(c, &st), 0);
  for (int g = 0; g < 2; g++) {
    rows[g] = 0;
    reqs[g] = aq[g] = 0;
    for (size_t i = 0; i < st->n_per_weight; i++) {
      const ql_weight_stats *w = &st->per_weight[i];
      if (strcmp(w->weight, weight) != 0 ||
          strcmp(w->device, h->devices[g].name) != 0)
        continue;
      rows[g] = w->crossover_measured ? w->crossover_rows : 0;
      reqs[g] = w->requests;
      aq[g] = w->aq_batches;
    }
  }
  ql_stats_free(st);
}

/* Replaces the cached rows of the key that names device in the crossover
 * cache text with rows. */
static void plant(char *text, size_t cap, const char *device, unsigned rows) {
  char *key = strstr(text, device);
  ck_assert_ptr_nonnull(key);
  char *colon = strstr(key, "\"rows\": ");
  ck_assert_ptr_nonnull(colon);
  char *num = colon + 8, *end = num;
  while (*end >= '0' && *end <= '9')
    end++;
  char *tail = strdup(end);
  ck_assert_ptr_nonnull(tail);
  snprintf(num, cap - (size_t)(num - text), "%u%s", rows, tail);
  free(tail);
}

/*
 * The crossover is measured per (shape, device), on each GPU that holds
 * the weight, reported per device (Stats, WeightInfo), cached by device
 * name, and used for the requests on that device: with the two GPUs'
 * crossovers planted at 3 and 300 rows, 4 rows run activation-quantized
 * on one and weight-only on the other, and a request that names no device
 * runs the path of the device it is placed on.
 */
START_TEST(crossover_per_device) {
  td d;
  char st[] = "/tmp/ql-xover-XXXXXX", path[256], text[8192];
  ck_assert_ptr_nonnull(mkdtemp(st));
  snprintf(path, sizeof path, "%s/crossover.json", st);
  const char *args[] = {"--state-dir", st, "--crossover-rows", "0", NULL};
  start(&d, "2", NULL, args);
  ql_client *c = td_connect(&d);
  ql_hello_info h;
  ck_assert_int_eq(ql_hello(c, &h), 0);
  td_layer l;
  const uint64_t n = 32, k = 64;
  td_layer_make(&l, n, k, 31, 0);
  ck_assert_int_eq(load_on(c, "xw", &l, QL_FORMAT_Q8C, 0, NULL, NULL, NULL),
                   0);
  uint32_t rows[2];
  uint64_t reqs[2], aq[2];
  for (int i = 0; i < 1200; i++) {
    gpu_crossovers(c, &h, "xw", rows, reqs, aq);
    if (rows[0] != 0 && rows[1] != 0)
      break;
    usleep(100 * 1000);
  }
  for (int g = 0; g < 2; g++)
    ck_assert_msg(rows[g] == UINT32_MAX || (rows[g] >= 1 && rows[g] <= 512),
                  "gpu %d: crossover %u", g, rows[g]);
  char *log = td_read_log(&d);
  ck_assert_ptr_nonnull(strstr(log, "crossover of xw (32x64) on cuda:0"));
  ck_assert_ptr_nonnull(strstr(log, "crossover of xw (32x64) on cuda:1"));
  free(log);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);

  /* Cached under each GPU's name; planted values come back per device. */
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  size_t got = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[got] = '\0';
  plant(text, sizeof text, h.devices[0].name, 3);
  plant(text, sizeof text, h.devices[1].name, 300);
  write_file(path, text);
  start(&d, "2", NULL, args);
  c = td_connect(&d);
  ck_assert_int_eq(load_on(c, "xw", &l, QL_FORMAT_Q8C, 0, NULL, NULL, NULL),
                   0);
  gpu_crossovers(c, &h, "xw", rows, reqs, aq);
  ck_assert_uint_eq(rows[0], 3);
  ck_assert_uint_eq(rows[1], 300);

  /* WeightInfo has both, in device order. */
  Qlinear__V1__Request req;
  Qlinear__V1__ListWeightsRequest lr;
  qlinear__v1__request__init(&req);
  qlinear__v1__list_weights_request__init(&lr);
  req.request_id = 5;
  req.body_case = QLINEAR__V1__REQUEST__BODY_LIST;
  req.list = &lr;
  Qlinear__V1__Response *r = td_call(&d, &req, TMO);
  ck_assert_ptr_nonnull(r);
  ck_assert_uint_eq(r->list->n_weights, 1);
  const Qlinear__V1__WeightInfo *wi = r->list->weights[0];
  ck_assert_uint_eq(wi->n_crossovers, 2);
  ck_assert_str_eq(wi->crossovers[0]->device, h.devices[0].name);
  ck_assert_uint_eq(wi->crossovers[0]->rows, 3);
  ck_assert(wi->crossovers[0]->measured);
  ck_assert_str_eq(wi->crossovers[1]->device, h.devices[1].name);
  ck_assert_uint_eq(wi->crossovers[1]->rows, 300);
  ck_assert_uint_eq(wi->crossover_rows, 3); /* the first device's */
  qlinear__v1__response__free_unpacked(r, NULL);

  float x[4 * 64];
  uint64_t seed = 3;
  td_randn(&seed, x, 4 * k, 1.0f);
  ck_assert_int_eq(auto_request(&d, "xw", "cuda:0", x, 4, k),
                   QL_PATH_ACT_QUANT);
  ck_assert_int_eq(auto_request(&d, "xw", "cuda:1", x, 4, k),
                   QL_PATH_WEIGHT_ONLY);
  ck_assert_int_eq(auto_request(&d, "xw", "cuda:1", x, 2, k),
                   QL_PATH_WEIGHT_ONLY);
  ck_assert_int_eq(auto_request(&d, "xw", "cuda:0", x, 2, k),
                   QL_PATH_WEIGHT_ONLY);
  uint64_t before[2] = {0, 0}, aq_before[2];
  gpu_crossovers(c, &h, "xw", rows, before, aq_before);
  ql_path p = auto_request(&d, "xw", NULL, x, 4, k);
  gpu_crossovers(c, &h, "xw", rows, reqs, aq);
  int on = reqs[0] > before[0] ? 0 : 1;
  ck_assert_uint_eq(reqs[on], before[on] + 1);
  ck_assert_uint_eq(reqs[1 - on], before[1 - on]);
  ck_assert_int_eq(p, on == 0 ? QL_PATH_ACT_QUANT : QL_PATH_WEIGHT_ONLY);
  ck_assert_uint_eq(aq[on], aq_before[on] + (on == 0));
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
  td_layer_free(&l);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", st);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/*
 * GPU 0 gets a sticky error after some work, GPU 1 a kernel that never
 * finishes: each fails its requests with QL_EDEVICE and a clear message,
 * goes out of service (logged once), and the rest keeps serving: the other
 * GPU while one is left, then new loads on the CPU.
 */
START_TEST(failing_devices) {
  td d;
  /* GPU 0 fails after 40 work items, GPU 1 hangs after 60. */
  const char *args[] = {"--kernel-timeout-ms", "300ms", NULL};
  start(&d, "2", "0:40:sticky,1:60:hang", args);
  ql_client *c = td_connect(&d);
  td_layer l;
  td_layer_make(&l, N, K, 3, 1);
  ck_assert_int_eq(td_load(c, "w", &l, QL_FORMAT_Q4G, 32, 0, NULL, NULL), 0);
  float x[2 * K], y[2 * N], want[2 * N];
  uint64_t seed = 9;
  td_randn(&seed, x, 2 * K, 1.0f);
  expected(&l, QL_FORMAT_Q4G, 32, x, 2, want);
  char msg[256];

  /* GPU 0 serves until its fault, then fails with QL_EDEVICE. */
  td_device_fails(&d, &cuda, "w", "cuda:0", x, 2, want);
  /* Requests that name no device go to GPU 1 until it hangs. */
  int64_t t_fail = 0;
  int rc = 0;
  int served = td_serve_until_error(&d, &cuda, "w", NULL, x, 2, want, &rc,
                                    msg, sizeof msg, &t_fail);
  ck_assert_int_gt(served, 0);
  ck_assert_int_eq(rc, QL_EDEVICE);
  /* Failed by the kernel timeout, not left hanging. */
  ck_assert_int_ge(t_fail, 250);
  ck_assert_int_lt(t_fail, 15000);
  /* Every device holding w is out of service. */
  ck_assert_int_eq(linear_on(&d, "w", NULL, x, 2, y, msg, sizeof msg),
                   QL_EDEVICE);
  ck_assert_ptr_nonnull(strstr(msg, "out of service"));
  /* A load naming a device out of service is refused. */
  ck_assert_int_eq(load_on(c, "w3", &l, QL_FORMAT_Q8C, 0, "cuda:0,cpu",
                           NULL, NULL),
                   QL_EDEVICE);
  ck_assert_ptr_nonnull(strstr(ql_errmsg(), "cuda:0 is out of service"));
  /* The daemon keeps serving: a new load goes to the CPU. */
  ql_weight_info info;
  ck_assert_int_eq(td_load(c, "w2", &l, QL_FORMAT_Q8C, 0, 0, &info, NULL), 0);
  ck_assert_str_eq(info.devices, "cpu");
  ck_assert_int_eq(ql_linear(c, "w2", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 2,
                             K, x, N, y, NULL),
                   0);
  char *log = td_read_log(&d);
  ck_assert_int_eq(td_count(log, "device cuda:0 ("), 1);
  ck_assert_int_eq(td_count(log, "device cuda:1 ("), 1);
  ck_assert_ptr_nonnull(strstr(log, "CUDA error cudaErrorIllegalAddress"));
  ck_assert_ptr_nonnull(strstr(log, "did not finish within 300 ms"));
  free(log);
  td_layer_free(&l);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* One client thread of batches_in_flight: R requests of its own x on the
 * one GPU, each checked against the in-process result. */
#define FLIGHT_R 6
typedef struct flight_arg {
  ql_client *c;
  float x[2 * K];
  float want[2 * N];
  int failures;
} flight_arg;

static void *flight_main(void *p) {
  flight_arg *a = p;
  float y[2 * N];
  for (int i = 0; i < FLIGHT_R; i++) {
    memset(y, 0, sizeof y);
    if (ql_linear(a->c, "w", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 2, K, a->x, N,
                  y, NULL) != 0 ||
        memcmp(y, a->want, sizeof y) != 0)
      a->failures++;
  }
  return NULL;
}

/* The most streams in flight at once on GPU 0, as the emulated runtime
 * wrote them to path (QL_EMU_CUDA_STATS); 0 when it wrote none. */
static int max_streams(const char *path) {
  FILE *f = fopen(path, "r");
  int dev, max, got = 0;
  if (f == NULL)
    return 0;
  while (fscanf(f, "%d %d", &dev, &max) == 2)
    if (dev == 0)
      got = max;
  fclose(f);
  return got;
}

/*
 * batches_in_flight: with 2, concurrent clients of one GPU have two
 * batches in flight at once (two streams with work, each launch kept
 * running for a while by QL_EMU_CUDA_KERNEL_MS); with 1, never more than
 * one. Every result is the in-process backend's bytes either way.
 */
START_TEST(batches_in_flight) {
  enum { NT = 4 };
  for (int lanes = 1; lanes <= 2; lanes++) {
    td d;
    char stats[64], nlanes[8];
    snprintf(stats, sizeof stats, "/tmp/ql-emu-stats-%d-%d", (int)getpid(),
             lanes);
    unlink(stats);
    snprintf(nlanes, sizeof nlanes, "%d", lanes);
    setenv("QL_EMU_CUDA_STATS", stats, 1);
    setenv("QL_EMU_CUDA_KERNEL_MS", "100", 1);
    const char *args[] = {"--batches-in-flight", nlanes, NULL};
    start(&d, "1", NULL, args);
    unsetenv("QL_EMU_CUDA_STATS");
    unsetenv("QL_EMU_CUDA_KERNEL_MS");
    ql_client *c = td_connect(&d);
    td_layer l;
    ql_weight_info info;
    td_layer_make(&l, N, K, 21, 1);
    ck_assert_int_eq(td_load(c, "w", &l, QL_FORMAT_Q4G, 32, 0, &info, NULL),
                     0);
    ck_assert_int_eq(strncmp(info.devices, "cuda:GPU-", 9), 0);
    ck_assert_ptr_null(strchr(info.devices, ','));
    static flight_arg a[NT];
    for (int i = 0; i < NT; i++) {
      uint64_t seed = 500 + (uint64_t)i;
      a[i].c = c;
      a[i].failures = 0;
      td_randn(&seed, a[i].x, 2 * K, 1.0f);
      expected(&l, QL_FORMAT_Q4G, 32, a[i].x, 2, a[i].want);
    }
    pthread_t th[NT];
    for (int i = 0; i < NT; i++)
      ck_assert_int_eq(pthread_create(&th[i], NULL, flight_main, &a[i]), 0);
    for (int i = 0; i < NT; i++) {
      pthread_join(th[i], NULL);
      ck_assert_int_eq(a[i].failures, 0);
    }
    ck_assert_int_eq(max_streams(stats), lanes);
    /* Stats count each batch once, whichever lane ran it. */
    ql_stats_info *st = NULL;
    ck_assert_int_eq(ql_stats(c, &st), 0);
    uint64_t reqs = 0;
    for (size_t i = 0; i < st->n_per_weight; i++)
      reqs += st->per_weight[i].requests;
    ck_assert_uint_eq(reqs, NT * FLIGHT_R);
    ql_stats_free(st);
    unlink(stats);
    td_layer_free(&l);
    ql_close(c);
    ck_assert_int_eq(td_stop(&d), 0);
  }
}
END_TEST

/*
 * max_queue bounds the requests waiting in each scheduler queue, not the
 * device worker's jobs: the loop gives a worker at most its lanes and one
 * measurement. With max_queue 1, two lanes and batches of one row, a
 * request of 4 rows is two batches handed over in one turn of the loop,
 * before a worker thread wakes: they were refused, and the client got
 * QL_EEXHAUSTED with no queue full.
 */
START_TEST(worker_queue_not_max_queue) {
  td d;
  const char *args[] = {"--batches-in-flight", "2", "--max-queue", "1",
                        "--max-batch-rows", "1", NULL};
  start(&d, "1", NULL, args);
  ql_client *c = td_connect(&d);
  td_layer l;
  ql_weight_info info;
  float x[4 * K], y[4 * N], want[4 * N];
  uint64_t seed = 77;
  td_layer_make(&l, N, K, 23, 1);
  ck_assert_int_eq(td_load(c, "w", &l, QL_FORMAT_Q8C, 0, 0, &info, NULL), 0);
  td_randn(&seed, x, 4 * K, 1.0f);
  expected_op(&l, QL_FORMAT_Q8C, 0, QL_OP_LINEAR_WO, x, 4, want);
  for (int i = 0; i < 20; i++) {
    ql_linear_result r;
    ck_assert_msg(ql_linear(c, "w", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 4, K,
                            x, N, y, &r) == 0,
                  "request %d: %s", i, ql_errmsg());
    ck_assert_mem_eq(y, want, sizeof y);
  }
  td_layer_free(&l);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

typedef struct load_arg {
  ql_client *c;
  const float *x;
  atomic_int *stop;
  int failures, calls;
} load_arg;

static void *ring_load_main(void *p) {
  load_arg *a = p;
  float y[2 * N];
  while (!atomic_load(a->stop)) {
    if (ql_linear(a->c, "w", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 2, K, a->x, N,
                  y, NULL) != 0)
      a->failures++;
    a->calls++;
  }
  return NULL;
}

/*
 * Stats waits for the replies workers sent early before it came to be
 * accounted, not for a moment with none outstanding: with two lanes and
 * ring clients back to back, the loop accounting each launch 100 ms after
 * its replies left (QL_TEST_EARLY_DELAY_MS), the windows overlap, and
 * Stats could wait as long as the load lasted (seconds, here, depending
 * on how the windows fell). A check of liveness: how the windows fall is
 * timing, so the old rule did not fail it every time.
 */
START_TEST(stats_not_starved_by_early_replies) {
  enum { NT = 2 };
  td d;
  const char *args[] = {"--batches-in-flight", "2", NULL};
  setenv("QL_TEST_EARLY_DELAY_MS", "100", 1);
  start(&d, "1", NULL, args);
  unsetenv("QL_TEST_EARLY_DELAY_MS");
  ql_client *c = td_connect(&d), *msg = td_connect_messages(&d);
  td_layer l;
  ql_weight_info info;
  float x[2 * K];
  uint64_t seed = 91;
  td_layer_make(&l, N, K, 24, 1);
  ck_assert_int_eq(td_load(c, "w", &l, QL_FORMAT_Q8C, 0, 0, &info, NULL), 0);
  td_randn(&seed, x, 2 * K, 1.0f);
  static atomic_int stop;
  atomic_store(&stop, 0);
  static load_arg a[NT];
  pthread_t th[NT];
  for (int i = 0; i < NT; i++) {
    a[i] = (load_arg){c, x, &stop, 0, 0};
    ck_assert_int_eq(pthread_create(&th[i], NULL, ring_load_main, &a[i]), 0);
  }
  usleep(500 * 1000); /* the load under way */
  int64_t t0 = td_now_ms();
  ql_stats_info *st = NULL;
  int rc = ql_stats(msg, &st);
  int64_t waited = td_now_ms() - t0;
  int calls_then = a[0].calls + a[1].calls;
  usleep(300 * 1000);
  int calls_after = a[0].calls + a[1].calls;
  atomic_store(&stop, 1);
  for (int i = 0; i < NT; i++) {
    pthread_join(th[i], NULL);
    ck_assert_int_eq(a[i].failures, 0);
  }
  ck_assert_int_eq(rc, 0);
  ql_stats_free(st);
  /* Answered while the load went on (it did, after), in about one
   * launch's accounting delay rather than the load's whole length. */
  ck_assert_int_gt(calls_after, calls_then);
  ck_assert_msg(waited < 3000, "Stats waited %lld ms", (long long)waited);
  td_layer_free(&l);
  ql_close(msg);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* The host ranges registered in the daemon's runtime now and ever, as it
 * wrote them to path (QL_EMU_CUDA_HOST_STATS); -1 when it wrote none. */
static void host_ranges(const char *path, long *live, long *ever) {
  FILE *f = fopen(path, "r");
  *live = *ever = -1;
  if (f == NULL)
    return;
  if (fscanf(f, "%ld %ld", live, ever) != 2)
    *live = *ever = -1;
  fclose(f);
}

/*
 * Region tensors on a GPU: the daemon registers each region with the CUDA
 * backend when it makes it and unregisters it when it is destroyed (the
 * emulated runtime counts the ranges); x read from and y written into the
 * region, weight-only and activation-quantized, are the in-process
 * backend's bytes, and a NaN in x leaves the y slice as it was.
 */
START_TEST(regions_registered) {
  enum { M = 3 };
  td d;
  char stats[64];
  long live, ever;
  snprintf(stats, sizeof stats, "/tmp/ql-emu-host-%d", (int)getpid());
  unlink(stats);
  setenv("QL_EMU_CUDA_HOST_STATS", stats, 1);
  start(&d, "1", NULL, NULL);
  unsetenv("QL_EMU_CUDA_HOST_STATS");
  ql_client *c = td_connect(&d);
  td_layer l;
  ql_weight_info info;
  td_layer_make(&l, N, K, 41, 1);
  ck_assert_int_eq(td_load(c, "w", &l, QL_FORMAT_Q4G, 32, 0, &info, NULL), 0);
  ck_assert_int_eq(strncmp(info.devices, "cuda:GPU-", 9), 0);
  ql_region *r = NULL;
  ck_assert_int_eq(ql_region_create(c, 64 << 10, &r), 0);
  host_ranges(stats, &live, &ever);
  ck_assert_int_eq(live, 1);
  ck_assert_int_eq(ever, 1);
  float x[M * K], want[M * N];
  uint64_t seed = 77;
  td_randn(&seed, x, M * K, 1.0f);
  unsigned char *base = r->data;
  const size_t yoff = 32768;
  memcpy(base, x, sizeof x);
  ql_slice xs = {r, 0, sizeof x}, ys = {r, yoff, sizeof want};
  const ql_path paths[] = {QL_PATH_WEIGHT_ONLY, QL_PATH_ACT_QUANT};
  for (int i = 0; i < 2; i++) {
    ql_linear_result res;
    memset(base + yoff, 0, sizeof want);
    ck_assert_int_eq(ql_linear_region(c, "w", paths[i], QL_DTYPE_F32, M, K,
                                      &xs, N, &ys, NULL, &res),
                     0);
    ck_assert_int_eq(strncmp(res.impl, "cuda.", 5), 0);
    expected_path(&l, QL_FORMAT_Q4G, 32, paths[i], x, M, want);
    ck_assert_int_eq(memcmp(base + yoff, want, sizeof want), 0);
  }
  float nan_x[M * K];
  memcpy(nan_x, x, sizeof x);
  nan_x[K + 5] = 0.0f / 0.0f;
  memcpy(base, nan_x, sizeof nan_x);
  memset(base + yoff, 0x5a, sizeof want);
  ck_assert_int_eq(ql_linear_region(c, "w", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32,
                                    M, K, &xs, N, &ys, NULL, NULL),
                   QL_ENONFINITE);
  for (size_t i = 0; i < sizeof want; i++)
    ck_assert_uint_eq(base[yoff + i], 0x5a);
  ck_assert_int_eq(ql_region_destroy(c, r), 0);
  host_ranges(stats, &live, &ever);
  ck_assert_int_eq(live, 0);
  ck_assert_int_eq(ever, 1);
  unlink(stats);
  td_layer_free(&l);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/*
 * max_pinned_bytes bounds the region bytes the daemon page-locks over all
 * sessions: a region past it is not registered, and its tensors are
 * staged, with the same bytes; a region destroyed gives its share back.
 */
START_TEST(regions_pinned_bound) {
  enum { M = 2 };
  td d;
  char stats[64];
  long live, ever;
  snprintf(stats, sizeof stats, "/tmp/ql-emu-host-%d", (int)getpid());
  unlink(stats);
  setenv("QL_EMU_CUDA_HOST_STATS", stats, 1);
  /* (One uid's share is all of it here: regions_pinned_share.) */
  const char *args[] = {"--max-pinned-bytes", "100K", "--uid-share", "100",
                        NULL};
  start(&d, "1", NULL, args);
  unsetenv("QL_EMU_CUDA_HOST_STATS");
  ql_client *c = td_connect(&d), *c2 = td_connect(&d);
  td_layer l;
  td_layer_make(&l, N, K, 43, 1);
  ck_assert_int_eq(td_load(c, "w", &l, QL_FORMAT_Q8C, 0, 0, NULL, NULL), 0);
  ck_assert_int_eq(td_load(c2, "w", &l, QL_FORMAT_Q8C, 0, 0, NULL, NULL), 0);
  ql_region *r1 = NULL, *r2 = NULL, *r3 = NULL;
  ck_assert_int_eq(ql_region_create(c, 64 << 10, &r1), 0);
  /* Another session's: the bound is the daemon's, not a session's. */
  ck_assert_int_eq(ql_region_create(c2, 64 << 10, &r2), 0);
  host_ranges(stats, &live, &ever);
  ck_assert_int_eq(live, 1);
  ck_assert_int_eq(ever, 1);
  float x[M * K], want[M * N];
  uint64_t seed = 78;
  td_randn(&seed, x, M * K, 1.0f);
  expected_path(&l, QL_FORMAT_Q8C, 0, QL_PATH_WEIGHT_ONLY, x, M, want);
  unsigned char *base = r2->data;
  const size_t yoff = 32768;
  memcpy(base, x, sizeof x);
  memset(base + yoff, 0, sizeof want);
  ql_slice xs = {r2, 0, sizeof x}, ys = {r2, yoff, sizeof want};
  ck_assert_int_eq(ql_linear_region(c2, "w", QL_PATH_WEIGHT_ONLY,
                                    QL_DTYPE_F32, M, K, &xs, N, &ys, NULL,
                                    NULL),
                   0);
  ck_assert_int_eq(memcmp(base + yoff, want, sizeof want), 0);
  ck_assert_int_eq(ql_region_destroy(c, r1), 0);
  ck_assert_int_eq(ql_region_create(c2, 64 << 10, &r3), 0);
  host_ranges(stats, &live, &ever);
  ck_assert_int_eq(live, 1);
  ck_assert_int_eq(ever, 2);
  ck_assert_int_eq(ql_region_destroy(c2, r2), 0);
  ck_assert_int_eq(ql_region_destroy(c2, r3), 0);
  host_ranges(stats, &live, &ever);
  ck_assert_int_eq(live, 0);
  unlink(stats);
  td_layer_free(&l);
  ql_close(c);
  ql_close(c2);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/*
 * One uid's page-locked regions are bounded by its share of
 * max_pinned_bytes (uid_share, 50 %), across its sessions: past it a
 * region is not registered (its tensors are staged, the same bytes), the
 * log names the uid, and a region destroyed gives its share back.
 */
START_TEST(regions_pinned_share) {
  enum { M = 2 };
  td d;
  char stats[64];
  long live, ever;
  snprintf(stats, sizeof stats, "/tmp/ql-emu-host-%d", (int)getpid());
  unlink(stats);
  setenv("QL_EMU_CUDA_HOST_STATS", stats, 1);
  const char *args[] = {"--max-pinned-bytes", "100K", NULL};
  start(&d, "1", NULL, args);
  unsetenv("QL_EMU_CUDA_HOST_STATS");
  ql_client *c = td_connect(&d), *c2 = td_connect(&d);
  td_layer l;
  td_layer_make(&l, N, K, 44, 1);
  ck_assert_int_eq(td_load(c2, "w", &l, QL_FORMAT_Q8C, 0, 0, NULL, NULL), 0);
  ql_region *r1 = NULL, *r2 = NULL, *r3 = NULL;
  ck_assert_int_eq(ql_region_create(c, 40 << 10, &r1), 0);
  /* Within the daemon's bound (80K of 100K), past the uid's 50K. */
  ck_assert_int_eq(ql_region_create(c2, 40 << 10, &r2), 0);
  host_ranges(stats, &live, &ever);
  ck_assert_int_eq(live, 1);
  ck_assert_int_eq(ever, 1);
  float x[M * K], want[M * N];
  uint64_t seed = 79;
  td_randn(&seed, x, M * K, 1.0f);
  expected_path(&l, QL_FORMAT_Q8C, 0, QL_PATH_WEIGHT_ONLY, x, M, want);
  unsigned char *base = r2->data;
  const size_t yoff = 16384;
  memcpy(base, x, sizeof x);
  memset(base + yoff, 0, sizeof want);
  ql_slice xs = {r2, 0, sizeof x}, ys = {r2, yoff, sizeof want};
  ck_assert_int_eq(ql_linear_region(c2, "w", QL_PATH_WEIGHT_ONLY,
                                    QL_DTYPE_F32, M, K, &xs, N, &ys, NULL,
                                    NULL),
                   0);
  ck_assert_int_eq(memcmp(base + yoff, want, sizeof want), 0);
  ck_assert_int_eq(ql_region_destroy(c, r1), 0);
  ck_assert_int_eq(ql_region_create(c2, 40 << 10, &r3), 0);
  host_ranges(stats, &live, &ever);
  ck_assert_int_eq(live, 1);
  ck_assert_int_eq(ever, 2);
  char *log = td_read_log(&d);
  char want_log[96];
  snprintf(want_log, sizeof want_log,
           "uid %u reached its share of page-locked region memory",
           (unsigned)geteuid());
  ck_assert_msg(strstr(log, want_log) != NULL, "the log names no uid");
  free(log);
  ck_assert_int_eq(ql_region_destroy(c2, r2), 0);
  ck_assert_int_eq(ql_region_destroy(c2, r3), 0);
  host_ranges(stats, &live, &ever);
  ck_assert_int_eq(live, 0);
  unlink(stats);
  td_layer_free(&l);
  ql_close(c);
  ql_close(c2);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* No driver: the CPU serves and the log says why, once; a daemon that
 * requires a GPU does not start. */
START_TEST(no_driver) {
  td d;
  setenv("QL_EMU_CUDA_NODRIVER", "1", 1);
  start(&d, "2", NULL, NULL);
  ql_client *c = td_connect(&d);
  ql_hello_info h;
  ck_assert_int_eq(ql_hello(c, &h), 0);
  ck_assert_uint_eq(h.n_devices, 1);
  ck_assert_str_eq(h.devices[0].name, "cpu");
  ql_close(c);
  char *log = td_read_log(&d); /* td_stop() removes it */
  ck_assert_int_eq(td_count(log, "cuda: no device: no CUDA driver"), 1);
  free(log);
  ck_assert_int_eq(td_stop(&d), 0);
  /* A required GPU that is not there: the daemon does not start. */
  char dir[] = "/tmp/ql-test-XXXXXX", out[4096];
  const char *req[] = {"--required-devices", "cpu,cuda:0", NULL};
  ck_assert_ptr_nonnull(mkdtemp(dir));
  ck_assert_int_gt(td_start_or_exit(&d, dir, req, out, sizeof out), 0);
  ck_assert_ptr_nonnull(
      strstr(out, "required device cuda:0 is not present (present: cpu)"));
  rmdir(dir);
  unsetenv("QL_EMU_CUDA_NODRIVER");
}
END_TEST


/* ------------------------------------------------------------ mapped mode */

/* Mappings in process pid of the VMM memory (the layouts) that process
 * owner allocated on the emulated runtime. */
static int emu_mappings(pid_t pid, pid_t owner) {
  return td_emu_mappings(pid, "ql-emu-cuda-vmm", owner);
}

/* A write through a read-only mapping ends here. */
#define SEGV_EXIT 42
static void on_segv(int sig) {
  (void)sig;
  _exit(SEGV_EXIT);
}

/* What a mapping client process does (mapped_client()). */
enum {
  MAP_RUN,
  MAP_RUN_TWICE,
  MAP_THEN_DIE,
  MAP_WRITE,
  MAP_UID_REFUSED, /* as another user: MapWeight refused (mapped_mode) */
  MAP_UID_MAPS     /* as another user: MapWeight answered */
};

/* A MAP_UID_* client runs as TD_OTHER_UID (group 0 kept, for the
 * sockets), from td_self_init() on. */

/* One mapped launch of h on x (m rows), into out (m·N floats). */
static int mapped_run(ql_mapped *h, const float *x, uint64_t m, float *out) {
  void *dx = NULL, *dy = NULL;
  size_t xb = m * K * sizeof(float), yb = m * N * sizeof(float);
  int ok = cudaMalloc(&dx, xb) == cudaSuccess &&
           cudaMalloc(&dy, yb) == cudaSuccess &&
           cudaMemcpy(dx, x, xb, cudaMemcpyHostToDevice) == cudaSuccess &&
           ql_linear_mapped(h, dx, dy, (int64_t)m, NULL) == 0 &&
           cudaStreamSynchronize(NULL) == cudaSuccess &&
           cudaMemcpy(out, dy, yb, cudaMemcpyDeviceToHost) == cudaSuccess;
  (void)cudaFree(dx);
  (void)cudaFree(dy);
  return ok;
}

/*
 * A client process of its own (this program run again, see main(): a
 * forked copy could not use nanomsg, whose threads stay in the parent):
 * connects to address, holds weight by name, maps it and computes y for
 * m rows of x (td_randn from seed) with the mapped kernel, writing y to
 * descriptor out. MAP_RUN_TWICE writes a byte to sync_w after its first
 * run and reads one from sync_r before its second. MAP_WRITE maps the
 * exported allocation read-only itself and writes through it, which must
 * fault (the emulated runtime maps it PROT_READ, as the driver maps it
 * for the GPU): exit status SEGV_EXIT. Leaves with _exit() (see
 * expected_op()).
 */
static void mapped_client(const char *address, const char *weight, int what,
                          uint64_t m, uint64_t seed, int out, int sync_r,
                          int sync_w) {
  ql_client *c = NULL;
  ql_mapped *h = NULL;
  float x[8 * K], y[16 * N];
  int ok = 0;
  if (m < 1 || m > 8)
    _exit(2);
  td_randn(&seed, x, m * K, 1.0f);
  if (ql_connect(address, NULL, &c) != 0)
    goto done;
  /* Another user holds this user's plain-named weight by its digest
   * (the daemon refuses a hold by name alone: docs/security.md). */
  ql_weight_info wi;
  if (getuid() == TD_OTHER_UID
          ? ql_lookup(c, weight, &wi) != 0 ||
                ql_hold(c, weight, wi.digest, NULL) != 0
          : ql_hold(c, weight, NULL, NULL) != 0)
    goto done;
  if (what == MAP_UID_REFUSED || what == MAP_UID_MAPS) {
    ql_weight_map wm;
    int rc = ql_map_weight(c, weight, NULL, &wm);
    if (getuid() != TD_OTHER_UID)
      goto done;
    if (what == MAP_UID_MAPS) {
      ok = rc == 0 && wm.fd >= 0;
      if (ok)
        close(wm.fd);
    } else {
      ok = rc == QL_EPERM && wm.fd == -1 &&
           strstr(ql_errmsg(), "mapped_mode = owner") != NULL;
    }
    goto done;
  }
  if (what == MAP_WRITE) {
    ql_weight_map wm;
    ql__vmm_mem vm;
    if (ql_map_weight(c, weight, NULL, &wm) != 0 || wm.writable ||
        cudaSetDevice(0) != cudaSuccess ||
        ql__vmm_import(0, wm.fd, (size_t)wm.size, 0, &vm) != 0)
      goto done;
    close(wm.fd);
    /* Our own handler, so that a sanitizer's does not turn the fault into
     * an ordinary exit. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_segv;
    if (sigaction(SIGSEGV, &sa, NULL) != 0)
      goto done;
    ((volatile unsigned char *)vm.base)[wm.q_offset] = 1;
    goto done; /* not reached when the mapping is read-only */
  }
  if (ql_mapped_open(c, weight, NULL, QL_DTYPE_F32, 8, &h) != 0 ||
      !mapped_run(h, x, m, y))
    goto done;
  if (what == MAP_THEN_DIE)
    raise(SIGKILL);
  if (what == MAP_RUN_TWICE) {
    char b = 1;
    if (write(sync_w, &b, 1) != 1 || read(sync_r, &b, 1) != 1 ||
        !mapped_run(h, x, m, y + m * N))
      goto done;
  }
  size_t bytes = (what == MAP_RUN_TWICE ? 2 : 1) * m * N * sizeof(float);
  ok = write(out, y, bytes) == (ssize_t)bytes;
done:
  ql_mapped_close(h);
  ql_close(c);
  _exit(ok ? 0 : 1);
}

/* A mapping client started by mc_start(). */
typedef struct mc {
  pid_t pid;
  int out; /* a temporary file it writes y to */
} mc;

/* Starts mapped_client() in a new process (this program, run again);
 * sync_r and sync_w may be -1. */
static void mc_start(mc *p, const td *d, const char *weight, int what,
                     uint64_t m, uint64_t seed, int sync_r, int sync_w) {
  char tmpl[] = "/tmp/ql-mapped-XXXXXX";
  p->out = mkstemp(tmpl);
  ck_assert_int_ge(p->out, 0);
  unlink(tmpl);
  char a[6][32];
  snprintf(a[0], sizeof a[0], "%d", what);
  snprintf(a[1], sizeof a[1], "%llu", (unsigned long long)m);
  snprintf(a[2], sizeof a[2], "%llu", (unsigned long long)seed);
  snprintf(a[3], sizeof a[3], "%d", p->out);
  snprintf(a[4], sizeof a[4], "%d", sync_r);
  snprintf(a[5], sizeof a[5], "%d", sync_w);
  char *const argv[] = {"test_cuda_daemon", "--mapped-client",
                        (char *)d->address, (char *)weight, a[0], a[1],
                        a[2], a[3], a[4], a[5], NULL};
  /* Another user, in group 0, from after exec (td_spawn_self()). */
  p->pid =
      td_spawn_self(argv, what == MAP_UID_REFUSED || what == MAP_UID_MAPS);
}

/* Waits for p; its wait status, and y (floats of it) when it wrote
 * them. */
static int mc_wait(mc *p, float *y, size_t floats) {
  int status = 0;
  ck_assert_int_eq(waitpid(p->pid, &status, 0), p->pid);
  if (floats > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
    ck_assert_int_eq(pread(p->out, y, floats * sizeof(float), 0),
                     (ssize_t)(floats * sizeof(float)));
  close(p->out);
  return status;
}

/* One mapping client from start to end. */
static int map_in_child(const td *d, const char *weight, int what,
                        uint64_t m, uint64_t seed, float *y) {
  mc p;
  mc_start(&p, d, weight, what, m, seed, -1, -1);
  return mc_wait(&p, y, what == MAP_RUN ? m * N : 0);
}

/*
 * Two client processes map one weight of each format the daemon loaded
 * and compute with the daemon's weight-only kernel on their own: the same
 * bytes as the daemon's own launch (the request says weight-only), and
 * the daemon's device memory is one copy whatever maps it.
 */
START_TEST(mapped_two_clients) {
  static const struct {
    ql_format f;
    uint32_t gs;
  } fmts[] = {{QL_FORMAT_Q4G, 64}, {QL_FORMAT_Q8C, 0}, {QL_FORMAT_Q8B, 32},
              {QL_FORMAT_F8R, 0}};
  td d;
  const uint64_t m = 3;
  float x[3 * K], y[3 * N], want[3 * N];
  uint64_t seed = 77;
  start(&d, "1", NULL, NULL);
  ql_client *c = td_connect(&d);
  td_randn(&seed, x, m * K, 1.0f); /* as the clients make it */
  for (size_t i = 0; i < sizeof fmts / sizeof *fmts; i++) {
    td_layer l;
    char name[16];
    snprintf(name, sizeof name, "map%zu", i);
    td_layer_make(&l, N, K, 40 + i, i % 2 == 0);
    ck_assert_int_eq(td_load_on(c, name, &l, fmts[i].f, fmts[i].gs, 0,
                                "cuda:0", NULL, NULL), 0);
    ck_assert_int_eq(linear_on(&d, name, "cuda:0", x, m, want, NULL, 0), 0);
    ql_stats_info *st = NULL;
    ck_assert_int_eq(ql_stats(c, &st), 0);
    uint64_t resident = st->devices[0].bytes_resident;
    ql_stats_free(st);
    int layouts = emu_mappings(d.pid, d.pid);
    ck_assert_int_eq(layouts, (int)i + 1);
    /* Two at once. */
    mc p[2];
    for (int k = 0; k < 2; k++)
      mc_start(&p[k], &d, name, MAP_RUN, m, 77, -1, -1);
    for (int k = 0; k < 2; k++) {
      memset(y, 0, sizeof y);
      int status = mc_wait(&p[k], y, m * N);
      ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                    "mapped client %d of %s failed (%d)", k, name, status);
      ck_assert_msg(memcmp(y, want, sizeof y) == 0,
                    "mapped %s differs from the daemon's launch", name);
    }
    /* One copy in the daemon, whatever mapped it. */
    ck_assert_int_eq(ql_stats(c, &st), 0);
    ck_assert_uint_eq(st->devices[0].bytes_resident, resident);
    ql_stats_free(st);
    ck_assert_int_eq(emu_mappings(d.pid, d.pid), layouts);
    td_layer_free(&l);
  }
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/*
 * What is refused, with the daemon serving on: a weight the session does
 * not hold, a device it is not on, the CPU's layout, another user under
 * mapped_mode = owner (as root: a client run as TD_OTHER_UID), mapped_mode =
 * off; a write through a mapping kills the writer (read-only), not the
 * daemon.
 */
START_TEST(mapped_refused) {
  td d;
  ql_weight_map wm;
  float x[K], y[N], want[N];
  uint64_t seed = 78;
  td_layer l;
  start(&d, "2", NULL, NULL);
  ql_client *c = td_connect(&d), *other = td_connect(&d);
  td_layer_make(&l, N, K, 50, 1);
  td_randn(&seed, x, K, 1.0f);
  ck_assert_int_eq(td_load_on(c, "g", &l, QL_FORMAT_Q4G, 64, 0, "cuda:0",
                              NULL, NULL), 0);
  ck_assert_int_eq(td_load_on(c, "h", &l, QL_FORMAT_Q8C, 0, 0, "cpu", NULL,
                              NULL), 0);
  /* Not held by this session: refused, however resident. */
  ck_assert_int_eq(ql_map_weight(other, "g", NULL, &wm), QL_ENOTFOUND);
  ck_assert_int_eq(wm.fd, -1);
  ck_assert_ptr_nonnull(strstr(ql_errmsg(), "holds no weight 'g'"));
  ck_assert_int_eq(ql_map_weight(c, "nope", NULL, &wm), QL_ENOTFOUND);
  ck_assert_int_eq(ql_map_weight(c, "bad..name", NULL, &wm), QL_ENAME);
  /* Held, but not on that device, or on none that exports. */
  ck_assert_int_eq(ql_map_weight(c, "g", "cuda:1", &wm), QL_ENOTFOUND);
  ck_assert_int_eq(ql_map_weight(c, "g", "cuda:7", &wm), QL_ENOTFOUND);
  ck_assert_int_eq(ql_map_weight(c, "h", NULL, &wm), QL_ENOTSUP);
  ck_assert_int_eq(ql_map_weight(c, "h", "cpu", &wm), QL_ENOTSUP);
  /* Held: the layout, described. */
  ck_assert_int_eq(ql_map_weight(c, "g", "cuda:0", &wm), 0);
  ck_assert_int_ge(wm.fd, 0);
  close(wm.fd);
  ck_assert_str_eq(wm.layout, "cuda-1");
  ck_assert_int_eq(strncmp(wm.device, "cuda:GPU-", 9), 0);
  ck_assert_int_eq(wm.format, QL_FORMAT_Q4G);
  ck_assert_uint_eq(wm.n, N);
  ck_assert_uint_eq(wm.k, K);
  ck_assert_uint_eq(wm.groups, (K + 63) / 64);
  ck_assert_uint_eq(wm.ldq % 16, 0);
  ck_assert_uint_ne(wm.zero_offset, UINT64_MAX);
  ck_assert_uint_ne(wm.bias_offset, UINT64_MAX);
  ck_assert_int_eq(wm.writable, 0);
  ck_assert_uint_eq(wm.size % 65536, 0);
  /* Again: another descriptor of the same allocation. */
  ql_weight_map wm2;
  ck_assert_int_eq(ql_map_weight(c, "g", NULL, &wm2), 0);
  ck_assert_int_ge(wm2.fd, 0);
  close(wm2.fd);
  ck_assert_uint_eq(wm2.size, wm.size);
  ck_assert_uint_eq(wm2.q_offset, wm.q_offset);
  /* Mapped: this session holds it until it ends. */
  ck_assert_int_eq(ql_unload(c, "g"), QL_EPERM);
  ck_assert_ptr_nonnull(strstr(ql_errmsg(), "mapped 'g'"));
  /* libqlinear-cuda's own checks. */
  ql_mapped *h = NULL;
  ck_assert_int_eq(ql_mapped_open(c, "g", NULL, QL_DTYPE_F32, 0, &h),
                   QL_EINVAL);
  ck_assert_int_eq(ql_mapped_open(c, "g", NULL, QL_DTYPE_F32,
                                  QL_MAPPED_MAX_ROWS + 1, &h), QL_EINVAL);
  ck_assert_int_eq(ql_mapped_open(c, "g", NULL, (ql_dtype)99, 1, &h),
                   QL_EINVAL);
  ck_assert_int_eq(ql_mapped_open(other, "g", NULL, QL_DTYPE_F32, 1, &h),
                   QL_ENOTFOUND);
  ck_assert_ptr_null(h);
  ck_assert_int_eq(ql_linear_mapped(NULL, x, y, 1, NULL), QL_EINVAL);
  /* mapped_mode = owner (the default): a client of another user may
   * hold and use the weight, not map it. Only root can be another user
   * here; the group keeps the sockets open to it. */
  int status;
  if (geteuid() == 0) {
    ck_assert_int_eq(chmod(d.dir, 0750), 0);
    status = map_in_child(&d, "g", MAP_UID_REFUSED, 1, 78, NULL);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "another user's MapWeight was not refused with QL_EPERM "
                  "(%d)", status);
  } else {
    fprintf(stderr, "mapped_refused: not root: the other-user case of "
                    "mapped_mode = owner is not run\n");
  }
  /* A write through the mapping faults in the writer. */
  status = map_in_child(&d, "g", MAP_WRITE, 1, 78, NULL);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == SEGV_EXIT,
                "a write through a read-only mapping did not fault (%d)",
                status);
  /* The daemon serves on, the weight unchanged. */
  expected(&l, QL_FORMAT_Q4G, 64, x, 1, want);
  ck_assert_int_eq(linear_on(&d, "g", "cuda:0", x, 1, y, NULL, 0), 0);
  ck_assert_int_eq(memcmp(y, want, sizeof y), 0);
  ql_close(other);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
  /* mapped_mode = any (the default, owner, lets this test's own user map
   * as well); off; and layouts made without export (QL_CUDA_VMM=0). */
  const char *any[] = {"--mapped-mode", "any", NULL};
  start(&d, "1", NULL, any);
  c = td_connect(&d);
  ck_assert_int_eq(td_load_on(c, "g", &l, QL_FORMAT_Q4G, 64, 0, "cuda:0",
                              NULL, NULL), 0);
  ck_assert_int_eq(ql_map_weight(c, "g", NULL, &wm), 0);
  close(wm.fd);
  if (geteuid() == 0) { /* and so may another user's */
    ck_assert_int_eq(chmod(d.dir, 0750), 0);
    status = map_in_child(&d, "g", MAP_UID_MAPS, 1, 78, NULL);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "mapped_mode = any refused another user (%d)", status);
  }
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
  const char *off[] = {"--mapped-mode", "off", NULL};
  start(&d, "1", NULL, off);
  c = td_connect(&d);
  ck_assert_int_eq(td_load_on(c, "g", &l, QL_FORMAT_Q4G, 64, 0, "cuda:0",
                              NULL, NULL), 0);
  ck_assert_int_eq(ql_map_weight(c, "g", NULL, &wm), QL_ENOTSUP);
  ck_assert_ptr_nonnull(strstr(ql_errmsg(), "mapped_mode is off"));
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
  setenv("QL_CUDA_VMM", "0", 1);
  start(&d, "1", NULL, NULL);
  unsetenv("QL_CUDA_VMM");
  c = td_connect(&d);
  ck_assert_int_eq(td_load_on(c, "g", &l, QL_FORMAT_Q4G, 64, 0, "cuda:0",
                              NULL, NULL), 0);
  ck_assert_int_eq(ql_map_weight(c, "g", NULL, &wm), QL_ENOTSUP);
  ck_assert_int_eq(linear_on(&d, "g", "cuda:0", x, 1, y, NULL, 0), 0);
  ck_assert_int_eq(memcmp(y, want, sizeof y), 0);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
  td_layer_free(&l);
}
END_TEST

/*
 * The weight cannot change under a mapping: an admin unload and a new
 * load under the same name leave the mapping computing with the old
 * content, while the daemon serves the new one; the old layout is freed
 * when the mapping client's session ends. A client killed with its
 * mapping open frees nothing the daemon still needs.
 */
START_TEST(mapped_unload_and_kill) {
  td d;
  const uint64_t m = 2;
  float x[2 * K], y[4 * N], old_y[2 * N], new_y[2 * N];
  uint64_t seed = 79;
  td_layer l1, l2;
  start(&d, "1", NULL, NULL);
  ql_client *c = td_connect(&d), *admin = td_connect_admin(&d);
  td_layer_make(&l1, N, K, 60, 1);
  td_layer_make(&l2, N, K, 61, 1);
  td_randn(&seed, x, m * K, 1.0f);
  /* Loaded through the admin socket, so that no session but the mapping
   * client's holds it. */
  ck_assert_int_eq(td_load_on(admin, "w", &l1, QL_FORMAT_Q8C, 0, 0,
                              "cuda:0", NULL, NULL), 0);
  ck_assert_int_eq(linear_on(&d, "w", "cuda:0", x, m, old_y, NULL, 0), 0);

  /* A client that maps, runs, waits, and runs again. */
  int to_child[2], from_child[2];
  ck_assert_int_eq(pipe(to_child), 0);
  ck_assert_int_eq(pipe(from_child), 0);
  mc p;
  mc_start(&p, &d, "w", MAP_RUN_TWICE, m, 79, to_child[0], from_child[1]);
  char b;
  ck_assert_int_eq(read(from_child[0], &b, 1), 1); /* first run done */
  int before = emu_mappings(d.pid, d.pid);
  ck_assert_int_eq(ql_unload(admin, "w"), 0);
  /* Unloaded, but mapped: the layout stays. */
  ck_assert_int_eq(emu_mappings(d.pid, d.pid), before);
  ck_assert_int_eq(td_load_on(admin, "w", &l2, QL_FORMAT_Q8C, 0, 0,
                              "cuda:0", NULL, NULL), 0);
  ck_assert_int_eq(linear_on(&d, "w", "cuda:0", x, m, new_y, NULL, 0), 0);
  ck_assert_int_ne(memcmp(new_y, old_y, sizeof old_y), 0);
  int loaded = emu_mappings(d.pid, d.pid);
  ck_assert_int_eq(loaded, before + 1);
  ck_assert_int_eq(write(to_child[1], &b, 1), 1);
  int status = mc_wait(&p, y, 2 * m * N);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "the mapping client failed (%d)", status);
  /* Both of its runs: the old content. */
  ck_assert_int_eq(memcmp(y, old_y, sizeof old_y), 0);
  ck_assert_int_eq(memcmp(y + m * N, old_y, sizeof old_y), 0);
  /* Its session over, the old layout goes. */
  int64_t until = td_now_ms() + TMO;
  while (emu_mappings(d.pid, d.pid) != loaded - 1 && td_now_ms() < until)
    usleep(10000);
  ck_assert_int_eq(emu_mappings(d.pid, d.pid), loaded - 1);
  for (int i = 0; i < 2; i++)
    close(to_child[i]), close(from_child[i]);

  /* Killed with its mapping open: the daemon keeps serving the weight,
   * and the next client maps it as before. */
  status = map_in_child(&d, "w", MAP_THEN_DIE, m, 79, NULL);
  ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                "status %d", status);
  ck_assert_int_eq(linear_on(&d, "w", "cuda:0", x, m, y, NULL, 0), 0);
  ck_assert_int_eq(memcmp(y, new_y, sizeof new_y), 0);
  status = map_in_child(&d, "w", MAP_RUN, m, 79, y);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d",
                status);
  ck_assert_int_eq(memcmp(y, new_y, sizeof new_y), 0);
  /* Both clients gone, their references with them: once the admin
   * unloads it, nothing keeps the layout. */
  ck_assert_int_eq(ql_unload(admin, "w"), 0);
  until = td_now_ms() + TMO;
  while (emu_mappings(d.pid, d.pid) != 0 && td_now_ms() < until)
    usleep(10000);
  ck_assert_int_eq(emu_mappings(d.pid, d.pid), 0);
  char *log = td_read_log(&d);
  ck_assert_int_ge(td_count(log, "maps weight w on cuda:0"), 3);
  free(log);
  td_layer_free(&l1);
  td_layer_free(&l2);
  ql_close(admin);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

int main(int argc, char **argv) {
  td_self_init(); /* a mapping client as another user: from here on */
  if (argc > 1 && strcmp(argv[1], "--mapped-client") == 0) {
    if (argc != 10)
      _exit(2); /* never the suite again */
    mapped_client(argv[2], argv[3], atoi(argv[4]),
                  strtoull(argv[5], NULL, 10), strtoull(argv[6], NULL, 10),
                  atoi(argv[7]), atoi(argv[8]), atoi(argv[9]));
  }
  Suite *s = suite_create("cuda_daemon");
  TCase *tc = tcase_create("cuda_daemon");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, serves_on_gpus);
  tcase_add_test(tc, device_budget);
  tcase_add_test(tc, configured_budget);
  tcase_add_test(tc, placement);
  tcase_add_test(tc, crossover_per_device);
  tcase_add_test(tc, f8r_on_cublaslt);
  tcase_add_test(tc, q8c_on_imma);
  tcase_add_test(tc, q8c_imma_default);
  tcase_add_test(tc, failing_devices);
  tcase_add_test(tc, batches_in_flight);
  tcase_add_test(tc, worker_queue_not_max_queue);
  tcase_add_test(tc, stats_not_starved_by_early_replies);
  tcase_add_test(tc, regions_registered);
  tcase_add_test(tc, regions_pinned_bound);
  tcase_add_test(tc, regions_pinned_share);
  tcase_add_test(tc, no_driver);
  tcase_add_test(tc, mapped_two_clients);
  tcase_add_test(tc, mapped_unload_and_kill);
  suite_add_tcase(s, tc);
  /* The cases with a client of another user, apart so that
   * test_private_build.sh can run them alone (CK_RUN_CASE=second_uid)
   * from a copy under a 0700 directory. */
  TCase *uid = tcase_create("second_uid");
  tcase_set_timeout(uid, 300);
  tcase_add_test(uid, mapped_refused);
  suite_add_tcase(s, uid);
  return td_run_suite(s);
}
