/*
 * test_ring.c - unit tests for proto/ql_ring.c, the fast path's
 * shared-memory ring (DESIGN §7): its size, format and attach with every
 * geometry check, the producer-index checks on both queues (including
 * across the 32-bit wrap of the free-running counters), the slot copy and
 * its bound, the wake-up flags each side sets and clears, and a wake-up
 * across processes on a shared futex.
 *
 * Rings live in memfds mapped MAP_SHARED, as the daemon makes them; the
 * header's index fields are written directly to play the other side.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ql_ring.h"
#include "testutil.h"

/* ------------------------------------------------------------- helpers */

/* A zero-filled memfd of size bytes; the caller closes it. */
static int ring_fd(size_t size) {
  int fd = memfd_create("test-ring", MFD_CLOEXEC);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(ftruncate(fd, (off_t)size), 0);
  return fd;
}

static void *map_fd(int fd, size_t size) {
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ck_assert_ptr_ne(p, MAP_FAILED);
  return p;
}

/* A formatted ring of entries slots in a fresh memfd mapping. */
typedef struct tring {
  int fd;
  void *mem;
  size_t size;
  ql_ring r;
} tring;

static void tring_open(tring *t, uint32_t entries) {
  t->size = ql__ring_size(entries);
  ck_assert_uint_ne(t->size, 0);
  t->fd = ring_fd(t->size);
  t->mem = map_fd(t->fd, t->size);
  memset(&t->r, 0, sizeof t->r);
  ql__ring_format(t->mem, entries, &t->r);
}

static void tring_close(tring *t) {
  ck_assert_int_eq(munmap(t->mem, t->size), 0);
  close(t->fd);
}

/* A header field's value (a function, so that a failed assertion prints
 * the field rather than the expansion of atomic_load). */
static uint32_t ld(const _Atomic uint32_t *p) { return atomic_load(p); }

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------- geometry */

/* Only powers of two in [2, 256] have a size: the header page and two
 * queues of that many 4 KiB slots. */
START_TEST(test_size) {
  static const uint32_t good[] = {2, 4, 8, 16, 32, 64, 128, 256};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
    ck_assert_uint_eq(ql__ring_size(good[i]),
                      4096u + 2u * (size_t)good[i] * 4096u);
  for (uint32_t e = 0; e <= 1024; e++) {
    int is_good = 0;
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
      is_good |= e == good[i];
    if (!is_good)
      REQUIRE(ql__ring_size(e) == 0, "ql__ring_size(%u) = %zu", e,
              ql__ring_size(e));
  }
  static const uint32_t bad[] = {1u << 9, 1u << 16, 1u << 31, UINT32_MAX,
                                 UINT32_MAX - 1, 257, 255};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ck_assert_uint_eq(ql__ring_size(bad[i]), 0);
}
END_TEST

/* Format writes the constants and zero indices; attach, in another
 * mapping of the same memfd, finds the same geometry at its own address. */
START_TEST(test_format_attach) {
  static const uint32_t sizes[] = {2, 4, 64, 256};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    uint32_t e = sizes[i];
    tring t;
    tring_open(&t, e);
    const ql_ring_hdr *h = t.r.hdr;
    uint8_t *base = t.mem;
    ck_assert_ptr_eq(h, t.mem);
    ck_assert_uint_eq(t.r.entries, e);
    ck_assert_uint_eq(t.r.size, t.size);
    ck_assert_ptr_eq(t.r.sq, (void *)(base + 4096));
    ck_assert_ptr_eq(t.r.cq, (void *)(base + 4096 + (size_t)e * 4096));
    ck_assert_uint_eq(h->magic, QL_RING_MAGIC);
    ck_assert_mem_eq(&h->magic, "QLR1", 4);
    ck_assert_uint_eq(h->version, QL_RING_VERSION);
    ck_assert_uint_eq(h->entries, e);
    ck_assert_uint_eq(h->entry_bytes, QL_RING_ENTRY_BYTES);
    ck_assert_uint_eq(h->size, t.size);
    ck_assert_uint_eq(h->sq_offset, 4096);
    ck_assert_uint_eq(h->cq_offset, 4096 + (uint64_t)e * 4096);
    ck_assert_uint_eq(ld(&h->sq_tail), 0);
    ck_assert_uint_eq(ld(&h->cq_head), 0);
    ck_assert_uint_eq(ld(&h->waiters), 0);
    ck_assert_uint_eq(ld(&h->sq_head), 0);
    ck_assert_uint_eq(ld(&h->cq_tail), 0);
    ck_assert_uint_eq(ld(&h->idle), 0);
    ck_assert_uint_eq(ld(&h->blocked), 0);

    uint8_t *other = map_fd(t.fd, t.size);
    ql_ring c;
    memset(&c, 0xEE, sizeof c);
    ck_assert_int_eq(ql__ring_attach(other, t.size, &c), 0);
    ck_assert_ptr_eq(c.hdr, (void *)other);
    ck_assert_ptr_eq(c.sq, (void *)(other + 4096));
    ck_assert_ptr_eq(c.cq, (void *)(other + 4096 + (size_t)e * 4096));
    ck_assert_uint_eq(c.entries, e);
    ck_assert_uint_eq(c.size, t.size);
    /* The two views are of one ring: a slot written through one is read
     * through the other. */
    t.r.sq[e - 1].msg[7] = 0x5A;
    ck_assert_uint_eq(c.sq[e - 1].msg[7], 0x5A);
    ck_assert_int_eq(munmap(other, t.size), 0);
    tring_close(&t);
  }
}
END_TEST

/* A header to corrupt: a 64-entry ring formatted in a mapping with room
 * past its end (so that a size too large can be passed safely). */
enum { ATT_ENTRIES = 64 };

static void expect_refused(void *mem, size_t size, const char *what) {
  ql_ring r;
  memset(&r, 0xEE, sizeof r);
  int rc = ql__ring_attach(mem, size, &r);
  REQUIRE(rc == QL_EPROTO, "attach accepted %s (rc %d)", what, rc);
}

START_TEST(test_attach_refuses) {
  size_t size = ql__ring_size(ATT_ENTRIES);
  size_t room = size + 2 * 4096;
  int fd = ring_fd(room);
  uint8_t *mem = map_fd(fd, room);
  ql_ring_hdr *h = (ql_ring_hdr *)mem;
  ql_ring d, c;
  ql__ring_format(mem, ATT_ENTRIES, &d);
  ql_ring_hdr good = *h;
#define FRESH() memcpy(h, &good, sizeof good)

  /* The untouched header attaches: each refusal below is its one change. */
  ck_assert_int_eq(ql__ring_attach(mem, size, &c), 0);

  expect_refused(NULL, size, "a NULL mapping");
  expect_refused(mem, 0, "an empty mapping");
  expect_refused(mem, QL_RING_HDR_BYTES - 1, "a mapping smaller than a page");
  expect_refused(mem, size - 4096, "a size one page short");
  expect_refused(mem, size + 4096, "a size one page long");
  expect_refused(mem, size - 1, "a size one byte short");

  h->magic ^= 1;
  expect_refused(mem, size, "a wrong magic");
  FRESH();
  h->magic = 0;
  expect_refused(mem, size, "a zero magic");
  FRESH();
  h->version = QL_RING_VERSION + 1;
  expect_refused(mem, size, "a newer version");
  FRESH();
  h->version = 0;
  expect_refused(mem, size, "version 0");
  FRESH();

  static const uint32_t bad_entries[] = {0, 1, 3, 63, 65, 96, 512, 1024,
                                         1u << 31, UINT32_MAX};
  for (size_t i = 0; i < sizeof bad_entries / sizeof bad_entries[0]; i++) {
    h->entries = bad_entries[i];
    expect_refused(mem, size, "entries that are no ring's");
    FRESH();
  }
  /* A valid count that does not match the mapping: 32 or 128 entries in a
   * 64-entry mapping, even with the offsets and size made to agree. */
  h->entries = 32;
  expect_refused(mem, size, "32 entries in a 64-entry mapping");
  h->size = ql__ring_size(32);
  h->cq_offset = 4096 + 32 * 4096;
  expect_refused(mem, size, "a 32-entry header in a 64-entry mapping");
  FRESH();
  h->entries = 128;
  expect_refused(mem, size, "128 entries in a 64-entry mapping");
  FRESH();

  h->size = size + 4096;
  expect_refused(mem, size, "a header size that is not the mapping's");
  FRESH();
  h->size = size - 4096;
  expect_refused(mem, size, "a header size one page short");
  FRESH();
  h->entry_bytes = QL_RING_ENTRY_BYTES / 2;
  expect_refused(mem, size, "another slot size");
  FRESH();
  h->sq_offset = 0;
  expect_refused(mem, size, "an SQ over the header");
  FRESH();
  h->sq_offset = 4096 + 64;
  expect_refused(mem, size, "a misplaced SQ");
  FRESH();
  h->cq_offset = 4096;
  expect_refused(mem, size, "a CQ over the SQ");
  FRESH();
  h->cq_offset += 4096;
  expect_refused(mem, size, "a CQ one slot late");
  FRESH();
  h->cq_offset += 1ull << 32;
  expect_refused(mem, size, "a CQ offset past 4 GiB");
  FRESH();
#undef FRESH

  /* And after all that, the restored header attaches again. */
  ck_assert_int_eq(ql__ring_attach(mem, size, &c), 0);
  ck_assert_uint_eq(c.entries, ATT_ENTRIES);
  ck_assert_int_eq(munmap(mem, room), 0);
  close(fd);
}
END_TEST

/* ------------------------------------------------------------- daemon side */

/* Heads to test from: the start, an ordinary value, and values whose
 * window crosses 2^32. */
static const uint32_t heads[] = {0,          5,          UINT32_MAX - 5,
                                 UINT32_MAX - 1, UINT32_MAX, 1u << 31};

START_TEST(test_sq_avail) {
  tring t;
  tring_open(&t, 8);
  ql_ring_hdr *h = t.r.hdr;
  for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
    uint32_t head = heads[i];
    /* tail in [head, head + entries]: that many published, wrapping or
     * not. */
    for (uint32_t d = 0; d <= 8; d++) {
      uint32_t avail = 0xDEAD;
      atomic_store(&h->sq_tail, head + d);
      ck_assert_int_eq(ql__ring_sq_avail(&t.r, head, &avail), 0);
      ck_assert_uint_eq(avail, d);
    }
    /* More than entries ahead, or behind: a broken client. */
    static const uint32_t off[] = {9, 10, 16, 1u << 31, UINT32_MAX,
                                   UINT32_MAX - 1, UINT32_MAX - 7};
    for (size_t k = 0; k < sizeof off / sizeof off[0]; k++) {
      uint32_t avail = 0xDEAD;
      atomic_store(&h->sq_tail, head + off[k]);
      REQUIRE(ql__ring_sq_avail(&t.r, head, &avail) == QL_EPROTO,
              "head %u tail %u accepted", head, head + off[k]);
      ck_assert_uint_eq(avail, 0);
    }
  }
  /* Explicitly across the wrap: head 2^32 - 2, tail 3 is 5 requests. */
  uint32_t avail;
  atomic_store(&h->sq_tail, 3);
  ck_assert_int_eq(ql__ring_sq_avail(&t.r, UINT32_MAX - 1, &avail), 0);
  ck_assert_uint_eq(avail, 5);
  ck_assert_int_eq(ql__ring_sq_avail(&t.r, 4, &avail), QL_EPROTO);
  /* The check uses the daemon's own entries, never the header's. */
  h->entries = 1u << 30;
  atomic_store(&h->sq_tail, 100);
  ck_assert_int_eq(ql__ring_sq_avail(&t.r, 0, &avail), QL_EPROTO);
  /* Reading the tail publishes nothing. */
  ck_assert_uint_eq(ld(&h->sq_head), 0);
  tring_close(&t);
}
END_TEST

/* Fills SQ slot i with a pattern of its own. */
static void fill_slot(ql_ring_entry *e, uint32_t i, uint64_t tag,
                      uint32_t len) {
  e->tag = tag;
  e->len = len;
  e->flags = 0;
  for (uint32_t b = 0; b < QL_RING_MSG_MAX; b++)
    e->msg[b] = (uint8_t)(b * 7u + i * 31u + 1u);
}

START_TEST(test_sq_copy) {
  enum { E = 4 };
  tring t;
  tring_open(&t, E);
  static uint8_t buf[QL_RING_MSG_MAX], before[QL_RING_ENTRY_BYTES];
  for (uint32_t i = 0; i < E; i++)
    fill_slot(&t.r.sq[i], i, 0x1000u + i, 100u + i);

  /* Head picks slot head & (entries - 1), wherever the counter is. */
  static const uint32_t hs[] = {0, 1, 2, 3, 6, 7, UINT32_MAX, UINT32_MAX - 2};
  for (size_t k = 0; k < sizeof hs / sizeof hs[0]; k++) {
    uint32_t slot = hs[k] & (E - 1), n = 100u + slot;
    uint64_t tag = 0;
    size_t len = 12345;
    memset(buf, 0xA5, sizeof buf);
    memcpy(before, &t.r.sq[slot], sizeof before);
    ck_assert_int_eq(ql__ring_sq_copy(&t.r, hs[k], &tag, buf, &len), 0);
    ck_assert_uint_eq(tag, 0x1000u + slot);
    ck_assert_uint_eq(len, n);
    ck_assert_mem_eq(buf, t.r.sq[slot].msg, n);
    for (size_t b = n; b < sizeof buf; b++)
      REQUIRE(buf[b] == 0xA5, "byte %zu past len written", b);
    /* The slot is only read. */
    ck_assert_mem_eq(&t.r.sq[slot], before, sizeof before);
  }

  /* The bounds: 0 and exactly QL_RING_MSG_MAX are fine. */
  uint64_t tag;
  size_t len;
  t.r.sq[1].len = 0;
  memset(buf, 0xA5, sizeof buf);
  ck_assert_int_eq(ql__ring_sq_copy(&t.r, 1, &tag, buf, &len), 0);
  ck_assert_uint_eq(len, 0);
  ck_assert_uint_eq(buf[0], 0xA5);
  t.r.sq[1].len = QL_RING_MSG_MAX;
  ck_assert_int_eq(ql__ring_sq_copy(&t.r, 1, &tag, buf, &len), 0);
  ck_assert_uint_eq(len, QL_RING_MSG_MAX);
  ck_assert_mem_eq(buf, t.r.sq[1].msg, QL_RING_MSG_MAX);

  /* More than a slot holds: QL_ETOOBIG with the tag, and nothing copied. */
  static const uint32_t big[] = {QL_RING_MSG_MAX + 1, QL_RING_ENTRY_BYTES,
                                 1u << 20, UINT32_MAX};
  for (size_t k = 0; k < sizeof big / sizeof big[0]; k++) {
    t.r.sq[2].tag = 0xFEEDull << 40;
    t.r.sq[2].len = big[k];
    memset(buf, 0xA5, sizeof buf);
    tag = 0;
    len = 12345;
    ck_assert_int_eq(ql__ring_sq_copy(&t.r, 6, &tag, buf, &len), QL_ETOOBIG);
    ck_assert_uint_eq(tag, 0xFEEDull << 40);
    ck_assert_uint_eq(len, 0);
    for (size_t b = 0; b < sizeof buf; b++)
      REQUIRE(buf[b] == 0xA5, "len %u: byte %zu written", big[k], b);
  }
  tring_close(&t);
}
END_TEST

START_TEST(test_sq_release) {
  tring t;
  tring_open(&t, 4);
  ql__ring_sq_release(&t.r, 7);
  ck_assert_uint_eq(ld(&t.r.hdr->sq_head), 7);
  ql__ring_sq_release(&t.r, UINT32_MAX);
  ck_assert_uint_eq(ld(&t.r.hdr->sq_head), UINT32_MAX);
  /* The client's line is not the daemon's. */
  ck_assert_uint_eq(ld(&t.r.hdr->sq_tail), 0);
  tring_close(&t);
}
END_TEST

START_TEST(test_cq_room) {
  enum { E = 8 };
  tring t;
  tring_open(&t, E);
  ql_ring_hdr *h = t.r.hdr;
  static const uint32_t starts[] = {0, 10, UINT32_MAX - 2, UINT32_MAX,
                                    (1u << 31) - 1};
  for (size_t i = 0; i < sizeof starts / sizeof starts[0]; i++) {
    uint32_t c0 = starts[i];
    for (uint32_t posted = 0; posted <= E; posted++) {
      uint32_t tail = c0 + posted;
      /* Every head in [consumed, tail] is accepted and taken. */
      for (uint32_t d = 0; d <= posted; d++) {
        uint32_t consumed = c0, room = 0xDEAD;
        atomic_store(&h->cq_head, c0 + d);
        ck_assert_int_eq(ql__ring_cq_room(&t.r, tail, &consumed, &room), 0);
        ck_assert_uint_eq(consumed, c0 + d);
        ck_assert_uint_eq(room, E - (posted - d));
      }
      /* Back past consumed, or past tail: refused, consumed kept. */
      static const uint32_t bad[] = {1, 2, E, E + 1, 1u << 31,
                                     (1u << 31) + 1};
      for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        uint32_t heads2[2] = {c0 - bad[k], tail + bad[k]};
        for (int j = 0; j < 2; j++) {
          uint32_t consumed = c0, room = 0xDEAD;
          atomic_store(&h->cq_head, heads2[j]);
          int rc = ql__ring_cq_room(&t.r, tail, &consumed, &room);
          REQUIRE(rc == QL_EPROTO,
                  "consumed %u tail %u: head %u accepted", c0, tail,
                  heads2[j]);
          ck_assert_uint_eq(consumed, c0);
          ck_assert_uint_eq(room, 0);
        }
      }
    }
  }
  /* Consumed moves forward only: after 12 is taken, 11 is a step back. */
  uint32_t consumed = 10, room;
  atomic_store(&h->cq_head, 12);
  ck_assert_int_eq(ql__ring_cq_room(&t.r, 14, &consumed, &room), 0);
  ck_assert_uint_eq(consumed, 12);
  ck_assert_uint_eq(room, E - 2);
  atomic_store(&h->cq_head, 11);
  ck_assert_int_eq(ql__ring_cq_room(&t.r, 14, &consumed, &room), QL_EPROTO);
  ck_assert_uint_eq(consumed, 12);
  tring_close(&t);
}
END_TEST

/* The message area of a CQ slot, and what publishing writes. */
START_TEST(test_cq_publish) {
  enum { E = 4 };
  tring t;
  tring_open(&t, E);
  ql_ring_hdr *h = t.r.hdr;
  for (uint32_t tail = UINT32_MAX - 5; tail != 6; tail++) {
    uint32_t slot = tail & (E - 1);
    uint8_t *m = ql__ring_cq_msg(&t.r, tail);
    ck_assert_ptr_eq(m, t.r.cq[slot].msg);
    memset(m, (int)slot, 10);
    t.r.cq[slot].flags = 0xFFFFFFFFu; /* stale junk */
    ck_assert_int_eq(ql__ring_cq_publish(&t.r, tail, 0xABC0u + tail, 10), 0);
    ck_assert_uint_eq(ld(&h->cq_tail), tail + 1);
    ck_assert_uint_eq(t.r.cq[slot].tag, 0xABC0u + tail);
    ck_assert_uint_eq(t.r.cq[slot].len, 10);
    ck_assert_uint_eq(t.r.cq[slot].flags, 0);
    ck_assert_uint_eq(t.r.cq[slot].msg[9], slot);
  }
  /* The client's view: cq_avail from its head. */
  uint32_t n;
  ck_assert_int_eq(ql__ring_cq_avail(&t.r, 2, &n), 0);
  ck_assert_uint_eq(n, 4);
  ck_assert_int_eq(ql__ring_cq_avail(&t.r, 6, &n), 0);
  ck_assert_uint_eq(n, 0);
  ck_assert_int_eq(ql__ring_cq_avail(&t.r, 1, &n), QL_EPROTO);
  ck_assert_int_eq(ql__ring_cq_avail(&t.r, 7, &n), QL_EPROTO);
  ck_assert_uint_eq(n, 0);
  /* With client threads asleep, publishing says to wake them. */
  atomic_store(&h->waiters, 1);
  ck_assert_int_eq(ql__ring_cq_publish(&t.r, 6, 1, 0), 1);
  atomic_store(&h->waiters, 3);
  ck_assert_int_eq(ql__ring_cq_publish(&t.r, 7, 1, 0), 1);
  ck_assert_uint_eq(ld(&h->waiters), 3);
  atomic_store(&h->waiters, 0);
  ck_assert_int_eq(ql__ring_cq_publish(&t.r, 8, 1, 0), 0);
  ck_assert_uint_eq(ld(&h->cq_tail), 9);
  tring_close(&t);
}
END_TEST

/* ------------------------------------------------------------- flags */

START_TEST(test_sq_publish_idle) {
  tring t;
  tring_open(&t, 4);
  ql_ring_hdr *h = t.r.hdr;
  /* A busy daemon: no doorbell. */
  ck_assert_int_eq(ql__ring_sq_publish(&t.r, 0), 0);
  ck_assert_uint_eq(ld(&h->sq_tail), 1);
  ck_assert_uint_eq(ld(&h->idle), 0);
  /* A sleeping daemon: the first publisher rings and clears the flag, the
   * next does not. */
  atomic_store(&h->idle, 1);
  ck_assert_int_eq(ql__ring_sq_publish(&t.r, 1), 1);
  ck_assert_uint_eq(ld(&h->sq_tail), 2);
  ck_assert_uint_eq(ld(&h->idle), 0);
  ck_assert_int_eq(ql__ring_sq_publish(&t.r, 2), 0);
  ck_assert_uint_eq(ld(&h->sq_tail), 3);
  /* Across the wrap. */
  atomic_store(&h->idle, 1);
  ck_assert_int_eq(ql__ring_sq_publish(&t.r, UINT32_MAX), 1);
  ck_assert_uint_eq(ld(&h->sq_tail), 0);
  /* blocked is another flag. */
  atomic_store(&h->blocked, 1);
  ck_assert_int_eq(ql__ring_sq_publish(&t.r, 0), 0);
  ck_assert_uint_eq(ld(&h->blocked), 1);
  tring_close(&t);
}
END_TEST

START_TEST(test_cq_release_blocked) {
  tring t;
  tring_open(&t, 4);
  ql_ring_hdr *h = t.r.hdr;
  ck_assert_int_eq(ql__ring_cq_release(&t.r, 1), 0);
  ck_assert_uint_eq(ld(&h->cq_head), 1);
  atomic_store(&h->blocked, 1);
  ck_assert_int_eq(ql__ring_cq_release(&t.r, 2), 1);
  ck_assert_uint_eq(ld(&h->cq_head), 2);
  ck_assert_uint_eq(ld(&h->blocked), 0);
  ck_assert_int_eq(ql__ring_cq_release(&t.r, 3), 0);
  ck_assert_uint_eq(ld(&h->cq_head), 3);
  atomic_store(&h->idle, 1);
  ck_assert_int_eq(ql__ring_cq_release(&t.r, 4), 0);
  ck_assert_uint_eq(ld(&h->idle), 1);
  tring_close(&t);
}
END_TEST

START_TEST(test_arm) {
  tring t;
  tring_open(&t, 4);
  ql_ring_hdr *h = t.r.hdr;
  /* idle: nothing new (sq_tail == head) leaves the flag set. */
  atomic_store(&h->sq_tail, 5);
  ck_assert_int_eq(ql__ring_arm(&t.r, &h->idle, 5, 0), 0);
  ck_assert_uint_eq(ld(&h->idle), 1);
  ck_assert_uint_eq(ld(&h->blocked), 0);
  /* ... and the client that publishes next rings. */
  ck_assert_int_eq(ql__ring_sq_publish(&t.r, 5), 1);
  ck_assert_uint_eq(ld(&h->idle), 0);
  /* A request published before arming: do not sleep, flag cleared. */
  ck_assert_int_eq(ql__ring_arm(&t.r, &h->idle, 5, 0), 1);
  ck_assert_uint_eq(ld(&h->idle), 0);
  /* idle looks at sq_tail only, not cq_head. */
  atomic_store(&h->cq_head, 9);
  ck_assert_int_eq(ql__ring_arm(&t.r, &h->idle, 6, 0), 0);
  ck_assert_uint_eq(ld(&h->idle), 1);
  atomic_store(&h->idle, 0);

  /* blocked: cq_head unchanged since consumed leaves it set. */
  ck_assert_int_eq(ql__ring_arm(&t.r, &h->blocked, 0, 9), 0);
  ck_assert_uint_eq(ld(&h->blocked), 1);
  ck_assert_uint_eq(ld(&h->idle), 0);
  ck_assert_int_eq(ql__ring_cq_release(&t.r, 10), 1);
  ck_assert_uint_eq(ld(&h->blocked), 0);
  /* The client consumed since: flag cleared, do not sleep. */
  ck_assert_int_eq(ql__ring_arm(&t.r, &h->blocked, 0, 9), 1);
  ck_assert_uint_eq(ld(&h->blocked), 0);
  /* blocked looks at cq_head only, not sq_tail. */
  ck_assert_int_eq(ql__ring_arm(&t.r, &h->blocked, 12345, 10), 0);
  ck_assert_uint_eq(ld(&h->blocked), 1);
  tring_close(&t);
}
END_TEST

/* ------------------------------------------------------------- waking */

/* A wait whose word already differs, or that times out, returns and
 * leaves the sleeper count as it found it. */
START_TEST(test_wait_returns) {
  tring t;
  tring_open(&t, 4);
  ql_ring_hdr *h = t.r.hdr;
  atomic_store(&h->cq_tail, 3);
  ql__ring_wait(&t.r, 2, 60ull * 1000000000u); /* differs: at once */
  ck_assert_uint_eq(ld(&h->waiters), 0);
  ql__ring_wait(&t.r, 3, 1000000u); /* 1 ms, then back */
  ck_assert_uint_eq(ld(&h->waiters), 0);
  ck_assert_uint_eq(ld(&h->cq_tail), 3);
  tring_close(&t);
}
END_TEST

/* The child's side: its own mapping of the memfd, attached as libqlinear
 * does, asleep until a completion is published. Exit 0 when it saw the
 * completion, 1 when its long wait ran out, 2 on a setup failure. */
static void child_wait(int fd, size_t size) {
  void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ql_ring r;
  if (mem == MAP_FAILED || ql__ring_attach(mem, size, &r) != 0)
    _exit(2);
  uint64_t deadline = now_ns() + 60ull * 1000000000u;
  while (ld(&r.hdr->cq_tail) == 0) {
    if (now_ns() > deadline)
      _exit(1);
    ql__ring_wait(&r, 0, 60ull * 1000000000u);
  }
  _exit(ld(&r.hdr->cq_tail) == 1 && r.cq[0].tag == 77 &&
                r.cq[0].len == 3 && memcmp(r.cq[0].msg, "abc", 3) == 0
            ? 0
            : 3);
}

/* The state letter of /proc/pid/stat ('S': asleep), or 0. */
static char proc_state(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *p = strrchr(buf, ')');
  return p != NULL && p[1] == ' ' ? p[2] : 0;
}

START_TEST(test_wake_across_processes) {
  tring t;
  tring_open(&t, 4);
  ql_ring_hdr *h = t.r.hdr;
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0)
    child_wait(t.fd, t.size);

  /* Wait until the child has counted itself asleep and the kernel has it
   * sleeping (in its futex: nothing else blocks it), so that the wake
   * below is what ends the wait. Bounded: a loaded machine may be slow,
   * and a publish before the child sleeps must work too. */
  uint64_t until = now_ns() + 20ull * 1000000000u;
  while (now_ns() < until &&
         (ld(&h->waiters) == 0 || proc_state(pid) != 'S'))
    usleep(1000);
  ck_assert_uint_eq(ld(&h->waiters), 1);

  memcpy(ql__ring_cq_msg(&t.r, 0), "abc", 3);
  ck_assert_int_eq(ql__ring_cq_publish(&t.r, 0, 77, 3), 1);
  ql__ring_wake(&t.r);

  /* The child sleeps for 60 s unless woken: it must be done long before. */
  int st = 0;
  pid_t got = 0;
  until = now_ns() + 20ull * 1000000000u;
  while ((got = waitpid(pid, &st, WNOHANG)) == 0 && now_ns() < until)
    usleep(1000);
  if (got == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    ck_abort_msg("the child was not woken within 20 s");
  }
  ck_assert_int_eq(got, pid);
  ck_assert(WIFEXITED(st));
  ck_assert_int_eq(WEXITSTATUS(st), 0);
  ck_assert_uint_eq(ld(&h->waiters), 0);
  tring_close(&t);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ring");
  TCase *tc = tcase_create("ring");
  tcase_add_test(tc, test_size);
  tcase_add_test(tc, test_format_attach);
  tcase_add_test(tc, test_attach_refuses);
  tcase_add_test(tc, test_sq_avail);
  tcase_add_test(tc, test_sq_copy);
  tcase_add_test(tc, test_sq_release);
  tcase_add_test(tc, test_cq_room);
  tcase_add_test(tc, test_cq_publish);
  tcase_add_test(tc, test_sq_publish_idle);
  tcase_add_test(tc, test_cq_release_blocked);
  tcase_add_test(tc, test_arm);
  tcase_add_test(tc, test_wait_returns);
  tcase_add_test(tc, test_wake_across_processes);
  suite_add_tcase(s, tc);
  return tu_run_suite(s, CK_NORMAL);
}
