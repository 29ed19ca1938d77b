// mapped.cpp - libqlinear-cuda: mapped mode (qlinear_mapped.h). The daemon
// hands over its layout's allocation (ql_map_weight); this maps it into
// the caller's context with vmm.h and launches the daemon's weight-only
// kernel (ql_cuda.h) on the caller's stream.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef QL_CUDA_EMU
#include "emu_runtime.h"
#else
#include <cuda_runtime_api.h>
#endif

#include "ql_cuda.h"
#include "qlinear/qlinear.h"
#include "mapped_export.h"
#include "qlinear/qlinear_mapped.h"
#include "vmm.h"

struct ql_mapped {
  ql__vmm_mem vm;      // the mapping of the daemon's allocation
  ql__cuda_wo view;    // the kernels' view of the layout inside it
  int dt;              // ql_dtype of x and y
  int64_t max_rows;
  float* scratch;      // ql__cuda_linear_wo_scratch(view, max_rows) bytes
  int ordinal;         // this process's number of the device
};

namespace {

// This process's ordinal of the device the daemon calls name, or -1.
int find_device(const char* name) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  for (int o = 0; o < n; o++) {
    cudaDeviceProp p;
    char buf[64];
    if (cudaGetDeviceProperties(&p, o) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    ql__cuda_device_name(reinterpret_cast<const unsigned char*>(p.uuid.bytes),
                         buf, sizeof buf);
    if (strcmp(buf, name) == 0) return o;
  }
  return -1;
}

bool fits(uint64_t off, uint64_t bytes, uint64_t size) {
  return off <= size && bytes <= size - off && off % 16 == 0;
}

// True when the daemon's description of the layout lies inside its
// allocation and is what the kernels can read: every array in bounds and
// aligned, rows of codes at least as long as a row of K codes.
bool layout_ok(const ql_weight_map& w) {
  const size_t ssz = ql_dtype_size(int(w.scale_dtype));
  if (strcmp(w.layout, "cuda-1") != 0 || ssz == 0 ||
      !ql_format_valid(int(w.format)) || w.n > (uint64_t(1) << 31) ||
      w.k > (uint64_t(1) << 31) || w.ldq % 16 != 0 ||
      w.ldq < uint64_t(ql__cuda_row_bytes(int(w.format), int64_t(w.k))) ||
      w.ldq > (uint64_t(1) << 32) || w.groups > w.k)
    return false;
  const uint64_t gs = w.group_size;
  if (w.format == QL_FORMAT_Q4G || w.format == QL_FORMAT_Q8B) {
    if (gs == 0 || w.groups != (w.k + gs - 1) / gs) return false;
  } else if (w.groups != 1) {
    return false;
  }
  uint64_t sbytes, qbytes;
  if (__builtin_mul_overflow(w.n, w.groups, &sbytes) ||
      __builtin_mul_overflow(sbytes, uint64_t(ssz), &sbytes) ||
      __builtin_mul_overflow(w.n, w.ldq, &qbytes))
    return false;
  return fits(w.q_offset, qbytes, w.size) &&
         fits(w.scale_offset, sbytes, w.size) &&
         (w.zero_offset == UINT64_MAX ||
          fits(w.zero_offset, sbytes, w.size)) &&
         (w.bias_offset == UINT64_MAX ||
          fits(w.bias_offset, w.n * sizeof(float), w.size));
}

void free_mapped(ql_mapped* h) {
  if (h == nullptr) return;
  // Only another device is made current and back: making one current
  // creates its context.
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess) cur = -1;
  if (cur != h->ordinal) (void)cudaSetDevice(h->ordinal);
  if (h->scratch != nullptr) (void)cudaFree(h->scratch);
  ql__vmm_free(&h->vm);
  if (cur >= 0 && cur != h->ordinal) (void)cudaSetDevice(cur);
  (void)cudaGetLastError();
  free(h);
}


// Maps the allocation w describes (w.fd, which stays the caller's) on this
// process's device o and builds the kernels' view of the layout in it,
// with scratch for max_rows rows: ql_mapped_open's work after the daemon's
// answer, checked (layout_ok) by the caller.
int open_map(const ql_weight_map& w, int o, ql_dtype dt, int64_t max_rows,
             ql_mapped** out) {
  ql_mapped* h = nullptr;
  int rc, cur = -1;
  bool moved = false;  // o made current here: made cur again at the end
  size_t sb;

  if ((h = static_cast<ql_mapped*>(calloc(1, sizeof *h))) == nullptr)
    return QL_ENOMEM;
  h->ordinal = o;
  if (cudaGetDevice(&cur) != cudaSuccess) cur = -1;
  if (cur != o) {
    if (cudaSetDevice(o) != cudaSuccess) {
      (void)cudaGetLastError();
      rc = QL_EDEVICE;
      goto fail;
    }
    moved = cur >= 0;
  }
  // Read-only first; read-write only where the daemon says the driver
  // cannot do better and its admin allows it.
  rc = ql__vmm_import(o, w.fd, size_t(w.size), 0, &h->vm);
  if (rc == QL_ENOTSUP && w.writable)
    rc = ql__vmm_import(o, w.fd, size_t(w.size), 1, &h->vm);
  if (rc != 0) goto fail;
  {
    unsigned char* base = static_cast<unsigned char*>(h->vm.base);
    ql__cuda_wo& v = h->view;
    v.format = int(w.format);
    v.sdt = int(w.scale_dtype);
    v.n = int64_t(w.n);
    v.k = int64_t(w.k);
    v.groups = int64_t(w.groups);
    v.gs = w.group_size;
    v.ldq = int64_t(w.ldq);
    v.q = base + w.q_offset;
    v.scale = base + w.scale_offset;
    v.zero = w.zero_offset != UINT64_MAX ? base + w.zero_offset : nullptr;
    v.bias = w.bias_offset != UINT64_MAX
                 ? reinterpret_cast<const float*>(base + w.bias_offset)
                 : nullptr;
    // The daemon's count sizes the grid as it does for its own launches
    // (the same device); 0 would also work.
    v.sms = int(w.sms);
  }
  h->dt = int(dt);
  h->max_rows = max_rows;
  sb = ql__cuda_linear_wo_scratch(&h->view, max_rows);
  if (sb > 0 && cudaMalloc(reinterpret_cast<void**>(&h->scratch), sb) !=
                    cudaSuccess) {
    (void)cudaGetLastError();
    h->scratch = nullptr;
    rc = QL_ENOMEM;
    goto fail;
  }
  if (moved) (void)cudaSetDevice(cur);
  *out = h;
  return 0;
fail:
  free_mapped(h);
  if (moved) (void)cudaSetDevice(cur);
  (void)cudaGetLastError();
  return rc;
}

bool args_ok(ql_dtype dt, int64_t max_rows) {
  return max_rows >= 1 && max_rows <= QL_MAPPED_MAX_ROWS &&
         (dt == QL_DTYPE_F32 || dt == QL_DTYPE_F16 || dt == QL_DTYPE_BF16);
}

}  // namespace

QL_EXPORT int ql_mapped_open(ql_client* c, const char* weight,
                             const char* device, ql_dtype dt,
                             int64_t max_rows, ql_mapped** out) {
  ql_weight_map w;
  int rc, o;

  if (out != nullptr) *out = nullptr;
  if (c == nullptr || weight == nullptr || out == nullptr ||
      !args_ok(dt, max_rows))
    return QL_EINVAL;
  if ((rc = ql_map_weight(c, weight, device, &w)) != 0) return rc;
  if (strcmp(w.layout, "cuda-1") != 0)
    rc = QL_ENOTSUP;
  else if (!layout_ok(w))
    rc = QL_EINVAL;
  else if ((o = find_device(w.device)) < 0)
    rc = QL_ENOTFOUND;
  else
    rc = open_map(w, o, dt, max_rows, out);
  close(w.fd);
  return rc;
}

int ql__mapped_open_export(const ql_layout_export* ex, const ql_qweight* q,
                           int ordinal, ql_dtype dt, int64_t max_rows,
                           ql_mapped** out) {
  ql_weight_map w;
  if (out != nullptr) *out = nullptr;
  if (ex == nullptr || q == nullptr || out == nullptr ||
      !args_ok(dt, max_rows) || ex->layout == nullptr ||
      strlen(ex->layout) >= sizeof w.layout)
    return QL_EINVAL;
  memset(&w, 0, sizeof w);
  w.fd = ex->fd;
  w.size = ex->size;
  strcpy(w.layout, ex->layout);
  w.format = q->format;
  w.scale_dtype = ql_dtype(ex->scale_dtype);
  w.n = uint64_t(q->n);
  w.k = uint64_t(q->k);
  w.groups = uint64_t(q->groups);
  w.group_size = q->group_size;
  w.ldq = uint64_t(ex->ldq);
  w.q_offset = ex->q_offset;
  w.scale_offset = ex->scale_offset;
  w.zero_offset = ex->zero_offset;
  w.bias_offset = ex->bias_offset;
  w.sms = ex->sms;
  w.writable = !ex->readonly;
  if (strcmp(w.layout, "cuda-1") != 0) return QL_ENOTSUP;
  if (!layout_ok(w)) return QL_EINVAL;
  return open_map(w, ordinal, dt, max_rows, out);
}

QL_EXPORT int ql_linear_mapped(ql_mapped* h, const void* x, void* y,
                               int64_t m, void* stream) {
  int cur = -1;
  if (h == nullptr || x == nullptr || y == nullptr || m < 1 ||
      m > h->max_rows)
    return QL_EINVAL;
  // The stream is the caller's, of the weight's device: launch with that
  // device current (cheap, and allowed while a graph is being captured).
  if (cudaGetDevice(&cur) != cudaSuccess) {
    (void)cudaGetLastError();
    return QL_EDEVICE;
  }
  if (cur != h->ordinal && cudaSetDevice(h->ordinal) != cudaSuccess) {
    (void)cudaGetLastError();
    return QL_EDEVICE;
  }
  // The kernel the daemon's backend runs (the same QL_CUDA_WO_KERNEL), so
  // that a mapped call gives the daemon's bytes.
  ql__cuda_linear_wo(&h->view, ql__cuda_wo_kernel(), h->dt, x, m, y,
                     h->scratch, stream);
  cudaError_t e = cudaGetLastError();
  if (cur != h->ordinal) (void)cudaSetDevice(cur);
  return e == cudaSuccess ? 0 : QL_EDEVICE;
}

QL_EXPORT void ql_mapped_shape(const ql_mapped* h, uint64_t* n, uint64_t* k) {
  if (n != nullptr) *n = h != nullptr ? uint64_t(h->view.n) : 0;
  if (k != nullptr) *k = h != nullptr ? uint64_t(h->view.k) : 0;
}

QL_EXPORT void ql_mapped_close(ql_mapped* h) { free_mapped(h); }
