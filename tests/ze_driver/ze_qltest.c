/*
 * ze_qltest.c - libze_qltest.so, a Level Zero test driver that runs the ze
 * kernels on the CPU through OpenCL and PoCL, so that the ze backend's host
 * code runs end to end in 'make check' (DESIGN §9).
 *
 * The Level Zero loader picks it up through ZE_ENABLE_ALT_DRIVERS (a path
 * or a comma-separated list of paths, dlopen'ed in place of the installed
 * drivers) and fills its dispatch tables by calling the exported
 * zeGet*ProcAddrTable functions of ze_ddi.h; with ZE_ENABLE_VALIDATION_LAYER=1
 * the validation layer sits between the loader and these tables. Those
 * functions are the only symbols exported (-fvisibility=hidden). Entries
 * of the API subset the ze backend uses are filled, every other entry is
 * NULL, which the loader and the validation layer answer with
 * ZE_RESULT_ERROR_UNSUPPORTED_FEATURE.
 *
 * What it models:
 *  - one driver with QL_ZE_TEST_DEVICES GPU devices (default 1, at most 8),
 *    all backed by the first OpenCL device (PoCL's CPU device), each with
 *    QL_ZE_TEST_MEM bytes of device memory (default 1 GiB) accounted on
 *    zeMemAllocDevice: the budget is what makes ZE_RESULT_ERROR_OUT_OF_-
 *    DEVICE_MEMORY happen. It reports one sub-group size, 1, so a host picks
 *    the kernels' local-memory variant ("lm"; PoCL 3.1 has no sub-groups).
 *  - device memory: a memfd per allocation, mapped; host memory: anonymous
 *    mappings. Kernel pointer arguments go to OpenCL as SVM pointers
 *    (clSetKernelArgSVMPointer), which PoCL's CPU device takes at any
 *    address, so base + offset pointers work as on a GPU. The memfd is
 *    what an IPC handle carries (below).
 *  - modules: zeModuleCreate takes only the SPIR-V modules embedded in
 *    libqlkernels (kernels/ze/spirv_modules.c, ze_spirv.h), recognised by
 *    their bytes, and builds the "lm" variant from the same .cl source with
 *    OpenCL C 1.2, adding the build flags' "-cl-*" options (and ignoring
 *    "-ze-*" ones), then QL_ZE_TEST_BUILD_OPTIONS, read at each build: extra
 *    OpenCL build options for tests, such as the -DQL_ZE_MUT_* flags that
 *    select the kernels' mutants (tests/conformance/test_ze_mutants.sh);
 *    programs are cached by their options, so a change builds anew. Any
 *    other module
 *    is ZE_RESULT_ERROR_INVALID_NATIVE_BINARY; the "sg" variant fails to
 *    build (ZE_RESULT_ERROR_MODULE_BUILD_FAILURE), as it would on a device
 *    without sub-groups of 16.
 *  - immediate command lists: each has a worker thread that runs its
 *    commands in order (kernels on its own OpenCL queue, copies and fills
 *    with memcpy/memset); a command first waits for its wait events and
 *    then signals its event. Synchronous mode returns from an append only
 *    when the command has run.
 *  - events: host-visible, signalled by the worker, waited for with
 *    zeEventHostSynchronize (ZE_RESULT_NOT_READY when the timeout passes).
 *  - IPC: the 64-byte handle is laid out as Intel's compute-runtime lays
 *    out its own (IpcMemoryData): the allocation's memfd as a uint64 in
 *    the first 8 bytes, as dma-buf drivers put their file descriptor
 *    there, a pool offset in bytes 8..15 (0: this driver pools nothing)
 *    and the memory type in byte 16 (0, device memory); zeros after. A
 *    process that receives the descriptor (SCM_RIGHTS, or across fork)
 *    writes its own number of it into the first 8 bytes before
 *    zeMemOpenIpcHandle. Opening takes the descriptor only if it is a
 *    memfd of this driver, maps the whole file (its size is the
 *    allocation's) without taking the descriptor over, and returns the
 *    mapping plus the handle's pool offset, unchecked, as compute-runtime
 *    does (Context::openIpcMemHandle); zeMemCloseIpcHandle closes the
 *    import that holds the pointer, found by address as compute-runtime
 *    finds it, and refuses memory that is not an import.
 *    QL_ZE_TEST_IPC=0 makes zeDriverGetIpcProperties advertise no memory
 *    IPC (the handle calls still work), as a driver without it would;
 *    QL_ZE_TEST_IPC_SHIFT=<bytes> adds that many bytes to every pointer
 *    zeMemOpenIpcHandle returns, as a driver whose import does not start
 *    at the base of its allocation would.
 *  - faults: QL_ZE_TEST_FAULT="<dev>:<after>:<kind>[,...]" with kind hang,
 *    lost or oom, as QL_EMU_CUDA_FAULT of the CUDA emulator: after <after>
 *    more appended commands on device <dev>, "hang" stops it (later
 *    commands never run, their events never signal, waits time out) and
 *    "lost" makes later appends, allocations, command list creation and
 *    waits for events it no longer signals return ZE_RESULT_ERROR_DEVICE_-
 *    LOST. Destroy and free calls still release and succeed then. "oom"
 *    makes the next append, once, return ZE_RESULT_ERROR_OUT_OF_DEVICE_-
 *    MEMORY without queueing anything; it can be armed with a hang or a
 *    loss of the same device.
 *
 * Everything is thread-safe: one mutex (g.mu) guards every table, event and
 * queue, with one condition variable for every state change (a test
 * driver's scale); a kernel's OpenCL arguments are set and enqueued under
 * its own mutex. Errors that a real driver would report only through a
 * result code are also written to stderr, prefixed "ze_qltest:", so that a
 * failing test says which call and why.
 */
#define CL_TARGET_OPENCL_VERSION 200
#include <CL/cl.h>
#include <errno.h>
#include <level_zero/ze_api.h>
#include <level_zero/ze_ddi.h>
#include <level_zero/zes_ddi.h>
#include <level_zero/zet_ddi.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ze/ze_spirv.h"

#ifndef QL_ZE_KERNEL_DIR
#error "QL_ZE_KERNEL_DIR: the directory of the .cl sources (Makefile.am)"
#endif

#define MAX_DEVICES 8
#define DEFAULT_MEM (1ull << 30)
/* A tag in every object, so a stale or foreign handle is refused rather
 * than followed (the validation layer's handle checks catch most first). */
#define TAG_DEVICE 0x7a640001u
#define TAG_CONTEXT 0x7a640002u
#define TAG_LIST 0x7a640003u
#define TAG_POOL 0x7a640004u
#define TAG_EVENT 0x7a640005u
#define TAG_MODULE 0x7a640006u
#define TAG_LOG 0x7a640007u
#define TAG_KERNEL 0x7a640008u
#define TAG_DEAD 0xdeadbeefu
/* the name of every device allocation's memfd, which is how
 * zeMemOpenIpcHandle knows a descriptor for one */
#define MEMFD_NAME "ql-ze-test"

#define PAGE 4096u
#define MAX_FILL_PATTERN 128u
#define MAX_SCALAR_ARG 64u

enum { FAULT_NONE, FAULT_HANG, FAULT_LOST, FAULT_OOM };

typedef struct zdevice {
  uint32_t tag;
  int index;
  uint64_t mem_total, mem_used;
  /* faults (the comment at the top) */
  long seq;      /* commands appended so far */
  long fault_at; /* seq at which the armed fault strikes */
  int fault_kind, armed;
  int hung, lost;
  long stop_seq; /* commands numbered above it do not run */
  long oom_at;   /* "oom": the append after this many fails, once */
  int oom_armed;
} zdevice;

typedef struct zcontext {
  uint32_t tag;
} zcontext;

/* One mapping: device memory (own memfd, or imported through IPC) or host
 * memory. */
typedef struct zalloc {
  char *base;
  size_t size;   /* as asked for */
  size_t mapped; /* bytes mapped (size rounded up to pages) */
  int fd;        /* memfd of device memory, -1 otherwise */
  int imported;  /* opened from an IPC handle: closed, not freed */
  ze_memory_type_t type;
  zdevice *dev; /* NULL for host memory */
  uint64_t id;
} zalloc;

typedef struct zevent zevent;

typedef struct zpool {
  uint32_t tag;
  uint32_t count;
  zevent **slots; /* [count], the live event of each index */
} zpool;

struct zevent {
  uint32_t tag;
  zpool *pool;
  uint32_t index;
  int signaled;
  zdevice *dev; /* the device of the last command given it to signal */
  long seq;     /* that command's number on dev */
  int pending;  /* that command has not run yet */
  int refs;     /* queued commands that name it */
  int dead;     /* destroyed; freed when refs drops to 0 */
};

typedef struct zbuild_log {
  uint32_t tag;
  char *text;
} zbuild_log;

/* A program built from one embedded module's source, shared by every
 * zeModuleCreate of the same module with the same options. */
typedef struct zprog {
  size_t module; /* index into ql__ze_modules */
  char *options;
  cl_program prog;
  struct zprog *next;
} zprog;

typedef struct zmodule {
  uint32_t tag;
  zprog *p;
  zdevice *dev;
} zmodule;

enum { ARG_UNSET, ARG_SCALAR, ARG_POINTER };

typedef struct zarg {
  int kind; /* ARG_* as set */
  size_t size;
  unsigned char value[MAX_SCALAR_ARG]; /* the pointer value for pointers */
} zarg;

typedef struct zkernel {
  uint32_t tag;
  size_t module; /* index into ql__ze_modules */
  int refs;      /* queued commands that launch it; g.mu */
  int dead;      /* destroyed; freed when refs drops to 0 */
  cl_kernel k;
  pthread_mutex_t mu; /* k's OpenCL arguments, from set to enqueue */
  cl_uint nargs;
  int *is_pointer; /* [nargs]: a __global or __constant pointer */
  zarg *args;      /* [nargs] */
  size_t reqd[3];  /* reqd_work_group_size, zeros when none */
  uint32_t group[3];
  int group_set;
} zkernel;

enum { C_COPY, C_FILL, C_LAUNCH, C_BARRIER, C_SIGNAL, C_WAIT, C_RESET };

typedef struct zcmd {
  int type;
  int runs; /* 0: after a hang or loss, never runs */
  int held; /* queued: holds its kernel and events (ref_cmd) */
  void *dst;
  const void *src;
  size_t size;
  unsigned char pattern[MAX_FILL_PATTERN];
  size_t psize;
  zkernel *kernel;
  zarg *args; /* the kernel's arguments at append, [kernel->nargs] */
  size_t global[3], local[3];
  zevent *signal, *reset;
  uint32_t nwait;
  zevent **wait;
  long number; /* in its list */
  struct zcmd *next;
} zcmd;

typedef struct zlist {
  uint32_t tag;
  zdevice *dev;
  int sync;
  cl_command_queue q;
  pthread_t thread;
  int thread_started;
  zcmd *head, *tail;
  long appended, done;
  int stop;
} zlist;

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* every change of an event, queue or list */
  pthread_mutex_t build_mu;
  ze_result_t init_rc;
  int ndevices;
  int no_ipc; /* QL_ZE_TEST_IPC=0: the driver advertises no memory IPC */
  uint64_t ipc_shift; /* QL_ZE_TEST_IPC_SHIFT */
  zdevice devices[MAX_DEVICES];
  cl_device_id cl_dev;
  cl_context cl_ctx;
  zalloc **allocs; /* live mappings, unordered */
  size_t nallocs, cap_allocs;
  uint64_t next_id;
  zprog *progs;
  const char *kernel_dir;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER,
       .build_mu = PTHREAD_MUTEX_INITIALIZER,
       .init_rc = ZE_RESULT_ERROR_UNINITIALIZED};

/* The one driver handle: its address is all that is needed. */
static const uint32_t driver_tag = 0x7a640000u;
#define DRIVER_HANDLE ((ze_driver_handle_t)(uintptr_t)&driver_tag)

__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("ze_qltest: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* ---- handles ---- */

static zdevice *get_device(ze_device_handle_t h) {
  zdevice *d = (zdevice *)h;
  if (d == NULL || d < g.devices || d >= g.devices + g.ndevices ||
      d->tag != TAG_DEVICE)
    return NULL;
  return d;
}

/* Every live object's address. A handle is followed only when it is in
 * here, so a destroyed or foreign handle is refused rather than read
 * (without the validation layer's handle checks too). */
static struct {
  pthread_mutex_t mu;
  void **v;
  size_t n, cap;
} live = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};

static int live_add(void *o) {
  int ok = 1;
  pthread_mutex_lock(&live.mu);
  if (live.n == live.cap) {
    size_t cap = live.cap ? 2 * live.cap : 64;
    void **v = realloc(live.v, cap * sizeof *v);
    if (v == NULL)
      ok = 0;
    else {
      live.v = v;
      live.cap = cap;
    }
  }
  if (ok)
    live.v[live.n++] = o;
  pthread_mutex_unlock(&live.mu);
  return ok;
}

static void live_del(void *o) {
  pthread_mutex_lock(&live.mu);
  for (size_t i = 0; i < live.n; i++)
    if (live.v[i] == o) {
      live.v[i] = live.v[--live.n];
      break;
    }
  pthread_mutex_unlock(&live.mu);
}

static int live_has(const void *o) {
  int found = 0;
  pthread_mutex_lock(&live.mu);
  for (size_t i = 0; i < live.n && !found; i++)
    found = live.v[i] == o;
  pthread_mutex_unlock(&live.mu);
  return found;
}

#define CHECKED(type, tagv)                                                    \
  static type *get_##type(void *h) {                                           \
    type *o = h;                                                               \
    return o != NULL && live_has(o) && o->tag == (tagv) ? o : NULL;            \
  }
CHECKED(zcontext, TAG_CONTEXT)
CHECKED(zlist, TAG_LIST)
CHECKED(zpool, TAG_POOL)
CHECKED(zevent, TAG_EVENT)
CHECKED(zmodule, TAG_MODULE)
CHECKED(zbuild_log, TAG_LOG)
CHECKED(zkernel, TAG_KERNEL)

static int driver_ok(ze_driver_handle_t h) { return h == DRIVER_HANDLE; }

/* ---- zeInit ---- */

static int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
  char *end;
  unsigned long long v;
  if (s == NULL || *s == '\0' || *s == '-')
    return 0;
  errno = 0;
  v = strtoull(s, &end, 0);
  if (errno != 0 || *end != '\0' || v < lo || v > hi)
    return 0;
  *out = v;
  return 1;
}

/* Arms the faults of "<dev>:<after>:<kind>[,...]"; 0 when malformed. */
static int parse_faults(const char *spec) {
  char *copy = strdup(spec), *save = NULL, *item;
  int ok = 1;

  if (copy == NULL)
    return 0;
  for (item = strtok_r(copy, ",", &save); item != NULL && ok;
       item = strtok_r(NULL, ",", &save)) {
    char *c1 = strchr(item, ':'), *c2 = c1 != NULL ? strchr(c1 + 1, ':') : NULL;
    uint64_t dev, after;
    int kind;
    if (c2 == NULL) {
      ok = 0;
      break;
    }
    *c1 = *c2 = '\0';
    if (strcmp(c2 + 1, "hang") == 0)
      kind = FAULT_HANG;
    else if (strcmp(c2 + 1, "lost") == 0)
      kind = FAULT_LOST;
    else if (strcmp(c2 + 1, "oom") == 0)
      kind = FAULT_OOM;
    else
      kind = FAULT_NONE;
    if (kind == FAULT_NONE || !parse_u64(item, 0, MAX_DEVICES - 1, &dev) ||
        !parse_u64(c1 + 1, 0, LONG_MAX / 2, &after)) {
      ok = 0;
      break;
    }
    if (kind == FAULT_OOM) {
      /* apart from a hang or loss, so that both can be armed */
      g.devices[dev].oom_armed = 1;
      g.devices[dev].oom_at = (long)after;
      continue;
    }
    g.devices[dev].armed = 1;
    g.devices[dev].fault_kind = kind;
    g.devices[dev].fault_at = (long)after;
  }
  free(copy);
  return ok;
}

/* Strikes d's armed fault once its time has come; g.mu held. */
static void trigger(zdevice *d) {
  if (!d->armed || d->seq < d->fault_at)
    return;
  d->armed = 0;
  d->stop_seq = d->seq;
  if (d->fault_kind == FAULT_HANG)
    d->hung = 1;
  else
    d->lost = 1;
}

static void init_once(void) {
  cl_platform_id plats[16];
  cl_uint np = 0;
  cl_int err;
  uint64_t v;
  const char *s;

  {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g.cv, &ca);
    pthread_condattr_destroy(&ca);
  }
  g.ndevices = 1;
  if ((s = getenv("QL_ZE_TEST_DEVICES")) != NULL) {
    if (!parse_u64(s, 0, MAX_DEVICES, &v)) {
      say("QL_ZE_TEST_DEVICES=%s: not a number of devices 0..%d", s,
          MAX_DEVICES);
      return;
    }
    g.ndevices = (int)v;
  }
  v = DEFAULT_MEM;
  if ((s = getenv("QL_ZE_TEST_MEM")) != NULL &&
      !parse_u64(s, PAGE, UINT64_MAX / 2, &v)) {
    say("QL_ZE_TEST_MEM=%s: not a number of bytes (at least %u)", s, PAGE);
    return;
  }
  for (int i = 0; i < MAX_DEVICES; i++) {
    g.devices[i].tag = TAG_DEVICE;
    g.devices[i].index = i;
    g.devices[i].mem_total = v;
  }
  if ((s = getenv("QL_ZE_TEST_FAULT")) != NULL && !parse_faults(s)) {
    say("QL_ZE_TEST_FAULT=%s: not <dev>:<after>:hang|lost|oom[,...]", s);
    return;
  }
  for (int i = 0; i < MAX_DEVICES; i++)
    trigger(&g.devices[i]);
  g.no_ipc = (s = getenv("QL_ZE_TEST_IPC")) != NULL && strcmp(s, "0") == 0;
  if ((s = getenv("QL_ZE_TEST_IPC_SHIFT")) != NULL &&
      !parse_u64(s, 0, UINT32_MAX, &g.ipc_shift)) {
    say("QL_ZE_TEST_IPC_SHIFT=%s: not a number of bytes", s);
    return;
  }
  g.kernel_dir = getenv("QL_ZE_TEST_KERNEL_DIR");
  if (g.kernel_dir == NULL)
    g.kernel_dir = QL_ZE_KERNEL_DIR;

  err = clGetPlatformIDs(16, plats, &np);
  if (err != CL_SUCCESS)
    np = 0;
  for (cl_uint i = 0; i < np && i < 16; i++)
    if (clGetDeviceIDs(plats[i], CL_DEVICE_TYPE_ALL, 1, &g.cl_dev, NULL) ==
        CL_SUCCESS)
      break;
    else
      g.cl_dev = NULL;
  if (g.cl_dev == NULL) {
    say("no OpenCL device: the test driver runs kernels on PoCL "
        "(pocl-opencl-icd)");
    return;
  }
  g.cl_ctx = clCreateContext(NULL, 1, &g.cl_dev, NULL, NULL, &err);
  if (err != CL_SUCCESS) {
    say("clCreateContext: error %d", (int)err);
    return;
  }
  g.init_rc = ZE_RESULT_SUCCESS;
}

static ze_result_t drv_init(ze_init_flags_t flags) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  if (flags != 0 && !(flags & ZE_INIT_FLAG_GPU_ONLY))
    return ZE_RESULT_ERROR_UNINITIALIZED; /* a VPU is asked for */
  pthread_once(&once, init_once);
  return g.init_rc;
}

/* ---- driver and devices ---- */

static ze_result_t drv_driver_get(uint32_t *pCount,
                                  ze_driver_handle_t *phDrivers) {
  if (pCount == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (g.init_rc != ZE_RESULT_SUCCESS)
    return ZE_RESULT_ERROR_UNINITIALIZED;
  if (*pCount == 0 || phDrivers == NULL) {
    *pCount = 1;
    return ZE_RESULT_SUCCESS;
  }
  *pCount = 1;
  phDrivers[0] = DRIVER_HANDLE;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_api_version(ze_driver_handle_t h,
                                   ze_api_version_t *version) {
  if (!driver_ok(h))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (version == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  *version = ZE_API_VERSION_CURRENT;
  return ZE_RESULT_SUCCESS;
}

static void fill_uuid(uint8_t *out, size_t n, int kind, int index) {
  static const char base[] = "qlinear-zetest";
  memset(out, 0, n);
  memcpy(out, base, sizeof base - 1 < n ? sizeof base - 1 : n);
  out[n - 2] = (uint8_t)kind;
  out[n - 1] = (uint8_t)index;
}

static ze_result_t drv_driver_props(ze_driver_handle_t h,
                                    ze_driver_properties_t *p) {
  if (!driver_ok(h))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (p == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  fill_uuid(p->uuid.id, ZE_MAX_DRIVER_UUID_SIZE, 'd', 0);
  p->driverVersion = 1;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_ipc_props(ze_driver_handle_t h,
                                 ze_driver_ipc_properties_t *p) {
  if (!driver_ok(h))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (p == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  p->flags = g.no_ipc ? 0 : ZE_IPC_PROPERTY_FLAG_MEMORY;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_device_get(ze_driver_handle_t h, uint32_t *pCount,
                                  ze_device_handle_t *phDevices) {
  uint32_t n;
  if (!driver_ok(h))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (pCount == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (*pCount == 0 || phDevices == NULL) {
    *pCount = (uint32_t)g.ndevices;
    return ZE_RESULT_SUCCESS;
  }
  n = *pCount < (uint32_t)g.ndevices ? *pCount : (uint32_t)g.ndevices;
  for (uint32_t i = 0; i < n; i++)
    phDevices[i] = (ze_device_handle_t)&g.devices[i];
  *pCount = n;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_device_props(ze_device_handle_t h,
                                    ze_device_properties_t *p) {
  zdevice *d = get_device(h);
  if (d == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (p == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  p->type = ZE_DEVICE_TYPE_GPU;
  p->vendorId = 0x8086;
  p->deviceId = 0;
  p->flags = 0;
  p->subdeviceId = 0;
  p->coreClockRate = 1000;
  p->maxMemAllocSize = d->mem_total;
  p->maxHardwareContexts = 64;
  p->maxCommandQueuePriority = 0;
  p->numThreadsPerEU = 1;
  p->physicalEUSimdWidth = 1;
  p->numEUsPerSubslice = 1;
  p->numSubslicesPerSlice = 1;
  p->numSlices = 1;
  p->timerResolution = 1;
  p->timestampValidBits = 64;
  p->kernelTimestampValidBits = 64;
  fill_uuid(p->uuid.id, ZE_MAX_DEVICE_UUID_SIZE, 'g', d->index);
  snprintf(p->name, sizeof p->name, "qlinear ze test device %d (PoCL)",
           d->index);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_compute_props(ze_device_handle_t h,
                                     ze_device_compute_properties_t *p) {
  if (get_device(h) == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (p == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  p->maxTotalGroupSize = 1024;
  p->maxGroupSizeX = 1024;
  p->maxGroupSizeY = 1024;
  p->maxGroupSizeZ = 1024;
  p->maxGroupCountX = UINT32_MAX;
  p->maxGroupCountY = UINT32_MAX;
  p->maxGroupCountZ = UINT32_MAX;
  p->maxSharedLocalMemory = 64 * 1024;
  /* no sub-groups of 16: the host takes the local-memory kernels */
  memset(p->subGroupSizes, 0, sizeof p->subGroupSizes);
  p->numSubGroupSizes = 1;
  p->subGroupSizes[0] = 1;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_module_props(ze_device_handle_t h,
                                    ze_device_module_properties_t *p) {
  if (get_device(h) == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (p == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  p->spirvVersionSupported = ZE_MAKE_VERSION(1, 2);
  p->flags = ZE_DEVICE_MODULE_FLAG_FP16 | ZE_DEVICE_MODULE_FLAG_INT64_ATOMICS;
  p->fp16flags = ZE_DEVICE_FP_FLAG_ROUND_TO_NEAREST | ZE_DEVICE_FP_FLAG_INF_NAN;
  p->fp32flags = ZE_DEVICE_FP_FLAG_ROUND_TO_NEAREST | ZE_DEVICE_FP_FLAG_INF_NAN |
                 ZE_DEVICE_FP_FLAG_DENORM |
                 ZE_DEVICE_FP_FLAG_ROUNDED_DIVIDE_SQRT;
  p->fp64flags = 0;
  p->maxArgumentsSize = 1024;
  p->printfBufferSize = 0;
  memset(&p->nativeKernelSupported, 0, sizeof p->nativeKernelSupported);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_memory_props(ze_device_handle_t h, uint32_t *pCount,
                                    ze_device_memory_properties_t *p) {
  zdevice *d = get_device(h);
  if (d == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (pCount == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (*pCount == 0 || p == NULL) {
    *pCount = 1;
    return ZE_RESULT_SUCCESS;
  }
  *pCount = 1;
  p->flags = 0;
  p->maxClockRate = 0;
  p->maxBusWidth = 64;
  p->totalSize = d->mem_total;
  snprintf(p->name, sizeof p->name, "memfd");
  return ZE_RESULT_SUCCESS;
}

/* ---- contexts ---- */

static ze_result_t drv_context_create(ze_driver_handle_t h,
                                      const ze_context_desc_t *desc,
                                      ze_context_handle_t *ph) {
  zcontext *c;
  if (!driver_ok(h))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == NULL || ph == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if ((c = calloc(1, sizeof *c)) == NULL)
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  c->tag = TAG_CONTEXT;
  if (!live_add(c)) {
    free(c);
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  }
  *ph = (ze_context_handle_t)c;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_context_destroy(ze_context_handle_t h) {
  zcontext *c = get_zcontext(h);
  if (c == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  live_del(c);
  c->tag = TAG_DEAD;
  free(c);
  return ZE_RESULT_SUCCESS;
}

/* ---- memory ---- */

/* The mapping holding [p, p + n), or NULL; g.mu held. With n == 0 only p
 * itself must lie inside. */
static zalloc *find_alloc(const void *p, size_t n) {
  uintptr_t a = (uintptr_t)p;
  for (size_t i = 0; i < g.nallocs; i++) {
    zalloc *z = g.allocs[i];
    uintptr_t b = (uintptr_t)z->base;
    if (a >= b && a - b < z->size)
      return n <= z->size - (a - b) ? z : NULL;
  }
  return NULL;
}

/* Adds z to the table; g.mu held. */
static int add_alloc(zalloc *z) {
  if (g.nallocs == g.cap_allocs) {
    size_t cap = g.cap_allocs ? 2 * g.cap_allocs : 64;
    zalloc **n = realloc(g.allocs, cap * sizeof *n);
    if (n == NULL)
      return 0;
    g.allocs = n;
    g.cap_allocs = cap;
  }
  z->id = ++g.next_id;
  g.allocs[g.nallocs++] = z;
  return 1;
}

static void remove_alloc(zalloc *z) {
  for (size_t i = 0; i < g.nallocs; i++)
    if (g.allocs[i] == z) {
      g.allocs[i] = g.allocs[--g.nallocs];
      return;
    }
}

static void free_mapping(zalloc *z) {
  if (z == NULL)
    return;
  if (z->base != NULL)
    munmap(z->base, z->mapped);
  if (z->fd >= 0 && !z->imported)
    close(z->fd);
  free(z);
}

static ze_result_t check_alloc_args(size_t size, size_t alignment) {
  if (size == 0 || size > SIZE_MAX - PAGE)
    return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
  if (alignment != 0 && (alignment & (alignment - 1)) != 0)
    return ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT;
  /* mappings are page-aligned; more would need over-allocation */
  if (alignment > PAGE)
    return ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_alloc_device(ze_context_handle_t hc,
                                    const ze_device_mem_alloc_desc_t *desc,
                                    size_t size, size_t alignment,
                                    ze_device_handle_t hd, void **pptr) {
  zdevice *d = get_device(hd);
  zalloc *z = NULL;
  ze_result_t rc;
  int reserved = 0;

  if (get_zcontext(hc) == NULL || d == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == NULL || pptr == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if ((rc = check_alloc_args(size, alignment)) != ZE_RESULT_SUCCESS)
    return rc;
  pthread_mutex_lock(&g.mu);
  rc = d->lost ? ZE_RESULT_ERROR_DEVICE_LOST
               : d->mem_total - d->mem_used < size
                     ? ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY
                     : ZE_RESULT_SUCCESS;
  if (rc == ZE_RESULT_SUCCESS) {
    d->mem_used += size;
    reserved = 1;
  }
  pthread_mutex_unlock(&g.mu);
  if (rc != ZE_RESULT_SUCCESS)
    return rc;
  rc = ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  if ((z = calloc(1, sizeof *z)) == NULL)
    goto fail;
  z->fd = -1;
  z->size = size;
  z->mapped = (size + PAGE - 1) / PAGE * PAGE;
  z->type = ZE_MEMORY_TYPE_DEVICE;
  z->dev = d;
  /* the file is the allocation's size: an importer maps all of it */
  if ((z->fd = memfd_create(MEMFD_NAME, MFD_CLOEXEC)) < 0 ||
      ftruncate(z->fd, (off_t)size) != 0) {
    say("zeMemAllocDevice(%zu): memfd: %s", size, strerror(errno));
    goto fail;
  }
  z->base = mmap(NULL, z->mapped, PROT_READ | PROT_WRITE, MAP_SHARED, z->fd, 0);
  if (z->base == MAP_FAILED) {
    z->base = NULL;
    say("zeMemAllocDevice(%zu): mmap: %s", size, strerror(errno));
    goto fail;
  }
  pthread_mutex_lock(&g.mu);
  if (!add_alloc(z)) {
    pthread_mutex_unlock(&g.mu);
    goto fail;
  }
  pthread_mutex_unlock(&g.mu);
  *pptr = z->base;
  return ZE_RESULT_SUCCESS;
fail:
  free_mapping(z);
  if (reserved) {
    pthread_mutex_lock(&g.mu);
    d->mem_used -= size;
    pthread_mutex_unlock(&g.mu);
  }
  return rc;
}

static ze_result_t drv_alloc_host(ze_context_handle_t hc,
                                  const ze_host_mem_alloc_desc_t *desc,
                                  size_t size, size_t alignment, void **pptr) {
  zalloc *z;
  ze_result_t rc;

  if (get_zcontext(hc) == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == NULL || pptr == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if ((rc = check_alloc_args(size, alignment)) != ZE_RESULT_SUCCESS)
    return rc;
  if ((z = calloc(1, sizeof *z)) == NULL)
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  z->fd = -1;
  z->size = size;
  z->mapped = (size + PAGE - 1) / PAGE * PAGE;
  z->type = ZE_MEMORY_TYPE_HOST;
  z->base = mmap(NULL, z->mapped, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (z->base == MAP_FAILED) {
    z->base = NULL;
    free_mapping(z);
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  }
  pthread_mutex_lock(&g.mu);
  if (!add_alloc(z)) {
    pthread_mutex_unlock(&g.mu);
    free_mapping(z);
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  }
  pthread_mutex_unlock(&g.mu);
  *pptr = z->base;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_mem_free(ze_context_handle_t hc, void *ptr) {
  zalloc *z;
  if (get_zcontext(hc) == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (ptr == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  pthread_mutex_lock(&g.mu);
  z = find_alloc(ptr, 0);
  if (z == NULL || z->base != ptr || z->imported) {
    pthread_mutex_unlock(&g.mu);
    say("zeMemFree(%p): %s", ptr,
        z == NULL         ? "not an allocation"
        : z->imported     ? "opened from an IPC handle (zeMemCloseIpcHandle)"
                          : "not the base of its allocation");
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  remove_alloc(z);
  if (z->dev != NULL)
    z->dev->mem_used -= z->size;
  pthread_mutex_unlock(&g.mu);
  free_mapping(z);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_alloc_props(ze_context_handle_t hc, const void *ptr,
                                   ze_memory_allocation_properties_t *p,
                                   ze_device_handle_t *phDevice) {
  zalloc *z;
  if (get_zcontext(hc) == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (ptr == NULL || p == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  pthread_mutex_lock(&g.mu);
  z = find_alloc(ptr, 0);
  p->type = z != NULL ? z->type : ZE_MEMORY_TYPE_UNKNOWN;
  p->id = z != NULL ? z->id : 0;
  p->pageSize = z != NULL ? PAGE : 0;
  if (phDevice != NULL)
    *phDevice = z != NULL && z->dev != NULL ? (ze_device_handle_t)z->dev : NULL;
  pthread_mutex_unlock(&g.mu);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_address_range(ze_context_handle_t hc, const void *ptr,
                                     void **pBase, size_t *pSize) {
  zalloc *z;
  if (get_zcontext(hc) == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (ptr == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  pthread_mutex_lock(&g.mu);
  z = find_alloc(ptr, 0);
  if (z != NULL) {
    if (pBase != NULL)
      *pBase = z->base;
    if (pSize != NULL)
      *pSize = z->size;
  }
  pthread_mutex_unlock(&g.mu);
  return z != NULL ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_ARGUMENT;
}

static ze_result_t drv_get_ipc(ze_context_handle_t hc, const void *ptr,
                               ze_ipc_mem_handle_t *ph) {
  zalloc *z;
  uint64_t fdw;
  if (get_zcontext(hc) == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (ptr == NULL || ph == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  pthread_mutex_lock(&g.mu);
  z = find_alloc(ptr, 0);
  if (z == NULL || z->type != ZE_MEMORY_TYPE_DEVICE || z->imported) {
    pthread_mutex_unlock(&g.mu);
    say("zeMemGetIpcHandle(%p): not a device allocation of this process",
        ptr);
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  fdw = (uint64_t)z->fd;
  pthread_mutex_unlock(&g.mu);
  /* pool offset and memory type 0: the whole allocation, device memory */
  memset(ph->data, 0, sizeof ph->data);
  memcpy(ph->data, &fdw, sizeof fdw);
  return ZE_RESULT_SUCCESS;
}

/* 1 when fd is a memfd that zeMemAllocDevice made (in any process): its
 * link in /proc reads "/memfd:<name> (deleted)". */
static int is_our_memfd(int fd) {
  static const char want[] = "/memfd:" MEMFD_NAME " (";
  char path[64], target[256];
  ssize_t n;
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  n = readlink(path, target, sizeof target - 1);
  if (n < 0)
    return 0;
  target[n] = '\0';
  return strncmp(target, want, sizeof want - 1) == 0;
}

static ze_result_t drv_open_ipc(ze_context_handle_t hc, ze_device_handle_t hd,
                                ze_ipc_mem_handle_t handle,
                                ze_ipc_memory_flags_t flags, void **pptr) {
  zdevice *d = get_device(hd);
  uint64_t fdw, pool_off;
  struct stat st;
  zalloc *z;
  int fd;

  if (get_zcontext(hc) == NULL || d == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (pptr == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (flags & ~(ze_ipc_memory_flags_t)(ZE_IPC_MEMORY_FLAG_BIAS_CACHED |
                                       ZE_IPC_MEMORY_FLAG_BIAS_UNCACHED))
    return ZE_RESULT_ERROR_INVALID_ENUMERATION;
  memcpy(&fdw, handle.data, sizeof fdw);
  memcpy(&pool_off, handle.data + 8, sizeof pool_off);
  if (fdw > INT_MAX || handle.data[16] != 0) {
    say("zeMemOpenIpcHandle: not a handle of this driver's device memory");
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  fd = (int)fdw;
  /* the file says how much there is */
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
      !is_our_memfd(fd)) {
    say("zeMemOpenIpcHandle: descriptor %d is not the memory of a handle", fd);
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  if ((z = calloc(1, sizeof *z)) == NULL)
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  z->fd = fd;
  z->imported = 1;
  z->size = (size_t)st.st_size;
  z->mapped = (z->size + PAGE - 1) / PAGE * PAGE;
  z->type = ZE_MEMORY_TYPE_DEVICE;
  z->dev = d;
  z->base = mmap(NULL, z->mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (z->base == MAP_FAILED) {
    say("zeMemOpenIpcHandle: mmap: %s", strerror(errno));
    z->base = NULL;
    free_mapping(z);
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  pthread_mutex_lock(&g.mu);
  if (!add_alloc(z)) {
    pthread_mutex_unlock(&g.mu);
    free_mapping(z);
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  }
  pthread_mutex_unlock(&g.mu);
  /* the pool offset as compute-runtime adds it: unchecked, so that it can
   * point anywhere (uintptr_t: wrapping is what a driver's integer
   * arithmetic does) */
  *pptr = (void *)((uintptr_t)z->base + (uintptr_t)pool_off +
                   (uintptr_t)g.ipc_shift);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_close_ipc(ze_context_handle_t hc, const void *ptr) {
  zalloc *z;
  if (get_zcontext(hc) == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (ptr == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  pthread_mutex_lock(&g.mu);
  z = find_alloc(ptr, 0);
  if (z == NULL || !z->imported) {
    pthread_mutex_unlock(&g.mu);
    say("zeMemCloseIpcHandle(%p): %s", ptr,
        z == NULL ? "not an allocation" : "not opened from an IPC handle");
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  remove_alloc(z);
  pthread_mutex_unlock(&g.mu);
  free_mapping(z);
  return ZE_RESULT_SUCCESS;
}

/* ---- events ---- */

static ze_result_t drv_pool_create(ze_context_handle_t hc,
                                   const ze_event_pool_desc_t *desc,
                                   uint32_t ndev, ze_device_handle_t *phDevs,
                                   ze_event_pool_handle_t *ph) {
  zpool *p;
  if (get_zcontext(hc) == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == NULL || ph == NULL || (ndev > 0 && phDevs == NULL))
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  for (uint32_t i = 0; i < ndev; i++)
    if (get_device(phDevs[i]) == NULL)
      return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc->count == 0)
    return ZE_RESULT_ERROR_INVALID_SIZE;
  if (desc->flags & (ZE_EVENT_POOL_FLAG_IPC | ZE_EVENT_POOL_FLAG_KERNEL_TIMESTAMP))
    return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
  if ((p = calloc(1, sizeof *p)) == NULL ||
      (p->slots = calloc(desc->count, sizeof *p->slots)) == NULL) {
    free(p);
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  }
  p->tag = TAG_POOL;
  p->count = desc->count;
  if (!live_add(p)) {
    free(p->slots);
    free(p);
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  }
  *ph = (ze_event_pool_handle_t)p;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_pool_destroy(ze_event_pool_handle_t h) {
  zpool *p = get_zpool(h);
  if (p == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  pthread_mutex_lock(&g.mu);
  for (uint32_t i = 0; i < p->count; i++)
    if (p->slots[i] != NULL) {
      pthread_mutex_unlock(&g.mu);
      say("zeEventPoolDestroy: event %u still exists", i);
      return ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE;
    }
  p->tag = TAG_DEAD;
  pthread_mutex_unlock(&g.mu);
  live_del(p);
  free(p->slots);
  free(p);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_event_create(ze_event_pool_handle_t hp,
                                    const ze_event_desc_t *desc,
                                    ze_event_handle_t *ph) {
  zpool *p = get_zpool(hp);
  zevent *e;
  if (p == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == NULL || ph == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (desc->index >= p->count)
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  if ((e = calloc(1, sizeof *e)) == NULL)
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  e->tag = TAG_EVENT;
  e->pool = p;
  e->index = desc->index;
  if (!live_add(e)) {
    free(e);
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  }
  pthread_mutex_lock(&g.mu);
  if (p->slots[desc->index] != NULL) {
    pthread_mutex_unlock(&g.mu);
    live_del(e);
    free(e);
    say("zeEventCreate: index %u is taken", desc->index);
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  p->slots[desc->index] = e;
  pthread_mutex_unlock(&g.mu);
  *ph = (ze_event_handle_t)e;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_event_destroy(ze_event_handle_t h) {
  zevent *e = get_zevent(h);
  if (e == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  live_del(e);
  pthread_mutex_lock(&g.mu);
  e->pool->slots[e->index] = NULL;
  e->tag = TAG_DEAD;
  e->dead = 1;
  if (e->refs == 0)
    free(e);
  pthread_mutex_unlock(&g.mu);
  return ZE_RESULT_SUCCESS;
}

/* SUCCESS, NOT_READY or DEVICE_LOST for e now; g.mu held. */
static ze_result_t event_status(const zevent *e) {
  if (e->signaled)
    return ZE_RESULT_SUCCESS;
  /* commands numbered up to the loss still run and signal */
  if (e->dev != NULL && e->dev->lost &&
      !(e->pending && e->seq <= e->dev->stop_seq))
    return ZE_RESULT_ERROR_DEVICE_LOST;
  return ZE_RESULT_NOT_READY;
}

static ze_result_t drv_event_sync(ze_event_handle_t h, uint64_t timeout) {
  zevent *e = get_zevent(h);
  struct timespec dl;
  ze_result_t rc;

  if (e == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  clock_gettime(CLOCK_MONOTONIC, &dl);
  if (timeout != UINT64_MAX) {
    uint64_t ns = (uint64_t)dl.tv_nsec + timeout % 1000000000u;
    uint64_t s = (uint64_t)dl.tv_sec + timeout / 1000000000u + ns / 1000000000u;
    dl.tv_sec = s > (uint64_t)LONG_MAX ? LONG_MAX : (time_t)s;
    dl.tv_nsec = (long)(ns % 1000000000u);
  }
  pthread_mutex_lock(&g.mu);
  while ((rc = event_status(e)) == ZE_RESULT_NOT_READY && timeout != 0) {
    if (timeout == UINT64_MAX)
      pthread_cond_wait(&g.cv, &g.mu);
    else if (pthread_cond_timedwait(&g.cv, &g.mu, &dl) == ETIMEDOUT) {
      rc = event_status(e);
      break;
    }
  }
  pthread_mutex_unlock(&g.mu);
  return rc;
}

static ze_result_t drv_event_query(ze_event_handle_t h) {
  return drv_event_sync(h, 0);
}

static ze_result_t drv_event_reset(ze_event_handle_t h) {
  zevent *e = get_zevent(h);
  if (e == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  pthread_mutex_lock(&g.mu);
  e->signaled = 0;
  pthread_mutex_unlock(&g.mu);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_event_signal(ze_event_handle_t h) {
  zevent *e = get_zevent(h);
  if (e == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  pthread_mutex_lock(&g.mu);
  e->signaled = 1;
  pthread_cond_broadcast(&g.cv);
  pthread_mutex_unlock(&g.mu);
  return ZE_RESULT_SUCCESS;
}

/* ---- modules and kernels ---- */

/* The whole text of dir/name, NUL-terminated, or NULL. */
static char *read_file(const char *dir, const char *name) {
  char path[4096];
  FILE *f;
  char *buf = NULL;
  long len;

  snprintf(path, sizeof path, "%s/%s", dir, name);
  if ((f = fopen(path, "rb")) == NULL)
    return NULL;
  if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 &&
      fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)len + 1)) != NULL) {
    if (fread(buf, 1, (size_t)len, f) == (size_t)len) {
      buf[len] = '\0';
    } else {
      free(buf);
      buf = NULL;
    }
  }
  fclose(f);
  return buf;
}

static zbuild_log *new_log(const char *text) {
  zbuild_log *l = calloc(1, sizeof *l);
  if (l == NULL)
    return NULL;
  l->tag = TAG_LOG;
  if ((l->text = strdup(text != NULL ? text : "")) == NULL || !live_add(l)) {
    free(l->text);
    free(l);
    return NULL;
  }
  return l;
}

/* The OpenCL build options for the module's build flags, in *out (caller
 * frees); 0 and a reason in why when a flag is not one of ours. */
static int build_options(const char *flags, char **out, char *why,
                         size_t whylen) {
  const char *extra = getenv("QL_ZE_TEST_BUILD_OPTIONS");
  size_t cap = 4096 + strlen(g.kernel_dir) + (flags ? strlen(flags) : 0) +
               (extra ? strlen(extra) : 0);
  char *opt = malloc(cap), *copy = NULL, *save = NULL, *tok;
  int ok = 1;

  *out = NULL;
  if (opt == NULL)
    return 0;
  /* -cl-kernel-arg-info: the driver tells pointers from integers by it */
  snprintf(opt, cap, "-cl-std=CL1.2 -cl-kernel-arg-info -I%s", g.kernel_dir);
  if (flags != NULL && (copy = strdup(flags)) == NULL) {
    free(opt);
    return 0;
  }
  for (tok = copy ? strtok_r(copy, " \t", &save) : NULL; tok != NULL;
       tok = strtok_r(NULL, " \t", &save)) {
    if (strncmp(tok, "-cl-", 4) == 0) {
      strcat(opt, " ");
      strcat(opt, tok);
    } else if (strncmp(tok, "-ze-", 4) != 0) {
      snprintf(why, whylen, "unknown build flag '%s'", tok);
      ok = 0;
      break;
    }
  }
  free(copy);
  if (!ok) {
    free(opt);
    return 0;
  }
  /* test-only options (the mutants' -D flags), after the module's own */
  if (extra != NULL && *extra != '\0') {
    strcat(opt, " ");
    strcat(opt, extra);
  }
  *out = opt;
  return 1;
}

/* The program of module index mi built with options, building it the first
 * time; NULL with the build log in *log on failure. */
static zprog *get_prog(size_t mi, const char *options, char **log) {
  const ql__ze_module *m = &ql__ze_modules[mi];
  char name[256], *src = NULL;
  const char *s;
  zprog *p;
  cl_int err;

  *log = NULL;
  pthread_mutex_lock(&g.build_mu);
  for (p = g.progs; p != NULL; p = p->next)
    if (p->module == mi && strcmp(p->options, options) == 0)
      goto out;
  snprintf(name, sizeof name, "%s.cl", m->name);
  if ((src = read_file(g.kernel_dir, name)) == NULL) {
    char msg[4200];
    snprintf(msg, sizeof msg, "cannot read %s/%s (QL_ZE_TEST_KERNEL_DIR)",
             g.kernel_dir, name);
    *log = strdup(msg);
    goto out;
  }
  if ((p = calloc(1, sizeof *p)) == NULL ||
      (p->options = strdup(options)) == NULL)
    goto nomem;
  p->module = mi;
  s = src;
  p->prog = clCreateProgramWithSource(g.cl_ctx, 1, &s, NULL, &err);
  if (err != CL_SUCCESS)
    goto nomem;
  err = clBuildProgram(p->prog, 1, &g.cl_dev, options, NULL, NULL);
  if (err != CL_SUCCESS) {
    size_t n = 0;
    clGetProgramBuildInfo(p->prog, g.cl_dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &n);
    if ((*log = calloc(1, n + 64)) != NULL) {
      snprintf(*log, 64, "OpenCL build error %d:\n", (int)err);
      clGetProgramBuildInfo(p->prog, g.cl_dev, CL_PROGRAM_BUILD_LOG, n,
                            *log + strlen(*log), NULL);
    }
    goto fail;
  }
  p->next = g.progs;
  g.progs = p;
  goto out;
nomem:
  *log = strdup("out of host memory");
fail:
  if (p != NULL) {
    if (p->prog != NULL)
      clReleaseProgram(p->prog);
    free(p->options);
    free(p);
  }
  p = NULL;
out:
  pthread_mutex_unlock(&g.build_mu);
  free(src);
  return p;
}

static ze_result_t drv_module_create(ze_context_handle_t hc,
                                     ze_device_handle_t hd,
                                     const ze_module_desc_t *desc,
                                     ze_module_handle_t *ph,
                                     ze_module_build_log_handle_t *phLog) {
  zdevice *d = get_device(hd);
  size_t mi;
  char *options = NULL, *log = NULL, why[256] = "";
  zmodule *mod = NULL;
  zprog *p = NULL;
  ze_result_t rc;

  if (phLog != NULL)
    *phLog = NULL;
  if (get_zcontext(hc) == NULL || d == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == NULL || ph == NULL || desc->pInputModule == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (desc->format != ZE_MODULE_FORMAT_IL_SPIRV) {
    say("zeModuleCreate: only SPIR-V modules");
    return ZE_RESULT_ERROR_INVALID_NATIVE_BINARY;
  }
  if (desc->pConstants != NULL && desc->pConstants->numConstants > 0)
    return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
  for (mi = 0; mi < ql__ze_n_modules; mi++)
    if (ql__ze_modules[mi].size == desc->inputSize &&
        memcmp(ql__ze_modules[mi].spirv, desc->pInputModule,
               desc->inputSize) == 0)
      break;
  if (mi == ql__ze_n_modules) {
    say("zeModuleCreate: %zu bytes of SPIR-V that are not one of the "
        "embedded modules (ze_spirv.h)",
        desc->inputSize);
    return ZE_RESULT_ERROR_INVALID_NATIVE_BINARY;
  }
  rc = ZE_RESULT_ERROR_MODULE_BUILD_FAILURE;
  if (strcmp(ql__ze_modules[mi].variant, "lm") != 0) {
    snprintf(why, sizeof why,
             "module %s-%s: the device has no sub-groups of 16",
             ql__ze_modules[mi].name, ql__ze_modules[mi].variant);
    goto fail;
  }
  if (!build_options(desc->pBuildFlags, &options, why, sizeof why))
    goto fail;
  if ((p = get_prog(mi, options, &log)) == NULL)
    goto fail;
  rc = ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  if ((mod = calloc(1, sizeof *mod)) == NULL)
    goto fail;
  if (phLog != NULL && (*phLog = (ze_module_build_log_handle_t)new_log("")) ==
                           NULL)
    goto fail;
  /* (the last step: nothing to undo after it) */
  mod->tag = TAG_MODULE;
  mod->p = p;
  mod->dev = d;
  if (!live_add(mod))
    goto fail;
  *ph = (ze_module_handle_t)mod;
  free(options);
  return ZE_RESULT_SUCCESS;
fail:
  if (rc == ZE_RESULT_ERROR_MODULE_BUILD_FAILURE) {
    const char *text = log != NULL ? log : why;
    say("zeModuleCreate: %s", text);
    if (phLog != NULL)
      *phLog = (ze_module_build_log_handle_t)new_log(text);
  }
  free(mod);
  free(options);
  free(log);
  return rc;
}

static ze_result_t drv_module_destroy(ze_module_handle_t h) {
  zmodule *m = get_zmodule(h);
  if (m == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  /* the program stays cached for the next zeModuleCreate */
  live_del(m);
  m->tag = TAG_DEAD;
  free(m);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_log_destroy(ze_module_build_log_handle_t h) {
  zbuild_log *l = get_zbuild_log(h);
  if (l == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  live_del(l);
  l->tag = TAG_DEAD;
  free(l->text);
  free(l);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_log_string(ze_module_build_log_handle_t h,
                                  size_t *pSize, char *pBuildLog) {
  zbuild_log *l = get_zbuild_log(h);
  size_t n;
  if (l == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (pSize == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  n = strlen(l->text) + 1;
  if (*pSize == 0 || pBuildLog == NULL) {
    *pSize = n;
    return ZE_RESULT_SUCCESS;
  }
  if (*pSize < n)
    return ZE_RESULT_ERROR_INVALID_SIZE;
  memcpy(pBuildLog, l->text, n);
  *pSize = n;
  return ZE_RESULT_SUCCESS;
}

static void free_kernel(zkernel *k) {
  if (k == NULL)
    return;
  if (k->k != NULL)
    clReleaseKernel(k->k);
  pthread_mutex_destroy(&k->mu);
  free(k->is_pointer);
  free(k->args);
  k->tag = TAG_DEAD;
  free(k);
}

static ze_result_t drv_kernel_create(ze_module_handle_t hm,
                                     const ze_kernel_desc_t *desc,
                                     ze_kernel_handle_t *ph) {
  zmodule *m = get_zmodule(hm);
  zkernel *k;
  cl_int err;

  if (m == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == NULL || desc->pKernelName == NULL || ph == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if ((k = calloc(1, sizeof *k)) == NULL)
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  pthread_mutex_init(&k->mu, NULL);
  k->tag = TAG_KERNEL;
  k->module = m->p->module;
  k->k = clCreateKernel(m->p->prog, desc->pKernelName, &err);
  if (err != CL_SUCCESS) {
    k->k = NULL;
    free_kernel(k);
    say("zeKernelCreate: no kernel '%s' in module %s", desc->pKernelName,
        ql__ze_modules[m->p->module].name);
    return ZE_RESULT_ERROR_INVALID_KERNEL_NAME;
  }
  clGetKernelInfo(k->k, CL_KERNEL_NUM_ARGS, sizeof k->nargs, &k->nargs, NULL);
  clGetKernelWorkGroupInfo(k->k, g.cl_dev, CL_KERNEL_COMPILE_WORK_GROUP_SIZE,
                           sizeof k->reqd, k->reqd, NULL);
  if ((k->is_pointer = calloc(k->nargs + 1, sizeof *k->is_pointer)) == NULL ||
      (k->args = calloc(k->nargs + 1, sizeof *k->args)) == NULL) {
    free_kernel(k);
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  }
  for (cl_uint i = 0; i < k->nargs; i++) {
    cl_kernel_arg_address_qualifier q = CL_KERNEL_ARG_ADDRESS_PRIVATE;
    clGetKernelArgInfo(k->k, i, CL_KERNEL_ARG_ADDRESS_QUALIFIER, sizeof q, &q,
                       NULL);
    k->is_pointer[i] = q == CL_KERNEL_ARG_ADDRESS_GLOBAL ||
                       q == CL_KERNEL_ARG_ADDRESS_CONSTANT;
    if (q == CL_KERNEL_ARG_ADDRESS_LOCAL) {
      free_kernel(k);
      say("zeKernelCreate(%s): local-memory arguments are not supported",
          desc->pKernelName);
      return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
    }
  }
  if (!live_add(k)) {
    free_kernel(k);
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  }
  *ph = (ze_kernel_handle_t)k;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_kernel_destroy(ze_kernel_handle_t h) {
  zkernel *k = get_zkernel(h);
  int queued;
  if (k == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  live_del(k);
  pthread_mutex_lock(&g.mu);
  k->dead = 1;
  queued = k->refs > 0;
  pthread_mutex_unlock(&g.mu);
  /* a command still queued frees it when it goes */
  if (!queued)
    free_kernel(k);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_set_group_size(ze_kernel_handle_t h, uint32_t x,
                                      uint32_t y, uint32_t z) {
  zkernel *k = get_zkernel(h);
  if (k == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (x == 0 || y == 0 || z == 0 || (uint64_t)x * y * z > 1024 ||
      (k->reqd[0] != 0 &&
       (x != k->reqd[0] || y != k->reqd[1] || z != k->reqd[2]))) {
    say("zeKernelSetGroupSize(%u, %u, %u): the kernel requires %zu x %zu x "
        "%zu",
        x, y, z, k->reqd[0], k->reqd[1], k->reqd[2]);
    return ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION;
  }
  pthread_mutex_lock(&k->mu);
  k->group[0] = x;
  k->group[1] = y;
  k->group[2] = z;
  k->group_set = 1;
  pthread_mutex_unlock(&k->mu);
  return ZE_RESULT_SUCCESS;
}

/* Sets argument i of k's OpenCL kernel from a; k->mu held. */
static cl_int set_cl_arg(zkernel *k, cl_uint i, const zarg *a) {
  if (a->kind == ARG_POINTER) {
    void *p;
    memcpy(&p, a->value, sizeof p);
    return clSetKernelArgSVMPointer(k->k, i, p);
  }
  return clSetKernelArg(k->k, i, a->size, a->value);
}

static ze_result_t drv_set_arg(ze_kernel_handle_t h, uint32_t i, size_t size,
                               const void *value) {
  zkernel *k = get_zkernel(h);
  zarg a = {0};
  cl_int err;

  if (k == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (i >= k->nargs) {
    say("zeKernelSetArgumentValue: argument %u of %u", i, k->nargs);
    return ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_INDEX;
  }
  if (k->is_pointer[i]) {
    void *p = NULL;
    if (size != sizeof(void *)) {
      say("zeKernelSetArgumentValue: argument %u is a pointer, not %zu bytes",
          i, size);
      return ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_SIZE;
    }
    if (value != NULL)
      memcpy(&p, value, sizeof p);
    if (p != NULL) {
      /* a GPU would fault on it later; say so now */
      pthread_mutex_lock(&g.mu);
      zalloc *z = find_alloc(p, 0);
      pthread_mutex_unlock(&g.mu);
      if (z == NULL) {
        say("zeKernelSetArgumentValue: argument %u, %p, is in no allocation",
            i, p);
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
      }
    }
    a.kind = ARG_POINTER;
    a.size = sizeof p;
    memcpy(a.value, &p, sizeof p);
  } else {
    if (value == NULL || size == 0 || size > MAX_SCALAR_ARG) {
      say("zeKernelSetArgumentValue: argument %u: %zu bytes%s", i, size,
          value == NULL ? ", no value" : "");
      return ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_SIZE;
    }
    a.kind = ARG_SCALAR;
    a.size = size;
    memcpy(a.value, value, size);
  }
  pthread_mutex_lock(&k->mu);
  /* OpenCL checks the size against the argument's type */
  err = set_cl_arg(k, i, &a);
  if (err == CL_SUCCESS)
    k->args[i] = a;
  pthread_mutex_unlock(&k->mu);
  if (err != CL_SUCCESS) {
    say("zeKernelSetArgumentValue: argument %u (%zu bytes): OpenCL error %d", i,
        size, (int)err);
    return err == CL_INVALID_ARG_SIZE
               ? ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_SIZE
               : ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  return ZE_RESULT_SUCCESS;
}

/* ---- command lists ---- */

static void unref_event(zevent *e) {
  if (e != NULL && --e->refs == 0 && e->dead)
    free(e);
}

/* A queued command holds its kernel and events, so that destroying them
 * while it waits leaves it nothing dangling; g.mu held. */
static void ref_cmd(zcmd *c) {
  if (c->kernel != NULL)
    c->kernel->refs++;
  if (c->signal != NULL)
    c->signal->refs++;
  if (c->reset != NULL)
    c->reset->refs++;
  for (uint32_t i = 0; i < c->nwait; i++)
    c->wait[i]->refs++;
  c->held = 1;
}

/* Frees c and drops what it holds; g.mu held when it was queued. */
static void free_cmd(zcmd *c) {
  if (c == NULL)
    return;
  if (c->held) {
    if (c->kernel != NULL && --c->kernel->refs == 0 && c->kernel->dead)
      free_kernel(c->kernel);
    unref_event(c->signal);
    unref_event(c->reset);
    for (uint32_t i = 0; i < c->nwait; i++)
      unref_event(c->wait[i]);
  }
  free(c->args);
  free(c->wait);
  free(c);
}

/* Runs kernel command c on list l's queue; 0 or the OpenCL error. */
static cl_int run_kernel(zlist *l, zcmd *c) {
  zkernel *k = c->kernel;
  cl_int err = CL_SUCCESS;

  pthread_mutex_lock(&k->mu);
  for (cl_uint i = 0; i < k->nargs && err == CL_SUCCESS; i++)
    err = set_cl_arg(k, i, &c->args[i]);
  if (err == CL_SUCCESS)
    err = clEnqueueNDRangeKernel(l->q, k->k, 3, NULL, c->global, c->local, 0,
                                 NULL, NULL);
  pthread_mutex_unlock(&k->mu);
  if (err == CL_SUCCESS)
    err = clFinish(l->q);
  return err;
}

/* Runs c (its wait events are signalled); g.mu not held. */
static void run_cmd(zlist *l, zcmd *c) {
  switch (c->type) {
  case C_COPY:
    memmove(c->dst, c->src, c->size);
    break;
  case C_FILL:
    for (size_t off = 0; off < c->size; off += c->psize)
      memcpy((char *)c->dst + off, c->pattern, c->psize);
    break;
  case C_LAUNCH: {
    cl_int err = run_kernel(l, c);
    if (err != CL_SUCCESS) {
      /* a GPU that cannot run a kernel resets: the device is lost */
      say("kernel launch on device %d failed (OpenCL error %d): device lost",
          l->dev->index, (int)err);
      pthread_mutex_lock(&g.mu);
      if (!l->dev->lost && !l->dev->hung)
        l->dev->stop_seq = l->dev->seq;
      l->dev->lost = 1;
      pthread_mutex_unlock(&g.mu);
    }
    break;
  }
  default:
    break;
  }
}

/* Whether every wait event of c is signalled; g.mu held. */
static int waits_done(const zcmd *c) {
  for (uint32_t i = 0; i < c->nwait; i++)
    if (!c->wait[i]->signaled)
      return 0;
  return 1;
}

static void *list_worker(void *arg) {
  zlist *l = arg;
  pthread_mutex_lock(&g.mu);
  for (;;) {
    zcmd *c;
    while (!l->stop && (l->head == NULL || !l->head->runs ||
                        !waits_done(l->head)))
      pthread_cond_wait(&g.cv, &g.mu);
    if (l->stop)
      break;
    c = l->head;
    pthread_mutex_unlock(&g.mu);
    run_cmd(l, c);
    pthread_mutex_lock(&g.mu);
    if (c->type == C_RESET && c->reset != NULL)
      c->reset->signaled = 0;
    if (c->signal != NULL) {
      c->signal->signaled = 1;
      c->signal->pending = 0;
    }
    l->head = c->next;
    if (l->head == NULL)
      l->tail = NULL;
    l->done = c->number;
    free_cmd(c);
    pthread_cond_broadcast(&g.cv);
  }
  pthread_mutex_unlock(&g.mu);
  return NULL;
}

/* Stops l's worker and frees l; commands not run yet are dropped, their
 * events never signal. */
static void destroy_list(zlist *l) {
  zcmd *c;
  pthread_mutex_lock(&g.mu);
  l->stop = 1;
  l->tag = TAG_DEAD;
  pthread_cond_broadcast(&g.cv);
  pthread_mutex_unlock(&g.mu);
  if (l->thread_started)
    pthread_join(l->thread, NULL);
  pthread_mutex_lock(&g.mu);
  while ((c = l->head) != NULL) {
    l->head = c->next;
    free_cmd(c);
  }
  pthread_mutex_unlock(&g.mu);
  clReleaseCommandQueue(l->q);
  free(l);
}

static ze_result_t drv_list_destroy(ze_command_list_handle_t h) {
  zlist *l = get_zlist(h);
  if (l == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  live_del(l);
  destroy_list(l);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t drv_list_create_immediate(ze_context_handle_t hc,
                                             ze_device_handle_t hd,
                                             const ze_command_queue_desc_t *desc,
                                             ze_command_list_handle_t *ph) {
  zdevice *d = get_device(hd);
  zlist *l;
  cl_int err;
  int lost;

  if (get_zcontext(hc) == NULL || d == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == NULL || ph == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (desc->ordinal != 0 || desc->index != 0) {
    say("zeCommandListCreateImmediate: one queue group with one queue");
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  pthread_mutex_lock(&g.mu);
  lost = d->lost;
  pthread_mutex_unlock(&g.mu);
  if (lost)
    return ZE_RESULT_ERROR_DEVICE_LOST;
  if ((l = calloc(1, sizeof *l)) == NULL)
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  l->tag = TAG_LIST;
  l->dev = d;
  l->sync = desc->mode == ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS;
  l->q = clCreateCommandQueueWithProperties(g.cl_ctx, g.cl_dev, NULL, &err);
  if (err != CL_SUCCESS || pthread_create(&l->thread, NULL, list_worker, l)) {
    if (l->q != NULL)
      clReleaseCommandQueue(l->q);
    free(l);
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  }
  l->thread_started = 1;
  if (!live_add(l)) {
    destroy_list(l);
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  }
  *ph = (ze_command_list_handle_t)l;
  return ZE_RESULT_SUCCESS;
}

/* A new command of list l with its events checked, or NULL and *rc. */
static zcmd *new_cmd(zlist *l, int type, ze_event_handle_t hSignal,
                     uint32_t nwait, ze_event_handle_t *phWait,
                     ze_result_t *rc) {
  zcmd *c;
  (void)l;
  *rc = ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (hSignal != NULL && get_zevent(hSignal) == NULL)
    return NULL;
  if (nwait > 0 && phWait == NULL) {
    *rc = ZE_RESULT_ERROR_INVALID_SIZE;
    return NULL;
  }
  for (uint32_t i = 0; i < nwait; i++)
    if (get_zevent(phWait[i]) == NULL)
      return NULL;
  *rc = ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  if ((c = calloc(1, sizeof *c)) == NULL)
    return NULL;
  if (nwait > 0 && (c->wait = malloc(nwait * sizeof *c->wait)) == NULL) {
    free(c);
    return NULL;
  }
  for (uint32_t i = 0; i < nwait; i++)
    c->wait[i] = (zevent *)phWait[i];
  c->nwait = nwait;
  c->type = type;
  c->signal = (zevent *)hSignal;
  *rc = ZE_RESULT_SUCCESS;
  return c;
}

/* Queues c on l, numbered on its device, and in synchronous mode waits
 * for it; takes c in every case. */
static ze_result_t submit(zlist *l, zcmd *c) {
  zdevice *d = l->dev;
  long n;

  pthread_mutex_lock(&g.mu);
  if (d->lost) {
    pthread_mutex_unlock(&g.mu);
    free_cmd(c);
    return ZE_RESULT_ERROR_DEVICE_LOST;
  }
  if (d->oom_armed && d->seq >= d->oom_at) {
    d->oom_armed = 0;
    pthread_mutex_unlock(&g.mu);
    free_cmd(c);
    return ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
  }
  ref_cmd(c);
  n = ++d->seq;
  c->runs = !(d->hung && n > d->stop_seq);
  trigger(d);
  if (c->signal != NULL) {
    c->signal->dev = d;
    c->signal->seq = n;
    c->signal->pending = 1;
  }
  c->number = ++l->appended;
  if (l->tail != NULL)
    l->tail->next = c;
  else
    l->head = c;
  l->tail = c;
  pthread_cond_broadcast(&g.cv);
  /* (the worker frees c once it has run) */
  if (l->sync && c->runs)
    for (long number = c->number; l->done < number;)
      pthread_cond_wait(&g.cv, &g.mu);
  pthread_mutex_unlock(&g.mu);
  return ZE_RESULT_SUCCESS;
}

/* The memory of [p, p + n) if it overruns an allocation it starts in, for
 * copies and fills (system memory outside every allocation is allowed, as
 * with shared system USM). */
static int overruns(const void *p, size_t n) {
  int bad;
  pthread_mutex_lock(&g.mu);
  bad = find_alloc(p, 0) != NULL && find_alloc(p, n) == NULL;
  pthread_mutex_unlock(&g.mu);
  return bad;
}

static ze_result_t drv_append_copy(ze_command_list_handle_t h, void *dst,
                                   const void *src, size_t size,
                                   ze_event_handle_t hSignal, uint32_t nwait,
                                   ze_event_handle_t *phWait) {
  zlist *l = get_zlist(h);
  zcmd *c;
  ze_result_t rc;

  if (l == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (dst == NULL || src == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (overruns(dst, size) || overruns(src, size)) {
    say("zeCommandListAppendMemoryCopy(%p <- %p, %zu): past the end of an "
        "allocation",
        dst, src, size);
    return ZE_RESULT_ERROR_INVALID_SIZE;
  }
  if ((c = new_cmd(l, C_COPY, hSignal, nwait, phWait, &rc)) == NULL)
    return rc;
  c->dst = dst;
  c->src = src;
  c->size = size;
  return submit(l, c);
}

static ze_result_t drv_append_fill(ze_command_list_handle_t h, void *ptr,
                                   const void *pattern, size_t psize,
                                   size_t size, ze_event_handle_t hSignal,
                                   uint32_t nwait, ze_event_handle_t *phWait) {
  zlist *l = get_zlist(h);
  zcmd *c;
  ze_result_t rc;

  if (l == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (ptr == NULL || pattern == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (psize == 0 || psize > MAX_FILL_PATTERN || (psize & (psize - 1)) != 0 ||
      size % psize != 0 || overruns(ptr, size)) {
    say("zeCommandListAppendMemoryFill(%p, pattern %zu, %zu): bad size", ptr,
        psize, size);
    return ZE_RESULT_ERROR_INVALID_SIZE;
  }
  if ((c = new_cmd(l, C_FILL, hSignal, nwait, phWait, &rc)) == NULL)
    return rc;
  c->dst = ptr;
  memcpy(c->pattern, pattern, psize);
  c->psize = psize;
  c->size = size;
  return submit(l, c);
}

static ze_result_t drv_append_launch(ze_command_list_handle_t h,
                                     ze_kernel_handle_t hk,
                                     const ze_group_count_t *count,
                                     ze_event_handle_t hSignal, uint32_t nwait,
                                     ze_event_handle_t *phWait) {
  zlist *l = get_zlist(h);
  zkernel *k = get_zkernel(hk);
  zcmd *c;
  ze_result_t rc;
  uint32_t cnt[3];

  if (l == NULL || k == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (count == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  cnt[0] = count->groupCountX;
  cnt[1] = count->groupCountY;
  cnt[2] = count->groupCountZ;
  if ((c = new_cmd(l, C_LAUNCH, hSignal, nwait, phWait, &rc)) == NULL)
    return rc;
  rc = ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  if ((c->args = calloc(k->nargs + 1, sizeof *c->args)) == NULL)
    goto fail;
  pthread_mutex_lock(&k->mu);
  rc = ZE_RESULT_SUCCESS;
  if (!k->group_set) {
    say("zeCommandListAppendLaunchKernel: no zeKernelSetGroupSize");
    rc = ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  for (cl_uint i = 0; i < k->nargs && rc == ZE_RESULT_SUCCESS; i++)
    if (k->args[i].kind == ARG_UNSET) {
      say("zeCommandListAppendLaunchKernel: argument %u is not set", i);
      rc = ZE_RESULT_ERROR_INVALID_ARGUMENT;
    }
  if (rc == ZE_RESULT_SUCCESS) {
    memcpy(c->args, k->args, k->nargs * sizeof *c->args);
    for (int i = 0; i < 3; i++) {
      c->local[i] = k->group[i];
      c->global[i] = (size_t)k->group[i] * cnt[i];
    }
  }
  pthread_mutex_unlock(&k->mu);
  if (rc != ZE_RESULT_SUCCESS)
    goto fail;
  if (c->global[0] == 0 || c->global[1] == 0 || c->global[2] == 0) {
    /* nothing to run; the events still order as for a launch */
    c->type = C_BARRIER;
  }
  c->kernel = k;
  return submit(l, c);
fail:
  free_cmd(c);
  return rc;
}

static ze_result_t drv_append_barrier(ze_command_list_handle_t h,
                                      ze_event_handle_t hSignal,
                                      uint32_t nwait,
                                      ze_event_handle_t *phWait) {
  zlist *l = get_zlist(h);
  zcmd *c;
  ze_result_t rc;
  if (l == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if ((c = new_cmd(l, C_BARRIER, hSignal, nwait, phWait, &rc)) == NULL)
    return rc;
  return submit(l, c);
}

static ze_result_t drv_append_signal(ze_command_list_handle_t h,
                                     ze_event_handle_t he) {
  zlist *l = get_zlist(h);
  zcmd *c;
  ze_result_t rc;
  if (l == NULL || get_zevent(he) == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if ((c = new_cmd(l, C_SIGNAL, he, 0, NULL, &rc)) == NULL)
    return rc;
  return submit(l, c);
}

static ze_result_t drv_append_wait(ze_command_list_handle_t h, uint32_t n,
                                   ze_event_handle_t *phEvents) {
  zlist *l = get_zlist(h);
  zcmd *c;
  ze_result_t rc;
  if (l == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (phEvents == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if ((c = new_cmd(l, C_WAIT, NULL, n, phEvents, &rc)) == NULL)
    return rc;
  return submit(l, c);
}

static ze_result_t drv_append_reset(ze_command_list_handle_t h,
                                    ze_event_handle_t he) {
  zlist *l = get_zlist(h);
  zcmd *c;
  ze_result_t rc;
  if (l == NULL || get_zevent(he) == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if ((c = new_cmd(l, C_RESET, NULL, 0, NULL, &rc)) == NULL)
    return rc;
  c->reset = (zevent *)he;
  return submit(l, c);
}

/* ---- the dispatch tables (ze_ddi.h) ---- */

/* The loader asks with its own API version; a table of this header's
 * version serves any 1.x. */
static ze_result_t check_table(ze_api_version_t version, const void *table) {
  if (table == NULL)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (ZE_MAJOR_VERSION(version) != ZE_MAJOR_VERSION(ZE_API_VERSION_CURRENT))
    return ZE_RESULT_ERROR_UNSUPPORTED_VERSION;
  return ZE_RESULT_SUCCESS;
}

#define TABLE_BEGIN(fn, type)                                                  \
  ZE_DLLEXPORT ze_result_t ZE_APICALL fn(ze_api_version_t version,             \
                                         type *t) {                            \
    ze_result_t rc = check_table(version, t);                                  \
    if (rc != ZE_RESULT_SUCCESS)                                               \
      return rc;                                                               \
    memset(t, 0, sizeof *t);
#define TABLE_END                                                              \
  return ZE_RESULT_SUCCESS;                                                    \
  }

TABLE_BEGIN(zeGetGlobalProcAddrTable, ze_global_dditable_t)
t->pfnInit = drv_init;
TABLE_END

TABLE_BEGIN(zeGetDriverProcAddrTable, ze_driver_dditable_t)
t->pfnGet = drv_driver_get;
t->pfnGetApiVersion = drv_api_version;
t->pfnGetProperties = drv_driver_props;
t->pfnGetIpcProperties = drv_ipc_props;
TABLE_END

TABLE_BEGIN(zeGetDeviceProcAddrTable, ze_device_dditable_t)
t->pfnGet = drv_device_get;
t->pfnGetProperties = drv_device_props;
t->pfnGetComputeProperties = drv_compute_props;
t->pfnGetModuleProperties = drv_module_props;
t->pfnGetMemoryProperties = drv_memory_props;
TABLE_END

TABLE_BEGIN(zeGetContextProcAddrTable, ze_context_dditable_t)
t->pfnCreate = drv_context_create;
t->pfnDestroy = drv_context_destroy;
TABLE_END

TABLE_BEGIN(zeGetCommandListProcAddrTable, ze_command_list_dditable_t)
t->pfnCreateImmediate = drv_list_create_immediate;
t->pfnDestroy = drv_list_destroy;
t->pfnAppendBarrier = drv_append_barrier;
t->pfnAppendMemoryCopy = drv_append_copy;
t->pfnAppendMemoryFill = drv_append_fill;
t->pfnAppendSignalEvent = drv_append_signal;
t->pfnAppendWaitOnEvents = drv_append_wait;
t->pfnAppendEventReset = drv_append_reset;
t->pfnAppendLaunchKernel = drv_append_launch;
TABLE_END

TABLE_BEGIN(zeGetEventPoolProcAddrTable, ze_event_pool_dditable_t)
t->pfnCreate = drv_pool_create;
t->pfnDestroy = drv_pool_destroy;
TABLE_END

TABLE_BEGIN(zeGetEventProcAddrTable, ze_event_dditable_t)
t->pfnCreate = drv_event_create;
t->pfnDestroy = drv_event_destroy;
t->pfnHostSignal = drv_event_signal;
t->pfnHostSynchronize = drv_event_sync;
t->pfnQueryStatus = drv_event_query;
t->pfnHostReset = drv_event_reset;
TABLE_END

TABLE_BEGIN(zeGetModuleProcAddrTable, ze_module_dditable_t)
t->pfnCreate = drv_module_create;
t->pfnDestroy = drv_module_destroy;
TABLE_END

TABLE_BEGIN(zeGetModuleBuildLogProcAddrTable, ze_module_build_log_dditable_t)
t->pfnDestroy = drv_log_destroy;
t->pfnGetString = drv_log_string;
TABLE_END

TABLE_BEGIN(zeGetKernelProcAddrTable, ze_kernel_dditable_t)
t->pfnCreate = drv_kernel_create;
t->pfnDestroy = drv_kernel_destroy;
t->pfnSetGroupSize = drv_set_group_size;
t->pfnSetArgumentValue = drv_set_arg;
TABLE_END

TABLE_BEGIN(zeGetMemProcAddrTable, ze_mem_dditable_t)
t->pfnAllocDevice = drv_alloc_device;
t->pfnAllocHost = drv_alloc_host;
t->pfnFree = drv_mem_free;
t->pfnGetAllocProperties = drv_alloc_props;
t->pfnGetAddressRange = drv_address_range;
t->pfnGetIpcHandle = drv_get_ipc;
t->pfnOpenIpcHandle = drv_open_ipc;
t->pfnCloseIpcHandle = drv_close_ipc;
TABLE_END

/* Tables of features this driver does not have: every entry NULL. */
TABLE_BEGIN(zeGetDeviceExpProcAddrTable, ze_device_exp_dditable_t)
TABLE_END
TABLE_BEGIN(zeGetCommandQueueProcAddrTable, ze_command_queue_dditable_t)
TABLE_END
TABLE_BEGIN(zeGetImageProcAddrTable, ze_image_dditable_t)
TABLE_END
TABLE_BEGIN(zeGetImageExpProcAddrTable, ze_image_exp_dditable_t)
TABLE_END
TABLE_BEGIN(zeGetFenceProcAddrTable, ze_fence_dditable_t)
TABLE_END
TABLE_BEGIN(zeGetEventExpProcAddrTable, ze_event_exp_dditable_t)
TABLE_END
TABLE_BEGIN(zeGetKernelExpProcAddrTable, ze_kernel_exp_dditable_t)
TABLE_END
TABLE_BEGIN(zeGetSamplerProcAddrTable, ze_sampler_dditable_t)
TABLE_END
TABLE_BEGIN(zeGetPhysicalMemProcAddrTable, ze_physical_mem_dditable_t)
TABLE_END
TABLE_BEGIN(zeGetVirtualMemProcAddrTable, ze_virtual_mem_dditable_t)
TABLE_END
TABLE_BEGIN(zeGetFabricVertexExpProcAddrTable, ze_fabric_vertex_exp_dditable_t)
TABLE_END
TABLE_BEGIN(zeGetFabricEdgeExpProcAddrTable, ze_fabric_edge_exp_dditable_t)
TABLE_END

/* Tools (zet) and sysman (zes): the loader fills these tables from every
 * driver when zeInit runs, and its zeInit fails without them. */
TABLE_BEGIN(zetGetDeviceProcAddrTable, zet_device_dditable_t)
TABLE_END
TABLE_BEGIN(zetGetContextProcAddrTable, zet_context_dditable_t)
TABLE_END
TABLE_BEGIN(zetGetCommandListProcAddrTable, zet_command_list_dditable_t)
TABLE_END
TABLE_BEGIN(zetGetModuleProcAddrTable, zet_module_dditable_t)
TABLE_END
TABLE_BEGIN(zetGetKernelProcAddrTable, zet_kernel_dditable_t)
TABLE_END
TABLE_BEGIN(zetGetMetricGroupProcAddrTable, zet_metric_group_dditable_t)
TABLE_END
TABLE_BEGIN(zetGetMetricGroupExpProcAddrTable, zet_metric_group_exp_dditable_t)
TABLE_END
TABLE_BEGIN(zetGetMetricProcAddrTable, zet_metric_dditable_t)
TABLE_END
TABLE_BEGIN(zetGetMetricStreamerProcAddrTable, zet_metric_streamer_dditable_t)
TABLE_END
TABLE_BEGIN(zetGetMetricQueryPoolProcAddrTable, zet_metric_query_pool_dditable_t)
TABLE_END
TABLE_BEGIN(zetGetMetricQueryProcAddrTable, zet_metric_query_dditable_t)
TABLE_END
TABLE_BEGIN(zetGetTracerExpProcAddrTable, zet_tracer_exp_dditable_t)
TABLE_END
TABLE_BEGIN(zetGetDebugProcAddrTable, zet_debug_dditable_t)
TABLE_END
TABLE_BEGIN(zesGetDriverProcAddrTable, zes_driver_dditable_t)
TABLE_END
TABLE_BEGIN(zesGetDeviceProcAddrTable, zes_device_dditable_t)
TABLE_END
TABLE_BEGIN(zesGetSchedulerProcAddrTable, zes_scheduler_dditable_t)
TABLE_END
TABLE_BEGIN(zesGetPerformanceFactorProcAddrTable, zes_performance_factor_dditable_t)
TABLE_END
TABLE_BEGIN(zesGetPowerProcAddrTable, zes_power_dditable_t)
TABLE_END
TABLE_BEGIN(zesGetFrequencyProcAddrTable, zes_frequency_dditable_t)
TABLE_END
TABLE_BEGIN(zesGetEngineProcAddrTable, zes_engine_dditable_t)
TABLE_END
TABLE_BEGIN(zesGetStandbyProcAddrTable, zes_standby_dditable_t)
TABLE_END
TABLE_BEGIN(zesGetFirmwareProcAddrTable, zes_firmware_dditable_t)
TABLE_END
TABLE_BEGIN(zesGetMemoryProcAddrTable, zes_memory_dditable_t)
TABLE_END
TABLE_BEGIN(zesGetFabricPortProcAddrTable, zes_fabric_port_dditable_t)
TABLE_END
TABLE_BEGIN(zesGetTemperatureProcAddrTable, zes_temperature_dditable_t)
TABLE_END
TABLE_BEGIN(zesGetPsuProcAddrTable, zes_psu_dditable_t)
TABLE_END
TABLE_BEGIN(zesGetFanProcAddrTable, zes_fan_dditable_t)
TABLE_END
TABLE_BEGIN(zesGetLedProcAddrTable, zes_led_dditable_t)
TABLE_END
TABLE_BEGIN(zesGetRasProcAddrTable, zes_ras_dditable_t)
TABLE_END
TABLE_BEGIN(zesGetDiagnosticsProcAddrTable, zes_diagnostics_dditable_t)
TABLE_END
