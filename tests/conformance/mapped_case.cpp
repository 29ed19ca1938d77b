// mapped_case.cpp - mapped_case.h: the conformance harness's mapped-mode
// case, on the CUDA runtime (or its emulation, QL_CUDA_EMU).
#include <unistd.h>

#ifdef QL_CUDA_EMU
#include "emu_runtime.h"
#else
#include <cuda_runtime_api.h>
#endif

#include "mapped_case.h"
#include "mapped_export.h"

int ql__conf_mapped_linear(const ql_backend* b, const void* packed,
                           const ql_qweight* q, ql_dtype dt, const void* x,
                           int64_t m, void* y) {
  ql_layout_export ex;
  ql_mapped* h = nullptr;
  void *dx = nullptr, *dy = nullptr;
  int rc, dev = 0;
  const size_t esz = ql_dtype_size(int(dt));
  const size_t xb = size_t(m * q->k) * esz, yb = size_t(m * q->n) * esz;

  if (b->export_layout == nullptr) return QL_ENOTSUP;
  if ((rc = b->export_layout(packed, &ex)) != 0) return rc;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    close(ex.fd);
    return QL_EDEVICE;
  }
  rc = ql__mapped_open_export(&ex, q, dev, dt, m, &h);
  close(ex.fd);  // the mapping holds the allocation now
  if (rc != 0) return rc;
  if (cudaMalloc(&dx, xb) != cudaSuccess || cudaMalloc(&dy, yb) != cudaSuccess ||
      cudaMemcpy(dx, x, xb, cudaMemcpyHostToDevice) != cudaSuccess)
    rc = QL_EDEVICE;
  else if ((rc = ql_linear_mapped(h, dx, dy, m, nullptr)) == 0 &&
           (cudaStreamSynchronize(nullptr) != cudaSuccess ||
            cudaMemcpy(y, dy, yb, cudaMemcpyDeviceToHost) != cudaSuccess))
    rc = QL_EDEVICE;
  (void)cudaFree(dx);
  (void)cudaFree(dy);
  (void)cudaGetLastError();
  ql_mapped_close(h);
  return rc;
}
