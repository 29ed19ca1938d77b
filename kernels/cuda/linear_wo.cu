// linear_wo.cu - weight-only linear for decode-shaped batches (DESIGN §4,
// §9): y[m, n] = Σk x[m, k]·dequant(W)[n, k] (+ b[n]) for q4g, q8c, q8b and
// f8r weights in the "cuda-1" layout (ql_cuda.h), f32/f16/bf16 activations
// and f32/f16/bf16 scales.
//
// Shape: one warp per output row, kWarps rows per block, one block row per
// row of x (grid.y). The block stages kTile values of its x row in shared
// memory as f32 (zero past K), then each lane takes 16-byte chunks of its
// weight row (32 int4 or 16 one-byte codes) with one 128-bit load each and
// dequantizes them in registers. Ragged K needs no special case: a row of
// the layout is zero-padded to 16 bytes and x is zero there.
//
// Reduction order, fixed by (N, K, format) alone: each lane sums its chunks
// in increasing k, then warp_sum() adds the 32 lanes in a fixed butterfly.
// A narrow weight splits K over several blocks (split-K, splits_of()); the
// splits' sums then go through memory and are added in increasing order by
// a second kernel. No atomics, and nothing depends on M or the row's place
// in the batch, so a row gives the same bytes alone and in any batch
// (DESIGN §4). The order
// is not the reference's (it is a GPU's), so results agree with the
// reference within the accuracy bound, not bit for bit.
//
// The factored forms of the reference (ql_kernels.h) are kept, per chunk
// rather than per group: q4g adds zero·Σx + scale·Σx·q for each chunk (a
// chunk never straddles a group: groups are multiples of 32), q8c and f8r
// multiply by the row scale once at the end.
#include "common.cuh"
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

// The group (q4g) or block (q8b) of value kc.
__device__ __forceinline__ int64_t group_of(const ql__cuda_wo& w, int64_t kc) {
#ifdef QL_MUT_GROUP_INDEX  // mutation test: the next chunk's group
  return lo(w.groups - 1, (kc + 32) / int64_t(w.gs));
#else
  return kc / int64_t(w.gs);
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

}  // namespace
}  // namespace ql_cuda

int64_t ql__cuda_row_bytes(int format, int64_t k) {
  return format == ql_cuda::F_Q4G ? k / 2 + (k & 1) : k;
}

size_t ql__cuda_linear_wo_scratch(const ql__cuda_wo* w, int64_t m) {
  const int64_t s = ql_cuda::splits_of(w->n, w->k);
  return s > 1 ? size_t(s) * size_t(m) * size_t(w->n) * sizeof(float) : 0;
}

void ql__cuda_linear_wo(const ql__cuda_wo* w, int dt, const void* x,
                        int64_t m, void* y, float* scratch, void* stream) {
  using namespace ql_cuda;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
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

void ql__cuda_check_finite(int dt, const void* x, int64_t n, int* bad,
                           void* stream) {
  using namespace ql_cuda;
  const int64_t blocks = lo(int64_t(1024), (n + kThreads - 1) / kThreads);
  QL_LAUNCH(check_finite_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0,
            static_cast<cudaStream_t>(stream), dt, x, n, bad);
}
