/*
 * test_ipc.c - daemon/state/ipc.c, a session's table of imported device
 * allocations, against a fake backend whose opens and closes are counted
 * and whose "device memory" is plain heap (so that ASan sees any use of a
 * closed import). The table is full at QL_SESSION_MAX_IPC imports; a new
 * handle then lets go of the least recently used import that no request
 * holds, but never of the one the same request looked up for its other
 * tensor, which it holds no reference to yet.
 */
#include "config.h"

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "state/ipc.h"
#include "testutil.h"

#define HANDLE_BYTES 64

static int opens, closes;
static uintptr_t closed_last; /* the base of the last import closed */

static int fake_open(int ordinal, const void *handle, size_t len, void **base,
                     uint64_t *size) {
  (void)ordinal;
  (void)len;
  if (((const uint8_t *)handle)[0] == 0xEE)
    return QL_EINVAL; /* a handle the "driver" refuses */
  if ((*base = malloc(256)) == NULL)
    return QL_ENOMEM;
  *size = 256;
  opens++;
  return 0;
}

static int fake_close(int ordinal, void *base) {
  (void)ordinal;
  closed_last = (uintptr_t)base;
  free(base);
  closes++;
  return 0;
}

static ql_backend backend;
static ql__device dev;

static void setup(void) {
  memset(&backend, 0, sizeof backend);
  backend.name = "fake";
  backend.ipc_handle_bytes = HANDLE_BYTES;
  backend.ipc_open = fake_open;
  backend.ipc_close = fake_close;
  memset(&dev, 0, sizeof dev);
  dev.b = &backend;
  strcpy(dev.name, "cuda:fake");
  strcpy(dev.alias, "cuda:0");
  opens = closes = 0;
  closed_last = 0;
}

/* Handle number i: distinct bytes for each i. */
static const uint8_t *handle(unsigned i) {
  static uint8_t h[HANDLE_BYTES];
  memset(h, 0, sizeof h);
  memcpy(h, &i, sizeof i);
  h[HANDLE_BYTES - 1] = 1;
  return h;
}

static ql__ipc_mem *get(ql__ipc_table **t, unsigned i,
                        const ql__ipc_mem *keep, int want_rc) {
  char err[256];
  ql__ipc_mem *m = NULL;
  int rc = ql__ipc_get(t, &dev, 7, handle(i), HANDLE_BYTES, keep, &m, err,
                       sizeof err);
  ck_assert_msg(rc == want_rc, "handle %u: rc %d (%s), want %d", i, rc,
                rc ? err : "", want_rc);
  ck_assert(rc != 0 || m != NULL);
  return m;
}

/* Fills the table with imports 0 .. QL_SESSION_MAX_IPC - 2, each held by
 * a "request"; held[] gets them. */
static void fill_held(ql__ipc_table **t, ql__ipc_mem **held) {
  for (unsigned i = 0; i < QL_SESSION_MAX_IPC - 1; i++) {
    held[i] = get(t, i, NULL, 0);
    ql__ipc_ref(held[i]);
  }
}

static void release_all(ql__ipc_table *t, ql__ipc_mem **held, size_t n) {
  for (size_t i = 0; i < n; i++)
    ql__ipc_unref(held[i]);
  ql__ipc_table_free(t);
  ck_assert_int_eq(opens, closes);
}

/* The request's x is the only import no request holds: looking up its y
 * in the full table must not close it (it did: a use after free). */
START_TEST(test_keep_other_tensor) {
  ql__ipc_table *t = NULL;
  ql__ipc_mem *held[QL_SESSION_MAX_IPC];
  fill_held(&t, held);
  ql__ipc_mem *xm = get(&t, 1000, NULL, 0); /* the table is full now */
  ck_assert_int_eq(opens, QL_SESSION_MAX_IPC);
  get(&t, 1001, xm, QL_EEXHAUSTED); /* nothing else may go */
  ck_assert_int_eq(closes, 0);
  /* What the request does next: take its reference, then give it back. */
  ql__ipc_ref(xm);
  ck_assert_ptr_nonnull(xm->base);
  ql__ipc_unref(xm);
  ck_assert_int_eq(closes, 0); /* the table still holds it */
  release_all(t, held, QL_SESSION_MAX_IPC - 1);
}
END_TEST

/* With another import free to go, the lookup lets go of that one, the
 * least recently used, and keeps x. */
START_TEST(test_evicts_lru_not_keep) {
  ql__ipc_table *t = NULL;
  ql__ipc_mem *held[QL_SESSION_MAX_IPC];
  fill_held(&t, held);
  ql__ipc_unref(held[5]); /* its request ended: only the table holds it */
  uintptr_t base5 = (uintptr_t)held[5]->base;
  ql__ipc_mem *xm = get(&t, 1000, NULL, 0);
  ql__ipc_mem *ym = get(&t, 1001, xm, 0);
  ck_assert_ptr_ne(xm, ym);
  ck_assert_int_eq(closes, 1);
  ck_assert_uint_eq(closed_last, base5);
  /* x is still the table's, and found again as it was. */
  ck_assert_ptr_eq(get(&t, 1000, ym, 0), xm);
  held[5] = held[QL_SESSION_MAX_IPC - 2];
  release_all(t, held, QL_SESSION_MAX_IPC - 2);
}
END_TEST

/* Without keep, the least recently used free import goes, even if it is
 * the one just looked up; x and y of one handle are one import. */
START_TEST(test_lru_and_same_handle) {
  ql__ipc_table *t = NULL;
  ql__ipc_mem *held[QL_SESSION_MAX_IPC];
  fill_held(&t, held);
  ql__ipc_mem *a = get(&t, 1000, NULL, 0);
  ck_assert_ptr_eq(get(&t, 1000, a, 0), a); /* the same handle again */
  ck_assert_int_eq(opens, QL_SESSION_MAX_IPC);
  uintptr_t base_a = (uintptr_t)a->base;
  get(&t, 1001, NULL, 0); /* a is the only free one: it goes */
  ck_assert_int_eq(closes, 1);
  ck_assert_uint_eq(closed_last, base_a);
  release_all(t, held, QL_SESSION_MAX_IPC - 1);
}
END_TEST

/* A refused handle opens nothing and takes no room; a wrong length is
 * refused before the driver sees it. */
START_TEST(test_refusals) {
  ql__ipc_table *t = NULL;
  char err[256];
  ql__ipc_mem *m = (ql__ipc_mem *)1;
  uint8_t h[HANDLE_BYTES];
  memset(h, 0xEE, sizeof h);
  ck_assert_int_eq(ql__ipc_get(&t, &dev, 7, h, sizeof h, NULL, &m, err,
                               sizeof err),
                   QL_EINVAL);
  ck_assert_ptr_null(m);
  ck_assert_int_eq(ql__ipc_get(&t, &dev, 7, h, sizeof h - 1, NULL, &m, err,
                               sizeof err),
                   QL_EINVAL);
  ck_assert_int_eq(opens, 0);
  ql__ipc_table_free(t);
}
END_TEST

static Suite *ipc_suite(void) {
  Suite *s = suite_create("ipc");
  TCase *tc = tcase_create("table");
  tcase_add_checked_fixture(tc, setup, NULL);
  tcase_add_test(tc, test_keep_other_tensor);
  tcase_add_test(tc, test_evicts_lru_not_keep);
  tcase_add_test(tc, test_lru_and_same_handle);
  tcase_add_test(tc, test_refusals);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run_suite(ipc_suite(), CK_NORMAL); }
