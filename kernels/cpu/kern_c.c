/*
 * kern_c.c - the plain C level of the CPU kernels (cpu.h): the CPU layout
 * read without SIMD intrinsics, 16 lanes (output rows) as inner loops that
 * a compiler may vectorize across n (never across k, which would reorder
 * a sum). It is also the readable statement of what the SIMD levels
 * compute: each of them must give these bytes, which are the reference's.
 */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "cpu.h"

#define T QL_CPU_TILE

/* Rows of x handled together: each dequantized value is reused MB
 * times. */
enum { MB = 4 };

static void load_sz(const ql__cpu_packed *p, const uint8_t *gp, float *s,
                    float *z) {
  for (int j = 0; j < T; j++) {
    s[j] = ql_load_f32(p->sdt, gp, (size_t)j);
    z[j] = ql_load_f32(p->sdt, gp, (size_t)(T + j));
  }
}

/* y rows [m0, m0+mb) of tile t from the f32 accumulators (+ bias). */
static void store_rows(const ql__cpu_packed *p, int64_t t, int64_t m0, int mb,
                       float acc[][T], const float *bias, float *y) {
  int64_t n0 = t * T;
  int rows = p->n - n0 < T ? (int)(p->n - n0) : T;
  for (int r = 0; r < mb; r++)
    for (int j = 0; j < rows; j++) {
      float v = acc[r][j];
      if (bias != NULL)
        v += bias[n0 + j];
      y[(size_t)(m0 + r) * (size_t)p->n + (size_t)(n0 + j)] = v;
    }
}

/* WO q4g, the zero factored out of each group: a = Σ fma(x, q, a) over
 * the group, then acc += fma(z, Σx, s·a) (ql_linear_wo_ref). */
static void wo_q4g(const ql__cpu_packed *p, const float *x, const float *xs,
                   int64_t m, int64_t t0, int64_t t1, const float *bias,
                   float *y) {
  float acc[MB][T], ga[MB][T], qf[QL_CPU_Q4G_KB][T], s[T], z[T];
  for (int64_t t = t0; t < t1; t++) {
    const uint8_t *tile = p->data + (size_t)t * p->tile_bytes;
    for (int64_t m0 = 0; m0 < m; m0 += MB) {
      int mb = m - m0 < MB ? (int)(m - m0) : MB;
      memset(acc, 0, sizeof acc);
      for (int64_t g = 0; g < p->groups; g++) {
        const uint8_t *gp = tile + (size_t)g * p->group_bytes;
        int64_t nb = ql__cpu_q4g_blocks(p, g);
        load_sz(p, gp, s, z);
        memset(ga, 0, sizeof ga);
        for (int64_t b = 0; b < nb; b++) {
          const uint8_t *blk = gp + p->sz_bytes + (size_t)b * QL_CPU_BLOCK;
          int64_t k0 = g * (int64_t)p->gs + b * QL_CPU_Q4G_KB;
          int kn = p->k - k0 < QL_CPU_Q4G_KB ? (int)(p->k - k0) : QL_CPU_Q4G_KB;
          for (int i = 0; i < kn; i++)
            for (int j = 0; j < T; j++) {
              unsigned u = (blk[4 * j + (i & 3)] >> (i & 4)) & 0xFu;
              qf[i][j] = (float)((int)u - 8);
            }
          for (int r = 0; r < mb; r++) {
            const float *xr = x + (size_t)(m0 + r) * (size_t)p->k + k0;
            for (int i = 0; i < kn; i++)
              for (int j = 0; j < T; j++)
                ga[r][j] = fmaf(xr[i], qf[i][j], ga[r][j]);
          }
        }
        for (int r = 0; r < mb; r++) {
          float sx = xs[(size_t)(m0 + r) * (size_t)p->groups + (size_t)g];
          for (int j = 0; j < T; j++)
            acc[r][j] += fmaf(z[j], sx, s[j] * ga[r][j]);
        }
      }
      store_rows(p, t, m0, mb, acc, bias, y);
    }
  }
}

/* WO q8c, the scale factored out of the row: a = Σ fma(x, q, a) over K,
 * then y = s·a (ql_linear_wo_ref). */
static void wo_q8c(const ql__cpu_packed *p, const float *x, int64_t m,
                   int64_t t0, int64_t t1, const float *bias, float *y) {
  float acc[MB][T], qf[QL_CPU_Q8C_KB][T], s[T];
  int64_t nb = (p->k + QL_CPU_Q8C_KB - 1) / QL_CPU_Q8C_KB;
  for (int64_t t = t0; t < t1; t++) {
    const uint8_t *tile = p->data + (size_t)t * p->tile_bytes;
    memcpy(s, tile, sizeof s);
    for (int64_t m0 = 0; m0 < m; m0 += MB) {
      int mb = m - m0 < MB ? (int)(m - m0) : MB;
      memset(acc, 0, sizeof acc);
      for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = tile + QL_CPU_BLOCK + (size_t)b * QL_CPU_BLOCK;
        int64_t k0 = b * QL_CPU_Q8C_KB;
        int kn = p->k - k0 < QL_CPU_Q8C_KB ? (int)(p->k - k0) : QL_CPU_Q8C_KB;
        for (int i = 0; i < kn; i++)
          for (int j = 0; j < T; j++)
            qf[i][j] = (float)((int)blk[4 * j + i] - 128);
        for (int r = 0; r < mb; r++) {
          const float *xr = x + (size_t)(m0 + r) * (size_t)p->k + k0;
          for (int i = 0; i < kn; i++)
            for (int j = 0; j < T; j++)
              acc[r][j] = fmaf(xr[i], qf[i][j], acc[r][j]);
        }
      }
      for (int r = 0; r < mb; r++)
        for (int j = 0; j < T; j++)
          acc[r][j] = s[j] * acc[r][j];
      store_rows(p, t, m0, mb, acc, bias, y);
    }
  }
}

/* AQ q4g: per group a = Σ xq·q (int32), then acc += s·(float)a and
 * acc += z·(float)Σxq; y = sx·acc (+ b). */
static void aq_q4g(const ql__cpu_packed *p, const ql__cpu_xq *xq, int64_t t0,
                   int64_t t1, const float *bias, float *y) {
  float acc[MB][T], s[T], z[T];
  int32_t ia[MB][T];
  for (int64_t t = t0; t < t1; t++) {
    const uint8_t *tile = p->data + (size_t)t * p->tile_bytes;
    for (int64_t m0 = 0; m0 < xq->m; m0 += MB) {
      int mb = xq->m - m0 < MB ? (int)(xq->m - m0) : MB;
      memset(acc, 0, sizeof acc);
      for (int64_t g = 0; g < p->groups; g++) {
        const uint8_t *gp = tile + (size_t)g * p->group_bytes;
        int64_t nb = ql__cpu_q4g_blocks(p, g);
        load_sz(p, gp, s, z);
        memset(ia, 0, sizeof ia);
        for (int64_t b = 0; b < nb; b++) {
          const uint8_t *blk = gp + p->sz_bytes + (size_t)b * QL_CPU_BLOCK;
          int64_t k0 = g * (int64_t)p->gs + b * QL_CPU_Q4G_KB;
          for (int r = 0; r < mb; r++) {
            const int8_t *xr = xq->xq + (size_t)(m0 + r) * (size_t)xq->kp + k0;
            for (int i = 0; i < QL_CPU_Q4G_KB; i++)
              for (int j = 0; j < T; j++) {
                int u = (blk[4 * j + (i & 3)] >> (i & 4)) & 0xF;
                ia[r][j] += xr[i] * (u - 8);
              }
          }
        }
        for (int r = 0; r < mb; r++) {
          float gsf =
              xq->gsumf[(size_t)(m0 + r) * (size_t)p->groups + (size_t)g];
          for (int j = 0; j < T; j++) {
            float t1v = s[j] * (float)ia[r][j];
            float t2v = z[j] * gsf;
            acc[r][j] += t1v;
            acc[r][j] += t2v;
          }
        }
      }
      for (int r = 0; r < mb; r++)
        for (int j = 0; j < T; j++)
          acc[r][j] = xq->sx[m0 + r] * acc[r][j];
      store_rows(p, t, m0, mb, acc, bias, y);
    }
  }
}

/* AQ q8c: acc = Σ xq·w over K (int32, exact for K <= QL_AQ_Q8C_MAX_K),
 * y = (float)acc·(sx·sw) (+ b). */
static void aq_q8c(const ql__cpu_packed *p, const ql__cpu_xq *xq, int64_t t0,
                   int64_t t1, const float *bias, float *y) {
  float acc[MB][T], s[T];
  int32_t ia[MB][T];
  int64_t nb = (p->k + QL_CPU_Q8C_KB - 1) / QL_CPU_Q8C_KB;
  for (int64_t t = t0; t < t1; t++) {
    const uint8_t *tile = p->data + (size_t)t * p->tile_bytes;
    memcpy(s, tile, sizeof s);
    for (int64_t m0 = 0; m0 < xq->m; m0 += MB) {
      int mb = xq->m - m0 < MB ? (int)(xq->m - m0) : MB;
      memset(ia, 0, sizeof ia);
      for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = tile + QL_CPU_BLOCK + (size_t)b * QL_CPU_BLOCK;
        for (int r = 0; r < mb; r++) {
          const int8_t *xr =
              xq->xq + (size_t)(m0 + r) * (size_t)xq->kp + b * QL_CPU_Q8C_KB;
          for (int i = 0; i < QL_CPU_Q8C_KB; i++)
            for (int j = 0; j < T; j++)
              ia[r][j] += xr[i] * ((int)blk[4 * j + i] - 128);
        }
      }
      for (int r = 0; r < mb; r++) {
        float sx = xq->sx[m0 + r];
        for (int j = 0; j < T; j++)
          acc[r][j] = (float)ia[r][j] * (sx * s[j]);
      }
      store_rows(p, t, m0, mb, acc, bias, y);
    }
  }
}

/* WO q8b: ŵ = (float)w·s, or (float)w·s + z when asymmetric, with the
 * scale (zero) of k's block, then acc += x·ŵ in increasing k. */
static void wo_q8b(const ql__cpu_packed *p, const float *x, int64_t m,
                   int64_t t0, int64_t t1, const float *bias, float *y) {
  float acc[MB][T], wq[QL_CPU_Q8C_KB][T], s[T], z[T];
  int64_t nb = ql__cpu_kblocks(p), bpg = p->gs / QL_CPU_Q8C_KB;
  const int asym = p->asym;
  for (int64_t t = t0; t < t1; t++) {
    const uint8_t *tile = p->data + (size_t)t * p->tile_bytes;
    for (int64_t m0 = 0; m0 < m; m0 += MB) {
      int mb = m - m0 < MB ? (int)(m - m0) : MB;
      memset(acc, 0, sizeof acc);
      for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = tile + p->sz_bytes + (size_t)b * QL_CPU_BLOCK;
        int64_t k0 = b * QL_CPU_Q8C_KB;
        int kn = p->k - k0 < QL_CPU_Q8C_KB ? (int)(p->k - k0) : QL_CPU_Q8C_KB;
        if (b % bpg == 0) {
          const uint8_t *gp = tile + (size_t)(b / bpg) * p->group_bytes;
          for (int j = 0; j < T; j++) {
            s[j] = ql_load_f32(p->sdt, gp, (size_t)j);
            z[j] = asym ? ql_load_f32(p->sdt, gp, (size_t)(T + j)) : 0.0f;
          }
        }
        if (asym)
          for (int i = 0; i < kn; i++)
            for (int j = 0; j < T; j++)
              wq[i][j] = (float)((int)blk[4 * j + i] - 128) * s[j] + z[j];
        else
          for (int i = 0; i < kn; i++)
            for (int j = 0; j < T; j++)
              wq[i][j] = (float)((int)blk[4 * j + i] - 128) * s[j];
        for (int r = 0; r < mb; r++) {
          const float *xr = x + (size_t)(m0 + r) * (size_t)p->k + k0;
          for (int i = 0; i < kn; i++)
            for (int j = 0; j < T; j++)
              acc[r][j] += xr[i] * wq[i][j];
        }
      }
      store_rows(p, t, m0, mb, acc, bias, y);
    }
  }
}

/* e4m3 code -> f32, the exact values of ql_e4m3_to_f32, made once. */
static float e4m3_lut[256];
static pthread_once_t e4m3_once = PTHREAD_ONCE_INIT;

static void e4m3_init(void) {
  for (int c = 0; c < 256; c++)
    e4m3_lut[c] = ql_e4m3_to_f32((uint8_t)c);
}

static const float *e4m3(void) {
  pthread_once(&e4m3_once, e4m3_init);
  return e4m3_lut;
}

/* WO f8r: ŵ = e4m3(w)·s, then acc += x·ŵ in increasing k. */
static void wo_f8r(const ql__cpu_packed *p, const float *x, int64_t m,
                   int64_t t0, int64_t t1, const float *bias, float *y) {
  const float *lut = e4m3();
  float acc[MB][T], wq[QL_CPU_Q8C_KB][T], s[T];
  int64_t nb = ql__cpu_kblocks(p);
  for (int64_t t = t0; t < t1; t++) {
    const uint8_t *tile = p->data + (size_t)t * p->tile_bytes;
    memcpy(s, tile, sizeof s);
    for (int64_t m0 = 0; m0 < m; m0 += MB) {
      int mb = m - m0 < MB ? (int)(m - m0) : MB;
      memset(acc, 0, sizeof acc);
      for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = tile + QL_CPU_BLOCK + (size_t)b * QL_CPU_BLOCK;
        int64_t k0 = b * QL_CPU_Q8C_KB;
        int kn = p->k - k0 < QL_CPU_Q8C_KB ? (int)(p->k - k0) : QL_CPU_Q8C_KB;
        for (int i = 0; i < kn; i++)
          for (int j = 0; j < T; j++)
            wq[i][j] = lut[blk[4 * j + i]] * s[j];
        for (int r = 0; r < mb; r++) {
          const float *xr = x + (size_t)(m0 + r) * (size_t)p->k + k0;
          for (int i = 0; i < kn; i++)
            for (int j = 0; j < T; j++)
              acc[r][j] += xr[i] * wq[i][j];
        }
      }
      store_rows(p, t, m0, mb, acc, bias, y);
    }
  }
}

/* AQ f8r: acc = Σ e4m3(xc)·e4m3(w) in f32 from 0 in increasing k (each
 * product exact), y = acc·(sx·sw) (+ b). The padding past K (codes 0 on
 * both sides) adds ±0, which leaves acc as it is: acc is +0 or non-zero,
 * never -0, since it starts at +0 and an exact cancellation rounds to +0. */
static void aq_f8r(const ql__cpu_packed *p, const ql__cpu_xq *xq, int64_t t0,
                   int64_t t1, const float *bias, float *y) {
  const float *lut = e4m3();
  float acc[MB][T], wq[QL_CPU_Q8C_KB][T], s[T];
  int64_t nb = xq->kp / QL_CPU_Q8C_KB;
  for (int64_t t = t0; t < t1; t++) {
    const uint8_t *tile = p->data + (size_t)t * p->tile_bytes;
    memcpy(s, tile, sizeof s);
    for (int64_t m0 = 0; m0 < xq->m; m0 += MB) {
      int mb = xq->m - m0 < MB ? (int)(xq->m - m0) : MB;
      memset(acc, 0, sizeof acc);
      for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = tile + QL_CPU_BLOCK + (size_t)b * QL_CPU_BLOCK;
        for (int i = 0; i < QL_CPU_Q8C_KB; i++)
          for (int j = 0; j < T; j++)
            wq[i][j] = lut[blk[4 * j + i]];
        for (int r = 0; r < mb; r++) {
          const uint8_t *xr =
              xq->xc + (size_t)(m0 + r) * (size_t)xq->kp + b * QL_CPU_Q8C_KB;
          for (int i = 0; i < QL_CPU_Q8C_KB; i++) {
            float xv = lut[xr[i]];
            for (int j = 0; j < T; j++)
              acc[r][j] += xv * wq[i][j];
          }
        }
      }
      for (int r = 0; r < mb; r++) {
        float sx = xq->sx[m0 + r];
        for (int j = 0; j < T; j++)
          acc[r][j] = acc[r][j] * (sx * s[j]);
      }
      store_rows(p, t, m0, mb, acc, bias, y);
    }
  }
}

static int quant_row(ql_dtype src, const float *x, int64_t k, int8_t *xq,
                     float *sx) {
  return ql_quantize_rows_i8_src(src, x, 1, k, 1, xq, sx, NULL);
}

static int quant_row_e4m3(ql_dtype src, const float *x, int64_t k,
                          uint8_t *xc, float *xe, float *sx) {
  int rc = ql_quantize_rows_e4m3_src(src, x, 1, k, xc, sx);
  if (rc == 0 && xe != NULL) {
    const float *lut = e4m3();
    for (int64_t i = 0; i < k; i++)
      xe[i] = lut[xc[i]] * QL_CPU_F8_XSCALE; /* exact: |e4m3| <= 448 */
  }
  return rc;
}

const ql__cpu_kernels ql__cpu_kernels_c = {
    wo_q4g, wo_q8c, aq_q4g, aq_q8c, quant_row, wo_q8b, wo_f8r, aq_f8r,
    quant_row_e4m3};
