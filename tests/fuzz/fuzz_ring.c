/*
 * fuzz_ring.c - libFuzzer target for the daemon's reader of a ring that a
 * hostile client writes (DESIGN §7, proto/ql_ring.h): the daemon's own
 * ring code, daemon/net/ring.c, linked as it is, on a libuv loop of its
 * own, with ops (net/ring.h) that stand in for the request handlers.
 *
 * Each input makes a ring of ENTRIES slots with ql__dring_create(),
 * maps its memfd as the client does, and is read as a script of
 * operations:
 *
 *  - the client's writes, arbitrary or near the indices the daemon
 *    publishes: sq_tail, cq_head, waiters, the flags, an SQ slot's tag,
 *    length and bytes, any bytes of the header page (its constants too),
 *    the daemon's own line, a well-formed submission through
 *    ql__ring_sq_publish() and a consumption of completions through
 *    ql__ring_cq_avail() and ql__ring_cq_release();
 *  - the doorbell rung and the loop run once (the daemon's drain(), its
 *    arming before it sleeps, its spinning on a hot ring);
 *  - what the handlers do with a request the ring handed up: decoded with
 *    ql__request_decode() under handlers.c's budget, checked with
 *    ql__request_check_strings() and ql__request_validate(), and answered
 *    at once, or held and answered later (reply, early reply from another
 *    thread then done, or dropped), so that requests stay in flight and
 *    the ring's room accounting is reached;
 *  - a restart: the ring ended (as its session ends) and a new one made,
 *    with the answers of the old one's held requests still to come.
 *
 * Meanwhile a second thread keeps rewriting the mapping: from the SQ's
 * message bytes only up to anything in it, headers and CQ included, as
 * the first byte of the input picks. It is bounded (a fixed number of
 * writes) and joined at the end of the input.
 *
 * Invariants (abort() on a violation, so that libFuzzer reports it): a
 * message handed up is never longer than QL_RING_MSG_MAX, and never comes
 * from a ring that ended or whose rules were found broken; while the
 * client plays by the rules on the CQ side, the daemon never has more
 * than ENTRIES completions outstanding, and, while nothing but the daemon
 * writes the CQ, every completion unpacks as a Response of the length its
 * slot says; the ring's counts (ql__drings_counts) add up; and at the
 * end every handle closes (uv_loop_close succeeds) and, under the
 * sanitizers, nothing leaks.
 *
 * Built under libFuzzer by 'make fuzz' and, with replay_main.c, run over the
 * seed corpus in tests/fuzz/corpus/ring/ by 'make check'.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <uv.h>

#include "net/ring.h"
#include "wire/protocol.h"
#include "ql_ring.h"
#include "wire/route.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ENTRIES 4u
/* As handlers.c: the bytes a message carries plus room for its structure. */
#define BUDGET_SLACK ((size_t)1 << 20)
/* Writes the second thread makes per input at most. */
#define SCRIBBLES 4096
/* Operations per input at most (a long input is a long script, not a
 * slow one). */
#define MAX_OPS 512
/* Requests held by the stand-in handlers at once. */
#define HELD 8

#define CHECK(c)                                                               \
  do {                                                                         \
    if (!(c)) {                                                                \
      fprintf(stderr, "fuzz_ring: %s:%d: %s\n", __FILE__, __LINE__, #c);       \
      abort();                                                                 \
    }                                                                          \
  } while (0)

/* ------------------------------------------------------------- input */

typedef struct script {
  const uint8_t *p, *end;
} script;

static size_t left(const script *s) { return (size_t)(s->end - s->p); }

static uint8_t u8(script *s) { return s->p < s->end ? *s->p++ : 0; }

static uint16_t u16(script *s) {
  uint16_t v = u8(s);
  return (uint16_t)(v | (uint16_t)u8(s) << 8);
}

static uint32_t u32(script *s) {
  uint32_t v = u16(s);
  return v | (uint32_t)u16(s) << 16;
}

static uint64_t u64(script *s) {
  uint64_t v = u32(s);
  return v | (uint64_t)u32(s) << 32;
}

/* ------------------------------------------------------------- state */

/* One ring, as its owner (a session) sees it. */
typedef struct ring_owner {
  int ended;  /* ql__dring_end() called */
  int broken; /* the ring reported a violation */
} ring_owner;

/* A request the stand-in handlers hold, with the request id to answer. */
typedef struct held {
  void *route;
  uint64_t id;
  ring_owner *owner;
} held;

typedef struct fuzz {
  uv_loop_t loop;
  ql__drings *fps;
  uint32_t spin_us;
  ql__dring *fp;
  ring_owner *owner; /* the current ring's */
  ring_owner owners[8];
  unsigned n_owners;
  uint8_t *base; /* the client's mapping */
  size_t size;
  int bell;
  ql_ring view; /* the client's view (ql__ring_attach) */
  held held[HELD];
  unsigned n_held;
  int hold; /* the handlers hold what comes (else answer at once) */
  /* Completions posted into the current ring and released by the client;
   * cq_honest while the client moved cq_head only by the rules (and the
   * second thread never writes it). */
  uint64_t posted, released;
  uint64_t answered0; /* the rings' own answers when it was made */
  int cq_honest;
  int cq_pristine; /* only the daemon writes the CQ */
  uint64_t handed_up; /* messages the ring handed up */
} fuzz;

static fuzz F;

/* ------------------------------------------------------------- handlers */

/* A reply as ql__reply_error() makes it: request_id and a status. */
static int answer(void *route, uint64_t id, int code, const char *text,
                  ring_owner *o) {
  ql__msg_response resp;
  Qlinear__V1__Status st;
  qlinear__v1__response__init(&resp);
  qlinear__v1__status__init(&st);
  resp.request_id = id;
  resp.status = &st;
  st.code = code;
  st.message = (char *)text;
  int rc = ql__route_reply(route, &resp, NULL);
  /* A ring that ended takes no completion (QL_ESESSION); a live one
   * always does: the room was reserved when the request was taken. */
  CHECK(o->ended ? rc == QL_ESESSION : rc == 0);
  if (rc == 0 && o == F.owner)
    F.posted++;
  return rc;
}

/* What handle() does with a ring request before it reaches a handler. */
static void on_message(void *arg, void *owner, const void *buf, size_t len,
                       void *route) {
  ring_owner *o = owner;
  char err[256] = "";
  (void)arg;
  CHECK(o == F.owner && !o->ended && !o->broken);
  CHECK(len <= QL_RING_MSG_MAX && route != NULL);
  F.handed_up++;
  ql__request *req = (ql__request *)&req;
  int rc = ql__request_decode(buf, len, len + BUDGET_SLACK, &req, err,
                              sizeof err);
  CHECK(memchr(err, '\0', sizeof err) != NULL);
  uint64_t id = 0;
  if (rc != 0) {
    CHECK((rc == QL_EPROTO || rc == QL_ENOMEM) && req == NULL);
  } else {
    CHECK(req != NULL && req->msg != NULL && req->used <= req->limit);
    id = req->msg->request_id;
    if ((rc = ql__request_check_strings(buf, len, err, sizeof err)) == 0)
      rc = ql__request_validate(req->msg, err, sizeof err);
    CHECK(memchr(err, '\0', sizeof err) != NULL);
    CHECK(rc <= 0 && rc > QL_ERRNO_MIN_);
    ql__request_free(req);
  }
  if (F.hold && F.n_held < HELD) {
    F.held[F.n_held++] = (held){route, id, o};
    return;
  }
  answer(route, id, rc, rc != 0 ? err : "", o);
}

/* The ring's rules were broken: its session ends, which ends the ring
 * (from inside the ring's own drain). */
static void on_violation(void *arg, void *owner, const char *why) {
  ring_owner *o = owner;
  (void)arg;
  CHECK(why != NULL && why[0] != '\0');
  CHECK(o == F.owner && !o->ended);
  o->broken = 1;
  o->ended = 1;
  ql__dring_end(F.fp);
}

static const ql__dring_ops fuzz_ops = {on_message, on_violation};

/* A device worker's early reply: from another thread, then done() on the
 * loop's. */
typedef struct early_arg {
  void *route;
  uint64_t id;
  int rc;
} early_arg;

static void *early_thread(void *p) {
  early_arg *a = p;
  ql__msg_response resp;
  Qlinear__V1__Status st;
  qlinear__v1__response__init(&resp);
  qlinear__v1__status__init(&st);
  resp.request_id = a->id;
  resp.status = &st;
  a->rc = ql__route_early(a->route, &resp);
  return NULL;
}

/* Answers (how: 0 reply, 1 early then done, 2 drop) held request i. */
static void release_held(unsigned i, int how) {
  held h = F.held[i];
  F.held[i] = F.held[--F.n_held];
  if (how == 2) {
    ql__route_drop(h.route);
    return;
  }
  if (how == 1 && ql__route_has_early(h.route)) {
    early_arg a = {h.route, h.id, -1};
    pthread_t th;
    if (pthread_create(&th, NULL, early_thread, &a) == 0)
      pthread_join(th, NULL);
    else
      early_thread(&a);
    CHECK(a.rc == 1);
    ql__route_done(h.route, NULL);
    /* An early reply is posted even into a ring that ended meanwhile (its
     * memory stays while the route holds it): the client may still read
     * that completion. */
    if (h.owner == F.owner)
      F.posted++;
    return;
  }
  answer(h.route, h.id, 0, "", h.owner);
}

/* ------------------------------------------------------------- the ring */

/* The second thread's state. */
typedef struct scribbler {
  uint8_t *base;
  size_t size;
  int mode; /* 0: SQ messages; 1: SQ slots; 2: and the client's line;
               3: anything */
  uint64_t rng;
  atomic_int started, stop;
} scribbler;

static uint64_t next_rng(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static void poke32(uint8_t *p, uint32_t v) {
  __atomic_store_n((uint32_t *)p, v, __ATOMIC_RELAXED);
}

static void *scribble(void *arg) {
  scribbler *w = arg;
  ql_ring_hdr *h = (ql_ring_hdr *)w->base;
  const size_t sq = QL_RING_HDR_BYTES, slot = QL_RING_ENTRY_BYTES;
  atomic_store(&w->started, 1);
  for (int i = 0; i < SCRIBBLES && !atomic_load(&w->stop); i++) {
    uint64_t r = next_rng(&w->rng);
    uint32_t v = (uint32_t)(r >> 32);
    uint32_t e = (uint32_t)(r & (ENTRIES - 1));
    size_t word = (size_t)((r >> 8) & 0x3FF); /* a word of a slot */
    int what =
        w->mode == 0 ? 0 : (int)((r >> 20) % (unsigned)(w->mode * 2 + 2));
    switch (what) {
    case 0: /* a word of a message */
    case 1:
      poke32(w->base + sq + e * slot + QL_RING_ENTRY_HDR +
                 (word % (QL_RING_MSG_MAX / 4)) * 4,
             v);
      break;
    case 2: /* a length: plausible, at the bound, or anything */
      poke32(w->base + sq + e * slot + offsetof(ql_ring_entry, len),
             v % 3 == 0   ? v >> 20
             : v % 3 == 1 ? QL_RING_MSG_MAX - 8 + (v >> 8) % 17
                          : v);
      break;
    case 3: /* the tag */
      poke32(w->base + sq + e * slot + (v & 4), v);
      break;
    case 4: /* sq_tail: anything, or near what the daemon published */
      poke32((uint8_t *)&h->sq_tail,
             v & 1 ? v
                   : atomic_load(&h->sq_head) + (v >> 1) % (ENTRIES + 2));
      break;
    case 5: /* cq_head, likewise */
      poke32((uint8_t *)&h->cq_head,
             v & 1 ? v
                   : atomic_load(&h->cq_tail) - (v >> 1) % (ENTRIES + 2));
      break;
    default: /* anywhere, the constants, the daemon's line and the CQ too */
      poke32(w->base + ((size_t)v % (w->size / 4)) * 4, (uint32_t)r);
      break;
    }
    if ((i & 63) == 63)
      sched_yield();
  }
  return NULL;
}

/* The daemon turns the loop once (what it does between two polls). */
static void run_once(void) { uv_run(&F.loop, UV_RUN_NOWAIT); }

/* The client rings the doorbell, and the daemon's loop turns. */
static void ring_bell(void) {
  uint64_t one = 1;
  while (write(F.bell, &one, sizeof one) < 0 && errno == EINTR)
    ;
  run_once();
}

/* While the client plays by the rules, the daemon never has more
 * completions outstanding than slots: it overwrites nothing the client
 * has not consumed. */
static void check_room(void) {
  ql__dring_counts c = {0};
  ql__drings_counts(F.fps, &c);
  /* What the ring answered itself (a slot it could not read) is posted
   * into it too. */
  uint64_t posted = F.posted + (c.answered - F.answered0);
  if (F.cq_honest)
    CHECK(F.released <= posted && posted - F.released <= ENTRIES);
}

/* A new ring for a new owner (the previous one ended first), at its
 * counters' start: ql__dring_create starts them at 0, so the client
 * moves them on by the rules to reach the 32-bit wrap cheaply. */
static void make_ring(void) {
  char err[256];
  int ring_fd = -1, bell_fd = -1;
  CHECK(F.n_owners < sizeof F.owners / sizeof F.owners[0]);
  F.owner = &F.owners[F.n_owners++];
  memset(F.owner, 0, sizeof *F.owner);
  int rc = ql__dring_create(F.fps, F.owner, F.n_owners, ENTRIES, &F.fp,
                               &ring_fd, &bell_fd, err, sizeof err);
  CHECK(rc == 0);
  F.size = ql__ring_size(ENTRIES);
  F.base = mmap(NULL, F.size, PROT_READ | PROT_WRITE, MAP_SHARED, ring_fd, 0);
  CHECK(F.base != MAP_FAILED);
  close(ring_fd);
  F.bell = bell_fd;
  CHECK(ql__ring_attach(F.base, F.size, &F.view) == 0);
  F.posted = F.released = 0;
  ql__dring_counts c = {0};
  ql__drings_counts(F.fps, &c);
  F.answered0 = c.answered;
}

/* The ring's session ends: the ring is ended, the client unmaps it. */
static void end_ring(void) {
  if (!F.owner->ended) {
    F.owner->ended = 1;
    ql__dring_end(F.fp);
  }
  munmap(F.base, F.size);
  close(F.bell);
  F.base = NULL;
  run_once(); /* the poll handle's close */
}

/* The client: completions from its cq_head. While only the daemon wrote
 * the CQ, every slot holds zeros or the last Response the daemon packed
 * there (it writes a slot before it publishes it), so each one read must
 * unpack, whatever cq_head the client made up. */
static void consume(script *s) {
  ql_ring_hdr *h = F.view.hdr;
  uint32_t head = atomic_load(&h->cq_head), n = 0;
  if (ql__ring_cq_avail(&F.view, head, &n) != 0) {
    CHECK(n == 0);
    return;
  }
  CHECK(n <= ENTRIES);
  uint32_t k = u8(s); /* how many: all of them from n up */
  if (k > n)
    k = n;
  for (uint32_t i = 0; i < k; i++) {
    const ql_ring_entry *e = &F.view.cq[(head + i) & (ENTRIES - 1)];
    if (F.cq_pristine) {
      CHECK(e->len <= QL_RING_MSG_MAX && e->flags == 0);
      ql__msg_response *r =
          qlinear__v1__response__unpack(NULL, e->len, e->msg);
      CHECK(r != NULL);
      qlinear__v1__response__free_unpacked(r, NULL);
    }
  }
  ql__ring_cq_release(&F.view, head + k);
  F.released += k;
}

/* The client's well-formed submission: a slot at its sq_tail, then
 * ql__ring_sq_publish(). */
static void submit(script *s) {
  ql_ring_hdr *h = F.view.hdr;
  uint32_t tail = atomic_load(&h->sq_tail);
  ql_ring_entry *e = &F.view.sq[tail & (ENTRIES - 1)];
  uint64_t tag = u8(s);
  size_t n = u16(s) % (QL_RING_MSG_MAX + 1);
  if (n > left(s))
    n = left(s);
  e->tag = tag;
  e->len = (uint32_t)n;
  e->flags = 0;
  memcpy(e->msg, s->p, n);
  s->p += n;
  ql__ring_sq_publish(&F.view, tail);
}

enum {
  OP_SQ_TAIL,      /* u32 */
  OP_SQ_TAIL_NEAR, /* i8 from the daemon's published sq_head */
  OP_CQ_HEAD,      /* u32 */
  OP_CQ_HEAD_NEAR, /* i8 from the daemon's published cq_tail */
  OP_WAITERS,      /* u32 */
  OP_FLAGS,        /* u32 idle, u32 blocked */
  OP_SLOT,         /* u8 slot, u64 tag, u16 len, min(len, left) bytes */
  OP_SLOT_LEN,     /* u8 slot, u8 kind: odd, u32 len follows; even,
                      QL_RING_MSG_MAX - 8 + kind / 2 % 17 */
  OP_POKE_HDR,     /* u16 offset, u8 count (< 16), count bytes */
  OP_DAEMON_LINE,  /* u32 sq_head, u32 cq_tail: the daemon's, rewritten */
  OP_SUBMIT,       /* u8 tag, u16 len, bytes */
  OP_BELL,         /* the doorbell, and a turn of the loop */
  OP_RUN,          /* a turn of the loop alone (a hot ring is polled) */
  OP_HOLD,         /* u8: odd, the handlers hold what comes */
  OP_ANSWER,       /* u8 which held, u8 how (reply, early, drop) */
  OP_CONSUME,      /* u8 how many (at most what is there) */
  OP_RESTART,      /* u8 spin: the ring ends, a new one is made */
  OP_COUNT_
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  script s = {data, data + size};
  memset(&F, 0, sizeof F);
  CHECK(uv_loop_init(&F.loop) == 0);
  uint8_t first = u8(&s);
  /* Mostly no spinning (each turn is the script's), sometimes a hot ring
   * that the spin handle keeps polling. */
  F.spin_us = first & 4 ? 1000000 : 0;
  CHECK(ql__drings_open(&F.loop, &F.spin_us, &fuzz_ops, NULL, &F.fps) ==
        0);
  make_ring();
  F.cq_pristine = 1;
  F.cq_honest = 1;

  scribbler w = {.base = F.base, .size = F.size, .mode = first & 3,
                 .rng = first * 0x100000001b3ull ^ size};
  atomic_init(&w.started, 0);
  atomic_init(&w.stop, 0);
  if (w.mode == 3)
    F.cq_pristine = 0;
  if (w.mode >= 2)
    F.cq_honest = 0;
  pthread_t th;
  int threaded = pthread_create(&th, NULL, scribble, &w) == 0;
  /* The script runs while the thread writes, not before it starts. */
  while (threaded && !atomic_load(&w.started))
    sched_yield();

  for (int ops = 0; ops < MAX_OPS && left(&s) > 0; ops++) {
    ql_ring_hdr *h = F.view.hdr;
    uint8_t op = u8(&s) % OP_COUNT_;
    switch (op) {
    case OP_SQ_TAIL:
      atomic_store(&h->sq_tail, u32(&s));
      break;
    case OP_SQ_TAIL_NEAR:
      atomic_store(&h->sq_tail,
                   atomic_load(&h->sq_head) + (uint32_t)(int8_t)u8(&s));
      break;
    case OP_CQ_HEAD:
      atomic_store(&h->cq_head, u32(&s));
      F.cq_honest = 0;
      break;
    case OP_CQ_HEAD_NEAR:
      atomic_store(&h->cq_head,
                   atomic_load(&h->cq_tail) + (uint32_t)(int8_t)u8(&s));
      F.cq_honest = 0;
      break;
    case OP_WAITERS:
      atomic_store(&h->waiters, u32(&s));
      break;
    case OP_FLAGS:
      atomic_store(&h->idle, u32(&s));
      atomic_store(&h->blocked, u32(&s));
      break;
    case OP_SLOT: {
      ql_ring_entry *e = &F.view.sq[u8(&s) & (ENTRIES - 1)];
      e->tag = u64(&s);
      uint16_t n = u16(&s);
      e->len = n;
      size_t k = n < left(&s) ? n : left(&s);
      if (k > QL_RING_MSG_MAX)
        k = QL_RING_MSG_MAX;
      memcpy(e->msg, s.p, k);
      s.p += k;
      break;
    }
    case OP_SLOT_LEN: {
      ql_ring_entry *e = &F.view.sq[u8(&s) & (ENTRIES - 1)];
      uint8_t kind = u8(&s);
      e->len = kind & 1 ? u32(&s) : QL_RING_MSG_MAX - 8 + (kind >> 1) % 17;
      break;
    }
    case OP_POKE_HDR: {
      size_t off = u16(&s) % QL_RING_HDR_BYTES;
      size_t n = u8(&s) % 16;
      for (size_t i = 0; i < n && off + i < QL_RING_HDR_BYTES; i++)
        F.base[off + i] = u8(&s);
      F.cq_honest = 0; /* cq_head may be among them */
      break;
    }
    case OP_DAEMON_LINE:
      /* The daemon publishes these and never reads them back; the
       * client, reading a cq_tail made up, may take completions that
       * were never posted. */
      atomic_store(&h->sq_head, u32(&s));
      atomic_store(&h->cq_tail, u32(&s));
      F.cq_honest = 0;
      break;
    case OP_SUBMIT:
      submit(&s);
      break;
    case OP_BELL:
      ring_bell();
      break;
    case OP_RUN:
      run_once();
      break;
    case OP_HOLD:
      F.hold = u8(&s) & 1;
      break;
    case OP_ANSWER: {
      uint8_t which = u8(&s), how = u8(&s);
      if (F.n_held > 0)
        release_held(which % F.n_held, how % 3);
      break;
    }
    case OP_CONSUME:
      consume(&s);
      break;
    case OP_RESTART: {
      uint8_t spin = u8(&s);
      /* A few rings per input (held requests keep pointers to their
       * owners). */
      if (F.n_owners >= sizeof F.owners / sizeof F.owners[0])
        break;
      /* The old mapping goes: the second thread moves to the new one. */
      atomic_store(&w.stop, 1);
      if (threaded)
        pthread_join(th, NULL);
      end_ring();
      F.spin_us = spin & 1 ? 1000000 : 0;
      make_ring();
      F.cq_honest = w.mode < 2;
      F.cq_pristine = w.mode != 3;
      w.base = F.base;
      atomic_store(&w.started, 0);
      atomic_store(&w.stop, 0);
      threaded = pthread_create(&th, NULL, scribble, &w) == 0;
      while (threaded && !atomic_load(&w.started))
        sched_yield();
      break;
    }
    }
    check_room();
  }
  /* Whatever the script left: the client rings once more, every held
   * request is answered, and the client takes its completions. */
  ring_bell();
  while (F.n_held > 0)
    release_held(0, 0);
  check_room();

  atomic_store(&w.stop, 1);
  if (threaded)
    pthread_join(th, NULL);

  ql__dring_counts c = {0};
  ql__drings_counts(F.fps, &c);
  /* Every request taken was handed up or answered by the ring itself. */
  CHECK(c.taken == F.handed_up + c.answered);
  CHECK(c.answered == 0 || c.bytes_out > 0);

  end_ring();
  ql__drings_close(F.fps);
  uv_run(&F.loop, UV_RUN_DEFAULT);
  /* Every handle of the rings closed: nothing is left on the loop. */
  CHECK(uv_loop_close(&F.loop) == 0);
  return 0;
}
