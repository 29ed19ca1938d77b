// emu_runtime.h - the part of the CUDA runtime API that the CUDA backend's
// host code uses, emulated on host memory, so that the backend runs in
// `make check` on machines with neither a GPU nor a toolkit (DESIGN §9).
// Names, signatures and numeric values are those of CUDA 13
// (driver_types.h, cuda_runtime_api.h, cuda.h; cited per group below), so
// host code compiles against this header or the real one unchanged. Where a
// real struct has more fields, only the ones the host code reads exist here.
//
// Model (emu_runtime.cpp has the details):
// - QL_EMU_CUDA_DEVICES devices (default 1, 0 to 8), QL_EMU_CUDA_MEM bytes
//   each (default 1 GiB), all "Emulated GPU", distinct UUIDs, of compute
//   capability 9.0 unless QL_EMU_CUDA_CC says otherwise: "8.9" for every
//   device, or "8.0,9.0" one per ordinal (the last one for the rest).
//   The current device is per thread, 0 at first.
// - Device memory is host memory: each cudaMalloc is its own memfd mapped
//   shared (one descriptor per live allocation), so that another process
//   can map it through an IPC handle (the memfd is named
//   "ql-emu-cuda:<pid>:<dev>:<serial>", so that a test can find the
//   mappings of an allocation in another process's /proc/<pid>/maps).
//   Pinned host memory is plain memory.
// - Work (kernel launches, cudaMemcpyAsync, cudaMemsetAsync) runs at
//   enqueue, so streams and events are normally complete at once.
// - Faults, counted in work items enqueued on a device: STICKY (every later
//   call on the device fails with cudaErrorIllegalAddress), HANG (later work
//   never runs; queries of what waits on it say cudaErrorNotReady, waits
//   give up with cudaErrorLaunchTimeout after QL_EMU_CUDA_HANG_MS, default
//   2000), OOM (cudaMalloc fails). QL_EMU_CUDA_FAULT="<dev>:<after>:<kind>"
//   with kind sticky, hang, oom or none, several separated by commas, or
//   ql_emu_cuda_inject(). QL_EMU_CUDA_NODRIVER=1: every call fails with
//   cudaErrorInsufficientDriver. A malformed variable makes every call fail
//   with cudaErrorInitializationError and says why on stderr once.
// - QL_EMU_CUDA_KERNEL_MS (default 0, at most 60000): a stream query says
//   not ready until this long after the stream's last launch, so that a
//   batch stays in flight for a while. QL_EMU_CUDA_STATS=<path>: every
//   device's most streams in flight at once (work enqueued that no query
//   has seen complete yet), written there as "<dev> <max>" lines whenever
//   it grows; a test reads how many batches ran at once on one GPU.
// - Virtual memory management (cuMemCreate, cuMemMap, ...; reached through
//   cudaGetDriverEntryPointByVersion): each physical allocation is a memfd
//   named "ql-emu-cuda-vmm:<pid>:<dev>:<serial>", charged as cudaMalloc
//   charges; a reservation is PROT_NONE address space, a mapping the memfd
//   mapped there with the protection cuMemSetAccess gives it (none at
//   first), so that a write through a read-only mapping faults (SIGSEGV).
//   QL_EMU_CUDA_VMM_GRANULARITY: the granularity in bytes (default 65536;
//   a power of two, at least the page size, at most 1 GiB; an H100
//   reports 2 MiB). QL_EMU_CUDA_NOVMM=1: no device supports VMM (the
//   attributes say 0, cuMemCreate and the other calls that make something
//   say CUDA_ERROR_NOT_SUPPORTED), for callers' fallback paths.
//
// Every function is thread-safe.
#ifndef QL_CUDA_EMU_RUNTIME_H
#define QL_CUDA_EMU_RUNTIME_H

// The two cannot be mixed: the real runtime's types would clash with these.
#if defined(__CUDACC__) || defined(CUDART_VERSION)
#error "emu_runtime.h emulates cuda_runtime_api.h: include one or the other"
#endif

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#define QL_EMU_DV(v) = v  // the real header's default arguments (__dv)
#else
#define QL_EMU_DV(v)
#endif

// ---- errors: enum cudaError of driver_types.h (values and the messages
// of cudaGetErrorString). cudaErrorDeviceUninitialized is what the driver
// reports as "invalid device context", among others for an IPC handle
// opened in the process that exported it.
#define QL_EMU_CUDA_ERRORS(X)                                                 \
  X(cudaSuccess, 0, "no error")                                               \
  X(cudaErrorInvalidValue, 1, "invalid argument")                             \
  X(cudaErrorMemoryAllocation, 2, "out of memory")                            \
  X(cudaErrorInitializationError, 3, "initialization error")                  \
  X(cudaErrorInvalidDevicePointer, 17, "invalid device pointer")              \
  X(cudaErrorInvalidMemcpyDirection, 21, "invalid copy direction for memcpy") \
  X(cudaErrorInsufficientDriver, 35,                                          \
    "CUDA driver version is insufficient for CUDA runtime version")           \
  X(cudaErrorDevicesUnavailable, 46,                                          \
    "CUDA-capable device(s) is/are busy or unavailable")                      \
  X(cudaErrorNoDevice, 100, "no CUDA-capable device is detected")             \
  X(cudaErrorInvalidDevice, 101, "invalid device ordinal")                    \
  X(cudaErrorDeviceUninitialized, 201, "invalid device context")              \
  X(cudaErrorMapBufferObjectFailed, 205, "mapping of buffer object failed")   \
  X(cudaErrorInvalidResourceHandle, 400, "invalid resource handle")           \
  X(cudaErrorNotReady, 600, "device not ready")                               \
  X(cudaErrorIllegalAddress, 700, "an illegal memory access was encountered") \
  X(cudaErrorLaunchTimeout, 702, "the launch timed out and was terminated")   \
  X(cudaErrorHostMemoryAlreadyRegistered, 712,                                \
    "part or all of the requested memory range is already mapped")           \
  X(cudaErrorHostMemoryNotRegistered, 713,                                    \
    "pointer does not correspond to a registered memory region")             \
  X(cudaErrorLaunchFailure, 719, "unspecified launch failure")                \
  X(cudaErrorUnknown, 999, "unknown error")

#define QL_EMU_CUDA_ENUM(name, value, msg) name = value,
enum cudaError { QL_EMU_CUDA_ERRORS(QL_EMU_CUDA_ENUM) };
#undef QL_EMU_CUDA_ENUM
typedef enum cudaError cudaError_t;

// ---- handles (driver_types.h: pointers to opaque structs). emu.h, which
// takes the stream of a launch, includes this header.
typedef struct ql_emu_stream* cudaStream_t;
typedef struct ql_emu_event* cudaEvent_t;

// driver_types.h, enum cudaMemcpyKind.
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};

// driver_types.h: struct CUuuid_st, CUDA_IPC_HANDLE_SIZE,
// cudaIpcMemHandle_st.
struct CUuuid_st {
  char bytes[16];
};
typedef struct CUuuid_st cudaUUID_t;
#define CUDA_IPC_HANDLE_SIZE 64
typedef struct cudaIpcMemHandle_st {
  char reserved[CUDA_IPC_HANDLE_SIZE];
} cudaIpcMemHandle_t;
typedef struct cudaIpcEventHandle_st {
  char reserved[CUDA_IPC_HANDLE_SIZE];
} cudaIpcEventHandle_t;

// driver_types.h: enum cudaMemoryType, struct cudaPointerAttributes.
enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3
};
struct cudaPointerAttributes {
  enum cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};

// driver_types.h: enum cudaDriverEntryPointQueryResult, cudaEnableDefault.
enum cudaDriverEntryPointQueryResult {
  cudaDriverEntryPointSuccess = 0,
  cudaDriverEntryPointSymbolNotFound = 1,
  cudaDriverEntryPointVersionNotSufficent = 2
};
#define cudaEnableDefault 0x0

// driver_types.h, struct cudaDeviceProp: the fields the host code reads.
struct cudaDeviceProp {
  char name[256];         // "Emulated GPU"
  cudaUUID_t uuid;        // distinct per device, the same in every run
  size_t totalGlobalMem;  // QL_EMU_CUDA_MEM
  int major, minor;       // compute capability: QL_EMU_CUDA_CC, 9.0
  int multiProcessorCount;
  int pciBusID, pciDeviceID, pciDomainID;  // bus = ordinal + 1
};

// driver_types.h, enum cudaDeviceAttr: the attributes the host code
// reads (the memory clock in kHz, the memory bus width in bits, the L2
// size in bytes, the compute capability). The emulated devices report an
// H100 SXM's memory clock and bus width (2619 MHz, 5120 bits: 3.35 TB/s
// peak), a 1 MiB L2 and the compute capability of QL_EMU_CUDA_CC.
enum cudaDeviceAttr {
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrMemoryClockRate = 36,
  cudaDevAttrGlobalMemoryBusWidth = 37,
  cudaDevAttrL2CacheSize = 38,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76
};

// driver_types.h: flags.
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02
#define cudaHostAllocWriteCombined 0x04
#define cudaHostRegisterDefault 0x00
#define cudaHostRegisterPortable 0x01
#define cudaHostRegisterMapped 0x02
#define cudaHostRegisterIoMemory 0x04
#define cudaHostRegisterReadOnly 0x08
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaEventInterprocess 0x04
#define cudaEventWaitDefault 0x00
#define cudaIpcMemLazyEnablePeerAccess 0x01

// ---- cuda_runtime_api.h
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr,
                                   int device);

cudaError_t cudaMalloc(void** devPtr, size_t size);
cudaError_t cudaFree(void* devPtr);
cudaError_t cudaMallocHost(void** ptr, size_t size);
cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void* ptr);
// Page-locks the caller's memory [ptr, ptr + size) (in the emulation: records
// the range). A range that overlaps one registered already, or pinned
// memory of cudaHostAlloc, is cudaErrorHostMemoryAlreadyRegistered, as the
// driver says; cudaHostUnregister takes the ptr that was registered, else
// cudaErrorHostMemoryNotRegistered. Neither needs a device in service more
// than any call does: a sticky error of the current device is reported.
cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags);
cudaError_t cudaHostUnregister(void* ptr);
// The device address of mapped host memory: memory of cudaHostAlloc (all
// of it mapped under unified addressing) or a range registered with
// cudaHostRegisterMapped; flags must be 0. Here, as on a GPU that can use
// host pointers for registered memory, it is pHost itself. Other memory is
// cudaErrorInvalidValue.
cudaError_t cudaHostGetDevicePointer(void** pDevice, void* pHost,
                                     unsigned int flags);
cudaError_t cudaMemGetInfo(size_t* free, size_t* total);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count,
                       enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count,
                            enum cudaMemcpyKind kind,
                            cudaStream_t stream QL_EMU_DV(0));
cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count,
                            cudaStream_t stream QL_EMU_DV(0));

// cuda_runtime_api.h: a host function runs, on a thread of the runtime,
// once the work enqueued before it on the stream is complete; it must not
// call the runtime. In the emulation it runs on one helper thread, at once
// or, under QL_EMU_CUDA_KERNEL_MS, once the stream's last launch is due;
// behind a hang it never runs.
#define CUDART_CB
typedef void (*cudaHostFn_t)(void* userData);
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn,
                               void* userData);

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream,
                                      unsigned int flags);
// Priorities: lower is greater, clamped into the range the device reports
// (0 and -5 here, as sm_90 reports them). A GPU's block scheduler starts
// waiting blocks of a greater-priority stream first; the emulation runs
// work at enqueue and only counts launches on such streams.
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* pStream,
                                         unsigned int flags, int priority);
cudaError_t cudaDeviceGetStreamPriorityRange(int* leastPriority,
                                             int* greatestPriority);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                unsigned int flags QL_EMU_DV(0));
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event,
                            cudaStream_t stream QL_EMU_DV(0));
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
// Milliseconds between two recorded events of one device: in the
// emulation, the host time between the two records (work runs when it is
// enqueued, so that is the time the work between them took).
// cudaErrorInvalidResourceHandle for an event made with
// cudaEventDisableTiming, never recorded, or of another device;
// cudaErrorNotReady while either waits on hung work.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start,
                                 cudaEvent_t end);

cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* devPtr);
cudaError_t cudaIpcOpenMemHandle(void** devPtr, cudaIpcMemHandle_t handle,
                                 unsigned int flags);
cudaError_t cudaIpcCloseMemHandle(void* devPtr);
// Events made with cudaEventInterprocess | cudaEventDisableTiming only
// (else cudaErrorInvalidResourceHandle). An opened event belongs to the
// current device and is released with cudaEventDestroy. Work runs at
// enqueue here, so an imported event is always complete; opening checks
// that the handle is one this runtime made and that its exporter lives.
cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t* handle,
                                  cudaEvent_t event);
cudaError_t cudaIpcOpenEventHandle(cudaEvent_t* event,
                                   cudaIpcEventHandle_t handle);
// Device memory (own or imported) is cudaMemoryTypeDevice on its device;
// pinned memory cudaMemoryTypeHost; anything else Unregistered (CUDA 11+
// returns success for it).
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attributes,
                                     const void* ptr);
// The driver's entry points that this emulation has: cuMemGetAddressRange
// (introduced as _v2 in CUDA 3.2, cudaVersion >= 3020), cuDeviceGetAttribute
// (>= 2000), and the virtual memory management calls below (CUDA 10.2,
// >= 10020); an older cudaVersion is cudaDriverEntryPointVersionNotSufficent,
// any other symbol cudaDriverEntryPointSymbolNotFound, *funcPtr NULL either
// way.
cudaError_t cudaGetDriverEntryPointByVersion(
    const char* symbol, void** funcPtr, unsigned int cudaVersion,
    unsigned long long flags,
    enum cudaDriverEntryPointQueryResult* driverStatus QL_EMU_DV(NULL));

// ---- cuda.h (driver API): what bounds an imported allocation, and
// virtual memory management. The driver calls do not touch the runtime's
// last error. Without a driver (or with a malformed configuration) each
// says CUDA_ERROR_NOT_INITIALIZED; a device with a sticky error makes the
// calls on its memory say CUDA_ERROR_ILLEGAL_ADDRESS (release calls release
// first).
typedef unsigned long long CUdeviceptr;
typedef int CUdevice;
typedef enum cudaError_enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_ILLEGAL_ADDRESS = 700,
  CUDA_ERROR_NOT_SUPPORTED = 801
} CUresult;
// *pbase and *psize (either may be NULL) of the allocation, own or
// imported, that holds dptr (for virtual memory: the cuMemMap mapping);
// CUDA_ERROR_NOT_FOUND when none does.
CUresult cuMemGetAddressRange(CUdeviceptr* pbase, size_t* psize,
                              CUdeviceptr dptr);

// cuda.h, enum CUdevice_attribute: those the emulation answers (the same
// values as cudaDevAttr*); any other is CUDA_ERROR_INVALID_VALUE.
typedef enum CUdevice_attribute_enum {
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE = 36,
  CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH = 37,
  CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
  CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103
} CUdevice_attribute;
// Bad ordinal: CUDA_ERROR_INVALID_DEVICE (no device at all:
// CUDA_ERROR_NO_DEVICE). The two VMM attributes are 1, 0 under
// QL_EMU_CUDA_NOVMM.
CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib,
                              CUdevice dev);

// cuda.h: the types of virtual memory management.
typedef unsigned long long CUmemGenericAllocationHandle;
typedef enum CUmemAllocationHandleType_enum {
  CU_MEM_HANDLE_TYPE_NONE = 0x0,
  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1,
  CU_MEM_HANDLE_TYPE_WIN32 = 0x2,
  CU_MEM_HANDLE_TYPE_WIN32_KMT = 0x4,
  CU_MEM_HANDLE_TYPE_FABRIC = 0x8,
  CU_MEM_HANDLE_TYPE_MAX = 0x7FFFFFFF
} CUmemAllocationHandleType;
typedef enum CUmemAccess_flags_enum {
  CU_MEM_ACCESS_FLAGS_PROT_NONE = 0x0,
  CU_MEM_ACCESS_FLAGS_PROT_READ = 0x1,
  CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3,
  CU_MEM_ACCESS_FLAGS_PROT_MAX = 0x7FFFFFFF
} CUmemAccess_flags;
typedef enum CUmemLocationType_enum {
  CU_MEM_LOCATION_TYPE_INVALID = 0x0,
  CU_MEM_LOCATION_TYPE_NONE = 0x0,
  CU_MEM_LOCATION_TYPE_DEVICE = 0x1,
  CU_MEM_LOCATION_TYPE_HOST = 0x2,
  CU_MEM_LOCATION_TYPE_HOST_NUMA = 0x3,
  CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 0x4,
  CU_MEM_LOCATION_TYPE_MAX = 0x7FFFFFFF
} CUmemLocationType;
typedef enum CUmemAllocationType_enum {
  CU_MEM_ALLOCATION_TYPE_INVALID = 0x0,
  CU_MEM_ALLOCATION_TYPE_PINNED = 0x1,
  CU_MEM_ALLOCATION_TYPE_MANAGED = 0x2,
  CU_MEM_ALLOCATION_TYPE_MAX = 0x7FFFFFFF
} CUmemAllocationType;
typedef enum CUmemAllocationGranularity_flags_enum {
  CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0,
  CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 0x1
} CUmemAllocationGranularity_flags;
typedef struct CUmemLocation_st {
  CUmemLocationType type;
  int id;
} CUmemLocation;
typedef struct CUmemAllocationProp_st {
  CUmemAllocationType type;
  CUmemAllocationHandleType requestedHandleTypes;
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
} CUmemAllocationProp;
typedef struct CUmemAccessDesc_st {
  CUmemLocation location;
  CUmemAccess_flags flags;
} CUmemAccessDesc;

// Virtual memory management (cuda.h, "Virtual Memory Management"). What
// the emulation refuses, beyond a NULL output (CUDA_ERROR_INVALID_VALUE):
// - cuMemGetAllocationGranularity: a prop other than PINNED on a DEVICE
//   location of a valid ordinal, an unknown option: INVALID_VALUE. Both
//   options give QL_EMU_CUDA_VMM_GRANULARITY.
// - cuMemCreate: a prop as above (a bad ordinal: INVALID_DEVICE), other
//   requestedHandleTypes than NONE or POSIX_FILE_DESCRIPTOR, a
//   win32HandleMetaData, a size that is 0 or not a multiple of the
//   granularity, flags: INVALID_VALUE; the device's memory short (as
//   cudaMalloc, the injected OOM fault included): OUT_OF_MEMORY.
// - cuMemRelease: a handle that is not live: INVALID_VALUE. The memory
//   (and its charge) goes once the handle is released and no mapping of it
//   remains.
// - cuMemAddressReserve: size 0 or not a multiple of the granularity, an
//   alignment not 0 or a power of two, an addr (a hint, not followed) not
//   a multiple of the page size, flags: INVALID_VALUE. The reservation is
//   aligned to the granularity at least.
// - cuMemAddressFree: anything but a whole reservation, or one with a
//   mapping left in it (CUDA leaves that undefined): INVALID_VALUE.
// - cuMemMap: offset or flags not 0, a size that is 0, not a multiple of
//   the granularity or more than the allocation's, a range not inside one
//   reservation or meeting a mapping, a handle not live: INVALID_VALUE. The
//   mapping has no access until cuMemSetAccess.
// - cuMemSetAccess, cuMemUnmap: a range that is not whole mappings back to
//   back: INVALID_VALUE. cuMemSetAccess: count 0, a location that is not a
//   DEVICE, flags other than PROT_READ and PROT_READWRITE (access is not
//   revoked this way: unmap instead): INVALID_VALUE; a bad ordinal:
//   INVALID_DEVICE. The mapping gets the widest access asked for (one
//   address space serves every device here).
// - cuMemExportToShareableHandle: flags, a handle not live: INVALID_VALUE;
//   a handle type other than POSIX_FILE_DESCRIPTOR: NOT_SUPPORTED; a handle
//   made without requesting POSIX_FILE_DESCRIPTOR: INVALID_VALUE. Writes
//   an int, a new descriptor (close-on-exec) that the caller owns.
// - cuMemImportFromShareableHandle: osHandle is the descriptor, cast
//   ((void*)(uintptr_t)fd); a type other than POSIX_FILE_DESCRIPTOR:
//   NOT_SUPPORTED; a descriptor that is not an exported allocation of this
//   emulation (a pipe, a file) or not open read-write: INVALID_VALUE; the
//   allocation's device (its ordinal, named in the memfd: the same in every
//   process here) absent in this process: NOT_SUPPORTED. The caller keeps
//   its descriptor; the new handle is not charged here (the exporter's
//   process pays), and is released with cuMemRelease.
// Pointers into a mapping are device memory of the allocation's device to
// the runtime calls (copies, cudaPointerGetAttributes; cudaFree refuses
// them); a copy or memset that reads a mapping without access, or writes
// one without PROT_READWRITE, faults as a GPU's copy engine does: the
// device of the copy takes a sticky error (cudaErrorIllegalAddress).
CUresult cuMemGetAllocationGranularity(size_t* granularity,
                                       const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags option);
CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                             CUdeviceptr addr, unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                  CUmemGenericAllocationHandle handle,
                  unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size,
                        const CUmemAccessDesc* desc, size_t count);
CUresult cuMemExportToShareableHandle(void* shareableHandle,
                                      CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType,
                                      unsigned long long flags);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                        void* osHandle,
                                        CUmemAllocationHandleType shHandleType);

// ---- the emulation's own controls, for tests
enum {
  QL_EMU_FAULT_NONE = 0,  // clears every fault, pending or not, of dev
  QL_EMU_FAULT_STICKY = 1,
  QL_EMU_FAULT_HANG = 2,
  QL_EMU_FAULT_OOM = 3
};
// Arms a fault of kind on device dev (0..7) that strikes once `after` more
// work items have been enqueued on it (0: now). Aborts on a bad argument: a
// test that passes one is wrong.
void ql_emu_cuda_inject(int dev, long after, int kind);
// Back to the state of a fresh process, except that what callers hold
// stays valid (allocations, mappings, streams, events): faults and
// counters cleared, every thread's last error cleared and current device
// 0, and the environment read again.
void ql_emu_cuda_reset(void);
// Late copies on (QL_EMU_CUDA_LATE_COPY, read again by a reset) or off:
// a cudaMemcpy from pageable host memory to the device lands only when the
// legacy default stream next acts or the device is synchronized (see
// emu_runtime.cpp).
void ql_emu_cuda_late_copies(int on);
// Kernel launches that ran on dev, and work items enqueued on it (run or
// not), since the start or the last reset; -1 for a bad dev.
long ql_emu_cuda_launches(int dev);
long ql_emu_cuda_work(int dev);
// cudaIpcOpenMemHandle calls that mapped an allocation anew (not a second
// open of one already mapped) in this process since the start or the last
// reset.
long ql_emu_cuda_ipc_maps(void);
// Mappings of this process's allocation that holds devPtr in process
// pid's address space (its /proc/<pid>/maps), the process's own mapping
// included when pid is getpid(); -1 when devPtr is not in one of this
// process's own allocations or the maps cannot be read. For a cuMemMap
// mapping (own memory or imported): the mappings of its memory.
long ql_emu_cuda_ipc_mapped_in(int pid, const void* devPtr);
// Physical allocations of virtual memory management that this process
// holds (created or imported, not yet both released and unmapped).
long ql_emu_cuda_vmm_live(void);

// Host ranges registered now (cudaHostRegister), and cudaMemcpyAsync calls
// whose host side lay in one, since the start or the last reset (ranges
// stay registered across a reset). QL_EMU_CUDA_HOST_STATS=<path>: the
// registered ranges and the registrations ever made, written there as
// "<live> <ever>" whenever either changes, for a test in another process.
long ql_emu_cuda_host_ranges(void);
long ql_emu_cuda_host_copies(void);
// cudaMemcpyAsync calls with a side in host memory (a copy engine's work
// on a GPU), since the start or the last reset.
long ql_emu_cuda_dma_copies(void);
// Kernel launches on dev on streams of a priority greater than the
// default, since the start or the last reset; -1 for a bad dev.
long ql_emu_cuda_priority_launches(int dev);

// Called by emu.h's launch with the launch's stream: counts it as work on
// the stream's device and returns non-zero when the kernel is to run
// (zero on a failed or hung device, the error recorded for
// cudaGetLastError). Programs that link no runtime run every launch.
int ql__emu_cuda_launch(cudaStream_t stream);
// Called by an emulated kernel's launcher for memory the kernel will touch
// that may be host memory: 1 when [p, p + n) is device memory or mapped
// host memory (cudaHostGetDevicePointer's); else the stream's device takes
// a sticky error, as a GPU faults on an address it does not map, and 0.
int ql__emu_cuda_access(cudaStream_t stream, const void* p, size_t n);

#undef QL_EMU_DV
#ifdef __cplusplus
}
#endif
#endif  // QL_CUDA_EMU_RUNTIME_H
