/* ring.c - libqlinear's end of a session's ring: see ring.h. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ring.h"
#include "ql_defs.h"
#include "ql_ring.h"

/* A caller asleep wakes this often to see whether the daemon is still
 * there (its session socket), when no completion came meanwhile. */
#define ALIVE_CHECK_NS 20000000u
#define TAG_INDEX_BITS 16

enum { W_FREE, W_WAITING, W_DONE, W_ABANDONED };

/* One request in flight, and the slot its reply is copied into. */
typedef struct waiter {
  uint64_t tag;
  _Atomic int state; /* written under the lock; read by its caller
                        without it */
  uint32_t len;
  uint8_t *msg; /* QL_RING_MSG_MAX bytes */
  ql__cring_late late;
  void *late_arg;
} waiter;

struct ql__cring {
  ql_ring r;
  int bell;
  uint64_t spin_ns;
  /* Recent round trips (a moving average): a caller spins around the
   * time its reply usually comes, asleep before (ql__cring_call). */
  _Atomic int64_t rt_ema_ns;
  pthread_mutex_t lock; /* guards everything below */
  uint32_t sq_tail, cq_head; /* our producer and consumer indices */
  uint64_t gen;              /* makes tags unique */
  int broken;                /* the daemon broke the ring's rules, or the
                                session ended: no more calls */
  int disabled;
  waiter *w; /* entries of them */
  uint8_t *bufs;
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

__attribute__((format(printf, 4, 5))) static int fail(char *why,
                                                      size_t whylen, int code,
                                                      const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, whylen, fmt, ap);
  va_end(ap);
  return code;
}

int ql__cring_open(int ring_fd, int bell_fd, uint64_t size, uint64_t spin_ns,
                   ql__cring **out) {
  ql__cring *r = NULL;
  void *base = MAP_FAILED;
  int rv = QL_ENOMEM;
  *out = NULL;
  if (size < QL_RING_HDR_BYTES || size > ql__ring_size(QL_RING_MAX_ENTRIES)) {
    rv = QL_EPROTO;
    goto fail;
  }
  /* Mapping a file that could be shorter than size, or shrink later,
   * would expose us to SIGBUS: accept only what the daemon promises, a
   * memfd of this size sealed against shrinking and growing (as regions). */
  struct stat st;
  int seals = fcntl(ring_fd, F_GET_SEALS);
  if (fstat(ring_fd, &st) != 0 || (uint64_t)st.st_size != size ||
      seals < 0 ||
      (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) !=
          (F_SEAL_SHRINK | F_SEAL_GROW)) {
    rv = QL_EPROTO;
    goto fail;
  }
  base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED,
              ring_fd, 0);
  if (base == MAP_FAILED)
    goto fail;
  if ((r = calloc(1, sizeof *r)) == NULL)
    goto fail;
  if (ql__ring_attach(base, (size_t)size, &r->r) != 0) {
    rv = QL_EPROTO;
    goto fail;
  }
  base = MAP_FAILED; /* r->r owns it */
  r->w = calloc(r->r.entries, sizeof *r->w);
  r->bufs = malloc((size_t)r->r.entries * QL_RING_MSG_MAX);
  if (r->w == NULL || r->bufs == NULL ||
      pthread_mutex_init(&r->lock, NULL) != 0)
    goto fail;
  for (uint32_t i = 0; i < r->r.entries; i++)
    r->w[i].msg = r->bufs + (size_t)i * QL_RING_MSG_MAX;
  /* Both indices start where the daemon's do: it made the ring just now
   * and nothing has been sent. */
  r->sq_tail = atomic_load(&r->r.hdr->sq_tail);
  r->cq_head = atomic_load(&r->r.hdr->cq_head);
  r->bell = bell_fd;
  r->spin_ns = spin_ns;
  close(ring_fd);
  *out = r;
  return 0;
fail:
  if (r != NULL && r->r.hdr != NULL)
    munmap(r->r.hdr, r->r.size);
  if (base != MAP_FAILED)
    munmap(base, (size_t)size);
  if (r != NULL) {
    free(r->w);
    free(r->bufs);
    free(r);
  }
  close(ring_fd);
  close(bell_fd);
  return rv;
}

void ql__cring_free(ql__cring *r) {
  if (r == NULL)
    return;
  munmap(r->r.hdr, r->r.size);
  close(r->bell);
  pthread_mutex_destroy(&r->lock);
  free(r->w);
  free(r->bufs);
  free(r);
}

void ql__cring_disable(ql__cring *r) {
  /* Called in a forked child, where no other thread exists: no lock. */
  if (r != NULL)
    r->disabled = 1;
}

static void ring_bell(const ql__cring *r) {
  uint64_t one = 1;
  /* EAGAIN means the counter is full: it is rung already. */
  while (write(r->bell, &one, sizeof one) < 0 && errno == EINTR)
    ;
}

/*
 * Copies every published completion to its waiter (lock held). A
 * completion that answers no request of ours, or a count out of range,
 * breaks the ring: the daemon does not do that.
 */
static void reap(ql__cring *r) {
  uint32_t n;
  if (r->broken)
    return;
  /* cq_head is ours: only a thread of this process holding the lock
   * writes it, with r->cq_head. Another value is the daemon's doing, and
   * the wait loop, which compares it with cq_tail, would spin on it. */
  if (atomic_load_explicit(&r->r.hdr->cq_head, memory_order_relaxed) !=
          r->cq_head ||
      ql__ring_cq_avail(&r->r, r->cq_head, &n) != 0) {
    r->broken = 1;
    return;
  }
  if (n == 0)
    return;
  for (uint32_t i = 0; i < n; i++) {
    const ql_ring_entry *e = &r->r.cq[r->cq_head & (r->r.entries - 1)];
    uint64_t tag = e->tag;
    uint32_t len = e->len;
    uint64_t idx = tag & ((1u << TAG_INDEX_BITS) - 1);
    waiter *w = idx < r->r.entries ? &r->w[idx] : NULL;
    if (w == NULL || w->tag != tag || len > QL_RING_MSG_MAX ||
        (w->state != W_WAITING && w->state != W_ABANDONED)) {
      r->broken = 1;
      return;
    }
    if (w->state == W_WAITING) {
      memcpy(w->msg, e->msg, len);
      w->len = len;
      w->state = W_DONE;
    } else {
      if (w->late != NULL)
        w->late(w->late_arg);
      w->state = W_FREE;
      w->tag = 0;
    }
    r->cq_head++;
  }
  if (ql__ring_cq_release(&r->r, r->cq_head))
    ring_bell(r);
}

/* True if the session socket says the daemon hung up. */
static int gone(int fd) {
  struct pollfd p = {fd, POLLRDHUP, 0};
  if (fd < 0)
    return 0;
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR));
}

int ql__cring_call(ql__cring *r, const Qlinear__V1__Request *req,
                   int timeout_ms, int alive_fd, ql__cring_late late,
                   void *late_arg, Qlinear__V1__Response **out, char *why,
                   size_t whylen) {
  size_t len = qlinear__v1__request__get_packed_size(req);
  waiter *w = NULL;
  *out = NULL;
  if (len > QL_RING_MSG_MAX)
    return QL__CRING_FALLBACK;
  pthread_mutex_lock(&r->lock);
  if (r->broken || r->disabled) {
    pthread_mutex_unlock(&r->lock);
    return QL__CRING_FALLBACK;
  }
  for (uint32_t i = 0; i < r->r.entries && w == NULL; i++)
    if (r->w[i].state == W_FREE)
      w = &r->w[i];
  if (w == NULL) {
    pthread_mutex_unlock(&r->lock);
    return QL__CRING_FALLBACK;
  }
  /* Every slot of the SQ up to sq_tail belongs to a waiter not yet
   * reaped, and one waiter was free: the slot at sq_tail is ours. */
  w->tag = (++r->gen << TAG_INDEX_BITS) | (uint64_t)(w - r->w);
  w->state = W_WAITING;
  w->late = late;
  w->late_arg = late_arg;
  ql_ring_entry *e = &r->r.sq[r->sq_tail & (r->r.entries - 1)];
  qlinear__v1__request__pack(req, e->msg);
  e->tag = w->tag;
  e->len = (uint32_t)len;
  e->flags = 0;
  int bell = ql__ring_sq_publish(&r->r, r->sq_tail);
  r->sq_tail++;
  pthread_mutex_unlock(&r->lock);
  if (bell)
    ring_bell(r);

  /* Spin where the reply is expected: from the start when replies
   * usually come within spin_ns; else asleep until shortly before the
   * usual round trip (the futex returns at once if it comes earlier;
   * the margin covers the kernel's timer slack), then spinning past it. */
  uint64_t start = now_ns();
  int64_t ema = atomic_load_explicit(&r->rt_ema_ns, memory_order_relaxed);
  uint64_t spin_from = start, spin_until = start + r->spin_ns;
  if (ema > (int64_t)r->spin_ns) {
    uint64_t lead = 2 * r->spin_ns;
    spin_from = start + ((uint64_t)ema > lead ? (uint64_t)ema - lead : 0);
    spin_until = start + (uint64_t)ema + r->spin_ns;
  }
  uint64_t deadline = timeout_ms < 0 ? UINT64_MAX
                                     : start + (uint64_t)timeout_ms * 1000000u;
  int rv = 0;
  for (;;) {
    uint32_t tail = atomic_load_explicit(&r->r.hdr->cq_tail,
                                         memory_order_acquire);
    uint32_t head = atomic_load_explicit(&r->r.hdr->cq_head,
                                         memory_order_acquire);
    /* Another thread may have reaped ours: every completion up to tail is
     * reaped when cq_head reaches it, and the reaper marked its waiter
     * before it published cq_head. If ours comes after tail was read, the
     * futex below does not sleep (cq_tail moved). */
    if (tail == head && atomic_load(&w->state) == W_DONE)
      break;
    if (tail != head) {
      pthread_mutex_lock(&r->lock);
      reap(r);
      int st = w->state, broken = r->broken;
      pthread_mutex_unlock(&r->lock);
      if (st == W_DONE)
        break;
      if (broken) {
        rv = fail(why, whylen, QL_EPROTO, "the daemon broke the rules of the "
                  "session's ring");
        goto abandon;
      }
      continue;
    }
    uint64_t now = now_ns();
    if (now < spin_from) {
      ql__ring_wait(&r->r, tail, spin_from - now < ALIVE_CHECK_NS
                                     ? spin_from - now
                                     : ALIVE_CHECK_NS);
      continue;
    }
    if (now < spin_until && spin_from > start &&
        !atomic_load_explicit(&r->r.hdr->spin_hint, memory_order_relaxed))
      spin_until = now; /* the daemon's kernel takes every CPU: sleep */
    if (now < spin_until) {
      /* Polite: where the daemon's threads (or other clients) want this
       * CPU, they get it; on an idle machine this returns at once. */
      cpu_relax();
      sched_yield();
      continue;
    }
    if (now >= deadline) {
      rv = fail(why, whylen, QL_ETIMEDOUT, "no reply within %d ms",
                timeout_ms);
      goto abandon;
    }
    uint64_t nap = deadline - now < ALIVE_CHECK_NS ? deadline - now
                                                   : ALIVE_CHECK_NS;
    ql__ring_wait(&r->r, tail, nap);
    if (atomic_load(&r->r.hdr->cq_tail) == tail && gone(alive_fd)) {
      pthread_mutex_lock(&r->lock);
      reap(r);
      if (w->state == W_DONE) {
        pthread_mutex_unlock(&r->lock);
        break;
      }
      r->broken = 1;
      pthread_mutex_unlock(&r->lock);
      rv = fail(why, whylen, QL_ESESSION, "the daemon ended the session");
      goto abandon;
    }
  }
  int64_t rt = (int64_t)(now_ns() - start);
  atomic_store_explicit(&r->rt_ema_ns, ema + (rt - ema) / 8,
                        memory_order_relaxed);
  uint32_t got = w->len;
  *out = qlinear__v1__response__unpack(NULL, got, w->msg);
  pthread_mutex_lock(&r->lock);
  w->state = W_FREE;
  w->tag = 0;
  pthread_mutex_unlock(&r->lock);
  if (*out == NULL)
    return fail(why, whylen, QL_EPROTO, "cannot decode the daemon's reply "
                "(%u bytes)", (unsigned)got);
  return 0;

abandon:
  pthread_mutex_lock(&r->lock);
  if (w->state == W_DONE || r->broken) {
    /* Its reply came after all (the caller gave up on it), or none will
     * come through this ring: the daemon's end of the session finishes
     * the request or drops it, and either way the caller's memory is its
     * own again once the session is gone. late is for a timeout only:
     * after any other error the caller releases what it lent itself. */
    if (late != NULL && rv == QL_ETIMEDOUT)
      late(late_arg);
    w->state = W_FREE;
    w->tag = 0;
  } else {
    w->state = W_ABANDONED;
  }
  pthread_mutex_unlock(&r->lock);
  return rv;
}
