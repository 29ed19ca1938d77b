// emu_blaslt.cpp - the reference cuBLASLt of emu_blaslt.h: descriptors on
// the heap, the FP8 matmul as a plain loop on host memory (device memory is
// host memory in the emulated runtime), the heuristic's split-K choice and
// the documented requirements. See emu_blaslt.h for what is modelled.
#include "emu_blaslt.h"

#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <new>

namespace {

constexpr uint64_t kAlgoMagic = 0x514c544c47454d55ull;  // an algo of ours
constexpr int kSms = 132;      // what the emulated GPUs report
constexpr uint64_t kTile = 128;  // the output tile the heuristic reasons in

std::atomic<int> g_present{-1};  // -1: read QL_EMU_CUBLASLT at first use
std::atomic<int> g_refuse_odd{-1};  // -1: read QL_EMU_CUBLASLT_REFUSE_M
std::atomic<long> g_matmuls{0};

bool present() {
  int p = g_present.load();
  if (p < 0) {
    const char* v = getenv("QL_EMU_CUBLASLT");
    p = v != nullptr && strcmp(v, "0") == 0 ? 0 : 1;
    g_present.store(p);
  }
  return p != 0;
}

bool refuse_odd() {
  int r = g_refuse_odd.load();
  if (r < 0) {
    const char* v = getenv("QL_EMU_CUBLASLT_REFUSE_M");
    r = v != nullptr && strcmp(v, "odd") == 0 ? 1 : 0;
    g_refuse_odd.store(r);
  }
  return r != 0;
}

size_t type_size(cudaDataType t) {
  switch (t) {
    case CUDA_R_32F:
    case CUDA_R_32I:
      return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF:
      return 2;
    case CUDA_R_8I:
    case CUDA_R_8F_E4M3:
    case CUDA_R_8F_E5M2:
      return 1;
  }
  return 0;
}

// e4m3fn -> f32, exact (OCP 8-bit floating point, E4M3: bias 7, no
// infinities, S.1111.111 is NaN).
float e4m3(uint8_t c) {
  const int e = (c >> 3) & 0xF, m = c & 7;
  float v;
  if (e == 0xF && m == 7)
    v = __builtin_nanf("");
  else if (e == 0)
    v = float(m) * 0.001953125f;  // m·2^-9
  else
    v = __builtin_ldexpf(float(8 + m), e - 10);
  return (c & 0x80) ? -v : v;
}

}  // namespace

struct cublasLtContext {
  int unused;
};

struct ql_emu_lt_layout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
};

struct ql_emu_lt_desc {
  cublasComputeType_t compute;
  cudaDataType scale;
  int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  int32_t pointer_mode = 0;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* a_scale = nullptr;
  const void* b_scale = nullptr;
  int32_t a_scale_mode = 0, b_scale_mode = 0;
  int8_t fast_accum = 0;
};

struct ql_emu_lt_pref {
  uint64_t max_workspace = 0;
  uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
};

namespace {

// A problem's shape as the matmul sees it: D (m x n) = op(A) (m x k) ·
// op(B) (k x n); i8: the IMMA row of the table (int8 in, int32 out).
struct problem {
  uint64_t m, n, k;
  bool i8;
  bool bf16;  // FP8 with C and D bf16
};

// The requirements of the two kinds of matmul served (cublasLtMatmul()):
// FP8 (its "FP8" notes: TN, compute and scale 32F, 16-byte alignment) and
// IMMA with the regular column order (its IMMA notes: TN, compute and
// scale 32I, m, k and the leading dimensions multiples of 4, pointers
// 4-byte aligned). CUBLAS_STATUS_NOT_SUPPORTED when d, a..dd meet neither.
cublasStatus_t fp8_check(const ql_emu_lt_desc* d, const ql_emu_lt_layout* a,
                         const ql_emu_lt_layout* b, const ql_emu_lt_layout* c,
                         const ql_emu_lt_layout* dd, problem* p) {
  if (d == nullptr || a == nullptr || b == nullptr || c == nullptr ||
      dd == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  const bool fp8 = d->compute == CUBLAS_COMPUTE_32F &&
                   d->scale == CUDA_R_32F && a->type == CUDA_R_8F_E4M3 &&
                   b->type == CUDA_R_8F_E4M3 && c->type == dd->type &&
                   (dd->type == CUDA_R_32F || dd->type == CUDA_R_16BF);
  const bool i8 = d->compute == CUBLAS_COMPUTE_32I &&
                  d->scale == CUDA_R_32I && a->type == CUDA_R_8I &&
                  b->type == CUDA_R_8I && c->type == CUDA_R_32I &&
                  dd->type == CUDA_R_32I;
  if (!fp8 && !i8) return CUBLAS_STATUS_NOT_SUPPORTED;
  p->i8 = i8;
  p->bf16 = fp8 && dd->type == CUDA_R_16BF;
  if (d->transa != CUBLAS_OP_T || d->transb != CUBLAS_OP_N)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (d->pointer_mode != 0 || d->epilogue != CUBLASLT_EPILOGUE_DEFAULT ||
      d->a_scale_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F ||
      d->b_scale_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  // op(A) = Aᵀ: A is k x m; op(B) = B: k x n; C and D m x n.
  p->k = a->rows;
  p->m = a->cols;
  p->n = b->cols;
  if (b->rows != p->k || c->rows != p->m || c->cols != p->n ||
      dd->rows != p->m || dd->cols != p->n)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (p->m == 0 || p->n == 0 || p->k == 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (a->ld < int64_t(a->rows) || b->ld < int64_t(b->rows) ||
      c->ld < int64_t(c->rows) || dd->ld < int64_t(dd->rows))
    return CUBLAS_STATUS_INVALID_VALUE;
  // FP8: 16-byte alignment of the leading dimensions and of m and k;
  // IMMA: multiples of 4 elements.
  const int64_t q = i8 ? 4 : 16;
  const int64_t qc = p->bf16 ? 8 : 4;  // 16 bytes of C and D
  if (a->ld % q != 0 || b->ld % q != 0 || c->ld % qc != 0 ||
      dd->ld % qc != 0 || int64_t(p->m) % q != 0 || int64_t(p->k) % q != 0)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return CUBLAS_STATUS_SUCCESS;
}

// The algorithm the heuristic offers first for p: split-K when the output
// has few tiles for the SMs and K is long (splits of at least 512 values).
uint32_t natural_splits(const problem& p) {
  const uint64_t tiles =
      ((p.m + kTile - 1) / kTile) * ((p.n + kTile - 1) / kTile);
  if (tiles * 2 > uint64_t(kSms) || p.k < 1024) return 1;
  uint64_t s = kSms / tiles, by_k = p.k / 512;
  if (s > by_k) s = by_k;
  if (s > 16) s = 16;
  return s < 2 ? 1 : uint32_t(s);
}

void make_algo(cublasLtMatmulAlgo_t* a, uint32_t splits, uint32_t scheme) {
  memset(a, 0, sizeof *a);
  a->data[0] = kAlgoMagic;
  a->data[1] = splits;
  a->data[2] = scheme;
}

bool algo_ok(const cublasLtMatmulAlgo_t* a) {
  return a != nullptr && a->data[0] == kAlgoMagic && a->data[1] >= 1 &&
         a->data[1] <= 64;
}

}  // namespace

extern "C" size_t cublasLtGetVersion(void) { return 130100; }  // 13.1.0

extern "C" cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  if (h == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *h = nullptr;
  if (!present()) return CUBLAS_STATUS_NOT_INITIALIZED;
  cublasLtContext* c = static_cast<cublasLtContext*>(calloc(1, sizeof *c));
  if (c == nullptr) return CUBLAS_STATUS_ALLOC_FAILED;
  *h = c;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  free(h);
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" const char* cublasLtGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

extern "C" cublasStatus_t cublasLtMatrixLayoutCreate(
    cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows,
    uint64_t cols, int64_t ld) {
  if (l == nullptr || type_size(type) == 0 || ld < 1)
    return CUBLAS_STATUS_INVALID_VALUE;
  ql_emu_lt_layout* p =
      static_cast<ql_emu_lt_layout*>(calloc(1, sizeof(ql_emu_lt_layout)));
  if (p == nullptr) return CUBLAS_STATUS_ALLOC_FAILED;
  *p = ql_emu_lt_layout{type, rows, cols, ld};
  *l = p;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatrixLayoutDestroy(
    cublasLtMatrixLayout_t l) {
  free(l);
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d,
                                                   cublasComputeType_t c,
                                                   cudaDataType_t s) {
  if (d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  ql_emu_lt_desc* p = new (std::nothrow) ql_emu_lt_desc;
  if (p == nullptr) return CUBLAS_STATUS_ALLOC_FAILED;
  p->compute = c;
  p->scale = s;
  *d = p;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}

namespace {

// Copies buf into *field when size is the attribute's size, as the real
// setters check it (CUBLAS_STATUS_INVALID_VALUE otherwise).
template <class T>
cublasStatus_t set(T* field, const void* buf, size_t size) {
  if (buf == nullptr || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  memcpy(field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

extern "C" cublasStatus_t cublasLtMatmulDescSetAttribute(
    cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
    const void* buf, size_t size) {
  if (d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: {
      int32_t v;
      cublasStatus_t s = set(&v, buf, size);
      if (s == CUBLAS_STATUS_SUCCESS) d->scale = cudaDataType(v);
      return s;
    }
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
      return set(&d->pointer_mode, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return set(&d->transa, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return set(&d->transb, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return set(&d->epilogue, buf, size);
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER:
      return set(&d->a_scale, buf, size);
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER:
      return set(&d->b_scale, buf, size);
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM:
      return set(&d->fast_accum, buf, size);
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE:
      return set(&d->a_scale_mode, buf, size);
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE:
      return set(&d->b_scale_mode, buf, size);
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
      break;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

extern "C" cublasStatus_t cublasLtMatmulPreferenceCreate(
    cublasLtMatmulPreference_t* p) {
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *p = new (std::nothrow) ql_emu_lt_pref;
  return *p == nullptr ? CUBLAS_STATUS_ALLOC_FAILED : CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulPreferenceDestroy(
    cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,
    const void* buf, size_t size) {
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return set(&p->max_workspace, buf, size);
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
      return set(&p->reduction_mask, buf, size);
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
      break;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

// The candidates in the heuristic's order: the natural split (if any) with
// the in-place reduction, then with a workspace reduction, then no split;
// those the preference excludes are left out. Workspace: m·n f32 partial
// sums per split.
extern "C" cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
    cublasLtMatrixLayout_t dd, cublasLtMatmulPreference_t pref, int requested,
    cublasLtMatmulHeuristicResult_t out[], int* count) {
  problem p;
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (pref == nullptr || out == nullptr || count == nullptr || requested < 1)
    return CUBLAS_STATUS_INVALID_VALUE;
  *count = 0;
  cublasStatus_t s = fp8_check(d, a, b, c, dd, &p);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  const uint32_t sp = natural_splits(p);
  struct cand {
    uint32_t splits, scheme;
    uint64_t workspace;
  } cands[3];
  int n = 0;
  if (sp > 1) {
    cands[n++] = {sp, CUBLASLT_REDUCTION_SCHEME_INPLACE, 0};
    cands[n++] = {sp, CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE,
                  p.m * p.n * 4 * sp};
  }
  cands[n++] = {1, CUBLASLT_REDUCTION_SCHEME_NONE, 0};
  for (int i = 0; i < n && *count < requested; i++) {
    if ((cands[i].scheme & pref->reduction_mask) != cands[i].scheme ||
        cands[i].workspace > pref->max_workspace)
      continue;
    cublasLtMatmulHeuristicResult_t* r = &out[(*count)++];
    memset(r, 0, sizeof *r);
    make_algo(&r->algo, cands[i].splits, cands[i].scheme);
    r->workspaceSize = cands[i].workspace;
    r->state = CUBLAS_STATUS_SUCCESS;
    r->wavesCount = 1.0f;
  }
  return *count > 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}

extern "C" cublasStatus_t cublasLtMatmulAlgoConfigSetAttribute(
    cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr,
    const void* buf, size_t size) {
  uint32_t v;
  if (!algo_ok(algo)) return CUBLAS_STATUS_INVALID_VALUE;
  cublasStatus_t s = set(&v, buf, size);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  switch (attr) {
    case CUBLASLT_ALGO_CONFIG_SPLITK_NUM:
      if (v < 1 || v > 64) return CUBLAS_STATUS_INVALID_VALUE;
      algo->data[1] = v;
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME:
      if (v & ~uint32_t(CUBLASLT_REDUCTION_SCHEME_MASK))
        return CUBLAS_STATUS_INVALID_VALUE;
      algo->data[2] = v;
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_ALGO_CONFIG_ID:
    case CUBLASLT_ALGO_CONFIG_TILE_ID:
    case CUBLASLT_ALGO_CONFIG_STAGES_ID:
      break;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

extern "C" cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(
    const cublasLtMatmulAlgo_t* algo,
    cublasLtMatmulAlgoConfigAttributes_t attr, void* buf, size_t size,
    size_t* written) {
  uint32_t v;
  if (!algo_ok(algo) || buf == nullptr || size != sizeof v)
    return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_ALGO_CONFIG_SPLITK_NUM:
      v = uint32_t(algo->data[1]);
      break;
    case CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME:
      v = uint32_t(algo->data[2]);
      break;
    case CUBLASLT_ALGO_CONFIG_ID:  // one algorithm, tile and stages "undefined"
    case CUBLASLT_ALGO_CONFIG_TILE_ID:
    case CUBLASLT_ALGO_CONFIG_STAGES_ID:
      v = 0;
      break;
    default:
      return CUBLAS_STATUS_INVALID_VALUE;
  }
  memcpy(buf, &v, sizeof v);
  if (written != nullptr) *written = sizeof v;
  return CUBLAS_STATUS_SUCCESS;
}

namespace {

// The FP8 tensor cores' accumulation as the emulation models it
// (emu_blaslt.h): bits == 0 is exact f32 (the default); else each block
// of `block` products is added to the tensor-core partial sum with every
// addend aligned to the largest one's exponent and truncated to `bits`
// significant bits, and the partial sum is promoted into an f32
// accumulator every `promote` products (never with fast accumulation).
struct fp8_acc {
  int bits;
  uint64_t block, promote;  // promote 0: never
};

// QL_EMU_FP8_ACC_BITS (1..24; 0: exact; unset: 14), QL_EMU_FP8_ACC_BLOCK
// (default 32), QL_EMU_FP8_ACC_PROMOTE (default 128), read at first use;
// ql_emu_blaslt_set_fp8_acc() overrides them. The defaults are what
// fp8-probe measured on an H200 (sm_90, cuBLASLt 13.1): 14 bits kept,
// blocks of 32, promotion every 128 products.
std::atomic<int> g_acc_bits{-1};
std::atomic<long> g_acc_block{32}, g_acc_promote{128};

long env_long(const char* name, long dflt, long lo, long hi) {
  const char* v = getenv(name);
  if (v == nullptr || *v == 0) return dflt;
  char* end;
  long x = strtol(v, &end, 10);
  return *end == 0 && x >= lo && x <= hi ? x : dflt;
}

fp8_acc acc_model(bool fast) {
  int b = g_acc_bits.load();
  if (b < 0) {
    g_acc_block.store(env_long("QL_EMU_FP8_ACC_BLOCK", 32, 1, 256));
    g_acc_promote.store(env_long("QL_EMU_FP8_ACC_PROMOTE", 128, 1, 1 << 20));
    b = int(env_long("QL_EMU_FP8_ACC_BITS", 14, 0, 24));
    g_acc_bits.store(b);
  }
  fp8_acc m;
  m.bits = b;
  m.block = uint64_t(g_acc_block.load());
  m.promote = fast ? 0 : uint64_t(g_acc_promote.load());
  return m;
}

// x truncated toward zero to `bits` significant bits.
double trunc_bits(double x, int bits) {
  if (x == 0.0) return 0.0;
  const double q = __builtin_ldexp(1.0, __builtin_ilogb(x) + 1 - bits);
  return __builtin_trunc(x / q) * q;
}

// One block: c + Σ addends, every term aligned to the largest one's
// exponent E and truncated toward -inf (a sign-filling right shift) to a
// multiple of 2^(E+1-bits), the exact sum of those truncated to `bits`
// significant bits. Exact in double: bits <= 24, at most 2^20 terms.
double block_add(int bits, double c, const double* t, uint64_t n) {
  double mx = __builtin_fabs(c);
  for (uint64_t i = 0; i < n; i++)
    if (__builtin_fabs(t[i]) > mx) mx = __builtin_fabs(t[i]);
  if (mx == 0.0) return 0.0;
  const double q = __builtin_ldexp(1.0, __builtin_ilogb(mx) + 1 - bits);
  double s = __builtin_floor(c / q) * q;
  for (uint64_t i = 0; i < n; i++) s += __builtin_floor(t[i] / q) * q;
  return trunc_bits(s, bits);
}

// Σ a[k]·b[k] for k in [k0, k1) (e4m3 codes, lut their values), summed
// as m says: exact f32 in increasing k, or the limited-precision model.
float part_sum(const fp8_acc& m, const float* lut, const uint8_t* a,
               const uint8_t* b, uint64_t k0, uint64_t k1) {
  if (m.bits == 0) {
    float s = 0.0f;
    for (uint64_t k = k0; k < k1; k++) s += lut[a[k]] * lut[b[k]];
    return s;
  }
  constexpr uint64_t kMaxBlock = 256;
  double t[kMaxBlock];
  const uint64_t blk = m.block < kMaxBlock ? m.block : kMaxBlock;
  const uint64_t iv = m.promote != 0 ? m.promote : k1 - k0;
  float acc = 0.0f;
  for (uint64_t i0 = k0; i0 < k1; i0 += iv) {
    const uint64_t i1 = i0 + iv < k1 ? i0 + iv : k1;
    double c = 0.0;  // the tensor cores' partial sum
    for (uint64_t b0 = i0; b0 < i1; b0 += blk) {
      const uint64_t b1 = b0 + blk < i1 ? b0 + blk : i1;
      for (uint64_t k = b0; k < b1; k++)
        t[k - b0] = double(lut[a[k]]) * double(lut[b[k]]);
      c = block_add(m.bits, c, t, b1 - b0);
    }
    acc = i0 == k0 ? float(c) : acc + float(c);  // c has <= 24 bits: exact
  }
  return acc;
}

// bf16 <-> f32 (round to nearest even; a NaN stays a quiet NaN).
float bf16_f32(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t f32_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// IMMA: D = alpha·(Aᵀ·B) + beta·C in int32, exact (wrapping as two's
// complement where the GPU's int32 sums would).
void run_i8(const problem& p, const ql_emu_lt_layout* ad,
            const ql_emu_lt_layout* bd, const ql_emu_lt_layout* cd,
            const ql_emu_lt_layout* dd, int32_t al, int32_t be,
            const int8_t* a8, const int8_t* b8, const int32_t* ci,
            int32_t* di) {
  for (uint64_t j = 0; j < p.n; j++) {
    const int8_t* bj = b8 + j * uint64_t(bd->ld);
    for (uint64_t i = 0; i < p.m; i++) {
      const int8_t* ai = a8 + i * uint64_t(ad->ld);
      uint32_t acc = 0;
      for (uint64_t k = 0; k < p.k; k++)
        acc += uint32_t(int32_t(ai[k]) * int32_t(bj[k]));
      uint32_t v = uint32_t(al) * acc;
      if (be != 0) v += uint32_t(be) * uint32_t(ci[j * uint64_t(cd->ld) + i]);
      di[j * uint64_t(dd->ld) + i] = int32_t(v);
    }
  }
}

}  // namespace

// FP8: D = alpha·(Aᵀ·B)·sa·sb + beta·C on host memory, every element
// from its own column of B and row of Aᵀ: the split parts of K each summed
// in increasing k from 0.0f (e4m3 products are exact in f32), added in
// order.
// IMMA: run_i8() (int32 sums are exact: a split changes nothing).
extern "C" cublasStatus_t cublasLtMatmul(
    cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void* alpha,
    const void* A, cublasLtMatrixLayout_t ad, const void* B,
    cublasLtMatrixLayout_t bd, const void* beta, const void* C,
    cublasLtMatrixLayout_t cd, void* D, cublasLtMatrixLayout_t dd,
    const cublasLtMatmulAlgo_t* algo, void* workspace, size_t wsbytes,
    cudaStream_t stream) {
  problem p;
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (alpha == nullptr || beta == nullptr || A == nullptr || B == nullptr ||
      D == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  cublasStatus_t s = fp8_check(d, ad, bd, cd, dd, &p);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  // B's columns are the activations' rows.
  if (refuse_odd() && p.n % 2 != 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  // beta is of the scale type: int32 for IMMA, float for FP8.
  const bool beta0 = p.i8 ? *static_cast<const int32_t*>(beta) == 0
                          : *static_cast<const float*>(beta) == 0.0f;
  if (C == nullptr && !beta0) return CUBLAS_STATUS_INVALID_VALUE;
  const uintptr_t am = p.i8 ? 3 : 15;
  if ((uintptr_t(A) & am) || (uintptr_t(B) & am) || (uintptr_t(D) & am) ||
      (C != nullptr && (uintptr_t(C) & am)))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  uint32_t splits = 1;
  if (algo != nullptr) {
    if (!algo_ok(algo)) return CUBLAS_STATUS_INVALID_VALUE;
    splits = uint32_t(algo->data[1]);
    if (algo->data[2] == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE &&
        splits > 1 &&
        (workspace == nullptr || wsbytes < p.m * p.n * 4 * splits))
      return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (!ql__emu_cuda_launch(stream))
    return cudaPeekAtLastError() == cudaSuccess
               ? CUBLAS_STATUS_SUCCESS
               : CUBLAS_STATUS_EXECUTION_FAILED;
  g_matmuls.fetch_add(1);
  if (p.i8) {
    run_i8(p, ad, bd, cd, dd, *static_cast<const int32_t*>(alpha),
           *static_cast<const int32_t*>(beta), static_cast<const int8_t*>(A),
           static_cast<const int8_t*>(B), static_cast<const int32_t*>(C),
           static_cast<int32_t*>(D));
    return CUBLAS_STATUS_SUCCESS;
  }
  const float al = *static_cast<const float*>(alpha),
              be = *static_cast<const float*>(beta);
  const float sa = d->a_scale ? *static_cast<const float*>(d->a_scale) : 1.0f,
              sb = d->b_scale ? *static_cast<const float*>(d->b_scale) : 1.0f;
  const uint8_t* a8 = static_cast<const uint8_t*>(A);
  const uint8_t* b8 = static_cast<const uint8_t*>(B);
  uint64_t part = (p.k + splits - 1) / splits;
  part = (part + 15) / 16 * 16;
  const fp8_acc model = acc_model(d->fast_accum != 0);
  float lut[256];
  for (int i = 0; i < 256; i++) lut[i] = e4m3(uint8_t(i));
  for (uint64_t j = 0; j < p.n; j++) {
    const uint8_t* bj = b8 + j * uint64_t(bd->ld);
    for (uint64_t i = 0; i < p.m; i++) {
      const uint8_t* ai = a8 + i * uint64_t(ad->ld);  // row i of Aᵀ
      float acc = 0.0f;
      for (uint64_t k0 = 0; k0 < p.k; k0 += part) {
        const uint64_t k1 = k0 + part < p.k ? k0 + part : p.k;
        const float s = part_sum(model, lut, ai, bj, k0, k1);
        acc = k0 == 0 ? s : acc + s;
      }
      float v = al * (acc * (sa * sb));
      const uint64_t ci = j * uint64_t(cd->ld) + i, di = j * uint64_t(dd->ld) + i;
      if (p.bf16) {
        if (be != 0.0f) v += be * bf16_f32(static_cast<const uint16_t*>(C)[ci]);
        static_cast<uint16_t*>(D)[di] = f32_bf16(v);
      } else {
        if (be != 0.0f) v += be * static_cast<const float*>(C)[ci];
        static_cast<float*>(D)[di] = v;
      }
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" void ql_emu_blaslt_set_present(int p) { g_present.store(p ? 1 : 0); }

extern "C" void ql_emu_blaslt_set_refuse_odd(int on) {
  g_refuse_odd.store(on ? 1 : 0);
}

extern "C" long ql_emu_blaslt_matmuls(void) { return g_matmuls.load(); }

extern "C" void ql_emu_blaslt_set_fp8_acc(int bits, long block, long promote) {
  g_acc_block.store(block >= 1 && block <= 256 ? block : 32);
  g_acc_promote.store(promote >= 1 ? promote : 128);
  g_acc_bits.store(bits >= 0 && bits <= 24 ? bits : 0);
}
