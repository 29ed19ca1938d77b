// vmm.cpp - see vmm.h.
#include <errno.h>
#include <pthread.h>
#include <string.h>

#ifdef QL_CUDA_EMU
#include "emu_runtime.h"
#else
#include <cuda.h>  // types only: libcuda is reached through the runtime
#include <cuda_runtime_api.h>
#endif

#include "ql_kernels.h"
#include "vmm.h"

namespace {

// The driver calls, as cuda.h declares them.
struct api {
  CUresult (*attr)(int*, CUdevice_attribute, CUdevice);
  CUresult (*granularity)(size_t*, const CUmemAllocationProp*,
                          CUmemAllocationGranularity_flags);
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t,
                     const CUmemAllocationProp*, unsigned long long);
  CUresult (*release)(CUmemGenericAllocationHandle);
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr,
                      unsigned long long);
  CUresult (*address_free)(CUdeviceptr, size_t);
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                  unsigned long long);
  CUresult (*unmap)(CUdeviceptr, size_t);
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*,
                         size_t);
  CUresult (*export_fd)(void*, CUmemGenericAllocationHandle,
                        CUmemAllocationHandleType, unsigned long long);
  CUresult (*import_fd)(CUmemGenericAllocationHandle*, void*,
                        CUmemAllocationHandleType);
};

api g_api;
bool g_ok = false;
pthread_once_t g_once = PTHREAD_ONCE_INIT;

template <typename F>
bool entry(const char* name, unsigned version, F* out) {
  void* p = ql__cuda_driver_entry(name, version);
  *out = reinterpret_cast<F>(p);
  return p != nullptr;
}

// The VMM calls came with CUDA 10.2 (cudaVersion 10020);
// cuDeviceGetAttribute is as old as the driver API (2000).
void load() {
  api a;
  memset(&a, 0, sizeof a);
  g_ok = entry("cuDeviceGetAttribute", 2000, &a.attr) &&
         entry("cuMemGetAllocationGranularity", 10020, &a.granularity) &&
         entry("cuMemCreate", 10020, &a.create) &&
         entry("cuMemRelease", 10020, &a.release) &&
         entry("cuMemAddressReserve", 10020, &a.reserve) &&
         entry("cuMemAddressFree", 10020, &a.address_free) &&
         entry("cuMemMap", 10020, &a.map) &&
         entry("cuMemUnmap", 10020, &a.unmap) &&
         entry("cuMemSetAccess", 10020, &a.set_access) &&
         entry("cuMemExportToShareableHandle", 10020, &a.export_fd) &&
         entry("cuMemImportFromShareableHandle", 10020, &a.import_fd);
  g_api = a;
}

const api* driver() {
  pthread_once(&g_once, load);
  return g_ok ? &g_api : nullptr;
}

CUmemAllocationProp prop_of(int ordinal) {
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = ordinal;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

// The QL_E* code of a refusal: out of memory, or the driver's.
int err_of(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS:
      return 0;
    case CUDA_ERROR_OUT_OF_MEMORY:
      return QL_ENOMEM;
    case CUDA_ERROR_NOT_SUPPORTED:
      return QL_ENOTSUP;
    default:
      return QL_EDEVICE;
  }
}

// Reserves an address range for handle h (size bytes), maps it there and
// sets access for the device; on failure undoes all of it.
int map_at(const api* a, CUmemGenericAllocationHandle h, size_t size,
           int ordinal, CUmemAccess_flags flags, void** base,
           bool* access_refused) {
  CUdeviceptr va = 0;
  CUmemAccessDesc ad;
  CUresult r;
  *base = nullptr;
  if (access_refused != nullptr) *access_refused = false;
  if ((r = a->reserve(&va, size, 0, 0, 0)) != CUDA_SUCCESS) return err_of(r);
  if ((r = a->map(va, size, 0, h, 0)) != CUDA_SUCCESS) {
    (void)a->address_free(va, size);
    return err_of(r);
  }
  memset(&ad, 0, sizeof ad);
  ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  ad.location.id = ordinal;
  ad.flags = flags;
  if ((r = a->set_access(va, size, &ad, 1)) != CUDA_SUCCESS) {
    (void)a->unmap(va, size);
    (void)a->address_free(va, size);
    if (access_refused != nullptr) *access_refused = true;
    return r == CUDA_ERROR_OUT_OF_MEMORY ? QL_ENOMEM : QL_ENOTSUP;
  }
  *base = reinterpret_cast<void*>(uintptr_t(va));
  return 0;
}

}  // namespace

void* ql__cuda_driver_entry(const char* name, unsigned cuda_version) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &p, cuda_version,
                                       cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return p;
}

int ql__vmm_supported(int ordinal) {
  const api* a = driver();
  int vmm = 0, fd = 0;
  if (a == nullptr) return 0;
  if (a->attr(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
              ordinal) != CUDA_SUCCESS ||
      a->attr(&fd,
              CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
              ordinal) != CUDA_SUCCESS)
    return 0;
  return vmm != 0 && fd != 0;
}

size_t ql__vmm_round(int ordinal, size_t bytes) {
  const api* a = driver();
  size_t g = 0;
  if (a == nullptr) return 0;
  CUmemAllocationProp p = prop_of(ordinal);
  if (a->granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) !=
          CUDA_SUCCESS ||
      g == 0 || (g & (g - 1)) != 0 || bytes > SIZE_MAX - (g - 1))
    return 0;
  return bytes == 0 ? g : (bytes + g - 1) & ~(g - 1);
}

int ql__vmm_alloc(int ordinal, size_t bytes, ql__vmm_mem* out) {
  const api* a = driver();
  CUmemGenericAllocationHandle h = 0;
  size_t size;
  int rc;
  memset(out, 0, sizeof *out);
  if (a == nullptr) return QL_ENOTSUP;
  // 0: the driver gave no granularity (the caller then uses cudaMalloc),
  // or bytes is within a granule of SIZE_MAX (no device has that much).
  if ((size = ql__vmm_round(ordinal, bytes)) == 0)
    return bytes > SIZE_MAX / 2 ? QL_ENOMEM : QL_ENOTSUP;
  CUmemAllocationProp p = prop_of(ordinal);
  if ((rc = err_of(a->create(&h, size, &p, 0))) != 0) return rc;
  if ((rc = map_at(a, h, size, ordinal, CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                   &out->base, nullptr)) != 0) {
    (void)a->release(h);
    return rc == QL_ENOTSUP ? QL_EDEVICE : rc;
  }
  out->handle = h;
  out->size = size;
  out->ordinal = ordinal;
  return 0;
}

void ql__vmm_free(ql__vmm_mem* m) {
  const api* a = driver();
  if (m == nullptr || a == nullptr) return;
  if (m->base != nullptr) {
    CUdeviceptr va = CUdeviceptr(uintptr_t(m->base));
    (void)a->unmap(va, m->size);
    (void)a->address_free(va, m->size);
  }
  if (m->handle != 0) (void)a->release(m->handle);
  memset(m, 0, sizeof *m);
}

int ql__vmm_export(const ql__vmm_mem* m, int* fd) {
  const api* a = driver();
  int f = -1;
  *fd = -1;
  if (a == nullptr || m == nullptr || m->handle == 0) return QL_ENOTSUP;
  errno = 0;
  CUresult r = a->export_fd(&f, m->handle,
                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (r != CUDA_SUCCESS || f < 0) {
    if (errno == EMFILE || errno == ENFILE) return QL_EEXHAUSTED;
    return r == CUDA_SUCCESS ? QL_EDEVICE : err_of(r);
  }
  *fd = f;
  return 0;
}

int ql__vmm_probe_readonly(const ql__vmm_mem* m) {
  const api* a = driver();
  void* base = nullptr;
  bool refused = false;
  if (a == nullptr || m == nullptr || m->handle == 0) return QL_EDEVICE;
  int rc = map_at(a, m->handle, m->size, m->ordinal,
                  CU_MEM_ACCESS_FLAGS_PROT_READ, &base, &refused);
  if (rc != 0) return refused ? 0 : QL_EDEVICE;
  CUdeviceptr va = CUdeviceptr(uintptr_t(base));
  (void)a->unmap(va, m->size);
  (void)a->address_free(va, m->size);
  return 1;
}

int ql__vmm_import(int ordinal, int fd, size_t size, int writable,
                   ql__vmm_mem* out) {
  const api* a = driver();
  CUmemGenericAllocationHandle h = 0;
  CUresult r;
  int rc;
  memset(out, 0, sizeof *out);
  if (a == nullptr) return QL_ENOTSUP;
  if (fd < 0 || size == 0 || ql__vmm_round(ordinal, size) != size)
    return QL_EINVAL;
  r = a->import_fd(&h, reinterpret_cast<void*>(uintptr_t(fd)),
                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS)
    return r == CUDA_ERROR_OUT_OF_MEMORY ? QL_ENOMEM : QL_EINVAL;
  // A size larger than the allocation fails the map (a smaller one maps
  // a prefix, which the caller's bounds then stay within).
  rc = map_at(a, h, size, ordinal,
              writable ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                       : CU_MEM_ACCESS_FLAGS_PROT_READ,
              &out->base, nullptr);
  // The mapping keeps the memory; the handle is not needed past it.
  (void)a->release(h);
  if (rc != 0) {
    memset(out, 0, sizeof *out);
    return rc == QL_EDEVICE ? QL_EINVAL : rc;
  }
  out->size = size;
  out->ordinal = ordinal;
  return 0;
}
