/*
 * cpu.h - internals of the CPU backend (kernels/cpu/): the instruction
 * level chosen at run time, the fixed thread pool, the repacked weight
 * layout and the per-level kernel tables. Nothing outside kernels/cpu/
 * includes this file; the rest of the tree sees the backend only through
 * the registry (kernels/cpu/backend.c is its one registration point).
 *
 * Numerics: every kernel here gives the same bytes as the generic
 * reference op (kernels/reference.c) for the same canonical weight, at
 * every level and for every thread count. Each output element is reduced
 * in the reference's order (increasing k, one f32 rounding per product and
 * per sum for WO, one FMA per weight and a per-group or per-row epilogue
 * for q4g and q8c WO;
 * exact int32 sums and the reference's f32 epilogue for AQ), and the SIMD lanes run across output rows n, never across k. So the
 * result of a row depends on that row alone (batch invariance, DESIGN §4),
 * on neither the split of N between threads nor the level. The files that
 * hold these kernels are compiled with -ffp-contract=off like the rest of
 * libqlkernels; an FMA anywhere in them would break the equality.
 */
#ifndef QL_CPU_H
#define QL_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "ql_kernels.h"

/* ------------------------------------------------------------ levels */

/* Instruction levels, lowest first. A level implies every lower one. */
typedef enum ql__cpu_level {
  QL_CPU_LEVEL_C = 0,         /* plain C */
  QL_CPU_LEVEL_AVX2 = 1,      /* AVX2 + FMA + F16C, int8 dots widened to
                                 int16 (vpmaddwd; vpmaddubsw saturates) */
  QL_CPU_LEVEL_AVX2_VNNI = 2, /* the above with AVX-VNNI vpdpbusd on ymm */
  QL_CPU_LEVEL_AVX512 = 3,    /* AVX-512 F/BW/VL/VNNI */
  QL_CPU_LEVEL_COUNT
} ql__cpu_level;

/*
 * The level the backend runs at, fixed at the first call in the process:
 * the highest one CPUID (__builtin_cpu_supports, which also checks that
 * the OS saves the register state) allows, lowered by the environment
 * variable QL_CPU_LEVEL = avx512 | avx2vnni | avx2 | c. The override can
 * only lower the level: asking for one the CPU lacks gives the detected
 * level. An unknown value is ignored.
 */
ql__cpu_level ql__cpu_level_get(void);

/* The highest level this CPU supports, ignoring the override. */
ql__cpu_level ql__cpu_level_detected(void);

/* The level a cap (QL_CPU_LEVEL, cpu_level) of want gives here: want, or
 * the detected level when lower, and avx2 for avx2vnni on a CPU with
 * AVX-512 VNNI but not AVX-VNNI. */
ql__cpu_level ql__cpu_level_capped(ql__cpu_level want);

/* "c", "avx2", "avx2vnni", "avx512". */
const char *ql__cpu_level_name(ql__cpu_level l);

/* ------------------------------------------------------- thread pool */

/*
 * The fixed pool: QL_CPU_THREADS threads in all (the calling thread
 * included), default the CPUs this process may run on. Created on the
 * first parallel call; threads live until the process exits; a child of
 * fork() builds its own pool on its first call. Calls from several
 * threads are serialized; fn must not call back into the pool.
 */
int ql__cpu_threads(void);

/* Sets the pool's size before it is created: threads in [1, 256], or 0 for
 * the default above. 0, QL_EINVAL, or QL_ENOTSUP once the pool exists with
 * another size. */
int ql__cpu_set_threads(unsigned threads);

/* Caps the level at name ("auto": no cap) before any kernel ran: 0,
 * QL_EINVAL (unknown name), QL_ENOTSUP (above the detected level). */
int ql__cpu_level_set(const char *name);

/*
 * Runs fn(ctx, part, parts) for part = 0 .. parts-1, parts =
 * min(max_parts, ql__cpu_threads()), one part per pool thread (several on
 * a thread where the pool could not start them all), part 0 on the
 * calling thread, and returns when all have returned. max_parts <= 1 runs
 * fn(ctx, 0, 1) inline without touching the pool.
 */
void ql__cpu_parallel(void (*fn)(void *ctx, int part, int parts), void *ctx,
                      int max_parts);

/* ----------------------------------------------------------- layout */

/* Output rows per tile: the 16 f32/int32 lanes of one 512-bit register
 * (two 256-bit halves at the AVX2 level). */
#define QL_CPU_TILE 16
/* Bytes of one block of the layout: one 64-byte line, one dword per row
 * of a tile. */
#define QL_CPU_BLOCK 64
/* k per block: 8 int4 values or 4 int8 / e4m3 values per row and dword
 * (q8b and f8r use the q8c blocking). */
#define QL_CPU_Q4G_KB 8
#define QL_CPU_Q8C_KB 4

#define QL_CPU_PACK_MAGIC 0x55504351u /* "QCPU" */
#define QL_CPU_PACK_VERSION 1u
/* The registry's name of the layout image (cached across restarts): bump
 * it with QL_CPU_PACK_VERSION. */
#define QL_CPU_LAYOUT_ID "cpu-1"

/*
 * The CPU layout of a weight, made by repack at load (canonical form
 * unchanged). Tiles of 16 output rows, one after the other; inside a tile
 * the weight streams in k order, one 64-byte block per step, dword j of a
 * block holding row j (so a SIMD load gives one value set per row, the
 * lanes of the kernels), rows past N padded with zero weights.
 *
 * q4g: per group g, first its scale and zero for the 16 rows (16 values
 *      each in the weight's scale dtype, then zero padding to a multiple
 *      of 64 bytes: sz_bytes), then ceil(len_g/8) blocks. Block b covers
 *      k0 = g·gs + 8b .. k0+7: byte i (0..3) of dword j holds u = q + 8 of
 *      row j at k0+i in its low nibble and at k0+4+i in its high nibble
 *      (u in [0, 15]: the unsigned operand of vpdpbusd; padding k past K
 *      holds u = 8, q = 0). Group g starts at g·group_bytes inside the
 *      tile.
 * q8c: first the 16 scales as f32 (64 bytes), then ceil(K/4) blocks; byte
 *      i of dword j holds u = w + 128 of row j at k0+i (padding u = 128).
 * q8b: first the scales (and zeros) of every block of B k for the 16 rows:
 *      for block g, 16 scales then, when asymmetric, 16 zeros, in the
 *      weight's scale dtype (group_bytes apart), the whole header padded
 *      to a multiple of 64 bytes (sz_bytes); then ceil(K/4) blocks exactly
 *      as q8c's (u = q + 128). B is a multiple of 4, so each 64-byte block
 *      lies in one q8b block: block b uses scale block 4b / B. Keeping the
 *      scales apart from the data lets both streams run without padding
 *      each group to a cache line (a sym bf16 group header is 32 bytes).
 * f8r: as q8c, the 16 scales as f32 then ceil(K/4) blocks; byte i of dword
 *      j holds the e4m3 code of row j at k0+i, unchanged (padding 0x00,
 *      +0). ql__cpu_pack refuses the NaN codes 0x7F/0xFF (QL_ENONFINITE),
 *      which quantize never writes and import refuses: the SIMD decoding
 *      (kern_avx512.c) has no NaN.
 */
typedef struct ql__cpu_packed {
  uint32_t magic;   /* QL_CPU_PACK_MAGIC */
  uint32_t version; /* QL_CPU_PACK_VERSION */
  ql_format format;
  int64_t n, k;
  uint32_t gs;        /* q4g group size, q8b block length; K for q8c
                         and f8r */
  int64_t groups;     /* G */
  int asym;           /* q8b: 1 with zeros in the header */
  ql_dtype sdt;       /* dtype of the scales/zeros in the layout (q4g,
                         q8b: the weight's; q8c, f8r: f32) */
  int64_t tiles;      /* ceil(N / 16) */
  size_t tile_bytes;  /* stride between tiles */
  size_t group_bytes; /* q4g: stride between groups in a tile; q8b:
                         stride between blocks in the tile's header */
  size_t sz_bytes;    /* q4g: bytes of a group's scale+zero header; q8b:
                         bytes of the tile's header; q8c, f8r: 64 */
  size_t bytes;       /* total size of data */
  int fma_dequant;    /* asymmetric q8b: every (scale, zero) of
                         the weight has fl(fl(q·s) + z) == fma(q, s, z)
                         for every q of the format (pack.c says when), so
                         the kernels may dequantize with one FMA; 0
                         otherwise */
  int f8_fold;        /* f8r: every scale s has s·2^120 finite, so the
                         SIMD kernels may fold their decoding factor 2^120
                         into the scale (kern_avx512.c); 0 otherwise */
  uint8_t *data;      /* 64-byte aligned, tiles·tile_bytes bytes */
  int borrowed;       /* data is not ours (ql__cpu_packed_adopt) */
} ql__cpu_packed;

/* Builds the layout of w (any format). 0, QL_ENOMEM, QL_ENONFINITE (an
 * f8r weight holding a NaN code), QL_ESHAPE (a layout too large for
 * size_t), or the error of ql_qweight_check(). *out is the caller's,
 * freed with ql__cpu_packed_free. */
int ql__cpu_pack(const ql_qweight *w, ql__cpu_packed **out);

/* Safe on NULL. */
void ql__cpu_packed_free(ql__cpu_packed *p);

/* The layout of w around data (len bytes, 64-byte aligned), an image of a
 * layout ql__cpu_pack made of the same weight: only its size is checked;
 * data is borrowed (not freed with the layout). 0, QL_EINVAL (len or
 * alignment), QL_ENOMEM, or the error of ql_qweight_check(). */
int ql__cpu_packed_adopt(const ql_qweight *w, const void *data, size_t len,
                         ql__cpu_packed **out);

/* 1 when p is a layout of w: same format, shape, group size, scale dtype
 * and (q8b) zero point. */
int ql__cpu_packed_matches(const ql__cpu_packed *p, const ql_qweight *w);

/* Writes the canonical qdata/scale/zero of the weight p was made from
 * into w's arrays (allocated by the caller with ql_qweight_sizes()
 * sizes): the inverse of ql__cpu_pack, for the round-trip tests. q8c
 * and f8r scales come back as the f32 values (exact for any stored
 * dtype); zero is only written for q4g and asymmetric q8b. */
int ql__cpu_unpack(const ql__cpu_packed *p, uint8_t *qdata, void *scale,
                   void *zero);

/* Number of k blocks in group g of a q4g layout. */
static inline int64_t ql__cpu_q4g_blocks(const ql__cpu_packed *p, int64_t g) {
  int64_t k0 = g * (int64_t)p->gs, len = p->k - k0;
  if (len > (int64_t)p->gs)
    len = (int64_t)p->gs;
  return (len + QL_CPU_Q4G_KB - 1) / QL_CPU_Q4G_KB;
}

/* ----------------------------------------------- quantized activations */

/* Activation rows for the AQ kernels. int8 (q4g, q8c), quantized with the
 * bit-exact int8 rule: xq [m][kp] int8 (zeros past K), sx [m]; q4g also
 * gsum8 [m][G] = 8·Σ xq and gsumf [m][G] = (float)Σ xq per group; q8c
 * gsum8 [m] = 128·Σ xq over the row (the offset of u = w + 128).
 * e4m3 (f8r), quantized with the bit-exact e4m3 rule: xc [m][kp] codes
 * (0x00 past K), xe [m][kp] = e4m3(xc)·2^119 as f32 (exact; 0 past K),
 * the form the SIMD kernels multiply (kern_avx512.c), and sx [m]. */
typedef struct ql__cpu_xq {
  const int8_t *xq;
  int64_t m, kp;
  const float *sx;
  const int32_t *gsum8;
  const float *gsumf;
  const uint8_t *xc;
  const float *xe;
} ql__cpu_xq;

/* The factor in xe (ql__cpu_xq). */
#define QL_CPU_F8_XSCALE 0x1p119f

/* ------------------------------------------------- per-level kernels */

/*
 * One instruction level's kernels. Each computes the rows of y for the
 * tiles [t0, t1) of p, all m rows, as f32 ([m][N], bias added when bias is
 * not NULL), exactly as kernels/reference.c does.
 *  wo_*:   x [m][K] f32, finite. wo_q4g also takes xs [m][G], the group
 *          sums of x (ql_q4g_group_sums), and computes the factored form
 *          of ql_linear_wo_ref.
 *  aq_*:   xq as above.
 *  quant_row: one row of ql_quantize_rows_i8_src (same bytes), x [k]
 *          f32 holding src values widened (not checked: the callers
 *          widened them); QL_ENONFINITE when the row holds NaN or Inf.
 *  quant_row_e4m3: the same for ql_quantize_rows_e4m3_src: codes xc [k]
 *          and sx, and when xe is not NULL xe [k] = e4m3(xc)·2^119
 *          (ql__cpu_xq).
 */
typedef struct ql__cpu_kernels {
  void (*wo_q4g)(const ql__cpu_packed *p, const float *x, const float *xs,
                 int64_t m, int64_t t0, int64_t t1, const float *bias,
                 float *y);
  void (*wo_q8c)(const ql__cpu_packed *p, const float *x, int64_t m, int64_t t0,
                 int64_t t1, const float *bias, float *y);
  void (*aq_q4g)(const ql__cpu_packed *p, const ql__cpu_xq *xq, int64_t t0,
                 int64_t t1, const float *bias, float *y);
  void (*aq_q8c)(const ql__cpu_packed *p, const ql__cpu_xq *xq, int64_t t0,
                 int64_t t1, const float *bias, float *y);
  int (*quant_row)(ql_dtype src, const float *x, int64_t k, int8_t *xq,
                   float *sx);
  void (*wo_q8b)(const ql__cpu_packed *p, const float *x, int64_t m, int64_t t0,
                 int64_t t1, const float *bias, float *y);
  void (*wo_f8r)(const ql__cpu_packed *p, const float *x, int64_t m, int64_t t0,
                 int64_t t1, const float *bias, float *y);
  void (*aq_f8r)(const ql__cpu_packed *p, const ql__cpu_xq *xq, int64_t t0,
                 int64_t t1, const float *bias, float *y);
  int (*quant_row_e4m3)(ql_dtype src, const float *x, int64_t k, uint8_t *xc,
                        float *xe, float *sx);
} ql__cpu_kernels;

extern const ql__cpu_kernels ql__cpu_kernels_c;
extern const ql__cpu_kernels ql__cpu_kernels_avx2;
extern const ql__cpu_kernels ql__cpu_kernels_avx2vnni;
extern const ql__cpu_kernels ql__cpu_kernels_avx512;

/* rnd_src of the int8 rule (ql_kernels.h): v rounded to src and widened
 * back; the identity for f32. */
static inline float ql__cpu_rnd_src(ql_dtype src, float v) {
  return ql_round_to(src, v);
}

/* The scale of an e4m3 row of amax amax (finite) in src: the scalar steps
 * of ql_quantize_rows_e4m3_src. */
static inline float ql__cpu_e4m3_scale(ql_dtype src, float amax) {
  float s = ql__cpu_rnd_src(
      src, (amax > QL_F8_AMAX_LB ? amax : QL_F8_AMAX_LB) / QL_E4M3_MAX);
  if (src == QL_DTYPE_F16 && s < QL_F8_F16_SCALE_MIN)
    s = QL_F8_F16_SCALE_MIN;
  return s;
}

/* Number of 64-byte data blocks of a q8c, q8b or f8r layout. */
static inline int64_t ql__cpu_kblocks(const ql__cpu_packed *p) {
  return (p->k + QL_CPU_Q8C_KB - 1) / QL_CPU_Q8C_KB;
}

/* 1 when the calling thread's SSE control word has DAZ (denormal inputs
 * read as zero) set. The SIMD f8r kernels decode e4m3 codes through f32
 * subnormals, which DAZ would flush; they hand such calls to the C level,
 * whose arithmetic is the reference's under any MXCSR. */
int ql__cpu_daz(void);

/* The kernels of level l. */
const ql__cpu_kernels *ql__cpu_kernels_for(ql__cpu_level l);

#endif /* QL_CPU_H */
