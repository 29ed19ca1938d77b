/* worker.c - see worker.h. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "ql_defs.h"
#include "state/worker.h"

struct ql__worker {
  char name[32];
  uv_loop_t *loop;
  uv_async_t *async;  /* wakes the loop; freed by its close callback */
  pthread_t thread[QL__WORKER_MAX_THREADS];
  unsigned threads;     /* started */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  ql__job *head, *tail; /* waiting jobs (mu) */
  size_t queued;        /* waiting jobs (mu) */
  atomic_size_t posted; /* jobs submitted so far: what a spinning thread
                           watches without the lock */
  unsigned sleeping;    /* threads waiting on cv (mu) */
  ql__job *done_head, *done_tail; /* finished, not yet completed (mu) */
  int stop;             /* (mu) */
  size_t max_queue;
  size_t pending;       /* loop thread: submitted, done() not yet called */
  uint64_t completed;   /* loop thread: done() calls so far */
  int closed;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/*
 * With nothing queued, a thread first watches for a new job for
 * SPIN_NS without the lock (decode requests come back to back, and a
 * wake-up through the condition variable costs more than a small
 * kernel), yielding the CPU to whoever wants it, then sleeps. Called and
 * returns with mu held.
 */
#define SPIN_NS 50000u
static void wait_for_work(ql__worker *w) {
  size_t seen = atomic_load(&w->posted);
  pthread_mutex_unlock(&w->mu);
  uint64_t end = ql__now_ns() + SPIN_NS;
  while (atomic_load_explicit(&w->posted, memory_order_relaxed) == seen &&
         ql__now_ns() < end) {
    cpu_relax();
    sched_yield();
  }
  pthread_mutex_lock(&w->mu);
  while (w->head == NULL && !w->stop) {
    w->sleeping++;
    pthread_cond_wait(&w->cv, &w->mu);
    w->sleeping--;
  }
}

static void *worker_main(void *arg) {
  ql__worker *w = arg;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    if (w->head == NULL && !w->stop)
      wait_for_work(w);
    if (w->head == NULL)
      break; /* stop requested and the queue is drained */
    ql__job *job = w->head;
    w->head = job->next;
    if (w->head == NULL)
      w->tail = NULL;
    w->queued--;
    pthread_mutex_unlock(&w->mu);

    job->next = NULL;
    job->start_ns = ql__now_ns();
    job->run(job);
    job->end_ns = ql__now_ns();

    pthread_mutex_lock(&w->mu);
    if (w->done_tail)
      w->done_tail->next = job;
    else
      w->done_head = job;
    w->done_tail = job;
    uv_async_send(w->async);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

/* Runs done() for every finished job; loop thread. */
static void complete_finished(ql__worker *w) {
  pthread_mutex_lock(&w->mu);
  ql__job *job = w->done_head;
  w->done_head = w->done_tail = NULL;
  pthread_mutex_unlock(&w->mu);
  while (job != NULL) {
    ql__job *next = job->next;
    w->pending--;
    w->completed++;
    job->done(job);
    job = next;
  }
}

static void on_async(uv_async_t *a) { complete_finished(a->data); }

/* The handle outlives the worker until libuv is done with it. */
static void free_handle(uv_handle_t *h) { free(h); }

int ql__worker_create(uv_loop_t *loop, const char *name, size_t max_queue,
                      unsigned threads, ql__worker **out) {
  int rc = QL_ENOMEM;
  *out = NULL;
  ql__worker *w = calloc(1, sizeof *w);
  if (w == NULL)
    return QL_ENOMEM;
  snprintf(w->name, sizeof w->name, "%s", name);
  w->loop = loop;
  w->max_queue = max_queue;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  w->async = malloc(sizeof *w->async);
  if (w->async == NULL)
    goto fail;
  if (uv_async_init(loop, w->async, on_async) != 0) {
    free(w->async);
    w->async = NULL;
    rc = QL_EINTERNAL;
    goto fail;
  }
  w->async->data = w;
  if (threads < 1 || threads > QL__WORKER_MAX_THREADS) {
    rc = QL_EINVAL;
    goto fail;
  }
  for (; w->threads < threads; w->threads++)
    if (pthread_create(&w->thread[w->threads], NULL, worker_main, w) != 0) {
      rc = QL_EEXHAUSTED;
      goto fail;
    }
  *out = w;
  return 0;
fail:
  ql__worker_close(w);
  ql__worker_free(w);
  return rc;
}

int ql__worker_submit(ql__worker *w, ql__job *job) {
  int rc = 0;
  job->next = NULL;
  job->enqueue_ns = ql__now_ns();
  pthread_mutex_lock(&w->mu);
  if (w->stop)
    rc = QL_ESHUTDOWN;
  else if (w->queued >= w->max_queue)
    rc = QL_EEXHAUSTED;
  else {
    if (w->tail)
      w->tail->next = job;
    else
      w->head = job;
    w->tail = job;
    w->queued++;
    atomic_fetch_add(&w->posted, 1);
    /* A spinning thread takes it without a wake-up. */
    if (w->sleeping > 0)
      pthread_cond_signal(&w->cv);
  }
  pthread_mutex_unlock(&w->mu);
  if (rc == 0)
    w->pending++;
  return rc;
}

size_t ql__worker_pending(const ql__worker *w) { return w->pending; }

uint64_t ql__worker_completed(const ql__worker *w) { return w->completed; }

void ql__worker_close(ql__worker *w) {
  if (w == NULL || w->closed)
    return;
  w->closed = 1;
  pthread_mutex_lock(&w->mu);
  w->stop = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  for (unsigned i = 0; i < w->threads; i++)
    pthread_join(w->thread[i], NULL);
  complete_finished(w);
  if (w->async != NULL)
    uv_close((uv_handle_t *)w->async, free_handle);
  w->async = NULL;
}

void ql__worker_free(ql__worker *w) {
  if (w == NULL)
    return;
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w);
}
