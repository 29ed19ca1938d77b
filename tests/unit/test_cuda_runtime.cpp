// test_cuda_runtime.cpp - the emulated CUDA runtime (kernels/cuda/
// emu_runtime.h), on which the CUDA backend's host code runs in
// `make check`: devices, their compute capabilities (QL_EMU_CUDA_CC),
// memory accounting, address ranges, the current device per thread,
// streams and events, last errors, each injected fault (and that it hits
// only its device), the missing driver, launches through QL_LAUNCH refused
// on a failed device, and IPC with a forked process.
//
// Plain main(); one line per check, exit status 1 on any failure. Each
// section sets the environment it needs and calls ql_emu_cuda_reset().
#include <signal.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "emu.h"
#include "emu_runtime.h"

static int g_fail;

static void check(bool ok, const char* what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  g_fail += !ok;
}

// A fresh runtime with these variables (null: unset).
static void setup(const char* devices, const char* mem = nullptr,
                  const char* fault = nullptr, const char* hang_ms = nullptr,
                  const char* nodriver = nullptr) {
  const char* names[] = {"QL_EMU_CUDA_DEVICES", "QL_EMU_CUDA_MEM",
                         "QL_EMU_CUDA_FAULT", "QL_EMU_CUDA_HANG_MS",
                         "QL_EMU_CUDA_NODRIVER"};
  const char* vals[] = {devices, mem, fault, hang_ms, nodriver};
  for (int i = 0; i < 5; ++i) {
    if (vals[i] != nullptr)
      setenv(names[i], vals[i], 1);
    else
      unsetenv(names[i]);
  }
  ql_emu_cuda_reset();
}

__global__ void fill(int* p, int v) { p[threadIdx.x] = v; }

// ------------------------------------------------------------------ tests

static void test_errors() {
  check(cudaSuccess == 0 && cudaErrorInvalidValue == 1 &&
            cudaErrorMemoryAllocation == 2 &&
            cudaErrorInitializationError == 3 &&
            cudaErrorInvalidDevicePointer == 17 &&
            cudaErrorInsufficientDriver == 35 &&
            cudaErrorDevicesUnavailable == 46 && cudaErrorNoDevice == 100 &&
            cudaErrorInvalidDevice == 101 &&
            cudaErrorMapBufferObjectFailed == 205 &&
            cudaErrorInvalidResourceHandle == 400 && cudaErrorNotReady == 600 &&
            cudaErrorIllegalAddress == 700 && cudaErrorLaunchTimeout == 702 &&
            cudaErrorLaunchFailure == 719 && cudaErrorUnknown == 999 &&
            CUDA_ERROR_INVALID_VALUE == 1 && sizeof(cudaIpcMemHandle_t) == 64 &&
            sizeof(cudaUUID_t) == 16,
        "error values and handle sizes are those of CUDA 13");
  check(std::strcmp(cudaGetErrorName(cudaErrorIllegalAddress),
                    "cudaErrorIllegalAddress") == 0 &&
            std::strcmp(cudaGetErrorString(cudaErrorMemoryAllocation),
                        "out of memory") == 0 &&
            std::strcmp(cudaGetErrorString(cudaError_t(12345)),
                        "unrecognized error code") == 0,
        "cudaGetErrorName/String: names, messages, an unknown code");
}

static void test_devices() {
  setup("3", "1048576");
  int n = -1;
  check(cudaGetDeviceCount(&n) == cudaSuccess && n == 3,
        "QL_EMU_CUDA_DEVICES=3: three devices");
  std::set<std::string> uuids;
  bool ok = true;
  for (int d = 0; d < 3; ++d) {
    cudaDeviceProp p;
    ok &= cudaGetDeviceProperties(&p, d) == cudaSuccess;
    ok &= std::strcmp(p.name, "Emulated GPU") == 0 && p.major == 9 &&
          p.minor == 0 && p.totalGlobalMem == 1048576 &&
          p.multiProcessorCount > 0 && p.pciBusID == d + 1;
    uuids.insert(std::string(p.uuid.bytes, 16));
  }
  check(ok && uuids.size() == 3,
        "properties: name, sm 9.0, memory, PCI bus; three distinct UUIDs");
  cudaDeviceProp p1, p2;
  setup("3", "1048576");
  cudaGetDeviceProperties(&p1, 2);
  cudaGetDeviceProperties(&p2, 2);
  check(std::memcmp(p1.uuid.bytes, p2.uuid.bytes, 16) == 0,
        "a device's UUID is the same every time");
  check(cudaGetDeviceProperties(&p1, 3) == cudaErrorInvalidDevice &&
            cudaSetDevice(3) == cudaErrorInvalidDevice &&
            cudaSetDevice(-1) == cudaErrorInvalidDevice,
        "device 3 of 3 is an invalid ordinal");

  // Compute capability per device: QL_EMU_CUDA_CC, the last for the rest.
  int ma = 0, mi = 0;
  check(cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, 1) ==
                cudaSuccess &&
            cudaDeviceGetAttribute(&mi, cudaDevAttrComputeCapabilityMinor,
                                   1) == cudaSuccess &&
            ma == 9 && mi == 0 &&
            cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor,
                                   3) == cudaErrorInvalidDevice,
        "cudaDeviceGetAttribute: compute capability 9.0 by default");
  setenv("QL_EMU_CUDA_CC", "8.0,8.9", 1);
  setup("3");
  bool cc = true;
  static const int want[3][2] = {{8, 0}, {8, 9}, {8, 9}};
  for (int dv = 0; dv < 3; ++dv) {
    cudaDeviceProp pp;
    cc &= cudaGetDeviceProperties(&pp, dv) == cudaSuccess &&
          pp.major == want[dv][0] && pp.minor == want[dv][1] &&
          cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor,
                                 dv) == cudaSuccess &&
          cudaDeviceGetAttribute(&mi, cudaDevAttrComputeCapabilityMinor,
                                 dv) == cudaSuccess &&
          ma == want[dv][0] && mi == want[dv][1];
  }
  check(cc, "QL_EMU_CUDA_CC=8.0,8.9: sm_80, sm_89, sm_89");
  for (const char* bad : {"9", "8.10", "x.0", "8.0,", "1.0,1.0,1.0,1.0,1.0,"
                                                    "1.0,1.0,1.0,1.0"}) {
    std::fflush(stdout);
    setenv("QL_EMU_CUDA_CC", bad, 1);
    setup("3");
    char what[96];
    std::snprintf(what, sizeof what,
                  "QL_EMU_CUDA_CC=\"%.40s\": every call fails", bad);
    check(cudaGetDeviceCount(&n) == cudaErrorInitializationError, what);
  }
  unsetenv("QL_EMU_CUDA_CC");

  setup("0");
  n = -1;
  int d = -1;
  check(cudaGetDeviceCount(&n) == cudaErrorNoDevice && n == 0 &&
            cudaSetDevice(0) == cudaErrorNoDevice &&
            cudaGetDevice(&d) == cudaErrorNoDevice,
        "QL_EMU_CUDA_DEVICES=0: no device");
  void* p = nullptr;
  check(cudaMalloc(&p, 16) == cudaErrorNoDevice && p == nullptr,
        "QL_EMU_CUDA_DEVICES=0: cudaMalloc fails");

  for (const char* bad : {"9", "two", "-1", ""}) {
    std::fflush(stdout);
    setup(bad);
    char what[96];
    std::snprintf(what, sizeof what,
                  "QL_EMU_CUDA_DEVICES=\"%s\": cudaErrorInitializationError",
                  bad);
    check(cudaGetDeviceCount(&n) == cudaErrorInitializationError, what);
  }
  setup("1", "12k");
  check(cudaGetDeviceCount(&n) == cudaErrorInitializationError,
        "QL_EMU_CUDA_MEM=12k: cudaErrorInitializationError");
}

static void test_current_device() {
  setup("4");
  int d = -1;
  check(cudaGetDevice(&d) == cudaSuccess && d == 0,
        "current device: 0 at first");
  check(cudaSetDevice(2) == cudaSuccess && cudaGetDevice(&d) == cudaSuccess &&
            d == 2,
        "cudaSetDevice(2)");
  int seen = -1, after = -1;
  std::thread t([&] {
    cudaGetDevice(&seen);
    cudaSetDevice(3);
    cudaGetDevice(&after);
  });
  t.join();
  cudaGetDevice(&d);
  check(seen == 0 && after == 3 && d == 2,
        "the current device is per thread (another starts at 0, sets 3; "
        "this one stays at 2)");
  cudaStream_t s;
  cudaEvent_t e;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  cudaSetDevice(1);
  // Recording an event of device 2 on a stream of device 2 works from a
  // thread whose current device is 1; the null stream here is device 1's.
  check(cudaEventRecord(e, s) == cudaSuccess &&
            cudaEventRecord(e, nullptr) == cudaErrorInvalidResourceHandle,
        "streams and events keep the device current at creation");
  cudaGetLastError();
  cudaEventDestroy(e);
  cudaStreamDestroy(s);
  cudaSetDevice(0);
}

static void test_memory() {
  setup("2", "1048576");
  size_t fr = 0, tot = 0;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  check(cudaMemGetInfo(&fr, &tot) == cudaSuccess && fr == 1048576 &&
            tot == 1048576,
        "cudaMemGetInfo: QL_EMU_CUDA_MEM free and total");
  check(cudaMalloc(&a, 100) == cudaSuccess && a != nullptr &&
            uintptr_t(a) % 256 == 0,
        "cudaMalloc(100): 256-byte aligned");
  cudaMemGetInfo(&fr, &tot);
  check(fr == 1048576 - 256, "100 bytes are charged as 256");
  check(cudaMalloc(&b, 1048576) == cudaErrorMemoryAllocation && b == nullptr,
        "past the device's memory: cudaErrorMemoryAllocation");
  check(cudaGetLastError() == cudaErrorMemoryAllocation &&
            cudaGetLastError() == cudaSuccess,
        "cudaGetLastError returns the failure once, then clears it");
  check(cudaMalloc(&b, 1048576 - 256) == cudaSuccess,
        "exactly the rest of the memory fits");
  cudaMemGetInfo(&fr, &tot);
  check(fr == 0, "then nothing is free");
  cudaSetDevice(1);
  check(cudaMalloc(&c, 4096) == cudaSuccess, "device 1's memory is its own");
  cudaSetDevice(0);
  int local;
  check(
      cudaFree(&local) == cudaErrorInvalidDevicePointer &&
          cudaFree(static_cast<char*>(a) + 16) == cudaErrorInvalidDevicePointer,
      "cudaFree of a host pointer, of an interior pointer: "
      "cudaErrorInvalidDevicePointer");
  check(cudaFree(a) == cudaSuccess && cudaFree(b) == cudaSuccess &&
            cudaFree(c) == cudaSuccess && cudaFree(nullptr) == cudaSuccess,
        "cudaFree of every allocation, and of NULL");
  check(cudaFree(a) == cudaErrorInvalidDevicePointer,
        "a second cudaFree: cudaErrorInvalidDevicePointer");
  cudaMemGetInfo(&fr, &tot);
  check(fr == tot, "all memory is free again");
  check(cudaMalloc(&a, 0) == cudaSuccess && a == nullptr,
        "cudaMalloc(0): success and NULL");
  check(cudaMalloc(nullptr, 16) == cudaErrorInvalidValue,
        "cudaMalloc(NULL, ...): cudaErrorInvalidValue");

  void *h = nullptr, *h2 = nullptr;
  check(cudaMallocHost(&h, 10000) == cudaSuccess && h != nullptr &&
            cudaHostAlloc(&h2, 64, cudaHostAllocPortable) == cudaSuccess,
        "cudaMallocHost, cudaHostAlloc");
  std::memset(h, 7, 10000);
  void* h3 = &local;
  check(cudaHostAlloc(&h3, 64, 0x100) == cudaErrorInvalidValue,
        "cudaHostAlloc with an unknown flag: cudaErrorInvalidValue");
  check(cudaFreeHost(&local) == cudaErrorInvalidValue &&
            cudaFreeHost(h) == cudaSuccess && cudaFreeHost(h2) == cudaSuccess,
        "cudaFreeHost refuses what it did not allocate");
  cudaGetLastError();
}

static void test_ranges() {
  setup("1");
  void* a;
  cudaMalloc(&a, 1000);
  CUdeviceptr base = 0;
  size_t size = 0;
  const CUdeviceptr p = CUdeviceptr(uintptr_t(a));
  check(cuMemGetAddressRange(&base, &size, p + 999) == CUDA_SUCCESS &&
            base == p && size == 1000,
        "cuMemGetAddressRange: base and size from the last byte");
  check(cuMemGetAddressRange(nullptr, &size, p) == CUDA_SUCCESS &&
            cuMemGetAddressRange(&base, nullptr, p) == CUDA_SUCCESS,
        "cuMemGetAddressRange: either output may be NULL");
  int local;
  check(
      cuMemGetAddressRange(&base, &size, p + 1000) == CUDA_ERROR_NOT_FOUND &&
          cuMemGetAddressRange(&base, &size, CUdeviceptr(uintptr_t(&local))) ==
              CUDA_ERROR_NOT_FOUND &&
          cuMemGetAddressRange(&base, &size, 0) == CUDA_ERROR_INVALID_VALUE,
      "cuMemGetAddressRange: one past the end, a host pointer, 0");
  cudaFree(a);
  check(cuMemGetAddressRange(&base, &size, p) == CUDA_ERROR_NOT_FOUND,
        "cuMemGetAddressRange after cudaFree: not found");
}

static void test_copies() {
  setup("1");
  char host[256], back[256];
  for (int i = 0; i < 256; ++i) host[i] = char(i);
  void *a, *b;
  cudaMalloc(&a, 256);
  cudaMalloc(&b, 256);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  std::memset(back, 0, sizeof back);
  check(cudaMemcpy(a, host, 256, cudaMemcpyHostToDevice) == cudaSuccess &&
            cudaMemcpyAsync(b, a, 256, cudaMemcpyDeviceToDevice, s) ==
                cudaSuccess &&
            cudaMemcpyAsync(back, b, 256, cudaMemcpyDeviceToHost, s) ==
                cudaSuccess &&
            cudaStreamSynchronize(s) == cudaSuccess &&
            std::memcmp(back, host, 256) == 0,
        "H2D, D2D (async), D2H (async): the bytes come back");
  check(
      cudaMemsetAsync(static_cast<char*>(b) + 16, 0xAB, 32, s) == cudaSuccess &&
          cudaMemcpy(back, b, 256, cudaMemcpyDeviceToHost) == cudaSuccess &&
          back[15] == 15 && back[16] == char(0xAB) && back[47] == char(0xAB) &&
          back[48] == 48,
      "cudaMemsetAsync sets exactly its range");
  check(cudaMemcpy(host, back, 16, cudaMemcpyHostToDevice) ==
                cudaErrorInvalidValue &&
            cudaMemcpy(back, host, 16, cudaMemcpyDeviceToHost) ==
                cudaErrorInvalidValue &&
            cudaMemsetAsync(back, 0, 16, s) == cudaErrorInvalidValue,
        "a host pointer where the kind says device: cudaErrorInvalidValue");
  check(cudaMemcpy(a, host, 257, cudaMemcpyHostToDevice) ==
                cudaErrorInvalidValue &&
            cudaMemsetAsync(static_cast<char*>(a) + 200, 0, 57, s) ==
                cudaErrorInvalidValue,
        "a range past the allocation's end: cudaErrorInvalidValue");
  check(cudaMemcpy(a, host, 16, cudaMemcpyKind(7)) ==
            cudaErrorInvalidMemcpyDirection,
        "an unknown cudaMemcpyKind: cudaErrorInvalidMemcpyDirection");
  check(cudaMemcpy(back, host, 16, cudaMemcpyHostToHost) == cudaSuccess &&
            cudaMemcpy(back, a, 16, cudaMemcpyDefault) == cudaSuccess,
        "host to host, and cudaMemcpyDefault");
  cudaGetLastError();
  cudaStreamDestroy(s);
  cudaFree(a);
  cudaFree(b);
}

static void test_streams_events() {
  setup("2");
  cudaStream_t s, s2;
  cudaEvent_t e, e1;
  void* a;
  cudaMalloc(&a, 64);
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess &&
            cudaStreamCreateWithFlags(&s2, cudaStreamDefault) == cudaSuccess,
        "cudaStreamCreateWithFlags: non-blocking and default");
  check(cudaStreamCreateWithFlags(&s2, 0x8) == cudaErrorInvalidValue &&
            cudaEventCreateWithFlags(&e, 0x80) == cudaErrorInvalidValue &&
            cudaEventCreateWithFlags(&e, cudaEventInterprocess) ==
                cudaErrorInvalidValue,
        "unknown stream and event flags, an interprocess event with timing: "
        "cudaErrorInvalidValue");
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess,
        "cudaEventCreateWithFlags(cudaEventDisableTiming)");
  check(cudaEventQuery(e) == cudaSuccess,
        "an event never recorded is complete");
  long w0 = ql_emu_cuda_work(0);
  cudaMemsetAsync(a, 1, 64, s);
  cudaMemsetAsync(a, 2, 64, s2);
  cudaMemsetAsync(a, 3, 64, nullptr);
  check(ql_emu_cuda_work(0) == w0 + 3 && ql_emu_cuda_work(1) == 0,
        "each memset is one work item of device 0");
  check(cudaEventRecord(e, s) == cudaSuccess &&
            cudaEventQuery(e) == cudaSuccess &&
            cudaEventSynchronize(e) == cudaSuccess &&
            cudaStreamWaitEvent(s2, e, 0) == cudaSuccess &&
            cudaStreamWaitEvent(nullptr, e) == cudaSuccess &&
            cudaStreamQuery(s) == cudaSuccess &&
            cudaStreamQuery(nullptr) == cudaSuccess &&
            cudaStreamSynchronize(s2) == cudaSuccess &&
            cudaDeviceSynchronize() == cudaSuccess,
        "record, query, synchronize, wait: complete at once");
  check(cudaStreamWaitEvent(s2, e, 0x10) == cudaErrorInvalidValue,
        "cudaStreamWaitEvent with unknown flags: cudaErrorInvalidValue");
  cudaSetDevice(1);
  cudaEventCreateWithFlags(&e1, cudaEventDisableTiming);
  check(cudaEventRecord(e1, s) == cudaErrorInvalidResourceHandle,
        "recording an event of device 1 on a stream of device 0: "
        "cudaErrorInvalidResourceHandle");
  check(cudaEventRecord(e1, nullptr) == cudaSuccess &&
            cudaStreamWaitEvent(s, e1, 0) == cudaSuccess,
        "a stream of device 0 waits on an event of device 1");
  cudaSetDevice(0);
  check(cudaStreamDestroy(s) == cudaSuccess &&
            cudaStreamDestroy(s) == cudaErrorInvalidResourceHandle &&
            cudaStreamQuery(s) == cudaErrorInvalidResourceHandle &&
            cudaStreamDestroy(nullptr) == cudaErrorInvalidResourceHandle,
        "a destroyed stream, and the null stream, cannot be destroyed or used");
  check(cudaEventDestroy(e) == cudaSuccess &&
            cudaEventQuery(e) == cudaErrorInvalidResourceHandle &&
            cudaEventDestroy(e) == cudaErrorInvalidResourceHandle,
        "a destroyed event cannot be used");
  check(cudaPeekAtLastError() == cudaErrorInvalidResourceHandle &&
            cudaPeekAtLastError() == cudaErrorInvalidResourceHandle &&
            cudaGetLastError() == cudaErrorInvalidResourceHandle &&
            cudaPeekAtLastError() == cudaSuccess,
        "cudaPeekAtLastError does not clear, cudaGetLastError does");
  cudaMalloc(nullptr, 1);
  cudaError_t other = cudaErrorUnknown;
  std::thread([&] { other = cudaGetLastError(); }).join();
  check(other == cudaSuccess && cudaGetLastError() == cudaErrorInvalidValue,
        "the last error is per thread");
  cudaEventDestroy(e1);
  cudaStreamDestroy(s2);
  cudaFree(a);
}

// Attributes (the CUDA 13 values of enum cudaDeviceAttr) and timed events.
static void test_attributes_timing() {
  setup("2");
  int v = 0;
  check(cudaDevAttrMemoryClockRate == 36 &&
            cudaDevAttrGlobalMemoryBusWidth == 37 &&
            cudaDevAttrL2CacheSize == 38,
        "cudaDeviceAttr values");
  check(cudaDeviceGetAttribute(&v, cudaDevAttrMemoryClockRate, 1) ==
                cudaSuccess &&
            v == 2619000,
        "memory clock");
  check(cudaDeviceGetAttribute(&v, cudaDevAttrGlobalMemoryBusWidth, 0) ==
                cudaSuccess &&
            v == 5120,
        "bus width");
  check(cudaDeviceGetAttribute(&v, cudaDevAttrMemoryClockRate, 2) ==
                cudaErrorInvalidDevice &&
            cudaDeviceGetAttribute(nullptr, cudaDevAttrL2CacheSize, 0) ==
                cudaErrorInvalidValue &&
            cudaDeviceGetAttribute(&v, cudaDeviceAttr(12345), 0) ==
                cudaErrorInvalidValue,
        "attribute errors");
  cudaGetLastError();
  cudaStream_t s;
  cudaEvent_t a, b, off;
  float ms = -1;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEventCreateWithFlags(&a, cudaEventDefault);
  cudaEventCreateWithFlags(&b, cudaEventDefault);
  cudaEventCreateWithFlags(&off, cudaEventDisableTiming);
  check(cudaEventElapsedTime(&ms, a, b) == cudaErrorInvalidResourceHandle,
        "elapsed time of events never recorded");
  cudaEventRecord(a, s);
  struct timespec nap = {0, 20 * 1000 * 1000};
  nanosleep(&nap, nullptr);
  cudaEventRecord(b, s);
  cudaEventRecord(off, s);
  check(cudaEventElapsedTime(&ms, a, b) == cudaSuccess && ms >= 19.0f &&
            ms < 10000.0f,
        "elapsed time between two records");
  check(cudaEventElapsedTime(&ms, a, off) ==
                cudaErrorInvalidResourceHandle &&
            cudaEventElapsedTime(nullptr, a, b) == cudaErrorInvalidValue,
        "elapsed time errors");
  cudaGetLastError();
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaEventDestroy(off);
  cudaStreamDestroy(s);
}

static void test_launches() {
  setup("2");
  int v[32];
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  std::memset(v, 0, sizeof v);
  long l0 = ql_emu_cuda_launches(0), w0 = ql_emu_cuda_work(0);
  QL_LAUNCH(fill, dim3(1), dim3(32), 0, s, v, 5);
  QL_LAUNCH(fill, dim3(1), dim3(16), 0, nullptr, v + 16, 6);
  check(v[0] == 5 && v[31] == 6 && ql_emu_cuda_launches(0) == l0 + 2 &&
            ql_emu_cuda_work(0) == w0 + 2 && ql_emu_cuda_launches(1) == 0,
        "QL_LAUNCH: runs, counted as a launch and a work item of device 0");
  ql_emu_cuda_inject(0, 0, QL_EMU_FAULT_STICKY);
  QL_LAUNCH(fill, dim3(1), dim3(32), 0, s, v, 7);
  check(v[0] == 5 && ql_emu_cuda_launches(0) == l0 + 2 &&
            cudaGetLastError() == cudaErrorIllegalAddress,
        "QL_LAUNCH on a device with a sticky error: does not run, "
        "cudaErrorIllegalAddress");
  ql_emu_cuda_inject(0, 0, QL_EMU_FAULT_NONE);
  cudaStreamDestroy(s);
  cudaGetLastError();
  QL_LAUNCH(fill, dim3(1), dim3(32), 0, s, v, 8);
  check(v[0] == 5 && cudaGetLastError() == cudaErrorInvalidResourceHandle,
        "QL_LAUNCH on a destroyed stream: does not run, "
        "cudaErrorInvalidResourceHandle");
}

static void test_sticky() {
  setup("2");
  unsigned char* a;
  void* b;
  unsigned char h[64];
  cudaStream_t s, s1;
  cudaEvent_t e;
  cudaMalloc(reinterpret_cast<void**>(&a), 64);
  cudaMalloc(&b, 64);
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  cudaSetDevice(1);
  cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
  cudaSetDevice(0);
  ql_emu_cuda_inject(0, 2, QL_EMU_FAULT_STICKY);
  check(cudaMemsetAsync(a, 1, 64, s) == cudaSuccess &&
            cudaStreamQuery(s) == cudaSuccess,
        "sticky after 2: the first item runs, the device is fine");
  check(cudaMemsetAsync(a + 32, 2, 32, s) == cudaSuccess &&
            cudaStreamQuery(s) == cudaErrorIllegalAddress,
        "sticky after 2: the second item runs, then the device has failed");
  check(cudaMemsetAsync(a, 3, 64, s) == cudaErrorIllegalAddress,
        "later work is refused with cudaErrorIllegalAddress");
  void* c = nullptr;
  size_t fr, tot;
  CUdeviceptr base;
  check(cudaMalloc(&c, 16) == cudaErrorIllegalAddress &&
            cudaMemGetInfo(&fr, &tot) == cudaErrorIllegalAddress &&
            cudaStreamSynchronize(s) == cudaErrorIllegalAddress &&
            cudaEventRecord(e, s) == cudaErrorIllegalAddress &&
            cudaEventQuery(e) == cudaErrorIllegalAddress &&
            cudaDeviceSynchronize() == cudaErrorIllegalAddress &&
            cudaMemcpy(h, a, 64, cudaMemcpyDeviceToHost) ==
                cudaErrorIllegalAddress &&
            cuMemGetAddressRange(&base, nullptr, CUdeviceptr(uintptr_t(a))) ==
                CUDA_ERROR_ILLEGAL_ADDRESS,
        "malloc, info, synchronize, record, query, copy, address range: all "
        "cudaErrorIllegalAddress");
  check(cudaGetLastError() == cudaErrorIllegalAddress &&
            cudaGetLastError() == cudaErrorIllegalAddress &&
            cudaPeekAtLastError() == cudaErrorIllegalAddress,
        "cudaGetLastError does not clear a sticky error");
  // What ran before the fault is there: read it back through the mapping.
  check(a[0] == 1 && a[31] == 1 && a[32] == 2 && a[63] == 2,
        "the work before the fault ran, the refused memset did not");

  cudaError_t e1 = cudaErrorUnknown, e2 = cudaErrorUnknown,
              e3 = cudaErrorUnknown;
  std::thread([&] {
    void* p = nullptr;
    cudaSetDevice(1);
    e1 = cudaMalloc(&p, 64);
    e2 = cudaMemsetAsync(p, 0, 64, s1);
    e3 = cudaStreamSynchronize(s1);
    cudaFree(p);
  }).join();
  check(e1 == cudaSuccess && e2 == cudaSuccess && e3 == cudaSuccess,
        "device 1 is unaffected by device 0's sticky error");
  cudaSetDevice(1);
  check(cudaGetLastError() == cudaSuccess,
        "on device 1, cudaGetLastError is cudaSuccess: the sticky error "
        "stays with device 0");
  check(cudaSetDevice(0) == cudaErrorIllegalAddress,
        "cudaSetDevice(0) reports device 0's sticky error");
  check(cudaFree(a) == cudaErrorIllegalAddress &&
            cudaFree(b) == cudaErrorIllegalAddress &&
            cudaFree(a) == cudaErrorInvalidDevicePointer,
        "cudaFree on the failed device releases and reports the error");
  check(cudaStreamDestroy(s) == cudaErrorIllegalAddress &&
            cudaEventDestroy(e) == cudaErrorIllegalAddress &&
            cudaStreamQuery(s) == cudaErrorInvalidResourceHandle,
        "streams and events of the failed device are released too");
  cudaStreamDestroy(s1);
  ql_emu_cuda_reset();
  check(cudaMalloc(&c, 16) == cudaSuccess && cudaFree(c) == cudaSuccess &&
            cudaGetLastError() == cudaSuccess,
        "ql_emu_cuda_reset clears the sticky error");
}

static void test_hang() {
  setup("2", nullptr, nullptr, "50");
  unsigned char* a;
  unsigned char h[64];
  cudaStream_t s, idle, waiter;
  cudaEvent_t before, after;
  cudaMalloc(reinterpret_cast<void**>(&a), 64);
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&idle, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&waiter, cudaStreamNonBlocking);
  cudaEventCreateWithFlags(&before, cudaEventDisableTiming);
  cudaEventCreateWithFlags(&after, cudaEventDisableTiming);
  ql_emu_cuda_inject(0, 1, QL_EMU_FAULT_HANG);
  cudaMemsetAsync(a, 1, 64, s);
  cudaEventRecord(before, s);
  check(cudaMemsetAsync(a, 2, 64, s) == cudaSuccess,
        "hang after 1: the second memset is accepted");
  int v[32] = {0};
  long l0 = ql_emu_cuda_launches(0);
  QL_LAUNCH(fill, dim3(1), dim3(32), 0, s, v, 9);
  cudaEventRecord(after, s);
  check(a[0] == 1 && a[63] == 1 && v[0] == 0 && ql_emu_cuda_launches(0) == l0,
        "hang after 1: the first item ran, the memset and launch after it "
        "did not");
  check(cudaEventQuery(before) == cudaSuccess &&
            cudaEventSynchronize(before) == cudaSuccess,
        "an event recorded before the hang is complete");
  check(cudaStreamQuery(s) == cudaErrorNotReady &&
            cudaStreamQuery(s) == cudaErrorNotReady &&
            cudaEventQuery(after) == cudaErrorNotReady,
        "the hung stream and an event after the hang: cudaErrorNotReady, "
        "again and again");
  check(cudaPeekAtLastError() == cudaSuccess,
        "cudaErrorNotReady is not recorded as an error");
  check(cudaStreamQuery(idle) == cudaSuccess,
        "a stream with no work after the hang is complete");
  cudaStreamWaitEvent(waiter, after, 0);
  check(cudaStreamQuery(waiter) == cudaErrorNotReady,
        "a stream that waits on an event after the hang is not ready");
  check(cudaStreamSynchronize(s) == cudaErrorLaunchTimeout &&
            cudaEventSynchronize(after) == cudaErrorLaunchTimeout &&
            cudaDeviceSynchronize() == cudaErrorLaunchTimeout &&
            cudaStreamSynchronize(waiter) == cudaErrorLaunchTimeout,
        "waits on the hung work give up: cudaErrorLaunchTimeout");
  check(cudaGetLastError() == cudaErrorLaunchTimeout,
        "the timeout is the last error");
  check(
      cudaMemcpy(h, a, 64, cudaMemcpyDeviceToHost) == cudaSuccess && h[0] == 1,
      "the legacy stream, which no hung work feeds, still copies");
  cudaMemsetAsync(a, 3, 64, nullptr);
  check(
      cudaMemcpy(h, a, 64, cudaMemcpyDeviceToHost) == cudaErrorLaunchTimeout &&
          cudaStreamQuery(nullptr) == cudaErrorNotReady,
      "after work on the legacy stream: cudaMemcpy times out");
  cudaError_t other = cudaErrorUnknown;
  std::thread([&] {
    cudaStream_t s1;
    cudaSetDevice(1);
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    void* p;
    cudaMalloc(&p, 16);
    cudaMemsetAsync(p, 0, 16, s1);
    other = cudaStreamSynchronize(s1);
    cudaFree(p);
    cudaStreamDestroy(s1);
  }).join();
  check(other == cudaSuccess, "device 1 is unaffected by device 0's hang");
  check(cudaFree(a) == cudaSuccess && cudaStreamDestroy(s) == cudaSuccess &&
            cudaEventDestroy(after) == cudaSuccess,
        "a hung device's memory, streams and events can be released");
  cudaEventDestroy(before);
  cudaStreamDestroy(idle);
  cudaStreamDestroy(waiter);
  cudaGetLastError();
}

static void test_oom() {
  setup("2");
  void *a, *b = nullptr, *c;
  cudaMalloc(&a, 64);
  ql_emu_cuda_inject(0, 1, QL_EMU_FAULT_OOM);
  check(cudaMalloc(&b, 64) == cudaSuccess,
        "oom after 1: cudaMalloc works before the first item");
  cudaFree(b);
  cudaMemsetAsync(a, 0, 64, nullptr);
  check(cudaMalloc(&b, 64) == cudaErrorMemoryAllocation && b == nullptr,
        "oom after 1: then cudaMalloc fails with cudaErrorMemoryAllocation");
  check(cudaMemsetAsync(a, 0, 64, nullptr) == cudaSuccess &&
            cudaDeviceSynchronize() == cudaSuccess,
        "oom: other calls still work");
  cudaSetDevice(1);
  check(cudaMalloc(&c, 64) == cudaSuccess && cudaFree(c) == cudaSuccess,
        "oom on device 0: device 1 allocates");
  cudaSetDevice(0);
  cudaFree(a);
  cudaGetLastError();
}

static void test_env_faults() {
  setup("2", nullptr, "1:0:sticky,0:1:oom");
  void *a, *b;
  cudaSetDevice(1);
  check(cudaMalloc(&a, 16) == cudaErrorIllegalAddress,
        "QL_EMU_CUDA_FAULT=1:0:sticky: device 1 fails from the start");
  cudaSetDevice(0);
  check(cudaMalloc(&a, 16) == cudaSuccess, "0:1:oom: device 0 allocates");
  cudaMemsetAsync(a, 0, 16, nullptr);
  check(cudaMalloc(&b, 16) == cudaErrorMemoryAllocation,
        "0:1:oom: ...until its first work item has run");
  cudaFree(a);
  for (const char* bad : {"0:x:sticky", "0:1:melt", "8:0:hang", "0:1", "0"}) {
    std::fflush(stdout);
    setup("1", nullptr, bad);
    char what[96];
    std::snprintf(what, sizeof what,
                  "QL_EMU_CUDA_FAULT=\"%s\": cudaErrorInitializationError",
                  bad);
    int n;
    check(cudaGetDeviceCount(&n) == cudaErrorInitializationError, what);
  }
  setup("1", nullptr, "0:0:hang", "bad");
  int n;
  check(cudaGetDeviceCount(&n) == cudaErrorInitializationError,
        "QL_EMU_CUDA_HANG_MS=bad: cudaErrorInitializationError");
  setup("1", nullptr, "0:0:hang,", "0");
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  QL_LAUNCH(fill, dim3(1), dim3(1), 0, s, &n, 1);
  check(cudaStreamQuery(s) == cudaErrorNotReady &&
            cudaStreamSynchronize(s) == cudaErrorLaunchTimeout,
        "QL_EMU_CUDA_FAULT=0:0:hang with QL_EMU_CUDA_HANG_MS=0: a launch "
        "hangs, synchronize times out at once");
  cudaStreamDestroy(s);
  cudaGetLastError();
}

static void test_nodriver() {
  setup("1", nullptr, nullptr, nullptr, "1");
  int n = -1;
  void* p = nullptr;
  size_t fr, tot;
  cudaStream_t s;
  cudaEvent_t e;
  cudaDeviceProp prop;
  cudaIpcMemHandle_t h;
  std::memset(&h, 0, sizeof h);
  CUdeviceptr base;
  const cudaError_t E = cudaErrorInsufficientDriver;
  check(
      cudaGetDeviceCount(&n) == E && n == -1 &&
          cudaGetDeviceProperties(&prop, 0) == E && cudaSetDevice(0) == E &&
          cudaGetDevice(&n) == E && cudaMalloc(&p, 16) == E &&
          cudaFree(p) == E && cudaMallocHost(&p, 16) == E &&
          cudaHostAlloc(&p, 16, 0) == E && cudaFreeHost(p) == E &&
          cudaMemGetInfo(&fr, &tot) == E &&
          cudaMemcpy(&n, &n, 4, cudaMemcpyHostToHost) == E &&
          cudaMemcpyAsync(&n, &n, 4, cudaMemcpyHostToHost, nullptr) == E &&
          cudaMemsetAsync(p, 0, 4, nullptr) == E &&
          cudaStreamCreateWithFlags(&s, 0) == E &&
          cudaStreamDestroy(nullptr) == E &&
          cudaStreamSynchronize(nullptr) == E &&
          cudaStreamQuery(nullptr) == E &&
          cudaStreamWaitEvent(nullptr, nullptr, 0) == E &&
          cudaEventCreateWithFlags(&e, 0) == E &&
          cudaEventDestroy(nullptr) == E &&
          cudaEventRecord(nullptr, nullptr) == E &&
          cudaEventQuery(nullptr) == E && cudaEventSynchronize(nullptr) == E &&
          cudaDeviceSynchronize() == E && cudaGetLastError() == E &&
          cudaPeekAtLastError() == E && cudaIpcGetMemHandle(&h, p) == E &&
          cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess) == E &&
          cudaIpcCloseMemHandle(p) == E &&
          cuMemGetAddressRange(&base, nullptr, 1) == CUDA_ERROR_NOT_INITIALIZED,
      "QL_EMU_CUDA_NODRIVER=1: every call fails with "
      "cudaErrorInsufficientDriver");
  int v = 0;
  QL_LAUNCH(fill, dim3(1), dim3(1), 0, nullptr, &v, 1);
  check(v == 0, "QL_EMU_CUDA_NODRIVER=1: a launch does not run");
  setup("1", nullptr, nullptr, nullptr, "0");
  check(cudaGetDeviceCount(&n) == cudaSuccess && n == 1,
        "QL_EMU_CUDA_NODRIVER=0: the driver is there");
}

// Runs f in a forked child; true when it exits with status 0.
template <class F>
static bool in_child(F f) {
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    g_fail = 0;
    f();
    std::fflush(stdout);
    _exit(g_fail ? 1 : 0);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) < 0) return false;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void test_ipc() {
  setup("2");
  unsigned char *a, *gone;
  cudaMalloc(reinterpret_cast<void**>(&a), 4096);
  for (int i = 0; i < 4096; ++i) a[i] = (unsigned char)(i * 7);
  cudaIpcMemHandle_t h, hg, bad;
  check(cudaIpcGetMemHandle(&h, a + 128) == cudaSuccess,
        "cudaIpcGetMemHandle of a pointer inside an allocation");
  int local;
  check(cudaIpcGetMemHandle(&hg, &local) == cudaErrorInvalidValue,
        "cudaIpcGetMemHandle of a host pointer: cudaErrorInvalidValue");
  cudaMalloc(reinterpret_cast<void**>(&gone), 4096);
  cudaIpcGetMemHandle(&hg, gone);
  cudaFree(gone);
  void* p = nullptr;
  check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess) ==
                cudaErrorDeviceUninitialized &&
            p == nullptr,
        "a handle of this process is refused (invalid device context)");
  check(cudaIpcOpenMemHandle(&p, h, 0) == cudaErrorInvalidValue,
        "flags other than cudaIpcMemLazyEnablePeerAccess: "
        "cudaErrorInvalidValue");
  cudaGetLastError();

  bool ok = in_child([&] {
    void *q = nullptr, *q2 = nullptr, *r = nullptr;
    cudaSetDevice(1);
    check(cudaIpcOpenMemHandle(&q, h, cudaIpcMemLazyEnablePeerAccess) ==
                  cudaSuccess &&
              q != nullptr && q != static_cast<void*>(a),
          "child: opens the parent's handle, a mapping of its own");
    unsigned char* u = static_cast<unsigned char*>(q);
    bool same = true;
    for (int i = 0; i < 4096; ++i) same &= u[i] == (unsigned char)(i * 7);
    check(same,
          "child: the mapping starts at the allocation's base and holds "
          "the parent's bytes");
    CUdeviceptr base = 0;
    size_t size = 0;
    check(cuMemGetAddressRange(
              &base, &size, CUdeviceptr(uintptr_t(u + 4000))) == CUDA_SUCCESS &&
              base == CUdeviceptr(uintptr_t(q)) && size == 4096,
          "child: cuMemGetAddressRange bounds the imported allocation");
    char back[16];
    check(cudaMemcpy(u + 100, "from the child", 15, cudaMemcpyHostToDevice) ==
                  cudaSuccess &&
              cudaMemcpy(back, u + 100, 15, cudaMemcpyDeviceToHost) ==
                  cudaSuccess &&
              std::memcmp(back, "from the child", 15) == 0,
          "child: copies into and out of the imported memory");
    check(cudaIpcOpenMemHandle(&q2, h, cudaIpcMemLazyEnablePeerAccess) ==
                  cudaSuccess &&
              q2 == q,
          "child: a second open returns the same mapping");
    check(cudaFree(q) == cudaErrorInvalidDevicePointer,
          "child: cudaFree of imported memory is refused");
    check(cudaIpcCloseMemHandle(q) == cudaSuccess &&
              cuMemGetAddressRange(&base, &size, CUdeviceptr(uintptr_t(q))) ==
                  CUDA_SUCCESS &&
              cudaIpcCloseMemHandle(q) == cudaSuccess &&
              cuMemGetAddressRange(&base, &size, CUdeviceptr(uintptr_t(q))) ==
                  CUDA_ERROR_NOT_FOUND &&
              cudaIpcCloseMemHandle(q) == cudaErrorInvalidValue,
          "child: two closes unmap (refcounted); a third is refused");
    check(cudaIpcOpenMemHandle(&r, hg, cudaIpcMemLazyEnablePeerAccess) ==
              cudaErrorMapBufferObjectFailed,
          "child: a handle of a freed allocation: "
          "cudaErrorMapBufferObjectFailed");
    cudaIpcMemHandle_t forged = h;
    forged.reserved[0] ^= 1;
    check(cudaIpcOpenMemHandle(&r, forged, cudaIpcMemLazyEnablePeerAccess) ==
              cudaErrorInvalidResourceHandle,
          "child: a handle with a bad magic: cudaErrorInvalidResourceHandle");
    std::memset(&bad, 0, sizeof bad);
    check(cudaIpcOpenMemHandle(&r, bad, cudaIpcMemLazyEnablePeerAccess) ==
              cudaErrorInvalidResourceHandle,
          "child: an all-zero handle: cudaErrorInvalidResourceHandle");
  });
  check(ok, "the child's IPC checks passed");
  check(
      std::memcmp(a + 100, "from the child", 15) == 0 && a[99] == 99 * 7 % 256,
      "the parent sees what the child wrote through the handle");
  cudaFree(a);
}

// Several threads allocate, copy and free on two devices at once; the
// accounting must come back to where it started.
static void test_threads() {
  setup("2", "16777216");
  std::vector<std::thread> ts;
  int bad = 0;
  std::mutex mu;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([t, &bad, &mu] {
      cudaSetDevice(t % 2);
      cudaStream_t s;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      int errs = 0;
      for (int i = 0; i < 200; ++i) {
        void* p;
        unsigned char h[512];
        errs += cudaMalloc(&p, 512) != cudaSuccess;
        errs += cudaMemsetAsync(p, t, 512, s) != cudaSuccess;
        errs += cudaMemcpyAsync(h, p, 512, cudaMemcpyDeviceToHost, s) !=
                cudaSuccess;
        errs += cudaStreamSynchronize(s) != cudaSuccess;
        errs += h[0] != t || h[511] != t;
        errs += cudaFree(p) != cudaSuccess;
      }
      cudaStreamDestroy(s);
      std::lock_guard<std::mutex> g(mu);
      bad += errs;
    });
  for (auto& t : ts) t.join();
  size_t f0, f1, tot;
  cudaSetDevice(0);
  cudaMemGetInfo(&f0, &tot);
  cudaSetDevice(1);
  cudaMemGetInfo(&f1, &tot);
  cudaSetDevice(0);
  check(
      bad == 0 && f0 == tot && f1 == tot && ql_emu_cuda_work(0) == 800 &&
          ql_emu_cuda_work(1) == 800,
      "4 threads on 2 devices: no error, every byte freed, every item counted");
}

// Mapped host memory (cudaHostGetDevicePointer and what a kernel may
// touch), stream priorities, and the copy-engine counter.
static void test_mapped_priority() {
  setup("1");
  void *pinned = nullptr, *dev = nullptr, *dp = nullptr;
  cudaMallocHost(&pinned, 4096);
  cudaMalloc(&dev, 4096);
  void* reg = mmap(nullptr, 8192, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* plain = std::malloc(64);
  check(cudaHostGetDevicePointer(&dp, pinned, 0) == cudaSuccess &&
            dp == pinned &&
            cudaHostGetDevicePointer(&dp, static_cast<char*>(pinned) + 100,
                                     0) == cudaSuccess,
        "pinned memory is mapped at its host address");
  check(cudaHostGetDevicePointer(&dp, plain, 0) == cudaErrorInvalidValue &&
            cudaHostGetDevicePointer(&dp, pinned, 1) == cudaErrorInvalidValue,
        "pageable memory, or flags, have no device address");
  check(cudaHostRegister(reg, 4096, cudaHostRegisterPortable) ==
                cudaSuccess &&
            cudaHostGetDevicePointer(&dp, reg, 0) == cudaErrorInvalidValue &&
            cudaHostUnregister(reg) == cudaSuccess &&
            cudaHostRegister(reg, 4096, cudaHostRegisterMapped) ==
                cudaSuccess &&
            cudaHostGetDevicePointer(&dp, static_cast<char*>(reg) + 8, 0) ==
                cudaSuccess &&
            dp == static_cast<char*>(reg) + 8,
        "a registered range has a device address only when mapped");
  cudaStream_t lo, hi;
  int least = 1, greatest = 1;
  check(cudaDeviceGetStreamPriorityRange(&least, &greatest) == cudaSuccess &&
            least == 0 && greatest == -5 &&
            cudaStreamCreateWithPriority(&hi, cudaStreamNonBlocking, -100) ==
                cudaSuccess &&
            cudaStreamCreateWithFlags(&lo, cudaStreamNonBlocking) ==
                cudaSuccess,
        "priorities 0 (least) to -5, clamped");
  const long l0 = ql_emu_cuda_launches(0), h0 = ql_emu_cuda_priority_launches(0);
  QL_LAUNCH(fill, dim3(1), dim3(4), 0, lo, static_cast<int*>(dev), 1);
  QL_LAUNCH(fill, dim3(1), dim3(4), 0, hi, static_cast<int*>(dev), 2);
  check(ql_emu_cuda_launches(0) == l0 + 2 &&
            ql_emu_cuda_priority_launches(0) == h0 + 1,
        "launches on a stream of a greater priority are counted");
  const long c0 = ql_emu_cuda_dma_copies();
  cudaMemcpyAsync(dev, pinned, 64, cudaMemcpyHostToDevice, lo);
  cudaMemcpyAsync(static_cast<char*>(dev) + 64, dev, 64,
                  cudaMemcpyDeviceToDevice, lo);
  cudaMemcpyAsync(reg, dev, 64, cudaMemcpyDeviceToHost, lo);
  check(ql_emu_cuda_dma_copies() == c0 + 2,
        "copies with a host side count as copy-engine work");
  check(ql__emu_cuda_access(lo, dev, 4096) == 1 &&
            ql__emu_cuda_access(lo, pinned, 4096) == 1 &&
            ql__emu_cuda_access(lo, reg, 4096) == 1 &&
            cudaStreamSynchronize(lo) == cudaSuccess,
        "a kernel may touch device, pinned and mapped memory");
  check(ql__emu_cuda_access(lo, reg, 4097) == 0 &&
            cudaStreamSynchronize(lo) == cudaErrorIllegalAddress,
        "touching memory the GPU does not map is a sticky error");
  std::free(plain);
  munmap(reg, 8192);
  setup("1");
}

int main() {
  test_errors();
  test_devices();
  test_current_device();
  test_memory();
  test_ranges();
  test_copies();
  test_streams_events();
  test_attributes_timing();
  test_launches();
  test_sticky();
  test_hang();
  test_oom();
  test_env_faults();
  test_nodriver();
  test_ipc();
  test_threads();
  test_mapped_priority();
  std::printf("%s\n", g_fail ? "FAILED" : "all passed");
  return g_fail ? 1 : 0;
}
