/*
 * qlinear_bench.c - qlinear-bench, the kernel benchmark of DESIGN §12 and
 * issue 5. Built by `make`, never run by `make check`.
 *
 * For each case (shape N x K, format, path WO/AQ, rows M) it times the
 * implementation the daemon would run on the CPU device (ql_dispatch on
 * the cpu backend, reading the layout its repack made) and compares it,
 * in the same run, with baselines:
 *   read     a streaming read of the same number of weight bytes (qdata,
 *            scales and zeros) with the same threads (the CPU pool):
 *            figure = our weight bytes/s ÷ the loop's bytes/s;
 *   openblas sgemv (M = 1) / sgemm on the dequantized f32 weight, what a
 *            user would otherwise run (when configure found OpenBLAS);
 *   onednn   u8s8s32 GEMM of the same shape, q8c AQ only (when configure
 *            found oneDNN); the int32 result only, without our
 *            quantization of x and f32 epilogue, so it favours oneDNN;
 *   ref      our generic reference op (M <= --ref-max-m: it is scalar);
 *   q8c-aq   for q4g AQ (W4A8), our q8c AQ on the same shape.
 * Every figure except the read one is a speed-up: baseline time ÷ our
 * time (> 1: we are faster). Each is the median of P >= 5 interleaved A/B
 * pairs (ours then the baseline, the order alternating between pairs), with
 * the min and max over the pairs, because these machines are shared and
 * noisy. A sample is enough calls to last --min-sample-ms; the calls rotate
 * over copies of the weight whose total size is at least 4x the last-level
 * cache, so that every call streams its weight from memory (M = 1 is a
 * memory-bound GEMV; the same holds for every M, as for a real model's
 * layers).
 *
 * Output: a table for people, and one JSON object per case on a line that
 * starts with "{" (grep '^{').
 *
 * `qlinear-bench daemon` measures qlineard end to end (bench_daemon.c).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_restart.h"
#include "bench.h"
#include "cpu.h"
#include "ql_kernels.h"
#include "registry.h"

#ifdef QL_BENCH_OPENBLAS
#include <cblas.h>
#endif
#ifdef QL_BENCH_DNNL
#include <dnnl.h>
#endif

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ------------------------------------------------------------ options */

#define MAXS 8
#define MAXM 16

/* The formats --formats takes, in the order they run. */
typedef struct bfmt {
  const char *name;
  ql_format f;
  int asym; /* q8b with a zero point */
} bfmt;

enum { BF_Q4G, BF_Q8C, BF_Q8B, BF_Q8BA, BF_F8R, NBF };
static const bfmt bfmts[NBF] = {
    [BF_Q4G] = {"q4g", QL_FORMAT_Q4G, 0},
    [BF_Q8C] = {"q8c", QL_FORMAT_Q8C, 0},
    [BF_Q8B] = {"q8b", QL_FORMAT_Q8B, 0},
    [BF_Q8BA] = {"q8b-asym", QL_FORMAT_Q8B, 1},
    [BF_F8R] = {"f8r", QL_FORMAT_F8R, 0},
};

typedef struct opts {
  int64_t n[MAXS], k[MAXS];
  int nshape;
  int fmt[NBF]; /* 1: run format bfmts[i] */
  int wo, aq;
  int64_t ms[MAXM];
  int nm;
  int pairs;
  int threads;
  uint32_t gs;
  int64_t ref_max_m;
  double min_sample_s;
  double llc_bytes;
  int blas, dnnl;
  int json_only;
  ql_dtype sdt;
} opts;

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: qlinear-bench [options]\n"
      "  --quick            4096x4096, M in {1,16,512}, 5 pairs, short "
      "samples\n"
      "  --shapes NxK,...   default 4096x4096,14336x4096,4096x14336\n"
      "  --formats LIST     of q4g,q8c,q8b,q8b-asym,f8r (default q4g,q8c)\n"
      "  --paths LIST       wo,aq (default both)\n"
      "  --m LIST           rows, default 1,2,4,8,16,32,64,128,256,512\n"
      "  --pairs P          interleaved A/B pairs per figure (>= 5, default "
      "7)\n"
      "  --threads T        CPU pool size (QL_CPU_THREADS), default 2\n"
      "  --gs G             q4g group size and q8b block length, default "
      "128\n"
      "  --scale-dtype D    bf16 (default), f16 or f32\n"
      "  --ref-max-m M      compare with the generic op up to M rows (default "
      "8)\n"
      "  --min-sample-ms S  minimum length of one timed sample (default 60)\n"
      "  --llc-mb L         last-level cache size (default: sysconf, else 32)\n"
      "  --no-blas, --no-dnnl  skip those baselines\n"
      "  --json             JSON lines only\n"
      "  --device D         cpu (default), or cuda:N / cuda:<uuid>: each "
      "CUDA\n"
      "                     kernel's memory bandwidth against the GPU's "
      "peak\n"
      "                     (--device cuda:0 --help for its options)\n"
      "       qlinear-bench daemon [options]  (qlineard end to end; "
      "daemon --help)\n"
      "       qlinear-bench crossover [--shapes NxK,..] [--formats ..] "
      "(WO vs AQ per M, the crossover, its regret)\n"
      "       qlinear-bench model [options]  (a causal LM through qlineard "
      "against\n"
      "                         bf16 and TorchAO; model --help)\n"
      "       qlinear-bench restart [--gib G] [--pairs P] [--daemon PATH]\n"
      "                             [--cache warm|cold|both]\n"
      "                         (restart time with G GiB of stored weights,\n"
      "                         their files in the page cache or not)\n");
}

static int parse_list(const char *s, int64_t *out, int max) {
  int n = 0;
  char *end;
  while (*s && n < max) {
    long long v = strtoll(s, &end, 10);
    if (end == s || v < 1)
      return -1;
    out[n++] = v;
    s = *end == ',' ? end + 1 : end;
    if (*end && *end != ',')
      return -1;
  }
  return n;
}

static int parse_shapes(const char *s, opts *o) {
  o->nshape = 0;
  while (*s && o->nshape < MAXS) {
    char *end;
    long long n = strtoll(s, &end, 10), k;
    if (*end != 'x')
      return -1;
    k = strtoll(end + 1, &end, 10);
    if (n < 1 || k < 1 || (*end && *end != ','))
      return -1;
    o->n[o->nshape] = n;
    o->k[o->nshape++] = k;
    s = *end ? end + 1 : end;
  }
  return o->nshape > 0 ? 0 : -1;
}

/* A comma-separated list of bfmts names into o->fmt; -1 on an unknown
 * name or an empty list. */
static int parse_formats(const char *v, opts *o) {
  int any = 0;
  memset(o->fmt, 0, sizeof o->fmt);
  while (*v) {
    size_t len = strcspn(v, ",");
    int i;
    for (i = 0; i < NBF; i++)
      if (strlen(bfmts[i].name) == len && strncmp(v, bfmts[i].name, len) == 0)
        break;
    if (i == NBF)
      return -1;
    o->fmt[i] = any = 1;
    v += len;
    if (*v == ',')
      v++;
  }
  return any ? 0 : -1;
}

/* The last-level cache one core sees: sysfs (what lscpu prints), else
 * sysconf (which in some VMs adds up the host's caches), else 32 MiB. */
static double llc_bytes(void) {
  FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
  long v = 0;
  char unit = 0;
  if (f != NULL) {
    if (fscanf(f, "%ld%c", &v, &unit) < 1)
      v = 0;
    fclose(f);
    if (v > 0)
      return (double)v * (unit == 'K' ? 1024.0 : unit == 'M' ? 1048576.0 : 1.0);
  }
  v = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return v > 0 ? (double)v : 32.0 * 1048576;
}

static int parse_opts(int argc, char **argv, opts *o) {
  static const int64_t ms[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
  memset(o, 0, sizeof *o);
  o->n[0] = 4096, o->k[0] = 4096;
  o->n[1] = 14336, o->k[1] = 4096;
  o->n[2] = 4096, o->k[2] = 14336;
  o->nshape = 3;
  o->fmt[BF_Q4G] = o->fmt[BF_Q8C] = 1;
  o->wo = o->aq = 1;
  memcpy(o->ms, ms, sizeof ms);
  o->nm = 10;
  o->pairs = 7;
  o->threads = 2;
  o->gs = 128;
  o->ref_max_m = 8;
  o->min_sample_s = 0.060;
  o->llc_bytes = llc_bytes();
  o->blas = o->dnnl = 1;
  o->sdt = QL_DTYPE_BF16;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV                                                                  \
  do {                                                                         \
    if (v == NULL)                                                             \
      return -1;                                                               \
    i++;                                                                       \
  } while (0)
    if (strcmp(a, "--quick") == 0) {
      o->nshape = 1;
      o->ms[0] = 1, o->ms[1] = 16, o->ms[2] = 512;
      o->nm = 3;
      o->pairs = 5;
      o->min_sample_s = 0.030;
    } else if (strcmp(a, "--shapes") == 0) {
      NEEDV;
      if (parse_shapes(v, o) != 0)
        return -1;
    } else if (strcmp(a, "--formats") == 0) {
      NEEDV;
      if (parse_formats(v, o) != 0)
        return -1;
    } else if (strcmp(a, "--paths") == 0) {
      NEEDV;
      o->wo = strstr(v, "wo") != NULL;
      o->aq = strstr(v, "aq") != NULL;
      if (!o->wo && !o->aq)
        return -1;
    } else if (strcmp(a, "--m") == 0) {
      NEEDV;
      if ((o->nm = parse_list(v, o->ms, MAXM)) <= 0)
        return -1;
    } else if (strcmp(a, "--pairs") == 0) {
      NEEDV;
      o->pairs = atoi(v);
      if (o->pairs < 5)
        return -1;
    } else if (strcmp(a, "--threads") == 0) {
      NEEDV;
      o->threads = atoi(v);
      if (o->threads < 1)
        return -1;
    } else if (strcmp(a, "--gs") == 0) {
      NEEDV;
      o->gs = (uint32_t)atoi(v);
      if (!ql_group_size_valid(QL_FORMAT_Q4G, o->gs))
        return -1;
    } else if (strcmp(a, "--scale-dtype") == 0) {
      NEEDV;
      o->sdt = strcmp(v, "f32") == 0   ? QL_DTYPE_F32
               : strcmp(v, "f16") == 0 ? QL_DTYPE_F16
                                       : QL_DTYPE_BF16;
    } else if (strcmp(a, "--ref-max-m") == 0) {
      NEEDV;
      o->ref_max_m = atoll(v);
    } else if (strcmp(a, "--min-sample-ms") == 0) {
      NEEDV;
      o->min_sample_s = atof(v) / 1000.0;
    } else if (strcmp(a, "--llc-mb") == 0) {
      NEEDV;
      o->llc_bytes = atof(v) * 1048576;
    } else if (strcmp(a, "--no-blas") == 0) {
      o->blas = 0;
    } else if (strcmp(a, "--no-dnnl") == 0) {
      o->dnnl = 0;
    } else if (strcmp(a, "--json") == 0) {
      o->json_only = 1;
    } else {
      return -1;
    }
#undef NEEDV
  }
  return 0;
}

/* ------------------------------------------------------------ timing */

double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One sample: reps calls; the time per call. */
double sample(timed *t) {
  double t0 = now_s();
  for (long r = 0; r < t->reps; r++)
    t->run(t->ctx, t->next++);
  return (now_s() - t0) / (double)t->reps;
}

/* Enough calls per sample to last min_s (one warm-up call first). */
void calibrate(timed *t, double min_s) {
  double t1;
  t->reps = 1;
  sample(t);
  t1 = sample(t);
  t->reps = t1 >= min_s ? 1 : (long)ceil(min_s / (t1 > 1e-7 ? t1 : 1e-7));
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

stat3 stats(double *v, int n) {
  stat3 s = {0, 0, 0, 1};
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  s.min = v[0];
  s.max = v[n - 1];
  s.med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  return s;
}

/*
 * P interleaved pairs of (a, b): ratio_i = time_b / time_a; the order
 * alternates (a b, b a, ...). Also the medians of both times.
 */
static stat3 ab_pairs(timed *a, timed *b, int pairs, double min_s,
                      double *ta_med, double *tb_med) {
  double r[64], ta[64], tb[64];
  if (pairs > 64)
    pairs = 64;
  calibrate(a, min_s);
  calibrate(b, min_s);
  for (int p = 0; p < pairs; p++) {
    if (p % 2 == 0) {
      ta[p] = sample(a);
      tb[p] = sample(b);
    } else {
      tb[p] = sample(b);
      ta[p] = sample(a);
    }
    r[p] = tb[p] / ta[p];
  }
  *ta_med = stats(ta, pairs).med;
  *tb_med = stats(tb, pairs).med;
  return stats(r, pairs);
}

/* ------------------------------------------------------- the read loop */

typedef struct read_ctx {
  const uint8_t *const *bufs;
  int ncopies;
  size_t bytes; /* per call, a multiple of 256 */
  const uint8_t *cur;
  volatile uint64_t sink;
  ql__cpu_level level;
} read_ctx;

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static uint64_t read512(const uint8_t *p,
                                                           size_t n) {
  __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i < n; i += 256) {
    s0 = _mm512_add_epi64(s0, _mm512_load_si512((const void *)(p + i)));
    s1 = _mm512_add_epi64(s1, _mm512_load_si512((const void *)(p + i + 64)));
    s2 = _mm512_add_epi64(s2, _mm512_load_si512((const void *)(p + i + 128)));
    s3 = _mm512_add_epi64(s3, _mm512_load_si512((const void *)(p + i + 192)));
  }
  s0 = _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3));
  return (uint64_t)_mm512_reduce_add_epi64(s0);
}

__attribute__((target("avx2"))) static uint64_t read256(const uint8_t *p,
                                                        size_t n) {
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i < n; i += 128) {
    s0 = _mm256_add_epi64(s0, _mm256_load_si256((const __m256i *)(p + i)));
    s1 = _mm256_add_epi64(s1, _mm256_load_si256((const __m256i *)(p + i + 32)));
    s2 = _mm256_add_epi64(s2, _mm256_load_si256((const __m256i *)(p + i + 64)));
    s3 = _mm256_add_epi64(s3, _mm256_load_si256((const __m256i *)(p + i + 96)));
  }
  s0 = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
  uint64_t v[4];
  _mm256_storeu_si256((__m256i *)v, s0);
  return v[0] + v[1] + v[2] + v[3];
}
#endif

static uint64_t read_c(const uint8_t *p, size_t n) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, v[4];
  for (size_t i = 0; i < n; i += 32) {
    memcpy(v, p + i, 32);
    s0 += v[0], s1 += v[1], s2 += v[2], s3 += v[3];
  }
  return s0 + s1 + s2 + s3;
}

/* Part of one read call: a contiguous 256-byte-aligned slice per thread,
 * like the kernels' contiguous ranges of tiles. */
static void read_part(void *ctx, int part, int parts) {
  read_ctx *r = ctx;
  size_t chunks = r->bytes / 256;
  size_t c0 = chunks * (size_t)part / (size_t)parts,
         c1 = chunks * (size_t)(part + 1) / (size_t)parts;
  const uint8_t *p = r->cur + c0 * 256;
  size_t n = (c1 - c0) * 256;
  uint64_t s;
#if defined(__x86_64__)
  if (r->level >= QL_CPU_LEVEL_AVX512)
    s = read512(p, n);
  else if (r->level >= QL_CPU_LEVEL_AVX2)
    s = read256(p, n);
  else
#endif
    s = read_c(p, n);
  r->sink += s;
}

static void read_run(void *ctx, long i) {
  read_ctx *r = ctx;
  r->cur = r->bufs[i % r->ncopies];
  ql__cpu_parallel(read_part, r, ql__cpu_threads());
}

/* ------------------------------------------------------ the peak loops */

/*
 * In-run compute peaks with the same threads: independent VNNI int8 dot
 * products (vpdpbusd: 4 multiply-adds per 32-bit lane) and independent
 * f32 FMAs, at the widest register the kernels' level has, with 12
 * accumulators to cover the instructions' latency on two ports. The AQ
 * kernels are held to the first, the WO kernels to the second, in
 * multiply-adds per second. No peak where the level has no such
 * instruction (VNNI below avx2vnni, FMA at the C level).
 */
#define PEAK_ACC 12
#define PEAK_ITERS (1L << 17) /* a call of about a millisecond: the pool's wake-up is noise */

typedef struct peak_ctx {
  int fma;               /* 1: f32 FMA, 0: VNNI */
  ql__cpu_level level;
  volatile uint64_t sink;
} peak_ctx;

#if defined(__x86_64__)
/* Twelve named accumulators, so that they live in registers: OP(acc) is
 * one step of one chain. Each starts from its own value and each step is
 * an asm statement: with equal starting values the compiler proved the
 * twelve chains equal and kept one, a single dependent chain timed as
 * twelve (the peaks read about 1.5x the machine's). */
#define PEAK_STEP(OP)                                                          \
  do {                                                                         \
    OP(a0); OP(a1); OP(a2); OP(a3); OP(a4); OP(a5); OP(a6); OP(a7); OP(a8);    \
    OP(a9); OP(a10); OP(a11);                                                  \
  } while (0)
#define PEAK_INIT(set1, type)                                                  \
  type a0 = set1(0), a1 = set1(1), a2 = set1(2), a3 = set1(3), a4 = set1(4),   \
       a5 = set1(5), a6 = set1(6), a7 = set1(7), a8 = set1(8), a9 = set1(9),   \
       a10 = set1(10), a11 = set1(11)

__attribute__((target("avx512f,avx512vnni"))) static uint64_t
vnni512(long iters) {
  __m512i b = _mm512_set1_epi32(0x01020304), c = _mm512_set1_epi32(0x01010101);
  PEAK_INIT(_mm512_set1_epi32, __m512i);
#define OP(x) __asm__ volatile("vpdpbusd %2, %1, %0" : "+v"(x) : "v"(b), "v"(c))
  for (long i = 0; i < iters; i++)
    PEAK_STEP(OP);
#undef OP
  a0 = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1),
                                         _mm512_add_epi32(a2, a3)),
                        _mm512_add_epi32(_mm512_add_epi32(a4, a5),
                                         _mm512_add_epi32(a6, a7)));
  a0 = _mm512_add_epi32(a0, _mm512_add_epi32(_mm512_add_epi32(a8, a9),
                                             _mm512_add_epi32(a10, a11)));
  return (uint64_t)(uint32_t)_mm512_reduce_add_epi32(a0);
}

__attribute__((target("avx2,avxvnni"))) static uint64_t vnni256(long iters) {
  __m256i b = _mm256_set1_epi32(0x01020304), c = _mm256_set1_epi32(0x01010101);
  PEAK_INIT(_mm256_set1_epi32, __m256i);
#define OP(x)                                                                  \
  __asm__ volatile("%{vex%} vpdpbusd %2, %1, %0" : "+x"(x) : "x"(b), "x"(c))
  for (long i = 0; i < iters; i++)
    PEAK_STEP(OP);
#undef OP
  a0 = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1),
                                         _mm256_add_epi32(a2, a3)),
                        _mm256_add_epi32(_mm256_add_epi32(a4, a5),
                                         _mm256_add_epi32(a6, a7)));
  a0 = _mm256_add_epi32(a0, _mm256_add_epi32(_mm256_add_epi32(a8, a9),
                                             _mm256_add_epi32(a10, a11)));
  uint32_t v[8];
  _mm256_storeu_si256((__m256i *)v, a0);
  return v[0] + v[7];
}

/* a·1 + 0 keeps each accumulator finite. */
__attribute__((target("avx512f"))) static uint64_t fma512(long iters) {
  volatile float one = 1.0f, zero = 0.0f;
  __m512 b = _mm512_set1_ps(one), c = _mm512_set1_ps(zero);
  PEAK_INIT(_mm512_set1_ps, __m512);
#define OP(x)                                                                  \
  __asm__ volatile("vfmadd213ps %2, %1, %0" : "+v"(x) : "v"(b), "v"(c))
  for (long i = 0; i < iters; i++)
    PEAK_STEP(OP);
#undef OP
  a0 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                     _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  a0 = _mm512_add_ps(a0, _mm512_add_ps(_mm512_add_ps(a8, a9),
                                       _mm512_add_ps(a10, a11)));
  return (uint64_t)_mm512_reduce_add_ps(a0);
}

__attribute__((target("avx2,fma"))) static uint64_t fma256(long iters) {
  volatile float one = 1.0f, zero = 0.0f;
  __m256 b = _mm256_set1_ps(one), c = _mm256_set1_ps(zero);
  PEAK_INIT(_mm256_set1_ps, __m256);
#define OP(x)                                                                  \
  __asm__ volatile("vfmadd213ps %2, %1, %0" : "+x"(x) : "x"(b), "x"(c))
  for (long i = 0; i < iters; i++)
    PEAK_STEP(OP);
#undef OP
  a0 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                     _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  a0 = _mm256_add_ps(a0, _mm256_add_ps(_mm256_add_ps(a8, a9),
                                       _mm256_add_ps(a10, a11)));
  float v[8];
  _mm256_storeu_ps(v, a0);
  return (uint64_t)(v[0] + v[7]);
}
#endif

/* Multiply-adds of one peak call on one thread at level l; 0: no peak. */
static double peak_macs(int fma, ql__cpu_level l) {
  double per = fma ? (l >= QL_CPU_LEVEL_AVX512 ? 16 : l >= QL_CPU_LEVEL_AVX2 ? 8 : 0)
                   : (l >= QL_CPU_LEVEL_AVX512 ? 64 : l >= QL_CPU_LEVEL_AVX2_VNNI ? 32 : 0);
  return per * PEAK_ACC * (double)PEAK_ITERS;
}

static void peak_part(void *ctx, int part, int parts) {
  peak_ctx *c = ctx;
  uint64_t s = 0;
  (void)part, (void)parts;
#if defined(__x86_64__)
  if (c->fma && c->level >= QL_CPU_LEVEL_AVX512)
    s = fma512(PEAK_ITERS);
  else if (c->fma && c->level >= QL_CPU_LEVEL_AVX2)
    s = fma256(PEAK_ITERS);
  else if (!c->fma && c->level >= QL_CPU_LEVEL_AVX512)
    s = vnni512(PEAK_ITERS);
  else if (!c->fma && c->level >= QL_CPU_LEVEL_AVX2_VNNI)
    s = vnni256(PEAK_ITERS);
#endif
  c->sink += s;
}

static void peak_run(void *ctx, long i) {
  (void)i;
  ql__cpu_parallel(peak_part, ctx, ql__cpu_threads());
}

/* The peak in multiply-adds per second over every pool thread: the
 * median of P samples (0 when the level has none). */
static double peak_rate(int fma, int pairs, double min_s) {
  ql__cpu_level l = ql__cpu_level_get();
  double per = peak_macs(fma, l), t[64];
  if (per == 0)
    return 0;
  peak_ctx c = {fma, l, 0};
  timed pk = {fma ? "fma" : "vnni", peak_run, &c, 0, 0};
  if (pairs > 64)
    pairs = 64;
  calibrate(&pk, min_s);
  for (int p = 0; p < pairs; p++)
    t[p] = sample(&pk);
  return per * ql__cpu_threads() / stats(t, pairs).med;
}

/* ------------------------------------------------------------- cases */

void lin_run(void *ctx, long i) {
  lin_ctx *c = ctx;
  ql_linear_args a = {
      c->ws->q,     c->ref ? NULL : c->ws->pk[i % c->ws->ncopies],
      QL_DTYPE_F32, c->x,
      c->m,         c->y,
      NULL};
  int rc = c->im->fn.linear(&a);
  if (rc != 0) {
    fprintf(stderr, "qlinear-bench: %s returned %d\n", c->im->name, rc);
    exit(1);
  }
}

#ifdef QL_BENCH_OPENBLAS
typedef struct blas_ctx {
  const wset *ws;
  const float *x;
  int64_t m;
  float *y;
} blas_ctx;

static void blas_run(void *ctx, long i) {
  blas_ctx *c = ctx;
  const float *w = c->ws->deq[i % c->ws->nf];
  int n = (int)c->ws->q->n, k = (int)c->ws->q->k;
  if (c->m == 1)
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, w, k, c->x, 1, 0.0f,
                c->y, 1);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)c->m, n, k, 1.0f,
                c->x, k, w, k, 0.0f, c->y, n);
}
#endif

#ifdef QL_BENCH_DNNL
typedef struct dnnl_ctx {
  const wset *ws;
  const uint8_t *xu; /* x quantized, +128 */
  int64_t m;
  int32_t *c;
} dnnl_ctx;

static void dnnl_run(void *ctx, long i) {
  dnnl_ctx *d = ctx;
  int32_t co = 0;
  (void)i;
  /* C[M,N] = (A - 128)·Bᵀ: A = x as u8 (+128), B = W [N,K] int8 */
  if (dnnl_gemm_u8s8s32('N', 'T', 'F', d->m, d->ws->q->n, d->ws->q->k, 1.0f,
                        d->xu, d->ws->q->k, 128, d->ws->w8, d->ws->q->k, 0,
                        0.0f, d->c, d->ws->q->n, &co) != dnnl_success) {
    fprintf(stderr, "qlinear-bench: dnnl_gemm_u8s8s32 failed\n");
    exit(1);
  }
}
#endif

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;

double gauss(void) {
  double u1, u2;
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  u1 = ((double)(g_rng >> 11) + 0.5) * 0x1p-53;
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  u2 = ((double)(g_rng >> 11) + 0.5) * 0x1p-53;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void *xalloc(size_t n) {
  void *p = aligned_alloc(64, (n + 63) / 64 * 64);
  if (p == NULL) {
    fprintf(stderr, "qlinear-bench: out of memory (%zu bytes)\n", n);
    exit(1);
  }
  return p;
}

int wset_build(ql_format f, uint32_t gs, int asym, ql_dtype sdt, int64_t n,
               int64_t k, double llc_bytes, int blas, wset *ws) {
  size_t nk = (size_t)(n * k);
  uint16_t *wb = xalloc(nk * sizeof(uint16_t));
  float *tmp = xalloc(nk * sizeof(float));
  int grouped = f == QL_FORMAT_Q4G || f == QL_FORMAT_Q8B;
  ql_quant_params p = {f, grouped ? gs : 0, asym, sdt};
  int rc;

  memset(ws, 0, sizeof *ws);
  ws->f = f;
  /* a bf16 weight, as models ship them: N(0, 0.02) */
  for (size_t i = 0; i < nk; i++)
    tmp[i] = (float)(0.02 * gauss());
  ql_from_f32(QL_DTYPE_BF16, tmp, wb, nk);
  if ((rc = ql_qweight_quantize(&p, n, k, QL_DTYPE_BF16, wb, NULL, &ws->q)))
    return rc;
  free(wb);
  ws->wbytes = ws->q->qdata_bytes + ws->q->scale_bytes * (ws->q->zero ? 2 : 1);
  ws->ncopies = (int)ceil(4.0 * llc_bytes / (double)ws->wbytes);
  if (ws->ncopies < 1)
    ws->ncopies = 1;
  ws->rp = ql_dispatch(ql_backend_find("cpu"), QL_OP_REPACK, f, QL_DTYPE_F32, 0,
                       n, k);
  ws->pk = calloc((size_t)ws->ncopies, sizeof *ws->pk);
  for (int c = 0; c < ws->ncopies; c++) {
    ql_repack_args ra = {ws->q, NULL, 0};
    if ((rc = ws->rp->fn.repack(&ra)) != 0)
      return rc;
    ws->pk[c] = ra.packed;
  }
  if (blas) {
    size_t fb = nk * sizeof(float);
    ws->nf = (int)ceil(4.0 * llc_bytes / (double)fb);
    ws->deq = calloc((size_t)ws->nf, sizeof *ws->deq);
    ql_qweight_dequantize(ws->q, tmp);
    for (int c = 0; c < ws->nf; c++) {
      ws->deq[c] = xalloc(fb);
      memcpy(ws->deq[c], tmp, fb);
    }
  }
  if (f == QL_FORMAT_Q8C)
    ws->w8 = (int8_t *)ws->q->qdata;
  free(tmp);
  return 0;
}

static int wset_make(const opts *o, const bfmt *bf, int64_t n, int64_t k,
                     wset *ws) {
  return wset_build(bf->f, o->gs, bf->asym, o->sdt, n, k, o->llc_bytes,
                    o->blas, ws);
}

void wset_free(wset *ws) {
  for (int c = 0; c < ws->ncopies; c++)
    ws->rp->free_packed(ws->pk[c]);
  for (int c = 0; c < ws->nf; c++)
    free(ws->deq[c]);
  free(ws->pk);
  free(ws->deq);
  ql_qweight_free(ws->q);
}

/* One figure of a case. */
typedef struct fig {
  const char *name;
  stat3 r;
  double t_base; /* median baseline time per call */
} fig;

#define MAXFIG 6

/* v as a JSON number, or null where it is not finite (a ratio over a
 * sample that saw no call): JSON has no inf or NaN. */
static void print_num(FILE *f, const char *key, double v, const char *end) {
  if (isfinite(v))
    fprintf(f, "\"%s\":%.4f%s", key, v, end);
  else
    fprintf(f, "\"%s\":null%s", key, end);
}

void print_stat(FILE *f, const char *name, stat3 s) {
  fprintf(f, ",\"%s\":{", name);
  print_num(f, "median", s.med, ",");
  print_num(f, "min", s.min, ",");
  print_num(f, "max", s.max, "}");
}

/* What a case reports beside its baselines: the run's peaks, and the time
 * of M = 1 of the same (shape, format, path) when it ran first (0: not). */
typedef struct run_ref {
  double vnni, fma; /* multiply-adds per second; 0: none */
  double t_m1;      /* seconds */
} run_ref;

static void run_case(const opts *o, const bfmt *bf, const wset *ws,
                     const wset *q8c, int aq, int64_t m, int header,
                     run_ref *rr) {
  const ql_backend *cpu = ql_backend_find("cpu");
  ql_op op = aq ? QL_OP_LINEAR_AQ : QL_OP_LINEAR_WO;
  int64_t n = ws->q->n, k = ws->q->k;
  const ql_kernel_impl *im = ql_dispatch(cpu, op, ws->f, QL_DTYPE_F32, m, n, k);
  float *x = xalloc((size_t)(m * k) * sizeof(float));
  float *y = xalloc((size_t)(m * n) * sizeof(float));
  float *y2 = xalloc((size_t)(m * n) * sizeof(float));
  fig figs[MAXFIG];
  int nfig = 0;
  double t_ours = 0, t_base, t_a;
  const uint8_t **bufs;
  read_ctx rc;
  char fmt[24];

  if (im == NULL)
    return;
  for (int64_t i = 0; i < m * k; i++)
    x[i] = (float)gauss();
  lin_ctx oc = {im, ws, x, m, y, 0};
  timed ours = {"ours", lin_run, &oc, 0, 0};

  /* read roofline: the same bytes from the same (rotating) memory */
  bufs = calloc((size_t)ws->ncopies, sizeof *bufs);
  for (int c = 0; c < ws->ncopies; c++)
    bufs[c] = ws->pk[c]->data;
  memset(&rc, 0, sizeof rc);
  rc.bufs = bufs;
  rc.ncopies = ws->ncopies;
  rc.bytes = ws->wbytes / 256 * 256;
  rc.level = ql__cpu_level_get();
  timed rd = {"read", read_run, &rc, 0, 0};
  figs[nfig].name = "read";
  figs[nfig].r = ab_pairs(&ours, &rd, o->pairs, o->min_sample_s, &t_ours,
                          &figs[nfig].t_base);
  /* bytes/s ratio: (wbytes/t_ours) / (rc.bytes/t_read) */
  figs[nfig].r.med *= (double)ws->wbytes / (double)rc.bytes;
  figs[nfig].r.min *= (double)ws->wbytes / (double)rc.bytes;
  figs[nfig].r.max *= (double)ws->wbytes / (double)rc.bytes;
  nfig++;

  /* Against the compute peak the path's kernels are held to, paired like
   * the read loop (the machine's speed moves during a run): per pair,
   * our multiply-adds/s over the peak loop's. */
  stat3 xpk = {0, 0, 0, 0};
  double peak = 0;
  ql__cpu_level lvl = ql__cpu_level_get();
  double pk_macs = peak_macs(!aq, lvl) * ql__cpu_threads();
  if (pk_macs > 0) {
    peak_ctx pc = {!aq, lvl, 0};
    timed pk = {aq ? "vnni" : "fma", peak_run, &pc, 0, 0};
    double t_pk, mine = (double)m * (double)n * (double)k / pk_macs;
    xpk = ab_pairs(&ours, &pk, o->pairs, o->min_sample_s, &t_a, &t_pk);
    xpk.med *= mine;
    xpk.min *= mine;
    xpk.max *= mine;
    peak = pk_macs / t_pk;
  }

#ifdef QL_BENCH_OPENBLAS
  if (o->blas) {
    blas_ctx bc = {ws, x, m, y2};
    timed bl = {"openblas", blas_run, &bc, 0, 0};
    figs[nfig].name = m == 1 ? "openblas_sgemv" : "openblas_sgemm";
    figs[nfig].r = ab_pairs(&ours, &bl, o->pairs, o->min_sample_s, &t_a,
                            &figs[nfig].t_base);
    nfig++;
  }
#endif
#ifdef QL_BENCH_DNNL
  if (o->dnnl && aq && ws->f == QL_FORMAT_Q8C) {
    uint8_t *xu = xalloc((size_t)(m * k));
    int32_t *cc = xalloc((size_t)(m * n) * sizeof(int32_t));
    for (int64_t i = 0; i < m * k; i++)
      xu[i] = (uint8_t)(128 + (int)lrintf(
                                  fmaxf(fminf(x[i] * 40.0f, 127.0f), -128.0f)));
    dnnl_ctx dc = {ws, xu, m, cc};
    timed dn = {"onednn", dnnl_run, &dc, 0, 0};
    figs[nfig].name = "onednn_u8s8s32";
    figs[nfig].r = ab_pairs(&ours, &dn, o->pairs, o->min_sample_s, &t_a,
                            &figs[nfig].t_base);
    nfig++;
    free(xu);
    free(cc);
  }
#endif
  if (aq && ws->f == QL_FORMAT_Q4G && q8c != NULL) {
    const ql_kernel_impl *im8 =
        ql_dispatch(cpu, op, QL_FORMAT_Q8C, QL_DTYPE_F32, m, n, k);
    lin_ctx qc = {im8, q8c, x, m, y2, 0};
    timed q8 = {"q8c_aq", lin_run, &qc, 0, 0};
    figs[nfig].name = "q8c_aq";
    figs[nfig].r = ab_pairs(&ours, &q8, o->pairs, o->min_sample_s, &t_a,
                            &figs[nfig].t_base);
    nfig++;
  }
  if (m <= o->ref_max_m) {
    lin_ctx gc = {ql_generic_impl(op), ws, x, m, y2, 1};
    timed gr = {"ref", lin_run, &gc, 0, 0};
    double min_s = o->min_sample_s;
    figs[nfig].name = "ref";
    figs[nfig].r =
        ab_pairs(&ours, &gr, o->pairs, min_s, &t_a, &figs[nfig].t_base);
    nfig++;
  }

  if (ws->f == QL_FORMAT_Q4G || ws->f == QL_FORMAT_Q8B)
    snprintf(fmt, sizeof fmt, "%s/%c%u", bf->name,
             ws->f == QL_FORMAT_Q4G ? 'g' : 'b', o->gs);
  else
    snprintf(fmt, sizeof fmt, "%s", bf->name);
  t_base = figs[0].t_base;
  if (m == 1)
    rr->t_m1 = t_ours;
  double x_peak = xpk.med;
  /* The cost of M rows against one. */
  double vs_m1 = m > 1 && rr->t_m1 > 0 ? t_ours / rr->t_m1 : 0;
  if (!o->json_only) {
    if (header) {
      printf("\n%-11s %-13s %-3s %4s %9s %7s %-20s %6s %6s", "shape", "format",
             "pth", "M", "ms", "GB/s", "x read [min-max]", "x peak", "/ M=1");
      printf(" | speed-up, baseline time / ours, median [min-max]\n");
    }
    printf("%5lldx%-5lld %-13s %-3s %4lld %9.3f %7.2f %5.3f [%.3f-%.3f]",
           (long long)n, (long long)k, fmt, aq ? "AQ" : "WO", (long long)m,
           t_ours * 1e3, (double)ws->wbytes / t_ours * 1e-9, figs[0].r.med,
           figs[0].r.min, figs[0].r.max);
    if (x_peak > 0)
      printf(" %6.3f", x_peak);
    else
      printf(" %6s", "-");
    if (vs_m1 > 0)
      printf(" %6.2f", vs_m1);
    else
      printf(" %6s", "-");
    for (int i = 1; i < nfig; i++)
      printf(" | %s %.2f [%.2f-%.2f]", figs[i].name, figs[i].r.med,
             figs[i].r.min, figs[i].r.max);
    printf("\n");
  }
  printf("{\"bench\":\"kernel\",\"n\":%lld,\"k\":%lld,\"format\":\"%s\","
         "\"group_size\":%u,\"scale_dtype\":\"%s\",\"path\":\"%s\",\"m\":%lld,"
         "\"threads\":%d,\"level\":\"%s\",\"impl\":\"%s\",\"weight_bytes\":%zu,"
         "\"copies\":%d,\"pairs\":%d,\"ours_ms\":%.4f,\"ours_gbs\":%.3f,"
         "\"read_gbs\":%.3f",
         (long long)n, (long long)k, bf->name,
         ws->f == QL_FORMAT_Q4G || ws->f == QL_FORMAT_Q8B ? o->gs : 0,
         o->sdt == QL_DTYPE_F32   ? "f32"
         : o->sdt == QL_DTYPE_F16 ? "f16"
                                  : "bf16",
         aq ? "aq" : "wo", (long long)m, ql__cpu_threads(),
         ql__cpu_level_name(ql__cpu_level_get()), im->name, ws->wbytes,
         ws->ncopies, o->pairs, t_ours * 1e3,
         (double)ws->wbytes / t_ours * 1e-9, (double)rc.bytes / t_base * 1e-9);
  if (x_peak > 0) {
    printf(",\"%s_peak_macs\":%.4g", aq ? "vnni" : "fma", peak);
    print_stat(stdout, "vs_peak", xpk);
  }
  if (vs_m1 > 0)
    printf(",\"vs_m1\":%.4f", vs_m1);
  print_stat(stdout, "vs_read", figs[0].r);
  for (int i = 1; i < nfig; i++) {
    char key[40];
    snprintf(key, sizeof key, "vs_%s", figs[i].name);
    print_stat(stdout, key, figs[i].r);
  }
  printf("}\n");
  fflush(stdout);
  free(bufs);
  free(x);
  free(y);
  free(y2);
}

#ifdef QL_BENCH_GPU
int ql_bench_gpu(const char *device, int argc, char **argv);
#endif

/*
 * --device NAME, anywhere on the command line of the kernel bench: "cpu"
 * (the default) is the bench below; a CUDA device (cuda:N or
 * cuda:<uuid>) runs the GPU bench of bench_gpu.cpp with the other
 * arguments. Returns -1 to go on with the CPU (the option taken out of
 * argv), else the exit status.
 */
static int device_option(int *argc, char **argv) {
  const char *dev = NULL;
  int j = 1;
  for (int i = 1; i < *argc; i++) {
    if (strcmp(argv[i], "--device") == 0 && i + 1 < *argc) {
      dev = argv[++i];
      continue;
    }
    argv[j++] = argv[i];
  }
  if (dev == NULL)
    return -1;
  *argc = j;
  argv[j] = NULL;
  if (strcmp(dev, "cpu") == 0)
    return -1;
  if (strncmp(dev, "cuda:", 5) != 0) {
    fprintf(stderr, "qlinear-bench: no device '%s' (cpu, cuda:N or "
            "cuda:<uuid>)\n", dev);
    return 2;
  }
#ifdef QL_BENCH_GPU
  return ql_bench_gpu(dev, *argc, argv);
#else
  fprintf(stderr, "qlinear-bench: no device '%s': this build has no CUDA "
          "backend (configure --with-cuda)\n", dev);
  return 2;
#endif
}

int main(int argc, char **argv) {
  opts o;
  char tbuf[16];
  int rc;

  if (argc > 1 && strcmp(argv[1], "restart") == 0)
    return ql_bench_restart(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "crossover") == 0)
    return bench_crossover(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "model") == 0)
    return bench_model(argc - 1, argv + 1);
  /* The daemon bench has options of its own and needs no re-exec: it
   * calls no BLAS and sets the CPU pool's size itself. */
  if (argc > 1 && strcmp(argv[1], "daemon") == 0)
    return bench_daemon(argc - 1, argv + 1);
  if (argc > 1 &&
      (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
    usage(stdout);
    return 0;
  }
  if ((rc = device_option(&argc, argv)) >= 0)
    return rc;
  if (parse_opts(argc, argv, &o) != 0) {
    usage(stderr);
    return 2;
  }
  /* The pool size, and the baselines' threads, before anything starts
   * them. OpenBLAS and OpenMP read their settings when they load, so the
   * program runs itself again once with them in its environment: the
   * same thread count, and idle threads that sleep instead of spinning
   * through the other side's samples. */
  snprintf(tbuf, sizeof tbuf, "%d", o.threads);
  if (getenv("QL_BENCH_REEXEC") == NULL) {
    setenv("QL_BENCH_REEXEC", "1", 1);
    setenv("QL_CPU_THREADS", tbuf, 1);
    setenv("OPENBLAS_NUM_THREADS", tbuf, 1);
    setenv("OMP_NUM_THREADS", tbuf, 1);
    setenv("OPENBLAS_THREAD_TIMEOUT", "4", 0);
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    execv("/proc/self/exe", argv);
    /* no /proc: go on in this process */
  }
  setenv("QL_CPU_THREADS", tbuf, 1);

  if (!o.json_only) {
    printf("qlinear-bench: kernels (DESIGN §12). threads %d, level %s "
           "(detected %s), LLC %.0f MiB, %d pairs, samples >= %.0f ms\n",
           ql__cpu_threads(), ql__cpu_level_name(ql__cpu_level_get()),
           ql__cpu_level_name(ql__cpu_level_detected()), o.llc_bytes / 1048576,
           o.pairs, o.min_sample_s * 1e3);
    printf("baselines: read loop (same bytes, same threads)");
#ifdef QL_BENCH_OPENBLAS
    printf(", OpenBLAS %s", o.blas ? "sgemv/sgemm on dequant(W) f32" : "(off)");
#else
    printf(", OpenBLAS not built in");
#endif
#ifdef QL_BENCH_DNNL
    printf(", oneDNN %s", o.dnnl ? "u8s8s32 (q8c AQ)" : "(off)");
#else
    printf(", oneDNN not built in");
#endif
    printf(", generic reference (M <= %lld)%s\n", (long long)o.ref_max_m,
           o.fmt[BF_Q4G] && o.aq ? ", our q8c AQ (for q4g AQ)" : "");
    printf("x read = our weight bytes/s / the read loop's; the other figures "
           "= baseline time / our time (>1: ours is faster)\n");
  }
  run_ref rr = {peak_rate(0, o.pairs, o.min_sample_s),
                peak_rate(1, o.pairs, o.min_sample_s), 0};
  if (!o.json_only)
    printf("peaks (same threads): VNNI int8 %.1f G multiply-adds/s, f32 FMA "
           "%.1f G/s; x peak = our multiply-adds/s / the AQ path's (VNNI) "
           "or the WO path's (FMA) peak loop's, in pairs as the read loop; "
           "/ M=1 = time / the time at M = 1\n",
           rr.vnni * 1e-9, rr.fma * 1e-9);
  printf("{\"bench\":\"peaks\",\"threads\":%d,\"level\":\"%s\","
         "\"vnni_macs\":%.4g,\"fma_macs\":%.4g}\n",
         ql__cpu_threads(), ql__cpu_level_name(ql__cpu_level_get()), rr.vnni,
         rr.fma);
  for (int s = 0; s < o.nshape; s++) {
    wset w8;
    int have8 = 0, header = 1;
    /* q8c, also the baseline of q4g AQ */
    if (o.fmt[BF_Q8C] || (o.fmt[BF_Q4G] && o.aq)) {
      if (wset_make(&o, &bfmts[BF_Q8C], o.n[s], o.k[s], &w8) != 0) {
        fprintf(stderr, "qlinear-bench: q8c %lldx%lld failed\n",
                (long long)o.n[s], (long long)o.k[s]);
        return 1;
      }
      have8 = 1;
    }
    for (int fi = 0; fi < NBF; fi++) {
      const bfmt *bf = &bfmts[fi];
      wset own, *ws = &own;
      if (!o.fmt[fi])
        continue;
      if (fi == BF_Q8C) {
        ws = &w8;
      } else if (wset_make(&o, bf, o.n[s], o.k[s], &own) != 0) {
        fprintf(stderr, "qlinear-bench: %s %lldx%lld failed\n", bf->name,
                (long long)o.n[s], (long long)o.k[s]);
        return 1;
      }
      for (int aq = 0; aq < 2; aq++) {
        if ((aq && !o.aq) || (!aq && !o.wo))
          continue;
        if (aq && bf->f == QL_FORMAT_Q8B)
          continue; /* weight-only */
        rr.t_m1 = 0;
        for (int mi = 0; mi < o.nm; mi++) {
          run_case(&o, bf, ws, have8 ? &w8 : NULL, aq, o.ms[mi], header, &rr);
          header = 0;
        }
      }
      if (ws == &own)
        wset_free(&own);
    }
    if (have8)
      wset_free(&w8);
  }
  return 0;
}
