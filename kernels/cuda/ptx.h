// ptx.h - the one header with inline PTX (DESIGN §9). Each wrapper is the
// instruction itself under nvcc and, under emu.h, a warp-collective
// emulation written from the PTX ISA's description of the same instruction,
// so that kernels using it run (and are checked) in `make check`.
#ifndef QL_CUDA_PTX_H
#define QL_CUDA_PTX_H

#include <stdint.h>
#include <string.h>

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

#endif  // QL_CUDA_PTX_H
