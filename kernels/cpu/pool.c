/*
 * pool.c - the CPU backend's fixed thread pool (cpu.h).
 *
 * T threads in all: the caller runs part 0, T-1 workers run the others.
 * The workers are created once, on the first parallel call, and never
 * exit. A call publishes (fn, ctx, parts) and bumps a generation counter;
 * a worker spins briefly on the counter after each job (decode batches
 * come back to back, and a condition-variable wake-up costs tens of
 * microseconds against a GEMV of a few hundred) and then sleeps on a
 * condition variable. Which part a thread runs is fixed by its index, and
 * the kernels split N by part into fixed contiguous ranges, so the work of
 * an output element never moves between threads within a call; its
 * reduction order does not depend on the split anyway (cpu.h).
 *
 * fork(): the child has only the forking thread. pthread_atfork holds the
 * pool's locks across the fork, and the child forgets the parent's
 * workers so that its first parallel call creates its own.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "cpu.h"

#define POOL_MAX 256
/* Spin iterations before sleeping (each a pause of ~10-40 ns, plus the
 * load): tens of microseconds. */
#define POOL_SPIN 4000
/* Spin iterations between two sched_yield() calls while idle. */
#define POOL_YIELD_EVERY 64

typedef struct pool {
  pthread_mutex_t call_mu; /* one parallel call at a time */
  pthread_mutex_t mu;      /* guards sleeping and waking */
  pthread_cond_t work_cv, done_cv;
  int nthreads;      /* T, the caller included; 0 until created */
  int sleepers;      /* workers waiting on work_cv (under mu) */
  int caller_sleeps; /* the caller waits on done_cv (under mu) */
  atomic_uint_fast64_t gen;
  atomic_int pending; /* worker parts of the current job not done */
  void (*fn)(void *, int, int);
  void *ctx;
  int parts;
} pool;

static pool P = {PTHREAD_MUTEX_INITIALIZER,
                 PTHREAD_MUTEX_INITIALIZER,
                 PTHREAD_COND_INITIALIZER,
                 PTHREAD_COND_INITIALIZER,
                 0,
                 0,
                 0,
                 0,
                 0,
                 NULL,
                 NULL,
                 0};
static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static int atfork_done;
static int want_threads = -1; /* the configured T, read once */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* QL_CPU_THREADS if it is an integer in [1, POOL_MAX], else the CPUs in
 * this process's affinity mask (a cpuset or taskset is respected), else
 * the online CPUs. */
static int configured_threads(void) {
  const char *e = getenv("QL_CPU_THREADS");
  if (e != NULL && *e != '\0') {
    char *end;
    long v = strtol(e, &end, 10);
    if (*end == '\0' && v >= 1 && v <= POOL_MAX)
      return (int)v;
  }
#ifdef CPU_COUNT
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int c = CPU_COUNT(&set);
    if (c >= 1)
      return c < POOL_MAX ? c : POOL_MAX;
  }
#endif
  long c = sysconf(_SC_NPROCESSORS_ONLN);
  return c < 1 ? 1 : c > POOL_MAX ? POOL_MAX : (int)c;
}

int ql__cpu_threads(void) {
  pthread_mutex_lock(&init_mu);
  if (want_threads < 0)
    want_threads = configured_threads();
  int t = want_threads;
  pthread_mutex_unlock(&init_mu);
  return t;
}

int ql__cpu_set_threads(unsigned threads) {
  int rc = 0;
  if (threads > POOL_MAX)
    return QL_EINVAL;
  pthread_mutex_lock(&init_mu);
  int t = threads == 0 ? configured_threads() : (int)threads;
  if (P.nthreads != 0) /* the pool exists: only its own size is fine */
    rc = t == want_threads ? 0 : QL_ENOTSUP;
  else
    want_threads = t;
  pthread_mutex_unlock(&init_mu);
  return rc;
}

/* A worker's index, and the generation before the first job it must run:
 * read by the creator, because a new thread may start only after that
 * job has been published. */
typedef struct worker_arg {
  int id;
  uint_fast64_t gen;
} worker_arg;

static void *worker_main(void *arg) {
  int id = ((worker_arg *)arg)->id;
  uint_fast64_t seen = ((worker_arg *)arg)->gen;
  free(arg);
  for (;;) {
    uint_fast64_t g;
    int spins = 0;
    while ((g = atomic_load_explicit(&P.gen, memory_order_acquire)) == seen &&
           spins < POOL_SPIN) {
      cpu_relax();
      /* Now and then the CPU goes to whoever wants it: the daemon's loop
       * thread, with the next job to give out, must not wait for this
       * spin on a host whose pool takes every CPU. */
      if (++spins % POOL_YIELD_EVERY == 0)
        sched_yield();
    }
    if (g == seen) {
      pthread_mutex_lock(&P.mu);
      P.sleepers++;
      while ((g = atomic_load_explicit(&P.gen, memory_order_acquire)) == seen)
        pthread_cond_wait(&P.work_cv, &P.mu);
      P.sleepers--;
      pthread_mutex_unlock(&P.mu);
    }
    seen = g;
    /* Parts id, id + nthreads, ...: more than one only where the pool
     * has fewer threads than it was configured with (pool_create). */
    for (int p = id; p < P.parts; p += P.nthreads)
      P.fn(P.ctx, p, P.parts);
    if (atomic_fetch_sub_explicit(&P.pending, 1, memory_order_acq_rel) == 1) {
      pthread_mutex_lock(&P.mu);
      if (P.caller_sleeps)
        pthread_cond_signal(&P.done_cv);
      pthread_mutex_unlock(&P.mu);
    }
  }
  return NULL;
}

static void atfork_prepare(void) {
  pthread_mutex_lock(&init_mu);
  pthread_mutex_lock(&P.call_mu);
  pthread_mutex_lock(&P.mu);
}

static void atfork_parent(void) {
  pthread_mutex_unlock(&P.mu);
  pthread_mutex_unlock(&P.call_mu);
  pthread_mutex_unlock(&init_mu);
}

/* The child: no workers; fresh locks (the ones held across the fork
 * belong to this thread, but reinitializing is the portable reset). */
static void atfork_child(void) {
  pthread_mutex_init(&init_mu, NULL);
  pthread_mutex_init(&P.call_mu, NULL);
  pthread_mutex_init(&P.mu, NULL);
  pthread_cond_init(&P.work_cv, NULL);
  pthread_cond_init(&P.done_cv, NULL);
  P.nthreads = 0;
  P.sleepers = 0;
  P.caller_sleeps = 0;
  atomic_store(&P.pending, 0);
}

/* Creates the workers (under init_mu). Fewer threads than configured when
 * creation fails: the pool still works with those it has, each taking
 * several of a call's parts, so that a call still gets the parts it
 * planned for from ql__cpu_threads(). Workers block every signal, so that
 * signals go to the daemon's own threads. */
static void pool_create(void) {
  int t =
      want_threads < 0 ? (want_threads = configured_threads()) : want_threads;
  sigset_t all, old;
  pthread_attr_t attr;

  if (!atfork_done) {
    if (pthread_atfork(atfork_prepare, atfork_parent, atfork_child) != 0) {
      P.nthreads = 1; /* without fork safety, stay single-threaded */
      return;
    }
    atfork_done = 1;
  }
  P.nthreads = 1;
  if (t <= 1)
    return;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  for (int i = 1; i < t; i++) {
    pthread_t th;
    worker_arg *a = malloc(sizeof *a);
    if (a == NULL)
      break;
    a->id = i;
    a->gen = atomic_load(&P.gen);
    if (pthread_create(&th, &attr, worker_main, a) != 0) {
      free(a);
      break;
    }
    P.nthreads++;
  }
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

void ql__cpu_parallel(void (*fn)(void *ctx, int part, int parts), void *ctx,
                      int max_parts) {
  int parts;

  if (max_parts <= 1) {
    fn(ctx, 0, 1);
    return;
  }
  pthread_mutex_lock(&init_mu);
  if (P.nthreads == 0)
    pool_create();
  /* The configured count, which callers plan their grids with; not the
   * threads the pool got. */
  parts = want_threads < max_parts ? want_threads : max_parts;
  int have = P.nthreads;
  pthread_mutex_unlock(&init_mu);
  if (parts <= 1) {
    fn(ctx, 0, 1);
    return;
  }
  if (have <= 1) {
    for (int p = 0; p < parts; p++)
      fn(ctx, p, parts);
    return;
  }

  pthread_mutex_lock(&P.call_mu);
  P.fn = fn;
  P.ctx = ctx;
  P.parts = parts;
  /* Every worker takes part in every job (the ones past parts just count
   * down), so that the generation each one has seen stays in step. */
  atomic_store_explicit(&P.pending, P.nthreads - 1, memory_order_relaxed);
  pthread_mutex_lock(&P.mu);
  atomic_fetch_add_explicit(&P.gen, 1, memory_order_release);
  if (P.sleepers > 0)
    pthread_cond_broadcast(&P.work_cv);
  pthread_mutex_unlock(&P.mu);

  for (int p = 0; p < parts; p += have)
    fn(ctx, p, parts);

  for (int spins = 0;
       atomic_load_explicit(&P.pending, memory_order_acquire) != 0 &&
       spins < POOL_SPIN;
       spins++)
    cpu_relax();
  if (atomic_load_explicit(&P.pending, memory_order_acquire) != 0) {
    pthread_mutex_lock(&P.mu);
    P.caller_sleeps = 1;
    while (atomic_load_explicit(&P.pending, memory_order_acquire) != 0)
      pthread_cond_wait(&P.done_cv, &P.mu);
    P.caller_sleeps = 0;
    pthread_mutex_unlock(&P.mu);
  }
  pthread_mutex_unlock(&P.call_mu);
}
