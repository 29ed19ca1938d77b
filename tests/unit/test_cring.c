/*
 * test_cring.c - libqlinear's end of the session ring (client/lib/ring.c)
 * against a daemon played in this process, which breaks the ring's rules:
 * a descriptor that is not the sealed memfd of the size announced, a
 * consumer index the daemon overwrites, a completion nobody asked for.
 * The client must refuse or give up with an error, within its timeout,
 * and release what a request lent exactly once.
 */
#include "config.h"

#include <check.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "client/lib/ring.h"
#include "ql_defs.h"
#include "ql_ring.h"
#include "testutil.h"

#define ENTRIES 64

/* The daemon's side of one ring: its mapping and the descriptors handed
 * over (ring_fd, bell_fd: taken by ql__cring_open). */
typedef struct fake {
  void *mem;
  size_t size;
  ql_ring r;
  int ring_fd, bell_fd;
} fake;

/* A ring as the daemon makes it; seals: the seals to add (the daemon adds
 * SHRINK | GROW | SEAL), file_size: the memfd's size (size: correct). */
static void fake_make(fake *f, int seals, size_t file_size) {
  f->size = ql__ring_size(ENTRIES);
  ck_assert_uint_gt(f->size, 0);
  f->ring_fd = memfd_create("test-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ck_assert_int_ge(f->ring_fd, 0);
  ck_assert_int_eq(ftruncate(f->ring_fd, (off_t)f->size), 0);
  f->mem = mmap(NULL, f->size, PROT_READ | PROT_WRITE, MAP_SHARED, f->ring_fd,
                0);
  ck_assert_ptr_ne(f->mem, MAP_FAILED);
  ql__ring_format(f->mem, ENTRIES, &f->r);
  if (file_size != f->size)
    ck_assert_int_eq(ftruncate(f->ring_fd, (off_t)file_size), 0);
  if (seals != 0)
    ck_assert_int_eq(fcntl(f->ring_fd, F_ADD_SEALS, seals), 0);
  f->bell_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  ck_assert_int_ge(f->bell_fd, 0);
}

static void fake_free(fake *f) { munmap(f->mem, f->size); }

#define DAEMON_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

/* A request small enough for a slot. */
static void request(Qlinear__V1__Request *req,
                    Qlinear__V1__ListWeightsRequest *lw) {
  qlinear__v1__request__init(req);
  qlinear__v1__list_weights_request__init(lw);
  req->request_id = 42;
  req->body_case = QLINEAR__V1__REQUEST__BODY_LIST;
  req->list = lw;
}

static int late_calls;
static void late(void *arg) {
  (void)arg;
  late_calls++;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A memfd shorter than the size announced (its header valid), or one the
 * daemon could still shrink: refused at open. Mapping it would be a
 * SIGBUS at the first request. */
START_TEST(test_open_refuses_unsealed_or_short) {
  ql__cring *r = NULL;
  fake f;
  fake_make(&f, DAEMON_SEALS, 4096);
  ck_assert_int_eq(ql__cring_open(f.ring_fd, f.bell_fd, f.size, 0, &r),
                   QL_EPROTO);
  ck_assert_ptr_null(r);
  fake_free(&f);
  fake_make(&f, 0, ql__ring_size(ENTRIES));
  ck_assert_int_eq(ql__cring_open(f.ring_fd, f.bell_fd, f.size, 0, &r),
                   QL_EPROTO);
  ck_assert_ptr_null(r);
  fake_free(&f);
  fake_make(&f, F_SEAL_SHRINK, ql__ring_size(ENTRIES));
  ck_assert_int_eq(ql__cring_open(f.ring_fd, f.bell_fd, f.size, 0, &r),
                   QL_EPROTO);
  fake_free(&f);
  /* As the daemon makes it: accepted. */
  fake_make(&f, DAEMON_SEALS, ql__ring_size(ENTRIES));
  ck_assert_int_eq(ql__cring_open(f.ring_fd, f.bell_fd, f.size, 0, &r), 0);
  ck_assert_ptr_nonnull(r);
  ql__cring_free(r);
  fake_free(&f);
}
END_TEST

/* The daemon writes the client's consumer index: the call ends with
 * QL_EPROTO at once, where it spun past its timeout for good. */
START_TEST(test_overwritten_cq_head) {
  ql__cring *r = NULL;
  fake f;
  fake_make(&f, DAEMON_SEALS, ql__ring_size(ENTRIES));
  ck_assert_int_eq(ql__cring_open(f.ring_fd, f.bell_fd, f.size, 0, &r), 0);
  atomic_store(&f.r.hdr->cq_head, 7u);
  Qlinear__V1__Request req;
  Qlinear__V1__ListWeightsRequest lw;
  request(&req, &lw);
  Qlinear__V1__Response *resp = NULL;
  char why[256];
  late_calls = 0;
  double t0 = now_s();
  int rc = ql__cring_call(r, &req, 300, -1, late, NULL, &resp, why,
                          sizeof why);
  ck_assert_int_eq(rc, QL_EPROTO);
  ck_assert_ptr_null(resp);
  ck_assert_msg(now_s() - t0 < 2.0, "the call took %.1f s", now_s() - t0);
  ck_assert_int_eq(late_calls, 0);
  ql__cring_free(r);
  fake_free(&f);
}
END_TEST

/* A completion for a tag nobody sent breaks the ring: QL_EPROTO, and the
 * late callback does not run (the caller releases what it lent; running
 * both released a staging slot twice). */
START_TEST(test_unknown_completion) {
  ql__cring *r = NULL;
  fake f;
  fake_make(&f, DAEMON_SEALS, ql__ring_size(ENTRIES));
  ck_assert_int_eq(ql__cring_open(f.ring_fd, f.bell_fd, f.size, 0, &r), 0);
  uint32_t consumed = 0, room;
  ck_assert_int_eq(ql__ring_cq_room(&f.r, 0, &consumed, &room), 0);
  ck_assert_int_eq(ql__ring_cq_publish(&f.r, 0, 0xdead0000beefull, 0), 0);
  Qlinear__V1__Request req;
  Qlinear__V1__ListWeightsRequest lw;
  request(&req, &lw);
  Qlinear__V1__Response *resp = NULL;
  char why[256];
  late_calls = 0;
  int rc = ql__cring_call(r, &req, 300, -1, late, NULL, &resp, why,
                          sizeof why);
  ck_assert_int_eq(rc, QL_EPROTO);
  ck_assert_int_eq(late_calls, 0);
  /* Broken for good: later calls take the message path. */
  ck_assert_int_eq(ql__cring_call(r, &req, 300, -1, late, NULL, &resp, why,
                                  sizeof why),
                   QL__CRING_FALLBACK);
  ql__cring_free(r);
  fake_free(&f);
}
END_TEST

/* No reply within the timeout: QL_ETIMEDOUT, the request stays in flight,
 * and its late callback runs once when its reply comes after all. */
START_TEST(test_timeout_then_late_reply) {
  ql__cring *r = NULL;
  fake f;
  fake_make(&f, DAEMON_SEALS, ql__ring_size(ENTRIES));
  ck_assert_int_eq(ql__cring_open(f.ring_fd, f.bell_fd, f.size, 0, &r), 0);
  Qlinear__V1__Request req;
  Qlinear__V1__ListWeightsRequest lw;
  request(&req, &lw);
  Qlinear__V1__Response *resp = NULL;
  char why[256];
  late_calls = 0;
  ck_assert_int_eq(ql__cring_call(r, &req, 50, -1, late, NULL, &resp, why,
                                  sizeof why),
                   QL_ETIMEDOUT);
  ck_assert_int_eq(late_calls, 0);
  /* The daemon takes the request and answers it, late. */
  uint32_t avail;
  uint64_t tag;
  size_t len;
  uint8_t msg[QL_RING_MSG_MAX];
  ck_assert_int_eq(ql__ring_sq_avail(&f.r, 0, &avail), 0);
  ck_assert_uint_eq(avail, 1);
  ck_assert_int_eq(ql__ring_sq_copy(&f.r, 0, &tag, msg, &len), 0);
  ql__ring_sq_release(&f.r, 1);
  uint32_t consumed = 0, room;
  ck_assert_int_eq(ql__ring_cq_room(&f.r, 0, &consumed, &room), 0);
  ck_assert_int_eq(ql__ring_cq_publish(&f.r, 0, tag, 0), 0);
  /* The next call reaps it on its way. */
  req.request_id = 43;
  ck_assert_int_eq(ql__cring_call(r, &req, 50, -1, late, NULL, &resp, why,
                                  sizeof why),
                   QL_ETIMEDOUT);
  ck_assert_int_eq(late_calls, 1);
  ql__cring_free(r);
  fake_free(&f);
}
END_TEST

static Suite *cring_suite(void) {
  Suite *s = suite_create("cring");
  TCase *tc = tcase_create("hostile daemon");
  tcase_add_test(tc, test_open_refuses_unsealed_or_short);
  tcase_add_test(tc, test_overwritten_cq_head);
  tcase_add_test(tc, test_unknown_completion);
  tcase_add_test(tc, test_timeout_then_late_reply);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run_suite(cring_suite(), CK_NORMAL); }
