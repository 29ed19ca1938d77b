/*
 * kern_avx2_aq.h - the AVX2 AQ kernels, a template included by kern_avx2.c once
 * per variant with AQ_SUFFIX (name suffix), AQ_TGT (the functions' target
 * attribute) and AQ_VNNI (1: vpdpbusd; 0: two vpmaddwd per dword dot).
 * Integer sums are exact in both, so both give the same int32 and then
 * the reference's f32 epilogue, lane by lane.
 */
#define AQ_CAT2(a, b) a##_##b
#define AQ_CAT(a, b) AQ_CAT2(a, b)
#define AQ_NAME(n) AQ_CAT(n, AQ_SUFFIX)
#define AQ_INL static inline __attribute__((always_inline)) AQ_TGT

/* One dword dot step: acc += Σ_{i<4} u[i]·x[i] per lane, u unsigned bytes
 * of w, x signed bytes of xb (the same 4 in every lane). Without VNNI, w
 * and x split into their even and odd bytes as 16-bit values (w zero-,
 * x sign-extended), and vpmaddwd adds each pair into the dword: each
 * product is at most 255·128, each pair sum fits easily. */
#if AQ_VNNI
typedef struct AQ_NAME(xs) {
  __m256i b;
} AQ_NAME(xs);
typedef struct AQ_NAME(ws) {
  __m256i u;
} AQ_NAME(ws);

AQ_INL AQ_NAME(xs) AQ_NAME(x_split)(__m256i xb) {
  AQ_NAME(xs) r = {xb};
  return r;
}
AQ_INL AQ_NAME(ws) AQ_NAME(w_split)(__m256i w) {
  AQ_NAME(ws) r = {w};
  return r;
}
AQ_INL __m256i AQ_NAME(dot)(__m256i acc, AQ_NAME(ws) w, AQ_NAME(xs) x) {
  return _mm256_dpbusd_avx_epi32(acc, w.u, x.b);
}
#else
typedef struct AQ_NAME(xs) {
  __m256i lo, hi;
} AQ_NAME(xs);
typedef struct AQ_NAME(ws) {
  __m256i lo, hi;
} AQ_NAME(ws);

AQ_INL AQ_NAME(xs) AQ_NAME(x_split)(__m256i xb) {
  AQ_NAME(xs)
  r = {_mm256_srai_epi16(_mm256_slli_epi16(xb, 8), 8),
       _mm256_srai_epi16(xb, 8)};
  return r;
}
AQ_INL AQ_NAME(ws) AQ_NAME(w_split)(__m256i w) {
  AQ_NAME(ws)
  r = {_mm256_and_si256(w, _mm256_set1_epi16(0xFF)), _mm256_srli_epi16(w, 8)};
  return r;
}
AQ_INL __m256i AQ_NAME(dot)(__m256i acc, AQ_NAME(ws) w, AQ_NAME(xs) x) {
  acc = _mm256_add_epi32(acc, _mm256_madd_epi16(w.lo, x.lo));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(w.hi, x.hi));
}
#endif

AQ_INL __m256i AQ_NAME(bcast32)(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, sizeof v);
  return _mm256_set1_epi32(v);
}

/* q8c: tb tiles (2·tb columns) x mb rows, blocks [b0, b1) of K: the
 * sums start from sv (2 columns x 4 rows of vectors) when b0 > 0 and go
 * back to it when b1 is short of the end (K chunks, below), else to the
 * epilogue; pfd > 0 prefetches that far ahead in each tile's stream. */
AQ_INL void AQ_NAME(aq_q8c_blk)(const ql__cpu_packed *p, const ql__cpu_xq *xq,
                                int64_t b0, int64_t b1, __m256i *sv,
                                size_t pfd, int64_t m0, const int mb,
                                int64_t t, const int tb, const float *bias,
                                float *y) {
  __m256i acc[4][4];
  const uint8_t *d[4];
  const int8_t *xr[4];
  const int64_t nb = xq->kp / QL_CPU_Q8C_KB;
  const int nc = 2 * tb;

  UNROLL
  for (int c = 0; c < nc; c++) {
    d[c] = p->data + (size_t)(t + c / 2) * p->tile_bytes + QL_CPU_BLOCK +
           (c & 1) * 32;
    UNROLL
    for (int r = 0; r < mb; r++)
      acc[c][r] = b0 > 0 ? sv[c * 4 + r] : _mm256_setzero_si256();
  }
  UNROLL
  for (int r = 0; r < mb; r++)
    xr[r] = xq->xq + (size_t)(m0 + r) * (size_t)xq->kp;
  for (int64_t b = b0; b < b1; b++) {
    AQ_NAME(ws) w[4];
    if (pfd) {
      UNROLL
      for (int c = 0; c < nc; c += 2)
        _mm_prefetch((const char *)(d[c] + (size_t)b * QL_CPU_BLOCK + pfd),
                     _MM_HINT_T0);
    }
    UNROLL
    for (int c = 0; c < nc; c++)
      w[c] = AQ_NAME(w_split)(_mm256_load_si256(
          (const __m256i *)(d[c] + (size_t)b * QL_CPU_BLOCK)));
    UNROLL
    for (int r = 0; r < mb; r++) {
      AQ_NAME(xs)
      xs = AQ_NAME(x_split)(AQ_NAME(bcast32)(xr[r] + b * QL_CPU_Q8C_KB));
      UNROLL
      for (int c = 0; c < nc; c++)
        acc[c][r] = AQ_NAME(dot)(acc[c][r], w[c], xs);
    }
  }
  if (sv != NULL && b1 < nb) {
    UNROLL
    for (int c = 0; c < nc; c++)
      UNROLL
    for (int r = 0; r < mb; r++)
      sv[c * 4 + r] = acc[c][r];
    return;
  }
  /* Σ x·u - 128·Σ x = Σ x·w (exact modulo 2^32, and it fits) */
  UNROLL
  for (int c = 0; c < nc; c++) {
    const float *sc =
        (const float *)(p->data + (size_t)(t + c / 2) * p->tile_bytes);
    __m256 s = _mm256_load_ps(sc + (c & 1) * H);
    UNROLL
    for (int r = 0; r < mb; r++) {
      __m256i ai =
          _mm256_sub_epi32(acc[c][r], _mm256_set1_epi32(xq->gsum8[m0 + r]));
      __m256 sxw = _mm256_mul_ps(_mm256_set1_ps(xq->sx[m0 + r]), s);
      __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(ai), sxw);
      store_col(p, t + c / 2, c & 1, v, bias,
                y + (size_t)(m0 + r) * (size_t)p->n);
    }
  }
}

/* q4g: per group the int32 sums, then the reference's f32 steps; groups
 * [g0, g1), the f32 sums kept in sv between K chunks as q8c's. */
AQ_INL void AQ_NAME(aq_q4g_blk)(const ql__cpu_packed *p, const ql__cpu_xq *xq,
                                int64_t g0, int64_t g1, __m256 *sv,
                                size_t pfd, int64_t m0, const int mb,
                                int64_t t, const int tb, const float *bias,
                                float *y) {
  __m256 facc[4][4];
  const uint8_t *tp[2];
  const int8_t *xr[4];
  const __m256i lo4 = _mm256_set1_epi8(0x0F);
  const size_t esz = ql_dtype_size(p->sdt);
  const int64_t G = p->groups;
  const int nc = 2 * tb;

  UNROLL
  for (int a = 0; a < tb; a++)
    tp[a] = p->data + (size_t)(t + a) * p->tile_bytes;
  UNROLL
  for (int c = 0; c < nc; c++)
    UNROLL
  for (int r = 0; r < mb; r++)
    facc[c][r] = g0 > 0 ? sv[c * 4 + r] : _mm256_setzero_ps();
  UNROLL
  for (int r = 0; r < mb; r++)
    xr[r] = xq->xq + (size_t)(m0 + r) * (size_t)xq->kp;

  for (int64_t g = g0; g < g1; g++) {
    __m256i acc[4][4];
    const uint8_t *d[4];
    int64_t nb = ql__cpu_q4g_blocks(p, g), k0 = g * (int64_t)p->gs;
    UNROLL
    for (int c = 0; c < nc; c++) {
      d[c] =
          tp[c / 2] + (size_t)g * p->group_bytes + p->sz_bytes + (c & 1) * 32;
      UNROLL
      for (int r = 0; r < mb; r++)
        acc[c][r] = _mm256_setzero_si256();
    }
    if (pfd) {
      UNROLL
      for (int c = 0; c < nc; c += 2)
        _mm_prefetch((const char *)(d[c] - p->sz_bytes + pfd), _MM_HINT_T0);
    }
    for (int64_t b = 0; b < nb; b++, k0 += QL_CPU_Q4G_KB) {
      AQ_NAME(ws) lo[4], hi[4];
      if (pfd) {
        UNROLL
        for (int c = 0; c < nc; c += 2)
          _mm_prefetch((const char *)(d[c] + (size_t)b * QL_CPU_BLOCK + pfd),
                       _MM_HINT_T0);
      }
      UNROLL
      for (int c = 0; c < nc; c++) {
        __m256i v = _mm256_load_si256(
            (const __m256i *)(d[c] + (size_t)b * QL_CPU_BLOCK));
        lo[c] = AQ_NAME(w_split)(_mm256_and_si256(v, lo4));
        hi[c] =
            AQ_NAME(w_split)(_mm256_and_si256(_mm256_srli_epi32(v, 4), lo4));
      }
      UNROLL
      for (int r = 0; r < mb; r++) {
        AQ_NAME(xs) x0 = AQ_NAME(x_split)(AQ_NAME(bcast32)(xr[r] + k0));
        AQ_NAME(xs) x1 = AQ_NAME(x_split)(AQ_NAME(bcast32)(xr[r] + k0 + 4));
        UNROLL
        for (int c = 0; c < nc; c++) {
          acc[c][r] = AQ_NAME(dot)(acc[c][r], lo[c], x0);
          acc[c][r] = AQ_NAME(dot)(acc[c][r], hi[c], x1);
        }
      }
    }
    UNROLL
    for (int c = 0; c < nc; c++) {
      const uint8_t *gp = tp[c / 2] + (size_t)g * p->group_bytes;
      __m256 s = load8(p->sdt, gp + (size_t)((c & 1) * H) * esz);
      __m256 z = load8(p->sdt, gp + (size_t)(T + (c & 1) * H) * esz);
      UNROLL
      for (int r = 0; r < mb; r++) {
        size_t gi = (size_t)(m0 + r) * (size_t)G + (size_t)g;
        __m256i ai =
            _mm256_sub_epi32(acc[c][r], _mm256_set1_epi32(xq->gsum8[gi]));
        __m256 t1 = _mm256_mul_ps(s, _mm256_cvtepi32_ps(ai));
        __m256 t2 = _mm256_mul_ps(z, _mm256_set1_ps(xq->gsumf[gi]));
        facc[c][r] = _mm256_add_ps(facc[c][r], t1);
        facc[c][r] = _mm256_add_ps(facc[c][r], t2);
      }
    }
  }
  if (sv != NULL && g1 < G) {
    UNROLL
    for (int c = 0; c < nc; c++)
      UNROLL
    for (int r = 0; r < mb; r++)
      sv[c * 4 + r] = facc[c][r];
    return;
  }
  UNROLL
  for (int c = 0; c < nc; c++)
    UNROLL
  for (int r = 0; r < mb; r++) {
    __m256 v = _mm256_mul_ps(_mm256_set1_ps(xq->sx[m0 + r]), facc[c][r]);
    store_col(p, t + c / 2, c & 1, v, bias,
              y + (size_t)(m0 + r) * (size_t)p->n);
  }
}

/*
 * A batch of 5 to AQ_KC_ROWS rows takes 2 or more passes of 1 tile x up
 * to 4 rows over each tile: over K chunks of about 12 KiB (q8c 192
 * blocks, q4g 12 groups), each pass prefetching the next chunk, so that
 * the tile's stream from memory runs under every pass's compute and the
 * passes after the first find the chunk in L1, as the AVX-512 level
 * does (kern_avx512.c). The sums go to sv between chunks; no bit changes.
 */
#ifndef AQ_KC_ROWS /* once for both variants */
#define AQ_KC_ROWS 24
#define AQ_Q8C_KC 192
#define AQ_Q4G_KC 12
/* Passes of 1 tile x up to 4 rows over each tile, K in chunks of KC of
 * its n units (q8c blocks, q4g groups), the sums of pass i kept in sv[i]
 * (vectors of type SVT) between chunks. */
#define DRIVE_KC(blk, SVT, n, KC, pfd)                                         \
  {                                                                            \
    SVT sv[AQ_KC_ROWS / 4][8];                                                 \
    for (int64_t t = t0; t < t1; t++)                                          \
      for (int64_t u0 = 0; u0 < (n); u0 += (KC)) {                             \
        int64_t u1 = (n) - u0 < (KC) ? (n) : u0 + (KC);                        \
        for (int64_t m0 = 0, i = 0; m0 < m; m0 += 4, i++) {                    \
          SVT *st = sv[i];                                                     \
          int tb = 1, mb = m - m0 < 4 ? (int)(m - m0) : 4;                     \
          CASES(blk, p, xq, u0, u1, st, pfd, m0)                               \
        }                                                                      \
      }                                                                        \
  }
#endif

static AQ_TGT void AQ_NAME(aq_q8c)(const ql__cpu_packed *p,
                                   const ql__cpu_xq *xq, int64_t t0, int64_t t1,
                                   const float *bias, float *y) {
  const int64_t m = xq->m, nb = xq->kp / QL_CPU_Q8C_KB;
  if (m > 4 && m <= AQ_KC_ROWS) {
    DRIVE_KC(AQ_NAME(aq_q8c_blk), __m256i, nb, AQ_Q8C_KC,
             (size_t)AQ_Q8C_KC * QL_CPU_BLOCK)
    return;
  }
  DRIVE(AQ_NAME(aq_q8c_blk), p, xq, 0, nb, NULL, 0, m0)
}

static AQ_TGT void AQ_NAME(aq_q4g)(const ql__cpu_packed *p,
                                   const ql__cpu_xq *xq, int64_t t0, int64_t t1,
                                   const float *bias, float *y) {
  const int64_t m = xq->m, G = p->groups;
  if (m > 4 && m <= AQ_KC_ROWS) {
    DRIVE_KC(AQ_NAME(aq_q4g_blk), __m256, G, AQ_Q4G_KC,
             (size_t)AQ_Q4G_KC * p->group_bytes)
    return;
  }
  DRIVE(AQ_NAME(aq_q4g_blk), p, xq, 0, G, NULL, 0, m0)
}

#undef AQ_CAT2
#undef AQ_CAT
#undef AQ_NAME
#undef AQ_INL
