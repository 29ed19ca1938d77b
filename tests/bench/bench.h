/*
 * bench.h - what the two parts of qlinear-bench share: the kernel bench
 * (qlinear_bench.c) and `qlinear-bench daemon` (bench_daemon.c).
 *
 * Timing (a sample is `reps` calls, calibrated to a minimum length), the
 * median/min/max of a set of pairs, and the in-process kernel call: a
 * weight quantized here, repacked by the CPU backend, and the kernel that
 * ql_dispatch() picks on the cpu backend reading that layout, which is what
 * the daemon's CPU device runs. These are one program's helpers, defined in
 * qlinear_bench.c; nothing outside tests/bench/ links them.
 */
#ifndef QL_BENCH_H
#define QL_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cpu.h"
#include "ql_kernels.h"
#include "registry.h"

/* Something to time: run(ctx, i) does call i (rotating over copies). */
typedef struct timed {
  const char *name;
  void (*run)(void *ctx, long i);
  void *ctx;
  long reps; /* calls per sample, calibrated */
  long next; /* the next call index (keeps rotating across samples) */
} timed;

typedef struct stat3 {
  double med, min, max;
  int valid;
} stat3;

/* A weight of one format with its copies (for rotation). */
typedef struct wset {
  ql_format f;
  ql_qweight *q;
  ql__cpu_packed **pk; /* ncopies layouts (the CPU backend's repack) */
  const ql_kernel_impl *rp;
  int ncopies;
  size_t wbytes; /* canonical qdata + scale + zero */
  float **deq;   /* nf copies of dequant(W) f32 [N,K], for BLAS */
  int nf;
  int8_t *w8; /* q8c: the int8 weight [N,K] for oneDNN */
} wset;

/* One in-process linear call per run: im on ws (its copy i % ncopies, or
 * the canonical weight when ref is set). Exits the program on an error. */
typedef struct lin_ctx {
  const ql_kernel_impl *im;
  const wset *ws;
  const float *x;
  int64_t m;
  float *y;
  int ref; /* the generic op, canonical weight */
} lin_ctx;

/* CLOCK_MONOTONIC in seconds: one clock for every process of a run. */
double now_s(void);

/* One sample of t: t->reps calls; returns the time per call. */
double sample(timed *t);

/* Sets t->reps so that a sample lasts at least min_s (after a warm-up). */
void calibrate(timed *t, double min_s);

/* Median, min and max of v[0..n-1] (n >= 1); sorts v. */
stat3 stats(double *v, int n);

/* A timed run function: ctx is a lin_ctx. */
void lin_run(void *ctx, long i);

/* A draw from N(0, 1), from the program's one deterministic stream. */
double gauss(void);

/* 64-byte aligned memory, or exits the program. Freed with free(). */
void *xalloc(size_t n);

/* Frees what a wset holds (its layouts, copies and weight); fields left
 * zero are skipped. */
void wset_free(wset *ws);

/*
 * The weight set of a case: a bf16 weight N(0, 0.02) quantized to format
 * f (group or block gs, asym, scale dtype sdt; 0 the default), the CPU
 * backend's layout of it copied until the copies exceed 4x llc_bytes (so
 * every call streams its weight from memory), and, with blas, as many f32
 * dequantized copies. 0 or the library's error; wset_free() frees it.
 */
int wset_build(ql_format f, uint32_t gs, int asym, ql_dtype sdt, int64_t n,
               int64_t k, double llc_bytes, int blas, wset *ws);

/* Writes ,"name":{"median":..,"min":..,"max":..} to f. */
void print_stat(FILE *f, const char *name, stat3 s);

/* `qlinear-bench daemon ARGS...` (argv[0] is "daemon"): exit status. */
int bench_daemon(int argc, char **argv);

/* `qlinear-bench crossover` (bench_crossover.c). */
int bench_crossover(int argc, char **argv);

/* `qlinear-bench model` (bench_model_run.c): runs tests/bench/bench_model.py
 * with this build's paths; returns only on failure. */
int bench_model(int argc, char **argv);

#endif /* QL_BENCH_H */
