// test_cuda_wo.cpp - the weight-only CUDA kernels of
// kernels/cuda/linear_wo.cu (the streaming one, on a persistent grid and on
// one block per row tile, its wide variant, and the legacy one), run on the CPU under
// kernels/cuda/emu.h, give the same bytes; so does the activation-quantized
// kernel of linear_aq.cu on its persistent grid and on one block per tile.
//
// Both promise one reduction order per output, fixed by (N, K, format):
// the same lanes, the same chunks in the same order, the same butterfly, the
// same split-K. So for every format (q4g at each group size, q8c, q8b with
// and without zero points, f8r, NaN codes included), activation dtype, and
// every batch size around the streaming kernel's instantiations (1, 2, 4, 8
// and 16 rows per block, and more rows than one block takes), the bytes of
// y must be equal, and a row's bytes must not change with its batch. The
// conformance harness checks the accuracy; this checks the kernels against
// each other where the harness's shapes are few (many rows, split K).
//
// Plain main(); one line per case group, exit status 1 on any failure.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common.cuh"
#include "ql_cuda.h"

static int g_fail;

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint32_t next() {
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return uint32_t(g_rng >> 16);
}
// uniform in [-1, 1)
static float unit() { return float(int32_t(next())) * 0x1p-31f; }

enum { Q4G = 1, Q8C = 2, Q8B = 3, F8R = 4 };

// Stores v in dtype dt as element i of p.
static void put(int dt, void* p, size_t i, float v) {
  ql_cuda::store_f32(dt, p, int64_t(i), v);
}

struct weight {
  ql__cuda_wo w;
  std::vector<unsigned char> q;
  std::vector<uint16_t> s16, z16;
  std::vector<float> s32, z32, bias;
};

// A random weight of the cuda-1 layout (ql_cuda.h): rows zero-padded to
// 16 bytes, a padding nibble 0.
static void make(weight* wt, int format, int64_t n, int64_t k, uint32_t gs,
                 bool zero, int sdt, bool bias) {
  ql__cuda_wo& w = wt->w;
  std::memset(&w, 0, sizeof w);
  w.format = format;
  w.sdt = sdt;
  w.n = n;
  w.k = k;
  w.gs = format == Q4G || format == Q8B ? gs : uint32_t(k);
  w.groups = (k + w.gs - 1) / w.gs;
  const int64_t rb = ql__cuda_row_bytes(format, k);
  w.ldq = (rb + 15) / 16 * 16;
  wt->q.assign(size_t(n * w.ldq) + 16, 0);
  // 16-byte aligned start inside the vector
  unsigned char* q0 = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(wt->q.data()) + 15) & ~uintptr_t(15));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t b = 0; b < rb; ++b) {
      uint32_t v = next() & 0xFFu;
      if (format == F8R && (v & 0x7Fu) == 0x7Fu) v ^= 1u;  // no NaN codes...
      if (format == Q4G && (k & 1) && b == rb - 1) v &= 0x0Fu;
      q0[r * w.ldq + b] = uint8_t(v);
    }
  if (format == F8R && n > 1)
    q0[1 * w.ldq + (rb - 1) / 2] = 0x7F;  // ...but one
  w.q = q0;
  const size_t ns = size_t(n * w.groups);
  wt->s16.assign(ns, 0);
  wt->z16.assign(ns, 0);
  wt->s32.assign(ns, 0);
  wt->z32.assign(ns, 0);
  void* sp = sdt == ql_cuda::DT_F32 ? static_cast<void*>(wt->s32.data())
                                    : static_cast<void*>(wt->s16.data());
  void* zp = sdt == ql_cuda::DT_F32 ? static_cast<void*>(wt->z32.data())
                                    : static_cast<void*>(wt->z16.data());
  for (size_t i = 0; i < ns; ++i) {
    put(sdt, sp, i, (1.5f + unit()) * 0.01f);
    put(sdt, zp, i, unit() * 0.1f);
  }
  w.scale = sp;
  w.zero = zero ? zp : nullptr;
  wt->bias.assign(size_t(n), 0.0f);
  for (auto& b : wt->bias) b = unit();
  w.bias = bias ? wt->bias.data() : nullptr;
}

// y of kernel for the m rows of x (dtype dt), as bytes, with the
// streaming kernel's grid sized for sms multiprocessors (0: one block per
// row tile, as on a device of unknown size).
static std::vector<unsigned char> run(const ql__cuda_wo& w0, int kernel,
                                      int dt, const void* x, int64_t m,
                                      int sms = 0) {
  ql__cuda_wo w = w0;
  w.sms = sms;
  const size_t esz = dt == ql_cuda::DT_F32 ? 4 : 2;
  std::vector<unsigned char> y(size_t(m * w.n) * esz, 0xAB);
  // Scratch as the backend's arena leaves it: whatever an earlier call
  // wrote, here NaN, so that a partial sum left unwritten shows.
  std::vector<float> part(
      ql__cuda_linear_wo_scratch(&w, m) / sizeof(float) + 1,
      __builtin_nanf(""));
  ql__cuda_linear_wo(&w, kernel, dt, x, m, y.data(), part.data(), nullptr);
  return y;
}

// Shapes: ragged K, one tile, two tiles (one x tile of small batches, two
// steps of loads), split K (N = 1, 40 at K = 5000: 2 splits; N = 3 at
// K = 8193: 4 splits of 3 tiles, the last one past K), and K = 9000
// unsplit (N = 1024), which a one-row batch stages in two x tiles.
struct shape {
  int64_t k, n;
};
static const shape g_shapes[] = {{16, 1},    {16, 40},   {77, 1},
                                 {77, 40},   {1056, 1},  {1056, 40},
                                 {5000, 1},  {5000, 40}, {9000, 1024},
                                 {8193, 3}};

static void one(const char* name, int format, uint32_t gs, bool zero) {
  static const int64_t ms[] = {1, 2, 3, 4, 7, 8, 9, 16, 17, 40};
  long cases = 0, bad = 0, badrow = 0;
  for (const shape& sh : g_shapes) {
    const int64_t k = sh.k, n = sh.n;
    for (int dt : {int(ql_cuda::DT_F32), int(ql_cuda::DT_BF16)}) {
      weight wt;
      const int sdt =
          dt == ql_cuda::DT_F32 ? ql_cuda::DT_BF16 : ql_cuda::DT_F16;
      make(&wt, format, n, k, gs, zero, sdt, (k & 1) != 0);
      const size_t esz = dt == ql_cuda::DT_F32 ? 4 : 2;
      std::vector<unsigned char> x(size_t(40 * k) * esz);
      for (size_t i = 0; i < size_t(40 * k); ++i) put(dt, x.data(), i, unit());
      for (int64_t m : ms) {
        if (n * k > 100000 && m > 2) break;  // emulated time
        ++cases;
        // Persistent grids of 1 and 2 blocks a row tile's worth of SMs
        // (one SM: a block walks every row tile of the weight).
        const int sms = int(1 + (cases % 3));
        auto a = run(wt.w, QL__CUDA_WO_SIMT, dt, x.data(), m, sms);
        auto b = run(wt.w, QL__CUDA_WO_LEGACY, dt, x.data(), m);
        auto c = run(wt.w, QL__CUDA_WO_TILED, dt, x.data(), m, 64);
        auto e = run(wt.w, QL__CUDA_WO_WIDE, dt, x.data(), m, sms);
        if (a != b || c != b || e != b) {
          if (bad++ == 0)
            std::printf("     first: %s K=%lld N=%lld M=%lld dt=%d differ\n",
                        name, (long long)k, (long long)n, (long long)m, dt);
        }
        // the last row alone: its bytes in the batch
        auto r = run(wt.w, QL__CUDA_WO_SIMT, dt,
                     x.data() + size_t((m - 1) * k) * esz, 1, 7);
        if (std::memcmp(r.data(), a.data() + size_t((m - 1) * n) * esz,
                        r.size()) != 0)
          ++badrow;
      }
    }
  }
  char what[160];
  std::snprintf(
      what, sizeof what,
      "%s: streaming kernel (persistent, tiled) = legacy kernel, bytes "
      "(%ld cases), a row alone = in its batch",
      name, cases);
  std::printf("%s %s\n", bad == 0 && badrow == 0 ? "ok  " : "FAIL", what);
  g_fail += bad != 0 || badrow != 0;
}

// y of the activation-quantized kernel (linear_aq.cu) for m rows of codes
// xq with row scales sx and group sums gsum, as bytes, on a grid sized for
// sms multiprocessors (0: one block per channel tile).
static std::vector<unsigned char> run_aq(const ql__cuda_wo& w0, int dt,
                                         const int8_t* xq, const float* sx,
                                         const int32_t* gsum, int64_t m,
                                         int sms) {
  ql__cuda_wo w = w0;
  w.sms = sms;
  const size_t esz = dt == ql_cuda::DT_F32 ? 4 : 2;
  std::vector<unsigned char> y(size_t(m * w.n) * esz, 0xAB);
  ql__cuda_linear_aq(&w, xq, sx, gsum, m, dt, y.data(), nullptr);
  return y;
}

// The AQ kernel's persistent grid (q8c: its blocks walk several channel
// tiles, the ring of codes running on across them) gives the bytes of one
// block per tile, for q4g and q8c, K inside one x window per warp and past it
// (restaged), tiles split unevenly among the blocks, and token tiles of
// one and two; and a row alone gives its bytes in the batch.
static void aq_grids(const char* name, int format, uint32_t gs) {
  static const shape shapes[] = {{77, 40}, {256, 100}, {1056, 520},
                                 {5000, 40}};
  static const int64_t ms[] = {1, 3, 9, 17};
  long cases = 0, bad = 0, badrow = 0;
  for (const shape& sh : shapes) {
    const int64_t k = sh.k, n = sh.n;
    weight wt;
    make(&wt, format, n, k, gs, format == Q4G, ql_cuda::DT_BF16, true);
    const int64_t groups = wt.w.groups;
    std::vector<int8_t> xq(size_t(17 * k));
    std::vector<float> sx(17);
    std::vector<int32_t> gsum(size_t(17 * groups), 0);
    for (int64_t r = 0; r < 17; ++r) {
      sx[size_t(r)] = (1.0f + unit()) * 0.01f;
      for (int64_t i = 0; i < k; ++i) {
        const int8_t v = int8_t(int(next() % 255) - 127);
        xq[size_t(r * k + i)] = v;
        gsum[size_t(r * groups + i / wt.w.gs)] += v;
      }
    }
    for (int64_t m : ms) {
      if (n * k > 100000 && m > 3) break;  // emulated time
      const int dt = m & 1 ? int(ql_cuda::DT_F32) : int(ql_cuda::DT_BF16);
      const size_t esz = dt == ql_cuda::DT_F32 ? 4 : 2;
      auto want = run_aq(wt.w, dt, xq.data(), sx.data(), gsum.data(), m, 0);
      for (int sms : {1, 2, 3}) {
        ++cases;
        auto got =
            run_aq(wt.w, dt, xq.data(), sx.data(), gsum.data(), m, sms);
        if (got != want && bad++ == 0)
          std::printf("     first: %s K=%lld N=%lld M=%lld sms=%d differ\n",
                      name, (long long)k, (long long)n, (long long)m, sms);
      }
      // the last row alone: its bytes in the batch
      auto r = run_aq(wt.w, dt, xq.data() + (m - 1) * k, sx.data() + m - 1,
                      gsum.data() + (m - 1) * groups, 1, 1);
      if (std::memcmp(r.data(), want.data() + size_t((m - 1) * n) * esz,
                      r.size()) != 0)
        ++badrow;
    }
  }
  char what[160];
  std::snprintf(what, sizeof what,
                "AQ %s: grids sized for 1, 2, 3 SMs = one block per tile, "
                "bytes (%ld cases), a row alone = in its batch",
                name, cases);
  std::printf("%s %s\n", bad == 0 && badrow == 0 ? "ok  " : "FAIL", what);
  g_fail += bad != 0 || badrow != 0;
}

// The tensor-core kernel (the default for q4g with f16/bf16 x where K and
// the group are multiples of 128): against x·dequant(W)ᵀ + b in double,
// within the rounding of y to its dtype plus an f32 accumulation bound;
// a row alone gives its bytes in any batch (M = 1, 8, 9, 16, 17, 33, 64:
// every NT and several passes) and on a misaligned x; one split of K and
// two (K = 2048 sized for 3 SMs), group lengths 128 and 256.
static void mma_kernel() {
  static const shape shapes[] = {{128, 1}, {128, 45}, {1024, 40}, {2048, 33}};
  static const int64_t ms[] = {1, 8, 9, 16, 17, 33, 64};
  long cases = 0, outputs = 0, bad = 0, badrow = 0, badmis = 0;
  double worst = 0.0;
  for (const shape& sh : shapes)
    for (int dt : {int(ql_cuda::DT_F16), int(ql_cuda::DT_BF16)})
      for (uint32_t gs : {128u, 256u}) {
        const int64_t k = sh.k, n = sh.n;
        if (gs > k) continue;
        const int sdt = ql_cuda::DT_F32;  // the kernel's (QL_CUDA_WIDE_SCALES)
        weight wt;
        make(&wt, Q4G, n, k, gs, true, sdt, (cases & 1) != 0);
        // x with one spare value in front, to run it misaligned too
        std::vector<uint16_t> xb(size_t(64 * k) + 8);
        uint16_t* x = xb.data() + 8;
        for (size_t i = 0; i < size_t(64 * k); ++i) put(dt, x, i, unit());
        const unsigned char* q = wt.w.q;
        for (int64_t m : ms) {
          if (n * k * m > 1500000) break;  // emulated time
          const int sms = cases % 2 ? 3 : 1;
          ++cases;
          auto y = run(wt.w, QL__CUDA_WO_STREAM, dt, x, m, sms);
          for (int64_t r = 0; r < m; ++r)
            for (int64_t c = 0; c < n; ++c) {
              double ref = wt.w.bias ? wt.w.bias[c] : 0.0, mag = 0.0;
              for (int64_t i = 0; i < k; ++i) {
                int v = (q[c * wt.w.ldq + i / 2] >> (4 * (i & 1))) & 15;
                v -= 16 * (v >= 8);
                const int64_t si = c * wt.w.groups + i / gs;
                const double sc = ql_cuda::load_f32(sdt, wt.w.scale, si);
                const double ze = ql_cuda::load_f32(sdt, wt.w.zero, si);
                const double xv = ql_cuda::load_f32(dt, x, r * k + i);
                ref += xv * (v * sc + ze);
                mag += std::fabs(xv) * (std::fabs(v * sc) + std::fabs(ze));
              }
              const double got = ql_cuda::load_f32(dt, y.data(), r * n + c);
              const double ulp = dt == ql_cuda::DT_BF16 ? 0x1p-8 : 0x1p-11;
              const double tol = ulp * std::fabs(ref) + 64 * 0x1p-24 * mag;
              const double err = std::fabs(got - ref);
              worst = std::max(worst, err / tol);
              if (!(err <= tol) && bad++ == 0)
                std::printf("     first: K=%lld N=%lld M=%lld dt=%d gs=%u "
                            "y[%lld,%lld] = %g, want %g\n",
                            (long long)k, (long long)n, (long long)m, dt, gs,
                            (long long)r, (long long)c, got, ref);
              ++outputs;
            }
          // the last row alone, aligned and not: its bytes in the batch
          const size_t esz = 2;
          auto one_row = run(wt.w, QL__CUDA_WO_STREAM, dt, x + (m - 1) * k, 1, sms);
          badrow += std::memcmp(one_row.data(), y.data() + size_t((m - 1) * n) * esz,
                                one_row.size()) != 0;
          std::memmove(xb.data() + 7, x, size_t(m * k) * 2);
          auto mis = run(wt.w, QL__CUDA_WO_STREAM, dt, xb.data() + 7, m, sms);
          std::memmove(x, xb.data() + 7, size_t(m * k) * 2);
          badmis += mis != y;
        }
      }
  char what[200];
  std::snprintf(what, sizeof what,
                "q4g tensor-core kernel: %ld outputs of %ld cases within the "
                "bound (worst %.2f of it), a row alone = in its batch, "
                "misaligned x = aligned", outputs, cases, worst);
  const bool ok = bad == 0 && badrow == 0 && badmis == 0 && outputs > 0;
  if (!ok)
    std::printf("     %ld outside, %ld rows differ alone, %ld misaligned differ\n",
                bad, badrow, badmis);
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  g_fail += !ok;
}

int main() {
  mma_kernel();
  aq_grids("q4g g32", Q4G, 32);
  aq_grids("q4g g128", Q4G, 128);
  aq_grids("q8c", Q8C, 0);
  one("q4g g32", Q4G, 32, true);
  one("q4g g64", Q4G, 64, true);
  one("q4g g128", Q4G, 128, true);
  one("q4g g256", Q4G, 256, true);
  one("q8c", Q8C, 0, false);
  one("q8b b32 sym", Q8B, 32, false);
  one("q8b b128 asym", Q8B, 128, true);
  one("q8b b256 asym", Q8B, 256, true);
  one("f8r (one NaN code)", F8R, 0, false);
  std::printf("%s\n", g_fail ? "FAILED" : "all passed");
  return g_fail ? 1 : 0;
}
