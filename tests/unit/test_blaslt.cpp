// test_blaslt.cpp - the CUDA backend's cuBLASLt layer (kernels/cuda/
// blaslt.h) on the reference cuBLASLt of the emulated build
// (emu_blaslt.h), on emulated device memory:
// - the reference FP8 matmul against a plain triple loop (f32 sums of exact
//   e4m3 products in increasing k), bit for bit, on ragged token counts
//   and leading dimensions larger than the rows; the reference IMMA (int8
//   in, int32 out) against an int64 loop, with -128 everywhere;
// - the reference's documented FP8 requirements (TN only, 16-byte aligned
//   dimensions, leading dimensions and pointers, an f32 or bf16 output)
//   refused with CUBLAS_STATUS_NOT_SUPPORTED;
// - its heuristic splits K for few output tiles and a long K (so a layer
//   that took its first answer per M would not be batch-invariant), and
//   leaves the split out under a reduction-scheme mask of NONE;
// - the layer: results equal to the triple loop at every M (its algorithm
//   does not split K even where the heuristic would), a row's bytes the
//   same at M = 1 and M = 37, its argument checks, a matmul refused at one
//   M refused for its shape at every M, and a library that does not start
//   (QL_EMU_CUBLASLT=0) failing handle creation;
// - the layer's FP8 flags (fast accumulation, a bf16 output rounded to
//   nearest even, refused with IMMA), its algorithm description, and the
//   reference's limited-precision accumulation model (B = 14: a term lost
//   within a promotion interval, kept across one, a lost negative term
//   rounded toward -inf; no promotion with fast accumulation).
//
// Plain main(); one line per check, exit status 1 on any failure.
#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "blaslt.h"
#include "emu_blaslt.h"
#include "emu_runtime.h"
#include "ql_defs.h"
#include "ql_kernels.h"

static int g_fail;

static void check(bool ok, const char* what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  g_fail += !ok;
}

static uint64_t g_seed = 0x9E3779B97F4A7C15ull;
static uint32_t rnd() {
  g_seed ^= g_seed << 13;
  g_seed ^= g_seed >> 7;
  g_seed ^= g_seed << 17;
  return uint32_t(g_seed >> 32);
}

// A random finite e4m3 code (not NaN: 0x7F and 0xFF).
static uint8_t code() {
  for (;;) {
    uint8_t c = uint8_t(rnd());
    if ((c & 0x7F) != 0x7F) return c;
  }
}

// Device memory of n bytes filled from host.
static void* dev_copy(const void* host, size_t n) {
  void* p = nullptr;
  if (cudaMalloc(&p, n) != cudaSuccess) return nullptr;
  if (host != nullptr) cudaMemcpy(p, host, n, cudaMemcpyHostToDevice);
  return p;
}

// acc[j, i] = Σk e4m3(x[j, k])·e4m3(w[i, k]), f32, increasing k from 0.
static void triple_loop(const std::vector<uint8_t>& w, int64_t ldw,
                        const std::vector<uint8_t>& x, int64_t ldx, int64_t n,
                        int64_t m, int64_t k, std::vector<float>* acc,
                        int64_t ldacc) {
  for (int64_t j = 0; j < m; j++)
    for (int64_t i = 0; i < n; i++) {
      float s = 0.0f;
      for (int64_t kk = 0; kk < k; kk++)
        s += ql_e4m3_to_f32(x[size_t(j * ldx + kk)]) *
             ql_e4m3_to_f32(w[size_t(i * ldw + kk)]);
      (*acc)[size_t(j * ldacc + i)] = s;
    }
}

// The problem of one case: w [n, ldw], x [m, ldx] random codes, on the
// device with a result buffer acc [m, ldacc].
struct prob {
  int64_t n, m, k, ldw, ldx, ldacc;
  std::vector<uint8_t> w, x;
  void *dw = nullptr, *dx = nullptr, *dacc = nullptr;
  prob(int64_t n_, int64_t m_, int64_t k_, int64_t pad)
      : n(n_), m(m_), k(k_), ldw(k_ + pad), ldx(k_ + pad), ldacc(n_ + pad) {
    w.resize(size_t(n * ldw));
    x.resize(size_t(m * ldx));
    for (auto& c : w) c = code();
    for (auto& c : x) c = code();
    dw = dev_copy(w.data(), w.size());
    dx = dev_copy(x.data(), x.size());
    dacc = dev_copy(nullptr, size_t(m * ldacc) * 4);
  }
  ~prob() {
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(dacc);
  }
  std::vector<float> result() const {
    std::vector<float> r(size_t(m * ldacc));
    cudaMemcpy(r.data(), dacc, r.size() * 4, cudaMemcpyDeviceToHost);
    return r;
  }
  // Equal to the triple loop in every element of [m, n].
  bool matches() const {
    std::vector<float> want(size_t(m * ldacc)), got = result();
    triple_loop(w, ldw, x, ldx, n, m, k, &want, ldacc);
    for (int64_t j = 0; j < m; j++)
      if (memcmp(&got[size_t(j * ldacc)], &want[size_t(j * ldacc)],
                 size_t(n) * 4) != 0)
        return false;
    return true;
  }
};

// Descriptors of the FP8 product of p in cuBLASLt's terms (see blaslt.cpp):
// ta/tb the transposes, a bad_ld leading dimension for A when non-zero.
struct raw {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  raw(const prob& p, int32_t ta, int32_t tb, cudaDataType dt = CUDA_R_32F,
      int64_t bad_ld = 0) {
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                   sizeof ta);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                   sizeof tb);
    cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, uint64_t(p.k),
                               uint64_t(p.n), bad_ld ? bad_ld : p.ldw);
    cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, uint64_t(p.k),
                               uint64_t(p.m), p.ldx);
    cublasLtMatrixLayoutCreate(&d, dt, uint64_t(p.n), uint64_t(p.m),
                               p.ldacc);
  }
  ~raw() {
    cublasLtMatmulDescDestroy(op);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(d);
  }
  cublasStatus_t run(cublasLtHandle_t h, const prob& p, const void* dw,
                     const cublasLtMatmulAlgo_t* algo = nullptr) {
    const float one = 1.0f, zero = 0.0f;
    return cublasLtMatmul(h, op, &one, dw, a, p.dx, b, &zero, p.dacc, d,
                          p.dacc, d, algo, nullptr, 0, nullptr);
  }
  // The heuristic's first answer under a reduction mask; its split-K in
  // *splits. false when it gives none.
  bool first(cublasLtHandle_t h, uint32_t mask, cublasLtMatmulAlgo_t* algo,
             uint32_t* splits) {
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    uint64_t ws = 1u << 30;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask);
    cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(h, op, a, b, d, d, pref,
                                                      1, &r, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS || found != 1) return false;
    *algo = r.algo;
    return cublasLtMatmulAlgoConfigGetAttribute(
               algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, splits, sizeof *splits,
               nullptr) == CUBLAS_STATUS_SUCCESS;
  }
};

static void test_reference() {
  cublasLtHandle_t h;
  check(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS, "cublasLtCreate");
  static const int64_t shapes[][4] = {
      // n, m, k, extra leading dimension
      {16, 1, 16, 0},  {16, 3, 32, 16},  {48, 37, 208, 0},
      {64, 7, 1024, 32}, {32, 1, 4096, 0}, {80, 5, 144, 48}};
  for (const auto& s : shapes) {
    prob p(s[0], s[1], s[2], s[3]);
    raw r(p, CUBLAS_OP_T, CUBLAS_OP_N);
    char what[128];
    snprintf(what, sizeof what,
             "reference matmul = triple loop, n=%lld m=%lld k=%lld ld+%lld",
             (long long)s[0], (long long)s[1], (long long)s[2],
             (long long)s[3]);
    check(r.run(h, p, p.dw) == CUBLAS_STATUS_SUCCESS && p.matches(), what);
  }

  // The documented requirements.
  {
    prob p(16, 3, 32, 0);
    raw nn(p, CUBLAS_OP_N, CUBLAS_OP_N), tt(p, CUBLAS_OP_T, CUBLAS_OP_T);
    check(nn.run(h, p, p.dw) == CUBLAS_STATUS_NOT_SUPPORTED &&
              tt.run(h, p, p.dw) == CUBLAS_STATUS_NOT_SUPPORTED,
          "FP8 other than TN: CUBLAS_STATUS_NOT_SUPPORTED");
    raw f16(p, CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_16F);
    check(f16.run(h, p, p.dw) == CUBLAS_STATUS_NOT_SUPPORTED,
          "D in another type than the f32 and bf16 rows: NOT_SUPPORTED");
    raw badld(p, CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_32F, 40);
    check(badld.run(h, p, p.dw) == CUBLAS_STATUS_NOT_SUPPORTED,
          "lda not a multiple of 16: NOT_SUPPORTED");
    raw ok(p, CUBLAS_OP_T, CUBLAS_OP_N);
    check(ok.run(h, p, static_cast<const uint8_t*>(p.dw) + 1) ==
              CUBLAS_STATUS_NOT_SUPPORTED,
          "A misaligned: NOT_SUPPORTED");
    int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    cublasLtMatmulDescSetAttribute(ok.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                   &outer, sizeof outer);
    check(ok.run(h, p, p.dw) == CUBLAS_STATUS_NOT_SUPPORTED,
          "outer-vector scales: NOT_SUPPORTED (sm_90 only)");
    check(cublasLtMatmulDescSetAttribute(ok.op, CUBLASLT_MATMUL_DESC_TRANSA,
                                         &outer, 2) ==
              CUBLAS_STATUS_INVALID_VALUE,
          "an attribute of the wrong size: INVALID_VALUE");
  }
  {
    prob p(24, 3, 32, 0);  // m (= n here) not a multiple of 16
    p.ldacc = 32;
    raw r(p, CUBLAS_OP_T, CUBLAS_OP_N);
    check(r.run(h, p, p.dw) == CUBLAS_STATUS_NOT_SUPPORTED,
          "m not a multiple of 16: NOT_SUPPORTED");
  }

  // The heuristic: split-K for few tiles and a long K, unless masked; the
  // split changes the bits, so taking it per M breaks batch invariance.
  {
    prob p(64, 1, 4096, 0);
    raw r(p, CUBLAS_OP_T, CUBLAS_OP_N);
    cublasLtMatmulAlgo_t algo;
    uint32_t splits = 0;
    check(r.first(h, CUBLASLT_REDUCTION_SCHEME_MASK, &algo, &splits) &&
              splits > 1,
          "heuristic, 1 token, K=4096: its first algorithm splits K");
    bool differs = false;
    for (int t = 0; t < 8 && !differs; t++) {
      prob q(64, 1, 4096, 0);
      raw rq(q, CUBLAS_OP_T, CUBLAS_OP_N);
      differs = rq.run(h, q, q.dw, &algo) == CUBLAS_STATUS_SUCCESS &&
                !q.matches();
    }
    check(differs, "a split K gives other bits than the unsplit sum");
    check(r.first(h, CUBLASLT_REDUCTION_SCHEME_NONE, &algo, &splits) &&
              splits == 1,
          "heuristic, reduction mask NONE: no split");
    prob big(4096, 300, 4096, 0);  // 32 x 3 tiles of 128
    raw rb(big, CUBLAS_OP_T, CUBLAS_OP_N);
    check(rb.first(h, CUBLASLT_REDUCTION_SCHEME_MASK, &algo, &splits) &&
              splits == 1,
          "heuristic, N=4096, 300 tokens: no split (the choice depends on M)");
  }
  cublasLtDestroy(h);
}

// The IMMA row: A, B int8, C, D int32, compute and scale 32I.
static void test_imma() {
  cublasLtHandle_t h;
  cublasLtCreate(&h);
  const int64_t n = 32, m = 5, k = 4096, ld = k + 16, ldd = n + 16;
  std::vector<int8_t> w(size_t(n * ld)), x(size_t(m * ld));
  for (auto& v : w) v = int8_t(rnd());
  for (auto& v : x) v = int8_t(rnd());
  for (int64_t i = 0; i < k; i++) w[size_t(i)] = x[size_t(i)] = -128;
  int8_t* dw = static_cast<int8_t*>(dev_copy(w.data(), w.size()));
  int8_t* dx = static_cast<int8_t*>(dev_copy(x.data(), x.size()));
  int32_t* dd = static_cast<int32_t*>(dev_copy(nullptr, size_t(m * ldd) * 4));
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, d;
  const int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N, one = 1, zero = 0;
  cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32I, CUDA_R_32I);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                 sizeof ta);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                 sizeof tb);
  cublasLtMatrixLayoutCreate(&a, CUDA_R_8I, uint64_t(k), uint64_t(n), ld);
  cublasLtMatrixLayoutCreate(&b, CUDA_R_8I, uint64_t(k), uint64_t(m), ld);
  cublasLtMatrixLayoutCreate(&d, CUDA_R_32I, uint64_t(n), uint64_t(m), ldd);
  bool ok = cublasLtMatmul(h, op, &one, dw, a, dx, b, &zero, dd, d, dd, d,
                           nullptr, nullptr, 0, nullptr) ==
            CUBLAS_STATUS_SUCCESS;
  std::vector<int32_t> got(size_t(m * ldd));
  cudaMemcpy(got.data(), dd, got.size() * 4, cudaMemcpyDeviceToHost);
  for (int64_t j = 0; j < m && ok; j++)
    for (int64_t i = 0; i < n && ok; i++) {
      int64_t s = 0;
      for (int64_t kk = 0; kk < k; kk++)
        s += int64_t(x[size_t(j * ld + kk)]) * w[size_t(i * ld + kk)];
      ok = got[size_t(j * ldd + i)] == int32_t(s);
    }
  check(ok && got[0] == 4096 * 16384,
        "reference IMMA = int64 loop, K=4096 (row 0: 4096 x (-128)^2)");
  const int32_t nn = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &nn,
                                 sizeof nn);
  check(cublasLtMatmul(h, op, &one, dw, a, dx, b, &zero, dd, d, dd, d,
                       nullptr, nullptr, 0, nullptr) ==
            CUBLAS_STATUS_NOT_SUPPORTED,
        "IMMA other than TN: NOT_SUPPORTED");
  cublasLtMatmulDescDestroy(op);
  cublasLtMatrixLayoutDestroy(a);
  cublasLtMatrixLayoutDestroy(b);
  cublasLtMatrixLayoutDestroy(d);

  // The layer's I8 kind: the same sums.
  ql__blaslt* lt = nullptr;
  std::vector<int32_t> got2(size_t(m * ldd));
  check(ql__blaslt_create(&lt) == 0 &&
            ql__blaslt_gemm(lt, QL__BLASLT_I8, n, m, k, dw, ld, dx, ld, dd,
                            ldd, nullptr) == 0 &&
            cudaMemcpy(got2.data(), dd, got2.size() * 4,
                       cudaMemcpyDeviceToHost) == cudaSuccess &&
            memcmp(got.data(), got2.data(), got.size() * 4) == 0,
        "layer, QL__BLASLT_I8: the reference IMMA's sums");
  ql__blaslt_free(lt);
  cudaFree(dw);
  cudaFree(dx);
  cudaFree(dd);
  cublasLtDestroy(h);
}

static void test_layer() {
  const char* why = nullptr;
  check(ql__blaslt_load(&why) == 0 && ql__blaslt_version() == 130100,
        "ql__blaslt_load: the emulated build's reference, version 13.1.0");
  ql__blaslt* lt = nullptr;
  check(ql__blaslt_create(&lt) == 0 && lt != nullptr, "ql__blaslt_create");

  // Where the heuristic would split K at M = 1 (test_reference), the
  // layer's results are the unsplit sums at every M.
  const int64_t n = 64, k = 4096;
  prob p37(n, 37, k, 0);
  const int E = QL__BLASLT_E4M3;
  check(ql__blaslt_gemm(lt, E, n, 37, k, p37.dw, k, p37.dx, k, p37.dacc, n,
                        nullptr) == 0 &&
            p37.matches(),
        "layer, M=37, K=4096: the triple loop's bits");
  std::vector<float> all = p37.result();
  bool same = true;
  for (int64_t r : {0, 5, 36}) {
    float* one = nullptr;
    cudaMalloc(reinterpret_cast<void**>(&one), size_t(n) * 4);
    int rc = ql__blaslt_gemm(lt, E, n, 1, k, p37.dw, k,
                             static_cast<uint8_t*>(p37.dx) + r * k, k, one,
                             n, nullptr);
    std::vector<float> got(static_cast<size_t>(n));
    cudaMemcpy(got.data(), one, size_t(n) * 4, cudaMemcpyDeviceToHost);
    cudaFree(one);
    same = same && rc == 0 &&
           memcmp(got.data(), &all[size_t(r * n)], size_t(n) * 4) == 0;
  }
  check(same, "layer: rows 0, 5, 36 alone (M=1) give their bytes at M=37");

  // Ragged token counts and a padded result.
  prob pr(48, 3, 208, 16);
  check(ql__blaslt_gemm(lt, E, 48, 3, 208, pr.dw, pr.ldw, pr.dx, pr.ldx,
                        pr.dacc, pr.ldacc, nullptr) == 0 &&
            pr.matches(),
        "layer, M=3 N=48 K=208, padded leading dimensions");

  // Argument checks: what cuBLASLt's FP8 GEMM needs is the caller's job.
  uint8_t* w = static_cast<uint8_t*>(pr.dw);
  float* acc = static_cast<float*>(pr.dacc);
  const int64_t lw = pr.ldw, lx = pr.ldx, la = pr.ldacc;
  check(ql__blaslt_gemm(lt, E, 40, 3, 208, w, lw, w, lx, acc, la, nullptr) ==
                QL_EINVAL &&
            ql__blaslt_gemm(lt, E, 48, 3, 200, w, lw, w, lx, acc, la,
                            nullptr) == QL_EINVAL &&
            ql__blaslt_gemm(lt, E, 48, 0, 208, w, lw, w, lx, acc, la,
                            nullptr) == QL_EINVAL &&
            ql__blaslt_gemm(lt, E, 48, 3, 208, w, 200, w, lx, acc, la,
                            nullptr) == QL_EINVAL &&
            ql__blaslt_gemm(lt, 7, 48, 3, 208, w, lw, w, lx, acc, la,
                            nullptr) == QL_EINVAL &&
            ql__blaslt_gemm(nullptr, E, 48, 3, 208, w, lw, w, lx, acc, la,
                            nullptr) == QL_EINVAL,
        "layer: n, k not multiples of 16, m < 1, ld < k, unknown kind, no "
        "handle: QL_EINVAL");

  // A matmul that cuBLASLt refuses at one m after its heuristic chose an
  // algorithm for the shape (the reference's switch: an odd token count):
  // the refusal stands for the shape at every m, so the caller's fallback
  // takes them all, and no matmul of it runs; another shape is not
  // touched.
  prob pf(32, 2, 96, 0);
  ql_emu_blaslt_set_refuse_odd(1);
  const long ran = ql_emu_blaslt_matmuls();
  check(ql__blaslt_gemm(lt, E, 32, 1, 96, pf.dw, 96, pf.dx, 96, pf.dacc, 32,
                        nullptr) == QL_ENOTSUP &&
            ql__blaslt_gemm(lt, E, 32, 2, 96, pf.dw, 96, pf.dx, 96, pf.dacc,
                            32, nullptr) == QL_ENOTSUP &&
            ql_emu_blaslt_matmuls() == ran,
        "layer: a refusal at M=1 holds at M=2 for the shape");
  prob po(48, 2, 96, 0);
  check(ql__blaslt_gemm(lt, E, 48, 2, 96, po.dw, 96, po.dx, 96, po.dacc, 48,
                        nullptr) == 0 &&
            po.matches(),
        "layer: another shape at M=2 still runs");
  ql_emu_blaslt_set_refuse_odd(0);
  ql__blaslt_free(lt);
  ql__blaslt_free(nullptr);

  // A library that does not start: no handle.
  ql_emu_blaslt_set_present(0);
  lt = nullptr;
  check(ql__blaslt_create(&lt) == QL_EDEVICE && lt == nullptr,
        "cuBLASLt that does not start: ql__blaslt_create QL_EDEVICE");
  ql_emu_blaslt_set_present(1);
}

// bf16 from f32, round to nearest even (finite values).
static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// The layer's FP8 flags and the reference's accumulation model.
static void test_flags() {
  ql__blaslt* lt = nullptr;
  const int E = QL__BLASLT_E4M3;
  check(ql__blaslt_create(&lt) == 0 && ql__blaslt_flags() == 0,
        "layer: fast accumulation off without QL_CUDA_F8_FAST_ACCUM");
  prob p(48, 5, 208, 16);
  check(ql__blaslt_gemm_ex(lt, E, QL__BLASLT_FAST_ACCUM, 48, 5, 208, p.dw,
                           p.ldw, p.dx, p.ldx, p.dacc, p.ldacc,
                           nullptr) == 0 &&
            p.matches(),
        "layer, fast accumulation: exact f32 sums on the reference");

  // bf16 output: the f32 sums rounded to nearest even.
  std::vector<float> want(size_t(p.m * p.ldacc));
  triple_loop(p.w, p.ldw, p.x, p.ldx, p.n, p.m, p.k, &want, p.ldacc);
  std::vector<uint16_t> got(size_t(p.m * p.ldacc));
  bool same = ql__blaslt_gemm_ex(lt, E, QL__BLASLT_OUT_BF16, 48, 5, 208,
                                 p.dw, p.ldw, p.dx, p.ldx, p.dacc, p.ldacc,
                                 nullptr) == 0 &&
              cudaMemcpy(got.data(), p.dacc, got.size() * 2,
                         cudaMemcpyDeviceToHost) == cudaSuccess;
  for (int64_t j = 0; same && j < p.m; j++)
    for (int64_t i = 0; i < p.n; i++)
      same = same && got[size_t(j * p.ldacc + i)] ==
                         to_bf16(want[size_t(j * p.ldacc + i)]);
  check(same, "layer, bf16 output: the f32 sums rounded to nearest even");

  char name[96];
  check(ql__blaslt_algo_name(lt, E, 0, 48, 208, name, sizeof name) == 0 &&
            strcmp(name, "algo 0 tile 0 stages 0 splitk 1") == 0,
        "layer: the algorithm's description (split-K pinned to 1)");
  check(ql__blaslt_algo_name(lt, E, 0, 48, 208, name, 12) == 0 &&
            strcmp(name, "algo 0 tile") == 0,
        "layer: the description truncated to the buffer");
  check(ql__blaslt_gemm_ex(lt, QL__BLASLT_I8, QL__BLASLT_FAST_ACCUM, 48, 5,
                           208, p.dw, p.ldw, p.dx, p.ldx, p.dacc, p.ldacc,
                           nullptr) == QL_EINVAL &&
            ql__blaslt_gemm_ex(lt, E, 4, 48, 5, 208, p.dw, p.ldw, p.dx,
                               p.ldx, p.dacc, p.ldacc, nullptr) == QL_EINVAL,
        "layer: flags with IMMA, an unknown flag: QL_EINVAL");

  // The model (emu_blaslt.h), B = 14: 2^14 + 2^-1 (d = 15) loses its
  // small term within a block of 32, keeps it from the next promotion
  // interval (k = 128), and loses it there with fast accumulation; 2^14 -
  // 2^0 (d = 14, half a unit) drops by a whole unit, 2^1 (toward -inf).
  std::vector<uint8_t> w(size_t(16 * 256), 0), x(size_t(16 * 256), 0);
  const uint8_t big = uint8_t((7 + 7) << 3);  // 2^7: 2^7·2^7 = 2^14
  const uint8_t one = uint8_t(7 << 3);        // 2^0
  const uint8_t half = uint8_t(6 << 3);       // 2^-1
  const int64_t at[4] = {1, 31, 32, 128};
  for (int r = 0; r < 4; r++) {  // row r: 2^14 at k = 0, 2^-1 at at[r]
    w[size_t(r * 256)] = big;
    x[size_t(r * 256)] = big;
    w[size_t(r * 256 + at[r])] = half;
    x[size_t(r * 256 + at[r])] = one;
  }
  w[size_t(4 * 256)] = big;  // row 4: 2^14 - 2^0 at k = 0, 1
  x[size_t(4 * 256)] = big;
  w[size_t(4 * 256 + 1)] = one | 0x80;
  x[size_t(4 * 256 + 1)] = one;
  void* dw = dev_copy(w.data(), w.size());
  void* dx = dev_copy(x.data(), x.size());
  void* dacc = dev_copy(nullptr, 16 * 16 * 4);
  float y[16 * 16], yf[16 * 16];
  ql_emu_blaslt_set_fp8_acc(14, 32, 128);
  bool ok = ql__blaslt_gemm_ex(lt, E, 0, 16, 16, 256, dw, 256, dx, 256, dacc,
                               16, nullptr) == 0 &&
            cudaMemcpy(y, dacc, sizeof y, cudaMemcpyDeviceToHost) ==
                cudaSuccess &&
            ql__blaslt_gemm_ex(lt, E, QL__BLASLT_FAST_ACCUM, 16, 16, 256, dw,
                               256, dx, 256, dacc, 16, nullptr) == 0 &&
            cudaMemcpy(yf, dacc, sizeof yf, cudaMemcpyDeviceToHost) ==
                cudaSuccess;
  ql_emu_blaslt_set_fp8_acc(0, 32, 128);
  // the diagonal: element (r, r) is row r's sum
  check(ok && y[0] == 16384.0f && y[17] == 16384.0f && y[34] == 16384.0f &&
            y[51] == 16384.5f && y[68] == 16382.0f,
        "model B=14: small terms lost within an interval, kept across a "
        "promotion; a lost negative term floors");
  check(ok && yf[51] == 16384.0f,
        "model B=14, fast accumulation: no promotion, the term lost");
  cudaFree(dw);
  cudaFree(dx);
  cudaFree(dacc);
  ql__blaslt_free(lt);
}

int main() {
  unsetenv("QL_EMU_CUDA_DEVICES");
  unsetenv("QL_EMU_CUDA_FAULT");
  unsetenv("QL_EMU_CUBLASLT");
  unsetenv("QL_CUDA_F8_FAST_ACCUM");
  // The reference comparisons assume exact f32 sums (the model's own test
  // sets it explicitly).
  setenv("QL_EMU_FP8_ACC_BITS", "0", 1);
  test_reference();
  test_imma();
  test_layer();
  test_flags();
  std::printf("%s\n", g_fail ? "FAILED" : "all passed");
  return g_fail ? 1 : 0;
}
