/*
 * ql_kernels.h - the kernel library (libqlkernels): weight formats
 * (quantize, pack, dequantize), activation quantization and the generic
 * reference linear ops. Plain C11, no dependency outside libc/libm; it
 * includes nothing from daemon/ or client/.
 *
 * Numerical contract: ../DESIGN.md §4 (mirrored in README). Every function
 * validates its arguments and returns 0 or a negative QL_E* code; none of
 * them asserts on data.
 *
 * Layouts (row-major, canonical, what is stored):
 *   q4g: qdata [N, ceil(K/2)] bytes, two signed 4-bit values q in [-8,7] per
 *        byte along K, even k in the low nibble (q & 0xF), a padding nibble
 *        for odd K is 0; scale, zero [G, N] in scale_dtype, G = ceil(K/gs).
 *   q8c: qdata [N, K] int8; scale [N] in scale_dtype; zero is NULL.
 *   q8b: qdata [N, K] int8; scale [G, N] in scale_dtype, G = ceil(K/B) for
 *        the block length B = group_size; zero [G, N] in scale_dtype when
 *        asymmetric, else NULL.
 *   f8r: qdata [N, K] float8 e4m3fn codes (1 sign, 4 exponent bits with
 *        bias 7, 3 mantissa bits; no Inf; 0x7F/0xFF are NaN, which
 *        quantize never writes); scale [N] in scale_dtype; zero is NULL.
 * Index g·N + n of a [G, N] array is group g of row n.
 */
#ifndef QL_KERNELS_H
#define QL_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "ql_defs.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest N, K (and M for the ops) accepted anywhere: 2^31 - 1, so that
 * every index fits an int32 on devices and every size product is checked
 * against SIZE_MAX without surprises. */
#define QL_DIM_MAX ((int64_t)2147483647)

/* The eps that clamps int8 symmetric scales from below: TorchAO's
 * choose_qparams_affine defaults to torch.finfo(input.dtype).eps, which for
 * an f32 input is FLT_EPSILON = 2^-23. */
#define QL_I8_SCALE_EPS 1.1920928955078125e-07f /* 2^-23 */

/* Longest group whose Σ xq still fits an int32 (128 · 2^24 = 2^31). */
#define QL_QROWS_MAX_GROUP ((int64_t)1 << 24)

/* Largest K for the q8c AQ path: Σk xq·wq is accumulated in int32 and one
 * term can be (-128)·(-128) = 2^14, so K·2^14 must stay below 2^31. */
#define QL_AQ_Q8C_MAX_K ((int64_t)131071)

/* f8r: the largest finite e4m3fn value, and the floor on a row's amax: the
 * amax floor of TorchAO's float8 training (torchao/float8/float8_utils.py
 * EPS), passed as hp_value_lb; TorchAO 0.18's float8 quantize_ config
 * applies none, so an all-zero row gets NaN codes there (formats.c). */
#define QL_E4M3_MAX 448.0f
#define QL_F8_AMAX_LB 1e-12f

/* The floor on an f16 e4m3 activation scale: 2^-24, the smallest positive
 * f16 (see ql_quantize_rows_e4m3_src; TorchAO's scale is 0 there). */
#define QL_F8_F16_SCALE_MIN 5.9604644775390625e-08f /* 2^-24 */

/* A quantized weight in canonical form. Immutable once built; owned by
 * whoever called ql_qweight_quantize(), released with ql_qweight_free(). */
typedef struct ql_qweight {
  ql_format format;
  uint32_t group_size;  /* q4g: elements per group along K; q8b: elements
                           per block along K; q8c, f8r: K */
  int64_t n;            /* out_features (rows of W) */
  int64_t k;            /* in_features */
  int64_t groups;       /* G = ceil(K / group_size); 1 for q8c and f8r */
  int asymmetric;       /* 1 for a q8b weight with a zero point (zero !=
                           NULL), 0 for every other weight (q4g always has
                           zero[]; the flag is q8b's choice only) */
  ql_dtype scale_dtype; /* dtype of scale[] and zero[] */
  uint8_t *qdata;       /* packed values, layout above */
  size_t qdata_bytes;
  void *scale;          /* [G, N] (q4g, q8b) or [N] (q8c, f8r) */
  void *zero;           /* [G, N] (q4g, asymmetric q8b), else NULL */
  size_t scale_bytes;   /* bytes of scale[] (zero[] has the same size) */
  float *bias;          /* [N] f32, or NULL */
  /* 0: the arrays are the weight's own (malloc'd) and ql_qweight_free()
   * frees them. 1: they are borrowed (ql_qweight_import_borrowed(), e.g.
   * from a mapped file) and never written; ql_qweight_free() calls
   * release(backing) instead, when release is set. */
  int borrowed;
  void (*release)(void *backing);
  void *backing;
} ql_qweight;

/*
 * The version of ql_qweight_quantize()'s rules, announced by the daemon
 * (Hello) so that a client naming a weight after its float content can
 * tell weights quantized by other rules apart. 1: every default scale in
 * the weight's dtype. 2: q8c and f8r scales of a bf16/f16 weight stored as
 * f32 (TorchAO 0.18's bytes). Bump it whenever a default's bytes change.
 */
#define QL_QUANTIZER_VERSION 2

/* How ql_qweight_quantize() quantizes. */
typedef struct ql_quant_params {
  ql_format format;
  uint32_t group_size;  /* q4g group, q8b block: 32, 64, 128 or 256;
                           ignored for q8c and f8r */
  int asymmetric;       /* q8b: 1 = asymmetric (float zero point), 0 =
                           symmetric; must be 0 for the other formats */
  /* dtype of the stored scale[] and zero[]. 0, the default, gives
   * TorchAO 0.18's bytes: for a bf16/f16 weight the scale is rounded to
   * the weight's dtype, where TorchAO computes it, and stored as TorchAO
   * stores it, in that dtype for q4g (Int4Tensor: scale.to(w.dtype)) and
   * as f32 for q8c and f8r (Int8Tensor and Float8Tensor widen it); q8b,
   * not a TorchAO format, keeps it in the weight's dtype. An explicit
   * dtype both rounds and stores in that dtype (f32: the unrounded f32
   * quotient, closer to the weight than TorchAO's and not its bytes).
   * The codes always use the stored scale. (f16 f8r rows with amax <=
   * 448·2^-25 get an f16 scale of 0: TorchAO writes NaN and ±448 codes
   * there, we write zeros.) */
  ql_dtype scale_dtype;
} ql_quant_params;

/* ---- scalar conversions (round to nearest even, NaN stays NaN) ---- */
float ql_f16_to_f32(uint16_t h);
uint16_t ql_f32_to_f16(float f);
float ql_bf16_to_f32(uint16_t h);
uint16_t ql_f32_to_bf16(float f);
/* Widen n elements of src (dtype dt) to f32. dt must be valid (callers
 * validate it); an invalid dt fills dst with NaN. src and dst may overlap
 * only when dt is f32. */
void ql_to_f32(ql_dtype dt, const void *src, float *dst, size_t n);
/* Narrow n f32 values to dtype dt (f32 is a copy). f16 overflows to ±Inf.
 * An invalid dt writes nothing. */
void ql_from_f32(ql_dtype dt, const float *src, void *dst, size_t n);
/* Element i of a scale/zero array of dtype dt, as f32 (NaN for an invalid
 * dt). */
float ql_load_f32(ql_dtype dt, const void *p, size_t i);
/* v rounded to dtype dt (nearest even; f16 overflows to ±Inf) and widened
 * back to f32; the identity for f32 (and an invalid dt). */
float ql_round_to(ql_dtype dt, float v);

/* float8 e4m3fn. Narrowing rounds to nearest, ties to even, and saturates:
 * every finite |f| >= 448 and ±Inf give ±448 (0x7E/0xFE); NaN gives 0x7F,
 * or 0xFF when its sign bit is set; |f| <= 2^-10 (half the smallest
 * subnormal, 2^-9) gives a zero of f's sign. This is what torch 2.15's
 * tensor.to(torch.float8_e4m3fn) does for every f32 (checked exhaustively,
 * offline). Widening is exact; 0x7F/0xFF widen to the quiet NaN
 * 0x7FF00000 with the code's sign, as torch does. */
uint8_t ql_f32_to_e4m3(float f);
float ql_e4m3_to_f32(uint8_t c);

/* True when group size gs is valid for format f (q4g and q8b: 32/64/128/
 * 256; q8c and f8r: any value, it is ignored). */
int ql_group_size_valid(ql_format f, uint32_t gs);

/*
 * Computes the byte sizes of the canonical arrays for a weight without
 * building it; fails with QL_EINVAL/QL_EFORMAT/QL_ESHAPE on bad parameters
 * or sizes that overflow. Any output pointer may be NULL.
 * QL_EFORMAT: f is not a ql_format; QL_EDTYPE: bad scale_dtype (0 is not
 * resolved here); QL_EINVAL: bad group size for q4g or q8b; QL_ESHAPE: n or
 * k outside [1, QL_DIM_MAX], or a size overflows size_t. *scale_bytes is
 * also the size of zero[] where the weight has one.
 */
int ql_qweight_sizes(ql_format f, uint32_t gs, int64_t n, int64_t k,
                     ql_dtype scale_dtype, size_t *qdata_bytes,
                     size_t *scale_bytes, int64_t *groups);

/*
 * Quantizes the float weight w [N,K] (dtype src_dtype, widened to f32 first)
 * as p says (DESIGN §4 gives each rule; formats.c cites the TorchAO code it
 * mirrors). bias [N] (same dtype as w) may be NULL. NaN or Inf anywhere in
 * w or bias fails with QL_ENONFINITE, and so does finite data whose scale
 * or zero is not finite once rounded to the scale dtype (e.g. |w| > ~8.3e6
 * with f16 q8c scales, or a q4g group spanning more than FLT_MAX), or
 * whose dequantized values would not be (a row reaching ~3.4e38 in q8c,
 * whose code -128 is -128/127 of its largest value). Errors:
 * QL_EINVAL for a NULL p, w or out, a bad group size, or asymmetric not 0
 * (or, for q8b, not 0 or 1); then those of ql_qweight_sizes(). On success
 * *out is a new weight the caller owns; on failure *out is NULL and nothing
 * leaks. For q8c and f8r, group_size is set to K.
 */
/*
 * The index of w's first (scale, zero) pair whose extreme code dequantizes
 * past FLT_MAX (|q|max·|s| + |z|, in double), or -1 when every
 * dequantized value is finite. ql_qweight_quantize() and the imports
 * refuse such weights with QL_ENONFINITE.
 */
int64_t ql__qweight_range_fault(const ql_qweight *w);

int ql_qweight_quantize(const ql_quant_params *p, int64_t n, int64_t k,
                        ql_dtype src_dtype, const void *w, const void *bias,
                        ql_qweight **out);

/* Frees w and everything it holds. Safe on NULL and on a half-built weight
 * (any pointer member may be NULL). */
void ql_qweight_free(ql_qweight *w);

/*
 * Checks that w is a well-formed canonical weight: a supported format, a
 * valid shape, group size and scale dtype, groups/qdata_bytes/scale_bytes
 * equal to what ql_qweight_sizes() gives, qdata and scale present, zero
 * present exactly for q4g and asymmetric q8b, and asymmetric 0 or 1 (1 only
 * for q8b). It does not read the arrays. 0 or the ql_qweight_sizes()
 * error, QL_EINVAL for inconsistent members.
 */
int ql_qweight_check(const ql_qweight *w);

/* Writes dequant(W) [N,K] as f32 into out (N*K floats). q4g and
 * asymmetric q8b: x̂ = (float)q·scale + zero; q8c and symmetric q8b:
 * x̂ = (float)q·scale; f8r: x̂ = e4m3(q)·scale; in f32 with the stored
 * scale/zero widened to f32 (each a single product, then a single sum). */
int ql_qweight_dequantize(const ql_qweight *w, float *out);

/* Writes row n of dequant(W) (K floats, the same values as
 * ql_qweight_dequantize) into out. QL_ESHAPE when n is out of range. */
int ql_qweight_dequantize_row(const ql_qweight *w, int64_t n, float *out);

/*
 * Per-row activation quantization, the AQ path of DESIGN §4. The _src
 * forms take the dtype src the activations arrived in: x holds them
 * widened to f32 (exact), and the scale is computed as TorchAO computes it
 * for an input of that dtype. The plain forms are the _src forms with
 * src = QL_DTYPE_F32 (f32 activations).
 *
 * The rule below is a numerical contract that every backend reproduces bit
 * for bit: each step is one IEEE-754 operation, rounded as stated, in this
 * order; nothing is contracted into an FMA or reassociated. rnd_src(v)
 * rounds the f32 value v to src, nearest even, subnormals included
 * (ql_f32_to_bf16 / ql_f32_to_f16), and widens the result back to f32
 * exactly; for f32 it is the identity. amax = max_k |x[k]| is exact.
 *
 * int8 (the q8c rule), per row:
 *   s   = amax / 127.5f                         f32 division, correctly rounded
 *   s   = rnd_src(s)
 *   s   = max(s, QL_I8_SCALE_EPS)               2^-23, exact in every src
 *   inv = 1.0f / s                              f32 division, correctly rounded
 *   q   = clamp(rne(x[k] * inv), -128, 127)     f32 product, rounded once
 *   sx  = s
 * This is TorchAO Int8Tensor.from_hp(x, PerRow())
 * (torchao/quantization/quantize_/workflows/int8/int8_tensor.py), which
 * Int8DynamicActivationInt8WeightConfig runs on each activation:
 * _choose_qparams_affine (quant_primitives.py) divides the src-dtype amax
 * tensor by the Python float 127.5, which ATen evaluates in f32 and rounds
 * to src, clamps it with min=finfo(f32).eps in src and widens it to f32;
 * _quantize_affine_no_dtype_cast then computes input * (1.0 / scale): the
 * reciprocal of that f32 scale in f32, the src input promoted to f32 by
 * the f32 scale, torch.round (half to even), clamp.
 *
 * e4m3 (the f8r rule), per row:
 *   s   = max(amax, QL_F8_AMAX_LB) / 448.0f      f32 division, correctly rounded
 *   s   = rnd_src(s)
 *   s   = max(s, 2^-24)                          f16 only (QL_F8_F16_SCALE_MIN)
 *   q   = ql_f32_to_e4m3(clamp(x[k] / s, -448, 448))   f32 division, correctly
 *                                                rounded; no reciprocal
 *   sx  = s
 * This is TorchAO Float8Tensor.from_hp(x, float8_e4m3fn, PerRow(),
 * hp_value_lb=1e-12) with the torch kernel choice
 * (quantize_/workflows/float8/float8_tensor.py): _choose_scale_float8
 * (quant_primitives.py) computes max_abs.clamp(min=hp_value_lb) / 448 in
 * src and widens it to f32; _quantize_affine_float8 computes
 * x.to(f32) / scale, clamps to ±448 and casts to float8_e4m3fn.
 *
 * Notes on the 16-bit cases, each checked against torch 2.15 / TorchAO
 * 0.18 on the CPU (tests/data/make_golden.py has the golden cases):
 *  - rnd_src of an f32 result is what ATen does for a 16-bit tensor (it
 *    computes in f32 and rounds once to the dtype). For these divisions it
 *    also equals the correctly rounded division in src: the same for every
 *    finite bf16 and f16 amax (exhaustive).
 *  - TorchAO clamps amax at hp_value_lb in src. In bf16 that bound is
 *    bf16(1e-12) rather than 1e-12, which gives the same s for every bf16
 *    amax (exhaustive). In f16, 1e-12 rounds to 0: TorchAO's f16 scale is
 *    0 for every row with amax <= 448·2^-25 (an all-zero row included) and
 *    its codes are then NaN (0/0) and ±448 (x/0). Here such a row gets
 *    s = 2^-24, the smallest positive f16 (so an all-zero row gives zero
 *    codes and a tiny row is quantized properly): the one place where this
 *    rule departs from TorchAO. bf16 and f32 need no such floor: there s
 *    is at least QL_F8_AMAX_LB/448 rounded, about 2.2e-15.
 *  - TorchAO clamps the int8 scale at eps in src, after the rounding;
 *    eps is exact in bf16 and f16, so the order does not matter.
 *  - sx is always a positive normal f32.
 *
 * Arguments: x [M,K]; outputs xq [M,K] (int8, or e4m3 codes), sx [M], and,
 * for int8, when gsum is not NULL, gsum [M, ceil(K/gs)] = per-group Σ xq
 * (int32, the last group may be short). Errors: QL_EINVAL for NULL x, xq
 * or sx, gs < 1, or a value of x that src cannot represent exactly (x must
 * be src data widened); QL_EDTYPE for a src that is not a ql_dtype;
 * QL_ESHAPE for M or K outside [1, QL_DIM_MAX], M·K overflowing size_t, or,
 * with gsum, min(gs, K) > QL_QROWS_MAX_GROUP. A row holding NaN or Inf
 * fails the whole call with QL_ENONFINITE. On any error the outputs are
 * unspecified.
 */
int ql_quantize_rows_i8_src(ql_dtype src, const float *x, int64_t m,
                            int64_t k, uint32_t gs, int8_t *xq, float *sx,
                            int32_t *gsum);
int ql_quantize_rows_e4m3_src(ql_dtype src, const float *x, int64_t m,
                              int64_t k, uint8_t *xq, float *sx);

/* ql_quantize_rows_i8_src / _e4m3_src with src = QL_DTYPE_F32: for f32
 * activations (the rule above with rnd_src the identity). */
int ql_quantize_rows_i8(const float *x, int64_t m, int64_t k, uint32_t gs,
                        int8_t *xq, float *sx, int32_t *gsum);
int ql_quantize_rows_e4m3(const float *x, int64_t m, int64_t k, uint8_t *xq,
                          float *sx);

/*
 * Reference weight-only linear: y[m,n] = Σ_k x[m,k]·dequant(W)[n,k] (+ b[n]),
 * fp32 accumulation in increasing k starting from 0.0f, then + b[n] in f32,
 * then one rounding to dt. q4g factors the zero out of each group
 * (dequant = q·scale + zero):
 *   acc = 0.0f; for g in increasing order:
 *     a = 0.0f; for k in g, increasing: a = fmaf(x[k], (float)q[k], a);
 *     acc = acc + fmaf(zero[g,n], xs[g], scale[g,n]·a)
 * xs[g] = Σk∈g x[k] in f32 from 0.0f in increasing k (ql_q4g_group_sums).
 * q8c factors the scale out of the row:
 *   a = 0.0f; for k increasing: a = fmaf(x[k], (float)q[k], a);
 *   acc = scale[n]·a x [M,K] and y [M,N] are in dtype dt,
 * 1 <= M <= QL_DIM_MAX. Non-finite activations fail with QL_ENONFINITE
 * before y is written. Memory: O(M·K + K) floats; W is dequantized one row
 * at a time.
 */
/* xs [m][ceil(k/gs)] = the f32 sums of x [m][k] over each group of gs
 * values, from 0.0f in increasing k: the Σx of q4g WO (above). */
void ql_q4g_group_sums(const float *x, int64_t m, int64_t k, uint32_t gs,
                       float *xs);

int ql_linear_wo_ref(const ql_qweight *w, ql_dtype dt, const void *x,
                     int64_t m, void *y);

/*
 * Reference activation-quantized linear (DESIGN §4 "AQ math"). x rows are
 * widened to f32 and quantized with ql_quantize_rows_i8_src (gs =
 * group_size for q4g, K for q8c) or, for f8r, ql_quantize_rows_e4m3_src,
 * with src = dt: a bf16/f16 request computes its scales as TorchAO does
 * for that dtype, so its result is not the f32 result rounded to dt;
 * q8c: y = (float)acc · (sx[m]·sw[n]), acc = Σk xq·wq in int32, so K must
 *      not exceed QL_AQ_Q8C_MAX_K (QL_ESHAPE otherwise);
 * q4g: y = sx[m]·Σg (scale[g,n]·(float)Σk∈g xq·q + zero[g,n]·(float)Σk∈g xq),
 *      int32 in a group, fp32 across groups in increasing g, the scale term
 *      added before the zero term;
 * f8r: y = acc · (sx[m]·sw[n]), acc = Σk e4m3(xq)·e4m3(wq) in f32 starting
 *      from 0.0f in increasing k (our fixed reduction order); each product
 *      is exact in f32 (two 4-bit significands), so only the sums round;
 * then + b[n] in f32 and one rounding to dt. q8b is weight-only: QL_ENOTSUP
 * (after the argument checks). Otherwise the same argument rules and
 * errors as ql_linear_wo_ref.
 */
int ql_linear_aq_ref(const ql_qweight *w, ql_dtype dt, const void *x,
                     int64_t m, void *y);

#ifdef __cplusplus
}
#endif
#endif /* QL_KERNELS_H */
