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
  // Every lane publishes its fragments; each then computes its own four
  // outputs from the whole tiles, found through the inverse of the layout
  // above. The copies are taken before the next warp operation, which may
  // reuse the exchange slots.
  uint8_t A[32][16], B[32][8];
  auto sa = ql_emu::warp_exchange(a, 16);
  for (int l = 0; l < 32; ++l) memcpy(A[l], sa[l], 16);
  auto sb = ql_emu::warp_exchange(b, 8);
  for (int l = 0; l < 32; ++l) memcpy(B[l], sb[l], 8);
  // A[row][k]: lane 4·(row % 8) + (k % 16) / 4, element
  // (k & 3) + 4·(row >= 8) + 8·(k >= 16).
  auto a_at = [&](int row, int k) {
    const int lane = 4 * (row % 8) + (k % 16) / 4;
    const int i = (k & 3) + 4 * (row >= 8) + 8 * (k >= 16);
    return int(int8_t(A[lane][i]));
  };
  // B[k][n]: lane 4·n + (k % 16) / 4, element (k & 3) + 4·(k >= 16).
  auto b_at = [&](int k, int n) {
    const int lane = 4 * n + (k % 16) / 4;
    return int(int8_t(B[lane][(k & 3) + 4 * (k >= 16)]));
  };
  const int lane = ql_emu::lane_id(), g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
    // int32 wrap-around, as the instruction without .satfinite
    uint32_t acc = uint32_t(c[i]);
    for (int k = 0; k < 32; ++k) acc += uint32_t(a_at(row, k) * b_at(k, col));
    d[i] = int(acc);
  }
#endif
}

#endif  // QL_CUDA_PTX_H
