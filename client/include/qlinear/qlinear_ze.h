/*
 * qlinear_ze.h - for Level Zero users of libqlinear: turns a device
 * pointer into what ql_ze_import() and ql_linear_ze() take.
 *
 * Header only (static inline), compiled by the caller against its own
 * Level Zero loader (<level_zero/ze_api.h>, linked with -lze_loader):
 * libqlinear itself never links Level Zero.
 *
 * Usage:
 *
 *   ql_ze_export ex;
 *   uint64_t id;
 *   ql_ze_export_ptr(ctx, x_dev, m * k * sizeof(float), &ex);
 *   ql_ze_import(c, ex.fd, ex.handle, ex.device, &id, NULL);
 *   ql_ze_slice xs = {id, ex.offset, m * k * sizeof(float)};
 *   ql_linear_ze(c, "layer", QL_PATH_AUTO, QL_DTYPE_F32, m, k, &xs, n,
 *                NULL, y_host, NULL);
 *
 * The handle names the whole allocation (zeMemGetIpcHandle of its base),
 * and the offset the pointer's place in it: memory from a caching
 * allocator works as it is, and one import serves every tensor of one
 * allocation. The descriptor is the driver's, read from the handle's first
 * 8 bytes where dma-buf drivers keep it: the caller does not close it (the
 * driver does, at zeMemFree or zeMemPutIpcHandle).
 */
#ifndef QLINEAR_ZE_H
#define QLINEAR_ZE_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <level_zero/ze_api.h>

#include "qlinear.h"

/* What ql_ze_export_ptr() gives for a device pointer. */
typedef struct ql_ze_export {
  int fd; /* the allocation's dma-buf descriptor (the driver's) */
  unsigned char handle[QL_ZE_IPC_HANDLE_BYTES]; /* ze_ipc_mem_handle_t */
  uint64_t offset;     /* of the pointer from the allocation's base */
  uint64_t alloc_size; /* of the whole allocation */
  /* The allocation's device as the daemon names it ("ze:<uuid>"). */
  char device[QL_DEVICE_NAME_MAX];
} ql_ze_export;

/*
 * Fills *out for the `bytes` bytes of device memory at ptr in context ctx.
 * ptr and bytes must lie in one device allocation. Returns 0, QL_EINVAL
 * (ptr is not device memory of ctx, or the range leaves its allocation)
 * or QL_ENOTSUP (the driver cannot export it).
 */
static inline int ql_ze_export_ptr(ze_context_handle_t ctx, const void *ptr,
                                   size_t bytes, ql_ze_export *out) {
  ze_memory_allocation_properties_t ap = {
      .stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
  ze_device_properties_t dp = {.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
  ze_device_handle_t dev = NULL;
  ze_ipc_mem_handle_t h;
  void *base = NULL;
  size_t size = 0;
  uint64_t word;
  uintptr_t p = (uintptr_t)ptr, b;
  int at;

  if (out == NULL || ptr == NULL)
    return QL_EINVAL;
  memset(out, 0, sizeof *out);
  out->fd = -1;
  if (zeMemGetAllocProperties(ctx, ptr, &ap, &dev) != ZE_RESULT_SUCCESS ||
      ap.type != ZE_MEMORY_TYPE_DEVICE || dev == NULL ||
      zeDeviceGetProperties(dev, &dp) != ZE_RESULT_SUCCESS)
    return QL_EINVAL;
  if (zeMemGetAddressRange(ctx, ptr, &base, &size) != ZE_RESULT_SUCCESS)
    return QL_EINVAL;
  /* off <= size && len <= size - off, with off = ptr - base. */
  b = (uintptr_t)base;
  if (p < b || p - b > size || bytes > size - (p - b))
    return QL_EINVAL;
  if (zeMemGetIpcHandle(ctx, base, &h) != ZE_RESULT_SUCCESS)
    return QL_ENOTSUP;
  memcpy(&word, h.data, sizeof word);
  if (word > INT32_MAX)
    return QL_ENOTSUP; /* not a descriptor-carrying handle */
  out->fd = (int)word;
  memcpy(out->handle, h.data, sizeof out->handle);
  out->offset = (uint64_t)(p - b);
  out->alloc_size = (uint64_t)size;
  /* The UUID as 8-4-4-4-12 hex digits, as the daemon names the device. */
  at = snprintf(out->device, sizeof out->device, "ze:");
  for (int i = 0; i < 16; i++)
    at += snprintf(out->device + at, sizeof out->device - (size_t)at,
                   "%s%02x", i == 4 || i == 6 || i == 8 || i == 10 ? "-" : "",
                   (unsigned)dp.uuid.id[i]);
  return 0;
}

#endif /* QLINEAR_ZE_H */
