/*
 * test_cpu.c - unit tests of the CPU backend (kernels/cpu/) for what the
 * conformance harness does not cover: the instruction-level override, the
 * thread pool (any QL_CPU_THREADS gives the same bytes, fork, concurrent
 * callers), the repacked layout (round trips, validation, a call without
 * one), and the backend's promise that every level gives the bytes of the
 * generic reference op.
 *
 * The level and the pool size are fixed at the first call in a process,
 * and check runs each test in its own process (CK_FORK), so a test sets
 * QL_CPU_LEVEL / QL_CPU_THREADS before its first call into the backend.
 * main() must not call into the backend.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cpu.h"
#include "ql_kernels.h"
#include "registry.h"
#include "testutil.h"

static const ql_backend *cpu(void) {
  const ql_backend *b = ql_backend_find("cpu");
  ck_assert_ptr_nonnull(b);
  return b;
}

/* A random weight of format f (q4g group, q8b block gs; asym for q8b),
 * scale dtype sdt, with an adversarial row or two (all zero, constant
 * -127.5/1024: q8c and q8b -128, f8r ±448). */
static ql_qweight *make_weight_a(uint64_t seed, ql_format f, uint32_t gs,
                                 int asym, ql_dtype sdt, int64_t n, int64_t k,
                                 int bias) {
  float *w = tu_xmalloc((size_t)(n * k) * sizeof(float));
  float *b = tu_xmalloc((size_t)n * sizeof(float));
  ql_qweight *q = NULL;
  for (int64_t r = 0; r < n; r++)
    for (int64_t i = 0; i < k; i++)
      w[r * k + i] =
          n > 2 && r == 1 ? 0.0f
          : n > 2 && r == 2
              ? -127.5f / 1024.0f
              : (float)(0.05 * tu_rng_gauss(&seed) + 0.01 * (double)(r % 3));
  for (int64_t r = 0; r < n; r++)
    b[r] = (float)tu_rng_gauss(&seed);
  ql_quant_params p = {f, gs, asym, sdt};
  ck_assert_int_eq(
      ql_qweight_quantize(&p, n, k, QL_DTYPE_F32, w, bias ? b : NULL, &q), 0);
  free(w);
  free(b);
  return q;
}

static ql_qweight *make_weight(uint64_t seed, ql_format f, uint32_t gs,
                               ql_dtype sdt, int64_t n, int64_t k, int bias) {
  return make_weight_a(seed, f, gs, 0, sdt, n, k, bias);
}

static const char *fmt_name(const ql_qweight *q) {
  switch (q->format) {
  case QL_FORMAT_Q4G:
    return "q4g";
  case QL_FORMAT_Q8C:
    return "q8c";
  case QL_FORMAT_Q8B:
    return q->asymmetric ? "q8b-asym" : "q8b";
  default:
    return "f8r";
  }
}

/* x [m,k] in dtype dt: Gaussian rows, every fourth row with ties and
 * ±amax, one all-zero row. */
static void *make_x(uint64_t seed, ql_dtype dt, int64_t m, int64_t k) {
  float *xf = tu_xmalloc((size_t)(m * k) * sizeof(float));
  void *x = tu_xmalloc((size_t)(m * k) * ql_dtype_size(dt));
  for (int64_t r = 0; r < m; r++)
    for (int64_t i = 0; i < k; i++) {
      float v = (float)tu_rng_gauss(&seed);
      if (r % 4 == 1)
        v = (float)((double)((i * 37) % 255) - 127.0 + 0.5) / 16.0f;
      if (r % 4 == 3)
        v = 0.0f;
      xf[r * k + i] = v;
    }
  ql_from_f32(dt, xf, x, (size_t)(m * k));
  free(xf);
  return x;
}

/* Runs op through the CPU backend (with its repacked layout) and through
 * the generic op, and requires identical bytes. Returns the name of the
 * implementation that ran. */
static const char *same_as_generic(const ql_qweight *q, ql_op op, ql_dtype dt,
                                   const void *x, int64_t m, const char *ctx) {
  const ql_kernel_impl *im =
      ql_dispatch(cpu(), op, q->format, dt, m, q->n, q->k);
  const ql_kernel_impl *rp =
      ql_dispatch(cpu(), QL_OP_REPACK, q->format, QL_DTYPE_F32, 0, q->n, q->k);
  size_t bytes = (size_t)(m * q->n) * ql_dtype_size(dt);
  unsigned char *y = tu_xmalloc(bytes), *want = tu_xmalloc(bytes);
  ql_repack_args ra = {q, NULL, 0};
  ck_assert_ptr_nonnull(im);
  ck_assert_ptr_nonnull(rp);
  REQUIRE(strncmp(im->name, "cpu.", 4) == 0, "%s: dispatch gave %s", ctx,
          im->name);
  ck_assert_int_eq(rp->fn.repack(&ra), 0);
  memset(y, 0xFF, bytes);
  ql_linear_args a = {q, ra.packed, dt, x, m, y, NULL};
  int rc = im->fn.linear(&a);
  REQUIRE(rc == 0, "%s: %s returned %d", ctx, im->name, rc);
  rc = op == QL_OP_LINEAR_WO ? ql_linear_wo_ref(q, dt, x, m, want)
                             : ql_linear_aq_ref(q, dt, x, m, want);
  ck_assert_int_eq(rc, 0);
  if (memcmp(y, want, bytes) != 0) {
    size_t i = 0;
    while (y[i] == want[i])
      i++;
    ck_abort_msg("%s: %s differs from the generic op at byte %zu (element "
                 "%zu)",
                 ctx, im->name, i, i / ql_dtype_size(dt));
  }
  rp->free_packed(ra.packed);
  free(y);
  free(want);
  return im->name;
}

/* The shape matrix every level is checked on: ragged N and K around the
 * tile (16), block (4/8) and group sizes (q4g groups and q8b blocks of
 * 32..256: K = 100, 129, 300 end in a short one), M around the row blocks
 * (1-6 rows per pass) and past them (17). */
static const int64_t Ms[] = {1, 2, 3, 5, 6, 7, 13, 17};
static const int64_t Ns[] = {1, 15, 16, 17, 47, 64};
static const int64_t Ks[] = {1, 5, 8, 31, 64, 100, 129, 300};

/* An f8r scale s with s·2^120 past FLT_MAX (the layout's f8_fold off),
 * exact in every scale dtype. */
#define F8_BIG_SCALE 4096.0f

static void set_scale(ql_qweight *q, size_t i, float v) {
  ql_from_f32(q->scale_dtype, &v, (uint8_t *)q->scale + i * ql_dtype_size(q->scale_dtype), 1);
}

static void check_level_matrix(void) {
  static const struct {
    ql_format f;
    uint32_t gs;
    int asym;
  } fmts[] = {{QL_FORMAT_Q4G, 32, 0},  {QL_FORMAT_Q4G, 64, 0},
              {QL_FORMAT_Q4G, 128, 0}, {QL_FORMAT_Q4G, 256, 0},
              {QL_FORMAT_Q8C, 0, 0},   {QL_FORMAT_Q8B, 32, 0},
              {QL_FORMAT_Q8B, 64, 1},  {QL_FORMAT_Q8B, 128, 0},
              {QL_FORMAT_Q8B, 256, 1}, {QL_FORMAT_Q8B, 32, 1},
              {QL_FORMAT_Q8B, 256, 0}, {QL_FORMAT_F8R, 0, 0}};
  static const ql_dtype dts[] = {QL_DTYPE_F32, QL_DTYPE_F16, QL_DTYPE_BF16};
  char ctx[160];
  int combo = 0;
  for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++)
    for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++)
      for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++, combo++) {
        ql_dtype sdt = dts[combo % 3], adt = dts[(combo / 3) % 3];
        int64_t n = Ns[ni], k = Ks[ki], mmax = 17;
        ql_qweight *q =
            make_weight_a(1000 + (uint64_t)combo, fmts[fi].f, fmts[fi].gs,
                          fmts[fi].asym, sdt, n, k, combo & 1);
        void *x = make_x(77 + (uint64_t)k, adt, mmax, k);
        /* every other f8r weight with one scale too large to fold */
        if (fmts[fi].f == QL_FORMAT_F8R && (combo / 2) % 2 == 1)
          set_scale(q, (size_t)(n - 1), F8_BIG_SCALE);
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
          for (int aq = 0; aq < 2; aq++) {
            if (aq && fmts[fi].f == QL_FORMAT_Q8B)
              continue; /* weight-only */
            snprintf(ctx, sizeof ctx,
                     "%s gs=%u %s M=%lld N=%lld K=%lld "
                     "scale=%s act=%s",
                     fmt_name(q), fmts[fi].gs, aq ? "AQ" : "WO",
                     (long long)Ms[mi], (long long)n, (long long)k,
                     tu_dtype_name(sdt), tu_dtype_name(adt));
            same_as_generic(q, aq ? QL_OP_LINEAR_AQ : QL_OP_LINEAR_WO, adt, x,
                            Ms[mi], ctx);
          }
        free(x);
        ql_qweight_free(q);
      }
}

static const char *const level_env[] = {"c", "avx2", "avx2vnni", "avx512"};

/* Every level (those above the CPU's give the CPU's): the override takes,
 * the names say which level ran, and the bytes are the generic op's. */
START_TEST(test_levels_match_generic) {
  ql__cpu_level want = (ql__cpu_level)_i;
  setenv("QL_CPU_LEVEL", level_env[_i], 1);
  want = ql__cpu_level_capped(want);
  ck_assert_int_le(want, ql__cpu_level_detected());
  ck_assert_int_le(want, (ql__cpu_level)_i);
  ck_assert_int_eq(ql__cpu_level_get(), want);
  const ql_kernel_impl *im = ql_dispatch(cpu(), QL_OP_LINEAR_WO, QL_FORMAT_Q4G,
                                         QL_DTYPE_F32, 1, 64, 64);
  char prefix[32];
  snprintf(prefix, sizeof prefix, "cpu.%s.", ql__cpu_level_name(want));
  REQUIRE(strncmp(im->name, prefix, strlen(prefix)) == 0,
          "level %s: WO dispatch gave %s", level_env[_i], im->name);
  check_level_matrix();
}
END_TEST

/*
 * Decode batches, every M from 1 to 25 at every level and thread count
 * 1-2: K long enough for several K chunks with a short last one (q8c: 275
 * blocks; q4g: 9 groups of 128, 35 of 32); N of 10 tiles (one thread:
 * groups of 3 or 4 and a ragged tile left over) and of 12 (the ragged
 * tile inside the last group of 3 or 4). The bytes are the generic op's,
 * whether the rows go in whole-K passes or in passes over K chunks, and
 * the level asked for is the one that ran.
 */
START_TEST(test_decode_batches) {
  static const struct {
    ql_format f;
    uint32_t gs;
  } fmts[] = {{QL_FORMAT_Q4G, 128}, {QL_FORMAT_Q4G, 32}, {QL_FORMAT_Q8C, 0}};
  static const int64_t ns[] = {9 * 16 + 5, 11 * 16 + 5};
  const int64_t k = 1100, mmax = 25;
  char ctx[160], prefix[32];
  setenv("QL_CPU_LEVEL", level_env[_i / 2], 1);
  setenv("QL_CPU_THREADS", _i % 2 ? "2" : "1", 1);
  snprintf(prefix, sizeof prefix, "cpu.%s.",
           ql__cpu_level_name(ql__cpu_level_capped((ql__cpu_level)(_i / 2))));
  for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++)
      for (int di = 0; di < 2; di++) {
        ql_dtype adt = di ? QL_DTYPE_BF16 : QL_DTYPE_F32;
        ql_qweight *q = make_weight_a(400 + (uint64_t)fi, fmts[fi].f,
                                      fmts[fi].gs, 0, QL_DTYPE_BF16, ns[ni], k,
                                      di);
        void *x = make_x(90 + (uint64_t)fi, adt, mmax, k);
        for (int64_t m = 1; m <= mmax; m++)
          for (int aq = 0; aq < 2; aq++) {
            snprintf(ctx, sizeof ctx,
                     "level %s threads %d %s gs=%u %s %s N=%lld M=%lld",
                     level_env[_i / 2], 1 + _i % 2, fmt_name(q), fmts[fi].gs,
                     aq ? "AQ" : "WO", tu_dtype_name(adt), (long long)ns[ni],
                     (long long)m);
            const char *name = same_as_generic(
                q, aq ? QL_OP_LINEAR_AQ : QL_OP_LINEAR_WO, adt, x, m, ctx);
            REQUIRE(strncmp(name, prefix, strlen(prefix)) == 0,
                    "%s: %s ran, not %s", ctx, name, prefix);
          }
        free(x);
        ql_qweight_free(q);
      }
}
END_TEST

/* The override lowers, never raises, and an unknown value is ignored. */
/*
 * Long q4g batches, AQ and WO, at every level and 1-2 threads: K = 4100
 * makes the row chunk of the kernels' whole-K passes its minimum of 96
 * rows, so M = 203 takes chunks of 96, 96 and 11 rows; 8-14 rows take one
 * chunk; 1-3 rows are left after the passes of 4. N of 9 tiles and a
 * ragged one: AQ's 4-tile groups, the second pass over each prefetching
 * the next group where there is one, WO's groups of 3, and tiles left
 * over. The bytes are the generic op's.
 */
START_TEST(test_q4g_long_batches) {
  static const int64_t ms[] = {8, 9, 11, 14, 203};
  const int64_t n = 9 * 16 + 5, k = 4100;
  char ctx[128];
  setenv("QL_CPU_LEVEL", level_env[_i / 2], 1);
  setenv("QL_CPU_THREADS", _i % 2 ? "2" : "1", 1);
  ql_qweight *q =
      make_weight_a(410, QL_FORMAT_Q4G, 128, 0, QL_DTYPE_BF16, n, k, 1);
  void *x = make_x(91, QL_DTYPE_F32, 203, k);
  for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
    for (int aq = 0; aq < 2; aq++) {
      snprintf(ctx, sizeof ctx, "level %s threads %d q4g %s M=%lld",
               level_env[_i / 2], 1 + _i % 2, aq ? "AQ" : "WO",
               (long long)ms[mi]);
      same_as_generic(q, aq ? QL_OP_LINEAR_AQ : QL_OP_LINEAR_WO,
                      QL_DTYPE_F32, x, ms[mi], ctx);
    }
  free(x);
  ql_qweight_free(q);
}
END_TEST

START_TEST(test_level_unknown_ignored) {
  setenv("QL_CPU_LEVEL", "avx9000", 1);
  ck_assert_int_eq(ql__cpu_level_get(), ql__cpu_level_detected());
}
END_TEST

START_TEST(test_level_names) {
  ck_assert_str_eq(ql__cpu_level_name(QL_CPU_LEVEL_C), "c");
  ck_assert_str_eq(ql__cpu_level_name(QL_CPU_LEVEL_AVX2), "avx2");
  ck_assert_str_eq(ql__cpu_level_name(QL_CPU_LEVEL_AVX2_VNNI), "avx2vnni");
  ck_assert_str_eq(ql__cpu_level_name(QL_CPU_LEVEL_AVX512), "avx512");
  ck_assert_str_eq(ql__cpu_level_name((ql__cpu_level)99), "?");
}
END_TEST

/* A case large enough to run on the pool, for every thread count. */
static void check_parallel_case(void) {
  static const ql_format fs[4] = {QL_FORMAT_Q4G, QL_FORMAT_Q8C, QL_FORMAT_Q8B,
                                  QL_FORMAT_F8R};
  for (int fi = 0; fi < 4; fi++) {
    ql_qweight *q = make_weight_a(5 + (uint64_t)fi, fs[fi], 64, fi == 2,
                                  QL_DTYPE_BF16, 301, 520, 1);
    void *x = make_x(9, QL_DTYPE_F32, 33, 520);
    /* 33 rows: f8r quantizes its activations over the pool too */
    for (int64_t m = 1; m <= 33; m += m < 9 ? 4 : 24) {
      same_as_generic(q, QL_OP_LINEAR_WO, QL_DTYPE_F32, x, m, "threads WO");
      if (fs[fi] != QL_FORMAT_Q8B)
        same_as_generic(q, QL_OP_LINEAR_AQ, QL_DTYPE_F32, x, m, "threads AQ");
    }
    free(x);
    ql_qweight_free(q);
  }
  /* Narrow layers (1 and 2 tiles) with a large batch: fewer tiles than
   * threads, so the rows are split too. */
  for (int fi = 0; fi < 4; fi++)
    for (int64_t n = 5; n <= 20; n += 15) {
      ql_qweight *q = make_weight_a(7 + (uint64_t)fi, fs[fi], 64, fi == 2,
                                    QL_DTYPE_BF16, n, 520, 1);
      void *x = make_x(11, QL_DTYPE_BF16, 301, 520);
      same_as_generic(q, QL_OP_LINEAR_WO, QL_DTYPE_BF16, x, 301, "rows WO");
      if (fs[fi] != QL_FORMAT_Q8B)
        same_as_generic(q, QL_OP_LINEAR_AQ, QL_DTYPE_BF16, x, 301, "rows AQ");
      free(x);
      ql_qweight_free(q);
    }
}

/* QL_CPU_THREADS = 1, 2, 3, 7: the bytes are the generic op's whatever
 * the split of N and M. */
START_TEST(test_threads_same_bytes) {
  static const char *const nt[] = {"1", "2", "3", "7"};
  setenv("QL_CPU_THREADS", nt[_i], 1);
  ck_assert_int_eq(ql__cpu_threads(), atoi(nt[_i]));
  check_parallel_case();
}
END_TEST

START_TEST(test_threads_bad_env) {
  setenv("QL_CPU_THREADS", "0", 1);
  ck_assert_int_ge(ql__cpu_threads(), 1);
}
END_TEST

/* ql__cpu_parallel runs each part exactly once. */
static void count_part(void *ctx, int part, int parts) {
  int *hits = ctx;
  ck_assert_int_lt(part, parts);
  __atomic_add_fetch(&hits[part], 1, __ATOMIC_RELAXED);
}

START_TEST(test_pool_parts) {
  setenv("QL_CPU_THREADS", "4", 1);
  for (int rep = 0; rep < 200; rep++) {
    int hits[8] = {0};
    int want = 1 + rep % 6, got = want < 4 ? want : 4;
    ql__cpu_parallel(count_part, hits, want);
    for (int i = 0; i < 8; i++)
      REQUIRE(hits[i] == (i < got ? 1 : 0), "rep %d part %d ran %d times", rep,
              i, hits[i]);
  }
}
END_TEST

/* After fork() the child has no workers: its first call builds its own
 * pool instead of waiting forever for the parent's. */
START_TEST(test_pool_fork) {
  setenv("QL_CPU_THREADS", "2", 1);
  check_parallel_case();
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    alarm(60);
    check_parallel_case();
    _exit(0);
  }
  int st = 0;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  check_parallel_case();
}
END_TEST

/* Several threads calling at once are served one call at a time, each
 * with the right bytes. */
static void *caller(void *arg) {
  (void)arg;
  check_parallel_case();
  return NULL;
}

START_TEST(test_pool_concurrent_callers) {
  pthread_t th[3];
  setenv("QL_CPU_THREADS", "2", 1);
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(pthread_create(&th[i], NULL, caller, NULL), 0);
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(pthread_join(th[i], NULL), 0);
}
END_TEST

/* pack then unpack gives back the canonical arrays, byte for byte (q8c
 * and f8r scales as their f32 values), for ragged shapes, every scale
 * dtype and every format. */
/* ql__cpu_unpack gives back q's codes, scales and zeros from p (q8c and
 * f8r scales as f32). */
static void same_after_unpack(const ql__cpu_packed *p, const ql_qweight *q) {
  int grouped = q->format == QL_FORMAT_Q4G || q->format == QL_FORMAT_Q8B;
  size_t sb = grouped ? q->scale_bytes : (size_t)q->n * sizeof(float);
  uint8_t *qd = tu_xmalloc(q->qdata_bytes);
  void *sc = tu_xmalloc(sb), *ze = tu_xmalloc(sb);
  ck_assert_int_eq(ql__cpu_unpack(p, qd, sc, ze), 0);
  REQUIRE(memcmp(qd, q->qdata, q->qdata_bytes) == 0,
          "qdata differs: %s N=%lld K=%lld gs=%u", fmt_name(q),
          (long long)q->n, (long long)q->k, q->group_size);
  if (grouped) {
    ck_assert(memcmp(sc, q->scale, sb) == 0);
    if (q->zero != NULL)
      ck_assert(memcmp(ze, q->zero, sb) == 0);
  } else {
    for (int64_t j = 0; j < q->n; j++)
      ck_assert(((float *)sc)[j] ==
                ql_load_f32(q->scale_dtype, q->scale, (size_t)j));
  }
  free(qd);
  free(sc);
  free(ze);
}

START_TEST(test_repack_round_trip) {
  static const ql_dtype dts[] = {QL_DTYPE_F32, QL_DTYPE_F16, QL_DTYPE_BF16};
  static const int64_t ns[] = {1, 16, 33}, ks[] = {1, 7, 64, 65, 257};
  static const uint32_t gss[] = {32, 64, 128, 256};
  /* q4g, q8c, q8b symmetric, q8b asymmetric, f8r */
  static const ql_format fs[] = {QL_FORMAT_Q4G, QL_FORMAT_Q8C, QL_FORMAT_Q8B,
                                 QL_FORMAT_Q8B, QL_FORMAT_F8R};
  int c = 0;
  for (int fi = 0; fi < 5; fi++)
    for (size_t ni = 0; ni < 3; ni++)
      for (size_t ki = 0; ki < 5; ki++)
        for (size_t gi = 0; gi < (fi == 0 || fi == 2 || fi == 3 ? 4u : 1u);
             gi++, c++) {
          ql_format f = fs[fi];
          int asym = fi == 3;
          ql_dtype sdt = dts[c % 3];
          ql_qweight *q = make_weight_a(300 + (uint64_t)c, f, gss[gi], asym,
                                        sdt, ns[ni], ks[ki], 0);
          ql__cpu_packed *p = NULL;
          ck_assert_int_eq(ql__cpu_pack(q, &p), 0);
          ck_assert(ql__cpu_packed_matches(p, q));
          ck_assert_int_eq((long long)p->tiles, (long long)((q->n + 15) / 16));
          ck_assert_uint_eq((uintptr_t)p->data % 64, 0);
          ck_assert_uint_eq(p->tile_bytes % 64, 0);
          same_after_unpack(p, q);
          ql__cpu_packed_free(p);
          ql_qweight_free(q);
        }
}
END_TEST

/* A layout of 2 MiB or more starts on a 2 MiB boundary (pack.c asks for
 * huge pages for it) and round-trips like any other; a smaller one is
 * only 64-byte aligned. */
START_TEST(test_repack_large_alignment) {
  static const struct {
    ql_format f;
    int64_t n, k;
  } cases[] = {{QL_FORMAT_Q4G, 1024, 4096}, {QL_FORMAT_Q8C, 520, 4096},
               {QL_FORMAT_Q4G, 64, 256}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ql_qweight *q = make_weight_a(320 + (uint64_t)i, cases[i].f, 128, 0,
                                  QL_DTYPE_BF16, cases[i].n, cases[i].k, 0);
    ql__cpu_packed *p = NULL;
    ck_assert_int_eq(ql__cpu_pack(q, &p), 0);
    int large = p->bytes >= ((size_t)2 << 20);
    ck_assert_int_eq(large, i < 2);
    ck_assert_uint_eq((uintptr_t)p->data % (large ? (2u << 20) : 64u), 0);
    same_after_unpack(p, q);
    ql__cpu_packed_free(p);
    ql_qweight_free(q);
  }
}
END_TEST

/* The q8b and f8r layouts: the q8c blocking with the header of scales
 * (and zeros) described in cpu.h, and no padding of the data blocks. */
START_TEST(test_repack_sizes) {
  ql__cpu_packed *p = NULL;
  /* N = 20: 2 tiles; K = 100, B = 32: 4 blocks of scales, 25 data blocks */
  ql_qweight *q =
      make_weight_a(1, QL_FORMAT_Q8B, 32, 1, QL_DTYPE_BF16, 20, 100, 0);
  ck_assert_int_eq(ql__cpu_pack(q, &p), 0);
  ck_assert_uint_eq(p->group_bytes, 16 * 2 * 2);
  ck_assert_uint_eq(p->sz_bytes, 4 * 64);
  ck_assert_uint_eq(p->tile_bytes, 4 * 64 + 25 * 64);
  ck_assert_uint_eq(p->bytes, 2 * p->tile_bytes);
  ql__cpu_packed_free(p);
  ql_qweight_free(q);
  /* symmetric f32: 16·4 bytes per block of scales */
  q = make_weight_a(1, QL_FORMAT_Q8B, 64, 0, QL_DTYPE_F32, 16, 100, 0);
  ck_assert_int_eq(ql__cpu_pack(q, &p), 0);
  ck_assert_uint_eq(p->group_bytes, 64);
  ck_assert_uint_eq(p->sz_bytes, 2 * 64);
  ck_assert_uint_eq(p->tile_bytes, 2 * 64 + 25 * 64);
  ql__cpu_packed_free(p);
  ql_qweight_free(q);
  /* f8r: as q8c */
  q = make_weight(1, QL_FORMAT_F8R, 0, QL_DTYPE_F16, 17, 9, 0);
  ck_assert_int_eq(ql__cpu_pack(q, &p), 0);
  ck_assert_uint_eq(p->sz_bytes, 64);
  ck_assert_uint_eq(p->tile_bytes, 64 + 3 * 64);
  ck_assert_uint_eq(p->bytes, 2 * p->tile_bytes);
  ql__cpu_packed_free(p);
  ql_qweight_free(q);
}
END_TEST

/* An f8r weight holding a NaN code (which neither quantize nor import
 * makes) has no CPU layout: the kernels' decoding has no NaN. */
START_TEST(test_repack_f8r_nan) {
  ql__cpu_packed *p = NULL;
  ql_qweight *q = make_weight(1, QL_FORMAT_F8R, 0, QL_DTYPE_BF16, 3, 40, 0);
  float x[40] = {1.0f}, y[3];
  q->qdata[77] = 0xFF;
  ck_assert_int_eq(ql__cpu_pack(q, &p), QL_ENONFINITE);
  ck_assert_ptr_null(p);
  q->qdata[77] = 0x7F;
  ck_assert_int_eq(ql__cpu_pack(q, &p), QL_ENONFINITE);
  const ql_kernel_impl *im =
      ql_dispatch(cpu(), QL_OP_LINEAR_WO, QL_FORMAT_F8R, QL_DTYPE_F32, 1, 3, 40);
  ql_linear_args a = {q, NULL, QL_DTYPE_F32, x, 1, y, NULL};
  ck_assert_int_eq(im->fn.linear(&a), QL_ENONFINITE);
  q->qdata[77] = 0x7E; /* 448 */
  ck_assert_int_eq(ql__cpu_pack(q, &p), 0);
  ql__cpu_packed_free(p);
  ql_qweight_free(q);
}
END_TEST

/* Asymmetric q8b: one FMA q·s + z is exact when s has at most 17
 * significant bits (q has up to 7) and 128·|s| + |z| stays finite; bf16
 * and f16 scales qualify, arbitrary f32 ones do not. Symmetric q8b has no
 * sum to fuse. f8r folds 2^120 into its scales while that stays finite. */
START_TEST(test_repack_q8b_f8r_flags) {
  ql__cpu_packed *p = NULL;
  ql_qweight *q =
      make_weight_a(7, QL_FORMAT_Q8B, 32, 1, QL_DTYPE_BF16, 16, 256, 0);
  ck_assert_int_eq(ql__cpu_pack(q, &p), 0);
  ck_assert_int_eq(p->fma_dequant, 1);
  ql__cpu_packed_free(p);
  ql_qweight_free(q);
  q = make_weight_a(7, QL_FORMAT_Q8B, 32, 1, QL_DTYPE_F16, 16, 256, 0);
  ck_assert_int_eq(ql__cpu_pack(q, &p), 0);
  ck_assert_int_eq(p->fma_dequant, 1);
  ql__cpu_packed_free(p);
  ql_qweight_free(q);
  q = make_weight_a(7, QL_FORMAT_Q8B, 32, 0, QL_DTYPE_BF16, 16, 256, 0);
  ck_assert_int_eq(ql__cpu_pack(q, &p), 0);
  ck_assert_int_eq(p->fma_dequant, 0);
  ql__cpu_packed_free(p);
  ql_qweight_free(q);
  q = make_weight_a(7, QL_FORMAT_Q8B, 32, 1, QL_DTYPE_F32, 16, 256, 0);
  ck_assert_int_eq(ql__cpu_pack(q, &p), 0);
  ck_assert_int_eq(p->fma_dequant, 0);
  ql__cpu_packed_free(p);
  /* cut to 17 significant bits (7 low bits clear): yes; 18: no */
  for (int64_t i = 0; i < q->groups * q->n; i++)
    ((float *)q->scale)[i] =
        tu_bits_f32(tu_f32_bits(((float *)q->scale)[i]) & ~0x7Fu);
  ck_assert_int_eq(ql__cpu_pack(q, &p), 0);
  ck_assert_int_eq(p->fma_dequant, 1);
  ql__cpu_packed_free(p);
  ((float *)q->scale)[3] = tu_bits_f32(tu_f32_bits(((float *)q->scale)[3]) | 0x40u);
  ck_assert_int_eq(ql__cpu_pack(q, &p), 0);
  ck_assert_int_eq(p->fma_dequant, 0);
  ql__cpu_packed_free(p);
  /* 128·s overflows */
  ((float *)q->scale)[3] = 0x1p121f;
  ck_assert_int_eq(ql__cpu_pack(q, &p), 0);
  ck_assert_int_eq(p->fma_dequant, 0);
  ql__cpu_packed_free(p);
  ql_qweight_free(q);

  q = make_weight(7, QL_FORMAT_F8R, 0, QL_DTYPE_F32, 20, 64, 0);
  ck_assert_int_eq(ql__cpu_pack(q, &p), 0);
  ck_assert_int_eq(p->f8_fold, 1);
  ck_assert_int_eq(p->fma_dequant, 0);
  ql__cpu_packed_free(p);
  ((float *)q->scale)[19] = 0x1p8f; /* 2^8·2^120 = 2^128: infinite */
  ck_assert_int_eq(ql__cpu_pack(q, &p), 0);
  ck_assert_int_eq(p->f8_fold, 0);
  ql__cpu_packed_free(p);
  ((float *)q->scale)[19] = 0x1.fffffep7f; /* the largest that folds */
  ck_assert_int_eq(ql__cpu_pack(q, &p), 0);
  ck_assert_int_eq(p->f8_fold, 1);
  ql__cpu_packed_free(p);
  ql_qweight_free(q);
}
END_TEST

/* The repack op: the layout of every format, its size. */
START_TEST(test_repack_op) {
  ql_qweight *q = make_weight(1, QL_FORMAT_Q4G, 32, QL_DTYPE_BF16, 20, 70, 0);
  const ql_kernel_impl *rp =
      ql_dispatch(cpu(), QL_OP_REPACK, QL_FORMAT_Q4G, QL_DTYPE_F32, 0, 20, 70);
  ql_repack_args ra = {q, NULL, 0};
  ck_assert_str_eq(rp->name, "cpu.repack");
  ck_assert_int_eq(rp->fn.repack(&ra), 0);
  ck_assert_ptr_nonnull(ra.packed);
  ck_assert_uint_ge(ra.packed_bytes, ((ql__cpu_packed *)ra.packed)->bytes);
  rp->free_packed(ra.packed);
  rp->free_packed(NULL);
  ql_qweight_free(q);
  for (int f = QL_FORMAT_Q4G; f <= QL_FORMAT_F8R; f++)
    ck_assert_str_eq(ql_dispatch(cpu(), QL_OP_REPACK, (ql_format)f,
                                 QL_DTYPE_F32, 0, 20, 70)
                         ->name,
                     "cpu.repack");
  /* q8b is weight-only here as everywhere: no AQ implementation at all */
  ck_assert_ptr_null(
      ql_dispatch(cpu(), QL_OP_LINEAR_AQ, QL_FORMAT_Q8B, QL_DTYPE_F32, 1, 20, 70));
  ck_assert(strncmp(ql_dispatch(cpu(), QL_OP_LINEAR_WO, QL_FORMAT_Q8B,
                                QL_DTYPE_F32, 1, 20, 70)
                        ->name,
                    "cpu.", 4) == 0);
  ck_assert(strncmp(ql_dispatch(cpu(), QL_OP_LINEAR_AQ, QL_FORMAT_F8R,
                                QL_DTYPE_BF16, 1, 20, 70)
                        ->name,
                    "cpu.", 4) == 0);
}
END_TEST

/* Without a layout (packed NULL) the ops build one for the call: same
 * bytes. A layout of another weight is refused. */
START_TEST(test_packed_null_and_mismatch) {
  ql_qweight *q = make_weight(2, QL_FORMAT_Q8C, 0, QL_DTYPE_F32, 40, 96, 1);
  ql_qweight *o = make_weight(3, QL_FORMAT_Q8C, 0, QL_DTYPE_F32, 40, 97, 1);
  void *x = make_x(4, QL_DTYPE_F32, 3, 96);
  float y[3 * 40], want[3 * 40];
  ql__cpu_packed *po = NULL;
  for (int aq = 0; aq < 2; aq++) {
    ql_op op = aq ? QL_OP_LINEAR_AQ : QL_OP_LINEAR_WO;
    const ql_kernel_impl *im =
        ql_dispatch(cpu(), op, QL_FORMAT_Q8C, QL_DTYPE_F32, 3, 40, 96);
    ql_linear_args a = {q, NULL, QL_DTYPE_F32, x, 3, y, NULL};
    ck_assert_int_eq(im->fn.linear(&a), 0);
    ck_assert_int_eq(aq ? ql_linear_aq_ref(q, QL_DTYPE_F32, x, 3, want)
                        : ql_linear_wo_ref(q, QL_DTYPE_F32, x, 3, want),
                     0);
    ck_assert(memcmp(y, want, sizeof y) == 0);
    ck_assert_int_eq(ql__cpu_pack(o, &po), 0);
    a.packed = po;
    ck_assert_int_eq(im->fn.linear(&a), QL_EINVAL);
    ql__cpu_packed_free(po);
  }
  free(x);
  ql_qweight_free(q);
  ql_qweight_free(o);

  /* q8b: a layout of the same shape and block but without zeros, or with
   * another block length, is another weight's */
  q = make_weight_a(2, QL_FORMAT_Q8B, 32, 1, QL_DTYPE_BF16, 40, 96, 1);
  x = make_x(4, QL_DTYPE_F32, 3, 96);
  const ql_kernel_impl *im =
      ql_dispatch(cpu(), QL_OP_LINEAR_WO, QL_FORMAT_Q8B, QL_DTYPE_F32, 3, 40, 96);
  ql_linear_args a = {q, NULL, QL_DTYPE_F32, x, 3, y, NULL};
  ck_assert_int_eq(im->fn.linear(&a), 0);
  ck_assert_int_eq(ql_linear_wo_ref(q, QL_DTYPE_F32, x, 3, want), 0);
  ck_assert(memcmp(y, want, sizeof y) == 0);
  for (int v = 0; v < 2; v++) {
    o = make_weight_a(3, QL_FORMAT_Q8B, v ? 64 : 32, v, QL_DTYPE_BF16, 40, 96,
                      1);
    ck_assert_int_eq(ql__cpu_pack(o, &po), 0);
    a.packed = po;
    ck_assert(!ql__cpu_packed_matches(po, q));
    ck_assert_int_eq(im->fn.linear(&a), QL_EINVAL);
    ql__cpu_packed_free(po);
    ql_qweight_free(o);
  }
  free(x);
  ql_qweight_free(q);
}
END_TEST

/* NaN or Inf in x: QL_ENONFINITE from both paths. */
START_TEST(test_nonfinite) {
  static const ql_format fs[] = {QL_FORMAT_Q4G, QL_FORMAT_Q8C, QL_FORMAT_Q8B,
                                 QL_FORMAT_F8R};
  for (int fi = 0; fi < 4; fi++) {
    ql_qweight *q = make_weight(2, fs[fi], 32, QL_DTYPE_F32, 16, 64, 0);
    float *x = make_x(4, QL_DTYPE_F32, 2, 64), y[2 * 16];
    for (int v = 0; v < 2; v++) {
      x[64 + 37] = v ? INFINITY : NAN;
      for (int aq = 0; aq < 2; aq++) {
        const ql_kernel_impl *im =
            ql_dispatch(cpu(), aq ? QL_OP_LINEAR_AQ : QL_OP_LINEAR_WO, fs[fi],
                        QL_DTYPE_F32, 2, 16, 64);
        if (aq && fs[fi] == QL_FORMAT_Q8B)
          continue;
        ql_linear_args a = {q, NULL, QL_DTYPE_F32, x, 2, y, NULL};
        ck_assert_int_eq(im->fn.linear(&a), QL_ENONFINITE);
      }
    }
    free(x);
    ql_qweight_free(q);
  }
  /* f8r AQ quantizes many rows in parts over the pool: a bad row in any
   * part fails the call */
  ql_qweight *q = make_weight(2, QL_FORMAT_F8R, 0, QL_DTYPE_F32, 16, 300, 0);
  float *x = make_x(4, QL_DTYPE_F32, 40, 300), *y = tu_xmalloc(40 * 16 * 4);
  const ql_kernel_impl *im = ql_dispatch(cpu(), QL_OP_LINEAR_AQ, QL_FORMAT_F8R,
                                         QL_DTYPE_F32, 40, 16, 300);
  static const int64_t rows[] = {0, 19, 20, 39};
  for (int i = 0; i < 4; i++) {
    float keep = x[rows[i] * 300 + 7];
    x[rows[i] * 300 + 7] = i % 2 ? INFINITY : NAN;
    ql_linear_args a = {q, NULL, QL_DTYPE_F32, x, 40, y, NULL};
    ck_assert_int_eq(im->fn.linear(&a), QL_ENONFINITE);
    x[rows[i] * 300 + 7] = keep;
  }
  free(x);
  free(y);
  ql_qweight_free(q);
}
END_TEST

/* An f8r weight with every e4m3 code (subnormals 0x01..0x07 and 0x81..0x87
 * included) in every row position, so that each code goes through each
 * byte slot of the layout's dwords. */
static ql_qweight *f8r_all_codes(int64_t n, int64_t k) {
  ql_qweight *q = make_weight(3, QL_FORMAT_F8R, 0, QL_DTYPE_BF16, n, k, 1);
  for (int64_t r = 0; r < n; r++)
    for (int64_t i = 0; i < k; i++) {
      uint8_t c = (uint8_t)((r * 37 + i * 5) & 0xFF);
      if ((c & 0x7F) == 0x7F)
        c = 0x03; /* no NaN codes */
      q->qdata[r * k + i] = c;
    }
  return q;
}

/* Every e4m3 code decodes to its value at every level, in both paths. */
START_TEST(test_f8r_all_codes) {
  setenv("QL_CPU_LEVEL", level_env[_i], 1);
  ql_qweight *q = f8r_all_codes(37, 259);
  void *x = make_x(5, QL_DTYPE_F32, 5, 259);
  for (int64_t m = 1; m <= 5; m += 2) {
    same_as_generic(q, QL_OP_LINEAR_WO, QL_DTYPE_F32, x, m, "all codes WO");
    same_as_generic(q, QL_OP_LINEAR_AQ, QL_DTYPE_F32, x, m, "all codes AQ");
  }
  free(x);
  ql_qweight_free(q);
}
END_TEST

#if defined(__x86_64__)
#include <immintrin.h>
/* A thread whose MXCSR has DAZ set reads f32 subnormal inputs as zero,
 * which would break the SIMD levels' e4m3 decoding (the subnormal codes):
 * they hand such calls to the C level, whose arithmetic is the
 * reference's. Set before the first call, so the pool's threads (made
 * with the caller's floating-point environment) have it too. */
START_TEST(test_f8r_daz) {
  setenv("QL_CPU_LEVEL", level_env[_i], 1);
  setenv("QL_CPU_THREADS", "2", 1);
  _mm_setcsr(_mm_getcsr() | 0x0040u);
  ck_assert(ql__cpu_daz());
  ql_qweight *q = f8r_all_codes(301, 520);
  void *x = make_x(5, QL_DTYPE_F32, 5, 520);
  for (int64_t m = 1; m <= 5; m += 4) {
    same_as_generic(q, QL_OP_LINEAR_WO, QL_DTYPE_F32, x, m, "DAZ WO");
    same_as_generic(q, QL_OP_LINEAR_AQ, QL_DTYPE_F32, x, m, "DAZ AQ");
  }
  free(x);
  ql_qweight_free(q);
  _mm_setcsr(_mm_getcsr() & ~0x0040u);
}
END_TEST
#endif

/* q8c AQ at the largest K: the +128 offset sum wraps an int32 (|Σ x·u|
 * up to 128·255·K) and the correction brings it back exactly. */
START_TEST(test_aq_q8c_max_k_wrap) {
  enum { n = 4, m = 2 };
  const int64_t k = QL_AQ_Q8C_MAX_K;
  float *w = tu_xmalloc((size_t)(n * k) * sizeof(float));
  float *x = tu_xmalloc((size_t)(m * k) * sizeof(float));
  float y[m * n], want[m * n];
  ql_qweight *q = NULL;
  ql_quant_params p = {QL_FORMAT_Q8C, 0, 0, QL_DTYPE_F32};
  for (int64_t i = 0; i < n * k; i++) /* rows: all -128, all 127, ... */
    w[i] = (i / k) % 2 == 0 ? -1.0f : (i % k == 0 ? -1.0f : 127.0f / 127.5f);
  for (int64_t i = 0; i < m * k; i++)
    x[i] = i / k == 0 ? -1.0f : 1.0f;
  ck_assert_int_eq(ql_qweight_quantize(&p, n, k, QL_DTYPE_F32, w, NULL, &q), 0);
  const ql_kernel_impl *im =
      ql_dispatch(cpu(), QL_OP_LINEAR_AQ, QL_FORMAT_Q8C, QL_DTYPE_F32, m, n, k);
  ck_assert_ptr_nonnull(im);
  ql_linear_args a = {q, NULL, QL_DTYPE_F32, x, m, y, NULL};
  ck_assert_int_eq(im->fn.linear(&a), 0);
  ck_assert_int_eq(ql_linear_aq_ref(q, QL_DTYPE_F32, x, m, want), 0);
  ck_assert(memcmp(y, want, sizeof y) == 0);
  /* one past the bound is declined, as the generic op declines it */
  ck_assert_ptr_null(ql_dispatch(cpu(), QL_OP_LINEAR_AQ, QL_FORMAT_Q8C,
                                 QL_DTYPE_F32, m, n, k + 1));
  free(w);
  free(x);
  ql_qweight_free(q);
}
END_TEST

/* quantize_rows op: the reference's bytes for any gs, with and without
 * gsum, odd K; rows of another src go to the reference too. */
START_TEST(test_quantize_rows) {
  static const int64_t ks[] = {1, 15, 16, 17, 100, 1000};
  static const uint32_t gss[] = {1, 7, 32, 256, 5000};
  for (size_t ki = 0; ki < 6; ki++)
    for (size_t gi = 0; gi < 5; gi++)
      for (int withg = 0; withg < 2; withg++) {
        int64_t k = ks[ki], m = 5, ng = (k + gss[gi] - 1) / gss[gi];
        float *x = make_x(11 + (uint64_t)k, QL_DTYPE_F32, m, k);
        int8_t *q1 = tu_xmalloc((size_t)(m * k)),
               *q2 = tu_xmalloc((size_t)(m * k));
        float s1[5], s2[5];
        int32_t *g1 = tu_xmalloc((size_t)(m * ng) * 4),
                *g2 = tu_xmalloc((size_t)(m * ng) * 4);
        const ql_kernel_impl *im = ql_dispatch(
            cpu(), QL_OP_QUANTIZE_ROWS, QL_FORMAT_Q8C, QL_DTYPE_F32, m, 1, k);
        ql_qrows_args a = {QL_QROWS_I8, x,  m,  k,
                           gss[gi],     q1, s1, withg ? g1 : NULL,
                           QL_DTYPE_F32};
        ck_assert(strncmp(im->name, "cpu.", 4) == 0);
        ck_assert_int_eq(im->fn.quantize_rows(&a), 0);
        ck_assert_int_eq(
            ql_quantize_rows_i8(x, m, k, gss[gi], q2, s2, withg ? g2 : NULL),
            0);
        ck_assert(memcmp(q1, q2, (size_t)(m * k)) == 0);
        ck_assert(memcmp(s1, s2, sizeof s1) == 0);
        if (withg)
          ck_assert(memcmp(g1, g2, (size_t)(m * ng) * 4) == 0);
        /* bf16 src: the reference's rule and checks */
        a.src = QL_DTYPE_BF16;
        ck_assert_int_eq(im->fn.quantize_rows(&a),
                         ql_quantize_rows_i8_src(QL_DTYPE_BF16, x, m, k,
                                                 gss[gi], q2, s2,
                                                 withg ? g2 : NULL));
        free(x);
        free(q1);
        free(q2);
        free(g1);
        free(g2);
      }
}
END_TEST

/* Fills row x [k] with the e4m3 cases for a row of scale 1 (amax 448):
 * every code's value, every midpoint between neighbouring magnitudes (the
 * ties) and the floats on either side of it, f32 subnormals, ±0, and both
 * signs of each; the rest Gaussian. Values are rounded to src. */
static void e4m3_case_row(ql_dtype src, uint64_t seed, float *x, int64_t k) {
  int64_t n = 0;
  for (int c = 0; c < 0x7F && n < k; c++) {
    double v = tu_e4m3_value((uint32_t)c), up = tu_e4m3_value((uint32_t)c + 1);
    float mid = (float)((v + up) / 2);
    float cand[4] = {(float)v, mid, nextafterf(mid, 0.0f),
                     nextafterf(mid, 1e9f)};
    for (int j = 0; j < 4 && n < k; j++) {
      float w = c == 0x7E ? 448.0f : cand[j]; /* up is NaN past 0x7E */
      x[n] = (n & 1) ? -w : w;
      n++;
    }
  }
  static const float extra[] = {0x1p-149f, -0x1p-130f, 0.0f,    -0.0f,
                                0x1p-10f,  -0x1p-10f,  0x1.000002p-10f,
                                0x1p-6f,   0x1.fffffep-7f, 448.0f};
  for (size_t j = 0; j < sizeof extra / sizeof extra[0] && n < k; j++)
    x[n++] = extra[j];
  for (; n < k; n++)
    x[n] = (float)(100.0 * tu_rng_gauss(&seed));
  x[k - 1] = -448.0f; /* amax 448 whatever k: scale 1 (also in f16/bf16) */
  for (int64_t i = 0; i < k; i++)
    x[i] = src == QL_DTYPE_F16    ? ql_f16_to_f32(ql_f32_to_f16(x[i]))
           : src == QL_DTYPE_BF16 ? ql_bf16_to_f32(ql_f32_to_bf16(x[i]))
                                  : x[i];
}

/* Every level's e4m3 row quantizer gives ql_quantize_rows_e4m3_src's codes
 * and scale, and xe = e4m3(code)·2^119, on rows of scale 1 that hit every
 * code and tie, and on Gaussian rows of other scales; K around the vector
 * widths. */
START_TEST(test_quant_row_e4m3) {
  static const int64_t ks[] = {1, 7, 8, 15, 16, 17, 100, 600, 1031};
  static const ql_dtype srcs[] = {QL_DTYPE_F32, QL_DTYPE_F16, QL_DTYPE_BF16};
  for (int l = 0; l <= (int)ql__cpu_level_detected(); l++) {
    const ql__cpu_kernels *kt = ql__cpu_kernels_for((ql__cpu_level)l);
    for (size_t si = 0; si < 3; si++)
      for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
        for (int kind = 0; kind < 3; kind++) {
          int64_t k = ks[ki];
          ql_dtype src = srcs[si];
          float *x = tu_xmalloc((size_t)k * sizeof(float));
          float *xe = tu_xmalloc((size_t)k * sizeof(float));
          uint8_t *c1 = tu_xmalloc((size_t)k), *c2 = tu_xmalloc((size_t)k);
          float s1 = -1.0f, s2 = -2.0f;
          uint64_t seed = 40 + (uint64_t)(ki * 3 + (size_t)kind);
          if (kind == 0) {
            e4m3_case_row(src, seed, x, k);
          } else {
            /* Gaussian rows of amax ~1e-3 (kind 1) or ~1e3 (kind 2) */
            for (int64_t i = 0; i < k; i++) {
              x[i] = (float)((kind == 1 ? 1e-3 : 1e3) * tu_rng_gauss(&seed));
              x[i] = src == QL_DTYPE_F16 ? ql_f16_to_f32(ql_f32_to_f16(x[i]))
                     : src == QL_DTYPE_BF16
                         ? ql_bf16_to_f32(ql_f32_to_bf16(x[i]))
                         : x[i];
            }
          }
          ck_assert_int_eq(kt->quant_row_e4m3(src, x, k, c1, xe, &s1), 0);
          ck_assert_int_eq(ql_quantize_rows_e4m3_src(src, x, 1, k, c2, &s2),
                           0);
          ck_assert(s1 == s2);
          if (kind == 0 && src != QL_DTYPE_F16)
            ck_assert(s1 == 1.0f);
          for (int64_t i = 0; i < k; i++) {
            REQUIRE(c1[i] == c2[i],
                    "level %s src %s K=%lld kind %d: x[%lld] = %a: code "
                    "0x%02x, reference 0x%02x",
                    ql__cpu_level_name((ql__cpu_level)l), tu_dtype_name(src),
                    (long long)k, kind, (long long)i, (double)x[i], c1[i],
                    c2[i]);
            float want = ql_e4m3_to_f32(c2[i]) * 0x1p119f;
            REQUIRE(tu_f32_bits(xe[i]) == tu_f32_bits(want),
                    "level %s: xe[%lld] = %a, want %a",
                    ql__cpu_level_name((ql__cpu_level)l), (long long)i,
                    (double)xe[i], (double)want);
          }
          /* without xe: the same codes */
          memset(c1, 0xAA, (size_t)k);
          ck_assert_int_eq(kt->quant_row_e4m3(src, x, k, c1, NULL, &s1), 0);
          ck_assert(memcmp(c1, c2, (size_t)k) == 0);
          /* a non-finite value anywhere fails the row */
          x[k / 2] = kind == 1 ? NAN : -INFINITY;
          ck_assert_int_eq(kt->quant_row_e4m3(src, x, k, c1, xe, &s1),
                           QL_ENONFINITE);
          free(x);
          free(xe);
          free(c1);
          free(c2);
        }
  }
}
END_TEST

/* The quantize_rows op's e4m3 rows (f32) at the level's speed: the
 * reference's bytes and argument checks. */
START_TEST(test_quantize_rows_e4m3) {
  const int64_t m = 5, k = 1031;
  float *x = tu_xmalloc((size_t)(m * k) * sizeof(float));
  uint8_t *q1 = tu_xmalloc((size_t)(m * k)), *q2 = tu_xmalloc((size_t)(m * k));
  float s1[5], s2[5];
  int32_t g[5];
  for (int64_t r = 0; r < m; r++)
    e4m3_case_row(QL_DTYPE_F32, 70 + (uint64_t)r, x + r * k, k);
  const ql_kernel_impl *im = ql_dispatch(cpu(), QL_OP_QUANTIZE_ROWS,
                                         QL_FORMAT_F8R, QL_DTYPE_F32, m, 1, k);
  ck_assert(strncmp(im->name, "cpu.", 4) == 0);
  ql_qrows_args a = {QL_QROWS_E4M3, x, m, k, 0, q1, s1, NULL, QL_DTYPE_F32};
  ck_assert_int_eq(im->fn.quantize_rows(&a), 0);
  ck_assert_int_eq(ql_quantize_rows_e4m3(x, m, k, q2, s2), 0);
  ck_assert(memcmp(q1, q2, (size_t)(m * k)) == 0);
  ck_assert(memcmp(s1, s2, sizeof s1) == 0);
  a.gsum = g;
  ck_assert_int_eq(im->fn.quantize_rows(&a), QL_EINVAL);
  a.gsum = NULL;
  a.k = 0;
  ck_assert_int_eq(im->fn.quantize_rows(&a), QL_ESHAPE);
  a.k = k;
  a.sx = NULL;
  ck_assert_int_eq(im->fn.quantize_rows(&a), QL_EINVAL);
  a.sx = s1;
  x[3 * k + 5] = NAN;
  ck_assert_int_eq(im->fn.quantize_rows(&a), QL_ENONFINITE);
  free(x);
  free(q1);
  free(q2);
}
END_TEST

static void count_parts(void *ctx, int part, int parts) {
  (void)part;
  *(int *)ctx = parts;
}

/* The pool's size is the daemon's to set (cpu_threads) until the pool
 * exists; then only its own size is accepted. Forked per test by check, so
 * this process has no pool yet. */
START_TEST(test_set_threads) {
  int parts = 0;
  ck_assert_int_eq(ql__cpu_set_threads(1000), QL_EINVAL);
  ck_assert_int_eq(ql__cpu_set_threads(3), 0);
  ck_assert_int_eq(ql__cpu_threads(), 3);
  ql__cpu_parallel(count_parts, &parts, 8);
  ck_assert_int_eq(parts, 3);
  ck_assert_int_eq(ql__cpu_set_threads(5), QL_ENOTSUP);
  ck_assert_int_eq(ql__cpu_set_threads(3), 0);
  ck_assert_int_eq(ql__cpu_threads(), 3);
}
END_TEST

/* Each level's implementation called directly, without dispatch, on any
 * CPU: the generic op's bytes, never an instruction the CPU lacks (the
 * avx2vnni one ran VEX vpdpbusd on a CPU with AVX-512 VNNI but not
 * AVX-VNNI: SIGILL). */
START_TEST(test_impls_called_directly) {
  const ql_backend *b = cpu();
  ql_qweight *q = make_weight(31, QL_FORMAT_Q8C, 0, QL_DTYPE_F32, 64, 256, 1);
  const int64_t m = 4;
  float *x = tu_xmalloc((size_t)(m * 256) * sizeof(float));
  uint64_t seed = 3;
  for (int i = 0; i < m * 256; i++)
    x[i] = (float)tu_rng_gauss(&seed);
  const ql_kernel_impl *rp =
      ql_dispatch(b, QL_OP_REPACK, q->format, QL_DTYPE_F32, 0, q->n, q->k);
  ql_repack_args ra = {q, NULL, 0};
  ck_assert_int_eq(rp->fn.repack(&ra), 0);
  float y[4 * 64], want[4 * 64];
  int called = 0;
  for (size_t i = 0; i < b->n_impls; i++) {
    const ql_kernel_impl *im = &b->impls[i];
    if (im->op != QL_OP_LINEAR_WO && im->op != QL_OP_LINEAR_AQ)
      continue;
    ql_linear_args a = {q, ra.packed, QL_DTYPE_F32, x, m, y, NULL};
    ck_assert_msg(im->fn.linear(&a) == 0, "%s", im->name);
    ck_assert_int_eq(im->op == QL_OP_LINEAR_AQ
                         ? ql_linear_aq_ref(q, QL_DTYPE_F32, x, m, want)
                         : ql_linear_wo_ref(q, QL_DTYPE_F32, x, m, want),
                     0);
    ck_assert_msg(memcmp(y, want, sizeof y) == 0, "%s", im->name);
    called++;
  }
  ck_assert_int_ge(called, 8);
  rp->free_packed(ra.packed);
  free(x);
  ql_qweight_free(q);
}
END_TEST

/* adopt() refuses an image that cannot be the layout: the wrong length,
 * misaligned, or none at all. */
START_TEST(test_adopt_refuses) {
  const ql_backend *b = cpu();
  ql_qweight *q = make_weight(32, QL_FORMAT_Q8C, 0, QL_DTYPE_F32, 64, 256, 0);
  const ql_kernel_impl *rp =
      ql_dispatch(b, QL_OP_REPACK, q->format, QL_DTYPE_F32, 0, q->n, q->k);
  ql_repack_args ra = {q, NULL, 0};
  ck_assert_int_eq(rp->fn.repack(&ra), 0);
  const void *img = NULL;
  size_t len = 0;
  ck_assert_int_eq(rp->image(ra.packed, &img, &len), 0);
  void *p = NULL;
  size_t bytes = 0;
  ck_assert_int_eq(rp->adopt(q, NULL, len, &p, &bytes), QL_EINVAL);
  ck_assert_int_eq(rp->adopt(q, img, len - 64, &p, &bytes), QL_EINVAL);
  ck_assert_int_eq(rp->adopt(q, (const char *)img + 8, len, &p, &bytes),
                   QL_EINVAL);
  ck_assert_int_eq(rp->adopt(q, img, len, &p, &bytes), 0);
  rp->free_packed(p);
  rp->free_packed(ra.packed);
  ql_qweight_free(q);
}
END_TEST

/* cpu_level caps the level: unknown names are refused, a cap only
 * lowers. Forked per test, so the cap does not leak into other tests. */
START_TEST(test_level_set) {
  ql__cpu_level d = ql__cpu_level_detected();
  ck_assert_int_eq(ql__cpu_level_set("avx999"), QL_EINVAL);
  ck_assert_int_eq(ql__cpu_level_set("auto"), 0);
  ck_assert_int_eq(ql__cpu_level_set(NULL), 0);
  ck_assert_int_eq(ql__cpu_level_set("c"), 0);
  ck_assert_int_eq(ql__cpu_level_get(), QL_CPU_LEVEL_C);
  ck_assert_int_eq(ql__cpu_level_detected(), d);
  if (d >= QL_CPU_LEVEL_AVX2) {
    ck_assert_int_eq(ql__cpu_level_set("avx2"), 0);
    ck_assert_int_eq(ql__cpu_level_get(), QL_CPU_LEVEL_C); /* still c */
  } else {
    ck_assert_int_eq(ql__cpu_level_set("avx2"), QL_ENOTSUP);
  }
}
END_TEST

/* A stop() that says yes from the first time it is asked, counting. */
static int stop_always(void *ctx) {
  __atomic_add_fetch((int *)ctx, 1, __ATOMIC_RELAXED);
  return 1;
}

/*
 * One launch in parts (ql_linear_part) with stop, run call after call
 * until it is done: returns the calls it took, and requires y to hold the
 * bytes of one whole call (want).
 */
static int run_in_parts(const ql_kernel_impl *im, const ql_qweight *q,
                        const void *packed, ql_dtype dt, const void *x,
                        int64_t m, const unsigned char *want, size_t bytes,
                        int (*stop)(void *), const char *ctx) {
  unsigned char *y = tu_xmalloc(bytes);
  int asked = 0, calls = 0;
  ql_linear_part part = {stop, &asked, 0, 0, NULL, NULL};
  memset(y, 0xFF, bytes);
  ql_linear_args a = {q, packed, dt, x, m, y, &part};
  do {
    int rc = im->fn.linear(&a);
    REQUIRE(rc == 0, "%s: call %d returned %d", ctx, calls, rc);
    calls++;
    REQUIRE(part.done == (part.state == NULL), "%s: done %d, state %p", ctx,
            part.done, part.state);
    REQUIRE(calls < 100000, "%s: no end", ctx);
  } while (!part.done);
  REQUIRE(memcmp(y, want, bytes) == 0, "%s: %d calls: not the bytes of one",
          ctx, calls);
  free(y);
  return calls;
}

/*
 * A launch in parts gives the bytes of one whole call wherever it stops,
 * at every thread count: asked to stop at every piece it takes many calls
 * (each thread does a piece before it asks), never asked it takes one.
 * Shapes with several row blocks and tile blocks, a ragged last tile, and
 * a narrow layer with few tiles; 16-bit activations store their pieces
 * themselves.
 */
START_TEST(test_parts_same_bytes) {
  static const char *const nt[] = {"1", "2", "3"};
  static const ql_format fs[4] = {QL_FORMAT_Q4G, QL_FORMAT_Q8C, QL_FORMAT_Q8B,
                                  QL_FORMAT_F8R};
  static const struct {
    int64_t n, k, m;
  } shapes[] = {{509, 4096, 200}, {1024, 1000, 200}, {20, 2000, 300}};
  setenv("QL_CPU_THREADS", nt[_i], 1);
  int threads = atoi(nt[_i]);
  const ql_kernel_impl *rp =
      ql_dispatch(cpu(), QL_OP_REPACK, QL_FORMAT_Q8C, QL_DTYPE_F32, 0, 1, 1);
  char ctx[128];
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
    for (int fi = 0; fi < 4; fi++) {
      int64_t n = shapes[si].n, k = shapes[si].k, m = shapes[si].m;
      ql_qweight *q = make_weight_a(31 + (uint64_t)fi, fs[fi], 128, fi == 2,
                                    QL_DTYPE_BF16, n, k, fi & 1);
      ql_repack_args ra = {q, NULL, 0};
      ck_assert_int_eq(rp->fn.repack(&ra), 0);
      for (int aq = 0; aq < 2; aq++)
        for (int di = 0; di < 2; di++) {
          ql_dtype dt = di ? QL_DTYPE_BF16 : QL_DTYPE_F32;
          ql_op op = aq ? QL_OP_LINEAR_AQ : QL_OP_LINEAR_WO;
          if (aq && fs[fi] == QL_FORMAT_Q8B)
            continue;
          const ql_kernel_impl *im = ql_dispatch(cpu(), op, q->format, dt, m,
                                                 n, k);
          ck_assert_int_eq(im->parts, 1);
          size_t bytes = (size_t)(m * n) * ql_dtype_size(dt);
          unsigned char *want = tu_xmalloc(bytes);
          void *x = make_x(5 + (uint64_t)si, dt, m, k);
          ql_linear_args a = {q, ra.packed, dt, x, m, want, NULL};
          ck_assert_int_eq(im->fn.linear(&a), 0);
          snprintf(ctx, sizeof ctx, "%s %s %s N=%lld K=%lld M=%lld T=%d",
                   fmt_name(q), aq ? "AQ" : "WO", tu_dtype_name(dt),
                   (long long)n, (long long)k, (long long)m, threads);
          int many = run_in_parts(im, q, ra.packed, dt, x, m, want, bytes,
                                  stop_always, ctx);
          int one = run_in_parts(im, q, ra.packed, dt, x, m, want, bytes, NULL,
                                 ctx);
          ck_assert_int_eq(one, 1);
          /* The first shape has 3 row blocks of 4-tile pieces: dozens. */
          if (si == 0)
            REQUIRE(many >= 8, "%s: only %d calls", ctx, many);
          free(x);
          free(want);
        }
      rp->free_packed(ra.packed);
      ql_qweight_free(q);
    }
}
END_TEST

/* A launch given up after a call that stopped is freed with its
 * state_free (the leak checker sees the rest); a launch whose x holds NaN
 * fails at its first call with no state; a generic implementation, which
 * has no parts, runs whole through ql_run_linear_part. */
START_TEST(test_parts_give_up_and_errors) {
  ql_qweight *q = make_weight(3, QL_FORMAT_Q8C, 0, QL_DTYPE_F32, 512, 4096, 1);
  const ql_kernel_impl *rp =
      ql_dispatch(cpu(), QL_OP_REPACK, QL_FORMAT_Q8C, QL_DTYPE_F32, 0, 1, 1);
  ql_repack_args ra = {q, NULL, 0};
  ck_assert_int_eq(rp->fn.repack(&ra), 0);
  int64_t m = 200;
  float *x = make_x(8, QL_DTYPE_F32, m, 4096);
  float *y = tu_xmalloc((size_t)(m * 512) * sizeof(float));
  float *want = tu_xmalloc((size_t)(m * 512) * sizeof(float));
  for (int aq = 0; aq < 2; aq++) {
    int asked = 0;
    ql_linear_part part = {stop_always, &asked, 0, 0, NULL, NULL};
    const char *impl = NULL;
    ql_op op = aq ? QL_OP_LINEAR_AQ : QL_OP_LINEAR_WO;
    ck_assert_int_eq(ql_run_linear_part(cpu(), op, q, ra.packed, QL_DTYPE_F32,
                                        x, m, y, &part, &impl),
                     0);
    ck_assert_int_eq(part.done, 0);
    ck_assert_ptr_nonnull(part.state);
    ck_assert_int_gt(asked, 0);
    part.state_free(part.state);

    /* NaN: QL_ENONFINITE at once, nothing kept. */
    x[5 * 4096 + 7] = NAN;
    part = (ql_linear_part){stop_always, &asked, 0, 0, NULL, NULL};
    ck_assert_int_eq(ql_run_linear_part(cpu(), op, q, ra.packed, QL_DTYPE_F32,
                                        x, m, y, &part, &impl),
                     QL_ENONFINITE);
    ck_assert_ptr_null(part.state);
    x[5 * 4096 + 7] = 0.5f;
  }
  /* No backend: the generic op, whole, done at once. */
  int asked = 0;
  ql_linear_part part = {stop_always, &asked, 0, 0, NULL, NULL};
  const char *impl = NULL;
  ck_assert_int_eq(ql_run_linear_part(NULL, QL_OP_LINEAR_WO, q, NULL,
                                      QL_DTYPE_F32, x, 3, y, &part, &impl),
                   0);
  ck_assert_int_eq(part.done, 1);
  ck_assert_int_eq(asked, 0);
  ck_assert_int_eq(ql_linear_wo_ref(q, QL_DTYPE_F32, x, 3, want), 0);
  ck_assert_int_eq(memcmp(y, want, (size_t)(3 * 512) * sizeof(float)), 0);
  rp->free_packed(ra.packed);
  ql_qweight_free(q);
  free(x);
  free(y);
  free(want);
}
END_TEST

static Suite *cpu_suite(void) {
  Suite *s = suite_create("cpu");
  TCase *tc = tcase_create("levels");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, test_levels_match_generic, 0, 4);
  tcase_add_loop_test(tc, test_decode_batches, 0, 8);
  tcase_add_loop_test(tc, test_q4g_long_batches, 0, 8);
  tcase_add_loop_test(tc, test_f8r_all_codes, 0, 4);
#if defined(__x86_64__)
  tcase_add_loop_test(tc, test_f8r_daz, 0, 4);
#endif
  tcase_add_test(tc, test_level_unknown_ignored);
  tcase_add_test(tc, test_level_names);
  suite_add_tcase(s, tc);

  tc = tcase_create("pool");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_threads_same_bytes, 0, 4);
  tcase_add_test(tc, test_threads_bad_env);
  tcase_add_test(tc, test_pool_parts);
  tcase_add_test(tc, test_pool_fork);
  tcase_add_test(tc, test_pool_concurrent_callers);
  tcase_add_loop_test(tc, test_parts_same_bytes, 0, 3);
  tcase_add_test(tc, test_parts_give_up_and_errors);
  suite_add_tcase(s, tc);

  tc = tcase_create("layout");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_repack_round_trip);
  tcase_add_test(tc, test_repack_sizes);
  tcase_add_test(tc, test_repack_large_alignment);
  tcase_add_test(tc, test_repack_f8r_nan);
  tcase_add_test(tc, test_repack_q8b_f8r_flags);
  tcase_add_test(tc, test_repack_op);
  tcase_add_test(tc, test_packed_null_and_mismatch);
  tcase_add_test(tc, test_nonfinite);
  tcase_add_test(tc, test_aq_q8c_max_k_wrap);
  tcase_add_test(tc, test_quantize_rows);
  tcase_add_test(tc, test_quant_row_e4m3);
  tcase_add_test(tc, test_quantize_rows_e4m3);
  tcase_add_test(tc, test_set_threads);
  tcase_add_test(tc, test_impls_called_directly);
  tcase_add_test(tc, test_adopt_refuses);
  tcase_add_test(tc, test_level_set);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run_suite(cpu_suite(), CK_NORMAL); }
