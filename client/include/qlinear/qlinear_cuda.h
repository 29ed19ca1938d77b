/*
 * qlinear_cuda.h - for CUDA users of libqlinear: turns a device pointer
 * into the ql_cuda_slice that ql_linear_cuda() takes.
 *
 * Header only (static inline), compiled by the caller against its own
 * CUDA runtime (<cuda_runtime_api.h>, linked with the caller's libcudart):
 * libqlinear itself never links CUDA. The driver's cuMemGetAddressRange
 * is reached through cudaGetDriverEntryPointByVersion (CUDA 12.5 and
 * later), so the caller needs no libcuda at link time either (cuda.h is
 * included for its types only).
 *
 * Usage:
 *
 *   ql_cuda_slice xs, ys;
 *   cudaEventRecord(ev, stream);   // ev: cudaEventInterprocess |
 *                                  //     cudaEventDisableTiming
 *   ql_cuda_slice_from_ptr(&xs, x_dev, m * k * sizeof(float), ev);
 *   ql_cuda_slice_from_ptr(&ys, y_dev, m * n * sizeof(float), NULL);
 *   ql_linear_cuda(c, "layer", QL_PATH_AUTO, QL_DTYPE_F32, m, k, &xs, n,
 *                  &ys, NULL, NULL);
 *
 * The handle names the whole allocation (cudaIpcGetMemHandle needs its
 * base), and the slice its offset in it: memory from a caching allocator
 * (a piece of a larger cudaMalloc) works as it is. The daemon maps each
 * allocation once per session; see ql_cuda_slice for what that keeps
 * alive.
 */
#ifndef QLINEAR_CUDA_H
#define QLINEAR_CUDA_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cuda.h> /* CUresult, CUdeviceptr: types only */
#include <cuda_runtime_api.h>

#include "qlinear.h"

/* cuMemGetAddressRange (_v2, CUDA 3.2) as cuda.h declares it. */
typedef CUresult (*ql__cuda_addr_range_fn)(CUdeviceptr *base, size_t *size,
                                           CUdeviceptr ptr);

/*
 * Fills *out for the `bytes` bytes of device memory at ptr: the IPC handle
 * of the allocation holding them, their offset from its base, the device
 * by the UUID name the daemon uses ("cuda:GPU-<uuid>"), and, when ready is
 * not NULL, that event's IPC handle (it must be made with
 * cudaEventInterprocess | cudaEventDisableTiming; record it after the work
 * that produces the tensor, before the call). ptr and bytes must lie in
 * one allocation. Returns 0, QL_EINVAL (ptr is not device memory, the
 * range leaves its allocation, or an event without the interprocess
 * flag), or QL_ENOTSUP (the runtime cannot export it or has no
 * cuMemGetAddressRange entry point). Binds no device and leaves no CUDA
 * error pending.
 */
static inline int ql_cuda_slice_from_ptr(ql_cuda_slice *out, const void *ptr,
                                         size_t bytes, cudaEvent_t ready) {
  struct cudaPointerAttributes attr;
  struct cudaDeviceProp prop;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  void *fn = NULL;
  CUdeviceptr base = 0;
  size_t size = 0;
  cudaIpcMemHandle_t mh;
  uintptr_t p = (uintptr_t)ptr;
  int at;

  if (out == NULL || ptr == NULL)
    return QL_EINVAL;
  memset(out, 0, sizeof *out);
  memset(&attr, 0, sizeof attr);
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess ||
      attr.type != cudaMemoryTypeDevice) {
    (void)cudaGetLastError();
    return QL_EINVAL;
  }
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 3020,
                                       cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess || fn == NULL) {
    (void)cudaGetLastError();
    return QL_ENOTSUP;
  }
  /* off <= size && len <= size - off, with off = ptr - base. */
  if (((ql__cuda_addr_range_fn)fn)(&base, &size, (CUdeviceptr)p) !=
          CUDA_SUCCESS ||
      p < base || p - base > size || bytes > size - (p - base))
    return QL_EINVAL;
  if (cudaIpcGetMemHandle(&mh, (void *)(uintptr_t)base) != cudaSuccess) {
    (void)cudaGetLastError();
    return QL_ENOTSUP;
  }
  if (cudaGetDeviceProperties(&prop, attr.device) != cudaSuccess) {
    (void)cudaGetLastError();
    return QL_EINVAL;
  }
  memcpy(out->mem_handle, &mh, sizeof out->mem_handle);
  out->offset = (uint64_t)(p - base);
  out->length = (uint64_t)bytes;
  /* The UUID as nvidia-smi prints it, as the daemon names the device. */
  at = snprintf(out->device, sizeof out->device, "cuda:GPU-");
  for (int i = 0; i < 16; i++)
    at += snprintf(out->device + at, sizeof out->device - (size_t)at,
                   "%s%02x", i == 4 || i == 6 || i == 8 || i == 10 ? "-" : "",
                   (unsigned)(unsigned char)prop.uuid.bytes[i]);
  if (ready != NULL) {
    cudaIpcEventHandle_t eh;
    if (cudaIpcGetEventHandle(&eh, ready) != cudaSuccess) {
      (void)cudaGetLastError();
      return QL_EINVAL;
    }
    memcpy(out->ready_event, &eh, sizeof out->ready_event);
    out->has_ready_event = 1;
  }
  return 0;
}

#endif /* QLINEAR_CUDA_H */
