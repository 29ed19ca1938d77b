// vmm.h - device memory that another process can map (mapped mode,
// DESIGN §7): the CUDA driver's virtual memory management calls
// (cuMemCreate, cuMemExportToShareableHandle, cuMemImportFromShareableHandle,
// cuMemMap, cuMemSetAccess; CUDA Driver API, "Virtual Memory Management"),
// reached through cudaGetDriverEntryPointByVersion so that nothing links
// libcuda. The daemon's CUDA backend allocates its weight layouts here and
// exports them as POSIX file descriptors; libqlinear-cuda imports such a
// descriptor and maps it read-only into the client's own context.
//
// Every call binds nothing: the caller has made the device current
// (cudaSetDevice), so that the driver calls act on its primary context.
#ifndef QL_CUDA_VMM_H
#define QL_CUDA_VMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// One allocation mapped into this process: its handle (0 for an import,
// whose handle is released once mapped) and the address range it is
// mapped at.
typedef struct ql__vmm_mem {
  unsigned long long handle;  // CUmemGenericAllocationHandle; 0: none
  void* base;                 // device address of the first byte
  size_t size;                // bytes reserved and mapped
  int ordinal;                // the device (the runtime's ordinal)
} ql__vmm_mem;

// The driver's entry point name as of cudaVersion (e.g. 3020 for
// CUDA 3.2), through the runtime, or NULL when the driver has none; the
// CUDA error it may leave is cleared.
void* ql__cuda_driver_entry(const char* name, unsigned cuda_version);

// 1 when the driver gives every VMM entry point and device ordinal can
// create memory exportable as a POSIX descriptor; else 0 (an old driver,
// a device without VMM: the caller allocates with cudaMalloc).
int ql__vmm_supported(int ordinal);

// bytes rounded up to the device's allocation granularity (2 MiB on an
// H100), or 0 when that overflows or the driver does not say.
size_t ql__vmm_round(int ordinal, size_t bytes);

// Allocates bytes (rounded up: ql__vmm_round) on the current device
// ordinal, exportable, mapped read-write for that device. 0, QL_ENOMEM,
// QL_ENOTSUP (no VMM), QL_EDEVICE (the driver refused otherwise). On
// failure *out is zeroed and nothing is left allocated.
int ql__vmm_alloc(int ordinal, size_t bytes, ql__vmm_mem* out);

// Unmaps and releases what ql__vmm_alloc or ql__vmm_import made; safe on
// a zeroed struct. Errors are ignored: a failed device's memory goes with
// its context.
void ql__vmm_free(ql__vmm_mem* m);

// A new descriptor of m's allocation for another process (the caller owns
// it, and closes it once sent: the driver does not promise O_CLOEXEC). 0, QL_EEXHAUSTED (out of descriptors), QL_ENOTSUP,
// QL_EDEVICE.
int ql__vmm_export(const ql__vmm_mem* m, int* fd);

// 1 when the driver maps m's allocation read-only (CU_MEM_ACCESS_FLAGS_
// PROT_READ) for its device, tried on a second mapping of it; 0 when it
// refuses; QL_EDEVICE when the second mapping itself fails.
int ql__vmm_probe_readonly(const ql__vmm_mem* m);

// Maps the allocation of descriptor fd (from another process's
// ql__vmm_export; size bytes, which must be its size) into the current
// device ordinal: read-only, or read-write when writable is non-zero.
// fd stays the caller's. 0, QL_EINVAL (not such a descriptor, or size
// wrong), QL_ENOTSUP (the driver cannot map it with that access),
// QL_ENOMEM, QL_EDEVICE. On failure *out is zeroed.
int ql__vmm_import(int ordinal, int fd, size_t size, int writable,
                   ql__vmm_mem* out);

#ifdef __cplusplus
}
#endif
#endif  // QL_CUDA_VMM_H
