/*
 * quantize_rows.cl - per-row activation quantization (DESIGN §4, the AQ
 * path), bit for bit the rule of ql_quantize_rows_i8_src / _e4m3_src
 * (ql_kernels.h), and the finiteness check the weight-only path runs
 * before its product.
 *
 * One work-group per row. A first pass finds amax and the row's first
 * offending value (NaN/Inf, or a value the source dtype cannot hold: the
 * reference's row_amax checks both in index order, so the smallest index
 * decides, whatever lane saw it); both reductions are exact. Then every
 * lane derives the same scale with the same IEEE operations and quantizes
 * its strided share of the row.
 */
#pragma OPENCL FP_CONTRACT OFF

#include "common.clh"

QL_ZE_KERNEL(QL_ZE_QWG)
void ql_ze_quantize_rows(int kind, int xdt, int src, long k, long gs,
                         long groups, __global const uchar *x,
                         __global uchar *xq, __global float *sx,
                         __global int *gsum, __global long *status) {
  __local float sf[QL_ZE_QWG];
  __local long sl[QL_ZE_QWG];
  __local int si[QL_ZE_QWG];
  const long row = get_group_id(0);
  const int lid = (int)get_local_id(0);
  __global const uchar *xr = x; /* element row*k + i of dtype xdt */
  __global uchar *qr = xq + row * k;
  float amax = 0.0f, s;
  long bad = LONG_MAX;

  for (long i = lid; i < k; i += QL_ZE_QWG) {
    float v = load_val(xdt, xr, row * k + i);
    float a = fabs(v);
    if (!isfinite(v)) {
      bad = (i << 2) | QL_ZE_ST_NONFINITE;
      break; /* later indices of this lane cannot come first */
    }
    if (src != QL_ZE_DT_F32 && rnd_src(src, v) != v) {
      bad = (i << 2) | QL_ZE_ST_INEXACT;
      break;
    }
    if (a > amax)
      amax = a;
  }
  amax = wg_max_f(amax, sf);
  bad = wg_min_l(bad, sl);
  if (bad != LONG_MAX) { /* the same for every lane: a uniform exit */
    if (lid == 0)
      status[row] = bad;
    return;
  }
  if (lid == 0)
    status[row] = 0;

  if (kind == QL_ZE_QROWS_I8) {
    /* s = rnd_src(amax / 127.5), at least eps; q = rne(x · (1/s)) */
    float inv;
    s = rnd_src(src, amax / 127.5f);
    if (s < QL_ZE_I8_SCALE_EPS)
      s = QL_ZE_I8_SCALE_EPS;
    inv = 1.0f / s;
    for (long i = lid; i < k; i += QL_ZE_QWG) {
      float t = rint(load_val(xdt, xr, row * k + i) * inv);
      qr[i] = (uchar)(char)(t <= -128.0f ? -128 : t >= 127.0f ? 127 : (int)t);
    }
  } else {
    /* s = rnd_src(max(amax, 1e-12) / 448) (f16: at least 2^-24);
     * q = e4m3(clamp(x / s, ±448)), a true division */
    s = rnd_src(src, fmax(amax, QL_ZE_F8_AMAX_LB) / QL_ZE_E4M3_MAX);
    if (src == QL_ZE_DT_F16 && s < QL_ZE_F8_F16_SCALE_MIN)
      s = QL_ZE_F8_F16_SCALE_MIN;
    for (long i = lid; i < k; i += QL_ZE_QWG) {
      float t = load_val(xdt, xr, row * k + i) / s;
      t = t < -QL_ZE_E4M3_MAX ? -QL_ZE_E4M3_MAX
          : t > QL_ZE_E4M3_MAX ? QL_ZE_E4M3_MAX : t;
      qr[i] = f32_to_e4m3(t);
    }
  }
  if (lid == 0)
    sx[row] = s;

  if (gsum == 0 || kind != QL_ZE_QROWS_I8)
    return;
  /* Σxq per group, from the codes just written by this work-group
   * (visible after the barrier, OpenCL 1.2 §6.12.8). Many groups: a lane
   * per group; few (gs = K): the work-group reduces each. Integer sums
   * are exact, so the split does not change them. */
  barrier(CLK_GLOBAL_MEM_FENCE);
  {
    __global const char *qs = (__global const char *)qr;
    __global int *gr = gsum + row * groups;
    if (groups >= QL_ZE_QWG) {
      for (long g = lid; g < groups; g += QL_ZE_QWG) {
        long k0 = g * gs, k1 = min(k0 + gs, k);
        int acc = 0;
        for (long i = k0; i < k1; i++)
          acc += qs[i];
        gr[g] = acc;
      }
    } else {
      for (long g = 0; g < groups; g++) {
        long k0 = g * gs, k1 = min(k0 + gs, k);
        int acc = 0;
        for (long i = k0 + lid; i < k1; i += QL_ZE_QWG)
          acc += qs[i];
        acc = wg_add_i(acc, si);
        if (lid == 0)
          gr[g] = acc;
      }
    }
  }
}

/* *bad = 1 when one of count values of x (dtype xdt) is NaN or ±Inf: run
 * before a weight-only product, which must fail before writing y
 * (DESIGN §4). A flag, not a reduction: atomic_or (OpenCL 1.2 §6.12.11)
 * keeps concurrent setters well defined. */
QL_ZE_KERNEL(QL_ZE_QWG)
void ql_ze_check_finite(int xdt, long count, __global const uchar *x,
                        __global int *bad) {
  const long stride = (long)get_global_size(0);
  for (long i = (long)get_global_id(0); i < count; i += stride)
    if (!isfinite(load_val(xdt, x, i))) {
      atomic_or(bad, 1);
      break;
    }
}
