// ptx.h - the one header with inline PTX (DESIGN §9). Each wrapper is the
// instruction itself under nvcc and, under emu.h, a warp-collective
// emulation written from the PTX ISA's description of the same instruction,
// so that kernels using it run (and are checked) in `make check`.
#ifndef QL_CUDA_PTX_H
#define QL_CUDA_PTX_H

#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <cmath>

#include "emu.h"

// D = A·B + C on int8 tensor cores: A 16x32 s8 (row-major), B 32x8 s8
// (column-major), C and D 16x8 s32; mma.sync.aligned.m16n8k32.row.col
// .s32.s8.s8.s32 (sm_80 and newer). All 32 lanes of the warp call it
// together. No .satfinite: the int32 sums wrap, so callers keep K small
// enough that they cannot overflow (QL_AQ_Q8C_MAX_K).
//
// Fragments, from the PTX ISA, section "Matrix Fragments for
// mma.m16n8k32" (the .s8/.u8 layouts), with g = lane >> 2 and
// t = lane & 3; element i of a fragment is byte i % 4 (lowest first) of
// register i / 4:
//   a, 16 elements:  row = g      for 0 <= i < 4 or 8 <= i < 12,
//                          g + 8  otherwise;
//                    col = 4t + (i & 3)       for i < 8,
//                          4t + (i & 3) + 16  for i >= 8.
//   b, 8 elements:   row = 4t + (i & 3)       for i < 4,
//                          4t + (i & 3) + 16  for i >= 4;   col = g.
//   c, d, 4 elements: row = g for i < 2, g + 8 otherwise; col = 2t + (i & 1).
__device__ __forceinline__ void ql_mma_m16n8k32_s8(int d[4],
                                                   const uint32_t a[4],
                                                   const uint32_t b[2],
                                                   const int c[4]) {
#if defined(__CUDA_ARCH__)
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, "
      "{%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
        "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
#elif QL_EMU
  // Every lane publishes its fragments and gathers, through the inverse of
  // the layout above, the two rows of A (g, g + 8) and the two columns of B
  // (2t, 2t + 1) that its four outputs need; the copies are taken before
  // the next warp operation, which may reuse the exchange slots. Gathering
  // 128 bytes instead of decoding the whole tile per element keeps the
  // emulated tile cheap enough for the conformance harness.
  const int lane = ql_emu::lane_id(), g = lane >> 2, t = lane & 3;
  int8_t ar[2][32], bc[2][32];
  // Row g + 8h of A: lane 4g + q holds k = 4q..4q+3 as elements 4h..4h+3
  // and k = 16+4q..16+4q+3 as elements 8+4h..8+4h+3.
  auto sa = ql_emu::warp_exchange(a, 16);
  for (int q = 0; q < 4; ++q)
    for (int h = 0; h < 2; ++h) {
      memcpy(&ar[h][4 * q], sa[4 * g + q] + 4 * h, 4);
      memcpy(&ar[h][16 + 4 * q], sa[4 * g + q] + 8 + 4 * h, 4);
    }
  // Column n of B: lane 4n + q holds k = 4q..4q+3 as elements 0..3 and
  // k = 16+4q..16+4q+3 as elements 4..7.
  auto sb = ql_emu::warp_exchange(b, 8);
  for (int h = 0; h < 2; ++h)
    for (int q = 0; q < 4; ++q) {
      memcpy(&bc[h][4 * q], sb[4 * (2 * t + h) + q], 4);
      memcpy(&bc[h][16 + 4 * q], sb[4 * (2 * t + h) + q] + 4, 4);
    }
  // d[i]: row g + 8·(i >> 1), column 2t + (i & 1). d may be c: c[i] is
  // read before d[i] is written.
  for (int i = 0; i < 4; ++i) {
    const int8_t *r = ar[i >> 1], *col = bc[i & 1];
    // int32 wrap-around, as the instruction without .satfinite
    uint32_t acc = uint32_t(c[i]);
    for (int k = 0; k < 32; ++k) acc += uint32_t(int(r[k]) * int(col[k]));
    d[i] = int(acc);
  }
#endif
}

// ---- 16-bit floating point tensor cores and the conversions that feed them

namespace ql_ptx {
// Host helpers of the emulated branches below (the device pass of nvcc
// never calls them).
// A half (IEEE binary16) or bfloat16 value from its bits, exactly.
inline double f16_value(uint32_t h) {
  const int e = int((h >> 10) & 31), m = int(h & 1023);
  const double v = e == 0    ? std::ldexp(double(m), -24)
                   : e == 31 ? (m ? NAN : INFINITY)
                             : std::ldexp(double(m | 1024), e - 25);
  return (h & 0x8000u) ? -v : v;
}
inline double bf16_value(uint32_t h) {
  uint32_t u = (h & 0xFFFFu) << 16;
  float f;
  memcpy(&f, &u, 4);
  return double(f);
}
// v rounded to nearest even into a format of `mant` stored mantissa bits
// and exponent bias `bias` (binary16: 10, 15; bfloat16: 7, 127), with
// subnormals, and overflow to infinity, as the PTX ISA's .rn rounding.
inline uint16_t round_bits(double v, int mant, int bias) {
  const uint32_t sign = std::signbit(v) ? 0x8000u : 0u;
  const uint32_t inf = ((2u << (14 - mant)) - 1u) << mant;  // exponent all 1s
  if (std::isnan(v)) return uint16_t(inf | (1u << (mant - 1)));
  v = std::fabs(v);
  if (v == 0.0) return uint16_t(sign);
  int e;
  (void)std::frexp(v, &e);  // v in [2^(e-1), 2^e)
  // The quantum of v's binade, or of the subnormals below the normals.
  const int q = std::max(e - 1 - mant, 1 - bias - mant);
  const double m = std::nearbyint(std::ldexp(v, -q));  // default mode: RNE
  // One formula covers subnormals, normals and a carry into the exponent.
  const double bits = std::ldexp(1.0, mant) * double(q + mant + bias - 1) + m;
  return uint16_t(sign | (bits >= double(inf) ? inf : uint32_t(bits)));
}
inline uint16_t f16_rn(double v) { return round_bits(v, 10, 15); }
inline uint16_t bf16_rn(double v) { return round_bits(v, 7, 127); }
// The value of element i (0: low half) of a packed pair, f16 or bf16.
template <bool BF>
inline double half_of(uint32_t r, int i) {
  const uint32_t h = i ? r >> 16 : r & 0xFFFFu;
  return BF ? bf16_value(h) : f16_value(h);
}

// D = A·B + C on 16-bit tensor cores with f32 accumulation: A 16x16 and B
// 16x8 in f16 (BF = false) or bf16 (BF = true), C and D 16x8 f32;
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 (sm_80
// and newer). All 32 lanes call it together.
//
// Fragments, from the PTX ISA, section "Matrix Fragments for
// mma.m16n8k16 with floating point type", with g = lane >> 2 and
// t = lane & 3; element i of a is half i % 2 (low first) of register i / 2:
//   a, 8 elements:  row = g for i in {0, 1, 4, 5}, g + 8 otherwise;
//                   col = 2t + (i & 1) for i < 4, 2t + (i & 1) + 8 otherwise.
//   b, 4 elements:  row = 2t + (i & 1) for i < 2, 2t + (i & 1) + 8
//                   otherwise; col = g.
//   c, d, 4 f32:    row = g for i < 2, g + 8 otherwise; col = 2t + (i & 1).
// The emulation adds the 16 exact products and c in double and rounds
// once to f32. The hardware's order and rounding of that sum are not
// documented, so a kernel may rely on the layout and on exact products,
// not on the bits of the sum.
template <bool BF>
__device__ __forceinline__ void ql_mma_m16n8k16(float d[4], const uint32_t a[4],
                                                const uint32_t b[2],
                                                const float c[4]) {
#if defined(__CUDA_ARCH__)
  if constexpr (BF)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
          "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
          "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#elif QL_EMU
  // Each lane gathers, through the inverse of the layout above, rows g and
  // g + 8 of A and columns 2t and 2t + 1 of B; copies are taken before the
  // next warp operation, which may reuse the exchange slots.
  const int lane = ql_emu::lane_id(), g = lane >> 2, t = lane & 3;
  double ar[2][16], bc[2][16];
  // A(row, col) is in lane 4·(row % 8) + (col % 8) / 2, register
  // (row >= 8) + 2·(col >= 8), half col % 2.
  auto sa = ql_emu::warp_exchange(a, 16);
  for (int h = 0; h < 2; ++h)
    for (int col = 0; col < 16; ++col) {
      uint32_t r;
      memcpy(&r, sa[4 * g + (col % 8) / 2] + 4 * (h + 2 * (col >= 8)), 4);
      ar[h][col] = ql_ptx::half_of<BF>(r, col & 1);
    }
  // B(k, n) is in lane 4n + (k % 8) / 2, register k >= 8, half k % 2.
  auto sb = ql_emu::warp_exchange(b, 8);
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 16; ++k) {
      uint32_t r;
      memcpy(&r, sb[4 * (2 * t + h) + (k % 8) / 2] + 4 * (k >= 8), 4);
      bc[h][k] = ql_ptx::half_of<BF>(r, k & 1);
    }
  // d may be c: c[i] is read before d[i] is written.
  for (int i = 0; i < 4; ++i) {
    double acc = double(c[i]);
    for (int k = 0; k < 16; ++k) acc += ar[i >> 1][k] * bc[i & 1][k];
    d[i] = float(acc);
  }
#endif
}

// lop3.b32: each bit of the result is bit (a << 2 | b << 1 | c) of LUT
// (the PTX ISA's immLut: 0xF0 for a, 0xCC for b, 0xAA for c).
template <unsigned LUT>
__device__ __forceinline__ uint32_t ql_lop3(uint32_t a, uint32_t b,
                                            uint32_t c) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, %4;\n"
      : "=r"(d)
      : "r"(a), "r"(b), "r"(c), "n"(LUT));
  return d;
#else
  uint32_t d = 0;
  for (int i = 0; i < 32; ++i) {
    const unsigned sel = ((a >> i) & 1u) << 2 | ((b >> i) & 1u) << 1 |
                         ((c >> i) & 1u);
    d |= ((LUT >> sel) & 1u) << i;
  }
  return d;
#endif
}

// d = a·b + c on a pair of f16 (BF = false) or bf16 values, each rounded
// once to nearest even: fma.rn.f16x2 / fma.rn.bf16x2 (sm_80 and newer).
// The emulation computes a·b + c in double first, which is exact for the
// operands a kernel gives it (small integers and their biases) and rounds
// twice only where a·b + c needs more than 53 bits.
template <bool BF>
__device__ __forceinline__ uint32_t ql_fma2(uint32_t a, uint32_t b,
                                            uint32_t c) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  if constexpr (BF)
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  else
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  uint32_t d = 0;
  for (int i = 0; i < 2; ++i) {
    const double v = ql_ptx::half_of<BF>(a, i) * ql_ptx::half_of<BF>(b, i) +
                     ql_ptx::half_of<BF>(c, i);
    d |= uint32_t(BF ? ql_ptx::bf16_rn(v) : ql_ptx::f16_rn(v)) << (16 * i);
  }
  return d;
#endif
}

// A 128-bit load of global memory read once: through the non-coherent
// path without allocating in L1 (ld.global.nc.L1::no_allocate.v4.u32), so
// that a weight streamed past does not evict what is reused (x). p must be
// 16-byte aligned (checked in emulation, as ql_ld128).
__device__ __forceinline__ uint4 ql_ld128_stream(const void* p) {
#if defined(__CUDA_ARCH__)
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
#else
  return ql_ld128(p);
#endif
}
}  // namespace ql_ptx

#endif  // QL_CUDA_PTX_H
