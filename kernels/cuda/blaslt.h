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

// Flags of ql__blaslt_gemm_ex, for QL__BLASLT_E4M3 only (QL_EINVAL with
// I8).
enum {
  // CUBLASLT_MATMUL_DESC_FAST_ACCUM = 1: the FP8 tensor cores' partial
  // sums are not promoted to f32 periodically ("fast accumulation").
  QL__BLASLT_FAST_ACCUM = 1,
  // acc is bf16, rounded by cuBLASLt (C and D CUDA_R_16BF): for probes
  // of the hardware (tests/bench/fp8_probe.cpp), never the backend's
  // product, whose epilogue needs the f32 sum.
  QL__BLASLT_OUT_BF16 = 2
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
// sums are promoted to f32 periodically) unless QL_CUDA_F8_FAST_ACCUM=1
// asks for it (ql__blaslt_flags()). Even so the FP8 tensor cores do not
// sum in f32 between promotions (README, "CUDA backend";
// tests/bench/fp8_probe.cpp measures how).
//
// Enqueued on stream. 0; QL_EINVAL for arguments outside the above;
// QL_ENOTSUP when cuBLASLt offers no algorithm for the problem or refuses
// it (the caller may fall back): kept for (kind, flags, n, k), so that
// every later call of the shape gets it too, whatever its m; QL_ENOMEM;
// QL_EDEVICE when the launch failed (the caller asks the runtime why).
//
// FP8 runs with the flags of ql__blaslt_flags(): fast accumulation off
// unless the environment asks for it.
int ql__blaslt_gemm(ql__blaslt* lt, int kind, int64_t n, int64_t m, int64_t k,
                    const void* w, int64_t ldw, const void* x, int64_t ldx,
                    void* acc, int64_t ldacc, void* stream);

// ql__blaslt_gemm with explicit QL__BLASLT_* flags (0 for I8); the
// algorithm is chosen once per (kind, flags, n, k) in the same way.
int ql__blaslt_gemm_ex(ql__blaslt* lt, int kind, int flags, int64_t n,
                       int64_t m, int64_t k, const void* w, int64_t ldw,
                       const void* x, int64_t ldx, void* acc, int64_t ldacc,
                       void* stream);

// The flags ql__blaslt_gemm uses for FP8, read once from the environment
// when the library is loaded: QL__BLASLT_FAST_ACCUM where
// QL_CUDA_F8_FAST_ACCUM=1, else 0 (the default: partial sums promoted to
// f32 periodically, the more accurate mode). A knob for measuring the
// hardware's accumulation on a GPU (README, "CUDA backend").
int ql__blaslt_flags(void);

// Writes into buf (len bytes, NUL-terminated, truncated to fit) a short
// description of the algorithm chosen for (kind, flags, n, k), choosing
// it if needed: "algo 23 tile 18 stages 11 splitk 1", as cuBLASLt's
// algorithm configuration reports it. 0; the codes of ql__blaslt_gemm_ex.
int ql__blaslt_algo_name(ql__blaslt* lt, int kind, int flags, int64_t n,
                         int64_t k, char* buf, size_t len);

// The token count of the problem the algorithm is chosen for.
enum { QL__BLASLT_REF_TOKENS = 256 };

#endif  // QL_CUDA_BLASLT_H
