/*
 * linear_aq.cl - activation-quantized linear (DESIGN §4 "AQ math") on the
 * output of ql_ze_quantize_rows: q8c (W8A8) and q4g (W4A8), weights in
 * layout "ze-1" (ql_ze.h).
 *
 *   q8c: y = (float)Σk xq·wq · (sx·sw)           int32 over all of K
 *   q4g: y = sx · Σg (scale·(float)Σk∈g xq·q + zero·(float)Σk∈g xq)
 *        int32 inside a group, f32 across groups in increasing g, the
 *        scale term added before the zero term
 * then + b and one rounding to the activation dtype: ql_linear_aq_ref's
 * operations in its order, so both match the reference bit for bit. The
 * lanes split K as in linear_wo.cl (segments of QL_ZE_SEG for q8c, groups
 * for q4g) and combine the segments in increasing order.
 *
 * Contraction is off (FP_CONTRACT OFF here, ContractionOff on every
 * entry point of the SPIR-V, checked by build_spirv.sh): (float)acc·sxw
 * and the bias must round separately, as in the reference.
 *
 * The products of int8 codes are plain int multiply-adds: the integer
 * dot product of cl_khr_integer_dot_product (dot(char4, char4)) is what
 * an Intel GPU would run as dp4a, but llvm-spirv 14 translates it to the
 * float-only OpDot, which spirv-val rejects, so it is not used yet.
 */
#pragma OPENCL FP_CONTRACT OFF

#include "common.clh"

#define QL_ZE_AQ_SETUP                                                         \
  const int lane = lane_id(), grp = lgroup_id();                               \
  const long n = (long)get_group_id(0) * QL_ZE_NG + grp;                       \
  const long nr = min(n, n_rows - 1);                                          \
  const long m0 = (long)get_group_id(1) * QL_ZE_MT;                            \
  const int mt = (int)min((long)QL_ZE_MT, m - m0)

QL_ZE_KERNEL(QL_ZE_WG)
void ql_ze_aq_q8c(long n_rows, long k, int xdt, int sdt,
                  __global const uchar *q, long ldq,
                  __global const uchar *scale, __global const float *bias,
                  __global const char *xq, __global const float *sx, long m,
                  __global uchar *y) {
  __local int xl[QL_ZE_NG * QL_ZE_MT * QL_ZE_LG];
  QL_ZE_AQ_SETUP;
  __global const char *qr = (__global const char *)(q + nr * ldq);
  const long segs = (k + QL_ZE_SEG - 1) / QL_ZE_SEG;
  int acc[QL_ZE_MT];

  for (int r = 0; r < QL_ZE_MT; r++)
    acc[r] = 0;
  for (long c0 = 0; c0 < segs; c0 += QL_ZE_LG) {
    const long g = c0 + lane;
    int t[QL_ZE_MT];
    for (int r = 0; r < QL_ZE_MT; r++)
      t[r] = 0;
    if (g < segs) {
      const long k1 = min((g + 1) * QL_ZE_SEG, k);
      for (long i = g * QL_ZE_SEG; i < k1; i++) {
        const int wv = qr[i];
        for (int r = 0; r < mt; r++)
          t[r] += (int)xq[(m0 + r) * k + i] * wv;
      }
    }
    combine_int(acc, t, (int)min((long)QL_ZE_LG, segs - c0), lane,
                xl + grp * QL_ZE_MT * QL_ZE_LG);
  }
  if (n < n_rows && lane < mt) {
    const float sxw = sx[m0 + lane] * load_val(sdt, scale, nr);
    float v = (float)acc[lane] * sxw;
    if (bias)
      v += bias[nr];
    store_val(xdt, y, (m0 + lane) * n_rows + n, v);
  }
}

QL_ZE_KERNEL(QL_ZE_WG)
void ql_ze_aq_q4g(long n_rows, long k, long gs, long groups, int xdt,
                  int sdt, __global const uchar *q, long ldq,
                  __global const uchar *scale, __global const uchar *zero,
                  __global const float *bias, __global const char *xq,
                  __global const float *sx, __global const int *gsum, long m,
                  __global uchar *y) {
  __local float xl[QL_ZE_NG * 2 * QL_ZE_MT * QL_ZE_LG];
  QL_ZE_AQ_SETUP;
  __global const uchar *qr = q + nr * ldq;
  float acc[QL_ZE_MT];

  for (int r = 0; r < QL_ZE_MT; r++)
    acc[r] = 0.0f;
  for (long c0 = 0; c0 < groups; c0 += QL_ZE_LG) {
    const long g = c0 + lane;
    float t1[QL_ZE_MT], t2[QL_ZE_MT];
    for (int r = 0; r < QL_ZE_MT; r++)
      t1[r] = t2[r] = 0.0f;
    if (g < groups) {
      const long k0 = g * gs, k1 = min(k0 + gs, k);
      const float s = load_val(sdt, scale, nr * groups + g);
      const float z = load_val(sdt, zero, nr * groups + g);
      int a[QL_ZE_MT];
      for (int r = 0; r < QL_ZE_MT; r++)
        a[r] = 0;
      for (long i = k0; i < k1; i++) {
        const int wv = q4_at(qr, i);
        for (int r = 0; r < mt; r++)
          a[r] += (int)xq[(m0 + r) * k + i] * wv;
      }
      for (int r = 0; r < mt; r++) {
        t1[r] = s * (float)a[r];
        t2[r] = z * (float)gsum[(m0 + r) * groups + g];
      }
    }
    combine2(acc, t1, t2, (int)min((long)QL_ZE_LG, groups - c0), lane,
             xl + grp * 2 * QL_ZE_MT * QL_ZE_LG);
  }
  if (n < n_rows && lane < mt) {
    float v = sx[m0 + lane] * acc[lane];
    if (bias)
      v += bias[nr];
    store_val(xdt, y, (m0 + lane) * n_rows + n, v);
  }
}
