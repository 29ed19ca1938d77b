/*
 * ipc.h - device memory that a client exports to the daemon by IPC handles
 * (DESIGN §7): each session's table of imported allocations.
 *
 * Two kinds share the table. CUDA IPC handles are plain bytes in requests
 * (ql__ipc_get below). Level Zero handles carry a dma-buf descriptor,
 * which only the session socket can pass: the client imports them
 * explicitly (ql__ipc_import) and names them by import id; the import owns
 * the daemon's descriptor and is never evicted, only released.
 *
 * A handle is opened once per session and device, at the first request
 * that names it, through the device backend's ipc_open, which also gives
 * the allocation's real base and size as the driver reports them: that
 * size bounds every slice a request takes from it, whatever the client
 * claims. Every request using an import holds a reference, so the mapping
 * stays while the request is queued or running; the session's own
 * reference goes when the session ends, when it releases an explicit
 * import, or (CUDA handles only) when its table is full and the import is
 * the least recently used one that no request holds. The last
 * reference closes the handle (ipc_close). Loop thread only.
 */
#ifndef QL_IPC_H
#define QL_IPC_H

#include <stddef.h>
#include <stdint.h>

#include "state/devices.h"
#include "ql_defs.h"

/* Imports one session keeps open at once. */
#define QL_SESSION_MAX_IPC 64

/* One imported allocation. */
typedef struct ql__ipc_mem {
  uint8_t handle[QL_CUDA_IPC_HANDLE_BYTES]; /* as the client sent it */
  size_t handle_len;
  uint64_t id;           /* an explicit import's id (never 0), else 0 */
  int fd;                /* its descriptor, closed with it; else -1 */
  const ql__device *dev; /* where it is mapped */
  uint64_t session;      /* the importing session, for logs */
  uint8_t *base;         /* device pointer to the allocation's first byte */
  uint64_t size;         /* the whole allocation, from the driver */
  int refs;              /* the table's (until dropped) + one per request */
  uint64_t last_use;     /* a counter of the table, for eviction */
  struct ql__ipc_mem *next; /* in its table */
} ql__ipc_mem;

typedef struct ql__ipc_table ql__ipc_table;

/*
 * The import of handle (len bytes) on device d in the table *t (made on
 * first use; session is the owner's number, for logs): found, or opened
 * now. No reference is taken for the caller. Opening one in a full table
 * lets go of the least recently used import that no request holds, but
 * never of keep (may be NULL): the import the caller got for the same
 * request's other tensor, which it holds no reference to yet. On failure
 * returns a QL_E*
 * code with err set (QL_EINVAL: a handle the device cannot open;
 * QL_ENOTSUP: d takes no imports; QL_EEXHAUSTED: the table is full of
 * imports that requests hold; QL_ENOMEM; QL_EDEVICE).
 */
int ql__ipc_get(ql__ipc_table **t, const ql__device *d, uint64_t session,
                const uint8_t *handle, size_t len, const ql__ipc_mem *keep,
                ql__ipc_mem **out, char *err, size_t errlen);

/*
 * An explicit import (Level Zero): opens handle (len bytes) with the
 * daemon's descriptor fd on device d through ipc_open_fd, under a new id,
 * unique for the daemon's lifetime. fd is taken over in every case (closed
 * now on failure, else with the import). No reference for the caller.
 * Errors as ql__ipc_get; QL_ENOTSUP also when d's driver has no memory
 * IPC, QL_EEXHAUSTED when the session has QL_SESSION_MAX_IPC imports
 * that cannot be let go.
 */
int ql__ipc_import(ql__ipc_table **t, const ql__device *d, uint64_t session,
                   const uint8_t *handle, size_t len, int fd,
                   ql__ipc_mem **out, char *err, size_t errlen);

/* The explicit import of that id in t, or NULL (another session's import
 * is not in t). No reference is taken. */
ql__ipc_mem *ql__ipc_find(ql__ipc_table *t, uint64_t id);

/* Drops the table's reference to explicit import id: requests still using
 * it keep it open until they end. QL_ENOTFOUND when t has no such one. */
int ql__ipc_release(ql__ipc_table *t, uint64_t id);

/* A request's reference; the last unref closes the handle. NULL is a
 * no-op for unref. */
void ql__ipc_ref(ql__ipc_mem *m);
void ql__ipc_unref(ql__ipc_mem *m);

/* Drops the table's references (the session ended) and frees it; imports
 * that requests still hold close with their last request. Returns how
 * many imports the table had. NULL is a no-op (0). */
size_t ql__ipc_table_free(ql__ipc_table *t);

#endif /* QL_IPC_H */
