// ql_cuda.h - what the CUDA backend's host code (backend.cpp) knows of the
// kernels: the device layout that repack builds and the launchers. Plain
// C++ with no CUDA type, so that host code compiles with the host compiler
// whichever way the kernels were built (nvcc, or g++ against emu.h).
//
// All pointers are device pointers (in the emulated build, device memory is
// host memory). Streams travel as void* (a cudaStream_t).
#ifndef QL_CUDA_H
#define QL_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

// A weight in the layout the WO kernels read ("cuda-1"). Rows of packed
// codes start 16-byte aligned and are zero-padded to a multiple of 16 bytes,
// so a 128-bit load never straddles a row end however ragged K is, and a
// padding code is 0 (it adds x·0 where x is staged as 0). Scale and zero are
// transposed to [N, G] (a warp reads its own row's groups contiguously) and
// widened to f32 (exact from f16 and bf16): the kernels read 2-byte ones
// slower than the 6 % more bytes cost (backend.cpp, wide_scales();
// QL_CUDA_WIDE_SCALES=0 keeps their dtype).
struct ql__cuda_wo {
  int format;        // ql_format
  int sdt;           // ql_dtype of scale[] and zero[]
  int64_t n, k;
  int64_t groups;    // G = ceil(K / gs); 1 for q8c and f8r
  uint32_t gs;       // group (q4g) or block (q8b) length; K for q8c, f8r
  int64_t ldq;       // bytes between rows of q, a multiple of 16
  const uint8_t* q;  // [n, ldq]
  const void* scale; // [n, groups] in sdt
  const void* zero;  // [n, groups] in sdt, or NULL (q8c, f8r, symmetric q8b)
  const float* bias; // [n], or NULL
  int sms;           // multiprocessors of the device the layout lives on,
                     // which sizes the streaming kernel's persistent grid;
                     // 0: unknown (one block per 16 rows of W)
};

// The kernels' view of a layout that the backend's repack made (its
// ql_repack_args.packed) and, in *bytes (may be NULL), the layout's size
// (what a kernel reads; the allocation around it may be larger, rounded to
// the driver's granularity): for callers that launch the kernels
// themselves (qlinear-bench on a GPU). NULL for NULL.
const ql__cuda_wo* ql__cuda_packed_view(const void* packed, size_t* bytes);

// Bytes of codes in one canonical row of a weight of format f (ceil(K/2)
// for q4g, K otherwise), before padding.
int64_t ql__cuda_row_bytes(int format, int64_t k);

// The kernels of ql__cuda_linear_wo. STREAM, the default, is the
// tensor-core kernel for q4g with f16 or bf16 x where K and the group
// length are multiples of 128 (its own reduction order), and elsewhere the
// streaming kernel (up to 16 rows of x per pass over the weight, on a
// persistent grid sized by ql__cuda_wo.sms). SIMT is the streaming kernel
// everywhere, TILED the same on one block per 16 rows of W, WIDE the same
// with one step of loads in flight and three blocks per SM at one or two
// rows of x, LEGACY the kernel with one block row per row of x; those four
// give the same bytes, and are kept to be timed against each other on a
// GPU.
enum {
  QL__CUDA_WO_STREAM = 0,
  QL__CUDA_WO_LEGACY = 1,
  QL__CUDA_WO_TILED = 2,
  QL__CUDA_WO_WIDE = 3,
  QL__CUDA_WO_SIMT = 4
};

// The kernel that QL_CUDA_WO_KERNEL in the environment asks for ("legacy",
// "tiled", "wide", "stream"; anything else, or unset: the default), read
// once (linear_wo.cu): the backend and mapped launches both ask it.
int ql__cuda_wo_kernel(void);

// y[m, n] = x[m, k]·dequant(W)ᵀ (+ bias) for every row of x with kernel
// (QL__CUDA_WO_*); x and y in dtype dt. x must hold finite values only (the
// caller checks: see ql__cuda_check_finite). Enqueued on stream; returns
// nothing to wait for. scratch: ql__cuda_linear_wo_scratch(w, m) bytes of
// device memory (NULL when that is 0), where split-K keeps its partial
// sums (the same for both kernels).
void ql__cuda_linear_wo(const ql__cuda_wo* w, int kernel, int dt,
                        const void* x, int64_t m, void* y, float* scratch,
                        void* stream);

// Bytes of scratch ql__cuda_linear_wo needs for m rows of x: the partial
// sums of split-K, which narrow weights use (0 when they do not split).
size_t ql__cuda_linear_wo_scratch(const ql__cuda_wo* w, int64_t m);

// dst[0, n) = src[0, n) by a kernel on stream: each side is device memory
// or mapped host memory (pinned memory of cudaHostAlloc, or the device
// address of a range registered with cudaHostRegisterMapped). Enqueued;
// nothing to wait for.
void ql__cuda_copy(void* dst, const void* src, size_t n, void* stream);

// Sets *bad (device int) to non-zero when one of the n f32/f16/bf16
// values of x (dtype dt) is NaN or ±Inf; *bad must be 0 before.
void ql__cuda_check_finite(int dt, const void* x, int64_t n, int* bad,
                           void* stream);

// Values of the kind argument of ql__cuda_quantize_rows.
enum { QL__CUDA_QROWS_I8 = 1, QL__CUDA_QROWS_E4M3 = 2 };

// Per-row activation quantization with the rule of ql_quantize_rows_i8_src
// (kind I8: int8 codes, gs the group length of gsum, gsum may be NULL) or
// ql_quantize_rows_e4m3_src (kind E4M3: e4m3 codes, gsum NULL), bit for bit.
// x [m, k] f32 holds values of dtype src; row r of the codes starts at
// xq + r·ldxq (ldxq >= k; what lies past k in a row is left alone).
// status [m] (device) receives per row 0, or the first offending value's
// kind at its index as
// (index << 2) | 1 for NaN/Inf and | 2 for a value src cannot hold, so that
// the caller fails the call as the reference would.
void ql__cuda_quantize_rows(int kind, int src, const float* x, int64_t m,
                            int64_t k, int64_t gs, void* xq, int64_t ldxq,
                            float* sx, int32_t* gsum, int64_t* status,
                            void* stream);

// out[i] = x[i] widened to f32, for the n values of x (dtype dt): what
// ql__cuda_quantize_rows reads.
void ql__cuda_widen_f32(int dt, const void* x, int64_t n, float* out,
                        void* stream);

// The AQ product (DESIGN §4) of a q8c or q4g weight w on m activation rows
// already quantized by ql__cuda_quantize_rows with kind I8: xq [m, k] int8,
// sx [m], and for q4g gsum [m, groups] (gs = w->gs; NULL for q8c). y [m, n]
// in dtype dt: q8c y = Σk xq·wq · (sx·sw) (+ bias), which needs
// k <= QL_AQ_Q8C_MAX_K; q4g y = sx·Σg (scale·Σk∈g xq·q + zero·gsum) (+ bias).
// Enqueued on stream.
void ql__cuda_linear_aq(const ql__cuda_wo* w, const int8_t* xq,
                        const float* sx, const int32_t* gsum, int64_t m,
                        int dt, void* y, void* stream);

// The epilogue of an activation-quantized product made by cuBLASLt
// (blaslt.h), acc [m, ldacc] = Σk xq·wq, f32 (f8r: FP8 GEMM) or int32
// (acc_i32 non-zero; q8c: IMMA): for a weight w with one scale per row,
//   y[r, c] = f32(acc[r, c])·(sx[r]·sw[c]) (+ bias[c])
// in f32, each step rounded once in that order (the reference's for both
// formats, DESIGN §4), then rounded to dtype dt; y [m, w->n]. Enqueued on
// stream.
void ql__cuda_gemm_epilogue(const ql__cuda_wo* w, const void* acc,
                            int acc_i32, int64_t ldacc, const float* sx,
                            int64_t m, int dt, void* y, void* stream);

// The name the daemon gives a CUDA device (Hello, MapWeight), from its
// 16-byte UUID as nvidia-smi prints it:
// "cuda:GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (45 characters), into
// out (len bytes, truncated if shorter).
static inline void ql__cuda_device_name(const unsigned char* uuid, char* out,
                                        size_t len) {
  size_t at = size_t(snprintf(out, len, "cuda:GPU-"));
  for (int i = 0; i < 16 && at < len; i++)
    at += size_t(snprintf(out + at, len - at, "%s%02x",
                          i == 4 || i == 6 || i == 8 || i == 10 ? "-" : "",
                          unsigned(uuid[i])));
}

#endif  // QL_CUDA_H
