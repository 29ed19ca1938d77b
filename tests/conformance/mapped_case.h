/*
 * mapped_case.h - the conformance harness's mapped-mode case, for builds
 * with the CUDA backend (QL_CONFORMANCE_MAPPED): a linear_wo case run as
 * a mapped-mode client runs it (qlinear_mapped.h), on a read-only import
 * of the layout the backend exported, in this process.
 */
#ifndef QL_MAPPED_CASE_H
#define QL_MAPPED_CASE_H

#include <stdint.h>

#include "ql_kernels.h"
#include "qlinear/qlinear_mapped.h"
#include "registry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[m, n] = x[m, k]·Wᵀ (+ b) in dt through b->export_layout(packed),
 * ql__mapped_open_export and ql_linear_mapped on the current device, with
 * x and y in host memory (copied through device buffers). 0, QL_ENOTSUP
 * (b exports nothing, or not this layout), or another QL_E* code. */
int ql__conf_mapped_linear(const ql_backend *b, const void *packed,
                           const ql_qweight *q, ql_dtype dt, const void *x,
                           int64_t m, void *y);

#ifdef __cplusplus
}
#endif

#endif
