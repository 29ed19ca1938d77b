// fp8_probe.cpp - measures how cuBLASLt's FP8 GEMM (e4m3 x e4m3, f32
// accumulation: the product f8r activation-quantized linear runs on,
// kernels/cuda/blaslt.h) really sums its products, so that the f8r error
// bound of DESIGN §4 and the emulated cuBLASLt (emu_blaslt.h,
// QL_EMU_FP8_ACC_BITS) can follow the hardware.
//
// It goes through the backend's own cuBLASLt layer (blaslt.cpp: the same
// dlopen() of libcublasLt.so.13, the same descriptors and the same
// algorithm choice per (N, K)), with crafted codes whose exact sums are
// known. Output element (t, t) of each GEMM is one test: token row t and
// weight row t hold its products p_k = x[t,k]·w[t,k] (the other elements
// are not read), and the element's exact value is computed here. With E the exponent of the largest term:
//  - bits: p_0 = 2^E, p_1 = ±2^(E-d), d = 1..26, in one block of products:
//    B = the first d whose small term is lost (the significant bits the
//    sum keeps; exact f32 sums give 24). Also how a lost term rounds: a
//    negative one (floor: the result drops by one unit of 2^(E+1-B)) and
//    0.75 of a unit (nearest: rounds up), and whether 31 small terms that
//    each fall below the unit but not together are lost one by one
//    (each addend truncated after alignment) or add up;
//  - block: p_0 = 2^E, p_1 = -2^E, p_t = 2^(E-B-2): the small term
//    survives only when it is aligned in a later MMA than the two that
//    cancel; the first such t is the K-block (the MMA's K);
//  - promotion: p_0 = 2^E, p_t = 2^(E-B-2): the small term survives only
//    when the partial sum was promoted to f32 (and restarted) between 0
//    and t; the first such t is the promotion interval P; checked again
//    from a second interval;
//  - random: rows like quantized activations and weights (e4m3 codes of
//    Gaussian values), the largest |y - exact| / Σ|p| against the error
//    bound the measured (B, block, P) give (tests/common/fp8_bound.h; in
//    units of the bound, <= 1 means the model holds).
// Each in three settings: fast accumulation off (the backend's default)
// and on (CUBLASLT_MATMUL_DESC_FAST_ACCUM), f32 output; and bf16 output
// (a control: the bits a 16-bit output would keep). It ends with one line
// per setting: "fp8_probe: <setting>: accumulator keeps B bits within a
// K-block of Kb; promotes every P elements" (or "exact f32 accumulation").
//
// GPU build (configure --with-cuda): tests/bench/fp8-probe, the real
// runtime and libcublasLt.so.13 found by the dynamic linker
// (LD_LIBRARY_PATH); a few dozen tiny GEMMs, well under 10 s. Emulated
// build: tests/bench/fp8-probe-emu on emu_blaslt.cpp, which reports exact
// f32 sums, or its model with QL_EMU_FP8_ACC_BITS (test_fp8_probe.sh).
// Exit status 0 when every GEMM ran, 1 otherwise.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "blaslt.h"
#include "fp8_bound.h"

#ifdef QL_CUDA_EMU
#include "emu_runtime.h"
#else
#include <cuda_runtime_api.h>
#endif

namespace {

constexpr int kE = 14;        // exponent of the large term
constexpr int kMaxD = 26;     // 2^(14-26) = 2^-12 = 2^-6·2^-6, normal codes
constexpr int64_t kMaxK = 2048;

// The e4m3 code of ±2^e·(1 + f/8), e in [-6, 8] (normal), f in [0, 7].
uint8_t code(int e, int f = 0, bool neg = false) {
  return uint8_t((neg ? 0x80 : 0) | ((e + 7) << 3) | f);
}

double decode(uint8_t c) {
  const int e = (c >> 3) & 0xF, m = c & 7;
  double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
  return (c & 0x80) ? -v : v;
}

// One test: its products as (k, x code, w code).
struct term {
  int64_t k;
  uint8_t x, w;
};
struct test {
  std::vector<term> t;
  // The term p = s·2^e·(1 + f/8) at k (e in [-12, 16]): x = 2^(e/2),
  // w = the rest.
  void add(int64_t k, int e, int f = 0, bool neg = false) {
    const int ex = e >= 0 ? e / 2 : -((-e + 1) / 2);
    t.push_back({k, code(ex), code(e - ex, f, neg)});
  }
  double exact() const {
    double s = 0;  // exact: few terms, all within 2^40 of each other
    for (const term& u : t) s += decode(u.x) * decode(u.w);
    return s;
  }
};

struct setting {
  const char* name;
  int flags;
};

struct gpu {
  ql__blaslt* lt = nullptr;
  int failures = 0;
};

// Runs tests (one per output diagonal element) in one GEMM of K = k;
// out[t] = the element (t, t) as f32. False on a failure (reported).
bool run(gpu* g, const setting& s, int64_t k, const std::vector<test>& tests,
         std::vector<double>* out, bool print_algo) {
  const int64_t n = (int64_t(tests.size()) + 15) / 16 * 16, m = n;
  const bool bf16 = (s.flags & QL__BLASLT_OUT_BF16) != 0;
  const size_t esz = bf16 ? 2 : 4;
  std::vector<uint8_t> w(size_t(n * k), 0), x(size_t(m * k), 0);
  for (size_t i = 0; i < tests.size(); i++)
    for (const term& u : tests[i].t) {
      x[i * size_t(k) + size_t(u.k)] = u.x;
      w[i * size_t(k) + size_t(u.k)] = u.w;
    }
  void *dw = nullptr, *dx = nullptr, *dacc = nullptr;
  std::vector<uint8_t> acc(size_t(m * n) * esz);
  int rc = -1;
  if (cudaMalloc(&dw, w.size()) == cudaSuccess &&
      cudaMalloc(&dx, x.size()) == cudaSuccess &&
      cudaMalloc(&dacc, acc.size()) == cudaSuccess &&
      cudaMemcpy(dw, w.data(), w.size(), cudaMemcpyHostToDevice) ==
          cudaSuccess &&
      cudaMemcpy(dx, x.data(), x.size(), cudaMemcpyHostToDevice) ==
          cudaSuccess) {
    rc = ql__blaslt_gemm_ex(g->lt, QL__BLASLT_E4M3, s.flags, n, m, k, dw, k,
                            dx, k, dacc, n, nullptr);
    if (rc == 0 && (cudaDeviceSynchronize() != cudaSuccess ||
                    cudaMemcpy(acc.data(), dacc, acc.size(),
                               cudaMemcpyDeviceToHost) != cudaSuccess))
      rc = -2;
  }
  if (print_algo && rc == 0) {
    char name[128];
    if (ql__blaslt_algo_name(g->lt, QL__BLASLT_E4M3, s.flags, n, k, name,
                             sizeof name) == 0)
      printf("  %s: N=%lld K=%lld: %s\n", s.name, (long long)n, (long long)k,
             name);
  }
  cudaFree(dw);
  cudaFree(dx);
  cudaFree(dacc);
  if (rc != 0) {
    printf("  %s: N=%lld K=%lld: GEMM failed (%d: %s)\n", s.name,
           (long long)n, (long long)k, rc,
           rc == -2 ? cudaGetErrorString(cudaGetLastError()) : "ql code");
    g->failures++;
    return false;
  }
  out->resize(tests.size());
  for (size_t i = 0; i < tests.size(); i++) {
    const size_t at = (i * size_t(n) + i) * esz;
    if (bf16) {
      uint16_t h;
      memcpy(&h, &acc[at], 2);
      uint32_t u = uint32_t(h) << 16;
      float f;
      memcpy(&f, &u, 4);
      (*out)[i] = f;
    } else {
      float f;
      memcpy(&f, &acc[at], 4);
      (*out)[i] = f;
    }
  }
  return true;
}

// What one setting measured.
struct result {
  bool ok = false;
  int bits = 0;           // B: first lost d (25+: none lost up to kMaxD)
  const char* rounding = "?";
  int each = -1;          // 1: addends truncated one by one; 0: summed; -1: n/a
  int64_t block = 0;      // K-block; 0: none seen (the term never lost)
  int64_t promote = 0;    // P; -1: no promotion up to kMaxK; 0: n/a
  bool periodic = false;  // promotion seen again from the second interval
  double worst = 0;       // random: largest error / model bound
};

void measure(gpu* g, const setting& s, result* r) {
  std::vector<double> y;
  const double big = ldexp(1.0, kE);

  // ---- bits within one block
  std::vector<test> tb;
  for (int d = 1; d <= kMaxD; d++) {
    test t;
    t.add(0, kE);
    t.add(1, kE - d);
    tb.push_back(t);
  }
  if (!run(g, s, 32, tb, &y, true)) return;
  r->bits = kMaxD + 1;
  printf("  %s: bits: d = 1..%d kept: ", s.name, kMaxD);
  for (int d = 1; d <= kMaxD; d++) {
    const bool kept = y[size_t(d - 1)] == tb[size_t(d - 1)].exact();
    putchar(kept ? '1' : '0');
    if (!kept && r->bits > kMaxD) r->bits = d;
  }
  printf("  -> B = %d\n", r->bits);
  const int B = r->bits;
  if (B >= 24 || (s.flags & QL__BLASLT_OUT_BF16)) {
    // f32 sums keep 24 bits (rounding to nearest): nothing to tell apart
    // from exact f32 accumulation below. A bf16 output is only the
    // control of the bits it keeps.
    r->rounding = "n/a";
    r->ok = true;
    return;
  }
  const double unit = ldexp(1.0, kE + 1 - B);

  // ---- how lost terms round, and whether addends are truncated one by one
  std::vector<test> tr(3);
  tr[0].add(0, kE);
  tr[0].add(1, kE - B, 0, true);  // -unit/2
  tr[1].add(0, kE);
  tr[1].add(1, kE - B, 4);        // 0.75 unit
  tr[2].add(0, kE);
  for (int i = 1; i < 32; i++) tr[2].add(i, kE - B - 2);  // 31·unit/8
  if (!run(g, s, 32, tr, &y, false)) return;
  const bool floor_neg = y[0] == big - unit, zero_neg = y[0] == big;
  const bool up = y[1] == big + unit;
  r->rounding = floor_neg && !up   ? "truncation toward -inf (floor)"
                : zero_neg && !up  ? "truncation toward zero"
                : zero_neg && up   ? "round to nearest"
                                   : "unclear";
  r->each = y[2] == big ? 1 : 0;
  printf("  %s: 2^%d - unit/2 -> %+.3g unit, 2^%d + 0.75 unit -> %+.3g "
         "unit: %s\n",
         s.name, kE, (y[0] - big) / unit, kE, (y[1] - big) / unit,
         r->rounding);
  printf("  %s: 2^%d + 31 terms of unit/8 -> %+.4g unit (exact %+.4g): %s\n",
         s.name, kE, (y[2] - big) / unit, 31.0 / 8,
         r->each ? "each addend truncated after alignment"
                 : "small terms summed before truncation");

  // ---- the K-block: 2^E - 2^E at k = 0, 1, the small term at k = t
  std::vector<test> tk;
  std::vector<int64_t> at;
  for (int64_t t = 2; t <= 256; t++) {
    test u;
    u.add(0, kE);
    u.add(1, kE, 0, true);
    u.add(t, kE - B - 2);
    tk.push_back(u);
    at.push_back(t);
  }
  if (!run(g, s, 272, tk, &y, true)) return;
  for (size_t i = 0; i < tk.size() && r->block == 0; i++)
    if (y[i] == tk[i].exact()) r->block = at[i];
  printf("  %s: block: small term after a cancelling pair first kept at "
         "k = %lld\n",
         s.name, (long long)r->block);

  // ---- promotion: 2^E at k = 0, the small term at k = t (multiples of 16)
  std::vector<test> tp;
  at.clear();
  for (int64_t t = 16; t < kMaxK; t += 16) {
    test u;
    u.add(0, kE);
    u.add(t, kE - B - 2);
    tp.push_back(u);
    at.push_back(t);
  }
  if (!run(g, s, kMaxK, tp, &y, true)) return;
  r->promote = -1;
  for (size_t i = 0; i < tp.size() && r->promote < 0; i++)
    if (y[i] == tp[i].exact()) r->promote = at[i];
  printf("  %s: promotion: small term after 2^%d first kept at k = %lld\n",
         s.name, kE, (long long)r->promote);
  if (r->promote > 0 && 3 * r->promote <= kMaxK) {
    // From the second interval: lost just before the third, kept in it.
    const int64_t p = r->promote;
    std::vector<test> t2(2);
    t2[0].add(p, kE);
    t2[0].add(2 * p - 16, kE - B - 2);
    t2[1].add(p, kE);
    t2[1].add(2 * p, kE - B - 2);
    if (!run(g, s, kMaxK, t2, &y, false)) return;
    r->periodic = y[0] != t2[0].exact() && y[1] == t2[1].exact();
    printf("  %s: promotion again at k = %lld: %s\n", s.name,
           (long long)(2 * p), r->periodic ? "yes" : "no");
  }
  r->ok = true;
}

uint64_t g_seed = 0x9E3779B97F4A7C15ull;
double gauss() {
  auto uni = [] {
    g_seed ^= g_seed << 13;
    g_seed ^= g_seed >> 7;
    g_seed ^= g_seed << 17;
    return (double((g_seed >> 11) + 1)) * 0x1p-53;
  };
  return sqrt(-2 * log(uni())) * cos(6.283185307179586 * uni());
}

// The e4m3 code nearest to v (|v| <= 448), ties to even.
uint8_t to_e4m3(double v) {
  uint8_t best = 0;
  double bd = INFINITY;
  for (int c = 0; c < 256; c++) {
    if ((c & 0x7F) == 0x7F) continue;
    const double d = fabs(decode(uint8_t(c)) - v);
    if (d < bd || (d == bd && (c & 1) == 0)) {
      bd = d;
      best = uint8_t(c);
    }
  }
  return best;
}

// Random rows (Gaussian, scaled to amax 448 per row as f8r does) at a few
// K: the largest error against the model's bound.
void random_check(gpu* g, const setting& s, result* r) {
  static const int64_t ks[] = {16, 32, 112, 128, 256, 1024, 2048};
  const int B = r->bits > 24 ? 24 : r->bits;
  const int64_t blk = r->block > 0 ? r->block : 1;
  const int64_t P = r->promote;  // -1: never, 0 (exact): irrelevant
  for (int64_t k : ks) {
    std::vector<test> tt(16);  // N = 16, as a harness case of N <= 16
    for (test& t : tt) {
      const size_t kz = static_cast<size_t>(k);
      std::vector<double> a(kz), b(kz);
      double ma = 0, mb = 0;
      for (int64_t i = 0; i < k; i++) {
        a[size_t(i)] = gauss();
        b[size_t(i)] = gauss();
        ma = fmax(ma, fabs(a[size_t(i)]));
        mb = fmax(mb, fabs(b[size_t(i)]));
      }
      for (int64_t i = 0; i < k; i++)
        t.t.push_back({i, to_e4m3(a[size_t(i)] * 448 / ma),
                       to_e4m3(b[size_t(i)] * 448 / mb)});
    }
    std::vector<double> y;
    if (!run(g, s, k, tt, &y, true)) return;
    double worst_rel = 0, worst = 0;
    for (size_t i = 0; i < tt.size(); i++) {
      std::vector<double> p;
      double mag = 0, ex = 0;
      for (const term& u : tt[i].t) {
        p.push_back(decode(u.x) * decode(u.w));
        mag += fabs(p.back());
        ex += p.back();  // exact: e4m3 products are multiples of 2^-18
      }
      const double err = fabs(y[i] - ex);
      worst_rel = fmax(worst_rel, mag > 0 ? err / mag : 0);
      const double bd =
          ql_fp8_acc_bound(p.data(), int64_t(p.size()), B, blk, P);
      worst = fmax(worst, bd > 0 ? err / bd : (err > 0 ? INFINITY : 0));
    }
    r->worst = fmax(r->worst, worst);
    printf("  %s: random K=%-5lld max |err|/sum|p| = %.3g (2^%.1f), "
           "max err/model bound = %.3g\n",
           s.name, (long long)k, worst_rel,
           worst_rel > 0 ? log2(worst_rel) : -INFINITY, worst);
  }
}

}  // namespace

int main(int argc, char** argv) {
  (void)argc;
  (void)argv;
  gpu g;
  const char* why = nullptr;
  int ndev = 0;
  cudaDeviceProp prop;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1 ||
      cudaSetDevice(0) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    printf("fp8_probe: no CUDA device\n");
    return 1;
  }
  if (ql__blaslt_load(&why) != 0) {
    printf("fp8_probe: cuBLASLt: %s\n", why);
    return 1;
  }
  if (ql__blaslt_create(&g.lt) != 0) {
    printf("fp8_probe: cuBLASLt does not start on this device\n");
    return 1;
  }
  const size_t v = ql__blaslt_version();
  printf("fp8_probe: cuBLASLt %zu.%zu.%zu, device %s (sm_%d%d)\n", v / 10000,
         v / 100 % 100, v % 100, prop.name, prop.major, prop.minor);
  static const setting kSettings[] = {
      {"precise", 0},
      {"fast-accum", QL__BLASLT_FAST_ACCUM},
      {"bf16-out", QL__BLASLT_OUT_BF16}};
  result res[3];
  for (int i = 0; i < 3; i++) {
    measure(&g, kSettings[i], &res[i]);
    if (res[i].ok && i < 2) random_check(&g, kSettings[i], &res[i]);
  }
  printf("\n%-11s %3s  %-31s %-6s %6s %9s %8s %9s\n", "setting", "B",
         "lost terms", "addend", "block", "promote", "again", "err/bnd");
  for (int i = 0; i < 3; i++) {
    const result& r = res[i];
    char blk[24], pro[24];
    snprintf(blk, sizeof blk, "%lld", (long long)r.block);
    snprintf(pro, sizeof pro, r.promote < 0 ? "none" : "%lld",
             (long long)r.promote);
    printf("%-11s %3d  %-31s %-6s %6s %9s %8s %9.3g\n", kSettings[i].name,
           r.bits, r.rounding,
           r.each < 0 ? "n/a" : r.each ? "each" : "summed",
           r.block ? blk : "n/a", r.promote ? pro : "n/a",
           r.promote > 0 ? (r.periodic ? "yes" : "no") : "n/a", r.worst);
  }
  printf("\n");
  for (int i = 0; i < 3; i++) {
    const result& r = res[i];
    if (!r.ok) {
      printf("fp8_probe: %s: not measured (a GEMM failed)\n",
             kSettings[i].name);
    } else if (kSettings[i].flags & QL__BLASLT_OUT_BF16) {
      printf("fp8_probe: %s: the output keeps %d bits (control: bf16 has 8)\n",
             kSettings[i].name, r.bits);
    } else if (r.bits >= 24) {
      printf("fp8_probe: %s: exact f32 accumulation (%d bits kept, as f32 "
             "sums rounded to nearest)\n",
             kSettings[i].name, r.bits);
    } else if (r.promote < 0) {
      printf("fp8_probe: %s: accumulator keeps %d bits within a K-block of "
             "%lld; no promotion within K = %lld\n",
             kSettings[i].name, r.bits, (long long)r.block,
             (long long)kMaxK);
    } else {
      printf("fp8_probe: %s: accumulator keeps %d bits within a K-block of "
             "%lld; promotes every %lld elements\n",
             kSettings[i].name, r.bits, (long long)r.block,
             (long long)r.promote);
    }
  }
  ql__blaslt_free(g.lt);
  return g.failures ? 1 : 0;
}
