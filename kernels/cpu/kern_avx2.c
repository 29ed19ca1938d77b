/*
 * kern_avx2.c - the AVX2 levels of the CPU kernels (cpu.h): AVX2 + FMA +
 * F16C, with and without AVX-VNNI. A 16-row tile is two 256-bit halves
 * (columns); lane j of column c is row 8c + j of the tile. As at the other
 * levels, each lane does the reference's operations in the reference's
 * order (no FMA: the feature is only required because every
 * AVX2 CPU has it and the F16C/AVX2 pair comes with it), except where
 * the reference has one (q4g and q8c WO) or it is exact: the asymmetric q8b
 * dequantization of a layout whose scales allow it (cpu.h, fma_dequant),
 * and the f8r AQ sums, whose products are exact (kern_avx512.c).
 *
 * The AQ kernels exist twice (kern_avx2_aq.h, included once per
 * variant): with vpdpbusd (AVX-VNNI), and without it, where the u8·s8
 * dword dot is two vpmaddwd on 16-bit halves (vpmaddubsw would saturate:
 * 255·127·2 > 32767). Each variant's functions carry only their own
 * target, so the VNNI instructions cannot leak into the plain variant.
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu.h"

#define TGT __attribute__((target("avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline)) TGT

#define T QL_CPU_TILE
#define H 8 /* lanes per column */

/* The loops over columns and rows of a block have constant trip counts
 * once inlined; unrolled, their vectors live in registers. */
#define UNROLL _Pragma("GCC unroll 8")

/* 8 scale/zero values of dtype dt, widened exactly to f32. */
INL __m256 load8(ql_dtype dt, const uint8_t *p) {
  if (dt == QL_DTYPE_F32)
    return _mm256_loadu_ps((const float *)p);
  if (dt == QL_DTYPE_F16)
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* Rows of column c of tile t that exist (0..8). */
INL int col_rows(const ql__cpu_packed *p, int64_t t, int c) {
  int64_t r = p->n - t * T - c * H;
  return r <= 0 ? 0 : r >= H ? H : (int)r;
}

/* y[r][column c of tile t] = v (+ bias). */
INL void store_col(const ql__cpu_packed *p, int64_t t, int c, __m256 v,
                   const float *bias, float *yr) {
  int rows = col_rows(p, t, c);
  int64_t n0 = t * T + c * H;
  if (rows == H) {
    if (bias != NULL)
      v = _mm256_add_ps(v, _mm256_loadu_ps(bias + n0));
    _mm256_storeu_ps(yr + n0, v);
  } else if (rows > 0) {
    float tmp[H];
    _mm256_storeu_ps(tmp, v);
    for (int j = 0; j < rows; j++)
      yr[n0 + j] = bias != NULL ? tmp[j] + bias[n0 + j] : tmp[j];
  }
}

/* ------------------------------------------------------------ WO q4g */

/* tb tiles (2·tb columns) x mb rows, all of K; constant tb, mb. The zero
 * is factored out of each group, as in kern_avx512.c. */
INL void wo_q4g_blk(const ql__cpu_packed *p, const float *x, const float *xs,
                    int64_t m0, const int mb, int64_t t, const int tb,
                    const float *bias, float *y) {
  __m256 acc[4][4], ga[4][4];
  const uint8_t *tp[2];
  const __m256i nib = _mm256_set1_epi32(0xF);
  const __m256i magic = _mm256_set1_epi32(0x4B000000);
  const __m256 magic8 = _mm256_set1_ps(8388616.0f); /* 2^23 + 8 */
  const size_t esz = ql_dtype_size(p->sdt);
  const int64_t K = p->k, G = p->groups;
  const int nc = 2 * tb;
  const float *xr[4];

  UNROLL
  for (int a = 0; a < tb; a++)
    tp[a] = p->data + (size_t)(t + a) * p->tile_bytes;
  UNROLL
  for (int c = 0; c < nc; c++)
    UNROLL
  for (int r = 0; r < mb; r++)
    acc[c][r] = _mm256_setzero_ps();
  UNROLL
  for (int r = 0; r < mb; r++)
    xr[r] = x + (size_t)(m0 + r) * (size_t)K;

  for (int64_t g = 0; g < G; g++) {
    const uint8_t *d[4];
    int64_t nb = ql__cpu_q4g_blocks(p, g), k0 = g * (int64_t)p->gs;
    UNROLL
    for (int c = 0; c < nc; c++) {
      d[c] = tp[c / 2] + (size_t)g * p->group_bytes + p->sz_bytes +
             (c & 1) * 32;
      UNROLL
      for (int r = 0; r < mb; r++)
        ga[c][r] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++, k0 += QL_CPU_Q4G_KB) {
      __m256i v[4];
      UNROLL
      for (int c = 0; c < nc; c++)
        v[c] = _mm256_load_si256(
            (const __m256i *)(d[c] + (size_t)b * QL_CPU_BLOCK));
#define WO_Q4G_STEP(i, u_of)                                                   \
  do {                                                                         \
    UNROLL                                                                     \
    for (int c = 0; c < nc; c++) {                                             \
      __m256i u = _mm256_or_si256(_mm256_and_si256(u_of, nib), magic);         \
      __m256 qf = _mm256_sub_ps(_mm256_castsi256_ps(u), magic8);               \
      UNROLL                                                                   \
      for (int r = 0; r < mb; r++)                                             \
        ga[c][r] =                                                             \
            _mm256_fmadd_ps(_mm256_set1_ps(xr[r][k0 + (i)]), qf, ga[c][r]);    \
    }                                                                          \
  } while (0)
      if (K - k0 >= QL_CPU_Q4G_KB) {
        WO_Q4G_STEP(0, v[c]);
        WO_Q4G_STEP(1, _mm256_srli_epi32(v[c], 8));
        WO_Q4G_STEP(2, _mm256_srli_epi32(v[c], 16));
        WO_Q4G_STEP(3, _mm256_srli_epi32(v[c], 24));
        WO_Q4G_STEP(4, _mm256_srli_epi32(v[c], 4));
        WO_Q4G_STEP(5, _mm256_srli_epi32(v[c], 12));
        WO_Q4G_STEP(6, _mm256_srli_epi32(v[c], 20));
        WO_Q4G_STEP(7, _mm256_srli_epi32(v[c], 28));
      } else {
        int kn = (int)(K - k0);
        for (int i = 0; i < kn; i++) {
          __m128i sh = _mm_cvtsi32_si128((i & 3) * 8 + (i & 4));
          WO_Q4G_STEP(i, _mm256_srl_epi32(v[c], sh));
        }
      }
#undef WO_Q4G_STEP
    }
    UNROLL
    for (int c = 0; c < nc; c++) {
      const uint8_t *gp = tp[c / 2] + (size_t)g * p->group_bytes;
      __m256 s = load8(p->sdt, gp + (size_t)((c & 1) * H) * esz);
      __m256 z = load8(p->sdt, gp + (size_t)(T + (c & 1) * H) * esz);
      UNROLL
      for (int r = 0; r < mb; r++) {
        __m256 sx = _mm256_set1_ps(xs[(size_t)(m0 + r) * (size_t)G + g]);
        acc[c][r] = _mm256_add_ps(
            acc[c][r], _mm256_fmadd_ps(z, sx, _mm256_mul_ps(s, ga[c][r])));
      }
    }
  }
  UNROLL
  for (int c = 0; c < nc; c++)
    UNROLL
  for (int r = 0; r < mb; r++)
    store_col(p, t + c / 2, c & 1, acc[c][r], bias,
              y + (size_t)(m0 + r) * (size_t)p->n);
}

/* ------------------------------------------------------------ WO q8c */

INL void wo_q8c_blk(const ql__cpu_packed *p, const float *x, int64_t m0,
                    const int mb, int64_t t, const int tb, const float *bias,
                    float *y) {
  __m256 acc[4][4], s[4];
  const uint8_t *d[4];
  const __m256i byte = _mm256_set1_epi32(0xFF);
  const __m256i magic = _mm256_set1_epi32(0x4B000000);
  const __m256 magic128 = _mm256_set1_ps(8388736.0f); /* 2^23 + 128 */
  const int64_t K = p->k, nb = (K + QL_CPU_Q8C_KB - 1) / QL_CPU_Q8C_KB;
  const int nc = 2 * tb;
  const float *xr[4];

  UNROLL
  for (int c = 0; c < nc; c++) {
    const uint8_t *tp = p->data + (size_t)(t + c / 2) * p->tile_bytes;
    s[c] = _mm256_load_ps((const float *)tp + (c & 1) * H);
    d[c] = tp + QL_CPU_BLOCK + (c & 1) * 32;
    UNROLL
    for (int r = 0; r < mb; r++)
      acc[c][r] = _mm256_setzero_ps();
  }
  UNROLL
  for (int r = 0; r < mb; r++)
    xr[r] = x + (size_t)(m0 + r) * (size_t)K;

  for (int64_t b = 0, k0 = 0; b < nb; b++, k0 += QL_CPU_Q8C_KB) {
    __m256i v[4];
    UNROLL
    for (int c = 0; c < nc; c++)
      v[c] =
          _mm256_load_si256((const __m256i *)(d[c] + (size_t)b * QL_CPU_BLOCK));
#define WO_Q8C_STEP(i, u_of)                                                   \
  do {                                                                         \
    UNROLL                                                                     \
    for (int c = 0; c < nc; c++) {                                             \
      __m256i u = _mm256_or_si256(_mm256_and_si256(u_of, byte), magic);        \
      __m256 qf = _mm256_sub_ps(_mm256_castsi256_ps(u), magic128);             \
      UNROLL                                                                   \
      for (int r = 0; r < mb; r++)                                             \
        acc[c][r] =                                                            \
            _mm256_fmadd_ps(_mm256_set1_ps(xr[r][k0 + (i)]), qf, acc[c][r]);   \
    }                                                                          \
  } while (0)
    if (K - k0 >= QL_CPU_Q8C_KB) {
      WO_Q8C_STEP(0, v[c]);
      WO_Q8C_STEP(1, _mm256_srli_epi32(v[c], 8));
      WO_Q8C_STEP(2, _mm256_srli_epi32(v[c], 16));
      WO_Q8C_STEP(3, _mm256_srli_epi32(v[c], 24));
    } else {
      int kn = (int)(K - k0);
      for (int i = 0; i < kn; i++) {
        __m128i sh = _mm_cvtsi32_si128(i * 8);
        WO_Q8C_STEP(i, _mm256_srl_epi32(v[c], sh));
      }
    }
#undef WO_Q8C_STEP
  }
  UNROLL
  for (int c = 0; c < nc; c++)
    UNROLL
  for (int r = 0; r < mb; r++)
    store_col(p, t + c / 2, c & 1, _mm256_mul_ps(s[c], acc[c][r]), bias,
              y + (size_t)(m0 + r) * (size_t)p->n);
}

/* ------------------------------------------------------------ WO q8b */

/* q8c's loop with a scale (and zero) per block of B k (kern_avx512.c). */
INL void wo_q8b_blk(const int asym, const int fma, const ql__cpu_packed *p,
                    const float *x, int64_t m0, const int mb, int64_t t,
                    const int tb, const float *bias, float *y) {
  __m256 acc[4][4];
  const uint8_t *tp[2];
  const __m256i byte = _mm256_set1_epi32(0xFF);
  const __m256i magic = _mm256_set1_epi32(0x4B000000);
  const __m256 magic128 = _mm256_set1_ps(8388736.0f); /* 2^23 + 128 */
  const size_t esz = ql_dtype_size(p->sdt);
  const int64_t K = p->k, bpg = p->gs / QL_CPU_Q8C_KB;
  const int nc = 2 * tb;
  const float *xr[4];

  UNROLL
  for (int a = 0; a < tb; a++)
    tp[a] = p->data + (size_t)(t + a) * p->tile_bytes;
  UNROLL
  for (int c = 0; c < nc; c++)
    UNROLL
  for (int r = 0; r < mb; r++)
    acc[c][r] = _mm256_setzero_ps();
  UNROLL
  for (int r = 0; r < mb; r++)
    xr[r] = x + (size_t)(m0 + r) * (size_t)K;

  for (int64_t g = 0, k0 = 0; k0 < K; g++) {
    __m256 s[4], z[4];
    const uint8_t *d[4];
    int64_t nb = (K - k0 + QL_CPU_Q8C_KB - 1) / QL_CPU_Q8C_KB;
    if (nb > bpg)
      nb = bpg;
    UNROLL
    for (int c = 0; c < nc; c++) {
      const uint8_t *gp = tp[c / 2] + (size_t)g * p->group_bytes;
      s[c] = load8(p->sdt, gp + (size_t)((c & 1) * H) * esz);
      z[c] = asym ? load8(p->sdt, gp + (size_t)(T + (c & 1) * H) * esz)
                  : _mm256_setzero_ps();
      d[c] = tp[c / 2] + p->sz_bytes + (size_t)(g * bpg) * QL_CPU_BLOCK +
             (c & 1) * 32;
    }
    for (int64_t b = 0; b < nb; b++, k0 += QL_CPU_Q8C_KB) {
      __m256i v[4];
      UNROLL
      for (int c = 0; c < nc; c++)
        v[c] = _mm256_load_si256(
            (const __m256i *)(d[c] + (size_t)b * QL_CPU_BLOCK));
#define WO_Q8B_STEP(i, u_of)                                                   \
  do {                                                                         \
    UNROLL                                                                     \
    for (int c = 0; c < nc; c++) {                                             \
      __m256i u = _mm256_or_si256(_mm256_and_si256(u_of, byte), magic);        \
      __m256 qf = _mm256_sub_ps(_mm256_castsi256_ps(u), magic128);             \
      __m256 wq = !asym ? _mm256_mul_ps(qf, s[c])                              \
                  : fma ? _mm256_fmadd_ps(qf, s[c], z[c])                      \
                        : _mm256_add_ps(_mm256_mul_ps(qf, s[c]), z[c]);        \
      UNROLL                                                                   \
      for (int r = 0; r < mb; r++)                                             \
        acc[c][r] = _mm256_add_ps(                                             \
            acc[c][r], _mm256_mul_ps(_mm256_set1_ps(xr[r][k0 + (i)]), wq));    \
    }                                                                          \
  } while (0)
      if (K - k0 >= QL_CPU_Q8C_KB) {
        WO_Q8B_STEP(0, v[c]);
        WO_Q8B_STEP(1, _mm256_srli_epi32(v[c], 8));
        WO_Q8B_STEP(2, _mm256_srli_epi32(v[c], 16));
        WO_Q8B_STEP(3, _mm256_srli_epi32(v[c], 24));
      } else {
        int kn = (int)(K - k0);
        for (int i = 0; i < kn; i++) {
          __m128i sh = _mm_cvtsi32_si128(i * 8);
          WO_Q8B_STEP(i, _mm256_srl_epi32(v[c], sh));
        }
      }
#undef WO_Q8B_STEP
    }
  }
  UNROLL
  for (int c = 0; c < nc; c++)
    UNROLL
  for (int r = 0; r < mb; r++)
    store_col(p, t + c / 2, c & 1, acc[c][r], bias,
              y + (size_t)(m0 + r) * (size_t)p->n);
}

/* ------------------------------------------------------------ f8r */

/* The e4m3 decoding of kern_avx512.c (f8_dec4; f8_dec says why it is
 * exact): d[i] = e4m3(byte i of each dword)·2^-120 as f32. */
INL void f8_dec4(__m256i v, __m256 d[4]) {
  const __m256i msk = _mm256_set1_epi32(0x87F00000);
  __m256i hi = _mm256_srai_epi16(v, 4);
  __m256i lo = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 4);
  d[0] = _mm256_castsi256_ps(
      _mm256_and_si256(_mm256_slli_epi32(lo, 16), msk));
  d[1] = _mm256_castsi256_ps(
      _mm256_and_si256(_mm256_slli_epi32(hi, 16), msk));
  d[2] = _mm256_castsi256_ps(_mm256_and_si256(lo, msk));
  d[3] = _mm256_castsi256_ps(_mm256_and_si256(hi, msk));
}

/* WO f8r: ŵ = e4m3(w)·s, then acc += x·ŵ in increasing k. */
INL void wo_f8r_blk(const int fold, const ql__cpu_packed *p, const float *x,
                    int64_t m0, const int mb, int64_t t, const int tb,
                    const float *bias, float *y) {
  __m256 acc[4][4], s[4];
  const uint8_t *d[4];
  const __m256 two120 = _mm256_set1_ps(0x1p120f);
  const int64_t K = p->k, nb = ql__cpu_kblocks(p);
  const int nc = 2 * tb;
  const float *xr[4];

  UNROLL
  for (int c = 0; c < nc; c++) {
    const uint8_t *tp = p->data + (size_t)(t + c / 2) * p->tile_bytes;
    s[c] = _mm256_load_ps((const float *)tp + (c & 1) * H);
    if (fold)
      s[c] = _mm256_mul_ps(s[c], two120); /* exact: finite (f8_fold) */
    d[c] = tp + QL_CPU_BLOCK + (c & 1) * 32;
    UNROLL
    for (int r = 0; r < mb; r++)
      acc[c][r] = _mm256_setzero_ps();
  }
  UNROLL
  for (int r = 0; r < mb; r++)
    xr[r] = x + (size_t)(m0 + r) * (size_t)K;

  for (int64_t b = 0, k0 = 0; b < nb; b++, k0 += QL_CPU_Q8C_KB) {
    /* the padding codes past K decode to 0 and are never used */
    const int kn = K - k0 < QL_CPU_Q8C_KB ? (int)(K - k0) : QL_CPU_Q8C_KB;
    __m256 dv[4][4];
    UNROLL
    for (int c = 0; c < nc; c++)
      f8_dec4(_mm256_load_si256(
                  (const __m256i *)(d[c] + (size_t)b * QL_CPU_BLOCK)),
              dv[c]);
#define WO_F8R_STEP(i)                                                         \
  do {                                                                         \
    UNROLL                                                                     \
    for (int c = 0; c < nc; c++) {                                             \
      __m256 wq = fold ? _mm256_mul_ps(dv[c][i], s[c])                         \
                       : _mm256_mul_ps(_mm256_mul_ps(dv[c][i], two120), s[c]); \
      UNROLL                                                                   \
      for (int r = 0; r < mb; r++)                                             \
        acc[c][r] = _mm256_add_ps(                                             \
            acc[c][r], _mm256_mul_ps(_mm256_set1_ps(xr[r][k0 + (i)]), wq));    \
    }                                                                          \
  } while (0)
    if (kn == QL_CPU_Q8C_KB) {
      WO_F8R_STEP(0);
      WO_F8R_STEP(1);
      WO_F8R_STEP(2);
      WO_F8R_STEP(3);
    } else {
      WO_F8R_STEP(0);
      if (kn > 1)
        WO_F8R_STEP(1);
      if (kn > 2)
        WO_F8R_STEP(2);
    }
#undef WO_F8R_STEP
  }
  UNROLL
  for (int c = 0; c < nc; c++)
    UNROLL
  for (int r = 0; r < mb; r++)
    store_col(p, t + c / 2, c & 1, acc[c][r], bias,
              y + (size_t)(m0 + r) * (size_t)p->n);
}

/* AQ f8r: one exact-product FMA per k, sum = acc/2 (kern_avx512.c). */
INL void aq_f8r_blk(const ql__cpu_packed *p, const ql__cpu_xq *xq, int64_t m0,
                    const int mb, int64_t t, const int tb, const float *bias,
                    float *y) {
  __m256 acc[4][4];
  const uint8_t *d[4];
  const float *xr[4];
  const int64_t nb = xq->kp / QL_CPU_Q8C_KB;
  const int nc = 2 * tb;

  UNROLL
  for (int c = 0; c < nc; c++) {
    d[c] = p->data + (size_t)(t + c / 2) * p->tile_bytes + QL_CPU_BLOCK +
           (c & 1) * 32;
    UNROLL
    for (int r = 0; r < mb; r++)
      acc[c][r] = _mm256_setzero_ps();
  }
  UNROLL
  for (int r = 0; r < mb; r++)
    xr[r] = xq->xe + (size_t)(m0 + r) * (size_t)xq->kp;
  for (int64_t b = 0; b < nb; b++) {
    __m256 dv[4][4];
    const int64_t k0 = b * QL_CPU_Q8C_KB;
    UNROLL
    for (int c = 0; c < nc; c++)
      f8_dec4(_mm256_load_si256(
                  (const __m256i *)(d[c] + (size_t)b * QL_CPU_BLOCK)),
              dv[c]);
    UNROLL
    for (int i = 0; i < QL_CPU_Q8C_KB; i++) {
      UNROLL
      for (int r = 0; r < mb; r++) {
        __m256 xb = _mm256_set1_ps(xr[r][k0 + i]);
        UNROLL
        for (int c = 0; c < nc; c++)
          acc[c][r] = _mm256_fmadd_ps(dv[c][i], xb, acc[c][r]);
      }
    }
  }
  UNROLL
  for (int c = 0; c < nc; c++) {
    const float *sc =
        (const float *)(p->data + (size_t)(t + c / 2) * p->tile_bytes);
    __m256 s = _mm256_load_ps(sc + (c & 1) * H);
    UNROLL
    for (int r = 0; r < mb; r++) {
      __m256 sxw = _mm256_mul_ps(_mm256_set1_ps(xq->sx[m0 + r]), s);
      __m256 v = _mm256_mul_ps(
          _mm256_mul_ps(acc[c][r], _mm256_set1_ps(2.0f)), sxw);
      store_col(p, t + c / 2, c & 1, v, bias,
                y + (size_t)(m0 + r) * (size_t)p->n);
    }
  }
}

/* A call of blk with constant (tb, mb): 1-2 rows take 2 tiles (4
 * columns: 4-8 independent sums), more rows 1 tile x up to 4 rows. */
#define CASES(blk, ...)                                                        \
  switch (tb * 16 + mb) {                                                      \
  case 0x21:                                                                   \
    blk(__VA_ARGS__, 1, t, 2, bias, y);                                        \
    break;                                                                     \
  case 0x22:                                                                   \
    blk(__VA_ARGS__, 2, t, 2, bias, y);                                        \
    break;                                                                     \
  case 0x11:                                                                   \
    blk(__VA_ARGS__, 1, t, 1, bias, y);                                        \
    break;                                                                     \
  case 0x12:                                                                   \
    blk(__VA_ARGS__, 2, t, 1, bias, y);                                        \
    break;                                                                     \
  case 0x13:                                                                   \
    blk(__VA_ARGS__, 3, t, 1, bias, y);                                        \
    break;                                                                     \
  default:                                                                     \
    blk(__VA_ARGS__, 4, t, 1, bias, y);                                        \
    break;                                                                     \
  }

#define DRIVE(blk, ...)                                                        \
  for (int64_t t = t0; t < t1;) {                                              \
    int tb = m <= 2 && t1 - t >= 2 ? 2 : 1;                                    \
    for (int64_t m0 = 0; m0 < m;) {                                            \
      int mb = m - m0 < 4 ? (int)(m - m0) : 4;                                 \
      CASES(blk, __VA_ARGS__)                                                  \
      m0 += mb;                                                                \
    }                                                                          \
    t += tb;                                                                   \
  }

static TGT void wo_q4g(const ql__cpu_packed *p, const float *x,
                       const float *xs, int64_t m, int64_t t0, int64_t t1,
                       const float *bias, float *y) {
  DRIVE(wo_q4g_blk, p, x, xs, m0)
}

static TGT void wo_q8c(const ql__cpu_packed *p, const float *x, int64_t m,
                       int64_t t0, int64_t t1, const float *bias, float *y) {
  DRIVE(wo_q8c_blk, p, x, m0)
}

static TGT void wo_q8b(const ql__cpu_packed *p, const float *x, int64_t m,
                       int64_t t0, int64_t t1, const float *bias, float *y) {
  if (!p->asym) {
    DRIVE(wo_q8b_blk, 0, 0, p, x, m0)
  } else if (p->fma_dequant) {
    DRIVE(wo_q8b_blk, 1, 1, p, x, m0)
  } else {
    DRIVE(wo_q8b_blk, 1, 0, p, x, m0)
  }
}

static TGT void wo_f8r(const ql__cpu_packed *p, const float *x, int64_t m,
                       int64_t t0, int64_t t1, const float *bias, float *y) {
  if (ql__cpu_daz()) {
    ql__cpu_kernels_c.wo_f8r(p, x, m, t0, t1, bias, y);
  } else if (p->f8_fold) {
    DRIVE(wo_f8r_blk, 1, p, x, m0)
  } else {
    DRIVE(wo_f8r_blk, 0, p, x, m0)
  }
}

/* Both AVX2 variants: f8r AQ has no integer dot products. */
static TGT void aq_f8r(const ql__cpu_packed *p, const ql__cpu_xq *xq,
                       int64_t t0, int64_t t1, const float *bias, float *y) {
  const int64_t m = xq->m;
  if (ql__cpu_daz()) {
    ql__cpu_kernels_c.aq_f8r(p, xq, t0, t1, bias, y);
    return;
  }
  DRIVE(aq_f8r_blk, p, xq, m0)
}

/* -------------------------------------------------------- quantize */

static TGT int quant_row(ql_dtype src, const float *x, int64_t k, int8_t *xq,
                         float *sx) {
  const __m256 lim = _mm256_set1_ps(3.40282347e+38f);
  const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 vmax = _mm256_setzero_ps();
  int bad = 0;
  float amax, scale, inv, m8[H];
  int64_t i;

  for (i = 0; i + H <= k; i += H) {
    __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), absm);
    bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, lim, _CMP_LE_OQ)) ^ 0xFF;
    vmax = _mm256_max_ps(vmax, a);
  }
  _mm256_storeu_ps(m8, vmax);
  amax = 0.0f;
  for (int j = 0; j < H; j++)
    amax = m8[j] > amax ? m8[j] : amax;
  for (; i < k; i++) {
    float a = x[i] < 0 ? -x[i] : x[i];
    if (!(a <= 3.40282347e+38f))
      bad = 1;
    else if (a > amax)
      amax = a;
  }
  if (bad)
    return QL_ENONFINITE;
  scale = ql__cpu_rnd_src(src, amax / 127.5f);
  if (scale < QL_I8_SCALE_EPS)
    scale = QL_I8_SCALE_EPS;
  inv = 1.0f / scale;
  const __m256 vinv = _mm256_set1_ps(inv);
  for (i = 0; i + H <= k; i += H) {
    __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv));
    __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(q),
                                _mm256_extracti128_si256(q, 1));
    _mm_storel_epi64((__m128i *)(xq + i), _mm_packs_epi16(w, w));
  }
  /* the tail as the reference writes it */
  for (; i < k; i++) {
    float t = rintf(x[i] * inv);
    xq[i] = (int8_t)(t <= -128.0f ? -128 : t >= 127.0f ? 127 : (int)t);
  }
  *sx = scale;
  return 0;
}

/* The e4m3 rule for 8 values (e4m3_16 of kern_avx512.c says how). */
INL void e4m3_8(__m256 x, __m256 vs, __m256i *code, __m256 *val) {
  const __m256 lim = _mm256_set1_ps(QL_E4M3_MAX);
  __m256 t = _mm256_min_ps(_mm256_max_ps(_mm256_div_ps(x, vs),
                                         _mm256_sub_ps(_mm256_setzero_ps(), lim)),
                           lim);
  __m256i bits = _mm256_castps_si256(t);
  __m256i a = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF));
  __m256i sgn = _mm256_andnot_si256(_mm256_set1_epi32(0x7FFFFFFF), bits);
  __m256i r = _mm256_add_epi32(
      _mm256_add_epi32(a, _mm256_set1_epi32(0x7FFFF)),
      _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1)));
  __m256i cn = _mm256_sub_epi32(_mm256_srli_epi32(r, 20),
                                _mm256_set1_epi32(120 << 3));
  __m256 ss = _mm256_round_ps(
      _mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(512.0f)),
      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256i ns = _mm256_cvttps_epi32(ss); /* exact: an integer 0..8 */
  __m256i sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x3C800000), a);
  __m256i c = _mm256_blendv_epi8(cn, ns, sub);
  *code = _mm256_or_si256(c, _mm256_srli_epi32(sgn, 24));
  if (val != NULL) {
    __m256 vn = _mm256_castsi256_ps(
        _mm256_and_si256(r, _mm256_set1_epi32((int)0xFFF00000u)));
    __m256 vsub = _mm256_mul_ps(ss, _mm256_set1_ps(0x1p-9f));
    __m256 mag = _mm256_blendv_ps(vn, vsub, _mm256_castsi256_ps(sub));
    *val = _mm256_castsi256_ps(_mm256_or_si256(
        _mm256_castps_si256(
            _mm256_mul_ps(mag, _mm256_set1_ps(QL_CPU_F8_XSCALE))),
        sgn));
  }
}

static TGT int quant_row_e4m3(ql_dtype src, const float *x, int64_t k,
                              uint8_t *xc, float *xe, float *sx) {
  const __m256 lim = _mm256_set1_ps(3.40282347e+38f);
  const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 vmax = _mm256_setzero_ps();
  int bad = 0;
  float amax, scale, m8[H];
  int64_t i;

  for (i = 0; i + H <= k; i += H) {
    __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), absm);
    bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, lim, _CMP_LE_OQ)) ^ 0xFF;
    vmax = _mm256_max_ps(vmax, a);
  }
  _mm256_storeu_ps(m8, vmax);
  amax = 0.0f;
  for (int j = 0; j < H; j++)
    amax = m8[j] > amax ? m8[j] : amax;
  for (; i < k; i++) {
    float a = x[i] < 0 ? -x[i] : x[i];
    if (!(a <= 3.40282347e+38f))
      bad = 1;
    else if (a > amax)
      amax = a;
  }
  if (bad)
    return QL_ENONFINITE;
  scale = ql__cpu_e4m3_scale(src, amax);
  const __m256 vs = _mm256_set1_ps(scale);
  for (i = 0; i + H <= k; i += H) {
    __m256i code;
    __m256 val;
    e4m3_8(_mm256_loadu_ps(x + i), vs, &code, xe != NULL ? &val : NULL);
    __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(code),
                                 _mm256_extracti128_si256(code, 1));
    _mm_storel_epi64((__m128i *)(xc + i), _mm_packus_epi16(w, w));
    if (xe != NULL)
      _mm256_storeu_ps(xe + i, val);
  }
  /* the tail as the reference writes it */
  for (; i < k; i++) {
    float t = x[i] / scale;
    t = t < -QL_E4M3_MAX ? -QL_E4M3_MAX : t > QL_E4M3_MAX ? QL_E4M3_MAX : t;
    xc[i] = ql_f32_to_e4m3(t);
    if (xe != NULL)
      xe[i] = ql_e4m3_to_f32(xc[i]) * QL_CPU_F8_XSCALE;
  }
  *sx = scale;
  return 0;
}

/* ------------------------------------------------------------ AQ */

#define AQ_SUFFIX plain
#define AQ_TGT __attribute__((target("avx2,fma,f16c")))
#define AQ_VNNI 0
#include "kern_avx2_aq.h"
#undef AQ_SUFFIX
#undef AQ_TGT
#undef AQ_VNNI

#define AQ_SUFFIX vnni
#define AQ_TGT __attribute__((target("avx2,fma,f16c,avxvnni")))
#define AQ_VNNI 1
#include "kern_avx2_aq.h"
#undef AQ_SUFFIX
#undef AQ_TGT
#undef AQ_VNNI

const ql__cpu_kernels ql__cpu_kernels_avx2 = {
    wo_q4g, wo_q8c, aq_q4g_plain, aq_q8c_plain, quant_row,
    wo_q8b, wo_f8r, aq_f8r, quant_row_e4m3};
const ql__cpu_kernels ql__cpu_kernels_avx2vnni = {
    wo_q4g, wo_q8c, aq_q4g_vnni, aq_q8c_vnni, quant_row,
    wo_q8b, wo_f8r, aq_f8r, quant_row_e4m3};

#endif /* __x86_64__ */
