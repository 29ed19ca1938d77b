/*
 * test_ze_driver.c - the Level Zero test driver (tests/ze_driver/
 * ze_qltest.c) through the real loader, as the ze backend will use it:
 * the loader loads the driver named by QL_ZE_TEST_DRIVER through
 * ZE_ENABLE_ALT_DRIVERS, with its validation layer on and its parameter
 * and handle-lifetime checks enabled (main() sets the environment).
 *
 * The validation layer of loader 1.8 reports what it finds only through
 * the result codes of the calls it checks (it prints nothing), so "the
 * layer reported no errors" is: every call of every test below returns
 * what it must, ZE_OK() where that is ZE_RESULT_SUCCESS. test_layer shows
 * that the layer is in the path: the loader lists it, and it refuses a
 * bad enumeration with a code the driver itself would not return.
 *
 * Each test runs in its own process (check's fork mode) and calls zeInit
 * there, after setting any QL_ZE_TEST_* variable it needs: the driver
 * reads them at zeInit.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>
#include <level_zero/loader/ze_loader.h>
#include <level_zero/ze_api.h>

#include "ql_kernels.h"
#include "ql_ze.h"
#include "testutil.h"
#include "ze/ze_spirv.h"

#define ZE_OK(call)                                                            \
  do {                                                                         \
    ze_result_t r_ = (call);                                                   \
    ck_assert_msg(r_ == ZE_RESULT_SUCCESS, "%s: 0x%x", #call, (unsigned)r_);   \
  } while (0)
#define ZE_IS(want, call)                                                      \
  do {                                                                         \
    ze_result_t r_ = (call);                                                   \
    ck_assert_msg(r_ == (want), "%s: 0x%x, not %s", #call, (unsigned)r_,       \
                  #want);                                                      \
  } while (0)

/* Waits that must succeed: long, the machine is shared; waits that must
 * time out: short. Neither is a bound on the driver's speed. */
#define LONG_WAIT 120000000000ull
#define SHORT_WAIT 20000000ull

#define BUILD_FLAGS "-cl-fp32-correctly-rounded-divide-sqrt"

typedef struct zt {
  ze_driver_handle_t drv;
  ze_device_handle_t dev[8];
  uint32_t ndev;
  ze_context_handle_t ctx;
  ze_command_list_handle_t list;
  ze_event_pool_handle_t pool;
  ze_event_handle_t ev[8];
} zt;

/* zeInit and the first device's context, immediate list and 8 events. */
static void zt_open(zt *t) {
  uint32_t n = 1;
  ze_context_desc_t cd = {.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC};
  ze_command_queue_desc_t qd = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                                .mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS};
  ze_event_pool_desc_t pd = {.stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC,
                             .flags = ZE_EVENT_POOL_FLAG_HOST_VISIBLE,
                             .count = 8};

  memset(t, 0, sizeof *t);
  ZE_OK(zeInit(0));
  ZE_OK(zeDriverGet(&n, &t->drv));
  ck_assert_uint_eq(n, 1);
  t->ndev = 8;
  ZE_OK(zeDeviceGet(t->drv, &t->ndev, t->dev));
  ck_assert_uint_ge(t->ndev, 1);
  ZE_OK(zeContextCreate(t->drv, &cd, &t->ctx));
  ZE_OK(zeCommandListCreateImmediate(t->ctx, t->dev[0], &qd, &t->list));
  ZE_OK(zeEventPoolCreate(t->ctx, &pd, 1, &t->dev[0], &t->pool));
  for (uint32_t i = 0; i < 8; i++) {
    ze_event_desc_t ed = {.stype = ZE_STRUCTURE_TYPE_EVENT_DESC,
                          .index = i,
                          .signal = ZE_EVENT_SCOPE_FLAG_HOST,
                          .wait = ZE_EVENT_SCOPE_FLAG_HOST};
    ZE_OK(zeEventCreate(t->pool, &ed, &t->ev[i]));
  }
}

static void zt_close(zt *t) {
  for (uint32_t i = 0; i < 8; i++)
    ZE_OK(zeEventDestroy(t->ev[i]));
  ZE_OK(zeEventPoolDestroy(t->pool));
  ZE_OK(zeCommandListDestroy(t->list));
  ZE_OK(zeContextDestroy(t->ctx));
}

static void *dev_alloc(zt *t, size_t n) {
  ze_device_mem_alloc_desc_t d = {.stype =
                                      ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
  void *p = NULL;
  ZE_OK(zeMemAllocDevice(t->ctx, &d, n, 0, t->dev[0], &p));
  ck_assert_ptr_nonnull(p);
  return p;
}

static void *host_alloc(zt *t, size_t n) {
  ze_host_mem_alloc_desc_t d = {.stype = ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC};
  void *p = NULL;
  ZE_OK(zeMemAllocHost(t->ctx, &d, n, 0, &p));
  ck_assert_ptr_nonnull(p);
  return p;
}

/* A synchronous copy through t's list and event 7. */
static void copy(zt *t, void *dst, const void *src, size_t n) {
  ZE_OK(zeEventHostReset(t->ev[7]));
  ZE_OK(zeCommandListAppendMemoryCopy(t->list, dst, src, n, t->ev[7], 0,
                                      NULL));
  ZE_OK(zeEventHostSynchronize(t->ev[7], LONG_WAIT));
}

static const ql__ze_module *find_module(const char *name, const char *variant) {
  for (size_t i = 0; i < ql__ze_n_modules; i++)
    if (strcmp(ql__ze_modules[i].name, name) == 0 &&
        strcmp(ql__ze_modules[i].variant, variant) == 0)
      return &ql__ze_modules[i];
  ck_abort_msg("no embedded module %s-%s", name, variant);
  return NULL;
}

static ze_result_t module_create(zt *t, const ql__ze_module *m,
                                 const char *flags, ze_module_handle_t *mod,
                                 ze_module_build_log_handle_t *log) {
  ze_module_desc_t d = {.stype = ZE_STRUCTURE_TYPE_MODULE_DESC,
                        .format = ZE_MODULE_FORMAT_IL_SPIRV,
                        .inputSize = m->size,
                        .pInputModule = m->spirv,
                        .pBuildFlags = flags};
  return zeModuleCreate(t->ctx, t->dev[0], &d, mod, log);
}

static ze_kernel_handle_t kernel(ze_module_handle_t mod, const char *name) {
  ze_kernel_desc_t d = {.stype = ZE_STRUCTURE_TYPE_KERNEL_DESC,
                        .pKernelName = name};
  ze_kernel_handle_t k = NULL;
  ZE_OK(zeKernelCreate(mod, &d, &k));
  return k;
}

/* Argument setters, in the kernels' argument order (ql_ze.h). */
typedef struct kargs {
  ze_kernel_handle_t k;
  uint32_t i;
} kargs;

static void arg_l(kargs *a, int64_t v) {
  ZE_OK(zeKernelSetArgumentValue(a->k, a->i++, sizeof v, &v));
}
static void arg_i(kargs *a, int32_t v) {
  ZE_OK(zeKernelSetArgumentValue(a->k, a->i++, sizeof v, &v));
}
static void arg_p(kargs *a, const void *p) {
  ZE_OK(zeKernelSetArgumentValue(a->k, a->i++, sizeof p, &p));
}

/* Launches k in groups of QL_ZE_WG x 1 x 1 and waits for it. */
static void launch(zt *t, ze_kernel_handle_t k, uint32_t gx, uint32_t gy) {
  ze_group_count_t gc = {gx, gy, 1};
  ZE_OK(zeKernelSetGroupSize(k, QL_ZE_WG, 1, 1));
  ZE_OK(zeEventHostReset(t->ev[6]));
  ZE_OK(zeCommandListAppendLaunchKernel(t->list, k, &gc, t->ev[6], 0, NULL));
  ZE_OK(zeEventHostSynchronize(t->ev[6], LONG_WAIT));
}

static void make_x(uint64_t seed, float *x, size_t n) {
  uint64_t s = seed;
  for (size_t i = 0; i < n; i++)
    x[i] = (float)tu_rng_gauss(&s);
}

/* ---- enumeration and properties ---- */

START_TEST(test_enumerate) {
  zt t;
  ze_api_version_t v;
  ze_driver_properties_t drp = {.stype = ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES};
  ze_driver_ipc_properties_t ipc = {
      .stype = ZE_STRUCTURE_TYPE_DRIVER_IPC_PROPERTIES};
  ze_device_properties_t p[3];
  uint32_t nmem = 0;
  ze_device_memory_properties_t mp = {
      .stype = ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES};
  ze_device_compute_properties_t cp = {
      .stype = ZE_STRUCTURE_TYPE_DEVICE_COMPUTE_PROPERTIES};
  ze_device_module_properties_t mod = {
      .stype = ZE_STRUCTURE_TYPE_DEVICE_MODULE_PROPERTIES};

  setenv("QL_ZE_TEST_DEVICES", "3", 1);
  setenv("QL_ZE_TEST_MEM", "123456789", 1);
  zt_open(&t);
  ck_assert_uint_eq(t.ndev, 3);
  ZE_OK(zeDriverGetApiVersion(t.drv, &v));
  ck_assert_uint_ge(ZE_MAJOR_VERSION(v), 1);
  ZE_OK(zeDriverGetProperties(t.drv, &drp));
  ZE_OK(zeDriverGetIpcProperties(t.drv, &ipc));
  ck_assert(ipc.flags & ZE_IPC_PROPERTY_FLAG_MEMORY);
  for (uint32_t d = 0; d < 3; d++) {
    p[d] = (ze_device_properties_t){.stype =
                                         ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
    ZE_OK(zeDeviceGetProperties(t.dev[d], &p[d]));
    ck_assert_int_eq(p[d].type, ZE_DEVICE_TYPE_GPU);
    ck_assert_uint_eq(p[d].vendorId, 0x8086);
    ck_assert(strlen(p[d].name) > 0);
    for (uint32_t e = 0; e < d; e++)
      ck_assert_msg(memcmp(p[d].uuid.id, p[e].uuid.id, ZE_MAX_DEVICE_UUID_SIZE),
                    "devices %u and %u share a UUID", d, e);
  }
  ZE_OK(zeDeviceGetMemoryProperties(t.dev[1], &nmem, NULL));
  ck_assert_uint_eq(nmem, 1);
  ZE_OK(zeDeviceGetMemoryProperties(t.dev[1], &nmem, &mp));
  ck_assert_uint_eq(mp.totalSize, 123456789);
  /* no sub-groups of QL_ZE_LG: a host must take the "lm" kernels */
  ZE_OK(zeDeviceGetComputeProperties(t.dev[0], &cp));
  ck_assert_uint_ge(cp.maxTotalGroupSize, QL_ZE_WG);
  ck_assert_uint_le(cp.numSubGroupSizes, ZE_SUBGROUPSIZE_COUNT);
  for (uint32_t i = 0; i < cp.numSubGroupSizes; i++)
    ck_assert_uint_ne(cp.subGroupSizes[i], QL_ZE_LG);
  ZE_OK(zeDeviceGetModuleProperties(t.dev[0], &mod));
  ck_assert_uint_ge(mod.spirvVersionSupported, ZE_MAKE_VERSION(1, 2));
  zt_close(&t);
}
END_TEST

/* The validation layer is loaded and checks parameters. */
START_TEST(test_layer) {
  zt t;
  zel_component_version_t vs[16];
  size_t n = 0;
  int found = 0;
  ze_event_pool_desc_t pd = {.stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC,
                             .flags = 0x80000000u,
                             .count = 1};
  ze_event_pool_handle_t pool = NULL;
  void *p = NULL;

  zt_open(&t);
  ZE_OK(zelLoaderGetVersions(&n, NULL));
  ck_assert_uint_le(n, 16);
  ZE_OK(zelLoaderGetVersions(&n, vs));
  for (size_t i = 0; i < n; i++)
    found |= strcmp(vs[i].component_name, "validation layer") == 0;
  ck_assert_msg(found, "the loader did not load its validation layer");
  /* the driver would answer these flags with UNSUPPORTED_FEATURE */
  ZE_IS(ZE_RESULT_ERROR_INVALID_ENUMERATION,
        zeEventPoolCreate(t.ctx, &pd, 1, &t.dev[0], &pool));
  ZE_IS(ZE_RESULT_ERROR_INVALID_NULL_POINTER,
        zeMemAllocDevice(t.ctx, NULL, 64, 0, t.dev[0], &p));
  zt_close(&t);
}
END_TEST

/* ---- memory ---- */

START_TEST(test_memory) {
  zt t;
  enum { N = 10000 };
  unsigned char *src = malloc(N), *back = malloc(N);
  unsigned char *d, *h;
  uint32_t pat = 0x11223344u;
  ze_memory_allocation_properties_t ap = {
      .stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
  ze_device_handle_t owner = NULL;
  void *base = NULL;
  size_t size = 0;

  zt_open(&t);
  for (int i = 0; i < N; i++)
    src[i] = (unsigned char)(i * 7 + 3);
  d = dev_alloc(&t, N);
  h = host_alloc(&t, N);
  /* system memory -> device -> host memory -> system memory */
  copy(&t, d, src, N);
  copy(&t, h, d, N);
  ck_assert_mem_eq(h, src, N);
  /* a fill of a 4-byte pattern at an offset */
  ZE_OK(zeEventHostReset(t.ev[0]));
  ZE_OK(zeCommandListAppendMemoryFill(t.list, d + 100, &pat, sizeof pat, 400,
                                      t.ev[0], 0, NULL));
  ZE_OK(zeEventHostSynchronize(t.ev[0], LONG_WAIT));
  copy(&t, back, d, N);
  ck_assert_mem_eq(back, src, 100);
  for (int i = 0; i < 100; i++)
    ck_assert_mem_eq(back + 100 + 4 * i, &pat, 4);
  ck_assert_mem_eq(back + 500, src + 500, N - 500);
  /* what the driver knows about a pointer inside an allocation */
  ZE_OK(zeMemGetAllocProperties(t.ctx, d + 123, &ap, &owner));
  ck_assert_int_eq(ap.type, ZE_MEMORY_TYPE_DEVICE);
  ck_assert_ptr_eq(owner, t.dev[0]);
  ZE_OK(zeMemGetAllocProperties(t.ctx, h, &ap, NULL));
  ck_assert_int_eq(ap.type, ZE_MEMORY_TYPE_HOST);
  ZE_OK(zeMemGetAllocProperties(t.ctx, src, &ap, NULL));
  ck_assert_int_eq(ap.type, ZE_MEMORY_TYPE_UNKNOWN);
  ZE_OK(zeMemGetAddressRange(t.ctx, d + 4321, &base, &size));
  ck_assert_ptr_eq(base, d);
  ck_assert_uint_eq(size, N);
  /* a copy past the end of an allocation is refused */
  ZE_IS(ZE_RESULT_ERROR_INVALID_SIZE,
        zeCommandListAppendMemoryCopy(t.list, d + 1, src, N, NULL, 0, NULL));
  ZE_IS(ZE_RESULT_ERROR_INVALID_SIZE,
        zeCommandListAppendMemoryFill(t.list, d + 4, &pat, sizeof pat, N, NULL,
                                      0, NULL));
  /* only device memory has IPC handles */
  {
    ze_ipc_mem_handle_t ih;
    ZE_IS(ZE_RESULT_ERROR_INVALID_ARGUMENT, zeMemGetIpcHandle(t.ctx, h, &ih));
  }
  ZE_OK(zeMemFree(t.ctx, d));
  ZE_OK(zeMemFree(t.ctx, h));
  zt_close(&t);
  free(src);
  free(back);
}
END_TEST

/* QL_ZE_TEST_MEM is the device's budget. */
START_TEST(test_budget) {
  zt t;
  ze_device_mem_alloc_desc_t md = {.stype =
                                       ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
  void *a, *b = NULL;

  setenv("QL_ZE_TEST_MEM", "1048576", 1);
  zt_open(&t);
  a = dev_alloc(&t, 600000);
  ZE_IS(ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY,
        zeMemAllocDevice(t.ctx, &md, 600000, 0, t.dev[0], &b));
  /* host memory is not device memory */
  ZE_OK(zeMemFree(t.ctx, host_alloc(&t, 600000)));
  ZE_OK(zeMemFree(t.ctx, a));
  b = dev_alloc(&t, 1048576);
  ZE_OK(zeMemFree(t.ctx, b));
  zt_close(&t);
}
END_TEST

/* ---- modules ---- */

START_TEST(test_modules) {
  static const char *const lm_kernels[][5] = {
      {"quantize_rows", "ql_ze_quantize_rows", "ql_ze_check_finite", NULL},
      {"linear_wo", "ql_ze_wo_q4g", "ql_ze_wo_q8c", "ql_ze_wo_q8b",
       "ql_ze_wo_f8r"},
      {"linear_aq", "ql_ze_aq_q8c", "ql_ze_aq_q4g", NULL}};
  zt t;
  ze_module_handle_t mod = NULL;
  ze_module_build_log_handle_t log = NULL;
  ze_kernel_desc_t kd = {.stype = ZE_STRUCTURE_TYPE_KERNEL_DESC,
                         .pKernelName = "no_such_kernel"};
  ze_kernel_handle_t k = NULL;
  unsigned char junk[64] = {0x03, 0x02, 0x23, 0x07};
  ql__ze_module fake = {"junk", "lm", junk, sizeof junk};
  size_t n = 0;
  char text[4096];

  zt_open(&t);
  for (size_t i = 0; i < 3; i++) {
    const ql__ze_module *m = find_module(lm_kernels[i][0], "lm");
    ZE_OK(module_create(&t, m, BUILD_FLAGS, &mod, &log));
    ZE_OK(zeModuleBuildLogDestroy(log));
    for (size_t j = 1; j < 5 && lm_kernels[i][j] != NULL; j++)
      ZE_OK(zeKernelDestroy(kernel(mod, lm_kernels[i][j])));
    ZE_IS(ZE_RESULT_ERROR_INVALID_KERNEL_NAME, zeKernelCreate(mod, &kd, &k));
    ZE_OK(zeModuleDestroy(mod));
    /* the sub-group variant needs sub-groups of 16: a build failure with a
     * log that says why */
    ZE_IS(ZE_RESULT_ERROR_MODULE_BUILD_FAILURE,
          module_create(&t, find_module(lm_kernels[i][0], "sg"), BUILD_FLAGS,
                        &mod, &log));
    ck_assert_ptr_nonnull(log);
    n = 0;
    ZE_OK(zeModuleBuildLogGetString(log, &n, NULL));
    ck_assert_uint_gt(n, 1);
    ck_assert_uint_le(n, sizeof text);
    ZE_OK(zeModuleBuildLogGetString(log, &n, text));
    ck_assert_ptr_nonnull(strstr(text, "sub-group"));
    ZE_OK(zeModuleBuildLogDestroy(log));
  }
  /* SPIR-V that is not one of the embedded modules */
  ZE_IS(ZE_RESULT_ERROR_INVALID_NATIVE_BINARY,
        module_create(&t, &fake, NULL, &mod, NULL));
  /* a build flag neither OpenCL's nor Level Zero's */
  ZE_IS(ZE_RESULT_ERROR_MODULE_BUILD_FAILURE,
        module_create(&t, find_module("linear_aq", "lm"), "-bogus", &mod,
                      NULL));
  zt_close(&t);
}
END_TEST

/* ---- kernels against the reference ---- */

/* ql_ze_quantize_rows (i8 with group sums) gives the reference's bytes. */
START_TEST(test_quantize_rows) {
  enum { M = 5, K = 300, GS = 64, G = (K + GS - 1) / GS };
  zt t;
  float x[M * K], sx[M], rsx[M];
  int8_t xq[M * K], rxq[M * K];
  int32_t gsum[M * G], rgsum[M * G];
  int64_t status[M];
  ze_module_handle_t mod;
  ze_kernel_handle_t k;
  char *dx, *dxq, *dsx, *dgs, *dst;
  kargs a;

  make_x(11, x, M * K);
  x[3] = 0.0f;
  ck_assert_int_eq(ql_quantize_rows_i8(x, M, K, GS, rxq, rsx, rgsum), 0);
  zt_open(&t);
  ZE_OK(module_create(&t, find_module("quantize_rows", "lm"), BUILD_FLAGS,
                      &mod, NULL));
  k = kernel(mod, "ql_ze_quantize_rows");
  /* one allocation, the arrays at offsets in it, as a host packs them */
  dx = dev_alloc(&t, 64 * 1024);
  dxq = dx + sizeof x + 8;
  dsx = dxq + sizeof xq + 40;
  dgs = dsx + sizeof sx + 12;
  dst = dgs + sizeof gsum + 16;
  copy(&t, dx, x, sizeof x);
  a = (kargs){k, 0};
  arg_i(&a, QL_ZE_QROWS_I8);
  arg_i(&a, QL_ZE_DT_F32);
  arg_i(&a, QL_ZE_DT_F32);
  arg_l(&a, K);
  arg_l(&a, GS);
  arg_l(&a, G);
  arg_p(&a, dx);
  arg_p(&a, dxq);
  arg_p(&a, dsx);
  arg_p(&a, dgs);
  arg_p(&a, dst);
  launch(&t, k, M, 1);
  copy(&t, xq, dxq, sizeof xq);
  copy(&t, sx, dsx, sizeof sx);
  copy(&t, gsum, dgs, sizeof gsum);
  copy(&t, status, dst, sizeof status);
  for (int r = 0; r < M; r++)
    ck_assert_int_eq(status[r], 0);
  ck_assert_mem_eq(xq, rxq, sizeof xq);
  ck_assert_mem_eq(sx, rsx, sizeof sx);
  ck_assert_mem_eq(gsum, rgsum, sizeof gsum);
  /* the nullable group sums: NULL is a valid pointer argument */
  a = (kargs){k, 9};
  arg_p(&a, NULL);
  launch(&t, k, M, 1);
  ZE_OK(zeKernelDestroy(k));
  ZE_OK(zeModuleDestroy(mod));
  ZE_OK(zeMemFree(t.ctx, dx));
  zt_close(&t);
}
END_TEST

/* w in the layout "ze-1" (ql_ze.h) in one device allocation: codes, scale
 * and zero [n, groups], bias. */
typedef struct packed {
  char *mem, *q, *scale, *zero, *bias;
  int64_t ldq;
} packed;

static void pack(zt *t, const ql_qweight *w, packed *p) {
  size_t rb = (size_t)(w->format == QL_FORMAT_Q4G ? (w->k + 1) / 2 : w->k);
  size_t ldq = (rb + QL_ZE_ROW_ALIGN - 1) / QL_ZE_ROW_ALIGN * QL_ZE_ROW_ALIGN;
  size_t n = (size_t)w->n, gg = (size_t)w->groups;
  size_t ssz = ql_dtype_size(w->scale_dtype), qb = n * ldq, sb = n * gg * ssz;
  size_t total = qb + 2 * sb + n * sizeof(float) + 256;
  unsigned char *h = calloc(1, total);
  size_t off_s = (qb + 63) / 64 * 64, off_z = off_s + (sb + 63) / 64 * 64,
         off_b = off_z + (sb + 63) / 64 * 64;

  for (size_t r = 0; r < n; r++)
    memcpy(h + r * ldq, w->qdata + r * rb, rb);
  for (size_t r = 0; r < n; r++)
    for (size_t j = 0; j < gg; j++) {
      memcpy(h + off_s + (r * gg + j) * ssz,
             (const unsigned char *)w->scale + (j * n + r) * ssz, ssz);
      if (w->zero != NULL)
        memcpy(h + off_z + (r * gg + j) * ssz,
               (const unsigned char *)w->zero + (j * n + r) * ssz, ssz);
    }
  if (w->bias != NULL)
    memcpy(h + off_b, w->bias, n * sizeof(float));
  p->mem = dev_alloc(t, total);
  copy(t, p->mem, h, total);
  p->q = p->mem;
  p->scale = p->mem + off_s;
  p->zero = w->zero != NULL ? p->mem + off_z : NULL;
  p->bias = w->bias != NULL ? p->mem + off_b : NULL;
  p->ldq = (int64_t)ldq;
  free(h);
}

/* y [m, n] f32 of ql_ze_wo_<fmt> on w and x [m, k] f32. */
static void run_wo(zt *t, ze_module_handle_t mod, const char *name,
                   const ql_qweight *w, const float *x, int64_t m, float *y) {
  ze_kernel_handle_t k = kernel(mod, name);
  size_t xb = (size_t)(m * w->k) * sizeof(float),
         yb = (size_t)(m * w->n) * sizeof(float);
  char *dx = dev_alloc(t, xb + yb + 64), *dy = dx + xb + 32;
  packed p;
  kargs a = {k, 0};

  pack(t, w, &p);
  copy(t, dx, x, xb);
  arg_l(&a, w->n);
  arg_l(&a, w->k);
  arg_l(&a, (int64_t)w->group_size);
  arg_l(&a, w->groups);
  arg_i(&a, QL_ZE_DT_F32);
  arg_i(&a, (int32_t)w->scale_dtype);
  arg_p(&a, p.q);
  arg_l(&a, p.ldq);
  arg_p(&a, p.scale);
  arg_p(&a, p.zero);
  arg_p(&a, p.bias);
  arg_p(&a, dx);
  arg_l(&a, m);
  arg_p(&a, dy);
  launch(t, k, (uint32_t)((w->n + QL_ZE_NG - 1) / QL_ZE_NG),
         (uint32_t)((m + QL_ZE_MT - 1) / QL_ZE_MT));
  copy(t, y, dy, yb);
  ZE_OK(zeKernelDestroy(k));
  ZE_OK(zeMemFree(t->ctx, p.mem));
  ZE_OK(zeMemFree(t->ctx, dx));
}

static ql_qweight *weight(ql_format f, uint32_t gs, int64_t n, int64_t k) {
  float *w = malloc((size_t)(n * k) * sizeof(float)), b[64];
  ql_quant_params qp = {f, gs, 0, QL_DTYPE_F32};
  ql_qweight *q = NULL;
  ck_assert_int_le(n, 64);
  make_x(99 + (uint64_t)f, w, (size_t)(n * k));
  make_x(5, b, (size_t)n);
  ck_assert_int_eq(ql_qweight_quantize(&qp, n, k, QL_DTYPE_F32, w, b, &q), 0);
  free(w);
  return q;
}

/* ql_ze_wo_q8c within the f32 summation bound of the reference, and
 * ql_ze_wo_q4g with the reference's bytes (its evaluation order, test_ze.c). */
START_TEST(test_linear_wo) {
  enum { M = 6, N = 37, K = 300 };
  zt t;
  ze_module_handle_t mod;
  ql_qweight *q8 = weight(QL_FORMAT_Q8C, 0, N, K),
             *q4 = weight(QL_FORMAT_Q4G, 64, N, K);
  float x[M * K], y[M * N], ref[M * N], *wd = malloc(sizeof(float) * N * K);

  make_x(3, x, M * K);
  zt_open(&t);
  ZE_OK(module_create(&t, find_module("linear_wo", "lm"), BUILD_FLAGS, &mod,
                      NULL));
  run_wo(&t, mod, "ql_ze_wo_q8c", q8, x, M, y);
  ck_assert_int_eq(ql_linear_wo_ref(q8, QL_DTYPE_F32, x, M, ref), 0);
  ck_assert_int_eq(ql_qweight_dequantize(q8, wd), 0);
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double mag = fabs(q8->bias[j]);
      for (int kk = 0; kk < K; kk++)
        mag += fabs((double)x[i * K + kk] * wd[j * K + kk]);
      ck_assert_msg(fabs((double)y[i * N + j] - ref[i * N + j]) <=
                        2.0 * K * 0x1p-24 * mag,
                    "wo_q8c y[%d][%d] = %g, reference %g", i, j,
                    (double)y[i * N + j], (double)ref[i * N + j]);
    }
  run_wo(&t, mod, "ql_ze_wo_q4g", q4, x, M, y);
  ck_assert_int_eq(ql_linear_wo_ref(q4, QL_DTYPE_F32, x, M, ref), 0);
  ck_assert_mem_eq(y, ref, sizeof y);
  ZE_OK(zeModuleDestroy(mod));
  zt_close(&t);
  ql_qweight_free(q8);
  ql_qweight_free(q4);
  free(wd);
}
END_TEST

/* Wrong launches are refused when they are made, not when they run. */
START_TEST(test_launch_checks) {
  zt t;
  ze_module_handle_t mod;
  ze_kernel_handle_t k;
  ze_group_count_t gc = {1, 1, 1};
  int64_t v = 1;
  char stack_buf[16];
  void *p = stack_buf;

  zt_open(&t);
  ZE_OK(module_create(&t, find_module("quantize_rows", "lm"), BUILD_FLAGS,
                      &mod, NULL));
  k = kernel(mod, "ql_ze_check_finite");
  /* the kernels are written for work-groups of 64 */
  ZE_IS(ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION,
        zeKernelSetGroupSize(k, 32, 1, 1));
  ZE_OK(zeKernelSetGroupSize(k, QL_ZE_QWG, 1, 1));
  /* arguments not all set */
  ZE_IS(ZE_RESULT_ERROR_INVALID_ARGUMENT,
        zeCommandListAppendLaunchKernel(t.list, k, &gc, NULL, 0, NULL));
  /* a pointer argument outside every allocation, an index past the end,
   * a long where an int is */
  ZE_IS(ZE_RESULT_ERROR_INVALID_ARGUMENT,
        zeKernelSetArgumentValue(k, 2, sizeof p, &p));
  ZE_IS(ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_INDEX,
        zeKernelSetArgumentValue(k, 4, sizeof v, &v));
  ZE_IS(ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_SIZE,
        zeKernelSetArgumentValue(k, 0, sizeof v, &v));
  ZE_OK(zeKernelDestroy(k));
  ZE_OK(zeModuleDestroy(mod));
  zt_close(&t);
}
END_TEST

/* ---- events ---- */

START_TEST(test_events) {
  zt t;
  uint32_t src = 0xabcdef01u, *d, back = 0;

  zt_open(&t);
  d = dev_alloc(&t, 64);
  ZE_IS(ZE_RESULT_NOT_READY, zeEventQueryStatus(t.ev[0]));
  ZE_IS(ZE_RESULT_NOT_READY, zeEventHostSynchronize(t.ev[0], SHORT_WAIT));
  /* a copy waiting for event 0, which the host signals later */
  ZE_OK(zeCommandListAppendMemoryCopy(t.list, d, &src, sizeof src, t.ev[1], 1,
                                      &t.ev[0]));
  ZE_OK(zeCommandListAppendBarrier(t.list, t.ev[2], 1, &t.ev[1]));
  ZE_IS(ZE_RESULT_NOT_READY, zeEventHostSynchronize(t.ev[2], SHORT_WAIT));
  ZE_IS(ZE_RESULT_NOT_READY, zeEventQueryStatus(t.ev[1]));
  ZE_OK(zeEventHostSignal(t.ev[0]));
  ZE_OK(zeEventHostSynchronize(t.ev[2], LONG_WAIT));
  ZE_OK(zeEventQueryStatus(t.ev[1]));
  copy(&t, &back, d, sizeof back);
  ck_assert_uint_eq(back, src);
  /* reset */
  ZE_OK(zeEventHostReset(t.ev[2]));
  ZE_IS(ZE_RESULT_NOT_READY, zeEventQueryStatus(t.ev[2]));
  ZE_OK(zeMemFree(t.ctx, d));
  zt_close(&t);
}
END_TEST

/* Two threads, each with its own immediate list, launching the same
 * module's kernels at once. */
typedef struct worker {
  zt *t;
  ze_module_handle_t mod;
  int seed;
  int ok;
} worker;

static void *worker_main(void *arg) {
  worker *w = arg;
  enum { M = 3, K = 200 };
  zt *t = w->t;
  ze_command_queue_desc_t qd = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                                .mode = ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS};
  ze_command_list_handle_t list = NULL;
  ze_kernel_desc_t kd = {.stype = ZE_STRUCTURE_TYPE_KERNEL_DESC,
                         .pKernelName = "ql_ze_quantize_rows"};
  ze_kernel_handle_t k = NULL;
  ze_device_mem_alloc_desc_t md = {.stype =
                                       ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
  ze_group_count_t gc = {M, 1, 1};
  float x[M * K], sx[M], rsx[M];
  int8_t xq[M * K], rxq[M * K];
  char *d = NULL;

  make_x((uint64_t)w->seed, x, M * K);
  ql_quantize_rows_i8(x, M, K, K, rxq, rsx, NULL);
  w->ok = zeCommandListCreateImmediate(t->ctx, t->dev[0], &qd, &list) == 0 &&
          zeKernelCreate(w->mod, &kd, &k) == 0 &&
          zeMemAllocDevice(t->ctx, &md, 16384, 0, t->dev[0], (void **)&d) == 0;
  for (int rep = 0; rep < 4 && w->ok; rep++) {
    int32_t ints[3] = {QL_ZE_QROWS_I8, QL_ZE_DT_F32, QL_ZE_DT_F32};
    int64_t longs[3] = {K, K, 1};
    void *ptrs[5] = {d, d + 4096, d + 8192, NULL, d + 12288};
    uint32_t i = 0;
    for (int j = 0; j < 3; j++, i++)
      w->ok &= zeKernelSetArgumentValue(k, i, 4, &ints[j]) == 0;
    for (int j = 0; j < 3; j++, i++)
      w->ok &= zeKernelSetArgumentValue(k, i, 8, &longs[j]) == 0;
    for (int j = 0; j < 5; j++, i++)
      w->ok &= zeKernelSetArgumentValue(k, i, sizeof(void *), &ptrs[j]) == 0;
    /* synchronous mode: each append returns when its command has run */
    w->ok &= zeKernelSetGroupSize(k, QL_ZE_QWG, 1, 1) == 0 &&
             zeCommandListAppendMemoryCopy(list, d, x, sizeof x, NULL, 0,
                                           NULL) == 0 &&
             zeCommandListAppendLaunchKernel(list, k, &gc, NULL, 0, NULL) ==
                 0 &&
             zeCommandListAppendMemoryCopy(list, xq, d + 4096, sizeof xq, NULL,
                                           0, NULL) == 0 &&
             zeCommandListAppendMemoryCopy(list, sx, d + 8192, sizeof sx, NULL,
                                           0, NULL) == 0;
    w->ok &= memcmp(xq, rxq, sizeof xq) == 0 && memcmp(sx, rsx, sizeof sx) == 0;
  }
  if (d != NULL)
    w->ok &= zeMemFree(t->ctx, d) == 0;
  if (k != NULL)
    w->ok &= zeKernelDestroy(k) == 0;
  if (list != NULL)
    w->ok &= zeCommandListDestroy(list) == 0;
  return NULL;
}

START_TEST(test_threads) {
  zt t;
  ze_module_handle_t mod;
  pthread_t th[2];
  worker w[2];

  zt_open(&t);
  ZE_OK(module_create(&t, find_module("quantize_rows", "lm"), BUILD_FLAGS,
                      &mod, NULL));
  for (int i = 0; i < 2; i++) {
    w[i] = (worker){&t, mod, 40 + i, 0};
    ck_assert_int_eq(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
  }
  for (int i = 0; i < 2; i++) {
    pthread_join(th[i], NULL);
    ck_assert_msg(w[i].ok, "thread %d failed", i);
  }
  ZE_OK(zeModuleDestroy(mod));
  zt_close(&t);
}
END_TEST

/* ---- injected faults ---- */

/* hang after one command: the next never runs, waits time out, and the
 * list can still be destroyed. */
START_TEST(test_fault_hang) {
  zt t;
  char a[16] = "abcdefghijklmno", b[16] = {0}, *d;

  setenv("QL_ZE_TEST_FAULT", "0:1:hang", 1);
  zt_open(&t);
  d = dev_alloc(&t, 64);
  ZE_OK(zeCommandListAppendMemoryCopy(t.list, d, a, 16, t.ev[0], 0, NULL));
  ZE_OK(zeEventHostSynchronize(t.ev[0], LONG_WAIT));
  ZE_OK(zeCommandListAppendMemoryCopy(t.list, b, d, 16, t.ev[1], 0, NULL));
  ZE_IS(ZE_RESULT_NOT_READY, zeEventHostSynchronize(t.ev[1], SHORT_WAIT));
  ZE_IS(ZE_RESULT_NOT_READY, zeEventQueryStatus(t.ev[1]));
  ck_assert_int_eq(b[0], 0);
  {
    /* a kernel and events destroyed while a hung command still names
     * them (what a host does when it gives up on a device); then their
     * handles are refused */
    ze_module_handle_t mod;
    ze_kernel_handle_t k;
    ze_event_pool_handle_t pool;
    ze_event_handle_t ev[2];
    ze_event_pool_desc_t pd = {.stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC,
                               .flags = ZE_EVENT_POOL_FLAG_HOST_VISIBLE,
                               .count = 2};
    ze_group_count_t gc = {1, 1, 1};
    kargs a;

    ZE_OK(zeEventPoolCreate(t.ctx, &pd, 1, &t.dev[0], &pool));
    for (uint32_t i = 0; i < 2; i++) {
      ze_event_desc_t ed = {.stype = ZE_STRUCTURE_TYPE_EVENT_DESC, .index = i};
      ZE_OK(zeEventCreate(pool, &ed, &ev[i]));
    }
    ZE_OK(module_create(&t, find_module("quantize_rows", "lm"), BUILD_FLAGS,
                        &mod, NULL));
    k = kernel(mod, "ql_ze_check_finite");
    a = (kargs){k, 0};
    arg_i(&a, QL_ZE_DT_F32);
    arg_l(&a, 4);
    arg_p(&a, d);
    arg_p(&a, d + 32);
    ZE_OK(zeKernelSetGroupSize(k, QL_ZE_QWG, 1, 1));
    ZE_OK(zeCommandListAppendLaunchKernel(t.list, k, &gc, ev[1], 1, &ev[0]));
    ZE_OK(zeKernelDestroy(k));
    ZE_OK(zeModuleDestroy(mod));
    ZE_OK(zeEventDestroy(ev[0]));
    ZE_OK(zeEventDestroy(ev[1]));
    ZE_OK(zeEventPoolDestroy(pool));
    ck_assert_int_ne(zeEventQueryStatus(ev[1]), ZE_RESULT_SUCCESS);
    ck_assert_int_ne(zeKernelSetGroupSize(k, QL_ZE_QWG, 1, 1),
                     ZE_RESULT_SUCCESS);
  }
  ZE_OK(zeMemFree(t.ctx, d));
  zt_close(&t);
}
END_TEST

/* lost after two commands on device 1 of 2: device 1's later calls say
 * so, device 0 works on. */
START_TEST(test_fault_lost) {
  zt t;
  ze_command_queue_desc_t qd = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                                .mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS};
  ze_device_mem_alloc_desc_t md = {.stype =
                                       ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
  ze_command_list_handle_t l1, l1b = NULL;
  char a[16] = "abcdefghijklmno", b[16] = {0}, *d, *d1;
  void *p = NULL;

  setenv("QL_ZE_TEST_DEVICES", "2", 1);
  setenv("QL_ZE_TEST_FAULT", "1:2:lost", 1);
  zt_open(&t);
  ck_assert_uint_eq(t.ndev, 2);
  ZE_OK(zeCommandListCreateImmediate(t.ctx, t.dev[1], &qd, &l1));
  ZE_OK(zeMemAllocDevice(t.ctx, &md, 64, 0, t.dev[1], (void **)&d1));
  ZE_OK(zeCommandListAppendMemoryCopy(l1, d1, a, 16, t.ev[0], 0, NULL));
  ZE_OK(zeCommandListAppendMemoryCopy(l1, b, d1, 16, t.ev[1], 0, NULL));
  ZE_OK(zeEventHostSynchronize(t.ev[1], LONG_WAIT));
  ck_assert_mem_eq(a, b, 16);
  ZE_IS(ZE_RESULT_ERROR_DEVICE_LOST,
        zeCommandListAppendMemoryCopy(l1, d1, a, 16, t.ev[2], 0, NULL));
  ZE_IS(ZE_RESULT_ERROR_DEVICE_LOST,
        zeMemAllocDevice(t.ctx, &md, 64, 0, t.dev[1], &p));
  ZE_IS(ZE_RESULT_ERROR_DEVICE_LOST,
        zeCommandListCreateImmediate(t.ctx, t.dev[1], &qd, &l1b));
  /* an event last given to the lost device */
  ZE_OK(zeEventHostReset(t.ev[1]));
  ZE_IS(ZE_RESULT_ERROR_DEVICE_LOST,
        zeEventHostSynchronize(t.ev[1], SHORT_WAIT));
  /* release still works */
  ZE_OK(zeMemFree(t.ctx, d1));
  ZE_OK(zeCommandListDestroy(l1));
  /* device 0 is fine */
  d = dev_alloc(&t, 64);
  memset(b, 0, sizeof b);
  copy(&t, d, a, 16);
  copy(&t, b, d, 16);
  ck_assert_mem_eq(a, b, 16);
  ZE_OK(zeMemFree(t.ctx, d));
  zt_close(&t);
}
END_TEST

/* ---- IPC ---- */

static void send_fd(int sock, int fd, const void *data, size_t n) {
  char cbuf[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {(void *)data, n};
  struct msghdr msg = {.msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = cbuf,
                       .msg_controllen = sizeof cbuf};
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof fd);
  if (sendmsg(sock, &msg, 0) != (ssize_t)n)
    _exit(3);
}

static int recv_fd(int sock, void *data, size_t n) {
  char cbuf[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {data, n};
  struct msghdr msg = {.msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = cbuf,
                       .msg_controllen = sizeof cbuf};
  struct cmsghdr *c;
  int fd = -1;
  if (recvmsg(sock, &msg, 0) != (ssize_t)n)
    return -1;
  c = CMSG_FIRSTHDR(&msg);
  if (c != NULL && c->cmsg_type == SCM_RIGHTS)
    memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

/* A child process exports device memory; this one imports it with the
 * descriptor received over a socket, reads the child's bytes, writes its
 * own, which the child then sees; closes it. */
START_TEST(test_ipc) {
  enum { N = 5000 };
  int sv[2], fd, status;
  pid_t pid;
  ze_ipc_mem_handle_t h;
  char *p = NULL, want[N], got[N];
  uint64_t fdw;
  size_t size = 0;
  void *base = NULL;
  zt t;

  for (int i = 0; i < N; i++)
    want[i] = (char)(i * 13 + 1);
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    /* the exporter: before zeInit, as a fresh process */
    char *d, back[N], ack;
    int ok;
    close(sv[0]);
    zt_open(&t);
    d = dev_alloc(&t, N);
    copy(&t, d, want, N);
    ZE_OK(zeMemGetIpcHandle(t.ctx, d, &h));
    memcpy(&fdw, h.data, sizeof fdw);
    send_fd(sv[1], (int)fdw, &h, sizeof h);
    if (read(sv[1], &ack, 1) != 1)
      _exit(4);
    copy(&t, back, d, N);
    ok = back[0] == 'Q' && memcmp(back + 1, want + 1, N - 1) == 0;
    ZE_OK(zeMemFree(t.ctx, d));
    zt_close(&t);
    _exit(ok ? 0 : 5);
  }
  close(sv[1]);
  fd = recv_fd(sv[0], &h, sizeof h);
  ck_assert_int_ge(fd, 0);
  /* the descriptor's number in this process */
  fdw = (uint64_t)fd;
  memcpy(h.data, &fdw, sizeof fdw);
  zt_open(&t);
  ZE_OK(zeMemOpenIpcHandle(t.ctx, t.dev[0], h, 0, (void **)&p));
  ZE_OK(zeMemGetAddressRange(t.ctx, p + 10, &base, &size));
  ck_assert_ptr_eq(base, p);
  ck_assert_uint_eq(size, N);
  copy(&t, got, p, N);
  ck_assert_mem_eq(got, want, N);
  copy(&t, p, "Q", 1);
  /* A pool offset (bytes 8..15) is added to the pointer, unchecked, as
   * compute-runtime does; the import is closed by that pointer. */
  {
    ze_ipc_mem_handle_t ho = h;
    uint64_t off = 100;
    char *q = NULL;
    memcpy(ho.data + 8, &off, sizeof off);
    ZE_OK(zeMemOpenIpcHandle(t.ctx, t.dev[0], ho, 0, (void **)&q));
    ZE_OK(zeMemGetAddressRange(t.ctx, q, &base, &size));
    ck_assert_ptr_eq((char *)base + 100, q);
    ck_assert_uint_eq(size, N);
    ZE_OK(zeMemCloseIpcHandle(t.ctx, q));
    ZE_IS(ZE_RESULT_ERROR_INVALID_ARGUMENT,
          zeMemGetAddressRange(t.ctx, q, &base, &size));
    /* memory types other than device memory (byte 16) are refused */
    ho = h;
    ho.data[16] = 1;
    ZE_IS(ZE_RESULT_ERROR_INVALID_ARGUMENT,
          zeMemOpenIpcHandle(t.ctx, t.dev[0], ho, 0, (void **)&q));
  }
  ZE_OK(zeMemCloseIpcHandle(t.ctx, p));
  close(fd);
  ck_assert_int_eq(write(sv[0], "k", 1), 1);
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "the exporting process failed (status %d)", status);
  /* a handle that is not one */
  memset(&h, 0, sizeof h);
  ZE_IS(ZE_RESULT_ERROR_INVALID_ARGUMENT,
        zeMemOpenIpcHandle(t.ctx, t.dev[0], h, 0, (void **)&p));
  zt_close(&t);
  close(sv[0]);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("ze_driver");
  TCase *tc = tcase_create("driver");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_enumerate);
  tcase_add_test(tc, test_layer);
  tcase_add_test(tc, test_memory);
  tcase_add_test(tc, test_budget);
  tcase_add_test(tc, test_modules);
  tcase_add_test(tc, test_quantize_rows);
  tcase_add_test(tc, test_linear_wo);
  tcase_add_test(tc, test_launch_checks);
  tcase_add_test(tc, test_events);
  tcase_add_test(tc, test_threads);
  tcase_add_test(tc, test_fault_hang);
  tcase_add_test(tc, test_fault_lost);
  tcase_add_test(tc, test_ipc);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  const char *drv = getenv("QL_ZE_TEST_DRIVER");
  if (drv == NULL) {
    fprintf(stderr, "test_ze_driver: QL_ZE_TEST_DRIVER (the path of "
                    "libze_qltest.so) is not set; make check sets it\n");
    return EXIT_FAILURE;
  }
  /* the loader reads these at zeInit, in each test's process */
  setenv("ZE_ENABLE_ALT_DRIVERS", drv, 1);
  setenv("ZE_ENABLE_VALIDATION_LAYER", "1", 1);
  setenv("ZE_ENABLE_PARAMETER_VALIDATION", "1", 1);
  setenv("ZE_ENABLE_HANDLE_LIFETIME", "1", 1);
  unsetenv("QL_ZE_TEST_DEVICES");
  unsetenv("QL_ZE_TEST_MEM");
  unsetenv("QL_ZE_TEST_FAULT");
  return tu_run_suite(suite(), CK_NORMAL);
}
