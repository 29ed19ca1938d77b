/*
 * ql_ring.h - the fast path's shared-memory ring (DESIGN §7).
 *
 * A session may ask the daemon for a ring: one sealed memfd that both
 * processes map, holding a submission queue (SQ, the client's requests)
 * and a completion queue (CQ, the daemon's replies), each of `entries`
 * slots of QL_RING_ENTRY_BYTES. A slot carries one packed protobuf message,
 * the same bytes the message path carries: a Request (Linear or
 * LinearMulti, tensors in the session's regions or device memory) in the
 * SQ, its Response in the CQ. Only the transport differs.
 *
 *   page 0          ql_ring_hdr: constants, then one cache line the
 *                   client writes and one the daemon writes
 *   SQ              entries x QL_RING_ENTRY_BYTES at sq_offset
 *   CQ              entries x QL_RING_ENTRY_BYTES at cq_offset
 *
 * Indices are free-running 32-bit counters; slot i of a queue is
 * i & (entries - 1). Each side keeps its own consumer index privately and
 * only publishes it; it reads the other side's producer index once per
 * pass and checks it (tail - head <= entries, in unsigned arithmetic)
 * before using it. The daemon trusts nothing in the mapping: it never reads
 * the constants back (it keeps its own copy), copies a slot out with single
 * loads before it looks at the copy, and treats a producer index out of
 * range as the end of the session.
 *
 * Waking: each side spins briefly, then sleeps.
 *  - The daemon sleeps in its event loop on an eventfd (the doorbell). It
 *    sets `idle` before it sleeps and then looks at the SQ once more; a
 *    client that publishes a request and then finds `idle` set clears it
 *    and writes the doorbell. `blocked` is the same for a daemon that
 *    stopped taking requests because the CQ has no room for their replies:
 *    a client that frees CQ slots and finds it set rings.
 *  - Client threads sleep on a shared (not PRIVATE) futex on cq_tail,
 *    counted in `waiters`; the daemon wakes them after publishing a
 *    completion when the count is not zero.
 * Every flag is written and read with sequentially consistent atomics on
 * both sides of the publish, so that one of the two always sees the other
 * (the store-buffer pattern).
 *
 * This header is shared by the daemon and libqlinear and is not installed.
 */
#ifndef QL_RING_H
#define QL_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define QL_RING_MAGIC 0x31524c51u /* "QLR1" little-endian */
#define QL_RING_VERSION 1u
#define QL_RING_ENTRY_BYTES 4096u
#define QL_RING_ENTRY_HDR 16u
/* The largest message a slot carries. */
#define QL_RING_MSG_MAX (QL_RING_ENTRY_BYTES - QL_RING_ENTRY_HDR)
#define QL_RING_MIN_ENTRIES 2u
#define QL_RING_MAX_ENTRIES 256u
#define QL_RING_DEFAULT_ENTRIES 64u
#define QL_RING_HDR_BYTES 4096u

/* Page 0 of the mapping. */
typedef struct ql_ring_hdr {
  /* Written by the daemon before it passes the descriptor; constant. */
  uint32_t magic;       /* QL_RING_MAGIC */
  uint32_t version;     /* QL_RING_VERSION */
  uint32_t entries;     /* slots of each queue: a power of two */
  uint32_t entry_bytes; /* QL_RING_ENTRY_BYTES */
  uint64_t size;        /* of the whole mapping */
  uint64_t sq_offset;   /* from the start of the mapping */
  uint64_t cq_offset;
  uint8_t pad0[64 - 40];
  /* Written by the client. */
  _Atomic uint32_t sq_tail; /* requests published */
  _Atomic uint32_t cq_head; /* completions consumed */
  _Atomic uint32_t waiters; /* client threads asleep on cq_tail */
  uint8_t pad1[64 - 12];
  /* Written by the daemon (the client only clears the two flags). */
  _Atomic uint32_t sq_head; /* requests taken: their slots are free */
  _Atomic uint32_t cq_tail; /* completions published; the futex word */
  _Atomic uint32_t idle;    /* 1: the daemon sleeps; ring after posting */
  _Atomic uint32_t blocked; /* 1: the daemon waits for CQ room; ring after
                               consuming */
  _Atomic uint32_t spin_hint; /* 1: the device running the latest request
                                 leaves CPUs free, so a client may spin
                                 while it waits; 0: it uses them all
                                 (the CPU device): sleep instead */
  uint8_t pad2[64 - 20];
} ql_ring_hdr;

/* One slot. */
typedef struct ql_ring_entry {
  uint64_t tag;   /* SQ: the client's; CQ: the tag of the request answered */
  uint32_t len;   /* bytes of msg used, <= QL_RING_MSG_MAX */
  uint32_t flags; /* 0; reserved */
  uint8_t msg[QL_RING_MSG_MAX];
} ql_ring_entry;

/* A process's view of a mapped ring; plain values, private to it. */
typedef struct ql_ring {
  ql_ring_hdr *hdr;
  ql_ring_entry *sq, *cq;
  uint32_t entries; /* the daemon's own copy, or checked by ql__ring_attach */
  size_t size;
} ql_ring;

/* Bytes of a ring of entries slots per queue; 0 unless entries is a power
 * of two in [QL_RING_MIN_ENTRIES, QL_RING_MAX_ENTRIES]. */
size_t ql__ring_size(uint32_t entries);

/* Daemon: writes the header of a fresh zero-filled mapping of
 * ql__ring_size(entries) bytes and fills r from its own values. */
void ql__ring_format(void *mem, uint32_t entries, ql_ring *r);

/* Client: checks the header of a mapping of size bytes (magic, version,
 * geometry consistent with size) and fills r. QL_EPROTO if it is not a
 * ring this code speaks. */
int ql__ring_attach(void *mem, size_t size, ql_ring *r);

/* ------------------------------------------------------------ daemon side */

/*
 * Requests published past head (the daemon's private consumer index):
 * *avail = sq_tail - head. QL_EPROTO if the client's sq_tail is not within
 * entries of head (a broken or hostile client).
 */
int ql__ring_sq_avail(const ql_ring *r, uint32_t head, uint32_t *avail);

/*
 * Copies SQ slot head out: *tag and len bytes into buf (QL_RING_MSG_MAX
 * bytes of room). Each field is loaded once; the client may rewrite the
 * slot meanwhile, which changes only what this copy holds. QL_ETOOBIG
 * (with *tag set) if the slot claims more than QL_RING_MSG_MAX bytes.
 */
int ql__ring_sq_copy(const ql_ring *r, uint32_t head, uint64_t *tag,
                     void *buf, size_t *len);

/* Publishes the daemon's consumer index (the slots before it are free). */
void ql__ring_sq_release(const ql_ring *r, uint32_t head);

/*
 * Free CQ slots: entries - (tail - consumed), where tail is the daemon's
 * producer index and *consumed the last cq_head it accepted, updated here.
 * The client's cq_head must lie in [*consumed, tail]; QL_EPROTO otherwise
 * (*consumed unchanged).
 */
int ql__ring_cq_room(const ql_ring *r, uint32_t tail, uint32_t *consumed,
                     uint32_t *room);

/* The message area of CQ slot tail, QL_RING_MSG_MAX bytes. */
uint8_t *ql__ring_cq_msg(const ql_ring *r, uint32_t tail);

/*
 * Writes the slot's tag and length and publishes tail + 1. Returns 1 when
 * client threads sleep on cq_tail (call ql__ring_wake), else 0.
 */
int ql__ring_cq_publish(const ql_ring *r, uint32_t tail, uint64_t tag,
                        uint32_t len);

/* Wakes every thread asleep on cq_tail (FUTEX_WAKE, shared). */
void ql__ring_wake(const ql_ring *r);

/*
 * Before the daemon sleeps: sets flag (&hdr->idle or &hdr->blocked) and
 * returns 1 if the client published something since (sq_tail != head for
 * idle; cq_head != consumed for blocked), in which case the flag is
 * cleared again and the daemon must not sleep.
 */
int ql__ring_arm(const ql_ring *r, _Atomic uint32_t *flag, uint32_t head,
                 uint32_t consumed);

/* ------------------------------------------------------------ client side */

/*
 * Publishes SQ slot tail (its tag, len and message already written) as
 * tail + 1. Returns 1 when the daemon sleeps and the doorbell must be
 * written (the flag was cleared here, so one publisher rings), else 0.
 */
int ql__ring_sq_publish(const ql_ring *r, uint32_t tail);

/* Completions the daemon published past the client's head; QL_EPROTO if
 * cq_tail is out of range. */
int ql__ring_cq_avail(const ql_ring *r, uint32_t head, uint32_t *avail);

/* Publishes the client's CQ consumer index. Returns 1 when the daemon
 * waits for room and the doorbell must be written, else 0. */
int ql__ring_cq_release(const ql_ring *r, uint32_t head);

/*
 * Sleeps until cq_tail differs from seen or timeout_ns passes (a spurious
 * return is possible: callers check again). Counts the sleeper in waiters.
 */
void ql__ring_wait(const ql_ring *r, uint32_t seen, uint64_t timeout_ns);

#endif /* QL_RING_H */
