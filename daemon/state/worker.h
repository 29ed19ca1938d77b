/*
 * worker.h - a device worker: one to QL__WORKER_MAX_THREADS threads that
 * run jobs from one bounded FIFO queue (each job on one thread, several at
 * once with several threads) and hand each finished job back to the loop
 * thread.
 *
 * The loop submits; the worker calls job->run on its own thread; the loop
 * then calls job->done (through a uv_async_t), so everything except run()
 * happens on the loop thread and needs no lock.
 */
#ifndef QL_WORKER_H
#define QL_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "wire/clock.h" /* ql__now_ns(), which every worker user times with */

typedef struct ql__job ql__job;
struct ql__job {
  void (*run)(ql__job *job);  /* on the worker thread */
  void (*done)(ql__job *job); /* on the loop thread, after run; frees job */
  uint64_t enqueue_ns;        /* set by ql__worker_submit */
  uint64_t start_ns;          /* set by the worker before run */
  uint64_t end_ns;            /* set by the worker after run */
  ql__job *next;
};

typedef struct ql__worker ql__worker;

/* The most threads of one worker: batches_in_flight's upper bound. */
#define QL__WORKER_MAX_THREADS 3

/*
 * Starts a worker named name (for logs) on loop, with room for max_queue
 * waiting jobs and threads threads (1 .. QL__WORKER_MAX_THREADS, else
 * QL_EINVAL) taking them in order. On success *out is the caller's,
 * released by ql__worker_close() then ql__worker_free().
 */
int ql__worker_create(uv_loop_t *loop, const char *name, size_t max_queue,
                      unsigned threads, ql__worker **out);

/*
 * Queues job. Returns QL_EEXHAUSTED at once when the queue is full and
 * QL_ESHUTDOWN after close; on failure the caller keeps job and done() is
 * never called. On success done() will be called exactly once.
 */
int ql__worker_submit(ql__worker *w, ql__job *job);

/* Jobs submitted and not yet done (loop thread). */
size_t ql__worker_pending(const ql__worker *w);

/* Jobs completed since the start (loop thread): the watchdog's measure of
 * progress. */
uint64_t ql__worker_completed(const ql__worker *w);

/* Lets queued jobs finish, then stops the thread and joins it; completes
 * the done() callbacks of every finished job. Loop thread; blocks. */
void ql__worker_close(ql__worker *w);

/* Frees a closed (or never started) worker. Safe on NULL. */
void ql__worker_free(ql__worker *w);

#endif /* QL_WORKER_H */
