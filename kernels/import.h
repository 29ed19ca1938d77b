/*
 * import.h - building a canonical weight from packed arrays a client or a
 * file supplies (TorchAO's canonical packed tensors, or the integer zero
 * point int4 form), with every array's dtype, shape and size checked
 * against the declared format before a byte of it is used.
 *
 * This is a parser of untrusted input: it never asserts, never reads past
 * an array's stated size, and names the offending array in its error.
 */
#ifndef QL_IMPORT_H
#define QL_IMPORT_H

#include <stddef.h>
#include <stdint.h>

#include "ql_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One array as supplied: borrowed, row-major. data == NULL means absent. */
typedef struct ql_array {
  const void *data;
  size_t bytes;    /* bytes available at data */
  int dtype;       /* a ql_array_dtype of ql_defs.h (checked) */
  int ndim;        /* 1 or 2 */
  int64_t shape[2];
} ql_array;

typedef struct ql_import_desc {
  ql_format format;
  uint32_t group_size; /* q4g group / q8b block; ignored for q8c, f8r */
  int64_t n, k;
  int asymmetric;      /* q8b: 1 when zero is given */
  ql_zero_kind zero_kind;
  ql_array qdata, scale, zero, bias;
} ql_import_desc;

/*
 * Validates d and builds the canonical weight: arrays are copied (the
 * caller's buffers may go away), the bias is widened to f32, and scales
 * and zeros keep the dtype they came in (f32, f16 or bf16) - except in the
 * integer zero point int4 form (QL_ZERO_INT), which is converted to the
 * float zero point (q = u - 8, zero = (8 - zp)·scale) with scale and zero
 * both stored in f32 whatever the scale's dtype: for a bf16/f16 scale,
 * zero is then exact and the weight dequantizes bit for bit as TorchAO's
 * (u - zp)·scale (see import.c). Non-finite scales, zeros or bias fail with
 * QL_ENONFINITE. On failure returns QL_EINVAL/QL_EFORMAT/QL_ESHAPE/
 * QL_EDTYPE/QL_ENONFINITE/QL_ENOMEM and writes a message naming the array
 * to err (if not NULL); on success *out is a new weight the caller owns.
 */
int ql_qweight_import(const ql_import_desc *d, ql_qweight **out, char *err,
                      size_t errlen);

/*
 * The same checks, but the weight borrows d's arrays instead of copying
 * them (ql_qweight.borrowed): for arrays already in the canonical form
 * (float zero point, qdata u8/i8 or e4m3 bytes, bias f32), each aligned to
 * its element size. Anything else is QL_ENOTSUP before any check (the
 * caller imports with a copy). The arrays must outlive the weight and are
 * never written through it; the caller sets (*out)->release and ->backing
 * when freeing the weight should release them.
 */
int ql_qweight_import_borrowed(const ql_import_desc *d, ql_qweight **out,
                               char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* QL_IMPORT_H */
