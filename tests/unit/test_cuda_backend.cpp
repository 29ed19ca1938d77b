// test_cuda_backend.cpp - the CUDA backend's host side on the emulated
// runtime (kernels/cuda/emu_runtime.h): host memory registered with
// host_register is read and written in place with the bytes of staging,
// by a kernel through its mapped address up to QL_CUDA_SM_COPY_MAX bytes
// and by DMA past it (or with the variable 0), so that a call of a decode
// batch makes no copy-engine work at all, and runs on the lane's stream of
// the greatest priority; a kernel that touches host memory the GPU does
// not map faults the device; a call refused for NaN/Inf leaves a
// registered y untouched; a layout made
// for a call is on the device before the call's kernels read it, even
// when the runtime's copies land late; each wait mode of QL_CUDA_WAIT
// completes a call and still fails a hung launch after the kernel
// timeout. Built again with QL_MUT_LAYOUT_NO_SYNC (mutant_layout_sync),
// it must fail. Besides:
// - q8c activation-quantized on x and y in device memory from
//   QL_CUDA_IMMA_MIN_ROWS rows runs on our kernel, with the bytes of the
//   host call on cuBLASLt's IMMA.
// - f8r activation-quantized where cuBLASLt refuses a matmul at some M
//   runs every M on the generic op.
// - A failed device_info leaves no error behind for the next op.
//
// Each case runs in a child process: QL_CUDA_WAIT is read once per
// process, and the emulated kernels run on fiber stacks (see
// test_cuda_daemon.c on why a child leaves with _exit()).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "emu_blaslt.h"
#include "emu_runtime.h"
#include "ql_cuda.h"
#include "ql_kernels.h"
#include "registry.h"

namespace {

int g_fail;

#define CHECK(c)                                               \
  do {                                                         \
    if (!(c)) {                                                \
      fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #c); \
      _exit(1);                                                \
    }                                                          \
  } while (0)

// Runs f in a child with the environment var=val (val NULL: unset);
// counts a failure when it does not exit 0.
template <typename F>
void in_child(const char* name, const char* var, const char* val, F f) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    if (var != nullptr) {
      if (val != nullptr)
        setenv(var, val, 1);
      else
        unsetenv(var);
    }
    ql_emu_cuda_reset();
    f();
    _exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  bool ok = pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", name, var ? " " : "",
         var == nullptr ? "" : val != nullptr ? val : "(unset)");
  if (!ok) g_fail++;
}

const ql_backend* cuda() {
  const ql_backend* b = ql_backend_find("cuda");
  CHECK(b != nullptr && b->host_register != nullptr &&
        b->host_unregister != nullptr);
  return b;
}

// Page-aligned memory of the process's own, as the daemon's regions are.
void* map(size_t n) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(p != MAP_FAILED);
  return p;
}

uint64_t g_seed = 12345;
float randn() {
  g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
  return float(int32_t(g_seed >> 33) % 2000) / 1000.0f;
}

struct layer {
  ql_qweight* q = nullptr;
  int64_t n, k;
};

layer make_layer(ql_format f, int64_t n, int64_t k) {
  layer l;
  l.n = n;
  l.k = k;
  float* w = static_cast<float*>(malloc(size_t(n * k) * sizeof(float)));
  float* b = static_cast<float*>(malloc(size_t(n) * sizeof(float)));
  CHECK(w != nullptr && b != nullptr);
  for (int64_t i = 0; i < n * k; i++) w[i] = randn();
  for (int64_t i = 0; i < n; i++) b[i] = randn();
  ql_quant_params p = {f, 32, 0, ql_dtype(0)};
  CHECK(ql_qweight_quantize(&p, n, k, QL_DTYPE_F32, w, b, &l.q) == 0);
  free(w);
  free(b);
  return l;
}

// Whether this process copies through kernels (QL_CUDA_SM_COPY_MAX unset:
// up to 1 MiB, more than any case here moves) or by DMA only ("0").
bool sm_copies() {
  const char* v = getenv("QL_CUDA_SM_COPY_MAX");
  return v == nullptr || strcmp(v, "0") != 0;
}

// Counters of the emulated runtime around one call.
struct counts {
  long dma, host, launches, hi;
  static counts now() {
    return {ql_emu_cuda_dma_copies(), ql_emu_cuda_host_copies(),
            ql_emu_cuda_launches(0), ql_emu_cuda_priority_launches(0)};
  }
};

// The launches of a call since c0 ran on the stream of the greatest
// priority exactly when it has at most 16 rows (a decode batch).
void check_stream(const counts& c0, int64_t m) {
  const counts c1 = counts::now();
  CHECK(c1.launches > c0.launches);
  CHECK(c1.hi - c0.hi == (m <= 16 ? c1.launches - c0.launches : 0));
}

// x and y staged (malloc'd, not registered) against x and y in registered
// memory: the same status and bytes. With kernel copies, neither call
// makes copy-engine work; by DMA, the registered call's copies go
// straight to and from that memory (the runtime counts them).
void same_bytes(ql_op op, ql_format f, int64_t m, int64_t n, int64_t k,
                const char* want_impl) {
  const ql_backend* b = cuda();
  const bool sm = sm_copies();
  layer l = make_layer(f, n, k);
  const size_t xb = size_t(m * k) * sizeof(float),
               yb = size_t(m * n) * sizeof(float);
  float* xs = static_cast<float*>(malloc(xb));
  float* ys = static_cast<float*>(malloc(yb));
  const size_t len = ((xb + yb) | 4095) + 1;
  unsigned char* reg = static_cast<unsigned char*>(map(len));
  float* xr = reinterpret_cast<float*>(reg);
  float* yr = reinterpret_cast<float*>(reg + xb);
  CHECK(xs != nullptr && ys != nullptr);
  for (int64_t i = 0; i < m * k; i++) xs[i] = xr[i] = randn();
  const char* impl = nullptr;
  counts c0 = counts::now();
  CHECK(ql_run_linear(b, op, l.q, nullptr, QL_DTYPE_F32, xs, m, ys, &impl) ==
        0);
  if (impl == nullptr || strcmp(impl, want_impl) != 0)
    fprintf(stderr, "ran on %s, not %s\n", impl ? impl : "nothing",
            want_impl);
  CHECK(impl != nullptr && strcmp(impl, want_impl) == 0);
  check_stream(c0, m);
  CHECK(ql_emu_cuda_host_copies() == 0);
  // Staged: x in, the flag (and AQ's verdicts) and y out.
  if (sm)
    CHECK(ql_emu_cuda_dma_copies() == c0.dma);
  else
    CHECK(ql_emu_cuda_dma_copies() - c0.dma >= 3);
  CHECK(b->host_register(reg, len) == 0);
  CHECK(ql_emu_cuda_host_ranges() == 1);
  // A second registration of the range, or of part of it, is refused.
  CHECK(b->host_register(reg, len) == QL_EINVAL);
  CHECK(b->host_register(reg + 64, 64) == QL_EINVAL);
  c0 = counts::now();
  CHECK(ql_run_linear(b, op, l.q, nullptr, QL_DTYPE_F32, xr, m, yr, &impl) ==
        0);
  CHECK(strcmp(impl, want_impl) == 0);
  CHECK(memcmp(ys, yr, yb) == 0);
  check_stream(c0, m);
  // By DMA, x in; y out in the same wait (small) or after it (large): one
  // each.
  const long want = sm ? 0 : 2 - (yb < (size_t(256) << 10));
  CHECK(ql_emu_cuda_host_copies() == want);
  if (sm) CHECK(ql_emu_cuda_dma_copies() == c0.dma);
  b->host_unregister(reg);
  CHECK(ql_emu_cuda_host_ranges() == 0);
  memset(yr, 0, yb);
  CHECK(ql_run_linear(b, op, l.q, nullptr, QL_DTYPE_F32, xr, m, yr, &impl) ==
        0);
  CHECK(memcmp(ys, yr, yb) == 0);
  CHECK(ql_emu_cuda_host_copies() == want);
  munmap(reg, len);
  free(xs);
  free(ys);
  ql_qweight_free(l.q);
}

// quantize_rows on the backend: the reference's bytes, and its copies go
// as a linear call's do (move()): with kernel copies, none on the copy
// engines; by DMA, x in and the four results out.
void qrows_copies() {
  const ql_backend* b = cuda();
  const bool sm = sm_copies();
  const int64_t m = 3, k = 160;
  const uint32_t gs = 32;
  const ql_kernel_impl* im =
      ql_dispatch(b, QL_OP_QUANTIZE_ROWS, QL_FORMAT_Q8C, QL_DTYPE_F32, m, 1, k);
  CHECK(im != nullptr && strncmp(im->name, "cuda.", 5) == 0);
  float x[m * k], sx[m], sx_ref[m];
  int8_t xq[m * k], xq_ref[m * k];
  int32_t gsum[m * 5], gsum_ref[m * 5];
  for (int64_t i = 0; i < m * k; i++) x[i] = randn();
  CHECK(ql_quantize_rows_i8_src(QL_DTYPE_F32, x, m, k, gs, xq_ref, sx_ref,
                                gsum_ref) == 0);
  ql_qrows_args a = {QL_QROWS_I8, x, m, k, gs, xq, sx, gsum, QL_DTYPE_F32};
  const counts c0 = counts::now();
  CHECK(im->fn.quantize_rows(&a) == 0);
  CHECK(memcmp(xq, xq_ref, sizeof xq) == 0);
  CHECK(memcmp(sx, sx_ref, sizeof sx) == 0);
  CHECK(memcmp(gsum, gsum_ref, sizeof gsum) == 0);
  check_stream(c0, m);
  if (sm)
    CHECK(ql_emu_cuda_dma_copies() == c0.dma);
  else
    CHECK(ql_emu_cuda_dma_copies() - c0.dma == 5);
}

// A kernel copy to host memory that the GPU does not map (neither pinned
// nor registered as mapped) faults the device, as on a GPU; one to pinned
// memory copies the bytes.
void unmapped_faults() {
  const ql_backend* b = cuda();
  layer l = make_layer(QL_FORMAT_Q4G, 32, 64);
  float x[64], y[32];
  for (float& v : x) v = randn();
  CHECK(ql_run_linear(b, QL_OP_LINEAR_WO, l.q, nullptr, QL_DTYPE_F32, x, 1, y,
                      nullptr) == 0);
  cudaStream_t st;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
  void *pinned = nullptr, *dev = nullptr;
  CHECK(cudaMallocHost(&pinned, 4096) == cudaSuccess);
  CHECK(cudaMalloc(&dev, 4096) == cudaSuccess);
  memset(pinned, 0x5a, 4096);
  ql__cuda_copy(dev, pinned, 4096, st);
  CHECK(cudaGetLastError() == cudaSuccess);
  memset(pinned, 0, 4096);
  ql__cuda_copy(pinned, dev, 4093, st);
  CHECK(cudaStreamSynchronize(st) == cudaSuccess);
  const unsigned char* pb = static_cast<const unsigned char*>(pinned);
  CHECK(pb[0] == 0x5a && pb[4092] == 0x5a && pb[4093] == 0);
  ql__cuda_copy(dev, x, sizeof x, st);  // x: the stack, not mapped
  CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
  CHECK(ql_run_linear(b, QL_OP_LINEAR_WO, l.q, nullptr, QL_DTYPE_F32, x, 1, y,
                      nullptr) == QL_EDEVICE);
  ql_qweight_free(l.q);
}

// A NaN in a registered x: QL_ENONFINITE, and the registered y keeps every
// byte it had, small (staged) or large (copied in place).
void untouched(ql_op op, ql_format f, int64_t m, int64_t n, int64_t k) {
  const ql_backend* b = cuda();
  layer l = make_layer(f, n, k);
  const size_t xb = size_t(m * k) * sizeof(float),
               yb = size_t(m * n) * sizeof(float);
  const size_t len = ((xb + yb) | 4095) + 1;
  unsigned char* reg = static_cast<unsigned char*>(map(len));
  float* xr = reinterpret_cast<float*>(reg);
  unsigned char* yr = reg + xb;
  for (int64_t i = 0; i < m * k; i++) xr[i] = randn();
  xr[(m - 1) * k + k / 2] = NAN;
  memset(yr, 0xab, yb);
  CHECK(b->host_register(reg, len) == 0);
  CHECK(ql_run_linear(b, op, l.q, nullptr, QL_DTYPE_F32, xr, m, yr,
                      nullptr) == QL_ENONFINITE);
  for (size_t i = 0; i < yb; i++) CHECK(yr[i] == 0xab);
  // The lane is sound afterwards: a finite x goes through.
  xr[(m - 1) * k + k / 2] = 1.0f;
  CHECK(ql_run_linear(b, op, l.q, nullptr, QL_DTYPE_F32, xr, m, yr,
                      nullptr) == 0);
  CHECK(yr[0] != 0xab || yr[1] != 0xab || yr[2] != 0xab || yr[3] != 0xab);
  b->host_unregister(reg);
  munmap(reg, len);
  ql_qweight_free(l.q);
}

// With late copies on (the emulated runtime lets a cudaMemcpy from
// pageable memory land after it returns, as CUDA may), a call whose layout
// the backend makes just before its launch (no layout given) has the bytes
// of the same call with copies landing at once: the backend waits for its
// layout before a lane's stream reads it.
void late_layout(ql_op op, ql_format f, int64_t m, int64_t n, int64_t k) {
  const ql_backend* b = cuda();
  layer l = make_layer(f, n, k);
  const size_t xb = size_t(m * k) * sizeof(float),
               yb = size_t(m * n) * sizeof(float);
  float* x = static_cast<float*>(malloc(xb));
  float* y = static_cast<float*>(malloc(yb));
  float* want = static_cast<float*>(malloc(yb));
  CHECK(x != nullptr && y != nullptr && want != nullptr);
  for (int64_t i = 0; i < m * k; i++) x[i] = randn();
  ql_emu_cuda_late_copies(0);
  CHECK(ql_run_linear(b, op, l.q, nullptr, QL_DTYPE_F32, x, m, want,
                      nullptr) == 0);
  ql_emu_cuda_late_copies(1);
  for (int i = 0; i < 3; i++) {
    memset(y, 0xFF, yb);
    CHECK(ql_run_linear(b, op, l.q, nullptr, QL_DTYPE_F32, x, m, y,
                        nullptr) == 0);
    CHECK(memcmp(y, want, yb) == 0);
  }
  free(x);
  free(y);
  free(want);
  ql_qweight_free(l.q);
}

// q8c activation-quantized with x and y in device memory (a CUDA IPC
// request's), here from QL_CUDA_IMMA_MIN_ROWS (16) rows, where host
// tensors run on cuBLASLt's IMMA, which reads host memory only: the call
// runs on our kernel, which reads device memory, with the bytes of the
// host call (int32 sums are exact, the epilogues the same), whether y is
// in device memory or not.
void dev_aq_q8c(int64_t m) {
  const ql_backend* b = cuda();
  layer l = make_layer(QL_FORMAT_Q8C, 96, 128);
  const size_t xb = size_t(m * l.k) * sizeof(float),
               yb = size_t(m * l.n) * sizeof(float);
  float* x = static_cast<float*>(malloc(xb));
  float* want = static_cast<float*>(malloc(yb));
  float* got = static_cast<float*>(malloc(yb));
  CHECK(x != nullptr && want != nullptr && got != nullptr);
  for (int64_t i = 0; i < m * l.k; i++) x[i] = randn();
  const char* impl = nullptr;
  CHECK(ql_run_linear(b, QL_OP_LINEAR_AQ, l.q, nullptr, QL_DTYPE_F32, x, m,
                      want, &impl) == 0);
  CHECK(impl != nullptr &&
        strcmp(impl, m >= 16 ? "cuda.cublaslt.linear_aq" : "cuda.linear_aq") ==
            0);
  void *dx = nullptr, *dy = nullptr;
  CHECK(cudaMalloc(&dx, xb) == cudaSuccess);
  CHECK(cudaMalloc(&dy, yb) == cudaSuccess);
  CHECK(cudaMemcpy(dx, x, xb, cudaMemcpyHostToDevice) == cudaSuccess);
  const unsigned wheres[] = {QL_LINEAR_X_DEVICE | QL_LINEAR_Y_DEVICE,
                             QL_LINEAR_X_DEVICE};
  for (unsigned where : wheres) {
    const bool ydev = where & QL_LINEAR_Y_DEVICE;
    memset(got, 0, yb);
    CHECK(cudaMemsetAsync(dy, 0, yb, nullptr) == cudaSuccess);
    ql_linear_dev_args da = {
        {l.q, nullptr, QL_DTYPE_F32, dx, m, ydev ? dy : got, nullptr},
        where,
        nullptr};
    impl = nullptr;
    const int rc = ql_run_linear_dev(b, QL_OP_LINEAR_AQ, &da, &impl);
    if (rc != 0)
      fprintf(stderr, "M=%lld on device tensors: %d (%s)\n", (long long)m,
              rc, impl ? impl : "no implementation");
    CHECK(rc == 0);
    CHECK(strcmp(impl, "cuda.linear_aq") == 0);
    if (ydev)
      CHECK(cudaMemcpy(got, dy, yb, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(memcmp(got, want, yb) == 0);
  }
  CHECK(cudaFree(dx) == cudaSuccess && cudaFree(dy) == cudaSuccess);
  free(x);
  free(want);
  free(got);
  ql_qweight_free(l.q);
}

// f8r activation-quantized where cuBLASLt refuses a matmul after its
// heuristic chose an algorithm (the emulation refuses an odd token count,
// so M = 1, the first call): the refusal holds for the shape, so every M
// after it, those cuBLASLt would take too, runs on the generic op with its
// bytes, and no matmul runs. A row alone and in a batch give one result.
void f8r_refused() {
  const ql_backend* b = cuda();
  layer l = make_layer(QL_FORMAT_F8R, 64, 512);
  const int64_t mmax = 4;
  float x[mmax * 512], want[mmax * 64], y[mmax * 64];
  for (float& v : x) v = randn();
  CHECK(ql_linear_aq_ref(l.q, QL_DTYPE_F32, x, mmax, want) == 0);
  // The FP8 tensor cores' sums (the emulation's model of an H200), which
  // are not the generic op's: a row that took cuBLASLt would show.
  ql_emu_blaslt_set_fp8_acc(14, 32, 128);
  ql_emu_blaslt_set_refuse_odd(1);
  const long ran = ql_emu_blaslt_matmuls();
  const char* impl = nullptr;
  for (int64_t m = 1; m <= mmax; m++) {
    CHECK(ql_run_linear(b, QL_OP_LINEAR_AQ, l.q, nullptr, QL_DTYPE_F32, x, m,
                        y, &impl) == 0);
    CHECK(strcmp(impl, "cuda.cublaslt.linear_aq") == 0);
    if (memcmp(y, want, size_t(m * l.n) * sizeof(float)) != 0)
      fprintf(stderr, "M=%lld: not the bytes of the generic op\n",
              (long long)m);
    CHECK(memcmp(y, want, size_t(m * l.n) * sizeof(float)) == 0);
  }
  CHECK(ql_emu_blaslt_matmuls() == ran);
  ql_qweight_free(l.q);
}

// A device that cudaGetDeviceProperties cannot describe leaves no error
// behind for the next op of the thread to take for its own: the device in
// use stays in service.
void info_error_cleared() {
  const ql_backend* b = cuda();
  layer l = make_layer(QL_FORMAT_Q4G, 32, 64);
  float x[64], y[32];
  for (float& v : x) v = randn();
  int n = 0;
  CHECK(cudaGetDeviceCount(&n) == cudaSuccess && n >= 1);
  CHECK(b->device_bind(0) == 0);
  ql_device_desc desc;
  memset(&desc, 0, sizeof desc);
  CHECK(b->device_info(n, &desc) == QL_EDEVICE);  // one past the last
  CHECK(ql_run_linear(b, QL_OP_LINEAR_WO, l.q, nullptr, QL_DTYPE_F32, x, 1, y,
                      nullptr) == 0);
  char why[160] = "";
  CHECK(b->device_error(0, why, sizeof why) == 0);
  ql_qweight_free(l.q);
}

uint64_t now_ms() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1000000;
}

// The mode of QL_CUDA_WAIT completes a call whose kernels stay in flight
// for a while (QL_EMU_CUDA_KERNEL_MS, past auto's spin), several times on
// one lane; then a hung launch fails the call with QL_EDEVICE after the
// kernel timeout, not before and not much later, and the device says why.
void waits() {
  const ql_backend* b = cuda();
  layer l = make_layer(QL_FORMAT_Q4G, 32, 64);
  float x[2 * 64], y[2 * 32], want[2 * 32];
  for (float& v : x) v = randn();
  CHECK(ql_run_linear(b, QL_OP_LINEAR_WO, l.q, nullptr, QL_DTYPE_F32, x, 2,
                      want, nullptr) == 0);
  for (int i = 0; i < 3; i++) {
    memset(y, 0, sizeof y);
    uint64_t t0 = now_ms();
    CHECK(ql_run_linear(b, QL_OP_LINEAR_WO, l.q, nullptr, QL_DTYPE_F32, x, 2,
                        y, nullptr) == 0);
    CHECK(now_ms() - t0 >= 5);
    CHECK(memcmp(y, want, sizeof y) == 0);
  }
  ql_backend_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.kernel_timeout_ms = 300;
  CHECK(b->configure(&cfg) == 0);
  ql_emu_cuda_inject(0, 0, QL_EMU_FAULT_HANG);
  uint64_t t0 = now_ms();
  CHECK(ql_run_linear(b, QL_OP_LINEAR_WO, l.q, nullptr, QL_DTYPE_F32, x, 2, y,
                      nullptr) == QL_EDEVICE);
  uint64_t took = now_ms() - t0;
  CHECK(took >= 300 && took < 3000);
  char why[160] = "";
  CHECK(b->device_error(0, why, sizeof why) == QL_EDEVICE);
  CHECK(strstr(why, "did not finish within 300 ms") != nullptr);
  ql_qweight_free(l.q);
}

}  // namespace

int main() {
  // q8c batches of 16 rows and more on cuBLASLt's IMMA, whatever the
  // environment of `make check` asks of the other tests.
  setenv("QL_CUDA_IMMA_MIN_ROWS", "16", 1);
  // Copies by kernel (the default), then by DMA only.
  struct {
    const char* name;
    ql_op op;
    ql_format f;
    int64_t m, n, k;
    const char* impl;
  } const regs[] = {
      {"registered x/y: WO q4g, M=1", QL_OP_LINEAR_WO, QL_FORMAT_Q4G, 1, 96,
       128, "cuda.linear_wo"},
      {"registered x/y: WO q8c, large y", QL_OP_LINEAR_WO, QL_FORMAT_Q8C, 520,
       128, 32, "cuda.linear_wo"},
      {"registered x/y: AQ q4g, M=3", QL_OP_LINEAR_AQ, QL_FORMAT_Q4G, 3, 96,
       128, "cuda.linear_aq"},
      {"registered x/y: AQ q8c on cuBLASLt, large y", QL_OP_LINEAR_AQ,
       QL_FORMAT_Q8C, 520, 128, 32, "cuda.cublaslt.linear_aq"},
  };
  const char* copies[] = {nullptr, "0"};
  for (const char* c : copies) {
    for (const auto& r : regs)
      in_child(r.name, "QL_CUDA_SM_COPY_MAX", c,
               [&r] { same_bytes(r.op, r.f, r.m, r.n, r.k, r.impl); });
    in_child("quantize_rows: the reference's bytes, copies as linear's",
             "QL_CUDA_SM_COPY_MAX", c, qrows_copies);
  }
  in_child("a kernel copy to unmapped host memory faults", nullptr, nullptr,
           unmapped_faults);
  in_child("non-finite x: WO, small y untouched", nullptr, nullptr,
           [] { untouched(QL_OP_LINEAR_WO, QL_FORMAT_Q4G, 2, 64, 96); });
  in_child("non-finite x: WO, large y untouched", nullptr, nullptr,
           [] { untouched(QL_OP_LINEAR_WO, QL_FORMAT_Q8C, 520, 128, 32); });
  in_child("non-finite x: AQ, small y untouched", nullptr, nullptr,
           [] { untouched(QL_OP_LINEAR_AQ, QL_FORMAT_Q4G, 2, 64, 96); });
  in_child("non-finite x: AQ on cuBLASLt, large y untouched", nullptr,
           nullptr,
           [] { untouched(QL_OP_LINEAR_AQ, QL_FORMAT_Q8C, 520, 128, 32); });
  const int64_t dev_rows[] = {15, 16, 17, 64};
  for (int64_t m : dev_rows)
    in_child(m >= 16 ? "AQ q8c on device tensors from the IMMA rows"
                     : "AQ q8c on device tensors below the IMMA rows",
             nullptr, nullptr, [m] { dev_aq_q8c(m); });
  in_child("AQ f8r: a matmul cuBLASLt refuses holds for every M", nullptr,
           nullptr, f8r_refused);
  in_child("a failed device_info leaves no error behind", nullptr, nullptr,
           info_error_cleared);
  in_child("late layout copies: WO q8b asymmetric", nullptr, nullptr,
           [] { late_layout(QL_OP_LINEAR_WO, QL_FORMAT_Q8B, 1, 65, 256); });
  in_child("late layout copies: AQ q4g", nullptr, nullptr,
           [] { late_layout(QL_OP_LINEAR_AQ, QL_FORMAT_Q4G, 3, 40, 128); });
  setenv("QL_EMU_CUDA_KERNEL_MS", "5", 1);
  const char* modes[] = {"spin", "host", "nap", "auto", nullptr};
  for (const char* m : modes)
    in_child("wait mode: completes, and a hang times out:", "QL_CUDA_WAIT", m,
             waits);
  unsetenv("QL_EMU_CUDA_KERNEL_MS");
  if (g_fail) printf("%d failed\n", g_fail);
  return g_fail ? 1 : 0;
}
