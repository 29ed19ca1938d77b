// blaslt.h - the CUDA backend's cuBLASLt layer: the few things backend.cpp
// asks of cuBLASLt, behind an interface with no cuBLASLt type in it.
//
// Where cuBLASLt comes from. In the GPU build, libcublasLt.so.13 is loaded
// with dlopen() the first time ql__blaslt_load() runs: there is no
// link-time dependency, and a machine without the library (or with another
// major version) simply has no cuBLASLt path; ql__blaslt_load() says why,
// and the backend's supports() declines the ops that need it, so the
// generic fallback runs. In the emulated build (QL_CUDA_EMU) the same code
// calls the reference cuBLASLt of emu_blaslt.h on host memory, so this
// layer's descriptors, algorithm choice and calls run in `make check`.
//
// Host code only; pointers are device pointers, streams travel as void*
// (a cudaStream_t), as in ql_cuda.h.
#ifndef QL_CUDA_BLASLT_H
#define QL_CUDA_BLASLT_H

#include <stddef.h>
#include <stdint.h>

// One device's cuBLASLt handle and its cache of chosen algorithms. Made on
// the current device; not thread-safe: the backend uses it under its
// device's lock.
struct ql__blaslt;

// Loads cuBLASLt once per process; later calls return the first answer.
// 0, or QL_ENOTSUP with *why (may be NULL) set to a static sentence for the
// log ("libcublasLt.so.13 not found", ...).
int ql__blaslt_load(const char** why);

// The library's version as cublasLtGetVersion() gives it (130100 for
// 13.1.0), or 0 when it is not loaded.
size_t ql__blaslt_version(void);

// A handle on the current device in *out, which the caller frees with
// ql__blaslt_free(). 0, QL_ENOTSUP (no library), QL_ENOMEM, or QL_EDEVICE
// (the library could not start on this device).
int ql__blaslt_create(ql__blaslt** out);

// Frees lt and what it holds; NULL is fine.
void ql__blaslt_free(ql__blaslt* lt);

// Values of the kind argument of ql__blaslt_gemm.
enum {
  QL__BLASLT_E4M3 = 1,  // FP8: e4m3 x e4m3 -> f32 (CUBLAS_COMPUTE_32F)
  QL__BLASLT_I8 = 2     // IMMA: int8 x int8 -> int32 (CUBLAS_COMPUTE_32I)
};

// The unscaled product of an activation-quantized path:
//   acc[j, i] = Σk x[j, k]·w[i, k]
// for i < n, j < m; w [n, ldw] and x [m, ldx] are codes of the kind, row
// major, acc [m, ldacc] f32 (E4M3: e4m3 values, exact products summed in
// f32) or int32 (I8: exact, wrapping as the GPU's int32 sums do; the caller
// bounds K). n and k must be multiples of 16 and ldw, ldx >= k, ldacc >= n
// multiples of 16 (cuBLASLt's FP8 requirements, which also meet IMMA's:
// the caller pads with zero codes, which add nothing); pointers 16-byte
// aligned.
//
// Batch invariance: the algorithm is chosen once per (kind, n, k) from the
// heuristic's answer for a fixed problem of QL__BLASLT_REF_TOKENS tokens
// (not for m), restricted to algorithms without a split-K reduction, with
// split-K set to 1 explicitly and no workspace. Each element is then
// computed by one kernel configuration with one K order whatever m is, so
// a row's result does not depend on the rows beside it (IMMA's int32 sums
// would be exact in any order; it is chosen the same way). FP8 fast
// accumulation stays off (CUBLASLT_MATMUL_DESC_FAST_ACCUM = 0: partial
// sums are promoted to f32).
//
// Enqueued on stream. 0; QL_EINVAL for arguments outside the above;
// QL_ENOTSUP when cuBLASLt offers no algorithm for the problem (the caller
// may fall back); QL_ENOMEM; QL_EDEVICE when the launch failed (the caller
// asks the runtime why).
int ql__blaslt_gemm(ql__blaslt* lt, int kind, int64_t n, int64_t m, int64_t k,
                    const void* w, int64_t ldw, const void* x, int64_t ldx,
                    void* acc, int64_t ldacc, void* stream);

// The token count of the problem the algorithm is chosen for.
enum { QL__BLASLT_REF_TOKENS = 256 };

#endif  // QL_CUDA_BLASLT_H
