// backend.cpp - the CUDA backend's registration (the one place that lists
// its implementations) and the host glue of its ops: argument checks as
// strict as the reference's, the "cuda-1" layout that repack builds, and
// the launches.
//
// Device memory. In this increment the backend is built only against the
// emulation (kernels/cuda/emu.h), where device memory is host memory: the
// helpers dev_alloc/dev_free/dev_copy below are plain host operations and
// the ops take the caller's pointers as they are. The real runtime (per-GPU
// workers, streams, staging, budgets) replaces exactly these helpers; until
// it exists the backend is linked into test programs only, never into
// qlineard (see kernels/backends.c and Makefile.am).
//
// Ops: repack and linear_wo for q4g, q8c, q8b and f8r; quantize_rows (int8
// with group sums, e4m3) for every activation dtype; linear_aq for q8c and
// q4g (f8r AQ is left to the generic one).
#include <stdlib.h>
#include <string.h>

#include "ql_cuda.h"
#include "registry.h"

namespace {

// ---- device memory (emulated build: host memory) ----

void* dev_alloc(size_t n) {
  // 256 bytes, as cudaMalloc aligns; the size is rounded up as
  // aligned_alloc requires.
  return aligned_alloc(256, (n + 255) & ~size_t(255));
}
void dev_free(void* p) { free(p); }
void dev_copy(void* dst, const void* src, size_t n) { memcpy(dst, src, n); }
void* const kStream = nullptr;  // the default stream
void dev_sync() {}              // launches complete before they return

bool mul_size(size_t a, size_t b, size_t* out) {
  if (a != 0 && b > SIZE_MAX / a) return false;
  *out = a * b;
  return true;
}
bool add_size(size_t a, size_t b, size_t* out) {
  if (b > SIZE_MAX - a) return false;
  *out = a + b;
  return true;
}
size_t round16(size_t n) { return (n + 15) & ~size_t(15); }

// ---- the layout ----

// A repacked weight: the kernels' view (dev, whose arrays point into mem)
// and what identifies the canonical weight it was made from.
struct packed {
  ql__cuda_wo dev;
  void* mem;     // one device allocation holding every array
  size_t bytes;  // its size
};

// True when p was made from a weight of w's shape and parameters.
bool packed_matches(const packed* p, const ql_qweight* w) {
  return p->dev.format == int(w->format) && p->dev.n == w->n &&
         p->dev.k == w->k && p->dev.groups == w->groups &&
         p->dev.gs == w->group_size && p->dev.sdt == int(w->scale_dtype) &&
         (p->dev.zero != nullptr) == (w->zero != nullptr) &&
         (p->dev.bias != nullptr) == (w->bias != nullptr);
}

void free_packed(void* pp) {
  packed* p = static_cast<packed*>(pp);
  if (p == nullptr) return;
  dev_free(p->mem);
  free(p);
}

// Builds the layout of ql_cuda.h for w: rows of codes padded to 16 bytes,
// scale and zero transposed from [G, N] to [N, G], bias copied.
int make_packed(const ql_qweight* w, packed** out) {
  size_t n, g, ssz, rb, ldq, q_bytes, s_bytes, b_bytes, off_s, off_z, off_b,
      total;
  packed* p = nullptr;
  unsigned char* mem;
  int rc;

  *out = nullptr;
  if ((rc = ql_qweight_check(w)) != 0) return rc;
  n = size_t(w->n);
  g = size_t(w->groups);
  ssz = ql_dtype_size(w->scale_dtype);
  rb = size_t(ql__cuda_row_bytes(int(w->format), w->k));
  ldq = round16(rb);
  if (!mul_size(n, ldq, &q_bytes) || !mul_size(n, g, &s_bytes) ||
      !mul_size(s_bytes, ssz, &s_bytes) ||
      !mul_size(n, sizeof(float), &b_bytes))
    return QL_ESHAPE;
  off_s = round16(q_bytes);
  if (!add_size(off_s, round16(s_bytes), &off_z) ||
      !add_size(off_z, w->zero != nullptr ? round16(s_bytes) : 0, &off_b) ||
      !add_size(off_b, w->bias != nullptr ? b_bytes : 0, &total) ||
      total > SIZE_MAX - 256)
    return QL_ESHAPE;

  if ((p = static_cast<packed*>(calloc(1, sizeof *p))) == nullptr)
    return QL_ENOMEM;
  if ((p->mem = dev_alloc(total)) == nullptr) {
    free(p);
    return QL_ENOMEM;
  }
  p->bytes = total;
  mem = static_cast<unsigned char*>(p->mem);

  // Rows of codes; the padding is zero (a zero code adds x·0).
  for (size_t r = 0; r < n; r++) {
    dev_copy(mem + r * ldq, w->qdata + r * rb, rb);
    memset(mem + r * ldq + rb, 0, ldq - rb);
  }
  // [G, N] -> [N, G], element by element in the stored dtype.
  const unsigned char* sc = static_cast<const unsigned char*>(w->scale);
  const unsigned char* zc = static_cast<const unsigned char*>(w->zero);
  for (size_t r = 0; r < n; r++)
    for (size_t j = 0; j < g; j++) {
      dev_copy(mem + off_s + (r * g + j) * ssz, sc + (j * n + r) * ssz, ssz);
      if (zc != nullptr)
        dev_copy(mem + off_z + (r * g + j) * ssz, zc + (j * n + r) * ssz, ssz);
    }
  if (w->bias != nullptr) dev_copy(mem + off_b, w->bias, b_bytes);

  p->dev.format = int(w->format);
  p->dev.sdt = int(w->scale_dtype);
  p->dev.n = w->n;
  p->dev.k = w->k;
  p->dev.groups = w->groups;
  p->dev.gs = w->group_size;
  p->dev.ldq = int64_t(ldq);
  p->dev.q = mem;
  p->dev.scale = mem + off_s;
  p->dev.zero = w->zero != nullptr ? mem + off_z : nullptr;
  p->dev.bias = w->bias != nullptr ? reinterpret_cast<float*>(mem + off_b)
                                   : nullptr;
  *out = p;
  return 0;
}

int repack(ql_repack_args* a) {
  packed* p;
  int rc;
  if (a == nullptr || a->w == nullptr) return QL_EINVAL;
  rc = make_packed(a->w, &p);
  a->packed = p;
  a->packed_bytes = rc == 0 ? p->bytes + sizeof *p : 0;
  return rc;
}

// ---- linear_wo ----

// The argument checks of kernels/reference.c op_args(), so that the CUDA
// ops fail where and how the generic ones do.
int linear_args(const ql_linear_args* a, size_t* mk) {
  size_t mn, bytes;
  int rc;
  if (a == nullptr || a->w == nullptr || a->x == nullptr || a->y == nullptr)
    return QL_EINVAL;
  if ((rc = ql_qweight_check(a->w)) != 0) return rc;
  if (ql_dtype_size(a->dt) == 0) return QL_EDTYPE;
  if (a->m < 1 || a->m > QL_DIM_MAX) return QL_ESHAPE;
  if (!mul_size(size_t(a->m), size_t(a->w->k), mk) ||
      !mul_size(*mk, sizeof(float), &bytes) ||
      !mul_size(size_t(a->m), size_t(a->w->n), &mn) ||
      !mul_size(mn, sizeof(float), &bytes))
    return QL_ESHAPE;
  return 0;
}

int run_wo(const ql_linear_args* a) {
  const packed* p;
  packed* tmp = nullptr;
  int* bad = nullptr;
  int rc, hbad = 0;
  size_t mk;

  if ((rc = linear_args(a, &mk)) != 0) return rc;
  if (a->packed != nullptr) {
    p = static_cast<const packed*>(a->packed);
    if (!packed_matches(p, a->w)) return QL_EINVAL;
  } else {  // a caller without a layout (none made at load): one for this call
    if ((rc = make_packed(a->w, &tmp)) != 0) return rc;
    p = tmp;
  }
  // NaN/Inf fail the call before y is written (DESIGN §4), as the
  // reference does: a pass over x first.
  rc = QL_ENOMEM;
  if ((bad = static_cast<int*>(dev_alloc(sizeof *bad))) == nullptr) goto fail;
  dev_copy(bad, &hbad, sizeof hbad);
  ql__cuda_check_finite(int(a->dt), a->x, int64_t(mk), bad, kStream);
  dev_sync();
  dev_copy(&hbad, bad, sizeof hbad);
  rc = QL_ENONFINITE;
  if (hbad) goto fail;
  ql__cuda_linear_wo(&p->dev, int(a->dt), a->x, a->m, a->y, kStream);
  dev_sync();
  rc = 0;
fail:
  dev_free(bad);
  free_packed(tmp);
  return rc;
}

// ---- quantize_rows ----

// The argument checks of ql_quantize_rows_i8_src / _e4m3_src and of
// ql_qrows_args (registry.h).
int qrows_args(const ql_qrows_args* a, ql_dtype* src, int64_t* groups) {
  size_t mk, mg;
  if (a == nullptr || a->x == nullptr || a->xq == nullptr || a->sx == nullptr)
    return QL_EINVAL;
  if (a->kind != QL_QROWS_I8 && a->kind != QL_QROWS_E4M3) return QL_EINVAL;
  if (a->kind == QL_QROWS_E4M3 && a->gsum != nullptr) return QL_EINVAL;
  if (a->kind == QL_QROWS_I8 && a->gs < 1) return QL_EINVAL;
  *src = int(a->src) == 0 ? QL_DTYPE_F32 : a->src;
  if (!ql_dtype_valid(int(*src))) return QL_EDTYPE;
  if (a->m < 1 || a->m > QL_DIM_MAX || a->k < 1 || a->k > QL_DIM_MAX)
    return QL_ESHAPE;
  *groups = a->kind == QL_QROWS_I8 ? (a->k + a->gs - 1) / a->gs : 1;
  if (!mul_size(size_t(a->m), size_t(a->k), &mk) ||
      !mul_size(size_t(a->m), size_t(*groups), &mg))
    return QL_ESHAPE;
  if (a->gsum != nullptr &&
      (int64_t(a->gs) < a->k ? int64_t(a->gs) : a->k) > QL_QROWS_MAX_GROUP)
    return QL_ESHAPE;
  return 0;
}

int run_qrows(const ql_qrows_args* a) {
  int64_t groups, *status = nullptr, *hs = nullptr;
  size_t sbytes;
  ql_dtype src;
  int rc;

  if ((rc = qrows_args(a, &src, &groups)) != 0) return rc;
  sbytes = size_t(a->m) * sizeof(int64_t);
  rc = QL_ENOMEM;
  if ((status = static_cast<int64_t*>(dev_alloc(sbytes))) == nullptr ||
      (hs = static_cast<int64_t*>(malloc(sbytes))) == nullptr)
    goto fail;
  ql__cuda_quantize_rows(
      a->kind == QL_QROWS_I8 ? QL__CUDA_QROWS_I8 : QL__CUDA_QROWS_E4M3,
      int(src), a->x, a->m, a->k, a->kind == QL_QROWS_I8 ? int64_t(a->gs) : a->k,
      a->xq, a->sx, a->gsum, status, kStream);
  dev_sync();
  dev_copy(hs, status, sbytes);
  // The first row in order that the reference would refuse decides, and in
  // it the first value: what ql_quantize_rows_*_src return.
  rc = 0;
  for (int64_t r = 0; r < a->m && rc == 0; r++)
    if (hs[r] != 0) rc = (hs[r] & 3) == 1 ? QL_ENONFINITE : QL_EINVAL;
fail:
  dev_free(status);
  free(hs);
  return rc;
}

// ---- linear_aq ----

// W8A8 (q8c) and W4A8 (q4g): the rows of x widened to f32, quantized on the
// device with the int8 rule of ql_quantize_rows_i8_src in the activation
// dtype (gs = the weight's group, with the group sums, for q4g; K, without,
// for q8c), then the tensor-core kernel of linear_aq.cu.

// q8c sums all of K in int32 and declines K past the bound, as the generic
// AQ does. q4g sums in int32 only inside a group (gs <= 256, so |Σ xq·q| <=
// 256·128·8 = 2^18 and |Σ xq| <= 2^15) and in f32 across groups: any K.
int aq_supports(const ql_kernel_impl* im, ql_format f, int64_t m, int64_t n,
                int64_t k) {
  (void)im;
  (void)m;
  (void)n;
  return f != QL_FORMAT_Q8C || k <= QL_AQ_Q8C_MAX_K;
}

int run_aq(const ql_linear_args* a) {
  const packed* p;
  packed* tmp = nullptr;
  int* bad = nullptr;
  float *xf = nullptr, *sx = nullptr;
  int8_t* xq = nullptr;
  int32_t* gsum = nullptr;
  int64_t *status = nullptr, *hs = nullptr;
  int rc, hbad = 0, q4g;
  size_t mk, sbytes;

  if ((rc = linear_args(a, &mk)) != 0) return rc;
  q4g = a->w->format == QL_FORMAT_Q4G;
  if (!q4g && a->w->format != QL_FORMAT_Q8C) return QL_ENOTSUP;
  if (!q4g && a->w->k > QL_AQ_Q8C_MAX_K) return QL_ESHAPE;
  if (a->packed != nullptr) {
    p = static_cast<const packed*>(a->packed);
    if (!packed_matches(p, a->w)) return QL_EINVAL;
  } else {  // a caller without a layout (none made at load): one for this call
    if ((rc = make_packed(a->w, &tmp)) != 0) return rc;
    p = tmp;
  }
  // NaN/Inf fail the call before y is written, as in run_wo.
  rc = QL_ENOMEM;
  if ((bad = static_cast<int*>(dev_alloc(sizeof *bad))) == nullptr) goto fail;
  dev_copy(bad, &hbad, sizeof hbad);
  ql__cuda_check_finite(int(a->dt), a->x, int64_t(mk), bad, kStream);
  dev_sync();
  dev_copy(&hbad, bad, sizeof hbad);
  rc = QL_ENONFINITE;
  if (hbad) goto fail;

  // Sizes: mk·4 was checked by linear_args, and m·G <= m·K.
  sbytes = size_t(a->m) * sizeof(int64_t);
  rc = QL_ENOMEM;
  if ((a->dt != QL_DTYPE_F32 &&
       (xf = static_cast<float*>(dev_alloc(mk * sizeof(float)))) == nullptr) ||
      (xq = static_cast<int8_t*>(dev_alloc(mk))) == nullptr ||
      (sx = static_cast<float*>(dev_alloc(size_t(a->m) * sizeof(float)))) ==
          nullptr ||
      (q4g && (gsum = static_cast<int32_t*>(dev_alloc(
                   size_t(a->m) * size_t(a->w->groups) * sizeof(int32_t)))) ==
                  nullptr) ||
      (status = static_cast<int64_t*>(dev_alloc(sbytes))) == nullptr ||
      (hs = static_cast<int64_t*>(malloc(sbytes))) == nullptr)
    goto fail;
  if (xf != nullptr)
    ql__cuda_widen_f32(int(a->dt), a->x, int64_t(mk), xf, kStream);
  ql__cuda_quantize_rows(
      QL__CUDA_QROWS_I8, int(a->dt),
      xf != nullptr ? xf : static_cast<const float*>(a->x), a->m, a->w->k,
      q4g ? int64_t(a->w->group_size) : a->w->k, xq, sx, gsum, status,
      kStream);
  dev_sync();
  dev_copy(hs, status, sbytes);
  // As run_qrows: the first row the reference would refuse decides.
  rc = 0;
  for (int64_t r = 0; r < a->m && rc == 0; r++)
    if (hs[r] != 0) rc = (hs[r] & 3) == 1 ? QL_ENONFINITE : QL_EINVAL;
  if (rc != 0) goto fail;
  ql__cuda_linear_aq(&p->dev, xq, sx, gsum, a->m, int(a->dt), a->y, kStream);
  dev_sync();
fail:
  dev_free(bad);
  dev_free(xf);
  dev_free(xq);
  dev_free(sx);
  dev_free(gsum);
  dev_free(status);
  free(hs);
  free_packed(tmp);
  return rc;
}

#define FMTS_WO                                            \
  (QL_FMT_BIT(QL_FORMAT_Q4G) | QL_FMT_BIT(QL_FORMAT_Q8C) | \
   QL_FMT_BIT(QL_FORMAT_Q8B) | QL_FMT_BIT(QL_FORMAT_F8R))
#define FMTS_QROWS                                         \
  (QL_FMT_BIT(QL_FORMAT_Q4G) | QL_FMT_BIT(QL_FORMAT_Q8C) | \
   QL_FMT_BIT(QL_FORMAT_F8R))

ql_kernel_impl impl(const char* name, ql_op op, uint32_t formats) {
  ql_kernel_impl im;
  memset(&im, 0, sizeof im);
  im.name = name;
  im.op = op;
  im.formats = formats;
  im.dtypes = QL_ALL_DTYPES;
  return im;
}

struct table {
  ql_kernel_impl im[4];
  table() {
    im[0] = impl("cuda.repack", QL_OP_REPACK, FMTS_WO);
    im[0].fn.repack = repack;
    im[0].free_packed = free_packed;
    im[1] = impl("cuda.linear_wo", QL_OP_LINEAR_WO, FMTS_WO);
    im[1].fn.linear = run_wo;
    im[2] = impl("cuda.quantize_rows", QL_OP_QUANTIZE_ROWS, FMTS_QROWS);
    im[2].fn.quantize_rows = run_qrows;
    im[3] = impl("cuda.linear_aq", QL_OP_LINEAR_AQ,
                 QL_FMT_BIT(QL_FORMAT_Q4G) | QL_FMT_BIT(QL_FORMAT_Q8C));
    im[3].supports = aq_supports;
    im[3].fn.linear = run_aq;
  }
};
const table impls;

}  // namespace

extern "C" const ql_backend ql__backend_cuda = {
    "cuda", impls.im, sizeof impls.im / sizeof impls.im[0], nullptr};
