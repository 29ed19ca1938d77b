// linear_aq.cu - activation-quantized linear on int8 tensor cores (DESIGN §4
// "AQ math", §9): W8A8 for q8c and W4A8 for q4g weights in the "cuda-1"
// layout (ql_cuda.h), on activation rows that quantize_rows.cu has already
// turned into int8 codes xq [M, K], row scales sx [M] and, for q4g, the
// per-group sums gsum [M, G]:
//   q8c: y[m,n] = Σk xq·wq (int32) · (sx[m]·sw[n])
//   q4g: y[m,n] = sx[m] · Σg (scale[g,n]·Σk∈g xq·q + zero[g,n]·gsum[m,g])
// plus bias, rounded once to the activation dtype. The scaling is the
// epilogue of the int32 tiles, in registers: no int32 array goes to memory.
//
// Orientation. The mma is mma.sync m16n8k32 .s8 (ptx.h): the 16-row operand
// A is the weight (16 output channels) and the 8-column operand B the
// activations (8 tokens), so that a decode batch of 1..8 rows fills one
// 8-wide tile instead of wasting 15/16 of a 16-row one. Both operands are
// then K-major as the instruction's .row.col form wants: A row-major is W
// [N, K] and B column-major is xq [M, K], as stored.
//
// Shape. A block of kWarps = 8 warps computes 16 channels × 8·MT tokens
// (MT = 1 or 2 tiles of 8). Its warps split K into 8 contiguous ranges of
// whole units (a q4g group, a 64-value slab for q8c), fixed by K alone;
// each warp stages its x range into its own shared-memory window,
// multiplies, and the ranges are added at the end in warp order through
// shared memory. That split is what keeps loads in flight for a decode
// batch: one 16-channel tile per warp would give N = 4096 only 256 warps,
// two per SM of an H100. Within its range a warp keeps a ring of kDepth
// slabs of codes in registers, each refilled as soon as it is multiplied,
// so that the next slabs are always on their way from memory. (256 threads is also the block of the other
// kernels of a call, so the emulator keeps one set of fiber stacks.)
//
// K order. Integer sums are exact, so inside a unit the k order is free,
// and each lane takes whole bytes of a row: per slab of S values a lane
// holds S/4 consecutive k of rows g and g+8 (one 128-bit load for q8c and
// for q4g groups of 128 or more, 32 or 64 bits for q4g g32/g64, so that a
// slab never straddles a group), and mma j of the slab gives its 8 values
// [8j, 8j+8) of that run to the fragment columns 4t.. and 16+4t.. (PTX ISA,
// "Matrix Fragments for mma.m16n8k32"). The x window is stored in the same
// order (for q4g each 8 values as their 4 even then 4 odd ones, the order
// of the low and high nibbles of a packed word), so a lane's B fragment is
// two aligned 32-bit words. Ragged K: x is zero past K in the window and
// a chunk of codes at or past the row's padded end (ldq, a multiple of 16
// bytes) is not loaded at all, so no load is misaligned or out of the row.
//
// Reduction order, fixed by (K, format): int32 inside a unit (all of the
// warp's range for q8c: K ≤ QL_AQ_Q8C_MAX_K, so no partial sum overflows);
// for q4g, per group in increasing g, acc += scale·Σxq·q then acc +=
// zero·Σxq (the reference's order) in f32; then the warps' partials in warp
// order. Nothing depends on M, on the tile a row lands in or on the other
// rows: a row gives the same bytes alone and in any batch (DESIGN §4).
// q8c equals the reference bit for bit; q4g can differ from it in the last
// bits once K has more than one group, where the warps' f32 partials are
// added in another association than the reference's running sum.
#include "common.cuh"
#include "ptx.h"
#include "ql_cuda.h"

namespace ql_cuda {
namespace {

enum : int { F_Q4G = 1, F_Q8C = 2 };  // ql_format

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxGridY = 65535;
constexpr int kTileN = 16;  // channels per block: the mma's 16 rows

// A lane's chunk of one weight row for one slab of S values: S/4 bytes for
// q8c (16: one 128-bit load), S/8 for q4g (4, 8 or 16), in 32-bit words.
template <int F, int S>
constexpr int kWords = (F == F_Q4G ? S / 8 : S / 4) / 4;

// Slabs whose codes a lane has in flight, and whether a block walks
// several channel tiles (a persistent grid) with the ring running on
// across them. q8c: four slabs (128 bytes a lane, 64 KiB per SM at two
// blocks per SM), persistent; measured on an H100 against one slab ahead
// and one block per tile (qlinear-bench --device, 14336x4096): M = 1
// 28.2 us against 30.9, M = 8 36.7 against 40.1, M = 16 51.0 against
// 52.6. q4g: two slabs, one block per tile, as before: its group scales
// and zeros are loaded when a group ends, not in the ring, and with the
// deeper ring's registers (two blocks per SM, not three) those loads
// stalled it: M = 1 28.7 us against 24.4.
template <int F, int S>
constexpr int kDepth = F == F_Q4G ? 2 : 4;
template <int F>
constexpr bool kPersistent = F == F_Q8C;
// Blocks per SM the registers must allow: three for q4g with one token
// tile (at most 85 registers), as before the ring, so that more warps
// cover those loads; two otherwise (two token tiles of q4g spill at 85).
template <int F, int MT>
constexpr int kMinBlocks = F == F_Q4G && MT == 1 ? 3 : 2;

// The x window of one warp: 8·MT token rows of kCols(MT) k values, each
// row padded by 16 bytes (it shifts the rows across the banks).
template <int MT>
constexpr int kCols = 512 / MT;
template <int MT>
constexpr int kLd = kCols<MT> + 16;

// W words of codes at p, or zeros when `in` is false (a row past N, or a
// chunk past the row's padded end). p is W·4-byte aligned: rows start
// 16-byte aligned and a chunk starts at a multiple of its size.
template <int W>
__device__ __forceinline__ void load_codes(const uint8_t* p, bool in,
                                           uint32_t (&c)[W]) {
  if constexpr (W == 4) {
    uint4 v = in ? ql_ld128(p) : uint4{0, 0, 0, 0};
    c[0] = v.x, c[1] = v.y, c[2] = v.z, c[3] = v.w;
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i)
      c[i] = in ? reinterpret_cast<const uint32_t*>(p)[i] : 0u;
  }
}

// Four two's complement nibbles, one in the low half of each byte, as four
// int8: bit 3 set gives 0xF0 above it (0x08·0x1E = 0xF0, no carry between
// bytes).
__device__ __forceinline__ uint32_t sext4(uint32_t v) {
  return v | ((v & 0x08080808u) * 0x1Eu);
}

// The group whose scale and zero apply to the group gi just summed.
__device__ __forceinline__ int64_t scale_group(const ql__cuda_wo& w,
                                               int64_t gi) {
#ifdef QL_MUT_AQ_EPILOGUE  // mutation test: the next group's scale and zero
  return lo(w.groups - 1, gi + 1);
#else
  (void)w;
  return gi;
#endif
}

// One block: the channel tiles of 16 blockIdx.x, blockIdx.x + gridDim.x,
// ... (kPersistent: a grid of about two blocks per SM where the layout
// knows the SM count; else one block per tile) for tokens [m0, m0 + 8·MT),
// m0 = row0 + 8·MT·blockIdx.y, of the m rows of xq. S is the slab (64 for
// q8c; min(gs, 128) for q4g). Two blocks per SM: at most 128 registers,
// which is also where ptxas stops trading spills for occupancy (with the
// thread count alone it spilled the g32 kernel at 64 registers on sm_90),
// and 2 × 43 KB of shared memory fits every target.
//
// A warp's ring of codes runs on across its block's tiles: the slot that
// served the last slab p (mod kDepth) of a tile is refilled with slab p of
// the next tile, which the next tile reads from that same slot, so the
// loads never drain between tiles; and where the warp's range of K fits
// one x window, x is staged once for all of them. One block per tile
// pays both for every 16 channels (see kDepth for what that costs).
template <int F, int S, int MT>
__global__ void __launch_bounds__(kThreads, kMinBlocks<F, MT>)
    linear_aq_kernel(ql__cuda_wo w, const int8_t* __restrict__ xq,
                     const float* __restrict__ sx,
                     const int32_t* __restrict__ gsum, int64_t m,
                     int64_t row0, int dt, void* __restrict__ y) {
  static_assert(MT <= kWarps, "one warp reduces each token tile");
  static_assert(kCols<MT> % S == 0, "a slab never straddles a window");
  constexpr int W = kWords<F, S>, kLdx = kLd<MT>, kC = kCols<MT>,
                P = kDepth<F, S>;
  __shared__ __align__(16) uint8_t xs_all[kWarps][8 * MT * kLdx];
  __shared__ uint32_t red[kWarps][MT][4][32];  // f32 (q4g) or int32 bits

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;
  const int64_t k = w.k, tiles = (w.n + kTileN - 1) / kTileN;
  const int64_t m0 = row0 + int64_t(blockIdx.y) * 8 * MT;
  // Token tiles with at least one row: the same in every lane, so the
  // warp-collective mma is skipped for a dead tile by the whole warp.
  const int live = int(lo(int64_t(MT), (m - m0 + 7) / 8));
  uint8_t* xs = xs_all[warp];

  // This warp's range of K, in whole units, fixed by K alone, and its
  // slabs (the same count in every tile).
  const int64_t unit = F == F_Q4G ? int64_t(w.gs) : S;
  const int64_t units = (k + unit - 1) / unit;
  const int64_t kw0 = units * warp / kWarps * unit;
  const int64_t kw1 = lo(units * (warp + 1) / kWarps * unit, k);
  const int64_t ns = kw1 > kw0 ? (kw1 - kw0 + S - 1) / S : 0;

  // This lane's S/4 values of rows g and g+8 of tile ti in the slab at s
  // (zeros past the last tile, past the warp's range, past N or past the
  // row's padded end).
  auto codes = [&](int64_t ti, int64_t s, uint32_t(&ca)[W],
                   uint32_t(&cb)[W]) {
    const int64_t na = ti * kTileN + g, nb = na + 8;
    const int64_t off = F == F_Q4G ? s / 2 + (S / 8) * t : s + 16 * t;
    const bool in = ti < tiles && s < kw1 && off < w.ldq;
    const bool va = in && na < w.n, vb = in && nb < w.n;
    load_codes<W>(w.q + (va ? na : 0) * w.ldq + off, va, ca);
    load_codes<W>(w.q + (vb ? nb : 0) * w.ldq + off, vb, cb);
  };

  // The ring: slot p holds the slab that the tile's p-th step (mod P)
  // multiplies next.
  uint32_t ca[P][W], cb[P][W];
  int64_t ti = blockIdx.x;
#pragma unroll
  for (int p = 0; p < P; ++p) codes(ti, kw0 + p * S, ca[p], cb[p]);
  // Rows of xq are k bytes apart from an aligned base: 8-value loads when
  // k keeps them 8-byte aligned.
  const bool x8 = (k & 7) == 0;
  const bool once = kw1 - kw0 <= kC;  // the range fits one window
  bool staged = false;
  int64_t c0 = kw0;
  for (; ti < tiles; ti += gridDim.x) {
    const int64_t na = ti * kTileN + g, nb = na + 8;
    const bool lva = na < w.n, lvb = nb < w.n;
    int d[MT][4] = {};
    float acc[MT][4] = {};
    for (int64_t j0 = 0; j0 < ns; j0 += P) {
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const int64_t j = j0 + p;
        if (j >= ns) break;  // the same in every lane
        const int64_t s0 = kw0 + j * S;

        if ((s0 - kw0) % kC == 0 && !(once && staged)) {
          // Stage x [m0, m0 + 8·live) × [s0, s0 + kC) into the window,
          // zero past K and past m, 8 values per step in the fragment
          // order above.
          c0 = s0;
          staged = true;
          __syncwarp();  // every lane is done with the previous window
          for (int e = lane; e < 8 * live * (kC / 8); e += 32) {
            const int r = e / (kC / 8), c = e % (kC / 8);
            const int64_t row = m0 + r, k8 = c0 + 8 * c;
            uint32_t v0 = 0, v1 = 0;
            if (row < m && x8 && k8 + 8 <= k) {
              const uint2 v =
                  *reinterpret_cast<const uint2*>(xq + row * k + k8);
              if (F == F_Q4G) {  // evens, then odds: the nibble order
                v0 = __byte_perm(v.x, v.y, 0x6420);
                v1 = __byte_perm(v.x, v.y, 0x7531);
              } else {
                v0 = v.x, v1 = v.y;
              }
            } else if (row < m) {
              const int8_t* src = xq + row * k;
#pragma unroll
              for (int i = 0; i < 8; ++i) {
                const uint32_t b = k8 + i < k ? uint8_t(src[k8 + i]) : 0u;
                if (F == F_Q4G)
                  (i & 1 ? v1 : v0) |= b << (8 * (i >> 1));
                else
                  (i < 4 ? v0 : v1) |= b << (8 * (i & 3));
              }
            }
            uint32_t* dst =
                reinterpret_cast<uint32_t*>(xs + r * kLdx + 8 * c);
            dst[0] = v0;
            dst[1] = v1;
          }
          __syncwarp();  // the window is complete before any lane reads it
        }

        const uint8_t* xl = xs + (s0 - c0) + (S / 4) * t;
#pragma unroll
        for (int jj = 0; jj < S / 32; ++jj) {
          uint32_t a[4];
          if constexpr (F == F_Q4G) {
            a[0] = sext4(ca[p][jj] & 0x0F0F0F0Fu);  // even k: low nibbles
            a[1] = sext4(cb[p][jj] & 0x0F0F0F0Fu);
            a[2] = sext4((ca[p][jj] >> 4) & 0x0F0F0F0Fu);  // odd k: high
            a[3] = sext4((cb[p][jj] >> 4) & 0x0F0F0F0Fu);
          } else {
            a[0] = ca[p][2 * jj], a[1] = cb[p][2 * jj];
            a[2] = ca[p][2 * jj + 1], a[3] = cb[p][2 * jj + 1];
          }
#pragma unroll
          for (int tm = 0; tm < MT; ++tm)
            if (tm < live) {
              const uint32_t* xb = reinterpret_cast<const uint32_t*>(
                  xl + (8 * tm + g) * kLdx + 8 * jj);
              const uint32_t b[2] = {xb[0], xb[1]};
              ql_mma_m16n8k32_s8(d[tm], a, b, d[tm]);
            }
        }
        // The slot is free: the slab it serves next goes in flight, P
        // further in this tile or slab p of the block's next tile (a
        // block that is not persistent has no next tile: no code, no
        // registers for it).
        if (j + P < ns)
          codes(ti, s0 + P * S, ca[p], cb[p]);
        else if constexpr (kPersistent<F>)
          codes(ti + gridDim.x, kw0 + p * S, ca[p], cb[p]);

        if constexpr (F == F_Q4G) {
          // The group ends here (or K does): its int32 sums into f32.
          if ((s0 + S) % int64_t(w.gs) == 0 || s0 + S >= kw1) {
            const int64_t gi = s0 / int64_t(w.gs), gw = scale_group(w, gi);
            float sa = 0.0f, za = 0.0f, sb = 0.0f, zb = 0.0f;
            if (lva) {
              sa = load_f32(w.sdt, w.scale, na * w.groups + gw);
              za = load_f32(w.sdt, w.zero, na * w.groups + gw);
            }
            if (lvb) {
              sb = load_f32(w.sdt, w.scale, nb * w.groups + gw);
              zb = load_f32(w.sdt, w.zero, nb * w.groups + gw);
            }
#pragma unroll
            for (int tm = 0; tm < MT; ++tm) {
              const int64_t r0 = m0 + 8 * tm + 2 * t;  // columns 2t, 2t+1
              const float x0 =
                  r0 < m ? float(gsum[r0 * w.groups + gi]) : 0.0f;
              const float x1 =
                  r0 + 1 < m ? float(gsum[(r0 + 1) * w.groups + gi]) : 0.0f;
              const float s4[4] = {sa, sa, sb, sb}, z4[4] = {za, za, zb, zb};
              const float g4[4] = {x0, x1, x0, x1};
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                acc[tm][i] =
                    __fadd_rn(acc[tm][i], __fmul_rn(s4[i], float(d[tm][i])));
                acc[tm][i] = __fadd_rn(acc[tm][i], __fmul_rn(z4[i], g4[i]));
                d[tm][i] = 0;
              }
            }
          }
        }
      }
    }

    // The warps' partial sums, added in warp order by warp tm for tile tm.
#pragma unroll
    for (int tm = 0; tm < MT; ++tm)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        red[warp][tm][i][lane] =
            F == F_Q4G ? __float_as_uint(acc[tm][i]) : uint32_t(d[tm][i]);
    __syncthreads();
    if (warp < live) {
      const int tm = warp;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t n = i < 2 ? na : nb,
                      row = m0 + 8 * tm + 2 * t + (i & 1);
        if (n >= w.n || row >= m) continue;
        float v;
        if constexpr (F == F_Q4G) {
          float s = __uint_as_float(red[0][tm][i][lane]);
          for (int r = 1; r < kWarps; ++r)
            s = __fadd_rn(s, __uint_as_float(red[r][tm][i][lane]));
          v = __fmul_rn(sx[row], s);
        } else {
          int s = int(red[0][tm][i][lane]);
          for (int r = 1; r < kWarps; ++r) s += int(red[r][tm][i][lane]);
          v = __fmul_rn(float(s),
                        __fmul_rn(sx[row], load_f32(w.sdt, w.scale, n)));
        }
        if (w.bias != nullptr) v = __fadd_rn(v, w.bias[n]);
        store_f32(dt, y, row * w.n + n, v);
      }
    }
    // The sums are read before the next tile's overwrite them (the same
    // condition in the whole block).
    if (ti + gridDim.x < tiles) __syncthreads();
  }
}

// out[i] = x[i] (dtype dt) as f32, for i < n.
__global__ void __launch_bounds__(kThreads)
    widen_kernel(int dt, const void* __restrict__ x, int64_t n,
                 float* __restrict__ out) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += stride)
    out[i] = load_f32(dt, x, i);
}

// The epilogue of a cuBLASLt product (ql_cuda.h): one thread per output
// element, in row-major order; nothing is summed, so the order of the
// threads does not matter. An int32 sum becomes f32 rounded to nearest, as
// the reference's (float) cast.
__global__ void __launch_bounds__(kThreads)
    gemm_epilogue_kernel(const void* __restrict__ acc, int acc_i32,
                         int64_t ldacc, const float* __restrict__ sx,
                         const void* sw, int sdt,
                         const float* __restrict__ bias, int64_t m,
                         int64_t n, int dt, void* __restrict__ y) {
  const int64_t total = m * n, stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += stride) {
    const int64_t r = i / n, c = i % n, at = r * ldacc + c;
    const float a = acc_i32 ? float(static_cast<const int32_t*>(acc)[at])
                            : static_cast<const float*>(acc)[at];
#ifdef QL_MUT_GEMM_EPILOGUE  // mutation test: the next channel's scale
    const int64_t sc = lo(n - 1, c + 1);
#else
    const int64_t sc = c;
#endif
    float v = __fmul_rn(a, __fmul_rn(sx[r], load_f32(sdt, sw, sc)));
    if (bias != nullptr) v = __fadd_rn(v, bias[c]);
    store_f32(dt, y, i, v);
  }
}

template <int F, int S, int MT>
void launch_aq(const ql__cuda_wo* w, const int8_t* xq, const float* sx,
               const int32_t* gsum, int64_t m, int dt, void* y,
               cudaStream_t st) {
  constexpr int64_t kRows = 8 * MT;
  // Persistent (kPersistent): two blocks per SM (the kernel's bound)
  // where the layout knows the SM count; else one block per tile.
  const int64_t ntiles = (w->n + kTileN - 1) / kTileN;
  const unsigned gx = unsigned(kPersistent<F> && w->sms > 0
                                   ? lo(ntiles, int64_t(w->sms) * 2)
                                   : ntiles);
  const int64_t tiles = (m + kRows - 1) / kRows;
  void (*kernel)(ql__cuda_wo, const int8_t*, const float*, const int32_t*,
                 int64_t, int64_t, int, void*) = linear_aq_kernel<F, S, MT>;
  for (int64_t t0 = 0; t0 < tiles; t0 += kMaxGridY) {
    const unsigned gy = unsigned(lo(int64_t(kMaxGridY), tiles - t0));
    QL_LAUNCH(kernel, dim3(gx, gy), dim3(kThreads), 0, st, *w, xq, sx, gsum,
              m, t0 * kRows, dt, y);
  }
}

template <int MT>
void launch_aq_mt(const ql__cuda_wo* w, const int8_t* xq, const float* sx,
                  const int32_t* gsum, int64_t m, int dt, void* y,
                  cudaStream_t st) {
  if (w->format == F_Q8C)
    launch_aq<F_Q8C, 64, MT>(w, xq, sx, gsum, m, dt, y, st);
  else if (w->gs % 128 == 0)
    launch_aq<F_Q4G, 128, MT>(w, xq, sx, gsum, m, dt, y, st);
  else if (w->gs % 64 == 0)
    launch_aq<F_Q4G, 64, MT>(w, xq, sx, gsum, m, dt, y, st);
  else
    launch_aq<F_Q4G, 32, MT>(w, xq, sx, gsum, m, dt, y, st);
}

}  // namespace
}  // namespace ql_cuda

void ql__cuda_linear_aq(const ql__cuda_wo* w, const int8_t* xq,
                        const float* sx, const int32_t* gsum, int64_t m,
                        int dt, void* y, void* stream) {
  using namespace ql_cuda;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  // One token tile per block for the smallest batches (the widest x
  // window, no registers for a tile that cannot be live), two above, so
  // that a block reads its weights once for 16 tokens. The split at 4
  // rather than 8 also makes the small conformance matrix (M = 1, 2, 3, 7,
  // 8) run both forms and compare them byte for byte through its lone-row
  // check.
  if (m <= 4)
    launch_aq_mt<1>(w, xq, sx, gsum, m, dt, y, st);
  else
    launch_aq_mt<2>(w, xq, sx, gsum, m, dt, y, st);
}

void ql__cuda_gemm_epilogue(const ql__cuda_wo* w, const void* acc,
                            int acc_i32, int64_t ldacc, const float* sx,
                            int64_t m, int dt, void* y, void* stream) {
  using namespace ql_cuda;
  const int64_t total = m * w->n;
  const int64_t blocks = lo(int64_t(1024), (total + kThreads - 1) / kThreads);
  // scale is [n, groups] with one group: sw[c] is element c.
  QL_LAUNCH(gemm_epilogue_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0,
            static_cast<cudaStream_t>(stream), acc, acc_i32, ldacc, sx,
            w->scale, w->sdt, w->bias, m, w->n, dt, y);
}

void ql__cuda_widen_f32(int dt, const void* x, int64_t n, float* out,
                        void* stream) {
  using namespace ql_cuda;
  const int64_t blocks = lo(int64_t(1024), (n + kThreads - 1) / kThreads);
  QL_LAUNCH(widen_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0,
            static_cast<cudaStream_t>(stream), dt, x, n, out);
}
