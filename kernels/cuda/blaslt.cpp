// blaslt.cpp - see blaslt.h. The cuBLASLt entry points are reached through
// one table of function pointers: filled by dlsym() from libcublasLt.so.13
// in the GPU build, from the reference of emu_blaslt.h in the emulated one;
// everything else is the same code in both builds.
#include "blaslt.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef QL_CUDA_EMU
#include "emu_blaslt.h"
#else
#include <cublasLt.h>
#include <dlfcn.h>
#endif

#include "ql_defs.h"

namespace {

#define QL_LT_FNS(X)                  \
  X(cublasLtGetVersion)               \
  X(cublasLtCreate)                   \
  X(cublasLtDestroy)                  \
  X(cublasLtGetStatusName)            \
  X(cublasLtMatrixLayoutCreate)       \
  X(cublasLtMatrixLayoutDestroy)      \
  X(cublasLtMatmulDescCreate)         \
  X(cublasLtMatmulDescDestroy)        \
  X(cublasLtMatmulDescSetAttribute)   \
  X(cublasLtMatmulPreferenceCreate)   \
  X(cublasLtMatmulPreferenceDestroy)  \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatmulAlgoGetHeuristic)   \
  X(cublasLtMatmulAlgoConfigSetAttribute) \
  X(cublasLtMatmulAlgoConfigGetAttribute) \
  X(cublasLtMatmul)

// The entry points, with the types of the header they were compiled
// against (decltype: a signature that changes breaks the build, not a
// call).
struct api {
#define QL_LT_FIELD(name) decltype(&::name) name;
  QL_LT_FNS(QL_LT_FIELD)
#undef QL_LT_FIELD
};

api g_api;
int g_rc = QL_ENOTSUP;
const char* g_why = "cuBLASLt was not loaded";
size_t g_version = 0;
int g_flags = 0;  // ql__blaslt_flags()
pthread_once_t g_once = PTHREAD_ONCE_INIT;

// The FP8 flags of ql__blaslt_gemm from the environment (blaslt.h).
int env_flags() {
  const char* v = getenv("QL_CUDA_F8_FAST_ACCUM");
  return v != nullptr && strcmp(v, "1") == 0 ? QL__BLASLT_FAST_ACCUM : 0;
}

#ifdef QL_CUDA_EMU
void load_once() {
#define QL_LT_SET(name) g_api.name = &::name;
  QL_LT_FNS(QL_LT_SET)
#undef QL_LT_SET
  g_version = g_api.cublasLtGetVersion();
  g_flags = env_flags();
  g_rc = 0;
  g_why = "";
}
#else
// The soname of CUDA 13's cuBLASLt: the major version is part of the ABI,
// so another one is not tried.
constexpr const char* kSoname = "libcublasLt.so.13";

void load_once() {
  void* h = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    g_why = "libcublasLt.so.13 could not be loaded";
    return;
  }
  api a;
  bool all = true;
#define QL_LT_SYM(name)                                              \
  a.name = reinterpret_cast<decltype(&::name)>(dlsym(h, #name)); \
  all = all && a.name != nullptr;
  QL_LT_FNS(QL_LT_SYM)
#undef QL_LT_SYM
  if (!all) {
    g_why = "libcublasLt.so.13 lacks an entry point this build needs";
    dlclose(h);
    return;
  }
  size_t v = a.cublasLtGetVersion();
  if (v / 10000 != 13) {
    g_why = "libcublasLt.so.13 reports another major version";
    dlclose(h);
    return;
  }
  // The library stays loaded for the life of the process: handles made
  // from it may live until exit.
  g_api = a;
  g_version = v;
  g_flags = env_flags();
  g_rc = 0;
  g_why = "";
}
#endif

// The QL_E* code of a cuBLASLt status, at the boundary (DESIGN §7).
int map_status(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return 0;
    case CUBLAS_STATUS_ALLOC_FAILED:
      return QL_ENOMEM;
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return QL_ENOTSUP;
    case CUBLAS_STATUS_INVALID_VALUE:
      return QL_EINTERNAL;  // a descriptor of ours that is wrong
    default:
      return QL_EDEVICE;  // NOT_INITIALIZED, EXECUTION_FAILED, ...
  }
}

// An algorithm chosen for one (kind, flags, n, k).
struct algo_entry {
  int kind, flags;
  int64_t n, k;
  int rc;  // 0: algo is valid; else why there is none (QL_ENOTSUP, ...)
  cublasLtMatmulAlgo_t algo;
  algo_entry* next;
};

// The descriptors of one call: freed by put().
struct descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
};

void put(descs* s) {
  if (s->op != nullptr) g_api.cublasLtMatmulDescDestroy(s->op);
  if (s->a != nullptr) g_api.cublasLtMatrixLayoutDestroy(s->a);
  if (s->b != nullptr) g_api.cublasLtMatrixLayoutDestroy(s->b);
  if (s->d != nullptr) g_api.cublasLtMatrixLayoutDestroy(s->d);
  *s = descs();
}

// The product in cuBLASLt's column-major terms: D (n x m) = Aᵀ·B with A the
// weight as stored (k x n, ld ldw: row i of w is column i of A), B the
// activations as stored (k x m, ld ldx) and D the result (n x m, ld ldacc:
// row j of acc is column j of D). That is the "TN" form that FP8 and IMMA
// need. C has D's layout (beta is 0: never read); alpha and beta are of
// the scale type, f32 for FP8 whatever D is. flags: blaslt.h, FP8 only.
int make_descs(int kind, int flags, int64_t n, int64_t m, int64_t k,
               int64_t ldw, int64_t ldx, int64_t ldacc, descs* s) {
  const bool i8 = kind == QL__BLASLT_I8;
  const int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const int8_t fast = (flags & QL__BLASLT_FAST_ACCUM) ? 1 : 0;
  const cudaDataType ab = i8 ? CUDA_R_8I : CUDA_R_8F_E4M3,
                     dt = i8 ? CUDA_R_32I
                          : (flags & QL__BLASLT_OUT_BF16) ? CUDA_R_16BF
                                                          : CUDA_R_32F;
  cublasStatus_t st;
  if ((st = g_api.cublasLtMatmulDescCreate(
           &s->op, i8 ? CUBLAS_COMPUTE_32I : CUBLAS_COMPUTE_32F,
           i8 ? CUDA_R_32I : CUDA_R_32F)) !=
          CUBLAS_STATUS_SUCCESS ||
      (st = g_api.cublasLtMatmulDescSetAttribute(
           s->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) !=
          CUBLAS_STATUS_SUCCESS ||
      (st = g_api.cublasLtMatmulDescSetAttribute(
           s->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)) !=
          CUBLAS_STATUS_SUCCESS ||
      (!i8 && (st = g_api.cublasLtMatmulDescSetAttribute(
                   s->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                   sizeof fast)) != CUBLAS_STATUS_SUCCESS) ||
      (st = g_api.cublasLtMatrixLayoutCreate(&s->a, ab, uint64_t(k),
                                             uint64_t(n), ldw)) !=
          CUBLAS_STATUS_SUCCESS ||
      (st = g_api.cublasLtMatrixLayoutCreate(&s->b, ab, uint64_t(k),
                                             uint64_t(m), ldx)) !=
          CUBLAS_STATUS_SUCCESS ||
      (st = g_api.cublasLtMatrixLayoutCreate(&s->d, dt, uint64_t(n),
                                             uint64_t(m), ldacc)) !=
          CUBLAS_STATUS_SUCCESS) {
    put(s);
    return map_status(st);
  }
  return 0;
}

// Chooses the algorithm for (kind, n, k): the heuristic's first answer for
// QL__BLASLT_REF_TOKENS tokens with no split-K reduction allowed and no
// workspace, then split-K pinned to 1 (blaslt.h says why).
void choose(cublasLtHandle_t h, algo_entry* e) {
  descs s;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t res;
  const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE, one = 1;
  const uint64_t ws = 0;
  int found = 0;
  cublasStatus_t st;
  const int64_t ref = QL__BLASLT_REF_TOKENS, ld = e->k;
  e->rc = make_descs(e->kind, e->flags, e->n, ref, e->k, ld, ld, e->n, &s);
  if (e->rc != 0) return;
  memset(&res, 0, sizeof res);
  if ((st = g_api.cublasLtMatmulPreferenceCreate(&pref)) !=
          CUBLAS_STATUS_SUCCESS ||
      (st = g_api.cublasLtMatmulPreferenceSetAttribute(
           pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask,
           sizeof mask)) != CUBLAS_STATUS_SUCCESS ||
      (st = g_api.cublasLtMatmulPreferenceSetAttribute(
           pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws)) !=
          CUBLAS_STATUS_SUCCESS ||
      (st = g_api.cublasLtMatmulAlgoGetHeuristic(h, s.op, s.a, s.b, s.d, s.d,
                                                 pref, 1, &res, &found)) !=
          CUBLAS_STATUS_SUCCESS) {
    e->rc = map_status(st);
  } else if (found < 1 || res.state != CUBLAS_STATUS_SUCCESS) {
    e->rc = QL_ENOTSUP;
  } else {
    e->algo = res.algo;
    st = g_api.cublasLtMatmulAlgoConfigSetAttribute(
        &e->algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof one);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = g_api.cublasLtMatmulAlgoConfigSetAttribute(
          &e->algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &mask,
          sizeof mask);
    e->rc = map_status(st);
  }
  if (pref != nullptr) g_api.cublasLtMatmulPreferenceDestroy(pref);
  put(&s);
}

}  // namespace

struct ql__blaslt {
  cublasLtHandle_t h;
  algo_entry* algos;
};

int ql__blaslt_load(const char** why) {
  pthread_once(&g_once, load_once);
  if (why != nullptr) *why = g_why;
  return g_rc;
}

size_t ql__blaslt_version(void) {
  return ql__blaslt_load(nullptr) == 0 ? g_version : 0;
}

int ql__blaslt_create(ql__blaslt** out) {
  int rc;
  *out = nullptr;
  if ((rc = ql__blaslt_load(nullptr)) != 0) return rc;
  ql__blaslt* lt = static_cast<ql__blaslt*>(calloc(1, sizeof *lt));
  if (lt == nullptr) return QL_ENOMEM;
  cublasStatus_t st = g_api.cublasLtCreate(&lt->h);
  if (st != CUBLAS_STATUS_SUCCESS) {
    free(lt);
    return st == CUBLAS_STATUS_ALLOC_FAILED ? QL_ENOMEM : QL_EDEVICE;
  }
  *out = lt;
  return 0;
}

void ql__blaslt_free(ql__blaslt* lt) {
  if (lt == nullptr) return;
  for (algo_entry* e = lt->algos; e != nullptr;) {
    algo_entry* next = e->next;
    free(e);
    e = next;
  }
  if (lt->h != nullptr) g_api.cublasLtDestroy(lt->h);
  free(lt);
}

namespace {

// The algorithm entry of (kind, flags, n, k) in *out, chosen on first use.
// 0 (the entry may carry a cached refusal in its rc) or QL_ENOMEM.
int lookup(ql__blaslt* lt, int kind, int flags, int64_t n, int64_t k,
           algo_entry** out) {
  algo_entry* e;
  for (e = lt->algos; e != nullptr && (e->kind != kind || e->flags != flags ||
                                       e->n != n || e->k != k);
       e = e->next)
    ;
  if (e == nullptr) {
    if ((e = static_cast<algo_entry*>(calloc(1, sizeof *e))) == nullptr)
      return QL_ENOMEM;
    e->kind = kind;
    e->flags = flags;
    e->n = n;
    e->k = k;
    choose(lt->h, e);
    // A failure to allocate is not an answer about the problem: retried.
    if (e->rc == QL_ENOMEM) {
      free(e);
      return QL_ENOMEM;
    }
    e->next = lt->algos;
    lt->algos = e;
  }
  *out = e;
  return 0;
}

bool flags_ok(int kind, int flags) {
  return kind == QL__BLASLT_E4M3
             ? (flags & ~(QL__BLASLT_FAST_ACCUM | QL__BLASLT_OUT_BF16)) == 0
             : kind == QL__BLASLT_I8 && flags == 0;
}

}  // namespace

int ql__blaslt_flags(void) {
  return ql__blaslt_load(nullptr) == 0 ? g_flags : 0;
}

int ql__blaslt_gemm(ql__blaslt* lt, int kind, int64_t n, int64_t m, int64_t k,
                    const void* w, int64_t ldw, const void* x, int64_t ldx,
                    void* acc, int64_t ldacc, void* stream) {
  return ql__blaslt_gemm_ex(lt, kind,
                            kind == QL__BLASLT_E4M3 ? ql__blaslt_flags() : 0,
                            n, m, k, w, ldw, x, ldx, acc, ldacc, stream);
}

int ql__blaslt_gemm_ex(ql__blaslt* lt, int kind, int flags, int64_t n,
                       int64_t m, int64_t k, const void* w, int64_t ldw,
                       const void* x, int64_t ldx, void* acc, int64_t ldacc,
                       void* stream) {
  // alpha and beta are of the scale type: f32 for FP8, int32 for IMMA.
  const float onef = 1.0f, zerof = 0.0f;
  const int32_t onei = 1, zeroi = 0;
  const bool i8 = kind == QL__BLASLT_I8;
  algo_entry* e;
  descs s;
  int rc;
  if (lt == nullptr || !flags_ok(kind, flags) || n < 16 || m < 1 ||
      k < 16 || n % 16 || k % 16 || ldw < k || ldx < k || ldacc < n ||
      ldw % 16 || ldx % 16 || ldacc % 16)
    return QL_EINVAL;
  if ((rc = lookup(lt, kind, flags, n, k, &e)) != 0) return rc;
  if (e->rc != 0) return e->rc;
  if ((rc = make_descs(kind, flags, n, m, k, ldw, ldx, ldacc, &s)) == 0) {
    // C = D with beta = 0: C is not read.
    rc = map_status(g_api.cublasLtMatmul(
        lt->h, s.op, i8 ? static_cast<const void*>(&onei) : &onef, w, s.a, x,
        s.b, i8 ? static_cast<const void*>(&zeroi) : &zerof, acc, s.d, acc,
        s.d, &e->algo, nullptr, 0, static_cast<cudaStream_t>(stream)));
    put(&s);
  }
  // A refusal of this m is kept as the answer for (kind, flags, n, k), as
  // the heuristic's is: the caller's fallback then takes every m of the
  // shape, not this one alone, so that a row's result does not depend on
  // the size of its batch.
  if (rc == QL_ENOTSUP) e->rc = rc;
  return rc;
}

int ql__blaslt_algo_name(ql__blaslt* lt, int kind, int flags, int64_t n,
                         int64_t k, char* buf, size_t len) {
  // The configuration attributes read, each 4 bytes (int32_t or
  // uint32_t as cublasLt.h types them); one that cannot be read is "?".
  static const struct {
    const char* name;
    cublasLtMatmulAlgoConfigAttributes_t attr;
  } kAttrs[] = {{"algo", CUBLASLT_ALGO_CONFIG_ID},
                {"tile", CUBLASLT_ALGO_CONFIG_TILE_ID},
                {"stages", CUBLASLT_ALGO_CONFIG_STAGES_ID},
                {"splitk", CUBLASLT_ALGO_CONFIG_SPLITK_NUM}};
  algo_entry* e;
  int rc;
  if (lt == nullptr || buf == nullptr || len == 0 || !flags_ok(kind, flags) ||
      n < 16 || k < 16 || n % 16 || k % 16)
    return QL_EINVAL;
  if ((rc = lookup(lt, kind, flags, n, k, &e)) != 0) return rc;
  if (e->rc != 0) return e->rc;
  size_t at = 0;
  buf[0] = 0;
  for (const auto& a : kAttrs) {
    uint32_t v = 0;
    size_t got = 0;
    const bool ok = g_api.cublasLtMatmulAlgoConfigGetAttribute(
                        &e->algo, a.attr, &v, sizeof v, &got) ==
                        CUBLAS_STATUS_SUCCESS &&
                    got == sizeof v;
    int w = ok ? snprintf(buf + at, len - at, "%s%s %u", at ? " " : "",
                          a.name, unsigned(v))
               : snprintf(buf + at, len - at, "%s%s ?", at ? " " : "",
                          a.name);
    if (w < 0 || size_t(w) >= len - at) break;
    at += size_t(w);
  }
  return 0;
}
