// backend.cpp - the CUDA backend: its registration (the one place that
// lists its implementations), its devices, and the host side of its ops:
// argument checks as strict as the reference's, the "cuda-1" layout that
// repack builds in device memory, staging of host tensors, launches, and
// what a failing GPU does to them.
//
// Host code only, written against the CUDA runtime API. The same file is
// built two ways: against <cuda_runtime_api.h> and libcudart for machines
// with a GPU, and against kernels/cuda/emu_runtime.h (QL_CUDA_EMU) in
// `make check`, where the runtime keeps device memory in host memory and
// can inject the failures a GPU has (DESIGN §9).
//
// Devices. Ordinals are the runtime's (they differ between processes with
// another CUDA_VISIBLE_DEVICES); names carry the GPU's UUID, which does
// not. device_bind() makes a device current for the calling thread
// (cudaSetDevice); the ops and repack act on the current device. Each
// device has kLanes lanes, each with its own streams (one of the greatest
// priority for decode-sized calls, one of the default) and scratch arenas
// (device memory for x, y and intermediate arrays, pinned host memory for
// staging), grown on demand and guarded by the lane's mutex. A call takes
// the first free lane (lane 0 blocking when all are taken), so the
// daemon's batches_in_flight workers of one device stage, run and fetch
// their batches at once, each ordered on its own stream; a single worker
// only ever uses lane 0 and its memory.
//
// Failures. A CUDA error other than out-of-memory or a bad argument, or a
// launch that does not finish within the kernel timeout, takes the device
// out of service for good: its ops return QL_EDEVICE from then on, and
// device_error() says why. A GPU context with a sticky error cannot run
// anything again, and a hung kernel may never return, so neither is
// retried; the daemon keeps serving on its other devices.
//
// Ops: repack and linear_wo for q4g, q8c, q8b and f8r; linear_aq for q8c
// and q4g on our tensor-core kernel, for f8r on cuBLASLt's FP8 GEMM
// (blaslt.h) where the device is sm_89 or newer and the library loads,
// else left to the generic one, and for q8c batches of at least
// QL_CUDA_IMMA_MIN_ROWS rows on cuBLASLt's int8 GEMM (IMMA) when that
// variable is set; quantize_rows (int8 with group sums, e4m3) for every
// activation dtype. x and y of the ops are host memory, the caller's; or,
// through linear_dev (our own kernels only), device memory that another
// process exported by CUDA IPC and ipc_open imported (DESIGN §7): then x is
// read and y written where they are, with no staging copy.
//
// Host memory. host_register page-locks memory of the caller's (the
// daemon's mapping of a session's region) with cudaHostRegister and keeps
// the range in a small table; an x or y of a call that lies wholly inside
// a registered range is copied by DMA straight from or into it, without
// the staging buffer and its memcpy. The caller unregisters a range only
// once no call uses it (the daemon: when the region's last job is done).
// Ranges are registered mapped, and a call's copies of up to
// QL_CUDA_SM_COPY_MAX bytes (default 1 MiB) run as a kernel through the
// mapped addresses of pinned staging and registered ranges, not on a copy
// engine, where they would queue behind another lane's prefill (move()).
//
// One wait per call. A call enqueues everything at once: x in, the NaN/Inf
// check (and AQ's quantization verdicts), the product, and the copies back
// of the flag, the verdicts and y into pinned staging; then it waits once
// and, only when x was finite, hands y over. So a call that fails with
// QL_ENONFINITE leaves the caller's y untouched, as the reference does,
// although its product ran on the device. Two cases wait twice: a y in
// device memory (its product runs only after the check said yes, since
// it would write the caller's memory), and a large registered y, which
// is copied straight into place once the verdict is known, because that
// second round trip (a DMA and one more wait, some 10 to 20 us) costs less
// than a memcpy of kDirectYMin bytes or more out of staging.
//
// Waiting. QL_CUDA_WAIT, read once, says how a call waits for its stream:
//   spin  polls cudaStreamQuery without sleeping: the least latency, a
//         core busy for the whole kernel;
//   host  enqueues a host function (cudaLaunchHostFunc) that posts the
//         lane's semaphore, and sleeps on it in 1 ms slices, querying the
//         stream between slices for sticky errors: no CPU while waiting,
//         the runtime's callback latency on top;
//   nap   polls, and after 64 polls naps 50 us between polls (the old way:
//         with timer slack some 100 us late per wait);
//   auto  (the default, also for an unknown value) polls for kSpinUs (2 ms),
//         yielding the core between polls after the first kBusyUs, then
//         waits as host does: a decode call never sleeps, and only a call
//         that runs for milliseconds pays the callback's latency.
// Measured through the daemon on an H200 (q8c 14336x4096, M = 1, region
// tensors, round trip median): spin 149 us, a 20 us spin then host 292 us,
// nap 385 us; the daemon's job time 76, 212 and 164 us.
// Every mode fails a launch that does not finish within the kernel
// timeout (configure), and takes the device out of service for it.
//
// IPC. ipc_open maps an allocation with cudaIpcOpenMemHandle on the given
// device and bounds it with the driver's cuMemGetAddressRange, reached
// through cudaGetDriverEntryPointByVersion so that the daemon does not link
// libcuda (it must start on a machine without a driver). A bad handle is an
// error of the call, never of the device. A ready event is waited for on
// the host by polling, for at most the kernel timeout: a client whose
// producer never finishes fails its own request (QL_ETIMEDOUT), where a
// stream wait would have stalled the device for everyone.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pthread.h>
#include <sched.h>
#include <semaphore.h>

#include <atomic>

#ifdef QL_CUDA_EMU
#include "emu_runtime.h"
#else
#include <cuda.h>  // CUresult, CUdeviceptr: types only, libcuda is not linked
#include <cuda_runtime_api.h>
#endif

#include "blaslt.h"
#include "ql_cuda.h"
#include "registry.h"
#include "vmm.h"

namespace {

constexpr int kMaxDevices = 16;
constexpr unsigned kDefaultTimeoutMs = 10000;

bool mul_size(size_t a, size_t b, size_t* out) {
  if (a != 0 && b > SIZE_MAX / a) return false;
  *out = a * b;
  return true;
}
bool add_size(size_t a, size_t b, size_t* out) {
  if (b > SIZE_MAX - a) return false;
  *out = a + b;
  return true;
}
size_t round16(size_t n) { return (n + 15) & ~size_t(15); }
size_t round256(size_t n) { return (n + 255) & ~size_t(255); }

// ---- devices ----

// Memory grown on demand and handed out in 256-byte aligned pieces for the
// duration of one call.
struct arena {
  unsigned char* base = nullptr;
  size_t cap = 0;
  size_t used = 0;
};

// The C++ here needs nothing of the C++ runtime library (no exceptions, no
// std::mutex), so that libqlkernels links into C programs as it is.
constexpr int kLanes = 3;  // the daemon's batches_in_flight at most

struct device;

// One call's stream and scratch; see the top of the file. The semaphore
// and the counters of the host mode's wait belong to the lane, which lives
// as long as the process: a host function that runs after its waiter gave
// up (a timeout) still finds them.
struct lane {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  cudaStream_t stream = nullptr;  // the current call's: lo or hi
  cudaStream_t lo = nullptr;      // the default priority (made at first use)
  cudaStream_t hi = nullptr;      // the greatest priority (made with lo)
  arena dev;                      // device memory
  arena host;                     // pinned host memory
  device* g = nullptr;            // its device (set by enter)
  sem_t done;                     // posted by on_done (made with lo, hi)
  std::atomic<uint64_t> fired{0}; // host functions that ran
  uint64_t armed = 0;             // host functions enqueued
};

struct device {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;  // lt's making and use
  lane lanes[kLanes];
  std::atomic<bool> failed{false};
  std::atomic<bool> failing{false};  // why claimed (fail())
  char why[160] = "";             // set once, before failed
  ql__blaslt* lt = nullptr;       // cuBLASLt handle (lt_ready())
  std::atomic<int> lt_state{0};   // 0: not tried, 1: lt made, -1: failed
  std::atomic<int> cc{0};         // compute capability ·10 (89 = sm_89);
                                  // 0 until asked, -1 when unknown
  std::atomic<int> vmm{0};        // layouts exportable (vmm.h): 1 yes,
                                  // -1 no, 0 not asked yet
  std::atomic<int> readonly{0};   // the driver maps them read-only for
                                  // another process: 1 yes, -1 no, 0 not
                                  // tried yet (the first export tries)
};

device g_dev[kMaxDevices];
std::atomic<unsigned> g_timeout_ms{kDefaultTimeoutMs};
thread_local int t_ordinal = 0;

// Takes d out of service; the first reason stays. Two threads may fail
// the device at once: the one that claims why writes it, and only then
// sets failed, which readers of why test first; the other waits for that,
// so that the device is out of service when either returns.
int fail(device& d, const char* fmt, const char* what) {
  bool claimed = false;
  if (d.failing.compare_exchange_strong(claimed, true)) {
    snprintf(d.why, sizeof d.why, fmt, what);
    d.failed.store(true);
  }
  while (!d.failed.load()) sched_yield();
  return QL_EDEVICE;
}

// The QL_E* code of a CUDA error, at the boundary (DESIGN §7): running out
// of memory and a refused argument are errors of this call; anything else
// means the device can no longer be trusted.
int check(device& d, cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return 0;
    case cudaErrorMemoryAllocation:
      return QL_ENOMEM;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
      return QL_EINTERNAL;
    default:
      return fail(d, "CUDA error %s", cudaGetErrorName(e));
  }
}

// The same for a lane: a failure is its device's.
int fail(lane& l, const char* fmt, const char* what) {
  return fail(*l.g, fmt, what);
}
int check(lane& l, cudaError_t e) { return check(*l.g, e); }

// The launches just made: a launch error is reported here (and cleared
// unless sticky).
int check_launch(lane& l) { return check(*l.g, cudaGetLastError()); }

// Milliseconds since t0 (CLOCK_MONOTONIC).
uint64_t ms_since(const struct timespec& t0) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return uint64_t(now.tv_sec - t0.tv_sec) * 1000 +
         uint64_t(now.tv_nsec / 1000000) - uint64_t(t0.tv_nsec / 1000000);
}

uint64_t us_since(const struct timespec& t0) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return uint64_t(now.tv_sec - t0.tv_sec) * 1000000 +
         uint64_t(now.tv_nsec / 1000) - uint64_t(t0.tv_nsec / 1000);
}

// QL_CUDA_WAIT (see the top of the file), read once.
enum { kWaitAuto, kWaitSpin, kWaitHost, kWaitNap };
constexpr uint64_t kSpinUs = 2000;  // auto: poll this long before sleeping
constexpr uint64_t kBusyUs = 100;   // auto: then yield between polls
std::atomic<int> g_wait{-1};

int wait_mode() {
  int v = g_wait.load();
  if (v >= 0) return v;
  const char* s = getenv("QL_CUDA_WAIT");
  v = s == nullptr                ? kWaitAuto
      : strcmp(s, "spin") == 0 ? kWaitSpin
      : strcmp(s, "host") == 0 ? kWaitHost
      : strcmp(s, "nap") == 0  ? kWaitNap
                               : kWaitAuto;
  g_wait.store(v);
  return v;
}

// The device failed to finish within the kernel timeout.
int timed_out(lane& d) {
  char t[32];
  snprintf(t, sizeof t, "%u", g_timeout_ms.load());
  return fail(d, "a kernel did not finish within %s ms", t);
}

// Polls the stream until it is complete, for at most the kernel timeout
// from t0, or (spin_us non-zero) at most spin_us: then 1 with *rc unset,
// for the caller to wait on otherwise. nap: after 64 polls, 50 us between
// polls.
int poll(lane& d, const struct timespec& t0, uint64_t spin_us, bool nap,
         int* rc) {
  struct timespec nap_ts = {0, 50000};
  for (unsigned spin = 0;; spin++) {
    cudaError_t e = cudaStreamQuery(d.stream);
    if (e == cudaSuccess) {
      *rc = 0;
      return 0;
    }
    if (e != cudaErrorNotReady) {
      *rc = check(d, e);
      return 0;
    }
    if (spin_us != 0) {
      const uint64_t us = us_since(t0);
      if (us >= spin_us) return 1;
      if (us >= kBusyUs) sched_yield();
    }
    if (ms_since(t0) >= g_timeout_ms.load()) {
      *rc = timed_out(d);
      return 0;
    }
    if (nap && spin >= 64) nanosleep(&nap_ts, nullptr);
  }
}

// The host function of the host mode: it may call no CUDA API, and may run
// after its waiter gave up; it touches only the lane, which outlives it.
void CUDART_CB on_done(void* p) {
  lane* l = static_cast<lane*>(p);
  l->fired.fetch_add(1, std::memory_order_release);
  sem_post(&l->done);
}

// The host mode's wait: a host function after the work enqueued so far,
// and the lane's semaphore slept on in 1 ms slices. Posts of host
// functions whose waiters returned earlier (auto's spin saw the work done
// first) are drained, and the count of those that ran, not the posts,
// says when this one ran. Between slices the stream is queried: a sticky
// error fails the call at once, and work complete ends the wait (the host
// function ran, being part of it).
int wait_host(lane& d, const struct timespec& t0) {
  cudaError_t e = cudaLaunchHostFunc(d.stream, on_done, &d);
  if (e != cudaSuccess) return check(d, e);
  const uint64_t ticket = ++d.armed;
  while (sem_trywait(&d.done) == 0) {
  }
  while (d.fired.load(std::memory_order_acquire) < ticket) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_nsec += 1000000;
    if (dl.tv_nsec >= 1000000000) {
      dl.tv_sec++;
      dl.tv_nsec -= 1000000000;
    }
    if (sem_timedwait(&d.done, &dl) == 0) continue;
    e = cudaStreamQuery(d.stream);
    if (e == cudaSuccess) return 0;
    if (e != cudaErrorNotReady) return check(d, e);
    if (ms_since(t0) >= g_timeout_ms.load()) return timed_out(d);
  }
  // The host function ran after the work; an error of that work is sticky
  // and shows here (not ready only means the function is returning).
  e = cudaStreamQuery(d.stream);
  return e == cudaSuccess || e == cudaErrorNotReady ? 0 : check(d, e);
}

// Waits for everything enqueued on lane d's stream, for at most the kernel
// timeout, the way QL_CUDA_WAIT says. Never cudaStreamSynchronize: a
// kernel that never ends would block this thread for good, where a
// bounded wait lets the call fail and the device go out of service.
int wait(lane& d) {
  struct timespec t0;
  int rc = 0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  switch (wait_mode()) {
    case kWaitSpin:
      (void)poll(d, t0, 0, false, &rc);
      return rc;
    case kWaitNap:
      (void)poll(d, t0, 0, true, &rc);
      return rc;
    case kWaitHost:
      return wait_host(d, t0);
    default:
      if (poll(d, t0, kSpinUs, false, &rc) == 0) return rc;
      return wait_host(d, t0);
  }
}

// Calls of at most this many rows (decode batches) run on the lane's
// stream of the greatest priority: when a prefill launch of another lane
// fills the GPU, the block scheduler starts the decode kernel's blocks as
// soon as SMs free up instead of after every waiting block of the prefill.
constexpr int64_t kDecodeRows = 16;

// A lane of the current device of this thread, locked and ready for a
// call of m rows: its streams exist, the call's is chosen (kDecodeRows),
// and the device has not failed. The first free
// lane, so that concurrent callers run concurrently; lane 0, waited for,
// when every lane is taken. On success the caller runs its call and then
// leave()s.
int enter(lane** out, int64_t m) {
  int o = t_ordinal, rc = 0;
  if (o < 0 || o >= kMaxDevices) return QL_EINVAL;
  device& g = g_dev[o];
  lane* d = nullptr;
  for (int i = 0; i < kLanes && d == nullptr; i++)
    if (pthread_mutex_trylock(&g.lanes[i].mu) == 0) d = &g.lanes[i];
  if (d == nullptr) {
    d = &g.lanes[0];
    pthread_mutex_lock(&d->mu);
  }
  d->g = &g;
  if (g.failed.load())
    rc = QL_EDEVICE;
  else if (d->lo == nullptr) {
    // The semaphore first: a lane with streams has one.
    int least = 0, greatest = 0;
    if (sem_init(&d->done, 0, 0) != 0)
      rc = QL_ENOMEM;
    else if ((rc = check(g, cudaDeviceGetStreamPriorityRange(
                                &least, &greatest))) != 0 ||
             (rc = check(g, cudaStreamCreateWithPriority(
                                &d->hi, cudaStreamNonBlocking, greatest))) !=
                 0)
      sem_destroy(&d->done);
    else if ((rc = check(g, cudaStreamCreateWithFlags(
                                &d->lo, cudaStreamNonBlocking))) != 0) {
      (void)cudaStreamDestroy(d->hi);
      d->hi = nullptr;
      sem_destroy(&d->done);
    }
  }
  if (rc != 0) {
    pthread_mutex_unlock(&d->mu);
    return rc;
  }
  d->dev.used = d->host.used = 0;
  // The lane's previous call has completed (or quiesced): its other stream
  // holds nothing this call could overtake.
  d->stream = m <= kDecodeRows ? d->hi : d->lo;
  *out = d;
  return 0;
}

void leave(lane* d) { pthread_mutex_unlock(&d->mu); }

// Makes a hold at least n bytes (its contents are not kept).
int grow(lane& d, arena& a, size_t n, bool pinned) {
  if (n <= a.cap) return 0;
  size_t cap = round256(n + n / 4);
  void* p = nullptr;
  int rc;
  if (a.base != nullptr) {
    rc = check(d, pinned ? cudaFreeHost(a.base) : cudaFree(a.base));
    a.base = nullptr;
    a.cap = 0;
    if (rc != 0) return rc;
  }
  rc = check(d, pinned ? cudaMallocHost(&p, cap) : cudaMalloc(&p, cap));
  if (rc != 0) return rc;
  a.base = static_cast<unsigned char*>(p);
  a.cap = cap;
  return 0;
}

// Room for pieces of the given sizes in both arenas of lane d: every piece of
// one call is taken from what this reserved.
int reserve(lane& d, size_t dev_bytes, size_t host_bytes) {
  int rc = grow(d, d.dev, dev_bytes, false);
  return rc != 0 ? rc : grow(d, d.host, host_bytes, true);
}

void* take(arena& a, size_t n) {
  void* p = a.base + a.used;
  a.used += round256(n);
  return p;
}

int device_count(const char** why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0)) {
    *why = "the CUDA driver sees no GPU";
    return 0;
  }
  if (e == cudaErrorInsufficientDriver) {
    *why = "no CUDA driver, or one older than this toolkit needs";
    return 0;
  }
  if (e != cudaSuccess) {
    *why = "the CUDA runtime did not start";
    return 0;
  }
  if (n > kMaxDevices) n = kMaxDevices;
  return n;
}

// The compute capability of ordinal o times ten (86, 89, 90), asked of
// the runtime once; -1 when it cannot say.
int cc_of(int o) {
  if (o < 0 || o >= kMaxDevices) return -1;
  int cc = g_dev[o].cc.load();
  if (cc != 0) return cc;
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, o) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, o) !=
          cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: this call's own error
    return -1;                 // not cached: the next call asks again
  }
  cc = major * 10 + minor;
  g_dev[o].cc.store(cc);
  return cc;
}

// FP8 tensor cores, which cuBLASLt's FP8 GEMM needs, start with sm_89
// (Ada); its documentation lists FP8 for compute capability 8.9 and newer.
constexpr int kMinF8Cc = 89;

// True when ordinal o has a cuBLASLt handle, made here the first time (on
// o, as the current device of the calling thread for the while). Made
// before any op is dispatched to cuBLASLt, so that a library that does not
// start on a device sends every call to the generic op, the first one too.
bool lt_ready(int o) {
  device& d = g_dev[o];
  int st = d.lt_state.load();
  if (st != 0) return st > 0;
  pthread_mutex_lock(&d.mu);
  if (d.lt_state.load() == 0) {
    int cur = -1, rc;
    if (cudaGetDevice(&cur) != cudaSuccess || cur == o ||
        cudaSetDevice(o) == cudaSuccess) {
      rc = ql__blaslt_create(&d.lt);
      if (cur >= 0 && cur != o) (void)cudaSetDevice(cur);
    } else {
      rc = QL_EDEVICE;
    }
    (void)cudaGetLastError();  // an error of this attempt, not of an op
    // Out of memory is not a verdict on the library: tried again later.
    if (rc != QL_ENOMEM) d.lt_state.store(rc == 0 ? 1 : -1);
  }
  pthread_mutex_unlock(&d.mu);
  return d.lt_state.load() > 0;
}

// QL_CUDA_IMMA_MIN_ROWS: q8c batches of at least this many rows run their
// AQ product on cuBLASLt's IMMA instead of our tensor-core kernel; 0:
// never; unset or malformed: kImmaDefaultRows. Both give the reference's
// bytes (int32 sums are exact, and the epilogues are the reference's), so
// the switch changes no result, only which code makes it. The default is
// measured (H200, 14336x4096): IMMA 26 us against 52 us at M = 16, 117 us
// against 1297 us at M = 512. Read once.
constexpr long long kImmaDefaultRows = 16;
std::atomic<long long> g_imma_rows{-1};

// A count of the environment variable name, read once into *cache (-1:
// not yet): def when unset or not a whole non-negative number.
long long env_count(const char* name, long long def,
                    std::atomic<long long>* cache) {
  long long v = cache->load();
  if (v >= 0) return v;
  const char* s = getenv(name);
  char* end = nullptr;
  v = s != nullptr ? strtoll(s, &end, 10) : def;
  if (s != nullptr && (end == s || *end != '\0' || v < 0)) v = def;
  cache->store(v);
  return v;
}

long long imma_min_rows() {
  return env_count("QL_CUDA_IMMA_MIN_ROWS", kImmaDefaultRows, &g_imma_rows);
}


}  // namespace


namespace {

// Why f8r AQ on ordinal o does not use cuBLASLt, or nullptr when it does.
const char* f8r_declined(int o) {
  const char* why = nullptr;
  if (ql__blaslt_load(&why) != 0) return why;
  if (o < 0 || o >= kMaxDevices) return "no such device";
  int cc = cc_of(o);
  if (cc < 0) return "its compute capability is unknown";
  if (cc < kMinF8Cc) return "FP8 GEMM needs sm_89 or newer";
  // A device out of service keeps its ops, which say QL_EDEVICE, as the
  // other ops of this backend do; no handle is made on it.
  if (!g_dev[o].failed.load() && !lt_ready(o))
    return "cuBLASLt did not start on it";
  return nullptr;
}

int device_info(int o, ql_device_desc* out) {
  cudaDeviceProp p;
  if (o < 0 || o >= kMaxDevices) return QL_EINVAL;
  memset(&p, 0, sizeof p);
  if (cudaGetDeviceProperties(&p, o) != cudaSuccess) {
    (void)cudaGetLastError();  // not an error of the thread's next op
    return QL_EDEVICE;
  }
  ql__cuda_device_name(reinterpret_cast<const unsigned char*>(p.uuid.bytes),
                       out->name, sizeof out->name);
  snprintf(out->alias, sizeof out->alias, "cuda:%d", o);
  snprintf(out->model, sizeof out->model, "%.50s sm_%d%d", p.name, p.major,
           p.minor);
  // All of it: the daemon's budget (accel_budget_percent) decides the
  // share weights may take.
  out->memory_bytes = p.totalGlobalMem;
  // Peak bandwidth: memory clock (kHz) x 2 transfers per clock x bus width
  // (bits) / 8, the formula of NVIDIA's deviceQuery and bandwidth samples.
  // CUDA 13 dropped memoryClockRate and memoryBusWidth from cudaDeviceProp;
  // the attributes remain.
  int khz = 0, bits = 0;
  out->peak_bytes_per_s = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, o) ==
          cudaSuccess &&
      cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, o) ==
          cudaSuccess &&
      khz > 0 && bits > 0)
    out->peak_bytes_per_s = uint64_t(khz) * 1000u * 2u * uint64_t(bits) / 8u;
  else
    (void)cudaGetLastError();  // not a failure of the device
  const char* no = f8r_declined(o);
  size_t v = ql__blaslt_version();
  if (no == nullptr)
    snprintf(out->note, sizeof out->note,
             "f8r activation-quantized on cuBLASLt %zu.%zu.%zu%s", v / 10000,
             v / 100 % 100, v % 100,
             (ql__blaslt_flags() & QL__BLASLT_FAST_ACCUM)
                 ? " with fast accumulation (QL_CUDA_F8_FAST_ACCUM=1)"
                 : "");
  else
    snprintf(out->note, sizeof out->note,
             "f8r activation-quantized on the generic op: %s", no);
  if (imma_min_rows() > 0) {
    size_t at = strlen(out->note);
    snprintf(out->note + at, sizeof out->note - at,
             "; q8c from %lld rows on %s", imma_min_rows(),
             ql__blaslt_load(nullptr) == 0 && lt_ready(o)
                 ? "cuBLASLt IMMA"
                 : "our kernel (no cuBLASLt)");
  }
  return 0;
}

int device_bind(int o) {
  if (o < 0 || o >= kMaxDevices) return QL_EINVAL;
  if (g_dev[o].failed.load()) return QL_EDEVICE;
  int rc = check(g_dev[o], cudaSetDevice(o));
  if (rc == 0) t_ordinal = o;
  return rc;
}

int device_error(int o, char* buf, size_t len) {
  if (o < 0 || o >= kMaxDevices || len == 0) return QL_EINVAL;
  if (!g_dev[o].failed.load()) return 0;
  snprintf(buf, len, "%s", g_dev[o].why);
  return QL_EDEVICE;
}

int configure(const ql_backend_config* c) {
  if (c->kernel_timeout_ms != 0) g_timeout_ms.store(c->kernel_timeout_ms);
  return 0;
}

// ---- host memory ----

// Ranges of host_register, kept sorted by base: a call asks whether its x
// or y lies inside one. A handful (a session's regions), so a plain array.
struct host_range {
  uintptr_t base;
  size_t len;
  uintptr_t dev;  // its device address (mapped), or 0: DMA only
};
pthread_mutex_t g_reg_mu = PTHREAD_MUTEX_INITIALIZER;
host_range* g_reg = nullptr;
size_t g_nreg = 0, g_capreg = 0;

// True when [p, p + n) lies inside one registered range; *dev then gets
// its device address, or NULL where the range is not mapped.
bool registered(const void* p, size_t n, void** dev) {
  const uintptr_t a = uintptr_t(p);
  bool in = false;
  *dev = nullptr;
  pthread_mutex_lock(&g_reg_mu);
  for (size_t i = 0; i < g_nreg && g_reg[i].base <= a && !in; i++) {
    in = a - g_reg[i].base < g_reg[i].len &&
         n <= g_reg[i].len - (a - g_reg[i].base);
    if (in && g_reg[i].dev != 0)
      *dev = reinterpret_cast<void*>(g_reg[i].dev + (a - g_reg[i].base));
  }
  pthread_mutex_unlock(&g_reg_mu);
  return in;
}

// Makes the first device in service current for the calling thread, for
// the runtime calls that act on the process's memory rather than on one
// device (registration is portable: every device's copy engines see it).
// *cur gets the device that was current, for unbind(); the thread's ops
// (t_ordinal) are not moved.
int bind_any(int* cur) {
  int n = 0;
  *cur = -1;
  if (cudaGetDeviceCount(&n) != cudaSuccess ||
      cudaGetDevice(cur) != cudaSuccess) {
    (void)cudaGetLastError();
    return QL_ENOTSUP;
  }
  for (int o = 0; o < n && o < kMaxDevices; o++)
    if (!g_dev[o].failed.load() && cudaSetDevice(o) == cudaSuccess) return 0;
  (void)cudaGetLastError();
  return QL_EDEVICE;
}

void unbind(int cur) {
  if (cur >= 0) (void)cudaSetDevice(cur);
  (void)cudaGetLastError();
}

// Page-locks the caller's [p, p + len) for DMA (registry.h). A refusal of
// the runtime is this call's and never takes a device out of service: the
// ops then stage, and a device that really failed says so on its next op.
int host_register(void* p, size_t len) {
  const uintptr_t a = uintptr_t(p);
  uintptr_t dev = 0;
  host_range* grown;
  int rc = 0, cur = -1;
  if (p == nullptr || len == 0 || len > UINTPTR_MAX - a) return QL_EINVAL;
  pthread_mutex_lock(&g_reg_mu);
  size_t at = 0;
  while (at < g_nreg && g_reg[at].base < a) at++;
  if ((at > 0 && a - g_reg[at - 1].base < g_reg[at - 1].len) ||
      (at < g_nreg && g_reg[at].base - a < len)) {
    rc = QL_EINVAL;
    goto done;
  }
  if (g_nreg == g_capreg) {
    size_t cap = g_capreg ? 2 * g_capreg : 16;
    grown = static_cast<host_range*>(realloc(g_reg, cap * sizeof *g_reg));
    if (grown == nullptr) {
      rc = QL_ENOMEM;
      goto done;
    }
    g_reg = grown;
    g_capreg = cap;
  }
  if ((rc = bind_any(&cur)) != 0) goto done;
  // Portable: pinned for every device's context, not only the current one.
  // Mapped: the small copies of a call run as kernels (move()). Under
  // unified addressing the device address is the same for every device.
  switch (cudaHostRegister(p, len,
                           cudaHostRegisterPortable | cudaHostRegisterMapped)) {
    case cudaSuccess:
      break;
    case cudaErrorMemoryAllocation:
      rc = QL_ENOMEM;
      break;
    case cudaErrorInvalidValue:
    case cudaErrorHostMemoryAlreadyRegistered:
      rc = QL_EINVAL;
      break;
    default:
      rc = QL_EDEVICE;
  }
  if (rc == 0) {
    void* dp = nullptr;
    // No device address: the range is still pinned, for DMA.
    dev = cudaHostGetDevicePointer(&dp, p, 0) == cudaSuccess ? uintptr_t(dp)
                                                              : 0;
  }
  unbind(cur);  // and the error is this call's, not a later op's
  if (rc != 0) goto done;
  memmove(g_reg + at + 1, g_reg + at, (g_nreg - at) * sizeof *g_reg);
  g_reg[at].base = a;
  g_reg[at].len = len;
  g_reg[at].dev = dev;
  g_nreg++;
done:
  pthread_mutex_unlock(&g_reg_mu);
  return rc;
}

// Undoes host_register(p). Out of the table first, so no call starts a
// DMA on it (the caller has none in flight); a failed device's answer
// changes nothing.
void host_unregister(void* p) {
  pthread_mutex_lock(&g_reg_mu);
  size_t i = 0;
  while (i < g_nreg && g_reg[i].base != uintptr_t(p)) i++;
  if (i < g_nreg) {
    memmove(g_reg + i, g_reg + i + 1, (g_nreg - i - 1) * sizeof *g_reg);
    g_nreg--;
    int cur;
    if (bind_any(&cur) == 0) (void)cudaHostUnregister(p);
    unbind(cur);
  }
  pthread_mutex_unlock(&g_reg_mu);
}

// ---- the layout ----

// A repacked weight: the kernels' view (dev, whose arrays point into mem,
// one device allocation) and its size. The allocation is exportable (vm,
// vmm.h) where the driver can, for mapped mode; else a cudaMalloc.
struct packed {
  ql__cuda_wo dev;
  void* mem;
  size_t bytes;   // the allocation's: what the device's memory pays
  size_t layout;  // the layout's own bytes, without the rounding
  ql__vmm_mem vm; // vm.size 0: mem came from cudaMalloc
};

// 1 when layouts keep f16 and bf16 scales and zero points as f32: the
// default, since the weight-only kernel reads 2-byte scales slower than
// it reads the extra bytes (an H100, q4g g128 M=1, qlinear-bench --device
// --scale-dtype bf16: 37.5 us against 28.6 at 14336x4096, 14.0 against
// 11.8 at 4096x4096, for 6 % more bytes). QL_CUDA_WIDE_SCALES=0 keeps
// their dtype. Read once.
bool wide_scales() {
  static std::atomic<int> v{0};
  int x = v.load();
  if (x == 0) {
    const char* e = getenv("QL_CUDA_WIDE_SCALES");
    x = e != nullptr && strcmp(e, "0") == 0 ? -1 : 1;
    v.store(x);
  }
  return x > 0;
}

// 1 when ordinal's layouts go through vmm.h (mapped mode can export
// them), asked once per device. QL_CUDA_VMM=0 in the environment keeps
// them on cudaMalloc (no mapped mode, no rounding to the granularity).
bool use_vmm(int o) {
  device& d = g_dev[o];
  int v = d.vmm.load();
  if (v == 0) {
    const char* e = getenv("QL_CUDA_VMM");
    v = (e != nullptr && strcmp(e, "0") == 0) || !ql__vmm_supported(o) ? -1
                                                                       : 1;
    d.vmm.store(v);
  }
  return v > 0;
}

// True when p was made from a weight of w's shape and parameters.
bool packed_matches(const packed* p, const ql_qweight* w) {
  return p->dev.format == int(w->format) && p->dev.n == w->n &&
         p->dev.k == w->k && p->dev.groups == w->groups &&
         p->dev.gs == w->group_size &&
         (p->dev.sdt == int(w->scale_dtype) ||
          p->dev.sdt == int(QL_DTYPE_F32)) &&
         (p->dev.zero != nullptr) == (w->zero != nullptr) &&
         (p->dev.bias != nullptr) == (w->bias != nullptr);
}

void free_packed(void* pp) {
  packed* p = static_cast<packed*>(pp);
  if (p == nullptr) return;
  // cudaFree takes a pointer of any device (unified addressing); a failed
  // device's memory goes with its context, so an error here changes
  // nothing. The driver's unmap and release act on the current context:
  // the layout's device is made current for them.
  if (p->vm.size != 0) {
    // Only a device that is not current already is switched to and back:
    // making one current creates its context.
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess) cur = -1;
    if (cur != p->vm.ordinal) (void)cudaSetDevice(p->vm.ordinal);
    ql__vmm_free(&p->vm);
    if (cur >= 0 && cur != p->vm.ordinal) (void)cudaSetDevice(cur);
    (void)cudaGetLastError();
  } else {
    (void)cudaFree(p->mem);
  }
  free(p);
}

// Builds the layout of ql_cuda.h for w on the current device: rows of
// codes padded to 16 bytes, scale and zero transposed from [G, N] to
// [N, G], bias copied. The image is made in host memory and copied once.
int make_packed(const ql_qweight* w, packed** out) {
  size_t n, g, ssz, rb, ldq, q_bytes, s_bytes, b_bytes, off_s, off_z, off_b,
      total, copy;
  packed* p = nullptr;
  unsigned char* img = nullptr;
  int rc, o = t_ordinal;

  *out = nullptr;
  if ((rc = ql_qweight_check(w)) != 0) return rc;
  if (o < 0 || o >= kMaxDevices) return QL_EINVAL;
  device& d = g_dev[o];
  if (d.failed.load()) return QL_EDEVICE;
  n = size_t(w->n);
  g = size_t(w->groups);
  ssz = wide_scales() ? sizeof(float) : ql_dtype_size(w->scale_dtype);
  rb = size_t(ql__cuda_row_bytes(int(w->format), w->k));
  ldq = round16(rb);
  // f8r and q8c: rows of zero codes up to a multiple of 16, which
  // cuBLASLt's GEMMs need of their m (blaslt.h); they add nothing and are
  // never read back.
  const bool pad_n = w->format == QL_FORMAT_F8R || w->format == QL_FORMAT_Q8C;
  if (!mul_size(pad_n ? round16(n) : n, ldq, &q_bytes) ||
      !mul_size(n, g, &s_bytes) ||
      !mul_size(s_bytes, ssz, &s_bytes) ||
      !mul_size(n, sizeof(float), &b_bytes))
    return QL_ESHAPE;
  off_s = round16(q_bytes);
  if (!add_size(off_s, round16(s_bytes), &off_z) ||
      !add_size(off_z, w->zero != nullptr ? round16(s_bytes) : 0, &off_b) ||
      !add_size(off_b, w->bias != nullptr ? b_bytes : 0, &total) ||
      total > SIZE_MAX - 256)
    return QL_ESHAPE;

  if ((p = static_cast<packed*>(calloc(1, sizeof *p))) == nullptr)
    return QL_ENOMEM;
  // A layout the driver would not make exportable (any refusal but out of
  // memory) is made with cudaMalloc instead: it serves as well, only not
  // in mapped mode, and the runtime's answer says whether the device is
  // still in service.
  rc = use_vmm(o) ? ql__vmm_alloc(o, total, &p->vm) : QL_ENOTSUP;
  if (rc == QL_ENOMEM) goto fail;
  if (rc == 0)
    p->mem = p->vm.base;
  else if ((rc = check(d, cudaMalloc(&p->mem, total))) != 0)
    goto fail;
  // The image covers the whole allocation: the rounding past the layout
  // is exported with it (mapped mode), and cuMemCreate does not clear
  // memory, so it is written too, with zeros, lest other bytes of this
  // process reach a client that way.
  copy = p->vm.size != 0 ? p->vm.size : total;
  rc = QL_ENOMEM;
  if ((img = static_cast<unsigned char*>(calloc(1, copy))) == nullptr)
    goto fail;
  // Rows of codes; the padding is zero (a zero code adds x·0).
  for (size_t r = 0; r < n; r++) memcpy(img + r * ldq, w->qdata + r * rb, rb);
  if (ssz == ql_dtype_size(w->scale_dtype)) {
    // [G, N] -> [N, G], element by element in the stored dtype.
    const unsigned char* sc = static_cast<const unsigned char*>(w->scale);
    const unsigned char* zc = static_cast<const unsigned char*>(w->zero);
    for (size_t r = 0; r < n; r++)
      for (size_t j = 0; j < g; j++) {
        memcpy(img + off_s + (r * g + j) * ssz, sc + (j * n + r) * ssz, ssz);
        if (zc != nullptr)
          memcpy(img + off_z + (r * g + j) * ssz, zc + (j * n + r) * ssz, ssz);
      }
  } else {
    // The same, widened to f32 (exact from f16 and bf16: the kernels read
    // the same values).
    for (size_t r = 0; r < n; r++)
      for (size_t j = 0; j < g; j++) {
        float v = ql_load_f32(w->scale_dtype, w->scale, j * n + r);
        memcpy(img + off_s + (r * g + j) * ssz, &v, ssz);
        if (w->zero != nullptr) {
          v = ql_load_f32(w->scale_dtype, w->zero, j * n + r);
          memcpy(img + off_z + (r * g + j) * ssz, &v, ssz);
        }
      }
  }
  if (w->bias != nullptr) memcpy(img + off_b, w->bias, b_bytes);
  // cudaMemcpy from pageable memory may return before its DMA lands (CUDA
  // Runtime API, "API synchronization behavior"); it is ordered only with
  // the legacy default stream, and the lanes' streams are non-blocking, so
  // a kernel launched at once could read the layout before it is there.
  // Synchronizing the legacy stream waits for it.
  if ((rc = check(d, cudaMemcpy(p->mem, img, copy,
                                cudaMemcpyHostToDevice))) != 0)
    goto fail;
#ifndef QL_MUT_LAYOUT_NO_SYNC  // mutation test: the layout may land late
  if ((rc = check(d, cudaStreamSynchronize(nullptr))) != 0) goto fail;
#endif
  free(img);
  p->bytes = p->vm.size != 0 ? p->vm.size : total;
  p->layout = total;
  {
    unsigned char* mem = static_cast<unsigned char*>(p->mem);
    p->dev.format = int(w->format);
    p->dev.sdt = ssz == ql_dtype_size(w->scale_dtype) ? int(w->scale_dtype)
                                                       : int(QL_DTYPE_F32);
    p->dev.n = w->n;
    p->dev.k = w->k;
    p->dev.groups = w->groups;
    p->dev.gs = w->group_size;
    p->dev.ldq = int64_t(ldq);
    p->dev.q = mem;
    p->dev.scale = mem + off_s;
    p->dev.zero = w->zero != nullptr ? mem + off_z : nullptr;
    p->dev.bias = w->bias != nullptr ? reinterpret_cast<float*>(mem + off_b)
                                     : nullptr;
    // Unknown (0) is safe: the kernel then takes one block per row tile.
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
                               t_ordinal) != cudaSuccess) {
      (void)cudaGetLastError();
      sms = 0;
    }
    p->dev.sms = sms;
  }
  *out = p;
  return 0;
fail:
  free(img);
  free_packed(p);
  return rc;
}

int repack(ql_repack_args* a) {
  packed* p;
  int rc;
  if (a == nullptr || a->w == nullptr) return QL_EINVAL;
  rc = make_packed(a->w, &p);
  a->packed = p;
  a->packed_bytes = rc == 0 ? p->bytes : 0;
  return rc;
}

}  // namespace

const ql__cuda_wo* ql__cuda_packed_view(const void* pp, size_t* bytes) {
  const packed* p = static_cast<const packed*>(pp);
  if (p == nullptr) return nullptr;
  if (bytes != nullptr) *bytes = p->layout;
  return &p->dev;
}

namespace {

// ---- linear_wo ----

// The argument checks of kernels/reference.c op_args(), so that the CUDA
// ops fail where and how the generic ones do. *xb, *yb: bytes of x and y.
int linear_args(const ql_linear_args* a, size_t* mk, size_t* xb, size_t* yb) {
  size_t mn, esz;
  int rc;
  if (a == nullptr || a->w == nullptr || a->x == nullptr || a->y == nullptr)
    return QL_EINVAL;
  if ((rc = ql_qweight_check(a->w)) != 0) return rc;
  if ((esz = ql_dtype_size(a->dt)) == 0) return QL_EDTYPE;
  if (a->m < 1 || a->m > QL_DIM_MAX) return QL_ESHAPE;
  if (!mul_size(size_t(a->m), size_t(a->w->k), mk) ||
      !mul_size(*mk, sizeof(float), xb) ||
      !mul_size(size_t(a->m), size_t(a->w->n), &mn) ||
      !mul_size(mn, sizeof(float), yb))
    return QL_ESHAPE;
  *xb = *mk * esz;
  *yb = mn * esz;
  return 0;
}

// The layout a call reads: the caller's (made at load), else one made for
// this call in *tmp, which the caller frees.
int layout_of(const ql_linear_args* a, const packed** p, packed** tmp) {
  *tmp = nullptr;
  if (a->packed != nullptr) {
    *p = static_cast<const packed*>(a->packed);
    return packed_matches(*p, a->w) ? 0 : QL_EINVAL;
  }
  int rc = make_packed(a->w, tmp);
  *p = *tmp;
  return rc;
}

// The device side of one linear call: x, y and the intermediates of AQ,
// carved from d's arenas.
struct call {
  void* dx;            // x as given
  void* dy;            // y
  float* xf;           // AQ, f16/bf16 x: x widened to f32
  int8_t* xq;          // AQ: int8 (or e4m3) rows
  float* sx;           // AQ: their scales
  int32_t* gsum;       // AQ q4g: group sums
  int64_t* status;     // AQ: quantize_rows' verdict per row
  float* part;         // WO: split-K's partial sums; AQ on cuBLASLt: its
                       // product (f32 or int32); or NULL
  int* bad;            // NaN/Inf flag
  unsigned char* hs;   // pinned staging for x, then y
  int64_t* hstatus;    // pinned copy of status
  int* hbad;           // pinned copy of bad
  bool xreg, yreg;     // x, y in host memory of host_register
  void* xmap;          // the device address of a registered x, or NULL
  void* ymap;          // the device address of a registered y, or NULL
};

// A registered y of at least this many bytes is copied into place after
// the verdict (a second DMA and wait, some 10 to 20 us) rather than
// through staging in the one wait and memcpy'd (host memory copies at
// roughly 10 GB/s, so 256 KiB take some 25 us). A decode's y (M = 1: N
// elements) is far below it and keeps the one wait.
constexpr size_t kDirectYMin = size_t(256) << 10;

// Reserves and carves a call's memory: aq adds the AQ intermediates for
// groups per row (0: no group sums), with rows of codes ldxq bytes apart;
// part bytes of f32 scratch go to c->part.
int carve(lane* d, const ql_linear_args* a, size_t mk, size_t xb, size_t yb,
          bool aq, int64_t groups, size_t part, size_t ldxq, unsigned where,
          call* c) {
  const size_t m = size_t(a->m);
  // A tensor already in device memory needs neither a device copy nor
  // staging.
  const bool xdev = where & QL_LINEAR_X_DEVICE, ydev = where & QL_LINEAR_Y_DEVICE;
  const size_t xs = xdev ? 0 : xb, ys = ydev ? 0 : yb;
  const size_t xf = aq && a->dt != QL_DTYPE_F32 ? mk * sizeof(float) : 0,
               xq = aq ? m * ldxq : 0, sx = aq ? m * sizeof(float) : 0,
               gs = aq ? m * size_t(groups) * sizeof(int32_t) : 0,
               st = aq ? m * sizeof(int64_t) : 0, hs = xs > ys ? xs : ys;
  const size_t dev = round256(xs) + round256(ys) + round256(xf) +
                     round256(xq) + round256(sx) + round256(gs) +
                     round256(st) + round256(part) + 256;
  int rc = reserve(*d, dev, round256(hs) + round256(st) + 256);
  if (rc != 0) return rc;
  memset(c, 0, sizeof *c);
  c->dx = xdev ? const_cast<void*>(a->x) : take(d->dev, xb);
  c->dy = ydev ? a->y : take(d->dev, yb);
  if (xf) c->xf = static_cast<float*>(take(d->dev, xf));
  if (xq) c->xq = static_cast<int8_t*>(take(d->dev, xq));
  if (sx) c->sx = static_cast<float*>(take(d->dev, sx));
  if (gs) c->gsum = static_cast<int32_t*>(take(d->dev, gs));
  if (st) c->status = static_cast<int64_t*>(take(d->dev, st));
  if (part) c->part = static_cast<float*>(take(d->dev, part));
  c->bad = static_cast<int*>(take(d->dev, sizeof(int)));
  c->hs = static_cast<unsigned char*>(take(d->host, hs));
  if (st) c->hstatus = static_cast<int64_t*>(take(d->host, st));
  c->hbad = static_cast<int*>(take(d->host, sizeof(int)));
  c->xreg = !xdev && registered(a->x, xb, &c->xmap);
  c->yreg = !ydev && registered(a->y, yb, &c->ymap);
  return 0;
}

// QL_CUDA_SM_COPY_MAX (bytes), read once: the largest copy of a call
// between host and device memory that runs as a kernel (move()); 0: every
// copy by DMA. Default 1 MiB: a decode batch's x and y (kDecodeRows rows of
// 16384 f32 values: the rows of enter()'s priority stream), not a
// prefill's.
constexpr size_t kSmCopyDefault = size_t(kDecodeRows) * 16384 * sizeof(float);
static_assert(kSmCopyDefault == size_t(1) << 20, "1 MiB");
std::atomic<long long> g_sm_copy_max{-1};

size_t sm_copy_max() {
  return size_t(env_count("QL_CUDA_SM_COPY_MAX", (long long)kSmCopyDefault,
                          &g_sm_copy_max));
}

// Enqueues a copy of n bytes from src to dst, one side host memory, on
// d's stream. Small ones run as a kernel (ql__cuda_copy) where both ends
// have a device address (kdst, ksrc: device memory, pinned staging, or
// the mapped address of a registered range; NULL: none): the copy engines
// take the copies of all streams in the order they were queued, so a
// decode call's few kilobytes would otherwise wait behind a prefill's
// tens of megabytes going over PCIe on another lane (measured on an H100
// through the daemon: decode p99 630 us under a prefill stream, 110 us
// alone). Large ones, and any without device addresses, go by DMA.
int move(lane& d, void* dst, void* kdst, const void* src, const void* ksrc,
         size_t n, cudaMemcpyKind kind) {
  if (n != 0 && n <= sm_copy_max() && kdst != nullptr && ksrc != nullptr) {
    ql__cuda_copy(kdst, ksrc, n, d.stream);
    return check_launch(d);
  }
  return check(d, cudaMemcpyAsync(dst, src, n, kind, d.stream));
}

// move() between ends that are their own device addresses: device memory
// and pinned staging.
int move(lane& d, void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  return move(d, dst, dst, src, src, n, kind);
}

// The verdict of quantize_rows, as run_qrows gives it: the first row in
// order that the reference would refuse decides.
int rows_verdict(const int64_t* st, int64_t m) {
  for (int64_t r = 0; r < m; r++)
    if (st[r] != 0) return (st[r] & 3) == 1 ? QL_ENONFINITE : QL_EINVAL;
  return 0;
}

// Enqueues x's copy to the device (straight from a registered x, else
// through pinned staging: a real asynchronous DMA either way), its NaN/Inf
// check and the flag's copy back; nothing waits here. x already in device
// memory (where) is checked where it is.
int enqueue_x(lane* d, const ql_linear_args* a, size_t mk, size_t xb,
              unsigned where, const call* c) {
  int rc;
  if (!(where & QL_LINEAR_X_DEVICE)) {
    const void* src = a->x;
    const void* ksrc = c->xmap;
    if (!c->xreg) {
      memcpy(c->hs, a->x, xb);
      src = ksrc = c->hs;  // pinned: mapped at its own address
    }
    if ((rc = move(*d, c->dx, c->dx, src, ksrc, xb,
                   cudaMemcpyHostToDevice)) != 0)
      return rc;
  }
  if ((rc = check(*d, cudaMemsetAsync(c->bad, 0, sizeof(int), d->stream))) !=
      0)
    return rc;
  ql__cuda_check_finite(int(a->dt), c->dx, int64_t(mk), c->bad, d->stream);
  if ((rc = check_launch(*d)) != 0) return rc;
  return move(*d, c->hbad, c->bad, sizeof(int), cudaMemcpyDeviceToHost);
}

// The verdict on x once the stream has caught up: QL_ENONFINITE when it
// holds NaN or Inf (DESIGN §4), before AQ's verdict per row (aq_rows rows
// of c->hstatus; 0: WO), as the reference decides.
int verdict(const ql_linear_args* a, const call* c, int64_t aq_rows) {
  if (*c->hbad) return QL_ENONFINITE;
  return aq_rows > 0 ? rows_verdict(c->hstatus, a->m) : 0;
}

// For a y in device memory, which the product would write at once: waits
// for the verdict before the product is launched. Other calls settle it
// in finish().
int settle_early(lane* d, const ql_linear_args* a, unsigned where,
                 const call* c, int64_t aq_rows) {
  if (!(where & QL_LINEAR_Y_DEVICE)) return 0;
  int rc = wait(*d);
  return rc != 0 ? rc : verdict(a, c, aq_rows);
}

// After the launch of the product: the one wait of the call, the verdict,
// and y back to the caller only when it stands (see the top of the file).
// A y in device memory is complete there.
int finish(lane* d, const ql_linear_args* a, size_t yb, unsigned where,
           const call* c, int64_t aq_rows) {
  int rc;
  if ((rc = check_launch(*d)) != 0) return rc;
  if (where & QL_LINEAR_Y_DEVICE) return wait(*d);
  const bool direct = c->yreg && yb >= kDirectYMin;
  if (!direct &&
      (rc = move(*d, c->hs, c->dy, yb, cudaMemcpyDeviceToHost)) != 0)
    return rc;
  if ((rc = wait(*d)) != 0 || (rc = verdict(a, c, aq_rows)) != 0) return rc;
  if (!direct) {
    memcpy(a->y, c->hs, yb);
    return 0;
  }
  if ((rc = move(*d, a->y, c->ymap, c->dy, c->dy, yb,
                 cudaMemcpyDeviceToHost)) != 0)
    return rc;
  return wait(*d);
}

// After a call that failed (or gave up for a fallback) with work still
// enqueued: the lane's next call must not reuse staging that a copy of
// this one has yet to read. A device out of service has nothing to wait
// for.
void quiesce(lane* d) {
  if (!d->g->failed.load()) (void)wait(*d);
}

// run_wo() with d entered.
int wo_on(lane* d, const ql_linear_args* a, size_t mk, size_t xb,
          size_t yb, unsigned where) {
  const packed* p;
  packed* tmp;
  call c;
  int rc;
  if ((rc = layout_of(a, &p, &tmp)) == 0 &&
      (rc = carve(d, a, mk, xb, yb, false, 0,
                  ql__cuda_linear_wo_scratch(&p->dev, a->m), 0, where,
                  &c)) == 0 &&
      (rc = enqueue_x(d, a, mk, xb, where, &c)) == 0 &&
      (rc = settle_early(d, a, where, &c, 0)) == 0) {
    ql__cuda_linear_wo(&p->dev, ql__cuda_wo_kernel(), int(a->dt), c.dx,
                       a->m, c.dy, c.part, d->stream);
    rc = finish(d, a, yb, where, &c, 0);
  }
  free_packed(tmp);
  return rc;
}

// Waits on the host for the client's ready event, for at most the kernel
// timeout (see the top of the file for why not cudaStreamWaitEvent),
// polling, yielding the CPU after the first 64 polls.
// cudaErrorNotReady is no error; an event that cannot be queried is the
// client's mistake (QL_EINVAL); a sticky error is the device's.
int wait_ready(lane& d, void* ev) {
  struct timespec t0, now;
  if (ev == nullptr) return 0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (unsigned spin = 0;; spin++) {
    cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(ev));
    if (e == cudaSuccess) return 0;
    if (e == cudaErrorInvalidResourceHandle || e == cudaErrorInvalidValue) {
      (void)cudaGetLastError();
      return QL_EINVAL;
    }
    if (e != cudaErrorNotReady) return check(d, e);
    clock_gettime(CLOCK_MONOTONIC, &now);
    uint64_t ms = uint64_t(now.tv_sec - t0.tv_sec) * 1000 +
                  uint64_t(now.tv_nsec / 1000000) - uint64_t(t0.tv_nsec / 1000000);
    if (ms >= g_timeout_ms.load()) return QL_ETIMEDOUT;
    // The producer is another process's: give way to it, but no fixed
    // nap, which would add its length (and the timer's slack) to the call.
    if (spin >= 64) sched_yield();
  }
}

// The checks every device-tensor call adds to linear_args(): known bits,
// and something device-side to do.
int dev_args(const ql_linear_dev_args* da) {
  if (da == nullptr ||
      (da->where & ~(QL_LINEAR_X_DEVICE | QL_LINEAR_Y_DEVICE)) != 0)
    return QL_EINVAL;
  return 0;
}

int run_wo_where(const ql_linear_args* a, unsigned where, void* ready) {
  lane* d;
  size_t mk, xb, yb;
  int rc;
  if ((rc = linear_args(a, &mk, &xb, &yb)) != 0) return rc;
  if ((rc = enter(&d, a->m)) != 0) return rc;
  if ((rc = wait_ready(*d, ready)) == 0 &&
      (rc = wo_on(d, a, mk, xb, yb, where)) != 0)
    quiesce(d);
  leave(d);
  return rc;
}

int run_wo(const ql_linear_args* a) { return run_wo_where(a, 0, nullptr); }

int run_wo_dev(const ql_linear_dev_args* da) {
  int rc = dev_args(da);
  return rc != 0 ? rc : run_wo_where(&da->a, da->where, da->ready);
}

// ---- linear_aq ----

// W8A8 (q8c) and W4A8 (q4g): the rows of x widened to f32, quantized on the
// device with the int8 rule of ql_quantize_rows_i8_src in the activation
// dtype (gs = the weight's group, with the group sums, for q4g; K, without,
// for q8c), then the tensor-core kernel of linear_aq.cu.

// q8c sums all of K in int32 and declines K past the bound, as the generic
// AQ does. q4g sums in int32 only inside a group (gs <= 256, so |Σ xq·q| <=
// 256·128·8 = 2^18 and |Σ xq| <= 2^15) and in f32 across groups: any K.
int aq_supports(const ql_kernel_impl* im, ql_format f, int64_t m, int64_t n,
                int64_t k) {
  (void)im;
  (void)m;
  (void)n;
  return f != QL_FORMAT_Q8C || k <= QL_AQ_Q8C_MAX_K;
}

// run_aq() with d entered.
int aq_on(lane* d, const ql_linear_args* a, size_t mk, size_t xb,
          size_t yb, unsigned where) {
  const bool q4g = a->w->format == QL_FORMAT_Q4G;
  const size_t stb = size_t(a->m) * sizeof(int64_t);
  const packed* p;
  packed* tmp;
  call c;
  int rc;
  if ((rc = layout_of(a, &p, &tmp)) != 0 ||
      (rc = carve(d, a, mk, xb, yb, true, q4g ? a->w->groups : 0, 0,
                  size_t(a->w->k), where, &c)) != 0 ||
      (rc = enqueue_x(d, a, mk, xb, where, &c)) != 0)
    goto done;
  if (c.xf != nullptr) {
    ql__cuda_widen_f32(int(a->dt), c.dx, int64_t(mk), c.xf, d->stream);
    if ((rc = check_launch(*d)) != 0) goto done;
  }
  ql__cuda_quantize_rows(
      QL__CUDA_QROWS_I8, int(a->dt),
      c.xf != nullptr ? c.xf : static_cast<const float*>(c.dx), a->m,
      a->w->k, q4g ? int64_t(a->w->group_size) : a->w->k, c.xq, a->w->k,
      c.sx, c.gsum, c.status, d->stream);
  if ((rc = check_launch(*d)) != 0 ||
      (rc = move(*d, c.hstatus, c.status, stb, cudaMemcpyDeviceToHost)) !=
          0 ||
      (rc = settle_early(d, a, where, &c, a->m)) != 0)
    goto done;
  // Rows the verdict will refuse give codes the product reads all the
  // same; its result then never reaches the caller.
  ql__cuda_linear_aq(&p->dev, c.xq, c.sx, c.gsum, a->m, int(a->dt), c.dy,
                     d->stream);
  rc = finish(d, a, yb, where, &c, a->m);
done:
  free_packed(tmp);
  return rc;
}

int run_aq_where(const ql_linear_args* a, unsigned where, void* ready) {
  lane* d;
  size_t mk, xb, yb;
  int rc;
  if ((rc = linear_args(a, &mk, &xb, &yb)) != 0) return rc;
  if (a->w->format != QL_FORMAT_Q4G && a->w->format != QL_FORMAT_Q8C)
    return QL_ENOTSUP;
  if (a->w->format == QL_FORMAT_Q8C && a->w->k > QL_AQ_Q8C_MAX_K)
    return QL_ESHAPE;
  if ((rc = enter(&d, a->m)) != 0) return rc;
  if ((rc = wait_ready(*d, ready)) == 0 &&
      (rc = aq_on(d, a, mk, xb, yb, where)) != 0)
    quiesce(d);
  leave(d);
  return rc;
}

int run_aq(const ql_linear_args* a) { return run_aq_where(a, 0, nullptr); }

int run_aq_dev(const ql_linear_dev_args* da) {
  int rc = dev_args(da);
  return rc != 0 ? rc : run_aq_where(&da->a, da->where, da->ready);
}

// ---- linear_aq on cuBLASLt: f8r, and q8c (IMMA) when asked for ----

// f8r (W8A8 float8, DESIGN §4): the rows of x quantized on the device with
// the e4m3 rule of ql_quantize_rows_e4m3_src (bit-exact), the unscaled FP8
// product Σk xq·wq on cuBLASLt (f32 accumulation, an algorithm fixed by
// (N, K) alone: blaslt.h), then our epilogue y = acc·(sx·sw) (+ b) in the
// reference's order, rounded once to the activation dtype.
//
// Why not cuBLASLt's own scaling: the outer-vector scale mode
// (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, per-row sx and per-column
// sw) exists on sm_90 only (the cuBLAS documentation's table of scaling
// modes; sm_89 and sm_100 have no such mode), and it would apply the
// scales inside cuBLASLt's epilogue in an order of its own. The unit-scale
// GEMM and our epilogue give the same bytes on sm_89 and sm_90, and the
// epilogue the contract states.
//
// q8c (W8A8) on IMMA, where QL_CUDA_IMMA_MIN_ROWS asks for it: the same
// steps with int8 codes (the q8c rule, no group sums), cuBLASLt's int8 GEMM
// with exact int32 sums, and the same epilogue with the int32 sum made f32:
// the reference's formula, so the bytes of our tensor-core kernel.
//
// Padding: cuBLASLt's FP8 GEMM wants K and N multiples of 16 (IMMA: 4).
// The layout's rows are already ldq (a multiple of 16) bytes long with zero
// codes past K, and f8r and q8c layouts have zero rows up to a multiple of
// 16 (make_packed); x's codes get rows of ldq bytes, zero past K. A zero
// code adds 0·w = 0, so the sums are those over K.

int lt_supports(const ql_kernel_impl* im, ql_format f, int64_t m, int64_t n,
                int64_t k) {
  (void)im;
  (void)n;
  // The device is the calling thread's (device_bind): a worker asks for
  // its own GPU.
  const int o = t_ordinal;
  if (f == QL_FORMAT_F8R) return f8r_declined(o) == nullptr;
  const long long rows = imma_min_rows();
  return f == QL_FORMAT_Q8C && rows > 0 && m >= rows &&
         k <= QL_AQ_Q8C_MAX_K && ql__blaslt_load(nullptr) == 0 && o >= 0 &&
         o < kMaxDevices && (g_dev[o].failed.load() || lt_ready(o));
}

// run_lt() with d entered.
int lt_on(lane* d, const ql_linear_args* a, size_t mk, size_t xb,
          size_t yb, bool* fallback) {
  const bool i8 = a->w->format == QL_FORMAT_Q8C;
  const size_t m = size_t(a->m), stb = m * sizeof(int64_t);
  const packed* p;
  packed* tmp;
  call c;
  size_t accb;
  int rc;
  if ((rc = layout_of(a, &p, &tmp)) != 0) return rc;
  const int64_t kp = p->dev.ldq, np = int64_t(round16(size_t(a->w->n)));
  // f32 or int32: four bytes either way.
  if (!mul_size(m, size_t(np) * sizeof(float), &accb)) {
    rc = QL_ESHAPE;
    goto done;
  }
  if (d->g->lt == nullptr) {  // supports() made it; a direct call may not have
    *fallback = true;
    goto done;
  }
  // Host tensors only: linear_dev does not reach this implementation.
  if ((rc = carve(d, a, mk, xb, yb, true, 0, accb, size_t(kp), 0, &c)) != 0 ||
      (rc = enqueue_x(d, a, mk, xb, 0, &c)) != 0)
    goto done;
  if (c.xf != nullptr) {
    ql__cuda_widen_f32(int(a->dt), c.dx, int64_t(mk), c.xf, d->stream);
    if ((rc = check_launch(*d)) != 0) goto done;
  }
  if (kp != a->w->k &&
      (rc = check(*d, cudaMemsetAsync(c.xq, 0, m * size_t(kp), d->stream))) !=
          0)
    goto done;
  ql__cuda_quantize_rows(
      i8 ? QL__CUDA_QROWS_I8 : QL__CUDA_QROWS_E4M3, int(a->dt),
      c.xf != nullptr ? c.xf : static_cast<const float*>(c.dx), a->m,
      a->w->k, a->w->k, c.xq, kp, c.sx, nullptr, c.status, d->stream);
  if ((rc = check_launch(*d)) != 0 ||
      (rc = move(*d, c.hstatus, c.status, stb, cudaMemcpyDeviceToHost)) !=
          0)
    goto done;
  // The handle's plan cache is not for two threads at once; the call only
  // enqueues, so the lanes wait on each other briefly.
  pthread_mutex_lock(&d->g->mu);
  rc = ql__blaslt_gemm(d->g->lt, i8 ? QL__BLASLT_I8 : QL__BLASLT_E4M3, np,
                       a->m, kp, p->dev.q, p->dev.ldq, c.xq, kp, c.part, np,
                       d->stream);
  pthread_mutex_unlock(&d->g->mu);
  if (rc == QL_EDEVICE) {
    // The runtime knows why a launch failed; else cuBLASLt's word stands.
    rc = check_launch(*d);
    if (rc == 0) rc = fail(*d, "cuBLASLt: %s", "a matmul failed");
    goto done;
  }
  if (rc == QL_ENOTSUP) {
    // No algorithm for this (N, K), or one cuBLASLt refused at this M: the
    // answer is kept for the shape (blaslt.h), so every later call of it
    // takes the fallback, whatever its M (q8c: our kernel, the same bytes).
    *fallback = true;
    rc = 0;
    goto done;
  }
  if (rc != 0) goto done;
  ql__cuda_gemm_epilogue(&p->dev, c.part, i8, np, c.sx, a->m, int(a->dt),
                         c.dy, d->stream);
  rc = finish(d, a, yb, 0, &c, a->m);
done:
  free_packed(tmp);
  return rc;
}

// Where cuBLASLt cannot run a call: q8c on our kernel, f8r on the generic
// op, which is what dispatch chooses without cuBLASLt.
int lt_fallback(const ql_linear_args* a) {
  return a->w->format == QL_FORMAT_Q8C
             ? run_aq(a)
             : ql_linear_aq_ref(a->w, a->dt, a->x, a->m, a->y);
}

int run_lt(const ql_linear_args* a) {
  lane* d;
  size_t mk, xb, yb;
  bool fallback = false;
  int rc;
  if ((rc = linear_args(a, &mk, &xb, &yb)) != 0) return rc;
  if (a->w->format != QL_FORMAT_F8R && a->w->format != QL_FORMAT_Q8C)
    return QL_ENOTSUP;
  if (a->w->format == QL_FORMAT_Q8C && a->w->k > QL_AQ_Q8C_MAX_K)
    return QL_ESHAPE;
  // Called without dispatch on a device where cuBLASLt does not start.
  const int o = t_ordinal;
  if (ql__blaslt_load(nullptr) != 0 ||
      (o >= 0 && o < kMaxDevices && !g_dev[o].failed.load() && !lt_ready(o)))
    return lt_fallback(a);
  if ((rc = enter(&d, a->m)) != 0) return rc;
  rc = lt_on(d, a, mk, xb, yb, &fallback);
  if (rc != 0 || fallback) quiesce(d);
  leave(d);
  if (rc == 0 && fallback) rc = lt_fallback(a);
  return rc;
}

// ---- quantize_rows ----

// The argument checks of ql_quantize_rows_i8_src / _e4m3_src and of
// ql_qrows_args (registry.h).
int qrows_args(const ql_qrows_args* a, ql_dtype* src, int64_t* groups) {
  size_t mk, mg;
  if (a == nullptr || a->x == nullptr || a->xq == nullptr || a->sx == nullptr)
    return QL_EINVAL;
  if (a->kind != QL_QROWS_I8 && a->kind != QL_QROWS_E4M3) return QL_EINVAL;
  if (a->kind == QL_QROWS_E4M3 && a->gsum != nullptr) return QL_EINVAL;
  if (a->kind == QL_QROWS_I8 && a->gs < 1) return QL_EINVAL;
  *src = int(a->src) == 0 ? QL_DTYPE_F32 : a->src;
  if (!ql_dtype_valid(int(*src))) return QL_EDTYPE;
  if (a->m < 1 || a->m > QL_DIM_MAX || a->k < 1 || a->k > QL_DIM_MAX)
    return QL_ESHAPE;
  *groups = a->kind == QL_QROWS_I8 ? (a->k + a->gs - 1) / a->gs : 1;
  if (!mul_size(size_t(a->m), size_t(a->k), &mk) ||
      !mul_size(size_t(a->m), size_t(*groups), &mg) ||
      !mul_size(mk, sizeof(float), &mk) ||
      !mul_size(mg, sizeof(int32_t), &mg))
    return QL_ESHAPE;
  if (a->gsum != nullptr &&
      (int64_t(a->gs) < a->k ? int64_t(a->gs) : a->k) > QL_QROWS_MAX_GROUP)
    return QL_ESHAPE;
  return 0;
}

// run_qrows() with d entered.
int qrows_on(lane* d, const ql_qrows_args* a, ql_dtype src,
             int64_t groups) {
  int rc;
  const size_t m = size_t(a->m), k = size_t(a->k);
  const size_t xb = m * k * sizeof(float), qb = m * k, sb = m * sizeof(float),
               gb = a->gsum != nullptr ? m * size_t(groups) * sizeof(int32_t)
                                       : 0,
               stb = m * sizeof(int64_t);
  const size_t all = round256(xb) + round256(qb) + round256(sb) +
                     round256(gb) + round256(stb);
  if ((rc = reserve(*d, all, all)) != 0) return rc;
  float* dx = static_cast<float*>(take(d->dev, xb));
  void* dq = take(d->dev, qb);
  float* ds = static_cast<float*>(take(d->dev, sb));
  int32_t* dg = gb ? static_cast<int32_t*>(take(d->dev, gb)) : nullptr;
  int64_t* dst = static_cast<int64_t*>(take(d->dev, stb));
  unsigned char* hx = static_cast<unsigned char*>(take(d->host, xb));
  unsigned char* hq = static_cast<unsigned char*>(take(d->host, qb));
  float* hsx = static_cast<float*>(take(d->host, sb));
  int32_t* hg = gb ? static_cast<int32_t*>(take(d->host, gb)) : nullptr;
  int64_t* hst = static_cast<int64_t*>(take(d->host, stb));
  memcpy(hx, a->x, xb);
  if ((rc = move(*d, dx, hx, xb, cudaMemcpyHostToDevice)) != 0) return rc;
  ql__cuda_quantize_rows(
      a->kind == QL_QROWS_I8 ? QL__CUDA_QROWS_I8 : QL__CUDA_QROWS_E4M3,
      int(src), dx, a->m, a->k,
      a->kind == QL_QROWS_I8 ? int64_t(a->gs) : a->k, dq, a->k, ds, dg, dst,
      d->stream);
  // The results back as the product's copies go (move(): small ones by
  // kernel, not behind another lane's copies on the copy engines).
  if ((rc = check_launch(*d)) != 0 ||
      (rc = move(*d, hq, dq, qb, cudaMemcpyDeviceToHost)) != 0 ||
      (rc = move(*d, hsx, ds, sb, cudaMemcpyDeviceToHost)) != 0 ||
      (gb && (rc = move(*d, hg, dg, gb, cudaMemcpyDeviceToHost)) != 0) ||
      (rc = move(*d, hst, dst, stb, cudaMemcpyDeviceToHost)) != 0 ||
      (rc = wait(*d)) != 0)
    return rc;
  // The first row in order that the reference would refuse decides, and in
  // it the first value: what ql_quantize_rows_*_src return.
  if ((rc = rows_verdict(hst, a->m)) != 0) return rc;
  memcpy(a->xq, hq, qb);
  memcpy(a->sx, hsx, sb);
  if (gb) memcpy(a->gsum, hg, gb);
  return 0;
}

int run_qrows(const ql_qrows_args* a) {
  lane* d;
  int64_t groups;
  ql_dtype src;
  int rc;
  if ((rc = qrows_args(a, &src, &groups)) != 0) return rc;
  if ((rc = enter(&d, a->m)) != 0) return rc;
  if ((rc = qrows_on(d, a, src, groups)) != 0) quiesce(d);
  leave(d);
  return rc;
}

// ---- mapped mode ----

// Exports the layout for another process (registry.h). The first export
// on a device tries a read-only second mapping of the allocation, so that
// the daemon can say whether a client's mapping will be read-only.
int export_layout(const void* pp, ql_layout_export* out) {
  const packed* p = static_cast<const packed*>(pp);
  int rc, cur = -1;
  if (p == nullptr || out == nullptr) return QL_EINVAL;
  memset(out, 0, sizeof *out);
  out->fd = -1;
  if (p->vm.size == 0) return QL_ENOTSUP;
  const int o = p->vm.ordinal;
  device& d = g_dev[o];
  if (d.failed.load()) return QL_EDEVICE;
  if (cudaGetDevice(&cur) != cudaSuccess) cur = -1;
  if (cur != o && cudaSetDevice(o) != cudaSuccess) {
    (void)cudaGetLastError();
    return QL_EDEVICE;
  }
  rc = 0;
  if (d.readonly.load() == 0) {
    // A probe that could not map at all says nothing of read-only: this
    // export fails, and the next one tries again.
    int ro = ql__vmm_probe_readonly(&p->vm);
    if (ro >= 0)
      d.readonly.store(ro > 0 ? 1 : -1);
    else
      rc = ro;
  }
  if (rc == 0) rc = ql__vmm_export(&p->vm, &out->fd);
  if (cur >= 0 && cur != o) (void)cudaSetDevice(cur);
  (void)cudaGetLastError();
  if (rc != 0) return rc;
  const unsigned char* base = static_cast<const unsigned char*>(p->mem);
  auto off = [base](const void* a) {
    return a == nullptr ? UINT64_MAX
                        : uint64_t(static_cast<const unsigned char*>(a) - base);
  };
  out->size = p->vm.size;
  out->layout = "cuda-1";
  out->ldq = p->dev.ldq;
  out->q_offset = off(p->dev.q);
  out->scale_offset = off(p->dev.scale);
  out->zero_offset = off(p->dev.zero);
  out->bias_offset = off(p->dev.bias);
  out->sms = uint32_t(p->dev.sms > 0 ? p->dev.sms : 0);
  out->scale_dtype = p->dev.sdt;
  out->readonly = d.readonly.load() > 0;
  return 0;
}

// ---- IPC ----

// The QL_E* code of a failed IPC import: the handle's fault (QL_EINVAL)
// unless the device itself failed (a sticky error) or memory ran out.
int ipc_error(device& d, cudaError_t e) {
  (void)cudaGetLastError();  // a bad handle must not linger as a launch error
  switch (e) {
    case cudaErrorMemoryAllocation:
      return QL_ENOMEM;
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
      return check(d, e);
    default:
      return QL_EINVAL;
  }
}

typedef CUresult (*address_range_fn)(CUdeviceptr*, size_t*, CUdeviceptr);

// cuMemGetAddressRange (_v2, CUDA 3.2) from the driver the runtime
// loaded, looked up once.
address_range_fn address_range() {
  static std::atomic<address_range_fn> fn{nullptr};
  address_range_fn f = fn.load();
  if (f == nullptr) {
    f = reinterpret_cast<address_range_fn>(
        ql__cuda_driver_entry("cuMemGetAddressRange", 3020));
    if (f != nullptr) fn.store(f);
  }
  return f;
}

// Binds o for the calling thread (as device_bind does, so that the
// thread's later ops agree with the runtime's current device) and checks
// it is in service.
int ipc_enter(int o, device** out) {
  int rc = device_bind(o);
  if (rc != 0) return rc;
  *out = &g_dev[o];
  return 0;
}

int ipc_open(int o, const void* handle, size_t len, void** base,
             uint64_t* size) {
  device* d;
  cudaIpcMemHandle_t h;
  void* p = nullptr;
  CUdeviceptr b = 0;
  size_t sz = 0;
  int rc;
  if (handle == nullptr || base == nullptr || size == nullptr ||
      len != sizeof h)
    return QL_EINVAL;
  if ((rc = ipc_enter(o, &d)) != 0) return rc;
  memcpy(&h, handle, sizeof h);
  cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) return ipc_error(*d, e);
  address_range_fn range = address_range();
  // The real extent of the allocation, whatever the handle claims: it
  // bounds every slice (DESIGN §7).
  if (range == nullptr) {
    rc = QL_ENOTSUP;
  } else {
    CUresult r = range(&b, &sz, CUdeviceptr(uintptr_t(p)));
    rc = r == CUDA_SUCCESS && b == CUdeviceptr(uintptr_t(p)) && sz > 0
             ? 0
             : QL_EINVAL;
  }
  if (rc != 0) {
    (void)cudaIpcCloseMemHandle(p);
    (void)cudaGetLastError();
    return rc;
  }
  *base = p;
  *size = uint64_t(sz);
  return 0;
}

int ipc_close(int o, void* base) {
  if (o < 0 || o >= kMaxDevices || base == nullptr) return QL_EINVAL;
  if (cudaSetDevice(o) == cudaSuccess) t_ordinal = o;
  // A failed device's mappings go with its context: nothing to report.
  cudaError_t e = cudaIpcCloseMemHandle(base);
  (void)cudaGetLastError();
  return e == cudaSuccess || g_dev[o].failed.load() ? 0 : QL_EINVAL;
}

int ipc_event_open(int o, const void* handle, size_t len, void** ev) {
  device* d;
  cudaIpcEventHandle_t h;
  cudaEvent_t e = nullptr;
  int rc;
  if (handle == nullptr || ev == nullptr || len != sizeof h) return QL_EINVAL;
  if ((rc = ipc_enter(o, &d)) != 0) return rc;
  memcpy(&h, handle, sizeof h);
  cudaError_t err = cudaIpcOpenEventHandle(&e, h);
  if (err != cudaSuccess) return ipc_error(*d, err);
  *ev = e;
  return 0;
}

void ipc_event_close(int o, void* ev) {
  if (o < 0 || o >= kMaxDevices || ev == nullptr) return;
  if (cudaSetDevice(o) == cudaSuccess) t_ordinal = o;
  (void)cudaEventDestroy(static_cast<cudaEvent_t>(ev));
  (void)cudaGetLastError();
}

#define FMTS_WO                                            \
  (QL_FMT_BIT(QL_FORMAT_Q4G) | QL_FMT_BIT(QL_FORMAT_Q8C) | \
   QL_FMT_BIT(QL_FORMAT_Q8B) | QL_FMT_BIT(QL_FORMAT_F8R))
#define FMTS_QROWS                                         \
  (QL_FMT_BIT(QL_FORMAT_Q4G) | QL_FMT_BIT(QL_FORMAT_Q8C) | \
   QL_FMT_BIT(QL_FORMAT_F8R))

ql_kernel_impl impl(const char* name, ql_op op, uint32_t formats) {
  ql_kernel_impl im;
  memset(&im, 0, sizeof im);
  im.name = name;
  im.op = op;
  im.formats = formats;
  im.dtypes = QL_ALL_DTYPES;
  return im;
}

struct table {
  ql_kernel_impl im[5];
  table() {
    im[0] = impl("cuda.repack", QL_OP_REPACK, FMTS_WO);
    im[0].fn.repack = repack;
    im[0].free_packed = free_packed;
    im[1] = impl("cuda.linear_wo", QL_OP_LINEAR_WO, FMTS_WO);
    im[1].fn.linear = run_wo;
    im[2] = impl("cuda.quantize_rows", QL_OP_QUANTIZE_ROWS, FMTS_QROWS);
    im[2].fn.quantize_rows = run_qrows;
    // Before cuda.linear_aq: dispatch takes the first that supports a case,
    // and q8c goes to cuBLASLt only where lt_supports() says so.
    im[3] = impl("cuda.cublaslt.linear_aq", QL_OP_LINEAR_AQ,
                 QL_FMT_BIT(QL_FORMAT_F8R) | QL_FMT_BIT(QL_FORMAT_Q8C));
    im[3].supports = lt_supports;
    im[3].fn.linear = run_lt;
    im[4] = impl("cuda.linear_aq", QL_OP_LINEAR_AQ,
                 QL_FMT_BIT(QL_FORMAT_Q4G) | QL_FMT_BIT(QL_FORMAT_Q8C));
    im[4].supports = aq_supports;
    im[4].fn.linear = run_aq;
  }
};
const table impls;

// Our linear kernels read and write device memory in place; not
// cuda.cublaslt.linear_aq (im[3]), which stages host tensors and whose
// fallbacks read host memory. Device tensors of a q8c batch that im[3]
// would take go to cuda.linear_aq (ql_dispatch_dev() passes im[3] over),
// with IMMA's bytes; f8r AQ has no kernel for them.
int linear_dev_supports(const ql_kernel_impl* im) {
  return im == &impls.im[1] || im == &impls.im[4];
}

int linear_dev(const ql_kernel_impl* im, const ql_linear_dev_args* da) {
  if (im == &impls.im[1]) return run_wo_dev(da);
  if (im == &impls.im[4]) return run_aq_dev(da);
  return QL_ENOTSUP;
}

ql_backend make_backend() {
  ql_backend b;
  memset(&b, 0, sizeof b);
  b.name = "cuda";
  b.impls = impls.im;
  b.n_impls = sizeof impls.im / sizeof impls.im[0];
  b.configure = configure;
  b.device_count = device_count;
  b.device_info = device_info;
  b.device_bind = device_bind;
  b.device_lanes = kLanes;
  b.device_error = device_error;
  b.ipc_handle_bytes = CUDA_IPC_HANDLE_SIZE;
  b.ipc_open = ipc_open;
  b.ipc_close = ipc_close;
  b.ipc_event_open = ipc_event_open;
  b.ipc_event_close = ipc_event_close;
  b.linear_dev_supports = linear_dev_supports;
  b.linear_dev = linear_dev;
  b.host_register = host_register;
  b.host_unregister = host_unregister;
  b.export_layout = export_layout;
  return b;
}

}  // namespace

extern "C" const ql_backend ql__backend_cuda = make_backend();
