/* ring.c - a session's shared-memory ring, the daemon's end: see ring.h. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "net/ring.h"
#include "log.h"
#include "ql_errno.h"
#include "ql_ring.h"
#include "wire/route.h"
#include "wire/clock.h"

/* Requests taken from one ring per pass, so that one busy client does not
 * hold the loop. */
#define BURST 32

struct ql__drings {
  uv_loop_t *loop;
  const uint32_t *spin_us;     /* the owner's, read on every use */
  const ql__dring_ops *ops; /* what rings call up */
  void *arg;
  uv_idle_t spin;     /* active while any ring is hot */
  ql__dring *hot;  /* rings polled on every turn of the loop */
  ql__dring_counts counts;
};

struct ql__dring {
  ql__drings *fps;
  void *owner;      /* NULL once the owner ended */
  uint64_t owner_id; /* names it in the log */
  ql_ring ring;     /* our own view: geometry never read back */
  int bell;         /* the eventfd the client writes */
  uv_poll_t poll;   /* on bell */
  int refs;         /* the session's, one per request in flight, the poll
                       handle's until closed */
  int dead;
  uint32_t sq_head;  /* private: next request to take */
  /* Completions are posted by the loop and, for replies that go early,
   * by device workers: cq_mu orders them. cq_tail is written under it;
   * the loop reads it without. */
  pthread_mutex_t cq_mu;
  _Atomic uint32_t cq_tail; /* private: next completion slot */
  uint32_t consumed; /* the client's cq_head as last accepted */
  uint32_t in_flight; /* taken, not yet answered */
  int want_room;     /* requests wait for completion room */
  int is_hot;
  uint64_t hot_until;
  /* How long the client takes to send its next request after a reply
   * (a moving average): the loop spins after a reply only when that is
   * shorter than ring_spin_us, so a client that computes between its
   * requests does not have the daemon spin against it. */
  uint64_t last_reply_ns;
  int64_t gap_ema_ns;
  int gap_open; /* a reply was posted and no request taken since */
  /* How long its requests take from taken to answered (a moving
   * average): the loop keeps polling while one runs only if that is
   * short; a long kernel is left to run without the loop beside it. */
  int64_t serve_ema_ns;
  ql__dring *hot_next;
  uint8_t buf[QL_RING_MSG_MAX]; /* the request being handled, copied out */
};

/* A ring request's route: its tag, and a reference to the ring. */
typedef struct ring_route {
  ql__route base;
  ql__dring *fp;
  uint64_t tag;
  uint64_t taken_ns; /* when the loop took it */
  uint64_t early_ns; /* when a worker posted its reply (early) */
  size_t early_len;  /* and its bytes */
} ring_route;

static void fp_unref(ql__dring *fp) {
  if (--fp->refs > 0)
    return;
  munmap(fp->ring.hdr, fp->ring.size);
  pthread_mutex_destroy(&fp->cq_mu);
  free(fp);
}

static uint64_t spin_ns(const ql__dring *fp) {
  return (uint64_t)*fp->fps->spin_us * 1000u;
}

static void on_spin(uv_idle_t *h);

static void push_hot(ql__dring *fp);

/* Keeps polling fp without sleeping until spin_ns from now. */
static void make_hot(ql__dring *fp, uint64_t now) {
  if (fp->dead)
    return;
  if (now + spin_ns(fp) > fp->hot_until)
    fp->hot_until = now + spin_ns(fp);
  /* Polled: the client need not ring. */
  if (!fp->is_hot)
    atomic_store(&fp->ring.hdr->idle, 0);
  push_hot(fp);
}

/* Takes fp off the hot list; one that on_spin holds in its own list is
 * left there (on_spin skips dead rings). */
static void unlink_hot(ql__dring *fp) {
  for (ql__dring **pp = &fp->fps->hot; *pp; pp = &(*pp)->hot_next)
    if (*pp == fp) {
      *pp = fp->hot_next;
      fp->is_hot = 0;
      fp->hot_next = NULL;
      return;
    }
}

/* The client broke the ring's rules: its owner ends (the ring with it). */
static void violation(ql__dring *fp, const char *what) {
  ql__warn("session %llu: ring: %s; ending the session",
           (unsigned long long)fp->owner_id, what);
  if (fp->owner != NULL)
    fp->fps->ops->violation(fp->fps->arg, fp->owner,
                            "it broke the rules of its ring");
}

/* ------------------------------------------------------------ completions */

/* Packs resp into the next completion slot; any thread. The room was
 * reserved when the request was taken. Returns the bytes written. */
static size_t post(ql__dring *fp, uint64_t tag,
                   const ql__msg_response *resp) {
  size_t len = qlinear__v1__response__get_packed_size(resp);
  ql__msg_response small;
  Qlinear__V1__Status st;
  if (len > QL_RING_MSG_MAX) {
    /* Only a body could be this large (a status message is bounded). */
    qlinear__v1__response__init(&small);
    qlinear__v1__status__init(&st);
    small.request_id = resp->request_id;
    small.status = &st;
    st.code = QL_ETOOBIG;
    st.message = "the reply does not fit a ring slot";
    resp = &small;
    len = qlinear__v1__response__get_packed_size(resp);
  }
  pthread_mutex_lock(&fp->cq_mu);
  uint32_t tail = atomic_load(&fp->cq_tail);
  qlinear__v1__response__pack(resp, ql__ring_cq_msg(&fp->ring, tail));
  int wake = ql__ring_cq_publish(&fp->ring, tail, tag, (uint32_t)len);
  atomic_store(&fp->cq_tail, tail + 1);
  pthread_mutex_unlock(&fp->cq_mu);
  if (wake)
    ql__ring_wake(&fp->ring);
  return len;
}

/* After a reply was posted (loop thread): the gap to the client's next
 * request starts, and the loop polls for it if that is usually short. */
static void replied(ql__dring *fp, uint64_t taken, uint64_t at) {
  int64_t serve = (int64_t)(at - taken);
  fp->serve_ema_ns += (serve - fp->serve_ema_ns) / 8;
  fp->last_reply_ns = at;
  fp->gap_open = 1;
  if (fp->gap_ema_ns <= (int64_t)spin_ns(fp))
    make_hot(fp, ql__now_ns());
}

static int ring_reply(ql__route *rt_, const ql__msg_response *resp,
                      size_t *bytes_out) {
  ring_route *rt = (ring_route *)rt_;
  ql__dring *fp = rt->fp;
  int rc = QL_ESESSION;
  fp->in_flight--;
  if (!fp->dead) {
    size_t len = post(fp, rt->tag, resp);
    if (bytes_out != NULL)
      *bytes_out += len;
    rc = 0;
    replied(fp, rt->taken_ns, ql__now_ns());
  }
  free(rt);
  fp_unref(fp);
  return rc;
}

/* A worker's reply, the moment its kernel is done. The ring and its
 * mapping stay while the route holds its reference; a ring whose session
 * ended meanwhile gets a completion nobody reads. */
static int ring_early(ql__route *rt_, const ql__msg_response *resp) {
  ring_route *rt = (ring_route *)rt_;
  rt->early_len = post(rt->fp, rt->tag, resp);
  rt->early_ns = ql__now_ns();
  return 1;
}

static void ring_done(ql__route *rt_, size_t *bytes_out) {
  ring_route *rt = (ring_route *)rt_;
  ql__dring *fp = rt->fp;
  fp->in_flight--;
  if (bytes_out != NULL)
    *bytes_out += rt->early_len;
  if (!fp->dead)
    replied(fp, rt->taken_ns, rt->early_ns);
  free(rt);
  fp_unref(fp);
}

static void ring_drop(ql__route *rt_) {
  ring_route *rt = (ring_route *)rt_;
  rt->fp->in_flight--;
  fp_unref(rt->fp);
  free(rt);
}

static void ring_dispatched(ql__route *rt_, int spare) {
  ring_route *rt = (ring_route *)rt_;
  atomic_store_explicit(&rt->fp->ring.hdr->spin_hint, (uint32_t)spare,
                        memory_order_relaxed);
}

static const ql__route_ops ring_ops = {ring_reply, ring_drop, ring_early,
                                       ring_done, ring_dispatched};

/* An answer without a route (none could be made): an error. */
static void post_error(ql__dring *fp, uint64_t tag, int code,
                       const char *msg) {
  ql__msg_response resp;
  Qlinear__V1__Status st;
  qlinear__v1__response__init(&resp);
  qlinear__v1__status__init(&st);
  resp.status = &st;
  st.code = code;
  st.message = (char *)msg;
  fp->fps->counts.answered++;
  fp->fps->counts.errors[ql__err_slot(code)]++;
  fp->fps->counts.bytes_out += post(fp, tag, &resp);
}

/* ------------------------------------------------------------ requests */

/*
 * Takes and handles what the client published, up to BURST requests.
 * Returns the number taken; a broken ring ends the session (fp->dead).
 */
static unsigned drain(ql__dring *fp) {
  ql__drings *fps = fp->fps;
  unsigned taken = 0;
  fp->refs++; /* handling may end the owner */
  while (!fp->dead && taken < BURST) {
    uint32_t avail, room;
    if (ql__ring_sq_avail(&fp->ring, fp->sq_head, &avail) != 0) {
      violation(fp, "its request index is out of range");
      break;
    }
    if (avail == 0)
      break;
    /* Under cq_mu: a worker's completion published (and consumed by the
     * client) after a look at cq_tail would make a consistent cq_head
     * look past it. */
    pthread_mutex_lock(&fp->cq_mu);
    int bad = ql__ring_cq_room(&fp->ring, atomic_load(&fp->cq_tail),
                               &fp->consumed, &room);
    pthread_mutex_unlock(&fp->cq_mu);
    if (bad != 0) {
      violation(fp, "its completion index is out of range");
      break;
    }
    if (fp->in_flight >= room) {
      fp->want_room = 1;
      break;
    }
    fp->want_room = 0;
    uint64_t tag;
    size_t len;
    if (fp->gap_open) {
      int64_t gap = (int64_t)(ql__now_ns() - fp->last_reply_ns);
      fp->gap_ema_ns += (gap - fp->gap_ema_ns) / 8;
      fp->gap_open = 0;
    }
    int rc = ql__ring_sq_copy(&fp->ring, fp->sq_head, &tag, fp->buf, &len);
    ql__ring_sq_release(&fp->ring, ++fp->sq_head);
    fp->in_flight++;
    taken++;
    fps->counts.taken++;
    if (rc != 0) {
      post_error(fp, tag, rc, "the ring slot claims more bytes than a slot "
                 "holds");
      fp->in_flight--;
      continue;
    }
    ring_route *rt = malloc(sizeof *rt);
    if (rt == NULL) {
      post_error(fp, tag, QL_ENOMEM, "out of memory");
      fp->in_flight--;
      continue;
    }
    rt->base.ops = &ring_ops;
    rt->fp = fp;
    rt->tag = tag;
    rt->taken_ns = ql__now_ns();
    fp->refs++;
    fps->ops->message(fps->arg, fp->owner, fp->buf, len, rt);
  }
  fp_unref(fp);
  return taken;
}

/*
 * A ring the loop stops polling: its flag tells the client to ring the
 * doorbell (a ring waiting for completion room waits for the client to
 * consume; new requests cannot be taken before that anyway). When the
 * client published something meanwhile, the ring is polled once more on
 * the next turn instead.
 */
static void settle(ql__dring *fp) {
  int moved = fp->want_room
                  ? ql__ring_arm(&fp->ring, &fp->ring.hdr->blocked,
                                 fp->sq_head, fp->consumed)
                  : ql__ring_arm(&fp->ring, &fp->ring.hdr->idle, fp->sq_head,
                                 fp->consumed);
  if (moved)
    push_hot(fp);
}

/* Puts fp on the hot list (it is polled on every turn of the loop). */
static void push_hot(ql__dring *fp) {
  ql__drings *fps = fp->fps;
  if (fp->is_hot || fp->dead)
    return;
  fp->is_hot = 1;
  fp->hot_next = fps->hot;
  fps->hot = fp;
  if (!uv_is_active((uv_handle_t *)&fps->spin))
    uv_idle_start(&fps->spin, on_spin);
}

/*
 * The loop's turn while rings are hot: each is drained; one quiet for
 * ring_spin_us is armed (its flags tell the client to ring) and left to
 * its doorbell. The list is taken whole first; rings on it keep is_hot
 * set (so that nothing links them elsewhere meanwhile) and a reference
 * (so that a session ended meanwhile leaves them readable).
 */
static void on_spin(uv_idle_t *h) {
  ql__drings *fps = h->data;
  uint64_t now = ql__now_ns();
  ql__dring *list = fps->hot;
  fps->hot = NULL;
  int busy = 0;
  for (ql__dring *fp = list; fp != NULL; fp = fp->hot_next)
    fp->refs++;
  while (list != NULL) {
    ql__dring *fp = list;
    list = fp->hot_next;
    fp->hot_next = NULL;
    fp->is_hot = 0;
    if (!fp->dead) {
      /* Taking requests does not keep the loop spinning: their kernels
       * run meanwhile, and the reply is what starts the next wait. */
      busy |= drain(fp) > 0;
      /* With a request running, what comes next is its reply, which the
       * worker's completion wakes the loop for: unless its requests are
       * usually served within the spin window, the ring sleeps on its
       * doorbell meanwhile (a client with more to send rings it). */
      if (!fp->dead && now < fp->hot_until &&
          (fp->in_flight == 0 || fp->serve_ema_ns <= (int64_t)spin_ns(fp)))
        push_hot(fp);
      else if (!fp->dead)
        settle(fp);
    }
    fp_unref(fp);
  }
  if (fps->hot == NULL)
    uv_idle_stop(&fps->spin);
  else if (!busy)
    /* Nothing came this turn: the loop goes round again at once, but lets
     * the kernels' threads and the clients have the CPU if they want it. */
    sched_yield();
}

/* The doorbell rang. */
static void on_bell(uv_poll_t *p, int status, int events) {
  ql__dring *fp = p->data;
  uint64_t v;
  (void)events;
  if (status < 0 || fp->dead)
    return;
  /* Clear it (it is non-blocking; a count of any size means "look"). */
  while (read(fp->bell, &v, sizeof v) < 0 && errno == EINTR)
    ;
  fp->refs++;
  drain(fp);
  /* Not polled: the flags must say so again. */
  if (!fp->dead && !fp->is_hot)
    settle(fp);
  fp_unref(fp);
}

/* ------------------------------------------------------------ life */

int ql__drings_open(uv_loop_t *loop, const uint32_t *spin_us,
                       const ql__dring_ops *ops, void *arg,
                       ql__drings **out) {
  ql__drings *fps = calloc(1, sizeof *fps);
  *out = NULL;
  if (fps == NULL)
    return QL_ENOMEM;
  fps->loop = loop;
  fps->spin_us = spin_us;
  fps->ops = ops;
  fps->arg = arg;
  if (uv_idle_init(loop, &fps->spin) != 0) {
    free(fps);
    return QL_EINTERNAL;
  }
  fps->spin.data = fps;
  *out = fps;
  return 0;
}

void ql__drings_counts(const ql__drings *fps, ql__dring_counts *out) {
  out->taken += fps->counts.taken;
  out->answered += fps->counts.answered;
  out->bytes_out += fps->counts.bytes_out;
  for (unsigned i = 0; i <= QL__ERR_SLOTS; i++)
    out->errors[i] += fps->counts.errors[i];
}

static void on_fps_closed(uv_handle_t *h) { free(h->data); }

void ql__drings_close(ql__drings *fps) {
  if (fps == NULL)
    return;
  uv_close((uv_handle_t *)&fps->spin, on_fps_closed);
}

int ql__dring_create(ql__drings *fps, void *owner, uint64_t owner_id,
                        uint32_t entries, ql__dring **out, int *ring_fd,
                        int *bell_fd, char *err, size_t errlen) {
  int fd = -1, bell = -1, rc;
  void *base = MAP_FAILED;
  ql__dring *fp = NULL;
  if (entries == 0)
    entries = QL_RING_DEFAULT_ENTRIES;
  size_t size = ql__ring_size(entries);
  if (size == 0) {
    snprintf(err, errlen, "create_ring: %u entries: a power of two from %u "
             "to %u", entries, QL_RING_MIN_ENTRIES, QL_RING_MAX_ENTRIES);
    return QL_EINVAL;
  }
  if ((fp = calloc(1, sizeof *fp)) == NULL) {
    snprintf(err, errlen, "create_ring: out of memory");
    return QL_ENOMEM;
  }
  fd = memfd_create("qlinear-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || ftruncate(fd, (off_t)size) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    rc = ql__errno_from_sys(errno);
    snprintf(err, errlen, "create_ring: memfd: %s", strerror(errno));
    goto fail;
  }
  base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    rc = QL_ENOMEM;
    snprintf(err, errlen, "create_ring: cannot map it: %s", strerror(errno));
    goto fail;
  }
  bell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (bell < 0) {
    rc = ql__errno_from_sys(errno);
    snprintf(err, errlen, "create_ring: eventfd: %s", strerror(errno));
    goto fail;
  }
  ql__ring_format(base, entries, &fp->ring);
  base = MAP_FAILED; /* fp->ring owns it now */
  if (uv_poll_init(fps->loop, &fp->poll, bell) != 0) {
    rc = QL_EINTERNAL;
    snprintf(err, errlen, "create_ring: cannot poll the doorbell");
    munmap(fp->ring.hdr, fp->ring.size);
    goto fail;
  }
  fp->poll.data = fp;
  pthread_mutex_init(&fp->cq_mu, NULL);
  fp->fps = fps;
  fp->owner = owner;
  fp->owner_id = owner_id;
  fp->bell = bell;
  fp->refs = 2; /* the session's and the poll handle's */
  uv_poll_start(&fp->poll, UV_READABLE, on_bell);
  /* The client writes a duplicate; ours stays open with the handle. */
  int dup = fcntl(bell, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) {
    snprintf(err, errlen, "create_ring: dup: %s", strerror(errno));
    close(fd);
    ql__dring_end(fp); /* closes bell with the handle */
    return QL_EEXHAUSTED;
  }
  *out = fp;
  *ring_fd = fd;
  *bell_fd = dup;
  /* The ring starts quiet: the client's first request rings. */
  atomic_store(&fp->ring.hdr->idle, 1);
  return 0;
fail:
  if (base != MAP_FAILED)
    munmap(base, size);
  if (fd >= 0)
    close(fd);
  if (bell >= 0)
    close(bell);
  free(fp);
  return rc;
}

uint64_t ql__dring_bytes(const ql__dring *fp) { return fp->ring.size; }

static void on_poll_closed(uv_handle_t *h) {
  ql__dring *fp = h->data;
  close(fp->bell);
  fp_unref(fp);
}

void ql__dring_end(ql__dring *fp) {
  if (fp == NULL || fp->dead)
    return;
  fp->dead = 1;
  fp->owner = NULL;
  unlink_hot(fp);
  uv_close((uv_handle_t *)&fp->poll, on_poll_closed);
  fp_unref(fp); /* the session's */
}
