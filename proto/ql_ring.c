/* ql_ring.c - see ql_ring.h. */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ql_defs.h"
#include "ql_ring.h"

_Static_assert(sizeof(ql_ring_hdr) == 192, "ring header layout");
_Static_assert(sizeof(ql_ring_entry) == QL_RING_ENTRY_BYTES,
               "ring slot layout");
_Static_assert(offsetof(ql_ring_hdr, sq_tail) == 64, "client line");
_Static_assert(offsetof(ql_ring_hdr, sq_head) == 128, "daemon line");

size_t ql__ring_size(uint32_t entries) {
  if (entries < QL_RING_MIN_ENTRIES || entries > QL_RING_MAX_ENTRIES ||
      (entries & (entries - 1)) != 0)
    return 0;
  return QL_RING_HDR_BYTES + 2 * (size_t)entries * QL_RING_ENTRY_BYTES;
}

static void view(void *mem, uint32_t entries, ql_ring *r) {
  uint8_t *b = mem;
  r->hdr = mem;
  r->entries = entries;
  r->size = ql__ring_size(entries);
  r->sq = (ql_ring_entry *)(b + QL_RING_HDR_BYTES);
  r->cq = (ql_ring_entry *)(b + QL_RING_HDR_BYTES +
                            (size_t)entries * QL_RING_ENTRY_BYTES);
}

void ql__ring_format(void *mem, uint32_t entries, ql_ring *r) {
  view(mem, entries, r);
  ql_ring_hdr *h = r->hdr;
  h->magic = QL_RING_MAGIC;
  h->version = QL_RING_VERSION;
  h->entries = entries;
  h->entry_bytes = QL_RING_ENTRY_BYTES;
  h->size = r->size;
  h->sq_offset = (uint64_t)((uint8_t *)r->sq - (uint8_t *)mem);
  h->cq_offset = (uint64_t)((uint8_t *)r->cq - (uint8_t *)mem);
  atomic_store(&h->sq_tail, 0);
  atomic_store(&h->cq_head, 0);
  atomic_store(&h->waiters, 0);
  atomic_store(&h->sq_head, 0);
  atomic_store(&h->cq_tail, 0);
  atomic_store(&h->idle, 0);
  atomic_store(&h->blocked, 0);
  atomic_store(&h->spin_hint, 1);
}

int ql__ring_attach(void *mem, size_t size, ql_ring *r) {
  const ql_ring_hdr *h = mem;
  if (mem == NULL || size < QL_RING_HDR_BYTES)
    return QL_EPROTO;
  uint32_t entries = h->entries;
  size_t want = ql__ring_size(entries);
  if (h->magic != QL_RING_MAGIC || h->version != QL_RING_VERSION ||
      want == 0 || want != size || h->size != size ||
      h->entry_bytes != QL_RING_ENTRY_BYTES ||
      h->sq_offset != QL_RING_HDR_BYTES ||
      h->cq_offset != QL_RING_HDR_BYTES +
                          (uint64_t)entries * QL_RING_ENTRY_BYTES)
    return QL_EPROTO;
  view(mem, entries, r);
  return 0;
}

/* ------------------------------------------------------------ daemon side */

int ql__ring_sq_avail(const ql_ring *r, uint32_t head, uint32_t *avail) {
  /* Acquire: the slots before tail were written before it was published. */
  uint32_t tail = atomic_load_explicit(&r->hdr->sq_tail, memory_order_acquire);
  uint32_t n = tail - head;
  if (n > r->entries) {
    *avail = 0;
    return QL_EPROTO;
  }
  *avail = n;
  return 0;
}

/* Loads through a volatile pointer: exactly one read, whatever the
 * optimiser would like, so a field checked is the field used. */
static uint64_t load64(const uint64_t *p) { return *(const volatile uint64_t *)p; }
static uint32_t load32(const uint32_t *p) { return *(const volatile uint32_t *)p; }

int ql__ring_sq_copy(const ql_ring *r, uint32_t head, uint64_t *tag,
                     void *buf, size_t *len) {
  const ql_ring_entry *e = &r->sq[head & (r->entries - 1)];
  uint32_t n = load32(&e->len);
  *tag = load64(&e->tag);
  *len = 0;
  if (n > QL_RING_MSG_MAX)
    return QL_ETOOBIG;
  /* The client may write the slot while this copies: the copy may then be
   * any mix of old and new bytes, which the decoder treats as untrusted
   * input like any other. Nothing reads the slot after this. */
  memcpy(buf, e->msg, n);
  *len = n;
  return 0;
}

void ql__ring_sq_release(const ql_ring *r, uint32_t head) {
  /* Release: the slot's bytes were copied out before it is handed back. */
  atomic_store_explicit(&r->hdr->sq_head, head, memory_order_release);
}

int ql__ring_cq_room(const ql_ring *r, uint32_t tail, uint32_t *consumed,
                     uint32_t *room) {
  uint32_t head = atomic_load_explicit(&r->hdr->cq_head, memory_order_acquire);
  /* head must not move back past what was accepted, nor past tail. */
  if (head - *consumed > tail - *consumed) {
    *room = 0;
    return QL_EPROTO;
  }
  *consumed = head;
  *room = r->entries - (tail - head);
  return 0;
}

uint8_t *ql__ring_cq_msg(const ql_ring *r, uint32_t tail) {
  return r->cq[tail & (r->entries - 1)].msg;
}

int ql__ring_cq_publish(const ql_ring *r, uint32_t tail, uint64_t tag,
                        uint32_t len) {
  ql_ring_entry *e = &r->cq[tail & (r->entries - 1)];
  e->tag = tag;
  e->len = len;
  e->flags = 0;
  /* Sequentially consistent, then the load of waiters: a client that
   * counted itself asleep before this store is seen here, and one that
   * counts itself after it sees the new tail before it sleeps. */
  atomic_store(&r->hdr->cq_tail, tail + 1);
  return atomic_load(&r->hdr->waiters) != 0;
}

void ql__ring_wake(const ql_ring *r) {
  /* Not FUTEX_PRIVATE_FLAG: the sleepers are in another process. */
  syscall(SYS_futex, &r->hdr->cq_tail, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

int ql__ring_arm(const ql_ring *r, _Atomic uint32_t *flag, uint32_t head,
                 uint32_t consumed) {
  atomic_store(flag, 1);
  int moved = flag == &r->hdr->idle
                  ? atomic_load(&r->hdr->sq_tail) != head
                  : atomic_load(&r->hdr->cq_head) != consumed;
  if (moved)
    atomic_store(flag, 0);
  return moved;
}

/* ------------------------------------------------------------ client side */

int ql__ring_sq_publish(const ql_ring *r, uint32_t tail) {
  atomic_store(&r->hdr->sq_tail, tail + 1);
  /* Cheap test first: a busy daemon costs the client one load. */
  if (atomic_load(&r->hdr->idle) == 0)
    return 0;
  return atomic_exchange(&r->hdr->idle, 0) != 0;
}

int ql__ring_cq_avail(const ql_ring *r, uint32_t head, uint32_t *avail) {
  uint32_t tail = atomic_load_explicit(&r->hdr->cq_tail, memory_order_acquire);
  uint32_t n = tail - head;
  if (n > r->entries) {
    *avail = 0;
    return QL_EPROTO;
  }
  *avail = n;
  return 0;
}

int ql__ring_cq_release(const ql_ring *r, uint32_t head) {
  atomic_store(&r->hdr->cq_head, head);
  if (atomic_load(&r->hdr->blocked) == 0)
    return 0;
  return atomic_exchange(&r->hdr->blocked, 0) != 0;
}

void ql__ring_wait(const ql_ring *r, uint32_t seen, uint64_t timeout_ns) {
  struct timespec ts = {(time_t)(timeout_ns / 1000000000u),
                        (long)(timeout_ns % 1000000000u)};
  atomic_fetch_add(&r->hdr->waiters, 1);
  /* The kernel compares cq_tail with seen under its own lock: a publish
   * between our last look and this call returns at once (EAGAIN). */
  if (atomic_load(&r->hdr->cq_tail) == seen)
    syscall(SYS_futex, &r->hdr->cq_tail, FUTEX_WAIT, seen, &ts, NULL, 0);
  atomic_fetch_sub(&r->hdr->waiters, 1);
}
