// emu_blaslt.h - the part of cuBLASLt that the CUDA backend uses
// (kernels/cuda/blaslt.cpp), as a reference implementation on host memory,
// so that the backend's cuBLASLt path runs in `make check` with the
// emulated runtime (emu_runtime.h) and no GPU (DESIGN §9). Names,
// signatures and numeric values are those of CUDA 13's cublasLt.h,
// cublas_api.h and library_types.h, so blaslt.cpp compiles against this
// header or the real ones unchanged; descriptors are opaque here, and only
// the attributes blaslt.cpp sets exist.
//
// What it does, from the cuBLAS documentation of CUDA 13
// (docs.nvidia.com/cuda/cublas, "Using the cuBLASLt API", cited by the
// section's title):
// - "cublasLtMatmul()": D = alpha·(op(A)·op(B)) + beta·C, matrices
//   column-major as their layouts say ("cublasLtMatrixLayoutCreate()"),
//   the products summed in the compute type (CUBLAS_COMPUTE_32F: f32;
//   CUBLAS_COMPUTE_32I: int32) and alpha, beta in the scale type (host
//   pointers). Three rows of its table of types are served: FP8, A and B
//   CUDA_R_8F_E4M3, C and D CUDA_R_32F or both CUDA_R_16BF (D rounded to
//   nearest even from the f32 result), scale CUDA_R_32F; and IMMA, A and
//   B CUDA_R_8I, C and D CUDA_R_32I, scale CUDA_R_32I. Their requirements
//   are checked as the documentation lists them: A transposed and B not
//   ("TN") for both; FP8: compute 32F and 16-byte alignment of pointers,
//   leading dimensions and the dimensions m and k; IMMA with the regular
//   column order: compute 32I, m, k and the leading dimensions multiples of
//   4, pointers 4-byte aligned. Anything else is
//   CUBLAS_STATUS_NOT_SUPPORTED. Scale pointers
//   (CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, B_...) are read in the scalar
//   mode (CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, a device float; unset:
//   1); the outer-vector mode is refused, as on every GPU but sm_90
//   ("cublasLtMatmulMatrixScale_t" and the architectures listed for each
//   mode).
// - The algorithm ("cublasLtMatmulAlgoConfigAttributes_t"): its
//   split-K count S cuts K into S contiguous parts of ceil(K/S) rounded up
//   to 16; each part is summed in increasing k from 0.0f, and the parts are
//   added in order. With S = 1 an output element is the plain f32 sum in
//   increasing k, whatever M is. IMMA sums are exact int32 (two's
//   complement), which no split changes.
// - "cublasLtMatmulAlgoGetHeuristic()" may, like the real one (whose
//   results carry a split-K count and a reduction scheme, and which
//   offers split-K where the output alone cannot fill the GPU), answer
//   with a split: here, for a problem with few output tiles
//   (128 x 128) against the GPU's 132 SMs and a long K, its first result
//   splits K (so the choice depends on the problem's n, the token count)
//   with the reduction scheme CUBLASLT_REDUCTION_SCHEME_INPLACE or, given
//   workspace, COMPUTE_TYPE; a preference's CUBLASLT_MATMUL_PREF_
//   REDUCTION_SCHEME_MASK and MAX_WORKSPACE_BYTES filter them out. A
//   caller that takes the heuristic's first answer for each M is therefore
//   not batch-invariant here either.
// - FP8 accumulation. By default the products (exact in f32) are summed
//   in f32, which is what the documentation's compute type says but not
//   what Hopper's FP8 tensor cores do: they align the products of one MMA
//   to the largest exponent and keep a limited number of bits (the
//   DeepSeek-V3 report: 14; SageAttention2: a 13-bit mantissa), and
//   cuBLASLt promotes the partial sums to f32 periodically unless
//   CUBLASLT_MATMUL_DESC_FAST_ACCUM is set ("intermediate results will not
//   periodically be promoted to a higher precision"). QL_EMU_FP8_ACC_BITS=B
//   (1..24) models that, pessimistically: within each part of K, every
//   QL_EMU_FP8_ACC_BLOCK (default 32) products are added to the
//   tensor-core partial sum with each addend (the partial sum included)
//   truncated toward -inf to a multiple of 2^(E+1-B), E the largest
//   addend's exponent, and the result truncated to B significant bits;
//   the partial sum is added (f32) to the part's sum and restarted every
//   QL_EMU_FP8_ACC_PROMOTE (default 128) products, never with fast
//   accumulation. tests/bench/fp8_probe measures B, the block and the
//   promotion interval on a real GPU: on an H200 (sm_90, cuBLASLt 13.1)
//   B = 14 with lost terms truncated toward zero, blocks of 32, promotion
//   every 128, which are the defaults (QL_EMU_FP8_ACC_BITS=0: exact f32).
// - A matmul is one launch on its stream (ql__emu_cuda_launch): it counts
//   as work of that device, and does not run on a failed or hung one
//   (CUBLAS_STATUS_EXECUTION_FAILED on a failed one, as a launch error is
//   reported). It runs at enqueue on the calling thread.
// - QL_EMU_CUBLASLT=0 (or ql_emu_blaslt_set_present(0)) makes
//   cublasLtCreate() fail with CUBLAS_STATUS_NOT_INITIALIZED, as on a
//   machine whose library cannot start; the backend must then decline.
// - QL_EMU_CUBLASLT_REFUSE_M=odd (or ql_emu_blaslt_set_refuse_odd(1))
//   makes cublasLtMatmul() refuse (CUBLAS_STATUS_NOT_SUPPORTED) a problem
//   whose B has an odd number of columns (the activations' rows), after
//   the heuristic answered for its own problem size: a refusal that
//   depends on M, which the caller must not let change a row's route.
//
// Every function is thread-safe.
#ifndef QL_CUDA_EMU_BLASLT_H
#define QL_CUDA_EMU_BLASLT_H

#include <stddef.h>
#include <stdint.h>

#include "emu_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- cublas_api.h
typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;

typedef enum {
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32I = 72
} cublasComputeType_t;

// ---- library_types.h
typedef enum cudaDataType_t {
  CUDA_R_32F = 0,
  CUDA_R_16F = 2,
  CUDA_R_8I = 3,
  CUDA_R_32I = 10,
  CUDA_R_16BF = 14,
  CUDA_R_8F_E4M3 = 28,
  CUDA_R_8F_E5M2 = 29
} cudaDataType;
typedef cudaDataType cudaDataType_t;

// ---- cublasLt.h: handles and semi-opaque structs
typedef struct cublasLtContext* cublasLtHandle_t;
typedef struct ql_emu_lt_layout* cublasLtMatrixLayout_t;
typedef struct ql_emu_lt_desc* cublasLtMatmulDesc_t;
typedef struct ql_emu_lt_pref* cublasLtMatmulPreference_t;

typedef struct {
  uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
} cublasLtMatmulHeuristicResult_t;

// Attributes (the ones the backend sets), with their value types.
typedef enum {
  CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,  // int32_t, read only
  CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,    // int32_t
  CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,  // int32_t: 0, host
  CUBLASLT_MATMUL_DESC_TRANSA = 3,        // int32_t
  CUBLASLT_MATMUL_DESC_TRANSB = 4,        // int32_t
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,      // uint32_t: 1, default
  CUBLASLT_MATMUL_DESC_A_SCALE_POINTER = 17,  // const void*
  CUBLASLT_MATMUL_DESC_B_SCALE_POINTER = 18,  // const void*
  CUBLASLT_MATMUL_DESC_FAST_ACCUM = 25,       // int8_t
  CUBLASLT_MATMUL_DESC_A_SCALE_MODE = 31,     // int32_t
  CUBLASLT_MATMUL_DESC_B_SCALE_MODE = 32      // int32_t
} cublasLtMatmulDescAttributes_t;

typedef enum {
  CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F = 0,
  CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F = 3
} cublasLtMatmulMatrixScale_t;

typedef enum {
  CUBLASLT_EPILOGUE_DEFAULT = 1
} cublasLtEpilogue_t;

typedef enum {
  CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,  // uint64_t
  CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = 3  // uint32_t
} cublasLtMatmulPreferenceAttributes_t;

typedef enum {
  CUBLASLT_REDUCTION_SCHEME_NONE = 0,
  CUBLASLT_REDUCTION_SCHEME_INPLACE = 1,
  CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE = 2,
  CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE = 4,
  CUBLASLT_REDUCTION_SCHEME_MASK = 0x7
} cublasLtReductionScheme_t;

typedef enum {
  CUBLASLT_ALGO_CONFIG_ID = 0,
  CUBLASLT_ALGO_CONFIG_TILE_ID = 1,
  CUBLASLT_ALGO_CONFIG_SPLITK_NUM = 2,        // int32_t
  CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME = 3,  // uint32_t
  CUBLASLT_ALGO_CONFIG_STAGES_ID = 6          // uint32_t
} cublasLtMatmulAlgoConfigAttributes_t;

// ---- cublasLt.h: functions
size_t cublasLtGetVersion(void);
cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle);
const char* cublasLtGetStatusName(cublasStatus_t status);

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout,
                                          cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                        cublasComputeType_t computeType,
                                        cudaDataType_t scaleType);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);
cublasStatus_t cublasLtMatmulDescSetAttribute(
    cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
    const void* buf, size_t sizeInBytes);

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
    const void* buf, size_t sizeInBytes);

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
    cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
    cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
    int* returnAlgoCount);
cublasStatus_t cublasLtMatmulAlgoConfigSetAttribute(
    cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr,
    const void* buf, size_t sizeInBytes);
cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(
    const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr,
    void* buf, size_t sizeInBytes, size_t* sizeWritten);

cublasStatus_t cublasLtMatmul(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
    const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
    const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
    const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
    cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
    void* workspace, size_t workspaceSizeInBytes, cudaStream_t stream);

// ---- the emulation's own controls, for tests
// Whether cublasLtCreate() succeeds (1, the default unless QL_EMU_CUBLASLT
// is "0") or fails as a library that cannot start (0).
void ql_emu_blaslt_set_present(int present);
// Whether cublasLtMatmul() refuses a B of an odd number of columns (1;
// the default 0 unless QL_EMU_CUBLASLT_REFUSE_M is "odd").
void ql_emu_blaslt_set_refuse_odd(int on);
// Matmuls that ran since the start.
long ql_emu_blaslt_matmuls(void);
// The FP8 accumulation model (see the top of this file): bits 0 (exact
// f32, the default) or 1..24, block products per alignment (1..256,
// default 32), promotion to f32 every `promote` products (default 128;
// never with fast accumulation). Out-of-range values take the defaults.
void ql_emu_blaslt_set_fp8_acc(int bits, long block, long promote);

#ifdef __cplusplus
}
#endif
#endif  // QL_CUDA_EMU_BLASLT_H
