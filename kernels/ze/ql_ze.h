/*
 * ql_ze.h - what the ze kernels (the .cl files of kernels/ze/, OpenCL C)
 * and their host code share: the numbering of dtypes and formats, the launch geometry the
 * kernels are written for, the device layout "ze-1", and the status words
 * of quantize_rows. Plain #defines only, so that it is valid OpenCL C 1.2
 * and C11 alike; the host side checks the numbers against ql_defs.h with
 * static assertions (backend.c), so they are defined once in effect.
 *
 * Kernels and their arguments (all integers are OpenCL long/int, pointers
 * are __global; a pointer documented as nullable may be NULL):
 *
 *   ql_ze_quantize_rows(int kind, int xdt, int src, long k, long gs,
 *                       long groups, x, xq, sx, gsum (nullable), status)
 *     one work-group of QL_ZE_QWG work-items per row of x [m, k] (dtype
 *     xdt; src is the dtype whose rule is applied, ql_kernels.h). kind:
 *     QL_ZE_QROWS_I8 or _E4M3. status[row]: 0, or the first offending
 *     value of the row as (index << 2) | QL_ZE_ST_*.
 *   ql_ze_check_finite(int xdt, long count, x, int *bad)
 *     sets *bad to 1 when one of count values of x is NaN or ±Inf.
 *   ql_ze_wo_<fmt>(long n, long k, long gs, long groups, int xdt, int sdt,
 *                  q, long ldq, scale, zero (nullable), bias (nullable),
 *                  x, long m, y)      fmt: q4g, q8c, q8b, f8r
 *   ql_ze_aq_q8c(long n, long k, int xdt, int sdt, q, long ldq, scale,
 *                bias (nullable), xq, sx, long m, y)
 *   ql_ze_aq_q4g(long n, long k, long gs, long groups, int xdt, int sdt, q,
 *                long ldq, scale, zero, bias (nullable), xq, sx, gsum,
 *                long m, y)
 *     a 2-D range: dimension 0 has ceil(n / QL_ZE_NG) work-groups of
 *     QL_ZE_WG work-items, dimension 1 ceil(m / QL_ZE_MT) work-groups of 1.
 *     x, y [m, k], [m, n] in dtype xdt; xq, sx, gsum as quantize_rows
 *     wrote them.
 */
#ifndef QL_ZE_H
#define QL_ZE_H

/* ql_dtype and ql_format values (proto/ql_defs.h). */
#define QL_ZE_DT_F32 1
#define QL_ZE_DT_F16 2
#define QL_ZE_DT_BF16 3
#define QL_ZE_FMT_Q4G 1
#define QL_ZE_FMT_Q8C 2
#define QL_ZE_FMT_Q8B 3
#define QL_ZE_FMT_F8R 4

/*
 * Launch geometry of the linear kernels. A lane group of QL_ZE_LG
 * work-items computes one output row n of W for QL_ZE_MT rows of x; a
 * work-group holds QL_ZE_NG lane groups (QL_ZE_WG work-items). On a device
 * with Intel sub-groups a lane group is one sub-group of exactly QL_ZE_LG
 * (intel_reqd_sub_group_size) and lanes exchange values by sub-group
 * broadcasts; elsewhere it is a slice of the work-group that exchanges
 * them through local memory. Both give the same bytes: see common.clh.
 */
#define QL_ZE_LG 16
#define QL_ZE_NG 4
#define QL_ZE_WG (QL_ZE_LG * QL_ZE_NG)
#define QL_ZE_MT 4

/* K segment of one lane's partial sum for the formats without groups
 * (q8c, f8r); q4g and q8b use their group (block). */
#define QL_ZE_SEG 64

/* Work-items of a quantize_rows work-group (one row each). */
#define QL_ZE_QWG 64

/* Layout "ze-1": rows of codes start QL_ZE_ROW_ALIGN-byte aligned and are
 * zero-padded to a multiple of it (ldq bytes apart); scale and zero are
 * [n, groups] in their dtype (a lane group reads its own row's groups
 * contiguously); bias [n] f32. */
#define QL_ZE_ROW_ALIGN 16

/* quantize_rows. */
#define QL_ZE_QROWS_I8 1
#define QL_ZE_QROWS_E4M3 2
#define QL_ZE_ST_NONFINITE 1 /* NaN or ±Inf */
#define QL_ZE_ST_INEXACT 2   /* a value the source dtype cannot hold */

/* The numeric constants of the quantization rules (ql_kernels.h). */
#define QL_ZE_I8_SCALE_EPS 0x1p-23f
#define QL_ZE_E4M3_MAX 448.0f
#define QL_ZE_F8_AMAX_LB 1e-12f
#define QL_ZE_F8_F16_SCALE_MIN 0x1p-24f

#endif /* QL_ZE_H */
