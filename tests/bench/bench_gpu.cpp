// bench_gpu.cpp - `qlinear-bench --device cuda:<uuid>|cuda:N`: the memory
// bandwidth each CUDA kernel achieves against the device's peak (DESIGN
// §12, issue 9), for machines that have a GPU.
//
// Per kernel and shape: linear_wo for q4g, q8c, q8b and f8r at M = 1 (the
// decode GEMV, which should stream the weight at the memory's speed), and
// at --wo-m rows too when that is given (on the kernel QL_CUDA_WO_KERNEL
// selects: ql__cuda_wo_kernel()),
// linear_aq for q8c and q4g and quantize_rows at --aq-m rows. A sample is
// `iters` launches between two CUDA events on the backend's own kernels
// (ql_cuda.h), reading layouts made by the backend's repack; the launches
// rotate over copies of the layout that add up to at least four times the
// L2 cache, so each one reads its weight from device memory. Bytes per call
// are what the kernel must move at least: the layout (codes with their row
// padding, scales, zeros, bias), x, y, and for linear_wo twice its split-K
// scratch (written, then read); quantize_rows reads x and writes the codes,
// scales, group sums and row verdicts. Achieved = bytes per call / time
// per call; the ratio is achieved / peak, where the peak comes from the
// device (ql_device_desc.peak_bytes_per_s: memory clock x 2 x bus width).
// Each figure is the median of --pairs samples with the [min-max] over
// them, as every figure of qlinear-bench; the peak is the fixed baseline.
//
// Built twice: against the real CUDA runtime in qlinear-bench when
// configure found nvcc, and against the emulated runtime (emu_runtime.h)
// in qlinear-bench-cudaemu, which make check runs with tiny shapes to
// check the output (its times are the CPU's, not a GPU's).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef QL_CUDA_EMU
#include "emu_runtime.h"
#else
#include <cuda_runtime_api.h>
#endif

#include "ql_cuda.h"
#include "ql_kernels.h"
#include "registry.h"

extern "C" int ql_bench_gpu(const char* device, int argc, char** argv);

namespace {

constexpr int kMaxShapes = 8;
constexpr int kMaxCopies = 64;

struct gopts {
  int64_t n[kMaxShapes], k[kMaxShapes];
  int nshape = 0;
  int pairs = 7;
  double min_ms = 20;
  long iters = 0;  // 0: calibrated to min_ms
  int64_t aq_m = 16;
  int64_t wo_m = 1;  // linear_wo also at these rows when > 1
  uint32_t gs = 128;
  bool json = false;
};

void usage(FILE* f) {
  fprintf(f,
          "usage: qlinear-bench --device cuda:N|cuda:<uuid> [options]\n"
          "  --shapes NxK,...   default 4096x4096,14336x4096,4096x14336\n"
          "  --aq-m M           rows of linear_aq and quantize_rows (default "
          "16)\n"
          "  --wo-m M           also linear_wo at M rows (default: M = 1 only)\n"
          "  --gs G             q4g group size and q8b block (default 128)\n"
          "  --pairs P          samples per figure (>= 5, default 7)\n"
          "  --min-sample-ms S  length of one sample (default 20)\n"
          "  --iters N          launches per sample instead (for tests)\n"
          "  --json             JSON lines only\n");
}

bool parse(int argc, char** argv, gopts* o) {
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (strcmp(a, "--json") == 0) {
      o->json = true;
      continue;
    }
    if (v == nullptr) return false;
    i++;
    if (strcmp(a, "--shapes") == 0) {
      o->nshape = 0;
      for (const char* p = v; *p != '\0';) {
        long long n, k;
        int used = 0;
        if (o->nshape == kMaxShapes ||
            sscanf(p, "%lldx%lld%n", &n, &k, &used) != 2 || n < 1 ||
            k < 1 || n > QL_DIM_MAX || k > QL_DIM_MAX)
          return false;
        o->n[o->nshape] = n;
        o->k[o->nshape++] = k;
        p += used;
        if (*p == ',') p++;
        else if (*p != '\0') return false;
      }
    } else if (strcmp(a, "--aq-m") == 0) {
      o->aq_m = atoll(v);
      if (o->aq_m < 1 || o->aq_m > 4096) return false;
    } else if (strcmp(a, "--wo-m") == 0) {
      o->wo_m = atoll(v);
      if (o->wo_m < 1 || o->wo_m > 4096) return false;
    } else if (strcmp(a, "--gs") == 0) {
      o->gs = uint32_t(atoi(v));
      if (o->gs != 32 && o->gs != 64 && o->gs != 128 && o->gs != 256)
        return false;
    } else if (strcmp(a, "--pairs") == 0) {
      o->pairs = atoi(v);
      if (o->pairs < 5 || o->pairs > 1000) return false;
    } else if (strcmp(a, "--min-sample-ms") == 0) {
      o->min_ms = atof(v);
      if (!(o->min_ms > 0 && o->min_ms < 60000)) return false;
    } else if (strcmp(a, "--iters") == 0) {
      o->iters = atol(v);
      if (o->iters < 1 || o->iters > 1000000) return false;
    } else {
      return false;
    }
  }
  if (o->nshape == 0) {
    static const int64_t dn[] = {4096, 14336, 4096}, dk[] = {4096, 4096, 14336};
    for (int s = 0; s < 3; s++) {
      o->n[s] = dn[s];
      o->k[s] = dk[s];
    }
    o->nshape = 3;
  }
  return true;
}

// The device named want (its name or alias) of the cuda backend.
int find_device(const char* want, const ql_backend** b, int* ordinal,
                ql_device_desc* desc) {
  const char* why = nullptr;
  *b = ql_backend_find("cuda");
  if (*b == nullptr || (*b)->device_count == nullptr) {
    fprintf(stderr, "qlinear-bench: no device '%s': this build has no CUDA "
            "backend\n", want);
    return 2;
  }
  int n = (*b)->device_count(&why);
  for (int o = 0; o < n; o++) {
    memset(desc, 0, sizeof *desc);
    if ((*b)->device_info(o, desc) == 0 &&
        (strcmp(desc->name, want) == 0 || strcmp(desc->alias, want) == 0)) {
      *ordinal = o;
      return 0;
    }
  }
  fprintf(stderr, "qlinear-bench: no device '%s' (", want);
  if (n <= 0) fprintf(stderr, "cuda: %s", why != nullptr ? why : "none");
  for (int o = 0; o < n; o++) {
    ql_device_desc d;
    memset(&d, 0, sizeof d);
    if ((*b)->device_info(o, &d) == 0)
      fprintf(stderr, "%s%s = %s", o ? ", " : "", d.alias, d.name);
  }
  fprintf(stderr, ")\n");
  return 2;
}

// A CUDA call that must work: the bench stops otherwise.
bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  fprintf(stderr, "qlinear-bench: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

int cmp_double(const void* a, const void* b) {
  double x = *static_cast<const double*>(a), y = *static_cast<const double*>(b);
  return x < y ? -1 : x > y;
}

// One kernel case: what to launch (launch(i) enqueues call i, rotating over
// the copies) and the bytes one call moves.
struct kcase {
  const char* kernel;  // "linear_wo", "linear_aq", "quantize_rows"
  const char* format;  // or "i8" for quantize_rows
  int64_t n, k, m;
  size_t layout_bytes, x_bytes, y_bytes, scratch_bytes, bytes;
  void (*launch)(void* ctx, long i, cudaStream_t s);
  void* ctx;
};

// The weight of one format on the device: copies of the backend's layout.
struct wcopies {
  const ql_kernel_impl* rp = nullptr;
  void* pk[kMaxCopies] = {};
  const ql__cuda_wo* view[kMaxCopies] = {};
  int n = 0;
  size_t bytes = 0;  // of one layout
  ql_qweight* q = nullptr;
  ~wcopies() {
    for (int i = 0; i < n; i++) rp->free_packed(pk[i]);
    ql_qweight_free(q);
  }
};

// Random weights of format f, repacked on the bound device into as many
// copies as make four times the L2 (at most kMaxCopies, and a quarter of
// the device's memory).
int make_copies(const ql_backend* b, const ql_device_desc* desc, int ordinal,
                ql_format f, uint32_t gs, int64_t n, int64_t k,
                wcopies* w) {
  ql_quant_params p = {f, gs, 0, QL_DTYPE_F32};
  float* src = static_cast<float*>(malloc(size_t(n) * size_t(k) * 4));
  if (src == nullptr) return 1;
  uint64_t st = 0x9e3779b97f4a7c15u ^ uint64_t(n * 31 + k);
  for (size_t i = 0; i < size_t(n) * size_t(k); i++) {
    st = st * 6364136223846793005u + 1442695040888963407u;
    src[i] = float(int32_t(st >> 32)) * (1.0f / 2147483648.0f);
  }
  int rc = ql_qweight_quantize(&p, n, k, QL_DTYPE_F32, src, nullptr, &w->q);
  free(src);
  if (rc != 0) return 1;
  w->rp = ql_dispatch(b, QL_OP_REPACK, f, QL_DTYPE_F32, 1, n, k);
  if (w->rp == nullptr || w->rp->fn.repack == nullptr) return 1;
  int l2 = 0;
  if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, ordinal) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    l2 = 64 << 20;  // larger than any L2 so far
  }
  for (int c = 0; c < kMaxCopies; c++) {
    ql_repack_args a;
    memset(&a, 0, sizeof a);
    a.w = w->q;
    if (w->rp->fn.repack(&a) != 0) return c > 0 ? 0 : 1;
    w->pk[w->n] = a.packed;
    w->view[w->n] = ql__cuda_packed_view(a.packed, &w->bytes);
    w->n++;
    if (w->bytes * size_t(w->n) >= 4 * size_t(l2) ||
        w->bytes * size_t(w->n + 1) > desc->memory_bytes / 4)
      break;
  }
  return 0;
}

struct wo_ctx {
  const wcopies* w;
  const void* x;
  int64_t m;
  void* y;
  float* scratch;
};
void launch_wo(void* p, long i, cudaStream_t s) {
  wo_ctx* c = static_cast<wo_ctx*>(p);
  ql__cuda_linear_wo(c->w->view[i % c->w->n], ql__cuda_wo_kernel(),
                     QL_DTYPE_F32, c->x, c->m, c->y, c->scratch, s);
}

struct aq_ctx {
  const wcopies* w;
  const int8_t* xq;
  const float* sx;
  const int32_t* gsum;
  int64_t m;
  void* y;
};
void launch_aq(void* p, long i, cudaStream_t s) {
  aq_ctx* c = static_cast<aq_ctx*>(p);
  ql__cuda_linear_aq(c->w->view[i % c->w->n], c->xq, c->sx, c->gsum, c->m,
                     QL_DTYPE_F32, c->y, s);
}

struct qr_ctx {
  const float* x;
  int64_t m, k, gs;
  int8_t* xq;
  float* sx;
  int32_t* gsum;
  int64_t* status;
};
void launch_qr(void* p, long i, cudaStream_t s) {
  (void)i;
  qr_ctx* c = static_cast<qr_ctx*>(p);
  ql__cuda_quantize_rows(QL__CUDA_QROWS_I8, QL_DTYPE_F32, c->x, c->m, c->k,
                         c->gs, c->xq, c->k, c->sx, c->gsum, c->status, s);
}

// ms of `iters` launches of c between two events.
bool sample(const kcase* c, long iters, long* next, cudaStream_t s,
            cudaEvent_t e0, cudaEvent_t e1, double* ms) {
  float t = 0;
  if (!ok(cudaEventRecord(e0, s), "cudaEventRecord")) return false;
  for (long i = 0; i < iters; i++) c->launch(c->ctx, (*next)++, s);
  if (!ok(cudaGetLastError(), c->kernel) ||
      !ok(cudaEventRecord(e1, s), "cudaEventRecord") ||
      !ok(cudaEventSynchronize(e1), "cudaEventSynchronize") ||
      !ok(cudaEventElapsedTime(&t, e0, e1), "cudaEventElapsedTime"))
    return false;
  *ms = double(t);
  return true;
}

// Times c and prints its line(s). 0 or 1 (a CUDA error).
int run_case(const gopts* o, const ql_device_desc* desc, const kcase* c,
             cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1) {
  long iters = o->iters, next = 0;
  double ms = 0;
  if (iters == 0) {  // calibrate: double until a sample lasts min_ms
    for (iters = 1;; iters *= 2) {
      if (!sample(c, iters, &next, s, e0, e1, &ms)) return 1;
      if (ms >= o->min_ms || iters >= (1L << 20)) break;
    }
  } else if (!sample(c, iters, &next, s, e0, e1, &ms)) {  // warm-up
    return 1;
  }
  double ns[1000], ratio[1000];
  for (int p = 0; p < o->pairs; p++) {
    if (!sample(c, iters, &next, s, e0, e1, &ms)) return 1;
    ns[p] = ms * 1e6 / double(iters);
  }
  qsort(ns, size_t(o->pairs), sizeof *ns, cmp_double);
  // Time sorted up is bandwidth sorted down.
  const double peak = double(desc->peak_bytes_per_s);
  for (int p = 0; p < o->pairs; p++)
    ratio[p] = peak > 0 && ns[p] > 0 ? double(c->bytes) / ns[p] * 1e9 / peak
                                     : 0;
  const double med_ns = ns[o->pairs / 2];
  const double gbs = med_ns > 0 ? double(c->bytes) / med_ns : 0;  // GB/s
  if (!o->json) {
    char r[64] = "peak unknown";
    if (peak > 0)
      snprintf(r, sizeof r, "%.3g [%.3g-%.3g]", ratio[o->pairs / 2],
               ratio[o->pairs - 1], ratio[0]);
    printf("%-13s %-4s %6lldx%-6lld %4lld %12zu %10.2f %9.2f  %s\n",
           c->kernel, c->format, (long long)c->n, (long long)c->k,
           (long long)c->m, c->bytes, med_ns / 1e3, gbs, r);
  }
  printf("{\"bench\":\"gpu\",\"device\":\"%s\",\"alias\":\"%s\","
         "\"kernel\":\"%s\",\"format\":\"%s\",\"n\":%lld,\"k\":%lld,"
         "\"m\":%lld,\"layout_bytes\":%zu,\"x_bytes\":%zu,\"y_bytes\":%zu,"
         "\"scratch_bytes\":%zu,\"bytes_per_call\":%zu,\"iters\":%ld,"
         "\"pairs\":%d,\"ns_per_call\":%.1f,\"gb_per_s\":%.6g,"
         "\"peak_gb_per_s\":%.3f",
         desc->name, desc->alias, c->kernel, c->format, (long long)c->n,
         (long long)c->k, (long long)c->m, c->layout_bytes, c->x_bytes,
         c->y_bytes, c->scratch_bytes, c->bytes, iters, o->pairs, med_ns, gbs,
         peak / 1e9);
  if (peak > 0)
    printf(",\"ratio\":%.6g,\"ratio_min\":%.6g,\"ratio_max\":%.6g}\n",
           ratio[o->pairs / 2], ratio[o->pairs - 1], ratio[0]);
  else
    printf(",\"ratio\":null}\n");
  fflush(stdout);
  return 0;
}

// Device buffers of one shape, freed at the end of it.
struct dbufs {
  void* p[8] = {};
  int n = 0;
  void* get(size_t bytes) {
    void* q = nullptr;
    if (n == 8 || !ok(cudaMalloc(&q, bytes ? bytes : 1), "cudaMalloc"))
      return nullptr;
    return p[n++] = q;
  }
  ~dbufs() {
    for (int i = 0; i < n; i++) (void)cudaFree(p[i]);
  }
};

// Every kernel case of one shape. 0 or 1.
int run_shape(const gopts* o, const ql_backend* b, const ql_device_desc* desc,
              int ordinal, int64_t n, int64_t k, cudaStream_t s,
              cudaEvent_t e0, cudaEvent_t e1) {
  const int64_t mq = o->aq_m, groups = (k + o->gs - 1) / o->gs;
  const int64_t mx = mq > o->wo_m ? mq : o->wo_m;
  int rc;
  dbufs d;
  // x [mx, k] f32 (random), y [mx, n] f32, and the AQ intermediates.
  float* x = static_cast<float*>(d.get(size_t(mx * k) * 4));
  void* y = d.get(size_t(mx * n) * 4);
  int8_t* xq = static_cast<int8_t*>(d.get(size_t(mq * k)));
  float* sx = static_cast<float*>(d.get(size_t(mq) * 4));
  int32_t* gsum = static_cast<int32_t*>(d.get(size_t(mq * groups) * 4));
  int64_t* status = static_cast<int64_t*>(d.get(size_t(mq) * 8));
  if (x == nullptr || y == nullptr || xq == nullptr || sx == nullptr ||
      gsum == nullptr || status == nullptr)
    return 1;
  {
    float* hx = static_cast<float*>(malloc(size_t(mx * k) * 4));
    if (hx == nullptr) return 1;
    uint64_t st = 0x2545f4914f6cdd1du;
    for (int64_t i = 0; i < mx * k; i++) {
      st = st * 6364136223846793005u + 1442695040888963407u;
      hx[i] = float(int32_t(st >> 32)) * (1.0f / 2147483648.0f);
    }
    bool good = ok(cudaMemcpy(x, hx, size_t(mx * k) * 4,
                              cudaMemcpyHostToDevice), "cudaMemcpy");
    free(hx);
    if (!good) return 1;
  }

  // quantize_rows at mq rows (int8, group sums of gs): also makes the AQ
  // inputs below.
  qr_ctx qc = {x, mq, k, int64_t(o->gs), xq, sx, gsum, status};
  kcase qk = {"quantize_rows", "i8", n, k, mq, 0, size_t(mq * k) * 4,
              size_t(mq * k) + size_t(mq) * 4 + size_t(mq * groups) * 4 +
                  size_t(mq) * 8,
              0, 0, launch_qr, &qc};
  qk.bytes = qk.x_bytes + qk.y_bytes;
  if (run_case(o, desc, &qk, s, e0, e1) != 0) return 1;

  static const struct {
    const char* name;
    ql_format f;
  } fmts[] = {{"q4g", QL_FORMAT_Q4G}, {"q8c", QL_FORMAT_Q8C},
              {"q8b", QL_FORMAT_Q8B}, {"f8r", QL_FORMAT_F8R}};
  for (const auto& fm : fmts) {
    wcopies w;
    if (make_copies(b, desc, ordinal, fm.f, o->gs, n, k, &w) != 0) {
      fprintf(stderr, "qlinear-bench: %s %lldx%lld: cannot make the "
              "weight on %s\n", fm.name, (long long)n, (long long)k,
              desc->alias);
      return 1;
    }
    // linear_wo, M = 1, then M = --wo-m.
    const int64_t wo_rows[2] = {1, o->wo_m};
    for (int64_t mw : wo_rows) {
      size_t scratch = ql__cuda_linear_wo_scratch(w.view[0], mw);
      void* sc = nullptr;
      if (scratch && !ok(cudaMalloc(&sc, scratch), "cudaMalloc")) return 1;
      wo_ctx wc = {&w, x, mw, y, static_cast<float*>(sc)};
      kcase wk = {"linear_wo", fm.name, n, k, mw, w.bytes,
                  size_t(mw * k) * 4, size_t(mw * n) * 4, scratch, 0,
                  launch_wo, &wc};
      wk.bytes = wk.layout_bytes + wk.x_bytes + wk.y_bytes + 2 * scratch;
      rc = run_case(o, desc, &wk, s, e0, e1);
      (void)cudaFree(sc);
      if (rc != 0) return 1;
      if (o->wo_m == 1) break;
    }
    // linear_aq at mq rows, q8c (W8A8) and q4g (W4A8), on the rows that
    // quantize_rows made (for q8c with gs = K: the scale of a row is the
    // same whatever the groups).
    if (fm.f != QL_FORMAT_Q8C && fm.f != QL_FORMAT_Q4G) continue;
    if (fm.f == QL_FORMAT_Q8C && k > QL_AQ_Q8C_MAX_K) continue;
    aq_ctx ac = {&w, xq, sx, fm.f == QL_FORMAT_Q4G ? gsum : nullptr, mq, y};
    kcase ak = {"linear_aq", fm.name, n, k, mq, w.bytes,
                size_t(mq * k) + size_t(mq) * 4 +
                    (fm.f == QL_FORMAT_Q4G ? size_t(mq * groups) * 4 : 0),
                size_t(mq * n) * 4, 0, 0, launch_aq, &ac};
    ak.bytes = ak.layout_bytes + ak.x_bytes + ak.y_bytes;
    if (run_case(o, desc, &ak, s, e0, e1) != 0) return 1;
  }
  return 0;
}

}  // namespace

int ql_bench_gpu(const char* device, int argc, char** argv) {
  gopts o;
  const ql_backend* b = nullptr;
  ql_device_desc desc;
  int ordinal = 0, rc;
  cudaStream_t s = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;

  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    }
  if (!parse(argc, argv, &o)) {
    usage(stderr);
    return 2;
  }
  if ((rc = find_device(device, &b, &ordinal, &desc)) != 0) return rc;
  if ((rc = b->device_bind(ordinal)) != 0) {
    fprintf(stderr, "qlinear-bench: %s: %s\n", device, ql_strerror(rc));
    return 1;
  }
  if (!ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
          "cudaStreamCreateWithFlags") ||
      !ok(cudaEventCreateWithFlags(&e0, cudaEventDefault),
          "cudaEventCreateWithFlags") ||
      !ok(cudaEventCreateWithFlags(&e1, cudaEventDefault),
          "cudaEventCreateWithFlags"))
    return 1;
  if (!o.json) {
    printf("qlinear-bench: kernels on %s (%s, %s), %zu MiB\n", desc.alias,
           desc.name, desc.model, desc.memory_bytes >> 20);
    if (desc.peak_bytes_per_s)
      printf("peak memory bandwidth %.1f GB/s (memory clock x 2 x bus "
             "width); %d samples per figure\n",
             double(desc.peak_bytes_per_s) / 1e9, o.pairs);
    else
      printf("peak memory bandwidth unknown: no ratios\n");
    printf("%-13s %-4s %13s %4s %12s %10s %9s  %s\n", "KERNEL", "FMT",
           "N x K", "M", "BYTES/CALL", "US/CALL", "GB/S",
           "x PEAK [min-max]");
  }
  rc = 0;
  for (int i = 0; i < o.nshape && rc == 0; i++)
    rc = run_shape(&o, b, &desc, ordinal, o.n[i], o.k[i], s, e0, e1);
  (void)cudaEventDestroy(e0);
  (void)cudaEventDestroy(e1);
  (void)cudaStreamDestroy(s);
  return rc;
}
