// quantize_rows.cu - per-row activation quantization on the GPU, the AQ
// path's first step (DESIGN §4): int8 with the q8c rule plus the per-group
// sums Σxq, or e4m3 with the f8r rule. Bit-exact with
// ql_quantize_rows_i8_src / ql_quantize_rows_e4m3_src: the scale and the
// codes come from the same single-rounding operations in the same order
// (common.cuh), and amax, the first bad value and the integer group sums
// are exact whatever order the threads combine them in.
//
// One block per row of x. Decode batches have few rows, so a block of 8
// warps shares each row: first the row's amax (and the first NaN/Inf or
// unrepresentable value, for the error the reference would give), then the
// codes, one warp per group so that a group's sum is one warp's.
#include <float.h>
#include <math.h>

#include "common.cuh"
#include "ql_cuda.h"

namespace ql_cuda {
namespace {

constexpr int kQWarps = 8;
constexpr int kQThreads = kQWarps * 32;
// Without group sums the row is cut into pieces of this many values, one
// warp each, so that every warp has work.
constexpr int64_t kQPiece = 1024;
constexpr float kI8Eps = 1.1920928955078125e-07f;     // QL_I8_SCALE_EPS
constexpr float kE4m3Max = 448.0f;                    // QL_E4M3_MAX
constexpr float kF8AmaxLb = 1e-12f;                   // QL_F8_AMAX_LB
constexpr float kF8F16ScaleMin = 5.9604644775390625e-08f;  // 2^-24
constexpr long long kNoBad = 0x7FFFFFFFFFFFFFFFll;

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ long long warp_min(long long v) {
  for (int o = 16; o > 0; o >>= 1) {
    long long u = __shfl_xor_sync(0xffffffffu, v, o);
    v = u < v ? u : v;
  }
  return v;
}
__device__ __forceinline__ int warp_isum(int v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int kKind>
__global__ void __launch_bounds__(kQThreads)
    quantize_rows_kernel(int src, const float* __restrict__ x, int64_t k,
                         int64_t gs, void* __restrict__ xq_, int64_t ldxq,
                         float* __restrict__ sx, int32_t* __restrict__ gsum,
                         int64_t* __restrict__ status) {
  __shared__ float s_amax[kQWarps];
  __shared__ long long s_bad[kQWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x;
  const float* xr = x + row * k;

  // amax, and the first value the reference would refuse: NaN/Inf (kind 1)
  // before a value src cannot hold (kind 2), as its row_amax() checks them.
  float amax = 0.0f;
  long long bad = kNoBad;
  for (int64_t i = threadIdx.x; i < k; i += kQThreads) {
    const float v = xr[i], a = fabsf(v);
    if (!(a <= FLT_MAX)) {
      bad = lo(bad, (long long)(i << 2 | 1));
    } else if (src != DT_F32 && rnd_src(src, v) != v) {
      bad = lo(bad, (long long)(i << 2 | 2));
    }
    if (a > amax) amax = a;
  }
  amax = warp_max(amax);
  bad = warp_min(bad);
  if (lane == 0) {
    s_amax[warp] = amax;
    s_bad[warp] = bad;
  }
  __syncthreads();
  for (int w = 0; w < kQWarps; ++w) {
    amax = fmaxf(amax, s_amax[w]);
    bad = lo(bad, s_bad[w]);
  }
  if (threadIdx.x == 0) status[row] = bad == kNoBad ? 0 : bad;
  if (bad != kNoBad) return;  // the whole block: bad is the same everywhere

  // The scale, by every thread (the same bits everywhere).
  float s, inv = 0.0f;
  if (kKind == QL__CUDA_QROWS_I8) {
    s = rnd_src(src, __fdiv_rn(amax, 127.5f));
    if (s < kI8Eps) s = kI8Eps;
    inv = __fdiv_rn(1.0f, s);
  } else {
    s = rnd_src(src, __fdiv_rn(fmaxf(amax, kF8AmaxLb), kE4m3Max));
    if (src == DT_F16 && s < kF8F16ScaleMin) s = kF8F16ScaleMin;
  }
  if (threadIdx.x == 0) sx[row] = s;

  const int64_t piece = gsum != nullptr ? gs : kQPiece;
  const int64_t pieces = (k + piece - 1) / piece;
  for (int64_t g = warp; g < pieces; g += kQWarps) {
    const int64_t k0 = g * piece, k1 = lo(k, k0 + piece);
    int sum = 0;
    for (int64_t i = k0 + lane; i < k1; i += 32) {
      if (kKind == QL__CUDA_QROWS_I8) {
        const float t = rintf(__fmul_rn(xr[i], inv));
        const int q = t <= -128.0f ? -128 : t >= 127.0f ? 127 : int(t);
        static_cast<int8_t*>(xq_)[row * ldxq + i] = int8_t(q);
        sum += q;
      } else {
        float t = __fdiv_rn(xr[i], s);
        t = t < -kE4m3Max ? -kE4m3Max : t > kE4m3Max ? kE4m3Max : t;
        static_cast<uint8_t*>(xq_)[row * ldxq + i] = f32_to_e4m3(t);
      }
    }
    if (gsum != nullptr) {
      sum = warp_isum(sum);  // exact: |sum| <= 128·2^24 (QL_QROWS_MAX_GROUP)
      if (lane == 0) gsum[row * pieces + g] = sum;
    }
  }
}

}  // namespace
}  // namespace ql_cuda

void ql__cuda_quantize_rows(int kind, int src, const float* x, int64_t m,
                            int64_t k, int64_t gs, void* xq, int64_t ldxq,
                            float* sx, int32_t* gsum, int64_t* status,
                            void* stream) {
  using namespace ql_cuda;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (kind == QL__CUDA_QROWS_I8)
    QL_LAUNCH(quantize_rows_kernel<QL__CUDA_QROWS_I8>, dim3(unsigned(m)),
              dim3(kQThreads), 0, st, src, x, k, gs, xq, ldxq, sx, gsum,
              status);
  else
    QL_LAUNCH(quantize_rows_kernel<QL__CUDA_QROWS_E4M3>, dim3(unsigned(m)),
              dim3(kQThreads), 0, st, src, x, k, gs, xq, ldxq, sx, gsum,
              status);
}
