/*
 * backend.c - the ze backend: Level Zero host code for the kernels of
 * kernels/ze/ (OpenCL C, embedded as SPIR-V: ze_spirv.h). Its registration
 * (the one place that lists its implementations), its devices, and the
 * host side of its ops: argument checks as strict as the reference's, the
 * "ze-1" layout (ql_ze.h) that repack builds in device memory, staging of
 * host tensors, launches, and what a failing device does to them.
 *
 * The ops run the .cl kernels of kernels/ze/ with the arguments and launch
 * geometry of ql_ze.h: NaN/Inf in x failing a linear call before y is
 * written (a check kernel first), quantize_rows failing as
 * the reference does, and a guard after every device output that is
 * checked when it is read back (a kernel that writes past an output fails
 * the call with QL_EINTERNAL and says so on stderr).
 *
 * Devices. Every root device of every Level Zero driver that can run the
 * kernels (SPIR-V 1.2, a correctly rounded f32 divide: quantize_rows is
 * bit-exact only with it), in driver order; names carry the device UUID,
 * aliases ("ze:0") this process's order. device_bind() makes a device the
 * calling thread's; the ops and repack act on it. Each device has, made at
 * its first use: an asynchronous immediate command list, one host-visible
 * event, the three modules in the variant it can run ("sg" when it has
 * sub-groups of 16, else "lm"), built with the flags of the SPIR-V build
 * that matter for the numbers, their kernels, and a scratch arena (device
 * memory for x, y and the intermediates, host memory for staging), grown
 * on demand. All of it is guarded by the device's mutex: the daemon runs
 * one worker per device, so the lock is only contended by repacks and
 * tests. One context per driver holds every allocation.
 *
 * Ordering. Commands of a Level Zero command list may overlap unless a
 * barrier separates them, so every dependent step is behind a barrier;
 * the host waits for a barrier that signals the device's event, with
 * zeEventHostSynchronize bounded by the kernel timeout.
 *
 * Failures, mapped at this boundary (DESIGN §7): out of memory is
 * QL_ENOMEM for the call; a refused argument is QL_EINTERNAL (a bug here,
 * the device stays); anything else (device lost, needs a reset, unknown),
 * a module that does not build, or a wait that outlives the kernel timeout
 * takes the device out of service for good: its ops return QL_EDEVICE from
 * then on and device_error() says why. A lost device cannot run anything
 * again and a hung kernel may never end, so neither is retried. A call
 * that fails with commands queued waits for them before it returns.
 *
 * IPC imports (DESIGN §7, registry.h ipc_open_fd): a client's device
 * allocation, named by its ze IPC handle and the dma-buf descriptor the
 * daemon received over the session socket, is opened with
 * zeMemOpenIpcHandle from that descriptor alone (ipc_open_fd says why)
 * and bounded by zeMemGetAddressRange; linear_dev runs the same pipeline
 * as the host ops with x copied from, and y to, that memory on the device
 * (y only after its guard checked out). No event crosses processes: the
 * client completes x before it sends a request.
 *
 * Without a Level Zero driver (zeInit or zeDriverGet find none) the
 * backend has no device and device_count() says why, once, for the log.
 */
#include <level_zero/ze_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ql_ze.h"
#include "registry.h"
#include "ze_spirv.h"

/* ql_ze.h repeats these numbers for the OpenCL C side. */
_Static_assert(QL_ZE_DT_F32 == QL_DTYPE_F32 && QL_ZE_DT_F16 == QL_DTYPE_F16 &&
                   QL_ZE_DT_BF16 == QL_DTYPE_BF16,
               "ql_ze.h dtypes");
_Static_assert(QL_ZE_FMT_Q4G == QL_FORMAT_Q4G &&
                   QL_ZE_FMT_Q8C == QL_FORMAT_Q8C &&
                   QL_ZE_FMT_Q8B == QL_FORMAT_Q8B &&
                   QL_ZE_FMT_F8R == QL_FORMAT_F8R,
               "ql_ze.h formats");
_Static_assert(QL_ZE_QROWS_I8 == QL_QROWS_I8 &&
                   QL_ZE_QROWS_E4M3 == QL_QROWS_E4M3,
               "ql_ze.h quantize_rows kinds");
_Static_assert(QL_ZE_WG == QL_ZE_QWG,
               "one work-group size for every kernel (LocalSize 64 1 1)");

#define MAX_DEVICES 16
#define MAX_DRIVERS 8
#define DEFAULT_TIMEOUT_MS 10000u

/* Bytes after every device output, filled with GUARD_BYTE and checked on
 * read-back. */
#define GUARD 64
#define GUARD_BYTE 0xA5

/* Pieces of an arena are this aligned (more than any kernel argument
 * needs, and a cache line on every device). */
#define PIECE_ALIGN 256

/* The weight image goes to the device through staging in chunks of at
 * most this many bytes, so a large weight needs no host allocation of its
 * size beyond the image itself. */
#define UPLOAD_CHUNK ((size_t)8 << 20)

/* The build flags of kernels/ze/build_spirv.sh and the test driver that
 * matter for the numbers: OpenCL C 1.2, and a correctly rounded f32
 * divide (quantize_rows is bit-exact only with it; ze_spirv.h). */
static const char build_flags[] =
    "-cl-std=CL1.2 -cl-fp32-correctly-rounded-divide-sqrt";

/* ---- the kernels ---- */

enum {
  K_QROWS,
  K_FINITE,
  K_WO_Q4G,
  K_WO_Q8C,
  K_WO_Q8B,
  K_WO_F8R,
  K_AQ_Q8C,
  K_AQ_Q4G,
  K_COUNT
};

static const struct {
  const char *name;
  int module; /* index into module_names[] */
} kernels[K_COUNT] = {
    {"ql_ze_quantize_rows", 0}, {"ql_ze_check_finite", 0},
    {"ql_ze_wo_q4g", 1},        {"ql_ze_wo_q8c", 1},
    {"ql_ze_wo_q8b", 1},        {"ql_ze_wo_f8r", 1},
    {"ql_ze_aq_q8c", 2},        {"ql_ze_aq_q4g", 2},
};

/* One module per .cl file, as build_spirv.sh makes them. */
static const char *const module_names[] = {"quantize_rows", "linear_wo",
                                           "linear_aq"};
#define NMODULES (sizeof module_names / sizeof module_names[0])

/* ---- devices ---- */

/* Memory grown on demand and handed out in PIECE_ALIGN pieces for the
 * duration of one call. */
typedef struct arena {
  unsigned char *base;
  size_t cap;
  size_t used;
} arena;

typedef struct zdev {
  /* Found by init_once(), read-only afterwards. */
  ze_driver_handle_t drv;
  ze_context_handle_t ctx; /* the driver's */
  ze_device_handle_t dev;
  uint8_t uuid[ZE_MAX_DEVICE_UUID_SIZE];
  char model[64];
  size_t memory;        /* device-local bytes */
  int sg;               /* runs the "sg" modules */
  uint32_t max_groups[2]; /* group counts of dimensions 0 and 1 */

  pthread_mutex_t mu; /* everything below */
  int ready;          /* the objects below exist */
  ze_command_list_handle_t list;
  ze_event_pool_handle_t pool;
  ze_event_handle_t ev;
  ze_module_handle_t mod[NMODULES];
  ze_kernel_handle_t k[K_COUNT];
  arena dmem;         /* device memory */
  arena hmem;         /* host memory (staging) */
  int queued;         /* commands appended that no wait_all() has seen end */

  atomic_int failed;  /* out of service for good */
  char why[160];      /* set once, before failed */
} zdev;

static struct {
  pthread_once_t once;
  int n;                /* usable devices in dev[] */
  const char *why;      /* n == 0: why, for the log */
  int n_ctx;
  ze_context_handle_t ctx[MAX_DRIVERS];
  zdev dev[MAX_DEVICES];
} g = {.once = PTHREAD_ONCE_INIT};

static atomic_uint g_timeout_ms = DEFAULT_TIMEOUT_MS;
static _Thread_local int t_ordinal = 0;

static int mul_size(size_t a, size_t b, size_t *out) {
  if (a != 0 && b > SIZE_MAX / a)
    return 0;
  *out = a * b;
  return 1;
}

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* The name of a Level Zero result, for messages. */
static const char *ze_name(ze_result_t r) {
  switch (r) {
#define NAME(x)                                                                \
  case x:                                                                      \
    return #x
    NAME(ZE_RESULT_SUCCESS);
    NAME(ZE_RESULT_NOT_READY);
    NAME(ZE_RESULT_ERROR_DEVICE_LOST);
    NAME(ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY);
    NAME(ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
    NAME(ZE_RESULT_ERROR_MODULE_BUILD_FAILURE);
    NAME(ZE_RESULT_ERROR_MODULE_LINK_FAILURE);
    NAME(ZE_RESULT_ERROR_DEVICE_REQUIRES_RESET);
    NAME(ZE_RESULT_ERROR_DEVICE_IN_LOW_POWER_STATE);
    NAME(ZE_RESULT_ERROR_UNINITIALIZED);
    NAME(ZE_RESULT_ERROR_UNSUPPORTED_VERSION);
    NAME(ZE_RESULT_ERROR_UNSUPPORTED_FEATURE);
    NAME(ZE_RESULT_ERROR_INVALID_ARGUMENT);
    NAME(ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    NAME(ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);
    NAME(ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    NAME(ZE_RESULT_ERROR_INVALID_SIZE);
    NAME(ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    NAME(ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT);
    NAME(ZE_RESULT_ERROR_INVALID_SYNCHRONIZATION_OBJECT);
    NAME(ZE_RESULT_ERROR_INVALID_ENUMERATION);
    NAME(ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION);
    NAME(ZE_RESULT_ERROR_INVALID_KERNEL_NAME);
    NAME(ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION);
    NAME(ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_INDEX);
    NAME(ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_SIZE);
    NAME(ZE_RESULT_ERROR_OVERLAPPING_REGIONS);
    NAME(ZE_RESULT_ERROR_INVALID_NATIVE_BINARY);
    NAME(ZE_RESULT_ERROR_INVALID_GLOBAL_WIDTH_DIMENSION);
    NAME(ZE_RESULT_ERROR_INVALID_FUNCTION_NAME);
    NAME(ZE_RESULT_ERROR_INVALID_MODULE_UNLINKED);
    NAME(ZE_RESULT_ERROR_INVALID_COMMAND_LIST_TYPE);
    NAME(ZE_RESULT_ERROR_UNKNOWN);
#undef NAME
  default:
    return "an unknown Level Zero error";
  }
}

/* Takes d out of service; the first reason stays. */
static int fail(zdev *d, const char *fmt, const char *what) {
  if (!atomic_load(&d->failed)) {
    snprintf(d->why, sizeof d->why, fmt, what);
    atomic_store(&d->failed, 1);
  }
  return QL_EDEVICE;
}

/*
 * 1 when r says that a call was refused for its arguments or the state of
 * its objects: what the validation layer (ZE_ENABLE_VALIDATION_LAYER)
 * returns, and a driver may. Said on stderr, since it is a bug of this
 * file: 'make check' runs the backend under the layer and asserts that
 * the line never appears.
 */
static int refused(ze_result_t r) {
  /* the [Validation] results of ze_api.h, numbered in one run */
  if (r < ZE_RESULT_ERROR_UNINITIALIZED ||
      r > ZE_RESULT_ERROR_OVERLAPPING_REGIONS)
    return 0;
  fprintf(stderr, "ze: a Level Zero call refused its arguments (%s)\n",
          ze_name(r));
  return 1;
}

/* The QL_E* code of a Level Zero result, at the boundary (DESIGN §7):
 * running out of memory and a refused argument are errors of this call;
 * anything else means the device can no longer be trusted. */
static int check(zdev *d, ze_result_t r) {
  if (r == ZE_RESULT_SUCCESS)
    return 0;
  if (r == ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY ||
      r == ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY ||
      r == ZE_RESULT_ERROR_UNSUPPORTED_SIZE) /* past maxMemAllocSize */
    return QL_ENOMEM;
  if (refused(r))
    return QL_EINTERNAL;
  return fail(d, "Level Zero error %s", ze_name(r));
}

/* ---- discovery ---- */

/* Reads what the backend needs of device h; 0 when the kernels can run on
 * it, else a sentence saying why not. */
static const char *probe(ze_device_handle_t h, zdev *d) {
  ze_device_properties_t p = {.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
  ze_device_module_properties_t mp = {
      .stype = ZE_STRUCTURE_TYPE_DEVICE_MODULE_PROPERTIES};
  ze_device_compute_properties_t cp = {
      .stype = ZE_STRUCTURE_TYPE_DEVICE_COMPUTE_PROPERTIES};
  ze_device_memory_properties_t mem[4];
  uint32_t n_mem = 0;

  if (zeDeviceGetProperties(h, &p) != ZE_RESULT_SUCCESS ||
      zeDeviceGetModuleProperties(h, &mp) != ZE_RESULT_SUCCESS ||
      zeDeviceGetComputeProperties(h, &cp) != ZE_RESULT_SUCCESS ||
      zeDeviceGetMemoryProperties(h, &n_mem, NULL) != ZE_RESULT_SUCCESS)
    return "its properties cannot be read";
  if (n_mem > 4)
    n_mem = 4;
  for (uint32_t i = 0; i < n_mem; i++)
    mem[i] = (ze_device_memory_properties_t){
        .stype = ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES};
  if (n_mem > 0 &&
      zeDeviceGetMemoryProperties(h, &n_mem, mem) != ZE_RESULT_SUCCESS)
    return "its memory properties cannot be read";
  if (p.type != ZE_DEVICE_TYPE_GPU)
    return "it is not a GPU";
  if (mp.spirvVersionSupported < ZE_MAKE_VERSION(1, 2))
    return "it takes no SPIR-V 1.2";
  /* Without it -cl-fp32-correctly-rounded-divide-sqrt is not honoured
   * and quantize_rows cannot be bit-exact. */
  if (!(mp.fp32flags & ZE_DEVICE_FP_FLAG_ROUNDED_DIVIDE_SQRT))
    return "it has no correctly rounded f32 divide";
  if (cp.maxTotalGroupSize < QL_ZE_WG || cp.maxGroupSizeX < QL_ZE_WG)
    return "its work-groups are smaller than the kernels'";
  memcpy(d->uuid, p.uuid.id, sizeof d->uuid);
  snprintf(d->model, sizeof d->model, "%.60s", p.name);
  d->memory = 0;
  for (uint32_t i = 0; i < n_mem; i++)
    d->memory += mem[i].totalSize;
  d->sg = 0;
  for (uint32_t i = 0; i < cp.numSubGroupSizes && i < ZE_SUBGROUPSIZE_COUNT;
       i++)
    if (cp.subGroupSizes[i] == QL_ZE_LG)
      d->sg = 1;
  d->max_groups[0] = cp.maxGroupCountX;
  d->max_groups[1] = cp.maxGroupCountY;
  return NULL;
}

/* Finds the drivers and their usable devices, once per process. */
static void init_once(void) {
  ze_driver_handle_t drv[MAX_DRIVERS];
  uint32_t n_drv = 0;
  const char *skipped = NULL;
  int seen = 0;

  g.why = "no Level Zero driver";
  if (zeInit(0) != ZE_RESULT_SUCCESS ||
      zeDriverGet(&n_drv, NULL) != ZE_RESULT_SUCCESS || n_drv == 0)
    return;
  if (n_drv > MAX_DRIVERS)
    n_drv = MAX_DRIVERS;
  if (zeDriverGet(&n_drv, drv) != ZE_RESULT_SUCCESS)
    return;
  g.why = "the Level Zero drivers see no device";
  for (uint32_t i = 0; i < n_drv && g.n < MAX_DEVICES; i++) {
    ze_api_version_t ver = 0;
    ze_device_handle_t devs[MAX_DEVICES];
    uint32_t n_dev = 0;
    ze_context_desc_t cd = {.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC};
    ze_context_handle_t ctx = NULL;
    int first = g.n;

    if (zeDriverGetApiVersion(drv[i], &ver) != ZE_RESULT_SUCCESS ||
        ZE_MAJOR_VERSION(ver) != 1 ||
        zeDeviceGet(drv[i], &n_dev, NULL) != ZE_RESULT_SUCCESS || n_dev == 0)
      continue;
    if (n_dev > MAX_DEVICES)
      n_dev = MAX_DEVICES;
    if (zeDeviceGet(drv[i], &n_dev, devs) != ZE_RESULT_SUCCESS)
      continue;
    for (uint32_t j = 0; j < n_dev && g.n < MAX_DEVICES; j++) {
      zdev *d = &g.dev[g.n];
      const char *no = probe(devs[j], d);
      seen = 1;
      if (no != NULL) {
        skipped = no;
        continue;
      }
      d->drv = drv[i];
      d->dev = devs[j];
      pthread_mutex_init(&d->mu, NULL);
      g.n++;
    }
    if (g.n == first)
      continue;
    if (zeContextCreate(drv[i], &cd, &ctx) != ZE_RESULT_SUCCESS) {
      g.n = first; /* none of this driver's devices can be used */
      skipped = "no context could be made on its driver";
      continue;
    }
    g.ctx[g.n_ctx++] = ctx;
    for (int j = first; j < g.n; j++)
      g.dev[j].ctx = ctx;
  }
  if (g.n == 0 && seen) {
    static char why[160];
    snprintf(why, sizeof why, "no Level Zero device can run the kernels (%s)",
             skipped != NULL ? skipped : "unknown");
    g.why = why;
  }
}

static int device_count(const char **why) {
  pthread_once(&g.once, init_once);
  if (g.n == 0)
    *why = g.why;
  return g.n;
}

static zdev *device_of(int o) {
  pthread_once(&g.once, init_once);
  return o >= 0 && o < g.n ? &g.dev[o] : NULL;
}

static int device_info(int o, ql_device_desc *out) {
  const zdev *d = device_of(o);
  const uint8_t *u;
  char uuid[40];
  int at = 0;

  if (d == NULL)
    return QL_EINVAL;
  /* The UUID as 8-4-4-4-12 hex digits, the form sycl-ls and
   * ZE_AFFINITY_MASK tools print. */
  u = d->uuid;
  for (int i = 0; i < 16; i++)
    at += snprintf(uuid + at, sizeof uuid - (size_t)at, "%s%02x",
                   i == 4 || i == 6 || i == 8 || i == 10 ? "-" : "", u[i]);
  snprintf(out->name, sizeof out->name, "ze:%s", uuid);
  snprintf(out->alias, sizeof out->alias, "ze:%d", o);
  snprintf(out->model, sizeof out->model, "%s", d->model);
  out->memory_bytes = d->memory;
  /* Level Zero gives a memory clock and bus width but not the transfers
   * per clock, so the peak bandwidth is not derived from them. */
  out->peak_bytes_per_s = 0;
  return 0;
}

static int device_bind(int o) {
  zdev *d = device_of(o);
  if (d == NULL)
    return QL_EINVAL;
  if (atomic_load(&d->failed))
    return QL_EDEVICE;
  t_ordinal = o;
  return 0;
}

static int device_error(int o, char *buf, size_t len) {
  zdev *d = device_of(o);
  if (d == NULL || len == 0)
    return QL_EINVAL;
  if (!atomic_load(&d->failed))
    return 0;
  snprintf(buf, len, "%s", d->why);
  return QL_EDEVICE;
}

static int configure(const ql_backend_config *c) {
  if (c->kernel_timeout_ms != 0)
    atomic_store(&g_timeout_ms, c->kernel_timeout_ms);
  return 0;
}

/* ---- a device's objects ---- */

/* The embedded module name in variant sg (1) or lm (0), or NULL. */
static const ql__ze_module *find_module(const char *name, int sg) {
  for (size_t i = 0; i < ql__ze_n_modules; i++)
    if (strcmp(ql__ze_modules[i].name, name) == 0 &&
        strcmp(ql__ze_modules[i].variant, sg ? "sg" : "lm") == 0)
      return &ql__ze_modules[i];
  return NULL;
}

/* Prints the build log of a module that failed to build. */
static void print_build_log(ze_module_build_log_handle_t log,
                            const char *name) {
  size_t size = 0;
  char *text;
  if (log == NULL || zeModuleBuildLogGetString(log, &size, NULL) != 0 ||
      size == 0 || (text = malloc(size)) == NULL)
    return;
  if (zeModuleBuildLogGetString(log, &size, text) == ZE_RESULT_SUCCESS) {
    text[size - 1] = '\0';
    fprintf(stderr, "ze: building %s failed:\n%.4000s\n", name, text);
  }
  free(text);
}

/* Makes d's command list, event, modules and kernels. d->mu held. On an
 * error the device is out of service (a driver that cannot build our
 * modules will not later), except for running out of memory. */
static int make_objects(zdev *d) {
  ze_command_queue_desc_t qd = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                                .ordinal = 0,
                                .index = 0,
                                .mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS,
                                .priority =
                                    ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
  ze_event_pool_desc_t pd = {.stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC,
                             .flags = ZE_EVENT_POOL_FLAG_HOST_VISIBLE,
                             .count = 1};
  ze_event_desc_t ed = {.stype = ZE_STRUCTURE_TYPE_EVENT_DESC,
                        .index = 0,
                        .signal = ZE_EVENT_SCOPE_FLAG_HOST,
                        .wait = ZE_EVENT_SCOPE_FLAG_HOST};
  int rc;

  /* Each object is made once: a call after a failure (out of memory)
   * makes only what is still missing. */
  if ((d->list == NULL &&
       (rc = check(d, zeCommandListCreateImmediate(d->ctx, d->dev, &qd,
                                                   &d->list))) != 0) ||
      (d->pool == NULL &&
       (rc = check(d, zeEventPoolCreate(d->ctx, &pd, 1, &d->dev,
                                        &d->pool))) != 0) ||
      (d->ev == NULL &&
       (rc = check(d, zeEventCreate(d->pool, &ed, &d->ev))) != 0))
    return rc;
  for (size_t i = 0; i < NMODULES; i++) {
    const ql__ze_module *m = find_module(module_names[i], d->sg);
    if (d->mod[i] != NULL)
      continue;
    ze_module_desc_t md = {.stype = ZE_STRUCTURE_TYPE_MODULE_DESC,
                           .format = ZE_MODULE_FORMAT_IL_SPIRV,
                           .pBuildFlags = build_flags};
    ze_module_build_log_handle_t log = NULL;
    ze_result_t r;
    if (m == NULL)
      return fail(d, "the %s module is not in the library", module_names[i]);
    md.inputSize = m->size;
    md.pInputModule = m->spirv;
    r = zeModuleCreate(d->ctx, d->dev, &md, &d->mod[i], &log);
    if (r != ZE_RESULT_SUCCESS) {
      print_build_log(log, module_names[i]);
      d->mod[i] = NULL;
    }
    if (log != NULL)
      (void)refused(zeModuleBuildLogDestroy(log));
    if (r == ZE_RESULT_ERROR_MODULE_BUILD_FAILURE)
      return fail(d, "the %s module does not build (see the log)",
                  module_names[i]);
    if ((rc = check(d, r)) != 0)
      return rc;
  }
  for (int i = 0; i < K_COUNT; i++) {
    ze_kernel_desc_t kd = {.stype = ZE_STRUCTURE_TYPE_KERNEL_DESC,
                           .pKernelName = kernels[i].name};
    if (d->k[i] != NULL)
      continue;
    if ((rc = check(d, zeKernelCreate(d->mod[kernels[i].module], &kd,
                                      &d->k[i]))) != 0) {
      d->k[i] = NULL;
      return rc;
    }
    /* Every kernel is written for work-groups of 64 (LocalSize 64 1 1). */
    if ((rc = check(d, zeKernelSetGroupSize(d->k[i], QL_ZE_WG, 1, 1))) !=
        0) {
      (void)refused(zeKernelDestroy(d->k[i]));
      d->k[i] = NULL;
      return rc;
    }
  }
  d->ready = 1;
  return 0;
}

/* The calling thread's device, locked and ready for a call: its objects
 * exist and it has not failed. On success the caller runs its call and
 * then leave()s. */
static int enter(zdev **out) {
  zdev *d = device_of(t_ordinal);
  int rc = 0;
  if (d == NULL)
    return QL_EINVAL;
  pthread_mutex_lock(&d->mu);
  if (atomic_load(&d->failed))
    rc = QL_EDEVICE;
  else if (!d->ready)
    rc = make_objects(d);
  if (rc != 0) {
    pthread_mutex_unlock(&d->mu);
    return rc;
  }
  d->dmem.used = d->hmem.used = 0;
  *out = d;
  return 0;
}

static void leave(zdev *d) { pthread_mutex_unlock(&d->mu); }

/* A new allocation of n bytes for an arena: host or device memory. */
static int arena_alloc(zdev *d, size_t n, int host, void **p) {
  ze_device_mem_alloc_desc_t dd = {
      .stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
  ze_host_mem_alloc_desc_t hd = {.stype =
                                     ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC};
  return check(d,
               host ? zeMemAllocHost(d->ctx, &hd, n, PIECE_ALIGN, p)
                    : zeMemAllocDevice(d->ctx, &dd, n, PIECE_ALIGN, d->dev, p));
}

/* Makes a at least n bytes (its contents are not kept): a quarter more,
 * so that calls growing by small steps do not each reallocate, or n
 * itself when a quarter more does not fit. */
static int grow(zdev *d, arena *a, size_t n, int host) {
  void *p = NULL;
  size_t cap;
  int rc;

  if (n <= a->cap)
    return 0;
  if (n > SIZE_MAX / 2)
    return QL_ENOMEM;
  cap = round_up(n + n / 4, PIECE_ALIGN);
  if (a->base != NULL) {
    rc = check(d, zeMemFree(d->ctx, a->base));
    a->base = NULL;
    a->cap = 0;
    if (rc != 0)
      return rc;
  }
  rc = arena_alloc(d, cap, host, &p);
  if (rc == QL_ENOMEM && cap > round_up(n, PIECE_ALIGN)) {
    cap = round_up(n, PIECE_ALIGN);
    rc = arena_alloc(d, cap, host, &p);
  }
  if (rc != 0)
    return rc;
  a->base = p;
  a->cap = cap;
  return 0;
}

static void *take(arena *a, size_t n) {
  void *p = a->base + a->used;
  a->used += round_up(n, PIECE_ALIGN);
  return p;
}

/* ---- commands ---- */

/* check() for an append to d's list, which then has a command queued
 * until a wait_all() sees the list's commands end. */
static int appended(zdev *d, ze_result_t r) {
  int rc = check(d, r);
  if (rc == 0)
    d->queued = 1;
  return rc;
}

static int barrier(zdev *d) {
  return appended(d, zeCommandListAppendBarrier(d->list, NULL, 0, NULL));
}

static int copy(zdev *d, void *dst, const void *src, size_t n) {
  return appended(
      d, zeCommandListAppendMemoryCopy(d->list, dst, src, n, NULL, 0, NULL));
}

static int fill(zdev *d, void *dst, unsigned char byte, size_t n) {
  return appended(d, zeCommandListAppendMemoryFill(d->list, dst, &byte, 1, n,
                                                   NULL, 0, NULL));
}

/* Waits for everything appended to d's list, for at most the kernel
 * timeout: a barrier that signals the device's event, and a bounded host
 * wait on it. A wait that times out takes the device out of service, as a
 * kernel that never ends would otherwise block this thread for good. */
static int wait_all(zdev *d) {
  unsigned ms = atomic_load(&g_timeout_ms);
  ze_result_t r;
  int rc;

  if ((rc = appended(d, zeCommandListAppendBarrier(d->list, d->ev, 0, NULL))) !=
      0)
    return rc;
  r = zeEventHostSynchronize(d->ev, (uint64_t)ms * 1000000u);
  if (r == ZE_RESULT_NOT_READY) {
    char t[32];
    snprintf(t, sizeof t, "%u", ms);
    return fail(d, "a kernel did not finish within %s ms", t);
  }
  if ((rc = check(d, r)) != 0)
    return rc;
  d->queued = 0;
  return check(d, zeEventHostReset(d->ev));
}

/*
 * Returns a call's result rc once the commands it queued are over: after
 * a failure, those appended before it may still run, reading and writing
 * the arenas and the layout that the next call reuses or the caller
 * frees, so they are waited for (wait_all, bounded by the kernel
 * timeout). A device whose commands cannot be waited for is taken out of
 * service, and the call's result is then QL_EDEVICE.
 */
static int settle(zdev *d, int rc) {
  if (rc == 0 || !d->queued || atomic_load(&d->failed))
    return rc;
  if (wait_all(d) != 0)
    return fail(d, "%s",
                "the commands of a failed call could not be waited for");
  return rc;
}

/* zeKernelSetArgumentValue for a run of arguments, keeping the first
 * error. */
typedef struct kargs {
  ze_kernel_handle_t k;
  uint32_t i;
  ze_result_t err;
} kargs;

static void karg(kargs *a, size_t size, const void *v) {
  ze_result_t r = zeKernelSetArgumentValue(a->k, a->i++, size, v);
  if (a->err == ZE_RESULT_SUCCESS)
    a->err = r;
}
static void karg_l(kargs *a, int64_t v) { karg(a, sizeof v, &v); }
static void karg_i(kargs *a, int v) {
  int32_t i = v;
  karg(a, sizeof i, &i);
}
/* A device pointer, or NULL: a NULL value gives the kernel a NULL pointer
 * (zeKernelSetArgumentValue, pArgValue). */
static void karg_p(kargs *a, const void *p) {
  karg(a, sizeof p, p != NULL ? (const void *)&p : NULL);
}

/* Appends kernel a->k over groups[0] x groups[1] work-groups. */
static int launch(zdev *d, const kargs *a, size_t gx, size_t gy) {
  ze_group_count_t gc;
  int rc;
  if ((rc = check(d, a->err)) != 0)
    return rc;
  if (gx > d->max_groups[0] || gy > d->max_groups[1])
    return QL_ESHAPE;
  gc.groupCountX = (uint32_t)gx;
  gc.groupCountY = (uint32_t)gy;
  gc.groupCountZ = 1;
  return appended(
      d, zeCommandListAppendLaunchKernel(d->list, a->k, &gc, NULL, 0, NULL));
}

/* QL_EINTERNAL, said on stderr, when the guard after an output of n bytes
 * (read back to host at g) is not intact. */
static int guard_ok(const unsigned char *g, size_t n, const char *what) {
  for (size_t i = 0; i < GUARD; i++)
    if (g[i] != GUARD_BYTE) {
      fprintf(stderr, "ze: a kernel wrote past %s (%zu bytes)\n", what, n);
      return QL_EINTERNAL;
    }
  return 0;
}

/* ---- the layout "ze-1" (ql_ze.h) ---- */

/* A repacked weight: one device allocation holding the rows of codes,
 * scale, zero and bias at the offsets below. */
typedef struct packed {
  int format, sdt, asym;
  int64_t n, k, groups;
  uint32_t gs;
  int64_t ldq;                 /* bytes between rows of q */
  ze_context_handle_t ctx;     /* of mem */
  unsigned char *mem;
  void *q, *scale, *zero, *bias; /* zero, bias: NULL when the weight has
                                    none */
  size_t bytes;
} packed;

static int64_t row_bytes(const ql_qweight *w) {
  return w->format == QL_FORMAT_Q4G ? w->k / 2 + (w->k & 1) : w->k;
}

/* True when p was made from a weight of w's shape and parameters. */
static int packed_matches(const packed *p, const ql_qweight *w) {
  return p->format == (int)w->format && p->n == w->n && p->k == w->k &&
         p->groups == w->groups && p->gs == w->group_size &&
         p->sdt == (int)w->scale_dtype && p->asym == w->asymmetric &&
         (p->zero != NULL) == (w->zero != NULL) &&
         (p->bias != NULL) == (w->bias != NULL);
}

static void free_packed(void *pp) {
  packed *p = pp;
  if (p == NULL)
    return;
  /* A lost device's memory goes with it: an error here changes nothing,
   * but a refusal is still a bug worth saying. */
  if (p->mem != NULL)
    (void)refused(zeMemFree(p->ctx, p->mem));
  free(p);
}

/*
 * Builds the layout of w on d (entered): rows of codes padded with zeros
 * to QL_ZE_ROW_ALIGN bytes, scale and zero transposed from [G, N] to
 * [N, G] in their dtype, bias copied. The image is made in host memory and
 * copied to one device allocation through the staging arena.
 */
static int make_packed(zdev *d, const ql_qweight *w, packed **out) {
  size_t n, gg, ssz, rb, ldq, qb, sb, bb, off_s, off_z, off_b, total;
  unsigned char *img = NULL;
  packed *p = NULL;
  ze_device_mem_alloc_desc_t dd = {
      .stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
  void *mem = NULL;
  int rc;

  *out = NULL;
  if ((rc = ql_qweight_check(w)) != 0)
    return rc;
  n = (size_t)w->n;
  gg = (size_t)w->groups;
  ssz = ql_dtype_size(w->scale_dtype);
  rb = (size_t)row_bytes(w);
  ldq = round_up(rb, QL_ZE_ROW_ALIGN);
  if (!mul_size(n, ldq, &qb) || !mul_size(n, gg, &sb) ||
      !mul_size(sb, ssz, &sb) || !mul_size(n, sizeof(float), &bb) ||
      qb > SIZE_MAX / 4 || sb > SIZE_MAX / 4)
    return QL_ESHAPE;
  off_s = round_up(qb, PIECE_ALIGN);
  off_z = off_s + round_up(sb, PIECE_ALIGN);
  off_b = off_z + (w->zero != NULL ? round_up(sb, PIECE_ALIGN) : 0);
  total = off_b + (w->bias != NULL ? bb : 0);

  rc = QL_ENOMEM;
  if ((p = calloc(1, sizeof *p)) == NULL || (img = calloc(1, total)) == NULL)
    goto fail;
  /* Rows of codes; the padding is zero (a zero code adds x·0). */
  for (size_t r = 0; r < n; r++)
    memcpy(img + r * ldq, w->qdata + r * rb, rb);
  for (size_t r = 0; r < n; r++)
    for (size_t j = 0; j < gg; j++) {
      memcpy(img + off_s + (r * gg + j) * ssz,
             (const unsigned char *)w->scale + (j * n + r) * ssz, ssz);
      if (w->zero != NULL)
        memcpy(img + off_z + (r * gg + j) * ssz,
               (const unsigned char *)w->zero + (j * n + r) * ssz, ssz);
    }
  if (w->bias != NULL)
    memcpy(img + off_b, w->bias, bb);
  if ((rc = check(d, zeMemAllocDevice(d->ctx, &dd, total, PIECE_ALIGN,
                                      d->dev, &mem))) != 0)
    goto fail;
  p->ctx = d->ctx;
  p->mem = mem;
  if ((rc = grow(d, &d->hmem, total < UPLOAD_CHUNK ? total : UPLOAD_CHUNK,
                 1)) != 0)
    goto fail;
  for (size_t at = 0; at < total; at += UPLOAD_CHUNK) {
    size_t len = total - at < UPLOAD_CHUNK ? total - at : UPLOAD_CHUNK;
    memcpy(d->hmem.base, img + at, len);
    if ((rc = copy(d, p->mem + at, d->hmem.base, len)) != 0 ||
        (rc = wait_all(d)) != 0)
      goto fail;
  }
  p->format = (int)w->format;
  p->sdt = (int)w->scale_dtype;
  p->asym = w->asymmetric;
  p->n = w->n;
  p->k = w->k;
  p->groups = w->groups;
  p->gs = w->group_size;
  p->ldq = (int64_t)ldq;
  p->q = p->mem;
  p->scale = p->mem + off_s;
  p->zero = w->zero != NULL ? p->mem + off_z : NULL;
  p->bias = w->bias != NULL ? p->mem + off_b : NULL;
  p->bytes = total;
  *out = p;
  p = NULL;
  rc = 0;
fail:
  rc = settle(d, rc);
  free(img);
  free_packed(p);
  return rc;
}

static int repack(ql_repack_args *a) {
  packed *p = NULL;
  zdev *d;
  int rc;

  if (a == NULL || a->w == NULL)
    return QL_EINVAL;
  a->packed = NULL;
  a->packed_bytes = 0;
  if ((rc = enter(&d)) != 0)
    return rc;
  rc = make_packed(d, a->w, &p);
  leave(d);
  if (rc == 0) {
    a->packed = p;
    a->packed_bytes = p->bytes;
  }
  return rc;
}

/* The caller's layout, or one made for this call in *tmp (d entered). */
static int layout_for(zdev *d, const ql_linear_args *a, const packed **p,
                      packed **tmp) {
  int rc;
  *tmp = NULL;
  if (a->packed != NULL) {
    *p = a->packed;
    return packed_matches(*p, a->w) ? 0 : QL_EINVAL;
  }
  rc = make_packed(d, a->w, tmp);
  *p = *tmp;
  return rc;
}

/* ---- linear ops ---- */

/* The argument checks of kernels/reference.c op_args(); *xb, *yb: bytes
 * of x and y. */
static int linear_args(const ql_linear_args *a, size_t *mk, size_t *xb,
                       size_t *yb) {
  size_t mn, esz, bytes;
  int rc;

  if (a == NULL || a->w == NULL || a->x == NULL || a->y == NULL)
    return QL_EINVAL;
  if ((rc = ql_qweight_check(a->w)) != 0)
    return rc;
  if ((esz = ql_dtype_size(a->dt)) == 0)
    return QL_EDTYPE;
  if (a->m < 1 || a->m > QL_DIM_MAX)
    return QL_ESHAPE;
  if (!mul_size((size_t)a->m, (size_t)a->w->k, mk) ||
      !mul_size(*mk, sizeof(float), &bytes) ||
      !mul_size((size_t)a->m, (size_t)a->w->n, &mn) ||
      !mul_size(mn, sizeof(float), &bytes))
    return QL_ESHAPE;
  *xb = *mk * esz;
  *yb = mn * esz;
  return 0;
}

/* The device side of one linear call, carved from d's arenas. Outputs
 * have GUARD bytes after them. */
typedef struct call {
  void *dx;             /* x as given */
  void *dy;             /* y */
  int8_t *xq;           /* AQ: int8 rows */
  float *sx;            /* AQ: their scales */
  int32_t *gsum;        /* AQ q4g: group sums */
  int64_t *status;      /* AQ: quantize_rows' verdict per row */
  int32_t *bad;         /* NaN/Inf flag */
  unsigned where;       /* QL_LINEAR_*_DEVICE: x, y in device memory */
  unsigned char *hs;    /* host staging for x, then y and its guard */
  unsigned char *hg;    /* host: the intermediates' guards */
  int64_t *hstatus;     /* host copy of status */
  int32_t *hbad;        /* host copy of bad */
} call;

/* Reserves and carves a call's memory: aq adds the AQ intermediates for
 * groups per row (0: no group sums). */
static int carve(zdev *d, const ql_linear_args *a, size_t mk, size_t xb,
                 size_t yb, int aq, int64_t groups, call *c) {
  const size_t m = (size_t)a->m, A = PIECE_ALIGN;
  const size_t xq = aq ? mk + GUARD : 0, sx = aq ? m * sizeof(float) + GUARD
                                                   : 0,
               gs = aq && groups > 0
                        ? m * (size_t)groups * sizeof(int32_t) + GUARD
                        : 0,
               st = aq ? m * sizeof(int64_t) + GUARD : 0,
               hs = xb > yb + GUARD ? xb : yb + GUARD;
  const size_t dev = round_up(xb, A) + round_up(yb + GUARD, A) +
                     round_up(xq, A) + round_up(sx, A) + round_up(gs, A) +
                     round_up(st, A) + round_up(sizeof(int32_t) + GUARD, A);
  const size_t host = round_up(hs, A) + round_up(3 * GUARD, A) +
                      round_up(st, A) + round_up(sizeof(int32_t), A);
  int rc;

  if ((rc = grow(d, &d->dmem, dev, 0)) != 0 ||
      (rc = grow(d, &d->hmem, host, 1)) != 0)
    return rc;
  memset(c, 0, sizeof *c);
  c->dx = take(&d->dmem, xb);
  c->dy = take(&d->dmem, yb + GUARD);
  if (xq)
    c->xq = take(&d->dmem, xq);
  if (sx)
    c->sx = take(&d->dmem, sx);
  if (gs)
    c->gsum = take(&d->dmem, gs);
  if (st)
    c->status = take(&d->dmem, st);
  c->bad = take(&d->dmem, sizeof(int32_t) + GUARD);
  c->hs = take(&d->hmem, hs);
  c->hg = take(&d->hmem, 3 * GUARD);
  if (st)
    c->hstatus = take(&d->hmem, st);
  c->hbad = take(&d->hmem, sizeof(int32_t));
  return 0;
}

/*
 * Copies x to the device through staging and fails the call with
 * QL_ENONFINITE when it holds NaN or Inf, before anything is computed
 * (DESIGN §4), as the reference does. count values of dtype dt.
 */
static int stage_x(zdev *d, const ql_linear_args *a, size_t count, size_t xb,
                   const call *c) {
  size_t groups = (count + QL_ZE_QWG - 1) / QL_ZE_QWG;
  kargs ka = {d->k[K_FINITE], 0, ZE_RESULT_SUCCESS};
  int rc;

  if (groups > 256) /* each work-item strides over the rest */
    groups = 256;
  /* x in device memory (an IPC import) is copied on the device, which
   * also keeps the client from changing it under the check. */
  if (!(c->where & QL_LINEAR_X_DEVICE))
    memcpy(c->hs, a->x, xb);
  if ((rc = copy(d, c->dx, c->where & QL_LINEAR_X_DEVICE ? a->x : c->hs,
                 xb)) != 0 ||
      (rc = fill(d, c->bad, 0, sizeof(int32_t))) != 0 ||
      (rc = barrier(d)) != 0)
    return rc;
  karg_i(&ka, (int)a->dt);
  karg_l(&ka, (int64_t)count);
  karg_p(&ka, c->dx);
  karg_p(&ka, c->bad);
  if ((rc = launch(d, &ka, groups, 1)) != 0 || (rc = barrier(d)) != 0 ||
      (rc = copy(d, c->hbad, c->bad, sizeof(int32_t))) != 0 ||
      (rc = wait_all(d)) != 0)
    return rc;
  return *c->hbad ? QL_ENONFINITE : 0;
}

/* Fills y on the device with NaN (all ones, in every dtype) and its guard:
 * an element a kernel leaves unwritten comes back as NaN, never as a
 * plausible stale value. */
static int prepare_y(zdev *d, const call *c, size_t yb) {
  int rc = fill(d, c->dy, 0xFF, yb);
  return rc != 0 ? rc : fill(d, (unsigned char *)c->dy + yb, GUARD_BYTE, GUARD);
}

/* The 2-D range of the linear kernels (ql_ze.h). */
static int launch_linear(zdev *d, const kargs *ka, int64_t n, int64_t m) {
  return launch(d, ka, (size_t)((n + QL_ZE_NG - 1) / QL_ZE_NG),
                (size_t)((m + QL_ZE_MT - 1) / QL_ZE_MT));
}

/* After the launch of the product: y (and its guard) back to the caller. */
static int fetch_y(zdev *d, const ql_linear_args *a, size_t yb,
                   const call *c) {
  int rc;
  if (c->where & QL_LINEAR_Y_DEVICE) {
    /* The guard first: a y in the client's memory is written only from a
     * product that stayed inside its bounds. */
    if ((rc = barrier(d)) != 0 ||
        (rc = copy(d, c->hs + yb, (unsigned char *)c->dy + yb, GUARD)) !=
            0 ||
        (rc = wait_all(d)) != 0 || (rc = guard_ok(c->hs + yb, yb, "y")) != 0)
      return rc;
    if ((rc = copy(d, a->y, c->dy, yb)) != 0)
      return rc;
    return wait_all(d);
  }
  if ((rc = barrier(d)) != 0 || (rc = copy(d, c->hs, c->dy, yb + GUARD)) != 0 ||
      (rc = wait_all(d)) != 0 || (rc = guard_ok(c->hs + yb, yb, "y")) != 0)
    return rc;
  memcpy(a->y, c->hs, yb);
  return 0;
}

/* run_wo() with d entered. */
static int wo_on(zdev *d, const ql_linear_args *a, unsigned where, size_t mk,
                 size_t xb, size_t yb) {
  static const int kid[] = {[QL_FORMAT_Q4G] = K_WO_Q4G,
                            [QL_FORMAT_Q8C] = K_WO_Q8C,
                            [QL_FORMAT_Q8B] = K_WO_Q8B,
                            [QL_FORMAT_F8R] = K_WO_F8R};
  const packed *p;
  packed *tmp = NULL;
  call c;
  int rc;

  if ((rc = layout_for(d, a, &p, &tmp)) != 0 ||
      (rc = carve(d, a, mk, xb, yb, 0, 0, &c)) != 0 ||
      (c.where = where, (rc = stage_x(d, a, mk, xb, &c)) != 0) ||
      (rc = prepare_y(d, &c, yb)) != 0 || (rc = barrier(d)) != 0)
    goto out;
  {
    kargs ka = {d->k[kid[p->format]], 0, ZE_RESULT_SUCCESS};
    karg_l(&ka, p->n);
    karg_l(&ka, p->k);
    karg_l(&ka, (int64_t)p->gs);
    karg_l(&ka, p->groups);
    karg_i(&ka, (int)a->dt);
    karg_i(&ka, p->sdt);
    karg_p(&ka, p->q);
    karg_l(&ka, p->ldq);
    karg_p(&ka, p->scale);
    karg_p(&ka, p->zero);
    karg_p(&ka, p->bias);
    karg_p(&ka, c.dx);
    karg_l(&ka, a->m);
    karg_p(&ka, c.dy);
    if ((rc = launch_linear(d, &ka, p->n, a->m)) == 0)
      rc = fetch_y(d, a, yb, &c);
  }
out:
  rc = settle(d, rc);
  free_packed(tmp);
  return rc;
}

/* run_wo() with x and y where says (QL_LINEAR_*_DEVICE). */
static int wo_where(const ql_linear_args *a, unsigned where) {
  size_t mk, xb, yb;
  zdev *d;
  int rc;

  if ((rc = linear_args(a, &mk, &xb, &yb)) != 0)
    return rc;
  if ((rc = enter(&d)) != 0)
    return rc;
  rc = wo_on(d, a, where, mk, xb, yb);
  leave(d);
  return rc;
}

static int run_wo(const ql_linear_args *a) { return wo_where(a, 0); }

/* The verdict of quantize_rows as the reference gives it: the first row in
 * order that it would refuse decides, and in it the first value. */
static int rows_verdict(const int64_t *st, int64_t m) {
  for (int64_t r = 0; r < m; r++)
    if (st[r] != 0)
      return (st[r] & 3) == QL_ZE_ST_NONFINITE ? QL_ENONFINITE : QL_EINVAL;
  return 0;
}

/*
 * Appends ql_ze_quantize_rows on m rows of x (dtype xdt, the rule of src)
 * into the device arrays xq, sx, gsum (may be NULL), with the row status
 * into status. The caller waits and reads the status.
 */
static int quantize(zdev *d, int kind, int xdt, int src, const void *x,
                    int64_t m, int64_t k, int64_t gs, int64_t groups,
                    void *xq, float *sx, int32_t *gsum, int64_t *status) {
  kargs ka = {d->k[K_QROWS], 0, ZE_RESULT_SUCCESS};
  karg_i(&ka, kind);
  karg_i(&ka, xdt);
  karg_i(&ka, src);
  karg_l(&ka, k);
  karg_l(&ka, gs);
  karg_l(&ka, groups);
  karg_p(&ka, x);
  karg_p(&ka, xq);
  karg_p(&ka, sx);
  karg_p(&ka, gsum);
  karg_p(&ka, status);
  return launch(d, &ka, (size_t)m, 1);
}

/* Appends the guard fills after the outputs of n bytes at p. */
static int guard_fill(zdev *d, void *p, size_t n) {
  return p == NULL ? 0 : fill(d, (unsigned char *)p + n, GUARD_BYTE, GUARD);
}

/* Appends the copy of the guard after n bytes at p to host h. */
static int guard_fetch(zdev *d, unsigned char *h, const void *p, size_t n) {
  return p == NULL ? 0 : copy(d, h, (const unsigned char *)p + n, GUARD);
}

static int supports_aq(const ql_kernel_impl *im, ql_format f, int64_t m,
                       int64_t n, int64_t k) {
  (void)im;
  (void)m;
  (void)n;
  /* q8c sums all of K in an int32 (DESIGN §4) */
  return f != QL_FORMAT_Q8C || k <= QL_AQ_Q8C_MAX_K;
}

/* run_aq() with d entered: x quantized on the device with the int8 rule of
 * its own dtype (what ql_linear_aq_ref does), then the product. */
static int aq_on(zdev *d, const ql_linear_args *a, unsigned where, size_t mk,
                 size_t xb, size_t yb) {
  const int q4g = a->w->format == QL_FORMAT_Q4G;
  const size_t m = (size_t)a->m, stb = m * sizeof(int64_t),
               sxb = m * sizeof(float);
  size_t gb = 0;
  const packed *p;
  packed *tmp = NULL;
  call c;
  int rc;

  if (q4g && !mul_size(m, (size_t)a->w->groups * sizeof(int32_t), &gb))
    return QL_ESHAPE;
  if ((rc = layout_for(d, a, &p, &tmp)) != 0 ||
      (rc = carve(d, a, mk, xb, yb, 1, q4g ? a->w->groups : 0, &c)) != 0 ||
      (c.where = where, (rc = stage_x(d, a, mk, xb, &c)) != 0))
    goto out;
  if ((rc = guard_fill(d, c.xq, mk)) != 0 ||
      (rc = guard_fill(d, c.sx, sxb)) != 0 ||
      (rc = guard_fill(d, c.gsum, gb)) != 0 || (rc = barrier(d)) != 0 ||
      (rc = quantize(d, QL_ZE_QROWS_I8, (int)a->dt, (int)a->dt, c.dx, a->m,
                     p->k, q4g ? (int64_t)p->gs : p->k,
                     q4g ? p->groups : 1, c.xq, c.sx, c.gsum, c.status)) !=
          0 ||
      (rc = barrier(d)) != 0 ||
      (rc = copy(d, c.hstatus, c.status, stb)) != 0 ||
      (rc = wait_all(d)) != 0 || (rc = rows_verdict(c.hstatus, a->m)) != 0)
    goto out;
  if ((rc = prepare_y(d, &c, yb)) != 0 || (rc = barrier(d)) != 0)
    goto out;
  {
    kargs ka = {d->k[q4g ? K_AQ_Q4G : K_AQ_Q8C], 0, ZE_RESULT_SUCCESS};
    karg_l(&ka, p->n);
    karg_l(&ka, p->k);
    if (q4g) {
      karg_l(&ka, (int64_t)p->gs);
      karg_l(&ka, p->groups);
    }
    karg_i(&ka, (int)a->dt);
    karg_i(&ka, p->sdt);
    karg_p(&ka, p->q);
    karg_l(&ka, p->ldq);
    karg_p(&ka, p->scale);
    if (q4g)
      karg_p(&ka, p->zero);
    karg_p(&ka, p->bias);
    karg_p(&ka, c.xq);
    karg_p(&ka, c.sx);
    if (q4g)
      karg_p(&ka, c.gsum);
    karg_l(&ka, a->m);
    karg_p(&ka, c.dy);
    if ((rc = launch_linear(d, &ka, p->n, a->m)) != 0)
      goto out;
  }
  /* the intermediate outputs' guards too, with y */
  if ((rc = barrier(d)) != 0 ||
      (rc = guard_fetch(d, c.hg, c.xq, mk)) != 0 ||
      (rc = guard_fetch(d, c.hg + GUARD, c.sx, sxb)) != 0 ||
      (rc = guard_fetch(d, c.hg + 2 * GUARD, c.gsum, gb)) != 0 ||
      (rc = fetch_y(d, a, yb, &c)) != 0)
    goto out;
  if ((rc = guard_ok(c.hg, mk, "xq")) == 0 &&
      (rc = guard_ok(c.hg + GUARD, sxb, "sx")) == 0 && c.gsum != NULL)
    rc = guard_ok(c.hg + 2 * GUARD, gb, "gsum");
out:
  rc = settle(d, rc);
  free_packed(tmp);
  return rc;
}

/* run_aq() with x and y where says (QL_LINEAR_*_DEVICE). */
static int aq_where(const ql_linear_args *a, unsigned where) {
  size_t mk, xb, yb;
  zdev *d;
  int rc;

  if ((rc = linear_args(a, &mk, &xb, &yb)) != 0)
    return rc;
  if (a->w->format != QL_FORMAT_Q4G && a->w->format != QL_FORMAT_Q8C)
    return QL_ENOTSUP;
  if (a->w->format == QL_FORMAT_Q8C && a->w->k > QL_AQ_Q8C_MAX_K)
    return QL_ESHAPE;
  if ((rc = enter(&d)) != 0)
    return rc;
  rc = aq_on(d, a, where, mk, xb, yb);
  leave(d);
  return rc;
}

static int run_aq(const ql_linear_args *a) { return aq_where(a, 0); }

/* ---- quantize_rows ---- */

/* The argument checks of ql_quantize_rows_i8_src / _e4m3_src and of
 * ql_qrows_args (registry.h). */
static int qrows_args(const ql_qrows_args *a, ql_dtype *src, int64_t *groups,
                      size_t *mk, size_t *mg) {
  size_t bytes;
  if (a == NULL || a->x == NULL || a->xq == NULL || a->sx == NULL)
    return QL_EINVAL;
  if (a->kind != QL_QROWS_I8 && a->kind != QL_QROWS_E4M3)
    return QL_EINVAL;
  if (a->kind == QL_QROWS_E4M3 && a->gsum != NULL)
    return QL_EINVAL;
  if (a->kind == QL_QROWS_I8 && a->gs < 1)
    return QL_EINVAL;
  *src = (int)a->src == 0 ? QL_DTYPE_F32 : a->src;
  if (!ql_dtype_valid((int)*src))
    return QL_EDTYPE;
  if (a->m < 1 || a->m > QL_DIM_MAX || a->k < 1 || a->k > QL_DIM_MAX)
    return QL_ESHAPE;
  *groups = a->kind == QL_QROWS_I8 ? (a->k + a->gs - 1) / a->gs : 1;
  if (!mul_size((size_t)a->m, (size_t)a->k, mk) ||
      !mul_size((size_t)a->m, (size_t)*groups, mg) ||
      !mul_size(*mk, sizeof(float), &bytes) ||
      !mul_size(*mg, sizeof(int32_t), &bytes))
    return QL_ESHAPE;
  if (a->gsum != NULL &&
      ((int64_t)a->gs < a->k ? (int64_t)a->gs : a->k) > QL_QROWS_MAX_GROUP)
    return QL_ESHAPE;
  return 0;
}

/* run_qrows() with d entered. The outputs start as the caller's bytes:
 * what the kernel leaves unwritten comes back unchanged, and a caller that
 * prefilled them sees it. */
static int qrows_on(zdev *d, const ql_qrows_args *a, ql_dtype src,
                    int64_t groups, size_t mk, size_t mg) {
  const size_t m = (size_t)a->m, A = PIECE_ALIGN, xb = mk * sizeof(float),
               qb = mk, sb = m * sizeof(float),
               gb = a->gsum != NULL ? mg * sizeof(int32_t) : 0,
               stb = m * sizeof(int64_t);
  const size_t all = round_up(xb, A) + round_up(qb + GUARD, A) +
                     round_up(sb + GUARD, A) + round_up(gb + GUARD, A) +
                     round_up(stb, A);
  int rc, r2;

  if ((rc = grow(d, &d->dmem, all, 0)) != 0 ||
      (rc = grow(d, &d->hmem, all, 1)) != 0)
    return rc;
  float *dx = take(&d->dmem, xb);
  unsigned char *dq = take(&d->dmem, qb + GUARD);
  unsigned char *ds = take(&d->dmem, sb + GUARD);
  unsigned char *dg = gb ? take(&d->dmem, gb + GUARD) : NULL;
  int64_t *dst = take(&d->dmem, stb);
  unsigned char *hx = take(&d->hmem, xb);
  unsigned char *hq = take(&d->hmem, qb + GUARD);
  unsigned char *hsx = take(&d->hmem, sb + GUARD);
  unsigned char *hg = gb ? take(&d->hmem, gb + GUARD) : NULL;
  int64_t *hst = take(&d->hmem, stb);

  memcpy(hx, a->x, xb);
  memcpy(hq, a->xq, qb);
  memset(hq + qb, GUARD_BYTE, GUARD);
  memcpy(hsx, a->sx, sb);
  memset(hsx + sb, GUARD_BYTE, GUARD);
  if (gb) {
    memcpy(hg, a->gsum, gb);
    memset(hg + gb, GUARD_BYTE, GUARD);
  }
  if ((rc = copy(d, dx, hx, xb)) != 0 ||
      (rc = copy(d, dq, hq, qb + GUARD)) != 0 ||
      (rc = copy(d, ds, hsx, sb + GUARD)) != 0 ||
      (gb && (rc = copy(d, dg, hg, gb + GUARD)) != 0) ||
      (rc = barrier(d)) != 0 ||
      (rc = quantize(d,
                     a->kind == QL_QROWS_I8 ? QL_ZE_QROWS_I8
                                            : QL_ZE_QROWS_E4M3,
                     QL_ZE_DT_F32, (int)src, dx, a->m, a->k,
                     a->kind == QL_QROWS_I8 ? (int64_t)a->gs : a->k, groups,
                     dq, (float *)ds, (int32_t *)dg, dst)) != 0 ||
      (rc = barrier(d)) != 0 || (rc = copy(d, hq, dq, qb + GUARD)) != 0 ||
      (rc = copy(d, hsx, ds, sb + GUARD)) != 0 ||
      (gb && (rc = copy(d, hg, dg, gb + GUARD)) != 0) ||
      (rc = copy(d, hst, dst, stb)) != 0 || (rc = wait_all(d)) != 0)
    return rc;
  /* the guards first: a kernel that overran an output fails the call
   * whatever the rows' verdict */
  if ((r2 = guard_ok(hq + qb, qb, "xq")) != 0 ||
      (r2 = guard_ok(hsx + sb, sb, "sx")) != 0 ||
      (gb && (r2 = guard_ok(hg + gb, gb, "gsum")) != 0))
    return r2;
  /* The outputs are unspecified after a refusal; copied anyway, as the
   * OpenCL host does. */
  memcpy(a->xq, hq, qb);
  memcpy(a->sx, hsx, sb);
  if (gb)
    memcpy(a->gsum, hg, gb);
  return rows_verdict(hst, a->m);
}

static int run_qrows(const ql_qrows_args *a) {
  size_t mk, mg;
  int64_t groups;
  ql_dtype src;
  zdev *d;
  int rc;

  if ((rc = qrows_args(a, &src, &groups, &mk, &mg)) != 0)
    return rc;
  if ((rc = enter(&d)) != 0)
    return rc;
  rc = settle(d, qrows_on(d, a, src, groups, mk, mg));
  leave(d);
  return rc;
}

/* ---- registration ---- */

#define FMTS_WO QL_ALL_FORMATS
#define FMTS_AQ (QL_FMT_BIT(QL_FORMAT_Q4G) | QL_FMT_BIT(QL_FORMAT_Q8C))
#define FMTS_QROWS                                                             \
  (QL_FMT_BIT(QL_FORMAT_Q4G) | QL_FMT_BIT(QL_FORMAT_Q8C) |                     \
   QL_FMT_BIT(QL_FORMAT_F8R))

/* ---- IPC imports (DESIGN §7) ---- */

/* A failed IPC call in ql_ terms. The handle is the client's: whatever is
 * wrong with it is QL_EINVAL and leaves the device in service. */
static int ipc_error(ze_result_t r) {
  switch (r) {
  case ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY:
  case ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY:
    return QL_ENOMEM;
  case ZE_RESULT_ERROR_UNSUPPORTED_FEATURE:
  case ZE_RESULT_ERROR_UNINITIALIZED:
    return QL_ENOTSUP;
  case ZE_RESULT_ERROR_DEVICE_LOST:
    return QL_EDEVICE;
  default:
    return QL_EINVAL;
  }
}

/*
 * registry.h ipc_open_fd: the driver must say it has memory IPC
 * (zeDriverGetIpcProperties). What is opened is this process's
 * descriptor number in the handle's first 8 bytes, where dma-buf drivers
 * keep it (as a uint64), and zeros after it: of the client's handle only
 * its length counts. The bytes after the descriptor are the exporting
 * driver's own, and a client can write anything there. In Intel's
 * compute-runtime (IpcMemoryData and IpcOpaqueMemoryData, in
 * level_zero/core/source/context/context.h) bytes 8..15 are a pool offset
 * that Context::openIpcMemHandle adds to the imported pointer unchecked,
 * so a chosen offset would make the import another allocation of this
 * process; after it come the memory type and, in the opaque layout, the
 * exporter's process id (its descriptor is taken with pidfd_getfd), a
 * second copy of the descriptor and reserved bytes. Zero in every one of
 * them means: no offset, device memory, this process's own descriptor.
 * The opened pointer must then be the base of its allocation
 * (zeMemGetAddressRange), whose size bounds every slice; anything else is
 * refused and closed by the pointer the open returned, which ipc_close
 * is given too.
 * Called from the loop thread without the device's lock: the calls take
 * the context only, which Level Zero allows from any thread.
 */
static int ipc_open_fd(int o, int fd, const void *handle, size_t len,
                       void **base, uint64_t *size) {
  zdev *d = device_of(o);
  ze_driver_ipc_properties_t props = {
      .stype = ZE_STRUCTURE_TYPE_DRIVER_IPC_PROPERTIES};
  ze_ipc_mem_handle_t h;
  uint64_t word = (uint64_t)fd;
  void *p = NULL, *b = NULL;
  size_t sz = 0;
  ze_result_t r;

  if (d == NULL || handle == NULL || fd < 0 || len != sizeof h.data)
    return QL_EINVAL;
  if (atomic_load(&d->failed))
    return QL_EDEVICE;
  if (zeDriverGetIpcProperties(d->drv, &props) != ZE_RESULT_SUCCESS ||
      !(props.flags & ZE_IPC_PROPERTY_FLAG_MEMORY))
    return QL_ENOTSUP;
  memset(h.data, 0, sizeof h.data);
  memcpy(h.data, &word, sizeof word);
  if ((r = zeMemOpenIpcHandle(d->ctx, d->dev, h, 0, &p)) != ZE_RESULT_SUCCESS)
    return ipc_error(r);
  r = zeMemGetAddressRange(d->ctx, p, &b, &sz);
  if (r != ZE_RESULT_SUCCESS || b != p || sz == 0) {
    (void)refused(zeMemCloseIpcHandle(d->ctx, p));
    return r != ZE_RESULT_SUCCESS ? ipc_error(r) : QL_EINVAL;
  }
  *base = p;
  *size = (uint64_t)sz;
  return 0;
}

/* base: what ipc_open_fd gave, the pointer zeMemOpenIpcHandle returned. */
static int ipc_close(int o, void *base) {
  zdev *d = device_of(o);
  ze_result_t r;
  if (d == NULL || base == NULL)
    return QL_EINVAL;
  r = zeMemCloseIpcHandle(d->ctx, base);
  return r == ZE_RESULT_SUCCESS ? 0 : ipc_error(r);
}

static int linear_dev_supports(const ql_kernel_impl *im) {
  return im->op == QL_OP_LINEAR_WO || im->op == QL_OP_LINEAR_AQ;
}

/* registry.h linear_dev: the same pipeline as run_wo / run_aq, x copied
 * from and y to device memory on the device. Level Zero imports carry no
 * ready event: the client synchronises before it sends the request. */
static int linear_dev(const ql_kernel_impl *im, const ql_linear_dev_args *a) {
  if (a == NULL || a->ready != NULL)
    return QL_EINVAL;
  if (im->op == QL_OP_LINEAR_WO)
    return wo_where(&a->a, a->where);
  if (im->op == QL_OP_LINEAR_AQ)
    return aq_where(&a->a, a->where);
  return QL_ENOTSUP;
}

static const ql_kernel_impl impls[] = {
    {.name = "ze.repack",
     .op = QL_OP_REPACK,
     .formats = FMTS_WO,
     .dtypes = QL_ALL_DTYPES,
     .fn.repack = repack,
     .free_packed = free_packed},
    {.name = "ze.linear_wo",
     .op = QL_OP_LINEAR_WO,
     .formats = FMTS_WO,
     .dtypes = QL_ALL_DTYPES,
     .fn.linear = run_wo},
    {.name = "ze.linear_aq",
     .op = QL_OP_LINEAR_AQ,
     .formats = FMTS_AQ,
     .dtypes = QL_ALL_DTYPES,
     .supports = supports_aq,
     .fn.linear = run_aq},
    {.name = "ze.quantize_rows",
     .op = QL_OP_QUANTIZE_ROWS,
     .formats = FMTS_QROWS,
     .dtypes = QL_ALL_DTYPES,
     .fn.quantize_rows = run_qrows},
};

const ql_backend ql__backend_ze = {.name = "ze",
                                   .impls = impls,
                                   .n_impls = sizeof impls / sizeof impls[0],
                                   .configure = configure,
                                   .device_count = device_count,
                                   .device_info = device_info,
                                   .device_bind = device_bind,
                                   .device_error = device_error,
                                   .ipc_handle_bytes = ZE_MAX_IPC_HANDLE_SIZE,
                                   .ipc_open_fd = ipc_open_fd,
                                   .ipc_close = ipc_close,
                                   .linear_dev_supports = linear_dev_supports,
                                   .linear_dev = linear_dev};
