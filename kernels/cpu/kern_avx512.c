/*
 * kern_avx512.c - the AVX-512 (F/BW/VL/VNNI) level of the CPU kernels
 * (cpu.h). Every function carries the target attribute, so the rest of
 * the build stays portable; they run only after level.c found the
 * features. Lane j of every vector is row j of a 16-row tile; the
 * arithmetic of each lane is, operation for operation, that of kern_c.c
 * and of the reference (no FMA: mul and add round separately, and the
 * library is compiled with -ffp-contract=off so that the compiler does
 * not fuse them either), except where the reference itself has an FMA
 * (q4g and q8c WO) or an FMA is exact: the asymmetric q8b dequantization of a
 * layout whose scales allow it (cpu.h, fma_dequant), and the f8r AQ sums,
 * whose products are exact (see f8r below).
 *
 * Decoding without a conversion instruction: an 8-bit byte OR-ed into
 * the mantissa of 2^23 is the float 2^23 + u, and subtracting 2^23 + 128
 * gives q exactly; a 4-bit code indexes a table of its 16 values
 * (wo_q4g_blk); e4m3 codes are moved into the exponent and mantissa
 * fields of an f32 (f8_dec).
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#include "cpu.h"

#define TGT                                                                    \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,"       \
                        "f16c")))
#define INL static inline __attribute__((always_inline)) TGT

#define T QL_CPU_TILE

/* The loops over tiles and rows of a block have constant trip counts
 * once inlined; unrolled, their vectors live in registers. */
#define UNROLL _Pragma("GCC unroll 8")

/* Software prefetch PF_BYTES ahead in a tile's stream: with 2-4 tiles per
 * pass there are as many streams per core, which the hardware prefetcher
 * alone does not keep far enough ahead for a memory-bound GEMV. Past the
 * end of a tile it touches the next tile or the end of the layout: a
 * prefetch never faults. */
#define PF_BYTES 2048
#define PREFETCH(ptr) _mm_prefetch((const char *)(ptr) + PF_BYTES, _MM_HINT_T0)
#define PF_AT(ptr, dist) _mm_prefetch((const char *)(ptr) + (dist), _MM_HINT_T0)

/* 16 scale/zero values of dtype dt, widened exactly to f32. */
INL __m512 load16(ql_dtype dt, const uint8_t *p) {
  if (dt == QL_DTYPE_F32)
    return _mm512_loadu_ps(p);
  if (dt == QL_DTYPE_F16)
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

INL __mmask16 rows_mask(const ql__cpu_packed *p, int64_t t) {
  int64_t rows = p->n - t * T;
  return rows >= T ? (__mmask16)0xFFFF : (__mmask16)((1u << rows) - 1u);
}

/* y[r][tile t] = v (+ bias), the rows of the tile that exist. */
INL void store_row(const ql__cpu_packed *p, int64_t t, __m512 v,
                   const float *bias, float *yr) {
  __mmask16 mk = rows_mask(p, t);
  if (bias != NULL)
    v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, bias + t * T));
  _mm512_mask_storeu_ps(yr + t * T, mk, v);
}

/*
 * acc += Σ_{i<4} u[i]·x[i] per dword lane (vpdpbusd), u the unsigned bytes
 * of w, x the signed bytes of x (the same 4 in every lane: bcast32). In
 * asm because GCC 12 copies the accumulator of _mm512_dpbusd_epi32 to a
 * scratch register and back around every call: two moves per dot product,
 * which in the large-M blocks costs about a third of the VNNI peak.
 */
INL __m512i dpbusd_r(__m512i acc, __m512i w, __m512i x) {
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x));
  return acc;
}

INL __m512i bcast32(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

/* ------------------------------------------------------------ WO q4g */

/*
 * tb tiles (starting at t) x mb rows of x (starting at m0), all of K.
 * Called with constant tb and mb so that the accumulators stay in
 * registers. The zero is factored out of each group (ql_linear_wo_ref):
 * per weight one decode and one FMA per row; per group s·a + z·Σx. The
 * decode is a shift and a lookup: vpermps reads only the low 4 bits of
 * each index lane, so the nibble needs no mask and indexes a table of
 * the 16 values q = -8..7 (exact floats: the same bytes as the mask into
 * the mantissa of 2^23 and subtraction it replaces, one operation less).
 * On a Zen 4 VM, 4096x4096 and 14336x4096 at M = 16: 0.67-0.69 of the
 * FMA peak with the mask and subtraction, 0.77-0.78 with the lookup
 * (qlinear-bench, alternating builds).
 */
INL void wo_q4g_blk(const ql__cpu_packed *p, const float *x, const float *xs,
                    int64_t m0, const int mb, int64_t t, const int tb,
                    const float *bias, float *y) {
  __m512 acc[4][4], ga[4][4];
  const uint8_t *tp[4];
  const __m512 qtab = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2,
                                     3, 4, 5, 6, 7);
  const size_t esz = ql_dtype_size(p->sdt);
  const int64_t K = p->k, G = p->groups;
  const float *xr[4];

  UNROLL
  for (int a = 0; a < tb; a++) {
    tp[a] = p->data + (size_t)(t + a) * p->tile_bytes;
    UNROLL
    for (int r = 0; r < mb; r++)
      acc[a][r] = _mm512_setzero_ps();
  }
  UNROLL
  for (int r = 0; r < mb; r++)
    xr[r] = x + (size_t)(m0 + r) * (size_t)K;

  for (int64_t g = 0; g < G; g++) {
    const uint8_t *d[4];
    int64_t nb = ql__cpu_q4g_blocks(p, g), k0 = g * (int64_t)p->gs;
    UNROLL
    for (int a = 0; a < tb; a++) {
      d[a] = tp[a] + (size_t)g * p->group_bytes + p->sz_bytes;
      UNROLL
      for (int r = 0; r < mb; r++)
        ga[a][r] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++, k0 += QL_CPU_Q4G_KB) {
      __m512i v[4];
      UNROLL
      for (int a = 0; a < tb; a++) {
        v[a] =
            _mm512_load_si512((const void *)(d[a] + (size_t)b * QL_CPU_BLOCK));
        PREFETCH(d[a] + (size_t)b * QL_CPU_BLOCK);
      }
#define WO_Q4G_STEP(i, u_of)                                                   \
  do {                                                                         \
    UNROLL                                                                     \
    for (int a = 0; a < tb; a++) {                                             \
      __m512 qf = _mm512_permutexvar_ps(u_of, qtab);                           \
      UNROLL                                                                   \
      for (int r = 0; r < mb; r++)                                             \
        ga[a][r] =                                                             \
            _mm512_fmadd_ps(_mm512_set1_ps(xr[r][k0 + (i)]), qf, ga[a][r]);    \
    }                                                                          \
  } while (0)
      if (K - k0 >= QL_CPU_Q4G_KB) {
        WO_Q4G_STEP(0, v[a]);
        WO_Q4G_STEP(1, _mm512_srli_epi32(v[a], 8));
        WO_Q4G_STEP(2, _mm512_srli_epi32(v[a], 16));
        WO_Q4G_STEP(3, _mm512_srli_epi32(v[a], 24));
        WO_Q4G_STEP(4, _mm512_srli_epi32(v[a], 4));
        WO_Q4G_STEP(5, _mm512_srli_epi32(v[a], 12));
        WO_Q4G_STEP(6, _mm512_srli_epi32(v[a], 20));
        WO_Q4G_STEP(7, _mm512_srli_epi32(v[a], 28));
      } else {
        int kn = (int)(K - k0);
        for (int i = 0; i < kn; i++) {
          __m128i sh = _mm_cvtsi32_si128((i & 3) * 8 + (i & 4));
          WO_Q4G_STEP(i, _mm512_srl_epi32(v[a], sh));
        }
      }
#undef WO_Q4G_STEP
    }
    UNROLL
    for (int a = 0; a < tb; a++) {
      const uint8_t *gp = tp[a] + (size_t)g * p->group_bytes;
      __m512 s = load16(p->sdt, gp), z = load16(p->sdt, gp + T * esz);
      UNROLL
      for (int r = 0; r < mb; r++) {
        __m512 sx = _mm512_set1_ps(xs[(size_t)(m0 + r) * (size_t)G + g]);
        acc[a][r] = _mm512_add_ps(
            acc[a][r], _mm512_fmadd_ps(z, sx, _mm512_mul_ps(s, ga[a][r])));
      }
    }
  }
  UNROLL
  for (int a = 0; a < tb; a++)
    UNROLL
  for (int r = 0; r < mb; r++)
    store_row(p, t + a, acc[a][r], bias, y + (size_t)(m0 + r) * (size_t)p->n);
}

/* ------------------------------------------------------------ WO q8c */

INL void wo_q8c_blk(const ql__cpu_packed *p, const float *x, int64_t m0,
                    const int mb, int64_t t, const int tb, const float *bias,
                    float *y) {
  __m512 acc[4][4], s[4];
  const uint8_t *tp[4];
  const __m512i byte = _mm512_set1_epi32(0xFF);
  const __m512i magic = _mm512_set1_epi32(0x4B000000);
  const __m512 magic128 = _mm512_set1_ps(8388736.0f); /* 2^23 + 128 */
  const int64_t K = p->k, nb = (K + QL_CPU_Q8C_KB - 1) / QL_CPU_Q8C_KB;
  const float *xr[4];

  UNROLL
  for (int a = 0; a < tb; a++) {
    tp[a] = p->data + (size_t)(t + a) * p->tile_bytes;
    s[a] = _mm512_load_ps((const void *)tp[a]);
    UNROLL
    for (int r = 0; r < mb; r++)
      acc[a][r] = _mm512_setzero_ps();
  }
  UNROLL
  for (int r = 0; r < mb; r++)
    xr[r] = x + (size_t)(m0 + r) * (size_t)K;

  for (int64_t b = 0, k0 = 0; b < nb; b++, k0 += QL_CPU_Q8C_KB) {
    __m512i v[4];
    UNROLL
    for (int a = 0; a < tb; a++) {
      v[a] = _mm512_load_si512(
          (const void *)(tp[a] + QL_CPU_BLOCK + (size_t)b * QL_CPU_BLOCK));
      PREFETCH(tp[a] + QL_CPU_BLOCK + (size_t)b * QL_CPU_BLOCK);
    }
#define WO_Q8C_STEP(i, u_of)                                                   \
  do {                                                                         \
    UNROLL                                                                     \
    for (int a = 0; a < tb; a++) {                                             \
      __m512i u = _mm512_ternarylogic_epi32(u_of, byte, magic, 0xEA);          \
      __m512 qf = _mm512_sub_ps(_mm512_castsi512_ps(u), magic128);             \
      UNROLL                                                                   \
      for (int r = 0; r < mb; r++)                                             \
        acc[a][r] =                                                            \
            _mm512_fmadd_ps(_mm512_set1_ps(xr[r][k0 + (i)]), qf, acc[a][r]);   \
    }                                                                          \
  } while (0)
    if (K - k0 >= QL_CPU_Q8C_KB) {
      WO_Q8C_STEP(0, v[a]);
      WO_Q8C_STEP(1, _mm512_srli_epi32(v[a], 8));
      WO_Q8C_STEP(2, _mm512_srli_epi32(v[a], 16));
      WO_Q8C_STEP(3, _mm512_srli_epi32(v[a], 24));
    } else {
      int kn = (int)(K - k0);
      for (int i = 0; i < kn; i++) {
        __m128i sh = _mm_cvtsi32_si128(i * 8);
        WO_Q8C_STEP(i, _mm512_srl_epi32(v[a], sh));
      }
    }
#undef WO_Q8C_STEP
  }
  UNROLL
  for (int a = 0; a < tb; a++)
    UNROLL
  for (int r = 0; r < mb; r++)
    store_row(p, t + a, _mm512_mul_ps(s[a], acc[a][r]), bias,
              y + (size_t)(m0 + r) * (size_t)p->n);
}

/* ------------------------------------------------------------ WO q8b */

/*
 * q8c's loop with a scale (and zero) per block of B k: ŵ = (float)w·s, or
 * (float)w·s + z when asymmetric, as two roundings or, where the layout
 * allows it (fma_dequant), one exact FMA.
 */
INL void wo_q8b_blk(const int asym, const int fma, const ql__cpu_packed *p,
                    const float *x, int64_t m0, const int mb, int64_t t,
                    const int tb, const float *bias, float *y) {
  __m512 acc[4][4];
  const uint8_t *tp[4];
  const __m512i byte = _mm512_set1_epi32(0xFF);
  const __m512i magic = _mm512_set1_epi32(0x4B000000);
  const __m512 magic128 = _mm512_set1_ps(8388736.0f); /* 2^23 + 128 */
  const size_t esz = ql_dtype_size(p->sdt);
  const int64_t K = p->k, bpg = p->gs / QL_CPU_Q8C_KB;
  const float *xr[4];

  UNROLL
  for (int a = 0; a < tb; a++) {
    tp[a] = p->data + (size_t)(t + a) * p->tile_bytes;
    UNROLL
    for (int r = 0; r < mb; r++)
      acc[a][r] = _mm512_setzero_ps();
  }
  UNROLL
  for (int r = 0; r < mb; r++)
    xr[r] = x + (size_t)(m0 + r) * (size_t)K;

  for (int64_t g = 0, k0 = 0; k0 < K; g++) {
    __m512 s[4], z[4];
    const uint8_t *d[4];
    int64_t nb = (K - k0 + QL_CPU_Q8C_KB - 1) / QL_CPU_Q8C_KB;
    if (nb > bpg)
      nb = bpg;
    UNROLL
    for (int a = 0; a < tb; a++) {
      const uint8_t *gp = tp[a] + (size_t)g * p->group_bytes;
      s[a] = load16(p->sdt, gp);
      z[a] = asym ? load16(p->sdt, gp + T * esz) : _mm512_setzero_ps();
      d[a] = tp[a] + p->sz_bytes + (size_t)(g * bpg) * QL_CPU_BLOCK;
    }
    for (int64_t b = 0; b < nb; b++, k0 += QL_CPU_Q8C_KB) {
      __m512i v[4];
      UNROLL
      for (int a = 0; a < tb; a++) {
        v[a] =
            _mm512_load_si512((const void *)(d[a] + (size_t)b * QL_CPU_BLOCK));
        PREFETCH(d[a] + (size_t)b * QL_CPU_BLOCK);
      }
#define WO_Q8B_STEP(i, u_of)                                                   \
  do {                                                                         \
    UNROLL                                                                     \
    for (int a = 0; a < tb; a++) {                                             \
      __m512i u = _mm512_ternarylogic_epi32(u_of, byte, magic, 0xEA);          \
      __m512 qf = _mm512_sub_ps(_mm512_castsi512_ps(u), magic128);             \
      __m512 wq = !asym ? _mm512_mul_ps(qf, s[a])                              \
                  : fma ? _mm512_fmadd_ps(qf, s[a], z[a])                      \
                        : _mm512_add_ps(_mm512_mul_ps(qf, s[a]), z[a]);        \
      UNROLL                                                                   \
      for (int r = 0; r < mb; r++)                                             \
        acc[a][r] = _mm512_add_ps(                                             \
            acc[a][r], _mm512_mul_ps(_mm512_set1_ps(xr[r][k0 + (i)]), wq));    \
    }                                                                          \
  } while (0)
      if (K - k0 >= QL_CPU_Q8C_KB) {
        WO_Q8B_STEP(0, v[a]);
        WO_Q8B_STEP(1, _mm512_srli_epi32(v[a], 8));
        WO_Q8B_STEP(2, _mm512_srli_epi32(v[a], 16));
        WO_Q8B_STEP(3, _mm512_srli_epi32(v[a], 24));
      } else {
        int kn = (int)(K - k0);
        for (int i = 0; i < kn; i++) {
          __m128i sh = _mm_cvtsi32_si128(i * 8);
          WO_Q8B_STEP(i, _mm512_srl_epi32(v[a], sh));
        }
      }
#undef WO_Q8B_STEP
    }
  }
  UNROLL
  for (int a = 0; a < tb; a++)
    UNROLL
  for (int r = 0; r < mb; r++)
    store_row(p, t + a, acc[a][r], bias, y + (size_t)(m0 + r) * (size_t)p->n);
}

/* ------------------------------------------------------------ f8r */

/*
 * Decoding e4m3 without a table: the code's sign bit moved to bit 31 and
 * its 7 exponent+mantissa bits em to bits 26..20 is the f32 whose value
 * is the code's value times 2^-120: for exponent e >= 1 it reads
 * 2^(e-127)·(1 + m/8), and for e = 0 (the e4m3 subnormals m·2^-9) it is
 * the f32 subnormal m·2^20·2^-149 = m·2^-129. Moving the byte to the top
 * of the dword (shift left) and shifting right arithmetically by 4 puts
 * the sign at bit 31 and em at 26..20; the AND clears the copies of the
 * sign (bits 30..27) and the neighbouring codes (bits 19..0). Byte 3 is
 * at the top already.
 *
 * So d = e4m3(w)·2^-120 exactly, and the scaling is folded into a product
 * the reference makes anyway:
 *  WO: fl(d·(s·2^120)) = fl(e4m3(w)·s), the reference's ŵ: both are the
 *      same real product rounded once, when s·2^120 is finite (f8_fold;
 *      else fl(fl(d·2^120)·s), the first product exact).
 *  AQ: x arrives as xe = e4m3(xq)·2^119 (ql__cpu_xq), so d·xe =
 *      e4m3(w)·e4m3(xq)/2, exact in f32: at most 4+4 significant bits,
 *      and a non-zero product is at least 2^-9·2^-9/2 = 2^-19 (normal)
 *      and at most 448²/2. The reference adds the exact products
 *      e4m3(w)·e4m3(xq) in f32 from +0 in increasing k; halving every
 *      term halves every partial sum and its rounding (all non-zero sums
 *      lie between 2^-19 and K·448², far from subnormals and overflow),
 *      so the sum here is exactly half the reference's acc, and 2·sum is
 *      acc. Since each product is exact, fl(acc + d·xe) is also what one
 *      FMA gives, which is what the loop uses.
 * The subnormal d needs IEEE subnormal inputs: a thread with MXCSR.DAZ
 * set takes the C level's kernels instead (ql__cpu_daz).
 */
INL __m512 f8_dec(__m512i v, const int i) {
  __m512i t = i == 3 ? v : _mm512_slli_epi32(v, 24 - 8 * i);
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_srai_epi32(t, 4),
                                              _mm512_set1_epi32(0x87F00000)));
}

/*
 * All four codes of each dword, d[i] = f8_dec(v, i), in 9 operations
 * instead of 11: a 16-bit arithmetic shift by 4 does the step for the
 * high byte of both words at once (bytes 3 and 1; bytes 2 and 0 after a
 * 16-bit shift left by 8), and the low word's result is moved up by 16
 * bits. The sign copies land in bits 30..27 (or 14..11) and the
 * neighbouring byte's bits below bit 20 (4), which the AND clears as in
 * f8_dec.
 */
INL void f8_dec4(__m512i v, __m512 d[4]) {
  const __m512i msk = _mm512_set1_epi32(0x87F00000);
  __m512i hi = _mm512_srai_epi16(v, 4);
  __m512i lo = _mm512_srai_epi16(_mm512_slli_epi16(v, 8), 4);
  d[0] = _mm512_castsi512_ps(
      _mm512_and_si512(_mm512_slli_epi32(lo, 16), msk));
  d[1] = _mm512_castsi512_ps(
      _mm512_and_si512(_mm512_slli_epi32(hi, 16), msk));
  d[2] = _mm512_castsi512_ps(_mm512_and_si512(lo, msk));
  d[3] = _mm512_castsi512_ps(_mm512_and_si512(hi, msk));
}

/* WO f8r: ŵ = e4m3(w)·s, then acc += x·ŵ in increasing k. */
INL void wo_f8r_blk(const int fold, const ql__cpu_packed *p, const float *x,
                    int64_t m0, const int mb, int64_t t, const int tb,
                    const float *bias, float *y) {
  __m512 acc[4][4], s[4];
  const uint8_t *tp[4];
  const __m512 two120 = _mm512_set1_ps(0x1p120f);
  const int64_t K = p->k, nb = ql__cpu_kblocks(p);
  const float *xr[4];

  UNROLL
  for (int a = 0; a < tb; a++) {
    tp[a] = p->data + (size_t)(t + a) * p->tile_bytes;
    s[a] = _mm512_load_ps((const void *)tp[a]);
    if (fold)
      s[a] = _mm512_mul_ps(s[a], two120); /* exact: finite (f8_fold) */
    UNROLL
    for (int r = 0; r < mb; r++)
      acc[a][r] = _mm512_setzero_ps();
  }
  UNROLL
  for (int r = 0; r < mb; r++)
    xr[r] = x + (size_t)(m0 + r) * (size_t)K;

  for (int64_t b = 0, k0 = 0; b < nb; b++, k0 += QL_CPU_Q8C_KB) {
    /* the padding codes past K decode to 0 and are never used */
    const int kn = K - k0 < QL_CPU_Q8C_KB ? (int)(K - k0) : QL_CPU_Q8C_KB;
    __m512 d[4][4];
    UNROLL
    for (int a = 0; a < tb; a++) {
      const uint8_t *blk = tp[a] + QL_CPU_BLOCK + (size_t)b * QL_CPU_BLOCK;
      f8_dec4(_mm512_load_si512((const void *)blk), d[a]);
      PREFETCH(blk);
    }
#define WO_F8R_STEP(i)                                                         \
  do {                                                                         \
    UNROLL                                                                     \
    for (int a = 0; a < tb; a++) {                                             \
      __m512 wq = fold ? _mm512_mul_ps(d[a][i], s[a])                          \
                       : _mm512_mul_ps(_mm512_mul_ps(d[a][i], two120), s[a]);  \
      UNROLL                                                                   \
      for (int r = 0; r < mb; r++)                                             \
        acc[a][r] = _mm512_add_ps(                                             \
            acc[a][r], _mm512_mul_ps(_mm512_set1_ps(xr[r][k0 + (i)]), wq));    \
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
  for (int a = 0; a < tb; a++)
    UNROLL
  for (int r = 0; r < mb; r++)
    store_row(p, t + a, acc[a][r], bias, y + (size_t)(m0 + r) * (size_t)p->n);
}

/* AQ f8r: sum = Σ d·xe (one FMA each, exact products), acc = 2·sum, then
 * the reference's y = acc·(sx·sw) (+ b). All of kp: the padding codes are
 * +0 on both sides and add ±0, which changes no sum (see kern_c.c). */
INL void aq_f8r_blk(const ql__cpu_packed *p, const ql__cpu_xq *xq, int64_t m0,
                    const int mb, int64_t t, const int tb, const float *bias,
                    float *y) {
  __m512 acc[4][4];
  const uint8_t *tp[4];
  const float *xr[4];
  const int64_t nb = xq->kp / QL_CPU_Q8C_KB;

  UNROLL
  for (int a = 0; a < tb; a++) {
    tp[a] = p->data + (size_t)(t + a) * p->tile_bytes;
    UNROLL
    for (int r = 0; r < mb; r++)
      acc[a][r] = _mm512_setzero_ps();
  }
  UNROLL
  for (int r = 0; r < mb; r++)
    xr[r] = xq->xe + (size_t)(m0 + r) * (size_t)xq->kp;
  for (int64_t b = 0; b < nb; b++) {
    __m512 d[4][4];
    const int64_t k0 = b * QL_CPU_Q8C_KB;
    UNROLL
    for (int a = 0; a < tb; a++) {
      const uint8_t *blk = tp[a] + QL_CPU_BLOCK + (size_t)b * QL_CPU_BLOCK;
      f8_dec4(_mm512_load_si512((const void *)blk), d[a]);
      PREFETCH(blk);
    }
    UNROLL
    for (int i = 0; i < QL_CPU_Q8C_KB; i++) {
      UNROLL
      for (int r = 0; r < mb; r++) {
        __m512 xb = _mm512_set1_ps(xr[r][k0 + i]);
        UNROLL
        for (int a = 0; a < tb; a++)
          acc[a][r] = _mm512_fmadd_ps(d[a][i], xb, acc[a][r]);
      }
    }
  }
  UNROLL
  for (int a = 0; a < tb; a++) {
    __m512 s = _mm512_load_ps((const void *)tp[a]);
    UNROLL
    for (int r = 0; r < mb; r++) {
      __m512 sxw = _mm512_mul_ps(_mm512_set1_ps(xq->sx[m0 + r]), s);
      __m512 v = _mm512_mul_ps(
          _mm512_mul_ps(acc[a][r], _mm512_set1_ps(2.0f)), sxw);
      store_row(p, t + a, v, bias, y + (size_t)(m0 + r) * (size_t)p->n);
    }
  }
}

/*
 * The large-M block of f8r AQ: 4 tiles x 6 rows, 24 accumulators as
 * variables (see aq_q8c_txr), each decoded weight vector feeding 6 FMAs
 * and each broadcast of x 4. Same operations per lane as aq_f8r_blk.
 */
#define F8_ACC(r)                                                              \
  __m512 c0##r = _mm512_setzero_ps(), c1##r = c0##r, c2##r = c0##r,           \
         c3##r = c0##r;
#define F8_ROW(r)                                                              \
  xv = _mm512_set1_ps(xb[(r)*ld]);                                             \
  c0##r = _mm512_fmadd_ps(w0, xv, c0##r);                                      \
  c1##r = _mm512_fmadd_ps(w1, xv, c1##r);                                      \
  c2##r = _mm512_fmadd_ps(w2, xv, c2##r);                                      \
  c3##r = _mm512_fmadd_ps(w3, xv, c3##r);
#define F8_STEP(i)                                                             \
  do {                                                                         \
    const float *xb = x0 + k0 + (i);                                           \
    __m512 w0 = f8_dec(_mm512_load_si512((const void *)d), i);                 \
    __m512 w1 = f8_dec(_mm512_load_si512((const void *)(d + tbytes)), i);      \
    __m512 w2 = f8_dec(_mm512_load_si512((const void *)(d + 2 * tbytes)), i);  \
    __m512 w3 = f8_dec(_mm512_load_si512((const void *)(d + 3 * tbytes)), i);  \
    __m512 xv;                                                                 \
    F8_ROW(0) F8_ROW(1) F8_ROW(2) F8_ROW(3) F8_ROW(4) F8_ROW(5)                \
  } while (0)

INL void aq_f8r_4x6(const ql__cpu_packed *p, const ql__cpu_xq *xq, int64_t m0,
                    int64_t t, const float *bias, float *y) {
  const size_t tbytes = p->tile_bytes;
  const uint8_t *d0 = p->data + (size_t)t * tbytes + QL_CPU_BLOCK;
  const float *x0 = xq->xe + (size_t)m0 * (size_t)xq->kp;
  const size_t ld = (size_t)xq->kp;
  const int64_t nb = xq->kp / QL_CPU_Q8C_KB;
  F8_ACC(0) F8_ACC(1) F8_ACC(2) F8_ACC(3) F8_ACC(4) F8_ACC(5)
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t *d = d0 + (size_t)b * QL_CPU_BLOCK;
    const int64_t k0 = b * QL_CPU_Q8C_KB;
    F8_STEP(0);
    F8_STEP(1);
    F8_STEP(2);
    F8_STEP(3);
  }
  __m512 acc[4][6] = {{c00, c01, c02, c03, c04, c05},
                      {c10, c11, c12, c13, c14, c15},
                      {c20, c21, c22, c23, c24, c25},
                      {c30, c31, c32, c33, c34, c35}};
  UNROLL
  for (int a = 0; a < 4; a++) {
    __m512 s =
        _mm512_load_ps((const void *)(p->data + (size_t)(t + a) * tbytes));
    UNROLL
    for (int r = 0; r < 6; r++) {
      __m512 sxw = _mm512_mul_ps(_mm512_set1_ps(xq->sx[m0 + r]), s);
      __m512 v = _mm512_mul_ps(
          _mm512_mul_ps(acc[a][r], _mm512_set1_ps(2.0f)), sxw);
      store_row(p, t + a, v, bias, y + (size_t)(m0 + r) * (size_t)p->n);
    }
  }
}
#undef F8_ACC
#undef F8_ROW
#undef F8_STEP

/*
 * Decode batches over K chunks. A batch of 9-24 rows (q8c, passes of 3
 * tiles x up to 8 rows; 5-24 for q4g, 4 tiles x up to 4) takes several
 * passes. In whole-K passes the first reads the weight from memory and
 * the others compute from cache after it: the batch costs the read plus
 * the other passes' compute. Over K chunks (q8c Q8_KC blocks, 3 tiles x
 * 6 KiB; q4g Q4_KC groups, 4 tiles x about 4 KiB at group 128) every
 * pass of 3-4 tiles prefetches the next chunk, so the stream runs during
 * all the passes' compute (a prefetch in the first pass only kept less
 * of it going), and the passes after the first find the chunk in L1/L2;
 * q4g's passes of 1-3 left-over rows prefetch their own stream only. The
 * sums go to sv between chunks: q8c's int32 sums are exact and q4g's f32
 * sums still add the groups in order, so the chunking changes no bit. On
 * the 2-core Zen 5 VM, 4096x4096 M = 16 from memory: q8c AQ from
 * 0.68-0.75 to 0.78-0.88 of the read loop's speed, q4g from 0.40-0.44 to
 * 0.45-0.52; a weight held in L3 loses up to 5% to the chunks' saved sums
 * and prefetches (qlinear-bench, alternating builds).
 *
 * q4g from 8 rows on goes back to whole-K passes, with the next group of
 * 4 tiles prefetched into L2 by the second pass (the first is the one
 * that reads its own group from memory). At 8 rows or more q4g's passes
 * are bound by the VNNI units, not by memory, and the chunks' saved sums
 * and extra L1 traffic cost more than they hide: on a 2-core Zen 4 VM
 * (its VNNI peak 4.6e11 multiply-adds/s, reads 32 GB/s), 4096x4096 and
 * 14336x4096 at M = 16, 0.70-0.76 of the VNNI peak with the chunks,
 * 0.76-0.79 in whole-K passes, 0.80-0.85 with the prefetch; M = 8
 * 0.68-0.71 and 0.74-0.77 (qlinear-bench, alternating builds).
 */
#define Q8_KC 96
#define Q4_KC 4
#define KC_MAX_ROWS 24
#define Q4_WK_ROWS 8

/* ------------------------------------------------------------ AQ q8c */

INL void aq_q8c_blk(const ql__cpu_packed *p, const ql__cpu_xq *xq, int64_t m0,
                    const int mb, int64_t t, const int tb, const float *bias,
                    float *y) {
  __m512i acc[4][4];
  const uint8_t *tp[4];
  const int8_t *xr[4];
  const int64_t nb = xq->kp / QL_CPU_Q8C_KB;

  UNROLL
  for (int a = 0; a < tb; a++) {
    tp[a] = p->data + (size_t)(t + a) * p->tile_bytes + QL_CPU_BLOCK;
    UNROLL
    for (int r = 0; r < mb; r++)
      acc[a][r] = _mm512_setzero_si512();
  }
  UNROLL
  for (int r = 0; r < mb; r++)
    xr[r] = xq->xq + (size_t)(m0 + r) * (size_t)xq->kp;
  for (int64_t b = 0; b < nb; b++) {
    __m512i v[4];
    UNROLL
    for (int a = 0; a < tb; a++) {
      v[a] =
          _mm512_load_si512((const void *)(tp[a] + (size_t)b * QL_CPU_BLOCK));
      PREFETCH(tp[a] + (size_t)b * QL_CPU_BLOCK);
    }
    UNROLL
    for (int r = 0; r < mb; r++) {
      __m512i xb = bcast32(xr[r] + b * QL_CPU_Q8C_KB);
      UNROLL
      for (int a = 0; a < tb; a++)
        acc[a][r] = dpbusd_r(acc[a][r], v[a], xb);
    }
  }
  /* Σ x·u - 128·Σ x = Σ x·w, exact: both sides wrap modulo 2^32 in
   * vpdpbusd and vpsubd, and the result fits an int32. */
  UNROLL
  for (int a = 0; a < tb; a++) {
    __m512 s = _mm512_load_ps((const void *)(tp[a] - QL_CPU_BLOCK));
    UNROLL
    for (int r = 0; r < mb; r++) {
      __m512i ai =
          _mm512_sub_epi32(acc[a][r], _mm512_set1_epi32(xq->gsum8[m0 + r]));
      __m512 sxw = _mm512_mul_ps(_mm512_set1_ps(xq->sx[m0 + r]), s);
      __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(ai), sxw);
      store_row(p, t + a, v, bias, y + (size_t)(m0 + r) * (size_t)p->n);
    }
  }
}

/*
 * The blocks of q8c AQ from 3 rows up: 4 tiles x R rows (R = 3..6, a
 * constant at each call), 4R accumulators written out as variables (in an
 * array GCC copies them between registers on every step); the rows past R
 * are dead code. Each broadcast of x feeds 4 vpdpbusd: broadcasts take the
 * same vector pipes as the dot products on Zen 4/5, so fewer per product
 * is what brings the block close to the VNNI peak. (A broadcast folded
 * into vpdpbusd, {1to16}, costs a load per product instead: slower.) A
 * batch of 3 rows or more passes over the tiles in blocks of 3 to 6 rows,
 * never of 1 or 2. In whole-K passes the first pass over a tile group
 * (pf 1) prefetches its 4 streams, because a batch of a few rows (decode)
 * is still bound by the weight's read from memory; the passes after it
 * find the group in cache, where prefetches would only take load slots.
 * Over K chunks every pass prefetches the next chunk (pf 2).
 */
#define Q8_ACC(r)                                                              \
  __m512i c0##r = z, c1##r = z, c2##r = z, c3##r = z;                          \
  if (b0 > 0 && R > (r)) {                                                     \
    c0##r = sv[(r)], c1##r = sv[8 + (r)], c2##r = sv[16 + (r)];                \
    if (TB > 3)                                                                \
      c3##r = sv[24 + (r)];                                                    \
  }
#define Q8_SAVE(r)                                                             \
  if (R > (r)) {                                                               \
    sv[(r)] = c0##r, sv[8 + (r)] = c1##r, sv[16 + (r)] = c2##r;                \
    if (TB > 3)                                                                \
      sv[24 + (r)] = c3##r;                                                    \
  }
#define Q8_ROW(r)                                                              \
  if (R > (r)) {                                                               \
    xv = bcast32(xb + (r)*ld);                                                 \
    c0##r = dpbusd_r(c0##r, w0, xv);                                           \
    c1##r = dpbusd_r(c1##r, w1, xv);                                           \
    c2##r = dpbusd_r(c2##r, w2, xv);                                           \
    if (TB > 3)                                                                \
      c3##r = dpbusd_r(c3##r, w3, xv);                                         \
  }
#define Q8_PF(a)                                                               \
  if (TB > (a)) {                                                              \
    if (pf == 1)                                                               \
      PREFETCH(d + (a)*tbytes);                                                \
    else if (pf == 2)                                                          \
      PF_AT(d + (a)*tbytes, Q8_KC * QL_CPU_BLOCK);                             \
  }

/* TB (3 or 4) tiles x R rows (TB 4: R <= 6; TB 3: R <= 8), blocks
 * [b0, b1) of K; sums from sv when b0 > 0, into sv (4 tiles x 8 rows of
 * vectors) when b1 is short of the end, else the epilogue. */
INL void aq_q8c_txr(const ql__cpu_packed *p, const ql__cpu_xq *xq, int64_t m0,
                    const int TB, const int R, const int pf, int64_t t,
                    int64_t b0, int64_t b1, __m512i *sv, const float *bias,
                    float *y) {
  const size_t tbytes = p->tile_bytes;
  const uint8_t *d0 = p->data + (size_t)t * tbytes + QL_CPU_BLOCK;
  const int8_t *x0 = xq->xq + (size_t)m0 * (size_t)xq->kp;
  const size_t ld = (size_t)xq->kp;
  const __m512i z = _mm512_setzero_si512();
  Q8_ACC(0) Q8_ACC(1) Q8_ACC(2) Q8_ACC(3) Q8_ACC(4) Q8_ACC(5) Q8_ACC(6)
  Q8_ACC(7)
  for (int64_t b = b0; b < b1; b++) {
    const uint8_t *d = d0 + (size_t)b * QL_CPU_BLOCK;
    __m512i w0 = _mm512_load_si512((const void *)d);
    __m512i w1 = _mm512_load_si512((const void *)(d + tbytes));
    __m512i w2 = _mm512_load_si512((const void *)(d + 2 * tbytes));
    __m512i w3 = z;
    if (TB > 3)
      w3 = _mm512_load_si512((const void *)(d + 3 * tbytes));
    Q8_PF(0) Q8_PF(1) Q8_PF(2) Q8_PF(3)
    const int8_t *xb = x0 + b * QL_CPU_Q8C_KB;
    __m512i xv;
    Q8_ROW(0) Q8_ROW(1) Q8_ROW(2) Q8_ROW(3) Q8_ROW(4) Q8_ROW(5) Q8_ROW(6)
    Q8_ROW(7)
  }
  if (b1 < xq->kp / QL_CPU_Q8C_KB) {
    Q8_SAVE(0) Q8_SAVE(1) Q8_SAVE(2) Q8_SAVE(3) Q8_SAVE(4) Q8_SAVE(5)
    Q8_SAVE(6) Q8_SAVE(7)
    return;
  }
  __m512i acc[4][8] = {{c00, c01, c02, c03, c04, c05, c06, c07},
                       {c10, c11, c12, c13, c14, c15, c16, c17},
                       {c20, c21, c22, c23, c24, c25, c26, c27},
                       {c30, c31, c32, c33, c34, c35, c36, c37}};
  UNROLL
  for (int a = 0; a < TB; a++) {
    __m512 s =
        _mm512_load_ps((const void *)(p->data + (size_t)(t + a) * tbytes));
    UNROLL
    for (int r = 0; r < R; r++) {
      __m512i ai =
          _mm512_sub_epi32(acc[a][r], _mm512_set1_epi32(xq->gsum8[m0 + r]));
      __m512 sxw = _mm512_mul_ps(_mm512_set1_ps(xq->sx[m0 + r]), s);
      __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(ai), sxw);
      store_row(p, t + a, v, bias, y + (size_t)(m0 + r) * (size_t)p->n);
    }
  }
}
#undef Q8_ACC
#undef Q8_SAVE
#undef Q8_ROW
#undef Q8_PF

/* ------------------------------------------------------------ AQ q4g */

INL void aq_q4g_blk(const ql__cpu_packed *p, const ql__cpu_xq *xq,
                    int64_t g0, int64_t g1, __m512 *sv, int64_t m0,
                    const int mb, int64_t t, const int tb, const float *bias,
                    float *y) {
  __m512 facc[4][4];
  const uint8_t *tp[4];
  const int8_t *xr[4];
  const __m512i lo4 = _mm512_set1_epi8(0x0F);
  const size_t esz = ql_dtype_size(p->sdt);
  const int64_t G = p->groups;

  UNROLL
  for (int a = 0; a < tb; a++) {
    tp[a] = p->data + (size_t)(t + a) * p->tile_bytes;
    UNROLL
    for (int r = 0; r < mb; r++)
      facc[a][r] = g0 > 0 ? sv[a * 4 + r] : _mm512_setzero_ps();
  }
  UNROLL
  for (int r = 0; r < mb; r++)
    xr[r] = xq->xq + (size_t)(m0 + r) * (size_t)xq->kp;

  for (int64_t g = g0; g < g1; g++) {
    __m512i acc[4][4];
    const uint8_t *d[4];
    int64_t nb = ql__cpu_q4g_blocks(p, g), k0 = g * (int64_t)p->gs;
    UNROLL
    for (int a = 0; a < tb; a++) {
      d[a] = tp[a] + (size_t)g * p->group_bytes + p->sz_bytes;
      UNROLL
      for (int r = 0; r < mb; r++)
        acc[a][r] = _mm512_setzero_si512();
    }
    for (int64_t b = 0; b < nb; b++, k0 += QL_CPU_Q4G_KB) {
      __m512i lo[4], hi[4];
      UNROLL
      for (int a = 0; a < tb; a++) {
        __m512i v =
            _mm512_load_si512((const void *)(d[a] + (size_t)b * QL_CPU_BLOCK));
        PREFETCH(d[a] + (size_t)b * QL_CPU_BLOCK);
        lo[a] = _mm512_and_si512(v, lo4);
        hi[a] = _mm512_and_si512(_mm512_srli_epi32(v, 4), lo4);
      }
      UNROLL
      for (int r = 0; r < mb; r++) {
        __m512i x0 = bcast32(xr[r] + k0), x1 = bcast32(xr[r] + k0 + 4);
        UNROLL
        for (int a = 0; a < tb; a++) {
          acc[a][r] = dpbusd_r(acc[a][r], lo[a], x0);
          acc[a][r] = dpbusd_r(acc[a][r], hi[a], x1);
        }
      }
    }
    /* Σ x·u - 8·Σx = Σ x·q; then the reference's f32 steps: the scale
     * term, then the zero term. */
    UNROLL
    for (int a = 0; a < tb; a++) {
      const uint8_t *gp = tp[a] + (size_t)g * p->group_bytes;
      __m512 s = load16(p->sdt, gp), z = load16(p->sdt, gp + T * esz);
      UNROLL
      for (int r = 0; r < mb; r++) {
        size_t gi = (size_t)(m0 + r) * (size_t)G + (size_t)g;
        __m512i ai =
            _mm512_sub_epi32(acc[a][r], _mm512_set1_epi32(xq->gsum8[gi]));
        __m512 t1 = _mm512_mul_ps(s, _mm512_cvtepi32_ps(ai));
        __m512 t2 = _mm512_mul_ps(z, _mm512_set1_ps(xq->gsumf[gi]));
        facc[a][r] = _mm512_add_ps(facc[a][r], t1);
        facc[a][r] = _mm512_add_ps(facc[a][r], t2);
      }
    }
  }
  if (sv != NULL && g1 < G) {
    UNROLL
    for (int a = 0; a < tb; a++) {
      UNROLL
      for (int r = 0; r < mb; r++)
        sv[a * 4 + r] = facc[a][r];
    }
    return;
  }
  UNROLL
  for (int a = 0; a < tb; a++)
    UNROLL
  for (int r = 0; r < mb; r++) {
    __m512 v = _mm512_mul_ps(_mm512_set1_ps(xq->sx[m0 + r]), facc[a][r]);
    store_row(p, t + a, v, bias, y + (size_t)(m0 + r) * (size_t)p->n);
  }
}

/*
 * The large-M block of q4g AQ: 4 tiles x 4 rows, the 16 int32 sums of a
 * group as variables (see aq_q8c_txr), the f32 sums across groups in an
 * array (touched once per group). pfd: how far ahead a pass over K chunks
 * prefetches its own tiles into L1; nx: where the next group of 4 tiles
 * is, to prefetch into L2 alongside (0 for neither).
 */
#define Q4_ACC(r)                                                              \
  __m512i c0##r = _mm512_setzero_si512(), c1##r = c0##r, c2##r = c0##r,        \
          c3##r = c0##r;
#define Q4_ROW(r)                                                              \
  x0 = bcast32(xb + (r)*ld);                                                   \
  x1 = bcast32(xb + (r)*ld + 4);                                               \
  c0##r = dpbusd_r(dpbusd_r(c0##r, l0, x0), h0, x1);                           \
  c1##r = dpbusd_r(dpbusd_r(c1##r, l1, x0), h1, x1);                           \
  c2##r = dpbusd_r(dpbusd_r(c2##r, l2, x0), h2, x1);                           \
  c3##r = dpbusd_r(dpbusd_r(c3##r, l3, x0), h3, x1);
#define Q4_SPLIT(a)                                                            \
  __m512i v##a = _mm512_load_si512((const void *)(d + (a)*tbytes));            \
  __m512i l##a = _mm512_and_si512(v##a, lo4);                                  \
  __m512i h##a = _mm512_and_si512(_mm512_srli_epi32(v##a, 4), lo4);

INL void aq_q4g_4x4(const ql__cpu_packed *p, const ql__cpu_xq *xq, int64_t m0,
                    int64_t t, int64_t g0, int64_t g1, __m512 *sv,
                    size_t pfd, size_t nx, const float *bias, float *y) {
  const size_t tbytes = p->tile_bytes, esz = ql_dtype_size(p->sdt);
  const uint8_t *tp = p->data + (size_t)t * tbytes;
  const int8_t *xr0 = xq->xq + (size_t)m0 * (size_t)xq->kp;
  const size_t ld = (size_t)xq->kp;
  const __m512i lo4 = _mm512_set1_epi8(0x0F);
  const int64_t G = p->groups;
  __m512 facc[4][4];

  UNROLL
  for (int a = 0; a < 4; a++) {
    UNROLL
    for (int r = 0; r < 4; r++)
      facc[a][r] = g0 > 0 ? sv[a * 4 + r] : _mm512_setzero_ps();
  }
  for (int64_t g = g0; g < g1; g++) {
    const uint8_t *gp = tp + (size_t)g * p->group_bytes;
    if (pfd) {
      UNROLL
      for (int a = 0; a < 4; a++)
        _mm_prefetch((const char *)(gp + a * tbytes + pfd), _MM_HINT_T0);
    }
    if (nx) {
      UNROLL
      for (int a = 0; a < 4; a++)
        _mm_prefetch((const char *)(gp + a * tbytes + nx), _MM_HINT_T1);
    }
    const uint8_t *d0 = gp + p->sz_bytes;
    const int8_t *xg = xr0 + g * (int64_t)p->gs;
    int64_t nb = ql__cpu_q4g_blocks(p, g);
    Q4_ACC(0) Q4_ACC(1) Q4_ACC(2) Q4_ACC(3) for (int64_t b = 0; b < nb; b++) {
      const uint8_t *d = d0 + (size_t)b * QL_CPU_BLOCK;
      const int8_t *xb = xg + b * QL_CPU_Q4G_KB;
      __m512i x0, x1;
      if (pfd) {
        UNROLL
        for (int a = 0; a < 4; a++)
          _mm_prefetch((const char *)(d + a * tbytes + pfd), _MM_HINT_T0);
      }
      if (nx) {
        UNROLL
        for (int a = 0; a < 4; a++)
          _mm_prefetch((const char *)(d + a * tbytes + nx), _MM_HINT_T1);
      }
      Q4_SPLIT(0)
      Q4_SPLIT(1) Q4_SPLIT(2) Q4_SPLIT(3) Q4_ROW(0) Q4_ROW(1) Q4_ROW(2)
          Q4_ROW(3)
    }
    __m512i acc[4][4] = {{c00, c01, c02, c03},
                         {c10, c11, c12, c13},
                         {c20, c21, c22, c23},
                         {c30, c31, c32, c33}};
    UNROLL
    for (int a = 0; a < 4; a++) {
      const uint8_t *ga = gp + (size_t)a * tbytes;
      __m512 s = load16(p->sdt, ga), z = load16(p->sdt, ga + T * esz);
      UNROLL
      for (int r = 0; r < 4; r++) {
        size_t gi = (size_t)(m0 + r) * (size_t)G + (size_t)g;
        __m512i ai =
            _mm512_sub_epi32(acc[a][r], _mm512_set1_epi32(xq->gsum8[gi]));
        __m512 t1 = _mm512_mul_ps(s, _mm512_cvtepi32_ps(ai));
        __m512 t2 = _mm512_mul_ps(z, _mm512_set1_ps(xq->gsumf[gi]));
        facc[a][r] = _mm512_add_ps(facc[a][r], t1);
        facc[a][r] = _mm512_add_ps(facc[a][r], t2);
      }
    }
  }
  if (sv != NULL && g1 < G) {
    UNROLL
    for (int a = 0; a < 4; a++) {
      UNROLL
      for (int r = 0; r < 4; r++)
        sv[a * 4 + r] = facc[a][r];
    }
    return;
  }
  UNROLL
  for (int a = 0; a < 4; a++) {
    UNROLL
    for (int r = 0; r < 4; r++) {
      __m512 v = _mm512_mul_ps(_mm512_set1_ps(xq->sx[m0 + r]), facc[a][r]);
      store_row(p, t + a, v, bias, y + (size_t)(m0 + r) * (size_t)p->n);
    }
  }
}
#undef Q4_ACC
#undef Q4_ROW
#undef Q4_SPLIT

INL void aq_q4g_whole(const ql__cpu_packed *p, const ql__cpu_xq *xq,
                      int64_t m0, int64_t t, const float *bias, float *y) {
  aq_q4g_4x4(p, xq, m0, t, 0, p->groups, NULL, 0, 0, bias, y);
}

/* ------------------------------------------------------------ drivers */

/* Rows of x per chunk: about 384 KiB of them, a multiple of 12 (the row
 * blocks are 4 or 6), and at least 96: with long rows (large K) x no
 * longer fits the L2 anyway, and a small chunk would stream the whole
 * weight from memory again for every few rows. */
static inline int64_t m_chunk(size_t row_bytes) {
  int64_t c = (int64_t)((384u << 10) / (row_bytes ? row_bytes : 1)) / 12 * 12;
  return c < 96 ? 96 : c;
}

/* A call of blk with constant (tb, mb) for every pair the drivers use. */
#define CASES(blk, ...)                                                        \
  switch (tb * 16 + mb) {                                                      \
  case 0x41:                                                                   \
    blk(__VA_ARGS__, 1, t, 4, bias, y);                                        \
    break;                                                                     \
  case 0x42:                                                                   \
    blk(__VA_ARGS__, 2, t, 4, bias, y);                                        \
    break;                                                                     \
  case 0x21:                                                                   \
    blk(__VA_ARGS__, 1, t, 2, bias, y);                                        \
    break;                                                                     \
  case 0x22:                                                                   \
    blk(__VA_ARGS__, 2, t, 2, bias, y);                                        \
    break;                                                                     \
  case 0x23:                                                                   \
    blk(__VA_ARGS__, 3, t, 2, bias, y);                                        \
    break;                                                                     \
  case 0x24:                                                                   \
    blk(__VA_ARGS__, 4, t, 2, bias, y);                                        \
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

/*
 * Tiles in blocks of tb, rows in blocks of up to 4, tiles outermost so
 * that a block of weight tiles stays in cache while every row of x passes
 * over it. 1-2 rows take 4 tiles at a time (several independent sums hide
 * the latency of the adds). DRIVE_W: with 4 tiles a pass takes up to W4
 * rows (the registers the block's sums need allow it: 4 for q8c, 3 for
 * q4g, whose group sums double them; 2 for the rest, DRIVE), and where W4
 * > 2 never a lone row to a pass; batches of 3 rows or more take 4 tiles too,
 * except one that fits a pass of 2 tiles x 4 rows but not one of 4 tiles
 * (q4g at 4 rows: one decode per vector rather than two):
 * every broadcast of a value of x feeds 4 FMAs, one per tile. A WO pass
 * issues an FMA, a broadcast and a share of the decode per weight vector
 * and row, and the broadcasts, not the decode, held 2 tiles x 4 rows to
 * half the FMA peak (measured on Zen 5, 4096x4096, M = 16: q8c 0.47 of
 * the peak with 2 tiles, 0.57-0.60 with 4 x 4; one tile x 16 rows, the
 * decode once for 16 FMAs, 0.36). Many rows go in chunks whose x fits
 * the L2 cache (m_chunk), each chunk passing over all the tiles, so that
 * x is not fetched again from L3 for every tile. The blocking changes
 * which lanes share a pass, never the operations on a lane.
 */
#define DRIVE_W(ROWB, W4, blk, ...)                                      \
  for (int64_t mc = 0, mcn = m_chunk(ROWB); mc < m; mc += mcn) {               \
    int64_t mend = m - mc < mcn ? m : mc + mcn;                                \
    for (int64_t t = t0; t < t1;) {                                            \
      int tb = m <= 2 || ((W4) > 2 && (m <= (W4) || m > 4)) ? 4 : 2;           \
      if (t1 - t < tb)                                                         \
        tb = t1 - t >= 2 ? 2 : 1;                                              \
      for (int64_t m0 = mc; m0 < mend;) {                                      \
        int64_t left = mend - m0;                                              \
        int mb = left < 4 ? (int)left : 4;                                     \
        /* 4 tiles take W4 rows; past 2, never leaving a lone row. */          \
        if (tb == 4 && left > (W4))                                            \
          mb = (W4) > 2 && left == (W4) + 1 ? (W4) - 1 : (W4);                 \
        /* 4 tiles x 3-4 rows only here (W4 > 2), not in CASES: the other    \
         * drivers never run them. */                                          \
        if ((W4) > 2 && tb == 4 && mb > 2) {                                   \
          if ((W4) == 4 && mb == 4)                                            \
            blk(__VA_ARGS__, 4, t, 4, bias, y);                                \
          else                                                                 \
            blk(__VA_ARGS__, 3, t, 4, bias, y);                                \
        } else {                                                               \
          CASES(blk, __VA_ARGS__)                                              \
        }                                                                      \
        m0 += mb;                                                              \
      }                                                                        \
      t += tb;                                                                 \
    }                                                                          \
  }
#define DRIVE(ROWB, blk, ...) DRIVE_W(ROWB, 2, blk, __VA_ARGS__)

/* One q4g WO pass of 3 tiles x mb rows, mb 1-4. */
static TGT void wo_q4g_3x(const ql__cpu_packed *p, const float *x,
                          const float *xs, int64_t m0, int mb, int64_t t,
                          const float *bias, float *y) {
  switch (mb) {
  case 4:
    wo_q4g_blk(p, x, xs, m0, 4, t, 3, bias, y);
    break;
  case 3:
    wo_q4g_blk(p, x, xs, m0, 3, t, 3, bias, y);
    break;
  case 2:
    wo_q4g_blk(p, x, xs, m0, 2, t, 3, bias, y);
    break;
  default:
    wo_q4g_blk(p, x, xs, m0, 1, t, 3, bias, y);
    break;
  }
}

/*
 * q4g WO: batches of 1-3 rows as DRIVE_W (4 tiles x all the rows), and 6
 * (4 tiles x 3 + 3); from 4 rows otherwise, passes of 3 tiles x 4 rows
 * (never a lone row: 5 left go as 3 + 2). Each weight vector costs a
 * shift and a vpermps, which share the Zen 4 FP pipes 1-2 with the FMAs'
 * pipe 1: per value of k, 3 tiles x 4 rows is 12 FMAs to 6 decode
 * operations, where 4 x 3 is 12 to 8, and the 24 sums (12 running, 12 of
 * the group) leave registers for the table and the weight vectors. On a
 * Zen 4 VM at M = 16 (4096x4096, 14336x4096; qlinear-bench, alternating
 * builds): 0.78 of the FMA peak with 4 x 3, 0.82-0.84 with 3 x 4; M = 6
 * stays faster as 4 x 3 + 3 (0.78-0.80 against 0.76-0.77 as 4 + 2).
 */
static TGT void wo_q4g(const ql__cpu_packed *p, const float *x,
                       const float *xs, int64_t m, int64_t t0, int64_t t1,
                       const float *bias, float *y) {
  if (m < 4 || m == 6) {
    DRIVE_W((size_t)p->k * 4, 3, wo_q4g_blk, p, x, xs, m0)
    return;
  }
  for (int64_t mc = 0, mcn = m_chunk((size_t)p->k * 4); mc < m; mc += mcn) {
    int64_t mend = m - mc < mcn ? m : mc + mcn;
    for (int64_t t = t0; t < t1;) {
      int tb = t1 - t >= 3 ? 3 : (int)(t1 - t);
      for (int64_t m0 = mc; m0 < mend;) {
        int64_t left = mend - m0;
        int mb = left == 5 ? 3 : left < 4 ? (int)left : 4;
        if (tb == 3)
          wo_q4g_3x(p, x, xs, m0, mb, t, bias, y);
        else
          CASES(wo_q4g_blk, p, x, xs, m0)
        m0 += mb;
      }
      t += tb;
    }
  }
}

static TGT void wo_q8c(const ql__cpu_packed *p, const float *x, int64_t m,
                       int64_t t0, int64_t t1, const float *bias, float *y) {
  DRIVE_W((size_t)p->k * 4, 4, wo_q8c_blk, p, x, m0)
}

/*
 * The AQ drivers: as DRIVE, but a pass of 4 tiles over BIGM rows runs the
 * format's large block big(p, xq, m0, t, bias, y) when that many rows are
 * left (its integer dot products are the whole cost, and a larger block
 * reuses each weight vector on more rows); the rows left over take 4
 * tiles x 2 rows, or 2 tiles x up to 4.
 */
#define DRIVE_BIG(ROWB, BIGM, big, blk, ...)                                   \
  for (int64_t mc = 0, mcn = m_chunk(ROWB); mc < m; mc += mcn) {               \
    int64_t mend = m - mc < mcn ? m : mc + mcn;                                \
    for (int64_t t = t0; t < t1;) {                                            \
      int tb = t1 - t >= 4 ? 4 : t1 - t >= 2 ? 2 : 1;                          \
      for (int64_t m0 = mc; m0 < mend;) {                                      \
        int mb;                                                                \
        if (tb == 4 && mend - m0 >= (BIGM)) {                                  \
          big(p, xq, m0, t, bias, y);                                          \
          mb = (BIGM);                                                         \
        } else {                                                               \
          mb = mend - m0 < 4 ? (int)(mend - m0) : 4;                           \
          if (tb == 4 && mb > 2)                                               \
            mb = 2;                                                            \
          CASES(blk, __VA_ARGS__)                                              \
        }                                                                      \
        m0 += mb;                                                              \
      }                                                                        \
      t += tb;                                                                 \
    }                                                                          \
  }


/* q4g AQ: from Q4_WK_ROWS rows, whole-K passes of 4 tiles x 4 rows (1-3
 * rows in the last), in row chunks of m_chunk, the second pass over each
 * group of 4 tiles prefetching the next; a batch of 3 or of 5-7 rows
 * passes over each group of 4 tiles in chunks of Q4_KC groups, 4 tiles x
 * 1-4 rows a pass. The tiles left over, and batches of 1, 2 and 4 rows,
 * take 4 tiles x 4 rows (aq_q4g_whole) where 4 rows are left, 4 tiles x
 * 1-2 rows or 2 tiles x up to 4 otherwise (DRIVE_BIG; 3 rows there would
 * take two passes, 2 rows and 1). */
/* One pass of 4 tiles over groups [g0, g1): 4 rows, or the 1-3 left
 * (left >= 4: 4 rows). Both of aq_q4g's pass paths go through it: one
 * copy of each block. */
static TGT __attribute__((noinline)) void
q4g_pass(const ql__cpu_packed *p, const ql__cpu_xq *xq, int64_t m0,
         int64_t left, int64_t t, int64_t g0, int64_t g1, __m512 *sv,
         size_t pfd, size_t nx, const float *bias, float *y) {
  if (left >= 4)
    aq_q4g_4x4(p, xq, m0, t, g0, g1, sv, pfd, nx, bias, y);
  else if (left == 3)
    aq_q4g_blk(p, xq, g0, g1, sv, m0, 3, t, 4, bias, y);
  else if (left == 2)
    aq_q4g_blk(p, xq, g0, g1, sv, m0, 2, t, 4, bias, y);
  else
    aq_q4g_blk(p, xq, g0, g1, sv, m0, 1, t, 4, bias, y);
}

static TGT void aq_q4g(const ql__cpu_packed *p, const ql__cpu_xq *xq,
                       int64_t t0, int64_t t1, const float *bias, float *y) {
  const int64_t m = xq->m, G = p->groups;
  if (m >= Q4_WK_ROWS && t1 - t0 >= 4) {
    const int64_t tq = t0 + (t1 - t0) / 4 * 4;
    for (int64_t mc = 0, mcn = m_chunk((size_t)xq->kp); mc < m; mc += mcn) {
      const int64_t mend = m - mc < mcn ? m : mc + mcn;
      for (int64_t t = t0; t < tq; t += 4) {
        const size_t nx = tq - t >= 8 ? 4 * p->tile_bytes : 0;
        for (int64_t m0 = mc, i = 0; m0 < mend; m0 += 4, i++)
          q4g_pass(p, xq, m0, mend - m0, t, 0, G, NULL, 0, i == 1 ? nx : 0,
                   bias, y);
      }
    }
    t0 = tq;
  } else if ((m == 3 || m > 4) && m <= KC_MAX_ROWS && t1 - t0 >= 4) {
    __m512 sv[(KC_MAX_ROWS + 3) / 4][16];
    const size_t pfd = (size_t)Q4_KC * p->group_bytes;
    int64_t t = t0;
    for (; t1 - t >= 4; t += 4)
      for (int64_t g0 = 0; g0 < G; g0 += Q4_KC) {
        int64_t g1 = G - g0 < Q4_KC ? G : g0 + Q4_KC;
        for (int64_t m0 = 0, i = 0; m0 < m; m0 += 4, i++)
          q4g_pass(p, xq, m0, m - m0, t, g0, g1, sv[i], pfd, 0, bias, y);
      }
    t0 = t;
  }
  DRIVE_BIG((size_t)xq->kp, 4, aq_q4g_whole, aq_q4g_blk, p, xq, 0, G, NULL,
            m0)
}

/* One pass of aq_q8c_txr, TB, R and pf as constants: one inlined block
 * per triple; 4 tiles take 3-6 rows (pf 0-1), 3 tiles 4-8 (pf 1-2). */
#define Q8_CASE(tb, r, pf)                                                     \
  case ((tb)*16 + (r)) * 4 + (pf):                                             \
    aq_q8c_txr(p, xq, m0, (tb), (r), (pf), t, b0, b1, sv, bias, y);            \
    break;
#define Q8_CASES4(r) Q8_CASE(4, r, 0) Q8_CASE(4, r, 1)
#define Q8_CASES3(r) Q8_CASE(3, r, 1) Q8_CASE(3, r, 2)

INL void aq_q8c_pass(const ql__cpu_packed *p, const ql__cpu_xq *xq,
                     int64_t m0, int tb, int mb, int pf, int64_t t, int64_t b0,
                     int64_t b1, __m512i *sv, const float *bias, float *y) {
  switch ((tb * 16 + mb) * 4 + pf) {
    Q8_CASES4(3)
    Q8_CASES4(4)
    Q8_CASES4(5)
    Q8_CASES4(6)
    Q8_CASES3(4)
    Q8_CASES3(5)
    Q8_CASES3(6)
    Q8_CASES3(7)
    Q8_CASES3(8)
  }
}
#undef Q8_CASE
#undef Q8_CASES4
#undef Q8_CASES3

/* Rows of a pass of 4 tiles: 3 to 6, never leaving 1-2 rows to a pass of
 * their own. */
static inline int q8_pass_rows(int64_t left) {
  return left <= 6 ? (int)left : left < 9 ? (int)left - 3 : 6;
}

/*
 * q8c AQ has no per-group epilogue. 1-2 rows: 4 tiles x 1-2 rows (the
 * GEMV blocks); 3-6 rows: one pass of 4 tiles; 7 to KC_MAX_ROWS rows:
 * groups of 3 tiles, up to 8 rows a pass (24 sums, the most that leave
 * registers for 3 weight vectors and x), so that 7-8 rows take one pass
 * over the weight and 9-16 two, over K chunks when more than one; more
 * rows: passes of 4 tiles x 3-6 rows, in chunks of rows whose x fits the
 * L2 cache, as DRIVE. Tiles left over from the groups go 2 or 1 at a
 * time.
 */
static TGT void aq_q8c(const ql__cpu_packed *p, const ql__cpu_xq *xq,
                       int64_t t0, int64_t t1, const float *bias, float *y) {
  const int64_t m = xq->m, nb = xq->kp / QL_CPU_Q8C_KB;
  if (m > 6 && m <= KC_MAX_ROWS) {
    const int np = (int)((m + 7) / 8);
    __m512i sv[KC_MAX_ROWS / 8][32];
    for (; t1 - t0 >= 3; t0 += 3) {
      const int64_t t = t0;
      if (np == 1) {
        aq_q8c_pass(p, xq, 0, 3, (int)m, 1, t, 0, nb, NULL, bias, y);
        continue;
      }
      for (int64_t b0 = 0; b0 < nb; b0 += Q8_KC) {
        int64_t b1 = nb - b0 < Q8_KC ? nb : b0 + Q8_KC, m0 = 0;
        for (int i = 0; i < np; i++) {
          /* rows as even as the passes allow: 9 = 5 + 4, 16 = 8 + 8 */
          int mb = (int)(m / np) + (i < m % np);
          aq_q8c_pass(p, xq, m0, 3, mb, 2, t, b0, b1, sv[i], bias, y);
          m0 += mb;
        }
      }
    }
  }
  for (int64_t mc = 0, mcn = m_chunk((size_t)xq->kp); mc < m; mc += mcn) {
    int64_t mend = m - mc < mcn ? m : mc + mcn;
    for (int64_t t = t0; t < t1;) {
      int tb = t1 - t >= 4 ? 4 : t1 - t >= 2 ? 2 : 1;
      for (int64_t m0 = mc; m0 < mend;) {
        int64_t left = mend - m0;
        int mb = q8_pass_rows(left);
        if (tb == 4 && mb >= 3) {
          aq_q8c_pass(p, xq, m0, 4, mb, m0 == mc, t, 0, nb, NULL, bias, y);
        } else {
          if (mb > 4)
            mb = 4;
          if (tb == 4 && mb > 2)
            mb = 2;
          CASES(aq_q8c_blk, p, xq, m0)
        }
        m0 += mb;
      }
      t += tb;
    }
  }
}

static TGT void wo_q8b(const ql__cpu_packed *p, const float *x, int64_t m,
                       int64_t t0, int64_t t1, const float *bias, float *y) {
  if (!p->asym) {
    DRIVE((size_t)p->k * 4, wo_q8b_blk, 0, 0, p, x, m0)
  } else if (p->fma_dequant) {
    DRIVE((size_t)p->k * 4, wo_q8b_blk, 1, 1, p, x, m0)
  } else {
    DRIVE((size_t)p->k * 4, wo_q8b_blk, 1, 0, p, x, m0)
  }
}

static TGT void wo_f8r(const ql__cpu_packed *p, const float *x, int64_t m,
                       int64_t t0, int64_t t1, const float *bias, float *y) {
  if (ql__cpu_daz()) {
    ql__cpu_kernels_c.wo_f8r(p, x, m, t0, t1, bias, y);
  } else if (p->f8_fold) {
    DRIVE((size_t)p->k * 4, wo_f8r_blk, 1, p, x, m0)
  } else {
    DRIVE((size_t)p->k * 4, wo_f8r_blk, 0, p, x, m0)
  }
}

/* f8r AQ: 4 tiles x 6 rows when there are enough rows (its FMAs are the
 * whole cost), else the generic blocking. */
static TGT void aq_f8r(const ql__cpu_packed *p, const ql__cpu_xq *xq,
                       int64_t t0, int64_t t1, const float *bias, float *y) {
  const int64_t m = xq->m;
  if (ql__cpu_daz()) {
    ql__cpu_kernels_c.aq_f8r(p, xq, t0, t1, bias, y);
    return;
  }
  if (m < 6) {
    DRIVE((size_t)xq->kp * 4, aq_f8r_blk, p, xq, m0)
    return;
  }
  DRIVE_BIG((size_t)xq->kp * 4, 6, aq_f8r_4x6, aq_f8r_blk, p, xq, m0)
}

/* -------------------------------------------------------- quantize */

static TGT int quant_row(ql_dtype src, const float *x, int64_t k, int8_t *xq,
                         float *sx) {
  const __m512 lim = _mm512_set1_ps(3.40282347e+38f);
  __m512 vmax = _mm512_setzero_ps();
  __mmask16 bad = 0;
  float amax, scale, inv;
  int64_t i;

  for (i = 0; i + 16 <= k; i += 16) {
    __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + i));
    bad |= (__mmask16)~_mm512_cmp_ps_mask(a, lim, _CMP_LE_OQ);
    vmax = _mm512_max_ps(vmax, a);
  }
  if (i < k) {
    __mmask16 mk = (__mmask16)((1u << (k - i)) - 1u);
    __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(mk, x + i));
    bad |= (__mmask16)(mk & ~_mm512_cmp_ps_mask(a, lim, _CMP_LE_OQ));
    vmax = _mm512_max_ps(vmax, a);
  }
  if (bad)
    return QL_ENONFINITE;
  /* the reference's scalar steps */
  amax = _mm512_reduce_max_ps(vmax);
  scale = ql__cpu_rnd_src(src, amax / 127.5f);
  if (scale < QL_I8_SCALE_EPS)
    scale = QL_I8_SCALE_EPS;
  inv = 1.0f / scale;
  const __m512 vinv = _mm512_set1_ps(inv);
  /* rne(x·inv) (vcvtps2dq rounds to nearest even in the default MXCSR
   * mode, like rintf), then the clamp to [-128, 127] as a signed
   * saturation */
  for (i = 0; i + 16 <= k; i += 16) {
    __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), vinv));
    _mm_storeu_si128((__m128i *)(xq + i), _mm512_cvtsepi32_epi8(q));
  }
  if (i < k) {
    __mmask16 mk = (__mmask16)((1u << (k - i)) - 1u);
    __m512i q = _mm512_cvtps_epi32(
        _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, x + i), vinv));
    _mm512_mask_cvtsepi32_storeu_epi8(xq + i, mk, q);
  }
  *sx = scale;
  return 0;
}

/*
 * One row of the e4m3 rule (ql_kernels.h), 16 values at a time: the
 * scalar steps for the scale, then per value the correctly rounded
 * division, the clamp to ±448 and ql_f32_to_e4m3's rounding on the bits
 * of |t|: at or above 2^-6 (the normal codes) the mantissa rounded to 3
 * bits, ties to even, by adding 0x7FFFF plus the lowest kept bit (a carry
 * moves into the exponent; 448 is the largest result), then rebiased;
 * below 2^-6, |t|·2^9 (exact) rounded to an integer 0..8 ties to even,
 * the subnormal code (8 is 2^-6, the smallest normal code, as it should
 * be). Both give a zero of t's sign at or below 2^-10. The rounding is
 * explicit (not the MXCSR's), like the bit operations of the reference.
 * xe is the code's value from the same rounding: the kept bits (normal) or
 * the integer times 2^-9, with t's sign, times 2^119.
 */
INL void e4m3_16(__m512 x, __m512 vs, __m512i *code, __m512 *val) {
  const __m512 lim = _mm512_set1_ps(QL_E4M3_MAX);
  __m512 t = _mm512_min_ps(_mm512_max_ps(_mm512_div_ps(x, vs),
                                         _mm512_sub_ps(_mm512_setzero_ps(), lim)),
                           lim);
  __m512i bits = _mm512_castps_si512(t);
  __m512i a = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF));
  __m512i sgn = _mm512_andnot_si512(_mm512_set1_epi32(0x7FFFFFFF), bits);
  __m512i r = _mm512_add_epi32(
      _mm512_add_epi32(a, _mm512_set1_epi32(0x7FFFF)),
      _mm512_and_si512(_mm512_srli_epi32(a, 20), _mm512_set1_epi32(1)));
  __m512i cn = _mm512_sub_epi32(_mm512_srli_epi32(r, 20),
                                _mm512_set1_epi32(120 << 3));
  __m512i ns = _mm512_cvt_roundps_epi32(
      _mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(512.0f)),
      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __mmask16 sub = _mm512_cmplt_epi32_mask(a, _mm512_set1_epi32(0x3C800000));
  __m512i c = _mm512_mask_blend_epi32(sub, cn, ns);
  *code = _mm512_or_si512(c, _mm512_srli_epi32(sgn, 24));
  if (val != NULL) {
    __m512 vn = _mm512_castsi512_ps(
        _mm512_and_si512(r, _mm512_set1_epi32((int)0xFFF00000u)));
    __m512 vsub = _mm512_mul_ps(_mm512_cvtepi32_ps(ns), _mm512_set1_ps(0x1p-9f));
    __m512 mag = _mm512_mask_blend_ps(sub, vn, vsub);
    *val = _mm512_castsi512_ps(_mm512_or_si512(
        _mm512_castps_si512(_mm512_mul_ps(mag, _mm512_set1_ps(QL_CPU_F8_XSCALE))),
        sgn));
  }
}

static TGT int quant_row_e4m3(ql_dtype src, const float *x, int64_t k,
                              uint8_t *xc, float *xe, float *sx) {
  const __m512 lim = _mm512_set1_ps(3.40282347e+38f);
  __m512 vmax = _mm512_setzero_ps();
  __mmask16 bad = 0;
  int64_t i;

  for (i = 0; i + 16 <= k; i += 16) {
    __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + i));
    bad |= (__mmask16)~_mm512_cmp_ps_mask(a, lim, _CMP_LE_OQ);
    vmax = _mm512_max_ps(vmax, a);
  }
  if (i < k) {
    __mmask16 mk = (__mmask16)((1u << (k - i)) - 1u);
    __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(mk, x + i));
    bad |= (__mmask16)(mk & ~_mm512_cmp_ps_mask(a, lim, _CMP_LE_OQ));
    vmax = _mm512_max_ps(vmax, a);
  }
  if (bad)
    return QL_ENONFINITE;
  const float scale = ql__cpu_e4m3_scale(src, _mm512_reduce_max_ps(vmax));
  const __m512 vs = _mm512_set1_ps(scale);
  for (i = 0; i < k; i += 16) {
    __mmask16 mk = k - i >= 16 ? (__mmask16)0xFFFF
                               : (__mmask16)((1u << (k - i)) - 1u);
    __m512i code;
    __m512 val;
    /* masked-off lanes divide 0 by the scale: harmless, not stored */
    e4m3_16(_mm512_maskz_loadu_ps(mk, x + i), vs, &code,
            xe != NULL ? &val : NULL);
    _mm512_mask_cvtepi32_storeu_epi8(xc + i, mk, code);
    if (xe != NULL)
      _mm512_mask_storeu_ps(xe + i, mk, val);
  }
  *sx = scale;
  return 0;
}

const ql__cpu_kernels ql__cpu_kernels_avx512 = {
    wo_q4g, wo_q8c, aq_q4g, aq_q8c, quant_row, wo_q8b, wo_f8r, aq_f8r,
    quant_row_e4m3};

#endif /* __x86_64__ */
