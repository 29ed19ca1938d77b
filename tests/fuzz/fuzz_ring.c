/*
 * fuzz_ring.c - libFuzzer target for the daemon's reader of a ring that a
 * hostile client writes (DESIGN §7, proto/ql_ring.h, daemon/fastpath.c).
 *
 * Each input formats a ring of ENTRIES slots in a heap buffer (so that ASan
 * sees any access outside it) and is read as a script of operations:
 *
 *  - the client's writes, arbitrary or near the indices the daemon
 *    publishes: sq_tail, cq_head, waiters, the flags, an SQ slot's tag,
 *    length and bytes, any bytes of the header page (its constants too),
 *    the daemon's own line, a well-formed submission through
 *    ql__ring_sq_publish() and a consumption of completions through
 *    ql__ring_cq_avail() and ql__ring_cq_release();
 *  - the daemon's steps, exactly as drain() takes a request: sq_avail
 *    (EPROTO ends the session), cq_room (likewise), the room check,
 *    sq_copy into a private QL_RING_MSG_MAX buffer, sq_release, then the
 *    copy through ql__request_decode() with handlers.c's budget,
 *    ql__request_check_strings() and ql__request_validate(), and a small
 *    packed Response posted into the CQ with ql__ring_cq_publish() (the
 *    fallback for a reply too large as post() has it); the arm before
 *    sleeping as on_spin() does it; and a restart (a new session's ring,
 *    its counters started anywhere, to reach the 32-bit wrap).
 *
 * Meanwhile a second thread keeps rewriting the mapping: from the SQ's
 * message bytes only up to anything in it, headers and CQ included, as
 * the first byte of the input picks. It is bounded (a fixed number of
 * writes) and joined at the end of the input.
 *
 * Invariants (abort() on a violation, so that libFuzzer reports it): a
 * copy is never longer than QL_RING_MSG_MAX; each take moves the daemon's
 * private head and tail by exactly one and never past what sq_avail
 * reported; the daemon's view of the CQ never holds more than ENTRIES
 * unconsumed completions; the index checks answer what unsigned
 * arithmetic says they must; the daemon's geometry never changes whatever
 * the mapping says; and, while nothing but the daemon writes the CQ, every
 * completion unpacks as a Response of the length its slot says.
 *
 * Built under libFuzzer by 'make fuzz' and, with replay_main.c, run over the
 * seed corpus in tests/fuzz/corpus/ring/ by 'make check'.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol.h"
#include "ql_ring.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ENTRIES 4u
/* As fastpath.c: requests taken per drain. */
#define BURST 32
/* As handlers.c: the bytes a message carries plus room for its structure. */
#define BUDGET_SLACK ((size_t)1 << 20)
/* Writes the second thread makes per input at most. */
#define SCRIBBLES 4096
/* Operations per input at most (a long input is a long script, not a
 * slow one). */
#define MAX_OPS 512

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

/* ------------------------------------------------------------- the ring */

/* The daemon's side: what struct ql__fastpath keeps privately. */
typedef struct reader {
  ql_ring ring; /* from ql__ring_format: never read back from the mapping */
  uint8_t *base;
  int dead;
  uint32_t sq_head, cq_tail, consumed, in_flight;
  int want_room;
  uint8_t buf[QL_RING_MSG_MAX];
} reader;

/* The second thread's state. */
typedef struct scribbler {
  uint8_t *base;
  size_t size;
  int mode; /* 0: SQ messages; 1: SQ slots; 2: and the client's line;
               3: anything */
  uint64_t rng;
  atomic_int started, stop;
} scribbler;

/* Whether only the daemon writes the CQ (the script never does, nor the
 * second thread but in mode 3): the completions are then checked. */
static int cq_pristine;

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

/* The daemon's geometry is its own: nothing written to the mapping
 * changes it. */
static void check_view(const reader *d) {
  CHECK(d->ring.entries == ENTRIES);
  CHECK((uint8_t *)d->ring.hdr == d->base);
  CHECK((uint8_t *)d->ring.sq == d->base + QL_RING_HDR_BYTES);
  CHECK((uint8_t *)d->ring.cq ==
        d->base + QL_RING_HDR_BYTES + ENTRIES * QL_RING_ENTRY_BYTES);
  CHECK(d->ring.size == ql__ring_size(ENTRIES));
  /* Never more completions outstanding than slots, whatever the client
   * did: the daemon overwrites nothing the client has not consumed. */
  CHECK(d->cq_tail - d->consumed <= ENTRIES);
}

/* post(): packs resp into the next CQ slot, the fallback for a reply too
 * large for a slot included, and publishes it. */
static void post(reader *d, uint64_t tag, const ql__msg_response *resp) {
  size_t len = qlinear__v1__response__get_packed_size(resp);
  ql__msg_response small;
  Qlinear__V1__Status st;
  if (len > QL_RING_MSG_MAX) {
    qlinear__v1__response__init(&small);
    qlinear__v1__status__init(&st);
    small.request_id = resp->request_id;
    small.status = &st;
    st.code = QL_ETOOBIG;
    st.message = "the reply does not fit a ring slot";
    resp = &small;
    len = qlinear__v1__response__get_packed_size(resp);
  }
  CHECK(len <= QL_RING_MSG_MAX);
  uint8_t *msg = ql__ring_cq_msg(&d->ring, d->cq_tail);
  CHECK(msg >= d->base + QL_RING_HDR_BYTES + ENTRIES * QL_RING_ENTRY_BYTES);
  CHECK(msg + QL_RING_MSG_MAX <= d->base + d->ring.size);
  CHECK(qlinear__v1__response__pack(resp, msg) == len);
  if (ql__ring_cq_publish(&d->ring, d->cq_tail, tag, (uint32_t)len))
    ql__ring_wake(&d->ring);
  d->cq_tail++;
}

/* A reply as ql__reply_error() makes it: request_id and a status. */
static void reply(reader *d, uint64_t tag, uint64_t id, int code,
                  const char *text) {
  ql__msg_response resp;
  Qlinear__V1__Status st;
  qlinear__v1__response__init(&resp);
  qlinear__v1__status__init(&st);
  resp.request_id = id;
  resp.status = &st;
  st.code = code;
  st.message = (char *)text;
  post(d, tag, &resp);
}

/* What handle() does with a ring request before it reaches a handler. */
static void handle(reader *d, uint64_t tag, size_t len) {
  char err[256] = "";
  ql__request *req = (ql__request *)&req;
  int rc = ql__request_decode(d->buf, len, len + BUDGET_SLACK, &req, err,
                              sizeof err);
  CHECK(memchr(err, '\0', sizeof err) != NULL);
  if (rc != 0) {
    CHECK((rc == QL_EPROTO || rc == QL_ENOMEM) && req == NULL);
    reply(d, tag, 0, rc, err);
    return;
  }
  CHECK(req != NULL && req->msg != NULL && req->used <= req->limit);
  uint64_t id = req->msg->request_id;
  if ((rc = ql__request_check_strings(d->buf, len, err, sizeof err)) == 0)
    rc = ql__request_validate(req->msg, err, sizeof err);
  CHECK(memchr(err, '\0', sizeof err) != NULL);
  CHECK(rc <= 0 && rc > QL_ERRNO_MIN_);
  ql__request_free(req);
  reply(d, tag, id, rc, rc != 0 ? err : "");
}

/*
 * One turn of drain()'s loop. Returns 1 when a request was taken, 0 when
 * there was none or no room, -1 when the ring broke its rules (the
 * session ends: the reader is dead until a restart).
 */
static int take(reader *d) {
  uint32_t avail = 0xDEAD, room = 0xDEAD;
  if (d->dead)
    return -1;
  int rc = ql__ring_sq_avail(&d->ring, d->sq_head, &avail);
  if (rc != 0) {
    CHECK(rc == QL_EPROTO && avail == 0);
    d->dead = 1;
    return -1;
  }
  CHECK(avail <= ENTRIES);
  if (avail == 0)
    return 0;
  uint32_t consumed = d->consumed;
  rc = ql__ring_cq_room(&d->ring, d->cq_tail, &d->consumed, &room);
  if (rc != 0) {
    CHECK(rc == QL_EPROTO && d->consumed == consumed && room == 0);
    d->dead = 1;
    return -1;
  }
  /* Accepted: forward from what was accepted before, not past tail. */
  CHECK(d->consumed - consumed <= d->cq_tail - consumed);
  CHECK(room == ENTRIES - (d->cq_tail - d->consumed));
  CHECK(room <= ENTRIES);
  if (d->in_flight >= room) {
    d->want_room = 1;
    return 0;
  }
  d->want_room = 0;
  uint32_t head0 = d->sq_head, tail0 = d->cq_tail;
  uint64_t tag = 0;
  size_t len = (size_t)-1;
  rc = ql__ring_sq_copy(&d->ring, d->sq_head, &tag, d->buf, &len);
  CHECK(len <= QL_RING_MSG_MAX);
  CHECK(rc == 0 || (rc == QL_ETOOBIG && len == 0));
  ql__ring_sq_release(&d->ring, ++d->sq_head);
  d->in_flight++;
  if (rc != 0)
    reply(d, tag, 0, rc,
          "the ring slot claims more bytes than a slot holds");
  else
    handle(d, tag, len);
  d->in_flight--; /* answered at once: no handler runs later */
  CHECK(d->sq_head - head0 == 1 && d->sq_head - head0 <= avail);
  CHECK(d->cq_tail - tail0 == 1);
  check_view(d);
  return 1;
}

/* drain(): up to BURST requests. */
static void drain(reader *d) {
  uint32_t head0 = d->sq_head;
  int taken = 0;
  while (taken < BURST && take(d) == 1)
    taken++;
  CHECK(d->sq_head - head0 == (uint32_t)taken);
}

/* on_spin()'s arm before the reader sleeps. With nothing but the script
 * writing the header (modes 0 and 1), its answer is checked. */
static void arm(reader *d, int mode) {
  if (d->dead)
    return;
  ql_ring_hdr *h = d->ring.hdr;
  _Atomic uint32_t *flag = d->want_room ? &h->blocked : &h->idle;
  uint32_t seen = d->want_room ? atomic_load(&h->cq_head)
                               : atomic_load(&h->sq_tail);
  int moved = ql__ring_arm(&d->ring, flag, d->sq_head, d->consumed);
  CHECK(moved == 0 || moved == 1);
  if (mode <= 1) {
    CHECK(moved == (seen != (d->want_room ? d->consumed : d->sq_head)));
    CHECK(atomic_load(flag) == (uint32_t)!moved);
  }
}

/* A new session's ring, its counters at start (as if it had run a long
 * time: so the wrap of the 32-bit counters is reached). */
static void restart(reader *d, uint32_t start) {
  memset(d->base, 0, d->ring.size ? d->ring.size : ql__ring_size(ENTRIES));
  ql__ring_format(d->base, ENTRIES, &d->ring);
  ql_ring_hdr *h = d->ring.hdr;
  atomic_store(&h->sq_tail, start);
  atomic_store(&h->cq_head, start);
  atomic_store(&h->sq_head, start);
  atomic_store(&h->cq_tail, start);
  atomic_store(&h->idle, 1); /* as ql__fastpath_create leaves it */
  d->dead = 0;
  d->sq_head = d->cq_tail = d->consumed = start;
  d->in_flight = 0;
  d->want_room = 0;
  cq_pristine = 1;
  check_view(d);
}

/* The client: completions from its cq_head. While only the daemon wrote
 * the CQ, every slot holds zeros or the last Response the daemon packed
 * there (it writes a slot before it publishes it), so each one read must
 * unpack, whatever cq_head the client made up. */
static void consume(reader *d, script *s) {
  ql_ring_hdr *h = d->ring.hdr;
  uint32_t head = atomic_load(&h->cq_head), n = 0;
  if (ql__ring_cq_avail(&d->ring, head, &n) != 0) {
    CHECK(n == 0);
    return;
  }
  CHECK(n <= ENTRIES);
  uint32_t k = u8(s); /* how many: all of them from n up */
  if (k > n)
    k = n;
  for (uint32_t i = 0; i < k; i++) {
    const ql_ring_entry *e = &d->ring.cq[(head + i) & (ENTRIES - 1)];
    if (cq_pristine) {
      CHECK(e->len <= QL_RING_MSG_MAX && e->flags == 0);
      ql__msg_response *r =
          qlinear__v1__response__unpack(NULL, e->len, e->msg);
      CHECK(r != NULL);
      qlinear__v1__response__free_unpacked(r, NULL);
    }
  }
  ql__ring_cq_release(&d->ring, head + k);
}

/* The client's well-formed submission: a slot at its sq_tail, then
 * ql__ring_sq_publish(). */
static void submit(reader *d, script *s) {
  ql_ring_hdr *h = d->ring.hdr;
  uint32_t tail = atomic_load(&h->sq_tail);
  ql_ring_entry *e = &d->ring.sq[tail & (ENTRIES - 1)];
  uint64_t tag = u8(s);
  size_t n = u16(s) % (QL_RING_MSG_MAX + 1);
  if (n > left(s))
    n = left(s);
  e->tag = tag;
  e->len = (uint32_t)n;
  e->flags = 0;
  memcpy(e->msg, s->p, n);
  s->p += n;
  ql__ring_sq_publish(&d->ring, tail);
}

enum {
  OP_SQ_TAIL,      /* u32 */
  OP_SQ_TAIL_NEAR, /* i8 from the daemon's published sq_head */
  OP_CQ_HEAD,      /* u32 */
  OP_CQ_HEAD_NEAR, /* u8: in range when < 0x80, else i8 off consumed */
  OP_WAITERS,      /* u32 */
  OP_FLAGS,        /* u32 idle, u32 blocked */
  OP_SLOT,         /* u8 slot, u64 tag, u16 len, min(len, left) bytes */
  OP_SLOT_LEN,     /* u8 slot, u8 kind: odd, u32 len follows; even,
                      QL_RING_MSG_MAX - 8 + kind / 2 % 17 */
  OP_POKE_HDR,     /* u16 offset, u8 count (< 16), count bytes */
  OP_DAEMON_LINE,  /* u32 sq_head, u32 cq_tail: the daemon's, rewritten */
  OP_SUBMIT,       /* u8 tag, u16 len, bytes */
  OP_TAKE,
  OP_DRAIN,
  OP_ARM,
  OP_CONSUME,      /* u8 how many (at most what is there) */
  OP_RESTART,      /* u32 start */
  OP_COUNT_
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  script s = {data, data + size};
  size_t bytes = ql__ring_size(ENTRIES);
  static reader d;
  memset(&d, 0, sizeof d);
  d.base = aligned_alloc(QL_RING_HDR_BYTES, bytes);
  CHECK(d.base != NULL);
  restart(&d, 0);

  uint8_t first = u8(&s);
  scribbler w = {.base = d.base, .size = bytes, .mode = first & 3,
                 .rng = first * 0x100000001b3ull ^ size};
  atomic_init(&w.started, 0);
  atomic_init(&w.stop, 0);
  pthread_t th;
  int threaded = pthread_create(&th, NULL, scribble, &w) == 0;
  /* The script runs while the thread writes, not before it starts. */
  while (threaded && !atomic_load(&w.started))
    sched_yield();
  if (w.mode == 3)
    cq_pristine = 0;

  ql_ring_hdr *h = d.ring.hdr;
  for (int ops = 0; ops < MAX_OPS && left(&s) > 0; ops++) {
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
      break;
    case OP_CQ_HEAD_NEAR: {
      uint8_t v = u8(&s);
      uint32_t out = d.cq_tail - d.consumed;
      atomic_store(&h->cq_head, v < 0x80 ? d.consumed + v % (out + 1)
                                         : d.consumed + (uint32_t)(int8_t)v);
      break;
    }
    case OP_WAITERS:
      atomic_store(&h->waiters, u32(&s));
      break;
    case OP_FLAGS:
      atomic_store(&h->idle, u32(&s));
      atomic_store(&h->blocked, u32(&s));
      break;
    case OP_SLOT: {
      ql_ring_entry *e = &d.ring.sq[u8(&s) & (ENTRIES - 1)];
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
      ql_ring_entry *e = &d.ring.sq[u8(&s) & (ENTRIES - 1)];
      uint8_t kind = u8(&s);
      e->len = kind & 1 ? u32(&s) : QL_RING_MSG_MAX - 8 + (kind >> 1) % 17;
      break;
    }
    case OP_POKE_HDR: {
      size_t off = u16(&s) % QL_RING_HDR_BYTES;
      size_t n = u8(&s) % 16;
      for (size_t i = 0; i < n && off + i < QL_RING_HDR_BYTES; i++)
        d.base[off + i] = u8(&s);
      break;
    }
    case OP_DAEMON_LINE:
      atomic_store(&h->sq_head, u32(&s));
      atomic_store(&h->cq_tail, u32(&s));
      /* The daemon publishes these and never reads them back: its own
       * counters go on (check_view). */
      break;
    case OP_SUBMIT:
      submit(&d, &s);
      break;
    case OP_TAKE:
      take(&d);
      break;
    case OP_DRAIN:
      drain(&d);
      break;
    case OP_ARM:
      arm(&d, w.mode);
      break;
    case OP_CONSUME:
      consume(&d, &s);
      break;
    case OP_RESTART:
      restart(&d, u32(&s));
      if (w.mode == 3)
        cq_pristine = 0;
      break;
    }
    check_view(&d);
  }
  /* Whatever the script left, the reader takes what it can. */
  drain(&d);
  check_view(&d);

  atomic_store(&w.stop, 1);
  if (threaded)
    pthread_join(th, NULL);
  free(d.base);
  return 0;
}
