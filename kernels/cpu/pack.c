/*
 * pack.c - the CPU layout of a weight (cpu.h): made once at load by the
 * backend's repack op, read by every CPU kernel at every level. Plain C;
 * the round trip (ql__cpu_unpack) exists for the tests.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cpu.h"

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/*
 * The memory of a packed layout, freed with free(). A kernel streams
 * 2-4 tiles tens of KiB apart, and a decode batch's passes revisit each
 * tile group, so with 4 KiB pages a weight of tens of MiB misses the
 * second-level TLB on most pages it touches; on a 2 MiB page it does
 * not. A loop of q4g AQ's 4 tiles x 4 rows block over 36 MiB of layouts,
 * one thread of a Zen 4 VM, M = 16: 0.90 of the VNNI peak on small pages,
 * 0.94-0.96 on huge ones (through qlinear-bench on 2 threads the gain is
 * within the noise of the shared VM). So a layout of 2 MiB or more
 * starts on a 2 MiB boundary and asks for transparent huge pages, for
 * its whole 2 MiB pages only: a partial last page would take 2 MiB of
 * memory for a few KiB. Best effort: where THP is off or "never", the
 * madvise fails or is ignored and the layout keeps small pages.
 */
#define HUGE_BYTES ((size_t)2 << 20)
static uint8_t *layout_alloc(size_t bytes) {
  void *d = NULL;
  bytes = round_up(bytes, QL_CPU_BLOCK);
  if (bytes < HUGE_BYTES)
    return aligned_alloc(QL_CPU_BLOCK, bytes);
  if (posix_memalign(&d, HUGE_BYTES, bytes) != 0)
    return NULL;
#ifdef MADV_HUGEPAGE
  (void)madvise(d, bytes / HUGE_BYTES * HUGE_BYTES, MADV_HUGEPAGE);
#endif
  return d;
}

void ql__cpu_packed_free(ql__cpu_packed *p) {
  if (p == NULL)
    return;
  if (!p->borrowed)
    free(p->data);
  free(p);
}

int ql__cpu_packed_matches(const ql__cpu_packed *p, const ql_qweight *w) {
  int grouped = w != NULL && (w->format == QL_FORMAT_Q4G ||
                              w->format == QL_FORMAT_Q8B);
  return p != NULL && w != NULL && p->magic == QL_CPU_PACK_MAGIC &&
         p->version == QL_CPU_PACK_VERSION && p->format == w->format &&
         p->n == w->n && p->k == w->k && p->groups == w->groups &&
         (!grouped || (p->gs == w->group_size && p->sdt == w->scale_dtype)) &&
         (w->format != QL_FORMAT_Q8B || p->asym == w->asymmetric);
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
    blocks = (size_t)ql__cpu_kblocks(p);
    if (p->format == QL_FORMAT_Q8B) {
      /* G·16·esz·2 < 2^31·64: no overflow for G <= K < 2^31 */
      esz = ql_dtype_size(p->sdt);
      p->group_bytes = (size_t)QL_CPU_TILE * esz * (p->asym ? 2u : 1u);
      p->sz_bytes = round_up((size_t)p->groups * p->group_bytes, QL_CPU_BLOCK);
    } else {
      p->sz_bytes = QL_CPU_BLOCK; /* 16 f32 scales */
      p->group_bytes = 0;
    }
    if (blocks > (SIZE_MAX - p->sz_bytes) / QL_CPU_BLOCK)
      return QL_ESHAPE;
    p->tile_bytes = p->sz_bytes + blocks * QL_CPU_BLOCK;
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
 * reference's bytes, for integer codes |q| <= qmax = 2^qbits with at most
 * qbits significant bits (q8b: q in [-128, 127], qbits 7): q·s is exact
 * in f32 when s has at most 24 - qbits significant bits (its qbits lowest
 * significand bits clear; every bf16 and f16 scale qualifies; subnormal products stay
 * multiples of 2^-149, so exact too), and then fl(fl(q·s) + z) and
 * fma(q, s, z) round the same exact sum once, provided fl(q·s) cannot
 * overflow (qmax·|s| + |z| <= FLT_MAX keeps both finite).
 */
static int fma_exact(const ql_qweight *w, unsigned qbits) {
  size_t cnt = (size_t)w->groups * (size_t)w->n;
  uint32_t low = (1u << qbits) - 1u;
  double qmax = (double)(1u << qbits);
  for (size_t i = 0; i < cnt; i++) {
    float s = ql_load_f32(w->scale_dtype, w->scale, i);
    float z = ql_load_f32(w->scale_dtype, w->zero, i);
    uint32_t bits;
    memcpy(&bits, &s, sizeof bits);
    if ((bits & low) != 0 ||
        !(qmax * fabs((double)s) + fabs((double)z) <= (double)FLT_MAX))
      return 0;
  }
  return 1;
}

/* 1 when every f8r scale s has s·2^120 finite (|s| < 2^8 in practice):
 * see kern_avx512.c, f8r. */
static int f8_fold_ok(const ql_qweight *w) {
  for (int64_t i = 0; i < w->n; i++)
    if (!isfinite(ql_load_f32(w->scale_dtype, w->scale, (size_t)i) * 0x1p120f))
      return 0;
  return 1;
}

/* The flags derived from the weight's scales (never trusted from an
 * image). */
static void layout_flags(const ql_qweight *w, ql__cpu_packed *p) {
  if (w->format == QL_FORMAT_Q8B && w->asymmetric)
    p->fma_dequant = fma_exact(w, 7);
  else if (w->format == QL_FORMAT_F8R)
    p->f8_fold = f8_fold_ok(w);
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

/* The 16 scales of tile t as f32 (padding rows 0): q8c and f8r. */
static void tile_scales_f32(const ql_qweight *w, int64_t t, uint8_t *tile) {
  float sc[QL_CPU_TILE];
  for (int j = 0; j < QL_CPU_TILE; j++) {
    int64_t n = t * QL_CPU_TILE + j;
    sc[j] = n < w->n ? ql_load_f32(w->scale_dtype, w->scale, (size_t)n) : 0.0f;
  }
  memcpy(tile, sc, sizeof sc);
}

/* The data blocks of a q8c, q8b or f8r tile at blk0: byte i of dword j is
 * row j's byte at k0+i plus off (mod 256), pad past N and K. */
static void pack_bytes(const ql_qweight *w, const ql__cpu_packed *p, int64_t t,
                       uint8_t *blk0, unsigned off, uint8_t pad) {
  const uint8_t *q = w->qdata;
  int64_t blocks = ql__cpu_kblocks(p);
  for (int64_t b = 0; b < blocks; b++) {
    uint8_t *blk = blk0 + (size_t)b * QL_CPU_BLOCK;
    for (int j = 0; j < QL_CPU_TILE; j++) {
      int64_t n = t * QL_CPU_TILE + j;
      for (int i = 0; i < QL_CPU_Q8C_KB; i++) {
        int64_t k = b * QL_CPU_Q8C_KB + i;
        blk[4 * j + i] =
            n < w->n && k < w->k
                ? (uint8_t)(q[(size_t)n * (size_t)w->k + (size_t)k] + off)
                : pad;
      }
    }
  }
}

/* q8c: u = w + 128 (the two's complement byte with its top bit flipped). */
static void pack_q8c(const ql_qweight *w, ql__cpu_packed *p) {
  for (int64_t t = 0; t < p->tiles; t++) {
    uint8_t *tile = p->data + (size_t)t * p->tile_bytes;
    tile_scales_f32(w, t, tile);
    pack_bytes(w, p, t, tile + QL_CPU_BLOCK, 128u, 128u);
  }
}

/* f8r: the codes as they are, padding +0. */
static void pack_f8r(const ql_qweight *w, ql__cpu_packed *p) {
  for (int64_t t = 0; t < p->tiles; t++) {
    uint8_t *tile = p->data + (size_t)t * p->tile_bytes;
    tile_scales_f32(w, t, tile);
    pack_bytes(w, p, t, tile + QL_CPU_BLOCK, 0u, 0u);
  }
}

/* q8b: the header of scales (and zeros) per block, then the q8c blocks. */
static void pack_q8b(const ql_qweight *w, ql__cpu_packed *p) {
  size_t esz = ql_dtype_size(p->sdt);
  for (int64_t t = 0; t < p->tiles; t++) {
    uint8_t *tile = p->data + (size_t)t * p->tile_bytes;
    memset(tile, 0, p->sz_bytes); /* padding rows: scale = zero = 0 */
    for (int64_t g = 0; g < p->groups; g++) {
      uint8_t *gp = tile + (size_t)g * p->group_bytes;
      for (int j = 0; j < QL_CPU_TILE; j++) {
        int64_t n = t * QL_CPU_TILE + j;
        size_t src = (size_t)g * (size_t)w->n + (size_t)n;
        if (n >= w->n)
          continue;
        memcpy(gp + (size_t)j * esz, (const uint8_t *)w->scale + src * esz,
               esz);
        if (p->asym)
          memcpy(gp + (size_t)(QL_CPU_TILE + j) * esz,
                 (const uint8_t *)w->zero + src * esz, esz);
      }
    }
    pack_bytes(w, p, t, tile + p->sz_bytes, 128u, 128u);
  }
}

/* 1 when an f8r weight holds a NaN code (0x7F or 0xFF). */
static int f8r_has_nan(const ql_qweight *w) {
  for (size_t i = 0; i < w->qdata_bytes; i++)
    if ((w->qdata[i] & 0x7Fu) == 0x7Fu)
      return 1;
  return 0;
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
  if ((p = calloc(1, sizeof *p)) == NULL)
    return QL_ENOMEM;
  p->magic = QL_CPU_PACK_MAGIC;
  p->version = QL_CPU_PACK_VERSION;
  p->format = w->format;
  p->n = w->n;
  p->k = w->k;
  p->groups = w->groups;
  if (w->format == QL_FORMAT_Q4G || w->format == QL_FORMAT_Q8B) {
    p->gs = w->group_size;
    p->sdt = w->scale_dtype;
    p->asym = w->format == QL_FORMAT_Q8B && w->asymmetric;
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
  if (data == NULL || len != p->bytes ||
      ((uintptr_t)data & (QL_CPU_BLOCK - 1)) != 0) {
    free(p);
    return QL_EINVAL;
  }
  p->data = (uint8_t *)data; /* only read */
  p->borrowed = 1;
  /* Derived from the scales, which the caller has checked: not trusted
   * from the image. */
  layout_flags(w, p);
  *out = p;
  return 0;
}

int ql__cpu_pack(const ql_qweight *w, ql__cpu_packed **out) {
  ql__cpu_packed *p;
  int rc = layout_header(w, &p);
  *out = NULL;
  if (rc != 0)
    return rc;
  if (w->format == QL_FORMAT_F8R && f8r_has_nan(w)) {
    free(p);
    return QL_ENONFINITE;
  }
  p->data = layout_alloc(p->bytes);
  if (p->data == NULL) {
    free(p);
    return QL_ENOMEM;
  }
  switch (w->format) {
  case QL_FORMAT_Q4G:
    pack_q4g(w, p);
    break;
  case QL_FORMAT_Q8B:
    pack_q8b(w, p);
    break;
  case QL_FORMAT_F8R:
    pack_f8r(w, p);
    break;
  default:
    pack_q8c(w, p);
    break;
  }
  layout_flags(w, p);
  *out = p;
  return 0;
}

int ql__cpu_unpack(const ql__cpu_packed *p, uint8_t *qdata, void *scale,
                   void *zero) {
  if (p == NULL || p->magic != QL_CPU_PACK_MAGIC || qdata == NULL ||
      scale == NULL || ((p->format == QL_FORMAT_Q4G || p->asym) && zero == NULL))
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
    /* q8c, q8b, f8r: the same data blocks, u = w + 128 or the code */
    unsigned off = p->format == QL_FORMAT_F8R ? 0u : 128u;
    size_t esz = ql_dtype_size(p->sdt);
    for (int64_t n = 0; n < p->n; n++) {
      const uint8_t *tile = p->data + (size_t)(n / QL_CPU_TILE) * p->tile_bytes;
      int j = (int)(n % QL_CPU_TILE);
      if (p->format == QL_FORMAT_Q8B) {
        for (int64_t g = 0; g < p->groups; g++) {
          const uint8_t *gp = tile + (size_t)g * p->group_bytes;
          size_t dst = (size_t)g * (size_t)p->n + (size_t)n;
          memcpy((uint8_t *)scale + dst * esz, gp + (size_t)j * esz, esz);
          if (p->asym)
            memcpy((uint8_t *)zero + dst * esz,
                   gp + (size_t)(QL_CPU_TILE + j) * esz, esz);
        }
      } else {
        memcpy((float *)scale + n, tile + (size_t)j * sizeof(float),
               sizeof(float));
      }
      for (int64_t k = 0; k < p->k; k++) {
        const uint8_t *blk = tile + p->sz_bytes +
                             (size_t)(k / QL_CPU_Q8C_KB) * QL_CPU_BLOCK;
        qdata[(size_t)n * (size_t)p->k + (size_t)k] =
            (uint8_t)(blk[4 * j + (int)(k % QL_CPU_Q8C_KB)] - off);
      }
    }
  }
  return 0;
}
