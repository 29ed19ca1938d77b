// linear_wo.cu - weight-only linear for decode-shaped batches (DESIGN §4,
// §9): y[m, n] = Σk x[m, k]·dequant(W)[n, k] (+ b[n]) for q4g, q8c, q8b and
// f8r weights in the "cuda-1" layout (ql_cuda.h), f32/f16/bf16 activations
// and f32/f16/bf16 scales. q4g with f16/bf16 x (K and groups multiples of
// 128, f32 scales) runs on the tensor cores (wo_mma_kernel, its own section
// below, with its own reduction order); everything else on the streaming
// kernel. The streaming kernel and the legacy one (QL_CUDA_WO_KERNEL=legacy,
// read by backend.cpp), kept to be timed against it on a GPU, give the
// same bytes.
//
// The reduction order of those two, fixed by (N, K, format) alone:
// K is cut into 16-byte chunks of a row's codes (32 int4 or 16 one-byte
// codes); lane l of the warp that owns output row n takes chunks l, l + 32,
// l + 64, ... in increasing k and sums them into one f32, then warp_sum()
// adds the 32 lanes in a fixed butterfly. Within a chunk the factored forms
// of the reference (ql_kernels.h) are kept: q4g and asymmetric q8b add
// zero·Σx + scale·Σx·q per chunk (a chunk never straddles a group: groups
// are multiples of 32), symmetric q8b scale·Σx·q, q8c and f8r multiply by
// the row scale once at the end; every sum runs over the chunk's values in
// increasing k. A narrow weight splits K over several blocks (split-K,
// splits_of(), a function of N and K): the splits' sums then go through
// memory and are added in increasing order by reduce_kernel. No atomics,
// and nothing depends on M or on a row's place in the batch, so a row gives
// the same bytes alone and in any batch, with either kernel
// (tests/unit/test_cuda_wo.cpp checks both). The order is a GPU's, not the
// reference's, so results agree with the reference within the accuracy
// bound, not bit for bit.
//
// The streaming kernel (wo_stream_kernel<F, Z, MT>) reads the weight once
// per call for up to kMaxRows = 16 rows of x, at HBM speed for a decode
// batch:
// - a row tile is 16 rows of W, taken by a block of 8 warps (2 rows per
//   warp), with MT rows of x (MT = 1, 2, 4, 8 or 16, the smallest that
//   holds the batch; a larger batch takes ceil(M / 16) block rows). The M
//   loop only adds accumulators: each (row of x, row of W) sum is the same
//   chain of operations whatever MT is, done by the same lane;
// - the grid is persistent: about two blocks per SM (ql__cuda_wo.sms),
//   each walking an equal share of the row tiles, so that x is staged once
//   per block and the loads never drain between row tiles, where one block
//   per row tile paid both every 16 rows of W and left a tail wave
//   (QL_CUDA_WO_KERNEL=tiled keeps that grid, to be timed against);
// - x is staged per stage of K in shared memory (8192 values for one row
//   of x, fewer for more: 32 KiB), converted to f32 once per block (8
//   rows at a time: MT = 16 takes two passes over a tile of 1024 values
//   with the codes kept in registers), with a 128-byte XOR swizzle so that
//   the lanes' 16-byte reads of x are free of bank conflicts, each
//   thread's loads of a stage issued in rounds ahead of their stores
//   (stage_x); when the
//   block's span of K fits one stage, x is staged once for the whole call;
// - a lane takes two 16-byte chunks of each of its rows per step of K
//   (1024 values of 8-bit codes, 2048 of q4g up to 4 rows of x); its
//   codes (128-bit loads) and its chunks' scales and zeros run kDepth steps
//   ahead of the one it computes, across row tiles: at up to 8 rows of x,
//   8 independent 128-bit loads in flight per lane, 64 KiB per SM at two
//   blocks per SM;
// - no division in the loop: steps are counted, and a chunk's group is a
//   shift (group sizes are powers of two);
// - codes become floats without int-to-float conversions: a byte (or a
//   nibble, after flipping the sign bit) is put into the mantissa of 2^23
//   with a byte permute and 2^23 + bias is subtracted, exactly; e4m3 codes
//   are placed into an f32 as value·2^-120 and scaled back, exactly.
// The legacy kernel (linear_wo_kernel<F>) has one warp per output row, 8
// rows a block and one block row per row of x (grid.y = M), so it reads the
// weight M times and x from shared memory with bank conflicts.
//
// Two small kernels of every call live here too: the NaN/Inf check of x
// and the copy by SMs between device and mapped host memory.
#include <stdlib.h>
#include <string.h>

#include <atomic>

#include "common.cuh"
#include "ptx.h"
#include "ql_cuda.h"

namespace ql_cuda {
namespace {

enum : int { F_Q4G = 1, F_Q8C = 2, F_Q8B = 3, F_F8R = 4 };  // ql_format

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kTile = 1024;  // x values per pass: 4 KiB of shared memory
constexpr int kMaxGridY = 65535;

// Values per 16-byte chunk of a row of codes.
template <int F>
constexpr int kChunk = F == F_Q4G ? 32 : 16;

// The four 32-bit words of the chunk of row n that starts at value kc (a
// multiple of kChunk<F>, so the address is 16-byte aligned).
template <int F>
__device__ __forceinline__ uint4 load_chunk(const uint8_t* qrow, int64_t kc) {
  return ql_ld128(qrow + (F == F_Q4G ? kc / 2 : kc));
}

// The group (q4g) or block (q8b) of value kc. Group sizes are powers of
// two (ql_group_size_valid), so a shift, where a 64-bit division would cost
// some 60 instructions a chunk.
__device__ __forceinline__ int64_t group_of(const ql__cuda_wo& w, int64_t kc) {
#ifdef QL_MUT_GROUP_INDEX  // mutation test: the next chunk's group
  return lo(w.groups - 1, (kc + 32) / int64_t(w.gs));
#else
  return kc >> (31 - __clz(int(w.gs)));
#endif
}

// acc plus the contribution of one chunk of row n starting at kc; xc are
// the chunk's x values in shared memory.
template <int F>
__device__ __forceinline__ float chunk_dot(const ql__cuda_wo& w, int64_t n,
                                           int64_t kc, uint4 v,
                                           const float* xc, float acc) {
  const uint32_t word[4] = {v.x, v.y, v.z, v.w};
  if constexpr (F == F_Q4G) {
    const int64_t si = n * w.groups + group_of(w, kc);
    const float s = load_f32(w.sdt, w.scale, si);
    const float z = load_f32(w.sdt, w.zero, si);
    float a = 0.0f, xsum = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        int q = int((word[j] >> (4 * e)) & 0xFu);
        q -= (q & 8) << 1;  // two's complement nibble, [-8, 7]
        const float xv = xc[j * 8 + e];
        a = __fmaf_rn(xv, float(q), a);
        xsum = __fadd_rn(xsum, xv);
      }
    return __fadd_rn(acc, __fmaf_rn(z, xsum, __fmul_rn(s, a)));
  } else if constexpr (F == F_Q8B) {
    const int64_t si = n * w.groups + group_of(w, kc);
    const float s = load_f32(w.sdt, w.scale, si);
    float a = 0.0f, xsum = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float xv = xc[j * 4 + e];
        a = __fmaf_rn(xv, float(int8_t(word[j] >> (8 * e))), a);
        xsum = __fadd_rn(xsum, xv);
      }
    if (w.zero == nullptr) return __fmaf_rn(s, a, acc);
    const float z = load_f32(w.sdt, w.zero, si);
    return __fadd_rn(acc, __fmaf_rn(z, xsum, __fmul_rn(s, a)));
  } else {
    // q8c and f8r: Σ x·q over the whole row, scaled once at the end.
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t b = (word[j] >> (8 * e)) & 0xFFu;
        const float q = F == F_F8R ? e4m3_to_f32(b) : float(int8_t(b));
        acc = __fmaf_rn(xc[j * 4 + e], q, acc);
      }
    return acc;
  }
}

// The output row n of x row m, finished: the row scale (q8c, f8r) and the
// bias applied to the sum acc, stored in dtype dt.
template <int F>
__device__ __forceinline__ void finish(const ql__cuda_wo& w, int dt, void* y,
                                       int64_t m, int64_t n, float acc) {
  if (F == F_Q8C || F == F_F8R) acc = __fmul_rn(load_f32(w.sdt, w.scale, n), acc);
  if (w.bias != nullptr) acc = __fadd_rn(acc, w.bias[n]);
  store_f32(dt, y, m * w.n + n, acc);
}

// Split-K (blockIdx.z of gridDim.z splits; 1: none): split z takes the
// tiles [z·span, (z+1)·span) of K. With splits, each warp stores its
// partial sum in part[z][m][n] and reduce_kernel adds the splits in
// increasing z; without, it finishes the row itself.
template <int F>
__global__ void __launch_bounds__(kThreads)
    linear_wo_kernel(ql__cuda_wo w, int dt, const void* __restrict__ x,
                     int64_t row0, int64_t m_all, int64_t span,
                     float* __restrict__ part, void* __restrict__ y) {
  __shared__ __align__(16) float xs[kTile];
  constexpr int kE = kChunk<F>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n = int64_t(blockIdx.x) * kWarps + warp;
  const int64_t m = row0 + blockIdx.y;
  const bool live = n < w.n;  // a dead warp still meets every barrier
  const uint8_t* qrow = w.q + (live ? n : 0) * w.ldq;
  const int64_t kbeg = int64_t(blockIdx.z) * span;
  const int64_t kend = lo(w.k, kbeg + span);
  float acc = 0.0f;

  for (int64_t k0 = kbeg; k0 < kend; k0 += kTile) {
    const int kt = int(lo(int64_t(kTile), kend - k0));
#ifndef QL_MUT_NO_BARRIER  // mutation test: the tile is overwritten early
    __syncthreads();  // every warp is done with the previous tile
#endif
    for (int i = threadIdx.x; i < kTile; i += kThreads)
      xs[i] = i < kt ? load_f32(dt, x, m * w.k + k0 + i) : 0.0f;
    __syncthreads();
    if (live)
      for (int c = lane; c * kE < kt; c += 32) {
        const int64_t kc = k0 + int64_t(c) * kE;
        acc = chunk_dot<F>(w, n, kc, load_chunk<F>(qrow, kc), xs + c * kE,
                           acc);
      }
  }
  acc = warp_sum(acc);
  if (live && lane == 0) {
    if (gridDim.z == 1)
      finish<F>(w, dt, y, m, n, acc);
    else
      part[(int64_t(blockIdx.z) * m_all + m) * w.n + n] = acc;
  }
}

// The splits of output (m, n) added in increasing z, then finished: the
// same order whatever M is.
template <int F>
__global__ void __launch_bounds__(kThreads)
    reduce_kernel(ql__cuda_wo w, int dt, int64_t m_all, int splits,
                  const float* __restrict__ part, void* __restrict__ y) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= m_all * w.n) return;
  float acc = part[i];
  for (int z = 1; z < splits; ++z)
    acc = __fadd_rn(acc, part[int64_t(z) * m_all * w.n + i]);
  finish<F>(w, dt, y, i / w.n, i % w.n, acc);
}

// ---- the streaming kernel (the default; see the top of the file) ----

constexpr int kRowsPerWarp = 2;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;
constexpr int kMaxRows = 16;   // rows of x one block takes
constexpr int kStageRows = 8;  // rows of x in shared memory at once
constexpr int kStage = kStageRows * kTile;  // x values staged: 32 KiB

// Rows of x staged at once (S) and values of K per staged row (the x tile)
// for MT rows of x: fewer rows, longer tiles, so that a small batch stages
// x (and waits at a barrier) once per 8192 values of K rather than 1024.
template <int MT>
constexpr int kStageS = MT < kStageRows ? MT : kStageRows;
template <int MT>
constexpr int kXTile = kStage / kStageS<MT>;

// Values of K per step of the streaming kernel: kTile, or two tiles for
// q4g where the x stage holds them (MT <= 4), so that each lane takes two
// chunks a step as with 8-bit codes, and a step's fixed costs (addresses,
// scales, counting) weigh half as much per weight byte.
template <int F, int MT>
constexpr int kStepK = F == F_Q4G && MT <= 4 ? 2 * kTile : kTile;

// Chunks of a weight row that a lane takes per step of tk values: 2 for
// the streaming kernel.
template <int F, int TK>
constexpr int kPerLane = TK / kChunk<F> / 32;

// Where value i of a staged x row lives. A lane reads its
// chunk's x as 16-byte units, 128 (q4g) or 64 contiguous bytes per lane;
// unswizzled, the 8 lanes of a quarter-warp would hit the same banks. Unit
// u goes to u ^ ((u / 8) % 8), which spreads them over all 32 banks.
__device__ __forceinline__ int swz(int i) {
  const int u = i >> 2;
  return ((u ^ ((u >> 3) & 7)) << 2) | (i & 3);
}

// Unit j (values 4j..4j+3) of chunk c (counted from the x tile's start) of
// a staged row.
template <int F>
__device__ __forceinline__ float4 x_unit(const float* row, int c, int j) {
  const int u = c * (kChunk<F> / 4) + j;
  return *reinterpret_cast<const float4*>(row + ((u ^ ((u >> 3) & 7)) << 2));
}

// 2^23 + (byte i of w): a float whose low mantissa bits are the byte, so
// that one subtraction gives the code's value, exactly, where an
// int-to-float conversion would be a quarter-rate instruction.
__device__ __forceinline__ float biased(uint32_t w, int i) {
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | unsigned(i)));
}

// The four codes of unit j of a 16-byte chunk v, as floats equal to what
// chunk_dot() of the legacy kernel uses (the values are exact either way).
template <int F>
__device__ __forceinline__ void dequant_unit(const uint4& v, int j,
                                             float q[4]) {
  const uint32_t word[4] = {v.x, v.y, v.z, v.w};
  if constexpr (F == F_Q4G) {
    // Nibbles 4(j&1)..4(j&1)+3 of word j/2, two's complement: with bit 3
    // flipped, u = q + 8 in [0, 15]; even nibbles are bytes of lo, odd
    // ones bytes of hi.
    const uint32_t wv = word[j >> 1] ^ 0x88888888u;
    const uint32_t lo4 = wv & 0x0F0F0F0Fu, hi4 = (wv >> 4) & 0x0F0F0F0Fu;
    const int b = 2 * (j & 1);
    q[0] = __fadd_rn(biased(lo4, b), -8388616.0f);
    q[1] = __fadd_rn(biased(hi4, b), -8388616.0f);
    q[2] = __fadd_rn(biased(lo4, b + 1), -8388616.0f);
    q[3] = __fadd_rn(biased(hi4, b + 1), -8388616.0f);
  } else if constexpr (F == F_F8R) {
    // e4m3fn: sign to bit 31, exponent and mantissa to bits 20..26 make
    // the f32 of the value times 2^-120 (subnormals included), scaled back
    // exactly. A word with a NaN code (0x7F, 0xFF; no quantizer makes
    // one) takes the exact conversion.
    const uint32_t wv = word[j];
    if (((wv & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u) {
#pragma unroll
      for (int t = 0; t < 4; ++t) q[t] = e4m3_to_f32((wv >> (8 * t)) & 0xFFu);
      return;
    }
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const uint32_t p = __byte_perm(wv, 0u, 0x0444u | (unsigned(t) << 12));
      q[t] = __fmul_rn(
          __uint_as_float((p & 0x80000000u) | ((p >> 4) & 0x07F00000u)),
          0x1p120f);
    }
  } else {
    // int8: with the sign bit flipped, u = q + 128 in [0, 255].
    const uint32_t wv = word[j] ^ 0x80808080u;
#pragma unroll
    for (int t = 0; t < 4; ++t) q[t] = __fadd_rn(biased(wv, t), -8388736.0f);
  }
}

// Stages x for a step: rows [r0, r0 + have) of x (dtype DT; rows past
// them as zeros), values [k0, k0 + xt) of each, into xs from column 0
// (swizzled), zeros from xt up to xw. The thread's loads go out in rounds
// of L, all of a round before its first store: the loads are
// independent, but a loop that stores each value as it arrives waits a
// memory latency per value, and a block that stages x once waits for it
// before any arithmetic. L is what the kernel's registers allow (kStageL).
// The values stored are load_f32()'s.
template <int DT, int S, int XT, int L>
__device__ __forceinline__ void stage_x(const void* __restrict__ x,
                                        float (*xs)[XT], int64_t r0,
                                        int have, int64_t k, int64_t k0,
                                        int xt, int xw) {
  static_assert(S * XT % (kThreads * L) == 0, "whole rounds");
  for (int i0 = 0; i0 < S * XT; i0 += kThreads * L) {
    uint32_t raw[L];
#pragma unroll
    for (int j = 0; j < L; ++j) {
      const int i = i0 + j * kThreads + int(threadIdx.x);
      const int mr = i / XT, kk = i % XT;
      raw[j] = 0u;  // +0.0 in every dtype
      if (kk < xt && mr < have) {
        const int64_t e = (r0 + mr) * k + k0 + kk;
        raw[j] = DT == DT_F32 ? static_cast<const uint32_t*>(x)[e]
                              : uint32_t(static_cast<const uint16_t*>(x)[e]);
      }
    }
#pragma unroll
    for (int j = 0; j < L; ++j) {
      const int i = i0 + j * kThreads + int(threadIdx.x);
      const int mr = i / XT, kk = i % XT;
      if (kk < xw)
        xs[mr][swz(kk)] = DT == DT_F32   ? __uint_as_float(raw[j])
                          : DT == DT_F16 ? f16_to_f32(raw[j])
                                         : bf16_to_f32(raw[j]);
    }
  }
}

// Adds chunk c (one per lane and step; its codes v, scale s and zero z for
// each of the warp's R rows) to acc for the S rows of x staged in xs. The
// arithmetic of one (row of x, row of W) is chunk_dot()'s, step for step:
// the same sums in the same order, whatever S and R are.
template <int F, bool Z, int S, int XT, int R>
__device__ __forceinline__ void chunk_rows(const float (*xs)[XT], int c,
                                           const uint4 (&v)[R],
                                           const float (&s)[R],
                                           const float (&z)[R],
                                           float (&acc)[S][R]) {
  constexpr bool kFactored = F == F_Q4G || F == F_Q8B;
  float a[S][R], xsum[S];
#pragma unroll
  for (int m = 0; m < S; ++m) {
    xsum[m] = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) a[m][r] = 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kChunk<F> / 4; ++j) {
    float q[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r) dequant_unit<F>(v[r], j, q[r]);
#pragma unroll
    for (int m = 0; m < S; ++m) {
      const float4 xv = x_unit<F>(xs[m], c, j);
      const float xe[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        if constexpr (Z) xsum[m] = __fadd_rn(xsum[m], xe[t]);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if constexpr (kFactored)
            a[m][r] = __fmaf_rn(xe[t], q[r][t], a[m][r]);
          else
            acc[m][r] = __fmaf_rn(xe[t], q[r][t], acc[m][r]);
        }
      }
    }
  }
  if constexpr (kFactored) {
#pragma unroll
    for (int m = 0; m < S; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r)
        acc[m][r] =
            Z ? __fadd_rn(acc[m][r],
                          __fmaf_rn(z[r], xsum[m], __fmul_rn(s[r], a[m][r])))
              : __fmaf_rn(s[r], a[m][r], acc[m][r]);
  }
}

// The codes, scale and zero of the chunks that this lane takes in the
// tile at k0 (kt values of it are in range), for each of its R rows; zero
// for a chunk past the range, which is then never used.
template <int F, bool Z, int R, int P>
__device__ __forceinline__ void fetch_tile(const ql__cuda_wo& w,
                                           const int64_t (&n)[R], int64_t k0,
                                           int kt, int lane, uint4 (&v)[R][P],
                                           float (&s)[R][P],
                                           float (&z)[R][P]) {
  constexpr int kE = kChunk<F>;
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int c = lane + 32 * i;
    const int64_t kc = k0 + int64_t(c) * kE;
    const bool in = c * kE < kt;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      v[r][i] = in ? load_chunk<F>(w.q + n[r] * w.ldq, kc) : uint4{0, 0, 0, 0};
      s[r][i] = z[r][i] = 0.0f;
      if constexpr (F == F_Q4G || F == F_Q8B) {
        if (in) {
          const int64_t si = n[r] * w.groups + group_of(w, kc);
          s[r][i] = load_f32(w.sdt, w.scale, si);
          if constexpr (Z) z[r][i] = load_f32(w.sdt, w.zero, si);
        }
      }
    }
  }
}

// Steps of codes and scales that a lane keeps in flight ahead of the one
// it computes: the deeper, the more bytes each SM has requested from memory
// at once (what a stream at HBM speed needs: bandwidth times latency, tens
// of KiB per SM), at a cost in registers that large batches cannot pay.
template <int F, int MT>
constexpr int kDepth = MT <= 8 ? 2 : 1;

// Loads of x per thread and round of stage_x(): 16, or 4 at three blocks
// per SM (85 registers a thread), where 16 would spill.
template <int B>
constexpr int kStageL = B >= 3 ? 4 : 16;

// Blocks per SM the register budget is cut for: two for one or two rows of
// x (so that a persistent grid of two blocks per SM fits), one above.
template <int MT>
constexpr int kMinBlocks = MT <= 2 ? 2 : 1;

// The warp's rows of W in row tile rt (kRowsPerBlock rows of W); a dead
// one (past N) reads row 0 and stores nothing.
template <int R>
__device__ __forceinline__ void tile_rows(const ql__cuda_wo& w, int64_t rt,
                                          int warp, int64_t (&n)[R],
                                          bool (&live)[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t nr = rt * kRowsPerBlock + warp * R + r;
    live[r] = nr < w.n;
    n[r] = live[r] ? nr : 0;
  }
}

// y rows [m0, m0 + MT) ∩ [0, m_all) for the row tiles blockIdx.x,
// blockIdx.x + gridDim.x, ... of W: the whole batch in one pass over the
// weight. A block walks its row tiles and, in each, K in steps of TK
// values: one flat sequence of steps, whose loads run kDepth steps ahead
// across row tiles, so that the stream never drains between them; x is
// staged once for the whole call when the block's span of K fits one stage
// (a decode batch at K <= 8192), else per stage of each row tile. Split-K
// as linear_wo_kernel's, with the same partial sums. Z: the format has zero
// points (q4g, asymmetric q8b).
template <int F, bool Z, int MT, int D, int B>
__global__ void __launch_bounds__(kThreads, B)
    wo_stream_kernel(ql__cuda_wo w, int dt, const void* __restrict__ x,
                     int64_t row0, int64_t m_all, int64_t span,
                     float* __restrict__ part, void* __restrict__ y) {
  constexpr int TK = kStepK<F, MT>;  // values of K a step
  constexpr int R = kRowsPerWarp, P = kPerLane<F, TK>;
  constexpr int S = kStageS<MT>, XT = kXTile<MT>;  // staged rows, x tile
  constexpr int SL = kStageL<B>;  // loads of x a round (stage_x)
  static_assert(MT % S == 0 && (MT == S || XT == TK), "passes");
  static_assert(XT % TK == 0, "a stage holds whole steps");
  __shared__ __align__(16) float xs[S][XT];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t m0 = row0 + int64_t(blockIdx.y) * MT;
  const int rows = int(lo(int64_t(MT), m_all - m0));
  const int64_t kbeg = int64_t(blockIdx.z) * span;
  const int64_t kend = lo(w.k, kbeg + span);
  // A split past K (the last of a ragged split-K may start past it) still
  // takes one empty tile, so that it stores its zero partial sums as
  // linear_wo_kernel does.
  const int64_t ktiles = hi(int64_t(1), (kend - kbeg + TK - 1) / TK);
  const int64_t rtiles = (w.n + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t mine =
      int64_t(blockIdx.x) < rtiles
          ? (rtiles - 1 - int64_t(blockIdx.x)) / gridDim.x + 1
          : 0;
  const int64_t steps = mine * ktiles;  // the same for the whole block
  const bool keep_x = MT == S && kend - kbeg <= XT;

  // Steps are numbered by (q, kt): row tile blockIdx.x + q·gridDim.x, K
  // tile kt; both advance by counting, since a 64-bit division per step
  // costs as many instructions as the step's arithmetic.
  // next(): the step after (q, kt).
  auto next = [&](int64_t& q, int64_t& kt) {
    if (++kt == ktiles) {
      kt = 0;
      ++q;
    }
  };
  // The loads of step (q, kt).
  uint4 rv[D][R][P];
  float rs[D][R][P], rz[D][R][P];
  auto fetch = [&](int64_t q, int64_t kt, uint4 (&v)[R][P], float (&s)[R][P],
                   float (&z)[R][P]) {
    const int64_t k = kbeg + kt * TK;
    int64_t n[R];
    bool live[R];
    tile_rows<R>(w, int64_t(blockIdx.x) + q * gridDim.x, warp, n, live);
    fetch_tile<F, Z, R, P>(w, n, k, int(lo(int64_t(TK), kend - k)), lane, v,
                           s, z);
  };
  int64_t fq = 0, fkt = 0;  // the next step to fetch
#pragma unroll
  for (int d = 0; d < D; ++d)
    if (d < steps) {
      fetch(fq, fkt, rv[d], rs[d], rz[d]);
      next(fq, fkt);
    }

  float acc[MT / S][S][R];
  int64_t n[R];
  bool live[R];
  // Step (q, kt) with its codes, scales and zeros cv, cs, cz (a slot of
  // the ring, read in place: moving a register whose load is still in
  // flight would wait for it, and keep one load in flight rather than
  // kDepth).
  auto step = [&](int64_t q, int64_t kt, const uint4 (&cv)[R][P],
                  const float (&cs)[R][P], const float (&cz)[R][P]) {
    const int64_t k = kbeg + kt * TK;
    const int kl = int(lo(int64_t(TK), kend - k));
    if (kt == 0) {  // a new row tile
      tile_rows<R>(w, int64_t(blockIdx.x) + q * gridDim.x, warp, n, live);
#pragma unroll
      for (int p = 0; p < MT / S; ++p)
#pragma unroll
        for (int m = 0; m < S; ++m)
#pragma unroll
          for (int r = 0; r < R; ++r) acc[p][m][r] = 0.0f;
    }
    // The stage that holds tile kt: XT values from k0; this tile is k1
    // values into it. MT > S (two passes of S rows) implies XT == TK:
    // k1 is always 0 there, and the tile is staged once per pass.
    const int64_t k0 = kbeg + (kt * TK) / XT * XT;
    const int k1 = int(k - k0);
    const int xt = int(lo(int64_t(XT), kend - k0));
    // Staged: xt values and the rest of the last chunk (zeros); what lies
    // past it in xs is never read.
    const int xw = lo(XT, (xt + 31) & ~31);
#pragma unroll
    for (int p = 0; p < MT / S; ++p) {
      if (k1 == 0 && !(keep_x && q > 0)) {  // the same for the whole block
#ifndef QL_MUT_NO_BARRIER  // mutation test: the tile is overwritten early
        __syncthreads();  // every warp is done with the previous tile
#endif
        const int64_t r0 = m0 + p * S;
        const int have = rows - p * S;
        if (dt == DT_F32)
          stage_x<DT_F32, S, XT, SL>(x, xs, r0, have, w.k, k0, xt, xw);
        else if (dt == DT_F16)
          stage_x<DT_F16, S, XT, SL>(x, xs, r0, have, w.k, k0, xt, xw);
        else
          stage_x<DT_BF16, S, XT, SL>(x, xs, r0, have, w.k, k0, xt, xw);
        __syncthreads();
      }
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const int c = lane + 32 * i;
        if (c * kChunk<F> < kl) {
          uint4 v[R];
          float s[R], z[R];
#pragma unroll
          for (int r = 0; r < R; ++r) {
            v[r] = cv[r][i];
            s[r] = cs[r][i];
            z[r] = cz[r][i];
          }
          chunk_rows<F, Z, S, XT, R>(xs, k1 / kChunk<F> + c, v, s, z, acc[p]);
        }
      }
    }
    if (kt + 1 < ktiles) return;
    // The row tile's sums, each through the same butterfly; the lane that
    // stores one is spread over the warp so that no lane stores them all.
#pragma unroll
    for (int p = 0; p < MT / S; ++p)
#pragma unroll
      for (int m = 0; m < S; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (p * S + m >= rows) continue;  // the same for the whole block
          const float sum = warp_sum(acc[p][m][r]);
          const int64_t mi = m0 + p * S + m;
          if (live[r] && lane == ((p * S + m) * R + r) % 32) {
            if (gridDim.z == 1)
              finish<F>(w, dt, y, mi, n[r], sum);
            else
              part[(int64_t(blockIdx.z) * m_all + mi) * w.n + n[r]] = sum;
          }
        }
  };
  // The ring of loads, unrolled so that each slot is a fixed set of
  // registers: slot d serves steps d, d + D, d + 2D, ..., and is refilled
  // with step t + D as soon as step t is done with it.
  int64_t sq = 0, skt = 0;  // the next step to compute
  for (int64_t t0 = 0; t0 < steps; t0 += D) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      const int64_t t = t0 + d;
      if (t >= steps) break;  // the same for the whole block
      step(sq, skt, rv[d], rs[d], rz[d]);
      next(sq, skt);
      if (t + D < steps) {
        fetch(fq, fkt, rv[d], rs[d], rz[d]);
        next(fq, fkt);
      }
    }
  }
}

// *bad = 1 when one of the n values of x is NaN or ±Inf (every writer
// stores the same value, so no atomics are needed).
__global__ void __launch_bounds__(kThreads)
    check_finite_kernel(int dt, const void* __restrict__ x, int64_t n,
                        int* __restrict__ bad) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += stride)
    if (!(fabsf(load_f32(dt, x, i)) <= 3.402823466e+38f)) *bad = 1;
}

// dst[0, n) = src[0, n), bytes, by the SMs: the small copies of a call
// between device memory and mapped host memory (backend.cpp's move()).
// 16-byte units where both ends are 16-byte aligned, else bytes; each
// byte is written once, so the order of the threads does not matter.
__global__ void __launch_bounds__(kThreads)
    copy_kernel(unsigned char* __restrict__ dst,
                const unsigned char* __restrict__ src, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x, tail = 0;
  if (((uintptr_t(dst) | uintptr_t(src)) & 15) == 0) {
    const int64_t units = n / 16;
    for (int64_t u = i; u < units; u += stride)
      reinterpret_cast<uint4*>(dst)[u] =
          reinterpret_cast<const uint4*>(src)[u];
    tail = units * 16;
  }
  for (i += tail; i < n; i += stride) dst[i] = src[i];
}

// Splits of K for a weight of n rows and k columns: enough warps in
// flight when N is small (a decode GEMV of a narrow layer would otherwise
// leave most of a GPU idle), each split at least two tiles, so that the
// partial sums (a float per output and split, written and read once) stay
// small against the weight bytes a split reads. A function of (N, K)
// alone, so a row's reduction order never depends on M.
constexpr int64_t kTargetWarps = 1024;
constexpr int64_t kMaxSplits = 16;
constexpr int64_t kMinSplitTiles = 2;
int64_t splits_of(int64_t n, int64_t k) {
  const int64_t tiles = (k + kTile - 1) / kTile;
  const int64_t want = (kTargetWarps + n - 1) / n;
  const int64_t most = tiles / kMinSplitTiles;
  return most < 1 ? 1 : lo(lo(want, kMaxSplits), most);
}

template <int F>
void launch_wo(const ql__cuda_wo* w, int dt, const void* x, int64_t m, void* y,
               float* part, cudaStream_t st) {
  const unsigned gx = unsigned((w->n + kWarps - 1) / kWarps);
  const int64_t s = splits_of(w->n, w->k);
  const int64_t tiles = (w->k + kTile - 1) / kTile;
  const int64_t span = (tiles + s - 1) / s * kTile;
  for (int64_t r0 = 0; r0 < m; r0 += kMaxGridY) {
    const unsigned gy = unsigned(lo(int64_t(kMaxGridY), m - r0));
    QL_LAUNCH(linear_wo_kernel<F>, dim3(gx, gy, unsigned(s)), dim3(kThreads),
              0, st, *w, dt, x, r0, m, span, part, y);
  }
  if (s > 1) {
    const int64_t blocks = (m * w->n + kThreads - 1) / kThreads;
    QL_LAUNCH(reduce_kernel<F>, dim3(unsigned(blocks)), dim3(kThreads), 0, st,
              *w, dt, m, int(s), static_cast<const float*>(part), y);
  }
}

// The streaming kernel for MT rows of x per block (D steps in flight, B
// blocks per SM): ceil(m / MT) block rows, each reading the weight once.
// persist: a grid of about B blocks per SM (w->sms of them; 0: unknown), each walking several row
// tiles, the same number for every block where it can, so that x is staged
// and the load pipeline filled once per block rather than once per 16 rows
// of W, with no tail wave; otherwise one block per row tile.
template <int F, bool Z, int MT, int D = kDepth<F, MT>,
          int B = kMinBlocks<MT>>
void launch_stream_mt(const ql__cuda_wo* w, int dt, const void* x, int64_t m,
                      void* y, float* part, bool persist, cudaStream_t st) {
  const int64_t rtiles = (w->n + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t s = splits_of(w->n, w->k);
  const int64_t tiles = (w->k + kTile - 1) / kTile;
  const int64_t span = (tiles + s - 1) / s * kTile;
  int64_t gx = rtiles;
  if (persist && w->sms > 0) {
    const int64_t slots = hi(int64_t(1), int64_t(w->sms) * B / s);
    const int64_t per = (rtiles + slots - 1) / slots;  // row tiles a block
    gx = (rtiles + per - 1) / per;
  }
  auto* const kernel = &wo_stream_kernel<F, Z, MT, D, B>;  // commas: not
                                                           // in a macro
  for (int64_t r0 = 0; r0 < m; r0 += int64_t(kMaxGridY) * MT) {
    const int64_t groups = (m - r0 + MT - 1) / MT;
    const unsigned gy = unsigned(lo(int64_t(kMaxGridY), groups));
    QL_LAUNCH(kernel, dim3(unsigned(gx), gy, unsigned(s)), dim3(kThreads), 0,
              st, *w, dt, x, r0, m, span, part, y);
  }
  if (s > 1) {
    const int64_t blocks = (m * w->n + kThreads - 1) / kThreads;
    QL_LAUNCH(reduce_kernel<F>, dim3(unsigned(blocks)), dim3(kThreads), 0, st,
              *w, dt, m, int(s), static_cast<const float*>(part), y);
  }
}

// The smallest instantiation that holds m rows (at most kMaxRows a block).
// wide: one or two rows of x with one step in flight and three blocks per
// SM (fewer registers, more warps to hide the arithmetic's latency) in
// place of two steps and two blocks.
template <int F, bool Z>
void launch_stream(const ql__cuda_wo* w, int dt, const void* x, int64_t m,
                   void* y, float* part, bool persist, bool wide,
                   cudaStream_t st) {
  static_assert(kMaxRows == 2 * kStageRows, "two passes at most");
  if (m <= 1 && wide)
    launch_stream_mt<F, Z, 1, 1, 3>(w, dt, x, m, y, part, persist, st);
  else if (m <= 1)
    launch_stream_mt<F, Z, 1>(w, dt, x, m, y, part, persist, st);
  else if (m <= 2 && wide)
    launch_stream_mt<F, Z, 2, 1, 3>(w, dt, x, m, y, part, persist, st);
  else if (m <= 2)
    launch_stream_mt<F, Z, 2>(w, dt, x, m, y, part, persist, st);
  else if (m <= 4)
    launch_stream_mt<F, Z, 4>(w, dt, x, m, y, part, persist, st);
  else if (m <= 8)
    launch_stream_mt<F, Z, 8>(w, dt, x, m, y, part, persist, st);
  else
    launch_stream_mt<F, Z, kMaxRows>(w, dt, x, m, y, part, persist, st);
}
// ---- the tensor-core kernel: q4g with f16 or bf16 x (the default there) ----
//
// wo_mma_kernel<BF, NT, RT> computes the block's 16·RT rows of W against
// 8·NT rows of x on the tensor cores (mma.sync m16n8k16, f32
// accumulation), with W as the A operand (16 rows of W a tile, RT tiles a
// warp) and x as B (8 rows of x a tile), so that one instruction takes 256
// weights; RT = 2 where the registers allow (each fragment of x serves two
// tiles), 1 at NT = 4. A pair of codes becomes an f16x2/bf16x2 operand in
// three instructions (dequant_word), with no shuffle and no int-to-float
// conversion, as the integers q: exact in 16 bits, so are their products
// with x, and only the tensor cores' f32 sums round (in the hardware's
// order and rounding, which the PTX ISA leaves open: the accuracy bound
// holds them, a GPU's conformance run checks it).
// The codes stay the canonical rows of the cuda-1 layout: the order of K
// inside a k-block of 128 is free as long as x follows it, so lane (g, t)
// takes the 16 bytes at 32t of rows g and g + 8 of each tile and the same
// 32 values of x, which four byte permutes turn into its B fragments; the
// weight streams through 128-bit loads that skip L1, x comes through L1.
//
// The reduction order, fixed by (N, K, device) alone: per k-block of 128
// values (never straddling a group: groups are multiples of 128 here) the
// tensor cores sum x·q into c and x into xs (an mma with A = 1), and the
// warp adds zero·xs and then scale·c to its f32 sum; a warp takes a run of
// consecutive k-blocks in increasing k; the block's 8 warps are added in
// warp order through shared memory; with split-K (mma_splits(): a function
// of N, K and the device's SM count), the splits go through part[] and
// reduce_kernel in increasing order. Rows of x are columns of the mma and
// never meet, and RT only groups tiles: a row gives the same bytes alone
// and in any batch, whatever NT and RT its batch takes. The order differs
// from the streaming kernel's, so the two agree within the accuracy bound,
// not bit for bit; a weight's calls with f16 or bf16 x always take this
// one (f32 x, other formats, f16/bf16 scales and other shapes take the
// streaming kernel).
constexpr int kMmaKB = 128;               // values of K per k-block
constexpr int kMmaMaxNT = 4;              // 32 rows of x per pass at most

// Tiles of 16 rows of W a warp takes at NT tiles of x, and blocks per SM
// the register budget is cut for: two (128 registers a thread; at three
// the one-tile kernel spills on sm_90), one at four tiles of x before
// sm_90, where 128 registers spill.
template <int NT>
constexpr int kMmaRT = NT <= 2 ? 2 : 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
template <int NT>
constexpr int kMmaBlocks = NT >= 4 ? 1 : 2;
#else
template <int NT>
constexpr int kMmaBlocks = 2;
#endif

// Word j of v (j a constant once unrolled).
__device__ __forceinline__ uint32_t word_of(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// The four operand pairs of one word of 8 codes (values e = 0..7 of the
// word, the code of e in bits 4e..4e+3): pair p holds codes p and p + 4
// (low and high half) as the exact integers q in f16 or bf16. Per pair a
// shift, a lop3 (b ? (a ^ c) : c, LUT 0x6A: the masked code with its sign
// bit flipped, u = q + 8, in the mantissa of the magic number 1024 or 128)
// and an fma2 (·1 − 1032, or − 136), all exact.
template <bool BF>
__device__ __forceinline__ void dequant_word(uint32_t v, uint32_t (&p)[4]) {
  using namespace ql_ptx;
  constexpr uint32_t kMagic = BF ? 0x43084308u : 0x64086408u;
  constexpr uint32_t kOne = BF ? 0x3F803F80u : 0x3C003C00u;
  constexpr uint32_t kBias = BF ? 0xC308C308u : 0xE408E408u;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    p[i] = ql_fma2<BF>(ql_lop3<0x6A>(v >> (4 * i), 0x000F000Fu, kMagic), kOne,
                       kBias);
}

// Can wo_mma_kernel take this weight (whatever x): q4g, f32 scales and
// zeros (the cuda-1 layout's default, QL_CUDA_WIDE_SCALES), K and the group
// length multiples of 128, and rows short enough for the kernel's 32-bit
// offsets (K below 2^25, N·G below 2^31).
bool mma_takes(const ql__cuda_wo* w) {
  return w->format == F_Q4G && w->sdt == DT_F32 && w->zero != nullptr &&
         w->k % kMmaKB == 0 && w->gs % kMmaKB == 0 &&
         w->ldq < (int64_t(1) << 25) && w->k < (int64_t(1) << 25) &&
         w->n * w->groups < (int64_t(1) << 31);
}

// ... and with x of dtype dt: f16 or bf16.
bool mma_fits(const ql__cuda_wo* w, int dt) {
  return (dt == DT_F16 || dt == DT_BF16) && mma_takes(w);
}

// Splits of K across blocks: one where the 32-row tiles alone give two
// blocks an SM, else two where K holds a k-block for each warp of both,
// so that a narrow weight fills the SMs and keeps two k-blocks a warp in
// flight (of one split, two, and about two, four or eight blocks an SM,
// the static model's fastest on every canonical shape: docs/gpu-model.md).
// A function of (N, K, the device's SMs), never of M.
int64_t mma_splits(const ql__cuda_wo* w) {
  const int64_t sms = w->sms > 0 ? w->sms : 132;  // H100/H200 where unknown
  if ((w->n + 31) / 32 >= 2 * sms) return 1;
  return w->k >= 2 * kWarps * kMmaKB ? 2 : 1;
}

// y rows [m0, m0 + 8·NT) for rows [16·RT·blockIdx.x, +16·RT) of W, m0 =
// 8·NT·blockIdx.y, over split blockIdx.z of gridDim.z; see above.
template <bool BF, int NT, int RT = kMmaRT<NT>>
__global__ void __launch_bounds__(kThreads, kMmaBlocks<NT>)
    wo_mma_kernel(ql__cuda_wo w, int dt, const uint16_t* __restrict__ x,
                  int64_t m_all, float* __restrict__ part,
                  void* __restrict__ y) {
  using namespace ql_ptx;
  __shared__ __align__(16) float red[kWarps][RT * 4 * 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t n0 = int64_t(blockIdx.x) * 16 * RT;
  const int64_t m0 = int64_t(blockIdx.y) * 8 * NT;
  // This warp's k-blocks: its eighth of the split's share, in order.
  // (32-bit counts and offsets: mma_fits() bounds K, the rows' bytes and
  // N·G.)
  const int nkb = int(w.k / kMmaKB), S = int(gridDim.z);
  const int s0 = int(int64_t(nkb) * blockIdx.z / S);
  const int s1 = int(int64_t(nkb) * (blockIdx.z + 1) / S);
  const int kb0 = s0 + (s1 - s0) * warp / kWarps;
  const int kb1 = s0 + (s1 - s0) * (warp + 1) / kWarps;
  // Rows g + 8i (i < 2·RT) of the block, a row past N read as row N - 1,
  // and rows m0 + g + 8j of x, a row past the batch read as its last row:
  // what those give is never stored, and columns of the mma never meet, so
  // no load needs a predicate. Offsets from the block's first row of each
  // (32-bit: mma_fits() bounds them).
  const uint8_t* const qb = w.q + n0 * w.ldq;
  const float* const sb = static_cast<const float*>(w.scale);
  const float* const zb = static_cast<const float*>(w.zero);
  int qoff[2 * RT], soff[2 * RT];
#pragma unroll
  for (int i = 0; i < 2 * RT; ++i) {
    const int64_t n = lo(n0 + g + 8 * i, w.n - 1);
    qoff[i] = int((n - n0) * w.ldq) + 16 * t;
    soff[i] = int(n * w.groups);
  }
  const uint16_t* const xb = x + m0 * w.k;
  int xoff[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j)
    xoff[j] = int((lo(m0 + g + 8 * j, m_all - 1) - m0) * w.k) + 32 * t;
  const int gshift = 31 - __clz(int(w.gs)) - 7;  // k-block -> group
  const uint32_t one = BF ? 0x3F803F80u : 0x3C003C00u;
  const uint32_t ones[4] = {one, one, one, one};
  float acc[RT][NT][4];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][j][i] = 0.0f;
  for (int kb = kb0; kb < kb1; ++kb) {
    // The weight's 64 bytes of this lane (RT = 2) first, then x.
    uint4 v[RT][2];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        v[r][h] = ql_ld128_stream(qb + qoff[2 * r + h] + kb * 64);
    float c[RT][NT][4], xs[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        xs[j][i] = 0.0f;
#pragma unroll
        for (int r = 0; r < RT; ++r) c[r][j][i] = 0.0f;
      }
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {  // word jj: two steps of k16
      uint32_t b[NT][2][2];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint4 u = ql_ld128(xb + xoff[j] + kb * kMmaKB + 8 * jj);
        // Values {0, 4} and {1, 5} of the word's 8 for the first step,
        // {2, 6} and {3, 7} for the second, as the codes' pairs.
#ifdef QL_MUT_MMA_PERM  // mutation test: values {0, 1}, not {0, 4}
        b[j][0][0] = u.x;
#else
        b[j][0][0] = __byte_perm(u.x, u.z, 0x5410u);
#endif
        b[j][0][1] = __byte_perm(u.x, u.z, 0x7632u);
        b[j][1][0] = __byte_perm(u.y, u.w, 0x5410u);
        b[j][1][1] = __byte_perm(u.y, u.w, 0x7632u);
      }
#pragma unroll
      for (int r = 0; r < RT; ++r) {
        uint32_t pa[4], pb[4];
        dequant_word<BF>(word_of(v[r][0], jj), pa);
        dequant_word<BF>(word_of(v[r][1], jj), pb);
        const uint32_t a0[4] = {pa[0], pb[0], pa[1], pb[1]};
        const uint32_t a1[4] = {pa[2], pb[2], pa[3], pb[3]};
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          ql_mma_m16n8k16<BF>(c[r][j], a0, b[j][0], c[r][j]);
          ql_mma_m16n8k16<BF>(c[r][j], a1, b[j][1], c[r][j]);
        }
      }
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        ql_mma_m16n8k16<BF>(xs[j], ones, b[j][0], xs[j]);
        ql_mma_m16n8k16<BF>(xs[j], ones, b[j][1], xs[j]);
      }
    }
    // Scales and zeros loaded here rather than with the codes: eight
    // registers fewer through the mma steps (the other warps of the SM
    // cover the wait).
    const int sk = kb >> gshift;
    float s[RT][2], z[RT][2];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        s[r][h] = sb[soff[2 * r + h] + sk];
        z[r][h] = zb[soff[2 * r + h] + sk];
      }
    // c[i]: row g + 8·(i >> 1) of the tile, row 2t + (i & 1) of x.
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          acc[r][j][i] = __fmaf_rn(z[r][i >> 1], xs[j][i], acc[r][j][i]);
          acc[r][j][i] = __fmaf_rn(s[r][i >> 1], c[r][j][i], acc[r][j][i]);
        }
  }
  // The 8 warps' sums in warp order, one tile of x at a time: thread e
  // adds element e = 128r + 32i + lane of every warp.
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp][128 * r + 32 * i + lane] = acc[r][j][i];
    __syncthreads();
    const int e = threadIdx.x, r = e >> 7, i = (e >> 5) & 3, l = e & 31;
    const int64_t n = n0 + 16 * r + 8 * (i >> 1) + (l >> 2);
    const int64_t m = m0 + 8 * j + 2 * (l & 3) + (i & 1);
    if (e < RT * 128 && n < w.n && m < m_all) {
      float sum = red[0][e];
#pragma unroll
      for (int q = 1; q < kWarps; ++q) sum = __fadd_rn(sum, red[q][e]);
      if (gridDim.z == 1)
        finish<F_Q4G>(w, dt, y, m, n, sum);
      else
        part[(int64_t(blockIdx.z) * m_all + m) * w.n + n] = sum;
    }
    __syncthreads();
  }
}

// x must be 16-byte aligned here (launch_mma sees to it).
template <bool BF, int NT>
void launch_mma_nt(const ql__cuda_wo* w, int dt, const void* x, int64_t m,
                   void* y, float* part, int64_t s, cudaStream_t st) {
  const unsigned gx = unsigned((w->n + 16 * kMmaRT<NT> - 1) / (16 * kMmaRT<NT>));
  auto* const kernel = &wo_mma_kernel<BF, NT>;
  constexpr int64_t kRows = 8 * NT;
  for (int64_t r0 = 0; r0 < m; r0 += int64_t(kMaxGridY) * kRows) {
    const int64_t passes = (m - r0 + kRows - 1) / kRows;
    const unsigned gy = unsigned(lo(int64_t(kMaxGridY), passes));
    // Rows from r0 on: x, y and part seen from row r0.
    const uint16_t* xr = static_cast<const uint16_t*>(x) + r0 * w->k;
    void* yr = static_cast<uint16_t*>(y) + r0 * w->n;
    QL_LAUNCH(kernel, dim3(gx, gy, unsigned(s)), dim3(kThreads), 0, st, *w,
              dt, xr, m - r0, part, yr);
    if (s > 1) {
      const int64_t rows = m - r0;
      const int64_t blocks = (rows * w->n + kThreads - 1) / kThreads;
      QL_LAUNCH(reduce_kernel<F_Q4G>, dim3(unsigned(blocks)), dim3(kThreads),
                0, st, *w, dt, rows, int(s), static_cast<const float*>(part),
                yr);
    }
  }
}

// Bytes of scratch the tensor-core kernel needs for m rows: the splits'
// partial sums, then room for a 16-byte aligned copy of x.
size_t mma_scratch(const ql__cuda_wo* w, int64_t m) {
  const int64_t s = mma_splits(w);
  return (s > 1 ? size_t(s) * size_t(m) * size_t(w->n) * sizeof(float) : 0) +
         size_t(m) * size_t(w->k) * 2 + 16;
}

// The smallest NT that holds m rows (8·NT rows a pass, several passes
// above 32 rows).
template <bool BF>
void launch_mma(const ql__cuda_wo* w, int dt, const void* x, int64_t m,
                void* y, float* part, cudaStream_t st) {
  const int64_t s = mma_splits(w);
  // x that is not 16-byte aligned (a row slice of a caller's tensor) is
  // copied to an aligned place in scratch first: the same values, so the
  // same bytes, with every load of the kernel 128 bits wide.
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0) {
    unsigned char* const end = reinterpret_cast<unsigned char*>(part) +
                               (s > 1 ? s * m * w->n * 4 : 0);
    void* const xa = reinterpret_cast<void*>(
        (reinterpret_cast<uintptr_t>(end) + 15) & ~uintptr_t(15));
    ql__cuda_copy(xa, x, size_t(m * w->k * 2), st);
    x = xa;
  }
  if (m <= 8)
    launch_mma_nt<BF, 1>(w, dt, x, m, y, part, s, st);
  else if (m <= 16)
    launch_mma_nt<BF, 2>(w, dt, x, m, y, part, s, st);
  else
    launch_mma_nt<BF, kMmaMaxNT>(w, dt, x, m, y, part, s, st);
}
}  // namespace
}  // namespace ql_cuda

// QL_CUDA_WO_KERNEL, read once, here, so that the daemon's backend and
// libqlinear-cuda's mapped launches run the same kernel: "legacy" the
// kernel with one block row per row of x, "tiled" the streaming one
// without its persistent grid, "wide" with one step of loads in flight and
// three blocks per SM at one or two rows of x, "stream" the streaming one
// also where the tensor-core kernel is the default (q4g with f16/bf16 x),
// so that one GPU run can time them all. The streaming kernels give the
// same bytes; the tensor-core kernel has its own order.
namespace {
std::atomic<int> g_wo_kernel{-1};
}  // namespace

int ql__cuda_wo_kernel(void) {
  int v = g_wo_kernel.load();
  if (v >= 0) return v;
  const char* s = getenv("QL_CUDA_WO_KERNEL");
  v = s == nullptr                  ? QL__CUDA_WO_STREAM
      : strcmp(s, "legacy") == 0 ? QL__CUDA_WO_LEGACY
      : strcmp(s, "tiled") == 0  ? QL__CUDA_WO_TILED
      : strcmp(s, "wide") == 0   ? QL__CUDA_WO_WIDE
      : strcmp(s, "stream") == 0 ? QL__CUDA_WO_SIMT
                                 : QL__CUDA_WO_STREAM;
  g_wo_kernel.store(v);
  return v;
}

int64_t ql__cuda_row_bytes(int format, int64_t k) {
  return format == ql_cuda::F_Q4G ? k / 2 + (k & 1) : k;
}

size_t ql__cuda_linear_wo_scratch(const ql__cuda_wo* w, int64_t m) {
  using namespace ql_cuda;
  const int64_t s = splits_of(w->n, w->k);
  const size_t stream =
      s > 1 ? size_t(s) * size_t(m) * size_t(w->n) * sizeof(float) : 0;
  // The tensor-core kernel's, for a weight it may take (the dtype of x is
  // not known here).
  return mma_takes(w) ? hi(stream, mma_scratch(w, m)) : stream;
}

void ql__cuda_linear_wo(const ql__cuda_wo* w, int kernel, int dt,
                        const void* x, int64_t m, void* y, float* scratch,
                        void* stream) {
  using namespace ql_cuda;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (kernel == QL__CUDA_WO_STREAM && mma_fits(w, dt)) {
    if (dt == DT_BF16)
      launch_mma<true>(w, dt, x, m, y, scratch, st);
    else
      launch_mma<false>(w, dt, x, m, y, scratch, st);
    return;
  }
  if (kernel != QL__CUDA_WO_LEGACY) {
    const bool pe = kernel != QL__CUDA_WO_TILED;
    const bool wi = kernel == QL__CUDA_WO_WIDE;
    switch (w->format) {
      case F_Q4G:
        launch_stream<F_Q4G, true>(w, dt, x, m, y, scratch, pe, wi, st);
        return;
      case F_Q8C:
        launch_stream<F_Q8C, false>(w, dt, x, m, y, scratch, pe, wi, st);
        return;
      case F_Q8B:
        if (w->zero != nullptr)
          launch_stream<F_Q8B, true>(w, dt, x, m, y, scratch, pe, wi, st);
        else
          launch_stream<F_Q8B, false>(w, dt, x, m, y, scratch, pe, wi, st);
        return;
      default:
        launch_stream<F_F8R, false>(w, dt, x, m, y, scratch, pe, wi, st);
        return;
    }
  }
  switch (w->format) {
    case F_Q4G:
      launch_wo<F_Q4G>(w, dt, x, m, y, scratch, st);
      break;
    case F_Q8C:
      launch_wo<F_Q8C>(w, dt, x, m, y, scratch, st);
      break;
    case F_Q8B:
      launch_wo<F_Q8B>(w, dt, x, m, y, scratch, st);
      break;
    default:
      launch_wo<F_F8R>(w, dt, x, m, y, scratch, st);
      break;
  }
}

void ql__cuda_copy(void* dst, const void* src, size_t n, void* stream) {
  using namespace ql_cuda;
  if (n == 0) return;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
#if QL_EMU
  // Host memory the GPU does not map faults there: the emulated runtime
  // makes the device's error sticky, and the launch below then fails.
  if (ql__emu_cuda_access != nullptr) {
    (void)ql__emu_cuda_access(st, dst, n);
    (void)ql__emu_cuda_access(st, src, n);
  }
#endif
  const int64_t units = (int64_t(n) + 15) / 16;
  const int64_t blocks = lo(int64_t(128), (units + kThreads - 1) / kThreads);
  QL_LAUNCH(copy_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, st,
            static_cast<unsigned char*>(dst),
            static_cast<const unsigned char*>(src), int64_t(n));
}

void ql__cuda_check_finite(int dt, const void* x, int64_t n, int* bad,
                           void* stream) {
  using namespace ql_cuda;
  const int64_t blocks = lo(int64_t(1024), (n + kThreads - 1) / kThreads);
  QL_LAUNCH(check_finite_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0,
            static_cast<cudaStream_t>(stream), dt, x, n, bad);
}
