// test_cuda_runtime.cpp - the emulated CUDA runtime (kernels/cuda/
// emu_runtime.h), on which the CUDA backend's host code runs in
// `make check`: devices, their compute capabilities (QL_EMU_CUDA_CC),
// memory accounting, address ranges, the current device per thread,
// streams and events, last errors, each injected fault (and that it hits
// only its device), the missing driver, launches through QL_LAUNCH refused
// on a failed device, IPC with a forked process, and the driver's virtual
// memory management (reached, as the backend reaches it, through
// cudaGetDriverEntryPointByVersion): mappings, access, the memory charge,
// and allocations exported as descriptors to forked processes.
//
// Plain main(); one line per check, exit status 1 on any failure. Each
// section sets the environment it needs and calls ql_emu_cuda_reset().
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
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
  check(CUDA_ERROR_OUT_OF_MEMORY == 2 && CUDA_ERROR_NO_DEVICE == 100 &&
            CUDA_ERROR_INVALID_DEVICE == 101 &&
            CUDA_ERROR_NOT_SUPPORTED == 801 &&
            CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED == 102 &&
            CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED ==
                103 &&
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR == 1 &&
            CU_MEM_ACCESS_FLAGS_PROT_READWRITE == 3 &&
            sizeof(CUmemAllocationProp) == 32 &&
            offsetof(CUmemAllocationProp, allocFlags) == 24 &&
            sizeof(CUmemAccessDesc) == 12,
        "driver API values and VMM struct layouts are those of CUDA 13");
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

// Runs f in a forked child and returns its pid without waiting; the child
// exits with status 1 when a check failed.
template <class F>
static pid_t spawn(F f) {
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    g_fail = 0;
    f();
    std::fflush(stdout);
    _exit(g_fail ? 1 : 0);
  }
  return pid;
}

// The status of child pid once it ends (-1 when there is none).
static int reap(pid_t pid) {
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) < 0) return -1;
  return st;
}

// Runs f in a forked child; true when it exits with status 0.
template <class F>
static bool in_child(F f) {
  int st = reap(spawn(f));
  return st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
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

// ------------------------------------------------ virtual memory management

// The driver's calls, taken as the backend takes them (it never links
// libcuda): through cudaGetDriverEntryPointByVersion. Every VMM check below
// calls through these.
static struct {
  decltype(&cuDeviceGetAttribute) attr;
  decltype(&cuMemGetAllocationGranularity) gran;
  decltype(&cuMemCreate) create;
  decltype(&cuMemRelease) release;
  decltype(&cuMemAddressReserve) reserve;
  decltype(&cuMemAddressFree) free;
  decltype(&cuMemMap) map;
  decltype(&cuMemUnmap) unmap;
  decltype(&cuMemSetAccess) access;
  decltype(&cuMemExportToShareableHandle) exp;
  decltype(&cuMemImportFromShareableHandle) imp;
  decltype(&cuMemGetAddressRange) range;
} drv;

template <class F>
static bool entry(const char* name, unsigned version, F* out) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &p, version, cudaEnableDefault,
                                       &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess || p == nullptr)
    return false;
  *out = reinterpret_cast<F>(p);
  return true;
}

static CUmemAllocationProp vmm_prop(int dev, bool posix) {
  CUmemAllocationProp p;
  std::memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.requestedHandleTypes = posix ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                                 : CU_MEM_HANDLE_TYPE_NONE;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  return p;
}

static CUresult set_access(CUdeviceptr p, size_t n, int dev,
                           CUmemAccess_flags f) {
  CUmemAccessDesc d;
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = dev;
  d.flags = f;
  return drv.access(p, n, &d, 1);
}

// Reserves size bytes, maps h over them with access f for dev; 0 when a
// step fails.
static CUdeviceptr map_new(CUmemGenericAllocationHandle h, size_t size, int dev,
                           CUmemAccess_flags f) {
  CUdeviceptr p = 0;
  if (drv.reserve(&p, size, 0, 0, 0) != CUDA_SUCCESS) return 0;
  if (drv.map(p, size, 0, h, 0) != CUDA_SUCCESS ||
      set_access(p, size, dev, f) != CUDA_SUCCESS) {
    drv.unmap(p, size);
    drv.free(p, size);
    return 0;
  }
  return p;
}

static size_t dev_free(int dev) {
  size_t fr = 0, tot = 0;
  int cur = 0;
  cudaGetDevice(&cur);
  cudaSetDevice(dev);
  cudaMemGetInfo(&fr, &tot);
  cudaSetDevice(cur);
  return fr;
}

static void test_vmm_entry_points() {
  setup("2");
  bool all = entry("cuDeviceGetAttribute", 2000, &drv.attr) &&
             entry("cuMemGetAllocationGranularity", 10020, &drv.gran) &&
             entry("cuMemCreate", 10020, &drv.create) &&
             entry("cuMemRelease", 10020, &drv.release) &&
             entry("cuMemAddressReserve", 10020, &drv.reserve) &&
             entry("cuMemAddressFree", 10020, &drv.free) &&
             entry("cuMemMap", 10020, &drv.map) &&
             entry("cuMemUnmap", 10020, &drv.unmap) &&
             entry("cuMemSetAccess", 10020, &drv.access) &&
             entry("cuMemExportToShareableHandle", 10020, &drv.exp) &&
             entry("cuMemImportFromShareableHandle", 10020, &drv.imp) &&
             entry("cuMemGetAddressRange", 3020, &drv.range);
  check(all && drv.create == &cuMemCreate && drv.imp ==
                   &cuMemImportFromShareableHandle,
        "cudaGetDriverEntryPointByVersion hands out every VMM call");
  void* p = &p;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSuccess;
  check(cudaGetDriverEntryPointByVersion("cuMemCreate", &p, 10010, 0, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointVersionNotSufficent && p == nullptr &&
            cudaGetDriverEntryPointByVersion("cuMemMap_v2", &p, 13000, 0,
                                             &q) == cudaSuccess &&
            q == cudaDriverEntryPointSymbolNotFound && p == nullptr,
        "before CUDA 10.2, or a symbol not emulated: no pointer");
  if (!all) {
    std::printf("FAIL no entry points: the VMM tests cannot run\n");
    std::exit(1);
  }
  int v = -1;
  check(drv.attr(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                 1) == CUDA_SUCCESS &&
            v == 1 &&
            drv.attr(&v,
                     CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                     0) == CUDA_SUCCESS &&
            v == 1 &&
            drv.attr(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 1) ==
                CUDA_SUCCESS &&
            v == 9,
        "cuDeviceGetAttribute: VMM and descriptor export supported, sm 9");
  check(drv.attr(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                 2) == CUDA_ERROR_INVALID_DEVICE &&
            drv.attr(&v, CUdevice_attribute(12345), 0) ==
                CUDA_ERROR_INVALID_VALUE &&
            drv.attr(nullptr, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 0) ==
                CUDA_ERROR_INVALID_VALUE,
        "cuDeviceGetAttribute: a bad ordinal, an unknown attribute, NULL");

  size_t g = 0, r = 0;
  CUmemAllocationProp pr = vmm_prop(0, false);
  check(drv.gran(&g, &pr, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS &&
            drv.gran(&r, &pr, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) ==
                CUDA_SUCCESS &&
            g == 65536 && r == 65536,
        "granularity: 64 KiB by default, minimum and recommended");
  CUmemAllocationProp bad = pr;
  bad.type = CU_MEM_ALLOCATION_TYPE_MANAGED;
  check(drv.gran(&g, &bad, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
                CUDA_ERROR_INVALID_VALUE &&
            drv.gran(&g, &pr, CUmemAllocationGranularity_flags(7)) ==
                CUDA_ERROR_INVALID_VALUE &&
            drv.gran(&g, nullptr, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
                CUDA_ERROR_INVALID_VALUE,
        "granularity: managed memory, an unknown option, no prop refused");
  setenv("QL_EMU_CUDA_VMM_GRANULARITY", "2097152", 1);
  setup("1");
  check(drv.gran(&g, &pr, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) ==
                CUDA_SUCCESS &&
            g == 2097152,
        "QL_EMU_CUDA_VMM_GRANULARITY=2097152: an H100's 2 MiB");
  for (const char* b : {"12345", "2048", "196608", "2g", ""}) {
    std::fflush(stdout);
    setenv("QL_EMU_CUDA_VMM_GRANULARITY", b, 1);
    setup("1");
    int n;
    char what[96];
    std::snprintf(what, sizeof what,
                  "QL_EMU_CUDA_VMM_GRANULARITY=\"%s\": every call fails", b);
    check(cudaGetDeviceCount(&n) == cudaErrorInitializationError &&
              drv.gran(&g, &pr, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
                  CUDA_ERROR_NOT_INITIALIZED,
          what);
  }
  unsetenv("QL_EMU_CUDA_VMM_GRANULARITY");

  setenv("QL_EMU_CUDA_NOVMM", "1", 1);
  setup("2");
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr a = 0;
  int imp = -1;
  check(drv.attr(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                 1) == CUDA_SUCCESS &&
            v == 0 &&
            drv.attr(&v,
                     CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                     1) == CUDA_SUCCESS &&
            v == 0,
        "QL_EMU_CUDA_NOVMM=1: the attributes say unsupported");
  check(drv.create(&h, 65536, &pr, 0) == CUDA_ERROR_NOT_SUPPORTED &&
            drv.gran(&g, &pr, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
                CUDA_ERROR_NOT_SUPPORTED &&
            drv.reserve(&a, 65536, 0, 0, 0) == CUDA_ERROR_NOT_SUPPORTED &&
            drv.imp(&h, reinterpret_cast<void*>(uintptr_t(imp)),
                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
                CUDA_ERROR_NOT_SUPPORTED,
        "QL_EMU_CUDA_NOVMM=1: create, granularity, reserve, import: "
        "CUDA_ERROR_NOT_SUPPORTED");
  unsetenv("QL_EMU_CUDA_NOVMM");
  setup("1", nullptr, nullptr, nullptr, "1");
  check(drv.create(&h, 65536, &pr, 0) == CUDA_ERROR_NOT_INITIALIZED &&
            drv.attr(&v, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 0) ==
                CUDA_ERROR_NOT_INITIALIZED &&
            drv.release(h) == CUDA_ERROR_NOT_INITIALIZED &&
            drv.unmap(a, 65536) == CUDA_ERROR_NOT_INITIALIZED,
        "QL_EMU_CUDA_NODRIVER=1: the VMM calls fail not initialized");
  setup("0");
  check(drv.create(&h, 65536, &pr, 0) == CUDA_ERROR_NO_DEVICE &&
            drv.attr(&v, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 0) ==
                CUDA_ERROR_NO_DEVICE,
        "no device: CUDA_ERROR_NO_DEVICE");
}

static void test_vmm_mappings() {
  setup("2", "4194304");
  const size_t G = 65536;
  const size_t total = dev_free(1);
  CUmemAllocationProp pr = vmm_prop(1, false);
  CUmemGenericAllocationHandle h = 0, h2 = 0;
  CUdeviceptr base = 0;
  check(drv.create(&h, 2 * G, &pr, 0) == CUDA_SUCCESS && h != 0 &&
            dev_free(1) == total - 2 * G && dev_free(0) == total &&
            ql_emu_cuda_vmm_live() == 1,
        "cuMemCreate: charged to its device (1), not the current one");
  check(drv.reserve(&base, 4 * G, 0, 0, 0) == CUDA_SUCCESS && base != 0 &&
            base % G == 0 && dev_free(1) == total - 2 * G,
        "cuMemAddressReserve: aligned address space, charged nothing");
  check(drv.map(base, 2 * G, 0, h, 0) == CUDA_SUCCESS,
        "cuMemMap of the whole allocation at the reservation's start");
  unsigned char* m = reinterpret_cast<unsigned char*>(uintptr_t(base));
  CUdeviceptr rb = 0;
  size_t rs = 0;
  cudaPointerAttributes at;
  check(drv.range(&rb, &rs, base + 2 * G - 1) == CUDA_SUCCESS && rb == base &&
            rs == 2 * G &&
            drv.range(&rb, &rs, base + 2 * G) == CUDA_ERROR_NOT_FOUND,
        "cuMemGetAddressRange: the mapping, from an interior pointer; "
        "nothing past it");
  check(cudaPointerGetAttributes(&at, m + 100) == cudaSuccess &&
            at.type == cudaMemoryTypeDevice && at.device == 1,
        "cudaPointerGetAttributes: device memory of device 1");
  check(ql__emu_cuda_access(nullptr, m, 64) == 0 &&
            cudaStreamQuery(nullptr) == cudaErrorIllegalAddress,
        "before cuMemSetAccess a kernel may not touch it (sticky error)");
  ql_emu_cuda_reset();
  std::vector<unsigned char> src(2 * G), back(2 * G, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = (unsigned char)(i * 13 + 1);
  check(cudaMemcpy(m, src.data(), 64, cudaMemcpyHostToDevice) ==
                cudaErrorIllegalAddress &&
            cudaMalloc(&at.devicePointer, 16) == cudaErrorIllegalAddress,
        "a copy into a mapping without access faults: a sticky error");
  ql_emu_cuda_reset();
  check(cudaMemcpy(back.data(), m, 64, cudaMemcpyDeviceToHost) ==
                cudaErrorIllegalAddress &&
            cudaMalloc(&at.devicePointer, 16) == cudaErrorIllegalAddress,
        "so does a copy out of it");
  ql_emu_cuda_reset();
  check(set_access(base, 2 * G, 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE) ==
                CUDA_SUCCESS &&
            cudaMemcpy(m, src.data(), 2 * G, cudaMemcpyHostToDevice) ==
                cudaSuccess &&
            cudaMemcpy(back.data(), m, 2 * G, cudaMemcpyDeviceToHost) ==
                cudaSuccess &&
            back == src && m[5] == src[5],
        "read-write: H2D and D2H through the mapping round-trip the bytes");
  check(cudaMemcpy(m + G, src.data(), 2 * G, cudaMemcpyHostToDevice) ==
                cudaErrorInvalidValue &&
            cudaMemsetAsync(m + 2 * G, 0, 16, nullptr) ==
                cudaErrorInvalidValue,
        "a copy past the mapping into the reservation: cudaErrorInvalidValue");
  cudaGetLastError();
  check(cudaFree(m) == cudaErrorInvalidDevicePointer && m[7] == src[7],
        "cudaFree of a mapping is refused and leaves it mapped");
  cudaIpcMemHandle_t ih;
  check(cudaIpcGetMemHandle(&ih, m) == cudaErrorInvalidValue,
        "cudaIpcGetMemHandle of a mapping: cudaErrorInvalidValue");
  cudaGetLastError();

  // A second allocation right behind the first: one range to copies and
  // to cuMemSetAccess.
  check(drv.create(&h2, G, &pr, 0) == CUDA_SUCCESS &&
            drv.map(base + 2 * G, G, 0, h2, 0) == CUDA_SUCCESS &&
            set_access(base, 3 * G, 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE) ==
                CUDA_SUCCESS &&
            cudaMemcpy(m + G, src.data(), 2 * G, cudaMemcpyHostToDevice) ==
                cudaSuccess &&
            m[3 * G - 1] == src[2 * G - 1],
        "two mappings back to back: access set and a copy across both");
  check(set_access(base, 2 * G + 4096, 1, CU_MEM_ACCESS_FLAGS_PROT_READ) ==
                CUDA_ERROR_INVALID_VALUE &&
            set_access(base, 4 * G, 1, CU_MEM_ACCESS_FLAGS_PROT_READ) ==
                CUDA_ERROR_INVALID_VALUE &&
            drv.unmap(base + G, G) == CUDA_ERROR_INVALID_VALUE,
        "cuMemSetAccess, cuMemUnmap of part of a mapping, or past the "
        "mapped ones: CUDA_ERROR_INVALID_VALUE");

  // Read-only: reads work, a write faults the copy engine.
  check(set_access(base, 2 * G, 0, CU_MEM_ACCESS_FLAGS_PROT_READ) ==
                CUDA_SUCCESS &&
            cudaMemcpy(back.data(), m, 64, cudaMemcpyDeviceToHost) ==
                cudaSuccess &&
            ql__emu_cuda_access(nullptr, m, 64) == 1,
        "read-only (access given through device 0): copies out, kernels "
        "read");
  check(cudaMemcpy(m, src.data(), 64, cudaMemcpyHostToDevice) ==
                cudaErrorIllegalAddress &&
            cudaMemcpy(m + 2 * G, src.data(), 64, cudaMemcpyHostToDevice) ==
                cudaErrorIllegalAddress,
        "a copy into the read-only mapping: cudaErrorIllegalAddress, sticky "
        "(the next copy, even to a writable one, is refused)");
  ql_emu_cuda_reset();
  cudaStream_t st;
  cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  check(cudaMemsetAsync(m + 16, 0, 16, st) == cudaErrorIllegalAddress &&
            cudaStreamQuery(st) == cudaErrorIllegalAddress,
        "a memset of the read-only mapping: a sticky error on its stream's "
        "device");
  cudaStreamDestroy(st);
  ql_emu_cuda_reset();

  // What is refused.
  CUmemGenericAllocationHandle x = 0;
  CUmemAllocationProp b = pr;
  bool refused = drv.create(&x, 1000, &pr, 0) == CUDA_ERROR_INVALID_VALUE &&
                 drv.create(&x, 0, &pr, 0) == CUDA_ERROR_INVALID_VALUE &&
                 drv.create(&x, G, &pr, 1) == CUDA_ERROR_INVALID_VALUE &&
                 drv.create(nullptr, G, &pr, 0) == CUDA_ERROR_INVALID_VALUE;
  b.location.type = CU_MEM_LOCATION_TYPE_HOST;
  refused &= drv.create(&x, G, &b, 0) == CUDA_ERROR_INVALID_VALUE;
  b = pr;
  b.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
  refused &= drv.create(&x, G, &b, 0) == CUDA_ERROR_INVALID_VALUE;
  b = pr;
  b.location.id = 2;
  refused &= drv.create(&x, G, &b, 0) == CUDA_ERROR_INVALID_DEVICE;
  check(refused && ql_emu_cuda_vmm_live() == 2,
        "cuMemCreate refuses: a size not a multiple of the granularity, 0, "
        "flags, NULL, a host location, other handle types, device 2 of 2");
  CUdeviceptr r2 = 0;
  int local = 0;
  check(drv.reserve(&r2, 1000, 0, 0, 0) == CUDA_ERROR_INVALID_VALUE &&
            drv.reserve(&r2, G, 3, 0, 0) == CUDA_ERROR_INVALID_VALUE &&
            drv.reserve(&r2, G, 0, 0, 1) == CUDA_ERROR_INVALID_VALUE &&
            drv.reserve(&r2, G, 1 << 22, 0, 0) == CUDA_SUCCESS &&
            r2 % (1 << 22) == 0 && drv.free(r2, G) == CUDA_SUCCESS,
        "cuMemAddressReserve: bad size, alignment, flags refused; a 4 MiB "
        "alignment kept");
  check(drv.release(12345) == CUDA_ERROR_INVALID_VALUE &&
            drv.map(base + 3 * G, G, 0, 12345, 0) ==
                CUDA_ERROR_INVALID_VALUE,
        "an unknown handle: CUDA_ERROR_INVALID_VALUE");
  check(drv.map(base, 2 * G, 0, h, 0) == CUDA_ERROR_INVALID_VALUE &&
            drv.map(base + G, G, 0, h2, 0) == CUDA_ERROR_INVALID_VALUE &&
            drv.map(base + 3 * G, G, 4096, h2, 0) ==
                CUDA_ERROR_INVALID_VALUE &&
            drv.map(base + 3 * G, 2 * G, 0, h, 0) ==
                CUDA_ERROR_INVALID_VALUE &&
            drv.map(base + 3 * G, G, 0, h2, 1) == CUDA_ERROR_INVALID_VALUE &&
            drv.map(CUdeviceptr(uintptr_t(&local)) & ~CUdeviceptr(G - 1), G,
                    0, h2, 0) == CUDA_ERROR_INVALID_VALUE,
        "cuMemMap refuses: a mapped range (double map), an offset, a range "
        "past the reservation, flags, memory outside any reservation");
  check(drv.map(base + 3 * G, G, 0, h, 0) == CUDA_SUCCESS &&
            drv.unmap(base + 3 * G, G) == CUDA_SUCCESS,
        "cuMemMap of a prefix of an allocation (the same memory twice)");
  check(drv.unmap(base + 3 * G, G) == CUDA_ERROR_INVALID_VALUE &&
            drv.unmap(0, G) == CUDA_ERROR_INVALID_VALUE,
        "cuMemUnmap of an unmapped range: CUDA_ERROR_INVALID_VALUE");
  CUmemAccessDesc d2[2];
  d2[0].location.type = d2[1].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d2[0].location.id = 0;
  d2[1].location.id = 1;
  d2[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
  d2[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  check(set_access(base, 2 * G, 1, CU_MEM_ACCESS_FLAGS_PROT_NONE) ==
                CUDA_ERROR_INVALID_VALUE &&
            set_access(base, 2 * G, 2, CU_MEM_ACCESS_FLAGS_PROT_READ) ==
                CUDA_ERROR_INVALID_DEVICE &&
            drv.access(base, 2 * G, d2, 0) == CUDA_ERROR_INVALID_VALUE &&
            drv.access(base, 2 * G, d2, 2) == CUDA_SUCCESS &&
            cudaMemcpy(m, src.data(), 64, cudaMemcpyHostToDevice) ==
                cudaSuccess,
        "cuMemSetAccess: PROT_NONE, device 2, no descriptor refused; read "
        "for one device and read-write for another is read-write");
  check(drv.free(base, 4 * G) == CUDA_ERROR_INVALID_VALUE &&
            drv.free(base, 2 * G) == CUDA_ERROR_INVALID_VALUE,
        "cuMemAddressFree of a reservation with mappings, or of part of "
        "one: CUDA_ERROR_INVALID_VALUE");

  // The memory goes when the handle is released and the last mapping gone.
  check(drv.release(h) == CUDA_SUCCESS && dev_free(1) == total - 3 * G &&
            m[9] == src[9] && ql_emu_cuda_vmm_live() == 2,
        "released while mapped: still charged, still readable");
  check(drv.release(h) == CUDA_ERROR_INVALID_VALUE &&
            drv.map(base + 3 * G, G, 0, h, 0) == CUDA_ERROR_INVALID_VALUE,
        "a released handle cannot be released again or mapped");
  check(drv.unmap(base, 2 * G) == CUDA_SUCCESS && dev_free(1) == total - G &&
            ql_emu_cuda_vmm_live() == 1 &&
            drv.range(&rb, &rs, base) == CUDA_ERROR_NOT_FOUND &&
            cudaMemcpy(back.data(), m, 64, cudaMemcpyDeviceToHost) ==
                cudaErrorInvalidValue,
        "...and freed by the unmap: uncharged, no longer device memory");
  cudaGetLastError();
  check(drv.unmap(base + 2 * G, G) == CUDA_SUCCESS &&
            dev_free(1) == total - G && drv.release(h2) == CUDA_SUCCESS &&
            dev_free(1) == total && ql_emu_cuda_vmm_live() == 0,
        "unmapped first: freed by the release");
  check(drv.free(base, 4 * G) == CUDA_SUCCESS &&
            drv.free(base, 4 * G) == CUDA_ERROR_INVALID_VALUE,
        "cuMemAddressFree of the whole reservation, once");

  // The charge is cudaMalloc's: the same memory and the same faults.
  void* big = nullptr;
  check(cudaSetDevice(1) == cudaSuccess &&
            cudaMalloc(&big, total - G) == cudaSuccess &&
            drv.create(&x, 2 * G, &pr, 0) == CUDA_ERROR_OUT_OF_MEMORY &&
            drv.create(&x, G, &pr, 0) == CUDA_SUCCESS &&
            cudaFree(big) == cudaSuccess && drv.release(x) == CUDA_SUCCESS,
        "cuMemCreate and cudaMalloc share the device's memory");
  cudaSetDevice(0);
  ql_emu_cuda_inject(1, 0, QL_EMU_FAULT_OOM);
  check(drv.create(&x, G, &pr, 0) == CUDA_ERROR_OUT_OF_MEMORY,
        "the injected OOM fault: CUDA_ERROR_OUT_OF_MEMORY");
  ql_emu_cuda_inject(1, 0, QL_EMU_FAULT_NONE);

  // A sticky error: nothing new; release calls release, then report it.
  CUdeviceptr sp = 0;
  check(drv.create(&x, G, &pr, 0) == CUDA_SUCCESS &&
            (sp = map_new(x, G, 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)) != 0,
        "an allocation mapped on device 1");
  ql_emu_cuda_inject(1, 0, QL_EMU_FAULT_STICKY);
  check(drv.create(&h, G, &pr, 0) == CUDA_ERROR_ILLEGAL_ADDRESS &&
            set_access(sp, G, 1, CU_MEM_ACCESS_FLAGS_PROT_READ) ==
                CUDA_ERROR_ILLEGAL_ADDRESS,
        "sticky error on device 1: cuMemCreate, cuMemSetAccess refused");
  check(drv.unmap(sp, G) == CUDA_ERROR_ILLEGAL_ADDRESS &&
            drv.release(x) == CUDA_ERROR_ILLEGAL_ADDRESS &&
            ql_emu_cuda_vmm_live() == 0 && drv.free(sp, G) == CUDA_SUCCESS,
        "...cuMemUnmap and cuMemRelease release and report it");
  setup("1");
}

static bool send_fd(int sock, int fd) {
  char byte = 'f';
  struct iovec iov = {&byte, 1};
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int))];
  } u;
  std::memset(&u, 0, sizeof u);
  struct msghdr msg;
  std::memset(&msg, 0, sizeof msg);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = u.buf;
  msg.msg_controllen = sizeof u.buf;
  struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  return sendmsg(sock, &msg, 0) == 1;
}

// The descriptor sent over sock, or -1.
static int recv_fd(int sock) {
  char byte;
  struct iovec iov = {&byte, 1};
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int))];
  } u;
  struct msghdr msg;
  std::memset(&msg, 0, sizeof msg);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = u.buf;
  msg.msg_controllen = sizeof u.buf;
  if (recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) != 1) return -1;
  struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd;
  std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

// Weights laid out by one process, exported as a descriptor, mapped
// read-only by others: one that reads them, one that writes and dies.
static void test_vmm_ipc() {
  setup("2", "4194304");
  const size_t G = 65536;
  int sv[2];
  check(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0,
        "a socket pair for SCM_RIGHTS");
  const pid_t parent = getpid();
  // The reader starts before the allocation exists: what it has of it is
  // the descriptor it receives.
  pid_t reader = spawn([&] {
    close(sv[0]);
    const long live0 = ql_emu_cuda_vmm_live();
    const size_t free0 = dev_free(1);
    int fd = recv_fd(sv[1]);
    close(sv[1]);
    CUmemGenericAllocationHandle h = 0;
    check(fd >= 0 &&
              drv.imp(&h, reinterpret_cast<void*>(uintptr_t(fd)),
                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
                  CUDA_SUCCESS &&
              fcntl(fd, F_GETFD) >= 0 && close(fd) == 0 &&
              ql_emu_cuda_vmm_live() == live0 + 1 && dev_free(1) == free0,
          "reader: imports the received descriptor (kept its own, closed "
          "here; not charged)");
    CUdeviceptr p = map_new(h, 2 * G, 1, CU_MEM_ACCESS_FLAGS_PROT_READ);
    const unsigned char* u =
        reinterpret_cast<const unsigned char*>(uintptr_t(p));
    bool same = p != 0;
    for (size_t i = 0; same && i < 2 * G; ++i)
      same = u[i] == (unsigned char)(i * 7 + 3);
    check(same, "reader: maps it read-only and reads the parent's bytes");
    unsigned char b[64];
    CUdeviceptr rb = 0;
    size_t rs = 0;
    cudaPointerAttributes at;
    check(p != 0 &&
              cudaMemcpy(b, u + 100, 64, cudaMemcpyDeviceToHost) ==
                  cudaSuccess &&
              b[0] == (unsigned char)(100 * 7 + 3) &&
              drv.range(&rb, &rs, p + 5000) == CUDA_SUCCESS && rb == p &&
              rs == 2 * G &&
              cudaPointerGetAttributes(&at, u) == cudaSuccess &&
              at.device == 1 && at.type == cudaMemoryTypeDevice,
          "reader: a device-to-host copy, its range, its device (1, from "
          "the memfd)");
    check(ql_emu_cuda_ipc_mapped_in(getpid(), u) == 1 &&
              ql_emu_cuda_ipc_mapped_in(int(parent), u) == 1,
          "reader: the memory is mapped here and in the parent");
    check(cudaMemcpy(const_cast<unsigned char*>(u), b, 64,
                     cudaMemcpyHostToDevice) == cudaErrorIllegalAddress,
          "reader: a copy into its read-only mapping faults (sticky)");
    check(drv.unmap(p, 2 * G) == CUDA_SUCCESS &&
              drv.release(h) == CUDA_SUCCESS &&
              drv.free(p, 2 * G) == CUDA_SUCCESS &&
              ql_emu_cuda_vmm_live() == live0,
          "reader: unmaps, releases, frees");
  });
  close(sv[1]);

  CUmemAllocationProp pr = vmm_prop(1, true), pn = vmm_prop(1, false);
  CUmemGenericAllocationHandle h = 0, hn = 0;
  CUdeviceptr p = 0;
  int fd = -1, nfd = -1;
  std::vector<unsigned char> w(2 * G);
  for (size_t i = 0; i < w.size(); ++i) w[i] = (unsigned char)(i * 7 + 3);
  check(drv.create(&h, 2 * G, &pr, 0) == CUDA_SUCCESS &&
            (p = map_new(h, 2 * G, 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)) !=
                0 &&
            cudaMemcpy(reinterpret_cast<void*>(uintptr_t(p)), w.data(),
                       2 * G, cudaMemcpyHostToDevice) == cudaSuccess,
        "parent: lays out 128 KiB on device 1 through a mapping");
  check(drv.exp(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
                CUDA_SUCCESS &&
            fd >= 0 && (fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0,
        "cuMemExportToShareableHandle: a new close-on-exec descriptor");
  check(send_fd(sv[0], fd), "parent: sends it over SCM_RIGHTS");
  close(sv[0]);

  // The writer inherits the descriptor; its write through the read-only
  // mapping must kill it with SIGSEGV, as a GPU's MMU faults it.
  pid_t writer = fork();
  if (writer == 0) {
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    CUmemGenericAllocationHandle hw = 0;
    if (drv.imp(&hw, reinterpret_cast<void*>(uintptr_t(fd)),
                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != CUDA_SUCCESS)
      _exit(3);
    CUdeviceptr q = map_new(hw, 2 * G, 1, CU_MEM_ACCESS_FLAGS_PROT_READ);
    volatile unsigned char* v =
        reinterpret_cast<volatile unsigned char*>(uintptr_t(q));
    if (q == 0 || v[1] != w[1]) _exit(4);
    // Not a sanitizer's report: the plain signal.
    signal(SIGSEGV, SIG_DFL);
    v[1] = 0xEE;
    _exit(5);
  }
  int wst = reap(writer), rst = reap(reader);
  check(wst >= 0 && WIFSIGNALED(wst) && WTERMSIG(wst) == SIGSEGV,
        "a child's write through its read-only mapping dies of SIGSEGV");
  check(rst >= 0 && WIFEXITED(rst) && WEXITSTATUS(rst) == 0,
        "the reader's checks passed");
  const unsigned char* u = reinterpret_cast<const unsigned char*>(uintptr_t(p));
  check(u[1] == w[1] && u[100] == w[100],
        "the parent's bytes are unchanged by either child");

  int pipefd[2];
  CUmemGenericAllocationHandle x = 0;
  FILE* tf = std::tmpfile();
  check(pipe(pipefd) == 0 &&
            drv.imp(&x, reinterpret_cast<void*>(uintptr_t(pipefd[0])),
                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
                CUDA_ERROR_INVALID_VALUE &&
            tf != nullptr &&
            drv.imp(&x, reinterpret_cast<void*>(uintptr_t(fileno(tf))),
                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
                CUDA_ERROR_INVALID_VALUE &&
            drv.imp(&x, reinterpret_cast<void*>(uintptr_t(12345)),
                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
                CUDA_ERROR_INVALID_VALUE &&
            drv.imp(&x, reinterpret_cast<void*>(uintptr_t(fd)),
                    CU_MEM_HANDLE_TYPE_FABRIC) == CUDA_ERROR_NOT_SUPPORTED &&
            fcntl(pipefd[0], F_GETFD) >= 0,
        "import of a pipe, a regular file, a closed number: "
        "CUDA_ERROR_INVALID_VALUE; a fabric handle: not supported");
  close(pipefd[0]);
  close(pipefd[1]);
  if (tf != nullptr) std::fclose(tf);
  check(drv.create(&hn, G, &pn, 0) == CUDA_SUCCESS &&
            drv.exp(&nfd, hn, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
                CUDA_ERROR_INVALID_VALUE &&
            drv.exp(&nfd, h, CU_MEM_HANDLE_TYPE_WIN32, 0) ==
                CUDA_ERROR_NOT_SUPPORTED &&
            drv.exp(&nfd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1) ==
                CUDA_ERROR_INVALID_VALUE &&
            drv.exp(&nfd, 12345, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    0) == CUDA_ERROR_INVALID_VALUE &&
            nfd == -1 && drv.release(hn) == CUDA_SUCCESS,
        "export of a handle made without the descriptor request, as Win32, "
        "with flags, of an unknown handle: refused");

  // An import in the exporting process is a second handle to the memory.
  const size_t before = dev_free(1);
  CUmemGenericAllocationHandle self = 0;
  CUdeviceptr q = 0;
  check(drv.imp(&self, reinterpret_cast<void*>(uintptr_t(fd)),
                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_SUCCESS &&
            self != h && dev_free(1) == before &&
            (q = map_new(self, 2 * G, 1, CU_MEM_ACCESS_FLAGS_PROT_READ)) !=
                0 &&
            reinterpret_cast<const unsigned char*>(uintptr_t(q))[77] ==
                w[77],
        "an import in the exporting process: a new handle, the same bytes, "
        "no second charge");
  close(fd);
  check(drv.unmap(q, 2 * G) == CUDA_SUCCESS &&
            drv.release(self) == CUDA_SUCCESS &&
            drv.free(q, 2 * G) == CUDA_SUCCESS &&
            drv.unmap(p, 2 * G) == CUDA_SUCCESS &&
            drv.release(h) == CUDA_SUCCESS &&
            drv.free(p, 2 * G) == CUDA_SUCCESS &&
            ql_emu_cuda_vmm_live() == 0 && dev_free(1) == before + 2 * G,
        "everything unmapped, released and freed");
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
  test_vmm_entry_points();
  test_vmm_mappings();
  test_vmm_ipc();
  test_threads();
  test_mapped_priority();
  std::printf("%s\n", g_fail ? "FAILED" : "all passed");
  return g_fail ? 1 : 0;
}
