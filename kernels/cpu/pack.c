/*
 * pack.c - the CPU layout of a weight (cpu.h): made once at load by the
 * backend's repack op, read by every CPU kernel at every level. Plain C;
 * the round trip (ql__cpu_unpack) exists for the tests.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

void ql__cpu_packed_free(ql__cpu_packed *p) {
  if (p == NULL)
    return;
  if (!p->borrowed)
    free(p->data);
  free(p);
}

int ql__cpu_packed_matches(const ql__cpu_packed *p, const ql_qweight *w) {
  return p != NULL && w != NULL && p->magic == QL_CPU_PACK_MAGIC &&
         p->version == QL_CPU_PACK_VERSION && p->format == w->format &&
         p->n == w->n && p->k == w->k && p->groups == w->groups &&
         (w->format != QL_FORMAT_Q4G ||
          (p->gs == w->group_size && p->sdt == w->scale_dtype));
}

/* Sizes of the layout; 0 or QL_ESHAPE when they overflow. */
static int layout_sizes(ql__cpu_packed *p) {
  size_t esz, blocks;
  p->tiles = (p->n + QL_CPU_TILE - 1) / QL_CPU_TILE;
  if (p->format == QL_FORMAT_Q4G) {
    esz = ql_dtype_size(p->sdt);
    p->sz_bytes = round_up(2 * QL_CPU_TILE * esz, QL_CPU_BLOCK);
    p->group_bytes =
        p->sz_bytes + (size_t)(p->gs / QL_CPU_Q4G_KB) * QL_CPU_BLOCK;
    /* every group but the last has gs/8 blocks */
    p->tile_bytes = (size_t)(p->groups - 1) * p->group_bytes + p->sz_bytes +
                    (size_t)ql__cpu_q4g_blocks(p, p->groups - 1) * QL_CPU_BLOCK;
  } else {
    blocks = (size_t)((p->k + QL_CPU_Q8C_KB - 1) / QL_CPU_Q8C_KB);
    p->sz_bytes = QL_CPU_BLOCK; /* 16 f32 scales */
    p->group_bytes = 0;
    if (blocks > (SIZE_MAX - QL_CPU_BLOCK) / QL_CPU_BLOCK)
      return QL_ESHAPE;
    p->tile_bytes = QL_CPU_BLOCK + blocks * QL_CPU_BLOCK;
  }
  if ((size_t)p->tiles > SIZE_MAX / p->tile_bytes)
    return QL_ESHAPE;
  p->bytes = (size_t)p->tiles * p->tile_bytes;
  return 0;
}

/* u = q + 8 of a q4g value: the canonical nibble is q & 0xF, two's
 * complement, so q + 8 is that nibble with its top bit flipped. */
static unsigned q4g_u(const ql_qweight *w, size_t rowbytes, int64_t n,
                      int64_t k) {
  unsigned nib =
      (w->qdata[(size_t)n * rowbytes + (size_t)(k >> 1)] >> ((k & 1) * 4)) &
      0xFu;
  return nib ^ 8u;
}

/*
 * 1 when the dequantization q·s + z of every group can be one FMA with the
 * reference's bytes: q·s is exact in f32 when s has at most 21 significant
 * bits (its 3 lowest significand bits clear: |q| <= 8 adds at most 3 bits;
 * every bf16 or f16 scale qualifies), and then fl(fl(q·s) + z) and
 * fma(q, s, z) round the same exact sum once, provided fl(q·s) cannot
 * overflow (8·|s| + |z| <= FLT_MAX keeps both finite).
 */
static int q4g_fma_exact(const ql_qweight *w) {
  size_t cnt = (size_t)w->groups * (size_t)w->n;
  for (size_t i = 0; i < cnt; i++) {
    float s = ql_load_f32(w->scale_dtype, w->scale, i);
    float z = ql_load_f32(w->scale_dtype, w->zero, i);
    uint32_t bits;
    memcpy(&bits, &s, sizeof bits);
    if ((bits & 7u) != 0 ||
        !(8.0 * fabs((double)s) + fabs((double)z) <= (double)FLT_MAX))
      return 0;
  }
  return 1;
}

static void pack_q4g(const ql_qweight *w, ql__cpu_packed *p) {
  size_t rowbytes = (size_t)(w->k / 2 + (w->k & 1));
  size_t esz = ql_dtype_size(p->sdt);
  for (int64_t t = 0; t < p->tiles; t++) {
    uint8_t *tile = p->data + (size_t)t * p->tile_bytes;
    for (int64_t g = 0; g < p->groups; g++) {
      uint8_t *gp = tile + (size_t)g * p->group_bytes;
      int64_t nb = ql__cpu_q4g_blocks(p, g);
      memset(gp, 0, p->sz_bytes);
      for (int j = 0; j < QL_CPU_TILE; j++) {
        int64_t n = t * QL_CPU_TILE + j;
        if (n >= w->n)
          continue; /* padding rows: scale = zero = 0 */
        size_t src = (size_t)g * (size_t)w->n + (size_t)n;
        memcpy(gp + (size_t)j * esz, (const uint8_t *)w->scale + src * esz,
               esz);
        memcpy(gp + (size_t)(QL_CPU_TILE + j) * esz,
               (const uint8_t *)w->zero + src * esz, esz);
      }
      for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = gp + p->sz_bytes + (size_t)b * QL_CPU_BLOCK;
        int64_t k0 = g * (int64_t)p->gs + b * QL_CPU_Q4G_KB;
        for (int j = 0; j < QL_CPU_TILE; j++) {
          int64_t n = t * QL_CPU_TILE + j;
          for (int i = 0; i < 4; i++) {
            unsigned lo = 8, hi = 8;
            if (n < w->n && k0 + i < w->k)
              lo = q4g_u(w, rowbytes, n, k0 + i);
            if (n < w->n && k0 + 4 + i < w->k)
              hi = q4g_u(w, rowbytes, n, k0 + 4 + i);
            blk[4 * j + i] = (uint8_t)(lo | hi << 4);
          }
        }
      }
    }
  }
}

static void pack_q8c(const ql_qweight *w, ql__cpu_packed *p) {
  const int8_t *q = (const int8_t *)w->qdata;
  int64_t blocks = (p->k + QL_CPU_Q8C_KB - 1) / QL_CPU_Q8C_KB;
  for (int64_t t = 0; t < p->tiles; t++) {
    uint8_t *tile = p->data + (size_t)t * p->tile_bytes;
    float sc[QL_CPU_TILE];
    for (int j = 0; j < QL_CPU_TILE; j++) {
      int64_t n = t * QL_CPU_TILE + j;
      sc[j] =
          n < w->n ? ql_load_f32(w->scale_dtype, w->scale, (size_t)n) : 0.0f;
    }
    memcpy(tile, sc, sizeof sc);
    for (int64_t b = 0; b < blocks; b++) {
      uint8_t *blk = tile + QL_CPU_BLOCK + (size_t)b * QL_CPU_BLOCK;
      for (int j = 0; j < QL_CPU_TILE; j++) {
        int64_t n = t * QL_CPU_TILE + j;
        for (int i = 0; i < QL_CPU_Q8C_KB; i++) {
          int64_t k = b * QL_CPU_Q8C_KB + i;
          int v = n < w->n && k < w->k ? q[(size_t)n * (size_t)w->k + (size_t)k]
                                       : 0;
          blk[4 * j + i] = (uint8_t)(v + 128);
        }
      }
    }
  }
}

/* The header of w's layout, data not yet allocated. */
static int layout_header(const ql_qweight *w, ql__cpu_packed **out) {
  ql__cpu_packed *p;
  int rc;

  *out = NULL;
  if (w == NULL)
    return QL_EINVAL;
  if ((rc = ql_qweight_check(w)) != 0)
    return rc;
  if (w->format != QL_FORMAT_Q4G && w->format != QL_FORMAT_Q8C)
    return QL_ENOTSUP;
  if ((p = calloc(1, sizeof *p)) == NULL)
    return QL_ENOMEM;
  p->magic = QL_CPU_PACK_MAGIC;
  p->version = QL_CPU_PACK_VERSION;
  p->format = w->format;
  p->n = w->n;
  p->k = w->k;
  p->groups = w->groups;
  if (w->format == QL_FORMAT_Q4G) {
    p->gs = w->group_size;
    p->sdt = w->scale_dtype;
  } else {
    p->gs = (uint32_t)w->k;
    p->sdt = QL_DTYPE_F32;
  }
  if ((rc = layout_sizes(p)) != 0) {
    free(p);
    return rc;
  }
  *out = p;
  return 0;
}

int ql__cpu_packed_adopt(const ql_qweight *w, const void *data, size_t len,
                         ql__cpu_packed **out) {
  ql__cpu_packed *p;
  int rc = layout_header(w, &p);
  *out = NULL;
  if (rc != 0)
    return rc;
  if (len != p->bytes || ((uintptr_t)data & (QL_CPU_BLOCK - 1)) != 0) {
    free(p);
    return QL_EINVAL;
  }
  p->data = (uint8_t *)data; /* only read */
  p->borrowed = 1;
  /* Derived from the scales, which the caller has checked: not trusted
   * from the image. */
  if (w->format == QL_FORMAT_Q4G)
    p->fma_dequant = q4g_fma_exact(w);
  *out = p;
  return 0;
}

int ql__cpu_pack(const ql_qweight *w, ql__cpu_packed **out) {
  ql__cpu_packed *p;
  int rc = layout_header(w, &p);
  *out = NULL;
  if (rc != 0)
    return rc;
  p->data = aligned_alloc(QL_CPU_BLOCK, round_up(p->bytes, QL_CPU_BLOCK));
  if (p->data == NULL) {
    free(p);
    return QL_ENOMEM;
  }
  if (w->format == QL_FORMAT_Q4G) {
    pack_q4g(w, p);
    p->fma_dequant = q4g_fma_exact(w);
  } else
    pack_q8c(w, p);
  *out = p;
  return 0;
}

int ql__cpu_unpack(const ql__cpu_packed *p, uint8_t *qdata, void *scale,
                   void *zero) {
  if (p == NULL || p->magic != QL_CPU_PACK_MAGIC || qdata == NULL ||
      scale == NULL || (p->format == QL_FORMAT_Q4G && zero == NULL))
    return QL_EINVAL;
  if (p->format == QL_FORMAT_Q4G) {
    size_t rowbytes = (size_t)(p->k / 2 + (p->k & 1));
    size_t esz = ql_dtype_size(p->sdt);
    memset(qdata, 0, rowbytes * (size_t)p->n);
    for (int64_t n = 0; n < p->n; n++) {
      const uint8_t *tile = p->data + (size_t)(n / QL_CPU_TILE) * p->tile_bytes;
      int j = (int)(n % QL_CPU_TILE);
      for (int64_t g = 0; g < p->groups; g++) {
        const uint8_t *gp = tile + (size_t)g * p->group_bytes;
        size_t dst = (size_t)g * (size_t)p->n + (size_t)n;
        memcpy((uint8_t *)scale + dst * esz, gp + (size_t)j * esz, esz);
        memcpy((uint8_t *)zero + dst * esz,
               gp + (size_t)(QL_CPU_TILE + j) * esz, esz);
      }
      for (int64_t k = 0; k < p->k; k++) {
        int64_t g = k / p->gs, kk = k - g * p->gs;
        const uint8_t *blk = tile + (size_t)g * p->group_bytes + p->sz_bytes +
                             (size_t)(kk / QL_CPU_Q4G_KB) * QL_CPU_BLOCK;
        int i = (int)(kk % QL_CPU_Q4G_KB);
        unsigned u = (blk[4 * j + (i & 3)] >> (i >= 4 ? 4 : 0)) & 0xFu;
        qdata[(size_t)n * rowbytes + (size_t)(k >> 1)] |=
            (uint8_t)((u ^ 8u) << ((k & 1) * 4));
      }
    }
  } else {
    int8_t *q = (int8_t *)qdata;
    for (int64_t n = 0; n < p->n; n++) {
      const uint8_t *tile = p->data + (size_t)(n / QL_CPU_TILE) * p->tile_bytes;
      int j = (int)(n % QL_CPU_TILE);
      memcpy((float *)scale + n, tile + (size_t)j * sizeof(float),
             sizeof(float));
      for (int64_t k = 0; k < p->k; k++) {
        const uint8_t *blk =
            tile + QL_CPU_BLOCK + (size_t)(k / QL_CPU_Q8C_KB) * QL_CPU_BLOCK;
        q[(size_t)n * (size_t)p->k + (size_t)k] =
            (int8_t)((int)blk[4 * j + (int)(k % QL_CPU_Q8C_KB)] - 128);
      }
    }
  }
  return 0;
}
