/*
 * linear_wo.cl - weight-only linear, y[m, n] = Σk x[m, k]·dequant(W)[n, k]
 * (+ b[n]), for q4g, q8c, q8b and f8r weights in layout "ze-1" (ql_ze.h)
 * and f32/f16/bf16 activations.
 *
 * A lane group computes one row n of W for up to QL_ZE_MT rows of x. K is
 * cut into segments (q4g, q8b: the format's group or block; q8c, f8r:
 * QL_ZE_SEG values); lane j owns segments j, j + QL_ZE_LG, ..., sums each
 * one alone in increasing k, and combine() adds the segments' terms in
 * increasing segment order. So every output is the same sequence of IEEE
 * operations whatever M, the row's place in the batch, the lane-group size
 * or the path (sub-groups or local memory): batch invariance holds by
 * construction. q4g is exactly ql_linear_wo_ref's evaluation (per group
 * a = Σ fma(x, q), Σx, then fma(zero, Σx, scale·a), summed in g order), so
 * it matches the reference bit for bit; the others differ from the
 * reference's single running sum only in where the segments start, well
 * inside the accuracy bound.
 *
 * The multiply-adds meant to fuse are written as fma(); every other
 * product and sum rounds on its own (FP_CONTRACT OFF here, ContractionOff
 * on every entry point of the SPIR-V, checked by build_spirv.sh).
 */
#pragma OPENCL FP_CONTRACT OFF

#include "common.clh"

/* Each lane group's own local memory; the mutant gives them all the
 * first one, so they overwrite each other's terms. */
#ifdef QL_ZE_MUT_SHARED_SLAB
#define QL_ZE_SLAB(grp) 0
#else
#define QL_ZE_SLAB(grp) ((grp) * QL_ZE_MT * QL_ZE_LG)
#endif

/* The lane's place: output row n (nr, clamped, is what it reads: a lane
 * group past the last row still takes part in the barriers and writes
 * nothing), the first x row m0 and the count mt of x rows. */
#define QL_ZE_WO_SETUP                                                         \
  __local float xl[QL_ZE_NG * QL_ZE_MT * QL_ZE_LG];                            \
  const int lane = lane_id(), grp = lgroup_id();                               \
  const long n = (long)get_group_id(0) * QL_ZE_NG + grp;                       \
  const long nr = min(n, n_rows - 1);                                          \
  const long m0 = (long)get_group_id(1) * QL_ZE_MT;                            \
  const int mt = (int)min((long)QL_ZE_MT, m - m0);                             \
  __local float *gxl = xl + QL_ZE_SLAB(grp);                                   \
  float acc[QL_ZE_MT];                                                         \
  for (int r = 0; r < QL_ZE_MT; r++)                                           \
    acc[r] = 0.0f

/* Element (row nr, group g) of the layout's [n, groups] scale and zero;
 * the mutant indexes them as the canonical [groups, n]. */
#ifdef QL_ZE_MUT_GROUP_INDEX
#define QL_ZE_SIDX(g) ((g) * n_rows + nr)
#else
#define QL_ZE_SIDX(g) (nr * groups + (g))
#endif

/* Lane r of the group writes x row m0 + r. */
#define QL_ZE_WO_STORE(expr)                                                   \
  if (n < n_rows && lane < mt) {                                               \
    float v = (expr);                                                          \
    store_val(xdt, y, (m0 + lane) * n_rows + n, v);                            \
  }

QL_ZE_KERNEL(QL_ZE_WG)
void ql_ze_wo_q4g(long n_rows, long k, long gs, long groups, int xdt, int sdt,
                  __global const uchar *q, long ldq,
                  __global const uchar *scale, __global const uchar *zero,
                  __global const float *bias, __global const uchar *x, long m,
                  __global uchar *y) {
  QL_ZE_WO_SETUP;
  __global const uchar *qr = q + nr * ldq;

  for (long c0 = 0; c0 < groups; c0 += QL_ZE_LG) {
    const long g = c0 + lane;
    float t[QL_ZE_MT];
    for (int r = 0; r < QL_ZE_MT; r++)
      t[r] = 0.0f;
    if (g < groups) {
      const long k0 = g * gs, k1 = min(k0 + gs, k);
      const float s = load_val(sdt, scale, QL_ZE_SIDX(g));
      const float z = load_val(sdt, zero, QL_ZE_SIDX(g));
      float a[QL_ZE_MT], xs[QL_ZE_MT];
      for (int r = 0; r < QL_ZE_MT; r++)
        a[r] = xs[r] = 0.0f;
      for (long i = k0; i < k1; i++) {
        const float qv = (float)q4_at(qr, i);
        for (int r = 0; r < mt; r++) {
          const float xv = load_val(xdt, x, (m0 + r) * k + i);
          a[r] = fma(xv, qv, a[r]);
          xs[r] += xv;
        }
      }
      for (int r = 0; r < mt; r++)
        t[r] = fma(z, xs[r], s * a[r]);
    }
    combine(acc, t, (int)min((long)QL_ZE_LG, groups - c0), lane, gxl);
  }
  QL_ZE_WO_STORE(bias ? acc[lane] + bias[nr] : acc[lane]);
}

/* q8b: per block the symmetric term scale·Σ x·q, or with a zero point
 * fma(zero, Σx, scale·Σ x·q) as q4g. */
QL_ZE_KERNEL(QL_ZE_WG)
void ql_ze_wo_q8b(long n_rows, long k, long gs, long groups, int xdt, int sdt,
                  __global const uchar *q, long ldq,
                  __global const uchar *scale, __global const uchar *zero,
                  __global const float *bias, __global const uchar *x, long m,
                  __global uchar *y) {
  QL_ZE_WO_SETUP;
  __global const char *qr = (__global const char *)(q + nr * ldq);

  for (long c0 = 0; c0 < groups; c0 += QL_ZE_LG) {
    const long g = c0 + lane;
    float t[QL_ZE_MT];
    for (int r = 0; r < QL_ZE_MT; r++)
      t[r] = 0.0f;
    if (g < groups) {
      const long k0 = g * gs, k1 = min(k0 + gs, k);
      const float s = load_val(sdt, scale, QL_ZE_SIDX(g));
      float a[QL_ZE_MT], xs[QL_ZE_MT];
      for (int r = 0; r < QL_ZE_MT; r++)
        a[r] = xs[r] = 0.0f;
      for (long i = k0; i < k1; i++) {
        const float qv = (float)qr[i];
        for (int r = 0; r < mt; r++) {
          const float xv = load_val(xdt, x, (m0 + r) * k + i);
          a[r] = fma(xv, qv, a[r]);
          xs[r] += xv;
        }
      }
      if (zero) {
        const float z = load_val(sdt, zero, QL_ZE_SIDX(g));
        for (int r = 0; r < mt; r++)
          t[r] = fma(z, xs[r], s * a[r]);
      } else {
        for (int r = 0; r < mt; r++)
          t[r] = s * a[r];
      }
    }
    combine(acc, t, (int)min((long)QL_ZE_LG, groups - c0), lane, gxl);
  }
  QL_ZE_WO_STORE(bias ? acc[lane] + bias[nr] : acc[lane]);
}

/* q8c and f8r: Σ x·q over QL_ZE_SEG-value segments, combined, then one
 * product by the row's scale (and the bias in the same fma). f8r decodes
 * its e4m3 codes exactly. */
#define QL_ZE_WO_ROWSCALE(name, decode)                                        \
  QL_ZE_KERNEL(QL_ZE_WG)                                                       \
  void name(long n_rows, long k, long gs, long groups, int xdt, int sdt,       \
            __global const uchar *q, long ldq, __global const uchar *scale,    \
            __global const uchar *zero, __global const float *bias,            \
            __global const uchar *x, long m, __global uchar *y) {              \
    QL_ZE_WO_SETUP;                                                            \
    __global const uchar *qr = q + nr * ldq;                                   \
    const long segs = (k + QL_ZE_SEG - 1) / QL_ZE_SEG;                         \
    float s;                                                                   \
    (void)gs;                                                                  \
    (void)groups;                                                              \
    (void)zero;                                                                \
    for (long c0 = 0; c0 < segs; c0 += QL_ZE_LG) {                             \
      const long g = c0 + lane;                                                \
      float t[QL_ZE_MT];                                                       \
      for (int r = 0; r < QL_ZE_MT; r++)                                       \
        t[r] = 0.0f;                                                           \
      if (g < segs) {                                                          \
        const long k1 = min((g + 1) * QL_ZE_SEG, k);                           \
        for (long i = g * QL_ZE_SEG; i < k1; i++) {                            \
          const float qv = decode(qr[i]);                                      \
          for (int r = 0; r < mt; r++)                                         \
            t[r] = fma(load_val(xdt, x, (m0 + r) * k + i), qv, t[r]);          \
        }                                                                      \
      }                                                                        \
      combine(acc, t, (int)min((long)QL_ZE_LG, segs - c0), lane, gxl);         \
    }                                                                          \
    s = load_val(sdt, scale, nr);                                              \
    QL_ZE_WO_STORE(bias ? fma(s, acc[lane], bias[nr]) : s * acc[lane]);        \
  }

#define QL_ZE_DECODE_I8(c) ((float)(char)(c))
#define QL_ZE_DECODE_E4M3(c) e4m3_to_f32(c)
QL_ZE_WO_ROWSCALE(ql_ze_wo_q8c, QL_ZE_DECODE_I8)
QL_ZE_WO_ROWSCALE(ql_ze_wo_f8r, QL_ZE_DECODE_E4M3)
