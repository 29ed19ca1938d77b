// cuda_call.cpp - libqlinear-cuda: call mode from device pointers
// (ql_cuda_call_slices, qlinear_mapped.h). A caller that holds only device
// pointers and a stream (PyTorch's tensors through the Python binding)
// gets the two ql_cuda_slice values that ql_linear_cuda() takes, with x's
// ready event recorded on its stream, without compiling qlinear_cuda.h
// against a CUDA runtime of its own.
//
// Built twice: against the real runtime into libqlinear-cuda, and against
// the emulated one (tests/integration/cuda_emu_include/) into the library
// the Python tests load, so the code the tests run is this file.
#include <stdint.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "qlinear/qlinear.h"
#include "qlinear/qlinear_cuda.h"
#include "qlinear/qlinear_mapped.h"

namespace {

// Devices a thread may record on; an ordinal past this is refused.
constexpr int kMaxDevices = 64;

// One interprocess event per thread and device, made on first use and
// recorded again for every call: the daemon opens the handle once per
// request and waits for the record it was sent with, which a later record
// by the same thread cannot precede (the call returns first). Per thread,
// so that two threads on two streams never move each other's record.
struct ThreadEvents {
  cudaEvent_t ev[kMaxDevices] = {};
  ~ThreadEvents() {
    for (cudaEvent_t e : ev)
      if (e != nullptr) (void)cudaEventDestroy(e);
    (void)cudaGetLastError();
  }
};
thread_local ThreadEvents tl_events;

// x's device ordinal, or -1 when p is not device memory.
int device_of(const void* p) {
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return a.type == cudaMemoryTypeDevice ? a.device : -1;
}

// Records this thread's event of device dev on stream, with dev current
// for the call and the caller's device restored after: *out is the event.
int record(int dev, void* stream, cudaEvent_t* out) {
  int old = 0, rv = QL_EDEVICE;
  if (dev < 0 || dev >= kMaxDevices) return QL_ENOTSUP;
  if (cudaGetDevice(&old) != cudaSuccess) goto fail;
  if (old != dev && cudaSetDevice(dev) != cudaSuccess) goto fail;
  if (tl_events.ev[dev] == nullptr &&
      cudaEventCreateWithFlags(&tl_events.ev[dev],
                               cudaEventInterprocess |
                                   cudaEventDisableTiming) != cudaSuccess) {
    tl_events.ev[dev] = nullptr;
    goto restore;
  }
  if (cudaEventRecord(tl_events.ev[dev],
                      static_cast<cudaStream_t>(stream)) != cudaSuccess)
    goto restore;
  *out = tl_events.ev[dev];
  rv = 0;
restore:
  if (old != dev) (void)cudaSetDevice(old);
fail:
  (void)cudaGetLastError();
  return rv;
}

}  // namespace

extern "C" QL_EXPORT int ql_cuda_call_slices(const void* x, size_t x_bytes,
                                             void* y, size_t y_bytes,
                                             void* stream, ql_cuda_slice* xs,
                                             ql_cuda_slice* ys) {
  if (x == nullptr || y == nullptr || xs == nullptr || ys == nullptr ||
      x_bytes == 0 || y_bytes == 0)
    return QL_EINVAL;
  const int dx = device_of(x), dy = device_of(y);
  if (dx < 0 || dy != dx) return QL_EINVAL;
  cudaEvent_t ev = nullptr;
  int rv = record(dx, stream, &ev);
  if (rv < 0) return rv;
  rv = ql_cuda_slice_from_ptr(xs, x, x_bytes, ev);
  if (rv < 0) return rv;
  rv = ql_cuda_slice_from_ptr(ys, y, y_bytes, nullptr);
  if (rv < 0) memset(xs, 0, sizeof *xs);
  return rv;
}
