/*
 * test_ze.c - the ze backend of libqlkernels (kernels/ze/backend.c) on the
 * Level Zero test driver (tests/ze_driver/libze_qltest.so, the kernels on
 * PoCL) with the loader's validation layer on, on what the conformance
 * harness does not reach:
 *  - quantize_rows refusing a value its source dtype cannot hold
 *    (QL_EINVAL), NaN/Inf (QL_ENONFINITE), and, like the reference, the
 *    first offending value of the first offending row deciding which;
 *  - group sums for group lengths the harness does not use (1, 7, K);
 *  - the argument checks, which must match the reference's;
 *  - the ops that are the reference's own evaluation order: AQ q8c and
 *    q4g, and WO q4g, give the reference's bytes exactly; the other WO
 *    formats are checked by the harness against a bound only;
 *  - IPC imports (ipc_open_fd, ipc_close) of memory this process exports
 *    on its own context, as a client would: the handle's bytes after the
 *    descriptor cannot make an import anything but the exporter's whole
 *    allocation, and an import that is refused is closed;
 *  - a call whose scratch fits the device's free memory runs though the
 *    arena's usual margin does not fit;
 *  - a call whose append fails waits for what it had queued.
 * main() points the loader at the driver before anything calls zeInit.
 * Each test runs in its own process (check's fork mode), so each starts
 * the backend and builds the kernels once. A call the validation layer
 * refuses is QL_EINTERNAL, which fails the asserts on return codes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <check.h>
#include <level_zero/ze_api.h>

#include "ql_kernels.h"
#include "registry.h"
#include "testutil.h"

static const ql_backend *ze(void) {
  const ql_backend *b = ql_backend_find("ze");
  ck_assert_msg(b != NULL, "libqlkernels has no ze backend");
  return b;
}

static const ql_kernel_impl *impl(ql_op op) {
  const ql_backend *b = ze();
  for (size_t i = 0; i < b->n_impls; i++)
    if (b->impls[i].op == op)
      return &b->impls[i];
  ck_abort_msg("ze has no implementation of op %d", (int)op);
  return NULL;
}

/* x [m, k]: Gaussian values, made exact in dt (the widened src data). */
static void make_x(uint64_t seed, ql_dtype dt, float *x, int64_t m,
                   int64_t k) {
  uint64_t s = seed;
  for (int64_t i = 0; i < m * k; i++) {
    double u1 = ((double)(tu_rng_next(&s) >> 11) + 0.5) * 0x1p-53;
    double u2 = (double)(tu_rng_next(&s) >> 11) * 0x1p-53;
    x[i] = (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
  }
  if (dt != QL_DTYPE_F32) {
    void *tmp = malloc((size_t)(m * k) * 2);
    ql_from_f32(dt, x, tmp, (size_t)(m * k));
    ql_to_f32(dt, tmp, x, (size_t)(m * k));
    free(tmp);
  }
}

static int qrows(int kind, ql_dtype src, const float *x, int64_t m, int64_t k,
                 uint32_t gs, void *xq, float *sx, int32_t *gsum) {
  ql_qrows_args a = {kind, x, m, k, gs, xq, sx, gsum, src};
  return impl(QL_OP_QUANTIZE_ROWS)->fn.quantize_rows(&a);
}

START_TEST(test_qrows_refusals) {
  const int64_t m = 3, k = 200;
  float x[3 * 200], sx[3];
  int8_t xq[3 * 200];
  static const ql_dtype dts[2] = {QL_DTYPE_F16, QL_DTYPE_BF16};

  for (int d = 0; d < 2; d++) {
    ql_dtype dt = dts[d];
    for (int kind = QL_QROWS_I8; kind <= QL_QROWS_E4M3; kind++) {
      make_x(7, dt, x, m, k);
      ck_assert_int_eq(qrows(kind, dt, x, m, k, 32, xq, sx, NULL), 0);
      /* 1 + 2^-20 is an f32 that neither f16 nor bf16 holds */
      x[1 * k + 150] = 1.0f + 0x1p-20f;
      ck_assert_int_eq(qrows(kind, dt, x, m, k, 32, xq, sx, NULL), QL_EINVAL);
      ck_assert_int_eq(kind == QL_QROWS_I8
                           ? ql_quantize_rows_i8_src(dt, x, m, k, 32, xq, sx,
                                                     NULL)
                           : ql_quantize_rows_e4m3_src(dt, x, m, k,
                                                       (uint8_t *)xq, sx),
                       QL_EINVAL);
      /* a NaN later in the same row: the earlier inexact value decides */
      x[1 * k + 190] = NAN;
      ck_assert_int_eq(qrows(kind, dt, x, m, k, 32, xq, sx, NULL), QL_EINVAL);
      /* a NaN earlier in that row decides, on another lane */
      x[1 * k + 3] = INFINITY;
      ck_assert_int_eq(qrows(kind, dt, x, m, k, 32, xq, sx, NULL),
                       QL_ENONFINITE);
      /* an earlier row's inexact value decides over all of that */
      x[0 * k + 199] = -1.0f - 0x1p-20f;
      ck_assert_int_eq(qrows(kind, dt, x, m, k, 32, xq, sx, NULL), QL_EINVAL);
      /* f32 holds every value: only the NaN/Inf count */
      ck_assert_int_eq(qrows(kind, QL_DTYPE_F32, x, m, k, 32, xq, sx, NULL),
                       QL_ENONFINITE);
    }
  }
}
END_TEST

/* Group sums for odd group lengths, against the reference's bytes. */
START_TEST(test_qrows_group_lengths) {
  static const uint32_t gss[] = {1, 7, 33, 200, 1000};
  const int64_t m = 5, k = 200;
  float x[5 * 200], sx[5], sx2[5];
  int8_t xq[5 * 200], xq2[5 * 200];
  int32_t gsum[5 * 200], gsum2[5 * 200];

  make_x(11, QL_DTYPE_BF16, x, m, k);
  for (size_t i = 0; i < sizeof gss / sizeof gss[0]; i++) {
    int64_t g = (k + gss[i] - 1) / gss[i];
    memset(gsum, 0x5A, sizeof gsum);
    ck_assert_int_eq(
        qrows(QL_QROWS_I8, QL_DTYPE_BF16, x, m, k, gss[i], xq, sx, gsum), 0);
    ck_assert_int_eq(ql_quantize_rows_i8_src(QL_DTYPE_BF16, x, m, k, gss[i],
                                             xq2, sx2, gsum2),
                     0);
    ck_assert(memcmp(xq, xq2, sizeof xq) == 0);
    ck_assert(memcmp(sx, sx2, sizeof sx) == 0);
    ck_assert_msg(memcmp(gsum, gsum2, (size_t)(m * g) * sizeof(int32_t)) == 0,
                  "gs=%u: group sums differ", gss[i]);
  }
}
END_TEST

START_TEST(test_qrows_args) {
  float x[16] = {0}, sx[2];
  int8_t xq[16];
  int32_t gsum[16];
  ql_qrows_args a = {QL_QROWS_I8, x, 2, 8, 4, xq, sx, gsum, QL_DTYPE_F32};
  const ql_kernel_impl *im = impl(QL_OP_QUANTIZE_ROWS);

  ck_assert_int_eq(im->fn.quantize_rows(&a), 0);
  a.kind = 3;
  ck_assert_int_eq(im->fn.quantize_rows(&a), QL_EINVAL);
  a.kind = QL_QROWS_E4M3; /* e4m3 has no group sums */
  ck_assert_int_eq(im->fn.quantize_rows(&a), QL_EINVAL);
  a.kind = QL_QROWS_I8;
  a.gs = 0;
  ck_assert_int_eq(im->fn.quantize_rows(&a), QL_EINVAL);
  a.gs = 4;
  a.src = (ql_dtype)9;
  ck_assert_int_eq(im->fn.quantize_rows(&a), QL_EDTYPE);
  a.src = (ql_dtype)0; /* 0 is f32 */
  ck_assert_int_eq(im->fn.quantize_rows(&a), 0);
  a.k = 0;
  ck_assert_int_eq(im->fn.quantize_rows(&a), QL_ESHAPE);
  a.k = 8;
  a.m = 0;
  ck_assert_int_eq(im->fn.quantize_rows(&a), QL_ESHAPE);
  a.m = 2;
  a.xq = NULL;
  ck_assert_int_eq(im->fn.quantize_rows(&a), QL_EINVAL);
}
END_TEST

static ql_qweight *weight(ql_format f, uint32_t gs, int asym, ql_dtype sdt,
                          int64_t n, int64_t k, int bias) {
  float *w = malloc((size_t)(n * k) * sizeof(float)), *b = malloc(
                                                          (size_t)n * sizeof(float));
  ql_quant_params p = {f, gs, asym, sdt};
  ql_qweight *q = NULL;
  make_x(99 + (uint64_t)f, QL_DTYPE_F32, w, n, k);
  make_x(5, QL_DTYPE_F32, b, 1, n);
  ck_assert_int_eq(ql_qweight_quantize(&p, n, k, QL_DTYPE_F32, w,
                                       bias ? b : NULL, &q),
                   0);
  free(w);
  free(b);
  return q;
}

/* Runs op on the ze backend (with its layout) and the reference; the
 * bytes must be equal. */
static void same_bytes(ql_op op, const ql_qweight *q, ql_dtype dt, int64_t m,
                       const char *what) {
  size_t esz = ql_dtype_size(dt), nx = (size_t)(m * q->k),
         ny = (size_t)(m * q->n);
  float *xf = malloc(nx * sizeof(float));
  void *x = malloc(nx * esz), *y = malloc(ny * esz), *y2 = malloc(ny * esz);
  ql_repack_args ra = {.w = q};
  const ql_kernel_impl *rp = impl(QL_OP_REPACK), *im = impl(op);

  make_x(3, dt, xf, m, q->k);
  ql_from_f32(dt, xf, x, nx);
  ck_assert_int_eq(rp->fn.repack(&ra), 0);
  ck_assert(ra.packed != NULL && ra.packed_bytes > 0);
  {
    ql_linear_args a = {q, ra.packed, dt, x, m, y, NULL};
    ck_assert_int_eq(im->fn.linear(&a), 0);
  }
  ck_assert_int_eq(op == QL_OP_LINEAR_AQ ? ql_linear_aq_ref(q, dt, x, m, y2)
                                         : ql_linear_wo_ref(q, dt, x, m, y2),
                   0);
  ck_assert_msg(memcmp(y, y2, ny * esz) == 0, "%s: not the reference's bytes",
                what);
  rp->free_packed(ra.packed);
  free(xf);
  free(x);
  free(y);
  free(y2);
}

START_TEST(test_bit_exact) {
  static const ql_dtype dts[3] = {QL_DTYPE_F32, QL_DTYPE_F16, QL_DTYPE_BF16};
  static const int64_t ks[] = {1, 31, 129, 1000};
  for (int d = 0; d < 3; d++)
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
      int64_t k = ks[ki];
      ql_qweight *q8 = weight(QL_FORMAT_Q8C, 0, 0, dts[(d + 1) % 3], 9, k,
                              (int)ki & 1);
      ql_qweight *q4 = weight(QL_FORMAT_Q4G, 32u << (ki % 4), 0, dts[d], 9, k,
                              !((int)ki & 1));
      same_bytes(QL_OP_LINEAR_AQ, q8, dts[d], 6, "AQ q8c");
      same_bytes(QL_OP_LINEAR_AQ, q4, dts[d], 6, "AQ q4g");
      same_bytes(QL_OP_LINEAR_WO, q4, dts[d], 5, "WO q4g");
      ql_qweight_free(q8);
      ql_qweight_free(q4);
    }
}
END_TEST

START_TEST(test_linear_args) {
  ql_qweight *q = weight(QL_FORMAT_Q4G, 32, 0, QL_DTYPE_BF16, 4, 64, 1);
  ql_qweight *q8b = weight(QL_FORMAT_Q8B, 32, 1, QL_DTYPE_BF16, 4, 64, 0);
  ql_qweight *other = weight(QL_FORMAT_Q4G, 64, 0, QL_DTYPE_BF16, 4, 64, 1);
  float x[2 * 64] = {0}, y[2 * 4];
  ql_repack_args ra = {.w = q};
  const ql_kernel_impl *rp = impl(QL_OP_REPACK), *wo = impl(QL_OP_LINEAR_WO),
                       *aq = impl(QL_OP_LINEAR_AQ);
  ql_linear_args a = {q, NULL, QL_DTYPE_F32, x, 2, y, NULL};

  ck_assert_int_eq(rp->fn.repack(&ra), 0);
  ck_assert_int_eq(wo->fn.linear(&a), 0); /* no layout: one for the call */
  a.packed = ra.packed;
  ck_assert_int_eq(wo->fn.linear(&a), 0);
  ck_assert_int_eq(aq->fn.linear(&a), 0);
  a.w = other; /* a layout made from another weight */
  ck_assert_int_eq(wo->fn.linear(&a), QL_EINVAL);
  a.w = q;
  a.m = 0;
  ck_assert_int_eq(wo->fn.linear(&a), QL_ESHAPE);
  a.m = 2;
  a.dt = (ql_dtype)7;
  ck_assert_int_eq(wo->fn.linear(&a), QL_EDTYPE);
  a.dt = QL_DTYPE_F32;
  a.y = NULL;
  ck_assert_int_eq(aq->fn.linear(&a), QL_EINVAL);
  a.y = y;
  x[70] = NAN;
  ck_assert_int_eq(wo->fn.linear(&a), QL_ENONFINITE);
  ck_assert_int_eq(aq->fn.linear(&a), QL_ENONFINITE);
  x[70] = 0.0f;
  {
    /* q8b is weight-only */
    ql_linear_args b = {q8b, NULL, QL_DTYPE_F32, x, 2, y, NULL};
    ck_assert_int_eq(aq->fn.linear(&b), QL_ENOTSUP);
    ck_assert_int_eq(wo->fn.linear(&b), 0);
  }
  ck_assert(aq->supports(aq, QL_FORMAT_Q8C, 1, 1, QL_AQ_Q8C_MAX_K));
  ck_assert(!aq->supports(aq, QL_FORMAT_Q8C, 1, 1, QL_AQ_Q8C_MAX_K + 1));
  ck_assert(aq->supports(aq, QL_FORMAT_Q4G, 1, 1, QL_AQ_Q8C_MAX_K + 1));
  ck_assert_int_eq(ql_backend_check(ze()), 0);
  rp->free_packed(ra.packed);
  ql_qweight_free(q);
  ql_qweight_free(q8b);
  ql_qweight_free(other);
}
END_TEST

/* ---- IPC imports ---- */

#define ZE_OK(call) ck_assert_int_eq((int)(call), (int)ZE_RESULT_SUCCESS)

/* A client's side, in this process: its own context on device 0 of the
 * test driver (the backend's ordinal 0) and a synchronous command list
 * for copies. The test driver's memory is one table for every context, as
 * a driver's allocations are one address space for a process. */
typedef struct client {
  ze_driver_handle_t drv;
  ze_device_handle_t dev;
  ze_context_handle_t ctx;
  ze_command_list_handle_t list;
} client;

static void client_open(client *c) {
  const char *why = NULL;
  uint32_t n = 1;
  ze_context_desc_t cd = {.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC};
  ze_command_queue_desc_t qd = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                                .mode = ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS};
  /* the backend's zeInit, before anything of the client's */
  ck_assert_int_gt(ze()->device_count(&why), 0);
  ZE_OK(zeDriverGet(&n, &c->drv));
  n = 1;
  ZE_OK(zeDeviceGet(c->drv, &n, &c->dev));
  ZE_OK(zeContextCreate(c->drv, &cd, &c->ctx));
  ZE_OK(zeCommandListCreateImmediate(c->ctx, c->dev, &qd, &c->list));
}

static void client_close(client *c) {
  ZE_OK(zeCommandListDestroy(c->list));
  ZE_OK(zeContextDestroy(c->ctx));
}

/* Synchronous mode: done when the append returns. */
static void client_copy(client *c, void *dst, const void *src, size_t n) {
  ZE_OK(zeCommandListAppendMemoryCopy(c->list, dst, src, n, NULL, 0, NULL));
}

/* n bytes of device memory, each one byte. */
static unsigned char *client_alloc(client *c, size_t n, unsigned char byte) {
  ze_device_mem_alloc_desc_t dd = {.stype =
                                       ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
  unsigned char *p = NULL, *h = malloc(n);
  ck_assert_ptr_nonnull(h);
  memset(h, byte, n);
  ZE_OK(zeMemAllocDevice(c->ctx, &dd, n, 64, c->dev, (void **)&p));
  client_copy(c, p, h, n);
  free(h);
  return p;
}

/* 1 when the n bytes of device memory at p are all byte. */
static int client_holds(client *c, const void *p, size_t n,
                        unsigned char byte) {
  unsigned char *h = malloc(n);
  int ok = 1;
  ck_assert_ptr_nonnull(h);
  client_copy(c, h, p, n);
  for (size_t i = 0; i < n; i++)
    ok &= h[i] == byte;
  free(h);
  return ok;
}

/* The IPC handle of the allocation at p, and its descriptor (which the
 * daemon would have received over the session socket). */
static int client_export(client *c, void *p, ze_ipc_mem_handle_t *h) {
  uint64_t word;
  ZE_OK(zeMemGetIpcHandle(c->ctx, p, h));
  memcpy(&word, h->data, sizeof word);
  ck_assert_uint_le(word, 1u << 30);
  return (int)word;
}

/* How many mappings of the file of descriptor fd this process has: the
 * test driver maps a device allocation's memfd once for the allocation
 * and once more for each of its imports that is open. */
static int mappings(int fd) {
  struct stat st;
  char *line = NULL;
  size_t cap = 0;
  int n = 0;
  FILE *f = fopen("/proc/self/maps", "r");

  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fstat(fd, &st), 0);
  while (getline(&line, &cap, f) > 0) {
    unsigned maj, min;
    unsigned long long ino;
    /* address perms offset dev inode path */
    if (sscanf(line, "%*s %*s %*s %x:%x %llu", &maj, &min, &ino) == 3 &&
        ino == (unsigned long long)st.st_ino && makedev(maj, min) == st.st_dev)
      n++;
  }
  free(line);
  fclose(f);
  return n;
}

/*
 * A handle whose pool offset (bytes 8..15: compute-runtime adds it to the
 * imported pointer unchecked, and the test driver does as it does) names
 * another allocation of the process, as another client's weight in the
 * daemon would be: the import is still the exporter's whole allocation,
 * and closing it leaves the other allocation as it was.
 */
START_TEST(test_ipc_pool_offset) {
  const ql_backend *b = ze();
  client c;
  unsigned char *victim, *mine;
  ze_ipc_mem_handle_t h;
  void *base = NULL, *probe = NULL;
  uint64_t size = 0, off;
  int fd;

  client_open(&c);
  victim = client_alloc(&c, 8192, 'V');
  mine = client_alloc(&c, 4096, 'M');
  fd = client_export(&c, mine, &h);
  /* Where an import of it is mapped, so that the offset names the victim
   * (a closed import's place is where the next one is mapped). */
  ck_assert_int_eq(b->ipc_open_fd(0, fd, h.data, sizeof h.data, &probe, &size),
                   0);
  ck_assert_int_eq(b->ipc_close(0, probe), 0);
  off = (uint64_t)(uintptr_t)victim - (uint64_t)(uintptr_t)probe;
  memcpy(h.data + 8, &off, sizeof off);
  ck_assert_int_eq(b->ipc_open_fd(0, fd, h.data, sizeof h.data, &base, &size),
                   0);
  ck_assert_ptr_ne(base, victim);
  ck_assert_uint_eq(size, 4096);
  ck_assert_msg(client_holds(&c, base, 4096, 'M'),
                "the import is not the exporter's memory");
  ck_assert_int_eq(b->ipc_close(0, base), 0);
  ck_assert_int_eq(mappings(fd), 1);
  ck_assert(client_holds(&c, victim, 8192, 'V'));
  ZE_OK(zeMemFree(c.ctx, victim));
  ZE_OK(zeMemFree(c.ctx, mine));
  client_close(&c);
}
END_TEST

/* A pool offset that takes the pointer outside every allocation: opened
 * as the whole allocation, or refused, and in either case no import is
 * left open once the backend is done with it. */
START_TEST(test_ipc_offset_no_leak) {
  const ql_backend *b = ze();
  client c;
  unsigned char *mine;
  ze_ipc_mem_handle_t h;
  void *base = NULL;
  uint64_t size = 0, off = 1ull << 62;
  int fd, rc;

  client_open(&c);
  mine = client_alloc(&c, 4096, 'M');
  fd = client_export(&c, mine, &h);
  ck_assert_int_eq(mappings(fd), 1);
  memcpy(h.data + 8, &off, sizeof off);
  rc = b->ipc_open_fd(0, fd, h.data, sizeof h.data, &base, &size);
  if (rc == 0) {
    ck_assert_uint_eq(size, 4096);
    ck_assert(client_holds(&c, base, 4096, 'M'));
    ck_assert_int_eq(b->ipc_close(0, base), 0);
  } else {
    ck_assert_int_eq(rc, QL_EINVAL);
  }
  ck_assert_int_eq(mappings(fd), 1);
  ZE_OK(zeMemFree(c.ctx, mine));
  client_close(&c);
}
END_TEST

/* A driver whose import does not start at the base of the allocation
 * that zeMemGetAddressRange gives (QL_ZE_TEST_IPC_SHIFT): the size of
 * that allocation does not bound the import, which is refused, and
 * closed by the pointer the open returned. */
START_TEST(test_ipc_not_base) {
  const ql_backend *b = ze();
  client c;
  unsigned char *mine;
  ze_ipc_mem_handle_t h;
  void *base = NULL;
  uint64_t size = 0;
  int fd;

  setenv("QL_ZE_TEST_IPC_SHIFT", "256", 1); /* read at zeInit */
  client_open(&c);
  mine = client_alloc(&c, 4096, 'M');
  fd = client_export(&c, mine, &h);
  ck_assert_int_eq(b->ipc_open_fd(0, fd, h.data, sizeof h.data, &base, &size),
                   QL_EINVAL);
  ck_assert_int_eq(mappings(fd), 1);
  ZE_OK(zeMemFree(c.ctx, mine));
  client_close(&c);
}
END_TEST

/* ---- device memory ---- */

/*
 * A call whose device scratch fits in what the device has left, with
 * 64 KiB to spare, though a quarter more (what an arena grows by) does
 * not: the call runs. x is nearly all of the scratch of a weight-only
 * call (1 MiB; y, a flag and their guards take under 4 KiB).
 */
START_TEST(test_arena_fits) {
  enum { M = 64, K = 4096, N = 4 };
  const size_t mem = 8u << 20, xb = (size_t)M * K * sizeof(float),
               spare = xb + (64u << 10);
  const ql_kernel_impl *rp = impl(QL_OP_REPACK), *wo = impl(QL_OP_LINEAR_WO);
  ql_qweight *q = weight(QL_FORMAT_Q8C, 0, 0, QL_DTYPE_F32, N, K, 1);
  ql_repack_args ra = {.w = q};
  ze_device_mem_alloc_desc_t dd = {.stype =
                                       ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
  float *x = malloc(xb), y[M * N], ref[M * N];
  void *filler = NULL, *more = NULL;
  client c;

  ck_assert_ptr_nonnull(x);
  setenv("QL_ZE_TEST_MEM", "8388608", 1); /* read at zeInit */
  client_open(&c);
  ck_assert_int_eq(rp->fn.repack(&ra), 0);
  ck_assert_uint_lt(ra.packed_bytes + spare, mem);
  ZE_OK(zeMemAllocDevice(c.ctx, &dd, mem - ra.packed_bytes - spare, 64, c.dev,
                         &filler));
  ck_assert_int_eq(
      (int)zeMemAllocDevice(c.ctx, &dd, xb + xb / 4, 64, c.dev, &more),
      (int)ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
  make_x(11, QL_DTYPE_F32, x, M, K);
  {
    ql_linear_args a = {q, ra.packed, QL_DTYPE_F32, x, M, y, NULL};
    ck_assert_int_eq(wo->fn.linear(&a), 0);
  }
  ql_linear_wo_ref(q, QL_DTYPE_F32, x, M, ref);
  for (int i = 0; i < M * N; i++)
    ck_assert_float_eq_tol(y[i], ref[i], 1e-3f * (1.0f + fabsf(ref[i])));
  ZE_OK(zeMemFree(c.ctx, filler));
  rp->free_packed(ra.packed);
  ql_qweight_free(q);
  free(x);
  client_close(&c);
}
END_TEST

/* ---- failures ---- */

/*
 * A call whose append fails (out of memory, QL_ZE_TEST_FAULT "oom") after
 * others were queued returns only once those are over: on a device that
 * has stopped running them ("hang"), waiting for them outlasts the kernel
 * timeout, which takes the device out of service and makes the call's
 * result QL_EDEVICE. The faults strike in quantize_rows, in the upload of
 * the layout a linear call makes for itself, in staging x, and in the
 * quantization of an activation-quantized call (counting the commands the
 * calls append).
 */
START_TEST(test_failed_append_hung) {
  static const char *const faults[] = {"0:0:hang,0:3:oom", "0:0:hang,0:1:oom",
                                       "0:2:hang,0:5:oom", "0:9:hang,0:11:oom"};
  const ql_backend *b = ze();
  ql_backend_config cfg = {.kernel_timeout_ms = 200};
  const int64_t m = 2, k = 64;
  float x[2 * 64], sx[2], y[2 * 4];
  int8_t xq[2 * 64];
  char why[160] = "";
  int rc;

  setenv("QL_ZE_TEST_FAULT", faults[_i], 1); /* read at zeInit */
  ck_assert_int_eq(b->configure(&cfg), 0);
  make_x(3, QL_DTYPE_F32, x, m, k);
  if (_i == 0) {
    rc = qrows(QL_QROWS_I8, QL_DTYPE_F32, x, m, k, 32, xq, sx, NULL);
  } else {
    ql_qweight *q = weight(QL_FORMAT_Q8C, 0, 0, QL_DTYPE_F32, 4, k, 1);
    ql_linear_args a = {q, NULL, QL_DTYPE_F32, x, m, y, NULL};
    rc = impl(_i == 3 ? QL_OP_LINEAR_AQ : QL_OP_LINEAR_WO)->fn.linear(&a);
    ql_qweight_free(q);
  }
  ck_assert_int_eq(rc, QL_EDEVICE);
  ck_assert_int_eq(b->device_error(0, why, sizeof why), QL_EDEVICE);
  ck_assert_msg(strstr(why, "did not finish") != NULL, "%s", why);
}
END_TEST

/* The same failure on a device that runs what it is given: QL_ENOMEM for
 * the call, the device in service, and the next call right. */
START_TEST(test_failed_append) {
  const ql_backend *b = ze();
  const int64_t m = 2, k = 64;
  float x[2 * 64], sx[2], sx2[2];
  int8_t xq[2 * 64], xq2[2 * 64];
  char why[160];

  setenv("QL_ZE_TEST_FAULT", "0:3:oom", 1); /* read at zeInit */
  make_x(3, QL_DTYPE_F32, x, m, k);
  ck_assert_int_eq(qrows(QL_QROWS_I8, QL_DTYPE_F32, x, m, k, 32, xq, sx, NULL),
                   QL_ENOMEM);
  ck_assert_int_eq(b->device_error(0, why, sizeof why), 0);
  ck_assert_int_eq(qrows(QL_QROWS_I8, QL_DTYPE_F32, x, m, k, 32, xq, sx, NULL),
                   0);
  ck_assert_int_eq(
      ql_quantize_rows_i8_src(QL_DTYPE_F32, x, m, k, 32, xq2, sx2, NULL), 0);
  ck_assert(memcmp(xq, xq2, sizeof xq) == 0);
  ck_assert(memcmp(sx, sx2, sizeof sx) == 0);
}
END_TEST

int main(void) {
  const char *drv = getenv("QL_ZE_TEST_DRIVER");
  if (drv == NULL || *drv == '\0')
    drv = QL_ZE_TEST_DRIVER;
  /* before the backend's zeInit: the loader reads these once */
  if (setenv("ZE_ENABLE_ALT_DRIVERS", drv, 1) != 0 ||
      setenv("ZE_ENABLE_VALIDATION_LAYER", "1", 1) != 0 ||
      setenv("ZE_ENABLE_PARAMETER_VALIDATION", "1", 1) != 0 ||
      setenv("ZE_ENABLE_HANDLE_LIFETIME", "1", 1) != 0) {
    perror("setenv");
    return 1;
  }
  Suite *s = suite_create("ze");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_qrows_refusals);
  tcase_add_test(tc, test_qrows_group_lengths);
  tcase_add_test(tc, test_qrows_args);
  tcase_add_test(tc, test_bit_exact);
  tcase_add_test(tc, test_linear_args);
  tcase_add_test(tc, test_ipc_pool_offset);
  tcase_add_test(tc, test_ipc_offset_no_leak);
  tcase_add_test(tc, test_ipc_not_base);
  tcase_add_test(tc, test_arena_fits);
  tcase_add_loop_test(tc, test_failed_append_hung, 0, 4);
  tcase_add_test(tc, test_failed_append);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
