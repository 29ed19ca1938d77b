// bench_gpu.cpp - `qlinear-bench --device cuda:<uuid>|cuda:N`: each CUDA
// kernel's time, the memory bandwidth it achieves and, for products, its
// TOPS, next to an in-run streaming read of the same bytes and the
// device's nominal peak (DESIGN §12, issues 9, 22, 23), for machines that
// have a GPU; and a check of batch invariance on that GPU.
//
// Cases per shape (--shapes): linear_wo for q4g, q8c, q8b and f8r at each M
// of --wo-m (1, 2, 4, 8, 16: decode), on the kernel QL_CUDA_WO_KERNEL
// selects (ql__cuda_wo_kernel(): the persistent streaming one unless
// "legacy" or "tiled"); linear_aq for q8c (W8A8) and q4g (W4A8) on our
// tensor-core kernel, and for f8r on cuBLASLt's FP8 GEMM with our
// epilogue (what the backend runs), at each M of --aq-m (the decode Ms
// and 64, 128, 512, 2048: prefill); q8c on cuBLASLt's IMMA (linear_aq_lt,
// the QL_CUDA_IMMA_MIN_ROWS path) and quantize_rows at the Ms of --aq-m
// from 16 up. The AQ cases time the product alone, on rows that
// quantize_rows made before; quantize_rows has cases of its own.
//
// A sample is a number of calls between two CUDA events, on the backend's
// own kernels (ql_cuda.h, blaslt.h) reading layouts made by the backend's
// repack; the calls rotate over copies of the layout that add up to at
// least four times the L2 cache, so each one reads its weight from device
// memory. On a GPU the calls of one rotation are captured once in a CUDA
// graph and a sample replays it (no launch cost in the figure, as the
// peers of tests/bench/peers_gpu.py are timed); --no-graph, or a capture
// the runtime refuses, launches them one by one. Bytes per call are what
// the kernel must move at least: the layout (codes with their row padding,
// scales, zeros, bias), x (or its codes, scales and group sums), y, and
// twice any scratch (split-K partial sums, cuBLASLt's accumulator: written,
// then read); quantize_rows reads x and writes the codes, scales, group
// sums and row verdicts.
//
// Figures per case: the median time per call over --pairs samples (>= 5),
// achieved GB/s (bytes per call / time), the fraction of the in-run read
// (a plain 128-bit streaming read of exactly the same number of bytes,
// stream_read.cu, rotated over copies past L2 and timed the same way, just
// before: so an H100 and an H200 are judged alike), the fraction of the
// nominal peak (ql_device_desc.peak_bytes_per_s: memory clock x 2 x bus
// width, with its [min-max] over the samples), and TOPS (2·M·N·K per call)
// for the products. One JSON line per case, and a table for people.
//
// Batch invariance (first, unless --no-invariance): for q4g, q8c, q8b
// (symmetric and asymmetric) and f8r, WO and AQ, activations f32 and bf16,
// the backend's op as ql_dispatch picks it for each M (the daemon's path)
// on x whose row 0 is the same and whose other rows differ: the bytes of
// y's row 0 must be equal at M = 1, 16, 17, 64 and 512 (--inv-m). One PASS
// or FAIL line per (shape, format, path, dtype); the exit status is 1 on a
// FAIL.
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

#include <unistd.h>

#include "blaslt.h"
#include "ql_cuda.h"
#include "ql_kernels.h"
#include "registry.h"
#include "stream_read.h"
#include "vmm.h"

extern "C" int ql_bench_gpu(const char* device, int argc, char** argv);

namespace {

constexpr int kMaxShapes = 8;
constexpr int kMaxCopies = 64;
constexpr int kMaxMs = 16;
constexpr int kMaxPairs = 1000;

// Bits of gopts.formats.
enum { F_Q4G = 1, F_Q8C = 2, F_Q8B = 4, F_F8R = 8 };

struct mlist {
  int64_t v[kMaxMs];
  int n = 0;
};

struct shapes {
  int64_t n[kMaxShapes], k[kMaxShapes];
  int count = 0;
};

struct gopts {
  shapes sh, inv_sh;
  mlist wo_m, aq_m, inv_m;
  unsigned formats = F_Q4G | F_Q8C | F_Q8B | F_F8R;
  int pairs = 5;
  double min_ms = 10;
  long iters = 0;  // 0: calibrated to min_ms
  uint32_t gs = 128;
  bool json = false, graph = true, read = true;
  bool invariance = true, inv_only = false, quick = false;
  bool mapped = false;  // --mapped: linear_wo_mapped cases too
  ql_dtype sdt = QL_DTYPE_F32;  // --scale-dtype: of the weights' scales
  bool set_pairs = false, set_ms = false;
};

void usage(FILE* f) {
  fprintf(f,
          "usage: qlinear-bench --device cuda:N|cuda:<uuid> [options]\n"
          "  --shapes NxK,...   default 4096x4096,14336x4096,4096x14336\n"
          "  --wo-m M,...       rows of linear_wo (default 1,2,4,8,16)\n"
          "  --aq-m M,...       rows of linear_aq (default "
          "1,2,4,8,16,64,128,512,2048;\n"
          "                     quantize_rows and cuBLASLt IMMA at those "
          ">= 16)\n"
          "  --formats F,...    of q4g,q8c,q8b,f8r (default all)\n"
          "  --gs G             q4g group size and q8b block (default 128)\n"
          "  --scale-dtype D    f32 (default), f16 or bf16: the weights' "
          "scales\n"
          "  --pairs P          samples per figure (>= 5, default 5)\n"
          "  --min-sample-ms S  length of one sample (default 10)\n"
          "  --iters N          calls per sample instead (for tests)\n"
          "  --quick            14336x4096, --wo-m 1,16, --aq-m 1,16,512, "
          "samples of 5 ms\n"
          "                     (what is given explicitly stays)\n"
          "  --no-graph         launch each call (default: CUDA graphs on a "
          "GPU)\n"
          "  --no-read          no in-run streaming read\n"
          "  --no-invariance    skip the batch-invariance check\n"
          "  --invariance-only  the batch-invariance check alone\n"
          "  --inv-shapes NxK,... its shapes (default 4096x4096,512x14336)\n"
          "  --inv-m M,...      its Ms (default 1,16,17,64,512)\n"
          "  --mapped           linear_wo also as a mapped-mode client runs "
          "it:\n"
          "                     on a read-only import of each exported "
          "layout\n"
          "                     (linear_wo_mapped, next to linear_wo)\n"
          "  --json             JSON lines only\n");
}

bool parse_shapes(const char* v, shapes* sh) {
  sh->count = 0;
  for (const char* p = v; *p != '\0';) {
    long long n, k;
    int used = 0;
    if (sh->count == kMaxShapes ||
        sscanf(p, "%lldx%lld%n", &n, &k, &used) != 2 || n < 1 || k < 1 ||
        n > QL_DIM_MAX || k > QL_DIM_MAX)
      return false;
    sh->n[sh->count] = n;
    sh->k[sh->count++] = k;
    p += used;
    if (*p == ',') p++;
    else if (*p != '\0') return false;
  }
  return sh->count > 0;
}

bool parse_ms(const char* v, mlist* ml) {
  ml->n = 0;
  for (const char* p = v; *p != '\0';) {
    long long m;
    int used = 0;
    if (ml->n == kMaxMs || sscanf(p, "%lld%n", &m, &used) != 1 || m < 1 ||
        m > 65536)
      return false;
    ml->v[ml->n++] = m;
    p += used;
    if (*p == ',') p++;
    else if (*p != '\0') return false;
  }
  return ml->n > 0;
}

bool parse_formats(const char* v, unsigned* out) {
  static const char* const names[] = {"q4g", "q8c", "q8b", "f8r"};
  *out = 0;
  for (const char* p = v; *p != '\0';) {
    size_t len = strcspn(p, ",");
    int i;
    for (i = 0; i < 4; i++)
      if (len == 3 && strncmp(p, names[i], 3) == 0) break;
    if (i == 4) return false;
    *out |= 1u << i;
    p += len;
    if (*p == ',') p++;
  }
  return *out != 0;
}

void set_ms(mlist* ml, const int64_t* v, int n) {
  ml->n = n;
  for (int i = 0; i < n; i++) ml->v[i] = v[i];
}

bool parse(int argc, char** argv, gopts* o) {
  bool set_sh = false, set_wo = false, set_aq = false;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (strcmp(a, "--json") == 0) o->json = true;
    else if (strcmp(a, "--quick") == 0) o->quick = true;
    else if (strcmp(a, "--no-graph") == 0) o->graph = false;
    else if (strcmp(a, "--no-read") == 0) o->read = false;
    else if (strcmp(a, "--no-invariance") == 0) o->invariance = false;
    else if (strcmp(a, "--invariance-only") == 0) o->inv_only = true;
    else if (strcmp(a, "--mapped") == 0) o->mapped = true;
    else if (v == nullptr) return false;
    else {
      i++;
      if (strcmp(a, "--shapes") == 0) {
        if (!parse_shapes(v, &o->sh)) return false;
        set_sh = true;
      } else if (strcmp(a, "--inv-shapes") == 0) {
        if (!parse_shapes(v, &o->inv_sh)) return false;
      } else if (strcmp(a, "--wo-m") == 0) {
        if (!parse_ms(v, &o->wo_m)) return false;
        set_wo = true;
      } else if (strcmp(a, "--aq-m") == 0) {
        if (!parse_ms(v, &o->aq_m)) return false;
        set_aq = true;
      } else if (strcmp(a, "--inv-m") == 0) {
        if (!parse_ms(v, &o->inv_m)) return false;
      } else if (strcmp(a, "--formats") == 0) {
        if (!parse_formats(v, &o->formats)) return false;
      } else if (strcmp(a, "--scale-dtype") == 0) {
        if (strcmp(v, "f32") == 0) o->sdt = QL_DTYPE_F32;
        else if (strcmp(v, "f16") == 0) o->sdt = QL_DTYPE_F16;
        else if (strcmp(v, "bf16") == 0) o->sdt = QL_DTYPE_BF16;
        else return false;
      } else if (strcmp(a, "--gs") == 0) {
        o->gs = uint32_t(atoi(v));
        if (o->gs != 32 && o->gs != 64 && o->gs != 128 && o->gs != 256)
          return false;
      } else if (strcmp(a, "--pairs") == 0) {
        o->pairs = atoi(v);
        if (o->pairs < 5 || o->pairs > kMaxPairs) return false;
        o->set_pairs = true;
      } else if (strcmp(a, "--min-sample-ms") == 0) {
        o->min_ms = atof(v);
        if (!(o->min_ms > 0 && o->min_ms < 60000)) return false;
        o->set_ms = true;
      } else if (strcmp(a, "--iters") == 0) {
        o->iters = atol(v);
        if (o->iters < 1 || o->iters > 1000000) return false;
      } else {
        return false;
      }
    }
  }
  if (!set_sh) {
    if (o->quick) parse_shapes("14336x4096", &o->sh);
    else parse_shapes("4096x4096,14336x4096,4096x14336", &o->sh);
  }
  if (o->inv_sh.count == 0) parse_shapes("4096x4096,512x14336", &o->inv_sh);
  static const int64_t wo_d[] = {1, 2, 4, 8, 16}, wo_q[] = {1, 16},
                       aq_d[] = {1, 2, 4, 8, 16, 64, 128, 512, 2048},
                       aq_q[] = {1, 16, 512}, inv_d[] = {1, 16, 17, 64, 512};
  if (!set_wo) {
    if (o->quick) set_ms(&o->wo_m, wo_q, 2);
    else set_ms(&o->wo_m, wo_d, 5);
  }
  if (!set_aq) {
    if (o->quick) set_ms(&o->aq_m, aq_q, 3);
    else set_ms(&o->aq_m, aq_d, 9);
  }
  if (o->inv_m.n == 0) set_ms(&o->inv_m, inv_d, 5);
  if (o->quick && !o->set_ms) o->min_ms = 5;
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
                ql_format f, uint32_t gs, ql_dtype sdt, int64_t n, int64_t k,
                wcopies* w) {
  ql_quant_params p = {f, gs, 0, sdt};
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

// ---------------------------------------------------------------- timing

// One timed case: what to launch (launch(i) enqueues call i, rotating over
// rot copies of what it reads; 0 or a QL_E* code) and the bytes one call
// moves.
struct kcase {
  const char* kernel;  // "linear_wo", "linear_aq", "linear_aq_lt", ...
  const char* format;  // or "i8" for quantize_rows
  int64_t n, k, m;
  size_t layout_bytes, x_bytes, y_bytes, scratch_bytes, bytes;
  int rot;    // calls that visit every copy once
  bool ops;   // a product: TOPS are printed
  int (*launch)(void* ctx, long i, cudaStream_t s);
  void* ctx;
};

// A case's figures: ns per call of each sample, sorted up.
struct timing {
  double ns[kMaxPairs];
  long calls;  // per sample
  bool graph;
};

struct runner {
  const gopts* o;
  const ql_device_desc* desc;
  cudaStream_t s;
  cudaEvent_t e0, e1;
  int sms;
  size_t l2;
  bool graph_said;  // a refused capture was reported
};

#ifndef QL_CUDA_EMU
// The rot calls of c captured into *ge. false when the runtime refuses
// (the caller then launches the calls itself).
bool capture(const kcase* c, long* next, cudaStream_t s,
             cudaGraphExec_t* ge) {
  cudaGraph_t g = nullptr;
  int rc = 0;
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  for (int i = 0; i < c->rot; i++) rc |= c->launch(c->ctx, (*next)++, s);
  cudaError_t e = cudaStreamEndCapture(s, &g);
  if (rc != 0 || e != cudaSuccess || g == nullptr) {
    if (g != nullptr) (void)cudaGraphDestroy(g);
    (void)cudaGetLastError();
    return false;
  }
  e = cudaGraphInstantiate(ge, g, 0);
  (void)cudaGraphDestroy(g);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}
#endif

// Times c: t->ns sorted up. 0, 1 (a CUDA error) or -1 (the case cannot run
// here: its launch said so; reported).
int time_case(runner* r, const kcase* c, timing* t) {
  const gopts* o = r->o;
  long next = 0;
  int rc = 0;
  // Warm-up, one call of each copy, launched directly: also lets a library
  // (cuBLASLt) make its choices before a capture.
  for (int i = 0; i < c->rot && rc == 0; i++)
    rc = c->launch(c->ctx, next++, r->s);
  if (rc != 0) {
    (void)cudaGetLastError();
    fprintf(stderr, "qlinear-bench: %s %s %lldx%lld M=%lld: not run: %s\n",
            c->kernel, c->format, (long long)c->n, (long long)c->k,
            (long long)c->m, ql_strerror(rc));
    return -1;
  }
  if (!ok(cudaGetLastError(), c->kernel) ||
      !ok(cudaStreamSynchronize(r->s), c->kernel))
    return 1;
  t->graph = false;
#ifndef QL_CUDA_EMU
  cudaGraphExec_t ge = nullptr;
  if (o->graph) {
    t->graph = capture(c, &next, r->s, &ge);
    if (!t->graph && !r->graph_said) {
      r->graph_said = true;
      fprintf(stderr, "qlinear-bench: %s %s: the runtime refused a CUDA "
              "graph; calls are launched one by one\n", c->kernel,
              c->format);
    }
  }
#endif
  // A unit is one graph replay (rot calls) or one call.
  const long unit = t->graph ? c->rot : 1;
  auto sample = [&](long reps, double* ns) -> bool {
    float ms = 0;
    if (!ok(cudaEventRecord(r->e0, r->s), "cudaEventRecord")) return false;
    for (long i = 0; i < reps; i++) {
#ifndef QL_CUDA_EMU
      if (t->graph) {
        if (!ok(cudaGraphLaunch(ge, r->s), "cudaGraphLaunch")) return false;
        continue;
      }
#endif
      if (c->launch(c->ctx, next++, r->s) != 0) {
        fprintf(stderr, "qlinear-bench: %s: a call failed\n", c->kernel);
        return false;
      }
    }
    if (!ok(cudaGetLastError(), c->kernel) ||
        !ok(cudaEventRecord(r->e1, r->s), "cudaEventRecord") ||
        !ok(cudaEventSynchronize(r->e1), "cudaEventSynchronize") ||
        !ok(cudaEventElapsedTime(&ms, r->e0, r->e1), "cudaEventElapsedTime"))
      return false;
    *ns = double(ms) * 1e6 / double(reps * unit);
    return true;
  };
  long reps = 1;
  double ns = 0;
  bool good = true;
  if (o->iters > 0) {
    reps = o->iters / unit > 0 ? o->iters / unit : 1;
  } else {  // calibrate: double until a sample lasts min_ms
    for (;; reps *= 2) {
      if (!(good = sample(reps, &ns))) break;
      if (ns * double(reps * unit) >= o->min_ms * 1e6 || reps >= (1L << 20))
        break;
    }
  }
  for (int p = 0; good && p < o->pairs; p++) good = sample(reps, &t->ns[p]);
#ifndef QL_CUDA_EMU
  if (ge != nullptr) (void)cudaGraphExecDestroy(ge);
#endif
  if (!good) return 1;
  t->calls = reps * unit;
  qsort(t->ns, size_t(o->pairs), sizeof t->ns[0], cmp_double);
  return 0;
}

// Device memory for the in-run read: grown as cases need, kept between
// them.
struct rpool {
  void* p = nullptr;
  size_t bytes = 0;
  unsigned* sink = nullptr;
  ~rpool() {
    (void)cudaFree(p);
    (void)cudaFree(sink);
  }
};

struct read_ctx {
  const unsigned char* base;
  size_t stride, bytes;
  int slots, sms;
  unsigned* sink;
};
int launch_read(void* p, long i, cudaStream_t s) {
  read_ctx* c = static_cast<read_ctx*>(p);
  ql__bench_stream_read(c->base + size_t(i % c->slots) * c->stride, c->bytes,
                        c->sms, c->sink, s);
  return 0;
}

// The in-run read of c's bytes (rounded up to 16), over as many slots as
// make four times the L2 (2 to kMaxCopies, at most a quarter of the
// device's memory): *t. 0 or 1.
int time_read(runner* r, rpool* pool, const kcase* c, timing* t) {
  const size_t bytes = (c->bytes + 15) / 16 * 16,
               stride = (bytes + 255) / 256 * 256;
  size_t slots = (4 * r->l2 + stride - 1) / stride;
  if (slots < 2) slots = 2;
  if (slots > kMaxCopies) slots = kMaxCopies;
  while (slots > 2 && slots * stride > r->desc->memory_bytes / 4) slots--;
  if (pool->sink == nullptr &&
      !ok(cudaMalloc(reinterpret_cast<void**>(&pool->sink), 16),
          "cudaMalloc"))
    return 1;
  if (pool->bytes < slots * stride) {
    (void)cudaFree(pool->p);
    pool->p = nullptr;
    pool->bytes = 0;
    if (!ok(cudaMalloc(&pool->p, slots * stride), "cudaMalloc") ||
        !ok(cudaMemsetAsync(pool->p, 0x5a, slots * stride, r->s),
            "cudaMemsetAsync") ||
        !ok(cudaStreamSynchronize(r->s), "cudaStreamSynchronize"))
      return 1;
    pool->bytes = slots * stride;
  }
  read_ctx rc = {static_cast<const unsigned char*>(pool->p), stride, bytes,
                 int(slots), r->sms, pool->sink};
  kcase rk = *c;
  rk.kernel = "stream_read";
  rk.rot = int(slots);
  rk.launch = launch_read;
  rk.ctx = &rc;
  return time_case(r, &rk, t) != 0;
}

// Times c and the read of its bytes, prints its line(s). 0, or 1 on a CUDA
// error (a case that cannot run here is reported and skipped: 0).
int run_case(runner* r, rpool* pool, const kcase* c) {
  const gopts* o = r->o;
  static timing t, rt;
  int rc = time_case(r, c, &t);
  if (rc < 0) return 0;
  if (rc != 0) return 1;
  const bool have_read = o->read && time_read(r, pool, c, &rt) == 0;
  if (o->read && !have_read) return 1;
  const int mid = o->pairs / 2;
  const double peak = double(r->desc->peak_bytes_per_s);
  const double med_ns = t.ns[mid];
  const double gbs = med_ns > 0 ? double(c->bytes) / med_ns : 0;  // GB/s
  // Time sorted up is bandwidth sorted down.
  const double ratio = peak > 0 ? gbs * 1e9 / peak : 0,
               rmin = peak > 0 ? double(c->bytes) / t.ns[o->pairs - 1] *
                                     1e9 / peak
                               : 0,
               rmax = peak > 0 ? double(c->bytes) / t.ns[0] * 1e9 / peak : 0;
  const double rns = have_read ? rt.ns[mid] : 0,
               xread = have_read && med_ns > 0 ? rns / med_ns : 0;
  const double tops =
      med_ns > 0 ? 2.0 * double(c->m) * double(c->n) * double(c->k) /
                       med_ns / 1e3
                 : 0;
  if (!o->json) {
    char rd[16] = "-", pk[40] = "-", tp[16] = "-";
    if (have_read) snprintf(rd, sizeof rd, "%.3f", xread);
    if (peak > 0)
      snprintf(pk, sizeof pk, "%.3f [%.3f-%.3f]", ratio, rmin, rmax);
    if (c->ops) snprintf(tp, sizeof tp, "%.1f", tops);
    printf("%-13s %-4s %6lldx%-6lld %5lld %11zu %10.2f %8.1f %6s %-21s %7s"
           "%s\n",
           c->kernel, c->format, (long long)c->n, (long long)c->k,
           (long long)c->m, c->bytes, med_ns / 1e3, gbs, rd, pk, tp,
           t.graph ? "" : "  (no graph)");
  }
  printf("{\"bench\":\"gpu\",\"device\":\"%s\",\"alias\":\"%s\","
         "\"model\":\"%s\",\"kernel\":\"%s\",\"format\":\"%s\",\"n\":%lld,"
         "\"k\":%lld,\"m\":%lld,\"layout_bytes\":%zu,\"x_bytes\":%zu,"
         "\"y_bytes\":%zu,\"scratch_bytes\":%zu,\"bytes_per_call\":%zu,"
         "\"iters\":%ld,\"rot\":%d,\"graph\":%s,\"pairs\":%d,"
         "\"ns_per_call\":%.1f,\"gb_per_s\":%.6g,\"peak_gb_per_s\":%.3f",
         r->desc->name, r->desc->alias, r->desc->model, c->kernel, c->format,
         (long long)c->n, (long long)c->k, (long long)c->m, c->layout_bytes,
         c->x_bytes, c->y_bytes, c->scratch_bytes, c->bytes, t.calls, c->rot,
         t.graph ? "true" : "false", o->pairs, med_ns, gbs, peak / 1e9);
  if (peak > 0)
    printf(",\"ratio\":%.6g,\"ratio_min\":%.6g,\"ratio_max\":%.6g", ratio,
           rmin, rmax);
  else
    printf(",\"ratio\":null");
  if (have_read)
    printf(",\"read_ns_per_call\":%.1f,\"read_gb_per_s\":%.6g,"
           "\"read_ratio\":%.6g",
           rns, rns > 0 ? double(c->bytes) / rns : 0, xread);
  if (c->ops) printf(",\"tops\":%.6g", tops);
  printf("}\n");
  fflush(stdout);
  return 0;
}

// Device buffers of one shape, freed at the end of it.
struct dbufs {
  void* p[16] = {};
  int n = 0;
  void* get(size_t bytes) {
    void* q = nullptr;
    if (n == 16 || !ok(cudaMalloc(&q, bytes ? bytes : 1), "cudaMalloc"))
      return nullptr;
    return p[n++] = q;
  }
  ~dbufs() {
    for (int i = 0; i < n; i++) (void)cudaFree(p[i]);
  }
};

struct wo_ctx {
  const wcopies* w;
  const void* x;
  int64_t m;
  void* y;
  float* scratch;
};
int launch_wo(void* p, long i, cudaStream_t s) {
  wo_ctx* c = static_cast<wo_ctx*>(p);
  ql__cuda_linear_wo(c->w->view[i % c->w->n], ql__cuda_wo_kernel(),
                     QL_DTYPE_F32, c->x, c->m, c->y, c->scratch, s);
  return 0;
}

// The copies of w as a mapped-mode client sees them (qlinear_mapped.h):
// each layout exported by the backend and imported again read-only, at a
// second address of this process, the views rebased onto it.
struct mapped_copies {
  ql__vmm_mem vm[kMaxCopies] = {};
  ql__cuda_wo v[kMaxCopies] = {};
  wcopies w;  // its view[] points into v; pk[] stays empty
  ~mapped_copies() {
    for (int i = 0; i < kMaxCopies; i++) ql__vmm_free(&vm[i]);
    w.n = 0;
  }
};

// 0, or QL_ENOTSUP when the backend cannot export (no VMM), or an error.
int map_copies(const ql_backend* b, int ordinal, const wcopies* w,
               mapped_copies* mc) {
  if (b->export_layout == nullptr) return QL_ENOTSUP;
  for (int i = 0; i < w->n; i++) {
    ql_layout_export ex;
    int rc = b->export_layout(w->pk[i], &ex);
    if (rc != 0) return rc;
    rc = ql__vmm_import(ordinal, ex.fd, size_t(ex.size), !ex.readonly,
                        &mc->vm[i]);
    close(ex.fd);
    if (rc != 0) return rc;
    unsigned char* base = static_cast<unsigned char*>(mc->vm[i].base);
    ql__cuda_wo& v = mc->v[i];
    v = *w->view[i];
    v.q = base + ex.q_offset;
    v.scale = base + ex.scale_offset;
    v.zero = ex.zero_offset != UINT64_MAX ? base + ex.zero_offset : nullptr;
    v.bias = ex.bias_offset != UINT64_MAX
                 ? reinterpret_cast<const float*>(base + ex.bias_offset)
                 : nullptr;
    mc->w.view[i] = &mc->v[i];
  }
  mc->w.n = w->n;
  mc->w.bytes = w->bytes;
  return 0;
}

// 0 when one call of a and one of b (the same x, m and y) give the same
// bytes of y (ybytes); else 1, said.
int same_wo(runner* r, wo_ctx* a, wo_ctx* b, size_t ybytes) {
  unsigned char* ya = static_cast<unsigned char*>(malloc(ybytes));
  unsigned char* yb = static_cast<unsigned char*>(malloc(ybytes));
  bool good = ya != nullptr && yb != nullptr &&
              launch_wo(a, 0, r->s) == 0 &&
              ok(cudaStreamSynchronize(r->s), "cudaStreamSynchronize") &&
              ok(cudaMemcpy(ya, a->y, ybytes, cudaMemcpyDeviceToHost),
                 "cudaMemcpy") &&
              launch_wo(b, 0, r->s) == 0 &&
              ok(cudaStreamSynchronize(r->s), "cudaStreamSynchronize") &&
              ok(cudaMemcpy(yb, b->y, ybytes, cudaMemcpyDeviceToHost),
                 "cudaMemcpy");
  if (good && memcmp(ya, yb, ybytes) != 0) {
    fprintf(stderr, "qlinear-bench: FAIL: linear_wo on the mapped layout "
            "gives other bytes than on the daemon's\n");
    good = false;
  }
  free(ya);
  free(yb);
  return good ? 0 : 1;
}

struct aq_ctx {
  const wcopies* w;
  const int8_t* xq;
  const float* sx;
  const int32_t* gsum;
  int64_t m;
  void* y;
};
int launch_aq(void* p, long i, cudaStream_t s) {
  aq_ctx* c = static_cast<aq_ctx*>(p);
  ql__cuda_linear_aq(c->w->view[i % c->w->n], c->xq, c->sx, c->gsum, c->m,
                     QL_DTYPE_F32, c->y, s);
  return 0;
}

// The backend's cuBLASLt path (backend.cpp lt_on): the unscaled product,
// then our epilogue.
struct lt_ctx {
  const wcopies* w;
  ql__blaslt* lt;
  int i8;
  const void* xq;
  int64_t ldx, np;
  const float* sx;
  int64_t m;
  void* acc;
  void* y;
};
int launch_lt(void* p, long i, cudaStream_t s) {
  lt_ctx* c = static_cast<lt_ctx*>(p);
  const ql__cuda_wo* v = c->w->view[i % c->w->n];
  int rc = ql__blaslt_gemm(c->lt, c->i8 ? QL__BLASLT_I8 : QL__BLASLT_E4M3,
                           c->np, c->m, c->ldx, v->q, v->ldq, c->xq, c->ldx,
                           c->acc, c->np, s);
  if (rc != 0) return rc;
  ql__cuda_gemm_epilogue(v, c->acc, c->i8, c->np, c->sx, c->m, QL_DTYPE_F32,
                         c->y, s);
  return 0;
}

struct qr_ctx {
  int kind;
  const float* x;
  int64_t m, k, gs;
  int8_t* xq;
  int64_t ldxq;
  float* sx;
  int32_t* gsum;
  int64_t* status;
};
int launch_qr(void* p, long i, cudaStream_t s) {
  (void)i;
  qr_ctx* c = static_cast<qr_ctx*>(p);
  ql__cuda_quantize_rows(c->kind, QL_DTYPE_F32, c->x, c->m, c->k, c->gs,
                         c->xq, c->ldxq, c->sx, c->gsum, c->status, s);
  return 0;
}

// x rows quantized for an AQ case (outside the timing): q. 0 or 1.
int prep_rows(runner* r, qr_ctx q) {
  if (q.ldxq != q.k &&
      !ok(cudaMemsetAsync(q.xq, 0, size_t(q.m * q.ldxq), r->s),
          "cudaMemsetAsync"))
    return 1;
  launch_qr(&q, 0, r->s);
  return ok(cudaGetLastError(), "quantize_rows") &&
                 ok(cudaStreamSynchronize(r->s), "quantize_rows")
             ? 0
             : 1;
}

int64_t round16(int64_t v) { return (v + 15) / 16 * 16; }

// Every kernel case of one shape. 0 or 1.
int run_shape(runner* r, rpool* pool, const ql_backend* b, int ordinal,
              ql__blaslt* lt, int64_t n, int64_t k) {
  const gopts* o = r->o;
  const ql_device_desc* desc = r->desc;
  const int64_t groups = (k + o->gs - 1) / o->gs, kp = round16(k),
                np = round16(n);
  int64_t mq = 1;
  for (int i = 0; i < o->wo_m.n; i++) mq = o->wo_m.v[i] > mq ? o->wo_m.v[i] : mq;
  for (int i = 0; i < o->aq_m.n; i++) mq = o->aq_m.v[i] > mq ? o->aq_m.v[i] : mq;
  const bool want_lt = lt != nullptr && (o->formats & (F_F8R | F_Q8C)) != 0;
  dbufs d;
  // x [mq, k] f32 (random), y [mq, n] f32, the AQ intermediates (codes in
  // rows of kp bytes, as cuBLASLt wants them) and cuBLASLt's accumulator.
  float* x = static_cast<float*>(d.get(size_t(mq * k) * 4));
  void* y = d.get(size_t(mq * n) * 4);
  int8_t* xq = static_cast<int8_t*>(d.get(size_t(mq * kp)));
  float* sx = static_cast<float*>(d.get(size_t(mq) * 4));
  int32_t* gsum = static_cast<int32_t*>(d.get(size_t(mq * groups) * 4));
  int64_t* status = static_cast<int64_t*>(d.get(size_t(mq) * 8));
  void* acc = want_lt ? d.get(size_t(mq * np) * 4) : nullptr;
  if (x == nullptr || y == nullptr || xq == nullptr || sx == nullptr ||
      gsum == nullptr || status == nullptr || (want_lt && acc == nullptr))
    return 1;
  {
    float* hx = static_cast<float*>(malloc(size_t(mq * k) * 4));
    if (hx == nullptr) return 1;
    uint64_t st = 0x2545f4914f6cdd1du;
    for (int64_t i = 0; i < mq * k; i++) {
      st = st * 6364136223846793005u + 1442695040888963407u;
      hx[i] = float(int32_t(st >> 32)) * (1.0f / 2147483648.0f);
    }
    bool good = ok(cudaMemcpy(x, hx, size_t(mq * k) * 4,
                              cudaMemcpyHostToDevice), "cudaMemcpy");
    free(hx);
    if (!good) return 1;
  }

  // quantize_rows (int8, group sums of gs) at the prefill Ms.
  for (int mi = 0; mi < o->aq_m.n; mi++) {
    const int64_t m = o->aq_m.v[mi];
    if (m < 16) continue;
    qr_ctx qc = {QL__CUDA_QROWS_I8, x, m, k, int64_t(o->gs), xq, k, sx, gsum,
                 status};
    kcase qk = {"quantize_rows", "i8", n, k, m, 0, size_t(m * k) * 4,
                size_t(m * k) + size_t(m) * 4 + size_t(m * groups) * 4 +
                    size_t(m) * 8,
                0, 0, 1, false, launch_qr, &qc};
    qk.bytes = qk.x_bytes + qk.y_bytes;
    if (run_case(r, pool, &qk) != 0) return 1;
  }

  static const struct {
    const char* name;
    ql_format f;
    unsigned bit;
  } fmts[] = {{"q4g", QL_FORMAT_Q4G, F_Q4G}, {"q8c", QL_FORMAT_Q8C, F_Q8C},
              {"q8b", QL_FORMAT_Q8B, F_Q8B}, {"f8r", QL_FORMAT_F8R, F_F8R}};
  for (const auto& fm : fmts) {
    if ((o->formats & fm.bit) == 0) continue;
    wcopies w;
    if (make_copies(b, desc, ordinal, fm.f, o->gs, o->sdt, n, k, &w) != 0) {
      fprintf(stderr, "qlinear-bench: %s %lldx%lld: cannot make the "
              "weight on %s\n", fm.name, (long long)n, (long long)k,
              desc->alias);
      return 1;
    }
    // linear_wo at the decode Ms.
    for (int mi = 0; mi < o->wo_m.n; mi++) {
      const int64_t m = o->wo_m.v[mi];
      size_t scratch = ql__cuda_linear_wo_scratch(w.view[0], m);
      void* sc = nullptr;
      if (scratch && !ok(cudaMalloc(&sc, scratch), "cudaMalloc")) return 1;
      wo_ctx wc = {&w, x, m, y, static_cast<float*>(sc)};
      kcase wk = {"linear_wo", fm.name, n, k, m, w.bytes, size_t(m * k) * 4,
                  size_t(m * n) * 4, scratch, 0, w.n, true, launch_wo, &wc};
      wk.bytes = wk.layout_bytes + wk.x_bytes + wk.y_bytes + 2 * scratch;
      int rc = run_case(r, pool, &wk);
      if (rc == 0 && o->mapped) {
        // The same calls on the imported mappings, straight after.
        mapped_copies mc;
        int mrc = map_copies(b, ordinal, &w, &mc);
        if (mrc != 0) {
          fprintf(stderr, "qlinear-bench: %s %lldx%lld: no mapped case: "
                  "%s\n", fm.name, (long long)n, (long long)k,
                  ql_strerror(mrc));
        } else {
          wo_ctx mwc = {&mc.w, x, m, y, static_cast<float*>(sc)};
          kcase mk = wk;
          mk.kernel = "linear_wo_mapped";
          mk.ctx = &mwc;
          // First the bytes: one call each way, on copy 0, must agree.
          rc = same_wo(r, &wc, &mwc, size_t(m * n) * 4);
          if (rc == 0) rc = run_case(r, pool, &mk);
        }
      }
      (void)cudaFree(sc);
      if (rc != 0) return 1;
    }
    // linear_aq: q8c (W8A8) and q4g (W4A8) on our kernel, on rows that
    // quantize_rows made (q8c: one group of K, no sums).
    const bool q4g = fm.f == QL_FORMAT_Q4G;
    if (q4g || (fm.f == QL_FORMAT_Q8C && k <= QL_AQ_Q8C_MAX_K)) {
      for (int mi = 0; mi < o->aq_m.n; mi++) {
        const int64_t m = o->aq_m.v[mi];
        if (prep_rows(r, {QL__CUDA_QROWS_I8, x, m, k,
                          q4g ? int64_t(o->gs) : k, xq, k, sx,
                          q4g ? gsum : nullptr, status}) != 0)
          return 1;
        aq_ctx ac = {&w, xq, sx, q4g ? gsum : nullptr, m, y};
        kcase ak = {"linear_aq", fm.name, n, k, m, w.bytes,
                    size_t(m * k) + size_t(m) * 4 +
                        (q4g ? size_t(m * groups) * 4 : 0),
                    size_t(m * n) * 4, 0, 0, w.n, true, launch_aq, &ac};
        ak.bytes = ak.layout_bytes + ak.x_bytes + ak.y_bytes;
        if (run_case(r, pool, &ak) != 0) return 1;
      }
    }
    // cuBLASLt: f8r (the backend's f8r AQ path) at every AQ M, q8c on IMMA
    // at the prefill Ms.
    const bool i8 = fm.f == QL_FORMAT_Q8C;
    if (lt == nullptr || (fm.f != QL_FORMAT_F8R && !(i8 && k <= QL_AQ_Q8C_MAX_K)))
      continue;
    const int64_t ldx = w.view[0]->ldq;
    for (int mi = 0; mi < o->aq_m.n; mi++) {
      const int64_t m = o->aq_m.v[mi];
      if (i8 && m < 16) continue;
      if (prep_rows(r, {i8 ? QL__CUDA_QROWS_I8 : QL__CUDA_QROWS_E4M3, x, m,
                        k, k, xq, ldx, sx, nullptr, status}) != 0)
        return 1;
      lt_ctx lc = {&w, lt, i8, xq, ldx, np, sx, m, acc, y};
      kcase lk = {i8 ? "linear_aq_lt" : "linear_aq", fm.name, n, k, m,
                  w.bytes, size_t(m * ldx) + size_t(m) * 4, size_t(m * n) * 4,
                  size_t(m * np) * 4, 0, w.n, true, launch_lt, &lc};
      lk.bytes = lk.layout_bytes + lk.x_bytes + lk.y_bytes +
                 2 * lk.scratch_bytes;
      if (run_case(r, pool, &lk) != 0) return 1;
    }
  }
  return 0;
}

// ----------------------------------------------------- batch invariance

// x [m, k] in dtype dt: row 0 the same for every m, the other rows drawn
// from m. Host memory the caller frees.
void* inv_x(int64_t m, int64_t k, ql_dtype dt) {
  const size_t esz = ql_dtype_size(dt);
  unsigned char* x = static_cast<unsigned char*>(malloc(size_t(m * k) * esz));
  if (x == nullptr) return nullptr;
  for (int64_t r = 0; r < m; r++) {
    uint64_t st = r == 0 ? 0x853c49e6748fea9bu : 0xda3e39cb94b95bdbu ^ uint64_t(m * 7919 + r);
    for (int64_t i = 0; i < k; i++) {
      st = st * 6364136223846793005u + 1442695040888963407u;
      float v = float(int32_t(st >> 32)) * (2.0f / 2147483648.0f);
      unsigned char* at = x + size_t(r * k + i) * esz;
      if (dt == QL_DTYPE_F32) {
        memcpy(at, &v, 4);
      } else {
        uint16_t h = dt == QL_DTYPE_BF16 ? ql_f32_to_bf16(v) : ql_f32_to_f16(v);
        memcpy(at, &h, 2);
      }
    }
  }
  return x;
}

// One weight of one shape: its WO and AQ ops, f32 and bf16, at every M of
// --inv-m. Prints a line per (path, dtype); *fails counts the FAILs. 0, or
// 1 when the weight cannot be made.
int inv_weight(const gopts* o, const ql_backend* b, const char* fname,
               const ql_quant_params* qp, int64_t n, int64_t k, int* fails) {
  float* src = static_cast<float*>(malloc(size_t(n * k) * 4));
  float* bias = static_cast<float*>(malloc(size_t(n) * 4));
  ql_qweight* q = nullptr;
  void* packed = nullptr;
  const ql_kernel_impl* rp;
  if (src == nullptr || bias == nullptr) {
    free(src);
    free(bias);
    return 1;
  }
  uint64_t st = 0x9e3779b97f4a7c15u ^ uint64_t(n * 131 + k);
  for (int64_t i = 0; i < n * k; i++) {
    st = st * 6364136223846793005u + 1442695040888963407u;
    src[i] = float(int32_t(st >> 32)) * (1.0f / 2147483648.0f);
  }
  for (int64_t i = 0; i < n; i++) bias[i] = 0.01f * float(i % 17) - 0.05f;
  int rc = ql_qweight_quantize(qp, n, k, QL_DTYPE_F32, src, bias, &q);
  free(src);
  free(bias);
  if (rc != 0) return 1;
  rp = ql_dispatch(b, QL_OP_REPACK, qp->format, QL_DTYPE_F32, 1, n, k);
  if (rp != nullptr && rp->fn.repack != nullptr) {
    ql_repack_args ra;
    memset(&ra, 0, sizeof ra);
    ra.w = q;
    if (rp->fn.repack(&ra) == 0) packed = ra.packed;
  }
  static const ql_dtype dts[] = {QL_DTYPE_F32, QL_DTYPE_BF16};
  for (int aq = 0; aq < 2; aq++)
    for (ql_dtype dt : dts) {
      const ql_op op = aq ? QL_OP_LINEAR_AQ : QL_OP_LINEAR_WO;
      const size_t rowb = size_t(n) * ql_dtype_size(dt);
      unsigned char* row0 = static_cast<unsigned char*>(malloc(rowb));
      char impls[400] = "";
      bool pass = true, any = false;
      int64_t bad_m = 0;
      const char* why = "";
      for (int mi = 0; mi < o->inv_m.n && row0 != nullptr; mi++) {
        const int64_t m = o->inv_m.v[mi];
        const ql_kernel_impl* im = ql_dispatch(b, op, qp->format, dt, m, n, k);
        if (im == nullptr) {
          why = "no implementation";
          break;
        }
        if (strstr(impls, im->name) == nullptr) {
          size_t at = strlen(impls);
          snprintf(impls + at, sizeof impls - at, "%s%s", at ? "," : "",
                   im->name);
        }
        void* x = inv_x(m, k, dt);
        void* y = malloc(size_t(m) * rowb);
        if (x == nullptr || y == nullptr) {
          free(x);
          free(y);
          pass = false;
          why = "out of memory";
          break;
        }
        ql_linear_args a;
        memset(&a, 0, sizeof a);
        a.w = q;
        a.packed = im == ql_generic_impl(op) ? nullptr : packed;
        a.dt = dt;
        a.x = x;
        a.m = m;
        a.y = y;
        rc = im->fn.linear(&a);
        if (rc != 0) {
          pass = false;
          bad_m = m;
          why = ql_strerror(rc);
        } else if (!any) {
          memcpy(row0, y, rowb);
          any = true;
        } else if (memcmp(row0, y, rowb) != 0 && pass) {
          pass = false;
          bad_m = m;
          why = "row 0 differs from M=1's";
        }
        free(x);
        free(y);
        if (rc != 0) break;
      }
      free(row0);
      if (!any && why[0] == '\0') why = "out of memory";
      if (!any && strcmp(why, "no implementation") == 0) continue;
      if (!pass || !any) ++*fails;
      char ms[128] = "";
      for (int mi = 0; mi < o->inv_m.n; mi++) {
        size_t at = strlen(ms);
        snprintf(ms + at, sizeof ms - at, "%s%lld", mi ? "," : "",
                 (long long)o->inv_m.v[mi]);
      }
      if (!o->json)
        printf("%s batch invariance %s %s %-4s %lldx%lld M={%s}: %s%s%s%s\n",
               pass && any ? "PASS" : "FAIL", fname, aq ? "AQ" : "WO",
               dt == QL_DTYPE_F32 ? "f32" : "bf16", (long long)n,
               (long long)k, ms, impls, pass && any ? "" : " <- ",
               pass && any ? "" : why, "");
      printf("{\"bench\":\"gpu_invariance\",\"format\":\"%s\",\"path\":\"%s\","
             "\"dtype\":\"%s\",\"n\":%lld,\"k\":%lld,\"ms\":[%s],"
             "\"impls\":\"%s\",\"pass\":%s,\"bad_m\":%lld,\"why\":\"%s\"}\n",
             fname, aq ? "aq" : "wo", dt == QL_DTYPE_F32 ? "f32" : "bf16",
             (long long)n, (long long)k, ms, impls,
             pass && any ? "true" : "false", (long long)bad_m,
             pass && any ? "" : why);
      fflush(stdout);
    }
  if (packed != nullptr) rp->free_packed(packed);
  ql_qweight_free(q);
  return 0;
}

// The batch-invariance check: every format of --formats on every shape of
// --inv-shapes. 0 when all PASS, 1 otherwise.
int check_invariance(const gopts* o, const ql_backend* b) {
  static const struct {
    const char* name;
    ql_format f;
    int asym;
    unsigned bit;
  } cfg[] = {{"q4g", QL_FORMAT_Q4G, 0, F_Q4G}, {"q8c", QL_FORMAT_Q8C, 0, F_Q8C},
             {"q8b", QL_FORMAT_Q8B, 0, F_Q8B}, {"q8b-asym", QL_FORMAT_Q8B, 1, F_Q8B},
             {"f8r", QL_FORMAT_F8R, 0, F_F8R}};
  int fails = 0;
  for (int si = 0; si < o->inv_sh.count; si++)
    for (const auto& c : cfg) {
      if ((o->formats & c.bit) == 0) continue;
      ql_quant_params qp = {c.f, o->gs, c.asym, QL_DTYPE_BF16};
      if (inv_weight(o, b, c.name, &qp, o->inv_sh.n[si], o->inv_sh.k[si],
                     &fails) != 0) {
        printf("FAIL batch invariance %s %lldx%lld: cannot make the weight\n",
               c.name, (long long)o->inv_sh.n[si], (long long)o->inv_sh.k[si]);
        fails++;
      }
    }
  if (!o->json)
    printf("batch invariance: %s\n", fails ? "FAIL" : "PASS");
  return fails ? 1 : 0;
}

}  // namespace

int ql_bench_gpu(const char* device, int argc, char** argv) {
  gopts o;
  const ql_backend* b = nullptr;
  ql_device_desc desc;
  int ordinal = 0, rc, inv_rc = 0;
  runner r;
  memset(&r, 0, sizeof r);

  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    }
  if (!parse(argc, argv, &o)) {
    usage(stderr);
    return 2;
  }
#ifdef QL_CUDA_EMU
  o.graph = false;  // the emulated runtime has no graphs
#endif
  if ((rc = find_device(device, &b, &ordinal, &desc)) != 0) return rc;
  if ((rc = b->device_bind(ordinal)) != 0) {
    fprintf(stderr, "qlinear-bench: %s: %s\n", device, ql_strerror(rc));
    return 1;
  }
  if (!o.json)
    printf("qlinear-bench: kernels on %s (%s, %s), %zu MiB; linear_wo: the "
           "%s kernel\n",
           desc.alias, desc.name, desc.model, desc.memory_bytes >> 20,
           ql__cuda_wo_kernel() == QL__CUDA_WO_LEGACY  ? "legacy"
           : ql__cuda_wo_kernel() == QL__CUDA_WO_TILED ? "tiled streaming"
           : ql__cuda_wo_kernel() == QL__CUDA_WO_WIDE  ? "wide streaming"
           : ql__cuda_wo_kernel() == QL__CUDA_WO_SIMT  ? "persistent streaming"
                                                       : "tensor-core (q4g with "
                                                         "f16/bf16 x) or "
                                                         "persistent streaming");
  if (o.invariance || o.inv_only) inv_rc = check_invariance(&o, b);
  if (o.inv_only) return inv_rc;

  r.o = &o;
  r.desc = &desc;
  int l2 = 0, sms = 0;
  if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, ordinal) !=
          cudaSuccess ||
      l2 <= 0) {
    (void)cudaGetLastError();
    l2 = 64 << 20;  // larger than any L2 so far
  }
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
                             ordinal) != cudaSuccess ||
      sms <= 0) {
    (void)cudaGetLastError();
    sms = 132;
  }
  r.l2 = size_t(l2);
  r.sms = sms;
  if (!ok(cudaStreamCreateWithFlags(&r.s, cudaStreamNonBlocking),
          "cudaStreamCreateWithFlags") ||
      !ok(cudaEventCreateWithFlags(&r.e0, cudaEventDefault),
          "cudaEventCreateWithFlags") ||
      !ok(cudaEventCreateWithFlags(&r.e1, cudaEventDefault),
          "cudaEventCreateWithFlags"))
    return 1;
  // cuBLASLt on this device, for f8r AQ and q8c IMMA.
  ql__blaslt* lt = nullptr;
  const char* why = nullptr;
  if ((o.formats & (F_F8R | F_Q8C)) != 0) {
    if (ql__blaslt_load(&why) == 0) {
      if ((rc = ql__blaslt_create(&lt)) != 0) {
        lt = nullptr;
        why = ql_strerror(rc);
      }
    }
    if (lt == nullptr)
      fprintf(stderr, "qlinear-bench: no cuBLASLt (%s): f8r linear_aq and "
              "q8c linear_aq_lt not benched\n", why ? why : "?");
  }
  if (!o.json) {
    if (desc.peak_bytes_per_s)
      printf("peak memory bandwidth %.1f GB/s (memory clock x 2 x bus "
             "width); L2 %d MiB, %d SMs; %d samples per figure, %s\n",
             double(desc.peak_bytes_per_s) / 1e9, l2 >> 20, sms, o.pairs,
             o.graph ? "CUDA graphs" : "direct launches");
    else
      printf("peak memory bandwidth unknown: no ratios\n");
    printf("x READ: time of a streaming read of the same bytes / the case's "
           "time\n");
    printf("%-13s %-4s %13s %5s %11s %10s %8s %6s %-21s %7s\n", "KERNEL",
           "FMT", "N x K", "M", "BYTES/CALL", "US/CALL", "GB/S", "x READ",
           "x PEAK [min-max]", "TOPS");
  }
  rc = 0;
  {
    rpool pool;
    for (int i = 0; i < o.sh.count && rc == 0; i++)
      rc = run_shape(&r, &pool, b, ordinal, lt, o.sh.n[i], o.sh.k[i]);
  }
  ql__blaslt_free(lt);
  (void)cudaEventDestroy(r.e0);
  (void)cudaEventDestroy(r.e1);
  (void)cudaStreamDestroy(r.s);
  return rc != 0 ? rc : inv_rc;
}
