// test_cuda_emu.cpp - the CUDA emulation (kernels/cuda/emu.h) and the
// kernels' device helpers (kernels/cuda/common.cuh), on the CPU.
//
// The emulator is what makes `make check` run the CUDA kernels at all, so it
// is tested for what the kernels rely on: shuffle semantics, barriers in
// both thread orders (and that the reversed order does expose a missing
// barrier), the abort on a misaligned 128-bit load and on a deadlock, the
// fixed-order warp sum; and the device number conversions are compared with
// kernels/convert.c, whose bytes quantize_rows must reproduce.
//
// Plain main(); one line per check, exit status 1 on any failure.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common.cuh"
#include "ptx.h"
#include "ql_kernels.h"

static int g_fail;

static void check(bool ok, const char* what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  g_fail += !ok;
}

// ---------------------------------------------------------------- kernels

// out[t] = {xor 1, xor 16, down 3, broadcast of lane 5, width-8 xor 4}
__global__ void shuffles(int* out) {
  const int t = threadIdx.x, v = 100 + t;
  out[t * 5 + 0] = __shfl_xor_sync(0xffffffffu, v, 1);
  out[t * 5 + 1] = __shfl_xor_sync(0xffffffffu, v, 16);
  out[t * 5 + 2] = __shfl_down_sync(0xffffffffu, v, 3);
  out[t * 5 + 3] = __shfl_sync(0xffffffffu, v, 5);
  out[t * 5 + 4] = __shfl_xor_sync(0xffffffffu, v, 4, 8);
}

// out[t] = in[t - 1] through shared memory, with or without the barrier
template <bool kBarrier>
__global__ void neighbour(const int* in, int* out) {
  __shared__ int s[128];
  const int t = threadIdx.x;
  s[t] = in[t];
  if (kBarrier) __syncthreads();
  out[t] = t ? s[t - 1] : 0;
}

__global__ void load128(const unsigned char* p, unsigned* out) {
  uint4 v = ql_ld128(p);
  if (threadIdx.x == 0) *out = v.x;
}

// half the warp at a barrier, the other half in a shuffle: never completes
__global__ void deadlock(float* out) {
  float v = 1.0f;
  if (threadIdx.x < 16)
    __syncthreads();
  else
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}

__global__ void wsum(const float* in, float* out) {
  out[threadIdx.x] = ql_cuda::warp_sum(in[threadIdx.x]);
}

// One m16n8k32 int8 tile through ql_mma_m16n8k32_s8. Each lane packs its
// fragments with the PTX ISA's forward formulas (the row and column of its
// element i), independently of the inverse mapping inside the wrapper.
// A [16][32] row-major, Bt [8][32] (B column-major: Bt[n][k]), C, D [16][8].
__global__ void mma_tile(const int8_t* A, const int8_t* Bt, const int* C,
                         int* D) {
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  int c[4], d[4];
  for (int i = 0; i < 16; ++i) {
    const int row = (i < 4 || (i >= 8 && i < 12)) ? g : g + 8;
    const int col = 4 * t + (i & 3) + (i >= 8 ? 16 : 0);
    a[i / 4] |= uint32_t(uint8_t(A[row * 32 + col])) << (8 * (i % 4));
  }
  for (int i = 0; i < 8; ++i) {
    const int row = 4 * t + (i & 3) + (i >= 4 ? 16 : 0);
    b[i / 4] |= uint32_t(uint8_t(Bt[g * 32 + row])) << (8 * (i % 4));
  }
  for (int i = 0; i < 4; ++i) c[i] = C[(g + 8 * (i >= 2)) * 8 + 2 * t + (i & 1)];
  ql_mma_m16n8k32_s8(d, a, b, c);
  for (int i = 0; i < 4; ++i) D[(g + 8 * (i >= 2)) * 8 + 2 * t + (i & 1)] = d[i];
}

// One m16n8k16 f16 or bf16 tile through ql_mma_m16n8k16, the fragments
// packed with the PTX ISA's forward formulas (element i of each fragment:
// its row and column), independently of the wrapper's inverse mapping.
// A [16][16], Bt [8][16] (B column-major), C, D [16][8]; A and B as bits.
template <bool BF>
__global__ void mma16_tile(const uint16_t* A, const uint16_t* Bt,
                           const float* C, float* D) {
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  float c[4], d[4];
  for (int i = 0; i < 8; ++i) {
    const int row = (i == 0 || i == 1 || i == 4 || i == 5) ? g : g + 8;
    const int col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
    a[i / 2] |= uint32_t(A[row * 16 + col]) << (16 * (i % 2));
  }
  for (int i = 0; i < 4; ++i) {
    const int row = 2 * t + (i & 1) + (i >= 2 ? 8 : 0);
    b[i / 2] |= uint32_t(Bt[g * 16 + row]) << (16 * (i % 2));
  }
  for (int i = 0; i < 4; ++i) c[i] = C[(g + 8 * (i >= 2)) * 8 + 2 * t + (i & 1)];
  ql_ptx::ql_mma_m16n8k16<BF>(d, a, b, c);
  for (int i = 0; i < 4; ++i) D[(g + 8 * (i >= 2)) * 8 + 2 * t + (i & 1)] = d[i];
}

// ------------------------------------------------------------------ tests

static void test_shuffles() {
  std::vector<int> out(64 * 5, -1);
  QL_LAUNCH(shuffles, dim3(1), dim3(64), 0, nullptr, out.data());
  bool ok = true;
  for (int t = 0; t < 64; ++t) {
    const int l = t % 32, base = 100 + t - l;
    ok &= out[t * 5 + 0] == base + (l ^ 1);
    ok &= out[t * 5 + 1] == base + (l ^ 16);
    ok &= out[t * 5 + 2] == base + (l + 3 < 32 ? l + 3 : l);  // own value past the end
    ok &= out[t * 5 + 3] == base + 5;
    ok &= out[t * 5 + 4] == base + (l ^ 4);
  }
  check(ok, "shuffles: xor, down (own value past the warp), broadcast, width 8; two warps");
}

static bool run_neighbour(bool barrier, bool reverse) {
  std::vector<int> in(128), out(128, -1);
  for (int i = 0; i < 128; ++i) in[i] = 1000 + i;
  setenv("QL_EMU_REVERSE", reverse ? "1" : "0", 1);
  if (barrier)
    QL_LAUNCH(neighbour<true>, dim3(1), dim3(128), 0, nullptr, in.data(), out.data());
  else
    QL_LAUNCH(neighbour<false>, dim3(1), dim3(128), 0, nullptr, in.data(), out.data());
  unsetenv("QL_EMU_REVERSE");
  bool ok = out[0] == 0;
  for (int i = 1; i < 128; ++i) ok &= out[i] == in[i - 1];
  return ok;
}

static void test_barriers() {
  check(run_neighbour(true, false), "barrier: neighbour exchange, forward order");
  check(run_neighbour(true, true), "barrier: neighbour exchange, reversed order");
  // Without the barrier the result is wrong in at least one order: the
  // reversed order runs each reader before its writer. This is what makes
  // the reversed run of the conformance harness worth having.
  check(!run_neighbour(false, true),
        "no barrier: reversed order gives a wrong result (the race is exposed)");
}

// Runs f in a child process; true when it died of SIGABRT with the
// emulator's message on stderr (sent to /dev/null here).
template <class F>
static bool aborts(F f) {
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    if (freopen("/dev/null", "w", stderr) == nullptr) _exit(3);
    f();
    _exit(0);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) < 0) return false;
  return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}

static void test_aborts() {
  alignas(16) static unsigned char buf[64];
  for (int i = 0; i < 64; ++i) buf[i] = (unsigned char)i;
  unsigned x = 0;
  QL_LAUNCH(load128, dim3(1), dim3(32), 0, nullptr, buf + 16, &x);
  check(x == 0x13121110u, "ql_ld128: an aligned load reads its 16 bytes");
  for (int off : {1, 4, 8}) {
    char what[96];
    std::snprintf(what, sizeof what, "ql_ld128: a load at 16n+%d aborts", off);
    check(aborts([&] {
            unsigned y;
            QL_LAUNCH(load128, dim3(1), dim3(32), 0, nullptr, buf + 16 + off, &y);
          }),
          what);
  }
  check(aborts([] {
          float o[32];
          QL_LAUNCH(deadlock, dim3(1), dim3(32), 0, nullptr, o);
        }),
        "a divergent barrier/shuffle deadlock aborts");
}

static void test_warp_sum() {
  float in[32], out[32], h[32];
  for (int i = 0; i < 32; ++i) in[i] = std::ldexp(1.0f + float(i) / 7.0f, (i * 5) % 23 - 11);
  for (int rev = 0; rev < 2; ++rev) {
    setenv("QL_EMU_REVERSE", rev ? "1" : "0", 1);
    QL_LAUNCH(wsum, dim3(1), dim3(32), 0, nullptr, in, out);
    unsetenv("QL_EMU_REVERSE");
    // the butterfly on the host: h[l] += h[l ^ o] for o = 16, 8, 4, 2, 1
    std::memcpy(h, in, sizeof h);
    for (int o = 16; o > 0; o >>= 1) {
      float t[32];
      for (int l = 0; l < 32; ++l) t[l] = h[l] + h[l ^ o];
      std::memcpy(h, t, sizeof h);
    }
    bool ok = true;
    for (int l = 0; l < 32; ++l) ok &= std::memcmp(&out[l], &h[0], 4) == 0;
    check(ok, rev ? "warp_sum: the fixed butterfly, same bits in every lane (reversed)"
                  : "warp_sum: the fixed butterfly, same bits in every lane");
  }
}

static uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

static void test_conversions() {
  using namespace ql_cuda;
  long bad16 = 0, badbf = 0, bad8 = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    bad16 += bits(f16_to_f32(h)) != bits(ql_f16_to_f32(uint16_t(h)));
    badbf += bits(bf16_to_f32(h)) != bits(ql_bf16_to_f32(uint16_t(h)));
  }
  for (uint32_t c = 0; c < 256; ++c)
    bad8 += bits(e4m3_to_f32(c)) != bits(ql_e4m3_to_f32(uint8_t(c)));
  check(bad16 == 0 && badbf == 0 && bad8 == 0,
        "widening f16, bf16 (all 65536) and e4m3 (all 256): the bits of convert.c");

  // Narrowing: every 4099th f32 pattern (all exponents, both signs, NaNs)
  // plus every pattern within 2^12 of each rounding boundary region's
  // edges for the three formats.
  long n = 0, bad = 0;
  auto one = [&](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    ++n;
    bad += f32_to_f16(f) != ql_f32_to_f16(f);
    bad += f32_to_bf16(f) != ql_f32_to_bf16(f);
    bad += f32_to_e4m3(f) != ql_f32_to_e4m3(f);
  };
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 4099) one(uint32_t(u));
  static const uint32_t edges[] = {0x477FF000u, 0x38800000u, 0x33000000u,
                                   0x43E00000u, 0x3C800000u, 0x3A800000u,
                                   0x7F800000u, 0x00000000u, 0x3F800000u};
  for (uint32_t e : edges)
    for (uint32_t d = 0; d < 8192; ++d) {
      one(e - 4096 + d);
      one((e - 4096 + d) | 0x80000000u);
    }
  char what[120];
  std::snprintf(what, sizeof what,
                "narrowing to f16, bf16, e4m3: the bytes of convert.c (%ld values)", n);
  check(bad == 0, what);
}

// __byte_perm against its definition in the CUDA Math API, on the
// selectors that the kernels use and a few others.
static void test_byte_perm() {
  const unsigned x = 0x33221100u, y = 0x77665544u;
  bool ok = __byte_perm(x, y, 0x3210u) == x && __byte_perm(x, y, 0x7654u) == y &&
            __byte_perm(x, y, 0x0123u) == 0x00112233u &&
            __byte_perm(0x0000AB00u, 0x4B000000u, 0x7441u) == 0x4B0000ABu &&
            __byte_perm(0xCD000000u, 0u, 0x3444u) == 0xCD000000u &&
            __byte_perm(x, y, 0x7061u) == 0x77006611u;
  check(ok, "__byte_perm: the bytes of {y, x} that each selector nibble names");
}

static void test_mma() {
  int8_t A[16 * 32], Bt[8 * 32];
  int C[16 * 8], D[16 * 8];
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  auto next = [&] {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
  };
  long bad = 0, cases = 0;
  // 0..5: random tiles; 6: every A and B value -128 (the largest product,
  // 2^14, summed 32 times); 7: +127 against -128.
  for (int rep = 0; rep < 8; ++rep)
    for (int rev = 0; rev < 2; ++rev) {
      for (int i = 0; i < 16 * 32; ++i)
        A[i] = rep == 6 || rep == 7 ? (rep == 6 ? -128 : 127) : int8_t(next());
      for (int i = 0; i < 8 * 32; ++i) Bt[i] = rep >= 6 ? -128 : int8_t(next());
      for (int i = 0; i < 16 * 8; ++i) C[i] = int(next() % 2000001) - 1000000;
      setenv("QL_EMU_REVERSE", rev ? "1" : "0", 1);
      QL_LAUNCH(mma_tile, dim3(1), dim3(32), 0, nullptr, A, Bt, C, D);
      unsetenv("QL_EMU_REVERSE");
      for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 8; ++n) {
          long want = C[m * 8 + n];
          for (int k = 0; k < 32; ++k) want += long(A[m * 32 + k]) * Bt[n * 32 + k];
          bad += D[m * 8 + n] != want;
          ++cases;
        }
    }
  char what[120];
  std::snprintf(what, sizeof what,
                "mma.sync m16n8k32 s8 (emulated): D = C + A*B for %ld outputs, "
                "both orders, -128 extremes", cases);
  check(bad == 0, what);
}

// m16n8k16 with f32 accumulation, f16 and bf16: random small integers
// times powers of two (so that every product and every partial sum is
// exact in f32, and any order of the hardware's sum gives the same bits),
// against the same sum in double; both thread orders.
template <bool BF>
static long mma16_bad(long* cases) {
  uint16_t A[16 * 16], Bt[8 * 16];
  float C[16 * 8], D[16 * 8];
  uint64_t rng = BF ? 0x2545F4914F6CDD1Dull : 0x9E3779B97F4A7C15ull;
  auto next = [&] {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
  };
  auto enc = [](double v) {
    return BF ? ql_ptx::bf16_rn(v) : ql_ptx::f16_rn(v);
  };
  long bad = 0;
  for (int rep = 0; rep < 6; ++rep)
    for (int rev = 0; rev < 2; ++rev) {
      double av[16 * 16], bv[8 * 16];
      for (int i = 0; i < 256; ++i) {
        av[i] = std::ldexp(double(int(next() % 31) - 15), int(next() % 5) - 2);
        A[i] = enc(av[i]);
      }
      for (int i = 0; i < 128; ++i) {
        bv[i] = std::ldexp(double(int(next() % 255) - 127), -int(next() % 4));
        Bt[i] = enc(bv[i]);
      }
      for (int i = 0; i < 128; ++i) C[i] = float(int(next() % 2001) - 1000) / 4;
      setenv("QL_EMU_REVERSE", rev ? "1" : "0", 1);
      QL_LAUNCH(mma16_tile<BF>, dim3(1), dim3(32), 0, nullptr, A, Bt, C, D);
      unsetenv("QL_EMU_REVERSE");
      for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 8; ++n) {
          double want = C[m * 8 + n];
          for (int k = 0; k < 16; ++k) want += av[m * 16 + k] * bv[n * 16 + k];
          bad += D[m * 8 + n] != float(want);
          ++*cases;
        }
    }
  return bad;
}

static void test_mma16() {
  long cases = 0;
  long bad = mma16_bad<false>(&cases);
  char what[120];
  std::snprintf(what, sizeof what,
                "mma.sync m16n8k16 f16 -> f32 (emulated): D = C + A*B for %ld "
                "outputs, both orders", cases);
  check(bad == 0, what);
  cases = 0;
  bad = mma16_bad<true>(&cases);
  std::snprintf(what, sizeof what,
                "mma.sync m16n8k16 bf16 -> f32 (emulated): D = C + A*B for %ld "
                "outputs, both orders", cases);
  check(bad == 0, what);
}

// The 16-bit roundings against the f32 -> f16 / bf16 conversions of the
// device helpers (common.cuh, themselves checked against convert.c below)
// on f32 values of every kind, and the ties and edges by hand.
static void test_half_rounding() {
  uint64_t rng = 0x853C49E6748FEA9Bull;
  long bad = 0;
  for (int i = 0; i < 200000; ++i) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    uint32_t u = uint32_t(rng);
    if (i % 4 == 0) u = (u & 0x8000FFFFu) | (uint32_t(100 + i % 60) << 23);
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    bad += ql_ptx::f16_rn(f) != ql_cuda::f32_to_f16(f);
    bad += ql_ptx::bf16_rn(f) != ql_cuda::f32_to_bf16(f);
    bad += std::isfinite(f) && ql_ptx::f16_value(ql_ptx::f16_rn(f)) !=
                                   double(ql_cuda::f16_to_f32(ql_cuda::f32_to_f16(f)));
  }
  check(bad == 0, "f16/bf16 rounding of the emulation = the device helpers' on 200000 f32 values");
  const bool edges =
      ql_ptx::f16_rn(1024.5) == 0x6400 && ql_ptx::f16_rn(1025.5) == 0x6402 &&
      ql_ptx::f16_rn(65519.99) == 0x7BFF && ql_ptx::f16_rn(65520.0) == 0x7C00 &&
      ql_ptx::f16_rn(std::ldexp(1.0, -25)) == 0x0000 &&
      ql_ptx::f16_rn(std::ldexp(3.0, -26)) == 0x0001 &&
      ql_ptx::f16_rn(-std::ldexp(1023.0, -24)) == 0x83FF &&
      ql_ptx::bf16_rn(128.5) == 0x4300 && ql_ptx::bf16_rn(129.5) == 0x4302 &&
      ql_ptx::bf16_rn(-136.0) == 0xC308 && ql_ptx::bf16_value(0x3F80) == 1.0 &&
      ql_ptx::f16_value(0xE408) == -1032.0 && ql_ptx::f16_value(0x2C00) == 0.0625;
  check(edges, "f16/bf16 rounding: ties to even, the largest finite, overflow, subnormals");
}

// lop3 against boolean expressions of its three inputs, and fma2 on the
// conversions of int4 codes: nibble u (its two's complement sign bit
// flipped) into the mantissa of 1024 (f16) or 128 (bf16) and back to
// u - 8, as the tensor-core kernel does, and from the high nibble of f16
// with a multiplier of 1/16 (an fma2 that scales too).
static void test_lop3_fma2() {
  uint64_t rng = 0xDA3E39CB94B95BDBull;
  bool ok = true;
  for (int i = 0; i < 1000; ++i) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    const uint32_t a = uint32_t(rng), b = uint32_t(rng >> 32),
                   c = uint32_t(rng >> 16) * 2654435761u;
    ok &= ql_ptx::ql_lop3<0xF0>(a, b, c) == a;
    ok &= ql_ptx::ql_lop3<0x96>(a, b, c) == (a ^ b ^ c);
    ok &= ql_ptx::ql_lop3<0xEA>(a, b, c) == ((a & b) | c);
    ok &= ql_ptx::ql_lop3<0x6A>(a, b, c) == ((b & (a ^ c)) | (~b & c));
  }
  check(ok, "lop3: the LUT of a, a^b^c, (a&b)|c and b?(a^c):c");
  bool conv = true;
  for (uint32_t n = 0; n < 16; ++n) {
    const int q = int(n) - 16 * int(n >= 8);  // the code's value
    const uint32_t w = n | (((n + 5) & 15) << 16);
    const int q2 = int((n + 5) & 15) - 16 * int(((n + 5) & 15) >= 8);
    const uint32_t h = ql_ptx::ql_lop3<0x6A>(w, 0x000F000Fu, 0x64086408u);
    const uint32_t f = ql_ptx::ql_fma2<false>(h, 0x3C003C00u, 0xE408E408u);
    conv &= ql_ptx::half_of<false>(f, 0) == q && ql_ptx::half_of<false>(f, 1) == q2;
    const uint32_t hh = ql_ptx::ql_lop3<0x6A>(w << 4, 0x00F000F0u, 0x64806480u);
    const uint32_t ff = ql_ptx::ql_fma2<false>(hh, 0x2C002C00u, 0xD480D480u);
    conv &= ql_ptx::half_of<false>(ff, 0) == q && ql_ptx::half_of<false>(ff, 1) == q2;
    const uint32_t hb = ql_ptx::ql_lop3<0x6A>(w, 0x000F000Fu, 0x43084308u);
    const uint32_t fb = ql_ptx::ql_fma2<true>(hb, 0x3F803F80u, 0xC308C308u);
    conv &= ql_ptx::half_of<true>(fb, 0) == q && ql_ptx::half_of<true>(fb, 1) == q2;
  }
  check(conv, "lop3 + fma2: every int4 code to its value in f16 (both nibble places) and bf16");
}

int main() {
  test_byte_perm();
  test_mma();
  test_mma16();
  test_half_rounding();
  test_lop3_fma2();
  test_shuffles();
  test_barriers();
  test_aborts();
  test_warp_sum();
  test_conversions();
  std::printf("%s\n", g_fail ? "FAILED" : "all passed");
  return g_fail ? 1 : 0;
}
