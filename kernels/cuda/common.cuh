// common.cuh - device helpers shared by the kernels of kernels/cuda/:
// number conversions with the exact bit rules of kernels/convert.c, loads
// and stores of activations in their dtype, and the fixed-order warp sum.
//
// Every floating-point step here and in the kernels is an explicit
// single-rounding intrinsic (__fmul_rn, __fadd_rn, __fmaf_rn, __fdiv_rn), so
// nvcc cannot contract or reorder it and the emulation build (g++,
// -ffp-contract=off) evaluates exactly the same operations: a kernel gives
// the same bytes emulated and on a GPU.
#ifndef QL_CUDA_COMMON_CUH
#define QL_CUDA_COMMON_CUH

#include <stdint.h>

#include "emu.h"

namespace ql_cuda {

// ql_dtype values (proto/ql_defs.h); repeated here because device code
// includes no C header of the project.
enum : int { DT_F32 = 1, DT_F16 = 2, DT_BF16 = 3 };

// ---- conversions: the bit operations of kernels/convert.c, verbatim in
// meaning, so that quantize_rows matches ql_quantize_rows_*_src bit for bit.

__device__ __forceinline__ float f16_to_f32(uint32_t h) {
  uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1F)
    return __uint_as_float(sign | 0x7F800000u |
                           (m ? 0x00400000u | (m << 13) : 0));
  if (e == 0) {
    if (m == 0) return __uint_as_float(sign);
    e = 113;
    while (!(m & 0x400u)) {
      m <<= 1;
      e--;
    }
    return __uint_as_float(sign | (e << 23) | ((m & 0x3FFu) << 13));
  }
  return __uint_as_float(sign | ((e + 112) << 23) | (m << 13));
}

__device__ __forceinline__ uint16_t f32_to_f16(float f) {
  uint32_t x = __float_as_uint(f), ax = x & 0x7FFFFFFFu;
  uint32_t sign = (x >> 16) & 0x8000u;
  if (ax > 0x7F800000u) return uint16_t(sign | 0x7E00u | ((ax >> 13) & 0x1FFu));
  if (ax >= 0x477FF000u) return uint16_t(sign | 0x7C00u);
  if (ax >= 0x38800000u) {
    uint32_t r = ax + 0x0FFFu + ((ax >> 13) & 1u);
    return uint16_t(sign | ((r - 0x38000000u) >> 13));
  }
  if (ax <= 0x33000000u) return uint16_t(sign);
  uint32_t e = ax >> 23, mant = (ax & 0x7FFFFFu) | 0x800000u, shift = 126 - e;
  uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1),
           half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return uint16_t(sign | q);
}

__device__ __forceinline__ float bf16_to_f32(uint32_t h) {
  uint32_t u = h << 16;
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) u |= 0x00400000u;
  return __uint_as_float(u);
}

__device__ __forceinline__ uint16_t f32_to_bf16(float f) {
  uint32_t x = __float_as_uint(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((x >> 16) | 0x0040u);
  x += 0x7FFFu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

// f32 -> e4m3fn, nearest even, saturating (ql_f32_to_e4m3).
__device__ __forceinline__ uint8_t f32_to_e4m3(float f) {
  uint32_t x = __float_as_uint(f), ax = x & 0x7FFFFFFFu;
  uint32_t sign = (x >> 24) & 0x80u;
  if (ax > 0x7F800000u) return uint8_t(sign | 0x7Fu);
  if (ax >= 0x43E00000u) return uint8_t(sign | 0x7Eu);
  if (ax >= 0x3C800000u) {
    uint32_t r = ax + 0x7FFFFu + ((ax >> 20) & 1u);
    return uint8_t(sign | ((r >> 20) - (120u << 3)));
  }
  if (ax <= 0x3A800000u) return uint8_t(sign);
  uint32_t e = ax >> 23, mant = (ax & 0x7FFFFFu) | 0x800000u, shift = 141 - e;
  uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1),
           half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return uint8_t(sign | q);
}

// e4m3fn -> f32, exact (ql_e4m3_to_f32).
__device__ __forceinline__ float e4m3_to_f32(uint32_t c) {
  uint32_t sign = (c & 0x80u) << 24, e = (c >> 3) & 0xFu, m = c & 0x7u;
  if (e == 0xF && m == 0x7) return __uint_as_float(sign | 0x7FF00000u);
  if (e == 0) {
    float v = __fmul_rn(float(m), 0.001953125f);  // m·2^-9, exact
    return sign ? -v : v;
  }
  return __uint_as_float(sign | ((e + 120) << 23) | (m << 20));
}

// Element i of an array of dtype dt (f32, f16 or bf16), as f32.
__device__ __forceinline__ float load_f32(int dt, const void* p, int64_t i) {
  if (dt == DT_F32) return static_cast<const float*>(p)[i];
  uint32_t h = static_cast<const uint16_t*>(p)[i];
  return dt == DT_F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

// Stores v as element i of an array of dtype dt, rounded to nearest even.
__device__ __forceinline__ void store_f32(int dt, void* p, int64_t i, float v) {
  if (dt == DT_F32)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<uint16_t*>(p)[i] = dt == DT_F16 ? f32_to_f16(v) : f32_to_bf16(v);
}

// v rounded to dtype dt and widened back (rnd_src of ql_kernels.h).
__device__ __forceinline__ float rnd_src(int dt, float v) {
  if (dt == DT_F16) return f16_to_f32(f32_to_f16(v));
  if (dt == DT_BF16) return bf16_to_f32(f32_to_bf16(v));
  return v;
}

// The smaller of a and b, for any integer type (CUDA's min() overloads
// differ between toolkits for long and long long).
template <class T>
__host__ __device__ __forceinline__ T lo(T a, T b) {
  return a < b ? a : b;
}

// The larger of a and b, likewise.
template <class T>
__host__ __device__ __forceinline__ T hi(T a, T b) {
  return a < b ? b : a;
}

// The sum of v over the 32 lanes of a warp, in a fixed butterfly order:
// every lane ends with the same bits (IEEE addition commutes), and the
// order depends on nothing but the lane, so an output never depends on
// what else the launch computes (batch invariance, DESIGN §4).
__device__ __forceinline__ float warp_sum(float v) {
#ifdef QL_MUT_SHUFFLE_OFFSET  // mutation test: the first step is skipped
  for (int o = 8; o > 0; o >>= 1)
#else
  for (int o = 16; o > 0; o >>= 1)
#endif
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace ql_cuda

#endif  // QL_CUDA_COMMON_CUH
