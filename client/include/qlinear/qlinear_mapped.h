/*
 * qlinear_mapped.h - libqlinear-cuda: mapped mode (run qlinear's GPU
 * kernels in this process, on the daemon's resident copy of a weight), and
 * ql_cuda_call_slices() for call mode from device pointers (at the end).
 *
 * A call to another process costs a round trip of tens of microseconds
 * and cannot be captured in a CUDA graph, while a decode linear takes a
 * few. So a GPU client can map the daemon's layout of a weight it holds
 * (read-only, into its own CUDA context) and launch the same weight-only
 * kernel as the daemon on its own stream: one resident copy serves every
 * process, and each call costs what the kernel costs.
 *
 *   ql_mapped *h;
 *   ql_hold(c, "layer0.q", NULL, NULL);            // or load it
 *   ql_mapped_open(c, "layer0.q", NULL, QL_DTYPE_BF16, 16, &h);
 *   ql_linear_mapped(h, x_dev, y_dev, m, stream);  // capturable
 *   ...
 *   ql_mapped_close(h);
 *
 * The daemon keeps the layout resident while this client's session lives,
 * whatever happens to the weight's name: an unload or a replace takes the
 * name at once, and the old layout goes when the last session that mapped
 * it ends. Keep the ql_client open as long as a mapping is in use. The
 * daemon's mapped_mode says whose sessions may map (by default those of
 * its own user): the mapping is read-only here, but the driver would let
 * a hostile client make its own mapping writable.
 *
 * libqlinear-cuda links the CUDA runtime statically and reaches the
 * driver through it (libcuda is not linked); x, y and stream belong to the
 * caller's CUDA context on the weight's device (the primary context, which
 * every runtime in the process shares, e.g. PyTorch's).
 */
#ifndef QLINEAR_MAPPED_H
#define QLINEAR_MAPPED_H

#include <stdint.h>

#include "qlinear.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most rows of x one ql_linear_mapped() call may take, whatever
 * max_rows asks (scratch grows with it). */
#define QL_MAPPED_MAX_ROWS 4096

/* A weight mapped into this process. */
typedef struct ql_mapped ql_mapped;

/*
 * Maps weight (held by c's session) on device (a daemon device name or
 * alias; NULL: the weight's first GPU) into this process, for calls with
 * activations of dtype dt (F32, F16, BF16) of up to max_rows rows
 * (1 .. QL_MAPPED_MAX_ROWS). Allocates the scratch those calls need, once,
 * here. The device must be one of this process's CUDA devices (matched by
 * UUID, so CUDA_VISIBLE_DEVICES may renumber it). Errors: those of
 * ql_map_weight(); QL_EINVAL (bad arguments, a layout that does not add
 * up, a descriptor the driver does not take); QL_ENOTFOUND (the device is
 * not visible to this process); QL_ENOTSUP (not a layout this library
 * reads, or the driver cannot map it read-only and the daemon does not
 * allow read-write); QL_ENOMEM; QL_EDEVICE. The calling thread's current
 * CUDA device is left as it was. On success *out is the caller's.
 */
QL_EXPORT int ql_mapped_open(ql_client *c, const char *weight,
                             const char *device, ql_dtype dt,
                             int64_t max_rows, ql_mapped **out);

/*
 * y[m, n] = x[m, k]·Wᵀ (+ bias) on stream (a cudaStream_t; NULL: the
 * legacy default stream), with the weight-only kernel the daemon runs for
 * such a batch, giving the same bytes. x and y are device memory of the
 * weight's device, in the dtype of ql_mapped_open, and must not overlap.
 * Enqueues one launch and returns: no host synchronisation and no
 * allocation, so it can be captured in a CUDA graph. x must hold finite
 * values (the daemon refuses others; here nothing can be checked without
 * a synchronisation, so a NaN or Inf gives an undefined y). QL_EINVAL for
 * m outside 1 .. max_rows or a NULL pointer; QL_EDEVICE when the runtime
 * refused the launch.
 */
QL_EXPORT int ql_linear_mapped(ql_mapped *h, const void *x, void *y,
                               int64_t m, void *stream);

/* The weight's out_features (*n) and in_features (*k); either may be
 * NULL. */
QL_EXPORT void ql_mapped_shape(const ql_mapped *h, uint64_t *n, uint64_t *k);

/*
 * Unmaps the weight and frees the scratch. The caller makes sure no
 * launch of it is still in flight (synchronise its stream first); a CUDA
 * graph that captured it must not run again. NULL is a no-op.
 */
QL_EXPORT void ql_mapped_close(ql_mapped *h);

/*
 * Call mode from device pointers, for callers that do not compile
 * <qlinear/qlinear_cuda.h> against a runtime of their own (the Python
 * binding): fills *xs and *ys, for ql_linear_cuda(), with the x_bytes at x
 * and the y_bytes at y, and records on stream (a cudaStream_t of their
 * device; NULL: its legacy default stream) an interprocess event that *xs
 * names as x's ready event, so the daemon reads x after the work queued
 * before. The event is this thread's, one per device, recorded again by
 * the thread's next call: make the ql_linear_cuda() call before that.
 * Leaves the calling thread's current device as it was. Returns 0;
 * QL_EINVAL (a NULL or empty argument, memory that is not device memory,
 * x and y on two devices, a range that leaves its allocation); QL_ENOTSUP
 * (the runtime cannot export the memory: e.g. PyTorch's expandable
 * segments); QL_EDEVICE (the event could not be made or recorded).
 */
QL_EXPORT int ql_cuda_call_slices(const void *x, size_t x_bytes, void *y,
                                  size_t y_bytes, void *stream,
                                  ql_cuda_slice *xs, ql_cuda_slice *ys);

#ifdef __cplusplus
}
#endif
#endif /* QLINEAR_MAPPED_H */
